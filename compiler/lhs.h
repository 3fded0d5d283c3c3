/* lhs.h — the latency-hiding list scheduler (lhs.c) that `--schedule lhs`
 * runs inside the schedule pass (schedule.c); docs/schedule.md for users.
 *
 * lhs_order takes one rank's program in the fixed order (schedule.c's: every
 * assign last, collectives hoisted) and returns another topological order of
 * the same nodes in which transfers (collectives, sends and receives, offload
 * copies) start as early as their inputs, the comm chain and the limits
 * allow, and the compute stream runs independent work while they are in
 * flight.  Events and numbering stay schedule.c's business; so does the
 * memory rule (schedule.c runs memplan on the result and backs off).
 */
#ifndef KILN_LHS_H
#define KILN_LHS_H

#include "ir.h"
#include "live.h"

/* The stream node n of module m runs on: offload's device-to-host copy on
 * the d2h stream, reload's host-to-device copy on h2d, collectives on a
 * comm stream when they overlap, the rest on compute.  overlap: 0, no comm
 * stream (world 1 or --no-overlap); 1, one comm stream for every transfer
 * (the fixed order's); 2, comm streams of their own for tp and pp (lhs's):
 * a collective whose group spans only the tp axis among the mesh's axes of
 * more than one rank on IR_STREAM_TP, every transfer whose group spans only
 * pp (sends, receives and the collectives over pp) on IR_STREAM_PP, the
 * rest on IR_STREAM_COMM.  Only same-stage collectives move to tp's: every
 * member of a tp group runs the same program, so the tp stream runs the
 * same sequence on all of them (they meet in the same order).  Sends and
 * receives pair across programs: all of pp's stay together on pp's stream
 * in the fixed order's relative order (lhs keeps the comm chain), a
 * subsequence of what one comm stream ran, so a receive waits for no more
 * than it did.  3: tp's own stream only (pp's transfers on IR_STREAM_COMM),
 * lhs's second choice when pp's stream costs more memory than the rank
 * has.  By the live axes, not the group's name:
 * groups of the same ranks share one NCCL communicator (comm_nccl.c), so
 * they must share a stream too.  schedule.c and lhs.c both place by it. */
static inline int sched_stream_for(const Module *m, const Node *n, int overlap) {
    if (n->op == OP_offload) return IR_STREAM_D2H;
    if (n->op == OP_reload) return IR_STREAM_H2D;
    unsigned f = ir_ops[n->op].flags;
    if (!overlap || !(f & F_COMM)) return IR_STREAM_COMPUTE;
    if (overlap >= 2) {
        int mask = ir_group_mask(ir_attr_s(n, "group", "")), live = 0;
        for (int a = 0; a < IR_NAXES && mask > 0; a++)
            if ((mask >> a & 1) && m->mesh[a] > 1) live |= 1 << a;
        if (live == 1 << 3 && !(f & (F_SINK | F_SOURCE)) && n->op != OP_recv_done) return IR_STREAM_TP; /* the mesh's axes: pp, dp, cp, tp */
        if (live == 1 << 0 && overlap == 2) return IR_STREAM_PP;
    }
    return IR_STREAM_COMM;
}

/* The limits of one attempt (schedule.c tries looser ones first):
 *   window       a compute node may run before nodes of the fixed order at
 *                most window positions ahead of the first one not yet placed
 * (per stream s: compute, comm, d2h, h2d, tp; schedule.c gives tp's stream
 * the comm stream's limits)
 *   xwindow[s]   the same for a transfer on stream s (0: no limit, as early
 *                as its inputs and the comm chain allow)
 *   inflight[s]  how many transfers on stream s that hold a device buffer
 *                (a collective's or a receive's output, a reload) may have
 *                been issued without their first consumer placed (0: any)
 *   prefer_transfer  among compute that would not stall, the one leading
 *                soonest to a transfer first (else the fixed order's)
 *   move_reloads  reloads move like other transfers (else each stays where
 *                the fixed order has it, every node before it placed first) */
typedef struct {
    int window;
    int xwindow[IR_NSTREAMS];
    int inflight[IR_NSTREAMS];
    int prefer_transfer;
    int move_reloads;
} LhsLimits;

/* order (g->nnodes node indices): in, the fixed order; out, lhs's order.
 * dur: seconds per node index (the cost model's, cost_node_seconds).
 * Every data edge, the comm nodes' relative order (F_COMM: one chain, so the
 * ranks of a group meet in the same order and a send keeps its recv), the
 * runs of a fused group, the assigns at the end and each collective over pp
 * where the fixed order has it (none of the nodes before it moves after
 * it) hold.  *exposed (may be NULL): the compute stream's predicted idle
 * time waiting for other streams, in the scheduler's own simulation. */
void lhs_order(const Graph *g, const double *dur, int overlap, const LhsLimits *lim, int *order, double *exposed);

#endif
