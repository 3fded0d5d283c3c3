#!/usr/bin/env bash
# bench/cost_model.sh — the cost model (compiler/cost.c) against the CPU
# trainer on this machine (issue 21): every configuration below is compiled
# and run for STEPS steps; the predicted step (kiln plan's "predicted step",
# on a profile that `kiln calibrate` measures first under the same number of
# ranks, so the cores are shared the same way) beside the measured one (the
# mean of the steps after the first: the JSONL log's elapsed seconds), and
# the predicted memory per rank (memplan's, the largest stage) beside the
# largest rank's measured peak resident set (/usr/bin/time %M: the arena
# plus the process's own: binary, OpenBLAS buffers, MPI).
#   small:  tiny GPT, 4 layers, dim 64, seq 64, batch 8 (byte level)
#   medium: 4 layers, dim 256, 8 heads, seq 256, batch 8
# Prints one row per configuration and the median and largest |error| of
# the step time.  The machine is shared: `uptime` is printed first and last.
set -u
B=${BUILD:-build}
STEPS=${STEPS:-8}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
make -s "$B/kiln" "$B/corpus.txt" "$B/runtime/trainer_main.o" "$B/libkilnrt.a" BUILD="$B" > /dev/null || exit 1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
echo "uptime before: $(uptime)"
for np in 1 2 4; do # a profile per rank count
    if [ $np = 1 ]; then "$B/kiln" calibrate --device cpu -o "$tmp/cpu$np.profile" --name cpu-np$np > /dev/null || exit 1
    else mpirun --oversubscribe -np $np "$B/kiln" calibrate --device cpu -o "$tmp/cpu$np.profile" --name cpu-np$np > /dev/null || exit 1; fi
done
SMALL="models/tiny.lua --set layers=4"
MEDIUM="models/tiny.lua --set layers=4 --set dim=256 --set heads=8 --set seq=256 --set batch=8"
CONFIGS=(
    "1|"
    "1|--recompute none"
    "1|--recompute full"
    "1|--micro-batches 2"
    "2|--dp 2"
    "2|--cp 2 --cp-comm p2p"
    "2|--cp 2 --cp-comm allgather"
    "2|--pp 2 --micro-batches 4"
    "2|--pp 2 --micro-batches 4 --pp-schedule zb-h1"
    "2|--pp 2 --micro-batches 4 --pp-schedule zb-v"
    "4|--dp 4"
    "4|--dp 2 --cp 2"
    "4|--pp 2 --dp 2 --micro-batches 4"
    "4|--pp 4 --micro-batches 4"
)
printf '%-7s %3s %-46s %10s %10s %8s %10s %10s\n' model np flags "pred ms" "meas ms" "error" "pred MiB" "RSS MiB"
errs=$tmp/errs
for size in small medium; do
    model=$SMALL; [ $size = medium ] && model=$MEDIUM
    for c in "${CONFIGS[@]}"; do
        np=${c%%|*} flags=${c#*|}
        # shellcheck disable=SC2086
        "$B/kiln" compile $model $flags -o "$tmp/tr" > /dev/null 2>&1 || { echo "$size $flags: compile failed"; continue; }
        # shellcheck disable=SC2086
        "$B/kiln" plan $model $flags --device-profile "$tmp/cpu$np.profile" > "$tmp/plan" 2>&1
        pred=$(sed -n 's/^predicted step \([0-9.]*\) ms.*/\1/p' "$tmp/plan")
        pmem=$(awk '/^  stage  compute ms/{on=1; next} on && $1 ~ /^[0-9]+$/ {if ($7 > m) m = $7} on && $1 !~ /^[0-9]+$/ {on=0} END{print m}' "$tmp/plan")
        rm -f "$tmp/log.jsonl" "$tmp"/rss.*
        if [ $np = 1 ]; then /usr/bin/time -f %M -o "$tmp/rss.0" "$tmp/tr" --data "$B/corpus.txt" --steps "$STEPS" --log "$tmp/log.jsonl" > /dev/null 2>&1
        else mpirun --oversubscribe -np $np bash -c "/usr/bin/time -f %M -o $tmp/rss.\$OMPI_COMM_WORLD_RANK $tmp/tr --data $B/corpus.txt --steps $STEPS --log $tmp/log.jsonl" > /dev/null 2>&1; fi
        # the mean step after the first: the log's elapsed seconds (since the first step's start)
        meas=$(grep -o '"elapsed":[0-9.e+]*' "$tmp/log.jsonl" | cut -d: -f2 | awk '{e[NR] = $1} END {if (NR > 1) printf "%.3f", 1000 * (e[NR] - e[1]) / (NR - 1)}')
        rss=$(cat "$tmp"/rss.* 2>/dev/null | awk '$1+0 > m {m = $1+0} END{printf "%.1f", m / 1024}')
        err=$(awk -v p="$pred" -v m="$meas" 'BEGIN{if (m > 0 && p > 0) printf "%+.1f%%", 100 * (p / m - 1); else print "?"}')
        [ "$err" != "?" ] && echo "${err%\%}" >> "$errs"
        printf '%-7s %3s %-46s %10s %10s %8s %10s %10s\n' "$size" "$np" "${flags:-(defaults)}" "$pred" "$meas" "$err" "$pmem" "$rss"
    done
done
awk '{print ($1 < 0 ? -$1 : $1)}' "$errs" | sort -g | awk '{v[NR] = $1} END {n = NR; printf "time |error|: median %.1f%%, max %.1f%% over %d configurations\n", (n % 2 ? v[(n+1)/2] : (v[n/2] + v[n/2+1]) / 2), v[n], n}'
echo "uptime after: $(uptime)"
