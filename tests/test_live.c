/* test_live.c — ir_live_build's tables (live.c) against the definition.
 *
 * ir_live_build answers "the first position at which stream sd has waited
 * for an event that stream su recorded after position u" from a table
 * built in one pass per pair of streams (oend_build), and pairs every send
 * with its receive by sorting (peers_build); before, both were scans from
 * every read (quadratic in the program's length: 75% of a GPT-3 175B
 * plan's compile).  ir_live_build_scan keeps the scans.  On real programs
 * (models/tiny.lua with 4 layers through the training pipeline up to
 * schedule, under --schedule lhs and fixed, pipelines with offload all: the
 * programs with the most cross-stream reads; one of them with tp's own comm
 * stream beside the dp one, stream 4) this test checks, per stage:
 *   - the two MemLives are equal (every value's root, start and end, every
 *     node's group span, the streams used);
 *   - the table equals ir_ordered_end_scan for every ordered pair of
 *     streams at every position (sampled evenly when the program is long);
 *   - every send's peer equals ir_p2p_peer;
 *   - ir_inplace_conflict gives the same answer (node and reason) under
 *     both for every assign over its param or state.
 * The reference is the old code itself, so any difference is a failure.
 */
#include "testutil.h"
#include "cmd.h"
#include "live.h"
#include "passes.h"
#include "ppsched.h"

static KeyVal layers4 = {"layers", "4"};

static void base(Options *o) {
    opt_defaults(o);
    o->sets = &layers4, o->nsets = 1;
    o->offload = 1, o->offload_min_bytes = 1;
}

static void same_live(const Graph *g, const MemLive *a, const MemLive *b) {
    assert_int_equal(a->used, b->used);
    for (int v = 0; v < g->nvals; v++) {
        assert_int_equal(a->root[v], b->root[v]);
        if (a->root[v] != v) continue;
        if (a->start[v] != b->start[v] || a->end[v] != b->end[v])
            fail_msg("value %d: table [%d, %d], scan [%d, %d]", v, a->start[v], a->end[v], b->start[v], b->end[v]);
    }
    for (int i = 0; i < g->nnodes; i++) assert_true(a->first[i] == b->first[i] && a->last[i] == b->last[i]);
}

/* The table against the scan; returns how many answers were compared. */
static long same_ordered_end(const Graph *g, const MemLive *L) {
    int n = g->nnodes, step = n > 1500 ? n / 1500 : 1;
    long k = 0;
    assert_non_null(L->oend);
    for (int su = 0; su < IR_NSTREAMS; su++)
        for (int sd = 0; sd < IR_NSTREAMS; sd++)
            for (int u = 0; su != sd && u < n; u += step, k++) {
                int want = ir_ordered_end_scan(g, u, su, sd), got = L->oend[((size_t)su * IR_NSTREAMS + (size_t)sd) * ((size_t)n + 1) + (size_t)u];
                if (want != got) fail_msg("ordered_end(u %d, su %d, sd %d): table %d, scan %d", u, su, sd, got, want);
            }
    return k;
}

static int same_peers_and_inplace(const Graph *g, const MemLive *a, const MemLive *b) {
    int sends = 0;
    for (int i = 0; i < g->nnodes; i++) {
        if (g->nodes[i].op == OP_send) sends++, assert_int_equal(a->peer[i], ir_p2p_peer(g, i));
        else assert_int_equal(a->peer[i], -1);
        if (g->nodes[i].op != OP_assign || g->nodes[i].nin < 1) continue;
        int old = ir_assign_target(g, i), nw = g->nodes[i].in[0];
        if (old < 0) continue;
        const char *wa, *wb;
        int ra = ir_inplace_conflict(g, a, old, nw, &wa), rb = ir_inplace_conflict(g, b, old, nw, &wb);
        assert_int_equal(ra, rb);
        assert_true(wa == wb);
    }
    return sends;
}

static unsigned streams_seen; /* every stream any compared program used */

static void compare(Options *o, const char *what) {
    char err[1024];
    for (int sched = SCHED_FIXED; sched <= SCHED_LHS; sched++) {
        o->schedule = sched;
        Module *m = fe_load("models/tiny.lua", o, err, sizeof err);
        if (!m) fail_msg("%s", err);
        pipeline_run(m, PIPE_TRAIN, o, "schedule");
        unsigned copies = 0;
        for (int s = 0; s < m->nstages; s++) {
            const Graph *g = m->stages[s];
            MemLive a, b;
            ir_live_build(g, &a);
            ir_live_build_scan(g, &b);
            assert_null(b.oend);
            same_live(g, &a, &b);
            long k = same_ordered_end(g, &a);
            int sends = same_peers_and_inplace(g, &a, &b);
            unsigned off = 0;
            for (int i = 0; i < g->nnodes; i++) off |= 1u << (g->nodes[i].stream & 31);
            print_message("%s, %s, stage %d: %d nodes, streams 0x%x, %ld ordered_end answers, %d sends: equal\n", what,
                          sched == SCHED_LHS ? "lhs" : "fixed", s, g->nnodes, off, k, sends);
            copies |= off >> IR_STREAM_D2H & 1;
            streams_seen |= off;
            ir_live_free(&a), ir_live_free(&b);
        }
        assert_true(copies); /* the copy streams are there */
        ir_free(m);
    }
}

static void test_pipelines_with_offload(void **state) {
    (void)state;
    Options o;
    base(&o);
    o.pp = 2, o.micro_batches = 4, o.pp_schedule = PS_1F1B;
    compare(&o, "pp 2 1f1b m 4 offload all");
    base(&o);
    o.pp = 2, o.vpp = 2, o.micro_batches = 4, o.pp_schedule = PS_INTERLEAVED;
    compare(&o, "pp 2 interleaved vpp 2 m 4 offload all");
    base(&o);
    o.pp = 2, o.dp = 2, o.micro_batches = 2, o.pp_schedule = PS_ZBH1;
    compare(&o, "pp 2 dp 2 zb-h1 m 2 offload all");
    base(&o);
    o.pp = 2, o.tp = 2, o.micro_batches = 4, o.pp_schedule = PS_ZBV;
    compare(&o, "pp 2 tp 2 zb-v m 4 offload all");
    base(&o);
    o.cp = 2, o.cp_comm = 1, o.dp = 2;
    compare(&o, "cp 2 p2p dp 2 offload all");
    streams_seen = 0; /* lhs with tp's own comm stream (a budget it fits in) */
    base(&o);
    o.pp = 2, o.tp = 2, o.dp = 2, o.micro_batches = 2, o.pp_schedule = PS_1F1B, o.memory_budget = 1e9;
    compare(&o, "pp 2 tp 2 dp 2 1f1b m 2 offload all, two comm streams");
    assert_true(streams_seen >> IR_STREAM_TP & 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pipelines_with_offload),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
