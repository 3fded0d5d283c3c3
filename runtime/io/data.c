/* data.c — see data.h. */
#include "data.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fsutil.h"

uint64_t data_next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t data_rng(uint64_t seed) { return seed ^ 0x5eedull; }

int data_load_text(Corpus *c, const char *path, char *err, int errlen) {
    memset(c, 0, sizeof *c);
    int fd = rt_open_input("--data", path, err, errlen); /* a FIFO or a device is refused, not read forever */
    FILE *f = fd < 0 ? NULL : fdopen(fd, "rb");
    if (fd >= 0 && !f) close(fd), rt_errf(err, errlen, "--data: %s: cannot open: %s", path, strerror(errno));
    if (!f) return -1;
    size_t cap = 1 << 16;
    c->bytes = malloc(cap);
    for (size_t k; c->bytes && (k = fread(c->bytes + c->n, 1, cap - c->n, f)) > 0;) {
        c->n += k;
        if (c->n == cap) {
            unsigned char *p = realloc(c->bytes, cap *= 2);
            if (!p) free(c->bytes);
            c->bytes = p;
        }
    }
    int bad = !c->bytes || ferror(f);
    fclose(f);
    if (bad) {
        snprintf(err, (size_t)errlen, "--data: cannot read %s", path);
        data_free(c);
        return -1;
    }
    return 0;
}

void data_free(Corpus *c) {
    free(c->bytes);
    memset(c, 0, sizeof *c);
}

void data_sample_i32(const Corpus *c, int64_t B, int64_t T, uint64_t *rng, int32_t *tok, int32_t *tgt) {
    for (int64_t b = 0; b < B; b++) {
        size_t off = (size_t)(data_next(rng) % (c->n - (size_t)T));
        for (int64_t t = 0; t < T; t++) {
            tok[b * T + t] = c->bytes[off + (size_t)t];
            tgt[b * T + t] = c->bytes[off + (size_t)t + 1];
        }
    }
}
