/* kern.h — private helpers of the CPU library kernels (kernels/cpu/).
 *
 * Every kernel has the rt_kernel signature and reads its flat int64 argument
 * array (runtime/kiln_rt.h documents each layout).  The helpers here: argument
 * decoding, k_par (rt_parallel_for, or a plain call when the work is too
 * small to be worth waking the pool), a vectorisable expf, and sums that
 * accumulate in double.
 *
 * Speed: the Makefile builds with -O2, where GCC only vectorises loops whose
 * trip count is a multiple of the vector width.  The kernel files therefore
 * include this header first, which switches them to O3 (runtime-length loops
 * vectorise, with a scalar tail), lets comparisons be if-converted
 * (no-trapping-math: k_exp's clamps become blends) and a*b+c become FMAs.
 * No fast-math: inf and NaN keep their meaning (a fully masked attention row
 * gives lse = -inf), and sums are not reassociated behind our back.
 */
#ifndef KILN_KERN_H
#define KILN_KERN_H

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3", "no-math-errno", "no-trapping-math", "fp-contract=fast")
#endif

/* The hot loops are compiled twice, for baseline x86-64 (SSE2) and for
 * x86-64-v3 (AVX2 + FMA, 2012 on), and the loader picks one per machine
 * (an ifunc).  With FMA the last bits of a result depend on the machine;
 * on one machine they are always the same. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && __GNUC__ >= 12
#define K_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define K_CLONES
#endif

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kiln_rt.h"

/* ---- arguments ---- */
#define A_F32(i) RT_F32P(a[i])
#define A_I32(i) RT_I32P(a[i])
#define A_PTR(i) rt_arg_ptr(a[i])
#define A_F64(i) rt_bits_f64(a[i])

/* ---- parallel loops ---- */

/* Work (roughly flops or bytes) below which a loop runs on the calling
 * thread: waking the pool costs a few microseconds. */
#define K_SERIAL_WORK (1 << 15)

typedef void (*k_body)(void *data, int64_t i0, int64_t i1);

/* Run fn over [0, n) items of about `work` units each. */
static inline void k_par(rt_ctx *ctx, int64_t n, int64_t work, k_body fn, void *data) {
    if (n <= 0) return;
    if (n == 1 || n * work < K_SERIAL_WORK) fn(data, 0, n);
    else rt_parallel_for(ctx, n, fn, data);
}

/* malloc that reports failure through the step (the kernel then returns). */
static inline void *k_alloc(rt_ctx *ctx, const char *kernel, size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) rt_fail(ctx, "%s: out of memory (%zu bytes of scratch)", kernel, bytes);
    return p;
}

/* ---- math ---- */

/* e^x in float, vectorisable (no calls, no branches): Cephes' expf
 * polynomial after x = n ln2 + r, |r| <= ln2/2, with 2^n built in the
 * exponent bits.  Relative error about 2e-7 (2 ulp); flushes to 0 below
 * -87.33 (where expf becomes denormal), +inf above 88.37, NaN stays NaN. */
static inline float k_exp(float x) {
    const float hi = 88.3762626647949f, lo = -87.3365447505531f;
    float xc = x > hi ? hi : x;
    xc = xc < lo ? lo : xc;
    /* round x*log2(e) to nearest with the 1.5*2^23 trick (no float->int UB) */
    const float magic = 12582912.0f;
    float t = xc * 1.44269504088896341f + magic;
    float n = t - magic;
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    uint32_t ti, bits;
    memcpy(&ti, &t, 4);
    bits = (ti - 0x4B400000u + 127u) << 23; /* integer n = bits(t) - bits(magic); unsigned: NaN input stays defined */
    float s;
    memcpy(&s, &bits, 4);
    float y = p * s;
    y = x < lo ? 0.0f : y;
    y = x > hi ? INFINITY : y;
    return y;
}

/* sum of x[0..n) in double, four independent lanes */
static inline double k_dsum(const float *x, int64_t n) {
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += x[i];
        s1 += x[i + 1];
        s2 += x[i + 2];
        s3 += x[i + 3];
    }
    for (; i < n; i++) s0 += x[i];
    return (s0 + s1) + (s2 + s3);
}

/* sum of x*y in double */
static inline double k_ddot(const float *x, const float *y, int64_t n) {
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += (double)x[i] * y[i];
        s1 += (double)x[i + 1] * y[i + 1];
        s2 += (double)x[i + 2] * y[i + 2];
        s3 += (double)x[i + 3] * y[i + 3];
    }
    for (; i < n; i++) s0 += (double)x[i] * y[i];
    return (s0 + s1) + (s2 + s3);
}

/* max of a and b where a NaN in b wins (and then stays: NaN > x is false) */
static inline float k_max2(float a, float b) { return b > a || b != b ? b : a; }

/* max of x[0..n) (-inf for n = 0; NaN propagates), in eight lanes: a
 * single running max is one long dependency chain */
static inline float k_max(const float *x, int64_t n) {
    float m[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int u = 0; u < 8; u++) m[u] = k_max2(m[u], x[i + u]);
    for (; i < n; i++) m[0] = k_max2(m[0], x[i]);
    for (int u = 1; u < 8; u++) m[0] = k_max2(m[0], m[u]);
    return m[0];
}

/* y[0..n) += s * x[0..n) */
static inline void k_axpy(float *restrict y, float s, const float *restrict x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += s * x[i];
}

#endif
