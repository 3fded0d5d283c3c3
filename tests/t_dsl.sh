#!/usr/bin/env bash
# The DSL's limits through the kiln binary (issue 17): a concat of the
# documented maximum of 256 inputs passes kiln check (the f32 program against
# the f64 interpreter, and the dp/cp ranks against one device; the check's own
# tolerances) through every pass.  (The single-error models are tests/bad/,
# run by t_cli.sh and test_front.)
. "$(dirname "$0")/lib.sh"
for par in "" "--dp 2" "--cp 2"; do
    out=$(timeout 300 "$K" check tests/dsl/concat256.lua $par 2>&1 | tail -1)
    # shellcheck disable=SC2015
    [[ "$out" == *" 0 mismatched" ]] && ok "256-way concat, kiln check $par: $out" || notok "256-way concat, kiln check $par: $out"
done
