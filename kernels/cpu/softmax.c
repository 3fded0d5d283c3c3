/* softmax.c — softmax over the last dim, forward and backward.
 *
 * One job per row: max, y = e^(x-max) with the vectorised k_exp, the sum
 * in double, one scaling pass.  Backward: dx = y*(dy - sum(dy*y)).
 */
#include "kern.h"

typedef struct {
    const float *x, *dy, *y_in;
    float *y, *dx;
    int64_t C;
} Soft;

K_CLONES static void softmax_rows(void *data, int64_t r0, int64_t r1) {
    const Soft *s = data;
    int64_t C = s->C;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = s->x + r * C;
        float *y = s->y + r * C, m = k_max(x, C);
        for (int64_t i = 0; i < C; i++) y[i] = k_exp(x[i] - m);
        float inv = (float)(1 / k_dsum(y, C));
        for (int64_t i = 0; i < C; i++) y[i] *= inv;
    }
}

K_CLONES static void softmax_bwd_rows(void *data, int64_t r0, int64_t r1) {
    const Soft *s = data;
    int64_t C = s->C;
    for (int64_t r = r0; r < r1; r++) {
        const float *dy = s->dy + r * C, *y = s->y_in + r * C;
        float *dx = s->dx + r * C, dot = (float)k_ddot(dy, y, C);
        for (int64_t i = 0; i < C; i++) dx[i] = y[i] * (dy[i] - dot);
    }
}

/* args: x, y, rows, C */
void rtk_softmax(rt_ctx *ctx, const int64_t *a) {
    Soft s = {.x = A_F32(0), .y = A_F32(1), .C = a[3]};
    k_par(ctx, a[2], 24 * s.C, softmax_rows, &s);
}

/* args: dy, y, dx, rows, C */
void rtk_softmax_bwd(rt_ctx *ctx, const int64_t *a) {
    Soft s = {.dy = A_F32(0), .y_in = A_F32(1), .dx = A_F32(2), .C = a[4]};
    k_par(ctx, a[3], 4 * s.C, softmax_bwd_rows, &s);
}
