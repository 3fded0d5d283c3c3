/* reduce.c — reductions over one dim (sum, mean, max), the backward of max,
 * and sumto (the backward of broadcast).
 *
 * x is viewed as [outer, n, inner] and reduced over n.  With inner = 1 each
 * output is one contiguous row (summed in double lanes).  With inner > 1 a
 * job owns a chunk of RED_CHUNK outputs of one outer index and adds n rows
 * of that chunk into a double accumulator on its stack: the loop runs along
 * inner, which is contiguous, so it vectorises, and the jobs never share an
 * output.  Sums therefore come out in the same order on any number of
 * threads.  max propagates NaN like the reference interpreter; max_bwd
 * routes dy to the first argmax (NaNs never win there, as in the
 * interpreter).
 *
 * sumto reduces x over the dims where the output stride is 0.  After merging
 * neighbouring dims of the same kind, a job owns one output element (the last
 * dim summed) or a RED_CHUNK of the contiguous last dim (the last dim kept,
 * the case of a bias gradient [rows, C] -> [C]) and walks every summed index
 * with an odometer.
 */
#include "kern.h"

#define RED_CHUNK 64

enum { K_SUM, K_MEAN, K_MAX };

typedef struct {
    const float *x, *dy;
    float *y, *dx;
    int64_t outer, n, inner, chunks;
    int kind;
} Red;

static void reduce_rows(void *data, int64_t o0, int64_t o1) { /* inner == 1 */
    const Red *r = data;
    for (int64_t o = o0; o < o1; o++) {
        const float *x = r->x + o * r->n;
        if (r->kind == K_MAX) r->y[o] = k_max(x, r->n);
        else r->y[o] = (float)(k_dsum(x, r->n) / (r->kind == K_MEAN ? (double)r->n : 1.0));
    }
}

static void reduce_chunks(void *data, int64_t c0, int64_t c1) { /* inner > 1 */
    const Red *r = data;
    for (int64_t c = c0; c < c1; c++) {
        int64_t o = c / r->chunks, j0 = c % r->chunks * RED_CHUNK;
        int64_t w = r->inner - j0 < RED_CHUNK ? r->inner - j0 : RED_CHUNK;
        const float *x = r->x + o * r->n * r->inner + j0;
        float *y = r->y + o * r->inner + j0;
        if (r->kind == K_MAX) {
            float m[RED_CHUNK];
            for (int64_t j = 0; j < w; j++) m[j] = -INFINITY;
            for (int64_t k = 0; k < r->n; k++)
                for (int64_t j = 0; j < w; j++) {
                    float v = x[k * r->inner + j];
                    m[j] = k_max2(m[j], v);
                }
            memcpy(y, m, sizeof(float) * (size_t)w);
        } else {
            double s[RED_CHUNK] = {0}, div = r->kind == K_MEAN ? (double)r->n : 1.0;
            for (int64_t k = 0; k < r->n; k++)
                for (int64_t j = 0; j < w; j++) s[j] += x[k * r->inner + j];
            for (int64_t j = 0; j < w; j++) y[j] = (float)(s[j] / div);
        }
    }
}

/* Reduce x viewed as [outer, n, inner] over n.  kind 0 sum, 1 mean, 2 max.
 * args: x, y, outer, n, inner, kind */
void rtk_reduce(rt_ctx *ctx, const int64_t *a) {
    Red r = {.x = A_F32(0), .y = A_F32(1), .outer = a[2], .n = a[3], .inner = a[4], .kind = (int)a[5]};
    if (r.inner == 1) {
        k_par(ctx, r.outer, r.n, reduce_rows, &r);
    } else {
        r.chunks = (r.inner + RED_CHUNK - 1) / RED_CHUNK;
        k_par(ctx, r.outer * r.chunks, r.n * RED_CHUNK, reduce_chunks, &r);
    }
}

/* ---- max_bwd ---- */

static void max_bwd_jobs(void *data, int64_t i0, int64_t i1) {
    const Red *r = data;
    for (int64_t i = i0; i < i1; i++) { /* i = o * inner + j */
        int64_t o = i / r->inner, j = i % r->inner, best = 0;
        const float *x = r->x + o * r->n * r->inner + j;
        float *dx = r->dx + o * r->n * r->inner + j;
        for (int64_t k = 1; k < r->n; k++)
            if (x[k * r->inner] > x[best * r->inner]) best = k;
        for (int64_t k = 0; k < r->n; k++) dx[k * r->inner] = 0;
        if (r->n > 0) dx[best * r->inner] = r->dy[i];
    }
}

/* dx = dy routed to the first argmax.  args: dy, x, y, dx, outer, n, inner */
void rtk_max_bwd(rt_ctx *ctx, const int64_t *a) {
    Red r = {.dy = A_F32(0), .x = A_F32(1), .dx = A_F32(3), .outer = a[4], .n = a[5], .inner = a[6]};
    k_par(ctx, r.outer * r.inner, 2 * r.n, max_bwd_jobs, &r);
}

/* ---- sumto ---- */

typedef struct {
    const float *x;
    float *y;
    int nk, nr;           /* kept dims (outer first), summed dims */
    int64_t kd[5], kxs[5], kys[5];
    int64_t rd[5], rxs[5];
    int last_kept;        /* the innermost (merged) dim is kept: jobs take chunks of it */
    int64_t chunks;       /* chunks of the last kept dim */
} SumTo;

/* One output (or one chunk of the contiguous last kept dim): walk the
 * summed dims with an odometer, the innermost summed dim as a run. */
static void sumto_job(const SumTo *s, int64_t job) {
    int64_t xo = 0, yo = 0, rest = job, w = 1, ys_last = 0;
    int nk = s->nk;
    if (s->last_kept) { /* its x stride is 1 */
        nk--;
        int64_t j0 = rest % s->chunks * RED_CHUNK;
        rest /= s->chunks;
        w = s->kd[nk] - j0 < RED_CHUNK ? s->kd[nk] - j0 : RED_CHUNK;
        xo = j0;
        ys_last = s->kys[nk];
        yo = j0 * ys_last;
    }
    for (int d = nk - 1; d >= 0; d--) {
        int64_t i = rest % s->kd[d];
        rest /= s->kd[d];
        xo += i * s->kxs[d];
        yo += i * s->kys[d];
    }
    double acc[RED_CHUNK] = {0};
    int64_t idx[5] = {0}, off = 0, L = s->rd[s->nr - 1], rs = s->rxs[s->nr - 1];
    for (;;) {
        const float *x = s->x + xo + off;
        if (s->last_kept) {
            for (int64_t l = 0; l < L; l++)
                for (int64_t j = 0; j < w; j++) acc[j] += x[l * rs + j];
        } else if (rs == 1) {
            acc[0] += k_dsum(x, L);
        } else {
            for (int64_t l = 0; l < L; l++) acc[0] += x[l * rs];
        }
        int d = s->nr - 2;
        for (; d >= 0; d--) { /* next index of the outer summed dims */
            off += s->rxs[d];
            if (++idx[d] < s->rd[d]) break;
            off -= s->rxs[d] * s->rd[d];
            idx[d] = 0;
        }
        if (d < 0) break;
    }
    for (int64_t j = 0; j < w; j++) s->y[yo + j * ys_last] = (float)acc[j];
}

static void sumto_jobs(void *data, int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; i++) sumto_job(data, i);
}

/* sumto: y = sum of x over the dims where ystride is 0.
 * args: x, y, rank, d0..d4 (x dims), ys0..ys4 (y strides, 0 = summed) */
void rtk_sumto(rt_ctx *ctx, const int64_t *a) {
    SumTo s = {.x = A_F32(0), .y = A_F32(1)};
    int rank = (int)a[2];
    int64_t xs = 1, xstr[5], njobs = 1, nsum = 1;
    for (int d = rank - 1; d >= 0; d--) {
        xstr[d] = xs;
        xs *= a[3 + d];
    }
    if (xs == 0) { /* empty x: the sums are 0 */
        int64_t ny = 1;
        for (int d = 0; d < rank; d++) ny *= a[8 + d] ? a[3 + d] : 1;
        memset(s.y, 0, sizeof(float) * (size_t)ny);
        return;
    }
    /* split into kept and summed dims, merging neighbours of one kind that
     * are contiguous in x (and in y, for kept dims); size-1 dims drop out */
    int prev = -1; /* 0 summed, 1 kept */
    for (int d = 0; d < rank; d++) {
        int64_t n = a[3 + d], ys = a[8 + d];
        if (n == 1) continue;
        int kept = ys != 0;
        if (kept) {
            if (prev == 1 && s.kxs[s.nk - 1] == n * xstr[d] && s.kys[s.nk - 1] == n * ys) {
                s.kd[s.nk - 1] *= n;
                s.kxs[s.nk - 1] = xstr[d];
                s.kys[s.nk - 1] = ys;
            } else {
                s.kd[s.nk] = n, s.kxs[s.nk] = xstr[d], s.kys[s.nk++] = ys;
            }
            njobs *= n;
        } else {
            if (prev == 0 && s.rxs[s.nr - 1] == n * xstr[d]) {
                s.rd[s.nr - 1] *= n;
                s.rxs[s.nr - 1] = xstr[d];
            } else {
                s.rd[s.nr] = n, s.rxs[s.nr++] = xstr[d];
            }
            nsum *= n;
        }
        prev = kept;
    }
    if (s.nr == 0) s.rd[s.nr] = 1, s.rxs[s.nr++] = 0; /* nothing summed: a copy */
    s.last_kept = s.nk > 0 && prev == 1;
    if (s.last_kept) {
        s.chunks = (s.kd[s.nk - 1] + RED_CHUNK - 1) / RED_CHUNK;
        njobs = njobs / s.kd[s.nk - 1] * s.chunks;
    }
    k_par(ctx, njobs, nsum * (s.last_kept ? RED_CHUNK : 1), sumto_jobs, &s);
}
