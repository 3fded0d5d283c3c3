#!/usr/bin/env python3
"""bench/trace_overlap.py TRACE.json [NAMES] — how much of the comm stream's time
the compute stream hid, from a kiln --trace timeline (every step of the run).

Reads the Chrome-trace 'X' events of one rank.  Comm kernels are the
collectives and ring attention's point-to-point kernels (by name:
allreduce, reducescatter, allgather, send, recv; NAMES, a comma-separated
list, picks others, e.g. "send,recv" for the ring alone) on any stream;
compute kernels are the other events of stream 0.  For every comm kernel,
the part of its interval during which some compute kernel ran is hidden; the
rest is exposed (the compute stream idle, waiting, or running the
collective itself under --no-overlap).  Prints: comm ms, hidden ms, exposed
ms, hidden %.
"""
import json, sys

def merge(iv):
    iv.sort()
    out = []
    for a, b in iv:
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out

def main():
    ev = json.load(open(sys.argv[1]))
    if isinstance(ev, dict):
        ev = ev.get("traceEvents", [])
    xs = [e for e in ev if e.get("ph") == "X"]
    names = sys.argv[2].split(",") if len(sys.argv) > 2 else ["allreduce", "reducescatter", "allgather", "send", "recv"]
    is_comm = lambda e: any(k in e.get("name", "") for k in names)
    comp = merge([[e["ts"], e["ts"] + e["dur"]] for e in xs if e.get("tid") == 0 and not is_comm(e)])
    comm = [[e["ts"], e["ts"] + e["dur"]] for e in xs if is_comm(e)]
    total = sum(b - a for a, b in comm)
    hidden = 0.0
    j = 0
    for a, b in merge(comm):
        while j < len(comp) and comp[j][1] < a:
            j += 1
        k = j
        while k < len(comp) and comp[k][0] < b:
            hidden += max(0.0, min(b, comp[k][1]) - max(a, comp[k][0]))
            k += 1
    pct = 100.0 * hidden / total if total else 0.0
    print(f"{total / 1e3:.1f} {hidden / 1e3:.1f} {(total - hidden) / 1e3:.1f} {pct:.0f}")

main()
