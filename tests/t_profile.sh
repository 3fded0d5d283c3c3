#!/usr/bin/env bash
# --device-profile on the command line (docs/profiles.md): a shipped name is
# found beside the binary from any working directory (a copy of build/kiln
# next to a copy of profiles/, as in a fresh clone), $KILN_PROFILES
# overrides, kiln plan prints the profile first, and a bad profile or name
# is one line on stderr with exit status 1.
. "$(dirname "$0")/lib.sh"

mkdir -p "$tmp/clone/build" "$tmp/env" "$tmp/cwd"
cp "$K" "$tmp/clone/build/kiln"
cp -r profiles "$tmp/clone/profiles"
cp -r models "$tmp/cwd/models"
first=$(cd "$tmp/cwd" && "$tmp/clone/build/kiln" plan models/tiny.lua --device-profile h200 2>&1 | head -1)
check "h200 found beside the copied binary, from another folder: $first" \
    "[[ '$first' == 'device h200-sxm ($tmp/clone/build/../profiles/h200-sxm.profile): 141 GB'* ]]"
sed 's/^name .*/name renamed/' profiles/cpu.profile > "$tmp/env/cpu.profile"
first=$(KILN_PROFILES="$tmp/env" "$K" plan models/tiny.lua --device-profile cpu 2>&1 | head -1)
check "\$KILN_PROFILES is looked in first: $first" "[[ '$first' == 'device renamed ($tmp/env/cpu.profile)'* ]]"

# bad ones: the line, and the status
bad() { # DESCRIPTION WANT ARGS...
    local d=$1 want=$2
    shift 2
    local out rc
    out=$("$K" plan models/tiny.lua "$@" 2>&1)
    rc=$?
    check "$d: $out" "[ $rc = 1 ] && [ \"\$(printf '%s\n' \"\$out\" | wc -l)\" = 1 ] && [[ \"\$out\" == \"\$want\" ]]"
}
grep -v '^node_size' profiles/h100-sxm.profile > "$tmp/missing.profile"
bad "a missing field" "kiln: --device-profile: $tmp/missing.profile: missing field \"node_size\"" --device-profile "$tmp/missing.profile"
sed 's/^h2d_bw .*/h2d_bw -20e9/' profiles/h100-sxm.profile > "$tmp/neg.profile"
line=$(grep -n '^h2d_bw' "$tmp/neg.profile" | cut -d: -f1)
bad "a negative field" "kiln: --device-profile: $tmp/neg.profile:$line: field \"h2d_bw\" is negative (-20e9)" --device-profile "$tmp/neg.profile"
bad "an unknown name" 'kiln: --device-profile: no device profile named "v100" (shipped: cpu, h100-sxm, h200-sxm, a100-80g; or give a path)' --device-profile v100
bad "no value" "kiln: --device-profile: unknown flag or missing value" --device-profile
echo "1..$n"
