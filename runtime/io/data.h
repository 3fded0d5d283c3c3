/* data.h — training data for the trainer and for `kiln run --interp`.
 *
 * Today: a text file whose bytes are the tokens (vocabulary 256).  Windows
 * of T+1 tokens are drawn at random offsets from a splitmix64 generator, so
 * the interpreter and the compiled trainer see the same batches for the same
 * seed.  llm.c token shards and globs of files: shards.h, whose sampler draws the
 * same offsets as this one for a text file. */
#ifndef KILN_DATA_H
#define KILN_DATA_H
#include <stddef.h>
#include <stdint.h>

typedef struct {
    unsigned char *bytes;
    size_t n;
} Corpus;

/* 0, or -1 with "--data: ..." in err. */
int data_load_text(Corpus *c, const char *path, char *err, int errlen);
void data_free(Corpus *c);
/* The sampler's generator state for a run seeded with seed. */
uint64_t data_rng(uint64_t seed);
/* The next draw of the sampler's generator (splitmix64). */
uint64_t data_next(uint64_t *s);
/* B windows of T+1 tokens: tok[b,t] = window[t], tgt[b,t] = window[t+1].
 * Needs c->n > T. */
void data_sample_i32(const Corpus *c, int64_t B, int64_t T, uint64_t *rng, int32_t *tok, int32_t *tgt);
#endif
