/* norm.c — layernorm and rmsnorm, forward and backward.
 *
 * x is seen as rows of its last dim C.  The forward is one independent job
 * per row: statistics in double (two passes for the variance, so no
 * cancellation), then a float loop over C that vectorises.
 *
 * The backward also produces dw (and db), sums over every row.  Rows are cut
 * into at most NORM_PARTS fixed blocks; each block sums its rows into its own
 * double row of a scratch buffer, and a second pass adds the blocks up in
 * block order.  The blocks do not depend on the pool size, so the result is
 * the same bit for bit however many threads run it.
 *
 * Formulas (as compiler/interp.c): xhat = (x-mean)*rstd, g = dy*w;
 *   layernorm: dx = rstd*(g - mean(g) - xhat*mean(g*xhat)); dw = sum dy*xhat; db = sum dy
 *   rmsnorm:   rs = rsqrt(mean(x^2)+eps); dx = rs*g - x*rs^3*mean(g*x); dw = sum dy*x*rs
 */
#include "kern.h"

#define NORM_PARTS 64

typedef struct {
    const float *x, *w, *b, *dy;
    float *y, *dx, *dw, *db;
    int64_t rows, C, parts;
    double eps;
    double *acc; /* backward: [parts][2*C] partial dw, db */
} Norm;

/* mean and 1/sqrt(var+eps) of one row, in double */
static double ln_stats(const float *x, int64_t C, double eps, double *rstd) {
    double mean = k_dsum(x, C) / (double)C, var = 0;
    for (int64_t i = 0; i < C; i++) {
        double d = x[i] - mean;
        var += d * d;
    }
    *rstd = 1 / sqrt(var / (double)C + eps);
    return mean;
}

static double rms_scale(const float *x, int64_t C, double eps) { return 1 / sqrt(k_ddot(x, x, C) / (double)C + eps); }

K_CLONES static void ln_fwd_rows(void *data, int64_t r0, int64_t r1) {
    const Norm *n = data;
    int64_t C = n->C;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = n->x + r * C;
        float *y = n->y + r * C;
        double rstd, mean = ln_stats(x, C, n->eps, &rstd);
        float m = (float)mean, s = (float)rstd;
        if (n->b)
            for (int64_t i = 0; i < C; i++) y[i] = (x[i] - m) * s * n->w[i] + n->b[i];
        else /* no bias (issue 17) */
            for (int64_t i = 0; i < C; i++) y[i] = (x[i] - m) * s * n->w[i];
    }
}

K_CLONES static void rms_fwd_rows(void *data, int64_t r0, int64_t r1) {
    const Norm *n = data;
    int64_t C = n->C;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = n->x + r * C;
        float *y = n->y + r * C, s = (float)rms_scale(x, C, n->eps);
        for (int64_t i = 0; i < C; i++) y[i] = x[i] * s * n->w[i];
    }
}

/* args: x, w, b (0: no bias), y, rows, C, eps */
void rtk_layernorm(rt_ctx *ctx, const int64_t *a) {
    Norm n = {.x = A_F32(0), .w = A_F32(1), .b = A_F32(2), .y = A_F32(3), .rows = a[4], .C = a[5], .eps = A_F64(6)};
    k_par(ctx, n.rows, 8 * n.C, ln_fwd_rows, &n);
}

/* args: x, w, y, rows, C, eps */
void rtk_rmsnorm(rt_ctx *ctx, const int64_t *a) {
    Norm n = {.x = A_F32(0), .w = A_F32(1), .y = A_F32(2), .rows = a[3], .C = a[4], .eps = A_F64(5)};
    k_par(ctx, n.rows, 6 * n.C, rms_fwd_rows, &n);
}

/* ---- backward ---- */

static void part_rows(const Norm *n, int64_t p, int64_t *r0, int64_t *r1) {
    *r0 = n->rows * p / n->parts;
    *r1 = n->rows * (p + 1) / n->parts;
}

K_CLONES static void ln_bwd_parts(void *data, int64_t p0, int64_t p1) {
    const Norm *n = data;
    int64_t C = n->C;
    for (int64_t p = p0; p < p1; p++) {
        double *dw = n->acc + p * 2 * C, *db = dw + C;
        int64_t r0, r1;
        part_rows(n, p, &r0, &r1);
        memset(dw, 0, sizeof(double) * (size_t)(2 * C));
        for (int64_t r = r0; r < r1; r++) {
            const float *x = n->x + r * C, *dy = n->dy + r * C;
            float *dx = n->dx + r * C;
            double rstd, mean = ln_stats(x, C, n->eps, &rstd), mg = 0, mgx = 0;
            for (int64_t i = 0; i < C; i++) {
                double xh = (x[i] - mean) * rstd, g = (double)dy[i] * n->w[i];
                mg += g;
                mgx += g * xh;
                dw[i] += dy[i] * xh;
                db[i] += dy[i];
            }
            float fm = (float)mean, fs = (float)rstd, fmg = (float)(mg / (double)C), fmgx = (float)(mgx / (double)C);
            for (int64_t i = 0; i < C; i++) dx[i] = fs * (dy[i] * n->w[i] - fmg - (x[i] - fm) * fs * fmgx);
        }
    }
}

K_CLONES static void rms_bwd_parts(void *data, int64_t p0, int64_t p1) {
    const Norm *n = data;
    int64_t C = n->C;
    for (int64_t p = p0; p < p1; p++) {
        double *dw = n->acc + p * 2 * C;
        int64_t r0, r1;
        part_rows(n, p, &r0, &r1);
        memset(dw, 0, sizeof(double) * (size_t)C);
        for (int64_t r = r0; r < r1; r++) {
            const float *x = n->x + r * C, *dy = n->dy + r * C;
            float *dx = n->dx + r * C;
            double rs = rms_scale(x, C, n->eps), mgx = 0;
            for (int64_t i = 0; i < C; i++) {
                mgx += (double)dy[i] * n->w[i] * x[i];
                dw[i] += (double)dy[i] * x[i] * rs;
            }
            float fs = (float)rs, k = (float)(rs * rs * rs * mgx / (double)C);
            for (int64_t i = 0; i < C; i++) dx[i] = fs * dy[i] * n->w[i] - x[i] * k;
        }
    }
}

/* dw[i] (and db[i]) = sum over parts, columns [c0, c1) */
static void sum_parts(void *data, int64_t c0, int64_t c1) {
    const Norm *n = data;
    for (int64_t c = c0; c < c1; c++) {
        double sw = 0, sb = 0;
        for (int64_t p = 0; p < n->parts; p++) {
            sw += n->acc[p * 2 * n->C + c];
            sb += n->acc[p * 2 * n->C + n->C + c];
        }
        n->dw[c] = (float)sw;
        if (n->db) n->db[c] = (float)sb;
    }
}

static void norm_bwd(rt_ctx *ctx, Norm *n, k_body rows_fn, const char *name) {
    n->parts = n->rows < NORM_PARTS ? n->rows : NORM_PARTS;
    if (n->parts == 0) { /* no rows: the weight gradients are zero */
        memset(n->dw, 0, sizeof(float) * (size_t)n->C);
        if (n->db) memset(n->db, 0, sizeof(float) * (size_t)n->C);
        return;
    }
    n->acc = k_alloc(ctx, name, sizeof(double) * (size_t)(n->parts * 2 * n->C));
    if (!n->acc) return;
    k_par(ctx, n->parts, 12 * n->C * (n->rows / n->parts + 1), rows_fn, n);
    k_par(ctx, n->C, 2 * n->parts, sum_parts, n);
    free(n->acc);
}

/* args: dy, x, w, dx, dw, db, rows, C, eps */
void rtk_layernorm_bwd(rt_ctx *ctx, const int64_t *a) {
    Norm n = {.dy = A_F32(0), .x = A_F32(1), .w = A_F32(2), .dx = A_F32(3), .dw = A_F32(4), .db = A_F32(5),
              .rows = a[6], .C = a[7], .eps = A_F64(8)};
    norm_bwd(ctx, &n, ln_bwd_parts, "layernorm_bwd");
}

/* args: dy, x, w, dx, dw, rows, C, eps */
void rtk_rmsnorm_bwd(rt_ctx *ctx, const int64_t *a) {
    Norm n = {.dy = A_F32(0), .x = A_F32(1), .w = A_F32(2), .dx = A_F32(3), .dw = A_F32(4), .rows = a[5], .C = a[6],
              .eps = A_F64(7)};
    norm_bwd(ctx, &n, rms_bwd_parts, "rmsnorm_bwd");
}
