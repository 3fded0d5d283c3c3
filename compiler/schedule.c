/* schedule.c — the linear program: every node gets a stream and a position.
 *
 * The emitted step function issues its calls in node order, each on its
 * node's stream (0 compute, 1 comm, 2 d2h, 3 h2d).  Streams are in-order
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
 */
#include <stdlib.h>
#include <string.h>

#include "live.h"
#include "passes.h"

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

/* order[] with every hoistable node moved up to just after its last input. */
static void hoist(const Graph *g, int *order) {
    int n = g->nnodes, k = 0, npend = 0;
    char *h = hoistable(g), *done = calloc((size_t)(g->nvals ? g->nvals : 1), 1);
    int *out = malloc(sizeof(int) * (size_t)(n ? n : 1)), *pend = malloc(sizeof(int) * (size_t)(n ? n : 1));
    if (!done || !out || !pend) ICE("out of memory");
    for (int j = 0; j < n; j++)
        if (h[order[j]]) pend[npend++] = order[j];
    for (int j = 0; j <= n; j++) {
        for (int progress = 1; progress;) { /* issue every pending node whose inputs are done */
            progress = 0;
            for (int q = 0; q < npend; q++) {
                const Node *nd = &g->nodes[pend[q]];
                int ready = 1;
                for (int i = 0; i < nd->nin && ready; i++) ready = done[nd->in[i]] || g->vals[nd->in[i]].def < 0;
                if (!ready) continue;
                out[k++] = pend[q];
                for (int o = 0; o < nd->nout; o++) done[nd->out[o]] = 1;
                memmove(pend + q, pend + q + 1, sizeof(int) * (size_t)(--npend - q));
                q--, progress = 1;
            }
        }
        if (j == n) break;
        if (h[order[j]]) continue;
        const Node *nd = &g->nodes[order[j]];
        out[k++] = order[j];
        for (int o = 0; o < nd->nout; o++) done[nd->out[o]] = 1;
    }
    if (k != n) ICE("schedule: hoisting lost nodes (%d of %d)", k, n);
    memcpy(order, out, sizeof(int) * (size_t)n);
    free(h), free(done), free(out), free(pend);
}

static int sync_node(Graph *g, Op op, int stream, int64_t event, const Node *at) {
    Attr a = ir_attr_int(g->m, "event", event);
    Builder b = {.g = g, .pass = "schedule", .loc = at->loc, .layer = at->layer, .phase = at->phase};
    int i = ir_build(&b, op, 0, NULL, 1, &a, NULL);
    g->nodes[i].stream = stream;
    return i;
}

/* Streams, and the events between them: a node whose input comes from
 * another stream waits (once per stream) for an event its producer's
 * stream records right after the producer. */
static void add_events(Graph *g, int *order, int n, int overlap, int drop_first_wait, int **final, int *nfinal) {
    int *stream = malloc(sizeof(int) * (size_t)(n ? n : 1)), *event = malloc(sizeof(int) * (size_t)(n ? n : 1));
    char *cross = calloc((size_t)(n ? n : 1), 1);
    if (!stream || !event || !cross) ICE("out of memory");
    for (int i = 0; i < n; i++) {
        stream[i] = overlap && (ir_ops[g->nodes[i].op].flags & F_COMM) ? IR_STREAM_COMM : IR_STREAM_COMPUTE;
        event[i] = -1;
    }
    for (int i = 0; i < n; i++)
        for (int k = 0; k < g->nodes[i].nin; k++) {
            int p = g->vals[g->nodes[i].in[k]].def;
            if (p >= 0 && stream[p] != stream[i]) cross[p] = 1;
        }
    int cap = 3 * n + 1, m = 0, nev = 0, dropped = !drop_first_wait;
    int *out = malloc(sizeof(int) * (size_t)cap);
    unsigned *waited = NULL; /* per event: bit s = stream s waited */
    if (!out) ICE("out of memory");
    for (int j = 0, end = 0; j < n; j++) {
        int i = order[j];
        g->nodes[i].stream = stream[i];
        if (j >= end) { /* a fused group is one kernel: its members' waits go before its first member */
            int grp = ir_fused_group(&g->nodes[i]);
            for (end = j + 1; grp >= 0 && end < n && ir_fused_group(&g->nodes[order[end]]) == grp;) end++;
            for (int e = j; e < end; e++) {
                const Node *q = &g->nodes[order[e]];
                for (int k = 0; k < q->nin; k++) {
                    int p = g->vals[q->in[k]].def, sq = stream[order[e]];
                    if (p < 0 || stream[p] == sq || (waited[event[p]] >> sq & 1)) continue;
                    waited[event[p]] |= 1u << sq;
                    if (!dropped) { dropped = 1; continue; } /* --test-drop-event: forget this wait */
                    out[m++] = sync_node(g, OP_wait, sq, event[p], q);
                }
            }
        }
        out[m++] = i;
        if (cross[i]) {
            event[i] = nev++;
            if (!(waited = realloc(waited, sizeof(unsigned) * (size_t)nev))) ICE("out of memory");
            waited[event[i]] = 0;
            out[m++] = sync_node(g, OP_record, stream[i], event[i], &g->nodes[i]);
        }
    }
    free(stream), free(event), free(cross), free(waited);
    *final = out, *nfinal = m;
}

static void schedule_graph(Graph *g, const Options *o) {
    int n = g->nnodes, k = 0, world = ir_world(g->m);
    int *order = malloc(sizeof(int) * (size_t)(n ? n : 1));
    if (!order) ICE("out of memory");
    for (int i = 0; i < n; i++)
        if (g->nodes[i].op != OP_assign) order[k++] = i;
    for (int i = 0; i < n; i++)
        if (g->nodes[i].op == OP_assign) order[k++] = i;
    hoist(g, order);
    int *final, m;
    add_events(g, order, n, world > 1 && !o->no_overlap, o->drop_event, &final, &m);
    free(order);
    ir_reorder(g, final);
    free(final);
    for (int i = 0; i < g->nnodes; i++) g->nodes[i].pos = i;
}

void pass_schedule(Module *m, const Options *o) {
    for (int s = 0; s < m->nstages; s++) schedule_graph(m->stages[s], o);
}
