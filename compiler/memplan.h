/* memplan.h — the backend passes (fuse, schedule, memplan) and what they
 * promise to the verifier, the emitters and `kiln plan`.
 *
 * After fuse: a fused group is the contiguous run of nodes carrying the int
 * attribute kernel=K (fuse_group()).  After schedule: every node has a stream
 * (0 compute, 1 comm, 2 d2h, 3 h2d) and pos = its index.  After memplan:
 * every value that needs a buffer has Value.space (a Space of ir.h) and a 64-byte
 * aligned Value.offset; values internal to a fused group have -1.
 *
 * MemLive is the one definition of which values own a buffer and how long it
 * lives; memplan places by it and the verifier checks the placement with it.
 */
#ifndef KILN_MEMPLAN_H
#define KILN_MEMPLAN_H

#include <stdio.h>

#include "passes.h"
#include "kiln_rt.h"

/* pass_fuse (fuse.c), pass_schedule (schedule.c), pass_memplan (memplan.c): kiln.h */

#define MEM_ALIGN 64     /* every offset and every space size */
#define SCHED_NSTREAMS 4 /* compute, comm, d2h, h2d */

/* The fused group (kernel attribute) of node n; -1 when it has none. */
static inline int64_t fuse_group(const Node *n) {
    const Attr *a = ir_attr(n, "kernel");
    return a && a->kind == AT_INT ? a->i : -1;
}

/* Put g's nodes in the order order[0..nnodes-1] (a permutation of node
 * indices), keeping value ids; vals[].def follows.  ICE on a non-permutation;
 * def-before-use is the caller's business (the verifier checks it). */
void sched_reorder(Graph *g, const int *order);

/* Buffers and their lifetimes over program positions (node indices).
 * A view (reshape, loss) uses its input's buffer; a value internal to a fused
 * group (every use inside the group) has none; the group as a whole runs at
 * once, so its inputs live to its last node and its outputs from its first.
 * Program inputs live from 0, values read by output nodes to nnodes (after
 * the last node).  A value used on another stream than its producer's lives
 * until the producer's stream waits for an event recorded after that use
 * (nnodes if none does). */
typedef struct {
    int nvals, nnodes;
    int *root;        /* per value: the value owning its buffer; -1: no buffer */
    int *start, *end; /* per value with root[v] == v: live over [start, end] */
} MemLive;
void memlive_build(const Graph *g, MemLive *L);
void memlive_free(MemLive *L);

/* Bytes of a space per rank (max over stages): the end of its last buffer,
 * rounded up to MEM_ALIGN. */
int64_t memplan_peak(const Module *m, int space);
/* The best any placement could do for ACT: the largest sum of live ACT
 * buffer bytes at one position (max over stages). */
int64_t memplan_lower_bound(const Module *m);
/* The same bound over the model's activations alone: values computed in
 * forward or backward from the data, not gradients, gathered params or
 * optimizer values (what sequence length, recompute and cp change). */
int64_t memplan_fwd_bwd_peak(const Module *m);
/* Peak memory per rank: params, grads, optimizer state, activations, workspace. */
void memplan_report(const Module *m, FILE *f);

#endif
