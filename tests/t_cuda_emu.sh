#!/usr/bin/env bash
# The CUDA library kernels (kernels/cuda/*.cu) run on the host emulator
# (tests/cuda_emu/emu.h: one fiber per CUDA thread) and compared with
# double-precision references (tests/cuda_emu/check.cpp), since this machine
# has no GPU.  Steps:
#  1. copy kernels/cuda/ to $B/cuda_emu/src and make the two host-emulation
#     rewrites emu.h describes: the dynamic shared-memory declaration in
#     common.cuh becomes `#define kiln_smem emu_dynamic_smem`, and each
#     `#include <cuda_bf16.h>` becomes a comment.  Either rewrite failing,
#     or any `extern __shared__` or `#include <...>` left afterwards, fails
#     the test loudly: the kernels changed shape and this script (or emu.h)
#     must follow;
#  2. build emu.cpp and check.cpp with g++ -std=c++17 -Wall -Werror
#     (-Wno-unknown-pragmas: g++ does not know NVRTC's `#pragma unroll`);
#  3. run the check: its TAP lines, renumbered, are this script's;
#  4. show the check can fail: a copy of embedding.cu whose scatter ranks a
#     key among the HIGHER lanes with the same digit (an unstable sort: the
#     gradient rows are then added out of order, a change of a few f32 bits)
#     must give at least one "not ok".  The real sources are never touched;
#  5. the same for misc.cu (copy, sumto, reduce, softmax, sumsq, fill, iota,
#     attn_merge, ...): tests/cuda_emu/check_misc.cpp, built with
#     -Wno-unused-function (misc.cu leaves some of common.cuh's block
#     reductions unused), run, and shown able to fail with a copy of misc.cu
#     whose attn_merge drops its __syncwarp (lane 0 then stores the merged
#     lse before the other lanes have read lse_a: wrong in place).
#  5b. xent_fused.cu (issue 23, the fused classifier): its cases run in
#     check.cpp (family xent_fused); two planted bugs (the target's logit
#     read after the barriers, wrong in place; no one-hot term).
#  6. dropout.cu (issue 17): tests/cuda_emu/check_dropout.cpp against
#     runtime/rng.h (the CPU's masks), shown able to fail with a copy whose
#     hash reads the local token index instead of pos[] (what would break
#     context parallel's equality).
#  7. tensor cores (issue 23): tests/cuda_emu/check_mma.cpp (the emulator's
#     mma.sync and ldmatrix against plain matrix products and the PTX
#     layouts), check_attention_tc.cpp (kernels/cuda/attention_tc.cu, forward
#     and backward, against the double reference), and eight planted bugs:
#     mma's A fragment index in a copy of emu.h; in copies of the kernel,
#     P's A fragment index, the forward without its barrier after a key tile
#     (the double buffer's) and without its cp.async wait, dkdv's
#     accumulator row index, dkdv and dq without their barrier after a
#     tile, and the forward's causal diagonal tile taken as unmasked.
# About 25 s on this 2-core machine (four g++ builds of ~3 s, the checks ~6 s).
# To rerun one family after a build: $B/cuda_emu/check rope, or
# $B/cuda_emu/check_misc sumto (see check.cpp, check_misc.cpp).
. "$(dirname "$0")/lib.sh"
D=$B/cuda_emu
CXX=(g++ -std=c++17 -O1 -Wall -Wextra -Wno-unknown-pragmas -Werror)
mkdir -p "$D"

SMEM_DECL='extern __shared__ __align__(16) unsigned char kiln_smem[];'
SMEM_HOST='#define kiln_smem emu_dynamic_smem /* host emulation: tests/t_cuda_emu.sh */'
BF16_INCLUDE='#include <cuda_bf16.h>'
BF16_HOST='/* #include <cuda_bf16.h>: host emulation, emu.h defines __nv_bfloat16 */'

# replace_line FILE OLD NEW: replace the lines equal to OLD; how many it replaced
replace_line() {
    local file=$1 old=$2 new=$3 count=0 line
    local out=$file.new
    : > "$out" || return 1
    while IFS= read -r line || [ -n "$line" ]; do
        if [ "$line" = "$old" ]; then line=$new; count=$((count + 1)); fi
        printf '%s\n' "$line" >> "$out"
    done < "$file"
    mv "$out" "$file" && echo "$count"
}

# replace_text FILE OLD NEW: replace OLD, which must occur exactly once, by NEW
replace_text() {
    local file=$1 old=$2 new=$3 text rest
    text=$(< "$file") || return 1
    rest=${text//"$old"/}
    [ $(( (${#text} - ${#rest}) / ${#old} )) = 1 ] || return 1
    printf '%s\n' "${text/"$old"/"$new"}" > "$file"
}

# host_copy DIR: kernels/cuda/ copied to DIR and rewritten; prints why not and fails
host_copy() {
    local dir=$1 f left
    rm -rf "$dir" && mkdir -p "$dir" && cp kernels/cuda/*.cu kernels/cuda/*.cuh "$dir"/ || return 1
    [ "$(replace_line "$dir/common.cuh" "$SMEM_DECL" "$SMEM_HOST")" = 1 ] ||
        { echo "common.cuh no longer has exactly one line '$SMEM_DECL'"; return 1; }
    for f in "$dir"/*.cu "$dir"/*.cuh; do replace_line "$f" "$BF16_INCLUDE" "$BF16_HOST" > /dev/null || return 1; done
    left=$(grep -n -E 'extern[[:space:]]+__shared__|^[[:space:]]*#[[:space:]]*include[[:space:]]*<' "$dir"/*.cu "$dir"/*.cuh)
    [ -z "$left" ] || { echo "lines the host emulation does not rewrite: $left"; return 1; }
}

# build SRC_DIR OUT: check.cpp against the kernel copies in SRC_DIR
build() { "${CXX[@]}" -I"$1" tests/cuda_emu/check.cpp "$D/emu.o" -o "$2"; }
# build_misc SRC_DIR OUT: check_misc.cpp the same way
build_misc() { "${CXX[@]}" -Wno-unused-function -I"$1" tests/cuda_emu/check_misc.cpp "$D/emu.o" -o "$2"; }

# run_check NAME BINARY ARGS...: its TAP lines, renumbered after ours
run_check() {
    local name=$1 start=$SECONDS rc
    shift
    timeout 120 "$@" > "$tmp/out" 2>&1; rc=$?
    awk -v n="$n" '/^(not )?ok [0-9]+ /{ sub(/ok [0-9]+ /, "ok " ++n " ") } !/^1\.\.[0-9]+$/' "$tmp/out"
    n=$((n + $(grep -c -E '^(not )?ok [0-9]+ ' "$tmp/out")))
    if [ "$rc" -ne 0 ] && ! grep -q '^not ok' "$tmp/out"; then
        say 1 "$name exited $rc with no failed line (crash or timeout; rc 124 = timeout)"
    fi
    echo "# $name ran in $((SECONDS - start)) s"
}

# plant FILE FROM TO WHAT BUILDER FAMILY: a host copy with FROM replaced by TO
# in FILE must fail the check (run on FAMILY only)
plant() {
    local file=$1 from=$2 to=$3 what=$4 builder=$5 family=$6 rc caught first
    if ! host_copy "$tmp/mutant" > "$tmp/why" 2>&1; then
        say 1 "planted bug: host copy: $(tr '\n' ' ' < "$tmp/why")"
    elif ! replace_text "$tmp/mutant/$file" "$from" "$to"; then
        say 1 "planted bug: $file no longer has '$from' exactly once (pick another bug to plant)"
    elif ! "$builder" "$tmp/mutant" "$tmp/check_mutant" > "$tmp/log" 2>&1; then
        say 1 "planted bug: build:"; head -20 "$tmp/log"
    else
        timeout 60 "$tmp/check_mutant" "$family" > "$tmp/mutant.out" 2>&1; rc=$?
        caught=$(grep -c '^not ok' "$tmp/mutant.out")
        first=$(grep -m1 '^not ok' "$tmp/mutant.out" | sed 's/^not ok [0-9]* - //')
        if [ "$rc" -ne 0 ] && [ "$caught" -gt 0 ]; then
            say 0 "planted bug ($what) caught by $caught 'not ok', e.g. $first"
        else
            say 1 "planted bug ($what) NOT caught (rc $rc, $caught 'not ok')"
        fi
    fi
}

start=$SECONDS
if ! host_copy "$D/src" > "$tmp/why" 2>&1; then
    say 1 "host copies of kernels/cuda: $(tr '\n' ' ' < "$tmp/why")"; exit 1
fi
if "${CXX[@]}" -c tests/cuda_emu/emu.cpp -o "$D/emu.o" > "$tmp/log" 2>&1 && build "$D/src" "$D/check" >> "$tmp/log" 2>&1; then
    say 0 "host copies of kernels/cuda, emulator and check built (g++ -Wall -Werror, $((SECONDS - start)) s)"
else
    say 1 "build the emulator and the check:"; head -40 "$tmp/log"; exit 1
fi

# the check; its numbers follow ours
run_check check "$D/check"

# a planted bug must be caught
plant embedding.cu '__popc(peers & ((1u << lane) - 1u))' '__popc(peers & ~((2u << lane) - 1u))' \
    "embedding scatter ranks among higher lanes: unstable sort" build embedding

# misc.cu: its check, then a planted bug
start=$SECONDS
if build_misc "$D/src" "$D/check_misc" > "$tmp/log" 2>&1; then
    say 0 "check_misc built ($((SECONDS - start)) s)"
    run_check check_misc "$D/check_misc"
else
    say 1 "build check_misc:"; head -40 "$tmp/log"
fi
plant misc.cu '        __syncwarp();' '' "attn_merge without its __syncwarp: lse stored before all lanes read it" build_misc attn_merge
# the fused classifier (xent_fused.cu, issue 23): its cases are in check.cpp
# (family xent_fused); planted bugs: the target's logit read after the lse's
# barriers (in place, its column may already hold its gradient), and the
# gradient without the one-hot term
plant xent_fused.cu '        float xt = bad ? 0.0f : kiln_ld(x, t); /* before the barriers: dx may be x */
        float L = fused_row_lse(x, V), d = dl[r * dl_stride];' '        float L = fused_row_lse(x, V), d = dl[r * dl_stride];
        float xt = bad ? 0.0f : kiln_ld(x, t);' "xent_fused reads the target logit after the barriers: wrong in place" build xent_fused
plant xent_fused.cu '    if (i == t) g -= d;' '    (void)i, (void)t;' "xent_fused without the one-hot term of the gradient" build xent_fused
# dropout.cu: the CPU's masks (runtime/rng.h), then a planted bug (issue 17)
build_dropout() { "${CXX[@]}" -Wno-unused-function -Wno-unused-parameter -I"$1" -Iruntime tests/cuda_emu/check_dropout.cpp "$D/emu.o" -o "$2"; }
if build_dropout "$D/src" "$D/check_dropout" > "$tmp/log" 2>&1; then
    say 0 "check_dropout built"
    run_check check_dropout "$D/check_dropout"
else
    say 1 "build check_dropout:"; head -40 "$tmp/log"
fi
plant dropout.cu '(unsigned int)pos[bt % T]' '(unsigned int)(bt % T)' "dropout hashes the local token index, not pos[]" build_dropout dropout
# tensor cores (issue 23): the emulator's mma.sync / ldmatrix against plain
# matrix products (check_mma.cpp), then attention_tc.cu against the double
# reference (check_attention_tc.cpp); planted bugs: a fragment index in a
# copy of emu.h (mma's A layout), a fragment index in the kernel (P's A
# fragment), and the kernel without its barrier before staging a key tile
build_mma() { "${CXX[@]}" -Wno-unused-function -I"$1" tests/cuda_emu/check_mma.cpp "$D/emu.o" -o "$2"; }
build_atc() { "${CXX[@]}" -Wno-unused-function -I"$1" tests/cuda_emu/check_attention_tc.cpp "$D/emu.o" -o "$2"; }
start=$SECONDS
if build_mma "$D/src" "$D/check_mma" > "$tmp/log" 2>&1 && build_atc "$D/src" "$D/check_attention_tc" >> "$tmp/log" 2>&1; then
    say 0 "check_mma and check_attention_tc built ($((SECONDS - start)) s)"
    run_check check_mma "$D/check_mma"
    run_check check_attention_tc "$D/check_attention_tc"
else
    say 1 "build check_mma / check_attention_tc:"; head -40 "$tmp/log"
fi
# the emulator's own layout planted wrong: a copy of emu.h (and the check
# beside it, so that its #include "emu.h" finds the copy)
mkdir -p "$tmp/emu_mutant" && cp tests/cuda_emu/emu.h tests/cuda_emu/check_mma.cpp "$tmp/emu_mutant/"
if ! replace_text "$tmp/emu_mutant/emu.h" 'A[g][2 * t + 8 + h] = hi ? emu_bf16_hi(o.a[2]) : emu_bf16_lo(o.a[2]);' \
    'A[g][2 * t + 8 + h] = hi ? emu_bf16_hi(o.a[1]) : emu_bf16_lo(o.a[1]);'; then
    say 1 "planted bug: emu.h no longer has mma's a[2] line exactly once"
elif ! "${CXX[@]}" -Wno-unused-function -I"$D/src" "$tmp/emu_mutant/check_mma.cpp" "$D/emu.o" -o "$tmp/check_mma_mutant" > "$tmp/log" 2>&1; then
    say 1 "planted bug (emu.h): build:"; head -20 "$tmp/log"
else
    timeout 60 "$tmp/check_mma_mutant" > "$tmp/mutant.out" 2>&1; rc=$?
    caught=$(grep -c '^not ok' "$tmp/mutant.out")
    [ "$rc" -ne 0 ] && [ "$caught" -gt 0 ] && say 0 "planted bug (emu.h: mma reads A[g][2t+8] from a[1], not a[2]) caught by $caught 'not ok'" ||
        say 1 "planted bug (emu.h: mma's A fragment index) NOT caught (rc $rc, $caught 'not ok')"
fi
plant attention_tc.cu '{kiln_pack_bf16(x[2 * s][0], x[2 * s][1]), kiln_pack_bf16(x[2 * s][2], x[2 * s][3]),' \
    '{kiln_pack_bf16(x[2 * s][0], x[2 * s][1]), kiln_pack_bf16(x[2 * s + 1][0], x[2 * s + 1][1]),' \
    "attention_tc: P's A fragment a[1] from n-tile 2s+1 instead of rows g+8 of 2s" build_atc basic
plant attention_tc.cu "            __syncthreads(); /* the next tile is in; every warp is done with this one */" '' \
    "attention_tc forward without the barrier after a key tile (double-buffered)" build_atc basic
plant attention_tc.cu '            atc_cp_wait_all();
            __syncthreads(); /* the next tile is in; every warp is done with this one */' \
    '            __syncthreads(); /* the next tile is in; every warp is done with this one */' \
    "attention_tc forward without waiting for its cp.async copies of the next key tile" build_atc basic
plant attention_tc.cu 'return !kpos && s0 + ATC_BK - 1 <= t0 && (wl == ATC_NOWIN' \
    'return !kpos && s0 <= t0 && (wl == ATC_NOWIN' \
    "attention_tc forward: the causal diagonal tile taken as full (no element masks)" build_atc basic
plant attention_tc.cu 'const int key = k0 + g + 8 * (i >> 1), qi = j * 8 + 2 * t + (i & 1);' \
    'const int key = k0 + g + 8 * (i & 1), qi = j * 8 + 2 * t + (i & 1);' \
    "attention_tc dkdv: the accumulator's row (key) read from the column bit" build_atc bwd
plant attention_tc.cu "            __syncthreads(); /* the next query tile is in; every warp is done with this one */" '' \
    "attention_tc dkdv without the barrier after a query tile (double-buffered)" build_atc bwd
plant attention_tc.cu "            __syncthreads(); /* the next key tile is in; every warp is done with this one */" '' \
    "attention_tc dq without the barrier after a key tile (double-buffered)" build_atc bwd
echo "1..$n"
