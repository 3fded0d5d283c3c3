#!/usr/bin/env bash
# bench/cp_ring.sh — ring attention (--cp-comm p2p) on the CPU: a RANKS-rank
# run of the compiled trainer with --cp RANKS, and from rank 0's --trace
# timeline how much of the ring's send/recv time the compute stream hid
# (bench/trace_overlap.py), next to all comm kernels (the ring plus the
# gradients' reduce-scatter / all-gather).
#   GPT: 4 layers, 4 heads, dim 256, seq 256, vocab 256.
# The ranks share this machine's cores (oversubscribed on 2 cores), each
# with THREADS pool threads, so "hidden" means the compute stream was busy
# while a send/recv was in progress, not that the cores were free.
set -eu
B=${BUILD:-build}
STEPS=${STEPS:-10}
RANKS=${RANKS:-2}
THREADS=${THREADS:-1}
SHAPE="--set layers=4 --set dim=256 --set seq=256 --set heads=4"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
make -s "$B/kiln" "$B/corpus.txt" "$B/runtime/trainer_main.o" "$B/libkilnrt.a" BUILD="$B" >/dev/null
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# shellcheck disable=SC2086
"$B/kiln" compile models/tiny.lua $SHAPE --cp "$RANKS" --cp-comm p2p -o "$tmp/ring" > /dev/null
mpirun --oversubscribe -np "$RANKS" "$tmp/ring" --data "$B/corpus.txt" --steps $((STEPS + 2)) --threads "$THREADS" \
    --log "$tmp/ring.jsonl" --trace "$tmp/ring.json" > /dev/null
step_ms() { tail -n +3 "$1" | sed 's/.*"elapsed":\([^,]*\),.*/\1/' | awk 'NR == 1 {a = $1} {b = $1; n++} END {printf "%.1f", (n > 1 ? 1000 * (b - a) / (n - 1) : 0)}'; }
read -r comm hidden exposed pct < <(/usr/bin/python3 bench/trace_overlap.py "$tmp/ring.json" send,recv)
read -r acomm ahidden aexposed apct < <(/usr/bin/python3 bench/trace_overlap.py "$tmp/ring.json")
echo "cp_ring ($(date -u +%F), $(nproc) cores, $RANKS ranks x $THREADS threads, --cp $RANKS --cp-comm p2p, $STEPS timed steps)"
printf '%-34s %8s ms/step\n' "step time" "$(step_ms "$tmp/ring.jsonl")"
printf '%-34s comm %s ms, hidden behind compute %s ms (%s%%), exposed %s ms\n' "rank 0 trace, send/recv" "$comm" "$hidden" "$pct" "$exposed"
printf '%-34s comm %s ms, hidden behind compute %s ms (%s%%), exposed %s ms\n' "rank 0 trace, all comm" "$acomm" "$ahidden" "$apct" "$aexposed"
