/* rope.cu — rotate-half rotary position embedding on x[B,T,H,D], forward
 * and backward (ops.def rope, rope_bwd; CPU twin kernels/cpu/rope.c).
 *
 * For i < D/2, angle(t, i) = pos[t] * theta^(-2i/D) and
 *     y[i]       = x[i] cos - x[i+D/2] sin
 *     y[i+D/2]   = x[i+D/2] cos + x[i] sin
 * The backward is the same rotation by -angle.
 *
 * One block per (b, t) row of H*D values.  The block first fills a table
 * of cos and sin for its position in dynamic shared memory (D floats), the
 * angle computed in double as the twin does (positions reach 1e5, where an
 * f32 angle would be off by about 1e-2 rad) and the results rounded to f32;
 * then every thread rotates pairs (h, i), in f32, rounding once to bf16.
 * Each pair is read before it is written by the same thread, so y may be x.
 */
#include "common.cuh"

static __device__ void rope_rows(const __nv_bfloat16 *x, const int *pos, __nv_bfloat16 *y, long long B, long long T,
                                 long long H, long long D, double theta, double sign) {
    long long half = D / 2;
    float *cs = (float *)kiln_smem, *sn = cs + half;
    for (long long bt = blockIdx.x; bt < B * T; bt += gridDim.x) {
        double p = (double)pos[bt % T];
        __syncthreads(); /* the previous row is done with the table */
        for (long long i = threadIdx.x; i < half; i += blockDim.x) {
            double s, c;
            sincos(p * pow(theta, -2.0 * (double)i / (double)D), &s, &c);
            cs[i] = (float)c;
            sn[i] = (float)(sign * s);
        }
        __syncthreads();
        for (long long k = threadIdx.x; k < H * half; k += blockDim.x) {
            long long h = k / half, i = k - h * half, at = (bt * H + h) * D + i;
            float x1 = kiln_ld(x, at), x2 = kiln_ld(x, at + half);
            kiln_st(y, at, x1 * cs[i] - x2 * sn[i]);
            kiln_st(y, at + half, x2 * cs[i] + x1 * sn[i]);
        }
    }
}

extern "C" __global__ void __launch_bounds__(KILN_BLOCK)
kiln_rope_fwd(const __nv_bfloat16 *x, const int *pos, __nv_bfloat16 *y, long long B, long long T, long long H,
              long long D, double theta) {
    rope_rows(x, pos, y, B, T, H, D, theta, 1.0);
}

extern "C" __global__ void __launch_bounds__(KILN_BLOCK)
kiln_rope_bwd(const __nv_bfloat16 *dy, const int *pos, __nv_bfloat16 *dx, long long B, long long T, long long H,
              long long D, double theta) {
    rope_rows(dy, pos, dx, B, T, H, D, theta, -1.0);
}
