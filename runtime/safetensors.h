/* safetensors.h — write tensors in the safetensors format (an 8-byte
 * little-endian header length, a JSON header naming each tensor's dtype,
 * shape and byte range, then the raw data).  PyTorch, NumPy and Hugging Face
 * read it; kiln uses it to hand weights and gradients to the reference tests
 * (and, from the checkpoint issue on, for checkpoints).  Writes are atomic:
 * a temp file, fsync, rename, fsync of the directory. */
#ifndef KILN_SAFETENSORS_H
#define KILN_SAFETENSORS_H
#include <stdint.h>

typedef struct StWriter StWriter;
StWriter *st_new(void);
/* Add an f32 tensor (data converted from double) or an i32 tensor. */
void st_add_f32(StWriter *w, const char *name, const int64_t *shape, int rank, const double *data);
void st_add_i32(StWriter *w, const char *name, const int64_t *shape, int rank, const double *data);
/* Write atomically to path and free w; 0 or -1 with a message in err. */
int st_write(StWriter *w, const char *path, char *err, int errlen);
#endif
