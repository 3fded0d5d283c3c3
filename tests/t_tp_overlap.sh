#!/usr/bin/env bash
# tp comm overlap by token chunks (--tp-chunks K, compiler/tp_overlap.c,
# issue 22): the sequence-parallel all-gather -> MLP -> reduce-scatter chain
# cut into K chunks of the rank's tokens, and attention's (one attention over
# the chunks joined, with their positions).  `kiln check` (every rank in f64
# against one device, relative 1e-9) on tiny GPT and tiny Llama with tp 2
# and 4, K 2 and 4, with dp, pp (zb-v: its B/W split), recompute and lhs,
# and at one sequence per micro-batch (concat and slice as views);
# the program's shape (K collectives where there was one); K = 1 is today's
# program byte for byte; the chunked dump reads back; a planted bug (the
# chunks joined in the wrong order) fails the check; the bad inputs, one
# line each.
. "$(dirname "$0")/lib.sh"
LR="--warmup 1 --lr 0.01"
llama() { echo "models/llama.lua --set vocab=128 --set dim=64 --set layers=2 --set heads=8 --set kv_heads=$1 --set ffn=128 --set seq=16 --set batch=4 $LR"; }
check_eq() { # args...
    out=$(timeout 300 "$K" check "$@" 2>&1); rc=$?
    if [ $rc = 0 ] && [[ "$out" == *", 0 mismatched"* ]] && [[ "$out" == *"--tp "* ]]; then ok "check $*: ${out##*: }"
    else notok "check $*: rc=$rc $out"; fi
}
check_eq models/tiny.lua --tp 2 --tp-chunks 2 --zero 0
check_eq models/tiny.lua --tp 4 --tp-chunks 4
check_eq models/tiny.lua --tp 2 --tp-chunks 4 --dp 2 --micro-batches 2 --recompute gemm-last
check_eq models/tiny.lua --tp 2 --tp-chunks 2 --pp 2 --micro-batches 2 --pp-schedule zb-v --schedule lhs --set layers=4
check_eq $(llama 4) --tp 2 --tp-chunks 2 --recompute gemm-last
check_eq $(llama 4) --tp 4 --tp-chunks 2 --recompute none
check_eq $(llama 4) --tp 2 --tp-chunks 4 --pp 2 --micro-batches 2 --set layers=4 --dp 2
check_eq $(llama 4) --tp 2 --tp-chunks 2 --precision bf16
# one sequence per micro-batch: the chunks' concats and slices along the
# tokens are views (docs/parallel.md; the plan's verifier checks them)
check_eq models/tiny.lua --set batch=1 --tp 2 --tp-chunks 2
check_eq models/tiny.lua --set batch=2 --tp 2 --tp-chunks 4 --dp 2 --schedule lhs
check_eq $(llama 4) --set batch=2 --tp 2 --tp-chunks 2 --micro-batches 2 --recompute gemm-last

# the program: per layer, the MLP's all-gather and reduce-scatter become K
# (forward and backward), attention's stay one each; K = 1 is the program
# without the flag, byte for byte
d1=$("$K" dump models/tiny.lua --set layers=1 --tp 2 --after tp_overlap 2>&1)
d0=$("$K" dump models/tiny.lua --set layers=1 --tp 2 --tp-chunks 1 --after tp_overlap 2>&1)
check "--tp-chunks 1 leaves the program as it is (byte for byte)" '[ -n "$d1" ] && [ "$d1" = "$d0" ]'
count() { printf '%s\n' "$1" | grep -c "$2 .*group=\"tp\", dim=1}.* $3\$"; }
d2=$("$K" dump models/tiny.lua --set layers=2 --tp 2 --after tp_overlap 2>&1)
d4=$("$K" dump models/tiny.lua --set layers=2 --tp 2 --tp-chunks 4 --after tp_overlap 2>&1)
got="$(count "$d2" allgather fwd) $(count "$d2" reducescatter fwd) $(count "$d2" allgather bwd) $(count "$d2" reducescatter bwd) -> $(count "$d4" allgather fwd) $(count "$d4" reducescatter fwd) $(count "$d4" allgather bwd) $(count "$d4" reducescatter bwd)"
check "tiny 2 layers tp 2 K 4, the tp all-gathers/reduce-scatters on the sequence fwd, bwd: each layer's two become 8, the LM head's stays whole (its logits are not token-wise to the loss): $got" '[ "$got" = "5 5 5 5 -> 17 17 17 17" ]'
dm=$(KILN_TP_CHUNKS_MLP_ONLY=1 "$K" dump models/tiny.lua --set layers=2 --tp 2 --tp-chunks 4 --after tp_overlap 2>&1)
got="$(count "$dm" allgather fwd) $(count "$dm" reducescatter fwd) $(count "$dm" allgather bwd) $(count "$dm" reducescatter bwd)"
check "KILN_TP_CHUNKS_MLP_ONLY=1: only the MLPs' collectives chunk (attention's stay whole): $got" '[ "$got" = "11 11 11 11" ]'
d4=$("$K" dump models/tiny.lua --set layers=1 --tp 2 --tp-chunks 4 --after tp_overlap 2>&1)
chunk=$(printf '%s\n' "$d4" | grep -c 'f32\[8,16,64\] = allgather .*group="tp", dim=1}.* L0 fwd')
att=$(printf '%s\n' "$d4" | grep -c 'attention %[0-9]*, %[0-9]*, %[0-9]*, %[0-9]*, %[0-9]* {causal=1')
check "layer 0's all-gathers take [8,8,64] (a quarter of the rank's 32 tokens) and give [8,16,64]: $chunk of 8; attention runs once, with the chunk-major positions: $att" '[ "$chunk" = 8 ] && [ "$att" = 1 ]'

# Llama keeps its residual stream a partial sum over tp (no biases: every
# add is linear) and reduce-scatters it before each norm: layer 0's first
# add reads the embedding's partial sum by chunk (a strided slice of the
# whole); rope takes each chunk's positions, attention the whole sequence
# in chunk-major order with its positions: every sp collective is chunked
dl=$("$K" dump $(llama 4) --tp 2 --tp-chunks 2 --after tp_overlap 2>&1)
got=$(for ph in fwd bwd; do printf '%s ' "$(printf '%s\n' "$dl" | grep -c "f32\[4,4,64\]<tp=s1> = reducescatter .* $ph\$")" "$(printf '%s\n' "$dl" | grep -c "f32\[4,8,64\] = allgather .* $ph\$")"; done)
check "llama 2 layers tp 2 K 2: chunk reduce-scatters and all-gathers fwd 8 8, bwd 8 8 (2 layers x 2 of each x 2 chunks): $got" '[ "$got" = "8 8 8 8 " ]'

# the chunked program reads back and re-dumps byte for byte (irtext)
"$K" dump $(llama 4) --tp 2 --tp-chunks 2 --after memplan -o "$tmp/a.ir" && "$K" dump "$tmp/a.ir" -o "$tmp/b.ir"
check "llama tp 2 K 2 after memplan: the dump reads back byte for byte" "[ -s '$tmp/a.ir' ] && cmp -s '$tmp/a.ir' '$tmp/b.ir'"

# the check can fail: --test-tp-bug chunk-order joins the forward's
# reduce-scattered chunks in reverse order (every token's value lands on
# another token)
caught "planted chunk-order" models/tiny.lua --tp 2 --tp-chunks 2 --test-tp-bug chunk-order

# bad input: one line, exit != 0
bad_check "--tp-chunks: expected at least 1" models/tiny.lua --tp 2 --tp-chunks 0
bad_check "--tp-chunks 3 does not divide the per-rank sequence 32" models/tiny.lua --tp 2 --tp-chunks 3
bad_check "it needs --tp > 1 with sequence parallelism" models/tiny.lua --tp-chunks 2
bad_check "it needs --tp > 1 with sequence parallelism" models/tiny.lua --tp 2 --no-sp --tp-chunks 2
bad_check "--tp-chunks: expected a non-negative integer" models/tiny.lua --tp 2 --tp-chunks x
