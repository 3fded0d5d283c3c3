#!/usr/bin/env bash
# The learning-rate schedule at run time (kiln_rt.h rt_schedule, trainer.c):
# the trainer's logged lr follows ops.def's lr_cosine formula, computed here
# in awk, with the values of --lr --min-lr --warmup and the length from
# --schedule-steps / --steps (every step, relative 1e-6: the output is f32);
# a run with the flags is bit-identical to a trainer compiled with the same
# values; --lr changes the loss curve; a checkpoint keeps the schedule it was
# saved with (resume == straight run), flags override it on resume, and a
# checkpoint without the schedule (written before it was saved) resumes with
# the compiled values; `kiln run` (JIT) takes the flags too; bad values are
# one-line errors naming the flag, and --batch stays compile-time.
. "$(dirname "$0")/lib.sh"
need_corpus
T=$tmp/tiny
# compiled schedule: models/tiny.lua's lr 3e-3, min_lr 3e-4, warmup 10; total 40
"$K" compile models/tiny.lua --steps 40 -o "$T" > /dev/null
D="--data $B/corpus.txt --threads 1"
col() { sed "s/.*\"$2\":\([^,}]*\).*/\1/" "$1"; }
# worst relative error of the logged lr against lr_cosine(step; lr, min_lr,
# warmup, total) (ops.def), over the log's lines; a step <= from (a resumed
# run's log must start after it) counts as a failure
lr_err() { # log lr min_lr warmup total [from]
    awk -v lr="$2" -v mn="$3" -v wu="$4" -v tot="$5" -v from="${6:-0}" '
        function abs(x) { return x < 0 ? -x : x }
        {
            t = $0; sub(/.*"step":/, "", t); sub(/,.*/, "", t); t += 0
            got = $0; sub(/.*"lr":/, "", got); sub(/,.*/, "", got); got += 0
            if (t <= from) w = 1e9
            if (wu > 0 && t <= wu) want = lr * t / wu
            else {
                p = tot > wu ? (t - wu) / (tot - wu) : 1
                p = p < 0 ? 0 : p > 1 ? 1 : p
                want = mn + 0.5 * (1 + cos(atan2(0, -1) * p)) * (lr - mn)
            }
            e = abs(got - want) / (abs(want) + 1e-30)
            if (e > w) w = e
            k++
        }
        END { printf "%.3g %d", w + 0, k }' "$1"
}
follows() { # description, log, expected lines, lr err args...
    local desc=$1 log=$2 lines=$3; shift 3
    local r; r=$(lr_err "$log" "$@")
    check "$desc (worst rel ${r% *} over ${r#* } steps <= 1e-6)" \
        "[ ${r#* } = $lines ] && awk 'BEGIN{exit !(${r% *} <= 1e-6)}'"
}

"$T" $D --log "$tmp/default" > "$tmp/default.out"
follows "no flags: the compiled schedule, --steps defaults to its length 40" "$tmp/default" 40 3e-3 3e-4 10 40
F="--lr 5e-3 --min-lr 1e-4 --warmup 5"
# shellcheck disable=SC2086
"$T" $D $F --steps 30 --log "$tmp/flags" > "$tmp/flags.out"
follows "--lr 5e-3 --min-lr 1e-4 --warmup 5 --steps 30: the cosine ends at --steps" "$tmp/flags" 30 5e-3 1e-4 5 30
check "the trainer prints the schedule it runs" "grep -q 'lr schedule: 0.005 -> 0.0001 cosine over 30 steps, warmup 5' $tmp/flags.out"
"$T" $D --steps 20 --schedule-steps 40 --log "$tmp/sched" > /dev/null
follows "--steps 20 --schedule-steps 40: 20 steps of the 40-step cosine" "$tmp/sched" 20 3e-3 3e-4 10 40
"$T" $D --steps 20 --log "$tmp/short" > /dev/null
follows "--steps 20 alone: the cosine ends at step 20" "$tmp/short" 20 3e-3 3e-4 10 20

# the flags are the same program as compiling the values in
"$K" compile models/tiny.lua --lr 5e-3 --min-lr 1e-4 --warmup 5 --steps 30 -o "$tmp/tiny_c" > /dev/null
"$tmp/tiny_c" $D --log "$tmp/compiled" > /dev/null
check "run-time --lr --min-lr --warmup --steps == compiled with them (bit-identical losses and lr)" \
    "[ \$(wc -l < $tmp/compiled) = 30 ] && cmp -s <(col $tmp/flags loss; col $tmp/flags lr) <(col $tmp/compiled loss; col $tmp/compiled lr)"
"$T" $D --steps 30 --lr 1e-2 --log "$tmp/big" > /dev/null
"$T" $D --steps 30 --log "$tmp/base" > /dev/null
d=$(paste <(col "$tmp/big" loss) <(col "$tmp/base" loss) | awk 'NR == 1 {f = $1 - $2} {d = $1 - $2; d = d < 0 ? -d : d; if (d > m) m = d} END {printf "%g %g", f, m}')
check "--lr 1e-2 changes the loss curve (step 1 equal, then max |diff| ${d#* } > 0.01)" \
    "awk 'BEGIN{exit !(${d% *} == 0 && ${d#* } > 0.01)}'"

# checkpoints keep the schedule
# shellcheck disable=SC2086
"$T" $D $F --steps 15 --schedule-steps 30 --ckpt "$tmp/ck" --log "$tmp/half" > /dev/null
"$T" $D --resume "$tmp/ck" --ckpt "$tmp/ck_rest" --log "$tmp/rest" > /dev/null
check "resume without flags keeps the saved schedule and length (15 + 15 == 30 straight, bit-identical)" \
    "[ \$(wc -l < $tmp/rest) = 15 ] && cmp -s <(col $tmp/half loss; col $tmp/rest loss) <(col $tmp/flags loss)"
follows "  and its lr follows the saved schedule" "$tmp/rest" 15 5e-3 1e-4 5 30
"$T" $D --resume "$tmp/ck" --lr 1e-3 --steps 25 --log "$tmp/over" > /dev/null
follows "flags override a resumed schedule (--lr 1e-3 --steps 25; min_lr, warmup from the checkpoint)" "$tmp/over" 10 1e-3 1e-4 5 25
# a checkpoint from before the schedule was saved: drop the four metadata
# keys (checkpoint.h), or set one to a bad value
meta() { # in out [key=value]
    /usr/bin/python3 - "$@" <<'EOF'
import json, struct, sys
src, dst, sets = sys.argv[1], sys.argv[2], dict(a.split("=") for a in sys.argv[3:])
raw = open(src, "rb").read()
hl = struct.unpack("<Q", raw[:8])[0]
head, data = json.loads(raw[8:8 + hl]), raw[8 + hl:]
m = head["__metadata__"]
keys = ["lr", "min_lr", "warmup", "schedule_steps"]
assert all(k in m for k in keys), "the checkpoint has no schedule"
if sets: m.update(sets)
else: [m.pop(k) for k in keys]
h = json.dumps(head).encode()
h += b" " * (-len(h) % 8)
open(dst, "wb").write(struct.pack("<Q", len(h)) + h + data)
EOF
}
mkdir "$tmp/old" "$tmp/bad"
check "the checkpoint's metadata holds the schedule" "grep -q '\"schedule_steps\":\"30\"' $tmp/ck/step_00000015.safetensors"
meta "$tmp/ck/step_00000015.safetensors" "$tmp/old/step_00000015.safetensors"
check "the stripped checkpoint has no schedule" \
    "[ -s $tmp/old/step_00000015.safetensors ] && ! grep -q schedule_steps $tmp/old/step_00000015.safetensors"
"$T" $D --resume "$tmp/old" --log "$tmp/oldrest" > "$tmp/old.out" 2>&1
follows "a checkpoint without the schedule resumes with the compiled one, to its end (40)" "$tmp/oldrest" 25 3e-3 3e-4 10 40 15
meta "$tmp/ck/step_00000015.safetensors" "$tmp/bad/step_00000015.safetensors" lr=-1
err=$("$T" $D --resume "$tmp/bad" 2>&1 >/dev/null); rc=$?
check "a checkpoint with lr -1 is refused (rc=$rc): $(printf '%s' "$err" | tail -1)" \
    "[ $rc = 1 ] && [[ \"\$(printf '%s' \"\$err\" | tail -1)\" == '--resume: '*'metadata \"lr\": \"-1\" is not a valid value'* ]]"

# kiln run (JIT) takes them too, and matches the binary
"$K" run models/tiny.lua $D $F --steps 30 --log "$tmp/jit" > /dev/null
follows "kiln run --lr 5e-3 --min-lr 1e-4 --warmup 5 --steps 30" "$tmp/jit" 30 5e-3 1e-4 5 30
check "  and its losses == the binary's with the same flags" "cmp -s <(col $tmp/jit loss) <(col $tmp/flags loss)"

bad() { # description, expected first words, args...
    local desc=$1 want=$2; shift 2
    n=$((n + 1))
    err=$("$T" $D "$@" 2>&1 >/dev/null); rc=$?
    nl=$(printf '%s\n' "$err" | wc -l)
    if [ "$rc" = 1 ] && [ "$nl" = 1 ] && [[ "$err" == "$want"* ]]; then echo "ok $n - $desc: $err"
    else echo "not ok $n - $desc: rc=$rc lines=$nl got '$err'"; fi
}
bad "--lr 0" "--lr: expected a finite number > 0" --lr 0
bad "--lr -1e-3" "--lr: expected a finite number > 0" --lr -1e-3
bad "--lr inf" "--lr: expected a finite number > 0" --lr inf
bad "--lr nan" "--lr: expected a finite number > 0" --lr nan
bad "--lr abc" "--lr: expected a finite number > 0" --lr abc
bad "--min-lr -1" "--min-lr: expected a finite number >= 0" --min-lr -1
bad "--warmup -2" "--warmup: expected a non-negative integer" --warmup -2
bad "--warmup 1.5" "--warmup: expected a non-negative integer" --warmup 1.5
bad "--schedule-steps 0" "--schedule-steps: expected at least 1" --schedule-steps 0
bad "--batch stays compile-time" "--batch 4: tiny was compiled for a global batch of 8; recompile with kiln compile --set batch=4" --batch 4
