/* tune_search.c — predicting a configuration's step without compiling it whole
 * (issue 21): the fast path of `kiln tune`, and the full path it is
 * checked against.
 *
 * The full path compiles the candidate's programs and runs the cost model
 * on them (cost.c): exact to the model, but an 80-layer pipeline of 64
 * micro-batches is minutes of compiling, and a search visits thousands of
 * candidates.  The fast path compiles one small *probe* per distinct
 * per-rank shape instead and composes:
 *
 *   the probe    the model with two layers, one micro-batch of the
 *                candidate's size b, the candidate's cp, cp-comm, recompute
 *                and dtype, dp 1 and no pipeline, compiled through memplan
 *                and simulated.  Its compute stream is cut by the nodes'
 *                layer and phase: layer 1's forward (F), its backward split
 *                into what the gradient sent to layer 0 needs (B) and the
 *                rest (W, the weight gradients: pp.c's zero-bubble split,
 *                found the same way, backward from layer 0's readers), the
 *                nodes outside the layers before and after them (embedding;
 *                head and loss) and the optimizer.  Each piece keeps its
 *                compute and its exposed waits apart.  Candidates with the
 *                same (b, cp, cp-comm, recompute) share a probe.
 *   the pipeline the layers are cut into pp·v chunks as pp.c cuts them
 *                (its DP over the forward FLOPs + 1 a node, the embedding
 *                on the first chunk and the head on the last, measured on
 *                the probe's second micro-batch); each chunk's
 *                F, B, W are its layers' plus its ends'; ppsched_simulate
 *                times the schedule with them and the p2p time of one
 *                layer's activation as the transfer latency.
 *   data parallel  the gradients' reduce-scatter (all-reduce with zero 0)
 *                and the parameters' all-gather over dp·cp are the
 *                profile's ring times of the stage's bytes; the all-gather
 *                hides behind the first micro-batch's forward and the
 *                reduce-scatter behind the last one's backward except one
 *                bucket each (schedule.c hoists them so), the optimizer's
 *                compute scales with the stage's share of the parameters
 *                over dp·cp (zero 1).
 *   memory       params and gradients scale with the stage's parameters
 *                (the layers', plus the embedding's on the first stage and
 *                the head's on the last: a tied one on both),
 *                the optimizer state with them over dp·cp; activations are
 *                the probe's per-layer saved bytes times the layers of a
 *                chunk (the saved bytes outside the layers on the last
 *                chunk), held from each F to the action that frees them (B;
 *                W for the zero-bubble schedules) in the rank's action
 *                order, at their most, plus the probe's transient peak
 *                (its activation peak less what it saves).  --offload all
 *                keeps two (chunk, micro-batch) pairs' saved bytes on the
 *                device and adds the copies' time they cannot hide.
 *                Without a pipeline the probe is compiled again at two and
 *                three layers and its memory extended along that line
 *                (exact where memory grows linearly with layers, whatever
 *                sets the peak), the optimizer state over dp·cp.
 *
 *                --offload all's copies also bound the rank's step: every
 *                offloaded pair's bytes go out and come back on the d2h
 *                and h2d streams, one copy at a time, so a rank whose copies
 *                outlast its timeline is copy-bound by the difference.
 *
 * The search asks for the memory first (tune_predict_fit: a candidate over
 * the budget is not simulated) and, before any probe, for a lower bound
 * (tune_lower_bound: the parameter state spread over the pp ranks, which
 * every probe of the same tp, cp and dp > 1 gives); the last few pipeline
 * plans are cached (plan_get), since the rules and the prediction ask for
 * the same one for every recompute policy and cp-comm in a row.
 *
 * The fast path ranks and prunes; the first rows are then verified by
 * the exact plan on a slice (tune_verify): the candidate with all its
 * layers and the fewest micro-batches m' at which every rank holds as
 * many (chunk, micro-batch) pairs in flight at its most (ppsched's action
 * lists: 1f1b and zb-h1 saturate at m' = p), compiled through memplan
 * (each rank's peak, exact: the in-flight pairs are what grows with m) and
 * simulated; its step carries the fast path's error at m' to m.
 *
 * tests/t_tune.sh checks the fast path against the full one on small
 * configurations (kiln tune --check), and docs/tune.md reports both.
 */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#include "cost.h"
#include "live.h"
#include "memplan.h"
#include "passes.h"
#include "ppsched.h"
#include "tune.h"

enum { KF, KB, KW };

struct TuneProbe {
    int b, cp, cp_comm, rc, tp, dp;      /* the key (dp: 2 for any candidate dp > 1, else 1) */
    double lc[3], lx[3];                 /* one layer per micro-batch: compute, exposed wait (F, B, W) */
    double prec[3], prex[3], postc[3], postx[3]; /* outside the layers: before them (embedding), after (head, loss) */
    double adamw, once;                  /* per step: the optimizer's update (over the probe's dp·cp shard), the rest of
                                          * what runs once a step (the buckets' slices and concats, assigns) */
    double fl_layer, fl_extra;           /* model FLOPs per micro-batch */
    double pcount_layer, pcount;         /* parameters (elements) of one layer, of the probe */
    int nl;                              /* the probe's layers */
    double sp, sg, so;                   /* its params, grads, optimizer bytes (so: over cp already) */
    double saved_layer, saved_extra, transient, act_bytes;
    double bal_layer, bal_pre, bal_post; /* pp.c's balance weights of one micro-batch: forward FLOPs + 1 a node, of
                                          * one layer, of the work before the layers and after */
    double pg_act;                       /* params and grads in the activation arena (zero 1, dp > 1) */
    double transient1;                   /* the transient of the same probe at one micro-batch (no gradient
                                          * accumulation buffers); < 0 until a candidate with m 1 asks */
    /* without a pipeline: memory measured at 2 and 3 layers, [m > 1], the
     * optimizer state apart (it shards over dp·cp); filled when asked */
    int lin_done[5][2];                  /* by min(m, 4): the peak grows with m up to 4 (tune_verify's slice); by layers 2, 3 */
    double lin_rest[5][2], lin_opt[5][2];
};

/* The last few pipeline plans built: the search asks for the same (schedule,
 * p, v, m) for every recompute policy, cp-comm and offload in a row, once to
 * refuse and once to predict (ppsched_build proves each plan: a walk). */
#define TUNE_NPLANS 8
struct TunePlans {
    struct {
        int sched, p, v, m, ok;
        unsigned long used;
        PpPlan pl;
        char err[256];
    } e[TUNE_NPLANS];
    int n;
    unsigned long clock;
};

/* The plan of (s, p, v, m), cached (owned by T->plans: valid until the
 * next TUNE_NPLANS calls), or NULL with ppsched_build's error. */
static const PpPlan *plan_get(Tune *T, PpSchedule s, int p, int v, int m, char *err, size_t errlen) {
    if (!T->plans) T->plans = xcalloc(1, sizeof *T->plans);
    TunePlans *C = T->plans;
    int lru = 0;
    for (int i = 0; i < C->n; i++) {
        if (C->e[i].sched == (int)s && C->e[i].p == p && C->e[i].v == v && C->e[i].m == m) {
            C->e[i].used = ++C->clock;
            if (C->e[i].ok) return &C->e[i].pl;
            snprintf(err, errlen, "%s", C->e[i].err);
            return NULL;
        }
        if (C->e[i].used < C->e[lru].used) lru = i;
    }
    int k = lru;
    if (C->n < TUNE_NPLANS) k = C->n++;
    else if (C->e[k].ok) ppsched_free(&C->e[k].pl);
    memset(&C->e[k], 0, sizeof C->e[k]);
    C->e[k].sched = (int)s, C->e[k].p = p, C->e[k].v = v, C->e[k].m = m, C->e[k].used = ++C->clock;
    C->e[k].ok = ppsched_build(&C->e[k].pl, s, p, v, m, C->e[k].err, sizeof C->e[k].err) == 0;
    if (C->e[k].ok) return &C->e[k].pl;
    snprintf(err, errlen, "%s", C->e[k].err);
    return NULL;
}

static void plans_free(TunePlans *C) {
    for (int i = 0; C && i < C->n; i++)
        if (C->e[i].ok) ppsched_free(&C->e[i].pl);
    free(C);
}

/* Grows a per-rank array to n entries. */
static void rank_mem_reserve(double **a, int *cap, int n) {
    if (n <= *cap) return;
    *a = realloc(*a, sizeof(double) * (size_t)n);
    if (!*a) ICE("out of memory");
    *cap = n;
}

/* ---- building programs ---- */

/* A --set k=v with v written in buf, which must outlive the sets (the
 * caller's, beside its KeyVal array). */
static void add_set(KeyVal **s, int *n, const char *k, long v, char buf[32]) {
    snprintf(buf, 32, "%ld", v);
    cmd_add_set(s, n, k, buf);
}

/* The candidate's program with `layers` layers (0: the model's), a batch
 * of `batch`, m micro-batches and pp stages, through memplan. */
static Module *build(const Tune *T, const TuneCand *c, int layers, int batch, int m, int pp) {
    Options o;
    opt_defaults(&o);
    KeyVal *sets = NULL;
    int n = 0;
    char num[3][32];
    for (int i = 0; i < T->nsets; i++) cmd_add_set(&sets, &n, T->sets[i].key, T->sets[i].value);
    if (layers > 0) add_set(&sets, &n, "layers", layers, num[0]);
    add_set(&sets, &n, "batch", batch, num[1]);
    add_set(&sets, &n, "seq", T->seq, num[2]);
    o.sets = sets, o.nsets = n;
    o.dp = c->dp, o.cp = c->cp, o.tp = c->tp, o.pp = pp;
    o.vpp = pp > 1 ? c->v : 0, o.pp_schedule = pp > 1 ? c->sched : 0, o.micro_batches = m;
    o.recompute = c->rc, o.cp_comm = c->cp_comm, o.offload = pp > 1 && c->offload ? 1.0 : 0;
    o.precision_bf16 = T->bf16, o.device_profile = T->prof.path;
    /* the fixed order: probe_cut reads its shape (micro-batches and layers
     * in sequence), and the --check compares like with like; lhs, compile's
     * default, is kept only where its predicted step is no longer */
    o.schedule = SCHED_FIXED;
    Module *mod = pipeline_front(T->model, &o);
    pipeline_run(mod, PIPE_TRAIN, &o, NULL);
    free(sets);
    return mod;
}

/* ---- the probe ---- */

/* The backward nodes of layer L that layer L-1's backward (or anything
 * outside layer L but the optimizer) needs: B; the rest of L's backward: W. */
static char *b_set(const Graph *g, int L) {
    char *isb = xcalloc((size_t)g->nnodes + 1, 1);
    int *user_b = xcalloc((size_t)g->nvals + 1, sizeof(int));
    for (int i = g->nnodes - 1; i >= 0; i--) {
        const Node *n = &g->nodes[i];
        int bwd = n->phase == PH_BWD || n->phase == PH_RECOMPUTE;
        if (n->layer == L && bwd) {
            int need = 0;
            for (int k = 0; k < n->nout; k++) need |= user_b[n->out[k]];
            isb[i] = (char)need;
        }
        int marks = (n->layer == L && isb[i]) || (n->layer != L && n->phase != PH_OPT && !(ir_ops[n->op].flags & F_SYNC));
        for (int k = 0; k < n->nin && marks; k++) user_b[n->in[k]] = 1;
    }
    free(user_b);
    return isb;
}

static int is_wait(const Node *n) { return n->op == OP_wait || (ir_ops[n->op].flags & F_COMM); }

/* Cut the probe's compute stream into the pieces (see the top).  The probe
 * runs two micro-batches: the second one's nodes (mb 1) are the work of a
 * micro-batch; what the step runs once is the rest less the first one's
 * (as much as the second's). */
static void probe_cut(TuneProbe *P, const Module *m, const CostSim *s) {
    const Graph *g = m->stages[0];
    int L = P->nl - 1;
    char *isb = b_set(g, L);
    int seen_layer_f = 0, seen_layer_b = 0;
    double total = 0, per_mb = 0;
    /* schedule's waits carry their node's layer and phase but micro-batch 0:
     * a wait on compute takes the micro-batch of the work it precedes */
    int *mb_of = xcalloc((size_t)g->nnodes + 1, sizeof(int)), next_mb = 0;
    for (int i = g->nnodes - 1; i >= 0; i--) {
        const Node *n = &g->nodes[i];
        if (n->stream > IR_STREAM_COMPUTE) continue;
        if (n->op != OP_wait) next_mb = n->mb;
        mb_of[i] = n->op == OP_wait ? next_mb : n->mb;
    }
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        if (n->stream > IR_STREAM_COMPUTE) continue;
        double el = s->end[0][i] - s->start[0][i];
        int w = is_wait(n);
        if (!w) total += el;
        if (n->phase == PH_OPT) {
            if (!w && (ir_ops[n->op].flags & F_OPTIMIZER)) P->adamw += el, total -= el;
            continue;
        }
        int fwd = n->phase == PH_FWD, bwd = n->phase == PH_BWD || n->phase == PH_RECOMPUTE || n->phase == PH_WGRAD;
        if (mb_of[i] != 1) continue;
        if (n->layer >= 0) seen_layer_f |= fwd, seen_layer_b |= bwd;
        if (!w) per_mb += el;
        int k = fwd ? KF : (n->layer == L && !isb[i] && n->phase != PH_RECOMPUTE) || n->phase == PH_WGRAD ? KW : KB;
        double *c, *x;
        if (n->layer == L) c = P->lc, x = P->lx;
        else if (n->layer >= 0) continue;
        else if (fwd ? !seen_layer_f : seen_layer_b) c = P->prec, x = P->prex;
        else if (fwd || bwd) c = P->postc, x = P->postx;
        else continue;
        if (w) x[k] += el;
        else c[k] += el;
    }
    P->once = fmax(0, total - 2 * per_mb);
    free(isb), free(mb_of);
}

static void probe_measure(TuneProbe *P, const Module *m) {
    const Graph *g = m->stages[0];
    int L = P->nl - 1;
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        if (n->op == OP_param) {
            double e = (double)ir_numel(&g->vals[n->out[0]].t);
            P->pcount += e;
            if (n->layer == L) P->pcount_layer += e;
        }
        if (((ir_ops[n->op].flags & F_GEMM) || n->op == OP_attention || n->op == OP_attention_bwd) && n->phase != PH_RECOMPUTE) {
            double f = ir_node_flops(g, n);
            if (n->layer == L) P->fl_layer += f / 2;
            else if (n->layer < 0) P->fl_extra += f / 2;
        }
        /* one layer's activation: the largest value layer L's forward reads from layer L-1's */
        if (n->layer == L && n->phase == PH_FWD)
            for (int k = 0; k < n->nin; k++) {
                int d = g->vals[n->in[k]].def;
                if (d >= 0 && g->nodes[d].layer == L - 1 && g->nodes[d].phase == PH_FWD)
                    P->act_bytes = fmax(P->act_bytes, (double)ir_value_bytes(&g->vals[n->in[k]]));
            }
    }
    /* pp.c's layer_costs on the second micro-batch's forward: a node
     * outside the layers is after them when it depends on a layer's value */
    char *after = xcalloc((size_t)g->nvals + 1, 1);
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        int dep = n->layer >= 0;
        for (int k = 0; k < n->nin; k++) dep |= after[n->in[k]];
        for (int k = 0; k < n->nout; k++) after[n->out[k]] = (char)dep;
        if (n->phase != PH_FWD || n->mb != 1) continue;
        double f = ir_node_flops(g, n) + 1;
        if (n->layer == L) P->bal_layer += f;
        else if (n->layer < 0) *(dep ? &P->bal_post : &P->bal_pre) += f;
    }
    free(after);
    P->sp = (double)memplan_stage_peak(g, SPACE_PARAMS), P->sg = (double)memplan_stage_peak(g, SPACE_GRADS);
    P->so = (double)memplan_stage_peak(g, SPACE_OPT);
    P->saved_layer = (double)recompute_saved_bytes(g, L) / 2; /* two micro-batches */
    double all = (double)recompute_saved_bytes(g, INT_MIN) / 2;
    P->saved_extra = fmax(0, all - P->nl * P->saved_layer);
    /* --zero 1 over dp > 1: the gathered f32 params and the f32 gradients
     * live in the activation arena (memplan_report: 4 + 4 bytes a
     * parameter); they scale with the stage's parameters, not the rest.
     * Under --precision bf16 the gathered params are 2 bytes (precision.c),
     * but 8 stays: corrected alone, the term made the fast path's memory
     * of the pp 16 rows of GPT-3 175B lower still against the exact plan
     * (61 vs 79 GiB; docs/decisions.md, session 9) */
    P->pg_act = P->dp > 1 ? 8 * P->pcount : 0;
    P->transient = fmax(0, (double)memplan_stage_peak(g, SPACE_ACT) - all - P->pg_act);
}

static TuneProbe *probe(Tune *T, const TuneCand *c, int b, char *err, size_t errlen) {
    for (int i = 0; i < T->nprobes; i++) {
        TuneProbe *P = &T->probes[i];
        if (P->b == b && P->cp == c->cp && P->cp_comm == c->cp_comm && P->rc == c->rc && P->tp == c->tp && P->dp == (c->dp > 1 ? 2 : 1)) return P;
    }
    if (T->nprobes == T->capprobes) {
        T->capprobes = T->capprobes ? 2 * T->capprobes : 64;
        T->probes = realloc(T->probes, sizeof(TuneProbe) * (size_t)T->capprobes);
        if (!T->probes) ICE("out of memory");
    }
    TuneProbe *P = &T->probes[T->nprobes];
    memset(P, 0, sizeof *P);
    P->b = b, P->cp = c->cp, P->cp_comm = c->cp_comm, P->rc = c->rc, P->tp = c->tp, P->dp = c->dp > 1 ? 2 : 1;
    P->nl = T->layers >= 2 ? 2 : 1;
    double t0 = cmd_now();
    TuneCand one = *c;
    one.dp = P->dp, one.pp = 1, one.offload = 0;
    Module *m = build(T, &one, P->nl, 2 * b * P->dp, 2, 1);
    CostSim s;
    if (cost_simulate(m, &T->prof, NULL, &s, err, errlen) != 0) return ir_free(m), NULL;
    probe_cut(P, m, &s);
    probe_measure(P, m);
    if (P->nl == 2) { /* memory_no_pp's point at 2 layers and 2 micro-batches is this very program (probe_memory) */
        const Graph *g = m->stages[0];
        P->lin_opt[2][0] = (double)memplan_stage_peak(g, SPACE_OPT);
        P->lin_rest[2][0] = (double)(memplan_stage_peak(g, SPACE_PARAMS) + memplan_stage_peak(g, SPACE_GRADS) + memplan_stage_peak(g, SPACE_ACT));
        P->lin_done[2][0] = 1;
    }
    cost_sim_free(&s);
    ir_free(m);
    P->transient1 = -1;
    T->probe_seconds += cmd_now() - t0;
    T->nprobes++;
    return P;
}

/* The probe's memory at nl layers (m micro-batches, pp 1): all but the
 * optimizer state into *rest, that into *opt. */
static void probe_memory(Tune *T, const TuneProbe *P, const TuneCand *c, int nl, int m, double *rest, double *opt) {
    double t0 = cmd_now();
    TuneCand one = *c;
    one.dp = P->dp, one.pp = 1, one.offload = 0;
    Module *mod = build(T, &one, nl, m * P->b * P->dp, m, 1);
    const Graph *g = mod->stages[0];
    *opt = (double)memplan_stage_peak(g, SPACE_OPT);
    *rest = (double)(memplan_stage_peak(g, SPACE_PARAMS) + memplan_stage_peak(g, SPACE_GRADS) + memplan_stage_peak(g, SPACE_ACT));
    ir_free(mod);
    T->probe_seconds += cmd_now() - t0;
}

/* Without a pipeline the rank's memory is the probe's, extended from 2 to
 * L layers along the line through the probe's memory at 2 and 3 layers
 * (whatever sets its peak: the forward's gathered parameters, the
 * backward's gradients), the optimizer state over the candidate's dp·cp. */
static double memory_no_pp(Tune *T, TuneProbe *P, const TuneCand *c) {
    int k = c->m < 4 ? c->m : 4, L = T->layers; /* m up to 4: measured at min(m, 4) micro-batches */
    if (P->nl < 2) return -1;
    for (int i = 0; i < 2; i++)
        if (!P->lin_done[k][i]) probe_memory(T, P, c, 2 + i, k, &P->lin_rest[k][i], &P->lin_opt[k][i]), P->lin_done[k][i] = 1;
    double rest = P->lin_rest[k][0] + (L - 2) * (P->lin_rest[k][1] - P->lin_rest[k][0]);
    double opt = P->lin_opt[k][0] + (L - 2) * (P->lin_opt[k][1] - P->lin_opt[k][0]);
    return rest + opt * P->dp * P->cp / (c->dp * c->cp);
}

/* The transient activation bytes at one micro-batch (candidates with m 1):
 * the probe compiled again with one micro-batch, for its memory only. */
static double transient_one(Tune *T, TuneProbe *P, const TuneCand *c) {
    if (P->transient1 >= 0) return P->transient1;
    double t0 = cmd_now();
    TuneCand one = *c;
    one.dp = P->dp, one.pp = 1, one.offload = 0;
    Module *m = build(T, &one, P->nl, P->b * P->dp, 1, 1);
    const Graph *g = m->stages[0];
    double all = (double)recompute_saved_bytes(g, INT_MIN);
    P->transient1 = fmax(0, (double)memplan_stage_peak(g, SPACE_ACT) - all - P->pg_act);
    ir_free(m);
    T->probe_seconds += cmd_now() - t0;
    return P->transient1;
}

/* ---- composing ---- */

/* Layers per chunk as pp.c cuts them (ppsched_balance: the contiguous cut
 * minimising the largest chunk's forward FLOPs, the embedding's on chunk
 * 0 and the head's on the last), so the ranks' layer counts are the
 * program's; f a layer's FLOPs. */
static void cut_layers(int L, int K, double f, double pre, double post, int *n) {
    double *cost = xcalloc((size_t)L + 1, sizeof(double));
    int *first = xcalloc((size_t)K + 1, sizeof(int));
    for (int i = 0; i < L; i++) cost[i] = f;
    ppsched_balance(cost, L, K, pre, post, first);
    for (int k = 0; k < K; k++) n[k] = (k + 1 < K ? first[k + 1] : L) - first[k];
    free(cost), free(first);
}

static int intra(const Tune *T, int span) { return span <= T->prof.node_size; }

typedef struct {
    PpPlan pl;
    int nch, *nl;                 /* layers per chunk */
    double *cost[3], *comp[3];    /* per chunk and micro-batch: all, compute only */
    double *saved;                /* per chunk: saved bytes per micro-batch */
} Comp;

static void comp_free(Comp *C) {
    for (int k = 0; k < 3; k++) free(C->cost[k]), free(C->comp[k]);
    free(C->nl), free(C->saved); /* C->pl is T->plans' */
}

/* Chunk costs of c from probe P (zero-bubble schedules keep W apart). */
static void chunk_costs(Comp *C, const TuneCand *c, const TuneProbe *P, int L) {
    int zb = c->pp > 1 && (c->sched == PS_ZBH1 || c->sched == PS_ZBV), nch = C->nch;
    C->nl = xcalloc((size_t)nch, sizeof(int));
    C->saved = xcalloc((size_t)nch, sizeof(double));
    for (int k = 0; k < 3; k++) C->cost[k] = xcalloc((size_t)nch, sizeof(double)), C->comp[k] = xcalloc((size_t)nch, sizeof(double));
    /* pp.c weighs the whole step's forward: every micro-batch's */
    cut_layers(L, nch, c->m * P->bal_layer, c->m * P->bal_pre, c->m * P->bal_post, C->nl);
    for (int ch = 0; ch < nch; ch++) {
        for (int k = 0; k < 3; k++) {
            int kk = k == KW && !zb ? KB : k;
            double lc = P->lc[k] * C->nl[ch], lx = P->lx[k] * C->nl[ch];
            if (ch == 0) lc += P->prec[k], lx += P->prex[k];
            if (ch == nch - 1) lc += P->postc[k], lx += P->postx[k];
            C->cost[kk][ch] += lc + lx, C->comp[kk][ch] += lc;
        }
        C->saved[ch] = P->saved_layer * C->nl[ch] + (ch == nch - 1 ? P->saved_extra : 0);
    }
}

/* Offload all: each (chunk, micro-batch)'s copies beyond what its
 * forward-to-backward compute hides wait before its backward. */
static double offload_exposed(const Tune *T, const Comp *C, int ch, int inflight) {
    double s = C->saved[ch], t = (s / T->prof.d2h_bw + s / T->prof.h2d_bw) / 2;
    double hide = (inflight > 1 ? inflight - 1 : 0) * (C->cost[KF][ch] + C->cost[KB][ch]);
    return t > hide ? t - hide : 0;
}

/* The most saved bytes rank r holds at once: its actions in order, an F
 * adding its chunk's saved bytes, the action that ends the pair (B; W for
 * the zero-bubble schedules, whose dW still reads them) freeing them. */
static double saved_peak(const Comp *C, int r) {
    int zb = C->pl.kind == PS_ZBH1 || C->pl.kind == PS_ZBV;
    double cur = 0, peak = 0;
    for (int i = 0; i < C->pl.nact[r]; i++) {
        Action a = C->pl.act[r][i];
        if (a.kind == ACT_F) cur += C->saved[a.chunk];
        else if (a.kind == (zb ? ACT_W : ACT_B)) cur -= C->saved[a.chunk];
        peak = fmax(peak, cur);
    }
    return peak;
}

/* Rank r's parameters (elements): its layers', the embedding's on the
 * first stage, the head's on the last (a tied one on both); its layer
 * count and whether it holds the first and the last chunk. */
static double rank_params(const Tune *T, const TuneProbe *P, const TuneCand *c, const Comp *C, int r, int *nr, int *first, int *last) {
    *nr = 0, *first = 0, *last = 0;
    for (int v = 0; v < C->pl.v; v++) {
        int ch = pp_chunk(&C->pl, r, v);
        *nr += C->nl[ch], *first |= ch == 0, *last |= ch == C->nch - 1;
    }
    double shrink = 1 - 1.0 / c->tp;
    if (c->pp == 1) return P->pcount - P->nl * P->pcount_layer + *nr * P->pcount_layer;
    return *nr * P->pcount_layer + (*first ? T->p_pre - shrink * T->p_pre_tp : 0) + (*last ? T->p_post - shrink * T->p_post_tp : 0);
}

/* Rank r's memory (bytes): see the top (memory). */
static double rank_memory(Tune *T, TuneProbe *P, const TuneCand *c, const Comp *C, int r) {
    int nr, first, last, p = c->pp, g = c->dp * c->cp;
    double act = 0, ratio = rank_params(T, P, c, C, r, &nr, &first, &last) / P->pcount;
    for (int v = 0; v < C->pl.v; v++) act += C->saved[pp_chunk(&C->pl, r, v)] / C->pl.v; /* the in-flight pairs spread over the rank's chunks */
    double keep = p == 1 ? C->saved[0] : saved_peak(C, r);
    if (c->offload && p > 1 && r < p - 1) keep = fmin(keep, 2 * act); /* the pair computing and the one reloading */
    double m_r;
    if (p == 1 && !c->offload && (m_r = memory_no_pp(T, P, c)) >= 0) return m_r; /* measured at 2 and 3 layers, extended (exact where memory is linear in layers) */
    double tr = c->m == 1 ? transient_one(T, P, c) : P->transient;
    return (P->sp + P->sg + P->pg_act) * ratio + P->so * P->dp * P->cp * ratio / g + tr + keep;
}

double tune_lower_bound(const Tune *T, const TuneCand *c) {
    const TuneProbe *G = NULL;
    for (int i = 0; i < T->nprobes && !G; i++) {
        const TuneProbe *P = &T->probes[i];
        if (P->tp == c->tp && P->cp == c->cp && P->dp == (c->dp > 1 ? 2 : 1)) G = P;
    }
    if (!G || G->pcount <= 0) return -1;
    /* the ranks' parameters add up to the model's (rank_params over r) */
    double shrink = 1 - 1.0 / c->tp, L = T->layers, total;
    if (c->pp == 1) total = G->pcount - G->nl * G->pcount_layer + L * G->pcount_layer;
    else total = L * G->pcount_layer + T->p_pre - shrink * T->p_pre_tp + T->p_post - shrink * T->p_post_tp;
    double per = (G->sp + G->sg + G->pg_act + G->so * G->dp * c->cp / (c->dp * c->cp)) / G->pcount;
    return per * total / c->pp;
}

static int predict(Tune *T, const TuneCand *c, TunePred *out, int prune, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    int b = T->batch / (c->dp * c->m), L = T->layers;
    TuneProbe *P = probe(T, c, b, err, errlen);
    if (!P) return -1;
    Comp C;
    memset(&C, 0, sizeof C);
    PpSchedule sched = c->pp > 1 ? (PpSchedule)c->sched : PS_1F1B;
    const PpPlan *pl = plan_get(T, sched, c->pp, c->pp > 1 ? c->v : 1, c->pp > 1 ? c->m : c->pp, err, errlen);
    if (!pl) return -1;
    C.pl = *pl; /* T->plans' */
    C.nch = c->pp * C.pl.v;
    chunk_costs(&C, c, P, L);
    int p = c->pp, g = c->dp * c->cp, inner = c->dp * c->cp * c->tp;
    /* the memory first: a candidate over the budget needs no step (prune) */
    double mem = 0;
    rank_mem_reserve(&T->fast_mem, &T->fast_cap, p);
    T->fast_n = p;
    for (int r = 0; r < p; r++) mem = fmax(mem, T->fast_mem[r] = rank_memory(T, P, c, &C, r));
    out->mem = mem;
    if (prune && mem > T->memory) {
        out->step = INFINITY;
        comp_free(&C);
        return 0;
    }
    if (c->offload && p > 1) /* copies the compute does not hide wait before the backward */
        for (int ch = 0; ch < C.nch; ch++) {
            int r = pp_chunk_rank(&C.pl, ch);
            if (r == p - 1 && ch == C.nch - 1) continue; /* the last chunk stays (offload.c) */
            C.cost[KB][ch] += offload_exposed(T, &C, ch, ppsched_inflight_bound(&C.pl, r));
        }
    double *end = xcalloc((size_t)p, sizeof(double)), *busy = xcalloc((size_t)p, sizeof(double)), *compute = xcalloc((size_t)p, sizeof(double));
    if (p > 1) {
        double lat = profile_coll_seconds(&T->prof, COLL_P2P, P->act_bytes, 2, intra(T, 2 * inner));
        const double *const cost[3] = {C.cost[0], C.cost[1], C.cost[2]};
        PpTimes t;
        if (ppsched_simulate(&C.pl, cost, lat, &t) != 0) return snprintf(err, errlen, "ppsched_simulate failed"), comp_free(&C), -1;
        for (int r = 0; r < p; r++)
            for (int i = t.off[r]; i < t.off[r + 1]; i++) end[r] = fmax(end[r], t.end[i]);
        ppsched_times_free(&t);
    }
    for (int ch = 0; ch < C.nch; ch++) {
        int r = pp_chunk_rank(&C.pl, ch);
        for (int k = 0; k < 3; k++) busy[r] += c->m * C.cost[k][ch], compute[r] += c->m * C.comp[k][ch];
    }
    if (p == 1) end[0] = busy[0];
    double worst = 0, flops = 0, h0 = 0, t0 = 0, oc0 = 0, cb0 = 0;
    for (int r = 0; r < p; r++) {
        double f1 = 0, bl = 0;
        int nr, first, last;
        double pc = rank_params(T, P, c, &C, r, &nr, &first, &last);
        for (int v = 0; v < C.pl.v; v++) {
            int ch = pp_chunk(&C.pl, r, v);
            f1 += C.cost[KF][ch], bl += C.cost[KB][ch] + C.cost[KW][ch];
        }
        double ratio = pc / P->pcount;
        flops += c->m * (nr * P->fl_layer + (first ? P->fl_extra / 2 : 0) + (last ? P->fl_extra / 2 : 0));
        /* data parallel over dp·cp: gradients out, parameters in */
        double gbytes = P->sg * ratio, pbytes = P->sp * ratio, ag = 0, rs = 0;
        if (g > 1) {
            rs = profile_coll_seconds(&T->prof, COLL_REDUCE_SCATTER, gbytes, g, intra(T, inner));
            ag = profile_coll_seconds(&T->prof, COLL_ALL_GATHER, pbytes, g, intra(T, inner));
        }
        double bucket = fmin(1, 25.0 * (1 << 20) / fmax(gbytes, 1));
        double head = fmax(ag * bucket, ag - f1), tail_x = fmax(rs * bucket, rs - bl);
        double optc = P->adamw * ratio * P->dp * P->cp / g + P->once * ratio;
        /* offload all: the rank's copy streams move every offloaded pair's
         * saved bytes out and back each step, one copy after another on
         * each; a rank whose copies outlast its timeline waits for them
         * (copy-bound: the pairs' own exposure above cannot see it) */
        double off_b = 0;
        if (c->offload && p > 1)
            for (int v = 0; v < C.pl.v; v++) {
                int ch = pp_chunk(&C.pl, r, v);
                if (ch != C.nch - 1) off_b += c->m * C.saved[ch]; /* the last chunk stays (offload.c) */
            }
        double copy_bound = fmax(0, fmax(off_b / T->prof.d2h_bw, off_b / T->prof.h2d_bw) - end[r]);
        double total = head + end[r] + copy_bound + tail_x + optc;
        worst = fmax(worst, total);
        if (r == 0) cb0 = copy_bound, h0 = head, t0 = tail_x, oc0 = optc;
    }
    out->step = worst;
    out->compute = compute[0] + oc0;
    out->comm = (busy[0] - compute[0]) + h0 + t0;
    out->copy = 0;
    if (c->offload && p > 1)
        for (int v = 0; v < C.pl.v; v++) {
            int ch = pp_chunk(&C.pl, 0, v);
            out->copy += c->m * offload_exposed(T, &C, ch, ppsched_inflight_bound(&C.pl, 0));
        }
    out->comm -= out->copy;
    out->copy += cb0;
    out->bubble = fmax(0, out->step - out->compute - out->comm - out->copy);
    out->tokens_s = (double)T->batch * T->seq / out->step;
    double peak = T->bf16 ? T->prof.peak_flops_bf16 : T->prof.peak_flops_f32;
    out->mfu = flops / (p * out->step * peak);
    free(end), free(busy), free(compute);
    comp_free(&C);
    return 0;
}

int tune_predict(Tune *T, const TuneCand *c, TunePred *out, char *err, size_t errlen) { return predict(T, c, out, 0, err, errlen); }

int tune_predict_fit(Tune *T, const TuneCand *c, TunePred *out, char *err, size_t errlen) { return predict(T, c, out, 1, err, errlen); }

/* The whole program of c at m micro-batches (a global batch of dp·b·m)
 * compiled and simulated; each rank's memplan peak into T->full_mem. */
static int full_at(Tune *T, const TuneCand *c, int m, int batch, TunePred *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    TuneCand cm = *c;
    cm.m = m;
    Module *mod = build(T, &cm, 0, batch, m, c->pp);
    CostSim s;
    if (cost_simulate(mod, &T->prof, NULL, &s, err, errlen) != 0) return ir_free(mod), -1;
    const CostRank *r0 = &s.rank[0];
    out->step = s.step, out->compute = r0->compute, out->comm = r0->comm, out->bubble = r0->bubble, out->copy = r0->copy;
    rank_mem_reserve(&T->full_mem, &T->full_cap, s.nstages);
    T->full_n = s.nstages;
    for (int st = 0; st < s.nstages; st++) {
        T->full_mem[st] = (double)s.rank[st].peak;
        out->mem = fmax(out->mem, T->full_mem[st]);
    }
    out->tokens_s = (double)batch * T->seq / s.step;
    out->mfu = s.mfu;
    cost_sim_free(&s);
    ir_free(mod);
    return 0;
}

int tune_full(Tune *T, const TuneCand *c, TunePred *out, char *err, size_t errlen) {
    return full_at(T, c, c->m, T->batch, out, err, errlen);
}

/* ---- verifying on a slice ---- */

/* Rank r's most (chunk, micro-batch) pairs in flight at once — F run, its
 * last backward action (B; W for the zero-bubble schedules) not — in all
 * (*tot) and per local chunk (per[v]). */
static void inflight_peaks(const PpPlan *pl, int r, int *tot, int *per) {
    int zb = pl->kind == PS_ZBH1 || pl->kind == PS_ZBV, cur = 0, *cv = xcalloc((size_t)pl->v, sizeof(int));
    *tot = 0;
    for (int v = 0; v < pl->v; v++) per[v] = 0;
    for (int i = 0; i < pl->nact[r]; i++) {
        Action a = pl->act[r][i];
        int v = pp_chunk_vstage(pl, a.chunk), d = a.kind == ACT_F ? 1 : a.kind == (zb ? ACT_W : ACT_B) ? -1 : 0;
        cur += d, cv[v] += d;
        *tot = cur > *tot ? cur : *tot;
        per[v] = cv[v] > per[v] ? cv[v] : per[v];
    }
    free(cv);
}

/* 1 when plans a and b hold the same pairs in flight at their most on
 * every rank, in all and per chunk. */
static int same_inflight(const PpPlan *a, const PpPlan *b) {
    int *pa = xcalloc((size_t)a->v, sizeof(int)), *pb = xcalloc((size_t)a->v, sizeof(int)), same = 1;
    for (int r = 0; r < a->p && same; r++) {
        int ta, tb;
        inflight_peaks(a, r, &ta, pa), inflight_peaks(b, r, &tb, pb);
        same = ta == tb && memcmp(pa, pb, sizeof(int) * (size_t)a->v) == 0;
    }
    free(pa), free(pb);
    return same;
}

/* The slice's micro-batches: the fewest m' <= m that the schedule accepts
 * past the first count at which every rank holds as many pairs in flight
 * at its most as at m (so the same saved activations at once), and at
 * least 2p and 16: the peak grows with m past that (measured on a GPT of
 * 8 layers, dim 512: 1f1b's rank 0 at p 4 1239, 1391, 1450, 1518, 1518
 * MiB at m 4, 5, 6, 8, 12; zb-v's at p 2 1083, 1281, 1316, 1338, 1348,
 * 1348 at m 4, 6, 8, 12, 16, 24); without a pipeline
 * 4 (measured: a dp 4 GPT's peak at m 2 is 17% under its peak at m 4,
 * which m 8 equals).  With offload, the whole program (m' = m): the
 * copies' queue grows with m, and what offload frees depends on it
 * (offload.c drops a copy whose reload must start before its release and
 * a rank's copies that free under 1%), so a slice can show offload freeing
 * memory that the whole program's copies cannot (a GPT of 8 layers, dim
 * 512, zb-v p 4, m 32, offload all: 1.73 GiB at m' 16, 1.95 GiB whole,
 * the peak without offload). */
static int slice_m(const TuneCand *c) {
    if (c->offload) return c->m;
    if (c->pp == 1) return c->m < 4 ? c->m : 4;
    PpPlan full;
    char err[256];
    if (ppsched_build(&full, (PpSchedule)c->sched, c->pp, c->v, c->m, err, sizeof err) != 0) return c->m;
    int ms = c->m, sat = 0;
    for (int m = c->pp; m < c->m; m++) {
        PpPlan pl;
        if (ppsched_build(&pl, (PpSchedule)c->sched, c->pp, c->v, m, err, sizeof err) != 0) continue;
        int same = same_inflight(&pl, &full);
        ppsched_free(&pl);
        if (sat && same && m >= 2 * c->pp && m >= 16) {
            ms = m;
            break;
        }
        sat |= same;
    }
    ppsched_free(&full);
    return ms;
}

int tune_verify(Tune *T, const TuneCand *c, const TunePred *fast, TuneVerify *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    double t0 = cmd_now();
    int b = T->batch / (c->dp * c->m), ms = slice_m(c), batch = c->dp * b * ms;
    TuneCand s = *c;
    s.m = ms;
    Module *mod = build(T, &s, 0, batch, ms, c->pp);
    rank_mem_reserve(&T->full_mem, &T->full_cap, mod->nstages);
    T->full_n = mod->nstages;
    for (int r = 0; r < mod->nstages; r++) { /* cost.c's CostRank.peak: memplan's four spaces */
        const Graph *g = mod->stages[r];
        T->full_mem[r] = (double)(memplan_stage_peak(g, SPACE_PARAMS) + memplan_stage_peak(g, SPACE_GRADS) +
                                  memplan_stage_peak(g, SPACE_OPT) + memplan_stage_peak(g, SPACE_ACT));
        if (T->full_mem[r] > out->mem) out->mem = T->full_mem[r], out->rank = r;
    }
    out->m = ms;
    if (out->mem > T->memory / (1 + TUNE_VERIFY_MARGIN)) { /* over: no step needed */
        ir_free(mod);
        out->seconds = cmd_now() - t0;
        return 0;
    }
    CostSim sim;
    if (cost_simulate(mod, &T->prof, NULL, &sim, err, errlen) != 0) return ir_free(mod), -1;
    out->full_slice = sim.step;
    cost_sim_free(&sim);
    ir_free(mod);
    TunePred fs = *fast;
    if (ms != c->m) { /* the fast path at the slice's micro-batches: its batch is dp·b·m' */
        int keep = T->batch;
        T->batch = batch;
        int rc = tune_predict(T, &s, &fs, err, errlen);
        T->batch = keep;
        if (rc != 0) return -1;
    }
    out->fast_slice = fs.step;
    /* the fast path's error at m' carried to m as a constant (the whole
     * program's: its bubble and the pipeline's exposed waits, which do
     * not grow with m) */
    out->step = ms == c->m ? out->full_slice : fast->step + (out->full_slice - fs.step);
    out->seconds = cmd_now() - t0;
    return 0;
}

/* ---- the model's shape, refusals, flags ---- */

void tune_init(Tune *T, const char *model, KeyVal *sets, int nsets, const Profile *p, int gpus, double memory, int batch, int seq,
               int bf16) {
    memset(T, 0, sizeof *T);
    T->model = model, T->sets = sets, T->nsets = nsets, T->prof = *p, T->gpus = gpus, T->memory = memory, T->bf16 = bf16;
    Options o;
    opt_defaults(&o);
    KeyVal *s = NULL;
    int n = 0;
    char num[2][32];
    for (int i = 0; i < nsets; i++) cmd_add_set(&s, &n, sets[i].key, sets[i].value);
    if (batch > 0) add_set(&s, &n, "batch", batch, num[0]);
    if (seq > 0) add_set(&s, &n, "seq", seq, num[1]);
    o.sets = s, o.nsets = n;
    Module *m = pipeline_front(model, &o);
    const Graph *g = m->stages[0];
    for (int i = 0; i < g->nnodes; i++) {
        const Node *nd = &g->nodes[i];
        if (nd->layer + 1 > T->layers) T->layers = nd->layer + 1;
        if (nd->op == OP_input && strcmp(ir_attr_s(nd, "name", ""), "tokens") == 0) {
            T->batch = (int)g->vals[nd->out[0]].t.dim[0];
            T->seq = (int)g->vals[nd->out[0]].t.dim[1];
        }
        if (nd->op == OP_attention && !T->heads) T->heads = (int)g->vals[nd->in[0]].t.dim[1], T->kv_heads = (int)g->vals[nd->in[1]].t.dim[1];
    }
    /* the parameters outside the layers: read before the first layer's node, after the last's, or both */
    int lo = g->nnodes, hi = -1;
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i].layer >= 0) lo = i < lo ? i : lo, hi = i;
    for (int i = 0; i < g->nnodes; i++) {
        const Node *nd = &g->nodes[i];
        if (nd->op != OP_param || nd->layer >= 0) continue;
        int pre = 0, post = 0;
        for (int j = 0; j < g->nnodes; j++)
            for (int k = 0; k < g->nodes[j].nin; k++)
                if (g->nodes[j].in[k] == nd->out[0]) pre |= j < lo, post |= j > hi;
        double e = (double)ir_numel(&g->vals[nd->out[0]].t);
        int split = ir_attr(nd, "tp") != NULL; /* split over tp (the vocab-parallel embedding): 1/tp of it a rank */
        if (pre || !post) T->p_pre += e, T->p_pre_tp += split ? e : 0;
        if (post) T->p_post += e, T->p_post_tp += split ? e : 0;
    }
    ir_free(m);
    free(s);
    if (!T->batch) die("tune: %s has no input \"tokens\" [batch, seq]", model);
    if (!T->layers) die("tune: %s has no layer(i, ...) blocks to place on pipeline stages", model);
}

void tune_free(Tune *T) { free(T->probes), free(T->fast_mem), free(T->full_mem), plans_free(T->plans); }

void tune_refusal(Tune *T, const TuneCand *c, char *why, size_t n) {
    why[0] = 0;
    if (c->tp > 1 && (T->heads % c->tp || T->kv_heads % c->tp)) {
        snprintf(why, n, "tp %d: heads %d and kv heads %d must be multiples of tp (tp.c)", c->tp, T->heads, T->kv_heads);
        return;
    }
    if (c->tp > 1 && c->tp > T->prof.node_size) {
        snprintf(why, n, "tp %d: over the node's %d devices (tp's all-reduces stay on the intra-node link)", c->tp, T->prof.node_size);
        return;
    }
    if (c->tp * c->cp * c->dp * c->pp != T->gpus) snprintf(why, n, "tp x cp x dp x pp = %d, not %d", c->tp * c->cp * c->dp * c->pp, T->gpus);
    else if (T->batch % c->dp || (T->batch / c->dp) % c->m) snprintf(why, n, "batch %d is not a multiple of dp %d x micro-batches %d", T->batch, c->dp, c->m);
    else if (c->cp > 1 && T->seq % (2 * c->cp)) snprintf(why, n, "seq %d is not a multiple of 2 x cp %d", T->seq, c->cp);
    else if (c->pp * (c->pp > 1 ? c->v : 1) > T->layers) snprintf(why, n, "%d chunks, %d layers", c->pp * c->v, T->layers);
    else if (c->pp == 1 && c->offload) snprintf(why, n, "offload is searched with a pipeline only");
    else if (c->pp > 1) {
        char err[256];
        if (!plan_get(T, (PpSchedule)c->sched, c->pp, c->v, c->m, err, sizeof err)) snprintf(why, n, "%s", err);
    }
}

const char *tune_flags(const Tune *T, const TuneCand *c, char *buf, size_t n) {
    size_t k = (size_t)snprintf(buf, n, "--set batch=%d --set seq=%d", T->batch, T->seq);
    for (int i = 0; i < T->nsets && k < n; i++)
        if (strcmp(T->sets[i].key, "batch") && strcmp(T->sets[i].key, "seq"))
            k += (size_t)snprintf(buf + k, n - k, " --set %s=%s", T->sets[i].key, T->sets[i].value);
    if (c->tp > 1 && k < n) k += (size_t)snprintf(buf + k, n - k, " --tp %d", c->tp);
    if (c->dp > 1 && k < n) k += (size_t)snprintf(buf + k, n - k, " --dp %d", c->dp);
    if (c->cp > 1 && k < n) k += (size_t)snprintf(buf + k, n - k, " --cp %d --cp-comm %s", c->cp, c->cp_comm ? "p2p" : "allgather");
    if (c->pp > 1 && k < n) {
        k += (size_t)snprintf(buf + k, n - k, " --pp %d --pp-schedule %s", c->pp, pp_schedule_names[c->sched]);
        if (c->sched == PS_INTERLEAVED && k < n) k += (size_t)snprintf(buf + k, n - k, " --vpp %d", c->v);
    }
    if (c->m > 1 && k < n) k += (size_t)snprintf(buf + k, n - k, " --micro-batches %d", c->m);
    if (k < n) k += (size_t)snprintf(buf + k, n - k, " --recompute %s", ir_recompute_names[c->rc]);
    if (c->offload && k < n) snprintf(buf + k, n - k, " --offload all");
    return buf;
}
