/* kgroup.h — fused groups as every back end sees them (kgroup.c).
 *
 * The fuse pass marks each group with the int attribute kernel=K on its
 * members (fuse.c's essay).  Before a back end can generate a kernel it needs
 * to know, per group: the members in program order, the values read from
 * outside (the kernel's input pointers), the member values used outside (its
 * output pointers), the iteration shape, whether the memory plan proves the
 * buffers disjoint, and a key saying what the kernel computes, so that equal
 * groups (the same chain in every layer) share one kernel.  None of that
 * depends on the target: the CPU back end (emit_llvm.c) and the CUDA back
 * end (emit_cuda.c) both take it from here and only generate code.
 *
 * A kernel's arguments are always: input pointers (KGroup.in order), output
 * pointers (KGroup.out order), then the element count of KGroup.shape.
 */
#ifndef KILN_KGROUP_H
#define KILN_KGROUP_H

#include "ir.h"

typedef struct {
    int kernel;         /* the `kernel` attribute, or -1 for an implicit singleton */
    int *nodes, nnodes; /* members in program order */
    int *in, nin;       /* values read from outside the group */
    int *out, nout;     /* member values used outside the group */
    Type shape;         /* the iteration space */
    int noalias;        /* buffers proven disjoint by the plan */
    char *key;          /* what the kernel computes: equal keys share one kernel */
    int first;          /* index of the first group with an equal key (itself when it is the first) */
    char name[48];      /* "fused_K" ("fused_nI" for a singleton at node I), for the trace */
} KGroup;

typedef struct {
    const Graph *g;
    int *group_of; /* node -> group index, -1 */
    KGroup *groups; /* in program order of their first members */
    int ngroups;
} KGroups;

/* The program order: node indices by Node.pos (node order when the graph is
 * unscheduled); g->nnodes entries, malloc'd.  A bad or repeated position is
 * an internal error. */
int *kg_program_order(const Graph *g);

/* The groups of g: runs of nodes with the same `kernel` attribute, plus an
 * implicit one-node group for an elementwise node outside any.  A group
 * that is not contiguous in `order`, holds a node that is neither
 * elementwise, broadcast nor const, or mixes iteration spaces is an
 * internal error.  kg_free releases what kg_collect allocated. */
void kg_collect(KGroups *gs, const Graph *g, const int *order, int norder);
void kg_free(KGroups *gs);

/* Node index `node` is a member of gr. */
int kg_in_group(const KGroups *gs, const KGroup *gr, int node);

/* Member n is a broadcast whose source lies outside the group (it reads a
 * group input at broadcast indices; the other kind broadcasts a const member). */
int kg_outside_bcast(const KGroups *gs, const KGroup *gr, const Node *n);

/* Element strides of a row-major tensor of type t. */
void kg_row_strides(const Type *t, int64_t st[IR_MAXRANK]);

/* Position of value vid among the group's inputs / outputs, or -1. */
int kg_in_slot(const KGroup *gr, int vid);
int kg_out_slot(const KGroup *gr, int vid);

/* The index into x, broadcast to big by the numpy rule, of element i of
 * big: the sum over the returned terms of ((i / inner) % len) * stride,
 * where the division is left out when inner is 1, the remainder when
 * mod is 0 (the run spans all of big) and the product when stride is 1.
 * Runs of adjacent dims with the same kind are merged into one term;
 * broadcast dims contribute none.  No terms: the index is 0. */
typedef struct {
    int64_t inner, len, stride;
    int mod;
} KgTerm;
int kg_bcast_terms(const Type *x, const Type *big, KgTerm terms[IR_MAXRANK]);

#endif
