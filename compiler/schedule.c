/* schedule.c — the linear program: every node gets a stream and a position.
 *
 * The emitted step function issues its calls in node order, each on its
 * node's stream (0 compute, 1 comm, 2 d2h, 3 h2d, 4 tp's collectives under
 * --schedule lhs: lhs.h, sched_stream_for).  Streams are in-order
 * queues that run concurrently, so a value produced on one stream and used on
 * another needs an event: `record {event=E}` on the producer's stream after
 * the producer, `wait {event=E}` on the consumer's stream before the use.
 * The verifier checks that rule (verify.c, check_events) for any number of
 * streams.
 *
 * This schedule is the simplest correct one: everything on the
 * compute stream in the order fuse left, pos = index, and every `assign`
 * moved to the very end.  An assign writes the buffer of a param or state
 * (emit turns it into a memcpy), and the IR's semantics is that writes commit
 * after the whole step, so no read of the old value may come after it.  Later
 * passes (comm overlap, offload) will put collectives and copies on their own
 * streams with events and keep this file's shape: choose an order, then
 * ir_reorder, then number.
 *
 * Offload's copies (offload.c, docs/offload.md) run on the copy streams:
 * `offload` on d2h, `reload` on h2d, where the offload pass put them, with
 * the data edges' events as for any node, and three fences that let memplan
 * reuse the bytes: {lag} nodes after an offload every other stream waits
 * for it (the device buffer is free from there), before a reload compute
 * and comm record and h2d waits for them (its buffer is written only after
 * the earlier readers of those bytes; not for d2h, so the two copy
 * directions overlap), and before a comm-stream node that writes a buffer
 * the comm stream waits for the reloads issued so far (else ir_live_build
 * counts that buffer live from the step's start).
 */
#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cost.h"
#include "lhs.h"
#include "live.h"
#include "memplan.h"
#include "passes.h"
#include "profile.h"

/* Nodes to issue as early as their inputs allow: collectives and the
 * optimizer's nodes that only feed collectives (a bucket's flatten and
 * concat), so a bucket's reduce-scatter starts as soon as backward has
 * produced its last gradient while the compute stream goes on.  A node that
 * reads a collective's result directly is never hoisted (on the compute
 * stream it would wait for the collective at once), nor is a collective over
 * pp (over_pipeline), and fused groups stay where fuse put them. */
/* A collective over the pipeline axis joins ranks that run different
 * programs, where it is a meeting point the pipeline pass placed after the
 * sends that others wait for: it stays there. */
static int over_pipeline(const Node *n) {
    int mask = ir_group_mask(ir_attr_s(n, "group", ""));
    return mask > 0 && (mask & 1);
}

static char *hoistable(const Graph *g) {
    int n = g->nnodes;
    char *h = calloc((size_t)(n ? n : 1), 1);
    int *users_ok = calloc((size_t)(g->nvals ? g->nvals : 1), sizeof(int));
    if (!h || !users_ok) ICE("out of memory");
    for (int v = 0; v < g->nvals; v++) users_ok[v] = 1;
    for (int i = n - 1; i >= 0; i--) {
        const Node *nd = &g->nodes[i];
        unsigned f = ir_ops[nd->op].flags;
        int ok = nd->nout > 0 && ir_fused_group(nd) < 0 && !(f & (F_SINK | F_SYNC | F_SOURCE)); /* a recv waits where it is */
        for (int k = 0; k < nd->nin && ok && !(f & F_COMM); k++) {
            int d = g->vals[nd->in[k]].def;
            ok = d < 0 || !(ir_ops[g->nodes[d].op].flags & F_COMM);
        }
        int users = 1;
        for (int k = 0; k < nd->nout; k++) users &= users_ok[nd->out[k]];
        h[i] = ok && (((f & F_COMM) && !over_pipeline(nd)) || (nd->phase == PH_OPT && users));
        for (int k = 0; k < nd->nin; k++) users_ok[nd->in[k]] &= h[i];
    }
    free(users_ok);
    return h;
}

/* A min-heap of pending ranks (hoist). */
typedef struct {
    int *a, n;
} RankHeap;

static void rh_push(RankHeap *h, int x) {
    int i = h->n++;
    while (i > 0 && h->a[(i - 1) / 2] > x) h->a[i] = h->a[(i - 1) / 2], i = (i - 1) / 2;
    h->a[i] = x;
}

static int rh_pop(RankHeap *h) {
    int top = h->a[0], x = h->a[--h->n], i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && h->a[c + 1] < h->a[c]) c++;
        if (h->a[c] >= x) break;
        h->a[i] = h->a[c], i = c;
    }
    if (h->n) h->a[i] = x;
    return top;
}

/* order[] with every hoistable node moved up to just after its last input.
 * Before each node of the order, the pending hoistable nodes are swept in
 * their order again and again, each issued once all its inputs are done,
 * until a sweep issues none.  The sweeps are replayed without reading every
 * pending node each time: a pending node counts its inputs not yet done
 * and is ready at 0; the ready ones after the sweep's last issue are issued
 * in this sweep (cur), the ones before it in the next (next). */
static void hoist(const Graph *g, int *order) {
    int n = g->nnodes, k = 0, npend = 0;
    char *h = hoistable(g), *done = calloc((size_t)(g->nvals ? g->nvals : 1), 1);
    int *out = malloc(sizeof(int) * (size_t)(n ? n : 1)), *pend = malloc(sizeof(int) * (size_t)(n ? n : 1));
    if (!done || !out || !pend) ICE("out of memory");
    for (int j = 0; j < n; j++)
        if (h[order[j]]) pend[npend++] = order[j];
    /* per pending rank: inputs not yet done; per value: the pending ranks reading it (once per input) */
    int *miss = calloc((size_t)(npend ? npend : 1), sizeof(int)), *uoff = calloc((size_t)g->nvals + 1, sizeof(int));
    if (!miss || !uoff) ICE("out of memory");
    for (int q = 0; q < npend; q++) {
        const Node *nd = &g->nodes[pend[q]];
        for (int i = 0; i < nd->nin; i++)
            if (g->vals[nd->in[i]].def >= 0) miss[q]++, uoff[nd->in[i] + 1]++;
    }
    for (int v = 0; v < g->nvals; v++) uoff[v + 1] += uoff[v];
    int *users = malloc(sizeof(int) * (size_t)(uoff[g->nvals] ? uoff[g->nvals] : 1)), *fill = calloc((size_t)g->nvals + 1, sizeof(int));
    RankHeap cur = {malloc(sizeof(int) * (size_t)(npend ? npend : 1)), 0}, next = {malloc(sizeof(int) * (size_t)(npend ? npend : 1)), 0};
    if (!users || !fill || !cur.a || !next.a) ICE("out of memory");
    for (int q = 0; q < npend; q++) {
        const Node *nd = &g->nodes[pend[q]];
        for (int i = 0; i < nd->nin; i++)
            if (g->vals[nd->in[i]].def >= 0) users[uoff[nd->in[i]] + fill[nd->in[i]]++] = q;
        if (!miss[q]) rh_push(&cur, q);
    }
    int last = -1; /* the rank the current sweep issued last */
#define HOIST_DONE(nd)                                                                           \
    for (int o = 0; o < (nd)->nout; o++) {                                                       \
        int v_ = (nd)->out[o];                                                                   \
        if (done[v_]) continue;                                                                  \
        done[v_] = 1;                                                                            \
        for (int u = uoff[v_]; u < uoff[v_ + 1]; u++)                                            \
            if (--miss[users[u]] == 0) rh_push(users[u] > last ? &cur : &next, users[u]);        \
    }
    for (int j = 0; j <= n; j++) {
        last = -1; /* a new sweep from the first pending node */
        while (next.n) rh_push(&cur, rh_pop(&next));
        for (;;) {
            if (!cur.n) { /* the sweep is over: another one if it made some ready before its last issue */
                if (!next.n) break;
                last = -1;
                while (next.n) rh_push(&cur, rh_pop(&next));
            }
            int q = rh_pop(&cur);
            const Node *nd = &g->nodes[pend[q]];
            out[k++] = pend[q];
            last = q;
            HOIST_DONE(nd);
        }
        if (j == n) break;
        if (h[order[j]]) continue;
        const Node *nd = &g->nodes[order[j]];
        out[k++] = order[j];
        last = npend; /* what this makes ready waits for the next sweep */
        HOIST_DONE(nd);
    }
#undef HOIST_DONE
    if (k != n) ICE("schedule: hoisting lost nodes (%d of %d)", k, n);
    memcpy(order, out, sizeof(int) * (size_t)n);
    free(h), free(done), free(out), free(pend), free(miss), free(uoff), free(users), free(fill), free(cur.a), free(next.a);
}

static int sync_node(Graph *g, Op op, int stream, int64_t event, const Node *at) {
    Attr a = ir_attr_int(g->m, "event", event);
    Builder b = {.g = g, .pass = "schedule", .loc = at->loc, .layer = at->layer, .phase = at->phase};
    int i = ir_build(&b, op, 0, NULL, 1, &a, NULL);
    g->nodes[i].stream = stream;
    return i;
}


/* The events of add_events: out[] (the final order), the next event and
 * per event the streams that waited for it. */
typedef struct {
    Graph *g;
    int *out, m, nev;
    unsigned *waited, used; /* used: the streams that have nodes, a bit each */
    int nofence;            /* no comm_fence (--schedule lhs) */
} Ev;

static int new_event(Ev *E) {
    if (!(E->waited = realloc(E->waited, sizeof(unsigned) * (size_t)(E->nev + 1)))) ICE("out of memory");
    E->waited[E->nev] = 0;
    return E->nev++;
}

/* Before a reload (node i): the compute and comm streams record where they
 * are and the h2d stream waits for them, so the reload's device buffer is
 * written only after everything they issued before it (memplan reuses the
 * bytes of buffers whose last readers came earlier on any stream).  Not the
 * d2h stream: the reload reads its own offload's host bytes (a data edge,
 * with its own event), and a device buffer an offload reads is free only
 * after h2d waited for that offload (live.c, read_end), so the reload does
 * not queue behind later offloads (both copy directions overlap). */
static void reload_fence(Ev *E, int i) {
    for (int t = 0; t < IR_NSTREAMS; t++) {
        if (t == IR_STREAM_H2D || t == IR_STREAM_D2H || !(E->used >> t & 1)) continue;
        int e = new_event(E);
        E->out[E->m++] = sync_node(E->g, OP_record, t, e, &E->g->nodes[i]);
        E->out[E->m++] = sync_node(E->g, OP_wait, IR_STREAM_H2D, e, &E->g->nodes[i]);
        E->waited[e] |= 1u << IR_STREAM_H2D;
    }
}

/* Before a comm-stream node that writes a buffer (a recv, a collective):
 * the comm stream waits for the h2d stream's work issued so far (dirty: h2d
 * has had nodes since the last such fence).  This kept that buffer from
 * being counted live from before the reloads while ir_live_build pulled the
 * start of a buffer written off the compute stream back to the last h2d
 * position its stream had waited for; it no longer does (live.c,
 * pull_back_starts), and the fence costs time: each tensor-parallel
 * all-reduce and pipeline receive queues behind the reloads just prefetched
 * for later layers (at 15 GB/s, milliseconds each; in the GPT-3 175B slice
 * with offload all tp's exposed time was 4.8% of the step against 1.8%
 * without offload).  So --schedule lhs drops it (E->nofence); --schedule
 * fixed keeps it, its events as they were.  Not for d2h: its offloads write
 * host bytes only, and the device bytes an offload reads are free only
 * after the comm stream waited for it at its release (release_fence), so a
 * recv never queues behind an offload still in flight.  (Only the fixed
 * order has the fence, and only it has one comm stream: tp's and pp's
 * streams, lhs's, never get one.) */
static void comm_fence(Ev *E, int i, unsigned *dirty) {
    if (E->nofence) return;
    if (*dirty >> IR_STREAM_H2D & 1) {
        int e = new_event(E);
        E->out[E->m++] = sync_node(E->g, OP_record, IR_STREAM_H2D, e, &E->g->nodes[i]);
        E->out[E->m++] = sync_node(E->g, OP_wait, IR_STREAM_COMM, e, &E->g->nodes[i]);
        E->waited[e] |= 1u << IR_STREAM_COMM;
    }
    *dirty = 0;
}

/* At each of pp's transfers (on its own stream, node i): stream s waits for
 * the compute stream to reach this point, for s the comm stream, and pp's
 * own before a receive (a node that writes a buffer).  memplan frees a
 * buffer one stream wrote and another read only once the writer's stream
 * knows the read done (live.c).  Under one comm stream every send waited
 * for the compute stream that made its input, so the comm stream learned,
 * send after send, that compute had read the parameters it gathered; with
 * the sends on pp's stream it would learn it only at its next bucket (the
 * cooldown), and every gathered parameter would stay live until then.
 * These waits put the comm stream's knowledge back where the one stream
 * had it, which costs it nothing it did not pay then.  They do not put any
 * pipeline transfer back behind a bucket: the comm stream waits for compute,
 * and pp's stream never waits for the comm stream.  GPT-3 175B, the whole
 * plan: rank 0's plan with pp's stream 87.8 GB without them (over the a100's
 * 80), 76.6 with them; the 16-layer slice 14.7 GiB with a fence before
 * each comm-stream writer instead, 13.5 with these, 12.2 under one stream. */
static void progress_fence(Ev *E, int i, int s) {
    int e = new_event(E);
    E->out[E->m++] = sync_node(E->g, OP_record, IR_STREAM_COMPUTE, e, &E->g->nodes[i]);
    E->out[E->m++] = sync_node(E->g, OP_wait, s, e, &E->g->nodes[i]);
    E->waited[e] |= 1u << s;
}

/* {lag} nodes after an offload (node i, its event e): every other stream
 * waits for the copy, and from there the offloaded value's device buffer is
 * free (ir_live_build: a read off the compute stream ends when every other
 * stream has waited for it).  Never after the offload's own reload (the lag
 * counts the offload pass's nodes, and later passes and lhs move nodes: a
 * reload issued before its release held both copies, issue 19), and
 * several offloads may be released at one place (each pushed to the next
 * free node before, their fences strayed into the backward). */
static void release_fence(Ev *E, int i, int e) {
    for (int t = 0; t < IR_NSTREAMS; t++) {
        if (t == IR_STREAM_D2H || !(E->used >> t & 1) || (E->waited[e] >> t & 1)) continue;
        E->waited[e] |= 1u << t;
        E->out[E->m++] = sync_node(E->g, OP_wait, t, e, &E->g->nodes[i]);
    }
}

/* Streams, and the events between them: a node whose input comes from
 * another stream waits (once per stream) for an event its producer's
 * stream records right after the producer.  Offload's copies add three fences
 * (reload_fence, release_fence, comm_fence). */
static void add_events(Graph *g, int *order, int n, int overlap, int drop_first_wait, int nofence, int **final, int *nfinal) {
    int *stream = malloc(sizeof(int) * (size_t)(n ? n : 1)), *event = malloc(sizeof(int) * (size_t)(n ? n : 1));
    int *due = malloc(sizeof(int) * (size_t)(n ? n : 1)); /* per order index: the first offload released there, or -1 */
    int *dnext = malloc(sizeof(int) * (size_t)(n ? n : 1)), *rpos = malloc(sizeof(int) * (size_t)(n ? n : 1)); /* per node: the next released with it; an offload's reload's order index */
    char *cross = calloc((size_t)(n ? n : 1), 1);
    if (!stream || !event || !cross || !due || !dnext || !rpos) ICE("out of memory");
    Ev E = {.g = g, .out = malloc(sizeof(int) * (size_t)(16 * n + 16)), .nofence = nofence};
    if (!E.out) ICE("out of memory");
    for (int i = 0; i < n; i++) {
        stream[i] = sched_stream_for(g->m, &g->nodes[i], overlap); /* lhs.h */
        event[i] = due[i] = dnext[i] = -1, rpos[i] = n;
        cross[i] = g->nodes[i].op == OP_offload; /* its release fence waits for it */
        E.used |= 1u << stream[i];
    }
    for (int i = 0; i < n; i++)
        for (int k = 0; k < g->nodes[i].nin; k++) {
            int p = g->vals[g->nodes[i].in[k]].def;
            if (p >= 0 && stream[p] != stream[i]) cross[p] = 1;
        }
    for (int j = 0; j < n; j++) /* each offload's reload (the first in the order) */
        if (g->nodes[order[j]].op == OP_reload) {
            int p = g->vals[g->nodes[order[j]].in[0]].def;
            if (p >= 0 && rpos[p] == n) rpos[p] = j;
        }
    unsigned dirty = 0; /* comm_fence */
    int dropped = !drop_first_wait, npend = 0, *pend = malloc(sizeof(int) * (size_t)(n ? n : 1));
    if (!pend) ICE("out of memory");
    for (int j = 0, end = 0; j < n; j++) {
        int i = order[j];
        g->nodes[i].stream = stream[i];
        for (int d = due[j]; d >= 0; d = dnext[d]) release_fence(&E, d, event[d]);
        if (g->nodes[i].op == OP_reload) reload_fence(&E, i);
        if (stream[i] == IR_STREAM_COMM && g->nodes[i].nout) comm_fence(&E, i, &dirty);
        if (stream[i] == IR_STREAM_PP) { /* progress_fence */
            if (E.used >> IR_STREAM_COMM & 1) progress_fence(&E, i, IR_STREAM_COMM);
            if (g->nodes[i].nout) progress_fence(&E, i, IR_STREAM_PP);
        }
        if (stream[i] == IR_STREAM_H2D) dirty |= 1u << stream[i];
        if (j >= end) { /* a fused group is one kernel: its members' waits go before its first member */
            int grp = ir_fused_group(&g->nodes[i]);
            for (end = j + 1; grp >= 0 && end < n && ir_fused_group(&g->nodes[order[end]]) == grp;) end++;
            for (int e = j; e < end; e++) {
                const Node *q = &g->nodes[order[e]];
                for (int k = 0; k < q->nin; k++) {
                    int p = g->vals[q->in[k]].def, sq = stream[order[e]];
                    if (p < 0 || stream[p] == sq || (E.waited[event[p]] >> sq & 1)) continue;
                    E.waited[event[p]] |= 1u << sq;
                    if (!dropped) { dropped = 1; continue; } /* --test-drop-event: forget this wait */
                    E.out[E.m++] = sync_node(g, OP_wait, sq, event[p], q);
                }
            }
        }
        E.out[E.m++] = i;
        if (cross[i]) pend[npend++] = i;
        for (int q = 0; j + 1 >= end && q < npend; q++) { /* records after the whole fused group */
            event[pend[q]] = new_event(&E);
            E.out[E.m++] = sync_node(g, OP_record, stream[pend[q]], event[pend[q]], &g->nodes[pend[q]]);
        }
        if (j + 1 >= end) npend = 0;
        if (g->nodes[i].op == OP_offload) { /* released {lag} nodes later (at the end at the latest), never after its reload */
            int64_t lag = ir_attr_i(&g->nodes[i], "lag", 1), at = lag < n - j ? j + (lag > 1 ? lag : 1) : n - 1;
            if (at > rpos[i]) at = rpos[i]; /* the value is never on the device twice (docs/offload.md) */
            while (at < n && ir_fused_group(&g->nodes[order[at]]) >= 0 && ir_fused_group(&g->nodes[order[at]]) == ir_fused_group(&g->nodes[order[at - 1]]))
                at++; /* not inside a fused group */
            if (at > j && at < n) dnext[i] = due[at], due[at] = i; /* several may share a place */
            else release_fence(&E, i, event[i]); /* no node left: right away */
        }
    }
    free(stream), free(event), free(cross), free(due), free(dnext), free(rpos), free(pend), free(E.waited);
    *final = E.out, *nfinal = E.m;
}

/* The fixed order: fuse's, every assign moved last, then hoisted. */
static int *fixed_order(Graph *g) {
    int n = g->nnodes, k = 0;
    int *order = malloc(sizeof(int) * (size_t)(n ? n : 1));
    if (!order) ICE("out of memory");
    for (int i = 0; i < n; i++)
        if (g->nodes[i].op != OP_assign) order[k++] = i;
    for (int i = 0; i < n; i++)
        if (g->nodes[i].op == OP_assign) order[k++] = i;
    hoist(g, order);
    return order;
}

/* sched_stream_for's overlap: 0 without comm streams (one rank,
 * --no-overlap), else 1 for the fixed order (one comm stream), 2 for lhs's
 * (tp's and pp's own comm streams; KILN_LHS_ONE_COMM=1 in the environment keeps one,
 * to measure what the second buys: docs/schedule.md). */
static int overlap_of(const Graph *g, const Options *o, int lhs) {
    if (ir_world(g->m) == 1 || o->no_overlap) return 0;
    return lhs && !getenv("KILN_LHS_ONE_COMM") ? 2 : 1;
}

/* Streams (sched_stream_for's overlap) and events for order (consumed),
 * then the final order and numbering; nofence: without comm_fence (lhs). */
static void finish_fenced(Graph *g, int *order, const Options *o, int nofence, int overlap) {
    int *final, m;
    add_events(g, order, g->nnodes, overlap, o->drop_event, nofence, &final, &m);
    free(order);
    ir_reorder(g, final);
    free(final);
    for (int i = 0; i < g->nnodes; i++) g->nodes[i].pos = i;
}

static void finish(Graph *g, int *order, const Options *o) { finish_fenced(g, order, o, 0, overlap_of(g, o, 0)); }

/* ---- --schedule lhs: lhs.c's order under the memory rule ----
 *
 * The plan's peak under lhs (memplan's bytes of params, grads, optimizer
 * state and activations of this rank's program) must not exceed the fixed
 * order's, or --memory-budget's bytes when given.  Starting a transfer
 * early keeps its buffer alive longer and moving compute changes which
 * buffers overlap, so the rule is checked, not predicted: each attempt is
 * scheduled and its plan's peak measured (memplan_stage_total, memplan.h:
 * pass_memplan's placement on a copy of the values, g unchanged), from the
 * loosest limits to the tightest; the first that fits is kept, and when
 * none does the stage keeps the fixed order (so --schedule lhs is never
 * worse in memory, by construction).  memplan itself runs after this
 * pass, as for fixed.
 *
 * The attempts (lhs.h, LhsLimits: window, look-ahead per stream, in-flight
 * transfers per stream, transfer-first priority): 1. compute may move 64
 * positions, preferring what leads soonest to a transfer; collectives are
 * issued as early as the fixed order's hoisting issues them (no limit: the
 * fixed order already has them all in flight), reloads (when they move:
 * schedule_lhs tries both) at most 64 positions early and 2 in flight;
 * 2. the same in the fixed order's priority (putting the input gradient
 * before the weight gradient keeps the weight gradient's inputs alive
 * longer: in pipeline programs that alone can break the rule);
 * 3. 32 positions, 2 comm transfers in flight, 1 reload; 4. 8 positions, one
 * transfer in flight per stream; 5. the same within 2 positions (memplan's
 * first-fit packing can grow from any move, so the last attempt moves
 * almost nothing). */
static const LhsLimits lhs_attempts[] = { /* per stream: compute, comm, d2h, h2d, tp and pp (as comm) */
    {64, {0, 0, 0, 64, 0, 0}, {0, 0, 0, 2, 0, 0}, 1, 0},
    {64, {0, 0, 0, 64, 0, 0}, {0, 0, 0, 2, 0, 0}, 0, 0},
    {32, {0, 0, 0, 32, 0, 0}, {0, 2, 0, 1, 2, 2}, 0, 0},
    {8, {0, 8, 0, 8, 8, 8}, {0, 1, 0, 1, 1, 1}, 0, 0},
    {2, {0, 2, 0, 2, 2, 2}, {0, 1, 0, 1, 1, 1}, 0, 0},
};

typedef struct {
    Node *nodes;
    Value *vals;
    int nnodes, nvals;
} Snap;

static Snap snap_take(const Graph *g) {
    Snap s = {xcalloc((size_t)g->nnodes + 1, sizeof(Node)), xcalloc((size_t)g->nvals + 1, sizeof(Value)), g->nnodes, g->nvals};
    memcpy(s.nodes, g->nodes, sizeof(Node) * (size_t)g->nnodes);
    memcpy(s.vals, g->vals, sizeof(Value) * (size_t)g->nvals);
    return s;
}

/* g as it was (room made when the snapshot is longer: ir_reorder leaves
 * g->nodes exactly as long as the order it was given). */
static void snap_restore(Graph *g, const Snap *s) {
    if (s->nnodes > g->capnodes) g->nodes = ir_alloc(g->m, sizeof(Node) * (size_t)s->nnodes), g->capnodes = s->nnodes;
    if (s->nvals > g->capvals) g->vals = ir_alloc(g->m, sizeof(Value) * (size_t)s->nvals), g->capvals = s->nvals;
    memcpy(g->nodes, s->nodes, sizeof(Node) * (size_t)s->nnodes);
    memcpy(g->vals, s->vals, sizeof(Value) * (size_t)s->nvals);
    g->nnodes = s->nnodes, g->nvals = s->nvals;
}

static void snap_free(Snap *s) { free(s->nodes), free(s->vals); }

/* --device-profile's device (default cpu): the node times lhs orders by. */
static void load_profile(Profile *p, const Options *o) {
    char err[512];
    if (profile_load(p, o->device_profile ? o->device_profile : "cpu", err, sizeof err) != 0) {
        fprintf(stderr, "kiln: --schedule lhs: %s\n", err);
        exit(1);
    }
}

static double *node_seconds(const Graph *g, const Profile *p) {
    double *dur = xcalloc((size_t)g->nnodes + 1, sizeof(double));
    for (int i = 0; i < g->nnodes; i++) dur[i] = cost_node_seconds(p, g, &g->nodes[i]);
    return dur;
}

static int *copy_order(const int *order, int n) {
    int *c = xcalloc((size_t)n + 1, sizeof(int));
    memcpy(c, order, sizeof(int) * (size_t)n);
    return c;
}

/* order (consumed) without the comm fence, kept when its plan fits limit
 * (s: g before; 1 when kept, else g as before). */
static int try_order(Graph *g, const Options *o, const Snap *s, int *order, int64_t limit, int overlap) {
    snap_restore(g, s);
    finish_fenced(g, order, o, 1, overlap);
    int64_t got = memplan_stage_total(g);
    if (getenv("KILN_LHS_TRACE")) fprintf(stderr, "lhs: plan %lld of %lld bytes\n", (long long)got, (long long)limit);
    if (got <= limit) return 1;
    snap_restore(g, s);
    return 0;
}

/* Whether g has a transfer that stream s would carry under overlap. */
static int uses_stream(const Graph *g, int overlap, int s) {
    for (int i = 0; i < g->nnodes; i++)
        if (sched_stream_for(g->m, &g->nodes[i], overlap) == s) return 1;
    return 0;
}

/* ---- lhs's base order: the cooldown's weight gradients by the bucket they complete ----
 *
 * In a zero-bubble pipeline (zb-h1, zb-v) the weight-gradient (W) work of
 * the last micro-batches is deferred into the cooldown, and the fixed order
 * runs it oldest first.  A bucket's reduce-scatter can start only when the
 * last micro-batch's W of each of its params is done, so every bucket of
 * the rank completed in the last few hundred ms of the step, and their
 * reduce-scatters (the GPT-3 175B plan: 0.86 s of f32 gradients per rank)
 * queued after the compute stream had finished (dp at the step's end,
 * docs/schedule.md).  cooldown_order keeps every other node where it is and
 * every W slot of the cooldown (after the rank's last forward GEMM) as a
 * slot, but fills each with the ready W unit (a node, or a fused run whole)
 * whose bucket's reduce-scatter comes first in the fixed order: so the
 * chunk whose backward finishes first (in zb-v the second chunk, whose B of
 * the last micro-batch runs while the other still waits for its gradient)
 * completes its buckets while the other's W is still to run, and its
 * reduce-scatters overlap that W.  A node that reads a W output that moved
 * later (the gradient accumulation, a bucket's concat and reduce-scatter,
 * the optimizer) is placed as soon as its inputs are.  Only the order
 * changes: each gradient is still accumulated over the micro-batches in the
 * same order (its adds form a chain), so the numbers are the same.  NULL
 * when there is nothing to move (no W work after the last forward, no dp
 * bucket). */
typedef struct {
    const Graph *g;
    const int *order;
    int n, nu, *first, *len, *key, *unit_of;
    char *placed, *wunit;
} Cool;

static int cool_ready(const Cool *C, int u) {
    for (int j = C->first[u]; j < C->first[u] + C->len[u]; j++) {
        const Node *nd = &C->g->nodes[C->order[j]];
        for (int q = 0; q < nd->nin; q++) {
            int d = C->g->vals[nd->in[q]].def;
            if (d >= 0 && C->unit_of[d] != u && !C->placed[d]) return 0;
        }
    }
    return 1;
}

static int cool_emit(Cool *C, int u, int *out, int k) {
    for (int j = C->first[u]; j < C->first[u] + C->len[u]; j++) out[k++] = C->order[j], C->placed[C->order[j]] = 1;
    return k;
}

/* A gradient bucket's reduction (optimizer.c: a flat's reduce-scatter under
 * --zero 1, all-reduce under --zero 0, over dp and/or cp), not the norm's
 * all-reduce over pp. */
static int is_bucket(const Node *n) {
    return (n->op == OP_reducescatter || n->op == OP_allreduce) && n->phase == PH_OPT && !over_pipeline(n);
}

/* Per node: the smallest fixed position of a gradient bucket's reduction it
 * leads to (INT_MAX: none). */
static int *bucket_keys(const Graph *g, const int *order, int n) {
    int *key = xcalloc((size_t)g->nnodes + 1, sizeof(int));
    for (int i = 0; i < g->nnodes; i++) key[i] = 0x7fffffff;
    for (int p = n - 1; p >= 0; p--) {
        const Node *nd = &g->nodes[order[p]];
        if (is_bucket(nd) && p < key[order[p]]) key[order[p]] = p;
        for (int q = 0; q < nd->nin; q++) {
            int d = g->vals[nd->in[q]].def;
            if (d >= 0 && key[order[p]] < key[d]) key[d] = key[order[p]];
        }
    }
    return key;
}

static int *cooldown_order(const Graph *g, const int *order) {
    int n = g->nnodes, start = -1, nw = 0;
    for (int p = 0; p < n; p++)
        if (g->nodes[order[p]].phase == PH_FWD && (ir_ops[g->nodes[order[p]].op].flags & F_GEMM)) start = p + 1; /* the last forward GEMM */
    if (start < 0) return NULL;
    Cool C = {g, order, n, 0, xcalloc((size_t)n + 1, sizeof(int)), xcalloc((size_t)n + 1, sizeof(int)), bucket_keys(g, order, n),
              xcalloc((size_t)g->nnodes + 1, sizeof(int)), xcalloc((size_t)g->nnodes + 1, 1), xcalloc((size_t)n + 1, 1)};
    for (int j = 0; j < n;) { /* units: fused runs whole */
        int64_t grp = ir_fused_group(&g->nodes[order[j]]);
        int u = C.nu++, w = 1;
        C.first[u] = j;
        do {
            const Node *nd = &g->nodes[order[j]];
            w &= nd->phase == PH_WGRAD && !(ir_ops[nd->op].flags & F_COMM) && nd->op != OP_assign;
            C.unit_of[order[j]] = u, C.len[u]++, j++;
        } while (grp >= 0 && j < n && ir_fused_group(&g->nodes[order[j]]) == grp);
        C.wunit[u] = (char)(w && j > start && C.key[order[C.first[u]]] != 0x7fffffff);
        nw += C.wunit[u];
    }
    int *out = NULL, k = 0, *pend = xcalloc((size_t)C.nu + 1, sizeof(int)), np = 0, *blk = xcalloc((size_t)C.nu + 1, sizeof(int)), nb = 0;
    if (getenv("KILN_LHS_TRACE")) fprintf(stderr, "lhs: cooldown from %d of %d, %d W units\n", start, n, nw);
    if (!nw) goto done;
    out = xcalloc((size_t)n + 1, sizeof(int));
    char *h = hoistable(g);
    for (int u = 0; u < C.nu; u++) {
        if (C.wunit[u]) pend[np++] = u; /* in the fixed order */
        int eager = C.first[u] >= start;
        for (int j = C.first[u]; j < C.first[u] + C.len[u]; j++) eager &= h[order[j]] && g->nodes[order[j]].phase == PH_OPT;
        if (eager) blk[nb++] = u, C.wunit[u] = 2; /* a bucket's concat and reduction: as soon as its inputs are placed */
    }
    free(h);
    for (int u = 0; u < C.nu; u++) {
        if (C.first[u] < start) {
            k = cool_emit(&C, u, out, k);
            continue;
        }
        if (g->nodes[order[C.first[u]]].op == OP_assign) break; /* the assigns stay last (below) */
        if (C.wunit[u] == 1) { /* a W slot: of the cooldown's W units not yet placed, the ready one whose bucket comes first */
            int best = -1;
            for (int q = 0; q < np; q++) {
                int v = pend[q];
                if (C.placed[order[C.first[v]]] || !cool_ready(&C, v)) continue;
                if (best < 0 || C.key[order[C.first[v]]] < C.key[order[C.first[pend[best]]]]) best = q; /* ties: the fixed order */
            }
            if (best >= 0) k = cool_emit(&C, pend[best], out, k);
        } else if (!C.wunit[u] && !C.placed[order[C.first[u]]]) blk[nb++] = u;
        for (int again = 1; again;) { /* what the placed units made ready, in the fixed order */
            again = 0;
            for (int q = 0; q < nb; q++)
                if (cool_ready(&C, blk[q])) {
                    k = cool_emit(&C, blk[q], out, k);
                    memmove(blk + q, blk + q + 1, sizeof(int) * (size_t)(nb - q - 1)), nb--, again = 1;
                    break;
                }
        }
    }
    for (;;) { /* the rest: W by bucket, the others in the fixed order, as they become ready */
        int moved = 0, left = nb, best = -1;
        for (int q = 0; q < nb && !moved; q++)
            if (cool_ready(&C, blk[q])) k = cool_emit(&C, blk[q], out, k), memmove(blk + q, blk + q + 1, sizeof(int) * (size_t)(nb - q - 1)), nb--, moved = 1;
        for (int q = 0; q < np && !moved; q++) {
            if (C.placed[order[C.first[pend[q]]]]) continue;
            left++;
            if (cool_ready(&C, pend[q]) && (best < 0 || C.key[order[C.first[pend[q]]]] < C.key[order[C.first[pend[best]]]])) best = q;
        }
        if (!moved && best >= 0) k = cool_emit(&C, pend[best], out, k), moved = 1;
        if (!moved && left) ICE("schedule: the cooldown's order is stuck (%d units left)", left);
        if (!moved) break;
    }
    for (int u = 0; u < C.nu; u++)
        if (!C.placed[order[C.first[u]]]) k = cool_emit(&C, u, out, k); /* the assigns, in the fixed order */
    if (k != n) ICE("schedule: the cooldown's order lost nodes (%d of %d)", k, n);
    if (!memcmp(out, order, sizeof(int) * (size_t)n)) free(out), out = NULL;
done:
    free(C.first), free(C.len), free(C.key), free(C.unit_of), free(C.placed), free(C.wunit), free(pend), free(blk);
    return out;
}

/* The comm streams lhs tries for g, most first (sched_stream_for's
 * overlap): tp's and pp's own streams, tp's alone, one comm stream; only
 * those that differ. */
static int stream_sets(const Graph *g, const Options *o, int *ov) {
    int n = 0, lhs = overlap_of(g, o, 1), tp = lhs == 2 && uses_stream(g, 2, IR_STREAM_TP), pp = lhs == 2 && uses_stream(g, 2, IR_STREAM_PP);
    if (pp) ov[n++] = 2;
    if (tp) ov[n++] = pp ? 3 : 2;
    ov[n++] = lhs ? 1 : 0;
    return n;
}

/* lhs's order for one rank: the attempts with tp's and pp's own comm
 * streams, then tp's alone, then one comm stream (stream_sets); the first
 * whose plan fits is kept, else the fixed order (without the comm fence
 * when that fits).  More comm streams can cost memory: a buffer the compute
 * stream reads from the dp stream's work lives until the dp stream has
 * waited for that read, and with tp's collectives gone from it the dp
 * stream waits less often (progress_fence gives pp's part of it back; in
 * the whole GPT-3 175B plan under its 80 GB every rank keeps both). */
static void lhs_schedule_graph(Graph *g, const Options *o, const Profile *p, int *fixed, int move_reloads) {
    int n = g->nnodes, ov[3], nov = stream_sets(g, o, ov);
    double *dur = node_seconds(g, p);
    int *cool = getenv("KILN_LHS_NO_COOLDOWN") ? NULL : cooldown_order(g, fixed); /* before the events: g as fixed ordered it */
    Snap s = snap_take(g);
    finish(g, copy_order(fixed, n), o);
    int64_t limit = o->memory_budget > 0 ? (int64_t)o->memory_budget : memplan_stage_total(g);
    int *base[2] = {cool ? cool : fixed, fixed};
    for (int b = 0; b < (cool ? 2 : 1); b++)
        for (int k = 0; k < nov; k++)
            for (size_t a = 0; a < sizeof lhs_attempts / sizeof lhs_attempts[0]; a++) {
                int *order = copy_order(base[b], n);
                snap_restore(g, &s);
                LhsLimits lim = lhs_attempts[a];
                lim.move_reloads = move_reloads;
                lhs_order(g, dur, ov[k], &lim, order, NULL);
                if (try_order(g, o, &s, order, limit, ov[k])) {
                    if (getenv("KILN_LHS_TRACE")) /* docs/schedule.md */
                        fprintf(stderr, "lhs: attempt %zu kept (%s%s)\n", a + 1, ov[k] == 2 ? "tp's and pp's own comm streams" : ov[k] == 3 ? "tp's own comm stream" : "one comm stream",
                                b == 0 && cool ? ", the cooldown's W by bucket" : "");
                    free(fixed), free(cool), free(dur), snap_free(&s);
                    return;
                }
            }
    free(cool);
    for (int k = 0; k < nov; k++)
        if (try_order(g, o, &s, copy_order(fixed, n), limit, ov[k])) {
            free(fixed), free(dur), snap_free(&s);
            return;
        }
    finish(g, copy_order(fixed, n), o); /* the fixed order */
    free(fixed), free(dur), snap_free(&s);
}

/* The cost model's step for m as scheduled (DBL_MAX when it cannot say). */
static double predicted_step(const Module *m, const Profile *p) {
    CostSim sim;
    char err[512];
    if (cost_simulate(m, p, NULL, &sim, err, sizeof err) != 0) return DBL_MAX;
    double t = sim.step;
    cost_sim_free(&sim);
    return t;
}

/* Whether any stage has a node off the compute stream (a transfer or a
 * copy): without one lhs's order is the fixed order (nothing to hide, no
 * stall to avoid, every tie goes to the fixed order), so lhs is skipped. */
static int has_transfer(const Module *m, int overlap) {
    for (int s = 0; s < m->nstages; s++)
        for (int i = 0; i < m->stages[s]->nnodes; i++)
            if (sched_stream_for(m, &m->stages[s]->nodes[i], overlap) != IR_STREAM_COMPUTE) return 1;
    return 0;
}

/* Whether two scheduled programs are the same (lhs kept the fixed order). */
static int snap_same(const Snap *a, const Snap *b) {
    if (a->nnodes != b->nnodes) return 0;
    for (int i = 0; i < a->nnodes; i++)
        if (a->nodes[i].op != b->nodes[i].op || a->nodes[i].out != b->nodes[i].out || a->nodes[i].in != b->nodes[i].in) return 0;
    return 1;
}

/* --schedule lhs: every stage by lhs_schedule_graph twice, with reloads
 * pinned and moving (lhs.c: pinned wins where the pipeline's sends bind,
 * moving where the copies do), kept only when the cost model predicts a
 * step no longer than the fixed order's (all pipeline ranks simulated
 * together: a rank that hides more may still make another wait).  The
 * module takes the faster of the two on every rank; when both are slower
 * than fixed, rank by rank from the first: each rank tries its two lhs
 * orders and keeps one when the module's predicted step with it (and the
 * ranks kept so far) is shorter (one simulation per order that differs). */
static void schedule_lhs(Module *m, const Options *o) {
    if (!has_transfer(m, ir_world(m) > 1 && !o->no_overlap)) {
        for (int s = 0; s < m->nstages; s++) finish(m->stages[s], fixed_order(m->stages[s]), o);
        return;
    }
    Profile p;
    load_profile(&p, o);
    enum { NC = 3 }; /* candidates per rank: fixed, lhs with reloads pinned, lhs with reloads moving */
    int ns = m->nstages, trace = getenv("KILN_LHS_TRACE") != NULL, *cur = xcalloc((size_t)ns + 1, sizeof(int));
    Snap *pre = xcalloc((size_t)ns + 1, sizeof(Snap)), *cand[NC];
    double step[NC];
    for (int c = 0; c < NC; c++) cand[c] = xcalloc((size_t)ns + 1, sizeof(Snap));
    for (int s = 0; s < ns; s++) pre[s] = snap_take(m->stages[s]);
    int reloads = 0;
    for (int s = 0; s < ns; s++)
        for (int i = 0; i < m->stages[s]->nnodes; i++) reloads |= m->stages[s]->nodes[i].op == OP_reload;
    for (int c = 0; c < NC; c++) {
        if (c == 2 && !reloads) { /* no reload: the same orders as pinned */
            for (int s = 0; s < ns; s++) cand[2][s] = snap_take(m->stages[s]);
            step[2] = step[1];
            continue;
        }
        for (int s = 0; s < ns; s++) {
            snap_restore(m->stages[s], &pre[s]);
            if (c == 0) finish(m->stages[s], fixed_order(m->stages[s]), o);
            else lhs_schedule_graph(m->stages[s], o, &p, fixed_order(m->stages[s]), c == 2);
            cand[c][s] = snap_take(m->stages[s]);
        }
        step[c] = predicted_step(m, &p);
    }
    if (trace) fprintf(stderr, "lhs: predicted step, fixed %.3f ms, lhs on every rank %.3f ms (reloads pinned), %.3f ms (moving)\n", step[0] * 1e3, step[1] * 1e3, step[2] * 1e3);
    int base = step[1] <= step[0] && step[1] <= step[2] ? 1 : step[2] <= step[0] ? 2 : 0;
    double best = step[base];
    for (int s = 0; s < ns; s++) snap_restore(m->stages[s], &cand[base][s]), cur[s] = base;
    for (int s = 0; s < ns && base == 0; s++) /* rank by rank only when both are slower (each trial is a simulation) */
        for (int c = 0; c < NC; c++) {
            if (c == cur[s] || snap_same(&cand[c][s], &cand[cur[s]][s])) continue;
            snap_restore(m->stages[s], &cand[c][s]);
            double t = predicted_step(m, &p);
            if (trace) fprintf(stderr, "lhs: rank %d, candidate %d: %.3f ms (best %.3f)\n", s, c, t * 1e3, best * 1e3);
            if (t < best) best = t, cur[s] = c;
            else snap_restore(m->stages[s], &cand[cur[s]][s]);
        }
    if (trace) fprintf(stderr, "lhs: kept %.3f ms\n", best * 1e3);
    for (int s = 0; s < ns; s++) {
        snap_free(&pre[s]);
        for (int c = 0; c < NC; c++) snap_free(&cand[c][s]);
    }
    for (int c = 0; c < NC; c++) free(cand[c]);
    free(pre), free(cur);
}

/* ---- KILN_LHS_EXPOSED=1: why the exposed communication is exposed ----
 *
 * A measurement, not a decision (issue 22's question: of tp's and dp's
 * exposed time, how much is queueing on the comm stream, how much a
 * collective with nothing to fill it, how much dp's edges).  The module as
 * scheduled is simulated by the cost model; for each wait of the compute
 * stream on an event that a comm-stream record marks, c is the transfer
 * that record follows.  c's inputs were ready at the latest record its
 * stream waited for right before it; its stream was free at the end of the
 * stream's work before it.  Had c started when its inputs were ready, the
 * compute stream would have waited max(0, ready + c's time - the wait's
 * start), capped by what it did wait: the rest of the wait is c queueing
 * behind other traffic on the comm stream, split by the class of the work
 * the stream ran while c queued (a blocked pipeline receive is pp; a wait
 * for a receive itself is left out: the cost report's bubble).  The
 * remainder is c's own time with nothing to fill it; for dp it is at the
 * step's edges when the wait is before the compute stream's first GEMM or
 * after its last.  The compute stream's tail (the comm stream ending last)
 * counts as its last transfer's own time.  Printed on stderr as fractions
 * of the predicted step, mean over the pipeline ranks, by c's class (the
 * cost report's classes split the same idle time by what the stream ran,
 * so a tp wait queued behind dp is dp there and tp here). */
static int work_before_on(const Graph *g, int r, int k) {
    for (int i = r - 1; i >= 0; i--)
        if (g->nodes[i].stream == k && g->nodes[i].op != OP_record && g->nodes[i].op != OP_wait) return i;
    return -1;
}

typedef struct {
    double tot[COST_NCLASS], behind[COST_NCLASS][COST_NCLASS], own[COST_NCLASS], edge[COST_NCLASS];
} Why;

/* One compute-stream wait i (idle gap) on the transfer c of stream k. */
static void why_wait(const Graph *g, const CostSim *sim, int st, const int *rec_of, int i, int c, double gap, int edge, Why *W) {
    const double *b = sim->start[st], *e = sim->end[st];
    int k = g->nodes[c].stream, cls = cost_node_class(&g->nodes[c]);
    if (cls < 0 || g->nodes[c].op == OP_recv || g->nodes[c].op == OP_recv_done) return; /* a receive waits for its peer: the bubble's */
    double ready = 0, free_at = 0;
    int j = c - 1;
    for (; j >= 0; j--) {
        const Node *n = &g->nodes[j];
        if (n->stream != k || n->op == OP_record) continue;
        if (n->op != OP_wait) break;
        int r = rec_of[ir_attr_i(n, "event", 0)];
        if (r >= 0 && b[r] > ready) ready = b[r];
    }
    if (j >= 0) free_at = e[j];
    double ideal = ready + (e[c] - (b[c] > ready ? b[c] : ready)), exp_ideal = ideal - b[i];
    exp_ideal = exp_ideal < 0 ? 0 : exp_ideal > gap ? gap : exp_ideal;
    double queue = free_at > ready ? gap - exp_ideal : 0, w[COST_NCLASS] = {0}, wt = 0;
    W->tot[cls] += gap;
    if (edge && cls == COST_DP) W->edge[cls] += gap - queue;
    else W->own[cls] += gap - queue;
    if (queue <= 0) return;
    for (int q = c - 1; q >= 0; q--) { /* who held the stream while c queued */
        const Node *n = &g->nodes[q];
        if (n->stream != k || n->op == OP_record || n->op == OP_wait) continue;
        if (e[q] <= ready) break;
        double lo = b[q] > ready ? b[q] : ready, hi = e[q] < b[c] ? e[q] : b[c];
        int qc = cost_node_class(n);
        if (hi > lo && qc >= 0) w[qc] += hi - lo, wt += hi - lo;
    }
    for (int q = 0; q < COST_NCLASS; q++) W->behind[cls][q] += wt > 0 ? queue * w[q] / wt : q == cls ? queue : 0;
}

static void why_stage(const Graph *g, const CostSim *sim, int st, Why *W) {
    int nev = 0, first = -1, last = -1, lastc = -1;
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        if (n->op == OP_record || n->op == OP_wait) nev = ir_attr_i(n, "event", 0) + 1 > nev ? (int)ir_attr_i(n, "event", 0) + 1 : nev;
        if (n->stream == IR_STREAM_COMPUTE && (ir_ops[n->op].flags & F_GEMM)) last = i, first = first < 0 ? i : first;
    }
    int *rec_of = xcalloc((size_t)nev + 1, sizeof(int));
    for (int v = 0; v < nev; v++) rec_of[v] = -1;
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i].op == OP_record) rec_of[ir_attr_i(&g->nodes[i], "event", 0)] = i;
    double cend = 0, lend = 0;
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        if (sim->end[st][i] > lend && ir_stream_comm(n->stream) && n->op != OP_record && n->op != OP_wait)
            lend = sim->end[st][i], lastc = i;
        if (n->stream != IR_STREAM_COMPUTE) continue;
        cend = sim->end[st][i];
        double gap = sim->end[st][i] - sim->start[st][i];
        if (n->op != OP_wait || gap <= 0) continue;
        int r = rec_of[ir_attr_i(n, "event", 0)];
        if (r < 0 || !ir_stream_comm(g->nodes[r].stream)) continue;
        int c = work_before_on(g, r, g->nodes[r].stream);
        if (c >= 0) why_wait(g, sim, st, rec_of, i, c, gap, i < first || i > last, W);
    }
    if (lastc >= 0 && lend > cend) {
        int cls = cost_node_class(&g->nodes[lastc]);
        if (cls >= 0) W->tot[cls] += lend - cend, (cls == COST_DP ? W->edge : W->own)[cls] += lend - cend;
    }
    free(rec_of);
}

static void explain_exposed(const Module *m, const Options *o) {
    Profile p;
    load_profile(&p, o);
    CostSim sim;
    char err[512];
    if (cost_simulate(m, &p, NULL, &sim, err, sizeof err) != 0) {
        fprintf(stderr, "KILN_LHS_EXPOSED: %s\n", err);
        return;
    }
    Why W;
    memset(&W, 0, sizeof W);
    for (int st = 0; st < m->nstages; st++) why_stage(m->stages[st], &sim, st, &W);
    double f = 100.0 / (sim.step * m->nstages);
    fprintf(stderr, "exposed (%s, %% of the %.3f ms step, mean over %d ranks), by the transfer waited for:\n",
            o->schedule == SCHED_LHS ? "lhs" : "fixed", sim.step * 1e3, m->nstages);
    for (int c = 0; c < COST_D2H; c++) {
        if (W.tot[c] <= 0) continue;
        fprintf(stderr, "  %-3s %6.2f%%: own time, nothing to fill %.2f%%, step edges %.2f%%, queued behind", cost_class_names[c], W.tot[c] * f, W.own[c] * f, W.edge[c] * f);
        for (int q = 0; q < COST_D2H; q++) fprintf(stderr, " %s %.2f%%", cost_class_names[q], W.behind[c][q] * f);
        fputc('\n', stderr);
    }
    cost_sim_free(&sim);
}

void pass_schedule(Module *m, const Options *o) {
    if (o->schedule == SCHED_LHS) schedule_lhs(m, o);
    else
        for (int s = 0; s < m->nstages; s++) finish(m->stages[s], fixed_order(m->stages[s]), o);
    if (getenv("KILN_LHS_EXPOSED") && ir_world(m) > 1) explain_exposed(m, o);
}
