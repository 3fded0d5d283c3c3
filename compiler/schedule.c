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
 * sched_reorder, then number.
 */
#include <stdlib.h>
#include <string.h>

#include "memplan.h"

void sched_reorder(Graph *g, const int *order) {
    int n = g->nnodes;
    Node *nodes = ir_alloc(g->m, sizeof(Node) * (size_t)(n ? n : 1));
    char *seen = calloc((size_t)(n ? n : 1), 1);
    if (!seen) ICE("out of memory");
    for (int k = 0; k < n; k++) {
        int i = order[k];
        if (i < 0 || i >= n || seen[i]) ICE("sched_reorder: order is not a permutation (node %d at %d)", i, k);
        seen[i] = 1;
        nodes[k] = g->nodes[i];
        for (int o = 0; o < nodes[k].nout; o++) g->vals[nodes[k].out[o]].def = k;
    }
    free(seen);
    g->nodes = nodes;
    g->capnodes = n;
}

static void schedule_graph(Graph *g) {
    int n = g->nnodes, k = 0;
    int *order = malloc(sizeof(int) * (size_t)(n ? n : 1));
    if (!order) ICE("out of memory");
    for (int i = 0; i < n; i++)
        if (g->nodes[i].op != OP_assign) order[k++] = i;
    for (int i = 0; i < n; i++)
        if (g->nodes[i].op == OP_assign) order[k++] = i;
    sched_reorder(g, order);
    free(order);
    for (int i = 0; i < n; i++) {
        g->nodes[i].stream = 0;
        g->nodes[i].pos = i;
    }
}

void pass_schedule(Module *m, const Options *o) {
    (void)o;
    for (int s = 0; s < m->nstages; s++) schedule_graph(m->stages[s]);
}
