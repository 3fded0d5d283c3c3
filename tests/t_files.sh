#!/usr/bin/env bash
# Files that are not what a command may read or write (runtime/io/fsutil.h):
#   - an output that is the same file as an input (the log over the data,
#     -o over the model, a shard over its text, a checkpoint over --init) is
#     refused, and the input is intact;
#   - an input that is a FIFO (or a symlink to one) is refused at once, not
#     read forever (every run is under `timeout`: a hang fails the check);
#   - an output that is a FIFO, or a symlink to a FIFO or to /dev/null, is
#     refused, not opened (a FIFO blocks) or renamed over.
# Each is one line naming the flag and the path, exit 1.  /dev/null itself is
# never given as an output here (as root, a rename over it would replace it
# for the whole machine): only a symlink to it, and the last check says
# /dev/null is still a character device.  Before fsutil's checks, the log
# over the data truncated it (exit 0), the FIFO inputs hung (exit 124) and
# the symlinked outputs were renamed over or written through (exit 0).
. "$(dirname "$0")/lib.sh"
need_corpus
T=$tmp/tiny
"$K" compile models/tiny.lua --steps 2 -o "$T" > /dev/null
head -c 20000 "$B/corpus.txt" > "$tmp/data.txt"
cp "$tmp/data.txt" "$tmp/data.orig"
mkfifo "$tmp/fifo"
ln -s "$tmp/fifo" "$tmp/to_fifo"
ln -s /dev/null "$tmp/to_null"
# refused DESC SUBSTRING CMD...: exit 1, one line on stderr holding SUBSTRING
refused() {
    local desc=$1 sub=$2; shift 2
    n=$((n + 1))
    err=$(timeout 30 "$@" 2>&1 >/dev/null < /dev/null); rc=$?
    nl=$(printf '%s\n' "$err" | wc -l)
    if [ "$rc" = 1 ] && [ "$nl" = 1 ] && [[ "$err" == *"$sub"* ]]; then echo "ok $n - $desc: $err"
    else echo "not ok $n - $desc: rc=$rc (124: hung) got '$err'"; fi
}
D="--data $tmp/data.txt"

# ---- an output over an input ----
refused "trainer --log over its --data" "--log: $tmp/data.txt is the same file as --data" "$T" $D --log "$tmp/data.txt"
check "the data is intact after the refusal" "cmp -s $tmp/data.txt $tmp/data.orig"
ln "$tmp/data.txt" "$tmp/hardlink.txt"
refused "trainer --trace over --data by another name (a hard link: same st_dev/st_ino)" "--trace: $tmp/hardlink.txt is the same file as --data" \
    "$T" $D --trace "$tmp/hardlink.txt"
cp models/tiny.lua "$tmp/model.lua"
refused "kiln compile -o over the model" "-o: $tmp/model.lua is the same file as MODEL" "$K" compile "$tmp/model.lua" -o "$tmp/model.lua"
refused "kiln run --log over the model" "--log: $tmp/model.lua is the same file as MODEL" "$K" run "$tmp/model.lua" $D --log "$tmp/model.lua"
check "the model is intact after the refusals" "cmp -s $tmp/model.lua models/tiny.lua"
cp "$tmp/data.txt" "$tmp/x_train_000000.bin"
refused "kiln data: a shard over its own input" "-o: $tmp/x_train_000000.bin is the same file as input" "$K" data "$tmp/x_train_000000.bin" -o "$tmp/x"
check "the input is intact and no temporary file is left" "cmp -s $tmp/x_train_000000.bin $tmp/data.orig && [ ! -e $tmp/x_val_000000.bin ] && ! ls $tmp/x_*.tmp 2>/dev/null"
"$T" $D --steps 2 --ckpt "$tmp/ck" > /dev/null
refused "a checkpoint directory holding the --init file (a save or the pruning would replace it)" \
    "--ckpt: $tmp/ck/step_00000002.safetensors is the same file as --init" "$T" $D --init "$tmp/ck/step_00000002.safetensors" --ckpt "$tmp/ck"

# ---- an input that is a FIFO ----
refused "trainer --data a FIFO" "--data: $tmp/fifo is a FIFO" "$T" --data "$tmp/fifo"
refused "trainer --init a symlink to a FIFO" "--init: $tmp/to_fifo is a FIFO" "$T" $D --init "$tmp/to_fifo"
refused "kiln compile MODEL a FIFO" "MODEL: $tmp/fifo is a FIFO" "$K" compile "$tmp/fifo" -o "$tmp/never"
refused "kiln run --interp --data a FIFO" "--data: $tmp/to_fifo is a FIFO" "$K" run models/tiny.lua --interp --data "$tmp/to_fifo"
refused "kiln plot of a FIFO" "$tmp/fifo is a FIFO" "$K" plot "$tmp/fifo" -o "$tmp/p.svg"

# ---- an output that is a FIFO or a device ----
refused "trainer --log a symlink to a FIFO" "--log: $tmp/to_fifo is a FIFO" "$T" $D --log "$tmp/to_fifo"
refused "trainer --trace a symlink to /dev/null" "--trace: $tmp/to_null is a character device" "$T" $D --trace "$tmp/to_null"
refused "kiln dump -o a FIFO" "-o: $tmp/fifo is a FIFO" "$K" dump models/tiny.lua -o "$tmp/fifo"
"$T" $D --log "$tmp/run.jsonl" > /dev/null
refused "kiln plot -o a symlink to /dev/null" "-o: $tmp/to_null is a character device" "$K" plot "$tmp/run.jsonl" -o "$tmp/to_null"
refused "kiln run --interp --export a symlink to /dev/null" "--export: $tmp/to_null is a character device" \
    "$K" run models/tiny.lua --interp $D --steps 1 --export "$tmp/to_null"
ln -s "$tmp/fifo" "$tmp/y_train_000000.bin"
refused "kiln data: a shard that is a symlink to a FIFO" "-o: $tmp/y_train_000000.bin is a FIFO" "$K" data "$tmp/data.txt" -o "$tmp/y"
mkdir -p "$tmp/ck2" && mkfifo "$tmp/ck2/step_00000002.safetensors"
refused "a checkpoint in --ckpt that is a FIFO" "--ckpt: $tmp/ck2/step_00000002.safetensors is a FIFO" "$T" $D --ckpt "$tmp/ck2"
check "the symlinks are still symlinks (nothing renamed over them) and /dev/null is still a character device" \
    "[ -L $tmp/to_null ] && [ -L $tmp/to_fifo ] && [ -p $tmp/fifo ] && [ -c /dev/null ]"
echo "1..$n"
