#!/usr/bin/env bash
# `kiln check`'s comparison rule (compiler/cmd/check.c, docs/parallel.md):
# max |x - ref| <= tol x the largest |ref| of the tensor's group (all the
# gradients; all the params; each other output alone).
#  - tests/models/keybias.lua has a key bias, whose true gradient is exactly 0
#    (softmax ignores it): its computed gradient is rounding noise, which a
#    tensor-relative comparison failed (errors of 0.2 to 4.5); it passes the
#    f32 and bf16 checks, --dp 2 (zero 0 and 1) and --cp 2 with both --cp-comm;
#  - the summary line names the precision, the configuration, the worst err
#    and the tolerance;
#  - a planted bug (KILN_TEST_PERTURB=NAME:D adds D x the group's largest
#    value to one element of the checked run) fails past the tolerance and
#    passes below it, also on the zero-gradient tensor.
. "$(dirname "$0")/lib.sh"
M=tests/models/keybias.lua
run() { out=$(timeout 120 "$K" check "$@" 2>&1); rc=$?; }
worst() { printf '%s\n' "$out" | tail -1 | sed -n 's/.*worst err \([^ ]*\) .*/\1/p'; }
pass() { # expected summary pattern, args...
    local pat=$1; shift
    run "$@"
    local w; w=$(worst)
    if [ $rc = 0 ] && [[ "$(printf '%s\n' "$out" | tail -1)" == $pat ]] && [ -n "$w" ]; then ok "check $*: worst err $w"
    else notok "check $*: rc=$rc $out"; fi
}
TOL9="*worst err * (*; tolerance 1e-09 of the group's largest value), 0 mismatched"
pass "check $M --recompute gemm-last: precision f32 vs f64, 1 step; *worst err * (*; tolerance 1e-05 of the group's largest value), 0 mismatched" $M
pass "check $M --recompute full: precision bf16 vs f64, 1 step; *worst err * (*; tolerance 1e-01 of the group's largest value), 0 mismatched" $M --precision bf16 --recompute full
pass "check $M --dp 2 --cp 1 --micro-batches 1 --zero 1 *: precision f32 program, both in f64; 2 ranks, 2 steps; $TOL9" $M --dp 2
pass "check $M --dp 2 --cp 1 --micro-batches 1 --zero 0 *: precision f32 program, both in f64; 2 ranks, 2 steps; $TOL9" $M --dp 2 --zero 0
pass "check $M --dp 2 *: precision bf16 program, both in f64 (casts exact: the sharding is checked, not the roundings); $TOL9" $M --dp 2 --precision bf16
for comm in allgather p2p; do
    pass "check $M --dp 1 --cp 2 --cp-comm $comm --micro-batches 1 --zero 0 *: precision f32 program, both in f64; $TOL9" $M --cp 2 --cp-comm $comm --zero 0
    pass "check $M --dp 1 --cp 2 --cp-comm $comm --micro-batches 1 --zero 1 *: precision f32 program, both in f64; $TOL9" $M --cp 2 --cp-comm $comm
done

# the planted bug: over the tolerance fails (exit 1, a MISMATCH line naming the
# tensor, the summary's worst err), under it passes
planted() { # description, NAME:D, want rc, args...
    local desc=$1 plant=$2 want=$3; shift 3
    out=$(KILN_TEST_PERTURB=$plant timeout 120 "$K" check "$@" 2>&1); rc=$?
    local name=${plant%:*} w; w=$(worst)
    if [ "$want" = 1 ]; then
        local last; last=$(printf '%s\n' "$out" | tail -1)
        if [ $rc = 1 ] && printf '%s\n' "$out" | grep -q "^MISMATCH .*${name} " && [[ "$last" == *"($name; "* && "$last" != *", 0 mismatched" ]]; then
            ok "$desc: fails, worst err $w"
        else notok "$desc: rc=$rc $out"; fi
    elif [ $rc = 0 ]; then ok "$desc: passes, worst err $w"
    else notok "$desc: rc=$rc $out"; fi
}
planted "f32: zero gradient off by 2e-5 of the largest gradient" grad:h.0.attn.k.bias:2e-5 1 $M
planted "f32: zero gradient off by 5e-6 of the largest gradient" grad:h.0.attn.k.bias:5e-6 0 $M
planted "f32: the loss off by 2e-5 of itself" loss:2e-5 1 $M
planted "--dp 2: updated zero-gradient param off by 2e-9 of the largest param" h.0.attn.k.bias:2e-9 1 $M --dp 2
planted "--dp 2: updated zero-gradient param off by 5e-10" h.0.attn.k.bias:5e-10 0 $M --dp 2
planted "--cp 2 p2p: zero gradient off by 2e-9 of the largest gradient" grad:h.0.attn.k.bias:2e-9 1 $M --cp 2 --cp-comm p2p --zero 0
planted "--cp 2 allgather: a weight's gradient off by 2e-9" grad:h.0.attn.q.weight:2e-9 1 $M --cp 2 --zero 0
