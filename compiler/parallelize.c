/* parallelize.c — the step of one rank: data parallel, micro-batches and
 * context parallel.
 *
 * Autodiff leaves the training step of the whole global batch on one
 * device: inputs [B, T, ...], the loss a mean over every token, gradients of
 * that mean.  This pass rewrites it into the program every rank of the mesh
 * runs.  Two axes cut the data:
 *   - the batch axis: dp ranks each hold B/dp rows of every input and
 *     process them in M micro-batches (gradient accumulation), so dim 0 of
 *     the inputs is cut into S = dp*M pieces;
 *   - the sequence axis: cp ranks each hold T/cp tokens of every sequence,
 *     dim 1 of the inputs, in the load-balanced "dual chunk" layout (the
 *     sequence cut into 2cp chunks, rank r holding chunks r and 2cp-1-r,
 *     so every rank has the same share of causal attention work), or in
 *     contiguous pieces with --cp-layout contiguous.
 *
 * It works by sharding propagation, the way GSPMD and Megatron reason about
 * tensor layouts, once per axis.  Every value of the global graph gets a
 * sharding along the axis: replicated (the same on every piece: params),
 * split (each piece holds some of the indices of one dim: activations; a
 * split remembers the element stride and size of the cut sub-dimension, so
 * it follows reshapes that merge [B,T] into [B*T] and back), or partial
 * (each piece holds a summand: the loss, whose mean is a sum over pieces,
 * and every weight gradient, which contracts the tokens).  Inputs start
 * split; each op's rule derives its outputs' shardings from its inputs'
 * (the table `rules[]`, one function per op or family of ops, the way
 * autodiff keeps its VJPs), and names the model's line when an op cannot
 * take its inputs' layout (a max over the batch, a norm across it).
 * Positions (`iota`) are split along the sequence with their global values
 * (a rank-dependent iota), and attention over a split sequence is rewritten
 * by cp.c (all-gather or ring attention; the dual-chunk layout).  Sample
 * indices (an iota {axis="batch"}: dropout's rows, issue 17) are split along
 * the batch like an input, with their global values, so a dropout mask
 * hashed from (sample, position) is the single device's on every rank.
 *
 * Then the graph is rebuilt with local shapes.  Nodes that depend on the
 * inputs are cloned once per micro-batch (Node.mb); the others are built
 * once, on first use (`get`).  A partial value that reaches an output is
 * accumulated over micro-batches with `add` as each micro-batch produces it
 * (f32, like Megatron's main_grad buffers).  Two rewrites keep the global
 * semantics exact:
 *   - `mean` over a split dim divides by the local count, so its result is
 *     multiplied by 1/pieces to become a summand of the global mean;
 *   - a replicated value that meets split values in an op (a bias broadcast
 *     to [B,T,C], the 1/N seed of the loss's gradient) is constant along the
 *     split dim, so its local piece is the same chain built at the local
 *     shape (`uniform`, `get`).  Constants keep their global values: the
 *     gradient of the global mean is 1/N_global per token on every piece.
 * Totals (loss masks, issue 17): a partial sum that depends only on the
 * inputs (no param or state), such as the mask count sum(m) of a masked
 * mean sum(ce*m)/sum(m), may enter an op that is not linear in it (the
 * division, the + eps that guards it): the op then reads its total, the
 * sum over every piece, built once per step (`total`): the local values of
 * all micro-batches added, then all-reduced over the dp/cp groups where it
 * is partial, so every rank divides by the global count, as one device
 * does.  The chain that computes it for later micro-batches is built early
 * (`ensure`) and counted in micro-batch 0.  Only scalars are totalled (the
 * model writes the masked mean as a ratio of scalars).
 * Outputs: a partial output that is not a gradient (the loss) is all-reduced
 * so every rank reports the global value; gradients "grad:<p>" stay partial
 * (Value.sh) for the optimizer, which reduces them over dp x cp in buckets.
 * With dp = M = cp = 1 the pass only records the mesh.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cp.h"
#include "passes.h"
#include "tp.h"

enum { AX_BATCH, AX_SEQ, AX_TP, NAX };       /* the axes this pass cuts */
static const int mesh_axis[NAX] = {1, 2, 3}; /* their Module.mesh / Value.sh index: dp, cp, tp */
static const char *const axis_group[NAX] = {"dp", "cp", "tp"};
static const char *const axis_what[NAX] = {"dp x micro-batches", "cp", "tp"};

/* A sharding along one axis.  SPLIT: dim `dim`'s index decomposes as
 * hi*(size*stride) + mid*stride + lo, and the pieces cut `mid` (of `size`). */
typedef struct {
    ShardKind kind;
    int dim;
    int64_t stride, size;
} Sp;

/* A memoised local version of a value: in micro-batch mb (-1: the same in
 * all), under the per-axis shardings want[]. */
typedef struct Memo {
    int mb, nv;
    Sp want[NAX];
    struct Memo *next;
} Memo;

typedef struct {
    Module *m;
    const Graph *g; /* the global graph */
    Graph *ng;      /* the rank's graph being built */
    Builder b;
    int dp, M, cp, tp, tp_bug;
    int pieces[NAX]; /* dp*M, cp, tp */
    Sp *sh[NAX];     /* per global value */
    char *dep;       /* per global value: depends on the inputs (cloned per micro-batch) */
    char *pdep;      /* per global value: depends on a param or state */
    char *tot;       /* [node][input]: the node reads the input's total (a data-only partial sum) */
    int *total;      /* per global value: its total in the rank's graph, or -1 */
    int *map;        /* [M][nvals]: the native local value of a dependent value */
    Memo **memo;     /* per global value */
    int *acc;        /* per global value feeding a partial output: the running sum */
    char *to_acc;
    int *input;      /* per global input value: the rank's input */
    char *conv;      /* [axis][node][input]: a replicated input the rule uses split */
    size_t *convoff; /* per node: its first input's index in conv's [node][input] */
    size_t nconv;    /* inputs of all nodes */
    CpRank cpr;      /* the sequence axis's attention rewrite (cp.c) */
    char *tpred;     /* [node][input]: how the node reads the input over tp: TP_* (tp.c) */
    int *tpar;       /* [3][M+1][nvals]: the input converted (TP_* - 1), or -1 (row M: micro-batch -1) */
    int sp;          /* sequence parallel: outside the column/row pairs activations split on the sequence over tp */
    int64_t seqlen;  /* the inputs' sequence length (dim 1) */
    char *seqtp;     /* per global value: split over tp on the sequence (sp), not on features or heads */
    char *tpvocab;   /* per global value: ids looked up in a table split over tp */
    int *tplse;      /* [M][nvals]: per logits value split over tp, its rows' log-sum-exp, or -1 */
    TpRank tpr;      /* the vocab-parallel rewrites (tp.c) */
} Par;

static const Sp REP = {SH_REP, 0, 0, 0}, PART = {SH_PARTIAL, 0, 0, 0};
static int is_rep(Sp s) { return s.kind == SH_REP; }
static int is_split(Sp s) { return s.kind == SH_SPLIT; }
static int is_part(Sp s) { return s.kind == SH_PARTIAL; }
static int sp_eq(Sp a, Sp b) {
    return a.kind == b.kind && (a.kind != SH_SPLIT || (a.dim == b.dim && a.stride == b.stride && a.size == b.size));
}
static Sp split_at(Sp s, int dim) { return s.dim = dim, s; }

static const Type *vtype(const Par *P, int v) { return &P->g->vals[v].t; }
static const Node *def_of(const Par *P, int v) {
    int d = P->g->vals[v].def;
    return d >= 0 ? &P->g->nodes[d] : NULL;
}
static int64_t prod(const Type *t, int from, int to) { /* dims [from, to) */
    int64_t p = 1;
    for (int k = from; k < to; k++) p *= t->dim[k];
    return p;
}

/* ======================================================================
 * Propagation
 * ====================================================================== */

/* Where split s of a reshape's input lands in its output: the output dim
 * that holds the cut sub-dimension whole.  kind REP if none. */
static Sp reshape_split(Sp s, const Type *in, const Type *out) {
    int64_t e = s.stride * prod(in, s.dim + 1, in->rank); /* element stride of the cut sub-dim */
    for (int k = out->rank - 1; k >= 0; k--) {
        int64_t inner = prod(out, k + 1, out->rank);
        if (e % inner == 0 && e / inner < out->dim[k] && out->dim[k] % (e / inner * s.size) == 0)
            return (Sp){SH_SPLIT, k, e / inner, s.size};
    }
    /* the cut sub-dim spans output dims k.. whole, k its top (tp's [B,T,H*D]
     * -> [B,T,H,D]): contiguous pieces of it are pieces of dim k, so long as
     * dim k divides by the pieces (local_type checks) */
    for (int k = 0; k < out->rank; k++) {
        int64_t inner = prod(out, k + 1, out->rank);
        if (inner % e == 0 && inner * out->dim[k] == e * s.size && s.stride * s.size == in->dim[s.dim])
            return (Sp){SH_SPLIT, k, 1, out->dim[k]};
    }
    return REP;
}

/* a and b (of types ta, tb) cut their dims into the same contiguous pieces:
 * equal, or each the whole dim (coarse: stride x size = the dim) of equal size. */
static int same_cut(Sp a, const Type *ta, Sp b, const Type *tb) {
    if (a.stride == b.stride && a.size == b.size) return 1;
    return a.stride * a.size == ta->dim[a.dim] && b.stride * b.size == tb->dim[b.dim] && ta->dim[a.dim] == tb->dim[b.dim];
}

/* The input dim a reshape's output dim d comes from unchanged (the same
 * elements and size), -1 if none. */
static int reshape_map(const Type *from, int d, const Type *to) {
    int64_t pre = prod(from, 0, d);
    for (int k = 0, p = 1; k < to->rank; p *= (int)to->dim[k], k++)
        if (p == pre && to->dim[k] == from->dim[d]) return k;
    return -1;
}

/* 1 if v is the same along dim d (so each piece's slice is computable
 * locally): constants, broadcasts along d, and elementwise/reshape chains
 * of those. */
static int uniform(const Par *P, int ax, int v, int d) {
    const Node *n = def_of(P, v);
    if (!n || !is_rep(P->sh[ax][v])) return 0;
    const Type *t = vtype(P, v);
    if (n->op == OP_const) return 1;
    if (n->op == OP_broadcast) {
        const Type *x = vtype(P, n->in[0]);
        int di = d - (t->rank - x->rank);
        return di < 0 || x->dim[di] == 1 || uniform(P, ax, n->in[0], di);
    }
    if (n->op == OP_reshape) {
        int di = reshape_map(t, d, vtype(P, n->in[0]));
        return di >= 0 && uniform(P, ax, n->in[0], di);
    }
    if (ir_ops[n->op].flags & F_ELEMENTWISE) {
        for (int k = 0; k < n->nin; k++)
            if (!uniform(P, ax, n->in[k], d)) return 0;
        return 1;
    }
    return 0;
}

/* The inputs of node i that the rule along ax uses split (replicated, uniform). */
static char *conv_of(const Par *P, int ax, int i) { return P->conv + (size_t)ax * P->nconv + P->convoff[i]; }

/* The split every split input among n's first nk shares; replicated inputs
 * must be uniform along its dim (they are used split: conv_of's flag set).
 * kind REP: all replicated; *why set: no common layout. */
static Sp unify(Par *P, int ax, const Node *n, int nk, const char **why) {
    char *conv = conv_of(P, ax, (int)(n - P->g->nodes)); /* n is a node of the global graph */
    Sp d = REP;
    for (int k = 0; k < nk; k++) {
        Sp s = P->sh[ax][n->in[k]];
        if (is_part(s)) return *why = "an input is a partial sum", REP;
        if (is_split(s)) {
            if (is_split(d) && !sp_eq(s, d)) return *why = "inputs are split differently", REP;
            d = s;
        }
    }
    if (!is_split(d)) return REP;
    for (int k = 0; k < nk; k++) {
        int v = n->in[k];
        if (!is_rep(P->sh[ax][v])) continue;
        if (d.dim >= vtype(P, v)->rank) return *why = "a replicated input meets split inputs", REP;
        if (uniform(P, ax, v, d.dim)) conv[k] = 1;
        else if (ax == AX_TP && P->sp && d.stride * d.size == vtype(P, v)->dim[d.dim]) conv[k] = 2; /* sliced locally (tp.c) */
        else return *why = "a replicated input meets split inputs", REP;
    }
    return d;
}

/* ----------------------------------------------------------------------
 * The rules: output shardings along axis ax of node n (out[], all REP on
 * entry) from its inputs' (P->sh[ax]); NULL, or why not.  `rule` calls
 * them only for nodes with a non-replicated input, and for sources.
 * ---------------------------------------------------------------------- */

typedef const char *(*RuleFn)(Par *P, int ax, const Node *n, Sp *out);

static Sp in_sh(const Par *P, int ax, const Node *n, int k) { return P->sh[ax][n->in[k]]; }
static int npartial(const Par *P, int ax, const Node *n) {
    int np = 0;
    for (int k = 0; k < n->nin; k++) np += is_part(in_sh(P, ax, n, k));
    return np;
}

/* Data inputs are split: the batch on dim 0, the sequence on dim 1. */
static const char *rule_input(Par *P, int ax, const Node *n, Sp *out) {
    const Type *t = vtype(P, n->out[0]);
    if (ax == AX_TP) return NULL; /* every tp rank reads the same tokens */
    int d = ax == AX_BATCH ? 0 : 1;
    if (P->pieces[ax] == 1) return NULL;
    if (t->rank <= d) return ax == AX_SEQ ? "an input without a sequence dim (dim 2) under --cp" : "an input without a batch dim";
    return out[0] = (Sp){SH_SPLIT, d, 1, t->dim[d]}, NULL;
}

/* An iota of sample indices {axis="batch"} (dropout's rows, issue 17): split
 * over the batch like the inputs, with global values (input_of). */
static int is_batch_iota(const Node *n) { return n->op == OP_iota && strcmp(ir_attr_s(n, "axis", ""), "batch") == 0; }

/* Positions: along a split sequence, the global indices of the rank's
 * tokens; sample indices: along the split batch, the rank's samples'. */
static const char *rule_iota(Par *P, int ax, const Node *n, Sp *out) {
    if (ax == (is_batch_iota(n) ? AX_BATCH : AX_SEQ) && P->pieces[ax] > 1) out[0] = (Sp){SH_SPLIT, 0, 1, vtype(P, n->out[0])->dim[0]};
    return NULL;
}

/* Params are replicated, but along tp split as their {tp} attr says (tp.c). */
static const char *rule_param(Par *P, int ax, const Node *n, Sp *out) {
    const Type *t = vtype(P, n->out[0]);
    int blocks, d = ax == AX_TP ? tp_param_dim(n, t, P->tp, &blocks) : -1;
    if (d >= 0) out[0] = (Sp){SH_SPLIT, d, 1, t->dim[d] / blocks};
    return NULL;
}

/* Outputs take any layout: build_output sums a partial one, rejects a split one. */
static const char *rule_output(Par *P, int ax, const Node *n, Sp *out) {
    (void)P, (void)ax, (void)n, (void)out;
    return NULL;
}

/* Elementwise: split inputs must agree and replicated ones be uniform
 * (unify); a partial sum goes through only where the op is linear in it
 * (`linear`: each op's rule tells from its inputs' layouts). */
static const char *pointwise(Par *P, int ax, const Node *n, Sp *out, int linear) {
    if (npartial(P, ax, n)) return linear ? (out[0] = PART, NULL) : "a partial sum goes through a non-linear op";
    const char *why = "";
    Sp d = unify(P, ax, n, n->nin, &why);
    return *why ? why : (out[0] = d, NULL);
}
/* The elementwise ops without an entry in rules[]: not linear. */
static const char *rule_pointwise(Par *P, int ax, const Node *n, Sp *out) {
    return pointwise(P, ax, n, out, 0);
}
/* -x, cast(x) */
static const char *rule_linear(Par *P, int ax, const Node *n, Sp *out) {
    return pointwise(P, ax, n, out, 1);
}
/* a + b, a - b: linear when both are partial sums */
static const char *rule_add(Par *P, int ax, const Node *n, Sp *out) {
    return pointwise(P, ax, n, out, npartial(P, ax, n) == 2);
}
/* a * b: a partial sum times a replicated factor */
static const char *rule_mul(Par *P, int ax, const Node *n, Sp *out) {
    int linear = npartial(P, ax, n) == 1 && !is_split(in_sh(P, ax, n, 0)) && !is_split(in_sh(P, ax, n, 1));
    return pointwise(P, ax, n, out, linear);
}
/* a / b: a partial sum over a replicated divisor */
static const char *rule_div(Par *P, int ax, const Node *n, Sp *out) {
    return pointwise(P, ax, n, out, is_part(in_sh(P, ax, n, 0)) && is_rep(in_sh(P, ax, n, 1)));
}

/* A split input reduced over {dim}, another dim: the split shifts if {dim} goes. */
static Sp reduced(const Node *n, Sp x) {
    int dim = (int)ir_attr_i(n, "dim", 0);
    return split_at(x, x.dim - (!ir_attr_i(n, "keep", 0) && dim < x.dim));
}
/* sum, mean: linear; over the split dim they give a partial sum */
static const char *rule_sum(Par *P, int ax, const Node *n, Sp *out) {
    Sp x = in_sh(P, ax, n, 0);
    if (is_part(x) || ir_attr_i(n, "dim", 0) == x.dim) return out[0] = PART, NULL;
    return out[0] = reduced(n, x), NULL;
}
static const char *rule_max(Par *P, int ax, const Node *n, Sp *out) {
    Sp x = in_sh(P, ax, n, 0);
    if (is_part(x)) return "max/sumsq of a partial sum";
    if (ir_attr_i(n, "dim", 0) == x.dim) return "max over a split dim";
    return out[0] = reduced(n, x), NULL;
}
/* sumsq of every element: each piece's is a summand */
static const char *rule_sumsq(Par *P, int ax, const Node *n, Sp *out) {
    return is_part(in_sh(P, ax, n, 0)) ? "max/sumsq of a partial sum" : (out[0] = PART, NULL);
}
/* (dy, x, y): dy and y have x's layout with dim reduced */
static const char *rule_max_bwd(Par *P, int ax, const Node *n, Sp *out) {
    Sp x = in_sh(P, ax, n, 1);
    if (!is_split(x) || x.dim == ir_attr_i(n, "dim", 0) || !is_split(in_sh(P, ax, n, 0)) || !is_split(in_sh(P, ax, n, 2)))
        return "max_bwd over a split dim";
    return out[0] = x, NULL;
}

/* Shape ops move a split dim (or refuse) and pass a partial sum through. */
static int seq_split(const Par *P, int v);
static const char *rule_reshape(Par *P, int ax, const Node *n, Sp *out) {
    Sp x = in_sh(P, ax, n, 0);
    if (is_part(x)) return out[0] = PART, NULL;
    if (ax == AX_TP && seq_split(P, n->in[0])) return "a reshape of a sequence-parallel activation"; /* gathered first (tp.c) */
    Sp s = reshape_split(x, vtype(P, n->in[0]), vtype(P, n->out[0]));
    return is_split(s) ? (out[0] = s, NULL) : "a reshape that breaks the split";
}
static const char *rule_transpose(Par *P, int ax, const Node *n, Sp *out) {
    Sp x = in_sh(P, ax, n, 0);
    if (is_part(x)) return out[0] = PART, NULL;
    int a = (int)ir_attr_i(n, "a", 0), b = (int)ir_attr_i(n, "b", 0);
    return out[0] = split_at(x, x.dim == a ? b : x.dim == b ? a : x.dim), NULL;
}
/* The extent (stride x size) of the blocks of a split dim, when a slice
 * [start, end) of that dim is one whole block (along tp: a fused QKV's q,
 * k or v, tp.c), else 0. */
static int64_t tp_block_slice(Sp x, const Node *n) {
    int64_t blk = x.stride * x.size, s = ir_attr_i(n, "start", 0), e = ir_attr_i(n, "end", 0);
    return s % blk == 0 && e - s == blk ? blk : 0;
}
static const char *rule_slice(Par *P, int ax, const Node *n, Sp *out) {
    Sp x = in_sh(P, ax, n, 0);
    if (is_part(x)) return out[0] = PART, NULL;
    if (ax == AX_TP && x.dim == ir_attr_i(n, "dim", 0) && tp_block_slice(x, n)) return out[0] = x, NULL;
    return x.dim == ir_attr_i(n, "dim", 0) ? "a slice of a split dim" : (out[0] = x, NULL);
}
static const char *rule_concat(Par *P, int ax, const Node *n, Sp *out) {
    int cd = (int)ir_attr_i(n, "dim", 0);
    if (ax == AX_TP && is_split(in_sh(P, ax, n, 0)) && in_sh(P, ax, n, 0).dim == cd) { /* blocks, each split whole (tp.c) */
        int64_t len = vtype(P, n->in[0])->dim[cd];
        for (int k = 0; k < n->nin; k++) {
            Sp s = in_sh(P, ax, n, k);
            if (!is_split(s) || s.dim != cd || vtype(P, n->in[k])->dim[cd] != len || s.stride * s.size != len)
                return "a concat of pieces split unlike each other over tp";
        }
        return out[0] = (Sp){SH_SPLIT, cd, 1, len}, NULL;
    }
    const char *why = "";
    Sp d = unify(P, ax, n, n->nin, &why);
    return *why ? why : d.dim == ir_attr_i(n, "dim", 0) ? "a concat along a split dim" : (out[0] = d, NULL);
}
static const char *rule_broadcast(Par *P, int ax, const Node *n, Sp *out) {
    Sp x = in_sh(P, ax, n, 0);
    if (is_part(x)) return out[0] = PART, NULL;
    return out[0] = split_at(x, x.dim + vtype(P, n->out[0])->rank - vtype(P, n->in[0])->rank), NULL;
}
/* summing the broadcast dims: a split dim summed away gives a partial sum */
static const char *rule_sumto(Par *P, int ax, const Node *n, Sp *out) {
    Sp x = in_sh(P, ax, n, 0);
    if (is_part(x)) return out[0] = PART, NULL;
    const Type *tx = vtype(P, n->in[0]), *to = vtype(P, n->out[0]);
    int od = x.dim - (tx->rank - to->rank);
    return out[0] = od < 0 || to->dim[od] != tx->dim[x.dim] ? PART : split_at(x, od), NULL;
}

/* Contracting two pieces of the inner dim gives a partial sum; batch and
 * row splits of a, column splits of b carry through. */
static const char *rule_matmul(Par *P, int ax, const Node *n, Sp *out) {
    Sp a = in_sh(P, ax, n, 0), b = in_sh(P, ax, n, 1);
    const Type *ta = vtype(P, n->in[0]), *tb = vtype(P, n->in[1]);
    int ra = ta->rank, rb = tb->rank, ro = ra > rb ? ra : rb;
    int TA = (int)ir_attr_i(n, "ta", 0), TB = (int)ir_attr_i(n, "tb", 0);
    int a_m = TA ? ra - 1 : ra - 2, a_k = TA ? ra - 2 : ra - 1;
    int b_k = TB ? rb - 1 : rb - 2, b_n = TB ? rb - 2 : rb - 1;
    if ((is_part(a) && is_rep(b)) || (is_rep(a) && is_part(b))) return out[0] = PART, NULL;
    if (is_split(a) && is_split(b) && a.dim == a_k && b.dim == b_k && same_cut(a, ta, b, tb))
        return out[0] = PART, NULL;
    if (is_split(a) && a.dim < ra - 2 && (rb == 2 ? is_rep(b) : is_split(b) && b.dim == a.dim + rb - ra))
        return out[0] = split_at(a, a.dim + ro - ra), NULL;
    if (is_split(a) && a.dim == a_m && is_rep(b)) return out[0] = split_at(a, ro - 2), NULL;
    if (is_rep(a) && is_split(b) && b.dim == b_n) return out[0] = split_at(b, ro - 1), NULL;
    return "matmul: the inputs' layouts do not combine";
}

/* layernorm, rmsnorm, softmax work along the last dim: split elsewhere,
 * weights replicated. */
static const char *rule_norm(Par *P, int ax, const Node *n, Sp *out) {
    Sp x = in_sh(P, ax, n, 0);
    if (!is_split(x) || x.dim >= vtype(P, n->in[0])->rank - 1) return "a norm or softmax across a split dim";
    for (int k = 1; k < n->nin; k++)
        if (!is_rep(in_sh(P, ax, n, k))) return "a split norm weight";
    return out[0] = x, NULL;
}
/* (dy, x or y [, w]) -> dx like x; the weights' gradients partial sums */
static const char *rule_norm_bwd(Par *P, int ax, const Node *n, Sp *out) {
    const char *why = "";
    Sp d = unify(P, ax, n, 2, &why);
    if (*why) return why;
    if (!is_split(d) || d.dim >= vtype(P, n->in[0])->rank - 1 || (n->nin > 2 && !is_rep(in_sh(P, ax, n, 2))))
        return "a norm backward across a split dim";
    out[0] = d;
    for (int k = 1; k < n->nout; k++) out[k] = PART;
    return NULL;
}

/* rope, rope_bwd: x [B,T,H,D], pos [T] */
static const char *rule_rope(Par *P, int ax, const Node *n, Sp *out) {
    Sp x = in_sh(P, ax, n, 0), p = in_sh(P, ax, n, 1);
    if (is_split(x) && (x.dim == 0 || x.dim == 2) && is_rep(p)) return out[0] = x, NULL;
    if (is_split(x) && x.dim == 1 && is_split(p) && p.dim == 0) return out[0] = x, NULL;
    return "rope: the positions are not split like the tokens";
}

/* attention, attention_bwd along tp: the heads split (dim 1 of q, k, v and
 * of do, o, lse), every tensor input alike; positions replicated. */
static const char *tp_attention(Par *P, const Node *n, int nt, Sp *out) {
    for (int k = 0; k < n->nin; k++) {
        Sp s = in_sh(P, AX_TP, n, k);
        if (k < nt ? !is_split(s) || s.dim != 1 : !is_rep(s))
            return is_part(s) ? "an input is a partial sum" : "q, k and v are not all split on their heads (annotate wq, wk and wv alike)";
    }
    int q = n->op == OP_attention ? 0 : 1;
    tp_check_heads(n, vtype(P, n->in[q]), vtype(P, n->in[q + 1]), P->tp);
    for (int k = 0; k < n->nout; k++) out[k] = (Sp){SH_SPLIT, 1, 1, vtype(P, n->out[k])->dim[1]};
    return NULL;
}

/* attention, attention_bwd: split on the batch, or on the sequence (cp.c
 * rewrites it); positions (optional, last two) follow the tokens */
static const char *rule_attention(Par *P, int ax, const Node *n, Sp *out) {
    int nt = n->op == OP_attention ? 3 : 6;
    if (ax == AX_TP) return tp_attention(P, n, nt, out);
    const char *why = "";
    Sp d = unify(P, ax, n, nt, &why);
    for (int k = nt; k < n->nin && !*why; k++) {
        Sp p = in_sh(P, ax, n, k);
        if (!is_rep(p) && !(is_split(p) && p.dim == 0 && d.dim == 2)) why = "attention positions split unlike the tokens";
    }
    if (*why) return why;
    if (d.dim != 0 && !(ax == AX_SEQ && d.dim == 2)) return "attention split other than on the batch or the sequence";
    for (int k = 0; k < n->nout; k++) out[k] = d;
    return NULL;
}

/* (table, ids): the rows looked up are split like the ids */
static const char *rule_embedding(Par *P, int ax, const Node *n, Sp *out) {
    if (ax == AX_TP) { /* vocab parallel (tp.c): the table split on its rows, each rank's lookups a summand */
        Sp t = in_sh(P, ax, n, 0);
        if (!is_rep(in_sh(P, ax, n, 1)) || !is_split(t) || t.dim != 0) return "embedding: the table split other than on its rows";
        P->tpvocab[n->in[1]] = 1;
        return out[0] = PART, NULL;
    }
    if (!is_rep(in_sh(P, ax, n, 0))) return "a split embedding table";
    if (!is_split(in_sh(P, ax, n, 1))) return "embedding ids";
    return out[0] = in_sh(P, ax, n, 1), NULL;
}
/* (dy, ids): each piece scatters a summand of the table's gradient */
static const char *rule_embedding_bwd(Par *P, int ax, const Node *n, Sp *out) {
    if (ax == AX_TP) { /* the table's gradient split like the table, where forward looked the ids up in a split table */
        if (!is_rep(in_sh(P, ax, n, 0)) || !is_rep(in_sh(P, ax, n, 1))) return "embedding_bwd: dy or ids split over tp";
        if (P->tpvocab[n->in[1]]) out[0] = (Sp){SH_SPLIT, 0, 1, vtype(P, n->out[0])->dim[0]};
        return NULL;
    }
    if (is_part(in_sh(P, ax, n, 0)) && is_rep(in_sh(P, ax, n, 1))) return out[0] = PART, NULL;
    const char *why = "";
    unify(P, ax, n, 2, &why);
    return *why ? why : (out[0] = PART, NULL);
}
/* per token: split anywhere but the vocabulary */
static const char *rule_cross_entropy(Par *P, int ax, const Node *n, Sp *out) {
    if (ax == AX_TP) { /* vocab parallel (tp.c): logits split on the vocabulary; the loss replicated, dlogits like the logits */
        int l = n->nin - 2;
        Sp x = in_sh(P, ax, n, l);
        for (int k = 0; k < n->nin; k++)
            if (k != l && !is_rep(in_sh(P, ax, n, k))) return "cross entropy: an input other than the logits split over tp";
        if (!is_split(x) || x.dim != vtype(P, n->in[l])->rank - 1) return "cross entropy: logits split other than on the vocabulary";
        if (n->op == OP_cross_entropy_bwd) out[0] = x;
        return NULL;
    }
    const char *why = "";
    Sp d = unify(P, ax, n, n->nin, &why);
    if (*why) return why;
    return !is_split(d) || d.dim >= vtype(P, n->in[n->nin - 2])->rank - 1 ? "cross entropy across the vocabulary"
                                                                          : (out[0] = d, NULL);
}

/* dropout (issue 17): x [B,T,..] keeps its layout; its mask's indices rows
 * (along the batch) and pos (along the sequence) must be split as x is, so
 * the rank draws the global elements' bits: the single device's mask. */
static const char *rule_dropout(Par *P, int ax, const Node *n, Sp *out) {
    if (ax == AX_TP) return "dropout of a tensor-parallel activation (not supported yet)";
    Sp x = in_sh(P, ax, n, 0), idx = in_sh(P, ax, n, ax == AX_BATCH ? 2 : 3);
    int d = ax == AX_BATCH ? 0 : 1;
    if (!is_rep(in_sh(P, ax, n, 1))) return "the step is not replicated";
    if (is_rep(x) && is_rep(idx)) return NULL;
    if (!is_split(x) || !is_split(idx) || x.dim != d || x.stride != idx.stride || x.size != idx.size)
        return ax == AX_BATCH ? "dropout needs x [B,T,...] split on its batch dim (dim 1)"
                              : "dropout needs x [B,T,...] split on its sequence dim (dim 2)";
    return out[0] = x, NULL;
}

static const char *rule_loss(Par *P, int ax, const Node *n, Sp *out) {
    return is_part(in_sh(P, ax, n, 0)) ? (out[0] = PART, NULL) : "the loss is not a reduction over the split tokens";
}

/* The rule of each op that reaches this pass (after autodiff, before the
 * optimizer); sources without an entry are replicated (params, constants),
 * elementwise ops without one are not linear (rule_of).  Outside this
 * table the pass names only the ops it builds or rewrites (mean, iota,
 * attention), the program's inputs and outputs, and the ops that a
 * replicated value is rebuilt through at a local shape (uniform, get). */
static const RuleFn rules[OP_COUNT] = {
    [OP_input] = rule_input, [OP_param] = rule_param, [OP_iota] = rule_iota, [OP_output] = rule_output,
    [OP_add] = rule_add, [OP_sub] = rule_add, [OP_mul] = rule_mul, [OP_div] = rule_div,
    [OP_neg] = rule_linear, [OP_cast] = rule_linear,
    [OP_sum] = rule_sum, [OP_mean] = rule_sum, [OP_max] = rule_max, [OP_sumsq] = rule_sumsq,
    [OP_max_bwd] = rule_max_bwd, [OP_reshape] = rule_reshape, [OP_transpose] = rule_transpose,
    [OP_slice] = rule_slice, [OP_concat] = rule_concat, [OP_broadcast] = rule_broadcast, [OP_sumto] = rule_sumto,
    [OP_matmul] = rule_matmul, [OP_layernorm] = rule_norm, [OP_rmsnorm] = rule_norm, [OP_softmax] = rule_norm,
    [OP_layernorm_bwd] = rule_norm_bwd, [OP_rmsnorm_bwd] = rule_norm_bwd, [OP_softmax_bwd] = rule_norm_bwd,
    [OP_rope] = rule_rope, [OP_rope_bwd] = rule_rope, [OP_dropout] = rule_dropout,
    [OP_attention] = rule_attention, [OP_attention_bwd] = rule_attention,
    [OP_embedding] = rule_embedding, [OP_embedding_bwd] = rule_embedding_bwd,
    [OP_cross_entropy] = rule_cross_entropy, [OP_cross_entropy_bwd] = rule_cross_entropy, [OP_loss] = rule_loss,
};

static RuleFn rule_of(Op op) {
    if (rules[op]) return rules[op];
    return ir_ops[op].flags & F_ELEMENTWISE ? rule_pointwise : NULL;
}

/* Output shardings along axis ax of node n from its inputs'; NULL, or why not. */
static const char *rule(Par *P, int ax, const Node *n, Sp out[]) {
    int all_rep = 1;
    ir_ice_at(n->loc);
    for (int k = 0; k < n->nin; k++) all_rep &= is_rep(in_sh(P, ax, n, k));
    for (int k = 0; k < n->nout; k++) out[k] = REP;
    RuleFn f = rule_of(n->op);
    if (ir_ops[n->op].flags & F_SOURCE) return f ? f(P, ax, n, out) : NULL;
    if (all_rep && !(ax == AX_TP && n->op == OP_embedding_bwd)) return NULL;
    if (!f) ICE("parallelize: %s after autodiff and before the optimizer", ir_ops[n->op].name);
    return f(P, ax, n, out);
}

/* Input k of n may be read as its total: a scalar partial sum along some
 * axis, split along none, computed from the inputs alone. */
static int totalable(const Par *P, const Node *n, int k) {
    int v = n->in[k], part = 0;
    if (vtype(P, v)->rank != 0) return 0;
    for (int ax = 0; ax < NAX; ax++) {
        if (is_split(P->sh[ax][v])) return 0;
        part |= is_part(P->sh[ax][v]);
    }
    return part && P->dep[v] && !P->pdep[v];
}

/* How a node reads an input over tp when its rule refuses the input's own
 * layout: a partial sum all-reduced (Megatron's all-reduce after a
 * row-parallel GEMM, and after a column-parallel GEMM's input gradient),
 * or, with sequence parallelism, reduce-scattered on the sequence (dim 1);
 * a value split on the sequence all-gathered (before a column-parallel
 * GEMM, and in backward before a row-parallel one's input gradient). */
enum { TP_NATIVE, TP_ALLREDUCE, TP_SCATTER, TP_GATHER };

/* v split over tp on the sequence (sequence parallelism): reduce-scattered,
 * or computed from such values (seqtp), in pieces an all-gather joins */
static int seq_split(const Par *P, int v) {
    Sp s = P->sh[AX_TP][v];
    return P->sp && P->seqtp[v] && is_split(s) && s.stride * s.size == vtype(P, v)->dim[s.dim];
}
/* v [B,T,..] may be reduce-scattered on the sequence */
static int seq_ok(const Par *P, int v) {
    const Type *t = vtype(P, v);
    return P->sp && t->rank == 3 && t->dim[1] == P->seqlen;
}

/* The rules of node i again with its inputs read as codes[] says; NULL or
 * why not.  The inputs' shardings are restored. */
static const char *tp_try(Par *P, int i, const char *codes, Sp out[NAX][8], int *bad) {
    const Node *n = &P->g->nodes[i];
    Sp saved[IR_MAXIN];
    memset(conv_of(P, AX_TP, i), 0, (size_t)n->nin);
    for (int k = 0; k < n->nin; k++) {
        int v = n->in[k];
        saved[k] = P->sh[AX_TP][v];
        if (codes[k] == TP_ALLREDUCE || codes[k] == TP_GATHER) P->sh[AX_TP][v] = REP;
        if (codes[k] == TP_SCATTER) P->sh[AX_TP][v] = (Sp){SH_SPLIT, 1, 1, vtype(P, v)->dim[1]};
    }
    const char *why = NULL;
    for (int ax = 0; ax < NAX && !why; ax++) why = rule(P, ax, n, out[*bad = ax]);
    for (int k = 0; k < n->nin; k++) P->sh[AX_TP][n->in[k]] = saved[k];
    return why;
}

/* Node i's rule along tp failed: read its partial sums reduced (scattered
 * on the sequence with --sp, else all-reduced), and failing that (--sp)
 * all-reduced with its sequence-split inputs all-gathered.  NULL when a
 * way works (kept in tpred), else why not. */
static const char *tp_resolve(Par *P, int i, Sp out[NAX][8], int *bad) {
    const Node *n = &P->g->nodes[i];
    char a[IR_MAXIN] = {0}, b[IR_MAXIN] = {0};
    int na = 0, nb = 0;
    for (int k = 0; k < n->nin; k++) {
        int v = n->in[k];
        if (is_part(P->sh[AX_TP][v])) a[k] = seq_ok(P, v) ? TP_SCATTER : TP_ALLREDUCE, b[k] = TP_ALLREDUCE, na++, nb++;
        else if (seq_split(P, v)) b[k] = TP_GATHER, nb++;
    }
    const char *why = "no input to convert";
    const char *ways[2] = {a, b};
    for (int w = 0; w < 2; w++) {
        if (!(w ? nb : na) || (w && !P->sp)) continue;
        if (!(why = tp_try(P, i, ways[w], out, bad))) {
            memcpy(P->tpred + P->convoff[i], ways[w], (size_t)n->nin);
            return NULL;
        }
    }
    return why;
}

/* The rules of node i along every axis; where one fails, again with its
 * totalable inputs read as their totals (replicated).  NULL or why not;
 * *bad: the axis that failed. */
static const char *rules_of(Par *P, int i, Sp out[NAX][8], int *bad) {
    const Node *n = &P->g->nodes[i];
    const char *why = NULL;
    for (int ax = 0; ax < NAX && !why; ax++) why = rule(P, ax, n, out[*bad = ax]);
    if (!why) return NULL;
    if (*bad == AX_TP && !tp_resolve(P, i, out, bad)) return NULL; /* inputs reduced or gathered over tp (tp.c) */
    int nt = 0;
    Sp saved[NAX][IR_MAXIN];
    char *tot = P->tot + P->convoff[i];
    for (int k = 0; k < n->nin; k++) {
        if (!totalable(P, n, k)) continue;
        tot[k] = 1, nt++;
        for (int ax = 0; ax < NAX; ax++) saved[ax][k] = P->sh[ax][n->in[k]];
    }
    if (!nt) return why;
    for (int k = 0; k < n->nin; k++)
        if (tot[k])
            for (int ax = 0; ax < NAX; ax++) P->sh[ax][n->in[k]] = REP;
    why = NULL;
    for (int ax = 0; ax < NAX && !why; ax++) why = rule(P, ax, n, out[*bad = ax]);
    for (int k = 0; k < n->nin; k++)
        if (tot[k])
            for (int ax = 0; ax < NAX; ax++) P->sh[ax][n->in[k]] = saved[ax][k];
    return why;
}

static void propagate(Par *P) {
    const Graph *g = P->g;
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        Sp out[NAX][8];
        int ax = 0;
        const char *why = rules_of(P, i, out, &ax);
        if (why)
            error_at(n->loc, "%s cannot be split over the %s (%s): %s", ir_ops[n->op].name,
                     ax == AX_BATCH ? "batch" : ax == AX_SEQ ? "sequence" : "tensor-parallel ranks", axis_what[ax], why);
        for (ax = 0; ax < NAX; ax++)
            for (int k = 0; k < n->nout; k++) P->sh[ax][n->out[k]] = out[ax][k];
        int seq = 0; /* an output split over tp is on the sequence if an input read split is */
        for (int k = 0; k < n->nin; k++) {
            int code = P->tpred[P->convoff[i] + (size_t)k];
            seq |= code == TP_SCATTER || (P->seqtp[n->in[k]] && code != TP_GATHER && is_split(P->sh[AX_TP][n->in[k]]));
        }
        for (int k = 0; k < n->nout; k++) P->seqtp[n->out[k]] = (char)(seq && is_split(out[AX_TP][k]));
    }
}

/* ======================================================================
 * Building the rank's graph
 * ====================================================================== */

static Type local_type(const Par *P, const Type *t, const Sp *want, Loc loc) {
    Type l = *t;
    for (int ax = 0; ax < NAX; ax++) {
        if (!is_split(want[ax])) continue;
        int d = want[ax].dim;
        if (l.dim[d] % P->pieces[ax])
            error_at(loc, "dim %d of size %lld is not divisible by %s %d", d + 1, (long long)l.dim[d], axis_what[ax],
                     P->pieces[ax]);
        l.dim[d] /= P->pieces[ax];
    }
    return l;
}

/* The node's attrs with {shape} replaced by the local output shape, plus extra. */
/* A slice of one block of a dim split over tp (a fused QKV's q, k or v)
 * takes the local block: its start and end divided by sdiv = tp. */
static const Attr *local_attrs(Par *P, const Node *n, const Type *lt, const Attr *extra, int nextra, int *nattr, int sdiv) {
    Attr *a = ir_alloc(P->m, sizeof(Attr) * (size_t)(n->nattr + nextra + 1));
    for (int k = 0; k < n->nattr; k++) {
        const char *key = n->attr[k].key;
        a[k] = strcmp(key, "shape") ? n->attr[k] : ir_attr_ints(P->m, "shape", lt->dim, lt->rank);
        if (sdiv > 1 && (!strcmp(key, "start") || !strcmp(key, "end"))) a[k] = ir_attr_int(P->m, key, ir_attr_i(n, key, 0) / sdiv);
    }
    for (int k = 0; k < nextra; k++) a[n->nattr + k] = extra[k];
    *nattr = n->nattr + nextra;
    return a;
}

static void set_sh(Par *P, int nv, const Sp *s) {
    for (int ax = 0; ax < NAX; ax++)
        if (P->pieces[ax] > 1 && (ax != AX_BATCH || P->dp > 1))
            P->ng->vals[nv].sh[mesh_axis[ax]] = (AxisShard){s[ax].kind, s[ax].dim};
}
static void set_sh1(Par *P, int nv, Sp batch, Sp seq) {
    Sp s[NAX] = {batch, seq, REP};
    set_sh(P, nv, s);
}
/* nv sharded like global value v along every axis */
static void set_sh_of(Par *P, int nv, int v) {
    Sp s[NAX];
    for (int ax = 0; ax < NAX; ax++) s[ax] = P->sh[ax][v];
    set_sh(P, nv, s);
}

static void set_mb(Par *P, int nv, int mb) { P->ng->nodes[P->ng->vals[nv].def].mb = mb < 0 ? 0 : mb; }

/* Clone global node n with new inputs and the local output types of want
 * (per output, per axis); returns the new node index. */
static int clone(Par *P, const Node *n, const int *in, int mb, Sp want[][NAX]) {
    if (!n->nout) ICE("parallelize: clone of a sink");
    Type lt = local_type(P, &P->g->vals[n->out[0]].t, want[0], n->loc);
    Attr extra[2];
    int nextra = 0, nattr;
    if (n->op == OP_iota && is_split(want[0][AX_SEQ])) nextra = cp_position_attrs(&P->cpr, extra); /* this rank's global positions */
    P->b.loc = n->loc, P->b.layer = n->layer, P->b.phase = n->phase;
    Sp tsl = want[0][AX_TP];
    int sdiv = n->op == OP_slice && is_split(tsl) && tsl.dim == ir_attr_i(n, "dim", 0) ? P->tp : 1;
    const Attr *at = local_attrs(P, n, &lt, extra, nextra, &nattr, sdiv);
    int j = ir_build(&P->b, n->op, n->nin, in, nattr, at, ir_ops[n->op].flags & F_SOURCE ? &lt : NULL);
    P->ng->nodes[j].mb = mb < 0 ? 0 : mb;
    for (int k = 0; k < n->nout; k++) set_sh(P, P->ng->nodes[j].out[k], want[k]);
    return j;
}

static int native(const Par *P, int v, const Sp *want) {
    for (int ax = 0; ax < NAX; ax++)
        if (!sp_eq(want[ax], P->sh[ax][v])) return 0;
    return 1;
}

static int tp_convert(Par *P, int v, int mb, const Sp *w, int code);

/* The local value of global value v in micro-batch mb under the per-axis
 * shardings want[]: its native sharding, or, along an axis where v is
 * replicated and uniform, split as want says (built at the local shape). */
static int get(Par *P, int v, int mb, const Sp *want) {
    if (!P->dep[v]) mb = -1;
    if (mb >= 0 && native(P, v, want)) {
        int x = P->map[(size_t)mb * (size_t)P->g->nvals + (size_t)v];
        if (x < 0) ICE("parallelize: %%%d used before it is built", v);
        return x;
    }
    for (Memo *q = P->memo[v]; q; q = q->next) {
        int same = q->mb == mb;
        for (int ax = 0; ax < NAX; ax++) same &= sp_eq(q->want[ax], want[ax]);
        if (same) return q->nv;
    }
    const Node *n = def_of(P, v);
    int small[8], *in = n->nin <= 8 ? small : ir_alloc(P->m, sizeof(int) * (size_t)n->nin); /* get recurses */
    for (int k = 0; k < n->nin; k++) {
        const Type *t = vtype(P, v), *x = vtype(P, n->in[k]);
        Sp w[NAX];
        for (int ax = 0; ax < NAX; ax++) {
            w[ax] = P->sh[ax][n->in[k]];
            if (!is_split(want[ax]) || !is_rep(P->sh[ax][v])) continue; /* native along ax */
            int d = want[ax].dim;
            int di = n->op == OP_broadcast ? d - (t->rank - x->rank) : n->op == OP_reshape ? reshape_map(t, d, x) : d;
            if (!(n->op == OP_broadcast && (di < 0 || x->dim[di] == 1))) w[ax] = split_at(want[ax], di);
        }
        int code = P->tpred[P->convoff[n - P->g->nodes] + (size_t)k];
        in[k] = code ? tp_convert(P, n->in[k], mb, w, code) : get(P, n->in[k], mb, w);
    }
    Sp wants[8][NAX];
    for (int k = 0; k < n->nout; k++)
        for (int ax = 0; ax < NAX; ax++) wants[k][ax] = k == 0 ? want[ax] : P->sh[ax][n->out[k]];
    int j = clone(P, n, in, mb, wants);
    Memo *q = ir_alloc(P->m, sizeof(Memo));
    *q = (Memo){mb, P->ng->nodes[j].out[(int)(P->g->vals[v].defout)], {want[0], want[1], want[2]}, P->memo[v]};
    P->memo[v] = q;
    return q->nv;
}

/* The local value of v read as code says (TP_*: all-reduced, scattered or
 * gathered over tp), once per value, code and micro-batch; w: v's
 * shardings. */
static int tp_convert(Par *P, int v, int mb, const Sp *w, int code) {
    if (!P->dep[v]) mb = -1;
    size_t row = (size_t)(code - 1) * (size_t)(P->M + 1) + (size_t)(mb < 0 ? P->M : mb);
    int *slot = &P->tpar[row * (size_t)P->g->nvals + (size_t)v];
    if (*slot >= 0) return *slot;
    int x = get(P, v, mb, w);
    const Node *n = def_of(P, v);
    Builder keep = P->b;
    P->b.loc = n->loc, P->b.layer = n->layer, P->b.phase = n->phase;
    if (P->tp_bug == 1 && n->phase == PH_BWD && code == TP_ALLREDUCE) return *slot = x; /* --test-tp-bug drop-bwd-reduce */
    Sp s[NAX] = {w[0], w[1], REP};
    int y;
    if (code == TP_ALLREDUCE) {
        y = tp_allreduce(P->m, &P->b, x);
    } else {
        Attr g[2] = {ir_attr_str(P->m, "group", "tp"), ir_attr_int(P->m, "dim", code == TP_SCATTER ? 1 : P->sh[AX_TP][v].dim)};
        y = ir_build1(&P->b, code == TP_SCATTER ? OP_reducescatter : OP_allgather, x, 2, g);
        if (code == TP_SCATTER) s[AX_TP] = (Sp){SH_SPLIT, 1, 1, vtype(P, v)->dim[1]};
    }
    set_sh(P, y, s);
    set_mb(P, y, mb);
    P->b = keep;
    return *slot = y;
}

/* x, the local value of a value replicated over tp, as this rank's piece of
 * dim d: a shard (no communication). */
static int tp_shard(Par *P, int x, int d, int mb) {
    Attr g[2] = {ir_attr_str(P->m, "group", "tp"), ir_attr_int(P->m, "dim", d)};
    int y = ir_build1(&P->b, OP_shard, x, 2, g);
    Sp s[NAX] = {REP, REP, REP};
    for (int ax = 0; ax < AX_TP; ax++) s[ax] = (Sp){(ShardKind)P->ng->vals[x].sh[mesh_axis[ax]].kind, P->ng->vals[x].sh[mesh_axis[ax]].dim, 1, 1};
    set_sh(P, y, s);
    P->ng->vals[y].sh[mesh_axis[AX_TP]] = (AxisShard){SH_SPLIT, d};
    set_mb(P, y, mb);
    return y;
}

static int const_like(Par *P, const Type *t, double v) {
    Attr a = ir_attr_float(P->m, "v", v);
    return ir_out(P->ng, ir_build(&P->b, OP_const, 0, NULL, 1, &a, t));
}

static Sp sh_of(const Par *P, int ax, int v) { return P->sh[ax][v]; }

/* Micro-batch mb's rows of input node n: a slice of the rank's input.  A
 * batch iota (dropout's sample indices, issue 17) is one too: the rank's
 * rows of the global 0..B-1 (an iota over dp's contiguous pieces), sliced. */
static int input_of(Par *P, const Node *n, int mb) {
    int v = n->out[0];
    Sp nat[NAX] = {sh_of(P, AX_BATCH, v), sh_of(P, AX_SEQ, v), REP};
    P->b.loc = n->loc, P->b.layer = n->layer, P->b.phase = n->phase;
    if (P->input[v] < 0) {
        Type t = *vtype(P, v);
        if (is_split(nat[AX_BATCH])) t.dim[0] /= P->dp;
        if (is_split(nat[AX_SEQ])) t.dim[1] /= P->cp;
        Attr *at = ir_alloc(P->m, sizeof(Attr) * (size_t)(n->nattr + 2));
        int na = n->nattr;
        memcpy(at, n->attr, sizeof(Attr) * (size_t)na);
        if (n->op == OP_iota && P->dp > 1)
            at[na++] = ir_attr_str(P->m, "group", "dp"), at[na++] = ir_attr_str(P->m, "layout", "contiguous");
        P->input[v] = ir_out(P->ng, ir_build(&P->b, n->op, 0, NULL, na, at, &t));
        set_sh(P, P->input[v], nat);
    }
    if (P->M == 1) return P->input[v];
    int64_t b = vtype(P, v)->dim[0] / P->pieces[AX_BATCH];
    Attr at[3] = {ir_attr_int(P->m, "dim", 0), ir_attr_int(P->m, "start", mb * b), ir_attr_int(P->m, "end", (mb + 1) * b)};
    int s = ir_build1(&P->b, OP_slice, P->input[v], 3, at);
    set_mb(P, s, mb);
    set_sh(P, s, nat);
    return s;
}

/* attention over a sequence split on cp: cp.c's rewrite, its nodes in
 * micro-batch mb, its outputs sharded as the rule said. */
static void build_cp_attention(Par *P, const Node *n, const int *in, int mb, int *out) {
    int first = P->ng->nnodes;
    P->b.loc = n->loc, P->b.layer = n->layer, P->b.phase = n->phase;
    cp_attention(&P->cpr, n, in, out);
    for (int o = 0; o < n->nout; o++) set_sh_of(P, out[o], n->out[o]);
    for (int i = first; i < P->ng->nnodes; i++) P->ng->nodes[i].mb = mb;
}

static void build_node(Par *P, int i, int mb);

/* An embedding, its backward or a cross entropy over a vocabulary split on
 * tp (read as it is, not gathered: then split on its last dim). */
static int tp_vocab_node(const Par *P, const Node *n) {
    const char *codes = P->tpred + P->convoff[n - P->g->nodes];
    int l = n->nin - 2;
    switch (n->op) {
    case OP_embedding: return is_split(P->sh[AX_TP][n->in[0]]) && !codes[0];
    case OP_embedding_bwd: return is_split(P->sh[AX_TP][n->out[0]]);
    case OP_cross_entropy: case OP_cross_entropy_bwd:
        return is_split(P->sh[AX_TP][n->in[l]]) && !codes[l] && P->sh[AX_TP][n->in[l]].dim == vtype(P, n->in[l])->rank - 1;
    default: return 0;
    }
}

/* tp.c's vocab-parallel rewrite of n, its nodes in micro-batch mb. */
static void build_tp_vocab(Par *P, const Node *n, const int *in, int mb, int *out) {
    int first = P->ng->nnodes, lv = n->in[n->nin - 2];
    int *lse = n->op == OP_cross_entropy || n->op == OP_cross_entropy_bwd ? &P->tplse[(size_t)mb * (size_t)P->g->nvals + (size_t)lv] : NULL;
    P->b.loc = n->loc, P->b.layer = n->layer, P->b.phase = n->phase;
    switch (n->op) {
    case OP_embedding: out[0] = tp_embedding(&P->tpr, in[0], in[1]); break;
    case OP_embedding_bwd: out[0] = tp_embedding_bwd(&P->tpr, in[0], in[1], vtype(P, n->out[0])->dim[0] / P->tp); break;
    case OP_cross_entropy: out[0] = tp_cross_entropy(&P->tpr, in[0], in[1], lse); break;
    default: /* cross_entropy_bwd (dl, logits, targets): the forward's lse, or built again */
        if (*lse < 0) tp_cross_entropy(&P->tpr, in[1], in[2], lse);
        out[0] = tp_cross_entropy_bwd(&P->tpr, in[0], in[1], in[2], *lse);
    }
    set_sh_of(P, out[0], n->out[0]);
    for (int i = first; i < P->ng->nnodes; i++) P->ng->nodes[i].mb = mb;
}

/* The local value of dependent value v in micro-batch mb, building its
 * chain now if the main loop has not reached it yet. */
static int ensure(Par *P, int v, int mb) {
    int *map = P->map + (size_t)mb * (size_t)P->g->nvals;
    if (map[v] >= 0) return map[v];
    const Node *n = def_of(P, v);
    for (int k = 0; k < n->nin; k++)
        if (P->dep[n->in[k]]) ensure(P, n->in[k], mb);
    build_node(P, (int)(n - P->g->nodes), mb);
    return map[v];
}

/* The total of data-only partial sum v: its values in every micro-batch
 * added, then all-reduced over the groups where it is partial; replicated.
 * Built once, its nodes in micro-batch 0. */
static int total(Par *P, int v) {
    if (P->total[v] >= 0) return P->total[v];
    Builder keep = P->b;
    int first = P->ng->nnodes, x = -1;
    int nmb = is_part(sh_of(P, AX_BATCH, v)) ? P->M : 1;
    for (int mb = 0; mb < nmb; mb++) {
        int y = ensure(P, v, mb);
        const Node *n = def_of(P, v);
        P->b.loc = n->loc, P->b.layer = n->layer, P->b.phase = n->phase;
        x = x < 0 ? y : ir_build2(&P->b, OP_add, x, y);
    }
    char group[16] = "";
    for (int ax = 0; ax < NAX; ax++)
        if (is_part(sh_of(P, ax, v)) && (ax == AX_SEQ ? P->cp > 1 : P->dp > 1))
            snprintf(group + strlen(group), sizeof group - strlen(group), "%s%s", *group ? "+" : "", axis_group[ax]);
    if (*group) {
        Attr g = ir_attr_str(P->m, "group", group);
        x = ir_build1(&P->b, OP_allreduce, x, 1, &g);
    }
    set_sh1(P, x, REP, REP);
    for (int j = first; j < P->ng->nnodes; j++) P->ng->nodes[j].mb = 0;
    P->b = keep;
    return P->total[v] = x;
}

/* Node n of micro-batch mb, its inputs converted as the rules said. */
static void build_node(Par *P, int i, int mb) {
    const Node *n = &P->g->nodes[i];
    int *map = P->map + (size_t)mb * (size_t)P->g->nvals;
    if (n->op == OP_input || is_batch_iota(n)) {
        map[n->out[0]] = input_of(P, n, mb);
        return;
    }
    ir_ice_at(n->loc);
    int in[IR_MAXIN], out[8];
    for (int k = 0; k < n->nin; k++) {
        if (P->tot[P->convoff[i] + (size_t)k]) {
            in[k] = total(P, n->in[k]);
            continue;
        }
        Sp w[NAX];
        int shard_dim = -1;
        for (int ax = 0; ax < NAX; ax++) {
            Sp s = P->sh[ax][n->in[k]];
            w[ax] = s;
            if (conv_of(P, ax, i)[k]) { /* a replicated input used split like the node's split inputs */
                Sp d = REP;
                for (int j = 0; j < n->nin && !is_split(d); j++)
                    if (is_split(P->sh[ax][n->in[j]]) && !(ax == AX_TP && P->tpred[P->convoff[i] + (size_t)j])) d = P->sh[ax][n->in[j]];
                for (int j = 0; j < n->nin && !is_split(d); j++)
                    if (ax == AX_TP && P->tpred[P->convoff[i] + (size_t)j] == TP_SCATTER) d = (Sp){SH_SPLIT, 1, 1, vtype(P, n->in[j])->dim[1]};
                if (conv_of(P, ax, i)[k] == 2) shard_dim = d.dim; /* not uniform: sliced from the whole (tp) */
                else w[ax] = d;
            }
        }
        int code = P->tpred[P->convoff[i] + (size_t)k];
        in[k] = code ? tp_convert(P, n->in[k], mb, w, code) : get(P, n->in[k], mb, w);
        if (shard_dim >= 0) in[k] = tp_shard(P, in[k], shard_dim, mb);
    }
    if ((n->op == OP_attention || n->op == OP_attention_bwd) && is_split(P->sh[AX_SEQ][n->in[0]])) {
        build_cp_attention(P, n, in, mb, out);
    } else if (tp_vocab_node(P, n)) {
        build_tp_vocab(P, n, in, mb, out);
    } else {
        Sp wants[8][NAX];
        for (int k = 0; k < n->nout; k++)
            for (int ax = 0; ax < NAX; ax++) wants[k][ax] = P->sh[ax][n->out[k]];
        int j = clone(P, n, in, mb, wants);
        for (int k = 0; k < n->nout; k++) out[k] = P->ng->nodes[j].out[k];
        if (n->op == OP_mean)
            for (int ax = 0; ax < NAX; ax++) {
                Sp x = P->sh[ax][n->in[0]];
                if (!is_split(x) || x.dim != ir_attr_i(n, "dim", 0)) continue;
                /* local mean / pieces = this piece's summand of the global mean */
                int c = const_like(P, &P->ng->vals[out[0]].t, 1.0 / P->pieces[ax]);
                out[0] = ir_build2(&P->b, OP_mul, out[0], c);
                set_mb(P, out[0], mb);
                set_sh(P, out[0], wants[0]);
            }
    }
    for (int k = 0; k < n->nout; k++) {
        int v = n->out[k];
        map[v] = out[k];
        if (!P->to_acc[v]) continue;
        P->acc[v] = P->acc[v] < 0 ? out[k] : ir_build2(&P->b, OP_add, P->acc[v], out[k]);
        set_mb(P, P->acc[v], mb);
        set_sh_of(P, P->acc[v], v);
    }
}

static int is_grad_output(const Node *n) { return strncmp(ir_attr_s(n, "name", ""), "grad:", 5) == 0; }

/* The output nodes, after the last micro-batch: partial values are the
 * accumulated sums; a partial that is not a gradient is all-reduced. */
static void build_output(Par *P, const Node *n) {
    int v = n->in[0], x;
    P->b.loc = n->loc, P->b.layer = n->layer, P->b.phase = n->phase;
    char group[16] = "";
    for (int ax = 0; ax < AX_TP; ax++) {
        Sp s = P->sh[ax][v];
        if (is_split(s))
            error_at(n->loc, "output %s is split over the %s; only sums and replicated values can be outputs",
                     ir_attr_s(n, "name", "?"), ax == AX_BATCH ? "batch" : "sequence");
        if (is_part(s) && (ax == AX_SEQ || P->dp > 1)) snprintf(group + strlen(group), sizeof group - strlen(group), "%s%s", *group ? "+" : "", axis_group[ax]);
    }
    Sp t = P->sh[AX_TP][v]; /* a gradient split over tp is its param's shard; any other output is gathered */
    if (is_split(t) && !is_grad_output(n) && t.stride * t.size != vtype(P, v)->dim[t.dim])
        error_at(n->loc, "output %s is split over tp in pieces that an all-gather cannot join", ir_attr_s(n, "name", "?"));
    if (P->dep[v]) {
        x = P->to_acc[v] ? P->acc[v] : P->map[(size_t)(P->M - 1) * (size_t)P->g->nvals + (size_t)v];
    } else {
        Sp nat[NAX] = {sh_of(P, AX_BATCH, v), sh_of(P, AX_SEQ, v), sh_of(P, AX_TP, v)};
        x = get(P, v, -1, nat);
    }
    if (*group && !is_grad_output(n)) {
        Attr g = ir_attr_str(P->m, "group", group);
        x = ir_build1(&P->b, OP_allreduce, x, 1, &g);
        set_sh1(P, x, REP, REP);
    }
    if (is_part(t) && !(P->tp_bug == 3 && is_grad_output(n))) x = tp_allreduce(P->m, &P->b, x); /* the optimizer reduces over dp x cp only; --test-tp-bug norm-grad forgets it */
    if (is_split(t) && !is_grad_output(n)) {
        Attr g[2] = {ir_attr_str(P->m, "group", "tp"), ir_attr_int(P->m, "dim", t.dim)};
        x = ir_build1(&P->b, OP_allgather, x, 2, g);
    }
    if (is_part(t) || (is_split(t) && !is_grad_output(n))) {
        Sp o[NAX] = {P->sh[AX_BATCH][v], P->sh[AX_SEQ][v], REP};
        if (*group && !is_grad_output(n)) o[AX_BATCH] = o[AX_SEQ] = REP;
        set_sh(P, x, o);
    }
    int j = ir_build(&P->b, OP_output, 1, &x, n->nattr, n->attr, NULL);
    P->ng->nodes[j].mb = P->M - 1;
}

static void check_inputs(const Par *P) {
    const Graph *g = P->g;
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        if (n->op != OP_input) continue;
        const Type *t = &g->vals[n->out[0]].t;
        if (P->pieces[AX_BATCH] > 1 && (t->rank < 1 || t->dim[0] % P->pieces[AX_BATCH]))
            error_at(n->loc, "input %s: the global batch %lld is not divisible by dp %d x micro-batches %d",
                     ir_attr_s(n, "name", "?"), t->rank ? (long long)t->dim[0] : 0LL, P->dp, P->M);
        cp_check_input(&P->cpr, n, t);
    }
}

/* Does value v depend on the inputs (then it is cloned per micro-batch)?
 * On a param or state (then it is never totalled)? */
static void mark_dependent(Par *P) {
    const Graph *g = P->g;
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        int d = n->op == OP_input || is_batch_iota(n), pd = (ir_ops[n->op].flags & F_STATE) != 0; /* batch iota: sample indices, per micro-batch */
        for (int k = 0; k < n->nin; k++) d |= P->dep[n->in[k]], pd |= P->pdep[n->in[k]];
        for (int k = 0; k < n->nout; k++) P->dep[n->out[k]] = (char)d, P->pdep[n->out[k]] = (char)pd;
    }
}

void pass_parallelize(Module *m, const Options *o) {
    if (m->nstages != 1) ICE("parallelize: expects one stage, got %d", m->nstages);
    m->mesh[0] = o->pp, m->mesh[1] = o->dp, m->mesh[2] = o->cp, m->mesh[3] = o->tp;
    int M = o->micro_batches > 0 ? o->micro_batches : 1;
    if (o->dp * M * o->cp * o->tp == 1) return;
    const Graph *g = m->stages[0];
    int nv = g->nvals;
    Par P = {.m = m, .g = g, .dp = o->dp, .M = M, .cp = o->cp, .tp = o->tp, .tp_bug = o->tp_bug};
    P.pieces[AX_BATCH] = o->dp * M, P.pieces[AX_SEQ] = o->cp, P.pieces[AX_TP] = o->tp;
    P.ng = ir_graph_new(m);
    P.b = (Builder){.g = P.ng, .pass = "parallelize", .layer = -1};
    P.cpr = (CpRank){.m = m, .b = &P.b, .cp = o->cp, .dual = !o->cp_contiguous, .ring = o->cp_comm != 0};
    for (int ax = 0; ax < NAX; ax++) P.sh[ax] = xcalloc((size_t)nv, sizeof(Sp));
    P.convoff = xcalloc((size_t)g->nnodes + 1, sizeof(size_t));
    for (int i = 0; i < g->nnodes; i++) P.convoff[i + 1] = P.convoff[i] + (size_t)g->nodes[i].nin;
    P.nconv = P.convoff[g->nnodes];
    P.conv = xcalloc((size_t)NAX * P.nconv + 1, 1);
    P.dep = xcalloc((size_t)nv, 1);
    P.pdep = xcalloc((size_t)nv, 1);
    P.tot = xcalloc(P.nconv + 1, 1);
    P.tpred = xcalloc(P.nconv + 1, 1);
    P.tpar = xcalloc((size_t)nv * (size_t)(M + 1) * 3, sizeof(int));
    P.sp = o->tp > 1 && o->sp != 2;
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i].op == OP_input && g->vals[g->nodes[i].out[0]].t.rank >= 2 && !P.seqlen) P.seqlen = g->vals[g->nodes[i].out[0]].t.dim[1];
    P.tpvocab = xcalloc((size_t)nv, 1);
    P.seqtp = xcalloc((size_t)nv, 1);
    P.tplse = xcalloc((size_t)nv * (size_t)M, sizeof(int));
    for (size_t k = 0; k < (size_t)nv * (size_t)M; k++) P.tplse[k] = -1;
    P.tpr = (TpRank){.m = m, .b = &P.b, .tp = o->tp, .bug = o->tp_bug};
    for (size_t k = 0; k < (size_t)nv * (size_t)(M + 1) * 3; k++) P.tpar[k] = -1;
    P.total = xcalloc((size_t)nv, sizeof(int));
    P.map = xcalloc((size_t)nv * (size_t)M, sizeof(int));
    P.memo = xcalloc((size_t)nv, sizeof(Memo *));
    P.acc = xcalloc((size_t)nv, sizeof(int));
    P.input = xcalloc((size_t)nv, sizeof(int));
    P.to_acc = xcalloc((size_t)nv, 1);
    for (int v = 0; v < nv; v++) P.acc[v] = P.input[v] = P.total[v] = -1;
    for (size_t k = 0; k < (size_t)nv * (size_t)M; k++) P.map[k] = -1;

    check_inputs(&P);
    mark_dependent(&P);
    propagate(&P);
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        if (n->op == OP_output && P.dep[n->in[0]] && (is_part(P.sh[AX_BATCH][n->in[0]]) || is_part(P.sh[AX_SEQ][n->in[0]]) || is_part(P.sh[AX_TP][n->in[0]])))
            P.to_acc[n->in[0]] = 1;
    }

    /* params and states first, in their order (the params space keeps it) */
    for (int i = 0; i < g->nnodes; i++)
        if (ir_ops[g->nodes[i].op].flags & F_STATE) {
            int v = g->nodes[i].out[0];
            get(&P, v, -1, (Sp[NAX]){REP, REP, P.sh[AX_TP][v]});
        }
    for (int mb = 0; mb < M; mb++)
        for (int i = 0; i < g->nnodes; i++)
            if (g->nodes[i].op != OP_output && P.dep[g->nodes[i].out[0]] && P.map[(size_t)mb * (size_t)nv + (size_t)g->nodes[i].out[0]] < 0)
                build_node(&P, i, mb);
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i].op == OP_output) build_output(&P, &g->nodes[i]);

    m->stages[0] = P.ng;
    for (int ax = 0; ax < NAX; ax++) free(P.sh[ax]);
    free(P.conv), free(P.convoff), free(P.dep), free(P.pdep), free(P.tot), free(P.total), free(P.map), free(P.memo), free(P.acc),
        free(P.input), free(P.to_acc), free(P.tpred), free(P.tpar), free(P.tpvocab), free(P.tplse), free(P.seqtp);
}
