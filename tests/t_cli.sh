#!/usr/bin/env bash
# Bad input through the kiln binary: each gets ONE line on stderr naming the
# model's file:line (or the flag) and exit code 1 — never a crash or a hang.
. "$(dirname "$0")/lib.sh"
for f in tests/bad/*.lua; do
    n=$((n + 1))
    expect=$(head -1 "$f" | sed -n 's/^-- expect: \([0-9]*\): \(.*\)$/\1:\2/p')
    line=${expect%%:*}; sub=${expect#*:}
    err=$(timeout 60 "$K" dump "$f" 2>&1 >/dev/null); rc=$?
    nl=$(printf '%s\n' "$err" | wc -l)
    if [ "$rc" = 1 ] && [ "$nl" = 1 ] && [[ "$err" == "$f:$line:"* ]] && [[ "$err" == *"$sub"* ]]; then
        echo "ok $n - $f: $err"
    else
        echo "not ok $n - $f: rc=$rc lines=$nl want '$f:$line: ...$sub...' got '$err'"
    fi
done
bad_flag() { # description, expected substring, args...
    local desc=$1 sub=$2; shift 2
    n=$((n + 1))
    err=$(timeout 60 "$K" "$@" 2>&1 >/dev/null); rc=$?
    nl=$(printf '%s\n' "$err" | wc -l)
    if [ "$rc" = 1 ] && [ "$nl" = 1 ] && [[ "$err" == *"$sub"* ]]; then echo "ok $n - $desc: $err"
    else echo "not ok $n - $desc: rc=$rc got '$err'"; fi
}
bad_flag "unknown command" "unknown command" frobnicate models/tiny.lua
# the unknown-command message names every command `kiln --help` lists, and
# each name it gives is a command (not itself unknown)
n=$((n + 1))
msg=$("$K" frobnicate 2>&1 >/dev/null)
helped=$("$K" --help | sed -n 's/^ *\(usage: \)\{0,1\}kiln \([a-z]*\) .*/\2/p' | sort -u)
listed=$(printf '%s\n' "$msg" | sed -n 's/.*(\(.*\); see kiln --help)$/\1/p' | tr -d ' ' | tr ',' '\n' | sort -u)
unknown=$(for c in $listed; do "$K" "$c" 2>&1 | grep -q 'unknown command' && echo "$c"; done)
if [ -n "$helped" ] && [ "$helped" = "$listed" ] && [ -z "$unknown" ]; then echo "ok $n - the unknown-command message lists every command of --help: $(echo $listed)"
else echo "not ok $n - unknown-command message lists '$(echo $listed)', --help '$(echo $helped)', not commands: '$unknown'"; fi
bad_flag "unknown flag" "--bogus" dump models/tiny.lua --bogus 1
bad_flag "missing model file" "nosuch.lua" dump nosuch.lua
bad_flag "unknown --set key" "nosuchkey" dump models/tiny.lua --set nosuchkey=3
bad_flag "malformed --set" "--set" dump models/tiny.lua --set novalue
bad_flag "unknown pass" "--after" dump models/tiny.lua --after nosuchpass
bad_flag "tp not dividing a dim" "--tp 3" check models/tiny.lua --tp 3
bad_flag "run without data" "--data" run models/tiny.lua --interp
bad_flag "missing data file" "--data" run models/tiny.lua --interp --data /nonexistent/file.txt
printf '%s\n' 'module x mesh=1x1x1x1' 'stage 0' '%0:f32[2] = frob' > "${TMPDIR:-/tmp}/kiln_bad.ir"
bad_flag "bad IR text" "kiln_bad.ir:3:" dump "${TMPDIR:-/tmp}/kiln_bad.ir"
printf '%s\n' 'module x mesh=1x1x1x1' 'stage 0' '%0:f32[2] = param {name="w"}   # m.lua:1 L-1 fwd' \
    '%1:f32[1099511627776,1099511627776,1099511627776,1,1] = broadcast %0 {shape=[1099511627776,1099511627776,1099511627776,1,2]}   # m.lua:2 L-1 fwd' \
    > "${TMPDIR:-/tmp}/kiln_bad.ir"
bad_flag "IR with a shape overflowing int64" "kiln_bad.ir:4:" dump "${TMPDIR:-/tmp}/kiln_bad.ir"
printf '%s\n' 'module x mesh=1x65536x1x1' 'stage 0' '%0:f32[281474976710656] = param {name="w"}   # m.lua:1 L-1 fwd' \
    '%1:f32[1] = allgather %0 {group="dp", dim=0}   # m.lua:2 L-1 fwd' > "${TMPDIR:-/tmp}/kiln_bad.ir"
bad_flag "IR allgather overflowing the size bound" "kiln_bad.ir:4:" dump "${TMPDIR:-/tmp}/kiln_bad.ir"
rm -f "${TMPDIR:-/tmp}/kiln_bad.ir"
bad_flag "--precision bf16 for the CPU trainer" "the CPU target is f32" compile models/tiny.lua --precision bf16 -o "${TMPDIR:-/tmp}/kiln_never"
bad_flag "--precision f16" "--precision: expected f32 or bf16" dump models/tiny.lua --precision f16
n=$((n + 1))
out=$(timeout 120 "$K" check models/tiny.lua --set layers=1 --precision bf16 2>&1 | tail -1)
if [[ "$out" == *" 0 mismatched" ]]; then echo "ok $n - kiln check --precision bf16 (f32 vs f64 interpreter, tolerance 0.1): $out"
else echo "not ok $n - kiln check --precision bf16: $out"; fi
