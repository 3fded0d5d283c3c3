/* forward.c — the forward-only program for inference (`kiln sample`).
 *
 * A model file describes one training step: tokens in, loss out.  To
 * generate text we want the same network without the objective: tokens in,
 * logits out.  The model names its logits with `output("logits", x)`
 * (docs/dsl.md), and this pass keeps exactly what those output nodes need —
 * dead-code elimination backwards from them.  The loss, the cross-entropy,
 * the "targets" input and the "loss" output fall away because nothing the
 * logits depend on uses them.
 *
 * It runs on the front end's module (before autodiff; the optimizer is never
 * run, so the program has no state), and rebuilds the graph with fresh value
 * ids so that the module is dense and verifies like any other.  Node order,
 * locations, attributes and metadata are kept.  A module without a "logits"
 * output is a compiler-internal error: the caller (sample.c) checks for it
 * first and reports a user error.
 */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

static int is_logits_output(const Node *n) {
    return n->op == OP_output && strcmp(ir_attr_s(n, "name", ""), "logits") == 0;
}

/* live[i] = 1 for every node the logits outputs need (one backward sweep:
 * node order is a valid execution order). */
static char *forward_live(const Graph *g) {
    char *live = calloc((size_t)(g->nnodes ? g->nnodes : 1), 1);
    char *need = calloc((size_t)(g->nvals ? g->nvals : 1), 1);
    if (!live || !need) ICE("out of memory");
    for (int i = g->nnodes - 1; i >= 0; i--) {
        const Node *n = &g->nodes[i];
        int keep = is_logits_output(n);
        for (int k = 0; k < n->nout; k++) keep |= need[n->out[k]];
        if (!keep) continue;
        live[i] = 1;
        for (int k = 0; k < n->nin; k++) need[n->in[k]] = 1;
    }
    free(need);
    return live;
}

/* Copy node n of g into h with its inputs renamed through map; record the
 * new ids of its outputs in map. */
static void copy_node(Graph *h, const Graph *g, const Node *n, int *map) {
    int in[IR_MAXIN];
    ir_ice_at(n->loc);
    if (n->nin > IR_MAXIN) ICE("forward: node with %d inputs", n->nin);
    for (int k = 0; k < n->nin; k++) {
        in[k] = map[n->in[k]];
        if (in[k] < 0) ICE("forward: input %%%d used before its definition", n->in[k]);
    }
    NodeSpec s = ir_spec(n->op, n->loc);
    s.nin = n->nin;
    s.in = in;
    s.nattr = n->nattr;
    s.attr = n->attr;
    s.layer = n->layer;
    s.phase = n->phase;
    s.src_type = (ir_ops[n->op].flags & F_SOURCE) ? &g->vals[n->out[0]].t : NULL;
    char err[512];
    int j = ir_add_node(h, &s, err, sizeof err);
    if (j < 0) ICE("forward: %s: %s", ir_ops[n->op].name, err);
    Node *c = &h->nodes[j];
    c->stage = n->stage, c->vstage = n->vstage, c->mb = n->mb;
    for (int k = 0; k < n->nout; k++) {
        map[n->out[k]] = c->out[k];
        memcpy(h->vals[c->out[k]].sh, g->vals[n->out[k]].sh, sizeof g->vals[0].sh);
    }
}

void pass_forward(Module *m, const Options *o) {
    (void)o;
    if (m->nstages != 1) ICE("forward: expects one stage, got %d", m->nstages);
    Graph *g = m->stages[0];
    int found = 0;
    for (int i = 0; i < g->nnodes; i++) found |= is_logits_output(&g->nodes[i]);
    if (!found) ICE("forward: the model has no output \"logits\"");
    char *live = forward_live(g);
    int *map = malloc(sizeof(int) * (size_t)(g->nvals ? g->nvals : 1));
    if (!map) ICE("out of memory");
    for (int v = 0; v < g->nvals; v++) map[v] = -1;
    Graph *h = ir_graph_new(m);
    for (int i = 0; i < g->nnodes; i++)
        if (live[i]) copy_node(h, g, &g->nodes[i], map);
    m->stages[0] = h;
    free(map);
    free(live);
}
