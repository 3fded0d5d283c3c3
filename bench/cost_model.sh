#!/usr/bin/env bash
# bench/cost_model.sh — the cost model (compiler/cost.c) against the CPU
# trainer on this machine (issue 21): every configuration below is compiled
# and run for STEPS steps; the predicted step (kiln plan's "predicted step")
# beside the measured one (the steady step: the fastest stretch after a warm-up,
# below; the JSONL log's elapsed seconds), and the predicted activation space (memplan's
# arena, the largest stage's) beside the largest rank's measured high-water
# mark of it (KILN_MEASURE_PEAK=1: the runtime fills the space with 0xff
# and finds the highest byte written; equal up to the last value's
# alignment padding, a few bytes).
#   small:  tiny GPT, 4 layers, dim 64, seq 64, batch 8 (byte level)
#   medium: 4 layers, dim 256, 8 heads, seq 256, batch 8
# The profile: `kiln calibrate` under the configuration's number of ranks
# (its `threads` is then the trainer's: 1 under -np 2 and -np 4 — the
# runtime runs one thread a rank when the local ranks would oversubscribe
# the cores —, 2 under -np 1; the rates are one rank's alone and the cost model shares the
# node's `cores` among what runs at once: compiler/cost.c), measured again at each change of model size or rank count
# (CALIBRATE=once: once per rank count for the whole run), all before the
# rounds (below); the 1-minute load average is printed on every row (the
# fastest round's)
# (other sessions share the machine: state it).  The "unshared" column is
# the same profile without its cores (no processor sharing: each rank as
# if on cores of its own), for the sharing model's effect.  Prints one row per
# configuration and the median and largest |error| of the step time.
# ROUNDS=R (default 4): every configuration is run R times, round-robin
# (round 1 runs every row in order, round 2 in reverse, ...), and a row's
# measured step is its fastest round's steady step; "spread" is its slowest
# round's over its fastest.  Why: this VM runs in phases — stretches of
# seconds whose steps are 1.3-1.5x slower, made by no process of ours (a
# quiet run, nothing else on the machine: neighbouring rows of the 1-rank
# medium model measured 528 and 355 ms where the model says 4% apart;
# offload's rounds of one configuration -19..+16% around their median;
# bench/RESULTS.md, session 10).  A phase only ever slows a run (nothing
# makes this machine faster than itself alone), so of R interleaved runs
# the fastest is the one a phase missed, which is what the model predicts
# (the machine alone); a single run lets one phase land on whole rows.
# The memory columns are exact in every round (the largest is printed).
# Then
# the tune check: `kiln tune` on 2 ranks (small model, the np 2 profile),
# its first TOP rows compiled and run, and the first choice's measured step
# against the best measured of them (the issue's goal: within 5%), each
# run ROUNDS times interleaved, the fastest.
# TUNE_ONLY=1 runs that part alone.  bench/cost_kernels.py splits one
# configuration's error by kernel kind.  About 9-11 minutes on a quiet
# machine at ROUNDS=4 (phase 1, six calibrations and 28 compiles: 2.5-3.5
# min; a round of the 28 rows ~1.5 min quiet, 2.5 min at load 4), so the
# default stays under 12 minutes; ROUNDS=2 for a quick look.
# STEPS=N: both sizes' step count (for a quick look).  KEEP=DIR: copy each
# profile calibrated there (NAME.SIZE.profile), to replan the rows offline,
# and every round's steady step per row (DIR/rounds.txt).
# The measured step is the steady state's: the fastest stretch (steady(), below) after a warm-up
# of WARM_S seconds (default 0.3; at least the first step), the small
# model run for SMALL_STEPS (80) steps, the medium for MEDIUM_STEPS (10).  A
# quiet 1-rank trace of the small model (bench/RESULTS.md, 2026-12-03) ran
# its first six steps (~0.1 s) at 16.6-17.3 ms and every later one at
# 12.2-12.4 ms — the thread pool's kernels 1.5-2x slower, the GEMMs 9% —
# so a mean over steps 2-8 measured a transient that a training run of
# thousands of steps leaves at once, and the model (whose rates
# kiln calibrate measures in long warm runs) does not predict.
set -u
B=${BUILD:-build}
SMALL_STEPS=${STEPS:-${SMALL_STEPS:-80}} MEDIUM_STEPS=${STEPS:-${MEDIUM_STEPS:-10}} WARM_S=${WARM_S:-0.3} ROUNDS=${ROUNDS:-4}
STEPS=$SMALL_STEPS
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
make -s "$B/kiln" "$B/corpus.txt" "$B/runtime/trainer_main.o" "$B/libkilnrt.a" BUILD="$B" > /dev/null || exit 1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
echo "uptime before: $(uptime)"
calib() { # NP NAME: a profile measured under NP ranks, $tmp/NAME.profile (and NAME-u.profile without sharing)
    if [ "$1" = 1 ]; then "$B/kiln" calibrate --device cpu -o "$tmp/$2.profile" --name "$2" > /dev/null || exit 1
    else mpirun --oversubscribe -np "$1" "$B/kiln" calibrate --device cpu -o "$tmp/$2.profile" --name "$2" > /dev/null || exit 1; fi
    grep -v '^\(cores\|threads\|thread_speedup\) ' "$tmp/$2.profile" > "$tmp/$2-u.profile"
    if [ -n "${KEEP:-}" ]; then cp "$tmp/$2.profile" "$KEEP/$2.${size:-tune}.profile" || exit 1; fi
}
# CALIBRATE=group (the default) calibrates in phase 1 below; once: here, once
# per rank count; the tune check uses the last np 2 profile
nps=""; [ "${CALIBRATE:-group}" = once ] && nps="1 2 4"; [ -n "${TUNE_ONLY:-}" ] && nps=2
for np in $nps; do calib $np cpu$np; done
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
# The steady step from a JSONL log's elapsed seconds (each step's end since
# the first's start), ms: the fastest stretch of K consecutive steps after
# the first step k that ends at WARM_S or later (k >= 1), K the fewest
# steps that last at least 50 ms (the log's elapsed has 1 ms resolution:
# at most 2% of the stretch), the stretch's mean step.  Not the mean of all
# steps: this machine's speed comes and goes in phases of 0.2-1 s that no
# process of ours makes (a quiet 1-rank run of the small model, 300 steps,
# nothing else running, no steal time: 12-13 ms steps for stretches, then
# 15-25 ms; bench/RESULTS.md, 2026-12-03 07:08), and the cost model
# predicts the machine alone.  STEADY=mean: the old measure (the mean after
# the warm-up), for comparison.
steady() {
    grep -o '"elapsed":[0-9.e+]*' "$1" | cut -d: -f2 | awk -v w="$WARM_S" -v how="${STEADY:-fastest}" '{e[NR] = $1} END {
        if (NR < 2) exit; k = 1; while (k < NR - 2 && e[k] < w) k++;
        mean = (e[NR] - e[k]) / (NR - k)
        if (how == "mean") { printf "%.3f", 1000 * mean; exit }
        K = int(0.05 / mean) + 1; if (K > NR - k) K = NR - k
        best = 1e30; for (i = k; i + K <= NR; i++) { s = (e[i + K] - e[i]) / K; if (s < best) best = s }
        printf "%.3f", 1000 * best}'
}
measure() { # NP, trainer: the steady step, ms
    rm -f "$tmp/log.jsonl"
    if [ "$1" = 1 ]; then "$2" --data "$B/corpus.txt" --steps "$STEPS" --log "$tmp/log.jsonl" > /dev/null 2>&1
    else mpirun --oversubscribe -np "$1" "$2" --data "$B/corpus.txt" --steps "$STEPS" --log "$tmp/log.jsonl" < /dev/null > /dev/null 2>&1; fi
    steady "$tmp/log.jsonl"
}
tune_check() {
    local top=${TOP:-4} i=0 n=0 first="" best="" STEPS=$SMALL_STEPS r f meas
    "$B/kiln" tune models/tiny.lua --set layers=4 --gpus 2 --device "$tmp/cpu2.profile" --top "$top" > "$tmp/tune.txt" 2>&1 || { cat "$tmp/tune.txt"; return; }
    echo "tune check: kiln tune models/tiny.lua --set layers=4 --gpus 2 (np 2 profile), its first $top rows run, $ROUNDS rounds interleaved (the fastest)"
    printf '  %3s %10s %10s %6s  %s\n' "#" "pred ms" "meas ms" spread flags
    awk '$1 ~ /^[0-9]+$/ && NF > 15' "$tmp/tune.txt" | head -"$top" > "$tmp/rows"
    local -a tf tp_ ok
    while read -r row; do
        set -- $row
        local tp=$2 dp=$4 cp=$3 pp=$5 sched=$6 m=$7 rc=$9 cpc=${11} pred=${14}
        f=""
        [ "$tp" -gt 1 ] && f="$f --tp $tp"
        [ "$dp" -gt 1 ] && f="$f --dp $dp"
        [ "$cp" -gt 1 ] && f="$f --cp $cp --cp-comm $([ "$cpc" = ag ] && echo allgather || echo p2p)"
        if [ "$pp" -gt 1 ]; then
            case $sched in interleaved/*) f="$f --pp $pp --pp-schedule interleaved --vpp ${sched#*/}";; *) f="$f --pp $pp --pp-schedule $sched";; esac
        fi
        [ "$m" -gt 1 ] && f="$f --micro-batches $m"
        f="$f --recompute $rc"
        tf[$n]=$f tp_[$n]=$pred ok[$n]=1
        rm -f "$tmp/tm.$n"
        # shellcheck disable=SC2086
        "$B/kiln" compile models/tiny.lua --set layers=4 $f -o "$tmp/tt.$n" > /dev/null 2>&1 || ok[$n]=0
        n=$((n + 1))
    done < "$tmp/rows"
    for r in $(seq 1 "$ROUNDS"); do
        for i in $(seq 0 $((n - 1))); do [ "${ok[$i]}" = 1 ] && measure 2 "$tmp/tt.$i" >> "$tmp/tm.$i" && echo >> "$tmp/tm.$i"; done
    done
    for i in $(seq 0 $((n - 1))); do
        if [ "${ok[$i]}" != 1 ]; then echo "  $((i + 1)): compile failed (${tf[$i]})"; continue; fi
        read -r meas spread <<< "$(awk 'NF {if (n == 0 || $1 < lo) lo = $1; if (n == 0 || $1 > hi) hi = $1; n++} END {if (n) printf "%.3f %.2f", lo, hi / lo; else print "? ?"}' "$tmp/tm.$i")"
        printf '  %3s %10s %10s %6s  %s\n' "$((i + 1))" "${tp_[$i]}" "$meas" "$spread" "${tf[$i]}"
        [ -z "$first" ] && first=$meas
        best=$(awk -v a="${best:-1e30}" -v b="$meas" 'BEGIN{print (b < a ? b : a)}')
    done
    awk -v f="$first" -v b="$best" 'BEGIN{printf "  first choice %.3f ms, best measured %.3f ms: %+.1f%% (goal: within 5%%)\n", f, b, 100 * (f / b - 1)}'
}
if [ -n "${TUNE_ONLY:-}" ]; then tune_check; echo "uptime after: $(uptime)"; exit 0; fi
errs=$tmp/errs
# Phase 1: every row's profile, trainer and plan (the calibrations as before:
# at each change of model size or rank count, CALIBRATE=once once per rank count).
nrow=0
for size in ${SIZES:-small medium}; do
    model=$SMALL; [ $size = medium ] && model=$MEDIUM
    last=""
    for c in "${CONFIGS[@]}"; do
        np=${c%%|*} flags=${c#*|}
        if [ "${CALIBRATE:-group}" != once ] && [ "$last" != "$np" ]; then calib $np cpu$np; cp "$tmp/cpu$np.profile" "$tmp/p.$size.$np"; cp "$tmp/cpu$np-u.profile" "$tmp/pu.$size.$np"; fi
        [ -f "$tmp/p.$size.$np" ] || { cp "$tmp/cpu$np.profile" "$tmp/p.$size.$np"; cp "$tmp/cpu$np-u.profile" "$tmp/pu.$size.$np"; }
        last=$np
        i=$nrow
        # shellcheck disable=SC2086
        # the same profile as the plan below: lhs orders by the cost model, so a
        # trainer compiled with another profile can run another order and plan
        # (session 11: six rows' memory off by up to 1 MB before this)
        "$B/kiln" compile $model $flags --device-profile "$tmp/p.$size.$np" -o "$tmp/tr.$i" > /dev/null 2>&1 || { echo "$size $flags: compile failed"; continue; }
        # shellcheck disable=SC2086
        "$B/kiln" plan $model $flags --device-profile "$tmp/p.$size.$np" > "$tmp/plan" 2>&1
        pred=$(sed -n 's/^predicted step \([0-9.]*\) ms.*/\1/p' "$tmp/plan")
        # shellcheck disable=SC2086
        upred=$("$B/kiln" plan $model $flags --device-profile "$tmp/pu.$size.$np" 2>&1 | sed -n 's/^predicted step \([0-9.]*\) ms.*/\1/p')
        pact=$(awk '$1 == "activations" && $5 == "bytes" {print $4}' "$tmp/plan" | sort -g | tail -1)
        R_SIZE[$i]=$size R_NP[$i]=$np R_FLAGS[$i]=$flags R_PRED[$i]=$pred R_UPRED[$i]=$upred R_PACT[$i]=$pact
        R_STEPS[$i]=$SMALL_STEPS; [ $size = medium ] && R_STEPS[$i]=$MEDIUM_STEPS
        nrow=$((nrow + 1))
    done
done
# Phase 2: ROUNDS rounds over every row, round-robin (odd rounds forward,
# even rounds backward), each run's steady step, activation high-water
# mark and load appended to $tmp/m.ROW.
run_row() { # ROW: one run of that row's trainer
    local i=$1 np=${R_NP[$1]} st=${R_STEPS[$1]} load meas mact
    rm -f "$tmp/log.jsonl" "$tmp/err"
    load=$(cut -d' ' -f1 /proc/loadavg)
    if [ "$np" = 1 ]; then KILN_MEASURE_PEAK=1 "$tmp/tr.$i" --data "$B/corpus.txt" --steps "$st" --log "$tmp/log.jsonl" > /dev/null 2> "$tmp/err"
    else KILN_MEASURE_PEAK=1 mpirun --oversubscribe -x KILN_MEASURE_PEAK -np "$np" "$tmp/tr.$i" --data "$B/corpus.txt" --steps "$st" --log "$tmp/log.jsonl" < /dev/null > /dev/null 2> "$tmp/err"; fi
    meas=$(steady "$tmp/log.jsonl") # the steady step (above)
    mact=$(sed -n 's/.*act high-water mark \([0-9]*\) bytes.*/\1/p' "$tmp/err" | sort -g | tail -1)
    echo "${meas:-?} ${mact:-?} $load" >> "$tmp/m.$i"
}
for r in $(seq 1 "$ROUNDS"); do
    t0=$(date +%s)
    if [ $((r % 2)) = 1 ]; then order=$(seq 0 $((nrow - 1))); else order=$(seq $((nrow - 1)) -1 0); fi
    for i in $order; do run_row "$i"; done
    echo "round $r: $(( $(date +%s) - t0 )) s, load $(cut -d' ' -f1-3 /proc/loadavg)"
done
# Phase 3: per row the fastest round's steady step (the machine alone: the
# slow phases are one-sided), the spread (slowest over fastest round), the
# largest activation high-water mark of the rounds (equal in each: the
# plan is static) and the fastest round's load.
printf '%-7s %3s %-46s %10s %10s %8s %6s %12s %12s %5s %10s %8s\n' model np flags "pred ms" "meas ms" "error" spread "pred act B" "meas act B" load "unshared" "error"
for i in $(seq 0 $((nrow - 1))); do
    read -r meas spread load <<< "$(awk '$1 != "?" {if (n == 0 || $1 < lo) {lo = $1; ld = $3} if (n == 0 || $1 > hi) hi = $1; n++}
        END {if (n) printf "%.3f %.2f %s", lo, hi / lo, ld; else print "? ? ?"}' "$tmp/m.$i")"
    mact=$(awk '$2 != "?" {print $2}' "$tmp/m.$i" | sort -g | tail -1)
    pred=${R_PRED[$i]} upred=${R_UPRED[$i]}
    err=$(awk -v p="$pred" -v m="$meas" 'BEGIN{if (m > 0 && p > 0) printf "%+.1f%%", 100 * (p / m - 1); else print "?"}')
    uerr=$(awk -v p="$upred" -v m="$meas" 'BEGIN{if (m > 0 && p > 0) printf "%+.1f%%", 100 * (p / m - 1); else print "?"}')
    [ "$err" != "?" ] && echo "${err%\%}" >> "$errs"
    [ "$uerr" != "?" ] && echo "${uerr%\%}" >> "$errs.u"
    printf '%-7s %3s %-46s %10s %10s %8s %6s %12s %12s %5s %10s %8s\n' "${R_SIZE[$i]}" "${R_NP[$i]}" "${R_FLAGS[$i]:-(defaults)}" "$pred" "$meas" "$err" "$spread" "${R_PACT[$i]}" "$mact" "$load" "$upred" "$uerr"
    if [ -n "${KEEP:-}" ]; then echo "${R_SIZE[$i]} ${R_NP[$i]} ${R_FLAGS[$i]:-(defaults)}: $(cut -d' ' -f1 "$tmp/m.$i" | tr '\n' ' ')" >> "$KEEP/rounds.txt"; fi
done
summary() { awk '{print ($1 < 0 ? -$1 : $1)}' "$1" | sort -g | awk -v w="$2" '{v[NR] = $1} END {n = NR; printf "time |error|%s: median %.1f%%, max %.1f%% over %d configurations\n", w, (n % 2 ? v[(n+1)/2] : (v[n/2] + v[n/2+1]) / 2), v[n], n}'; }
summary "$errs" ""
summary "$errs.u" " unshared (the same profiles without cores)"
[ -z "${NO_TUNE:-}" ] && tune_check
echo "uptime after: $(uptime)"
