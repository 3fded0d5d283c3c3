#!/usr/bin/env bash
# bench/overlap.sh — the latency-hiding schedule against the fixed one on 4
# CPU ranks (issue 22, docs/schedule.md): for `--dp 4`, `--cp 4 --cp-comm
# p2p`, `--pp 4` and `--pp 2 --dp 2` with offload, the same model (tiny.lua
# at dim DIM, LAYERS layers, HEADS heads, sequence SEQ, global batch BATCH)
# compiled under `--schedule fixed` and `--schedule lhs` and trained for
# STEPS steps under mpirun, side by side in one run.  Per run:
#   predicted   the cost model's exposed time (kiln plan --device-profile
#               cpu: exposed comm + exposed copy, mean over pipeline ranks, ms)
#   step ms     the median over steps 2..STEPS of the batch's tokens over the
#               trainer's logged tokens_per_s
#   order       "same" when lhs kept the fixed order (kiln dump --after
#               schedule is identical: the memory rule or the predicted step
#               sent it back), else "moved"
#   exposed     from the ranks' --trace files: the compute stream's idle time
#               in the last step (the window and the rule of
#               bench/tp_vs_cp.sh, mean over ranks, ms and % of the window)
# Prints the machine's load first: on a shared machine the times are noisy;
# compare fixed and lhs of one configuration, in one run.
#   STEPS=6 bash bench/overlap.sh
set -eu
B=${BUILD:-build}
STEPS=${STEPS:-6} SEQ=${SEQ:-128}
DIM=${DIM:-128} LAYERS=${LAYERS:-4} HEADS=${HEADS:-4} BATCH=${BATCH:-8}
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
MODEL="models/tiny.lua --set dim=$DIM --set layers=$LAYERS --set heads=$HEADS --set batch=$BATCH --set seq=$SEQ"
predicted() { # kiln plan's per-rank lines -> mean (exposed comm + exposed copy) over ranks, ms
    awk '/^  stage  compute ms/ {on = 1; next} on && NF == 7 && $1 ~ /^[0-9]+$/ {s += $3 + $5; n++} on && NF != 7 {on = 0}
         END {if (n) printf "%.3f", s / n; else print "-"}'
}
echo "overlap ($(date -u '+%F %H:%M UTC')): tiny.lua dim $DIM, $LAYERS layers, $HEADS heads, seq $SEQ, batch $BATCH, $STEPS steps, 4 CPU ranks"
echo "load: $(uptime | sed 's/.*load average/load average/')"
printf '%-44s %-6s %6s %14s %10s %16s %10s\n' config schedule order "predicted ms" "step ms" "exposed ms" "exposed %"
for cfg in "--dp 4" "--cp 4 --cp-comm p2p" "--pp 4 --micro-batches 4" "--pp 2 --dp 2 --micro-batches 2 --offload all --offload-min-bytes 1"; do
    # shellcheck disable=SC2086
    "$B/kiln" dump $MODEL $cfg --after schedule --schedule fixed > "$tmp/fixed.ir" 2>&1
    # shellcheck disable=SC2086
    "$B/kiln" dump $MODEL $cfg --after schedule --schedule lhs > "$tmp/lhs.ir" 2>&1
    order=moved
    cmp -s "$tmp/fixed.ir" "$tmp/lhs.ir" && order=same
    for sched in fixed lhs; do
        bin=$tmp/t_$sched
        # shellcheck disable=SC2086 # the model and the layout are words
        pred=$("$B/kiln" plan $MODEL $cfg --schedule $sched --device-profile cpu 2>&1 | predicted)
        # shellcheck disable=SC2086
        if ! "$B/kiln" compile $MODEL $cfg --schedule $sched --target cpu -o "$bin" > "$tmp/log" 2>&1; then
            echo "compile $cfg --schedule $sched failed: $(head -c 300 "$tmp/log")" >&2
            exit 1
        fi
        if ! timeout 900 mpirun -np 4 --oversubscribe "$bin" --data "$tmp/data.txt" --steps "$STEPS" --log "$tmp/run.log" \
            --trace "$tmp/tr.json" > "$tmp/out" 2>&1; then
            echo "$cfg --schedule $sched: the trainer failed: $(tail -3 "$tmp/out" | tr '\n' ' ')" >&2
            exit 1
        fi
        ms=$(sed -n '2,$s/.*"tokens_per_s":\([0-9.e+]*\).*/\1/p' "$tmp/run.log" | awk -v t=$((BATCH * SEQ)) '{print 1000 * t / $1}' | median)
        if ! ex=$(exposed "$tmp/tr.json" "$tmp"/tr.json.rank[1-3]); then
            echo "$cfg --schedule $sched: cannot read the traces" >&2
            exit 1
        fi
        read -r win idle pct <<< "$ex"
        o=-
        [ "$sched" = lhs ] && o=$order
        printf '%-44s %-6s %6s %14s %10.1f %16s %10s\n' "$cfg" "$sched" "$o" "$pred" "$ms" "$idle" "$pct"
    done
done
