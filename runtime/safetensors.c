/* safetensors.c — see safetensors.h. */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    char *name;
    const char *dtype;
    int rank;
    int64_t shape[8];
    void *data;
    size_t bytes;
} StTensor;

struct StWriter {
    StTensor *t;
    int n, cap;
};

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) { fprintf(stderr, "safetensors: out of memory\n"); exit(1); }
    return p;
}

StWriter *st_new(void) {
    StWriter *w = xmalloc(sizeof *w);
    memset(w, 0, sizeof *w);
    return w;
}

static StTensor *add(StWriter *w, const char *name, const int64_t *shape, int rank, const char *dtype, size_t elem) {
    if (w->n == w->cap) {
        w->cap = w->cap ? 2 * w->cap : 64;
        StTensor *t = realloc(w->t, (size_t)w->cap * sizeof *t);
        if (!t) { fprintf(stderr, "safetensors: out of memory\n"); exit(1); }
        w->t = t;
    }
    StTensor *t = &w->t[w->n++];
    t->name = strdup(name);
    t->dtype = dtype;
    t->rank = rank;
    size_t n = 1;
    for (int i = 0; i < rank; i++) n *= (size_t)(t->shape[i] = shape[i]);
    t->bytes = n * elem;
    t->data = xmalloc(t->bytes);
    return t;
}

void st_add_f32(StWriter *w, const char *name, const int64_t *shape, int rank, const double *data) {
    StTensor *t = add(w, name, shape, rank, "F32", 4);
    for (size_t i = 0; i < t->bytes / 4; i++) ((float *)t->data)[i] = (float)data[i];
}

void st_add_i32(StWriter *w, const char *name, const int64_t *shape, int rank, const double *data) {
    StTensor *t = add(w, name, shape, rank, "I32", 4);
    for (size_t i = 0; i < t->bytes / 4; i++) ((int32_t *)t->data)[i] = (int32_t)data[i];
}

static char *header_json(const StWriter *w, size_t *len) {
    size_t cap = 256 + (size_t)w->n * 256, k = 0, off = 0;
    for (int i = 0; i < w->n; i++) cap += strlen(w->t[i].name) * 2;
    char *s = xmalloc(cap);
    k += (size_t)snprintf(s + k, cap - k, "{");
    for (int i = 0; i < w->n; i++) {
        const StTensor *t = &w->t[i];
        k += (size_t)snprintf(s + k, cap - k, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", i ? "," : "", t->name, t->dtype);
        for (int d = 0; d < t->rank; d++) k += (size_t)snprintf(s + k, cap - k, "%s%lld", d ? "," : "", (long long)t->shape[d]);
        k += (size_t)snprintf(s + k, cap - k, "],\"data_offsets\":[%zu,%zu]}", off, off + t->bytes);
        off += t->bytes;
    }
    k += (size_t)snprintf(s + k, cap - k, "}");
    while (k % 8) s[k++] = ' '; /* pad so the data starts 8-byte aligned */
    *len = k;
    return s;
}

static int write_all(int fd, const void *p, size_t n) {
    const char *c = p;
    while (n) {
        ssize_t k = write(fd, c, n);
        if (k < 0) { if (errno == EINTR) continue; return -1; }
        c += k;
        n -= (size_t)k;
    }
    return 0;
}

static void st_free(StWriter *w) {
    for (int i = 0; i < w->n; i++) { free(w->t[i].name); free(w->t[i].data); }
    free(w->t);
    free(w);
}

int st_write(StWriter *w, const char *path, char *err, int errlen) {
    size_t hlen;
    char *h = header_json(w, &hlen);
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644), rc = -1;
    if (fd < 0) {
        snprintf(err, (size_t)errlen, "%s: cannot create: %s", path, strerror(errno));
        goto done;
    }
    uint64_t le = hlen; /* x86-64 is little-endian */
    int bad = write_all(fd, &le, 8) || write_all(fd, h, hlen);
    for (int i = 0; i < w->n && !bad; i++) bad = write_all(fd, w->t[i].data, w->t[i].bytes);
    if (bad || fsync(fd) != 0) {
        snprintf(err, (size_t)errlen, "%s: write failed: %s", path, strerror(errno));
        close(fd);
        unlink(tmp);
        goto done;
    }
    if (close(fd) != 0 || rename(tmp, path) != 0) {
        snprintf(err, (size_t)errlen, "%s: cannot write: %s", path, strerror(errno));
        unlink(tmp);
        goto done;
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    int dfd = open(dirname(dir), O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) { fsync(dfd); close(dfd); }
    rc = 0;
done:
    free(h);
    st_free(w);
    return rc;
}
