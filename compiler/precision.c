/* precision.c — the GPU's mixed-precision training step, written as IR
 * (DESIGN.md §6, docs/cuda.md "Decisions: precision").
 *
 * The front end, autodiff and the optimizer build an f32 step, which is what
 * the CPU runs.  On the GPU the weights' working copies, the activations and
 * the activation gradients are bf16; the master weights, the gradients of the
 * params (and their accumulation), the optimizer and the loss stay f32.  This
 * pass rewrites the step into that form when o->precision_bf16 is set (after
 * `optimizer`, before `fuse`); otherwise it leaves the module untouched.  The
 * new types are what ir_infer derives, so the interpreter (which rounds every
 * value to its dtype) runs the bf16 step as the GPU will, and the emitters can
 * map dtypes one to one.
 *
 * What the pass decides; everything else follows from ir_infer:
 *
 *   masters   params, states and float inputs, and the values communication
 *             or shape nodes make from masters only (--zero 1's all-gathered
 *             f32 views of the params).  Every master that a fwd, bwd or
 *             recompute node reads gets ONE `cast {dtype="bf16"}` (phase
 *             fwd, the master's Loc and layer), placed right before its first
 *             such reader, and those readers read the copy.  Optimizer-phase
 *             nodes keep reading the f32 master.
 *   gradients the nodes that produce a param's gradient write f32 directly
 *             ({out_dtype}, see ir.c and docs/ir.md): found by following each
 *             `output {name="grad:<p>"}` (with dp > 1, which replaces those
 *             outputs by the reduced gradients: each adamw's gradient operand)
 *             back through the accumulation adds, communication and shape
 *             nodes to the nodes that make the
 *             contributions (a matmul's dW, a bias's sumto, layernorm_bwd's
 *             dw and db, embedding_bwd's dtable).  The accumulation itself
 *             then adds f32 values, in f32.
 *   constants float consts in phases fwd, bwd and recompute are bf16, except
 *             those in the f32 region: a const whose value reaches, through
 *             elementwise, shape, reduction and communication nodes only, an
 *             input that an op's rule fixes at f32 (the loss; cross_entropy_bwd's
 *             dl; attention_bwd's lse; attn_merge's lse) stays f32.  That
 *             keeps the loss, its mean and the mean's backward (the 1/N seed
 *             of cross_entropy_bwd) in f32.
 *   repairs   where a node would still see mixed float dtypes (an f32 value
 *             met by a bf16 one in an elementwise node, a bf16 value at an
 *             f32 input, an optimizer node reading bf16), the bf16 input is
 *             cast to f32 right before the node, in the node's phase.  The
 *             models in models/ need none of these.
 *
 *   wires     (--pp) a send/recv over group "pp" carries bf16 (activations
 *             and their gradients, as on one device) unless it carries a
 *             param's gradient partial sum (the tied embedding's head
 *             contributions from the last stage, the total sent back to the
 *             replica): f32, decided over all stages at once (find_wires) so
 *             both ends agree; the send's producers then write f32 too.  The
 *             stages without the loss report a 0 for it, kept f32 (output
 *             "loss" is an f32 input).
 *
 * Values whose dtype an op fixes at f32 (cross_entropy's loss, attention's
 * and attn_merge's lse, sumsq) stay f32 by ir_infer.  The optimizer phase
 * reads only masters and f32 gradients, so it is unchanged and f32.
 *
 * The rewrite copies the graph node by node as recompute.c does (copy_node),
 * with a map from old values to new ones.  It runs once: run on its own
 * output it would cast the casts.
 */
#include <stdlib.h>
#include <string.h>

#include "live.h"
#include "passes.h"

typedef struct {
    const Graph *g;
    Builder b;
    int *map;        /* old value -> new value */
    int *copy;       /* old master value -> its bf16 copy in the new graph, -1 */
    char *master;    /* old value: an f32 master (param, state, float input, or a view of masters) */
    char *want32;    /* old value: in the f32 region (feeds an input fixed at f32) */
    unsigned *grad;  /* old node: bit k set when output k is a param gradient */
    int *sent;       /* old node: a send's new input value (what its recv receives), -1 */
    const char *wire32; /* per pipeline tag: 1 when the transfer carries f32 (see pass_precision) */
} Pc;

static const Node *def_of(const Graph *g, int v) { return g->vals[v].def >= 0 ? &g->nodes[g->vals[v].def] : NULL; }
static int is_float(const Graph *g, int v) { return ir_dtype_is_float(g->vals[v].t.dt); }
static int working(const Node *n) { return n->phase != PH_OPT; }
static int over_pp(const Node *n) {
    return (n->op == OP_send || n->op == OP_recv || n->op == OP_recv_start) && strcmp(ir_attr_s(n, "group", ""), "pp") == 0;
}

/* An input slot whose dtype the op's rule (ir.c) fixes at f32. */
static int f32_slot(const Node *n, int k) {
    if (ir_ops[n->op].flags & F_LOSS) return k == 0;
    switch (n->op) {
    case OP_cross_entropy_bwd: return k == 0;
    case OP_attention_bwd: return k == 5;
    case OP_attn_merge: return k == 1 || k == 3;
    case OP_dropout: return k == 1; /* the step counter, read as the f32 master (issue 17) */
    case OP_output: return strcmp(ir_attr_s(n, "name", ""), "loss") == 0; /* --pp: the stages without the loss report 0 */
    default: return 0;
    }
}

/* Ops whose float output has their float inputs' dtype (elementwise, shape,
 * reduction, communication), save those with a dtype of their own. */
static int follows_inputs(const Node *n) {
    unsigned fl = ir_ops[n->op].flags;
    if (fl & F_SOURCE || n->op == OP_cast || n->op == OP_sumsq) return 0;
    return (fl & (F_ELEMENTWISE | F_SHAPE | F_REDUCTION | F_COMM)) != 0;
}

/* ---- the analyses, on the old graph ---- */

/* masters: params, states, float inputs; and the gathered views: what
 * communication makes from masters, and shape nodes from gathered values
 * (--zero 1's all-gather, slice, reshape).  A broadcast of a param is not
 * a view: it reads the param's copy. */
static void find_masters(Pc *P) {
    const Graph *g = P->g;
    char *gathered = xcalloc((size_t)g->nvals, 1);
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        if (n->nout < 1 || !is_float(g, n->out[0])) continue;
        unsigned fl = ir_ops[n->op].flags;
        int src = n->op == OP_param || n->op == OP_state || n->op == OP_input, view = 0;
        if (!(fl & F_SOURCE) && fl & (F_SHAPE | F_COMM) && n->nin > 0) {
            view = 1;
            for (int k = 0; k < n->nin; k++)
                if (is_float(g, n->in[k]) && !(fl & F_COMM ? P->master[n->in[k]] : gathered[n->in[k]])) view = 0;
        }
        for (int k = 0; k < n->nout; k++) P->master[n->out[k]] |= src || view, gathered[n->out[k]] |= view;
    }
    free(gathered);
}

/* --zero 1's gathers in bf16: an all-gather of a master state (a flat's
 * shard) whose gathered views (the gather's output and the shape and
 * communication nodes made from it) are read only by fwd, bwd and recompute
 * nodes at inputs not fixed at f32 gathers the shard's bf16 copy instead:
 * its closure stops being a master, so the gather reads copy_of(shard) (one
 * cast of the shard, before the gather) and its readers the bf16 views.  A
 * cast commutes with moving elements, so every reader sees the same bf16
 * values as from a cast of the f32 view, and the gather moves, and the
 * arena holds, 2 bytes a parameter instead of 4 (+ 2 for the casts). */
static void gather_bf16(Pc *P) {
    const Graph *g = P->g;
    char *bad = xcalloc((size_t)g->nvals, 1), *view = xcalloc((size_t)g->nvals, 1);
    for (int i = 0; i < g->nnodes; i++) { /* the gathered views, and which have a reader that needs the f32 */
        const Node *n = &g->nodes[i];
        int gather = n->op == OP_allgather && def_of(g, n->in[0]) && def_of(g, n->in[0])->op == OP_state;
        int from_view = n->nout > 0 && P->master[n->out[0]] && !(ir_ops[n->op].flags & F_SOURCE) && view[n->in[0]];
        if (gather || from_view) {
            for (int k = 0; k < n->nout; k++) view[n->out[k]] = 1;
            continue;
        }
        for (int k = 0; k < n->nin; k++)
            if (view[n->in[k]] && (!working(n) || f32_slot(n, k))) bad[n->in[k]] = 1;
    }
    for (int i = g->nnodes - 1; i >= 0; i--) { /* a view's bad reader spoils what it was made from */
        const Node *n = &g->nodes[i];
        if (n->nout < 1 || n->op == OP_allgather || !view[n->out[0]]) continue;
        for (int k = 0; k < n->nout; k++)
            if (bad[n->out[k]]) bad[n->in[0]] = 1;
    }
    for (int i = 0; i < g->nnodes; i++) { /* a gather whose closure is clean: no longer masters */
        const Node *n = &g->nodes[i];
        if (n->nout < 1 || !view[n->out[0]]) continue;
        int root = n->op == OP_allgather ? n->out[0] : -1;
        if (root < 0 && P->master[n->in[0]]) continue; /* its source kept the f32 */
        if (root >= 0 && bad[root]) continue;
        for (int k = 0; k < n->nout; k++) P->master[n->out[k]] = 0;
    }
    free(bad), free(view);
}

/* want32: backwards from the inputs fixed at f32 through the nodes whose
 * dtype follows their inputs. */
static void find_f32_region(Pc *P) {
    const Graph *g = P->g;
    for (int i = g->nnodes - 1; i >= 0; i--) {
        const Node *n = &g->nodes[i];
        if (!working(n)) continue;
        for (int k = 0; k < n->nin; k++)
            if (f32_slot(n, k)) P->want32[n->in[k]] = 1;
        int wanted = 0;
        for (int k = 0; k < n->nout; k++) wanted |= P->want32[n->out[k]];
        if (wanted && follows_inputs(n))
            for (int k = 0; k < n->nin; k++)
                if (is_float(g, n->in[k])) P->want32[n->in[k]] = 1;
    }
}

/* Mark the producers of gradient value v: through accumulation adds,
 * communication and shape nodes, to the nodes that make the contributions. */
static void mark_producers(Pc *P, int v, int depth) {
    const Graph *g = P->g;
    const Node *d = def_of(g, v);
    if (!d || !is_float(g, v) || depth > g->nnodes) return;
    unsigned fl = ir_ops[d->op].flags;
    if (d->op == OP_add || (!(fl & F_SOURCE) && fl & (F_COMM | F_SHAPE))) {
        for (int k = 0; k < d->nin; k++) mark_producers(P, d->in[k], depth + 1);
        return;
    }
    P->grad[g->vals[v].def] |= 1u << g->vals[v].defout;
}

static void find_gradients(Pc *P) {
    const Graph *g = P->g;
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        if (n->op == OP_output && strncmp(ir_attr_s(n, "name", ""), "grad:", 5) == 0) mark_producers(P, n->in[0], 0);
        if (n->op == OP_adamw) mark_producers(P, n->in[1], 0); /* dp > 1: the reduced gradient replaces the outputs */
    }
}

/* ---- the rewrite ---- */

static int copy_node(Pc *P, const Node *n, const int *in, int nattr, const Attr *attr, const Type *src) {
    P->b.loc = n->loc, P->b.layer = n->layer, P->b.phase = n->phase;
    int j = ir_build(&P->b, n->op, n->nin, in, nattr, attr, src);
    Node *c = &P->b.g->nodes[j];
    c->stage = n->stage, c->vstage = n->vstage, c->mb = n->mb;
    for (int k = 0; k < n->nout; k++) memcpy(P->b.g->vals[c->out[k]].sh, P->g->vals[n->out[k]].sh, sizeof P->g->vals[0].sh);
    return j;
}

/* cast new value x to dtype dt, built with node `like`'s metadata and phase */
static int cast_to(Pc *P, int x, DType dt, const Node *like, Phase phase) {
    Module *m = P->b.g->m;
    Attr a = ir_attr_str(m, "dtype", ir_dtype_names[dt]);
    P->b.loc = like->loc, P->b.layer = like->layer, P->b.phase = phase;
    int j = ir_build(&P->b, OP_cast, 1, &x, 1, &a, NULL);
    Node *c = &P->b.g->nodes[j];
    c->stage = like->stage, c->vstage = like->vstage, c->mb = like->mb;
    memcpy(P->b.g->vals[c->out[0]].sh, P->b.g->vals[x].sh, sizeof P->b.g->vals[0].sh);
    return c->out[0];
}

/* the bf16 copy of old master value v (built on first use) */
static int copy_of(Pc *P, int v) {
    if (P->copy[v] < 0) P->copy[v] = cast_to(P, P->map[v], DT_BF16, def_of(P->g, v), PH_FWD);
    return P->copy[v];
}

static DType new_dt(const Pc *P, int nv) { return P->b.g->vals[nv].t.dt; }

/* The repairs: mixed float dtypes where the op wants one, bf16 at an f32
 * input, an optimizer node reading bf16 -> cast that input to f32. */
static void repair_inputs(Pc *P, const Node *n, int *in) {
    int has32 = 0, has16 = 0;
    for (int k = 0; k < n->nin; k++) {
        if (!ir_dtype_is_float(new_dt(P, in[k])) || f32_slot(n, k)) continue;
        has32 |= new_dt(P, in[k]) == DT_F32, has16 |= new_dt(P, in[k]) == DT_BF16;
    }
    int promote = n->phase == PH_OPT || (has32 && has16 && follows_inputs(n));
    for (int k = 0; k < n->nin; k++)
        if (new_dt(P, in[k]) == DT_BF16 && (promote || f32_slot(n, k))) in[k] = cast_to(P, in[k], DT_F32, n, n->phase);
}

/* out_dtype for a gradient producer: "f32", or one entry per output */
static Attr grad_attr(Pc *P, const Node *n) {
    char spec[64] = "";
    if (n->nout == 1) return ir_attr_str(P->b.g->m, "out_dtype", "f32");
    if (n->nout > 8) ICE("precision: %s has %d outputs", ir_ops[n->op].name, n->nout);
    for (int k = 0; k < n->nout; k++) {
        strcat(spec, k ? "," : "");
        strcat(spec, P->grad[n - P->g->nodes] >> k & 1 ? "f32" : "-");
    }
    return ir_attr_str(P->b.g->m, "out_dtype", spec);
}

/* a node that makes a master from masters (a gathered view) reads the f32 */
static int makes_master(const Pc *P, const Node *n) { return n->nout > 0 && P->master[n->out[0]]; }

/* the dtype a transfer between pipeline stages carries */
static DType wire_dt(const Pc *P, const Node *n) { return P->wire32[ir_attr_i(n, "tag", 0)] ? DT_F32 : DT_BF16; }

static void rewrite_node(Pc *P, const Node *n) {
    const Graph *g = P->g;
    int i = (int)(n - g->nodes);
    int *in = xcalloc((size_t)n->nin, sizeof(int));
    int reads_copy = working(n) && !makes_master(P, n);
    for (int k = 0; k < n->nin; k++) {
        int u = n->in[k];
        in[k] = reads_copy && P->master[u] && is_float(g, u) && !f32_slot(n, k) ? copy_of(P, u) : P->map[u];
    }
    repair_inputs(P, n, in);
    Type src, *srcp = NULL;
    if (ir_ops[n->op].flags & F_SOURCE) {
        src = g->vals[n->out[0]].t, srcp = &src;
        if (n->op == OP_const && working(n) && src.dt == DT_F32 && !P->want32[n->out[0]] && !P->grad[i]) src.dt = DT_BF16;
        int s = ir_p2p_peer(g, i); /* a recv's send */
        if (s >= 0 && P->sent[s] >= 0) src.dt = new_dt(P, P->sent[s]); /* a recv receives what its send sends */
        if (over_pp(n) && ir_dtype_is_float(src.dt)) src.dt = wire_dt(P, n);
    }
    if (n->op == OP_send) P->sent[i] = in[0];
    int nattr = n->nattr;
    Attr *attr = xcalloc((size_t)nattr + 1, sizeof(Attr));
    for (int a = 0; a < n->nattr; a++) attr[a] = n->attr[a];
    if (n->op == OP_cast && ir_attr_i(n, "working", 0) && working(n)) /* tp.c's cast to the activations' dtype (issue 20) */
        for (int a = 0; a < n->nattr; a++)
            if (strcmp(attr[a].key, "dtype") == 0) attr[a] = ir_attr_str(P->b.g->m, "dtype", "bf16");
    if (P->grad[i] && !srcp) attr[nattr++] = grad_attr(P, n);
    int j = copy_node(P, n, in, nattr, attr, srcp);
    for (int k = 0; k < n->nout; k++) P->map[n->out[k]] = P->b.g->nodes[j].out[k];
    free(in), free(attr);
}

static Graph *rewrite(Pc *P) {
    for (int i = 0; i < P->g->nnodes; i++) rewrite_node(P, &P->g->nodes[i]);
    return P->b.g;
}

/* The wire dtypes of the pipeline transfers: a recv over "pp" (a posted
 * one's recv_start: its recv_done has the start's dtype) that
 * find_gradients reached carries a param-gradient partial sum (the tied
 * embedding's head contributions, its total sent back to the replica), so
 * its tag is f32 and its send's producers write f32 too — which can reach
 * further receives (the total is the sum of a received part), hence the
 * fixpoint.  Every other pipeline transfer carries bf16 (activations and
 * their gradients, as on one device). */
static void find_wires(Pc *P, int nstages, char *wire32, char *walked) {
    for (int changed = 1; changed;) {
        changed = 0;
        for (int s = 0; s < nstages; s++)
            for (int i = 0; i < P[s].g->nnodes; i++) {
                const Node *n = &P[s].g->nodes[i];
                if (!over_pp(n)) continue;
                int64_t t = ir_attr_i(n, "tag", 0);
                if (n->op != OP_send && P[s].grad[i] && !wire32[t]) wire32[t] = 1, changed = 1;
                if (n->op == OP_send && wire32[t] && !walked[t]) walked[t] = 1, changed = 1, mark_producers(&P[s], n->in[0], 0);
            }
    }
}

static int max_pp_tag(const Module *m) {
    int maxtag = 0;
    for (int s = 0; s < m->nstages; s++)
        for (int i = 0; i < m->stages[s]->nnodes; i++)
            if (over_pp(&m->stages[s]->nodes[i]) && ir_attr_i(&m->stages[s]->nodes[i], "tag", 0) > maxtag)
                maxtag = (int)ir_attr_i(&m->stages[s]->nodes[i], "tag", 0);
    return maxtag;
}

/* Every stage is analysed first, then the wires decided over all of them
 * (the two ends of a transfer live on two stages and must agree: the
 * verifier's check_transfers), then every stage rewritten. */
void pass_precision(Module *m, const Options *o) {
    if (!o->precision_bf16) return;
    int ns = m->nstages, ntags = max_pp_tag(m) + 1;
    Pc *P = xcalloc((size_t)ns, sizeof(Pc));
    char *wire32 = xcalloc((size_t)ntags, 1), *walked = xcalloc((size_t)ntags, 1);
    for (int s = 0; s < ns; s++) {
        const Graph *g = m->stages[s];
        P[s] = (Pc){g, {.g = ir_graph_new(m), .pass = "precision"}, xcalloc((size_t)g->nvals, sizeof(int)),
                    xcalloc((size_t)g->nvals, sizeof(int)), xcalloc((size_t)g->nvals, 1), xcalloc((size_t)g->nvals, 1),
                    xcalloc((size_t)g->nnodes, sizeof(unsigned)), xcalloc((size_t)g->nnodes, sizeof(int)), wire32};
        for (int v = 0; v < g->nvals; v++) P[s].map[v] = P[s].copy[v] = -1;
        for (int i = 0; i < g->nnodes; i++) P[s].sent[i] = -1;
        find_masters(&P[s]);
        if (!getenv("KILN_GATHER_F32")) gather_bf16(&P[s]); /* the f32 gather, for comparison (docs/cuda.md) */
        find_f32_region(&P[s]);
        find_gradients(&P[s]);
    }
    find_wires(P, ns, wire32, walked);
    for (int s = 0; s < ns; s++) {
        m->stages[s] = rewrite(&P[s]);
        free(P[s].map), free(P[s].copy), free(P[s].master), free(P[s].want32), free(P[s].grad), free(P[s].sent);
    }
    free(P), free(wire32), free(walked);
}
