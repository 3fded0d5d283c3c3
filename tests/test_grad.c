/* test_grad.c — autodiff against central finite differences, in f64.
 *
 * Each test builds a small forward graph by hand: params feed one op, the op's
 * outputs are folded into a scalar loss = sum(out * R) with a fixed random R
 * (an input), so every output element matters and no gradient can cancel by
 * symmetry.  pass_autodiff adds the backward; the interpreter runs the step in
 * f64 and reports grad:<param>; each param element is then perturbed through
 * interp_state and compared with a fourth-order central difference,
 * (-L(x+2h) + 8L(x+h) - 8L(x-h) + L(x-2h)) / 12h, h = 1e-3 * max(1, |x|).
 *
 * Tolerance: |ad - fd| <= 1e-6 * max(|fd|, FLOOR) for every element, FLOOR =
 * 1e-3.  The stencil's truncation error is ~h^4 = 1e-12 and its rounding error
 * ~1e-16 |L| / h ~ 1e-12 (|L| is O(1..10) here), so the measured errors are
 * ~1e-10, four orders below the tolerance; a plain 2-point difference with
 * h = 1e-6 has noise ~1e-9 absolute, too close to 1e-6 * FLOOR.  Inputs are
 * random with a fixed seed; those of relu and max lie farther than 2h from
 * their kinks (else the check would fail loudly, not pass silently).
 *
 * The whole-model tests load models/tiny.lua and models/llama.lua through the
 * front end and check ~20 sampled parameter entries the same way.
 */
#include "testutil.h"

#define TOL 1e-6
#define FLOOR 1e-3
#ifndef HREL
#define HREL 1e-3
#endif

/* ---- deterministic random numbers ---- */

static uint64_t rng_state = 12345;
static double urand(void) { /* [0,1) */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) / 9007199254740992.0;
}

/* ---- building test graphs ---- */

typedef struct {
    const char *name;
    double lo, hi; /* uniform init (floats), or [lo, hi) ints for int inputs */
    int is_int;
    const double *fixed; /* non-NULL: these values instead (token positions) */
} Fill;

typedef struct {
    Module *m;
    Graph *g;
    int line;
    Fill fills[260]; /* test_concat256's 256 params */
    int nfills;
} T;

static T *t_new(void) {
    T *t = calloc(1, sizeof *t);
    t->m = ir_module_new("test");
    t->g = t->m->stages[0];
    return t;
}

static void t_free(T *t) {
    ir_free(t->m);
    free(t);
}

static Type ty(DType dt, int rank, const int64_t *d) {
    Type t = {.dt = dt, .rank = rank};
    for (int i = 0; i < rank; i++) t.dim[i] = d[i];
    return t;
}
#define DIMS(...) (sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), ((int64_t[]){__VA_ARGS__})
#define F32(...) ty(DT_F32, DIMS(__VA_ARGS__))
#define I32(...) ty(DT_I32, DIMS(__VA_ARGS__))

static int t_node(T *t, Op op, int nin, const int *in, int nattr, const Attr *at, const Type *src) {
    NodeSpec s = ir_spec(op, (Loc){ir_intern(t->m, "test.lua"), ++t->line});
    s.nin = nin;
    s.in = in;
    s.nattr = nattr;
    s.attr = at;
    s.src_type = src;
    char err[256] = "";
    int n = ir_add_node(t->g, &s, err, sizeof err);
    if (n < 0) fail_msg("building %s: %s", ir_ops[op].name, err);
    return n;
}
static int t_op(T *t, Op op, int nin, const int *in, int nattr, const Attr *at) {
    return ir_out(t->g, t_node(t, op, nin, in, nattr, at, NULL));
}
static int t_op1(T *t, Op op, int x) { return t_op(t, op, 1, &x, 0, NULL); }
static int t_op2(T *t, Op op, int x, int y) {
    int in[2] = {x, y};
    return t_op(t, op, 2, in, 0, NULL);
}
static Attr ai(T *t, const char *k, int64_t v) { return ir_attr_int(t->m, k, v); }
static Attr af(T *t, const char *k, double v) { return ir_attr_float(t->m, k, v); }
static Attr as(T *t, const char *k, const char *v) { return ir_attr_str(t->m, k, v); }

static int t_source(T *t, Op op, const char *name, Type ty_, double lo, double hi, int is_int) {
    Attr at[2] = {as(t, "name", name), as(t, "init", "zeros")};
    int v = ir_out(t->g, t_node(t, op, 0, NULL, op == OP_param ? 2 : 1, at, &ty_));
    assert_true(t->nfills < (int)(sizeof t->fills / sizeof t->fills[0]));
    t->fills[t->nfills++] = (Fill){ir_intern(t->m, name), lo, hi, is_int, NULL};
    return v;
}
/* An int input holding exactly `vals` (numel of ty_ of them; they must outlive the test). */
static int t_fixed(T *t, const char *name, Type ty_, const double *vals) {
    int v = t_source(t, OP_input, name, ty_, 0, 0, 1);
    t->fills[t->nfills - 1].fixed = vals;
    return v;
}
static int t_param(T *t, const char *name, Type ty_, double lo, double hi) {
    return t_source(t, OP_param, name, ty_, lo, hi, 0);
}
static int t_param1(T *t, const char *name, Type ty_) { return t_param(t, name, ty_, -1.5, 1.5); }
static int t_ints(T *t, const char *name, Type ty_, int lo, int hi) {
    return t_source(t, OP_input, name, ty_, lo, hi, 1);
}
static int t_iota(T *t, int64_t n) {
    Type it = I32(n);
    return ir_out(t->g, t_node(t, OP_iota, 0, NULL, 0, NULL, &it));
}

/* loss = sum_i sum(outs[i] * R_i), R_i random inputs. */
static void t_loss(T *t, int nout, const int *outs) {
    int acc = -1;
    for (int i = 0; i < nout; i++) {
        char name[16];
        snprintf(name, sizeof name, "R%d", i);
        int r = t_source(t, OP_input, name, t->g->vals[outs[i]].t, -1, 1, 0);
        int s = t_op2(t, OP_mul, outs[i], r);
        while (t->g->vals[s].t.rank > 0) {
            Attr at[2] = {ai(t, "dim", 0), ai(t, "keep", 0)};
            s = t_op(t, OP_sum, 1, &s, 2, at);
        }
        acc = acc < 0 ? s : t_op2(t, OP_add, acc, s);
    }
    t_op1(t, OP_loss, acc);
}

/* ---- running and checking ---- */

static void set_data(Interp *it, const Graph *g, const Fill *fills, int nfills) {
    for (int f = 0; f < nfills; f++) {
        Tensor *p = interp_state(it, 0, fills[f].name);
        int64_t n = 0;
        const Type *ty_ = NULL;
        for (int i = 0; i < g->nnodes; i++) {
            const Node *nd = &g->nodes[i];
            if ((nd->op == OP_input || nd->op == OP_param) && !strcmp(ir_attr_s(nd, "name", ""), fills[f].name))
                ty_ = &g->vals[nd->out[0]].t;
        }
        assert_non_null(ty_);
        n = ir_numel(ty_);
        double *d = malloc(sizeof(double) * (size_t)n);
        for (int64_t k = 0; k < n; k++) {
            double u = urand();
            d[k] = fills[f].fixed    ? fills[f].fixed[k]
                   : fills[f].is_int ? (double)(int)(fills[f].lo + u * (fills[f].hi - fills[f].lo))
                                     : fills[f].lo + u * (fills[f].hi - fills[f].lo);
        }
        if (p) {
            assert_int_equal(p->n, n);
            memcpy(p->d, d, sizeof(double) * (size_t)n);
        } else {
            assert_int_equal(interp_set_input(it, 0, fills[f].name, d, n), 0);
        }
        free(d);
    }
}

static double run_loss(Interp *it) {
    char err[256];
    if (interp_run(it, err, sizeof err) != 0) fail_msg("interp_run: %s", err);
    const Tensor *l = interp_output(it, 0, "loss");
    assert_non_null(l);
    return l->d[0];
}

/* Fourth-order central difference of the loss in element k of param `name`:
 * (-L(x+2h) + 8 L(x+h) - 8 L(x-h) + L(x-2h)) / 12h. */
static double fd_grad(Interp *it, const char *name, int64_t k) {
    static const double off[4] = {2, 1, -1, -2}, w[4] = {-1, 8, -8, 1};
    Tensor *p = interp_state(it, 0, name);
    double x = p->d[k], h = HREL * (fabs(x) > 1 ? fabs(x) : 1), acc = 0;
    for (int i = 0; i < 4; i++) {
        p->d[k] = x + off[i] * h;
        acc += w[i] * run_loss(it);
    }
    p->d[k] = x;
    return acc / (12 * h);
}

/* Params of g in order: names into out[], returns count. */
static int param_names(const Graph *g, const char **out, int max) {
    int n = 0;
    for (int i = 0; i < g->nnodes && n < max; i++)
        if (g->nodes[i].op == OP_param) out[n++] = ir_attr_s(&g->nodes[i], "name", "?");
    return n;
}

/* Autodiff g, then check every param element (sample > 0: that many random
 * entries over all params instead).  Returns the worst relative error. */
static double check_grads(Module *m, const Fill *fills, int nfills, int sample, const char *label) {
    Options o;
    opt_defaults(&o);
    pass_autodiff(m, &o);
    char err[512];
    if (ir_verify_module(m, err, sizeof err) != 0) fail_msg("%s: verify after autodiff: %s", label, err);

    Graph *g = m->stages[0];
    Interp *it = interp_new(m, 1);
    interp_init_state(it, 7);
    set_data(it, g, fills, nfills);
    run_loss(it);

    const char *names[256];
    int np = param_names(g, names, 256);
    /* copy the analytic grads: later runs overwrite outputs */
    double *ad[256];
    int64_t cnt[256], total = 0;
    for (int p = 0; p < np; p++) {
        char gname[300];
        snprintf(gname, sizeof gname, "grad:%s", names[p]);
        const Tensor *gt = interp_output(it, 0, gname);
        if (!gt) fail_msg("%s: no output %s", label, gname);
        cnt[p] = gt->n;
        total += gt->n;
        ad[p] = malloc(sizeof(double) * (size_t)gt->n);
        memcpy(ad[p], gt->d, sizeof(double) * (size_t)gt->n);
    }
    double worst = 0;
    int checks = sample > 0 ? sample : (int)total;
    for (int c = 0; c < checks; c++) {
        int p = 0;
        int64_t k = c;
        if (sample > 0) { /* spread the samples evenly over the params, then random entries */
            p = (int)((int64_t)c * np / checks);
            k = (int64_t)(urand() * (double)cnt[p]);
        } else {
            while (k >= cnt[p]) k -= cnt[p++];
        }
        double fd = fd_grad(it, names[p], k), a = ad[p][k];
        double e = rel_err(&a, &fd, 1, FLOOR);
        if (e > worst) worst = e;
        if (e > TOL || (sample > 0 && getenv("KILN_VERBOSE"))) print_message("%s: grad:%s[%lld] autodiff %.12g fd %.12g (rel %.3g)\n", label, names[p], (long long)k, a, fd, e);
    }
    for (int p = 0; p < np; p++) free(ad[p]);
    interp_free(it);
    return worst;
}

static void check_t(T *t, const char *label) {
    double e = check_grads(t->m, t->fills, t->nfills, 0, label);
    if (getenv("KILN_VERBOSE")) print_message("%s: worst relative error %.3g\n", label, e);
    assert_true(e <= TOL);
    t_free(t);
}

/* ---- elementwise ---- */

static void unary_case(Op op, double lo, double hi) {
    T *t = t_new();
    int x = t_param(t, "x", F32(3, 4), lo, hi);
    int y = t_op1(t, op, x);
    t_loss(t, 1, &y);
    check_t(t, ir_ops[op].name);
}

static void test_unary(void **s) {
    unary_case(OP_neg, -2, 2);
    unary_case(OP_exp, -2, 2);
    unary_case(OP_log, 0.3, 3);
    unary_case(OP_sqrt, 0.3, 3);
    unary_case(OP_rsqrt, 0.3, 3);
    unary_case(OP_tanh, -2, 2);
    unary_case(OP_gelu, -3, 3);
    unary_case(OP_silu, -3, 3);
    unary_case(OP_relu, -2, 2);
}

static void binary_case(Op op) {
    T *t = t_new();
    int a = t_param1(t, "a", F32(3, 4));
    int b = op == OP_div ? t_param(t, "b", F32(3, 4), 0.5, 2) : t_param1(t, "b", F32(3, 4));
    int y = t_op2(t, op, a, b);
    t_loss(t, 1, &y);
    check_t(t, ir_ops[op].name);
}

static void test_binary(void **s) {
    binary_case(OP_add);
    binary_case(OP_sub);
    binary_case(OP_mul);
    binary_case(OP_div);
}

/* A value with several consumers, one op using a value twice: contributions add. */
static void test_fanout(void **s) {
    T *t = t_new();
    int x = t_param1(t, "x", F32(2, 3));
    int y = t_op1(t, OP_exp, x);
    int z = t_op2(t, OP_mul, y, y);
    int zx = t_op2(t, OP_mul, z, x), ty_ = t_op1(t, OP_tanh, y);
    int w = t_op2(t, OP_add, zx, ty_);
    t_loss(t, 1, &w);
    check_t(t, "fanout");
}

/* ---- reductions ---- */

static void test_reductions(void **s) {
    Op ops[3] = {OP_sum, OP_mean, OP_max};
    for (int o = 0; o < 3; o++)
        for (int dim = 0; dim < 3; dim++)
            for (int keep = 0; keep < 2; keep++) {
                T *t = t_new();
                int x = t_param1(t, "x", F32(2, 3, 4));
                Attr at[2] = {ai(t, "dim", dim), ai(t, "keep", keep)};
                int y = t_op(t, ops[o], 1, &x, 2, at);
                t_loss(t, 1, &y);
                char label[64];
                snprintf(label, sizeof label, "%s dim=%d keep=%d", ir_ops[ops[o]].name, dim, keep);
                check_t(t, label);
            }
}

static void test_sumsq(void **s) {
    T *t = t_new();
    int x = t_param1(t, "x", F32(2, 3));
    int y = t_op1(t, OP_sumsq, x);
    t_loss(t, 1, &y);
    check_t(t, "sumsq");
}

/* ---- shape ops ---- */

static void test_reshape_transpose(void **s) {
    T *t = t_new();
    int x = t_param1(t, "x", F32(2, 3, 4));
    int64_t shp[2] = {6, 4};
    Attr r = ir_attr_ints(t->m, "shape", shp, 2);
    int y = t_op(t, OP_reshape, 1, &x, 1, &r);
    t_loss(t, 1, &y);
    check_t(t, "reshape");

    t = t_new();
    x = t_param1(t, "x", F32(2, 3, 4));
    Attr tr[2] = {ai(t, "a", 0), ai(t, "b", 2)};
    y = t_op(t, OP_transpose, 1, &x, 2, tr);
    t_loss(t, 1, &y);
    check_t(t, "transpose");
}

static void test_slice(void **s) {
    int64_t cases[3][2] = {{1, 3}, {0, 2}, {2, 5}}; /* middle, prefix, suffix of 5 */
    for (int c = 0; c < 3; c++) {
        T *t = t_new();
        int x = t_param1(t, "x", F32(2, 5, 3));
        Attr at[3] = {ai(t, "dim", 1), ai(t, "start", cases[c][0]), ai(t, "end", cases[c][1])};
        int y = t_op(t, OP_slice, 1, &x, 3, at);
        t_loss(t, 1, &y);
        check_t(t, "slice");
    }
}

/* Several slices of one value: autodiff joins their gradients (one concat
 * when they lie on one dim without overlap, zeros in the gaps; otherwise one
 * padded copy each), plus a dense use of the same value. */
static void test_slices_of_one_value(void **s) {
    int64_t cases[3][2][3] = {
        {{1, 0, 1}, {1, 2, 4}}, /* dim 1: [0,1) and [2,4), gap [1,2) and [4,5) */
        {{1, 0, 3}, {1, 2, 5}}, /* overlapping */
        {{1, 1, 4}, {2, 0, 2}}, /* different dims */
    };
    for (int c = 0; c < 3; c++)
        for (int dense = 0; dense < 2; dense++) {
            T *t = t_new();
            int x = t_param1(t, "x", F32(2, 5, 3)), ys[3];
            for (int k = 0; k < 2; k++) {
                Attr at[3] = {ai(t, "dim", cases[c][k][0]), ai(t, "start", cases[c][k][1]), ai(t, "end", cases[c][k][2])};
                ys[k] = t_op(t, OP_slice, 1, &x, 3, at);
            }
            ys[2] = x;
            t_loss(t, 2 + dense, ys);
            char label[64];
            snprintf(label, sizeof label, "slices case %d dense %d", c, dense);
            check_t(t, label);
        }
}

static void test_concat(void **s) {
    T *t = t_new();
    int in[3] = {t_param1(t, "a", F32(2, 1, 3)), t_param1(t, "b", F32(2, 4, 3)), t_param1(t, "c", F32(2, 2, 3))};
    Attr at = ai(t, "dim", 1);
    int y = t_op(t, OP_concat, 3, in, 1, &at);
    t_loss(t, 1, &y);
    check_t(t, "concat");
}

/* the documented maximum of 256 inputs (autodiff once stopped at 64) */
static void test_concat256(void **s) {
    T *t = t_new();
    int in[256];
    for (int k = 0; k < 256; k++) {
        char name[16];
        snprintf(name, sizeof name, "p%d", k);
        in[k] = t_param1(t, name, F32(2, 1 + k % 3));
    }
    Attr at = ai(t, "dim", 1);
    int y = t_op(t, OP_concat, 256, in, 1, &at);
    t_loss(t, 1, &y);
    check_t(t, "concat of 256");
}

static void test_broadcast_sumto(void **s) {
    int64_t big[3] = {2, 3, 4};
    Type smalls[3] = {F32(3, 1), F32(4), F32(1, 3, 4)};
    for (int c = 0; c < 3; c++) {
        T *t = t_new();
        int x = t_param1(t, "x", smalls[c]);
        Attr at = ir_attr_ints(t->m, "shape", big, 3);
        int y = t_op(t, OP_broadcast, 1, &x, 1, &at);
        t_loss(t, 1, &y);
        check_t(t, "broadcast");

        t = t_new();
        x = t_param1(t, "x", F32(2, 3, 4));
        Attr st = ir_attr_ints(t->m, "shape", smalls[c].dim, smalls[c].rank);
        y = t_op(t, OP_sumto, 1, &x, 1, &st);
        t_loss(t, 1, &y);
        check_t(t, "sumto");
    }
}

static void test_cast(void **s) {
    /* numerically: f32 -> f32 */
    T *t = t_new();
    int x = t_param1(t, "x", F32(2, 3));
    Attr c = as(t, "dtype", "f32");
    int y = t_op(t, OP_cast, 1, &x, 1, &c);
    t_loss(t, 1, &y);
    check_t(t, "cast");

    /* structurally: bf16 param -> f32 -> loss: the gradient is cast back to bf16 */
    t = t_new();
    x = t_param1(t, "x", ty(DT_BF16, DIMS(2, 3)));
    c = as(t, "dtype", "f32");
    y = t_op(t, OP_cast, 1, &x, 1, &c);
    t_loss(t, 1, &y);
    Options o;
    opt_defaults(&o);
    pass_autodiff(t->m, &o);
    char err[256];
    assert_int_equal(ir_verify_module(t->m, err, sizeof err), 0);
    Graph *g = t->m->stages[0];
    int found = 0;
    for (int i = 0; i < g->nnodes; i++) {
        Node *n = &g->nodes[i];
        if (n->op == OP_output && !strcmp(ir_attr_s(n, "name", ""), "grad:x")) {
            assert_int_equal(g->vals[n->in[0]].t.dt, DT_BF16);
            int d = g->vals[n->in[0]].def;
            assert_int_equal(g->nodes[d].op, OP_cast);
            assert_string_equal(ir_attr_s(&g->nodes[d], "dtype", ""), "bf16");
            found = 1;
        }
    }
    assert_true(found);
    t_free(t);
}

/* ---- matmul: every ta/tb, rank-2, batched b, rank-2 b under batched a ---- */

static Type mm_type(int rank_batch, int64_t rows, int64_t cols, int trans) {
    Type t = {.dt = DT_F32, .rank = rank_batch + 2};
    for (int i = 0; i < rank_batch; i++) t.dim[i] = 2 + i; /* batch dims 2, 3 */
    t.dim[rank_batch] = trans ? cols : rows;
    t.dim[rank_batch + 1] = trans ? rows : cols;
    return t;
}

static void test_matmul(void **s) {
    const int64_t M = 3, K = 4, N = 2;
    struct { int abatch, bbatch; const char *what; } shapes[3] = {
        {0, 0, "rank-2"}, {1, 1, "batched b"}, {2, 0, "rank-2 b, batched a"}};
    for (int sh = 0; sh < 3; sh++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                T *t = t_new();
                int a = t_param1(t, "a", mm_type(shapes[sh].abatch, M, K, ta));
                int b = t_param1(t, "b", mm_type(shapes[sh].bbatch, K, N, tb));
                Attr at[2] = {ai(t, "ta", ta), ai(t, "tb", tb)};
                int in[2] = {a, b};
                int y = t_op(t, OP_matmul, 2, in, 2, at);
                t_loss(t, 1, &y);
                char label[64];
                snprintf(label, sizeof label, "matmul %s ta=%d tb=%d", shapes[sh].what, ta, tb);
                check_t(t, label);
            }
}

/* ---- issue 17: sigmoid, abs, pow, minimum, maximum, where, layernorm without a bias ---- */

static void pow_case(double p, double lo, double hi) {
    T *t = t_new();
    int x = t_param(t, "x", F32(3, 4), lo, hi);
    Attr at = af(t, "p", p);
    int y = t_op(t, OP_pow, 1, &x, 1, &at);
    t_loss(t, 1, &y);
    char label[32];
    snprintf(label, sizeof label, "pow p=%g", p);
    check_t(t, label);
}

static void test_ops17(void **s) {
    unary_case(OP_sigmoid, -3, 3);
    unary_case(OP_abs, -2, 2); /* the seed's draws lie farther than 2h from 0 */
    pow_case(1.5, 0.3, 3);
    pow_case(-2, 0.3, 3);
    pow_case(3, -2, 2);
    pow_case(2, -2, 2);
    pow_case(0, -2, 2); /* no gradient: zero, as FD */
    binary_case(OP_minimum);
    binary_case(OP_maximum);
    /* where: a fixed mask with zeros, a NaN (true) and other nonzeros */
    static const double mask[12] = {0, 1, 0, -2, 0.5, 0, 0, NAN, 1, 0, 3, 0};
    T *t = t_new();
    int c = t_source(t, OP_input, "c", F32(3, 4), 0, 0, 0);
    t->fills[t->nfills - 1].fixed = mask;
    int in[3] = {c, t_param1(t, "a", F32(3, 4)), t_param1(t, "b", F32(3, 4))};
    int y = t_op(t, OP_where, 3, in, 0, NULL);
    t_loss(t, 1, &y);
    check_t(t, "where");
}

/* A tie: d/dx maximum(x, x) = 1 = dy/2 + dy/2 (PyTorch's rule); the same for
 * minimum; abs(x - x) has gradient 0 (abs'(0) = 0). */
static void test_ops17_ties(void **s) {
    Op ops[2] = {OP_minimum, OP_maximum};
    for (int o = 0; o < 2; o++) {
        T *t = t_new();
        int x = t_param1(t, "x", F32(3, 4));
        int y = t_op2(t, ops[o], x, x);
        t_loss(t, 1, &y);
        check_t(t, ir_ops[ops[o]].name);
    }
    T *t = t_new();
    int x = t_param1(t, "x", F32(3, 4));
    int y = t_op2(t, OP_mul, t_op1(t, OP_abs, t_op2(t, OP_sub, x, x)), x);
    t_loss(t, 1, &y);
    check_t(t, "abs at 0");
}

static void test_layernorm_nobias(void **s) {
    T *t = t_new();
    int in[2] = {t_param1(t, "x", F32(2, 3, 5)), t_param1(t, "w", F32(5))};
    Attr eps = af(t, "eps", 1e-5);
    int y = t_op(t, OP_layernorm, 2, in, 1, &eps);
    t_loss(t, 1, &y);
    check_t(t, "layernorm without a bias");
}

/* ---- fused ops ---- */

static void test_layernorm(void **s) {
    T *t = t_new();
    int in[3] = {t_param1(t, "x", F32(2, 3, 5)), t_param1(t, "w", F32(5)), t_param1(t, "b", F32(5))};
    Attr eps = af(t, "eps", 1e-5);
    int y = t_op(t, OP_layernorm, 3, in, 1, &eps);
    t_loss(t, 1, &y);
    check_t(t, "layernorm");
}

static void test_rmsnorm(void **s) {
    T *t = t_new();
    int in[2] = {t_param1(t, "x", F32(2, 3, 5)), t_param1(t, "w", F32(5))};
    Attr eps = af(t, "eps", 1e-5);
    int y = t_op(t, OP_rmsnorm, 2, in, 1, &eps);
    t_loss(t, 1, &y);
    check_t(t, "rmsnorm");
}

static void test_softmax(void **s) {
    T *t = t_new();
    int x = t_param(t, "x", F32(2, 3, 5), -2, 2);
    int y = t_op1(t, OP_softmax, x);
    t_loss(t, 1, &y);
    check_t(t, "softmax");
}

static void test_rope(void **s) {
    T *t = t_new();
    int x = t_param1(t, "x", F32(2, 3, 2, 4));
    int in[2] = {x, t_iota(t, 3)};
    Attr th = af(t, "theta", 10.0);
    int y = t_op(t, OP_rope, 2, in, 1, &th);
    t_loss(t, 1, &y);
    check_t(t, "rope");
}

/* dropout (issue 17) at a fixed mask (step 3, an input): y = dropout(x) * x,
 * so the VJP's mask/(1-p) on dy is checked in both of x's paths; p = 0.5
 * drops about half of the 30 elements. */
static void test_dropout(void **s) {
    T *t = t_new();
    int x = t_param1(t, "x", F32(2, 3, 5));
    int in[4] = {x, t_source(t, OP_input, "step", (Type){.dt = DT_F32, .rank = 0}, 3, 4, 1), t_iota(t, 2), t_iota(t, 3)};
    Attr at[3] = {af(t, "p", 0.5), ai(t, "seed", 1), ai(t, "id", 0)};
    int y = t_op2(t, OP_mul, t_op(t, OP_dropout, 4, in, 3, at), x);
    t_loss(t, 1, &y);
    check_t(t, "dropout");
}

/* use: 1 = o only, 2 = lse only, 3 = both. */
static void attention_case(int causal, int use) {
    const int64_t B = 2, H = 4, KH = 2, T_ = 3, D = 4;
    T *t = t_new();
    int in[3] = {t_param1(t, "q", F32(B, H, T_, D)), t_param1(t, "k", F32(B, KH, T_, D)),
                 t_param1(t, "v", F32(B, KH, T_, D))};
    Attr at[2] = {ai(t, "causal", causal), af(t, "scale", 0.5)};
    int n = t_node(t, OP_attention, 3, in, 2, at, NULL);
    int outs[2], nout = 0;
    if (use & 1) outs[nout++] = t->g->nodes[n].out[0];
    if (use & 2) outs[nout++] = t->g->nodes[n].out[1];
    t_loss(t, nout, outs);
    char label[64];
    snprintf(label, sizeof label, "attention causal=%d use=%d", causal, use);
    check_t(t, label);
}

static void test_attention(void **s) {
    for (int causal = 0; causal < 2; causal++)
        for (int use = 1; use <= 3; use++) attention_case(causal, use);
}

/* attention(q, k, v, qpos, kpos), GQA (4 query heads, 2 kv heads), with
 * positions as context parallelism has them: not contiguous, not sorted,
 * S != T.  use as in attention_case; the lse is only used (use & 2) when
 * every query sees a key (else lse = -inf makes the loss infinite). */
static void attention_pos_case(int causal, int use, int T_, const double *qp, int S, const double *kp, const char *what,
                               int window) {
    const int64_t B = 2, H = 4, KH = 2, D = 3;
    T *t = t_new();
    int in[5] = {t_param1(t, "q", F32(B, H, T_, D)), t_param1(t, "k", F32(B, KH, S, D)),
                 t_param1(t, "v", F32(B, KH, S, D)), t_fixed(t, "qpos", I32(T_), qp), t_fixed(t, "kpos", I32(S), kp)};
    Attr at[3] = {ai(t, "causal", causal), af(t, "scale", 0.6), ai(t, "window", window)};
    int n = t_node(t, OP_attention, 5, in, window ? 3 : 2, at, NULL);
    int outs[2], nout = 0;
    if (use & 1) outs[nout++] = t->g->nodes[n].out[0];
    if (use & 2) outs[nout++] = t->g->nodes[n].out[1];
    t_loss(t, nout, outs);
    char label[96];
    snprintf(label, sizeof label, "attention positions %s causal=%d window=%d use=%d", what, causal, window, use);
    check_t(t, label);
}

static void test_attention_positions(void **s) {
    /* cp rank 0 of 2 on a length-8 sequence holds chunks 0 and 3: {0,1,6,7} */
    static const double own[4] = {0, 1, 6, 7}, shuffled[4] = {6, 0, 7, 1}, other[4] = {2, 3, 4, 5};
    static const double q4[4] = {5, 2, 4, 3}, k6[6] = {6, 0, 3, 7, 1, 4};
    for (int causal = 0; causal < 2; causal++)
        for (int use = 1; use <= 3; use++) {
            attention_pos_case(causal, use, 4, own, 4, shuffled, "dual-chunk", 0);
            attention_pos_case(causal, use, 4, q4, 6, k6, "permuted S!=T", 0);
        }
    /* a block of later tokens: queries 0 and 1 see no key (o = 0, no gradient) */
    attention_pos_case(1, 1, 4, own, 4, other, "masked rows", 0);
}

/* Sliding-window attention (window W: query t sees keys t-W+1..t): by
 * index with T = 5 and windows 1, 2, 4 (every query sees itself, so the
 * lse is finite), and by position as a cp rank has it. */
static void test_attention_window(void **s) {
    static const double own[4] = {0, 1, 6, 7}, shuffled[4] = {6, 0, 7, 1}, other[4] = {2, 3, 4, 5};
    static const double q4[4] = {5, 2, 4, 3}, k6[6] = {6, 0, 3, 7, 1, 4};
    static const int wins[3] = {1, 2, 4};
    for (int w = 0; w < 3; w++)
        for (int use = 1; use <= 3; use++) {
            const int64_t B = 2, H = 4, KH = 2, T_ = 5, D = 3;
            T *t = t_new();
            int in[3] = {t_param1(t, "q", F32(B, H, T_, D)), t_param1(t, "k", F32(B, KH, T_, D)),
                         t_param1(t, "v", F32(B, KH, T_, D))};
            Attr at[3] = {ai(t, "causal", 1), af(t, "scale", 0.5), ai(t, "window", wins[w])};
            int n = t_node(t, OP_attention, 3, in, 3, at, NULL);
            int outs[2], nout = 0;
            if (use & 1) outs[nout++] = t->g->nodes[n].out[0];
            if (use & 2) outs[nout++] = t->g->nodes[n].out[1];
            t_loss(t, nout, outs);
            char label[64];
            snprintf(label, sizeof label, "attention window=%d use=%d", wins[w], use);
            check_t(t, label);
            attention_pos_case(1, use, 4, own, 4, shuffled, "dual-chunk", wins[w]);
            attention_pos_case(1, use, 4, q4, 6, k6, "permuted S!=T", wins[w]);
        }
    /* window 3 on another rank's block: query 6 sees keys 4, 5; queries 0, 1 none */
    attention_pos_case(1, 1, 4, own, 4, other, "masked rows", 3);
}

static void test_embedding(void **s) {
    T *t = t_new();
    int in[2] = {t_param1(t, "table", F32(5, 3)), t_ints(t, "ids", I32(2, 4), 0, 5)};
    int y = t_op(t, OP_embedding, 2, in, 0, NULL);
    t_loss(t, 1, &y);
    check_t(t, "embedding");
}

static void test_cross_entropy(void **s) {
    T *t = t_new();
    int in[2] = {t_param(t, "logits", F32(2, 3, 6), -2, 2), t_ints(t, "targets", I32(2, 3), 0, 6)};
    int y = t_op(t, OP_cross_entropy, 2, in, 0, NULL);
    t_loss(t, 1, &y);
    check_t(t, "cross_entropy");
}

/* Collectives on a 1-rank group are identities; their VJPs must be too. */
static void test_comm(void **s) {
    Op ops[3] = {OP_allreduce, OP_reducescatter, OP_allgather};
    for (int c = 0; c < 3; c++) {
        T *t = t_new();
        int x = t_param1(t, "x", F32(4, 3));
        Attr at[2] = {as(t, "group", "dp"), ai(t, "dim", 0)};
        int y = t_op(t, ops[c], 1, &x, ops[c] == OP_allreduce ? 1 : 2, at);
        t_loss(t, 1, &y);
        check_t(t, ir_ops[ops[c]].name);
    }
}

/* ---- structure ---- */

/* Forward copied unchanged, backward phased bwd with forward Locs, outputs in
 * order, a zero gradient for a param the loss ignores, none for int paths. */
static void test_structure(void **s) {
    T *t = t_new();
    int a = t_param1(t, "a", F32(3));
    int unused = t_param1(t, "unused", F32(2));
    int ids = t_ints(t, "ids", I32(3), 0, 3);
    int side = t_op1(t, OP_exp, unused); /* depends on a param, never reaches the loss */
    (void)side;
    int tab = t_param1(t, "tab", F32(3, 3));
    int in[2] = {tab, ids};
    int e = t_op(t, OP_embedding, 2, in, 0, NULL);
    Attr at[2] = {ai(t, "dim", 0), ai(t, "keep", 0)};
    int es = t_op(t, OP_sum, 1, &e, 2, at);
    int ta = t_op1(t, OP_tanh, a);
    int y = t_op2(t, OP_mul, ta, es);
    t_loss(t, 1, &y);

    Graph *g = t->g;
    int nfwd = g->nnodes;
    Node *before = malloc(sizeof(Node) * (size_t)nfwd);
    memcpy(before, g->nodes, sizeof(Node) * (size_t)nfwd);
    Options o;
    opt_defaults(&o);
    pass_autodiff(t->m, &o);
    assert_int_equal(t->m->nstages, 1);
    g = t->m->stages[0];
    char err[256];
    assert_int_equal(ir_verify_module(t->m, err, sizeof err), 0);
    for (int i = 0; i < nfwd; i++) {
        assert_int_equal(g->nodes[i].op, before[i].op);
        assert_int_equal(g->nodes[i].phase, PH_FWD);
        assert_int_equal(g->nodes[i].loc.line, before[i].loc.line);
        assert_int_equal(g->nodes[i].nout, before[i].nout);
        assert_true(g->nodes[i].out == before[i].out);
    }
    free(before);
    /* backward: phase bwd, Locs from forward lines; no exp of `unused` differentiated */
    int nout = 0;
    const char *want[4] = {"loss", "grad:a", "grad:unused", "grad:tab"};
    for (int i = nfwd; i < g->nnodes; i++) {
        Node *n = &g->nodes[i];
        assert_true(n->loc.line >= 1 && n->loc.line <= t->line);
        if (n->op == OP_output) {
            assert_true(nout < 4);
            assert_string_equal(ir_attr_s(n, "name", ""), want[nout]);
            assert_int_equal(n->phase, nout == 0 ? PH_FWD : PH_BWD);
            if (nout == 2) { /* zero const, bwd, unused's Loc */
                Node *d = &g->nodes[g->vals[n->in[0]].def];
                assert_int_equal(d->op, OP_const);
                assert_int_equal(d->phase, PH_BWD);
                assert_true(ir_attr_f(d, "v", 1) == 0.0);
                assert_int_equal(d->loc.line, g->nodes[g->vals[unused].def].loc.line);
            }
            nout++;
            continue;
        }
        assert_int_equal(n->phase, PH_BWD);
        assert_true(n->op != OP_exp); /* exp(unused) is not differentiated */
        for (int j = 0; j < n->nin; j++) assert_true(n->in[j] != ids || n->op == OP_embedding_bwd);
    }
    assert_int_equal(nout, 4);
    t_free(t);
}

/* ---- whole models through the front end ---- */

static void model_case(const char *path, KeyVal *sets, int nsets) {
    Options o;
    opt_defaults(&o);
    o.sets = sets;
    o.nsets = nsets;
    char err[512];
    Module *m = fe_load(path, &o, err, sizeof err);
    if (!m) fail_msg("fe_load %s: %s", path, err);
    /* int inputs (tokens, targets): ids below the smallest vocabulary in sight */
    const Graph *g = m->stages[0];
    int64_t vocab = 1 << 30;
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        if (n->op == OP_embedding) vocab = g->vals[n->in[0]].t.dim[0] < vocab ? g->vals[n->in[0]].t.dim[0] : vocab;
        if (n->op == OP_cross_entropy) {
            const Type *lt = &g->vals[n->in[0]].t;
            vocab = lt->dim[lt->rank - 1] < vocab ? lt->dim[lt->rank - 1] : vocab;
        }
    }
    Fill fills[16];
    int nf = 0;
    for (int i = 0; i < g->nnodes && nf < 16; i++) {
        const Node *n = &g->nodes[i];
        if (n->op != OP_input) continue;
        int is_int = !ir_dtype_is_float(g->vals[n->out[0]].t.dt);
        fills[nf++] = (Fill){ir_attr_s(n, "name", "?"), is_int ? 0 : -1, is_int ? (double)vocab : 1, is_int, NULL};
    }
    /* params keep their init (interp_init_state); inputs random */
    double e = check_grads(m, fills, nf, 20, path);
    print_message("%s: worst relative error over 20 sampled entries: %.3g\n", path, e);
    assert_true(e <= TOL);
    ir_free(m);
}

static void test_model_tiny(void **s) {
    KeyVal sets[] = {{"batch", "2"}, {"seq", "16"}}; /* the model as it is, fewer tokens */
    model_case("models/tiny.lua", sets, 2);
}

static void test_model_llama(void **s) {
    KeyVal sets[] = {{"layers", "2"}, {"dim", "32"}, {"heads", "4"}, {"kv_heads", "2"},
                     {"ffn", "64"}, {"vocab", "64"}, {"seq", "16"}, {"batch", "2"}};
    model_case("models/llama.lua", sets, 8);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unary),          cmocka_unit_test(test_binary),
        cmocka_unit_test(test_fanout),         cmocka_unit_test(test_reductions),
        cmocka_unit_test(test_sumsq),          cmocka_unit_test(test_reshape_transpose),
        cmocka_unit_test(test_slice),          cmocka_unit_test(test_slices_of_one_value),
        cmocka_unit_test(test_concat),
        cmocka_unit_test(test_concat256),
        cmocka_unit_test(test_broadcast_sumto), cmocka_unit_test(test_cast),
        cmocka_unit_test(test_matmul),         cmocka_unit_test(test_layernorm),
        cmocka_unit_test(test_rmsnorm),        cmocka_unit_test(test_softmax),
        cmocka_unit_test(test_rope),           cmocka_unit_test(test_dropout),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_attention_positions), cmocka_unit_test(test_attention_window),
        cmocka_unit_test(test_embedding),      cmocka_unit_test(test_cross_entropy),
        cmocka_unit_test(test_comm),           cmocka_unit_test(test_structure),
        cmocka_unit_test(test_model_tiny),     cmocka_unit_test(test_model_llama),
        cmocka_unit_test(test_ops17),          cmocka_unit_test(test_ops17_ties),
        cmocka_unit_test(test_layernorm_nobias),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
