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
#
# Parallel: KILN_JOBS tests run at once (default 2; KILN_JOBS=1 is the old
# serial runner).  Many tests leave a core idle (one-threaded compiles and
# NVRTC, ranks waiting on each other), so two at a time on a 2-core machine
# cut the wall time.  Each test writes its own log; the per-test lines are
# printed in the serial order (a line as soon as it and every test before it
# are done), so the output does not depend on the timing, only the
# durations in brackets do.  The tests start longest first (LPT), the
# lengths taken from the previous run's $BUILD/test-times.txt ("name wall_s
# cpu_s" per test, written at the end of a whole run) or, in a fresh
# build, from the LONG list below.  Tests that share a file take turns
# themselves (flock: tests/lib.sh's need_corpus, tests/cuda_fake's build
# scripts); the rest share nothing but the read-only build.
#
# Env: KILN_JOBS (see above), KILN_RUN_ONLY="tests/t_x.sh ..." (run these
# scripts only; tests/t_runner.sh uses it), BUILD (default build),
# KILN_CACHE_DIR (the NVRTC cache; default: a new one for the run).
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
JOBS=${KILN_JOBS:-2}
case $JOBS in '' | *[!0-9]* | 0) echo "run.sh: KILN_JOBS=$JOBS: want a number >= 1" >&2; exit 2 ;; esac
export BUILD CMOCKA_MESSAGE_OUTPUT=tap
# the longest tests of a whole run (CI, 2 cores, serial, seconds): the
# start order when $BUILD/test-times.txt is not there yet
LONG="t_cuda_fake.sh:129 t_fuzz.sh:123 t_cuda_target.sh:94 test_nvrtc:69 t_cuda_attention_tc.sh:65
      t_pp_train.sh:50 t_offload_run.sh:45 t_tp_train.sh:40 t_dp_train.sh:40 t_cp_train.sh:40
      t_offload_cuda.sh:40 t_window.sh:35 t_cuda_emu.sh:35 t_cuda_attention.sh:30
      t_cuda_xent.sh:40 t_cuda_epilogue.sh:40 t_lhs.sh:30 t_cuda_trace.sh:15"
TIMES=$BUILD/test-times.txt
dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$dir"' EXIT
# one NVRTC cache for the run (compiler/emit/nvrtc_cache.c), empty at the
# start: the library kernels are compiled once, not per test, and nothing
# depends on what an earlier run left in ~/.cache; KILN_CACHE_DIR set by the
# caller is used as it is (a kept cache makes reruns faster)
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-$dir/nvrtc}

# ---- the tests, in the printing order ----
names=() cmds=()
add() { names+=("$1"); shift; cmds+=("$(printf '%q ' "$@")"); }
if [ -n "${KILN_RUN_ONLY:-}" ]; then # tests/t_runner.sh: these scripts only
    for t in $KILN_RUN_ONLY; do add "$(basename "$t")" bash "$t"; done
else
    for t in "$BUILD"/tests/test_*; do
        [ -x "$t" ] && add "$(basename "$t")" "$t"
    done
    for t in tests/t_*.sh; do
        [ -e "$t" ] && add "$(basename "$t")" bash "$t"
    done
    [ -e tests/test_torch.py ] && add test_torch.py /usr/bin/python3 tests/test_torch.py
fi

# ---- the start order: the longest first ----
expected() { # name: seconds it took last time (0 when unknown)
    local s
    s=$( { [ -f "$TIMES" ] && awk -v n="$1" '$1 == n { print $2; exit }' "$TIMES"; } 2>/dev/null)
    [ -n "$s" ] || s=$(printf '%s\n' $LONG | awk -F: -v n="$1" '$1 == n { print $2; exit }')
    echo "${s:-0}"
}
order=()
if [ "$JOBS" -gt 1 ]; then
    mapfile -t order < <(for i in "${!names[@]}"; do echo "$(expected "${names[i]}") $i"; done | sort -s -k1,1nr | cut -d' ' -f2)
else
    order=("${!names[@]}")
fi

# ---- one test: its log, then "rc wall_s cpu_s" in $dir/I.done ----
job() {
    local i=$1 start=$SECONDS rc
    eval "${cmds[i]}" > "$dir/$i.log" 2>&1 < /dev/null
    rc=$?
    # the children's user and system time (the second line of `times`; not
    # in a pipe: a forked shell's children are not this one's)
    times > "$dir/$i.cpu"
    awk -v rc=$rc -v wall=$((SECONDS - start)) 'NR == 2 {
        u = $1; s = $2; sub(/s$/, "", u); sub(/s$/, "", s); split(u, a, "m"); split(s, b, "m")
        printf "%d %d %.1f\n", rc, wall, a[1] * 60 + a[2] + b[1] * 60 + b[2] }' "$dir/$i.cpu" > "$dir/$i.tmp"
    mv "$dir/$i.tmp" "$dir/$i.done"
}

# ---- the report of test I, in the serial order ----
passed=0 failed=0 skipped=0
: > "$dir/skips"
report() {
    local i=$1 name=${names[$1]} log=$dir/$1.log rc wall cpu ok notok skip
    read -r rc wall cpu < "$dir/$i.done"
    skip=$(grep -c -i '^ok .*# *skip' "$log")
    ok=$(($(grep -c '^ok ' "$log") - skip))
    notok=$(grep -c '^not ok ' "$log")
    grep -i '^ok .*# *skip' "$log" | sed "s/^/  $name: /" >> "$dir/skips"
    if [ "$rc" -ne 0 ] && [ "$notok" -eq 0 ]; then notok=1; echo "not ok - $name exited $rc"; fi
    if [ "$notok" -gt 0 ] || [ "$rc" -ne 0 ]; then
        grep -v '^ok ' "$log" | head -60
    fi
    passed=$((passed + ok)); failed=$((failed + notok)); skipped=$((skipped + skip))
    printf '%-28s %3d passed, %d failed, %d skipped (%ds)\n' "$name" "$ok" "$notok" "$skip" "$wall"
    echo "$name $wall $cpu" >> "$dir/times"
}
next=0
flush() { # report every finished test whose predecessors are all reported
    while [ "$next" -lt ${#names[@]} ] && [ -e "$dir/$next.done" ]; do
        report "$next"
        next=$((next + 1))
    done
}

for i in "${order[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do
        wait -n
        flush
    done
    job "$i" &
done
while [ -n "$(jobs -rp)" ]; do
    wait -n
    flush
done
wait
flush

if [ -s "$dir/skips" ]; then
    echo "skipped:"
    cat "$dir/skips"
fi
# the durations, for the next run's start order (whole runs only)
[ -z "${KILN_RUN_ONLY:-}" ] && [ -d "$BUILD" ] && sort -k2,2nr "$dir/times" > "$TIMES" 2>/dev/null
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
