#!/usr/bin/env python3
"""trace_top.py TRACE.json STEPS — where a traced CUDA step spends its time.

Reads the Chrome trace a kiln trainer writes with --trace (one complete
event per launch, GPU times from CUDA events) and prints: the wall span,
the busy time (the union of the launches' intervals on all streams), the
idle share (launch gaps: the CPU enqueueing slower than the GPU runs, or
waits), and the launches grouped by name, largest total first, per step.
Every step launches the same kernels, so the first step (module loading,
cuBLASLt's plans, the allocator's first touch) is dropped: the first
1/STEPS of the launches in time order.
Used by bench/gpu/profile.sh on the GPU machine; needs only the standard
library."""
import gzip
import json
import sys
from collections import defaultdict


def steady_events(path, steps):
    """The launches of a STEPS-step trace (plain or gzipped JSON) after the
    first step, in time order, and how many steps they are."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        doc = json.load(f)
    ev = doc["traceEvents"] if isinstance(doc, dict) else doc
    ev = sorted((e for e in ev if e.get("ph") == "X" and "dur" in e), key=lambda e: e["ts"])
    if steps < 2 or len(ev) % steps:
        sys.exit(f"{path}: {len(ev)} launches are not {steps} equal steps (STEPS >= 2)")
    return ev[len(ev) // steps:], steps - 1


def main():
    path = sys.argv[1]
    ev, steps = steady_events(path, int(sys.argv[2]))
    t0 = min(e["ts"] for e in ev)
    t1 = max(e["ts"] + e["dur"] for e in ev)
    busy, end = 0.0, t0
    for e in ev:
        s, f = max(e["ts"], end), e["ts"] + e["dur"]
        if f > s:
            busy += f - s
        end = max(end, f)
    by = defaultdict(lambda: [0, 0.0])
    for e in ev:
        by[e["name"]][0] += 1
        by[e["name"]][1] += e["dur"]
    total = sum(v[1] for v in by.values())
    span = t1 - t0
    print(f"{path}: {len(ev)} launches over {steps} step(s); span {span / 1e3 / steps:.2f} ms/step, "
          f"busy {busy / 1e3 / steps:.2f} ms/step ({100 * busy / span:.1f}%), "
          f"kernel time summed over streams {total / 1e3 / steps:.2f} ms/step")
    print(f"{'ms/step':>9} {'share':>6} {'n/step':>7} {'us each':>9}  name")
    for name, (n, d) in sorted(by.items(), key=lambda kv: -kv[1][1])[:30]:
        print(f"{d / 1e3 / steps:9.3f} {100 * d / total:5.1f}% {n / steps:7.1f} {d / n:9.1f}  {name}")


if __name__ == "__main__":
    main()
