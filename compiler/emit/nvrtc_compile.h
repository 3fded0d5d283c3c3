/* nvrtc_compile.h — compile CUDA C to a cubin in memory with NVRTC (no GPU needed).
 *
 * The compiler compiles the library kernels (the .cu files in kernels/cuda/) and the
 * fused kernels it generates with these calls, for a real sm target such as
 * "sm_90", and embeds the cubins in the program (DESIGN §6).
 *
 * Include path: the kernels' directory (for common.cuh) and the CUDA
 * toolkit's include directory (for cuda_bf16.h).  The kernels' directory is
 * $KILN_CUDA_KERNELS when set, else KILN_CUDA_KERNEL_DIR (relative to the
 * working directory: the repository root, where kiln and the tests run);
 * the CUDA include directory is $CUDA_HOME/include when CUDA_HOME is set,
 * else KILN_CUDA_INCLUDE_DIR.
 *
 * Options, always the same (so a cubin depends only on the source and the
 * headers it includes, the arch and the NVRTC version):
 * --gpu-architecture=ARCH --std=c++17 --generate-line-info and the two
 * include paths.  kiln_nvrtc_options writes them with the version, for
 * cache keys and messages.
 */
#ifndef KILN_NVRTC_H
#define KILN_NVRTC_H

#include <stddef.h>

#ifndef KILN_CUDA_KERNEL_DIR
#define KILN_CUDA_KERNEL_DIR "kernels/cuda"
#endif
#ifndef KILN_CUDA_INCLUDE_DIR
#define KILN_CUDA_INCLUDE_DIR "/usr/local/cuda/include"
#endif

typedef struct {
    unsigned char *data; /* the cubin (an ELF image), malloc'd; NULL after a failure */
    size_t size;
    char *log;           /* NVRTC's program log, malloc'd and NUL-terminated ("" when NVRTC
                          * said nothing); kept after a compile error too; NULL when the
                          * compile never ran (bad arch, out of memory) */
} KilnCubin;

/* What to do with a log from a compile that succeeded (NVRTC's warnings). */
enum { KILN_NVRTC_WARNINGS_OK = 0, KILN_NVRTC_WARNINGS_FAIL = 1 };

/* Compile the CUDA C source `src`, named `name` (NVRTC's messages say
 * "name(line): ..."), for `arch` ("sm_80", "sm_90", "sm_90a": a real target;
 * compute_* gives no cubin and is refused).  On success returns 0 and fills
 * *out (free it with kiln_cubin_free).  On failure returns -1, writes one
 * line to err: the name, the arch and what failed, with NVRTC's log folded
 * into the line when there is one; *out then holds at most the log.  With
 * KILN_NVRTC_WARNINGS_FAIL a compile that succeeded with a non-blank log
 * fails the same way. */
int kiln_nvrtc_compile(const char *name, const char *src, const char *arch, int warnings, KilnCubin *out, char *err,
                       size_t errlen);

/* The same for the file at `path` (named by its path). */
int kiln_nvrtc_compile_file(const char *path, const char *arch, int warnings, KilnCubin *out, char *err,
                            size_t errlen);

void kiln_cubin_free(KilnCubin *c);

/* The library kernels' directory: $KILN_CUDA_KERNELS, else
 * KILN_CUDA_KERNEL_DIR when the working directory has it (the repository
 * root), else the one beside the kiln binary's directory (build/kiln ->
 * build/../kernels/cuda), else KILN_CUDA_KERNEL_DIR. */
const char *kiln_cuda_kernel_dir(void);
/* The whole file at path as a NUL-terminated string (malloc'd), or NULL
 * with "path: reason" in err. */
char *kiln_read_source(const char *path, char *err, size_t errlen);

/* kiln_nvrtc_compile through the on-disk cache (nvrtc_cache.c): the key
 * hashes NVRTC's version and options, the source and the kernels' *.cuh
 * headers; a hit returns the stored cubin and log (judged again under
 * `warnings`), a miss compiles and stores.  The directory is
 * $KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln/nvrtc, else
 * ~/.cache/kiln/nvrtc; without a usable one it just compiles. */
int kiln_nvrtc_compile_cached(const char *name, const char *src, const char *arch, int warnings, KilnCubin *out,
                              char *err, size_t errlen);
/* hits and misses of kiln_nvrtc_compile_cached in this process */
void kiln_nvrtc_cache_stats(int *hits, int *misses);

/* "nvrtc MAJOR.MINOR OPTION OPTION ..." for arch: what a cubin depends on
 * besides the source.  Returns 0, or -1 with a one-line error in err. */
int kiln_nvrtc_options(const char *arch, char *buf, size_t len, char *err, size_t errlen);

#endif
