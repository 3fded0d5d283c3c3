#!/usr/bin/env bash
# kiln tune (issue 21): the fast path (one probe program per per-rank
# shape, composed) against the whole program compiled and simulated (kiln
# tune --check) on small configurations: step within 7%, memory within 11%
# (what the composition leaves today: the data-parallel collectives' and
# the buffers' overlap taken from formulas, not from the program; measured
# worst 5.8% and 8.8%); the table is ranked by the
# predicted step; the best's `kiln compile` command compiles; memory
# pruning, tp searched (and refused where the heads do not divide) and bad
# flags; the verification by the exact plan on a slice (tune_verify): its
# peak is the whole program's, and it drops a first choice that does not
# fit.
. "$(dirname "$0")/lib.sh"

# the worst |error| of the check's rows: column 4 (time) or 7 (memory)
worst() { awk -v c="$2" '/^check:/{on=1; next} on && $1 ~ /^[0-9]+$/ {e=$c; sub("%","",e); if (e<0) e=-e; if (e>w) w=e} END{print w+0}' "$1"; }

run_check() { # NAME MEM ARGS... : --check over the shown rows; MEM 0: time only
    local name=$1 mem=$2
    shift 2
    "$K" tune "$@" --device cpu --top 6 --check 6 --verify 0 > "$tmp/$name.txt" 2>&1
    local rc=$? wt wm
    wt=$(worst "$tmp/$name.txt" 4) wm=$(worst "$tmp/$name.txt" 7)
    check "$name: fast path within 7% of the full simulation's step (worst $wt%)" "[ $rc = 0 ] && awk 'BEGIN{exit !($wt <= 7)}'"
    [ "$mem" = 1 ] && check "$name: and within 11% of its memory (worst $wm%)" "[ $rc = 0 ] && awk 'BEGIN{exit !($wm <= 11)}'"
}
G="models/gpt2.lua --set layers=4 --set dim=128 --set heads=4"
run_check "dp, cp, recompute, 4 ranks" 1 $G --gpus 4 --global-batch 8 --seq 256 --pp 1
run_check "pp 2: every schedule" 1 $G --gpus 2 --global-batch 8 --seq 256 --pp 2
run_check "pp 2 x dp 2, 1f1b" 1 $G --gpus 4 --global-batch 8 --seq 256 --pp 2 --pp-schedule 1f1b
run_check "llama, cp 2" 1 models/llama.lua --set layers=4 --gpus 4 --global-batch 4 --seq 256 --cp 2
run_check "tp 2 x dp 2" 1 $G --gpus 4 --global-batch 8 --seq 256 --tp 2 --pp 1

# the exact plan on a slice (tune_verify: all the layers, m' micro-batches)
# against the whole program (--check, m micro-batches): the largest rank's
# memplan peak within TUNE_VERIFY_MARGIN (0.5%) or above it, so a row that
# fits by the slice fits whole; zb-v, interleaved, zb-h1 and offload all
# on a GPT whose activations are big enough to offload (>= 1 MiB)
V="models/gpt2.lua --set layers=8 --set dim=512 --set heads=8"
vcheck() { # NAME ARGS...
    local name=$1
    shift
    local out ex full
    out=$("$K" tune $V --gpus 4 --global-batch 128 --seq 1024 --device a100 --tp 1 --cp 1 --top 1 --check 1 "$@" 2>&1)
    ex=$(printf '%s\n' "$out" | awk '/^verify:/{on=1; next} /^verified:/{on=0} on && $NF == "fits" {print $(NF-2); exit}')
    full=$(printf '%s\n' "$out" | awk '/^check:/{on=1; next} on && $1 == 1 {print $6; exit}')
    check "$name: the slice's exact peak $ex GiB is the whole program's $full GiB (>= 99.5% of it)" \
        "[ -n '$ex' ] && [ -n '$full' ] && awk 'BEGIN{exit !($ex >= 0.995 * $full)}'"
}
vcheck "zb-v pp 4, m 32 (slice m' 16)" --pp 4 --pp-schedule zb-v --micro-batches 32 --recompute none
vcheck "interleaved pp 4, m 32" --pp 4 --pp-schedule interleaved --micro-batches 32 --recompute none
vcheck "zb-h1 pp 4, m 32" --pp 4 --pp-schedule zb-h1 --micro-batches 32 --recompute gemm-last
# with offload the slice is the whole program (m' = m: what the copies
# free depends on their queue, which grows with m; at m' 16 this row read
# 1.73 GiB, whole it is the peak without offload, 1.95 GiB): its row is
# verified at m' 32 and dropped over a 1.9 GiB budget
out=$("$K" tune $V --gpus 4 --global-batch 128 --seq 1024 --device a100 --tp 1 --cp 1 --top 1 --pp 4 --pp-schedule zb-v --micro-batches 32 --recompute none --memory 1.9 2>&1)
row=$(printf '%s\n' "$out" | awk '/^verify:/{on=1; next} /^verified:/{on=0} on && $10 == "all" {print; exit}')
check "offload all is verified on the whole program and dropped over 1.9 GiB: $row" \
    "printf '%s\n' \"\$row\" | awk '{exit !(\$7 == 32 && \$11 == 32 && /over/)}'"

# while no row fits, the walk goes past N + 3 rows (up to 3(N + 3)): at
# 1.1 GiB the first four rows tried are over by the exact plan (the fast
# path's memory low by a quarter here) and the fifth fits, which the walk
# of N + 3 rows never reached
out=$("$K" tune $V --gpus 4 --global-batch 128 --seq 1024 --device a100 --tp 1 --cp 1 --top 1 --pp 4 --memory 1.1 2>&1)
tried=$(printf '%s\n' "$out" | awk '/^verify:/{on=1; next} /^verified:/{on=0} on && $1 ~ /^[0-9]+$/' )
check "--memory 1.1: $(printf '%s\n' "$tried" | grep -c 'over: dropped') rows over, then $(printf '%s\n' "$tried" | awk '/fits$/ {print "row " $1 " fits"}')" \
    "printf '%s\n' \"\$tried\" | awk '/over: dropped/ {over++} /fits\$/ && !fit {fit = \$1} END {exit !(over >= 4 && fit > 4)}'"

# the fast path's per-rank memory (--check's "per rank" line): the layers
# are cut as pp.c cuts them (its FLOP balance, the head on the last chunk;
# before, by forward time, rank 2 of 1f1b was 54% under), so the middle
# ranks (no embedding, no head) are within 5%;
# the end ranks are the known gap (docs/tune.md)
for sc in 1f1b zb-h1; do
    out=$("$K" tune $V --gpus 4 --global-batch 128 --seq 1024 --device a100 --tp 1 --cp 1 --top 1 --check 1 --verify 0 --pp 4 \
        --pp-schedule $sc --micro-batches 32 --recompute none 2>&1)
    ranks=$(printf '%s\n' "$out" | sed -n 's/^ *per rank MiB, fast \/ full: //p')
    verdict=$(printf '%s\n' "$ranks" | tr ' ' '\n' | awk -F/ 'NR == 2 || NR == 3 {n++; e = $1 / $2 - 1; if (e < -0.05 || e > 0.05) bad = 1} END{print (n == 2 && !bad) ? "ok" : "bad"}')
    check "$sc p 4: the fast path's ranks 1 and 2 within 5% of the whole program's ($ranks)" "[ '$verdict' = ok ]"
done

# a budget the fast path's first choice does not fit by the exact plan (cp 2
# x dp 2: its memory there is 10% under the whole program's): --verify 0 keeps it;
# the default verification drops it and the first row fits whole
vbest() { "$K" tune $V --gpus 4 --global-batch 32 --seq 1024 --device a100 --memory 1.1 --tp 1 --pp 1 --top 1 --check 1 "$@" 2>&1 | awk '/^check:/{on=1; next} on && $1 == 1 {print $6; exit}'; }
old=$(vbest --verify 0) new=$(vbest)
check "unverified, the first row needs $old GiB of 1.1 (over)" "[ -n '$old' ] && awk 'BEGIN{exit !($old > 1.1)}'"
check "verified, the first row needs $new GiB of 1.1 (fits)" "[ -n '$new' ] && awk 'BEGIN{exit !($new <= 1.1)}'"

out=$("$K" tune $G --gpus 4 --global-batch 8 --seq 256 --device cpu --top 50 --verify 0 2>&1)
printf '%s\n' "$out" | awk '$1 ~ /^[0-9]+$/ && NF > 15 {print $14}' > "$tmp/steps"
check "the table is ranked by predicted step ($(wc -l < "$tmp/steps") rows)" "[ -s '$tmp/steps' ] && sort -g '$tmp/steps' | cmp -s - '$tmp/steps'"
tps=$(printf '%s\n' "$out" | awk '$1 ~ /^[0-9]+$/ && NF > 15 {print $2}' | sort -u | tr '\n' ' ')
check "tp is searched: the table's tp values ($tps) include 2 and 4" "printf '%s\n' '$tps' | grep -q '2 4'"
out2=$("$K" tune models/gpt2.lua --set layers=4 --set dim=128 --set heads=2 --gpus 4 --global-batch 8 --seq 256 --device cpu --top 3 --pp 1 --cp 1 --recompute none 2>&1)
check "tp 4 over 2 heads is refused, named in the note" "printf '%s\n' \"\$out2\" | grep -q '^note: tp 4: heads 2 and kv heads 2 must be multiples of tp'"
best=$(printf '%s\n' "$out" | sed -n 's/^best: kiln compile //p')
check "the best's command is printed: $best" "[ -n '$best' ]"
"$K" plan ${best% --target*} > "$tmp/plan.txt" 2>&1
say $? "kiln plan accepts the best's flags"

# the lower bound (tune_lower_bound: the parameter state alone over the
# budget, spread over the pp ranks) prunes without a probe, and the memory
# is priced before the pipeline simulation: the same fit counts and the same
# ranked table as the exhaustive search (KILN_TUNE_EXHAUSTIVE=1: every
# candidate probed and simulated), with fewer probes
LB="$G --gpus 4 --global-batch 8 --seq 256 --device cpu --memory 0.07 --verify 0 --top 100"
"$K" tune $LB > "$tmp/lb.txt" 2>&1
KILN_TUNE_EXHAUSTIVE=1 "$K" tune $LB > "$tmp/lbx.txt" 2>&1
pr=$(sed -n 's/^of those over: \([0-9]*\) by their parameter state.*/\1/p' "$tmp/lb.txt")
np=$(sed -n 's/^searched.*(\([0-9]*\) probes.*: \([0-9]*\) fit, \([0-9]*\) do not fit.*/\1 \2 \3/p' "$tmp/lb.txt" "$tmp/lbx.txt" | tr '\n' ' ')
check "the bound prunes $pr candidates unprobed: probes, fit, over (bound, exhaustive) $np" \
    "[ -n '$pr' ] && [ '$pr' -gt 0 ] && (set -- $np; [ \$# = 6 ] && [ \$1 -lt \$4 ] && [ \$2 = \$5 ] && [ \$3 = \$6 ] && [ \$2 -gt 0 ])"
check "and the same ranked table as the exhaustive search" \
    "cmp -s <(grep -v '^searched\|^of those' '$tmp/lb.txt') <(grep -v '^searched\|^of those' '$tmp/lbx.txt')"

# memory pruning: a budget below every candidate leaves nothing
out=$("$K" tune $G --gpus 2 --global-batch 8 --seq 256 --device cpu --memory 0.0001 2>&1)
rc=$?
check "nothing fits 0.0001 GiB: one line, status 1" "[ $rc = 1 ] && printf '%s\n' \"\$out\" | tail -1 | grep -q '^kiln: tune: no configuration fits'"
out=$("$K" tune $G --gpus 2 --global-batch 8 --seq 256 --device cpu --memory 0.3 2>&1)
fits=$(printf '%s\n' "$out" | sed -n 's/^searched .*: \([0-9]*\) fit, \([0-9]*\) do not fit.*/\1 \2/p')
check "a budget between prunes some and keeps some ($fits)" "(set -- $fits; [ \"\$1\" -gt 0 ] && [ \"\$2\" -gt 0 ])"
mem_ok=$(printf '%s\n' "$out" | awk '/^ +# +tp/{on=1; next} on && $1 ~ /^[0-9]+$/ && NF > 15 && $NF > 0.3 {bad=1} END{print bad+0}')
check "every kept row fits the budget" "[ $mem_ok = 0 ]"

# kiln plan --device-profile: the predicted step, and per stage a split that adds up to it
"$K" plan $G --set batch=8 --set seq=256 --pp 2 --micro-batches 4 --dp 2 --device-profile cpu > "$tmp/pplan.txt" 2>&1
say $? "kiln plan --pp 2 --dp 2 --device-profile cpu runs"
step=$(sed -n 's/^predicted step \([0-9.]*\) ms on cpu, MFU [0-9.]*%.*/\1/p' "$tmp/pplan.txt")
rows=$(awk -v s="$step" '/^  stage  compute ms/{on=1; next} /^  exposed/{on=0} on && $1 ~ /^[0-9]+$/ {n++; d = $2 + $3 + $4 + $5 - s; if (d < 0) d = -d; if (d > 0.002 || $6 != s) bad = 1} END{print (bad ? "bad" : n + 0)}' "$tmp/pplan.txt")
check "its 2 stages' compute + comm + bubble + copy = the step $step ms" "[ -n '$step' ] && [ '$rows' = 2 ]"
"$K" plan $G --set batch=8 --set seq=256 > "$tmp/noprof.txt" 2>&1
check "without --device-profile kiln plan predicts nothing" "! grep -q '^predicted step' '$tmp/noprof.txt'"

bad() { # DESCRIPTION WANT ARGS...
    local d=$1 want=$2
    shift 2
    local out rc
    out=$("$K" tune "$@" 2>&1)
    rc=$?
    check "$d: $out" "[ $rc = 1 ] && [ \"\$(printf '%s\n' \"\$out\" | wc -l)\" = 1 ] && [ \"\$out\" = \"\$want\" ]"
}
bad "no --gpus" "kiln: tune: --gpus N is required" models/tiny.lua --device cpu
bad "no --device" "kiln: tune: --device PROFILE is required (cpu, h100, h200, a100 or a .profile file)" models/tiny.lua --gpus 2
bad "a bad --gpus" 'kiln: --gpus: expected a whole number in 1..1048576, got "0"' models/tiny.lua --gpus 0 --device cpu
bad "an unknown profile" 'kiln: --device: no device profile named "v100" (shipped: cpu, h100-sxm, h200-sxm, a100-80g; or give a path)' models/tiny.lua --gpus 2 --device v100
bad "--set batch" "kiln: --set batch: use --global-batch / --seq with kiln tune" models/tiny.lua --gpus 2 --device cpu --set batch=4
bad "a bad --verify" 'kiln: --verify: expected a whole number in 0..100, got "-1"' models/tiny.lua --gpus 2 --device cpu --verify -1
bad "a bad --memory" 'kiln: --memory: expected GiB, a positive number, got "-1"' models/tiny.lua --gpus 2 --device cpu --memory -1
echo "1..$n"
