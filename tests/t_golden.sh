#!/usr/bin/env bash
# Golden IR: the dump of models/tiny.lua after `front`, after `autodiff`, and
# after `recompute` under each policy must match tests/golden/ byte for byte;
# so must `kiln plan --peak` (the memory plan's table and what is live at the
# activations' peak).  Regenerate on purpose only:
#   UPDATE_GOLDEN=1 bash tests/t_golden.sh
. "$(dirname "$0")/lib.sh"
for step in front autodiff recompute:none recompute:selective recompute:gemm-last recompute:full; do
    n=$((n + 1))
    pass=${step%%:*} policy=${step#*:}
    if [ "$pass" = recompute ]; then want=tests/golden/tiny.recompute-$policy.ir flags="--recompute $policy"
    else want=tests/golden/tiny.$pass.ir flags=""; fi
    got=$tmp/got.ir
    # shellcheck disable=SC2086
    "$K" dump models/tiny.lua --after "$pass" $flags -o "$got"
    if [ "${UPDATE_GOLDEN:-0}" = 1 ]; then cp "$got" "$want"; fi
    if diff -u "$want" "$got" > "$got.diff"; then
        echo "ok $n - golden tiny.lua after $pass $flags"
    else
        echo "not ok $n - golden tiny.lua after $pass $flags differs:"; head -20 "$got.diff"
    fi
    rm -f "$got" "$got.diff"
done
n=$((n + 1))
want=tests/golden/tiny.plan-peak.txt got=$tmp/plan.txt
"$K" plan models/tiny.lua --peak | sed '/^predicted step/,$d' > "$got" # the memory plan; the cost model has its own tests
if [ "${UPDATE_GOLDEN:-0}" = 1 ]; then cp "$got" "$want"; fi
if diff -u "$want" "$got" > "$got.diff"; then
    echo "ok $n - golden kiln plan tiny.lua --peak"
else
    echo "not ok $n - golden kiln plan tiny.lua --peak differs:"; head -20 "$got.diff"
fi
