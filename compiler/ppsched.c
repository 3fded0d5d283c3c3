/* ppsched.c — pipeline schedules as data: the generators of the four
 * schedules, their static proofs and their timing (ppsched.h is the
 * contract; docs/pipeline.md "Schedules" shows each order).
 *
 * A generator writes, for every pipeline rank, the list of (kind, chunk,
 * micro-batch) actions that rank runs, in order.  Nothing here runs a
 * model: the pipeline pass unrolls these lists into each rank's program and
 * kiln plan times them, so the lists are the schedule.
 *
 *   1f1b         PipeDream-flush: rank r runs p−r−1 forwards (warm-up), then
 *                alternates one forward and one backward (steady), then
 *                runs the backwards left (cool-down).
 *   interleaved  Megatron-LM's interleaved 1F1B
 *                (megatron/core/pipeline_parallel/schedules.py): the m·v
 *                forwards of a rank follow get_schedule_table — micro-batches
 *                in groups of p, each group through the rank's chunks in
 *                order — and its backwards the same table with the chunks
 *                reversed; warm-up (p−r−1)·2 + (v−1)·p forwards (at most
 *                m·v), then one forward and one backward, then the rest.
 *   zb-h1        Zero Bubble's ZB-H1 (Qi et al. 2024): 1F1B's order of F and
 *                B (B is the input gradient only) with each weight-gradient
 *                W placed r backwards after its B on rank r, so every rank
 *                holds at most p micro-batches, like 1F1B's first rank,
 *                while the later ranks' B passes reach the earlier ranks
 *                sooner; the W's a rank still owes at the end fill its
 *                cool-down.
 *   zb-v         ZB-V, the handcrafted V schedule of the Zero Bubble
 *                repository (sail-sg/zero-bubble-pipeline-parallelism,
 *                legacy-main, handcrafted_zb_v.py): two chunks per rank in
 *                a V, warm-up 2(p−r)−1 forwards of the first chunk, r
 *                pairs of forwards, p−r forward-backward-weight triples of
 *                the second chunk, a steady phase alternating the chunks,
 *                and a cool-down that runs r pairs of B, then B with W, then
 *                the W's left.  The original needs at least 2p−1
 *                micro-batches; with fewer it pads and leaves the padded
 *                slots empty, and so does this generator (a padded action is
 *                not written).
 *
 * The proof (ppsched_prove) does not trust the generators: it checks the
 * lists as given — each action once on the rank owning its chunk, same-rank
 * dependencies in order, a blocking simulation that must run every action
 * (sends never block, a receive waits for its send), and the in-flight
 * count against ppsched_inflight_bound.  ppsched_simulate runs the same
 * blocking walk with costs: an action starts when its rank is free and
 * its inputs have arrived (plus the latency when they come from another
 * rank).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ppsched.h"

const char *const pp_schedule_names[PS_COUNT] = {"1f1b", "interleaved", "zb-h1", "zb-v"};
const char *const pp_act_names[3] = {"F", "B", "W"};

int pp_schedule_lookup(const char *name) {
    for (int s = 0; s < PS_COUNT; s++)
        if (!strcmp(name, pp_schedule_names[s])) return s;
    return -1;
}

static int zero_bubble(PpSchedule s) { return s == PS_ZBH1 || s == PS_ZBV; }

/* ---- placement ---- */

int pp_chunk(const PpPlan *pl, int rank, int vstage) {
    switch (pl->kind) {
    case PS_INTERLEAVED: return vstage * pl->p + rank;
    case PS_ZBV: return vstage == 0 ? rank : 2 * pl->p - 1 - rank;
    default: return rank;
    }
}

int pp_chunk_rank(const PpPlan *pl, int chunk) {
    switch (pl->kind) {
    case PS_INTERLEAVED: return chunk % pl->p;
    case PS_ZBV: return chunk < pl->p ? chunk : 2 * pl->p - 1 - chunk;
    default: return chunk;
    }
}

int pp_chunk_vstage(const PpPlan *pl, int chunk) {
    switch (pl->kind) {
    case PS_INTERLEAVED: return chunk / pl->p;
    case PS_ZBV: return chunk >= pl->p;
    default: return 0;
    }
}

/* interleaved: the warm-up forwards of rank r */
static int interleaved_warmup(const PpPlan *pl, int r) {
    int w = (pl->p - r - 1) * 2 + (pl->v - 1) * pl->p;
    return w < pl->m * pl->v ? w : pl->m * pl->v;
}

int ppsched_inflight_bound(const PpPlan *pl, int rank) {
    switch (pl->kind) {
    case PS_1F1B: return pl->p - rank;
    case PS_INTERLEAVED: {
        int w = interleaved_warmup(pl, rank);
        return w < pl->m * pl->v ? w + 1 : w;
    }
    case PS_ZBH1: return pl->p;
    default: return 2 * pl->p;
    }
}

/* ---- the generators ---- */

/* Append (kind, chunk at vstage, mb) to rank r's list; a micro-batch past m
 * (zb-v's padding) is not written. */
static void put(PpPlan *pl, int r, ActKind k, int vstage, int mb) {
    if (mb >= pl->m) return;
    pl->act[r][pl->nact[r]++] = (Action){k, pp_chunk(pl, r, vstage), mb};
}

static void gen_1f1b(PpPlan *pl, int r) {
    int m = pl->m, w = pl->p - r - 1 < m ? pl->p - r - 1 : m;
    for (int i = 0; i < w; i++) put(pl, r, ACT_F, 0, i);
    for (int i = 0; i < m - w; i++) put(pl, r, ACT_F, 0, w + i), put(pl, r, ACT_B, 0, i);
    for (int i = m - w; i < m; i++) put(pl, r, ACT_B, 0, i);
}

/* ZB-H1: 1F1B with B the input gradient and W(i) after B(i + r). */
static void gen_zbh1(PpPlan *pl, int r) {
    int m = pl->m, w = pl->p - r - 1 < m ? pl->p - r - 1 : m, nw = 0;
    for (int i = 0; i < w; i++) put(pl, r, ACT_F, 0, i);
    for (int i = 0; i < m; i++) {
        if (i < m - w) put(pl, r, ACT_F, 0, w + i);
        put(pl, r, ACT_B, 0, i);
        if (i >= r) put(pl, r, ACT_W, 0, nw++);
    }
    while (nw < m) put(pl, r, ACT_W, 0, nw++);
}

/* Megatron's get_schedule_table with groups of p (m a multiple of p): the
 * k-th forward of a rank is micro-batch *mb of local chunk *vs. */
static void interleaved_slot(const PpPlan *pl, int k, int *mb, int *vs) {
    int p = pl->p, group = k / (p * pl->v), in = k % (p * pl->v);
    *vs = in / p;
    *mb = group * p + in % p;
}

static void put_interleaved(PpPlan *pl, int r, int k, int forward) {
    int mb, vs;
    interleaved_slot(pl, k, &mb, &vs);
    if (forward) put(pl, r, ACT_F, vs, mb);
    else put(pl, r, ACT_B, pl->v - 1 - vs, mb);
}

static void gen_interleaved(PpPlan *pl, int r) {
    int total = pl->m * pl->v, w = interleaved_warmup(pl, r);
    for (int k = 0; k < w; k++) put_interleaved(pl, r, k, 1);
    for (int k = 0; k < total - w; k++) put_interleaved(pl, r, k + w, 1), put_interleaved(pl, r, k, 0);
    for (int k = total - w; k < total; k++) put_interleaved(pl, r, k, 0);
}

/* ZB-V as handcrafted_zb_v.py writes it, over n = max(2p−1, m)
 * micro-batches of which those past m are left out. */
static void gen_zbv(PpPlan *pl, int r) {
    int p = pl->p, n = 2 * p - 1 > pl->m ? 2 * p - 1 : pl->m;
    int f0 = 0, f1 = 0, b0 = 0, b1 = 0;
    for (int i = 0; i < 2 * (p - r) - 1; i++) put(pl, r, ACT_F, 0, f0++);
    for (int i = 0; i < r; i++) put(pl, r, ACT_F, 1, f1++), put(pl, r, ACT_F, 0, f0++);
    for (int i = 0; i < p - r; i++, b1++)
        put(pl, r, ACT_F, 1, f1++), put(pl, r, ACT_B, 1, b1), put(pl, r, ACT_W, 1, b1);
    while (f1 < f0 || f0 < n) {
        if (f0 < n) put(pl, r, ACT_F, 0, f0++);
        put(pl, r, ACT_B, 0, b0), put(pl, r, ACT_W, 0, b0), b0++;
        put(pl, r, ACT_F, 1, f1++), put(pl, r, ACT_B, 1, b1), put(pl, r, ACT_W, 1, b1), b1++;
    }
    int w0 = b0, w1 = b1;
    for (int i = 0; i < r; i++) put(pl, r, ACT_B, 0, b0++), put(pl, r, ACT_B, 1, b1++);
    for (int i = 0; i < p - r; i++) put(pl, r, ACT_B, 0, b0++), put(pl, r, ACT_W, 0, w0++);
    while (w1 < b1) put(pl, r, ACT_W, 1, w1++);
    while (w0 < b0) put(pl, r, ACT_W, 0, w0++);
}

/* One line in err for a (p, v, m) that schedule s does not allow; v is
 * already the default where 0 was given. */
static int check_shape(PpSchedule s, int p, int v, int m, char *err, size_t errlen) {
    const char *name = pp_schedule_names[s];
    if (p < 1) return snprintf(err, errlen, "--pp %d: the pipeline needs at least 1 stage", p), -1;
    if (m < 1) return snprintf(err, errlen, "--micro-batches %d: needs at least 1", m), -1;
    if (v < 1) return snprintf(err, errlen, "--vpp %d: needs at least 1 chunk per rank", v), -1;
    if (m < p)
        return snprintf(err, errlen, "--micro-batches %d is below --pp %d: a pipeline needs at least one micro-batch per stage", m, p), -1;
    if ((s == PS_1F1B || s == PS_ZBH1) && v > 1)
        return snprintf(err, errlen, "--vpp %d needs --pp-schedule interleaved or zb-v (%s runs one chunk per rank)", v, name), -1;
    if (s == PS_INTERLEAVED && v < 2)
        return snprintf(err, errlen, "--pp-schedule interleaved needs --vpp 2 or more (got %d)", v), -1;
    if (s == PS_INTERLEAVED && m % p)
        return snprintf(err, errlen, "--pp-schedule interleaved needs --micro-batches a multiple of --pp (%d is not a multiple of %d)", m, p), -1;
    if (s == PS_ZBV && v != 2) return snprintf(err, errlen, "--pp-schedule zb-v needs --vpp 2 (got %d)", v), -1;
    return 0;
}

int ppsched_default_v(PpSchedule s) { return s == PS_ZBV || s == PS_INTERLEAVED ? 2 : 1; }

int ppsched_build(PpPlan *out, PpSchedule s, int p, int v, int m, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    if ((int)s < 0 || s >= PS_COUNT) return snprintf(err, errlen, "--pp-schedule: unknown schedule %d", (int)s), -1;
    if (v == 0) v = ppsched_default_v(s);
    if (check_shape(s, p, v, m, err, errlen)) return -1;
    *out = (PpPlan){s, p, v, m, calloc(p, sizeof(int)), calloc(p, sizeof(Action *))};
    int per_rank = (zero_bubble(s) ? 3 : 2) * v * m;
    for (int r = 0; r < p; r++) {
        out->act[r] = malloc(per_rank * sizeof(Action));
        switch (s) {
        case PS_1F1B: gen_1f1b(out, r); break;
        case PS_INTERLEAVED: gen_interleaved(out, r); break;
        case PS_ZBH1: gen_zbh1(out, r); break;
        default: gen_zbv(out, r); break;
        }
    }
    return 0;
}

void ppsched_free(PpPlan *pl) {
    for (int r = 0; pl->act && r < pl->p; r++) free(pl->act[r]);
    free(pl->act);
    free(pl->nact);
    memset(pl, 0, sizeof *pl);
}

/* ---- dependencies and the blocking walk ---- */

static int nchunks(const PpPlan *pl) { return pl->p * pl->v; }

/* the index of (kind, chunk, mb) in per-action tables */
static int aid(const PpPlan *pl, Action a) { return (a.kind * nchunks(pl) + a.chunk) * pl->m + a.mb; }

/* What a must wait for: up to two actions in dep. */
static int deps(const PpPlan *pl, Action a, Action dep[2]) {
    int n = 0;
    if (a.kind == ACT_F && a.chunk > 0) dep[n++] = (Action){ACT_F, a.chunk - 1, a.mb};
    if (a.kind == ACT_B) {
        dep[n++] = (Action){ACT_F, a.chunk, a.mb};
        if (a.chunk < nchunks(pl) - 1) dep[n++] = (Action){ACT_B, a.chunk + 1, a.mb};
    }
    if (a.kind == ACT_W) dep[n++] = (Action){ACT_B, a.chunk, a.mb};
    return n;
}

static int act_fmt(char *buf, size_t len, Action a) {
    return snprintf(buf, len, "%s chunk %d mb %d", pp_act_names[a.kind], a.chunk, a.mb);
}

/* The blocking walk: every rank runs its list in order, an action once all
 * its dependencies have run.  With costs (cost != NULL) it also times each
 * action into start/end (per rank, off[r] + i) and endt (per action id).
 * cur[r] ends at the first action rank r could not run: all nact[r] when
 * the walk ran everything (returns 0), else -1 (deadlock).
 * A rank runs until it blocks and is tried again only when an action its
 * blocked one may depend on has run (one on its chunk or a neighbouring
 * chunk: deps), so a long pipeline is not swept rank by rank for every
 * action.  An action starts at the latest of its rank's last end and its
 * dependencies' ends, whatever the order ranks are tried in: the same
 * times, and the same cur[] at a deadlock (all that can run has run). */
static int walk(const PpPlan *pl, const double *const cost[3], double latency, int *cur, double *endt,
                const int *off, double *start, double *end) {
    int nid = 3 * nchunks(pl) * pl->m, left = 0, nq = 0;
    char *done = calloc(nid, 1), *queued = calloc(pl->p, 1);
    double *free_at = calloc(pl->p, sizeof(double));
    int *queue = malloc(sizeof(int) * (size_t)pl->p); /* ranks to try, each at most once at a time */
    if (!done || !queued || !free_at || !queue) abort();
    for (int r = 0; r < pl->p; r++) cur[r] = 0, left += pl->nact[r], queue[nq++] = pl->p - 1 - r, queued[r] = 1;
    while (nq) {
        int r = queue[--nq];
        queued[r] = 0;
        while (cur[r] < pl->nact[r]) {
            Action a = pl->act[r][cur[r]], dep[2];
            int nd = deps(pl, a, dep), ready = 1;
            double t = free_at[r];
            for (int j = 0; j < nd && ready; j++) {
                ready = done[aid(pl, dep[j])];
                double lat = pp_chunk_rank(pl, dep[j].chunk) != r ? latency : 0;
                if (ready && cost && endt[aid(pl, dep[j])] + lat > t) t = endt[aid(pl, dep[j])] + lat;
            }
            if (!ready) break;
            if (cost) {
                start[off[r] + cur[r]] = t;
                free_at[r] = end[off[r] + cur[r]] = endt[aid(pl, a)] = t + cost[a.kind][a.chunk];
            }
            done[aid(pl, a)] = 1, cur[r]++, left--;
            for (int c = a.chunk - 1; c <= a.chunk + 1; c++) { /* who may wait for a: F on c+1, B on c-1, B and W on c */
                if (c < 0 || c >= nchunks(pl)) continue;
                int q = pp_chunk_rank(pl, c);
                if (q != r && !queued[q]) queued[q] = 1, queue[nq++] = q;
            }
        }
    }
    free(done), free(queued), free(queue);
    free(free_at);
    return left ? -1 : 0;
}

/* ---- the proofs ---- */

/* Each action names a kind the schedule has, a chunk and micro-batch in
 * range, the rank that owns the chunk, and appears once; pos[id] = its
 * index in the rank's list. */
static int prove_once(const PpPlan *pl, int *pos, char *err, size_t errlen) {
    int nk = zero_bubble(pl->kind) ? 3 : 2;
    char a_s[64];
    for (int r = 0; r < pl->p; r++)
        for (int i = 0; i < pl->nact[r]; i++) {
            Action a = pl->act[r][i];
            if ((int)a.kind < 0 || (int)a.kind >= nk || a.chunk < 0 || a.chunk >= nchunks(pl) || a.mb < 0 || a.mb >= pl->m)
                return snprintf(err, errlen, "rank %d action %d: kind %d chunk %d mb %d is not an action of %s with p=%d v=%d m=%d",
                                r, i, (int)a.kind, a.chunk, a.mb, pp_schedule_names[pl->kind], pl->p, pl->v, pl->m), -1;
            act_fmt(a_s, sizeof a_s, a);
            if (pp_chunk_rank(pl, a.chunk) != r)
                return snprintf(err, errlen, "rank %d runs %s, but chunk %d is on rank %d", r, a_s, a.chunk, pp_chunk_rank(pl, a.chunk)), -1;
            if (pos[aid(pl, a)] >= 0)
                return snprintf(err, errlen, "rank %d runs %s twice (actions %d and %d)", r, a_s, pos[aid(pl, a)], i), -1;
            pos[aid(pl, a)] = i;
        }
    for (int k = 0; k < nk; k++)
        for (int c = 0; c < nchunks(pl); c++)
            for (int mb = 0; mb < pl->m; mb++) {
                Action a = {k, c, mb};
                act_fmt(a_s, sizeof a_s, a);
                if (pos[aid(pl, a)] < 0)
                    return snprintf(err, errlen, "rank %d never runs %s", pp_chunk_rank(pl, c), a_s), -1;
            }
    return 0;
}

/* Every dependency on the same rank comes earlier in its list. */
static int prove_local_order(const PpPlan *pl, const int *pos, char *err, size_t errlen) {
    char a_s[64], d_s[64];
    for (int r = 0; r < pl->p; r++)
        for (int i = 0; i < pl->nact[r]; i++) {
            Action a = pl->act[r][i], dep[2];
            int nd = deps(pl, a, dep);
            for (int j = 0; j < nd; j++) {
                if (pp_chunk_rank(pl, dep[j].chunk) != r || pos[aid(pl, dep[j])] < i) continue;
                act_fmt(a_s, sizeof a_s, a), act_fmt(d_s, sizeof d_s, dep[j]);
                return snprintf(err, errlen, "rank %d runs %s (action %d) before %s (action %d) that it needs",
                                r, a_s, i, d_s, pos[aid(pl, dep[j])]), -1;
            }
        }
    return 0;
}

/* The deadlock message: every stuck rank, where it waits and for whom. */
static void deadlock_msg(const PpPlan *pl, const int *cur, const int *pos, char *err, size_t errlen) {
    size_t n = snprintf(err, errlen, "deadlock:");
    const char *sep = " ";
    for (int r = 0; r < pl->p && n < errlen; r++) {
        if (cur[r] >= pl->nact[r]) continue;
        Action a = pl->act[r][cur[r]], dep[2], w = a;
        int nd = deps(pl, a, dep);
        for (int j = 0; j < nd; j++) {
            int o = pp_chunk_rank(pl, dep[j].chunk);
            if (pos[aid(pl, dep[j])] >= cur[o]) w = dep[j];
        }
        char a_s[64], w_s[64];
        act_fmt(a_s, sizeof a_s, a), act_fmt(w_s, sizeof w_s, w);
        n += snprintf(err + n, errlen - n, "%srank %d waits at %s for rank %d (%s)", sep, r, a_s, pp_chunk_rank(pl, w.chunk), w_s);
        sep = "; ";
    }
}

/* No rank holds more (chunk, mb) pairs than ppsched_inflight_bound: a pair
 * enters at its F and leaves at its last backward action (B; W for the
 * zero-bubble schedules). */
static int prove_inflight(const PpPlan *pl, char *err, size_t errlen) {
    ActKind last = zero_bubble(pl->kind) ? ACT_W : ACT_B;
    for (int r = 0; r < pl->p; r++) {
        int n = 0, bound = ppsched_inflight_bound(pl, r);
        for (int i = 0; i < pl->nact[r]; i++) {
            Action a = pl->act[r][i];
            n += a.kind == ACT_F ? 1 : a.kind == last ? -1 : 0;
            if (n <= bound) continue;
            char a_s[64];
            act_fmt(a_s, sizeof a_s, a);
            return snprintf(err, errlen, "rank %d holds %d (chunk, micro-batch) pairs in flight at %s (action %d), above %s's bound %d",
                            r, n, a_s, i, pp_schedule_names[pl->kind], bound), -1;
        }
    }
    return 0;
}

int ppsched_prove(const PpPlan *pl, char *err, size_t errlen) {
    int nid = 3 * nchunks(pl) * pl->m;
    int *pos = malloc(nid * sizeof(int)), *cur = malloc(pl->p * sizeof(int)), rc = 0;
    for (int i = 0; i < nid; i++) pos[i] = -1;
    if (prove_once(pl, pos, err, errlen) || prove_local_order(pl, pos, err, errlen)) rc = -1;
    else if (walk(pl, NULL, 0, cur, NULL, NULL, NULL, NULL)) deadlock_msg(pl, cur, pos, err, errlen), rc = -1;
    else rc = prove_inflight(pl, err, errlen);
    free(pos);
    free(cur);
    return rc;
}

/* ---- timing ---- */

/* On a plan ppsched_prove accepted (actions in range); a plan that
 * deadlocks returns -1. */

int ppsched_simulate(const PpPlan *pl, const double *const cost[3], double latency, PpTimes *out) {
    memset(out, 0, sizeof *out);
    int total = 0, *cur = malloc(pl->p * sizeof(int));
    out->off = malloc((pl->p + 1) * sizeof(int));
    for (int r = 0; r < pl->p; r++) out->off[r] = total, total += pl->nact[r];
    out->off[pl->p] = total;
    out->start = malloc((total ? total : 1) * sizeof(double));
    out->end = malloc((total ? total : 1) * sizeof(double));
    double *endt = calloc(3 * nchunks(pl) * pl->m, sizeof(double));
    int rc = walk(pl, cost, latency, cur, endt, out->off, out->start, out->end);
    free(cur);
    free(endt);
    if (rc) return ppsched_times_free(out), -1;
    double busy = 0;
    for (int i = 0; i < total; i++) {
        busy += out->end[i] - out->start[i];
        if (out->end[i] > out->makespan) out->makespan = out->end[i];
    }
    out->bubble = out->makespan > 0 ? 1 - busy / (pl->p * out->makespan) : 0;
    return 0;
}

void ppsched_times_free(PpTimes *t) {
    free(t->start);
    free(t->end);
    free(t->off);
    memset(t, 0, sizeof *t);
}

/* ---- the lower bound ---- */

/* The derivation is in ppsched.h; zero-bubble schedules read W, the others
 * count their B as the whole backward and never read cost[ACT_W]. */

/* cost of (kind, chunk), W being 0 where B is the whole backward */
static double cost_of(const PpPlan *pl, const double *const cost[3], ActKind k, int c) {
    return k == ACT_W && !zero_bubble(pl->kind) ? 0 : cost[k][c];
}

/* One chunk per rank: the idle of rank r before its first W (1f1b: B),
 * which waits for a micro-batch's whole chain while the in-flight bound
 * lets r run at most k F's (and k B's) — at least s, its start. */
static double first_wait(const PpPlan *pl, const double *const cost[3], double latency, int r, int k, double s) {
    int zb = zero_bubble(pl->kind), p = pl->p;
    double e = (2 * p - 2 - r) * latency, work = k * (cost[ACT_F][r] + (zb ? cost[ACT_B][r] : 0));
    for (int c = 0; c < p; c++) e += cost[ACT_F][c];
    for (int q = zb ? r : r + 1; q < p; q++) e += cost[ACT_B][q];
    return e - work > s ? e - work : s;
}

double ppsched_makespan_bound(const PpPlan *pl, const double *const cost[3], double latency) {
    int p = pl->p, m = pl->m;
    double T = 0, S = 0, chain = 0; /* S: rank r's earliest start; chain: sum over q < r of B_q + latency */
    for (int r = 0; r < p; r++) {
        double busy = 0, idle = S;
        for (int vs = 0; vs < pl->v; vs++)
            for (int k = ACT_F; k <= ACT_W; k++) busy += m * cost_of(pl, cost, (ActKind)k, pp_chunk(pl, r, vs));
        if (pl->v == 1) {
            int bound = ppsched_inflight_bound(pl, r), k = bound < m ? bound : m;
            idle = first_wait(pl, cost, latency, r, k, S);
            /* after the last B: at most k W's on r, then the chain to rank 0 and its W; some W ran before that B only when m > bound */
            double drain = (zero_bubble(pl->kind) && m <= bound ? S : idle) + busy - k * cost_of(pl, cost, ACT_W, r) + chain + cost_of(pl, cost, ACT_W, 0);
            if (r > 0 && drain > T) T = drain;
        }
        if (idle + busy > T) T = idle + busy;
        S += cost[ACT_F][r] + latency; /* chunk r is rank r's first: pp_chunk(pl, r, 0) == r */
        chain += cost[ACT_B][r] + latency;
    }
    return T;
}

/* ---- the layers' cut ---- */

static void *zalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size);
    if (!p) fputs("kiln: out of memory\n", stderr), exit(1);
    return p;
}

/* Contiguous cut of L layers into K chunks minimising the largest chunk's
 * cost (dynamic programming over the cut points); first[k] = chunk k's
 * first layer. */
void ppsched_balance(const double *cost, int L, int K, double pre, double post, int *first) {
    double *sum = zalloc((size_t)L + 1, sizeof(double)), *best = zalloc((size_t)(K + 1) * (size_t)(L + 1), sizeof(double));
    int *cut = zalloc((size_t)(K + 1) * (size_t)(L + 1), sizeof(int));
    for (int i = 0; i < L; i++) sum[i + 1] = sum[i] + cost[i];
    for (int k = 0; k <= K; k++)
        for (int i = 0; i <= L; i++) best[k * (L + 1) + i] = 1e300;
    best[0] = 0;
    for (int k = 1; k <= K; k++)
        for (int i = k; i <= L - (K - k); i++)
            for (int j = k - 1; j < i; j++) {
                double c = sum[i] - sum[j] + (k == 1 ? pre : 0) + (k == K ? post : 0);
                double worst = best[(k - 1) * (L + 1) + j] > c ? best[(k - 1) * (L + 1) + j] : c;
                if (worst < best[k * (L + 1) + i]) best[k * (L + 1) + i] = worst, cut[k * (L + 1) + i] = j;
            }
    for (int k = K, i = L; k >= 1; k--) first[k - 1] = i = cut[k * (L + 1) + i];
    free(sum), free(best), free(cut);
}

/* ---- closed forms ---- */

double ppsched_bubble_formula(PpSchedule s, int p, int v, int m, double tf, double tb, double tw) {
    if (v == 0) v = ppsched_default_v(s);
    switch (s) {
    case PS_1F1B: return (p - 1.0) / (m + p - 1.0);
    case PS_INTERLEAVED: return (p - 1.0) / ((double)v * m + p - 1.0);
    case PS_ZBH1: {
        double idle = (p - 1.0) * (tf + tb - tw);
        if (idle < 0) idle = 0;
        return idle / (m * (tf + tb + tw) + idle);
    }
    default: {
        /* ZB-V at F = B = W per chunk, in units of one of them: every rank
         * computes 6m; the step is the first chunk's forward ramp (p − 1)
         * after 6m, or, below m = (3p − 1)/2, 4m + 4p − 2 */
        double step = 6.0 * m + p - 1 > 4.0 * m + 4 * p - 2 ? 6.0 * m + p - 1 : 4.0 * m + 4 * p - 2;
        return 1 - 6.0 * m / step;
    }
    }
}
