// check_dropout.cpp — kernels/cuda/dropout.cu (issue 17) on the host emulator
// (emu.h) against runtime/rng.h, the functions the interpreter and the CPU
// kernel draw their masks with: the GPU must drop exactly the elements the
// CPU drops.  Per element the reference is 0 where rng.h drops, else the
// bf16 (nearest even) of the f32 product x * (float)(1/(1-p)), the README's
// math; the comparison is bit for bit.  Cases: F = 300 (more than one
// block's 256 threads), global indices far from 0 (rows 1000, pos 12345),
// a step of 12; the intended grid B*T, a grid of 2 (the grid-stride loop)
// and in place (y = x) give the same bits.  Prints TAP; exits 1 on a failure.
// tests/t_cuda_emu.sh builds it (-Iruntime for rng.h) and plants a bug.

#include "emu.h"

#include "dropout.cu"

#include "rng.h"

#include <cstdio>
#include <vector>

static int tap_count, tap_failures;

static void tap(bool ok, const char *what, long long bad, long long n) {
    printf("%s %d - dropout: %s (%lld of %lld differ)\n", ok ? "ok" : "not ok", ++tap_count, what, bad, n);
    tap_failures += !ok;
}

static uint16_t bf16_bits(float f) {  // nearest even, written out (no NaN here)
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t lo = u >> 16, rest = u & 0xffffu;
    if (rest > 0x8000u || (rest == 0x8000u && (lo & 1u))) lo++;
    return (uint16_t)lo;
}

int main() {
    setvbuf(stdout, nullptr, _IOLBF, 0);
    const long long B = 3, T = 5, F = 300, n = B * T * F, seed = 99, id = 4;
    const double p = 0.3;
    const float step = 12;
    const int rows[B] = {5, 0, 1000}, pos[T] = {0, 3, 7, 100, 12345};
    std::vector<__nv_bfloat16> x(n), y(n), y2(n);
    uint64_t s = 42;
    for (long long i = 0; i < n; i++) {  // xorshift64 values in [-2, 2)
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        x[i].bits = bf16_bits((float)((s >> 11) * 0x1.0p-53 * 4 - 2));
    }
    std::vector<uint16_t> want(n);
    uint64_t key = rng_dropout_key((uint64_t)seed, id, rng_dropout_step(step));
    long long dropped = 0;
    for (long long b = 0; b < B; b++)
        for (long long t = 0; t < T; t++) {
            uint64_t row = rng_dropout_row(key, rows[b], pos[t]);
            for (long long f = 0; f < F; f++) {
                long long i = (b * T + t) * F + f;
                bool keep = rng_dropout_bits(row, f) >= rng_dropout_threshold(p);
                want[i] = keep ? bf16_bits(__bfloat162float(x[i]) * (float)(1 / (1 - p))) : 0;
                dropped += !keep;
            }
        }
    auto differ = [&](const std::vector<__nv_bfloat16> &got) {
        long long bad = 0;
        for (long long i = 0; i < n; i++) bad += got[i].bits != want[i];
        return bad;
    };
    long long bad;
    try {
        emu_launch(dim3((unsigned)(B * T)), dim3(KILN_BLOCK), 0,
                   [&] { kiln_dropout(x.data(), &step, rows, pos, y.data(), B, T, F, p, seed, id); });
        bad = differ(y);
        tap(bad == 0 && dropped > 0 && dropped < n, "grid B*T: the mask and values of runtime/rng.h", bad, n);
        emu_launch(dim3(2), dim3(KILN_BLOCK), 0, [&] { kiln_dropout(x.data(), &step, rows, pos, y2.data(), B, T, F, p, seed, id); });
        bad = differ(y2);
        tap(bad == 0, "grid 2 gives the same bits", bad, n);
        emu_launch(dim3((unsigned)(B * T)), dim3(KILN_BLOCK), 0, [&] { kiln_dropout(x.data(), &step, rows, pos, x.data(), B, T, F, p, seed, id); });
        bad = differ(x);
        tap(bad == 0, "in place gives the same bits", bad, n);
    } catch (const EmuError &e) {
        printf("not ok %d - dropout: %s\n", ++tap_count, e.what());
        tap_failures++;
    }
    printf("1..%d\n", tap_count);
    return tap_failures != 0;
}
