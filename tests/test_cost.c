/* test_cost.c — the cost model's simulator (cost.c) on hand-built
 * programs with known answers, and its node times against the profile's
 * formulas.
 *
 *   two streams and an event   compute A (2 s) records e0; the comm stream
 *                              waits e0, runs C and records e1; compute B
 *                              (3 s), waits e1, D (1 s).  C = 4 s: C ends at
 *                              6, compute idles 1 s (exposed comm 1), step
 *                              7.  C = 2 s: hidden, step 6.
 *   a collective with a straggler  two pipeline ranks, A = 1 s and 3 s, then
 *                              an all-reduce over pp (0.5 s), then 1 s each:
 *                              both end at 3 + 0.5 + 1 = 4.5; rank 0 idles
 *                              2 s (bubble), rank 1 none.
 *   a pipeline of 2 ranks      the per-rank programs ppsched's plans make
 *                              (F, B, W nodes on compute; sends and recvs
 *                              on the comm stream with their events): 1f1b
 *                              p 2 m 2 with F 1, B 2 takes (m+p−1)(F+B) = 9;
 *                              and every schedule at p 2 m 4 (interleaved,
 *                              zb-v at v 2) with unequal chunk costs and a
 *                              transfer latency equals ppsched_simulate's
 *                              makespan (an independent walk over the
 *                              plan), to 1e-12, with the recvs on a stream
 *                              of their own; with recvs and sends on one
 *                              in-order comm stream (pp.c's programs) a
 *                              recv queued behind a send waits for it: at
 *                              latency 0 still equal, else never less.
 *   a deadlock                 a wait with no record is one line naming it.
 *   node times                 a GEMM, attention, an elementwise node and an
 *                              all-reduce against the profile's formulas;
 *                              a fused group of two: its input and last
 *                              output once, one launch.
 *   exposed time by class      a dp then a cp all-reduce behind one wait
 *                              (split by what ran during the wait), a tp
 *                              one on compute, an offload's wait, a pp
 *                              send after compute's end: each class's
 *                              seconds by hand; cost_node_class by group.
 *   optional profile fields    a profile's allgather_alpha_s/_beta replace
 *                              intra's for all-gathers only; a lone
 *                              p2p_beta is a one-line FILE:LINE error;
 *                              mem_bw_table interpolates in log(bytes).
 *   per-kernel-kind fields     (kiln calibrate's) attention's FLOPs plus a
 *                              cost per score, layernorm and its backward
 *                              at their own bandwidths, a transpose and a
 *                              slice at copy_bw_table's rate for their
 *                              runs, a collective by its measured table
 *                              (log-log, ends, the ring's factor for
 *                              another group size); step_overhead_s once
 *                              a step as compute; ew_transc_s an element
 *                              of a GELU, pool_wake_s once a kernel over
 *                              16 Ki elements; their errors.
 *   positioned attention       (cp, a CPU-rated profile) the pairs the
 *                              CPU kernel's tiles compute on rank 0's
 *                              dual chunks over the causal half, by hand
 *                              for chunks of 16 and 64, ring and gathered.
 *   the runtime's exchange     a cp ring's send at p2p_runtime_table's
 *                              time, a pp send at p2p_posted_table's
 *                              (log-log); none: the plain p2p; another
 *                              node's link: the plain one; the error.
 *   processor sharing          (a profile with cores; cost.c) two ranks on
 *                              one core: two 1 s ops take 2 s each; a rank
 *                              waiting on a recv gives its core away (the
 *                              other's op runs at full speed once it
 *                              waits: 2 s of work ends at 3, not 4); one
 *                              rank's comm thread and compute share its
 *                              core; dp replicas count (dp 4 of 2 threads
 *                              on 2 cores: a quarter speed; thread_speedup
 *                              1: half); the fields and their errors.
 * Each rank's split (compute + comm + bubble + copy) must add up to the
 * step, and its exposed classes to comm + bubble + copy.  Every program
 * without a profile is also simulated on the shipped h100 profile (no
 * cores: every start and end bit for bit the same) and replayed by the event-driven simulation
 * (cost_force_shared): every node's start and end and every split equal
 * the sweep's to 1e-12 (the GPU profiles' case: no sharing, unchanged).
 */
#include "testutil.h"
#include "cost.h"
#include "live.h"
#include "ppsched.h"
#include "calibrate_ew.h"

#define TOL 1e-12
#define NEAR(got, want) \
    do { \
        double g_ = (got), w_ = (want); \
        if (fabs(g_ - w_) > TOL * (1 + fabs(w_))) fail_msg("%s = %.17g, want %.17g", #got, g_, w_); \
    } while (0)

/* ---- building programs ---- */

typedef struct {
    Module *m;
    double *dur[8];
    int cap[8];
} Prog;

static Prog prog_new(int stages) {
    Prog P = {0};
    P.m = ir_module_new("t");
    P.m->mesh[0] = stages;
    P.m->stages = ir_alloc(P.m, sizeof(Graph *) * (size_t)stages);
    P.m->nstages = stages;
    for (int s = 0; s < stages; s++) {
        P.m->stages[s] = ir_graph_new(P.m);
        P.cap[s] = 1024;
        P.dur[s] = calloc(1024, sizeof(double));
    }
    return P;
}

static void prog_free(Prog *P) {
    for (int s = 0; s < P->m->nstages; s++) free(P->dur[s]);
    ir_free(P->m);
}

/* Node op on stage s, stream k, duration d; returns its index. */
static int add(Prog *P, int s, Op op, int k, double d, int nin, const int *in, int nattr, const Attr *at) {
    Graph *g = P->m->stages[s];
    NodeSpec sp = ir_spec(op, (Loc){ir_intern(P->m, "t.lua"), g->nnodes + 1});
    Type sc = {.dt = DT_F32, .rank = 0};
    sp.nin = nin, sp.in = in, sp.nattr = nattr, sp.attr = at, sp.src_type = &sc;
    char err[256];
    int i = ir_add_node(g, &sp, err, sizeof err);
    if (i < 0) fail_msg("ir_add_node: %s", err);
    g->nodes[i].stream = k, g->nodes[i].stage = s;
    assert_true(i < P->cap[s]);
    P->dur[s][i] = d;
    return i;
}

static int scalar(Prog *P, int s) {
    Attr a = ir_attr_str(P->m, "name", "x");
    return ir_out(P->m->stages[s], add(P, s, OP_input, 0, 0, 0, NULL, 1, &a));
}
static int work(Prog *P, int s, int k, double d, int x) { return add(P, s, OP_neg, k, d, 1, &x, 0, NULL); }
static void sync(Prog *P, int s, Op op, int k, int ev) {
    Attr a = ir_attr_int(P->m, "event", ev);
    add(P, s, op, k, 0, 0, NULL, 1, &a);
}
static int coll(Prog *P, int s, int k, double d, int x, const char *group) {
    Attr a = ir_attr_str(P->m, "group", group);
    return add(P, s, OP_allreduce, k, d, 1, &x, 1, &a);
}
static void p2p(Prog *P, int s, Op op, int k, double d, int x, int peer, int tag) {
    Attr a[3] = {ir_attr_str(P->m, "group", "pp"), ir_attr_int(P->m, "peer", peer), ir_attr_int(P->m, "tag", tag)};
    add(P, s, op, k, d, op == OP_send, &x, 3, a);
}

static void check_split(const CostSim *sp) {
    CostSim s = *sp;
    for (int r = 0; r < s.nstages; r++) { /* the split adds up to the step */
        const CostRank *R = &s.rank[r];
        NEAR(R->compute + R->comm + R->bubble + R->copy, s.step);
        double cls = 0; /* and the classes add up to the idle time */
        for (int c = 0; c < COST_NCLASS; c++) cls += R->exposed.s[c];
        NEAR(cls, R->comm + R->bubble + R->copy);
        NEAR(R->exposed.s[COST_BUBBLE], R->bubble);
        NEAR(R->exposed.s[COST_D2H] + R->exposed.s[COST_H2D], R->copy);
    }
}

/* Simulate P on profile p (NULL: none, the sweep).  Without a profile the
 * event-driven replay (cost_force_shared, no domain over its cores) must
 * give every node the sweep's start and end, and each rank the same split. */
static CostSim simulate_on(Prog *P, const Profile *p) {
    CostSim s, f;
    char err[512];
    if (cost_simulate(P->m, p, P->dur, &s, err, sizeof err)) fail_msg("cost_simulate: %s", err);
    check_split(&s);
    if (p) return s;
    /* a GPU profile (no cores: not applicable) leaves every number as it is */
    Profile gpu;
    CostSim gs;
    if (profile_load(&gpu, "h100", err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(gpu.cores, 0);
    if (cost_simulate(P->m, &gpu, P->dur, &gs, err, sizeof err)) fail_msg("cost_simulate, h100: %s", err);
    assert_int_equal(gs.shared, 0);
    for (int r = 0; r < s.nstages; r++)
        for (int i = 0; i < P->m->stages[r]->nnodes; i++)
            if (gs.start[r][i] != s.start[r][i] || gs.end[r][i] != s.end[r][i]) fail_msg("h100: stage %d node %d moved", r, i);
    assert_true(gs.step == s.step);
    cost_sim_free(&gs);
    cost_force_shared = 1;
    int rc = cost_simulate(P->m, NULL, P->dur, &f, err, sizeof err);
    cost_force_shared = 0;
    if (rc) fail_msg("cost_simulate, event-driven: %s", err);
    for (int r = 0; r < s.nstages; r++) {
        for (int i = 0; i < P->m->stages[r]->nnodes; i++) {
            NEAR(f.start[r][i], s.start[r][i]);
            NEAR(f.end[r][i], s.end[r][i]);
        }
        NEAR(f.rank[r].compute, s.rank[r].compute);
        NEAR(f.rank[r].comm, s.rank[r].comm);
        NEAR(f.rank[r].bubble, s.rank[r].bubble);
        NEAR(f.rank[r].copy, s.rank[r].copy);
        for (int c = 0; c < COST_NCLASS; c++) NEAR(f.rank[r].exposed.s[c], s.rank[r].exposed.s[c]);
    }
    NEAR(f.step, s.step);
    cost_sim_free(&f);
    return s;
}

static CostSim simulate(Prog *P) { return simulate_on(P, NULL); }

/* ---- two streams and an event ---- */

static void two_streams(double c, double step, double exposed) {
    Prog P = prog_new(1);
    int x = scalar(&P, 0);
    work(&P, 0, IR_STREAM_COMPUTE, 2, x); /* A */
    sync(&P, 0, OP_record, IR_STREAM_COMPUTE, 0);
    sync(&P, 0, OP_wait, IR_STREAM_COMM, 0);
    int cnode = coll(&P, 0, IR_STREAM_COMM, c, x, "dp"); /* C */
    sync(&P, 0, OP_record, IR_STREAM_COMM, 1);
    work(&P, 0, IR_STREAM_COMPUTE, 3, x); /* B */
    sync(&P, 0, OP_wait, IR_STREAM_COMPUTE, 1);
    int d = work(&P, 0, IR_STREAM_COMPUTE, 1, x); /* D */
    CostSim s = simulate(&P);
    NEAR(s.start[0][cnode], 2);
    NEAR(s.end[0][cnode], 2 + c);
    NEAR(s.end[0][d], step);
    NEAR(s.step, step);
    NEAR(s.rank[0].compute, 6);
    NEAR(s.rank[0].comm, exposed);
    NEAR(s.rank[0].bubble, 0);
    cost_sim_free(&s);
    prog_free(&P);
}

static void test_two_streams(void **state) {
    (void)state;
    two_streams(4, 7, 1); /* C ends at 6, B at 5: 1 s exposed */
    two_streams(2, 6, 0); /* C ends at 4: hidden behind B */
}

/* ---- exposed time by class ---- */

/* compute A (2 s) records e0; the comm stream waits e0, runs a dp
 * all-reduce (3 s) then a cp one (1 s), records e1; compute B (1 s) waits
 * e1 over [3, 6]: the dp one ran 2 s of that, the cp one 1 s.  D (1 s), a
 * tp all-reduce on compute (0.5 s), record e2; d2h waits e2, an offload
 * (2 s), e3; compute waits e3 (2 s of d2h), E (1 s), e4; the comm stream
 * waits e4 and sends over pp (1.5 s) after compute's last node: a tail of
 * 1.5 s of pp.  Step 12 = compute 5 + dp 2 + cp 1 + tp 0.5 + d2h 2 + pp 1.5. */
static void test_exposed_classes(void **state) {
    (void)state;
    Prog P = prog_new(1);
    int x = scalar(&P, 0);
    work(&P, 0, IR_STREAM_COMPUTE, 2, x); /* A */
    sync(&P, 0, OP_record, IR_STREAM_COMPUTE, 0);
    sync(&P, 0, OP_wait, IR_STREAM_COMM, 0);
    coll(&P, 0, IR_STREAM_COMM, 3, x, "dp");
    coll(&P, 0, IR_STREAM_COMM, 1, x, "cp");
    sync(&P, 0, OP_record, IR_STREAM_COMM, 1);
    work(&P, 0, IR_STREAM_COMPUTE, 1, x); /* B */
    sync(&P, 0, OP_wait, IR_STREAM_COMPUTE, 1);
    work(&P, 0, IR_STREAM_COMPUTE, 1, x); /* D */
    coll(&P, 0, IR_STREAM_COMPUTE, 0.5, x, "tp");
    sync(&P, 0, OP_record, IR_STREAM_COMPUTE, 2);
    sync(&P, 0, OP_wait, IR_STREAM_D2H, 2);
    add(&P, 0, OP_offload, IR_STREAM_D2H, 2, 1, &x, 0, NULL);
    sync(&P, 0, OP_record, IR_STREAM_D2H, 3);
    sync(&P, 0, OP_wait, IR_STREAM_COMPUTE, 3);
    work(&P, 0, IR_STREAM_COMPUTE, 1, x); /* E */
    sync(&P, 0, OP_record, IR_STREAM_COMPUTE, 4);
    sync(&P, 0, OP_wait, IR_STREAM_COMM, 4);
    p2p(&P, 0, OP_send, IR_STREAM_COMM, 1.5, x, 1, 0);
    CostSim s = simulate(&P);
    const CostRank *R = &s.rank[0];
    NEAR(s.step, 12);
    NEAR(R->compute, 5);
    static const double want[COST_NCLASS] = {[COST_DP] = 2, [COST_CP] = 1, [COST_TP] = 0.5, [COST_D2H] = 2, [COST_PP] = 1.5};
    for (int c = 0; c < COST_NCLASS; c++)
        if (fabs(R->exposed.s[c] - want[c]) > TOL) fail_msg("exposed %s = %.17g, want %g", cost_class_names[c], R->exposed.s[c], want[c]);
    cost_sim_free(&s);
    prog_free(&P);
}

/* cost_node_class: a group over one axis is that axis's, several: dp first. */
static void test_node_class(void **state) {
    (void)state;
    Prog P = prog_new(1);
    int x = scalar(&P, 0);
    static const struct { const char *g; int c; } cases[] = {
        {"dp", COST_DP}, {"cp", COST_CP}, {"pp", COST_PP}, {"tp", COST_TP}, {"dp+cp", COST_DP}, {"pp+dp+cp", COST_DP}, {"pp+cp", COST_CP}, {"pp+tp", COST_TP},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int n = coll(&P, 0, IR_STREAM_COMM, 0, x, cases[i].g);
        if (cost_node_class(&P.m->stages[0]->nodes[n]) != cases[i].c) fail_msg("group %s: class %d, want %d", cases[i].g, cost_node_class(&P.m->stages[0]->nodes[n]), cases[i].c);
    }
    assert_int_equal(cost_node_class(&P.m->stages[0]->nodes[work(&P, 0, 0, 0, x)]), -1);
    int off = add(&P, 0, OP_offload, IR_STREAM_D2H, 0, 1, &x, 0, NULL), h = ir_out(P.m->stages[0], off);
    assert_int_equal(cost_node_class(&P.m->stages[0]->nodes[off]), COST_D2H);
    assert_int_equal(cost_node_class(&P.m->stages[0]->nodes[add(&P, 0, OP_reload, IR_STREAM_H2D, 0, 1, &h, 0, NULL)]), COST_H2D);
    prog_free(&P);
}

/* ---- a collective with a straggler ---- */

static void test_straggler(void **state) {
    (void)state;
    Prog P = prog_new(2);
    int ar[2], last[2];
    for (int s = 0; s < 2; s++) {
        int x = scalar(&P, s);
        work(&P, s, IR_STREAM_COMPUTE, s ? 3 : 1, x);
        ar[s] = coll(&P, s, IR_STREAM_COMPUTE, 0.5, x, "pp");
        last[s] = work(&P, s, IR_STREAM_COMPUTE, 1, x);
    }
    CostSim s = simulate(&P);
    for (int r = 0; r < 2; r++) {
        NEAR(s.end[r][ar[r]], 3.5);
        NEAR(s.end[r][last[r]], 4.5);
        NEAR(s.rank[r].comm, 0.5);
    }
    NEAR(s.step, 4.5);
    NEAR(s.rank[0].bubble, 2);
    NEAR(s.rank[0].exposed.s[COST_BUBBLE], 2);
    NEAR(s.rank[0].exposed.s[COST_PP], 0.5); /* the all-reduce over pp itself */
    NEAR(s.rank[1].exposed.s[COST_PP], 0.5);
    NEAR(s.rank[0].compute, 2);
    NEAR(s.rank[1].bubble, 0);
    NEAR(s.rank[1].compute, 4);
    cost_sim_free(&s);
    prog_free(&P);
}

/* ---- a pipeline ---- */

/* The tag of the transfer that action (k, c, mb) sends. */
static int tag_of(const PpPlan *pl, int k, int c, int mb) { return (k * pl->p * pl->v + c) * pl->m + mb; }

/* The rank that consumes action a's output (-1: none, or the same rank). */
static int consumer(const PpPlan *pl, int r, Action a, int *chunk) {
    int nch = pl->p * pl->v;
    *chunk = a.kind == ACT_F ? a.chunk + 1 : a.kind == ACT_B ? a.chunk - 1 : -1;
    if (*chunk < 0 || *chunk >= nch) return -1;
    int q = pp_chunk_rank(pl, *chunk);
    return q == r ? -1 : q;
}

/* The rank that produced what action a reads from another rank (-1: none). */
static int producer(const PpPlan *pl, int r, Action a, int *chunk) {
    int nch = pl->p * pl->v;
    *chunk = a.kind == ACT_F ? a.chunk - 1 : a.kind == ACT_B ? a.chunk + 1 : -1;
    if (*chunk < 0 || *chunk >= nch) return -1;
    int q = pp_chunk_rank(pl, *chunk);
    return q == r ? -1 : q;
}

/* Rank programs of plan pl: per action, a recv (on stream rs) and a wait,
 * the work on compute, then a record and its send on comm. */
static Prog pipeline_prog(const PpPlan *pl, const double *const cost[3], double lat, int rs) {
    Prog P = prog_new(pl->p);
    for (int r = 0; r < pl->p; r++) {
        int x = scalar(&P, r), ev = 0;
        for (int i = 0; i < pl->nact[r]; i++) {
            Action a = pl->act[r][i];
            int c, q = producer(pl, r, a, &c);
            if (q >= 0) {
                p2p(&P, r, OP_recv, rs, 0, x, q - r, tag_of(pl, a.kind == ACT_F ? ACT_F : ACT_B, c, a.mb));
                sync(&P, r, OP_record, rs, ev);
                sync(&P, r, OP_wait, IR_STREAM_COMPUTE, ev++);
            }
            work(&P, r, IR_STREAM_COMPUTE, cost[a.kind][a.chunk], x);
            if ((q = consumer(pl, r, a, &c)) >= 0) {
                sync(&P, r, OP_record, IR_STREAM_COMPUTE, ev);
                sync(&P, r, OP_wait, IR_STREAM_COMM, ev++);
                p2p(&P, r, OP_send, IR_STREAM_COMM, lat, x, q - r, tag_of(pl, a.kind, a.chunk, a.mb));
            }
        }
    }
    return P;
}

static double pipeline_step(PpSchedule k, int p, int v, int m, const double *const cost[3], double lat, int rs, double *ref) {
    PpPlan pl;
    char err[256];
    if (ppsched_build(&pl, k, p, v, m, err, sizeof err)) fail_msg("%s", err);
    Prog P = pipeline_prog(&pl, cost, lat, rs);
    CostSim s = simulate(&P);
    PpTimes t;
    assert_int_equal(ppsched_simulate(&pl, cost, lat, &t), 0);
    *ref = t.makespan;
    double step = s.step;
    ppsched_times_free(&t);
    cost_sim_free(&s);
    prog_free(&P);
    ppsched_free(&pl);
    return step;
}

static void test_pipeline(void **state) {
    (void)state;
    double f[4] = {1, 1, 1, 1}, b[4] = {2, 2, 2, 2}, w[4] = {0, 0, 0, 0}, ref;
    const double *const eq[3] = {f, b, w};
    NEAR(pipeline_step(PS_1F1B, 2, 1, 2, eq, 0, IR_STREAM_COMM, &ref), 9); /* (m + p − 1)(F + B) */
    NEAR(ref, 9);
    double f2[4] = {1.0, 1.5, 0.75, 1.25}, b2[4] = {2.0, 2.5, 1.5, 3.0}, w2[4] = {0.5, 1.0, 0.75, 0.25};
    const double *const un[3] = {f2, b2, w2};
    static const struct { PpSchedule k; int v; } cases[] = {{PS_1F1B, 1}, {PS_INTERLEAVED, 2}, {PS_ZBH1, 1}, {PS_ZBV, 2}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int lat = 0; lat < 2; lat++) {
            /* recvs on a stream of their own: ppsched's model exactly */
            double got = pipeline_step(cases[i].k, 2, cases[i].v, 4, un, 0.125 * lat, IR_STREAM_H2D, &ref);
            if (fabs(got - ref) > TOL * ref) fail_msg("%s latency %g: step %.17g, ppsched_simulate %.17g", pp_schedule_names[cases[i].k], 0.125 * lat, got, ref);
            /* one in-order comm stream for both (what pp.c emits): a recv
             * queued behind a send waits for it, never faster */
            got = pipeline_step(cases[i].k, 2, cases[i].v, 4, un, 0.125 * lat, IR_STREAM_COMM, &ref);
            if (lat == 0 ? fabs(got - ref) > TOL * ref : got < ref - TOL * ref)
                fail_msg("%s latency %g, one comm stream: step %.17g, ppsched_simulate %.17g", pp_schedule_names[cases[i].k], 0.125 * lat, got, ref);
        }
}

/* ---- a deadlock ---- */

static void test_deadlock(void **state) {
    (void)state;
    Prog P = prog_new(1);
    int x = scalar(&P, 0);
    sync(&P, 0, OP_wait, IR_STREAM_COMPUTE, 0); /* never recorded */
    work(&P, 0, IR_STREAM_COMPUTE, 1, x);
    CostSim s;
    char err[512];
    assert_int_equal(cost_simulate(P.m, NULL, P.dur, &s, err, sizeof err), -1);
    assert_string_equal(err, "the programs deadlock in the simulation: stage 0 stream 0 at node 1 (wait)");
    cost_sim_free(&s);
    cost_force_shared = 1; /* the event-driven replay: the same line */
    int rc = cost_simulate(P.m, NULL, P.dur, &s, err, sizeof err);
    cost_force_shared = 0;
    assert_int_equal(rc, -1);
    assert_string_equal(err, "the programs deadlock in the simulation: stage 0 stream 0 at node 1 (wait)");
    cost_sim_free(&s);
    prog_free(&P);
}

/* ---- node times against the profile's formulas ---- */

static void test_node_seconds(void **state) {
    (void)state;
    Profile p;
    char err[512];
    if (profile_load(&p, "h100-sxm", err, sizeof err)) fail_msg("%s", err);
    Prog P = prog_new(1);
    P.m->mesh[0] = 1, P.m->mesh[1] = 8; /* dp 8: one node of h100's 8 */
    Graph *g = P.m->stages[0];
    Attr nm = ir_attr_str(P.m, "name", "a");
    Type ta = {.dt = DT_BF16, .rank = 2, .dim = {1024, 4096}}, tb = {.dt = DT_BF16, .rank = 2, .dim = {4096, 2048}};
    NodeSpec sa = ir_spec(OP_input, (Loc){ir_intern(P.m, "t.lua"), 1});
    sa.nattr = 1, sa.attr = &nm, sa.src_type = &ta;
    int a = ir_out(g, ir_add_node(g, &sa, err, sizeof err));
    sa.src_type = &tb;
    int b = ir_out(g, ir_add_node(g, &sa, err, sizeof err));
    int mm = add(&P, 0, OP_matmul, 0, 0, 2, (int[]){a, b}, 0, NULL);
    double mnk = 1024.0 * 2048 * 4096;
    NEAR(cost_node_seconds(&p, g, &g->nodes[mm]), 2 * mnk / (p.peak_flops_bf16 * profile_gemm_eff(&p, mnk)) + p.launch_s);
    NEAR(cost_node_seconds(&p, g, &g->nodes[mm]), profile_gemm_seconds(&p, DT_BF16, 1024, 2048, 4096));
    int y = ir_out(g, mm);
    int e = add(&P, 0, OP_gelu, 0, 0, 1, &y, 0, NULL);
    NEAR(cost_node_seconds(&p, g, &g->nodes[e]), 2.0 * 1024 * 2048 * 2 / p.mem_bw + p.launch_s);
    Attr gr = ir_attr_str(P.m, "group", "dp");
    int ar = add(&P, 0, OP_allreduce, IR_STREAM_COMM, 0, 1, &y, 1, &gr);
    double bytes = 1024.0 * 2048 * 2;
    NEAR(cost_node_seconds(&p, g, &g->nodes[ar]), 2 * 7 * p.intra_alpha + 2 * 7.0 / 8 * bytes / p.intra_beta);
    P.m->mesh[1] = 16; /* two nodes: the inter-node link */
    NEAR(cost_node_seconds(&p, g, &g->nodes[ar]), 2 * 15 * p.inter_alpha + 2 * 15.0 / 16 * bytes / p.inter_beta);
    Type tq = {.dt = DT_BF16, .rank = 4, .dim = {2, 8, 512, 64}};
    sa.src_type = &tq;
    int q = ir_out(g, ir_add_node(g, &sa, err, sizeof err));
    Attr causal = ir_attr_int(P.m, "causal", 1);
    int at = add(&P, 0, OP_attention, 0, 0, 3, (int[]){q, q, q}, 1, &causal);
    double fl = 4.0 * 2 * 8 * 512 * 512 / 2 * 64;
    NEAR(cost_node_seconds(&p, g, &g->nodes[at]), fl / (p.peak_flops_bf16 * p.attn_eff) + p.launch_s);
    prog_free(&P);
}

/* A fused group of two elementwise nodes moves its input and its last
 * output once, pays one launch: the value between them never reaches memory. */
static void test_fused_group(void **state) {
    (void)state;
    Profile p;
    char err[512];
    if (profile_load(&p, "cpu", err, sizeof err)) fail_msg("%s", err);
    Prog P = prog_new(1);
    Graph *g = P.m->stages[0];
    Type t = {.dt = DT_F32, .rank = 1, .dim = {1024}};
    Attr nm = ir_attr_str(P.m, "name", "x");
    NodeSpec sx = ir_spec(OP_input, (Loc){ir_intern(P.m, "t.lua"), 1});
    sx.nattr = 1, sx.attr = &nm, sx.src_type = &t;
    int x = ir_out(g, ir_add_node(g, &sx, err, sizeof err));
    Attr k = ir_attr_int(P.m, "kernel", 1);
    int a = add(&P, 0, OP_neg, 0, 0, 1, &x, 1, &k);
    int av = ir_out(g, a);
    int b = add(&P, 0, OP_exp, 0, 0, 1, &av, 1, &k);
    int bv = ir_out(g, b);
    Attr on = ir_attr_str(P.m, "name", "y");
    add(&P, 0, OP_output, 0, 0, 1, &bv, 1, &on);
    for (int i = 0; i < g->nnodes; i++) g->nodes[i].pos = i;
    CostSim s;
    if (cost_simulate(P.m, &p, NULL, &s, err, sizeof err)) fail_msg("%s", err);
    NEAR(s.end[0][b], 2 * 4096.0 / p.mem_bw + p.launch_s);
    NEAR(s.step, 2 * 4096.0 / p.mem_bw + p.launch_s);
    cost_sim_free(&s);
    prog_free(&P);
}

/* ---- processor sharing ---- */

/* A profile of a node of `cores` cores, each rank on `threads` of them,
 * node_size ranks; the rest zero (the durations are given). */
static Profile shared_profile(int cores, int threads, int node_size) {
    Profile p;
    memset(&p, 0, sizeof p);
    snprintf(p.name, sizeof p.name, "shared");
    p.cores = cores, p.threads = threads, p.node_size = node_size;
    return p;
}

/* Two ranks on one core, each one 1 s op: both run at half speed, 2 s;
 * on two cores (their own each) 1 s, the sweep's answer. */
static void test_share_two_ranks(void **state) {
    (void)state;
    for (int cores = 1; cores <= 2; cores++) {
        Prog P = prog_new(2);
        int a[2];
        for (int s = 0; s < 2; s++) a[s] = work(&P, s, IR_STREAM_COMPUTE, 1, scalar(&P, s));
        Profile p = shared_profile(cores, 1, 2);
        CostSim s = simulate_on(&P, &p);
        for (int r = 0; r < 2; r++) {
            NEAR(s.end[r][a[r]], cores == 1 ? 2 : 1);
            NEAR(s.rank[r].compute, cores == 1 ? 2 : 1);
        }
        NEAR(s.step, cores == 1 ? 2 : 1);
        cost_sim_free(&s);
        prog_free(&P);
    }
}

/* One core, two pipeline ranks.  Rank 0: A (2 s), then sends.  Rank 1: X
 * (1 s), a recv of A's send, then B (1 s).  A and X share the core until
 * X ends at 2 (A half done); rank 1 then waits on its recv, which demands
 * nothing, so A runs alone at full speed and ends at 3; B 3..4.  Rank 1's
 * recv waited 1 s for rank 0: bubble. */
static void test_share_idle_rank(void **state) {
    (void)state;
    Prog P = prog_new(2);
    int x0 = scalar(&P, 0), x1 = scalar(&P, 1);
    int A = work(&P, 0, IR_STREAM_COMPUTE, 2, x0);
    sync(&P, 0, OP_record, IR_STREAM_COMPUTE, 0);
    sync(&P, 0, OP_wait, IR_STREAM_COMM, 0);
    p2p(&P, 0, OP_send, IR_STREAM_COMM, 0, x0, 1, 7);
    int X = work(&P, 1, IR_STREAM_COMPUTE, 1, x1);
    p2p(&P, 1, OP_recv, IR_STREAM_COMM, 0, x1, -1, 7);
    sync(&P, 1, OP_record, IR_STREAM_COMM, 0);
    sync(&P, 1, OP_wait, IR_STREAM_COMPUTE, 0);
    int B = work(&P, 1, IR_STREAM_COMPUTE, 1, x1);
    Profile p = shared_profile(1, 1, 2);
    CostSim s = simulate_on(&P, &p);
    NEAR(s.end[1][X], 2);
    NEAR(s.end[0][A], 3);
    NEAR(s.start[1][B], 3);
    NEAR(s.end[1][B], 4);
    NEAR(s.step, 4);
    NEAR(s.rank[1].compute, 3); /* X took 2 s of the shared core, B 1 */
    NEAR(s.rank[1].bubble, 1);
    NEAR(s.rank[0].compute, 3);
    NEAR(s.rank[0].bubble, 1); /* from its end at 3 to the step's 4 */
    cost_sim_free(&s);
    prog_free(&P);
}

/* One rank: its compute A (2 s) and a collective C (1 s) on the comm
 * stream from the start.  On one core (threads 1) they take it in turns,
 * both at half speed until C ends at 2, then A alone: 3.  On two cores
 * with two compute threads (demand 2 + 1 on 2): both at 2/3 until C ends
 * at 1.5 (A has 1 s left), A alone to 2.5.  With no cores in the profile
 * (a GPU's) the sweep: C 1, A 2. */
static void test_share_comm_thread(void **state) {
    (void)state;
    static const struct { int cores; double c, a; } cases[] = {{1, 2, 3}, {2, 1.5, 2.5}, {0, 1, 2}};
    for (int k = 0; k < 3; k++) {
        Prog P = prog_new(1);
        int x = scalar(&P, 0);
        int A = work(&P, 0, IR_STREAM_COMPUTE, 2, x);
        int C = coll(&P, 0, IR_STREAM_COMM, 1, x, "dp");
        Profile p = shared_profile(cases[k].cores, cases[k].cores, 1);
        CostSim s = simulate_on(&P, cases[k].cores ? &p : NULL);
        NEAR(s.end[0][C], cases[k].c);
        NEAR(s.end[0][A], cases[k].a);
        cost_sim_free(&s);
        prog_free(&P);
    }
}

/* Replicas count: dp 4 on a node of 2 cores, each rank on both (threads
 * 2, unbound): one stage's 1 s kernel stands for 4 ranks' of 2 threads,
 * demand 8 on 2 cores, a quarter speed: 4 s.  At dp 1 on the same node
 * the rank is alone (demand 2 on 2): 1 s.  With thread_speedup 1 (its
 * two threads go no faster than one: one core's worth of work) dp 4
 * demands 4: half speed, 2 s. */
static void test_share_replicas(void **state) {
    (void)state;
    static const struct { int dp; double speedup, end; } cases[] = {{1, 0, 1}, {4, 0, 4}, {4, 1, 2}, {4, 2, 4}};
    for (int k = 0; k < 4; k++) {
        Prog P = prog_new(1);
        P.m->mesh[1] = cases[k].dp;
        int A = work(&P, 0, IR_STREAM_COMPUTE, 1, scalar(&P, 0));
        Profile p = shared_profile(2, 2, 4);
        p.thread_speedup = cases[k].speedup;
        CostSim s = simulate_on(&P, &p);
        NEAR(s.end[0][A], cases[k].end);
        cost_sim_free(&s);
        prog_free(&P);
    }
}

/* kiln calibrate's GELU stand-in (calibrate_ew.c: the generated groups'
 * tanh, Cephes tanhf's two branches and a select) computes GELU: against
 * double libm's 0.5 x (1 + tanh(k (x + 0.044715 x^3))) over [-8, 8] (both
 * branches: |u| below and above 0.625), within 2e-6 + 2e-6 |y| (Cephes
 * tanhf is ~1 ulp; kiln_expf ~1 ulp).  4096 elements: the serial path,
 * no runtime context. */
static void test_calib_gelu(void **state) {
    (void)state;
    enum { N = 4096 };
    static float x[N], z[N];
    for (int i = 0; i < N; i++) x[i] = -8.0f + 16.0f * (float)i / (N - 1);
    int64_t a[] = {rt_ptr_arg(x), 0, rt_ptr_arg(z), N};
    calib_ew_gelu(NULL, a);
    int small = 0;
    for (int i = 0; i < N; i++) {
        double u = 0.7978845608028654 * (x[i] + 0.044715 * (double)x[i] * x[i] * x[i]), y = 0.5 * x[i] * (1 + tanh(u));
        small += fabs(u) < 0.625;
        if (fabs(z[i] - y) > 2e-6 + 2e-6 * fabs(y)) fail_msg("gelu(%.9g) = %.9g, want %.9g", x[i], z[i], y);
    }
    assert_true(small > 100 && small < N - 100); /* both branches were exercised */
}

/* Unbound ranks share the whole node: pp 2 x dp 2 on 2 cores, one thread
 * a rank (the runtime's rule when 4 ranks would oversubscribe 2 cores).
 * Stage 0 computes a 1 s kernel while stage 1 idles: its 2 replicas
 * demand 2 of the node's 2 cores, full speed, 1 s (not a core of its own
 * shared by the 2, 2 s).  Both stages computing: 4 on 2, 2 s. */
static void test_share_unbound(void **state) {
    (void)state;
    for (int both = 0; both < 2; both++) {
        Prog P = prog_new(2);
        P.m->mesh[1] = 2;
        int A = work(&P, 0, IR_STREAM_COMPUTE, 1, scalar(&P, 0));
        int x1 = scalar(&P, 1);
        if (both) work(&P, 1, IR_STREAM_COMPUTE, 1, x1);
        Profile p = shared_profile(2, 1, 4);
        p.thread_speedup = 1;
        CostSim s = simulate_on(&P, &p);
        assert_int_equal(s.shared, both); /* alone, stage 0 never demands more than the node: the sweep */
        if (both) assert_int_equal(s.domains, 1), assert_int_equal(s.domain_ranks, 4), assert_int_equal(s.domain_cores, 2);
        NEAR(s.end[0][A], both ? 2 : 1);
        cost_sim_free(&s);
        prog_free(&P);
    }
}

/* The fields: cores alone (threads = cores), both, and the one-line errors. */
static void test_share_fields(void **state) {
    (void)state;
    Profile p;
    char err[1200];
    static const struct { const char *add, *want; int cores, threads; } cases[] = {
        {"cores 2\n", NULL, 2, 2},
        {"cores 2\nthreads 1\n", NULL, 2, 1},
        {"threads 1\n", "field \"threads\" without \"cores\"", 0, 0},
        {"cores 2\nthreads 4\n", "field \"threads\" (4) is more than \"cores\" (2)", 0, 0},
        {"cores 0\n", "field \"cores\": expected a whole number of at least 1", 0, 0},
        {"cores 2\nthread_speedup 2.5\n", "field \"thread_speedup\": expected 1 .. threads (2), got 2.5", 0, 0},
        {"thread_speedup 1.5\n", "field \"thread_speedup\" without \"cores\"", 0, 0},
    };
    if (profile_load(&p, "cpu", err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(p.cores, 0); /* the shipped cpu profile predicts without sharing */
    char base[1024];
    snprintf(base, sizeof base, "%s", p.path);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char named[] = "/tmp/test_cost_share_XXXXXX.profile";
        int fd = mkstemps(named, 8);
        assert_true(fd >= 0);
        FILE *f = fdopen(fd, "w"), *in = fopen(base, "r");
        assert_non_null(f), assert_non_null(in);
        char line[2048];
        while (fgets(line, sizeof line, in)) fputs(line, f);
        fclose(in);
        fputs(cases[c].add, f);
        fclose(f);
        int rc = profile_load(&p, named, err, sizeof err);
        if (!cases[c].want) {
            if (rc) fail_msg("%s", err);
            assert_int_equal(p.cores, cases[c].cores), assert_int_equal(p.threads, cases[c].threads);
            NEAR(p.thread_speedup, cases[c].threads); /* default: threads */
        } else if (rc != -1 || strncmp(err, named, strlen(named)) || !strstr(err, cases[c].want) || strchr(err, '\n'))
            fail_msg("case %zu: rc %d, error: %s", c, rc, err);
        remove(named);
    }
}

/* A copy of the shipped cpu profile plus `extra` lines, as a named file
 * (named: 64 bytes); 0 or -1 with err as profile_load. */
static int profile_plus(Profile *q, const char *extra, char *named, char *err, size_t errlen) {
    Profile p;
    if (profile_load(&p, "cpu", err, errlen)) fail_msg("%s", err);
    char path[] = "/tmp/test_cost_kind_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w"), *in = fopen(p.path, "r");
    assert_non_null(f), assert_non_null(in);
    char line[2048];
    while (fgets(line, sizeof line, in)) fputs(line, f);
    fclose(in);
    fputs(extra, f);
    fclose(f);
    snprintf(named, 64, "%s.profile", path);
    assert_int_equal(rename(path, named), 0);
    return profile_load(q, named, err, errlen);
}

/* The optional per-algorithm link fields: both of a pair replace intra's
 * for that algorithm only; one without the other is a one-line error. */
static void test_coll_fields(void **state) {
    (void)state;
    Profile p, q;
    char err[1200], named[64];
    if (profile_load(&p, "cpu", err, sizeof err)) fail_msg("%s", err);
    if (profile_plus(&q, "allgather_alpha_s 1e-3\nallgather_beta 1e6\nmem_bw_table 1000:1e10 1e6:1e9\n", named, err, sizeof err)) fail_msg("%s", err);
    NEAR(profile_coll_seconds(&q, COLL_ALL_GATHER, 4e6, 4, 1), 3 * 1e-3 + 0.75 * 4e6 / 1e6);
    NEAR(profile_coll_seconds(&q, COLL_ALL_REDUCE, 4e6, 4, 1), profile_coll_seconds(&p, COLL_ALL_REDUCE, 4e6, 4, 1));
    NEAR(profile_coll_seconds(&q, COLL_ALL_GATHER, 4e6, 4, 0), profile_coll_seconds(&p, COLL_ALL_GATHER, 4e6, 4, 0)); /* inter: unchanged */
    /* mem_bw_table: its end points outside, linear in log(bytes) between; none: mem_bw */
    NEAR(profile_mem_bw(&q, 10), 1e10);
    NEAR(profile_mem_bw(&q, 1e9), 1e9);
    NEAR(profile_mem_bw(&q, sqrt(1e3 * 1e6)), 5.5e9);
    NEAR(profile_mem_bw(&p, 10), p.mem_bw);
    FILE *f = fopen(named, "a");
    assert_non_null(f);
    fputs("p2p_beta 1e9\n", f);
    fclose(f);
    assert_int_equal(profile_load(&q, named, err, sizeof err), -1);
    char want[256];
    snprintf(want, sizeof want, "%s:", named);
    if (strncmp(err, want, strlen(want)) || !strstr(err, "field \"p2p_beta\" without \"p2p_alpha_s\"") || strchr(err, '\n'))
        fail_msg("error: %s", err);
    remove(named);
}

/* The per-kernel-kind fields (kiln calibrate's): attention's FLOPs at
 * attn_eff (forward) or attn_bwd_eff plus attn_score_s / attn_bwd_score_s
 * a score and attn_row_s / attn_bwd_row_s a query row (B·H·T); layernorm and its backward by bytes at norm_bw, norm_bwd_bw;
 * a transpose and a slice by bytes at copy_bw_table's rate for their runs
 * (64 bytes: the first point; 256: a third of the way in log); a
 * collective by its measured table (log-log between points, the first
 * point's below, in proportion above; a group of 2 of node_size 4 by the
 * ring's factor, 2/3; the inter-node link unchanged); and the fields'
 * one-line errors.  Without them (the shipped cpu profile) the same nodes
 * cost what the roofline says. */
static void test_kind_fields(void **state) {
    (void)state;
    Profile q, p;
    char err[1200], named[64];
    if (profile_load(&p, "cpu", err, sizeof err)) fail_msg("%s", err);
    if (profile_plus(&q,
                     "attn_bwd_eff 0.5\nattn_score_s 1e-9\nattn_bwd_score_s 2e-9\nattn_row_s 3e-8\nattn_bwd_row_s 5e-8\nnorm_bw 2e9\nnorm_bwd_bw 1e9\nxent_bw 5e8\nxent_bwd_bw 4e8\n"
                     "copy_bw 8e9\ncopy_bw_table 64:1e9 4096:4e9\nsumto_bw 3e9\nadamw_bw 6e9\nsumsq_bw 7e9\n"
                     "allreduce_table 100:1e-6 1e6:1e-3 1e7:1e-1\n",
                     named, err, sizeof err))
        fail_msg("%s", err);
    remove(named);
    Prog P = prog_new(1);
    Graph *g = P.m->stages[0];
    Attr nm = ir_attr_str(P.m, "name", "a");
    NodeSpec sa = ir_spec(OP_input, (Loc){ir_intern(P.m, "t.lua"), 1});
    sa.nattr = 1, sa.attr = &nm;
    Type tq = {.dt = DT_F32, .rank = 4, .dim = {2, 8, 512, 64}};
    sa.src_type = &tq;
    int qv = ir_out(g, ir_add_node(g, &sa, err, sizeof err));
    Attr causal = ir_attr_int(P.m, "causal", 1);
    int at = add(&P, 0, OP_attention, 0, 0, 3, (int[]){qv, qv, qv}, 1, &causal);
    double fl = 4.0 * 2 * 8 * 512 * 512 / 2 * 64, scores = 2.0 * 8 * 512 * 512 / 2, rows = 2.0 * 8 * 512;
    NEAR(cost_node_seconds(&q, g, &g->nodes[at]), fl / (q.peak_flops_f32 * q.attn_eff) + scores * 1e-9 + rows * 3e-8 + q.launch_s);
    NEAR(cost_node_seconds(&p, g, &g->nodes[at]), fl / (p.peak_flops_f32 * p.attn_eff) + p.launch_s);
    Type tl = {.dt = DT_F32, .rank = 3, .dim = {2, 8, 512}};
    sa.src_type = &tl;
    int lse = ir_out(g, ir_add_node(g, &sa, err, sizeof err));
    int ab = add(&P, 0, OP_attention_bwd, 0, 0, 6, (int[]){qv, qv, qv, qv, qv, lse}, 1, &causal);
    NEAR(cost_node_seconds(&q, g, &g->nodes[ab]), 2.5 * fl / (q.peak_flops_f32 * 0.5) + scores * 2e-9 + rows * 5e-8 + q.launch_s);
    /* layernorm [64,128] with w, b; its backward (dy, x, w) -> dx, dw, db */
    Type tx = {.dt = DT_F32, .rank = 2, .dim = {64, 128}}, tw = {.dt = DT_F32, .rank = 1, .dim = {128}};
    sa.src_type = &tx;
    int x = ir_out(g, ir_add_node(g, &sa, err, sizeof err));
    sa.src_type = &tw;
    int w = ir_out(g, ir_add_node(g, &sa, err, sizeof err));
    Attr eps = ir_attr_float(P.m, "eps", 1e-5);
    int ln = add(&P, 0, OP_layernorm, 0, 0, 3, (int[]){x, w, w}, 1, &eps);
    NEAR(cost_node_seconds(&q, g, &g->nodes[ln]), 4.0 * (2 * 64 * 128 + 2 * 128) / 2e9 + q.launch_s);
    int lb = add(&P, 0, OP_layernorm_bwd, 0, 0, 3, (int[]){x, x, w}, 1, &eps);
    NEAR(cost_node_seconds(&q, g, &g->nodes[lb]), 4.0 * (3 * 64 * 128 + 3 * 128) / 1e9 + q.launch_s);
    /* a head permute [8,64,4,16] -> [8,4,64,16]: runs of 16 floats (64 bytes) */
    Type th = {.dt = DT_F32, .rank = 4, .dim = {8, 64, 4, 16}};
    sa.src_type = &th;
    int h = ir_out(g, ir_add_node(g, &sa, err, sizeof err));
    Attr ab12[2] = {ir_attr_int(P.m, "a", 1), ir_attr_int(P.m, "b", 2)};
    int tr = add(&P, 0, OP_transpose, 0, 0, 1, &h, 2, ab12);
    NEAR(cost_node_seconds(&q, g, &g->nodes[tr]), 2 * 4.0 * 8 * 64 * 64 / 1e9 + q.launch_s);
    NEAR(cost_node_seconds(&p, g, &g->nodes[tr]), 2 * 4.0 * 8 * 64 * 64 / profile_mem_bw(&p, 2 * 4.0 * 8 * 64 * 64) + p.launch_s);
    /* a slice of [8,192] along dim 1 to [8,64]: runs of 64 floats, 256 bytes: 1e9 + (4e9 - 1e9) / 3; it reads only its part */
    Type ts = {.dt = DT_F32, .rank = 2, .dim = {8, 192}};
    sa.src_type = &ts;
    int sv = ir_out(g, ir_add_node(g, &sa, err, sizeof err));
    Attr sl[3] = {ir_attr_int(P.m, "dim", 1), ir_attr_int(P.m, "start", 64), ir_attr_int(P.m, "end", 128)};
    int si = add(&P, 0, OP_slice, 0, 0, 1, &sv, 3, sl);
    NEAR(profile_copy_bw(&q, 256), 2e9);
    NEAR(cost_node_seconds(&q, g, &g->nodes[si]), 2 * 4.0 * 8 * 64 / 2e9 + q.launch_s);
    /* ew_transc_s an element of a transcendental op; pool_wake_s once a kernel over 16 Ki elements */
    q.ew_transc_s = 1e-9, q.pool_wake_s = 1e-5;
    int ge = add(&P, 0, OP_gelu, 0, 0, 1, &x, 0, NULL); /* [64,128]: 8 Ki elements, serial */
    NEAR(cost_node_seconds(&q, g, &g->nodes[ge]), 2 * 4.0 * 64 * 128 / profile_mem_bw(&q, 2 * 4.0 * 64 * 128) + 64 * 128 * 1e-9 + q.launch_s);
    int gh = add(&P, 0, OP_gelu, 0, 0, 1, &h, 0, NULL); /* [8,64,4,16]: 32 Ki elements, parallel */
    NEAR(cost_node_seconds(&q, g, &g->nodes[gh]), 2 * 4.0 * 32768 / profile_mem_bw(&q, 2 * 4.0 * 32768) + 32768 * 1e-9 + 1e-5 + q.launch_s);
    int ng = add(&P, 0, OP_neg, 0, 0, 1, &h, 0, NULL); /* no transcendental */
    NEAR(cost_node_seconds(&q, g, &g->nodes[ng]), 2 * 4.0 * 32768 / profile_mem_bw(&q, 2 * 4.0 * 32768) + 1e-5 + q.launch_s);
    NEAR(cost_node_seconds(&p, g, &g->nodes[gh]), 2 * 4.0 * 32768 / profile_mem_bw(&p, 2 * 4.0 * 32768) + p.launch_s); /* the cpu profile: neither */
    /* step_overhead_s: once a step, on every rank, as compute */
    for (int i = 0; i < g->nnodes; i++) g->nodes[i].pos = i;
    CostSim a, b;
    if (cost_simulate(P.m, &p, NULL, &a, err, sizeof err)) fail_msg("%s", err);
    p.step_overhead_s = 2.5e-4;
    if (cost_simulate(P.m, &p, NULL, &b, err, sizeof err)) fail_msg("%s", err);
    NEAR(b.step, a.step + 2.5e-4);
    NEAR(b.rank[0].compute, a.rank[0].compute + 2.5e-4);
    NEAR(b.rank[0].compute + b.rank[0].comm + b.rank[0].bubble + b.rank[0].copy, b.step);
    cost_sim_free(&a), cost_sim_free(&b);
    prog_free(&P);
    /* the collective table: node_size 4 (the cpu profile's) */
    assert_int_equal(q.node_size, 4);
    NEAR(profile_coll_seconds(&q, COLL_ALL_REDUCE, 1e5, 4, 1), 1e-6 * pow(1e3, 0.75));
    NEAR(profile_coll_seconds(&q, COLL_ALL_REDUCE, 1e5, 2, 1), 1e-6 * pow(1e3, 0.75) * (0.5 / 0.75));
    NEAR(profile_coll_seconds(&q, COLL_ALL_REDUCE, 10, 4, 1), 1e-6);
    NEAR(profile_coll_seconds(&q, COLL_ALL_REDUCE, 1e8, 4, 1), 1.0);
    NEAR(profile_coll_seconds(&q, COLL_ALL_REDUCE, 1e5, 4, 0), profile_coll_seconds(&p, COLL_ALL_REDUCE, 1e5, 4, 0));
    NEAR(profile_coll_seconds(&q, COLL_ALL_GATHER, 1e5, 4, 1), profile_coll_seconds(&p, COLL_ALL_GATHER, 1e5, 4, 1)); /* no table: α + β */
    static const struct { const char *add, *want; } bad[] = {
        {"attn_bwd_eff 1.5\n", "field \"attn_bwd_eff\": expected a fraction in (0, 1], got \"1.5\""},
        {"norm_bw 0\n", "field \"norm_bw\" must be positive"},
        {"attn_score_s -1e-9\n", "field \"attn_score_s\" is negative"},
        {"attn_row_s -1e-9\n", "field \"attn_row_s\" is negative"},
        {"copy_bw_table 64:1e9 32:2e9\n", "field \"copy_bw_table\": expected up to 16 RUN_BYTES:BYTES_PER_S pairs"},
        {"allgather_table 100:1e-6 100:1e-3\n", "field \"allgather_table\": expected up to 16 BYTES:SECONDS pairs"},
        {"sumsq_bw 1e9\nsumsq_bw 2e9\n", "field \"sumsq_bw\" given twice"},
        {"step_overhead_s x\n", "field \"step_overhead_s\": expected a number"},
    };
    for (size_t c = 0; c < sizeof bad / sizeof bad[0]; c++) {
        int rc = profile_plus(&q, bad[c].add, named, err, sizeof err);
        if (rc != -1 || strncmp(err, named, strlen(named)) || !strstr(err, bad[c].want) || strchr(err, '\n'))
            fail_msg("case %zu: rc %d, error: %s", c, rc, err);
        remove(named);
    }
}

/* The runtime's exchange tables (kiln calibrate's p2p_runtime_table,
 * p2p_posted_table): a send of context parallel's ring (group cp: its
 * receive blocks) costs p2p_runtime_table's time at its bytes, a send
 * over pp (a posted receive) p2p_posted_table's, each interpolated in
 * log-log like the collectives' tables; without them both cost the plain
 * p2p α + β; across nodes the tables (one host's) do not apply; a table
 * out of order is a one-line error.  Independent reference: the tables'
 * points by hand (64 KiB: a point; 16 KiB: halfway in log between 4 KiB
 * and 64 KiB). */
static void test_p2p_tables(void **state) {
    (void)state;
    Profile p, q;
    char err[1200], named[64];
    if (profile_load(&p, "cpu", err, sizeof err)) fail_msg("%s", err);
    if (profile_plus(&q, "p2p_runtime_table 4096:2e-5 65536:8e-5\np2p_posted_table 4096:1e-4 65536:2e-4\n", named, err, sizeof err)) fail_msg("%s", err);
    remove(named);
    Prog P = prog_new(2);
    P.m->mesh[0] = 2, P.m->mesh[2] = 2; /* pp 2, cp 2: 4 ranks, one node of the cpu profile's 4 */
    Graph *g = P.m->stages[0];
    Attr nm = ir_attr_str(P.m, "name", "a");
    NodeSpec sa = ir_spec(OP_input, (Loc){ir_intern(P.m, "t.lua"), 1});
    Type t64k = {.dt = DT_F32, .rank = 1, .dim = {16384}}, t16k = {.dt = DT_F32, .rank = 1, .dim = {4096}};
    sa.nattr = 1, sa.attr = &nm, sa.src_type = &t64k;
    int x = ir_out(g, ir_add_node(g, &sa, err, sizeof err));
    sa.src_type = &t16k;
    int y = ir_out(g, ir_add_node(g, &sa, err, sizeof err));
    Attr cp[3] = {ir_attr_str(P.m, "group", "cp"), ir_attr_int(P.m, "peer", 1), ir_attr_int(P.m, "tag", 0)};
    Attr pp[3] = {ir_attr_str(P.m, "group", "pp"), ir_attr_int(P.m, "peer", 1), ir_attr_int(P.m, "tag", 1)};
    int sc = add(&P, 0, OP_send, IR_STREAM_COMM, 0, 1, &x, 3, cp), sc16 = add(&P, 0, OP_send, IR_STREAM_COMM, 0, 1, &y, 3, cp);
    int sp = add(&P, 0, OP_send, IR_STREAM_COMM, 0, 1, &x, 3, pp), sp16 = add(&P, 0, OP_send, IR_STREAM_COMM, 0, 1, &y, 3, pp);
    NEAR(cost_node_seconds(&q, g, &g->nodes[sc]), 8e-5);
    NEAR(cost_node_seconds(&q, g, &g->nodes[sc16]), sqrt(2e-5 * 8e-5));
    NEAR(cost_node_seconds(&q, g, &g->nodes[sp]), 2e-4);
    NEAR(cost_node_seconds(&q, g, &g->nodes[sp16]), sqrt(1e-4 * 2e-4));
    double plain = p.intra_alpha + 65536 / p.intra_beta; /* the shipped cpu profile: no tables */
    NEAR(cost_node_seconds(&p, g, &g->nodes[sc]), plain);
    NEAR(cost_node_seconds(&p, g, &g->nodes[sp]), plain);
    P.m->mesh[2] = 4; /* pp 2 x cp 4: 8 ranks, two nodes of 4: the cp ring stays on a node, pp crosses */
    NEAR(cost_node_seconds(&q, g, &g->nodes[sc]), 8e-5);
    NEAR(cost_node_seconds(&q, g, &g->nodes[sp]), q.inter_alpha + 65536 / q.inter_beta);
    prog_free(&P);
    int rc = profile_plus(&q, "p2p_posted_table 4096:1e-4 1024:2e-4\n", named, err, sizeof err);
    if (rc != -1 || strncmp(err, named, strlen(named)) || !strstr(err, "field \"p2p_posted_table\": expected up to 16 BYTES:SECONDS pairs") || strchr(err, '\n'))
        fail_msg("rc %d, error: %s", rc, err);
    remove(named);
}

/* Context parallel's positioned attention on a profile that rates the CPU
 * kernels (cost.c's pos_factor): the pairs kernels/cpu/attention.c computes
 * (tiles of 64 query rows, key blocks of 128 cut to the last key a tile
 * sees, computed whole) over the causal half the rates stand for, on cp
 * rank 0's dual chunks.  By hand, per (b, h): T 32 (chunks of 16, both in
 * one tile): each ring step's block is computed whole, 32 x 32 = 2 x 512;
 * T 128 (chunks of 64): the own keys 64 x 64 + 64 x 128 = 1.5 x 8192, the
 * other rank's 0 + 64 x 128 = 1 x 8192: 1.25; all-gathered (S 256 in rank
 * order) 64 x 64 + 64 x 256 = 1.25 x 16384.  The FLOPs and scores scale,
 * the rows do not.  Without a cp iota (contiguous: rank 0 holds [0, T):
 * its own block whole, 2 x, the next rank's skipped, 0: 1 on average)
 * and on a profile without the CPU's kinds (the shipped cpu one) or
 * without cores (a GPU's, calibrated or not) nothing changes. */
static void test_pos_attention(void **state) {
    (void)state;
    Profile q, p;
    char err[1200], named[64];
    if (profile_load(&p, "cpu", err, sizeof err)) fail_msg("%s", err);
    if (profile_plus(&q, "norm_bw 2e9\nattn_score_s 1e-9\nattn_row_s 3e-8\nattn_bwd_eff 0.5\nattn_bwd_score_s 2e-9\nattn_bwd_row_s 5e-8\ncores 2\n", named, err, sizeof err))
        fail_msg("%s", err);
    remove(named);
    static const struct { int64_t T, S; int dual; double factor; } cases[] = {
        {32, 32, 1, 2.0}, {128, 128, 1, 1.25}, {128, 256, 1, 1.25}, {32, 32, 0, 1.0},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int64_t T = cases[c].T, S = cases[c].S, B = 2, H = 4, D = 16;
        Prog P = prog_new(1);
        P.m->mesh[0] = 1, P.m->mesh[2] = 2; /* cp 2 */
        Graph *g = P.m->stages[0];
        Attr nm = ir_attr_str(P.m, "name", "a");
        NodeSpec sa = ir_spec(OP_input, (Loc){ir_intern(P.m, "t.lua"), 1});
        sa.nattr = 1, sa.attr = &nm;
        Type tq = {.dt = DT_F32, .rank = 4, .dim = {B, H, T, D}}, tk = {.dt = DT_F32, .rank = 4, .dim = {B, H, S, D}};
        Type tqp = {.dt = DT_I32, .rank = 1, .dim = {T}}, tkp = {.dt = DT_I32, .rank = 1, .dim = {S}}, tl = {.dt = DT_F32, .rank = 3, .dim = {B, H, T}};
        int v[5];
        const Type *ts[5] = {&tq, &tk, &tqp, &tkp, &tl};
        for (int i = 0; i < 5; i++) sa.src_type = ts[i], v[i] = ir_out(g, ir_add_node(g, &sa, err, sizeof err));
        if (cases[c].dual) {
            Attr ia[2] = {ir_attr_str(P.m, "group", "cp"), ir_attr_str(P.m, "layout", "dual")};
            NodeSpec si = ir_spec(OP_iota, (Loc){ir_intern(P.m, "t.lua"), 2});
            si.nattr = 2, si.attr = ia, si.src_type = &tqp;
            if (ir_add_node(g, &si, err, sizeof err) < 0) fail_msg("iota: %s", err);
        }
        Attr causal = ir_attr_int(P.m, "causal", 1);
        int fw = add(&P, 0, OP_attention, 0, 0, 5, (int[]){v[0], v[1], v[1], v[2], v[3]}, 1, &causal);
        int bw = add(&P, 0, OP_attention_bwd, 0, 0, 8, (int[]){v[0], v[0], v[1], v[1], v[0], v[4], v[2], v[3]}, 1, &causal);
        double half = (double)B * H * T * S / 2, f = cases[c].factor, rows = (double)B * H * T;
        NEAR(cost_node_seconds(&q, g, &g->nodes[fw]), 4.0 * D * half * f / (q.peak_flops_f32 * q.attn_eff) + half * f * 1e-9 + rows * 3e-8 + q.launch_s);
        NEAR(cost_node_seconds(&q, g, &g->nodes[bw]), 10.0 * D * half * f / (q.peak_flops_f32 * 0.5) + half * f * 2e-9 + rows * 5e-8 + q.launch_s);
        NEAR(cost_node_seconds(&p, g, &g->nodes[fw]), 4.0 * D * half / (p.peak_flops_f32 * p.attn_eff) + p.launch_s); /* no kinds: the roofline */
        Profile gpu = q; /* kinds without cores: a GPU's calibrated profile, whose kernel's tiles these are not */
        gpu.cores = 0;
        NEAR(cost_node_seconds(&gpu, g, &g->nodes[fw]), 4.0 * D * half / (q.peak_flops_f32 * q.attn_eff) + half * 1e-9 + rows * 3e-8 + q.launch_s);
        prog_free(&P);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_streams), cmocka_unit_test(test_exposed_classes), cmocka_unit_test(test_node_class), cmocka_unit_test(test_straggler), cmocka_unit_test(test_pipeline),
        cmocka_unit_test(test_deadlock),    cmocka_unit_test(test_node_seconds), cmocka_unit_test(test_fused_group),
        cmocka_unit_test(test_coll_fields), cmocka_unit_test(test_kind_fields), cmocka_unit_test(test_share_two_ranks), cmocka_unit_test(test_share_idle_rank),
        cmocka_unit_test(test_share_comm_thread), cmocka_unit_test(test_share_replicas), cmocka_unit_test(test_share_unbound), cmocka_unit_test(test_share_fields), cmocka_unit_test(test_calib_gelu),
        cmocka_unit_test(test_p2p_tables), cmocka_unit_test(test_pos_attention),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
