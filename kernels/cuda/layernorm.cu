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

extern "C" __global__ void __launch_bounds__(KILN_BLOCK)
kiln_layernorm_fwd(const __nv_bfloat16 *x, const __nv_bfloat16 *w, const __nv_bfloat16 *b, __nv_bfloat16 *y,
                   long long rows, long long C, double eps) {
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

extern "C" __global__ void __launch_bounds__(KILN_BLOCK)
kiln_layernorm_bwd(const __nv_bfloat16 *dy, const __nv_bfloat16 *x, const __nv_bfloat16 *w, __nv_bfloat16 *dx,
                   float *partial, long long rows, long long C, double eps) {
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

extern "C" __global__ void __launch_bounds__(KILN_BLOCK)
kiln_layernorm_bwd_reduce(const float *partial, float *dw, float *db, long long rows, long long C) {
    long long parts = kiln_norm_parts(rows);
    for (long long c = blockIdx.x * (long long)blockDim.x + threadIdx.x; c < C; c += (long long)gridDim.x * blockDim.x) {
        float sw = 0.0f, sb = 0.0f;
        for (long long p = 0; p < parts; p++) {
            sw += partial[p * 2 * C + c];
            sb += partial[p * 2 * C + C + c];
        }
        dw[c] = sw;
        db[c] = sb;
    }
}
