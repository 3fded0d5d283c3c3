#!/usr/bin/env bash
# bench/offload_maxseq.sh — the longest sequence per rank that fits an H200
# (profiles/h200-sxm: 141 GB = 131.3 GiB, copies at 20 GB/s each way) for
# recompute none, gemm-last, and gemm-last + offload auto, from `kiln plan
# --max-seq --memory 131` (compiler/cmd/plan_offload.c: plans compiled at
# doubling then bisected sequence lengths, steps of 128 tokens), in bf16
# (the GPU's precision), at three shapes:
#   Llama-3 8B   --pp 8, 16 micro-batches of 1 sequence (global batch 16;
#                MODELS=8b: the earlier mesh, --pp 4 with 8 micro-batches)
#   Llama-3 70B  --pp 8 --dp 8 --zero 1, 16 micro-batches (global batch 128)
#   GPT-3 175B   (gpt2.lua at 96 x 12288, 96 heads) --pp 16 --dp 8 --zero 1,
#                16 micro-batches (global batch 128)
# Also (MODELS=8b, 8b-vpp2): the 8B shape at --pp 4 with 8 micro-batches,
# and at --pp 8 interleaved --vpp 2 (2 layers a chunk).  Why pp 8 for 8B:
# offload hides a first stage's copies in its p in-flight micro-batches;
# at pp 4 a micro-batch's copy out and back take about one F+B period
# each at 20 GB/s, so 4 periods leave little time on the host, while 8 do
# (docs/offload.md, "Measured against the goals").
# The offload row also gives the predicted exposed copy time at its length
# (of the binding rank, against its step with the pipeline's bubble).
# Each shape takes minutes of compiling (MODELS="8b-pp8 70b 175b" picks).
# COPY_BW=B (bytes/s, e.g. 50e9) runs with a copy of the h200 profile whose
# h2d and d2h rates are B instead of its 20 GB/s (an experiment: the seeds
# quote PCIe Gen5 x16 at 64 GB/s a direction).
set -eu
B=${BUILD:-build}
MEM=${MEM:-131}
MODELS=${MODELS:-8b-pp8 70b 175b}
make -s "$B/kiln" BUILD="$B" > /dev/null
L8="models/llama.lua --set dim=4096 --set layers=32 --set heads=32 --set kv_heads=8 --set ffn=14336 --set vocab=128256 --set batch=8 --pp 4 --micro-batches 8"
L70="models/llama.lua --set dim=8192 --set layers=80 --set heads=64 --set kv_heads=8 --set ffn=28672 --set vocab=128256 --set batch=128 --pp 8 --dp 8 --zero 1 --micro-batches 16"
G175="models/gpt2.lua --set layers=96 --set dim=12288 --set heads=96 --set batch=128 --pp 16 --dp 8 --zero 1 --micro-batches 16"
PROF=h200
if [ -n "${COPY_BW:-}" ]; then
    PROF=$(mktemp); trap 'rm -f "$PROF"' EXIT
    sed "s/^h2d_bw .*/h2d_bw $COPY_BW/; s/^d2h_bw .*/d2h_bw $COPY_BW/; s/^name .*/name h200-sxm-copy-$COPY_BW/" profiles/h200-sxm.profile > "$PROF"
fi
COMMON="--precision bf16 --device-profile $PROF --max-seq --memory $MEM"
echo "offload max-seq ($(date -u +%F), $(uptime | sed 's/.*load average: //;s/,.*//') load), --memory $MEM GiB per rank, profile $PROF${COPY_BW:+ (h200-sxm with copies at $COPY_BW B/s)}, bf16"
for m in $MODELS; do
    case $m in
    8b) args=$L8 name="Llama-3 8B, pp 4, m 8" ;;
    70b) args=$L70 name="Llama-3 70B, pp 8, dp 8, zero 1, m 16" ;;
    175b) args=$G175 name="GPT-3 175B, pp 16, dp 8, zero 1, m 16" ;;
    8b-pp8) args="${L8/--set batch=8 --pp 4 --micro-batches 8/--set batch=16 --pp 8 --micro-batches 16}" name="Llama-3 8B, pp 8, m 16" ;;
    8b-vpp2) args="${L8/--set batch=8 --pp 4 --micro-batches 8/--set batch=16 --pp 8 --vpp 2 --pp-schedule interleaved --micro-batches 16}" name="Llama-3 8B, pp 8, vpp 2 interleaved, m 16" ;;
    *) echo "unknown model $m (8b, 70b, 175b, 8b-pp8, 8b-vpp2)"; exit 1 ;;
    esac
    echo "== $name"
    t0=$SECONDS
    # shellcheck disable=SC2086
    "$B/kiln" plan $args $COMMON
    echo "   ($((SECONDS - t0)) s)"
done
