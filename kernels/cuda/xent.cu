/* xent.cu — softmax cross-entropy over the last dim V, forward and backward
 * (ops.def cross_entropy, cross_entropy_bwd; CPU twin kernels/cpu/xent.c).
 *
 *   forward:  lse = log(sum_j e^logits[j]), loss = lse - logits[target]
 *   backward: dlogits = dl * (softmax - onehot(target)), softmax = e^(logits - lse)
 *
 * One block per row.  The forward reads the row once: each thread keeps an
 * online (max, sum) pair over its columns (common.cuh kiln_lse_add), and
 * the block merges the pairs in a fixed order.  loss and lse are f32.  The
 * forward may also store lse (f32 per row) for the backward; the backward
 * takes it, or recomputes it from the logits when given NULL (the IR op
 * saves nothing, so that is the plain case).  The backward reads each logit
 * and writes its gradient in the same thread, after the row's lse is known,
 * so dlogits may be logits (the usual in-place classifier backward).
 *
 * Targets outside [0, V): the twin fails the step (rt_fail); a kernel cannot,
 * so that row's loss is NaN and its dlogits row is all NaN, which the
 * trainer's loss and grad-norm checks then report.
 */
#include "common.cuh"

/* log-sum-exp of the row x[0..V), one pass */
static __device__ float row_lse(const __nv_bfloat16 *x, long long V) {
    float m = kiln_neg_inf(), s = 0.0f;
    for (long long i = threadIdx.x; i < V; i += blockDim.x) kiln_lse_add(m, s, kiln_ld(x, i));
    return kiln_block_lse(m, s);
}

extern "C" __global__ void __launch_bounds__(KILN_BLOCK)
kiln_cross_entropy_fwd(const __nv_bfloat16 *logits, const int *targets, float *loss, float *lse, long long rows,
                       long long V) {
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const __nv_bfloat16 *x = logits + r * V;
        float L = row_lse(x, V);
        if (threadIdx.x == 0) {
            int t = targets[r];
            loss[r] = t < 0 || t >= V ? kiln_nan() : L - kiln_ld(x, t);
            if (lse) lse[r] = L;
        }
    }
}

extern "C" __global__ void __launch_bounds__(KILN_BLOCK)
kiln_cross_entropy_bwd(const float *dl, const __nv_bfloat16 *logits, const int *targets, const float *lse,
                       __nv_bfloat16 *dlogits, long long rows, long long V) {
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const __nv_bfloat16 *x = logits + r * V;
        __nv_bfloat16 *dx = dlogits + r * V;
        float L = lse ? lse[r] : row_lse(x, V), d = dl[r];
        int t = targets[r];
        bool bad = t < 0 || t >= V;
        for (long long i = threadIdx.x; i < V; i += blockDim.x) {
            float g = d * expf(kiln_ld(x, i) - L);
            if (i == t) g -= d;
            kiln_st(dx, i, bad ? kiln_nan() : g);
        }
    }
}
