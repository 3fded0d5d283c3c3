/* sample.h — `kiln sample`: generate text from a checkpoint (docs/sample.md). */
#ifndef KILN_SAMPLE_H
#define KILN_SAMPLE_H
#include <stdint.h>

/* kiln sample CHECKPOINT [--model FILE.lua] [--set k=v ...] --prompt TEXT
 *             [--tokens N] [--temperature T] [--top-k K] [--seed S] [--threads N]
 * argv[0] is "sample".  Returns the exit code: 0, or 1 after one line on
 * stderr. */
int kiln_sample_main(int argc, char **argv);

/* One draw: a token id in [0, n) from logits[0..n) — the argmax
 * when temperature is 0 (ties: the lowest id), else a draw from
 * softmax(logits / temperature) over the top_k largest (0: all) with the
 * splitmix64 generator whose state is *rng. */
int sample_token(const float *logits, int n, double temperature, int top_k, uint64_t *rng);
#endif
