#!/usr/bin/env bash
# kiln plan --offload and kiln plan --max-seq (issue 19; compiler/cmd/plan_offload.c):
# - the table per rank and virtual stage: the device peak with offload equals
#   the memory report's total of the same plan, without it equals the total
#   of the --offload none plan; it falls on the first stages of --pp 4 and
#   not on the last; the last rank offloads nothing; saved >= offloaded;
# - predicted exposed copy time: 0 with free copies, most of the step with
#   copies at 1 kB/s (the simulation sees the copies);
# - --max-seq: none <= gemm-last <= gemm-last + offload, and each answer is
#   checked against kiln plan itself (independently of the search): at the
#   answer the memory report's largest per-stage total fits, one step
#   (128 tokens) more does not;
# - the copies' places chosen from a profile's times (fast and crawling
#   copies, bf16 auto) pass kiln check (every rank == one device);
# - no blanket fence: h2d and comm wait for an offload only at its release
#   (after the compute stream), never for a fresh d2h record;
# - the host space: (p - r)/m of the offloaded bytes on stage r (host buffers
#   reused by lifetime), equal to its live peak; a host space above the
#   profile's host_memory_bytes: kiln compile refuses (one line), kiln plan
#   warns per rank; a negative field is one line; --offload auto stays
#   within it (no warning, compile takes it);
# - pacing: where the pipeline leaves a first stage's warm-up slack, its
#   compute waits for the d2h copies: rank 0's device peak falls, no copy
#   time exposed;
# - the fences' 8-node floor under free copies;
# - bad input: --max-seq without --memory, --memory 0: one line, exit 1.
. "$(dirname "$0")/lib.sh"
GPT4="models/tiny.lua --set layers=4"
P4="$GPT4 --pp 4 --micro-batches 8 --offload-min-bytes 1"
"$K" plan $P4 --offload all > "$tmp/all" 2>&1; rc=$?
"$K" plan $P4 > "$tmp/none" 2>&1
say $rc "kiln plan --pp 4 --offload all runs"
totals() { awk '/^  total/ {print $(NF-1)}' "$1"; }
peaks() { sed -n "s/^  rank [0-9]*: device peak \([0-9.]*\) MiB with offload, \([0-9.]*\) MiB without.*/\\$2/p" "$1"; }
mibs() { awk '{printf "%.2f\n", $1 / 1048576}'; }
with=$(peaks "$tmp/all" 1 | paste -sd' ') without=$(peaks "$tmp/all" 2 | paste -sd' ')
t_all=$(totals "$tmp/all" | mibs | paste -sd' ') t_none=$(totals "$tmp/none" | mibs | paste -sd' ')
check "device peak with offload per rank ($with MiB) = the report's totals ($t_all)" "[ -n \"$with\" ] && [ \"$with\" = \"$t_all\" ]"
check "device peak without ($without MiB) = the --offload none plan's totals ($t_none)" "[ -n \"$without\" ] && [ \"$without\" = \"$t_none\" ]"
python3 - "$with" "$without" <<'EOF'
import sys
w = list(map(float, sys.argv[1].split())); o = list(map(float, sys.argv[2].split()))
assert len(w) == len(o) == 4 and all(a < b for a, b in zip(w[:3], o[:3])) and w[3] == o[3]
EOF
say $? "the peak falls on ranks 0-2 and not on the last ($with vs $without)"
rows=$(awk '$1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ && NF == 9' "$tmp/all")
check "rows per rank and virtual stage: 4, saved >= offloaded, the last rank offloads nothing" \
    "[ \$(echo \"$rows\" | wc -l) = 4 ] && echo \"$rows\" | awk '\$3 + 0 < \$4 + 0 {exit 1} \$1 == 3 && \$4 + 0 != 0 {exit 1}'"
"$K" plan models/tiny.lua --set layers=8 --set dim=32 --set heads=2 --pp 4 --vpp 2 --pp-schedule interleaved --micro-batches 8 --offload-min-bytes 1 --offload all > "$tmp/vpp" 2>&1
nv=$(awk '$1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ && NF == 9' "$tmp/vpp" | wc -l)
check "--vpp 2: a row per rank and virtual stage ($nv)" "[ $nv = 8 ]"
sed 's/^h2d_bw .*/h2d_bw 1e3/; s/^d2h_bw .*/d2h_bw 1e3/' profiles/cpu.profile > "$tmp/slow.profile"
sed 's/^h2d_bw .*/h2d_bw 1e30/; s/^d2h_bw .*/d2h_bw 1e30/' profiles/cpu.profile > "$tmp/fast.profile"
# (the report's profile as the default "cpu" through KILN_PROFILES, so the
# pass places the copies without one, 8 nodes from their readers: with a
# profile it keeps no copy that frees nothing, and at 1 kB/s none frees
# anything, below)
mkdir -p "$tmp/fastdir" "$tmp/slowdir" && cp "$tmp/fast.profile" "$tmp/fastdir/cpu.profile" && cp "$tmp/slow.profile" "$tmp/slowdir/cpu.profile"
share() { KILN_PROFILES=$1 "$K" plan $P4 --offload all 2>&1 | sed -n 's/^  rank 0:.*exposed copy time [0-9.]* ms (\([0-9.]*\)% of the step.*/\1/p'; }
fast=$(share "$tmp/fastdir") slow=$(share "$tmp/slowdir")
check "rank 0's exposed copy time: free copies ${fast:-?}% of the step, 1 kB/s copies ${slow:-?}%" \
    "[ \"$fast\" = 0.00 ] && awk -v s=\"${slow:-0}\" 'BEGIN{exit !(s > 90)}'"

# ---- the copies' places from a profile pass kiln check ----
# (fast copies: release and reload at the 8-node floor, OFFLOAD_MIN_NODES; 100 MB/s
# copies: those that still free memory, released late and reloaded early;
# at 1 kB/s no copy frees anything: none is offloaded, offload.c drop_useless)
G8="models/tiny.lua --set layers=8 --set dim=32 --set heads=2 --pp 4 --micro-batches 4 --offload-min-bytes 1"
kc() { # what flags...
    local what=$1; shift
    out=$(timeout 300 "$K" check $G8 "$@" 2>&1); rc=$?
    [ $rc = 0 ] && [[ "$out" == *", 0 mismatched"* ]] && [[ "$out" != *"(0 values offloaded)"* ]]
    say $? "kiln check, $what: $(grep -o '[0-9]* values offloaded' <<< "$out"); ${out##*; }"
}
kc "zb-v, all, h200's times" --pp-schedule zb-v --offload all --device-profile h200
sed 's/^h2d_bw .*/h2d_bw 1e8/; s/^d2h_bw .*/d2h_bw 1e8/' profiles/cpu.profile > "$tmp/100mb.profile"
kc "1f1b, all, copies at 100 MB/s" --pp-schedule 1f1b --offload all --device-profile "$tmp/100mb.profile"
out=$("$K" plan $G8 --pp-schedule 1f1b --offload all --device-profile "$tmp/slow.profile" 2>&1); rc=$?
none=$(grep -c "values offloaded" <<< "$out")
check "1f1b, all, copies at 1 kB/s: rc $rc, no rank offloads anything ($none host lines): no copy could free memory" "[ $rc = 0 ] && [ $none = 0 ]"
kc "interleaved, auto, bf16, h200" --vpp 2 --pp-schedule interleaved --offload auto --device-profile h200 --precision bf16

# ---- the fences' floor (offload.c, OFFLOAD_MIN_NODES): with free copies the
# times alone put the release 1 node after the offload and the reload right
# before its reader; a copy stream may not have begun by then (on the CPU a
# thread without a core), so both stay at least 8 nodes from their copy ----
"$K" dump $P4 --offload all --device-profile "$tmp/fast.profile" --after offload > "$tmp/fdump" 2>&1
floor=$(python3 - "$tmp/fdump" <<'EOF2'
import re, sys
lags, leads, pos, reload_at = [], [], {}, {}
for i, line in enumerate(open(sys.argv[1])):
    if line.startswith("stage "): reload_at = {}
    m = re.match(r"\s*%(\d+)[^=]* = (\w+)(.*)", line)
    if not m: continue
    out, op, rest = m.group(1), m.group(2), m.group(3)
    if op == "offload": lags.append(int(re.search(r"lag=(\d+)", rest).group(1)))
    for v in re.findall(r"%(\d+)", rest.split("#")[0]):
        if v in reload_at: leads.append(i - reload_at.pop(v))
    if op == "reload": reload_at[out] = i
print(len(lags), min(lags or [0]), len(leads), min(leads or [0]))
EOF2
)
set -- $floor
check "free copies: $1 offloads released at least 8 nodes later (least lag ${2:-?}), $3 reloads issued at least 8 nodes before their first reader (least ${4:-?})" \
    "[ \"${1:-0}\" -gt 0 ] && [ \"$2\" -ge 8 ] && [ \"${3:-0}\" -gt 0 ] && [ \"$4\" -ge 8 ]"

# ---- no blanket fence on the copy streams (schedule.c) ----
# The h2d and comm streams wait for an offload (an event recorded on d2h)
# only where it is released (after the compute stream waited for it: its
# device bytes are free from there), never for a fresh d2h record: a reload
# does not queue behind later offloads, nor a recv behind copies in flight.
# Checked in the dump after schedule of every stage, both profiles' places.
fences() { # flags... -> "bad/total": waits on h2d or comm for d2h events the compute stream had not waited for
    "$K" dump $P4 "$@" --after schedule 2>&1 | awk '
        /^stage / { delete rec; delete cw }
        /^ *(record|wait) \{event=/ {
            match($0, /event=[0-9]+/); e = substr($0, RSTART + 6, RLENGTH - 6)
            match($0, /stream[0-9]/); s = substr($0, RSTART + 6, 1)
            if ($0 ~ /^ *record /) { rec[e] = s; next }
            if (s == 0) cw[e] = 1
            if ((s == 1 || s == 3) && rec[e] == 2) { tot++; if (!(e in cw)) bad++ }
        }
        END { printf "%d/%d", bad + 0, tot + 0 }'
}
for fl in "--offload all" "--offload all --device-profile h200"; do
    r=$(fences $fl)
    check "$fl: waits of h2d and comm for d2h events before their release: ${r%/*} of ${r#*/}" "[ \"${r%/*}\" = 0 ] && [ \"${r#*/}\" -gt 0 ]"
done

# ---- the host space: packed by lifetime, the peak of live offloaded bytes ----
# A host buffer lives from its offload until the d2h stream knows its reload
# done (live.c), so later offloads reuse its bytes.  In 1F1B with p 4 and m 8,
# stage r (not the last) holds p - r micro-batches of saved activations at
# once, every micro-batch offloading the same tensors: the host space must
# be (p - r) / m of the offloaded bytes' sum (what it was before the reuse),
# and equal the live peak memplan reports beside it.
"$K" dump $P4 --offload all --after memplan > "$tmp/dump" 2>&1
sums=$(python3 - "$tmp/dump" <<'EOF2'
import re, sys
st, s = -1, {}
for line in open(sys.argv[1]):
    if line.startswith("stage "): st = int(line.split()[1])
    m = re.match(r"\s*%\d+:f32\[([\d,]+)\]@host\+\d+ = offload ", line)
    if m:
        n = 4
        for d in m.group(1).split(","): n *= int(d)
        s[st] = s.get(st, 0) + (n + 63) // 64 * 64
print(" ".join(str(s.get(r, 0)) for r in range(4)))
EOF2
)
hosts=$(awk '/^memory per rank of pipeline stage/ {st = $NF; sub(":", "", st); h[st] = 0} /^  host \(offload\)/ {h[st] = $5} END {for (r = 0; r < 4; r++) printf "%s ", h[r] + 0}' "$tmp/all")
lives=$(sed -n 's/^  host (offload).*live peak \([0-9.]*\) MiB.*/\1/p' "$tmp/all" | paste -sd' ')
hmib=$(awk '/^  host \(offload\)/ {print $3}' "$tmp/all" | paste -sd' ')
python3 - "$sums" "$hosts" <<'EOF2'
import sys
s = list(map(int, sys.argv[1].split())); h = list(map(int, sys.argv[2].split()))
assert all(s[r] > 0 and s[r] % 8 == 0 and h[r] == (4 - r) * s[r] // 8 for r in range(3)) and s[3] == h[3] == 0, (s, h)
EOF2
say $? "host space per stage ($hosts bytes) = (4 - r) of 8 micro-batches of the offloaded bytes ($sums, their sum)"
check "host space = its live peak per stage ($hmib = $lives MiB)" "[ -n \"$lives\" ] && [ \"$hmib\" = \"$lives\" ]"

# The plan read back as it is (a .ir model is parsed and verified) passes
# with its reused host bytes; planted: stage 0's first micro-batch-1 offload
# moved onto the bytes of micro-batch 0's offload of that type, which is
# still waiting for its reload then (stage 0 holds 4 micro-batches): the
# verifier rejects the two host buffers sharing bytes while both are live.
"$K" dump $P4 --offload all --after memplan > "$tmp/p4.ir" 2>&1
reused=$(awk '/^stage 0/ {s = 1} /^stage 1/ {s = 0} s && /@host\+[0-9]* = offload/ {match($0, /@host\+[0-9]+/); o[substr($0, RSTART, RLENGTH)]++; n++} END {print n - length(o)}' "$tmp/p4.ir")
"$K" plan "$tmp/p4.ir" > /dev/null 2>&1
say $? "the plan read back verifies, stage 0's host bytes reused by $reused of its offloads"
python3 - "$tmp/p4.ir" "$tmp/planted.ir" <<'EOF2'
import re, sys
lines, st, first, done = open(sys.argv[1]).read().split("\n"), None, {}, False
for i, l in enumerate(lines):
    if l.startswith("stage "): st = l.split()[1]
    m = re.match(r"(%\d+:(\S+)@host\+)(\d+)( = offload .*)", l)
    if st != "0" or not m or done: continue
    if " mb" not in m.group(4): first.setdefault(m.group(2), m.group(3))
    elif " mb1 " in m.group(4) and m.group(2) in first:
        lines[i] = m.group(1) + first[m.group(2)] + m.group(4); done = True
open(sys.argv[2], "w").write("\n".join(lines))
sys.exit(0 if done else 1)
EOF2
out=$("$K" plan "$tmp/planted.ir" 2>&1); rc=$?
check "planted: a micro-batch-1 offload on micro-batch 0's live host bytes is rejected (${out:0:240})" \
    "[ $rc = 1 ] && [[ \"\$out\" == *'of the host space while both are live'* ]]"

# ---- the host capacity (profile field host_memory_bytes) ----
sed 's/^host_memory_bytes .*/host_memory_bytes 400000/' profiles/cpu.profile > "$tmp/smallhost.profile"
out=$("$K" compile $P4 --offload all --device-profile "$tmp/smallhost.profile" -o "$tmp/x" 2>&1); rc=$?
check "kiln compile refuses a host space above host_memory_bytes: one line ($out)" \
    "[ $rc = 1 ] && [ \$(echo \"\$out\" | wc -l) = 1 ] && [[ \"\$out\" == *'host space of pipeline rank 0 needs'*'host_memory_bytes'* ]]"
out=$("$K" plan $P4 --offload all --device-profile "$tmp/smallhost.profile" 2>&1); rc=$?
w=$(grep -c "warning: host space" <<< "$out")
check "kiln plan warns instead, for the ranks above it (ranks 0, 1: $w lines, rc $rc)" "[ $rc = 0 ] && [ $w = 2 ]"
out=$("$K" plan $P4 --offload all --device-profile profiles/cpu.profile 2>&1 | grep -c "warning: host space")
check "no warning within the cpu profile's host memory ($out)" "[ $out = 0 ]"
# auto keeps the host space within the host memory (offload.c host_trim): the
# same small host, no warning, kiln compile takes it, and it still offloads
out=$("$K" plan $P4 --offload auto --device-profile "$tmp/smallhost.profile" 2>&1); rc=$?
w=$(grep -c "warning: host space" <<< "$out"); h=$(sed -n 's/^  rank 0: .*; host \([0-9.]*\) MiB;.*/\1/p' <<< "$out")
"$K" compile $P4 --offload auto --device-profile "$tmp/smallhost.profile" -o "$tmp/x" > /dev/null 2>&1; rc2=$?
check "--offload auto within host_memory_bytes 400000: no warning ($w), compile rc $rc2, rank 0 host ${h:-?} MiB in (0, 0.381]" \
    "[ $rc = 0 ] && [ $w = 0 ] && [ $rc2 = 0 ] && awk -v h='${h:-0}' 'BEGIN {exit !(h > 0 && h <= 400000 / 1048576)}'"
sed 's/^host_memory_bytes .*/host_memory_bytes -1/' profiles/cpu.profile > "$tmp/neghost.profile"
out=$("$K" plan $P4 --offload auto --device-profile "$tmp/neghost.profile" 2>&1); rc=$?
check "a negative host_memory_bytes: one line ($out)" "[ $rc = 1 ] && [ \$(echo \"\$out\" | wc -l) = 1 ] && [[ \"\$out\" == *'neghost.profile:'*'host_memory_bytes'*'negative'* ]]"

# ---- pacing a first stage's warm-up (offload.c stream_pass, pace_dues) ----
# Llama-3 8B layers at 16 layers, pp 8, 16 micro-batches, seq 32768, h200
# (20 GB/s copies): the warm-up's forwards make activations faster than the
# d2h stream drains them; where the pipeline leaves them slack the compute
# waits for the copies, so rank 0's device peak falls (paced 46808 MiB,
# unpaced 55596 MiB when written) and no copy time is exposed.
L16="models/llama.lua --set dim=4096 --set layers=16 --set heads=32 --set kv_heads=8 --set ffn=14336 --set vocab=128256 --set batch=16 --pp 8 --micro-batches 16 --precision bf16 --device-profile h200 --recompute gemm-last --offload auto --set seq=32768"
"$K" plan $L16 > "$tmp/pace" 2>&1
KILN_TEST_OFFLOAD_NO_PACE=1 "$K" plan $L16 > "$tmp/nopace" 2>&1
r0() { sed -n "s/^  rank 0: device peak \([0-9.]*\) MiB with offload.*exposed copy time \([0-9.]*\) ms.*/\\$2/p" "$1"; }
a=$(r0 "$tmp/pace" 1) b=$(r0 "$tmp/nopace" 1) x=$(r0 "$tmp/pace" 2)
check "paced warm-up: rank 0's device peak ${a:-?} MiB < 0.9 x unpaced ${b:-?} MiB, exposed ${x:-?} ms = 0" \
    "awk -v a='${a:-0}' -v b='${b:-0}' -v x='${x:-1}' 'BEGIN {exit !(a > 0 && a < 0.9 * b && x == 0)}'"

# ---- --max-seq ----
MEM=0.004
"$K" plan $GPT4 --pp 4 --micro-batches 8 --offload-min-bytes 1 --max-seq --memory $MEM > "$tmp/ms" 2>&1; rc=$?
say $rc "kiln plan --max-seq --memory $MEM GiB: $(awk '/^  (none|gemm-last)/ {printf "%s %s; ", $1 ($2 == "+" ? " + offload" : ""), ($2 == "+" ? $5 : $2)}' "$tmp/ms")"
seqs=($(awk '/^  none/ {print $2} /^  gemm-last  / {print $2} /^  gemm-last \+/ {print $5}' "$tmp/ms"))
check "none (${seqs[0]:-?}) <= gemm-last (${seqs[1]:-?}) <= gemm-last + offload auto (${seqs[2]:-?})" \
    "[ ${#seqs[@]} = 3 ] && [ ${seqs[0]} -le ${seqs[1]} ] && [ ${seqs[1]} -le ${seqs[2]} ]"
ex=$(sed -n 's/^  gemm-last + .* \([0-9.]*\)% of step (worst rank \([0-9]*\): \([0-9.]*\)%).*/\1 \2 \3/p' "$tmp/ms")
check "the offload row's exposed copy time: the binding rank's share, the worst rank and its share ($ex), worst >= binding" \
    "[ -n \"$ex\" ] && awk -v a=\"${ex%% *}\" -v b=\"${ex##* }\" 'BEGIN {exit !(b >= a)}'"
limit=$(awk -v g=$MEM 'BEGIN{printf "%d", g * 1073741824}')
maxtotal() { "$K" plan $GPT4 --pp 4 --micro-batches 8 --offload-min-bytes 1 "$@" 2>/dev/null | awk '/^  total/ {if ($(NF-1) > m) m = $(NF-1)} END {print m + 0}'; }
pols=("--recompute none" "--recompute gemm-last" "--recompute gemm-last --offload auto")
for k in 0 1 2; do
    s=${seqs[$k]:-0}
    at=$(maxtotal ${pols[$k]} --set seq=$s) above=$(maxtotal ${pols[$k]} --set seq=$((s + 128)))
    check "${pols[$k]}: kiln plan at seq $s: $at bytes <= $limit, at $((s + 128)): $above > $limit" \
        "[ $s -gt 0 ] && [ $at -le $limit ] && [ $above -gt $limit ]"
done
out=$("$K" plan $GPT4 --max-seq 2>&1); rc=$?
check "--max-seq without --memory: one line ($out)" "[ $rc = 1 ] && [ \$(echo \"\$out\" | wc -l) = 1 ] && [[ \"\$out\" == *'--memory GiB'* ]]"
out=$("$K" plan $GPT4 --max-seq --memory 0 2>&1); rc=$?
check "--memory 0: one line ($out)" "[ $rc = 1 ] && [ \$(echo \"\$out\" | wc -l) = 1 ] && [[ \"\$out\" == *'--memory: expected'* ]]"
echo "1..$n"
