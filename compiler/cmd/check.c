/* check.c — `kiln check`: the interpreter as the compiler's correctness test.
 *
 *   kiln check MODEL [--precision bf16] [--recompute ...]
 *       The step run twice on the same random inputs and initial weights:
 *       once rounding every value to its dtype (f32, or with --precision
 *       bf16 the bf16 step of docs/cuda.md) and once in f64 with nothing
 *       rounded (the exact arithmetic of the same program).  Every output
 *       (loss, grad-norm, lr, gradients) must agree with the f64 run to 1e-5
 *       (f32) or 0.1 (bf16) by the rule below.
 *
 *   kiln check MODEL --dp N --cp N --micro-batches M --zero 0|1 [--cp-layout ...] [--cp-comm ...]
 *       The rank programs of the mesh, every rank simulated in one process,
 *       against the single-device program (no recompute), both in f64, for
 *       two steps on the same random global batch: each rank gets its rows
 *       (dp) and its tokens (cp: dual chunks or contiguous pieces).  Every
 *       output and every updated parameter (gathered from the distributed
 *       optimizer's shards under --zero 1) must match to 1e-9: only the
 *       order of the sums differs.  Two steps, because after one AdamW's
 *       update is nearly sign(g), blind to a gradient's scale.  With
 *       --precision bf16 both programs are the bf16 step, run in f64: its
 *       casts are exact there, so the sharding is checked, not the roundings
 *       (the single-device check does those).
 *
 * The rule.  A tensor x passes against its reference r when
 *
 *       max_k |x_k - r_k|  <=  tol * S,   S = max |r_j| over r's group,
 *
 * the groups being: all the gradients (outputs "grad:<param>") together; all
 * the updated parameters together; every other output (loss, grad-norm, lr, a
 * model's own outputs) by itself.  Relative to the group, not to the tensor
 * itself nor element by element: a gradient's rounding error scales with the
 * terms summed into it, which are the size of the other gradients, not of
 * the result.  A parameter whose true gradient is exactly zero (a key bias
 * added before softmax, which ignores it) gets rounding noise, and that noise
 * must pass; a wrong gradient of it is still caught once it exceeds tol
 * times the largest gradient.  The error printed, "err", is
 * max_k |x_k - r_k| / S; the summary line names the precision, the
 * configuration, the worst err, its tensor and the tolerance.
 *
 * Each mismatch is a line "MISMATCH ..."; the last line sums up, and the
 * exit status is 1 when anything mismatched.
 *
 * A planted bug, for the tests (tests/t_check.sh): KILN_TEST_PERTURB=NAME:D
 * adds D * S to the first element of tensor NAME (an output, or an updated
 * parameter in the parallel check) of the checked run (the rounded run; rank 0
 * of the mesh) before the comparison.  It shows that the comparison fails
 * past the tolerance and passes below it.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#include "ppsched.h"
#include "rng.h"

/* ---- random inputs ---- */

/* A loss mask (issue 17) of 0s and 1s that the ranks share unevenly: the
 * first quarter of the rows and of every row are 0 (so a dp or cp rank
 * holds fewer, or with B/4 rows per rank none), the rest 1 with
 * probability 3/4. */
static void loss_mask_pattern(double *m, const Type *t, uint64_t *s) {
    int64_t rows = t->rank ? t->dim[0] : 1, cols = ir_numel(t) / (rows ? rows : 1), T = t->rank > 1 ? t->dim[1] : 1;
    for (int64_t k = 0; k < rows * cols; k++) {
        int64_t tok = k % cols / (cols / T);
        m[k] = k / cols < rows / 4 || tok < T / 4 ? 0 : (double)(rng_splitmix64(s) % 4 != 0);
    }
}

/* Random global inputs: one array per input of the unsharded graph. */
static double **random_global_inputs(Graph *g, uint64_t seed) {
    double **in = calloc((size_t)g->nnodes, sizeof(double *));
    uint64_t s = seed;
    if (!in) die("out of memory");
    for (int i = 0; i < g->nnodes; i++) {
        Node *n = &g->nodes[i];
        if (n->op != OP_input) continue;
        const Type *t = &g->vals[n->out[0]].t;
        int64_t cnt = ir_numel(t), bound = ir_index_bound(g, n->out[0], 1);
        if (!(in[i] = malloc(sizeof(double) * (size_t)cnt))) die("out of memory");
        for (int64_t k = 0; k < cnt; k++)
            in[i][k] = ir_dtype_is_float(t->dt) ? (double)(rng_splitmix64(&s) >> 11) / 9007199254740992.0 - 0.5
                                                : (double)(rng_splitmix64(&s) % (uint64_t)bound);
        if (strcmp(ir_attr_s(n, "name", ""), "loss_mask") == 0) loss_mask_pattern(in[i], t, &s);
    }
    return in;
}

/* The same random inputs on rank 0 of it. */
static void fill_random_inputs(Interp *it, Graph *g, uint64_t seed) {
    double **in = random_global_inputs(g, seed);
    for (int i = 0; i < g->nnodes; i++) {
        if (!in[i]) continue;
        interp_set_input(it, 0, ir_attr_s(&g->nodes[i], "name", ""), in[i], ir_numel(&g->vals[g->nodes[i].out[0]].t));
        free(in[i]);
    }
    free(in);
}

/* ---- the comparison rule (see the top of the file) ---- */

/* The group scales of the reference run: the largest |gradient| over all
 * "grad:" outputs and the largest |param| over all params (after the step). */
typedef struct {
    double grads, params;
} Scales;

static int is_grad(const char *name) { return strncmp(name, "grad:", 5) == 0; }

static double max_abs(const Tensor *t) {
    double m = 0;
    for (int64_t k = 0; t && k < t->n; k++) m = fmax(m, fabs(t->d[k]));
    return m;
}

static Scales ref_scales(Interp *it, Graph *g) {
    Scales s = {0, 0};
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        const char *name = ir_attr_s(n, "name", "");
        if (n->op == OP_output && is_grad(name)) s.grads = fmax(s.grads, max_abs(interp_output(it, 0, name)));
        if (n->op == OP_param) s.params = fmax(s.params, max_abs(interp_state(it, 0, name)));
    }
    return s;
}

/* S of output `name` whose reference is r. */
static double output_scale(const Scales *s, const char *name, const Tensor *r) {
    return is_grad(name) ? s->grads : max_abs(r);
}

/* KILN_TEST_PERTURB=NAME:D: D for tensor `name`, else 0. */
static double planted(const char *name) {
    const char *e = getenv("KILN_TEST_PERTURB"), *colon = e ? strrchr(e, ':') : NULL;
    if (!colon || strlen(name) != (size_t)(colon - e) || strncmp(e, name, (size_t)(colon - e))) return 0;
    return atof(colon + 1);
}

/* max_k |x_k - r_k| / S, with D*S added to x's first element for a planted bug. */
static double group_err(const Tensor *x, const Tensor *r, double scale, const char *name) {
    if (!x || x->n != r->n) return INFINITY;
    double worst = 0, s = fmax(scale, 1e-300), plant = planted(name) * s;
    for (int64_t k = 0; k < r->n; k++) worst = fmax(worst, fabs(x->d[k] + (k ? 0 : plant) - r->d[k]) / s);
    return worst;
}

/* The worst err so far and its tensor. */
typedef struct {
    double err;
    char name[256];
    int checked, bad;
} Worst;

/* Counts err of tensor `name` into w; 1 when it is over tol. */
static int note(Worst *w, const char *name, double err, double tol) {
    w->checked++;
    if (!isnan(w->err) && !(err <= w->err)) w->err = err, snprintf(w->name, sizeof w->name, "%s", name);
    if (err <= tol) return 0;
    w->bad++;
    return 1;
}

/* ---- kiln check --dp N [--micro-batches M] [--zero 0|1]: the rank programs
 * against the single-device one, in f64, on one random global batch ---- */

/* The program rank r runs: its pipeline stage's graph. */
static Graph *rank_graph(const Module *m, int r) {
    int c[IR_NAXES];
    ir_rank_coords(m, r, c);
    return m->stages[m->nstages > 1 ? c[0] : 0];
}

static int has_input(const Graph *g, const char *name) {
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i].op == OP_input && strcmp(ir_attr_s(&g->nodes[i], "name", ""), name) == 0) return 1;
    return 0;
}

/* Param `name` as rank r's group holds it: from the shards of the state with
 * prefix "" that has it as a member (the distributed optimizer's master
 * weights), else the param's own value.  Into out (numel values). */
static void local_param(Interp *it, Module *m, int r, const char *name, double *out, int64_t numel);

/* Block j of tp (the local type t, split on dim d; in `blocks` blocks, a
 * fused QKV's: its slice of each) into its place in out. */
static void tp_place(const Type *t, int d, int tp, int j, int64_t blocks, const double *x, double *out) {
    int64_t outer = 1, inner = 1, len = t->dim[d] / blocks;
    for (int k = 0; k < d; k++) outer *= t->dim[k];
    for (int k = d + 1; k < t->rank; k++) inner *= t->dim[k];
    outer *= blocks;
    for (int64_t o = 0; o < outer; o++)
        memcpy(out + (o * tp + j) * len * inner, x + o * len * inner, sizeof(double) * (size_t)(len * inner));
}

/* The param node of name in rank r's graph, or NULL; *blocks: its {tp_blocks}. */
static const Value *param_value(Module *m, int r, const char *name, int64_t *blocks) {
    Graph *g = rank_graph(m, r);
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i].op == OP_param && strcmp(ir_attr_s(&g->nodes[i], "name", ""), name) == 0) {
            *blocks = ir_attr_i(&g->nodes[i], "tp_blocks", 1);
            return &g->vals[g->nodes[i].out[0]];
        }
    return NULL;
}

/* Param `name` as rank r's tp group holds it: a param split over tp
 * (issue 20) joined from every tp rank's block of dim d, else r's own. */
static void logical_param(Interp *it, Module *m, int r, const char *name, double *out, int64_t numel) {
    int64_t blocks;
    const Value *v = param_value(m, r, name, &blocks);
    int tp = m->mesh[3];
    if (!v || tp == 1 || v->sh[3].kind != SH_SPLIT) {
        local_param(it, m, r, name, out, numel);
        return;
    }
    int mem[64], idx;
    if (ir_group_members(m, r, ir_group_mask("tp"), mem, &idx) != tp || numel != ir_numel(&v->t) * tp) die("check: param %s: bad tp shards", name);
    int64_t ln = ir_numel(&v->t);
    double *x = malloc(sizeof(double) * (size_t)ln);
    if (!x) die("out of memory");
    for (int j = 0; j < tp; j++) {
        local_param(it, m, mem[j], name, x, ln);
        tp_place(&v->t, v->sh[3].dim, tp, j, blocks, x, out);
    }
    free(x);
}

/* Rank r's output `name`, the gradient of a param split over tp joined from
 * its tp group's blocks (into a tensor the caller frees), else as it is. */
static const Tensor *logical_output(Interp *it, Module *m, int r, const char *name, Tensor *buf) {
    const Tensor *y = interp_output(it, r, name);
    int64_t blocks = 1;
    const Value *v = strncmp(name, "grad:", 5) == 0 ? param_value(m, r, name + 5, &blocks) : NULL;
    if (!y || !v || m->mesh[3] == 1 || v->sh[3].kind != SH_SPLIT) return y;
    int mem[64], idx, tp = m->mesh[3];
    ir_group_members(m, r, ir_group_mask("tp"), mem, &idx);
    *buf = *y;
    buf->n = y->n * tp;
    if (!(buf->d = malloc(sizeof(double) * (size_t)buf->n))) die("out of memory");
    for (int j = 0; j < tp; j++) {
        const Tensor *x = interp_output(it, mem[j], name);
        if (!x || x->n != y->n) die("check: %s: bad tp shards", name);
        tp_place(&v->t, v->sh[3].dim, tp, j, blocks, x->d, buf->d);
    }
    return buf;
}

static void local_param(Interp *it, Module *m, int r, const char *name, double *out, int64_t numel) {
    Graph *g = rank_graph(m, r);
    char member[512];
    int64_t off;
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        const char *prefix = ir_attr_s(n, "prefix", NULL);
        if (n->op != OP_state || !prefix || *prefix) continue;
        for (int k = 0; ir_bucket_member(n, k, member, sizeof member, &off) == 0; k++) {
            if (strcmp(member, name)) continue;
            int mem[64], idx, size = ir_group_members(m, r, ir_group_mask(ir_attr_s(n, "group", "")), mem, &idx);
            const char *sname = ir_attr_s(n, "name", "");
            int64_t c = interp_state(it, mem[0], sname)->n;
            for (int64_t e = 0; e < numel; e++) {
                int64_t gidx = off + e;
                if (gidx / c >= size) die("check: %s: member %s past its bucket", sname, name);
                out[e] = interp_state(it, mem[gidx / c], sname)->d[gidx % c];
            }
            return;
        }
    }
    const Tensor *t = interp_state(it, r, name);
    if (!t || t->n != numel) die("check: no param %s", name);
    memcpy(out, t->d, sizeof(double) * (size_t)numel);
}

/* Rank r's piece of a global input [B, T, ...]: rows of its dp coordinate,
 * and with cp the tokens of its cp coordinate (dual chunk: chunks c and
 * 2cp-1-c of 2cp; contiguous: piece c).  *n: its element count. */
static double *rank_input(const Module *m, int r, const Type *t, const double *x, int contiguous, int64_t *n) {
    int c[IR_NAXES], dp = m->mesh[1], cp = m->mesh[2];
    ir_rank_coords(m, r, c);
    int64_t B = t->dim[0], T = t->rank > 1 ? t->dim[1] : 1, inner = ir_numel(t) / (B * T);
    int64_t b = B / dp, tl = T / cp, half = tl / 2;
    double *y = malloc(sizeof(double) * (size_t)(b * tl * inner + 1));
    if (!y) die("out of memory");
    for (int64_t i = 0; i < b; i++)
        for (int64_t j = 0; j < tl; j++) {
            int64_t gj = cp == 1 ? j : contiguous ? c[2] * tl + j
                                   : j < half ? c[2] * half + j : (2 * cp - 1 - c[2]) * half + (j - half);
            memcpy(y + (i * tl + j) * inner, x + ((c[1] * b + i) * T + gj) * inner, sizeof(double) * (size_t)inner);
        }
    *n = b * tl * inner;
    return y;
}

/* Step `step`'s random global batch: whole into it1, each rank's piece into itp. */
static void feed_step(Interp *it1, Interp *itp, Module *mp, Graph *g1, const Args *a, int step) {
    double **in = random_global_inputs(g1, a->o.seed + 1 + (uint64_t)step);
    for (int i = 0; i < g1->nnodes; i++) {
        if (!in[i]) continue;
        const char *name = ir_attr_s(&g1->nodes[i], "name", "");
        const Type *t = &g1->vals[g1->nodes[i].out[0]].t;
        interp_set_input(it1, 0, name, in[i], ir_numel(t));
        for (int r = 0; r < ir_world(mp); r++) {
            if (!has_input(rank_graph(mp, r), name)) continue; /* a pipeline stage reads only its own inputs */
            int64_t per;
            double *mine = rank_input(mp, r, t, in[i], a->o.cp_contiguous, &per);
            if (interp_set_input(itp, r, name, mine, per) != 0)
                die("check: rank %d has no input %s of %lld values", r, name, (long long)per);
            free(mine);
        }
        free(in[i]);
    }
    free(in);
}

/* Rank r's outputs (scalars, and gradients where the program has them) and
 * updated params (assigns commit after the step) against the single device's. */
static void compare_rank(Interp *it1, Interp *itp, Module *mp, int r, int step, const Scales *sc, double tol, Worst *w) {
    Graph *gp = rank_graph(mp, r);
    for (int i = 0; i < gp->nnodes; i++) {
        if (gp->nodes[i].op != OP_output) continue;
        const char *name = ir_attr_s(&gp->nodes[i], "name", "");
        const Tensor *y = interp_output(it1, 0, name);
        if (!y) die("check: the single-device program has no output %s", name);
        Tensor buf = {0};
        double e = group_err(logical_output(itp, mp, r, name, &buf), y, output_scale(sc, name, y), r ? "" : name);
        free(buf.d);
        if (note(w, name, e, tol)) printf("MISMATCH step %d rank %d output %-30s err %.3g (tolerance %.0e)\n", step + 1, r, name, e, tol);
    }
    for (int i = 0; i < gp->nnodes; i++) {
        if (gp->nodes[i].op != OP_param) continue;
        const char *name = ir_attr_s(&gp->nodes[i], "name", "");
        const Tensor *y = interp_state(it1, 0, name);
        if (!y) die("check: no param %s", name);
        Tensor x = *y;
        if (!(x.d = malloc(sizeof(double) * (size_t)y->n))) die("out of memory");
        logical_param(itp, mp, r, name, x.d, y->n);
        double e = group_err(&x, y, sc->params, r ? "" : name);
        free(x.d);
        if (note(w, name, e, tol)) printf("MISMATCH step %d rank %d param %-31s err %.3g (tolerance %.0e)\n", step + 1, r, name, e, tol);
    }
}

/* --offload's value as the flag says it: auto, or the fraction. */
static const char *offload_name(double f, char *buf) {
    if (f == OFFLOAD_AUTO) return "auto";
    snprintf(buf, 32, "%g", f);
    return buf;
}

static int check_parallel(Args *a) {
    Args ref = *a;
    ref.o.dp = 1, ref.o.micro_batches = 1, ref.o.cp = 1, ref.o.tp = 1, ref.o.pp = 1, ref.o.vpp = 0, ref.o.npp_layers = 0, ref.o.pp_bug = 0;
    ref.o.recompute = RC_NONE, ref.o.memory_budget = ref.o.activation_budget = 0; /* the reference saves everything */
    ref.o.offload = 0, ref.o.offload_stages = 0, ref.o.offload_bug = 0; /* ... on the device */
    Module *m1 = compile(&ref), *mp = compile(a);
    Graph *g1 = m1->stages[0];
    Interp *it1 = interp_new(m1, 1), *itp = interp_new(mp, 1);
    interp_init_state(it1, a->o.seed);
    interp_init_state(itp, a->o.seed);
    const double tol = 1e-9; /* f64 against f64: only the summation order differs */
    double loss[2] = {0, 0};
    Worst w = {-1, "", 0, 0};
    int world = ir_world(mp);
    /* two steps: after one, AdamW's update is nearly sign(g), blind to a
     * gradient's scale; the second step's loss and update are not */
    for (int step = 0; step < 2; step++) {
        feed_step(it1, itp, mp, g1, a, step);
        cmd_interp_run(it1);
        cmd_interp_run(itp);
        loss[step] = cmd_output_scalar(itp, "loss");
        Scales sc = ref_scales(it1, g1);
        for (int r = 0; r < world; r++) compare_rank(it1, itp, mp, r, step, &sc, tol, &w);
    }
    char pp[96] = "";
    if (mp->mesh[0] > 1) snprintf(pp, sizeof pp, " --pp %d --vpp %d --pp-schedule %s", mp->mesh[0], a->o.vpp ? a->o.vpp : ppsched_default_v((PpSchedule)a->o.pp_schedule), pp_schedule_names[a->o.pp_schedule]);
    if (mp->mesh[3] > 1) snprintf(pp + strlen(pp), sizeof pp - strlen(pp), " --tp %d%s", mp->mesh[3], a->o.sp == 2 ? " --no-sp" : " --sp");
    char off[96] = "", oname[32]; /* --offload: how many values went to the host and back */
    int ncopies = 0;
    for (int s = 0; s < mp->nstages; s++)
        for (int i = 0; i < mp->stages[s]->nnodes; i++) ncopies += mp->stages[s]->nodes[i].op == OP_offload;
    if (a->o.offload != 0 || a->o.offload_stages) snprintf(off, sizeof off, " --offload %s (%d values offloaded)", offload_name(a->o.offload, oname), ncopies);
    printf("check %s%s --dp %d --cp %d%s%s --micro-batches %d --zero %d --recompute %s%s: %s; %d ranks, 2 steps; loss %.12f, %.12f; "
           "%d tensors compared with the single-device program, worst err %.2g (%s; tolerance %.0e of the group's largest value), %d mismatched\n",
           a->model, pp, mp->mesh[1], mp->mesh[2], a->o.cp_contiguous ? " --cp-layout contiguous" : "",
           mp->mesh[2] > 1 ? (a->o.cp_comm ? " --cp-comm p2p" : " --cp-comm allgather") : "", a->o.micro_batches, a->o.zero,
           ir_recompute_names[mp->recompute], off,
           a->o.precision_bf16 ? "precision bf16 program, both in f64 (casts exact: the sharding is checked, not the roundings)"
                               : "precision f32 program, both in f64",
           world, loss[0], loss[1], w.checked, w.err, w.name, tol, w.bad);
    interp_free(it1);
    interp_free(itp);
    ir_free(m1);
    ir_free(mp);
    return w.bad ? 1 : 0;
}

/* ---- kiln check: the same step in f32 and f64 on the same random inputs ---- */

int cmd_check(Args *a) {
    if (a->o.dp > 1 || a->o.micro_batches > 1 || a->o.cp > 1 || a->o.tp > 1 || a->o.pp > 1 || a->o.offload != 0 || a->o.offload_stages)
        return check_parallel(a);
    Module *m = compile(a);
    Graph *g = m->stages[0];
    Interp *it[2];
    const char *prec = a->o.precision_bf16 ? "bf16" : "f32";
    for (int p = 0; p < 2; p++) {
        it[p] = interp_new(m, p);
        interp_init_state(it[p], a->o.seed);
        fill_random_inputs(it[p], g, a->o.seed + 1);
        cmd_interp_run(it[p]);
    }
    /* it[0] rounds every value to its dtype, it[1] is exact; bf16's
     * roundings (8 bits of mantissa) get a wider tolerance than f32's */
    const double tol = a->o.precision_bf16 ? 0.1 : 1e-5;
    Scales sc = ref_scales(it[1], g);
    Worst w = {-1, "", 0, 0};
    for (int i = 0; i < g->nnodes; i++) {
        Node *n = &g->nodes[i];
        if (n->op != OP_output) continue;
        const char *name = ir_attr_s(n, "name", "");
        const Tensor *y = interp_output(it[1], 0, name);
        double e = group_err(interp_output(it[0], 0, name), y, output_scale(&sc, name, y), name);
        if (note(&w, name, e, tol)) printf("MISMATCH %-40s %s vs f64 err %.3g (tolerance %.0e)\n", name, prec, e, tol);
    }
    printf("check %s --recompute %s: precision %s vs f64, 1 step; loss %s %.7f f64 %.7f; %d tensors compared, worst err %.2g (%s; "
           "tolerance %.0e of the group's largest value), %d mismatched\n",
           a->model, ir_recompute_names[m->recompute], prec, prec, cmd_output_scalar(it[0], "loss"), cmd_output_scalar(it[1], "loss"), w.checked, w.err, w.name, tol,
           w.bad);
    interp_free(it[0]);
    interp_free(it[1]);
    ir_free(m);
    return w.bad ? 1 : 0;
}
