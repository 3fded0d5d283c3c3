#!/usr/bin/env bash
# Activation offload (issue 19, docs/offload.md): `kiln check --offload ...`
# runs the program whose saved activations go to the host (offload on the
# d2h stream, reload on h2d) and compares loss, grad-norm, gradients and
# updated parameters with the single-device program without offload (f64,
# relative 1e-9), alone and with every pipeline schedule, interleaved pp 4
# and cp; `kiln plan` shows the first stage's device act peak fall; a planted
# early read of an offloaded value and a planted missing event on the copy
# stream are rejected by the verifier; bad input is one line.  The tiny models' activations are far below the 1 MiB default
# threshold, so the checks lower it (--offload-min-bytes 1) and also require
# that something was offloaded.
. "$(dirname "$0")/lib.sh"
LR="--warmup 1 --lr 0.01"
MIN="--offload-min-bytes 1"
GPT4="models/tiny.lua --set layers=4"
GPT8="models/tiny.lua --set layers=8 --set dim=32 --set heads=2"
LLAMA4="models/llama.lua --set vocab=128 --set dim=64 --set layers=4 --set heads=4 --set kv_heads=2 --set ffn=128 --set seq=32 --set batch=8 $LR"
kcheck() { # args...
    out=$(timeout 300 "$K" check "$@" 2>&1); rc=$?
    if [ $rc = 0 ] && [[ "$out" == *", 0 mismatched"* ]] && [[ "$out" =~ \(([1-9][0-9]*)\ values\ offloaded\) ]]; then ok "check $*: ${out##*: }"
    else notok "check $*: rc=$rc $out"; fi
}
copies() { "$K" check "$@" 2>&1 | sed -n 's/.*(\([0-9]*\) values offloaded).*/\1/p'; }

# one device: all, half, a forced virtual stage
for f in all 0.5; do
    kcheck $GPT4 --offload $f $MIN
    kcheck $LLAMA4 --offload $f $MIN
done
kcheck $GPT4 --offload-stages 0 $MIN
a=$(copies $GPT4 --offload all $MIN) h=$(copies $GPT4 --offload 0.5 $MIN)
check "--offload 0.5 offloads fewer values than all ($h of $a)" '[ -n "$a" ] && [ -n "$h" ] && [ "$h" -gt 0 ] && [ "$h" -lt "$a" ]'
d=$(copies $GPT4 --offload all)
check "the default 1 MiB threshold skips tiny GPT's small activations ($d offloaded)" '[ "$d" = 0 ]'

# every pipeline schedule, interleaved pp 4, cp
for s in 1f1b zb-h1 zb-v interleaved; do
    kcheck $GPT4 --pp 2 --micro-batches 4 --pp-schedule $s --offload all $MIN
    kcheck $LLAMA4 --pp 2 --micro-batches 4 --pp-schedule $s --offload 0.5 $MIN
done
kcheck $GPT8 --pp 4 --vpp 2 --micro-batches 4 --pp-schedule interleaved --offload all $MIN
kcheck models/tiny.lua --pp 2 --cp 2 --cp-comm p2p --micro-batches 2 --offload all $MIN
kcheck $LLAMA4 --pp 2 --dp 2 --micro-batches 2 --offload 0.5 --offload-stages 0 $MIN

# kiln plan: the first stage's device activation arena with and without offload
act0() { "$K" plan $GPT4 --pp 4 --micro-batches 8 $MIN "$@" | awk '/^memory per rank of pipeline stage 0/{s=1} s && /^  activations/{print $4; exit}'; }
without=$(act0) with=$(act0 --offload all)
echo "# kiln plan $GPT4 --pp 4 --micro-batches 8: stage 0 device act arena $without bytes without offload, $with bytes with --offload all"
"$K" plan $GPT4 --pp 4 --micro-batches 8 $MIN --offload all | grep "host (offload)" | sed 's/^/# /'
check "plan --pp 4: stage 0's device act peak falls with --offload all ($without -> $with bytes)" \
    '[ -n "$without" ] && [ -n "$with" ] && [ "$with" -lt "$without" ]'

# planted bug: a backward reader keeps reading the device copy after its offload
out=$("$K" check $GPT4 --offload all $MIN --test-offload-bug early-read 2>&1); rc=$?
check "planted: an early read of an offloaded value is rejected: $out" \
    '[ $rc = 1 ] && [[ "$out" == *"verifier failed after offload"*"after its offload to the host"* ]]'
out=$("$K" check $GPT4 --pp 2 --micro-batches 4 --pp-schedule zb-h1 --offload all $MIN --test-offload-bug early-read 2>&1); rc=$?
check "planted: the same under --pp 2 zb-h1: $out" '[ $rc = 1 ] && [[ "$out" == *"after its offload to the host"* ]]'

# planted missing event on the copy stream: --test-drop-event forgets the
# schedule's first wait, here the d2h stream's wait for the first offloaded
# value's producer; the verifier's event rule must reject it
out=$("$K" check $GPT4 --offload all $MIN --test-drop-event 2>&1); rc=$?
check "planted: a missing event on the d2h stream is rejected: $out" \
    '[ $rc = 1 ] && [[ "$out" == *"verifier failed after schedule"*"(offload)"*"stream 2 does not wait for an event"* ]]'

# the back ends run it (the CPU trainer: tests/t_offload_run.sh)
out=$("$K" compile $GPT4 --offload all $MIN -o "$tmp/x" 2>&1); rc=$?
check "compile takes --offload (the runtime runs the copies): $out" '[ $rc = 0 ] && [ -x "$tmp/x" ]'

# bad input: one line naming the flag, exit 1
bad() { # what pattern args...
    local what=$1 pat=$2; shift 2
    out=$(timeout 60 "$K" check "$@" 2>&1); rc=$?
    if [ $rc = 1 ] && [ "$(wc -l <<< "$out")" = 1 ] && [[ "$out" == *$pat* ]]; then ok "bad input: $what: $out"
    else notok "bad input: $what: rc=$rc $out"; fi
}
bad "a fraction of 0" "--offload: expected none, all, auto or a fraction in (0,1]" $GPT4 --offload 0
bad "a fraction above 1" "--offload: expected" $GPT4 --offload 1.5
bad "a negative fraction" "--offload: expected" $GPT4 --offload -0.5
bad "garbage" "--offload: expected" $GPT4 --offload most
bad "a stage out of range (1f1b: one per rank)" "virtual stage 1 is out of range (each rank runs 1: 0..0)" $GPT4 --pp 2 --micro-batches 2 --offload-stages 0,1
bad "a stage out of range (interleaved: two per rank)" "virtual stage 2 is out of range" $GPT4 --pp 2 --vpp 2 --micro-batches 2 --pp-schedule interleaved --offload-stages 2
bad "a stage list that is not numbers" "--offload-stages: expected virtual stage indices" $GPT4 --offload-stages 0,x
bad "a negative stage" "--offload-stages: expected" $GPT4 --offload-stages -1
bad "an unknown planted bug" "--test-offload-bug: expected early-read" $GPT4 --test-offload-bug late

# --offload auto: the copies the device profile's streams finish in time
# (docs/offload.md).  Equal to one device; on GPT-2 (pp 4) with h200's
# copies slowed to 5 GB/s, no more than `all` and less on some stage, yet
# something on each of the first three; a profile whose copies crawl
# offloads nothing, one whose copies are free offloads what `all` does.
for s in 1f1b zb-h1; do
    out=$(timeout 300 "$K" check $GPT4 --pp 2 --micro-batches 4 --pp-schedule $s --offload auto --offload-min-bytes 1 2>&1); rc=$?
    [ $rc = 0 ] && [[ "$out" == *", 0 mismatched"* ]]; say $? "check --offload auto --pp 2 $s: ${out##*: }"
done
offloaded() { "$K" plan "$@" 2>&1 | sed -n 's/.*(\([0-9]*\) values offloaded.*/\1/p' | paste -sd' '; }
all=$(offloaded models/gpt2.lua --pp 4 --micro-batches 8 --offload all --device-profile h200)
sed 's/^h2d_bw .*/h2d_bw 5e9/; s/^d2h_bw .*/d2h_bw 5e9/' profiles/h200-sxm.profile > "$tmp/h200slow.profile"
auto=$(offloaded models/gpt2.lua --pp 4 --micro-batches 8 --offload auto --device-profile "$tmp/h200slow.profile")
python3 -c "a = list(map(int, '$all'.split())); b = list(map(int, '$auto'.split())); assert len(a) == len(b) == 3 and all(0 < y <= x for x, y in zip(a, b)) and b != a"
say $? "GPT-2 pp 4 on h200 with 5 GB/s copies: values offloaded per stage, 0 < auto ($auto) <= all ($all), fewer somewhere"
sed 's/^h2d_bw .*/h2d_bw 1/; s/^d2h_bw .*/d2h_bw 1/' profiles/cpu.profile > "$tmp/slow.profile"
sed 's/^h2d_bw .*/h2d_bw 1e30/; s/^d2h_bw .*/d2h_bw 1e30/' profiles/cpu.profile > "$tmp/fast.profile"
slow=$(offloaded models/gpt2.lua --pp 4 --micro-batches 8 --offload auto --device-profile "$tmp/slow.profile")
fast=$(offloaded models/gpt2.lua --pp 4 --micro-batches 8 --offload auto --device-profile "$tmp/fast.profile")
[ -z "$slow" ] || [ "$slow" = "0 0 0" ]; say $? "copies at 1 byte/s: auto offloads nothing (${slow:-no line})"
allfast=$(offloaded models/gpt2.lua --pp 4 --micro-batches 8 --offload all --device-profile "$tmp/fast.profile")
[ "$fast" = "$allfast" ]; say $? "free copies: auto offloads what all does ($fast = $allfast)"
echo "1..$n"
