#!/usr/bin/env bash
# The ops of issue 17 end to end, on tests/ops17.lua (a tiny GPT using
# sigmoid, abs, pow and ^, minimum, maximum, where, layernorm without a bias
# and bias-free nn.linear):
#  - `kiln check`: f32 against f64 on one device, then --dp 2, --cp 2 (both
#    cp-comm kinds) and --dp 2 --cp 2 against the single-device program (f64,
#    relative 1e-9: kiln check's own tolerance);
#  - the CPU backend (JIT) trains 50 steps with the f32 interpreter's losses
#    (max relative difference <= 1e-3, as tests/t_backend.sh);
#  - `kiln compile --target cuda:sm_90` compiles the generated kernels with
#    NVRTC, and they contain every new op;
#  - the IR text round trip after every pass;
#  - bad uses of the new DSL functions: one line naming the model's line, exit 1.
# The per-op gradients are FD-checked in tests/test_grad.c, the CPU kernels
# against the interpreter in tests/test_emit.c, the CUDA C on its CPU twin
# and NVRTC in tests/test_emit_cuda.c.
. "$(dirname "$0")/lib.sh"
M=tests/ops17.lua
check_m() { # args...
    out=$(timeout 300 "$K" check $M "$@" 2>&1); rc=$?
    if [ $rc = 0 ] && [[ "$out" == *", 0 mismatched"* ]]; then ok "check $M${*:+ $*}: ${out##*: }"
    else notok "check $M${*:+ $*}: rc=$rc $out"; fi
}
check_m
check_m --dp 2
check_m --cp 2 --cp-comm allgather
check_m --cp 2 --cp-comm p2p
check_m --dp 2 --cp 2 --micro-batches 2

need_corpus
D="--data $B/corpus.txt --steps 50 --seed 7"
losses() { sed 's/.*"loss":\([^,]*\),.*/\1/' "$1"; }
# shellcheck disable=SC2086
"$K" run --interp $M $D --log "$tmp/interp" > /dev/null
# shellcheck disable=SC2086
"$K" run $M $D --log "$tmp/jit" > /dev/null
r=$(paste <(losses "$tmp/jit") <(losses "$tmp/interp") | awk '{d = $1 - $2; if (d < 0) d = -d; r = d / ($2 < 0 ? -$2 : $2); if (r > m) m = r} END {printf "%.3g", m + 0}')
first=$(losses "$tmp/jit" | head -1) last=$(losses "$tmp/jit" | tail -1)
check "CPU backend: 50 steps match the f32 interpreter (max rel $r <= 1e-3); loss $first -> $last" \
    "[ \$(wc -l < $tmp/jit) = 50 ] && awk 'BEGIN{exit !($r <= 1e-3 && $last < $first)}'"

"$K" compile $M --target cuda:sm_90 --emit cuda -o "$tmp/cuda" > "$tmp/out" 2>&1
check "cuda:sm_90: the generated kernels compile with NVRTC ($(tail -1 "$tmp/out"))" "[ -x '$tmp/cuda' ]"
for e in 'kiln_sigmoid(x' 'fabsf(' 'powf(' ' != 0.0f ? ' ' * 0.5f : 0.0f' ' < 0.0f ? -'; do
    check "the generated CUDA C has '$e'" "grep -qF -- '$e' '$tmp/cuda.cu'"
done

for pass in front autodiff optimizer fuse schedule memplan; do
    "$K" dump $M --after $pass -o "$tmp/a.ir" && "$K" dump "$tmp/a.ir" -o "$tmp/b.ir"
    check "IR text round trip after $pass" "[ $? = 0 ] && [ -s '$tmp/a.ir' ] && cmp -s '$tmp/a.ir' '$tmp/b.ir'"
done

bad() { # description, expected line, model text
    printf '%s\n' "$3" > "$tmp/bad.lua"
    err=$("$K" check "$tmp/bad.lua" 2>&1 >/dev/null); rc=$?
    nl=$(printf '%s\n' "$err" | wc -l)
    if [ "$rc" = 1 ] && [ "$nl" = 1 ] && [[ "$err" == *"$2"* ]]; then ok "$1: $err"; else notok "$1: rc=$rc got '$err'"; fi
}
X='local x = param("x", {2, 3}, normal(0.02))'
bad "pow with a tensor exponent" "bad.lua:2: pow: the exponent must be a number, got a tensor" "$X
local y = x ^ x"
bad "a number raised to a tensor" "bad.lua:2: pow: the base must be a tensor, got number" "$X
local y = 2 ^ x"
bad "where with a number condition" "bad.lua:2: where: the condition must be a tensor" "$X
local y = where(1, x, x)"
bad "where of shapes that do not broadcast" "bad.lua:2: where: f32[2,3] and f32[4] do not broadcast" "$X
local y = where(x, x, param(\"b\", {4}, zeros()))"
bad "minimum of shapes that do not broadcast" "bad.lua:2: minimum: f32[2,3] and f32[2] do not broadcast" "$X
local y = minimum(x, param(\"b\", {2}, zeros()))"
bad "layernorm with a bias of the wrong size" "bad.lua:2: layernorm: weight f32[2] does not match the last dim of f32[2,3]" "$X
local y = layernorm(x, param(\"w\", {3}, ones()), param(\"b\", {2}, zeros()))"
