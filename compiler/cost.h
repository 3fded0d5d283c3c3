/* cost.h — the cost model (issue 21): seconds for every node of the planned
 * per-rank programs from a device profile, and a simulation of those
 * programs over their streams and events, every pipeline rank together.
 *
 * The essay (what is modelled, how time is split) is at the top of cost.c;
 * the profile's fields and formulas are profile.h's; docs/tune.md shows the
 * model's use.
 */
#ifndef KILN_COST_H
#define KILN_COST_H

#include <stdint.h>
#include <stdio.h>

#include "ir.h"
#include "options.h"
#include "profile.h"

/* Seconds of node n of stage graph g on the profile's device, alone:
 *   GEMM          2MNK / (peak(dtype) · gemm_eff(MNK)) + launch
 *   attention     its FLOPs / (peak(dtype) · attn_eff) + launch (fwd, bwd)
 *   collectives   profile_coll_seconds by kind, the group's size and link
 *                 (intra when the group fits in one node of node_size ranks)
 *   send          p2p α + bytes/β; recv 0 (its time is its sender's)
 *   offload/reload  bytes / d2h_bw or h2d_bw
 *   record, wait, sources but const/iota, output, views, an assign
 *                 memplan placed in its param's buffer: 0
 *   the rest      bytes read and written / profile_mem_bw(bytes) + launch (a fused group
 *                 pays one launch: its first member; cost_simulate also
 *                 leaves out the values internal to a group, which never
 *                 reach memory)  */
double cost_node_seconds(const Profile *p, const Graph *g, const Node *n);

/* The traffic classes of exposed time (issue 22's per-stream report):
 * collectives and transfers by their mesh axis (a group over one axis is
 * that axis's; over several, dp when it has dp — the gradient and loss
 * reductions over dp+cp, pp+dp+cp —, else cp, else tp, else pp), host
 * copies by direction, and the pipeline bubble. */
typedef enum { COST_DP, COST_CP, COST_PP, COST_TP, COST_D2H, COST_H2D, COST_BUBBLE, COST_NCLASS } CostClass;
extern const char *const cost_class_names[COST_NCLASS]; /* "dp", "cp", "pp", "tp", "d2h", "h2d", "bubble" */

/* Per class, seconds of the step during which this rank's compute stream
 * sat idle because of that class (not hidden behind compute).  Σ over the
 * classes = CostRank.comm + copy + bubble. */
typedef struct {
    double s[COST_NCLASS];
} CostExposed;

/* The class of a comm or copy node (its group's axes, its direction); -1
 * for any other node. */
int cost_node_class(const Node *n);

/* One pipeline rank's (stage's) step, split (they sum to CostSim.step):
 *   compute   busy time of the compute stream's own work (no comm, no waits)
 *   comm      exposed communication: the compute stream idle waiting for
 *             collectives and transfers (and comm on the compute stream)
 *   bubble    idle waiting for other pipeline ranks (a pp recv or a
 *             collective over pp blocked on its partner), plus the time
 *             from this rank's last node to the slowest rank's
 *   copy      idle waiting for host copies (offload/reload)  */
typedef struct {
    double end;     /* this rank's last node's end */
    double compute, comm, bubble, copy;
    CostExposed exposed; /* comm, copy and bubble by class (cost_node_class) */
    double flops;   /* model FLOPs of this rank's program (GEMMs, attention; not recompute) */
    int64_t peak;   /* memplan's bytes: params + grads + optimizer + activations */
    int64_t host;   /* memplan's host space (offloaded activations) */
} CostRank;

typedef struct {
    int nstages;
    double **start, **end; /* [stage][node] simulated times */
    CostRank *rank;        /* [stage] */
    double step;           /* the slowest rank's end */
    double mfu;            /* Σ flops / (pp · step · peak of the GEMMs' dtype) */
    double peak_flops;     /* that peak */
    int shared;            /* replayed under processor sharing (cost.c): ranks sharing cores */
    int domains, domain_ranks, domain_cores; /* then: sharing domains, ranks and cores in each */
} CostSim;

/* Simulate module m (after schedule; after memplan for the peaks).  dur:
 * per stage and node the seconds to use (NULL: cost_node_seconds of p; p
 * may then be NULL only if dur is given).  Each stream runs its nodes in
 * program order; a wait starts its stream again when its event's record
 * has run; a collective whose group spans pipeline ranks finishes at the
 * latest arrival of its participants (its k-th such collective on every
 * rank) plus its duration; one within a stage (dp, cp: the same program on
 * every member) at its own arrival plus its duration; a recv ends when the
 * matching send (pp: the sending stage's send of that tag; others: the
 * send ir_p2p_peer pairs it with) has ended.  0, or -1 with one line in
 * err (a deadlock names the stuck nodes). */
int cost_simulate(const Module *m, const Profile *p, double *const *dur, CostSim *out, char *err, size_t errlen);

/* Processor sharing (cost.c's "processor sharing" section): when the
 * profile has `cores` (a CPU node's, shared by its ranks' threads) and
 * some node's activities can demand more than it has, cost_simulate
 * replays the programs event by event, each activity at min(1, cores /
 * demand) of its speed alone; else (GPU profiles, no `cores`) it sweeps
 * with fixed durations.  Tests set cost_force_shared to run the
 * event-driven replay anyway: with no domain over its cores it must equal
 * the sweep. */
extern int cost_force_shared;
void cost_sim_free(CostSim *s);

/* kiln plan's lines: the predicted step, MFU, per rank the split and memory,
 * and per rank the exposed time by class. */
void cost_report(const Module *m, const Profile *p, const CostSim *s, FILE *f);

#endif
