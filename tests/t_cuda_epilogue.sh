#!/usr/bin/env bash
# cuBLASLt epilogues (issue 23, compiler/gemm_epilogue.c, rtk_gemm_bias in
# runtime/cuda/kernels_cuda.c, the fake's own BIAS epilogue in
# tests/cuda_fake/fake_cublaslt.c): `--gemm-epilogue bias` turns a GEMM
# followed by the add of a broadcast bias into one matmul_bias, run as a
# cuBLASLt matmul with CUBLASLT_EPILOGUE_BIAS.
#  1. flags: a bad value and the CPU target are one line, exit 1;
#  2. the rewrite: tiny.lua's bf16 step has 8 matmul_bias (2 layers x 4
#     linear layers) with the flag and none without; `kiln check
#     --precision bf16` of the rewritten step passes; the emitted step calls
#     rtk_gemm_bias;
#  3. the CUDA trainer on the fake stack (strict): tiny.lua, 10 steps,
#     losses within 2^-8 and gradient norms within 2^-6 of the CPU (f32)
#     trainer's at every step;
#  4. a model whose biases start large (normal(0.5)), so that a bias
#     matters from step 1: its epilogue trainer matches its CPU trainer
#     over 3 steps, and the fake's planted bug
#     (KILN_FAKE_CUBLASLT_TEST_DROP_BIAS=1: the epilogue adds nothing) must
#     break that comparison.
#  5. --gemm-epilogue gelu (bias + GELU as CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
#     the pre-activation as its aux output; rtk_gemm_bias_gelu, the fake's
#     own tanh-GELU epilogue): tiny.lua's step has 2 matmul_bias_gelu (the
#     MLPs' c_fc) and 6 matmul_bias; `kiln check` passes; an MLP whose
#     width is not a multiple of 8 is left unfused; the step launches
#     rtk_gemm_bias_gelu; tiny.lua's trainer matches the CPU over 10 steps,
#     the large-bias model's (with an untied head) over 3, and the fake's
#     planted bug
#     (KILN_FAKE_CUBLASLT_TEST_GELU_AUX=post: aux holds GELU's output, which
#     gelu_bwd and the recomputed GELU then read) breaks that comparison.
# The fakes and registries are cached by hash in $B/cuda_fake (cuda_lib.sh,
# which has the helpers).  ~50 s warm on a loaded 2-core machine, about half
# of it the gelu part (5).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/cuda_lib.sh"
STEPS=${STEPS:-10}

# ---- 1. flags ----
"$K" dump models/tiny.lua --gemm-epilogue relu > "$tmp/err" 2>&1; rc=$?
check "--gemm-epilogue relu: one line, exit 1 ($(head -1 "$tmp/err"))" \
    "[ $rc -eq 1 ] && [ \$(wc -l < '$tmp/err') -eq 1 ] && grep -q 'expected bias, gelu, bgrad, all or none' '$tmp/err'"
"$K" compile models/tiny.lua --gemm-epilogue bias -o "$tmp/x" > "$tmp/err" 2>&1; rc=$?
check "--gemm-epilogue bias for the CPU target: one line, exit 1 ($(head -1 "$tmp/err"))" \
    "[ $rc -eq 1 ] && [ \$(wc -l < '$tmp/err') -eq 1 ] && grep -q 'no GEMM epilogues' '$tmp/err'"

# ---- 2. the rewrite ----
a=$("$K" dump models/tiny.lua "${SHAPE[@]}" --precision bf16 --gemm-epilogue bias 2>/dev/null | grep -c ' = matmul_bias ')
b=$("$K" dump models/tiny.lua "${SHAPE[@]}" --precision bf16 2>/dev/null | grep -c ' = matmul_bias ')
check "tiny.lua (bf16): $a matmul_bias with --gemm-epilogue bias, $b without (want 8 0)" "[ '$a $b' = '8 0' ]"
"$K" check models/tiny.lua "${SHAPE[@]}" --precision bf16 --gemm-epilogue bias > "$tmp/check.out" 2>&1; rc=$?
check "kiln check --precision bf16 --gemm-epilogue bias: exit $rc ($(tail -1 "$tmp/check.out" | grep -o 'worst err [^ ]*'))" "[ $rc -eq 0 ]"
"$K" compile models/tiny.lua "${SHAPE[@]}" --target cuda:sm_90 --gemm-epilogue bias --emit llvm -o "$tmp/ll" > "$tmp/log" 2>&1
check "the emitted step launches rtk_gemm_bias ($(grep -c '@rtk_gemm_bias(' "$tmp/ll.ll" 2>/dev/null) lines name it)" "grep -q '@rtk_gemm_bias(' '$tmp/ll.ll'"

# ---- 3. the CUDA trainer on the fakes vs the CPU trainer ----
start=$SECONDS
# build NAME MODEL ARGS...: the CUDA trainer $tmp/NAME (with --gemm-epilogue bias) and its kernels' registry
build() {
    local name=$1 model=$2; shift 2
    cuda_trainer "$name" "libep_$name" "$model" "$@" --gemm-epilogue "${EPI:-bias}"
}
cat > "$tmp/bias.lua" <<'EOF'
-- a linear layer and a GELU MLP whose biases start large (normal(0.5))
local c = config{vocab = 256, dim = 32, seq = 16, batch = 2, lr = 1e-2, warmup = 0}
local tokens = input("tokens", {c.batch, c.seq}, "i32")
local targets = input("targets", {c.batch, c.seq}, "i32")
local wte = param("wte.weight", {c.vocab, c.dim}, normal(0.02))
local x = embedding(wte, tokens)
local h = gelu(matmul(x, param("fc.weight", {c.dim, 2 * c.dim}, normal(0.1))) + param("fc.bias", {2 * c.dim}, normal(0.5)))
local y = matmul(h, param("proj.weight", {2 * c.dim, c.dim}, normal(0.1))) + param("proj.bias", {c.dim}, normal(0.5))
local logits = matmul(x + y, wte, {tb = true})
loss(mean(cross_entropy(logits, targets)))
EOF
cuda_fakes && build tiny models/tiny.lua "${SHAPE[@]}" && build bias "$tmp/bias.lua" ||
    build_failed "build the fakes, the kernel libraries and the trainers"
say 0 "fakes, kernel libraries and the two --gemm-epilogue bias trainers built ($((SECONDS - start)) s)"
# run NAME OUT STEPS ENV...: $tmp/NAME on the fakes (strict) with its registry
run() {
    local name=$1 out=$2 steps=$3; shift 3
    fake_run "$tmp/$name" "$out" "$F/libkernels.so:$F/libep_$name.so" "$steps" "$@"
}
start=$SECONDS
run tiny tiny "$STEPS"; rc=$?
cpu_losses tiny_cpu models/tiny.lua "$STEPS" "${SHAPE[@]}"
wl=$(worst 1 tiny tiny_cpu "$STEPS") wn=$(worst 2 tiny tiny_cpu "$STEPS")
check "tiny.lua --gemm-epilogue bias on the fakes: exit $rc, $((SECONDS - start)) s; vs CPU over $STEPS steps: loss $wl (2^-8), gradient norm $wn (2^-6)" \
    "[ $rc -eq 0 ] && within '$wl' '$wn'"

# ---- 4. large biases, and the planted bug ----
run bias bias 3; rc=$?
cpu_losses bias_cpu "$tmp/bias.lua" 3
wl=$(worst 1 bias bias_cpu 3) wn=$(worst 2 bias bias_cpu 3)
check "biases from normal(0.5), --gemm-epilogue bias on the fakes: exit $rc; vs CPU over 3 steps: loss $wl, gradient norm $wn" \
    "[ $rc -eq 0 ] && within '$wl' '$wn'"
run bias dropped 3 KILN_FAKE_CUBLASLT_TEST_DROP_BIAS=1
ml=$(worst 1 dropped bias_cpu 3) mn=$(worst 2 dropped bias_cpu 3)
check "planted bug (the fake's BIAS epilogue adds nothing) breaks that comparison: loss $ml, gradient norm $mn" \
    "[ \$(wc -l < '$tmp/dropped.loss') -eq 3 ] && ! within '$ml' '$mn'"

# ---- 5. --gemm-epilogue gelu ----
a=$("$K" dump models/tiny.lua "${SHAPE[@]}" --precision bf16 --gemm-epilogue gelu 2>/dev/null | grep -c ' = matmul_bias_gelu ')
b=$("$K" dump models/tiny.lua "${SHAPE[@]}" --precision bf16 --gemm-epilogue gelu 2>/dev/null | grep -c ' = matmul_bias ')
check "tiny.lua (bf16) --gemm-epilogue gelu: $a matmul_bias_gelu, $b matmul_bias (want 2 6)" "[ '$a $b' = '2 6' ]"
"$K" check models/tiny.lua "${SHAPE[@]}" --precision bf16 --gemm-epilogue gelu > "$tmp/check.out" 2>&1; rc=$?
check "kiln check --precision bf16 --gemm-epilogue gelu: exit $rc ($(tail -1 "$tmp/check.out" | grep -o 'worst err [^ ]*'))" "[ $rc -eq 0 ]"
# the large-bias model with an untied head normal(0.3): the MLP's gradients then
# weigh in the gradient norm (with the tied wte normal(0.02) they do not)
sed -e 's/^local logits = .*/local logits = matmul(x + y, param("head.weight", {c.vocab, c.dim}, normal(0.3)), {tb = true})/' \
    "$tmp/bias.lua" > "$tmp/gelu.lua"
sed -e 's/2 \* c.dim/2 * c.dim + 4/g' "$tmp/gelu.lua" > "$tmp/gelu68.lua"
a=$("$K" dump "$tmp/gelu68.lua" --precision bf16 --gemm-epilogue gelu 2>/dev/null | grep -c ' = matmul_bias_gelu ')
b=$("$K" dump "$tmp/gelu68.lua" --precision bf16 --gemm-epilogue gelu 2>/dev/null | grep -c ' = matmul_bias ')
check "an MLP 68 wide (not a multiple of 8: AUX_LD's rule) keeps its gelu: $a matmul_bias_gelu, $b matmul_bias (want 0 2)" "[ '$a $b' = '0 2' ]"
start=$SECONDS
EPI=gelu build tinyg models/tiny.lua "${SHAPE[@]}" && EPI=gelu build biasg "$tmp/gelu.lua" ||
    build_failed "build the two --gemm-epilogue gelu trainers"
check "the gelu step launches rtk_gemm_bias_gelu ($((SECONDS - start)) s to build both)" "grep -q 'rtk_gemm_bias_gelu' '$tmp/tinyg.cu' '$tmp/tinyg' 2>/dev/null || strings '$tmp/tinyg' | grep -q rtk_gemm_bias_gelu"
start=$SECONDS
run tinyg tinyg "$STEPS"; rc=$?
wl=$(worst 1 tinyg tiny_cpu "$STEPS") wn=$(worst 2 tinyg tiny_cpu "$STEPS")
check "tiny.lua --gemm-epilogue gelu on the fakes: exit $rc, $((SECONDS - start)) s; vs CPU over $STEPS steps: loss $wl (2^-8), gradient norm $wn (2^-6)" \
    "[ $rc -eq 0 ] && within '$wl' '$wn'"
run biasg biasg 3; rc=$?
cpu_losses gelu_cpu "$tmp/gelu.lua" 3
wl=$(worst 1 biasg gelu_cpu 3) wn=$(worst 2 biasg gelu_cpu 3)
check "biases from normal(0.5), untied head, --gemm-epilogue gelu on the fakes: exit $rc; vs CPU over 3 steps: loss $wl, gradient norm $wn" \
    "[ $rc -eq 0 ] && within '$wl' '$wn'"
run biasg gelupost 3 KILN_FAKE_CUBLASLT_TEST_GELU_AUX=post
ml=$(worst 1 gelupost gelu_cpu 3) mn=$(worst 2 gelupost gelu_cpu 3)
check "planted bug (the fake's GELU_AUX_BIAS stores GELU's output as aux) breaks that comparison: loss $ml, gradient norm $mn" \
    "[ \$(wc -l < '$tmp/gelupost.loss') -eq 3 ] && ! within '$ml' '$mn'"
echo "1..$n"
