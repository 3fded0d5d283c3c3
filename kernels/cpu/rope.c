/* rope.c — rotate-half rotary position embedding on x[B,T,H,D].
 *
 * angle(t, i) = pos[t] * theta^(-2i/D) for i < D/2;
 *   y[i]       = x[i] cos - x[i+D/2] sin
 *   y[i+D/2]   = x[i+D/2] cos + x[i] sin
 * The backward is the same rotation by -angle (sign = -1).
 *
 * First a table of cos/sin per (t, i), computed in double (angles reach
 * pos ~ 1e5, where float would lose the phase) and stored as float; then one
 * job per (b, t) rotates the H rows of D values with vectorised loops.
 */
#include "kern.h"

typedef struct {
    const float *x;
    const int32_t *pos;
    float *y;
    int64_t B, T, H, D;
    double theta, sign;
    float *cs, *sn; /* [T][D/2] */
} Rope;

static void rope_table(void *data, int64_t t0, int64_t t1) {
    const Rope *r = data;
    int64_t half = r->D / 2;
    for (int64_t t = t0; t < t1; t++)
        for (int64_t i = 0; i < half; i++) {
            double ang = (double)r->pos[t] * pow(r->theta, -2.0 * (double)i / (double)r->D);
            r->cs[t * half + i] = (float)cos(ang);
            r->sn[t * half + i] = (float)(r->sign * sin(ang));
        }
}

static void rope_rows(void *data, int64_t bt0, int64_t bt1) {
    const Rope *r = data;
    int64_t half = r->D / 2;
    for (int64_t bt = bt0; bt < bt1; bt++) {
        const float *cs = r->cs + (bt % r->T) * half, *sn = r->sn + (bt % r->T) * half;
        for (int64_t h = 0; h < r->H; h++) {
            const float *x = r->x + (bt * r->H + h) * r->D;
            float *y = r->y + (bt * r->H + h) * r->D;
            for (int64_t i = 0; i < half; i++) {
                float x1 = x[i], x2 = x[i + half];
                y[i] = x1 * cs[i] - x2 * sn[i];
                y[i + half] = x2 * cs[i] + x1 * sn[i];
            }
        }
    }
}

/* args: x, pos, y, B, T, H, D, theta, sign (+1 fwd, -1 bwd) */
void rtk_rope(rt_ctx *ctx, const int64_t *a) {
    Rope r = {A_F32(0), A_I32(1), A_F32(2), a[3], a[4], a[5], a[6], A_F64(7), a[8] < 0 ? -1.0 : 1.0, NULL, NULL};
    int64_t half = r.D / 2;
    if (r.B * r.T * r.H * r.D == 0) return;
    r.cs = k_alloc(ctx, "rope", sizeof(float) * (size_t)(2 * r.T * half));
    if (!r.cs) return;
    r.sn = r.cs + r.T * half;
    k_par(ctx, r.T, 60 * half, rope_table, &r);
    k_par(ctx, r.B * r.T, 6 * r.H * r.D, rope_rows, &r);
    free(r.cs);
}
