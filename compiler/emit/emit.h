/* emit.h — code generation (emit_host.c: the host program, the same for
 * every device; emit_llvm.c: the LLVM plumbing and the CPU kernels, both
 * with the LLVM C API; emit_cuda.c: CUDA C kernels and their cubins;
 * emit_priv.h: who does what).
 *
 * The input is a module that has been through fuse, schedule and memplan:
 * every materialised value has its space/offset, every node its stream/pos,
 * and fused groups carry the `kernel` attribute.  The output is a program in
 * the runtime ABI of runtime/kiln_rt.h: the constant table `kiln_program`
 * (an rt_program), its step function and one kernel per fused group.  LLVM's
 * types stay inside emit_llvm.c and emit_host.c.
 *
 * Pipeline stages (nstages = mesh[0] > 1): one program per stage in the same
 * object, each with its own step, kernels and table; kiln_program is stage
 * 0's and every table's `stages` points to all of them (kiln_rt.h; the
 * trainer picks its rank's).  The CUDA target emits one stage only.
 *
 * Multi-rank programs: the table carries the module's mesh and the buckets
 * of the distributed optimizer (from the bucket attributes of state nodes);
 * collectives and shard become calls of the runtime's comm kernels.  A param
 * the step never reads has no storage (space = offset = -1 in the table):
 * its values live in a bucket's state with prefix "".  A
 * module the back end cannot emit (an unknown op, an inconsistent bucket, a
 * collective the runtime has no kernel for) is an internal error naming it.
 */
#ifndef KILN_EMIT_H
#define KILN_EMIT_H

#include <stddef.h>
#include <stdio.h>

#include "ir.h"

typedef struct rt_program rt_program; /* runtime/kiln_rt.h */
typedef struct Jit Jit;

/* A CUDA module the program embeds (rt_cubin in the table). */
typedef struct {
    char name[32];       /* "generated", "layernorm", ... */
    unsigned char *data; /* the cubin, malloc'd */
    size_t size;
} EmitCubin;

/* What a program is for.  NULL means the CPU.  For CUDA the host program
 * is the same straight-line step, but its fused groups launch the
 * generated kernels through rtk_fused (their names in the table, in the
 * order emit_cuda_text writes them), the library launches run the CUDA
 * runtime's rtk_* (kernels_cuda.c), the table carries the cubins and the
 * scratch each stream needs (kernels/cuda/README.md), and no CPU kernel
 * is generated. */
typedef struct {
    int device;              /* RT_DEV_CPU or RT_DEV_CUDA (kiln_rt.h) */
    const char *arch;        /* CUDA: "sm_90" */
    int ncubins;
    const EmitCubin *cubins; /* CUDA: from emit_cuda_cubins */
    int attention_cudnn;     /* CUDA: attention that qualifies runs on cuDNN's SDPA (emit_host.c) */
    int attention_tc;        /* CUDA: attention with D 16, 32, 64 or 128 runs on attention_tc.cu (tensor cores) */
} EmitTarget;

/* JIT the scheduled and planned module; *prog points at the program table in
 * JIT memory (valid until emit_jit_free).  NULL + message on failure. */
Jit *emit_jit(const Module *m, const rt_program **prog, char *err, size_t errlen);
void emit_jit_free(Jit *j);

/* Write an object file for the host CPU defining the symbol `kiln_program`
 * (its step function and kernels are local symbols of the object).
 * 0, or -1 + message. */
int emit_object(const Module *m, const char *path, char *err, size_t errlen);

/* The same for target t (NULL: the CPU). */
int emit_object_for(const Module *m, const EmitTarget *t, const char *path, char *err, size_t errlen);

/* Write the optimized LLVM IR as text (kiln's `--emit llvm`), for the host CPU. */
int emit_llvm_text(const Module *m, FILE *f, char *err, size_t errlen);

/* The same for a named CPU and feature string (LLVM's names, e.g. "x86-64"
 * and ""): output that does not depend on the machine, for golden tests. */
int emit_llvm_text_for(const Module *m, FILE *f, const char *cpu, const char *features, char *err, size_t errlen);
/* The host program for target t (NULL: the CPU) as text. */
int emit_llvm_text_target(const Module *m, const EmitTarget *t, FILE *f, char *err, size_t errlen);

/* Write the fused elementwise kernels as one CUDA C translation unit
 * (kiln's `--emit cuda`, emit_cuda.c): one extern "C" __global__ kernel per
 * distinct fused group, kiln_fused_K(inputs..., outputs..., long long n),
 * a grid-stride loop; f32/bf16 values are bf16 in memory, the math is f32.
 * For NVRTC; no GPU needed.  0, or -1 + message (nothing written). */
int emit_cuda_text(const Module *m, FILE *f, char *err, size_t errlen);

/* The cubins a CUDA program for t embeds, compiled for t->arch with NVRTC
 * through its cache (nvrtc_cache.c), warnings failing: every library
 * kernel file (kernels/cuda/ *.cu, in name order, each its own module named
 * after the file; attention_tc.cu only with t->attention_tc) and, when the
 * module has fused groups, the generated kernels ("generated").  *out is
 * malloc'd (free with emit_cubins_free).  0, or -1 with NVRTC's one-line
 * message; when the generated kernels fail and keep_src is not NULL, their
 * source is written there and the message names it (NVRTC's log gives its
 * lines).  t's cubins and ncubins are not read. */
int emit_cuda_cubins(const Module *m, const EmitTarget *t, const char *keep_src, EmitCubin **out, int *n, char *err,
                     size_t errlen);
void emit_cubins_free(EmitCubin *c, int n);
/* The library kernels' cubins alone (every kernels/cuda .cu file; attention_tc.cu
 * only when asked), compiled exactly as emit_cuda_cubins compiles them for
 * a trainer: what kiln calibrate --device cuda measures. */
int emit_cuda_library_cubins(const char *arch, int attention_tc, EmitCubin **out, int *n, char *err, size_t errlen);

/* Bytes of scratch the CUDA library launch of node n needs on its stream
 * (kernels/cuda/README.md's sizes; 0 for most ops), rounded up to 256. */
int64_t emit_cuda_scratch(const Module *m, const Node *n);
/* 0 when, between every two pipeline stages, the sends' order (by tag) is
 * the receives' order, as NCCL pairs them; else -1 with err naming the
 * first transfer out of order. */
int emit_cuda_p2p_order(const Module *m, char *err, size_t errlen);

#endif
