/* offload.c — activation offload: saved activations wait in host memory
 * between their forward and their backward (issue 19, docs/offload.md).
 *
 * A *saved activation* is a value computed in forward from the step's data
 * (the inputs, or what a pipeline rank receives) that a backward, recompute
 * or weight-gradient node reads: it stays on the device from its forward
 * until its backward, and in a pipeline's first stages that is up to p
 * micro-batches long.  This pass, after `pipeline` (one graph per rank, each
 * its actions unrolled) and before the optimizer, chooses some of them and
 * rewires each chosen x:
 *
 *     x ... last forward reader of x   offload(x)      (d2h stream)
 *     ...                              reload(host)    (h2d stream), OFFLOAD_PREFETCH
 *     ... first backward reader        reads reload    nodes before its first backward reader
 *
 * so x's device buffer is free between the offload's copy and the reload.
 * The schedule puts the copies on their streams with events (schedule.c:
 * the other streams wait for the offload OFFLOAD_PREFETCH nodes after it,
 * its {lag}; the h2d stream waits for the others where the reload is issued),
 * memplan puts the offload's output in the host space, and the verifier
 * rejects any read of x after its offload (verify.c).
 *
 * What is a candidate: a saved activation that is no param, state, input or
 * constant (a received value is one), is not read by an output or the
 * optimizer, whose forward readers all come before its first backward
 * reader, of at least --offload-min-bytes (1 MiB: the seeds' system skips
 * smaller tensors; the tests lower it), whose forward-to-backward gap is at
 * least 2·OFFLOAD_PREFETCH nodes (a shorter one hides no copy), and, with
 * --pp, not of the model's last chunk (its backward follows its forward at
 * once; the Kuaishou system never offloads it either).
 *
 * The policy (--offload none|all|F, --offload-stages LIST): `all` takes
 * every candidate; a fraction F takes, in each (rank, virtual stage,
 * micro-batch), the largest candidates first (ties in program order) until
 * their bytes reach F of that group's candidate bytes, so every micro-batch
 * of a virtual stage offloads the same tensors and at least F of its bytes;
 * a virtual stage named by --offload-stages offloads all its candidates
 * whatever the policy.  `auto` picks the fraction per group from the device
 * profile (--device-profile, default cpu): the largest α whose two copies,
 * (α·bytes/d2h + α·bytes/h2d)/2, fit in the compute the group's tensors
 * wait through — the profile's seconds of the program's nodes between the
 * group's last forward reader and its first backward reader, the shortest
 * over its tensors (PipeOffload's condition, profile.h
 * offload_auto_fraction) — largest tensors first, each that still fits in
 * α of the bytes (at most α, where a fraction F takes at least F).  A node's seconds: GEMMs and attention by FLOPs
 * at the profile's peak and GEMM efficiency, the rest by the bytes they read
 * and write at its memory bandwidth, each plus a launch; communication
 * counts 0 (it hides nothing).
 *
 * With a profile the copies' places come from their times (timed_places):
 * the d2h stream and the compute run together, node by node, and a release
 * fence goes before the first node (at least OFFLOAD_MIN_NODES after the
 * offload) that can wait for the copy and still end by its due — the
 * latest end that delays no other pipeline action (pp_latest_ends, an ALAP
 * pass over the pipeline's simulation) nor the rank's step.  Where the
 * pipeline leaves slack (a first stage's warm-up) the compute waits for
 * its copies: the warm-up is paced by the d2h stream instead of queueing
 * its activations on the device.  auto then keeps the host space within
 * the profile's host_memory_bytes (host_trim).  docs/offload.md has both.
 * Whatever the policy, with a profile a value whose reload would be issued
 * at or before its release is kept on the device (drop_useless): its
 * copies free nothing and take the streams' time from the others (with
 * `all` on a copy-bound profile, most of them; docs/offload.md, "Never
 * above the peak without offload").
 *
 * --test-offload-bug early-read leaves the last backward reader of the first
 * offloaded value reading the device copy: the verifier must reject it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "live.h"
#include "passes.h"
#include "ppsched.h"
#include "offload.h"
#include "profile.h"

/* Nodes of the rank's program: the reload is issued this many nodes before
 * the first backward reader, and the device buffer is released (the other
 * streams wait for the d2h copy) this many nodes after the offload. */
#define OFFLOAD_PREFETCH 8

typedef struct {
    int v, lastf, firstb, group;
    int64_t bytes;
    int release, issue; /* with a profile (timed_places): the original node the release fence goes before, the reload's place; -1 */
} Cand;

typedef struct {
    Graph *g;
    const Options *o;
    int *lastf, *firstb; /* per value: last forward reader, first backward reader (-1 / nnodes: none) */
    char *data, *bad;    /* per value: computed from the data; read where it cannot leave */
    int last_rank, last_vstage; /* the model's last chunk (pp > 1; -1 otherwise) */
    const Profile *prof;        /* --offload auto or --device-profile: the device's */
    int autop;                  /* --offload auto */
    double *sec;                /* with a profile: seconds of nodes 0..i-1 (nnodes+1) */
    double *dur, *pst, *due;    /* with a profile: node i's seconds, its pipeline action's start (-1: none),
                                   the latest it may end delaying no other action nor the rank's step (pace_dues) */
    double *t;                  /* with a profile: node i's start with the compute stream's waits at release fences (stream_pass) */
    double *busy;               /* with a profile: seconds of nodes 0..i-1 without the waits (S->sec less its idle time) */
    int nopace;                 /* KILN_TEST_OFFLOAD_NO_PACE set (tests): no node's due beyond its end in S->sec */
} Off;

/* Bytes of value v as the device will hold it: with bf16 (the precision
 * pass runs after this one, so the program is still f32 here) an f32 value
 * becomes bf16 (activations; the few f32 ones left, losses and
 * statistics, are small). */
static double dev_bytes(const Graph *g, int v, int bf16) {
    const Value *x = &g->vals[v];
    double b = (double)ir_value_bytes(x);
    return bf16 && x->t.dt == DT_F32 ? b / 2 : b;
}

/* The profile's seconds for node n (see the top of the file).  A GEMM or
 * attention runs at the peak of its first input's dtype (bf16 inputs use
 * the tensor cores whatever the output: an f32 weight gradient too); bf16:
 * the program will be bf16 (dev_bytes). */
static double node_seconds(const Profile *p, const Graph *g, const Node *n, int bf16) {
    unsigned fl = ir_ops[n->op].flags;
    if (fl & (F_SOURCE | F_SINK | F_COMM | F_SYNC | F_VIEW)) return 0;
    DType dt = n->nin ? g->vals[n->in[0]].t.dt : n->nout ? g->vals[n->out[0]].t.dt : DT_F32;
    double flops = ir_node_flops(g, n), peak = dt == DT_BF16 || bf16 ? p->peak_flops_bf16 : p->peak_flops_f32;
    if (fl & (F_GEMM | F_EXPENSIVE)) return flops / (peak * profile_gemm_eff(p, flops / 2)) + p->launch_s;
    double bytes = 0;
    for (int k = 0; k < n->nin; k++) bytes += dev_bytes(g, n->in[k], bf16);
    for (int k = 0; k < n->nout; k++) bytes += dev_bytes(g, n->out[k], bf16);
    return bytes / p->mem_bw + p->launch_s;
}

double offload_node_seconds(const Profile *p, const Graph *g, const Node *n) { return node_seconds(p, g, n, 0); }

static int bwd_phase(Phase p) { return p == PH_BWD || p == PH_RECOMPUTE || p == PH_WGRAD; }

/* The pipeline action a node belongs to: F for forward, B for backward and
 * recompute, W for weight gradients (B where the schedule has no W); -1. */
static int act_kind(Phase ph, int zb) {
    return ph == PH_FWD ? ACT_F : ph == PH_BWD || ph == PH_RECOMPUTE ? ACT_B : ph == PH_WGRAD ? (zb ? ACT_W : ACT_B) : -1;
}

/* The latest end of every action of plan pl that delays no other action
 * past its time in t (an ALAP pass over the dependencies of ppsched.h:
 * the rank's next action; F(c,m) -> F(c+1,m) and B(c,m); B(c,m) ->
 * B(c-1,m) and, zero-bubble, W(c,m)), each rank's last action ending when
 * it does in t (its optimizer then starts on time).  nch chunks; gidx maps
 * (kind, chunk, mb) to t's flat index.  Returns t.off[p] entries. */
static double *pp_latest_ends(const PpPlan *pl, const PpTimes *t, const int *gidx, int nch, int zb) {
    int n = t->off[pl->p];
    double *lend = xcalloc((size_t)n + 1, sizeof(double));
    for (int r = 0; r < pl->p; r++)
        for (int a = 0; a < pl->nact[r]; a++) lend[t->off[r] + a] = a == pl->nact[r] - 1 ? t->end[t->off[r] + a] : 1e300;
    for (int changed = 1, it = 0; changed && it <= n; it++) {
        changed = 0;
        for (int r = 0; r < pl->p; r++)
            for (int a = 0; a < pl->nact[r]; a++) {
                const Action *ac = &pl->act[r][a];
                int gi = t->off[r] + a, c = ac->chunk, mb = ac->mb, s[4], ns = 0;
                if (a + 1 < pl->nact[r]) s[ns++] = gi + 1;
                if (ac->kind == ACT_F) {
                    if (c + 1 < nch) s[ns++] = gidx[((int)ACT_F * nch + c + 1) * pl->m + mb];
                    s[ns++] = gidx[((int)ACT_B * nch + c) * pl->m + mb];
                } else if (ac->kind == ACT_B) {
                    if (c > 0) s[ns++] = gidx[((int)ACT_B * nch + c - 1) * pl->m + mb];
                    if (zb) s[ns++] = gidx[((int)ACT_W * nch + c) * pl->m + mb];
                }
                for (int k = 0; k < ns; k++) {
                    if (s[k] < 0) continue;
                    double v = lend[s[k]] - (t->end[s[k]] - t->start[s[k]]);
                    if (v < lend[gi]) lend[gi] = v, changed = 1;
                }
            }
    }
    for (int k = 0; k < n; k++)
        if (lend[k] < t->end[k]) lend[k] = t->end[k]; /* never before its own end (rounding) */
    return lend;
}

/* With --pp: when each node's pipeline action starts on its rank, from
 * ppsched_simulate over the ranks' own node seconds (per (kind, chunk) the
 * mean over micro-batches; communication free, latency 0).  A rank's
 * program does not show the time it waits for its neighbours (the
 * bubble: a first stage waits about (p-1) backwards between its warm-up
 * forwards and its first backward); a copy runs through it.  starts[r][i]:
 * the start of node i's action, -1 for a node of none (the optimizer, the
 * copies).  With lend: (*lend)[r][i] the slack of node i's action, how
 * much later than in the simulation it may end delaying no other action
 * (pp_latest_ends), -1 for none.  NULL without
 * --pp.  bf16: see dev_bytes. */
static double **pp_times(const Module *m, const Options *o, const Profile *p, int bf16, double ***lend) {
    if (lend) *lend = NULL;
    if (m->nstages <= 1 || !p) return NULL;
    PpPlan pl;
    char err[256];
    if (ppsched_build(&pl, (PpSchedule)o->pp_schedule, o->pp, o->vpp, o->micro_batches, err, sizeof err) != 0) ICE("offload: %s", err);
    if (pl.p != m->nstages) return ppsched_free(&pl), NULL;
    int nch = pl.p * pl.v, zb = pl.kind == PS_ZBH1 || pl.kind == PS_ZBV, nkey = 3 * nch * pl.m;
    double *cost[3];
    for (int k = 0; k < 3; k++) cost[k] = xcalloc((size_t)nch, sizeof(double));
    for (int r = 0; r < pl.p; r++)
        for (int i = 0; i < m->stages[r]->nnodes; i++) {
            const Node *n = &m->stages[r]->nodes[i];
            int k = act_kind(n->phase, zb);
            if (k >= 0 && n->vstage >= 0 && n->vstage < pl.v && !(ir_ops[n->op].flags & F_COPY))
                cost[k][pp_chunk(&pl, r, n->vstage)] += node_seconds(p, m->stages[r], n, bf16) / pl.m;
        }
    PpTimes t;
    const double *const cc[3] = {cost[0], cost[1], cost[2]};
    if (ppsched_simulate(&pl, cc, 0, &t) != 0) ICE("offload: the pipeline's simulation failed");
    int *gidx = xcalloc((size_t)nkey, sizeof(int));
    for (int k = 0; k < nkey; k++) gidx[k] = -1;
    for (int r = 0; r < pl.p; r++)
        for (int a = 0; a < pl.nact[r]; a++) {
            const Action *ac = &pl.act[r][a];
            gidx[((int)ac->kind * nch + ac->chunk) * pl.m + ac->mb] = t.off[r] + a;
        }
    double *le = lend ? pp_latest_ends(&pl, &t, gidx, nch, zb) : NULL;
    double **st = xcalloc((size_t)pl.p, sizeof(double *));
    if (lend) *lend = xcalloc((size_t)pl.p, sizeof(double *));
    for (int r = 0; r < pl.p; r++) {
        const Graph *g = m->stages[r];
        st[r] = xcalloc((size_t)g->nnodes + 1, sizeof(double));
        if (lend) (*lend)[r] = xcalloc((size_t)g->nnodes + 1, sizeof(double));
        for (int i = 0; i < g->nnodes; i++) {
            const Node *n = &g->nodes[i];
            int k = act_kind(n->phase, zb);
            int ok = k >= 0 && n->vstage >= 0 && n->vstage < pl.v && n->mb >= 0 && n->mb < pl.m && !(ir_ops[n->op].flags & F_COPY);
            int gi = ok ? gidx[(k * nch + pp_chunk(&pl, r, n->vstage)) * pl.m + n->mb] : -1;
            st[r][i] = gi >= 0 ? t.start[gi] : -1;
            if (lend) (*lend)[r][i] = gi >= 0 ? le[gi] - t.end[gi] : -1;
        }
    }
    for (int k = 0; k < 3; k++) free(cost[k]);
    free(gidx), free(le), ppsched_times_free(&t), ppsched_free(&pl);
    return st;
}

static double **pp_starts(const Module *m, const Options *o, const Profile *p, int bf16) { return pp_times(m, o, p, bf16, NULL); }

double **offload_pp_starts(const Module *m, const Options *o, const Profile *p) { return pp_starts(m, o, p, 0); }

void offload_pp_starts_free(double **st, int n) {
    for (int r = 0; st && r < n; r++) free(st[r]);
    free(st);
}

/* Readers, data and the values that must stay (read by an output or the optimizer). */
static void scan(Off *S) {
    const Graph *g = S->g;
    for (int v = 0; v < g->nvals; v++) S->lastf[v] = -1, S->firstb[v] = g->nnodes;
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        unsigned fl = ir_ops[n->op].flags;
        int d = n->op == OP_input || ((fl & F_SOURCE) && (fl & F_COMM));
        for (int k = 0; k < n->nin; k++) {
            int v = n->in[k];
            d |= S->data[v];
            if (n->op == OP_output || n->phase == PH_OPT) S->bad[v] = 1;
            else if (bwd_phase(n->phase)) S->firstb[v] = S->firstb[v] < i ? S->firstb[v] : i;
            else S->lastf[v] = i;
        }
        for (int k = 0; k < n->nout; k++) S->data[n->out[k]] = (char)d;
    }
}

static int is_candidate(const Off *S, int rank, int v) {
    const Graph *g = S->g;
    const Value *x = &g->vals[v];
    if (x->def < 0) return 0;
    const Node *d = &g->nodes[x->def];
    unsigned fl = ir_ops[d->op].flags;
    int from = S->lastf[v] > x->def ? S->lastf[v] : x->def;
    if (d->phase != PH_FWD || !S->data[v] || S->bad[v] || ((fl & F_SOURCE) && !(fl & F_COMM))) return 0;
    if (S->firstb[v] >= g->nnodes || S->lastf[v] > S->firstb[v] || S->firstb[v] - from < 2 * OFFLOAD_PREFETCH) return 0;
    if (dev_bytes(g, v, S->o->precision_bf16) < S->o->offload_min_bytes) return 0;
    return !(rank == S->last_rank && d->vstage == S->last_vstage);
}

void offload_saved_values(const Graph *g, char *saved) {
    int nv = g->nvals;
    Off S = {(Graph *)g, NULL, xcalloc((size_t)nv, sizeof(int)), xcalloc((size_t)nv, sizeof(int)), xcalloc((size_t)nv, 1),
             xcalloc((size_t)nv, 1), -1, -1, NULL, 0, NULL, NULL, NULL, NULL, NULL, NULL, 0};
    scan(&S);
    for (int v = 0; v < nv; v++) {
        const Value *x = &g->vals[v];
        const Node *d = x->def >= 0 ? &g->nodes[x->def] : NULL;
        unsigned fl = d ? ir_ops[d->op].flags : 0;
        saved[v] = d && d->phase == PH_FWD && S.data[v] && !((fl & F_SOURCE) && !(fl & F_COMM)) && S.firstb[v] < g->nnodes;
    }
    free(S.lastf), free(S.firstb), free(S.data), free(S.bad);
}

static int by_group_size(const void *a, const void *b) {
    const Cand *x = a, *y = b;
    if (x->group != y->group) return x->group - y->group;
    if (x->bytes != y->bytes) return x->bytes > y->bytes ? -1 : 1;
    return x->v - y->v;
}

/* The policy: which candidates go (take[k]). */
/* auto: each group's α (fr[k] for its first candidate a, by_group_size
 * order), then all scaled down alike until the copies of the whole step,
 * both directions, fit in the rank's compute seconds: every group's copies
 * share the two copy streams, and a group's forward-to-backward wait spans
 * other groups' compute, which their copies need too (without this, a
 * first pipeline stage's groups each "fit" and together need twice the
 * step). */
static void auto_fractions(const Off *S, const Cand *c, int nc, double *fr) {
    double d2h = 0, h2d = 0; /* seconds each copy stream needs: the two directions run at once (full duplex) */
    for (int a = 0, b; a < nc; a = b) {
        double total = 0, hide = 1e300;
        for (b = a; b < nc && c[b].group == c[a].group; b++) {
            int from = c[b].lastf > S->g->vals[c[b].v].def ? c[b].lastf : S->g->vals[c[b].v].def;
            double t = S->sec[c[b].firstb] - S->sec[from + 1];
            hide = t < hide ? t : hide;
            total += (double)c[b].bytes;
        }
        fr[a] = offload_auto_fraction(S->prof, total, hide);
        d2h += fr[a] * profile_copy_seconds(S->prof, total, 1);
        h2d += fr[a] * profile_copy_seconds(S->prof, total, 0);
    }
    double demand = d2h > h2d ? d2h : h2d, step = S->sec[S->g->nnodes], scale = demand > step ? step / demand : 1;
    for (int a = 0, b; a < nc; a = b) {
        for (b = a; b < nc && c[b].group == c[a].group; b++) {}
        fr[a] *= scale;
    }
}

static void choose(const Off *S, Cand *c, int nc, char *take) {
    qsort(c, (size_t)nc, sizeof(Cand), by_group_size);
    double *fr = xcalloc((size_t)nc + 1, sizeof(double));
    if (S->autop) auto_fractions(S, c, nc, fr);
    for (int a = 0, b; a < nc; a = b) {
        int64_t total = 0, sum = 0;
        for (b = a; b < nc && c[b].group == c[a].group; b++) total += c[b].bytes;
        int vstage = S->g->nodes[S->g->vals[c[a].v].def].vstage;
        int forced = vstage < 64 && (S->o->offload_stages >> vstage & 1);
        double frac = S->autop ? fr[a] : S->o->offload; /* auto: what the group's shortest wait hides, scaled */
        for (int k = a; k < b; k++) { /* a fraction: at least F of the bytes; auto: at most α (the copies must fit) */
            int fits = S->autop ? (double)(sum + c[k].bytes) <= frac * (double)total : frac > 0 && (double)sum < frac * (double)total;
            take[k] = forced || fits;
            if (take[k]) sum += c[k].bytes;
        }
    }
    free(fr);
}

/* With a profile: where each chosen copy's fences go, from the costs (the
 * prefetch distance and the release lag chosen by the copies' times, not a
 * constant).  The d2h stream runs the offloads in order, each from when the
 * compute reaches it and the stream is free; the release fence goes before
 * the first node the compute starts after that copy ends (so the compute
 * does not wait for it), but no later than the value's first backward
 * reader.  The h2d stream runs the reloads as late as they can, backwards
 * from each first backward reader (a reload ends by then, and before the
 * next one starts); a reload is issued before the last node the compute
 * starts by that start (the reload fence makes it wait for the compute to
 * get there), and no earlier than right after its offload.  Seconds of
 * nodes: S->sec (node_seconds). */
static int by_from(const void *a, const void *b) {
    const Cand *x = *(Cand *const *)a, *y = *(Cand *const *)b;
    return x->lastf != y->lastf ? x->lastf - y->lastf : x->v - y->v;
}

static int by_firstb_desc(const void *a, const void *b) {
    const Cand *x = *(Cand *const *)a, *y = *(Cand *const *)b;
    return x->firstb != y->firstb ? y->firstb - x->firstb : y->v - x->v;
}

/* The first node index i in [lo, hi] with sec[i] >= t (hi if none). */
static int first_at(const double *sec, int lo, int hi, double t) {
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (sec[mid] >= t) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

/* The first node of each backward action of the program (a run of backward
 * nodes of one (virtual stage, micro-batch)), in order; *nb of them. */
static int *bwd_starts(const Graph *g, int *nb) {
    int *b = xcalloc((size_t)g->nnodes + 1, sizeof(int)), n = 0, key = -1;
    for (int i = 0; i < g->nnodes; i++) {
        const Node *x = &g->nodes[i];
        if (ir_ops[x->op].flags & (F_COMM | F_SYNC | F_SOURCE)) continue;
        int k = bwd_phase(x->phase) ? x->vstage * 65536 + x->mb : -1;
        if (k >= 0 && k != key) b[n++] = i;
        key = k;
    }
    *nb = n;
    return b;
}

/* The index in b[0..nb) of the first entry > i (nb if none). */
static int next_bwd(const int *b, int nb, int i) {
    int lo = 0, hi = nb;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (b[mid] > i) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

/* Copies are placed and admitted as if 10% slower than the profile says:
 * the rank's streams then run them where the pass put them, mostly (on
 * Llama-3 8B at pp 4, h200, the exposed copy time fell from 4-7% of the
 * step to 1-2% on the first two ranks for 2-5% more device peak;
 * bench/RESULTS.md). */
#define OFFLOAD_SLACK 1.1
/* The fences keep at least this many nodes of the rank's program from
 * their copy, whatever the times say: the release fence (the compute and
 * comm streams wait for the d2h copy) this many after the offload, the
 * reload issued this many before its first reader.  A copy stream starts a
 * copy only when it gets to it: on the CPU a worker thread that must get a
 * core first, on 2 cores shared by 4 ranks 0.05-5 ms after the compute
 * stream issued it (bench/offload.sh traces), where the profile's copy of
 * 64 KiB takes 9 µs; with the times alone the compute stream waited for
 * copies not yet begun at most fences (+10.7% step time against none,
 * bench/RESULTS.md).  On a GPU the copy engine starts at once and 8 nodes
 * hold a buffer a few kernels longer. */
#define OFFLOAD_MIN_NODES min_nodes()
/* KILN_OFFLOAD_MIN_NODES=N (experiments: bench/offload.sh MIN_NODES=N):
 * another floor, 1..1000; OFFLOAD_PREFETCH otherwise. */
static int min_nodes(void) {
    const char *e = getenv("KILN_OFFLOAD_MIN_NODES");
    int n = e ? atoi(e) : 0;
    return n >= 1 && n <= 1000 ? n : OFFLOAD_PREFETCH;
}
/* One pass of the two copy streams over the taken candidates (see
 * timed_places); with admit (auto), a copy that cannot end in time is
 * dropped (take[k] = 0) and leaves its stream's time to the others.
 * Returns how many it dropped. */
/* When node x starts if the compute is late by d at node i (x >= i): the
 * idle time of S->sec between them (its waits for the pipeline) absorbs
 * the delay. */
static double later(const Off *S, int x, int i, double d) {
    double idle = (S->sec[x] - S->busy[x]) - (S->sec[i] - S->busy[i]);
    return S->sec[x] + (d > idle ? d - idle : 0);
}

static int stream_pass(const Off *S, Cand **t, int nt, char *takeflag, const Cand *c0, const int *b, int nb, int admit) {
    const Graph *g = S->g;
    int dropped = 0, n = g->nnodes;
    qsort(t, (size_t)nt, sizeof(Cand *), by_from);
    /* The d2h stream and the compute stream together, node by node: the
     * compute waits at a release fence until its copy ends (stall[i]: the
     * latest end of a copy released before node i).  A release goes before
     * the first node, at least OFFLOAD_MIN_NODES after the offload, that can
     * start when the copy ends and still end by its due (S->due): where the
     * compute has time to spare (a first stage's warm-up, whose forwards
     * can run later without delaying any other action) it waits for the
     * copy, so the device holds no more than the d2h stream has not
     * drained; elsewhere that is the first node the compute starts after
     * the copy ends, as without the pacing. */
    double *stall = xcalloc((size_t)n + 1, sizeof(double)), tc = 0, free_at = 0;
    for (int i = 0, k = 0; i < n; i++) {
        if (stall[i] > tc) tc = stall[i];
        double st = S->pst[i] > tc ? S->pst[i] : tc;
        S->t[i] = st, tc = st + S->dur[i];
        for (; k < nt && t[k]->lastf <= i; k++) {
            if (!takeflag[t[k] - c0]) continue;
            int from = t[k]->lastf, j = next_bwd(b, nb, from);
            double start = tc > free_at ? tc : free_at;
            double end = start + OFFLOAD_SLACK * profile_copy_seconds(S->prof, (double)t[k]->bytes, 1);
            /* in time: off the device before the second backward action after
             * it starts (the first is the peak it was made for; a pipeline's
             * next peak is the one after) and before its reload must begin */
            double late = tc - S->sec[i + 1]; /* the compute's delay from its waits so far, absorbed by later idle time */
            double deadline = later(S, t[k]->firstb, i + 1, late) - profile_copy_seconds(S->prof, (double)t[k]->bytes, 0);
            if (j + 1 < nb && later(S, b[j + 1], i + 1, late) < deadline) deadline = later(S, b[j + 1], i + 1, late);
            if (admit && end > deadline) {
                takeflag[t[k] - c0] = 0, dropped++;
                continue;
            }
            free_at = end;
            int r = from + 1 + OFFLOAD_MIN_NODES < t[k]->firstb ? from + 1 + OFFLOAD_MIN_NODES : t[k]->firstb;
            while (r < t[k]->firstb && end + S->dur[r] > (S->nopace ? S->sec[r + 1] : S->due[r])) r++;
            t[k]->release = r;
            if (end > stall[r]) stall[r] = end;
        }
    }
    S->t[n] = tc;
    free(stall);
    qsort(t, (size_t)nt, sizeof(Cand *), by_firstb_desc);
    double next = 1e300;
    for (int k = 0; k < nt; k++) {
        if (!takeflag[t[k] - c0]) continue;
        double end = S->t[t[k]->firstb] < next ? S->t[t[k]->firstb] : next;
        double start = end - OFFLOAD_SLACK * profile_copy_seconds(S->prof, (double)t[k]->bytes, 0);
        /* in time: after its release, and not before the backward action
         * ahead of its own starts (else it waits on the device through a
         * peak it was offloaded for) */
        int j = next_bwd(b, nb, t[k]->firstb - 1) - 1; /* its own backward action: b[j] <= firstb */
        double earliest = S->t[t[k]->release > 0 ? t[k]->release : t[k]->lastf + 1];
        if (j >= 1 && S->t[b[j - 1]] > earliest) earliest = S->t[b[j - 1]];
        if (admit && start < earliest) {
            takeflag[t[k] - c0] = 0, dropped++;
            continue;
        }
        next = start;
        int at = first_at(S->t, t[k]->lastf + 1, t[k]->firstb, start); /* sec[at] >= start: the one before starts by it */
        if (at > t[k]->lastf + 1 && S->t[at] > start) at--;
        if (at > t[k]->firstb - OFFLOAD_MIN_NODES) at = t[k]->firstb - OFFLOAD_MIN_NODES; /* OFFLOAD_MIN_NODES */
        if (at < t[k]->release) at = t[k]->release; /* never both buffers on the device (the copy streams are behind) */
        t[k]->issue = at < t[k]->firstb ? at : t[k]->firstb - 1;
    }
    (void)g;
    return dropped;
}

/* Copies that free nothing: a value whose reload must be issued where its
 * offload is released, or before (its d2h copy ends too late, behind the
 * others queued on the d2h stream, or the h2d stream must start its reload
 * that early), is never off the device, and its copies only take the
 * streams' time from the others (with `all` on a copy-bound profile, most
 * of them: the queue then held values past their peaks while reloads came
 * early).  Any policy: such a value stays on the device (take[k] = 0) and
 * the rest are placed again.  Returns how many it dropped. */
static int drop_useless(Cand **t, int nt, char *take, const Cand *c0) {
    int dropped = 0;
    for (int k = 0; k < nt; k++)
        if (take[t[k] - c0] && t[k]->release >= 0 && t[k]->issue >= 0 && t[k]->issue <= t[k]->release) take[t[k] - c0] = 0, dropped++;
    return dropped;
}

/* With a profile: where each chosen copy's fences go, from the costs.  The
 * d2h stream runs the offloads in order, each from when the compute reaches
 * it and the stream is free; the release fence goes before the first node
 * the compute starts after that copy ends.  The h2d stream runs the reloads
 * as late as they can, backwards from each first backward reader; a reload
 * is issued before the last node the compute starts by its start, never
 * before its release.  With `auto` a copy is also admitted only if it is
 * in time (stream_pass): a copy queued behind others holds its device
 * buffer until it ends, so an offload that ends after the peaks it was
 * meant to lower, or a reload that must begin before them, saves nothing
 * and delays the rest (without this, more offload raised the peak).  The
 * passes repeat until none is dropped.  Seconds of nodes: S->sec, with a
 * pipeline's bubble (pp_starts). */
static void timed_places(const Off *S, Cand *c, int nc, char *take) {
    const Graph *g = S->g;
    Cand **t = xcalloc((size_t)nc + 1, sizeof(Cand *));
    int nt = 0, nb;
    for (int k = 0; k < nc; k++)
        if (take[k]) {
            int def = g->vals[c[k].v].def;
            if (c[k].lastf < def) c[k].lastf = def; /* from here: the node the offload follows */
            t[nt++] = &c[k];
        }
    int *b = bwd_starts(g, &nb);
    for (int it = 0; it < 8; it++) {
        for (int k = 0; k < nt; k++) t[k]->release = -1, t[k]->issue = -1;
        int dropped = stream_pass(S, t, nt, take, c, b, nb, S->autop);
        if ((dropped += drop_useless(t, nt, take, c)) == 0) break;
        if (it == 7) { /* still dropping: take none of the rest's changes, place what is left */
            stream_pass(S, t, nt, take, c, b, nb, 0);
        }
    }
    free(b), free(t);
}

/* auto with a profile that gives the host memory per device: keep the
 * host space within it (with 2% to spare for alignment and the lifetimes
 * memplan gives host buffers, which end a little after the reload's first
 * reader: live.c host_read_end).  A taken value holds host bytes from its
 * offload (after lastf) to its first backward reader; while the most live
 * at once exceeds the host memory, the value live there offloaded last is
 * kept on the device instead (the host is full: a longer sequence fits
 * where device and host memory share the saved values).  Returns how many
 * it dropped. */
static int host_trim(const Off *S, const Cand *c, int nc, char *take) {
    if (!S->autop || !S->prof || S->prof->host_memory_bytes <= 0) return 0;
    double cap = S->prof->host_memory_bytes / 1.02, *live = xcalloc((size_t)S->g->nnodes + 2, sizeof(double));
    int dropped = 0;
    for (;;) {
        for (int i = 0; i <= S->g->nnodes; i++) live[i] = 0;
        for (int k = 0; k < nc; k++)
            if (take[k]) live[c[k].lastf + 1] += (double)c[k].bytes, live[c[k].firstb] -= (double)c[k].bytes;
        double h = 0, peak = 0;
        int at = -1;
        for (int i = 0; i <= S->g->nnodes; i++) {
            h += live[i];
            if (h > peak) peak = h, at = i;
        }
        if (peak <= cap) break;
        int best = -1;
        for (int k = 0; k < nc; k++)
            if (take[k] && c[k].lastf + 1 <= at && at < c[k].firstb && (best < 0 || c[k].lastf > c[best].lastf)) best = k;
        if (best < 0) break;
        take[best] = 0, dropped++;
    }
    free(live);
    return dropped;
}

/* The offloads' {lag}: nodes of the new order from the offload to the node
 * its release fence goes before (timed_places), at least 1. */
static void set_lags(Graph *g, const Cand *c, int nc, const char *take, const int *offload_of, const int *newidx) {
    for (int k = 0; k < nc; k++) {
        if (!take[k] || c[k].release < 0) continue;
        int o = offload_of[c[k].v];
        Node *n = &g->nodes[newidx[o]];
        for (int a = 0; a < n->nattr; a++)
            if (strcmp(n->attr[a].key, "lag") == 0) {
                int64_t lag = (int64_t)newidx[c[k].release] - newidx[o];
                n->attr[a].i = lag > 1 ? lag : 1;
            }
    }
}

/* Build offload and reload for c; their places go into after[] (the
 * offload's) and before[] (the reload's), the reload's output into repl[]. */
static int build_copies(Off *S, const Cand *c, int *after, int *before, int *repl) {
    Graph *g = S->g;
    const Node *d = &g->nodes[g->vals[c->v].def];
    int stage = d->stage, vstage = d->vstage, mb = d->mb;
    Builder b = {.g = g, .pass = "offload", .loc = d->loc, .layer = d->layer, .phase = PH_FWD};
    Attr lag = ir_attr_int(g->m, "lag", OFFLOAD_PREFETCH);
    int o = ir_build(&b, OP_offload, 1, &c->v, 1, &lag, NULL);
    b.phase = PH_BWD;
    int r = ir_build1(&b, OP_reload, ir_out(g, o), 0, NULL), rn = g->vals[r].def;
    g->nodes[o].stage = g->nodes[rn].stage = stage;
    g->nodes[o].vstage = g->nodes[rn].vstage = vstage;
    g->nodes[o].mb = g->nodes[rn].mb = mb;
    int from = c->lastf > g->vals[c->v].def ? c->lastf : g->vals[c->v].def, at = c->issue >= 0 ? c->issue : c->firstb - OFFLOAD_PREFETCH;
    after[o] = from;
    before[rn] = at > from + 1 ? at : from + 1;
    repl[c->v] = r;
    return o;
}

/* Every backward reader (the old nodes from the value's first backward
 * reader on) reads the reload; under the planted bug the last reader of
 * value keep keeps reading the device copy. */
static void rewire(Off *S, int n0, const int *repl, int keep) {
    Graph *g = S->g;
    int last = -1;
    for (int i = 0; keep >= 0 && i < n0; i++)
        for (int k = 0; k < g->nodes[i].nin; k++)
            if (g->nodes[i].in[k] == keep) last = i;
    for (int i = 0; i < n0; i++)
        for (int k = 0; k < g->nodes[i].nin; k++) {
            int v = g->nodes[i].in[k];
            if (repl[v] >= 0 && i >= S->firstb[v] && i != last) g->nodes[i].in[k] = repl[v];
        }
}

/* The new order: every old node, each offload right after its place, each
 * reload right before its place (new nodes are the ones from n0 on). */
static void place(Graph *g, int n0, const int *after, const int *before, int *newidx) {
    int n = g->nnodes, k = 0;
    int *order = xcalloc((size_t)n, sizeof(int)), *first = xcalloc((size_t)n0 * 2 + 2, sizeof(int)), *next = xcalloc((size_t)n, sizeof(int));
    for (int i = 0; i < 2 * n0 + 2; i++) first[i] = -1;
    for (int j = n - 1; j >= n0; j--) { /* slot 2i: before node i, 2i+1: after it; in creation order */
        int slot = g->nodes[j].op == OP_reload ? 2 * before[j] : 2 * after[j] + 1;
        next[j] = first[slot], first[slot] = j;
    }
    for (int i = 0; i < n0; i++) {
        for (int j = first[2 * i]; j >= 0; j = next[j]) order[k++] = j;
        order[k++] = i;
        for (int j = first[2 * i + 1]; j >= 0; j = next[j]) order[k++] = j;
    }
    if (k != n) ICE("offload: placed %d of %d nodes", k, n);
    for (int j = 0; j < n; j++) newidx[order[j]] = j;
    ir_reorder(g, order);
    free(order), free(first), free(next);
}

/* Each node's due (S->due): the latest it may end without delaying its
 * pipeline action past its end in the rank's timeline (S->sec) plus the
 * action's slack (slack, pp_latest_ends: from the pipeline's simulation,
 * whose per-chunk costs are means over micro-batches, so the slack is
 * taken relative to this rank's own timeline), nor the rank's step past
 * its end without copies, with every node after it run back to back; never
 * before its own end in S->sec.  Without --pp there is no slack: the due
 * is the node's end in S->sec. */
static void pace_dues(Off *S, const double *slack) {
    int n = S->g->nnodes;
    for (int i = n - 1; i >= 0; i--) {
        double d = i == n - 1 ? S->sec[n] : S->due[i + 1] - S->dur[i + 1];
        if (slack && slack[i] >= 0 && S->sec[i + 1] + slack[i] < d) d = S->sec[i + 1] + slack[i];
        S->due[i] = d > S->sec[i + 1] ? d : S->sec[i + 1];
    }
}

/* The largest number of device bytes live at one position of the rank's
 * program in the pass's order, without the copies (with = 0) or with the
 * taken ones placed where build_copies will put them: a value lives from
 * its producer to its last reader (views extend their root's), an
 * offloaded one to just before its release and its reload from its issue
 * to its last backward reader.  Params, states, inputs and constants and
 * what an output reads (the gradients) are left out: they are not in the
 * act arena, or live to the end either way.  Bytes as the device will
 * hold them (dev_bytes). */
static double model_peak(const Off *S, const Cand *c, int nc, char *take, int with, int *dropped) {
    const Graph *g = S->g;
    int n = g->nnodes, nv = g->nvals, *root = xcalloc((size_t)nv + 1, sizeof(int)), *end = xcalloc((size_t)nv + 1, sizeof(int));
    int *off = xcalloc((size_t)nv + 1, sizeof(int)), *rl = xcalloc((size_t)nv + 1, sizeof(int)), *lastb = xcalloc((size_t)nv + 1, sizeof(int));
    char *out = xcalloc((size_t)nv + 1, 1);
    double *delta = xcalloc((size_t)n + 2, sizeof(double));
    for (int v = 0; v < nv; v++) root[v] = end[v] = off[v] = rl[v] = lastb[v] = -1;
    for (int k = 0; with && k < nc; k++)
        if (take[k]) off[c[k].v] = k;
    for (int i = 0; i < n; i++) { /* roots; rl: a view of an offloaded value's reload (made from its first backward reader on) */
        const Node *d = &g->nodes[i];
        unsigned fl = ir_ops[d->op].flags;
        int u = (fl & F_VIEW) && d->nin ? d->in[0] : -1, rel = u >= 0 && (rl[u] >= 0 || (off[u] >= 0 && i >= c[off[u]].firstb));
        for (int k = 0; k < d->nout; k++) {
            int o = d->out[k];
            if (rel) rl[o] = rl[u] >= 0 ? rl[u] : u;
            else root[o] = u >= 0 && root[u] >= 0 ? root[u] : (fl & F_SOURCE) && !(fl & F_COMM) ? -1 : o;
        }
    }
    for (int i = 0; i < n; i++)
        for (int k = 0; k < g->nodes[i].nin; k++) {
            int v = g->nodes[i].in[k], r = root[v];
            if (rl[v] >= 0) lastb[rl[v]] = i; /* reads the reload, through a view */
            else if (off[v] >= 0 && i >= c[off[v]].firstb) lastb[v] = i; /* reads the reload */
            else if (r >= 0 && g->nodes[i].op == OP_output) out[r] = 1;
            else if (r >= 0) end[r] = end[r] > i ? end[r] : i;
        }
    for (int v = 0; v < nv; v++) {
        if (off[v] < 0) continue;
        const Cand *x = &c[off[v]];
        int from = x->lastf > g->vals[v].def ? x->lastf : g->vals[v].def, rel = x->release >= 0 ? x->release : from + 1 + OFFLOAD_PREFETCH;
        int iss = x->issue >= 0 ? x->issue : x->firstb - OFFLOAD_PREFETCH;
        if (iss < from + 1) iss = from + 1;
        if (rel > iss) rel = iss; /* schedule.c: the release never after the reload */
        if (dropped && (root[v] < 0 || end[root[v]] >= iss)) { /* its buffer stays, read through another value: copies free nothing */
            take[off[v]] = 0, ++*dropped;
            continue;
        }
        if (rel - 1 > end[root[v]]) end[root[v]] = rel - 1;
        double b = dev_bytes(g, v, S->o->precision_bf16);
        delta[iss] += b, delta[(lastb[v] > iss ? lastb[v] : iss) + 1] -= b;
    }
    for (int v = 0; v < nv; v++)
        if (root[v] == v && !out[v] && end[v] >= 0) {
            double b = dev_bytes(g, v, S->o->precision_bf16);
            delta[g->vals[v].def] += b, delta[end[v] + 1] -= b;
        }
    double live = 0, peak = 0;
    for (int i = 0; i <= n; i++)
        if ((live += delta[i]) > peak) peak = live;
    free(root), free(end), free(off), free(rl), free(lastb), free(out), free(delta);
    return peak;
}

/* Offload only where it lowers the rank's peak.  Copies change the act
 * arena's packing (memplan's best fit), so a rank whose peak they do not
 * lower by more than OFFLOAD_PEAK_MARGIN in the pass's own count
 * (model_peak: with every value's device lifetime inside its lifetime
 * without, it never rises) could still end a little above its plan
 * without offload: the Llama-3 70B plan of the tune issue with `all`,
 * whose peaks sit where no offloaded value is off the device, +0.0-0.2%
 * per rank.  Such a rank offloads nothing: its program is the one without
 * offload.  KILN_OFFLOAD_TRACE=1 prints both counts per rank. */
#define OFFLOAD_PEAK_MARGIN 0.01
static void peak_guard(const Off *S, int rank, const Cand *c, int nc, char *take) {
    int nt = 0;
    for (int k = 0; k < nc; k++) nt += take[k];
    if (!nt) return;
    int aliased = 0;
    double m0 = model_peak(S, c, nc, take, 0, NULL), m1 = model_peak(S, c, nc, take, 1, &aliased);
    nt -= aliased;
    int drop = m1 > m0 * (1 - OFFLOAD_PEAK_MARGIN);
    if (getenv("KILN_OFFLOAD_TRACE"))
        fprintf(stderr, "offload: rank %d: %d values (%d more left on the device: their buffer stays, shared), modelled peak %.2f MiB with, %.2f MiB without (%+.2f%%)%s\n",
                rank, nt, aliased, m1 / (1 << 20), m0 / (1 << 20), m0 > 0 ? 100 * (m1 / m0 - 1) : 0.0, drop ? ": none offloaded" : "");
    for (int k = 0; drop && k < nc; k++) take[k] = 0;
}

static void offload_graph(Module *m, int rank, const Options *o, int last_rank, int last_vstage, const Profile *prof, const double *start,
                          const double *lend) {
    Graph *g = m->stages[rank];
    int nv = g->nvals, n0 = g->nnodes;
    Off S = {g, o, xcalloc((size_t)nv, sizeof(int)), xcalloc((size_t)nv, sizeof(int)), xcalloc((size_t)nv, 1), xcalloc((size_t)nv, 1),
             last_rank, last_vstage, prof, o->offload == OFFLOAD_AUTO, xcalloc((size_t)n0 + 1, sizeof(double)),
             xcalloc((size_t)n0 + 1, sizeof(double)), xcalloc((size_t)n0 + 1, sizeof(double)), xcalloc((size_t)n0 + 1, sizeof(double)),
             xcalloc((size_t)n0 + 1, sizeof(double)), xcalloc((size_t)n0 + 1, sizeof(double)), getenv("KILN_TEST_OFFLOAD_NO_PACE") != NULL};
    for (int i = 0; prof && i < n0; i++) { /* a node starts no earlier than its pipeline action (the bubble) */
        S.pst[i] = start ? start[i] : -1;
        S.dur[i] = node_seconds(prof, g, &g->nodes[i], o->precision_bf16);
        double t0 = S.pst[i] > S.sec[i] ? S.pst[i] : S.sec[i];
        S.sec[i + 1] = t0 + S.dur[i], S.busy[i + 1] = S.busy[i] + S.dur[i];
    }
    if (prof) pace_dues(&S, lend);
    scan(&S);
    Cand *c = xcalloc((size_t)nv, sizeof(Cand));
    int nc = 0;
    for (int v = 0; v < nv; v++)
        if (is_candidate(&S, rank, v)) {
            const Node *d = &g->nodes[g->vals[v].def];
            c[nc++] = (Cand){v, S.lastf[v], S.firstb[v], d->vstage * 65536 + d->mb, (int64_t)dev_bytes(g, v, o->precision_bf16), -1, -1};
        }
    char *take = xcalloc((size_t)nc + 1, 1);
    choose(&S, c, nc, take);
    if (prof) timed_places(&S, c, nc, take);
    if (prof && host_trim(&S, c, nc, take)) timed_places(&S, c, nc, take); /* fewer copies: placed again */
    peak_guard(&S, rank, c, nc, take);
    int nt = 0;
    for (int k = 0; k < nc; k++) nt += take[k];
    int *after = xcalloc((size_t)(n0 + 2 * nt), sizeof(int)), *before = xcalloc((size_t)(n0 + 2 * nt), sizeof(int));
    int *repl = xcalloc((size_t)nv, sizeof(int)), *offload_of = xcalloc((size_t)nv, sizeof(int)), keep = -1;
    for (int v = 0; v < nv; v++) repl[v] = -1;
    for (int k = 0; k < nc; k++)
        if (take[k]) {
            if (o->offload_bug && keep < 0) keep = c[k].v;
            offload_of[c[k].v] = build_copies(&S, &c[k], after, before, repl);
        }
    rewire(&S, n0, repl, keep);
    int *newidx = xcalloc((size_t)g->nnodes + 1, sizeof(int));
    if (nt) place(g, n0, after, before, newidx);
    if (nt && prof) set_lags(g, c, nc, take, offload_of, newidx);
    free(S.lastf), free(S.firstb), free(S.data), free(S.bad), free(S.sec), free(S.dur), free(S.pst), free(S.due), free(S.t), free(S.busy), free(c), free(take), free(after), free(before), free(repl);
    free(offload_of), free(newidx);
}

void pass_offload(Module *m, const Options *o) {
    if (o->offload == 0 && !o->offload_stages) return;
    Profile prof, *pp = NULL;
    if (o->offload == OFFLOAD_AUTO || o->device_profile) { /* auto's fractions; with a profile, the copies' places by their times */
        char err[512];
        if (profile_load(&prof, o->device_profile ? o->device_profile : "cpu", err, sizeof err) != 0)
            error_at(m->stages[0]->nnodes ? m->stages[0]->nodes[0].loc : (Loc){0}, "--offload %s: %s",
                     o->offload == OFFLOAD_AUTO ? "auto" : "(--device-profile)", err);
        pp = &prof;
    }
    int last_rank = -1, last_vstage = -1;
    if (m->nstages > 1) {
        PpPlan pl;
        char err[256];
        if (ppsched_build(&pl, (PpSchedule)o->pp_schedule, o->pp, o->vpp, o->micro_batches, err, sizeof err) != 0) ICE("offload: %s", err);
        int last = pl.p * pl.v - 1;
        last_rank = pp_chunk_rank(&pl, last), last_vstage = pp_chunk_vstage(&pl, last);
        ppsched_free(&pl);
    }
    double **lend = NULL, **start = pp_times(m, o, pp, o->precision_bf16, &lend); /* before any rank's graph changes */
    for (int s = 0; s < m->nstages; s++)
        offload_graph(m, s, o, last_rank, last_vstage, pp, start ? start[s] : NULL, lend ? lend[s] : NULL);
    offload_pp_starts_free(start, m->nstages), offload_pp_starts_free(lend, m->nstages);
}
