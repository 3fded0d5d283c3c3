/* gemm.c — rtk_gemm: (batched) matrix products on OpenBLAS sgemm.
 *
 * C[b] = op(A[b]) x op(B[b]) (+ C[b] when beta = 1), row-major, strides in
 * elements between batch entries (0: one matrix shared by every b).
 *
 * Three shapes of call, fastest first:
 *  - one product (batch 1), or a batch whose B is shared and whose A and C
 *    are contiguous [batch*M, K] / [batch*M, N] rows with A not transposed:
 *    that is a single sgemm with M' = batch*M (the linear layers of a
 *    transformer, x[B,T,C] x w[C,N]), where OpenBLAS uses all its threads;
 *  - many small products (each under OpenBLAS's own threading threshold):
 *    spread over the runtime's pool, one sgemm per batch entry;
 *  - otherwise a loop of sgemm calls, each threaded by OpenBLAS.
 */
#include "kern.h"

#include <cblas.h>

typedef struct {
    const float *A, *B;
    float *C;
    int64_t M, N, K, sA, sB, sC;
    int ta, tb;
    float beta;
} Gemm;

static void gemm_one(const Gemm *g, int64_t M, const float *A, const float *B, float *C) {
    if (M == 0 || g->N == 0) return;
    if (g->K == 0) { /* sgemm's quick return may skip the beta scaling */
        if (g->beta == 0) memset(C, 0, sizeof(float) * (size_t)(M * g->N));
        return;
    }
    cblas_sgemm(CblasRowMajor, g->ta ? CblasTrans : CblasNoTrans, g->tb ? CblasTrans : CblasNoTrans,
                (blasint)M, (blasint)g->N, (blasint)g->K, 1.0f, A, (blasint)(g->ta ? M : g->K),
                B, (blasint)(g->tb ? g->K : g->N), g->beta, C, (blasint)g->N);
}

static void gemm_items(void *data, int64_t b0, int64_t b1) {
    const Gemm *g = data;
    for (int64_t b = b0; b < b1; b++) gemm_one(g, g->M, g->A + b * g->sA, g->B + b * g->sB, g->C + b * g->sC);
}

/* args: A, B, C, batch, M, N, K, ta, tb, strideA, strideB, strideC, beta(bits) */
void rtk_gemm(rt_ctx *ctx, const int64_t *a) {
    Gemm g = {A_F32(0), A_F32(1), A_F32(2), a[4], a[5], a[6], a[9], a[10], a[11], a[7] != 0, a[8] != 0, (float)A_F64(12)};
    int64_t batch = a[3];
    if (batch <= 0) return;
    if (batch == 1) {
        gemm_one(&g, g.M, g.A, g.B, g.C);
    } else if (g.sB == 0 && !g.ta && g.sA == g.M * g.K && g.sC == g.M * g.N) {
        gemm_one(&g, batch * g.M, g.A, g.B, g.C); /* [batch*M, K] x B */
    } else if (g.M * g.N * g.K < (1 << 18)) {
        /* small products: OpenBLAS runs each on the calling thread */
        k_par(ctx, batch, 2 * g.M * g.N * g.K, gemm_items, &g);
    } else {
        gemm_items(&g, 0, batch);
    }
}
