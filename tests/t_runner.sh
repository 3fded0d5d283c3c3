#!/usr/bin/env bash
# tests/run.sh counts what ran: a "# SKIP" line is a skip, not a pass, and is
# listed by name; a failure and a crash (non-zero exit without a "not ok")
# are failures; the closing line is "N passed, N failed, N skipped".
. "$(dirname "$0")/lib.sh"
printf 'echo "ok 1 - a"\necho "ok 2 - b # SKIP no GPU here"\necho "ok 3 - c # skip lower case"\n' > "$tmp/t_skips.sh"
printf 'echo "ok 1 - d"\necho "not ok 2 - e"\nexit 1\n' > "$tmp/t_fails.sh"
printf 'echo "ok 1 - f"\nexit 3\n' > "$tmp/t_crash.sh"
out=$(KILN_RUN_ONLY="$tmp/t_skips.sh $tmp/t_fails.sh $tmp/t_crash.sh" bash tests/run.sh 2>&1); rc=$?
last=$(printf '%s\n' "$out" | tail -1)
check "three passes, two skips, a failure and a crash: \"$last\"" "[ '$last' = '3 passed, 2 failed, 2 skipped' ]"
check "the skipped checks are listed by name" "printf '%s\n' \"\$out\" | grep -q 't_skips.sh: ok 2 - b # SKIP no GPU here'"
check "a crash without a \"not ok\" is a failure" "printf '%s\n' \"\$out\" | grep -q 'not ok - t_crash.sh exited 3'"
check "run.sh exits non-zero when something failed (rc $rc)" "[ $rc -ne 0 ]"
out=$(KILN_RUN_ONLY="$tmp/t_skips.sh" bash tests/run.sh 2>&1); rc=$?
check "only passes and skips: exit 0, \"$(printf '%s\n' "$out" | tail -1)\"" "[ $rc -eq 0 ] && [ \"\$(printf '%s\n' \"\$out\" | tail -1)\" = '1 passed, 0 failed, 2 skipped' ]"
echo "1..$n"
