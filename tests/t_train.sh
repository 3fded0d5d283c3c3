#!/usr/bin/env bash
# Training: `kiln check` (f32 == f64 on random inputs) on the tiny models, and
# the demo criterion: `make demo`'s compiled trainer takes the tiny model's
# loss from about ln(256) = 5.55 down by at least 40% within the demo's steps;
# its start-up line names the device.  --no-graph (eager steps instead of
# the CUDA graph) is a GPU flag: on the CPU, which has no graph, it is
# accepted and changes nothing, which is all this checks (the graph against
# eager comparison is t_cuda_fake.sh's, on the fake CUDA driver).
. "$(dirname "$0")/lib.sh"
LLAMA_SMALL="--set layers=2 --set dim=64 --set heads=4 --set kv_heads=2 --set ffn=128 --set vocab=256 --set seq=32 --set batch=2"
check "kiln check tiny.lua (f32 vs f64)" "$K check models/tiny.lua > /dev/null"
check "kiln check llama.lua small (f32 vs f64)" "$K check models/llama.lua $LLAMA_SMALL > /dev/null"
# odd shapes (no size a multiple of 64; head_dim 21 and 14) in f32 and in bf16
ODD_TINY="--set vocab=255 --set dim=63 --set heads=3 --set seq=24"
ODD_LLAMA="--set layers=2 --set dim=84 --set heads=6 --set kv_heads=3 --set ffn=97 --set vocab=255 --set seq=24 --set batch=2"
for prec in f32 bf16; do
    check "kiln check tiny.lua odd shape --precision $prec" "$K check models/tiny.lua $ODD_TINY --precision $prec | grep -q ', 0 mismatched'"
    check "kiln check llama.lua odd shape --precision $prec" "$K check models/llama.lua $ODD_LLAMA --precision $prec | grep -q ', 0 mismatched'"
done
need_corpus
log=$tmp/log
"$K" compile models/tiny.lua --target cpu -o "$log.bin" > /dev/null
"$log.bin" --data "$B/corpus.txt" --log "$log" > "$log.out"
# the device in the start-up line; --no-graph (a GPU's eager steps) changes nothing on the CPU
"$log.bin" --data "$B/corpus.txt" --steps 3 --log "$log.g" > /dev/null
"$log.bin" --data "$B/corpus.txt" --steps 3 --no-graph --log "$log.ng" > /dev/null
rm -f "$log.bin"
check "the start-up line names the device (compiled, cpu, threaded)" "head -1 $log.out | grep -q '(compiled, cpu, threaded)'"
check "--no-graph is accepted on the CPU (no graph there) and changes nothing: the same 3 losses" \
    "[ \$(wc -l < $log.g) = 3 ] && cmp -s <(sed 's/.*\"loss\":\([^,]*\),.*/\1/' $log.g) <(sed 's/.*\"loss\":\([^,]*\),.*/\1/' $log.ng)"
first=$(head -1 "$log" | sed 's/.*"loss":\([^,]*\),.*/\1/')
last=$(tail -10 "$log" | sed 's/.*"loss":\([^,]*\),.*/\1/' | awk '{s+=$1} END {print s/NR}')
echo "# demo: first loss $first, mean of last 10 steps $last"
check "demo loss starts near ln(256) (|first - 5.545| < 0.5)" "awk 'BEGIN{exit !($first > 5.045 && $first < 6.045)}'"
check "demo loss falls by at least 40% ($first -> $last)" "awk 'BEGIN{exit !($last <= 0.6 * $first)}'"

# ---- optimizer settings no trainer may be compiled with (options.h, opt_check) ----
# each is refused by kiln compile and kiln run with one line naming the key
# and where it came from (before opt_check, kiln compile built every one of
# these into a trainer: exit 0)
refused_opt() { # description, expected substring, kiln args...
    local desc=$1 sub=$2; shift 2
    n=$((n + 1))
    err=$(timeout 60 "$K" "$@" 2>&1 >/dev/null); rc=$?
    nl=$(printf '%s\n' "$err" | wc -l)
    if [ "$rc" = 1 ] && [ "$nl" = 1 ] && [[ "$err" == *"$sub"* ]]; then echo "ok $n - $desc: $err"
    else echo "not ok $n - $desc: rc=$rc got '$err'"; fi
}
for bad in "--lr 0|lr = 0 (from --lr/--set lr)" "--lr -1e-3|lr = -0.001" "--min-lr -1e-4|min_lr = -0.0001" \
    "--min-lr 1e-2|min_lr = 0.01 (from --min-lr/--set min_lr) is above lr = 0.003" "--warmup -1|warmup = -1" \
    "--warmup 2.5|warmup = 2.5" "--steps 0|steps = 0" "--steps -10|steps = -10" "--weight-decay -0.1|weight_decay = -0.1" \
    "--set beta1=1|beta1 = 1 (from --set beta1)" "--set beta2=-0.5|beta2 = -0.5" "--set eps=0|eps = 0" "--grad-clip -1|grad_clip = -1"; do
    refused_opt "kiln compile ${bad%%|*}" "${bad#*|}" compile models/tiny.lua ${bad%%|*} -o "$tmp/never"
done
check "no trainer was written for a refused setting" "[ ! -e $tmp/never ]"
refused_opt "kiln run --lr 0" "lr = 0" run models/tiny.lua --data "$B/corpus.txt" --lr 0
refused_opt "kiln run --interp --set eps=-1" "eps = -1" run models/tiny.lua --interp --data "$B/corpus.txt" --set eps=-1
sed 's/weight_decay = [0-9.]*/weight_decay = -0.5/' models/tiny.lua > "$tmp/wd.lua"
refused_opt "the model's config{} weight_decay = -0.5" "weight_decay = -0.5 (from the model's config{})" compile "$tmp/wd.lua" -o "$tmp/never"
check "grad_clip = 0 (clipping off) and min_lr = lr are accepted" \
    "$K compile models/tiny.lua --grad-clip 0 --lr 1e-3 --min-lr 1e-3 -o $tmp/ok_opt > /dev/null"
n=$((n + 1))
err=$("$tmp/ok_opt" --data "$B/corpus.txt" --min-lr 2e-3 2>&1 >/dev/null); rc=$?
if [ "$rc" = 1 ] && [[ "$err" == "--min-lr 0.002: expected a number in [0, the learning rate 0.001]" ]]; then
    echo "ok $n - the trainer refuses --min-lr above the compiled lr: $err"
else echo "not ok $n - the trainer refuses --min-lr above the compiled lr: rc=$rc '$err'"; fi
echo "1..$n"
