/* test_nvrtc.c — the CUDA library kernels compile with NVRTC, cleanly, and
 * match their documented ABI; compiler/emit/nvrtc_compile.c reports failures well.
 *
 * Every .cu file in kernels/cuda is compiled through compiler/emit/nvrtc_compile.c for sm_90
 * and sm_80 (no GPU needed).  Each compile must succeed with an empty log
 * (NVRTC reports warnings only in the log, so a warning fails here) and
 * give a non-empty ELF cubin.
 *
 * kernels/cuda/README.md is the ABI the CUDA runtime will launch the
 * kernels by.  Its kernels and the sources' are both read the same way
 * (every `__global__ void [__launch_bounds__(...)] kiln_NAME(...)`), and
 * must be the same set with the same parameter lists (white space aside);
 * every one must be in the cubins of the file that defines it, for both
 * archs, as a symbol name (the name between NULs in the ELF string table,
 * so kiln_embedding_bwd is not found inside kiln_embedding_bwd_hist).  So
 * the README, the sources and the cubins cannot drift apart.
 *
 * The wrapper's failures: a broken source fails with one line holding the
 * source's name, the arch and NVRTC's error; a warning passes or fails as
 * asked; a virtual or malformed arch and a missing file are one-line
 * errors; the kernels' and CUDA's include directories are really used.
 *
 * Tests run from the repository root (tests/run.sh), where kernels/cuda is.
 */
#include "testutil.h"
#include "nvrtc_compile.h"

#include <errno.h>
#include <glob.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#define KDIR "kernels/cuda"
#define README KDIR "/README.md"
#define NARCH 2
#define MAX_UNITS 32
#define MAX_KERNELS 128

static const char *const ARCHS[NARCH] = {"sm_90", "sm_80"};

/* one .cu file, compiled for each arch */
typedef struct {
    char path[256];
    int rc[NARCH];
    char err[NARCH][8192];
    KilnCubin cubin[NARCH];
} Unit;

static Unit units[MAX_UNITS];
static int n_units;

/* a kernel as declared: its name and parameter list, white space normalised */
typedef struct {
    char name[96];
    char params[1024];
    int unit; /* index in units, for the sources; -1 for the README */
} Decl;

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 20;
    char *buf = malloc(cap);
    size_t n = buf ? fread(buf, 1, cap - 1, f) : 0;
    fclose(f);
    if (buf) buf[n] = '\0';
    return buf;
}

/* ---- setup: compile every unit for every arch ---- */

static int setup(void **state) {
    glob_t g;
    if (glob(KDIR "/*.cu", 0, NULL, &g) != 0) return -1; /* sorted; no files is an error */
    for (size_t i = 0; i < g.gl_pathc && n_units < MAX_UNITS; i++) {
        Unit *u = &units[n_units++];
        snprintf(u->path, sizeof u->path, "%s", g.gl_pathv[i]);
        for (int a = 0; a < NARCH; a++)
            u->rc[a] = kiln_nvrtc_compile_file(u->path, ARCHS[a], KILN_NVRTC_WARNINGS_OK, &u->cubin[a], u->err[a],
                                               sizeof u->err[a]);
    }
    globfree(&g);
    return 0;
}

static int teardown(void **state) {
    for (int i = 0; i < n_units; i++)
        for (int a = 0; a < NARCH; a++) kiln_cubin_free(&units[i].cubin[a]);
    return 0;
}

/* ---- every unit compiles cleanly ---- */

static int is_blank(const char *s) {
    for (; s && *s; s++)
        if (*s != ' ' && *s != '\n' && *s != '\t' && *s != '\r') return 0;
    return 1;
}

static void check_arch(int a) {
    static const char *const want[] = {"adamw", "attention", "embedding", "layernorm", "rmsnorm", "rope", "xent", "xent_fused"};
    for (size_t w = 0; w < sizeof want / sizeof *want; w++) {
        char path[64];
        snprintf(path, sizeof path, KDIR "/%s.cu", want[w]);
        int found = 0;
        for (int i = 0; i < n_units; i++) found |= strcmp(units[i].path, path) == 0;
        if (!found) fail_msg("%s is missing", path);
    }
    for (int i = 0; i < n_units; i++) {
        const Unit *u = &units[i];
        const KilnCubin *c = &u->cubin[a];
        if (u->rc[a] != 0) fail_msg("%s", u->err[a]);
        if (!is_blank(c->log)) fail_msg("%s for %s: NVRTC warnings:\n%s", u->path, ARCHS[a], c->log);
        assert_non_null(c->data);
        assert_true(c->size > 64);
        assert_memory_equal(c->data, "\177ELF", 4);
    }
}

static void test_compile_sm90(void **state) { check_arch(0); }
static void test_compile_sm80(void **state) { check_arch(1); }

/* ---- the README, the sources and the cubins agree ---- */

static int ident_char(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'; }

static const char *skip_space(const char *p) {
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
    return p;
}

/* p at '(': the position after the matching ')', or NULL */
static const char *skip_parens(const char *p) {
    int depth = 0;
    for (; *p; p++) {
        if (*p == '(') depth++;
        else if (*p == ')' && --depth == 0) return p + 1;
    }
    return NULL;
}

/* the text [p, end) with white space runs dropped next to punctuation and
 * made one space between words */
static void normalise(const char *p, const char *end, char *out, size_t len) {
    size_t at = 0;
    char prev = 0;
    while (p < end && at + 2 < len) {
        if (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') {
            p = skip_space(p);
            if (p < end && ident_char(prev) && ident_char(*p)) out[at++] = ' ';
            continue;
        }
        out[at++] = prev = *p++;
    }
    out[at] = '\0';
}

/* every `__global__ void [__launch_bounds__(..)] kiln_NAME(...)` in text */
static int parse_decls(const char *text, int unit, Decl *d, int n, int max) {
    for (const char *p = text; (p = strstr(p, "__global__")) != NULL;) {
        p += strlen("__global__");
        const char *q = skip_space(p);
        if (strncmp(q, "void", 4) != 0 || ident_char(q[4])) continue;
        q = skip_space(q + 4);
        if (strncmp(q, "__launch_bounds__", 17) == 0) {
            q = skip_space(q + 17);
            if (*q != '(' || !(q = skip_parens(q))) continue;
            q = skip_space(q);
        }
        const char *name = q;
        while (ident_char(*q)) q++;
        size_t len = (size_t)(q - name);
        const char *open = skip_space(q);
        if (strncmp(name, "kiln_", 5) != 0 || *open != '(') continue;
        const char *close = skip_parens(open);
        assert_non_null(close);
        assert_true(n < max && len < sizeof d[n].name);
        memcpy(d[n].name, name, len);
        d[n].name[len] = '\0';
        normalise(open, close, d[n].params, sizeof d[n].params);
        d[n].unit = unit;
        n++;
    }
    return n;
}

static const Decl *find_decl(const Decl *d, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (strcmp(d[i].name, name) == 0) return &d[i];
    return NULL;
}

/* name as an ELF string-table entry: preceded and followed by NUL */
static int cubin_has_symbol(const KilnCubin *c, const char *name) {
    size_t len = strlen(name);
    for (size_t i = 1; i + len < c->size; i++)
        if (c->data[i - 1] == '\0' && c->data[i + len] == '\0' && memcmp(c->data + i, name, len) == 0) return 1;
    return 0;
}

static Decl readme[MAX_KERNELS], source[MAX_KERNELS];
static int nr, ns;

/* the README's kernels into readme[nr], the sources' into source[ns] */
static void load_decls(void) {
    char *text = slurp(README);
    if (!text) fail_msg("cannot read %s", README);
    nr = parse_decls(text, -1, readme, 0, MAX_KERNELS);
    free(text);
    ns = 0;
    for (int i = 0; i < n_units; i++) {
        if (!(text = slurp(units[i].path))) fail_msg("cannot read %s", units[i].path);
        ns = parse_decls(text, i, source, ns, MAX_KERNELS);
        free(text);
    }
}

/* 21 kernels today: a parse that finds nothing must not pass */
static void assert_enough_decls(void) {
    if (nr < 21 || ns < 21) fail_msg("found %d kernels in the README and %d in the sources, expected 21 or more", nr, ns);
}

static void test_readme_matches_sources(void **state) {
    load_decls();
    for (int i = 0; i < nr; i++) {
        if (find_decl(readme, i, readme[i].name)) fail_msg("README lists %s twice", readme[i].name);
        const Decl *s = find_decl(source, ns, readme[i].name);
        if (!s) fail_msg("README lists %s, which no .cu defines", readme[i].name);
        if (strcmp(s->params, readme[i].params) != 0)
            fail_msg("%s: README has %s\n%s has %s", readme[i].name, readme[i].params, units[s->unit].path, s->params);
    }
    for (int i = 0; i < ns; i++)
        if (!find_decl(readme, nr, source[i].name)) fail_msg("%s (%s) is not in the README", source[i].name, units[source[i].unit].path);
    assert_enough_decls();
}

static void test_readme_kernels_in_cubins(void **state) {
    load_decls();
    assert_enough_decls();
    int checked = 0;
    for (int i = 0; i < nr; i++) {
        const Decl *s = find_decl(source, ns, readme[i].name);
        if (!s) fail_msg("README lists %s, which no .cu defines", readme[i].name);
        for (int a = 0; a < NARCH; a++) {
            const KilnCubin *c = &units[s->unit].cubin[a];
            if (!c->data) fail_msg("%s: no cubin for %s", units[s->unit].path, ARCHS[a]);
            if (!cubin_has_symbol(c, readme[i].name))
                fail_msg("%s is not in the %s cubin of %s", readme[i].name, ARCHS[a], units[s->unit].path);
            checked++;
        }
    }
    assert_true(checked >= 2 * 21);
    /* the lookup can fail: a prefix of a real name is not a symbol */
    const Decl *s = find_decl(source, ns, "kiln_embedding_bwd_hist");
    assert_non_null(s);
    assert_false(cubin_has_symbol(&units[s->unit].cubin[0], "kiln_embedding_bwd_his"));
    assert_false(cubin_has_symbol(&units[s->unit].cubin[0], "kiln_no_such_kernel"));
}

/* ---- the wrapper's errors ---- */

static void assert_one_line(const char *err, const char *const *want, int n) {
    if (strchr(err, '\n')) fail_msg("error has more than one line: %s", err);
    for (int i = 0; i < n; i++)
        if (!strstr(err, want[i])) fail_msg("error \"%s\" does not contain \"%s\"", err, want[i]);
}

static void test_broken_source(void **state) {
    const char *src = "extern \"C\" __global__ void kiln_broken(float *y) {\n    y[0] = ;\n}\n";
    KilnCubin c;
    char err[4096];
    assert_int_equal(kiln_nvrtc_compile("broken.cu", src, "sm_90", KILN_NVRTC_WARNINGS_OK, &c, err, sizeof err), -1);
    assert_null(c.data);
    assert_non_null(c.log);
    /* the log's first line, e.g. "broken.cu(2): error: expected an expression" */
    char first[512];
    size_t n = strcspn(c.log, "\n");
    assert_true(n > 0 && n < sizeof first);
    memcpy(first, c.log, n);
    first[n] = '\0';
    const char *want[] = {"broken.cu", "sm_90", "broken.cu(2): error", first};
    assert_one_line(err, want, 4);
    kiln_cubin_free(&c);
}

static void test_warning(void **state) {
    const char *src = "extern \"C\" __global__ void kiln_warns(float *y) {\n    int unused;\n    y[0] = 1.0f;\n}\n";
    KilnCubin c;
    char err[4096];
    if (kiln_nvrtc_compile("warns.cu", src, "sm_80", KILN_NVRTC_WARNINGS_OK, &c, err, sizeof err)) fail_msg("%s", err);
    assert_false(is_blank(c.log)); /* a warning, and a cubin all the same */
    assert_non_null(strstr(c.log, "unused"));
    assert_true(c.size > 0);
    kiln_cubin_free(&c);
    assert_int_equal(kiln_nvrtc_compile("warns.cu", src, "sm_80", KILN_NVRTC_WARNINGS_FAIL, &c, err, sizeof err), -1);
    const char *want[] = {"warns.cu", "sm_80", "warning", "unused"};
    assert_one_line(err, want, 4);
    assert_null(c.data);
    kiln_cubin_free(&c);
}

static void test_bad_arch(void **state) {
    const char *src = "extern \"C\" __global__ void kiln_k(float *y) { y[0] = 1.0f; }\n";
    const char *bad[] = {"compute_90", "sm_", "sm_9x0", "", "90", "sm_90 --foo"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        KilnCubin c;
        char err[1024];
        assert_int_equal(kiln_nvrtc_compile("k.cu", src, bad[i], KILN_NVRTC_WARNINGS_FAIL, &c, err, sizeof err), -1);
        const char *want[] = {"k.cu", "arch", bad[i]};
        assert_one_line(err, want, 3);
        assert_null(c.data);
        kiln_cubin_free(&c);
    }
    /* a suffixed real target is accepted */
    KilnCubin c;
    char err[1024];
    if (kiln_nvrtc_compile("k.cu", src, "sm_90a", KILN_NVRTC_WARNINGS_FAIL, &c, err, sizeof err)) fail_msg("%s", err);
    assert_true(c.size > 0);
    kiln_cubin_free(&c);
}

static void test_missing_file(void **state) {
    KilnCubin c;
    char err[1024];
    assert_int_equal(kiln_nvrtc_compile_file(KDIR "/no_such.cu", "sm_90", KILN_NVRTC_WARNINGS_FAIL, &c, err, sizeof err), -1);
    const char *want[] = {KDIR "/no_such.cu", "No such file"};
    assert_one_line(err, want, 2);
    kiln_cubin_free(&c);
}

/* Both include paths are used: a source with no directory in its name (so
 * NVRTC cannot find common.cuh next to it) compiles, and fails when
 * $KILN_CUDA_KERNELS or $CUDA_HOME points elsewhere. */
static int compile_probe(char *err, size_t errlen) {
    const char *src = "#include \"common.cuh\"\n"
                      "extern \"C\" __global__ void kiln_probe(__nv_bfloat16 *y) { kiln_st(y, 0, kiln_nan()); }\n";
    KilnCubin c;
    int rc = kiln_nvrtc_compile("probe.cu", src, "sm_90", KILN_NVRTC_WARNINGS_FAIL, &c, err, errlen);
    kiln_cubin_free(&c);
    return rc;
}

static void with_env(const char *var, const char *value, const char *want_in_err) {
    const char *old = getenv(var);
    char *saved = old ? strdup(old) : NULL;
    char err[4096];
    assert_int_equal(setenv(var, value, 1), 0);
    int rc = compile_probe(err, sizeof err);
    assert_int_equal(saved ? setenv(var, saved, 1) : unsetenv(var), 0);
    free(saved);
    assert_int_equal(rc, -1);
    const char *want[] = {"probe.cu", want_in_err};
    assert_one_line(err, want, 2);
}

static void test_include_paths(void **state) {
    char err[4096];
    if (compile_probe(err, sizeof err)) fail_msg("%s", err);
    with_env("KILN_CUDA_KERNELS", "/nonexistent/kiln", "common.cuh");
    with_env("CUDA_HOME", "/nonexistent/cuda", "cuda_bf16.h");
}

static void test_options(void **state) {
    char buf[16384], err[1024];
    if (kiln_nvrtc_options("sm_80", buf, sizeof buf, err, sizeof err)) fail_msg("%s", err);
    char dir[PATH_MAX], inc[PATH_MAX + 32]; /* the kernel directory, canonical (the cache key is cwd-independent) */
    if (!realpath(KILN_CUDA_KERNEL_DIR, dir)) fail_msg("realpath %s: %s", KILN_CUDA_KERNEL_DIR, strerror(errno));
    snprintf(inc, sizeof inc, "--include-path=%s", dir);
    const char *want[] = {"nvrtc ", "--gpu-architecture=sm_80", inc, "--std=c++17"};
    for (int i = 0; i < 4; i++)
        if (!strstr(buf, want[i])) fail_msg("options \"%s\" lack \"%s\"", buf, want[i]);
    assert_int_equal(kiln_nvrtc_options("sm_80", buf, 8, err, sizeof err), -1); /* too small a buffer */
    assert_int_equal(kiln_nvrtc_options("compute_80", buf, sizeof buf, err, sizeof err), -1);
}

/* ---- the on-disk cache (nvrtc_cache.c) ---- */

static int count_entries(const char *dir) {
    char pat[4200];
    snprintf(pat, sizeof pat, "%s/*.cubin", dir);
    glob_t g;
    int n = glob(pat, 0, NULL, &g) == 0 ? (int)g.gl_pathc : 0;
    globfree(&g);
    return n;
}

static void cached(const char *src, const char *arch, int warnings, KilnCubin *c, int want_rc, int want_hit) {
    char err[4096];
    int h0, m0, h1, m1;
    kiln_nvrtc_cache_stats(&h0, &m0);
    int rc = kiln_nvrtc_compile_cached("cached.cu", src, arch, warnings, c, err, sizeof err);
    kiln_nvrtc_cache_stats(&h1, &m1);
    if (rc != want_rc) fail_msg("rc %d, want %d: %s", rc, want_rc, err);
    if (h1 - h0 != want_hit || m1 - m0 != !want_hit) fail_msg("hits +%d misses +%d, want a %s", h1 - h0, m1 - m0, want_hit ? "hit" : "miss");
}

/* A miss compiles and stores, a hit returns the same bytes; the key follows
 * the arch, the source and the kernels' headers; a damaged entry is a miss
 * that repairs it; a cached warning fails under WARNINGS_FAIL. */
static void test_cache(void **state) {
    char dir[] = "/tmp/kiln_nvrtc_cache_XXXXXX", kdir[] = "/tmp/kiln_nvrtc_kern_XXXXXX", cmd[9000];
    assert_non_null(mkdtemp(dir));
    assert_non_null(mkdtemp(kdir));
    snprintf(cmd, sizeof cmd, "cp %s/common.cuh %s/", KILN_CUDA_KERNEL_DIR, kdir);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(setenv("KILN_CACHE_DIR", dir, 1), 0);
    assert_int_equal(setenv("KILN_CUDA_KERNELS", kdir, 1), 0);
    const char *src = "#include \"common.cuh\"\nextern \"C\" __global__ void kiln_c(float *y) { y[0] = 2.0f; }\n";
    KilnCubin a, b, d;
    char err[4096];
    cached(src, "sm_90", KILN_NVRTC_WARNINGS_FAIL, &a, 0, 0);
    assert_int_equal(count_entries(dir), 1);
    cached(src, "sm_90", KILN_NVRTC_WARNINGS_FAIL, &b, 0, 1);
    assert_int_equal(a.size, b.size);
    assert_memory_equal(a.data, b.data, a.size);
    if (kiln_nvrtc_compile("cached.cu", src, "sm_90", KILN_NVRTC_WARNINGS_FAIL, &d, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(d.size, a.size); /* what NVRTC itself makes */
    assert_memory_equal(d.data, a.data, a.size);
    kiln_cubin_free(&a), kiln_cubin_free(&b), kiln_cubin_free(&d);
    cached(src, "sm_80", KILN_NVRTC_WARNINGS_FAIL, &a, 0, 0); /* another arch: another entry */
    kiln_cubin_free(&a);
    const char *src2 = "#include \"common.cuh\"\nextern \"C\" __global__ void kiln_c(float *y) { y[0] = 3.0f; }\n";
    cached(src2, "sm_90", KILN_NVRTC_WARNINGS_FAIL, &a, 0, 0);
    kiln_cubin_free(&a);
    assert_int_equal(count_entries(dir), 3);
    snprintf(cmd, sizeof cmd, "echo '// changed' >> %s/common.cuh", kdir); /* a header changes: a miss */
    assert_int_equal(system(cmd), 0);
    cached(src, "sm_90", KILN_NVRTC_WARNINGS_FAIL, &a, 0, 0);
    kiln_cubin_free(&a);
    assert_int_equal(count_entries(dir), 4);
    snprintf(cmd, sizeof cmd, "for f in %s/*.cubin; do head -c 100 \"$f\" > \"$f.cut\" && mv \"$f.cut\" \"$f\"; done", dir);
    assert_int_equal(system(cmd), 0); /* every entry damaged: a miss that rewrites it */
    cached(src, "sm_90", KILN_NVRTC_WARNINGS_FAIL, &a, 0, 0);
    cached(src, "sm_90", KILN_NVRTC_WARNINGS_FAIL, &b, 0, 1);
    assert_memory_equal(a.data, b.data, a.size);
    kiln_cubin_free(&a), kiln_cubin_free(&b);
    const char *warns = "extern \"C\" __global__ void kiln_w(float *y) {\n    int unused;\n    y[0] = 1.0f;\n}\n";
    cached(warns, "sm_80", KILN_NVRTC_WARNINGS_OK, &a, 0, 0);
    kiln_cubin_free(&a);
    cached(warns, "sm_80", KILN_NVRTC_WARNINGS_FAIL, &a, -1, 1); /* the stored log still counts */
    assert_null(a.data);
    assert_int_equal(unsetenv("KILN_CUDA_KERNELS"), 0);
    assert_int_equal(setenv("KILN_CACHE_DIR", "/proc/kiln-no-such-dir", 1), 0); /* unusable: just compiles */
    cached(src, "sm_90", KILN_NVRTC_WARNINGS_FAIL, &a, 0, 0);
    kiln_cubin_free(&a);
    assert_int_equal(unsetenv("KILN_CACHE_DIR"), 0);
    snprintf(cmd, sizeof cmd, "rm -rf %s %s", dir, kdir);
    assert_int_equal(system(cmd), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_compile_sm90),
        cmocka_unit_test(test_compile_sm80),
        cmocka_unit_test(test_readme_matches_sources),
        cmocka_unit_test(test_readme_kernels_in_cubins),
        cmocka_unit_test(test_broken_source),
        cmocka_unit_test(test_warning),
        cmocka_unit_test(test_bad_arch),
        cmocka_unit_test(test_missing_file),
        cmocka_unit_test(test_include_paths),
        cmocka_unit_test(test_options),
        cmocka_unit_test(test_cache),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
