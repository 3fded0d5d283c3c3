// check.cpp — the CUDA library kernels (kernels/cuda/*.cu) run on the host
// emulator (emu.h) and compared with independent references.
//
// tests/t_cuda_emu.sh builds it: the kernel sources are copied and given the
// two host-emulation rewrites emu.h describes, and this file includes the
// copies (found through -I).  It prints TAP, one line per property checked,
// each with its measured error and tolerance, then the plan; it exits 1 when
// any check fails.  `check NAME...` runs only the cases of those families
// (emu layernorm rmsnorm rope xent xent_fused embedding adamw).
//
// The references are written from compiler/ops.def and kernels/cuda/README.md
// in double precision, from the same bf16 inputs the kernel reads, so the
// only error is the kernel's (f32 math, one bf16 rounding of the output).
// Tolerance, per element: |got - ref| <= rtol*|ref| + atol*max|ref|.
//   - bf16 outputs: rtol 2^-7 (the output rounding alone is at most 2^-9;
//     f32 statistics and cancellation near zero make up the rest), atol
//     1e-3..2e-3 of the largest reference value, for outputs that cancel
//     to near zero;
//   - f32 outputs (losses, lse, weight gradients, AdamW state): 1e-4..1e-6
//     relative, the f32 rounding of sums of a few hundred terms.
// Where README promises bits, the check compares bits: a smaller grid gives
// the intended grid's result; in place (y may be x) gives the out-of-place
// bits; the embedding backward equals f32 sums in ascending row order,
// exactly (its dy spans 2^-24..2^8, so that the order of a sum shows in its
// bits: an unstable sort fails).  Bad ids and targets must give NaN rows.
//
// Every output starts as NaN (poison), so an element no thread writes fails
// the comparison.  Every buffer has guard zones on both sides, checked when
// it is freed, so a write out of bounds fails its case.  An emulation error
// (deadlock, divergent barrier or shuffle) fails the case too.  The "emu"
// cases check the emulator's collectives and error reports themselves.
#include "emu.h"

#include "adamw.cu"
#include "embedding.cu"
#include "layernorm.cu"
#include "rmsnorm.cu"
#include "rope.cu"
#include "xent.cu"
#include "xent_fused.cu"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

// ---- TAP ----

static int tap_count, tap_failures;
static std::string case_name;  // prefix of every line of the current case

__attribute__((format(printf, 2, 3))) static bool tap(bool ok, const char *fmt, ...) {
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    printf("%s %d - %s: %s\n", ok ? "ok" : "not ok", ++tap_count, case_name.c_str(), what);
    tap_failures += !ok;
    return ok;
}

// ---- buffers with guard zones ----

static const size_t GUARD_BYTES = 256;
static const unsigned char GUARD_FILL = 0xa5;
static int guard_breaches;  // buffers freed with a guard zone overwritten, this case

// n elements of T between two guard zones of GUARD_BYTES, checked when freed
template <class T>
struct Buf {
    explicit Buf(size_t n) : n_(n), bytes_(n * sizeof(T) + 2 * GUARD_BYTES, GUARD_FILL) {}
    Buf(size_t n, T fill) : Buf(n) { std::fill(begin(), end(), fill); }
    Buf(const Buf &) = default;
    Buf(Buf &&) = default;
    Buf &operator=(const Buf &) = delete;
    ~Buf() { guard_breaches += !intact(); }
    T *data() { return reinterpret_cast<T *>(bytes_.data() + GUARD_BYTES); }
    const T *data() const { return reinterpret_cast<const T *>(bytes_.data() + GUARD_BYTES); }
    T *begin() { return data(); }
    T *end() { return data() + n_; }
    size_t size() const { return n_; }
    T &operator[](size_t i) { return data()[i]; }
    const T &operator[](size_t i) const { return data()[i]; }
    bool intact() const {
        if (bytes_.empty()) return true;  // moved from
        const unsigned char *tail = bytes_.data() + GUARD_BYTES + n_ * sizeof(T);
        for (size_t i = 0; i < GUARD_BYTES; i++)
            if (bytes_[i] != GUARD_FILL || tail[i] != GUARD_FILL) return false;
        return true;
    }
    bool same_bits(const Buf &o) const { return n_ == o.n_ && memcmp(data(), o.data(), n_ * sizeof(T)) == 0; }

  private:
    size_t n_;
    std::vector<unsigned char> bytes_;  // 256-byte guards keep T's alignment
};

typedef Buf<__nv_bfloat16> BV;
typedef Buf<float> FV;
typedef Buf<int> IV;
typedef std::vector<double> DV;

// ---- data ----

static uint64_t rng_state = 88172645463325252ull;
static double urand() {  // xorshift64, [0, 1)
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) * (1.0 / 9007199254740992.0);
}
static BV random_bf16(size_t n, double lo, double hi) {
    BV v(n);
    for (auto &x : v) x = __float2bfloat16_rn((float)(lo + (hi - lo) * urand()));
    return v;
}
static FV random_f32(size_t n, double lo, double hi) {
    FV v(n);
    for (auto &x : v) x = (float)(lo + (hi - lo) * urand());
    return v;
}
static const __nv_bfloat16 BF16_NAN = {0x7fa0};
static BV poison_bf16(size_t n) { return BV(n, BF16_NAN); }
static FV poison_f32(size_t n) { return FV(n, NAN); }
static double val(__nv_bfloat16 b) { return __bfloat162float(b); }
static double val(float f) { return f; }
static unsigned ceil_div(long long a, long long b) { return (unsigned)((a + b - 1) / b); }
static unsigned norm_parts(long long rows) { return (unsigned)std::min(rows, 512LL); }

// ---- comparisons ----

static const double BF16_RTOL = 1.0 / 128;

// got[0..want.size()) against want: |got - want| <= rtol*|want| + atol*max|want|
template <class T>
static bool expect_close(const char *what, const Buf<T> &got, const DV &want, double rtol, double atol) {
    double max_ref = 0, worst = -1, err_at = 0, tol_at = 0;
    size_t at = 0;
    for (double w : want) max_ref = std::max(max_ref, fabs(w));
    for (size_t i = 0; i < want.size(); i++) {
        double g = val(got[i]), err = fabs(g - want[i]), tol = rtol * fabs(want[i]) + atol * max_ref;
        double ratio = std::isnan(g) ? INFINITY : err / std::max(tol, 1e-300);
        if (ratio > worst) worst = ratio, at = i, err_at = err, tol_at = tol;
        if (std::isnan(g)) break;
    }
    if (want.empty()) return tap(true, "%s: empty", what);
    return tap(worst <= 1, "%s: worst err/tol %.3f at [%zu] (got %.6g, ref %.6g: |err| %.2e, tol %.2e = %.3g|ref| + %.0e*%.3g)",
               what, worst, at, val(got[at]), want[at], err_at, tol_at, rtol, atol, max_ref);
}

static bool all_nan_bf16(const BV &v, size_t from, size_t count) {
    for (size_t i = from; i < from + count; i++)
        if (!std::isnan(val(v[i]))) return false;
    return true;
}

// a case: runs body, turns an emulation error into a failed line, checks guards
static void run_case(const std::string &name, const std::function<void()> &body) {
    case_name = name;
    guard_breaches = 0;
    try {
        body();
    } catch (const EmuError &e) {
        tap(false, "%s", e.what());
    }
    tap(guard_breaches == 0, "no write outside its buffers: %d guard zones (%zu bytes each side) overwritten",
        guard_breaches, GUARD_BYTES);
}

static dim3 grid1(long long blocks) { return dim3((unsigned)blocks); }
static const dim3 BLOCK(KILN_BLOCK);

// ---- layernorm ----

static void layernorm_reference(const BV &x, const BV &w, const BV &b, const BV &dy, long long rows, long long C,
                                double eps, DV &y, DV &dx, DV &dw, DV &db) {
    for (long long r = 0; r < rows; r++) {
        const long long o = r * C;
        double mean = 0, var = 0, mg = 0, mgx = 0;
        for (long long i = 0; i < C; i++) mean += val(x[o + i]);
        mean /= C;
        for (long long i = 0; i < C; i++) var += (val(x[o + i]) - mean) * (val(x[o + i]) - mean);
        double rstd = 1 / sqrt(var / C + eps);
        for (long long i = 0; i < C; i++) {
            double xh = (val(x[o + i]) - mean) * rstd, g = val(dy[o + i]) * val(w[i]);
            y[o + i] = xh * val(w[i]) + val(b[i]);
            mg += g / C;
            mgx += g * xh / C;
            dw[i] += val(dy[o + i]) * xh;
            db[i] += val(dy[o + i]);
        }
        for (long long i = 0; i < C; i++)
            dx[o + i] = rstd * (val(dy[o + i]) * val(w[i]) - mg - (val(x[o + i]) - mean) * rstd * mgx);
    }
}

// forward, backward and reduce with the README's grids; other_grid for the
// backward must give the same bits
static void case_layernorm(long long rows, long long C, unsigned other_grid) {
    const double eps = 1e-5;
    BV x = random_bf16(rows * C, -2, 3), w = random_bf16(C, 0.5, 1.5), b = random_bf16(C, -0.5, 0.5);
    BV dy = random_bf16(rows * C, -1, 1);
    DV y_ref(rows * C), dx_ref(rows * C), dw_ref(C), db_ref(C);
    layernorm_reference(x, w, b, dy, rows, C, eps, y_ref, dx_ref, dw_ref, db_ref);
    const size_t smem = 8 * C, partial_n = std::max(1LL, norm_parts(rows) * 2 * C);
    auto backward = [&](unsigned grid, BV &dx, FV &dw, FV &db) {
        FV partial = poison_f32(partial_n);
        if (rows) emu_launch(grid1(grid), BLOCK, smem, [&] { kiln_layernorm_bwd(dy.data(), x.data(), w.data(), dx.data(), partial.data(), rows, C, eps); });
        emu_launch(grid1(ceil_div(C, 256)), BLOCK, 0, [&] { kiln_layernorm_bwd_reduce(partial.data(), dw.data(), db.data(), rows, C); });
    };
    BV y = poison_bf16(rows * C), dx = poison_bf16(rows * C);
    FV dw = poison_f32(C), db = poison_f32(C);
    if (rows) emu_launch(grid1(rows), BLOCK, 0, [&] { kiln_layernorm_fwd(x.data(), w.data(), b.data(), y.data(), rows, C, eps); });
    backward(norm_parts(rows), dx, dw, db);
    expect_close("y", y, y_ref, BF16_RTOL, 1e-3);
    expect_close("dx", dx, dx_ref, BF16_RTOL, 2e-3);
    expect_close("dw", dw, dw_ref, 1e-4, 1e-5);
    expect_close("db", db, db_ref, 1e-4, 1e-5);
    if (!rows) return;
    BV dx2 = poison_bf16(rows * C);
    FV dw2 = poison_f32(C), db2 = poison_f32(C);
    backward(other_grid, dx2, dw2, db2);
    tap(dx2.same_bits(dx) && dw2.same_bits(dw) && db2.same_bits(db), "backward with grid %u: same bits as grid %u", other_grid, norm_parts(rows));
    BV xy = x, dyx = dy;  // y may be x, dx may be dy
    FV partial = poison_f32(partial_n);
    emu_launch(grid1(rows), BLOCK, 0, [&] { kiln_layernorm_fwd(xy.data(), w.data(), b.data(), xy.data(), rows, C, eps); });
    emu_launch(grid1(norm_parts(rows)), BLOCK, smem, [&] { kiln_layernorm_bwd(dyx.data(), x.data(), w.data(), dyx.data(), partial.data(), rows, C, eps); });
    tap(xy.same_bits(y) && dyx.same_bits(dx), "in place (y = x, dx = dy): same bits");
    // no bias (issue 17): b = nullptr is b = 0
    BV zero(C, __float2bfloat16_rn(0.0f));
    DV y0_ref(rows * C), dx0(rows * C), dw0(C), db0(C);
    layernorm_reference(x, w, zero, dy, rows, C, eps, y0_ref, dx0, dw0, db0);
    BV y0 = poison_bf16(rows * C);
    emu_launch(grid1(rows), BLOCK, 0, [&] { kiln_layernorm_fwd(x.data(), w.data(), nullptr, y0.data(), rows, C, eps); });
    expect_close("y without a bias (b = nullptr)", y0, y0_ref, BF16_RTOL, 1e-3);
}

// ---- rmsnorm ----

static void case_rmsnorm(long long rows, long long C, unsigned other_grid) {
    const double eps = 1e-6;
    BV x = random_bf16(rows * C, -2, 3), w = random_bf16(C, 0.5, 1.5), dy = random_bf16(rows * C, -1, 1);
    DV y_ref(rows * C), dx_ref(rows * C), dw_ref(C);
    for (long long r = 0; r < rows; r++) {
        const long long o = r * C;
        double q = 0, mgx = 0;
        for (long long i = 0; i < C; i++) q += val(x[o + i]) * val(x[o + i]);
        double s = 1 / sqrt(q / C + eps);
        for (long long i = 0; i < C; i++) {
            y_ref[o + i] = val(x[o + i]) * s * val(w[i]);
            mgx += val(dy[o + i]) * val(w[i]) * val(x[o + i]) / C;
            dw_ref[i] += val(dy[o + i]) * val(x[o + i]) * s;
        }
        for (long long i = 0; i < C; i++) dx_ref[o + i] = s * val(dy[o + i]) * val(w[i]) - val(x[o + i]) * s * s * s * mgx;
    }
    const size_t smem = 4 * C, partial_n = std::max(1LL, norm_parts(rows) * C);
    auto backward = [&](unsigned grid, BV &dx, FV &dw) {
        FV partial = poison_f32(partial_n);
        if (rows) emu_launch(grid1(grid), BLOCK, smem, [&] { kiln_rmsnorm_bwd(dy.data(), x.data(), w.data(), dx.data(), partial.data(), rows, C, eps); });
        emu_launch(grid1(ceil_div(C, 256)), BLOCK, 0, [&] { kiln_rmsnorm_bwd_reduce(partial.data(), dw.data(), rows, C); });
    };
    BV y = poison_bf16(rows * C), dx = poison_bf16(rows * C);
    FV dw = poison_f32(C);
    if (rows) emu_launch(grid1(rows), BLOCK, 0, [&] { kiln_rmsnorm_fwd(x.data(), w.data(), y.data(), rows, C, eps); });
    backward(norm_parts(rows), dx, dw);
    expect_close("y", y, y_ref, BF16_RTOL, 1e-3);
    expect_close("dx", dx, dx_ref, BF16_RTOL, 2e-3);
    expect_close("dw", dw, dw_ref, 1e-4, 1e-5);
    if (!rows) return;
    BV dx2 = poison_bf16(rows * C);
    FV dw2 = poison_f32(C);
    backward(other_grid, dx2, dw2);
    tap(dx2.same_bits(dx) && dw2.same_bits(dw), "backward with grid %u: same bits as grid %u", other_grid, norm_parts(rows));
    BV xy = x, dyx = dy;
    FV partial = poison_f32(partial_n);
    emu_launch(grid1(rows), BLOCK, 0, [&] { kiln_rmsnorm_fwd(xy.data(), w.data(), xy.data(), rows, C, eps); });
    emu_launch(grid1(norm_parts(rows)), BLOCK, smem, [&] { kiln_rmsnorm_bwd(dyx.data(), x.data(), w.data(), dyx.data(), partial.data(), rows, C, eps); });
    tap(xy.same_bits(y) && dyx.same_bits(dx), "in place (y = x, dx = dy): same bits");
}

// ---- rope ----

static void case_rope(long long B, long long T, long long H, long long D, double theta, bool large_positions,
                      unsigned other_grid) {
    BV x = random_bf16(B * T * H * D, -2, 2);
    IV pos(T);
    for (long long t = 0; t < T; t++) pos[t] = large_positions ? 100000 + 37 * (int)t : (int)(t * 7 % T);
    DV y_ref(x.size()), dx_ref(x.size());
    const long long half = D / 2;
    for (long long bt = 0; bt < B * T; bt++)
        for (long long h = 0; h < H; h++)
            for (long long i = 0; i < half; i++) {
                double angle = pos[bt % T] * pow(theta, -2.0 * i / D), c = cos(angle), s = sin(angle);
                long long a = (bt * H + h) * D + i;
                double x1 = val(x[a]), x2 = val(x[a + half]);
                y_ref[a] = x1 * c - x2 * s, y_ref[a + half] = x2 * c + x1 * s;
                dx_ref[a] = x1 * c + x2 * s, dx_ref[a + half] = x2 * c - x1 * s;  // rotation by -angle
            }
    const size_t smem = 4 * D;
    BV y = poison_bf16(x.size()), dx = poison_bf16(x.size()), dx2 = poison_bf16(x.size());
    emu_launch(grid1(B * T), BLOCK, smem, [&] { kiln_rope_fwd(x.data(), pos.data(), y.data(), B, T, H, D, theta); });
    emu_launch(grid1(B * T), BLOCK, smem, [&] { kiln_rope_bwd(x.data(), pos.data(), dx.data(), B, T, H, D, theta); });
    expect_close("y", y, y_ref, BF16_RTOL, 1e-3);
    expect_close("dx", dx, dx_ref, BF16_RTOL, 1e-3);
    emu_launch(grid1(other_grid), BLOCK, smem, [&] { kiln_rope_bwd(x.data(), pos.data(), dx2.data(), B, T, H, D, theta); });
    tap(dx2.same_bits(dx), "backward with grid %u: same bits as grid %lld", other_grid, B * T);
    BV xy = x;
    emu_launch(grid1(B * T), BLOCK, smem, [&] { kiln_rope_fwd(xy.data(), pos.data(), xy.data(), B, T, H, D, theta); });
    tap(xy.same_bits(y), "in place (y = x): same bits");
}

// ---- cross entropy ----

// rows > 3: row 1 has -inf logits (not at its target), the last row a target of V
static void case_xent(long long rows, long long V) {
    BV x = random_bf16(rows * V, -6, 6);
    IV target(rows);
    for (long long r = 0; r < rows; r++) target[r] = (int)(urand() * V);
    const bool special_rows = rows > 3;
    if (special_rows) {
        x[1 * V + 0].bits = x[1 * V + 5].bits = 0xff80;
        target[1] = 3;
        target[rows - 1] = (int)V;
    }
    const long long good = special_rows ? rows - 1 : rows;  // rows with a valid target
    FV dl = random_f32(rows, 0.1, 1);
    DV loss_ref(good), lse_ref(rows), dx_ref(good * V);
    for (long long r = 0; r < rows; r++) {
        double m = -INFINITY, s = 0;
        for (long long i = 0; i < V; i++) m = std::max(m, val(x[r * V + i]));
        for (long long i = 0; i < V; i++) s += exp(val(x[r * V + i]) - m);
        lse_ref[r] = m + log(s);
        if (r >= good) continue;
        loss_ref[r] = lse_ref[r] - val(x[r * V + target[r]]);
        for (long long i = 0; i < V; i++) dx_ref[r * V + i] = dl[r] * (exp(val(x[r * V + i]) - lse_ref[r]) - (i == target[r]));
    }
    FV loss = poison_f32(rows), lse = poison_f32(rows), loss2 = poison_f32(rows);
    BV dx = poison_bf16(rows * V), dx2 = poison_bf16(rows * V);
    emu_launch(grid1(rows), BLOCK, 0, [&] { kiln_cross_entropy_fwd(x.data(), target.data(), loss.data(), lse.data(), rows, V); });
    emu_launch(grid1(rows), BLOCK, 0, [&] { kiln_cross_entropy_bwd(dl.data(), x.data(), target.data(), nullptr, dx.data(), rows, V); });
    emu_launch(grid1(2), BLOCK, 0, [&] { kiln_cross_entropy_bwd(dl.data(), x.data(), target.data(), lse.data(), dx2.data(), rows, V); });
    expect_close("loss", loss, loss_ref, 1e-5, 1e-6);
    expect_close("lse", lse, lse_ref, 1e-5, 1e-6);
    expect_close("dlogits (lse NULL: recomputed)", dx, dx_ref, BF16_RTOL, 1e-3);
    expect_close("dlogits (lse given, grid 2)", dx2, dx_ref, BF16_RTOL, 1e-3);
    if (special_rows)
        tap(std::isnan(loss[rows - 1]) && all_nan_bf16(dx, (rows - 1) * V, V) && all_nan_bf16(dx2, (rows - 1) * V, V),
            "target V: NaN loss and NaN dlogits row");
    emu_launch(grid1(3), BLOCK, 0, [&] { kiln_cross_entropy_fwd(x.data(), target.data(), loss2.data(), nullptr, rows, V); });
    tap(loss2.same_bits(loss), "forward with grid 3 and lse NULL: same bits");
    BV xy = x;
    emu_launch(grid1(rows), BLOCK, 0, [&] { kiln_cross_entropy_bwd(dl.data(), xy.data(), target.data(), nullptr, xy.data(), rows, V); });
    tap(xy.same_bits(dx), "backward in place (dlogits = logits): same bits");
}

// ---- the fused classifier (xent_fused.cu, issue 23) ----

static std::string str(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

// loss and dlogits in one kernel against the double reference, with dl
// broadcast (stride 0: the mean seed 1/rows times a loss scale) and per row
// (stride 1); bit for bit the unfused fwd + bwd(lse given); in place
// (dlogits = logits); grid 2; rows > 3: row 1 has -inf logits, the last row
// a target of V (NaN loss and row), row 2 its target at the last column
static void case_xent_fused(long long rows, long long V) {
    BV x = random_bf16(rows * V, -6, 6);
    IV target(rows);
    for (long long r = 0; r < rows; r++) target[r] = (int)(urand() * V);
    const bool special_rows = rows > 3;
    if (special_rows) {
        x[1 * V + 0].bits = x[1 * V + 5].bits = 0xff80;
        target[1] = 3;
        target[2] = (int)V - 1;
        target[rows - 1] = (int)V;
    }
    const long long good = special_rows ? rows - 1 : rows;
    FV seed(1), dl_rows = random_f32(rows, 0.1, 1);
    seed[0] = (float)(1024.0 / rows);  // mean over rows times a loss scale of 1024
    for (int stride = 0; stride <= 1; stride++) {
        const FV &dl = stride ? dl_rows : seed;
        DV loss_ref(good), dx_ref(good * V);
        for (long long r = 0; r < good; r++) {
            double m = -INFINITY, s = 0, d = dl[r * stride];
            for (long long i = 0; i < V; i++) m = std::max(m, val(x[r * V + i]));
            for (long long i = 0; i < V; i++) s += exp(val(x[r * V + i]) - m);
            double lse = m + log(s);
            loss_ref[r] = lse - val(x[r * V + target[r]]);
            for (long long i = 0; i < V; i++) dx_ref[r * V + i] = d * (exp(val(x[r * V + i]) - lse) - (i == target[r]));
        }
        FV loss = poison_f32(rows), loss2 = poison_f32(rows), lse = poison_f32(rows);
        BV dx = poison_bf16(rows * V), dx2 = poison_bf16(rows * V), xy = x;
        emu_launch(grid1(rows), BLOCK, 0, [&] {
            kiln_cross_entropy_fused(x.data(), target.data(), dl.data(), stride, loss.data(), dx.data(), rows, V);
        });
        expect_close(str("loss (dl stride %d)", stride).c_str(), loss, loss_ref, 1e-5, 1e-6);
        expect_close(str("dlogits (dl stride %d)", stride).c_str(), dx, dx_ref, BF16_RTOL, 1e-3);
        if (special_rows)
            tap(std::isnan(loss[rows - 1]) && all_nan_bf16(dx, (rows - 1) * V, V), "fused: target V: NaN loss and NaN dlogits row");
        // the unfused pair with the same dl, per row
        FV dl_full(rows);
        for (long long r = 0; r < rows; r++) dl_full[r] = dl[r * stride];
        emu_launch(grid1(rows), BLOCK, 0, [&] { kiln_cross_entropy_fwd(x.data(), target.data(), loss2.data(), lse.data(), rows, V); });
        emu_launch(grid1(rows), BLOCK, 0, [&] {
            kiln_cross_entropy_bwd(dl_full.data(), x.data(), target.data(), lse.data(), dx2.data(), rows, V);
        });
        tap(loss.same_bits(loss2) && dx.same_bits(dx2), "fused (dl stride %d): same bits as fwd + bwd(lse)", stride);
        FV loss3 = poison_f32(rows);
        emu_launch(grid1(2), BLOCK, 0, [&] {
            kiln_cross_entropy_fused(xy.data(), target.data(), dl.data(), stride, loss3.data(), xy.data(), rows, V);
        });
        tap(xy.same_bits(dx) && loss3.same_bits(loss), "fused in place (dlogits = logits), grid 2 (dl stride %d): same bits", stride);
    }
}

// ---- embedding ----

static int radix_passes(long long V) {  // README: ceil(bitlen(V)/8)
    int bits = 0;
    while (bits < 63 && (1LL << bits) <= V) bits++;
    return std::max(1, (bits + 7) / 8);
}

// The backward's kernel sequence (README).  `intended`: the README's grids
// and passes; otherwise grid 1 (grid_sum for the sum), scan block 64 and
// four passes, which README says give the same result.
static void embedding_backward(const BV &dy, const IV &ids, FV &dtable, long long n, long long C, long long V,
                               bool intended, unsigned grid_sum) {
    const long long tiles = (n + 255) / 256;
    IV work(4 * n + 256 * tiles, 0x5a5a5a5a);
    const int passes = intended ? radix_passes(V) : 4;
    const unsigned tile_grid = intended ? (unsigned)tiles : 1, scan_block = intended ? 1024 : 64;
    for (int p = 0; n > 0 && p < passes; p++) {
        emu_launch(grid1(tile_grid), BLOCK, 0, [&] { kiln_embedding_bwd_hist(ids.data(), work.data(), n, V, p); });
        emu_launch(grid1(1), dim3(scan_block), 0, [&] { kiln_embedding_bwd_scan(work.data(), n, V, p); });
        emu_launch(grid1(tile_grid), BLOCK, 0, [&] { kiln_embedding_bwd_scatter(ids.data(), work.data(), n, V, p); });
    }
    emu_launch(grid1(intended ? ceil_div(V * C, 2048) : 1), BLOCK, 0, [&] { kiln_embedding_bwd_zero(dtable.data(), V, C); });
    dim3 grid = intended ? dim3((unsigned)n, ceil_div(C, 256)) : dim3(grid_sum);
    if (n > 0) emu_launch(grid, BLOCK, 0, [&] { kiln_embedding_bwd(dy.data(), work.data(), dtable.data(), n, C, V); });
}

// bf16 values of both signs and magnitudes from 2^-24 to 2^8: f32 sums of
// them round, so adding them in another order changes bits (sums of values
// of one magnitude are mostly exact in f32, whatever the order)
static BV random_bf16_wide(size_t n) {
    BV v(n);
    for (auto &x : v) x = __float2bfloat16_rn((float)((urand() < 0.5 ? -1 : 1) * (1 + urand()) * ldexp(1.0, (int)(urand() * 32) - 24)));
    return v;
}

// ids drawn from `distinct` random ids in [0, V) (many repeats, every radix
// digit in use); n > 5: ids 2 and 4 are bad (-1 and V), id 5 is V-1
static void case_embedding(long long n, long long C, long long V, int distinct, unsigned grid_sum) {
    BV table = random_bf16(V * C, -1, 1), dy = random_bf16_wide(n * C);
    std::vector<int> pool(distinct);
    for (int &id : pool) id = (int)(urand() * V);
    IV ids(n);
    for (long long i = 0; i < n; i++) ids[i] = pool[(size_t)(urand() * distinct)];
    if (n > 5) ids[2] = -1, ids[4] = (int)V, ids[5] = (int)V - 1;
    BV out = poison_bf16(n * C);
    if (n) emu_launch(grid1(n), BLOCK, 0, [&] { kiln_embedding_fwd(table.data(), ids.data(), out.data(), n, C, V); });
    long long wrong_rows = 0;
    for (long long i = 0; i < n; i++) {
        bool bad = ids[i] < 0 || ids[i] >= V;
        bool ok = bad ? all_nan_bf16(out, i * C, C) : memcmp(&out[i * C], &table[(long long)ids[i] * C], C * 2) == 0;
        wrong_rows += !ok;
    }
    tap(wrong_rows == 0, "forward: %lld of %lld rows differ from the table row (NaN for a bad id)", wrong_rows, n);
    // the reference: f32 sums of the dy rows in ascending row order, bad ids dropped
    FV ref(V * C, 0.0f);
    for (long long i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < V)
            for (long long c = 0; c < C; c++) ref[(long long)ids[i] * C + c] += __bfloat162float(dy[i * C + c]);
    for (int intended = 1; intended >= 0; intended--) {
        FV dtable = poison_f32(V * C);
        embedding_backward(dy, ids, dtable, n, C, V, intended, grid_sum);
        long long differ = 0, first = -1;
        for (long long i = 0; i < V * C; i++)
            if (memcmp(&dtable[i], &ref[i], 4) != 0) differ++, first = first < 0 ? i : first;
        tap(differ == 0, "backward (%s): %lld of %lld values differ from ascending-order f32 sums%s",
            intended ? "README grids, passes" : "grid 1, scan block 64, 4 passes", differ, V * C,
            differ ? (" (first at " + std::to_string(first) + ")").c_str() : "");
    }
}

// ---- adamw ----

static void case_adamw(long long n, float step, unsigned grid) {
    const double b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
    FV p = random_f32(n, -1, 1), g = random_f32(n, -1e-2, 1e-2), m = random_f32(n, -1e-3, 1e-3), v = random_f32(n, 0, 1e-5);
    FV lr(1, 6e-4f), scale(1, 0.7f), t(1, step);
    DV p_ref(n), m_ref(n), v_ref(n);
    for (long long i = 0; i < n; i++) {
        double gi = (double)g[i] * scale[0];
        m_ref[i] = b1 * m[i] + (1 - b1) * gi;
        v_ref[i] = b2 * v[i] + (1 - b2) * gi * gi;
        double mhat = m_ref[i] / (1 - pow(b1, step)), vhat = v_ref[i] / (1 - pow(b2, step));
        p_ref[i] = p[i] - (double)lr[0] * wd * p[i] - (double)lr[0] * mhat / (sqrt(vhat) + eps);
    }
    FV po = poison_f32(n), mo = poison_f32(n), vo = poison_f32(n);
    BV pb = poison_bf16(n);
    emu_launch(grid1(grid), BLOCK, 0, [&] {
        kiln_adamw(p.data(), g.data(), m.data(), v.data(), lr.data(), scale.data(), t.data(), po.data(), mo.data(),
                   vo.data(), pb.data(), n, b1, b2, eps, wd);
    });
    expect_close("p'", po, p_ref, 1e-6, 1e-7);
    expect_close("m'", mo, m_ref, 1e-6, 1e-6);
    expect_close("v'", vo, v_ref, 1e-5, 1e-7);
    long long wrong = 0;
    for (long long i = 0; i < n; i++) wrong += pb[i].bits != __float2bfloat16_rn(po[i]).bits;
    tap(wrong == 0, "p_bf16 = bf16(p'): %lld of %lld differ", wrong, n);
    FV pi = p, mi = m, vi = v;  // in place, p_bf16 NULL, grid 3
    emu_launch(grid1(3), BLOCK, 0, [&] {
        kiln_adamw(pi.data(), g.data(), mi.data(), vi.data(), lr.data(), scale.data(), t.data(), pi.data(), mi.data(),
                   vi.data(), nullptr, n, b1, b2, eps, wd);
    });
    tap(pi.same_bits(po) && mi.same_bits(mo) && vi.same_bits(vo), "in place, p_bf16 NULL, grid 3: same bits");
    // arrays one element off 16-byte alignment: the scalar loop alone (the
    // above took the float4 loop for all but n % 4): the same bits
    FV p1(n + 1), g1(n + 1), m1(n + 1), v1(n + 1), po1 = poison_f32(n + 1), mo1 = poison_f32(n + 1), vo1 = poison_f32(n + 1);
    BV pb1 = poison_bf16(n + 1);
    for (long long i = 0; i < n; i++) p1[i + 1] = p[i], g1[i + 1] = g[i], m1[i + 1] = m[i], v1[i + 1] = v[i];
    emu_launch(grid1(grid), BLOCK, 0, [&] {
        kiln_adamw(p1.data() + 1, g1.data() + 1, m1.data() + 1, v1.data() + 1, lr.data(), scale.data(), t.data(), po1.data() + 1,
                   mo1.data() + 1, vo1.data() + 1, pb1.data() + 1, n, b1, b2, eps, wd);
    });
    long long diff = 0;
    for (long long i = 0; i < n; i++)
        diff += memcmp(&po1[i + 1], &po[i], 4) || memcmp(&mo1[i + 1], &mo[i], 4) || memcmp(&vo1[i + 1], &vo[i], 4) ||
                pb1[i + 1].bits != pb[i].bits;
    tap(diff == 0, "unaligned arrays (the scalar loop): same bits as the aligned run (%lld of %lld elements differ)", diff, n);
}

// ---- the emulator itself ----
//
// The kernel checks trust emu.h's barriers and warp collectives; these
// cases pin down the parts they rely on, with expectations written from
// the CUDA programming guide rather than from emu.cpp.

// shuffle results for lane l of a warp whose lane k holds 100*warp + k
static int expect_shuffle(EmuWarpOp op, int warp, int l, int arg, int width) {
    int seg = l / width * width, j;
    switch (op) {
    case EMU_SHFL_IDX: j = seg + arg % width; break;                               // lane arg of its segment
    case EMU_SHFL_UP: j = l - arg >= seg ? l - arg : l; break;                    // own value below the segment
    case EMU_SHFL_DOWN: j = l + arg < seg + width ? l + arg : l; break;           // own value past the segment
    default: j = (l ^ arg) < seg + width ? l ^ arg : l; break;                    // later segments: own value
    }
    return 100 * warp + j;
}

static void case_emulator_collectives() {
    const int n = 64, ops = 8;
    struct Shfl { EmuWarpOp op; int arg, width; const char *name; };
    const Shfl shfl[ops] = {{EMU_SHFL_XOR, 5, 32, "xor 5"},   {EMU_SHFL_XOR, 9, 8, "xor 9 width 8"},
                            {EMU_SHFL_UP, 3, 32, "up 3"},     {EMU_SHFL_UP, 3, 8, "up 3 width 8"},
                            {EMU_SHFL_DOWN, 3, 32, "down 3"}, {EMU_SHFL_DOWN, 3, 8, "down 3 width 8"},
                            {EMU_SHFL_IDX, 7, 32, "idx 7"},   {EMU_SHFL_IDX, 13, 8, "idx 13 width 8"}};
    IV got(n * ops), match(n), ballot(n), any(n), all(n);
    emu_launch(dim3(1), dim3(n), 0, [&] {
        int l = threadIdx.x & 31, v = 100 * (threadIdx.x >> 5) + l;
        int *g = &got[threadIdx.x * ops];
        g[0] = __shfl_xor_sync(0xffffffffu, v, 5);
        g[1] = __shfl_xor_sync(0xffffffffu, v, 9, 8);
        g[2] = __shfl_up_sync(0xffffffffu, v, 3);
        g[3] = __shfl_up_sync(0xffffffffu, v, 3, 8);
        g[4] = __shfl_down_sync(0xffffffffu, v, 3);
        g[5] = __shfl_down_sync(0xffffffffu, v, 3, 8);
        g[6] = __shfl_sync(0xffffffffu, v, 7);
        g[7] = __shfl_sync(0xffffffffu, v, 13, 8);
        match[threadIdx.x] = (int)__match_any_sync(0xffffffffu, l % 3);
        ballot[threadIdx.x] = (int)__ballot_sync(0xffffffffu, l % 3 == 0);
        any[threadIdx.x] = __any_sync(0xffffffffu, threadIdx.x == 40);
        all[threadIdx.x] = __all_sync(0xffffffffu, threadIdx.x != 40);
    });
    for (int k = 0; k < ops; k++) {
        int wrong = 0;
        for (int t = 0; t < n; t++) wrong += got[t * ops + k] != expect_shuffle(shfl[k].op, t / 32, t % 32, shfl[k].arg, shfl[k].width);
        tap(wrong == 0, "shuffle %s: %d of %d lanes wrong", shfl[k].name, wrong, n);
    }
    int wrong = 0;
    for (int t = 0; t < n; t++) {
        unsigned same = 0, every_third = 0;
        for (int k = 0; k < 32; k++) same |= (unsigned)(k % 3 == t % 32 % 3) << k, every_third |= (unsigned)(k % 3 == 0) << k;
        wrong += (unsigned)match[t] != same || (unsigned)ballot[t] != every_third;
        wrong += any[t] != (t >= 32) || all[t] != (t < 32);
    }
    tap(wrong == 0, "__match_any_sync, __ballot_sync, __any_sync, __all_sync: %d of %d lanes wrong", wrong, n);
}

// what an emulation error says, or "" when the launch succeeds
template <class F>
static std::string emulation_error(dim3 block, F &&kernel_thread) {
    try {
        emu_launch(dim3(1), block, 0, kernel_thread);
    } catch (const EmuError &e) {
        return e.what();
    }
    return "";
}

static void case_emulator_errors() {
    std::string e = emulation_error(dim3(64), [] {
        if (threadIdx.x == 3) return;
        __syncthreads();
    });
    tap(e.find("can never finish") != std::string::npos, "a thread returning before __syncthreads is reported: %s", e.c_str());
    e = emulation_error(dim3(32), [] {
        if (threadIdx.x < 16) __shfl_xor_sync(0xffffffffu, 1, 1);
        else __shfl_up_sync(0xffffffffu, 1, 1);
    });
    tap(e.find("divergence") != std::string::npos, "lanes at different shuffles are reported: %s", e.c_str());
    e = emulation_error(dim3(32), [] { __shfl_xor_sync(0x0000ffffu, 1, 1); });
    tap(e.find("partial masks") != std::string::npos, "a partial mask is reported: %s", e.c_str());
}

// Dynamic shared memory starts as NaN; a missing barrier between writing it
// and reading a neighbour's slot gives a wrong value in one of the two run
// orders (forward in block 0, reverse in block 1), and none with the barrier.
static void case_emulator_shared_memory() {
    const int n = 64;
    FV out(2 * n), unwritten(1);
    for (int barrier = 1; barrier >= 0; barrier--) {
        emu_launch(dim3(2), dim3(n), (n + 1) * 4, [&] {
            float *s = (float *)emu_dynamic_smem;
            unsigned t = threadIdx.x;
            if (t == 0 && blockIdx.x == 1) unwritten[0] = s[n];  // no thread writes s[n]
            s[t] = (float)t;
            if (barrier) __syncthreads();
            out[blockIdx.x * n + t] = s[(t + 1) % n];
        });
        int wrong[2] = {0, 0};
        for (int b = 0; b < 2; b++)
            for (int t = 0; t < n; t++) wrong[b] += out[b * n + t] != (float)((t + 1) % n);
        if (barrier) tap(wrong[0] + wrong[1] == 0, "with the barrier: %d + %d wrong values (blocks 0, 1)", wrong[0], wrong[1]);
        else tap(wrong[0] + wrong[1] > 0, "without the barrier: %d + %d wrong values (blocks 0, 1)", wrong[0], wrong[1]);
    }
    tap(std::isnan(unwritten[0]), "unwritten dynamic shared memory reads as NaN (%g)", unwritten[0]);
}

// ---- main ----

static std::string str(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static std::string str(const char *fmt, ...) {
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return buf;
}

int main(int argc, char **argv) {
    setvbuf(stdout, nullptr, _IOLBF, 0);
    auto wanted = [&](const char *family) {
        if (argc < 2) return true;
        for (int i = 1; i < argc; i++)
            if (strcmp(argv[i], family) == 0) return true;
        return false;
    };
    if (wanted("emu")) {
        run_case("emulator: warp collectives", case_emulator_collectives);
        run_case("emulator: errors", case_emulator_errors);
        run_case("emulator: shared memory and run order", case_emulator_shared_memory);
    }
    struct Norm { long long rows, C; unsigned other_grid; const char *why; };
    if (wanted("layernorm"))
        for (Norm s : {Norm{5, 300, 2, ""}, Norm{600, 40, 7, " (more rows than parts)"}, Norm{3, 768, 1, ""},
                       Norm{600, 512, 5, " (warp paths, more rows than parts)"}, Norm{20, 2048, 3, " (C > 1024: the block paths)"},
                       Norm{0, 33, 1, " (no rows: dw = db = 0)"}})
            run_case(str("layernorm rows=%lld C=%lld%s", s.rows, s.C, s.why), [&] { case_layernorm(s.rows, s.C, s.other_grid); });
    if (wanted("rmsnorm"))
        for (Norm s : {Norm{7, 513, 3, ""}, Norm{530, 20, 5, " (more rows than parts)"}, Norm{0, 9, 1, " (no rows: dw = 0)"}})
            run_case(str("rmsnorm rows=%lld C=%lld%s", s.rows, s.C, s.why), [&] { case_rmsnorm(s.rows, s.C, s.other_grid); });
    if (wanted("rope")) {
        run_case("rope B=2 T=5 H=3 D=64", [] { case_rope(2, 5, 3, 64, 10000, false, 3); });
        run_case("rope B=1 T=3 H=2 D=600 (D/2 > block, positions ~1e5)", [] { case_rope(1, 3, 2, 600, 500000, true, 2); });
    }
    if (wanted("xent")) {
        run_case("cross_entropy rows=6 V=1000", [] { case_xent(6, 1000); });
        run_case("cross_entropy rows=3 V=50 (V < block)", [] { case_xent(3, 50); });
    }
    if (wanted("xent_fused")) {
        run_case("cross_entropy_fused rows=5 V=50257 (GPT-2's odd vocabulary)", [] { case_xent_fused(5, 50257); });
        run_case("cross_entropy_fused rows=3 V=50 (V < block)", [] { case_xent_fused(3, 50); });
        run_case("cross_entropy_fused rows=7 V=1000", [] { case_xent_fused(7, 1000); });
    }
    if (wanted("embedding")) {
        run_case("embedding n=700 C=300 V=70000 (3 passes)", [] { case_embedding(700, 300, 70000, 50, 5); });
        run_case("embedding n=300 C=40 V=300 (2 passes)", [] { case_embedding(300, 40, 300, 7, 2); });
        run_case("embedding n=513 C=16 V=5 (1 pass, every id repeats)", [] { case_embedding(513, 16, 5, 5, 3); });
        run_case("embedding n=0 C=8 V=10 (no ids: zeros)", [] { case_embedding(0, 8, 10, 1, 1); });
    }
    if (wanted("adamw")) {
        run_case("adamw n=1000 t=1", [] { case_adamw(1000, 1, 4); });
        run_case("adamw n=777 t=123", [] { case_adamw(777, 123, 1); });
    }
    printf("1..%d\n", tap_count);
    return tap_failures != 0;
}
