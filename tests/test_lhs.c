/* test_lhs.c — the latency-hiding scheduler (lhs.c, schedule.c's
 * --schedule lhs) on hand-built programs with known answers.
 *
 *   one GEMM hides a collective   x -> neg -> all-reduce (dp 2) -> add,
 *                                 and a GEMM that needs only x, after the
 *                                 add in the fixed order.  With the
 *                                 all-reduce and the GEMM 1 s each and the
 *                                 rest 0, the cost model predicts 1 s of
 *                                 exposed comm for the fixed order (the add
 *                                 waits for the all-reduce, then the GEMM
 *                                 runs) and 0 for lhs (the GEMM runs while
 *                                 the all-reduce is in flight); the step is
 *                                 2 s and 1 s.
 *   an in-flight limit            two all-reduces of 1 MiB each on the comm
 *                                 stream and their consumers; lhs with no
 *                                 limit issues the second before the first
 *                                 one's consumer (both in flight), with a
 *                                 limit of one it never does.
 *   the memory rule               the same program through pass_schedule and
 *                                 memplan: with --memory-budget at the fixed
 *                                 order's peak the plan's peak stays <= it
 *                                 (and the one-in-flight order is the one
 *                                 kept); with a large budget lhs keeps both
 *                                 in flight and its peak is above the fixed
 *                                 one's (so the rule had work to do).
 *   the peak without planning     memplan_stage_total (memplan.h, the
 *                                 rule's measure) on models/tiny.lua's
 *                                 programs after schedule (dp 2 under lhs;
 *                                 pp 2 with two micro-batches, both stages;
 *                                 one device with --offload all: a host
 *                                 space; --activation-budget's recompute) equals
 *                                 the sum of memplan_stage_peak over params,
 *                                 grads, opt and act after pass_memplan, and
 *                                 leaves every value's space and offset as
 *                                 they were.
 *   sends and reloads not later   models/tiny.lua (4 layers) over pp 2 with
 *                                 offload all (1f1b, m 4; zb-h1 with dp 2),
 *                                 each stage's fuse order through lhs_order
 *                                 (attempt 1's limits; compute 1 ms, every
 *                                 transfer 5 ms, so lhs has comm to hide):
 *                                 every node lhs places before a send is
 *                                 before it in the given order too (a send is
 *                                 never issued after more work than the fixed
 *                                 order's: the peer waits for it), every node
 *                                 before a reload in the given order is before
 *                                 it in lhs's (reloads stay where offload put
 *                                 them), and lhs did reorder; with
 *                                 move_reloads (schedule.c's other
 *                                 candidate) some reload is issued early.
 *   no comm fence under lhs       the same model, pp 2 interleaved (vpp 2,
 *                                 m 4) with offload all, through memplan:
 *                                 under fixed the comm stream waits for the
 *                                 h2d stream before it writes a buffer
 *                                 (schedule.c, comm_fence), under lhs never
 *                                 (no collective or receive queues behind a
 *                                 reload), and both pass the verifier.
 *   tp's own comm stream          x -> exp -> all-reduce over dp (2 s), then
 *                                 x -> neg -> all-reduce over tp (1 s) -> add,
 *                                 an independent GEMM (1 s) and a*x last; on
 *                                 a dp 2 x tp 2 mesh.  The fixed order has
 *                                 one comm stream: the tp all-reduce queues
 *                                 behind the dp one (ends at 3 s), the add
 *                                 waits, step 4 s (the GEMM after the add).
 *                                 lhs puts the tp all-reduce on IR_STREAM_TP
 *                                 (lhs.h, sched_stream_for) and the GEMM in
 *                                 its shadow: tp's exposed time 0, the step
 *                                 2 s (a*x waits for the dp all-reduce);
 *                                 the fixed order has no node on stream 4;
 *                                 lhs's plan fits the fixed order's peak
 *                                 (live.c's transitive rule between the
 *                                 two comm streams: by direct waits alone
 *                                 it was 2 MiB over and lhs fell back).
 *   pp's own comm stream          the same with the second all-reduce over
 *                                 pp on a dp 2 x pp 2 mesh: fixed puts it
 *                                 on the comm stream (step 4 s), lhs on
 *                                 IR_STREAM_PP (step 2 s).
 * Every program passes the verifier (events, buffers) after schedule and
 * memplan.
 */
#include "testutil.h"
#include "graphbuild.h"
#include "cmd.h"
#include "cost.h"
#include "lhs.h"
#include "live.h"
#include "memplan.h"
#include "passes.h"
#include "ppsched.h"

#define N 512 /* [N, N] f32: 1 MiB */

static Bld new_dp2(void) {
    Bld b = bld_new("t", "t.lua");
    b.m->mesh[1] = 2;
    return b;
}

static int allreduce(Bld *b, int x) { return val(b, OP_allreduce, INS(x), ATS(as(b, "group", "dp"))); }

/* x, w; r = allreduce(neg x); c = r + x; d = x @ w (independent). */
static Bld one_gemm(void) {
    Bld b = new_dp2();
    int x = input(&b, "x", TY(DT_F32, 64, 64)), w = param(&b, "w", TY(DT_F32, 64, 64), "normal", 0.02);
    int r = allreduce(&b, val(&b, OP_neg, INS(x), NOATS));
    output(&b, val(&b, OP_add, INS(r, x), NOATS), "c");
    output(&b, val(&b, OP_matmul, INS(x, w), ATS(ai(&b, "ta", 0), ai(&b, "tb", 0))), "d");
    return b;
}

static void run_passes(Module *m, int schedule, double budget) {
    Options o;
    opt_defaults(&o);
    o.schedule = schedule, o.memory_budget = budget;
    char err[1024];
    pass_schedule(m, &o);
    if (ir_verify_module(m, err, sizeof err)) fail_msg("after schedule: %s", err);
    pass_memplan(m, &o);
    if (ir_verify_module(m, err, sizeof err)) fail_msg("after memplan: %s", err);
}

/* Predicted exposed comm with the all-reduce and the GEMM 1 s each, the rest 0. */
static double exposed(Module *m, double *step) {
    Graph *g = m->stages[0];
    double *dur = calloc((size_t)g->nnodes, sizeof(double));
    for (int i = 0; i < g->nnodes; i++) dur[i] = g->nodes[i].op == OP_allreduce || g->nodes[i].op == OP_matmul;
    CostSim s;
    char err[512];
    if (cost_simulate(m, NULL, &dur, &s, err, sizeof err)) fail_msg("cost_simulate: %s", err);
    double e = s.rank[0].comm;
    *step = s.step;
    cost_sim_free(&s);
    free(dur);
    return e;
}

static void test_one_gemm(void **state) {
    (void)state;
    double step;
    Bld f = one_gemm();
    run_passes(f.m, SCHED_FIXED, 0);
    assert_true(fabs(exposed(f.m, &step) - 1.0) < 1e-12);
    assert_true(fabs(step - 2.0) < 1e-12);
    Bld l = one_gemm();
    run_passes(l.m, SCHED_LHS, 0);
    assert_true(fabs(exposed(l.m, &step)) < 1e-12);
    assert_true(fabs(step - 1.0) < 1e-12);
    ir_free(f.m), ir_free(l.m);
}

/* Two transfers: r1 = allreduce(neg x), c1 = r1 + x, then r2 =
 * allreduce(exp x), c2 = r2 * x, and an independent GEMM; [N, N] each. */
static Bld two_transfers(int *r1, int *c1, int *r2) {
    Bld b = new_dp2();
    int x = input(&b, "x", TY(DT_F32, N, N)), w = param(&b, "w", TY(DT_F32, N, N), "normal", 0.02);
    *r1 = allreduce(&b, val(&b, OP_neg, INS(x), NOATS));
    int c = val(&b, OP_add, INS(*r1, x), NOATS);
    *c1 = b.g->vals[c].def;
    output(&b, c, "c1");
    *r2 = allreduce(&b, val(&b, OP_exp, INS(x), NOATS));
    output(&b, val(&b, OP_mul, INS(*r2, x), NOATS), "c2");
    output(&b, val(&b, OP_matmul, INS(x, w), ATS(ai(&b, "ta", 0), ai(&b, "tb", 0))), "d");
    *r1 = b.g->vals[*r1].def, *r2 = b.g->vals[*r2].def;
    return b;
}

static int where(const int *order, int n, int node) {
    for (int k = 0; k < n; k++)
        if (order[k] == node) return k;
    fail_msg("node %d not in the order", node);
    return -1;
}

static void test_inflight_limit(void **state) {
    (void)state;
    int r1, c1, r2;
    Bld b = two_transfers(&r1, &c1, &r2);
    int n = b.g->nnodes, order[64];
    double dur[64];
    assert_true(n <= 64);
    for (int i = 0; i < n; i++) dur[i] = b.g->nodes[i].op == OP_allreduce || b.g->nodes[i].op == OP_matmul;
    LhsLimits any = {64, {0}, {0}, 1, 0}, one = {64, {0}, {0, 1, 0, 0}, 1, 0};
    for (int i = 0; i < n; i++) order[i] = i;
    lhs_order(b.g, dur, 1, &any, order, NULL);
    assert_true(where(order, n, r2) < where(order, n, c1)); /* both in flight */
    for (int i = 0; i < n; i++) order[i] = i;
    lhs_order(b.g, dur, 1, &one, order, NULL);
    assert_true(where(order, n, r2) > where(order, n, c1)); /* one at a time */
    ir_free(b.m);
}

static int64_t peak(const Module *m) {
    int64_t p = 0;
    for (int sp = SPACE_PARAMS; sp <= SPACE_ACT; sp++) p += memplan_peak(m, sp);
    return p;
}

/* The position of node `node` of the unscheduled graph in the scheduled one
 * (its only output value keeps its id). */
static int pos_of(const Graph *g, int out_val) { return g->vals[out_val].def; }

static void test_memory_rule(void **state) {
    (void)state;
    int r1, c1, r2;
    Bld f = two_transfers(&r1, &c1, &r2);
    int v1 = ir_out(f.g, c1), v2 = ir_out(f.g, r2);
    run_passes(f.m, SCHED_FIXED, 0);
    int64_t fixed = peak(f.m);
    assert_true(pos_of(f.g, v2) > pos_of(f.g, v1)); /* the fixed order has one in flight */
    Bld big = two_transfers(&r1, &c1, &r2);
    run_passes(big.m, SCHED_LHS, 1e12);
    int64_t loose = peak(big.m);
    print_message("fixed peak %lld, lhs under a 1e12 budget %lld\n", (long long)fixed, (long long)loose);
    assert_true(loose > fixed);
    assert_true(pos_of(big.g, v2) < pos_of(big.g, v1));
    Bld lim = two_transfers(&r1, &c1, &r2);
    run_passes(lim.m, SCHED_LHS, (double)fixed);
    assert_true(peak(lim.m) <= fixed);
    Bld dflt = two_transfers(&r1, &c1, &r2); /* no budget: the fixed peak */
    run_passes(dflt.m, SCHED_LHS, 0);
    assert_true(peak(dflt.m) <= fixed);
    ir_free(f.m), ir_free(big.m), ir_free(lim.m), ir_free(dflt.m);
}

/* models/tiny.lua through schedule under o, then memplan_stage_total
 * against pass_memplan, stage by stage. */
static void total_matches(Options *o, const char *what) {
    char err[1024];
    Module *m = fe_load("models/tiny.lua", o, err, sizeof err);
    if (!m) fail_msg("%s", err);
    pipeline_run(m, PIPE_TRAIN, o, "schedule");
    int64_t want[8];
    assert_true(m->nstages <= 8);
    for (int s = 0; s < m->nstages; s++) {
        Graph *g = m->stages[s];
        Value *before = malloc(sizeof(Value) * (size_t)g->nvals);
        memcpy(before, g->vals, sizeof(Value) * (size_t)g->nvals);
        want[s] = memplan_stage_total(g);
        assert_memory_equal(before, g->vals, sizeof(Value) * (size_t)g->nvals); /* g unchanged */
        free(before);
    }
    pass_memplan(m, o);
    if (ir_verify_module(m, err, sizeof err)) fail_msg("%s: after memplan: %s", what, err);
    for (int s = 0; s < m->nstages; s++) {
        int64_t got = 0;
        for (int sp = SPACE_PARAMS; sp <= SPACE_ACT; sp++) got += memplan_stage_peak(m->stages[s], sp);
        print_message("%s, stage %d: memplan_stage_total %lld, pass_memplan %lld\n", what, s, (long long)want[s], (long long)got);
        assert_true(got > 0);
        assert_int_equal(want[s], got);
    }
    ir_free(m);
}

static void test_stage_total(void **state) {
    (void)state;
    Options o;
    opt_defaults(&o);
    o.dp = 2, o.micro_batches = 2;
    total_matches(&o, "dp 2, lhs");
    opt_defaults(&o);
    o.pp = 2, o.micro_batches = 2;
    total_matches(&o, "pp 2, m 2");
    opt_defaults(&o);
    o.offload = 1, o.offload_min_bytes = 1;
    total_matches(&o, "offload all");
    opt_defaults(&o);
    o.dp = 2, o.activation_budget = 4e6;
    total_matches(&o, "dp 2, --activation-budget 4e6");
}

/* The send and reload rules on one module's stages (see the top). */
static void sends_and_reloads(Options *o, const char *what) {
    char err[1024];
    Module *m = fe_load("models/tiny.lua", o, err, sizeof err);
    if (!m) fail_msg("%s", err);
    pipeline_run(m, PIPE_TRAIN, o, "fuse");
    LhsLimits first = {64, {0, 0, 0, 64}, {0, 0, 0, 2}, 1, 0};
    int sends = 0, reloads = 0, moved = 0, early = 0;
    for (int s = 0; s < m->nstages; s++) {
        Graph *g = m->stages[s];
        int n = g->nnodes, *order = xcalloc((size_t)n + 1, sizeof(int)), *at = xcalloc((size_t)n + 1, sizeof(int));
        double *dur = xcalloc((size_t)n + 1, sizeof(double));
        for (int i = 0; i < n; i++) order[i] = i, dur[i] = sched_stream_for(g->m, &g->nodes[i], 1) == IR_STREAM_COMPUTE ? 1e-3 : 5e-3;
        lhs_order(g, dur, 1, &first, order, NULL);
        for (int k = 0; k < n; k++) at[order[k]] = k, moved += order[k] != k;
        for (int k = 0, late = -1; k < n; k++) { /* late: the largest given index placed so far */
            int i = order[k];
            if (g->nodes[i].op == OP_send && late > i) fail_msg("%s, stage %d: node %d placed before the send %d, after it in the given order", what, s, late, i);
            sends += g->nodes[i].op == OP_send;
            if (i > late) late = i;
        }
        for (int i = 0; i < n; i++) {
            if (g->nodes[i].op != OP_reload) continue;
            reloads++;
            for (int j = 0; j < i; j++)
                if (g->nodes[j].op != OP_assign && at[j] > at[i]) fail_msg("%s, stage %d: node %d placed after the reload %d, before it in the given order", what, s, j, i);
        }
        LhsLimits moving = first; /* the other candidate: reloads move */
        moving.move_reloads = 1;
        for (int i = 0; i < n; i++) order[i] = i;
        lhs_order(g, dur, 1, &moving, order, NULL);
        for (int k = 0; k < n; k++) at[order[k]] = k;
        for (int i = 0; i < n; i++)
            for (int j = 0; g->nodes[i].op == OP_reload && j < i; j++)
                if (g->nodes[j].op != OP_assign && at[j] > at[i]) {
                    early++;
                    break;
                }
        free(order), free(at), free(dur);
    }
    print_message("%s: %d sends, %d reloads, %d nodes moved; with move_reloads %d reloads issued early\n", what, sends, reloads, moved, early);
    assert_true(sends > 0 && reloads > 0 && moved > 0 && early > 0);
    ir_free(m);
}

static void test_sends_and_reloads(void **state) {
    (void)state;
    static KeyVal layers4 = {"layers", "4"};
    Options o;
    opt_defaults(&o);
    o.sets = &layers4, o.nsets = 1, o.offload = 1, o.offload_min_bytes = 1;
    o.pp = 2, o.micro_batches = 4;
    sends_and_reloads(&o, "pp 2 1f1b m 4 offload all");
    o.dp = 2, o.micro_batches = 2, o.pp_schedule = PS_ZBH1;
    sends_and_reloads(&o, "pp 2 dp 2 zb-h1 m 2 offload all");
}

/* The comm stream's waits for h2d events in m's programs. */
static int comm_waits_for_h2d(const Module *m) {
    int k = 0;
    for (int s = 0; s < m->nstages; s++) {
        const Graph *g = m->stages[s];
        int64_t nev = 0;
        for (int i = 0; i < g->nnodes; i++)
            if (g->nodes[i].op == OP_record && ir_attr_i(&g->nodes[i], "event", 0) >= nev) nev = ir_attr_i(&g->nodes[i], "event", 0) + 1;
        char *h2d = xcalloc((size_t)nev + 1, 1);
        for (int i = 0; i < g->nnodes; i++) {
            const Node *n = &g->nodes[i];
            int64_t e = ir_attr_i(n, "event", -1);
            if (n->op == OP_record && n->stream == IR_STREAM_H2D) h2d[e] = 1;
            k += n->op == OP_wait && e >= 0 && h2d[e] && n->stream == IR_STREAM_COMM;
        }
        free(h2d);
    }
    return k;
}

static void test_no_comm_fence(void **state) {
    (void)state;
    static KeyVal layers4 = {"layers", "4"};
    char err[1024];
    int waits[2];
    for (int sched = SCHED_FIXED; sched <= SCHED_LHS; sched++) {
        Options o;
        opt_defaults(&o);
        o.sets = &layers4, o.nsets = 1, o.offload = 1, o.offload_min_bytes = 1, o.pp = 2, o.vpp = 2, o.micro_batches = 4;
        o.pp_schedule = PS_INTERLEAVED, o.schedule = sched;
        Module *m = fe_load("models/tiny.lua", &o, err, sizeof err);
        if (!m) fail_msg("%s", err);
        pipeline_run(m, PIPE_TRAIN, &o, "memplan");
        if (ir_verify_module(m, err, sizeof err)) fail_msg("%s", err);
        waits[sched == SCHED_LHS] = comm_waits_for_h2d(m);
        ir_free(m);
    }
    print_message("the comm stream's waits for h2d: fixed %d, lhs %d\n", waits[0], waits[1]);
    assert_true(waits[0] > 0 && waits[1] == 0);
}

/* x, w; a = allreduce_dp(exp x); t = allreduce over `group` (neg x);
 * c = t + x; d = x @ w (independent); e = a * x; on dp 2 x that axis 2
 * (mesh index axis: 3 tp, 0 pp). */
static Bld behind_dp(int axis, const char *group) {
    Bld b = bld_new("t", "t.lua");
    b.m->mesh[1] = 2, b.m->mesh[axis] = 2;
    int x = input(&b, "x", TY(DT_F32, N, N)), w = param(&b, "w", TY(DT_F32, N, N), "normal", 0.02);
    int a = allreduce(&b, val(&b, OP_exp, INS(x), NOATS));
    int t = val(&b, OP_allreduce, INS(val(&b, OP_neg, INS(x), NOATS)), ATS(as(&b, "group", group)));
    output(&b, val(&b, OP_add, INS(t, x), NOATS), "c");
    output(&b, val(&b, OP_matmul, INS(x, w), ATS(ai(&b, "ta", 0), ai(&b, "tb", 0))), "d");
    output(&b, val(&b, OP_mul, INS(a, x), NOATS), "e");
    return b;
}

static Bld tp_behind_dp(void) { return behind_dp(3, "tp"); }

/* The cost model with the dp all-reduce 2 s, the tp one and the GEMM 1 s,
 * the rest 0: the step and tp's exposed time; *on_tp: nodes on stream 4
 * other than its events (the tp all-reduce's stream in *tp_stream). */
static double tp_exposed(Module *m, double *step, int *on_tp, int *tp_stream) {
    Graph *g = m->stages[0];
    double *dur = calloc((size_t)g->nnodes, sizeof(double));
    *on_tp = 0;
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        int tp = n->op == OP_allreduce && strcmp(ir_attr_s(n, "group", ""), "tp") == 0;
        dur[i] = n->op == OP_allreduce ? (tp ? 1 : 2) : n->op == OP_matmul;
        *on_tp += n->stream == IR_STREAM_TP && n->op != OP_record && n->op != OP_wait;
        if (tp) *tp_stream = n->stream;
    }
    CostSim s;
    char err[512];
    if (cost_simulate(m, NULL, &dur, &s, err, sizeof err)) fail_msg("cost_simulate: %s", err);
    double e = s.rank[0].exposed.s[COST_TP];
    *step = s.step;
    print_message("step %.3f s, exposed tp %.3f dp %.3f, tp all-reduce on stream %d\n", s.step, e, s.rank[0].exposed.s[COST_DP], *tp_stream);
    cost_sim_free(&s);
    free(dur);
    return e;
}

static void test_tp_stream(void **state) {
    (void)state;
    double step;
    int on_tp, tps = -1;
    Bld f = tp_behind_dp();
    run_passes(f.m, SCHED_FIXED, 0);
    assert_true(tp_exposed(f.m, &step, &on_tp, &tps) > 0.5);
    assert_true(fabs(step - 4.0) < 1e-12);
    assert_int_equal(on_tp, 0);
    assert_int_equal(tps, IR_STREAM_COMM);
    Bld l = tp_behind_dp();
    run_passes(l.m, SCHED_LHS, 0);
    assert_true(fabs(tp_exposed(l.m, &step, &on_tp, &tps)) < 1e-12);
    assert_true(fabs(step - 2.0) < 1e-12);
    assert_int_equal(tps, IR_STREAM_TP);
    assert_int_equal(on_tp, 1);
    ir_free(f.m), ir_free(l.m);
}

/* The same on dp 2 x pp 2 with a collective over pp (every transfer over pp
 * alone, sends and receives too, runs on pp's own stream under lhs). */
static Bld pp_behind_dp(void) { return behind_dp(0, "pp"); }

static void test_pp_stream(void **state) {
    (void)state;
    Bld f = pp_behind_dp(), l = pp_behind_dp();
    run_passes(f.m, SCHED_FIXED, 0);
    run_passes(l.m, SCHED_LHS, 1e9); /* a budget: two comm streams may cost a few bytes over fixed's peak */
    int sf = -1, sl = -1;
    for (int k = 0; k < 2; k++) {
        const Graph *g = (k ? l.m : f.m)->stages[0];
        for (int i = 0; i < g->nnodes; i++)
            if (g->nodes[i].op == OP_allreduce && strcmp(ir_attr_s(&g->nodes[i], "group", ""), "pp") == 0) *(k ? &sl : &sf) = g->nodes[i].stream;
    }
    print_message("the pp all-reduce: fixed on stream %d, lhs on stream %d\n", sf, sl);
    assert_int_equal(sf, IR_STREAM_COMM);
    assert_int_equal(sl, IR_STREAM_PP);
    double step[2];
    for (int k = 0; k < 2; k++) { /* the dp all-reduce 2 s, the pp one and the GEMM 1 s: queued 4 s, on its own stream 2 s */
        Graph *g = (k ? l.m : f.m)->stages[0];
        double *dur = calloc((size_t)g->nnodes, sizeof(double));
        for (int i = 0; i < g->nnodes; i++) {
            const Node *n = &g->nodes[i];
            dur[i] = n->op == OP_allreduce ? (strcmp(ir_attr_s(n, "group", ""), "pp") == 0 ? 1 : 2) : n->op == OP_matmul;
        }
        CostSim sim;
        char err[512];
        if (cost_simulate(k ? l.m : f.m, NULL, &dur, &sim, err, sizeof err)) fail_msg("cost_simulate: %s", err);
        step[k] = sim.step;
        cost_sim_free(&sim);
        free(dur);
    }
    print_message("step: fixed %.3f s, lhs %.3f s\n", step[0], step[1]);
    assert_true(fabs(step[0] - 4.0) < 1e-12 && fabs(step[1] - 2.0) < 1e-12);
    ir_free(f.m), ir_free(l.m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_gemm),
        cmocka_unit_test(test_inflight_limit),
        cmocka_unit_test(test_memory_rule),
        cmocka_unit_test(test_stage_total),
        cmocka_unit_test(test_sends_and_reloads),
        cmocka_unit_test(test_no_comm_fence),
        cmocka_unit_test(test_tp_stream),
        cmocka_unit_test(test_pp_stream),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
