/* dropout.cu — inverted dropout with a counter-based mask (ops.def dropout,
 * issue 17; CPU twin kernels/cpu/dropout.c).
 *
 * y[b,t,f] = x[b,t,f] / (1-p) where kept, else 0.  Kept iff
 * bits(b,t,f) >= floor(p * 2^32), the bits a hash of (seed, id, step,
 * rows[b], pos[t], f): runtime/rng.h's rng_dropout_key, rng_dropout_row and
 * rng_dropout_bits (splitmix64's finaliser), written again here for the
 * device, bit for bit (this file cannot include the runtime's headers:
 * NVRTC compiles it alone).  rows and pos are global sample and token
 * indices, so a rank of any mesh draws the single device's mask; the
 * backward is the same kernel on dy.  The product is f32, rounded once to
 * bf16.
 *
 * One block per (b, t) row of F elements; every thread computes the step's
 * key (two mixes) and the row's (one), then one mix per element.  y may be x.
 */
#include "common.cuh"

#define KILN_GOLDEN 0x9e3779b97f4a7c15ull

static __device__ __forceinline__ unsigned long long kiln_mix64(unsigned long long z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

extern "C" __global__ void __launch_bounds__(KILN_BLOCK)
kiln_dropout(const __nv_bfloat16 *x, const float *step, const int *rows, const int *pos, __nv_bfloat16 *y, long long B,
             long long T, long long F, double p, long long seed, long long id) {
    float s = step[0];
    unsigned int st = s > 0 ? (unsigned int)(long long)s : 0u;
    unsigned long long key = kiln_mix64(kiln_mix64((unsigned long long)seed + KILN_GOLDEN * (unsigned long long)(id + 1)) ^ st);
    unsigned int thr = (unsigned int)(p * 4294967296.0);
    float scale = (float)(1 / (1 - p));
    for (long long bt = blockIdx.x; bt < B * T; bt += gridDim.x) {
        unsigned long long row = kiln_mix64(key ^ ((unsigned long long)(unsigned int)rows[bt / T] << 32 |
                                                   (unsigned int)pos[bt % T]));
        for (long long f = threadIdx.x; f < F; f += blockDim.x) {
            unsigned int bits = (unsigned int)(kiln_mix64(row + KILN_GOLDEN * (unsigned long long)(f + 1)) >> 32);
            kiln_st(y, bt * F + f, bits >= thr ? kiln_ld(x, bt * F + f) * scale : 0.0f);
        }
    }
}
