#!/usr/bin/env python3
"""bench/pp_trace_idle.py SCHEDULE M CORES TRACE_RANK0 TRACE_RANK1 ... — where a
pipeline step's compute-stream idle time goes, from the ranks' --trace
files of one run (runtime/cpu/dev_cpu.c writes them; rank order).

The step and the idle are `kiln plot --trace`'s: the compute stream (tid
0) is cut into steps after the optimizer (an `opt` kernel followed by
another phase); a rank's window of the last step runs from the first event
of any stream after the previous step's last compute kernel to its own
last compute kernel's end; the makespan is the longest window, and the
idle is 1 - (sum of the ranks' busy time) / (ranks x makespan), busy being
the union of the compute kernels.  The idle is split into
  wait:  gaps between compute kernels in which a comm-stream wait
         (recv_done, allreduce) ended: the rank waited for another rank;
  host:  the other gaps between compute kernels (launching, the stream's
         event handshakes: per-kernel host overhead);
  tail:  makespan minus the rank's own window (it started late or ended
         early against the longest rank).
occupancy: the ranks' busy time over CORES x makespan; near 1 or above,
the ranks share cores and a kernel's span includes the time its thread
was descheduled, so the idle measures the machine's time-slicing more
than the schedule.

Measured costs: per rank, F (fwd), B (bwd) and W (wgrad) per
micro-batch, a recompute kernel counted with the next kernel of another
phase (the action it runs in), from every step but the first: for each
(kind, kernel name) the median duration times the count (a median resists the kernels
that a loaded machine stretched), over M micro-batches.  For 1f1b and
zb-h1 traces (one chunk per rank: the kinds are per rank) the schedule is
then simulated from those costs at zero latency, as bench/zb_h1_placement.py
does (1f1b: B+W as one backward; zb-h1: rank r keeps r W's pending):
the bubble the schedule would have at the measured costs, with no
transfer latency and no host overhead; and for zb-h1 (best_zbh1) the bubble
below which no order within zb-h1's in-flight bound can go at those costs
(zb_h1_placement.best, ppsched_makespan_bound): when sim_zbh1 equals it,
the W placement is already the best one and the rest is the stages' costs;
and equal_ratio, zb-h1's bubble over 1f1b's with each rank's F, B, W
scaled so that every rank's total is the ranks' mean (the stages balanced
in time, each keeping its own F:B:W): what a perfect cut would give.

Latency (2 ranks, one chunk each: 1f1b, zb-h1): the ranks' clocks differ
by an unknown offset d; for the transfers 0->1 (activations) and 1->0
(gradients), receive end minus send end is d + L and -d + L; their
minima give d (assuming equal minimal latency both ways) and then each
blocking receive's latency L = its end - (its send's end + offset).
Prints the median and the largest over the step's blocking receives.

Output: one line per quantity, `key value`, for bench/pipeline.sh.
"""
import collections
import json
import statistics
import sys

import zb_h1_placement as zp


def phase(e):
    return (e.get("args", {}).get("at", "") or " ").split()[0]


def load(path):
    ev = json.load(open(path))["traceEvents"]
    xs = sorted((e for e in ev if e.get("ph") == "X"), key=lambda e: e["ts"])
    comp = [e for e in xs if e["tid"] == 0]
    other = [e for e in xs if e["tid"] != 0]
    starts = [0] + [i for i in range(1, len(comp)) if phase(comp[i - 1]) == "opt" and phase(comp[i]) != "opt"] + [len(comp)]
    if not comp:
        sys.exit(f"{path}: no compute kernel")
    return comp, other, starts


def window(comp, other, starts, s):
    i0, i1 = starts[s], starts[s + 1]
    prev = max(e["ts"] + e["dur"] for e in comp[starts[s - 1]:i0]) if s > 0 else float("-inf")
    ws = min([comp[i0]["ts"]] + [e["ts"] for e in other if prev < e["ts"] < comp[i0]["ts"]])
    return ws, comp[i0:i1]


def split(ws, kernels, other):
    waits = [e["ts"] + e["dur"] for e in other if e["name"] in ("recv_done", "allreduce")]
    busy = host = wait = 0.0
    t = ws
    for e in kernels:
        g = e["ts"] - t
        if g > 0:
            if any(t - 1 <= x <= e["ts"] + 1 for x in waits):
                wait += g
            else:
                host += g
        a = max(e["ts"], t)
        busy += max(0.0, e["ts"] + e["dur"] - a)
        t = max(t, e["ts"] + e["dur"])
    return busy, host, wait, t - ws


def costs(comp, starts, m):
    """A recompute kernel counts in the action it runs in: that of the next
    kernel of another phase (a W action recomputes what only W reads).  A
    kernel's median is taken over the kernels of its kind, name and place
    in its run of one kind (its ordinal among that name's kernels there):
    one median per name would put every matmul, whatever its shape, under
    one number (it overcounted rank 0's W by 2 ms of 17 here)."""
    kind = {"fwd": "F", "bwd": "B", "wgrad": "W"}
    ks = comp[starts[1] if len(starts) > 2 else 0:]
    d, nxt, nth = collections.defaultdict(list), None, collections.Counter()
    for e in reversed(ks):
        ph = phase(e)
        if ph in kind:
            if kind[ph] != nxt:
                nth.clear()  # a new run of one kind: ordinals from its end
            nxt = kind[ph]
        if (ph in kind or ph == "recompute") and nxt:
            nth[e["name"]] += 1
            d[(nxt, e["name"], nth[e["name"]])].append(e["dur"])
    steps = max(1, len(starts) - 2)
    c = collections.Counter()
    for (k, _, _), v in d.items():
        c[k] += statistics.median(v) * len(v) / (m * steps) / 1e3
    return c["F"], c["B"], c["W"]


def latency(runs):
    """runs: [(comp, other)] of 2 ranks; the last step's blocking receives."""
    sends = [[e for e in o if e["name"] == "send" and " L-1 " not in e.get("args", {}).get("at", " ") + " "] for _, o in runs]
    recvs = [[e for e in o if e["name"] == "recv_done" and " L-1 " not in e.get("args", {}).get("at", " ") + " "] for _, o in runs]
    fwd = [(s, r) for s, r in zip([e for e in sends[0] if phase(e) == "fwd"], [e for e in recvs[1] if phase(e) == "fwd"])]
    bwd = [(s, r) for s, r in zip([e for e in sends[1] if phase(e) == "bwd"], [e for e in recvs[0] if phase(e) == "bwd"])]
    if not fwd or not bwd:
        return None
    end = lambda e: e["ts"] + e["dur"]
    d1 = min(end(r) - end(s) for s, r in fwd)
    d2 = min(end(r) - end(s) for s, r in bwd)
    off = (d1 - d2) / 2  # rank 1's clock minus rank 0's
    lat = [end(r) - end(s) - off for s, r in fwd if r["ts"] < end(s) + off] + \
          [end(r) - end(s) + off for s, r in bwd if r["ts"] < end(s) - off]
    return (statistics.median(lat), max(lat), len(lat)) if lat else None


def main():
    sched, m, cores, paths = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
    p = len(paths)
    ranks = [load(x) for x in paths]
    s = min(len(st) for _, _, st in ranks) - 2
    rows = []
    for comp, other, st in ranks:
        ws, ks = window(comp, other, st, s)
        rows.append(split(ws, ks, other))
    span = max(r[3] for r in rows)
    busy = sum(r[0] for r in rows)
    pct = lambda x: f"{100 * x / (p * span):.1f}"
    print("idle", pct(p * span - busy))
    print("wait", pct(sum(r[2] for r in rows)))
    print("host", pct(sum(r[1] for r in rows)))
    print("tail", pct(sum(span - r[3] for r in rows)))
    print("occupancy", f"{busy / (cores * span):.2f}")
    print("step_ms", f"{span / 1e3:.1f}")
    c = [costs(comp, st, m) for comp, _, st in ranks]
    print("costs_ms", " ".join(f"{f:.1f}/{b:.1f}/{w:.1f}" for f, b, w in c))
    F, B, W = ([x[k] for x in c] for k in range(3))
    if sched not in ("1f1b", "zb-h1"):
        return
    both = lambda k, r: {"F": F[r], "B": B[r] + W[r], "W": 0.0}[k]
    print("sim_1f1b", f"{100 * zp.bubble(p, [zp.orders(p, m, r, 0) for r in range(p)], both):.1f}")
    if sched == "zb-h1":
        split_ = lambda k, r: {"F": F[r], "B": B[r], "W": W[r]}[k]
        print("sim_zbh1", f"{100 * zp.bubble(p, [zp.orders(p, m, r, r) for r in range(p)], split_):.1f}")
        print("best_zbh1", f"{100 * zp.best(p, m, F, B, W, [p] * p):.1f}")
        # the stages made equal in time: each rank's F, B, W scaled to the ranks' mean total
        tot = [F[r] + B[r] + W[r] for r in range(p)]
        k = [sum(tot) / p / t if t > 0 else 1.0 for t in tot]
        eq = lambda kind, r: k[r] * {"F": F[r], "B": B[r], "W": W[r]}[kind]
        eq1 = lambda kind, r: k[r] * {"F": F[r], "B": B[r] + W[r], "W": 0.0}[kind]
        b1 = zp.bubble(p, [zp.orders(p, m, r, 0) for r in range(p)], eq1)
        bh = zp.bubble(p, [zp.orders(p, m, r, r) for r in range(p)], eq)
        print("equal_ratio", f"{bh / b1:.2f}" if b1 > 0 else "-")
    if p == 2:
        lat = latency([(comp, [e for e in other if e["ts"] >= window(comp, other, st, s)[0]]) for comp, other, st in ranks])
        if lat:
            print("latency_us", f"{lat[0]:.0f} {lat[1]:.0f} {lat[2]}")


if __name__ == "__main__":
    main()
