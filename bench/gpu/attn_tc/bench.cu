// bench/gpu/attn_tc/bench.cu — times kernels/cuda/attention_tc.cu at GPT-2
// 124M's shape (B 32, H 12, T = S 1024, D 64, causal, bf16) and checks two
// heads against a double-precision CPU reference, and that two runs give
// the same bits.  Built by build.sh with nvcc (ATC_SRC: the kernel file,
// so that an older version can be built beside it); SMEM_* give the
// launcher's dynamic shared memory (runtime/cuda/kernels_cuda.c attn_tc).
#include ATC_SRC
#ifndef BENCH_FWD /* the per-head-dim entry points (attention_tc.cu since 8b2fa01) */
#define BENCH_FWD kiln_attention_tc_fwd_d64
#define BENCH_DKDV kiln_attention_tc_bwd_dkdv_d64
#define BENCH_DQ kiln_attention_tc_bwd_dq_d64
#endif
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <vector>
#include <cstring>
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); exit(1); } } while (0)

__global__ void prep(const __nv_bfloat16 *dout, const __nv_bfloat16 *o, float *dt, long long rows, long long D) {
    long long r = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (r >= rows) return;
    float s = 0;
    for (long long d = 0; d < D; d++) s += __bfloat162float(dout[r * D + d]) * __bfloat162float(o[r * D + d]);
    dt[r] = s;
}
static unsigned long long rs = 88172645463325252ull;
static double urand() { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return (rs >> 11) * (1.0 / 9007199254740992.0); }
static float bf(const __nv_bfloat16 &x) { return __bfloat162float(x); }

int main(int argc, char **argv) {
    const long long B = 32, H = 12, KH = 12, T = 1024, S = 1024, D = 64, W = 0;
    const int causal = 1, iters = argc > 1 ? atoi(argv[1]) : 20;
    const double scale = 0.125;
    const size_t nq = B * H * T * D;
    std::vector<__nv_bfloat16> hq(nq), hk(nq), hv(nq), hdo(nq);
    for (auto &x : hq) x = __float2bfloat16_rn((float)(4 * urand() - 2));
    for (auto &x : hk) x = __float2bfloat16_rn((float)(4 * urand() - 2));
    for (auto &x : hv) x = __float2bfloat16_rn((float)(2 * urand() - 1));
    for (auto &x : hdo) x = __float2bfloat16_rn((float)(2 * urand() - 1));
    __nv_bfloat16 *q, *k, *v, *o, *dout, *dq, *dk, *dv;
    float *lse, *dt;
    CK(cudaMalloc(&q, nq * 2)); CK(cudaMalloc(&k, nq * 2)); CK(cudaMalloc(&v, nq * 2)); CK(cudaMalloc(&o, nq * 2));
    CK(cudaMalloc(&dout, nq * 2)); CK(cudaMalloc(&dq, nq * 2)); CK(cudaMalloc(&dk, nq * 2)); CK(cudaMalloc(&dv, nq * 2));
    CK(cudaMalloc(&lse, B * H * T * 4)); CK(cudaMalloc(&dt, B * H * T * 4));
    CK(cudaMemcpy(q, hq.data(), nq * 2, cudaMemcpyHostToDevice)); CK(cudaMemcpy(k, hk.data(), nq * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(v, hv.data(), nq * 2, cudaMemcpyHostToDevice)); CK(cudaMemcpy(dout, hdo.data(), nq * 2, cudaMemcpyHostToDevice));
    const int smf = SMEM_FWD(D), smb = SMEM_BWD(D);
    CK(cudaFuncSetAttribute(BENCH_FWD, cudaFuncAttributeMaxDynamicSharedMemorySize, smf));
    CK(cudaFuncSetAttribute(BENCH_DKDV, cudaFuncAttributeMaxDynamicSharedMemorySize, smb));
    CK(cudaFuncSetAttribute(BENCH_DQ, cudaFuncAttributeMaxDynamicSharedMemorySize, smb));
    const int *np = 0;
    auto fwd = [&] { BENCH_FWD<<<B * H * (T / 64), 128, smf>>>(q, k, v, np, np, o, lse, B, H, KH, T, S, D, causal, W, scale); };
    auto dkdv = [&] { BENCH_DKDV<<<B * KH * (S / 64), 128, smb>>>(dout, q, k, v, lse, dt, np, np, dk, dv, B, H, KH, T, S, D, causal, W, scale); };
    auto dqk = [&] { BENCH_DQ<<<B * H * (T / 64), 128, smb>>>(dout, q, k, v, lse, dt, np, np, dq, B, H, KH, T, S, D, causal, W, scale); };
    cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    float ms;
    auto timeit = [&](const char *name, auto f) {
        f(); CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
        CK(cudaEventRecord(e0));
        for (int i = 0; i < iters; i++) f();
        CK(cudaEventRecord(e1)); CK(cudaEventSynchronize(e1)); CK(cudaGetLastError());
        CK(cudaEventElapsedTime(&ms, e0, e1));
        printf("%-6s %8.3f ms\n", name, ms / iters);
        return ms / iters;
    };
    float tf = timeit("fwd", fwd);
    prep<<<(B * H * T + 255) / 256, 256>>>(dout, o, dt, B * H * T, D); CK(cudaGetLastError());
    float tk = timeit("dkdv", dkdv), tq = timeit("dq", dqk);
    printf("fwd %.1f TFLOP/s (causal 2*2*B*H*T*S*D/2), bwd(dkdv+dq) %.3f ms\n", 4.0 * B * H * T * S * D / 2 / (tf * 1e-3) / 1e12, tk + tq);
    // outputs twice: same bits?
    std::vector<__nv_bfloat16> ho(nq), hdq(nq), hdk(nq), hdv(nq), h2(nq);
    std::vector<float> hl(B * H * T);
    CK(cudaMemcpy(ho.data(), o, nq * 2, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(hl.data(), lse, B * H * T * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hdq.data(), dq, nq * 2, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(hdk.data(), dk, nq * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hdv.data(), dv, nq * 2, cudaMemcpyDeviceToHost));
    fwd(); dkdv(); dqk(); CK(cudaDeviceSynchronize());
    int same = 1;
    CK(cudaMemcpy(h2.data(), o, nq * 2, cudaMemcpyDeviceToHost)); same &= !memcmp(h2.data(), ho.data(), nq * 2);
    CK(cudaMemcpy(h2.data(), dq, nq * 2, cudaMemcpyDeviceToHost)); same &= !memcmp(h2.data(), hdq.data(), nq * 2);
    CK(cudaMemcpy(h2.data(), dk, nq * 2, cudaMemcpyDeviceToHost)); same &= !memcmp(h2.data(), hdk.data(), nq * 2);
    CK(cudaMemcpy(h2.data(), dv, nq * 2, cudaMemcpyDeviceToHost)); same &= !memcmp(h2.data(), hdv.data(), nq * 2);
    printf("rerun same bits: %s\n", same ? "yes" : "NO");
    // reference for heads 0 and B*H-1 (double; P from the reference's own softmax)
    double eo = 0, el = 0, eq = 0, ek = 0, ev = 0, mo = 0, mq = 0, mk = 0, mv = 0;
    unsigned long long hsum = 1469598103934665603ull;
    for (size_t i = 0; i < nq; i++) { hsum = (hsum ^ ((unsigned short *)ho.data())[i]) * 1099511628211ull; hsum = (hsum ^ ((unsigned short *)hdq.data())[i]) * 1099511628211ull; hsum = (hsum ^ ((unsigned short *)hdk.data())[i]) * 1099511628211ull; }
    for (long long bh : {0LL, B * H - 1}) {
        const size_t base = bh * T * D;
        std::vector<double> P(T * S), dP(T * S), Dq(T * D, 0), Dk(S * D, 0), Dv(S * D, 0), O(T * D, 0);
        for (long long t = 0; t < T; t++) {
            double m = -1e300;
            for (long long s = 0; s <= t; s++) {
                double a = 0;
                for (long long d = 0; d < D; d++) a += (double)bf(hq[base + t * D + d]) * bf(hk[base + s * D + d]);
                P[t * S + s] = a * scale; m = fmax(m, a * scale);
            }
            double l = 0;
            for (long long s = 0; s <= t; s++) l += P[t * S + s] = exp(P[t * S + s] - m);
            for (long long s = 0; s <= t; s++) P[t * S + s] /= l;
            for (long long s = t + 1; s < S; s++) P[t * S + s] = 0;
            el = fmax(el, fabs(hl[bh * T + t] - (m + log(l))));
            for (long long d = 0; d < D; d++) {
                double a = 0;
                for (long long s = 0; s <= t; s++) a += P[t * S + s] * bf(hv[base + s * D + d]);
                O[t * D + d] = a; eo = fmax(eo, fabs(bf(ho[base + t * D + d]) - a)); mo = fmax(mo, fabs(a));
            }
            double Dt = 0;
            for (long long d = 0; d < D; d++) Dt += (double)bf(hdo[base + t * D + d]) * bf(ho[base + t * D + d]);
            for (long long s = 0; s <= t; s++) {
                double a = 0;
                for (long long d = 0; d < D; d++) a += (double)bf(hdo[base + t * D + d]) * bf(hv[base + s * D + d]);
                dP[t * S + s] = P[t * S + s] * (a - Dt) * scale;
            }
        }
        for (long long t = 0; t < T; t++)
            for (long long s = 0; s <= t; s++)
                for (long long d = 0; d < D; d++) {
                    Dq[t * D + d] += dP[t * S + s] * bf(hk[base + s * D + d]);
                    Dk[s * D + d] += dP[t * S + s] * bf(hq[base + t * D + d]);
                    Dv[s * D + d] += P[t * S + s] * bf(hdo[base + t * D + d]);
                }
        for (long long i = 0; i < T * D; i++) {
            eq = fmax(eq, fabs(bf(hdq[base + i]) - Dq[i])); mq = fmax(mq, fabs(Dq[i]));
            ek = fmax(ek, fabs(bf(hdk[base + i]) - Dk[i])); mk = fmax(mk, fabs(Dk[i]));
            ev = fmax(ev, fabs(bf(hdv[base + i]) - Dv[i])); mv = fmax(mv, fabs(Dv[i]));
        }
    }
    printf("vs double reference, heads 0 and %lld: max|err| o %.3g (max|o| %.3g), lse %.3g, dq %.3g (%.3g), dk %.3g (%.3g), dv %.3g (%.3g)\n",
           B * H - 1, eo, mo, el, eq, mq, ek, mk, ev, mv);
    printf("hash of o, dq, dk: %016llx\n", hsum);
    int ok = same && eo < 0.02 && el < 0.01 && eq < 0.05 * mq && ek < 0.05 * mk && ev < 0.05 * mv;
    printf("%s\n", ok ? "PASS" : "FAIL");
    return !ok;
}
