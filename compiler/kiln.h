/* kiln.h — the compiler's pieces as the driver (main.c) sees them:
 * options, the front end, the passes (one file each, one signature), and the
 * reference interpreter.  The IR itself is in ir.h. */
#ifndef KILN_H
#define KILN_H

#include "ir.h"

/* ---- options: flags, filled from the model's config{} then the command line ---- */
typedef struct {
    const char *key, *value;
} KeyVal;

typedef struct {
    /* --set key=value: overrides of the model's config{} */
    KeyVal *sets;
    int nsets;
    /* mesh */
    int pp, dp, cp, tp;
    /* data parallel: micro-batches per step (gradient accumulation); the
     * distributed optimizer (zero 1, default) or plain all-reduce (zero 0);
     * bucket size in MiB; no_overlap: collectives on the compute stream;
     * drop_event (tests only): the schedule forgets its first wait */
    int micro_batches, zero, no_overlap, drop_event;
    double bucket_mb;
    /* context parallel: the sequence's layout over cp ranks (0: dual chunk,
     * load-balanced; 1: contiguous, for comparison) and how attention
     * communicates (0: all-gather K,V) */
    int cp_contiguous, cp_comm;
    /* activation recompute (recompute.c): the policy (Recompute, default
     * gemm-last) and an optional budget in bytes for the activations saved
     * for backward per rank (0: none) */
    int recompute;
    double memory_budget;
    /* optimizer (defaults in opt_defaults) */
    double lr, min_lr, warmup, steps, weight_decay, beta1, beta2, eps, grad_clip;
    uint64_t seed;
    /* --precision bf16 (the GPU's mixed precision, DESIGN §6): pass_precision
     * retypes the step to bf16 weights' copies and activations, f32 master
     * weights, gradients, optimizer and loss; 0 (f32, the CPU's): unchanged */
    int precision_bf16;
} Options;
void opt_defaults(Options *o);

/* ---- front end (front_lua.c) ---- */
/* Run the model file in the Lua sandbox and build its forward graph.  On a
 * user error returns NULL with one line "file:line: message" in err.  The
 * model's final config{} values (after --set) that name optimizer settings
 * (lr, min_lr, warmup, steps, weight_decay, beta1, beta2, eps, grad_clip) are
 * written into *o unless the command line gave them. */
Module *fe_load(const char *path, Options *o, char *err, size_t errlen);

/* ---- passes: one file each, one signature ---- */
typedef void (*PassFn)(Module *m, const Options *o);
void pass_autodiff(Module *m, const Options *o);  /* autodiff.c */
void pass_parallelize(Module *m, const Options *o); /* parallelize.c: shard over the mesh (dp) and micro-batches */
void pass_recompute(Module *m, const Options *o); /* recompute.c: what backward rereads, what it recomputes */
/* Bytes of forward activations (values computed from the step's data) that
 * backward or recompute nodes read (saved from forward into backward), of
 * one layer or (INT_MIN) all. */
int64_t recompute_saved_bytes(const Graph *g, int layer);
void pass_optimizer(Module *m, const Options *o); /* optimizer.c */
void pass_precision(Module *m, const Options *o); /* precision.c: bf16 mixed precision (o->precision_bf16) */
void pass_fuse(Module *m, const Options *o);      /* fuse.c: elementwise chains -> generated kernels */
void pass_schedule(Module *m, const Options *o);  /* schedule.c: streams, events, linear order */
void pass_memplan(Module *m, const Options *o);   /* memplan.c: static offsets per memory space */
void pass_forward(Module *m, const Options *o);   /* forward.c: keep what output "logits" needs (inference) */

/* ---- interpreter (interp.c): runs any module, all mesh ranks in one process ---- */
typedef struct {
    Type t;
    int64_t n;  /* element count */
    double *d;  /* values; f32 mode rounds every result through float */
} Tensor;

typedef struct Interp Interp;
/* f64 = 0: f32 semantics (every op result rounded to float); 1: f64. */
Interp *interp_new(const Module *m, int f64);
void interp_free(Interp *it);
/* Params from their init attrs (normal(std) from a generator seeded by
 * hash(name) ^ seed, identical on every rank), states zero. */
void interp_init_state(Interp *it, uint64_t seed);
/* Persistent tensor (param or state) `name` of a rank; NULL if none.
 * Writable: tests perturb parameters through it. */
Tensor *interp_state(Interp *it, int rank, const char *name);
/* Copy n values into input `name` of rank; -1 if no such input or n differs. */
int interp_set_input(Interp *it, int rank, const char *name, const double *data, int64_t n);
/* Execute one step on every rank.  0, or -1 with a message (e.g. a token id
 * out of range, a deadlock in send/recv) in err. */
int interp_run(Interp *it, char *err, size_t errlen);
/* After a run: output `name` of rank, or the value with id vid. NULL if none. */
const Tensor *interp_output(const Interp *it, int rank, const char *name);
const Tensor *interp_value(const Interp *it, int rank, int vid);

#endif
