/* layernorm.cu — layernorm forward and backward on bf16 rows (ops.def
 * layernorm, layernorm_bwd; CPU twin kernels/cpu/norm.c).
 *
 * x is seen as `rows` rows of its last dim C.  One block of KILN_BLOCK
 * threads handles a row at a time; thread k owns columns k, k+256, ...
 *
 *   forward:  mean, var = biased variance (two passes, as the twin: no
 *             cancellation), rstd = 1/sqrt(var + eps), y = (x-mean)*rstd*w + b
 *             (b null: no bias, issue 17)
 *   backward: xhat = (x-mean)*rstd, g = dy*w (statistics recomputed from x:
 *             the op saves nothing),
 *             dx = rstd*(g - mean(g) - xhat*mean(g*xhat)), dw = sum dy*xhat,
 *             db = sum dy over the rows.
 *
 * The weight gradients are sums over every row, kept deterministic without
 * atomics: the rows are cut into parts = min(rows, KILN_NORM_PARTS) fixed
 * contiguous ranges (as the twin's NORM_PARTS); block p sums its range's
 * dw, db into f32 accumulators in shared memory (each thread its own
 * columns, so no races) and writes them to row p of the scratch `partial`;
 * kiln_layernorm_bwd_reduce then adds the parts up in part order.  Both
 * kernels derive `parts` from `rows`, so any grid gives the same bits.
 *
 * Rows of C = 256*k (k <= 4 forward, <= 3 backward) with 16-byte aligned
 * arrays take the warp-per-row paths below (one read of each input, 16-byte
 * loads); other shapes the block-per-row loops.
 *
 * The statistics are f32 block sums (the twin uses double): results agree
 * to f32 rounding, far inside bf16's.
 */
#include "common.cuh"

/* (mean, 1/sqrt(biased var + eps)) of the row x[0..C) */
static __device__ float2 ln_row_stats(const __nv_bfloat16 *x, long long C, float eps) {
    float s = 0.0f;
    for (long long i = threadIdx.x; i < C; i += blockDim.x) s += kiln_ld(x, i);
    float mean = kiln_block_sum(s) / (float)C;
    float q = 0.0f;
    for (long long i = threadIdx.x; i < C; i += blockDim.x) {
        float d = kiln_ld(x, i) - mean;
        q += d * d;
    }
    float var = kiln_block_sum(q) / (float)C;
    return make_float2(mean, 1.0f / sqrtf(var + eps));
}

/* ---- the warp-per-row paths (C a multiple of 256, 16-byte aligned rows) ----
 *
 * One warp per row, the row in registers: lane l holds columns
 * k*256 + l*8 + j (k < NCH = C/256, j < 8), loaded and stored 16 bytes at a
 * time; the statistics are warp sums (kiln_warp_sum: every lane gets the
 * same bits), so a row costs one read of x (forward: and one write of y),
 * no block barrier.  The block-per-row loops below are the fallback for any
 * other C or alignment.  Both paths use the same formulas; the sums' order
 * differs (within f32 rounding of each other). */

struct __align__(16) kiln_ln_v8 { __nv_bfloat16 v[8]; };

static __device__ __forceinline__ void ln_load8(const __nv_bfloat16 *p, float *f) {
    const kiln_ln_v8 t = *(const kiln_ln_v8 *)p;
#pragma unroll
    for (int j = 0; j < 8; j++) f[j] = __bfloat162float(t.v[j]);
}

static __device__ __forceinline__ void ln_store8(__nv_bfloat16 *p, const float *f) {
    kiln_ln_v8 t;
#pragma unroll
    for (int j = 0; j < 8; j++) t.v[j] = __float2bfloat16_rn(f[j]);
    *(kiln_ln_v8 *)p = t;
}

/* (mean, rstd) of a row held as v[NCH][8] across the warp */
template <int NCH> static __device__ __forceinline__ float2 ln_warp_stats(const float (&v)[NCH][8], long long C, float eps) {
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < NCH; k++)
#pragma unroll
        for (int j = 0; j < 8; j++) s += v[k][j];
    const float mean = kiln_warp_sum(s) / (float)C;
    float q = 0.0f;
#pragma unroll
    for (int k = 0; k < NCH; k++)
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const float d = v[k][j] - mean;
            q += d * d;
        }
    const float var = kiln_warp_sum(q) / (float)C;
    return make_float2(mean, 1.0f / sqrtf(var + eps));
}

template <int NCH>
static __device__ void ln_fwd_warp(const __nv_bfloat16 *x, const __nv_bfloat16 *w, const __nv_bfloat16 *b, __nv_bfloat16 *y,
                                   long long rows, float eps) {
    const long long C = NCH * 256;
    const int lane = threadIdx.x & 31;
    const long long wpb = blockDim.x >> 5;
    for (long long r = blockIdx.x * wpb + (threadIdx.x >> 5); r < rows; r += gridDim.x * wpb) {
        float v[NCH][8];
#pragma unroll
        for (int k = 0; k < NCH; k++) ln_load8(x + r * C + k * 256 + lane * 8, v[k]);
        const float2 st = ln_warp_stats<NCH>(v, C, eps);
#pragma unroll
        for (int k = 0; k < NCH; k++) {
            float wv[8], bv[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f}, o[8];
            ln_load8(w + k * 256 + lane * 8, wv);
            if (b) ln_load8(b + k * 256 + lane * 8, bv);
#pragma unroll
            for (int j = 0; j < 8; j++) o[j] = (v[k][j] - st.x) * st.y * wv[j] + (b ? bv[j] : 0.0f);
            ln_store8(y + r * C + k * 256 + lane * 8, o);
        }
    }
}

/* the warp paths apply: C = NCH*256 with NCH in [1, max], the arrays 16-byte aligned */
static __device__ __forceinline__ int ln_warp_nch(long long C, int max, const void *a, const void *b, const void *c, const void *d) {
    if (C <= 0 || C % 256 != 0 || C / 256 > max) return 0;
    if (((unsigned long long)a | (unsigned long long)b | (unsigned long long)c | (unsigned long long)d) & 15) return 0;
    return (int)(C / 256);
}

extern "C" __global__ void __launch_bounds__(KILN_BLOCK)
kiln_layernorm_fwd(const __nv_bfloat16 *x, const __nv_bfloat16 *w, const __nv_bfloat16 *b, __nv_bfloat16 *y,
                   long long rows, long long C, double eps) {
    switch (ln_warp_nch(C, 4, x, w, b, y)) {
    case 1: ln_fwd_warp<1>(x, w, b, y, rows, (float)eps); return;
    case 2: ln_fwd_warp<2>(x, w, b, y, rows, (float)eps); return;
    case 3: ln_fwd_warp<3>(x, w, b, y, rows, (float)eps); return;
    case 4: ln_fwd_warp<4>(x, w, b, y, rows, (float)eps); return;
    default: break;
    }
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const __nv_bfloat16 *xr = x + r * C;
        __nv_bfloat16 *yr = y + r * C;
        float2 st = ln_row_stats(xr, C, (float)eps);
        for (long long i = threadIdx.x; i < C; i += blockDim.x)
            kiln_st(yr, i, (kiln_ld(xr, i) - st.x) * st.y * kiln_ld(w, i) + (b ? kiln_ld(b, i) : 0.0f));
    }
}

/* one row of the backward: writes dx, adds into acc_w, acc_b (this thread's columns) */
static __device__ void ln_bwd_row(const __nv_bfloat16 *dy, const __nv_bfloat16 *x, const __nv_bfloat16 *w,
                                  __nv_bfloat16 *dx, float *acc_w, float *acc_b, long long C, float eps) {
    float2 st = ln_row_stats(x, C, eps);
    float mg = 0.0f, mgx = 0.0f;
    for (long long i = threadIdx.x; i < C; i += blockDim.x) {
        float d = kiln_ld(dy, i), xh = (kiln_ld(x, i) - st.x) * st.y, g = d * kiln_ld(w, i);
        mg += g;
        mgx += g * xh;
        acc_w[i] += d * xh;
        acc_b[i] += d;
    }
    float2 m = kiln_block_sum2(mg, mgx);
    float fmg = m.x / (float)C, fmgx = m.y / (float)C;
    for (long long i = threadIdx.x; i < C; i += blockDim.x)
        kiln_st(dx, i, st.y * (kiln_ld(dy, i) * kiln_ld(w, i) - fmg - (kiln_ld(x, i) - st.x) * st.y * fmgx));
}

/* The backward of part p's rows [r0, r1) (see kiln_layernorm_bwd): warp q
 * takes rows r0 + q, r0 + q + nwarps, ... and adds dy*xhat and dy into its
 * lanes' registers (its columns); then the warps add theirs into the
 * block's shared accumulators one warp at a time, warp 0 first, and the
 * block writes row p of the partial sums.  The order of every sum is fixed
 * by rows, C and the block size. */
template <int NCH>
static __device__ void ln_bwd_warp(const __nv_bfloat16 *dy, const __nv_bfloat16 *x, const __nv_bfloat16 *w, __nv_bfloat16 *dx,
                                   float *partial, long long rows, float eps) {
    const long long C = NCH * 256;
    float *acc = (float *)kiln_smem; /* [2][C]: dw, db */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const long long parts = kiln_norm_parts(rows);
    for (long long p = blockIdx.x; p < parts; p += gridDim.x) {
        float aw[NCH][8], ab[NCH][8];
#pragma unroll
        for (int k = 0; k < NCH; k++)
#pragma unroll
            for (int j = 0; j < 8; j++) aw[k][j] = ab[k][j] = 0.0f;
        const long long r0 = rows * p / parts, r1 = rows * (p + 1) / parts;
        for (long long r = r0 + warp; r < r1; r += nw) {
            float xv[NCH][8], dv[NCH][8];
#pragma unroll
            for (int k = 0; k < NCH; k++) {
                ln_load8(x + r * C + k * 256 + lane * 8, xv[k]);
                ln_load8(dy + r * C + k * 256 + lane * 8, dv[k]);
            }
            const float2 st = ln_warp_stats<NCH>(xv, C, eps);
            float mg = 0.0f, mgx = 0.0f;
#pragma unroll
            for (int k = 0; k < NCH; k++) {
                float wv[8];
                ln_load8(w + k * 256 + lane * 8, wv);
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    const float d = dv[k][j], xh = (xv[k][j] - st.x) * st.y, g = d * wv[j];
                    mg += g;
                    mgx += g * xh;
                    aw[k][j] += d * xh;
                    ab[k][j] += d;
                }
            }
            const float fmg = kiln_warp_sum(mg) / (float)C, fmgx = kiln_warp_sum(mgx) / (float)C;
#pragma unroll
            for (int k = 0; k < NCH; k++) {
                float wv[8], o[8];
                ln_load8(w + k * 256 + lane * 8, wv);
#pragma unroll
                for (int j = 0; j < 8; j++) o[j] = st.y * (dv[k][j] * wv[j] - fmg - (xv[k][j] - st.x) * st.y * fmgx);
                ln_store8(dx + r * C + k * 256 + lane * 8, o);
            }
        }
        for (long long i = threadIdx.x; i < 2 * C; i += blockDim.x) acc[i] = 0.0f;
        __syncthreads();
        for (int q = 0; q < nw; q++) {
            if (warp == q)
#pragma unroll
                for (int k = 0; k < NCH; k++)
#pragma unroll
                    for (int j = 0; j < 8; j++) {
                        const long long c = k * 256 + lane * 8 + j;
                        acc[c] += aw[k][j];
                        acc[C + c] += ab[k][j];
                    }
            __syncthreads();
        }
        float *out = partial + p * 2 * C;
        for (long long i = threadIdx.x; i < 2 * C; i += blockDim.x) out[i] = acc[i];
        __syncthreads(); /* the next part zeroes acc */
    }
}

extern "C" __global__ void __launch_bounds__(KILN_BLOCK)
kiln_layernorm_bwd(const __nv_bfloat16 *dy, const __nv_bfloat16 *x, const __nv_bfloat16 *w, __nv_bfloat16 *dx,
                   float *partial, long long rows, long long C, double eps) {
    switch (ln_warp_nch(C, 3, dy, x, w, dx)) {
    case 1: ln_bwd_warp<1>(dy, x, w, dx, partial, rows, (float)eps); return;
    case 2: ln_bwd_warp<2>(dy, x, w, dx, partial, rows, (float)eps); return;
    case 3: ln_bwd_warp<3>(dy, x, w, dx, partial, rows, (float)eps); return;
    default: break;
    }
    float *acc_w = (float *)kiln_smem, *acc_b = acc_w + C;
    long long parts = kiln_norm_parts(rows);
    for (long long p = blockIdx.x; p < parts; p += gridDim.x) {
        for (long long i = threadIdx.x; i < C; i += blockDim.x) acc_w[i] = acc_b[i] = 0.0f;
        long long r0 = rows * p / parts, r1 = rows * (p + 1) / parts;
        for (long long r = r0; r < r1; r++)
            ln_bwd_row(dy + r * C, x + r * C, w, dx + r * C, acc_w, acc_b, C, (float)eps);
        float *out = partial + p * 2 * C;
        for (long long i = threadIdx.x; i < C; i += blockDim.x) {
            out[i] = acc_w[i];
            out[C + i] = acc_b[i];
        }
    }
}

/* dw, db = the sums of the parts' rows.  A block takes 32 columns at a
 * time (lane = column, coalesced); its warp q adds the parts
 * [parts*q/nwarps, parts*(q+1)/nwarps) in order, then warp 0 adds the
 * warps' sums in warp order: a fixed order (rows, C and the block size),
 * and nwarps chains per column instead of one long one. */
extern "C" __global__ void __launch_bounds__(KILN_BLOCK)
kiln_layernorm_bwd_reduce(const float *partial, float *dw, float *db, long long rows, long long C) {
    __shared__ float sw[KILN_WARPS][32], sb[KILN_WARPS][32];
    const long long parts = kiln_norm_parts(rows);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const long long p0 = parts * warp / nw, p1 = parts * (warp + 1) / nw;
    for (long long c0 = blockIdx.x * 32LL; c0 < C; c0 += gridDim.x * 32LL) {
        const long long c = c0 + lane;
        float a = 0.0f, b = 0.0f;
        if (c < C)
            for (long long p = p0; p < p1; p++) {
                a += partial[p * 2 * C + c];
                b += partial[p * 2 * C + C + c];
            }
        sw[warp][lane] = a;
        sb[warp][lane] = b;
        __syncthreads();
        if (warp == 0 && c < C) {
            float x = 0.0f, y = 0.0f;
            for (int q = 0; q < nw; q++) {
                x += sw[q][lane];
                y += sb[q][lane];
            }
            dw[c] = x;
            db[c] = y;
        }
        __syncthreads(); /* sw, sb are read before the next columns' sums */
    }
}
