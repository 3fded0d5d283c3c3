#!/usr/bin/env bash
# Activation offload on the CPU runtime (issue 19; docs/offload.md): the
# compiled trainer runs offload's copies as real memcpys on the copy streams'
# worker threads between the act space and a separate host arena, so a copy
# the events do not order races on memory memplan has already reused.
#
# - `--offload all` and `auto` train bit-identically to `--offload none`
#   (every step's loss and grad-norm, as printed to the log, equal as text):
#   tiny GPT and tiny Llama on 1 rank, GPT `--pp 4 --vpp 2` interleaved and
#   `--pp 2 --cp 2` under `mpirun -np 4`; the offload runs with the runtime's
#   copy check on (KILN_CHECK_COPIES=1).
# - The act space's high-water mark measured by the runtime
#   (KILN_MEASURE_PEAK=1: the arena starts 0xff, the highest byte written
#   after the steps) equals the plan's act arena (kiln plan, rounded up to the
#   arena's 64 bytes) on every rank of a --pp 4 run, with and without offload,
#   and falls with offload on the first stages; the numbers are printed.
#   Also a paced program (auto with the cpu profile's copies slowed to 0.2
#   GB/s: the warm-up's compute waits for its d2h copies, offload.c): its
#   mark equals its plan, which differs from the unpaced plan, and its 3
#   steps equal none's.
# - A planted missing event (KILN_TEST_DROP_COPY_WAIT=1: the compute stream's
#   first wait per step for a reload's event is dropped; copies slowed by
#   KILN_COPY_DELAY_US) fails the step through the copy check; the same run
#   without the plant passes (the control).
. "$(dirname "$0")/lib.sh"
need_mpi
MIN="--offload-min-bytes 1"
GPT4="models/tiny.lua --set layers=4 --steps 20"
GPT8="models/tiny.lua --set layers=8 --set dim=32 --set heads=2 --steps 20"
LLAMA="models/llama.lua --set vocab=256 --set dim=64 --set layers=2 --set heads=4 --set kv_heads=2 --set ffn=128 --set seq=32 --set batch=8 --steps 20"
comp() { # out flags...
    local o=$1; shift
    "$K" compile "$@" -o "$tmp/$o" > /dev/null 2> "$tmp/$o.err" || echo "# compile $o: $(head -1 "$tmp/$o.err")"
}
# step, loss and grad-norm of every log line, as the trainer printed them
curve() { sed 's/.*"step":\([0-9]*\),"loss":\([^,]*\),.*"grad_norm":\([^,]*\),.*/\1 \2 \3/' "$1"; }
same() { [ "$(wc -l < "$1")" = 20 ] && [ "$(curve "$1")" = "$(curve "$2")" ]; }
# the host space's bytes of a run's ranks (the runtime's line at its end), summed
hostb() { sed -n 's/.*host space \([0-9]*\)).*/\1/p' "$1" | awk '{s += $1} END {print s + 0}'; }
run1() { KILN_CHECK_COPIES=1 KILN_MEASURE_PEAK=1 "$tmp/$1" $D --log "$tmp/$1.log" > /dev/null 2> "$tmp/$1.out"; }
run4() { $MPI -np 4 -x KILN_CHECK_COPIES=1 -x KILN_MEASURE_PEAK=1 "$tmp/$1" $D --log "$tmp/$1.log" > /dev/null 2> "$tmp/$1.out"; }

# ---- bit-identical training ----
# (1 rank, auto on the h200 profile's times: with the cpu profile's its few
# copies lowered the peak by under 1%, and offload.c's peak_guard keeps
# such a rank's program as it is)
H200=""
for pol in none all auto; do
    [ $pol = auto ] && H200="--device-profile h200"
    comp g$pol $GPT4 --offload $pol $MIN $H200
    comp l$pol $LLAMA --offload $pol $MIN $H200
    comp v$pol $GPT8 --pp 4 --vpp 2 --micro-batches 4 --pp-schedule interleaved --offload $pol $MIN
    comp c$pol models/tiny.lua --set layers=4 --steps 20 --pp 2 --cp 2 --cp-comm p2p --micro-batches 2 --offload $pol $MIN
done
for m in g l; do
    for pol in none all auto; do run1 $m$pol; done
    for pol in all auto; do
        check "$m: 1 rank, --offload $pol == none, 20 steps bit for bit ($(grep -c . "$tmp/${m}none.log") lines; host space $(hostb "$tmp/$m$pol.out") bytes)" \
            "same $tmp/$m$pol.log $tmp/${m}none.log && [ $(hostb "$tmp/$m$pol.out") -gt 0 ]"
    done
done
for m in v c; do
    what="--pp 4 --vpp 2 interleaved"; [ $m = c ] && what="--pp 2 --cp 2"
    for pol in none all auto; do run4 $m$pol; done
    for pol in all auto; do
        check "GPT $what, mpirun -np 4, --offload $pol == none bit for bit (host space $(hostb "$tmp/$m$pol.out") bytes over the ranks)" \
            "same $tmp/$m$pol.log $tmp/${m}none.log && [ $(hostb "$tmp/$m$pol.out") -gt 0 ]"
    done
done
# the comparison can fail: another seed is another curve
"$tmp/gall" $D --seed 7 --log "$tmp/seed.log" > /dev/null 2>&1
check "the comparison tells curves apart (--seed 7)" "! same $tmp/seed.log $tmp/gnone.log"

# ---- the measured act high-water mark against the plan ----
measured() { # rank-ordered measured marks of a run's stderr
    sed -n 's/^kiln runtime: rank \([0-9]*\) stage [0-9]*: act high-water mark \([0-9]*\) bytes.*/\1 \2/p' "$1" | sort -n | awk '{print int(($2 + 63) / 64) * 64}'
}
P4="$GPT4 --pp 4 --micro-batches 8"
for pol in none all; do
    comp p$pol $P4 --offload $pol $MIN
    $MPI -np 4 -x KILN_MEASURE_PEAK=1 -x KILN_CHECK_COPIES=1 "$tmp/p$pol" $D --steps 3 > /dev/null 2> "$tmp/p$pol.out"
    "$K" plan $P4 --offload $pol $MIN > "$tmp/p$pol.plan" 2>&1
done
# kiln plan's per-stage act arena: the "activations" lines, stage order
plan_act() { awk '/^  activations/ {for (i = 1; i <= NF; i++) if ($i == "bytes") {print $(i-1); break}}' "$1"; }
for pol in none all; do
    m=$(measured "$tmp/p$pol.out" | tr '\n' ' '); p=$(plan_act "$tmp/p$pol.plan" | head -4 | tr '\n' ' ')
    check "--pp 4 --offload $pol: measured act high-water per rank [$m] == the plan's act arena per stage [$p]" \
        "[ -n \"$m\" ] && [ \"$m\" = \"$p\" ]"
done
# a paced program (offload.c: the compute waits for d2h copies in the
# warm-up; the cpu profile with copies slowed to 0.2 GB/s makes it pace):
# the same curve as none, the measured mark equals its plan, and the plan
# differs from the unpaced one (KILN_TEST_OFFLOAD_NO_PACE)
sed 's/^h2d_bw .*/h2d_bw 2e8/; s/^d2h_bw .*/d2h_bw 2e8/' profiles/cpu.profile > "$tmp/slow.profile"
PACED="$P4 --offload auto --device-profile $tmp/slow.profile $MIN"
comp ppace $PACED
$MPI -np 4 -x KILN_MEASURE_PEAK=1 -x KILN_CHECK_COPIES=1 "$tmp/ppace" $D --steps 3 --log "$tmp/ppace.log" > /dev/null 2> "$tmp/ppace.out"
$MPI -np 4 "$tmp/pnone" $D --steps 3 --log "$tmp/pnone3.log" > /dev/null 2>&1
"$K" plan $PACED > "$tmp/ppace.plan" 2>&1
KILN_TEST_OFFLOAD_NO_PACE=1 "$K" plan $PACED > "$tmp/pnopace.plan" 2>&1
m=$(measured "$tmp/ppace.out" | tr '\n' ' '); p=$(plan_act "$tmp/ppace.plan" | head -4 | tr '\n' ' '); q=$(plan_act "$tmp/pnopace.plan" | head -4 | tr '\n' ' ')
check "--pp 4 auto, paced (copies at 0.2 GB/s): measured act high-water [$m] == plan [$p], unpaced plan [$q] differs, 3 steps == none" \
    "[ -n \"$m\" ] && [ \"$m\" = \"$p\" ] && [ \"$p\" != \"$q\" ] && [ \"\$(curve $tmp/ppace.log)\" = \"\$(curve $tmp/pnone3.log)\" ] && [ \$(grep -c . $tmp/ppace.log) = 3 ]"
mn=($(measured "$tmp/pnone.out")); ma=($(measured "$tmp/pall.out"))
check "--pp 4: offload lowers the measured act high-water on stages 0-2 (none ${mn[*]:-?} -> all ${ma[*]:-?} bytes), not on the last" \
    "[ ${#mn[@]} = 4 ] && [ ${#ma[@]} = 4 ] && [ ${ma[0]} -lt ${mn[0]} ] && [ ${ma[1]} -lt ${mn[1]} ] && [ ${ma[2]} -lt ${mn[2]} ] && [ ${ma[3]} = ${mn[3]} ]"

# ---- a planted missing event on the copy stream ----
KILN_CHECK_COPIES=1 KILN_COPY_DELAY_US=3000 "$tmp/gall" $D --steps 3 > /dev/null 2> "$tmp/ctl.out"
say $? "control: copies slowed to 3 ms each, the check on: the run passes"
KILN_CHECK_COPIES=1 KILN_COPY_DELAY_US=3000 KILN_TEST_DROP_COPY_WAIT=1 "$tmp/gall" $D --steps 3 > /dev/null 2> "$tmp/bug.out"
rc=$?
check "planted: the compute stream's wait for a reload dropped: the step fails (rc $rc: $(head -1 "$tmp/bug.out" | cut -c1-160))" \
    "[ $rc != 0 ] && grep -q 'copy check: .* had not finished' $tmp/bug.out"
$MPI -np 4 -x KILN_CHECK_COPIES=1 -x KILN_COPY_DELAY_US=3000 -x KILN_TEST_DROP_COPY_WAIT=1000 "$tmp/pall" $D --steps 2 > /dev/null 2> "$tmp/bug4.out"
rc=$?
check "planted under mpirun -np 4 (--pp 4; every such wait dropped): a rank's step fails (rc $rc)" "[ $rc != 0 ] && grep -q 'copy check' $tmp/bug4.out"
echo "1..$n"
