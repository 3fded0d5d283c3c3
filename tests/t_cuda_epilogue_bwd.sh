#!/usr/bin/env bash
# The backward cuBLASLt epilogues (issue 23, compiler/gemm_epilogue.c,
# rtk_gemm_bgrad / rtk_gemm_dgelu_bgrad in runtime/cuda/kernels_cuda.c, the
# fake's own DGELU_BGRAD, BGRADA and BGRADB in tests/cuda_fake/fake_cublaslt.c):
# `--gemm-epilogue bgrad` gives a weight-gradient GEMM its bias' gradient
# (the sumto of the same dy: BGRADA), `all` also turns the `dh` GEMM +
# gelu_bwd + the bias' sumto into one DGELU_BGRAD matmul reading the
# pre-activation the forward's GELU_AUX_BIAS saved.
#  1. the rewrite: tiny.lua's bf16 step has 8 matmul_bgrad with bgrad (2
#     layers x 4 linear layers), 6 and 2 matmul_dgelu_bgrad with all, no
#     gelu_bwd left; `kiln check --precision bf16` of both passes;
#  2. the fake's epilogues against the separate computation
#     (tests/cuda_fake/check_epilogue.c: DGELU_BGRAD against the plain GEMM
#     + dGELU + row sums within 2^-7 (bf16) / 1e-5 (f32), BGRADA/B against
#     the operand sums within 1e-6, the refusals); each planted bug
#     (KILN_FAKE_CUBLASLT_TEST_DGELU_AUX_LD=1: aux read with a leading
#     dimension 8 short; KILN_FAKE_CUBLASLT_TEST_BGRAD=half: half the
#     reduction) fails some of those checks;
#  3. tiny.lua with --gemm-epilogue all on the fakes (strict), 10 steps:
#     the step launches both new GEMMs, losses within 2^-8 and gradient
#     norms within 2^-6 of the CPU (f32) trainer's at every step;
#  4. a GELU MLP whose biases start large, its logits from the MLP alone
#     through an untied head (so that the MLP's gradients weigh in the
#     gradient norm; lr 3e-2), --gemm-epilogue all over 3 steps against its
#     CPU trainer; both planted bugs must break that comparison (measured:
#     clean 4.4e-4 / 1.3e-3, aux ld 4.4e-3 / 2.1e-2, half 5.8e-3 / 3.4e-2,
#     loss / gradient norm, against 2^-8 / 2^-6).
# Fakes and registries cached in $B/cuda_fake (cuda_lib.sh).  ~20 s warm.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/cuda_lib.sh"
STEPS=${STEPS:-10}

# ---- 1. the rewrite ----
count() { local op=$1; shift; "$K" dump "$@" --precision bf16 2>/dev/null | grep -c " = $op "; }
a=$(count matmul_bgrad models/tiny.lua "${SHAPE[@]}" --gemm-epilogue bgrad) b=$(count matmul_dgelu_bgrad models/tiny.lua "${SHAPE[@]}" --gemm-epilogue bgrad)
c=$(count matmul_bgrad models/tiny.lua "${SHAPE[@]}" --gemm-epilogue all) d=$(count matmul_dgelu_bgrad models/tiny.lua "${SHAPE[@]}" --gemm-epilogue all)
e=$(count gelu_bwd models/tiny.lua "${SHAPE[@]}" --gemm-epilogue all)
check "tiny.lua (bf16): bgrad: $a matmul_bgrad, $b matmul_dgelu_bgrad (want 8 0); all: $c, $d, $e gelu_bwd left (want 6 2 0)" \
    "[ '$a $b $c $d $e' = '8 0 6 2 0' ]"
for l in bgrad all; do
    "$K" check models/tiny.lua "${SHAPE[@]}" --precision bf16 --gemm-epilogue $l > "$tmp/check.out" 2>&1; rc=$?
    check "kiln check --precision bf16 --gemm-epilogue $l: exit $rc ($(tail -1 "$tmp/check.out" | grep -o 'worst err [^ ]*'))" "[ $rc -eq 0 ]"
done

# ---- 2. the fake's epilogues on their own ----
start=$SECONDS
cuda_fakes || build_failed "build the fakes"
CUDA=${CUDA_HOME:-/usr/local/cuda}
CE=$F/check_epilogue
if [ ! -x "$CE" ] || [ tests/cuda_fake/check_epilogue.c -nt "$CE" ]; then
    gcc -std=c11 -D_GNU_SOURCE -O1 -g -Wall -Wextra -Werror -I"$CUDA/include" -o "$CE.$$" tests/cuda_fake/check_epilogue.c \
        -L"$CUDA/lib64/stubs" -lcuda -L"$CUDA/lib64" -lcublasLt -Wl,-rpath,"$CUDA/lib64" -lm >> "$tmp/log" 2>&1 &&
        mv "$CE.$$" "$CE" || build_failed "build check_epilogue"
fi
env LD_BIND_NOW=1 LD_LIBRARY_PATH="$F" "$CE" > "$tmp/ce.out" 2> "$tmp/ce.err"; rc=$?
sed 's/^/# /' "$tmp/ce.out"
check "check_epilogue: exit $rc, $(grep -c '^ok' "$tmp/ce.out") of $(sed -n 's/^1\.\.//p' "$tmp/ce.out") checks pass (DGELU_BGRAD vs GEMM + dGELU + sums, BGRADA/B, 9 refusals)" \
    "[ $rc -eq 0 ] && [ \$(grep -c '^ok' '$tmp/ce.out') -eq 13 ]"
for bug in KILN_FAKE_CUBLASLT_TEST_DGELU_AUX_LD=1 KILN_FAKE_CUBLASLT_TEST_BGRAD=half; do
    env LD_BIND_NOW=1 LD_LIBRARY_PATH="$F" "$bug" "$CE" > "$tmp/bug.out" 2>&1; rc=$?
    check "planted bug $bug: check_epilogue fails ($(grep -c '^not ok' "$tmp/bug.out") checks: $(grep '^not ok' "$tmp/bug.out" | cut -d' ' -f5 | tr -d ',' | tr '\n' ' '))" \
        "[ $rc -ne 0 ] && grep -q '^not ok' '$tmp/bug.out'"
done

# ---- 3. tiny.lua with all on the fakes vs the CPU trainer ----
cat > "$tmp/gelu.lua" <<'EOF'
-- a GELU MLP whose biases start large (normal(0.5)), inputs normal(1), the
-- logits from the MLP alone through an untied head: the MLP's gradients
-- weigh in the gradient norm
local c = config{vocab = 256, dim = 32, seq = 16, batch = 2, lr = 3e-2, warmup = 0}
local tokens = input("tokens", {c.batch, c.seq}, "i32")
local targets = input("targets", {c.batch, c.seq}, "i32")
local x = embedding(param("wte.weight", {c.vocab, c.dim}, normal(1.0)), tokens)
local h = gelu(matmul(x, param("fc.weight", {c.dim, 2 * c.dim}, normal(0.1))) + param("fc.bias", {2 * c.dim}, normal(0.5)))
local y = matmul(h, param("proj.weight", {2 * c.dim, c.dim}, normal(0.1))) + param("proj.bias", {c.dim}, normal(0.5))
local logits = matmul(y, param("head.weight", {c.vocab, c.dim}, normal(0.3)), {tb = true})
loss(mean(cross_entropy(logits, targets)))
EOF
cuda_trainer tinyb libepb_tiny models/tiny.lua "${SHAPE[@]}" --gemm-epilogue all &&
    cuda_trainer gelub libepb_gelu "$tmp/gelu.lua" --gemm-epilogue all || build_failed "build the two --gemm-epilogue all trainers"
say 0 "fakes, check_epilogue and the two --gemm-epilogue all trainers built ($((SECONDS - start)) s)"
check "the step launches rtk_gemm_dgelu_bgrad and rtk_gemm_bgrad" \
    "strings '$tmp/tinyb' | grep -q '^rtk_gemm_dgelu_bgrad\$' && strings '$tmp/tinyb' | grep -q '^rtk_gemm_bgrad\$'"
start=$SECONDS
fake_run "$tmp/tinyb" tinyb "$F/libkernels.so:$F/libepb_tiny.so" "$STEPS"; rc=$?
cpu_losses tiny_cpu models/tiny.lua "$STEPS" "${SHAPE[@]}"
wl=$(worst 1 tinyb tiny_cpu "$STEPS") wn=$(worst 2 tinyb tiny_cpu "$STEPS")
check "tiny.lua --gemm-epilogue all on the fakes: exit $rc, $((SECONDS - start)) s; vs CPU over $STEPS steps: loss $wl (2^-8), gradient norm $wn (2^-6)" \
    "[ $rc -eq 0 ] && within '$wl' '$wn'"

# ---- 4. large biases, and the planted bugs ----
fake_run "$tmp/gelub" gelub "$F/libkernels.so:$F/libepb_gelu.so" 3; rc=$?
cpu_losses gelu_cpu "$tmp/gelu.lua" 3
wl=$(worst 1 gelub gelu_cpu 3) wn=$(worst 2 gelub gelu_cpu 3)
check "biases from normal(0.5), untied head, --gemm-epilogue all on the fakes: exit $rc; vs CPU over 3 steps: loss $wl, gradient norm $wn" \
    "[ $rc -eq 0 ] && within '$wl' '$wn'"
for bug in KILN_FAKE_CUBLASLT_TEST_DGELU_AUX_LD=1 KILN_FAKE_CUBLASLT_TEST_BGRAD=half; do
    fake_run "$tmp/gelub" bug "$F/libkernels.so:$F/libepb_gelu.so" 3 "$bug"
    ml=$(worst 1 bug gelu_cpu 3) mn=$(worst 2 bug gelu_cpu 3)
    check "planted bug $bug breaks that comparison: loss $ml, gradient norm $mn" \
        "[ \$(wc -l < '$tmp/bug.loss') -eq 3 ] && ! within '$ml' '$mn'"
done
echo "1..$n"
