/* attn_cudnn.c — attention on cuDNN's fused SDPA (scaled dot product
 * attention) engines, through the cuDNN 9 backend API from C: the kernels
 * rtk_attention_cudnn and rtk_attention_bwd_cudnn, with exactly the args
 * of rtk_attention and rtk_attention_bwd (kiln_rt.h).  The emitter
 * launches them instead of kiln's own flash attention when the user asks
 * for `--attention cudnn` and the node qualifies (docs/cudnn.md).
 *
 * Why graphs.  cuDNN 9.13+ has single-node SDPA operations, but a causal
 * mask on them needs 9.21's subgraph attribute, which the 9.19 headers
 * here lack.  What every 9.x has is the graph API: the caller describes
 * the computation as tensors and operations (matmul, pointwise,
 * reduction, reshape), cuDNN's heuristics match the graph against its
 * engines, and an execution plan runs it.  The SDPA engines recognise one pattern, the one NVIDIA's C++
 * frontend (cudnn-frontend, the "composite" SDPA nodes used below cuDNN
 * 9.21) builds, so this file builds that same pattern node for node:
 *
 *   forward:   S = (Q K^T) * scale
 *              S = select(row >= col, S, -inf)       causal only
 *              M = max_s S;  E = exp(S - M);  Z = sum_s E
 *              Stats = M + log Z                     (the lse output)
 *              O = (E / Z as bf16) V
 *   backward:  Dt = sum_d dO * O  (* 1)              (a workspace tensor)
 *              P = exp(select(row >= col, Q K^T * scale - Stats, -inf))
 *              dV = sum over the group (reshape(P)^T dO)
 *              dS = P * (dO V^T - Dt) * scale
 *              dK = sum over the group (reshape(dS)^T Q)
 *              dQ = dS K  (into an f32 workspace tensor, then to bf16)
 *
 * K (and V in the backward) are described transposed, [B,KH,D,S] with the
 * strides of kiln's [B,KH,S,D] memory; a "reshape" of a virtual tensor
 * with swapped strides is a transpose.  GQA (KH < H) is the matmul's
 * broadcast over heads (head h reads kv head h / (H/KH), kiln's rule) and,
 * backward, a reduction of the per-query-head dK, dV over each group.
 *
 * The lse.  cuDNN's Stats is max + log(sum exp(s - max)) over the scaled,
 * masked scores s: the natural-log log-sum-exp, f32 [B,H,T,1].  kiln's lse
 * is the same quantity, f32 [B,H,T] (kernels/cpu/attention.c: lse = m +
 * log l), so Stats is written straight into lse and the backward reads it
 * back: no conversion, and kiln's and cuDNN's forward and backward mix.
 *
 * The graphs are data first.  sdpa_describe_fwd/bwd fill an SdpaGraph
 * (tensors with uid, dtype, dims, strides; operations with their mode and
 * operand indices) without calling cuDNN, so tests/test_cudnn_graph.c can
 * include this file with KILN_CUDNN_DESCRIBE_ONLY defined and run the very
 * graphs through a small CPU interpreter against a reference attention.
 * The rest of the file turns a description into backend descriptors.
 *
 * Plans.  Building one (descriptors, heuristics mode A, finalizing engine
 * configs until one takes) costs milliseconds to seconds, so each
 * (context, stream, direction, shape, causal, scale, deterministic) gets
 * one plan on its first launch, kept in a static table until
 * rtc_cudnn_free(ctx).  The plan owns its workspace, one cuMemAlloc of
 * cuDNN's workspace size plus the graph's workspace tensors (backward: Dt,
 * B*H*T*4 bytes, and the dQ accumulator, B*H*T*D*4), 256-byte aligned.
 * The stream is part of the key because two streams may run attention of
 * one shape at the same time and must not share a workspace.  The first
 * launch happens in step 1, which dev_cuda.c runs eagerly, outside any
 * capture: cuMemAlloc (and whatever cuDNN allocates or loads while it makes
 * a handle or finalizes a plan) would be refused while a stream captures.
 * Step 2 is captured; its cudnnBackendExecute finds the plan and replays with the same
 * pointers; the by-value scalars (scale, -inf, 1) live in the plan.
 *
 * Each launch builds a variant pack (uids -> device pointers, by-value
 * scalars, workspace), sets the context's cuDNN handle (one per rt_ctx,
 * made on first use) to rtc_stream(ctx) and calls cudnnBackendExecute.
 *
 * Determinism.  By default the backward is cuDNN's fast one, which adds
 * dQ up with atomics: not bitwise reproducible.  KILN_CUDNN_DETERMINISTIC=1
 * (read when a plan is built) builds the backward as the frontend does for
 * a deterministic request on Hopper below cuDNN 9.25: dQ = dS K straight
 * into dQ, without the accumulator, which selects cuDNN's dP-workspace
 * algorithm (workspace about B*H*T*S*2 bytes).  Unverified on Blackwell.
 *
 * Errors.  Every cuDNN and driver return code is checked; a failure calls
 * rt_fail(ctx, "attention (cudnn): <call>: <error string>: at <launch>")
 * plus cuDNN's last error message when it has one, and the launch returns
 * without enqueuing.  A plan that failed to build is not kept, so the next
 * step tries again (and fails the same way).  Args that do not qualify
 * (positions, a sliding window, T != S, D not a multiple of 8 or above
 * 128, H not a multiple of KH, no lse) fail too: the emitter must not
 * launch them here.
 *
 * Sliding windows stay on kiln's kernel.  cuDNN 9.x can mask a window
 * (the frontend's SDPA "diagonal band" adds pointwise ops on the row and
 * column indices to the pattern), but the engines accept only the exact
 * node sequence the frontend builds, which nothing here could check
 * without a GPU; kiln's kernel masks the window by global position, which
 * context parallel needs anyway.
 *
 * cuDNN 9.16 or newer is required at run time (checked once per handle):
 * older releases need workarounds the frontend applies and this file does
 * not (dQ accumulator memset below 9.6, a padding mask for S % 128 != 0 in
 * the backward up to 9.15, -lowest instead of -inf below 9.10).
 *
 * Unverified on hardware: nothing here has run on a GPU until
 * bench/gpu/check.sh runs the cuDNN path against kiln's kernels.
 *
 * Exported beyond kiln_rt.h (to be declared by the lead):
 *     void rtk_attention_cudnn(rt_ctx *ctx, const int64_t *a);
 *     void rtk_attention_bwd_cudnn(rt_ctx *ctx, const int64_t *a);
 *     // rt_cuda.h: drop ctx's plans, workspaces and cuDNN handle;
 *     // dev_cuda.c's rt_free calls it once, with the context current.
 *     void rtc_cudnn_free(rt_ctx *ctx);
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include <cudnn_graph.h>

/* ---- the graphs, as data (no cuDNN calls) ---- */

enum { SDPA_FWD = 0, SDPA_BWD = 1 };

/* One attention launch's shape and attributes: the plan cache's key. */
typedef struct {
    int64_t B, H, KH, T, S, D;
    int causal;
    int deterministic; /* backward: no dQ accumulator (see the essay) */
    double scale;
} SdpaShape;

/* The unique ids of the tensors the caller binds; virtual tensors count
 * up from UID_FIRST_VIRTUAL. */
enum {
    UID_Q = 1,
    UID_K,
    UID_V,
    UID_O,
    UID_STATS,
    UID_DO,
    UID_DQ,
    UID_DK,
    UID_DV,
    UID_SCALE,       /* by value: the attention scale */
    UID_NEG_INF,     /* by value: -inf, the masked score */
    UID_ONE,         /* by value: 1 (the frontend's dropout-free scale of Dt) */
    UID_SOFTMAX_SUM, /* workspace: Dt = rowsum(dO * O), f32 [B,H,T,1] */
    UID_DQ_ACCUM,    /* workspace: dQ in f32 [B,H,T,D] */
    UID_FIRST_VIRTUAL = 100
};

typedef struct {
    int64_t uid;
    cudnnDataType_t dtype;
    int64_t dim[4], stride[4];
    bool is_virtual, by_value;
    int workspace; /* non-virtual, but kiln's to allocate (in the plan's workspace) */
    float value;   /* by_value: the scalar */
} SdpaTensor;

typedef enum { SOP_MATMUL, SOP_POINTWISE, SOP_REDUCTION, SOP_RESHAPE } SdpaOpKind;

/* x, b, t, y index SdpaGraph.t (-1: none).  Matmul: C(y) = A(x) B(b);
 * pointwise: y = mode(x, b, t) (t: BINARY_SELECT's condition); reduction:
 * y = mode over the dims where y is smaller than x; reshape: y views x. */
typedef struct {
    SdpaOpKind kind;
    int mode; /* cudnnPointwiseMode_t or cudnnReduceTensorOp_t */
    cudnnDataType_t math;
    int64_t axis; /* GEN_INDEX's axis, else -1 */
    int x, b, t, y;
} SdpaOp;

#define SDPA_MAX_TENSORS 64
#define SDPA_MAX_OPS 48

typedef struct {
    SdpaTensor t[SDPA_MAX_TENSORS];
    int nt;
    SdpaOp op[SDPA_MAX_OPS];
    int nop;
    int64_t next_uid;
    int overflow;
} SdpaGraph;

#define V4(a, b, c, d) ((const int64_t[4]){(a), (b), (c), (d)})

static void sg_packed(const int64_t dim[4], int64_t stride[4]) {
    stride[3] = 1;
    for (int i = 2; i >= 0; i--) stride[i] = stride[i + 1] * dim[i + 1];
}

static int sg_add(SdpaGraph *g, int64_t uid, cudnnDataType_t dt, const int64_t dim[4], const int64_t *stride,
                  bool is_virtual) {
    if (g->nt == SDPA_MAX_TENSORS) {
        g->overflow = 1;
        return 0;
    }
    SdpaTensor *t = &g->t[g->nt];
    memset(t, 0, sizeof *t);
    t->uid = uid;
    t->dtype = dt;
    memcpy(t->dim, dim, sizeof t->dim);
    if (stride)
        memcpy(t->stride, stride, sizeof t->stride);
    else
        sg_packed(t->dim, t->stride);
    t->is_virtual = is_virtual;
    return g->nt++;
}

/* A tensor the caller binds (uid fixed). */
static int sg_io(SdpaGraph *g, int64_t uid, cudnnDataType_t dt, const int64_t dim[4], const int64_t stride[4]) {
    return sg_add(g, uid, dt, dim, stride, false);
}

/* A non-virtual tensor in the plan's workspace, packed. */
static int sg_workspace(SdpaGraph *g, int64_t uid, const int64_t dim[4]) {
    int i = sg_add(g, uid, CUDNN_DATA_FLOAT, dim, NULL, false);
    g->t[i].workspace = 1;
    return i;
}

static int sg_virtual_strided(SdpaGraph *g, cudnnDataType_t dt, const int64_t dim[4], const int64_t *stride) {
    return sg_add(g, g->next_uid++, dt, dim, stride, true);
}

static int sg_virtual(SdpaGraph *g, cudnnDataType_t dt, const int64_t dim[4]) {
    return sg_virtual_strided(g, dt, dim, NULL);
}

/* An f32 scalar passed by value, [1,1,1,1]. */
static int sg_scalar(SdpaGraph *g, int64_t uid, float value) {
    int i = sg_add(g, uid, CUDNN_DATA_FLOAT, V4(1, 1, 1, 1), NULL, false);
    g->t[i].by_value = true;
    g->t[i].value = value;
    return i;
}

static void sg_op(SdpaGraph *g, SdpaOpKind kind, int mode, cudnnDataType_t math, int64_t axis, int x, int b, int t,
                  int y) {
    if (g->nop == SDPA_MAX_OPS) {
        g->overflow = 1;
        return;
    }
    g->op[g->nop++] = (SdpaOp){.kind = kind, .mode = mode, .math = math, .axis = axis, .x = x, .b = b, .t = t, .y = y};
}

static void sg_matmul(SdpaGraph *g, int a, int b, int c) { sg_op(g, SOP_MATMUL, 0, CUDNN_DATA_FLOAT, -1, a, b, -1, c); }

static void sg_reduce(SdpaGraph *g, cudnnReduceTensorOp_t mode, int x, int y) {
    sg_op(g, SOP_REDUCTION, mode, CUDNN_DATA_FLOAT, -1, x, -1, -1, y);
}

static void sg_reshape(SdpaGraph *g, int x, int y) { sg_op(g, SOP_RESHAPE, 0, CUDNN_DATA_FLOAT, -1, x, -1, -1, y); }

static void sg_pointwise_to(SdpaGraph *g, cudnnPointwiseMode_t mode, int x, int b, int y) {
    sg_op(g, SOP_POINTWISE, mode, CUDNN_DATA_FLOAT, -1, x, b, -1, y);
}

/* y = mode(x), a new f32 virtual tensor of x's dims. */
static int sg_unary(SdpaGraph *g, cudnnPointwiseMode_t mode, int x) {
    int64_t dim[4];
    memcpy(dim, g->t[x].dim, sizeof dim);
    int y = sg_virtual(g, CUDNN_DATA_FLOAT, dim);
    sg_pointwise_to(g, mode, x, -1, y);
    return y;
}

/* y = mode(x, b) broadcast, a new f32 virtual tensor. */
static int sg_binary(SdpaGraph *g, cudnnPointwiseMode_t mode, int x, int b) {
    int64_t dim[4];
    for (int i = 0; i < 4; i++) dim[i] = g->t[x].dim[i] > g->t[b].dim[i] ? g->t[x].dim[i] : g->t[b].dim[i];
    int y = sg_virtual(g, CUDNN_DATA_FLOAT, dim);
    sg_pointwise_to(g, mode, x, b, y);
    return y;
}

/* Kiln's causal rule on index positions, key s visible to query t iff
 * s <= t, as the frontend's top-left causal mask: row index (axis 2) >=
 * column index (axis 3) keeps the score, else -inf. */
static int sg_causal_mask(SdpaGraph *g, int x) {
    int64_t dim[4];
    memcpy(dim, g->t[x].dim, sizeof dim);
    int row = sg_virtual(g, CUDNN_DATA_INT32, dim), col = sg_virtual(g, CUDNN_DATA_INT32, dim);
    sg_op(g, SOP_POINTWISE, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, 2, x, -1, -1, row);
    sg_op(g, SOP_POINTWISE, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, 3, x, -1, -1, col);
    int keep = sg_virtual(g, CUDNN_DATA_BOOLEAN, dim);
    sg_op(g, SOP_POINTWISE, CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, -1, row, col, -1, keep);
    int neg = sg_scalar(g, UID_NEG_INF, -INFINITY);
    int y = sg_virtual(g, CUDNN_DATA_FLOAT, dim);
    sg_op(g, SOP_POINTWISE, CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, -1, x, neg, keep, y);
    return y;
}

/* out [B,KH,S,D] = a [B,H,S,T] x b [B,H,T,D], summed over each group of
 * H/KH query heads (a bf16 [B,H,S,D] product first when KH < H). */
static void sg_group_matmul(SdpaGraph *g, int a, int b, int out, int64_t B, int64_t H, int64_t KH, int64_t S,
                            int64_t D) {
    if (H == KH) {
        sg_matmul(g, a, b, out);
        return;
    }
    int full = sg_virtual(g, CUDNN_DATA_BFLOAT16, V4(B, H, S, D));
    sg_matmul(g, a, b, full);
    sg_reduce(g, CUDNN_REDUCE_TENSOR_ADD, full, out);
}

static void sg_begin(SdpaGraph *g) {
    memset(g, 0, sizeof *g);
    g->next_uid = UID_FIRST_VIRTUAL;
}

/* The forward graph: q, k, v -> o, Stats (= kiln's lse). */
static int sdpa_describe_fwd(SdpaGraph *g, const SdpaShape *s) {
    const int64_t B = s->B, H = s->H, KH = s->KH, T = s->T, S = s->S, D = s->D;
    sg_begin(g);
    int q = sg_io(g, UID_Q, CUDNN_DATA_BFLOAT16, V4(B, H, T, D), V4(H * T * D, T * D, D, 1));
    int kt = sg_io(g, UID_K, CUDNN_DATA_BFLOAT16, V4(B, KH, D, S), V4(KH * S * D, S * D, 1, D));
    int v = sg_io(g, UID_V, CUDNN_DATA_BFLOAT16, V4(B, KH, S, D), V4(KH * S * D, S * D, D, 1));
    int o = sg_io(g, UID_O, CUDNN_DATA_BFLOAT16, V4(B, H, T, D), V4(H * T * D, T * D, D, 1));
    int stats = sg_io(g, UID_STATS, CUDNN_DATA_FLOAT, V4(B, H, T, 1), V4(H * T, T, 1, 1));
    int scale = sg_scalar(g, UID_SCALE, (float)s->scale);

    int sc = sg_virtual(g, CUDNN_DATA_FLOAT, V4(B, H, T, S));
    sg_matmul(g, q, kt, sc);
    sc = sg_binary(g, CUDNN_POINTWISE_MUL, sc, scale);
    if (s->causal) sc = sg_causal_mask(g, sc);

    int mx = sg_virtual(g, CUDNN_DATA_FLOAT, V4(B, H, T, 1));
    sg_reduce(g, CUDNN_REDUCE_TENSOR_MAX, sc, mx);
    int centered = sg_binary(g, CUDNN_POINTWISE_SUB, sc, mx);
    int e = sg_unary(g, CUDNN_POINTWISE_EXP, centered);
    int z = sg_virtual(g, CUDNN_DATA_FLOAT, V4(B, H, T, 1));
    sg_reduce(g, CUDNN_REDUCE_TENSOR_ADD, e, z);
    int logz = sg_unary(g, CUDNN_POINTWISE_LOG, z);
    sg_pointwise_to(g, CUDNN_POINTWISE_ADD, mx, logz, stats);
    int p = sg_virtual(g, CUDNN_DATA_BFLOAT16, V4(B, H, T, S));
    sg_pointwise_to(g, CUDNN_POINTWISE_DIV, e, z, p);
    sg_matmul(g, p, v, o);
    return g->overflow ? -1 : 0;
}

/* The backward graph: do, q, k, v, o, Stats -> dq, dk, dv. */
static int sdpa_describe_bwd(SdpaGraph *g, const SdpaShape *s) {
    const int64_t B = s->B, H = s->H, KH = s->KH, T = s->T, S = s->S, D = s->D;
    const int64_t qstride[4] = {H * T * D, T * D, D, 1}, kstride[4] = {KH * S * D, S * D, D, 1};
    const int64_t ktstride[4] = {KH * S * D, S * D, 1, D}, tstride[4] = {H * T * S, T * S, 1, S};
    sg_begin(g);
    int q = sg_io(g, UID_Q, CUDNN_DATA_BFLOAT16, V4(B, H, T, D), qstride);
    int kt = sg_io(g, UID_K, CUDNN_DATA_BFLOAT16, V4(B, KH, D, S), ktstride);
    int vt = sg_io(g, UID_V, CUDNN_DATA_BFLOAT16, V4(B, KH, D, S), ktstride);
    int o = sg_io(g, UID_O, CUDNN_DATA_BFLOAT16, V4(B, H, T, D), qstride);
    int dout = sg_io(g, UID_DO, CUDNN_DATA_BFLOAT16, V4(B, H, T, D), qstride);
    int stats = sg_io(g, UID_STATS, CUDNN_DATA_FLOAT, V4(B, H, T, 1), V4(H * T, T, 1, 1));
    int dq = sg_io(g, UID_DQ, CUDNN_DATA_BFLOAT16, V4(B, H, T, D), qstride);
    int dk = sg_io(g, UID_DK, CUDNN_DATA_BFLOAT16, V4(B, KH, S, D), kstride);
    int dv = sg_io(g, UID_DV, CUDNN_DATA_BFLOAT16, V4(B, KH, S, D), kstride);
    int scale = sg_scalar(g, UID_SCALE, (float)s->scale), one = sg_scalar(g, UID_ONE, 1.0f);

    /* Dt = rowsum(dO * O) */
    int dto = sg_binary(g, CUDNN_POINTWISE_MUL, dout, o);
    int dtsum = sg_virtual(g, CUDNN_DATA_FLOAT, V4(B, H, T, 1));
    sg_reduce(g, CUDNN_REDUCE_TENSOR_ADD, dto, dtsum);
    int dt = sg_workspace(g, UID_SOFTMAX_SUM, V4(B, H, T, 1));
    sg_pointwise_to(g, CUDNN_POINTWISE_MUL, dtsum, one, dt);

    /* P = exp(scale Q K^T - lse), masked */
    int sc = sg_virtual(g, CUDNN_DATA_FLOAT, V4(B, H, T, S));
    sg_matmul(g, q, kt, sc);
    sc = sg_binary(g, CUDNN_POINTWISE_MUL, sc, scale);
    sc = sg_binary(g, CUDNN_POINTWISE_SUB, sc, stats);
    if (s->causal) sc = sg_causal_mask(g, sc);
    int p = sg_unary(g, CUDNN_POINTWISE_EXP, sc);

    /* dV = P^T dO */
    int pt = sg_virtual_strided(g, CUDNN_DATA_BFLOAT16, V4(B, H, S, T), tstride);
    sg_reshape(g, p, pt);
    sg_group_matmul(g, pt, dout, dv, B, H, KH, S, D);

    /* dS = P (dO V^T - Dt) scale */
    int dp = sg_virtual(g, CUDNN_DATA_FLOAT, V4(B, H, T, S));
    sg_matmul(g, dout, vt, dp);
    int ds = sg_binary(g, CUDNN_POINTWISE_SUB, dp, dt);
    ds = sg_binary(g, CUDNN_POINTWISE_MUL, ds, p);
    ds = sg_binary(g, CUDNN_POINTWISE_MUL, ds, scale);

    /* dK = dS^T Q */
    int dst = sg_virtual_strided(g, CUDNN_DATA_BFLOAT16, V4(B, H, S, T), tstride);
    sg_reshape(g, ds, dst);
    sg_group_matmul(g, dst, q, dk, B, H, KH, S, D);

    /* dQ = dS K (K viewed back as [B,KH,S,D]) */
    int k = sg_virtual_strided(g, CUDNN_DATA_BFLOAT16, V4(B, KH, S, D), kstride); /* a reshape keeps the bound K^T's type */
    sg_reshape(g, kt, k);
    if (s->deterministic) {
        sg_matmul(g, ds, k, dq);
    } else {
        int acc = sg_workspace(g, UID_DQ_ACCUM, V4(B, H, T, D));
        sg_matmul(g, ds, k, acc);
        sg_pointwise_to(g, CUDNN_POINTWISE_IDENTITY, acc, -1, dq);
    }
    return g->overflow ? -1 : 0;
}

/* The qualification rule, as the launchers check it (docs/cudnn.md): NULL
 * when s (with or without positions, with or without an lse) can run on
 * this path, else why not. */
static const char *sdpa_unsupported(const SdpaShape *s, int has_positions, int has_lse) {
    if (has_positions) return "query/key positions (context parallel) are not supported";
    if (!has_lse) return "no lse tensor";
    if (s->B < 1 || s->H < 1 || s->KH < 1 || s->T < 1) return "an empty dim";
    if (s->T != s->S) return "T != S";
    if (s->H % s->KH) return "H is not a multiple of KH";
    if (s->D < 8 || s->D > 128 || s->D % 8) return "the head dim is not a multiple of 8 in [8, 128]";
    return NULL;
}

#ifndef KILN_CUDNN_DESCRIBE_ONLY
/* ---- the graphs on cuDNN ---- */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "rt_cuda.h"

void rtk_attention_cudnn(rt_ctx *ctx, const int64_t *a);
void rtk_attention_bwd_cudnn(rt_ctx *ctx, const int64_t *a);
void rtc_cudnn_free(rt_ctx *ctx);

#define MIN_CUDNN_VERSION 91600
#define WS_ALIGN 256

typedef struct {
    rt_ctx *ctx;
    CUstream stream;
    int dir;
    SdpaShape shape;
    SdpaGraph graph; /* keeps the by-value scalars alive for the plan */
    cudnnBackendDescriptor_t plan;
    cudnnBackendDescriptor_t *owned; /* every descriptor made for the plan, in order */
    int nowned, capowned;
    CUdeviceptr workspace;           /* 0 when the plan needs none */
    int64_t offset[SDPA_MAX_TENSORS]; /* workspace tensors' byte offsets */
} Plan;

typedef struct {
    rt_ctx *ctx;
    cudnnHandle_t handle;
} Handle;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static Plan **plans;
static int nplans, capplans;
static Handle *handles;
static int nhandles, caphandles;

/* ---- errors ---- */

/* rt_fail for a cuDNN status: the call, cuDNN's string, the launch, and
 * cuDNN's last error message when there is one. */
static void fail_cudnn(rt_ctx *ctx, const char *call, cudnnStatus_t st) {
    char detail[512] = "";
    cudnnGetLastErrorString(detail, sizeof detail);
    rt_fail(ctx, "attention (cudnn): %s: %s: at %s%s%s%s", call, cudnnGetErrorString(st), rtc_launch_name(ctx),
            detail[0] ? " (" : "", detail, detail[0] ? ")" : "");
}

static int ck(rt_ctx *ctx, cudnnStatus_t st, const char *call) {
    if (st == CUDNN_STATUS_SUCCESS) return 0;
    fail_cudnn(ctx, call, st);
    return -1;
}

static int ck_cu(rt_ctx *ctx, CUresult r, const char *call) {
    if (r == CUDA_SUCCESS) return 0;
    rt_fail(ctx, "attention (cudnn): %s: %s: at %s", call, rtc_error_string(r), rtc_launch_name(ctx));
    return -1;
}

/* ---- building a plan: every step is skipped once one failed ---- */

typedef struct {
    rt_ctx *ctx;
    Plan *p;
    int failed;
} Build;

static cudnnBackendDescriptor_t make(Build *b, cudnnBackendDescriptorType_t type) {
    if (b->failed) return NULL;
    Plan *p = b->p;
    if (p->nowned == p->capowned) {
        int cap = p->capowned ? 2 * p->capowned : 64;
        cudnnBackendDescriptor_t *o = realloc(p->owned, sizeof *o * (size_t)cap);
        if (!o) {
            rt_fail(b->ctx, "attention (cudnn): out of host memory: at %s", rtc_launch_name(b->ctx));
            b->failed = 1;
            return NULL;
        }
        p->owned = o;
        p->capowned = cap;
    }
    cudnnBackendDescriptor_t d = NULL;
    if (ck(b->ctx, cudnnBackendCreateDescriptor(type, &d), "cudnnBackendCreateDescriptor")) {
        b->failed = 1;
        return NULL;
    }
    p->owned[p->nowned++] = d;
    return d;
}

static void set_attr(Build *b, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, const char *what,
                     cudnnBackendAttributeType_t type, int64_t count, const void *value) {
    if (b->failed) return;
    char call[128];
    snprintf(call, sizeof call, "cudnnBackendSetAttribute(%s)", what);
    if (ck(b->ctx, cudnnBackendSetAttribute(d, name, type, count, value), call)) b->failed = 1;
}
#define SET(b, d, name, type, count, value) set_attr((b), (d), (name), #name, (type), (count), (value))

static void set_desc(Build *b, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, const char *what,
                     cudnnBackendDescriptor_t value) {
    set_attr(b, d, name, what, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value);
}
#define SET_DESC(b, d, name, value) set_desc((b), (d), (name), #name, (value))

static void finalize(Build *b, cudnnBackendDescriptor_t d, const char *what) {
    if (b->failed) return;
    char call[128];
    snprintf(call, sizeof call, "cudnnBackendFinalize(%s)", what);
    if (ck(b->ctx, cudnnBackendFinalize(d), call)) b->failed = 1;
}

static cudnnBackendDescriptor_t build_tensor(Build *b, const SdpaTensor *t) {
    cudnnBackendDescriptor_t d = make(b, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const int64_t align = 16;
    const bool yes = true;
    SET(b, d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &t->dtype);
    SET(b, d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, t->dim);
    SET(b, d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, t->stride);
    SET(b, d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &t->uid);
    SET(b, d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    if (t->is_virtual) SET(b, d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &yes);
    if (t->by_value) SET(b, d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &yes);
    finalize(b, d, "tensor");
    return d;
}

static cudnnBackendDescriptor_t build_matmul(Build *b, const SdpaOp *op, cudnnBackendDescriptor_t const *td) {
    cudnnBackendDescriptor_t mm = make(b, CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    SET(b, mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &op->math);
    finalize(b, mm, "matmul");
    cudnnBackendDescriptor_t d = make(b, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    SET_DESC(b, d, CUDNN_ATTR_OPERATION_MATMUL_ADESC, td[op->x]);
    SET_DESC(b, d, CUDNN_ATTR_OPERATION_MATMUL_BDESC, td[op->b]);
    SET_DESC(b, d, CUDNN_ATTR_OPERATION_MATMUL_CDESC, td[op->y]);
    SET_DESC(b, d, CUDNN_ATTR_OPERATION_MATMUL_DESC, mm);
    finalize(b, d, "matmul operation");
    return d;
}

static cudnnBackendDescriptor_t build_pointwise(Build *b, const SdpaOp *op, cudnnBackendDescriptor_t const *td) {
    cudnnBackendDescriptor_t pw = make(b, CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    const cudnnPointwiseMode_t mode = (cudnnPointwiseMode_t)op->mode;
    SET(b, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    SET(b, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &op->math);
    if (mode == CUDNN_POINTWISE_GEN_INDEX) SET(b, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &op->axis);
    finalize(b, pw, "pointwise");
    cudnnBackendDescriptor_t d = make(b, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    SET_DESC(b, d, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
    SET_DESC(b, d, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, td[op->x]);
    if (op->b >= 0) SET_DESC(b, d, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, td[op->b]);
    if (op->t >= 0) SET_DESC(b, d, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, td[op->t]);
    SET_DESC(b, d, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, td[op->y]);
    finalize(b, d, "pointwise operation");
    return d;
}

static cudnnBackendDescriptor_t build_reduction(Build *b, const SdpaOp *op, cudnnBackendDescriptor_t const *td) {
    cudnnBackendDescriptor_t red = make(b, CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    const cudnnReduceTensorOp_t mode = (cudnnReduceTensorOp_t)op->mode;
    SET(b, red, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode);
    SET(b, red, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &op->math);
    finalize(b, red, "reduction");
    cudnnBackendDescriptor_t d = make(b, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    SET_DESC(b, d, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, td[op->x]);
    SET_DESC(b, d, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, td[op->y]);
    SET_DESC(b, d, CUDNN_ATTR_OPERATION_REDUCTION_DESC, red);
    finalize(b, d, "reduction operation");
    return d;
}

static cudnnBackendDescriptor_t build_reshape(Build *b, const SdpaOp *op, cudnnBackendDescriptor_t const *td) {
    cudnnBackendDescriptor_t d = make(b, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    SET_DESC(b, d, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, td[op->x]);
    SET_DESC(b, d, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, td[op->y]);
    finalize(b, d, "reshape operation");
    return d;
}

/* The operation graph of p->graph on handle h (NULL after rt_fail). */
static cudnnBackendDescriptor_t build_operation_graph(Build *b, cudnnHandle_t h) {
    const SdpaGraph *g = &b->p->graph;
    cudnnBackendDescriptor_t td[SDPA_MAX_TENSORS], ops[SDPA_MAX_OPS];
    for (int i = 0; i < g->nt; i++) td[i] = build_tensor(b, &g->t[i]);
    for (int i = 0; i < g->nop; i++) {
        const SdpaOp *op = &g->op[i];
        switch (op->kind) {
        case SOP_MATMUL: ops[i] = build_matmul(b, op, td); break;
        case SOP_POINTWISE: ops[i] = build_pointwise(b, op, td); break;
        case SOP_REDUCTION: ops[i] = build_reduction(b, op, td); break;
        case SOP_RESHAPE: ops[i] = build_reshape(b, op, td); break;
        }
    }
    cudnnBackendDescriptor_t graph = make(b, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    SET(b, graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g->nop, ops);
    SET(b, graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
    finalize(b, graph, "operation graph");
    return b->failed ? NULL : graph;
}

/* Heuristics mode A's engine configs, in its order of preference; the
 * first that finalizes into an execution plan wins. */
static void build_execution_plan(Build *b, cudnnHandle_t h, cudnnBackendDescriptor_t graph) {
    const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    cudnnBackendDescriptor_t heur = make(b, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    SET_DESC(b, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
    SET(b, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    finalize(b, heur, "engine heuristics");
    if (b->failed) return;
    int64_t n = 0;
    if (ck(b->ctx,
           cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n, NULL),
           "cudnnBackendGetAttribute(CUDNN_ATTR_ENGINEHEUR_RESULTS)")) {
        b->failed = 1;
        return;
    }
    cudnnBackendDescriptor_t *cfg = calloc((size_t)(n > 0 ? n : 1), sizeof *cfg);
    if (!cfg) {
        rt_fail(b->ctx, "attention (cudnn): out of host memory: at %s", rtc_launch_name(b->ctx));
        b->failed = 1;
        return;
    }
    for (int64_t i = 0; i < n; i++) cfg[i] = make(b, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    int64_t got = 0;
    if (!b->failed && n > 0 &&
        ck(b->ctx,
           cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, n, &got, cfg),
           "cudnnBackendGetAttribute(CUDNN_ATTR_ENGINEHEUR_RESULTS)"))
        b->failed = 1;
    cudnnStatus_t last = CUDNN_STATUS_NOT_SUPPORTED;
    for (int64_t i = 0; i < got && !b->failed && !b->p->plan; i++) {
        cudnnBackendDescriptor_t plan = make(b, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
        SET(b, plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
        SET_DESC(b, plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfg[i]);
        if (b->failed) break;
        last = cudnnBackendFinalize(plan); /* a config that does not take is not an error */
        if (last == CUDNN_STATUS_SUCCESS) b->p->plan = plan;
    }
    free(cfg);
    if (!b->failed && !b->p->plan) {
        char call[128];
        snprintf(call, sizeof call, "no execution plan (%lld engine configs, none finalized)", (long long)got);
        fail_cudnn(b->ctx, call, last);
        b->failed = 1;
    }
}

static int64_t round_up(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

/* cuDNN's workspace at offset 0, then the graph's workspace tensors. */
static void allocate_workspace(Build *b) {
    if (b->failed) return;
    Plan *p = b->p;
    int64_t bytes = 0, one = 0;
    if (ck(b->ctx,
           cudnnBackendGetAttribute(p->plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &one, &bytes),
           "cudnnBackendGetAttribute(CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE)")) {
        b->failed = 1;
        return;
    }
    int64_t total = round_up(bytes, WS_ALIGN);
    for (int i = 0; i < p->graph.nt; i++) {
        const SdpaTensor *t = &p->graph.t[i];
        if (!t->workspace) continue;
        p->offset[i] = total;
        total += round_up(t->dim[0] * t->dim[1] * t->dim[2] * t->dim[3] * 4, WS_ALIGN);
    }
    if (total > 0 && ck_cu(b->ctx, cuMemAlloc(&p->workspace, (size_t)total), "cuMemAlloc")) b->failed = 1;
}

/* Report a failure while freeing on stderr, once per rtc_cudnn_free (no
 * step is running to fail). */
static void free_report(int *reported, const char *call, const char *error) {
    if (*reported) return;
    fprintf(stderr, "kiln runtime: freeing cuDNN attention plans: %s: %s\n", call, error);
    *reported = 1;
}

static void plan_free(Plan *p, int *reported) {
    for (int i = p->nowned - 1; i >= 0; i--) {
        cudnnStatus_t st = cudnnBackendDestroyDescriptor(p->owned[i]);
        if (st != CUDNN_STATUS_SUCCESS) free_report(reported, "cudnnBackendDestroyDescriptor", cudnnGetErrorString(st));
    }
    free(p->owned);
    if (p->workspace) {
        CUresult r = cuMemFree(p->workspace);
        if (r != CUDA_SUCCESS) free_report(reported, "cuMemFree", rtc_error_string(r));
    }
    free(p);
}

/* ---- the context's handle and plans (under lock) ---- */

static cudnnHandle_t handle_of(rt_ctx *ctx) {
    for (int i = 0; i < nhandles; i++)
        if (handles[i].ctx == ctx) return handles[i].handle;
    size_t version = cudnnGetVersion();
    if (version < MIN_CUDNN_VERSION) {
        rt_fail(ctx, "attention (cudnn): cuDNN %zu is older than the %d these graphs need: at %s", version,
                MIN_CUDNN_VERSION, rtc_launch_name(ctx));
        return NULL;
    }
    if (nhandles == caphandles) {
        int cap = caphandles ? 2 * caphandles : 4;
        Handle *n = realloc(handles, sizeof *n * (size_t)cap);
        if (!n) {
            rt_fail(ctx, "attention (cudnn): out of host memory: at %s", rtc_launch_name(ctx));
            return NULL;
        }
        handles = n;
        caphandles = cap;
    }
    cudnnHandle_t h = NULL;
    if (ck(ctx, cudnnCreate(&h), "cudnnCreate")) return NULL;
    handles[nhandles++] = (Handle){ctx, h};
    return h;
}

static int same_shape(const SdpaShape *a, const SdpaShape *b) {
    return a->B == b->B && a->H == b->H && a->KH == b->KH && a->T == b->T && a->S == b->S && a->D == b->D &&
           a->causal == b->causal && a->deterministic == b->deterministic && a->scale == b->scale;
}

static Plan *plan_build(rt_ctx *ctx, cudnnHandle_t h, CUstream stream, int dir, const SdpaShape *s) {
    Plan *p = calloc(1, sizeof *p);
    if (!p) {
        rt_fail(ctx, "attention (cudnn): out of host memory: at %s", rtc_launch_name(ctx));
        return NULL;
    }
    *p = (Plan){.ctx = ctx, .stream = stream, .dir = dir, .shape = *s};
    if ((dir == SDPA_FWD ? sdpa_describe_fwd : sdpa_describe_bwd)(&p->graph, s)) {
        rt_fail(ctx, "attention (cudnn): the graph has more than %d tensors or %d operations: at %s",
                SDPA_MAX_TENSORS, SDPA_MAX_OPS, rtc_launch_name(ctx));
        free(p);
        return NULL;
    }
    Build b = {.ctx = ctx, .p = p};
    cudnnBackendDescriptor_t graph = build_operation_graph(&b, h);
    if (graph) build_execution_plan(&b, h, graph);
    allocate_workspace(&b);
    if (b.failed) {
        int reported = 1; /* the step already failed with the cause */
        plan_free(p, &reported);
        return NULL;
    }
    return p;
}

/* Room for one more plan; 0, or -1 after rt_fail. */
static int grow_plans(rt_ctx *ctx) {
    if (nplans < capplans) return 0;
    int cap = capplans ? 2 * capplans : 8;
    Plan **n = realloc(plans, sizeof *n * (size_t)cap);
    if (!n) {
        rt_fail(ctx, "attention (cudnn): out of host memory: at %s", rtc_launch_name(ctx));
        return -1;
    }
    plans = n;
    capplans = cap;
    return 0;
}

/* The plan for (ctx, stream, dir, s), built on first use, and the
 * context's handle in *h; NULL after rt_fail. */
static Plan *plan_get(rt_ctx *ctx, int dir, const SdpaShape *s, cudnnHandle_t *h) {
    CUstream stream = rtc_stream(ctx);
    Plan *p = NULL;
    pthread_mutex_lock(&lock);
    *h = handle_of(ctx);
    for (int i = 0; *h && i < nplans && !p; i++)
        if (plans[i]->ctx == ctx && plans[i]->stream == stream && plans[i]->dir == dir && same_shape(&plans[i]->shape, s))
            p = plans[i];
    if (*h && !p && grow_plans(ctx) == 0) {
        p = plan_build(ctx, *h, stream, dir, s);
        if (p) plans[nplans++] = p;
    }
    pthread_mutex_unlock(&lock);
    return p;
}

void rtc_cudnn_free(rt_ctx *ctx) {
    int reported = 0, kept = 0;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < nplans; i++) {
        if (plans[i]->ctx == ctx)
            plan_free(plans[i], &reported);
        else
            plans[kept++] = plans[i];
    }
    nplans = kept;
    kept = 0;
    for (int i = 0; i < nhandles; i++) {
        if (handles[i].ctx != ctx) {
            handles[kept++] = handles[i];
            continue;
        }
        cudnnStatus_t st = cudnnDestroy(handles[i].handle);
        if (st != CUDNN_STATUS_SUCCESS) free_report(&reported, "cudnnDestroy", cudnnGetErrorString(st));
    }
    nhandles = kept;
    pthread_mutex_unlock(&lock);
}

/* ---- launching ---- */

/* Bind the graph's non-virtual tensors (io[uid] for the caller's, the plan
 * for scalars and workspace tensors) and run the plan on the launch's
 * stream. */
static void execute(rt_ctx *ctx, Plan *p, cudnnHandle_t h, const CUdeviceptr io[UID_FIRST_VIRTUAL]) {
    int64_t uids[SDPA_MAX_TENSORS];
    void *ptrs[SDPA_MAX_TENSORS];
    int n = 0;
    for (int i = 0; i < p->graph.nt; i++) {
        SdpaTensor *t = &p->graph.t[i];
        if (t->is_virtual) continue;
        uids[n] = t->uid;
        if (t->by_value)
            ptrs[n] = &t->value;
        else if (t->workspace)
            ptrs[n] = (void *)(uintptr_t)(p->workspace + (CUdeviceptr)p->offset[i]);
        else
            ptrs[n] = (void *)(uintptr_t)io[t->uid];
        n++;
    }
    void *ws = (void *)(uintptr_t)p->workspace;
    cudnnBackendDescriptor_t pack = NULL;
    if (ck(ctx, cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack),
           "cudnnBackendCreateDescriptor(variant pack)"))
        return;
    int bad = ck(ctx, cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids),
                 "cudnnBackendSetAttribute(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS)") ||
              ck(ctx, cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs),
                 "cudnnBackendSetAttribute(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS)") ||
              ck(ctx, cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws),
                 "cudnnBackendSetAttribute(CUDNN_ATTR_VARIANT_PACK_WORKSPACE)") ||
              ck(ctx, cudnnBackendFinalize(pack), "cudnnBackendFinalize(variant pack)") ||
              ck(ctx, cudnnSetStream(h, rtc_stream(ctx)), "cudnnSetStream");
    if (!bad) ck(ctx, cudnnBackendExecute(h, p->plan, pack), "cudnnBackendExecute");
    ck(ctx, cudnnBackendDestroyDescriptor(pack), "cudnnBackendDestroyDescriptor(variant pack)");
}

static int deterministic(void) {
    const char *d = getenv("KILN_CUDNN_DETERMINISTIC");
    return d && d[0] && strcmp(d, "0") != 0;
}

/* Check the args against the qualification rule; 0, or -1 after rt_fail. */
static int check_args(rt_ctx *ctx, const char *op, const SdpaShape *s, int has_positions, int has_lse) {
    const char *why = sdpa_unsupported(s, has_positions, has_lse);
    if (!why) return 0;
    rt_fail(ctx, "attention (cudnn): %s B=%lld H=%lld KH=%lld T=%lld S=%lld D=%lld: %s (the emitter must use kiln's "
            "kernel): at %s",
            op, (long long)s->B, (long long)s->H, (long long)s->KH, (long long)s->T, (long long)s->S, (long long)s->D,
            why, rtc_launch_name(ctx));
    return -1;
}

/* A sliding window (the window arg): kiln's own kernel runs it, never
 * these graphs (the emitter routes it there; docs/cudnn.md). */
static int check_window(rt_ctx *ctx, const char *op, int64_t window) {
    if (!window) return 0;
    rt_fail(ctx, "attention (cudnn): %s with a sliding window of %lld keys (the emitter must use kiln's kernel): at %s",
            op, (long long)window, rtc_launch_name(ctx));
    return -1;
}

/* args: q, k, v, o, lse, B, H, KH, T, S, D, causal, scale, qpos, kpos, window */
void rtk_attention_cudnn(rt_ctx *ctx, const int64_t *a) {
    SdpaShape s = {.B = a[5], .H = a[6], .KH = a[7], .T = a[8], .S = a[9], .D = a[10], .causal = a[11] != 0,
                   .scale = rt_bits_f64(a[12])};
    rtc_at_free(ctx, rtc_cudnn_free);
    if (check_args(ctx, "attention", &s, a[13] != 0 || a[14] != 0, a[4] != 0) || check_window(ctx, "attention", a[15]))
        return;
    CUdeviceptr io[UID_FIRST_VIRTUAL] = {0};
    io[UID_Q] = (CUdeviceptr)a[0], io[UID_K] = (CUdeviceptr)a[1], io[UID_V] = (CUdeviceptr)a[2];
    io[UID_O] = (CUdeviceptr)a[3], io[UID_STATS] = (CUdeviceptr)a[4];
    cudnnHandle_t h = NULL;
    Plan *p = plan_get(ctx, SDPA_FWD, &s, &h);
    if (p) execute(ctx, p, h, io);
}

/* args: do, q, k, v, o, lse, dq, dk, dv, B, H, KH, T, S, D, causal, scale, qpos, kpos, window */
void rtk_attention_bwd_cudnn(rt_ctx *ctx, const int64_t *a) {
    SdpaShape s = {.B = a[9], .H = a[10], .KH = a[11], .T = a[12], .S = a[13], .D = a[14], .causal = a[15] != 0,
                   .deterministic = deterministic(), .scale = rt_bits_f64(a[16])};
    rtc_at_free(ctx, rtc_cudnn_free);
    if (check_args(ctx, "attention_bwd", &s, a[17] != 0 || a[18] != 0, a[5] != 0) ||
        check_window(ctx, "attention_bwd", a[19]))
        return;
    CUdeviceptr io[UID_FIRST_VIRTUAL] = {0};
    io[UID_DO] = (CUdeviceptr)a[0], io[UID_Q] = (CUdeviceptr)a[1], io[UID_K] = (CUdeviceptr)a[2];
    io[UID_V] = (CUdeviceptr)a[3], io[UID_O] = (CUdeviceptr)a[4], io[UID_STATS] = (CUdeviceptr)a[5];
    io[UID_DQ] = (CUdeviceptr)a[6], io[UID_DK] = (CUdeviceptr)a[7], io[UID_DV] = (CUdeviceptr)a[8];
    cudnnHandle_t h = NULL;
    Plan *p = plan_get(ctx, SDPA_BWD, &s, &h);
    if (p) execute(ctx, p, h, io);
}
#endif /* KILN_CUDNN_DESCRIBE_ONLY */
