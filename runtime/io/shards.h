/* shards.h — token datasets: llm.c token shards and text files, and the
 * deterministic window sampler every trainer rank uses.
 *
 * A shard (llm.c's format) is a 256 x int32 header — magic 20240520,
 * version, token count — followed by the tokens: uint16 (version 1) or
 * uint32 (version 2, for vocabularies over 65536).  A Dataset is the
 * concatenation, in glob order, of one or more files: shards (".bin") or
 * text files, whose bytes are the tokens.  Windows are drawn over the
 * concatenation, so a window may cross from one file into the next, just as
 * it crosses document boundaries inside a shard.
 *
 * Sampling: one generator state (a plain uint64, saved in checkpoints for an
 * exact resume) draws the global batch of world*B window offsets; rank r
 * takes windows [r*B, (r+1)*B).  Every rank advances the generator by the
 * same world*B draws, so the ranks stay in step, and the union of their
 * windows is exactly the one-rank batch of world*B windows.  With world = 1
 * this is data.c's text sampler, draw for draw.
 */
#ifndef KILN_SHARDS_H
#define KILN_SHARDS_H
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define SHARD_MAGIC 20240520
#define SHARD_HEADER_INTS 256
#define SHARD_HEADER_BYTES (SHARD_HEADER_INTS * 4)

typedef struct {
    char *path;
    const unsigned char *tok; /* the tokens, `width` bytes each */
    int width;                /* 1 (text), 2 (version 1), 4 (version 2) */
    size_t n;                 /* tokens in this file */
    size_t start;             /* index of its first token in the dataset */
    void *map;                /* the mmap'ed file, or a malloc'ed text */
    size_t maplen;            /* 0: map is malloc'ed */
} DataFile;

typedef struct {
    DataFile *files;
    int nfiles;
    size_t n; /* tokens in all files */
} Dataset;

/* Open every file matching `pattern` (glob(3), sorted), in order.  vocab > 0:
 * every token must be < vocab (checked at open).  0, or -1 with a one-line
 * "FLAG: FILE: problem" in err (flag names the command-line flag, e.g.
 * "--data"). */
int dataset_open(Dataset *d, const char *pattern, int64_t vocab, const char *flag, char *err, int errlen);
void dataset_close(Dataset *d);
/* Token i of the concatenation (i < d->n). */
uint32_t dataset_token(const Dataset *d, size_t i);
/* Rank `rank` of `world`: B windows of T+1 tokens, tok[b,t] = w[t],
 * tgt[b,t] = w[t+1], from the global batch of world*B windows drawn from
 * *rng.  Needs d->n > T.  The offset of every window is written to off[B]
 * when off is not NULL (tests). */
void dataset_sample(const Dataset *d, int64_t B, int64_t T, int rank, int world, uint64_t *rng, int32_t *tok,
                    int32_t *tgt, size_t *off);

/* Writing one shard: tokens go to "PATH.tmp"; shard_finish writes the
 * count into the header and fsyncs; shard_commit renames it to PATH (and
 * fsyncs the directory); shard_abort removes the temporary file.  Nothing
 * is written to PATH until shard_commit. */
typedef struct {
    char *path, *tmp;
    FILE *f;
    int version;
    uint64_t n;
    char *err;
    int errlen;
} ShardWriter;

/* version: 1 (ids < 65536) or 2.  0 or -1 with err. */
int shard_begin(ShardWriter *w, const char *path, int version, char *err, int errlen);
int shard_put(ShardWriter *w, const uint32_t *tok, size_t n);
int shard_finish(ShardWriter *w);
int shard_commit(ShardWriter *w);
void shard_abort(ShardWriter *w);
/* All four in one: write tok[n] to path. */
int shard_write(const char *path, const uint32_t *tok, size_t n, int version, char *err, int errlen);
#endif
