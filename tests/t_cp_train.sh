#!/usr/bin/env bash
# Context parallel through the compiled trainer under mpirun: tiny GPT at
# --cp 2 (dual layout), --cp 2 --cp-layout contiguous and --dp 2 --cp 2 give
# the 1-rank loss curve over 30 steps (relative 1e-5: f32, only the
# summation order differs), which checks the compiled program (rank iotas,
# K/V all-gather and dK/dV reduce-scatter along T, attention with
# positions) and the trainer's hand-out of cp columns together.  Both
# --cp-comm allgather (the default) and p2p (ring attention: rtk_send /
# rtk_recv of K, V, positions and dK, dV around the cp ring, attn_merge).
. "$(dirname "$0")/lib.sh"
need_mpi
# under SAN=1: Open MPI's own allocations are still held at exit (as t_mpi.sh's nolsan)
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
M="models/tiny.lua --set layers=1 --steps 30"
"$K" compile $M -o "$tmp/one" > /dev/null || echo "not ok 0 - kiln compile $M"
"$tmp/one" $D --log "$tmp/l1" > /dev/null
run() { # name, ranks, compile flags...
    local name=$1 np=$2; shift 2
    if ! "$K" compile $M "$@" -o "$tmp/$name" > "$tmp/c.$name" 2>&1; then
        check "kiln compile $* ($(head -1 "$tmp/c.$name"))" false
        return
    fi
    $MPI -np "$np" "$tmp/$name" $D --log "$tmp/l.$name" > /dev/null 2> "$tmp/e.$name"
    local ref=${REF:-$tmp/l1} # REF: another 1-rank curve
    check "mpirun -np $np ($*) == 1 rank over 30 steps (worst $(worst "$tmp/l.$name" "$ref"))" "same $tmp/l.$name $ref 30"
}
run cp2 2 --cp 2
run cp2c 2 --cp 2 --cp-layout contiguous
run dp2cp2 4 --dp 2 --cp 2
run cp4 4 --cp 4
run cp2p 2 --cp 2 --cp-comm p2p
run cp4p 4 --cp 4 --cp-comm p2p
# an odd shape (vocab 257, dim 63, 3 heads, seq 24; flats padded to dp x cp)
# against its own 1-rank curve
ODD="--set vocab=257 --set dim=63 --set heads=3 --set seq=24 --weight-decay 0.1 --bucket-mb 0.01"
# shellcheck disable=SC2086
"$K" compile $M $ODD -o "$tmp/odd1" > /dev/null || echo "not ok 0 - kiln compile $M $ODD"
"$tmp/odd1" $D --log "$tmp/l1.odd" > /dev/null
# shellcheck disable=SC2086
REF=$tmp/l1.odd run odd 4 $ODD --dp 2 --cp 2 --cp-comm p2p

# ---- comm volume measured by the runtime ----
# Every launch's bytes sent to other ranks are in the --trace (args.bytes,
# counted by the comm backend as it sends).  The K,V exchange of attention
# is what the forward sends inside layers (the param all-gathers and the
# loss all-reduce sit outside any layer, L-1); per layer per rank it must be
# 2·b·s·kv_heads·head_dim·(cp−1)/cp f32 elements, the same on every rank.
# And all the trace's bytes together are the log's comm_bytes (rank 0).
measure() { # name ranks steps layers model flags... -> prints "kv_bytes_per_layer total_trace_bytes log_bytes" (rank 0); checks ranks agree
    local name=$1 np=$2 steps=$3 layers=$4; shift 4
    "$K" compile "$@" -o "$tmp/$name" > /dev/null 2>&1 || { echo "compile failed"; return; }
    $MPI -np "$np" "$tmp/$name" $D --steps "$steps" --log "$tmp/l.$name" --trace "$tmp/t.$name" > /dev/null 2>&1 || { echo "run failed"; return; }
    python3 - "$tmp/t.$name" "$np" "$steps" "$layers" "$tmp/l.$name" <<'PY'
import json, sys
path, np_, steps, layers, log = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
kv, total = [], 0
for r in range(np_):
    ev = [e for e in json.load(open(path if r == 0 else "%s.rank%d" % (path, r)))["traceEvents"] if e["ph"] == "X"]
    b = [e.get("args", {}).get("bytes", 0) for e in ev if e.get("args", {}).get("at", "").startswith("fwd L") and not e["args"]["at"].startswith("fwd L-1")]
    kv.append(sum(b) / steps / layers)
    if r == 0: total = sum(e.get("args", {}).get("bytes", 0) for e in ev)
logged = sum(json.loads(l)["comm_bytes"] for l in open(log))
print("%d %d %d" % (kv[0], total, logged) if len(set(kv)) == 1 else "ranks disagree: %s" % kv)
PY
}
formula() { echo $((2 * $1 * $2 * $3 * $4 * ($5 - 1) / $5 * 4)); } # b s kv_heads head_dim cp -> bytes
for cfg in "tiny2p 2 p2p" "tiny4p 4 p2p" "tiny4a 4 allgather"; do
    read -r name cp comm <<< "$cfg"
    want=$(formula 8 64 4 16 "$cp")
    read -r kv total logged <<< "$(measure "$name" "$cp" 2 2 models/tiny.lua --cp "$cp" --cp-comm "$comm")"
    check "tiny GPT --cp $cp --cp-comm $comm: K,V bytes sent per layer per rank, measured $kv = formula $want; trace total $total = logged comm_bytes $logged" \
        "[ '$kv' = '$want' ] && [ '$total' = '$logged' ] && [ '${total:-0}' -gt 0 ]"
done
L="models/llama.lua --set vocab=128 --set dim=64 --set layers=2 --set heads=4 --set ffn=128 --set seq=32 --set batch=4"
for comm in p2p allgather; do
    gqa=$(measure gqa 2 2 2 $L --set kv_heads=2 --cp 2 --cp-comm $comm | cut -d' ' -f1)
    mha=$(measure mha 2 2 2 $L --set kv_heads=4 --cp 2 --cp-comm $comm | cut -d' ' -f1)
    check "llama --cp 2 --cp-comm $comm: GQA (2 of 4 kv heads) sends $gqa K,V bytes per layer = formula $(formula 4 32 2 16 2), MHA $mha: heads/kv_heads = 2 times more" \
        "[ '$gqa' = '$(formula 4 32 2 16 2)' ] && [ '$mha' = '$((2 * gqa))' ]"
done
