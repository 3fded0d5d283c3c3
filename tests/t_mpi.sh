#!/usr/bin/env bash
# The multi-rank CPU runtime under mpirun (Open MPI), on the hand-built
# programs of tests/mpi_comm.c: collectives over dp, cp and dp+cp groups
# (whole and in pieces) against values computed from the rank ids, a
# one-rank program that never touches MPI, sharded checkpoints (saved at
# dp 4, loaded at dp 2 / over dp+cp / by a --zero 0 program), and the
# trainer: 4 ranks give the 1-rank loss curve of the same global batch,
# a run resumes at another dp, --val and --trace per rank, a wrong process
# count is one line and exit 1, and a rank that SIGKILLs itself ends the
# job (no hang).  Params without storage, living in a param shard
# (prefix "", the layout whose step all-gathers the params at its start):
# init, checkpoints identical to the stored-params program's at dp 4, 1, 2
# and loadable across them both ways, --init; the trainer's losses equal
# the stored layout's bit for bit, and checkpoints resume across layouts.
# Ring attention's send/recv (p2p): rings both ways, to self, 8 MiB
# messages that would deadlock a blocking send, in pieces, bytes counted.
# Context parallel (train-cp): strided collectives and rank iotas in coll;
# dp x cp trainers in both layouts give the 1-rank losses (the trainer's cp
# columns agree with the positions of rtk_iota_rank), and a table that
# disagrees with the positions gives other losses.
# Loss comparisons: relative 1e-5 (the ranks sum partial losses and
# gradients in another order than one rank does); bit for bit where the
# arithmetic is the same.
. "$(dirname "$0")/lib.sh"
M=$B/tests/mpi_comm
if ! command -v mpirun > /dev/null || [ ! -x "$M" ]; then notok "mpirun and $M are needed (make deps all)"; exit 1; fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Open MPI's own allocations (MPI_Init, its plugins) read as leaks to a
# sanitizer build's LeakSanitizer: processes that initialise MPI run without
# leak checks (ASan and UBSan stay on); the one-rank runs keep them.
nolsan() { ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" "$@"; }
mpi() { nolsan timeout 90 mpirun -np "$1" --oversubscribe "${@:2}"; }

# PASS/FAIL lines of mpi_comm -> TAP; a crash or no output is a failure
checks() { # label, command...
    local label=$1; shift
    "$@" > "$tmp/out" 2> "$tmp/err"
    local rc=$? seen=0
    while read -r verdict name; do
        case $verdict in
        PASS) ok "$label$name"; seen=1 ;;
        FAIL) notok "$label$name"; seen=1 ;;
        esac
    done < "$tmp/out"
    if [ $rc != 0 ] || [ $seen = 0 ]; then notok "${label}mpi_comm exited $rc: $(head -3 "$tmp/err" | tr '\n' ' ')"; fi
}

checks "" "$M" plain
checks "" mpi 4 "$M" coll 2 2
checks "dp 4 x cp 1: " mpi 4 "$M" coll 4 1
checks "pieces of 2: " mpi 4 -x KILN_RT_COMM_CHUNK=2 "$M" coll 2 2
# ring attention's send/recv: 4-rank rings (8 MiB messages, all ranks send
# first), a group of one, and messages in pieces
checks "p2p 4: " mpi 4 "$M" p2p 4
checks "p2p 1: " "$M" p2p 1
checks "p2p 2, pieces of 100000 bytes: " mpi 2 -x KILN_RT_COMM_CHUNK=100000 "$M" p2p 2
mkdir "$tmp/ck"
checks "" mpi 4 "$M" ckpt "$tmp/ck"
# params in a param shard: each run also loads the files the earlier ones saved
mkdir "$tmp/pk"
checks "" mpi 4 "$M" pckpt 4 "$tmp/pk"
checks "" "$M" pckpt 1 "$tmp/pk"
checks "" mpi 2 "$M" pckpt 2 "$tmp/pk"

# ---- the trainer on the tiny model (global batch 8) ----
head -c 30000 /usr/share/common-licenses/GPL-3 > "$tmp/d.txt"
tail -c 5000 /usr/share/common-licenses/GPL-2 > "$tmp/v.txt"
D="--data $tmp/d.txt"
losses() { sed 's/.*"loss":\([^,]*\),.*/\1/' "$1"; }
vlosses() { grep val_loss "$1" | sed 's/.*"val_loss":\([^,]*\),.*/\1/'; }
# max relative difference of two columns of numbers, equal length
maxrel() { paste <($1) <($2) | awk 'NF != 2 {bad = 1} {d = $1 - $2; if (d < 0) d = -d; s = $2 < 0 ? -$2 : $2; if (s > 0 && d / s > m) m = d / s; k++}
    END {if (bad || k == 0) print 1; else printf "%g\n", m}'; }
close() { awk -v x="$1" 'BEGIN {exit !(x <= 1e-5)}'; }

"$M" train 1 8 -- $D --steps 30 --log "$tmp/l1" > /dev/null
mpi 4 "$M" train 4 8 -- $D --steps 30 --log "$tmp/l4" > "$tmp/o4"
r=$(maxrel "losses $tmp/l1" "losses $tmp/l4")
check "4 ranks x 2 rows == 1 rank x 8 rows over 30 steps (max rel diff $r)" "[ \$(wc -l < $tmp/l4) = 30 ] && close $r"
check "only rank 0 prints and logs" "[ \$(grep -c '^training' $tmp/o4) = 1 ] && [ \$(grep -c '^step   30/30' $tmp/o4) = 1 ]"
want=$((2 * 3 * 65 * 4 + 2 * 3 * 4 / 4)) # allgather + reducescatter of 65 floats over 4 ranks, allreduce of 1
check "the log's comm_bytes per step = $want (the ring formula)" "[ \$(grep -c '\"comm_bytes\":$want,' $tmp/l4) = 30 ]"

mpi 4 "$M" train 4 8 -- $D --steps 15 --ckpt "$tmp/rck" > /dev/null
mpi 2 "$M" train 2 8 -- $D --steps 30 --resume "$tmp/rck" --ckpt "$tmp/rck_r2" --log "$tmp/r2" > "$tmp/o2"
r=$(maxrel "eval tail -15 $tmp/l4 | sed 's/.*\"loss\":\([^,]*\),.*/\1/'" "losses $tmp/r2")
check "resume at dp 2 from a dp 4 checkpoint: the same next 15 losses (max rel diff $r)" \
    "grep -q 'resumed from .*step_00000015' $tmp/o2 && [ \$(wc -l < $tmp/r2) = 15 ] && close $r"
"$M" train 1 8 -- $D --steps 30 --resume "$tmp/rck" --ckpt "$tmp/rck_r1" --log "$tmp/r1" > /dev/null
r=$(maxrel "eval tail -15 $tmp/l4 | sed 's/.*\"loss\":\([^,]*\),.*/\1/'" "losses $tmp/r1")
check "resume on 1 rank from the dp 4 checkpoint (max rel diff $r)" "[ \$(wc -l < $tmp/r1) = 15 ] && close $r"

V="--val $tmp/v.txt --val-every 10"
"$M" train 1 8 -- $D --steps 30 $V --log "$tmp/v1" > /dev/null
mpi 4 "$M" train 4 8 -- $D --steps 30 $V --log "$tmp/v4" --trace "$tmp/tr.json" > /dev/null
r=$(maxrel "vlosses $tmp/v1" "vlosses $tmp/v4")
check "--val on 4 ranks: the 1-rank validation losses (max rel diff $r), training losses unchanged" \
    "[ \$(vlosses $tmp/v4 | wc -l) = 3 ] && close $r && cmp -s <(losses $tmp/v4) <(losses $tmp/l4)"
check "--trace: one file per rank, pid = rank, the collectives on the comm stream" "python3 - <<EOF
import json, sys
for r, f in enumerate(['$tmp/tr.json'] + ['$tmp/tr.json.rank%d' % k for k in (1, 2, 3)]):
    ev = [e for e in json.load(open(f))['traceEvents'] if e['ph'] == 'X']
    comm = {e['name'] for e in ev if e['tid'] == 1}
    assert {e['pid'] for e in ev} == {r} and comm == {'allgather params', 'allreduce loss', 'reducescatter grads'}, f
EOF"

# ---- context parallel: the trainer hands each rank its cp columns ----
# (train-cp: positions from rtk_iota_rank, bucket, loss and grads over dp+cp)
for cfg in "2 1 2 dual" "2 1 2 contiguous" "4 2 2 dual" "4 1 4 contiguous"; do
    set -- $cfg
    mpi "$1" "$M" train-cp "$2" "$3" "$4" 8 -- $D --steps 30 --log "$tmp/cp" > /dev/null 2> "$tmp/e"
    r=$(maxrel "losses $tmp/l1" "losses $tmp/cp")
    check "dp $2 x cp $3 ($4): the 1-rank losses over 30 steps (max rel diff $r)" "[ \$(wc -l < $tmp/cp) = 30 ] && close $r"
done
mpi 4 "$M" train-cp 2 2 dual 8 -- $D --steps 30 $V --log "$tmp/cpv" > /dev/null
r=$(maxrel "vlosses $tmp/v1" "vlosses $tmp/cpv")
check "dp 2 x cp 2 --val: the 1-rank validation losses (max rel diff $r)" "[ \$(vlosses $tmp/cpv | wc -l) = 3 ] && close $r"
mpi 2 "$M" train-cp 1 2 mismatch 8 -- $D --steps 30 --log "$tmp/cpm" > /dev/null
r=$(maxrel "losses $tmp/l1" "losses $tmp/cpm")
check "cp 2, table contiguous but dual positions: the losses differ (max rel diff $r > 1e-3), so the checks above can fail" \
    "awk -v x=$r 'BEGIN {exit !(x > 1e-3)}'"

# ---- the trainer with the params in a param shard (train-ps) ----
"$M" train-ps 1 8 -- $D --steps 30 --log "$tmp/p1" > /dev/null
mpi 4 "$M" train-ps 4 8 -- $D --steps 30 $V --log "$tmp/p4" --ckpt "$tmp/pck" --ckpt-every 15 > /dev/null
check "params in a param shard: the stored layout's losses bit for bit (1 rank; 4 ranks with --val)" \
    "[ \$(wc -l < $tmp/p4) = 30 ] && cmp -s <(losses $tmp/p1) <(losses $tmp/l1) && cmp -s <(losses $tmp/p4) <(losses $tmp/l4) && cmp -s <(vlosses $tmp/p4) <(vlosses $tmp/v4)"
check "params in a param shard: the step-15 checkpoint == the stored layout's, byte for byte" \
    "cmp -s $tmp/pck/step_00000015.safetensors $tmp/rck/step_00000015.safetensors"
mkdir "$tmp/pck15" && cp "$tmp/pck/step_00000015.safetensors" "$tmp/pck15/"
tail4() { tail -15 "$tmp/l4" | sed 's/.*"loss":\([^,]*\),.*/\1/'; }
"$M" train 1 8 -- $D --steps 30 --resume "$tmp/pck15" --ckpt "$tmp/pck15_r1" --log "$tmp/pr1" > /dev/null
r=$(maxrel tail4 "losses $tmp/pr1")
check "param-shard checkpoint of dp 4 -> stored params on 1 rank: the same next 15 losses (max rel diff $r)" "[ \$(wc -l < $tmp/pr1) = 15 ] && close $r"
mpi 2 "$M" train-ps 2 8 -- $D --steps 30 --resume "$tmp/rck" --ckpt "$tmp/rck_pr2" --log "$tmp/pr2" > /dev/null
r=$(maxrel tail4 "losses $tmp/pr2")
check "stored-params checkpoint of dp 4 -> param shards at dp 2: the same next 15 losses (max rel diff $r)" "[ \$(wc -l < $tmp/pr2) = 15 ] && close $r"
I="--steps 5 --init $tmp/pck15/step_00000015.safetensors"
"$M" train 1 8 -- $D $I --log "$tmp/i1" > /dev/null
"$M" train-ps 1 8 -- $D $I --log "$tmp/i1p" > /dev/null
mpi 2 "$M" train-ps 2 8 -- $D $I --log "$tmp/i2p" > /dev/null
r=$(maxrel "losses $tmp/i1" "losses $tmp/i2p")
check "--init into param shards: 1 rank == stored params bit for bit, dp 2 within 1e-5 ($r), not the fresh init's losses" \
    "[ \$(wc -l < $tmp/i1p) = 5 ] && cmp -s <(losses $tmp/i1) <(losses $tmp/i1p) && close $r && [ \"\$(losses $tmp/i1p | head -1)\" != \"\$(losses $tmp/p1 | head -1)\" ]"

# ---- bad launches ----
msg="mini: compiled for 4 ranks (pp x dp x cp x tp = 1 x 4 x 1 x 1); launched with 2 processes (use mpirun -np 4)"
mpi 2 "$M" train 4 8 -- $D > /dev/null 2> "$tmp/e"; rc=$?
check "4-rank program under mpirun -np 2: exit 1, one line: $msg" "[ $rc = 1 ] && [ \$(grep -c 'compiled for' $tmp/e) = 1 ] && grep -qxF '$msg' $tmp/e"
nolsan "$M" train 4 8 -- $D > /dev/null 2> "$tmp/e"; rc=$?
check "4-rank program in a plain process: exit 1, one line: $(cat "$tmp/e")" \
    "[ $rc = 1 ] && [ \$(wc -l < $tmp/e) = 1 ] && grep -q 'launched with 1 processes (use mpirun -np 4)' $tmp/e"
mpi 4 "$M" train 4 8 -- --data "$tmp/missing.txt" > /dev/null 2> "$tmp/e"; rc=$?
check "a missing --data on 4 ranks: exit 1, said once: $(grep '^--data' "$tmp/e")" "[ $rc = 1 ] && [ \$(grep -c 'missing.txt' $tmp/e) = 1 ]"
start=$SECONDS
mpi 4 "$M" die > /dev/null 2> "$tmp/e"; rc=$?
check "rank 1 SIGKILLs itself in step 3: mpirun ends the job (rc=$rc) in $((SECONDS - start)) s, no hang" \
    "[ $rc != 0 ] && [ $rc != 124 ] && [ $((SECONDS - start)) -lt 60 ] && ! grep -q survived $tmp/e"
