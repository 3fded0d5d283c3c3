/* copy.c — data movement: the strided copy (transpose, slice, broadcast,
 * each part of a concat), fill, iota and plain memcpy.
 *
 * rtk_copy first simplifies its index space: size-1 dims drop out, and a dim
 * merges into its outer neighbour when both strides continue it (a slice
 * of whole rows is one long run).  One job then copies one innermost run:
 * a memcpy when both innermost strides are 1, a fill when the source stride
 * is 0 (broadcast), else a strided element loop.  Element sizes 1, 2, 4 and 8
 * bytes are copied as integers of that size.
 */
#include "kern.h"

typedef struct {
    const char *src;
    char *dst;
    int64_t esz;
    int rank;
    int64_t d[5], ss[5], ds[5]; /* after simplification; d[rank-1] is the run */
} Copy;

#define RUN_LOOP(T)                                                                        \
    do {                                                                                   \
        const T *s_ = (const T *)src;                                                      \
        T *d_ = (T *)dst;                                                                  \
        if (ss == 0) {                                                                     \
            T v_ = s_[0];                                                                  \
            for (int64_t i = 0; i < n; i++) d_[i * ds] = v_;                               \
        } else {                                                                           \
            for (int64_t i = 0; i < n; i++) d_[i * ds] = s_[i * ss];                       \
        }                                                                                  \
    } while (0)

/* n elements, element strides ss (0: broadcast) and ds */
static void copy_run(const char *src, char *dst, int64_t esz, int64_t n, int64_t ss, int64_t ds) {
    if (ss == 1 && ds == 1) {
        memcpy(dst, src, (size_t)(n * esz));
        return;
    }
    switch (esz) {
    case 1: RUN_LOOP(uint8_t); break;
    case 2: RUN_LOOP(uint16_t); break;
    case 4: RUN_LOOP(uint32_t); break;
    case 8: RUN_LOOP(uint64_t); break;
    default:
        for (int64_t i = 0; i < n; i++) memcpy(dst + i * ds * esz, src + i * ss * esz, (size_t)esz);
    }
}

static void copy_runs(void *data, int64_t r0, int64_t r1) {
    const Copy *c = data;
    int last = c->rank - 1;
    for (int64_t r = r0; r < r1; r++) {
        int64_t so = 0, dof = 0, rest = r;
        for (int k = last - 1; k >= 0; k--) {
            int64_t i = rest % c->d[k];
            rest /= c->d[k];
            so += i * c->ss[k];
            dof += i * c->ds[k];
        }
        copy_run(c->src + so * c->esz, c->dst + dof * c->esz, c->esz, c->d[last], c->ss[last], c->ds[last]);
    }
}

/* args: src, dst, elem_bytes, rank, d0..d4, ss0..ss4, ds0..ds4 */
void rtk_copy(rt_ctx *ctx, const int64_t *a) {
    Copy c = {.src = A_PTR(0), .dst = A_PTR(1), .esz = a[2]};
    int rank = (int)a[3];
    for (int k = 0; k < rank; k++) {
        int64_t n = a[4 + k], ss = a[9 + k], ds = a[14 + k];
        if (n == 0) return; /* nothing to copy */
        if (n == 1) continue;
        int p = c.rank - 1;
        if (p >= 0 && c.ss[p] == n * ss && c.ds[p] == n * ds) { /* continues the outer dim */
            c.d[p] *= n;
            c.ss[p] = ss;
            c.ds[p] = ds;
        } else {
            c.d[c.rank] = n, c.ss[c.rank] = ss, c.ds[c.rank++] = ds;
        }
    }
    if (c.rank == 0) c.d[c.rank] = 1, c.ss[c.rank] = 1, c.ds[c.rank++] = 1; /* one element */
    int64_t runs = 1, run = c.d[c.rank - 1];
    for (int k = 0; k < c.rank - 1; k++) runs *= c.d[k];
    k_par(ctx, runs, run * c.esz, copy_runs, &c);
}

/* ---- fill, iota, memcpy ---- */

typedef struct {
    void *dst;
    int64_t n;
    int dtype;
    double v;
    const void *src;
} Fill;

static void fill_range(void *data, int64_t i0, int64_t i1) {
    const Fill *f = data;
    switch (f->dtype) {
    case RT_F32: {
        float *d = f->dst, v = (float)f->v;
        for (int64_t i = i0; i < i1; i++) d[i] = v;
        break;
    }
    case RT_I32: {
        int32_t *d = f->dst, v = (int32_t)f->v;
        for (int64_t i = i0; i < i1; i++) d[i] = v;
        break;
    }
    case RT_I64: {
        int64_t *d = f->dst, v = (int64_t)f->v;
        for (int64_t i = i0; i < i1; i++) d[i] = v;
        break;
    }
    }
}

/* an integer fill value: truncated like the interpreter, clamped (no UB on NaN or inf) */
static double int_value(double v, double lo, double hi) { return v != v ? 0 : v < lo ? lo : v > hi ? hi : trunc(v); }

/* args: dst, n, value(bits), dtype (f32 or i32 fill) */
void rtk_fill(rt_ctx *ctx, const int64_t *a) {
    Fill f = {.dst = A_PTR(0), .n = a[1], .v = A_F64(2), .dtype = (int)a[3]};
    if (f.dtype != RT_F32 && f.dtype != RT_I32 && f.dtype != RT_I64) {
        rt_fail(ctx, "fill: unsupported dtype %d", f.dtype);
        return;
    }
    if (f.dtype == RT_I32) f.v = int_value(f.v, INT32_MIN, INT32_MAX);
    if (f.dtype == RT_I64) f.v = int_value(f.v, -9.2e18, 9.2e18);
    k_par(ctx, f.n, 4, fill_range, &f);
}

static void iota_range(void *data, int64_t i0, int64_t i1) {
    int32_t *d = ((const Fill *)data)->dst;
    for (int64_t i = i0; i < i1; i++) d[i] = (int32_t)i;
}

/* i32 0..n-1.  args: dst, n */
void rtk_iota(rt_ctx *ctx, const int64_t *a) {
    Fill f = {.dst = A_PTR(0), .n = a[1]};
    k_par(ctx, f.n, 4, iota_range, &f);
}

#define MEMCPY_BLOCK (1 << 18) /* bytes per job */

static void memcpy_blocks(void *data, int64_t b0, int64_t b1) {
    const Fill *f = data;
    int64_t lo = b0 * MEMCPY_BLOCK, hi = b1 * MEMCPY_BLOCK < f->n ? b1 * MEMCPY_BLOCK : f->n;
    memcpy((char *)f->dst + lo, (const char *)f->src + lo, (size_t)(hi - lo));
}

/* args: dst, src, bytes */
void rtk_memcpy(rt_ctx *ctx, const int64_t *a) {
    Fill f = {.dst = A_PTR(0), .src = A_PTR(1), .n = a[2]};
    if (f.n <= 0 || f.dst == f.src) return;
    k_par(ctx, (f.n + MEMCPY_BLOCK - 1) / MEMCPY_BLOCK, MEMCPY_BLOCK, memcpy_blocks, &f);
}
