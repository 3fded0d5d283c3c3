/* tune.h — `kiln tune`: the best parallel configuration for a model, a
 * number of devices, a device profile and a memory budget (issue 21).
 * The essay is at the top of tune_search.c; the user's guide is docs/tune.md.
 */
#ifndef KILN_TUNE_H
#define KILN_TUNE_H

#include <stddef.h>

#include "options.h"
#include "profile.h"

/* One configuration: the mesh, the schedule and the memory options. */
typedef struct {
    int tp, cp, dp, pp, v, m; /* m: micro-batches a step */
    int sched;                /* PpSchedule (pp > 1) */
    int rc;                   /* Recompute */
    int offload;              /* 0 none, 1 all */
    int cp_comm;              /* 0 all-gather, 1 p2p (cp > 1) */
} TuneCand;

/* What the model predicts for one. */
typedef struct {
    double step;                          /* seconds */
    double compute, comm, bubble, copy;   /* the split of the step (first stage's view) */
    double mem;                           /* bytes per rank, the largest stage's */
    double tokens_s, mfu;
} TunePred;

typedef struct TuneProbe TuneProbe;
typedef struct TunePlans TunePlans; /* the last few ppsched plans built (tune_search.c) */

typedef struct {
    const char *model;
    KeyVal *sets;   /* the user's --set, then batch and seq */
    int nsets;
    Profile prof;
    int gpus, bf16;
    double memory;  /* bytes per device */
    int batch, seq, layers, heads, kv_heads;
    /* parameters (elements) outside the layers read before them (the
     * embedding: the first stage's) and after them (the head: the last
     * stage's); a tied one counts in both */
    double p_pre, p_post;
    double p_pre_tp, p_post_tp; /* of them, those split over tp (a param's {tp = dim}) */
    /* the probes, cached by key */
    TuneProbe *probes;
    int nprobes, capprobes;
    double probe_seconds; /* compile and simulation time spent in probes */
    TunePlans *plans;
    int bound_pruned;     /* candidates over the memory by tune_lower_bound, never predicted */
    /* per rank (pipeline stage): the last tune_predict's memory, the last
     * tune_full's or tune_verify's memplan peak */
    double *fast_mem, *full_mem;
    int fast_n, fast_cap, full_n, full_cap;
} Tune;

/* A verified row fits when its exact peak is within the budget by this
 * fraction to spare: memplan's best-fit arena packs a program of m'
 * micro-batches within 0.1% of the same program at m (measured: 1f1b
 * m 8 against 16, 0.06%; the 175B zb-v slice against the whole, 0.1%). */
#define TUNE_VERIFY_MARGIN 0.005

/* The exact plan of a candidate on a slice (tune_verify). */
typedef struct {
    int m;              /* the slice's micro-batches: all the layers, the fewest micro-batches with the same pairs in flight */
    double mem;         /* memplan's peak of the largest rank (bytes) */
    int rank;           /* that rank */
    double full_slice;  /* the slice's step, compiled and simulated (cost.c); 0 when over the memory (not simulated) */
    double fast_slice;  /* the fast path's at m' (0: not simulated) */
    double step;        /* the candidate's step: full_slice at m' = m, else the fast path's error at m' carried to m */
    double seconds;     /* wall time it took */
} TuneVerify;

/* Reads the model's shape (layers, heads, batch, seq from the front end,
 * unless batch/seq > 0 are given).  Exits after one line on a user error. */
void tune_init(Tune *T, const char *model, KeyVal *sets, int nsets, const Profile *p, int gpus, double memory, int batch, int seq,
               int bf16);
void tune_free(Tune *T);

/* Why c cannot be built ("" when it can): divisibility, layers, schedule
 * rules, tp. */
void tune_refusal(Tune *T, const TuneCand *c, char *why, size_t n);

/* A lower bound of the fast path's memory of c (bytes per rank) without
 * compiling c's probe: the parameters, gradients and optimizer state of
 * the model (the arena's gathered parameters and gradients with dp > 1)
 * spread evenly over the pp ranks, from an already compiled probe of the
 * same tp, cp and dp > 1 (they do not depend on the micro-batch size,
 * recompute or cp-comm); -1 when there is none yet.  tune_predict's
 * memory is at least this (its largest rank holds at least the mean). */
double tune_lower_bound(const Tune *T, const TuneCand *c);

/* tune_predict for the search: a candidate whose memory is over
 * T->memory returns with its memory and an infinite step, unsimulated. */
int tune_predict_fit(Tune *T, const TuneCand *c, TunePred *out, char *err, size_t errlen);

/* The fast path: one layer's costs and memory from a probe program (two
 * layers, one micro-batch, the candidate's per-rank shapes), composed over
 * the stages' layers and the schedule (ppsched_simulate).  0, or -1 with err. */
int tune_predict(Tune *T, const TuneCand *c, TunePred *out, char *err, size_t errlen);
/* The full path: the whole program compiled and simulated (cost_simulate). */
int tune_full(Tune *T, const TuneCand *c, TunePred *out, char *err, size_t errlen);

/* The exact plan on a slice: the candidate with all its layers and the
 * fewest micro-batches m' at which every rank holds as many (chunk,
 * micro-batch) pairs in flight at its most (ppsched's action lists), so
 * memplan's per-rank peak is the candidate's; compiled and simulated.
 * 0, or -1 with err. */
int tune_verify(Tune *T, const TuneCand *c, const TunePred *fast, TuneVerify *out, char *err, size_t errlen);

/* The `kiln compile` flags of c into buf. */
const char *tune_flags(const Tune *T, const TuneCand *c, char *buf, size_t n);

#endif
