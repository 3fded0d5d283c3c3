// check_attention.cpp — kernels/cuda/attention.cu on the host emulator
// (emu.h: one fiber per CUDA thread) against a double-precision reference
// written here from compiler/ops.def's attention / attention_bwd.
//
// Built and run by tests/t_cuda_attention.sh, which copies kernels/cuda into
// $B/cuda_attn/src with the emulator's two source rewrites (emu.h: no
// cuda_bf16.h; the dynamic shared memory becomes the launch's region) and
// compiles this file with -I there.  Prints TAP, "ok N - ..." /
// "not ok N - ...", with the measured errors as "#" lines, then the plan.
//
// Inputs are bf16 (q, k in [-2, 2], v and do in [-1, 1]).  The references
// take the same bf16 values, so what differs is only the kernels' f32 math
// and the rounding of their outputs:
//   o, dq, dk, dv (bf16): |got - want| <= ulp(want) + 2e-4 max|want|, where
//       ulp(want) is the bf16 spacing at want (2^(e-7) for 2^e <= |want| <
//       2^(e+1)): the rounding alone is at most half an ulp, so a correct
//       kernel shows worst/tol near 0.5; the second term covers f32 sums that
//       cancel to near zero.  Also printed: the share of elements that are
//       exactly the reference rounded to bf16;
//   lse (f32):            |got - want| <= 1e-5 (1 + |want|);
//   rows that see no key: o exactly 0 and lse exactly -inf; their dq exactly 0.
// The backward gets the reference's o rounded to bf16 and its lse rounded to
// f32 (not the kernel's forward), and its reference uses exactly those, as
// interp.c does: P = e^(scale q.k - lse), Dt = do . o.
//
// Every output is poisoned with NaN first (so an element left unwritten
// fails) and sits between guard zones that must stay untouched.  The kernels
// run with the README's grids, block 256 and dynamic shared memory sizes:
// the emulator's region ends at an inaccessible page, so a kernel that uses
// more than the README gives faults, and it is filled with NaN before every
// block, so reading what no thread wrote shows up.  An emulation error
// (deadlock, divergent barrier or shuffle) fails the case.
//
// Cases: causal and not, GQA and MHA, T != S, sizes that are not multiples
// of the tiles (64 query rows forward, 32 backward, 64 keys), D = 64 and
// smaller, D > 256 (NaN), positions (dual-chunk context-parallel ranks
// against the all-gathered keys; ring steps whose chunks are shorter than a
// key tile; any order with gaps; whole tiles that see nothing; a tile's last
// row seeing only a block's first key), rows that see no key, empty T or S,
// smaller grids giving the same bits, and sliding windows (window W: also
// qpos - kpos < W) by index and by position, W not a multiple of the
// tiles or the cp chunks, so key tiles are skipped whole before the
// window, seen whole and cut by it.
#include "emu.h"

#include "attention.cu"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

typedef std::vector<__nv_bfloat16> BV;
typedef std::vector<float> FV;
typedef std::vector<double> DV;
typedef std::vector<int> IV;

static uint64_t rs = 0x9E3779B97F4A7C15ull;
static double urand() { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return (rs >> 11) * (1.0 / 9007199254740992.0); }
static BV rbf(size_t n, double lo, double hi) { BV v(n); for (auto &x : v) x = __float2bfloat16_rn((float)(lo + (hi - lo) * urand())); return v; }
static double f(const __nv_bfloat16 &b) { return __bfloat162float(b); }
static long long cdiv(long long a, long long b) { return (a + b - 1) / b; }

// ---- the README's launch rules ----
static long long smem_fwd(long long D) { return 512 * D + 18432; }
static long long smem_dkdv(long long D) { return 768 * D + 18176; }
static long long smem_dq(long long D) { return 768 * D + 9728; }
static long long grid_fwd(long long B, long long H, long long T) { return B * H * cdiv(T, 64); }
static long long grid_prep(long long B, long long H, long long T) { return cdiv(B * H * T, 8); }
static long long grid_dkdv(long long B, long long KH, long long S) { return B * KH * cdiv(S, 64); }
static long long grid_dq(long long B, long long H, long long T) { return B * H * cdiv(T, 32); }

// ---- TAP ----
static int tap_n, tap_failed;
static void tap(bool ok, const std::string &what) {
    tap_n++;
    tap_failed += !ok;
    printf("%s %d - %s\n", ok ? "ok" : "not ok", tap_n, what.c_str());
}

// launch the body with grid g and block 256 (skipped when g == 0, as the
// README says); false on an emulation error
template <class F>
static bool launch(long long g, long long smem, const char *kernel, F body) {
    if (g == 0) return true;
    try {
        emu_launch(dim3((unsigned)g), dim3(256), (size_t)smem, body);
    } catch (const EmuError &e) {
        printf("# %s: %s\n", kernel, e.what());
        return false;
    }
    return true;
}

// An output: n elements poisoned with NaN between two guard zones of 0xa5
// bytes, which no kernel may touch.
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
    size_t size() const { return n; }
    bool intact() const {
        if (v.empty()) return true; // never poisoned: not an output of this run
        const unsigned char *p = (const unsigned char *)v.data(), *e = (const unsigned char *)(v.data() + G + n);
        for (size_t i = 0; i < sizeof(T) * G; i++)
            if (p[i] != 0xa5 || e[i] != 0xa5) return false;
        return true;
    }
};
typedef Guarded<__nv_bfloat16> GB;
typedef Guarded<float> GF;

// ---- comparisons ----
struct Err {
    double worst = 0, abs_rel = 0;
    size_t at = 0, exact = 0, n = 0;
    double got = 0, want = 0;
    bool nan = false, bf16 = false;
};

// the bf16 spacing at x (0 at 0)
static double bf16_ulp(double x) { return x == 0 ? 0 : ldexp(1.0, ilogb(x) - 7); }

// worst of |got - want| / tol over the elements not skipped, tol =
// rtol |want| + atol max|want| + atol_abs, plus ulp(want) for bf16 outputs;
// and max |got - want| / max |want|
template <class G>
static Err compare(const G &got, const DV &want, double rtol, double atol, double atol_abs, const std::vector<char> *skip = nullptr) {
    double mx = 0;
    for (size_t i = 0; i < want.size(); i++) if (!(skip && (*skip)[i])) mx = std::max(mx, fabs(want[i]));
    Err e;
    e.bf16 = std::is_same<G, GB>::value;
    for (size_t i = 0; i < want.size(); i++) {
        if (skip && (*skip)[i]) continue;
        double g, tol = rtol * fabs(want[i]) + atol * mx + atol_abs;
        if constexpr (std::is_same<G, GB>::value) {
            g = f(got[i]);
            tol += bf16_ulp(want[i]);
            e.exact += got[i].bits == __float2bfloat16_rn((float)want[i]).bits;
        } else {
            g = got[i];
        }
        e.n++;
        double d = fabs(g - want[i]), r = d / (tol + 1e-300);
        if (std::isnan(g) || std::isinf(g)) { e.nan = true; r = INFINITY; }
        e.abs_rel = std::max(e.abs_rel, mx > 0 ? d / mx : d);
        if (!(r <= e.worst)) { e.worst = r; e.at = i; e.got = g; e.want = want[i]; }
    }
    return e;
}

static const double BF_ATOL = 2e-4, LSE_TOL = 1e-5;

static std::string fmt_err(const char *name, const Err &e) {
    char b[256];
    int k = snprintf(b, sizeof b, "%s max|err|/max|ref| %.2e, worst/tol %.3f", name, e.abs_rel, e.worst);
    if (e.bf16 && e.n && k >= 0 && k < (int)sizeof b) snprintf(b + k, sizeof b - k, ", %.1f%% exactly bf16(ref)", 100.0 * e.exact / e.n);
    return b;
}

static bool report(const char *name, const Err &e) {
    bool ok = e.worst <= 1 && !e.nan;
    printf("#   %s\n", fmt_err(name, e).c_str());
    if (!ok) printf("#   %s: worst at %zu: got %.9g want %.9g\n", name, e.at, e.got, e.want);
    return ok;
}

// ---- the reference (double), from ops.def ----
struct Problem {
    long long B, H, KH, T, S, D;
    int causal;
    double scale;
    IV qpos, kpos; // empty: none (the kernels get NULL)
    long long window = 0; // keys per query under causal; 0: no window
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
                long long qo = ((b * p.H + h) * p.T + t) * D, ko = (b * p.KH + h / rep) * p.S * D;
                double m = -INFINITY, l = 0;
                for (long long s = 0; s < p.S; s++) {
                    if (!p.visible(t, s)) continue;
                    double x = 0;
                    for (long long d = 0; d < D; d++) x += f(q[qo + d]) * f(k[ko + s * D + d]);
                    sc[s] = p.scale * x;
                    m = std::max(m, sc[s]);
                }
                long long row = (b * p.H + h) * p.T + t;
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

// o, lse: what the backward is given (bf16 o, f32 lse)
static void ref_bwd(const Problem &p, const BV &dO, const BV &q, const BV &k, const BV &v, const BV &o, const FV &lse,
                    DV &dq, DV &dk, DV &dv) {
    long long D = p.D, rep = p.H / p.KH;
    dq.assign(p.B * p.H * p.T * D, 0);
    dk.assign(p.B * p.KH * p.S * D, 0);
    dv.assign(p.B * p.KH * p.S * D, 0);
    for (long long b = 0; b < p.B; b++)
        for (long long h = 0; h < p.H; h++)
            for (long long t = 0; t < p.T; t++) {
                long long row = (b * p.H + h) * p.T + t, qo = row * D, ko = (b * p.KH + h / rep) * p.S * D;
                double L = lse[row];
                if (L == -INFINITY) continue;
                double Dt = 0;
                for (long long d = 0; d < D; d++) Dt += f(dO[qo + d]) * f(o[qo + d]);
                for (long long s = 0; s < p.S; s++) {
                    if (!p.visible(t, s)) continue;
                    double x = 0, dp = 0;
                    for (long long d = 0; d < D; d++) {
                        x += f(q[qo + d]) * f(k[ko + s * D + d]);
                        dp += f(dO[qo + d]) * f(v[ko + s * D + d]);
                    }
                    double P = exp(p.scale * x - L), dS = P * (dp - Dt) * p.scale;
                    for (long long d = 0; d < D; d++) {
                        dv[ko + s * D + d] += P * f(dO[qo + d]);
                        dq[qo + d] += dS * f(k[ko + s * D + d]);
                        dk[ko + s * D + d] += dS * f(q[qo + d]);
                    }
                }
            }
}

// ---- running the kernels ----
struct Outs {
    GB o, dq, dk, dv;
    GF lse, dt;
    bool launched = true; // no emulation error
    bool intact() const { return o.intact() && dq.intact() && dk.intact() && dv.intact() && lse.intact() && dt.intact(); }
};

static void run_fwd(const Problem &p, const BV &q, const BV &k, const BV &v, Outs &r, long long grid = -1) {
    r.o.poison(p.B * p.H * p.T * p.D);
    r.lse.poison(p.B * p.H * p.T);
    long long g = grid < 0 ? grid_fwd(p.B, p.H, p.T) : std::min(grid, grid_fwd(p.B, p.H, p.T));
    r.launched &= launch(g, smem_fwd(p.D), "kiln_attention_fwd", [&] {
        kiln_attention_fwd(q.data(), k.data(), v.data(), p.qp(), p.kp(), r.o.data(), r.lse.data(), p.B, p.H, p.KH,
                           p.T, p.S, p.D, p.causal, p.window, p.scale);
    });
}

static void run_bwd(const Problem &p, const BV &dO, const BV &q, const BV &k, const BV &v, const BV &o, const FV &lse,
                    Outs &r, long long grid = -1) {
    r.dq.poison(p.B * p.H * p.T * p.D);
    r.dk.poison(p.B * p.KH * p.S * p.D);
    r.dv.poison(p.B * p.KH * p.S * p.D);
    r.dt.poison(p.B * p.H * p.T);
    auto g = [&](long long rule) { return grid < 0 ? rule : std::min(grid, rule); };
    r.launched &= launch(g(grid_prep(p.B, p.H, p.T)), 0, "kiln_attention_bwd_prep", [&] {
        kiln_attention_bwd_prep(dO.data(), o.data(), r.dt.data(), p.B * p.H * p.T, p.D);
    });
    r.launched &= launch(g(grid_dkdv(p.B, p.KH, p.S)), smem_dkdv(p.D), "kiln_attention_bwd_dkdv", [&] {
        kiln_attention_bwd_dkdv(dO.data(), q.data(), k.data(), v.data(), lse.data(), r.dt.data(), p.qp(), p.kp(),
                                r.dk.data(), r.dv.data(), p.B, p.H, p.KH, p.T, p.S, p.D, p.causal, p.window, p.scale);
    });
    r.launched &= launch(g(grid_dq(p.B, p.H, p.T)), smem_dq(p.D), "kiln_attention_bwd_dq", [&] {
        kiln_attention_bwd_dq(dO.data(), q.data(), k.data(), v.data(), lse.data(), r.dt.data(), p.qp(), p.kp(),
                              r.dq.data(), p.B, p.H, p.KH, p.T, p.S, p.D, p.causal, p.window, p.scale);
    });
}

static std::string describe(const char *name, const Problem &p) {
    char b[320], w[32] = "";
    if (p.window) snprintf(w, sizeof w, " window %lld", p.window);
    snprintf(b, sizeof b, "%s: B%lld H%lld KH%lld T%lld S%lld D%lld%s%s%s", name, p.B, p.H, p.KH, p.T, p.S, p.D,
             p.causal ? " causal" : "", p.qpos.empty() ? "" : " positions", w);
    return b;
}

// one case: the forward against the reference, the backward against the
// reference (from the reference's o and lse), optionally a small grid
static void run_case(const char *name, const Problem &p, long long small_grid = 0) {
    size_t nq = p.B * p.H * p.T * p.D, nk = p.B * p.KH * p.S * p.D, nl = p.B * p.H * p.T;
    BV q = rbf(nq, -2, 2), k = rbf(nk, -2, 2), v = rbf(nk, -1, 1), dO = rbf(nq, -1, 1);
    DV o_ref, lse_ref, dq_ref, dk_ref, dv_ref;
    ref_fwd(p, q, k, v, o_ref, lse_ref);
    Outs r;
    run_fwd(p, q, k, v, r);

    // rows that see no key: o exactly 0, lse exactly -inf; the others by tolerance
    std::vector<char> dead(nl), dead_el(nq);
    size_t ndead = 0;
    bool dead_ok = true;
    for (size_t i = 0; i < nl; i++) {
        dead[i] = lse_ref[i] == -INFINITY;
        ndead += dead[i];
        for (long long d = 0; d < p.D; d++) dead_el[i * p.D + d] = dead[i];
        if (dead[i]) {
            dead_ok &= r.lse[i] == -INFINITY;
            for (long long d = 0; d < p.D; d++) dead_ok &= f(r.o[i * p.D + d]) == 0;
        } else {
            dead_ok &= r.lse[i] != -INFINITY;
        }
    }
    printf("# %s\n", describe(name, p).c_str());
    bool ok = report("o", compare(r.o, o_ref, 0, BF_ATOL, 0, &dead_el));
    ok &= report("lse", compare(r.lse, lse_ref, LSE_TOL, 0, LSE_TOL, &dead));
    if (ndead) printf("#   %zu of %zu rows see no key: o = 0, lse = -inf %s\n", ndead, nl, dead_ok ? "exactly" : "NOT");
    ok &= dead_ok && r.launched && r.o.intact() && r.lse.intact();
    tap(ok, "fwd " + describe(name, p));

    // the backward from the reference's o (bf16) and lse (f32)
    BV o_in(nq);
    FV lse_in(nl);
    for (size_t i = 0; i < nq; i++) o_in[i] = __float2bfloat16_rn((float)o_ref[i]);
    for (size_t i = 0; i < nl; i++) lse_in[i] = (float)lse_ref[i];
    ref_bwd(p, dO, q, k, v, o_in, lse_in, dq_ref, dk_ref, dv_ref);
    Outs g;
    run_bwd(p, dO, q, k, v, o_in, lse_in, g);
    bool bok = report("dq", compare(g.dq, dq_ref, 0, BF_ATOL, 0));
    bok &= report("dk", compare(g.dk, dk_ref, 0, BF_ATOL, 0));
    bok &= report("dv", compare(g.dv, dv_ref, 0, BF_ATOL, 0));
    bool dq_dead = true;
    for (size_t i = 0; i < nq; i++) if (dead_el[i]) dq_dead &= g.dq[i].bits == 0;
    if (ndead) printf("#   dq of the rows that see no key: %s\n", dq_dead ? "exactly 0" : "NOT 0");
    tap(bok && dq_dead && g.launched && g.dq.intact() && g.dk.intact() && g.dv.intact() && g.dt.intact(), "bwd " + describe(name, p));

    if (small_grid) { // any grid gives the same bits
        Outs s, sb;
        run_fwd(p, q, k, v, s, small_grid);
        run_bwd(p, dO, q, k, v, o_in, lse_in, sb, small_grid);
        bool same = memcmp(s.o.data(), r.o.data(), nq * 2) == 0 && memcmp(s.lse.data(), r.lse.data(), nl * 4) == 0 &&
                    memcmp(sb.dq.data(), g.dq.data(), nq * 2) == 0 && memcmp(sb.dk.data(), g.dk.data(), nk * 2) == 0 &&
                    memcmp(sb.dv.data(), g.dv.data(), nk * 2) == 0;
        char b[64];
        snprintf(b, sizeof b, " with grid %lld gives the same bits", small_grid);
        tap(same, describe(name, p) + b);
    }
}

static Problem prob(long long B, long long H, long long KH, long long T, long long S, long long D, int causal) {
    Problem p{B, H, KH, T, S, D, causal, 1 / sqrt((double)D), {}, {}};
    return p;
}

// the positions of a dual-chunk cp rank: chunks c and 2cp-1-c of a sequence of 2 cp n positions
static IV dual_chunk(int cp, int c, int n) {
    IV pos(2 * n);
    for (int j = 0; j < n; j++) pos[j] = c * n + j, pos[n + j] = (2 * cp - 1 - c) * n + j;
    return pos;
}

template <class T, class P> static bool all_of(const Guarded<T> &b, P pred) {
    for (size_t i = 0; i < b.size(); i++) if (!pred(b[i])) return false;
    return true;
}
static bool bf_zero(__nv_bfloat16 x) { return f(x) == 0; }
static bool bf_nan(__nv_bfloat16 x) { return std::isnan(f(x)); }

// T or S = 0: the launches the README says still run
static void run_empty() {
    bool ok = true;
    { // S = 0: o = 0, lse = -inf; dq = 0 (dkdv has no jobs)
        Problem p = prob(1, 2, 1, 5, 0, 8, 0);
        BV q = rbf(p.B * p.H * p.T * p.D, -1, 1), dO = q, none;
        Outs r, g;
        run_fwd(p, q, none, none, r);
        ok &= all_of(r.o, bf_zero) && all_of(r.lse, [](float x) { return x == -INFINITY; });
        FV lse(r.lse.data(), r.lse.data() + r.lse.size());
        BV o(r.o.data(), r.o.data() + r.o.size());
        run_bwd(p, dO, q, none, none, o, lse, g);
        ok &= all_of(g.dq, bf_zero);
        ok &= r.launched && g.launched && r.o.intact() && r.lse.intact() && g.dq.intact() && g.dt.intact();
    }
    { // T = 0: dk = dv = 0 (no forward, prep or dq jobs)
        Problem p = prob(2, 2, 2, 0, 70, 8, 1);
        BV k = rbf(p.B * p.KH * p.S * p.D, -1, 1), none;
        FV lse0;
        Outs g;
        run_bwd(p, none, none, k, k, none, lse0, g);
        ok &= all_of(g.dk, bf_zero) && all_of(g.dv, bf_zero);
        ok &= g.launched && g.dk.intact() && g.dv.intact();
    }
    tap(ok, "empty shapes: S = 0 gives o = 0, lse = -inf, dq = 0; T = 0 gives dk = dv = 0");
}

// D > 256: NaN, not garbage
static void run_big_d() {
    Problem p = prob(1, 1, 1, 3, 4, 260, 0);
    BV q = rbf(3 * 260, -1, 1), k = rbf(4 * 260, -1, 1);
    Outs r, g;
    run_fwd(p, q, k, k, r);
    FV lse(3, 0.0f);
    run_bwd(p, q, q, k, k, q, lse, g);
    bool ok = r.launched && g.launched && all_of(r.o, bf_nan) && all_of(r.lse, [](float x) { return std::isnan(x); }) &&
              all_of(g.dq, bf_nan) && all_of(g.dk, bf_nan) && all_of(g.dv, bf_nan) && r.intact() && g.intact();
    tap(ok, "D = 260 > 256: every output is NaN");
}

int main() {
    setvbuf(stdout, NULL, _IONBF, 0);
    printf("# tolerances: bf16 outputs |got-want| <= ulp(want) + %.0e max|want|; f32 lse |got-want| <= %.0e (1+|want|)\n", BF_ATOL, LSE_TOL);
    // the index path
    run_case("MHA causal, T = S = 70 (a tile and 6 rows)", prob(2, 2, 2, 70, 70, 64, 1), 1);
    run_case("GQA causal, odd sizes", prob(1, 4, 2, 100, 100, 40, 1), 3);
    run_case("GQA not causal, T != S", prob(1, 4, 2, 45, 100, 24, 0));
    run_case("GQA causal, T > S: rows past S see every key", prob(1, 4, 1, 90, 45, 64, 1));
    run_case("MHA causal, T < S: keys past T are seen by nobody", prob(1, 2, 2, 37, 130, 16, 1));
    run_case("MHA not causal, whole tiles, D = 64", prob(1, 1, 1, 64, 128, 64, 0));
    run_case("one key, D = 5", prob(1, 2, 1, 70, 1, 5, 0));
    // positions
    enum { CP = 4, N = 20 };
    IV all;
    for (int r = 0; r < CP; r++) { IV c = dual_chunk(CP, r, N); all.insert(all.end(), c.begin(), c.end()); }
    for (int r : {0, CP - 1}) {
        Problem p = prob(1, 4, 2, 2 * N, 2 * CP * N, 32, 1);
        p.qpos = dual_chunk(CP, r, N);
        p.kpos = all;
        std::string name = "cp rank " + std::to_string(r) + " of 4 (dual chunk) against the all-gathered keys";
        run_case(name.c_str(), p, r == 0 ? 2 : 0);
    }
    for (int j = 0; j < CP; j++) { // ring steps of rank 2: one block of rank j, chunks of 20 < 64 keys
        Problem p = prob(1, 2, 1, 2 * N, 2 * N, 16, 1);
        p.qpos = dual_chunk(CP, 2, N);
        p.kpos = dual_chunk(CP, j, N);
        std::string name = "ring step: rank 2's queries, rank " + std::to_string(j) + "'s block" +
                           (j < 2 ? " (its first half only)" : j > 2 ? " (second query half only)" : " (diagonal)");
        run_case(name.c_str(), p);
    }
    {
        Problem p = prob(2, 2, 1, 70, 50, 20, 1); // any order, gaps, repeats; qpos < 0: no key
        for (int i = 0; i < 70; i++) p.qpos.push_back((i * 37) % 70 - 5);
        for (int i = 0; i < 50; i++) p.kpos.push_back((i * 23) % 50 + (i % 3 == 0));
        run_case("positions in any order, rows that see no key", p);
        p.causal = 0;
        run_case("positions without causal are ignored", p);
    }
    {
        Problem p = prob(1, 1, 1, 130, 260, 8, 1); // a query tile sees all of a later key tile, one sees nothing, a key tile nobody sees
        for (int i = 0; i < 130; i++) p.qpos.push_back(i < 64 ? 1000 + i : -1 - i);
        for (int i = 0; i < 260; i++) p.kpos.push_back(i < 128 ? 2000 + i : i);
        run_case("whole tiles masked, whole query tiles see nothing", p);
    }
    {
        Problem p = prob(1, 2, 2, 37, 50, 20, 1); // qpos = t - 5: the first 5 rows see no key
        for (int t = 0; t < 37; t++) p.qpos.push_back(t - 5);
        for (int s = 0; s < 50; s++) p.kpos.push_back(s);
        run_case("qpos = t - 5: five rows see no key", p);
    }
    {
        Problem p = prob(1, 2, 1, 40, 128, 16, 1); // the last row of query tile 0 (position 64) sees exactly the first key of block 1
        for (int t = 0; t < 40; t++) p.qpos.push_back(t + 33);
        for (int s = 0; s < 128; s++) p.kpos.push_back(s);
        run_case("a query tile's last row sees only the first key of a block", p);
    }
    // sliding windows: by index (2 and 65: a tile's first row sees only a
    // key tile's last key; longer than the sequence; T > S; not 1, whose
    // exact dq, dk are 0 with no tolerance for f32 rounding), and by
    // position (window 27 over chunks of 20: cp ranks against the gathered
    // keys, ring steps)
    for (long long w : {2, 3, 17, 65, 500}) {
        Problem p = prob(1, 4, 2, 150, 150, 16, 1);
        p.window = w;
        run_case("sliding window by index", p, w == 17 ? 2 : 0);
    }
    {
        Problem p = prob(1, 2, 1, 90, 45, 24, 1);
        p.window = 9;
        run_case("sliding window by index, T > S", p);
    }
    for (int r : {0, 1, CP - 1}) {
        Problem p = prob(1, 4, 2, 2 * N, 2 * CP * N, 32, 1);
        p.qpos = dual_chunk(CP, r, N);
        p.kpos = all;
        p.window = 27;
        std::string name = "sliding window: cp rank " + std::to_string(r) + " of 4 against the all-gathered keys";
        run_case(name.c_str(), p);
    }
    for (int j = 0; j < CP; j++) {
        Problem p = prob(1, 2, 1, 2 * N, 2 * N, 16, 1);
        p.qpos = dual_chunk(CP, 1, N);
        p.kpos = dual_chunk(CP, j, N);
        p.window = 27;
        std::string name = "sliding window ring step: rank 1's queries, rank " + std::to_string(j) + "'s block";
        run_case(name.c_str(), p);
    }
    run_empty();
    run_big_d();
    printf("1..%d\n", tap_n);
    return tap_failed != 0;
}
