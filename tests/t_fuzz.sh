#!/usr/bin/env bash
# A short libFuzzer run of the IR text parser (tests/fuzz_irtext.c): every
# input that parses must verify, dump, re-parse to an equal module and re-dump
# byte-identically; no input may crash, hang or trip ASan/UBSan.  Longer runs:
#   make fuzz FUZZ_SECONDS=300
. "$(dirname "$0")/lib.sh"
out=$tmp/out
if ! make -s "$B/fuzz_irtext" BUILD="$B" > "$out" 2>&1; then
    echo "not ok 1 - build the fuzz target"; cat "$out"; exit 1
fi
echo "ok 1 - build the fuzz target"
mkdir -p "$B/fuzz-corpus"
if "$B/fuzz_irtext" -max_total_time="${FUZZ_SECONDS:-15}" -max_len=4096 -timeout=10 \
       "$B/fuzz-corpus" tests/fuzz-seeds > "$out" 2>&1; then
    echo "ok 2 - fuzz the IR parser for ${FUZZ_SECONDS:-15} s: $(grep -o 'Done [0-9]* runs' "$out")"
else
    echo "not ok 2 - the fuzzer found a failure:"; tail -40 "$out"
fi
