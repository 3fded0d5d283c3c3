/* nvrtc.c — compile CUDA C to a cubin in memory with NVRTC.
 *
 * The CUDA backend compiles its kernels when kiln compiles a model, not
 * when the trainer runs (DESIGN §6): NVRTC turns CUDA C into a cubin for
 * any real sm target without a GPU, and the cubin is embedded in the
 * program, which later loads it with cuModuleLoadData.  This file is the
 * one place that talks to NVRTC: create a program from a source string,
 * compile it with a fixed option list (nvrtc_compile.h), collect the log and the
 * cubin, destroy the program.  Every NVRTC call's result is checked, and
 * every failure becomes one line naming the source, the arch and the
 * cause; a compile error's line carries NVRTC's log folded onto it (lines
 * trimmed, the caret lines under the quoted source dropped, joined by
 * " | "), and the log itself is kept whole in KilnCubin.log for a caller
 * that shows it next to the generated source.
 *
 * Warnings: NVRTC reports them only in the log of a compile that
 * succeeded.  The caller chooses: KILN_NVRTC_WARNINGS_OK keeps the cubin
 * and the log, KILN_NVRTC_WARNINGS_FAIL turns a non-blank log into a
 * failure (what `make test` holds the library kernels to).
 *
 * The arch must be a real target (sm_ and digits, maybe a letter suffix as
 * in sm_90a): for a virtual one (compute_90) NVRTC makes PTX and no cubin.
 */
#include "nvrtc_compile.h"

#include <nvrtc.h> /* NVRTC's own API */

#include <errno.h>
#include <stdio.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { OPT_COUNT = 5, OPT_LEN = 4200 };

typedef struct {
    char arch[64], kernels[OPT_LEN], cuda[OPT_LEN];
    const char *argv[OPT_COUNT];
} NvOptions;

/* sm_ then digits, then at most one lower-case letter */
static int arch_is_real(const char *arch) {
    if (strncmp(arch, "sm_", 3) != 0) return 0;
    const char *p = arch + 3;
    if (*p < '0' || *p > '9') return 0;
    while (*p >= '0' && *p <= '9') p++;
    if (*p >= 'a' && *p <= 'z') p++;
    return *p == '\0' && p - arch < 32;
}

static int nv_options(NvOptions *o, const char *name, const char *arch, char *err, size_t errlen) {
    if (!arch || !arch_is_real(arch)) {
        snprintf(err, errlen, "%s: CUDA arch \"%s\": expected a real target such as sm_80 or sm_90", name,
                 arch ? arch : "(null)");
        return -1;
    }
    const char *kernels = kiln_cuda_kernel_dir(), *home = getenv("CUDA_HOME");
    int n1 = snprintf(o->arch, sizeof o->arch, "--gpu-architecture=%s", arch);
    int n2 = snprintf(o->kernels, sizeof o->kernels, "--include-path=%s", kernels);
    int n3 = home && *home ? snprintf(o->cuda, sizeof o->cuda, "--include-path=%s/include", home)
                           : snprintf(o->cuda, sizeof o->cuda, "--include-path=%s", KILN_CUDA_INCLUDE_DIR);
    if (n1 < 0 || n2 < 0 || n3 < 0 || (size_t)n1 >= sizeof o->arch || (size_t)n2 >= sizeof o->kernels ||
        (size_t)n3 >= sizeof o->cuda) {
        snprintf(err, errlen, "%s: NVRTC include path too long (KILN_CUDA_KERNELS or CUDA_HOME)", name);
        return -1;
    }
    o->argv[0] = o->arch;
    o->argv[1] = "--std=c++17";
    o->argv[2] = "--generate-line-info";
    o->argv[3] = o->kernels;
    o->argv[4] = o->cuda;
    return 0;
}

/* ---- logs ---- */

/* 1 when s is empty or only white space */
static int is_blank(const char *s) {
    for (; *s; s++)
        if (*s != ' ' && *s != '\t' && *s != '\n' && *s != '\r') return 0;
    return 1;
}

/* a line that only points at a column: white space and one '^' */
static int is_caret_line(const char *s, size_t n) {
    int carets = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '^') carets++;
        else if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r') return 0;
    }
    return carets > 0;
}

/* the log on one line (malloc'd): lines trimmed, blank and caret lines
 * dropped, the rest joined by " | "; NULL when out of memory */
static char *fold_log(const char *log) {
    size_t cap = 3 * strlen(log) + 1, at = 0;
    char *out = malloc(cap);
    if (!out) return NULL;
    for (const char *p = log; *p;) {
        const char *end = strchr(p, '\n');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        const char *s = p;
        while (n > 0 && (*s == ' ' || *s == '\t')) s++, n--;
        while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r')) n--;
        if (n > 0 && !is_caret_line(s, n)) {
            if (at > 0) {
                memcpy(out + at, " | ", 3);
                at += 3;
            }
            memcpy(out + at, s, n);
            at += n;
        }
        p = end ? end + 1 : p + strlen(p);
    }
    out[at] = '\0';
    return out;
}

/* err = "NAME: NVRTC WHAT for ARCH: folded log" */
static int log_fail(const char *name, const char *arch, const char *what, const char *log, char *err, size_t errlen) {
    char *folded = fold_log(log);
    snprintf(err, errlen, "%s: NVRTC %s for %s: %s", name, what, arch,
             !folded ? "(log lost: out of memory)" : *folded ? folded : "(empty log)");
    free(folded);
    return -1;
}

static int api_fail(const char *name, const char *call, nvrtcResult r, char *err, size_t errlen) {
    snprintf(err, errlen, "%s: %s: %s", name, call, nvrtcGetErrorString(r));
    return -1;
}

/* the program's log into out->log */
static int get_log(nvrtcProgram prog, const char *name, KilnCubin *out, char *err, size_t errlen) {
    size_t size = 0;
    nvrtcResult r = nvrtcGetProgramLogSize(prog, &size);
    if (r != NVRTC_SUCCESS) return api_fail(name, "nvrtcGetProgramLogSize", r, err, errlen);
    out->log = malloc(size + 1);
    if (!out->log) {
        snprintf(err, errlen, "%s: out of memory for NVRTC's log (%zu bytes)", name, size);
        return -1;
    }
    out->log[0] = '\0';
    if (size > 0) {
        r = nvrtcGetProgramLog(prog, out->log);
        if (r != NVRTC_SUCCESS) return api_fail(name, "nvrtcGetProgramLog", r, err, errlen);
    }
    out->log[size] = '\0';
    return 0;
}

/* the program's cubin into out->data, out->size */
static int get_cubin(nvrtcProgram prog, const char *name, const char *arch, KilnCubin *out, char *err, size_t errlen) {
    size_t size = 0;
    nvrtcResult r = nvrtcGetCUBINSize(prog, &size);
    if (r != NVRTC_SUCCESS) return api_fail(name, "nvrtcGetCUBINSize", r, err, errlen);
    if (size == 0) {
        snprintf(err, errlen, "%s: NVRTC made no cubin for %s", name, arch);
        return -1;
    }
    out->data = malloc(size);
    if (!out->data) {
        snprintf(err, errlen, "%s: out of memory for the cubin (%zu bytes)", name, size);
        return -1;
    }
    r = nvrtcGetCUBIN(prog, (char *)out->data);
    if (r != NVRTC_SUCCESS) return api_fail(name, "nvrtcGetCUBIN", r, err, errlen);
    out->size = size;
    return 0;
}

static int compile_program(nvrtcProgram prog, const NvOptions *o, const char *name, const char *arch, int warnings,
                           KilnCubin *out, char *err, size_t errlen) {
    nvrtcResult r = nvrtcCompileProgram(prog, OPT_COUNT, o->argv);
    if (get_log(prog, name, out, err, errlen)) return -1;
    if (r != NVRTC_SUCCESS) {
        char what[96];
        snprintf(what, sizeof what, "compile failed (%s)", nvrtcGetErrorString(r));
        return log_fail(name, arch, what, out->log, err, errlen);
    }
    if (warnings == KILN_NVRTC_WARNINGS_FAIL && !is_blank(out->log))
        return log_fail(name, arch, "warnings (treated as errors)", out->log, err, errlen);
    return get_cubin(prog, name, arch, out, err, errlen);
}

int kiln_nvrtc_compile(const char *name, const char *src, const char *arch, int warnings, KilnCubin *out, char *err,
                       size_t errlen) {
    memset(out, 0, sizeof *out);
    NvOptions o;
    if (nv_options(&o, name, arch, err, errlen)) return -1;
    nvrtcProgram prog;
    nvrtcResult r = nvrtcCreateProgram(&prog, src, name, 0, NULL, NULL);
    if (r != NVRTC_SUCCESS) return api_fail(name, "nvrtcCreateProgram", r, err, errlen);
    int rc = compile_program(prog, &o, name, arch, warnings, out, err, errlen);
    r = nvrtcDestroyProgram(&prog);
    if (r != NVRTC_SUCCESS && rc == 0) rc = api_fail(name, "nvrtcDestroyProgram", r, err, errlen);
    if (rc) {
        free(out->data);
        out->data = NULL;
        out->size = 0;
    }
    return rc;
}

/* <the kiln binary's directory>/../KILN_CUDA_KERNEL_DIR: build/kiln run from
 * outside the repository still finds the repository's kernels.  "" when
 * /proc/self/exe cannot be read. */
static const char *beside_binary(void) {
    static char dir[4096];
    char exe[4096];
    ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (k <= 0) return "";
    exe[k] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) *slash = 0;
    int n = snprintf(dir, sizeof dir, "%s/../%s", exe, KILN_CUDA_KERNEL_DIR);
    return n > 0 && (size_t)n < sizeof dir ? dir : "";
}

static int is_dir(const char *path) {
    struct stat st;
    return *path && stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static const char *kernel_dir_as_given(void) {
    const char *kernels = getenv("KILN_CUDA_KERNELS");
    if (kernels && *kernels) return kernels;
    if (is_dir(KILN_CUDA_KERNEL_DIR)) return KILN_CUDA_KERNEL_DIR;
    const char *beside = beside_binary();
    return is_dir(beside) ? beside : KILN_CUDA_KERNEL_DIR;
}

/* The directory canonical (realpath), so the NVRTC cache's key, which holds
 * the include path, is the same whichever directory kiln runs from. */
const char *kiln_cuda_kernel_dir(void) {
    static char canon[PATH_MAX];
    const char *dir = kernel_dir_as_given();
    return realpath(dir, canon) ? canon : dir;
}

char *kiln_read_source(const char *path, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    while (buf) {
        len += fread(buf + len, 1, cap - 1 - len, f);
        if (len < cap - 1) break; /* end of file or an error: ferror tells */
        char *grown = realloc(buf, cap * 2);
        if (!grown) free(buf);
        buf = grown;
        cap *= 2;
    }
    int read_err = ferror(f), close_err = fclose(f);
    if (!buf || read_err || close_err) {
        snprintf(err, errlen, "%s: %s", path, !buf ? "out of memory reading the source" : "read error");
        free(buf);
        return NULL;
    }
    buf[len] = '\0';
    return buf;
}

int kiln_nvrtc_compile_file(const char *path, const char *arch, int warnings, KilnCubin *out, char *err,
                            size_t errlen) {
    memset(out, 0, sizeof *out);
    char *src = kiln_read_source(path, err, errlen);
    if (!src) return -1;
    int rc = kiln_nvrtc_compile(path, src, arch, warnings, out, err, errlen);
    free(src);
    return rc;
}

void kiln_cubin_free(KilnCubin *c) {
    free(c->data);
    free(c->log);
    c->data = NULL;
    c->log = NULL;
    c->size = 0;
}

int kiln_nvrtc_options(const char *arch, char *buf, size_t len, char *err, size_t errlen) {
    NvOptions o;
    if (nv_options(&o, "nvrtc", arch, err, errlen)) return -1;
    int major = 0, minor = 0;
    nvrtcResult r = nvrtcVersion(&major, &minor);
    if (r != NVRTC_SUCCESS) return api_fail("nvrtc", "nvrtcVersion", r, err, errlen);
    int n = snprintf(buf, len, "nvrtc %d.%d", major, minor);
    for (int i = 0; i < OPT_COUNT && n >= 0 && (size_t)n < len; i++)
        n += snprintf(buf + n, len - (size_t)n, " %s", o.argv[i]);
    if (n < 0 || (size_t)n >= len) {
        snprintf(err, errlen, "nvrtc: option string longer than %zu bytes", len);
        return -1;
    }
    return 0;
}
