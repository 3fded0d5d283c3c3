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
 *
 * Data parallel (mesh dp > 1): parallelize leaves every gradient a partial
 * sum over dp.  The params are grouped, in the order backward produces
 * their gradients, into buckets of about --bucket-mb, each split into a
 * weight-decayed and a not-decayed "flat" padded to a multiple of dp
 * (plan_flats).  --zero 0 all-reduces each flat and updates as above.
 * --zero 1 is Megatron's distributed optimizer: the params live as 1/dp
 * shards ("param.b<k>", with "opt.m.b<k>" and "opt.v.b<k>"), all-gathered
 * at the start of the step right before forward needs them
 * (gather_params, place_gathers), and each flat's gradients are
 * reduce-scattered so each rank updates only its shard (update_sharded).
 * docs/parallel.md tells the user's side.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "passes.h"
#include "live.h" /* ir_reorder */

typedef struct {
    Module *m;
    Builder bld; /* the graph; the Loc and layer of the param being updated */
    int stage;   /* the pipeline stage being updated */
} Opt;

/* Gradients are partial sums over the data-parallel group: dp, and cp
 * (every cp rank saw other tokens of the same sequences). */
static int red_size(const Module *m) { return m->mesh[1] * m->mesh[2]; }
static const char *red_group(const Module *m) {
    return m->mesh[1] > 1 && m->mesh[2] > 1 ? "dp+cp" : m->mesh[2] > 1 ? "cp" : "dp";
}
/* Pipeline parallel (mesh pp > 1): each stage updates its own params; the
 * global gradient norm sums every stage's squares (all-reduced over pp), a
 * param shared by two stages (pp.c marks the copy that does not sum its
 * gradient {replica=1}) counted once. */
static int is_replica(const Graph *g, int i) { return ir_attr_i(&g->nodes[i], "replica", 0) != 0; }
static const char *norm_group(const Module *m) {
    if (m->mesh[0] == 1) return red_group(m);
    return red_size(m) == 1 ? "pp" : m->mesh[1] > 1 && m->mesh[2] > 1 ? "pp+dp+cp" : m->mesh[2] > 1 ? "pp+cp" : "pp+dp";
}

/* Tensor parallel (mesh tp > 1, issue 20): a param split over tp holds a
 * block of its gradient on each tp rank, a replicated one (norm gains,
 * biases of row-parallel layers) the whole gradient on every tp rank.  The
 * norm all-reduces the squares over tp too, each replicated param's scaled
 * by 1/tp so it counts once. */
static int tp_split(const Graph *g, int i) { return g->vals[g->nodes[i].out[0]].sh[3].kind == SH_SPLIT; }
static int tp_once(Opt *b, int s, int split) {
    if (b->m->mesh[3] == 1 || split) return s;
    Attr c = ir_attr_float(b->m, "v", 1.0 / b->m->mesh[3]);
    Type t = {.dt = DT_F32, .rank = 0};
    return ir_build2(&b->bld, OP_mul, s, ir_out(b->bld.g, ir_build(&b->bld, OP_const, 0, NULL, 1, &c, &t)));
}
static const char *norm_group_tp(const Module *m, char *buf, size_t n) {
    snprintf(buf, n, "%s%s", norm_group(m), m->mesh[3] > 1 ? "+tp" : "");
    return buf;
}

/* A value split on dim 0 over the reduction group. */
static void split_over_group(Graph *g, int v) {
    for (int a = 1; a <= 2; a++)
        if (g->m->mesh[a] > 1) g->vals[v].sh[a] = (AxisShard){SH_SPLIT, 0};
}

/* A named source (state) of type t. */
static int source(Opt *b, Op op, const char *name, Type t) {
    Attr at = ir_attr_str(b->m, "name", name);
    return ir_out(b->bld.g, ir_build(&b->bld, op, 0, NULL, 1, &at, &t));
}

static void sink(Opt *b, Op op, int x, const char *name) {
    Attr at = ir_attr_str(b->m, "name", name);
    ir_build(&b->bld, op, 1, &x, 1, &at, NULL);
}

/* The value of state `name` already in g, -1 if none. */
static int find_state(const Graph *g, const char *name) {
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i].op == OP_state && strcmp(ir_attr_s(&g->nodes[i], "name", ""), name) == 0) return g->nodes[i].out[0];
    return -1;
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
static int grad_norm(Opt *b, int nfwd, const int *gradv) {
    int acc = -1;
    Loc loc = b->bld.loc;
    for (int i = 0; i < nfwd; i++) {
        if (b->bld.g->nodes[i].op != OP_param || is_replica(b->bld.g, i)) continue;
        b->bld.loc = b->bld.g->nodes[i].loc, b->bld.layer = b->bld.g->nodes[i].layer; /* the param's piece */
        int s = tp_once(b, ir_build1(&b->bld, OP_sumsq, gradv[i], 0, NULL), tp_split(b->bld.g, i));
        b->bld.loc = loc, b->bld.layer = -1;
        acc = acc < 0 ? s : ir_build2(&b->bld, OP_add, acc, s);
    }
    if (acc < 0) { /* no params: norm 0 */
        Attr z = ir_attr_float(b->m, "v", 0.0);
        Type t = {.dt = DT_F32, .rank = 0};
        acc = ir_out(b->bld.g, ir_build(&b->bld, OP_const, 0, NULL, 1, &z, &t));
    }
    if (b->m->mesh[0] > 1 || b->m->mesh[3] > 1) {
        Attr at = ir_attr_str(b->m, "group", b->m->mesh[0] > 1 && b->m->mesh[3] > 1 ? "pp+tp" : b->m->mesh[0] > 1 ? "pp" : "tp");
        acc = ir_build1(&b->bld, OP_allreduce, acc, 1, &at);
    }
    return ir_build1(&b->bld, OP_sqrt, acc, 0, NULL);
}

static Attr *adam_attrs(Opt *b, const Options *o, double wd) {
    Attr *at = ir_alloc(b->m, sizeof(Attr) * 4);
    at[0] = ir_attr_float(b->m, "b1", o->beta1), at[1] = ir_attr_float(b->m, "b2", o->beta2);
    at[2] = ir_attr_float(b->m, "eps", o->eps), at[3] = ir_attr_float(b->m, "wd", wd);
    return at;
}

static void update_param(Opt *b, const Options *o, int i, int grad, int lr, int scale, int t) {
    Node p = b->bld.g->nodes[i];
    const char *name = ir_attr_s(&p, "name", "?");
    Type tp = b->bld.g->vals[p.out[0]].t;
    b->bld.loc = p.loc, b->bld.layer = p.layer;
    char mn[512], vn[512];
    snprintf(mn, sizeof mn, "opt.m.%s", name);
    snprintf(vn, sizeof vn, "opt.v.%s", name);
    int mv = source(b, OP_state, mn, tp), vv = source(b, OP_state, vn, tp);
    int in[7] = {p.out[0], grad, mv, vv, lr, scale, t};
    int n = ir_build(&b->bld, OP_adamw, 7, in, 4, adam_attrs(b, o, tp.rank >= 2 ? o->weight_decay : 0.0), NULL);
    int out[3];
    memcpy(out, b->bld.g->nodes[n].out, sizeof out);
    sink(b, OP_assign, out[0], name);
    sink(b, OP_assign, out[1], mn);
    sink(b, OP_assign, out[2], vn);
}

/* ======================================================================
 * Data parallel: gradients are partial sums over dp, reduced in buckets
 * ====================================================================== */

/* A flat buffer of the distributed optimizer: params of one weight-decay
 * class, consecutive in backward order, flattened, padded to n (a multiple
 * of dp). */
typedef struct {
    int *param;       /* param node indices */
    int64_t *offset;  /* element offsets */
    int nmembers;
    int64_t n;
    double wd;
    int replica; /* its members are replicas (pp.c): out of the norm */
    int tpsplit; /* its members are split over tp */
} Flat;

static int64_t numel_of(const Graph *g, int v) { return ir_numel(&g->vals[v].t); }

/* Params in the order backward produces their gradients. */
static int *backward_order(const Graph *g, const int *gradv, int *np) {
    int *ord = malloc(sizeof(int) * (size_t)(g->nnodes ? g->nnodes : 1));
    if (!ord) ICE("out of memory");
    int n = 0;
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i].op == OP_param) ord[n++] = i;
    for (int a = 1; a < n; a++) /* insertion sort by the gradient's producer */
        for (int b = a; b > 0 && g->vals[gradv[ord[b]]].def < g->vals[gradv[ord[b - 1]]].def; b--) {
            int t = ord[b];
            ord[b] = ord[b - 1], ord[b - 1] = t;
        }
    *np = n;
    return ord;
}

/* Buckets of about bucket_mb MiB in backward order; each split into its
 * decayed and not-decayed flats (empty flats are skipped). */
static Flat *plan_flats(Module *m, const Graph *g, const Options *o, const int *gradv, int *nflats) {
    int np, *ord = backward_order(g, gradv, &np), nf = 0;
    Flat *f = ir_alloc(m, sizeof(Flat) * (size_t)(8 * np + 8));
    int64_t limit = (int64_t)(o->bucket_mb * 1048576.0), dp = red_size(m);
    for (int start = 0; start < np;) {
        int end = start;
        int64_t bytes = 0;
        while (end < np && (end == start || bytes < limit)) bytes += 4 * numel_of(g, g->nodes[ord[end++]].out[0]);
        for (int cls = 7; cls >= 0; cls--) { /* decayed or not (bit 0), replica or not (bit 1), split over tp (bit 2) */
            Flat *fl = &f[nf];
            fl->param = ir_alloc(m, sizeof(int) * (size_t)(end - start));
            fl->offset = ir_alloc(m, sizeof(int64_t) * (size_t)(end - start));
            fl->wd = cls & 1 ? o->weight_decay : 0.0;
            fl->replica = (cls >> 1) & 1;
            fl->tpsplit = cls >> 2;
            for (int k = start; k < end; k++) {
                int v = g->nodes[ord[k]].out[0];
                int decays = g->vals[v].t.rank >= 2 && o->weight_decay != 0.0;
                if (decays != (cls & 1) || is_replica(g, ord[k]) != ((cls >> 1) & 1) || tp_split(g, ord[k]) != (cls >> 2)) continue;
                fl->param[fl->nmembers] = ord[k];
                fl->offset[fl->nmembers++] = fl->n;
                fl->n += numel_of(g, v);
            }
            fl->n = (fl->n + dp - 1) / dp * dp;
            if (fl->nmembers) nf++;
        }
        start = end;
    }
    free(ord);
    *nflats = nf;
    return f;
}

static int flat_1d(Opt *b, int x) {
    int64_t n = numel_of(b->bld.g, x);
    Attr sh = ir_attr_ints(b->m, "shape", &n, 1);
    return ir_build1(&b->bld, OP_reshape, x, 1, &sh);
}

/* concat of the members' values (vals[param node]) flattened, zero padded. */
static int gather_flat(Opt *b, const Flat *f, const int *vals) {
    int *in = malloc(sizeof(int) * (size_t)(f->nmembers + 1)), k = 0;
    if (!in) ICE("out of memory");
    int64_t used = 0;
    for (; k < f->nmembers; k++) used += numel_of(b->bld.g, vals[f->param[k]]), in[k] = flat_1d(b, vals[f->param[k]]);
    if (used < f->n) {
        Attr z = ir_attr_float(b->m, "v", 0.0);
        Type t = {.dt = DT_F32, .rank = 1, .dim = {f->n - used}};
        in[k++] = ir_out(b->bld.g, ir_build(&b->bld, OP_const, 0, NULL, 1, &z, &t));
    }
    Attr d = ir_attr_int(b->m, "dim", 0);
    int x = k == 1 ? in[0] : ir_out(b->bld.g, ir_build(&b->bld, OP_concat, k, in, 1, &d, NULL));
    free(in);
    return x;
}

/* Member k of a flat [n] value, in its param's shape. */
static int member_of(Opt *b, const Flat *f, int k, int flat) {
    const Graph *g = b->bld.g;
    const Type *t = &g->vals[g->nodes[f->param[k]].out[0]].t;
    Attr at[3] = {ir_attr_int(b->m, "dim", 0), ir_attr_int(b->m, "start", f->offset[k]),
                  ir_attr_int(b->m, "end", f->offset[k] + ir_numel(t))};
    int s = ir_build1(&b->bld, OP_slice, flat, 3, at);
    Attr sh = ir_attr_ints(b->m, "shape", t->dim, t->rank);
    return ir_build1(&b->bld, OP_reshape, s, 1, &sh);
}

static int comm(Opt *b, Op op, int x, int with_dim) {
    Attr at[2] = {ir_attr_str(b->m, "group", red_group(b->m)), ir_attr_int(b->m, "dim", 0)};
    int y = ir_build1(&b->bld, op, x, with_dim ? 2 : 1, at);
    if (op == OP_reducescatter) split_over_group(b->bld.g, y);
    return y;
}

/* Put the builder at the flat's last member (the param whose gradient
 * completes it): its Loc and layer. */
static void at_flat(Opt *b, const Flat *f) {
    const Node *p = &b->bld.g->nodes[f->param[f->nmembers - 1]];
    b->bld.loc = p->loc, b->bld.layer = p->layer;
}

/* Remove the partial "grad:<p>" outputs (the reduced gradients replace them). */
static void drop_grad_outputs(Graph *g) {
    int k = 0;
    for (int i = 0; i < g->nnodes; i++) {
        Node *n = &g->nodes[i];
        if (n->op == OP_output && strncmp(ir_attr_s(n, "name", ""), "grad:", 5) == 0) continue;
        g->nodes[k] = *n;
        for (int o = 0; o < n->nout; o++) g->vals[n->out[o]].def = k;
        k++;
    }
    g->nnodes = k;
}

/* A state "<state_prefix>b<fi>" holding this rank's shard of flat `fi`
 * (bucket attrs: kiln_rt.h rt_bucket); its logical tensors are
 * "<prefix><param>" ("" for the params themselves). */
static int shard_state(Opt *b, const Flat *f, int fi, const char *state_prefix, const char *prefix) {
    const Graph *g = b->bld.g;
    char name[64], *params;
    size_t len = 1;
    for (int k = 0; k < f->nmembers; k++) len += strlen(ir_attr_s(&g->nodes[f->param[k]], "name", "?")) + 1;
    if (!(params = malloc(len))) ICE("out of memory");
    params[0] = 0;
    for (int k = 0; k < f->nmembers; k++) {
        const char *pn = ir_attr_s(&g->nodes[f->param[k]], "name", "?");
        if (strchr(pn, ',')) ICE("optimizer: param name \"%s\" has a comma", pn);
        if (k) strcat(params, ",");
        strcat(params, pn);
    }
    if (b->m->mesh[0] > 1) snprintf(name, sizeof name, "%ss%db%d", state_prefix, b->stage, fi); /* unique over the stages */
    else snprintf(name, sizeof name, "%sb%d", state_prefix, fi);
    Attr at[7] = {ir_attr_str(b->m, "name", name), ir_attr_int(b->m, "bucket", fi), ir_attr_str(b->m, "group", red_group(b->m)),
                  ir_attr_str(b->m, "prefix", prefix), ir_attr_str(b->m, "params", params),
                  ir_attr_ints(b->m, "offsets", f->offset, f->nmembers), ir_attr_int(b->m, "n", f->n)};
    free(params);
    Type t = {.dt = DT_F32, .rank = 1, .dim = {f->n / red_size(b->m)}};
    int v = ir_out(b->bld.g, ir_build(&b->bld, OP_state, 0, NULL, 7, at, &t));
    split_over_group(b->bld.g, v);
    return v;
}


/* --zero 1, the start of the step: every rank keeps 1/dp of each flat's
 * params (state "param.b<k>", the master weights; the param nodes keep their
 * names and inits but no storage).  The flats are all-gathered on the comm
 * stream in the order forward first needs them, and every use of a param
 * reads its piece of the gathered flat, placed right before that first use
 * (node order), so layer 0 computes while later layers' params are still
 * being gathered; the schedule waits on each flat's gather event. */
typedef struct {
    int *reshape;         /* per param node: the last node of its view (slice, reshape) */
    int *gather;          /* per flat: the state node and the allgather node */
} Views;

static void gather_params(Opt *b, Flat *f, int nf, int *ps, Views *vw, int nold) {
    Graph *g = b->bld.g;
    int *view = calloc((size_t)g->nnodes, sizeof(int));
    if (!view) ICE("out of memory");
    b->bld.phase = PH_FWD;
    for (int i = 0; i < nf; i++) {
        const Node *p0 = &g->nodes[f[i].param[0]];
        b->bld.loc = p0->loc, b->bld.layer = p0->layer;
        ps[i] = shard_state(b, &f[i], i, "param.", "");
        vw->gather[2 * i] = g->vals[ps[i]].def;
        int full = comm(b, OP_allgather, ps[i], 1);
        vw->gather[2 * i + 1] = g->vals[full].def;
        for (int k = 0; k < f[i].nmembers; k++) {
            int pn = f[i].param[k];
            b->bld.loc = g->nodes[pn].loc, b->bld.layer = g->nodes[pn].layer;
            view[pn] = member_of(b, &f[i], k, full);
            vw->reshape[pn] = g->vals[view[pn]].def;
        }
    }
    b->bld.phase = PH_OPT;
    for (int i = 0; i < nold; i++) /* every read of a param now reads its view */
        for (int k = 0; k < g->nodes[i].nin; k++) {
            int d = g->vals[g->nodes[i].in[k]].def;
            if (d >= 0 && g->nodes[d].op == OP_param) g->nodes[i].in[k] = view[d];
        }
    free(view);
}

/* Node order with the gathers first (flats in order of first use) and each
 * param's view right before its first reader; the optimizer's nodes after. */
static void place_gathers(Graph *g, const Views *vw, int nf, int nold, const int *flat_of) {
    int n = g->nnodes, k = 0;
    int *order = malloc(sizeof(int) * (size_t)n), *first = malloc(sizeof(int) * (size_t)(nf ? nf : 1));
    char *placed = calloc((size_t)n, 1);
    if (!order || !first || !placed) ICE("out of memory");
    for (int i = 0; i < nf; i++) first[i] = n;
    for (int i = 0; i < nold; i++)
        for (int j = 0; j < g->nodes[i].nin; j++) {
            int d = g->vals[g->nodes[i].in[j]].def, fi;
            if (d >= 0 && (fi = flat_of[d]) >= 0 && i < first[fi]) first[fi] = i;
        }
    for (int done = 0; done < nf; done++) { /* flats by first use */
        int best = -1;
        for (int i = 0; i < nf; i++)
            if (!placed[vw->gather[2 * i]] && (best < 0 || first[i] < first[best])) best = i;
        order[k++] = vw->gather[2 * best], order[k++] = vw->gather[2 * best + 1];
        placed[vw->gather[2 * best]] = placed[vw->gather[2 * best + 1]] = 1;
    }
    for (int i = 0; i < nold; i++) {
        for (int j = 0; j < g->nodes[i].nin; j++) {
            int d = g->vals[g->nodes[i].in[j]].def;
            if (d < 0 || flat_of[d] < 0 || placed[d]) continue;
            int sl = g->vals[g->nodes[d].in[0]].def;
            order[k++] = sl, order[k++] = d;
            placed[sl] = placed[d] = 1;
        }
        order[k++] = i;
        placed[i] = 1;
    }
    for (int i = nold; i < n; i++)
        if (!placed[i]) order[k++] = i, placed[i] = 1;
    if (k != n) ICE("optimizer: placing the gathers lost nodes (%d of %d)", k, n);
    ir_reorder(g, order);
    free(order), free(first), free(placed);
}

/* --zero 1, the end of the step: reduce-scatter each flat's gradients (on
 * the comm stream, as soon as backward completes the flat), the global norm
 * from the shards, AdamW on this rank's shard of params and moments. */
static void update_sharded(Opt *b, const Options *o, Flat *f, int nf, int *gradv, const int *ps, int lr, int t, Loc gloc) {
    int *gs = malloc(sizeof(int) * (size_t)(nf ? nf : 1)), acc = -1;
    if (!gs) ICE("out of memory");
    for (int i = 0; i < nf; i++) {
        at_flat(b, &f[i]);
        gs[i] = comm(b, OP_reducescatter, gather_flat(b, &f[i], gradv), 1);
        if (f[i].replica) continue;
        int s = tp_once(b, ir_build1(&b->bld, OP_sumsq, gs[i], 0, NULL), f[i].tpsplit);
        b->bld.loc = gloc, b->bld.layer = -1;
        acc = acc < 0 ? s : ir_build2(&b->bld, OP_add, acc, s);
    }
    b->bld.loc = gloc, b->bld.layer = -1;
    if (acc < 0) error_at(gloc, "--dp: the model has no params to train");
    char ngb[32];
    Attr ng = ir_attr_str(b->m, "group", norm_group_tp(b->m, ngb, sizeof ngb));
    int norm = ir_build1(&b->bld, OP_sqrt, ir_build1(&b->bld, OP_allreduce, acc, 1, &ng), 0, NULL);
    sink(b, OP_output, norm, "grad_norm");
    Attr mx = ir_attr_float(b->m, "max", o->grad_clip);
    int scale = ir_build1(&b->bld, OP_clipscale, norm, 1, &mx);
    for (int i = 0; i < nf; i++) {
        at_flat(b, &f[i]);
        int mv = shard_state(b, &f[i], i, "opt.m.", "opt.m."), vv = shard_state(b, &f[i], i, "opt.v.", "opt.v.");
        int in[7] = {ps[i], gs[i], mv, vv, lr, scale, t};
        int n = ir_build(&b->bld, OP_adamw, 7, in, 4, adam_attrs(b, o, f[i].wd), NULL);
        const Graph *g = b->bld.g;
        for (int k = 0; k < 3; k++) {
            int v = g->nodes[n].out[k], src = g->vals[in[k == 0 ? 0 : k + 1]].def;
            split_over_group(b->bld.g, v);
            sink(b, OP_assign, v, ir_attr_s(&b->bld.g->nodes[src], "name", "?"));
        }
    }
    free(gs);
}

/* --zero 0: all-reduce each flat; every rank updates every param. */
static void reduce_all(Opt *b, Flat *f, int nf, int *gradv) {
    for (int i = 0; i < nf; i++) {
        at_flat(b, &f[i]);
        int r = comm(b, OP_allreduce, gather_flat(b, &f[i], gradv), 0);
        for (int k = 0; k < f[i].nmembers; k++) {
            int p = f[i].param[k];
            gradv[p] = member_of(b, &f[i], k, r);
            char name[512];
            snprintf(name, sizeof name, "grad:%s", ir_attr_s(&b->bld.g->nodes[p], "name", "?"));
            sink(b, OP_output, gradv[p], name);
        }
    }
}

static void optimize_stage(Module *m, int stage, const Options *o) {
    Graph *g = m->stages[stage];
    int *gradv = calloc((size_t)(g->nnodes ? g->nnodes : 1), sizeof(int));
    if (!gradv) ICE("out of memory");
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i].op == OP_param) gradv[i] = grad_of(g, i);
    int dp = red_size(m), nf = 0;
    Flat *flats = NULL;
    if (dp > 1) {
        drop_grad_outputs(g); /* params come first: their indices stay */
        for (int i = 0; i < g->nnodes; i++)
            if (gradv[i] && g->nodes[i].op != OP_param) ICE("optimizer: a param moved when grad outputs were dropped");
        flats = plan_flats(m, g, o, gradv, &nf);
    }
    int nfwd = g->nnodes;
    Opt b = {.m = m, .bld = {.g = g, .pass = "optimizer", .loc = loss_loc(g), .layer = -1, .phase = PH_OPT}, .stage = stage};
    Loc gloc = b.bld.loc;
    Type scalar = {.dt = DT_F32, .rank = 0};

    int step = find_state(g, "opt.step"); /* the front end's, when dropout reads the step (issue 17) */
    if (step < 0) step = source(&b, OP_state, "opt.step", scalar);
    Attr one_v = ir_attr_float(m, "v", 1.0);
    int one = ir_out(g, ir_build(&b.bld, OP_const, 0, NULL, 1, &one_v, &scalar));
    int t = ir_build2(&b.bld, OP_add, step, one);
    sink(&b, OP_assign, t, "opt.step");

    Attr sched[4] = {ir_attr_float(m, "lr", o->lr), ir_attr_float(m, "min_lr", o->min_lr),
                     num_attr(m, "warmup", o->warmup), num_attr(m, "total", o->steps)};
    int lr = ir_build1(&b.bld, OP_lr_cosine, t, 4, sched);
    sink(&b, OP_output, lr, "lr");

    if (dp > 1 && o->zero) {
        int nold = nfwd, *ps = malloc(sizeof(int) * (size_t)(nf ? nf : 1));
        Views vw = {calloc((size_t)g->nnodes + 1, sizeof(int)), calloc((size_t)(2 * nf + 1), sizeof(int))};
        if (!ps || !vw.reshape || !vw.gather) ICE("out of memory");
        gather_params(&b, flats, nf, ps, &vw, nold);
        update_sharded(&b, o, flats, nf, gradv, ps, lr, t, gloc);
        int *flat_of = malloc(sizeof(int) * (size_t)g->nnodes); /* per node: the flat a param view reshape belongs to */
        if (!flat_of) ICE("out of memory");
        for (int i = 0; i < g->nnodes; i++) flat_of[i] = -1;
        for (int i = 0; i < nf; i++)
            for (int k = 0; k < flats[i].nmembers; k++) flat_of[vw.reshape[flats[i].param[k]]] = i;
        place_gathers(g, &vw, nf, nold, flat_of);
        free(ps), free(vw.reshape), free(vw.gather), free(flat_of), free(gradv);
        return;
    }
    if (dp > 1) reduce_all(&b, flats, nf, gradv);
    b.bld.loc = gloc, b.bld.layer = -1;
    int norm = grad_norm(&b, nfwd, gradv);
    sink(&b, OP_output, norm, "grad_norm");
    Attr mx = ir_attr_float(m, "max", o->grad_clip);
    int scale = ir_build1(&b.bld, OP_clipscale, norm, 1, &mx);

    for (int i = 0; i < nfwd; i++)
        if (g->nodes[i].op == OP_param) update_param(&b, o, i, gradv[i], lr, scale, t);
    free(gradv);
}

void pass_optimizer(Module *m, const Options *o) {
    if (m->nstages != m->mesh[0] && m->nstages != 1) ICE("optimizer: %d stages for a pipeline axis of %d", m->nstages, m->mesh[0]);
    for (int s = 0; s < m->nstages; s++) optimize_stage(m, s, o);
}
