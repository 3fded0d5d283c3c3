#!/usr/bin/env bash
# kernels/cuda/attention.cu (flash attention forward and backward) run on the
# host CUDA emulator (tests/cuda_emu/emu.h, emu.cpp: a fiber per thread)
# against the double-precision reference in tests/cuda_emu/check_attention.cpp,
# which prints the TAP lines and the measured errors (see its header for the
# cases and tolerances).
#
# The emulator compiles the kernel source as C++ after the two rewrites emu.h
# describes, made to a copy of kernels/cuda in $B/cuda_attn/src: cuda_bf16.h
# is not included (emu.h defines __nv_bfloat16), and the dynamic shared memory
# (common.cuh's extern __shared__ kiln_smem) becomes the launch's region,
# emu_dynamic_smem.  Last, copies of attention.cu with one planted bug each
# (the causal mask kpos <= qpos made <, the sliding window's bound made <=,
# key tiles skipped before the window one key early) must fail the same
# check, which shows that the check can fail.  Output: $B/cuda_attn/
# (BUILD=build).
. "$(dirname "$0")/lib.sh"
OUT=$B/cuda_attn
CXX=${CXX:-g++}

# copy kernels/cuda into $1/src with the emulator's rewrites (failing when
# common.cuh no longer has the lines they expect)
prepare() {
    rm -rf "$1/src" && mkdir -p "$1/src" && cp kernels/cuda/*.cu kernels/cuda/*.cuh "$1/src/" || return 1
    sed -i -e 's/^extern __shared__ __align__(16) unsigned char kiln_smem\[\];/#define kiln_smem emu_dynamic_smem/' \
        -e 's/^#include <cuda_bf16.h>//' "$1/src/common.cuh" || return 1
    if ! grep -q '^#define kiln_smem emu_dynamic_smem' "$1/src/common.cuh" || grep -q 'cuda_bf16' "$1/src/common.cuh"; then
        echo "# common.cuh: the kiln_smem declaration or the cuda_bf16.h include changed shape" >&2
        return 1
    fi
}
# build $1/check_attention against the copy in $1/src (-Wno-unused-function:
# attention.cu leaves common.cuh's block reductions unused)
build() {
    "$CXX" -std=c++17 -O1 -Wall -Wextra -Werror -Wno-unknown-pragmas -Wno-unused-function -Itests/cuda_emu -I"$1/src" -o "$1/check_attention" \
        tests/cuda_emu/check_attention.cpp tests/cuda_emu/emu.cpp
}

mkdir -p "$OUT" || exit 1
if ! prepare "$OUT" || ! build "$OUT" 2>"$OUT/build.log"; then
    sed 's/^/# /' "$OUT/build.log" 2>/dev/null | head -40
    notok "build check_attention against the emulator"
    exit 1
fi
# the check numbers its own TAP lines; renumber them after ours
timeout 300 "$OUT/check_attention" > "$OUT/check.log" 2>&1
rc=$?
while IFS= read -r line; do
    case $line in
        "ok "*) ok "${line#ok * - }" ;;
        "not ok "*) notok "${line#not ok * - }" ;;
        1..*) ;;
        *) echo "$line" ;;
    esac
done < "$OUT/check.log"
[ $rc -eq 0 ] || grep -q '^not ok ' "$OUT/check.log" || notok "check_attention exited $rc"

# planted bugs, each in a copy of attention.cu that must fail the same check:
# causal as kpos < qpos (the diagonal masked); the window's lower edge one key
# too far (qpos - kpos <= W); the key tiles before the window skipped one key
# too early (a tile whose last key is the first of a row's window)
mutant() { # name, sed expression
    M=$OUT/mutant-$1
    mkdir -p "$M"
    if prepare "$M" && sed -i "$2" "$M/src/attention.cu" && ! cmp -s kernels/cuda/attention.cu "$M/src/attention.cu" &&
        build "$M" 2>"$M/build.log"; then
        timeout 300 "$M/check_attention" > "$M/check.log" 2>&1
        mrc=$?
        caught=$(grep -c '^not ok ' "$M/check.log")
        if [ $mrc -ne 0 ] && [ "$caught" -gt 0 ]; then
            ok "a planted bug ($1) fails $caught checks"
        else
            notok "a planted bug ($1) is not caught"
        fi
    else
        notok "build the planted-bug copy ($1)"
    fi
}
mutant "causal mask kpos < qpos" '0,/return k <= qp \&\& /s//return k < qp \&\& /'
mutant "window qpos - kpos <= W" '0,/(long long)qp - k < wl;/s//(long long)qp - k <= wl;/'
mutant "key tiles skipped at distance W-1" 's/att_pos_max(kpos, s0, n) >= wl) continue;/att_pos_max(kpos, s0, n) >= wl - 1) continue;/'
