/* plan.c — `kiln plan`: memory per rank before anything runs.
 *
 *   kiln plan MODEL [--dp N --cp N --micro-batches M --zero 0|1 --recompute P --memory-budget B ...]
 *       memplan's report of the compiled step (params, grads, optimizer
 *       state, activations, per memory space and rank), the bytes saved from
 *       forward for backward under the recompute policy, and with --cp N the
 *       activation peak against the same program at cp 1.
 *
 *   kiln plan MODEL --recompute all
 *       Every policy (none, selective, gemm-last, full) compiled in turn and
 *       set side by side: saved bytes per layer and in all, the activation
 *       peak and the extra FLOPs, next to Korthikanti et al. 2022's bytes
 *       per layer (docs/recompute.md).  selective never saves more than
 *       none (recompute.c takes an attention only where that saves bytes).
 *
 *   kiln plan MODEL --device-profile P
 *       after the report, the cost model's prediction (cost.c, docs/tune.md):
 *       the step, MFU, per stage compute / exposed comm / bubble / exposed
 *       copies and memory, and stage 0's compute time by op.
 *
 *   kiln plan MODEL --pp N [--vpp V --pp-schedule S --micro-batches M]
 *       after the memory report, the pipeline section (plan_pp.c): per
 *       stage memory and in-flight bound, the bubble from the ops' costs
 *       beside the closed form, bytes sent over pp; --timeline FILE.svg
 *       draws the schedule; --pp-schedule all: a row per schedule.
 *
 *   kiln plan MODEL --offload ... / --max-seq --memory GiB
 *       plan_offload.c: the offload table per rank and virtual stage; the
 *       longest sequence that fits per policy.
 */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "cmd.h"
#include "cost.h"
#include "memplan.h"
#include "passes.h"
#include "ppsched.h"

/* ---- kiln plan: the recompute table ---- */

typedef struct {
    int64_t saved, saved_layers, peak;
    double flops, extra;
    int layers;
} RcStats;

static RcStats rc_stats(const Module *m) {
    const Graph *g = m->stages[0];
    RcStats r = {recompute_saved_bytes(g, INT_MIN), 0, memplan_fwd_bwd_peak(m), 0, 0, 0};
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        double f = ir_node_flops(g, n);
        r.flops += f;
        if (n->phase == PH_RECOMPUTE) r.extra += f;
        if (n->layer + 1 > r.layers) r.layers = n->layer + 1;
    }
    for (int L = 0; L < r.layers; L++) r.saved_layers += recompute_saved_bytes(g, L);
    return r;
}

/* s, b, h, a of one rank's step from its first forward attention: its
 * sequence piece, its batch over all micro-batches (what it saves) */
static int attention_shape(const Module *m, int micro_batches, double *s, double *b, double *h, double *heads) {
    const Graph *g = m->stages[0];
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        if (n->op != OP_attention || n->phase != PH_FWD) continue;
        const Type *q = &g->vals[n->in[0]].t;
        *b = (double)q->dim[0] * micro_batches, *heads = (double)q->dim[1], *s = (double)q->dim[2];
        *h = (double)(q->dim[1] * q->dim[3]);
        return 1;
    }
    return 0;
}

/* kiln plan --recompute all: every policy side by side, per rank, next to
 * Korthikanti et al. 2022's bytes per layer (16-bit activations, with
 * dropout; ours are f32, flash attention, no dropout: docs/recompute.md) */
static void plan_recompute_table(Args *a) {
    static const Recompute pol[] = {RC_NONE, RC_SELECTIVE, RC_GEMM_LAST, RC_FULL};
    RcStats st[4];
    double s = 0, b = 0, h = 0, heads = 0;
    for (int k = 0; k < 4; k++) {
        Args one = *a;
        one.o.recompute = pol[k];
        one.o.memory_budget = one.o.activation_budget = 0;
        Module *m = compile(&one);
        st[k] = rc_stats(m);
        if (k == 0 && !attention_shape(m, a->o.micro_batches, &s, &b, &h, &heads)) die("plan --recompute all: the model has no attention");
        ir_free(m);
    }
    double sbh = s * b * h, L = st[0].layers ? st[0].layers : 1;
    printf("recompute policies (per rank; s %.0f, b %.0f, h %.0f, a %.0f, %d layers; f32 activations):\n", s, b, h, heads, st[0].layers);
    printf("  %-10s %14s %9s %9s %14s %14s %9s %10s\n", "policy", "saved/layer", "x s.b.h", "vs none", "saved total", "act. peak",
           "vs none", "+FLOPs");
    for (int k = 0; k < 4; k++) {
        double per = (double)st[k].saved_layers / L;
        printf("  %-10s %10.2f MiB %9.2f %8.1f%% %10.2f MiB %10.2f MiB %8.1f%% %9.2f%%\n", ir_recompute_names[pol[k]],
               per / (1 << 20), per / (4 * sbh), 100.0 * (per / ((double)st[0].saved_layers / L) - 1),
               (double)st[k].saved / (1 << 20), (double)st[k].peak / (1 << 20), 100.0 * ((double)st[k].peak / (double)st[0].peak - 1),
               100.0 * st[k].extra / st[k].flops);
    }
    if (st[1].extra == 0)
        printf("  selective recomputes no attention here, as no clone saves bytes (--cp all-gather: a clone would keep the "
               "gathered K, V; --cp p2p: backward reads the merged outputs), so it saves what none saves\n");
    printf("  Korthikanti et al. 2022, bytes per layer at 2 bytes per value: none 34sbh+5as^2b = %.2f MiB (%.1f sbh), "
           "selective 34sbh = %.2f MiB, full 2sbh = %.2f MiB\n",
           (34 * sbh + 5 * heads * s * s * b) / (1 << 20), 34 + 5 * heads * s / h, 34 * sbh / (1 << 20), 2 * sbh / (1 << 20));
    printf("  ours at 2 bytes per value: none %.1f sbh, selective %.1f sbh, gemm-last %.1f sbh, full %.1f sbh "
           "(x s.b.h above counts f32 values: bytes / 4sbh)\n",
           2 * (double)st[0].saved_layers / L / (4 * sbh), 2 * (double)st[1].saved_layers / L / (4 * sbh),
           2 * (double)st[2].saved_layers / L / (4 * sbh), 2 * (double)st[3].saved_layers / L / (4 * sbh));
}

/* ---- kiln plan ---- */

/* The cost model's prediction (cost.h) on --device-profile (none given:
 * no prediction; the report stays the memory plan's). */
static void plan_cost_report(const Args *a, const Module *m) {
    Profile p;
    CostSim s, o;
    char err[1200];
    if (!a->o.device_profile) return;
    if (profile_load(&p, a->o.device_profile, err, sizeof err) != 0) die("--device-profile: %s", err);
    if (cost_simulate(m, &p, NULL, &s, err, sizeof err) != 0) die("plan: cost model: %s", err);
    cost_report(m, &p, &s, stdout);
    /* the same program under the other --schedule (docs/schedule.md): both
     * orders' exposed time by class, per rank, side by side */
    Args other = *a;
    other.o.schedule = a->o.schedule == SCHED_LHS ? SCHED_FIXED : SCHED_LHS;
    other.comparison = 1;
    Module *m2 = compile(&other);
    if (cost_simulate(m2, &p, NULL, &o, err, sizeof err) != 0) die("plan: cost model: %s", err);
    const CostSim *by[2] = {a->o.schedule == SCHED_LHS ? &o : &s, a->o.schedule == SCHED_LHS ? &s : &o};
    printf("  exposed ms by class, --schedule fixed against lhs:\n  %5s %6s", "stage", "order");
    for (int c = 0; c < COST_NCLASS; c++) printf(" %9s", cost_class_names[c]);
    printf(" %9s %9s\n", "total", "step");
    for (int st = 0; st < s.nstages; st++)
        for (int k = 0; k < 2; k++) {
            double t = 0;
            printf("  %5d %6s", st, k ? "lhs" : "fixed");
            for (int c = 0; c < COST_NCLASS; c++) printf(" %9.3f", 1e3 * by[k]->rank[st].exposed.s[c]), t += by[k]->rank[st].exposed.s[c];
            printf(" %9.3f %9.3f\n", 1e3 * t, 1e3 * by[k]->step);
        }
    cost_sim_free(&o);
    ir_free(m2);
    cost_sim_free(&s);
}

/* Tensor parallel (issue 20): the activation elements each rank sends over
 * tp per layer and micro-batch (ring algorithms: an all-reduce sends
 * 2(tp-1)/tp of its tensor, an all-gather or reduce-scatter (tp-1)/tp of
 * the whole), forward and backward, next to Megatron's formula for the
 * forward: 4 b s h (tp-1)/tp, two all-reduces of [b,s,h] without sequence
 * parallelism, two all-gathers and two reduce-scatters with it (the same
 * elements).  The backward's count adds the norm gains' gradient
 * all-reduces under sp. */
static void report_tp(const Module *m, int micro_batches, int sp) {
    const Graph *g = m->stages[0];
    int tp = m->mesh[3], lo = INT_MAX, hi = INT_MIN;
    double sent[2] = {0, 0}, b = 0, s = 0, h = 0;
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        if (n->op == OP_input && !b && g->vals[n->out[0]].t.rank >= 2) /* the rank's rows: micro_batches of b */
            b = (double)g->vals[n->out[0]].t.dim[0] / micro_batches, s = (double)g->vals[n->out[0]].t.dim[1];
        if ((n->op == OP_layernorm || n->op == OP_rmsnorm) && n->layer >= 0 && !h) h = (double)ir_numel(&g->vals[n->in[1]].t);
        if (!(ir_ops[n->op].flags & F_COMM) || strcmp(ir_attr_s(n, "group", ""), "tp") || n->layer < 0 || n->nin < 1) continue;
        if (n->phase != PH_FWD && n->phase != PH_BWD) continue;
        double in = (double)ir_numel(&g->vals[n->in[0]].t), f = (double)(tp - 1) / tp;
        double e = n->op == OP_allreduce ? 2 * f * in : n->op == OP_allgather ? f * in * tp : n->op == OP_reducescatter ? f * in : 0;
        sent[n->phase == PH_BWD] += e;
        lo = n->layer < lo ? n->layer : lo, hi = n->layer > hi ? n->layer : hi;
    }
    printf("tensor parallel: tp %d, %s\n", tp, sp ? "sequence parallel (all-gather / reduce-scatter)" : "no sequence parallel (all-reduce)");
    if (hi < lo) return;
    double per = (double)(hi - lo + 1) * micro_batches;
    printf("  activations sent per rank per layer and micro-batch: forward %.0f elements (formula 4 b s h (tp-1)/tp = %.0f), backward %.0f\n",
           sent[0] / per, 4 * b * s * h * (tp - 1) / tp, sent[1] / per);
}

int cmd_plan(Args *a) {
    if (a->max_seq) { /* plan_offload.c */
        plan_max_seq(a);
        return 0;
    }
    if (a->compare_tp_cp) { /* plan_tp.c */
        plan_compare_tp_cp(a);
        return 0;
    }
    if (a->o.recompute == RC_UNSET) {
        plan_recompute_table(a);
        return 0;
    }
    if (a->o.pp_schedule == PS_COUNT) {
        plan_pp_schedules(a);
        return 0;
    }
    cmd_check_output("--timeline", a->timeline, &(RtPath){"MODEL", a->model}, 1);
    Module *m = compile(a);
    memplan_report(m, stdout);
    if (a->peak) memplan_peak_report(m, stdout);
    printf("recompute %s: %.2f MiB saved from forward for backward per rank (%lld bytes)\n", ir_recompute_names[m->recompute],
           (double)recompute_saved_bytes(m->stages[0], INT_MIN) / (1 << 20), (long long)recompute_saved_bytes(m->stages[0], INT_MIN));
    if (m->mesh[2] > 1) { /* context parallel: activation memory against the same program at cp = 1 */
        Args one = *a;
        one.o.cp = 1, one.comparison = 1;
        Module *m1 = compile(&one);
        int64_t act = memplan_fwd_bwd_peak(m), act1 = memplan_fwd_bwd_peak(m1);
        printf("  fwd+bwd activations per rank: %.2f MiB at cp %d, %.2f MiB at cp 1 (%.3fx)\n", (double)act / (1 << 20),
               m->mesh[2], (double)act1 / (1 << 20), act1 ? (double)act / (double)act1 : 0.0);
        ir_free(m1);
    }
    if (m->mesh[3] > 1) report_tp(m, a->o.micro_batches > 0 ? a->o.micro_batches : 1, a->o.sp != 2);
    if (m->mesh[0] > 1) plan_pp_report(a, m);
    if (a->o.offload != 0 || a->o.offload_stages) plan_offload_report(a, m); /* plan_offload.c */
    plan_cost_report(a, m);
    ir_free(m);
    return 0;
}
