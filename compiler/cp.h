/* cp.h — context parallel: the part of the parallelize pass that rewrites
 * attention over a sequence split on the cp axis (cp.c).
 *
 * parallelize.c and cp.c are one pass in two files: parallelize.c
 * propagates the shardings and rebuilds the graph per rank, and calls
 * these functions where the sequence axis needs more than a clone.  Only
 * those two files include this header; the rule that no pass calls a
 * function in another pass's file treats them as one pass.
 */
#ifndef KILN_CP_H
#define KILN_CP_H

#include "ir.h"

/* What the rewrite needs of the rank's graph being built. */
typedef struct {
    Module *m;
    Builder *b;  /* the rank's graph, at the Loc, layer and phase of the node rewritten */
    int cp;      /* ranks on the sequence axis */
    int dual;    /* dual-chunk layout (chunks r and 2cp-1-r); else contiguous pieces */
    int ring;    /* --cp-comm p2p: ring attention; else all-gather K,V */
    int64_t tag; /* the next send/recv tag */
} CpRank;

/* Stop with the model's line if input node n (global type t) does not cut
 * into the layout's chunks along the sequence (dim 1). */
void cp_check_input(const CpRank *c, const Node *n, const Type *t);
/* The attrs {group="cp", layout} that make an iota the rank's global
 * positions; returns their count (2). */
int cp_position_attrs(const CpRank *c, Attr at[2]);
/* attention or attention_bwd node n of the global graph over a sequence
 * split on cp, built with the rank's inputs in[]; out[] gets its outputs. */
void cp_attention(CpRank *c, const Node *n, const int *in, int *out);

#endif
