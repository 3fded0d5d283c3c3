/* rng.h — the parameter-initialisation generator shared by the interpreter
 * and the runtime, so that both start from bit-identical weights.
 *
 * A parameter's numbers are one stream of normal(0, std) draws keyed by
 * rng_stream(name, seed) = hash(name) ^ seed.  The stream is splitmix64 fed
 * into Box-Muller, both branches used: value 2p is r*cos(a), value 2p+1 is
 * r*sin(a) of pair p.  splitmix64 is a counter (state += golden ratio), so
 * pair p can be computed directly and a long stream filled in parallel.
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

#endif
