// check_attention_tc.cpp — kernels/cuda/attention_tc.cu (the tensor-core
// flash-attention forward) on the host emulator, whose mma.sync and
// ldmatrix follow the PTX fragment layouts (emu.h, "tensor cores"; checked
// on their own by check_mma.cpp), against a double-precision reference
// written here from compiler/ops.def's attention.  Run by t_cuda_emu.sh,
// which also plants bugs in copies of the kernel (a fragment index, a
// missing __syncthreads) and sees this fail.
//
// Inputs are bf16 (q, k in [-2, 2], v in [-1, 1]); the reference takes the
// same bf16 values.  Tolerances ("bf16 tolerance"): the kernel rounds P to
// bf16 before P v (FlashAttention's choice; its row sum adds the same
// rounded values, so o is a convex mix of v rows whose weights are each off
// by at most 2^-8 relative), and rounds o to bf16:
//   o:   |got - want| <= ulp_bf16(want) + 2^-7 max|v|
//   lse: |got - want| <= 2^-8 (1 + |want|)
//   rows that see no key: o exactly 0, lse exactly -inf.
// Outputs are poisoned with NaN and sit between guard zones; the launch has
// the README's block (128), grid (B H ceil(T/64)) and dynamic shared memory
// (640 (D + 8) + 768 bytes: the emulator's region ends at a guard page);
// shared memory starts as NaN in every block.  Both warp orders run
// (emu.h: even blocks forward, odd reverse), which is what exposes a
// missing barrier.
//
// The backward (kiln_attention_tc_bwd_dkdv_dD, then _dq_dD; Dt = do . o is
// computed here in f32, as attention.cu's kiln_attention_bwd_prep does) is
// checked from the reference's o (bf16) and lse (f32) against the double
// reference backward: each of dq, dk, dv within
//   ulp_bf16(want) + 2^-7 sum|terms| + 1e-4 max|want|
// (P and dS are rounded to bf16 for the products, 2^-9 each; the last term
// covers the f32 cancellation in dP - Dt), and a smaller grid must give the
// same bits (no atomics: the sums run in a fixed order).
//
// Cases: causal and not, MHA and GQA, T != S, long ones (520: nine key
// tiles through the double buffers), lengths that are not
// multiples of 16 or 64, D 16, 32, 64, 128, positions as context parallel
// gives them (a dual-chunk rank against the all-gathered keys; a ring
// step's second half of the queries against a received block, no mask; a
// ring block wholly in the future: every row sees nothing), sliding
// windows by index and by position, empty T or S, a smaller grid giving
// the same bits, and a D (48) that is not the entry point's writing NaN.
#include "emu.h"

#include "attention_tc.cu"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

typedef std::vector<__nv_bfloat16> BV;
typedef std::vector<double> DV;
typedef std::vector<int> IV;

static uint64_t rs = 0x9E3779B97F4A7C15ull;
static double urand() { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return (rs >> 11) * (1.0 / 9007199254740992.0); }
static BV rbf(size_t n, double lo, double hi) { BV v(n); for (auto &x : v) x = __float2bfloat16_rn((float)(lo + (hi - lo) * urand())); return v; }
static double f(const __nv_bfloat16 &b) { return __bfloat162float(b); }
static long long cdiv(long long a, long long b) { return (a + b - 1) / b; }
static double bf16_ulp(double x) { return x == 0 ? 0 : ldexp(1.0, ilogb(x) - 7); }

static int tap_n, tap_failed;
static void tap(bool ok, const std::string &what) {
    tap_n++;
    tap_failed += !ok;
    printf("%s %d - %s\n", ok ? "ok" : "not ok", tap_n, what.c_str());
}

// the runtime's entry point for head dim D (kernels_cuda.c: NAME_dD); for
// a D none of them takes, _d64's (which must write NaN: its D differs)
typedef decltype(&kiln_attention_tc_fwd_d64) FwdKernel;
typedef decltype(&kiln_attention_tc_bwd_dkdv_d64) DkdvKernel;
typedef decltype(&kiln_attention_tc_bwd_dq_d64) DqKernel;
static FwdKernel fwd_kernel(long long D) {
    return D == 16 ? kiln_attention_tc_fwd_d16 : D == 32 ? kiln_attention_tc_fwd_d32 : D == 128 ? kiln_attention_tc_fwd_d128 : kiln_attention_tc_fwd_d64;
}
static DkdvKernel dkdv_kernel(long long D) {
    return D == 16 ? kiln_attention_tc_bwd_dkdv_d16 : D == 32 ? kiln_attention_tc_bwd_dkdv_d32 : D == 128 ? kiln_attention_tc_bwd_dkdv_d128 : kiln_attention_tc_bwd_dkdv_d64;
}
static DqKernel dq_kernel(long long D) {
    return D == 16 ? kiln_attention_tc_bwd_dq_d16 : D == 32 ? kiln_attention_tc_bwd_dq_d32 : D == 128 ? kiln_attention_tc_bwd_dq_d128 : kiln_attention_tc_bwd_dq_d64;
}

// the README's launch rules
static long long smem_tc(long long D) { return 640 * (D + 8) + 768; }
static long long grid_tc(long long B, long long H, long long T) { return B * H * cdiv(T, 64); }

struct Problem {
    long long B, H, KH, T, S, D;
    int causal;
    double scale;
    IV qpos, kpos;
    long long window = 0;
    const int *qp() const { return qpos.empty() ? nullptr : qpos.data(); }
    const int *kp() const { return kpos.empty() ? nullptr : kpos.data(); }
    bool visible(long long t, long long s) const {
        if (!causal) return true;
        long long d = qpos.empty() || kpos.empty() ? t - s : (long long)qpos[t] - kpos[s];
        return d >= 0 && (window == 0 || d < window);
    }
};

static void ref_fwd(const Problem &p, const BV &q, const BV &k, const BV &v, DV &o, DV &lse) {
    long long D = p.D, rep = p.H / p.KH;
    o.assign(p.B * p.H * p.T * D, 0);
    lse.assign(p.B * p.H * p.T, 0);
    DV sc(p.S);
    for (long long b = 0; b < p.B; b++)
        for (long long h = 0; h < p.H; h++)
            for (long long t = 0; t < p.T; t++) {
                long long qo = ((b * p.H + h) * p.T + t) * D, ko = (b * p.KH + h / rep) * p.S * D, row = (b * p.H + h) * p.T + t;
                double m = -INFINITY, l = 0;
                for (long long s = 0; s < p.S; s++) {
                    if (!p.visible(t, s)) continue;
                    double x = 0;
                    for (long long d = 0; d < D; d++) x += f(q[qo + d]) * f(k[ko + s * D + d]);
                    sc[s] = p.scale * x;
                    m = std::max(m, sc[s]);
                }
                if (m == -INFINITY) { lse[row] = -INFINITY; continue; }
                for (long long s = 0; s < p.S; s++) {
                    if (!p.visible(t, s)) continue;
                    double e = exp(sc[s] - m);
                    l += e;
                    for (long long d = 0; d < D; d++) o[qo + d] += e * f(v[ko + s * D + d]);
                }
                for (long long d = 0; d < D; d++) o[qo + d] /= l;
                lse[row] = m + log(l);
            }
}

// the backward from the o (bf16) and lse (f32) it is given, as interp.c:
// P = e^(scale q.k - lse), Dt = do . o; mag_* = the sums of |terms| of each
// output element (the scale of the rounding of P and dS to bf16)
struct Grads {
    DV dq, dk, dv, mag_dq, mag_dk, mag_dv;
};

static void ref_bwd(const Problem &p, const BV &dO, const BV &q, const BV &k, const BV &v, const BV &o,
                    const std::vector<float> &lse, Grads &r) {
    long long D = p.D, rep = p.H / p.KH, nq = p.B * p.H * p.T * D, nk = p.B * p.KH * p.S * D;
    r.dq.assign(nq, 0), r.mag_dq.assign(nq, 0);
    r.dk.assign(nk, 0), r.mag_dk.assign(nk, 0);
    r.dv.assign(nk, 0), r.mag_dv.assign(nk, 0);
    for (long long b = 0; b < p.B; b++)
        for (long long h = 0; h < p.H; h++)
            for (long long t = 0; t < p.T; t++) {
                long long row = (b * p.H + h) * p.T + t, qo = row * D, ko = (b * p.KH + h / rep) * p.S * D;
                double L = lse[row], Dt = 0;
                if (L == -INFINITY) continue;
                for (long long d = 0; d < D; d++) Dt += f(dO[qo + d]) * f(o[qo + d]);
                for (long long s = 0; s < p.S; s++) {
                    if (!p.visible(t, s)) continue;
                    double x = 0, dp = 0;
                    for (long long d = 0; d < D; d++) x += f(q[qo + d]) * f(k[ko + s * D + d]), dp += f(dO[qo + d]) * f(v[ko + s * D + d]);
                    double P = exp(p.scale * x - L), dS = P * (dp - Dt) * p.scale;
                    for (long long d = 0; d < D; d++) {
                        r.dv[ko + s * D + d] += P * f(dO[qo + d]), r.mag_dv[ko + s * D + d] += fabs(P * f(dO[qo + d]));
                        r.dq[qo + d] += dS * f(k[ko + s * D + d]), r.mag_dq[qo + d] += fabs(dS * f(k[ko + s * D + d]));
                        r.dk[ko + s * D + d] += dS * f(q[qo + d]), r.mag_dk[ko + s * D + d] += fabs(dS * f(q[qo + d]));
                    }
                }
            }
}

// an output poisoned with NaN between guard zones of 0xa5 bytes
template <class T>
struct Guarded {
    enum { G = 64 };
    std::vector<T> v;
    size_t n = 0;
    void poison(size_t n_) {
        n = n_;
        v.assign(n + 2 * G, T{});
        memset((void *)v.data(), 0xa5, sizeof(T) * v.size());
        if constexpr (std::is_same<T, float>::value) for (size_t i = 0; i < n; i++) v[G + i] = NAN;
        else for (size_t i = 0; i < n; i++) v[G + i].bits = 0x7fa0;
    }
    T *data() { return v.data() + G; }
    const T &operator[](size_t i) const { return v[G + i]; }
    bool intact() const {
        const unsigned char *p = (const unsigned char *)v.data(), *e = (const unsigned char *)(v.data() + G + n);
        for (size_t i = 0; i < sizeof(T) * G; i++)
            if (p[i] != 0xa5 || e[i] != 0xa5) return false;
        return true;
    }
};

struct Run {
    Guarded<__nv_bfloat16> o;
    Guarded<float> lse;
    bool launched = true;
    std::string error;
};

static void run_tc_at(const Problem &p, const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v, Run &r,
                      long long grid = -1);
static void run_tc(const Problem &p, const BV &q, const BV &k, const BV &v, Run &r, long long grid = -1) {
    run_tc_at(p, q.data(), k.data(), v.data(), r, grid);
}
static void run_tc_at(const Problem &p, const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v, Run &r,
                      long long grid) {
    r.o.poison(p.B * p.H * p.T * p.D);
    r.lse.poison(p.B * p.H * p.T);
    long long g = grid < 0 ? grid_tc(p.B, p.H, p.T) : std::min(grid, grid_tc(p.B, p.H, p.T));
    if (g == 0) return;
    try {
        emu_launch(dim3((unsigned)g), dim3(128), (size_t)smem_tc(p.D), [&] {
            fwd_kernel(p.D)(q, k, v, p.qp(), p.kp(), r.o.data(), r.lse.data(), p.B, p.H,
                                  p.KH, p.T, p.S, p.D, p.causal, p.window, p.scale);
        });
    } catch (const EmuError &e) {
        r.launched = false;
        r.error = e.what();
    }
}

static std::string describe(const char *name, const Problem &p);
static long long grid_dkdv(long long B, long long KH, long long S) { return B * KH * cdiv(S, 64); }
static long long smem_bwd(long long D) { return 768 * (D + 8) + 1792; }

struct BwdRun {
    Guarded<__nv_bfloat16> dq, dk, dv;
    bool launched = true;
    std::string error;
};

// dt = do . o per row in f32 (what attention.cu's kiln_attention_bwd_prep
// writes; checked by check_attention.cpp), then dkdv and dq
static void run_tc_bwd(const Problem &p, const BV &dO, const BV &q, const BV &k, const BV &v, const BV &o,
                       const std::vector<float> &lse, BwdRun &r, long long grid = -1) {
    long long nl = p.B * p.H * p.T;
    std::vector<float> dt(nl);
    for (long long i = 0; i < nl; i++) {
        float a = 0;
        for (long long d = 0; d < p.D; d++) a += f(dO[i * p.D + d]) * f(o[i * p.D + d]);
        dt[i] = a;
    }
    r.dq.poison(nl * p.D);
    r.dk.poison(p.B * p.KH * p.S * p.D);
    r.dv.poison(p.B * p.KH * p.S * p.D);
    auto g = [&](long long rule) { return grid < 0 ? rule : std::min(grid, rule); };
    try {
        if (g(grid_dkdv(p.B, p.KH, p.S)) > 0)
            emu_launch(dim3((unsigned)g(grid_dkdv(p.B, p.KH, p.S))), dim3(128), (size_t)smem_bwd(p.D), [&] {
                dkdv_kernel(p.D)(dO.data(), q.data(), k.data(), v.data(), lse.data(), dt.data(), p.qp(), p.kp(),
                                           r.dk.data(), r.dv.data(), p.B, p.H, p.KH, p.T, p.S, p.D, p.causal, p.window, p.scale);
            });
        if (g(grid_tc(p.B, p.H, p.T)) > 0)
            emu_launch(dim3((unsigned)g(grid_tc(p.B, p.H, p.T))), dim3(128), (size_t)smem_bwd(p.D), [&] {
                dq_kernel(p.D)(dO.data(), q.data(), k.data(), v.data(), lse.data(), dt.data(), p.qp(), p.kp(),
                                         r.dq.data(), p.B, p.H, p.KH, p.T, p.S, p.D, p.causal, p.window, p.scale);
            });
    } catch (const EmuError &e) {
        r.launched = false;
        r.error = e.what();
    }
}

// worst |got - want| / (ulp(want) + 2^-7 mag + 1e-4 max|want|) over n elements
static double worst_grad(const Guarded<__nv_bfloat16> &got, const DV &want, const DV &mag) {
    double mx = 0, w = 0;
    for (double x : want) mx = std::max(mx, fabs(x));
    for (size_t i = 0; i < want.size(); i++) {
        double e = fabs(f(got[i]) - want[i]) / (bf16_ulp(want[i]) + 0x1p-7 * mag[i] + 1e-4 * mx + 1e-30);
        if (!(e <= w)) w = e;
    }
    return w;
}

// the backward of one problem against the reference's, from the
// reference's o (bf16) and lse (f32); optionally a smaller grid's bits
static void run_bwd_case(const char *name, const Problem &p, long long small_grid = 0) {
    size_t nq = p.B * p.H * p.T * p.D, nk = p.B * p.KH * p.S * p.D, nl = p.B * p.H * p.T;
    BV q = rbf(nq, -2, 2), k = rbf(nk, -2, 2), v = rbf(nk, -1, 1), dO = rbf(nq, -1, 1), o(nq);
    DV o_ref, lse_ref;
    ref_fwd(p, q, k, v, o_ref, lse_ref);
    std::vector<float> lse(nl);
    for (size_t i = 0; i < nq; i++) o[i] = __float2bfloat16_rn((float)o_ref[i]);
    for (size_t i = 0; i < nl; i++) lse[i] = (float)lse_ref[i];
    Grads want;
    ref_bwd(p, dO, q, k, v, o, lse, want);
    BwdRun r;
    run_tc_bwd(p, dO, q, k, v, o, lse, r);
    double wq = worst_grad(r.dq, want.dq, want.mag_dq), wk = worst_grad(r.dk, want.dk, want.mag_dk),
           wv = worst_grad(r.dv, want.dv, want.mag_dv);
    bool intact = r.dq.intact() && r.dk.intact() && r.dv.intact();
    char b[200];
    snprintf(b, sizeof b, ": dq %.3f, dk %.3f, dv %.3f of tolerance%s", wq, wk, wv, intact ? "" : " (guard zone written)");
    tap(r.launched && intact && wq <= 1 && wk <= 1 && wv <= 1,
        "backward " + describe(name, p) + b + (r.launched ? "" : " EMULATION ERROR " + r.error));
    if (small_grid > 0) {
        BwdRun r2;
        run_tc_bwd(p, dO, q, k, v, o, lse, r2, small_grid);
        bool same = r2.launched && memcmp(r.dq.data(), r2.dq.data(), nq * 2) == 0 &&
                    memcmp(r.dk.data(), r2.dk.data(), nk * 2) == 0 && memcmp(r.dv.data(), r2.dv.data(), nk * 2) == 0;
        tap(same, std::string("backward ") + name + ": grid " + std::to_string(small_grid) + " gives the same bits (deterministic)");
    }
}

static std::string describe(const char *name, const Problem &p) {
    char b[320], w[32] = "";
    if (p.window) snprintf(w, sizeof w, " window %lld", p.window);
    snprintf(b, sizeof b, "%s: B%lld H%lld KH%lld T%lld S%lld D%lld%s%s%s", name, p.B, p.H, p.KH, p.T, p.S, p.D,
             p.causal ? " causal" : "", p.qpos.empty() ? "" : " positions", w);
    return b;
}

// (misaligned: q, k, v start 2 bytes into their buffers, so the kernel
// stages its tiles element by element instead of 16 bytes at a time)
static void run_case(const char *name, const Problem &p, long long small_grid = 0, bool misaligned = false) {
    size_t nq = p.B * p.H * p.T * p.D, nk = p.B * p.KH * p.S * p.D, nl = p.B * p.H * p.T;
    BV qb = rbf(nq + 1, -2, 2), kb = rbf(nk + 1, -2, 2), vb = rbf(nk + 1, -1, 1);
    BV q(qb.begin() + misaligned, qb.begin() + misaligned + nq), k(kb.begin() + misaligned, kb.begin() + misaligned + nk),
        v(vb.begin() + misaligned, vb.begin() + misaligned + nk);
    DV o_ref, lse_ref;
    ref_fwd(p, q, k, v, o_ref, lse_ref);
    Run r;
    if (misaligned) { // the kernel reads the shifted copies in qb, kb, vb
        std::copy(q.begin(), q.end(), qb.begin() + 1), std::copy(k.begin(), k.end(), kb.begin() + 1);
        std::copy(v.begin(), v.end(), vb.begin() + 1);
        run_tc_at(p, qb.data() + 1, kb.data() + 1, vb.data() + 1, r);
    } else {
        run_tc(p, q, k, v, r);
    }
    double vmax = 0;
    for (auto &x : v) vmax = std::max(vmax, fabs(f(x)));
    double worst_o = 0, worst_l = 0;
    size_t dead = 0, wrong_dead = 0, exact = 0, live_el = 0;
    for (size_t i = 0; i < nl; i++) {
        if (lse_ref[i] == -INFINITY) {
            dead++;
            bool ok = r.lse[i] == -INFINITY;
            for (long long d = 0; d < p.D; d++) ok &= f(r.o[i * p.D + d]) == 0 && !std::signbit(f(r.o[i * p.D + d])) ;
            wrong_dead += !ok;
            continue;
        }
        double el = fabs(r.lse[i] - lse_ref[i]) / (0x1p-8 * (1 + fabs(lse_ref[i])));
        if (!(el <= worst_l)) worst_l = el;
        for (long long d = 0; d < p.D; d++) {
            size_t j = i * p.D + d;
            double want = o_ref[j], e = fabs(f(r.o[j]) - want) / (bf16_ulp(want) + 0x1p-7 * vmax);
            if (!(e <= worst_o)) worst_o = e;
            exact += r.o[j].bits == __float2bfloat16_rn((float)want).bits;
            live_el++;
        }
    }
    char b[200];
    snprintf(b, sizeof b, ": o worst/tol %.3f (%.0f%% exactly bf16(ref)), lse worst/tol %.3f, %zu of %zu rows see no key%s", worst_o,
             live_el ? 100.0 * exact / live_el : 100.0, worst_l, dead, nl, wrong_dead ? " (NOT exactly 0 / -inf)" : "");
    bool ok = r.launched && worst_o <= 1 && worst_l <= 1 && wrong_dead == 0 && r.o.intact() && r.lse.intact();
    tap(ok, describe(name, p) + b + (r.launched ? "" : " EMULATION ERROR " + r.error) +
                (r.o.intact() && r.lse.intact() ? "" : " (guard zone written)"));
    if (small_grid > 0) {
        Run r2;
        run_tc(p, q, k, v, r2, small_grid);
        bool same = r2.launched && memcmp(r.o.data(), r2.o.data(), nq * 2) == 0 && memcmp(r.lse.data(), r2.lse.data(), nl * 4) == 0;
        snprintf(b, sizeof b, "%s: grid %lld instead of %lld gives the same bits", name, small_grid, grid_tc(p.B, p.H, p.T));
        tap(same, b);
    }
}

static Problem prob(long long B, long long H, long long KH, long long T, long long S, long long D, int causal) {
    Problem p;
    p.B = B, p.H = H, p.KH = KH, p.T = T, p.S = S, p.D = D, p.causal = causal;
    p.scale = 1.0 / sqrt((double)D);
    return p;
}

// positions of context-parallel rank r of cp over a sequence of n tokens (dual chunks)
static IV dual(int r, int cp, int n) {
    IV out;
    int c = n / (2 * cp);
    for (int i = 0; i < c; i++) out.push_back(r * c + i);
    for (int i = 0; i < c; i++) out.push_back((2 * cp - 1 - r) * c + i);
    return out;
}

int main(int argc, char **argv) {
    std::string only = argc > 1 ? argv[1] : "";
    auto want = [&](const char *family) { return only.empty() || only == family; };
    if (want("long")) { // many tiles: the double buffers' two stages alternate 9 times
        run_case("long causal, GQA 2/1", prob(1, 2, 1, 520, 520, 64, 1), 3);
        run_bwd_case("long causal, GQA 2/1", prob(1, 2, 1, 520, 520, 64, 1), 3);
        run_bwd_case("long non-causal, D 128", prob(1, 1, 1, 300, 300, 128, 0));
    }
    if (want("basic")) {
        run_case("non-causal MHA", prob(1, 2, 2, 64, 64, 64, 0));
        run_case("causal, odd length", prob(1, 2, 2, 100, 100, 64, 1), 3);
        run_case("causal GQA 4/2", prob(2, 4, 2, 77, 77, 32, 1));
        run_case("non-causal, T != S", prob(1, 1, 1, 40, 130, 128, 0));
        run_case("causal, T < S (index mask)", prob(1, 2, 1, 50, 90, 64, 1));
        run_case("causal, D 16", prob(1, 3, 1, 33, 33, 16, 1));
        run_case("causal, D 128, two query tiles", prob(1, 1, 1, 129, 129, 128, 1));
        run_case("empty S", prob(1, 2, 2, 20, 0, 64, 1));
        run_case("empty T", prob(1, 2, 2, 0, 20, 64, 0));
        run_case("q, k, v not 16-byte aligned (element loads), causal GQA", prob(1, 4, 2, 70, 70, 32, 1), 0, true);
    }
    if (want("cp")) {
        // rank 1 of cp 2 over 128 tokens: chunks 1, 2 against the all-gathered keys (rank 0's then rank 1's)
        Problem p = prob(1, 4, 2, 64, 128, 64, 1);
        p.qpos = dual(1, 2, 128);
        IV k0 = dual(0, 2, 128), k1 = dual(1, 2, 128);
        p.kpos = k0;
        p.kpos.insert(p.kpos.end(), k1.begin(), k1.end());
        run_case("context parallel: dual-chunk rank 1 of 2, all-gathered keys", p, 2);
        // ring step i > r: the second half of the local queries against a whole received block, no mask
        Problem s = prob(1, 2, 2, 32, 64, 64, 0);
        run_case("ring step: second half of the queries x a received block, no mask", s);
        // a ring block later than every local query (causal): every row sees nothing
        Problem z = prob(1, 2, 1, 48, 32, 32, 1);
        for (int i = 0; i < 48; i++) z.qpos.push_back(i);
        for (int i = 0; i < 32; i++) z.kpos.push_back(100 + i);
        run_case("ring block after every query: every row sees nothing", z);
        // positions in any order with gaps; the first rows see only part of the block
        Problem g = prob(1, 2, 2, 70, 90, 32, 1);
        for (int i = 0; i < 70; i++) g.qpos.push_back(3 * ((i * 37) % 70));
        for (int i = 0; i < 90; i++) g.kpos.push_back(2 * ((i * 53) % 90) + 1);
        run_case("positions in any order with gaps", g);
    }
    if (want("window")) {
        Problem w = prob(1, 2, 2, 150, 150, 64, 1);
        w.window = 37;
        run_case("sliding window by index", w);
        Problem wp = prob(1, 2, 1, 64, 128, 32, 1);
        wp.qpos = dual(1, 2, 128);
        for (int i = 0; i < 128; i++) wp.kpos.push_back(i);
        wp.window = 21;
        run_case("sliding window by position", wp);
    }
    if (want("bwd")) {
        run_bwd_case("non-causal MHA", prob(1, 2, 2, 64, 64, 64, 0));
        run_bwd_case("causal, odd length", prob(1, 2, 2, 100, 100, 64, 1), 2);
        run_bwd_case("causal GQA 4/2", prob(2, 4, 2, 77, 77, 32, 1), 3);
        run_bwd_case("non-causal, T != S", prob(1, 1, 1, 40, 130, 128, 0));
        run_bwd_case("causal, T < S (index mask)", prob(1, 2, 1, 50, 90, 16, 1));
        run_bwd_case("empty S", prob(1, 2, 2, 20, 0, 32, 1));
        run_bwd_case("empty T", prob(1, 2, 2, 0, 20, 32, 0));
        Problem p = prob(1, 4, 2, 64, 128, 64, 1);
        p.qpos = dual(1, 2, 128);
        IV k0 = dual(0, 2, 128), k1 = dual(1, 2, 128);
        p.kpos = k0;
        p.kpos.insert(p.kpos.end(), k1.begin(), k1.end());
        run_bwd_case("context parallel: dual-chunk rank 1 of 2, all-gathered keys", p);
        Problem z = prob(1, 2, 1, 48, 32, 32, 1);
        for (int i = 0; i < 48; i++) z.qpos.push_back(i);
        for (int i = 0; i < 32; i++) z.kpos.push_back(100 + i);
        run_bwd_case("ring block after every query: nothing flows back", z);
        Problem g = prob(1, 2, 2, 70, 90, 32, 1);
        for (int i = 0; i < 70; i++) g.qpos.push_back(3 * ((i * 37) % 70));
        for (int i = 0; i < 90; i++) g.kpos.push_back(2 * ((i * 53) % 90) + 1);
        run_bwd_case("positions in any order with gaps", g);
        Problem w = prob(1, 2, 2, 150, 150, 64, 1);
        w.window = 37;
        run_bwd_case("sliding window by index", w);
    }
    if (want("nan")) {
        Problem p = prob(1, 1, 1, 10, 10, 48, 1);
        BV q = rbf(480, -1, 1), k = rbf(480, -1, 1), v = rbf(480, -1, 1);
        Run r;
        run_tc(p, q, k, v, r);
        bool nan = r.launched;
        for (int i = 0; i < 480; i++) nan &= std::isnan(f(r.o[i]));
        for (int i = 0; i < 10; i++) nan &= std::isnan(r.lse[i]);
        tap(nan, "D 48 given to kiln_attention_tc_fwd_d64: o and lse are NaN");
    }
    printf("1..%d\n", tap_n);
    return tap_failed ? 1 : 0;
}
