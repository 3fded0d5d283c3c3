/* test_interp.c — the reference interpreter against independent references.
 *
 * Graphs are built by hand with ir_add_node.  Each op is checked against a
 * naive reimplementation written here (naive softmax without max-shift,
 * explicit index formulas) or against numbers worked out by hand; the SPMD
 * machinery (collectives, groups, send/recv, deadlock) on small meshes.
 * Unless a test says otherwise it runs in f64 mode with tolerance 1e-12.
 */
#include "testutil.h"
#include "graphbuild.h"

#include <time.h>

/* ---- building graphs (graphbuild.h) ---- */

static Bld bld(int dp, int cp, int tp) {
    Bld b = bld_new("t", "t.lua");
    b.m->mesh[1] = dp;
    b.m->mesh[2] = cp;
    b.m->mesh[3] = tp;
    return b;
}

/* ---- running ---- */

static void set(Interp *it, int rank, const char *name, const double *d, int64_t n) {
    if (interp_set_input(it, rank, name, d, n) != 0) fail_msg("set_input %s on rank %d failed", name, rank);
}

static void run_ok(Interp *it) {
    char err[1024];
    if (interp_run(it, err, sizeof err) != 0) fail_msg("interp_run: %s", err);
}

static const double *out(Interp *it, int rank, const char *name) {
    const Tensor *t = interp_output(it, rank, name);
    if (!t) fail_msg("no output %s on rank %d", name, rank);
    return t->d;
}

static void near(const double *got, const double *want, int64_t n, double tol) {
    double e = rel_err(got, want, n, 1.0);
    if (!(e <= tol)) {
        for (int64_t i = 0; i < n; i++) fprintf(stderr, "  [%lld] got %.17g want %.17g\n", (long long)i, got[i], want[i]);
        fail_msg("relative error %g > %g", e, tol);
    }
}

/* deterministic values in [-1, 1) */
static void fill(double *d, int64_t n, uint32_t seed) {
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        d[i] = (seed >> 8) * (2.0 / 16777216.0) - 1;
    }
}

/* ---- collectives ---- */

static void test_collectives_dp4(void **st) {
    Bld b = bld(4, 1, 1);
    int x = input(&b, "x", TY(DT_F32, 4, 2));
    output(&b, val(&b, OP_allreduce, INS(x), ATS(as(&b, "group", "dp"))), "ar");
    output(&b, val(&b, OP_reducescatter, INS(x), ATS(as(&b, "group", "dp"), ai(&b, "dim", 0))), "rs");
    output(&b, val(&b, OP_allgather, INS(x), ATS(as(&b, "group", "dp"), ai(&b, "dim", 1))), "ag");
    Interp *it = interp_new(b.m, 1);
    double xs[4][8];
    for (int r = 0; r < 4; r++) {
        for (int i = 0; i < 8; i++) xs[r][i] = 10 * r + i; /* rank r: x[i,j] = 10r + 2i + j */
        set(it, r, "x", xs[r], 8);
    }
    run_ok(it);
    for (int r = 0; r < 4; r++) {
        double ar[8], rs[2], ag[32];
        for (int i = 0; i < 8; i++) ar[i] = 60 + 4 * i;       /* sum over r */
        for (int j = 0; j < 2; j++) rs[j] = ar[2 * r + j];    /* row r of the sum */
        for (int i = 0; i < 4; i++)                           /* [4, 8]: cols 2q..2q+1 from rank q */
            for (int q = 0; q < 4; q++)
                for (int j = 0; j < 2; j++) ag[i * 8 + 2 * q + j] = xs[q][2 * i + j];
        near(out(it, r, "ar"), ar, 8, 0);
        near(out(it, r, "rs"), rs, 2, 0);
        near(out(it, r, "ag"), ag, 32, 0);
        assert_int_equal(interp_output(it, r, "ag")->t.dim[1], 8);
    }
    interp_free(it);
    ir_free(b.m);
}

static void test_collectives_2axis(void **st) {
    Bld b = bld(2, 2, 1); /* rank = 2*dp + cp */
    int mem[4], idx;
    assert_int_equal(ir_group_members(b.m, 1, ir_group_mask("cp"), mem, &idx), 2);
    assert_true(mem[0] == 0 && mem[1] == 1 && idx == 1);
    assert_int_equal(ir_group_members(b.m, 1, ir_group_mask("dp"), mem, &idx), 2);
    assert_true(mem[0] == 1 && mem[1] == 3 && idx == 0);
    int x = input(&b, "x", TY(DT_F32, 1));
    output(&b, val(&b, OP_allreduce, INS(x), ATS(as(&b, "group", "cp"))), "cp");
    output(&b, val(&b, OP_allreduce, INS(x), ATS(as(&b, "group", "dp"))), "dp");
    output(&b, val(&b, OP_allreduce, INS(x), ATS(as(&b, "group", "dp+cp"))), "all");
    output(&b, val(&b, OP_allgather, INS(x), ATS(as(&b, "group", "dp"), ai(&b, "dim", 0))), "gdp");
    output(&b, val(&b, OP_reducescatter, INS(val(&b, OP_broadcast, INS(x), ATS(shape(&b, TY(DT_F32, 2))))),
                   ATS(as(&b, "group", "cp"), ai(&b, "dim", 0))),
           "rscp");
    Interp *it = interp_new(b.m, 1);
    for (int r = 0; r < 4; r++) set(it, r, "x", (double[]){1 << r}, 1); /* distinct bits */
    run_ok(it);
    static const double cp[4] = {3, 3, 12, 12}, dp[4] = {5, 10, 5, 10};
    for (int r = 0; r < 4; r++) {
        assert_true(out(it, r, "cp")[0] == cp[r]);
        assert_true(out(it, r, "dp")[0] == dp[r]);
        assert_true(out(it, r, "all")[0] == 15);
        assert_true(out(it, r, "rscp")[0] == cp[r]);
    }
    near(out(it, 1, "gdp"), (double[]){2, 8}, 2, 0); /* dp group of rank 1 is {1, 3} */
    near(out(it, 2, "gdp"), (double[]){1, 4}, 2, 0);
    interp_free(it);
    ir_free(b.m);
}

/* Each rank passes its running buffer to cp-rank i+1 three times: afterwards
 * every rank has summed all four ranks' values. */
static void test_ring_shift(void **st) {
    Bld b = bld(1, 4, 1);
    int x = input(&b, "x", TY(DT_F32, 2)), cur = x, acc = x;
    for (int step = 0; step < 3; step++) {
        node(&b, OP_send, INS(cur), ATS(as(&b, "group", "cp"), ai(&b, "peer", 1), ai(&b, "tag", step)), NULL);
        Type t = TY(DT_F32, 2);
        cur = ir_out(b.g, node(&b, OP_recv, NULL, 0, ATS(as(&b, "group", "cp"), ai(&b, "peer", -1), ai(&b, "tag", step)), &t));
        if (step == 0) output(&b, cur, "first");
        acc = val(&b, OP_add, INS(acc, cur), NOATS);
    }
    output(&b, acc, "sum");
    Interp *it = interp_new(b.m, 0);
    for (int r = 0; r < 4; r++) set(it, r, "x", (double[]){r, 100 * r}, 2);
    run_ok(it);
    for (int r = 0; r < 4; r++) {
        int from = (r + 3) % 4;
        near(out(it, r, "first"), (double[]){from, 100 * from}, 2, 0);
        near(out(it, r, "sum"), (double[]){6, 600}, 2, 0);
    }
    run_ok(it); /* a second step works the same */
    near(out(it, 2, "sum"), (double[]){6, 600}, 2, 0);
    interp_free(it);
    ir_free(b.m);
}

static void test_deadlock(void **st) {
    Bld b = bld(1, 4, 1);
    Type t = TY(DT_F32, 2);
    int r = ir_out(b.g, node(&b, OP_recv, NULL, 0, ATS(as(&b, "group", "cp"), ai(&b, "peer", 1), ai(&b, "tag", 0)), &t));
    output(&b, r, "r");
    Interp *it = interp_new(b.m, 0);
    char err[1024];
    assert_int_equal(interp_run(it, err, sizeof err), -1);
    assert_non_null(strstr(err, "deadlock: rank 0 waits at recv from rank 1, tag 0, mb 0 (t.lua:1)"));
    assert_non_null(strstr(err, "rank 3 waits at recv from rank 0, tag 0, mb 0 (t.lua:1)"));
    interp_free(it);
    ir_free(b.m);

    /* a send nobody receives is an error too */
    b = bld(1, 2, 1);
    int x = input(&b, "x", TY(DT_F32, 1));
    node(&b, OP_send, INS(x), ATS(as(&b, "group", "cp"), ai(&b, "peer", 1), ai(&b, "tag", 5)), NULL);
    it = interp_new(b.m, 0);
    for (int k = 0; k < 2; k++) set(it, k, "x", (double[]){1}, 1);
    assert_int_equal(interp_run(it, err, sizeof err), -1);
    assert_non_null(strstr(err, "never received"));
    interp_free(it);
    ir_free(b.m);
}

/* a recv whose message has the wrong size */
static void test_recv_size_mismatch(void **st) {
    Bld b = bld(1, 2, 1);
    int x = input(&b, "x", TY(DT_F32, 3));
    node(&b, OP_send, INS(x), ATS(as(&b, "group", "cp"), ai(&b, "peer", 1), ai(&b, "tag", 0)), NULL);
    Type t = TY(DT_F32, 2);
    output(&b, ir_out(b.g, node(&b, OP_recv, NULL, 0, ATS(as(&b, "group", "cp"), ai(&b, "peer", 1), ai(&b, "tag", 0)), &t)), "r");
    Interp *it = interp_new(b.m, 0);
    for (int k = 0; k < 2; k++) set(it, k, "x", (double[]){1, 2, 3}, 3);
    char err[1024];
    assert_int_equal(interp_run(it, err, sizeof err), -1);
    assert_non_null(strstr(err, "t.lua:3: recv:"));
    interp_free(it);
    ir_free(b.m);
}

/* pp=2: rank r runs stage r; stage 0 sends to stage 1 over the pp group.
 * Then a collective where the two ranks disagree on the op is an error. */
static void test_pipeline_stages(void **st) {
    for (int mismatch = 0; mismatch < 2; mismatch++) {
        Bld b = bld(1, 1, 1);
        b.m->mesh[0] = 2;
        b.m->nstages = 2;
        Graph **stages = ir_alloc(b.m, 2 * sizeof(Graph *));
        stages[0] = b.g;
        stages[1] = ir_graph_new(b.m);
        b.m->stages = stages;
        Type t = TY(DT_F32, 2);
        int x = input(&b, "x", t);
        node(&b, OP_send, INS(x), ATS(as(&b, "group", "pp"), ai(&b, "peer", 1), ai(&b, "tag", 3)), NULL);
        if (mismatch) val(&b, OP_allreduce, INS(x), ATS(as(&b, "group", "pp")));
        b.g = stages[1];
        int y = ir_out(b.g, node(&b, OP_recv, NULL, 0, ATS(as(&b, "group", "pp"), ai(&b, "peer", -1), ai(&b, "tag", 3)), &t));
        int y2 = val(&b, OP_add, INS(y, y), NOATS);
        output(&b, y2, "y");
        if (mismatch) val(&b, OP_allgather, INS(y), ATS(as(&b, "group", "pp"), ai(&b, "dim", 0)));
        Interp *it = interp_new(b.m, 0);
        set(it, 0, "x", (double[]){1.5, -2}, 2);
        assert_int_equal(interp_set_input(it, 1, "x", (double[]){1, 2}, 2), -1); /* stage 1 has no input x */
        char err[1024];
        if (!mismatch) {
            run_ok(it);
            near(out(it, 1, "y"), (double[]){3, -4}, 2, 0);
            near(interp_value(it, 1, y)->d, (double[]){1.5, -2}, 2, 0); /* every value is kept */
            assert_null(interp_output(it, 0, "y"));
        } else {
            assert_int_equal(interp_run(it, err, sizeof err), -1);
            assert_non_null(strstr(err, "collective mismatch: rank 0 at allreduce (t.lua:3), rank 1 at allgather (t.lua:7)"));
        }
        interp_free(it);
        ir_free(b.m);
    }
}

/* ---- state, inputs, rounding ---- */

static void test_assign_commits_after_step(void **st) {
    Bld b = bld(1, 1, 1);
    int s = state(&b, "s", TY(DT_F32, 2));
    int one = cnst(&b, TY(DT_F32, 2), 1);
    assign(&b, val(&b, OP_add, INS(s, one), NOATS), "s");
    output(&b, state(&b, "s", TY(DT_F32, 2)), "read_after_assign");
    Interp *it = interp_new(b.m, 0);
    interp_init_state(it, 1);
    run_ok(it);
    near(out(it, 0, "read_after_assign"), (double[]){0, 0}, 2, 0);
    near(interp_state(it, 0, "s")->d, (double[]){1, 1}, 2, 0);
    run_ok(it);
    near(out(it, 0, "read_after_assign"), (double[]){1, 1}, 2, 0);
    near(interp_state(it, 0, "s")->d, (double[]){2, 2}, 2, 0);
    interp_free(it);
    ir_free(b.m);
}

static void test_input_errors(void **st) {
    Bld b = bld(2, 1, 1);
    int x = input(&b, "tokens", TY(DT_I32, 3));
    output(&b, x, "x");
    Interp *it = interp_new(b.m, 0);
    char err[1024];
    assert_int_equal(interp_run(it, err, sizeof err), -1);
    assert_string_equal(err, "input tokens not set on rank 0");
    assert_int_equal(interp_set_input(it, 0, "tokens", (double[]){1, 2}, 2), -1);
    assert_int_equal(interp_set_input(it, 0, "nope", (double[]){1, 2, 3}, 3), -1);
    set(it, 0, "tokens", (double[]){1, 2, 3}, 3);
    assert_int_equal(interp_run(it, err, sizeof err), -1);
    assert_string_equal(err, "input tokens not set on rank 1");
    interp_free(it);
    ir_free(b.m);
}

static void test_f32_rounding(void **st) {
    Bld b = bld(1, 1, 1);
    int x = input(&b, "x", TY(DT_F32, 1));
    output(&b, val(&b, OP_mul, INS(x, x), NOATS), "sq");
    int y = input(&b, "y", TY(DT_F32, 3));
    output(&b, val(&b, OP_cast, INS(y), ATS(as(&b, "dtype", "bf16"))), "bf16");
    output(&b, val(&b, OP_cast, INS(y), ATS(as(&b, "dtype", "f16"))), "f16");
    output(&b, val(&b, OP_cast, INS(y), ATS(as(&b, "dtype", "i32"))), "i32");
    /* bf16 spacing at 1 is 2^-7, f16's 2^-10: ties go to even */
    double ys[3] = {1 + 0x1p-8, 1 + 3 * 0x1p-8, -2.75 - 0x1p-11};
    double res[2];
    for (int f64 = 0; f64 < 2; f64++) {
        Interp *it = interp_new(b.m, f64);
        set(it, 0, "x", (double[]){0.1}, 1);
        set(it, 0, "y", ys, 3);
        run_ok(it);
        res[f64] = out(it, 0, "sq")[0];
        if (!f64) {
            near(out(it, 0, "bf16"), (double[]){1, 1 + 0x1p-6, -2.75}, 3, 0);
            near(out(it, 0, "f16"), (double[]){1 + 0x1p-8, 1 + 3 * 0x1p-8, -2.75}, 3, 0); /* f16 spacing at 2.75 is 2^-9 */
        } else {
            near(out(it, 0, "bf16"), ys, 3, 0); /* f64 mode rounds no float */
        }
        near(out(it, 0, "i32"), (double[]){1, 1, -2}, 3, 0);
        interp_free(it);
    }
    float xf = 0.1f;
    assert_true(res[0] == (double)(float)((double)xf * xf));
    assert_true(res[1] == 0.1 * 0.1);
    assert_true(res[0] != res[1]);
    ir_free(b.m);
}

/* ---- matmul ---- */

/* element (i, j) of a logical [rows, cols] matrix stored transposed or not */
static double at2(const double *p, int64_t i, int64_t j, int64_t rows, int64_t cols, int trans) {
    return trans ? p[j * rows + i] : p[i * cols + j];
}

static void check_matmul(int batch_a, int batch_b, int ta, int tb) {
    const int64_t P = 3, M = 2, K = 5, N = 4;
    Bld b = bld(1, 1, 1);
    Type at = ta ? TY(DT_F32, P, K, M) : TY(DT_F32, P, M, K);
    Type bt = tb ? TY(DT_F32, P, N, K) : TY(DT_F32, P, K, N);
    if (!batch_a) { /* drop the batch dim */
        at.rank = 2;
        at.dim[0] = at.dim[1], at.dim[1] = at.dim[2];
    }
    if (!batch_b) {
        bt.rank = 2;
        bt.dim[0] = bt.dim[1], bt.dim[1] = bt.dim[2];
    }
    int a = input(&b, "a", at), w = input(&b, "b", bt);
    output(&b, val(&b, OP_matmul, INS(a, w), ATS(ai(&b, "ta", ta), ai(&b, "tb", tb))), "y");
    double A[3 * 2 * 5], B[3 * 5 * 4], want[3 * 2 * 4];
    fill(A, ir_numel(&at), 1);
    fill(B, ir_numel(&bt), 2);
    int64_t nb = batch_a ? P : 1;
    for (int64_t p = 0; p < nb; p++)
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                double s = 0;
                for (int64_t k = 0; k < K; k++)
                    s += at2(A + (batch_a ? p * M * K : 0), i, k, M, K, ta) * at2(B + (batch_b ? p * K * N : 0), k, j, K, N, tb);
                want[(p * M + i) * N + j] = s;
            }
    Interp *it = interp_new(b.m, 1);
    set(it, 0, "a", A, ir_numel(&at));
    set(it, 0, "b", B, ir_numel(&bt));
    run_ok(it);
    near(out(it, 0, "y"), want, nb * M * N, 1e-12);
    interp_free(it);
    ir_free(b.m);
}

static void test_matmul(void **st) {
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            check_matmul(0, 0, ta, tb); /* [M,K] x [K,N] */
            check_matmul(1, 1, ta, tb); /* batched both */
            check_matmul(1, 0, ta, tb); /* batched a, shared weight b */
        }
}

/* ---- attention ---- */

/* naive softmax(QK^T*scale)V, no max-shift; GQA head h reads kv head h/(H/KH);
 * causal: key s counts for query t iff kp[s] <= qp[t] (qp, kp NULL: s <= t),
 * and with window > 0 also qp[t] - kp[s] < window (t - s < window);
 * a row with no key: o = 0, lse = -inf.  S <= 16. */
static void attn_ref(const double *q, const double *k, const double *v, int B, int H, int KH, int T, int S, int D,
                     int causal, int window, double scale, const int *qp, const int *kp, double *o, double *lse) {
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++) {
                int kh = h / (H / KH);
                double z = 0, w[16];
                for (int s = 0; s < S; s++) {
                    double sc = 0;
                    for (int d = 0; d < D; d++) sc += q[((b * H + h) * T + t) * D + d] * k[((b * KH + kh) * S + s) * D + d];
                    int dist = qp ? qp[t] - kp[s] : t - s;
                    int masked = causal && (dist < 0 || (window > 0 && dist >= window));
                    w[s] = masked ? 0 : exp(sc * scale);
                    z += w[s];
                }
                for (int d = 0; d < D; d++) {
                    double acc = 0;
                    for (int s = 0; s < S && z > 0; s++) acc += w[s] / z * v[((b * KH + kh) * S + s) * D + d];
                    o[((b * H + h) * T + t) * D + d] = acc;
                }
                lse[(b * H + h) * T + t] = z > 0 ? log(z) : -INFINITY;
            }
}

/* near(), but infinities must match exactly (rel_err reads inf - inf = NaN as no error). */
static void near_inf(const double *got, const double *want, int64_t n, double tol) {
    for (int64_t i = 0; i < n; i++) {
        if (isnan(got[i])) fail_msg("[%lld] is NaN", (long long)i);
        if (isinf(want[i]) && got[i] != want[i]) fail_msg("[%lld] got %.17g want %g", (long long)i, got[i], want[i]);
        if (isinf(want[i])) continue;
        near(&got[i], &want[i], 1, tol);
    }
}

static void check_attention(int H, int KH, int causal, int explicit_scale) {
    enum { B = 2, T = 5, D = 3 };
    Bld b = bld(1, 1, 1);
    int q = input(&b, "q", TY(DT_F32, B, H, T, D));
    int k = input(&b, "k", TY(DT_F32, B, KH, T, D)), v = input(&b, "v", TY(DT_F32, B, KH, T, D));
    double scale = explicit_scale ? 0.7 : 1 / sqrt(D);
    int n = explicit_scale ? node(&b, OP_attention, INS(q, k, v), ATS(ai(&b, "causal", causal), af(&b, "scale", 0.7)), NULL)
                           : node(&b, OP_attention, INS(q, k, v), ATS(ai(&b, "causal", causal)), NULL);
    output(&b, b.g->nodes[n].out[0], "o");
    output(&b, b.g->nodes[n].out[1], "lse");
    double Q[B * 4 * T * D], K[B * 4 * T * D], V[B * 4 * T * D], O[B * 4 * T * D], L[B * 4 * T];
    fill(Q, B * H * T * D, 3);
    fill(K, B * KH * T * D, 4);
    fill(V, B * KH * T * D, 5);
    attn_ref(Q, K, V, B, H, KH, T, T, D, causal, 0, scale, NULL, NULL, O, L);
    Interp *it = interp_new(b.m, 1);
    set(it, 0, "q", Q, B * H * T * D);
    set(it, 0, "k", K, B * KH * T * D);
    set(it, 0, "v", V, B * KH * T * D);
    run_ok(it);
    near(out(it, 0, "o"), O, B * H * T * D, 1e-12);
    near(out(it, 0, "lse"), L, B * H * T, 1e-12);
    interp_free(it);
    ir_free(b.m);
}

static void test_attention(void **st) {
    for (int causal = 0; causal < 2; causal++) {
        check_attention(2, 2, causal, 1);
        check_attention(4, 2, causal, 1); /* GQA: heads 0,1 -> kv 0; 2,3 -> kv 1 */
        check_attention(4, 1, causal, 0); /* MQA, default scale 1/sqrt(D) */
    }
}

/* With causal s<=t and T==S (ir_infer's rule) every query sees key 0, so a
 * row with no key can only come from scores that are all -inf: it must give
 * o=0 and lse=-inf, not NaN, in the forward and a zero gradient backward. */
static void test_attention_masked_row(void **st) {
    Bld b = bld(1, 1, 1);
    Type qt = TY(DT_F32, 1, 1, 2, 2);
    int q = input(&b, "q", qt), k = input(&b, "k", qt), v = input(&b, "v", qt);
    int n = node(&b, OP_attention, INS(q, k, v), ATS(ai(&b, "causal", 0)), NULL);
    int o = b.g->nodes[n].out[0], lse = b.g->nodes[n].out[1];
    output(&b, o, "o");
    output(&b, lse, "lse");
    int nb = node(&b, OP_attention_bwd, INS(v, q, k, v, o, lse), ATS(ai(&b, "causal", 0)), NULL);
    output(&b, b.g->nodes[nb].out[0], "dq");
    Interp *it = interp_new(b.m, 0);
    set(it, 0, "q", (double[]){-INFINITY, -INFINITY, 0.5, 0.25}, 4);
    set(it, 0, "k", (double[]){1, 2, 3, 4}, 4);
    set(it, 0, "v", (double[]){1, 2, 3, 4}, 4);
    run_ok(it);
    const double *O = out(it, 0, "o"), *L = out(it, 0, "lse"), *dq = out(it, 0, "dq");
    assert_true(O[0] == 0 && O[1] == 0);
    assert_true(isinf(L[0]) && L[0] < 0);
    assert_true(isfinite(L[1]) && isfinite(O[2]) && isfinite(O[3]));
    assert_true(dq[0] == 0 && dq[1] == 0 && isfinite(dq[2]));
    interp_free(it);
    ir_free(b.m);
}

/* ---- attention with token positions (context parallelism) ---- */

/* attention(q, k, v, qpos, kpos) with T queries at positions qp and S keys at
 * kp (GQA: 4 query heads on 2 kv heads), against attn_ref. */
static void check_attention_pos(int causal, int window, int T, const int *qp, int S, const int *kp) {
    enum { B = 2, H = 4, KH = 2, D = 3, MAXT = 8 };
    Bld b = bld(1, 1, 1);
    int q = input(&b, "q", TY(DT_F32, B, H, T, D));
    int k = input(&b, "k", TY(DT_F32, B, KH, S, D)), v = input(&b, "v", TY(DT_F32, B, KH, S, D));
    int qpos = input(&b, "qpos", TY(DT_I32, T)), kpos = input(&b, "kpos", TY(DT_I32, S));
    int n = node(&b, OP_attention, INS(q, k, v, qpos, kpos),
                 ATS(ai(&b, "causal", causal), af(&b, "scale", 0.8), ai(&b, "window", window)), NULL);
    output(&b, b.g->nodes[n].out[0], "o");
    output(&b, b.g->nodes[n].out[1], "lse");
    double Q[B * H * MAXT * D], K[B * KH * MAXT * D], V[B * KH * MAXT * D], O[B * H * MAXT * D], L[B * H * MAXT];
    double QP[MAXT], KP[MAXT];
    assert_true(T <= MAXT && S <= MAXT);
    fill(Q, B * H * T * D, 13);
    fill(K, B * KH * S * D, 14);
    fill(V, B * KH * S * D, 15);
    for (int i = 0; i < T; i++) QP[i] = qp[i];
    for (int i = 0; i < S; i++) KP[i] = kp[i];
    attn_ref(Q, K, V, B, H, KH, T, S, D, causal, window, 0.8, qp, kp, O, L);
    for (int f64 = 0; f64 < 2; f64++) {
        Interp *it = interp_new(b.m, f64);
        set(it, 0, "q", Q, B * H * T * D);
        set(it, 0, "k", K, B * KH * S * D);
        set(it, 0, "v", V, B * KH * S * D);
        set(it, 0, "qpos", QP, T);
        set(it, 0, "kpos", KP, S);
        run_ok(it);
        double tol = f64 ? 1e-12 : 1e-5; /* f32 mode rounds q, k, v and the results to float */
        near_inf(out(it, 0, "o"), O, B * H * T * D, tol);
        near_inf(out(it, 0, "lse"), L, B * H * T, tol);
        interp_free(it);
    }
    ir_free(b.m);
}

static void test_attention_positions(void **st) {
    /* cp rank 0 of 2 holds chunks 0 and 3 of a length-8 sequence: q at {0,1,6,7} */
    static const int own[4] = {0, 1, 6, 7}, own_shuffled[4] = {6, 0, 7, 1}, other[4] = {2, 3, 4, 5};
    static const int q4[4] = {5, 2, 4, 3}, k6[6] = {6, 0, 3, 7, 1, 4};
    for (int causal = 0; causal < 2; causal++) {
        check_attention_pos(causal, 0, 4, own, 4, own_shuffled); /* its own K/V, keys in another order */
        check_attention_pos(causal, 0, 4, own, 4, other); /* rank 1's block: queries 0, 1 see no key */
        check_attention_pos(causal, 0, 4, q4, 6, k6);     /* S != T, both permuted */
    }
}

/* Sliding-window attention, against attn_ref: by index (T = 7, windows 1,
 * 3, 7 and one longer than the sequence) and by position (cp chunks and a
 * block of another rank: with window 3 query 6 sees keys 4, 5 of {2,3,4,5}
 * and queries 0, 1 none). */
static void test_attention_window(void **st) {
    enum { B = 2, H = 4, KH = 2, T = 7, D = 3 };
    static const int wins[] = {1, 3, 7, 9};
    for (size_t w = 0; w < sizeof wins / sizeof wins[0]; w++) {
        Bld b = bld(1, 1, 1);
        int q = input(&b, "q", TY(DT_F32, B, H, T, D));
        int k = input(&b, "k", TY(DT_F32, B, KH, T, D)), v = input(&b, "v", TY(DT_F32, B, KH, T, D));
        int n = node(&b, OP_attention, INS(q, k, v), ATS(ai(&b, "causal", 1), af(&b, "scale", 0.7), ai(&b, "window", wins[w])),
                     NULL);
        output(&b, b.g->nodes[n].out[0], "o");
        output(&b, b.g->nodes[n].out[1], "lse");
        double Q[B * H * T * D], K[B * KH * T * D], V[B * KH * T * D], O[B * H * T * D], L[B * H * T];
        fill(Q, B * H * T * D, 23);
        fill(K, B * KH * T * D, 24);
        fill(V, B * KH * T * D, 25);
        attn_ref(Q, K, V, B, H, KH, T, T, D, 1, wins[w], 0.7, NULL, NULL, O, L);
        Interp *it = interp_new(b.m, 1);
        set(it, 0, "q", Q, B * H * T * D);
        set(it, 0, "k", K, B * KH * T * D);
        set(it, 0, "v", V, B * KH * T * D);
        run_ok(it);
        near(out(it, 0, "o"), O, B * H * T * D, 1e-12);
        near(out(it, 0, "lse"), L, B * H * T, 1e-12);
        interp_free(it);
        ir_free(b.m);
    }
    static const int own[4] = {0, 1, 6, 7}, own_shuffled[4] = {6, 0, 7, 1}, other[4] = {2, 3, 4, 5};
    static const int q4[4] = {5, 2, 4, 3}, k6[6] = {6, 0, 3, 7, 1, 4};
    for (int win = 1; win <= 4; win++) {
        check_attention_pos(1, win, 4, own, 4, own_shuffled);
        check_attention_pos(1, win, 4, own, 4, other);
        check_attention_pos(1, win, 4, q4, 6, k6);
    }
}

/* attn_merge (ring attention's log-sum-exp merge): attention to keys split
 * into two blocks, merged, equals attention to all of them, on random data,
 * with causal masking by position such that some rows see no key of the
 * first block but some of the second, and one row no key at all (o = 0,
 * lse = -inf, no NaN: the bug class of Megatron-LM issue 1764). */
static void test_attn_merge(void **st) {
    enum { B = 2, H = 4, KH = 2, T = 5, S = 6, S1 = 3, D = 3 };
    static const double qp[T] = {-1, 0, 2, 4, 9}, kp[S] = {3, 5, 4, 0, 1, 2};
    Bld b = bld(1, 1, 1);
    Type qt = TY(DT_F32, B, H, T, D), kt = TY(DT_F32, B, KH, S, D);
    int q = input(&b, "q", qt), k = input(&b, "k", kt), v = input(&b, "v", kt);
    int qpos = input(&b, "qpos", TY(DT_I32, T)), kpos = input(&b, "kpos", TY(DT_I32, S));
    Attr causal = ai(&b, "causal", 1);
    int full = node(&b, OP_attention, INS(q, k, v, qpos, kpos), &causal, 1, NULL), part[2];
    for (int p = 0; p < 2; p++) { /* keys [0, S1) and [S1, S) */
        Attr at[3] = {ai(&b, "dim", 2), ai(&b, "start", p ? S1 : 0), ai(&b, "end", p ? S : S1)};
        Attr a0[3] = {ai(&b, "dim", 0), ai(&b, "start", p ? S1 : 0), ai(&b, "end", p ? S : S1)};
        int kb = val(&b, OP_slice, INS(k), at, 3), vb = val(&b, OP_slice, INS(v), at, 3), pb = val(&b, OP_slice, INS(kpos), a0, 3);
        part[p] = node(&b, OP_attention, INS(q, kb, vb, qpos, pb), &causal, 1, NULL);
    }
    const Node *pa = &b.g->nodes[part[0]], *pb = &b.g->nodes[part[1]];
    int mg = node(&b, OP_attn_merge, INS(pa->out[0], pa->out[1], pb->out[0], pb->out[1]), NOATS, NULL);
    output(&b, b.g->nodes[full].out[0], "o"), output(&b, b.g->nodes[full].out[1], "lse");
    output(&b, b.g->nodes[mg].out[0], "mo"), output(&b, b.g->nodes[mg].out[1], "mlse");
    output(&b, pa->out[1], "lse_a"), output(&b, pb->out[1], "lse_b");
    double Q[B * H * T * D], K[B * KH * S * D], V[B * KH * S * D];
    fill(Q, B * H * T * D, 31), fill(K, B * KH * S * D, 32), fill(V, B * KH * S * D, 33);
    for (int i = 0; i < B * KH * S * D; i++) K[i] *= 8; /* spread the scores: exp() would overflow unshifted in f32 */
    for (int f64 = 0; f64 < 2; f64++) {
        Interp *it = interp_new(b.m, f64);
        set(it, 0, "q", Q, B * H * T * D), set(it, 0, "k", K, B * KH * S * D), set(it, 0, "v", V, B * KH * S * D);
        set(it, 0, "qpos", qp, T), set(it, 0, "kpos", kp, S);
        run_ok(it);
        const double *o = out(it, 0, "o"), *mo = out(it, 0, "mo"), *lse = out(it, 0, "lse"), *mlse = out(it, 0, "mlse");
        const double *la = out(it, 0, "lse_a"), *lb = out(it, 0, "lse_b");
        int masked_a = 0, masked_b = 0, masked_all = 0;
        for (int r = 0; r < B * H * T; r++) {
            masked_a += la[r] == -INFINITY, masked_b += lb[r] == -INFINITY, masked_all += lse[r] == -INFINITY;
            if (isnan(mlse[r]) || (lse[r] == -INFINITY) != (mlse[r] == -INFINITY)) fail_msg("row %d: lse %g, merged %g", r, lse[r], mlse[r]);
            if (lse[r] > -INFINITY && fabs(mlse[r] - lse[r]) > (f64 ? 1e-12 : 1e-5) * (1 + fabs(lse[r]))) fail_msg("row %d: lse %.17g merged %.17g", r, lse[r], mlse[r]);
        }
        for (int i = 0; i < B * H * T * D; i++)
            if (isnan(mo[i])) fail_msg("merged o[%d] is NaN", i);
        near(mo, o, B * H * T * D, f64 ? 1e-12 : 1e-5);
        /* the positions make both kinds of masked row: one block empty (the first), and both */
        assert_true(masked_a > masked_all && masked_all > 0 && masked_b == masked_all);
        interp_free(it);
    }
    ir_free(b.m);
}

/* With positions 0..T-1 (iota), attention and attention_bwd give exactly the
 * bits of the ops without positions, in f32 and f64 mode. */
static void test_attention_positions_identity(void **st) {
    enum { B = 2, H = 4, KH = 2, T = 7, D = 5 };
    for (int causal = 0; causal < 2; causal++) {
        Bld b = bld(1, 1, 1);
        Type qt = TY(DT_F32, B, H, T, D), kt = TY(DT_F32, B, KH, T, D);
        int q = input(&b, "q", qt), k = input(&b, "k", kt), v = input(&b, "v", kt), dO = input(&b, "do", qt);
        int pos = ir_out(b.g, node(&b, OP_iota, NULL, 0, NOATS, &(Type){DT_I32, 1, {T}}));
        for (int with = 0; with < 2; with++) {
            Attr at[1] = {ai(&b, "causal", causal)};
            int n = with ? node(&b, OP_attention, INS(q, k, v, pos, pos), at, 1, NULL)
                         : node(&b, OP_attention, INS(q, k, v), at, 1, NULL);
            int o = b.g->nodes[n].out[0], lse = b.g->nodes[n].out[1];
            int nb = with ? node(&b, OP_attention_bwd, INS(dO, q, k, v, o, lse, pos, pos), at, 1, NULL)
                          : node(&b, OP_attention_bwd, INS(dO, q, k, v, o, lse), at, 1, NULL);
            const char *names[5] = {"o", "lse", "dq", "dk", "dv"};
            int vals[5] = {o, lse, b.g->nodes[nb].out[0], b.g->nodes[nb].out[1], b.g->nodes[nb].out[2]};
            for (int i = 0; i < 5; i++) {
                char nm[16];
                snprintf(nm, sizeof nm, "%s%d", names[i], with);
                output(&b, vals[i], nm);
            }
        }
        double Q[B * H * T * D], K[B * KH * T * D], V[B * KH * T * D], DO[B * H * T * D];
        fill(Q, B * H * T * D, 21);
        fill(K, B * KH * T * D, 22);
        fill(V, B * KH * T * D, 23);
        fill(DO, B * H * T * D, 24);
        for (int f64 = 0; f64 < 2; f64++) {
            Interp *it = interp_new(b.m, f64);
            set(it, 0, "q", Q, B * H * T * D);
            set(it, 0, "k", K, B * KH * T * D);
            set(it, 0, "v", V, B * KH * T * D);
            set(it, 0, "do", DO, B * H * T * D);
            run_ok(it);
            const char *names[5] = {"o", "lse", "dq", "dk", "dv"};
            for (int i = 0; i < 5; i++) {
                char n0[16], n1[16];
                snprintf(n0, sizeof n0, "%s0", names[i]);
                snprintf(n1, sizeof n1, "%s1", names[i]);
                const Tensor *a = interp_output(it, 0, n0), *c = interp_output(it, 0, n1);
                assert_non_null(a);
                assert_non_null(c);
                assert_int_equal(a->n, c->n);
                if (memcmp(a->d, c->d, sizeof(double) * (size_t)a->n) != 0)
                    fail_msg("causal=%d f64=%d: %s with positions 0..T-1 differs from without", causal, f64, names[i]);
            }
            interp_free(it);
        }
        ir_free(b.m);
    }
}

/* ir_add_node refuses node spec s with a message containing `want`. */
static void refused(Bld *b, Op op, const int *in, int nin, int causal, const char *want) {
    Attr at = ai(b, "causal", causal);
    NodeSpec s = ir_spec(op, b->loc);
    s.in = in;
    s.nin = nin;
    s.attr = &at;
    s.nattr = 1;
    char err[256] = "";
    if (ir_add_node(b->g, &s, err, sizeof err) >= 0) fail_msg("%s with %d inputs accepted, want \"%s\"", ir_ops[op].name, nin, want);
    if (!strstr(err, want)) fail_msg("error \"%s\" lacks \"%s\"", err, want);
}

/* The shape rule: 3 or 5 (attention), 6 or 8 (attention_bwd) inputs;
 * positions i32[T] and i32[S]; causal with T != S needs positions. */
static void test_attention_positions_shape_rule(void **st) {
    Bld b = bld(1, 1, 1);
    int q = input(&b, "q", TY(DT_F32, 1, 2, 4, 3)), k = input(&b, "k", TY(DT_F32, 1, 1, 6, 3));
    int qp = input(&b, "qp", TY(DT_I32, 4)), kp = input(&b, "kp", TY(DT_I32, 6));
    int fp = input(&b, "fp", TY(DT_F32, 4)), lp = input(&b, "lp", TY(DT_I64, 6)), q2 = input(&b, "q2", TY(DT_I32, 2, 2));
    refused(&b, OP_attention, INS(q, k, k, qp), 0, "attention: takes 3 inputs, or 5 with qpos and kpos, got 4");
    refused(&b, OP_attention, INS(q, k, k, qp, kp, kp), 0, "got 6");
    refused(&b, OP_attention, INS(q, k, k, fp, kp), 1, "attention: qpos must be i32[4] (the query length), got f32[4]");
    refused(&b, OP_attention, INS(q, k, k, q2, kp), 1, "qpos must be i32[4]");
    refused(&b, OP_attention, INS(q, k, k, qp, lp), 1, "attention: kpos must be i32[6] (the key length), got i64[6]");
    refused(&b, OP_attention, INS(q, k, k, qp, qp), 1, "kpos must be i32[6]");
    refused(&b, OP_attention, INS(q, k, k), 1, "causal without positions needs equal query and key lengths (4 vs 6)");
    int n = node(&b, OP_attention, INS(q, k, k, qp, kp), ATS(ai(&b, "causal", 1)), NULL); /* T != S: fine with positions */
    int o = b.g->nodes[n].out[0], lse = b.g->nodes[n].out[1];
    refused(&b, OP_attention_bwd, INS(o, q, k, k, o, lse, qp), 1, "attention_bwd: takes 6 inputs, or 8 with qpos and kpos, got 7");
    refused(&b, OP_attention_bwd, INS(o, q, k, k, o, lse, kp, kp), 1, "attention_bwd: qpos must be i32[4]");
    refused(&b, OP_attention_bwd, INS(o, q, k, k, o, lse), 1, "causal without positions");
    node(&b, OP_attention_bwd, INS(o, q, k, k, o, lse, qp, kp), ATS(ai(&b, "causal", 1)), NULL);
    char err[256];
    if (ir_verify_module(b.m, err, sizeof err) != 0) fail_msg("verify: %s", err);
    ir_free(b.m);
}

/* The text form carries the positions: dump, parse, equal, and the parsed
 * module computes the same. */
static void test_attention_positions_text(void **st) {
    Bld b = bld(1, 1, 1);
    int q = input(&b, "q", TY(DT_F32, 1, 2, 4, 3)), k = input(&b, "k", TY(DT_F32, 1, 1, 4, 3));
    int qp = input(&b, "qp", TY(DT_I32, 4)), kp = input(&b, "kp", TY(DT_I32, 4));
    int n = node(&b, OP_attention, INS(q, k, k, qp, kp), ATS(ai(&b, "causal", 1)), NULL);
    int o = b.g->nodes[n].out[0], lse = b.g->nodes[n].out[1];
    int nb = node(&b, OP_attention_bwd, INS(o, q, k, k, o, lse, qp, kp), ATS(ai(&b, "causal", 1)), NULL);
    output(&b, b.g->nodes[nb].out[0], "dq");
    output(&b, o, "o");
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    ir_dump(b.m, f);
    assert_int_equal(fclose(f), 0);
    char err[256];
    Module *m2 = ir_parse(text, "t.ir", err, sizeof err);
    if (!m2) fail_msg("parse: %s\n%s", err, text);
    assert_true(ir_module_equal(b.m, m2));
    double Q[24], K[12], QP[4] = {7, 1, 4, 0}, KP[4] = {4, 0, 8, 1};
    fill(Q, 24, 31);
    fill(K, 12, 32);
    const Module *ms[2] = {b.m, m2};
    double res[2][24];
    for (int i = 0; i < 2; i++) {
        Interp *it = interp_new(ms[i], 1);
        set(it, 0, "q", Q, 24);
        set(it, 0, "k", K, 12);
        set(it, 0, "qp", QP, 4);
        set(it, 0, "kp", KP, 4);
        run_ok(it);
        memcpy(res[i], out(it, 0, "dq"), sizeof res[i]);
        interp_free(it);
    }
    assert_memory_equal(res[0], res[1], sizeof res[0]);
    free(text);
    ir_free(m2);
    ir_free(b.m);
}

/* ---- rope, norms, softmax, loss, embedding ---- */

static void test_rope(void **st) {
    enum { B = 1, T = 3, H = 2, D = 4 };
    Bld b = bld(1, 1, 1);
    int x = input(&b, "x", TY(DT_F32, B, T, H, D)), pos = input(&b, "pos", TY(DT_I32, T));
    int y = val(&b, OP_rope, INS(x, pos), ATS(af(&b, "theta", 100)));
    output(&b, y, "y");
    output(&b, val(&b, OP_rope_bwd, INS(y, pos), ATS(af(&b, "theta", 100))), "back");
    double X[T * H * D], P[T] = {0, 5, 2}, want[T * H * D];
    fill(X, T * H * D, 6);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < D / 2; i++) {
                double ang = P[t] * pow(100, -2.0 * i / D);
                const double *xr = X + (t * H + h) * D;
                want[(t * H + h) * D + i] = xr[i] * cos(ang) - xr[i + D / 2] * sin(ang);
                want[(t * H + h) * D + i + D / 2] = xr[i + D / 2] * cos(ang) + xr[i] * sin(ang);
            }
    Interp *it = interp_new(b.m, 1);
    set(it, 0, "x", X, T * H * D);
    set(it, 0, "pos", P, T);
    run_ok(it);
    near(out(it, 0, "y"), want, T * H * D, 1e-12);
    near(out(it, 0, "back"), X, T * H * D, 1e-12); /* rotating back by -angle restores x */
    interp_free(it);
    ir_free(b.m);
}

/* dropout (issue 17) on ones [B,T,F] = [16,64,128] (131072 elements),
 * p = 0.3, against its statistics: the dropped fraction within 5 binomial
 * standard deviations of p (sd = sqrt(p(1-p)/n) = 0.0013), kept values
 * exactly 1/(1-p); a different step or node id draws an independent mask
 * (the two agree on a fraction p^2 + (1-p)^2 = 0.58, 5 sd); the block of
 * samples 2..3 and tokens 8..15 computed alone from its global indices is
 * the full tensor's block exactly (what makes dp and cp draw the single
 * device's mask); p = 0 is the identity; p outside [0, 1) is refused. */
static double agree(const double *a, const double *b, int64_t n) {
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++) k += (a[i] == 0) == (b[i] == 0);
    return (double)k / (double)n;
}

static void test_dropout(void **st) {
    enum { B = 16, T = 64, F = 128 };
    const double p = 0.3, n = (double)B * T * F, sd = sqrt(p * (1 - p) / n), sd2 = sqrt(0.58 * 0.42 / n);
    Bld b = bld(1, 1, 1);
    Type sc = {.dt = DT_F32, .rank = 0};
    int x = input(&b, "x", TY(DT_F32, B, T, F)), s1 = input(&b, "s1", sc), s2 = input(&b, "s2", sc);
    int rows = input(&b, "rows", TY(DT_I32, B)), pos = input(&b, "pos", TY(DT_I32, T));
    int xs = input(&b, "xs", TY(DT_F32, 2, 8, F)), rs = input(&b, "rs", TY(DT_I32, 2)), ps = input(&b, "ps", TY(DT_I32, 8));
#define DROP(X, S, R, P, PR, ID) val(&b, OP_dropout, INS(X, S, R, P), ATS(af(&b, "p", PR), ai(&b, "seed", 7), ai(&b, "id", ID)))
    output(&b, DROP(x, s1, rows, pos, p, 0), "y1");
    output(&b, DROP(x, s2, rows, pos, p, 0), "y2");
    output(&b, DROP(x, s1, rows, pos, p, 1), "y3");
    output(&b, DROP(xs, s1, rs, ps, p, 0), "y4");
    output(&b, DROP(x, s1, rows, pos, 0.0, 0), "y0");
#undef DROP
    Interp *it = interp_new(b.m, 1);
    double *X = malloc(sizeof(double) * B * T * F), R[B], P[T], one = 1, two = 2, RS[2] = {2, 3}, PS[8];
    for (int64_t i = 0; i < B * T * F; i++) X[i] = 1;
    for (int i = 0; i < B; i++) R[i] = i;
    for (int i = 0; i < T; i++) P[i] = i;
    for (int i = 0; i < 8; i++) PS[i] = 8 + i;
    set(it, 0, "x", X, B * T * F), set(it, 0, "s1", &one, 1), set(it, 0, "s2", &two, 1);
    set(it, 0, "rows", R, B), set(it, 0, "pos", P, T);
    set(it, 0, "xs", X, 2 * 8 * F), set(it, 0, "rs", RS, 2), set(it, 0, "ps", PS, 8);
    run_ok(it);
    const double *y1 = out(it, 0, "y1"), *y4 = out(it, 0, "y4");
    int64_t dropped = 0, bad = 0;
    for (int64_t i = 0; i < B * T * F; i++) dropped += y1[i] == 0, bad += y1[i] != 0 && y1[i] != 1 / (1 - p);
    double frac = (double)dropped / n, a2 = agree(y1, out(it, 0, "y2"), B * T * F), a3 = agree(y1, out(it, 0, "y3"), B * T * F);
    if (getenv("KILN_VERBOSE")) print_message("dropout: dropped %.5f, step agreement %.5f, id agreement %.5f\n", frac, a2, a3);
    assert_true(fabs(frac - p) <= 5 * sd);
    assert_int_equal(bad, 0);
    assert_true(fabs(a2 - 0.58) <= 5 * sd2 && fabs(a3 - 0.58) <= 5 * sd2);
    for (int bb = 0; bb < 2; bb++)
        near(y4 + bb * 8 * F, y1 + ((2 + bb) * T + 8) * F, 8 * F, 0);
    near(out(it, 0, "y0"), X, B * T * F, 0);
    interp_free(it);
    free(X);
    ir_free(b.m);

    Bld c = bld(1, 1, 1); /* p = 1: the shape rule's one-line error */
    int cx = input(&c, "x", TY(DT_F32, 2, 3)), cs = input(&c, "s", sc);
    int ci[4] = {cx, cs, input(&c, "r", TY(DT_I32, 2)), input(&c, "q", TY(DT_I32, 3))};
    Attr ca[1] = {af(&c, "p", 1.0)};
    NodeSpec ns = ir_spec(OP_dropout, (Loc){ir_intern(c.m, "t.lua"), 9});
    ns.nin = 4, ns.in = ci, ns.nattr = 1, ns.attr = ca;
    char err[256] = "";
    assert_true(ir_add_node(c.g, &ns, err, sizeof err) < 0);
    assert_non_null(strstr(err, "p must be in [0, 1)"));
    ir_free(c.m);
}

static void test_norms_softmax(void **st) {
    enum { R = 3, C = 4 };
    Bld b = bld(1, 1, 1);
    int x = input(&b, "x", TY(DT_F32, R, C)), w = input(&b, "w", TY(DT_F32, C)), bb = input(&b, "b", TY(DT_F32, C));
    output(&b, val(&b, OP_layernorm, INS(x, w, bb), ATS(af(&b, "eps", 1e-3))), "ln");
    output(&b, val(&b, OP_rmsnorm, INS(x, w), ATS(af(&b, "eps", 1e-3))), "rms");
    output(&b, val(&b, OP_softmax, INS(x), NOATS), "sm");
    double X[R * C], W[C], Bv[C], ln[R * C], rms[R * C], sm[R * C];
    fill(X, R * C, 7);
    fill(W, C, 8);
    fill(Bv, C, 9);
    for (int r = 0; r < R; r++) {
        const double *xr = X + r * C;
        double mu = (xr[0] + xr[1] + xr[2] + xr[3]) / 4, var = 0, ms = 0, z = 0;
        for (int c = 0; c < C; c++) var += (xr[c] - mu) * (xr[c] - mu) / C, ms += xr[c] * xr[c] / C, z += exp(xr[c]);
        for (int c = 0; c < C; c++) {
            ln[r * C + c] = (xr[c] - mu) / sqrt(var + 1e-3) * W[c] + Bv[c];
            rms[r * C + c] = xr[c] / sqrt(ms + 1e-3) * W[c];
            sm[r * C + c] = exp(xr[c]) / z;
        }
    }
    Interp *it = interp_new(b.m, 1);
    set(it, 0, "x", X, R * C);
    set(it, 0, "w", W, C);
    set(it, 0, "b", Bv, C);
    run_ok(it);
    near(out(it, 0, "ln"), ln, R * C, 1e-12);
    near(out(it, 0, "rms"), rms, R * C, 1e-12);
    near(out(it, 0, "sm"), sm, R * C, 1e-12);
    interp_free(it);
    ir_free(b.m);
}

static void test_cross_entropy_embedding(void **st) {
    enum { N = 3, V = 5, C = 2 };
    Bld b = bld(1, 1, 1);
    int lg = input(&b, "logits", TY(DT_F32, N, V)), tg = input(&b, "targets", TY(DT_I32, N));
    output(&b, val(&b, OP_cross_entropy, INS(lg, tg), NOATS), "ce");
    int tab = input(&b, "table", TY(DT_F32, V, C)), ids = input(&b, "ids", TY(DT_I32, 2, 2));
    output(&b, val(&b, OP_embedding, INS(tab, ids), NOATS), "emb");
    double L[N * V], T[N] = {4, 0, 2}, ce[N], tbl[V * C], I[4] = {3, 0, 3, 1};
    fill(L, N * V, 10);
    fill(tbl, V * C, 11);
    for (int r = 0; r < N; r++) {
        double z = 0;
        for (int i = 0; i < V; i++) z += exp(L[r * V + i]);
        ce[r] = log(z) - L[r * V + (int)T[r]];
    }
    double emb[8];
    for (int i = 0; i < 4; i++)
        for (int c = 0; c < C; c++) emb[i * C + c] = tbl[(int)I[i] * C + c];
    Interp *it = interp_new(b.m, 1);
    set(it, 0, "logits", L, N * V);
    set(it, 0, "targets", T, N);
    set(it, 0, "table", tbl, V * C);
    set(it, 0, "ids", I, 4);
    run_ok(it);
    near(out(it, 0, "ce"), ce, N, 1e-12);
    near(out(it, 0, "emb"), emb, 8, 0);
    assert_int_equal(interp_output(it, 0, "emb")->t.rank, 3);
    interp_free(it);
    ir_free(b.m);
}

static void test_token_out_of_range(void **st) {
    Bld b = bld(1, 1, 1);
    int tab = param(&b, "wte", TY(DT_F32, 256, 4), "normal", 0.02);
    int ids = input(&b, "tokens", TY(DT_I32, 3));
    b.loc = (Loc){ir_intern(b.m, "models/tiny.lua"), 30};
    output(&b, val(&b, OP_embedding, INS(tab, ids), NOATS), "x");
    Interp *it = interp_new(b.m, 0);
    interp_init_state(it, 1);
    set(it, 0, "tokens", (double[]){1, 300, 2}, 3);
    char err[1024];
    assert_int_equal(interp_run(it, err, sizeof err), -1);
    assert_string_equal(err, "models/tiny.lua:30: embedding: id 300 out of range [0,256)");
    set(it, 0, "tokens", (double[]){1, 255, -1}, 3);
    assert_int_equal(interp_run(it, err, sizeof err), -1);
    assert_string_equal(err, "models/tiny.lua:30: embedding: id -1 out of range [0,256)");
    set(it, 0, "tokens", (double[]){256, 0, 0}, 3);
    assert_int_equal(interp_run(it, err, sizeof err), -1);
    assert_string_equal(err, "models/tiny.lua:30: embedding: id 256 out of range [0,256)");
    set(it, 0, "tokens", (double[]){0, 255, 7}, 3);
    run_ok(it);
    interp_free(it);
    ir_free(b.m);
}

/* ---- shape ops ---- */

static void test_broadcast_sumto(void **st) {
    Bld b = bld(1, 1, 1);
    int x = input(&b, "x", TY(DT_F32, 3, 1)), y = input(&b, "y", TY(DT_F32, 4));
    int bx = val(&b, OP_broadcast, INS(x), ATS(shape(&b, TY(DT_F32, 2, 3, 4))));
    int by = val(&b, OP_broadcast, INS(y), ATS(shape(&b, TY(DT_F32, 2, 3, 4))));
    output(&b, bx, "bx");
    output(&b, by, "by");
    output(&b, val(&b, OP_sumto, INS(bx), ATS(shape(&b, TY(DT_F32, 3, 1)))), "sx");
    output(&b, val(&b, OP_sumto, INS(by), ATS(shape(&b, TY(DT_F32, 1, 4)))), "sy");
    double X[3] = {1, 2, 3}, Y[4] = {10, 20, 30, 40}, wx[24], wy[24];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++)
            for (int k = 0; k < 4; k++) wx[(i * 3 + j) * 4 + k] = X[j], wy[(i * 3 + j) * 4 + k] = Y[k];
    Interp *it = interp_new(b.m, 1);
    set(it, 0, "x", X, 3);
    set(it, 0, "y", Y, 4);
    run_ok(it);
    near(out(it, 0, "bx"), wx, 24, 0);
    near(out(it, 0, "by"), wy, 24, 0);
    near(out(it, 0, "sx"), (double[]){8, 16, 24}, 3, 0);
    near(out(it, 0, "sy"), (double[]){60, 120, 180, 240}, 4, 0);
    interp_free(it);
    ir_free(b.m);
}

static void test_shape_ops(void **st) {
    Bld b = bld(1, 1, 1);
    int x = input(&b, "x", TY(DT_F32, 2, 3, 4));
    output(&b, val(&b, OP_transpose, INS(x), ATS(ai(&b, "a", 0), ai(&b, "b", 2))), "tr");
    output(&b, val(&b, OP_transpose, INS(x), ATS(ai(&b, "a", 2), ai(&b, "b", 1))), "tr21");
    int sl = val(&b, OP_slice, INS(x), ATS(ai(&b, "dim", 1), ai(&b, "start", 1), ai(&b, "end", 3)));
    output(&b, sl, "sl");
    output(&b, val(&b, OP_concat, INS(x, sl), ATS(ai(&b, "dim", 1))), "cat");
    output(&b, val(&b, OP_reshape, INS(x), ATS(shape(&b, TY(DT_F32, 6, 4)))), "rs");
    output(&b, val(&b, OP_sum, INS(x), ATS(ai(&b, "dim", 1))), "sum1");
    output(&b, val(&b, OP_max, INS(x), ATS(ai(&b, "dim", 2), ai(&b, "keep", 1))), "max2");
    double X[24], tr[24], tr21[24], sl_[16], cat[40], sum1[8], max2[6];
    for (int i = 0; i < 24; i++) X[i] = i * (i % 2 ? -1 : 1);
#define XI(i, j, k) X[((i) * 3 + (j)) * 4 + (k)]
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++)
            for (int k = 0; k < 4; k++) {
                tr[(k * 3 + j) * 2 + i] = XI(i, j, k);   /* [4,3,2] */
                tr21[(i * 4 + k) * 3 + j] = XI(i, j, k); /* [2,4,3] */
                if (j >= 1) sl_[(i * 2 + j - 1) * 4 + k] = XI(i, j, k);
                cat[(i * 5 + j) * 4 + k] = XI(i, j, k);
                if (j >= 1) cat[(i * 5 + 3 + j - 1) * 4 + k] = XI(i, j, k);
            }
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < 4; k++) sum1[i * 4 + k] = XI(i, 0, k) + XI(i, 1, k) + XI(i, 2, k);
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++) max2[i * 3 + j] = fmax(fmax(XI(i, j, 0), XI(i, j, 1)), fmax(XI(i, j, 2), XI(i, j, 3)));
#undef XI
    Interp *it = interp_new(b.m, 1);
    set(it, 0, "x", X, 24);
    run_ok(it);
    near(out(it, 0, "tr"), tr, 24, 0);
    near(out(it, 0, "tr21"), tr21, 24, 0);
    near(out(it, 0, "sl"), sl_, 16, 0);
    near(out(it, 0, "cat"), cat, 40, 0);
    near(out(it, 0, "rs"), X, 24, 0);
    near(out(it, 0, "sum1"), sum1, 8, 0);
    near(out(it, 0, "max2"), max2, 6, 0);
    interp_free(it);
    ir_free(b.m);
}

/* ---- optimizer ---- */

static void test_lr_cosine_clipscale(void **st) {
    Bld b = bld(1, 1, 1);
    int t = input(&b, "t", SCALAR), norm = input(&b, "norm", SCALAR);
    output(&b, val(&b, OP_lr_cosine, INS(t), ATS(af(&b, "lr", 1e-3), af(&b, "min_lr", 1e-4), ai(&b, "warmup", 10), ai(&b, "total", 110))), "lr");
    output(&b, val(&b, OP_clipscale, INS(norm), ATS(af(&b, "max", 1))), "clip");
    output(&b, val(&b, OP_clipscale, INS(norm), ATS(af(&b, "max", 0))), "noclip");
    Interp *it = interp_new(b.m, 1);
    /* t: warm-up start, warm-up end, mid-decay, end, past the end; lr by hand */
    static const double ts[] = {1, 10, 60, 110, 200}, lrs[] = {1e-4, 1e-3, 5.5e-4, 1e-4, 1e-4};
    static const double norms[] = {4, 0.5, 1}, clips[] = {1 / (4 + 1e-6), 1, 1 / (1 + 1e-6)};
    for (int i = 0; i < 5; i++) {
        set(it, 0, "t", &ts[i], 1);
        set(it, 0, "norm", &norms[i % 3], 1);
        run_ok(it);
        near(out(it, 0, "lr"), &lrs[i], 1, 1e-12);
        near(out(it, 0, "clip"), &clips[i % 3], 1, 1e-12);
        assert_true(out(it, 0, "noclip")[0] == 1);
    }
    /* a quarter into the decay: min + 0.5(1+cos(pi/4))(lr-min) */
    set(it, 0, "t", (double[]){35}, 1);
    run_ok(it);
    near(out(it, 0, "lr"), (double[]){1e-4 + 0.5 * (1 + sqrt(0.5)) * 9e-4}, 1, 1e-12);
    interp_free(it);
    ir_free(b.m);
}

/* Two AdamW steps with p=[1,-2], g=[0.5,0.1], scale 2, lr 0.1, wd 0.1:
 * step 1: p = 0.99p, m = 0.1g' = [0.1,0.02], v = 0.001g'^2, m^ = g', v^ = g'^2,
 *   p -= 0.1 * g'/(|g'|+1e-8) -> [0.890000001, -2.079999995];
 * step 2: m = [0.19,0.038], v = [0.001999,7.996e-5], m^/sqrt(v^) = 1 again
 *   -> p = [0.88110000099 - 0.0999999990, ...] = [0.78110000199, -2.15919999005]. */
static void test_adamw_two_steps(void **st) {
    Bld b = bld(1, 1, 1);
    Type pt = TY(DT_F32, 2);
    int p = param(&b, "p", pt, "ones", 0), m = state(&b, "m", pt), v = state(&b, "v", pt), t = state(&b, "t", SCALAR);
    int g = input(&b, "g", pt);
    int t1 = val(&b, OP_add, INS(t, cnst(&b, SCALAR, 1)), NOATS);
    int n = node(&b, OP_adamw, INS(p, g, m, v, cnst(&b, SCALAR, 0.1), cnst(&b, SCALAR, 2), t1),
                 ATS(af(&b, "b1", 0.9), af(&b, "b2", 0.999), af(&b, "eps", 1e-8), af(&b, "wd", 0.1)), NULL);
    for (int k = 0; k < 3; k++) assign(&b, b.g->nodes[n].out[k], (const char *[]){"p", "m", "v"}[k]);
    assign(&b, t1, "t");
    Interp *it = interp_new(b.m, 1);
    interp_init_state(it, 0);
    interp_state(it, 0, "p")->d[1] = -2;
    set(it, 0, "g", (double[]){0.5, 0.1}, 2);
    run_ok(it);
    near(interp_state(it, 0, "p")->d, (double[]){0.890000001, -2.079999995}, 2, 1e-14);
    near(interp_state(it, 0, "m")->d, (double[]){0.1, 0.02}, 2, 1e-14);
    near(interp_state(it, 0, "v")->d, (double[]){0.001, 4e-5}, 2, 1e-14);
    run_ok(it);
    near(interp_state(it, 0, "p")->d, (double[]){0.78110000199, -2.15919999005}, 2, 1e-14);
    near(interp_state(it, 0, "m")->d, (double[]){0.19, 0.038}, 2, 1e-14);
    near(interp_state(it, 0, "v")->d, (double[]){0.001999, 7.996e-5}, 2, 1e-14);
    assert_true(interp_state(it, 0, "t")->d[0] == 2);
    interp_free(it);
    ir_free(b.m);
}

/* ---- parameter init ---- */

static void test_param_init(void **st) {
    Bld b = bld(2, 1, 1);
    output(&b, param(&b, "w", TY(DT_F32, 100, 100), "normal", 0.02), "w");
    param(&b, "one", TY(DT_F32, 3), "ones", 0);
    param(&b, "zero", TY(DT_F32, 3), "zeros", 0);
    Interp *a = interp_new(b.m, 0), *c = interp_new(b.m, 0), *d = interp_new(b.m, 0);
    interp_init_state(a, 42);
    interp_init_state(c, 42);
    interp_init_state(d, 43);
    const Tensor *w0 = interp_state(a, 0, "w"), *w1 = interp_state(a, 1, "w");
    double mean = 0, var = 0;
    for (int i = 0; i < 10000; i++) mean += w0->d[i] / 10000;
    for (int i = 0; i < 10000; i++) var += (w0->d[i] - mean) * (w0->d[i] - mean) / 9999;
    assert_true(fabs(sqrt(var) - 0.02) < 0.05 * 0.02);
    assert_true(fabs(mean) < 5 * 0.02 / 100); /* 5 standard errors */
    assert_memory_equal(w0->d, w1->d, sizeof(double) * 10000);
    assert_memory_equal(w0->d, interp_state(c, 0, "w")->d, sizeof(double) * 10000);
    assert_memory_not_equal(w0->d, interp_state(d, 0, "w")->d, sizeof(double) * 10000);
    assert_true(w0->d[17] == (float)w0->d[17]); /* f32 mode rounds params too */
    near(interp_state(a, 1, "one")->d, (double[]){1, 1, 1}, 3, 0);
    near(interp_state(a, 1, "zero")->d, (double[]){0, 0, 0}, 3, 0);
    assert_null(interp_state(a, 0, "nope"));
    interp_free(a);
    interp_free(c);
    interp_free(d);
    ir_free(b.m);
}

/* A param split on tp by parallelize starts as its block of the unsharded one. */
static void test_param_init_sharded(void **st) {
    Bld full = bld(1, 1, 1), sh = bld(1, 1, 2);
    param(&full, "w", TY(DT_F32, 4, 6), "normal", 1);
    int v = param(&sh, "w", TY(DT_F32, 4, 3), "normal", 1);
    sh.g->vals[v].sh[3] = (AxisShard){SH_SPLIT, 1};
    Interp *a = interp_new(full.m, 1), *c = interp_new(sh.m, 1);
    interp_init_state(a, 7);
    interp_init_state(c, 7);
    const double *W = interp_state(a, 0, "w")->d;
    for (int r = 0; r < 2; r++) {
        double want[12];
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 3; j++) want[i * 3 + j] = W[i * 6 + 3 * r + j];
        near(interp_state(c, r, "w")->d, want, 12, 0);
    }
    interp_free(a);
    interp_free(c);
    ir_free(full.m);
    ir_free(sh.m);
}

/* ---- a tiny GPT step, for speed: batch 8, seq 64, dim 64, 4 heads, 2 layers, vocab 256 ----
 * Forward as the front end would build it, then the backward's GEMMs and
 * attention_bwd fed with stand-in gradients (autodiff is tested elsewhere);
 * the loss of a fresh model must be close to log(256). */
static int lin(Bld *b, int x, int w) { return val(b, OP_matmul, INS(x, w), NOATS); }

static void test_tiny_gpt_speed(void **st) {
    enum { B = 8, T = 64, C = 64, H = 4, D = 16, L = 2, V = 256 };
    Bld b = bld(1, 1, 1);
    Type bt = TY(DT_F32, B, T, C);
    int tok = input(&b, "tokens", TY(DT_I32, B, T)), tgt = input(&b, "targets", TY(DT_I32, B, T));
    int x = val(&b, OP_embedding, INS(param(&b, "wte", TY(DT_F32, V, C), "normal", 0.02), tok), NOATS);
    int pos = ir_out(b.g, node(&b, OP_iota, NULL, 0, NOATS, &(Type){DT_I32, 1, {T}}));
    int gsum = cnst(&b, SCALAR, 0);
    for (int l = 0; l < L; l++) {
        char nm[32];
        int ones = param(&b, (snprintf(nm, 32, "h.%d.ln", l), nm), TY(DT_F32, C), "ones", 0);
        int zeros = param(&b, (snprintf(nm, 32, "h.%d.lb", l), nm), TY(DT_F32, C), "zeros", 0);
        int h = val(&b, OP_layernorm, INS(x, ones, zeros), NOATS);
        int wq = param(&b, (snprintf(nm, 32, "h.%d.wqkv", l), nm), TY(DT_F32, C, 3 * C), "normal", 0.02);
        int qkv = val(&b, OP_reshape, INS(lin(&b, h, wq)), ATS(shape(&b, TY(DT_F32, B, T, 3 * H, D))));
        int part[3];
        for (int k = 0; k < 3; k++) {
            int s = val(&b, OP_slice, INS(qkv), ATS(ai(&b, "dim", 2), ai(&b, "start", k * H), ai(&b, "end", (k + 1) * H)));
            if (k < 2) s = val(&b, OP_rope, INS(s, pos), ATS(af(&b, "theta", 10000)));
            part[k] = val(&b, OP_transpose, INS(s), ATS(ai(&b, "a", 1), ai(&b, "b", 2)));
        }
        int an = node(&b, OP_attention, INS(part[0], part[1], part[2]), ATS(ai(&b, "causal", 1)), NULL);
        int o = b.g->nodes[an].out[0], lse = b.g->nodes[an].out[1];
        int bw = node(&b, OP_attention_bwd, INS(o, part[0], part[1], part[2], o, lse), ATS(ai(&b, "causal", 1)), NULL);
        gsum = val(&b, OP_add, INS(gsum, val(&b, OP_sumsq, INS(b.g->nodes[bw].out[1]), NOATS)), NOATS);
        int ot = val(&b, OP_reshape, INS(val(&b, OP_transpose, INS(o), ATS(ai(&b, "a", 1), ai(&b, "b", 2)))), ATS(shape(&b, bt)));
        int wo = param(&b, (snprintf(nm, 32, "h.%d.wo", l), nm), TY(DT_F32, C, C), "normal", 0.02);
        int x1 = val(&b, OP_add, INS(x, lin(&b, ot, wo)), NOATS);
        int h2 = val(&b, OP_layernorm, INS(x1, ones, zeros), NOATS);
        int w1 = param(&b, (snprintf(nm, 32, "h.%d.w1", l), nm), TY(DT_F32, C, 4 * C), "normal", 0.02);
        int w2 = param(&b, (snprintf(nm, 32, "h.%d.w2", l), nm), TY(DT_F32, 4 * C, C), "normal", 0.02);
        int a1 = val(&b, OP_gelu, INS(lin(&b, h2, w1)), NOATS);
        int y = lin(&b, a1, w2);
        x = val(&b, OP_add, INS(x1, y), NOATS);
        /* backward-sized GEMMs: dX = dY W^T, dW = X^T dY on flattened rows */
        Attr tb = ai(&b, "tb", 1), ta = ai(&b, "ta", 1);
        int flat_y = val(&b, OP_reshape, INS(y), ATS(shape(&b, TY(DT_F32, B * T, C))));
        int flat_a = val(&b, OP_reshape, INS(a1), ATS(shape(&b, TY(DT_F32, B * T, 4 * C))));
        int da = val(&b, OP_matmul, INS(flat_y, w2), ATS(tb));
        gsum = val(&b, OP_add, INS(gsum, val(&b, OP_sumsq, INS(val(&b, OP_matmul, INS(flat_a, flat_y), ATS(ta))), NOATS)), NOATS);
        int flat_h = val(&b, OP_reshape, INS(h2), ATS(shape(&b, TY(DT_F32, B * T, C))));
        val(&b, OP_matmul, INS(da, w1), ATS(tb));
        val(&b, OP_matmul, INS(flat_h, da), ATS(ta));
        val(&b, OP_matmul, INS(val(&b, OP_reshape, INS(h), ATS(shape(&b, TY(DT_F32, B * T, C)))),
                               val(&b, OP_reshape, INS(lin(&b, h, wq)), ATS(shape(&b, TY(DT_F32, B * T, 3 * C))))),
            ATS(ta));
    }
    int logits = val(&b, OP_matmul, INS(x, param(&b, "wte", TY(DT_F32, V, C), "normal", 0.02)), ATS(ai(&b, "tb", 1)));
    int ce = val(&b, OP_cross_entropy, INS(logits, tgt), NOATS);
    int loss = val(&b, OP_mean, INS(val(&b, OP_mean, INS(ce), ATS(ai(&b, "dim", 1)))), ATS(ai(&b, "dim", 0)));
    output(&b, val(&b, OP_loss, INS(loss), NOATS), "loss");
    output(&b, gsum, "gsum");
    int dl = val(&b, OP_broadcast, INS(cnst(&b, SCALAR, 1.0 / (B * T))), ATS(shape(&b, TY(DT_F32, B, T))));
    int dlog = val(&b, OP_cross_entropy_bwd, INS(dl, logits, tgt), NOATS);
    val(&b, OP_matmul, INS(val(&b, OP_reshape, INS(dlog), ATS(shape(&b, TY(DT_F32, B * T, V)))),
                           val(&b, OP_reshape, INS(x), ATS(shape(&b, TY(DT_F32, B * T, C))))),
        ATS(ai(&b, "ta", 1)));

    Interp *it = interp_new(b.m, 0);
    interp_init_state(it, 1);
    double toks[B * T], tgts[B * T];
    for (int i = 0; i < B * T; i++) toks[i] = (i * 37) % V, tgts[i] = (i * 37 + 1) % V;
    set(it, 0, "tokens", toks, B * T);
    set(it, 0, "targets", tgts, B * T);
    run_ok(it); /* warm: allocates the values */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    run_ok(it);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    double lossv = out(it, 0, "loss")[0];
    printf("tiny GPT step (fwd + bwd-sized GEMMs/attention): %.3f s, loss %.4f (log 256 = %.4f)\n", secs, lossv, log(256));
    assert_true(fabs(lossv - log(256)) < 0.05);
    assert_true(isfinite(out(it, 0, "gsum")[0]));
#ifdef __SANITIZE_ADDRESS__
    assert_true(secs < 20.0); /* sanitizers slow every access down ~10x */
#else
    assert_true(secs < 2.0); /* loose: a shared machine; the target is well under 0.5 s */
#endif
    interp_free(it);
    ir_free(b.m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_collectives_dp4),
        cmocka_unit_test(test_collectives_2axis),
        cmocka_unit_test(test_ring_shift),
        cmocka_unit_test(test_deadlock),
        cmocka_unit_test(test_recv_size_mismatch),
        cmocka_unit_test(test_pipeline_stages),
        cmocka_unit_test(test_assign_commits_after_step),
        cmocka_unit_test(test_input_errors),
        cmocka_unit_test(test_f32_rounding),
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_attention_masked_row),
        cmocka_unit_test(test_attention_positions), cmocka_unit_test(test_attention_window),
        cmocka_unit_test(test_attention_positions_identity),
        cmocka_unit_test(test_attn_merge),
        cmocka_unit_test(test_attention_positions_shape_rule),
        cmocka_unit_test(test_attention_positions_text),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_dropout),
        cmocka_unit_test(test_norms_softmax),
        cmocka_unit_test(test_cross_entropy_embedding),
        cmocka_unit_test(test_token_out_of_range),
        cmocka_unit_test(test_broadcast_sumto),
        cmocka_unit_test(test_shape_ops),
        cmocka_unit_test(test_lr_cosine_clipscale),
        cmocka_unit_test(test_adamw_two_steps),
        cmocka_unit_test(test_param_init),
        cmocka_unit_test(test_param_init_sharded),
        cmocka_unit_test(test_tiny_gpt_speed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
