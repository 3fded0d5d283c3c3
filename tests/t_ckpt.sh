#!/usr/bin/env bash
# Checkpoints through the compiled trainer: exact resume (100 steps straight
# == 50 + resume + 50, bit-identical losses), a kill -9 in the middle of a
# checkpoint write leaves the previous one intact and resumable, --init
# starts from given weights, and bad checkpoint input is one line, exit 1.
. "$(dirname "$0")/lib.sh"
need_corpus
T=$tmp/tiny
"$B/kiln" compile models/tiny.lua --steps 100 -o "$T" > /dev/null
D="--data $B/corpus.txt"
losses() { sed 's/.*"loss":\([^,]*\),.*/\1/' "$1"; }
"$T" $D --log "$tmp/full" > /dev/null
"$T" $D --steps 50 --schedule-steps 100 --ckpt "$tmp/ck" --ckpt-every 25 --log "$tmp/half" > /dev/null
"$T" $D --resume "$tmp/ck" --ckpt "$tmp/ck" --log "$tmp/half" > "$tmp/out"
check "100 steps straight == 50 + resume + 50 (bit-identical losses)" \
    "[ \$(wc -l < $tmp/full) = 100 ] && cmp -s <(losses $tmp/full) <(losses $tmp/half)"
check "resume names the checkpoint it used" "grep -q 'resumed from .*step_00000050.safetensors' $tmp/out"
check "keep-last-K: the default 3 are kept (25, 50, 100)" \
    "[ \"\$(cd $tmp/ck && ls)\" = \"\$(printf 'step_00000025.safetensors\nstep_00000050.safetensors\nstep_00000100.safetensors')\" ]"
# kill -9 while writing step 60's checkpoint: step 50's stays, resume uses it
rm -rf "$tmp/ck2"; mkdir "$tmp/ck2"; cp "$tmp/ck/step_00000050.safetensors" "$tmp/ck2/"
sum=$(md5sum < "$tmp/ck2/step_00000050.safetensors")
KILN_CKPT_CRASH_AFTER_BYTES=100000 "$T" $D --resume "$tmp/ck2" --ckpt "$tmp/ck2" --steps 60 > /dev/null 2>&1; rc=$?
check "the crash hook kills the trainer mid-write (rc=$rc, 137 = SIGKILL)" "[ $rc = 137 ]"
check "the previous checkpoint is intact and the half file is not a checkpoint" \
    "[ \"\$(md5sum < $tmp/ck2/step_00000050.safetensors)\" = \"$sum\" ] && [ ! -e $tmp/ck2/step_00000060.safetensors ]"
"$T" $D --resume "$tmp/ck2" --log "$tmp/after" > "$tmp/out2"
check "resume after the crash continues from step 50 and matches the straight run" \
    "grep -q 'step 50' $tmp/out2 && cmp -s <(losses $tmp/after) <(tail -50 $tmp/full | sed 's/.*\"loss\":\([^,]*\),.*/\1/')"
"$T" $D --steps 1 --init "$tmp/ck/step_00000100.safetensors" --log "$tmp/init" > /dev/null
check "--init starts from the given weights (step-1 loss below the fresh model's)" \
    "awk -v a=\$(losses $tmp/init) -v b=\$(head -1 $tmp/full | sed 's/.*\"loss\":\([^,]*\),.*/\1/') 'BEGIN{exit !(a < b - 1)}'"
bad() { # description, expected substring, args...
    local desc=$1 sub=$2; shift 2
    n=$((n + 1))
    err=$("$T" $D "$@" 2>&1 >/dev/null); rc=$?
    nl=$(printf '%s\n' "$err" | wc -l)
    if [ "$rc" = 1 ] && [ "$nl" = 1 ] && [[ "$err" == *"$sub"* ]]; then echo "ok $n - $desc: $err"
    else echo "not ok $n - $desc: rc=$rc got '$err'"; fi
}
head -c 1000 "$tmp/ck/step_00000100.safetensors" > "$tmp/trunc.safetensors"
bad "--init with a truncated checkpoint" "trunc.safetensors" --init "$tmp/trunc.safetensors"
"$B/kiln" compile models/tiny.lua --set dim=32 -o "$tmp/small" > /dev/null
err=$("$tmp/small" $D --init "$tmp/ck/step_00000100.safetensors" 2>&1 >/dev/null); rc=$?
n=$((n + 1)); if [ $rc = 1 ] && [[ "$err" == *shape* ]]; then echo "ok $n - --init with other shapes: $err"; else echo "not ok $n - --init with other shapes: rc=$rc '$err'"; fi
bad "a checkpoint directory that cannot be written" "--ckpt" --steps 1 --ckpt /dev/null/ck
bad "--init with --resume" "--init" --init x --resume y
