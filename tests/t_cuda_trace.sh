#!/usr/bin/env bash
# `--trace` on the CUDA device (issue 23, runtime/cuda/trace_cuda.c): a
# traced run is eager (no CUDA graph), each launch between two timing
# events on its stream, written as the CPU trainer's Chrome trace.  On the
# fake CUDA stack (tests/cuda_fake), whose event times are virtual
# (fake_cuda.c op_cost_ms: a cost per op on a per-stream clock):
#  1. tiny.lua (batch 2, seq 32) for cuda:sm_90, 2 steps with --trace
#     (strict mode): exit 0, and the run instantiated no graph;
#  2. the file parses as JSON, names stream 0 "0 compute", and has one
#     complete event per launch, the same number in both steps, naming the
#     library kernels (cross_entropy_fused, matmul, attention,
#     attention_bwd, layernorm, adamw) and generated ones (fused_N), each
#     with its "at" (phase, layer, model line);
#  3. on each stream the events are in order and do not overlap (a stream
#     runs its work in order), every duration positive;
#  4. a second run writes the same bytes (deterministic timestamps);
#  5. `kiln plot --trace` draws it.
# The fakes and kernel registries are shared with t_cuda_xent.sh (cached
# by hash in $B/cuda_fake; the helpers are cuda_lib.sh's).  ~10 s warm.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/cuda_lib.sh"
T=$tmp/tiny_cuda
start=$SECONDS
cuda_fakes && cuda_trainer tiny_cuda libtiny_xent models/tiny.lua "${SHAPE[@]}" ||
    build_failed "build the fakes, the kernel libraries and the trainer"
say 0 "fakes, kernel libraries and tiny.lua for cuda:sm_90 built ($((SECONDS - start)) s)"
# run NAME: 2 traced steps on the fakes (strict) into $tmp/NAME.json
run() {
    timeout 300 env LD_BIND_NOW=1 LD_LIBRARY_PATH="$F" KILN_FAKE_CUDA_KERNELS="$F/libkernels.so:$F/libtiny_xent.so" KILN_FAKE_CUDA_STRICT=1 \
        KILN_FAKE_CUDA_PROFILE=1 "$T" --data "$DATA" --steps 2 --trace "$tmp/$1.json" > "$tmp/$1.out" 2>&1
}
start=$SECONDS
run a; rc=$?
check "2 traced steps on the fakes (strict): exit $rc, $((SECONDS - start)) s, eager (no graph instantiated)" \
    "[ $rc -eq 0 ] && [ -s '$tmp/a.json' ] && ! grep -q 'fake cuda: graph:' '$tmp/a.out'"
cat > "$tmp/check.py" <<'EOF'
import json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
meta = {e["tid"]: e["args"]["name"] for e in ev if e.get("ph") == "M"}
xs = [e for e in ev if e.get("ph") == "X"]
names = {e["name"] for e in xs}
want = {"cross_entropy_fused", "matmul", "attention", "attention_bwd", "layernorm", "adamw"}
bad = []
if meta.get(0) != "0 compute": bad.append("stream 0 is named %r" % meta.get(0))
if not want <= names: bad.append("missing %s" % sorted(want - names))
if not any(n.startswith("fused_") for n in names): bad.append("no generated kernel")
if any("at" not in e.get("args", {}) for e in xs): bad.append("an event without its 'at'")
if len(xs) % 2 or sum(e["name"] == "adamw" for e in xs) % 2: bad.append("%d events: not two equal steps" % len(xs))
for tid in {e["tid"] for e in xs}:
    s = [e for e in xs if e["tid"] == tid]
    for a, b in zip(s, s[1:]):
        if b["ts"] < a["ts"] + a["dur"] - 1e-3: bad.append("stream %d: %s at %.3f overlaps %s ending %.3f" % (tid, b["name"], b["ts"], a["name"], a["ts"] + a["dur"])); break
    if any(e["dur"] <= 0 for e in s): bad.append("stream %d: a duration <= 0" % tid)
print("%d launches, %d kernels named, %d streams, last ends at %.1f us%s" % (len(xs), len(names), len(meta),
      max(e["ts"] + e["dur"] for e in xs) if xs else 0, ("; " + "; ".join(bad)) if bad else ""))
sys.exit(1 if bad else 0)
EOF
out=$(python3 "$tmp/check.py" "$tmp/a.json" 2>&1); rc=$?
check "the trace parses and names the kernels, in order per stream: $out" "[ $rc -eq 0 ]"
run b
check "a second run writes the same trace, byte for byte (the fake's virtual event clock)" "cmp -s '$tmp/a.json' '$tmp/b.json'"
"$K" plot --trace "$tmp/a.json" -o "$tmp/a.svg" > "$tmp/plot.out" 2>&1; rc=$?
check "kiln plot --trace draws it: exit $rc" "[ $rc -eq 0 ] && grep -q '<svg' '$tmp/a.svg'"
echo "1..$n"
