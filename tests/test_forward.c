/* test_forward.c — pass_forward (compiler/forward.c) and the sampler's draw
 * (compiler/cmd/sample.c).
 *
 * The forward module must verify, hold no loss, cross-entropy, targets or
 * "loss" output, and give the same logits as the training module in the
 * interpreter for the same tokens and weights.  Its JIT program (the one
 * `kiln sample` runs) must match the interpreter (f32: relative 1e-5 to the
 * tensor's max abs), and the logits of the first w positions must not depend
 * on what follows them (sample.c pads the window).  sample_token: greedy is
 * the argmax, top-k draws only from the k largest, a seed repeats, and the
 * draws follow softmax(logits / T). */
#include "testutil.h"

#include "emit.h"
#include "kiln_rt.h"
#include "sample.h"

static const double TOL = 1e-5;

static Module *load(const char *path, const char *const *sets, int nsets, int forward) {
    Options o;
    opt_defaults(&o);
    KeyVal kv[16];
    for (int i = 0; i < nsets; i++) {
        const char *eq = strchr(sets[i], '=');
        kv[i] = (KeyVal){strndup(sets[i], (size_t)(eq - sets[i])), eq + 1};
    }
    o.sets = kv;
    o.nsets = nsets;
    char err[1024];
    Module *m = fe_load(path, &o, err, sizeof err);
    if (!m) fail_msg("%s", err);
    if (forward) pass_forward(m, &o);
    if (ir_verify_module(m, err, sizeof err) != 0) fail_msg("verify: %s", err);
    for (int i = 0; i < nsets; i++) free((char *)kv[i].key);
    return m;
}

static int count_op(const Graph *g, Op op, const char *name) {
    int k = 0;
    for (int i = 0; i < g->nnodes; i++)
        k += g->nodes[i].op == op && (!name || !strcmp(ir_attr_s(&g->nodes[i], "name", ""), name));
    return k;
}

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double *random_ids(int64_t n, int64_t bound, uint64_t seed) {
    double *d = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++) d[i] = (double)(splitmix(&seed) % (uint64_t)bound);
    return d;
}

/* The interpreter's logits of m for tokens (and random targets if m has them). */
static Tensor run_interp(const Module *m, const double *tok, int64_t n, int64_t vocab) {
    Interp *it = interp_new(m, 0);
    interp_init_state(it, 7);
    assert_int_equal(interp_set_input(it, 0, "tokens", tok, n), 0);
    if (count_op(m->stages[0], OP_input, "targets")) {
        double *tgt = random_ids(n, vocab, 99);
        assert_int_equal(interp_set_input(it, 0, "targets", tgt, n), 0);
        free(tgt);
    }
    char err[1024];
    if (interp_run(it, err, sizeof err) != 0) fail_msg("interp_run: %s", err);
    const Tensor *t = interp_output(it, 0, "logits");
    assert_non_null(t);
    Tensor c = *t;
    c.d = malloc(sizeof(double) * (size_t)t->n);
    memcpy(c.d, t->d, sizeof(double) * (size_t)t->n);
    interp_free(it);
    return c;
}

static double max_rel(const double *a, const double *b, int64_t n) {
    double scale = 1e-30, worst = 0;
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(b[i]));
    for (int64_t i = 0; i < n; i++) worst = fmax(worst, fabs(a[i] - b[i]) / scale);
    return worst;
}

/* Training module vs forward module in the interpreter. */
static void forward_vs_train(const char *path, const char *const *sets, int nsets) {
    Module *train = load(path, sets, nsets, 0), *fwd = load(path, sets, nsets, 1);
    const Graph *g = fwd->stages[0];
    assert_int_equal(count_op(g, OP_output, NULL), 1);
    assert_int_equal(count_op(g, OP_output, "logits"), 1);
    assert_int_equal(count_op(g, OP_loss, NULL), 0);
    assert_int_equal(count_op(g, OP_cross_entropy, NULL), 0);
    assert_int_equal(count_op(g, OP_input, "targets"), 0);
    assert_int_equal(count_op(g, OP_input, "tokens"), 1);
    assert_true(g->nnodes < train->stages[0]->nnodes);
    assert_int_equal(count_op(g, OP_param, NULL), count_op(train->stages[0], OP_param, NULL));
    int tv = -1;
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i].op == OP_input) tv = g->nodes[i].out[0];
    const Type *tt = &g->vals[tv].t;
    int64_t n = ir_numel(tt);
    double *tok = random_ids(n, 256, 5);
    Tensor a = run_interp(train, tok, n, 256), b = run_interp(fwd, tok, n, 256);
    assert_int_equal(a.n, b.n);
    double e = max_rel(b.d, a.d, a.n);
    printf("# %s: forward module %d nodes (training %d), logits relative error %.3g\n", path, g->nnodes,
           train->stages[0]->nnodes, e);
    assert_true(e <= TOL);
    free(a.d), free(b.d), free(tok);
    ir_free(train), ir_free(fwd);
}

static void test_tiny_forward(void **st) {
    static const char *const sets[] = {"batch=2", "seq=16"};
    forward_vs_train("models/tiny.lua", sets, 2);
}

static void test_llama_forward(void **st) {
    static const char *const sets[] = {"layers=2", "dim=64", "heads=4", "kv_heads=2", "ffn=128", "vocab=256", "seq=16", "batch=1"};
    forward_vs_train("models/llama.lua", sets, 8);
}

/* The sampler's program: JIT vs interpreter, and causality (padding). */
static void test_tiny_jit(void **st) {
    static const char *const sets[] = {"batch=1", "seq=32"};
    Module *m = load("models/tiny.lua", sets, 2, 1);
    Options o;
    opt_defaults(&o);
    pass_fuse(m, &o);
    pass_schedule(m, &o);
    pass_memplan(m, &o);
    char err[1024];
    if (ir_verify_module(m, err, sizeof err) != 0) fail_msg("verify: %s", err);
    const rt_program *p;
    Jit *j = emit_jit(m, &p, err, sizeof err);
    if (!j) fail_msg("emit_jit: %s", err);
    assert_int_equal(p->ninputs, 1);
    assert_int_equal(p->nstates, 0);
    assert_int_equal(p->noutputs, 1);
    assert_string_equal(p->outputs[0].name, "logits");
    rt_ctx *ctx = rt_new(p, &(rt_options){.threads = 2});
    assert_non_null(ctx);
    rt_init_params(ctx, 7);
    const int64_t T = 32, V = 256, w = 11;
    double *tok = random_ids(T, V, 5);
    int32_t *in = rt_tensor_ptr(ctx, &p->inputs[0]);
    const float *out = rt_tensor_ptr(ctx, &p->outputs[0]);
    for (int64_t i = 0; i < T; i++) in[i] = (int32_t)tok[i];
    if (rt_step(ctx, err, sizeof err) != 0) fail_msg("rt_step: %s", err);
    double *got = malloc(sizeof(double) * (size_t)(T * V));
    for (int64_t i = 0; i < T * V; i++) got[i] = out[i];
    Tensor want = run_interp(m, tok, T, V);
    double e = max_rel(got, want.d, T * V);
    printf("# tiny forward program: JIT vs interpreter relative error %.3g\n", e);
    assert_true(e <= TOL);
    /* the sampler's window: w tokens, zero padding; positions < w unchanged
     * (the whole input again: memplan may reuse its buffer after its last read) */
    for (int64_t i = 0; i < T; i++) in[i] = i < w ? (int32_t)tok[i] : 0;
    if (rt_step(ctx, err, sizeof err) != 0) fail_msg("rt_step: %s", err);
    double worst = 0;
    for (int64_t i = 0; i < w * V; i++) worst = fmax(worst, fabs(out[i] - got[i]));
    printf("# padding after %lld tokens changes their logits by at most %.3g\n", (long long)w, worst);
    assert_true(worst <= 1e-5);
    free(got), free(want.d), free(tok);
    rt_free(ctx);
    emit_jit_free(j);
    ir_free(m);
}

static void test_sample_token(void **st) {
    float l[300];
    for (int i = 0; i < 300; i++) l[i] = (float)((i * 37) % 101) / 10.0f;
    l[42] = 20, l[7] = 19, l[200] = 18, l[299] = 100; /* 299 is outside the 256 drawn from */
    uint64_t s = 1;
    assert_int_equal(sample_token(l, 256, 0, 0, &s), 42);
    assert_int_equal(s, 1); /* greedy draws nothing */
    assert_int_equal(sample_token(l, 256, 1.0, 1, &s), 42);
    assert_int_equal(sample_token(l, 300, 0, 0, &s), 299);
    l[7] = 20; /* a tie: the lower id */
    assert_int_equal(sample_token(l, 256, 0, 0, &s), 7);
    assert_int_equal(sample_token(l, 256, 1.0, 1, &s), 7);
    int seen[256] = {0};
    for (int k = 0; k < 2000; k++) seen[sample_token(l, 256, 5.0, 3, &s)]++;
    int others = 2000 - seen[7] - seen[42] - seen[200];
    assert_int_equal(others, 0);
    assert_true(seen[7] > 0 && seen[42] > 0 && seen[200] > 0);
    /* same seed, same draws */
    uint64_t s1 = 9, s2 = 9;
    for (int k = 0; k < 50; k++) assert_int_equal(sample_token(l, 256, 1.0, 0, &s1), sample_token(l, 256, 1.0, 0, &s2));
    /* two logits differing by log 3 at T = 1: p = 3/4 and 1/4 (20000 draws: 3 sigma is about 0.009) */
    float two[2] = {(float)log(3.0), 0};
    int first = 0;
    for (int k = 0; k < 20000; k++) first += sample_token(two, 2, 1.0, 0, &s) == 0;
    printf("# p(first) = %.4f (expected 0.75)\n", first / 20000.0);
    assert_true(fabs(first / 20000.0 - 0.75) < 0.01);
    /* temperature 2 halves the log-odds: p = sqrt 3 / (1 + sqrt 3) */
    first = 0;
    for (int k = 0; k < 20000; k++) first += sample_token(two, 2, 2.0, 0, &s) == 0;
    assert_true(fabs(first / 20000.0 - sqrt(3.0) / (1 + sqrt(3.0))) < 0.011);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_forward),
        cmocka_unit_test(test_llama_forward),
        cmocka_unit_test(test_tiny_jit),
        cmocka_unit_test(test_sample_token),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
