// check_mma.cpp — the emulator's tensor-core instructions (emu.h, "tensor
// cores"; kernels/cuda/mma.cuh's kiln_mma_bf16 and kiln_ldmatrix_*) against
// plain matrix products in double, run by tests/t_cuda_emu.sh (which also
// plants a fragment-index bug in a copy of emu.h and sees this fail).
//
// The kernels here are warp-level CUDA C as a GPU kernel would be written,
// run with one warp (block 32):
//   - ldm:  A 16x16 (row major) by ldmatrix.x4, B as Bt [8 n][16 k] by
//           ldmatrix.x2, C by hand: D = A B + C;
//   - hand: every fragment built from global memory by the PTX ISA's
//           formulas (no ldmatrix): checks mma.sync alone;
//   - trans: B [16 k][16 n] row major, two n-tiles by ldmatrix.x4.trans
//           (and one by .x2.trans): the P V form of attention;
//   - raw:  ldmatrix alone, every lane's registers against the documented
//           element (value = index), .x4 and .x4.trans;
//   - errors: an unaligned row, a row in global memory, half a warp at
//           the instruction, a block of 16 threads: EmuError each.
// Tolerance: the emulator sums in double and rounds once, so |d - ref| <=
// 2^-23 (sum |a b| + |c|) (half an f32 ulp of the largest partial sum, with
// room); bf16 inputs are exact in both.
#include "emu.h"

#include "mma.cuh"

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

typedef __nv_bfloat16 bf;

static int tap_n, tap_failed;
static void tap(bool ok, const std::string &what) {
    tap_n++;
    tap_failed += !ok;
    printf("%s %d - %s\n", ok ? "ok" : "not ok", tap_n, what.c_str());
}

static uint64_t rs = 0x2545F4914F6CDD1Dull;
static double urand() { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return (rs >> 11) * (1.0 / 9007199254740992.0); }
static std::vector<bf> rbf(size_t n) { std::vector<bf> v(n); for (auto &x : v) x = __float2bfloat16_rn((float)(4 * urand() - 2)); return v; }
static double f(bf x) { return __bfloat162float(x); }

enum { LD = 24 }; // shared-memory row stride in elements (48 bytes: rows stay 16-byte aligned)

// ---- kernels ----

// D[16][8] = A[16][16] Bt^T + C with ldmatrix: x4 for A, x2 for Bt [8][16]
static void k_ldm(const bf *A, const bf *Bt, const float *C, float *D) {
    bf *as = (bf *)kiln_smem, *bs = as + 16 * LD;
    const unsigned lane = threadIdx.x, g = lane >> 2, t = lane & 3;
    for (unsigned e = lane; e < 256; e += 32) as[e / 16 * LD + e % 16] = A[e];
    for (unsigned e = lane; e < 128; e += 32) bs[e / 16 * LD + e % 16] = Bt[e];
    __syncwarp();
    unsigned a[4], b[2];
    kiln_ldmatrix_x4(a, as + ((lane & 7) + 8 * ((lane >> 3) & 1)) * LD + 8 * (lane >> 4));
    kiln_ldmatrix_x2(b, bs + (lane & 7) * LD + 8 * ((lane >> 3) & 1));
    float c[4] = {C[g * 8 + 2 * t], C[g * 8 + 2 * t + 1], C[(g + 8) * 8 + 2 * t], C[(g + 8) * 8 + 2 * t + 1]}, d[4];
    kiln_mma_bf16(d, a, b, c);
    D[g * 8 + 2 * t] = d[0], D[g * 8 + 2 * t + 1] = d[1], D[(g + 8) * 8 + 2 * t] = d[2], D[(g + 8) * 8 + 2 * t + 1] = d[3];
}

static unsigned pack(bf lo, bf hi) { return (unsigned)lo.bits | (unsigned)hi.bits << 16; }

// the same product with the fragments built by hand from A [16][16], B [16 k][8 n]
static void k_hand(const bf *A, const bf *B, const float *C, float *D) {
    const unsigned lane = threadIdx.x, g = lane >> 2, t = lane & 3;
    unsigned a[4] = {pack(A[g * 16 + 2 * t], A[g * 16 + 2 * t + 1]), pack(A[(g + 8) * 16 + 2 * t], A[(g + 8) * 16 + 2 * t + 1]),
                     pack(A[g * 16 + 2 * t + 8], A[g * 16 + 2 * t + 9]),
                     pack(A[(g + 8) * 16 + 2 * t + 8], A[(g + 8) * 16 + 2 * t + 9])};
    unsigned b[2] = {pack(B[(2 * t) * 8 + g], B[(2 * t + 1) * 8 + g]), pack(B[(2 * t + 8) * 8 + g], B[(2 * t + 9) * 8 + g])};
    float c[4] = {C[g * 8 + 2 * t], C[g * 8 + 2 * t + 1], C[(g + 8) * 8 + 2 * t], C[(g + 8) * 8 + 2 * t + 1]}, d[4];
    kiln_mma_bf16(d, a, b, c);
    D[g * 8 + 2 * t] = d[0], D[g * 8 + 2 * t + 1] = d[1], D[(g + 8) * 8 + 2 * t] = d[2], D[(g + 8) * 8 + 2 * t + 1] = d[3];
}

// D [16][16] = A [16][16] B [16 k][16 n] (C = 0): B's two n-tiles by x4.trans
// (x2 = true: one x2.trans per n-tile instead)
static void k_trans(const bf *A, const bf *B, float *D, bool x2) {
    bf *as = (bf *)kiln_smem, *bs = as + 16 * LD;
    const unsigned lane = threadIdx.x, g = lane >> 2, t = lane & 3;
    for (unsigned e = lane; e < 256; e += 32) as[e / 16 * LD + e % 16] = A[e], bs[e / 16 * LD + e % 16] = B[e];
    __syncwarp();
    unsigned a[4], b[4];
    kiln_ldmatrix_x4(a, as + ((lane & 7) + 8 * ((lane >> 3) & 1)) * LD + 8 * (lane >> 4));
    if (x2) {
        kiln_ldmatrix_x2_trans(b, bs + ((lane & 7) + 8 * ((lane >> 3) & 1)) * LD);
        kiln_ldmatrix_x2_trans(b + 2, bs + ((lane & 7) + 8 * ((lane >> 3) & 1)) * LD + 8);
    } else {
        kiln_ldmatrix_x4_trans(b, bs + ((lane & 7) + 8 * ((lane >> 3) & 1)) * LD + 8 * (lane >> 4));
    }
    for (int n = 0; n < 2; n++) {
        float c[4] = {0, 0, 0, 0}, d[4];
        kiln_mma_bf16(d, a, b + 2 * n, c);
        D[g * 16 + 8 * n + 2 * t] = d[0], D[g * 16 + 8 * n + 2 * t + 1] = d[1];
        D[(g + 8) * 16 + 8 * n + 2 * t] = d[2], D[(g + 8) * 16 + 8 * n + 2 * t + 1] = d[3];
    }
}

// ldmatrix alone: four 8x8 matrices of M [32][8] (element = its index), x4
// and x4.trans; out [32 lanes][8]: r[0..3] then the .trans r[0..3]
static void k_raw(const bf *M, unsigned *out) {
    bf *ms = (bf *)kiln_smem;
    const unsigned lane = threadIdx.x;
    for (unsigned e = lane; e < 256; e += 32) ms[e / 8 * LD + e % 8] = M[e];
    __syncwarp();
    unsigned r[4], rt[4];
    kiln_ldmatrix_x4(r, ms + lane * LD);
    kiln_ldmatrix_x4_trans(rt, ms + lane * LD);
    for (int i = 0; i < 4; i++) out[lane * 8 + i] = r[i], out[lane * 8 + 4 + i] = rt[i];
}

// ---- checks ----

static double worst_rel(const float *D, const std::vector<double> &ref, const std::vector<double> &mag, size_t n) {
    double w = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)D[i] - ref[i]) / (mag[i] * 0x1p-23 + 1e-30);
        if (!(e <= w)) w = e; // NaN sticks
    }
    return w;
}

static bool run(unsigned threads, size_t smem, const std::function<void()> &body, std::string *err) {
    try {
        emu_launch(dim3(1), dim3(threads), smem, body);
    } catch (const EmuError &e) {
        if (err) *err = e.what();
        return false;
    }
    return true;
}

static void check_products() {
    for (int rep = 0; rep < 3; rep++) {
        std::vector<bf> A = rbf(256), B = rbf(128), Bt(128);
        std::vector<float> C(128), D(128, NAN), D2(128, NAN);
        for (auto &c : C) c = (float)(2 * urand() - 1);
        for (int k = 0; k < 16; k++)
            for (int n = 0; n < 8; n++) Bt[n * 16 + k] = B[k * 8 + n];
        std::vector<double> ref(128), mag(128);
        for (int m = 0; m < 16; m++)
            for (int n = 0; n < 8; n++) {
                double s = C[m * 8 + n], a = fabs(s);
                for (int k = 0; k < 16; k++) s += f(A[m * 16 + k]) * f(B[k * 8 + n]), a += fabs(f(A[m * 16 + k]) * f(B[k * 8 + n]));
                ref[m * 8 + n] = s, mag[m * 8 + n] = a;
            }
        std::string e1, e2;
        bool r1 = run(32, 2 * 24 * LD * 2, [&] { k_ldm(A.data(), Bt.data(), C.data(), D.data()); }, &e1);
        bool r2 = run(32, 0, [&] { k_hand(A.data(), B.data(), C.data(), D2.data()); }, &e2);
        double w1 = worst_rel(D.data(), ref, mag, 128), w2 = worst_rel(D2.data(), ref, mag, 128);
        char buf[200];
        snprintf(buf, sizeof buf, "mma 16x8x16 bf16, fragments by ldmatrix x4/x2 (case %d): worst %.2f of tolerance%s", rep, w1,
                 r1 ? "" : (" " + e1).c_str());
        tap(r1 && w1 <= 1, buf);
        snprintf(buf, sizeof buf, "mma 16x8x16 bf16, fragments by hand from the PTX layouts (case %d): worst %.2f of tolerance%s",
                 rep, w2, r2 ? "" : (" " + e2).c_str());
        tap(r2 && w2 <= 1, buf);
    }
    for (int x2 = 0; x2 < 2; x2++) {
        std::vector<bf> A = rbf(256), B = rbf(256);
        std::vector<float> D(256, NAN);
        std::vector<double> ref(256), mag(256);
        for (int m = 0; m < 16; m++)
            for (int n = 0; n < 16; n++) {
                double s = 0, a = 0;
                for (int k = 0; k < 16; k++) s += f(A[m * 16 + k]) * f(B[k * 16 + n]), a += fabs(f(A[m * 16 + k]) * f(B[k * 16 + n]));
                ref[m * 16 + n] = s, mag[m * 16 + n] = a;
            }
        std::string e;
        bool r = run(32, 2 * 16 * LD * 2, [&] { k_trans(A.data(), B.data(), D.data(), x2); }, &e);
        double w = worst_rel(D.data(), ref, mag, 256);
        char buf[200];
        snprintf(buf, sizeof buf, "mma with B [k][n] row major by ldmatrix %s.trans (two n-tiles): worst %.2f of tolerance%s",
                 x2 ? "x2" : "x4", w, r ? "" : (" " + e).c_str());
        tap(r && w <= 1, buf);
    }
}

static void check_raw() {
    std::vector<bf> M(256);
    for (int i = 0; i < 256; i++) M[i] = __float2bfloat16_rn((float)i); // exact: integers < 256
    std::vector<unsigned> out(256, 0xdeadbeefu);
    std::string e;
    bool r = run(32, 32 * LD * 2, [&] { k_raw(M.data(), out.data()); }, &e);
    int bad = 0, badt = 0;
    for (int l = 0; l < 32; l++) {
        int g = l >> 2, t = l & 3;
        for (int i = 0; i < 4; i++) {
            // matrix i = rows 8i..8i+7 of M; element (row, col) = (8i + row) * 8 + col
            int lo = (8 * i + g) * 8 + 2 * t, hi = lo + 1;
            int tlo = (8 * i + 2 * t) * 8 + g, thi = (8 * i + 2 * t + 1) * 8 + g;
            unsigned w = out[l * 8 + i], wt = out[l * 8 + 4 + i];
            bad += __bfloat162float(__nv_bfloat16{(uint16_t)(w & 0xffff)}) != lo || __bfloat162float(__nv_bfloat16{(uint16_t)(w >> 16)}) != hi;
            badt += __bfloat162float(__nv_bfloat16{(uint16_t)(wt & 0xffff)}) != tlo ||
                    __bfloat162float(__nv_bfloat16{(uint16_t)(wt >> 16)}) != thi;
        }
    }
    tap(r && bad == 0, "ldmatrix x4: every lane's registers hold M_i[g][2t], M_i[g][2t+1] (" + std::to_string(bad) + " wrong)" + (r ? "" : " " + e));
    tap(r && badt == 0, "ldmatrix x4.trans: every lane's registers hold M_i[2t][g], M_i[2t+1][g] (" + std::to_string(badt) + " wrong)");
}


static void check_errors() {
    std::vector<bf> M(256);
    std::string e;
    bool r = run(32, 64 * LD, [&] {
        unsigned q[4];
        kiln_ldmatrix_x4(q, (bf *)kiln_smem + threadIdx.x * LD + 1); // 2 bytes off
    }, &e);
    tap(!r && e.find("16-byte aligned") != std::string::npos, "ldmatrix of an unaligned row: EmuError (" + e.substr(0, 90) + ")");
    r = run(32, 0, [&] {
        unsigned q[4];
        kiln_ldmatrix_x4(q, M.data() + (threadIdx.x & 7) * 8 + 0);
    }, &e);
    tap(!r && e.find("shared memory") != std::string::npos, "ldmatrix of a row in global memory: EmuError");
    r = run(32, 0, [&] {
        if (threadIdx.x < 16) {
            unsigned a[4] = {0, 0, 0, 0}, b[2] = {0, 0};
            float c[4] = {0, 0, 0, 0}, d[4];
            kiln_mma_bf16(d, a, b, c);
        }
    }, &e);
    tap(!r, "mma.sync by half a warp: EmuError (" + e.substr(0, 100) + ")");
    r = run(16, 0, [&] {
        unsigned a[4] = {0, 0, 0, 0}, b[2] = {0, 0};
        float c[4] = {0, 0, 0, 0}, d[4];
        kiln_mma_bf16(d, a, b, c);
    }, &e);
    tap(!r && e.find("fewer than 32") != std::string::npos, "mma.sync in a warp of 16 threads: EmuError");
}

int main() {
    check_products();
    check_raw();
    check_errors();
    printf("1..%d\n", tap_n);
    return tap_failed ? 1 : 0;
}
