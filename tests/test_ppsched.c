/* test_ppsched.c — the pipeline schedules (ppsched.c): generators, proofs,
 * timing.
 *
 * The orders are checked against references written outside the
 * generators: 1f1b and Megatron-LM's interleaved order for small shapes,
 * derived by hand from schedules.py (get_schedule_table, warm-up
 * (p−r−1)·2 + (v−1)·p), and ZB-V's rows as the Zero Bubble repository's
 * handcrafted_zb_v.py prints them for p=4, m=8 and m=5 (the padded case).
 * Every shape the schedules allow (p ≤ 16, v ≤ 4, m ≤ 64) must build,
 * prove, and time at equal costs to the closed form of
 * ppsched_bubble_formula (absolute 1e-12: both are a handful of integer
 * sums and one division); every shape they refuse must give the one-line
 * error naming the flag, against a predicate written here.  Hand-broken
 * plans (two actions swapped into a deadlock, one dropped, a backward moved
 * past the in-flight bound, an action run before its input, one run twice)
 * must be rejected with the rank, action and micro-batch named: the proof
 * can fail.
 *
 * PPSCHED_TABLES=1 prints the p=4, m=8 timelines of docs/pipeline.md.
 */
#include "testutil.h"
#include "ppsched.h"

#define TOL 1e-12

/* ---- helpers ---- */

static PpPlan build(PpSchedule s, int p, int v, int m) {
    PpPlan pl;
    char err[256];
    if (ppsched_build(&pl, s, p, v, m, err, sizeof err)) fail_msg("%s p=%d v=%d m=%d: %s", pp_schedule_names[s], p, v, m, err);
    return pl;
}

/* rank r's list as "F0.3 B1.2 ..." (kind, local virtual stage, mb) */
static void row(const PpPlan *pl, int r, char *buf, size_t len) {
    size_t n = 0;
    buf[0] = 0;
    for (int i = 0; i < pl->nact[r] && n < len; i++) {
        Action a = pl->act[r][i];
        n += snprintf(buf + n, len - n, "%s%s%d.%d", i ? " " : "", pp_act_names[a.kind], pp_chunk_vstage(pl, a.chunk), a.mb);
    }
}

static void expect_rows(PpSchedule s, int p, int v, int m, const char *const *want) {
    PpPlan pl = build(s, p, v, m);
    char got[4096];
    for (int r = 0; r < p; r++) {
        row(&pl, r, got, sizeof got);
        if (strcmp(got, want[r])) fail_msg("%s p=%d m=%d rank %d:\n got  %s\n want %s", pp_schedule_names[s], p, m, r, got, want[r]);
    }
    ppsched_free(&pl);
}

/* equal costs: F, B, W per chunk */
static double simulate(const PpPlan *pl, double tf, double tb, double tw, double latency, PpTimes *t) {
    int nc = pl->p * pl->v;
    double *c[3];
    for (int k = 0; k < 3; k++) {
        c[k] = malloc(nc * sizeof(double));
        for (int i = 0; i < nc; i++) c[k][i] = k == ACT_F ? tf : k == ACT_B ? tb : tw;
    }
    int rc = ppsched_simulate(pl, (const double *const *)c, latency, t);
    for (int k = 0; k < 3; k++) free(c[k]);
    assert_int_equal(rc, 0);
    return t->bubble;
}

static double bubble_of(PpSchedule s, int p, int v, int m, double tf, double tb, double tw) {
    PpPlan pl = build(s, p, v, m);
    PpTimes t;
    double b = simulate(&pl, tf, tb, tw, 0, &t);
    ppsched_times_free(&t);
    ppsched_free(&pl);
    return b;
}

/* ---- the orders against references ---- */

static void test_orders(void **state) {
    const char *f1b[] = {"F0.0 F0.1 B0.0 F0.2 B0.1 B0.2", "F0.0 B0.0 F0.1 B0.1 F0.2 B0.2"};
    expect_rows(PS_1F1B, 2, 0, 3, f1b);
    /* Megatron, p=2 v=2 m=4: forward table (mb, vs) = 00 10 01 11 20 30 21 31;
     * rank 0 warms up 2+2 forwards, rank 1 two */
    const char *il[] = {
        "F0.0 F0.1 F1.0 F1.1 F0.2 B1.0 F0.3 B1.1 F1.2 B0.0 F1.3 B0.1 B1.2 B1.3 B0.2 B0.3",
        "F0.0 F0.1 F1.0 B1.0 F1.1 B1.1 F0.2 B0.0 F0.3 B0.1 F1.2 B1.2 F1.3 B1.3 B0.2 B0.3",
    };
    expect_rows(PS_INTERLEAVED, 2, 2, 4, il);
    /* handcrafted_zb_v.py's get_zb_v_schedule(4, 8) and (4, 5) */
    const char *zv8[] = {
        "F0.0 F0.1 F0.2 F0.3 F0.4 F0.5 F0.6 F1.0 B1.0 W1.0 F1.1 B1.1 W1.1 F1.2 B1.2 W1.2 F1.3 B1.3 W1.3 F0.7 B0.0 W0.0 F1.4 B1.4 W1.4 B0.1 W0.1 F1.5 B1.5 W1.5 B0.2 W0.2 F1.6 B1.6 W1.6 B0.3 W0.3 F1.7 B1.7 W1.7 B0.4 W0.4 B0.5 W0.5 B0.6 W0.6 B0.7 W0.7",
        "F0.0 F0.1 F0.2 F0.3 F0.4 F1.0 F0.5 F1.1 B1.0 W1.0 F1.2 B1.1 W1.1 F1.3 B1.2 W1.2 F0.6 B0.0 W0.0 F1.4 B1.3 W1.3 F0.7 B0.1 W0.1 F1.5 B1.4 W1.4 B0.2 W0.2 F1.6 B1.5 W1.5 B0.3 W0.3 F1.7 B1.6 W1.6 B0.4 B1.7 B0.5 W0.4 B0.6 W0.5 B0.7 W0.6 W1.7 W0.7",
        "F0.0 F0.1 F0.2 F1.0 F0.3 F1.1 F0.4 F1.2 B1.0 W1.0 F1.3 B1.1 W1.1 F0.5 B0.0 W0.0 F1.4 B1.2 W1.2 F0.6 B0.1 W0.1 F1.5 B1.3 W1.3 F0.7 B0.2 W0.2 F1.6 B1.4 W1.4 B0.3 W0.3 F1.7 B1.5 W1.5 B0.4 B1.6 B0.5 B1.7 B0.6 W0.4 B0.7 W0.5 W1.6 W1.7 W0.6 W0.7",
        "F0.0 F1.0 F0.1 F1.1 F0.2 F1.2 F0.3 F1.3 B1.0 W1.0 F0.4 B0.0 W0.0 F1.4 B1.1 W1.1 F0.5 B0.1 W0.1 F1.5 B1.2 W1.2 F0.6 B0.2 W0.2 F1.6 B1.3 W1.3 F0.7 B0.3 W0.3 F1.7 B1.4 W1.4 B0.4 B1.5 B0.5 B1.6 B0.6 B1.7 B0.7 W0.4 W1.5 W1.6 W1.7 W0.5 W0.6 W0.7",
    };
    expect_rows(PS_ZBV, 4, 2, 8, zv8);
    const char *zv5[] = {
        "F0.0 F0.1 F0.2 F0.3 F0.4 F1.0 B1.0 W1.0 F1.1 B1.1 W1.1 F1.2 B1.2 W1.2 F1.3 B1.3 W1.3 B0.0 W0.0 F1.4 B1.4 W1.4 B0.1 W0.1 B0.2 W0.2 B0.3 W0.3 B0.4 W0.4",
        "F0.0 F0.1 F0.2 F0.3 F0.4 F1.0 F1.1 B1.0 W1.0 F1.2 B1.1 W1.1 F1.3 B1.2 W1.2 B0.0 W0.0 F1.4 B1.3 W1.3 B0.1 W0.1 B1.4 W1.4 B0.2 W0.2 B0.3 B0.4 W0.3 W0.4",
        "F0.0 F0.1 F0.2 F1.0 F0.3 F1.1 F0.4 F1.2 B1.0 W1.0 F1.3 B1.1 W1.1 B0.0 W0.0 F1.4 B1.2 W1.2 B0.1 W0.1 B1.3 W1.3 B0.2 W0.2 B1.4 W1.4 B0.3 B0.4 W0.3 W0.4",
        "F0.0 F1.0 F0.1 F1.1 F0.2 F1.2 F0.3 F1.3 B1.0 W1.0 F0.4 B0.0 W0.0 F1.4 B1.1 W1.1 B0.1 W0.1 B1.2 W1.2 B0.2 W0.2 B1.3 W1.3 B0.3 B1.4 B0.4 W0.3 W1.4 W0.4",
    };
    expect_rows(PS_ZBV, 4, 2, 5, zv5);
    /* ZB-H1, p=3 m=4: 1F1B's F/B order; W(i) after B(i + r) */
    const char *zh[] = {
        "F0.0 F0.1 F0.2 B0.0 W0.0 F0.3 B0.1 W0.1 B0.2 W0.2 B0.3 W0.3",
        "F0.0 F0.1 B0.0 F0.2 B0.1 W0.0 F0.3 B0.2 W0.1 B0.3 W0.2 W0.3",
        "F0.0 B0.0 F0.1 B0.1 F0.2 B0.2 W0.0 F0.3 B0.3 W0.1 W0.2 W0.3",
    };
    expect_rows(PS_ZBH1, 3, 0, 4, zh);
}

static void test_placement(void **state) {
    for (int s = 0; s < PS_COUNT; s++) {
        int v = s == PS_INTERLEAVED ? 3 : s == PS_ZBV ? 2 : 1;
        PpPlan pl = build(s, 4, v, 12);
        for (int r = 0; r < 4; r++)
            for (int j = 0; j < v; j++) {
                int c = pp_chunk(&pl, r, j);
                assert_true(c >= 0 && c < 4 * v);
                assert_int_equal(pp_chunk_rank(&pl, c), r);
                assert_int_equal(pp_chunk_vstage(&pl, c), j);
            }
        ppsched_free(&pl);
    }
    PpPlan pl = build(PS_ZBV, 4, 0, 4);
    /* the V: rank 0 holds the first and the last chunk, rank 3 the middle two */
    assert_int_equal(pp_chunk(&pl, 0, 1), 7);
    assert_int_equal(pp_chunk(&pl, 3, 0), 3);
    assert_int_equal(pp_chunk(&pl, 3, 1), 4);
    ppsched_free(&pl);
    PpPlan il = build(PS_INTERLEAVED, 4, 2, 4);
    assert_int_equal(pp_chunk(&il, 1, 1), 5);
    assert_int_equal(pp_chunk_rank(&il, 6), 2);
    ppsched_free(&il);
    for (int s = 0; s < PS_COUNT; s++) assert_int_equal(pp_schedule_lookup(pp_schedule_names[s]), s);
    assert_int_equal(pp_schedule_lookup("gpipe"), -1);
}

/* ---- every allowed shape ---- */

/* The predicate the errors are tested against, written from the issue. */
static const char *refusal(PpSchedule s, int p, int v, int m) {
    int vv = v ? v : s == PS_ZBV || s == PS_INTERLEAVED ? 2 : 1;
    if (p < 1) return "--pp";
    if (m < 1) return "--micro-batches";
    if (vv < 1) return "--vpp";
    if (m < p) return "is below --pp";
    if ((s == PS_1F1B || s == PS_ZBH1) && vv > 1) return "--vpp";
    if (s == PS_INTERLEAVED && vv < 2) return "--vpp 2";
    if (s == PS_INTERLEAVED && m % p) return "a multiple of --pp";
    if (s == PS_ZBV && vv != 2) return "zb-v needs --vpp 2";
    return NULL;
}

static double formula(PpSchedule s, int p, int v, int m) { return ppsched_bubble_formula(s, p, v, m, 1, 1, 1); }

static void test_all_shapes(void **state) {
    int built[PS_COUNT] = {0};
    char err[256];
    for (int s = 0; s < PS_COUNT; s++)
        for (int p = 1; p <= 16; p++)
            for (int v = 0; v <= 4; v++)
                for (int m = 1; m <= 64; m++) {
                    PpPlan pl;
                    int rc = ppsched_build(&pl, s, p, v, m, err, sizeof err);
                    if (refusal(s, p, v, m)) {
                        assert_int_equal(rc, -1);
                        continue;
                    }
                    if (rc) fail_msg("%s p=%d v=%d m=%d: %s", pp_schedule_names[s], p, v, m, err);
                    built[s]++;
                    if (v == 0) { /* the default: the same plan as its v, proven there */
                        assert_int_equal(pl.v, s == PS_ZBV || s == PS_INTERLEAVED ? 2 : 1);
                        ppsched_free(&pl);
                        continue;
                    }
                    if (ppsched_prove(&pl, err, sizeof err)) fail_msg("%s p=%d v=%d m=%d: %s", pp_schedule_names[s], p, v, m, err);
                    PpTimes t;
                    double b = simulate(&pl, 1, 1, 1, 0, &t), want = formula(s, p, pl.v, m);
                    if (fabs(b - want) > TOL)
                        fail_msg("%s p=%d v=%d m=%d: simulated bubble %.15g, closed form %.15g", pp_schedule_names[s], p, pl.v, m, b, want);
                    ppsched_times_free(&t);
                    ppsched_free(&pl);
                }
    /* 1f1b and zb-h1: sum over p of 64 − p + 1 shapes; interleaved: v = 2..4
     * times the multiples of p up to 64; zb-v: like 1f1b, v = 0 and 2 */
    int lin = 0, mult = 0;
    for (int p = 1; p <= 16; p++) lin += 65 - p, mult += 64 / p;
    assert_int_equal(built[PS_1F1B], 2 * lin);
    assert_int_equal(built[PS_ZBH1], 2 * lin);
    assert_int_equal(built[PS_INTERLEAVED], 4 * mult); /* v = 0 (2), 2, 3, 4 */
    assert_int_equal(built[PS_ZBV], 2 * lin);
}

static void test_errors(void **state) {
    char err[256];
    int n = 0;
    for (int s = 0; s < PS_COUNT; s++)
        for (int p = -1; p <= 9; p++)
            for (int v = -1; v <= 5; v++)
                for (int m = -1; m <= 20; m++) {
                    const char *want = refusal(s, p, v, m);
                    if (!want) continue;
                    PpPlan pl;
                    err[0] = 0;
                    assert_int_equal(ppsched_build(&pl, s, p, v, m, err, sizeof err), -1);
                    if (!strstr(err, want) || strchr(err, '\n'))
                        fail_msg("%s p=%d v=%d m=%d: \"%s\" should name \"%s\"", pp_schedule_names[s], p, v, m, err, want);
                    n++;
                }
    assert_true(n > 1000);
    PpPlan pl;
    ppsched_build(&pl, PS_1F1B, 4, 1, 3, err, sizeof err);
    assert_string_equal(err, "--micro-batches 3 is below --pp 4: a pipeline needs at least one micro-batch per stage");
    ppsched_build(&pl, PS_1F1B, 4, 2, 8, err, sizeof err);
    assert_string_equal(err, "--vpp 2 needs --pp-schedule interleaved or zb-v (1f1b runs one chunk per rank)");
    ppsched_build(&pl, PS_INTERLEAVED, 4, 2, 6, err, sizeof err);
    assert_string_equal(err, "--pp-schedule interleaved needs --micro-batches a multiple of --pp (6 is not a multiple of 4)");
    ppsched_build(&pl, PS_ZBV, 4, 3, 8, err, sizeof err);
    assert_string_equal(err, "--pp-schedule zb-v needs --vpp 2 (got 3)");
}

/* ---- the bound on in-flight micro-batches: met, and tight ---- */

static void test_inflight(void **state) {
    for (int s = 0; s < PS_COUNT; s++) {
        int v = s == PS_INTERLEAVED ? 2 : 0;
        PpPlan pl = build(s, 8, v, 32);
        ActKind last = s == PS_ZBH1 || s == PS_ZBV ? ACT_W : ACT_B;
        for (int r = 0; r < 8; r++) {
            int n = 0, peak = 0;
            for (int i = 0; i < pl.nact[r]; i++) {
                n += pl.act[r][i].kind == ACT_F ? 1 : pl.act[r][i].kind == last ? -1 : 0;
                peak = n > peak ? n : peak;
            }
            assert_int_equal(n, 0);
            assert_int_equal(peak, ppsched_inflight_bound(&pl, r));
        }
        ppsched_free(&pl);
    }
    PpPlan pl = build(PS_1F1B, 8, 0, 32);
    assert_int_equal(ppsched_inflight_bound(&pl, 0), 8);
    assert_int_equal(ppsched_inflight_bound(&pl, 7), 1);
    ppsched_free(&pl);
    pl = build(PS_INTERLEAVED, 4, 2, 8);
    assert_int_equal(ppsched_inflight_bound(&pl, 0), (4 - 1) * 2 + 4 + 1);
    assert_int_equal(ppsched_inflight_bound(&pl, 3), 4 + 1);
    ppsched_free(&pl);
}

/* ---- timing ---- */

/* p=2 m=2 1f1b, F=1 B=2, latency 0.5, by hand: rank 0 F0 [0,1] F1 [1,2]
 * B0 [5,7] B1 [8,10]; rank 1 F0 [1.5,2.5] B0 [2.5,4.5] F1 [4.5,5.5]
 * B1 [5.5,7.5]; busy 12 of 2·10. */
static void test_simulate_by_hand(void **state) {
    PpPlan pl = build(PS_1F1B, 2, 0, 2);
    PpTimes t;
    double b = simulate(&pl, 1, 2, 0, 0.5, &t);
    const double s0[] = {0, 1, 5, 8}, s1[] = {1.5, 2.5, 4.5, 5.5};
    for (int i = 0; i < 4; i++) {
        assert_true(fabs(t.start[t.off[0] + i] - s0[i]) < TOL);
        assert_true(fabs(t.start[t.off[1] + i] - s1[i]) < TOL);
    }
    assert_true(fabs(t.makespan - 10) < TOL);
    assert_true(fabs(b - 0.4) < TOL);
    ppsched_times_free(&t);
    ppsched_free(&pl);
}

/* The closed forms with unequal costs, where they are exact: 1f1b and
 * interleaved for any F, B; zb-h1 while W ≤ F and W ≤ B.  And a comparison
 * that must fail: zb-h1 with W > F is not its closed form. */
static void test_formula_costs(void **state) {
    const double cs[][3] = {{1, 2, 1}, {2, 1, 1}, {1, 1, 0.5}, {3, 5, 2}, {1, 3, 1}};
    for (int i = 0; i < 5; i++)
        for (int p = 2; p <= 8; p += 3)
            for (int m = p; m <= 4 * p; m += p) {
                double tf = cs[i][0], tb = cs[i][1], tw = cs[i][2];
                assert_true(fabs(bubble_of(PS_1F1B, p, 0, m, tf, tb, 0) - ppsched_bubble_formula(PS_1F1B, p, 0, m, tf, tb, 0)) < TOL);
                assert_true(fabs(bubble_of(PS_INTERLEAVED, p, 2, m, tf, tb, 0) - ppsched_bubble_formula(PS_INTERLEAVED, p, 2, m, tf, tb, 0)) < TOL);
                assert_true(fabs(bubble_of(PS_ZBH1, p, 0, m, tf, tb, tw) - ppsched_bubble_formula(PS_ZBH1, p, 0, m, tf, tb, tw)) < TOL);
            }
    assert_true(bubble_of(PS_ZBH1, 4, 0, 16, 1, 2, 2) - ppsched_bubble_formula(PS_ZBH1, 4, 0, 16, 1, 2, 2) > 0.01);
}

/* Zero bubble against 1F1B at the same work per micro-batch and stage:
 * F=B=W=1 for zb-h1, F=1 and B=2 (its B is B+W) for 1f1b, and per chunk
 * half of each for zb-v (two chunks a rank; the fraction does not depend
 * on the scale). */
static void test_zero_bubble_wins(void **state) {
    for (int p = 2; p <= 16; p++)
        for (int m = p; m <= 64; m++) {
            double b1 = bubble_of(PS_1F1B, p, 0, m, 1, 2, 0), bh = bubble_of(PS_ZBH1, p, 0, m, 1, 1, 1);
            double bv = bubble_of(PS_ZBV, p, 0, m, 0.5, 0.5, 0.5);
            if (m >= 2 * p && bh > b1 / 2 + TOL) fail_msg("p=%d m=%d: zb-h1 %.6f above half of 1f1b's %.6f", p, m, bh, b1);
            if (bv > bh + TOL) fail_msg("p=%d m=%d: zb-v %.6f above zb-h1's %.6f", p, m, bv, bh);
        }
}

/* ---- the lower bound on any order ---- */

/* Per-chunk costs (kind-major, nch chunks each) from a fixed LCG: F in
 * [0.2, 2], B and W in [0, 2]; with half the seeds chunk 0's B is 0 (the
 * first chunk sends no input gradient). */
static void random_costs(unsigned *seed, int nch, double *c[3]) {
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < nch; i++) {
            *seed = *seed * 1103515245u + 12345u;
            double u = (double)((*seed >> 8) & 0xffff) / 65536.0;
            c[k][i] = k == ACT_F ? 0.2 + 1.8 * u : 2 * u;
        }
    if (*seed & 0x100) c[ACT_B][0] = 0;
}

/* Rank r of a one-chunk zero-bubble plan rewritten (written here, not by
 * the generator) as 1F1B's F and B with W(i) after B(i + keep), the rest at
 * the end: keep = r is ZB-H1, keep = 0 runs each W right after its B. */
static void keep_order(PpPlan *pl, int r, int keep) {
    int m = pl->m, w = pl->p - r - 1 < m ? pl->p - r - 1 : m, n = 0, nw = 0;
    Action *a = pl->act[r];
    for (int i = 0; i < w; i++) a[n++] = (Action){ACT_F, r, i};
    for (int b = 0; b < m; b++) {
        if (w + b < m) a[n++] = (Action){ACT_F, r, w + b};
        a[n++] = (Action){ACT_B, r, b};
        if (b - nw >= keep) a[n++] = (Action){ACT_W, r, nw++};
    }
    while (nw < m) a[n++] = (Action){ACT_W, r, nw++};
    assert_int_equal(n, pl->nact[r]);
}

static double makespan(const PpPlan *pl, double *c[3], double latency) {
    PpTimes t;
    assert_int_equal(ppsched_simulate(pl, (const double *const *)c, latency, &t), 0);
    double T = t.makespan;
    ppsched_times_free(&t);
    return T;
}

/* Valid: no order is faster than ppsched_makespan_bound — every schedule
 * at p <= 6 with random costs and latencies, and every one-chunk
 * zero-bubble order of the keep family (each rank's keep in 0..r, all
 * proven) at p <= 4. */
static void test_bound_valid(void **state) {
    unsigned seed = 7;
    char err[256];
    for (int s = 0; s < PS_COUNT; s++)
        for (int p = 2; p <= 6; p++)
            for (int m = p; m <= 2 * p + 2; m++) {
                if (s == PS_INTERLEAVED && m % p) continue;
                PpPlan pl = build(s, p, s == PS_INTERLEAVED ? 2 : 0, m);
                int nch = p * pl.v;
                double *c[3];
                for (int k = 0; k < 3; k++) c[k] = malloc(nch * sizeof(double));
                for (int trial = 0; trial < 4; trial++) {
                    random_costs(&seed, nch, c);
                    double lat = 0.1 * (trial & 1), T = makespan(&pl, c, lat), lb = ppsched_makespan_bound(&pl, (const double *const *)c, lat);
                    if (lb > T * (1 + 1e-12)) fail_msg("%s p=%d m=%d: bound %.17g above the makespan %.17g", pp_schedule_names[s], p, m, lb, T);
                    if (s != PS_ZBH1 || p > 4) continue;
                    for (int code = 0, nk = 1; code < nk; code++) { /* every (keep_1, ..., keep_{p-1}) */
                        int x = code;
                        nk = 1;
                        for (int r = 0; r < p; r++) keep_order(&pl, r, x % (r + 1)), x /= r + 1, nk *= r + 1;
                        if (ppsched_prove(&pl, err, sizeof err)) fail_msg("keep variant %d of p=%d m=%d: %s", code, p, m, err);
                        double Tk = makespan(&pl, c, lat);
                        if (lb > Tk * (1 + 1e-12)) fail_msg("zb-h1 keep variant %d p=%d m=%d: bound %.17g above %.17g", code, p, m, lb, Tk);
                    }
                    for (int r = 0; r < p; r++) keep_order(&pl, r, r);
                }
                for (int k = 0; k < 3; k++) free(c[k]);
                ppsched_free(&pl);
            }
}

/* Tight: zb-h1 reaches the bound — no order under its in-flight bound is
 * faster — at equal costs, at bench/pipeline.sh's measured costs (P=2, ms
 * per micro-batch: rank 0 F 8.3 B 0 W 16.4, rank 1 8.6/9.85/7.75) and at
 * kiln plan's FLOPs for the same model at P=4 (MFLOP: F 223.1 223 223
 * 240.5, B 0 248.1 248.1 265.7, W 454.7 206.5 206.5 223.5), and with the
 * first stage a layer heavier (9 layers cut 5 | 4: F 5 4.15, B 0 5.26, W
 * 11.35 4.12; its idle is the warm-up wait for the first B, which the
 * bound's first-W term counts).  And the comparison can fail: the last rank running each W right after its B
 * (keep 0) is slower than the bound where the last stage sets the pace. */
static void test_bound_tight(void **state) {
    const double f2[] = {8.3, 8.6}, b2[] = {0, 9.85}, w2[] = {16.4, 7.75};
    const double f4[] = {223.1, 223, 223, 240.5}, b4[] = {0, 248.1, 248.1, 265.7}, w4[] = {454.7, 206.5, 206.5, 223.5};
    const double one[] = {1, 1, 1, 1}, f9[] = {5, 4.15}, b9[] = {0, 5.26}, w9[] = {11.35, 4.12};
    const double *const cs[][3] = {{f2, b2, w2}, {f4, b4, w4}, {one, one, one}, {f9, b9, w9}};
    const int ps[] = {2, 4, 4, 2};
    for (int i = 0; i < 4; i++)
        for (int m = ps[i]; m <= 32; m *= 2) {
            PpPlan pl = build(PS_ZBH1, ps[i], 0, m);
            double *c[3] = {(double *)cs[i][0], (double *)cs[i][1], (double *)cs[i][2]};
            double T = makespan(&pl, c, 0), lb = ppsched_makespan_bound(&pl, cs[i], 0);
            if (fabs(T - lb) > 1e-9 * T) fail_msg("zb-h1 p=%d m=%d costs %d: makespan %.17g, bound %.17g", ps[i], m, i, T, lb);
            keep_order(&pl, ps[i] - 1, 0); /* not with the first stage heavier: it sets the pace whatever the last does */
            if (i < 3 && !(makespan(&pl, c, 0) > lb * (1 + 1e-6))) fail_msg("keep 0 on the last rank p=%d m=%d costs %d meets the bound", ps[i], m, i);
            ppsched_free(&pl);
        }
}

/* ---- planted bugs: the proof must fail ---- */

static void swap(PpPlan *pl, int r, int i, int j) {
    Action t = pl->act[r][i];
    pl->act[r][i] = pl->act[r][j], pl->act[r][j] = t;
}

static int find(const PpPlan *pl, int r, ActKind k, int mb) {
    for (int i = 0; i < pl->nact[r]; i++)
        if (pl->act[r][i].kind == k && pl->act[r][i].mb == mb) return i;
    fail_msg("rank %d has no %s mb %d", r, pp_act_names[k], mb);
    return -1;
}

static void expect_rejected(const PpPlan *pl, const char *const *parts) {
    char err[512];
    assert_int_equal(ppsched_prove(pl, err, sizeof err), -1);
    for (; *parts; parts++)
        if (!strstr(err, *parts)) fail_msg("\"%s\" should name \"%s\"", err, *parts);
}

static void test_planted(void **state) {
    /* rank 1 of 1f1b p=4 waits for B mb 1 before it sends F mb 2, which
     * rank 2 needs before its B mb 1 */
    PpPlan pl = build(PS_1F1B, 4, 0, 8);
    swap(&pl, 1, find(&pl, 1, ACT_F, 2), find(&pl, 1, ACT_B, 1));
    const char *dl[] = {"deadlock:", "rank 1 waits at B chunk 1 mb 1 for rank 2 (B chunk 2 mb 1)",
                        "rank 2 waits at F chunk 2 mb 2 for rank 1 (F chunk 1 mb 2)", NULL};
    expect_rejected(&pl, dl);
    swap(&pl, 1, find(&pl, 1, ACT_F, 2), find(&pl, 1, ACT_B, 1));
    char err[512];
    assert_int_equal(ppsched_prove(&pl, err, sizeof err), 0);

    /* the last rank runs F mb 1 before B mb 0: two in flight, bound 1 */
    swap(&pl, 3, 1, 2);
    const char *fl[] = {"rank 3 holds 2 (chunk, micro-batch) pairs in flight at F chunk 3 mb 1 (action 1)", "bound 1", NULL};
    expect_rejected(&pl, fl);
    swap(&pl, 3, 1, 2);

    /* B before its own F */
    swap(&pl, 3, 0, 1);
    const char *lo[] = {"rank 3 runs B chunk 3 mb 0 (action 0) before F chunk 3 mb 0 (action 1)", NULL};
    expect_rejected(&pl, lo);
    swap(&pl, 3, 0, 1);

    /* one action dropped, one run twice, one on the wrong rank */
    int i = find(&pl, 2, ACT_B, 5);
    Action keep = pl.act[2][i];
    memmove(&pl.act[2][i], &pl.act[2][i + 1], (pl.nact[2] - i - 1) * sizeof(Action));
    pl.nact[2]--;
    const char *dr[] = {"rank 2 never runs B chunk 2 mb 5", NULL};
    expect_rejected(&pl, dr);
    pl.act[2][pl.nact[2]++] = pl.act[2][0];
    const char *tw[] = {"rank 2 runs F chunk 2 mb 0 twice", NULL};
    expect_rejected(&pl, tw);
    pl.act[2][pl.nact[2] - 1] = (Action){ACT_B, 1, 5};
    const char *wr[] = {"rank 2 runs B chunk 1 mb 5, but chunk 1 is on rank 1", NULL};
    expect_rejected(&pl, wr);
    pl.nact[2]--;
    memmove(&pl.act[2][i + 1], &pl.act[2][i], (pl.nact[2] - i) * sizeof(Action));
    pl.act[2][i] = keep, pl.nact[2]++;
    assert_int_equal(ppsched_prove(&pl, err, sizeof err), 0);
    ppsched_free(&pl);

    /* zb-h1: rank 0 puts off W mb 0 to the end and runs F mb 4 with five
     * micro-batches in flight */
    pl = build(PS_ZBH1, 4, 0, 8);
    i = find(&pl, 0, ACT_W, 0);
    keep = pl.act[0][i];
    memmove(&pl.act[0][i], &pl.act[0][i + 1], (pl.nact[0] - i - 1) * sizeof(Action));
    pl.act[0][pl.nact[0] - 1] = keep;
    const char *zw[] = {"rank 0 holds 5 (chunk, micro-batch) pairs in flight at F chunk 0 mb 4", "zb-h1's bound 4", NULL};
    expect_rejected(&pl, zw);
    ppsched_free(&pl);

    /* a W in a schedule without weight-gradient actions */
    pl = build(PS_INTERLEAVED, 2, 2, 2);
    pl.act[0][0].kind = ACT_W;
    const char *kw[] = {"rank 0 action 0: kind 2 chunk 0 mb 0 is not an action of interleaved", NULL};
    expect_rejected(&pl, kw);
    ppsched_free(&pl);
}

/* ---- the tables of docs/pipeline.md ---- */

/* Rank r's timeline at the given costs, one cell of 4 per time unit. */
static void timeline(const PpPlan *pl, const PpTimes *t, int r) {
    int now = 0;
    printf("    rank %d |", r);
    for (int i = 0; i < pl->nact[r]; i++) {
        Action a = pl->act[r][i];
        for (; now < (int)t->start[t->off[r] + i]; now++) printf("  . ");
        printf(" %c%-2d", pp_chunk_vstage(pl, a.chunk) ? *pp_act_names[a.kind] + 32 : *pp_act_names[a.kind], a.mb);
        now = (int)t->end[t->off[r] + i];
    }
    printf("\n");
}

static void test_tables(void **state) {
    int show = getenv("PPSCHED_TABLES") != NULL;
    /* makespans at unit costs, quoted in docs/pipeline.md */
    const double want[PS_COUNT] = {22, 38, 27, 51};
    for (int s = 0; s < PS_COUNT; s++) {
        PpPlan pl = build(s, 4, s == PS_INTERLEAVED ? 2 : 0, 8);
        PpTimes t;
        double b = simulate(&pl, 1, 1, 1, 0, &t);
        assert_true(fabs(t.makespan - want[s]) < TOL);
        if (show) {
            printf("\n%s p=4 v=%d m=8, unit costs: step %g, bubble %.4f\n", pp_schedule_names[s], pl.v, t.makespan, b);
            for (int r = 0; r < 4; r++) timeline(&pl, &t, r);
        }
        ppsched_times_free(&t);
        ppsched_free(&pl);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_orders),
        cmocka_unit_test(test_placement),
        cmocka_unit_test(test_all_shapes),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_inflight),
        cmocka_unit_test(test_simulate_by_hand),
        cmocka_unit_test(test_formula_costs),
        cmocka_unit_test(test_zero_bubble_wins),
        cmocka_unit_test(test_bound_valid),
        cmocka_unit_test(test_bound_tight),
        cmocka_unit_test(test_planted),
        cmocka_unit_test(test_tables),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
