#!/usr/bin/env bash
# `kiln plan`'s data-parallel lines under context parallelism (issue 17):
# gradients are partial sums over dp x cp and the distributed optimizer
# shards over dp x cp, so the bytes per parameter are 4 + 4 + 12/(dp x cp)
# under --zero 1.  Checked against what the plan itself measured: the
# optimizer state's bytes over the parameter count must be the 12/(dp x cp)
# of the line (to 0.01: the step counter and the flats' padding), and the
# grads, optimizer and data-parallel lines name the dp x cp group.
. "$(dirname "$0")/lib.sh"
LLAMA="models/llama.lua --set vocab=128 --set dim=64 --set layers=2 --set heads=4 --set kv_heads=2 --set ffn=128 --set seq=32 --set batch=4"
for M in models/tiny.lua "$LLAMA"; do
    for mesh in "--dp 2:2:1" "--cp 2:1:2" "--cp 4:1:4" "--dp 2 --cp 2:2:2" "--cp 2 --cp-comm p2p:1:2" "--dp 2 --cp 2 --zero 0:2:2"; do
        IFS=: read -r flags dp cp <<< "$mesh"
        red=$((dp * cp)) zero=1
        [[ "$flags" == *"--zero 0"* ]] && zero=0
        # shellcheck disable=SC2086
        p=$("$K" plan $M $flags 2>&1)
        per=$(printf '%s\n' "$p" | sed -n 's/^  bytes per parameter: \([0-9.]*\) .*/\1/p')
        meg=$(printf '%s\n' "$p" | sed -n 's/^  Megatron, bf16 params + f32 grads: \([0-9.]*\) .*/\1/p')
        opt=$(printf '%s\n' "$p" | sed -n 's/^  optimizer state .* \([0-9]*\) bytes .*/\1/p')
        np=$(printf '%s\n' "$p" | sed -n 's/^  \([0-9]*\) parameters$/\1/p')
        if [ "$cp" -gt 1 ]; then grp="dp x cp = $dp x $cp = $red"; else grp="dp = $dp"; fi
        if [ $zero = 1 ]; then
            check "${M%% *} $flags: $per bytes per parameter = 8 + 12/$red, measured optimizer state $opt bytes / $np parameters, Megatron $meg = 6 + 12/$red" \
                "awk -v per='${per:-0}' -v meg='${meg:-0}' -v o='${opt:-0}' -v n='${np:-1}' -v r=$red 'BEGIN{exit !(per == 8 + 12 / r && meg == 6 + 12 / r && o / n - 12 / r < 0.01 && o / n >= 12 / r)}'"
            lines='^  grads|^  optimizer state|^data parallel' want=3
        else # every rank keeps the whole state: m, v 8 bytes per parameter
            check "${M%% *} $flags: $per bytes per parameter = 16, measured optimizer state $opt bytes / $np parameters = 8" \
                "awk -v per='${per:-0}' -v o='${opt:-0}' -v n='${np:-1}' 'BEGIN{exit !(per == 16 && o / n - 8 < 0.01 && o / n >= 8)}'"
            lines='^  grads|^data parallel' want=2
        fi
        check "${M%% *} $flags: the grads, optimizer state and data-parallel lines name the group ($grp)" \
            "[ \$(printf '%s\n' \"\$p\" | grep -E '$lines' | grep -c -- '$grp') = $want ]"
    done
done
# bf16 (the GPU's step): each flat's shard is cast and gathered in bf16
# (precision.c), so the gathered params cost 2 bytes: Megatron's 6 + 12/dp.
p=$("$K" plan models/tiny.lua --dp 2 --precision bf16 2>&1)
per=$(printf '%s\n' "$p" | sed -n 's/^  bytes per parameter: \([0-9.]*\) .*/\1/p')
meg=$(printf '%s\n' "$p" | sed -n 's/^  Megatron, bf16 params + f32 grads: \([0-9.]*\) .*/\1/p')
check "tiny --dp 2 --precision bf16: $per bytes per parameter (gathered bf16) = Megatron's $meg = 6 + 12/2" \
    "awk -v per='${per:-0}' -v meg='${meg:-0}' 'BEGIN{exit !(per == 12 && meg == 12)}'"
