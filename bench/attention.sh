#!/usr/bin/env bash
# bench/attention.sh — GFLOP/s of the CPU flash attention (rtk_attention and
# rtk_attention_bwd, kernels/cpu/attention.c) next to OpenBLAS sgemm, measured
# in the same run by bench/attention_bench.c, which this script builds against
# the runtime library (no Makefile rule needed).
#   Default shape: the attention of bench/cpu_vs_torch.sh's GPT (batch 8,
#   4 heads, seq 256, head dim 64, causal), then a longer non-causal GQA one.
#   SHAPE="B H KH T S D causal" picks the first shape, ONLY=1 skips the second,
#   THREADS the pool size (default: the cores), REPS the rounds.
# Each line gives the median and the best round; the machine's other load
# shows as a gap between the two.
set -eu
B=${BUILD:-build}
THREADS=${THREADS:-$(nproc)}
REPS=${REPS:-30}
SHAPE=${SHAPE:-8 4 4 256 256 64 1}
make -s "$B/libkilnrt.a" BUILD="$B" >/dev/null
# the runtime library needs MPI's flags as well as OpenBLAS (the Makefile's RT_LIBS)
MPI_CFLAGS=$(mpicc --showme:compile 2>/dev/null || true)
MPI_LIBS=$(mpicc --showme:link 2>/dev/null || true)
# shellcheck disable=SC2086
cc -O2 -std=c11 -D_GNU_SOURCE -Iruntime $MPI_CFLAGS -o "$B/attention_bench" bench/attention_bench.c \
    "$B/libkilnrt.a" -lopenblas -lpthread -lm $MPI_LIBS
# shellcheck disable=SC2086
"$B/attention_bench" $SHAPE "$THREADS" "$REPS"
if [ -z "${ONLY:-}" ]; then "$B/attention_bench" 4 8 2 256 1024 64 0 "$THREADS" "$((REPS / 3 + 1))"; fi
