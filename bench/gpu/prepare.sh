#!/usr/bin/env bash
# bench/gpu/prepare.sh — build, here, everything bench/gpu/check.sh runs on a GPU machine.
#
# kiln cross-compiles (DESIGN §6): `kiln compile --target cuda:sm_90` needs
# NVRTC but no GPU, and the trainer it writes needs only the CUDA libraries
# (a one-rank trainer links no MPI: runtime/comm_single.c, issue 23).  The GPU
# machine has neither LLVM nor Lua nor OpenBLAS, so everything is built on
# this machine and carried there in one folder, bench/gpu/out (git-ignored;
# the device tool's `carry`):
#   bin/tiny_cuda        models/tiny.lua (defaults: batch 8, seq 64)
#   bin/gpt2_check_cuda  models/gpt2.lua, batch CHECK_BATCH (1), seq 1024: the loss check
#   bin/gpt2_cuda        models/gpt2.lua, batch BATCH (32), seq 1024: the speed run
#   bin/tiny_tc_cuda, bin/gpt2_tc_cuda   the same with --attention tc (the
#                        tensor-core attention, kernels/cuda/attention_tc.cu)
#   bin/tiny_offload_cuda  tiny.lua with --offload all (every saved value over
#                        1 byte to host and back, one stage: issue 19's GPU check,
#                        bit for bit against tiny_cuda)
#   bin/tiny_cudnn_cuda, bin/gpt2_cudnn_cuda   the same with --attention cudnn
#                        (cuDNN's fused flash attention: the speed kiln's own
#                        kernels must beat; needs cuDNN >= 9.16 there)
#   bin/tiny_ep_cuda, bin/gpt2_ep_cuda   the same with --gemm-epilogue all
#                        (cuBLASLt's forward and backward epilogues, opt-in until checked here)
#   bin/kcheck           the kernel checker (kcheck.c), linked like a CUDA trainer
#   bin/calibrate_cuda   kiln calibrate --device cuda's program (compiler/cmd/
#                        calibrate_cuda.c), one rank: the GPU's profile (issue 21)
#   cubins/*.cubin       the library kernels, compiled as kiln compile embeds them (cubins.c)
#   ref/*_cpu.jsonl      the CPU trainers' logs on the same programs, weights,
#                        batches and schedule: the loss references
#   data/                the token data (GPT-2 BPE shards of the demo corpus
#                        when the BPE files are here, else its bytes; tiny: bytes)
#   lib/                 the shared libraries the binaries need that a CUDA
#                        image lacks (none since the one-rank trainers and
#                        kcheck link no MPI; kept for what may come); not the
#                        driver, cuBLASLt, cuDNN or NCCL, far over the carry
#                        limit: check.sh finds the GPU machine's own
#   manifest.env         what was built, from which commit, with which settings
# The CPU reference for GPT-2 is the slow part (10 steps of 1 x 1024 tokens
# in f32 on this 2-core machine: minutes); it is cached in $B/gpubench-ref
# by the SHA-256 of the CPU trainer binary, the data and the flags (the
# codegen is deterministic, so an unchanged tree reuses it).
#
# Settings (environment): BUILD (build-gpubench), ARCH (sm_90), BATCH (32),
# CHECK_BATCH (1), WARM (5) and TIMED (20) steps of the speed run.
# Ends with the bundle's size (the carry limit is 64 MiB with the working
# tree) and the exact device call to make.
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${BUILD:-build-gpubench}
G=bench/gpu/out
ARCH=${ARCH:-sm_90}
BATCH=${BATCH:-32}
CHECK_BATCH=${CHECK_BATCH:-1}
WARM=${WARM:-5}
TIMED=${TIMED:-20}
SEQ=1024
# the loss checks: 10 steps, no warmup and a long schedule (the learning rate
# nearly constant from step 1, so the losses move at once); tiny at its
# compiled lr (3e-3), GPT-2 at 1e-4 (llm.c's test_gpt2 rate: at 6e-4 from
# step 1 its batch-1 steps spike, grad-norm 340 at step 3, and the runs
# would compare chaos)
TINY_FLAGS="--steps 10 --seed 1337 --warmup 0 --schedule-steps 1000 --print-every 1"
GPT2_FLAGS="$TINY_FLAGS --lr 1e-4"
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
say() { printf '\n== %s\n' "$*"; }
die() { echo "prepare.sh: $*" >&2; exit 1; }

say "building kiln and both runtimes in $B"
make -s -j2 BUILD="$B" "$B/kiln" "$B/runtime/trainer_main.o" "$B/libkilnrt.a" "$B/libkilnrt_cuda.a" "$B/runtime/comm_single.o" "$B/runtime/comm_mpi.o" "$B/libkilnc.a" "$B/corpus.txt" "$B/compiler/cmd/calibrate_cuda.o" "$B/compiler/profile.o"
# the flags kiln links trainers with (the Makefile's, so kcheck links the same way)
mkvar() { make -s --no-print-directory BUILD="$B" --eval 'print-%: ; @echo $($*)' "print-$1"; }
RT_CUDA1_LIBS=$(mkvar RT_CUDA1_LIBS) # one rank: no MPI
RT_LIBS=$(mkvar RT_LIBS)
CFLAGS=(-std=c11 -D_GNU_SOURCE -O2 -g -Wall -Wextra -Wno-unused-parameter -Icompiler -Icompiler/emit -Iruntime -Iruntime/cpu -Iruntime/cuda -Iruntime/io "-I$CUDA_HOME/include")

rm -rf "$G"
mkdir -p "$G/bin" "$G/lib" "$G/ref" "$G/data" "$G/cubins"
W=$B/gpubench
mkdir -p "$W/twins" "$B/gpubench-ref"

say "data"
cp "$B/corpus.txt" "$G/data/corpus.txt"
BPE=
for d in "$B/gpt2-bpe" build/gpt2-bpe build-*/gpt2-bpe; do
    [ -f "$d/encoder.json" ] && [ -f "$d/vocab.bpe" ] && { BPE=$d; break; }
done
if [ -n "$BPE" ]; then
    "$B/kiln" data "$G/data/corpus.txt" -o "$G/data/gpt2" --bpe "$BPE"
    rm -f "$G"/data/gpt2_val_*.bin
    GPT2_DATA=data/$(cd "$G/data" && ls gpt2_train_*.bin | head -1)
    GPT2_TOKENS="GPT-2 BPE of the demo corpus ($BPE)"
else
    GPT2_DATA=data/corpus.txt
    GPT2_TOKENS="bytes of the demo corpus (no GPT-2 BPE files here: make bpe)"
fi
echo "GPT-2 data: $G/$GPT2_DATA, $GPT2_TOKENS"

say "trainers (kiln compile --target cuda:$ARCH, and the CPU references)"
# (--emit cuda: the generated kernels' source, for the fake CUDA stack's registry)
"$B/kiln" compile models/tiny.lua --target "cuda:$ARCH" --emit cuda -o "$G/bin/tiny_cuda"
mv "$G/bin/tiny_cuda.cu" "$W/tiny_cuda.cu"
"$B/kiln" compile models/tiny.lua --target cpu -o "$W/tiny_cpu"
"$B/kiln" compile models/gpt2.lua --target "cuda:$ARCH" --set batch="$CHECK_BATCH" -o "$G/bin/gpt2_check_cuda"
"$B/kiln" compile models/gpt2.lua --target cpu --set batch="$CHECK_BATCH" -o "$W/gpt2_check_cpu"
"$B/kiln" compile models/gpt2.lua --target "cuda:$ARCH" --set batch="$BATCH" -o "$G/bin/gpt2_cuda"
"$B/kiln" compile models/tiny.lua --target "cuda:$ARCH" --attention tc -o "$G/bin/tiny_tc_cuda"
"$B/kiln" compile models/gpt2.lua --target "cuda:$ARCH" --attention tc --set batch="$BATCH" -o "$G/bin/gpt2_tc_cuda"
"$B/kiln" compile models/tiny.lua --target "cuda:$ARCH" --attention cudnn -o "$G/bin/tiny_cudnn_cuda"
"$B/kiln" compile models/gpt2.lua --target "cuda:$ARCH" --attention cudnn --set batch="$BATCH" -o "$G/bin/gpt2_cudnn_cuda"
"$B/kiln" compile models/tiny.lua --target "cuda:$ARCH" --offload all --offload-min-bytes 1 -o "$G/bin/tiny_offload_cuda"
"$B/kiln" compile models/tiny.lua --target "cuda:$ARCH" --gemm-epilogue all -o "$G/bin/tiny_ep_cuda"
"$B/kiln" compile models/gpt2.lua --target "cuda:$ARCH" --gemm-epilogue all --set batch="$BATCH" -o "$G/bin/gpt2_ep_cuda"

say "CPU reference losses (10 steps each; GPT-2 takes minutes unless cached)"
# reference NAME BINARY DATA FLAGS: ref/NAME_cpu.jsonl, from the cache when the binary, data and flags are the same
reference() {
    local key
    key=$(cat "$2" "$3" <(echo "$4") | sha256sum | cut -c1-16)
    local cached=$B/gpubench-ref/$1-$key.jsonl
    if [ ! -s "$cached" ]; then
        local t0=$SECONDS
        # shellcheck disable=SC2086
        "$2" --data "$3" $4 --log "$cached.tmp" > "$W/$1_cpu.out"
        mv "$cached.tmp" "$cached"
        echo "$1: computed in $((SECONDS - t0)) s (cached as $cached)"
    else
        echo "$1: cached ($cached)"
    fi
    cp "$cached" "$G/ref/$1_cpu.jsonl"
}
reference tiny "$W/tiny_cpu" "$G/data/corpus.txt" "$TINY_FLAGS"
cp "$G/ref/tiny_cpu.jsonl" "$G/ref/tiny_tc_cpu.jsonl" # the same CPU program: --attention is CUDA's choice
cp "$G/ref/tiny_cpu.jsonl" "$G/ref/tiny_ep_cpu.jsonl" # and --gemm-epilogue
cp "$G/ref/tiny_cpu.jsonl" "$G/ref/tiny_cudnn_cpu.jsonl"
reference gpt2 "$W/gpt2_check_cpu" "$G/$GPT2_DATA" "$GPT2_FLAGS"

say "kcheck: cubins, CPU twins, link"
gcc "${CFLAGS[@]}" -o "$W/cubins" bench/gpu/cubins.c "$B/libkilnc.a" -L"$CUDA_HOME/lib64" -Wl,-rpath,"$CUDA_HOME/lib64" -lnvrtc
"$W/cubins" "$ARCH" "$G/cubins" > "$W/cubins.out"
# the CPU twins keep their code but not their names: rtk_X -> cpu_rtk_X, and
# rt_fail / rt_parallel_for -> kcheck's (kcheck.c explains)
RENAME="-Drt_fail=kc_cpu_fail -Drt_parallel_for=kc_cpu_parallel_for"
for k in $(grep -o 'void rtk_[a-z0-9_]*(' runtime/kiln_rt.h | sed 's/void \(rtk_[a-z0-9_]*\)(/\1/'); do
    RENAME="$RENAME -D$k=cpu_$k"
done
rm -f "$W"/twins/*.o
for f in kernels/cpu/*.c; do
    [ "$(basename "$f")" = gemm.c ] && continue # OpenBLAS; kcheck has its own f64 reference
    # shellcheck disable=SC2086
    gcc "${CFLAGS[@]}" $RENAME -c "$f" -o "$W/twins/$(basename "$f" .c).o"
done
# kcheck's tensor-core attention twin tiles the keys as the kernel does (its running max decides how P rounds)
atc_bk=$(sed -n 's/^#define ATC_BK \([0-9]*\).*/\1/p' kernels/cuda/attention_tc.cu)
kc_bk=$(sed -n 's/^enum { KC_ATC_BK = \([0-9]*\) };.*/\1/p' bench/gpu/kcheck.c)
[ -n "$atc_bk" ] && [ "$atc_bk" = "$kc_bk" ] || die "kcheck.c's KC_ATC_BK ($kc_bk) is not attention_tc.cu's ATC_BK ($atc_bk): make them equal"
gcc "${CFLAGS[@]}" -c bench/gpu/kcheck.c -o "$W/kcheck.o"
# shellcheck disable=SC2086
# (-u: kcheck refers to cuDNN's attention weakly, which alone pulls nothing out of an archive)
gcc -o "$G/bin/kcheck" -Wl,-u,rtk_attention_cudnn -Wl,-u,rtk_attention_bwd_cudnn -Wl,-u,rtk_attention_tc -Wl,-u,rtk_attention_bwd_tc "$W/kcheck.o" "$W"/twins/*.o \
    "$B/runtime/comm_single.o" "$B/libkilnrt_cuda.a" $RT_CUDA1_LIBS
# the harness's self-test: the same cases with the CPU runtime as the "GPU"
# shellcheck disable=SC2086
gcc -o "$W/kcheck_cpu" "$W/kcheck.o" "$W"/twins/*.o "$B/libkilnrt.a" $RT_LIBS
"$W/kcheck_cpu" --cpu --small > "$W/kcheck_cpu.out" || { tail -5 "$W/kcheck_cpu.out"; die "kcheck --cpu (the harness self-test) failed: $W/kcheck_cpu.out"; }
tail -1 "$W/kcheck_cpu.out"

say "calibrate_cuda: kiln calibrate --device cuda's program, one rank (no MPI)"
# shellcheck disable=SC2086
gcc -o "$G/bin/calibrate_cuda" "$B/compiler/cmd/calibrate_cuda.o" "$B/compiler/profile.o" "$B/runtime/comm_single.o" "$B/libkilnrt_cuda.a" $RT_CUDA1_LIBS

say "shared libraries to carry"
# what the binaries load, minus the C library (the GPU image's own, newer),
# the driver, and the CUDA libraries that image has (found there by check.sh)
skip='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|libpthread\.|librt\.|libresolv\.|libgcc_s\.|libstdc\+\+\.|libcuda\.|libcublas|libcudnn|libnccl|libnvrtc|libcudart)'
for b in "$G"/bin/*; do
    LD_LIBRARY_PATH=$CUDA_HOME/lib64/stubs ldd "$b" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
    [[ $name =~ $skip ]] && continue
    cp -L "$path" "$G/lib/$name"
done
ls "$G/lib"
# a single-GPU trainer needs no MPI (issue 23): refuse a bundle that would
for b in "$G"/bin/*; do
    ! LD_LIBRARY_PATH=$CUDA_HOME/lib64/stubs ldd "$b" | grep -qi 'libmpi' || die "$b needs libmpi (a one-rank CUDA binary must not)"
done

say "manifest"
{
    echo "# written by bench/gpu/prepare.sh $(date -u '+%F %T') UTC on $(uname -n)"
    echo "KILN_COMMIT='$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . 2>/dev/null || echo +dirty)'"
    echo "ARCH='$ARCH' BATCH='$BATCH' CHECK_BATCH='$CHECK_BATCH' SEQ='$SEQ' WARM='$WARM' TIMED='$TIMED'"
    echo "TINY_FLAGS='$TINY_FLAGS'"
    echo "GPT2_FLAGS='$GPT2_FLAGS'"
    echo "GPT2_DATA='$GPT2_DATA' # relative to the bundle"
    echo "GPT2_TOKENS='$GPT2_TOKENS'"
    echo "CUDA_TOOLKIT='$("$CUDA_HOME/bin/nvcc" --version 2>/dev/null | grep -o 'release [0-9.]*' || echo unknown)'"
} > "$G/manifest.env"
cat "$G/manifest.env"

say "bundle"
du -sh "$G"
size=$(du -sm "$G" | cut -f1)
[ "$size" -lt 60 ] || echo "WARNING: $G is ${size} MiB; the device tool carries 64 MiB with the working tree"
echo "ready: run on the GPU machine (device tool): command 'bash bench/gpu/check.sh', carry [\"$G\"], timeout_s 480"
