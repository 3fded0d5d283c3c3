#!/usr/bin/env bash
# The trainer's two FLOP counts (compiler/emit/emit_host.c add_flops, the
# program table's flops and hw_flops, the JSONL's "gflops" and "hw_gflops"):
#  - model FLOPs are the model's forward and backward once, whatever the
#    recompute policy: tiny.lua under --recompute none, gemm-last and full
#    logs the same model FLOPs per token, and they equal an independent count
#    from the config (below);
#  - hardware FLOPs include recomputed work: equal to model under none and
#    gemm-last (which recomputes no GEMM and no attention), larger under full
#    by one forward of the layers' GEMMs and attention, less the MLP's output
#    projection (no backward reads its output) and the lm head (outside the
#    layers).
# FLOPs per token = gflops * 1e9 / tokens_per_s of the same step (both divide
# by the same step time); the JSONL prints tokens_per_s to 0.1 and gflops to
# 0.001, so the tolerance is 0.5% relative.
# The independent count, tiny.lua's GPT-2 block (dim C, layers L, seq T,
# vocab V, ffn 4C, tied lm head): per token a weight GEMM does 2 FLOPs per
# weight forward and 4 backward (input and weight gradients), so
# 6 * (12 L C^2 + V C); causal attention forward 4 T C / 2 per layer and
# backward 2.5 times that (kiln's convention, bench/attention_bench.c):
# 7 L T C.  Recomputed under full: c_attn, c_proj of attention and c_fc
# (3C^2 + C^2 + 4C^2 weights) and the attention forward: 2 * 8 L C^2 + 2 L T C.
. "$(dirname "$0")/lib.sh"
need_corpus
SHAPE="--set layers=2 --set dim=64 --set seq=64 --set batch=8 --set vocab=256"
for p in none gemm-last full; do
    # shellcheck disable=SC2086
    "$K" compile models/tiny.lua $SHAPE --recompute $p -o "$tmp/t.$p" > /dev/null 2>&1 &&
        "$tmp/t.$p" --data "$B/corpus.txt" --threads 2 --steps 3 --log "$tmp/log.$p" > /dev/null 2>&1 ||
        echo "not ok 0 - compile/train tiny.lua --recompute $p"
done

# per_token POLICY KEY: the median over the steps of KEY * 1e9 / tokens_per_s
per_token() {
    /usr/bin/python3 -c '
import json, statistics, sys
r = [json.loads(l) for l in open(sys.argv[1])]
print(statistics.median(x[sys.argv[2]] * 1e9 / x["tokens_per_s"] for x in r))' "$tmp/log.$1" "$2" 2>/dev/null || echo nan
}
# near A B: |A - B| <= 0.5% of B
near() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a == a && b > 0 && (a - b < 0 ? b - a : a - b) <= 0.005 * b) }'; }

L=2 C=64 T=64 V=256
model=$((6 * (12 * L * C * C + V * C) + 7 * L * T * C))
refwd=$((2 * 8 * L * C * C + 2 * L * T * C))
for p in none gemm-last full; do
    m=$(per_token $p gflops)
    check "--recompute $p: model FLOPs per token $m = 6(12LC^2+VC) + 7LTC = $model (0.5%)" "near $m $model"
done
for p in none gemm-last; do
    h=$(per_token $p hw_gflops)
    check "--recompute $p: hardware FLOPs per token $h = model FLOPs $model (nothing recomputed that counts)" "near $h $model"
done
h=$(per_token full hw_gflops)
check "--recompute full: hardware FLOPs per token $h = model + the recomputed forward 16LC^2 + 2LTC = $((model + refwd)) (0.5%)" \
    "near $h $((model + refwd))"
