#!/usr/bin/env bash
# kiln plan --pp N (issue 18): the pipeline section after the memory report.
# Its numbers against independent readings: each stage's total is the sum of
# its columns and equals memplan's "total" line for that stage (0.02 MiB:
# the table rounds four columns to 0.01); the closed-form bubble of 1f1b at
# p=2, m=4 is (p-1)/(m+p-1) = 0.2 exactly; zb-h1's bubble from the ops'
# costs is below 1f1b's on the same model, and equals the bubble no order
# within its in-flight bound can go below (ppsched_makespan_bound), which
# interleaved's stays above; the bytes each rank sends over pp
# equal awk's count over `kiln dump`'s send lines (the sent value's shape x
# its dtype's bytes), exactly.  --pp-schedule all: a row per schedule (4 on
# a 4-layer GPT at pp 2, m 4; 2 rows and 2 refusals on the 2-layer one),
# its 1f1b row equal to the section's.  --timeline: an SVG that parses,
# one row per rank.  A .ir dump read with its flags gives the .lua's
# numbers; flags that cannot be the dump's are refused.  Bad input: one
# line, exit 1.
. "$(dirname "$0")/lib.sh"
GPT4="models/tiny.lua --set layers=4"

plan() { "$K" plan "$@" 2> "$tmp/err"; }
num() { sed -n "s/$1/\1/p" | head -1; } # num REGEX-with-one-group < text

# ---- the section ----
out=$(plan models/tiny.lua --pp 2 --micro-batches 4); rc=$?
check "kiln plan --pp 2 prints the pipeline section (rc $rc)" "[ $rc = 0 ] && grep -q '^pipeline: 1f1b, p 2, v 1, m 4' <<< \"\$out\""
rows=$(awk '/^pipeline: /{t=1; next} t && /^ +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9]+$/' <<< "$out")
check "a row per stage ($(wc -l <<< "$rows"))" "[ $(wc -l <<< "$rows") = 2 ]"
check "each stage's total is the sum of params, grads, optimizer, act. peak (0.02 MiB)" \
    "awk '{d=\$2+\$3+\$4+\$5-\$6; if (d > 0.02 || d < -0.02) bad=1} END{exit bad}' <<< \"\$rows\""
mem=$(awk '/^memory per rank of pipeline stage/{s=$NF+0} /^  total /{print s, $(NF-1)}' <<< "$out")
check "each stage's total equals memplan's total line for that stage (0.02 MiB)" \
    "awk 'NR==FNR{b[\$1]=\$2; next} {d=\$6-b[\$1]/1048576; if (!(\$1 in b) || d > 0.02 || d < -0.02) bad=1} END{exit bad}' <(echo \"\$mem\") <(echo \"\$rows\")"
closed=$(num '.*closed form \([0-9.]*\) at equal.*' <<< "$out")
check "1f1b's closed form at p=2, m=4 is 0.2 ($closed)" "[ '$closed' = 0.2000 ]"
skew=$(num '.*first stage against last: .* = \([0-9.]*\)x$' <<< "$out")
check "the first stage's activation peak against the last's is printed ($skew)" "[ -n '$skew' ]"

# ---- bytes over pp against the dump's sends ----
# per stage: the type of every value defined (%ID:DT[dims] before " = "),
# then each send's input; bytes = product of dims x dtype size
dump_sent() {
    "$K" dump "$@" | awk '
        BEGIN { sz["f32"] = 4; sz["bf16"] = 2; sz["f16"] = 2; sz["i32"] = 4; sz["i64"] = 8 }
        /^stage / { s = $2; delete ty; next }
        /^%[0-9]+:/ { lhs = $0; sub(/ = .*/, "", lhs); n = split(lhs, defs, /, /)
                      for (i = 1; i <= n; i++) { split(defs[i], kv, ":"); ty[kv[1]] = kv[2] } }
        /^send / && /group="pp"/ { t = ty[$2]; dt = t; sub(/\[.*/, "", dt); d = t; sub(/^[^[]*\[/, "", d); sub(/\].*/, "", d)
                                   k = split(d, dim, ","); b = sz[dt]; for (i = 1; i <= k; i++) b *= dim[i]; sent[s] += b }
        END { for (r in sent) print r, sent[r] }' | sort -n
}
plan_sent() { "$K" plan "$@" | sed -n 's/^  sent over pp per step://p' | tr ',' '\n' | sed -n 's/ *rank \([0-9]*\) \([0-9]*\) bytes.*/\1 \2/p'; }
for args in "models/tiny.lua --pp 2 --micro-batches 4" "$GPT4 --pp 2 --micro-batches 4 --pp-schedule interleaved" \
            "models/tiny.lua --set layers=8 --set dim=32 --set heads=2 --pp 4 --micro-batches 4 --pp-schedule zb-v" "$GPT4 --pp 2 --dp 2 --micro-batches 2 --pp-schedule zb-h1"; do
    a=$(plan_sent $args); b=$(dump_sent $args)
    check "bytes sent over pp per rank == the dump's sends ($args: $(echo $a))" "[ -n '$a' ] && [ '$a' = '$b' ]"
done

# ---- the bubble from the ops' costs ----
bubble() { plan $GPT4 --pp 2 --micro-batches 4 --pp-schedule "$1" | num '^  bubble \([0-9.]*\) from.*'; }
b1=$(bubble 1f1b); bz=$(bubble zb-h1)
check "zb-h1's bubble from the ops' costs ($bz) is below 1f1b's ($b1)" "awk -v a='$bz' -v b='$b1' 'BEGIN{exit !(a != \"\" && b != \"\" && a < b)}'"
# The bubble no order within the in-flight bounds can go below
# (ppsched_makespan_bound): zb-h1 reaches it on this model (its W placement
# is the best at these costs); interleaved does not, and its bound is below
# its bubble.
lbz=$(plan $GPT4 --pp 2 --micro-batches 4 --pp-schedule zb-h1 | grep '^  no order within')
check "zb-h1 reaches the bound ($lbz)" "grep -q 'below bubble $bz at these costs.*: this order reaches it' <<< '$lbz'"
plan $GPT4 --pp 2 --micro-batches 4 --pp-schedule interleaved | grep -e '^  bubble' -e '^  no order within' > "$tmp/lbi"
check "interleaved's bound is below its bubble ($(cut -c1-60 "$tmp/lbi" | paste -sd' ' -))" \
    "awk '/^  bubble/{b=\$2} /^  no order/{l=\$9; r=/reaches/} END{exit !(l != \"\" && l + 0 < b + 0 && !r)}' '$tmp/lbi'"
# A recompute node runs in the action that reads it: the first chunk sends
# no input gradient, so its B is empty, and its recompute runs inside W;
# without the recompute the first chunk's W grows by exactly the recompute's
# FLOPs, never its B.
row() { plan $GPT4 --pp 2 --micro-batches 4 --pp-schedule zb-h1 --recompute "$1" | sed -n "s/^  $2 per chunk and micro-batch (MFLOP): //p"; }
b0=$(row full B | awk '{print $1}')
check "zb-h1 --recompute full: the first chunk's B is empty ($b0 MFLOP)" "[ '$b0' = 0 ]"
wf=$(row full W | awk '{print $1}'); wn=$(row none W | awk '{print $1}')
check "its recompute is counted in W ($wf > $wn MFLOP)" "awk -v a='$wf' -v b='$wn' 'BEGIN{exit !(a != \"\" && a > b)}'"

# a .ir dump (no schedule recorded) read with the flags it was built with
"$K" dump $GPT4 --pp 2 --micro-batches 4 --pp-schedule zb-h1 -o "$tmp/zb.ir"
bir=$(plan "$tmp/zb.ir" --pp 2 --micro-batches 4 --pp-schedule zb-h1 | num '^  bubble \([0-9.]*\) from.*')
check "a .ir dump planned with its flags gives the .lua's bubble ($bir, $bz)" "[ -n '$bir' ] && [ '$bir' = '$bz' ]"

# ---- --pp-schedule all ----
all=$(plan $GPT4 --pp 2 --micro-batches 4 --pp-schedule all); rc=$?
nrow=$(grep -cE '^  (1f1b|interleaved|zb-h1|zb-v) +[0-9]+ +[0-9.]+ +[0-9.]+ ' <<< "$all")
check "--pp-schedule all: 4 rows at pp 2, m 4 on a 4-layer GPT (rc $rc, $nrow)" "[ $rc = 0 ] && [ $nrow = 4 ]"
row=$(grep -E '^  1f1b ' <<< "$all" | awk '{print $3}')
check "its 1f1b row's bubble is the section's ($row, $b1)" "[ '$row' = '$b1' ]"
all2=$(plan models/tiny.lua --pp 2 --micro-batches 4 --pp-schedule all)
check "on 2 layers: interleaved and zb-v refused with the reason, 2 rows" \
    "[ \$(grep -c 'refused: 4 chunks (--pp 2 x 2), but the model has 2 layers' <<< \"\$all2\") = 2 ] && [ \$(grep -cE '^  (1f1b|zb-h1) +1 +[0-9.]+' <<< \"\$all2\") = 2 ]"

all3=$(plan models/tiny.lua --set layers=6 --pp 2 --micro-batches 4 --pp-schedule all --vpp 3)
check "--pp-schedule all --vpp 3: interleaved at v 3, zb-v at 2" \
    "grep -qE '^  interleaved +3 +[0-9.]+' <<< \"\$all3\" && grep -qE '^  zb-v +2 +[0-9.]+' <<< \"\$all3\""

# ---- --timeline ----
plan $GPT4 --pp 4 --micro-batches 8 --pp-schedule zb-h1 --timeline "$tmp/tl.svg" > /dev/null
say $? "--timeline FILE.svg ($(head -c 200 "$tmp/err"))"
check "the SVG parses" "python3 -c 'import xml.dom.minidom,sys; xml.dom.minidom.parse(sys.argv[1])' $tmp/tl.svg"
rows=$(grep -c '<rect class="row"' "$tmp/tl.svg")
check "one row per rank ($rows)" "[ $rows = 4 ]"

# ---- bad input: one line, exit 1 ----
bad() { # description, args...
    local d=$1; shift
    "$K" "$@" > /dev/null 2> "$tmp/err"; local rc=$?
    check "$d: one line, exit 1 ($(head -c 160 "$tmp/err"))" "[ $rc = 1 ] && [ \$(wc -l < $tmp/err) = 1 ]"
}
bad "--timeline into a missing folder" plan models/tiny.lua --pp 2 --micro-batches 4 --timeline "$tmp/no/such/dir/tl.svg"
bad "--timeline over the model" plan models/tiny.lua --pp 2 --micro-batches 4 --timeline models/tiny.lua
bad "--pp-schedule all with kiln check" check models/tiny.lua --pp 2 --micro-batches 4 --pp-schedule all
bad "--pp-schedule all with kiln dump" dump models/tiny.lua --pp 2 --micro-batches 4 --pp-schedule all
bad "--timeline with kiln check" check models/tiny.lua --pp 2 --micro-batches 4 --timeline "$tmp/x.svg"
bad "--timeline without --pp" plan models/tiny.lua --timeline "$tmp/x.svg"
bad "--timeline with --pp-schedule all" plan models/tiny.lua --pp 2 --micro-batches 4 --pp-schedule all --timeline "$tmp/x.svg"
bad "a zb-h1 dump read as 1f1b" plan "$tmp/zb.ir" --pp 2 --micro-batches 4
bad "a dump of 4 micro-batches read with 2" plan "$tmp/zb.ir" --pp 2 --micro-batches 2 --pp-schedule zb-h1
bad "--pp-schedule all on a .ir dump" plan "$tmp/zb.ir" --pp 2 --micro-batches 4 --pp-schedule all
check "no timeline written by the refused commands" "[ ! -e $tmp/x.svg ]"
