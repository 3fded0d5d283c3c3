/* test_kernels.c — the CPU library kernels (kernels/cpu) against the
 * reference interpreter.
 *
 * Each test builds the one-op graph of the kernel's IR op with ir_add_node,
 * runs it in the interpreter in f32 mode (every op computed in double, its
 * result rounded to float: at least as accurate as any f32 kernel), runs the
 * kernel on the same float inputs through a real runtime (rt_new with a
 * program whose step launches the kernel under test, on a pool of 3 threads
 * so the parallel loops really split), and compares:
 *
 *     max |kernel - interp| / max |interp|  <=  tol
 *
 * tol is 1e-5 (f32) unless a test states and justifies another.  Sizes are
 * chosen to hit the awkward cases: rows not a multiple of the vector width,
 * attention lengths not a multiple of the tile sizes, reductions over the
 * first, a middle and the last dim, repeated embedding ids.
 */
#include "testutil.h"
#include "graphbuild.h"

#include "kiln_rt.h"

#define TOL 1e-5

/* ---- graphs (graphbuild.h) ---- */

static Bld bld(void) { return bld_new("k", "k.lua"); }

/* output k of node n */
static int outk(Bld *b, int n, int k) { return b->g->nodes[n].out[k]; }

/* ---- memory: everything a test allocates is freed by its teardown ---- */

static void *held[16384];
static int nheld;

static void *keep(void *p) {
    if (!p) fail_msg("out of memory");
    if (nheld == 16384) fail_msg("test holds too many buffers");
    return held[nheld++] = p;
}

static int release(void **st) {
    while (nheld) free(held[--nheld]);
    return 0;
}

/* n values in [-scale, scale), exactly representable as float */
static double *rnd(int64_t n, uint32_t seed, double scale) {
    double *d = keep(malloc(sizeof(double) * (size_t)(n ? n : 1)));
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        d[i] = (float)(((seed >> 8) * (2.0 / 16777216.0) - 1) * scale);
    }
    return d;
}

static float *f32(const double *d, int64_t n) {
    float *f = keep(malloc(sizeof(float) * (size_t)(n ? n : 1)));
    for (int64_t i = 0; i < n; i++) f[i] = (float)d[i];
    return f;
}

static int32_t *i32(const double *d, int64_t n) {
    int32_t *f = keep(malloc(sizeof(int32_t) * (size_t)(n ? n : 1)));
    for (int64_t i = 0; i < n; i++) f[i] = (int32_t)d[i];
    return f;
}

static float *fbuf(int64_t n) { return f32(rnd(n, 99, 7), n); } /* garbage-filled output buffer */

/* ---- the interpreter ---- */

static Interp *interp(Bld *b) { return interp_new(b->m, 0); }

static void set(Interp *it, const char *name, const double *d, int64_t n) {
    if (interp_set_input(it, 0, name, d, n) != 0) fail_msg("set_input %s failed", name);
}

static void run_ok(Interp *it) {
    char err[1024];
    if (interp_run(it, err, sizeof err) != 0) fail_msg("interp_run: %s", err);
}

static const double *ref(Interp *it, int vid) {
    const Tensor *t = interp_value(it, 0, vid);
    if (!t) fail_msg("no value %%%d", vid);
    return t->d;
}

/* max |got - want| / max |want| (want all zero: absolute) */
static double err_of(const float *got, const double *want, int64_t n, int64_t *worst) {
    double scale = 0, e = 0;
    for (int64_t i = 0; i < n; i++) scale = fabs(want[i]) > scale ? fabs(want[i]) : scale;
    if (scale == 0) scale = 1;
    *worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs(got[i] - want[i]) / scale;
        if (!(d <= e)) e = d, *worst = i; /* a NaN counts as the worst */
    }
    return e;
}

static void check(const char *what, const float *got, const double *want, int64_t n, double tol) {
    int64_t w;
    double e = err_of(got, want, n, &w);
    if (getenv("KILN_TEST_VERBOSE")) fprintf(stderr, "  %-28s rel err %.3g\n", what, e);
    if (!(e <= tol)) fail_msg("%s: relative error %g > %g (at [%lld]: got %.9g want %.9g)", what, e, tol, (long long)w,
                              got[w], want[w]);
}

/* ---- the runtime: a program whose step launches the kernel under test ---- */

static rt_ctx *ctx;
static rt_kernel cur_kernel;
static int64_t cur_args[32];
static int cur_nargs;

static void one_kernel_step(rt_ctx *c, char *const *spaces) { rt_launch(c, 0, cur_kernel, cur_args, cur_nargs, "kernel"); }

static const rt_program one_kernel = {.abi_version = RT_ABI_VERSION, .model = "test_kernels", .nstreams = 1,
                                      .step = one_kernel_step};

static int setup(void **st) {
    rt_options o = {.threads = 3};
    ctx = rt_new(&one_kernel, &o);
    return ctx ? 0 : -1;
}

static int teardown(void **st) {
    rt_free(ctx);
    return 0;
}

/* Launch k on args through rt_step; 0, or -1 with the step's message in err. */
static int launch(rt_kernel k, const int64_t *args, int n, char *err, int errlen) {
    cur_kernel = k;
    cur_nargs = n;
    memcpy(cur_args, args, sizeof(int64_t) * (size_t)n);
    return rt_step(ctx, err, errlen);
}

static void launch_ok(rt_kernel k, const int64_t *args, int n) {
    char err[512];
    if (launch(k, args, n, err, sizeof err) != 0) fail_msg("kernel failed: %s", err);
}

#define P(x) rt_ptr_arg(x)
#define F(x) rt_f64_bits(x)
#define RUN(k, ...) launch_ok(k, (const int64_t[]){__VA_ARGS__}, (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)))

/* ---- gemm ---- */

/* matmul of a[batch.., M,K] ([K,M] if ta) by b (rank 2 shared, or batched),
 * optionally accumulated into C (beta = 1) */
static void gemm_case(int64_t batch, int64_t M, int64_t N, int64_t K, int ta, int tb, int shared_b, int beta) {
    Bld b = bld();
    Type at = batch > 1 ? TY(DT_F32, batch, ta ? K : M, ta ? M : K) : TY(DT_F32, ta ? K : M, ta ? M : K);
    Type bt = batch > 1 && !shared_b ? TY(DT_F32, batch, tb ? N : K, tb ? K : N) : TY(DT_F32, tb ? N : K, tb ? K : N);
    int x = input(&b, "a", at), w = input(&b, "b", bt);
    int y = val(&b, OP_matmul, INS(x, w), ATS(ai(&b, "ta", ta), ai(&b, "tb", tb)));
    int64_t na = ir_numel(&at), nb = ir_numel(&bt), nc = batch * M * N;
    double *A = rnd(na, 1, 1), *B = rnd(nb, 2, 1), *C0 = rnd(nc, 3, 1);
    Interp *it = interp(&b);
    set(it, "a", A, na);
    set(it, "b", B, nb);
    run_ok(it);
    double *want = keep(malloc(sizeof(double) * (size_t)nc));
    for (int64_t i = 0; i < nc; i++) want[i] = ref(it, y)[i] + (beta ? C0[i] : 0);
    float *C = beta ? f32(C0, nc) : fbuf(nc);
    RUN(rtk_gemm, P(f32(A, na)), P(f32(B, nb)), P(C), batch, M, N, K, ta, tb, batch > 1 ? M * K : 0,
        batch > 1 && !shared_b ? K * N : 0, M * N, F(beta));
    char what[96];
    snprintf(what, sizeof what, "gemm b%lld %lldx%lldx%lld ta%d tb%d%s%s", (long long)batch, (long long)M, (long long)N,
             (long long)K, ta, tb, shared_b ? " sharedB" : "", beta ? " beta1" : "");
    check(what, C, want, nc, TOL);
    interp_free(it);
    ir_free(b.m);
}

static void test_gemm(void **st) {
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            gemm_case(1, 7, 9, 5, ta, tb, 0, 0);    /* one product */
            gemm_case(3, 7, 9, 5, ta, tb, 0, 0);    /* batched, small: spread over the pool */
            gemm_case(3, 7, 9, 5, ta, tb, 1, 0);    /* shared B: one flat sgemm unless ta */
            gemm_case(2, 70, 65, 66, ta, tb, 0, 0); /* batched, each product threaded by OpenBLAS */
        }
    gemm_case(1, 7, 9, 5, 0, 1, 0, 1); /* beta = 1 accumulates */
    gemm_case(4, 6, 5, 3, 1, 0, 1, 1);
}

/* ---- norms, softmax, rope ---- */

static void test_layernorm(void **st) {
    enum { R1 = 4, R2 = 25, C = 37 }; /* 100 rows: more than the backward's 64 blocks */
    Bld b = bld();
    int x = input(&b, "x", TY(DT_F32, R1, R2, C)), w = input(&b, "w", TY(DT_F32, C)), bb = input(&b, "b", TY(DT_F32, C));
    int dy = input(&b, "dy", TY(DT_F32, R1, R2, C));
    int y = val(&b, OP_layernorm, INS(x, w, bb), ATS(af(&b, "eps", 1e-5)));
    int y0 = val(&b, OP_layernorm, INS(x, w), ATS(af(&b, "eps", 1e-5))); /* no bias (issue 17) */
    int nb = node(&b, OP_layernorm_bwd, INS(dy, x, w), ATS(af(&b, "eps", 1e-5)), NULL);
    int64_t n = R1 * R2 * C;
    double *X = rnd(n, 5, 2), *W = rnd(C, 6, 1), *Bv = rnd(C, 7, 1), *DY = rnd(n, 8, 1);
    for (int64_t i = 0; i < n; i++) X[i] = (float)(X[i] + 3); /* a mean far from 0 */
    Interp *it = interp(&b);
    set(it, "x", X, n), set(it, "w", W, C), set(it, "b", Bv, C), set(it, "dy", DY, n);
    run_ok(it);
    float *Y = fbuf(n), *DX = fbuf(n), *DW = fbuf(C), *DB = fbuf(C);
    RUN(rtk_layernorm, P(f32(X, n)), P(f32(W, C)), P(f32(Bv, C)), P(Y), R1 * R2, C, F(1e-5));
    check("layernorm", Y, ref(it, y), n, TOL);
    RUN(rtk_layernorm, P(f32(X, n)), P(f32(W, C)), 0, P(Y), R1 * R2, C, F(1e-5));
    check("layernorm without a bias (b = 0)", Y, ref(it, y0), n, TOL);
    RUN(rtk_layernorm_bwd, P(f32(DY, n)), P(f32(X, n)), P(f32(W, C)), P(DX), P(DW), P(DB), R1 * R2, C, F(1e-5));
    check("layernorm_bwd dx", DX, ref(it, outk(&b, nb, 0)), n, TOL);
    check("layernorm_bwd dw", DW, ref(it, outk(&b, nb, 1)), C, TOL);
    check("layernorm_bwd db", DB, ref(it, outk(&b, nb, 2)), C, TOL);
    interp_free(it);
    ir_free(b.m);
}

static void test_rmsnorm(void **st) {
    enum { R = 70, C = 45 };
    Bld b = bld();
    int x = input(&b, "x", TY(DT_F32, R, C)), w = input(&b, "w", TY(DT_F32, C)), dy = input(&b, "dy", TY(DT_F32, R, C));
    int y = val(&b, OP_rmsnorm, INS(x, w), ATS(af(&b, "eps", 1e-6)));
    int nb = node(&b, OP_rmsnorm_bwd, INS(dy, x, w), ATS(af(&b, "eps", 1e-6)), NULL);
    int64_t n = R * C;
    double *X = rnd(n, 9, 3), *W = rnd(C, 10, 1), *DY = rnd(n, 11, 1);
    Interp *it = interp(&b);
    set(it, "x", X, n), set(it, "w", W, C), set(it, "dy", DY, n);
    run_ok(it);
    float *Y = fbuf(n), *DX = fbuf(n), *DW = fbuf(C);
    RUN(rtk_rmsnorm, P(f32(X, n)), P(f32(W, C)), P(Y), R, C, F(1e-6));
    check("rmsnorm", Y, ref(it, y), n, TOL);
    RUN(rtk_rmsnorm_bwd, P(f32(DY, n)), P(f32(X, n)), P(f32(W, C)), P(DX), P(DW), R, C, F(1e-6));
    check("rmsnorm_bwd dx", DX, ref(it, outk(&b, nb, 0)), n, TOL);
    check("rmsnorm_bwd dw", DW, ref(it, outk(&b, nb, 1)), C, TOL);
    interp_free(it);
    ir_free(b.m);
}

static void test_softmax(void **st) {
    enum { R = 7, C = 333 };
    Bld b = bld();
    int x = input(&b, "x", TY(DT_F32, R, C)), dy = input(&b, "dy", TY(DT_F32, R, C));
    int y = val(&b, OP_softmax, INS(x), NOATS);
    int dx = val(&b, OP_softmax_bwd, INS(dy, y), NOATS);
    int64_t n = R * C;
    double *X = rnd(n, 12, 8), *DY = rnd(n, 13, 1);
    Interp *it = interp(&b);
    set(it, "x", X, n), set(it, "dy", DY, n);
    run_ok(it);
    float *Y = fbuf(n), *DX = fbuf(n);
    RUN(rtk_softmax, P(f32(X, n)), P(Y), R, C);
    check("softmax", Y, ref(it, y), n, TOL);
    /* the backward on the interpreter's y, so it is checked alone */
    RUN(rtk_softmax_bwd, P(f32(DY, n)), P(f32(ref(it, y), n)), P(DX), R, C);
    check("softmax_bwd", DX, ref(it, dx), n, TOL);
    interp_free(it);
    ir_free(b.m);
}

static void test_rope(void **st) {
    enum { B = 2, T = 5, H = 3, D = 10 };
    Bld b = bld();
    int x = input(&b, "x", TY(DT_F32, B, T, H, D)), pos = input(&b, "pos", TY(DT_I32, T));
    int y = val(&b, OP_rope, INS(x, pos), ATS(af(&b, "theta", 10000)));
    int dx = val(&b, OP_rope_bwd, INS(x, pos), ATS(af(&b, "theta", 10000)));
    int64_t n = B * T * H * D;
    double *X = rnd(n, 14, 2), POS[T] = {0, 3, 7, 100, 12345};
    Interp *it = interp(&b);
    set(it, "x", X, n), set(it, "pos", POS, T);
    run_ok(it);
    float *Y = fbuf(n), *DX = fbuf(n);
    RUN(rtk_rope, P(f32(X, n)), P(i32(POS, T)), P(Y), B, T, H, D, F(10000), 1);
    check("rope", Y, ref(it, y), n, TOL);
    RUN(rtk_rope, P(f32(X, n)), P(i32(POS, T)), P(DX), B, T, H, D, F(10000), -1);
    check("rope_bwd", DX, ref(it, dx), n, TOL);
    interp_free(it);
    ir_free(b.m);
}

/* dropout (issue 17): the kernel's mask and values equal the interpreter's
 * bit for bit (tolerance 0: both take the product in double and round once),
 * at arbitrary global indices and a step, with a feature size (7) that is not
 * a multiple of the vector width; some elements dropped, some kept. */
static void test_dropout(void **st) {
    enum { B = 3, T = 5, F = 7 };
    Bld b = bld();
    int x = input(&b, "x", TY(DT_F32, B, T, F)), step = input(&b, "step", (Type){.dt = DT_F32, .rank = 0});
    int rows = input(&b, "rows", TY(DT_I32, B)), pos = input(&b, "pos", TY(DT_I32, T));
    int y = val(&b, OP_dropout, INS(x, step, rows, pos), ATS(af(&b, "p", 0.3), ai(&b, "seed", 99), ai(&b, "id", 4)));
    int64_t n = B * T * F, zeros = 0;
    double *X = rnd(n, 15, 2), STEP[1] = {12}, ROWS[B] = {5, 0, 1000}, POS[T] = {0, 3, 7, 100, 12345};
    Interp *it = interp(&b);
    set(it, "x", X, n), set(it, "step", STEP, 1), set(it, "rows", ROWS, B), set(it, "pos", POS, T);
    run_ok(it);
    float *Y = fbuf(n);
    RUN(rtk_dropout, P(f32(X, n)), P(f32(STEP, 1)), P(i32(ROWS, B)), P(i32(POS, T)), P(Y), B, T, F, F(0.3), 99, 4);
    check("dropout", Y, ref(it, y), n, 0);
    for (int64_t i = 0; i < n; i++) zeros += Y[i] == 0;
    assert_true(zeros > 0 && zeros < n);
    interp_free(it);
    ir_free(b.m);
}

/* ---- attention ---- */

/* Forward and backward, all outputs at the f32 tolerance (observed: about
 * 1e-6 at D = 64, where scores reach +-16).  -inf lse entries must match
 * exactly; the rest is compared like every tensor.  The backward runs on the
 * interpreter's o and lse, so it is checked alone.  mask_row: query row 0
 * of every head is -inf, so (with positive keys) it sees only -inf scores:
 * o = 0, lse = -inf, and it adds nothing to dk (not NaN). */
static void attn_case(int64_t B, int64_t H, int64_t KH, int64_t T, int64_t S, int64_t D, int causal, int mask_row) {
    Bld b = bld();
    double scale = 1 / sqrt((double)D);
    Type qt = TY(DT_F32, B, H, T, D), kt = TY(DT_F32, B, KH, S, D);
    int q = input(&b, "q", qt), k = input(&b, "k", kt), v = input(&b, "v", kt), dO = input(&b, "do", qt);
    int nf = node(&b, OP_attention, INS(q, k, v), ATS(ai(&b, "causal", causal), af(&b, "scale", scale)), NULL);
    int o = outk(&b, nf, 0), lse = outk(&b, nf, 1);
    int nb = node(&b, OP_attention_bwd, INS(dO, q, k, v, o, lse), ATS(ai(&b, "causal", causal), af(&b, "scale", scale)),
                  NULL);
    int64_t nq = ir_numel(&qt), nk = ir_numel(&kt), nl = B * H * T;
    double *Q = rnd(nq, 20, 2), *K = rnd(nk, 21, 2), *V = rnd(nk, 22, 1), *DO = rnd(nq, 23, 1);
    if (mask_row) {
        for (int64_t i = 0; i < nk; i++) K[i] = fabs(K[i]) + 0.125;
        for (int64_t bh = 0; bh < B * H; bh++)
            for (int64_t d = 0; d < D; d++) Q[bh * T * D + d] = -INFINITY;
    }
    Interp *it = interp(&b);
    set(it, "q", Q, nq), set(it, "k", K, nk), set(it, "v", V, nk), set(it, "do", DO, nq);
    run_ok(it);
    float *O = fbuf(nq), *L = fbuf(nl), *DQ = fbuf(nq), *DK = fbuf(nk), *DV = fbuf(nk);
    float *fq = f32(Q, nq), *fk = f32(K, nk), *fv = f32(V, nk);
    RUN(rtk_attention, P(fq), P(fk), P(fv), P(O), P(L), B, H, KH, T, S, D, causal, F(scale), 0, 0, 0);
    char what[128];
    snprintf(what, sizeof what, "attention B%lld H%lld KH%lld T%lld S%lld D%lld%s%s", (long long)B, (long long)H,
             (long long)KH, (long long)T, (long long)S, (long long)D, causal ? " causal" : "", mask_row ? " masked" : "");
    const double *Lr = ref(it, lse);
    for (int64_t i = 0; i < nl; i++) /* -inf rows must match exactly; the rest numerically */
        if (isinf(Lr[i]) || isinf(L[i])) {
            if (!(L[i] == Lr[i])) fail_msg("%s: lse[%lld] = %g, want %g", what, (long long)i, L[i], Lr[i]);
            L[i] = 0;
        }
    double *Lfin = keep(malloc(sizeof(double) * (size_t)nl));
    for (int64_t i = 0; i < nl; i++) Lfin[i] = isinf(Lr[i]) ? 0 : Lr[i];
    check(what, O, ref(it, o), nq, TOL);
    check("  lse", L, Lfin, nl, TOL);
    RUN(rtk_attention_bwd, P(f32(DO, nq)), P(fq), P(fk), P(fv), P(f32(ref(it, o), nq)), P(f32(Lr, nl)), P(DQ), P(DK),
        P(DV), B, H, KH, T, S, D, causal, F(scale), 0, 0, 0);
    check("  dq", DQ, ref(it, outk(&b, nb, 0)), nq, TOL);
    check("  dk", DK, ref(it, outk(&b, nb, 1)), nk, TOL);
    check("  dv", DV, ref(it, outk(&b, nb, 2)), nk, TOL);
    interp_free(it);
    ir_free(b.m);
}

static void attn_cases(void) {
    attn_case(2, 4, 2, 37, 37, 16, 1, 0);   /* GQA, causal, T not a multiple of the tiles */
    attn_case(2, 4, 2, 37, 37, 16, 0, 0);   /* GQA, not causal */
    attn_case(1, 3, 3, 100, 100, 8, 1, 0);  /* H = KH, several query and key tiles */
    attn_case(2, 2, 2, 45, 70, 12, 0, 0);   /* S != T, D not a multiple of 16 */
    attn_case(1, 4, 1, 130, 130, 40, 1, 0); /* all heads on one kv head, D = 16k + 8 */
    attn_case(1, 2, 2, 67, 67, 64, 0, 0);   /* the usual head size */
    attn_case(1, 2, 1, 9, 9, 4, 0, 1);      /* a fully masked row: o = 0, lse = -inf */
}

/* Run `cases` with each of attention.c's micro kernels: the best this CPU
 * has, then capped at avx2 and at plain (KILN_ATTENTION_MICRO; a CPU
 * without the instructions runs the next one down), then with
 * KILN_KERNELS_BASELINE, which forces plain. */
static void attn_each_micro(void (*cases)(void)) {
    static const char *const micro[] = {"avx2", "plain"};
    cases();
    for (int i = 0; i < 2; i++) {
        if (setenv("KILN_ATTENTION_MICRO", micro[i], 1)) fail_msg("setenv");
        cases();
    }
    unsetenv("KILN_ATTENTION_MICRO");
    if (setenv("KILN_KERNELS_BASELINE", "1", 1)) fail_msg("setenv");
    cases();
    unsetenv("KILN_KERNELS_BASELINE");
}

static void test_attention(void **st) { attn_each_micro(attn_cases); }

/* Odd sizes against a naive reference written out here in double (so not
 * the interpreter): lengths that are not multiples of attention.c's tiles
 * (64 query rows, 128 keys) nor of the 16-lane vectors, D not a multiple
 * of 16, GQA, causal with T != S (key s visible to query t iff s <= t:
 * with T > S the last rows see every key, with T < S the last keys are
 * seen by no query and get dk = dv = 0), and a query longer than one tile
 * with a single key.  The backward gets the reference's o and lse.  Tolerance
 * 1e-5 as max |kernel - ref| / max |ref| per tensor; observed about 1e-6.
 * With positions qp i32[T], kp i32[S] (NULL: the index path), causal means
 * key s visible to query t iff kp[s] <= qp[t], and with window > 0 also
 * qp[t] - kp[s] < window; a row that sees no key must give o = 0 and lse =
 * -inf exactly. */
static void attn_naive_case_pos(int64_t B, int64_t H, int64_t KH, int64_t T, int64_t S, int64_t D, int causal,
                                int64_t window, const int32_t *qp, const int32_t *kp) {
    int64_t nq = B * H * T * D, nk = B * KH * S * D, nl = B * H * T, rep = H / KH;
    double scale = 1 / sqrt((double)D);
    const double *Q = rnd(nq, 40, 2), *K = rnd(nk, 41, 2), *V = rnd(nk, 42, 1), *DO = rnd(nq, 43, 1);
    double *O = keep(calloc((size_t)nq, sizeof(double))), *L = keep(malloc(sizeof(double) * (size_t)nl));
    double *DQ = keep(calloc((size_t)nq, sizeof(double))), *DK = keep(calloc((size_t)nk, sizeof(double)));
    double *DV = keep(calloc((size_t)nk, sizeof(double))), *sc = keep(malloc(sizeof(double) * (size_t)S));
    char *seen = keep(malloc((size_t)S + 1));
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t t = 0; t < T; t++) {
                const double *q = Q + ((b * H + h) * T + t) * D, *dO = DO + ((b * H + h) * T + t) * D;
                const double *k = K + (b * KH + h / rep) * S * D, *v = V + (b * KH + h / rep) * S * D;
                double *o = O + ((b * H + h) * T + t) * D, *dq = DQ + ((b * H + h) * T + t) * D;
                double *dk = DK + (b * KH + h / rep) * S * D, *dv = DV + (b * KH + h / rep) * S * D;
                int64_t n = 0;
                for (int64_t s = 0; s < S; s++) {
                    int64_t dist = qp ? (int64_t)qp[t] - kp[s] : t - s;
                    seen[s] = !causal || (dist >= 0 && (window == 0 || dist < window));
                    n += seen[s];
                }
                double m = -INFINITY, l = 0, Dt = 0;
                for (int64_t s = 0; s < S; s++) if (seen[s]) {
                    sc[s] = 0;
                    for (int64_t d = 0; d < D; d++) sc[s] += q[d] * k[s * D + d];
                    sc[s] *= scale;
                    m = sc[s] > m ? sc[s] : m;
                }
                for (int64_t s = 0; s < S; s++) if (seen[s]) l += exp(sc[s] - m);
                for (int64_t s = 0; s < S; s++) if (seen[s])
                    for (int64_t d = 0; d < D; d++) o[d] += exp(sc[s] - m) / l * v[s * D + d];
                L[(b * H + h) * T + t] = n ? m + log(l) : -INFINITY;
                for (int64_t d = 0; d < D; d++) Dt += (double)(float)dO[d] * (float)o[d]; /* the kernel sees o in f32 */
                for (int64_t s = 0; s < S; s++) if (seen[s]) {
                    double p = exp(sc[s] - m) / l, dp = 0;
                    for (int64_t d = 0; d < D; d++) dp += dO[d] * v[s * D + d];
                    double ds = p * (dp - Dt) * scale;
                    for (int64_t d = 0; d < D; d++) {
                        dq[d] += ds * k[s * D + d];
                        dk[s * D + d] += ds * q[d];
                        dv[s * D + d] += p * dO[d];
                    }
                }
            }
    float *fq = f32(Q, nq), *fk = f32(K, nk), *fv = f32(V, nk), *fo = fbuf(nq), *fl = fbuf(nl);
    char what[128];
    snprintf(what, sizeof what, "attention naive B%lld H%lld KH%lld T%lld S%lld D%lld%s window %lld", (long long)B,
             (long long)H, (long long)KH, (long long)T, (long long)S, (long long)D, causal ? " causal" : "",
             (long long)window);
    RUN(rtk_attention, P(fq), P(fk), P(fv), P(fo), P(fl), B, H, KH, T, S, D, causal, F(scale), P(qp), P(kp), window);
    check(what, fo, O, nq, TOL);
    double *Lfin = keep(malloc(sizeof(double) * (size_t)nl));
    for (int64_t i = 0; i < nl; i++) { /* rows with no key: -inf exactly */
        if ((isinf(L[i]) || isinf(fl[i])) && !(fl[i] == L[i]))
            fail_msg("%s: lse[%lld] = %g, want %g", what, (long long)i, fl[i], L[i]);
        Lfin[i] = isinf(L[i]) ? 0 : L[i];
    }
    float *flfin = fbuf(nl);
    for (int64_t i = 0; i < nl; i++) flfin[i] = isinf(fl[i]) ? 0 : fl[i];
    check("  lse", flfin, Lfin, nl, TOL);
    float *fdq = fbuf(nq), *fdk = fbuf(nk), *fdv = fbuf(nk);
    RUN(rtk_attention_bwd, P(f32(DO, nq)), P(fq), P(fk), P(fv), P(f32(O, nq)), P(f32(L, nl)), P(fdq), P(fdk), P(fdv), B,
        H, KH, T, S, D, causal, F(scale), P(qp), P(kp), window);
    check("  dq", fdq, DQ, nq, TOL);
    check("  dk", fdk, DK, nk, TOL);
    check("  dv", fdv, DV, nk, TOL);
}

static void attn_naive_case(int64_t B, int64_t H, int64_t KH, int64_t T, int64_t S, int64_t D, int causal) {
    attn_naive_case_pos(B, H, KH, T, S, D, causal, 0, NULL, NULL);
}

/* the positions of a dual-chunk cp rank: chunks c and 2cp-1-c of a
 * sequence of 2 cp n positions, n each */
static int32_t *dual_chunk(int cp, int c, int64_t n, int32_t *pos) {
    for (int64_t j = 0; j < n; j++) {
        pos[j] = (int32_t)(c * n + j);
        pos[n + j] = (int32_t)((2 * cp - 1 - c) * n + j);
    }
    return pos;
}

/* attention with positions against the naive reference, on every micro kernel */
static void attn_pos_cases(void) {
    enum { CP = 4, N = 40 }; /* dual chunk over a sequence of 2 CP N = 320: T = 80 per rank, S = 320 */
    int32_t *kp = keep(malloc(sizeof(int32_t) * 2 * CP * N)), *qp = keep(malloc(sizeof(int32_t) * 2 * N));
    for (int r = 0; r < CP; r++) dual_chunk(CP, r, N, kp + r * 2 * N); /* the all-gathered keys, rank by rank */
    for (int c = 0; c < CP; c += 3) /* the first and last rank: least and most causal work */
        attn_naive_case_pos(1, 4, 2, 2 * N, 2 * CP * N, 24, 1, 0, dual_chunk(CP, c, N, qp), kp); /* GQA, T != S */
    /* ring attention's steps: rank r's queries against rank j's block alone, chunks (20) shorter
     * than a key block, so one block holds an earlier and a later chunk (cut to its visible part) */
    int32_t kr[2 * 20], qr[2 * 20];
    for (int r = 0; r < CP; r++)
        for (int j = 0; j < CP; j++)
            attn_naive_case_pos(1, 2, 1, 40, 40, 16, 1, 0, dual_chunk(CP, r, 20, qr), dual_chunk(CP, j, 20, kr));
    /* any order, T = 70 > S = 50, positions with gaps and repeats; rows with qpos < 0 see no key */
    int32_t q2[70], k2[50];
    for (int i = 0; i < 70; i++) q2[i] = (int32_t)((i * 37) % 70) - 5;
    for (int i = 0; i < 50; i++) k2[i] = (int32_t)((i * 23) % 50) + (i % 3 == 0);
    attn_naive_case_pos(2, 2, 1, 70, 50, 20, 1, 0, q2, k2);
    attn_naive_case_pos(2, 2, 1, 70, 50, 20, 0, 0, q2, k2); /* not causal: positions ignored */
    /* index positions through the masked path give the index path's answer */
    int32_t q3[150], k3[150];
    for (int i = 0; i < 150; i++) q3[i] = k3[i] = (int32_t)i;
    attn_naive_case_pos(1, 2, 2, 150, 150, 16, 1, 0, q3, k3);
    /* a query tile that sees every key of the later block, one that sees nothing, and a key block nobody sees */
    int32_t q4[130], k4[260];
    for (int i = 0; i < 130; i++) q4[i] = i < 64 ? 1000 + i : -1 - i;
    for (int i = 0; i < 260; i++) k4[i] = i < 128 ? 2000 + i : i;
    attn_naive_case_pos(1, 1, 1, 130, 260, 8, 1, 0, q4, k4);
}

static void test_attention_positions(void **st) { attn_each_micro(attn_pos_cases); }

static void attn_naive_cases(void) {
    attn_naive_case(2, 4, 2, 131, 131, 40, 1); /* GQA, causal, 2 query tiles + 3 rows, 1 key block + 3 keys */
    attn_naive_case(1, 2, 2, 150, 200, 24, 0); /* T != S, not causal, D = 16 + 8 */
    attn_naive_case(1, 3, 1, 90, 45, 72, 1);   /* causal, T > S: the rows past S see every key; D = 64 + 8 */
    attn_naive_case(1, 2, 1, 45, 140, 20, 1);  /* causal, T < S: keys past T are seen by nobody */
    attn_naive_case(1, 1, 1, 70, 1, 5, 0);     /* one key, D < 16 */
}

static void test_attention_naive(void **st) { attn_each_micro(attn_naive_cases); }

/* Sliding-window attention (window W: key s visible to query t iff 0 <=
 * t - s < W, by index or by position) against the naive reference, on
 * every micro kernel: by index with windows of 1 key, of 2 and 66 (a query
 * tile whose first row sees only the last key of a key block), shorter
 * than, equal to and longer than a key block (128) or a query tile (64),
 * one longer than the sequence; T != S; then by position: a dual-chunk cp rank
 * against the all-gathered keys and ring steps against one other rank's
 * block, the window not a multiple of the chunk (so blocks are skipped
 * whole, seen whole and cut), and unordered positions. */
static void attn_window_cases(void) {
    static const int64_t wins[] = {1, 2, 5, 64, 66, 100, 129, 1000};
    for (size_t i = 0; i < sizeof wins / sizeof wins[0]; i++)
        attn_naive_case_pos(1, 4, 2, 300, 300, 24, 1, wins[i], NULL, NULL);
    attn_naive_case_pos(1, 2, 1, 90, 45, 20, 1, 7, NULL, NULL); /* T > S */
    attn_naive_case_pos(1, 2, 1, 45, 140, 20, 1, 7, NULL, NULL); /* T < S */
    enum { CP = 4, N = 40 };
    int32_t *kp = keep(malloc(sizeof(int32_t) * 2 * CP * N)), *qp = keep(malloc(sizeof(int32_t) * 2 * N));
    for (int r = 0; r < CP; r++) dual_chunk(CP, r, N, kp + r * 2 * N);
    for (int c = 0; c < CP; c++) attn_naive_case_pos(1, 4, 2, 2 * N, 2 * CP * N, 24, 1, 57, dual_chunk(CP, c, N, qp), kp);
    int32_t kr[2 * 20], qr[2 * 20];
    for (int r = 0; r < CP; r++)
        for (int j = 0; j < CP; j++)
            attn_naive_case_pos(1, 2, 1, 40, 40, 16, 1, 27, dual_chunk(CP, r, 20, qr), dual_chunk(CP, j, 20, kr));
    int32_t q2[70], k2[50];
    for (int i = 0; i < 70; i++) q2[i] = (int32_t)((i * 37) % 70) - 5;
    for (int i = 0; i < 50; i++) k2[i] = (int32_t)((i * 23) % 50) + (i % 3 == 0);
    attn_naive_case_pos(2, 2, 1, 70, 50, 20, 1, 9, q2, k2);
}

static void test_attention_window(void **st) { attn_each_micro(attn_window_cases); }

/* ---- embedding, cross-entropy ---- */

/* ---- attn_merge ---- */

/* Ring attention's log-sum-exp merge against full softmax attention in
 * double, written out here: q [1,H,T,D], keys split into blocks A (keys
 * 0..SA-1) and B (SA..S-1), kv shared by the H heads (GQA, so a block is a
 * contiguous piece of k and v).  Causal with positions kp[s] = s and qp[t] =
 * t - 5: rows t < 5 see no key at all (both parts lse = -inf: o must be 0
 * and lse -inf, never NaN), rows with qp < SA see nothing of block B (a
 * part weighing 0).  Each block goes through rtk_attention with positions,
 * then rtk_attn_merge, out of place and in place (o = o_a, lse = lse_b).
 * Tolerance 1e-5 as max |kernel - ref| / max |ref| (f32 throughout). */
static void test_attn_merge(void **st) {
    (void)st;
    enum { H = 2, T = 37, S = 50, SA = 23, D = 20 };
    int64_t nq = H * T * D, nl = H * T;
    double scale = 1 / sqrt((double)D);
    const double *Q = rnd(nq, 50, 2), *K = rnd(S * D, 51, 2), *V = rnd(S * D, 52, 1);
    double *O = keep(calloc((size_t)nq, sizeof(double))), *L = keep(malloc(sizeof(double) * (size_t)nl));
    int32_t qp[T], kp[S];
    for (int t = 0; t < T; t++) qp[t] = t - 5;
    for (int s = 0; s < S; s++) kp[s] = s;
    for (int h = 0; h < H; h++)
        for (int t = 0; t < T; t++) {
            const double *q = Q + (h * T + t) * D;
            double sc[S], m = -INFINITY, l = 0, *o = O + (h * T + t) * D;
            for (int s = 0; s <= qp[t] && s < S; s++) {
                sc[s] = 0;
                for (int d = 0; d < D; d++) sc[s] += q[d] * K[s * D + d];
                sc[s] *= scale;
                m = sc[s] > m ? sc[s] : m;
            }
            for (int s = 0; s <= qp[t] && s < S; s++) l += exp(sc[s] - m);
            for (int s = 0; s <= qp[t] && s < S; s++)
                for (int d = 0; d < D; d++) o[d] += exp(sc[s] - m) / l * V[s * D + d];
            L[h * T + t] = qp[t] >= 0 ? m + log(l) : -INFINITY;
        }
    float *fq = f32(Q, nq), *fk = f32(K, S * D), *fv = f32(V, S * D);
    float *oa = fbuf(nq), *la = fbuf(nl), *ob = fbuf(nq), *lb = fbuf(nl), *o = fbuf(nq), *l = fbuf(nl);
    RUN(rtk_attention, P(fq), P(fk), P(fv), P(oa), P(la), 1, H, 1, T, SA, D, 1, F(scale), P(qp), P(kp), 0);
    RUN(rtk_attention, P(fq), P(fk + SA * D), P(fv + SA * D), P(ob), P(lb), 1, H, 1, T, S - SA, D, 1, F(scale), P(qp),
        P(kp + SA), 0);
    for (int pass = 0; pass < 2; pass++) {
        float *po = pass ? oa : o, *pl = pass ? lb : l; /* pass 1: in place */
        RUN(rtk_attn_merge, P(oa), P(la), P(ob), P(lb), P(po), P(pl), nl, D);
        const char *what = pass ? "attn_merge in place" : "attn_merge";
        double *Lfin = keep(malloc(sizeof(double) * (size_t)nl));
        float *flfin = fbuf(nl);
        for (int64_t i = 0; i < nl; i++) {
            if ((isinf(L[i]) || isinf(pl[i])) && !(pl[i] == L[i])) fail_msg("%s: lse[%lld] = %g, want %g", what, (long long)i, pl[i], L[i]);
            Lfin[i] = isinf(L[i]) ? 0 : L[i];
            flfin[i] = isinf(pl[i]) ? 0 : pl[i];
        }
        for (int64_t i = 0; i < nq; i++)
            if (isnan(po[i])) fail_msg("%s: o[%lld] is NaN", what, (long long)i);
        for (int t = 0; t < 5; t++)
            for (int d = 0; d < D; d++)
                if (po[t * D + d] != 0) fail_msg("%s: fully masked row %d: o = %g, want 0", what, t, po[t * D + d]);
        check(what, po, O, nq, TOL);
        check("  lse", flfin, Lfin, nl, TOL);
    }
}

static void test_embedding(void **st) {
    enum { V = 11, C = 40, N1 = 3, N2 = 7 };
    Bld b = bld();
    int tab = input(&b, "t", TY(DT_F32, V, C)), ids = input(&b, "ids", TY(DT_I32, N1, N2));
    int dy = input(&b, "dy", TY(DT_F32, N1, N2, C));
    int y = val(&b, OP_embedding, INS(tab, ids), NOATS);
    int dt = val(&b, OP_embedding_bwd, INS(dy, ids), ATS(ai(&b, "v", V)));
    double *TAB = rnd(V * C, 30, 1), *DY = rnd(N1 * N2 * C, 31, 1), IDS[N1 * N2];
    for (int i = 0; i < N1 * N2; i++) IDS[i] = (i * 7) % 5 * 2; /* repeats; rows 1, 3, .. unused */
    IDS[4] = V - 1;
    Interp *it = interp(&b);
    set(it, "t", TAB, V * C), set(it, "ids", IDS, N1 * N2), set(it, "dy", DY, N1 * N2 * C);
    run_ok(it);
    float *Y = fbuf(N1 * N2 * C), *DT = fbuf(V * C);
    int32_t *fid = i32(IDS, N1 * N2);
    RUN(rtk_embedding, P(f32(TAB, V * C)), P(fid), P(Y), N1 * N2, C, V);
    check("embedding", Y, ref(it, y), N1 * N2 * C, 0); /* a copy: exact */
    RUN(rtk_embedding_bwd, P(f32(DY, N1 * N2 * C)), P(fid), P(DT), N1 * N2, C, V);
    check("embedding_bwd", DT, ref(it, dt), V * C, TOL);
    interp_free(it);
    ir_free(b.m);
}

/* An id outside [0, V) fails the step with one message, for both kernels
 * and both ends of the range. */
static void test_embedding_bad_id(void **st) {
    float table[4 * 3] = {0}, out[2 * 3], dy[2 * 3] = {0};
    int32_t hi[2] = {1, 4}, lo[2] = {-1, 0};
    char err[256];
    int64_t fwd[] = {P(table), P(hi), P(out), 2, 3, 4};
    assert_int_equal(launch(rtk_embedding, fwd, 6, err, sizeof err), -1);
    assert_string_equal(err, "embedding: id 4 out of range [0,4)");
    int64_t bwd[] = {P(dy), P(lo), P(table), 2, 3, 4};
    assert_int_equal(launch(rtk_embedding_bwd, bwd, 6, err, sizeof err), -1);
    assert_string_equal(err, "embedding_bwd: id -1 out of range [0,4)");
    /* the runtime is fine afterwards */
    int32_t ok[2] = {3, 0};
    int64_t good[] = {P(table), P(ok), P(out), 2, 3, 4};
    assert_int_equal(launch(rtk_embedding, good, 6, err, sizeof err), 0);
}

static void test_cross_entropy(void **st) {
    enum { R1 = 2, R2 = 9, V = 300 };
    Bld b = bld();
    int lg = input(&b, "x", TY(DT_F32, R1, R2, V)), tg = input(&b, "t", TY(DT_I32, R1, R2));
    int dl = input(&b, "dl", TY(DT_F32, R1, R2));
    int loss = val(&b, OP_cross_entropy, INS(lg, tg), NOATS);
    int dx = val(&b, OP_cross_entropy_bwd, INS(dl, lg, tg), NOATS);
    int64_t n = R1 * R2 * V;
    double *X = rnd(n, 40, 6), *DL = rnd(R1 * R2, 41, 1), TG[R1 * R2];
    for (int i = 0; i < R1 * R2; i++) TG[i] = (i * 37) % V;
    TG[0] = V - 1;
    Interp *it = interp(&b);
    set(it, "x", X, n), set(it, "t", TG, R1 * R2), set(it, "dl", DL, R1 * R2);
    run_ok(it);
    float *LOSS = fbuf(R1 * R2), *DX = fbuf(n);
    int32_t *ft = i32(TG, R1 * R2);
    RUN(rtk_cross_entropy, P(f32(X, n)), P(ft), P(LOSS), R1 * R2, V);
    check("cross_entropy", LOSS, ref(it, loss), R1 * R2, TOL);
    RUN(rtk_cross_entropy_bwd, P(f32(DL, R1 * R2)), P(f32(X, n)), P(ft), P(DX), R1 * R2, V);
    check("cross_entropy_bwd", DX, ref(it, dx), n, TOL);
    /* a bad target fails the step */
    char err[256];
    ft[5] = V;
    int64_t bad[] = {P(f32(X, n)), P(ft), P(LOSS), R1 * R2, V};
    assert_int_equal(launch(rtk_cross_entropy, bad, 5, err, sizeof err), -1);
    assert_string_equal(err, "cross_entropy: target 300 out of range [0,300)");
    interp_free(it);
    ir_free(b.m);
}

/* ---- optimizer ---- */

static void test_adamw(void **st) {
    enum { R = 10, C = 13, N = R * C };
    Bld b = bld();
    Type t = TY(DT_F32, R, C), sc = {.dt = DT_F32, .rank = 0};
    int p = input(&b, "p", t), g = input(&b, "g", t), m = input(&b, "m", t), v = input(&b, "v", t);
    int lr = input(&b, "lr", sc), scale = input(&b, "scale", sc), tt = input(&b, "t", sc);
    int n = node(&b, OP_adamw, INS(p, g, m, v, lr, scale, tt),
                 ATS(af(&b, "b1", 0.9), af(&b, "b2", 0.95), af(&b, "eps", 1e-8), af(&b, "wd", 0.1)), NULL);
    double *P0 = rnd(N, 50, 1), *M0 = keep(calloc(N, sizeof(double))), *V0 = keep(calloc(N, sizeof(double)));
    float *fp = f32(P0, N), *fm = f32(M0, N), *fv = f32(V0, N);
    Interp *it = interp(&b);
    for (int step = 1; step <= 2; step++) {
        double *G = rnd(N, 50 + (uint32_t)step, 0.5), LR = (float)(step * 1e-2), SC = step == 1 ? 1 : 0.5, T = step;
        set(it, "p", P0, N), set(it, "g", G, N), set(it, "m", M0, N), set(it, "v", V0, N);
        set(it, "lr", &LR, 1), set(it, "scale", &SC, 1), set(it, "t", &T, 1);
        run_ok(it);
        float flr = (float)LR, fsc = (float)SC, ft = (float)T;
        /* in place: p_out = p, m_out = m, v_out = v */
        RUN(rtk_adamw, P(fp), P(f32(G, N)), P(fm), P(fv), P(&flr), P(&fsc), P(&ft), P(fp), P(fm), P(fv), N, F(0.9),
            F(0.95), F(1e-8), F(0.1));
        check(step == 1 ? "adamw step 1 p" : "adamw step 2 p", fp, ref(it, outk(&b, n, 0)), N, TOL);
        check("  m", fm, ref(it, outk(&b, n, 1)), N, TOL);
        check("  v", fv, ref(it, outk(&b, n, 2)), N, TOL);
        memcpy(P0, ref(it, outk(&b, n, 0)), sizeof(double) * N); /* the interpreter's state for step 2 */
        memcpy(M0, ref(it, outk(&b, n, 1)), sizeof(double) * N);
        memcpy(V0, ref(it, outk(&b, n, 2)), sizeof(double) * N);
    }
    interp_free(it);
    ir_free(b.m);
}

static void test_lr_clip(void **st) {
    Bld b = bld();
    Type sc = {.dt = DT_F32, .rank = 0};
    int t = input(&b, "t", sc), nrm = input(&b, "n", sc);
    int lr = val(&b, OP_lr_cosine, INS(t),
                 ATS(af(&b, "lr", 1e-3), af(&b, "min_lr", 1e-4), af(&b, "warmup", 3), af(&b, "total", 100)));
    int c1 = val(&b, OP_clipscale, INS(nrm), ATS(af(&b, "max", 1)));
    int c0 = val(&b, OP_clipscale, INS(nrm), ATS(af(&b, "max", 0)));
    Interp *it = interp(&b);
    const double ts[] = {0.5, 3, 4, 50, 100, 250}, ns[] = {0.25, 1, 10};
    for (int i = 0; i < 6; i++) {
        double n = ns[i % 3];
        set(it, "t", &ts[i], 1), set(it, "n", &n, 1);
        run_ok(it);
        float ft = (float)ts[i], fn = (float)n, out = NAN;
        rt_schedule sched = {.lr = 1e-3, .min_lr = 1e-4, .warmup = 3, .total = 100};
        RUN(rtk_lr_cosine, P(&ft), P(&out), P(&sched));
        check("lr_cosine", &out, ref(it, lr), 1, TOL);
        RUN(rtk_clipscale, P(&fn), P(&out), F(1));
        check("clipscale", &out, ref(it, c1), 1, TOL);
        RUN(rtk_clipscale, P(&fn), P(&out), F(0));
        check("clipscale max=0", &out, ref(it, c0), 1, 0);
    }
    interp_free(it);
    ir_free(b.m);
}

static void test_sumsq(void **st) {
    enum { R = 1000, C = 70 }; /* several of the fixed blocks */
    Bld b = bld();
    int x = input(&b, "x", TY(DT_F32, R, C));
    int y = val(&b, OP_sumsq, INS(x), NOATS);
    double *X = rnd(R * C, 60, 3);
    Interp *it = interp(&b);
    set(it, "x", X, R * C);
    run_ok(it);
    float out = NAN;
    RUN(rtk_sumsq, P(f32(X, R * C)), P(&out), R * C);
    check("sumsq", &out, ref(it, y), 1, TOL);
    interp_free(it);
    ir_free(b.m);
}

/* ---- reductions ---- */

enum { D0 = 4, D1 = 6, D2 = 70 }; /* x [4,6,70]: inner 70 spans two chunks */
static const int64_t XD[3] = {D0, D1, D2};

static void split3(int dim, int64_t *outer, int64_t *n, int64_t *inner) {
    *outer = *inner = 1;
    for (int i = 0; i < dim; i++) *outer *= XD[i];
    for (int i = dim + 1; i < 3; i++) *inner *= XD[i];
    *n = XD[dim];
}

static void test_reduce(void **st) {
    static const Op ops[3] = {OP_sum, OP_mean, OP_max};
    static const char *names[3] = {"sum", "mean", "max"};
    int64_t nx = D0 * D1 * D2;
    double *X = rnd(nx, 70, 4), *Xnan = keep(malloc(sizeof(double) * (size_t)nx));
    memcpy(Xnan, X, sizeof(double) * (size_t)nx);
    Xnan[5] = NAN; /* max propagates NaN */
    for (int kind = 0; kind < 3; kind++)
        for (int dim = 0; dim < 3; dim++) {
            const double *Xs = kind == 2 ? Xnan : X;
            Bld b = bld();
            int x = input(&b, "x", TY(DT_F32, D0, D1, D2));
            int y = val(&b, ops[kind], INS(x), ATS(ai(&b, "dim", dim), ai(&b, "keep", dim == 1)));
            Interp *it = interp(&b);
            set(it, "x", Xs, nx);
            run_ok(it);
            int64_t outer, n, inner;
            split3(dim, &outer, &n, &inner);
            float *Y = fbuf(outer * inner);
            RUN(rtk_reduce, P(f32(Xs, nx)), P(Y), outer, n, inner, kind);
            const double *want = ref(it, y);
            char what[64];
            snprintf(what, sizeof what, "reduce %s dim %d", names[kind], dim);
            for (int64_t i = 0; i < outer * inner; i++)
                if (!isnan(want[i]) != !isnan(Y[i])) fail_msg("%s: NaN at [%lld] differs", what, (long long)i);
            float *Yc = fbuf(outer * inner); /* NaNs matched: compare the rest */
            double *Wc = keep(malloc(sizeof(double) * (size_t)(outer * inner)));
            for (int64_t i = 0; i < outer * inner; i++) {
                Wc[i] = isnan(want[i]) ? 0 : want[i];
                Yc[i] = isnan(Y[i]) ? 0 : Y[i];
            }
            check(what, Yc, Wc, outer * inner, TOL);
            interp_free(it);
            ir_free(b.m);
        }
}

static void test_max_bwd(void **st) {
    int64_t nx = D0 * D1 * D2;
    double *X = rnd(nx, 80, 2);
    for (int64_t i = 0; i < nx; i++) X[i] = floor(X[i] * 2); /* many ties: the first argmax wins */
    for (int dim = 0; dim < 3; dim++) {
        int64_t outer, n, inner;
        split3(dim, &outer, &n, &inner);
        Bld b = bld();
        int x = input(&b, "x", TY(DT_F32, D0, D1, D2));
        int y = val(&b, OP_max, INS(x), ATS(ai(&b, "dim", dim), ai(&b, "keep", 0)));
        const Type *yt = &b.g->vals[y].t;
        int dy = input(&b, "dy", *yt);
        int dx = val(&b, OP_max_bwd, INS(dy, x, y), ATS(ai(&b, "dim", dim), ai(&b, "keep", 0)));
        double *DY = rnd(outer * inner, 81, 1);
        Interp *it = interp(&b);
        set(it, "x", X, nx), set(it, "dy", DY, outer * inner);
        run_ok(it);
        float *DX = fbuf(nx);
        RUN(rtk_max_bwd, P(f32(DY, outer * inner)), P(f32(X, nx)), P(f32(ref(it, y), outer * inner)), P(DX), outer, n,
            inner);
        check(dim == 0 ? "max_bwd dim 0" : dim == 1 ? "max_bwd dim 1" : "max_bwd dim 2", DX, ref(it, dx), nx, 0);
        interp_free(it);
        ir_free(b.m);
    }
}

/* y strides of `small` broadcast against `big` (0 on a summed dim) */
static void bstrides(const Type *small, const Type *big, int64_t *ys) {
    int shift = big->rank - small->rank;
    int64_t s = 1;
    for (int d = big->rank - 1; d >= 0; d--) {
        int k = d - shift;
        ys[d] = k < 0 || small->dim[k] == 1 ? 0 : s;
        if (k >= 0) s *= small->dim[k];
    }
}

static void test_sumto(void **st) {
    const Type big = TY(DT_F32, D0, D1, D2);
    const Type smalls[] = {TY(DT_F32, D2), TY(DT_F32, D1, 1), TY(DT_F32, D0, 1, D2), TY(DT_F32, 1),
                           TY(DT_F32, D0, D1, D2), TY(DT_F32, D0, D1, 1), TY(DT_F32, D1, D2)};
    int64_t nx = D0 * D1 * D2;
    double *X = rnd(nx, 90, 3);
    for (int c = 0; c < (int)(sizeof smalls / sizeof *smalls); c++) {
        Bld b = bld();
        int x = input(&b, "x", big);
        int y = val(&b, OP_sumto, INS(x), ATS(shape(&b, smalls[c])));
        Interp *it = interp(&b);
        set(it, "x", X, nx);
        run_ok(it);
        int64_t ys[3], ny = ir_numel(&smalls[c]);
        bstrides(&smalls[c], &big, ys);
        float *Y = fbuf(ny);
        RUN(rtk_sumto, P(f32(X, nx)), P(Y), 3, D0, D1, D2, 1, 1, ys[0], ys[1], ys[2], 0, 0);
        char what[64];
        snprintf(what, sizeof what, "sumto case %d", c);
        check(what, Y, ref(it, y), ny, TOL);
        interp_free(it);
        ir_free(b.m);
    }
}

/* ---- copies ---- */

/* row-major element strides of t */
static void strides(const Type *t, int64_t *s) {
    int64_t k = 1;
    for (int d = t->rank - 1; d >= 0; d--) s[d] = k, k *= t->dim[d];
}

/* rtk_copy with up to 5 dims (unused dims 1) */
static void copy5(const void *src, void *dst, int64_t esz, int rank, const int64_t *d, const int64_t *ss,
                  const int64_t *ds) {
    int64_t a[19] = {P(src), P(dst), esz, rank};
    for (int k = 0; k < 5; k++) {
        a[4 + k] = k < rank ? d[k] : 1;
        a[9 + k] = k < rank ? ss[k] : 0;
        a[14 + k] = k < rank ? ds[k] : 0;
    }
    launch_ok(rtk_copy, a, 19);
}

static void transpose_case(Type xt, int ta, int tb) {
    Bld b = bld();
    int x = input(&b, "x", xt);
    int y = val(&b, OP_transpose, INS(x), ATS(ai(&b, "a", ta), ai(&b, "b", tb)));
    const Type yt = b.g->vals[y].t;
    int64_t n = ir_numel(&xt), xs[5], ys[5];
    double *X = rnd(n, 100, 1);
    Interp *it = interp(&b);
    set(it, "x", X, n);
    run_ok(it);
    strides(&xt, xs);
    strides(&yt, ys);
    int64_t t = xs[ta]; /* walk y's index space: source strides swapped */
    xs[ta] = xs[tb];
    xs[tb] = t;
    float *Y = fbuf(n);
    copy5(f32(X, n), Y, 4, xt.rank, yt.dim, xs, ys);
    check("copy as transpose", Y, ref(it, y), n, 0);
    interp_free(it);
    ir_free(b.m);
}

static void test_copy(void **st) {
    transpose_case(TY(DT_F32, 3, 4, 5, 6), 1, 2); /* [B,T,H,D] -> [B,H,T,D]: rows of D */
    transpose_case(TY(DT_F32, 2, 9, 7), 1, 2);    /* a strided innermost dim */
    transpose_case(TY(DT_F32, 2, 3, 4, 5, 6), 0, 4);

    { /* slice dim 1 [2,7) of [4,10,6] */
        Bld b = bld();
        Type xt = TY(DT_F32, 4, 10, 6);
        int x = input(&b, "x", xt);
        int y = val(&b, OP_slice, INS(x), ATS(ai(&b, "dim", 1), ai(&b, "start", 2), ai(&b, "end", 7)));
        double *X = rnd(240, 101, 1);
        Interp *it = interp(&b);
        set(it, "x", X, 240);
        run_ok(it);
        float *Y = fbuf(120);
        copy5(f32(X, 240) + 2 * 6, Y, 4, 3, (int64_t[]){4, 5, 6}, (int64_t[]){60, 6, 1}, (int64_t[]){30, 6, 1});
        check("copy as slice", Y, ref(it, y), 120, 0);
        interp_free(it);
        ir_free(b.m);
    }
    { /* broadcast [5,1] -> [3,5,7] */
        Bld b = bld();
        int x = input(&b, "x", TY(DT_F32, 5, 1));
        int y = val(&b, OP_broadcast, INS(x), ATS(shape(&b, TY(DT_F32, 3, 5, 7))));
        double *X = rnd(5, 102, 1);
        Interp *it = interp(&b);
        set(it, "x", X, 5);
        run_ok(it);
        float *Y = fbuf(105);
        copy5(f32(X, 5), Y, 4, 3, (int64_t[]){3, 5, 7}, (int64_t[]){0, 1, 0}, (int64_t[]){35, 7, 1});
        check("copy as broadcast", Y, ref(it, y), 105, 0);
        interp_free(it);
        ir_free(b.m);
    }
    { /* concat [2,3,4] and [2,5,4] on dim 1: one copy per part */
        Bld b = bld();
        int x1 = input(&b, "a", TY(DT_F32, 2, 3, 4)), x2 = input(&b, "b", TY(DT_F32, 2, 5, 4));
        int y = val(&b, OP_concat, INS(x1, x2), ATS(ai(&b, "dim", 1)));
        double *A = rnd(24, 103, 1), *B = rnd(40, 104, 1);
        Interp *it = interp(&b);
        set(it, "a", A, 24), set(it, "b", B, 40);
        run_ok(it);
        float *Y = fbuf(64);
        copy5(f32(A, 24), Y, 4, 3, (int64_t[]){2, 3, 4}, (int64_t[]){12, 4, 1}, (int64_t[]){32, 4, 1});
        copy5(f32(B, 40), Y + 3 * 4, 4, 3, (int64_t[]){2, 5, 4}, (int64_t[]){20, 4, 1}, (int64_t[]){32, 4, 1});
        check("copy as concat parts", Y, ref(it, y), 64, 0);
        interp_free(it);
        ir_free(b.m);
    }
    { /* other element sizes: a 2-byte and an 8-byte transpose of [3,5] */
        uint16_t s2[15], d2[15];
        uint64_t s8[15], d8[15];
        for (int i = 0; i < 15; i++) s2[i] = (uint16_t)(i * 3 + 1), s8[i] = (uint64_t)i << 40 | (uint64_t)i;
        copy5(s2, d2, 2, 2, (int64_t[]){5, 3}, (int64_t[]){1, 5}, (int64_t[]){3, 1});
        copy5(s8, d8, 8, 2, (int64_t[]){5, 3}, (int64_t[]){1, 5}, (int64_t[]){3, 1});
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 5; j++) {
                assert_int_equal(d2[j * 3 + i], s2[i * 5 + j]);
                assert_true(d8[j * 3 + i] == s8[i * 5 + j]);
            }
    }
}

static void test_fill_iota_memcpy(void **st) {
    Bld b = bld();
    Type tf = TY(DT_F32, 37), ti = TY(DT_I32, 50), tio = TY(DT_I32, 100000);
    int cf = ir_out(b.g, node(&b, OP_const, NULL, 0, ATS(af(&b, "v", 2.5)), &tf));
    int ci = ir_out(b.g, node(&b, OP_const, NULL, 0, ATS(af(&b, "v", -7.75)), &ti));
    int io = ir_out(b.g, node(&b, OP_iota, NULL, 0, NOATS, &tio));
    Interp *it = interp(&b);
    run_ok(it);
    float *fl = fbuf(37);
    RUN(rtk_fill, P(fl), 37, F(2.5), RT_F32);
    check("fill f32", fl, ref(it, cf), 37, 0);
    int32_t I[50], *IO = keep(malloc(sizeof(int32_t) * 100000));
    RUN(rtk_fill, P(I), 50, F(-7.75), RT_I32);
    for (int i = 0; i < 50; i++) assert_int_equal(I[i], (int32_t)ref(it, ci)[i]);
    RUN(rtk_iota, P(IO), 100000);
    for (int i = 0; i < 100000; i++) assert_int_equal(IO[i], (int32_t)ref(it, io)[i]);
    /* memcpy: large enough for several jobs, an odd byte count */
    int64_t nb = 3 * (1 << 18) + 5;
    char *src = keep(malloc((size_t)nb)), *dst = keep(calloc((size_t)nb, 1));
    for (int64_t i = 0; i < nb; i++) src[i] = (char)(i * 31 + 7);
    RUN(rtk_memcpy, P(dst), P(src), nb);
    assert_memory_equal(dst, src, (size_t)nb);
    interp_free(it);
    ir_free(b.m);
}

int main(void) {
#define T(f) cmocka_unit_test_teardown(f, release)
    const struct CMUnitTest tests[] = {
        T(test_gemm),      T(test_layernorm), T(test_rmsnorm),  T(test_softmax),         T(test_rope),
        T(test_dropout),   T(test_attention), T(test_attention_naive), T(test_attention_window), T(test_attention_positions), T(test_attn_merge),
        T(test_embedding), T(test_embedding_bad_id), T(test_cross_entropy), T(test_adamw),
        T(test_lr_clip),   T(test_sumsq),     T(test_reduce),   T(test_max_bwd),         T(test_sumto),
        T(test_copy),      T(test_fill_iota_memcpy),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
