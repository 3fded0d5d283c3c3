#!/usr/bin/env bash
# Data parallel through the compiled trainer under mpirun: 4 ranks (distributed
# optimizer, 2 micro-batches) and 2 ranks (all-reduce) give the 1-rank loss
# curve over 30 steps (relative 1e-5: f32, only the summation order differs);
# a checkpoint written at dp 2 resumes at dp 4 and at dp 1 with the losses of
# continuing at dp 2 (resharding on load); and a 4-rank trainer launched on 3
# processes is refused with one line.
. "$(dirname "$0")/lib.sh"
need_mpi
M="models/tiny.lua --set layers=1 --steps 30 --weight-decay 0.1 --bucket-mb 0.05"
"$K" compile $M -o "$tmp/dp1" > /dev/null
"$K" compile $M --dp 2 --zero 0 -o "$tmp/dp2z0" > /dev/null
"$K" compile $M --dp 2 -o "$tmp/dp2" > /dev/null
"$K" compile $M --dp 4 --micro-batches 2 -o "$tmp/dp4" > /dev/null
"$tmp/dp1" $D --log "$tmp/l1" > /dev/null
$MPI -np 4 "$tmp/dp4" $D --log "$tmp/l4" > /dev/null 2>"$tmp/err4"
check "mpirun -np 4 (zero 1, 2 micro-batches) == 1 rank over 30 steps (worst $(worst "$tmp/l4" "$tmp/l1"))" "same $tmp/l4 $tmp/l1 30"
$MPI -np 2 "$tmp/dp2z0" $D --log "$tmp/l2" > /dev/null 2>&1
check "mpirun -np 2 (zero 0) == 1 rank over 30 steps (worst $(worst "$tmp/l2" "$tmp/l1"))" "same $tmp/l2 $tmp/l1 30"

# resume at another dp: 20 steps at dp 2 straight vs 10 at dp 2 + 10 at dp 4 / dp 1
$MPI -np 2 "$tmp/dp2" $D --steps 20 --log "$tmp/s2" > /dev/null 2>&1
$MPI -np 2 "$tmp/dp2" $D --steps 10 --schedule-steps 20 --ckpt "$tmp/ck" --log "$tmp/h2" > /dev/null 2>&1
$MPI -np 4 "$tmp/dp4" $D --steps 20 --resume "$tmp/ck" --ckpt "$tmp/ck_r4" --log "$tmp/r4" > /dev/null 2>&1
"$tmp/dp1" $D --steps 20 --resume "$tmp/ck" --ckpt "$tmp/ck_r1" --log "$tmp/r1" > /dev/null 2>&1
tail -10 "$tmp/s2" > "$tmp/s2tail"
check "dp 2 checkpoint resumed at dp 4 == continuing at dp 2 (worst $(worst "$tmp/r4" "$tmp/s2tail"))" "same $tmp/r4 $tmp/s2tail 10"
check "dp 2 checkpoint resumed at dp 1 == continuing at dp 2 (worst $(worst "$tmp/r1" "$tmp/s2tail"))" "same $tmp/r1 $tmp/s2tail 10"

# an odd shape (vocab 257, dim 63, 3 heads, seq 24): flats padded, shards of uneven params
ODD="models/tiny.lua --set layers=1 --steps 30 --set vocab=257 --set dim=63 --set heads=3 --set seq=24 --weight-decay 0.1 --bucket-mb 0.01"
"$K" compile $ODD -o "$tmp/odd1" > /dev/null
"$K" compile $ODD --dp 2 --micro-batches 2 -o "$tmp/odd2" > /dev/null
"$tmp/odd1" $D --log "$tmp/o1" > /dev/null
$MPI -np 2 "$tmp/odd2" $D --log "$tmp/o2" > /dev/null 2>&1
check "odd shape: mpirun -np 2 (zero 1, 2 micro-batches) == 1 rank over 30 steps (worst $(worst "$tmp/o2" "$tmp/o1"))" "same $tmp/o2 $tmp/o1 30"

err=$($MPI -np 3 "$tmp/dp4" $D --steps 2 2>&1 >/dev/null); rc=$?
check "a 4-rank trainer on 3 processes is refused (rc=$rc): $(printf '%s' "$err" | grep -m1 'compiled for' || printf '%s' "$err" | head -c 400 | tr '\n' ' ')" \
    "[ $rc != 0 ] && printf '%s' \"\$err\" | grep -q 'compiled for 4 ranks'"
