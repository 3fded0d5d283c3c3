#!/usr/bin/env bash
# bench/gpu/check.sh — issue 8's check on a machine with an NVIDIA GPU, in under 8 minutes.
#
# Runs what bench/gpu/prepare.sh built and carried in bench/gpu/out (the
# GPU machine has no LLVM, Lua or OpenBLAS, so kiln cannot be built there;
# on a machine where it can, a missing bundle is prepared first), in order
# of importance, each leg under a time cap, skipping what the remaining
# budget (BUDGET seconds, default 420) cannot fit:
#   1. the GPU (nvidia-smi), the host, and the bf16 GEMM ceiling (torch, 8192^3);
#   2. kcheck: every CUDA library kernel against its CPU twin (kcheck.c);
#   3. tiny.lua, 10 steps: losses against the CPU trainer's (report.py
#      losses: |dloss| <= 0.05 at every step, step-1 grad-norm within 5%,
#      equal learning rates), then again with KILN_NO_GRAPH=1: the same bits,
#      and compiled with --offload all (issue 19: every saved value to host
#      and back on the copy streams): the same bits, and its step time
#      against the plain run's (the offload's overhead);
#   4. GPT-2 124M (batch CHECK_BATCH, seq 1024, lr 1e-4), 10 steps, against the CPU trainer;
#      then kiln calibrate --device cuda's program (bin/calibrate_cuda, issue
#      21): this GPU's profile, $OUT/calibrated.profile;
#   5. speed, GPT-2 124M at batch BATCH, seq 1024, WARM + TIMED steps each:
#      kiln's trainer (median tokens/s of its log after the warm-up), PyTorch
#      eager and torch.compile (gpt2_torch.py: bf16 autocast, fused AdamW,
#      flash SDPA); MFU by one formula for all three (report.py);
#   6. the tensor-core attention (--attention tc, issue 23), cuDNN's
#      (--attention cudnn: the speed kiln's own kernels must beat) and
#      cuBLASLt's epilogues (--gemm-epilogue all: BIAS, GELU_AUX_BIAS,
#      BGRADA, DGELU_BGRAD): tiny.lua's 10 steps against the CPU as in 3,
#      and GPT-2's speed run as in 5;
#   7. a trace: 4 steps of the tc trainer with --trace, summarized by
#      trace_top.py (span, busy share, kernels by time);
#   8. compute-sanitizer, where it is installed: memcheck and racecheck on 2
#      tiny steps (eager: KILN_NO_GRAPH=1), memcheck on kcheck --small.
# They run in this order: kcheck; every loss check (tiny, its graph vs
# eager, tiny_tc, tiny_cudnn, tiny_ep; GPT-2); the speed of kiln_tc, of
# kiln_cudnn and of kiln; the trace; the sanitizers; PyTorch eager and
# torch.compile; kiln_ep's speed.  (The first GPU run took 189 s of the 420.)
# A cuDNN leg (kcheck's cases, the --attention cudnn trainers) whose cuDNN
# is older than kiln's graphs need is a SKIP, not a FAIL.
# It ends with ONE table (report.py table) and leaves under $OUT (the device
# tool's folder; else bench/gpu/out/run-DATE): check.log (everything
# printed), summary.md (the table, for bench/RESULTS.md) and logs.tgz (every
# leg's log, the trainers' JSONL, kcheck's TAP).  Exit status 0 when no leg
# failed (skipped legs and the speed targets count: see the table).
#
# The kiln binaries need the GPU machine's cuBLASLt, NCCL and cuDNN (too big
# to carry): they are looked up in the CUDA toolkit, the system library
# directories and the nvidia-* Python wheels of the image's python3, and
# only the kiln commands run with them (and bench/gpu/out/lib) on
# LD_LIBRARY_PATH, so PyTorch keeps its own.
#
# Settings (environment): BUDGET (420 s), OUT, BUNDLE (bench/gpu/out),
# PYTHON (python3).  For testing this script without a GPU, on the fake
# CUDA stack (tests/cuda_fake; bench/gpu/README.md has the command):
# CHECK_LD_FIRST (directories put first on the kiln binaries' library path:
# the fakes), KCHECK_ARGS (extra kcheck flags: --small), CALIBRATE_ARGS
# (extra calibrate_cuda flags: --small --quick), SKIP_LEGS (an
# extended regex: legs whose name matches are skipped), CAP_SCALE (each
# leg's time cap times this: the emulator is slow), TRACE_BIN and
# TRACE_DATA (the trace leg's trainer and data in place of GPT-2 tc's: a
# tiny trainer on the fakes).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
G=${BUNDLE:-bench/gpu/out}
GIVEN_OUT=${OUT:-}
OUT=${OUT:-$G/run-$(date -u +%Y%m%d-%H%M%S)}
BUDGET=${BUDGET:-420}
PY=${PYTHON:-python3}
L=$OUT/logs
export PYTHONUNBUFFERED=1
mkdir -p "$L" || exit 2

main() {
    T0=$SECONDS
    RES=$L/results.tsv
    : > "$RES"
    echo "bench/gpu/check.sh $(date -u '+%F %T') UTC, budget ${BUDGET}s, logs in $OUT"
    if [ ! -f "$G/manifest.env" ]; then
        if command -v llvm-config-14 > /dev/null && [ -f /usr/lib/x86_64-linux-gnu/liblua5.4.a ]; then
            bash bench/gpu/prepare.sh || { echo "check.sh: prepare.sh failed"; return 2; }
        else
            echo "check.sh: no bundle in $G: run bench/gpu/prepare.sh where kiln builds, and carry $G"
            return 2
        fi
    fi
    # shellcheck disable=SC1091
    . "$G/manifest.env"
    chmod +x "$G"/bin/* 2> /dev/null # in case the carry dropped the modes
    find_libraries
    leg_env
    leg_kcheck
    # correctness first (each a few seconds), then speed, the trace, the
    # sanitizers, the PyTorch peers and the opt-in epilogues
    leg_train tiny "$G/bin/tiny_cuda" "$G/data/corpus.txt" "$TINY_FLAGS"
    leg_nograph
    [ -x "$G/bin/tiny_offload_cuda" ] && leg_same "tiny --offload all vs none" tiny_offload "$G/bin/tiny_offload_cuda"
    [ -x "$G/bin/tiny_tc_cuda" ] && leg_train tiny_tc "$G/bin/tiny_tc_cuda" "$G/data/corpus.txt" "$TINY_FLAGS"
    [ -x "$G/bin/tiny_cudnn_cuda" ] && leg_train tiny_cudnn "$G/bin/tiny_cudnn_cuda" "$G/data/corpus.txt" "$TINY_FLAGS"
    [ -x "$G/bin/tiny_ep_cuda" ] && leg_train tiny_ep "$G/bin/tiny_ep_cuda" "$G/data/corpus.txt" "$TINY_FLAGS"
    leg_train gpt2 "$G/bin/gpt2_check_cuda" "$G/$GPT2_DATA" "$GPT2_FLAGS"
    [ -x "$G/bin/calibrate_cuda" ] && leg_calibrate
    [ -x "$G/bin/gpt2_tc_cuda" ] && leg_speed_kiln kiln_tc "$G/bin/gpt2_tc_cuda" # the fastest kiln today
    [ -x "$G/bin/gpt2_cudnn_cuda" ] && leg_speed_kiln kiln_cudnn "$G/bin/gpt2_cudnn_cuda" # the bar for kiln's attention
    leg_speed_kiln kiln "$G/bin/gpt2_cuda"
    [ -x "${TRACE_BIN:-$G/bin/gpt2_tc_cuda}" ] && leg_trace kiln_tc "${TRACE_BIN:-$G/bin/gpt2_tc_cuda}" "${TRACE_DATA:-$G/$GPT2_DATA}"
    leg_sanitizer
    leg_speed_torch eager 60 150
    leg_speed_torch compile 150 240
    [ -x "$G/bin/gpt2_ep_cuda" ] && leg_speed_kiln kiln_ep "$G/bin/gpt2_ep_cuda" # --gemm-epilogue all
    echo
    echo "== the table (bench/RESULTS.md)"
    REPORT_ENV="BATCH=$BATCH;SEQ=$SEQ" "$PY" bench/gpu/report.py table "$L"
    local rc=$?
    cp "$L/summary.md" "$OUT/summary.md" 2> /dev/null
    echo "kiln $KILN_COMMIT, ${GPT2_TOKENS}; check.sh took $((SECONDS - T0)) s"
    return $rc
}

# ---- bookkeeping ----

record() { # LEG STATUS DETAIL
    printf '%s\t%s\t%s\n' "$1" "$2" "$3" >> "$RES"
    printf '[%4ds] %-30s %-5s %s\n' $((SECONDS - T0)) "$1" "$2" "$3"
}
left() { echo $((BUDGET - (SECONDS - T0))); }
# fits LEG NEED: 0 when NEED seconds are left; else records SKIP
fits() {
    if [ -n "${SKIP_LEGS:-}" ] && [[ $1 =~ $SKIP_LEGS ]]; then
        record "$1" SKIP "SKIP_LEGS"
        return 1
    fi
    if [ "$(left)" -lt "$2" ]; then
        record "$1" SKIP "not started: $(left) s of the budget left, it needs about $2"
        return 1
    fi
}
# cap MAX: the time limit of a leg, MAX (times CAP_SCALE) or what is left of the budget
cap() {
    local l m=$(($1 * ${CAP_SCALE:-1}))
    l=$(left)
    echo $((l < m ? (l > 5 ? l : 5) : m))
}
# k SECONDS CMD...: a kiln binary (or a tool running one) under a time
# limit, with the CUDA libraries on its library path
k() {
    local t=$1
    shift
    timeout -k 5 "$t" env LD_LIBRARY_PATH="$KLD${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$@"
}
# why RC LOG: a short reason from a failed command's log
why() {
    if [ "$1" = 124 ] || [ "$1" = 137 ]; then echo "timed out"; return; fi
    echo "exit $1: $(grep -v '^\s*$' "$2" | tail -2 | tr '\n' ' ' | cut -c1-300)"
}

# fail_or_skip LOG: SKIP when a --attention cudnn run stopped because the
# machine's cuDNN is older than kiln's graphs need (attn_cudnn.c's message;
# the machine's fault, not kiln's), else FAIL
fail_or_skip() {
    if grep -q 'attention (cudnn): cuDNN [0-9]* is older than the [0-9]* these graphs need' "$1"; then echo SKIP; else echo FAIL; fi
}
# failed LEG RC LOG: the row of a failed kiln run (SKIP with attn_cudnn.c's line when fail_or_skip says so)
failed() {
    if [ "$(fail_or_skip "$3")" = SKIP ]; then
        record "$1" SKIP "$(grep -o 'cuDNN [0-9]* is older than the [0-9]* these graphs need' "$3" | head -1) (exit $2)"
    else
        record "$1" FAIL "$(why "$2" "$3")"
    fi
}

# ---- the libraries ----

libdir() { # NAME: the first directory holding NAME
    local d sp f
    for d in "${CUDA_HOME:-/usr/local/cuda}/lib64" /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
        /usr/lib/x86_64-linux-gnu /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib64; do
        [ -e "$d/$1" ] && { echo "$d"; return; }
    done
    for sp in $("$PY" -c 'import site; print(" ".join(site.getsitepackages()))' 2> /dev/null); do
        f=$(find "$sp/nvidia" -name "$1" 2> /dev/null | head -1)
        [ -n "$f" ] && { dirname "$f"; return; }
    done
}

# cudnn_version FILE: the version of a libcudnn.so.9 as cuDNN numbers it
# (9.19.0 -> 91900): its own cudnnGetVersion() (loading the small dispatcher
# needs no GPU), else its file name's (libcudnn.so.9.14.0), else 0
cudnn_version() {
    local v real
    v=$(timeout 20 "$PY" -c 'import ctypes, sys; print(ctypes.CDLL(sys.argv[1]).cudnnGetVersion())' "$1" 2> /dev/null)
    if ! [[ $v =~ ^[0-9]+$ ]]; then
        real=$(readlink -f "$1")
        if [[ $real =~ libcudnn\.so\.([0-9]+)\.([0-9]+)\.([0-9]+)$ ]]; then
            v=$((BASH_REMATCH[1] * 10000 + BASH_REMATCH[2] * 100 + BASH_REMATCH[3]))
        else
            v=0
        fi
    fi
    echo "$v"
}

# The newest libcudnn.so.9 of the machine (the toolkit, the system
# directories, every nvidia-* wheel of $PY), first on the library path: the
# first GPU run (2026-12-04) found cuDNN 9.14 in /usr/lib/x86_64-linux-gnu
# before torch's 9.19 and every cuDNN case failed (kiln's graphs need 9.16).
# Its engine libraries sit in the same directory, so they follow.  When it
# comes from a wheel, the libraries cuDNN itself loads (libcudart,
# libnvrtc, libcublasLt, which kiln's GEMMs use too) come from the same
# Python's nvidia wheels where they are there: the set PyTorch runs with.
find_libraries() {
    KLD=${CHECK_LD_FIRST:+$CHECK_LD_FIRST:}$(cd "$G/lib" && pwd)
    local so d f v missing sp best_v=0 best_d="" seen="" wheels=""
    wheels=$("$PY" -c 'import site; print(" ".join(site.getsitepackages()))' 2> /dev/null)
    for f in $( (for d in "${CUDA_HOME:-/usr/local/cuda}/lib64" /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
        /usr/lib/x86_64-linux-gnu /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib64; do
        [ -e "$d/libcudnn.so.9" ] && echo "$(cd "$d" && pwd -P)/libcudnn.so.9" # one name per real directory
    done
    for sp in $wheels; do find "$sp/nvidia" -name libcudnn.so.9 2> /dev/null; done) | sort -u); do
        v=$(cudnn_version "$f")
        seen="$seen $v:$(dirname "$f")"
        if [ "$v" -gt "$best_v" ]; then best_v=$v; best_d=$(dirname "$f"); fi
    done
    CUDNN_NOTE="none found"
    if [ -n "$best_d" ]; then
        KLD=$KLD:$best_d
        CUDNN_NOTE="$best_v in $best_d (the newest of:$seen)"
    fi
    echo "cuDNN: $CUDNN_NOTE"
    local from_wheel=""
    for sp in $wheels; do [[ $best_d == "$sp"/nvidia/* ]] && from_wheel=$sp; done
    for so in libcublasLt.so.13 libnccl.so.2 libcudart.so.13 libnvrtc.so.13; do
        d=""
        if [ -n "$from_wheel" ] && [ "$so" != libnccl.so.2 ]; then
            f=$(find "$from_wheel/nvidia" -name "$so" 2> /dev/null | head -1)
            [ -n "$f" ] && d=$(dirname "$f")
        fi
        [ -n "$d" ] || d=$(libdir "$so")
        if [ -z "$d" ]; then echo "note: $so not found on this machine"
        elif [[ :$KLD: != *:$d:* ]]; then KLD=$KLD:$d
        fi
    done
    echo "kiln binaries' LD_LIBRARY_PATH: $KLD"
    missing=$(for b in "$G"/bin/*; do k 30 ldd "$b" | grep 'not found'; done | awk '{print $1}' | sort -u | tr '\n' ' ')
    [ -z "$missing" ] || record "libraries" FAIL "not found: $missing"
}

# ---- the legs ----

leg_env() {
    local gpu
    if command -v nvidia-smi > /dev/null; then
        gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv,noheader 2>&1 | head -1)
    else
        gpu="no nvidia-smi on this machine"
    fi
    record "GPU" info "$gpu"
    record "host" info "$(uname -r), glibc $(ldd --version 2> /dev/null | head -1 | awk '{print $NF}'), $(nproc) cores; kiln $KILN_COMMIT, CUDA $CUDA_TOOLKIT ($ARCH cubins)"
    record "cuDNN" info "$CUDNN_NOTE"
    fits "bf16 GEMM ceiling" 20 || return
    local out rc
    out=$(timeout -k 5 "$(cap 60)" "$PY" - 2> "$L/gemm_ceiling.log" << 'EOF'
import torch
n = 8192
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
for _ in range(3):
    a @ b
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
s.record()
for _ in range(10):
    a @ b
e.record()
e.synchronize()
ms = s.elapsed_time(e) / 10
print(f"{2 * n**3 / ms / 1e9:.0f} TFLOP/s (torch {torch.__version__} {n}^3 bf16, random data, mean of 10 after 3)")
EOF
    )
    rc=$?
    if [ $rc = 0 ]; then record "bf16 GEMM ceiling" info "$out"; else record "bf16 GEMM ceiling" info "not measured: $(why $rc "$L/gemm_ceiling.log")"; fi
}

leg_kcheck() {
    fits "kernels (kcheck)" 30 || return
    local rc
    # shellcheck disable=SC2086
    k "$(cap 150)" "$G/bin/kcheck" --cubins "$G/cubins" --arch "$ARCH" ${KCHECK_ARGS:-} > "$L/kcheck.log" 2>&1
    rc=$?
    local summary fails
    summary=$(grep '^kcheck:' "$L/kcheck.log" | tail -1)
    fails=$(grep '^not ok' "$L/kcheck.log" | head -3 | cut -c1-160 | tr '\n' ';')
    if [ $rc = 0 ]; then
        record "kernels (kcheck)" PASS "$summary"
    else
        record "kernels (kcheck)" FAIL "${summary:-$(why $rc "$L/kcheck.log")} $fails"
    fi
}

# leg_train NAME BINARY DATA FLAGS: 10 steps against ref/NAME_cpu.jsonl
leg_train() {
    local leg="$1 loss vs CPU (10 steps)"
    fits "$leg" 20 || return
    local rc
    # shellcheck disable=SC2086
    k "$(cap 120)" "$2" --data "$3" $4 --log "$L/$1_cuda.jsonl" > "$L/$1_cuda.out" 2>&1
    rc=$?
    if [ $rc != 0 ]; then
        failed "$leg" $rc "$L/$1_cuda.out"
        return
    fi
    local verdict
    verdict=$("$PY" bench/gpu/report.py losses "$G/ref/$1_cpu.jsonl" "$L/$1_cuda.jsonl" --steps 10 --tol 0.05 --gn-tol 0.05)
    record "$leg" "${verdict%% *}" "${verdict#* }"
}

# leg_same LEG NAME BINARY [ENV...]: tiny's 10 steps by BINARY (under ENV)
# must give tiny_cuda's losses and grad-norms bit for bit
leg_same() {
    local leg=$1 name=$2 bin=$3
    shift 3
    [ -s "$L/tiny_cuda.jsonl" ] || { record "$leg" SKIP "no tiny_cuda run to compare with"; return; }
    fits "$leg" 15 || return
    local rc
    # shellcheck disable=SC2086
    k "$(cap 60)" env "$@" "$bin" --data "$G/data/corpus.txt" $TINY_FLAGS --log "$L/$name.jsonl" > "$L/$name.out" 2>&1
    rc=$?
    if [ $rc != 0 ]; then
        record "$leg" FAIL "$(why $rc "$L/$name.out")"
        return
    fi
    local verdict
    verdict=$("$PY" bench/gpu/report.py same "$L/tiny_cuda.jsonl" "$L/$name.jsonl")
    record "$leg" "${verdict%% *}" "${verdict#* }"
}
leg_nograph() { leg_same "tiny graph vs KILN_NO_GRAPH=1" tiny_nograph "$G/bin/tiny_cuda" KILN_NO_GRAPH=1; }

# leg_calibrate: kiln calibrate --device cuda's program (issue 21) on this
# GPU, the fields it does not measure from profiles/h200-sxm.profile: the
# profile is $OUT/calibrated.profile (it comes back with the files)
leg_calibrate() {
    local leg="calibrate (cuda profile)"
    fits "$leg" 60 || return
    local rc
    # shellcheck disable=SC2086
    k "$(cap 150)" "$G/bin/calibrate_cuda" --cubins "$G/cubins" --arch "$ARCH" --base profiles/h200-sxm.profile --name gpu-calibrated \
        -o "$OUT/calibrated.profile" ${CALIBRATE_ARGS:-} > "$L/calibrate.log" 2>&1
    rc=$?
    if [ $rc != 0 ]; then
        failed "$leg" $rc "$L/calibrate.log"
        return
    fi
    cp "$OUT/calibrated.profile" "$L/calibrated.profile"
    record "$leg" PASS "$(tail -1 "$L/calibrate.log" | cut -c1-220)"
}

# leg_speed_kiln NAME BINARY: WARM + TIMED steps of GPT-2 at batch BATCH;
# speed_NAME.json for the table (kiln: the default attention, kiln_tc: --attention tc)
leg_speed_kiln() {
    local leg="$1 speed run"
    [ "$1" = kiln ] && leg="kiln speed run"
    fits "$leg" 40 || return
    local rc
    k "$(cap 120)" "$2" --data "$G/$GPT2_DATA" --steps $((WARM + TIMED)) --seed 1337 --print-every 5 \
        --log "$L/$1_speed.jsonl" > "$L/$1_speed.out" 2>&1
    rc=$?
    if [ $rc != 0 ]; then
        failed "$leg" $rc "$L/$1_speed.out"
        return
    fi
    "$PY" bench/gpu/report.py speed "$L/$1_speed.jsonl" --warm "$WARM" > "$L/speed_$1.json"
    record "$leg" PASS "$((WARM + TIMED)) steps, losses $("$PY" -c 'import json,sys; j=json.load(open(sys.argv[1])); print("%.3f -> %.3f" % (j["first_loss"], j["last_loss"]))' "$L/speed_$1.json" 2> /dev/null)"
}

# leg_trace NAME BINARY DATA: 4 traced GPT-2 steps at batch BATCH (--trace:
# eager, CUDA events around every launch), summarized by trace_top.py (the
# first step dropped): trace_top_NAME.txt and the gzipped trace in the logs,
# its first lines (span, busy share, the top kernels) in check.log
leg_trace() {
    local leg="$1 trace (4 steps)" steps=4
    fits "$leg" 30 || return
    local rc
    k "$(cap 90)" "$2" --data "$3" --steps $steps --seed 1337 --print-every 1 --trace "$L/trace_$1.json" \
        > "$L/trace_$1.out" 2>&1
    rc=$?
    if [ $rc != 0 ]; then
        record "$leg" FAIL "$(why $rc "$L/trace_$1.out")"
        return
    fi
    if ! "$PY" bench/gpu/trace_top.py "$L/trace_$1.json" $steps > "$L/trace_top_$1.txt" 2>&1; then
        record "$leg" FAIL "trace_top.py: $(tail -1 "$L/trace_top_$1.txt" | cut -c1-300)"
        return
    fi
    gzip -f "$L/trace_$1.json"
    local head top
    head=$(head -1 "$L/trace_top_$1.txt" | sed 's/^[^:]*: //')
    top=$(sed -n '3,5p' "$L/trace_top_$1.txt" | awk '{printf "%s%s %s ms", (NR > 1 ? ", " : ""), $5, $1}')
    record "$leg" info "$head; top: $top"
    sed -n '1,10p' "$L/trace_top_$1.txt" | sed 's/^/    /'
}

# leg_speed_torch MODE NEED CAP
leg_speed_torch() {
    local leg="PyTorch $1 speed run"
    fits "$leg" "$2" || return
    local rc
    timeout -k 10 "$(cap "$3")" "$PY" bench/gpu/gpt2_torch.py --data "$G/$GPT2_DATA" --mode "$1" --batch "$BATCH" --seq "$SEQ" \
        --warmup "$WARM" --steps "$TIMED" > "$L/speed_$1.json" 2> "$L/torch_$1.log"
    rc=$?
    if [ $rc != 0 ]; then
        record "$leg" FAIL "$(why $rc "$L/torch_$1.log")"
        return
    fi
    record "$leg" PASS "$(tail -c 300 "$L/speed_$1.json" | "$PY" -c 'import json,sys; j=json.loads(sys.stdin.read().splitlines()[-1]); print("losses %.3f -> %.3f, peak %.1f GiB" % (j["first_loss"], j["last_loss"], j["peak_mem_gib"]))' 2> /dev/null)"
}

leg_sanitizer() {
    local cs
    cs=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2> /dev/null | head -1)
    if [ -z "$cs" ]; then
        record "compute-sanitizer" SKIP "not installed"
        return
    fi
    local tool
    for tool in memcheck racecheck; do
        sanitize "$cs" "$tool" "$tool: 2 tiny steps" 45 90 "$G/bin/tiny_cuda" --data "$G/data/corpus.txt" --steps 2 --seed 1337
    done
    sanitize "$cs" memcheck "memcheck: kcheck --small" 60 120 "$G/bin/kcheck" --cubins "$G/cubins" --arch "$ARCH" --small
}

# sanitize CS TOOL LEG NEED CAP CMD...: eager (no graph), errors fail
sanitize() {
    local cs=$1 tool=$2 leg="compute-sanitizer $3" need=$4 max=$5 log
    shift 5
    log=$L/sanitizer_${tool}_$(basename "$1").log
    fits "$leg" "$need" || return
    local rc
    KILN_NO_GRAPH=1 k "$(cap "$max")" "$cs" --tool "$tool" --error-exitcode 9 --print-limit 20 "$@" > "$log" 2>&1
    rc=$?
    local summary
    summary=$(grep -o 'ERROR SUMMARY: .*' "$log" | tail -1)
    if [ $rc = 0 ] && [ -n "$summary" ]; then record "$leg" PASS "$summary"
    else record "$leg" FAIL "${summary:-$(why $rc "$log")}"
    fi
}

main 2>&1 | tee "$OUT/check.log"
rc=${PIPESTATUS[0]}
tar czf "$OUT/logs.tgz" -C "$OUT" logs 2> /dev/null
# under the device tool only a few files come back: keep check.log, summary.md and logs.tgz
[ -n "$GIVEN_OUT" ] && rm -rf "$L"
exit "$rc"
