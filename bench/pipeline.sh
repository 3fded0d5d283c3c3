#!/usr/bin/env bash
# bench/pipeline.sh — the pipeline schedules on the CPU trainer: P ranks
# (pp P, one pool thread each), every schedule at M micro-batches, the same
# model; for each, the bubble measured from the ranks' --trace files (the
# compute stream's idle share of the last step, as `kiln plot --trace`
# reads it) beside the bubble kiln plan predicts from the ops' costs and the
# schedule's closed form, and the step time.  Every schedule runs in the
# same session, alternating rounds, so they share the machine's noise.
#   GPT: 8 layers (pp 4 x vpp 2 chunks for interleaved and zb-v), dim 128,
#   4 heads, seq 128, global batch 16, vocab 256.
# With P = 4 on a 2-core machine the ranks are oversubscribed: a rank that
# waits for a receive frees its core for another, so the measured idle is
# the schedule's plus the machine's sharing (compare the ratios, not the
# absolute numbers).  P=2 runs one rank per core.  The last column is each
# rank's idle share in the last round; KEEP=DIR keeps the traces, logs and
# plans (then `kiln plot --trace DIR/S.R.json DIR/S.R.json.rank1 ...`).
# The load average is printed at the end: on a shared machine the ranks are
# slowed unevenly and wait for each other for reasons not the schedule's.
set -eu
B=${BUILD:-build}
P=${P:-4}
M=${M:-8}
STEPS=${STEPS:-4}
ROUNDS=${ROUNDS:-2}
SHAPE="--set layers=8 --set dim=128 --set heads=4 --set seq=128 --set batch=16"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
make -s "$B/kiln" "$B/corpus.txt" "$B/runtime/trainer_main.o" "$B/libkilnrt.a" BUILD="$B" > /dev/null
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
KEEP=${KEEP:-} # a folder: the traces, logs and plans are copied there at the end
SCHEDULES="1f1b interleaved zb-h1 zb-v"
flags() { [ "$1" = interleaved ] && echo "--vpp 2"; true; }
for s in $SCHEDULES; do
    # shellcheck disable=SC2046,SC2086
    "$B/kiln" compile models/tiny.lua --pp "$P" --micro-batches "$M" --pp-schedule "$s" $(flags "$s") $SHAPE -o "$tmp/$s" > /dev/null
    # shellcheck disable=SC2046,SC2086
    "$B/kiln" plan models/tiny.lua --pp "$P" --micro-batches "$M" --pp-schedule "$s" $(flags "$s") $SHAPE > "$tmp/$s.plan"
done
traces() { # stem: the P trace files of a run, rank order
    echo "$1"; for r in $(seq 1 $((P - 1))); do echo "$1.rank$r"; done
}
idle() { # stem -> the compute idle % of the last step
    # shellcheck disable=SC2046
    "$B/kiln" plot --trace $(traces "$1") -o "$1.svg" > /dev/null
    sed -n 's/.*compute idle \([0-9.]*\)%.*/\1/p' "$1.svg" | head -1
}
ranks_idle() { # stem -> each rank's idle % of the last step, "r0/r1/..."
    grep -o 'rank [0-9]*, idle [0-9.]*%' "$1.svg" | sed 's/.*idle \([0-9.]*\)%/\1/' | paste -sd/ -
}
for round in $(seq 1 "$ROUNDS"); do
    for s in $SCHEDULES; do
        mpirun --oversubscribe -np "$P" "$tmp/$s" --data "$B/corpus.txt" --steps "$STEPS" --threads 1 \
            --trace "$tmp/$s.$round.json" --log "$tmp/$s.$round.jsonl" > /dev/null
    done
done
# the mean step time of every step but the first of each round
step_ms() { for f in "$@"; do tail -n +2 "$f"; done | sed 's/.*"tokens_per_s":\([^,]*\),.*/\1/' |
    awk -v tok=$((16 * 128)) '{s += tok / $1; n++} END {printf "%.1f", 1000 * s / n}'; }
echo "pipeline ($(date -u +%F), $(nproc) cores, pp $P x 1 thread, $M micro-batches, $STEPS steps x $ROUNDS rounds)"
printf '%-12s %10s %16s %14s %12s   %s\n' schedule "step ms" "measured idle %" "plan (ops) %" "closed form %" "per rank, last round"
for s in $SCHEDULES; do
    m=$(for round in $(seq 1 "$ROUNDS"); do idle "$tmp/$s.$round.json"; done | awk '{s += $1; n++} END {printf "%.1f", s / n}')
    ops=$(sed -n 's/.*bubble \([0-9.]*\) from the ops.*/\1/p' "$tmp/$s.plan" | awk '{printf "%.1f", 100 * $1}')
    closed=$(sed -n 's/.*closed form \([0-9.]*\) at.*/\1/p' "$tmp/$s.plan" | awk '{printf "%.1f", 100 * $1}')
    # shellcheck disable=SC2046
    printf '%-12s %10s %16s %14s %12s   %s\n' "$s" "$(step_ms $(for r in $(seq 1 "$ROUNDS"); do echo "$tmp/$s.$r.jsonl"; done))" "$m" "${ops:-?}" "${closed:-?}" "$(ranks_idle "$tmp/$s.$ROUNDS.json")"
done
if [ -n "$KEEP" ]; then mkdir -p "$KEEP" && cp "$tmp"/*.json* "$tmp"/*.plan "$KEEP"/; fi
echo "load average (uptime): $(uptime | sed 's/.*load average: //')"
