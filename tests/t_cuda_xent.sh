#!/usr/bin/env bash
# The fused classifier (issue 23, compiler/xent_fuse.c, kernels/cuda/
# xent_fused.cu): cross_entropy and its backward become one
# cross_entropy_fused at the forward when dl is known there (the mean's
# 1/N), on by default for --target cuda, --xent-fused on|off.
#  1. flags: a bad value and `--xent-fused on` for the CPU target are one
#     line, exit 1;
#  2. the rewrite: tiny.lua's step after fuse has one cross_entropy_fused
#     and no cross_entropy / cross_entropy_bwd with it on, the reverse with
#     it off; under --micro-batches 2 one per micro-batch (the backward's
#     targets are a second slice of the batch: same data); under --tp 2 and
#     a loss-masked model under --dp 2 (its dl needs the all-reduced mask
#     count) it is left unfused; memplan's activation peak of GPT-2 124M is
#     the same both ways (the gradient is written over the logits);
#  3. the interpreter: 3 steps of `kiln run --interp` give the same losses
#     and gradient norms, bit for bit, fused and unfused (same formulas, in
#     f64 rounded per value), and `kiln check --precision bf16` of the fused
#     step passes;
#  4. the CUDA trainer (the default: fused) on the fake CUDA stack
#     (tests/cuda_fake, strict): 10 steps, kiln_cross_entropy_fused ran and
#     neither unfused kernel did, losses within 2^-8 and gradient norms
#     within 2^-6 of the CPU (f32) trainer's at every step (t_cuda_fake.sh's
#     bf16 tolerances);
#  5. a planted bug (the fused kernel without its -dl at the target, in a
#     library listed first) fails that comparison within 2 steps.
# The fakes and the kernel registries are cached by hash in $B/cuda_fake
# (shared with t_cuda_fake.sh's libkernels.so; the helpers are
# cuda_lib.sh's); NVRTC's cache is the default one.  ~15 s warm on the
# shared 2-core machine.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/cuda_lib.sh"
STEPS=${STEPS:-10}

# ---- 1. flags ----
"$K" dump models/tiny.lua --xent-fused maybe > "$tmp/err" 2>&1; rc=$?
check "--xent-fused maybe: one line, exit 1 ($(head -1 "$tmp/err"))" \
    "[ $rc -eq 1 ] && [ \$(wc -l < '$tmp/err') -eq 1 ] && grep -q 'expected on or off' '$tmp/err'"
"$K" compile models/tiny.lua --xent-fused on -o "$tmp/x" > "$tmp/err" 2>&1; rc=$?
check "--xent-fused on for the CPU target: one line, exit 1 ($(head -1 "$tmp/err"))" \
    "[ $rc -eq 1 ] && [ \$(wc -l < '$tmp/err') -eq 1 ] && grep -q 'no fused classifier' '$tmp/err'"

# ---- 2. the rewrite ----
# count OP ARGS...: nodes of op OP in the step after fuse
count() { local op=$1; shift; "$K" dump "$@" --after fuse 2>/dev/null | grep -c " = $op "; }
a=$(count cross_entropy_fused models/tiny.lua "${SHAPE[@]}" --xent-fused on) b=$(count cross_entropy models/tiny.lua "${SHAPE[@]}" --xent-fused on)
c=$(count cross_entropy_bwd models/tiny.lua "${SHAPE[@]}" --xent-fused on)
check "--xent-fused on: $a cross_entropy_fused, $b cross_entropy, $c cross_entropy_bwd (want 1 0 0)" "[ '$a $b $c' = '1 0 0' ]"
a=$(count cross_entropy_fused models/tiny.lua "${SHAPE[@]}" --xent-fused off) b=$(count cross_entropy models/tiny.lua "${SHAPE[@]}" --xent-fused off)
c=$(count cross_entropy_bwd models/tiny.lua "${SHAPE[@]}" --xent-fused off)
check "--xent-fused off: $a cross_entropy_fused, $b cross_entropy, $c cross_entropy_bwd (want 0 1 1)" "[ '$a $b $c' = '0 1 1' ]"
a=$(count cross_entropy_fused models/tiny.lua --set batch=4 --set seq=32 --xent-fused on --micro-batches 2 --dp 2)
check "--dp 2 --micro-batches 2: $a fused (want 2, one per micro-batch)" "[ '$a' = 2 ]"
a=$(count cross_entropy_fused models/tiny.lua --set batch=4 --set seq=32 --xent-fused on --tp 2)
check "--tp 2: $a fused (want 0: left alone under tensor parallelism)" "[ '$a' = 0 ]"
cat > "$tmp/mask.lua" <<'EOF'
local nn = require "nn"
local c = config{vocab = 256, dim = 16, layers = 1, heads = 2, seq = 16, batch = 4, lr = 1e-2, warmup = 0}
local tokens = input("tokens", {c.batch, c.seq}, "i32")
local targets = input("targets", {c.batch, c.seq}, "i32")
local m = input("loss_mask", {c.batch, c.seq}, "f32")
local wte = param("wte.weight", {c.vocab, c.dim}, normal(0.02))
local wpe = param("wpe.weight", {c.seq, c.dim}, normal(0.02))
local x = embedding(wte, tokens) + embedding(wpe, positions(c.seq))
x = layer(0, function() return nn.gpt_block(x, c) end)
local logits = matmul(nn.layernorm(x, "ln_f"), wte, {tb = true})
local ce = cross_entropy(logits, targets)
loss(sum(ce * m) / (sum(m) + 1e-30))
EOF
a=$(count cross_entropy_fused "$tmp/mask.lua" --xent-fused on) b=$(count cross_entropy_fused "$tmp/mask.lua" --xent-fused on --dp 2)
check "a loss-masked model: fused on one rank ($a), not under --dp 2 ($b: dl needs the mask's all-reduced count)" "[ '$a $b' = '1 0' ]"
peak() { "$K" plan models/gpt2.lua --precision bf16 --xent-fused "$1" 2>/dev/null | awk '/^  activations/ { print $4 }'; }
p0=$(peak off) p1=$(peak on)
check "GPT-2 124M (bf16): activation peak $p1 bytes fused, $p0 unfused (the same: dlogits is written over the logits)" \
    "[ -n '$p0' ] && [ '$p0' = '$p1' ]"

# ---- 3. the interpreter ----
for x in on off; do
    "$K" run models/tiny.lua --interp "${SHAPE[@]}" --xent-fused $x --data "$DATA" --steps 3 --log "$tmp/interp_$x.log" > /dev/null 2>&1
    sed 's/,"tokens_per_s.*//' "$tmp/interp_$x.log" > "$tmp/interp_$x.loss"
done
check "kiln run --interp, 3 steps: fused and unfused give the same losses and gradient norms bit for bit ($(cut -c1-40 "$tmp/interp_on.loss" | tail -1))" \
    "[ \$(wc -l < '$tmp/interp_on.loss') -eq 3 ] && cmp -s '$tmp/interp_on.loss' '$tmp/interp_off.loss'"
"$K" check models/tiny.lua "${SHAPE[@]}" --xent-fused on --precision bf16 > "$tmp/check.out" 2>&1; rc=$?
check "kiln check --xent-fused on --precision bf16: exit $rc ($(tail -1 "$tmp/check.out" | grep -o 'worst err [^ ]*'))" "[ $rc -eq 0 ]"

# ---- 4. the CUDA trainer on the fakes vs the CPU trainer ----
T=$tmp/tiny_cuda
start=$SECONDS
cuda_fakes && cuda_trainer tiny_cuda libtiny_xent models/tiny.lua "${SHAPE[@]}" ||
    build_failed "build the fakes, the kernel libraries and the trainer"
say 0 "fakes, kernel libraries and tiny.lua for cuda:sm_90 (fused by default) built ($((SECONDS - start)) s)"
# run NAME LIBS STEPS: on the fakes (strict), "loss grad_norm" lines in $tmp/NAME.loss
run() { fake_run "$T" "$@"; }
start=$SECONDS
run fused "$F/libkernels.so:$F/libtiny_xent.so" "$STEPS"; rc=$?
check "the fused trainer: $STEPS steps on the fakes (strict), exit $rc, $((SECONDS - start)) s, losses $(cut -d' ' -f1 "$tmp/fused.loss" | tr '\n' ' ')" \
    "[ $rc -eq 0 ] && [ \$(wc -l < '$tmp/fused.loss') -eq $STEPS ]"
check "it ran kiln_cross_entropy_fused ($(grep -o '[0-9]* x  kiln_cross_entropy_fused$' "$tmp/fused.out")) and neither kiln_cross_entropy_fwd nor _bwd" \
    "grep -q '$STEPS x  kiln_cross_entropy_fused\$' '$tmp/fused.out' && ! grep -q 'kiln_cross_entropy_fwd\|kiln_cross_entropy_bwd' '$tmp/fused.out'"
cpu_losses cpu models/tiny.lua "$STEPS" "${SHAPE[@]}"
wl=$(worst 1 fused cpu "$STEPS") wn=$(worst 2 fused cpu "$STEPS")
check "fused classifier (bf16, fakes) vs CPU (f32) over $STEPS steps: worst relative difference loss $wl (tolerance 2^-8), gradient norm $wn (2^-6)" \
    "within '$wl' '$wn'"

# ---- 5. a planted bug: no -dl at the target, in a copy listed first ----
mkdir -p "$tmp/mutant" && cp kernels/cuda/xent_fused.cu kernels/cuda/*.cuh "$tmp/mutant/"
FROM='if (i == t) g -= d;'
if [ "$(grep -cF "$FROM" "$tmp/mutant/xent_fused.cu")" != 1 ]; then
    say 1 "planted bug: xent_fused.cu no longer has '$FROM' exactly once"
elif ! { perl -pi -e "s/\Q$FROM\E//" "$tmp/mutant/xent_fused.cu" &&
    tests/cuda_fake/build_kernels.sh "$tmp/mutant/xent_fused.cu" -o "$F/libmutant_xent.so" > "$tmp/log" 2>&1; }; then
    say 1 "planted bug: build: $(tr '\n' ' ' < "$tmp/log" | head -c 1000)"
else
    run mutant "$F/libmutant_xent.so:$F/libkernels.so:$F/libtiny_xent.so" 2
    ml=$(worst 1 mutant cpu 2) mn=$(worst 2 mutant cpu 2)
    check "planted bug (xent_fused.cu without the target's -dl) breaks the comparison: loss $ml, gradient norm $mn" \
        "[ \$(wc -l < '$tmp/mutant.loss') -eq 2 ] && ! within '$ml' '$mn'"
fi
echo "1..$n"
