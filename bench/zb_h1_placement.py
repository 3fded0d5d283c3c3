#!/usr/bin/env python3
"""bench/zb_h1_placement.py - how much the W placement can do for ZB-H1 at
p ranks, m micro-batches and given per-rank F, B, W costs (one chunk per
rank, zero latency; the same timing rule as ppsched_simulate: an action
starts when its rank is free and its inputs are there).

Rank r runs 1F1B's order of F and B and keeps k_r W's pending (runs W(i)
once k_r later B's have run; the rest at the end).  ZB-H1 is k_r = r.
Prints 1f1b's bubble (B+W as one backward), then every (k_0, ..., k_{p-1})
with each k_r in 0..p, best first.

  python3 bench/zb_h1_placement.py P M F0,F1,.. B0,B1,.. W0,W1,..
  python3 bench/zb_h1_placement.py 2 8 446.1,463.5 8.421,522.5 900.8,421.3   # bench/pipeline.sh's model

The first rank's B is nearly empty (8.4 MFLOP against W 900.8 above): its
chunk sends no input gradient, so compiler/pp.c puts its whole backward in
W.  That is exact and does not change the bubble: rank 0 runs each W right
after its B (k_0 = 0), and splitting its backward as 500 + 409 MFLOP gives
0.0613 against 0.0612.  The last rank's B / W (522.5 / 421.3) is the real
one: the dX GEMMs equal the dW GEMMs, and B adds attention's backward and
the norms'.  With B > W, zb-h1 idles (p-1)(F+B-W) per rank against 1f1b's
(p-1)(F+B+W): 0.49 of 1f1b's bubble here, 0.54 at p 4 (m 8).
bench/pp_trace_idle.py imports orders() and bubble() to time the same
placements at the costs measured in the ranks' traces, and best() for the
bubble below which no order at all can go.

best(): ppsched_makespan_bound (compiler/ppsched.h) at these costs, as a
bubble.  Rank r starts after the forwards before it (S_r) and works busy_r;
its first W waits for a micro-batch's whole chain E_r (all F, B_q for
q >= r), before which it can run at most K_r F's and B's (K_r its in-flight
bound: p for zb-h1); after its last B at most K_r W's are left on it, and
then the backward goes on through ranks r-1 .. 0 and rank 0's W:
    idle_r = max(S_r, E_r - K_r (F_r + B_r)),   T >= idle_r + busy_r,
    T >= idle_r + busy_r - K_r W_r + sum_{q<r} B_q + W_0.
No order within the bound is faster; where zb-h1's simulated bubble equals
it (this model at P=2 and 4, equal costs) the rest of the bubble is the
stages' unequal costs, not the W placement.
"""
import itertools, sys

def orders(p, m, r, keep):
    warm = p - r - 1
    out, f, pend = [("F", i) for i in range(warm)], warm, []
    for b in range(m):
        if f < m:
            out.append(("F", f)); f += 1
        out.append(("B", b)); pend.append(b)
        if keep is not None and len(pend) > keep:
            out.append(("W", pend.pop(0)))
    return out + [("W", x) for x in pend]

def bubble(p, acts, cost):
    done, t, pc, busy = {}, [0.0] * p, [0] * p, [0.0] * p
    while any(pc[r] < len(acts[r]) for r in range(p)):
        moved = False
        for r in range(p):
            while pc[r] < len(acts[r]):
                k, i = acts[r][pc[r]]
                dep = [("F", r - 1, i)] if k == "F" and r > 0 else [("B", r + 1, i)] if k == "B" and r < p - 1 else []
                if any(d not in done for d in dep):
                    break
                c = cost(k, r)
                t[r] = max([t[r]] + [done[d] for d in dep]) + c
                busy[r] += c
                done[(k, r, i)] = t[r]
                pc[r] += 1
                moved = True
        if not moved:
            sys.exit("deadlock")
    return 1 - sum(busy) / (p * max(t))

def best(p, m, F, B, W, K):
    """The bubble at ppsched_makespan_bound's makespan (one chunk per rank,
    zero-bubble; K[r]: rank r's in-flight bound; zero latency)."""
    T = S = chain = 0.0
    for r in range(p):
        busy = m * (F[r] + B[r] + W[r])
        k = min(K[r], m)
        idle = max(S, sum(F) + sum(B[r:]) - k * (F[r] + B[r]))
        T = max(T, idle + busy)
        if r > 0:
            T = max(T, (idle if m > K[r] else S) + busy - k * W[r] + chain + W[0])
        S += F[r]
        chain += B[r]
    return 1 - sum(m * (F[r] + B[r] + W[r]) for r in range(p)) / (p * T)


def main():
    p, m = int(sys.argv[1]), int(sys.argv[2])
    F, B, W = ([float(x) for x in a.split(",")] for a in sys.argv[3:6])
    one = lambda k, r: {"F": F[r], "B": B[r] + W[r], "W": 0.0}[k]
    print(f"1f1b: {bubble(p, [orders(p, m, r, 0) for r in range(p)], one):.4f}")
    print(f"no order under zb-h1's in-flight bound (p per rank) below: {best(p, m, F, B, W, [p] * p):.4f}")
    split = lambda k, r: {"F": F[r], "B": B[r], "W": W[r]}[k]
    rows = [(bubble(p, [orders(p, m, r, ks[r]) for r in range(p)], split), ks) for ks in itertools.product(range(p + 1), repeat=p)]
    for b, ks in sorted(rows):
        print(f"keep {ks}: {b:.4f}{'   (zb-h1)' if list(ks) == list(range(p)) else ''}")

if __name__ == "__main__":
    main()
