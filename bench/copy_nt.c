/* bench/copy_nt.c — an offload's copy on the CPU: memcpy against
 * non-temporal stores (runtime/cpu/dev_cpu.c copy_out, the same loop), a
 * hot source of N bytes (rewritten before each copy, as a forward
 * produces it) into a destination that walks a 256 MiB ring (cold, as the
 * host space is), each copy followed by a read of a 1 MiB working set (the
 * compute's next kernel).  Prints GB/s of the copies alone and the whole
 * loop's ms, memcpy vs stream, 20 x 64 copies each, interleaved.
 *   cc -O2 -o /tmp/copy_nt bench/copy_nt.c && /tmp/copy_nt
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
int main(void) {
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
