#!/usr/bin/env bash
# Data parallel in the interpreter: `kiln check --dp N` runs every rank of the
# sharded step (all in one process) for two steps and compares loss,
# grad-norm, lr, gradients (where the program outputs them) and the updated
# parameters with the single-device program, in f64 (relative 1e-9).  Then the
# bad inputs of parallelism: one line, exit 1.
. "$(dirname "$0")/lib.sh"
LLAMA="models/llama.lua --set vocab=128 --set dim=64 --set layers=2 --set heads=4 --set kv_heads=2 --set ffn=128 --set seq=32 --set batch=4"
# odd shapes (no size a multiple of 64; flats whose length is not a multiple of
# dp x cp): the distributed optimizer's bucket padding and remainder paths
TODD="models/tiny.lua --set vocab=255 --set dim=63 --set heads=3 --set seq=24"
LODD="models/llama.lua --set vocab=255 --set dim=66 --set layers=2 --set heads=3 --set kv_heads=1 --set ffn=97 --set seq=24 --set batch=4"
check() { # args...
    out=$(timeout 300 "$K" check "$@" 2>&1); rc=$?
    if [ $rc = 0 ] && [[ "$out" == *", 0 mismatched"* ]]; then ok "check $*: ${out##*: }"
    else notok "check $*: rc=$rc $out"; fi
}
for dp in 2 4; do
    for zero in 0 1; do
        for mb in 1 2; do
            check models/tiny.lua --dp $dp --zero $zero --micro-batches $mb --weight-decay 0.1 --bucket-mb 0.05
        done
    done
done
check models/tiny.lua --dp 2 --micro-batches 4
check models/tiny.lua --dp 1 --micro-batches 4
check $LLAMA --dp 2 --micro-batches 2 --bucket-mb 0.02
check $LLAMA --dp 4 --zero 0
check $TODD --dp 2 --zero 1 --bucket-mb 0.01
check $TODD --set batch=6 --dp 3 --zero 1 --micro-batches 2 --weight-decay 0.1
check $TODD --dp 4 --zero 0
check $LODD --dp 2 --zero 1 --bucket-mb 0.01 --weight-decay 0.1

bad() { # description, expected substring, args...
    local desc=$1 sub=$2; shift 2
    err=$(timeout 60 "$K" "$@" 2>&1 >/dev/null); rc=$?
    nl=$(printf '%s\n' "$err" | wc -l)
    if [ "$rc" = 1 ] && [ "$nl" = 1 ] && [[ "$err" == *"$sub"* ]]; then ok "$desc: $err"; else notok "$desc: rc=$rc got '$err'"; fi
}
bad "global batch not divisible" "models/tiny.lua:10: input tokens: the global batch 8 is not divisible by dp 3 x micro-batches 1" check models/tiny.lua --dp 3
bad "micro-batches not dividing" "not divisible by dp 2 x micro-batches 8" check models/tiny.lua --dp 2 --micro-batches 8
bad "--zero 2" "--zero" check models/tiny.lua --dp 2 --zero 2
bad "--dp 0" "--dp" check models/tiny.lua --dp 0
bad "--bucket-mb 0" "--bucket-mb" check models/tiny.lua --dp 2 --bucket-mb 0
bad "--tp 0" "--tp" check models/tiny.lua --tp 0
bad "missing event caught by the verifier" "does not wait for an event recorded after it" dump models/tiny.lua --dp 2 --test-drop-event

# the schedule overlaps: every gradient bucket's reduce-scatter is on the comm
# stream and issued before the backward pass ends (not after the last bwd node)
ir=$("$K" dump models/tiny.lua --dp 2 --bucket-mb 0.02 2>&1)
last_bwd=$(printf '%s\n' "$ir" | grep -n ' bwd ' | tail -1 | cut -d: -f1)
first_rs=$(printf '%s\n' "$ir" | grep -n 'reducescatter' | head -1 | cut -d: -f1)
streams=$(printf '%s\n' "$ir" | grep 'reducescatter' | grep -vc 'stream1')
if [ -n "$first_rs" ] && [ "$first_rs" -lt "$last_bwd" ] && [ "$streams" = 0 ]; then ok "reduce-scatters on stream 1, the first at line $first_rs before backward ends at $last_bwd"
else notok "overlap schedule: first reduce-scatter at ${first_rs:-none}, last bwd $last_bwd, off-stream $streams"; fi
ir=$("$K" dump models/tiny.lua --dp 2 --no-overlap 2>&1)
if ! printf '%s\n' "$ir" | grep -q 'stream1' && ! printf '%s\n' "$ir" | grep -q '^wait'; then ok "--no-overlap: one stream, no events"
else notok "--no-overlap still uses stream 1"; fi
