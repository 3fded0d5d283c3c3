/* test_emit.c — the LLVM back end (compiler/emit/emit_llvm.c) against the interpreter.
 *
 * Modules are either built by hand (with the kernel attributes, stream/pos
 * and space/offset fields the passes would set, written here directly) or
 * loaded from models/ and sent through autodiff, optimizer, fuse, schedule
 * and memplan (and also, unfused, through a stand-in plan written here).
 * Each is JIT'd, one step runs on the runtime, and every output (loss,
 * grad:*, lr, grad_norm) and every optimizer state after the step is
 * compared with the f32 interpreter on the same weights and inputs: relative
 * error <= 1e-5 of each tensor's largest magnitude.  Hand-built modules
 * compare the params after the step too (see PARAMS for why models don't).
 *
 * Also: the program table field by field, the accuracy of the generated
 * exp/tanh over the whole float range, the object file, the golden text of
 * `--emit llvm` for a small fused kernel (UPDATE_GOLDEN=1 rewrites it), and
 * the internal error for an op the back end cannot emit.
 *
 * Multi-rank (comm_module: collectives, shard, bucketed optimizer state):
 * the args of each comm kernel in the text of the step for dp = 2; the
 * mesh, buckets and states' bucket/prefix in the JIT'd table; one rank
 * against the interpreter (collectives are copies there); two real ranks
 * under `mpirun -np 2` (this binary re-run with --mpi-rank) against the
 * interpreter's two ranks; and the internal errors for what the back end
 * does not emit (interleaved chunks, i32 collectives, inconsistent buckets).
 *
 * Params without storage (master_module: the distributed optimizer's master
 * weights in a bucket with prefix ""): space = offset = -1 in the table and
 * prefix "" on their state, at dp = 2 and at one rank (where a step runs
 * against the interpreter too), and the internal errors when such a param
 * is read or its bucket and its storage disagree.
 */
#include "testutil.h"
#include "graphbuild.h"

#include <dlfcn.h>
#include <float.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cmd.h"
#include "emit.h"
#include "kiln_rt.h"

static const double TOL = 1e-5;

/* ---- building modules by hand (graphbuild.h) ---- */

static Bld bld(const char *name) { return bld_new(name, "t.lua"); }

/* ---- a stand-in schedule and memory plan ----
 * Everything on stream 0 in node order; params, grads ("grad:" outputs) and
 * states in their spaces, the rest in ACT, each value its own 64-aligned
 * buffer (no reuse); views share their input's buffer; values used only
 * inside their fused group get none, nor (as in memplan) params nothing
 * reads: their values live in a "param.b<k>" shard. */

static int read_by_any(const Graph *g, int vid) {
    for (int i = 0; i < g->nnodes; i++)
        for (int j = 0; j < g->nodes[i].nin; j++)
            if (g->nodes[i].in[j] == vid) return 1;
    return 0;
}

static int internal_to_group(const Graph *g, int vid) {
    const Node *def = &g->nodes[g->vals[vid].def];
    const Attr *k = ir_attr(def, "kernel");
    if (!k) return 0;
    int used = 0;
    for (int i = 0; i < g->nnodes; i++)
        for (int j = 0; j < g->nodes[i].nin; j++)
            if (g->nodes[i].in[j] == vid) {
                const Attr *ku = ir_attr(&g->nodes[i], "kernel");
                if (!ku || ku->i != k->i) return 0;
                used = 1;
            }
    return used;
}

static void plan_trivially(Module *m) {
    Graph *g = m->stages[0];
    int64_t top[RT_NSPACES] = {0};
    char *grad = calloc((size_t)g->nvals, 1);
    for (int i = 0; i < g->nnodes; i++) {
        Node *n = &g->nodes[i];
        n->stream = 0;
        n->pos = i;
        if (n->op == OP_output && strncmp(ir_attr_s(n, "name", ""), "grad:", 5) == 0) grad[n->in[0]] = 1;
    }
    for (int i = 0; i < g->nnodes; i++) {
        Node *n = &g->nodes[i];
        for (int k = 0; k < n->nout; k++) {
            Value *v = &g->vals[n->out[k]];
            if (n->op == OP_reshape || n->op == OP_loss) {
                v->space = g->vals[n->in[0]].space;
                v->offset = g->vals[n->in[0]].offset;
                continue;
            }
            if (internal_to_group(g, v->id) || (n->op == OP_param && !read_by_any(g, v->id))) continue;
            int s = n->op == OP_param ? RT_SPACE_PARAMS : n->op == OP_state ? RT_SPACE_OPT : grad[v->id] ? RT_SPACE_GRADS : RT_SPACE_ACT;
            v->space = s;
            v->offset = top[s];
            top[s] += (ir_numel(&v->t) * (int64_t)ir_dtype_size(v->t.dt) + 63) / 64 * 64;
        }
    }
    free(grad);
}

/* ---- running a program ---- */

typedef struct {
    const rt_program *p;
    Jit *jit;
    rt_ctx *ctx;
    char *spaces[RT_NSPACES];
} Run;

static Run run_open(const Module *m) {
    Run r = {0};
    char err[2048];
    r.jit = emit_jit(m, &r.p, err, sizeof err);
    if (!r.jit) fail_msg("emit_jit: %s", err);
    assert_non_null(r.p);
    rt_options o = {.threads = 2};
    r.ctx = rt_new(r.p, &o);
    if (!r.ctx) fail_msg("rt_new failed");
    for (int s = 0; s < RT_NSPACES; s++) {
        r.spaces[s] = rt_space(r.ctx, s);
        if (r.p->space_bytes[s] > 0) memset(r.spaces[s], 0xff, (size_t)r.p->space_bytes[s]); /* NaNs: reads of unwritten memory show */
    }
    return r;
}

static void run_step(Run *r) {
    char err[1024];
    if (rt_step(r->ctx, err, sizeof err) != 0) fail_msg("rt_step: %s", err);
}

/* The context first: the trace it may write names kernels by JIT'd strings. */
static void run_close(Run *r) {
    rt_free(r->ctx);
    emit_jit_free(r->jit);
}

static void *tptr(Run *r, const rt_tensor *t) {
    if (t->space < 0 || t->space >= RT_NSPACES || t->offset < 0) fail_msg("%s has no storage (space %d)", t->name, t->space);
    return r->spaces[t->space] + t->offset;
}

/* A param without storage (its values live in a "param.b<k>" state). */
static int stored(const rt_tensor *t) { return t->space != -1; }

static int64_t tnumel(const rt_tensor *t) {
    int64_t n = 1;
    for (int d = 0; d < t->rank; d++) n *= t->dim[d];
    return n;
}

static void put(Run *r, const rt_tensor *t, const double *d) {
    for (int64_t i = 0; i < tnumel(t); i++) {
        if (t->dtype == RT_F32) ((float *)tptr(r, t))[i] = (float)d[i];
        else if (t->dtype == RT_I32) ((int32_t *)tptr(r, t))[i] = (int32_t)d[i];
        else fail_msg("%s: dtype %d", t->name, t->dtype);
    }
}

static double get(Run *r, const rt_tensor *t, int64_t i) {
    return t->dtype == RT_F32 ? ((float *)tptr(r, t))[i] : ((int32_t *)tptr(r, t))[i];
}

static const rt_tensor *find(const rt_tensor *ts, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (strcmp(ts[i].name, name) == 0) return &ts[i];
    return NULL;
}

/* max |got - want| / max |want| */
static double tensor_err(Run *r, const rt_tensor *t, const double *want) {
    double scale = 1e-12, worst = 0;
    int64_t n = tnumel(t);
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(want[i]));
    for (int64_t i = 0; i < n; i++) {
        double g = get(r, t, i), d = fabs(g - want[i]) / scale;
        if (!(d <= worst)) worst = isnan(d) ? INFINITY : d;
    }
    return worst;
}

static uint64_t rng(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Random data for input node n: floats in [lo, hi), ids below id_bound. */
static double *random_input(const Graph *g, const Node *n, uint64_t *s, double lo, double hi, int64_t *cnt) {
    const Type *t = &g->vals[n->out[0]].t;
    int64_t bound = ir_index_bound(g, n->out[0], 100);
    *cnt = ir_numel(t);
    double *d = malloc(sizeof(double) * (size_t)*cnt);
    assert_non_null(d);
    for (int64_t k = 0; k < *cnt; k++)
        d[k] = ir_dtype_is_float(t->dt) ? lo + (hi - lo) * (double)(rng(s) >> 11) / 9007199254740992.0
                                        : (double)(rng(s) % (uint64_t)bound);
    return d;
}

enum {
    RT_INIT = 1, /* weights from rt_init_params (checked equal to the interpreter's), else copied */
    PARAMS = 2,  /* compare params after the step too (AdamW's first step is sign(g) for g ~ 0:
                    ill-conditioned where a gradient is pure rounding noise) */
};

/* JIT m, run one step and the f32 interpreter on the same weights and
 * random inputs (floats in [lo, hi)), compare every output and every state
 * (and param, with PARAMS) after the step.  Returns the worst relative
 * error; prints each tensor above TOL. */
static double vs_interp(const Module *m, uint64_t seed, double lo, double hi, int flags) {
    const Graph *g = m->stages[0];
    Interp *it = interp_new(m, 0);
    interp_init_state(it, seed);
    Run r = run_open(m);
    const rt_program *p = r.p;
    double worst = 0;
    if (flags & RT_INIT) {
        rt_init_params(r.ctx, seed);
        for (int i = 0; i < p->nparams; i++) {
            if (!stored(&p->params[i])) continue;
            double e = tensor_err(&r, &p->params[i], interp_state(it, 0, p->params[i].name)->d);
            if (e != 0) printf("# init %s differs from the interpreter's: %g\n", p->params[i].name, e);
            worst = fmax(worst, e);
        }
    }
    for (int i = 0; i < p->nparams; i++)
        if (stored(&p->params[i])) put(&r, &p->params[i], interp_state(it, 0, p->params[i].name)->d);
    for (int i = 0; i < p->nstates; i++) put(&r, &p->states[i], interp_state(it, 0, p->states[i].name)->d);
    uint64_t s = seed ^ 0xabcdefull;
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        if (n->op != OP_input) continue;
        const char *name = ir_attr_s(n, "name", "");
        int64_t cnt;
        double *d = random_input(g, n, &s, lo, hi, &cnt);
        assert_int_equal(interp_set_input(it, 0, name, d, cnt), 0);
        const rt_tensor *rt = find(p->inputs, p->ninputs, name);
        assert_non_null(rt);
        put(&r, rt, d);
        free(d);
    }
    char err[1024];
    if (interp_run(it, err, sizeof err) != 0) fail_msg("interp_run: %s", err);
    run_step(&r);
    for (int i = 0; i < p->noutputs; i++) {
        const Tensor *want = interp_output(it, 0, p->outputs[i].name);
        assert_non_null(want);
        assert_int_equal(want->n, tnumel(&p->outputs[i]));
        double e = tensor_err(&r, &p->outputs[i], want->d);
        if (!(e <= TOL)) printf("# output %s: relative error %g\n", p->outputs[i].name, e);
        worst = fmax(worst, e);
    }
    for (int k = (flags & PARAMS) ? 0 : 1; k < 2; k++) { /* after the step's assigns */
        const rt_tensor *ts = k ? p->states : p->params;
        for (int i = 0; i < (k ? p->nstates : p->nparams); i++) {
            if (!stored(&ts[i])) continue;
            double e = tensor_err(&r, &ts[i], interp_state(it, 0, ts[i].name)->d);
            if (!(e <= TOL)) printf("# %s %s after the step: relative error %g\n", k ? "state" : "param", ts[i].name, e);
            worst = fmax(worst, e);
        }
    }
    run_close(&r);
    interp_free(it);
    return worst;
}

/* ---- the program table ---- */

static void test_table(void **st) {
    Bld b = bld("tablecheck");
    int x = input(&b, "tokens", TY(DT_I32, 2, 3));
    int w = param(&b, "w", TY(DT_F32, 4, 5), "normal", 0.5);
    int bias = param(&b, "bias", TY(DT_F32, 5), "zeros", 0);
    int a = input(&b, "a", TY(DT_F32, 2, 3, 4));
    int mstate = state(&b, "opt.m.w", TY(DT_F32, 4, 5));
    int y = val(&b, OP_matmul, INS(a, w), NOATS); /* [2,3,5]: 2*6*5*4 flops */
    int q = input(&b, "q", TY(DT_F32, 1, 2, 4, 8));
    int kv = input(&b, "kv", TY(DT_F32, 1, 1, 4, 8));
    int att = node(&b, OP_attention, INS(q, kv, kv), ATS(ai(&b, "causal", 1), af(&b, "scale", 0.5)), NULL);
    node(&b, OP_record, NULL, 0, ATS(ai(&b, "event", 3)), NULL);
    node(&b, OP_wait, NULL, 0, ATS(ai(&b, "event", 3)), NULL);
    b.kernel = 7;
    int z = val(&b, OP_add, INS(y, bcast(&b, bias, TY(DT_F32, 2, 3, 5))), NOATS);
    b.kernel = -1;
    output(&b, z, "z");
    output(&b, b.g->vals[b.g->nodes[att].out[1]].id, "lse");
    assign(&b, w, "opt.m.w");
    (void)x;
    (void)mstate;
    plan_trivially(b.m);
    b.g->nodes[b.g->nnodes - 3].stream = 2; /* nstreams = 3 */

    char err[1024];
    const rt_program *p;
    Jit *j = emit_jit(b.m, &p, err, sizeof err);
    if (!j) fail_msg("emit_jit: %s", err);
    assert_int_equal(p->abi_version, RT_ABI_VERSION);
    assert_string_equal(p->model, "tablecheck");
    Graph *g = b.g;
    int64_t top[RT_NSPACES] = {0};
    for (int i = 0; i < g->nvals; i++) {
        const Value *v = &g->vals[i];
        if (v->space >= 0) top[v->space] = fmax(top[v->space], v->offset + ir_numel(&v->t) * 4);
    }
    for (int s = 0; s < RT_NSPACES; s++) assert_int_equal(p->space_bytes[s], (top[s] + 63) / 64 * 64);
    assert_int_equal(p->nparams, 2);
    assert_int_equal(p->nstates, 1);
    assert_int_equal(p->ninputs, 4);
    assert_int_equal(p->noutputs, 2);
    const rt_tensor *t = &p->params[0];
    assert_string_equal(t->name, "w");
    assert_int_equal(t->space, RT_SPACE_PARAMS);
    assert_int_equal(t->offset, g->vals[w].offset);
    assert_int_equal(t->dtype, RT_F32);
    assert_int_equal(t->rank, 2);
    assert_true(t->dim[0] == 4 && t->dim[1] == 5 && t->dim[2] == 0);
    assert_string_equal(t->init, "normal");
    assert_true(t->std == 0.5);
    t = &p->params[1];
    assert_string_equal(t->name, "bias");
    assert_int_equal(t->offset, g->vals[bias].offset);
    assert_string_equal(t->init, "zeros");
    t = &p->states[0];
    assert_string_equal(t->name, "opt.m.w");
    assert_int_equal(t->space, RT_SPACE_OPT);
    assert_null(t->init);
    t = &p->inputs[0];
    assert_string_equal(t->name, "tokens");
    assert_int_equal(t->dtype, RT_I32);
    assert_true(t->rank == 2 && t->dim[0] == 2 && t->dim[1] == 3);
    assert_string_equal(p->inputs[3].name, "kv");
    assert_int_equal(p->inputs[3].rank, 4);
    t = &p->outputs[0];
    assert_string_equal(t->name, "z");
    assert_int_equal(t->space, g->vals[z].space);
    assert_int_equal(t->offset, g->vals[z].offset);
    assert_true(t->rank == 3 && t->dim[2] == 5);
    t = &p->outputs[1];
    assert_string_equal(t->name, "lse");
    assert_true(t->rank == 3 && t->dim[0] == 1 && t->dim[1] == 2 && t->dim[2] == 4);
    assert_int_equal(p->nstreams, 3);
    assert_int_equal(p->nevents, 4);
    /* matmul 2*2*3*5*4 = 240; causal attention 4*1*2*4*4*8/2 = 512 */
    assert_true(p->flops == 240 + 512);
    assert_non_null(p->step);
    emit_jit_free(j);
    ir_free(b.m);
}

/* ---- fused groups ---- */

/* gelu(a*b + c) with c [16] broadcast to [2,3,16]; a*b is also an output. */
static Module *gelu_module(void) {
    Bld b = bld("fused");
    int a = input(&b, "a", TY(DT_F32, 2, 3, 16));
    int x = param(&b, "b", TY(DT_F32, 2, 3, 16), "normal", 1);
    int c = param(&b, "c", TY(DT_F32, 16), "normal", 1);
    b.kernel = 0;
    int ab = val(&b, OP_mul, INS(a, x), NOATS);
    int y = val(&b, OP_gelu, INS(val(&b, OP_add, INS(ab, bcast(&b, c, TY(DT_F32, 2, 3, 16))), NOATS)), NOATS);
    b.kernel = -1;
    output(&b, y, "y");
    output(&b, ab, "ab");
    plan_trivially(b.m);
    return b.m;
}

static void test_fused_gelu(void **st) {
    Module *m = gelu_module();
    /* the add and the broadcast are internal: no buffer */
    assert_int_equal(m->stages[0]->vals[4].space, -1);
    assert_int_equal(m->stages[0]->vals[5].space, -1);
    double e = vs_interp(m, 1, -2, 2, PARAMS);
    if (!(e <= TOL)) fail_msg("relative error %g", e);
    ir_free(m);
}

/* Every elementwise op (and cast) in one group or as one-node groups, on
 * inputs over [-3, 3).  Outputs come after the groups (groups are contiguous). */
static Module *unary_module(int one_group) {
    Bld b = bld("unary");
    Type t = TY(DT_F32, 5, 37);
    int x = input(&b, "x", t), dy = input(&b, "dy", t);
    static const Op un[] = {OP_neg, OP_exp, OP_tanh, OP_gelu, OP_silu, OP_relu};
    static const Op bw[] = {OP_gelu_bwd, OP_silu_bwd, OP_relu_bwd, OP_add, OP_sub, OP_mul, OP_div};
    int outs[32], nout = 0, k = 0;
    const char *names[32];
    b.kernel = 0;
    for (size_t i = 0; i < sizeof un / sizeof *un; i++) {
        if (!one_group) b.kernel = k++;
        names[nout] = ir_ops[un[i]].name;
        outs[nout++] = val(&b, un[i], INS(x), NOATS);
    }
    for (size_t i = 0; i < sizeof bw / sizeof *bw; i++) {
        if (!one_group) b.kernel = k++;
        names[nout] = ir_ops[bw[i]].name;
        outs[nout++] = val(&b, bw[i], INS(dy, x), NOATS);
    }
    /* positive-domain ops on exp(x); a cast round trip; a const */
    if (!one_group) b.kernel = k++;
    int ex = val(&b, OP_exp, INS(x), NOATS);
    names[nout] = "log", outs[nout++] = val(&b, OP_log, INS(ex), NOATS);
    names[nout] = "sqrt", outs[nout++] = val(&b, OP_sqrt, INS(ex), NOATS);
    names[nout] = "rsqrt", outs[nout++] = val(&b, OP_rsqrt, INS(ex), NOATS);
    int ci = val(&b, OP_cast, INS(val(&b, OP_mul, INS(x, cnst(&b, t, 10)), NOATS)), ATS(as(&b, "dtype", "i32")));
    names[nout] = "cast_i32", outs[nout++] = ci;
    names[nout] = "cast_f32", outs[nout++] = val(&b, OP_cast, INS(ci), ATS(as(&b, "dtype", "f32")));
    b.kernel = -1;
    for (int i = 0; i < nout; i++) output(&b, outs[i], names[i]);
    plan_trivially(b.m);
    return b.m;
}

static void test_fused_ops(void **st) {
    for (int one = 0; one < 2; one++) {
        Module *m = unary_module(one);
        double e = vs_interp(m, 2, -3, 3, PARAMS);
        if (!(e <= TOL)) fail_msg("%s: relative error %g", one ? "one group" : "one-op groups", e);
        ir_free(m);
    }
}

/* issue 17's ops in one group or as one-op groups, on inputs over [-3, 3):
 * sigmoid, abs, pow (an odd integer power of negative numbers, a fractional
 * one of exp(x)), minimum, maximum, abs_bwd, where with a mask that is zero
 * where x <= 0, and minimum_bwd, maximum_bwd with a tie wherever x > 0. */
static Module *ops17_module(int one_group) {
    Bld b = bld("ops17");
    Type t = TY(DT_F32, 5, 37);
    int x = input(&b, "x", t), dy = input(&b, "dy", t);
    int outs[16], nout = 0, k = 0;
    const char *names[16];
#define GROUP() (b.kernel = one_group ? 0 : k++)
    GROUP();
    int rx = val(&b, OP_relu, INS(x), NOATS);
    static const Op un[] = {OP_sigmoid, OP_abs};
    static const Op bw[] = {OP_minimum, OP_maximum, OP_abs_bwd};
    static const Op tern[] = {OP_where, OP_minimum_bwd, OP_maximum_bwd};
    for (size_t i = 0; i < sizeof un / sizeof *un; i++) {
        GROUP();
        names[nout] = ir_ops[un[i]].name, outs[nout++] = val(&b, un[i], INS(x), NOATS);
    }
    for (size_t i = 0; i < sizeof bw / sizeof *bw; i++) {
        GROUP();
        names[nout] = ir_ops[bw[i]].name, outs[nout++] = val(&b, bw[i], INS(dy, x), NOATS);
    }
    for (size_t i = 0; i < sizeof tern / sizeof *tern; i++) {
        GROUP();
        int in0 = tern[i] == OP_where ? rx : dy;
        names[nout] = ir_ops[tern[i]].name, outs[nout++] = val(&b, tern[i], INS(in0, x, rx), NOATS);
    }
    GROUP();
    names[nout] = "pow3", outs[nout++] = val(&b, OP_pow, INS(x), ATS(af(&b, "p", 3)));
    GROUP();
    int ex = val(&b, OP_exp, INS(x), NOATS);
    names[nout] = "pow1.5", outs[nout++] = val(&b, OP_pow, INS(ex), ATS(af(&b, "p", 1.5)));
#undef GROUP
    b.kernel = -1;
    for (int i = 0; i < nout; i++) output(&b, outs[i], names[i]);
    plan_trivially(b.m);
    return b.m;
}

static void test_fused_ops17(void **st) {
    for (int one = 0; one < 2; one++) {
        Module *m = ops17_module(one);
        double e = vs_interp(m, 3, -3, 3, PARAMS);
        if (!(e <= TOL)) fail_msg("%s: relative error %g", one ? "one group" : "one-op groups", e);
        ir_free(m);
    }
}

/* Broadcast patterns read inside a group: trailing, leading, middle, scalar,
 * and a run of two broadcast dims.  Large enough for rt_parallel_for, whose
 * chunks start in the middle of rows. */
static void test_fused_broadcasts(void **st) {
    Bld b = bld("bcast");
    Type big = TY(DT_F32, 7, 9, 11, 37);
    static const int64_t shapes[][5] = {{1, 37}, {2, 11, 37}, {4, 7, 1, 11, 1}, {3, 9, 1, 37}, {0}, {4, 7, 1, 1, 37}, {3, 9, 1, 1}, {4, 1, 9, 11, 37}};
    int x = input(&b, "x", big);
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        Type s = ty(DT_F32, (int)shapes[i][0], &shapes[i][1]);
        char name[16];
        snprintf(name, sizeof name, "s%zu", i);
        int p = param(&b, name, s, "normal", 1);
        b.kernel = (int)i;
        int y = val(&b, OP_mul, INS(x, bcast(&b, p, big)), NOATS);
        b.kernel = -1;
        snprintf(name, sizeof name, "y%zu", i);
        output(&b, y, name);
    }
    int lone = param(&b, "lone", TY(DT_F32, 11, 1), "normal", 1);
    b.kernel = 100; /* a broadcast alone: materialised by a fused kernel */
    int z = bcast(&b, lone, big);
    b.kernel = -1;
    output(&b, z, "lone_out");
    plan_trivially(b.m);
    double e = vs_interp(b.m, 3, -1, 1, PARAMS);
    if (!(e <= TOL)) fail_msg("relative error %g", e);
    ir_free(b.m);
}

/* Two streams: stream 1 computes y, records event 0; stream 0 waits for it
 * and computes z from y. */
static void test_streams(void **st) {
    Bld b = bld("streams");
    Type t = TY(DT_F32, 64, 129);
    int x = input(&b, "x", t);
    b.kernel = 0;
    int y = val(&b, OP_tanh, INS(val(&b, OP_exp, INS(x), NOATS)), NOATS);
    b.kernel = -1;
    int rec = node(&b, OP_record, NULL, 0, ATS(ai(&b, "event", 0)), NULL);
    int wt = node(&b, OP_wait, NULL, 0, ATS(ai(&b, "event", 0)), NULL);
    b.kernel = 1;
    int z = val(&b, OP_mul, INS(y, y), NOATS);
    b.kernel = -1;
    output(&b, y, "y");
    output(&b, z, "z");
    plan_trivially(b.m);
    for (int i = 0; i <= rec; i++) b.g->nodes[i].stream = 1;
    b.g->nodes[wt].stream = 0;
    char err[1024];
    if (ir_verify_module(b.m, err, sizeof err) != 0) fail_msg("verify: %s", err);
    double e = vs_interp(b.m, 5, -2, 2, PARAMS);
    if (!(e <= TOL)) fail_msg("relative error %g", e);
    const rt_program *p;
    Jit *j = emit_jit(b.m, &p, err, sizeof err);
    assert_non_null(j);
    assert_int_equal(p->nstreams, 2);
    assert_int_equal(p->nevents, 1);
    emit_jit_free(j);
    ir_free(b.m);
}

/* kiln_expf and kiln_tanhf against libm over the whole float range. */
static void test_exp_tanh_accuracy(void **st) {
    enum { N = 4096 };
    Bld b = bld("exp");
    int x = input(&b, "x", TY(DT_F32, N));
    b.kernel = 0;
    int ex = val(&b, OP_exp, INS(x), NOATS), th = val(&b, OP_tanh, INS(x), NOATS);
    b.kernel = -1;
    output(&b, ex, "exp");
    output(&b, th, "tanh");
    plan_trivially(b.m);
    Run r = run_open(b.m);
    float *in = tptr(&r, &r.p->inputs[0]);
    static const float special[] = {0, -0.0f, 1e-30f, -1e-8f, 0.5f, 0.625f, -0.625f, 1, 9, -9, 20, -20, 87.3f, 88.5f, 88.72f,
                                    88.73f, 89, 100, -87.3f, -100, -103.5f, -104, -200, INFINITY, -INFINITY, NAN};
    int ns = (int)(sizeof special / sizeof *special);
    for (int i = 0; i < N; i++) in[i] = i < ns ? special[i] : -110 + 200 * (float)(i - ns) / (N - ns);
    run_step(&r);
    const float *ye = tptr(&r, &r.p->outputs[0]), *yt = tptr(&r, &r.p->outputs[1]);
    double worst_e = 0, worst_t = 0;
    for (int i = 0; i < N; i++) {
        double we = exp((double)in[i]), wt = tanh((double)in[i]);
        if (isnan(in[i])) {
            assert_true(isnan(ye[i]) && isnan(yt[i]));
            continue;
        }
        if (we > FLT_MAX) assert_true(isinf(ye[i]) && ye[i] > 0);
        else if (we < FLT_MIN) assert_true(fabs(ye[i] - we) <= 0x1p-148);  /* denormal: absolute */
        else worst_e = fmax(worst_e, fabs(ye[i] - we) / we);
        worst_t = fmax(worst_t, fabs(yt[i] - wt) / fmax(fabs(wt), 1e-38));
    }
    printf("# kiln_expf max relative error %.3g, kiln_tanhf %.3g\n", worst_e, worst_t);
    assert_true(worst_e <= 3e-7); /* 2.5 ulp */
    assert_true(worst_t <= 5e-7);
    run_close(&r);
    ir_free(b.m);
}

/* ---- library ops (needs kernels/cpu) ---- */

static void test_library_ops(void **st) {
    Bld b = bld("lib");
    int x = input(&b, "x", TY(DT_F32, 2, 3, 4, 5));
    int w = param(&b, "w", TY(DT_F32, 5, 6), "normal", 1);
    int wt = param(&b, "wt", TY(DT_F32, 6, 5), "normal", 1);
    int bb = param(&b, "bb", TY(DT_F32, 2, 3, 5, 4), "normal", 1);
    output(&b, val(&b, OP_matmul, INS(x, w), NOATS), "mm");
    output(&b, val(&b, OP_matmul, INS(x, wt), ATS(ai(&b, "tb", 1))), "mm_tb");
    output(&b, val(&b, OP_matmul, INS(x, bb), NOATS), "mm_batched");
    output(&b, val(&b, OP_matmul, INS(bb, bb), ATS(ai(&b, "ta", 1))), "mm_ta_batched");
    output(&b, val(&b, OP_matmul, INS(bb, x), ATS(ai(&b, "ta", 1), ai(&b, "tb", 1))), "mm_ta_tb2");
    int x2 = val(&b, OP_reshape, INS(x), ATS(ir_attr_ints(b.m, "shape", (int64_t[]){24, 5}, 2)));
    output(&b, val(&b, OP_matmul, INS(x2, w), ATS(ai(&b, "ta", 0))), "mm2");
    output(&b, val(&b, OP_matmul, INS(x2, x2), ATS(ai(&b, "ta", 1))), "mm_ta");
    for (int d = 0; d < 4; d++) {
        char name[32];
        snprintf(name, sizeof name, "sum%d", d);
        output(&b, val(&b, OP_sum, INS(x), ATS(ai(&b, "dim", d))), name);
        snprintf(name, sizeof name, "mean%d", d);
        output(&b, val(&b, OP_mean, INS(x), ATS(ai(&b, "dim", d), ai(&b, "keep", 1))), name);
        snprintf(name, sizeof name, "max%d", d);
        int mx = val(&b, OP_max, INS(x), ATS(ai(&b, "dim", d)));
        output(&b, mx, name);
        snprintf(name, sizeof name, "max_bwd%d", d);
        output(&b, val(&b, OP_max_bwd, INS(mx, x, mx), ATS(ai(&b, "dim", d))), name);
    }
    output(&b, val(&b, OP_sumsq, INS(x), NOATS), "sumsq");
    output(&b, val(&b, OP_transpose, INS(x), ATS(ai(&b, "a", 1), ai(&b, "b", 3))), "tr13");
    output(&b, val(&b, OP_transpose, INS(x), ATS(ai(&b, "a", 0), ai(&b, "b", 1))), "tr01");
    output(&b, val(&b, OP_slice, INS(x), ATS(ai(&b, "dim", 2), ai(&b, "start", 1), ai(&b, "end", 3))), "slice");
    output(&b, val(&b, OP_concat, INS(x, x, x), ATS(ai(&b, "dim", 1))), "concat");
    int c = cnst(&b, TY(DT_F32, 2, 3, 4, 2), -1.5);
    output(&b, val(&b, OP_concat, INS(c, x), ATS(ai(&b, "dim", 3))), "concat_const");
    output(&b, val(&b, OP_broadcast, INS(w), ATS(shape(&b, TY(DT_F32, 3, 5, 6)))), "bcast");
    output(&b, val(&b, OP_sumto, INS(x), ATS(shape(&b, TY(DT_F32, 4, 5)))), "sumto45");
    output(&b, val(&b, OP_sumto, INS(x), ATS(shape(&b, TY(DT_F32, 3, 1, 5)))), "sumto315");
    output(&b, val(&b, OP_sumto, INS(x), ATS(shape(&b, TY(DT_F32, 2, 1, 4, 1)))), "sumto2141");
    output(&b, val(&b, OP_sumto, INS(x), ATS(shape(&b, SCALAR))), "sumto_scalar");
    output(&b, val(&b, OP_softmax, INS(x), NOATS), "softmax");
    output(&b, val(&b, OP_softmax_bwd, INS(x, val(&b, OP_softmax, INS(x), NOATS)), NOATS), "softmax_bwd");
    int io = ir_out(b.g, node(&b, OP_iota, NULL, 0, NOATS, &(Type){.dt = DT_I32, .rank = 1, .dim = {7}}));
    output(&b, io, "iota");
    output(&b, cnst(&b, TY(DT_I32, 3), 4), "const_i32");
    output(&b, val(&b, OP_allreduce, INS(x), ATS(as(&b, "group", "dp"))), "allreduce");
    output(&b, val(&b, OP_allgather, INS(x), ATS(as(&b, "group", "tp"), ai(&b, "dim", 1))), "allgather");
    plan_trivially(b.m);
    double e = vs_interp(b.m, 4, -1, 1, PARAMS);
    if (!(e <= TOL)) fail_msg("relative error %g", e);
    ir_free(b.m);
}

/* ---- multi-rank: collectives, shard, buckets ---- */

static char *slurp(FILE *f);

/* The passes a compiled program goes through after the optimizer. */
static void fuse_schedule_plan(Module *m) {
    Options o;
    opt_defaults(&o);
    pass_fuse(m, &o);
    pass_schedule(m, &o);
    pass_memplan(m, &o);
    char err[1024];
    if (ir_verify_module(m, err, sizeof err) != 0) fail_msg("verify: %s", err);
}

static int group_size_of(const Module *m, const Node *n) {
    int mask = ir_group_mask(ir_attr_s(n, "group", "")), size = 1;
    for (int a = 0; a < IR_NAXES; a++)
        if (mask & (1 << a)) size *= m->mesh[a];
    return size;
}

enum { B0_N = 40, B1_N = 6 }; /* bucket lengths: multiples of dp = 1, 2 */

/* A state of bucket k as the optimizer pass declares it: this rank's shard. */
static int bucket_state(Bld *b, const char *name, int k, const char *prefix, int dp) {
    static const int64_t off0[] = {0, 32}, off1[] = {0};
    int64_t n = k == 0 ? B0_N : B1_N;
    Type t = TY(DT_F32, n / dp);
    Attr at[] = {as(b, "name", name), ai(b, "bucket", k), as(b, "group", "dp"), as(b, "prefix", prefix),
                 as(b, "params", k == 0 ? "w,bias" : "c"), ir_attr_ints(b->m, "offsets", k == 0 ? off0 : off1, k == 0 ? 2 : 1),
                 ai(b, "n", n)};
    return ir_out(b->g, node(b, OP_state, NULL, 0, at, 7, &t));
}

/* A module on a mesh of dp ranks (dp-way data parallel) with two buckets of
 * optimizer state (bucket 0: params w [8,4] at 0 and bias [6] at 32 of 40;
 * bucket 1: c [5] at 0 of 6), a state outside any bucket, every param read
 * (one the step does not read has no storage: see master_module), and with `comm`:
 * every collective and shard over dp (and dp+cp, and tp: a group of one),
 * a reduce-scatter and all-gather on interleaved chunks (dim 1 of [8,4]:
 * outer 8) and rank-dependent iotas over dp in both layouts.
 * Bucket 0's first state adds an input, through an allreduce with comm. */
static Module *comm_module(int dp, int comm) {
    Bld b = bld("comm");
    b.m->mesh[1] = dp;
    int w = param(&b, "w", TY(DT_F32, 8, 4), "normal", 1);
    int bias = param(&b, "bias", TY(DT_F32, 6), "zeros", 0);
    int c = param(&b, "c", TY(DT_F32, 5), "normal", 1);
    output(&b, val(&b, OP_mul, INS(bias, bias), NOATS), "bias2");
    output(&b, val(&b, OP_mul, INS(c, c), NOATS), "c2");
    int m0 = bucket_state(&b, "opt.m.b0", 0, "opt.m.", dp);
    bucket_state(&b, "opt.v.b0", 0, "opt.v.", dp);
    int m1 = bucket_state(&b, "opt.m.b1", 1, "opt.m.", dp);
    bucket_state(&b, "opt.v.b1", 1, "opt.v.", dp);
    int t = state(&b, "opt.t", SCALAR);
    int x = input(&b, "x", TY(DT_F32, 8, 4));
    if (comm) {
        int ids = input(&b, "ids", TY(DT_I32, 6, 3));
        output(&b, val(&b, OP_allreduce, INS(x), ATS(as(&b, "group", "dp"))), "ar");
        int rs = val(&b, OP_reducescatter, INS(x), ATS(as(&b, "group", "dp"), ai(&b, "dim", 0)));
        output(&b, rs, "rs");
        output(&b, val(&b, OP_allgather, INS(rs), ATS(as(&b, "group", "dp"), ai(&b, "dim", 0))), "ag");
        output(&b, val(&b, OP_shard, INS(x), ATS(as(&b, "group", "dp"), ai(&b, "dim", 1))), "sh");
        output(&b, val(&b, OP_shard, INS(ids), ATS(as(&b, "group", "dp"), ai(&b, "dim", 0))), "sh_ids");
        output(&b, val(&b, OP_allreduce, INS(x), ATS(as(&b, "group", "dp+cp"))), "ar_dpcp");
        output(&b, val(&b, OP_allreduce, INS(x), ATS(as(&b, "group", "tp"))), "ar_tp");
        output(&b, val(&b, OP_allgather, INS(w), ATS(as(&b, "group", "tp"), ai(&b, "dim", 1))), "ag_tp");
        int rs1 = val(&b, OP_reducescatter, INS(x), ATS(as(&b, "group", "dp"), ai(&b, "dim", 1)));
        output(&b, rs1, "rs_dim1");
        output(&b, val(&b, OP_allgather, INS(rs1), ATS(as(&b, "group", "dp"), ai(&b, "dim", 1))), "ag_dim1");
        Type pos = {.dt = DT_I32, .rank = 1, .dim = {6}};
        output(&b, ir_out(b.g, node(&b, OP_iota, NULL, 0, ATS(as(&b, "group", "dp"), as(&b, "layout", "dual")), &pos)), "pos_dual");
        output(&b, ir_out(b.g, node(&b, OP_iota, NULL, 0, ATS(as(&b, "group", "dp"), as(&b, "layout", "contiguous")), &pos)),
               "pos_contiguous");
        Attr ring[] = {as(&b, "group", "dp"), as(&b, "layout", "dual"), ai(&b, "from", 1)};
        output(&b, ir_out(b.g, node(&b, OP_iota, NULL, 0, ring, 3, &pos)), "pos_from1");
        Type all = {.dt = DT_I32, .rank = 1, .dim = {12}};
        Attr every[] = {as(&b, "group", "dp"), as(&b, "layout", "dual"), ai(&b, "all", 1)};
        output(&b, ir_out(b.g, node(&b, OP_iota, NULL, 0, every, 3, &all)), "pos_all");
    }
    int g = input(&b, "g", TY(DT_F32, B0_N / dp));
    int upd = comm ? val(&b, OP_allreduce, INS(g), ATS(as(&b, "group", "dp"))) : g;
    assign(&b, val(&b, OP_add, INS(m0, upd), NOATS), "opt.m.b0");
    assign(&b, val(&b, OP_mul, INS(m1, m1), NOATS), "opt.m.b1");
    assign(&b, val(&b, OP_add, INS(t, cnst(&b, SCALAR, 1)), NOATS), "opt.t");
    output(&b, val(&b, OP_matmul, INS(x, val(&b, OP_transpose, INS(w), ATS(ai(&b, "a", 0), ai(&b, "b", 1)))), NOATS), "y");
    return b.m;
}

/* The launches of rtk_<kernel> in the text of kiln_step, in program order:
 * for each, its stream and its args as written ("p" for a pointer, else the
 * constant).  The step function is optnone: each launch is its args' stores
 * into the args array followed by the rt_launch call. */
enum { MAXL = 8, MAXA = 24 };
typedef struct {
    int stream, nargs;
    char arg[MAXA][24];
} Launch;

static int launches(const char *text, const char *kernel, Launch *out) {
    char callee[64];
    snprintf(callee, sizeof callee, "@rtk_%s,", kernel);
    const char *s = strstr(text, "define internal void @kiln_step(");
    assert_non_null(s);
    Launch cur = {0};
    int n = 0;
    while (*s && strncmp(s, "}\n", 2) != 0) {
        const char *nl = strchr(s, '\n');
        size_t len = nl ? (size_t)(nl - s) : strlen(s);
        char line[1024];
        snprintf(line, sizeof line, "%.*s", (int)(len < sizeof line ? len : sizeof line - 1), s);
        const char *st = strstr(line, "store i64 ");
        if (st && cur.nargs < MAXA) {
            char v[24];
            assert_int_equal(sscanf(st + 10, "%23[^,]", v), 1);
            snprintf(cur.arg[cur.nargs++], sizeof cur.arg[0], "%s", v[0] == '%' ? "p" : v);
        }
        const char *call = strstr(line, "@rt_launch(");
        if (call) {
            if (strstr(line, callee) && n < MAXL) {
                assert_int_equal(sscanf(strchr(call, ',') + 1, " i32 %d", &cur.stream), 1);
                out[n++] = cur;
            }
            memset(&cur, 0, sizeof cur);
        }
        s += len + (nl != NULL);
    }
    return n;
}

static void want_args(const Launch *l, const char *const *want, int n) {
    assert_int_equal(l->nargs, n);
    for (int i = 0; i < n; i++)
        if (strcmp(l->arg[i], want[i]) != 0) fail_msg("arg %d: %s, want %s", i, l->arg[i], want[i]);
}
#define WANT(l, ...) want_args(l, (const char *const[]){__VA_ARGS__}, (int)(sizeof((const char *[]){__VA_ARGS__}) / sizeof(char *)))

/* dp = 2: the text of the step calls the comm kernels with the chunk sizes
 * and group masks of kiln_rt.h, on the node's stream; groups of one rank
 * are copies. */
static void test_comm_launches(void **st) {
    Module *m = comm_module(2, 1);
    fuse_schedule_plan(m);
    /* launches carry their node's stream, whatever the schedule chose: the
     * allreduces' streams in program order, the first one moved to stream 3 */
    Graph *g = m->stages[0];
    int ar_stream[MAXL], nar = 0;
    for (int pos = 0; pos < g->nnodes; pos++)
        for (int i = 0; i < g->nnodes; i++) {
            Node *n = &g->nodes[i];
            if (n->pos != pos || n->op != OP_allreduce || group_size_of(m, n) == 1) continue;
            if (nar == 0) n->stream = 3;
            assert_true(nar < MAXL);
            ar_stream[nar++] = n->stream;
        }
    assert_int_equal(nar, 3);
    FILE *f = tmpfile();
    char err[1024];
    assert_non_null(f);
    if (emit_llvm_text_for(m, f, "x86-64", "", err, sizeof err) != 0) fail_msg("emit_llvm_text: %s", err);
    rewind(f);
    char *text = slurp(f);
    fclose(f);
    Launch l[MAXL];
    char mask_dp[8], mask_dpcp[8];
    snprintf(mask_dp, sizeof mask_dp, "%d", RT_AXIS_DP);
    snprintf(mask_dpcp, sizeof mask_dpcp, "%d", RT_AXIS_DP | RT_AXIS_CP);
    /* allreduce: x [8,4] over dp, over dp+cp, the input g [20]; tp is a copy;
     * the last arg is the dtype (RT_F32 = 0) */
    assert_int_equal(launches(text, "allreduce", l), 3);
    WANT(&l[0], "p", "p", "32", mask_dp, "0");
    WANT(&l[1], "p", "p", "32", mask_dpcp, "0");
    WANT(&l[2], "p", "p", "20", mask_dp, "0");
    for (int k = 0; k < 3; k++) assert_int_equal(l[k].stream, ar_stream[k]);
    assert_int_equal(l[0].stream, 3);
    /* (outer, n, inner): reducescatter x [8,4] -> [4,4] on dim 0: 1, 4, 4;
     * allgather [4,4] -> [8,4]: 1, 4, 4; on dim 1, [8,4] -> [8,2] and back:
     * 8, 2, 1 (interleaved chunks) */
    assert_int_equal(launches(text, "reducescatter", l), 2);
    WANT(&l[0], "p", "p", "1", "4", "4", mask_dp, "0");
    WANT(&l[1], "p", "p", "8", "2", "1", mask_dp, "0");
    assert_int_equal(launches(text, "allgather", l), 2); /* the tp one is a copy */
    WANT(&l[0], "p", "p", "1", "4", "4", mask_dp, "0");
    WANT(&l[1], "p", "p", "8", "2", "1", mask_dp, "0");
    /* rank iotas: dst, n, mask, dual, from, all; the plain iota is not among them */
    assert_int_equal(launches(text, "iota_rank", l), 4);
    WANT(&l[0], "p", "6", mask_dp, "1", "0", "0");
    WANT(&l[1], "p", "6", mask_dp, "0", "0", "0");
    WANT(&l[2], "p", "6", mask_dp, "1", "1", "0");
    WANT(&l[3], "p", "12", mask_dp, "1", "0", "1");
    /* shard x [8,4] on dim 1 -> [8,2]: outer 8, len 2, inner 1, 4-byte f32;
     * ids i32 [6,3] on dim 0 -> [3,3]: outer 1, len 3, inner 3 */
    assert_int_equal(launches(text, "shard", l), 2);
    WANT(&l[0], "p", "p", "8", "2", "1", "4", mask_dp);
    WANT(&l[1], "p", "p", "1", "3", "3", "4", mask_dp);
    /* the table: the mesh and the bucket arrays */
    assert_non_null(strstr(text, "[4 x i32] [i32 1, i32 2, i32 1, i32 1], i32 2, %rt_bucket* getelementptr"));
    assert_non_null(strstr(text, "@kiln_buckets = private constant [2 x %rt_bucket]"));
    free(text);
    ir_free(m);
}

static const rt_tensor *must_find(const rt_tensor *ts, int n, const char *name) {
    const rt_tensor *t = find(ts, n, name);
    if (!t) fail_msg("no table entry %s", name);
    return t;
}

/* The table of a dp = 2 program: mesh, buckets with their members' param
 * indices and offsets, and the states' bucket and prefix. */
static void check_comm_table(const rt_program *p, int dp) {
    assert_int_equal(p->abi_version, RT_ABI_VERSION);
    assert_true(p->mesh[0] == 1 && p->mesh[1] == dp && p->mesh[2] == 1 && p->mesh[3] == 1);
    assert_int_equal(p->cp_contiguous, 0); /* its iotas are over dp */
    assert_int_equal(p->nbuckets, 2);
    assert_non_null(p->buckets);
    const rt_bucket *b0 = &p->buckets[0], *b1 = &p->buckets[1];
    assert_int_equal(b0->group, RT_AXIS_DP);
    assert_int_equal(b0->n, B0_N);
    assert_int_equal(b0->nmembers, 2);
    assert_string_equal(p->params[b0->param[0]].name, "w");
    assert_string_equal(p->params[b0->param[1]].name, "bias");
    assert_true(b0->offset[0] == 0 && b0->offset[1] == 32);
    assert_int_equal(b1->group, RT_AXIS_DP);
    assert_int_equal(b1->n, B1_N);
    assert_int_equal(b1->nmembers, 1);
    assert_string_equal(p->params[b1->param[0]].name, "c");
    assert_int_equal(b1->offset[0], 0);
    static const struct { const char *name, *prefix; int bucket; int64_t n; } st[] = {
        {"opt.m.b0", "opt.m.", 0, B0_N}, {"opt.v.b0", "opt.v.", 0, B0_N}, {"opt.m.b1", "opt.m.", 1, B1_N},
        {"opt.v.b1", "opt.v.", 1, B1_N}, {"opt.t", NULL, -1, 0}};
    assert_int_equal(p->nstates, 5);
    for (size_t i = 0; i < sizeof st / sizeof *st; i++) {
        const rt_tensor *t = must_find(p->states, p->nstates, st[i].name);
        assert_int_equal(t->bucket, st[i].bucket);
        if (st[i].prefix) {
            assert_string_equal(t->prefix, st[i].prefix);
            assert_true(t->rank == 1 && t->dim[0] == st[i].n / dp); /* this rank's shard */
        } else {
            assert_null(t->prefix);
        }
        assert_int_equal(t->space, RT_SPACE_OPT);
    }
    for (int i = 0; i < p->nparams; i++) {
        assert_int_equal(p->params[i].space, RT_SPACE_PARAMS);
        assert_int_equal(p->params[i].bucket, -1);
        assert_null(p->params[i].prefix);
    }
    for (int i = 0; i < p->noutputs; i++) assert_int_equal(p->outputs[i].bucket, -1);
}

/* The JIT'd table of dp = 2 programs.  The program without collectives needs
 * no comm kernels; the one with them is JIT'd when the runtime defines them
 * (the JIT resolves rtk_* from this process). */
static void test_comm_table(void **st) {
    for (int comm = 0; comm < 2; comm++) {
        if (comm && !dlsym(RTLD_DEFAULT, "rtk_allreduce")) {
            printf("# rtk_allreduce is not in this process: the table of the program with collectives is not JIT'd\n");
            continue;
        }
        Module *m = comm_module(2, comm);
        fuse_schedule_plan(m);
        const rt_program *p;
        char err[1024];
        Jit *j = emit_jit(m, &p, err, sizeof err);
        if (!j) fail_msg("emit_jit: %s", err);
        check_comm_table(p, 2);
        emit_jit_free(j);
        ir_free(m);
    }
}

/* One rank: every collective is a copy, shard the whole tensor; a step with
 * them and with bucketed states against the interpreter, through the real
 * passes and through the stand-in plan. */
static void test_comm_one_rank(void **st) {
    for (int real = 0; real < 2; real++) {
        Module *m = comm_module(1, 1);
        if (real) fuse_schedule_plan(m);
        else plan_trivially(m);
        double e = vs_interp(m, 6, -1, 1, PARAMS);
        if (!(e <= TOL)) fail_msg("%s: relative error %g", real ? "fuse, schedule, memplan" : "stand-in plan", e);
        const rt_program *p;
        char err[1024];
        Jit *j = emit_jit(m, &p, err, sizeof err);
        if (!j) fail_msg("emit_jit: %s", err);
        check_comm_table(p, 1);
        emit_jit_free(j);
        ir_free(m);
    }
}

/* Two ranks, for real: `mpirun -np 2` runs this binary with --mpi-rank
 * (mpi_rank_main): each rank JITs the dp = 2 program, runs one step on the
 * runtime's MPI collectives with its own inputs, and compares its outputs
 * and states with its rank of the interpreter (which runs both ranks in one
 * process).  Skipped without mpirun. */
static int mpi_rank_main(void) {
    Module *m = comm_module(2, 1);
    fuse_schedule_plan(m);
    const Graph *g = m->stages[0];
    Interp *it = interp_new(m, 0);
    interp_init_state(it, 7);
    Run r = run_open(m);
    const rt_program *p = r.p;
    int rank = rt_world_rank(r.ctx);
    for (int q = 0; q < 2; q++) { /* every rank's inputs for the interpreter; ours for the runtime */
        uint64_t s = 0x5eedull + (uint64_t)q;
        for (int i = 0; i < g->nnodes; i++) {
            const Node *n = &g->nodes[i];
            if (n->op != OP_input) continue;
            int64_t cnt;
            double *d = random_input(g, n, &s, -1, 1, &cnt);
            if (interp_set_input(it, q, ir_attr_s(n, "name", ""), d, cnt) != 0) fail_msg("interp_set_input");
            if (q == rank) put(&r, must_find(p->inputs, p->ninputs, ir_attr_s(n, "name", "")), d);
            free(d);
        }
    }
    for (int i = 0; i < p->nparams; i++)
        if (stored(&p->params[i])) put(&r, &p->params[i], interp_state(it, rank, p->params[i].name)->d);
    for (int i = 0; i < p->nstates; i++) put(&r, &p->states[i], interp_state(it, rank, p->states[i].name)->d);
    char err[1024];
    if (interp_run(it, err, sizeof err) != 0) fail_msg("interp_run: %s", err);
    run_step(&r);
    double worst = 0;
    for (int i = 0; i < p->noutputs; i++) {
        const Tensor *want = interp_output(it, rank, p->outputs[i].name);
        if (!want || want->n != tnumel(&p->outputs[i])) fail_msg("output %s: no such output in the interpreter", p->outputs[i].name);
        double e = tensor_err(&r, &p->outputs[i], want->d);
        if (!(e <= TOL)) printf("# rank %d: output %s: relative error %g\n", rank, p->outputs[i].name, e);
        worst = fmax(worst, e);
    }
    for (int i = 0; i < p->nstates; i++) {
        double e = tensor_err(&r, &p->states[i], interp_state(it, rank, p->states[i].name)->d);
        if (!(e <= TOL)) printf("# rank %d: state %s: relative error %g\n", rank, p->states[i].name, e);
        worst = fmax(worst, e);
    }
    printf("# rank %d: worst relative error %.3g\n", rank, worst);
    if (worst <= TOL) printf("rank %d agrees\n", rank);
    fflush(stdout);
    run_close(&r);
    interp_free(it);
    ir_free(m);
    return worst <= TOL ? 0 : 1;
}

static void test_comm_two_ranks(void **st) {
    if (system("command -v mpirun >/dev/null 2>&1") != 0) {
        fail_msg("no mpirun: the two-rank run cannot run (make test installs Open MPI: tools/deps.sh)");
    }
    char self[4096], cmd[4400], line[512];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    assert_true(len > 0);
    self[len] = 0;
    /* ranks leave Open MPI's own allocations behind: no leak check there (SAN=1) */
    snprintf(cmd, sizeof cmd,
             "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ASAN_OPTIONS=\"${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0\" "
             "timeout 120 mpirun -np 2 --oversubscribe '%s' --mpi-rank 2>&1",
             self);
    fflush(stdout);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    int agree = 0;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "rank ", 5) == 0 && strstr(line, " agrees")) agree++;
        else printf("# mpirun: %s", line);
    }
    int status = pclose(f);
    if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) fail_msg("mpirun -np 2 %s --mpi-rank failed (status %d)", self, status);
    assert_int_equal(agree, 2);
}

/* ---- whole models ---- */

/* real_passes: fuse, schedule and memplan; else the stand-in plan above. */
static Module *load_model(const char *path, const char *const *sets, int nsets, Options *o, int real_passes) {
    opt_defaults(o);
    o->sets = calloc((size_t)nsets + 1, sizeof(KeyVal));
    for (int i = 0; i < nsets; i++) {
        const char *eq = strchr(sets[i], '=');
        o->sets[i] = (KeyVal){strndup(sets[i], (size_t)(eq - sets[i])), eq + 1};
    }
    o->nsets = nsets;
    char err[1024];
    Module *m = fe_load(path, o, err, sizeof err);
    if (!m) fail_msg("%s", err);
    pass_autodiff(m, o);
    pass_optimizer(m, o);
    if (real_passes) {
        pass_fuse(m, o);
        pass_schedule(m, o);
        pass_memplan(m, o);
    } else {
        plan_trivially(m);
    }
    if (ir_verify_module(m, err, sizeof err) != 0) fail_msg("verify: %s", err);
    for (int i = 0; i < nsets; i++) free((char *)o->sets[i].key);
    free(o->sets);
    o->sets = NULL;
    return m;
}

static void model_vs_interp(const char *path, const char *const *sets, int nsets) {
    for (int real = 0; real < 2; real++) {
        Options o;
        Module *m = load_model(path, sets, nsets, &o, real);
        int groups = 0;
        for (int i = 0; i < m->stages[0]->nnodes; i++) groups += ir_attr(&m->stages[0]->nodes[i], "kernel") != NULL;
        if (real) assert_true(groups > 0);
        if (real) { /* the table carries the schedule length, the trainer's default --steps */
            char err[512];
            const rt_program *p;
            Jit *j = emit_jit(m, &p, err, sizeof err);
            if (!j) fail_msg("%s", err);
            assert_int_equal(p->steps, (int)o.steps);
            emit_jit_free(j);
        }
        double e = vs_interp(m, 1234, -1, 1, RT_INIT);
        printf("# %s (%s): %d fused nodes; worst relative error %.3g\n", path,
               real ? "fuse, schedule, memplan" : "unfused, stand-in plan", groups, e);
        if (!(e <= TOL)) fail_msg("%s: relative error %g > %g", path, e, TOL);
        ir_free(m);
    }
}

static void test_tiny_gpt(void **st) { model_vs_interp("models/tiny.lua", NULL, 0); }

static void test_small_llama(void **st) {
    static const char *const sets[] = {"layers=2", "dim=64", "heads=4", "kv_heads=2", "ffn=128", "vocab=256", "seq=32", "batch=2"};
    model_vs_interp("models/llama.lua", sets, 8);
}

/* ---- object file, golden text, internal errors ---- */

static void test_object(void **st) {
    Module *m = gelu_module();
    char path[] = "/tmp/kiln_emit_XXXXXX", err[1024];
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    if (emit_object(m, path, err, sizeof err) != 0) fail_msg("emit_object: %s", err);
    FILE *f = fopen(path, "rb");
    unsigned char magic[4] = {0};
    assert_non_null(f);
    assert_int_equal(fread(magic, 1, 4, f), 4);
    fclose(f);
    assert_memory_equal(magic, "\x7f" "ELF", 4);
    char cmd[256], line[256];
    snprintf(cmd, sizeof cmd, "nm %s 2>&1", path);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    int found = 0, external = 0;
    while (fgets(line, sizeof line, p)) {
        char a[64], t[64], name[200];
        if (sscanf(line, "%63s %63s %199s", a, t, name) == 3) {
            char type = t[0];
            if (strcmp(name, "kiln_program") == 0) found = type == 'R' || type == 'D';
            if (type >= 'A' && type <= 'Z' && type != 'U' && strncmp(name, "kiln_program", 12) != 0) external++;
        }
    }
    pclose(p);
    assert_true(found);
    assert_int_equal(external, 0); /* only kiln_program is global */
    unlink(path);
    ir_free(m);
}

/* The text without lines that name the host (target triple/datalayout). */
static char *strip_target(const char *s) {
    char *out = malloc(strlen(s) + 1), *o = out;
    while (*s) {
        const char *nl = strchr(s, '\n');
        size_t len = nl ? (size_t)(nl - s + 1) : strlen(s);
        if (strncmp(s, "target ", 7) != 0) {
            memcpy(o, s, len);
            o += len;
        }
        s += len;
    }
    *o = 0;
    return out;
}

static char *slurp(FILE *f) {
    size_t n = 0, cap = 4096;
    char *s = malloc(cap);
    for (size_t k; (k = fread(s + n, 1, cap - n - 1, f)) > 0;)
        if ((n += k) + 1 == cap) s = realloc(s, cap *= 2);
    s[n] = 0;
    return s;
}

static void test_golden_llvm(void **st) {
    const char *golden = "tests/golden/fused_kernel.ll";
    Module *m = gelu_module();
    FILE *f = tmpfile();
    char err[1024];
    assert_non_null(f);
    if (emit_llvm_text_for(m, f, "x86-64", "", err, sizeof err) != 0) fail_msg("emit_llvm_text: %s", err);
    rewind(f);
    char *text = slurp(f), *got = strip_target(text);
    fclose(f);
    assert_non_null(strstr(got, "@kiln_program = "));
    assert_non_null(strstr(got, "kiln_fused_0"));
    if (getenv("UPDATE_GOLDEN")) {
        FILE *g = fopen(golden, "w");
        assert_non_null(g);
        fputs(got, g);
        assert_int_equal(fclose(g), 0);
    }
    FILE *g = fopen(golden, "r");
    if (!g) fail_msg("%s missing (UPDATE_GOLDEN=1 writes it)", golden);
    char *want = slurp(g);
    fclose(g);
    if (strcmp(got, want) != 0) {
        FILE *o = fopen("/tmp/kiln_fused_kernel.ll", "w");
        if (o) { fputs(got, o); fclose(o); }
        fail_msg("%s differs from the output (written to /tmp/kiln_fused_kernel.ll; UPDATE_GOLDEN=1 to accept)", golden);
    }
    /* the host's text is produced too */
    FILE *h = fopen("/dev/null", "w");
    assert_int_equal(emit_llvm_text(m, h, err, sizeof err), 0);
    fclose(h);
    free(text);
    free(got);
    free(want);
    ir_free(m);
}

/* emit_jit of m dies (an internal error, in a child) with a message
 * containing each of the needles. */
static void expect_ice(const Module *m, const char *const *needles, int n) {
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    fflush(stdout);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fds[1], 2);
        const rt_program *p;
        char err[256];
        emit_jit(m, &p, err, sizeof err);
        _exit(0);
    }
    close(fds[1]);
    char msg[1024] = {0};
    size_t got = 0;
    for (ssize_t k; (k = read(fds[0], msg + got, sizeof msg - 1 - got)) > 0;) got += (size_t)k;
    close(fds[0]);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFSIGNALED(status)) fail_msg("no internal error (want \"%s\"); stderr: %s", needles[0], msg);
    for (int i = 0; i < n; i++)
        if (!strstr(msg, needles[i])) fail_msg("the internal error lacks \"%s\": %s", needles[i], msg);
}
#define EXPECT_ICE(m, ...) expect_ice(m, (const char *const[]){__VA_ARGS__}, (int)(sizeof((const char *[]){__VA_ARGS__}) / sizeof(char *)))

/* An op the back end cannot emit is an internal error naming it. */
static void test_unknown_op_ice(void **st) {
    Bld b = bld("ice");
    b.m->mesh[1] = 2;
    int x = input(&b, "x", TY(DT_F32, 4));
    node(&b, OP_send, INS(x), ATS(as(&b, "group", "dp"), ai(&b, "peer", 1)), NULL);
    plan_trivially(b.m);
    EXPECT_ICE(b.m, "send");
    ir_free(b.m);
}

/* Over two ranks, an allreduce of i32 is not implemented (f32; bf16 on CUDA); one
 * rank copies it. */
static void test_comm_ice(void **st) {
    Bld b = bld("ice");
    b.m->mesh[1] = 2;
    int x = input(&b, "x", TY(DT_I32, 4, 6));
    output(&b, val(&b, OP_allreduce, INS(x), ATS(as(&b, "group", "dp"))), "y");
    plan_trivially(b.m);
    EXPECT_ICE(b.m, "t.lua:2", "allreduce of i32", "collectives take f32");
    ir_free(b.m);
}

/* A cp program's table says how the rank iotas over cp split the sequence
 * (the trainer hands out tokens by it): dual 0, contiguous 1, none 0; two
 * iotas that disagree are an internal error. */
static Module *cp_module(const char *layout1, const char *layout2) {
    Bld b = bld("cp");
    b.m->mesh[2] = 2;
    Type pos = {.dt = DT_I32, .rank = 1, .dim = {8}};
    if (layout1) output(&b, ir_out(b.g, node(&b, OP_iota, NULL, 0, ATS(as(&b, "group", "cp"), as(&b, "layout", layout1)), &pos)), "p1");
    if (layout2) output(&b, ir_out(b.g, node(&b, OP_iota, NULL, 0, ATS(as(&b, "group", "cp"), as(&b, "layout", layout2)), &pos)), "p2");
    output(&b, ir_out(b.g, node(&b, OP_iota, NULL, 0, NOATS, &pos)), "plain");
    plan_trivially(b.m);
    return b.m;
}

static void test_cp_table(void **st) {
    if (!dlsym(RTLD_DEFAULT, "rtk_iota_rank")) {
        fail_msg("rtk_iota_rank is not in this process (link the test with -rdynamic and libkilnrt.a whole): the cp table cannot be JIT'd");
    }
    static const struct { const char *l1, *l2; int want; } c[] = {
        {"dual", "dual", 0}, {"contiguous", "contiguous", 1}, {NULL, NULL, 0}, {"contiguous", NULL, 1}};
    for (size_t k = 0; k < sizeof c / sizeof *c; k++) {
        Module *m = cp_module(c[k].l1, c[k].l2);
        const rt_program *p;
        char err[1024];
        Jit *j = emit_jit(m, &p, err, sizeof err);
        if (!j) fail_msg("emit_jit: %s", err);
        assert_int_equal(p->mesh[2], 2);
        if (p->cp_contiguous != c[k].want) fail_msg("case %zu: cp_contiguous %d, want %d", k, p->cp_contiguous, c[k].want);
        emit_jit_free(j);
        ir_free(m);
    }
    Module *m = cp_module("dual", "contiguous");
    EXPECT_ICE(m, "iota layouts disagree");
    ir_free(m);
}

/* tiny GPT at --cp 2 (dual and contiguous) through the real passes: the
 * program has rank iotas over cp, all-gathers (K, V along T of
 * [B, KH, T/cp, D]: strided, and the i32 key positions) and reduce-scatters
 * (dK, dV); the attentions take the positions: rtk_attention gets 15 args
 * and rtk_attention_bwd 19, the last two the qpos, kpos pointers, with the
 * local T = S / cp queries against the all-gathered S keys, causal. */
static Module *tiny_cp(int contiguous) {
    Options o;
    opt_defaults(&o);
    o.cp = 2;
    o.cp_contiguous = contiguous;
    char err[1024];
    Module *m = fe_load("models/tiny.lua", &o, err, sizeof err);
    if (!m) fail_msg("%s", err);
    pass_autodiff(m, &o);
    pass_parallelize(m, &o);
    pass_optimizer(m, &o);
    pass_fuse(m, &o);
    pass_schedule(m, &o);
    pass_memplan(m, &o);
    if (ir_verify_module(m, err, sizeof err) != 0) fail_msg("verify: %s", err);
    return m;
}

/* Pipeline stages (kiln_rt.h, rt_program.stages): tiny GPT through the
 * training pipeline with --pp 2 gives one table per stage, kiln_program
 * stage 0's, each with the inputs and params its stage reads (wte, tied, in
 * both) and its own step; the CUDA target refuses several stages in one
 * line. */
static const rt_tensor *table_find(const rt_tensor *t, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (strcmp(t[i].name, name) == 0) return &t[i];
    return NULL;
}

static void test_stage_tables(void **st) {
    Options o;
    opt_defaults(&o);
    o.pp = 2;
    o.micro_batches = 2;
    char err[1024];
    Module *m = fe_load("models/tiny.lua", &o, err, sizeof err);
    if (!m) fail_msg("%s", err);
    pipeline_run(m, PIPE_TRAIN, &o, NULL);
    assert_int_equal(m->nstages, 2);
    const rt_program *p;
    Jit *j = emit_jit(m, &p, err, sizeof err);
    if (!j) fail_msg("%s", err);
    assert_int_equal(p->nstages, 2);
    assert_int_equal(p->stage, 0);
    assert_int_equal(p->mesh[0], 2);
    assert_ptr_equal(p->stages[0], p);
    const rt_program *q = p->stages[1];
    assert_int_equal(q->stage, 1);
    assert_int_equal(q->nstages, 2);
    assert_ptr_equal(q->stages, p->stages);
    assert_int_equal(q->abi_version, RT_ABI_VERSION);
    assert_true(q->step != p->step);
    assert_non_null(table_find(p->inputs, p->ninputs, "tokens"));
    assert_null(table_find(p->inputs, p->ninputs, "targets"));
    assert_non_null(table_find(q->inputs, q->ninputs, "targets"));
    assert_null(table_find(q->inputs, q->ninputs, "tokens"));
    assert_non_null(table_find(p->params, p->nparams, "wte.weight"));
    assert_non_null(table_find(q->params, q->nparams, "wte.weight"));
    assert_non_null(table_find(p->params, p->nparams, "wpe.weight"));
    assert_null(table_find(q->params, q->nparams, "wpe.weight"));
    assert_null(table_find(p->params, p->nparams, "ln_f.weight"));
    assert_non_null(table_find(q->params, q->nparams, "ln_f.weight"));
    for (int s = 0; s < 2; s++) assert_non_null(table_find(p->stages[s]->outputs, p->stages[s]->noutputs, "loss"));
    emit_jit_free(j);
    EmitTarget cuda = {.device = RT_DEV_CUDA, .arch = "sm_90"};
    FILE *f = tmpfile();
    assert_non_null(f);
    /* the tied wte's transfers between the two stages go in their receiver's
     * order (pp.c numbers them as they are sent): CUDA emits both stages */
    if (emit_llvm_text_target(m, &cuda, f, err, sizeof err) != 0) fail_msg("%s", err);
    fclose(f);
    ir_free(m);
}

static void test_cp_model(void **st) {
    for (int contiguous = 0; contiguous < 2; contiguous++) {
        Module *m = tiny_cp(contiguous);
        const Graph *g = m->stages[0];
        int niota = 0, nag = 0, nrs = 0;
        for (int i = 0; i < g->nnodes; i++) {
            const Node *n = &g->nodes[i];
            niota += n->op == OP_iota && ir_group_mask(ir_attr_s(n, "group", "")) == RT_AXIS_CP;
            nag += n->op == OP_allgather && ir_group_mask(ir_attr_s(n, "group", "")) == RT_AXIS_CP;
            nrs += n->op == OP_reducescatter && ir_group_mask(ir_attr_s(n, "group", "")) == RT_AXIS_CP;
        }
        assert_true(niota >= 1 && nag >= 2 && nrs >= 2);
        FILE *f = tmpfile();
        char err[1024];
        assert_non_null(f);
        if (emit_llvm_text_for(m, f, "x86-64", "", err, sizeof err) != 0) fail_msg("emit_llvm_text: %s", err);
        rewind(f);
        char *text = slurp(f);
        fclose(f);
        Launch l[MAXL];
        for (int bwd = 0; bwd < 2; bwd++) {
            int nl = launches(text, bwd ? "attention_bwd" : "attention", l), np = bwd ? 9 : 5;
            assert_true(nl >= 1); /* tiny has at least one layer */
            for (int i = 0; i < nl; i++) {
                assert_int_equal(l[i].nargs, np + 11);
                for (int a = 0; a < np; a++) assert_string_equal(l[i].arg[a], "p");
                long T = atol(l[i].arg[np + 3]), S = atol(l[i].arg[np + 4]);
                assert_true(T > 0 && 2 * T == S);
                assert_string_equal(l[i].arg[np + 6], "1"); /* causal */
                assert_string_equal(l[i].arg[np + 8], "p"); /* qpos */
                assert_string_equal(l[i].arg[np + 9], "p"); /* kpos */
                assert_string_equal(l[i].arg[np + 10], "0"); /* no window */
            }
        }
        free(text);
        ir_free(m);
    }
}

/* --cp-comm p2p: the ring's send/recv become rtk_send/rtk_recv(ptr, bytes,
 * mask, peer, tag) on the node's stream (the comm stream), in program
 * order with the bytes of the value sent or received, and attn_merge
 * becomes rtk_attn_merge(o_a, lse_a, o_b, lse_b, o, lse, rows, D), one per
 * IR node, with rows = lse's elements and rows * D = o's. */
static void test_cp_p2p_launches(void **st) {
    (void)st;
    Options o;
    opt_defaults(&o);
    o.cp = 2;
    o.cp_comm = 1;
    char err[1024], mask_cp[8];
    snprintf(mask_cp, sizeof mask_cp, "%d", RT_AXIS_CP);
    Module *m = fe_load("models/tiny.lua", &o, err, sizeof err);
    if (!m) fail_msg("%s", err);
    pass_autodiff(m, &o);
    pass_parallelize(m, &o);
    pass_optimizer(m, &o);
    pass_fuse(m, &o);
    pass_schedule(m, &o);
    pass_memplan(m, &o);
    if (ir_verify_module(m, err, sizeof err) != 0) fail_msg("verify: %s", err);
    const Graph *g = m->stages[0];
    const Node *sends[MAXL], *recvs[MAXL], *merges[MAXL];
    int ns = 0, nr = 0, nm = 0;
    for (int pos = 0; pos < g->nnodes; pos++)
        for (int i = 0; i < g->nnodes; i++) {
            const Node *n = &g->nodes[i];
            if (n->pos != pos) continue;
            if (n->op == OP_send && ns < MAXL) sends[ns++] = n;
            if (n->op == OP_recv && nr < MAXL) recvs[nr++] = n;
            if (n->op == OP_attn_merge && nm < MAXL) merges[nm++] = n;
        }
    assert_true(ns >= 3 && nr == ns && nm >= 1);
    FILE *f = tmpfile();
    assert_non_null(f);
    if (emit_llvm_text_for(m, f, "x86-64", "", err, sizeof err) != 0) fail_msg("emit_llvm_text: %s", err);
    rewind(f);
    char *text = slurp(f);
    fclose(f);
    Launch l[MAXL];
    char bytes[32], tag[16], rows[32], D[32];
    for (int dir = 0; dir < 2; dir++) {
        const Node *const *ir = dir ? recvs : sends;
        assert_int_equal(launches(text, dir ? "recv" : "send", l), ns);
        for (int k = 0; k < ns; k++) {
            const Value *v = &g->vals[dir ? ir[k]->out[0] : ir[k]->in[0]];
            snprintf(bytes, sizeof bytes, "%lld", (long long)(ir_numel(&v->t) * ir_dtype_size(v->t.dt)));
            snprintf(tag, sizeof tag, "%lld", (long long)ir_attr_i(ir[k], "tag", -1));
            WANT(&l[k], "p", bytes, mask_cp, dir ? "-1" : "1", tag);
            assert_int_equal(l[k].stream, ir[k]->stream);
            assert_int_equal(l[k].stream, 1);
        }
    }
    assert_int_equal(launches(text, "attn_merge", l), nm);
    for (int k = 0; k < nm; k++) {
        int64_t r = ir_numel(&g->vals[merges[k]->in[1]].t);
        snprintf(rows, sizeof rows, "%lld", (long long)r);
        snprintf(D, sizeof D, "%lld", (long long)(ir_numel(&g->vals[merges[k]->in[0]].t) / r));
        WANT(&l[k], "p", "p", "p", "p", "p", "p", rows, D, "0"); /* dt: f32 */
    }
    free(text);
    ir_free(m);
}

/* A bucket the states describe inconsistently is an internal error naming
 * what is wrong. */
static void test_bucket_ice(void **st) {
    enum { OTHER_N, UNKNOWN_PARAM, GAP, OVERLAP, SHARD_SIZE, NO_PREFIX, NCASES };
    static const char *const want[NCASES][2] = {
        {"opt.v.b0", "another n"}, {"bucket 0", "no param named \"nope\""}, {"bucket 0 has no state", "dense"},
        {"bucket 0", "overlaps"},  {"opt.m.b0 has 8 elements", "its shard of bucket 0 has 4"}, {"opt.m.b0", "no prefix"}};
    for (int c = 0; c < NCASES; c++) {
        Bld b = bld("bucketice");
        b.m->mesh[1] = 2;
        param(&b, "w", TY(DT_F32, 3), "normal", 1);
        param(&b, "v", TY(DT_F32, 2), "normal", 1);
        for (int s = 0; s < 2; s++) {
            int64_t off[] = {0, c == OVERLAP ? 2 : 3}, n = c == OTHER_N && s == 1 ? 10 : 8;
            Type t = TY(DT_F32, c == SHARD_SIZE ? 8 : 4);
            Attr at[] = {as(&b, "name", s ? "opt.v.b0" : "opt.m.b0"), ai(&b, "bucket", c == GAP ? 1 : 0), as(&b, "group", "dp"),
                         as(&b, "params", c == UNKNOWN_PARAM ? "w,nope" : "w,v"), ir_attr_ints(b.m, "offsets", off, 2),
                         ai(&b, "n", n), as(&b, "prefix", s ? "opt.v." : "opt.m.")};
            node(&b, OP_state, NULL, 0, at, c == NO_PREFIX ? 6 : 7, &t);
        }
        plan_trivially(b.m);
        EXPECT_ICE(b.m, want[c][0], want[c][1]);
        ir_free(b.m);
    }
}

/* ---- params without storage (the distributed optimizer's master weights) ---- */

enum { MASTER_N = 6 }; /* bucket 0: u [5] at 0 and one element of padding */

/* Param u [5], which the step never reads (memplan gives it no storage), is
 * held by bucket 0 over dp: its values by state "param.b0" (prefix ""),
 * its moment by "opt.m.b0".  Param w [2,3] is read as usual.  The step
 * all-gathers param.b0 (output "u_full", how a step reads master weights),
 * updates both shards from the input g and outputs w * x.  With `read_u`,
 * the step also reads u (output "u2"), which a storage-less u must not be. */
static Module *master_module(int dp, int read_u) {
    Bld b = bld("master");
    b.m->mesh[1] = dp;
    int w = param(&b, "w", TY(DT_F32, 2, 3), "normal", 1);
    int u = param(&b, "u", TY(DT_F32, 5), "normal", 0.5);
    static const int64_t off[] = {0};
    static const char *const names[2] = {"param.b0", "opt.m.b0"}, *const prefixes[2] = {"", "opt.m."};
    int sh[2];
    for (int k = 0; k < 2; k++) {
        Type t = TY(DT_F32, MASTER_N / dp);
        Attr at[] = {as(&b, "name", names[k]), ai(&b, "bucket", 0), as(&b, "group", "dp"), as(&b, "prefix", prefixes[k]),
                     as(&b, "params", "u"), ir_attr_ints(b.m, "offsets", off, 1), ai(&b, "n", MASTER_N)};
        sh[k] = ir_out(b.g, node(&b, OP_state, NULL, 0, at, 7, &t));
    }
    int x = input(&b, "x", TY(DT_F32, 2, 3));
    int g = input(&b, "g", TY(DT_F32, MASTER_N / dp));
    output(&b, val(&b, OP_allgather, INS(sh[0]), ATS(as(&b, "group", "dp"), ai(&b, "dim", 0))), "u_full");
    output(&b, val(&b, OP_mul, INS(w, x), NOATS), "y");
    if (read_u) output(&b, val(&b, OP_mul, INS(u, u), NOATS), "u2");
    int m = val(&b, OP_add, INS(sh[1], g), NOATS);
    assign(&b, m, "opt.m.b0");
    assign(&b, val(&b, OP_sub, INS(sh[0], m), NOATS), "param.b0");
    return b.m;
}

/* The table of master_module(dp): u without storage (space = offset = -1,
 * the rest as for any param), w in the params space (which holds w alone),
 * param.b0 with prefix "" (a string, not NULL) and bucket 0 naming u. */
static void check_master_table(const rt_program *p, int dp) {
    assert_true(p->mesh[0] == 1 && p->mesh[1] == dp && p->mesh[2] == 1 && p->mesh[3] == 1);
    assert_int_equal(p->nparams, 2);
    const rt_tensor *u = must_find(p->params, p->nparams, "u"), *w = must_find(p->params, p->nparams, "w");
    assert_int_equal(u->space, -1);
    assert_int_equal(u->offset, -1);
    assert_int_equal(u->dtype, RT_F32);
    assert_true(u->rank == 1 && u->dim[0] == 5);
    assert_string_equal(u->init, "normal");
    assert_true(u->std == 0.5);
    assert_int_equal(u->bucket, -1);
    assert_null(u->prefix);
    assert_int_equal(w->space, RT_SPACE_PARAMS);
    assert_true(w->offset >= 0);
    assert_int_equal(p->space_bytes[RT_SPACE_PARAMS], 64); /* w's 24 bytes, 64-aligned: nothing for u */
    assert_int_equal(p->nstates, 2);
    const rt_tensor *pb = must_find(p->states, p->nstates, "param.b0"), *mb = must_find(p->states, p->nstates, "opt.m.b0");
    assert_non_null(pb->prefix);
    assert_string_equal(pb->prefix, "");
    assert_string_equal(mb->prefix, "opt.m.");
    for (int k = 0; k < 2; k++) {
        const rt_tensor *t = k ? mb : pb;
        assert_int_equal(t->bucket, 0);
        assert_int_equal(t->space, RT_SPACE_OPT);
        assert_true(t->rank == 1 && t->dim[0] == MASTER_N / dp);
    }
    assert_int_equal(p->nbuckets, 1);
    const rt_bucket *b = &p->buckets[0];
    assert_int_equal(b->group, RT_AXIS_DP);
    assert_int_equal(b->n, MASTER_N);
    assert_int_equal(b->nmembers, 1);
    assert_true(&p->params[b->param[0]] == u);
    assert_int_equal(b->offset[0], 0);
}

/* dp = 2 through fuse, schedule and memplan: the JIT'd table. */
static void test_master_table(void **st) {
    if (!dlsym(RTLD_DEFAULT, "rtk_allgather")) {
        fail_msg("rtk_allgather is not in this process (link the test with -rdynamic and libkilnrt.a whole): the program cannot be JIT'd");
    }
    Module *m = master_module(2, 0);
    fuse_schedule_plan(m);
    const rt_program *p;
    char err[1024];
    Jit *j = emit_jit(m, &p, err, sizeof err);
    if (!j) fail_msg("emit_jit: %s", err);
    check_master_table(p, 2);
    emit_jit_free(j);
    ir_free(m);
}

/* One rank, through the real passes and the stand-in plan: the table, and
 * a step against the interpreter (u itself is neither written nor compared:
 * param.b0 carries it). */
static void test_master_one_rank(void **st) {
    for (int real = 0; real < 2; real++) {
        Module *m = master_module(1, 0);
        if (real) fuse_schedule_plan(m);
        else plan_trivially(m);
        const rt_program *p;
        char err[1024];
        Jit *j = emit_jit(m, &p, err, sizeof err);
        if (!j) fail_msg("emit_jit: %s", err);
        check_master_table(p, 1);
        emit_jit_free(j);
        double e = vs_interp(m, 8, -1, 1, PARAMS);
        if (!(e <= TOL)) fail_msg("%s: relative error %g", real ? "fuse, schedule, memplan" : "stand-in plan", e);
        ir_free(m);
    }
}

/* Params without storage that the program gets wrong: one the step reads
 * (its value has no buffer), one no bucket with prefix "" holds, a stored
 * one such a bucket holds too, and two prefix-"" states in one bucket. */
static void test_master_ice(void **st) {
    enum { READ, UNHELD, STORED, TWO_MASTERS, NCASES };
    for (int c = 0; c < NCASES; c++) {
        Module *m = master_module(2, c == READ);
        plan_trivially(m);
        Graph *g = m->stages[0];
        for (int i = 0; i < g->nnodes; i++) {
            Node *n = &g->nodes[i];
            const char *name = ir_attr_s(n, "name", "");
            if (n->op == OP_param && strcmp(name, "u") == 0) {
                Value *v = &g->vals[n->out[0]];
                if (c == READ) v->space = v->offset = -1; /* as memplan would leave it, but read */
                if (c == STORED) v->space = RT_SPACE_PARAMS, v->offset = 4096;
            }
            const char *prefix = c == UNHELD ? "opt.v." : c == TWO_MASTERS && strcmp(name, "opt.m.b0") == 0 ? "" : NULL;
            for (int k = 0; n->op == OP_state && prefix && k < n->nattr; k++)
                if (strcmp(n->attr[k].key, "prefix") == 0) n->attr[k] = ir_attr_str(m, "prefix", prefix);
        }
        if (c == READ) EXPECT_ICE(m, "param \"u\"", "no planned buffer", "but mul at t.lua:", "param.b<k>");
        if (c == UNHELD) EXPECT_ICE(m, "param u has no storage", "no bucket with prefix \"\" holds");
        if (c == STORED) EXPECT_ICE(m, "param u has storage", "state param.b0 (prefix \"\")");
        if (c == TWO_MASTERS) EXPECT_ICE(m, "param.b0 and opt.m.b0 both hold bucket 0");
        ir_free(m);
    }
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "--mpi-rank") == 0) return mpi_rank_main();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table),
        cmocka_unit_test(test_fused_gelu),
        cmocka_unit_test(test_fused_ops),
        cmocka_unit_test(test_fused_ops17),
        cmocka_unit_test(test_fused_broadcasts),
        cmocka_unit_test(test_streams),
        cmocka_unit_test(test_exp_tanh_accuracy),
        cmocka_unit_test(test_library_ops),
        cmocka_unit_test(test_tiny_gpt),
        cmocka_unit_test(test_small_llama),
        cmocka_unit_test(test_object),
        cmocka_unit_test(test_golden_llvm),
        cmocka_unit_test(test_unknown_op_ice),
        cmocka_unit_test(test_comm_launches),
        cmocka_unit_test(test_comm_table),
        cmocka_unit_test(test_comm_one_rank),
        cmocka_unit_test(test_comm_two_ranks),
        cmocka_unit_test(test_comm_ice),
        cmocka_unit_test(test_cp_table),
        cmocka_unit_test(test_cp_model),
        cmocka_unit_test(test_stage_tables),
        cmocka_unit_test(test_cp_p2p_launches),
        cmocka_unit_test(test_bucket_ice),
        cmocka_unit_test(test_master_table),
        cmocka_unit_test(test_master_one_rank),
        cmocka_unit_test(test_master_ice),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
