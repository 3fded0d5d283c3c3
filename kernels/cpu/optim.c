/* optim.c — the optimizer's kernels: AdamW, the cosine learning-rate
 * schedule, the gradient-clipping scale and the sum of squares that the
 * gradient norm is made of.
 *
 * AdamW is torch.optim.AdamW on g*scale (scale = the clipping factor):
 *     m' = b1 m + (1-b1) g;  v' = b2 v + (1-b2) g^2
 *     p' = p - lr wd p - lr (m'/bc1) / (sqrt(v'/bc2) + eps),  bck = 1 - bk^t
 * elementwise, so p_out may be p (and m_out m, v_out v): each element is
 * read before it is written.  The scalars (lr, scale, t) are f32 values in
 * memory, computed earlier in the step; the bias corrections are computed
 * once in double.
 *
 * The cosine schedule's constants are not kernel args but the program's
 * rt_schedule table (kiln_rt.h), so the trainer can change them at run time.
 *
 * sumsq accumulates in double over fixed blocks (the same partition for any
 * pool size, so the norm is reproducible bit for bit).
 */
#include "kern.h"

#ifdef __SSE__
#include <xmmintrin.h>
#endif

typedef struct {
    const float *p, *g, *m, *v;
    float *po, *mo, *vo;
    float b1, b2, eps, lrwd, lr, scale, ibc1, ibc2;
} Adam;

#define ADAM_CHUNK 256

/* x[i] = sqrt(x[i]).  GCC keeps sqrtf's errno check even under
 * optimize("no-math-errno"), and the check stops the vectoriser; SSE's
 * sqrtps is the same correctly rounded square root. */
static void sqrt_n(float *x, int64_t n) {
    int64_t i = 0;
#ifdef __SSE__
    for (; i + 4 <= n; i += 4) _mm_storeu_ps(x + i, _mm_sqrt_ps(_mm_loadu_ps(x + i)));
#endif
    for (; i < n; i++) x[i] = sqrtf(x[i]);
}

/* In chunks through stack copies: the outputs may alias the inputs, and
 * loops over distinct local arrays vectorise without alias checks. */
K_CLONES static void adamw_range(void *data, int64_t i0, int64_t i1) {
    const Adam *s = data;
    float p[ADAM_CHUNK], g[ADAM_CHUNK], m[ADAM_CHUNK], v[ADAM_CHUNK], den[ADAM_CHUNK];
    for (int64_t c = i0; c < i1; c += ADAM_CHUNK) {
        int64_t n = i1 - c < ADAM_CHUNK ? i1 - c : ADAM_CHUNK;
        size_t bytes = sizeof(float) * (size_t)n;
        memcpy(p, s->p + c, bytes);
        memcpy(g, s->g + c, bytes);
        memcpy(m, s->m + c, bytes);
        memcpy(v, s->v + c, bytes);
        for (int64_t i = 0; i < n; i++) {
            float gi = g[i] * s->scale;
            m[i] = s->b1 * m[i] + (1 - s->b1) * gi;
            v[i] = s->b2 * v[i] + (1 - s->b2) * gi * gi;
            den[i] = v[i] * s->ibc2;
        }
        sqrt_n(den, n);
        for (int64_t i = 0; i < n; i++) {
            float pi = p[i] - s->lrwd * p[i];
            p[i] = pi - s->lr * (m[i] * s->ibc1) / (den[i] + s->eps);
        }
        memcpy(s->po + c, p, bytes);
        memcpy(s->mo + c, m, bytes);
        memcpy(s->vo + c, v, bytes);
    }
}

/* args: p, g, m, v, lr, scale, t, p_out, m_out, v_out, n, b1, b2, eps, wd */
void rtk_adamw(rt_ctx *ctx, const int64_t *a) {
    double lr = *A_F32(4), t = *A_F32(6), b1 = A_F64(11), b2 = A_F64(12), wd = A_F64(14);
    Adam s = {.p = A_F32(0), .g = A_F32(1), .m = A_F32(2), .v = A_F32(3), .po = A_F32(7), .mo = A_F32(8), .vo = A_F32(9),
              .b1 = (float)b1, .b2 = (float)b2, .eps = (float)A_F64(13), .lr = (float)lr, .lrwd = (float)(lr * wd),
              .scale = *A_F32(5), .ibc1 = (float)(1 / (1 - pow(b1, t))), .ibc2 = (float)(1 / (1 - pow(b2, t)))};
    k_par(ctx, a[10], 16, adamw_range, &s);
}

/* args: t, out, schedule (ops.def lr_cosine; the rt_schedule the trainer
 * may have set, read when the kernel runs) */
void rtk_lr_cosine(rt_ctx *ctx, const int64_t *a) {
    const rt_schedule *s = rt_arg_ptr(a[2]);
    double t = *A_F32(0), lr = s->lr, min_lr = s->min_lr, warmup = s->warmup, total = s->total;
    if (warmup > 0 && t <= warmup) {
        *A_F32(1) = (float)(lr * t / warmup);
        return;
    }
    double p = total > warmup ? (t - warmup) / (total - warmup) : 1;
    p = p < 0 ? 0 : p > 1 ? 1 : p;
    *A_F32(1) = (float)(min_lr + 0.5 * (1 + cos(M_PI * p)) * (lr - min_lr));
}

/* args: norm, out, max (ops.def clipscale) */
void rtk_clipscale(rt_ctx *ctx, const int64_t *a) {
    double mx = A_F64(2), s = mx / (*A_F32(0) + 1e-6);
    *A_F32(1) = mx <= 0 || s > 1 ? 1.0f : (float)s;
}

/* ---- sum of squares ---- */

#define SUMSQ_PARTS 64
#define SUMSQ_MIN (1 << 14) /* elements per block at least */

typedef struct {
    const float *x;
    int64_t n, parts;
    double part[SUMSQ_PARTS];
} SumSq;

static void sumsq_parts(void *data, int64_t p0, int64_t p1) {
    SumSq *s = data;
    for (int64_t p = p0; p < p1; p++) {
        int64_t i0 = s->n * p / s->parts, i1 = s->n * (p + 1) / s->parts;
        s->part[p] = k_ddot(s->x + i0, s->x + i0, i1 - i0);
    }
}

/* args: x, out, n */
void rtk_sumsq(rt_ctx *ctx, const int64_t *a) {
    SumSq s = {.x = A_F32(0), .n = a[2]};
    s.parts = s.n / SUMSQ_MIN < 1 ? 1 : s.n / SUMSQ_MIN > SUMSQ_PARTS ? SUMSQ_PARTS : s.n / SUMSQ_MIN;
    k_par(ctx, s.parts, 2 * (s.n / s.parts), sumsq_parts, &s);
    double acc = 0;
    for (int64_t p = 0; p < s.parts; p++) acc += s.part[p];
    *A_F32(1) = (float)acc;
}
