/* tp.h — tensor parallel: the part of the parallelize pass that knows
 * Megatron's layout (tp.c).  Like cp.h, only parallelize.c and tp.c include
 * it: the two files are one pass.
 */
#ifndef KILN_TP_H
#define KILN_TP_H

#include "ir.h"

/* The dim of param node n (global type t) that tp splits, -1 if the param is
 * replicated over tp (no {tp} attr, or tp == 1); *blocks: the count of
 * blocks the dim is made of ({tp_blocks}, a fused QKV: each rank holds its
 * slice of every block).  A dim not divisible stops with a one-line error
 * at the param's model line. */
int tp_param_dim(const Node *n, const Type *t, int tp, int *blocks);
/* Stop with a one-line error if attention node n (q [B,H,T,D], k [B,KH,S,D],
 * types q and k) cannot split its heads over tp: H or KH not divisible. */
void tp_check_heads(const Node *n, const Type *q, const Type *k, int tp);
/* What the vocab-parallel rewrites need of the rank's graph being built. */
typedef struct {
    Module *m;
    Builder *b; /* the rank's graph, at the Loc, layer and phase of the node rewritten */
    int tp;
    int bug;    /* --test-tp-bug: 2 xent-max (the loss's max not reduced over tp) */
} TpRank;

/* Vocab-parallel embedding: table [V/tp, C] (this rank's rows), ids [..]
 * global; rows of ids outside the rank's range are zero: a partial sum. */
int tp_embedding(TpRank *t, int table, int ids);
/* Its backward: this rank's rows of dtable [V/tp, C] from dy [..,C], ids. */
int tp_embedding_bwd(TpRank *t, int dy, int ids, int64_t vlocal);
/* Vocab-parallel cross entropy of logits [..,V/tp] (this rank's columns)
 * and global targets [..]: f32 [..], the same on every tp rank.  *lse gets
 * the rows' log-sum-exp [..] for the backward. */
int tp_cross_entropy(TpRank *t, int logits, int targets, int *lse);
/* dlogits [..,V/tp] = dl * (softmax - onehot) from the forward's lse. */
int tp_cross_entropy_bwd(TpRank *t, int dl, int logits, int targets, int lse);

/* The all-reduce over tp of x (the partial sum a row-parallel GEMM, or a
 * column-parallel GEMM's input gradient, leaves) in the graph of b. */
int tp_allreduce(Module *m, Builder *b, int x);

#endif
