/* plan_pp.c — `kiln plan --pp N`: the pipeline section (issue 18).
 *
 * After the pipeline pass, stages[r] is pipeline rank r's program: its
 * chunks' forward and backward for every micro-batch, unrolled in the
 * schedule's order, with send/recv over group "pp" between ranks.  This
 * file reads those programs back and says what the schedule costs:
 *
 *   memory   per stage: params, gradients, optimizer state and the
 *            activation arena's peak (memplan's act space of that stage's
 *            program), their total, and the in-flight bound the schedule
 *            promises on that rank (ppsched_inflight_bound).  The first
 *            stage holds the most micro-batches in flight, the last the
 *            fewest: the first-to-last ratio of the activation peaks is the
 *            skew that offloading per virtual stage removes.
 *   bubble   the ops' costs: per (chunk, kind), the sum of ir_node_flops
 *            over that rank's nodes of the chunk (the chunk of a node is
 *            pp_chunk(rank, its vstage)) and of the kind's phases — fwd is
 *            F; bwd and recompute are B; wgrad (the zero-bubble schedules'
 *            weight gradients) is W — averaged over the micro-batches;
 *            ppsched_simulate times the plan with them at zero latency.
 *            Beside it ppsched_bubble_formula's closed form, at equal costs
 *            per chunk (the means of the same costs).  The two differ where
 *            the chunks differ: the embedding and the head make the first
 *            and the last chunk heavier than the rest.  And the bubble no
 *            order within the schedule's in-flight bounds can go below at
 *            these costs (ppsched_makespan_bound): where the simulated one
 *            equals it, the order is the best and the rest is the stages.
 *   traffic  bytes sent over pp per step: each send of group "pp" counts
 *            its input's bytes, per sending rank and per rank pair
 *            (rank + attr peer is the receiver): activations forward,
 *            their gradients backward, the tied embedding's gradient sum.
 *
 * kiln plan --pp-schedule all compiles the model once per schedule that
 * (p, v, m) allows (interleaved at --vpp or 2 chunks per rank, zb-v at 2,
 * the others at 1) and prints a row each; a schedule that the flags or the
 * model's layer count refuse gets its reason instead.  kiln plan
 * --timeline FILE.svg draws the chosen schedule with plot_pp_timeline from
 * the same simulated times; the SVG is built in memory first, so a plan the
 * plotter refuses leaves FILE as it was.
 *
 * A .ir dump does not record its schedule: kiln plan reads it with the
 * flags given, and refuses flags that cannot be the dump's (micro-batches,
 * W work, a chunk without forward work; pp_matches).
 *
 * The costs go to the simulator in a unit picked from their size (FLOP,
 * kFLOP, ... TFLOP per chunk and micro-batch): the bubble does not depend
 * on it, the timeline's axis reads in it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#include "memplan.h"
#include "plot.h"
#include "ppsched.h"

static double mib(int64_t b) { return (double)b / (1 << 20); }

/* ---- what a pipelined module costs ---- */

typedef struct {
    PpPlan pl;
    PpTimes t;
    int nch;
    double *cost[3];      /* [nch]: (kind, chunk) per micro-batch, in unit */
    double mean[3];       /* per chunk */
    double scale;         /* FLOPs per unit */
    const char *unit;     /* "MFLOP", ... */
    double closed;        /* ppsched_bubble_formula at the means */
    int64_t (*mem)[4];    /* [p]: params, grads, opt, act */
    int64_t *sent;        /* [p][p]: bytes rank r sends rank q per step */
} PpStats;

static void pp_stats_free(PpStats *st) {
    ppsched_free(&st->pl);
    ppsched_times_free(&st->t);
    for (int k = 0; k < 3; k++) free(st->cost[k]);
    free(st->mem);
    free(st->sent);
}

static int phase_kind(Phase ph) { return ph == PH_FWD ? ACT_F : ph == PH_BWD ? ACT_B : ph == PH_WGRAD ? ACT_W : -1; }

/* The action kind node i runs in.  A recompute node has no kind of its own:
 * it runs in the action of the next node of its chunk and micro-batch that is
 * not a recompute (B, or W when only the weight gradient reads it). */
static int node_kind(const Graph *g, int i) {
    const Node *n = &g->nodes[i];
    if (n->phase != PH_RECOMPUTE) return phase_kind(n->phase);
    for (int j = i + 1; j < g->nnodes; j++) {
        const Node *x = &g->nodes[j];
        if (x->phase != PH_RECOMPUTE && x->vstage == n->vstage && x->mb == n->mb && phase_kind(x->phase) >= 0)
            return phase_kind(x->phase);
    }
    return ACT_B;
}

/* A .ir dump does not record its schedule: the flags must say it.  The
 * nodes' micro-batches must span m, W work (phase wgrad) must be there
 * exactly for the zero-bubble schedules, and every chunk must have forward
 * work, or the flags describe another plan than the module's. */
static int pp_matches(const PpStats *st, int last_mb, int has_w, char *err, size_t errlen) {
    const char *name = pp_schedule_names[st->pl.kind];
    int zb = st->pl.kind == PS_ZBH1 || st->pl.kind == PS_ZBV;
    if (last_mb + 1 != st->pl.m)
        return snprintf(err, errlen, "the module has %d micro-batches, but --micro-batches is %d", last_mb + 1, st->pl.m), -1;
    if (has_w != zb)
        return snprintf(err, errlen, "the module %s W work (phase wgrad), but --pp-schedule %s %s", has_w ? "has" : "has no", name,
                        zb ? "splits the backward" : "does not"), -1;
    for (int c = 0; c < st->nch; c++)
        if (!(st->cost[ACT_F][c] > 0))
            return snprintf(err, errlen, "chunk %d of --pp-schedule %s (v %d) has no forward work in the module", c, name, st->pl.v), -1;
    return 0;
}

/* Sums the ops' FLOPs per (kind, chunk) and the sends per rank pair. */
static int pp_walk(const Module *m, PpStats *st, char *err, size_t errlen) {
    int p = st->pl.p, last_mb = 0, has_w = 0;
    for (int r = 0; r < p; r++) {
        const Graph *g = m->stages[r];
        for (int i = 0; i < g->nnodes; i++) {
            const Node *n = &g->nodes[i];
            if (n->op == OP_send && strcmp(ir_attr_s(n, "group", ""), "pp") == 0) {
                int q = r + (int)ir_attr_i(n, "peer", 0);
                if (q < 0 || q >= p || q == r) return snprintf(err, errlen, "stage %d: a send to pp rank %d of %d", r, q, p), -1;
                st->sent[r * p + q] += ir_value_bytes(&g->vals[n->in[0]]);
            }
            int k = node_kind(g, i);
            if (k < 0) continue;
            if (n->vstage < 0 || n->vstage >= st->pl.v)
                return snprintf(err, errlen, "stage %d: a node of virtual stage %d, but the schedule has %d per rank", r, n->vstage, st->pl.v), -1;
            st->cost[k][pp_chunk(&st->pl, r, n->vstage)] += ir_node_flops(g, n);
            last_mb = n->mb > last_mb ? n->mb : last_mb;
            has_w |= k == ACT_W;
        }
        st->mem[r][0] = memplan_stage_peak(g, SPACE_PARAMS), st->mem[r][1] = memplan_stage_peak(g, SPACE_GRADS);
        st->mem[r][2] = memplan_stage_peak(g, SPACE_OPT), st->mem[r][3] = memplan_stage_peak(g, SPACE_ACT);
    }
    return pp_matches(st, last_mb, has_w, err, errlen);
}

/* Costs per micro-batch in a unit where the largest is at least 1. */
static void pp_units(PpStats *st) {
    static const char *const names[] = {"TFLOP", "GFLOP", "MFLOP", "kFLOP", "FLOP"};
    double big = 0;
    for (int k = 0; k < 3; k++)
        for (int c = 0; c < st->nch; c++) big = st->cost[k][c] / st->pl.m > big ? st->cost[k][c] / st->pl.m : big;
    int u = 0;
    for (st->scale = 1e12; u < 4 && big < st->scale; u++) st->scale /= 1e3;
    st->unit = names[u];
    for (int k = 0; k < 3; k++) {
        st->mean[k] = 0;
        for (int c = 0; c < st->nch; c++) st->mean[k] += (st->cost[k][c] /= st->pl.m * st->scale) / st->nch;
    }
}

/* The stats of m, compiled under o; 0, or -1 with one line in err. */
static int pp_stats(const Module *m, const Options *o, PpStats *st, char *err, size_t errlen) {
    memset(st, 0, sizeof *st);
    if (m->nstages != o->pp || m->mesh[0] != o->pp)
        return snprintf(err, errlen, "the module has %d pipeline stages, but --pp is %d (a .ir dump: give the flags it was built with)",
                        m->nstages, o->pp), -1;
    if (ppsched_build(&st->pl, (PpSchedule)o->pp_schedule, o->pp, o->vpp, o->micro_batches, err, errlen) != 0) return -1;
    int p = st->pl.p;
    st->nch = p * st->pl.v;
    for (int k = 0; k < 3; k++) st->cost[k] = xcalloc((size_t)st->nch, sizeof(double));
    st->mem = xcalloc((size_t)p, sizeof *st->mem);
    st->sent = xcalloc((size_t)p * (size_t)p, sizeof(int64_t));
    if (pp_walk(m, st, err, errlen) != 0) return -1;
    pp_units(st);
    const double *const cost[3] = {st->cost[0], st->cost[1], st->cost[2]};
    if (ppsched_simulate(&st->pl, cost, 0, &st->t) != 0) return snprintf(err, errlen, "the schedule's simulation failed (ppsched_simulate)"), -1;
    st->closed = ppsched_bubble_formula(st->pl.kind, p, st->pl.v, st->pl.m, st->mean[0], st->mean[1], st->mean[2]);
    return 0;
}

static int64_t pp_sent_total(const PpStats *st) {
    int64_t s = 0;
    for (int i = 0; i < st->pl.p * st->pl.p; i++) s += st->sent[i];
    return s;
}

/* ---- kiln plan --pp N: the section ---- */

static void pp_print_memory(const PpStats *st, FILE *f) {
    int p = st->pl.p;
    fprintf(f, "  %5s %10s %10s %10s %10s %10s %10s   (MiB per rank; in flight: (chunk, micro-batch) pairs the schedule allows)\n",
            "stage", "params", "grads", "optimizer", "act. peak", "total", "in flight");
    for (int r = 0; r < p; r++) {
        const int64_t *x = st->mem[r];
        fprintf(f, "  %5d %10.2f %10.2f %10.2f %10.2f %10.2f %10d\n", r, mib(x[0]), mib(x[1]), mib(x[2]), mib(x[3]),
                mib(x[0] + x[1] + x[2] + x[3]), ppsched_inflight_bound(&st->pl, r));
    }
    int64_t a0 = st->mem[0][3], a1 = st->mem[p - 1][3];
    fprintf(f, "  activation peak, first stage against last: %.2f MiB / %.2f MiB = %.3fx\n", mib(a0), mib(a1),
            a1 ? (double)a0 / (double)a1 : 0.0);
}

static void pp_print_costs(const PpStats *st, FILE *f) {
    fprintf(f, "  bubble %.4f from the ops' costs (simulated, latency 0); closed form %.4f at equal costs per chunk "
               "(F %.4g, B %.4g, W %.4g %s)\n", st->t.bubble, st->closed, st->mean[0], st->mean[1], st->mean[2], st->unit);
    const double *const cost[3] = {st->cost[0], st->cost[1], st->cost[2]};
    double lb = ppsched_makespan_bound(&st->pl, cost, 0), busy = (1 - st->t.bubble) * st->pl.p * st->t.makespan;
    double lbb = lb > 0 ? 1 - busy / (st->pl.p * lb) : 0;
    fprintf(f, "  no order within the in-flight bounds below bubble %.4f at these costs (ppsched_makespan_bound)%s\n", lbb,
            st->t.makespan <= lb * (1 + 1e-9) ? ": this order reaches it" : "");
    const double *t = st->mean;
    if (st->pl.kind == PS_ZBH1 && (t[2] > t[0] || t[2] > t[1]))
        fprintf(f, "  (zb-h1's closed form is exact only for W <= F and W <= B: here it is the paper's estimate)\n");
    if (st->pl.kind == PS_ZBV && (t[0] != t[1] || t[1] != t[2])) fprintf(f, "  (zb-v's closed form is exact only for F = B = W)\n");
    for (int k = 0; k < 3; k++) {
        if (k == ACT_W && st->mean[k] == 0) continue;
        fprintf(f, "  %s per chunk and micro-batch (%s):", pp_act_names[k], st->unit);
        for (int c = 0; c < st->nch; c++) fprintf(f, " %.4g", st->cost[k][c]);
        fputc('\n', f);
    }
}

static void pp_print_traffic(const PpStats *st, FILE *f) {
    int p = st->pl.p;
    fprintf(f, "  sent over pp per step:");
    for (int r = 0; r < p; r++) {
        int64_t s = 0;
        for (int q = 0; q < p; q++) s += st->sent[r * p + q];
        fprintf(f, "%s rank %d %lld bytes (%.2f MiB)", r ? "," : "", r, (long long)s, mib(s));
    }
    fprintf(f, "\n  per rank pair (from->to):");
    int any = 0;
    for (int r = 0; r < p; r++)
        for (int q = 0; q < p; q++)
            if (st->sent[r * p + q]) fprintf(f, "%s %d->%d %.2f MiB", any++ ? "," : "", r, q, mib(st->sent[r * p + q]));
    fputc('\n', f);
}

/* The timeline of st into a->timeline (built in memory, then written). */
static void pp_timeline(const Args *a, const Module *m, const PpStats *st) {
    char title[256], err[512], *svg = NULL;
    size_t n = 0;
    snprintf(title, sizeof title, "%s, %s p %d v %d m %d, planned from the ops' costs (%s)", m->name, pp_schedule_names[st->pl.kind],
             st->pl.p, st->pl.v, st->pl.m, st->unit);
    FILE *mem = open_memstream(&svg, &n);
    if (!mem) die("--timeline: out of memory");
    int rc = plot_pp_timeline(mem, &st->pl, &st->t, title, err, sizeof err);
    fclose(mem);
    if (rc != 0) die("--timeline: %s", err);
    FILE *f = fopen(a->timeline, "w");
    if (!f) die("--timeline: cannot open %s: %s", a->timeline, strerror(errno));
    int bad = fwrite(svg, 1, n, f) != n;
    bad |= fclose(f) != 0;
    free(svg);
    if (bad) die("--timeline: cannot write %s: %s", a->timeline, strerror(errno));
}

void plan_pp_report(const Args *a, const Module *m) {
    PpStats st;
    char err[512];
    if (a->o.pp == 1) { /* a .ir dump of a pipeline, no flags given */
        printf("pipeline: the module has %d stages; give --pp %d and the --vpp, --pp-schedule and --micro-batches it was built with "
               "for the pipeline section\n", m->mesh[0], m->mesh[0]);
        return;
    }
    if (pp_stats(m, &a->o, &st, err, sizeof err) != 0) die("plan --pp: %s", err);
    printf("pipeline: %s, p %d, v %d, m %d (%d chunks)\n", pp_schedule_names[st.pl.kind], st.pl.p, st.pl.v, st.pl.m, st.nch);
    pp_print_memory(&st, stdout);
    pp_print_costs(&st, stdout);
    pp_print_traffic(&st, stdout);
    if (a->timeline) pp_timeline(a, m, &st);
    pp_stats_free(&st);
}

/* ---- kiln plan --pp-schedule all ---- */

/* The model's layer count, from its front-end graph. */
static int model_layers(const Args *a) {
    Args one = *a;
    one.after = "front";
    Module *m = compile(&one);
    int L = 0;
    for (int s = 0; s < m->nstages; s++)
        for (int i = 0; i < m->stages[s]->nnodes; i++)
            if (m->stages[s]->nodes[i].layer + 1 > L) L = m->stages[s]->nodes[i].layer + 1;
    ir_free(m);
    return L;
}

/* Why schedule s at v chunks per rank cannot run here ("" if it can). */
static void pp_refusal(const Args *a, PpSchedule s, int v, int layers, char *why, size_t n) {
    PpPlan pl;
    why[0] = 0;
    if (ppsched_build(&pl, s, a->o.pp, v, a->o.micro_batches, why, n) == 0) {
        ppsched_free(&pl);
        if (a->o.npp_layers && a->o.npp_layers != a->o.pp * v)
            snprintf(why, n, "--pp-layers gives %d chunks, this schedule has %d (--pp %d x %d)", a->o.npp_layers, a->o.pp * v, a->o.pp, v);
        else if (a->o.pp * v > layers)
            snprintf(why, n, "%d chunks (--pp %d x %d), but the model has %d layer%s", a->o.pp * v, a->o.pp, v, layers, layers == 1 ? "" : "s");
    }
}

void plan_pp_schedules(Args *a) {
    size_t n = strlen(a->model);
    if (n >= 3 && strcmp(a->model + n - 3, ".ir") == 0) die("--pp-schedule all: needs a .lua model (a .ir dump holds one schedule)");
    int layers = model_layers(a);
    printf("pipeline schedules, p %d, m %d: bubble simulated from the ops' costs (latency 0) and the closed form at equal costs;\n"
           "activation peaks per rank; bytes sent over pp per step by all stages\n", a->o.pp, a->o.micro_batches);
    printf("  %-12s %3s %8s %8s %12s %12s %10s %14s\n", "schedule", "v", "bubble", "closed", "act. first", "act. last", "first/last",
           "sent over pp");
    for (int s = 0; s < PS_COUNT; s++) {
        int v = s == PS_INTERLEAVED ? (a->o.vpp >= 2 ? a->o.vpp : 2) : s == PS_ZBV ? 2 : 1;
        char why[512];
        pp_refusal(a, (PpSchedule)s, v, layers, why, sizeof why);
        if (why[0]) {
            printf("  %-12s %3d   refused: %s\n", pp_schedule_names[s], v, why);
            continue;
        }
        Args one = *a;
        one.o.pp_schedule = s, one.o.vpp = v, one.comparison = 1;
        Module *m = compile(&one);
        PpStats st;
        if (pp_stats(m, &one.o, &st, why, sizeof why) != 0) die("plan --pp-schedule all: %s: %s", pp_schedule_names[s], why);
        int64_t a0 = st.mem[0][3], a1 = st.mem[st.pl.p - 1][3];
        printf("  %-12s %3d %8.4f %8.4f %8.2f MiB %8.2f MiB %9.3fx %10.2f MiB\n", pp_schedule_names[s], v, st.t.bubble, st.closed, mib(a0),
               mib(a1), a1 ? (double)a0 / (double)a1 : 0.0, mib(pp_sent_total(&st)));
        pp_stats_free(&st);
        ir_free(m);
    }
}
