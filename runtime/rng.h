/* rng.h — the parameter-initialisation generator shared by the interpreter
 * and the runtime, so that both start from bit-identical weights.
 *
 * A parameter's numbers are one stream of normal(0, std) draws keyed by
 * rng_stream(name, seed) = hash(name) ^ seed.  The stream is splitmix64 fed
 * into Box-Muller, both branches used: value 2p is r*cos(a), value 2p+1 is
 * r*sin(a) of pair p.  splitmix64 is a counter (state += golden ratio), so
 * pair p can be computed directly and a long stream filled in parallel.
 *
 * Dropout masks (ops.def dropout, issue 17) come from the same mixer used
 * as a counter-based hash: no state, no sequence, each element's bits a pure
 * function of (seed, the dropout node's id, the step, the element's global
 * sample index, global token position, and index f in the feature dims):
 *     key  = mix(mix(seed + G*(id+1)) ^ step)
 *     row  = mix(key ^ (rows << 32 | pos))          (rows, pos < 2^31)
 *     bits = mix(row + G*(f+1)) >> 32               kept iff bits >= threshold(p)
 * where mix is splitmix64's finaliser and G the golden ratio.  Because the
 * indices are global, any split of the batch (dp, micro-batches) or of the
 * sequence (cp's dual chunks) draws the single device's mask, and backward
 * recomputes the mask instead of saving it.  The interpreter and the CPU
 * kernels call these functions; kernels/cuda/dropout.cu has their twin,
 * bit for bit (tests/test_kernels.c, t_cuda_emu.sh compare them).
 */
#ifndef KILN_RNG_H
#define KILN_RNG_H

#include <stdint.h>

uint64_t rng_splitmix64(uint64_t *state);
/* hash(name) ^ seed: the stream of one parameter */
uint64_t rng_stream(const char *name, uint64_t seed);
/* dst[i] = value first+i of the stream, i < n */
void rng_normal_f64(double *dst, int64_t first, int64_t n, uint64_t stream, double std);
/* the same values rounded to float */
void rng_normal_f32(float *dst, int64_t first, int64_t n, uint64_t stream, double std);

/* ---- dropout masks (issue 17) ---- */
#define RNG_GOLDEN 0x9e3779b97f4a7c15ull

static inline uint64_t rng_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static inline uint64_t rng_dropout_key(uint64_t seed, int64_t id, uint32_t step) {
    return rng_mix64(rng_mix64(seed + RNG_GOLDEN * (uint64_t)(id + 1)) ^ step);
}
static inline uint64_t rng_dropout_row(uint64_t key, int32_t row, int32_t pos) {
    return rng_mix64(key ^ ((uint64_t)(uint32_t)row << 32 | (uint32_t)pos));
}
static inline uint32_t rng_dropout_bits(uint64_t row, int64_t f) {
    return (uint32_t)(rng_mix64(row + RNG_GOLDEN * (uint64_t)(f + 1)) >> 32);
}
/* keep iff bits >= threshold: floor(p * 2^32), p in [0, 1) */
static inline uint32_t rng_dropout_threshold(double p) { return (uint32_t)(p * 4294967296.0); }
/* the step counter (state opt.step, f32) as the hash's step */
static inline uint32_t rng_dropout_step(double step) { return step > 0 ? (uint32_t)(int64_t)step : 0; }

#endif
