#!/usr/bin/env bash
# bench/offload.sh — activation offload on the CPU trainer (issue 19): 4 ranks,
# pp 4 (1f1b, M micro-batches), the same model compiled with --offload none,
# auto and all; for each, the step time and the device act arena's
# high-water mark per rank, measured by the runtime (KILN_MEASURE_PEAK=1, a
# separate short run: its scan costs time), beside the plan's.
# Noise: the policies run interleaved, ROUNDS rounds of one run each, the
# order rotated every round (none auto all, auto all none, ...); a run's
# step is the median of its per-step times after the first; each round gives
# the ratio of auto's (all's) step to none's of the same round, and the
# result is the median of those ratios over the rounds (with their range):
# a peer measured minutes apart on a shared machine is no baseline.  The
# load average is printed at the start and the end.
# The CPU's copies are memcpys on the d2h/h2d streams' threads
# (runtime/cpu/dev_cpu.c), the profile `cpu` (profiles/cpu.profile).
#   GPT (models/tiny.lua): 8 layers, dim 256, 4 heads, seq 256, global batch
#   16, vocab 256; --offload-min-bytes 64 KiB (the default 1 MiB takes
#   nothing at this size).
# KILN_BEFORE=PATH (another kiln binary, e.g. the commit before a change):
# a fourth policy "auto0", --offload auto compiled by that binary, in the
# same interleaved rounds (a before/after comparison on a shared machine).
# MIN_NODES=N: a further policy "auto-mN", --offload auto compiled with
# KILN_OFFLOAD_MIN_NODES=N (offload.c's floor between a copy and its fence,
# 8 nodes by default), in the same interleaved rounds.
# TRACE=1: every run also writes --trace files, and a last column gives
# the compute stream's idle time that ends with a copy (an idle gap of
# ranks 0-2 after which a d2h or h2d copy was the last thing to finish
# before the next kernel: the compute waited for a copy), ms a step, the
# median over the rounds: what the copies' fences cost, with less noise
# than the step time.  Two numbers, all / own: "own" leaves out the part of
# a gap before a comm op that ended in it before the copy began (the copy
# stream waited at its fence for that comm op, typically a reload behind
# the recv of the gradient its backward waits for anyway: without offload
# the compute would have waited for that recv too), so it is the time the
# compute waited for the copies themselves; "all" counts the whole gap.
# cpu ms: the CPU time (user + system, all 4 ranks: /usr/bin/time around
# mpirun) of a policy's run less none's of the same round, per step, the
# median over the rounds: what the copies cost the cores, which on this
# machine are the copy engine (less noisy under load than the step).
# KEEP=DIR: the runs' programs, logs and CPU times stay in DIR (a run cut
# short still leaves its rounds' logs: one JSON line a step).
# With 4 ranks on a 2-core machine the ranks are oversubscribed (a rank that
# waits frees its core): compare the policies, not the absolute times.
set -eu
B=${BUILD:-build}
M=${M:-8}
STEPS=${STEPS:-6}
ROUNDS=${ROUNDS:-5}
SHAPE="--set layers=8 --set dim=256 --set heads=4 --set seq=256 --set batch=16"
FLAGS="--pp 4 --micro-batches $M --offload-min-bytes 65536"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader
make -s "$B/kiln" "$B/corpus.txt" "$B/runtime/trainer_main.o" "$B/libkilnrt.a" BUILD="$B" > /dev/null
if [ -n "${KEEP:-}" ]; then tmp=$KEEP; mkdir -p "$tmp"; else tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT; fi
# RT_ENVS="tag=VAR=VALUE ...": for each, a further policy "auto-tag", the
# auto program run with VAR=VALUE in its environment (the CPU runtime's
# switches, e.g. RT_ENVS="prio=KILN_COPY_PRIORITY=normal plain=KILN_COPY_PLAIN=1").
rt_env() { for e in ${RT_ENVS:-}; do [ "auto-${e%%=*}" = "$1" ] && echo "${e#*=}"; done; return 0; }
POLICIES="none auto all${KILN_BEFORE:+ auto0}${MIN_NODES:+ auto-m$MIN_NODES}"
for e in ${RT_ENVS:-}; do POLICIES="$POLICIES auto-${e%%=*}"; done
for p in $POLICIES; do
    kiln="$B/kiln" pol=$p
    [ "$p" = auto0 ] && kiln=$KILN_BEFORE pol=auto
    [ -n "$(rt_env "$p")" ] && pol=auto
    mn=; [ "$p" = "auto-m${MIN_NODES:-}" ] && pol=auto mn=$MIN_NODES
    # shellcheck disable=SC2086
    KILN_OFFLOAD_MIN_NODES=$mn "$kiln" compile models/tiny.lua $SHAPE $FLAGS --offload "$pol" -o "$tmp/$p" > /dev/null
    # shellcheck disable=SC2086
    KILN_OFFLOAD_MIN_NODES=$mn "$kiln" plan models/tiny.lua $SHAPE $FLAGS --offload "$pol" > "$tmp/$p.plan" 2>&1
done
run() { # policy round; the run's CPU seconds (user + system, all ranks) in $tmp/POLICY.ROUND.cpu
    # shellcheck disable=SC2046
    /usr/bin/time -f '%U %S' -o "$tmp/$1.$2.cpu" mpirun --oversubscribe -np 4 $(rt_env "$1" | sed 's/^/-x /') "$tmp/$1" --data "$B/corpus.txt" --threads 1 --steps "$STEPS" --log "$tmp/$1.$2.log" \
        ${TRACE:+--trace "$tmp/$1.$2.json"} > /dev/null 2>&1
}
copy_stalls() { # policy -> ms a step (median over rounds) the compute stream of ranks 0-2 waited for copies
    [ -n "${TRACE:-}" ] || return 0
    for r in $(seq 1 "$ROUNDS"); do
        python3 - "$tmp/$1.$r.json" "$STEPS" <<'PY'
import bisect, json, sys
def xs(f):
    ev = json.load(open(f)); ev = ev.get("traceEvents", ev) if isinstance(ev, dict) else ev
    return [e for e in ev if e.get("ph") == "X"]
total = own = 0.0
for r in range(3):
    x = xs(sys.argv[1] + ("" if r == 0 else ".rank%d" % r))
    comp = sorted((e for e in x if e["tid"] == 0), key=lambda e: e["ts"])
    by_end = {t: sorted((e for e in x if e["tid"] == t), key=lambda e: e["ts"] + e["dur"]) for t in (1, 2, 3)}
    ends = {t: [e["ts"] + e["dur"] for e in by_end[t]] for t in (1, 2, 3)}
    starts = {t: [e["ts"] for e in by_end[t]] for t in (1, 2, 3)}
    for a, b in zip(comp, comp[1:]):
        g0 = a["ts"] + a["dur"]
        if b["ts"] - g0 < 20: continue
        last = max(((ends[t][i], t, i) for t in (1, 2, 3) for i in [bisect.bisect_right(ends[t], b["ts"] + 5) - 1] if i >= 0 and ends[t][i] > g0 - 1), default=None)
        if not last or last[1] not in (2, 3): continue
        total += b["ts"] - g0
        # own: from the end of a comm op that ended in the gap before the copy
        # began (the copy stream waited for it at its fence, e.g. a reload
        # behind a recv the compute needs too) or from the gap's start
        c0 = starts[last[1]][last[2]]
        j = bisect.bisect_right(ends[1], c0 + 5) - 1
        own += b["ts"] - (ends[1][j] if j >= 0 and ends[1][j] > g0 else g0)
print("%.1f %.1f" % (total / 1e3 / int(sys.argv[2]), own / 1e3 / int(sys.argv[2])))
PY
    done > "$tmp/$1.stalls"
    printf '%s / %s' "$(cut -d' ' -f1 "$tmp/$1.stalls" | median)" "$(cut -d' ' -f2 "$tmp/$1.stalls" | median)"
}
load() { uptime | sed 's/.*load average: //'; }
load0=$(load)
set -- $POLICIES
for r in $(seq 1 "$ROUNDS"); do # rotate the order each round
    k=$(( (r - 1) % $# )); order="$*"
    for _ in $(seq 1 $k); do order="${order#* } ${order%% *}"; done
    for p in $order; do run "$p" "$r"; done
done
load1=$(load)
# a run's step: the median of its per-step seconds ("elapsed" is cumulative) after the first
median() { sort -g | awk '{v[NR] = $1} END {if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
run_step() { awk -F'"elapsed":' '{split($2, a, ","); t = a[1] + 0; if (NR > 1) print t - prev; prev = t}' "$tmp/$1.$2.log" | median; }
median_step() { for r in $(seq 1 "$ROUNDS"); do run_step "$1" "$r"; done | median; }
ratios() { # policy -> per-round step / none's step of the same round, one a line
    for r in $(seq 1 "$ROUNDS"); do awk -v a="$(run_step "$1" "$r")" -v b="$(run_step none "$r")" 'BEGIN {print a / b}'; done
}
cpu_delta() { # policy -> the median over rounds of (its run's CPU seconds - none's of the same round) / STEPS, ms a step
    for r in $(seq 1 "$ROUNDS"); do
        awk -v s="$STEPS" 'FNR == NR {a = $1 + $2; next} {print (a - $1 - $2) / s * 1e3}' "$tmp/$1.$r.cpu" "$tmp/none.$r.cpu"
    done | median
}
marks() { # policy -> measured act high-water per rank, rank order
    # shellcheck disable=SC2046
    mpirun --oversubscribe -np 4 -x KILN_MEASURE_PEAK=1 $(rt_env "$1" | sed 's/^/-x /') "$tmp/$1" --data "$B/corpus.txt" --threads 1 --steps 2 > /dev/null 2> "$tmp/$1.peak"
    sed -n 's/^kiln runtime: rank \([0-9]*\) stage [0-9]*: act high-water mark \([0-9]*\) bytes.*host space \([0-9]*\)).*/\1 \2 \3/p' "$tmp/$1.peak" | sort -n
}
plan_act() { awk '/^  activations/ {for (i = 1; i <= NF; i++) if ($i == "bytes") {print $(i-1); break}}' "$tmp/$1.plan" | paste -sd' '; }
echo "offload ($(date -u +%F), load average $load0 at the start, $load1 at the end): 4 ranks, pp 4, $M micro-batches, $STEPS steps, $ROUNDS rounds interleaved"
printf '%-9s %12s %22s %9s   %s\n' policy "step (s)" "vs none (median, range)" "cpu ms" "act high-water per rank, measured (plan) bytes; host bytes${TRACE:+; copy stalls ms/step ranks 0-2, all / own}"
for p in $POLICIES; do
    s=$(median_step "$p")
    rs=$(ratios "$p" | sort -g)
    med=$(echo "$rs" | median) lo=$(echo "$rs" | head -1) hi=$(echo "$rs" | tail -1)
    m=$(marks "$p" | awk '{printf "%s%s", (NR > 1 ? " " : ""), $2} END {print ""}')
    h=$(sed -n 's/.*host space \([0-9]*\)).*/\1/p' "$tmp/$p.peak" | awk '{t += $1} END {print t + 0}')
    printf '%-9s %12.4f %22s %+9.1f   %s (%s); %s%s\n' "$p" "$s" "$(awk -v a="$med" -v l="$lo" -v h="$hi" 'BEGIN{printf "%+.1f%% (%+.1f..%+.1f)", 100 * (a - 1), 100 * (l - 1), 100 * (h - 1)}')" "$(cpu_delta "$p")" "$m" "$(plan_act "$p")" "$h" "${TRACE:+; $(copy_stalls "$p")}"
done
