/* test_optim.c — the optimizer pass against a plain C reference.
 *
 * A small model (matmul + bias + gain, so params of rank 2 and rank 1) goes
 * through pass_autodiff and pass_optimizer and runs three steps in f64.  The
 * test keeps its own copy of every param and AdamW moment and applies, from
 * the gradients the interpreter reports, the textbook update (torch.optim.AdamW
 * with global-norm clipping and a cosine schedule with linear warm-up),
 * written below without looking at interp.c.  After each step the
 * interpreter's params, moments and step counter must equal the reference
 * (relative 1e-12, f64 rounding only), its "lr" output the schedule and its
 * "grad_norm" output sqrt(sum of squared grads).
 */
#include "testutil.h"

#define TOL 1e-12

/* ---- the reference ---- */

static double ref_lr(const Options *o, double t) {
    if (t <= o->warmup) return o->lr * t / o->warmup;
    double p = (t - o->warmup) / (o->steps - o->warmup);
    p = p < 0 ? 0 : p > 1 ? 1 : p;
    return o->min_lr + 0.5 * (1 + cos(M_PI * p)) * (o->lr - o->min_lr);
}

static double ref_clip(const Options *o, double norm) {
    if (o->grad_clip <= 0) return 1;
    double s = o->grad_clip / (norm + 1e-6);
    return s < 1 ? s : 1;
}

/* torch.optim.AdamW, one element. */
static void ref_adamw(const Options *o, double wd, double lr, double t, double g, double *p, double *m, double *v) {
    *p -= lr * wd * *p;
    *m = o->beta1 * *m + (1 - o->beta1) * g;
    *v = o->beta2 * *v + (1 - o->beta2) * g * g;
    double mh = *m / (1 - pow(o->beta1, t)), vh = *v / (1 - pow(o->beta2, t));
    *p -= lr * mh / (sqrt(vh) + o->eps);
}

/* ---- the model: y = (x W + b) * g; loss = sum(tanh(y) * R) ---- */

static Loc L(Module *m, int line) { return (Loc){ir_intern(m, "opt.lua"), line}; }

static int add(Module *m, Op op, int nin, const int *in, int nattr, const Attr *at, const Type *src, int line) {
    NodeSpec s = ir_spec(op, L(m, line));
    s.nin = nin, s.in = in, s.nattr = nattr, s.attr = at, s.src_type = src;
    char err[256];
    int n = ir_add_node(m->stages[0], &s, err, sizeof err);
    if (n < 0) fail_msg("%s: %s", ir_ops[op].name, err);
    return ir_out(m->stages[0], n);
}

static int named(Module *m, Op op, const char *name, Type t, int line) {
    Attr at[2] = {ir_attr_str(m, "name", name), ir_attr_str(m, "init", "normal")};
    Attr std_ = ir_attr_float(m, "std", 0.5);
    Attr all[3] = {at[0], at[1], std_};
    return add(m, op, 0, NULL, op == OP_param ? 3 : 1, all, &t, line);
}

static Module *tiny_model(void) {
    Module *m = ir_module_new("opt");
    Type tx = {DT_F32, 2, {2, 3}}, tw = {DT_F32, 2, {3, 4}}, tb = {DT_F32, 1, {4}}, ty = {DT_F32, 2, {2, 4}};
    int x = named(m, OP_input, "x", tx, 1);
    int r = named(m, OP_input, "R", ty, 2);
    int w = named(m, OP_param, "W", tw, 3);
    int b = named(m, OP_param, "b", tb, 4);
    int g = named(m, OP_param, "g", tb, 5);
    int xw[2] = {x, w};
    int y = add(m, OP_matmul, 2, xw, 0, NULL, NULL, 6);
    int64_t shp[2] = {2, 4};
    Attr bs = ir_attr_ints(m, "shape", shp, 2);
    int bb = add(m, OP_broadcast, 1, &b, 1, &bs, NULL, 7), gb = add(m, OP_broadcast, 1, &g, 1, &bs, NULL, 8);
    int in[2] = {y, bb};
    y = add(m, OP_add, 2, in, 0, NULL, NULL, 9);
    in[0] = y, in[1] = gb;
    y = add(m, OP_mul, 2, in, 0, NULL, NULL, 10);
    y = add(m, OP_tanh, 1, &y, 0, NULL, NULL, 11);
    in[0] = y, in[1] = r;
    y = add(m, OP_mul, 2, in, 0, NULL, NULL, 12);
    Attr red[2] = {ir_attr_int(m, "dim", 0), ir_attr_int(m, "keep", 0)};
    y = add(m, OP_sum, 1, &y, 2, red, NULL, 13);
    y = add(m, OP_sum, 1, &y, 2, red, NULL, 13);
    add(m, OP_loss, 1, &y, 0, NULL, NULL, 14);
    return m;
}

static Module *compiled(const Options *o) {
    Module *m = tiny_model();
    pass_autodiff(m, o);
    pass_optimizer(m, o);
    char err[512];
    if (ir_verify_module(m, err, sizeof err) != 0) fail_msg("verify: %s", err);
    return m;
}

static Options test_options(void) {
    Options o;
    opt_defaults(&o);
    o.lr = 0.05;
    o.min_lr = 0.005;
    o.warmup = 1;
    o.steps = 4;
    o.weight_decay = 0.2;
    o.grad_clip = 0.5; /* small: clipping is active */
    return o;
}

static void set_inputs(Interp *it) {
    double x[6], r[8];
    for (int i = 0; i < 6; i++) x[i] = sin(1.0 + i);
    for (int i = 0; i < 8; i++) r[i] = cos(2.0 + 3 * i);
    assert_int_equal(interp_set_input(it, 0, "x", x, 6), 0);
    assert_int_equal(interp_set_input(it, 0, "R", r, 8), 0);
}

static double max_rel(const double *a, const double *b, int64_t n) { return rel_err(a, b, n, 1e-3); }

/* ---- tests ---- */

static void three_steps(const Options *o) {
    Module *m = compiled(o);
    Interp *it = interp_new(m, 1);
    interp_init_state(it, 3);
    set_inputs(it);
    const char *names[3] = {"W", "b", "g"};
    double wd[3] = {o->weight_decay, 0, 0}; /* rank 1: no decay */
    double *p[3], *mo[3], *vo[3];
    int64_t n[3];
    for (int k = 0; k < 3; k++) {
        Tensor *t = interp_state(it, 0, names[k]);
        assert_non_null(t);
        n[k] = t->n;
        p[k] = malloc(sizeof(double) * (size_t)n[k]);
        mo[k] = calloc((size_t)n[k], sizeof(double));
        vo[k] = calloc((size_t)n[k], sizeof(double));
        memcpy(p[k], t->d, sizeof(double) * (size_t)n[k]);
    }
    for (int step = 1; step <= 3; step++) {
        char err[256];
        if (interp_run(it, err, sizeof err) != 0) fail_msg("run: %s", err);
        double ss = 0;
        const double *g[3];
        for (int k = 0; k < 3; k++) {
            char gn[32];
            snprintf(gn, sizeof gn, "grad:%s", names[k]);
            const Tensor *gt = interp_output(it, 0, gn);
            assert_non_null(gt);
            g[k] = gt->d;
            for (int64_t i = 0; i < n[k]; i++) ss += g[k][i] * g[k][i];
        }
        double norm = sqrt(ss), lr = ref_lr(o, step), scale = ref_clip(o, norm);
        const Tensor *gn = interp_output(it, 0, "grad_norm"), *lt = interp_output(it, 0, "lr");
        assert_non_null(gn);
        assert_non_null(lt);
        assert_true(max_rel(gn->d, &norm, 1) <= TOL);
        assert_true(max_rel(lt->d, &lr, 1) <= TOL);
        if (o->grad_clip > 0 && step == 1) assert_true(scale < 1); /* the test exercises clipping */
        for (int k = 0; k < 3; k++)
            for (int64_t i = 0; i < n[k]; i++)
                ref_adamw(o, wd[k], lr, step, g[k][i] * scale, &p[k][i], &mo[k][i], &vo[k][i]);
        for (int k = 0; k < 3; k++) {
            char mn[32], vn[32];
            snprintf(mn, sizeof mn, "opt.m.%s", names[k]);
            snprintf(vn, sizeof vn, "opt.v.%s", names[k]);
            double ep = max_rel(interp_state(it, 0, names[k])->d, p[k], n[k]);
            double em = max_rel(interp_state(it, 0, mn)->d, mo[k], n[k]);
            double ev = max_rel(interp_state(it, 0, vn)->d, vo[k], n[k]);
            if (ep > TOL || em > TOL || ev > TOL)
                print_message("step %d %s: p %.3g m %.3g v %.3g\n", step, names[k], ep, em, ev);
            assert_true(ep <= TOL && em <= TOL && ev <= TOL);
        }
        assert_true(fabs(interp_state(it, 0, "opt.step")->d[0] - step) == 0);
    }
    for (int k = 0; k < 3; k++) free(p[k]), free(mo[k]), free(vo[k]);
    interp_free(it);
    ir_free(m);
}

static void test_three_steps_clipped(void **s) {
    Options o = test_options();
    three_steps(&o);
}

static void test_three_steps_unclipped(void **s) {
    Options o = test_options();
    o.grad_clip = 0; /* disabled */
    o.warmup = 0;
    three_steps(&o);
}

/* The "lr" output over warm-up, decay and past the end of the schedule. */
static void test_schedule(void **s) {
    Options o = test_options();
    o.warmup = 3;
    o.steps = 7;
    Module *m = compiled(&o);
    Interp *it = interp_new(m, 1);
    interp_init_state(it, 3);
    set_inputs(it);
    double want_at[9] = {0, o.lr / 3, 2 * o.lr / 3, o.lr}; /* t = 1, 2, 3 by hand */
    for (int t = 1; t <= 9; t++) {
        char err[256];
        if (interp_run(it, err, sizeof err) != 0) fail_msg("run: %s", err);
        double lr = interp_output(it, 0, "lr")->d[0];
        double want = t <= 3 ? want_at[t] : ref_lr(&o, t);
        if (t == 5) assert_true(fabs(want - (o.min_lr + 0.5 * (1 + cos(M_PI * 0.5)) * (o.lr - o.min_lr))) < 1e-15);
        if (t >= 7) assert_true(fabs(want - o.min_lr) < 1e-15);
        assert_true(max_rel(&lr, &want, 1) <= TOL);
    }
    interp_free(it);
    ir_free(m);
}

/* IR shape of the pass: phases, Locs, states, and wd only on rank >= 2. */
static void test_structure(void **s) {
    Options o = test_options();
    Module *m = compiled(&o);
    Graph *g = m->stages[0];
    int nadam = 0, nassign = 0, have_lr = 0, have_norm = 0;
    for (int i = 0; i < g->nnodes; i++) {
        Node *n = &g->nodes[i];
        if (n->op == OP_adamw) {
            nadam++;
            assert_int_equal(n->phase, PH_OPT);
            const Node *p = &g->nodes[g->vals[n->in[0]].def];
            assert_int_equal(p->op, OP_param);
            assert_int_equal(n->loc.line, p->loc.line);
            int rank = g->vals[n->in[0]].t.rank;
            assert_true(ir_attr_f(n, "wd", -1) == (rank >= 2 ? o.weight_decay : 0.0));
            assert_true(ir_attr_f(n, "b1", -1) == o.beta1 && ir_attr_f(n, "b2", -1) == o.beta2);
            assert_true(ir_attr_f(n, "eps", -1) == o.eps);
            /* the gradient input is the value of output grad:<name> */
            char gname[64];
            snprintf(gname, sizeof gname, "grad:%s", ir_attr_s(p, "name", ""));
            int found = 0;
            for (int j = 0; j < g->nnodes; j++)
                if (g->nodes[j].op == OP_output && !strcmp(ir_attr_s(&g->nodes[j], "name", ""), gname))
                    found = g->nodes[j].in[0] == n->in[1];
            assert_true(found);
        }
        if (n->op == OP_assign) nassign++;
        if (n->op == OP_output && !strcmp(ir_attr_s(n, "name", ""), "lr")) have_lr = 1;
        if (n->op == OP_output && !strcmp(ir_attr_s(n, "name", ""), "grad_norm")) have_norm = 1;
        if (n->op == OP_state || ir_ops[n->op].flags & F_OPTIMIZER) assert_int_equal(n->phase, PH_OPT);
    }
    assert_int_equal(nadam, 3);
    assert_int_equal(nassign, 1 + 3 * 3);
    assert_true(have_lr && have_norm);
    ir_free(m);
}

static void test_defaults(void **s) {
    Options o;
    memset(&o, 0x5a, sizeof o);
    opt_defaults(&o);
    assert_true(o.pp == 1 && o.dp == 1 && o.cp == 1 && o.tp == 1);
    assert_true(o.lr == 3e-4 && o.min_lr == 0.0 && o.warmup == 0 && o.steps == 1000);
    assert_true(o.weight_decay == 0.1 && o.beta1 == 0.9 && o.beta2 == 0.95 && o.eps == 1e-8);
    assert_true(o.grad_clip == 1.0 && o.seed == 1337 && o.nsets == 0 && o.sets == NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_three_steps_clipped),
        cmocka_unit_test(test_three_steps_unclipped),
        cmocka_unit_test(test_schedule),
        cmocka_unit_test(test_structure),
        cmocka_unit_test(test_defaults),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
