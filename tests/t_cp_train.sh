#!/usr/bin/env bash
# Context parallel through the compiled trainer under mpirun: tiny GPT at
# --cp 2 (dual layout), --cp 2 --cp-layout contiguous and --dp 2 --cp 2 give
# the 1-rank loss curve over 30 steps (relative 1e-5: f32, only the
# summation order differs), which checks the compiled program (rank iotas,
# K/V all-gather and dK/dV reduce-scatter along T, attention with
# positions) and the trainer's hand-out of cp columns together.  Both
# --cp-comm allgather (the default) and p2p (ring attention: rtk_send /
# rtk_recv of K, V, positions and dK, dV around the cp ring, attn_merge).
set -u
B=${BUILD:-build}
K=$B/kiln
n=0
check() { n=$((n + 1)); if eval "$2"; then echo "ok $n - $1"; else echo "not ok $n - $1"; fi; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader
MPI="timeout 300 mpirun --oversubscribe"
if ! command -v mpirun > /dev/null; then echo "ok 1 # SKIP mpirun not installed"; exit 0; fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
[ -e "$B/corpus.txt" ] || make -s "$B/corpus.txt" BUILD="$B" >/dev/null
D="--data $B/corpus.txt --threads 1"
M="models/tiny.lua --set layers=1 --steps 30"
"$K" compile $M -o "$tmp/one" > /dev/null || echo "not ok 0 - kiln compile $M"
losses() { sed 's/.*"loss":\([^,]*\),.*/\1/' "$1"; }
worst() { paste <(losses "$1") <(losses "$2") | awk 'function abs(x){return x<0?-x:x} {d=abs($1-$2)/abs($2); if(d>w)w=d} END{printf "%.3g", w+0}'; }
same() { # log a, log b, lines
    [ "$(wc -l < "$1")" = "$3" ] && [ "$(wc -l < "$2")" = "$3" ] && awk -v w="$(worst "$1" "$2")" 'BEGIN{exit !(w <= 1e-5)}'
}
"$tmp/one" $D --log "$tmp/l1" > /dev/null
run() { # name, ranks, compile flags...
    local name=$1 np=$2; shift 2
    if ! "$K" compile $M "$@" -o "$tmp/$name" > "$tmp/c.$name" 2>&1; then
        check "kiln compile $* ($(head -1 "$tmp/c.$name"))" false
        return
    fi
    $MPI -np "$np" "$tmp/$name" $D --log "$tmp/l.$name" > /dev/null 2> "$tmp/e.$name"
    check "mpirun -np $np ($*) == 1 rank over 30 steps (worst $(worst "$tmp/l.$name" "$tmp/l1"))" "same $tmp/l.$name $tmp/l1 30"
}
run cp2 2 --cp 2
run cp2c 2 --cp 2 --cp-layout contiguous
run dp2cp2 4 --dp 2 --cp 2
run cp4 4 --cp 4
run cp2p 2 --cp 2 --cp-comm p2p
run cp4p 4 --cp 4 --cp-comm p2p
