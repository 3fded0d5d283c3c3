/* xent_fused.cu — the fused classifier (issue 23): softmax cross-entropy's
 * forward, its loss and the logits' gradient in one kernel, llm.c's
 * fused_classifier.
 *
 *   lse = log(sum_j e^logits[j]),  loss = lse - logits[target]
 *   dlogits = dl * (softmax - onehot(target)),  softmax = e^(logits - lse)
 *
 * Why: the unfused pair (xent.cu) reads the [rows, V] logits three times
 * when the backward is given no lse (forward; backward's lse; backward's
 * gradient) and twice with it, in two launches, with the dl and lse arrays
 * between them.  When the loss's gradient seed is known at the forward (a
 * mean over the tokens times the loss scale: the same dl for every row),
 * the gradient can be written in the forward: this kernel reads each row
 * twice back to back, in the same block (the second read mostly from L2: a
 * row of V = 50257 bf16 is 100 KB), and writes the gradient once, in place
 * over the logits if dlogits = logits.  The backward then reads nothing.
 *
 * dl is a device pointer with a stride: stride 0 broadcasts dl[0] (the mean
 * seed, and a loss scale that may change step to step without a new
 * program); stride 1 is a per-row dl, the unfused backward's.  The math is
 * the unfused kernels' exactly (the same online lse, the same merge order,
 * the same expression per element), so loss and dlogits are bit for bit
 * kiln_cross_entropy_fwd's and kiln_cross_entropy_bwd's with lse given.
 *
 * In place: the block's threads write the row's gradient, so the target's
 * logit (for the loss) is read by every thread BEFORE the lse's barriers;
 * read after them, the thread that owns column target could overwrite it
 * first.  Each logit is read and then written by the same thread.
 *
 * Targets outside [0, V): as in xent.cu, that row's loss is NaN and its
 * dlogits row all NaN.  The model has no loss mask (ops.def cross_entropy
 * takes none), so there is no ignored-token case.
 *
 * One block per row (grid-stride over rows), block KILN_BLOCK, each thread
 * strides over the row's vocabulary (coalesced), issuing XENT_BATCH loads
 * before it uses them (the lse's fold is a dependent chain: one load at a
 * time left the memory system idle); the per-thread order is unchanged.
 */
#include "common.cuh"

/* logits per thread whose loads are issued together (the loops below) */
#define XENT_BATCH 16

/* log-sum-exp of the row x[0..V), one read */
static __device__ float fused_row_lse(const __nv_bfloat16 *x, long long V) {
    float m = kiln_neg_inf(), s = 0.0f;
    const long long step = blockDim.x;
    long long i = threadIdx.x;
    /* XENT_BATCH loads in flight per thread, then folded in index order: the
     * same sequence of kiln_lse_add as one element at a time (same bits) */
    for (; i + (XENT_BATCH - 1) * step < V; i += XENT_BATCH * step) {
        float v[XENT_BATCH];
#pragma unroll
        for (int u = 0; u < XENT_BATCH; u++) v[u] = kiln_ld(x, i + u * step);
#pragma unroll
        for (int u = 0; u < XENT_BATCH; u++) kiln_lse_add(m, s, v[u]);
    }
    for (; i < V; i += step) kiln_lse_add(m, s, kiln_ld(x, i));
    return kiln_block_lse(m, s);
}

/* dx[i] for the logit xi (the expression of xent.cu's backward) */
static __device__ __forceinline__ float fused_grad(float xi, long long i, int t, bool bad, float d, float L) {
    float g = d * expf(xi - L);
    if (i == t) g -= d;
    return bad ? kiln_nan() : g;
}

extern "C" __global__ void __launch_bounds__(KILN_BLOCK)
kiln_cross_entropy_fused(const __nv_bfloat16 *logits, const int *targets, const float *dl, long long dl_stride,
                         float *loss, __nv_bfloat16 *dlogits, long long rows, long long V) {
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const __nv_bfloat16 *x = logits + r * V;
        __nv_bfloat16 *dx = dlogits + r * V;
        int t = targets[r];
        bool bad = t < 0 || t >= V;
        float xt = bad ? 0.0f : kiln_ld(x, t); /* before the barriers: dx may be x */
        float L = fused_row_lse(x, V), d = dl[r * dl_stride];
        if (threadIdx.x == 0) loss[r] = bad ? kiln_nan() : L - xt;
        /* XENT_BATCH of this thread's logits read, then their gradients
         * written: each logit is still read before this thread writes it,
         * and no other thread touches it (in place is safe) */
        const long long step = blockDim.x;
        long long i = threadIdx.x;
        for (; i + (XENT_BATCH - 1) * step < V; i += XENT_BATCH * step) {
            float v[XENT_BATCH];
#pragma unroll
            for (int u = 0; u < XENT_BATCH; u++) v[u] = kiln_ld(x, i + u * step);
#pragma unroll
            for (int u = 0; u < XENT_BATCH; u++) kiln_st(dx, i + u * step, fused_grad(v[u], i + u * step, t, bad, d, L));
        }
        for (; i < V; i += step) kiln_st(dx, i, fused_grad(kiln_ld(x, i), i, t, bad, d, L));
    }
}
