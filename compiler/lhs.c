/* lhs.c — the latency-hiding list scheduler (`--schedule lhs`, issue 22).
 *
 * XLA's latency-hiding scheduler orders an HLO computation so that every
 * asynchronous start is issued as early as it can be and every done as late
 * as it can be, with independent work in between, by a list scheduler that
 * models each resource (compute, the async streams) with a cost model.
 * kiln's programs have the same shape: a node on the comm stream (a
 * collective, a send, a receive), on d2h or h2d (offload copies) is the
 * start, and the first node of another stream that reads its output (and
 * so waits for its event) is the done.  This file orders one rank's program
 * that way; schedule.c adds the events, checks memory and backs off.
 *
 * Forward, not reverse.  XLA schedules bottom-up so that a done is placed
 * first and its start pushed as far up as the resources allow.  kiln starts
 * from an order that is already good for memory and for the pipeline (the
 * fixed one: pp.c's unrolled micro-batches, recompute just before its
 * backward, offload's reloads where offload put them), and the latency to
 * hide is on the transfers that order already starts early (schedule.c
 * hoists collectives).  What it lacks is the other half: filling the time a
 * transfer is in flight.  So the scheduler walks forward, simulating the
 * streams with the cost model's node times, and at each step places
 *   1. a transfer whose inputs are placed (and, for the comm stream, every
 *      earlier comm node: one chain, the fixed order's), within its stream's
 *      in-flight limit and look-ahead window; else
 *   2. the compute unit (a node, or a fused group whole) that would not
 *      stall: its inputs from other streams are done, in the simulation, by
 *      the time the compute stream is free.  Among those, the one that
 *      leads soonest to a transfer (the smallest fixed position of a
 *      transfer it reaches: its critical path to communication — the input
 *      gradient GEMM before the weight gradient GEMM, so the send or the
 *      tensor-parallel all-reduce leaves sooner), then the fixed order.
 *      When every candidate stalls, the one whose inputs are ready first.
 * Candidates come from a window of the fixed order: at most `window`
 * positions past the first node not yet placed.  The window bounds how far
 * any node moves, so the memory shape of the fixed order survives (a
 * forward of the next micro-batch is not pulled into this one's backward);
 * the first node not yet placed is always a candidate (its predecessors
 * all precede it in the fixed order), so the walk never gets stuck: when
 * nothing else may go, it goes, even past an in-flight limit.
 *
 * What never moves.  The comm nodes keep their relative order (the ranks
 * of a group must meet in the same order; ir_p2p_peer pairs a send with the
 * next recv), so any deadlock-freedom of the fixed order carries over: a
 * node's position only ever waits on nodes placed before it, and the comm
 * stream runs exactly the fixed order's sequence.  A collective over pp (a
 * meeting point of ranks that run different programs) is issued only when
 * every node before it in the fixed order is placed, as the fixed order
 * never hoists it.  A posted receive (recv_start) is never posted later
 * than the fixed order posts it: no compute unit after it in the fixed
 * order is placed before it (next_post), so a pipeline action's receive is
 * still posted before the previous action computes (tests/t_pp_post.sh).
 * A send likewise (the same next_post): the peer rank waits for it, and a
 * send issued after more compute than the fixed order's delays the whole
 * pipeline even when this rank's own simulation hides more (GPT-3 175B's
 * slice, zb-v without offload: the module's predicted step 1649 ms against
 * fixed's 1641 before, 1586 with the rule).  A reload is pinned (it stays
 * where the offload pass put it, with its prefetch lead): issued earlier it
 * made the pipelined slices slower, not faster (the h2d stream's fences tie
 * it to the compute and comm streams' positions; with offload all, lhs on
 * every rank of the GPT-3 slice predicted 2248 ms against 1958 ms pinned).
 * But where the step is bound by the copies (the Llama-3 70B plan with
 * offload all: 16 s of exposed h2d in a 37 s step), an earlier reload is a
 * longer prefetch and wins (35.4 s against 37.3 s pinned), so the limits
 * say which (move_reloads) and schedule.c tries both.
 * Assigns stay last (schedule.c appends them).
 *
 * Comm streams per axis (overlap 2, lhs.h: tp's collectives on
 * IR_STREAM_TP, pp's transfers on IR_STREAM_PP).
 * The chain above still spans every comm node, so the order in which they
 * are issued is the fixed order's; what changes is the simulation (each
 * stream has its own clock, so a tp collective or a pipeline receive issued
 * behind a dp bucket starts when its inputs are ready) and so which compute
 * fills the gaps.
 */
#include <float.h>
#include <stdlib.h>
#include <string.h>

#include "lhs.h"

typedef struct {
    const Graph *g;
    const LhsLimits *lim;
    int n;              /* units (the fixed order's non-assign prefix, fused runs as one) */
    int *first, *len;   /* per unit: order[first .. first+len) */
    int *unit_of;       /* per node */
    int *stream;
    double *dur, *end;
    int *succ_off, *succ, *indeg;
    int *next_xfer;     /* per unit: the smallest unit index of a transfer it reaches (n: none) */
    char *pin, *holds, *open, *done, *post;
    int next_post;      /* the first posted receive (recv_start) not yet placed (n: none) */
    int *rx, nrx;       /* the transfers whose inputs are all placed, not yet placed */
    int infl[IR_NSTREAMS];
    double tfree[IR_NSTREAMS], exposed;
} Lhs;

static int over_pp_collective(const Node *n) {
    unsigned f = ir_ops[n->op].flags;
    int mask = ir_group_mask(ir_attr_s(n, "group", ""));
    return (f & F_COMM) && !(f & (F_SINK | F_SOURCE)) && n->op != OP_recv_done && mask > 0 && (mask & 1);
}

/* Nodes issued only where the fixed order has them (every node before
 * them placed): a collective over pp; a blocking receive (recv, recv_done:
 * the comm stream stops there until the peer's send, and every stream that
 * later fences on the comm stream with it); an offload (its {lag} counts
 * nodes from where offload.c put it); a reload unless the limits move
 * reloads (see the top). */
static int pinned(const Node *n, const LhsLimits *lim) {
    return over_pp_collective(n) || n->op == OP_recv || n->op == OP_recv_done || n->op == OP_offload || (n->op == OP_reload && !lim->move_reloads);
}

/* Units: consecutive nodes of the fixed order in one fused group. */
static void build_units(Lhs *L, const int *order, int nn, const double *dur, int overlap) {
    const Graph *g = L->g;
    L->first = xcalloc((size_t)nn + 1, sizeof(int)), L->len = xcalloc((size_t)nn + 1, sizeof(int));
    L->unit_of = xcalloc((size_t)g->nnodes + 1, sizeof(int));
    L->stream = xcalloc((size_t)nn + 1, sizeof(int));
    L->dur = xcalloc((size_t)nn + 1, sizeof(double)), L->end = xcalloc((size_t)nn + 1, sizeof(double));
    L->pin = xcalloc((size_t)nn + 1, 1), L->holds = xcalloc((size_t)nn + 1, 1);
    L->open = xcalloc((size_t)nn + 1, 1), L->done = xcalloc((size_t)nn + 1, 1), L->post = xcalloc((size_t)nn + 1, 1);
    for (int j = 0; j < nn;) {
        const Node *nd = &g->nodes[order[j]];
        int64_t grp = ir_fused_group(nd), u = L->n++;
        L->first[u] = j, L->stream[u] = sched_stream_for(g->m, nd, overlap), L->pin[u] = (char)pinned(nd, L->lim);
        L->post[u] = nd->op == OP_recv_start || nd->op == OP_send;
        L->holds[u] = (char)(L->stream[u] != IR_STREAM_COMPUTE && nd->nout > 0 && nd->op != OP_offload);
        do {
            L->unit_of[order[j]] = (int)u, L->dur[u] += dur[order[j]], j++;
        } while (grp >= 0 && j < nn && ir_fused_group(&g->nodes[order[j]]) == grp);
        L->len[u] = j - L->first[u];
    }
}

/* Per value: the unit of the offload that copies it to the host, or -1. */
static int *offloaded_by(const Lhs *L, const int *order) {
    int *off = xcalloc((size_t)L->g->nvals + 1, sizeof(int));
    for (int v = 0; v < L->g->nvals; v++) off[v] = -1;
    for (int u = 0; u < L->n; u++) {
        const Node *nd = &L->g->nodes[order[L->first[u]]];
        if (nd->op == OP_offload) off[nd->in[0]] = u;
    }
    return off;
}

/* Edges: data (producer's unit before consumer's), the comm chain, and
 * every reader of a value (or of a view of it) that the fixed order has
 * before the value's offload stays before it (verify.c, check_offloaded:
 * from the offload on, the device buffer is free). */
static void build_edges(Lhs *L, const int *order) {
    const Graph *g = L->g;
    int cap = 64, m = 0, (*e)[2] = xcalloc((size_t)cap, sizeof *e), prev_comm = -1;
    for (int u = 0; u < L->n; u++) {
        for (int j = L->first[u]; j < L->first[u] + L->len[u]; j++) {
            const Node *nd = &g->nodes[order[j]];
            for (int k = 0; k < nd->nin; k++) {
                int d = g->vals[nd->in[k]].def;
                if (d < 0 || L->unit_of[d] == u) continue;
                if (m == cap && !(e = realloc(e, sizeof *e * (size_t)(cap *= 2)))) ICE("out of memory");
                e[m][0] = L->unit_of[d], e[m++][1] = u;
            }
        }
        if (ir_ops[g->nodes[order[L->first[u]]].op].flags & F_COMM) {
            if (prev_comm >= 0) {
                if (m == cap && !(e = realloc(e, sizeof *e * (size_t)(cap *= 2)))) ICE("out of memory");
                e[m][0] = prev_comm, e[m++][1] = u;
            }
            prev_comm = u;
        }
    }
    int *off = offloaded_by(L, order);
    for (int u = 0; u < L->n; u++) /* the readers of an offloaded buffer before its offload */
        for (int j = L->first[u]; j < L->first[u] + L->len[u]; j++) {
            const Node *nd = &g->nodes[order[j]];
            for (int k = 0; k < nd->nin; k++)
                for (int w = nd->in[k], hops = 0; w >= 0 && hops < 64; hops++) {
                    int o = off[w], d = g->vals[w].def;
                    if (o > u) {
                        if (m == cap && !(e = realloc(e, sizeof *e * (size_t)(cap *= 2)))) ICE("out of memory");
                        e[m][0] = u, e[m++][1] = o;
                    }
                    w = d >= 0 && (ir_ops[g->nodes[d].op].flags & F_VIEW) && g->nodes[d].nin ? g->nodes[d].in[0] : -1;
                }
        }
    free(off);
    L->succ_off = xcalloc((size_t)L->n + 1, sizeof(int)), L->succ = xcalloc((size_t)m + 1, sizeof(int));
    L->indeg = xcalloc((size_t)L->n + 1, sizeof(int));
    for (int k = 0; k < m; k++) {
        if (e[k][0] >= e[k][1]) ICE("lhs: the fixed order is not topological (unit %d before %d)", e[k][1], e[k][0]);
        L->succ_off[e[k][0] + 1]++, L->indeg[e[k][1]]++;
    }
    for (int u = 0; u < L->n; u++) L->succ_off[u + 1] += L->succ_off[u];
    int *fill = xcalloc((size_t)L->n + 1, sizeof(int));
    for (int k = 0; k < m; k++) L->succ[L->succ_off[e[k][0]] + fill[e[k][0]]++] = e[k][1];
    free(fill), free(e);
    L->next_xfer = xcalloc((size_t)L->n + 1, sizeof(int));
    for (int u = L->n - 1; u >= 0; u--) {
        int best = L->stream[u] != IR_STREAM_COMPUTE ? u : L->n;
        for (int k = L->succ_off[u]; k < L->succ_off[u + 1]; k++)
            if (L->next_xfer[L->succ[k]] < best) best = L->next_xfer[L->succ[k]];
        L->next_xfer[u] = best;
    }
}

/* When unit u's inputs from other units are done, in the simulation. */
static double inputs_ready(const Lhs *L, const int *order, int u) {
    double t = 0;
    for (int j = L->first[u]; j < L->first[u] + L->len[u]; j++) {
        const Node *nd = &L->g->nodes[order[j]];
        for (int k = 0; k < nd->nin; k++) {
            int d = L->g->vals[nd->in[k]].def;
            if (d >= 0 && L->unit_of[d] != u && L->end[L->unit_of[d]] > t) t = L->end[L->unit_of[d]];
        }
    }
    return t;
}

static void place(Lhs *L, const int *order, int u, int *out, int *k) {
    int s = L->stream[u];
    double ready = inputs_ready(L, order, u), start = ready > L->tfree[s] ? ready : L->tfree[s];
    if (s == IR_STREAM_COMPUTE) L->exposed += start - L->tfree[s];
    L->end[u] = start + L->dur[u], L->tfree[s] = L->end[u];
    for (int j = L->first[u]; j < L->first[u] + L->len[u]; j++) {
        const Node *nd = &L->g->nodes[order[j]];
        for (int q = 0; q < nd->nin; q++) { /* the first consumer of an open transfer closes it */
            int d = L->g->vals[nd->in[q]].def, p = d >= 0 ? L->unit_of[d] : -1;
            if (p >= 0 && p != u && L->open[p]) L->open[p] = 0, L->infl[L->stream[p]]--;
        }
        out[(*k)++] = order[j];
    }
    if (L->holds[u]) L->open[u] = 1, L->infl[s]++;
    L->done[u] = 1;
    while (L->next_post < L->n && (!L->post[L->next_post] || L->done[L->next_post])) L->next_post++;
    for (int q = 0; q < L->nrx; q++)
        if (L->rx[q] == u) L->rx[q--] = L->rx[--L->nrx];
    for (int q = L->succ_off[u]; q < L->succ_off[u + 1]; q++)
        if (--L->indeg[L->succ[q]] == 0 && L->stream[L->succ[q]] != IR_STREAM_COMPUTE) L->rx[L->nrx++] = L->succ[q];
}

/* Step 1: the first transfer that may be issued now, or -1. */
static int pick_transfer(const Lhs *L, int lo) {
    int best = -1;
    for (int q = 0; q < L->nrx; q++) {
        int u = L->rx[q], s = L->stream[u];
        if (best >= 0 && u > best) continue;
        if (L->lim->xwindow[s] && u >= lo + L->lim->xwindow[s]) continue;
        if (L->pin[u] && u != lo) continue;
        if (L->holds[u] && L->lim->inflight[s] && L->infl[s] >= L->lim->inflight[s]) continue;
        best = u;
    }
    return best;
}

/* Step 2: the best compute unit in the window (lo itself at worst). */
static int pick_compute(const Lhs *L, const int *order, int lo) {
    int best = -1, best_stall = 1, hi = lo + (L->lim->window > 0 ? L->lim->window : 1);
    double best_t = DBL_MAX, tf = L->tfree[IR_STREAM_COMPUTE];
    if (hi > L->next_post) hi = L->next_post; /* no compute moves above a posted receive */
    for (int u = lo; u < L->n && u < hi; u++) {
        if (L->done[u] || L->indeg[u] || L->stream[u] != IR_STREAM_COMPUTE || L->pin[u]) continue;
        double r = inputs_ready(L, order, u);
        int stall = r > tf * (1 + 1e-12) + 1e-15;
        if (best >= 0 && stall > best_stall) continue;
        if (best >= 0 && stall == best_stall) {
            if (stall && r >= best_t) continue;
            if (!stall && (!L->lim->prefer_transfer || L->next_xfer[u] >= L->next_xfer[best])) continue;
        }
        best = u, best_stall = stall, best_t = r;
    }
    return best;
}

void lhs_order(const Graph *g, const double *dur, int overlap, const LhsLimits *lim, int *order, double *exposed) {
    int nn = 0, na = 0, *tail = xcalloc((size_t)g->nnodes + 1, sizeof(int));
    for (int j = 0; j < g->nnodes; j++) /* every assign last, in the fixed order (hoisting may have left one mid-way) */
        if (g->nodes[order[j]].op == OP_assign) tail[na++] = order[j];
        else order[nn++] = order[j];
    memcpy(order + nn, tail, sizeof(int) * (size_t)na);
    free(tail);
    Lhs L = {.g = g, .lim = lim};
    build_units(&L, order, nn, dur, overlap);
    build_edges(&L, order);
    int *out = xcalloc((size_t)g->nnodes + 1, sizeof(int)), k = 0;
    L.rx = xcalloc((size_t)L.n + 1, sizeof(int));
    while (L.next_post < L.n && !L.post[L.next_post]) L.next_post++;
    for (int u = 0; u < L.n; u++)
        if (!L.indeg[u] && L.stream[u] != IR_STREAM_COMPUTE) L.rx[L.nrx++] = u;
    for (int lo = 0;;) {
        while (lo < L.n && L.done[lo]) lo++;
        if (lo == L.n) break;
        int u = L.pin[lo] ? lo : pick_transfer(&L, lo); /* a pinned node goes as soon as it may */
        if (u < 0) u = pick_compute(&L, order, lo);
        if (u < 0) u = lo; /* lo is always ready */
        if (L.indeg[u]) ICE("lhs: unit %d placed before its inputs", u);
        place(&L, order, u, out, &k);
    }
    for (int j = nn; j < nn + na; j++) out[k++] = order[j];
    if (k != g->nnodes) ICE("lhs: placed %d of %d nodes", k, g->nnodes);
    memcpy(order, out, sizeof(int) * (size_t)g->nnodes);
    if (exposed) *exposed = L.exposed;
    free(out), free(L.first), free(L.len), free(L.unit_of), free(L.stream), free(L.dur), free(L.end);
    free(L.succ_off), free(L.succ), free(L.indeg), free(L.next_xfer), free(L.pin), free(L.holds), free(L.open), free(L.done), free(L.post), free(L.rx);
}
