// check_misc.cpp — kernels/cuda/misc.cu (copy, sumto, reduce, max_bwd,
// softmax, softmax_bwd, sumsq, clipscale, lr_cosine, fill, iota, iota_rank,
// attn_merge) run on the host emulator (emu.h) and compared with
// independent references written here from compiler/ops.def,
// runtime/kiln_rt.h and kernels/cuda/README.md.
//
// tests/t_cuda_emu.sh builds it against its host copy of kernels/cuda (the
// two rewrites emu.h describes) and runs it after check.cpp.  It prints TAP,
// one line per property, with the measured worst error, then the plan; it
// exits 1 when a check fails.  `check_misc NAME...` runs only those families
// (copy sumto reduce softmax sumsq scalars fill iota attn_merge; reduce
// includes max_bwd, scalars clipscale and lr_cosine, iota iota_rank).
//
// References and tolerances.  Inputs are exact in their dtype (bf16 inputs
// are bf16 values), and the references compute in double from them, so what
// differs is only the kernel's f32 math and the rounding of its output.  Per
// element, |got - want| <= tol, with u = 2^-24 (f32's unit roundoff) and
// r_out = 2^-8 for a bf16 output, 2^-24 for f32 (its rounding):
//   - sums of n terms (sumto, reduce): r_out |want| + n u sum|terms|, the
//     bound of recursive f32 summation; and more: since README fixes the
//     order (each output adds its inputs in row-major order of x, in f32),
//     the result must equal, bit for bit, that f32 sum done here;
//   - softmax: r_out |y| + (|x - max| + C + 32) u |y| (the exponent's
//     rounding, the sum, the division); its backward:
//     r_out |dx| + |y| ((C + 16) u sum|dy y| + 2u (|dy| + |dot|));
//   - sumsq: (chain + 24) u want, where chain is the longest run of
//     additions one value goes through (a thread's share, then the warp and
//     block trees, then the final kernel);
//   - attn_merge: r_out |o| + (|lse_a| + |lse_b| + 2|lse| + 8) u (|w_a o_a| +
//     |w_b o_b|) (the weights' exponents); lse: 8u (1 + |lse|);
//   - copy, max_bwd, fill, iota, iota_rank, clipscale: exact (clipscale's
//     double math is IEEE on both sides); lr_cosine: 1 f32 ulp (cos).
// Where README promises bits, the check compares bits: another grid (smaller,
// or with idle blocks where the intended one is a single block) gives the
// intended grid's result, in place gives the out-of-place bits, copy's
// 64-bit index path gives the 32-bit path's bits.
//
// Outputs start as NaN (poison) and sit between guard zones checked when
// freed, so an element no thread writes, or a write out of bounds, fails.
// An emulation error (deadlock, divergent barrier or shuffle) fails its case.

// copy's index-width switch, lowered by the copy cases (see misc.cu)
static long long misc_index32_max = 0xffffffffLL;
#define MISC_INDEX32_MAX misc_index32_max

#include "emu.h"

#include "misc.cu"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

// ---- TAP ----

static int tap_count, tap_failures;
static std::string case_name;

__attribute__((format(printf, 2, 3))) static bool tap(bool ok, const char *fmt, ...) {
    char what[640];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    printf("%s %d - %s: %s\n", ok ? "ok" : "not ok", ++tap_count, case_name.c_str(), what);
    tap_failures += !ok;
    return ok;
}

static std::string str(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static std::string str(const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return buf;
}

// ---- tensors of a run-time dtype, between guard zones ----

static const size_t GUARD_BYTES = 256;
static const unsigned char GUARD_FILL = 0xa5;
static int guard_breaches;

static size_t esize(int dt) { return dt == KILN_BF16 ? 2 : 4; }
static const char *dtname(int dt) { return dt == KILN_BF16 ? "bf16" : dt == KILN_I32 ? "i32" : "f32"; }

// n elements of dtype dt (f32, bf16 or i32), or of `eb` raw bytes each
struct Tensor {
    int dt;
    size_t n, eb;
    std::vector<unsigned char> bytes;  // guard, data, guard
    Tensor(int dt_, size_t n_) : Tensor(dt_, n_, esize(dt_)) {}
    Tensor(int dt_, size_t n_, size_t eb_) : dt(dt_), n(n_), eb(eb_), bytes(n_ * eb_ + 2 * GUARD_BYTES, GUARD_FILL) {}
    Tensor(const Tensor &) = default;
    Tensor &operator=(const Tensor &) = delete;
    ~Tensor() { guard_breaches += !intact(); }
    unsigned char *p() { return bytes.data() + GUARD_BYTES; }
    const unsigned char *p() const { return bytes.data() + GUARD_BYTES; }
    double get(size_t i) const {
        if (dt == KILN_BF16) {
            uint32_t u = (uint32_t)(p()[2 * i] | p()[2 * i + 1] << 8) << 16;
            float f;
            memcpy(&f, &u, 4);
            return f;
        }
        if (dt == KILN_I32) {
            int32_t v;
            memcpy(&v, p() + 4 * i, 4);
            return v;
        }
        float f;
        memcpy(&f, p() + 4 * i, 4);
        return f;
    }
    // v must be exact in the dtype (inputs), or NaN (poison)
    void set(size_t i, double v) {
        if (dt == KILN_BF16) {
            float f = (float)v;
            uint32_t u;
            memcpy(&u, &f, 4);
            uint16_t b = std::isnan(v) ? 0x7fa0 : (uint16_t)(u >> 16);
            memcpy(p() + 2 * i, &b, 2);
        } else if (dt == KILN_I32) {
            int32_t x = (int32_t)v;
            memcpy(p() + 4 * i, &x, 4);
        } else {
            float f = (float)v;
            memcpy(p() + 4 * i, &f, 4);
        }
    }
    bool intact() const {
        const unsigned char *tail = bytes.data() + GUARD_BYTES + n * eb;
        for (size_t i = 0; i < GUARD_BYTES; i++)
            if (bytes[i] != GUARD_FILL || tail[i] != GUARD_FILL) return false;
        return true;
    }
    bool same_bits(const Tensor &o) const { return n * eb == o.n * o.eb && memcmp(p(), o.p(), n * eb) == 0; }
};

typedef std::vector<double> DV;

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;
static double urand() {  // xorshift64, [0, 1)
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) * (1.0 / 9007199254740992.0);
}

// v rounded to bf16, nearest even, from the double: the two bf16 neighbours
// of the f32 value (truncated and one up), whichever is nearer (ties: even)
static double bf16_of(double v) {
    float f = (float)v;
    if (std::isnan(f) || std::isinf(f)) return f;
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;
    float flo, fhi;
    memcpy(&flo, &lo, 4);
    memcpy(&fhi, &hi, 4);
    double dlo = fabs((double)f - flo), dhi = fabs((double)fhi - f);
    if (dlo < dhi || (dlo == dhi && !(lo & 0x10000u))) return flo;
    return fhi;
}

// exact in dtype dt: bf16 values are rounded, f32 ones are (float)
static double in_dt(double v, int dt) { return dt == KILN_BF16 ? bf16_of(v) : (double)(float)v; }

static Tensor random_tensor(int dt, size_t n, double lo, double hi) {
    Tensor t(dt, n);
    for (size_t i = 0; i < n; i++) t.set(i, in_dt(lo + (hi - lo) * urand(), dt));
    return t;
}
static Tensor poison(int dt, size_t n) {
    Tensor t(dt, n);
    for (size_t i = 0; i < n; i++) t.set(i, NAN);
    return t;
}

// ---- comparisons ----

static const double U = 1.0 / 16777216.0;  // f32 unit roundoff, 2^-24
static double r_out(int dt) { return dt == KILN_BF16 ? 1.0 / 256 : U; }

// got[i] against want[i] within tol[i]; NaN and infinities must match exactly
static bool expect_close(const char *what, const Tensor &got, const DV &want, const DV &tol) {
    double worst = 0, worst_abs = 0;
    size_t at = 0, bad = 0;
    for (size_t i = 0; i < want.size(); i++) {
        double g = got.get(i), w = want[i], ratio;
        if (std::isnan(w) || std::isinf(w) || std::isnan(g) || std::isinf(g))
            ratio = (std::isnan(w) && std::isnan(g)) || g == w ? 0 : INFINITY;
        else
            ratio = fabs(g - w) / std::max(tol[i], 1e-300), worst_abs = std::max(worst_abs, fabs(g - w));
        bad += ratio > 1;
        if (ratio > worst || (i == 0 && ratio >= worst)) worst = ratio, at = i;
    }
    if (want.empty()) return tap(true, "%s: empty", what);
    return tap(bad == 0, "%s: %zu of %zu outside tolerance; worst err/tol %.3f at [%zu] (got %.9g, want %.9g, tol %.2e); max |err| %.2e",
               what, bad, want.size(), worst, at, got.get(at), want[at], tol[at], worst_abs);
}

// the same value (bits, or both NaN) as want, element by element
static bool expect_equal(const char *what, const Tensor &got, const DV &want) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < want.size(); i++) {
        double g = got.get(i), w = want[i];
        bool same = std::isnan(w) ? std::isnan(g) : g == w && std::signbit(g) == std::signbit(w);
        if (!same && !bad++) first = i;
    }
    if (!bad) return tap(true, "%s: all %zu exact", what, want.size());
    return tap(false, "%s: %zu of %zu differ, first [%zu]: got %.9g, want %.9g", what, bad, want.size(), first, got.get(first),
               want[first]);
}

static void run_case(const std::string &name, const std::function<void()> &body) {
    case_name = name;
    guard_breaches = 0;
    try {
        body();
    } catch (const EmuError &e) {
        tap(false, "%s", e.what());
    }
    tap(guard_breaches == 0, "no write outside its buffers (%d guard zones overwritten)", guard_breaches);
}

static const dim3 BLOCK(KILN_BLOCK);
static unsigned elems(long long n) { return (unsigned)std::min((n + 255) / 256, 65535LL); }

// launch when the grid is not 0 (README: skip a launch whose grid is 0)
template <class F>
static void launch(long long grid, unsigned block, F &&kernel_call) {
    if (grid > 0) emu_launch(dim3((unsigned)grid), dim3(block), 0, kernel_call);
}

// ---- copy ----

struct CopyCase {
    const char *what;
    long long eb;
    int rank;
    long long d[5], ss[5], ds[5];
    long long src_n, src_off, dst_n, dst_off;  // elements
};

// the copy by nested loops, on bytes
static void copy_reference(const CopyCase &c, const unsigned char *src, unsigned char *dst) {
    long long d[5] = {1, 1, 1, 1, 1};
    for (int k = 0; k < c.rank; k++) d[k] = c.d[k];
    for (long long a = 0; a < d[0]; a++)
        for (long long b = 0; b < d[1]; b++)
            for (long long e = 0; e < d[2]; e++)
                for (long long f = 0; f < d[3]; f++)
                    for (long long g = 0; g < d[4]; g++) {
                        long long i[5] = {a, b, e, f, g}, so = c.src_off, dof = c.dst_off;
                        for (int k = 0; k < c.rank; k++) so += i[k] * c.ss[k], dof += i[k] * c.ds[k];
                        memcpy(dst + dof * c.eb, src + so * c.eb, (size_t)c.eb);
                    }
}

static void case_copy(const CopyCase &c) {
    Tensor src(KILN_F32, (size_t)c.src_n, (size_t)c.eb), dst0(KILN_F32, (size_t)c.dst_n, (size_t)c.eb);
    for (size_t i = 0; i < src.n * src.eb; i++) src.p()[i] = (unsigned char)(urand() * 256);
    for (size_t i = 0; i < dst0.n * dst0.eb; i++) dst0.p()[i] = (unsigned char)(0x3c + i % 7);
    Tensor want = dst0;
    copy_reference(c, src.p(), want.p());
    long long total = 1;
    for (int k = 0; k < c.rank; k++) total *= c.d[k];
    auto run = [&](Tensor &dst, long long grid) {
        const void *s = src.p() + c.src_off * c.eb;
        void *d = dst.p() + c.dst_off * c.eb;
        launch(grid, KILN_BLOCK, [&] {
            kiln_copy(s, d, c.eb, c.rank, c.d[0], c.d[1], c.d[2], c.d[3], c.d[4], c.ss[0], c.ss[1], c.ss[2], c.ss[3], c.ss[4],
                      c.ds[0], c.ds[1], c.ds[2], c.ds[3], c.ds[4]);
        });
    };
    Tensor dst = dst0, dst1 = dst0, dst64 = dst0;
    run(dst, total ? elems(total) : 1);  // total 0: grid 1 all the same, the kernel must write nothing
    tap(dst.same_bits(want), "%lld elements of %lld bytes: %s", total, c.eb,
        dst.same_bits(want) ? "every byte of dst as the loop reference (untouched ones kept)" : "dst differs from the loop reference");
    run(dst1, 1);
    misc_index32_max = 0;  // the 64-bit index path
    run(dst64, 3);
    misc_index32_max = 0xffffffffLL;
    tap(dst1.same_bits(dst) && dst64.same_bits(dst), "grid 1, and grid 3 with 64-bit indices: same bits");
}

static void copy_cases() {
    const long long A = 3, B = 5, C = 7;
    std::vector<CopyCase> cs = {
        {"transpose [3,5,7] -> [7,3,5], f32", 4, 3, {C, A, B}, {1, B * C, C}, {A * B, B, 1}, A * B * C, 0, A * B * C, 0},
        {"[B,T,H,D] -> [B,H,T,D], D = 64, bf16 (a warp a row)", 2, 4, {2, 3, 5, 64}, {5 * 3 * 64, 64, 3 * 64, 1}, {3 * 5 * 64, 5 * 64, 64, 1},
         2 * 5 * 3 * 64, 0, 2 * 3 * 5 * 64, 0},
        {"the same widened by rtk_copy: 16-byte elements, D/8 = 8 a row", 16, 4, {2, 3, 5, 8}, {5 * 3 * 8, 8, 3 * 8, 1},
         {3 * 5 * 8, 5 * 8, 8, 1}, 2 * 5 * 3 * 8, 0, 2 * 3 * 5 * 8, 0},
        {"16-byte elements, a run of 40 (a warp a row): rows of [6,96] into cols 16..55 of [6,64]", 16, 2, {6, 40},
         {96, 1}, {64, 1}, 6 * 96, 0, 6 * 64, 16},
        {"slice rows 2..5, cols 3..39 of [7,50], bf16", 2, 2, {4, 37}, {50, 1}, {37, 1}, 350, 2 * 50 + 3, 4 * 37, 0},
        {"concat part: [5,33] into cols 10..42 of [5,80]", 4, 2, {5, 33}, {33, 1}, {80, 1}, 165, 0, 400, 10},
        {"broadcast [1,40] -> [6,40]", 4, 2, {6, 40}, {0, 1}, {40, 1}, 40, 0, 240, 0},
        {"broadcast [6,1] -> [6,45] (run of source stride 0)", 4, 2, {6, 45}, {1, 0}, {45, 1}, 6, 0, 270, 0},
        {"rank 5 [2,3,1,5,7] permuted, 8-byte elements", 8, 5, {2, 3, 1, 5, 7}, {1, 2 * 7 * 5, 999, 2 * 7, 2}, {105, 35, 35, 7, 1},
         2 * 3 * 5 * 7, 0, 210, 0},
        {"rank 3 [4,3,2] reversed order, 1-byte elements", 1, 3, {4, 3, 2}, {1, 4, 12}, {6, 2, 1}, 24, 0, 24, 0},
        {"3-byte elements (byte path), [5,9] transposed", 3, 2, {9, 5}, {1, 9}, {5, 1}, 45, 0, 45, 0},
        {"rank 0: one element", 4, 0, {0, 0, 0, 0, 0}, {0}, {0}, 1, 0, 1, 0},
        {"a dim of 0: nothing written", 4, 3, {3, 0, 4}, {4, 4, 1}, {4, 4, 1}, 12, 0, 12, 0},
        {"contiguous [64,100] (merges into one run)", 2, 2, {64, 100}, {100, 1}, {100, 1}, 6400, 0, 6400, 0},
        {"whole rows 3..7 of [10,20] with odd strides in dst", 4, 3, {5, 2, 10}, {20, 10, 1}, {21, 10, 1}, 200, 60, 110, 3},
    };
    for (const CopyCase &c : cs) run_case(str("copy %s", c.what), [&] { case_copy(c); });
}

// ---- sumto ----

// x [d] (rank dims) of dtx summed over the dims in `summed` (bit k: dim k);
// y row-major over the kept dims, or with the strides `y_strides` (0 for
// the summed dims) when given
static void case_sumto(int rank, std::vector<long long> d, unsigned summed, int dtx, int dty, unsigned other_grid,
                       std::vector<long long> y_strides = {}) {
    d.resize(5, 1);
    long long nx = 1, ny = 1, ys[5] = {0, 0, 0, 0, 0};
    for (int k = 0; k < rank; k++) nx *= d[k];
    for (int k = rank - 1; k >= 0; k--)
        if (!(summed >> k & 1)) ys[k] = y_strides.empty() ? ny : y_strides[k], ny *= d[k];
    Tensor x = random_tensor(dtx, (size_t)nx, -1, 1);
    // x in row-major order: each output sees its terms in that order
    DV want(ny, 0), sumabs(ny, 0), count(ny, 0);
    std::vector<float> seq(ny, 0.0f);
    for (long long i = 0; i < nx; i++) {
        long long r = i, yo = 0;
        for (int k = rank - 1; k >= 0; k--) yo += r % d[k] * ys[k], r /= d[k];
        double v = x.get(i);
        want[yo] += v, sumabs[yo] += fabs(v), count[yo]++;
        seq[yo] += (float)v;
    }
    DV tol(ny), exact(ny);
    for (long long j = 0; j < ny; j++) {
        tol[j] = r_out(dty) * fabs(want[j]) + count[j] * U * sumabs[j];
        exact[j] = dty == KILN_BF16 ? bf16_of(seq[j]) : seq[j];
    }
    auto run = [&](Tensor &y, long long grid) {
        launch(grid, KILN_BLOCK, [&] {
            kiln_sumto(x.p(), y.p(), dtx, dty, rank, d[0], d[1], d[2], d[3], d[4], ys[0], ys[1], ys[2], ys[3], ys[4]);
        });
    };
    Tensor y = poison(dty, ny), y2 = poison(dty, ny);
    run(y, elems(ny));
    expect_close("y against the double sums", y, want, tol);
    expect_equal("y = the f32 sums in row-major order of x", y, exact);
    run(y2, other_grid);
    tap(y2.same_bits(y), "grid %u: same bits as grid %u", other_grid, elems(ny));
}

static void sumto_cases() {
    struct S { int rank; std::vector<long long> d; unsigned summed; const char *why; unsigned grid; };
    std::vector<S> ss = {
        {2, {300, 70}, 1, "[300,70] -> [70] (a bias gradient)", 3},
        {2, {37, 70}, 2, "[37,70] -> [37,1]", 2},
        {4, {3, 5, 7, 9}, 5, "[3,5,7,9] -> [1,5,1,9]", 3},
        {4, {3, 5, 7, 9}, 10, "[3,5,7,9] -> [3,1,7,1]", 2},
        {5, {2, 3, 4, 5, 6}, 0x13, "rank 5, dims 0, 1, 4 summed", 2},
        {5, {4, 1, 3, 1, 33}, 0x0b, "rank 5 with size-1 dims", 2},
        {3, {9, 11, 13}, 7, "everything summed: a scalar", 2},
        {3, {2, 3, 5}, 0, "nothing summed: a conversion", 2},
        {3, {4, 0, 5}, 2, "a summed dim of 0: zeros", 2},
        {0, {}, 0, "rank 0", 2},
        {3, {1000, 3, 2}, 1, "[1000,3,2] -> [3,2]", 2},
        {2, {5, 600}, 1, "[5,600] -> [600] (3 blocks)", 2},
        {3, {7, 300, 2}, 2, "[7,300,2] -> [7,1,2]", 2},
        {2, {3, 1100}, 1, "[3,1100] -> [1100] (5 blocks)", 1},
    };
    const int dts[4][2] = {{KILN_BF16, KILN_F32}, {KILN_F32, KILN_F32}, {KILN_BF16, KILN_BF16}, {KILN_F32, KILN_BF16}};
    int k = 0;
    for (const S &s : ss) {
        const int *dt = dts[k++ % 4];
        run_case(str("sumto %s, %s -> %s", s.why, dtname(dt[0]), dtname(dt[1])),
                 [&] { case_sumto(s.rank, s.d, s.summed, dt[0], dt[1], s.grid); });
    }
    run_case("sumto [4,6,3] -> [4,6,1] stored as [6,4] (y strides 1, 4), f32 -> f32",
             [] { case_sumto(3, {4, 6, 3}, 4, KILN_F32, KILN_F32, 2, {1, 4, 0}); });
}

// x [R, K] -> y [K] by kiln_sumto_rows + kiln_sumto_parts (README's parts
// and order: parts of rpp rows, 8 warps a part each adding every 8th row,
// the warps' sums in order, then the parts in order), on the intended grid
// and on grid (gx, gy), which must give the same bits
static void case_sumto_rows(long long R, long long K, int dtx, int dty, unsigned gx, unsigned gy) {
    long long parts = (R + 255) / 256;
    parts = parts < 1 ? 1 : parts > 1024 ? 1024 : parts;
    long long rpp = (R + parts - 1) / parts;
    Tensor x = random_tensor(dtx, (size_t)(R * K), -1, 1);
    DV want(K, 0), sumabs(K, 0), tol(K), exact(K);
    for (long long c = 0; c < K; c++) {
        float total = 0.0f;
        for (long long p = 0; p < parts; p++) {
            float w8[8] = {0}, part = 0.0f;
            long long r1 = std::min(R, p * rpp + rpp);
            for (int w = 0; w < 8; w++)
                for (long long r = p * rpp + w; r < r1; r += 8) w8[w] += (float)x.get(r * K + c);
            for (int w = 0; w < 8; w++) part += w8[w];
            total += part;
        }
        for (long long r = 0; r < R; r++) want[c] += x.get(r * K + c), sumabs[c] += fabs(x.get(r * K + c));
        tol[c] = r_out(dty) * fabs(want[c]) + R * U * sumabs[c];
        exact[c] = dty == KILN_BF16 ? bf16_of(total) : total;
    }
    auto run = [&](Tensor &y, unsigned grx, unsigned gry) {
        Tensor part = poison(KILN_F32, (size_t)(parts * K));
        emu_launch(dim3(grx, gry), dim3(KILN_BLOCK), 0,
                   [&] { kiln_sumto_rows(x.p(), (float *)part.p(), dtx, R, K, rpp, parts); });
        launch(elems(K), KILN_BLOCK, [&] { kiln_sumto_parts((const float *)part.p(), y.p(), dty, parts, K); });
    };
    Tensor y = poison(dty, K), y2 = poison(dty, K);
    run(y, (unsigned)((K + 31) / 32), (unsigned)parts);
    expect_close("y against the double sums", y, want, tol);
    expect_equal("y = the f32 sums in README's order", y, exact);
    run(y2, gx, gy);
    tap(y2.same_bits(y), "grid (%u, %u): same bits as the intended grid", gx, gy);
}

static void sumto_rows_cases() {
    run_case("sumto_rows [300,70] -> [70] (a bias gradient, 2 parts), bf16 -> f32",
             [] { case_sumto_rows(300, 70, KILN_BF16, KILN_F32, 1, 1); });
    run_case("sumto_rows [1000,33] -> [33] (4 parts, a ragged last one), f32 -> bf16",
             [] { case_sumto_rows(1000, 33, KILN_F32, KILN_BF16, 2, 3); });
    run_case("sumto_rows [5,600] -> [600] (one part of 5 rows), bf16 -> bf16",
             [] { case_sumto_rows(5, 600, KILN_BF16, KILN_BF16, 3, 1); });
    run_case("sumto_rows [777,1] -> [1] (a scalar), f32 -> f32",
             [] { case_sumto_rows(777, 1, KILN_F32, KILN_F32, 1, 2); });
    run_case("sumto_rows [0,40] -> [40]: zeros", [] { case_sumto_rows(0, 40, KILN_BF16, KILN_F32, 1, 1); });
}

// ---- reduce, max_bwd ----

static const char *KIND[3] = {"sum", "mean", "max"};

// x [outer, n, inner]; `specials`: NaN in column 1 (and -inf in column 2)
static void case_reduce(long long outer, long long n, long long inner, int kind, int dtx, int dty, bool specials) {
    Tensor x = random_tensor(dtx, (size_t)(outer * n * inner), -3, 3);
    if (specials && n > 2 && outer * inner > 2) {  // two different outputs: the first's column 1, the last's column 0
        x.set((size_t)((0 * n + n / 2) * inner + 1 % inner), NAN);
        x.set((size_t)(((outer - 1) * n + 1) * inner), -INFINITY);
    }
    const long long ny = outer * inner;
    DV want(ny), tol(ny), exact(ny);
    for (long long o = 0; o < outer; o++)
        for (long long j = 0; j < inner; j++) {
            double s = 0, a = 0, m = -INFINITY;
            float seq = 0.0f;
            bool nan = false;
            for (long long k = 0; k < n; k++) {
                double v = x.get((size_t)((o * n + k) * inner + j));
                s += v, a += fabs(v), seq += (float)v;
                nan |= std::isnan(v);
                if (v > m) m = v;
            }
            double r = kind == 2 ? (nan ? NAN : m) : kind == 1 ? s / (double)n : s;
            float fr = kind == 2 ? (float)r : kind == 1 ? seq / (float)n : seq;
            want[o * inner + j] = r;
            exact[o * inner + j] = dty == KILN_BF16 ? bf16_of(fr) : fr;
            tol[o * inner + j] = r_out(dty) * fabs(r) + (n + 1) * U * (kind == 1 ? a / (double)n : a);
        }
    Tensor y = poison(dty, ny), y2 = poison(dty, ny);
    launch(elems(ny), KILN_BLOCK, [&] { kiln_reduce(x.p(), y.p(), outer, n, inner, kind, dtx, dty); });
    expect_close("y against double", y, want, tol);
    expect_equal("y = the f32 result in order of n", y, exact);
    launch(1, KILN_BLOCK, [&] { kiln_reduce(x.p(), y2.p(), outer, n, inner, kind, dtx, dty); });
    tap(y2.same_bits(y), "grid 1: same bits");
}

// x drawn from a few values, so that the first argmax matters; NaN in some columns
static void case_max_bwd(long long outer, long long n, long long inner, int dt) {
    const size_t nx = (size_t)(outer * n * inner);
    Tensor x(dt, nx), dy = random_tensor(dt, (size_t)(outer * inner), -2, 2);
    for (size_t i = 0; i < nx; i++) x.set(i, (double)(int)(urand() * 4));
    if (n > 2) {
        x.set(1 % inner, NAN);                           // (0, k=0, j=1%inner): NaN first: it stays the pick
        x.set((size_t)((1 * n + 2) * inner), NAN);       // (1, k=2, j=0) if outer > 1: NaN later never wins
    }
    DV want(nx, 0.0);
    for (long long o = 0; o < outer; o++)
        for (long long j = 0; j < inner; j++) {
            long long best = 0;
            for (long long k = 1; k < n; k++)
                if (x.get((size_t)((o * n + k) * inner + j)) > x.get((size_t)((o * n + best) * inner + j))) best = k;
            if (n > 0) want[(size_t)((o * n + best) * inner + j)] = dy.get((size_t)(o * inner + j));
        }
    Tensor dx = poison(dt, nx), dx2 = poison(dt, nx);
    launch(elems(outer * inner), KILN_BLOCK, [&] { kiln_max_bwd(dy.p(), x.p(), nullptr, dx.p(), outer, n, inner, dt); });
    expect_equal("dx: dy at the first argmax, 0 elsewhere", dx, want);
    launch(1, KILN_BLOCK, [&] { kiln_max_bwd(dy.p(), x.p(), nullptr, dx2.p(), outer, n, inner, dt); });
    Tensor xin = x;  // dx may be x
    launch(2, KILN_BLOCK, [&] { kiln_max_bwd(dy.p(), xin.p(), nullptr, xin.p(), outer, n, inner, dt); });
    tap(dx2.same_bits(dx) && xin.same_bits(dx), "grid 1, and in place (dx = x) with grid 2: same bits");
}

static void reduce_cases() {
    struct R { long long outer, n, inner; const char *why; };
    std::vector<R> rs = {{7, 300, 1, "over the last dim"}, {3, 50, 37, "over a middle dim"}, {1, 1000, 5, "long n"},
                         {4, 1, 9, "n = 1"}, {300, 3, 1, "many outputs (2 blocks)"}};
    int v = 0;
    for (const R &r : rs)
        for (int kind = 0; kind < 3; kind++) {
            int dtx = v % 2 ? KILN_F32 : KILN_BF16, dty = v / 2 % 2 ? KILN_BF16 : KILN_F32;
            v++;
            run_case(str("reduce %s [%lld,%lld,%lld] %s, %s -> %s", KIND[kind], r.outer, r.n, r.inner, r.why, dtname(dtx), dtname(dty)),
                     [&] { case_reduce(r.outer, r.n, r.inner, kind, dtx, dty, true); });
        }
    for (int kind = 0; kind < 3; kind++)
        run_case(str("reduce %s n = 0 (sum 0, mean NaN, max -inf)", KIND[kind]), [&] { case_reduce(3, 0, 4, kind, KILN_F32, KILN_F32, false); });
    run_case("max_bwd [5,7,3] f32", [] { case_max_bwd(5, 7, 3, KILN_F32); });
    run_case("max_bwd [3,40,1] bf16", [] { case_max_bwd(3, 40, 1, KILN_BF16); });
    run_case("max_bwd [2,5,300] bf16 (2 blocks)", [] { case_max_bwd(2, 5, 300, KILN_BF16); });
    run_case("max_bwd n = 0", [] { case_max_bwd(2, 0, 3, KILN_F32); });
}

// ---- softmax ----

// row 1 is shifted by +80 (needs the max subtracted); row 2 has some -inf
static void case_softmax(long long rows, long long C, int dt, unsigned other_grid) {
    const size_t n = (size_t)(rows * C);
    Tensor x = random_tensor(dt, n, -4, 4), dy = random_tensor(dt, n, -1, 1);
    if (rows > 1)
        for (long long i = 0; i < C; i++) x.set((size_t)(C + i), in_dt(x.get((size_t)(C + i)) + 80, dt));
    if (rows > 2 && C > 3)
        for (long long i = 0; i < C; i += 3) x.set((size_t)(2 * C + i), -INFINITY);
    DV y_want(n), y_tol(n), dx_want(n), dx_tol(n);
    Tensor y_in(dt, n);  // the backward's y: the reference's, in dt
    for (long long r = 0; r < rows; r++) {
        const size_t o = (size_t)(r * C);
        double m = -INFINITY, s = 0;
        for (long long i = 0; i < C; i++) m = std::max(m, x.get(o + i));
        for (long long i = 0; i < C; i++) s += exp(x.get(o + i) - m);
        for (long long i = 0; i < C; i++) {
            double y = exp(x.get(o + i) - m) / s, gap = std::isinf(x.get(o + i)) ? 0 : fabs(x.get(o + i) - m);
            y_want[o + i] = y;
            y_tol[o + i] = r_out(dt) * y + (gap + C + 32) * U * y;
            y_in.set(o + i, in_dt(y, dt));
        }
        double dot = 0, sabs = 0;
        for (long long i = 0; i < C; i++) dot += dy.get(o + i) * y_in.get(o + i), sabs += fabs(dy.get(o + i) * y_in.get(o + i));
        for (long long i = 0; i < C; i++) {
            double yi = y_in.get(o + i), g = dy.get(o + i);
            dx_want[o + i] = yi * (g - dot);
            dx_tol[o + i] = r_out(dt) * fabs(dx_want[o + i]) + yi * ((C + 16) * U * sabs + 2 * U * (fabs(g) + fabs(dot)));
        }
    }
    Tensor y = poison(dt, n), dx = poison(dt, n), y2 = poison(dt, n), dx2 = poison(dt, n);
    launch(rows, KILN_BLOCK, [&] { kiln_softmax(x.p(), y.p(), rows, C, dt); });
    launch(rows, KILN_BLOCK, [&] { kiln_softmax_bwd(dy.p(), y_in.p(), dx.p(), rows, C, dt); });
    expect_close("y", y, y_want, y_tol);
    expect_close("dx", dx, dx_want, dx_tol);
    launch(other_grid, KILN_BLOCK, [&] { kiln_softmax(x.p(), y2.p(), rows, C, dt); });
    launch(other_grid, KILN_BLOCK, [&] { kiln_softmax_bwd(dy.p(), y_in.p(), dx2.p(), rows, C, dt); });
    tap(y2.same_bits(y) && dx2.same_bits(dx), "grid %u: same bits", other_grid);
    Tensor xy = x, dyx = dy, ydx = y_in;  // y = x; dx = dy; dx = y
    launch(rows, KILN_BLOCK, [&] { kiln_softmax(xy.p(), xy.p(), rows, C, dt); });
    launch(rows, KILN_BLOCK, [&] { kiln_softmax_bwd(dyx.p(), y_in.p(), dyx.p(), rows, C, dt); });
    launch(rows, KILN_BLOCK, [&] { kiln_softmax_bwd(dy.p(), ydx.p(), ydx.p(), rows, C, dt); });
    tap(xy.same_bits(y) && dyx.same_bits(dx) && ydx.same_bits(dx), "in place (y = x; dx = dy; dx = y): same bits");
}

static void softmax_cases() {
    run_case("softmax rows=5 C=1 f32", [] { case_softmax(5, 1, KILN_F32, 2); });
    run_case("softmax rows=3 C=7 bf16", [] { case_softmax(3, 7, KILN_BF16, 1); });
    run_case("softmax rows=4 C=300 f32", [] { case_softmax(4, 300, KILN_F32, 3); });
    run_case("softmax rows=6 C=513 bf16", [] { case_softmax(6, 513, KILN_BF16, 4); });
    run_case("softmax rows=3 C=1000 f32", [] { case_softmax(3, 1000, KILN_F32, 1); });
    run_case("softmax rows=0 C=9 (nothing to do)", [] { case_softmax(0, 9, KILN_F32, 1); });
}

// ---- sumsq ----

static long long sumsq_parts_of(long long n) { return std::min(std::max((n + 2047) / 2048, 1LL), 1024LL); }

static void case_sumsq(long long n, int dt, unsigned other_grid) {
    Tensor x = random_tensor(dt, (size_t)n, -2, 2);
    const long long parts = sumsq_parts_of(n);
    double want = 0;
    for (long long i = 0; i < n; i++) want += x.get((size_t)i) * x.get((size_t)i);
    const double chain = (double)((n / parts + 1 + 255) / 256) + (double)((parts + 255) / 256);
    Tensor partial = poison(KILN_F32, (size_t)parts), out = poison(KILN_F32, 1);
    Tensor partial2 = poison(KILN_F32, (size_t)parts), out2 = poison(KILN_F32, 1);
    launch(parts, KILN_BLOCK, [&] { kiln_sumsq(x.p(), (float *)partial.p(), n, dt); });
    launch(1, KILN_BLOCK, [&] { kiln_sumsq_final((const float *)partial.p(), (float *)out.p(), parts); });
    expect_close(str("sum of squares (%lld parts)", parts).c_str(), out, DV{want}, DV{(chain + 24) * U * want});
    launch(other_grid, KILN_BLOCK, [&] { kiln_sumsq(x.p(), (float *)partial2.p(), n, dt); });
    launch(1, KILN_BLOCK, [&] { kiln_sumsq_final((const float *)partial2.p(), (float *)out2.p(), parts); });
    tap(partial2.same_bits(partial) && out2.same_bits(out), "grid %u: same partials and sum", other_grid);
}

static void sumsq_cases() {
    struct Q { long long n; int dt; unsigned grid; };
    for (Q q : {Q{0, KILN_F32, 1}, Q{1, KILN_BF16, 1}, Q{5, KILN_F32, 1}, Q{2047, KILN_BF16, 1}, Q{2049, KILN_F32, 1},
                Q{10000, KILN_BF16, 2}, Q{40000, KILN_F32, 3}, Q{1024 * 2048 + 777, KILN_BF16, 300}})
        run_case(str("sumsq n=%lld %s", q.n, dtname(q.dt)), [&] { case_sumsq(q.n, q.dt, q.grid); });
}

// ---- clipscale, lr_cosine ----

static void case_clipscale() {
    const double maxes[] = {1.0, 0.5, 0.0, -1.0};
    const float norms[] = {0.0f, 0.25f, 0.999999f, 1.0f, 2.0f, 3e6f, INFINITY, NAN};
    int bad = 0, total = 0;
    std::string first;
    for (double mx : maxes)
        for (float nm : norms) {
            // ops.def: min(1, max/(norm+1e-6)); max <= 0 disables (1); a NaN norm stays NaN
            double s = mx / ((double)nm + 1e-6);
            float want = mx <= 0 ? 1.0f : std::isnan(s) ? NAN : (float)std::min(1.0, s);
            Tensor norm(KILN_F32, 1), out = poison(KILN_F32, 1);
            norm.set(0, nm);
            emu_launch(dim3(1), dim3(1), 0, [&] { kiln_clipscale((const float *)norm.p(), (float *)out.p(), mx); });
            float got = (float)out.get(0);
            bool same = std::isnan(want) ? std::isnan(got) : got == want;
            total++;
            if (!same && !bad++) first = str(" (first: max %g, norm %g: got %.9g, want %.9g)", mx, (double)nm, got, want);
        }
    tap(bad == 0, "%d of %d (max, norm) pairs differ from ops.def's formula%s", bad, total, first.c_str());
}

static void case_lr_cosine() {
    struct Sch { double lr, min_lr, warmup, total; };
    const Sch schs[] = {{6e-4, 6e-5, 10, 100}, {1e-3, 0, 0, 50}, {3e-4, 1e-5, 20, 20}, {1e-3, 1e-4, 30, 10}};
    const float ts[] = {0, 1, 5, 10, 11, 20, 21, 37.5f, 50, 99, 100, 150};
    int bad = 0, total = 0;
    std::string first;
    double worst_ulps = 0;
    for (const Sch &s : schs)
        for (float t : ts) {
            // ops.def: t <= warmup: lr*t/warmup; else min_lr + 0.5(1+cos(pi p))(lr-min_lr),
            // p = clamp((t-warmup)/(total-warmup), 0, 1) (total <= warmup: p = 1, the end)
            double want;
            if (s.warmup > 0 && t <= s.warmup) {
                want = s.lr * t / s.warmup;
            } else {
                double p = s.total > s.warmup ? std::min(1.0, std::max(0.0, (t - s.warmup) / (s.total - s.warmup))) : 1.0;
                want = s.min_lr + 0.5 * (1 + cos(M_PI * p)) * (s.lr - s.min_lr);
            }
            Tensor tt(KILN_F32, 1), out = poison(KILN_F32, 1);
            tt.set(0, t);
            const double sched[4] = {s.lr, s.min_lr, s.warmup, s.total};
            emu_launch(dim3(1), dim3(1), 0, [&] { kiln_lr_cosine((const float *)tt.p(), (float *)out.p(), sched); });
            float w = (float)want, got = (float)out.get(0);
            float aw = std::fabs(w), ulp = std::nextafter(aw, INFINITY) - aw;
            double ulps = std::fabs((double)got - w) / ulp;
            worst_ulps = std::max(worst_ulps, std::isnan(got) ? INFINITY : ulps);
            total++;
            if (!(ulps <= 1) && !bad++) first = str(" (first: t %g, lr %g, warmup %g, total %g: got %.9g, want %.9g)", t, s.lr, s.warmup, s.total, got, w);
        }
    tap(bad == 0, "%d of %d (schedule, t) pairs more than 1 f32 ulp from ops.def's formula (worst %.2f ulp)%s", bad, total, worst_ulps, first.c_str());
}

// ---- fill, iota, iota_rank ----

static void case_fill(int dt, double value, long long n, unsigned other_grid) {
    double want_v;
    if (dt == KILN_I32) want_v = std::isnan(value) ? 0 : std::min(2147483647.0, std::max(-2147483648.0, trunc(value)));
    else want_v = dt == KILN_BF16 ? bf16_of((float)value) : (double)(float)value;
    Tensor y = poison(dt, (size_t)n), y2 = poison(dt, (size_t)n);
    launch(n ? elems(n) : 1, KILN_BLOCK, [&] { kiln_fill(y.p(), n, value, dt); });
    expect_equal(str("%lld x %s(%g) = %.9g", n, dtname(dt), value, want_v).c_str(), y, DV((size_t)n, want_v));
    launch(other_grid, KILN_BLOCK, [&] { kiln_fill(y2.p(), n, value, dt); });
    tap(y2.same_bits(y), "grid %u: same bits", other_grid);
}

static void case_iota(long long n) {
    Tensor y = poison(KILN_I32, (size_t)n), y2 = poison(KILN_I32, (size_t)n);
    DV want((size_t)n);
    for (long long i = 0; i < n; i++) want[(size_t)i] = (double)i;
    launch(n ? elems(n) : 1, KILN_BLOCK, [&] { kiln_iota((int *)y.p(), n); });
    expect_equal("0, 1, ..., n-1", y, want);
    launch(1, KILN_BLOCK, [&] { kiln_iota((int *)y2.p(), n); });
    tap(y2.same_bits(y), "grid 1: same bits");
}

// kiln_rt.h rtk_iota_rank, from its comment: rank r's piece of p tokens
static void rank_piece(DV &out, long long at, long long p, long long r, long long s, int dual) {
    for (long long k = 0; k < p; k++) {
        long long c = p / 2;
        out[(size_t)(at + k)] = !dual ? (double)(r * p + k) : k < c ? (double)(r * c + k) : (double)((2 * s - 1 - r) * c + (k - c));
    }
}

static void case_iota_rank(long long piece, long long s) {
    int bad = 0, total = 0;
    std::string first;
    for (int all = 0; all <= 1; all++)
        for (int dual = 0; dual <= 1; dual++)
            for (long long i = 0; i < s; i++) {
                long long n = all ? s * piece : piece;
                DV want((size_t)n);
                if (all)
                    for (long long j = 0; j < s; j++) rank_piece(want, j * piece, piece, j, s, dual);
                else
                    rank_piece(want, 0, piece, i, s, dual);
                Tensor y = poison(KILN_I32, (size_t)n);
                launch(elems(n), KILN_BLOCK, [&] { kiln_iota_rank((int *)y.p(), n, i, s, dual, all); });
                long long wrong = 0;
                for (long long k = 0; k < n; k++) wrong += y.get((size_t)k) != want[(size_t)k];
                total++;
                if (wrong && !bad++) first = str(" (first: all %d dual %d i %lld: %lld of %lld wrong)", all, dual, i, wrong, n);
            }
    tap(bad == 0, "%d of %d (all, dual, i) layouts differ from kiln_rt.h's%s", bad, total, first.c_str());
}

static void scalar_cases() {
    run_case("clipscale", case_clipscale);
    run_case("lr_cosine", case_lr_cosine);
}

static void fill_cases() {
    run_case("fill f32 0.1, 1000 elements", [] { case_fill(KILN_F32, 0.1, 1000, 1); });
    run_case("fill bf16 0.1 (rounded through f32), 777 elements", [] { case_fill(KILN_BF16, 0.1, 777, 2); });
    run_case("fill bf16 -3.0078125 (a tie: down to even)", [] { case_fill(KILN_BF16, -3.0078125, 9, 1); });
    run_case("fill bf16 -3.0234375 (a tie: up to even)", [] { case_fill(KILN_BF16, -3.0234375, 9, 1); });
    run_case("fill i32 -3.7 (truncated)", [] { case_fill(KILN_I32, -3.7, 300, 1); });
    run_case("fill i32 1e10 (clamped)", [] { case_fill(KILN_I32, 1e10, 5, 1); });
    run_case("fill i32 -1e10 (clamped)", [] { case_fill(KILN_I32, -1e10, 5, 1); });
    run_case("fill i32 NaN (0)", [] { case_fill(KILN_I32, NAN, 5, 1); });
    run_case("fill f32 n = 0", [] { case_fill(KILN_F32, 1.0, 0, 1); });
}

static void iota_cases() {
    for (long long n : {0LL, 1LL, 777LL}) run_case(str("iota n=%lld", n), [&] { case_iota(n); });
    for (long long s : {1LL, 2LL, 3LL, 4LL}) run_case(str("iota_rank piece 10, %lld ranks", s), [&] { case_iota_rank(10, s); });
    run_case("iota_rank piece 300, 2 ranks (2 blocks)", [] { case_iota_rank(300, 2); });
}

// ---- attn_merge ----

// rows 0..5 are special: a -inf, b -inf, both -inf, equal, a far above b, large lse
static void case_attn_merge(long long rows, long long D, int dt, unsigned other_grid) {
    const size_t n = (size_t)(rows * D);
    Tensor oa = random_tensor(dt, n, -1, 1), ob = random_tensor(dt, n, -1, 1);
    Tensor la = random_tensor(KILN_F32, (size_t)rows, -5, 5), lb = random_tensor(KILN_F32, (size_t)rows, -5, 5);
    const double special[6][2] = {{-INFINITY, 1.5}, {0.25, -INFINITY}, {-INFINITY, -INFINITY}, {2.0, 2.0}, {60.0, -40.0}, {1000.0, 1001.0}};
    for (long long r = 0; r < std::min(rows, 6LL); r++) la.set((size_t)r, special[r][0]), lb.set((size_t)r, special[r][1]);
    DV o_want(n), o_tol(n), l_want((size_t)rows), l_tol((size_t)rows);
    for (long long r = 0; r < rows; r++) {
        double a = la.get((size_t)r), b = lb.get((size_t)r), m = std::max(a, b);
        double L = std::isinf(m) && m < 0 ? -INFINITY : m + log(exp(a - m) + exp(b - m));
        double wa = std::isinf(a) ? 0 : exp(a - L), wb = std::isinf(b) ? 0 : exp(b - L);
        double scale = (std::isinf(a) ? 0 : fabs(a)) + (std::isinf(b) ? 0 : fabs(b)) + (std::isinf(L) ? 0 : 2 * fabs(L)) + 8;
        l_want[(size_t)r] = L;
        l_tol[(size_t)r] = 8 * U * (1 + (std::isinf(L) ? 0 : fabs(L)));
        for (long long d = 0; d < D; d++) {
            size_t i = (size_t)(r * D + d);
            double va = oa.get(i), vb = ob.get(i);
            o_want[i] = wa * va + wb * vb;
            o_tol[i] = r_out(dt) * fabs(o_want[i]) + scale * U * (fabs(wa * va) + fabs(wb * vb));
        }
    }
    const unsigned grid = (unsigned)std::min((rows + 7) / 8, 65535LL);
    Tensor o = poison(dt, n), lse = poison(KILN_F32, (size_t)rows), o2 = poison(dt, n), lse2 = poison(KILN_F32, (size_t)rows);
    auto run = [&](Tensor &xa, Tensor &ya, Tensor &xb, Tensor &yb, Tensor &out, Tensor &l, unsigned g) {
        launch(g, KILN_BLOCK, [&] { kiln_attn_merge(xa.p(), (const float *)ya.p(), xb.p(), (const float *)yb.p(), out.p(), (float *)l.p(), rows, D, dt); });
    };
    run(oa, la, ob, lb, o, lse, grid);
    expect_close("o", o, o_want, o_tol);
    expect_close("lse", lse, l_want, l_tol);
    if (rows > 2) {
        bool zero = true;
        for (long long d = 0; d < D; d++) zero &= o.get((size_t)(2 * D + d)) == 0;
        tap(zero && std::isinf(lse.get(2)) && lse.get(2) < 0, "both parts -inf: o exactly 0, lse -inf (never NaN)");
    }
    run(oa, la, ob, lb, o2, lse2, other_grid);
    tap(o2.same_bits(o) && lse2.same_bits(lse), "grid %u: same bits as grid %u", other_grid, grid);
    Tensor oa_in = oa, la_in = la, ob_in = ob, lb_in = lb;  // o = o_a, lse = lse_a; then o = o_b, lse = lse_b
    run(oa_in, la_in, ob, lb, oa_in, la_in, grid);
    run(oa, la, ob_in, lb_in, ob_in, lb_in, grid);
    tap(oa_in.same_bits(o) && la_in.same_bits(lse) && ob_in.same_bits(o) && lb_in.same_bits(lse),
        "in place (o = o_a, lse = lse_a; o = o_b, lse = lse_b): same bits");
}

static void attn_merge_cases() {
    run_case("attn_merge rows=20 D=64 bf16", [] { case_attn_merge(20, 64, KILN_BF16, 1); });
    run_case("attn_merge rows=9 D=33 f32", [] { case_attn_merge(9, 33, KILN_F32, 1); });
    run_case("attn_merge rows=6 D=1 f32", [] { case_attn_merge(6, 1, KILN_F32, 1); });
    run_case("attn_merge rows=70 D=100 bf16 (9 blocks)", [] { case_attn_merge(70, 100, KILN_BF16, 2); });
}

int main(int argc, char **argv) {
    setvbuf(stdout, nullptr, _IOLBF, 0);
    auto wanted = [&](const char *family) {
        if (argc < 2) return true;
        for (int i = 1; i < argc; i++)
            if (strcmp(argv[i], family) == 0) return true;
        return false;
    };
    if (wanted("copy")) copy_cases();
    if (wanted("sumto")) sumto_cases(), sumto_rows_cases();
    if (wanted("reduce")) reduce_cases();
    if (wanted("softmax")) softmax_cases();
    if (wanted("sumsq")) sumsq_cases();
    if (wanted("scalars")) scalar_cases();
    if (wanted("fill")) fill_cases();
    if (wanted("iota")) iota_cases();
    if (wanted("attn_merge")) attn_merge_cases();
    printf("1..%d\n", tap_count);
    return tap_failures != 0;
}
