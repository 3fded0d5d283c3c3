/* optimizer.c — one training step's AdamW update, written as IR.
 *
 * After autodiff the graph ends with `output %g {name="grad:<p>"}` for every
 * param p.  pass_optimizer appends the update that consumes those gradients,
 * so that one module is the whole training step and the interpreter, the cost
 * model and the emitters all see the optimizer like any other code:
 *
 *     t      = state "opt.step" + 1              assign t -> "opt.step"
 *     lr_t   = lr_cosine(t)                      output "lr"
 *     norm   = sqrt(sum_p sumsq(grad_p))         output "grad_norm"
 *     scale  = clipscale(norm)                   (global-norm clipping)
 *     p', m', v' = adamw(p, g, m, v, lr_t, scale, t)   for every param p
 *     assign p', m', v'
 *
 * The moments live in states "opt.m.<p>" and "opt.v.<p>" of the param's type
 * (zero at start, like every state), the step counter in "opt.step" f32[].
 * Weight decay applies to matrices only (rank >= 2): norms' gains and biases
 * are not decayed, the GPT-2/Llama convention.
 *
 * Gradients are found by the names of the output nodes, never by op lists, so
 * later passes that rewrite how a gradient is computed (accumulation over
 * micro-batches, reduce-scatter buckets) keep this pass working.  Every node
 * is phase opt; per-param nodes (sumsq, states, adamw, assigns) carry the
 * param's Loc and layer, the global ones the loss node's Loc and layer -1.
 */
#include <stdio.h>
#include <string.h>

#include "kiln.h"

typedef struct {
    Module *m;
    Builder bld; /* the graph; the Loc and layer of the param being updated */
} Opt;

/* A named source (state) of type t. */
static int source(Opt *b, Op op, const char *name, Type t) {
    Attr at = ir_attr_str(b->m, "name", name);
    return ir_out(b->bld.g, ir_build(&b->bld, op, 0, NULL, 1, &at, &t));
}

static void sink(Opt *b, Op op, int x, const char *name) {
    Attr at = ir_attr_str(b->m, "name", name);
    ir_build(&b->bld, op, 1, &x, 1, &at, NULL);
}

/* Step counts are written as ints when they are whole (the dump reads better). */
static Attr num_attr(Module *m, const char *key, double v) {
    return v == (double)(int64_t)v ? ir_attr_int(m, key, (int64_t)v) : ir_attr_float(m, key, v);
}

/* Value of the output named `name`, -1 if none. */
static int find_output(const Graph *g, const char *name) {
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i].op == OP_output && !strcmp(ir_attr_s(&g->nodes[i], "name", ""), name))
            return g->nodes[i].in[0];
    return -1;
}

static Loc loss_loc(const Graph *g) {
    for (int i = 0; i < g->nnodes; i++)
        if (ir_ops[g->nodes[i].op].flags & F_LOSS) return g->nodes[i].loc;
    if (!g->nnodes) ICE("optimizer: empty graph");
    return g->nodes[0].loc;
}

/* The gradient of param node i: the value of output "grad:<name>". */
static int grad_of(const Graph *g, int i) {
    char name[512];
    snprintf(name, sizeof name, "grad:%s", ir_attr_s(&g->nodes[i], "name", "?"));
    int v = find_output(g, name);
    if (v < 0) ICE("optimizer: no output %s (run autodiff first)", name);
    return v;
}

/* sqrt(sum over params of sumsq(grad)), f32[]. */
static int grad_norm(Opt *b, int nfwd) {
    int acc = -1;
    Loc loc = b->bld.loc;
    for (int i = 0; i < nfwd; i++) {
        if (b->bld.g->nodes[i].op != OP_param) continue;
        b->bld.loc = b->bld.g->nodes[i].loc, b->bld.layer = b->bld.g->nodes[i].layer; /* the param's piece */
        int s = ir_build1(&b->bld, OP_sumsq, grad_of(b->bld.g, i), 0, NULL);
        b->bld.loc = loc, b->bld.layer = -1;
        acc = acc < 0 ? s : ir_build2(&b->bld, OP_add, acc, s);
    }
    if (acc < 0) { /* no params: norm 0 */
        Attr z = ir_attr_float(b->m, "v", 0.0);
        Type t = {.dt = DT_F32, .rank = 0};
        acc = ir_out(b->bld.g, ir_build(&b->bld, OP_const, 0, NULL, 1, &z, &t));
    }
    return ir_build1(&b->bld, OP_sqrt, acc, 0, NULL);
}

static void update_param(Opt *b, const Options *o, int i, int lr, int scale, int t) {
    Node p = b->bld.g->nodes[i];
    const char *name = ir_attr_s(&p, "name", "?");
    Type tp = b->bld.g->vals[p.out[0]].t;
    b->bld.loc = p.loc, b->bld.layer = p.layer;
    char mn[512], vn[512];
    snprintf(mn, sizeof mn, "opt.m.%s", name);
    snprintf(vn, sizeof vn, "opt.v.%s", name);
    int mv = source(b, OP_state, mn, tp), vv = source(b, OP_state, vn, tp);
    int in[7] = {p.out[0], grad_of(b->bld.g, i), mv, vv, lr, scale, t};
    Attr at[4] = {ir_attr_float(b->m, "b1", o->beta1), ir_attr_float(b->m, "b2", o->beta2),
                  ir_attr_float(b->m, "eps", o->eps),
                  ir_attr_float(b->m, "wd", tp.rank >= 2 ? o->weight_decay : 0.0)};
    int n = ir_build(&b->bld, OP_adamw, 7, in, 4, at, NULL);
    int out[3];
    memcpy(out, b->bld.g->nodes[n].out, sizeof out);
    sink(b, OP_assign, out[0], name);
    sink(b, OP_assign, out[1], mn);
    sink(b, OP_assign, out[2], vn);
}

void pass_optimizer(Module *m, const Options *o) {
    if (m->nstages != 1) ICE("optimizer: expects one stage, got %d", m->nstages);
    Graph *g = m->stages[0];
    int nfwd = g->nnodes;
    Opt b = {.m = m, .bld = {.g = g, .pass = "optimizer", .loc = loss_loc(g), .layer = -1, .phase = PH_OPT}};
    Type scalar = {.dt = DT_F32, .rank = 0};

    int step = source(&b, OP_state, "opt.step", scalar);
    Attr one_v = ir_attr_float(m, "v", 1.0);
    int one = ir_out(g, ir_build(&b.bld, OP_const, 0, NULL, 1, &one_v, &scalar));
    int t = ir_build2(&b.bld, OP_add, step, one);
    sink(&b, OP_assign, t, "opt.step");

    Attr sched[4] = {ir_attr_float(m, "lr", o->lr), ir_attr_float(m, "min_lr", o->min_lr),
                     num_attr(m, "warmup", o->warmup), num_attr(m, "total", o->steps)};
    int lr = ir_build1(&b.bld, OP_lr_cosine, t, 4, sched);
    sink(&b, OP_output, lr, "lr");

    int norm = grad_norm(&b, nfwd);
    sink(&b, OP_output, norm, "grad_norm");
    Attr mx = ir_attr_float(m, "max", o->grad_clip);
    int scale = ir_build1(&b.bld, OP_clipscale, norm, 1, &mx);

    for (int i = 0; i < nfwd; i++)
        if (g->nodes[i].op == OP_param) update_param(&b, o, i, lr, scale, t);
}
