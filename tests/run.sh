#!/usr/bin/env bash
# tests/run.sh — run every test and print one closing line "N passed, N failed".
#
# Each test program speaks TAP ("ok N - name" / "not ok N - name"): the cmocka
# binaries (CMOCKA_MESSAGE_OUTPUT=tap), the shell tests tests/t_*.sh and the
# PyTorch reference tests/test_torch.py.  A program that exits non-zero
# without reporting a failure (a crash) counts as one failure.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
export BUILD CMOCKA_MESSAGE_OUTPUT=tap
passed=0 failed=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT

run_one() { # name, command...
    local name=$1; shift
    local start=$SECONDS
    "$@" >"$log" 2>&1
    local rc=$?
    local ok notok
    ok=$(grep -c '^ok ' "$log")
    notok=$(grep -c '^not ok ' "$log")
    if [ "$rc" -ne 0 ] && [ "$notok" -eq 0 ]; then notok=1; echo "not ok - $name exited $rc"; fi
    if [ "$notok" -gt 0 ] || [ "$rc" -ne 0 ]; then
        grep -v '^ok ' "$log" | head -60
    fi
    passed=$((passed + ok)); failed=$((failed + notok))
    printf '%-28s %3d passed, %d failed (%ds)\n' "$name" "$ok" "$notok" $((SECONDS - start))
}

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
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
