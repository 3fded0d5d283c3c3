/* ppsched.h — pipeline schedules as data (ppsched.c): which (chunk,
 * micro-batch) work each pipeline rank does, in what order, and the static
 * proofs that an order is sound.
 *
 * The model's layers are cut into p·v chunks (virtual stages), chunk 0
 * holding the embedding and chunk p·v−1 the head and the loss.  A schedule
 * is, for every pipeline rank, a list of actions over (chunk, micro-batch):
 *   F  the chunk's forward;
 *   B  its backward: the whole backward for 1f1b and interleaved; only the
 *      input gradients (what the previous chunk waits for) for the
 *      zero-bubble schedules;
 *   W  zero-bubble schedules only: the weight gradients of (chunk, mb),
 *      which nothing downstream waits for.
 * Dependencies: F(c,m) after F(c−1,m); B(c,m) after F(c,m) and B(c+1,m);
 * W(c,m) after B(c,m).  When c−1 (or c+1) lives on another rank the value
 * travels by send/recv: sent right after the producing action (sends never
 * block), received right before the consuming one (a recv blocks until the
 * message is there).  That is the blocking order ppsched_prove simulates,
 * and the order the pipeline pass unrolls into each rank's program.
 *
 * Placement of chunks (pp_chunk_rank, pp_chunk):
 *   1f1b, zb-h1  v = 1, chunk c on rank c;
 *   interleaved  v >= 2, chunk c on rank c mod p, local virtual stage c / p;
 *   zb-v         v = 2, chunk c < p on rank c (virtual stage 0), chunk
 *                c >= p on rank 2p−1−c (virtual stage 1): the V shape.
 */
#ifndef KILN_PPSCHED_H
#define KILN_PPSCHED_H

#include <stddef.h>

typedef enum { PS_1F1B, PS_INTERLEAVED, PS_ZBH1, PS_ZBV, PS_COUNT } PpSchedule;
extern const char *const pp_schedule_names[PS_COUNT]; /* "1f1b", "interleaved", "zb-h1", "zb-v" */
int pp_schedule_lookup(const char *name);             /* -1 if unknown */

typedef enum { ACT_F, ACT_B, ACT_W } ActKind;
extern const char *const pp_act_names[3]; /* "F", "B", "W" */

typedef struct {
    ActKind kind;
    int chunk, mb;
} Action;

typedef struct PpPlan {
    PpSchedule kind;
    int p, v, m;   /* ranks, chunks per rank, micro-batches */
    int *nact;     /* [p]: actions of rank r */
    Action **act;  /* [p][nact[r]] in execution order */
} PpPlan;

/* Check (p, v, m) for schedule s (one line in err naming the flag:
 * "--micro-batches 3 is below --pp 4 ...", "--vpp 2 needs --pp-schedule
 * interleaved or zb-v", "interleaved needs --micro-batches a multiple of
 * --pp", ...), then build the per-rank action lists.  v = 0 means the
 * schedule's default (1; interleaved and zb-v 2).  0, or -1 with err. */
int ppsched_build(PpPlan *out, PpSchedule s, int p, int v, int m, char *err, size_t errlen);
/* The chunks per rank schedule s runs when --vpp is not given: 2 for
 * interleaved and zb-v, else 1. */
int ppsched_default_v(PpSchedule s);
void ppsched_free(PpPlan *pl);

int pp_chunk_rank(const PpPlan *pl, int chunk);        /* the rank that runs chunk */
int pp_chunk(const PpPlan *pl, int rank, int vstage);  /* the chunk at (rank, local virtual stage) */
int pp_chunk_vstage(const PpPlan *pl, int chunk);      /* its local virtual stage */

/* The in-flight bound the schedule promises on rank r: the most (chunk,
 * micro-batch) pairs whose F has run and whose last backward action (B, or
 * W for the zero-bubble schedules) has not (1f1b: p − r; the others as
 * documented in docs/pipeline.md). */
int ppsched_inflight_bound(const PpPlan *pl, int rank);

/* The static proofs: every action appears exactly once, every dependency on
 * the same rank comes earlier in its list, simulating the ranks' blocking
 * order (sends never block, a recv blocks until its send has run) never
 * deadlocks, and no rank exceeds ppsched_inflight_bound.  0, or -1 with one
 * line naming the rank, action and micro-batch ("deadlock: rank 1 waits at
 * B chunk 1 mb 3 for rank 2, ..."). */
int ppsched_prove(const PpPlan *pl, char *err, size_t errlen);

/* Timing of a plan from per-chunk costs (seconds or any unit): cost[k][c]
 * for kind k (ACT_F, ACT_B, ACT_W; for 1f1b/interleaved B is the whole
 * backward and W unused) and a fixed latency per transfer between ranks.
 * Each rank runs its list in order, an action starting when the rank is
 * free and its inputs have arrived. */
typedef struct {
    double *start, *end; /* [p][nact[r]] flattened in rank order: index off[r] + i */
    int *off;            /* [p+1] */
    double makespan;     /* the step: the latest end */
    double bubble;       /* idle fraction: 1 − (busy time of all ranks) / (p · makespan) */
} PpTimes;
int ppsched_simulate(const PpPlan *pl, const double *const cost[3], double latency, PpTimes *out);
void ppsched_times_free(PpTimes *t);

/* A lower bound on the makespan of any order of the plan's actions that
 * keeps every rank within ppsched_inflight_bound, at the same per-chunk
 * costs and latency L as ppsched_simulate (docs/pipeline.md "How close
 * zb-h1 is to the best order").  Rank r starts no earlier than S_r, the
 * forwards of the chunks before its first one (and r·L), and works busy_r.
 * With one chunk per rank (1f1b, zb-h1), K_r = min(in-flight bound, m):
 *   - its first W (1f1b: its first B) waits for a micro-batch's whole chain,
 *     E_r = sum of all F + sum_{q>=r} B_q (1f1b: q>r) + (2p−2−r)·L, and
 *     before it rank r can run at most K_r F's and K_r B's (1f1b: K_r F's):
 *     idle_r >= max(S_r, E_r − K_r·(F_r + B_r)) (1f1b: E_r − K_r·F_r);
 *   - after its last B at most K_r W's are left on it, and the last
 *     backward goes on through ranks r−1 .. 0 and rank 0's W.
 *   T >= idle_r + busy_r
 *   T >= idle_r + busy_r − K_r·W_r + sum_{q<r} (B_q + L) + W_0   (r >= 1;
 *        zb-h1 with m <= K_r: S_r for idle_r, no W need run before the
 *        last B)
 * (1f1b and interleaved: B is the whole backward, W is 0.)  With v > 1 only
 * S_r + busy_r.  When ppsched_simulate's makespan equals it, no order under
 * the same bounds is faster: what is left of the bubble is the stages'
 * costs, not the order. */
double ppsched_makespan_bound(const PpPlan *pl, const double *const cost[3], double latency);

/* The contiguous cut of L layers (cost[i] each) into K chunks that
 * minimises the largest chunk's cost, pre added to chunk 0 and post to
 * the last (the embedding and the head); first[k] = chunk k's first layer
 * (first has K + 1 entries).  pp.c's default balance, and kiln tune's
 * (tune_search.c), so both cut the same layers. */
void ppsched_balance(const double *cost, int L, int K, double pre, double post, int *first);

/* The closed-form bubble of schedule s with equal per-chunk costs
 * (tf, tb, tw per chunk; 1f1b (p−1)/(m+p−1) of the step...) for reports
 * beside the simulated one. */
double ppsched_bubble_formula(PpSchedule s, int p, int v, int m, double tf, double tb, double tw);

#endif
