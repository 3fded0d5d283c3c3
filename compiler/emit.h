/* emit.h — code generation for the CPU target (emit_llvm.c, LLVM C API).
 *
 * The input is a module that has been through fuse, schedule and memplan:
 * every materialised value has its space/offset, every node its stream/pos,
 * and fused groups carry the `kernel` attribute.  The output is a program in
 * the runtime ABI of runtime/kiln_rt.h: the constant table `kiln_program`
 * (an rt_program), its step function and one kernel per fused group.  LLVM's
 * types stay inside emit_llvm.c.
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

/* JIT the scheduled and planned module; *prog points at the program table in
 * JIT memory (valid until emit_jit_free).  NULL + message on failure. */
Jit *emit_jit(const Module *m, const rt_program **prog, char *err, size_t errlen);
void emit_jit_free(Jit *j);

/* Write an object file for the host CPU defining the symbol `kiln_program`
 * (its step function and kernels are local symbols of the object).
 * 0, or -1 + message. */
int emit_object(const Module *m, const char *path, char *err, size_t errlen);

/* Write the optimized LLVM IR as text (kiln's `--emit llvm`), for the host CPU. */
int emit_llvm_text(const Module *m, FILE *f, char *err, size_t errlen);

/* The same for a named CPU and feature string (LLVM's names, e.g. "x86-64"
 * and ""): output that does not depend on the machine, for golden tests. */
int emit_llvm_text_for(const Module *m, FILE *f, const char *cpu, const char *features, char *err, size_t errlen);

/* Write the fused elementwise kernels as one CUDA C translation unit
 * (kiln's `--emit cuda`, emit_cuda.c): one extern "C" __global__ kernel per
 * distinct fused group, kiln_fused_K(inputs..., outputs..., long long n),
 * a grid-stride loop; f32/bf16 values are bf16 in memory, the math is f32.
 * For NVRTC; no GPU needed.  0, or -1 + message (nothing written). */
int emit_cuda_text(const Module *m, FILE *f, char *err, size_t errlen);

#endif
