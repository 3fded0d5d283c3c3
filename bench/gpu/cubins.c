/* cubins.c — write the library kernels' cubins, as kiln compile embeds them.
 *
 *     cubins ARCH OUTDIR
 *
 * For every kernels/cuda/ *.cu (the directory kiln_cuda_kernel_dir() names,
 * attention_tc.cu included) writes OUTDIR/<stem>.cubin, compiled by the
 * compiler's own emit_cuda_library_cubins: what a trainer embeds (kiln
 * calibrate --device cuda uses the same call).  kcheck (bench/gpu/kcheck.c) loads them into its
 * hand-made programs, so the kernels it checks are the bits a trainer
 * carries.  Runs where kiln is built (NVRTC, no GPU): bench/gpu/prepare.sh.
 * Exit 0, or 1 with one line on stderr.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emit.h"
#include "nvrtc_compile.h"

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
    const char *arch = argv[1], *outdir = argv[2];
    EmitCubin *cb;
    int n;
    char err[4096];
    if (emit_cuda_library_cubins(arch, 1, &cb, &n, err, sizeof err) != 0) { /* every kernels/cuda .cu, attention_tc.cu too */
        fprintf(stderr, "cubins: %s\n", err);
        return 1;
    }
    for (int i = 0; i < n; i++) {
        char out[4096];
        snprintf(out, sizeof out, "%s/%s.cubin", outdir, cb[i].name);
        if (write_file(out, cb[i].data, cb[i].size) != 0) return 1;
        printf("%s: %zu bytes\n", out, cb[i].size);
    }
    emit_cubins_free(cb, n);
    if (n == 0) {
        fprintf(stderr, "cubins: no .cu files in %s\n", kiln_cuda_kernel_dir());
        return 1;
    }
    return 0;
}
