#!/usr/bin/env bash
# The CUDA target without a GPU (issue 8): `kiln compile --target cuda:sm_XX`
# builds a trainer here that embeds its cubins, names its generated kernels
# in the order of the CUDA C it compiled, links against the CUDA libraries
# and not OpenBLAS, and is the same binary every time.  Running it is
# tests/t_cuda_fake.sh's job (a fake driver) and bench/gpu/check.sh's (a GPU).
. "$(dirname "$0")/lib.sh"
export KILN_CACHE_DIR=$tmp/cache
# the kernels named the way kiln finds them beside its binary (below: run
# from another directory): the NVRTC cache's key holds the include path, so
# that compile hits the cache instead of compiling every kernel a third time
KILN_CUDA_KERNELS=$(dirname "$(readlink -f "$K")")/../kernels/cuda
export KILN_CUDA_KERNELS

"$K" compile models/tiny.lua --target cuda:sm_90 --emit cuda -o "$tmp/tiny" > "$tmp/out" 2>&1
check "tiny.lua --target cuda:sm_90 compiles and links ($(tail -1 "$tmp/out"))" "[ -x '$tmp/tiny' ]"
check "the trainer needs libcuda, cuBLASLt and NCCL, not OpenBLAS" \
    "readelf -d '$tmp/tiny' | grep -q 'libcuda.so' && readelf -d '$tmp/tiny' | grep -q 'libcublasLt' && readelf -d '$tmp/tiny' | grep -q 'libnccl' && ! readelf -d '$tmp/tiny' | grep -q openblas"

# the table: the generated kernels' names in the .cu's order, and one cubin
# per library file plus the generated one
"$K" compile models/tiny.lua --target cuda:sm_90 --emit llvm -o "$tmp/ll" > /dev/null 2>&1
grep -o 'extern "C" __global__ void [a-z_0-9]*' "$tmp/tiny.cu" | awk '{print $5}' > "$tmp/cu_names"
grep -o 'c"kiln_fused_[a-z0-9_]*\\00"' "$tmp/ll.ll" | sed 's/^c"//; s/\\00"$//' > "$tmp/table_names"
check "the table names the $(wc -l < "$tmp/cu_names") generated kernels of the .cu, in its order" \
    "[ -s '$tmp/cu_names' ] && cmp -s '$tmp/cu_names' '$tmp/table_names'"
libs=$(ls kernels/cuda/*.cu | wc -l)
cubins=$(grep -c '^@kiln_cubin[.0-9]* = private' "$tmp/ll.ll")
check "the program embeds $cubins cubins: $libs library files but attention_tc.cu (no --attention tc) + the generated kernels" \
    "[ '$cubins' -eq $libs ]"
"$K" compile models/tiny.lua --target cuda:sm_90 --attention tc --emit llvm -o "$tmp/tc" > /dev/null 2>&1
tc=$(grep -c '^@kiln_cubin[.0-9]* = private' "$tmp/tc.ll")
check "with --attention tc it embeds $tc: all $libs library files + the generated kernels" "[ '$tc' -eq $((libs + 1)) ]"
check "the table says device 1 (RT_DEV_CUDA) and arch sm_90" "grep -q 'c\"sm_90\\\\00\"' '$tmp/ll.ll'"
check "the fused groups launch through rtk_fused" "grep -q 'rtk_fused' '$tmp/ll.ll' && ! grep -q 'define internal void @kiln_fused' '$tmp/ll.ll'"
check "(the CPU program has kernels of its own and no cubin)" \
    "'$K' compile models/tiny.lua --emit llvm -o '$tmp/cpu' > /dev/null 2>&1 && grep -q 'define internal void @kiln_fused' '$tmp/cpu.ll' && ! grep -q '@kiln_cubin' '$tmp/cpu.ll'"

# bf16 activations: the precision pass ran
"$K" compile models/tiny.lua --target cuda:sm_90 --emit schedule -o "$tmp/sch" > /dev/null 2>&1
check "--target cuda turns the precision pass on (bf16 values in the schedule)" "grep -q ':bf16\\[' '$tmp/sch.schedule.ir'"

# determinism: the same binary twice (the second from the NVRTC cache)
"$K" compile models/tiny.lua --target cuda:sm_90 -o "$tmp/again" > /dev/null 2>&1
check "compiled twice: the same trainer binary" "cmp -s '$tmp/tiny' '$tmp/again'"
"$K" compile models/tiny.lua --target cuda:sm_80 -o "$tmp/sm80" > /dev/null 2>&1
check "(the comparison can fail: sm_80 gives another binary)" "[ -x '$tmp/sm80' ] && ! cmp -s '$tmp/tiny' '$tmp/sm80'"

# bad targets: one line, exit 1
for bad in cuda:sm_9 cuda:compute_90 cuda gpu; do
    "$K" compile models/tiny.lua --target "$bad" -o "$tmp/bad" > "$tmp/err" 2>&1; rc=$?
    check "--target $bad: one-line error, exit 1 ($(head -1 "$tmp/err"))" "[ $rc -eq 1 ] && [ \$(wc -l < '$tmp/err') -eq 1 ] && grep -q -- '--target' '$tmp/err'"
done
"$K" run models/tiny.lua --target cuda:sm_90 --data README.md > "$tmp/err" 2>&1; rc=$?
check "kiln run --target cuda: one-line error ($(head -1 "$tmp/err"))" "[ $rc -eq 1 ] && [ \$(wc -l < '$tmp/err') -eq 1 ]"
KILN_CUDA_KERNELS=$tmp/nowhere "$K" compile models/tiny.lua --target cuda:sm_90 -o "$tmp/bad" > "$tmp/err" 2>&1; rc=$?
check "a missing kernels directory: one-line error naming it ($(head -1 "$tmp/err"))" \
    "[ $rc -eq 1 ] && [ \$(wc -l < '$tmp/err') -eq 1 ] && grep -q nowhere '$tmp/err'"
# NVRTC refuses the generated kernels (a cuda_bf16.h that errors): one line
# with NVRTC's log, and the source it refers to kept next to the output
mkdir -p "$tmp/badcuda/include" && echo '#error planted by t_cuda_target.sh' > "$tmp/badcuda/include/cuda_bf16.h"
CUDA_HOME=$tmp/badcuda "$K" compile models/tiny.lua --target cuda:sm_90 -o "$tmp/nv" > "$tmp/err" 2>&1; rc=$?
check "NVRTC's error: one line with its log, the generated source kept ($(cut -c1-150 "$tmp/err" | head -1)...)" \
    "[ $rc -eq 1 ] && [ \$(wc -l < '$tmp/err') -eq 1 ] && grep -q 'planted' '$tmp/err' && grep -q 'the generated source: $tmp/nv.cu' '$tmp/err' && grep -q '__global__' '$tmp/nv.cu'"
# ring attention in bf16: a recv receives the bf16 K,V its send sends
"$K" compile models/tiny.lua --target cuda:sm_90 --cp 2 --cp-comm p2p -o "$tmp/ring" > "$tmp/err" 2>&1
check "--cp 2 --cp-comm p2p compiles for cuda ($(tail -1 "$tmp/err" | cut -c1-120))" "[ -x '$tmp/ring' ]"
"$K" check models/tiny.lua --precision bf16 --cp 2 --cp-comm p2p > "$tmp/chk" 2>&1
check "kiln check --precision bf16 --cp 2 --cp-comm p2p: 0 mismatched ($(grep -o 'worst err [^;]*' "$tmp/chk"))" "grep -q ' 0 mismatched' '$tmp/chk'"
# from another directory: the kernels beside the kiln binary are found
# (without KILN_CUDA_KERNELS; a wrong directory fails the compile)
abs_k=$(cd "$(dirname "$K")" && pwd)/kiln; abs_m=$(pwd)/models/tiny.lua
(cd "$tmp" && env -u KILN_CUDA_KERNELS "$abs_k" compile "$abs_m" --target cuda:sm_90 -o elsewhere > out_elsewhere 2>&1)
check "run from another directory, kiln finds kernels/cuda beside its binary" "[ -x '$tmp/elsewhere' ]"

# one rank, no MPI (issue 23): a single-GPU trainer links comm_single.o and
# no MPI library; a multi-rank one (dp 2, and the ring above) links MPI
mpilibs() { LD_LIBRARY_PATH=$CUDA_HOME_T/lib64/stubs ldd "$1" | grep -Eci 'libmpi|open-rte|open-pal|libpmix|libprrte'; }
CUDA_HOME_T=${CUDA_HOME:-/usr/local/cuda}
check "ldd: the one-rank CUDA trainer needs no MPI library ($(mpilibs "$tmp/tiny") found)" \
    "[ \$(mpilibs '$tmp/tiny') -eq 0 ] && ! readelf -d '$tmp/tiny' | grep -qi mpi && ! nm '$tmp/tiny' | grep -q ' [TU] MPI_'"
"$K" compile models/tiny.lua --target cuda:sm_90 --dp 2 -o "$tmp/dp2" > "$tmp/err" 2>&1
check "ldd: the dp 2 CUDA trainer needs libmpi ($(LD_LIBRARY_PATH=$CUDA_HOME_T/lib64/stubs ldd "$tmp/dp2" 2>/dev/null | grep -o 'libmpi[^ ]*' | head -1))" \
    "[ -x '$tmp/dp2' ] && [ \$(mpilibs '$tmp/dp2') -gt 0 ] && [ \$(mpilibs '$tmp/ring') -gt 0 ]"
# the one-rank comm layer refuses a launcher's world of several: one line,
# exit 1 (on the fake CUDA stack: tests/cuda_fake/build_libs.sh, cached)
tests/cuda_fake/build_libs.sh "$B/cuda_fake" > "$tmp/fakelog" 2>&1 || echo "build_libs.sh failed: $(tail -1 "$tmp/fakelog")"
OMPI_COMM_WORLD_SIZE=2 LD_LIBRARY_PATH=$B/cuda_fake "$tmp/tiny" --data README.md --steps 1 > "$tmp/err" 2>&1; rc=$?
check "the one-rank trainer started as one of 2 processes: one line, exit 1 ($(grep -m1 'one-rank' "$tmp/err" | cut -c1-110))" \
    "[ $rc -ne 0 ] && grep -q 'one-rank trainer (no MPI) launched as one of 2' '$tmp/err'"
