#!/usr/bin/env bash
# The tensor-core attention in a trainer (issue 23): `kiln compile
# --attention tc --target cuda:sm_90` sends attention with head dim 16, 32,
# 64 or 128 to rtk_attention_tc / rtk_attention_bwd_tc
# (kernels/cuda/attention_tc.cu; other head dims keep attention.cu), and the
# trainer runs on the fake CUDA stack (tests/cuda_fake: its kernels on the
# emulator, whose mma.sync / ldmatrix follow the PTX layouts) with the same
# loss curve as the CPU trainer within t_cuda_fake.sh's bf16 tolerances
# (loss 2^-8, gradient norm 2^-6 relative, every step).  A planted bug (a
# fragment index in a copy of attention_tc.cu, in a library listed first)
# must break that comparison.  Flag errors are one line.
. "$(dirname "$0")/lib.sh"
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-$tmp/cache} # tests/run.sh: the run's, shared
F=$B/cuda_fake
STEPS=${STEPS:-6}
SHAPE=(--set batch=2 --set seq=32)
LOSS_RTOL=0.00390625 # 2^-8
NORM_RTOL=0.015625   # 2^-6
DATA=$tmp/data.txt
cp tests/train.txt "$DATA" || exit 1

# flags
"$K" compile models/tiny.lua --attention tc -o "$tmp/x" > "$tmp/err" 2>&1; rc=$?
check "--attention tc without a CUDA target: one line, exit 1 ($(head -1 "$tmp/err"))" \
    "[ $rc -eq 1 ] && [ \$(wc -l < '$tmp/err') -eq 1 ] && grep -q -- '--attention tc' '$tmp/err'"
"$K" compile models/tiny.lua --target cuda:sm_90 --attention tensor -o "$tmp/x" > "$tmp/err" 2>&1; rc=$?
check "--attention tensor: one line naming the choices ($(head -1 "$tmp/err"))" \
    "[ $rc -eq 1 ] && [ \$(wc -l < '$tmp/err') -eq 1 ] && grep -q 'kiln, cudnn or tc' '$tmp/err'"

# which kernel the emitter chose: D 16 (tiny) -> tc; D 48 -> attention.cu
"$K" compile models/tiny.lua "${SHAPE[@]}" --target cuda:sm_90 --attention tc --emit llvm -o "$tmp/ll16" > "$tmp/log" 2>&1
"$K" compile models/tiny.lua "${SHAPE[@]}" --set dim=192 --target cuda:sm_90 --attention tc --emit llvm -o "$tmp/ll48" > "$tmp/log" 2>&1
check "head dim 16: the step calls rtk_attention_tc and rtk_attention_bwd_tc only" \
    "grep -q '@rtk_attention_tc(' '$tmp/ll16.ll' && grep -q '@rtk_attention_bwd_tc(' '$tmp/ll16.ll' && ! grep -q '@rtk_attention(' '$tmp/ll16.ll'"
check "head dim 48: attention.cu's rtk_attention (the tensor-core kernels take 16, 32, 64, 128)" \
    "grep -q '@rtk_attention(' '$tmp/ll48.ll' && ! grep -q '@rtk_attention_tc(' '$tmp/ll48.ll'"

# the trainer on the fakes vs the CPU trainer
T=$tmp/tiny_tc
start=$SECONDS
if ! tests/cuda_fake/build_libs.sh "$F" > "$tmp/log" 2>&1 || ! tests/cuda_fake/build_kernels.sh kernels/cuda/*.cu -o "$F/libkernels.so" >> "$tmp/log" 2>&1 ||
    ! "$K" compile models/tiny.lua "${SHAPE[@]}" --target cuda:sm_90 --attention tc --emit cuda -o "$T" >> "$tmp/log" 2>&1 ||
    ! tests/cuda_fake/build_kernels.sh "$T.cu" -o "$tmp/libgen.so" >> "$tmp/log" 2>&1; then
    say 1 "build the fakes, the kernel libraries and the trainer: $(tail -5 "$tmp/log" | tr '\n' ' ' | head -c 1000)"
    echo "1..$n"; exit 1
fi
say 0 "fakes, kernel libraries and tiny.lua --attention tc built ($((SECONDS - start)) s)"
losses() { sed 's/.*"loss":\([^,]*\),.*"grad_norm":\([^,]*\),.*/\1 \2/' "$1" 2>/dev/null; }
# run NAME LIBS: STEPS steps on the fakes, "loss grad_norm" lines in $tmp/NAME.loss
run() {
    timeout 600 env LD_BIND_NOW=1 LD_LIBRARY_PATH="$F" KILN_FAKE_CUDA_KERNELS="$2" KILN_FAKE_CUDA_STRICT=1 KILN_FAKE_CUDA_PROFILE=1 \
        "$T" --data "$DATA" --steps "$STEPS" --log "$tmp/$1.log" > "$tmp/$1.out" 2>&1
    local rc=$?
    losses "$tmp/$1.log" > "$tmp/$1.loss"
    return $rc
}
start=$SECONDS
run tc "$F/libkernels.so:$tmp/libgen.so"; rc=$?
check "the --attention tc trainer: $STEPS steps on the fakes (strict), exit $rc, $((SECONDS - start)) s, losses $(cut -d' ' -f1 "$tmp/tc.loss" | tr '\n' ' ')" \
    "[ $rc -eq 0 ] && [ \$(wc -l < '$tmp/tc.loss') -eq $STEPS ]"
check "it ran kiln_attention_tc_fwd, kiln_attention_tc_bwd_dkdv and _dq, and not attention.cu's forward" \
    "grep -q 'kiln_attention_tc_fwd' '$tmp/tc.out' && grep -q 'kiln_attention_tc_bwd_dkdv' '$tmp/tc.out' && grep -q 'kiln_attention_tc_bwd_dq' '$tmp/tc.out' && ! grep -q 'kiln_attention_fwd\$' '$tmp/tc.out'"
"$K" compile models/tiny.lua "${SHAPE[@]}" --target cpu -o "$tmp/tiny_cpu" > "$tmp/log" 2>&1 &&
    "$tmp/tiny_cpu" --data "$DATA" --steps "$STEPS" --log "$tmp/cpu.log" > /dev/null 2>&1
losses "$tmp/cpu.log" > "$tmp/cpu.loss"
# worst relative difference of column C of NAME vs the CPU over STEPS steps ("missing" unless all there)
worst() {
    paste -d' ' "$tmp/$2.loss" "$tmp/cpu.loss" | awk -v n="$STEPS" -v c="$1" '
        NF == 4 { d = $c - $(c + 2); if (d < 0) d = -d; r = d / ($(c + 2) < 0 ? -$(c + 2) : $(c + 2)); if (r > w) w = r; k++ }
        END { if (k != n) print "missing"; else printf "%.2e", w }'
}
within() { [ "$1" != missing ] && [ "$2" != missing ] && awk -v a="$1" -v b="$2" -v ta="$LOSS_RTOL" -v tb="$NORM_RTOL" 'BEGIN { exit !(a <= ta && b <= tb) }'; }
wl=$(worst 1 tc) wn=$(worst 2 tc)
check "--attention tc (bf16, fakes) vs CPU (f32) over $STEPS steps: worst relative difference loss $wl (tolerance 2^-8), gradient norm $wn (2^-6)" \
    "within '$wl' '$wn'"

# a planted bug: P's A fragment index, in a copy of attention_tc.cu listed first
mkdir -p "$tmp/mutant" && cp kernels/cuda/attention_tc.cu kernels/cuda/*.cuh "$tmp/mutant/"
FROM='kiln_pack_bf16(x[2 * s][2], x[2 * s][3]),'
TO='kiln_pack_bf16(x[2 * s + 1][0], x[2 * s + 1][1]),'
if [ "$(grep -cF "$FROM" "$tmp/mutant/attention_tc.cu")" != 1 ]; then
    say 1 "planted bug: attention_tc.cu no longer has '$FROM' exactly once"
elif ! { perl -pi -e "s/\Q$FROM\E/$TO/" "$tmp/mutant/attention_tc.cu" &&
    tests/cuda_fake/build_kernels.sh "$tmp/mutant/attention_tc.cu" -o "$tmp/libmutant.so" > "$tmp/log" 2>&1; }; then
    say 1 "planted bug: build: $(tr '\n' ' ' < "$tmp/log" | head -c 1000)"
else
    run mutant "$tmp/libmutant.so:$F/libkernels.so:$tmp/libgen.so"
    ml=$(worst 1 mutant) mn=$(worst 2 mutant)
    check "planted bug (P's A fragment index in attention_tc.cu) breaks the comparison: loss $ml, gradient norm $mn" \
        "[ \$(wc -l < '$tmp/mutant.loss') -eq $STEPS ] && ! within '$ml' '$mn'"
fi
echo "1..$n"
