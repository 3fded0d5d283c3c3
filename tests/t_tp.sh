#!/usr/bin/env bash
# Tensor parallel in the interpreter (issue 20): `kiln check --tp N` runs every
# rank of Megatron's layout (column-parallel QKV / MLP-up / SwiGLU gate,
# row-parallel attention-out / MLP-down, heads and kv heads split, an
# all-reduce over tp after each row-parallel GEMM and after each
# column-parallel input gradient) for two steps and compares loss,
# grad-norm, lr, gradients (joined from the tp shards) and updated
# parameters with the single-device program (f64, relative 1e-9).  Then the
# program's shape (where the all-reduces are), a planted bug the check must
# catch, and the bad inputs (one line each).
. "$(dirname "$0")/lib.sh"
LR="--warmup 1 --lr 0.01"
# Llama with GQA: heads 8, kv heads 2 or 4 (kv_heads = tp and kv_heads > tp)
llama() { echo "models/llama.lua --set vocab=128 --set dim=64 --set layers=2 --set heads=$1 --set kv_heads=$2 --set ffn=128 --set seq=16 --set batch=4 $LR"; }
check() { # args...
    out=$(timeout 300 "$K" check "$@" 2>&1); rc=$?
    if [ $rc = 0 ] && [[ "$out" == *", 0 mismatched"* ]] && [[ "$out" == *"--tp "* ]]; then ok "check $*: ${out##*: }"
    else notok "check $*: rc=$rc $out"; fi
}
check models/tiny.lua --tp 2 --zero 0
check models/tiny.lua --tp 4
check models/tiny.lua --tp 2 --no-sp --zero 0
check models/tiny.lua --tp 4 --no-sp
check $(llama 8 2) --tp 2 --no-sp
check $(llama 8 4) --tp 4 --no-sp --zero 0
check $(llama 8 4) --tp 2 --no-sp --dp 2 --cp 2 --cp-comm p2p
check models/tiny.lua --tp 2 --micro-batches 2 --zero 0
check $(llama 8 2) --tp 2            # kv_heads = tp
check $(llama 8 4) --tp 2 --zero 0   # kv_heads > tp
check $(llama 8 4) --tp 4            # kv_heads = tp
check $(llama 8 8) --tp 4 --zero 0   # MHA, kv_heads > tp
check $(llama 4 2) --tp 2 --weight-decay 0.1
# the GPU's bf16 step (run in f64, casts exact): the vocab-parallel masks
# and one-hots are built in f32 from i32 constants and cast to the
# activations' dtype ({working=1} casts the precision pass makes bf16)
check models/tiny.lua --tp 2 --precision bf16
check $(llama 8 4) --tp 2 --no-sp --precision bf16
# tp with the other axes: dp, cp (ring and all-gather attention over the
# rank's heads), pp (each stage's tp group)
check models/tiny.lua --tp 2 --dp 2
check $(llama 8 4) --tp 2 --dp 2 --zero 0 --micro-batches 2
check models/tiny.lua --tp 2 --cp 2 --cp-comm p2p
check $(llama 8 4) --tp 2 --cp 2 --cp-comm p2p
check $(llama 8 2) --tp 2 --cp 2 --cp-comm allgather --zero 0
check models/tiny.lua --tp 2 --pp 2 --micro-batches 2
check $(llama 8 4) --tp 2 --pp 2 --micro-batches 4 --pp-schedule interleaved --vpp 2 --set layers=4
check $(llama 8 4) --tp 2 --dp 2 --cp 2 --cp-comm p2p
# unannotated layers (keybias.lua's attention: plain nn.linear) run replicated on the tp ranks
check tests/models/keybias.lua --tp 2

# Megatron's collectives, per layer: forward all-reduces after attention-out
# and MLP-down, backward after the two norms' input gradients (Llama: wq, wk
# and wv add their partial input gradients first: one all-reduce for three)
ir=$("$K" dump $(llama 8 4) --set layers=1 --tp 2 --no-sp --after parallelize 2>&1)
fwd=$(printf '%s\n' "$ir" | grep -c 'allreduce .*group="tp".* L0 fwd')
bwd=$(printf '%s\n' "$ir" | grep -c 'allreduce .*group="tp".* L0 bwd')
heads=$(printf '%s\n' "$ir" | grep -c 'f32\[4,4,16,8\]<tp=s1>, %[0-9]*:f32\[4,4,16\]<tp=s1> = attention ')
if [ "$fwd" = 2 ] && [ "$bwd" = 2 ] && [ "$heads" = 1 ]; then ok "llama tp 2: 2 all-reduces in forward, 2 in backward per layer; 4 of 8 heads per rank"
else notok "llama tp 2: fwd all-reduces $fwd, bwd $bwd, attention with 4 local heads: $heads"; fi
wq=$(printf '%s\n' "$ir" | grep -c 'f32\[64,32\]<tp=s1> = param {name="h.0.attention.wq.weight"')
wo=$(printf '%s\n' "$ir" | grep -c 'f32\[32,64\]<tp=s0> = param {name="h.0.attention.wo.weight"')
if [ "$wq" = 1 ] && [ "$wo" = 1 ]; then ok "wq column-parallel [64,32] per rank, wo row-parallel [32,64]"; else notok "wq $wq wo $wo"; fi

# GPT-2's fused c_attn [C,3C]: q, k and v blocks, each split over tp (tp_blocks=3)
ir=$("$K" dump models/tiny.lua --set layers=1 --tp 2 --after parallelize 2>&1)
qkv=$(printf '%s\n' "$ir" | grep -c 'f32\[64,96\]<tp=s1> = param {name="h.0.attn.c_attn.weight".*tp_blocks=3')
sl=$(printf '%s\n' "$ir" | grep -c 'f32\[8,64,32\]<tp=s2> = slice %[0-9]* {dim=2, start=\(0, end=32\|32, end=64\|64, end=96\)}')
att=$(printf '%s\n' "$ir" | grep -c 'f32\[8,2,64,16\]<tp=s1>, %[0-9]*:f32\[8,2,64\]<tp=s1> = attention ')
if [ "$qkv" = 1 ] && [ "$sl" = 3 ] && [ "$att" = 1 ]; then ok "gpt tp 2: c_attn [64,96] per rank (its third of q, k, v), 3 local slices, 2 of 4 heads"
else notok "gpt tp 2: c_attn $qkv, slices $sl, attention $att"; fi

# vocab-parallel embedding and loss: the logits [B,T,V/tp] are never gathered;
# only the rows' maxima (tp values per row) are, the sums of exponentials and
# the target logits are all-reduced ([B,T]), and the embedding's lookups too
ir=$("$K" dump $(llama 8 4) --set layers=1 --tp 2 --no-sp --after parallelize 2>&1)
ag=$(printf '%s\n' "$ir" | grep 'allgather ' | grep -c 'f32\[4,16,2\] = allgather .*group="tp", dim=2')
agall=$(printf '%s\n' "$ir" | grep -c 'allgather ')
rows=$(printf '%s\n' "$ir" | grep -c 'f32\[4,16\] = allreduce .*group="tp".* L-1 fwd')
logits=$(printf '%s\n' "$ir" | grep -c 'f32\[4,16,64\]<tp=s2> = matmul .* L-1 fwd')
if [ "$ag" = 1 ] && [ "$agall" = 1 ] && [ "$rows" = 2 ] && [ "$logits" = 1 ]; then ok "vocab parallel: logits [4,16,64] of 128 per rank, one all-gather of the row maxima, 2 row all-reduces"
else notok "vocab parallel: maxima gathers $ag of $agall, row all-reduces $rows, local logits $logits"; fi

# sequence parallelism (the default): per layer, forward reduce-scatters after
# attention-out and MLP-down and all-gathers before QKV and the MLP (no
# all-reduce), backward the mirror; the norms run on T/tp tokens; their
# gains' gradients are partial sums, all-reduced over tp
ir=$("$K" dump $(llama 8 4) --set layers=1 --tp 2 --after parallelize 2>&1)
rs=$(printf '%s\n' "$ir" | grep -c 'f32\[4,8,64\]<tp=s1> = reducescatter .*group="tp", dim=1}.* L0 fwd')
ag=$(printf '%s\n' "$ir" | grep -c 'f32\[4,16,64\] = allgather .*group="tp", dim=1}.* L0 fwd')
ar=$(printf '%s\n' "$ir" | grep -c 'allreduce .*group="tp".* L0 fwd')
nrm=$(printf '%s\n' "$ir" | grep -c 'f32\[4,8,64\]<tp=s1> = rmsnorm .* L0 fwd')
brs=$(printf '%s\n' "$ir" | grep -c 'reducescatter .*group="tp", dim=1}.* L0 bwd')
gains=$(printf '%s\n' "$ir" | grep -c 'f32\[64\] = allreduce .*group="tp"')
if [ "$rs" = 2 ] && [ "$ag" = 2 ] && [ "$ar" = 0 ] && [ "$nrm" = 2 ] && [ "$brs" = 2 ] && [ "$gains" = 3 ]; then
    ok "sp: per layer 2 reduce-scatters and 2 all-gathers forward, 0 all-reduces, norms on 8 of 16 tokens, 2 reduce-scatters backward, 3 norm gains' gradients all-reduced"
else notok "sp: fwd reduce-scatters $rs, all-gathers $ag, all-reduces $ar, local norms $nrm, bwd reduce-scatters $brs, gain all-reduces $gains"; fi
caught "planted norm-grad (a norm gain's gradient not reduced over tp under sp)" $(llama 8 4) --tp 2 --test-tp-bug norm-grad

# kiln plan --tp: the elements each rank sends per layer in forward = the formula
for args in "models/tiny.lua --tp 2" "models/tiny.lua --tp 2 --no-sp" "models/tiny.lua --tp 2 --dp 2 --micro-batches 2" "$(llama 8 4) --tp 4"; do
    line=$("$K" plan $args 2>&1 | grep 'activations sent per rank per layer')
    read -r sent formula < <(printf '%s\n' "$line" | sed -n 's/.*forward \([0-9]*\) elements (formula .* = \([0-9]*\)).*/\1 \2/p')
    if [ -n "$sent" ] && [ "$sent" = "$formula" ]; then ok "plan ${args##*lua }: tp activations sent per layer, forward = formula ($sent)"
    else notok "plan $args: '$line'"; fi
done

# kiln plan --compare-tp-cp N: the elements each rank sends per layer in
# forward, measured from the planned programs' collectives, against the
# formulas computed here from the model's shape (b s h kv_heads head_dim):
# TP+SP 4 b s h (N-1)/N, CP (p2p ring) 2 b s kv_heads head_dim (N-1)/N
cmp_tp_cp() { # N b s h kvh hd args...
    local N=$1 b=$2 s=$3 h=$4 kvh=$5 hd=$6; shift 6
    local out want_tp want_cp got
    out=$("$K" plan "$@" --compare-tp-cp "$N" 2>&1)
    want_tp=$((4 * b * s * h * (N - 1) / N)) want_cp=$((2 * b * s * kvh * hd * (N - 1) / N))
    got=$(printf '%s\n' "$out" | sed -n 's/.*forward \([0-9]*\) elements ([0-9]* bytes; formula .* = \([0-9]*\)).*/\1 \2/p' | tr '\n' ' ')
    if [ "$got" = "$want_tp $want_tp $want_cp $want_cp " ] && [ "$(printf '%s\n' "$out" | grep -c 'GEMMs per rank')" = 2 ]; then
        ok "plan ${1##*/} --compare-tp-cp $N: forward elements per layer, measured = formula: tp $want_tp, cp $want_cp"
    else notok "plan $* --compare-tp-cp $N: got '$got', want tp $want_tp cp $want_cp: $(printf '%s\n' "$out" | head -c 600)"; fi
}
cmp_tp_cp 2 8 64 64 4 16 models/tiny.lua
cmp_tp_cp 4 8 64 64 4 16 models/tiny.lua
cmp_tp_cp 2 4 16 64 2 8 $(llama 8 2)   # GQA: kv heads 2 of 8
cmp_tp_cp 4 4 16 64 4 8 $(llama 8 4)
# Llama-3 70B's layer (2 layers, seq 8192, planned only): its ZeRO param
# all-gathers fall inside a layer's forward and must not be counted
cmp_tp_cp 8 1 8192 8192 8 128 models/llama.lua --set dim=8192 --set layers=2 --set heads=64 --set kv_heads=8 --set ffn=28672 --set vocab=128256 --set seq=8192 --set batch=1
out=$("$K" plan models/tiny.lua --compare-tp-cp 1 2>&1); rc=$?
if [ $rc != 0 ] && [ "$(printf '%s\n' "$out" | wc -l)" = 1 ] && [[ "$out" == *"--compare-tp-cp: expected a degree >= 2"* ]]; then ok "bad: $out"
else notok "--compare-tp-cp 1: rc=$rc $out"; fi

# planted bugs: backward without the all-reduce of the input gradient; the
# vocab-parallel loss shifted by each rank's own max (not the row's)
caught "planted xent-max" models/tiny.lua --tp 2 --test-tp-bug xent-max
# planted bug: backward without the all-reduce of the input gradient
caught "planted drop-bwd-reduce" $(llama 8 4) --tp 2 --no-sp --test-tp-bug drop-bwd-reduce

# bad input: one line naming the model line (or the flag), exit != 0
bad_check "heads are not divisible by --tp 4" models/llama.lua --set dim=48 --set heads=6 --set kv_heads=6 --set layers=1 --set ffn=64 --set vocab=64 --set seq=16 --set batch=2 --tp 4
bad_check "attention: 3 heads are not divisible by --tp 2" models/tiny.lua --set heads=3 --set dim=96 --tp 2
bad_check "kv heads are not divisible by --tp 4" $(llama 8 2) --tp 4
bad_check "param wte.weight: dim 1 of size 255 is not divisible by --tp 2" models/tiny.lua --set vocab=255 --tp 2
bad_check "is not divisible by --tp 3" models/tiny.lua --tp 3
bad_check "--tp: expected at least 1" models/tiny.lua --tp 0
bad_check "--sp: sequence parallelism splits over the tensor-parallel ranks; it needs --tp > 1" models/tiny.lua --sp
cat > "$tmp/badtp.lua" <<'LUA'
local x = input("x", {2, 4}, "f32")
local w = param("w", {4, 4}, normal(0.02), {tp = 3})
loss(mean(sum(matmul(x, w), -1)))
LUA
bad_check "badtp.lua:2: param: w: {tp = 3} out of range for a rank-2 parameter" "$tmp/badtp.lua" --tp 2
cat > "$tmp/badlin.lua" <<'LUA'
local nn = require "nn"
local x = input("x", {2, 4}, "f32")
loss(mean(sum(nn.linear(x, "fc", 4, 4, {tp = "diag"}), -1)))
LUA
bad_check 'badlin.lua:3: nn.linear(fc): tp must be "col" or "row", got diag' "$tmp/badlin.lua" --tp 2
