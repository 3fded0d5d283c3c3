/* attn_merge.c — the log-sum-exp merge of two attention parts (IR op
 * attn_merge; ring attention, --cp-comm p2p): each part is attention of the
 * same queries over a disjoint set of keys, given as its output o and its
 * log-sum-exp lse; the merge is attention over the union.
 *
 * Per row: lse = hi + log1p(exp(lo - hi)) with hi, lo the larger and
 * smaller of lse_a, lse_b, and o = wa o_a + wb o_b, w = exp(lse_part - lse).
 * A part whose lse is -inf (all of its keys masked) weighs exactly 0 and a
 * row where both are -inf gives o = 0, lse = -inf: computing exp(-inf -
 * -inf) would be NaN (the Megatron-LM issue 1764 bug class), so -inf is
 * tested, never subtracted.  f32 math with libm's expf/log1pf (the row
 * weights are few; the D-long blend is the vectorised loop).  Rows are
 * independent, so the loop is parallel over rows, and each output element
 * is written after its inputs at the same index are read: o may be o_a or
 * o_b and lse may be lse_a or lse_b (kiln_rt.h).  compiler/interp.c
 * ex_attn_merge is the f64 reference.
 */
#include "kern.h"

typedef struct {
    const float *oa, *la, *ob, *lb;
    float *o, *lse;
    int64_t D;
} Merge;

K_CLONES static void merge_rows(void *data, int64_t r0, int64_t r1) {
    const Merge *m = data;
    int64_t D = m->D;
    for (int64_t r = r0; r < r1; r++) {
        float la = m->la[r], lb = m->lb[r], hi = la > lb ? la : lb, lo = la > lb ? lb : la;
        float lse = hi == -INFINITY ? -INFINITY : hi + log1pf(expf(lo - hi));
        float wa = la == -INFINITY ? 0.0f : expf(la - lse), wb = lb == -INFINITY ? 0.0f : expf(lb - lse);
        const float *xa = m->oa + r * D, *xb = m->ob + r * D;
        float *y = m->o + r * D;
        for (int64_t d = 0; d < D; d++) y[d] = wa * xa[d] + wb * xb[d];
        m->lse[r] = lse;
    }
}

void rtk_attn_merge(rt_ctx *ctx, const int64_t *a) {
    int64_t rows = a[6], D = a[7];
    if (rows < 0 || D < 0) {
        rt_fail(ctx, "attn_merge: bad shape %lld rows x %lld", (long long)rows, (long long)D);
        return;
    }
    Merge m = {A_F32(0), A_F32(1), A_F32(2), A_F32(3), A_F32(4), A_F32(5), D};
    k_par(ctx, rows, 3 * D + 32, merge_rows, &m);
}
