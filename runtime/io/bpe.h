/* bpe.h — GPT-2's byte-level BPE tokenizer (encoder.json + vocab.bpe).
 *
 * Encoding is GPT-2's encoder.py: the text is cut into pre-tokens by the
 * regex  's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * (matched by hand over UTF-8, see bpe.c for the Unicode classes), each
 * pre-token's bytes are merged by rank (the order of vocab.bpe) and looked
 * up in encoder.json.  Tokens here are raw byte strings: the files' byte-to-
 * unicode mapping is undone at load, so decoding is concatenating
 * bpe_token() bytes and any text round-trips exactly.
 */
#ifndef KILN_BPE_H
#define KILN_BPE_H
#include <stddef.h>
#include <stdint.h>

typedef struct Bpe Bpe;

/* Load encoder.json and vocab.bpe.  NULL with a one-line "FILE: problem" in
 * err on failure.  Ids must be < 65536 (GPT-2: 0..50256). */
Bpe *bpe_load(const char *encoder_json, const char *vocab_bpe, char *err, int errlen);
void bpe_free(Bpe *b);
/* The vocabulary size: largest id + 1 (50257 for GPT-2). */
uint32_t bpe_vocab(const Bpe *b);
/* Append the ids of text[0..n) to *ids (grown with realloc; *nids tokens
 * used of *cap).  0, or -1 when out of memory. */
int bpe_encode(Bpe *b, const char *text, size_t n, uint32_t **ids, size_t *nids, size_t *cap);
/* The bytes of token `id` (*len of them), or NULL for an unknown id. */
const char *bpe_token(const Bpe *b, uint32_t id, size_t *len);

/* The pre-tokenizer: the end of the pre-token that starts at text[i] (i < n). */
size_t bpe_pretoken_end(const char *text, size_t n, size_t i);
/* The largest cut p (0 < p <= n) such that encoding text[0..p) and text[p..)
 * separately gives the ids of the whole, whatever follows text[n]; 0 if
 * there is none.  (A cut after a lone '\n' that follows a non-space and
 * precedes a non-space.)  Lets a caller encode a stream chunk by chunk. */
size_t bpe_safe_cut(const char *text, size_t n);
#endif
