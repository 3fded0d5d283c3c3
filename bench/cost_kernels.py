#!/usr/bin/env python3
"""bench/cost_kernels.py — the cost model's kernel times beside a trainer's
trace, by kind (issue 21): where a step prediction's error comes from.

  KILN_COST_NODES=nodes.tsv kiln plan MODEL ... --device-profile P
  TRAINER --steps 4 --trace t.json
  python3 bench/cost_kernels.py nodes.tsv t.json STEPS [STAGE]

nodes.tsv is cost.c's per-node dump (stage, node, op, stream, fused group,
start, end); the trace is the runtime's Chrome JSON (rank 0's file: pass
t.json.rank<r> for another).  Compute-stream kernels are compared by the
kinds a calibrated profile rates apart (docs/profiles.md): GEMM, attention
and its backward, norm (layernorm, rmsnorm, softmax) and its backward,
cross-entropy and its backward, the strided copies (transpose, slice,
concat, broadcast), sumto, adamw, sumsq, the fused elementwise groups and
the rest — as seconds in a step (the median over the steps after the
first, the trace cut into STEPS equal runs of compute-stream events) and
as kernel counts.  "vs gemm" is the ratio over the GEMMs' ratio: it
removes a load common to the profile and the trace (calibrate just before
the trace), not a difference between them — a load slows kinds unequally
(a profile calibrated at load 8 against a quiet trace: the 2-thread GEMMs
3.7x slower, the memory-bound kinds 1-2.5x).  The last line: the
compute stream's predicted busy time, the traced kernels' sum and their
span in the last step (span − sum: time between kernels, the runtime's
dispatch and waits).  Then the fastest step (of the runs after the first:
the machine's slow phases only ever add, bench/cost_model.sh) split into
its compute-stream kernels and idle time, and the comm stream's ops per
step: calls, the median call and the median of their sum in a step (a
blocking receive's sum is its waits for the peer; session 11 read cp
p2p's 6.25 ms a step there).
"""
import json
import sys

KINDS = {
    "attention": "attention", "attention_bwd": "attention_bwd",
    "layernorm": "norm", "rmsnorm": "norm", "softmax": "norm",
    "layernorm_bwd": "norm_bwd", "rmsnorm_bwd": "norm_bwd", "softmax_bwd": "norm_bwd",
    "cross_entropy": "xent", "cross_entropy_bwd": "xent_bwd",
    "transpose": "copy", "slice": "copy", "concat": "copy", "broadcast": "copy",
    "sumto": "sumto", "adamw": "adamw", "sumsq": "sumsq",
}
ORDER = ["gemm", "attention", "attention_bwd", "norm", "norm_bwd", "xent", "xent_bwd", "copy", "sumto", "adamw", "sumsq", "fused", "other"]


def kind(name, fused=False):
    if fused or name.startswith("fused_"):
        return "fused"
    if name.startswith("matmul"):
        return "gemm"
    return KINDS.get(name, "other")


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
        k = kind(op, int(grp) >= 0)
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
    runs = [ev[s * per_step:(s + 1) * per_step] for s in range(1 if steps > 1 else 0, steps)] if per_step else [ev]
    per = {}
    for run in runs:
        acc = {}
        for x in run:
            k = kind(x["name"])
            acc[k] = acc.get(k, 0) + x["dur"] * 1e-6
        for k in ORDER:
            per.setdefault(k, []).append(acc.get(k, 0))
    meas = {k: sorted(v)[len(v) // 2] for k, v in per.items()}
    nmeas = {}
    for x in runs[-1]:
        k = kind(x["name"])
        nmeas[k] = nmeas.get(k, 0) + 1
    g = pred.get("gemm", 0) / meas["gemm"] if meas.get("gemm", 0) > 0 else float("nan")
    print(f"{'kind':14} {'pred ms':>9} {'meas ms':>9} {'ratio':>6} {'vs gemm':>7} {'n pred':>7} {'n meas':>7}")
    for k in ORDER:
        p, m = pred.get(k, 0), meas.get(k, 0)
        if p == 0 and m == 0:
            continue
        r = p / m if m > 0 else float("nan")
        print(f"{k:14} {1e3 * p:9.3f} {1e3 * m:9.3f} {r:6.2f} {r / g:7.2f} {npred.get(k, 0):7d} {nmeas.get(k, 0):7d}")
    last = runs[-1]
    span = (last[-1]["ts"] + last[-1]["dur"] - last[0]["ts"]) * 1e-3 if last else 0
    busy = sum(x["dur"] for x in last) * 1e-3
    print(f"compute stream: predicted busy {1e3 * sum(pred.values()):.3f} ms, traced kernels {busy:.3f} ms (last step) over a span of {span:.3f} ms")
    fastest(ev, runs, d, pred)


def fastest(ev, runs, d, pred):
    """The fastest step's split, and the comm stream's ops per step."""
    if len(runs) < 2:
        return
    bounds = [(r[0]["ts"], runs[i + 1][0]["ts"]) for i, r in enumerate(runs[:-1])]
    i = min(range(len(bounds)), key=lambda k: bounds[k][1] - bounds[k][0])
    t0, t1 = bounds[i]
    busy = sum(x["dur"] for x in runs[i]) * 1e-3
    print(f"fastest step: {(t1 - t0) * 1e-3:.3f} ms, compute kernels {busy:.3f} ms (predicted {1e3 * sum(pred.values()):.3f}), "
          f"compute idle {(t1 - t0) * 1e-3 - busy:.3f} ms")
    allev = d["traceEvents"] if isinstance(d, dict) else d
    comm = [x for x in allev if x.get("ph") == "X" and x.get("tid") == 1]
    if not comm:
        return
    per = {}
    for a, b in bounds:
        acc = {}
        for x in comm:
            if a <= x["ts"] < b:
                n, s = acc.get(x["name"], (0, 0.0))
                acc[x["name"]] = (n + 1, s + x["dur"])
        for k, v in acc.items():
            per.setdefault(k, []).append(v)
    print(f"{'comm op':14} {'calls':>6} {'median us':>10} {'sum ms/step':>12}")
    for k, v in sorted(per.items()):
        durs = sorted(x["dur"] for x in comm if x["name"] == k)
        sums = sorted(s for _, s in v)
        print(f"{k:14} {v[len(v) // 2][0]:6d} {durs[len(durs) // 2]:10.1f} {sums[len(sums) // 2] * 1e-3:12.3f}")


main()
