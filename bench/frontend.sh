#!/usr/bin/env bash
# bench/frontend.sh — compile-time speed of the spine: Lua front end +
# autodiff + verifier (and the text dump to /dev/null, so an upper bound).
# Targets (issue 2): GPT-2 124M <= 0.5 s; 96 layers x 12288 wide <= 3 s.
# Best of 3 wall-clock runs; prints the IR size too.
set -eu
K=${BUILD:-build}/kiln
best() { # command...
    local b=999999
    for _ in 1 2 3; do
        local s e
        s=$(date +%s%N); "$@" > /dev/null; e=$(date +%s%N)
        local ms=$(( (e - s) / 1000000 ))
        [ "$ms" -lt "$b" ] && b=$ms
    done
    echo "$b"
}
row() { # name, target_ms, args...
    local name=$1 target=$2; shift 2
    local ms; ms=$(best "$K" dump "$@" --after autodiff -o /dev/null)
    local lines; lines=$("$K" dump "$@" --after autodiff | wc -l)
    printf '%-34s %8d ms   target %5d ms   %s   (%d IR lines)\n' "$name" "$ms" "$target" \
        "$([ "$ms" -le "$target" ] && echo MET || echo MISSED)" "$lines"
}
echo "front end + autodiff + verify + dump, best of 3 ($(date -u +%F), $(nproc) cores)"
row "gpt2 124M (12 x 768)" 500 models/gpt2.lua
row "gpt2 96 x 12288 (175B shape)" 3000 models/gpt2.lua --set layers=96 --set dim=12288 --set heads=96
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
ms=$(best "$K" compile models/gpt2.lua --target cpu -o "$tmp/gpt2")
printf '%-34s %8d ms   target %5d ms   %s   (front to object file, linked trainer)\n' "kiln compile gpt2 124M (cpu)" "$ms" 5000 \
    "$([ "$ms" -le 5000 ] && echo MET || echo MISSED)"
