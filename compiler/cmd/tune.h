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
} Tune;

/* Reads the model's shape (layers, heads, batch, seq from the front end,
 * unless batch/seq > 0 are given).  Exits after one line on a user error. */
void tune_init(Tune *T, const char *model, KeyVal *sets, int nsets, const Profile *p, int gpus, double memory, int batch, int seq,
               int bf16);
void tune_free(Tune *T);

/* Why c cannot be built ("" when it can): divisibility, layers, schedule
 * rules, tp. */
void tune_refusal(const Tune *T, const TuneCand *c, char *why, size_t n);

/* The fast path: one layer's costs and memory from a probe program (two
 * layers, one micro-batch, the candidate's per-rank shapes), composed over
 * the stages' layers and the schedule (ppsched_simulate).  0, or -1 with err. */
int tune_predict(Tune *T, const TuneCand *c, TunePred *out, char *err, size_t errlen);
/* The full path: the whole program compiled and simulated (cost_simulate). */
int tune_full(Tune *T, const TuneCand *c, TunePred *out, char *err, size_t errlen);

/* The `kiln compile` flags of c into buf. */
const char *tune_flags(const Tune *T, const TuneCand *c, char *buf, size_t n);

#endif
