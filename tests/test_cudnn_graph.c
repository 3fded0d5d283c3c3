/* test_cudnn_graph.c — the cuDNN SDPA graphs of runtime/cuda/attn_cudnn.c,
 * checked without a GPU.
 *
 * attn_cudnn.c describes its forward and backward graphs as data (tensors
 * with uid, dtype, dims and strides; matmul, pointwise, reduction and
 * reshape operations) before it hands them to cuDNN.  This test includes
 * that file with KILN_CUDNN_DESCRIBE_ONLY (so none of its cuDNN or CUDA
 * code is compiled) and runs the very descriptions through a small CPU
 * interpreter of the backend graph semantics:
 *
 *   - a tensor is memory laid out by its strides; a reshape views its
 *     input's memory with its own dims and strides (so a reshape with
 *     swapped strides is a transpose, as in cuDNN);
 *   - values are rounded to a tensor's dtype when written and when read
 *     (bf16 round-to-nearest-even, int32, boolean), math is f64;
 *   - pointwise operands broadcast over dims of 1; a matmul's batch dims
 *     and a reduction's output dims may also be a divisor of the other's
 *     (GQA: index h goes to h / (H/KH), the frontend's "b (hk g)" grouping
 *     and kiln's rule);
 *   - BINARY_SELECT is y = t ? x : b; GEN_INDEX writes the index along its
 *     axis.
 *
 * The interpreter also checks the graph's form: unique uids, every input
 * written before it is read, every tensor written once, every virtual
 * tensor read, every caller tensor bound (the launchers bind exactly q, k,
 * v, o, lse, do, dq, dk, dv by uid).
 *
 * The outputs are compared with a reference attention written out here in
 * f64 (kiln's semantics: scores scale * q.k, key s visible to query t iff
 * s <= t when causal, head h reads kv head h/(H/KH), lse the natural-log
 * log-sum-exp of the scaled scores), on the same bf16 inputs.  Tolerances,
 * max |got - want| / max |want| per tensor: lse 1e-5 (f32 scores of exact
 * bf16 products; observed about 1e-7), o 1e-2 (o is bf16 and P is rounded
 * to bf16 before P V, as cuDNN does: about 2^-8 each; observed about 3e-3),
 * dq, dk, dv 2e-2 (P and dS rounded to bf16 before their matmuls, outputs
 * bf16; observed below 1e-2).  The backward runs on the forward's own o and
 * lse, the reference's backward on the same o and lse.
 *
 * What this cannot check: that cuDNN accepts these graphs and computes
 * them this way.  That needs a GPU (bench/gpu/check.sh).
 */
#include "testutil.h"

#define KILN_CUDNN_DESCRIBE_ONLY
#include "attn_cudnn.c"

/* ---- values ---- */

static float to_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) == 0x7f800000u) return x; /* inf, nan */
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

static float as_dtype(cudnnDataType_t dt, double v) {
    switch (dt) {
    case CUDNN_DATA_BFLOAT16: return to_bf16((float)v);
    case CUDNN_DATA_INT32: return (float)(int32_t)v;
    case CUDNN_DATA_BOOLEAN: return v != 0;
    default: return (float)v;
    }
}

/* n values in [-scale, scale), rounded to bf16 */
static float *rnd_bf16(int64_t n, uint32_t seed, double scale) {
    float *f = malloc(sizeof(float) * (size_t)n);
    if (!f) fail_msg("out of memory");
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        f[i] = to_bf16((float)(((seed >> 8) * (2.0 / 16777216.0) - 1) * scale));
    }
    return f;
}

static float *zeros(int64_t n) {
    float *f = calloc((size_t)n, sizeof(float));
    if (!f) fail_msg("out of memory");
    return f;
}

/* ---- the interpreter ---- */

typedef struct {
    const SdpaGraph *g;
    float *mem[SDPA_MAX_TENSORS];
    float *owned[SDPA_MAX_TENSORS];
    int written[SDPA_MAX_TENSORS], read[SDPA_MAX_TENSORS];
    const char *what;
} Run;

static int64_t extent(const SdpaTensor *t) {
    int64_t e = 1;
    for (int k = 0; k < 4; k++) {
        if (t->dim[k] < 1) fail_msg("tensor uid %lld: dim %d is %lld", (long long)t->uid, k, (long long)t->dim[k]);
        e += (t->dim[k] - 1) * t->stride[k];
    }
    return e;
}

static int64_t numel(const SdpaTensor *t) { return t->dim[0] * t->dim[1] * t->dim[2] * t->dim[3]; }

static int64_t offset(const SdpaTensor *t, const int64_t i[4]) {
    return i[0] * t->stride[0] + i[1] * t->stride[1] + i[2] * t->stride[2] + i[3] * t->stride[3];
}

/* Step i through dims (row-major); 0 when it wraps. */
static int next_index(int64_t i[4], const int64_t dim[4]) {
    for (int k = 3; k >= 0; k--) {
        if (++i[k] < dim[k]) return 1;
        i[k] = 0;
    }
    return 0;
}

/* The index of `in` that output index i (of dims `out`) reads, in the
 * first n dims: equal dims, a dim of 1 (broadcast) or, with group, a
 * divisor (i / ratio). */
static void map_dims(Run *r, const SdpaTensor *in, const int64_t out[4], const int64_t i[4], int64_t j[4], int group,
                     int n) {
    for (int k = 0; k < n; k++) {
        if (in->dim[k] == out[k])
            j[k] = i[k];
        else if (in->dim[k] == 1)
            j[k] = 0;
        else if (group && out[k] % in->dim[k] == 0)
            j[k] = i[k] / (out[k] / in->dim[k]);
        else
            fail_msg("%s: uid %lld dim %d is %lld, against %lld", r->what, (long long)in->uid, k, (long long)in->dim[k],
                     (long long)out[k]);
    }
}

static void map_index(Run *r, const SdpaTensor *in, const int64_t out[4], const int64_t i[4], int64_t j[4], int group) {
    map_dims(r, in, out, i, j, group, 4);
}

static double rd(Run *r, int ti, const int64_t j[4]) {
    const SdpaTensor *t = &r->g->t[ti];
    if (!r->written[ti]) fail_msg("%s: uid %lld read before it is written", r->what, (long long)t->uid);
    r->read[ti] = 1;
    return as_dtype(t->dtype, r->mem[ti][offset(t, j)]);
}

static void wr_begin(Run *r, int ti) {
    if (r->written[ti]) fail_msg("%s: uid %lld written twice", r->what, (long long)r->g->t[ti].uid);
    r->written[ti] = 1;
}

static void run_matmul(Run *r, const SdpaOp *op) {
    const SdpaTensor *A = &r->g->t[op->x], *Bt = &r->g->t[op->b], *C = &r->g->t[op->y];
    int64_t K = A->dim[3];
    if (Bt->dim[2] != K || C->dim[2] != A->dim[2] || C->dim[3] != Bt->dim[3])
        fail_msg("%s: matmul uid %lld x uid %lld -> uid %lld: shapes do not fit", r->what, (long long)A->uid,
                 (long long)Bt->uid, (long long)C->uid);
    wr_begin(r, op->y);
    int64_t i[4] = {0}, ja[4], jb[4];
    do {
        map_dims(r, A, C->dim, i, ja, 1, 2); /* the batch dims */
        map_dims(r, Bt, C->dim, i, jb, 1, 2);
        double s = 0;
        for (int64_t k = 0; k < K; k++) {
            ja[2] = i[2], ja[3] = k, jb[2] = k, jb[3] = i[3];
            s += rd(r, op->x, ja) * rd(r, op->b, jb);
        }
        r->mem[op->y][offset(C, i)] = as_dtype(C->dtype, s);
    } while (next_index(i, C->dim));
}

static double pointwise_value(Run *r, const SdpaOp *op, const int64_t i[4]) {
    const SdpaTensor *Y = &r->g->t[op->y];
    int64_t j[4];
    double x = 0, b = 0, t = 0;
    map_index(r, &r->g->t[op->x], Y->dim, i, j, 0);
    if (op->mode == CUDNN_POINTWISE_GEN_INDEX) {
        r->read[op->x] = 1; /* the index generator only uses x's shape */
        if (op->axis < 0 || op->axis > 3) fail_msg("%s: GEN_INDEX axis %lld", r->what, (long long)op->axis);
        return (double)i[op->axis];
    }
    x = rd(r, op->x, j);
    if (op->b >= 0) map_index(r, &r->g->t[op->b], Y->dim, i, j, 0), b = rd(r, op->b, j);
    if (op->t >= 0) map_index(r, &r->g->t[op->t], Y->dim, i, j, 0), t = rd(r, op->t, j);
    switch (op->mode) {
    case CUDNN_POINTWISE_ADD: return x + b;
    case CUDNN_POINTWISE_SUB: return x - b;
    case CUDNN_POINTWISE_MUL: return x * b;
    case CUDNN_POINTWISE_DIV: return x / b;
    case CUDNN_POINTWISE_EXP: return exp(x);
    case CUDNN_POINTWISE_LOG: return log(x);
    case CUDNN_POINTWISE_IDENTITY: return x;
    case CUDNN_POINTWISE_CMP_GE: return x >= b;
    case CUDNN_POINTWISE_BINARY_SELECT: return t != 0 ? x : b;
    default: fail_msg("%s: pointwise mode %d is not interpreted", r->what, op->mode);
    }
    return 0;
}

static void run_pointwise(Run *r, const SdpaOp *op) {
    const SdpaTensor *Y = &r->g->t[op->y];
    int binary = op->mode != CUDNN_POINTWISE_EXP && op->mode != CUDNN_POINTWISE_LOG &&
                 op->mode != CUDNN_POINTWISE_IDENTITY && op->mode != CUDNN_POINTWISE_GEN_INDEX;
    if (binary != (op->b >= 0) || (op->mode == CUDNN_POINTWISE_BINARY_SELECT) != (op->t >= 0))
        fail_msg("%s: pointwise mode %d with the wrong operands", r->what, op->mode);
    wr_begin(r, op->y);
    int64_t i[4] = {0};
    do r->mem[op->y][offset(Y, i)] = as_dtype(Y->dtype, pointwise_value(r, op, i));
    while (next_index(i, Y->dim));
}

static void run_reduction(Run *r, const SdpaOp *op) {
    const SdpaTensor *X = &r->g->t[op->x], *Y = &r->g->t[op->y];
    int max = op->mode == CUDNN_REDUCE_TENSOR_MAX;
    if (!max && op->mode != CUDNN_REDUCE_TENSOR_ADD) fail_msg("%s: reduction mode %d", r->what, op->mode);
    int64_t ny = extent(Y);
    double *acc = malloc(sizeof(double) * (size_t)ny);
    if (!acc) fail_msg("out of memory");
    for (int64_t k = 0; k < ny; k++) acc[k] = max ? -INFINITY : 0;
    wr_begin(r, op->y);
    int64_t i[4] = {0}, j[4];
    do {
        map_index(r, Y, X->dim, i, j, 1);
        double v = rd(r, op->x, i), *a = &acc[offset(Y, j)];
        *a = max ? (v > *a ? v : *a) : *a + v;
    } while (next_index(i, X->dim));
    memset(i, 0, sizeof i);
    do r->mem[op->y][offset(Y, i)] = as_dtype(Y->dtype, acc[offset(Y, i)]);
    while (next_index(i, Y->dim));
    free(acc);
}

/* y views x's memory with its own dims and strides. */
static void run_reshape(Run *r, const SdpaOp *op) {
    const SdpaTensor *X = &r->g->t[op->x], *Y = &r->g->t[op->y];
    if (!r->written[op->x]) fail_msg("%s: reshape of uid %lld before it is written", r->what, (long long)X->uid);
    if (numel(X) != numel(Y) || extent(Y) > extent(X))
        fail_msg("%s: reshape uid %lld -> uid %lld changes the size", r->what, (long long)X->uid, (long long)Y->uid);
    if (!Y->is_virtual) fail_msg("%s: reshape into a non-virtual tensor", r->what);
    r->read[op->x] = 1;
    wr_begin(r, op->y);
    free(r->owned[op->y]);
    r->owned[op->y] = NULL;
    r->mem[op->y] = r->mem[op->x];
}

/* Bind io[uid] to the graph's caller tensors, allocate the rest (NaN
 * filled, so an element nobody wrote shows), run every operation in
 * order and check the graph's form. */
static void run_graph(const SdpaGraph *g, float *const io[UID_FIRST_VIRTUAL], const char *what) {
    Run r = {.g = g, .what = what};
    for (int i = 0; i < g->nt; i++) {
        const SdpaTensor *t = &g->t[i];
        for (int k = 0; k < i; k++)
            if (g->t[k].uid == t->uid) fail_msg("%s: uid %lld used twice", what, (long long)t->uid);
        if (t->is_virtual == (t->uid < UID_FIRST_VIRTUAL)) fail_msg("%s: uid %lld: virtual?", what, (long long)t->uid);
        if (!t->is_virtual && !t->by_value && !t->workspace) {
            if (!io[t->uid]) fail_msg("%s: caller tensor uid %lld is not bound", what, (long long)t->uid);
            r.mem[i] = io[t->uid];
            continue;
        }
        int64_t n = extent(t);
        r.mem[i] = r.owned[i] = malloc(sizeof(float) * (size_t)n);
        if (!r.mem[i]) fail_msg("out of memory");
        for (int64_t k = 0; k < n; k++) r.mem[i][k] = NAN;
        if (t->by_value) r.mem[i][0] = t->value;
    }
    /* inputs are written (by the caller) before the graph runs */
    for (int i = 0; i < g->nt; i++) r.written[i] = !g->t[i].is_virtual && !g->t[i].workspace;
    for (int k = 0; k < g->nop; k++) {
        const SdpaOp *op = &g->op[k];
        if (!g->t[op->y].is_virtual && !g->t[op->y].workspace) r.written[op->y] = 0; /* an output of the graph */
    }
    for (int k = 0; k < g->nop; k++) {
        const SdpaOp *op = &g->op[k];
        switch (op->kind) {
        case SOP_MATMUL: run_matmul(&r, op); break;
        case SOP_POINTWISE: run_pointwise(&r, op); break;
        case SOP_REDUCTION: run_reduction(&r, op); break;
        case SOP_RESHAPE: run_reshape(&r, op); break;
        }
    }
    for (int i = 0; i < g->nt; i++) {
        if (!r.written[i]) fail_msg("%s: uid %lld is never written", what, (long long)g->t[i].uid);
        if (g->t[i].is_virtual && !r.read[i]) fail_msg("%s: virtual uid %lld is never read", what, (long long)g->t[i].uid);
        free(r.owned[i]);
    }
}

/* ---- the reference ---- */

typedef struct {
    int64_t B, H, KH, T, D;
    int causal;
} Case;

static int64_t qi(const Case *c, int64_t b, int64_t h, int64_t t) { return ((b * c->H + h) * c->T + t) * c->D; }
static int64_t ki(const Case *c, int64_t b, int64_t h, int64_t s) {
    return ((b * c->KH + h / (c->H / c->KH)) * c->T + s) * c->D;
}

static double dot(const float *x, const float *y, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)x[i] * y[i];
    return s;
}

static void ref_fwd(const Case *c, double scale, const float *q, const float *k, const float *v, double *o,
                    double *lse) {
    double *p = malloc(sizeof(double) * (size_t)c->T);
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t h = 0; h < c->H; h++)
            for (int64_t t = 0; t < c->T; t++) {
                int64_t ns = c->causal ? t + 1 : c->T;
                double m = -INFINITY, l = 0;
                for (int64_t s = 0; s < ns; s++) {
                    p[s] = scale * dot(q + qi(c, b, h, t), k + ki(c, b, h, s), c->D);
                    if (p[s] > m) m = p[s];
                }
                for (int64_t s = 0; s < ns; s++) l += p[s] = exp(p[s] - m);
                lse[(b * c->H + h) * c->T + t] = m + log(l);
                for (int64_t d = 0; d < c->D; d++) {
                    double acc = 0;
                    for (int64_t s = 0; s < ns; s++) acc += p[s] * v[ki(c, b, h, s) + d];
                    o[qi(c, b, h, t) + d] = acc / l;
                }
            }
    free(p);
}

/* FlashAttention's backward from the given o and lse: P = e^(scale q.k -
 * lse), Dt = do.o, dS = P (do.v - Dt) scale. */
static void ref_bwd(const Case *c, double scale, const float *q, const float *k, const float *v, const float *o,
                    const float *lse, const float *dout, double *dq, double *dk, double *dv) {
    memset(dq, 0, sizeof(double) * (size_t)(c->B * c->H * c->T * c->D));
    memset(dk, 0, sizeof(double) * (size_t)(c->B * c->KH * c->T * c->D));
    memset(dv, 0, sizeof(double) * (size_t)(c->B * c->KH * c->T * c->D));
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t h = 0; h < c->H; h++)
            for (int64_t t = 0; t < c->T; t++) {
                const float *qt = q + qi(c, b, h, t), *dot_ = dout + qi(c, b, h, t);
                double L = lse[(b * c->H + h) * c->T + t], Dt = dot(dot_, o + qi(c, b, h, t), c->D);
                for (int64_t s = 0; s < (c->causal ? t + 1 : c->T); s++) {
                    const float *ks = k + ki(c, b, h, s), *vs = v + ki(c, b, h, s);
                    double p = exp(scale * dot(qt, ks, c->D) - L), ds = p * (dot(dot_, vs, c->D) - Dt) * scale;
                    for (int64_t d = 0; d < c->D; d++) {
                        dq[qi(c, b, h, t) + d] += ds * ks[d];
                        dk[ki(c, b, h, s) + d] += ds * qt[d];
                        dv[ki(c, b, h, s) + d] += p * dot_[d];
                    }
                }
            }
}

static void check(const char *what, const float *got, const double *want, int64_t n, double tol) {
    double worst = 0, big = 0;
    int64_t at = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs(got[i] - want[i]);
        if (!(e <= worst)) worst = e, at = i; /* NaN counts as worst */
        if (fabs(want[i]) > big) big = fabs(want[i]);
    }
    double rel = worst / (big > 0 ? big : 1);
    if (getenv("KILN_TEST_VERBOSE")) fprintf(stderr, "  %-40s rel err %.3g\n", what, rel);
    if (!(rel <= tol))
        fail_msg("%s: relative error %g > %g (at [%lld]: got %.9g want %.9g)", what, rel, tol, (long long)at, got[at],
                 want[at]);
}

/* ---- the cases ---- */

static void sdpa_case(int64_t B, int64_t H, int64_t KH, int64_t T, int64_t D, int causal) {
    Case c = {B, H, KH, T, D, causal};
    double scale = 1 / sqrt((double)D);
    SdpaShape s = {.B = B, .H = H, .KH = KH, .T = T, .S = T, .D = D, .causal = causal, .scale = scale};
    const char *why = sdpa_unsupported(&s, 0, 1);
    if (why) fail_msg("B%lld H%lld KH%lld T%lld D%lld: unsupported: %s", (long long)B, (long long)H, (long long)KH,
                      (long long)T, (long long)D, why);
    int64_t nq = B * H * T * D, nk = B * KH * T * D, nl = B * H * T;
    float *q = rnd_bf16(nq, 11, 2), *k = rnd_bf16(nk, 12, 2), *v = rnd_bf16(nk, 13, 1), *dout = rnd_bf16(nq, 14, 1);
    float *o = zeros(nq), *lse = zeros(nl), *dq = zeros(nq), *dk = zeros(nk), *dv = zeros(nk);
    double *ro = malloc(sizeof(double) * (size_t)nq), *rl = malloc(sizeof(double) * (size_t)nl);
    double *rdq = malloc(sizeof(double) * (size_t)nq), *rdk = malloc(sizeof(double) * (size_t)nk);
    double *rdv = malloc(sizeof(double) * (size_t)nk);
    char what[160];
    snprintf(what, sizeof what, "B%lld H%lld KH%lld T%lld D%lld%s", (long long)B, (long long)H, (long long)KH,
             (long long)T, (long long)D, causal ? " causal" : "");

    SdpaGraph *g = malloc(sizeof *g);
    if (!g || !ro || !rl || !rdq || !rdk || !rdv) fail_msg("out of memory");
    if (sdpa_describe_fwd(g, &s)) fail_msg("%s: forward graph overflow", what);
    float *io[UID_FIRST_VIRTUAL] = {0};
    io[UID_Q] = q, io[UID_K] = k, io[UID_V] = v, io[UID_O] = o, io[UID_STATS] = lse;
    run_graph(g, io, what);
    ref_fwd(&c, scale, q, k, v, ro, rl);
    char name[200];
    snprintf(name, sizeof name, "%s o", what), check(name, o, ro, nq, 1e-2);
    snprintf(name, sizeof name, "%s lse", what), check(name, lse, rl, nl, 1e-5);

    for (int det = 0; det < 2; det++) {
        s.deterministic = det;
        if (sdpa_describe_bwd(g, &s)) fail_msg("%s: backward graph overflow", what);
        memset(io, 0, sizeof io);
        io[UID_DO] = dout, io[UID_Q] = q, io[UID_K] = k, io[UID_V] = v, io[UID_O] = o, io[UID_STATS] = lse;
        io[UID_DQ] = dq, io[UID_DK] = dk, io[UID_DV] = dv;
        run_graph(g, io, what);
        ref_bwd(&c, scale, q, k, v, o, lse, dout, rdq, rdk, rdv);
        const char *tag = det ? " deterministic" : "";
        snprintf(name, sizeof name, "%s%s dq", what, tag), check(name, dq, rdq, nq, 2e-2);
        snprintf(name, sizeof name, "%s%s dk", what, tag), check(name, dk, rdk, nk, 2e-2);
        snprintf(name, sizeof name, "%s%s dv", what, tag), check(name, dv, rdv, nk, 2e-2);
    }
    free(g), free(q), free(k), free(v), free(dout), free(o), free(lse), free(dq), free(dk), free(dv);
    free(ro), free(rl), free(rdq), free(rdk), free(rdv);
}

static void test_sdpa_graphs(void **st) {
    (void)st;
    sdpa_case(2, 4, 2, 37, 16, 1); /* GQA, causal, T not a multiple of anything */
    sdpa_case(2, 4, 2, 37, 16, 0); /* GQA, not causal */
    sdpa_case(1, 3, 3, 20, 8, 1);  /* MHA, the smallest head dim */
    sdpa_case(1, 4, 1, 9, 24, 1);  /* all heads on one kv head */
    sdpa_case(1, 2, 2, 1, 8, 1);   /* one token */
}

/* The forward's caller tensors are exactly what rtk_attention_cudnn binds;
 * the causal mask is there only when asked for; the deterministic backward
 * has no dQ accumulator. */
static int has_uid(const SdpaGraph *g, int64_t uid) {
    for (int i = 0; i < g->nt; i++)
        if (g->t[i].uid == uid) return 1;
    return 0;
}

static int count_mode(const SdpaGraph *g, int mode) {
    int n = 0;
    for (int i = 0; i < g->nop; i++) n += g->op[i].kind == SOP_POINTWISE && g->op[i].mode == mode;
    return n;
}

static void test_graph_form(void **st) {
    (void)st;
    SdpaGraph *g = malloc(sizeof *g);
    if (!g) fail_msg("out of memory");
    SdpaShape s = {.B = 1, .H = 2, .KH = 1, .T = 4, .S = 4, .D = 8, .causal = 1, .scale = 0.5};
    assert_int_equal(sdpa_describe_fwd(g, &s), 0);
    assert_int_equal(count_mode(g, CUDNN_POINTWISE_BINARY_SELECT), 1);
    assert_int_equal(count_mode(g, CUDNN_POINTWISE_GEN_INDEX), 2);
    assert_true(has_uid(g, UID_NEG_INF));
    s.causal = 0;
    assert_int_equal(sdpa_describe_fwd(g, &s), 0);
    assert_int_equal(count_mode(g, CUDNN_POINTWISE_BINARY_SELECT), 0);
    assert_false(has_uid(g, UID_NEG_INF));
    assert_int_equal(sdpa_describe_bwd(g, &s), 0);
    assert_true(has_uid(g, UID_DQ_ACCUM) && has_uid(g, UID_SOFTMAX_SUM));
    s.deterministic = 1;
    assert_int_equal(sdpa_describe_bwd(g, &s), 0);
    assert_false(has_uid(g, UID_DQ_ACCUM));
    free(g);
}

/* The qualification rule (docs/cudnn.md). */
static void test_qualification(void **st) {
    (void)st;
    const SdpaShape ok = {.B = 2, .H = 8, .KH = 2, .T = 64, .S = 64, .D = 64, .causal = 1, .scale = 0.125};
    SdpaShape s = ok;
    assert_null(sdpa_unsupported(&s, 0, 1));
    assert_non_null(sdpa_unsupported(&s, 1, 1)); /* positions */
    assert_non_null(sdpa_unsupported(&s, 0, 0)); /* no lse */
    s.S = 32, assert_non_null(sdpa_unsupported(&s, 0, 1)), s = ok;
    s.D = 136, assert_non_null(sdpa_unsupported(&s, 0, 1)), s = ok;
    s.D = 12, assert_non_null(sdpa_unsupported(&s, 0, 1)), s = ok;
    s.D = 0, assert_non_null(sdpa_unsupported(&s, 0, 1)), s = ok;
    s.D = 128, assert_null(sdpa_unsupported(&s, 0, 1)), s = ok;
    s.D = 8, assert_null(sdpa_unsupported(&s, 0, 1)), s = ok;
    s.KH = 3, assert_non_null(sdpa_unsupported(&s, 0, 1)), s = ok;
    s.T = s.S = 0, assert_non_null(sdpa_unsupported(&s, 0, 1)), s = ok;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sdpa_graphs),
        cmocka_unit_test(test_graph_form),
        cmocka_unit_test(test_qualification),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
