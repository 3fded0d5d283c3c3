#!/usr/bin/env bash
# build_libs.sh DIR — the fake CUDA stack in DIR: libcuda.so.1 (fake_cuda.c),
# libcublasLt.so.13 (fake_cublaslt.c) and libnccl.so.2 (fake_nccl.c), with
# the real libraries' sonames (and, for cuBLASLt, its symbol version
# libcublasLt.so.13), so that a program linked against the real ones runs
# on them with LD_LIBRARY_PATH=DIR.  The cuBLASLt and NCCL fakes need the
# fake driver (kiln_fake_cuda_enqueue); their RUNPATH $ORIGIN finds it.
# Nothing is rebuilt when DIR/fakes.key matches a hash of the sources, this
# script and the compiler's version; DIR/fakes.lock (flock) makes two builds
# take turns.  One line on failure, exit 1.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
CC=${CC:-gcc}
CUDA=${CUDA_HOME:-/usr/local/cuda}
[ $# -eq 1 ] || { echo "usage: build_libs.sh DIR" >&2; exit 1; }
dir=$1
mkdir -p "$dir" || exit 1
exec 9> "$dir/fakes.lock" && flock 9 || { echo "build_libs.sh: cannot lock $dir/fakes.lock" >&2; exit 1; }
key=$( { "$CC" --version | head -1; cat "$0" "$HERE"/fake_cuda.c "$HERE"/fake_cublaslt.c "$HERE"/fake_nccl.c \
    "$HERE"/fake_cuda.h "$HERE"/fake_kernels.h; } | sha256sum | cut -d' ' -f1)
if [ "$(cat "$dir/fakes.key" 2>/dev/null)" = "$key" ] && [ -f "$dir/libcuda.so.1" ] && [ -f "$dir/libcublasLt.so.13" ] &&
    [ -f "$dir/libnccl.so.2" ]; then
    echo "build_libs.sh: $dir is up to date"
    exit 0
fi
FLAGS=(-std=c11 -D_GNU_SOURCE -O2 -g -fPIC -shared -Wall -Wextra -Werror -I"$CUDA/include" -I"$HERE" -Wl,-z,defs)
rm -f "$dir/fakes.key"
"$CC" "${FLAGS[@]}" -Wl,-soname,libcuda.so.1 -o "$dir/libcuda.so.1" "$HERE/fake_cuda.c" -ldl -lpthread \
    > "$dir/build.log" 2>&1 || { echo "build_libs.sh: libcuda.so.1: $(head -c 2000 "$dir/build.log")" >&2; exit 1; }
printf 'libcublasLt.so.13 { global: cublasLt*; local: *; };\n' > "$dir/cublasLt.map"
"$CC" "${FLAGS[@]}" -Wl,-soname,libcublasLt.so.13 -Wl,--version-script="$dir/cublasLt.map" -o "$dir/libcublasLt.so.13" \
    "$HERE/fake_cublaslt.c" -L"$dir" -l:libcuda.so.1 -lm -Wl,-rpath,'$ORIGIN' \
    > "$dir/build.log" 2>&1 || { echo "build_libs.sh: libcublasLt.so.13: $(head -c 2000 "$dir/build.log")" >&2; exit 1; }
"$CC" "${FLAGS[@]}" -Wl,-soname,libnccl.so.2 -o "$dir/libnccl.so.2" "$HERE/fake_nccl.c" -L"$dir" -l:libcuda.so.1 \
    -Wl,-rpath,'$ORIGIN' > "$dir/build.log" 2>&1 ||
    { echo "build_libs.sh: libnccl.so.2: $(head -c 2000 "$dir/build.log")" >&2; exit 1; }
echo "$key" > "$dir/fakes.key"
echo "build_libs.sh: built $dir/libcuda.so.1 libcublasLt.so.13 libnccl.so.2"
