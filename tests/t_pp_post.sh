#!/usr/bin/env bash
# Pipeline receives posted early: in every rank's scheduled program each
# receive over pp is a recv_start ... recv_done pair (docs/ir.md), and the
# receive a rank's action k+1 needs is posted before the first compute node
# of action k, so its bytes can land while action k computes (the CPU
# runtime's MPI_Irecv).  Read off `kiln dump --after schedule`: the actions
# are the runs of compute-stream nodes of one (virtual stage, micro-batch,
# F|B|W); for each recv_done that is not in the rank's first action, the
# action before the one it feeds starts at the first node of the run that
# ends right before it, and its recv_start must come earlier.  A receive
# with no action after it (the tied embedding's summed gradient, read by the
# optimizer) is not counted.  The planted --test-pp-bug late-post (each
# receive posted where it waits, as before) must fail the check; then the
# verifier on hand-edited dumps: a post moved to the top of its program is
# still deadlock-free (posting does not block), its done moved above the
# send it waits for is a deadlock, and a node reading a posted buffer
# before its done is refused.
. "$(dirname "$0")/lib.sh"
GPT4="models/tiny.lua --set layers=4"
LLAMA4="models/llama.lua --set vocab=128 --set dim=64 --set layers=4 --set heads=4 --set kv_heads=2 --set ffn=128 --set seq=32 --set batch=8"

cat > "$tmp/early.py" <<'PY'
import re, sys
def parse(path):
    stages, cur = [], None
    for line in open(path):
        if line.startswith("stage "):
            cur = []; stages.append(cur); continue
        if cur is None or not line.strip() or line.startswith(("#", "module")): continue
        body, _, meta = line.partition("   # ")
        m = re.match(r"(?:(%\S+(?:, %\S+)*) = )?(\w+)", body)
        outs = re.findall(r"%(\d+)", m.group(1) or "")
        op = m.group(2)
        ins = re.findall(r"%(\d+)", body[m.end():].split("{")[0])
        tag = re.search(r"tag=(\d+)", body)
        grp = re.search(r'group="(\w+)"', body)
        f = meta.split()
        phase = f[2] if len(f) > 2 else "?"
        kv = {k: int(v) for k, v in re.findall(r"\b(v|mb|stream)(\d+)", " ".join(f[3:]))}
        cur.append(dict(op=op, outs=outs, ins=ins, tag=tag and int(tag.group(1)), pp=bool(grp and grp.group(1) == "pp"),
                        phase=phase, v=kv.get("v", 0), mb=kv.get("mb", 0), stream=kv.get("stream", -1)))
    return stages
SOURCES = {"param", "input", "state", "const", "iota", "output", "assign"}  # and the sinks: no compute
KIND = {"fwd": "F", "bwd": "B", "recompute": "B", "wgrad": "W"}
def key(n):
    if n["stream"] != 0 or n["op"] in SOURCES or n["op"] in ("record", "wait") or n["phase"] not in KIND: return None
    return (n["v"], n["mb"], KIND[n["phase"]])
stages = parse(sys.argv[1])
checked = late = pairs = 0
for s, nodes in enumerate(stages):
    start = {}
    for i, n in enumerate(nodes):
        if n["op"] == "recv" and n["pp"]: print(f"stage {s}: a blocking recv over pp (tag {n['tag']}) at {i}"); late += 1
        if n["op"] == "recv_start" and n["pp"]: start[n["outs"][0]] = i
    for d, n in enumerate(nodes):
        if n["op"] != "recv_done" or not n["pp"]: continue
        pairs += 1
        st = start[n["ins"][0]]
        if not any(key(x) for x in nodes[d + 1:]): continue        # nothing after it to overlap with
        prev = [j for j in range(d) if key(nodes[j])]
        if not prev: continue                                      # the rank's first action
        k = key(nodes[prev[-1]]); first = prev[-1]
        for j in reversed(prev):                                   # back to the first node of that action
            if key(nodes[j]) != k: break
            first = j
        checked += 1
        if st > first:
            late += 1
            print(f"stage {s}: recv tag {n['tag']} (done at {d}) posted at {st}, after action {k}'s first compute node at {first}")
print(f"{pairs} pp receives, {checked} after another action, {late} posted late")
sys.exit(1 if late or not checked else 0)
PY
early() { # what args...
    local what=$1; shift
    "$K" dump "$@" --after schedule -o "$tmp/s.ir" 2>"$tmp/err" || { notok "$what: dump failed: $(cat "$tmp/err")"; return; }
    out=$(python3 "$tmp/early.py" "$tmp/s.ir" 2>&1); say $? "$what: every receive posted before the previous action computes: ${out##*$'\n'}"
}
early "1f1b p2 m4 GPT (tied wte)" models/tiny.lua --pp 2 --micro-batches 4
early "1f1b p4 m8" $GPT4 --pp 4 --micro-batches 8
early "zb-h1 p2 m4" $GPT4 --pp 2 --micro-batches 4 --pp-schedule zb-h1
early "zb-v p2 m4" $GPT4 --pp 2 --micro-batches 4 --pp-schedule zb-v
early "interleaved p2 v2 m4" $GPT4 --pp 2 --vpp 2 --micro-batches 4 --pp-schedule interleaved
early "Llama zb-h1 p2 m4, dp 2, cp 2 ring" $LLAMA4 --pp 2 --dp 2 --cp 2 --cp-comm p2p --micro-batches 4 --pp-schedule zb-h1
early "bf16 1f1b p2 m4" models/tiny.lua --pp 2 --micro-batches 4 --precision bf16

# the planted late post must fail the same check
"$K" dump models/tiny.lua --pp 2 --micro-batches 4 --test-pp-bug late-post --after schedule -o "$tmp/late.ir"
out=$(python3 "$tmp/early.py" "$tmp/late.ir" 2>&1); rc=$?
[ $rc = 1 ] && [[ "$out" == *"posted late"* ]] && [[ "$out" != *" 0 posted late"* ]]
say $? "planted: --test-pp-bug late-post is caught (${out##*$'\n'})"

# the verifier: posting does not block, waiting does; only the done reads a posted buffer
"$K" dump models/tiny.lua --pp 2 --micro-batches 2 --after pipeline -o "$tmp/pp.ir"
python3 - "$tmp" <<'PY'
import re, sys
d = sys.argv[1]
L = open(d + "/pp.ir").read().split("\n")
s1 = L.index("stage 1")
# stage 1's recv_start of tag 1 (micro-batch 1's activation) moved to the top of stage 1: still fine
i = [k for k, l in enumerate(L) if k > s1 and " = recv_start " in l and "tag=1}" in l][0]
A = L[:]; A.insert(s1 + 1, A.pop(i))
open(d + "/hoisted.ir", "w").write("\n".join(A))
# stage 0's first send moved after the recv_done it waits for: deadlock
i = [k for k, l in enumerate(L) if l.startswith("send ")][0]
j = [k for k, l in enumerate(L) if " = recv_done " in l and k > i][0]
B = L[:]; B.insert(j, B.pop(i))
open(d + "/dead.ir", "w").write("\n".join(B))
# a node reading the posted buffer itself instead of the done's value
j = [k for k, l in enumerate(L) if " = recv_done " in l][0]
start, done = re.match(r"(\d+)", L[j].split(" = recv_done %")[1]).group(1), re.match(r"%(\d+)", L[j]).group(1)
k = [k for k, l in enumerate(L) if k > j and re.search(r"[ ,]%" + done + r"\b", l.split("{")[0].split("#")[0].split(" = ", 1)[-1])][0]
C = L[:]; C[k] = C[k].split(" = ", 1)[0] + " = " + re.sub(r"%" + done + r"\b", "%" + start, C[k].split(" = ", 1)[1], count=1)
open(d + "/early_read.ir", "w").write("\n".join(C))
PY
out=$("$K" dump "$tmp/pp.ir" 2>&1 > /dev/null); say $? "the unedited dump verifies $out"
"$K" dump models/tiny.lua --pp 2 --micro-batches 4 --pp-schedule zb-h1 --after memplan -o "$tmp/m.ir"
"$K" dump "$tmp/m.ir" -o "$tmp/m2.ir" && cmp -s "$tmp/m.ir" "$tmp/m2.ir"
say $? "recv_start / recv_done round-trip: dump(parse(dump)) is the same text (zb-h1 after memplan)"
python3 - "$tmp" <<'PY'
import re, sys
d = sys.argv[1]
L = open(d + "/m.ir").read().split("\n")
s1 = L.index("stage 1")
# stage 1's first posted receive that has compute between its start and its done
for i, l in enumerate(L):
    m = re.match(r"%(\d+):\S+@act\+(\d+) = recv_start ", l)
    if i < s1 or not m: continue
    done = [k for k in range(i, len(L)) if re.search(r"= recv_done %" + m.group(1) + r"\b", L[k])][0]
    viewed = set(re.findall(r"= (?:reshape|loss|recv_done) %(\d+)", "\n".join(L)))  # a view shares its input's place
    mids = [k for k in range(i + 1, done) if re.match(r"%(\d+):\S+@act\+\d+ = (?!recv_|reshape |loss )", L[k])
            and re.match(r"%(\d+)", L[k]).group(1) not in viewed]
    if mids: break
k = mids[0]
L[k] = re.sub(r"@act\+\d+", "@act+" + m.group(2), L[k], count=1)
open(d + "/clobber.ir", "w").write("\n".join(L))
PY
out=$("$K" dump "$tmp/clobber.ir" 2>&1); rc=$?
[ $rc = 1 ] && [ "$(wc -l <<< "$out")" = 1 ] && [[ "$out" == *overlap* || "$out" == *share* ]]
say $? "memplan's promise: a value placed on a posted receive's bytes between its start and done is refused ($out)"
out=$("$K" dump tests/fuzz-seeds/pipe_post.ir 2>&1 | cmp - tests/fuzz-seeds/pipe_post.ir 2>&1); say $? "the fuzz seed pipe_post.ir reads back as written $out"
out=$("$K" dump "$tmp/hoisted.ir" 2>&1 > /dev/null); say $? "a receive posted at the top of its program: no deadlock (posting does not block) $out"
out=$("$K" dump "$tmp/dead.ir" 2>&1); rc=$?
[ $rc = 1 ] && [[ "$out" == *'pipeline deadlock: stage 0 waits at recv_done tag'*'stage 1 waits at recv_done tag 0 mb 0'* ]]
say $? "a send moved after the recv_done it waits for: deadlock named ($out)"
out=$("$K" dump "$tmp/early_read.ir" 2>&1); rc=$?
[ $rc = 1 ] && [ "$(wc -l <<< "$out")" = 1 ] && [[ "$out" == *'the buffer of a posted receive'*'only its recv_done may'* ]]
say $? "a read of a posted buffer before its recv_done: one line ($out)"
echo "1..$n"
