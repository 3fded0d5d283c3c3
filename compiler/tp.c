/* tp.c — tensor parallelism (Megatron-LM, Shoeybi et al. 2019): the layout.
 *
 * Tensor parallelism splits the weights of each transformer layer over the
 * tp ranks, so each rank does 1/tp of every GEMM of the layer.  Megatron's
 * layout pairs the GEMMs so that one collective per pair suffices:
 *
 *   attention:  Q, K, V  column-parallel (each rank: H/tp query heads and
 *               KH/tp kv heads, so attention itself is local)
 *               out      row-parallel    (partial sum -> all-reduce over tp)
 *   MLP:        up (and SwiGLU's gate) column-parallel, down row-parallel.
 *
 * Column-parallel: W [in, out] split on its columns (dim 1), the bias with
 * it; the input x is replicated, the output split on its last dim.
 * Row-parallel: W split on its rows (dim 0); the input is split on its last
 * dim (exactly as the column-parallel GEMM left it), the output is a partial
 * sum, all-reduced before anything non-linear (the bias, the residual add)
 * reads it.  In backward the same holds mirrored: the input gradient of a
 * column-parallel GEMM is a partial sum, all-reduced before the norm's
 * backward reads it (Llama's wq, wk, wv add their three partial gradients
 * first, so one all-reduce serves them: Megatron's f/g operators).  Weight
 * gradients come out split like their weights; replicated params (norm
 * gains, row-parallel biases, embeddings) get the full gradient on every tp
 * rank, identical everywhere, so the optimizer counts their squares once in
 * the gradient norm.
 *
 * How the pairs are found: by annotation, not by pattern matching.  A param
 * declared `param(name, shape, init, {tp = dim})` is split over tp on that
 * dim (models/lib/nn.lua's `linear{tp="col"|"row"}` does it for the layers
 * of the GPT MLP, the Llama attention and SwiGLU).  Everything else follows
 * from parallelize's sharding propagation with a third axis, tp: the
 * matmul rule gives split or partial outputs, reshapes carry a split of
 * [B,T,H*D] onto the heads of [B,T,H,D], attention splits its heads, and a
 * partial sum over tp that reaches an op that is not linear in it is
 * all-reduced there (parallelize.c, `tpred`).  Propagation cannot go wrong
 * silently: an unannotated model is replicated over tp (every rank computes
 * everything, which is correct and slow), and an annotation that leaves an
 * op an impossible layout (a norm over a split dim) is an error at the
 * model's line.  The annotation is checked by the DSL (dim in range) and by
 * this file (divisible by tp; heads and kv heads divisible by tp).
 */
#include "tp.h"

#include <string.h>

int tp_param_dim(const Node *n, const Type *t, int tp, int *blocks) {
    const Attr *a = ir_attr(n, "tp");
    *blocks = (int)ir_attr_i(n, "tp_blocks", 1);
    if (!a || tp == 1) return -1;
    int d = (int)ir_attr_i(n, "tp", -1);
    if (d < 0 || d >= t->rank || *blocks < 1 || t->dim[d] % *blocks)
        error_at(n->loc, "param %s: bad {tp} dim %d or {tp_blocks} %d", ir_attr_s(n, "name", "?"), d, *blocks);
    if (t->dim[d] % ((int64_t)tp * *blocks))
        error_at(n->loc, "param %s: dim %d of size %lld is not divisible by --tp %d%s", ir_attr_s(n, "name", "?"), d + 1,
                 (long long)t->dim[d], tp, *blocks > 1 ? " in each of its blocks" : "");
    return d;
}

void tp_check_heads(const Node *n, const Type *q, const Type *k, int tp) {
    if (q->dim[1] % tp)
        error_at(n->loc, "attention: %lld heads are not divisible by --tp %d", (long long)q->dim[1], tp);
    if (k->dim[1] % tp)
        error_at(n->loc, "attention: %lld kv heads are not divisible by --tp %d (GQA: each tp rank needs whole kv heads)",
                 (long long)k->dim[1], tp);
}

int tp_allreduce(Module *m, Builder *b, int x) {
    Attr g = ir_attr_str(m, "group", "tp");
    return ir_build1(b, OP_allreduce, x, 1, &g);
}

/* ----------------------------------------------------------------------
 * Vocab-parallel embedding and cross entropy (Megatron's
 * VocabParallelEmbedding and vocab_parallel_cross_entropy).  The table
 * [V, C] is split on its rows, so the tied LM head's logits [.., V] come out
 * split on the vocabulary, and are never gathered: each rank's log-sum-exp
 * piece is max-shifted by the row's global max (the ranks' maxima
 * all-gathered, tp values per row), the sums of exponentials all-reduced,
 * and the target's logit picked by the one rank that holds it (the others
 * contribute 0) and all-reduced.  Built from the IR's own ops: the rank's
 * vocabulary offset is an iota {group="tp", layout="contiguous"} (this
 * rank's global column indices), a token's one-hot row over the local
 * columns is relu(1 - |target - column|) (exact on integers), and an id's
 * "in my range" mask is min(relu(d + 1), 1) * min(relu(Vl - d), 1) with
 * d = id - offset.
 * ---------------------------------------------------------------------- */

static const Type *ty(TpRank *t, int v) { return &t->b->g->vals[v].t; }

static int cst(TpRank *t, const Type *like, DType dt, double v) {
    Type c = *like;
    c.dt = dt;
    Attr a = ir_attr_float(t->m, "v", v);
    return ir_out(t->b->g, ir_build(t->b, OP_const, 0, NULL, 1, &a, &c));
}
static int cast_to(TpRank *t, int x, DType dt) {
    if (ty(t, x)->dt == dt) return x;
    Attr a = ir_attr_str(t->m, "dtype", ir_dtype_names[dt]);
    return ir_build1(t->b, OP_cast, x, 1, &a);
}
static int reshape_to(TpRank *t, int x, const int64_t *dim, int rank) {
    Attr a = ir_attr_ints(t->m, "shape", dim, rank);
    return ir_build1(t->b, OP_reshape, x, 1, &a);
}
static int bcast_to(TpRank *t, int x, const Type *to) {
    Attr a = ir_attr_ints(t->m, "shape", to->dim, to->rank);
    return ir_build1(t->b, OP_broadcast, x, 1, &a);
}
/* x [..] -> [..,1] -> broadcast to `to` [..,n] */
static int rows_to(TpRank *t, int x, const Type *to) {
    Type r = *ty(t, x);
    r.dim[r.rank++] = 1;
    return bcast_to(t, reshape_to(t, x, r.dim, r.rank), to);
}
static int red(TpRank *t, Op op, int x, int keep) {
    Attr a[2] = {ir_attr_int(t->m, "dim", ty(t, x)->rank - 1), ir_attr_int(t->m, "keep", keep)};
    return ir_build1(t->b, op, x, 2, a);
}
static int allreduce_tp(TpRank *t, int x) { return tp_allreduce(t->m, t->b, x); }

/* f32 [n]: this rank's global vocabulary indices (offset + 0..n-1). */
static int columns(TpRank *t, int64_t n) {
    Type it = {.dt = DT_I32, .rank = 1, .dim = {n}};
    Attr a[2] = {ir_attr_str(t->m, "group", "tp"), ir_attr_str(t->m, "layout", "contiguous")};
    return cast_to(t, ir_out(t->b->g, ir_build(t->b, OP_iota, 0, NULL, 2, a, &it)), DT_F32);
}

/* f32 [..,Vl]: 1 where targets[..] is this rank's column j, else 0 */
static int onehot(TpRank *t, int targets, const Type *like) {
    Type f = *like;
    f.dt = DT_F32;
    int d = ir_build2(t->b, OP_sub, rows_to(t, cast_to(t, targets, DT_F32), &f), bcast_to(t, columns(t, f.dim[f.rank - 1]), &f));
    return ir_build1(t->b, OP_relu, ir_build2(t->b, OP_sub, cst(t, &f, DT_F32, 1.0), ir_build1(t->b, OP_abs, d, 0, NULL)), 0, NULL);
}

/* ids [..] as this rank's local rows: *mask f32 [..] (1 in range, else 0)
 * and the ids clamped into [0, Vl) (i32). */
static int local_ids(TpRank *t, int ids, int64_t vl, int *mask) {
    Type f = *ty(t, ids);
    f.dt = DT_F32;
    Attr s[3] = {ir_attr_int(t->m, "dim", 0), ir_attr_int(t->m, "start", 0), ir_attr_int(t->m, "end", 1)};
    int off = ir_build1(t->b, OP_slice, columns(t, vl), 3, s); /* [1]: the rank's first row */
    int d = ir_build2(t->b, OP_sub, cast_to(t, ids, DT_F32), bcast_to(t, off, &f));
    int one = cst(t, &f, DT_F32, 1.0);
    int lo = ir_build2(t->b, OP_minimum, ir_build1(t->b, OP_relu, ir_build2(t->b, OP_add, d, one), 0, NULL), one);
    int hi = ir_build2(t->b, OP_minimum, ir_build1(t->b, OP_relu, ir_build2(t->b, OP_sub, cst(t, &f, DT_F32, (double)vl), d), 0, NULL), one);
    *mask = ir_build2(t->b, OP_mul, lo, hi);
    int c = ir_build2(t->b, OP_minimum, ir_build1(t->b, OP_relu, d, 0, NULL), cst(t, &f, DT_F32, (double)(vl - 1)));
    return cast_to(t, c, DT_I32);
}

int tp_embedding(TpRank *t, int table, int ids) {
    int mask, loc = local_ids(t, ids, ty(t, table)->dim[0], &mask);
    int y = ir_build2(t->b, OP_embedding, table, loc);
    return ir_build2(t->b, OP_mul, y, cast_to(t, rows_to(t, mask, ty(t, y)), ty(t, y)->dt));
}

int tp_embedding_bwd(TpRank *t, int dy, int ids, int64_t vlocal) {
    int mask, loc = local_ids(t, ids, vlocal, &mask);
    int g = ir_build2(t->b, OP_mul, dy, cast_to(t, rows_to(t, mask, ty(t, dy)), ty(t, dy)->dt));
    Attr v = ir_attr_int(t->m, "v", vlocal);
    int in[2] = {g, loc};
    return ir_out(t->b->g, ir_build(t->b, OP_embedding_bwd, 2, in, 1, &v, NULL));
}

int tp_cross_entropy(TpRank *t, int logits, int targets, int *lse) {
    int x = cast_to(t, logits, DT_F32);
    const Type *tx = ty(t, x);
    int r = tx->rank;
    int m = red(t, OP_max, x, 1); /* [..,1]: this rank's max */
    if (t->bug != 2) {            /* --test-tp-bug xent-max keeps the local max */
        Attr g[2] = {ir_attr_str(t->m, "group", "tp"), ir_attr_int(t->m, "dim", r - 1)};
        m = red(t, OP_max, ir_build1(t->b, OP_allgather, m, 2, g), 1); /* the row's global max */
    }
    Type xt = *tx;
    int e = ir_build1(t->b, OP_exp, ir_build2(t->b, OP_sub, x, bcast_to(t, m, &xt)), 0, NULL);
    int s = allreduce_tp(t, red(t, OP_sum, e, 0));
    *lse = ir_build2(t->b, OP_add, ir_build1(t->b, OP_log, s, 0, NULL), reshape_to(t, m, xt.dim, r - 1));
    int pick = allreduce_tp(t, red(t, OP_sum, ir_build2(t->b, OP_mul, x, onehot(t, targets, &xt)), 0));
    return ir_build2(t->b, OP_sub, *lse, pick);
}

int tp_cross_entropy_bwd(TpRank *t, int dl, int logits, int targets, int lse) {
    int x = cast_to(t, logits, DT_F32);
    Type xt = *ty(t, x);
    int p = ir_build1(t->b, OP_exp, ir_build2(t->b, OP_sub, x, rows_to(t, lse, &xt)), 0, NULL);
    int d = ir_build2(t->b, OP_mul, rows_to(t, cast_to(t, dl, DT_F32), &xt), ir_build2(t->b, OP_sub, p, onehot(t, targets, &xt)));
    return cast_to(t, d, ty(t, logits)->dt);
}
