/* options.h — the compiler's options: every pass flag, filled from the model's
 * config{} and then the command line (main.c), defaults in options.c.  A pass
 * reads them; it does not depend on the driver. */
#ifndef KILN_OPTIONS_H
#define KILN_OPTIONS_H

#include <stdint.h>

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
    /* --schedule fixed|lhs (schedule.c, lhs.c, docs/schedule.md): the
     * order of each rank's program, SCHED_FIXED (the fixed order) or
     * SCHED_LHS (the latency-hiding list scheduler, the default) */
    int schedule;
    double bucket_mb;
    /* context parallel: the sequence's layout over cp ranks (0: dual chunk,
     * load-balanced; 1: contiguous, for comparison) and how attention
     * communicates (0: all-gather K,V) */
    int cp_contiguous, cp_comm;
    /* activation recompute (recompute.c): the policy (Recompute, default
     * gemm-last) and --activation-budget, bytes of activations saved for
     * backward per rank at the schedule's peak (0: none).  --memory-budget:
     * bytes of device memory per rank, the plan's total (0: none): lhs's
     * limit (schedule.c), and the compile's (cmd/pipeline.c: the policy it
     * picks when --recompute is not given, and a plan over it is an error) */
    int recompute;
    double activation_budget, memory_budget;
    /* optimizer (defaults in opt_defaults) */
    double lr, min_lr, warmup, steps, weight_decay, beta1, beta2, eps, grad_clip;
    uint64_t seed;
    /* --precision bf16 (the GPU's mixed precision, DESIGN §6): pass_precision
     * retypes the step to bf16 weights' copies and activations, f32 master
     * weights, gradients, optimizer and loss; 0 (f32, the CPU's): unchanged */
    int precision_bf16;
    /* kiln sample's forward program: dropout is the identity (issue 17) */
    int no_dropout;
    /* --frontend-timeout S: the Lua front end's wall-clock limit (front_lua.c) */
    double frontend_timeout;
    /* pipeline parallel (pp.c, ppsched.h): chunks per rank (--vpp; 0: the
     * schedule's default), the schedule (PpSchedule), layers per chunk
     * (--pp-layers a,b,...: npp_layers counts; 0: balanced by FLOPs) and a
     * planted bug for the tests (--test-pp-bug: 1 drop-tied, the tied
     * gradient's replica never gets the sum; 2 swap-recv, two micro-batches'
     * activations received in each other's place) */
    int vpp, pp_schedule, npp_layers, pp_bug;
    int *pp_layers;
    /* --device-profile FILE|NAME (profile.h): the device the costs are
     * taken from (offload's auto policy, the cost model); NULL: none given */
    const char *device_profile;
    /* activation offload (offload.c, docs/offload.md): the fraction of each
     * (rank, virtual stage, micro-batch)'s saved bytes sent to host memory
     * (--offload none|all|F: 0, 1 or F in (0,1]), the virtual stages offloaded
     * whole whatever the fraction (--offload-stages LIST: bit s = local
     * virtual stage s), the smallest tensor offloaded (--offload-min-bytes,
     * default 1 MiB) and a planted bug for the tests (--test-offload-bug
     * early-read: 1, a backward reader keeps reading the device copy) */
    double offload; /* OFFLOAD_AUTO: --offload auto */
    uint64_t offload_stages;
    double offload_min_bytes;
    int offload_bug;
    /* tensor parallel (issue 20): a planted bug for the tests
     * (--test-tp-bug drop-bwd-reduce: 1, backward forgets the all-reduce of
     * a column-parallel GEMM's input gradient; xent-max: 2, the
     * vocab-parallel loss shifts by each rank's own max, not the row's;
     * chunk-order: 4, tp_overlap.c joins the forward reduce-scatters of
     * --tp-chunks in reverse order) */
    int tp_bug;
    /* sequence parallel (issue 20): 0 default (on with tp > 1), 1 --sp, 2 --no-sp */
    int sp;
    /* --tp-chunks K (tp_overlap.c, issue 22): the sp all-gather -> MLP ->
     * reduce-scatter chains cut into K token chunks so the collectives
     * overlap the GEMMs; 1 (default, and 0 from a zeroed Options): off */
    int tp_chunks;
    /* the fused classifier (issue 23, xent_fuse.c): cross_entropy and its
     * cross_entropy_bwd become one cross_entropy_fused at the forward.
     * -1 default (on with --target cuda), 0 --xent-fused off, 1 on */
    int xent_fused;
    /* cuBLASLt epilogues (issue 23, gemm_epilogue.c): 1 --gemm-epilogue
     * bias (a bias add into its GEMM), 2 gelu (and bias + GELU with its
     * aux output), 3 bgrad (and bias gradients on weight-gradient GEMMs),
     * 4 all (and dGELU + bias gradient), 0 none (default) */
    int gemm_epilogue;
} Options;
/* Options.offload for --offload auto: each (rank, virtual stage,
 * micro-batch) offloads the fraction of its candidates' bytes whose copies
 * the compute between their forward and backward hides, by the device
 * profile (offload.c, profile.h offload_auto_fraction). */
#define OFFLOAD_AUTO (-1.0)
enum { SCHED_FIXED, SCHED_LHS };
void opt_defaults(Options *o);
/* The optimizer settings a trainer must not be compiled with, as its flags
 * refuse them at run time (and the values that make no sense): lr <= 0,
 * min_lr < 0 or above lr, warmup < 0, steps < 1 (both whole numbers),
 * weight_decay < 0, beta1 or beta2 outside [0, 1), eps <= 0, grad_clip < 0
 * (0 turns clipping off), or any of them not finite.  0, or -1 with one
 * line in err naming the key and where it was set (--set or its shorthand
 * flag, else the model's config{}). */
int opt_check(const Options *o, char *err, int errlen);

#endif
