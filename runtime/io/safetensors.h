/* safetensors.h — read and write tensors in the safetensors format: an
 * 8-byte little-endian header length N, N bytes of JSON header naming each
 * tensor's dtype, shape and byte range (data_offsets, relative to the data
 * section), then the raw little-endian data.  PyTorch, NumPy and Hugging
 * Face read it; kiln uses it to hand weights and gradients to the reference
 * tests and for checkpoints (checkpoint.h).
 *
 * Writing is atomic: a temp file next to the target, fsync, rename, fsync of
 * the directory, so a reader sees the old file or the complete new one.
 *
 * Reading is strict: the header is parsed by jansson and accepted only as
 * the format allows (an object of tensor entries with exactly dtype, shape
 * and data_offsets, plus an optional "__metadata__" object of strings), and every tensor is checked against the file: offsets
 * inside the data section, no overlaps and no holes, shape product x dtype
 * size == byte length.  Every violation is one line "FILE: what (field)". */
#ifndef KILN_SAFETENSORS_H
#define KILN_SAFETENSORS_H
#include <stddef.h>
#include <stdint.h>

/* Dtypes by their safetensors names. */
enum { ST_F64, ST_F32, ST_F16, ST_BF16, ST_I64, ST_I32, ST_I16, ST_I8, ST_U64, ST_U32, ST_U16, ST_U8, ST_BOOL, ST_NDTYPES };
const char *st_dtype_name(int dtype);
int st_dtype_size(int dtype);
int st_dtype_parse(const char *name); /* -1 if unknown */

#define ST_MAX_RANK 8

/* ---- writing ---- */
typedef struct StWriter StWriter;
StWriter *st_new(void);
/* Add an f32 tensor (data converted from double) or an i32 tensor. */
void st_add_f32(StWriter *w, const char *name, const int64_t *shape, int rank, const double *data);
void st_add_i32(StWriter *w, const char *name, const int64_t *shape, int rank, const double *data);
/* Add raw data of any dtype: copied now (st_add_raw), or only referenced
 * (st_add_view: data must stay valid and unchanged until st_write). */
void st_add_raw(StWriter *w, const char *name, int dtype, const int64_t *shape, int rank, const void *data);
void st_add_view(StWriter *w, const char *name, int dtype, const int64_t *shape, int rank, const void *data);
/* A "__metadata__" entry (string to string). */
void st_add_meta(StWriter *w, const char *key, const char *value);
/* Write atomically to path and free w; 0 or -1 with a message in err. */
int st_write(StWriter *w, const char *path, char *err, int errlen);
/* The same; test hook: crash_after >= 0 raises SIGKILL once that many bytes
 * of the temp file have been written (before the rename). */
int st_write_ex(StWriter *w, const char *path, int64_t crash_after, char *err, int errlen);

/* ---- reading ---- */
typedef struct {
    char *name;
    int dtype;
    int rank;
    int64_t shape[ST_MAX_RANK];
    uint64_t begin, end; /* byte range in the data section */
} StEntry;

typedef struct {
    char *path;
    void *map;          /* the whole file, read-only */
    size_t size;
    const unsigned char *data; /* the data section */
    size_t data_len;
    StEntry *t;         /* in header order */
    int n;
    char **meta;        /* key, value, key, value, ... */
    int nmeta;
} StFile;

/* Open and validate path; 0, or -1 with one line in err (f is then empty). */
int st_open(StFile *f, const char *path, char *err, int errlen);
void st_close(StFile *f);
const StEntry *st_find(const StFile *f, const char *name);
static inline const void *st_data(const StFile *f, const StEntry *e) { return f->data + e->begin; }
const char *st_meta(const StFile *f, const char *key); /* NULL if absent */
/* "[a,b,c]" for error messages. */
void st_shape_str(const int64_t *shape, int rank, char *buf, size_t len);
#endif
