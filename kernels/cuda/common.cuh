/* common.cuh — what every CUDA library kernel in kernels/cuda/ shares.
 *
 * The library kernels are CUDA C compiled with NVRTC at compile time
 * (compiler/nvrtc.c), each .cu file on its own, with this directory and the
 * CUDA toolkit's include directory on the include path.  NVRTC has no C
 * library headers (no <stdint.h>, no <math.h>), so sizes are `long long`
 * (int64 on every CUDA platform), ids are `int` (int32), and the few
 * constants that <math.h> would give are built from their bits here.  No CUB,
 * no thrust: the reductions below are written with warp shuffles.
 *
 * Precision (DESIGN §6): activations and weights are bf16 in memory
 * (__nv_bfloat16); every kernel loads them to f32, does its math in f32 and
 * rounds once, to nearest even, when it stores bf16.  Statistics, losses,
 * log-sum-exps, master weights, optimizer moments and weight gradients stay
 * f32 in memory.
 *
 * Determinism: no float atomics anywhere.  Every sum runs in an order fixed
 * by the shapes and the block size alone (a per-thread loop in index order,
 * then the fixed xor butterfly of kiln_warp_sum, then warp 0 adding the
 * warp totals the same way), so a kernel gives the same bits run to run.
 *
 * Block reductions: every thread of the block must call them (they contain
 * __syncthreads), blockDim.x must be a multiple of 32 (at most 1024), and
 * every thread gets the same value: the total is computed once, by warp 0,
 * and read back from shared memory.  Each reduction has its own static
 * shared slots; a second call may follow the first at once (the argument in
 * the code below shows why two barriers per call are enough).
 */
#pragma once

#include <cuda_bf16.h>

/* threads per block of the row and element kernels (README: launch rules) */
#define KILN_BLOCK 256
#define KILN_WARPS (KILN_BLOCK / 32)
#define KILN_FULL_MASK 0xffffffffu

/* dynamic shared memory (the launch's sharedMemBytes), declared once here so
 * that two kernels in one file cannot disagree about its type */
extern __shared__ __align__(16) unsigned char kiln_smem[];

/* ---- values ---- */

static __device__ __forceinline__ float kiln_nan(void) { return __int_as_float(0x7fc00000); }
static __device__ __forceinline__ float kiln_neg_inf(void) { return __int_as_float(0xff800000); }

/* element i of a bf16 array, as f32 (exact) */
static __device__ __forceinline__ float kiln_ld(const __nv_bfloat16 *p, long long i) { return __bfloat162float(p[i]); }

/* store f32 v as bf16, rounded to nearest even */
static __device__ __forceinline__ void kiln_st(__nv_bfloat16 *p, long long i, float v) { p[i] = __float2bfloat16_rn(v); }

/* The norms' backward cuts the rows into this many parts at most, one
 * f32 weight-gradient row per part in the scratch (README: scratch sizes). */
#define KILN_NORM_PARTS 512

static __device__ __forceinline__ long long kiln_norm_parts(long long rows) {
    return rows < KILN_NORM_PARTS ? rows : KILN_NORM_PARTS;
}

/* ---- warp reductions (all 32 lanes take part and get the result) ---- */

static __device__ __forceinline__ float kiln_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(KILN_FULL_MASK, v, o);
    return v;
}

/* ---- block reductions ----
 *
 * Why two barriers suffice between back-to-back calls: a thread writes
 * part[] in call k+1 only after passing the second barrier of call k, which
 * warp 0 reaches only after it has read part[] in call k; warp 0 writes the
 * total of call k+1 only after the first barrier of call k+1, which every
 * thread reaches only after reading the total of call k. */

/* sum of v over the block */
static __device__ float kiln_block_sum(float v) {
    __shared__ float part[32];
    __shared__ float total;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = kiln_warp_sum(v);
    if (lane == 0) part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float s = kiln_warp_sum(lane < nwarps ? part[lane] : 0.0f);
        if (lane == 0) total = s;
    }
    __syncthreads();
    return total;
}

/* the sums of a and of b over the block, in one pass */
static __device__ float2 kiln_block_sum2(float a, float b) {
    __shared__ float2 part[32];
    __shared__ float2 total;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    a = kiln_warp_sum(a);
    b = kiln_warp_sum(b);
    if (lane == 0) part[warp] = make_float2(a, b);
    __syncthreads();
    if (warp == 0) {
        float2 p = lane < nwarps ? part[lane] : make_float2(0.0f, 0.0f);
        p.x = kiln_warp_sum(p.x);
        p.y = kiln_warp_sum(p.y);
        if (lane == 0) total = p;
    }
    __syncthreads();
    return total;
}

/* ---- log-sum-exp in one pass (online softmax) ----
 *
 * A running pair (m, s) stands for s * e^m: m the largest value seen, s the
 * sum of e^(x - m).  The empty pair is (-inf, 0).  -inf values add nothing
 * (so a row with some -inf entries is fine); a NaN makes s NaN, and so the
 * log-sum-exp, as the CPU twin's max and sum do.  m is never NaN. */

/* fold x into (m, s) */
static __device__ __forceinline__ void kiln_lse_add(float &m, float &s, float x) {
    if (x > m) {
        s = s * expf(m - x) + 1.0f; /* m = -inf: expf(-inf) = 0 */
        m = x;
    } else if (x != kiln_neg_inf()) {
        s += expf(x - m);
    }
}

/* fold the pair (m2, s2) into (m, s) */
static __device__ __forceinline__ void kiln_lse_merge(float &m, float &s, float m2, float s2) {
    float mx = fmaxf(m, m2);
    float a = m == kiln_neg_inf() ? 0.0f : s * expf(m - mx);
    float b = m2 == kiln_neg_inf() ? 0.0f : s2 * expf(m2 - mx);
    m = mx;
    s = a + b;
}

static __device__ __forceinline__ void kiln_warp_lse(float &m, float &s) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(KILN_FULL_MASK, m, o), s2 = __shfl_xor_sync(KILN_FULL_MASK, s, o);
        kiln_lse_merge(m, s, m2, s2);
    }
}

/* The block's (max, sum of e^(x - max)) from each thread's (m, s), merged
 * warp by warp in a fixed order; every thread gets it. */
static __device__ float2 kiln_block_lse_pair(float m, float s) {
    __shared__ float2 part[32];
    __shared__ float2 total;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    kiln_warp_lse(m, s);
    if (lane == 0) part[warp] = make_float2(m, s);
    __syncthreads();
    if (warp == 0) {
        float2 p = lane < nwarps ? part[lane] : make_float2(kiln_neg_inf(), 0.0f);
        kiln_warp_lse(p.x, p.y);
        if (lane == 0) total = p;
    }
    __syncthreads();
    return total;
}

/* log(sum e^x) over the block from each thread's (m, s): m + log(s), or
 * -inf when the block saw no finite-or-+inf value */
static __device__ float kiln_block_lse(float m, float s) {
    float2 p = kiln_block_lse_pair(m, s);
    return p.x == kiln_neg_inf() ? kiln_neg_inf() : p.x + logf(p.y);
}

/* ---- dtype codes and dtype-generic loads and stores ----
 *
 * Kernels whose element type varies at run time (misc.cu: copy, sumto,
 * reduce, softmax, ...) take kiln_rt.h's dtype code (RT_F32 = 0, RT_BF16 = 1,
 * RT_I32 = 3) and a `void *`.  The code is the same for every thread, so the
 * branch costs a few instructions, not divergence.  Any code other than
 * KILN_BF16 reads and writes f32 (the launchers reject the others). */
#define KILN_F32 0
#define KILN_BF16 1
#define KILN_I32 3

/* element i of an f32 or bf16 array, as f32 */
static __device__ __forceinline__ float kiln_ld_dt(const void *p, long long i, int dt) {
    return dt == KILN_BF16 ? kiln_ld((const __nv_bfloat16 *)p, i) : ((const float *)p)[i];
}

/* store v as element i of an f32 or bf16 array (bf16: rounded to nearest even) */
static __device__ __forceinline__ void kiln_st_dt(void *p, long long i, float v, int dt) {
    if (dt == KILN_BF16) kiln_st((__nv_bfloat16 *)p, i, v);
    else ((float *)p)[i] = v;
}

/* the first element index of this thread in a grid-stride loop, and the stride */
static __device__ __forceinline__ long long kiln_gtid(void) { return blockIdx.x * (long long)blockDim.x + threadIdx.x; }
static __device__ __forceinline__ long long kiln_gstride(void) { return (long long)gridDim.x * blockDim.x; }
