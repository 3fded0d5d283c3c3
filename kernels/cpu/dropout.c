/* dropout.c — inverted dropout with a counter-based mask (ops.def dropout,
 * issue 17).
 *
 * y[b,t,f] = x[b,t,f] / (1-p) where the element is kept, else 0.  Whether it
 * is kept is a pure function of the program's seed, the node's id, the step
 * (the f32 scalar `step`, state opt.step) and the element's global indices
 * rows[b], pos[t], f, through runtime/rng.h's hash: there is no generator
 * state, so every rank and micro-batch draws exactly the single device's
 * mask, and the backward (the same kernel on dy) recomputes it instead of
 * reading a saved one.  The product is taken in double and rounded once, as
 * the interpreter does, so y is bit-identical to its f32 run.
 *
 * One job per (b, t) row: one mix for the row's key, one per element.
 */
#include "kern.h"
#include "rng.h"

typedef struct {
    const float *x;
    const int32_t *rows, *pos;
    float *y;
    int64_t T, F;
    uint64_t key;
    uint32_t thr;
    double scale;
} Dropout;

static void dropout_rows(void *data, int64_t bt0, int64_t bt1) {
    const Dropout *d = data;
    for (int64_t bt = bt0; bt < bt1; bt++) {
        uint64_t row = rng_dropout_row(d->key, d->rows[bt / d->T], d->pos[bt % d->T]);
        const float *x = d->x + bt * d->F;
        float *y = d->y + bt * d->F;
        for (int64_t f = 0; f < d->F; f++) y[f] = rng_dropout_bits(row, f) >= d->thr ? (float)((double)x[f] * d->scale) : 0.0f;
    }
}

/* args: x, step, rows, pos, y, B, T, F, p(bits), seed, id */
void rtk_dropout(rt_ctx *ctx, const int64_t *a) {
    double p = A_F64(8);
    Dropout d = {A_F32(0), A_I32(2), A_I32(3), A_F32(4), a[6], a[7],
                 rng_dropout_key((uint64_t)a[9], a[10], rng_dropout_step(A_F32(1)[0])), rng_dropout_threshold(p), 1 / (1 - p)};
    k_par(ctx, a[5] * a[6], d.F * 4, dropout_rows, &d);
}
