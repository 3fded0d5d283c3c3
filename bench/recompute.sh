#!/usr/bin/env bash
# bench/recompute.sh — what each --recompute policy costs in step time and
# what it saves in memory, on the CPU trainer.
#   GPT: 4 layers, 4 heads, dim 256, seq 256, batch 8, vocab 256, AdamW
#   (the model of bench/cpu_vs_torch.sh), compiled once per policy;
#   MODEL=, SHAPE= and POLICIES= choose others, e.g. GPT-2 124M:
#   MODEL=models/gpt2.lua SHAPE="--set seq=256 --set batch=4" STEPS=1 ROUNDS=1
# Per policy: median ms/step over the timed steps of ROUNDS runs (each run:
# 2 warm-up steps, then STEPS timed ones; a step's time is the difference of
# consecutive "elapsed" values in the --log JSON lines), its ratio to none,
# the fastest step (less disturbed by other load than the median),
# the activation arena and the model-activation peak from `kiln plan`, and the
# trainer's peak resident memory (max RSS from /usr/bin/time -f %M, else from
# python's resource.getrusage(RUSAGE_CHILDREN); the header says which).
# The policies are interleaved (none, gemm-last, selective, full, then the
# next round), so load from elsewhere on the machine falls on all of them.
set -eu
B=${BUILD:-build}
STEPS=${STEPS:-10}
ROUNDS=${ROUNDS:-5}
THREADS=${THREADS:-2}
POLICIES=${POLICIES:-"none gemm-last selective full"}
MODEL=${MODEL:-models/tiny.lua}
SHAPE=${SHAPE:-"--set layers=4 --set heads=4 --set dim=256 --set seq=256 --set batch=8"}
make -s "$B/kiln" "$B/corpus.txt" "$B/runtime/trainer_main.o" "$B/libkilnrt.a" BUILD="$B" >/dev/null
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

# how the peak RSS is measured (the header line says which)
if [ -x /usr/bin/time ]; then rss_how="/usr/bin/time -f %M"; else rss_how="python getrusage(RUSAGE_CHILDREN).ru_maxrss"; fi
# run_one TRAINER RSSFILE LOG: one run of the trainer, its max RSS (KiB) into RSSFILE
run_one() {
    local exe=$1 rss=$2 log=$3
    if [ -x /usr/bin/time ]; then
        /usr/bin/time -f %M -o "$rss" "$exe" --data "$B/corpus.txt" --steps $((STEPS + 2)) --threads "$THREADS" --log "$log" >/dev/null
    else
        /usr/bin/python3 -c '
import resource, subprocess, sys
rc = subprocess.call(sys.argv[2:], stdout=subprocess.DEVNULL)
open(sys.argv[1], "w").write("%d\n" % resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
sys.exit(rc)' "$rss" "$exe" --data "$B/corpus.txt" --steps $((STEPS + 2)) --threads "$THREADS" --log "$log" >/dev/null
    fi
}
# the field before "bytes" on the first line of plan output $1 matching $2
plan_bytes() { grep -m1 -- "$2" "$1" | sed -n 's/.* \([0-9][0-9]*\) bytes.*/\1/p'; }
median() { sort -g | awk '{a[n++] = $1} END {if (!n) print "nan"; else if (n % 2) print a[(n - 1) / 2]; else print (a[n / 2 - 1] + a[n / 2]) / 2}'; }

for p in $POLICIES; do
    # shellcheck disable=SC2086
    "$B/kiln" compile "$MODEL" --target cpu $SHAPE --recompute "$p" -o "$tmp/gpt-$p" >/dev/null
    # shellcheck disable=SC2086
    "$B/kiln" plan "$MODEL" $SHAPE --recompute "$p" >"$tmp/plan-$p"
done
# shellcheck disable=SC2086
"$B/kiln" plan "$MODEL" $SHAPE --recompute all >"$tmp/plan-all"

for r in $(seq 1 "$ROUNDS"); do
    for p in $POLICIES; do
        run_one "$tmp/gpt-$p" "$tmp/rss-$p-$r" "$tmp/log-$p-$r"
        # the timed steps: those after the 2 warm-up steps, each measured from the previous step's end
        tail -n +2 "$tmp/log-$p-$r" | sed 's/.*"elapsed":\([^,}]*\).*/\1/' |
            awk 'NR > 1 {printf "%.3f\n", 1000 * ($1 - prev)} {prev = $1}' >>"$tmp/steps-$p"
        tail -n 1 "$tmp/rss-$p-$r" >>"$tmp/rsskib-$p"
    done
done

none_ms=$(median <"$tmp/steps-none")
echo "recompute ($(date -u +%F), $(nproc) cores, $THREADS threads, $STEPS timed steps x $ROUNDS rounds, peak RSS by $rss_how)"
printf '%-10s %9s %8s %9s %14s %14s %10s\n' policy "ms/step" "x none" "best ms" "activations" "of which model" "peak RSS"
for p in $POLICIES; do
    ms=$(median <"$tmp/steps-$p")
    best=$(sort -g "$tmp/steps-$p" | head -n 1)
    rss=$(median <"$tmp/rsskib-$p")
    act=$(plan_bytes "$tmp/plan-$p" "^ *activations ")
    model=$(plan_bytes "$tmp/plan-$p" "of which model")
    awk -v p="$p" -v ms="$ms" -v n="$none_ms" -v b="$best" -v a="$act" -v m="$model" -v rss="$rss" 'BEGIN {
        printf "%-10s %9.1f %7.3fx %9.1f %10.2f MiB %10.2f MiB %6.1f MiB\n", p, ms, ms / n, b, a / 1048576, m / 1048576, rss / 1024 }'
done
# what `kiln plan` says is saved for backward, where it says so
for p in $POLICIES; do
    grep -i "saved for backward" "$tmp/plan-$p" | sed "s/^/$p: /" || true
done
# anything `kiln plan --recompute all` prints beyond the plain report (its table of the policies)
extra=$(grep -vxF -f "$tmp/plan-gemm-last" "$tmp/plan-all" || true)
if [ -n "$extra" ]; then
    echo "kiln plan --recompute all:"
    echo "$extra"
fi
