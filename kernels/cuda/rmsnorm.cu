/* rmsnorm.cu — RMSNorm forward and backward on bf16 rows (ops.def rmsnorm,
 * rmsnorm_bwd; CPU twin kernels/cpu/norm.c).
 *
 * x is seen as `rows` rows of its last dim C; one block of KILN_BLOCK
 * threads per row at a time, thread k owning columns k, k+256, ...
 *
 *   forward:  rs = 1/sqrt(mean(x^2) + eps), y = x*rs*w
 *   backward: rs recomputed from x (the op saves nothing),
 *             dx = rs*dy*w - x*rs^3*mean(dy*w*x), dw = sum over rows of dy*x*rs
 *
 * dw is made deterministic as in layernorm.cu: parts = min(rows,
 * KILN_NORM_PARTS) fixed row ranges, block p accumulating its range in f32
 * shared memory and writing row p of `partial`, then
 * kiln_rmsnorm_bwd_reduce adding the parts in order.
 */
#include "common.cuh"

/* 1/sqrt(mean(x^2) + eps) of the row x[0..C) */
static __device__ float rms_row_scale(const __nv_bfloat16 *x, long long C, float eps) {
    float q = 0.0f;
    for (long long i = threadIdx.x; i < C; i += blockDim.x) {
        float v = kiln_ld(x, i);
        q += v * v;
    }
    return 1.0f / sqrtf(kiln_block_sum(q) / (float)C + eps);
}

extern "C" __global__ void __launch_bounds__(KILN_BLOCK)
kiln_rmsnorm_fwd(const __nv_bfloat16 *x, const __nv_bfloat16 *w, __nv_bfloat16 *y, long long rows, long long C,
                 double eps) {
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const __nv_bfloat16 *xr = x + r * C;
        __nv_bfloat16 *yr = y + r * C;
        float s = rms_row_scale(xr, C, (float)eps);
        for (long long i = threadIdx.x; i < C; i += blockDim.x) kiln_st(yr, i, kiln_ld(xr, i) * s * kiln_ld(w, i));
    }
}

/* one row of the backward: writes dx, adds dy*x*rs into acc_w (this thread's columns) */
static __device__ void rms_bwd_row(const __nv_bfloat16 *dy, const __nv_bfloat16 *x, const __nv_bfloat16 *w,
                                   __nv_bfloat16 *dx, float *acc_w, long long C, float eps) {
    float rs = rms_row_scale(x, C, eps), mgx = 0.0f;
    for (long long i = threadIdx.x; i < C; i += blockDim.x) {
        float d = kiln_ld(dy, i), xv = kiln_ld(x, i);
        mgx += d * kiln_ld(w, i) * xv;
        acc_w[i] += d * xv * rs;
    }
    float k = rs * rs * rs * (kiln_block_sum(mgx) / (float)C);
    for (long long i = threadIdx.x; i < C; i += blockDim.x)
        kiln_st(dx, i, rs * kiln_ld(dy, i) * kiln_ld(w, i) - kiln_ld(x, i) * k);
}

extern "C" __global__ void __launch_bounds__(KILN_BLOCK)
kiln_rmsnorm_bwd(const __nv_bfloat16 *dy, const __nv_bfloat16 *x, const __nv_bfloat16 *w, __nv_bfloat16 *dx,
                 float *partial, long long rows, long long C, double eps) {
    float *acc_w = (float *)kiln_smem;
    long long parts = kiln_norm_parts(rows);
    for (long long p = blockIdx.x; p < parts; p += gridDim.x) {
        for (long long i = threadIdx.x; i < C; i += blockDim.x) acc_w[i] = 0.0f;
        long long r0 = rows * p / parts, r1 = rows * (p + 1) / parts;
        for (long long r = r0; r < r1; r++) rms_bwd_row(dy + r * C, x + r * C, w, dx + r * C, acc_w, C, (float)eps);
        for (long long i = threadIdx.x; i < C; i += blockDim.x) partial[p * C + i] = acc_w[i];
    }
}

extern "C" __global__ void __launch_bounds__(KILN_BLOCK)
kiln_rmsnorm_bwd_reduce(const float *partial, float *dw, long long rows, long long C) {
    long long parts = kiln_norm_parts(rows);
    for (long long c = blockIdx.x * (long long)blockDim.x + threadIdx.x; c < C; c += (long long)gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (long long p = 0; p < parts; p++) s += partial[p * C + c];
        dw[c] = s;
    }
}
