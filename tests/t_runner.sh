#!/usr/bin/env bash
# tests/run.sh counts what ran: a "# SKIP" line is a skip, not a pass, and is
# listed by name; a failure and a crash (non-zero exit without a "not ok")
# are failures; the closing line is "N passed, N failed, N skipped".
# KILN_JOBS=2 (the default) runs two tests at once and prints the same lines
# in the same order as KILN_JOBS=1; the longest tests (the previous run's
# $BUILD/test-times.txt) start first.
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

# ---- parallel ----
# two scripts that each wait for the other to start: they pass only when
# they run at once (each gives up after 30 s)
printf 'touch %s/a_started\nfor i in $(seq 300); do [ -e %s/b_started ] && break; sleep 0.1; done\n[ -e %s/b_started ] && echo "ok 1 - b ran beside a" || echo "not ok 1 - b did not start while a ran"\n' "$tmp" "$tmp" "$tmp" > "$tmp/t_a.sh"
printf 'touch %s/b_started\nfor i in $(seq 300); do [ -e %s/a_started ] && break; sleep 0.1; done\n[ -e %s/a_started ] && echo "ok 1 - a ran beside b" || echo "not ok 1 - a did not start while b ran"\n' "$tmp" "$tmp" "$tmp" > "$tmp/t_b.sh"
out=$(KILN_JOBS=2 KILN_RUN_ONLY="$tmp/t_a.sh $tmp/t_b.sh" bash tests/run.sh 2>&1); rc=$?
check "KILN_JOBS=2: two tests run at once (\"$(printf '%s\n' "$out" | tail -1)\")" "[ $rc -eq 0 ] && [ \"\$(printf '%s\n' \"\$out\" | tail -1)\" = '2 passed, 0 failed, 0 skipped' ]"
# the lines come in the serial order whatever finishes first: the first
# script is the slowest; the output without the durations is KILN_JOBS=1's
printf 'sleep 2\necho "ok 1 - slow"\n' > "$tmp/t_slow.sh"
list="$tmp/t_slow.sh $tmp/t_skips.sh $tmp/t_fails.sh $tmp/t_crash.sh"
strip() { sed 's/ ([0-9]*s)$//'; }
serial=$(KILN_JOBS=1 KILN_RUN_ONLY="$list" bash tests/run.sh 2>&1 | strip)
parallel=$(KILN_JOBS=2 KILN_RUN_ONLY="$list" bash tests/run.sh 2>&1 | strip); rc=$?
check "KILN_JOBS=2 prints KILN_JOBS=1's lines in its order (a slow first test, a failure, a crash, skips)" \
    "[ -n \"\$serial\" ] && [ \"\$serial\" = \"\$parallel\" ] && printf '%s\n' \"\$parallel\" | head -1 | grep -q '^t_slow.sh  *1 passed'"
check "KILN_JOBS=2: the closing line counts every test: \"$(printf '%s\n' "$parallel" | tail -1)\"" \
    "[ \"\$(printf '%s\n' \"\$parallel\" | tail -1)\" = '4 passed, 2 failed, 2 skipped' ]"
# the longest first: test-times.txt says t_3 took longest, t_2 next; with 2
# jobs t_3 and t_2 start first and t_1 only when one of them has finished
mkdir -p "$tmp/b" && printf 't_3.sh 90 1\nt_2.sh 50 1\nt_1.sh 1 1\n' > "$tmp/b/test-times.txt"
for k in 1 2 3; do printf 'echo %s >> %s/started\nsleep 1\necho "ok 1 - %s"\n' "$k" "$tmp" "$k" > "$tmp/t_$k.sh"; done
out=$(BUILD=$tmp/b KILN_JOBS=2 KILN_RUN_ONLY="$tmp/t_1.sh $tmp/t_2.sh $tmp/t_3.sh" bash tests/run.sh 2>&1)
check "the longest (test-times.txt) start first: started $(tr '\n' ' ' < "$tmp/started")" \
    "[ \"\$(tail -1 '$tmp/started')\" = 1 ] && [ \"\$(printf '%s\n' \"\$out\" | head -1 | cut -d' ' -f1)\" = t_1.sh ]"
out=$(KILN_JOBS=two KILN_RUN_ONLY="$tmp/t_1.sh" bash tests/run.sh 2>&1); rc=$?
check "KILN_JOBS=two: one line, exit 2 ($out)" "[ $rc -eq 2 ] && [ \$(printf '%s\n' \"\$out\" | wc -l) -eq 1 ]"
echo "1..$n"
