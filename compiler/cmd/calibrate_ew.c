/* calibrate_ew.c — kiln calibrate's stand-ins for the CPU back end's fused
 * elementwise kernels (issue 21), which are generated per program
 * (emit_llvm.c) and so cannot be timed before one exists.
 *
 * A fused group is a loop over its elements handed to rt_parallel_for
 * (serial up to 2^14 elements), vectorized for the host CPU, its
 * transcendentals built on a Cephes-style expf (emit_llvm.c's kiln_expf,
 * kernels/cpu/kern.h's k_exp here).  So the stand-ins are the same kind of
 * loop: calib_ew_add (z = x + y: three streams of bytes, what a residual
 * add or a bias moves) and calib_ew_gelu (z = GELU(x), tanh form, tanh as
 * emit_llvm.c's Cephes tanhf: both its branches and a select) beside calib_ew_scale (z = 2x: the GELU's bytes
 * without its tanh), each a runtime kernel (rt_kernel) a one-kernel program
 * launches.  Their args: x, y (add only), z, n.
 *
 * Kept apart from calibrate.c because kern.h switches the file to the
 * kernels' optimization (O3, the x86-64-v3 clones).
 */
#include "../../kernels/cpu/kern.h"

#include "calibrate_ew.h"

enum { EW_SERIAL = 1 << 14 }; /* emit_llvm.c's PARALLEL_MIN */

typedef struct {
    const float *x, *y;
    float *z;
} Ew;

K_CLONES static void add_range(void *data, int64_t i0, int64_t i1) {
    const Ew *e = data;
    for (int64_t i = i0; i < i1; i++) e->z[i] = e->x[i] + e->y[i];
}

K_CLONES static void scale_range(void *data, int64_t i0, int64_t i1) {
    const Ew *e = data;
    for (int64_t i = i0; i < i1; i++) e->z[i] = 2.0f * e->x[i];
}

/* emit_llvm.c's kiln_tanhf: Cephes tanhf, x + x^3 P(x^2) below |x| 0.625,
 * sign(x) (1 - 2/(e^2|x| + 1)) above, both computed and one selected (the
 * vector loop's blend).  Session 10: a stand-in with the exp branch alone
 * cost half of what the generated GELU groups took an element in a quiet
 * trace (0.59 against 1.1 ns), so ew_transc_s priced them 0.61 of their time. */
static inline float cephes_tanh(float x) {
    float ax = __builtin_fabsf(x), z = x * x, p = -5.70498872745E-3f;
    p = p * z + 2.06390887954E-2f;
    p = p * z + -5.37397155531E-2f;
    p = p * z + 1.33314422036E-1f;
    p = p * z + -3.33332819422E-1f;
    p = p * z * x + x;
    float t = __builtin_copysignf(1.0f - 2.0f / (k_exp(2.0f * ax) + 1.0f), x);
    return ax < 0.625f ? p : t;
}

K_CLONES static void gelu_range(void *data, int64_t i0, int64_t i1) {
    const Ew *e = data;
    for (int64_t i = i0; i < i1; i++) {
        float x = e->x[i], u = 0.7978845608f * (x + 0.044715f * x * x * x);
        e->z[i] = 0.5f * x * (1.0f + cephes_tanh(u));
    }
}

static void run(rt_ctx *ctx, int64_t n, void (*fn)(void *, int64_t, int64_t), Ew *e) {
    if (n <= EW_SERIAL) fn(e, 0, n);
    else rt_parallel_for(ctx, n, fn, e);
}

void calib_ew_add(rt_ctx *ctx, const int64_t *a) {
    Ew e = {A_F32(0), A_F32(1), A_F32(2)};
    run(ctx, a[3], add_range, &e);
}

void calib_ew_scale(rt_ctx *ctx, const int64_t *a) {
    Ew e = {A_F32(0), NULL, A_F32(2)};
    run(ctx, a[3], scale_range, &e);
}

void calib_ew_gelu(rt_ctx *ctx, const int64_t *a) {
    Ew e = {A_F32(0), NULL, A_F32(2)};
    run(ctx, a[3], gelu_range, &e);
}
