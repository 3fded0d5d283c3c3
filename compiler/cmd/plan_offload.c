/* plan_offload.c — `kiln plan --offload ...` and `kiln plan --max-seq
 * --memory GiB` (issue 19, docs/offload.md).
 *
 *   kiln plan MODEL --offload none|all|auto|F [--pp N ...] [--device-profile P]
 *       after the memory report, one row per (rank, virtual stage): the
 *       saved activations' bytes (every micro-batch's), the bytes the
 *       offload pass sends to the host, the copies' seconds for one
 *       micro-batch (d2h + h2d at the profile's bandwidths) against the
 *       compute they hide in (the shortest, over that micro-batch's
 *       offloads, of the compute-stream seconds from the offload to the
 *       reload's first reader), and the stalls the copies cause there;
 *       then per rank the device peak (params + grads + optimizer state +
 *       activation arena) with offload and without (the same flags with
 *       --offload none, compiled too), the host space, the step's seconds
 *       and the predicted exposed copy time.
 *
 *   kiln plan MODEL --max-seq --memory GiB [flags]
 *       the longest sequence whose device peak (the largest over ranks)
 *       fits GiB, for recompute none, gemm-last, and gemm-last with the
 *       given --offload policy (auto when none is given): each found by
 *       compiling plans, doubling seq from one step (128·cp tokens) until it
 *       does not fit, then bisecting between the last two (about 2·log2(seq)
 *       compiles per policy).  For the offload row the exposed copy time at
 *       that sequence, as a share of the step.
 *
 * The time model.  A node costs the profile's seconds as --offload auto
 * counts them (offload.h); an offload costs bytes/d2h_bw, a reload
 * bytes/h2d_bw; communication costs nothing (its own costs belong to the
 * cost model, issue 21).  The rank's program (node order = program order
 * after `schedule`) runs on per-stream clocks: a node starts when its
 * stream is free, a record stamps its event with its stream's clock, a wait
 * moves its stream's clock to the event's.  The step is the latest clock;
 * the exposed copy time is the step with the copies' costs minus the same
 * program with copies that cost nothing, so it counts every stall the
 * copies cause, through the fences too.  A stall of the compute stream at a
 * wait for an event a copy stream recorded is also charged to the virtual
 * stage of the copy before that record (the "stall" column; indirect
 * stalls, through another stream, only count in the rank's total).  The
 * rank's line also gives the exposed time without the comm stream's waits
 * for the copies (schedule.c's release fence, which every stream waits at,
 * and its comm fence, a recv or collective waiting for every copy issued
 * since the last one): in a pipeline the next recv then waits behind a d2h
 * copy, and the compute behind the recv; how much of it those waits cost.  Other
 * ranks are not simulated: a pipeline rank's waits for its neighbours are
 * outside this model, so its step is a lower bound.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#include "memplan.h"
#include "offload.h"
#include "profile.h"

enum { MAX_VS = 64 }; /* virtual stages reported per rank */

static Profile load_profile(const Args *a) {
    Profile p;
    char err[512];
    if (profile_load(&p, a->o.device_profile ? a->o.device_profile : "cpu", err, sizeof err) != 0) die("--device-profile: %s", err);
    return p;
}

static int is_copy(const Node *n) { return (ir_ops[n->op].flags & F_COPY) != 0; }

static double copy_seconds(const Profile *p, const Graph *g, const Node *n) {
    return profile_copy_seconds(p, (double)ir_value_bytes(&g->vals[n->in[0]]), n->op == OP_offload);
}

/* ---- the simulation ---- */

typedef struct {
    double step;          /* the latest stream clock */
    double stall[MAX_VS]; /* per virtual stage: the compute stream's waits for the copy streams' events */
} Sim;

/* skip_comm_fence: the comm stream's waits for the copy streams' events
 * are left out (what the comm stream's release and comm fences cost). */
static Sim simulate(const Profile *p, const Graph *g, const double *start, int copies_cost, int skip_comm_fence) {
    enum { NS = 8 };
    Sim r = {0};
    double t[NS] = {0};
    int nev = 0, last_vs[NS];
    for (int s = 0; s < NS; s++) last_vs[s] = -1;
    for (int i = 0; i < g->nnodes; i++)
        if (ir_ops[g->nodes[i].op].flags & F_SYNC && ir_attr_i(&g->nodes[i], "event", -1) + 1 > nev)
            nev = (int)ir_attr_i(&g->nodes[i], "event", -1) + 1;
    double *ev = xcalloc((size_t)nev + 1, sizeof(double));
    int *ev_vs = xcalloc((size_t)nev + 1, sizeof(int));
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        int s = n->stream < 0 || n->stream >= NS ? 0 : n->stream, e = (int)ir_attr_i(n, "event", -1);
        if (n->op == OP_record && e >= 0) {
            ev[e] = t[s];
            ev_vs[e] = s == 2 || s == 3 ? last_vs[s] : -1;
        } else if (n->op == OP_wait && e >= 0) {
            if (skip_comm_fence && s == 1 && ev_vs[e] >= 0) continue;
            if (ev[e] > t[s] && s == 0 && ev_vs[e] >= 0 && ev_vs[e] < MAX_VS) r.stall[ev_vs[e]] += ev[e] - t[s];
            if (ev[e] > t[s]) t[s] = ev[e];
        } else if (is_copy(n)) {
            t[s] += copies_cost ? copy_seconds(p, g, n) : 0;
            last_vs[s] = n->vstage;
        } else {
            if (s == 0 && start && start[i] > t[s]) t[s] = start[i]; /* its pipeline action's start: the bubble */
            t[s] += offload_node_seconds(p, g, n);
        }
    }
    for (int s = 0; s < NS; s++) r.step = t[s] > r.step ? t[s] : r.step;
    free(ev), free(ev_vs);
    return r;
}

/* Predicted exposed copy seconds of g and its step (with the copies). */
static double exposed(const Profile *p, const Graph *g, const double *start, double *step) {
    Sim with = simulate(p, g, start, 1, 0), without = simulate(p, g, start, 0, 0);
    *step = with.step;
    return with.step - without.step;
}

/* The same without the comm stream's waits for the copies. */
static double exposed_no_comm_fence(const Profile *p, const Graph *g, const double *start) {
    return simulate(p, g, start, 1, 1).step - simulate(p, g, start, 0, 1).step;
}

/* ---- per (rank, virtual stage) ---- */

typedef struct {
    int64_t saved, offloaded;
    double copy_s;         /* one micro-batch's d2h + h2d seconds, the mean over micro-batches */
    double hide_lo, hide_hi; /* the interval they hide in (per micro-batch: its offloads' shortest), over micro-batches */
    double ratio;          /* the largest over micro-batches of (d2h + h2d) / 2 / interval */
    int mbs;
} VsRow;

/* Compute-stream seconds before node i (prefix sums) of g. */
static double *compute_prefix(const Profile *p, const Graph *g, const double *start) {
    double *sec = xcalloc((size_t)g->nnodes + 1, sizeof(double));
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        int on = n->stream <= 0 && !is_copy(n);
        double t0 = on && start && start[i] > sec[i] ? start[i] : sec[i];
        sec[i + 1] = t0 + (on ? offload_node_seconds(p, g, n) : 0);
    }
    return sec;
}

/* Per value, its first reader (nnodes if none). */
static int *first_readers(const Graph *g) {
    int *first = xcalloc((size_t)g->nvals + 1, sizeof(int));
    for (int v = 0; v < g->nvals; v++) first[v] = g->nnodes;
    for (int i = g->nnodes - 1; i >= 0; i--)
        for (int k = 0; k < g->nodes[i].nin; k++) first[g->nodes[i].in[k]] = i;
    return first;
}

/* Rows of rank graph g (with offload) and g0 (the same rank without). */
static int vs_rows(const Profile *p, const Graph *g, const Graph *g0, const double *start, VsRow *row) {
    int nvs = 0;
    memset(row, 0, sizeof(VsRow) * MAX_VS);
    char *saved = xcalloc((size_t)g0->nvals + 1, 1);
    offload_saved_values(g0, saved);
    for (int v = 0; v < g0->nvals; v++) {
        int vs = saved[v] ? g0->nodes[g0->vals[v].def].vstage : -1;
        if (vs < 0 || vs >= MAX_VS) continue;
        row[vs].saved += ir_value_bytes(&g0->vals[v]);
        if (vs + 1 > nvs) nvs = vs + 1;
    }
    free(saved);
    double *sec = compute_prefix(p, g, start);
    int *first = first_readers(g);
    enum { MAXMB = 4096 };
    double *mb_copy = xcalloc((size_t)MAX_VS * MAXMB, sizeof(double)), *mb_hide = xcalloc((size_t)MAX_VS * MAXMB, sizeof(double));
    for (int k = 0; k < MAX_VS * MAXMB; k++) mb_hide[k] = -1;
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        if (n->op != OP_offload || n->vstage < 0 || n->vstage >= MAX_VS) continue;
        int vs = n->vstage, mb = n->mb < 0 ? 0 : n->mb % MAXMB, reload = first[n->out[0]];
        int use = reload < g->nnodes ? first[g->nodes[reload].out[0]] : g->nnodes;
        int64_t bytes = ir_value_bytes(&g->vals[n->in[0]]);
        row[vs].offloaded += bytes;
        if (vs + 1 > nvs) nvs = vs + 1;
        double *c = &mb_copy[vs * MAXMB + mb], *h = &mb_hide[vs * MAXMB + mb], hide = sec[use] - sec[i + 1];
        *c += profile_copy_seconds(p, (double)bytes, 1) + profile_copy_seconds(p, (double)bytes, 0);
        if (*h < 0 || hide < *h) *h = hide;
    }
    for (int vs = 0; vs < nvs; vs++) {
        VsRow *r = &row[vs];
        double sum = 0;
        r->hide_lo = -1;
        for (int mb = 0; mb < MAXMB; mb++) {
            double h = mb_hide[vs * MAXMB + mb], c = mb_copy[vs * MAXMB + mb];
            if (h < 0) continue;
            r->mbs++;
            sum += c;
            if (r->hide_lo < 0 || h < r->hide_lo) r->hide_lo = h;
            if (h > r->hide_hi) r->hide_hi = h;
            double q = h > 0 ? c / 2 / h : INFINITY;
            if (q > r->ratio) r->ratio = q;
        }
        r->copy_s = r->mbs ? sum / r->mbs : 0;
        if (r->hide_lo < 0) r->hide_lo = 0;
    }
    free(sec), free(first), free(mb_copy), free(mb_hide);
    return nvs;
}

static int64_t device_peak(const Graph *g) {
    return memplan_stage_peak(g, SPACE_PARAMS) + memplan_stage_peak(g, SPACE_GRADS) + memplan_stage_peak(g, SPACE_OPT) +
           memplan_stage_peak(g, SPACE_ACT);
}

static double mib(int64_t b) { return (double)b / (1 << 20); }

static const char *policy_name(double off, char *buf, size_t n) {
    if (off == OFFLOAD_AUTO) snprintf(buf, n, "auto");
    else if (off == 0) snprintf(buf, n, "none");
    else if (off == 1) snprintf(buf, n, "all");
    else snprintf(buf, n, "%g", off);
    return buf;
}

static void rank_report(const Profile *p, const Graph *g, const Graph *g0, const double *start, int rank) {
    VsRow row[MAX_VS];
    int nvs = vs_rows(p, g, g0, start, row);
    Sim sim = simulate(p, g, start, 1, 0);
    double step, exp_s = exposed(p, g, start, &step);
    for (int vs = 0; vs < nvs; vs++) {
        const VsRow *r = &row[vs];
        char ratio[32] = "-", hide[48] = "-";
        if (r->mbs) snprintf(ratio, sizeof ratio, "%.2f", r->ratio);
        if (r->mbs) snprintf(hide, sizeof hide, "%.3f-%.3f", r->hide_lo * 1e3, r->hide_hi * 1e3);
        printf("  %4d %3d %12.2f %12.2f %4d %11.3f %17s %8s %10.3f\n", rank, vs, mib(r->saved), mib(r->offloaded), r->mbs,
               r->copy_s * 1e3, hide, ratio, sim.stall[vs] * 1e3);
    }
    int64_t with = device_peak(g), without = device_peak(g0), host = memplan_stage_peak(g, SPACE_HOST);
    printf("  rank %d: device peak %.2f MiB with offload, %.2f MiB without (%+.1f%%); host %.2f MiB; step %.3f ms, exposed copy "
           "time %.3f ms (%.2f%% of the step; %.3f ms without the comm stream's waits for copies)\n",
           rank, mib(with), mib(without), without ? 100.0 * ((double)with / (double)without - 1) : 0.0, mib(host), step * 1e3,
           exp_s * 1e3, step > 0 ? 100.0 * exp_s / step : 0.0, exposed_no_comm_fence(p, g, start) * 1e3);
    if (p->host_memory_bytes > 0 && (double)host > p->host_memory_bytes) /* a warning here; kiln compile and run refuse (memplan_host_check) */
        printf("  rank %d: warning: host space %.3g GiB exceeds the profile's %.3g GiB of host memory per device (host_memory_bytes, %s); "
               "kiln compile would refuse it\n", rank, (double)host / (1 << 30), p->host_memory_bytes / (1 << 30), p->path);
}

void plan_offload_report(Args *a, const Module *m) {
    Profile p = load_profile(a);
    Args none = *a;
    none.o.offload = 0, none.o.offload_stages = 0, none.o.offload_bug = 0, none.comparison = 1;
    Module *m0 = compile(&none);
    char pol[32];
    printf("offload %s per rank and virtual stage (profile %s: d2h %.1f GB/s, h2d %.1f GB/s; one micro-batch's copies "
           "d2h + h2d against the compute they hide in; ratio = the largest over micro-batches of (d2h + h2d) / 2 / interval, free while <= 1 if the copy streams had nothing else to do; "
           "stall: the compute stream's waits for the copy streams' events):\n",
           policy_name(a->o.offload, pol, sizeof pol), p.name, p.d2h_bw * 1e-9, p.h2d_bw * 1e-9);
    printf("  (rank: the pp rank, whose dp and cp ranks run the same program; vs: its virtual stage)\n");
    printf("  %4s %3s %12s %12s %4s %11s %17s %8s %10s\n", "rank", "vs", "saved MiB", "offload MiB", "mbs", "copy ms", "interval ms",
           "ratio", "stall ms");
    double **start = offload_pp_starts(m, &a->o, &p);
    for (int s = 0; s < m->nstages && s < m0->nstages; s++) rank_report(&p, m->stages[s], m0->stages[s], start ? start[s] : NULL, s);
    offload_pp_starts_free(start, m->nstages);
    ir_free(m0);
}

/* ---- --max-seq ---- */

typedef struct {
    int64_t peak; /* the largest device peak over ranks */
    int rank;     /* where */
    double exposed, step; /* offload: the binding rank's */
    double worst;         /* offload: the largest exposed share of the step over the ranks */
    int worst_rank;
    int64_t host; /* the largest host space over ranks */
    int host_over; /* above the profile's host_memory_bytes: does not fit */
} Fit;

static Fit fit_at(Args *base, Recompute rc, double offload, int64_t seq) {
    Args a = *base;
    a.o.recompute = rc, a.o.offload = offload, a.o.memory_budget = a.o.activation_budget = 0;
    a.o.sets = xcalloc((size_t)base->o.nsets + 1, sizeof(KeyVal));
    if (base->o.nsets) memcpy(a.o.sets, base->o.sets, sizeof(KeyVal) * (size_t)base->o.nsets);
    char val[32];
    snprintf(val, sizeof val, "%lld", (long long)seq);
    a.o.sets[a.o.nsets++] = (KeyVal){"seq", val};
    Module *m = compile(&a);
    Fit f = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int s = 0; s < m->nstages; s++) {
        int64_t pk = device_peak(m->stages[s]), h = memplan_stage_peak(m->stages[s], SPACE_HOST);
        if (pk > f.peak) f.peak = pk, f.rank = s;
        if (h > f.host) f.host = h;
    }
    if (offload != 0) {
        Profile p = load_profile(base);
        f.host_over = p.host_memory_bytes > 0 && (double)f.host > p.host_memory_bytes;
        double **start = offload_pp_starts(m, &a.o, &p);
        for (int s = 0; s < m->nstages; s++) {
            double st, e = exposed(&p, m->stages[s], start ? start[s] : NULL, &st), share = st > 0 ? e / st : 0;
            if (s == f.rank) f.exposed = e, f.step = st;
            if (share > f.worst) f.worst = share, f.worst_rank = s;
        }
        offload_pp_starts_free(start, m->nstages);
    }
    ir_free(m);
    free(a.o.sets);
    return f;
}

/* The longest multiple of step whose peak fits limit (0: not even one step). */
static int64_t search(Args *a, Recompute rc, double offload, int64_t step, int64_t limit, Fit *best, int *compiles) {
    int64_t lo = 0, hi = step;
    Fit f;
    for (;;) { /* double until it does not fit */
        f = fit_at(a, rc, offload, hi), ++*compiles;
        if (f.peak > limit || f.host_over) break;
        lo = hi, *best = f;
        if (hi > ((int64_t)1 << 40)) die("--max-seq: still fits at seq %lld: is the sequence in the model's memory?", (long long)hi);
        hi *= 2;
    }
    while (hi - lo > step) {
        int64_t mid = (lo + hi) / 2 / step * step;
        f = fit_at(a, rc, offload, mid), ++*compiles;
        if (f.peak <= limit && !f.host_over) lo = mid, *best = f;
        else hi = mid;
    }
    return lo;
}

void plan_max_seq(Args *a) {
    if (!(a->memory_gib > 0)) die("--max-seq: give the device memory per rank: --memory GiB (a number > 0)");
    double off = a->o.offload != 0 ? a->o.offload : OFFLOAD_AUTO;
    int64_t limit = (int64_t)(a->memory_gib * (double)(1 << 30));
    int64_t step = 128 * (int64_t)(a->o.cp > 1 ? a->o.cp : 1);
    struct { const char *name; Recompute rc; double off; } pol[3] = {{"none", RC_NONE, 0}, {"gemm-last", RC_GEMM_LAST, 0}, {NULL, RC_GEMM_LAST, off}};
    char name[64], pn[32];
    snprintf(name, sizeof name, "gemm-last + offload %s", policy_name(off, pn, sizeof pn));
    pol[2].name = name;
    printf("longest sequence per rank within %.2f GiB of device memory (device peak = params + grads + optimizer state + activation "
           "arena, the largest over the ranks; seq in steps of %lld; with offload each rank's host space within the profile's host_memory_bytes too):\n", a->memory_gib, (long long)step);
    printf("  %-28s %10s %8s %16s %6s %12s\n", "policy", "max seq", "vs gl", "device peak GiB", "rank", "exposed copy");
    int64_t gl = 0;
    for (int k = 0; k < 3; k++) {
        Fit best = {0, 0, 0, 0, 0, 0, 0, 0};
        int compiles = 0;
        int64_t seq = search(a, pol[k].rc, pol[k].off, step, limit, &best, &compiles);
        if (k == 1) gl = seq;
        char vs[16] = "", ex[128] = "";
        if (k == 2 && gl) snprintf(vs, sizeof vs, "%.2fx", (double)seq / (double)gl);
        if (k == 1) snprintf(vs, sizeof vs, "1.00x");
        if (k == 2 && seq)
            snprintf(ex, sizeof ex, "%.2f%% of step (worst rank %d: %.2f%%); host %.2f GiB", best.step > 0 ? 100.0 * best.exposed / best.step : 0.0,
                     best.worst_rank, 100.0 * best.worst, (double)best.host / (1 << 30));
        if (seq) printf("  %-28s %10lld %8s %16.2f %6d %12s   (%d plans)\n", pol[k].name, (long long)seq, vs, (double)best.peak / (1 << 30), best.rank, ex, compiles);
        else printf("  %-28s %10s %8s %16s %6s %12s   (%d plans: not even seq %lld fits)\n", pol[k].name, "-", "", "", "", "", compiles, (long long)step);
        fflush(stdout);
    }
}
