/* rt_common.h — what the two devices (dev_cpu.c, dev_cuda.c) share:
 * runtime/rt_common.c's device-neutral host logic.  Not part of the ABI.
 *
 * Both devices check a program table the same way, lay its spaces out the
 * same way and initialise its parameters with the same generator, so a
 * CUDA run starts from bit-identical f32 master weights to a CPU run.  The
 * init writes through rt_tensor_ptr, i.e. into the device's host views:
 * on the CPU that is the program's memory, on a GPU the host mirror, which
 * dev_cuda.c then pushes.
 */
#ifndef KILN_RT_COMMON_H
#define KILN_RT_COMMON_H
#include <stddef.h>
#include <stdio.h>

#include "rt_private.h"

/* "params", "grads", "opt", "act" */
extern const char *const rt_space_name[RT_NSPACES];

static inline int64_t rt_dtype_size(int dt) {
    switch (dt) {
    case RT_BF16: case RT_F16: return 2;
    case RT_I64: return 8;
    default: return 4;
    }
}

static inline int64_t rt_tensor_numel(const rt_tensor *t) {
    int64_t n = 1;
    for (int d = 0; d < t->rank; d++) n *= t->dim[d];
    return n;
}

static inline int64_t rt_tensor_bytes(const rt_tensor *t) { return rt_tensor_numel(t) * rt_dtype_size(t->dtype); }

/* "the CPU device", "the CUDA device (sm_90)" ("the CUDA device" when arch
 * is NULL) for messages; buf holds it. */
const char *rt_device_name(int device, const char *arch, char *buf, int len);

/* p against a runtime for `device` (RT_DEV_*): its ABI version, its
 * device, the table's counts and every tensor inside its space.  1, or 0
 * after one line on stderr. */
int rt_check_program(const rt_program *p, int device);
/* The distributed optimizer's buckets against the mesh and the params, the
 * sharded states against their buckets, and every storage-less param in
 * exactly one param shard.  1, or 0 after one line on stderr. */
int rt_check_buckets(const rt_program *p);

/* Zeroed, page-aligned host memory of at least `bytes` (64 at least; huge
 * pages advised from 2 MiB), for the space `space` (messages).  NULL after
 * one line on stderr; *mapped receives the size to give rt_unmap_host. */
char *rt_map_host(int64_t bytes, const char *space, size_t *mapped);
/* 0, or -1 after one line on stderr. */
int rt_unmap_host(char *m, size_t mapped);

/* 1 when 0 <= v < n; else rt_fail "who: what v out of range (program has
 * n)" and 0 (a stream or event index the step function passed). */
int rt_in_range(rt_ctx *c, int v, int n, const char *what, const char *who);

/* rt_launch's arguments: a stream in range, a kernel, nargs >= 0; else
 * rt_fail and 0. */
int rt_launch_ok(rt_ctx *c, int stream, int nstreams, rt_kernel k, int nargs, const char *name);

/* Params from their init, states zero (param shards: this rank's chunk of
 * their members' inits), written through rt_tensor_ptr.  Normal draws run
 * in blocks on rt_parallel_for.  A param with an unknown init, or "ones" /
 * "normal" on a tensor that is not f32, prints one line and exits 1. */
void rt_init_host(rt_ctx *c, const rt_program *p, uint64_t seed);
/* s up to end (NULL: its end) to f as a JSON string: the --trace writers
 * (runtime/cpu/dev_cpu.c, runtime/cuda/trace_cuda.c) */
void rt_json_string(FILE *f, const char *s, const char *end);

#endif
