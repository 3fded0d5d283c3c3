#!/usr/bin/env bash
# Context parallel in the interpreter: `kiln check --cp N` runs every rank of
# the sequence-sharded step (dual-chunk layout; all-gather attention or ring
# attention with log-sum-exp merges, causal masking by global position) for
# two steps and compares loss, grad-norm, lr, gradients
# (zero 0) and updated parameters with the single-device program (f64,
# relative 1e-9); `kiln plan` shows equal causal attention work per rank for
# the dual-chunk layout, the imbalance of the contiguous one, and K,V bytes
# per layer equal to 2 b s kv_heads head_dim (cp-1)/cp — heads/kv_heads times
# fewer with GQA.  Then the bad inputs.
. "$(dirname "$0")/lib.sh"
# a learning rate that moves the params (llama.lua's warm-up is 2000 steps)
LR="--warmup 1 --lr 0.01"
LLAMA="models/llama.lua --set vocab=128 --set dim=64 --set layers=2 --set heads=4 --set kv_heads=2 --set ffn=128 --set seq=32 --set batch=4 $LR"
# odd shapes (vocab 255, dim 63 or 66, 3 heads, ffn 97, seq 24 = 2 x cp x 3 at cp 4):
# flats whose length is not a multiple of dp x cp, chunks not a power of two
TODD="models/tiny.lua --set vocab=255 --set dim=63 --set heads=3 --set seq=24"
LODD="models/llama.lua --set vocab=255 --set dim=66 --set layers=2 --set heads=3 --set kv_heads=1 --set ffn=97 --set seq=24 --set batch=4 $LR"
check() { # args...
    out=$(timeout 300 "$K" check "$@" 2>&1); rc=$?
    if [ $rc = 0 ] && [[ "$out" == *", 0 mismatched"* ]]; then ok "check $*: ${out##*: }"
    else notok "check $*: rc=$rc $out"; fi
}
for comm in allgather p2p; do
    for cp in 2 4 8; do
        check models/tiny.lua --cp $cp --cp-comm $comm --zero 0
        check $LLAMA --cp $cp --cp-comm $comm
    done
    check models/tiny.lua --cp 4 --cp-comm $comm --cp-layout contiguous
    check models/tiny.lua --dp 2 --cp 2 --cp-comm $comm --micro-batches 2
    check $LLAMA --dp 2 --cp 2 --cp-comm $comm --zero 0
    check $TODD --cp 2 --cp-comm $comm
    check $TODD --cp 4 --cp-comm $comm --zero 0
    check $TODD --dp 2 --cp 2 --cp-comm $comm --zero 1 --bucket-mb 0.01
    check $LODD --cp 2 --cp-comm $comm
    check $LODD --dp 2 --cp 2 --cp-comm $comm --zero 1 --weight-decay 0.1
done
check $TODD --cp 2 --cp-comm p2p --no-overlap
check $TODD --dp 2 --cp 2 --cp-comm p2p --no-overlap --micro-batches 2

plan() { "$K" plan "$@" 2>&1; }
p=$(plan models/tiny.lua --cp 4)
if printf '%s\n' "$p" | grep -q 'balance max/min 1.000'; then ok "dual chunk: equal causal work on every cp rank"
else notok "dual chunk balance: $p"; fi
p=$(plan models/tiny.lua --cp 4 --cp-layout contiguous)
b=$(printf '%s\n' "$p" | sed -n 's/.*balance max\/min \([0-9.]*\).*/\1/p')
if awk -v b="${b:-0}" 'BEGIN{exit !(b > 2)}'; then ok "contiguous layout shows the imbalance (max/min $b)"; else notok "contiguous balance $b"; fi
sent() { printf '%s\n' "$1" | sed -n 's/.*forward: \([0-9]*\) elements (formula .* = \([0-9]*\)).*/\1 \2/p'; }
for comm in allgather p2p; do
    read -r s f < <(sent "$(plan models/tiny.lua --cp 4 --cp-comm $comm)")
    if [ -n "$s" ] && [ "$s" = "$f" ]; then ok "$comm: K,V elements sent per layer = formula ($s)"; else notok "$comm: K,V sent '$s' vs formula '$f'"; fi
done
# the ring: cp-1 hops of K and V per attention, send/recv on the comm stream; the
# positions of the block held at each step are computed (iota {from=step}), never sent
ir=$("$K" dump models/tiny.lua --set layers=1 --cp 4 --cp-comm p2p 2>&1)
sends=$(printf '%s\n' "$ir" | grep -c '^send .* L0 fwd')
froms=$(printf '%s\n' "$ir" | grep -c 'iota {.*from=[123].* L0 fwd')
if [ "$sends" = 6 ] && [ "$froms" = 3 ] && ! printf '%s\n' "$ir" | grep -q 'allgather %.*group="cp", dim=2'; then ok "ring forward: 6 sends (3 hops x K, V), 3 computed key positions, no K,V all-gather"
else notok "ring forward sends: $sends, key position iotas: $froms"; fi
# A send's bytes are read when its recv is issued (NCCL pairs the two in one
# group), so the memory plan keeps the sent buffer until its recv
# (compiler/live.c read_end).  The CPU's sends copy at once, so no run shows
# a breach; read it off the plan: under --no-overlap (one stream) nothing
# written after a send and up to its recv may share the sent value's bytes.
# Without the rule the ring's recv lands in the buffer it sends from.
sendbuf() { # model flags... -> "sends breaches first-breach"
    "$K" dump "$@" --cp-comm p2p --no-overlap --after memplan -o "$tmp/sb.ir" > /dev/null 2>&1 || { echo "0 0 (kiln dump failed)"; return; }
    python3 - "$tmp/sb.ir" <<'PY2'
import re, sys
size = {"f32": 4, "i32": 4, "bf16": 2, "f16": 2, "f64": 8, "i64": 8}
outs = re.compile(r'%(\d+):(\w+)\[([\d,]*)\][^@ ]*@(\w+)\+(\d+)')
buf, writes, sends, recvs = {}, [], [], {}
for l in open(sys.argv[1]):
    pos = re.search(r' pos(\d+)$', l.rstrip())
    if not pos or not (l.startswith('%') or l.startswith('send')): continue
    pos = int(pos.group(1))
    lhs, _, rhs = l.partition(' = ')
    for v, dt, dims, sp, off in outs.findall(lhs if rhs else ''):
        n = 1
        for d in filter(None, dims.split(',')): n *= int(d)
        buf[v] = (sp, int(off), int(off) + n * size[dt])
        writes.append((pos, v))
    tag = re.search(r'\{group="(\w+)".*tag=(\d+)\}', l)
    if l.startswith('send'): sends.append((pos, re.match(r'send %(\d+)', l).group(1), tag.groups()))
    elif rhs.startswith('recv'): recvs[tag.groups()] = pos
bad = []
for pos, v, key in sends:
    sp, a, b = buf[v]
    bad += ['%%%s sent at pos%d, %%%s written on its bytes at pos%d, recv at pos%d' % (v, pos, w, wp, recvs[key])
            for wp, w in writes if pos < wp <= recvs[key] and buf[w][0] == sp and buf[w][1] < b and a < buf[w][2]]
print(len(sends), len(bad), bad[0] if bad else '')
PY2
}
for f in "models/tiny.lua --set layers=1 --cp 2" "$TODD --cp 4" "$LODD --dp 2 --cp 2"; do
    read -r ns nb first <<< "$(sendbuf $f)"
    d="--no-overlap ring, $f: no buffer written between a send and its recv shares the sent bytes ($ns sends, $nb breaches${first:+: $first})"
    if [ "${ns:-0}" -gt 0 ] 2>/dev/null && [ "$nb" = 0 ]; then ok "$d"; else notok "$d"; fi
done
read -r gqa _ < <(sent "$(plan $LLAMA --cp 4)")
read -r mha _ < <(sent "$(plan ${LLAMA/kv_heads=2/kv_heads=4} --cp 4)")
if [ -n "$gqa" ] && [ $((gqa * 2)) = "$mha" ]; then ok "GQA (4 heads, 2 kv heads) sends half of MHA's K,V ($gqa vs $mha)"
else notok "GQA $gqa vs MHA $mha"; fi

bad() { # description, expected substring, args...
    local desc=$1 sub=$2; shift 2
    err=$(timeout 60 "$K" "$@" 2>&1 >/dev/null); rc=$?
    nl=$(printf '%s\n' "$err" | wc -l)
    if [ "$rc" = 1 ] && [ "$nl" = 1 ] && [[ "$err" == *"$sub"* ]]; then ok "$desc: $err"; else notok "$desc: rc=$rc got '$err'"; fi
}
bad "sequence not divisible by 2 cp" "models/tiny.lua:10: input tokens: the sequence 64 is not divisible by 2 x cp = 6" check models/tiny.lua --cp 3
bad "more cp ranks than sequence chunks" "not divisible by 2 x cp = 128" check models/tiny.lua --cp 64
bad "contiguous layout needs cp to divide the sequence" "not divisible by cp = 3" check models/tiny.lua --cp 3 --cp-layout contiguous
bad "--cp-layout bad" "--cp-layout" check models/tiny.lua --cp 2 --cp-layout diagonal
bad "--cp-comm bad" "--cp-comm" check models/tiny.lua --cp 2 --cp-comm ring
bad "--cp 0" "--cp" check models/tiny.lua --cp 0
tmpo=$tmp/o
if out=$(timeout 120 "$K" compile models/tiny.lua --cp 2 -o "$tmpo" 2>&1) && [ -s "$tmpo" ]; then ok "kiln compile models/tiny.lua --cp 2"
else notok "kiln compile models/tiny.lua --cp 2: $out"; fi
: > "$tmpo"
if out=$(timeout 120 "$K" compile models/tiny.lua --cp 2 --cp-comm p2p -o "$tmpo" 2>&1) && [ -s "$tmpo" ]; then ok "kiln compile models/tiny.lua --cp 2 --cp-comm p2p"
else notok "kiln compile models/tiny.lua --cp 2 --cp-comm p2p: $out"; fi
