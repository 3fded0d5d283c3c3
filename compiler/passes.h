/* passes.h — the passes: one file each, one signature.  The driver's
 * pipelines (cmd/pipeline.c) list them in order; tests call them one by one. */
#ifndef KILN_PASSES_H
#define KILN_PASSES_H

#include "ir.h"
#include "options.h"

typedef void (*PassFn)(Module *m, const Options *o);
void pass_autodiff(Module *m, const Options *o);  /* autodiff.c */
void pass_parallelize(Module *m, const Options *o); /* parallelize.c (+ cp.c): shard over the mesh (dp, cp) and micro-batches */
/* tp_overlap.c: with --tp-chunks K > 1, the sp all-gather -> token-wise chain -> reduce-scatter regions cut into K token chunks */
void pass_tp_overlap(Module *m, const Options *o);
void pass_recompute(Module *m, const Options *o); /* recompute.c: what backward rereads, what it recomputes */
/* Bytes of forward activations (values computed from the step's data) that
 * backward or recompute nodes read (saved from forward into backward), of
 * one layer or (INT_MIN) all. */
int64_t recompute_saved_bytes(const Graph *g, int layer);
/* pp.c: one program per pipeline rank, each its chunks' work unrolled in the
 * schedule's order (ppsched.h), send/recv between the ranks */
void pass_pipeline(Module *m, const Options *o);
/* The pipeline's action of every node of the program before it (pp.c's
 * cut, anchoring and zero-bubble split): chunk (-1: floating, no action),
 * kind (ppsched.h's ActKind: F, B, W) and micro-batch; xcalloc'd arrays of
 * g->nnodes + 1 the caller frees, in *out.  pl: ppsched_build's plan for o. */
struct PpPlan;
typedef struct {
    int *chunk;
    char *kind;
    int *mb;
} PpActions;
void pp_actions(const Graph *g, const Options *o, const struct PpPlan *pl, PpActions *out);
/* offload.c: saved activations to host memory between forward and backward (docs/offload.md) */
void pass_offload(Module *m, const Options *o);
void pass_optimizer(Module *m, const Options *o); /* optimizer.c */
void pass_precision(Module *m, const Options *o); /* precision.c: bf16 mixed precision (o->precision_bf16) */
void pass_fuse(Module *m, const Options *o);      /* fuse.c: elementwise chains -> generated kernels */
/* xent_fuse.c: cross_entropy + its backward -> cross_entropy_fused (o->xent_fused == 1); run by pass_fuse first */
void xent_fuse(Module *m, const Options *o);
/* gemm_epilogue.c: matmul + broadcast bias add -> matmul_bias (o->gemm_epilogue >= 1), with 3 (bgrad) a weight
 * gradient GEMM + its bias's sumto -> matmul_bgrad, with 4 (all) matmul + gelu_bwd + sumto -> matmul_dgelu_bgrad; with 2 (gelu)
 * matmul_bias + gelu -> matmul_bias_gelu; run by pass_fuse */
void gemm_epilogue(Module *m, const Options *o);
void pass_schedule(Module *m, const Options *o);  /* schedule.c: streams, events, linear order */
void pass_memplan(Module *m, const Options *o);   /* memplan.c: static offsets per memory space */
void pass_forward(Module *m, const Options *o);   /* forward.c: keep what output "logits" needs (inference) */

#endif
