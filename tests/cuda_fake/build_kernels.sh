#!/usr/bin/env bash
# build_kernels.sh SRC.cu... -o LIB.so — a library of emulated CUDA kernels
# for the fake libcuda.so.1 (fake_cuda.c; the interface is fake_kernels.h).
#
# What it builds.  Each SRC.cu is copied to LIB.so.d/src/ (with the .cuh
# headers next to it) and given the host-emulation rewrites that
# tests/cuda_emu/emu.h describes and tests/t_cuda_emu.sh makes:
#   - `#include <cuda_bf16.h>` becomes a comment (emu.h has the types);
#   - a dynamic shared-memory declaration `extern __shared__ [__align__(n)]
#     TYPE NAME[];` becomes `#define NAME ((TYPE *)emu_dynamic_smem)`.
# An `extern __shared__` or `#include <...>` left afterwards fails the build
# loudly (the sources changed shape; this script must follow).  Then, per
# source, a registration file LIB.so.d/reg_FILE.cpp includes emu.h,
# fake_register.hpp and the rewritten copy, and names each
# `extern "C" __global__ void [__launch_bounds__(N...)] NAME(` of the file in a
# KILN_FAKE_KERNEL(NAME, N) line (N = 1024 without launch bounds).  A
# `__global__` that this pattern does not match fails the build too.  The
# parameter types are not parsed: fake_register.hpp deduces them from the
# function.  Each file is its own translation unit (no clash between two
# files' static helpers); they are compiled with g++ -O2 -fPIC in parallel
# and linked with emu.cpp and fake_registry.cpp into LIB.so, which exports
# only kiln_fake_kernels (a version script makes the rest, the emulator's
# state included, local).  LIB.so.kernels lists the kernels found.  The
# emulator's _longjmp calls are wrapped (fake_longjmp.cpp) to reach libc's
# own: in an ASan trainer the interceptor made every fiber switch a system
# call.
#
# Cache: LIB.so.key holds a hash of everything the library depends on (the
# sources and their headers, the emulator, this directory's registry files,
# this script, the compiler's version); when it matches, nothing is rebuilt.
# LIB.so.lock (flock) makes two builds of one library take turns.
#
# Use: the fake driver loads the libraries in $KILN_FAKE_CUDA_KERNELS
# (colon separated), e.g.
#   tests/cuda_fake/build_kernels.sh kernels/cuda/*.cu -o build/fake/libkernels.so
#   tests/cuda_fake/build_kernels.sh model.cu -o build/fake/libmodel.so
#   KILN_FAKE_CUDA_KERNELS=build/fake/libkernels.so:build/fake/libmodel.so ...
# Exit status 0 on success; on failure one line saying why (and the
# compiler's first lines).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
EMU=$(cd "$HERE/../cuda_emu" && pwd)
CXX=${CXX:-g++}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}
die() { echo "build_kernels.sh: $*" >&2; exit 1; }

srcs=() out=
while [ $# -gt 0 ]; do
    case $1 in
        -o) [ $# -ge 2 ] || die "-o needs a file"; out=$2; shift 2 ;;
        -*) die "unknown option $1 (usage: build_kernels.sh SRC.cu... -o LIB.so)" ;;
        *) srcs+=("$1"); shift ;;
    esac
done
[ -n "$out" ] || die "no output (usage: build_kernels.sh SRC.cu... -o LIB.so)"
[ ${#srcs[@]} -gt 0 ] || die "no sources (usage: build_kernels.sh SRC.cu... -o LIB.so)"
for s in "${srcs[@]}"; do [ -f "$s" ] || die "$s: no such file"; done
work=$out.d
mkdir -p "$(dirname "$out")" || die "cannot create $(dirname "$out")"
exec 9> "$out.lock" && flock 9 || die "cannot lock $out.lock" # two builds of one library take turns

# ---- the cache key ----
key_inputs() {
    local s d
    printf '%s\n' "$("$CXX" --version | head -1)"
    cat "$0" "$EMU/emu.h" "$EMU/emu.cpp" "$HERE/fake_register.hpp" "$HERE/fake_kernels.h" "$HERE/fake_registry.cpp" \
        "$HERE/fake_longjmp.cpp"
    for s in "${srcs[@]}"; do
        printf '== %s\n' "$(basename "$s")"; cat "$s"
        d=$(dirname "$s")
        for h in "$d"/*.cuh "$d"/*.h; do [ -f "$h" ] && { printf '== %s\n' "$h"; cat "$h"; }; done
    done
}
key=$(key_inputs | sha256sum | cut -d' ' -f1) || die "cannot hash the inputs"
if [ -f "$out" ] && [ "$(cat "$out.key" 2>/dev/null)" = "$key" ]; then
    echo "build_kernels.sh: $out is up to date ($(wc -l < "$out.kernels") kernels)"
    exit 0
fi

# ---- host copies ----
rm -rf "$work" && mkdir -p "$work/src" "$work/obj" || die "cannot create $work"
for s in "${srcs[@]}"; do
    b=$(basename "$s")
    [ -e "$work/src/$b" ] && die "two sources named $b"
    cp "$s" "$work/src/$b" || die "cannot copy $s"
    for h in "$(dirname "$s")"/*.cuh; do
        [ -f "$h" ] && [ ! -e "$work/src/$(basename "$h")" ] && { cp "$h" "$work/src/" || die "cannot copy $h"; }
    done
done
for f in "$work"/src/*; do
    perl -pi -e '
        s{^\s*#\s*include\s*<cuda_bf16\.h>.*$}{/* #include <cuda_bf16.h>: host emulation, emu.h defines __nv_bfloat16 */};
        s{^\s*extern\s+__shared__\s+(?:__align__\s*\(\s*\d+\s*\)\s+)?([A-Za-z_][\w ]*?)\s+(\w+)\s*\[\s*\]\s*;\s*$}{#define $2 (($1 *)emu_dynamic_smem) /* host emulation */\n};
    ' "$f" || die "cannot rewrite $f"
done
left=$(grep -n -E 'extern[[:space:]]+__shared__|^[[:space:]]*#[[:space:]]*include[[:space:]]*<' "$work"/src/* | head -5)
[ -z "$left" ] || die "lines the host emulation does not rewrite: $left"

# ---- registration files: one per source, one line per kernel ----
: > "$work/kernels"
for s in "${srcs[@]}"; do
    b=$(basename "$s")
    reg=$work/reg_${b%.*}.cpp
    # prints "NAME<TAB>MAX_THREADS" per kernel; fails when a __global__ is not understood
    if ! perl -0777 -ne '
        s{/\*.*?\*/}{ }gs; s{//[^\n]*}{}g;                   # comments out
        my $globals = () = /\b__global__\b/g;
        my $found = 0;
        while (/extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\s*\(((?:[^()]|\([^()]*\))*)\)\s*)?([A-Za-z_]\w*)\s*\(/g) {
            my ($bounds, $name) = ($1, $2);
            my $max = 1024;
            if (defined $bounds) { ($max) = split /,/, $bounds; $max =~ s/^\s+|\s+$//g; }
            print "$name\t$max\n"; $found++;
        }
        if ($found != $globals) { print STDERR "$ARGV: $globals __global__ but $found extern \"C\" __global__ void kernels understood\n"; exit 1; }
    ' "$work/src/$b" > "$work/list" 2> "$work/why"; then
        die "$(cat "$work/why")"
    fi
    {
        echo "// generated by tests/cuda_fake/build_kernels.sh from $s: its kernels for the fake driver"
        echo '#include "emu.h"'
        echo '#include "fake_register.hpp"'
        echo "#include \"$b\""
        while IFS=$'\t' read -r name max; do echo "KILN_FAKE_KERNEL($name, $max)"; done < "$work/list"
    } > "$reg"
    cat "$work/list" >> "$work/kernels"
done
dups=$(cut -f1 "$work/kernels" | sort | uniq -d | head -3)
[ -z "$dups" ] || die "kernels defined twice: $dups"

# ---- compile (in parallel) and link ----
CXXFLAGS=(-std=c++17 -O2 -g0 -fPIC -fvisibility=hidden -fvisibility-inlines-hidden -Wall -Wno-unknown-pragmas
          -Wno-unused-function -Wno-unused-variable -I"$EMU" -I"$HERE" -I"$work/src")
units=("$EMU/emu.cpp" "$HERE/fake_registry.cpp" "$HERE/fake_longjmp.cpp" "$work"/reg_*.cpp)
pids=() objs=()
for u in "${units[@]}"; do
    o=$work/obj/$(basename "${u%.*}").o
    objs+=("$o")
    "$CXX" "${CXXFLAGS[@]}" -c "$u" -o "$o" > "$o.log" 2>&1 &
    pids+=($!)
    if [ ${#pids[@]} -ge "$JOBS" ]; then wait "${pids[0]}"; pids=("${pids[@]:1}"); fi
done
wait
for o in "${objs[@]}"; do
    [ -s "$o" ] || die "compile failed for $(basename "${o%.o}"): $(head -c 3000 "$o.log")"
done
printf '{ global: kiln_fake_kernels; local: *; };\n' > "$work/exports.map"
"$CXX" -shared -o "$out.tmp" "${objs[@]}" -Wl,--version-script="$work/exports.map" -Wl,-z,defs -Wl,--wrap=_longjmp -ldl \
    > "$work/link.log" 2>&1 ||
    die "link failed: $(head -c 3000 "$work/link.log")"
mv "$out.tmp" "$out" && cp "$work/kernels" "$out.kernels" && echo "$key" > "$out.key" || die "cannot write $out"
echo "build_kernels.sh: $out: $(wc -l < "$out.kernels") kernels from ${#srcs[@]} files"
