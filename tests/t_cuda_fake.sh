#!/usr/bin/env bash
# The CUDA trainer without a GPU: the fake CUDA stack (tests/cuda_fake/:
# libcuda.so.1, libcublasLt.so.13, libnccl.so.2 on the host, kernels run by
# the fiber emulator tests/cuda_emu) checked on its own, then used to run
# `kiln compile --target cuda:sm_90`'s trainer against the CPU trainer.
#  1. build the fakes (build_libs.sh) and the library kernels' registry
#     (build_kernels.sh kernels/cuda/*.cu), cached in $B/cuda_fake (a hash of
#     their inputs; a warm run rebuilds nothing);
#  2. symbols: every symbol a fake exports exists, with the same version, in
#     the real library (the driver stub, the toolkit's cuBLASLt and NCCL),
#     and every symbol that the self-test (and later the trainer) imports
#     from the real three is exported by the fakes;
#  3. tests/cuda_fake/selftest.c, linked against the REAL libraries and run
#     on the fakes (LD_BIND_NOW=1, KILN_FAKE_CUDA_STRICT=1): its TAP lines,
#     renumbered, are ours (driver, a real NVRTC cubin of layernorm.cu vs a
#     double reference, cuBLASLt vs a naive GEMM, graph capture + replay,
#     NCCL with one rank, the error paths; see its header);
#  4. strict mode: a leak and a double free make the exit status 1; a
#     kernel library whose kiln_layernorm_fwd takes other parameters than
#     the cubin's (a stale library) is refused by cuModuleGetFunction;
#  5. the trainer, once `kiln compile models/tiny.lua --target cuda:sm_90`
#     works (until then "ok N - # SKIP"): compile it with --emit cuda, build
#     the generated kernels' registry from T.cu, run STEPS steps on the fakes
#     with the CUDA graph and with KILN_NO_GRAPH=1, both under
#     KILN_FAKE_CUDA_STRICT=1 (new device memory is NaN; a leak fails) and
#     KILN_FAKE_CUDA_PROFILE=1 (which says whether a graph was instantiated
#     and how many streams it has).  When the graph has more than one stream
#     it is also replayed in the reverse dependency order
#     (KILN_FAKE_CUDA_GRAPH_ORDER=reverse: a missing event between two
#     streams changes the result); tiny.lua on one rank has one stream (the
#     comm stream needs --dp, more ranks than the fake NCCL has), so that
#     run is a SKIP today.  The runs must give the same losses and gradient
#     norms bit for bit (the fake is serial and every kernel deterministic),
#     and match the CPU trainer's (f32) at every step within bf16
#     tolerances: loss |cuda - cpu| <= 2^-8 |cpu|, gradient norm <= 2^-6
#     |cpu| (the CUDA program keeps activations and weights in bf16, 8
#     significant bits; measured on this model over 8 steps: loss 1.5e-4,
#     gradient norm 1.7e-3 relative);
#  6. a planted bug must fail that comparison: kiln_adamw without its bias
#     correction, built alone into a library listed first in
#     KILN_FAKE_CUDA_KERNELS (the first library with a kernel wins).
# tiny.lua is compiled with batch 2 and seq 32: the emulator runs a 256-
# thread block as 256 fibers, ~0.5 s of CPU a step at that size.
# Run time, warm: 40-65 s on this shared 2-core machine (about 25 s of CPU;
# the same under `make SAN=1`, see fake_longjmp.cpp); a cold build of the
# kernel registries adds ~30-50 s.
set -u
cd "$(dirname "$0")/.." || exit 1
B=${BUILD:-build}
K=$B/kiln
F=$B/cuda_fake
CUDA=${CUDA_HOME:-/usr/local/cuda}
STEPS=${STEPS:-6}
SHAPE=(--set batch=2 --set seq=32)
LOSS_RTOL=0.00390625 # 2^-8
NORM_RTOL=0.015625   # 2^-6
n=0
say() { n=$((n + 1)); if [ "$1" = 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; fi; }
skip() { n=$((n + 1)); echo "ok $n - # SKIP $1"; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
mkdir -p "$F" || exit 1
start=$SECONDS

# ---- 1. the fakes and the library kernels ----
if tests/cuda_fake/build_libs.sh "$F" > "$tmp/log" 2>&1; then
    say 0 "fake libcuda.so.1, libcublasLt.so.13, libnccl.so.2 built ($(tail -1 "$tmp/log" | sed 's/^build_libs.sh: //'))"
else
    say 1 "build the fakes: $(tr '\n' ' ' < "$tmp/log" | head -c 1500)"; echo "1..$n"; exit 1
fi
t0=$SECONDS
if tests/cuda_fake/build_kernels.sh kernels/cuda/*.cu -o "$F/libkernels.so" > "$tmp/log" 2>&1; then
    say 0 "kernel registry of kernels/cuda/*.cu: $(tail -1 "$tmp/log" | sed 's/^build_kernels.sh: //') ($((SECONDS - t0)) s)"
else
    say 1 "kernel registry of kernels/cuda/*.cu: $(tr '\n' ' ' < "$tmp/log" | head -c 1500)"; echo "1..$n"; exit 1
fi

# ---- 2. symbols ----
# name@version of what a library defines / a binary imports
defined() { nm -D --defined-only --with-symbol-versions "$1" | awk '$2 ~ /^[TWiV]$/ { sub(/@@/, "@", $3); print $3 }' | sort -u; }
imported() { nm -D --undefined-only --with-symbol-versions "$1" | awk '{ sub(/@@/, "@", $2); print $2 }' | sort -u; }
REAL_CUDA=$CUDA/lib64/stubs/libcuda.so REAL_LT=$CUDA/lib64/libcublasLt.so.13 REAL_NCCL=$CUDA/lib64/libnccl.so.2
defined "$REAL_CUDA" > "$tmp/real_cuda"; defined "$REAL_LT" > "$tmp/real_lt"; defined "$REAL_NCCL" > "$tmp/real_nccl"
cat "$tmp/real_cuda" "$tmp/real_lt" "$tmp/real_nccl" | sort -u > "$tmp/real_all"
{ defined "$F/libcuda.so.1"; defined "$F/libcublasLt.so.13"; defined "$F/libnccl.so.2"; } | sort -u > "$tmp/fake_all"
bad=""
for pair in "libcuda.so.1:real_cuda" "libcublasLt.so.13:real_lt" "libnccl.so.2:real_nccl"; do
    lib=${pair%%:*} real=${pair##*:}
    extra=$(defined "$F/$lib" | grep -v '^kiln_fake_' | comm -23 - "$tmp/$real" | tr '\n' ' ')
    [ -z "$extra" ] || bad="$bad $lib exports what the real one lacks: $extra;"
done
nexports=$(grep -vc '^kiln_fake_' "$tmp/fake_all")
[ -z "$bad" ] && say 0 "the fakes' $nexports exports all exist in the real libraries, same names and versions (e.g. $(grep -m1 '^cublasLtMatmul@' "$tmp/fake_all"))" ||
    say 1 "exports:$bad"
# missing_imports BIN: what BIN imports from the real three that the fakes lack
missing_imports() { imported "$1" | comm -12 - "$tmp/real_all" | comm -23 - "$tmp/fake_all" | tr '\n' ' '; }

# ---- 3. the self-test ----
ST=$F/selftest
if [ ! -x "$ST" ] || [ tests/cuda_fake/selftest.c -nt "$ST" ] || [ compiler/nvrtc_compile.c -nt "$ST" ] ||
    [ compiler/nvrtc_compile.h -nt "$ST" ]; then
    gcc -std=c11 -D_GNU_SOURCE -O1 -g -Wall -Wextra -Werror -Icompiler -I"$CUDA/include" -o "$ST" tests/cuda_fake/selftest.c \
        compiler/nvrtc_compile.c -L"$CUDA/lib64/stubs" -lcuda -L"$CUDA/lib64" -lcublasLt -lnccl -lnvrtc \
        -Wl,-rpath,"$CUDA/lib64" -lpthread -ldl -lm > "$tmp/log" 2>&1 ||
        { say 1 "build selftest: $(head -c 1500 "$tmp/log")"; echo "1..$n"; exit 1; }
fi
miss=$(missing_imports "$ST")
[ -z "$miss" ] && say 0 "selftest (linked against the real libraries) imports nothing the fakes lack" || say 1 "selftest imports what the fakes lack: $miss"
fake_env=(env LD_BIND_NOW=1 LD_LIBRARY_PATH="$F" KILN_FAKE_CUDA_KERNELS="$F/libkernels.so")
t0=$SECONDS
timeout 120 "${fake_env[@]}" KILN_FAKE_CUDA_STRICT=1 "$ST" > "$tmp/out" 2> "$tmp/err"; rc=$?
awk -v n="$n" '/^(not )?ok [0-9]+ /{ sub(/ok [0-9]+ /, "ok " ++n " ") } !/^1\.\.[0-9]+$/' "$tmp/out"
n=$((n + $(grep -c -E '^(not )?ok [0-9]+ ' "$tmp/out")))
if [ "$rc" -ne 0 ] && ! grep -q '^not ok' "$tmp/out"; then
    say 1 "selftest exited $rc with no failed line (crash, timeout or strict-mode leak): $(tail -3 "$tmp/err" | tr '\n' ' ')"
fi
echo "# selftest: $(grep -c '^ok' "$tmp/out") checks in $((SECONDS - t0)) s; its stderr (the fakes' expected error lines) has $(wc -l < "$tmp/err") lines"

# ---- 4. strict mode ----
"${fake_env[@]}" KILN_FAKE_CUDA_STRICT=1 "$ST" leak > /dev/null 2> "$tmp/err"; rc1=$?
"${fake_env[@]}" "$ST" leak > /dev/null 2>&1; rc2=$?
grep -q 'leak: 1 device allocations (1000 bytes)' "$tmp/err"; found=$?
[ $rc1 = 1 ] && [ $rc2 = 0 ] && [ $found = 0 ] && say 0 "KILN_FAKE_CUDA_STRICT=1: a leaked allocation is reported and exits 1 (0 without it)" ||
    say 1 "strict leak: exit $rc1 (want 1), without strict $rc2 (want 0), report found: $found (0 = yes): $(head -c 500 "$tmp/err")"
"${fake_env[@]}" KILN_FAKE_CUDA_STRICT=1 "$ST" double-free > /dev/null 2> "$tmp/err"; rc1=$?
grep -q '1 bad frees' "$tmp/err"; found=$?
[ $rc1 = 1 ] && [ $found = 0 ] && say 0 "KILN_FAKE_CUDA_STRICT=1: a double free fails (CUDA_ERROR_INVALID_VALUE), is reported and exits 1" ||
    say 1 "strict double free: exit $rc1 (want 1; 3 = the second cuMemFree succeeded), report found: $found: $(head -c 500 "$tmp/err")"

# ---- 4b. a kernel library that does not match the cubin ----
# a kiln_layernorm_fwd with other parameters, listed first, must be refused
# by cuModuleGetFunction (the cubin's .nv.info parameter table is read)
printf '%s\n' '/* a stale kernel: the cubin'"'"'s has 7 parameters */' \
    'extern "C" __global__ void kiln_layernorm_fwd(const float *x, int n) { (void)x; (void)n; }' > "$tmp/stale_layernorm.cu"
if ! tests/cuda_fake/build_kernels.sh "$tmp/stale_layernorm.cu" -o "$F/libstale.so" > "$tmp/log" 2>&1; then
    say 1 "stale kernel library: build: $(tr '\n' ' ' < "$tmp/log" | head -c 1000)"
else
    got=$("${fake_env[@]}" KILN_FAKE_CUDA_KERNELS="$F/libstale.so:$F/libkernels.so" "$ST" getfn kiln_layernorm_fwd 2> "$tmp/err")
    good=$("${fake_env[@]}" "$ST" getfn kiln_layernorm_fwd 2>/dev/null)
    [ "$got" = CUDA_ERROR_INVALID_IMAGE ] && [ "$good" = CUDA_SUCCESS ] && grep -q 'parameter sizes (7: 8 8 8 8 8 8 8) differ' "$tmp/err" &&
        say 0 "a kernel library whose kiln_layernorm_fwd has other parameters than the cubin's: refused ($got, $(grep -o 'the cubin.s parameter sizes.*kernel.s ([^)]*)' "$tmp/err"))" ||
        say 1 "stale kernel library: got '$got' (want CUDA_ERROR_INVALID_IMAGE), the right one '$good': $(head -c 600 "$tmp/err")"
fi

# ---- 5. the CUDA trainer on the fakes vs the CPU trainer ----
T=$tmp/tiny_cuda
DATA=$tmp/data.txt # one copy for every run: README.md may change while the test runs
cp README.md "$DATA" || exit 1
if ! "$K" compile models/tiny.lua "${SHAPE[@]}" --target cuda:sm_90 --emit cuda -o "$T" > "$tmp/log" 2>&1; then
    why=$(grep -m1 -i 'kiln\|error' "$tmp/log" | head -c 200)
    for what in "tiny.lua compiled for cuda:sm_90" "generated kernels' registry" "CUDA trainer, graph" \
        "CUDA trainer, KILN_NO_GRAPH=1" "CUDA trainer, graph replayed in the reverse order" "graph vs KILN_NO_GRAPH=1 bits" \
        "CUDA vs CPU losses" "planted bug"; do
        skip "$what: kiln compile --target cuda:sm_90 does not work yet ($why)"
    done
    echo "# $((SECONDS - start)) s"
    echo "1..$n"
    exit 0
fi
miss=$(missing_imports "$T")
[ -z "$miss" ] && say 0 "tiny.lua (batch 2, seq 32) compiled for cuda:sm_90; the trainer imports nothing the fakes lack" || say 1 "the CUDA trainer imports what the fakes lack: $miss"
t0=$SECONDS
if tests/cuda_fake/build_kernels.sh "$T.cu" -o "$F/libtiny_generated.so" > "$tmp/log" 2>&1; then
    say 0 "generated kernels' registry (--emit cuda): $(tail -1 "$tmp/log" | sed 's/^build_kernels.sh: //') ($((SECONDS - t0)) s)"
else
    say 1 "generated kernels' registry: $(tr '\n' ' ' < "$tmp/log" | head -c 1500)"
fi
# "loss grad_norm" per step of a trainer's JSON log
losses() { sed 's/.*"loss":\([^,]*\),.*"grad_norm":\([^,]*\),.*/\1 \2/' "$1" 2>/dev/null; }
# run_trainer NAME ENV...: STEPS steps on the fakes; "loss grad_norm" lines in $tmp/NAME.loss
run_trainer() {
    local name=$1; shift
    local t0=$SECONDS
    timeout 600 env LD_BIND_NOW=1 LD_LIBRARY_PATH="$F" KILN_FAKE_CUDA_KERNELS="$F/libkernels.so:$F/libtiny_generated.so" \
        KILN_FAKE_CUDA_STRICT=1 "$@" "$T" --data "$DATA" --steps "$STEPS" --log "$tmp/$name.log" > "$tmp/$name.out" 2>&1
    local rc=$?
    losses "$tmp/$name.log" > "$tmp/$name.loss"
    if [ $rc -eq 0 ] && [ "$(wc -l < "$tmp/$name.loss")" = "$STEPS" ]; then
        say 0 "CUDA trainer, $name: $STEPS steps on the fakes in $((SECONDS - t0)) s, losses $(cut -d' ' -f1 "$tmp/$name.loss" | tr '\n' ' ')"
    else
        say 1 "CUDA trainer, $name: exit $rc, $(wc -l < "$tmp/$name.loss" 2>/dev/null || echo 0) log lines: $(grep -v '^ok' "$tmp/$name.out" | tail -5 | tr '\n' ' ' | head -c 1500)"
    fi
}
run_trainer graph KILN_FAKE_CUDA_PROFILE=1
run_trainer eager KILN_NO_GRAPH=1 KILN_FAKE_CUDA_PROFILE=1
if ! grep -q 'fake cuda: graph:' "$tmp/graph.out" || grep -q 'fake cuda: graph:' "$tmp/eager.out"; then
    say 1 "the graph run instantiated no CUDA graph, or the KILN_NO_GRAPH=1 run did: the comparison below means nothing"
fi
# the reverse replay order only reorders work of different streams
graph_line=$(grep -m1 'fake cuda: graph:' "$tmp/graph.out" | sed 's/^fake cuda: graph: //')
if grep -q 'fake cuda: graph: [0-9]* ops on 1 streams' "$tmp/graph.out"; then
    skip "CUDA trainer, graph replayed in the reverse order: the program's graph ($graph_line) has one stream, nothing to reorder (multi-stream programs need --dp, more ranks than the fake NCCL has)"
    variants=eager
else
    run_trainer reverse KILN_FAKE_CUDA_GRAPH_ORDER=reverse
    variants="eager reverse"
fi
same=1
for v in $variants; do cmp -s "$tmp/graph.loss" "$tmp/$v.loss" || same=0; done
[ $same = 1 ] && [ -s "$tmp/graph.loss" ] && say 0 "graph and $(echo "$variants" | sed 's/eager/KILN_NO_GRAPH=1/; s/ reverse/ and reverse-order replay/'): the same losses and gradient norms, bit for bit" ||
    say 1 "graph / $variants losses differ: $(paste -d' ' "$tmp/graph.loss" "$tmp/eager.loss" | tr '\n' ';')"

"$K" compile models/tiny.lua "${SHAPE[@]}" --target cpu -o "$tmp/tiny_cpu" > "$tmp/log" 2>&1 &&
    "$tmp/tiny_cpu" --data "$DATA" --steps "$STEPS" --log "$tmp/cpu.log" > /dev/null 2>&1
losses "$tmp/cpu.log" > "$tmp/cpu.loss"
# compare NAME: 0 when NAME's losses and gradient norms are within the bf16
# tolerances of the CPU's at every step; the worst differences in $worst
compare() {
    local wl wn
    wl=$(paste -d' ' "$tmp/$1.loss" "$tmp/cpu.loss" | worst 1) wn=$(paste -d' ' "$tmp/$1.loss" "$tmp/cpu.loss" | worst 2)
    worst="loss $wl (tolerance 2^-8), gradient norm $wn (2^-6)"
    [ "$wl" != missing ] && [ "$wn" != missing ] &&
        awk -v a="$wl" -v b="$wn" -v ta="$LOSS_RTOL" -v tb="$NORM_RTOL" 'BEGIN { exit !(a <= ta && b <= tb) }'
}
# worst relative difference of column C (1 loss, 2 gradient norm) of "cuda cuda cpu cpu" lines
worst() {
    awk -v n="$STEPS" -v c="$1" '
        NF == 4 { d = $c - $(c + 2); if (d < 0) d = -d; r = d / ($(c + 2) < 0 ? -$(c + 2) : $(c + 2)); if (r > w) w = r; k++ }
        END { if (k != n) print "missing"; else printf "%.2e", w }'
}
if compare graph; then
    say 0 "CUDA (bf16, fakes) vs CPU (f32) over $STEPS steps: worst relative difference $worst"
else
    say 1 "CUDA vs CPU: worst relative difference $worst: cuda $(tr '\n' ';' < "$tmp/graph.loss") cpu $(tr '\n' ';' < "$tmp/cpu.loss")"
fi

# a planted bug must fail that comparison: AdamW without its first-moment
# bias correction, in a one-kernel library listed first (it overrides)
MUTANT_FROM='(mi * s.ibc1)' MUTANT_TO='(mi)'
mkdir -p "$tmp/mutant" && cp kernels/cuda/adamw.cu kernels/cuda/*.cuh "$tmp/mutant/"
if [ "$(grep -cF "$MUTANT_FROM" "$tmp/mutant/adamw.cu")" != 1 ]; then
    say 1 "planted bug: adamw.cu no longer has '$MUTANT_FROM' exactly once (pick another bug to plant)"
elif ! { perl -pi -e "s/\Q$MUTANT_FROM\E/$MUTANT_TO/" "$tmp/mutant/adamw.cu" &&
    tests/cuda_fake/build_kernels.sh "$tmp/mutant/adamw.cu" -o "$F/libmutant_adamw.so" > "$tmp/log" 2>&1; }; then
    say 1 "planted bug: build: $(tr '\n' ' ' < "$tmp/log" | head -c 1000)"
else
    timeout 600 env LD_LIBRARY_PATH="$F" KILN_FAKE_CUDA_KERNELS="$F/libmutant_adamw.so:$F/libkernels.so:$F/libtiny_generated.so" \
        "$T" --data "$DATA" --steps "$STEPS" --log "$tmp/mutant.log" > "$tmp/mutant.out" 2>&1
    losses "$tmp/mutant.log" > "$tmp/mutant.loss"
    if [ "$(wc -l < "$tmp/mutant.loss")" = "$STEPS" ] && ! compare mutant; then
        say 0 "planted bug (AdamW without bias correction, overriding kiln_adamw) caught: $worst"
    else
        say 1 "planted bug (AdamW without bias correction) NOT caught: $worst; $(tail -2 "$tmp/mutant.out" | tr '\n' ' ')"
    fi
fi
echo "# $((SECONDS - start)) s"
echo "1..$n"
