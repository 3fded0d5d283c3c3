#!/usr/bin/env bash
# builds bench.cu for sm_90 against kernels/cuda/attention_tc.cu (bench_new)
# and, given a commit, against that commit's attention_tc.cu (bench_old):
#   bash bench/gpu/attn_tc/build.sh [OLD_COMMIT]    (here; no GPU needed)
#   then on the GPU: bench/gpu/attn_tc/out/bench_new; .../bench_old
set -e
cd "$(dirname "$0")/../../.."
O=bench/gpu/attn_tc/out; mkdir -p "$O"
NV=(nvcc -std=c++17 -O3 -arch=sm_90 -lineinfo -Ikernels/cuda)
"${NV[@]}" -DATC_SRC='"attention_tc.cu"' -D'SMEM_FWD(D)=(640*((D)+8)+768)' -D'SMEM_BWD(D)=(768*((D)+8)+1792)' \
    bench/gpu/attn_tc/bench.cu -o "$O/bench_new"
if [ -n "$1" ]; then
    git show "$1:kernels/cuda/attention_tc.cu" > "$O/attention_tc_old.cu"
    "${NV[@]}" -DATC_SRC="\"$PWD/$O/attention_tc_old.cu\"" -D'SMEM_FWD(D)=(384*((D)+8)+512)' -D'SMEM_BWD(D)=(512*((D)+8)+1024)' \
        -DBENCH_FWD=kiln_attention_tc_fwd -DBENCH_DKDV=kiln_attention_tc_bwd_dkdv -DBENCH_DQ=kiln_attention_tc_bwd_dq \
        bench/gpu/attn_tc/bench.cu -o "$O/bench_old"
fi
