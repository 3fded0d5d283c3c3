/* rng.c — splitmix64 + Box-Muller parameter streams (see rng.h). */
#include "rng.h"

#include <math.h>

#define GOLDEN 0x9e3779b97f4a7c15ull

uint64_t rng_splitmix64(uint64_t *s) {
    uint64_t z = (*s += GOLDEN);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t rng_stream(const char *name, uint64_t seed) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a, then one splitmix round */
    for (const char *s = name; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return rng_splitmix64(&h) ^ seed;
}

/* Values 2p and 2p+1 of the stream. */
static void normal_pair(uint64_t stream, int64_t p, double std, double out[2]) {
    uint64_t s = stream + (uint64_t)p * 2 * GOLDEN;
    double u1 = ((rng_splitmix64(&s) >> 11) + 1) * 0x1.0p-53; /* (0,1] */
    double u2 = (rng_splitmix64(&s) >> 11) * 0x1.0p-53;       /* [0,1) */
    double r = sqrt(-2 * log(u1)), a = 2 * M_PI * u2;
    out[0] = std * r * cos(a);
    out[1] = std * r * sin(a);
}

void rng_normal_f64(double *dst, int64_t first, int64_t n, uint64_t stream, double std) {
    double pr[2];
    for (int64_t i = first; i < first + n; i++) {
        if (i == first || i % 2 == 0) normal_pair(stream, i / 2, std, pr);
        dst[i - first] = pr[i % 2];
    }
}

void rng_normal_f32(float *dst, int64_t first, int64_t n, uint64_t stream, double std) {
    double pr[2];
    for (int64_t i = first; i < first + n; i++) {
        if (i == first || i % 2 == 0) normal_pair(stream, i / 2, std, pr);
        dst[i - first] = (float)pr[i % 2];
    }
}
