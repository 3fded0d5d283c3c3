#!/usr/bin/env python3
"""bench/cost_kernels.py — the cost model's kernel times beside a trainer's
trace, by kind (issue 21): where a step prediction's error comes from.

  KILN_COST_NODES=nodes.tsv kiln plan MODEL ... --device-profile P
  TRAINER --steps 4 --trace t.json
  python3 bench/cost_kernels.py nodes.tsv t.json STEPS [STAGE]

nodes.tsv is cost.c's per-node dump (stage, node, op, stream, fused group,
start, end); the trace is the runtime's Chrome JSON (rank 0's file: pass
t.json.rank<r> for another).  Compute-stream kernels are compared by kind:
GEMM (matmul), attention (fwd+bwd), the optimizer (adamw, sumsq) and the
rest (elementwise, layernorm, fused groups, ...), as summed seconds in the
last step (the trace's last 1/STEPS of compute-stream events, by count)
and as kernel counts.
"""
import json
import sys


def kind(name):
    if name.startswith("matmul"):
        return "gemm"
    if name.startswith("attention"):
        return "attention"
    if name in ("adamw", "sumsq"):
        return "optimizer"
    return "other"


def main():
    nodes, trace = sys.argv[1], sys.argv[2]
    steps = int(sys.argv[3])
    stage = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    pred, npred, seen = {}, {}, set()
    for line in open(nodes):
        st, i, op, stream, grp, b, e = line.rstrip("\n").split("\t")
        if int(st) != stage or int(stream) != 0 or op in ("wait", "record"):
            continue
        d = float(e) - float(b)
        if d <= 0:
            continue
        k = kind(op) if int(grp) < 0 else "other"
        pred[k] = pred.get(k, 0) + d
        key = ("g", grp) if int(grp) >= 0 else ("n", i)
        if key not in seen:
            seen.add(key)
            npred[k] = npred.get(k, 0) + 1
    d = json.load(open(trace))
    ev = d["traceEvents"] if isinstance(d, dict) else d
    ev = [x for x in ev if x.get("ph") == "X" and x.get("tid") == 0]
    ev.sort(key=lambda x: x["ts"])
    per_step = len(ev) // steps
    last = ev[-per_step:] if per_step and len(ev) >= per_step else ev
    meas, nmeas = {}, {}
    for x in last:
        k = kind(x["name"])
        meas[k] = meas.get(k, 0) + x["dur"] * 1e-6
        nmeas[k] = nmeas.get(k, 0) + 1
    print(f"{'kind':10} {'pred ms':>9} {'meas ms':>9} {'ratio':>6} {'n pred':>7} {'n meas':>7}")
    for k in ("gemm", "attention", "optimizer", "other"):
        p, m = pred.get(k, 0), meas.get(k, 0)
        r = p / m if m > 0 else float("nan")
        print(f"{k:10} {1e3 * p:9.3f} {1e3 * m:9.3f} {r:6.2f} {npred.get(k, 0):7d} {nmeas.get(k, 0):7d}")
    span = (last[-1]["ts"] + last[-1]["dur"] - last[0]["ts"]) * 1e-3 if last else 0
    print(f"compute stream: predicted busy {1e3 * sum(pred.values()):.3f} ms, traced kernels {1e3 * sum(meas.values()):.3f} ms over a span of {span:.3f} ms")


main()
