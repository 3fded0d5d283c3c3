/* embed.c — embedding lookup and its backward (scatter-add).
 *
 * Ids are checked first: one outside [0, V) fails the step through rt_fail
 * (the trainer then reports it) and the kernel returns without writing.
 *
 * The backward adds the rows of dy into dtable rows picked by the ids, and
 * ids repeat.  Instead of locks or per-thread tables, jobs split the columns:
 * job c owns columns [16c, 16c+16) (one cache line) of every row of dtable
 * and walks all n ids in order, so the sums are race-free and come out in
 * the same order as the reference interpreter's.
 */
#include "kern.h"

#define EMB_COLS 16

typedef struct {
    const float *table, *dy;
    const int32_t *ids;
    float *out;
    int64_t n, C, V;
} Emb;

/* 0 if every id is in [0, V); else rt_fail and -1 */
static int ids_ok(rt_ctx *ctx, const char *op, const char *what, const int32_t *ids, int64_t n, int64_t V) {
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V) {
            rt_fail(ctx, "%s: %s %d out of range [0,%lld)", op, what, ids[i], (long long)V);
            return -1;
        }
    return 0;
}

static void gather_rows(void *data, int64_t i0, int64_t i1) {
    const Emb *e = data;
    for (int64_t i = i0; i < i1; i++)
        memcpy(e->out + i * e->C, e->table + (int64_t)e->ids[i] * e->C, sizeof(float) * (size_t)e->C);
}

static void scatter_cols(void *data, int64_t c0, int64_t c1) {
    const Emb *e = data;
    int64_t lo = c0 * EMB_COLS, hi = c1 * EMB_COLS < e->C ? c1 * EMB_COLS : e->C, C = e->C;
    for (int64_t r = 0; r < e->V; r++) memset(e->out + r * C + lo, 0, sizeof(float) * (size_t)(hi - lo));
    for (int64_t i = 0; i < e->n; i++) {
        float *dst = e->out + (int64_t)e->ids[i] * C;
        const float *src = e->dy + i * C;
        for (int64_t c = lo; c < hi; c++) dst[c] += src[c];
    }
}

/* args: table, ids, out, n, C, V */
void rtk_embedding(rt_ctx *ctx, const int64_t *a) {
    Emb e = {.table = A_F32(0), .ids = A_I32(1), .out = A_F32(2), .n = a[3], .C = a[4], .V = a[5]};
    if (ids_ok(ctx, "embedding", "id", e.ids, e.n, e.V)) return;
    k_par(ctx, e.n, e.C, gather_rows, &e);
}

/* args: dy, ids, dtable, n, C, V */
void rtk_embedding_bwd(rt_ctx *ctx, const int64_t *a) {
    Emb e = {.dy = A_F32(0), .ids = A_I32(1), .out = A_F32(2), .n = a[3], .C = a[4], .V = a[5]};
    if (ids_ok(ctx, "embedding_bwd", "id", e.ids, e.n, e.V)) return;
    k_par(ctx, (e.C + EMB_COLS - 1) / EMB_COLS, (e.n + e.V) * EMB_COLS, scatter_cols, &e);
}
