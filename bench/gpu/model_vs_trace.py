#!/usr/bin/env python3
"""model_vs_trace.py NODES.tsv TRACE.json[.gz] STEPS — the cost model's
predicted time per kernel kind against a GPU trace of the same program.

NODES.tsv is `KILN_COST_NODES=FILE kiln plan ...` (every node's simulated
start and end; stage 0 is read), TRACE is the trainer's `--trace` of STEPS
eager steps (the first dropped, as bench/gpu/trace_top.py does).  Both are
grouped by kind: the IR op for a library launch (a concat's parts are one
kind), "fused" for the compiler's generated elementwise kernels.  Prints
per step: predicted ms, measured ms, measured / predicted, and the totals.
Issue 21's error on a GPU, kernel by kernel."""
import sys
from collections import defaultdict

from trace_top import steady_events


def predicted(path):
    by, n = defaultdict(float), defaultdict(int)
    groups = set()
    for line in open(path):
        st, _i, op, _stream, group, start, end = line.rstrip("\n").split("\t")
        if st != "0":
            continue
        dt = float(end) - float(start)
        if dt <= 0:
            continue
        if int(group) >= 0:
            by["fused"] += dt
            if group not in groups:
                groups.add(group)
                n["fused"] += 1
        else:
            by[op] += dt
            n[op] += 1
    return by, n


def measured(path, steps):
    ev, steps = steady_events(path, steps)
    by, n = defaultdict(float), defaultdict(int)
    for e in ev:
        k = "fused" if e["name"].startswith("fused_") else e["name"]
        by[k] += e["dur"] * 1e-6 / steps
        n[k] += 1 / steps
    return by, n


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__.split("\n")[0])
    pb, pn = predicted(sys.argv[1])
    mb, mn = measured(sys.argv[2], int(sys.argv[3]))
    kinds = sorted(set(pb) | set(mb), key=lambda k: -max(pb.get(k, 0), mb.get(k, 0)))
    print(f"{'kind':<22} {'n model':>7} {'n gpu':>6} {'model ms':>9} {'gpu ms':>9} {'gpu/model':>9}")
    for k in kinds:
        p, m = 1e3 * pb.get(k, 0), 1e3 * mb.get(k, 0)
        if max(p, m) < 0.05:
            continue
        print(f"{k:<22} {pn.get(k, 0):7d} {mn.get(k, 0):6.0f} {p:9.3f} {m:9.3f} {m / p if p > 0 else float('inf'):9.2f}")
    p, m = 1e3 * sum(pb.values()), 1e3 * sum(mb.values())
    print(f"{'all kernels':<22} {'':7} {'':6} {p:9.3f} {m:9.3f} {m / p:9.2f}")


if __name__ == "__main__":
    main()
