#!/usr/bin/env bash
# --tp-chunks through the compiled CPU trainer under mpirun (issue 22): tiny
# GPT at --tp 2 with the MLP's sp collectives cut into 2 token chunks
# gives the losses of --tp-chunks 1 over 5 steps (relative 1e-5: f32, the
# chunked program sums the weight gradients in another order), under
# --schedule lhs (the chunks' collectives on tp's own comm stream).
. "$(dirname "$0")/lib.sh"
need_mpi
M="models/tiny.lua --set layers=1 --steps 5 --tp 2"
for k in 1 2; do "$K" compile $M --tp-chunks $k -o "$tmp/k$k" > /dev/null || notok "compile --tp-chunks $k"; done
for k in 1 2; do $MPI -np 2 "$tmp/k$k" $D --log "$tmp/g$k" > /dev/null 2>"$tmp/err$k"; done
check "mpirun -np 2 --tp 2 --tp-chunks 2 == --tp-chunks 1 over 5 steps (worst $(worst "$tmp/g2" "$tmp/g1"))" "same $tmp/g2 $tmp/g1 5"
# the comparison can fail: a run with another lr
$MPI -np 2 "$tmp/k1" $D --lr 0.0031 --log "$tmp/gx" > /dev/null 2>&1
check "the comparison fails a different run (worst $(worst "$tmp/gx" "$tmp/g1"))" "! same $tmp/gx $tmp/g1 5"
