/* cubins.c — write the library kernels' cubins, as kiln compile embeds them.
 *
 *     cubins ARCH OUTDIR
 *
 * For every kernels/cuda/ *.cu (the directory kiln_cuda_kernel_dir() names,
 * in name order) writes OUTDIR/<stem>.cubin, compiled exactly as
 * compiler/emit/emit_cuda.c's library_cubins does: the same path as the NVRTC
 * program name, the same kiln_nvrtc_compile_cached call and options,
 * warnings failing.  kcheck (bench/gpu/kcheck.c) loads them into its
 * hand-made programs, so the kernels it checks are the bits a trainer
 * carries.  Runs where kiln is built (NVRTC, no GPU): bench/gpu/prepare.sh.
 * Exit 0, or 1 with one line on stderr.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nvrtc_compile.h"

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int write_file(const char *path, const unsigned char *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "cubins: cannot write %s: %s\n", path, strerror(errno));
        return -1;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: cubins ARCH OUTDIR   (e.g. cubins sm_90 bench/gpu/out/cubins)\n");
        return 1;
    }
    const char *arch = argv[1], *outdir = argv[2], *dir = kiln_cuda_kernel_dir();
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "cubins: %s: %s\n", dir, strerror(errno));
        return 1;
    }
    char *names[256];
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) && n < 256;) {
        size_t len = strlen(e->d_name);
        if (len > 3 && strcmp(e->d_name + len - 3, ".cu") == 0 && !(names[n++] = strdup(e->d_name))) {
            fprintf(stderr, "cubins: out of memory\n");
            return 1;
        }
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof *names, by_name);
    for (int i = 0; i < n; i++) {
        char path[4096], out[4096], err[4096];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        snprintf(out, sizeof out, "%s/%.*s.cubin", outdir, (int)(strlen(names[i]) - 3), names[i]);
        char *src = kiln_read_source(path, err, sizeof err);
        KilnCubin cb;
        memset(&cb, 0, sizeof cb);
        if (!src || kiln_nvrtc_compile_cached(path, src, arch, KILN_NVRTC_WARNINGS_FAIL, &cb, err, sizeof err) != 0) {
            fprintf(stderr, "cubins: %s\n", err);
            return 1;
        }
        if (write_file(out, cb.data, cb.size) != 0) return 1;
        printf("%s: %zu bytes\n", out, cb.size);
        kiln_cubin_free(&cb);
        free(src);
        free(names[i]);
    }
    if (n == 0) {
        fprintf(stderr, "cubins: no .cu files in %s\n", dir);
        return 1;
    }
    return 0;
}
