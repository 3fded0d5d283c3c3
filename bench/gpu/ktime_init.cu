/* ktime_init.cu — ktime.c's device helpers: fill arrays with hashed
 * pseudo-random values (no host round trip for GBs of logits) and count
 * the 16-bit words in which two arrays differ (exact comparisons). */
#include <cuda_bf16.h>

static __device__ __forceinline__ unsigned kt_hash(unsigned long long i, unsigned seed) {
    unsigned long long x = i * 0x9E3779B97F4A7C15ull + seed * 0xBF58476D1CE4E5B9ull;
    x ^= x >> 31;
    x *= 0x94D049BB133111EBull;
    x ^= x >> 29;
    return (unsigned)x;
}

static __device__ __forceinline__ float kt_unit(unsigned long long i, unsigned seed) { return (kt_hash(i, seed) >> 8) * (1.0f / 16777216.0f); }

extern "C" __global__ void kt_fill_bf16(__nv_bfloat16 *p, long long n, unsigned seed, float lo, float hi) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        p[i] = __float2bfloat16_rn(lo + (hi - lo) * kt_unit(i, seed));
}

extern "C" __global__ void kt_fill_f32(float *p, long long n, unsigned seed, float lo, float hi) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        p[i] = lo + (hi - lo) * kt_unit(i, seed);
}

/* ids in [0, V): u^4 * V, so small ids repeat (runs of thousands, as a
 * frequent token's), or positions i % V when V <= 1024 (wpe) */
extern "C" __global__ void kt_fill_ids(int *p, long long n, long long V, unsigned seed) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        float u = kt_unit(i, seed);
        long long id = V <= 1024 ? i % V : (long long)(u * u * u * u * (float)V);
        p[i] = (int)(id < V ? id : V - 1);
    }
}

extern "C" __global__ void kt_diff16(const unsigned short *a, const unsigned short *b, long long n, unsigned long long *count) {
    unsigned long long c = 0;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) c += a[i] != b[i];
    if (c) atomicAdd(count, c);
}
