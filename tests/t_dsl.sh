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
# A .ir that stops before the passes a command needs is refused in one line
# (it reached emit's internal error before); a NUL byte is an error at its line.
one_line() { # description, expected substring, args...
    local desc=$1 sub=$2; shift 2
    err=$(timeout 60 "$K" "$@" 2>&1 >/dev/null); rc=$?
    nl=$(printf '%s\n' "$err" | wc -l)
    if [ "$rc" = 1 ] && [ "$nl" = 1 ] && [[ "$err" == *"$sub"* ]]; then ok "$desc: $err"; else notok "$desc: rc=$rc got '$err'"; fi
}
"$K" dump models/tiny.lua --after optimizer -o "$tmp/opt.ir"
one_line "compile of a dump after the optimizer" "opt.ir: the dump stops after optimizer, and this command needs the passes up to memplan" \
    compile "$tmp/opt.ir" --target cpu -o "$tmp/never"
"$K" dump models/tiny.lua --after autodiff -o "$tmp/ad.ir"
one_line "run --interp of a dump after autodiff" "ad.ir: the dump stops after autodiff, and this command needs the passes up to optimizer" \
    run "$tmp/ad.ir" --interp --data README.md --steps 1
printf 'module x mesh=1x1x1x1\nstage 0\n\0\n' > "$tmp/nul.ir"
one_line "a NUL byte in a .ir" "nul.ir:3: a NUL byte" dump "$tmp/nul.ir"
