/* offload.h — what the offload pass (offload.c, issue 19) lends `kiln plan
 * --offload` (cmd/plan_offload.c): its cost of a node and its notion of a
 * saved activation.  The pass itself is pass_offload (passes.h). */
#ifndef KILN_OFFLOAD_H
#define KILN_OFFLOAD_H

#include "ir.h"
#include "options.h"
#include "profile.h"

/* The profile's seconds for node n, as --offload auto counts them: GEMMs
 * and attention by FLOPs at the peak and GEMM efficiency, the rest by the
 * bytes they read and write at the memory bandwidth, each plus a launch;
 * communication, sources, sinks, events and views 0. */
double offload_node_seconds(const Profile *p, const Graph *g, const Node *n);

/* saved[v] (nvals bytes) = 1 when value v is a saved activation of g: made
 * in forward by a non-source op (a recv counts) from the step's data, and
 * read by a backward, recompute or weight-gradient node. */
void offload_saved_values(const Graph *g, char *saved);

/* With --pp and a profile: per rank, per node the time its pipeline action
 * (F, B or W of a chunk and micro-batch) starts in ppsched_simulate over
 * the ranks' node seconds (offload_node_seconds; communication free), -1
 * for a node of no action; the offload pass and `kiln plan --offload` start
 * a node no earlier (the bubble the rank's own program does not show).
 * NULL without --pp.  Free with offload_pp_starts_free(st, m->nstages). */
double **offload_pp_starts(const Module *m, const Options *o, const Profile *p);
void offload_pp_starts_free(double **st, int n);

#endif
