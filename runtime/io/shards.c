/* shards.c — see shards.h.
 *
 * Files are mmap'ed read-only and checked completely at open (header, exact
 * size, and every token against the vocabulary when it is known), so a bad
 * file stops the run before the first step with one line naming the file and
 * the field.  Shards are little-endian, as llm.c writes them (as is every
 * machine kiln runs on today).
 */
#include "fsutil.h"
#include "shards.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data.h"


static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* ---- reading ---- */

static uint32_t token_at(const DataFile *f, size_t i) {
    const unsigned char *p = f->tok + i * (size_t)f->width;
    if (f->width == 1) return p[0];
    if (f->width == 2) return (uint32_t)p[0] | (uint32_t)p[1] << 8;
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Map the whole file; f->map stays NULL for an empty file. */
static int map_file(DataFile *f, int fd, size_t size, const char *flag, char *err, int errlen) {
    if (size == 0) return 0;
    void *m = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) return rt_errf(err, errlen, "%s: %s: cannot map: %s", flag, f->path, strerror(errno));
    f->map = m;
    f->maplen = size;
    return 0;
}

static int open_shard(DataFile *f, int fd, size_t size, const char *flag, char *err, int errlen) {
    if (size < SHARD_HEADER_BYTES)
        return rt_errf(err, errlen, "%s: %s: truncated header (%zu bytes; a shard starts with a %d-byte header)", flag, f->path,
                    size, SHARD_HEADER_BYTES);
    if (map_file(f, fd, size, flag, err, errlen) != 0) return -1;
    int32_t h[3];
    memcpy(h, f->map, sizeof h);
    if (h[0] != SHARD_MAGIC)
        return rt_errf(err, errlen, "%s: %s: wrong magic %d in the header (a token shard has %d)", flag, f->path, h[0],
                    SHARD_MAGIC);
    if (h[1] != 1 && h[1] != 2)
        return rt_errf(err, errlen, "%s: %s: unknown version %d in the header (1: uint16 tokens, 2: uint32 tokens)", flag,
                    f->path, h[1]);
    if (h[2] < 0) return rt_errf(err, errlen, "%s: %s: negative token count %d in the header", flag, f->path, h[2]);
    f->width = h[1] == 1 ? 2 : 4;
    f->n = (size_t)h[2];
    size_t want = SHARD_HEADER_BYTES + f->n * (size_t)f->width;
    if (size < want)
        return rt_errf(err, errlen, "%s: %s: truncated: the header's token count %zu needs %zu bytes, the file has %zu", flag,
                    f->path, f->n, want, size);
    if (size > want)
        return rt_errf(err, errlen, "%s: %s: %zu bytes after the %zu tokens the header's token count announces", flag,
                    f->path, size - want, f->n);
    f->tok = (const unsigned char *)f->map + SHARD_HEADER_BYTES;
    return 0;
}

static int open_one(DataFile *f, const char *path, int64_t vocab, const char *flag, char *err, int errlen) {
    memset(f, 0, sizeof *f);
    f->path = strdup(path);
    if (!f->path) return rt_errf(err, errlen, "%s: out of memory", flag);
    int fd = rt_open_input(flag, path, err, errlen); /* a FIFO or a device is refused, not read forever */
    if (fd < 0) return -1;
    struct stat st;
    int rc;
    if (fstat(fd, &st) != 0) rc = rt_errf(err, errlen, "%s: %s: cannot stat: %s", flag, path, strerror(errno));
    else if (ends_with(path, ".bin")) rc = open_shard(f, fd, (size_t)st.st_size, flag, err, errlen);
    else {
        rc = map_file(f, fd, (size_t)st.st_size, flag, err, errlen);
        f->width = 1, f->n = (size_t)st.st_size, f->tok = f->map;
    }
    if (close(fd) != 0 && rc == 0) rc = rt_errf(err, errlen, "%s: %s: close: %s", flag, path, strerror(errno));
    for (size_t i = 0; rc == 0 && vocab > 0 && i < f->n; i++) {
        uint32_t t = token_at(f, i);
        if (t >= (uint64_t)vocab)
            rc = rt_errf(err, errlen, "%s: %s: token id %u at position %zu >= the vocabulary size %lld", flag, path, t, i,
                      (long long)vocab);
    }
    return rc;
}

int dataset_open(Dataset *d, const char *pattern, int64_t vocab, const char *flag, char *err, int errlen) {
    memset(d, 0, sizeof *d);
    glob_t g;
    int rc = glob(pattern, 0, NULL, &g);
    if (rc == GLOB_NOMATCH) {
        if (strpbrk(pattern, "*?[")) return rt_errf(err, errlen, "%s: no file matches %s", flag, pattern);
        return rt_errf(err, errlen, "%s: %s: cannot open: %s", flag, pattern, strerror(ENOENT));
    }
    if (rc != 0) return rt_errf(err, errlen, "%s: %s: glob failed (%s)", flag, pattern, rc == GLOB_NOSPACE ? "out of memory" : "read error");
    int nbin = 0;
    for (size_t i = 0; i < g.gl_pathc; i++) nbin += ends_with(g.gl_pathv[i], ".bin");
    if (nbin != 0 && nbin != (int)g.gl_pathc) {
        globfree(&g);
        return rt_errf(err, errlen, "%s: %s matches both .bin shards and text files; use one kind", flag, pattern);
    }
    d->files = calloc(g.gl_pathc, sizeof *d->files);
    rc = d->files ? 0 : rt_errf(err, errlen, "%s: out of memory", flag);
    for (size_t i = 0; rc == 0 && i < g.gl_pathc; i++) {
        d->nfiles++;
        rc = open_one(&d->files[i], g.gl_pathv[i], vocab, flag, err, errlen);
        d->files[i].start = d->n;
        d->n += d->files[i].n;
    }
    globfree(&g);
    if (rc != 0) dataset_close(d);
    return rc;
}

void dataset_close(Dataset *d) {
    for (int i = 0; i < d->nfiles; i++) {
        DataFile *f = &d->files[i];
        if (f->map) munmap(f->map, f->maplen);
        free(f->path);
    }
    free(d->files);
    memset(d, 0, sizeof *d);
}

/* The file holding token i: the last file whose start <= i (and n > 0). */
static const DataFile *file_of(const Dataset *d, size_t i) {
    int lo = 0, hi = d->nfiles - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (d->files[mid].start <= i) lo = mid;
        else hi = mid - 1;
    }
    while (d->files[lo].n == 0 || i - d->files[lo].start >= d->files[lo].n) lo++; /* skip empty files */
    return &d->files[lo];
}

uint32_t dataset_token(const Dataset *d, size_t i) {
    const DataFile *f = file_of(d, i);
    return token_at(f, i - f->start);
}

void dataset_sample(const Dataset *d, int64_t B, int64_t T, int rank, int world, uint64_t *rng, int32_t *tok,
                    int32_t *tgt, size_t *off) {
    for (int64_t g = 0; g < (int64_t)world * B; g++) {
        size_t o = (size_t)(data_next(rng) % (d->n - (size_t)T));
        if (g / B != rank) continue;
        int64_t b = g % B;
        if (off) off[b] = o;
        uint32_t prev = dataset_token(d, o);
        for (int64_t t = 0; t < T; t++) {
            uint32_t next = dataset_token(d, o + (size_t)t + 1);
            tok[b * T + t] = (int32_t)prev;
            tgt[b * T + t] = (int32_t)next;
            prev = next;
        }
    }
}

/* ---- writing ---- */

static int wfail(ShardWriter *w, const char *what) {
    return rt_errf(w->err, w->errlen, "%s: %s: %s", w->tmp ? w->tmp : w->path, what, strerror(errno));
}

static int write_header(ShardWriter *w) {
    int32_t h[SHARD_HEADER_INTS] = {SHARD_MAGIC, w->version, (int32_t)w->n};
    if (fseek(w->f, 0, SEEK_SET) != 0) return wfail(w, "seek");
    if (fwrite(h, sizeof h, 1, w->f) != 1) return wfail(w, "write");
    return 0;
}

int shard_begin(ShardWriter *w, const char *path, int version, char *err, int errlen) {
    memset(w, 0, sizeof *w);
    w->err = err, w->errlen = errlen, w->version = version;
    if (version != 1 && version != 2) return rt_errf(err, errlen, "%s: unknown shard version %d", path, version);
    size_t k = strlen(path) + 5;
    w->path = strdup(path);
    w->tmp = malloc(k);
    if (!w->path || !w->tmp) {
        shard_abort(w);
        return rt_errf(err, errlen, "%s: out of memory", path);
    }
    snprintf(w->tmp, k, "%s.tmp", path);
    w->f = fopen(w->tmp, "wb");
    if (!w->f || write_header(w) != 0) {
        int rc = wfail(w, "cannot create");
        shard_abort(w);
        return rc;
    }
    return 0;
}

int shard_put(ShardWriter *w, const uint32_t *tok, size_t n) {
    uint16_t buf[4096];
    if (w->n + n > INT32_MAX) return rt_errf(w->err, w->errlen, "%s: more than %d tokens in one shard", w->path, INT32_MAX);
    if (w->version == 2) {
        if (n && fwrite(tok, 4, n, w->f) != n) return wfail(w, "write");
        w->n += n;
        return 0;
    }
    for (size_t i = 0; i < n;) {
        size_t k = 0;
        for (; k < 4096 && i < n; k++, i++) {
            if (tok[i] > 0xffff)
                return rt_errf(w->err, w->errlen, "%s: token id %u does not fit a version 1 (uint16) shard", w->path, tok[i]);
            buf[k] = (uint16_t)tok[i];
        }
        if (fwrite(buf, 2, k, w->f) != k) return wfail(w, "write");
    }
    w->n += n;
    return 0;
}

int shard_finish(ShardWriter *w) {
    if (write_header(w) != 0) return -1;
    if (fflush(w->f) != 0) return wfail(w, "write");
    if (fsync(fileno(w->f)) != 0) return wfail(w, "fsync");
    FILE *f = w->f;
    w->f = NULL;
    if (fclose(f) != 0) return wfail(w, "close");
    return 0;
}

int shard_commit(ShardWriter *w) {
    if (rename(w->tmp, w->path) != 0) return wfail(w, "rename");
    int rc = 0;
    if (rt_fsync_dir_of(w->path) != 0) rc = rt_errf(w->err, w->errlen, "%s: fsync of its directory: %s", w->path, strerror(errno));
    free(w->tmp);
    w->tmp = NULL;
    shard_abort(w);
    return rc;
}

void shard_abort(ShardWriter *w) {
    if (w->f) fclose(w->f);
    if (w->tmp) unlink(w->tmp);
    free(w->tmp);
    free(w->path);
    w->f = NULL, w->tmp = w->path = NULL;
}

int shard_write(const char *path, const uint32_t *tok, size_t n, int version, char *err, int errlen) {
    ShardWriter w;
    if (shard_begin(&w, path, version, err, errlen) != 0) return -1;
    if (shard_put(&w, tok, n) != 0 || shard_finish(&w) != 0 || shard_commit(&w) != 0) {
        shard_abort(&w);
        return -1;
    }
    return 0;
}
