/* bench/copy_nt.c — an offload's copy on the CPU: memcpy against
 * non-temporal stores (runtime/cpu/dev_cpu.c copy_out, the same loop), a
 * hot source of N bytes (rewritten before each copy, as a forward
 * produces it) into a destination that walks a 256 MiB ring (cold, as the
 * host space is), each copy followed by a read of a 1 MiB working set (the
 * compute's next kernel).  Prints GB/s of the copies alone and the whole
 * loop's ms, memcpy vs stream, 20 x 64 copies each, interleaved.
 *   cc -O2 -o /tmp/copy_nt bench/copy_nt.c && /tmp/copy_nt
 * `copy_nt K W`: the round trip, K MiB offloaded, W MiB of other data read,
 * the K MiB reloaded (memcpy) and read: does a non-temporal offload cost
 * its reload more than it saves (a reload from L3 turned into one from
 * DRAM)?  e.g. for K in 8 20; do for W in 0 8 32; do /tmp/copy_nt $K $W; done; done
 * One thread: on a loaded machine compare the two columns of one run. */
#include <emmintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static void copy_out(char *d, const char *s, size_t n) {
    size_t head = (16 - ((uintptr_t)d & 15)) & 15;
    memcpy(d, s, head); d += head, s += head, n -= head;
    size_t m = n & ~(size_t)63;
    for (size_t i = 0; i < m; i += 64) {
        __m128i x0 = _mm_loadu_si128((const __m128i *)(s + i)), x1 = _mm_loadu_si128((const __m128i *)(s + i + 16));
        __m128i x2 = _mm_loadu_si128((const __m128i *)(s + i + 32)), x3 = _mm_loadu_si128((const __m128i *)(s + i + 48));
        _mm_stream_si128((__m128i *)(d + i), x0); _mm_stream_si128((__m128i *)(d + i + 16), x1);
        _mm_stream_si128((__m128i *)(d + i + 32), x2); _mm_stream_si128((__m128i *)(d + i + 48), x3);
    }
    _mm_sfence();
    memcpy(d + m, s + m, n - m);
}
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static int one_way(void) {
    size_t ring = 256u << 20;
    char *dst = aligned_alloc(4096, ring), *src = aligned_alloc(4096, 8u << 20), *work = aligned_alloc(4096, 1u << 20);
    memset(dst, 1, ring); memset(src, 2, 8u << 20); memset(work, 3, 1u << 20);
    size_t sizes[] = {256 << 10, 1 << 20, 2 << 20};
    for (int si = 0; si < 3; si++) {
        size_t n = sizes[si];
        double t[2] = {0, 0}, tw[2] = {0, 0};
        for (int rep = 0; rep < 20; rep++)
            for (int k = 0; k < 2; k++) {
                size_t off = 0;
                double a = now(), w = 0;
                for (int it = 0; it < 64; it++) {
                    memset(src, it, n); /* hot source, as produced by the forward */
                    double b = now();
                    if (k) copy_out(dst + off, src, n); else memcpy(dst + off, src, n);
                    w += now() - b;
                    off = (off + n) % (ring - n);
                    /* the compute's working set after the copy */
                    volatile long acc = 0; for (size_t j = 0; j < (1u << 20); j += 64) acc += work[j];
                }
                t[k] += now() - a; tw[k] += w;
            }
        printf("%7zu KiB: memcpy %.2f GB/s, stream %.2f GB/s (copy alone); loop incl. producer+reader %.1f vs %.1f ms\n",
               n >> 10, 20.0 * 64 * n / tw[0] / 1e9, 20.0 * 64 * n / tw[1] / 1e9, t[0] * 1e3, t[1] * 1e3);
    }
    return 0;
}

/* `copy_nt K W`: K MiB offloaded in 1 MiB copies (hot source), W MiB of other
 * data read, then the K MiB reloaded by memcpy and read: out and back ms. */
static int round_trip(int K, size_t W) {
    size_t n = 1 << 20;
    char *act = aligned_alloc(4096, n * K), *host = aligned_alloc(4096, n * K), *dst = aligned_alloc(4096, n), *w = aligned_alloc(4096, W + 4096);
    memset(act, 1, n * K); memset(host, 2, n * K); memset(dst, 3, n); memset(w, 4, W + 4096);
    double t[2][2] = {{0}};
    for (int rep = 0; rep < 30; rep++)
        for (int k = 0; k < 2; k++) {
            for (int i = 0; i < K; i++) memset(act + i * n, rep, n); /* produce (hot) */
            double a = now();
            for (int i = 0; i < K; i++) if (k) copy_out(host + i * n, act + i * n, n); else memcpy(host + i * n, act + i * n, n);
            double b = now();
            volatile long acc = 0; for (size_t j = 0; j < W; j += 64) acc += w[j]; /* other work between */
            double c = now();
            for (int i = 0; i < K; i++) { memcpy(dst, host + i * n, n); acc += dst[i]; } /* reload + read */
            double d = now();
            t[k][0] += b - a; t[k][1] += d - c;
        }
    printf("K=%d MiB offloaded, %zu MiB between: memcpy out %.1f + back %.1f = %.1f ms; NT out %.1f + back %.1f = %.1f ms\n", K, W >> 20,
           t[0][0] * 1e3 / 30, t[0][1] * 1e3 / 30, (t[0][0] + t[0][1]) * 1e3 / 30, t[1][0] * 1e3 / 30, t[1][1] * 1e3 / 30, (t[1][0] + t[1][1]) * 1e3 / 30);
    return 0;
}

int main(int argc, char **argv) { return argc == 3 ? round_trip(atoi(argv[1]), (size_t)atoi(argv[2]) << 20) : one_way(); }
