/* test_precision.c — the precision pass (compiler/precision.c): the f32
 * training step rewritten into the GPU's bf16 mixed-precision step.
 *
 * Tiny GPT, a small Llama, a 2-layer MLP (a float input, a constant among the
 * activations and one in the loss) and tiny GPT over dp=2 with --zero 1 go
 * through the front end, autodiff, parallelize, recompute (gemm-last) and the
 * optimizer: once as they are (the f32 step) and once with pass_precision on
 * top (the bf16 step).  The checks:
 *
 *   agreement  the f32-mode interpreter (which rounds every value to its IR
 *              dtype, bf16 included) runs both steps twice from the same
 *              params and inputs.  bf16 keeps 8 significant bits: one
 *              rounding is at most 2^-9 = 0.2% relative, and a dot product
 *              of K bf16-rounded terms accumulates like sqrt(K) such errors
 *              (the math is f32).  Tolerances, with what the models show:
 *                loss        5e-3 relative (2.5 bf16 ulps; seen <= 3e-5: the
 *                            mean over tokens averages the logits' errors);
 *                grad_norm   5e-2 relative (seen <= 3e-4);
 *                gradients   5e-2 relative L2 per param (seen <= 1.1e-2:
 *                            layer norm biases, small sums of bf16 values);
 *                updates     0.25 relative L2 of (params after 2 steps -
 *                            before) over all params (seen <= 0.052): AdamW's
 *                            first steps move each weight by ~lr*sign(g), so
 *                            every element whose gradient bf16 noise flips
 *                            moves by 2 lr, and small gradients flip.
 *              The planted seed below (every gradient 10% off) fails it.
 *              After fuse, schedule and memplan the bf16 step still verifies
 *              and agrees.
 *   types      every producer of a param gradient (found here by walking
 *              back from the grad:<p> outputs and adamw's gradient operand
 *              through adds, shape and communication nodes) writes f32 and
 *              is not a cast; every fwd, bwd and recompute float value is
 *              bf16 except the sources (f32 masters), the outputs f32 by
 *              definition (cross_entropy, attention's lse, sumsq, loss), the
 *              gradient paths, and the f32 region (values computed only from
 *              f32 values, e.g. the loss's mean and --zero 1's gathered
 *              views; values read only by f32 inputs or such nodes, e.g. the
 *              mean's backward); every optimizer-phase value is f32; each
 *              param and float input read by fwd/bwd/recompute has exactly
 *              one cast and no such node reads it directly (with --zero 1:
 *              one cast per param, of its gathered view).
 *   can fail   a planted module where one dW matmul writes bf16 fails the
 *              types check; one with the loss seed 1.1 fails agreement.
 *   CPU        without o.precision_bf16 the module's dump is unchanged.
 *   out_dtype  ir_infer's rule: one dtype or one per output, bad ones refused.
 * The bf16 modules also pass the verifier and survive dump/parse.
 * PRECISION_DUMP=FILE appends the bf16 modules' dumps to FILE, for reading.
 */
#include <unistd.h>

#include "testutil.h"

static char err[2048];

static KeyVal gpt_small[] = {
    {"layers", "2"}, {"dim", "32"}, {"heads", "2"}, {"seq", "16"}, {"batch", "2"}, {"vocab", "64"},
};
static KeyVal llama_small[] = {
    {"layers", "2"}, {"dim", "32"}, {"heads", "4"}, {"kv_heads", "2"},
    {"ffn", "64"}, {"vocab", "64"}, {"seq", "16"}, {"batch", "2"},
};

static void verify_ok(const Module *m, const char *after) {
    if (ir_verify_module(m, err, sizeof err) != 0) fail_msg("verify after %s: %s", after, err);
}

/* the f32 step: front end, autodiff, parallelize, recompute, optimizer */
static int dp = 1, micro = 1; /* load()'s dp ranks (--zero 1) and micro-batches */

static Module *load(const char *path, KeyVal *sets, int nsets) {
    Options o;
    opt_defaults(&o);
    o.sets = sets, o.nsets = nsets, o.dp = dp, o.micro_batches = micro;
    Module *m = fe_load(path, &o, err, sizeof err);
    if (!m) fail_msg("fe_load(%s): %s", path, err);
    pass_autodiff(m, &o);
    pass_parallelize(m, &o);
    pass_recompute(m, &o);
    pass_optimizer(m, &o);
    verify_ok(m, "optimizer");
    return m;
}

static Module *load_bf16(const char *path, KeyVal *sets, int nsets) {
    Module *m = load(path, sets, nsets);
    Options o;
    opt_defaults(&o);
    o.precision_bf16 = 1;
    pass_precision(m, &o);
    verify_ok(m, "precision");
    return m;
}

static char *dump_str(const Module *m) {
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    assert_non_null(f);
    ir_dump(m, f);
    fclose(f);
    return buf;
}

/* ---- running steps ---- */

typedef struct {
    double loss[2], norm[2];
    int ngrad;
    char *gname[256];
    double *grad[256]; /* step 1's */
    int64_t gn[256];
    double *p0, *p2;   /* every param before and after the 2 steps, concatenated */
    int64_t np;
} Run;

static void fill_input(Interp *it, const Graph *g, const char *name, int salt) {
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        if (n->op != OP_input || strcmp(ir_attr_s(n, "name", ""), name) != 0) continue;
        int64_t cnt = ir_numel(&g->vals[n->out[0]].t);
        double *d = malloc(sizeof(double) * (size_t)cnt);
        for (int64_t k = 0; k < cnt; k++) d[k] = (double)((k * 37 + salt * 11 + (k >> 3)) % 64); /* < every test vocab */
        if (ir_dtype_is_float(g->vals[n->out[0]].t.dt))
            for (int64_t k = 0; k < cnt; k++) d[k] = d[k] / 32 - 1;
        for (int r = 0; r < ir_world(g->m); r++) assert_int_equal(interp_set_input(it, r, name, d, cnt), 0);
        free(d);
    }
}

static double scalar_out(Interp *it, const char *name) {
    const Tensor *t = interp_output(it, 0, name);
    if (!t) fail_msg("no output %s", name);
    return t->d[0];
}

/* the params (with --zero 1: the master shards, states "param.*") in graph
 * order, concatenated */
static double *params(Interp *it, const Graph *g, int64_t *n) {
    double *all = NULL;
    *n = 0;
    for (int i = 0; i < g->nnodes; i++) {
        const char *name = ir_attr_s(&g->nodes[i], "name", "");
        if (g->nodes[i].op != OP_param && !(g->nodes[i].op == OP_state && strncmp(name, "param.", 6) == 0)) continue;
        const Tensor *t = interp_state(it, 0, name);
        if (!t) continue; /* --zero 1: the param nodes keep no storage */
        all = realloc(all, sizeof(double) * (size_t)(*n + t->n));
        memcpy(all + *n, t->d, sizeof(double) * (size_t)t->n);
        *n += t->n;
    }
    return all;
}

static Run *run_steps(const Module *m) {
    const Graph *g = m->stages[0];
    Run *r = calloc(1, sizeof *r);
    Interp *it = interp_new(m, 0); /* f32 mode: every value rounded to its dtype */
    interp_init_state(it, 7);
    r->p0 = params(it, g, &r->np);
    for (int step = 0; step < 2; step++) {
        fill_input(it, g, "tokens", 1 + step);
        fill_input(it, g, "targets", 2 + step);
        fill_input(it, g, "x", 3 + step);
        if (interp_run(it, err, sizeof err) != 0) fail_msg("interp_run: %s", err);
        r->loss[step] = scalar_out(it, "loss");
        r->norm[step] = scalar_out(it, "grad_norm");
        for (int i = 0; step == 0 && i < g->nnodes; i++) {
            const Node *n = &g->nodes[i];
            const char *name = ir_attr_s(n, "name", "");
            if (n->op != OP_output || strncmp(name, "grad:", 5) != 0) continue;
            const Tensor *t = interp_output(it, 0, name);
            assert_true(r->ngrad < 256);
            r->gname[r->ngrad] = strdup(name);
            r->gn[r->ngrad] = t->n;
            r->grad[r->ngrad] = malloc(sizeof(double) * (size_t)t->n);
            memcpy(r->grad[r->ngrad], t->d, sizeof(double) * (size_t)t->n);
            r->ngrad++;
        }
    }
    int64_t n2;
    r->p2 = params(it, g, &n2);
    assert_int_equal(n2, r->np);
    interp_free(it);
    return r;
}

static void run_free(Run *r) {
    for (int i = 0; i < r->ngrad; i++) free(r->gname[i]), free(r->grad[i]);
    free(r->p0), free(r->p2), free(r);
}

static double rel_l2(const double *a, const double *b, int64_t n) {
    double d = 0, s = 0;
    for (int64_t i = 0; i < n; i++) d += (a[i] - b[i]) * (a[i] - b[i]), s += b[i] * b[i];
    return sqrt(d / (s > 1e-300 ? s : 1e-300));
}

#define TOL_LOSS 5e-3
#define TOL_GRAD 5e-2
#define TOL_UPDATE 0.25

/* 0 if the bf16 run agrees with the f32 run; else a message in err */
static int agree(const Run *h, const Run *f) {
    for (int s = 0; s < 2; s++) {
        double el = fabs(h->loss[s] - f->loss[s]) / fabs(f->loss[s]), en = fabs(h->norm[s] - f->norm[s]) / fabs(f->norm[s]);
        if (el > TOL_LOSS) return snprintf(err, sizeof err, "step %d: loss %.6g vs %.6g (rel %.3g)", s + 1, h->loss[s], f->loss[s], el), -1;
        if (en > TOL_GRAD) return snprintf(err, sizeof err, "step %d: grad_norm %.6g vs %.6g (rel %.3g)", s + 1, h->norm[s], f->norm[s], en), -1;
    }
    double worst = 0;
    const char *worst_name = "";
    if (f->ngrad == 0 && dp == 1) return snprintf(err, sizeof err, "no gradients to compare"), -1;
    if (h->ngrad != f->ngrad) return snprintf(err, sizeof err, "%d gradients vs %d", h->ngrad, f->ngrad), -1;
    for (int i = 0; i < f->ngrad; i++) {
        if (strcmp(h->gname[i], f->gname[i]) || h->gn[i] != f->gn[i]) return snprintf(err, sizeof err, "gradient %s differs in name or size", f->gname[i]), -1;
        double e = rel_l2(h->grad[i], f->grad[i], f->gn[i]);
        if (e > worst) worst = e, worst_name = f->gname[i];
        if (e > TOL_GRAD) return snprintf(err, sizeof err, "%s: relative L2 error %.3g", f->gname[i], e), -1;
    }
    if (h->np != f->np) return snprintf(err, sizeof err, "param counts differ"), -1;
    double *dh = malloc(sizeof(double) * (size_t)f->np), *df = malloc(sizeof(double) * (size_t)f->np);
    for (int64_t i = 0; i < f->np; i++) dh[i] = h->p2[i] - h->p0[i], df[i] = f->p2[i] - f->p0[i];
    double e = rel_l2(dh, df, f->np);
    free(dh), free(df);
    if (e > TOL_UPDATE) return snprintf(err, sizeof err, "param updates: relative L2 error %.3g", e), -1;
    snprintf(err, sizeof err, "worst gradient error %.3g (%s), param updates %.3g", worst, worst_name, e);
    return 0;
}

/* ---- the types check ---- */

static const Node *def_of(const Graph *g, int v) { return g->vals[v].def >= 0 ? &g->nodes[g->vals[v].def] : NULL; }
static int is_float(const Graph *g, int v) { return ir_dtype_is_float(g->vals[v].t.dt); }
static int working(const Node *n) { return n->phase != PH_OPT; }

/* mark the gradient path of v (adds, shape, comm) and its producers */
static void grad_path(const Graph *g, int v, char *path, char *producer) {
    const Node *d = def_of(g, v);
    path[v] = 1;
    unsigned fl = ir_ops[d->op].flags;
    if (d->op == OP_add || (!(fl & F_SOURCE) && fl & (F_SHAPE | F_COMM))) {
        for (int k = 0; k < d->nin; k++) grad_path(g, d->in[k], path, producer);
        return;
    }
    producer[v] = 1;
}

static int f32_by_definition(const Graph *g, int v) {
    const Node *d = def_of(g, v);
    int o = g->vals[v].defout;
    return (ir_ops[d->op].flags & (F_SOURCE | F_LOSS) && d->op != OP_const) || d->op == OP_cross_entropy || d->op == OP_sumsq ||
           ((d->op == OP_attention || d->op == OP_attn_merge) && o == 1);
}

/* 0 if m's types are the mixed-precision step's; else a message in err */
static int check_types(const Module *m) {
    const Graph *g = m->stages[0];
    char *path = calloc((size_t)g->nvals, 1), *producer = calloc((size_t)g->nvals, 1), *ok32 = calloc((size_t)g->nvals, 1);
    int rc = 0;
#define BAD(...) do { snprintf(err, sizeof err, __VA_ARGS__); rc = -1; goto done; } while (0)
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        if (n->op == OP_output && strncmp(ir_attr_s(n, "name", ""), "grad:", 5) == 0) grad_path(g, n->in[0], path, producer);
        if (n->op == OP_adamw) grad_path(g, n->in[1], path, producer);
    }
    for (int v = 0; v < g->nvals; v++) {
        if (producer[v] && g->vals[v].t.dt != DT_F32)
            BAD("%s's output %%%d, a param gradient, is %s", ir_ops[def_of(g, v)->op].name, v, ir_dtype_names[g->vals[v].t.dt]);
        if (producer[v] && def_of(g, v)->op == OP_cast) BAD("param gradient %%%d is a cast, not written in f32", v);
        ok32[v] = path[v] || f32_by_definition(g, v);
    }
    /* the f32 region around the loss, to a fixed point */
    for (int changed = 1; changed;) {
        changed = 0;
        for (int i = 0; i < g->nnodes; i++) { /* forward: only f32 inputs */
            const Node *n = &g->nodes[i];
            int all = n->nin > 0 && n->op != OP_cast;
            for (int k = 0; k < n->nin; k++) all &= !is_float(g, n->in[k]) || (ok32[n->in[k]] && g->vals[n->in[k]].t.dt == DT_F32);
            for (int k = 0; all && k < n->nout; k++) changed |= !ok32[n->out[k]], ok32[n->out[k]] = 1;
        }
        for (int v = 0; v < g->nvals; v++) { /* backward: read only by f32 inputs */
            if (ok32[v] || !is_float(g, v)) continue;
            int readers = 0, all = 1;
            for (int i = 0; i < g->nnodes; i++)
                for (int k = 0; k < g->nodes[i].nin; k++) {
                    if (g->nodes[i].in[k] != v) continue;
                    const Node *r = &g->nodes[i];
                    int f32_in = (ir_ops[r->op].flags & F_LOSS) || (r->op == OP_cross_entropy_bwd && k == 0);
                    int f32_node = r->nout > 0 && ok32[r->out[0]] && !(ir_ops[r->op].flags & F_LIBRARY) && r->op != OP_cast;
                    readers++, all &= f32_in || f32_node;
                }
            if (readers && all) ok32[v] = 1, changed = 1;
        }
    }
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        for (int k = 0; k < n->nout; k++) {
            int v = n->out[k];
            if (!is_float(g, v)) continue;
            DType dt = g->vals[v].t.dt;
            if (!working(n) && dt != DT_F32) BAD("optimizer value %%%d (%s) is %s", v, ir_ops[n->op].name, ir_dtype_names[dt]);
            if (working(n) && dt == DT_F32 && !ok32[v]) BAD("%s value %%%d (%s) is f32", ir_phase_names[n->phase], v, ir_ops[n->op].name);
            if (working(n) && dt != DT_F32 && f32_by_definition(g, v)) BAD("%%%d (%s) is %s", v, ir_ops[n->op].name, ir_dtype_names[dt]);
        }
    }
    /* one cast per param and float input; fwd/bwd/recompute read them only through it */
    for (int i = 0; i < g->nnodes; i++) {
        if (g->nodes[i].op != OP_param && !(g->nodes[i].op == OP_input && is_float(g, g->nodes[i].out[0]))) continue;
        int p = g->nodes[i].out[0], casts = 0, readers = 0;
        for (int j = 0; j < g->nnodes; j++) {
            const Node *r = &g->nodes[j];
            for (int k = 0; k < r->nin; k++) {
                if (r->in[k] != p) continue;
                readers += working(r);
                if (r->op == OP_cast && strcmp(ir_attr_s(r, "dtype", ""), "bf16") == 0 && r->phase == PH_FWD) casts++;
                else if (working(r)) BAD("%s node %d reads param %s directly", ir_ops[r->op].name, j, ir_attr_s(&g->nodes[i], "name", ""));
            }
        }
        if (casts != (readers > 0)) BAD("param %s has %d casts", ir_attr_s(&g->nodes[i], "name", ""), casts);
    }
done:
#undef BAD
    free(path), free(producer), free(ok32);
    return rc;
}

/* ---- the tests ---- */

/* PRECISION_DUMP=FILE: append the bf16 modules' dumps (for reading) */
static void dump_env(const Module *h) {
    FILE *df = getenv("PRECISION_DUMP") ? fopen(getenv("PRECISION_DUMP"), "a") : NULL;
    if (df) ir_dump(h, df), fclose(df);
}

static void check_model(const char *path, KeyVal *sets, int nsets) {
    Module *f = load(path, sets, nsets), *h = load_bf16(path, sets, nsets);
    if (check_types(h) != 0) fail_msg("%s: types: %s", path, err);
    /* the text form carries out_dtype */
    char *d1 = dump_str(h);
    assert_non_null(strstr(d1, "out_dtype"));
    Module *p = ir_parse(d1, "rt.ir", err, sizeof err);
    if (!p) fail_msg("the bf16 dump does not parse: %s", err);
    verify_ok(p, "parse");
    assert_true(ir_module_equal(h, p));
    ir_free(p), free(d1);
    Run *rf = run_steps(f), *rh = run_steps(h);
    if (agree(rh, rf) != 0) fail_msg("%s: bf16 vs f32: %s", path, err);
    print_message("%s: bf16 vs f32: loss %.6f vs %.6f, grad_norm %.6f vs %.6f; %s\n", path, rh->loss[1], rf->loss[1], rh->norm[1],
                  rf->norm[1], err);
    dump_env(h);
    /* the backend passes take the bf16 step as it is */
    Options o;
    opt_defaults(&o);
    pass_fuse(h, &o), verify_ok(h, "fuse");
    pass_schedule(h, &o), verify_ok(h, "schedule");
    pass_memplan(h, &o), verify_ok(h, "memplan");
    Run *rp = run_steps(h);
    if (agree(rp, rf) != 0) fail_msg("%s: planned bf16 vs f32: %s", path, err);
    run_free(rf), run_free(rh), run_free(rp);
    ir_free(f), ir_free(h);
}

static void test_gpt(void **state) { check_model("models/tiny.lua", gpt_small, 6); }
static void test_llama(void **state) { check_model("models/llama.lua", llama_small, 8); }

static int count_casts(const Graph *g, const char *dtype) {
    int n = 0;
    for (int i = 0; i < g->nnodes; i++) n += g->nodes[i].op == OP_cast && strcmp(ir_attr_s(&g->nodes[i], "dtype", ""), dtype) == 0;
    return n;
}

static int count_params(const Graph *g) {
    int n = 0;
    for (int i = 0; i < g->nnodes; i++) n += g->nodes[i].op == OP_param;
    return n;
}

/* A model with a float input, a constant in the activations (bf16) and one
 * in the loss (f32: the loss's region). */
static const char *mlp_lua =
    "local c = config{lr = 1e-2, grad_clip = 1.0}\n"
    "local x = input(\"x\", {4, 8})\n"
    "local t = input(\"targets\", {4}, \"i32\")\n"
    "local w = param(\"w\", {8, 16}, normal(0.3))\n"
    "local b = param(\"b\", {16}, zeros())\n"
    "local h = relu(matmul(x, w) + b) * 0.5\n"
    "local w2 = param(\"w2\", {16, 64}, normal(0.3))\n"
    "loss(mean(cross_entropy(matmul(h, w2), t)) * 2)\n";

static void test_consts_and_inputs(void **state) {
    char path[] = "/tmp/kiln_precision_XXXXXX.lua";
    int fd = mkstemps(path, 4);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    assert_non_null(f);
    assert_true(fputs(mlp_lua, f) >= 0);
    assert_int_equal(fclose(f), 0);
    Module *m32 = load(path, NULL, 0), *h = load_bf16(path, NULL, 0);
    if (check_types(h) != 0) fail_msg("mlp: types: %s", err);
    const Graph *g = h->stages[0];
    int half = 0, two = 0;
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        if (n->op != OP_const || n->phase == PH_OPT) continue;
        DType dt = g->vals[n->out[0]].t.dt;
        if (ir_attr_f(n, "v", 0) == 0.5) half++, assert_int_equal(dt, DT_BF16);
        if (ir_attr_f(n, "v", 0) == 2.0 && n->phase == PH_FWD) two++, assert_int_equal(dt, DT_F32);
    }
    assert_true(half > 0 && two > 0);
    assert_int_equal(count_casts(g, "bf16"), count_params(g) + 1); /* + x */
    Run *rf = run_steps(m32), *rh = run_steps(h);
    if (agree(rh, rf) != 0) fail_msg("mlp: bf16 vs f32: %s", err);
    print_message("mlp: bf16 vs f32: loss %.6f vs %.6f; %s\n", rh->loss[1], rf->loss[1], err);
    run_free(rf), run_free(rh);
    ir_free(m32), ir_free(h);
    unlink(path);
}

/* the all-gathers of a state (--zero 1's flats): how many, and the bytes
 * they gather, counted only where they gather `dt` */
static int gathers(const Graph *g, DType dt, int64_t *bytes) {
    int n = 0;
    *bytes = 0;
    for (int i = 0; i < g->nnodes; i++) {
        const Node *a = &g->nodes[i];
        if (a->op != OP_allgather) continue;
        const Node *d = &g->nodes[g->vals[a->in[0]].def];
        if (d->op == OP_cast) d = &g->nodes[g->vals[d->in[0]].def]; /* the shard's bf16 copy */
        if (d->op != OP_state || g->vals[a->out[0]].t.dt != dt) continue;
        n++, *bytes += ir_numel(&g->vals[a->out[0]].t) * ir_dtype_size(dt);
    }
    return n;
}

static int same_run(const Run *a, const Run *b) {
    for (int s = 0; s < 2; s++)
        if (a->loss[s] != b->loss[s] || a->norm[s] != b->norm[s]) return 0;
    return a->np == b->np && memcmp(a->p2, b->p2, sizeof(double) * (size_t)a->np) == 0;
}

/* --zero 1 over dp=2: each flat's shard is cast once and gathered in bf16
 * (precision.c, gather_bf16): half the bytes of the f32 gather it replaces
 * (KILN_GATHER_F32=1: the f32 gather, then one cast per param), and the
 * same step to the last bit, since a cast commutes with moving elements. */
static void test_zero1(void **state) {
    dp = 2;
    Module *f = load("models/tiny.lua", gpt_small, 6), *h = load_bf16("models/tiny.lua", gpt_small, 6);
    setenv("KILN_GATHER_F32", "1", 1);
    Module *h32 = load_bf16("models/tiny.lua", gpt_small, 6);
    unsetenv("KILN_GATHER_F32");
    dump_env(h);
    if (check_types(h) != 0) fail_msg("zero 1: types: %s", err);
    int64_t b16, b32, none;
    int flats = gathers(h->stages[0], DT_BF16, &b16);
    assert_true(flats > 0);
    assert_int_equal(gathers(h->stages[0], DT_F32, &none), 0);
    assert_int_equal(count_casts(h->stages[0], "bf16"), flats); /* one cast a shard, none after the gather */
    assert_int_equal(gathers(h32->stages[0], DT_F32, &b32), flats);
    assert_int_equal(count_casts(h32->stages[0], "bf16"), count_params(h32->stages[0]));
    assert_int_equal(2 * b16, b32);
    Run *rf = run_steps(f), *rh = run_steps(h), *r32 = run_steps(h32);
    if (!same_run(rh, r32)) fail_msg("zero 1: the bf16 gather's step differs from the f32 gather's: loss %.9g vs %.9g", rh->loss[1], r32->loss[1]);
    if (agree(rh, rf) != 0) fail_msg("zero 1: bf16 vs f32: %s", err);
    print_message("zero 1: %d flats gathered in bf16 (%lld bytes, f32 gather %lld), the same 2 steps bit for bit; bf16 vs f32: loss %.6f vs %.6f; %s\n",
                  flats, (long long)b16, (long long)b32, rh->loss[1], rf->loss[1], err);
    dp = 1;
    run_free(rf), run_free(rh), run_free(r32);
    ir_free(f), ir_free(h), ir_free(h32);
}

/* Two micro-batches: the gradients accumulate over them in f32. */
static void test_micro_batches(void **state) {
    micro = 2;
    Module *f = load("models/llama.lua", llama_small, 8), *h = load_bf16("models/llama.lua", llama_small, 8);
    micro = 1;
    int second = 0;
    for (int i = 0; i < h->stages[0]->nnodes; i++) second += h->stages[0]->nodes[i].mb == 1;
    assert_true(second > 0);
    dump_env(h);
    if (check_types(h) != 0) fail_msg("micro-batches: types: %s", err);
    assert_int_equal(count_casts(h->stages[0], "bf16"), count_params(h->stages[0]));
    Run *rf = run_steps(f), *rh = run_steps(h);
    if (agree(rh, rf) != 0) fail_msg("micro-batches: bf16 vs f32: %s", err);
    print_message("micro-batches: bf16 vs f32: loss %.6f vs %.6f; %s\n", rh->loss[1], rf->loss[1], err);
    run_free(rf), run_free(rh);
    ir_free(f), ir_free(h);
}

/* A dW matmul that writes bf16 (its out_dtype dropped) fails the types check. */
static void test_planted_dw(void **state) {
    Module *h = load_bf16("models/tiny.lua", gpt_small, 6);
    assert_int_equal(check_types(h), 0);
    Graph *g = h->stages[0];
    int planted = 0;
    for (int i = 0; i < g->nnodes && !planted; i++) {
        Node *n = &g->nodes[i];
        if (n->op != OP_matmul || !ir_attr(n, "out_dtype")) continue;
        n->nattr--; /* out_dtype is the last attribute */
        assert_string_equal(n->attr[n->nattr].key, "out_dtype");
        g->vals[n->out[0]].t.dt = DT_BF16;
        planted = 1;
    }
    assert_true(planted);
    assert_int_equal(check_types(h), -1);
    print_message("planted bf16 dW: %s\n", err);
    ir_free(h);
}

/* The loss seed 1.1 instead of 1 (every gradient 10% off) fails agreement. */
static void test_planted_seed(void **state) {
    Module *f = load("models/tiny.lua", gpt_small, 6), *h = load_bf16("models/tiny.lua", gpt_small, 6);
    Graph *g = h->stages[0];
    int planted = 0;
    for (int i = 0; i < g->nnodes && !planted; i++) {
        Node *n = &g->nodes[i];
        if (n->op != OP_const || n->phase != PH_BWD || ir_attr_f(n, "v", 0) != 1.0) continue;
        for (int a = 0; a < n->nattr; a++)
            if (strcmp(n->attr[a].key, "v") == 0) n->attr[a].kind = AT_FLOAT, n->attr[a].f = 1.1;
        planted = 1;
    }
    assert_true(planted);
    Run *rf = run_steps(f), *rh = run_steps(h);
    assert_int_equal(agree(rh, rf), -1);
    print_message("planted seed: %s\n", err);
    run_free(rf), run_free(rh);
    ir_free(f), ir_free(h);
}

/* ir_infer's out_dtype: one dtype, or one per output; bad ones rejected. */
static void test_out_dtype_rule(void **state) {
    Module *m = ir_module_new("t");
    Graph *g = m->stages[0];
    Loc loc = {ir_intern(m, "t.lua"), 1};
    Type x = {DT_BF16, 2, {4, 8}}, w = {DT_BF16, 1, {8}};
    Attr nm = ir_attr_str(m, "name", "x");
    NodeSpec s = ir_spec(OP_input, loc);
    s.nattr = 1, s.attr = &nm, s.src_type = &x;
    int xv = ir_out(g, ir_add_node(g, &s, err, sizeof err));
    s.src_type = &w;
    int wv = ir_out(g, ir_add_node(g, &s, err, sizeof err));
    struct { const char *spec; int ok; DType dx, dw; } cases[] = {
        {"-,f32,f32", 1, DT_BF16, DT_F32}, {"f32", 1, DT_F32, DT_F32}, {"-,-,-", 1, DT_BF16, DT_BF16},
        {"-,f32", 0, 0, 0}, {"-,f32,f32,f32", 0, 0, 0}, {"i32", 0, 0, 0}, {"f64", 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        Attr a[2] = {ir_attr_float(m, "eps", 1e-5), ir_attr_str(m, "out_dtype", cases[i].spec)};
        NodeSpec b = ir_spec(OP_layernorm_bwd, loc);
        int in[3] = {xv, xv, wv};
        b.nin = 3, b.in = in, b.nattr = 2, b.attr = a;
        int n = ir_add_node(g, &b, err, sizeof err);
        if ((n >= 0) != cases[i].ok) fail_msg("out_dtype=\"%s\": %s", cases[i].spec, n >= 0 ? "accepted" : err);
        if (n < 0) continue;
        assert_int_equal(g->vals[g->nodes[n].out[0]].t.dt, cases[i].dx);
        assert_int_equal(g->vals[g->nodes[n].out[1]].t.dt, cases[i].dw);
        assert_int_equal(g->vals[g->nodes[n].out[2]].t.dt, cases[i].dw);
    }
    ir_free(m);
}

/* Without the flag the module is unchanged. */
static void test_cpu_unchanged(void **state) {
    const char *paths[] = {"models/tiny.lua", "models/llama.lua"};
    KeyVal *sets[] = {gpt_small, llama_small};
    int nsets[] = {6, 8};
    for (int i = 0; i < 2; i++) {
        Module *m = load(paths[i], sets[i], nsets[i]);
        char *before = dump_str(m);
        Options o;
        opt_defaults(&o);
        pass_precision(m, &o);
        char *after = dump_str(m);
        assert_string_equal(before, after);
        assert_null(strstr(after, "bf16"));
        free(before), free(after);
        ir_free(m);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt),
        cmocka_unit_test(test_llama),
        cmocka_unit_test(test_consts_and_inputs),
        cmocka_unit_test(test_zero1),
        cmocka_unit_test(test_micro_batches),
        cmocka_unit_test(test_planted_dw),
        cmocka_unit_test(test_planted_seed),
        cmocka_unit_test(test_cpu_unchanged),
        cmocka_unit_test(test_out_dtype_rule),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
