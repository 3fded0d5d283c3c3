/* emit_priv.h — the seam between the host emitter and the kernel emitters
 * (internal to compiler/emit/; emit.h is the public interface).
 *
 * A program is two things: the host program, which is the same on every
 * device, and the kernels of its fused groups, which are the device's own.
 *
 *   emit_host.c  the host program: the step function kiln_step (one
 *                rt_launch per library op or fused group, in program order,
 *                with the schedule's events and the recv fences), the table
 *                kiln_program (params, states, inputs, outputs, streams,
 *                events, the distributed optimizer's buckets, the cubins and
 *                kernel names of a CUDA program) and the learning-rate
 *                schedule kiln_schedule.  It asks the device (e->cuda) only
 *                how to launch a fused group (its CPU kernel, or rtk_fused
 *                with the index of its CUDA kernel), whether attention may
 *                run on cuDNN, which dtypes a library kernel takes, and for
 *                the table fields only CUDA fills (arch, cubins, kernel
 *                names, scratch).
 *   emit_llvm.c  the LLVM plumbing: the context, module and target machine,
 *                the runtime ABI's LLVM types (checked against kiln_rt.h),
 *                verifying, optimizing, the JIT, object files and text, the
 *                public emit_* entry points; and the CPU's kernel emitter:
 *                one LLVM function kiln_fused_K per group key (em_cpu_kernels).
 *   emit_cuda.c  the CUDA kernel emitter: the same groups as CUDA C, compiled
 *                to cubins that the host's table embeds; no LLVM.
 *
 * build_module (emit_llvm.c) makes the module and the Em below, then
 * (em_stages) hands a copy of it per pipeline stage (Em.stage, Em.g) to
 * em_host_program, which calls the CPU's kernel emitter before it builds
 * the step (the step launches the kernels it made).  A third device adds its
 * kernel emitter, called at that one place, and its RT_DEV_* in the table;
 * the step and the table stay as they are.
 */
#ifndef KILN_EMIT_PRIV_H
#define KILN_EMIT_PRIV_H

#include <llvm-c/Core.h>
#include <string.h>

#include "emit.h"
#include "kgroup.h"

/* ---- the emitter's state ---- */

typedef struct {
    const Module *m;
    const Graph *g;        /* the stage being emitted: m->stages[stage] */
    int stage;
    LLVMValueRef stages_gv; /* kiln_stages: every stage's table (rt_program.stages) */
    LLVMValueRef table;     /* this stage's table, once emit_table has made it */
    const EmitTarget *tgt; /* NULL: the CPU */
    int cuda;              /* the target is RT_DEV_CUDA */
    int *kindex;           /* CUDA: [group]: its generated kernel's index in the table */
    int nkernels;
    int64_t scratch;       /* CUDA: the most scratch one library launch needs */
    LLVMContextRef c;
    LLVMModuleRef mod;
    LLVMBuilderRef b;
    /* types */
    LLVMTypeRef tvoid, ti8, ti32, ti64, tf32, tf64, tp8, tpp8, tp64;
    LLVMTypeRef tkernel, tbody, tstep, tlaunch, tevent, tpfor, ttensor, tbucket, tschedule, tcubin, tprogram;
    /* runtime entry points and helpers */
    LLVMValueRef rt_launch, rt_record, rt_wait, rt_parallel_for, expf_, tanhf_;
    /* the step function being built */
    LLVMValueRef step, ctx, base[SPACE_COUNT], args; /* base: per IR space */
    int maxargs; /* the args array's length */
    /* program order and groups */
    int *order, norder;
    KGroups kg;             /* the fused groups (kgroup.h) */
    LLVMValueRef *group_fn; /* [group]: its rt_kernel, set on the first group of each key */
    LLVMValueRef *reg; /* value id -> register in the loop being built */
    double flops, hw_flops; /* model and hardware FLOPs of a step (add_flops) */
    const Node *sched;     /* the lr_cosine node whose attributes are the schedule, NULL if none */
    LLVMValueRef schedule; /* kiln_schedule, the mutable rt_schedule (collect_schedule), NULL if none */
    const Node *user; /* the node whose launch or table entry is being built (for internal errors) */
    /* recv fences (recv_fences): extra events after/before program positions */
    int *fence_after, *fence_after_stream, *fence_before; /* per position: event id or -1 */
    int nevents_extra, nevents_base;
} Em;

static inline LLVMValueRef I64(Em *e, int64_t v) { return LLVMConstInt(e->ti64, (unsigned long long)v, 1); }
static inline LLVMValueRef I32(Em *e, int v) { return LLVMConstInt(e->ti32, (unsigned long long)(int64_t)v, 1); }
static inline LLVMValueRef F32(Em *e, double v) { return LLVMConstReal(e->tf32, v); }

static inline void add_fn_attr(Em *e, LLVMValueRef fn, LLVMAttributeIndex idx, const char *name) {
    unsigned kind = LLVMGetEnumAttributeKindForName(name, strlen(name));
    if (!kind) ICE("emit: LLVM has no attribute %s", name);
    LLVMAddAttributeAtIndex(fn, idx, LLVMCreateEnumAttribute(e->c, kind, 0));
}

static inline LLVMValueRef add_fn(Em *e, const char *name, LLVMTypeRef ty, int internal) {
    LLVMValueRef fn = LLVMAddFunction(e->mod, name, ty);
    if (internal) LLVMSetLinkage(fn, LLVMInternalLinkage);
    add_fn_attr(e, fn, LLVMAttributeFunctionIndex, "nounwind");
    return fn;
}

/* ---- the functions that cross the seam ---- */

/* emit_host.c: program order, fused groups, schedule, the device's kernels,
 * kiln_step and kiln_program, into e->mod (types and runtime declared). */
void em_host_program(Em *e);

/* emit_llvm.c: the CPU's kernels, one kiln_fused_K per group key, into
 * e->group_fn (e->kg collected). */
void em_cpu_kernels(Em *e);

#endif
