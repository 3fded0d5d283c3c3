/* adamw.cu — the AdamW update on f32 master weights, with a bf16 copy of
 * the result for the forward's GEMMs (ops.def adamw; CPU twin
 * kernels/cpu/optim.c, reference compiler/interp.c ex_adamw).
 *
 * torch.optim.AdamW on the gradient scaled first (scale = the clipping
 * factor), with bias correction at step t and decoupled weight decay:
 *     g' = g*scale
 *     m' = b1 m + (1-b1) g';  v' = b2 v + (1-b2) g'^2
 *     p' = p - lr wd p - lr (m'/bc1) / (sqrt(v'/bc2) + eps),  bck = 1 - bk^t
 * lr, scale and t are f32 scalars in device memory, computed earlier in the
 * step (lr_cosine, clipscale, the step counter), so the kernel reads them
 * when it runs and a captured CUDA graph stays valid from step to step.
 * As in the twin, thread 0 of each block computes the bias corrections and
 * lr*wd once, in double, and the per-element math is f32 in the twin's
 * order.  Everything is elementwise and each element is read before it is
 * written by the same thread, so p_out may be p, m_out m and v_out v.
 * p_bf16 (may be NULL) receives p' rounded to bf16.
 */
#include "common.cuh"

/* the step's scalars, as the twin's Adam struct */
typedef struct {
    float b1, b2, eps, lr, lrwd, scale, ibc1, ibc2;
} AdamScalars;

static __device__ AdamScalars adam_scalars(const float *lr, const float *scale, const float *t, double b1, double b2,
                                           double eps, double wd) {
    double l = *lr, step = *t;
    AdamScalars s;
    s.b1 = (float)b1;
    s.b2 = (float)b2;
    s.eps = (float)eps;
    s.lr = (float)l;
    s.lrwd = (float)(l * wd);
    s.scale = *scale;
    s.ibc1 = (float)(1.0 / (1.0 - pow(b1, step)));
    s.ibc2 = (float)(1.0 / (1.0 - pow(b2, step)));
    return s;
}

/* one element, in the twin's order */
static __device__ __forceinline__ void adam_elem(const AdamScalars &s, float p, float g, float m, float v, float &p_out, float &m_out,
                                                 float &v_out) {
    float gi = g * s.scale;
    float mi = s.b1 * m + (1.0f - s.b1) * gi;
    float vi = s.b2 * v + (1.0f - s.b2) * gi * gi;
    float den = sqrtf(vi * s.ibc2);
    float pi = p;
    pi = pi - s.lrwd * pi;
    pi = pi - s.lr * (mi * s.ibc1) / (den + s.eps);
    p_out = pi;
    m_out = mi;
    v_out = vi;
}

struct __align__(8) kiln_adam_bf4 { __nv_bfloat16 v[4]; };

extern "C" __global__ void __launch_bounds__(KILN_BLOCK)
kiln_adamw(const float *p, const float *g, const float *m, const float *v, const float *lr, const float *scale,
           const float *t, float *p_out, float *m_out, float *v_out, __nv_bfloat16 *p_bf16, long long n, double b1,
           double b2, double eps, double wd) {
    __shared__ AdamScalars sh;
    if (threadIdx.x == 0) sh = adam_scalars(lr, scale, t, b1, b2, eps, wd);
    __syncthreads();
    AdamScalars s = sh;
    long long first = 0; /* the scalar loop's first element */
    /* 4 elements per thread with 16-byte loads and stores (8-byte bf16
     * stores) when every array is aligned for them: the same per-element
     * math (adam_elem), so the same bits as the scalar loop */
    if (((((unsigned long long)p | (unsigned long long)g | (unsigned long long)m | (unsigned long long)v | (unsigned long long)p_out |
           (unsigned long long)m_out | (unsigned long long)v_out) & 15) | ((unsigned long long)p_bf16 & 7)) == 0) {
        const long long nq = n / 4;
        for (long long q = blockIdx.x * (long long)blockDim.x + threadIdx.x; q < nq; q += (long long)gridDim.x * blockDim.x) {
            const float4 p4 = ((const float4 *)p)[q], g4 = ((const float4 *)g)[q], m4 = ((const float4 *)m)[q], v4 = ((const float4 *)v)[q];
            float4 po, mo, vo;
            adam_elem(s, p4.x, g4.x, m4.x, v4.x, po.x, mo.x, vo.x);
            adam_elem(s, p4.y, g4.y, m4.y, v4.y, po.y, mo.y, vo.y);
            adam_elem(s, p4.z, g4.z, m4.z, v4.z, po.z, mo.z, vo.z);
            adam_elem(s, p4.w, g4.w, m4.w, v4.w, po.w, mo.w, vo.w);
            ((float4 *)p_out)[q] = po;
            ((float4 *)m_out)[q] = mo;
            ((float4 *)v_out)[q] = vo;
            if (p_bf16) {
                kiln_adam_bf4 b;
                b.v[0] = __float2bfloat16_rn(po.x);
                b.v[1] = __float2bfloat16_rn(po.y);
                b.v[2] = __float2bfloat16_rn(po.z);
                b.v[3] = __float2bfloat16_rn(po.w);
                ((kiln_adam_bf4 *)p_bf16)[q] = b;
            }
        }
        first = nq * 4;
    }
    for (long long i = first + blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        float pi, mi, vi;
        adam_elem(s, p[i], g[i], m[i], v[i], pi, mi, vi);
        p_out[i] = pi;
        m_out[i] = mi;
        v_out[i] = vi;
        if (p_bf16) kiln_st(p_bf16, i, pi);
    }
}
