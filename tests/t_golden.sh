#!/usr/bin/env bash
# Golden IR: the dump of models/tiny.lua after `front` and after `autodiff`
# must match tests/golden/ byte for byte.  Regenerate on purpose only:
#   UPDATE_GOLDEN=1 bash tests/t_golden.sh
set -u
K=${BUILD:-build}/kiln
n=0
for pass in front autodiff; do
    n=$((n + 1))
    want=tests/golden/tiny.$pass.ir
    got=$(mktemp)
    "$K" dump models/tiny.lua --after "$pass" -o "$got"
    if [ "${UPDATE_GOLDEN:-0}" = 1 ]; then cp "$got" "$want"; fi
    if diff -u "$want" "$got" > "$got.diff"; then
        echo "ok $n - golden tiny.lua after $pass"
    else
        echo "not ok $n - golden tiny.lua after $pass differs:"; head -20 "$got.diff"
    fi
    rm -f "$got" "$got.diff"
done
