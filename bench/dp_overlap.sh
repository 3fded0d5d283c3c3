#!/usr/bin/env bash
# bench/dp_overlap.sh — data parallel on the CPU: a 4-rank run of the compiled
# trainer (mpirun, distributed optimizer) with collectives on the comm stream
# (overlapped with compute) against the same program with --no-overlap
# (collectives on the compute stream), measured in the same run; and, from
# rank 0's --trace timeline, how much comm time the compute stream hid.
#   GPT: 4 layers, 4 heads, dim 256, seq 256, global batch 16, vocab 256.
# RANKS ranks share this machine's cores (oversubscribed on 2 cores), each
# with THREADS pool threads.
set -eu
B=${BUILD:-build}
STEPS=${STEPS:-10}
RANKS=${RANKS:-4}
THREADS=${THREADS:-1}
BUCKET=${BUCKET:-1}
SHAPE="--set layers=4 --set heads=4 --set dim=256 --set seq=256 --set batch=16 --bucket-mb $BUCKET"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
make -s "$B/kiln" "$B/corpus.txt" "$B/runtime/trainer_main.o" "$B/libkilnrt.a" BUILD="$B" >/dev/null
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# shellcheck disable=SC2086
"$B/kiln" compile models/tiny.lua --dp "$RANKS" $SHAPE -o "$tmp/on" > /dev/null
# shellcheck disable=SC2086
"$B/kiln" compile models/tiny.lua --dp "$RANKS" $SHAPE --no-overlap -o "$tmp/off" > /dev/null
run() { # binary, log, trace
    mpirun --oversubscribe -np "$RANKS" "$1" --data "$B/corpus.txt" --steps $((STEPS + 2)) --threads "$THREADS" \
        --log "$2" --trace "$3" > /dev/null
}
# mean step time of the timed steps (the first two are warm-up)
step_ms() { tail -n +3 "$1" | sed 's/.*"tokens_per_s":\([^,]*\),.*/\1/' | awk -v tok=$((16 * 256)) '{s += tok / $1; n++} END {printf "%.1f", 1000 * s / n}'; }
for round in 1 2; do # alternate, so both see the same machine noise
    run "$tmp/on" "$tmp/on$round.jsonl" "$tmp/on$round.json"
    run "$tmp/off" "$tmp/off$round.jsonl" "$tmp/off$round.json"
done
on=$(cat "$tmp"/on1.jsonl "$tmp"/on2.jsonl > "$tmp/on.jsonl"; step_ms "$tmp/on.jsonl")
off=$(cat "$tmp"/off1.jsonl "$tmp"/off2.jsonl > "$tmp/off.jsonl"; step_ms "$tmp/off.jsonl")
read -r comm hidden exposed pct < <(/usr/bin/python3 bench/trace_overlap.py "$tmp/on2.json")
read -r comm0 hidden0 exposed0 pct0 < <(/usr/bin/python3 bench/trace_overlap.py "$tmp/off2.json")
echo "dp_overlap ($(date -u +%F), $(nproc) cores, $RANKS ranks x $THREADS threads, $STEPS timed steps x 2 rounds, bucket $BUCKET MiB)"
printf '%-34s %8s ms/step\n' "overlap (comm stream)" "$on" "--no-overlap (compute stream)" "$off"
awk -v a="$on" -v b="$off" 'BEGIN {printf "%-34s %8.3fx\n", "no-overlap / overlap step time", b / a}'
printf '%-34s comm %s ms, hidden behind compute %s ms (%s%%), exposed %s ms\n' "rank 0 trace, overlap" "$comm" "$hidden" "$pct" "$exposed"
printf '%-34s comm %s ms, hidden %s ms (%s%%), exposed %s ms\n' "rank 0 trace, --no-overlap" "$comm0" "$hidden0" "$pct0" "$exposed0"
