/* kernels_cuda.c — the library kernels of kiln_rt.h on the CUDA device: one
 * launcher per rtk_* (except the collectives, comm_nccl.c), which turns the
 * generated code's flat int64 args into a cuLaunchKernel of the cubin
 * kernels of kernels/cuda/ (or a cuBLASLt matmul, or a device copy).
 *
 * What a launcher does.  rt_launch (dev_cuda.c) makes the launch's stream
 * current and calls the launcher on the calling thread; the launcher
 * enqueues its work on rtc_stream and returns at once.  It never
 * synchronises, allocates device memory or reads it on the host, and it
 * enqueues exactly the same work for the same args every time, because the
 * second step is captured into a CUDA graph that later steps replay (the
 * first runs eagerly: one-time set-up such as cuBLASLt's heuristics
 * happens there).
 *
 * The kernels' ABI is kernels/cuda/README.md (and the CUDA contract's list
 * for misc.cu): each launcher below is that section spelled out, in the
 * README's order.  Three rules hold throughout:
 *
 *  - Parameters.  cuLaunchKernel reads each parameter through a pointer,
 *    with the size of the kernel's declared type, so every parameter is a
 *    local of exactly that C type: device pointers CUdeviceptr (8 bytes,
 *    the size of a device pointer), sizes `long long`, flags and dtype
 *    codes `int`, attributes `double`.  A params array points at them.  A
 *    NULL pointer (positions, lse, p_bf16) is a CUdeviceptr 0.
 *  - Grids.  Each launch uses the README's grid, block and dynamic shared
 *    memory.  Every kernel walks its rows or elements with a stride of the
 *    grid, so a grid is only ever capped, never needed whole: x at 2^31-1
 *    (the hardware's limit) and y at 65535; the element kernels of misc.cu
 *    at 65535 blocks as the contract says (attn_merge, a warp per row:
 *    ceil(rows/8) blocks).  A launch whose grid is 0 is
 *    skipped (cuLaunchKernel rejects it); the README says which launches
 *    must still run for empty shapes, and they do.
 *  - Scratch.  The backward kernels that need temporary memory take it
 *    from the stream's scratch (rtc_scratch), which the compiler sizes as
 *    the largest of (bytes, for one launch):
 *        rtk_layernorm_bwd   parts(rows) * 2 * C * 4     parts(r) = min(r, 512)
 *        rtk_rmsnorm_bwd     parts(rows) * C * 4
 *        rtk_embedding_bwd   (4*n + 256*ceil(n/256)) * 4   (n > 0; else 0)
 *        rtk_attention_bwd   B * H * T * 4   (rtk_attention_bwd_tc the same)
 *        rtk_sumsq           parts * 4, parts = max(1, min(ceil(n/2048), 1024))
 *        rtk_sumto           parts * K * 4, K = y's elements, R = x's / K,
 *                            parts = max(1, min(ceil(R/256), 1024))
 *    and nothing for the others (a GEMM's workspace is separate).  One
 *    stream runs its kernels in order, so they share the buffer safely.
 *
 * GEMMs (rtk_gemm) run on cuBLASLt, A and B bf16, C bf16 or f32, f32
 * accumulation (CUBLAS_COMPUTE_32F, scale type f32).  cuBLASLt is
 * column-major; a row-major [r, c] matrix is the column-major [c, r] one,
 * its transpose, so row-major C = op(A) op(B) is computed as the
 * column-major C^T = op(B)^T op(A)^T: cuBLASLt's first operand is our B
 * (transposed when tb), its second our A (when ta), m = N, n = M, k = K,
 * and C^T is [N, M] with leading dim N.  A batch is a strided batch
 * (stride 0: one matrix for every entry); a batch that shares B and whose
 * A and C are contiguous rows (the linear layers: x[B,T,C] x w) is folded
 * into one product with M' = batch*M, as the CPU twin does.  Beta 0 or 1
 * with C as both C and D (in place).  K = 0 makes C = 0 (beta 0) or
 * leaves it (beta 1) without cuBLASLt.  A batch into one C (stride 0) is
 * refused: its products would race.
 *
 * Epilogues (issue 23): rtk_gemm_bias (BIAS), rtk_gemm_bias_gelu
 * (GELU_AUX_BIAS), rtk_gemm_dgelu_bgrad (DGELU_BGRAD) and rtk_gemm_bgrad
 * (BGRADA / BGRADB) are rtk_gemm with the epilogue, its BIAS_POINTER (the
 * bias, or where the bias gradient goes: a vector in C's dtype) and its
 * AUX_POINTER (AUX_LD = N), part of the plan's key; epilogue_fits checks
 * the library's rules (one batch for aux and bias gradients, beta 0, BGRADA
 * an untransposed cuBLASLt A = our B, BGRADB a transposed B = our A) before
 * cuBLASLt is asked (docs/decisions.md, "Backward GEMM epilogues").
 *
 * cuBLASLt's heuristic costs far more than a small GEMM, so each distinct
 * call shape (batch, M, N, K, transposes, strides, C's dtype, the
 * pointers' alignments) gets a plan once: the matmul descriptor, the three
 * layouts and the heuristic's algorithm, kept in a small table per context
 * until rtc_kernels_free.  The heuristic assumes 256-byte aligned matrices
 * unless told otherwise; the memory plan aligns tensors to 64 bytes, so a
 * plan whose pointers (or batch strides) are less aligned tells the
 * preference their real alignment (MIN_ALIGNMENT_{A,B,C,D}_BYTES), and
 * only then: with 256-aligned operands the preference carries nothing but
 * the workspace size.
 *
 * Errors.  Every driver and cuBLASLt return code is checked; a failure
 * calls rt_fail with the launch's name, the call and the library's string,
 * and the launcher returns without enqueuing the rest.  Bad args that would
 * make a kernel misbehave rather than fail (an unsupported dtype code, a
 * rank above 5, a head dim above 256) fail the same way, naming them.
 *
 * Exported beyond kiln_rt.h (to be declared in rt_cuda.h by the lead):
 *
 *     // Drop what the launchers keep for ctx (the cuBLASLt GEMM plans).
 *     // dev_cuda.c's rt_free calls it once, before cublasLtDestroy.
 *     void rtc_kernels_free(rt_ctx *ctx);
 *
 * The compiler's emitter needs no function from here: it sizes
 * program->scratch_bytes with the table above.
 */
#include <cublasLt.h>
#include <cuda.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt_cuda.h"

void rtc_kernels_free(rt_ctx *ctx); /* see the essay; rt_cuda.h will declare it */

_Static_assert(sizeof(CUdeviceptr) == sizeof(void *), "a CUdeviceptr parameter must be pointer-sized");

#define BLOCK 256                 /* KILN_BLOCK: the library kernels' block */
#define GRID_X_MAX 2147483647LL   /* the hardware's grid limits */
#define GRID_Y_MAX 65535LL
#define ELEM_GRID_MAX 65535LL     /* misc.cu's element kernels: min(ceil(n/256), 65535) */
#define NORM_PARTS 512            /* KILN_NORM_PARTS (common.cuh) */
#define FUSED_MAX_PTRS 256        /* rtk_fused: pointer params at most (2 KiB of params) */
#define SUMTO_ROWS 256            /* sumto over rows: parts(R) = min(max(ceil(R/256), 1), 1024) */
#define SUMTO_PARTS 1024          /* (README; the compiler's emit_cuda_scratch has the same rule) */

/* ---- small helpers ---- */

static CUdeviceptr dptr(int64_t a) { return (CUdeviceptr)(uint64_t)a; }
static int64_t ceil_div(int64_t a, int64_t b) { return a <= 0 ? 0 : (a + b - 1) / b; }
static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t grid_rows(int64_t rows) { return rows <= 0 ? 0 : min64(rows, GRID_X_MAX); }
static int64_t grid_elems(int64_t n) { return min64(ceil_div(n, BLOCK), ELEM_GRID_MAX); }
static int64_t norm_parts(int64_t rows) { return rows < NORM_PARTS ? rows : NORM_PARTS; }

static const char *dtype_name(int64_t dt) {
    switch (dt) {
    case RT_F32: return "f32";
    case RT_BF16: return "bf16";
    case RT_F16: return "f16";
    case RT_I32: return "i32";
    case RT_I64: return "i64";
    default: return "?";
    }
}

/* Library kernel `name` over a (gx, gy) grid of `block` threads; nothing
 * when a grid dimension is 0.  The caller has capped the grid. */
static void launch(rt_ctx *ctx, const char *name, int64_t gx, int64_t gy, int block, int64_t smem, void **params) {
    if (gx <= 0 || gy <= 0) return;
    CUfunction f = rtc_function(ctx, name);
    if (!f) return; /* rtc_function has failed the step */
    rtc_launch(ctx, f, gx, gy, block, smem, params);
}

/* `bytes` of the stream's scratch in *p (0 for no bytes).  0, or -1 after
 * rtc_scratch has failed the step. */
static int scratch(rt_ctx *ctx, int64_t bytes, CUdeviceptr *p) {
    *p = 0;
    if (bytes <= 0) return 0;
    *p = rtc_scratch(ctx, bytes);
    return *p ? 0 : -1;
}

/* dt is f32 or bf16 (the kernels whose dtype varies compute in f32). */
static int float_dtype(rt_ctx *ctx, const char *op, const char *what, int64_t dt) {
    if (dt == RT_F32 || dt == RT_BF16) return 0;
    rt_fail(ctx, "%s: %s: dtype %s (%lld) is not supported on CUDA (f32 or bf16)", rtc_launch_name(ctx), op, what,
            (long long)dt);
    return -1;
}

/* ---- layernorm.cu ---- */

/* args: x, w, b, y, rows, C, eps */
void rtk_layernorm(rt_ctx *ctx, const int64_t *a) {
    CUdeviceptr x = dptr(a[0]), w = dptr(a[1]), b = dptr(a[2]), y = dptr(a[3]);
    long long rows = a[4], C = a[5];
    double eps = rt_bits_f64(a[6]);
    void *params[] = {&x, &w, &b, &y, &rows, &C, &eps};
    /* C a multiple of 256 up to 1024: the kernel's warp path, a row per warp (8 per block) */
    int64_t grid = C > 0 && C % 256 == 0 && C <= 1024 ? ceil_div(rows, BLOCK / 32) : rows;
    launch(ctx, "kiln_layernorm_fwd", grid_rows(grid), 1, BLOCK, 0, params);
}

/* args: dy, x, w, dx, dw, db, rows, C, eps.  kiln_layernorm_bwd into the
 * partial sums, then kiln_layernorm_bwd_reduce (alone when rows = 0: it
 * writes dw = db = 0). */
void rtk_layernorm_bwd(rt_ctx *ctx, const int64_t *a) {
    CUdeviceptr dy = dptr(a[0]), x = dptr(a[1]), w = dptr(a[2]), dx = dptr(a[3]), dw = dptr(a[4]), db = dptr(a[5]);
    long long rows = a[6], C = a[7];
    double eps = rt_bits_f64(a[8]);
    int64_t parts = norm_parts(rows);
    CUdeviceptr partial;
    if (scratch(ctx, parts * 2 * C * 4, &partial)) return;
    void *bwd[] = {&dy, &x, &w, &dx, &partial, &rows, &C, &eps};
    launch(ctx, "kiln_layernorm_bwd", parts, 1, BLOCK, 8 * C, bwd);
    void *reduce[] = {&partial, &dw, &db, &rows, &C};
    launch(ctx, "kiln_layernorm_bwd_reduce", min64(ceil_div(C, 32), GRID_X_MAX), 1, BLOCK, 0, reduce); /* 32 columns a block */
}

/* ---- rmsnorm.cu ---- */

/* args: x, w, y, rows, C, eps */
void rtk_rmsnorm(rt_ctx *ctx, const int64_t *a) {
    CUdeviceptr x = dptr(a[0]), w = dptr(a[1]), y = dptr(a[2]);
    long long rows = a[3], C = a[4];
    double eps = rt_bits_f64(a[5]);
    void *params[] = {&x, &w, &y, &rows, &C, &eps};
    launch(ctx, "kiln_rmsnorm_fwd", grid_rows(rows), 1, BLOCK, 0, params);
}

/* args: dy, x, w, dx, dw, rows, C, eps.  As layernorm's backward. */
void rtk_rmsnorm_bwd(rt_ctx *ctx, const int64_t *a) {
    CUdeviceptr dy = dptr(a[0]), x = dptr(a[1]), w = dptr(a[2]), dx = dptr(a[3]), dw = dptr(a[4]);
    long long rows = a[5], C = a[6];
    double eps = rt_bits_f64(a[7]);
    int64_t parts = norm_parts(rows);
    CUdeviceptr partial;
    if (scratch(ctx, parts * C * 4, &partial)) return;
    void *bwd[] = {&dy, &x, &w, &dx, &partial, &rows, &C, &eps};
    launch(ctx, "kiln_rmsnorm_bwd", parts, 1, BLOCK, 4 * C, bwd);
    void *reduce[] = {&partial, &dw, &rows, &C};
    launch(ctx, "kiln_rmsnorm_bwd_reduce", min64(ceil_div(C, BLOCK), GRID_X_MAX), 1, BLOCK, 0, reduce);
}

/* ---- rope.cu ---- */

/* args: x, pos, y, B, T, H, D, theta, sign (+1 fwd, -1 bwd; the CPU twin
 * takes any negative sign as the backward) */
void rtk_rope(rt_ctx *ctx, const int64_t *a) {
    CUdeviceptr x = dptr(a[0]), pos = dptr(a[1]), y = dptr(a[2]);
    long long B = a[3], T = a[4], H = a[5], D = a[6];
    double theta = rt_bits_f64(a[7]);
    void *params[] = {&x, &pos, &y, &B, &T, &H, &D, &theta};
    launch(ctx, a[8] < 0 ? "kiln_rope_bwd" : "kiln_rope_fwd", grid_rows(B * T), 1, BLOCK, 4 * D, params);
}

/* ---- dropout.cu (issue 17) ---- */

/* args: x, step, rows, pos, y, B, T, F, p(bits), seed, id */
void rtk_dropout(rt_ctx *ctx, const int64_t *a) {
    CUdeviceptr x = dptr(a[0]), step = dptr(a[1]), rows = dptr(a[2]), pos = dptr(a[3]), y = dptr(a[4]);
    long long B = a[5], T = a[6], F = a[7], seed = a[9], id = a[10];
    double p = rt_bits_f64(a[8]);
    void *params[] = {&x, &step, &rows, &pos, &y, &B, &T, &F, &p, &seed, &id};
    launch(ctx, "kiln_dropout", grid_rows(B * T), 1, BLOCK, 0, params);
}

/* ---- xent.cu ---- */

/* args: logits, targets, loss, rows, V (lse not stored: NULL) */
void rtk_cross_entropy(rt_ctx *ctx, const int64_t *a) {
    CUdeviceptr logits = dptr(a[0]), targets = dptr(a[1]), loss = dptr(a[2]), lse = 0;
    long long rows = a[3], V = a[4];
    void *params[] = {&logits, &targets, &loss, &lse, &rows, &V};
    launch(ctx, "kiln_cross_entropy_fwd", grid_rows(rows), 1, BLOCK, 0, params);
}

/* args: dl, logits, targets, dlogits, rows, V (lse NULL: recomputed) */
void rtk_cross_entropy_bwd(rt_ctx *ctx, const int64_t *a) {
    CUdeviceptr dl = dptr(a[0]), logits = dptr(a[1]), targets = dptr(a[2]), dlogits = dptr(a[3]), lse = 0;
    long long rows = a[4], V = a[5];
    void *params[] = {&dl, &logits, &targets, &lse, &dlogits, &rows, &V};
    launch(ctx, "kiln_cross_entropy_bwd", grid_rows(rows), 1, BLOCK, 0, params);
}

/* ---- xent_fused.cu ---- */

/* args: dl, logits, targets, dlogits, loss, rows, V: dl per row (stride 1) */
void rtk_cross_entropy_fused(rt_ctx *ctx, const int64_t *a) {
    CUdeviceptr dl = dptr(a[0]), logits = dptr(a[1]), targets = dptr(a[2]), dlogits = dptr(a[3]), loss = dptr(a[4]);
    long long rows = a[5], V = a[6], stride = 1;
    void *params[] = {&logits, &targets, &dl, &stride, &loss, &dlogits, &rows, &V};
    launch(ctx, "kiln_cross_entropy_fused", grid_rows(rows), 1, BLOCK, 0, params);
}

/* ---- embedding.cu ---- */

/* args: table, ids, out, n, C, V */
void rtk_embedding(rt_ctx *ctx, const int64_t *a) {
    CUdeviceptr table = dptr(a[0]), ids = dptr(a[1]), out = dptr(a[2]);
    long long n = a[3], C = a[4], V = a[5];
    void *params[] = {&table, &ids, &out, &n, &C, &V};
    launch(ctx, "kiln_embedding_fwd", grid_rows(n), 1, BLOCK, 0, params);
}

/* 8-bit radix passes for keys in [0, V], exactly as the kernels count
 * them (embedding.cu emb_passes: V itself marks a bad id). */
static long long embedding_passes(long long V) {
    int bits = V > 0 ? 64 - __builtin_clzll((unsigned long long)V) : 1;
    return (bits + 7) / 8;
}

/* args: dy, ids, dtable, n, C, V.  The README's sequence: the radix sort
 * of (id, row) in `work` (hist, scan, scatter per pass), dtable = 0, then
 * the sum of each run of equal ids. */
void rtk_embedding_bwd(rt_ctx *ctx, const int64_t *a) {
    CUdeviceptr dy = dptr(a[0]), ids = dptr(a[1]), dtable = dptr(a[2]);
    long long n = a[3], C = a[4], V = a[5];
    int64_t tiles = ceil_div(n, BLOCK);
    CUdeviceptr work;
    if (scratch(ctx, n > 0 ? (4 * n + 256 * tiles) * 4 : 0, &work)) return;
    if (n > 0) {
        long long passes = embedding_passes(V);
        for (long long pass = 0; pass < passes; pass++) {
            void *sort[] = {&ids, &work, &n, &V, &pass};
            void *scan[] = {&work, &n, &V, &pass};
            launch(ctx, "kiln_embedding_bwd_hist", min64(tiles, GRID_X_MAX), 1, BLOCK, 0, sort);
            launch(ctx, "kiln_embedding_bwd_scan", 1, 1, 1024, 0, scan);
            launch(ctx, "kiln_embedding_bwd_scatter", min64(tiles, GRID_X_MAX), 1, BLOCK, 0, sort);
        }
    }
    void *zero[] = {&dtable, &V, &C};
    launch(ctx, "kiln_embedding_bwd_zero", min64(ceil_div(V * C, 2048), GRID_X_MAX), 1, BLOCK, 0, zero);
    if (n > 0) {
        void *sum[] = {&dy, &work, &dtable, &n, &C, &V};
        /* blocks stride over the sorted positions: 4096 of them, not n (most
         * positions start no run; a block each was a launch-bound grid) */
        launch(ctx, "kiln_embedding_bwd", min64(n, 4096), min64(ceil_div(C, BLOCK), GRID_Y_MAX), BLOCK, 0, sum);
    }
}

/* ---- adamw.cu ---- */

/* args: p, g, m, v, lr, scale, t, p_out, m_out, v_out, n, b1, b2, eps, wd
 * (no bf16 copy: p_bf16 NULL) */
void rtk_adamw(rt_ctx *ctx, const int64_t *a) {
    CUdeviceptr p = dptr(a[0]), g = dptr(a[1]), m = dptr(a[2]), v = dptr(a[3]), lr = dptr(a[4]), scale = dptr(a[5]),
                t = dptr(a[6]), p_out = dptr(a[7]), m_out = dptr(a[8]), v_out = dptr(a[9]), p_bf16 = 0;
    long long n = a[10];
    double b1 = rt_bits_f64(a[11]), b2 = rt_bits_f64(a[12]), eps = rt_bits_f64(a[13]), wd = rt_bits_f64(a[14]);
    void *params[] = {&p, &g, &m, &v, &lr, &scale, &t, &p_out, &m_out, &v_out, &p_bf16, &n, &b1, &b2, &eps, &wd};
    launch(ctx, "kiln_adamw", min64(ceil_div(n, BLOCK), 4096), 1, BLOCK, 0, params);
}

/* ---- attention.cu ---- */

/* The head dim the kernels hold (ATT_DMAX); above it they would need more
 * shared memory than any GPU has, so the launch fails here, naming it. */
#define ATT_DMAX 256

static int attention_shape(rt_ctx *ctx, const char *op, long long H, long long KH, long long D) {
    if (D > ATT_DMAX) {
        rt_fail(ctx, "%s: %s: head dim %lld is above the CUDA kernels' %d", rtc_launch_name(ctx), op, D, ATT_DMAX);
        return -1;
    }
    if (KH <= 0 ? H > 0 : H % KH != 0) {
        rt_fail(ctx, "%s: %s: %lld query heads are not a multiple of %lld kv heads", rtc_launch_name(ctx), op, H, KH);
        return -1;
    }
    return 0;
}

/* The two attention kernel sets, attention.cu's and attention_tc.cu's
 * (issue 23): the same arguments, their own names and launch geometry.
 * Dynamic shared memory is smem_d * D + smem_c bytes per block. */
typedef struct {
    const char *fwd, *dkdv, *dq;
    int block, q_rows, dq_rows; /* threads per block; query rows per fwd / dq block */
    long long fwd_d, fwd_c, dkdv_d, dkdv_c, dq_d, dq_c;
    int tc;                     /* head dims 16, 32, 64, 128 only */
} AttnKernels;

static const AttnKernels attn_plain = {"kiln_attention_fwd", "kiln_attention_bwd_dkdv", "kiln_attention_bwd_dq",
                                       BLOCK, 64, 32, 512, 18432, 768, 18176, 768, 9728, 0};
/* block 128: 4 warps of 16 query rows; tiles padded to D + 8, the streamed
 * ones (key tiles in fwd and dq, query tiles in dkdv) in two stages */
static const AttnKernels attn_tc = {"kiln_attention_tc_fwd", "kiln_attention_tc_bwd_dkdv", "kiln_attention_tc_bwd_dq",
                                    128, 64, 64, 640, 640 * 8 + 768, 768, 768 * 8 + 1792, 768, 768 * 8 + 1792, 1};

/* The kernel `name` of set K for head dim D: attention_tc.cu's have one
 * entry point per D (NAME_d16, _d32, _d64, _d128, each compiled for its D
 * alone: its own register count), in buf; attention.cu's take any D. */
static const char *attn_kernel(const AttnKernels *K, const char *name, long long D, char *buf, size_t size) {
    if (!K->tc) return name;
    snprintf(buf, size, "%s_d%lld", name, D);
    return buf;
}

static int attention_check(rt_ctx *ctx, const AttnKernels *K, const char *op, long long H, long long KH, long long D) {
    if (K->tc && D != 16 && D != 32 && D != 64 && D != 128) {
        rt_fail(ctx, "%s: %s: head dim %lld: the tensor-core kernels take 16, 32, 64 or 128", rtc_launch_name(ctx), op, D);
        return -1;
    }
    return attention_shape(ctx, op, H, KH, D);
}

/* args: q, k, v, o, lse, B, H, KH, T, S, D, causal, scale, qpos, kpos,
 * window (S = 0 still launches: o = 0, lse = -inf) */
static void attention_fwd(rt_ctx *ctx, const AttnKernels *K, const int64_t *a) {
    CUdeviceptr q = dptr(a[0]), k = dptr(a[1]), v = dptr(a[2]), o = dptr(a[3]), lse = dptr(a[4]);
    long long B = a[5], H = a[6], KH = a[7], T = a[8], S = a[9], D = a[10];
    int causal = a[11] != 0;
    double scale = rt_bits_f64(a[12]);
    CUdeviceptr qpos = dptr(a[13]), kpos = dptr(a[14]);
    long long window = a[15];
    if (attention_check(ctx, K, "attention", H, KH, D)) return;
    void *params[] = {&q, &k, &v, &qpos, &kpos, &o, &lse, &B, &H, &KH, &T, &S, &D, &causal, &window, &scale};
    char name[64];
    launch(ctx, attn_kernel(K, K->fwd, D, name, sizeof name), min64(B * H * ceil_div(T, K->q_rows), GRID_X_MAX), 1,
           K->block, K->fwd_d * D + K->fwd_c, params);
}

/* args: do, q, k, v, o, lse, dq, dk, dv, B, H, KH, T, S, D, causal, scale,
 * qpos, kpos, window.  prep (dt = do . o per row, in scratch; attention.cu's
 * for both sets), then dkdv and dq (T = 0: dkdv still writes dk = dv = 0;
 * S = 0: dq still writes dq = 0). */
static void attention_bwd(rt_ctx *ctx, const AttnKernels *K, const int64_t *a) {
    CUdeviceptr dout = dptr(a[0]), q = dptr(a[1]), k = dptr(a[2]), v = dptr(a[3]), o = dptr(a[4]), lse = dptr(a[5]);
    CUdeviceptr dq = dptr(a[6]), dk = dptr(a[7]), dv = dptr(a[8]);
    long long B = a[9], H = a[10], KH = a[11], T = a[12], S = a[13], D = a[14];
    int causal = a[15] != 0;
    double scale = rt_bits_f64(a[16]);
    CUdeviceptr qpos = dptr(a[17]), kpos = dptr(a[18]);
    long long window = a[19];
    if (attention_check(ctx, K, "attention_bwd", H, KH, D)) return;
    long long rows = B * H * T;
    CUdeviceptr dt;
    if (scratch(ctx, rows * 4, &dt)) return;
    void *prep[] = {&dout, &o, &dt, &rows, &D};
    launch(ctx, "kiln_attention_bwd_prep", min64(ceil_div(rows, 8), GRID_X_MAX), 1, BLOCK, 0, prep);
    void *dkdv[] = {&dout, &q, &k, &v, &lse, &dt, &qpos, &kpos, &dk, &dv, &B, &H, &KH, &T, &S, &D, &causal, &window, &scale};
    char name[64];
    launch(ctx, attn_kernel(K, K->dkdv, D, name, sizeof name), min64(B * KH * ceil_div(S, 64), GRID_X_MAX), 1, K->block,
           K->dkdv_d * D + K->dkdv_c, dkdv);
    void *dqp[] = {&dout, &q, &k, &v, &lse, &dt, &qpos, &kpos, &dq, &B, &H, &KH, &T, &S, &D, &causal, &window, &scale};
    launch(ctx, attn_kernel(K, K->dq, D, name, sizeof name), min64(B * H * ceil_div(T, K->dq_rows), GRID_X_MAX), 1,
           K->block, K->dq_d * D + K->dq_c, dqp);
}

void rtk_attention(rt_ctx *ctx, const int64_t *a) { attention_fwd(ctx, &attn_plain, a); }
void rtk_attention_bwd(rt_ctx *ctx, const int64_t *a) { attention_bwd(ctx, &attn_plain, a); }
void rtk_attention_tc(rt_ctx *ctx, const int64_t *a) { attention_fwd(ctx, &attn_tc, a); }
void rtk_attention_bwd_tc(rt_ctx *ctx, const int64_t *a) { attention_bwd(ctx, &attn_tc, a); }

/* ---- misc.cu ---- */

/* args: o_a, lse_a, o_b, lse_b, o, lse, rows, D, dt; a warp per row, 8 a block */
void rtk_attn_merge(rt_ctx *ctx, const int64_t *a) {
    CUdeviceptr o_a = dptr(a[0]), lse_a = dptr(a[1]), o_b = dptr(a[2]), lse_b = dptr(a[3]), o = dptr(a[4]),
                lse = dptr(a[5]);
    long long rows = a[6], D = a[7];
    int dt = (int)a[8];
    if (float_dtype(ctx, "attn_merge", "o", a[8])) return;
    void *params[] = {&o_a, &lse_a, &o_b, &lse_b, &o, &lse, &rows, &D, &dt};
    launch(ctx, "kiln_attn_merge", min64(ceil_div(rows, BLOCK / 32), GRID_X_MAX), 1, BLOCK, 0, params);
}

/* args: x, y, rows, C, dt */
void rtk_softmax(rt_ctx *ctx, const int64_t *a) {
    CUdeviceptr x = dptr(a[0]), y = dptr(a[1]);
    long long rows = a[2], C = a[3];
    int dt = (int)a[4];
    if (float_dtype(ctx, "softmax", "x", a[4])) return;
    void *params[] = {&x, &y, &rows, &C, &dt};
    launch(ctx, "kiln_softmax", grid_rows(rows), 1, BLOCK, 0, params);
}

/* args: dy, y, dx, rows, C, dt */
void rtk_softmax_bwd(rt_ctx *ctx, const int64_t *a) {
    CUdeviceptr dy = dptr(a[0]), y = dptr(a[1]), dx = dptr(a[2]);
    long long rows = a[3], C = a[4];
    int dt = (int)a[5];
    if (float_dtype(ctx, "softmax_bwd", "y", a[5])) return;
    void *params[] = {&dy, &y, &dx, &rows, &C, &dt};
    launch(ctx, "kiln_softmax_bwd", grid_rows(rows), 1, BLOCK, 0, params);
}

/* args: x, y, outer, n, inner, kind, dtx, dty; one thread per output */
void rtk_reduce(rt_ctx *ctx, const int64_t *a) {
    CUdeviceptr x = dptr(a[0]), y = dptr(a[1]);
    long long outer = a[2], n = a[3], inner = a[4];
    int kind = (int)a[5], dtx = (int)a[6], dty = (int)a[7];
    if (a[5] < 0 || a[5] > 2) {
        rt_fail(ctx, "%s: reduce: unknown kind %lld (0 sum, 1 mean, 2 max)", rtc_launch_name(ctx), (long long)a[5]);
        return;
    }
    if (float_dtype(ctx, "reduce", "x", a[6]) || float_dtype(ctx, "reduce", "y", a[7])) return;
    void *params[] = {&x, &y, &outer, &n, &inner, &kind, &dtx, &dty};
    launch(ctx, "kiln_reduce", grid_elems(outer * inner), 1, BLOCK, 0, params);
}

/* args: dy, x, y, dx, outer, n, inner, dt; a thread per (outer, inner) column */
void rtk_max_bwd(rt_ctx *ctx, const int64_t *a) {
    CUdeviceptr dy = dptr(a[0]), x = dptr(a[1]), y = dptr(a[2]), dx = dptr(a[3]);
    long long outer = a[4], n = a[5], inner = a[6];
    int dt = (int)a[7];
    if (float_dtype(ctx, "max_bwd", "x", a[7])) return;
    void *params[] = {&dy, &x, &y, &dx, &outer, &n, &inner, &dt};
    launch(ctx, "kiln_max_bwd", grid_elems(outer * inner), 1, BLOCK, 0, params);
}

/* args: x, out, n, dtx.  kiln_sumsq leaves one partial sum per block in
 * scratch, kiln_sumsq_final adds them (n = 0 too: out = 0). */
void rtk_sumsq(rt_ctx *ctx, const int64_t *a) {
    CUdeviceptr x = dptr(a[0]), out = dptr(a[1]);
    long long n = a[2];
    int dt = (int)a[3];
    if (float_dtype(ctx, "sumsq", "x", a[3])) return;
    long long parts = min64(ceil_div(n, 2048), 1024);
    if (parts < 1) parts = 1;
    CUdeviceptr partial;
    if (scratch(ctx, parts * 4, &partial)) return;
    void *blocks[] = {&x, &partial, &n, &dt};
    launch(ctx, "kiln_sumsq", parts, 1, BLOCK, 0, blocks);
    void *final[] = {&partial, &out, &parts};
    launch(ctx, "kiln_sumsq_final", 1, 1, BLOCK, 0, final);
}

/* args: norm, out, max */
void rtk_clipscale(rt_ctx *ctx, const int64_t *a) {
    CUdeviceptr norm = dptr(a[0]), out = dptr(a[1]);
    double max = rt_bits_f64(a[2]);
    void *params[] = {&norm, &out, &max};
    launch(ctx, "kiln_clipscale", 1, 1, 1, 0, params);
}

/* args: t, out, schedule.  The kernel reads the device copy of the
 * schedule (rtc_schedule, refreshed before every step), never a[2], which
 * is the host's table. */
void rtk_lr_cosine(rt_ctx *ctx, const int64_t *a) {
    CUdeviceptr t = dptr(a[0]), out = dptr(a[1]), sched = rtc_schedule(ctx);
    if (!sched) {
        rt_fail(ctx, "%s: lr_cosine: the program has no learning-rate schedule on the device", rtc_launch_name(ctx));
        return;
    }
    void *params[] = {&t, &out, &sched};
    launch(ctx, "kiln_lr_cosine", 1, 1, 1, 0, params);
}

/* A copy whose innermost dim is contiguous on both sides moves w elements
 * at a time as one of w * eb bytes (up to 16: one vector load and store a
 * thread) when every stride, the innermost length and both addresses allow
 * it: a [.., D] bf16 row of a transpose, slice or concat moves 16 bytes a
 * thread instead of 2 (the same bytes land in the same places).  The
 * innermost dim is the last of size > 1. */
static void copy_widen(CUdeviceptr src, CUdeviceptr dst, long long *eb, long long *d, long long *ss, long long *ds) {
    int last = -1;
    for (int k = 0; k < 5; k++)
        if (d[k] > 1) last = k;
    if (last < 0 || ss[last] != 1 || ds[last] != 1) return;
    long long w = 16 / *eb;
    for (; w > 1; w /= 2) {
        int ok = 16 % (*eb * w) == 0 && d[last] % w == 0 && src % (CUdeviceptr)(*eb * w) == 0 &&
                 dst % (CUdeviceptr)(*eb * w) == 0;
        for (int k = 0; k < 5 && ok; k++)
            if (k != last && d[k] > 1) ok = ss[k] % w == 0 && ds[k] % w == 0;
        if (ok) break;
    }
    if (w <= 1) return;
    for (int k = 0; k < 5; k++) {
        if (k == last) d[k] /= w;
        else ss[k] /= w, ds[k] /= w; /* a dim of size 1 drops out whatever its strides */
    }
    *eb *= w;
}

/* args: src, dst, elem_bytes, rank, d0..d4, ss0..ss4, ds0..ds4.  The dims
 * past rank are passed as 1 with strides 0, whatever the args hold. */
void rtk_copy(rt_ctx *ctx, const int64_t *a) {
    CUdeviceptr src = dptr(a[0]), dst = dptr(a[1]);
    long long eb = a[2], d[5], ss[5], ds[5], total = 1;
    int rank = (int)a[3];
    if (eb < 1) { /* 1, 2, 4 and 8 bytes move as integers, any other size byte by byte */
        rt_fail(ctx, "%s: copy: element size %lld bytes", rtc_launch_name(ctx), eb);
        return;
    }
    if (a[3] < 0 || a[3] > 5) {
        rt_fail(ctx, "%s: copy: rank %lld outside 0..5", rtc_launch_name(ctx), (long long)a[3]);
        return;
    }
    for (int k = 0; k < 5; k++) {
        d[k] = k < rank ? a[4 + k] : 1;
        ss[k] = k < rank ? a[9 + k] : 0;
        ds[k] = k < rank ? a[14 + k] : 0;
    }
    copy_widen(src, dst, &eb, d, ss, ds);
    for (int k = 0; k < 5; k++) total *= d[k];
    void *params[] = {&src, &dst, &eb, &rank, &d[0], &d[1], &d[2], &d[3], &d[4], &ss[0], &ss[1], &ss[2], &ss[3], &ss[4],
                      &ds[0], &ds[1], &ds[2], &ds[3], &ds[4]};
    launch(ctx, "kiln_copy", grid_elems(total), 1, BLOCK, 0, params);
}

/* When the summed dims come first and the kept ones after them, with y
 * contiguous over those, x is [R, K] and y [K]: 1 and R, K; else 0. */
static int sumto_as_rows(const long long *d, const long long *ys, long long *R, long long *K) {
    int k = 0;
    *R = 1;
    for (; k < 5 && (ys[k] == 0 || d[k] == 1); k++) *R *= d[k];
    *K = 1;
    for (int j = 4; j >= k; j--) {
        if (d[j] == 1) continue;
        if (ys[j] != *K) return 0;
        *K *= d[j];
    }
    return 1;
}

/* x [R, K] -> y [K]: kiln_sumto_rows sums parts of rows into scratch,
 * kiln_sumto_parts adds the parts in order (the compiler's
 * emit_cuda_scratch reserves parts * K * 4 bytes for every sumto). */
static void sumto_rows(rt_ctx *ctx, CUdeviceptr x, CUdeviceptr y, int dtx, int dty, long long R, long long K) {
    long long parts = min64(ceil_div(R, SUMTO_ROWS), SUMTO_PARTS), rpp;
    if (parts < 1) parts = 1;
    rpp = ceil_div(R, parts);
    CUdeviceptr part;
    if (scratch(ctx, parts * K * 4, &part)) return;
    void *rows[] = {&x, &part, &dtx, &R, &K, &rpp, &parts};
    launch(ctx, "kiln_sumto_rows", min64(ceil_div(K, 32), GRID_X_MAX), parts, BLOCK, 0, rows);
    void *sum[] = {&part, &y, &dty, &parts, &K};
    launch(ctx, "kiln_sumto_parts", grid_elems(K), 1, BLOCK, 0, sum);
}

/* args: x, y, rank, d0..d4, ys0..ys4, dtx, dty; one thread per output (the
 * dims with a nonzero y stride), or sumto_rows.  Dims past rank: 1, stride 0. */
void rtk_sumto(rt_ctx *ctx, const int64_t *a) {
    CUdeviceptr x = dptr(a[0]), y = dptr(a[1]);
    int rank = (int)a[2], dtx = (int)a[13], dty = (int)a[14];
    long long d[5], ys[5], outputs = 1;
    if (a[2] < 0 || a[2] > 5) {
        rt_fail(ctx, "%s: sumto: rank %lld outside 0..5", rtc_launch_name(ctx), (long long)a[2]);
        return;
    }
    if (float_dtype(ctx, "sumto", "x", a[13]) || float_dtype(ctx, "sumto", "y", a[14])) return;
    for (int k = 0; k < 5; k++) {
        d[k] = k < rank ? a[3 + k] : 1;
        ys[k] = k < rank ? a[8 + k] : 0;
        if (ys[k] != 0) outputs *= d[k];
    }
    long long R, K;
    if (outputs > 0 && sumto_as_rows(d, ys, &R, &K)) {
        sumto_rows(ctx, x, y, dtx, dty, R, K);
        return;
    }
    void *params[] = {&x,    &y,    &dtx,  &dty,  &rank,  &d[0],  &d[1], &d[2],
                      &d[3], &d[4], &ys[0], &ys[1], &ys[2], &ys[3], &ys[4]};
    launch(ctx, "kiln_sumto", grid_elems(outputs), 1, BLOCK, 0, params);
}

/* args: dst, n, value(bits), dtype (f32, bf16 or i32) */
void rtk_fill(rt_ctx *ctx, const int64_t *a) {
    CUdeviceptr dst = dptr(a[0]);
    long long n = a[1];
    double value = rt_bits_f64(a[2]);
    int dt = (int)a[3];
    if (a[3] != RT_F32 && a[3] != RT_BF16 && a[3] != RT_I32) {
        rt_fail(ctx, "%s: fill: dtype %s (%lld) is not supported on CUDA (f32, bf16 or i32)", rtc_launch_name(ctx),
                dtype_name(a[3]), (long long)a[3]);
        return;
    }
    void *params[] = {&dst, &n, &value, &dt};
    launch(ctx, "kiln_fill", grid_elems(n), 1, BLOCK, 0, params);
}

/* args: dst, n */
void rtk_iota(rt_ctx *ctx, const int64_t *a) {
    CUdeviceptr dst = dptr(a[0]);
    long long n = a[1];
    void *params[] = {&dst, &n};
    launch(ctx, "kiln_iota", grid_elems(n), 1, BLOCK, 0, params);
}

/* ---- copies and generated kernels ---- */

/* args: dst, src, bytes (nothing for 0 bytes or dst == src) */
void rtk_memcpy(rt_ctx *ctx, const int64_t *a) {
    CUdeviceptr dst = dptr(a[0]), src = dptr(a[1]);
    int64_t bytes = a[2];
    if (bytes <= 0 || dst == src) return;
    RTC_CHECK(ctx, cuMemcpyDtoDAsync(dst, src, (size_t)bytes, rtc_stream(ctx)));
}

/* args: kernel, nptrs, n, ptr...  The generated kernel's params are the
 * pointers, then `long long n`; it walks the n elements with a grid
 * stride, 8 per thread and iteration (emit_cuda.c's vector loop), so the
 * grid is ceil(n/(256*8)) blocks capped like misc.cu's. */
void rtk_fused(rt_ctx *ctx, const int64_t *a) {
    long long n = a[2];
    int64_t nptrs = a[1];
    if (n <= 0) return;
    if (nptrs < 0 || nptrs > FUSED_MAX_PTRS) {
        rt_fail(ctx, "%s: fused kernel %lld: %lld pointer params (at most %d)", rtc_launch_name(ctx), (long long)a[0],
                (long long)nptrs, FUSED_MAX_PTRS);
        return;
    }
    CUfunction f = rtc_generated(ctx, a[0]);
    if (!f) return; /* rtc_generated has failed the step */
    CUdeviceptr ptrs[FUSED_MAX_PTRS];
    void *params[FUSED_MAX_PTRS + 1];
    for (int64_t i = 0; i < nptrs; i++) {
        ptrs[i] = dptr(a[3 + i]);
        params[i] = &ptrs[i];
    }
    params[nptrs] = &n;
    rtc_launch(ctx, f, grid_elems(ceil_div(n, 8)), 1, BLOCK, 0, params);
}

/* ---- GEMM on cuBLASLt ---- */

/* What decides a plan: the shape after folding, C's dtype and the operands'
 * alignments (what the heuristic's choice depends on), per context. */
typedef struct {
    rt_ctx *ctx;
    int64_t batch, M, N, K, sA, sB, sC;
    int ta, tb, dtC;
    uint32_t alignA, alignB, alignC;
    uint32_t epilogue;  /* 0: none; else the cublasLtEpilogue_t (BIAS, GELU_AUX_BIAS, DGELU_BGRAD, BGRADA, BGRADB) */
    uint32_t alignBias; /* the bias (or bias gradient) vector's alignment, 0 without */
    uint32_t alignAux;  /* the aux matrix's alignment (GELU_AUX_BIAS's output, DGELU_BGRAD's input), 0 without */
} GemmKey;

/* What a launcher asks of the epilogue: the cublasLtEpilogue_t (0: none),
 * the BIAS_POINTER (the bias, or where the bias gradient goes) and the
 * EPILOGUE_AUX_POINTER. */
typedef struct {
    uint32_t ep;
    CUdeviceptr bias, aux;
} Epi;

/* lt_a / lt_b are cuBLASLt's first and second operands: our B and our A. */
typedef struct {
    GemmKey key;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t lt_a, lt_b, lt_c;
    cublasLtMatmulAlgo_t algo;
    size_t workspace; /* what the algorithm needs */
} GemmPlan;

static struct {
    pthread_mutex_t lock;
    GemmPlan *plans;
    int n, cap;
} gemm_cache = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* The table is shared by every context of the process; a lock that fails
 * is a broken process, not a bad step. */
static void cache_lock(int lock) {
    int e = lock ? pthread_mutex_lock(&gemm_cache.lock) : pthread_mutex_unlock(&gemm_cache.lock);
    if (e) {
        fprintf(stderr, "kiln: %s of the GEMM plan table: %s\n", lock ? "lock" : "unlock", strerror(e));
        abort();
    }
}

static int key_equal(const GemmKey *x, const GemmKey *y) {
    return x->ctx == y->ctx && x->batch == y->batch && x->M == y->M && x->N == y->N && x->K == y->K &&
           x->sA == y->sA && x->sB == y->sB && x->sC == y->sC && x->ta == y->ta && x->tb == y->tb &&
           x->dtC == y->dtC && x->alignA == y->alignA && x->alignB == y->alignB && x->alignC == y->alignC &&
           x->epilogue == y->epilogue && x->alignBias == y->alignBias && x->alignAux == y->alignAux;
}

/* A failed cuBLASLt call fails the step, naming the function (the call's
 * text up to its parenthesis): 0 on success, else -1. */
static int lt_ok(rt_ctx *ctx, cublasStatus_t st, const char *call) {
    if (st == CUBLAS_STATUS_SUCCESS) return 0;
    rt_fail(ctx, "%s: %.*s: %s", rtc_launch_name(ctx), (int)strcspn(call, "("), call, cublasLtGetStatusString(st));
    return -1;
}
#define LT_OK(ctx, call) lt_ok((ctx), (call), #call)

/* The alignment in bytes (at most 256) that every batch entry's matrix
 * has: the lowest set bit of its address and of its batch stride. */
static uint32_t operand_align(CUdeviceptr p, int64_t stride_bytes, int64_t batch) {
    uint64_t bits = (uint64_t)p | (batch > 1 ? (uint64_t)stride_bytes : 0) | 256;
    return (uint32_t)(bits & -bits);
}

/* Destroy what a plan holds (NULL members are skipped).  The first failing
 * status, or success. */
static cublasStatus_t plan_destroy(GemmPlan *p) {
    cublasStatus_t first = CUBLAS_STATUS_SUCCESS, st;
    cublasLtMatrixLayout_t layouts[3] = {p->lt_a, p->lt_b, p->lt_c};
    for (int i = 0; i < 3; i++) {
        if (!layouts[i]) continue;
        st = cublasLtMatrixLayoutDestroy(layouts[i]);
        if (first == CUBLAS_STATUS_SUCCESS) first = st;
    }
    if (p->op) {
        st = cublasLtMatmulDescDestroy(p->op);
        if (first == CUBLAS_STATUS_SUCCESS) first = st;
    }
    p->lt_a = p->lt_b = p->lt_c = NULL;
    p->op = NULL;
    return first;
}

/* A column-major rows x cols layout with leading dim rows, batched. */
static int layout_new(rt_ctx *ctx, cublasLtMatrixLayout_t *l, cudaDataType_t type, int64_t rows, int64_t cols,
                      int64_t batch, int64_t stride) {
    if (LT_OK(ctx, cublasLtMatrixLayoutCreate(l, type, (uint64_t)rows, (uint64_t)cols, rows))) return -1;
    if (batch == 1) return 0;
    int32_t count = (int32_t)batch;
    if (LT_OK(ctx, cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count)))
        return -1;
    return LT_OK(ctx, cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                      sizeof stride));
}

/* The preference for k's heuristic: the workspace, and the alignments
 * when some operand is below cuBLASLt's default assumption of 256 bytes. */
static int preference_new(rt_ctx *ctx, cublasLtMatmulPreference_t *pref, const GemmKey *k, size_t workspace) {
    if (LT_OK(ctx, cublasLtMatmulPreferenceCreate(pref))) return -1;
    uint64_t ws = workspace;
    if (LT_OK(ctx, cublasLtMatmulPreferenceSetAttribute(*pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                        sizeof ws)))
        return -1;
    if (k->alignA == 256 && k->alignB == 256 && k->alignC == 256) return 0;
    /* cuBLASLt's A is our B, its B our A; C and D are both our C */
    const struct {
        cublasLtMatmulPreferenceAttributes_t attr;
        uint32_t align;
    } aligns[4] = {{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, k->alignB},
                   {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, k->alignA},
                   {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, k->alignC},
                   {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, k->alignC}};
    for (int i = 0; i < 4; i++)
        if (LT_OK(ctx, cublasLtMatmulPreferenceSetAttribute(*pref, aligns[i].attr, &aligns[i].align,
                                                            sizeof aligns[i].align)))
            return -1;
    return 0;
}

/* The bias of rtk_gemm_bias: cuBLASLt's BIAS epilogue adds bias[r] to row r
 * of its column-major D, our C^T [N, M]: bias[n] along our last dim.  Its
 * heuristic reads the pointer's alignment, so the pointer is set before it
 * and again before every call (the plan is shared by every call of its
 * shape). */
static int set_bias(rt_ctx *ctx, cublasLtMatmulDesc_t op, CUdeviceptr bias) {
    const void *b = (const void *)(uintptr_t)bias;
    return LT_OK(ctx, cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &b, sizeof b));
}
static CUdeviceptr plan_bias; /* the bias pointer a new plan's heuristic sees (under the cache lock) */

/* The aux output of rtk_gemm_bias_gelu (GELU_AUX_BIAS): the pre-activation
 * matrix, laid out as D (column-major [N, M], leading dimension N, which
 * the header wants a multiple of 8), D's type (AUX_DATA_TYPE left at -1).
 * Set like the bias: before the heuristic and before every call. */
static int set_aux(rt_ctx *ctx, cublasLtMatmulDesc_t op, CUdeviceptr aux) {
    void *x = (void *)(uintptr_t)aux;
    return LT_OK(ctx, cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &x, sizeof x));
}
static CUdeviceptr plan_aux; /* as plan_bias, for the aux pointer */

/* The descriptors of plan p for its key (see the essay for the mapping). */
static int plan_descriptors(rt_ctx *ctx, GemmPlan *p) {
    const GemmKey *k = &p->key;
    if (LT_OK(ctx, cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F))) return -1;
    int32_t trans_a = k->tb ? CUBLAS_OP_T : CUBLAS_OP_N, trans_b = k->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (LT_OK(ctx, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof trans_a)) ||
        LT_OK(ctx, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof trans_b)))
        return -1;
    if (k->epilogue) {
        uint32_t ep = k->epilogue;
        if (LT_OK(ctx, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep)) ||
            set_bias(ctx, p->op, plan_bias))
            return -1;
        int64_t ld = k->N;
        if (k->alignAux && (set_aux(ctx, p->op, plan_aux) ||
                            LT_OK(ctx, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld))))
            return -1;
    }
    /* our B: row-major [K, N] is column-major [N, K] (tb: [N, K] -> [K, N]) */
    int64_t b_rows = k->tb ? k->K : k->N, b_cols = k->tb ? k->N : k->K;
    /* our A: row-major [M, K] is column-major [K, M] (ta: [K, M] -> [M, K]) */
    int64_t a_rows = k->ta ? k->M : k->K, a_cols = k->ta ? k->K : k->M;
    cudaDataType_t c_type = k->dtC == RT_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    if (layout_new(ctx, &p->lt_a, CUDA_R_16BF, b_rows, b_cols, k->batch, k->sB) ||
        layout_new(ctx, &p->lt_b, CUDA_R_16BF, a_rows, a_cols, k->batch, k->sA) ||
        layout_new(ctx, &p->lt_c, c_type, k->N, k->M, k->batch, k->sC))
        return -1;
    return 0;
}

/* The best algorithm for p's descriptors within `workspace` bytes. */
static int plan_algorithm(rt_ctx *ctx, GemmPlan *p, size_t workspace) {
    const GemmKey *k = &p->key;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t result;
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    int found = 0, rc = preference_new(ctx, &pref, k, workspace);
    if (rc == 0) {
        memset(&result, 0, sizeof result);
        st = cublasLtMatmulAlgoGetHeuristic(rtc_cublaslt(ctx), p->op, p->lt_a, p->lt_b, p->lt_c, p->lt_c, pref, 1,
                                            &result, &found);
        if (st != CUBLAS_STATUS_NOT_SUPPORTED) /* NOT_SUPPORTED: no algorithm, reported below */
            rc = lt_ok(ctx, st, "cublasLtMatmulAlgoGetHeuristic");
    }
    if (pref && LT_OK(ctx, cublasLtMatmulPreferenceDestroy(pref))) rc = -1;
    if (rc) return -1;
    if (st == CUBLAS_STATUS_NOT_SUPPORTED || found < 1 || result.state != CUBLAS_STATUS_SUCCESS) {
        rt_fail(ctx, "%s: gemm: cuBLASLt has no algorithm for batch %lld M %lld N %lld K %lld ta %d tb %d -> %s",
                rtc_launch_name(ctx), (long long)k->batch, (long long)k->M, (long long)k->N, (long long)k->K, k->ta,
                k->tb, dtype_name(k->dtC));
        return -1;
    }
    p->algo = result.algo;
    p->workspace = result.workspaceSize;
    return 0;
}

/* The plan for key k, made (descriptors and heuristic) on its first use.
 * NULL after rt_fail.  Call with the cache locked. */
static const GemmPlan *plan_for(rt_ctx *ctx, const GemmKey *k, size_t workspace) {
    for (int i = 0; i < gemm_cache.n; i++)
        if (key_equal(&gemm_cache.plans[i].key, k)) return &gemm_cache.plans[i];
    GemmPlan p = {.key = *k};
    if (plan_descriptors(ctx, &p) || plan_algorithm(ctx, &p, workspace)) {
        plan_destroy(&p); /* a failure here would only repeat the one reported */
        return NULL;
    }
    if (gemm_cache.n == gemm_cache.cap) {
        int cap = gemm_cache.cap ? 2 * gemm_cache.cap : 32;
        GemmPlan *plans = realloc(gemm_cache.plans, (size_t)cap * sizeof *plans);
        if (!plans) {
            rt_fail(ctx, "%s: gemm: out of host memory for the cuBLASLt plans", rtc_launch_name(ctx));
            plan_destroy(&p);
            return NULL;
        }
        gemm_cache.plans = plans;
        gemm_cache.cap = cap;
    }
    gemm_cache.plans[gemm_cache.n] = p;
    return &gemm_cache.plans[gemm_cache.n++];
}

void rtc_kernels_free(rt_ctx *ctx) {
    cache_lock(1);
    int kept = 0;
    for (int i = 0; i < gemm_cache.n; i++) {
        GemmPlan *p = &gemm_cache.plans[i];
        if (p->key.ctx != ctx) {
            gemm_cache.plans[kept++] = *p;
            continue;
        }
        cublasStatus_t st = plan_destroy(p);
        if (st != CUBLAS_STATUS_SUCCESS)
            fprintf(stderr, "kiln: freeing a cuBLASLt plan: %s\n", cublasLtGetStatusString(st));
    }
    gemm_cache.n = kept;
    if (kept == 0) {
        free(gemm_cache.plans);
        gemm_cache.plans = NULL;
        gemm_cache.cap = 0;
    }
    cache_lock(0);
}

/* K = 0: C = 0 when beta is 0 (cuBLASLt is not asked about an empty sum). */
static void gemm_zero(rt_ctx *ctx, CUdeviceptr C, const GemmKey *k, double beta) {
    if (beta != 0) return;
    int64_t esz = k->dtC == RT_BF16 ? 2 : 4, bytes = k->M * k->N * esz;
    if (k->batch == 1 || k->sC == k->M * k->N) {
        RTC_CHECK(ctx, cuMemsetD8Async(C, 0, (size_t)(k->batch * bytes), rtc_stream(ctx)));
        return;
    }
    for (int64_t b = 0; b < k->batch; b++) {
        CUresult r = cuMemsetD8Async(C + (CUdeviceptr)(b * k->sC * esz), 0, (size_t)bytes, rtc_stream(ctx));
        if (r != CUDA_SUCCESS) {
            rt_fail(ctx, "%s: cuMemsetD8Async: %s", rtc_launch_name(ctx), rtc_error_string(r));
            return;
        }
    }
}

/* The shape and operand rules of epilogue x (after the batch fold), as
 * cuBLASLt states them (docs/decisions.md, "Backward GEMM epilogues"):
 * 0, or -1 after rt_fail. */
static int epilogue_fits(rt_ctx *ctx, const GemmKey *k, double beta, const Epi *x) {
    const char *name = x->ep == CUBLASLT_EPILOGUE_BIAS            ? "BIAS"
                       : x->ep == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ? "GELU_AUX_BIAS"
                       : x->ep == CUBLASLT_EPILOGUE_DGELU_BGRAD   ? "DGELU_BGRAD"
                       : x->ep == CUBLASLT_EPILOGUE_BGRADA        ? "BGRADA"
                                                                  : "BGRADB";
    int bgrad = x->ep == CUBLASLT_EPILOGUE_BGRADA || x->ep == CUBLASLT_EPILOGUE_BGRADB;
    const char *why = NULL;
    if (beta != 0 || k->K <= 0) why = "beta 0 and K > 0";
    else if (!bgrad && k->dtC != RT_BF16) why = "a bf16 C";
    else if ((x->aux || bgrad) && k->batch != 1) why = "one batch";
    else if (x->aux && k->N % 8) why = "N a multiple of 8 (AUX_LD)";
    else if (x->ep == CUBLASLT_EPILOGUE_BGRADA && k->tb) why = "B not transposed (cuBLASLt's A)";
    else if (x->ep == CUBLASLT_EPILOGUE_BGRADB && !k->ta) why = "A transposed (cuBLASLt's B)";
    if (!why) return 0;
    rt_fail(ctx, "%s: gemm %s: batch %lld M %lld N %lld K %lld ta %d tb %d C %s beta %g (the epilogue here needs %s)",
            rtc_launch_name(ctx), name, (long long)k->batch, (long long)k->M, (long long)k->N, (long long)k->K, k->ta, k->tb,
            dtype_name(k->dtC), beta, why);
    return -1;
}

/* args: A, B, C, batch, M, N, K, ta, tb, strideA, strideB, strideC,
 * beta(bits), dtA, dtB, dtC; x: the epilogue (x->ep 0: none) */
static void gemm_run(rt_ctx *ctx, const int64_t *a, const Epi *x) {
    CUdeviceptr bias = x->bias, aux = x->aux;
    CUdeviceptr A = dptr(a[0]), B = dptr(a[1]), C = dptr(a[2]);
    GemmKey k = {.ctx = ctx, .batch = a[3], .M = a[4], .N = a[5], .K = a[6], .ta = a[7] != 0, .tb = a[8] != 0,
                 .sA = a[9], .sB = a[10], .sC = a[11], .dtC = (int)a[15]};
    double beta = rt_bits_f64(a[12]);
    if (a[13] != RT_BF16 || a[14] != RT_BF16 || (a[15] != RT_BF16 && a[15] != RT_F32)) {
        rt_fail(ctx, "%s: gemm: %s x %s -> %s is not supported on CUDA (bf16 x bf16 -> bf16 or f32)",
                rtc_launch_name(ctx), dtype_name(a[13]), dtype_name(a[14]), dtype_name(a[15]));
        return;
    }
    if (k.batch <= 0 || k.M <= 0 || k.N <= 0) return;
    if (k.batch > 1 && k.sC == 0) {
        rt_fail(ctx, "%s: gemm: a batch of %lld products into one C (stride 0)", rtc_launch_name(ctx),
                (long long)k.batch);
        return;
    }
    if (k.batch > INT32_MAX) {
        rt_fail(ctx, "%s: gemm: batch %lld is above cuBLASLt's limit", rtc_launch_name(ctx), (long long)k.batch);
        return;
    }
    if (k.batch > 1 && k.sB == 0 && !k.ta && k.sA == k.M * k.K && k.sC == k.M * k.N) { /* [batch*M, K] x B */
        k.M *= k.batch;
        k.batch = 1;
    }
    if (k.batch == 1) k.sA = k.sB = k.sC = 0;
    if (x->ep && epilogue_fits(ctx, &k, beta, x)) return;
    if (k.K <= 0) {
        gemm_zero(ctx, C, &k, beta);
        return;
    }
    k.epilogue = x->ep;
    if (bias) k.alignBias = operand_align(bias, 0, 1);
    if (aux) k.alignAux = operand_align(aux, 0, 1);
    k.alignA = operand_align(A, k.sA * 2, k.batch);
    k.alignB = operand_align(B, k.sB * 2, k.batch);
    k.alignC = operand_align(C, k.sC * (k.dtC == RT_BF16 ? 2 : 4), k.batch);

    size_t ws_bytes = 0;
    CUdeviceptr ws = rtc_gemm_workspace(ctx, &ws_bytes);
    cache_lock(1);
    plan_bias = bias, plan_aux = aux;
    const GemmPlan *p = plan_for(ctx, &k, ws_bytes);
    GemmPlan plan;
    if (p) plan = *p; /* a copy: the table may grow once unlocked */
    cache_lock(0);
    if (!p) return;
    if (plan.workspace > ws_bytes) {
        rt_fail(ctx, "%s: gemm: the algorithm needs %zu bytes of workspace, the stream has %zu", rtc_launch_name(ctx),
                plan.workspace, ws_bytes);
        return;
    }
    if (bias && set_bias(ctx, plan.op, bias)) return;
    if (aux && set_aux(ctx, plan.op, aux)) return;
    const float alpha = 1.0f, beta_f = (float)beta;
    void *c = (void *)(uintptr_t)C;
    LT_OK(ctx, cublasLtMatmul(rtc_cublaslt(ctx), plan.op, &alpha, (const void *)(uintptr_t)B, plan.lt_a,
                              (const void *)(uintptr_t)A, plan.lt_b, &beta_f, c, plan.lt_c, c, plan.lt_c, &plan.algo,
                              (void *)(uintptr_t)ws, ws_bytes, rtc_stream(ctx)));
}

void rtk_gemm(rt_ctx *ctx, const int64_t *a) {
    Epi none = {0, 0, 0};
    gemm_run(ctx, a, &none);
}

/* args: rtk_gemm's 16, then bias (C's dtype, [N]) */
void rtk_gemm_bias(rt_ctx *ctx, const int64_t *a) {
    if (!a[16]) {
        rt_fail(ctx, "%s: gemm_bias: no bias vector", rtc_launch_name(ctx));
        return;
    }
    Epi x = {CUBLASLT_EPILOGUE_BIAS, dptr(a[16]), 0};
    gemm_run(ctx, a, &x);
}

/* args: rtk_gemm's 16, then bias (C's dtype, [N]), aux (C's dtype and
 * shape: the pre-activation; C gets its GELU, tanh form) */
void rtk_gemm_bias_gelu(rt_ctx *ctx, const int64_t *a) {
    if (!a[16] || !a[17]) {
        rt_fail(ctx, "%s: gemm_bias_gelu: no %s", rtc_launch_name(ctx), a[16] ? "aux matrix" : "bias vector");
        return;
    }
    Epi x = {CUBLASLT_EPILOGUE_GELU_AUX_BIAS, dptr(a[16]), dptr(a[17])};
    gemm_run(ctx, a, &x);
}

/* args: rtk_gemm's 16, then aux (the pre-activation, C's dtype and shape:
 * DGELU_BGRAD's input), db (C's dtype, [N]: the bias gradient) */
void rtk_gemm_dgelu_bgrad(rt_ctx *ctx, const int64_t *a) {
    if (!a[16] || !a[17]) {
        rt_fail(ctx, "%s: gemm_dgelu_bgrad: no %s", rtc_launch_name(ctx), a[16] ? "bias gradient vector" : "aux matrix");
        return;
    }
    Epi x = {CUBLASLT_EPILOGUE_DGELU_BGRAD, dptr(a[17]), dptr(a[16])};
    gemm_run(ctx, a, &x);
}

/* args: rtk_gemm's 16, then db (C's dtype), of_b: 1 the sum over K of our
 * B (cuBLASLt's A: BGRADA, db[N]), 0 of our A (its B: BGRADB, db[M]) */
void rtk_gemm_bgrad(rt_ctx *ctx, const int64_t *a) {
    if (!a[16]) {
        rt_fail(ctx, "%s: gemm_bgrad: no bias gradient vector", rtc_launch_name(ctx));
        return;
    }
    Epi x = {a[17] ? CUBLASLT_EPILOGUE_BGRADA : CUBLASLT_EPILOGUE_BGRADB, dptr(a[16]), 0};
    gemm_run(ctx, a, &x);
}
