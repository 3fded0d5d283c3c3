/* tp.h — tensor parallel: the part of the parallelize pass that knows
 * Megatron's layout (tp.c).  Like cp.h, only parallelize.c and tp.c include
 * it: the two files are one pass.
 */
#ifndef KILN_TP_H
#define KILN_TP_H

#include "ir.h"

/* The dim of param node n (global type t) that tp splits, -1 if the param is
 * replicated over tp (no {tp} attr, or tp == 1).  A dim not divisible by tp
 * stops with a one-line error at the param's model line. */
int tp_param_dim(const Node *n, const Type *t, int tp);
/* Stop with a one-line error if attention node n (q [B,H,T,D], k [B,KH,S,D],
 * types q and k) cannot split its heads over tp: H or KH not divisible. */
void tp_check_heads(const Node *n, const Type *q, const Type *k, int tp);
/* The all-reduce over tp of x (the partial sum a row-parallel GEMM, or a
 * column-parallel GEMM's input gradient, leaves) in the graph of b. */
int tp_allreduce(Module *m, Builder *b, int x);

#endif
