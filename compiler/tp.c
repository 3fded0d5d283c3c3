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

int tp_param_dim(const Node *n, const Type *t, int tp) {
    const Attr *a = ir_attr(n, "tp");
    if (!a || tp == 1) return -1;
    int d = (int)ir_attr_i(n, "tp", -1);
    if (d < 0 || d >= t->rank) error_at(n->loc, "param %s: {tp} dim %d out of range", ir_attr_s(n, "name", "?"), d);
    if (t->dim[d] % tp)
        error_at(n->loc, "param %s: dim %d of size %lld is not divisible by --tp %d", ir_attr_s(n, "name", "?"), d + 1,
                 (long long)t->dim[d], tp);
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
