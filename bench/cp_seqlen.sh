#!/usr/bin/env bash
# bench/cp_seqlen.sh — context parallel and sequence length: for a fixed
# per-rank activation budget, the longest sequence that fits, from `kiln
# plan` (the forward/backward activation peak per rank, "of which model"),
# for cp 1, 2, 4, 8 on llama.lua at Llama-3 8B size (dim 4096, 32 layers,
# 32 heads, 8 kv heads, ffn 14336, vocab 128256, batch 1, f32 on the CPU,
# no recompute: RECOMPUTE=none, the default here; RECOMPUTE=gemm-last etc.
# for the other policies).  The sequence is searched in steps of 1024 tokens.
set -eu
B=${BUILD:-build}
BUDGET_GIB=${BUDGET_GIB:-64}
COMM=${COMM:-allgather} # or p2p (ring attention)
L7="models/llama.lua --set dim=4096 --set layers=32 --set heads=32 --set kv_heads=8 --set ffn=14336 --set vocab=128256 --set batch=1"
make -s "$B/kiln" BUILD="$B" >/dev/null
budget=$((BUDGET_GIB * 1024 * 1024 * 1024))
act() { # seq cp -> bytes
    # shellcheck disable=SC2086
    "$B/kiln" plan $L7 --set seq="$1" --cp "$2" --cp-comm "$COMM" --recompute "${RECOMPUTE:-none}" 2>/dev/null | sed -n 's/.*of which model *[0-9.]* MiB *\([0-9]*\) bytes.*/\1/p'
}
echo "cp_seqlen ($(date -u +%F), --cp-comm $COMM): longest sequence whose forward/backward activations fit $BUDGET_GIB GiB per rank"
printf '%4s %10s %14s %18s\n' cp "max seq" "x cp=1" "activations (GiB)"
base=0
for cp in 1 2 4 8; do
    lo=0 hi=$((1024 * 1024 / 1024)) # in units of 1024 tokens
    while [ $((hi - lo)) -gt 1 ]; do
        mid=$(((lo + hi) / 2))
        a=$(act $((mid * 1024)) "$cp")
        if [ -n "$a" ] && [ "$a" -le "$budget" ]; then lo=$mid; else hi=$mid; fi
    done
    seq=$((lo * 1024))
    [ "$base" = 0 ] && base=$seq
    a=$(act "$seq" "$cp")
    awk -v c="$cp" -v s="$seq" -v b="$base" -v a="$a" 'BEGIN {printf "%4d %10d %13.2fx %18.2f\n", c, s, s / b, a / 1073741824}'
done
