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
# The front end's wall-clock limit: models whose time goes to single C calls
# (no instruction hook between them) stop at --frontend-timeout with one line
# naming the line (first line of the file: `-- expect: LINE: SUBSTRING`).
for f in tests/dsl/slow_*.lua; do
    expect=$(head -1 "$f" | sed -n 's/^-- expect: \([0-9]*\): \(.*\)$/\1:\2/p')
    line=${expect%%:*}; sub=${expect#*:}
    t0=$(date +%s.%N)
    err=$(timeout 60 "$K" dump "$f" --frontend-timeout 1 2>&1 >/dev/null); rc=$?
    secs=$(echo "$(date +%s.%N) - $t0" | bc)
    nl=$(printf '%s\n' "$err" | wc -l)
    if [ "$rc" = 1 ] && [ "$nl" = 1 ] && [[ "$err" == "$f:$line:"* ]] && [[ "$err" == *"$sub"* ]] && (( $(echo "$secs < 5" | bc) )); then
        ok "$f stops in ${secs}s (< 5 s): $err"
    else
        notok "$f: rc=$rc lines=$nl after ${secs}s; want '$f:$line: ...$sub...' got '$err'"
    fi
done
