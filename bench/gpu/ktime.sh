#!/usr/bin/env bash
# bench/gpu/ktime.sh [BASE] — builds, HERE, bench/gpu/out/ktime/: the ktime
# binary (ktime.c: links libcuda only) and the sm_90 cubins it compares:
# BASE's (default 4df2368, before the bandwidth work) and this tree's
# layernorm, xent_fused, embedding and adamw kernels, and the generated
# elementwise kernels of models/gpt2.lua at batch 32 from BASE's kiln and
# this tree's (BASE's kiln is built in a temporary git worktree).  The
# cubins are nvcc's (-std=c++17 -lineinfo, as compiler/emit/nvrtc_compile.c
# asks NVRTC).  Then, on the GPU machine (one call, ~1 min of device time
# after the start):
#     run(command="bench/gpu/out/ktime/ktime bench/gpu/out/ktime", carry=["bench/gpu/out"])
set -euo pipefail
cd "$(dirname "$0")/../.."
BASE=${1:-4df2368}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
O=bench/gpu/out/ktime
NVCC=("$CUDA_HOME/bin/nvcc" -arch=sm_90 -cubin -std=c++17 -lineinfo)
W=$(mktemp -d)
trap 'git worktree remove --force "$W/tree" 2>/dev/null || true; rm -rf "$W"' EXIT
mkdir -p "$O" "$W/old"
git archive "$BASE" kernels/cuda | tar -x -C "$W/old"
for k in layernorm xent_fused embedding adamw; do
    "${NVCC[@]}" -I"$W/old/kernels/cuda" "$W/old/kernels/cuda/$k.cu" -o "$O/${k}_old.cubin"
    "${NVCC[@]}" -Ikernels/cuda "kernels/cuda/$k.cu" -o "$O/${k}_new.cubin"
done
"${NVCC[@]}" bench/gpu/ktime_init.cu -o "$O/init.cubin"
# the generated kernels' text (kiln writes FILE.cu before it links)
make -s -j2 build/kiln
build/kiln compile models/gpt2.lua --target cuda:sm_90 --set batch=32 --emit cuda -o "$W/new" > /dev/null 2>&1 || true
[ -s "$W/new.cu" ] || { echo "ktime.sh: no generated text from this tree's kiln" >&2; exit 1; }
git worktree add -q --detach "$W/tree" "$BASE"
make -s -j2 -C "$W/tree" build/kiln
(cd "$W/tree" && build/kiln compile models/gpt2.lua --target cuda:sm_90 --set batch=32 --emit cuda -o "$W/old" > /dev/null 2>&1) || true
[ -s "$W/old.cu" ] || { echo "ktime.sh: no generated text from $BASE's kiln" >&2; exit 1; }
"${NVCC[@]}" "$W/old.cu" -o "$O/gen_old.cubin"
"${NVCC[@]}" "$W/new.cu" -o "$O/gen_new.cubin"
cc -std=c11 -O2 -Wall -Wextra -I"$CUDA_HOME/include" bench/gpu/ktime.c -o "$O/ktime" -L"$CUDA_HOME/lib64/stubs" -lcuda -lm
ls -la "$O"
echo "ktime.sh: built $O from $BASE (old) and $(git rev-parse --short HEAD)+tree (new)"
