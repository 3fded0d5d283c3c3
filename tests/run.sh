#!/usr/bin/env bash
# tests/run.sh — run every test and print one closing line
# "N passed, N failed, N skipped".
#
# Each test program speaks TAP ("ok N - name" / "not ok N - name"): the cmocka
# binaries (CMOCKA_MESSAGE_OUTPUT=tap), the shell tests tests/t_*.sh and the
# PyTorch reference tests/test_torch.py.  An "ok" line with a "# SKIP"
# directive is a skip, not a pass: a check may skip only where a resource is
# truly absent on this machine (a GPU); what `make test` installs (MPI, the
# GPT-2 BPE files, PyTorch) must be there, and its absence is a failure.  The
# skipped checks are listed by name before the closing line.  A program that
# exits non-zero without reporting a failure (a crash) counts as one failure.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
export BUILD CMOCKA_MESSAGE_OUTPUT=tap
passed=0 failed=0 skipped=0
log=$(mktemp) skips=$(mktemp)
trap 'rm -f "$log" "$skips"' EXIT

run_one() { # name, command...
    local name=$1; shift
    local start=$SECONDS
    "$@" >"$log" 2>&1
    local rc=$?
    local ok notok skip
    skip=$(grep -c -i '^ok .*# *skip' "$log")
    ok=$(($(grep -c '^ok ' "$log") - skip))
    notok=$(grep -c '^not ok ' "$log")
    grep -i '^ok .*# *skip' "$log" | sed "s/^/  $name: /" >> "$skips"
    if [ "$rc" -ne 0 ] && [ "$notok" -eq 0 ]; then notok=1; echo "not ok - $name exited $rc"; fi
    if [ "$notok" -gt 0 ] || [ "$rc" -ne 0 ]; then
        grep -v '^ok ' "$log" | head -60
    fi
    passed=$((passed + ok)); failed=$((failed + notok)); skipped=$((skipped + skip))
    printf '%-28s %3d passed, %d failed, %d skipped (%ds)\n' "$name" "$ok" "$notok" "$skip" $((SECONDS - start))
}

if [ -n "${KILN_RUN_ONLY:-}" ]; then # tests/t_runner.sh: these scripts only
    for t in $KILN_RUN_ONLY; do run_one "$(basename "$t")" bash "$t"; done
else
    for t in "$BUILD"/tests/test_*; do
        [ -x "$t" ] || continue
        run_one "$(basename "$t")" "$t"
    done
    for t in tests/t_*.sh; do
        [ -e "$t" ] || continue
        run_one "$(basename "$t")" bash "$t"
    done
    if [ -e tests/test_torch.py ]; then
        run_one test_torch.py /usr/bin/python3 tests/test_torch.py
    fi
fi
if [ -s "$skips" ]; then
    echo "skipped:"
    cat "$skips"
fi
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
