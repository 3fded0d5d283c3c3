/* xent.c — softmax cross-entropy over the last dim V, forward and backward.
 *
 * loss[i] = logsumexp(logits[i,:]) - logits[i, t[i]], the log-sum-exp
 * max-shifted, exponentials by k_exp in chunks (so they vectorise) summed
 * in double.  Backward: dlogits = dl[i] * (softmax - onehot(t[i])), with the
 * row's logsumexp recomputed (nothing is saved between the two ops).
 * Targets outside [0, V) fail the step through rt_fail.
 *
 * dlogits may be the logits' own buffer (ops.def F_INPLACE; memplan plans it
 * so when nothing reads the logits later): each row is read whole for its
 * log-sum-exp before any of it is written, logit i is read before dlogit i
 * is written, the target's fix-up reads only dlogits, and the threads split
 * the work by rows.  Keep it so, or drop the flag.
 */
#include "kern.h"

#define XENT_CHUNK 256

typedef struct {
    const float *x, *dl;
    const int32_t *tg;
    float *loss, *dx;
    int64_t V;
} Xent;

static int targets_ok(rt_ctx *ctx, const char *op, const int32_t *tg, int64_t rows, int64_t V) {
    for (int64_t i = 0; i < rows; i++)
        if (tg[i] < 0 || tg[i] >= V) {
            rt_fail(ctx, "%s: target %d out of range [0,%lld)", op, tg[i], (long long)V);
            return -1;
        }
    return 0;
}

/* log(sum(e^x)) of one row, in double */
static double row_lse(const float *x, int64_t V) {
    float m = k_max(x, V), tmp[XENT_CHUNK];
    double s = 0;
    for (int64_t c = 0; c < V; c += XENT_CHUNK) {
        int64_t n = V - c < XENT_CHUNK ? V - c : XENT_CHUNK;
        for (int64_t i = 0; i < n; i++) tmp[i] = k_exp(x[c + i] - m);
        s += k_dsum(tmp, n);
    }
    return m + log(s);
}

K_CLONES static void xent_rows(void *data, int64_t r0, int64_t r1) {
    const Xent *e = data;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = e->x + r * e->V;
        e->loss[r] = (float)(row_lse(x, e->V) - x[e->tg[r]]);
    }
}

K_CLONES static void xent_bwd_rows(void *data, int64_t r0, int64_t r1) {
    const Xent *e = data;
    int64_t V = e->V;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = e->x + r * V;
        float *dx = e->dx + r * V, L = (float)row_lse(x, V), dl = e->dl[r];
        for (int64_t i = 0; i < V; i++) dx[i] = dl * k_exp(x[i] - L);
        dx[e->tg[r]] -= dl;
    }
}

/* args: logits, targets, loss, rows, V */
void rtk_cross_entropy(rt_ctx *ctx, const int64_t *a) {
    Xent e = {.x = A_F32(0), .tg = A_I32(1), .loss = A_F32(2), .V = a[4]};
    if (targets_ok(ctx, "cross_entropy", e.tg, a[3], e.V)) return;
    k_par(ctx, a[3], 24 * e.V, xent_rows, &e);
}

/* args: dl, logits, targets, dlogits, rows, V */
void rtk_cross_entropy_bwd(rt_ctx *ctx, const int64_t *a) {
    Xent e = {.dl = A_F32(0), .x = A_F32(1), .tg = A_I32(2), .dx = A_F32(3), .V = a[5]};
    if (targets_ok(ctx, "cross_entropy_bwd", e.tg, a[4], e.V)) return;
    k_par(ctx, a[4], 48 * e.V, xent_bwd_rows, &e);
}
