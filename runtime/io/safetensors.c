/* safetensors.c — see safetensors.h.
 *
 * Writer: tensors are collected (copied, or referenced for checkpoints so a
 * 1.5 GB optimizer state is not duplicated), the header is built with names
 * JSON-escaped and padded with spaces so the data starts 8-byte aligned, and
 * the file goes out through a temp file + fsync + rename + directory fsync.
 *
 * Reader: the file is mapped read-only; the header is parsed by the strict
 * recursive-descent parser below (objects, strings, non-negative integers,
 * arrays of them — nothing else occurs in a valid header), then every entry
 * is checked against the data section.  Nothing is trusted: a corrupt or
 * truncated checkpoint must give a clear line, never a crash.
 */
#include "fsutil.h"
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

/* The header parser: s..end is the JSON text; the first error wins. */
typedef struct {
    const char *s, *start, *end, *path;
    char *err;
    int errlen, failed;
} Json;

static int jfail(Json *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int jfail(Json *j, const char *fmt, ...) {
    if (j->failed) return -1;
    j->failed = 1;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(j->err, (size_t)j->errlen, "%s: header (byte %ld): %s", j->path, (long)(j->s - j->start) + 8, msg);
    return -1;
}

static void jws(Json *j) {
    while (j->s < j->end && (*j->s == ' ' || *j->s == '\t' || *j->s == '\n' || *j->s == '\r')) j->s++;
}

static int jexpect(Json *j, char c, const char *where) {
    jws(j);
    if (j->s >= j->end) return jfail(j, "expected '%c' %s, found the end of the header", c, where);
    if (*j->s != c) return jfail(j, "expected '%c' %s, found '%c'", c, where, *j->s);
    j->s++;
    return 0;
}

/* Peek the next non-blank character (0 at the end). */
static char jpeek(Json *j) {
    jws(j);
    return j->s < j->end ? *j->s : 0;
}

static int hexval(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

static void put_utf8(Buf *b, unsigned cp) {
    char u[4];
    size_t n;
    if (cp < 0x80) u[0] = (char)cp, n = 1;
    else if (cp < 0x800) u[0] = (char)(0xC0 | cp >> 6), u[1] = (char)(0x80 | (cp & 0x3F)), n = 2;
    else if (cp < 0x10000) u[0] = (char)(0xE0 | cp >> 12), u[1] = (char)(0x80 | ((cp >> 6) & 0x3F)), u[2] = (char)(0x80 | (cp & 0x3F)), n = 3;
    else u[0] = (char)(0xF0 | cp >> 18), u[1] = (char)(0x80 | ((cp >> 12) & 0x3F)), u[2] = (char)(0x80 | ((cp >> 6) & 0x3F)), u[3] = (char)(0x80 | (cp & 0x3F)), n = 4;
    buf_put(b, u, n);
}

static int j_hex4(Json *j, unsigned *cp) {
    if (j->end - j->s < 4) return jfail(j, "truncated \\u escape");
    *cp = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(j->s[i]);
        if (h < 0) return jfail(j, "bad \\u escape");
        *cp = *cp << 4 | (unsigned)h;
    }
    j->s += 4;
    return 0;
}

/* A JSON string into a fresh NUL-terminated *out (no embedded NULs). */
static int jstring(Json *j, char **out, const char *what) {
    *out = NULL;
    if (jexpect(j, '"', what)) return -1;
    Buf b = {0};
    buf_put(&b, "", 0);
    for (;;) {
        if (j->s >= j->end) { free(b.s); return jfail(j, "unterminated string (%s)", what); }
        unsigned char c = (unsigned char)*j->s++;
        if (c == '"') break;
        if (c < 0x20) { free(b.s); return jfail(j, "control character in a string (%s)", what); }
        if (c != '\\') { buf_put(&b, (const char *)&c, 1); continue; }
        if (j->s >= j->end) { free(b.s); return jfail(j, "unterminated string (%s)", what); }
        char e = *j->s++;
        const char *simple = strchr("\"\\/bfnrt", e);
        if (e && simple) { buf_put(&b, &"\"\\/\b\f\n\r\t"[simple - "\"\\/bfnrt"], 1); continue; }
        unsigned cp, lo;
        if (e != 'u' || j_hex4(j, &cp)) { free(b.s); return jfail(j, "bad escape in a string (%s)", what); }
        if (cp >= 0xD800 && cp < 0xDC00) { /* a surrogate pair */
            if (j->end - j->s < 2 || j->s[0] != '\\' || j->s[1] != 'u') { free(b.s); return jfail(j, "lone surrogate in a string (%s)", what); }
            j->s += 2;
            if (j_hex4(j, &lo) || lo < 0xDC00 || lo > 0xDFFF) { free(b.s); return jfail(j, "bad surrogate pair in a string (%s)", what); }
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        } else if (cp == 0 || (cp >= 0xDC00 && cp < 0xE000)) {
            free(b.s);
            return jfail(j, "invalid character \\u%04x in a string (%s)", cp, what);
        }
        put_utf8(&b, cp);
    }
    *out = b.s;
    return 0;
}

/* A non-negative JSON integer (no sign, fraction, exponent or leading zero). */
static int juint(Json *j, uint64_t *v, const char *what) {
    jws(j);
    if (j->s >= j->end || *j->s < '0' || *j->s > '9') return jfail(j, "expected a non-negative integer (%s)", what);
    if (*j->s == '0' && j->s + 1 < j->end && j->s[1] >= '0' && j->s[1] <= '9') return jfail(j, "leading zero in a number (%s)", what);
    *v = 0;
    while (j->s < j->end && *j->s >= '0' && *j->s <= '9') {
        unsigned d = (unsigned)(*j->s++ - '0');
        if (*v > (UINT64_MAX - d) / 10) return jfail(j, "number too large (%s)", what);
        *v = *v * 10 + d;
    }
    if (j->s < j->end && (*j->s == '.' || *j->s == 'e' || *j->s == 'E')) return jfail(j, "expected an integer (%s)", what);
    return 0;
}

/* '[' n0, n1, ... ']' with at most max entries. */
static int juint_array(Json *j, uint64_t *v, int max, int *n, const char *what) {
    *n = 0;
    if (jexpect(j, '[', what)) return -1;
    if (jpeek(j) == ']') { j->s++; return 0; }
    for (;;) {
        if (*n == max) return jfail(j, "more than %d entries (%s)", max, what);
        if (juint(j, &v[(*n)++], what)) return -1;
        char c = jpeek(j);
        j->s++;
        if (c == ']') return 0;
        if (c != ',') { j->s--; return jfail(j, "expected ',' or ']' (%s)", what); }
    }
}

/* Calls item(j, key, ctx) for each key of an object; the item parses the value. */
static int jobject(Json *j, const char *what, int (*item)(Json *, char *key, void *), void *ctx) {
    if (jexpect(j, '{', what)) return -1;
    if (jpeek(j) == '}') { j->s++; return 0; }
    for (;;) {
        char *key;
        if (jstring(j, &key, what)) return -1;
        int rc = jexpect(j, ':', what) || item(j, key, ctx);
        free(key);
        if (rc) return -1;
        char c = jpeek(j);
        j->s++;
        if (c == '}') return 0;
        if (c != ',') { j->s--; return jfail(j, "expected ',' or '}' (%s)", what); }
    }
}

typedef struct {
    StFile *f;
    StEntry *e;
    int seen; /* bits: dtype, shape, data_offsets */
} TensorCtx;

static int tensor_field(Json *j, char *key, void *vctx) {
    TensorCtx *c = vctx;
    StEntry *e = c->e;
    int bit = strcmp(key, "dtype") == 0 ? 1 : strcmp(key, "shape") == 0 ? 2 : strcmp(key, "data_offsets") == 0 ? 4 : 0;
    if (!bit) return jfail(j, "tensor \"%s\": unknown field \"%s\"", e->name, key);
    if (c->seen & bit) return jfail(j, "tensor \"%s\": field \"%s\" given twice", e->name, key);
    c->seen |= bit;
    char what[300];
    snprintf(what, sizeof what, "tensor \"%.200s\" %s", e->name, key);
    if (bit == 1) {
        char *s;
        if (jstring(j, &s, what)) return -1;
        e->dtype = st_dtype_parse(s);
        int rc = e->dtype < 0 ? jfail(j, "tensor \"%s\": unknown dtype \"%s\"", e->name, s) : 0;
        free(s);
        return rc;
    }
    uint64_t v[ST_MAX_RANK];
    int n;
    if (bit == 2) {
        if (juint_array(j, v, ST_MAX_RANK, &n, what)) return -1;
        e->rank = n;
        for (int i = 0; i < n; i++) {
            if (v[i] > (uint64_t)INT64_MAX) return jfail(j, "tensor \"%s\": shape entry too large", e->name);
            e->shape[i] = (int64_t)v[i];
        }
        return 0;
    }
    if (juint_array(j, v, 2, &n, what)) return -1;
    if (n != 2) return jfail(j, "tensor \"%s\": data_offsets needs 2 numbers, has %d", e->name, n);
    e->begin = v[0];
    e->end = v[1];
    return 0;
}

static int meta_field(Json *j, char *key, void *vctx) {
    StFile *f = vctx;
    char *val;
    if (jstring(j, &val, "__metadata__ value (metadata values are strings)")) return -1;
    f->meta = xrealloc(f->meta, (size_t)(f->nmeta + 1) * 2 * sizeof *f->meta);
    f->meta[2 * f->nmeta] = xstrdup(key);
    f->meta[2 * f->nmeta + 1] = val;
    f->nmeta++;
    return 0;
}

static int top_field(Json *j, char *key, void *vctx) {
    StFile *f = vctx;
    if (strcmp(key, "__metadata__") == 0) {
        if (f->meta) return jfail(j, "__metadata__ given twice");
        f->meta = xmalloc(2 * sizeof *f->meta); /* marks "seen" even when empty */
        return jobject(j, "in __metadata__", meta_field, f);
    }
    f->t = xrealloc(f->t, (size_t)(f->n + 1) * sizeof *f->t);
    StEntry *e = &f->t[f->n++];
    memset(e, 0, sizeof *e);
    e->name = xstrdup(key);
    e->dtype = -1;
    TensorCtx c = {f, e, 0};
    char what[300];
    snprintf(what, sizeof what, "for tensor \"%.200s\"", key);
    if (jobject(j, what, tensor_field, &c)) return -1;
    if (c.seen != 7)
        return jfail(j, "tensor \"%s\": missing field \"%s\"", key, !(c.seen & 1) ? "dtype" : !(c.seen & 2) ? "shape" : "data_offsets");
    return 0;
}

static int cmp_name(const void *a, const void *b) { return strcmp((*(StEntry *const *)a)->name, (*(StEntry *const *)b)->name); }
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
    qsort(s, (size_t)f->n, sizeof *s, cmp_name);
    for (int i = 1; i < f->n && !rc; i++)
        if (strcmp(s[i - 1]->name, s[i]->name) == 0) rc = rt_errf(err, errlen, "%s: tensor \"%s\" appears twice in the header", p, s[i]->name);
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
    Json j = {h, h, h + hlen, f->path, err, errlen, 0};
    if (jobject(&j, "in the header", top_field, f)) return -1;
    jws(&j);
    if (j.s != j.end) return jfail(&j, "unexpected bytes after the header object");
    return 0;
}

int st_open(StFile *f, const char *path, char *err, int errlen) {
    memset(f, 0, sizeof *f);
    f->path = xstrdup(path);
    int fd = open(path, O_RDONLY);
    struct stat sb;
    if (fd < 0) { rt_errf(err, errlen, "%s: cannot open: %s", path, strerror(errno)); goto bad; }
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        rt_errf(err, errlen, "%s: not a regular file", path);
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
