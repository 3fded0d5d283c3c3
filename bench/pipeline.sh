#!/usr/bin/env bash
# bench/pipeline.sh — the pipeline schedules on the CPU trainer: P ranks
# (pp P, one pool thread each), every schedule at M micro-batches, the same
# model; for each, the bubble measured from the ranks' --trace files (the
# compute stream's idle share of the last step, as `kiln plot --trace`
# reads it) beside the bubble kiln plan predicts from the ops' costs and the
# schedule's closed form.  Every schedule runs in every round, rounds
# alternating, so they share the machine's noise; the table gives the
# median over ROUNDS rounds (min-max beside it), and the zero-bubble
# schedules' ratio to 1f1b both as the ratio of the medians and as the
# median of the per-round ratios (a ratio within one round compares runs
# seconds apart).
#   GPT: 8 layers (pp 4 x vpp 2 chunks for interleaved and zb-v), dim 128,
#   4 heads, seq 128, global batch 16, vocab 256.  SHAPE="--set ..." gives
#   another (e.g. dim 256, seq 64: the GEMMs a larger share of each layer,
#   so W is a larger share of the backward, as in a large model).
# Where the idle goes (bench/pp_trace_idle.py, medians over the rounds):
# wait (gaps in which the rank waited for a receive or the loss/norm
# all-reduce), host (the other gaps between kernels: per-kernel launch
# overhead), and the machine's occupancy (the ranks' busy time over cores x
# step: near 1, the ranks share cores and the idle is time-slicing).  For
# 1f1b and zb-h1, "sim" is the bubble the schedule has at the costs measured
# in the same traces (per-kernel medians) with no latency and no host
# overhead, and for P=2 the per-transfer latency (median of the step's
# blocking receives, the ranks' clock offset taken from the transfers'
# minima both ways).  Beside zb-h1's ratio at the measured costs, the ratio
# no order within zb-h1's in-flight bound can beat at those costs
# (ppsched_makespan_bound): equal, the W placement is not what is left;
# and the ratio with the ranks' measured costs scaled to equal totals (the
# stages balanced in time).
# With P = 4 on a 2-core machine the ranks are oversubscribed: two run
# while two are descheduled, a kernel's span includes the time its thread
# waited for a core, and a rank waiting for a descheduled peer counts as
# idle (see the occupancy column).  P=2 runs one rank per core.  KEEP=DIR
# keeps the traces, logs and plans (then `kiln plot --trace DIR/S.R.json
# DIR/S.R.json.rank1 ...`).  The load average is printed at the start and
# the end: on a shared machine the ranks are slowed unevenly and wait for
# each other for reasons not the schedule's.  A warning line says when
# kiln plot's idle and pp_trace_idle.py's (the same definition, read twice)
# differ by 0.15 points or more.  EXTRA="FLAGS" adds kiln flags to every
# compile and plan (e.g. EXTRA="--schedule fixed" against the default lhs).
set -eu
B=${BUILD:-build}
P=${P:-4}
M=${M:-8}
STEPS=${STEPS:-4}
ROUNDS=${ROUNDS:-3}
SCHEDULES=${SCHEDULES:-1f1b interleaved zb-h1 zb-v}
EXTRA=${EXTRA:-} # more kiln flags for every compile and plan (e.g. --schedule fixed)
SHAPE=${SHAPE:-"--set layers=8 --set dim=128 --set heads=4 --set seq=128 --set batch=16"} # the model (kiln --set flags)
HERE=$(cd "$(dirname "$0")" && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
make -s "$B/kiln" "$B/corpus.txt" "$B/runtime/trainer_main.o" "$B/libkilnrt.a" BUILD="$B" > /dev/null
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
KEEP=${KEEP:-} # a folder: the traces, logs and plans are copied there at the end
load0=$(uptime | sed 's/.*load average: //')
flags() { [ "$1" = interleaved ] && echo "--vpp 2"; true; }
for s in $SCHEDULES; do
    # shellcheck disable=SC2046,SC2086
    "$B/kiln" compile models/tiny.lua --pp "$P" --micro-batches "$M" --pp-schedule "$s" $(flags "$s") $SHAPE $EXTRA -o "$tmp/$s" > /dev/null
    # shellcheck disable=SC2046,SC2086
    "$B/kiln" plan models/tiny.lua --pp "$P" --micro-batches "$M" --pp-schedule "$s" $(flags "$s") $SHAPE $EXTRA > "$tmp/$s.plan"
done
traces() { # stem: the P trace files of a run, rank order
    echo "$1"; for r in $(seq 1 $((P - 1))); do echo "$1.rank$r"; done
}
for round in $(seq 1 "$ROUNDS"); do
    for s in $SCHEDULES; do
        f="$tmp/$s.$round.json"
        mpirun --oversubscribe -np "$P" "$tmp/$s" --data "$B/corpus.txt" --steps "$STEPS" --threads 1 \
            --trace "$f" --log "$tmp/$s.$round.jsonl" > /dev/null
        # shellcheck disable=SC2046
        "$B/kiln" plot --trace $(traces "$f") -o "$f.svg" > /dev/null
        sed -n 's/.*compute idle \([0-9.]*\)%.*/idle_plot \1/p' "$f.svg" | head -1 > "$f.a"
        # shellcheck disable=SC2046
        python3 "$HERE/pp_trace_idle.py" "$s" "$M" "$(nproc)" $(traces "$f") >> "$f.a"
    done
done
val() { sed -n "s/^$2 //p" "$1" | awk '{print $1}'; } # file key -> first field
med() { # the median of the numbers on stdin, printed with format $1 (default %.1f)
    sort -g | awk -v f="${1:-%.1f}" '{a[NR] = $1} END {if (NR == 0) print "-"; else printf f "\n", NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'
}
across() { for r in $(seq 1 "$ROUNDS"); do val "$tmp/$1.$r.json.a" "$2"; done; } # schedule key -> one value per round
range() { across "$1" "$2" | sort -g | sed -n '1p;$p' | paste -sd- -; }
echo "pipeline ($(date -u +%F), $(nproc) cores, pp $P x 1 thread, $M micro-batches, $STEPS steps x $ROUNDS rounds; load average at the start: $load0)"
printf '%-12s %8s %15s %7s %7s %6s %6s %6s %5s %6s\n' schedule "step ms" "idle % (range)" "plan %" "closed" wait host tail occ "sim %"
for s in $SCHEDULES; do
    ops=$(sed -n 's/.*bubble \([0-9.]*\) from the ops.*/\1/p' "$tmp/$s.plan" | awk '{printf "%.1f", 100 * $1}')
    closed=$(sed -n 's/.*closed form \([0-9.]*\) at.*/\1/p' "$tmp/$s.plan" | awk '{printf "%.1f", 100 * $1}')
    key=sim_1f1b; [ "$s" = zb-h1 ] && key=sim_zbh1
    sim=$(across "$s" $key | med)
    [ "$s" = 1f1b ] || [ "$s" = zb-h1 ] || sim=-
    printf '%-12s %8s %6s (%s) %7s %7s %6s %6s %6s %5s %6s\n' "$s" "$(across "$s" step_ms | med)" "$(across "$s" idle_plot | med)" \
        "$(range "$s" idle_plot)" "${ops:-?}" "${closed:-?}" "$(across "$s" wait | med)" "$(across "$s" host | med)" \
        "$(across "$s" tail | med)" "$(across "$s" occupancy | med %.2f)" "$sim"
done
if echo " $SCHEDULES " | grep -q ' 1f1b '; then
    base=$(across 1f1b idle_plot | med)
    pbase=$(sed -n 's/.*bubble \([0-9.]*\) from the ops.*/\1/p' "$tmp/1f1b.plan")
    for s in $SCHEDULES; do
        [ "$s" = 1f1b ] && continue
        per=$(for r in $(seq 1 "$ROUNDS"); do
            echo "$(val "$tmp/$s.$r.json.a" idle_plot) $(val "$tmp/1f1b.$r.json.a" idle_plot)"; done | awk '{printf "%.2f\n", $1 / $2}')
        plan=$(sed -n 's/.*bubble \([0-9.]*\) from the ops.*/\1/p' "$tmp/$s.plan" | awk -v b="$pbase" '{printf "%.2f", $1 / b}')
        line="$s / 1f1b: measured $(across "$s" idle_plot | med | awk -v b="$base" '{printf "%.2f", $1 / b}') (median of the rounds' ratios $(echo "$per" | med %.2f); rounds $(echo "$per" | paste -sd' ' -)), plan $plan"
        if [ "$s" = zb-h1 ]; then
            line="$line, at the measured costs $(for r in $(seq 1 "$ROUNDS"); do
                echo "$(val "$tmp/zb-h1.$r.json.a" sim_zbh1) $(val "$tmp/zb-h1.$r.json.a" sim_1f1b)"; done | awk '{printf "%.2f\n", $1 / $2}' | med %.2f)"
            line="$line, no order under its in-flight bound below $(for r in $(seq 1 "$ROUNDS"); do
                echo "$(val "$tmp/zb-h1.$r.json.a" best_zbh1) $(val "$tmp/zb-h1.$r.json.a" sim_1f1b)"; done | awk '{printf "%.2f\n", $1 / $2}' | med %.2f)"
            line="$line, with the stages equal in time $(across zb-h1 equal_ratio | med %.2f)"
        fi
        echo "$line"
    done
fi
for s in $SCHEDULES; do
    c=$(sed -n 's/^costs_ms //p' "$tmp/$s.$ROUNDS.json.a")
    l=$(sed -n 's/^latency_us //p' "$tmp/$s.$ROUNDS.json.a")
    echo "$s, last round: measured F/B/W ms per micro-batch per rank $c${l:+; transfer latency median/max/n $l us}"
done
if [ -n "$KEEP" ]; then mkdir -p "$KEEP" && cp "$tmp"/*.json* "$tmp"/*.plan "$KEEP"/; fi
for s in $SCHEDULES; do # the two readings of the idle must agree (kiln plot's and pp_trace_idle.py's)
    for r in $(seq 1 "$ROUNDS"); do
        a="$tmp/$s.$r.json.a"
        if ! awk -v x="$(val "$a" idle_plot)" -v y="$(val "$a" idle)" 'BEGIN {exit !(x - y < 0.15 && y - x < 0.15)}'; then
            echo "warning: $s round $r: kiln plot says idle $(val "$a" idle_plot)%, pp_trace_idle.py $(val "$a" idle)%"
        fi
    done
done
if [ "$P" -gt "$(nproc)" ]; then
    echo "note: $P ranks on $(nproc) cores are oversubscribed (occ above): the idle is mostly time-slicing, not the schedule; P=$(nproc) runs a rank per core"
fi
echo "load average at the end: $(uptime | sed 's/.*load average: //')"
