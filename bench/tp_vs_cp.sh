#!/usr/bin/env bash
# bench/tp_vs_cp.sh — tensor parallel vs context parallel vs data parallel on
# 4 CPU ranks (issue 20): the same model (tiny.lua at dim DIM, LAYERS
# layers, HEADS heads, global batch BATCH) trained for STEPS steps as
# `--tp 4` (sequence parallel), `--cp 4 --cp-comm p2p` (ring attention) and
# `--dp 4`, at two sequence lengths (SEQS).  Per run: the median tokens/s
# over steps 2..STEPS and the bytes each rank sent per step, both as the
# trainer logs them (`tokens_per_s`, `comm_bytes`: the runtime's count of
# what its collectives and sends moved).  Prints the machine's load first:
# on a shared machine the times are noisy, the bytes are not.
# Exposed comm, from the ranks' `--trace` files (one per rank, Chrome
# format): the trace has no wait events, so it is the compute stream's
# (tid 0) idle time in the last step, as `kiln plot --trace` defines the
# step (compiler/cmd/plot.c tr_window): the step starts after the kernels of
# the last `opt` phase that another phase follows, its window runs from its
# first event on any stream to the end of its last compute kernel, and idle
# = the window minus the union of its compute kernels.  Unlike the plot's
# title (which divides by the slowest rank's window) each rank's idle is
# taken in its own window; printed as the mean over ranks in ms and as % of
# the mean window.  Idle is everything the compute stream is not running a
# kernel: waits on collectives and sends, but also host work between
# kernels and, with more ranks than cores, time descheduled.
#   STEPS=6 SEQS="128 512" bash bench/tp_vs_cp.sh
set -eu
B=${BUILD:-build}
STEPS=${STEPS:-6} SEQS=${SEQS:-"128 512"}
DIM=${DIM:-128} LAYERS=${LAYERS:-2} HEADS=${HEADS:-4} BATCH=${BATCH:-4}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader}
make -s "$B/kiln" BUILD="$B" > /dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
head -c 400000 README.md > "$tmp/data.txt"
exposed() { # trace files of one run -> "window_ms idle_ms idle_%" (see the header)
    python3 - "$@" <<'PY'
import json, sys
def rank(path):
    ev = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X"]
    comp = sorted((e for e in ev if e.get("tid") == 0), key=lambda e: e["ts"])
    other = [e["ts"] for e in ev if e.get("tid") != 0]
    if not comp: sys.exit(path + ": no compute-stream (tid 0) events")
    ph = [e.get("args", {}).get("at", "").split(" ")[0] for e in comp]
    cuts = [i for i in range(1, len(comp)) if ph[i - 1] == "opt" and ph[i] != "opt"]
    i0 = cuts[-1] if cuts else 0
    prev = max((e["ts"] + e["dur"] for e in comp[:i0]), default=float("-inf"))
    ws = min([comp[i0]["ts"]] + [t for t in other if prev < t < comp[i0]["ts"]])
    busy, to, we = 0.0, float("-inf"), comp[i0]["ts"]
    for e in comp[i0:]:
        a, b = max(e["ts"], to), e["ts"] + e["dur"]
        busy += max(0.0, b - a)
        to, we = max(to, b), max(we, b)
    return we - ws, we - ws - busy
r = [rank(p) for p in sys.argv[1:]]
step, idle = sum(x[0] for x in r) / len(r), sum(x[1] for x in r) / len(r)
print("%.1f %.1f %.1f" % (step / 1e3, idle / 1e3, 100 * idle / step))
PY
}
median() { sort -g | awk '{v[NR] = $1} END {if (NR == 0) print "-"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
echo "tp_vs_cp ($(date -u '+%F %H:%M UTC')): tiny.lua dim $DIM, $LAYERS layers, $HEADS heads, batch $BATCH, $STEPS steps, 4 CPU ranks"
echo "load: $(uptime | sed 's/.*load average/load average/')"
printf '%6s %-22s %12s %16s %14s %16s %12s\n' seq layout "tokens/s" "comm bytes/step" "last step ms" "exposed comm ms" "exposed %"
for seq in $SEQS; do
    for layout in "--tp 4" "--cp 4 --cp-comm p2p" "--dp 4"; do
        bin=$tmp/t_${seq}_${layout// /_}
        # shellcheck disable=SC2086 # the layout is words
        if ! "$B/kiln" compile models/tiny.lua --set dim="$DIM" --set layers="$LAYERS" --set heads="$HEADS" \
            --set batch="$BATCH" --set seq="$seq" $layout --target cpu -o "$bin" > "$tmp/log" 2>&1; then
            echo "compile $layout at seq $seq failed: $(head -c 300 "$tmp/log")" >&2
            exit 1
        fi
        if ! timeout 900 mpirun -np 4 --oversubscribe "$bin" --data "$tmp/data.txt" --steps "$STEPS" --log "$tmp/run.log" \
            --trace "$tmp/tr.json" \
            > "$tmp/out" 2>&1; then
            echo "$layout at seq $seq: the trainer failed: $(tail -3 "$tmp/out" | tr '\n' ' ')" >&2
            exit 1
        fi
        tps=$(sed -n '2,$s/.*"tokens_per_s":\([0-9.e+]*\).*/\1/p' "$tmp/run.log" | median)
        comm=$(sed -n '1s/.*"comm_bytes":\([0-9]*\).*/\1/p' "$tmp/run.log")
        if ! ex=$(exposed "$tmp/tr.json" "$tmp"/tr.json.rank[1-3]); then
            echo "$layout at seq $seq: cannot read the traces" >&2
            exit 1
        fi
        read -r win idle pct <<< "$ex"
        printf '%6d %-22s %12s %16s %14s %16s %12s\n' "$seq" "$layout" "$tps" "$comm" "$win" "$idle" "$pct"
    done
done
