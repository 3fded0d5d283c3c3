/* parallelize.c — data parallelism and micro-batches: the step of one rank.
 *
 * Autodiff leaves the training step of the whole global batch on one
 * device: inputs [B, ...], the loss a mean over every token, gradients of
 * that mean.  This pass rewrites it into the program every rank of the
 * data-parallel group runs: each rank holds B/dp rows of every input and
 * processes them in M micro-batches of b = B/(dp*M) rows (gradient
 * accumulation), so the batch is cut into S = dp*M pieces.
 *
 * It works by sharding propagation, the way GSPMD and Megatron reason about
 * tensor layouts.  Every value of the global graph gets a sharding along the
 * batch: replicated (the same on every piece: params, positions), split on
 * a dim (each piece holds a slice: activations, split on the batch dim and
 * on whatever dim the batch dim becomes through reshapes and transposes), or
 * partial (each piece holds a summand of the value: the loss, whose mean is
 * a sum over pieces, and every weight gradient, which contracts the batch).
 * Inputs start split on dim 0; each op's rule (`rule`) derives its outputs'
 * shardings from its inputs', and names the model's line when an op cannot
 * take its inputs' layout (a max over the batch, a norm across it).
 *
 * Then the graph is rebuilt with local shapes.  Nodes that depend on the
 * batch are cloned once per micro-batch (Node.mb); replicated nodes are
 * built once, on first use.  A partial value that reaches an output is
 * accumulated over micro-batches with `add` as each micro-batch produces it
 * (f32, like Megatron's main_grad buffers).  Two rewrites keep the global
 * semantics exact:
 *   - `mean` over the split dim divides by the local count, so its result is
 *     multiplied by 1/S to become a summand of the global mean;
 *   - a replicated value that meets split values in an op (a bias broadcast
 *     to [B,T,C], the 1/N seed of the loss's gradient) is constant along the
 *     batch, so its local piece is the same chain built at the local shape
 *     (`uniform`, `localize`).  Constants keep their global values: the
 *     gradient of the global mean is 1/N_global per token on every piece.
 * Outputs: a partial output that is not a gradient (the loss) is all-reduced
 * over dp so every rank reports the global value; gradients "grad:<p>" stay
 * partial over dp (Value.sh[dp] = partial) for the optimizer, which reduces
 * them in buckets (all-reduce, or reduce-scatter for the distributed
 * optimizer).  With dp = M = 1 the pass only records the mesh.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln.h"

enum { AXIS_DP = 1 }; /* index of dp in Module.mesh and Value.sh */
enum { MAXIN = 64 };  /* inputs per node this pass handles */

typedef struct {
    Module *m;
    const Graph *g; /* the global graph */
    Graph *ng;      /* the rank's graph being built */
    Builder b;
    int dp, M, S;
    AxisShard *sh;  /* per global value: its sharding along the batch */
    int *conv;      /* per (node, input): >= 0: a replicated input used split on that dim */
    int *map;       /* [M][nvals]: the local value of a batch-dependent value in micro-batch i */
    int *rep;       /* per global value: its replicated clone, -1 until built */
    int *loc;       /* per global value: its localized (split) clone, -1 until built */
    int *acc;       /* per global value feeding a partial output: the running sum */
    char *to_acc;   /* per global value: feeds a partial output */
    int input0;     /* per-rank input values are created at first use */
    int *input;     /* per global input value: the rank's [B/dp, ...] input */
} Par;

static void *xcalloc(size_t n, size_t sz) {
    void *p = calloc(n ? n : 1, sz);
    if (!p) ICE("out of memory");
    return p;
}

static AxisShard REP = {SH_REP, 0}, PART = {SH_PARTIAL, 0};
static AxisShard split(int d) { return (AxisShard){SH_SPLIT, d}; }
static int is_rep(AxisShard s) { return s.kind == SH_REP; }
static int is_split(AxisShard s) { return s.kind == SH_SPLIT; }
static int is_part(AxisShard s) { return s.kind == SH_PARTIAL; }

static const Type *vtype(const Par *P, int v) { return &P->g->vals[v].t; }
static const Node *def_of(const Par *P, int v) {
    int d = P->g->vals[v].def;
    return d >= 0 ? &P->g->nodes[d] : NULL;
}

/* ======================================================================
 * Propagation
 * ====================================================================== */

/* The input dim of a reshape whose elements start where output dim od's do
 * and that has its size: a split there is the same split.  -1 if none. */
static int reshape_map(const Type *from, int d, const Type *to) {
    int64_t pre = 1;
    for (int k = 0; k < d; k++) pre *= from->dim[k];
    int64_t p = 1;
    for (int k = 0; k < to->rank; k++) {
        if (p == pre && to->dim[k] == from->dim[d]) return k;
        p *= to->dim[k];
    }
    return -1;
}

/* Where a split of a reshape's input on dim d lands in its output: the
 * output dim starting at the same element whose size the S pieces divide;
 * -1 if none (the split would not stay contiguous). */
static int reshape_split(const Type *in, int d, const Type *out, int S) {
    int64_t pre = 1;
    for (int k = 0; k < d; k++) pre *= in->dim[k];
    int64_t p = 1;
    for (int k = 0; k < out->rank; k++) {
        if (p == pre && out->dim[k] > 1 && out->dim[k] % S == 0) return k;
        p *= out->dim[k];
    }
    return -1;
}

/* 1 if v is the same along dim d (so each piece's slice is computable
 * locally): constants, broadcasts along d, and elementwise/reshape chains
 * of those. */
static int uniform(const Par *P, int v, int d) {
    const Node *n = def_of(P, v);
    if (!n || !is_rep(P->sh[v])) return 0;
    const Type *t = vtype(P, v);
    if (n->op == OP_const) return 1;
    if (n->op == OP_broadcast) {
        const Type *x = vtype(P, n->in[0]);
        int di = d - (t->rank - x->rank);
        return di < 0 || x->dim[di] == 1 || uniform(P, n->in[0], di);
    }
    if (n->op == OP_reshape) {
        int di = reshape_map(t, d, vtype(P, n->in[0]));
        return di >= 0 && uniform(P, n->in[0], di);
    }
    if (ir_ops[n->op].flags & F_ELEMENTWISE) {
        for (int k = 0; k < n->nin; k++)
            if (!uniform(P, n->in[k], d)) return 0;
        return 1;
    }
    return 0;
}

/* The dim every split input of ks[] shares; replicated inputs must be
 * uniform along it (conv[k] = d).  -1: all replicated.  -2: no common
 * layout (a message in why). */
static int unify(Par *P, const Node *n, const int *ks, int nk, int *conv, const char **why) {
    int d = -1;
    for (int j = 0; j < nk; j++) {
        AxisShard s = P->sh[n->in[ks[j]]];
        if (is_part(s)) return *why = "an input is a partial sum", -2;
        if (is_split(s)) {
            if (d >= 0 && s.dim != d) return *why = "inputs are split on different dims", -2;
            d = s.dim;
        }
    }
    if (d < 0) return -1;
    for (int j = 0; j < nk; j++) {
        int v = n->in[ks[j]];
        if (!is_rep(P->sh[v])) continue;
        if (d >= vtype(P, v)->rank || !uniform(P, v, d)) return *why = "a replicated input meets inputs split on the batch", -2;
        conv[ks[j]] = d;
    }
    return d;
}

static int linear_in_partial(const Par *P, const Node *n) {
    int np = 0;
    for (int k = 0; k < n->nin; k++) np += is_part(P->sh[n->in[k]]);
    switch (n->op) {
    case OP_add: case OP_sub: return np == 2;
    case OP_neg: case OP_cast: return 1;
    case OP_mul: for (int k = 0; k < 2; k++) if (!is_part(P->sh[n->in[k]]) && !is_rep(P->sh[n->in[k]])) return 0; return np == 1;
    case OP_div: return is_part(P->sh[n->in[0]]) && is_rep(P->sh[n->in[1]]);
    default: return 0;
    }
}

static const char *rule_matmul(Par *P, const Node *n, AxisShard *out) {
    AxisShard a = P->sh[n->in[0]], b = P->sh[n->in[1]];
    const Type *ta = vtype(P, n->in[0]), *tb = vtype(P, n->in[1]);
    int ra = ta->rank, rb = tb->rank, ro = ra > rb ? ra : rb;
    int TA = (int)ir_attr_i(n, "ta", 0), TB = (int)ir_attr_i(n, "tb", 0);
    int a_m = TA ? ra - 1 : ra - 2, a_k = TA ? ra - 2 : ra - 1;
    int b_k = TB ? rb - 1 : rb - 2, b_n = TB ? rb - 2 : rb - 1;
    if ((is_part(a) && is_rep(b)) || (is_rep(a) && is_part(b))) return *out = PART, NULL;
    if (is_split(a) && is_split(b) && a.dim == a_k && b.dim == b_k) return *out = PART, NULL;
    if (is_split(a) && a.dim < ra - 2 && (rb == 2 ? is_rep(b) : is_split(b) && b.dim == a.dim + rb - ra))
        return *out = split(a.dim + ro - ra), NULL;
    if (is_split(a) && a.dim == a_m && is_rep(b)) return *out = split(ro - 2), NULL;
    if (is_rep(a) && is_split(b) && b.dim == b_n) return *out = split(ro - 1), NULL;
    return "matmul: the inputs' layouts along the batch do not combine";
}

/* Output shardings of node n from its inputs'; NULL, or why not. */
static const char *rule(Par *P, const Node *n, AxisShard out[], int *conv) {
    int all_rep = 1;
    for (int k = 0; k < n->nin; k++) all_rep &= is_rep(P->sh[n->in[k]]);
    for (int k = 0; k < n->nout; k++) out[k] = REP;
    if (n->op == OP_input) return out[0] = split(0), NULL;
    if (all_rep) return NULL;
    const char *why = "";
    unsigned f = ir_ops[n->op].flags;
    if (n->nin > MAXIN) ICE("parallelize: node with %d inputs", n->nin);
    AxisShard x = P->sh[n->in[0]];
    const Type *tx = vtype(P, n->in[0]);
    int r = tx->rank, dim = (int)ir_attr_i(n, "dim", 0), ks[MAXIN];
    for (int k = 0; k < MAXIN; k++) ks[k] = k;
    if (n->op == OP_output) return NULL;
    if (f & F_ELEMENTWISE) {
        int any_part = 0;
        for (int k = 0; k < n->nin; k++) any_part |= is_part(P->sh[n->in[k]]);
        if (any_part) return linear_in_partial(P, n) ? (out[0] = PART, NULL) : "a partial sum goes through a non-linear op";
        int d = unify(P, n, ks, n->nin, conv, &why);
        return d < -1 ? why : (out[0] = split(d), NULL);
    }
    switch (n->op) {
    case OP_sum: case OP_mean: case OP_max: case OP_sumsq:
        if (is_part(x)) return n->op == OP_sum || n->op == OP_mean ? (out[0] = PART, NULL) : "max/sumsq of a partial sum";
        if (n->op == OP_sumsq || dim == x.dim) return n->op == OP_max ? "max over the batch" : (out[0] = PART, NULL);
        return out[0] = split(x.dim - (!ir_attr_i(n, "keep", 0) && dim < x.dim)), NULL;
    case OP_max_bwd: /* (dy, x, y): dy and y have x's layout with dim reduced */
        if (!is_split(x) || x.dim == dim || !is_split(P->sh[n->in[0]]) || !is_split(P->sh[n->in[2]])) return "max_bwd over the batch";
        return out[0] = P->sh[n->in[1]], NULL;
    case OP_reshape: {
        if (is_part(x)) return out[0] = PART, NULL;
        int d = reshape_split(tx, x.dim, &P->g->vals[n->out[0]].t, P->S);
        return d < 0 ? "a reshape that breaks the batch split" : (out[0] = split(d), NULL);
    }
    case OP_transpose: {
        if (is_part(x)) return out[0] = PART, NULL;
        int a = (int)ir_attr_i(n, "a", 0), b = (int)ir_attr_i(n, "b", 0);
        return out[0] = split(x.dim == a ? b : x.dim == b ? a : x.dim), NULL;
    }
    case OP_slice:
        if (is_part(x)) return out[0] = PART, NULL;
        return x.dim == dim ? "a slice of the batch dim" : (out[0] = x, NULL);
    case OP_concat: {
        int d = unify(P, n, ks, n->nin, conv, &why);
        return d < -1 ? why : d == dim ? "a concat along the batch dim" : (out[0] = split(d), NULL);
    }
    case OP_broadcast: {
        if (is_part(x)) return out[0] = PART, NULL;
        return out[0] = split(x.dim + P->g->vals[n->out[0]].t.rank - r), NULL;
    }
    case OP_sumto: {
        if (is_part(x)) return out[0] = PART, NULL;
        const Type *to = &P->g->vals[n->out[0]].t;
        int od = x.dim - (r - to->rank);
        return out[0] = od < 0 || to->dim[od] != tx->dim[x.dim] ? PART : split(od), NULL;
    }
    case OP_layernorm: case OP_rmsnorm: case OP_softmax:
        if (!is_split(x) || x.dim >= r - 1) return "a norm or softmax across the batch";
        for (int k = 1; k < n->nin; k++)
            if (!is_rep(P->sh[n->in[k]])) return "a split norm weight";
        return out[0] = x, NULL;
    case OP_layernorm_bwd: case OP_rmsnorm_bwd: case OP_softmax_bwd: {
        int d = unify(P, n, ks, 2, conv, &why);
        if (d < -1) return why;
        if (d < 0 || d >= r - 1 || (n->nin > 2 && !is_rep(P->sh[n->in[2]]))) return "a norm backward across the batch";
        out[0] = split(d);
        for (int k = 1; k < n->nout; k++) out[k] = PART;
        return NULL;
    }
    case OP_rope: case OP_rope_bwd:
        if (!is_split(x) || (x.dim != 0 && x.dim != 2) || !is_rep(P->sh[n->in[1]])) return "rope across positions";
        return out[0] = x, NULL;
    case OP_attention: case OP_attention_bwd: {
        int d = unify(P, n, ks, n->nin, conv, &why);
        if (d < -1) return why;
        if (d != 0) return "attention split other than on the batch";
        for (int k = 0; k < n->nout; k++) out[k] = split(0);
        return NULL;
    }
    case OP_embedding:
        if (!is_rep(x)) return "a split embedding table";
        if (!is_split(P->sh[n->in[1]])) return "embedding ids";
        return out[0] = P->sh[n->in[1]], NULL;
    case OP_embedding_bwd:
        if (is_part(x) && is_rep(P->sh[n->in[1]])) return out[0] = PART, NULL;
        return unify(P, n, ks, 2, conv, &why) < 0 ? "embedding_bwd layouts" : (out[0] = PART, NULL);
    case OP_cross_entropy: case OP_cross_entropy_bwd: {
        int d = unify(P, n, ks, n->nin, conv, &why);
        if (d < -1) return why;
        return d < 0 || d >= vtype(P, n->in[n->nin - 2])->rank - 1 ? "cross entropy across the vocabulary" : (out[0] = split(d), NULL);
    }
    case OP_matmul:
        return rule_matmul(P, n, &out[0]);
    case OP_loss:
        return is_part(x) ? (out[0] = PART, NULL) : "the loss is not a reduction over the batch";
    default:
        ICE("parallelize: %s after autodiff and before the optimizer", ir_ops[n->op].name);
    }
}

static void propagate(Par *P) {
    const Graph *g = P->g;
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        AxisShard out[8];
        const char *why = rule(P, n, out, &P->conv[(size_t)i * MAXIN]);
        if (why) error_at(n->loc, "%s cannot be split over the batch (dp %d x micro-batches %d): %s", ir_ops[n->op].name,
                          P->dp, P->M, why);
        for (int k = 0; k < n->nout; k++) P->sh[n->out[k]] = out[k];
    }
}

/* ======================================================================
 * Building the rank's graph
 * ====================================================================== */

static Type local_type(const Par *P, const Type *t, AxisShard s, Loc loc) {
    Type l = *t;
    if (is_split(s)) {
        if (t->dim[s.dim] % P->S) error_at(loc, "dim %d of size %lld is not divisible by dp %d x micro-batches %d", s.dim + 1,
                                           (long long)t->dim[s.dim], P->dp, P->M);
        l.dim[s.dim] /= P->S;
    }
    return l;
}

/* The node's attrs with {shape} replaced by the local output shape. */
static const Attr *local_attrs(Par *P, const Node *n, const Type *lt) {
    if (!ir_attr(n, "shape")) return n->attr;
    Attr *a = ir_alloc(P->m, sizeof(Attr) * (size_t)n->nattr);
    for (int k = 0; k < n->nattr; k++)
        a[k] = strcmp(n->attr[k].key, "shape") ? n->attr[k] : ir_attr_ints(P->m, "shape", lt->dim, lt->rank);
    return a;
}

static void set_sh(Par *P, int nv, AxisShard s) {
    if (P->dp > 1) P->ng->vals[nv].sh[AXIS_DP] = s;
}

/* Clone global node n with new inputs and local output types; returns the
 * new node index. */
static int clone(Par *P, const Node *n, const int *in, int mb, const AxisShard *osh) {
    if (!n->nout) ICE("parallelize: clone of a sink");
    Type lt = local_type(P, &P->g->vals[n->out[0]].t, osh[0], n->loc);
    P->b.loc = n->loc, P->b.layer = n->layer, P->b.phase = n->phase;
    int j = ir_build(&P->b, n->op, n->nin, in, n->nattr, local_attrs(P, n, &lt),
                     ir_ops[n->op].flags & F_SOURCE ? &lt : NULL);
    P->ng->nodes[j].mb = mb;
    for (int k = 0; k < n->nout; k++) set_sh(P, P->ng->nodes[j].out[k], osh[k]);
    return j;
}

static int rep_of(Par *P, int v);

/* The local slice of replicated value v (uniform along d) in the rank's graph. */
static int localize(Par *P, int v, int d) {
    if (P->loc[v] >= 0) return P->loc[v];
    const Node *n = def_of(P, v);
    int in[MAXIN];
    for (int k = 0; k < n->nin; k++) {
        const Type *t = vtype(P, v), *x = vtype(P, n->in[k]);
        int di = n->op == OP_broadcast ? d - (t->rank - x->rank) : n->op == OP_reshape ? reshape_map(t, d, x) : d;
        in[k] = n->op == OP_broadcast && (di < 0 || x->dim[di] == 1) ? rep_of(P, n->in[k]) : localize(P, n->in[k], di);
    }
    AxisShard s = split(d);
    int j = clone(P, n, in, 0, &s);
    set_sh(P, ir_out(P->ng, j), REP); /* the same on every rank */
    return P->loc[v] = ir_out(P->ng, j);
}

/* The clone of replicated value v, built on first use. */
static int rep_of(Par *P, int v) {
    if (P->rep[v] >= 0) return P->rep[v];
    const Node *n = def_of(P, v);
    int in[MAXIN];
    for (int k = 0; k < n->nin; k++) in[k] = rep_of(P, n->in[k]);
    AxisShard osh[8] = {REP, REP, REP, REP, REP, REP, REP, REP};
    int j = clone(P, n, in, 0, osh);
    for (int k = 0; k < n->nout; k++) P->rep[n->out[k]] = P->ng->nodes[j].out[k];
    return P->rep[v];
}

static int const_like(Par *P, const Type *t, double v) {
    Attr a = ir_attr_float(P->m, "v", v);
    return ir_out(P->ng, ir_build(&P->b, OP_const, 0, NULL, 1, &a, t));
}

/* Micro-batch mb's rows of input node n: a slice of the rank's input. */
static int input_of(Par *P, const Node *n, int mb) {
    int v = n->out[0];
    P->b.loc = n->loc, P->b.layer = n->layer, P->b.phase = n->phase;
    if (P->input[v] < 0) {
        Type t = *vtype(P, v);
        t.dim[0] /= P->dp;
        P->input[v] = ir_out(P->ng, ir_build(&P->b, OP_input, 0, NULL, n->nattr, n->attr, &t));
        set_sh(P, P->input[v], split(0));
    }
    if (P->M == 1) return P->input[v];
    int64_t b = vtype(P, v)->dim[0] / P->S;
    Attr at[3] = {ir_attr_int(P->m, "dim", 0), ir_attr_int(P->m, "start", mb * b), ir_attr_int(P->m, "end", (mb + 1) * b)};
    int s = ir_build1(&P->b, OP_slice, P->input[v], 3, at);
    P->ng->nodes[P->ng->vals[s].def].mb = mb;
    set_sh(P, s, split(0));
    return s;
}

/* Node n of micro-batch mb, its inputs converted as the rule said. */
static void build_node(Par *P, int i, int mb) {
    const Node *n = &P->g->nodes[i];
    int *map = P->map + (size_t)mb * (size_t)P->g->nvals;
    if (n->op == OP_input) {
        map[n->out[0]] = input_of(P, n, mb);
        return;
    }
    int in[MAXIN];
    for (int k = 0; k < n->nin; k++) {
        int v = n->in[k], c = P->conv[(size_t)i * MAXIN + (size_t)k];
        in[k] = !is_rep(P->sh[v]) ? map[v] : c >= 0 ? localize(P, v, c) : rep_of(P, v);
    }
    AxisShard osh[8];
    for (int k = 0; k < n->nout; k++) osh[k] = P->sh[n->out[k]];
    int j = clone(P, n, in, mb, osh);
    int out0 = ir_out(P->ng, j);
    if (n->op == OP_mean && is_split(P->sh[n->in[0]]) && P->sh[n->in[0]].dim == ir_attr_i(n, "dim", 0)) {
        /* local mean / S = this piece's summand of the global mean */
        int c = const_like(P, &P->ng->vals[out0].t, 1.0 / P->S);
        out0 = ir_build2(&P->b, OP_mul, out0, c);
        P->ng->nodes[P->ng->vals[out0].def].mb = mb;
        set_sh(P, out0, PART);
    }
    for (int k = 0; k < n->nout; k++) {
        int v = n->out[k], nv = k ? P->ng->nodes[j].out[k] : out0;
        map[v] = nv;
        if (!P->to_acc[v]) continue;
        P->acc[v] = mb == 0 ? nv : ir_build2(&P->b, OP_add, P->acc[v], nv);
        P->ng->nodes[P->ng->vals[P->acc[v]].def].mb = mb;
        set_sh(P, P->acc[v], PART);
    }
}

/* A batch-dependent node: an input, or a node with a non-replicated input. */
static int batch_dependent(const Par *P, const Node *n) {
    if (n->op == OP_input) return 1;
    for (int k = 0; k < n->nin; k++)
        if (!is_rep(P->sh[n->in[k]])) return 1;
    return 0;
}

static int is_grad_output(const Node *n) { return strncmp(ir_attr_s(n, "name", ""), "grad:", 5) == 0; }

/* The output nodes, after the last micro-batch: partial values are the
 * accumulated sums; a partial that is not a gradient is all-reduced. */
static void build_output(Par *P, const Node *n) {
    int v = n->in[0], x;
    P->b.loc = n->loc, P->b.layer = n->layer, P->b.phase = n->phase;
    if (is_split(P->sh[v])) error_at(n->loc, "output %s is split over the batch; only sums and replicated values can be outputs with dp or micro-batches", ir_attr_s(n, "name", "?"));
    if (is_part(P->sh[v])) {
        x = P->acc[v];
        if (P->dp > 1 && !is_grad_output(n)) {
            Attr g = ir_attr_str(P->m, "group", "dp");
            x = ir_build1(&P->b, OP_allreduce, x, 1, &g);
            set_sh(P, x, REP);
        }
    } else {
        x = rep_of(P, v);
    }
    int j = ir_build(&P->b, OP_output, 1, &x, n->nattr, n->attr, NULL);
    P->ng->nodes[j].mb = P->M - 1;
}

void pass_parallelize(Module *m, const Options *o) {
    if (m->nstages != 1) ICE("parallelize: expects one stage, got %d", m->nstages);
    m->mesh[0] = o->pp, m->mesh[1] = o->dp, m->mesh[2] = o->cp, m->mesh[3] = o->tp;
    int M = o->micro_batches > 0 ? o->micro_batches : 1;
    if (o->dp * M == 1) return;
    const Graph *g = m->stages[0];
    int nv = g->nvals;
    Par P = {.m = m, .g = g, .dp = o->dp, .M = M, .S = o->dp * M};
    P.ng = ir_graph_new(m);
    P.b = (Builder){.g = P.ng, .pass = "parallelize", .layer = -1};
    P.sh = xcalloc((size_t)nv, sizeof(AxisShard));
    P.conv = xcalloc((size_t)g->nnodes * MAXIN, sizeof(int));
    P.map = xcalloc((size_t)nv * (size_t)M, sizeof(int));
    P.rep = xcalloc((size_t)nv, sizeof(int));
    P.loc = xcalloc((size_t)nv, sizeof(int));
    P.acc = xcalloc((size_t)nv, sizeof(int));
    P.input = xcalloc((size_t)nv, sizeof(int));
    P.to_acc = xcalloc((size_t)nv, 1);
    for (size_t i = 0; i < (size_t)g->nnodes * MAXIN; i++) P.conv[i] = -1;
    for (int v = 0; v < nv; v++) P.rep[v] = P.loc[v] = P.acc[v] = P.input[v] = -1;
    for (size_t k = 0; k < (size_t)nv * (size_t)M; k++) P.map[k] = -1;

    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        const Type *t = n->op == OP_input ? &g->vals[n->out[0]].t : NULL;
        if (t && (t->rank < 1 || t->dim[0] % P.S))
            error_at(n->loc, "input %s: the global batch %lld is not divisible by dp %d x micro-batches %d",
                     ir_attr_s(n, "name", "?"), t->rank ? (long long)t->dim[0] : 0LL, P.dp, P.M);
    }
    propagate(&P);
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i].op == OP_output && is_part(P.sh[g->nodes[i].in[0]])) P.to_acc[g->nodes[i].in[0]] = 1;

    /* params and states first, in their order (the params space keeps it) */
    for (int i = 0; i < g->nnodes; i++)
        if (ir_ops[g->nodes[i].op].flags & F_STATE) rep_of(&P, g->nodes[i].out[0]);
    for (int mb = 0; mb < M; mb++)
        for (int i = 0; i < g->nnodes; i++)
            if (g->nodes[i].op != OP_output && batch_dependent(&P, &g->nodes[i])) build_node(&P, i, mb);
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i].op == OP_output) build_output(&P, &g->nodes[i]);

    m->stages[0] = P.ng;
    free(P.sh), free(P.conv), free(P.map), free(P.rep), free(P.loc), free(P.acc), free(P.input), free(P.to_acc);
}
