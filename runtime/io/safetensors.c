/* safetensors.c — see safetensors.h.
 *
 * Writer: tensors are collected (copied, or referenced for checkpoints so a
 * 1.5 GB optimizer state is not duplicated), the header is built with names
 * JSON-escaped and padded with spaces so the data starts 8-byte aligned, and
 * the file goes out through a temp file + fsync + rename + directory fsync.
 *
 * Reader: the file is mapped read-only; jansson parses the header (json.c,
 * duplicate keys rejected, nothing but blanks after the object), the tree is
 * checked for what the format allows (tensor entries with exactly dtype,
 * shape and data_offsets, non-negative integers, a "__metadata__" object of
 * strings), then every entry against the data section.  Nothing is trusted:
 * a corrupt or truncated checkpoint must give a clear line, never a crash.
 */
#include "fsutil.h"
#include "json.h"
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host"
#endif

#define ST_MAX_HEADER (100u << 20) /* the format's own limit */

static const struct {
    const char *name;
    int size;
} DTYPES[ST_NDTYPES] = {
    [ST_F64] = {"F64", 8}, [ST_F32] = {"F32", 4}, [ST_F16] = {"F16", 2},  [ST_BF16] = {"BF16", 2},
    [ST_I64] = {"I64", 8}, [ST_I32] = {"I32", 4}, [ST_I16] = {"I16", 2},  [ST_I8] = {"I8", 1},
    [ST_U64] = {"U64", 8}, [ST_U32] = {"U32", 4}, [ST_U16] = {"U16", 2},  [ST_U8] = {"U8", 1},
    [ST_BOOL] = {"BOOL", 1},
};

const char *st_dtype_name(int d) { return d >= 0 && d < ST_NDTYPES ? DTYPES[d].name : "?"; }
int st_dtype_size(int d) { return d >= 0 && d < ST_NDTYPES ? DTYPES[d].size : 0; }
int st_dtype_parse(const char *name) {
    for (int d = 0; d < ST_NDTYPES; d++)
        if (strcmp(DTYPES[d].name, name) == 0) return d;
    return -1;
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) { fprintf(stderr, "safetensors: out of memory\n"); exit(1); }
    return p;
}

static void *xrealloc(void *p, size_t n) {
    p = realloc(p, n ? n : 1);
    if (!p) { fprintf(stderr, "safetensors: out of memory\n"); exit(1); }
    return p;
}

static char *xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    return memcpy(xmalloc(n), s, n);
}

void st_shape_str(const int64_t *shape, int rank, char *buf, size_t len) {
    size_t k = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < rank && k < len; i++) k += (size_t)snprintf(buf + k, len - k, "%s%lld", i ? "," : "", (long long)shape[i]);
    if (k < len) snprintf(buf + k, len - k, "]");
}

/* ================= writing ================= */

typedef struct {
    char *name;
    int dtype, rank, owned;
    int64_t shape[ST_MAX_RANK];
    const void *data;
    size_t bytes;
} StTensor;

struct StWriter {
    StTensor *t;
    int n, cap;
    char **meta; /* key, value pairs */
    int nmeta;
};

StWriter *st_new(void) {
    StWriter *w = xmalloc(sizeof *w);
    memset(w, 0, sizeof *w);
    return w;
}

static StTensor *add(StWriter *w, const char *name, int dtype, const int64_t *shape, int rank) {
    if (rank < 0 || rank > ST_MAX_RANK) { fprintf(stderr, "safetensors: %s: rank %d\n", name, rank); exit(1); }
    if (w->n == w->cap) {
        w->cap = w->cap ? 2 * w->cap : 64;
        w->t = xrealloc(w->t, (size_t)w->cap * sizeof *w->t);
    }
    StTensor *t = &w->t[w->n++];
    memset(t, 0, sizeof *t);
    t->name = xstrdup(name);
    t->dtype = dtype;
    t->rank = rank;
    size_t n = 1;
    for (int i = 0; i < rank; i++) n *= (size_t)(t->shape[i] = shape[i]);
    t->bytes = n * (size_t)st_dtype_size(dtype);
    return t;
}

static void *add_owned(StWriter *w, const char *name, int dtype, const int64_t *shape, int rank) {
    StTensor *t = add(w, name, dtype, shape, rank);
    t->owned = 1;
    t->data = xmalloc(t->bytes);
    return (void *)t->data;
}

void st_add_f32(StWriter *w, const char *name, const int64_t *shape, int rank, const double *data) {
    float *d = add_owned(w, name, ST_F32, shape, rank);
    for (size_t i = 0; i < w->t[w->n - 1].bytes / 4; i++) d[i] = (float)data[i];
}

void st_add_i32(StWriter *w, const char *name, const int64_t *shape, int rank, const double *data) {
    int32_t *d = add_owned(w, name, ST_I32, shape, rank);
    for (size_t i = 0; i < w->t[w->n - 1].bytes / 4; i++) d[i] = (int32_t)data[i];
}

void st_add_raw(StWriter *w, const char *name, int dtype, const int64_t *shape, int rank, const void *data) {
    void *d = add_owned(w, name, dtype, shape, rank);
    memcpy(d, data, w->t[w->n - 1].bytes);
}

void st_add_view(StWriter *w, const char *name, int dtype, const int64_t *shape, int rank, const void *data) {
    add(w, name, dtype, shape, rank)->data = data;
}

void st_add_meta(StWriter *w, const char *key, const char *value) {
    w->meta = xrealloc(w->meta, (size_t)(w->nmeta + 1) * 2 * sizeof *w->meta);
    w->meta[2 * w->nmeta] = xstrdup(key);
    w->meta[2 * w->nmeta + 1] = xstrdup(value);
    w->nmeta++;
}

/* a growable string */
typedef struct {
    char *s;
    size_t n, cap;
} Buf;

static void buf_put(Buf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        b->cap = 2 * (b->n + n + 1) + 256;
        b->s = xrealloc(b->s, b->cap);
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}

static void buf_printf(Buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void buf_printf(Buf *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    buf_put(b, tmp, (size_t)k < sizeof tmp ? (size_t)k : sizeof tmp - 1);
}

static void buf_json_string(Buf *b, const char *s) {
    buf_put(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') { buf_put(b, "\\", 1); buf_put(b, s, 1); }
        else if (c < 0x20) buf_printf(b, "\\u%04x", c);
        else buf_put(b, s, 1);
    }
    buf_put(b, "\"", 1);
}

static char *header_json(const StWriter *w, size_t *len) {
    Buf b = {0};
    buf_put(&b, "{", 1);
    int first = 1;
    if (w->nmeta) {
        buf_put(&b, "\"__metadata__\":{", 16);
        for (int i = 0; i < w->nmeta; i++) {
            if (i) buf_put(&b, ",", 1);
            buf_json_string(&b, w->meta[2 * i]);
            buf_put(&b, ":", 1);
            buf_json_string(&b, w->meta[2 * i + 1]);
        }
        buf_put(&b, "}", 1);
        first = 0;
    }
    size_t off = 0;
    for (int i = 0; i < w->n; i++, first = 0) {
        const StTensor *t = &w->t[i];
        if (!first) buf_put(&b, ",", 1);
        buf_json_string(&b, t->name);
        buf_printf(&b, ":{\"dtype\":\"%s\",\"shape\":[", st_dtype_name(t->dtype));
        for (int d = 0; d < t->rank; d++) buf_printf(&b, "%s%lld", d ? "," : "", (long long)t->shape[d]);
        buf_printf(&b, "],\"data_offsets\":[%zu,%zu]}", off, off + t->bytes);
        off += t->bytes;
    }
    buf_put(&b, "}", 1);
    while (b.n % 8) buf_put(&b, " ", 1); /* pad so the data starts 8-byte aligned */
    *len = b.n;
    return b.s;
}

/* A file being written, with the crash hook's byte count. */
typedef struct {
    int fd;
    int64_t written, crash_after;
} Out;

static int out_write(Out *o, const void *p, size_t n) {
    const char *c = p;
    while (n) {
        size_t chunk = n;
        if (o->crash_after >= 0) {
            if (o->written >= o->crash_after) raise(SIGKILL);
            if ((int64_t)chunk > o->crash_after - o->written) chunk = (size_t)(o->crash_after - o->written);
        }
        ssize_t k = write(o->fd, c, chunk);
        if (k < 0) { if (errno == EINTR) continue; return -1; }
        c += k;
        n -= (size_t)k;
        o->written += k;
    }
    if (o->crash_after >= 0 && o->written >= o->crash_after) raise(SIGKILL);
    return 0;
}

static void writer_free(StWriter *w) {
    for (int i = 0; i < w->n; i++) {
        free(w->t[i].name);
        if (w->t[i].owned) free((void *)w->t[i].data);
    }
    for (int i = 0; i < 2 * w->nmeta; i++) free(w->meta[i]);
    free(w->meta);
    free(w->t);
    free(w);
}


int st_write_ex(StWriter *w, const char *path, int64_t crash_after, char *err, int errlen) {
    size_t hlen;
    char *h = header_json(w, &hlen);
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    int rc = -1;
    Out o = {open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644), 0, crash_after};
    if (o.fd < 0) {
        snprintf(err, (size_t)errlen, "%s: cannot create: %s", path, strerror(errno));
        goto done;
    }
    uint64_t le = hlen;
    int bad = out_write(&o, &le, 8) || out_write(&o, h, hlen);
    for (int i = 0; i < w->n && !bad; i++) bad = out_write(&o, w->t[i].data, w->t[i].bytes);
    if (bad || fsync(o.fd) != 0) {
        snprintf(err, (size_t)errlen, "%s: write failed: %s", path, strerror(errno));
        close(o.fd);
        unlink(tmp);
        goto done;
    }
    if (close(o.fd) != 0 || rename(tmp, path) != 0) {
        snprintf(err, (size_t)errlen, "%s: cannot write: %s", path, strerror(errno));
        unlink(tmp);
        goto done;
    }
    if (rt_fsync_dir_of(path) != 0) {
        snprintf(err, (size_t)errlen, "%s: cannot sync its directory: %s", path, strerror(errno));
        goto done;
    }
    rc = 0;
done:
    free(h);
    writer_free(w);
    return rc;
}

int st_write(StWriter *w, const char *path, char *err, int errlen) { return st_write_ex(w, path, -1, err, errlen); }

/* ================= reading ================= */

/* The header, parsed by jansson (duplicate keys rejected), then checked:
 * nothing but tensor entries and "__metadata__"; each entry exactly
 * dtype (a known one), shape and data_offsets (non-negative integers). */

/* A non-negative integer. */
static int header_uint(const StFile *f, const json_t *v, const char *what, uint64_t *out, char *err, int errlen) {
    if (json_is_real(v)) return rt_errf(err, errlen, "%s: header: expected an integer (%s)", f->path, what);
    if (!json_is_integer(v)) return rt_errf(err, errlen, "%s: header: expected a non-negative integer (%s), found %s", f->path, what, rt_json_kind(v));
    if (json_integer_value(v) < 0)
        return rt_errf(err, errlen, "%s: header: expected a non-negative integer (%s), found %lld", f->path, what, (long long)json_integer_value(v));
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

/* [n0, n1, ...] with at most max entries. */
static int header_uints(const StFile *f, const json_t *a, uint64_t *v, int max, int *n, const char *what, char *err, int errlen) {
    if (!json_is_array(a)) return rt_errf(err, errlen, "%s: header: expected '[' (%s), found %s", f->path, what, rt_json_kind(a));
    if (json_array_size(a) > (size_t)max) return rt_errf(err, errlen, "%s: header: more than %d entries (%s)", f->path, max, what);
    *n = (int)json_array_size(a);
    for (int i = 0; i < *n; i++)
        if (header_uint(f, json_array_get(a, (size_t)i), what, &v[i], err, errlen)) return -1;
    return 0;
}

static int header_dtype(const StFile *f, StEntry *e, const json_t *v, char *err, int errlen) {
    if (!json_is_string(v)) return rt_errf(err, errlen, "%s: header: tensor \"%s\": dtype: expected a string, found %s", f->path, e->name, rt_json_kind(v));
    e->dtype = st_dtype_parse(json_string_value(v));
    if (e->dtype < 0) return rt_errf(err, errlen, "%s: header: tensor \"%s\": unknown dtype \"%s\"", f->path, e->name, json_string_value(v));
    return 0;
}

static int header_tensor(StFile *f, const char *name, const json_t *obj, char *err, int errlen) {
    static const char *const FIELDS[] = {"dtype", "shape", "data_offsets"};
    const char *p = f->path, *key;
    json_t *v;
    if (!json_is_object(obj)) return rt_errf(err, errlen, "%s: header: expected '{' for tensor \"%s\", found %s", p, name, rt_json_kind(obj));
    json_object_foreach((json_t *)obj, key, v)
        if (strcmp(key, "dtype") && strcmp(key, "shape") && strcmp(key, "data_offsets"))
            return rt_errf(err, errlen, "%s: header: tensor \"%s\": unknown field \"%s\"", p, name, key);
    for (int i = 0; i < 3; i++)
        if (!json_object_get(obj, FIELDS[i])) return rt_errf(err, errlen, "%s: header: tensor \"%s\": missing field \"%s\"", p, name, FIELDS[i]);
    f->t = xrealloc(f->t, (size_t)(f->n + 1) * sizeof *f->t);
    StEntry *e = &f->t[f->n++];
    memset(e, 0, sizeof *e);
    e->name = xstrdup(name);
    char what[300];
    uint64_t sh[ST_MAX_RANK], off[2];
    int n;
    snprintf(what, sizeof what, "tensor \"%.200s\" shape", name);
    if (header_dtype(f, e, json_object_get(obj, "dtype"), err, errlen) ||
        header_uints(f, json_object_get(obj, "shape"), sh, ST_MAX_RANK, &e->rank, what, err, errlen))
        return -1;
    for (int i = 0; i < e->rank; i++) e->shape[i] = (int64_t)sh[i];
    snprintf(what, sizeof what, "tensor \"%.200s\" data_offsets", name);
    if (header_uints(f, json_object_get(obj, "data_offsets"), off, 2, &n, what, err, errlen)) return -1;
    if (n != 2) return rt_errf(err, errlen, "%s: header: tensor \"%s\": data_offsets needs 2 numbers, has %d", p, name, n);
    e->begin = off[0];
    e->end = off[1];
    return 0;
}

static int header_meta(StFile *f, const json_t *obj, char *err, int errlen) {
    const char *key;
    json_t *v;
    if (!json_is_object(obj)) return rt_errf(err, errlen, "%s: header: expected '{' for __metadata__, found %s", f->path, rt_json_kind(obj));
    json_object_foreach((json_t *)obj, key, v) {
        if (!json_is_string(v))
            return rt_errf(err, errlen, "%s: header: __metadata__ \"%s\": expected a string (metadata values are strings), found %s", f->path, key, rt_json_kind(v));
        f->meta = xrealloc(f->meta, (size_t)(f->nmeta + 1) * 2 * sizeof *f->meta);
        f->meta[2 * f->nmeta] = xstrdup(key);
        f->meta[2 * f->nmeta + 1] = xstrdup(json_string_value(v));
        f->nmeta++;
    }
    return 0;
}

static int cmp_begin(const void *a, const void *b) {
    const StEntry *x = *(StEntry *const *)a, *y = *(StEntry *const *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : x->end < y->end ? -1 : x->end > y->end;
}


/* Each entry against the data section: sizes, bounds, no overlap, no hole. */
static int check_entries(const StFile *f, char *err, int errlen) {
    const char *p = f->path;
    for (int i = 0; i < f->n; i++) {
        const StEntry *e = &f->t[i];
        char sh[256];
        st_shape_str(e->shape, e->rank, sh, sizeof sh);
        if (e->begin > e->end) return rt_errf(err, errlen, "%s: tensor \"%s\": data_offsets [%llu,%llu] end before they begin", p, e->name, (unsigned long long)e->begin, (unsigned long long)e->end);
        if (e->end > f->data_len)
            return rt_errf(err, errlen, "%s: tensor \"%s\": data_offsets [%llu,%llu] run past the data section (%zu bytes; truncated file?)", p, e->name,
                        (unsigned long long)e->begin, (unsigned long long)e->end, f->data_len);
        unsigned __int128 bytes = (unsigned)st_dtype_size(e->dtype);
        int huge = 0;
        for (int d = 0; d < e->rank && !huge; d++) huge = (bytes *= (uint64_t)e->shape[d]) > UINT64_MAX;
        if (huge || bytes != e->end - e->begin) {
            char need[32] = "more than 2^64";
            if (!huge) snprintf(need, sizeof need, "%llu", (unsigned long long)bytes);
            return rt_errf(err, errlen, "%s: tensor \"%s\": shape %s of %s needs %s bytes but data_offsets [%llu,%llu] hold %llu", p, e->name, sh,
                        st_dtype_name(e->dtype), need, (unsigned long long)e->begin, (unsigned long long)e->end, (unsigned long long)(e->end - e->begin));
        }
    }
    const StEntry **s = xmalloc((size_t)f->n * sizeof *s);
    for (int i = 0; i < f->n; i++) s[i] = &f->t[i];
    int rc = 0;
    qsort(s, (size_t)f->n, sizeof *s, cmp_begin);
    uint64_t at = 0;
    for (int i = 0; i < f->n && !rc; i++) {
        if (s[i]->begin < at)
            rc = rt_errf(err, errlen, "%s: tensor \"%s\": data_offsets [%llu,%llu] overlap tensor \"%s\"", p, s[i]->name, (unsigned long long)s[i]->begin,
                      (unsigned long long)s[i]->end, s[i - 1]->name);
        else if (s[i]->begin > at)
            rc = rt_errf(err, errlen, "%s: tensor \"%s\": data_offsets [%llu,%llu] leave a gap after byte %llu of the data section", p, s[i]->name,
                      (unsigned long long)s[i]->begin, (unsigned long long)s[i]->end, (unsigned long long)at);
        at = s[i]->end;
    }
    if (!rc && at != f->data_len)
        rc = rt_errf(err, errlen, "%s: the data section has %zu bytes but the tensors' data_offsets end at %llu (trailing bytes)", p, f->data_len, (unsigned long long)at);
    free(s);
    return rc;
}

static int parse_header(StFile *f, const char *h, size_t hlen, char *err, int errlen) {
    RtJsonError je;
    size_t used;
    json_t *top = rt_json_load(h, hlen, JSON_REJECT_DUPLICATES, &used, &je);
    if (!top) return rt_errf(err, errlen, "%s: header (byte %d): %s (in the header)%s", f->path, je.byte + 8, je.what, je.near);
    int rc = 0;
    const char *key;
    json_t *v;
    if (!rt_json_blank(h + used, hlen - used))
        rc = rt_errf(err, errlen, "%s: header (byte %zu): unexpected bytes after the header object", f->path, used + 8);
    json_object_foreach(top, key, v) {
        if (rc) break;
        rc = strcmp(key, "__metadata__") == 0 ? header_meta(f, v, err, errlen) : header_tensor(f, key, v, err, errlen);
    }
    json_decref(top);
    return rc;
}

int st_open(StFile *f, const char *path, char *err, int errlen) {
    memset(f, 0, sizeof *f);
    f->path = xstrdup(path);
    int fd = rt_open_input(NULL, path, err, errlen); /* a FIFO or a device is refused, not read forever */
    struct stat sb;
    if (fd < 0) goto bad;
    if (fstat(fd, &sb) != 0) {
        rt_errf(err, errlen, "%s: cannot stat: %s", path, strerror(errno));
        close(fd);
        goto bad;
    }
    f->size = (size_t)sb.st_size;
    if (f->size < 8) {
        rt_errf(err, errlen, "%s: %zu bytes, too short for a safetensors file (header length)", path, f->size);
        close(fd);
        goto bad;
    }
    f->map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (f->map == MAP_FAILED) { f->map = NULL; rt_errf(err, errlen, "%s: cannot map: %s", path, strerror(errno)); goto bad; }
    uint64_t hlen;
    memcpy(&hlen, f->map, 8);
    if (hlen < 2 || hlen > ST_MAX_HEADER || hlen > f->size - 8) {
        rt_errf(err, errlen, "%s: header length %llu does not fit the file (%zu bytes; not a safetensors file, or truncated)", path, (unsigned long long)hlen, f->size);
        goto bad;
    }
    const char *h = (const char *)f->map + 8;
    if (h[0] != '{') { rt_errf(err, errlen, "%s: header does not start with '{' (not a safetensors file)", path); goto bad; }
    f->data = (const unsigned char *)f->map + 8 + hlen;
    f->data_len = f->size - 8 - hlen;
    if (parse_header(f, h, hlen, err, errlen) || check_entries(f, err, errlen)) goto bad;
    return 0;
bad:
    st_close(f);
    return -1;
}

void st_close(StFile *f) {
    if (f->map) munmap(f->map, f->size);
    for (int i = 0; i < f->n; i++) free(f->t[i].name);
    for (int i = 0; i < 2 * f->nmeta; i++) free(f->meta[i]);
    free(f->meta);
    free(f->t);
    free(f->path);
    memset(f, 0, sizeof *f);
}

const StEntry *st_find(const StFile *f, const char *name) {
    for (int i = 0; i < f->n; i++)
        if (strcmp(f->t[i].name, name) == 0) return &f->t[i];
    return NULL;
}

const char *st_meta(const StFile *f, const char *key) {
    for (int i = 0; i < f->nmeta; i++)
        if (strcmp(f->meta[2 * i], key) == 0) return f->meta[2 * i + 1];
    return NULL;
}
