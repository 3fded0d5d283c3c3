#!/usr/bin/env bash
# The CPU backend against the interpreter, end to end through the CLI:
#  - the loss curve of 100 steps of the compiled step (JIT, `kiln run`) equals
#    the f32 interpreter's (`kiln run --interp`) to 1e-3 relative, tiny GPT
#    and tiny Llama;
#  - the standalone binary of `kiln compile` gives the JIT's losses exactly;
#  - `--serial` gives the threaded losses (1e-5: kernels split work by thread);
# The tiny GPT runs at lr 1e-3 here: at its demo lr (3e-3) its training
# amplifies f32 rounding differences chaotically (kiln serial vs threaded
# drift apart by 1e-3 after 50 steps), which would test the dynamics, not
# the backend.
#  - `--trace` writes Chrome trace JSON; `kiln plan` prints the memory split.
. "$(dirname "$0")/lib.sh"
need_corpus
D="--data $B/corpus.txt --steps 100 --seed 7"
TINY="--lr 1e-3"
LLAMA="--set layers=2 --set dim=64 --set heads=4 --set kv_heads=2 --set ffn=128 --set vocab=256 --set seq=32 --set batch=4 --set lr=3e-3 --set warmup=10"
losses() { sed 's/.*"loss":\([^,]*\),.*/\1/' "$1"; }
# max relative difference of two loss columns
maxrel() { paste <(losses "$1") <(losses "$2") | awk '{d = $1 - $2; if (d < 0) d = -d; r = d / ($2 < 0 ? -$2 : $2); if (r > m) m = r} END {printf "%.3g", m + 0}'; }
# odd shapes: no size a multiple of 64 (GEMM and kernel remainder paths), GQA 6/3
# heads; vocab 257 (byte-level data needs at least 256)
ODD_TINY="$TINY --set vocab=257 --set dim=63 --set heads=3 --set seq=24 --set layers=1"
ODD_LLAMA="--set layers=1 --set dim=84 --set heads=6 --set kv_heads=3 --set ffn=97 --set vocab=257 --set seq=24 --set batch=4 --set lr=3e-3 --set warmup=10"
for spec in "tiny:models/tiny.lua:$TINY" "llama:models/llama.lua:$LLAMA" "tiny-odd:models/tiny.lua:$ODD_TINY" "llama-odd:models/llama.lua:$ODD_LLAMA"; do
    IFS=: read -r name file sets <<< "$spec"
    # shellcheck disable=SC2086
    "$K" run --interp "$file" $sets $D --log "$tmp/$name.interp" > /dev/null
    # shellcheck disable=SC2086
    "$K" run "$file" $sets $D --log "$tmp/$name.jit" > /dev/null
    r=$(maxrel "$tmp/$name.jit" "$tmp/$name.interp")
    check "$name: 100 compiled steps match the f32 interpreter (max rel $r <= 1e-3)" \
        "[ \$(wc -l < $tmp/$name.jit) = 100 ] && awk 'BEGIN{exit !($r <= 1e-3)}'"
done
"$K" compile models/tiny.lua $TINY --steps 100 --target cpu -o "$tmp/tiny" > /dev/null
"$tmp/tiny" $D --log "$tmp/tiny.bin" > /dev/null
check "kiln compile binary == kiln run JIT (identical losses)" "cmp -s <(losses $tmp/tiny.bin) <(losses $tmp/tiny.jit)"
"$K" run models/tiny.lua $TINY $D --serial --log "$tmp/tiny.serial" > /dev/null
r=$(maxrel "$tmp/tiny.serial" "$tmp/tiny.jit")
check "--serial == threaded (max rel $r <= 1e-5)" "awk 'BEGIN{exit !($r <= 1e-5)}'"
"$tmp/tiny" --data "$B/corpus.txt" --steps 2 --trace "$tmp/trace.json" > /dev/null
check "--trace writes Chrome trace JSON with launches" \
    "/usr/bin/python3 -c 'import json,sys; e=json.load(open(sys.argv[1]))[\"traceEvents\"]; sys.exit(not any(x.get(\"ph\")==\"X\" and x[\"name\"]==\"matmul\" for x in e))' $tmp/trace.json"
"$K" plan models/gpt2.lua > "$tmp/plan"
check "kiln plan prints params, grads, optimizer state, activations, workspace" \
    "grep -q params $tmp/plan && grep -q grads $tmp/plan && grep -q 'optimizer state' $tmp/plan && grep -q activations $tmp/plan && grep -q workspace $tmp/plan"
err=$("$tmp/tiny" --data "$B/corpus.txt" --batch 4 2>&1 >/dev/null); rc=$?
check "trainer: --batch names the compile-time flag (rc=$rc: $err)" "[ $rc = 1 ] && [[ \"\$err\" == *'kiln compile'* ]]"
"$tmp/tiny" --data "$B/corpus.txt" --steps 1 --batch 8 > /dev/null 2>&1; rc=$?
check "trainer: --batch equal to the compiled global batch is accepted (rc=$rc)" "[ $rc = 0 ]"
err=$("$tmp/tiny" --steps 1 2>&1 >/dev/null); rc=$?
check "trainer: missing --data is a one-line error (rc=$rc)" "[ $rc = 1 ] && [[ \"\$err\" == *--data* ]]"
err=$("$K" run models/tiny.lua --data "$B/corpus.txt" --lr 1e6 --min-lr 1e6 --steps 30 2>&1 >/dev/null); rc=$?
check "a NaN loss stops training with the step number and exit 1 ($err)" "[ $rc = 1 ] && [[ \"\$err\" == 'step '*'loss is'*nan* ]]"
err=$("$K" run models/tiny.lua --data "$B/corpus.txt" --set vocab=100 --steps 3 2>&1 >/dev/null); rc=$?
check "a token id beyond the vocabulary fails the step with a one-line error ($err)" \
    "[ $rc = 1 ] && [[ \"\$err\" == 'step 1: embedding: id '*'out of range [0,100)' ]]"
check "the trainer's JSONL has step, loss, lr, grad_norm, tokens_per_s, gflops, elapsed, eta" \
    "/usr/bin/python3 -c 'import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; k={\"step\",\"loss\",\"lr\",\"grad_norm\",\"tokens_per_s\",\"gflops\",\"elapsed\",\"eta\"}; sys.exit(not (len(r)==100 and all(k <= set(x) for x in r) and r[-1][\"eta\"]==0 and r[0][\"eta\"]>0))' $tmp/tiny.bin"
