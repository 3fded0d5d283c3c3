/* nvrtc_cache.c — NVRTC's cubins kept on disk, keyed by what they depend on.
 *
 * A model's kernels are compiled every time kiln compiles the model, and
 * NVRTC takes about a second per translation unit, so a cubin is cached
 * (issue 8: "compile results cached by a hash of source + options + NVRTC
 * version").  The key is a 128-bit hash (two FNV-1a 64-bit hashes with
 * different bases) of everything the cubin depends on:
 *
 *   kiln_nvrtc_options(arch)   NVRTC's version and the whole option list
 *   the source
 *   every *.cuh of the kernels' include directory, by name, in name order
 *   (what `#include "common.cuh"` can pull in)
 *
 * The entry is DIR/<key>.cubin: a header (magic, the lengths, a third hash
 * of the key material and one of the payload), NVRTC's log, the cubin.  A
 * file that is short, has another magic or fails either hash is a miss and
 * is replaced.  Writes are atomic (a temporary file, fsync, rename), so a
 * crash or a concurrent kiln leaves a whole entry or none.  Only successful
 * compiles are cached; a cached log is judged again under the caller's
 * warning rule, so a hit fails exactly where the compile would.
 *
 * DIR is $KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln/nvrtc, else
 * $HOME/.cache/kiln/nvrtc.  The cache is an optimisation: when DIR cannot
 * be made or written, kiln compiles as if it were empty and says nothing.
 */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "nvrtc_compile.h"

#define MAGIC "KILNCUB1"

static int hits, misses;

void kiln_nvrtc_cache_stats(int *h, int *m) {
    if (h) *h = hits;
    if (m) *m = misses;
}

/* ---- hashing ---- */

typedef struct {
    uint64_t a, b, c;
} Hash;

static void hash_bytes(Hash *h, const void *p, size_t n) {
    const unsigned char *s = p;
    for (size_t i = 0; i < n; i++) {
        h->a = (h->a ^ s[i]) * 0x100000001b3ull;
        h->b = (h->b ^ s[i]) * 0x100000001b3ull;
        h->c = (h->c ^ s[i]) * 0x100000001b3ull;
    }
    /* a separator, so that ("ab", "c") and ("a", "bc") differ */
    h->a = (h->a ^ 0xff) * 0x100000001b3ull, h->b = (h->b ^ 0xfe) * 0x100000001b3ull, h->c = (h->c ^ 0xfd) * 0x100000001b3ull;
}

static Hash hash_new(void) { return (Hash){0xcbf29ce484222325ull, 0x84222325cbf29ce4ull, 0x9e3779b97f4a7c15ull}; }

static uint64_t payload_hash(const void *p, size_t n) {
    Hash h = hash_new();
    hash_bytes(&h, p, n);
    return h.a;
}

static int by_name(const void *x, const void *y) { return strcmp(*(char *const *)x, *(char *const *)y); }

/* every *.cuh of the kernels' directory, in name order; -1 if one cannot be read */
static int hash_headers(Hash *h) {
    const char *dir = kiln_cuda_kernel_dir();
    DIR *d = opendir(dir);
    if (!d) return 0; /* no headers to depend on */
    char **names = NULL;
    int n = 0, rc = 0;
    for (struct dirent *e; (e = readdir(d));) {
        size_t len = strlen(e->d_name);
        if (len < 4 || strcmp(e->d_name + len - 4, ".cuh") != 0) continue;
        char **grown = realloc(names, sizeof *names * (size_t)(n + 1));
        if (!grown || !(grown[n] = strdup(e->d_name))) {
            names = grown ? grown : names;
            rc = -1;
            break;
        }
        names = grown, n++;
    }
    closedir(d);
    if (names) qsort(names, (size_t)n, sizeof *names, by_name);
    for (int i = 0; i < n && rc == 0; i++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        FILE *f = fopen(path, "rb");
        if (!f) { rc = -1; break; }
        hash_bytes(h, names[i], strlen(names[i]));
        char buf[1 << 14];
        for (size_t k; (k = fread(buf, 1, sizeof buf, f)) > 0;) hash_bytes(h, buf, k);
        if (ferror(f)) rc = -1;
        fclose(f);
    }
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
    return rc;
}

/* ---- the directory and the entry ---- */

static int make_dirs(char *path) {
    for (char *p = path + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        int bad = mkdir(path, 0755) != 0 && errno != EEXIST;
        *p = '/';
        if (bad) return -1;
    }
    return mkdir(path, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

static int cache_dir(char *buf, size_t len) {
    const char *dir = getenv("KILN_CACHE_DIR"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int n = dir && *dir ? snprintf(buf, len, "%s", dir)
            : xdg && *xdg ? snprintf(buf, len, "%s/kiln/nvrtc", xdg)
            : home && *home ? snprintf(buf, len, "%s/.cache/kiln/nvrtc", home)
                            : -1;
    if (n < 0 || (size_t)n >= len) return -1;
    return make_dirs(buf);
}

typedef struct {
    char magic[8];
    uint64_t log_len, cubin_len, key_check, payload_check;
} Header;

/* 1 and *out filled when path holds a whole entry for key_check */
static int read_entry(const char *path, uint64_t key_check, KilnCubin *out) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    Header h;
    int ok = fread(&h, sizeof h, 1, f) == 1 && memcmp(h.magic, MAGIC, 8) == 0 && h.key_check == key_check &&
             h.log_len < (1u << 30) && h.cubin_len > 0 && h.cubin_len < (1ull << 34);
    char *log = ok ? malloc(h.log_len + 1) : NULL;
    unsigned char *cubin = ok ? malloc(h.cubin_len) : NULL;
    ok = ok && log && cubin && fread(log, 1, h.log_len, f) == h.log_len && fread(cubin, 1, h.cubin_len, f) == h.cubin_len &&
         fgetc(f) == EOF && payload_hash(cubin, h.cubin_len) == h.payload_check;
    fclose(f);
    if (!ok) {
        free(log), free(cubin);
        return 0;
    }
    log[h.log_len] = 0;
    *out = (KilnCubin){cubin, h.cubin_len, log};
    return 1;
}

static void write_entry(const char *path, uint64_t key_check, const KilnCubin *c) {
    char tmp[4300];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) return;
    const char *log = c->log ? c->log : "";
    Header h = {.log_len = strlen(log), .cubin_len = c->size, .key_check = key_check,
                .payload_check = payload_hash(c->data, c->size)};
    memcpy(h.magic, MAGIC, 8);
    int bad = fwrite(&h, sizeof h, 1, f) != 1 || fwrite(log, 1, h.log_len, f) != h.log_len ||
              fwrite(c->data, 1, c->size, f) != c->size || fflush(f) != 0 || fsync(fileno(f)) != 0;
    if (fclose(f) != 0) bad = 1;
    if (bad || rename(tmp, path) != 0) unlink(tmp);
}

static int log_is_blank(const char *s) {
    for (; s && *s; s++)
        if (*s != ' ' && *s != '\t' && *s != '\n' && *s != '\r') return 0;
    return 1;
}

int kiln_nvrtc_compile_cached(const char *name, const char *src, const char *arch, int warnings, KilnCubin *out,
                              char *err, size_t errlen) {
    char opts[8192], dir[4096], path[4200];
    Hash h = hash_new();
    *out = (KilnCubin){0};
    if (kiln_nvrtc_options(arch, opts, sizeof opts, err, errlen) != 0) return -1;
    hash_bytes(&h, opts, strlen(opts));
    hash_bytes(&h, src, strlen(src));
    int usable = hash_headers(&h) == 0 && cache_dir(dir, sizeof dir) == 0;
    if (usable) snprintf(path, sizeof path, "%s/%016llx%016llx.cubin", dir, (unsigned long long)h.a, (unsigned long long)h.b);
    if (usable && read_entry(path, h.c, out)) {
        hits++;
        if (warnings == KILN_NVRTC_WARNINGS_FAIL && !log_is_blank(out->log)) {
            int n = snprintf(err, errlen, "%s: %s: NVRTC warnings (cached): %s", name, arch, out->log);
            for (int k = 0; k < n && (size_t)k + 1 < errlen; k++)
                if (err[k] == '\n' || err[k] == '\r') err[k] = ' '; /* one line */
            kiln_cubin_free(out);
            return -1;
        }
        return 0;
    }
    misses++;
    if (kiln_nvrtc_compile(name, src, arch, warnings, out, err, errlen) != 0) return -1;
    if (usable) write_entry(path, h.c, out);
    return 0;
}
