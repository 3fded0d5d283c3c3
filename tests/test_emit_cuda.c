/* test_emit_cuda.c — the CUDA C of the fused kernels (compiler/emit/emit_cuda.c).
 *
 * No GPU is needed.  For models/tiny.lua and a small models/llama.lua, sent
 * through autodiff, optimizer, fuse, schedule and memplan, and for a
 * hand-built group holding every elementwise op (casts to i32 and bf16, a
 * const, an infinite const, scalar and strided broadcasts):
 *
 *   NVRTC     the text compiles for sm_90 and sm_80 with no error and an
 *             empty log (a warning fails the test), and gives a cubin (an
 *             ELF), through the compiler's NVRTC wrapper (nvrtc_compile.h);
 *   kernels   one `extern "C" __global__` kernel per distinct group key
 *             (kgroup.h), named after the first group with that key;
 *   determinism  two generations are byte-identical.
 *
 * The CPU twin.  The same text, with `extern "C"` dropped, is compiled as
 * host C against a shim cuda_bf16.h written here: __global__ and
 * __device__ are nothing, blockIdx/blockDim/threadIdx/gridDim are globals,
 * __nv_bfloat16 is float (so loads and stores are exact and only the math
 * is checked), __float2bfloat16_rn (the rounding of a cast to bf16) rounds
 * to nearest even as the interpreter does, rsqrtf is 1/sqrtf.  A wrapper per
 * kernel runs the grid-stride loop for every (block, thread) of a 3 x 5
 * "launch", one after the other, so the stride logic is exercised too.
 * Every group of the module (groups sharing a kernel each run it with their
 * own buffers and size) is then fed the interpreter's (f32 mode) values of
 * its inputs, its output buffers poisoned with NaN first, and each output
 * must match the interpreter's value: every element written, and
 * max |twin - interp| / max |interp| <= 1e-6 per tensor.  The interpreter
 * computes in double and rounds each op to f32; the twin computes in f32
 * with the C library's expf/tanhf, so a few ulps apart at most.
 */
#include "testutil.h"
#include "graphbuild.h"

#include <dlfcn.h>
#include <errno.h>
#include <sys/wait.h>
#include <unistd.h>

#include "emit.h"
#include "kgroup.h"
#include "nvrtc_compile.h"

static const double TWIN_TOL = 1e-6;

/* ---- modules ---- */

static Module *load_model(const char *path, const char *const *sets, int nsets) {
    Options o;
    opt_defaults(&o);
    o.sets = calloc((size_t)nsets + 1, sizeof(KeyVal));
    assert_non_null(o.sets);
    for (int i = 0; i < nsets; i++) {
        const char *eq = strchr(sets[i], '=');
        o.sets[i] = (KeyVal){strndup(sets[i], (size_t)(eq - sets[i])), eq + 1};
    }
    o.nsets = nsets;
    char err[1024];
    Module *m = fe_load(path, &o, err, sizeof err);
    if (!m) fail_msg("%s", err);
    pass_autodiff(m, &o);
    pass_optimizer(m, &o);
    pass_fuse(m, &o);
    pass_schedule(m, &o);
    pass_memplan(m, &o);
    if (ir_verify_module(m, err, sizeof err) != 0) fail_msg("verify: %s", err);
    for (int i = 0; i < nsets; i++) free((char *)o.sets[i].key);
    free(o.sets);
    return m;
}

static const char *const LLAMA_SETS[] = {"layers=2", "dim=64", "heads=4", "kv_heads=2", "ffn=128", "vocab=256", "seq=32", "batch=2"};

/* Every elementwise op, casts, consts and broadcasts in one group (kernel 0)
 * over [5, 37]; a second group (kernel 1) reads a [5, 1] value broadcast to
 * [5, 37] and a scalar.  Outputs after the groups (groups are contiguous). */
static Module *all_ops_module(void) {
    Bld b = bld_new("allops", "t.lua");
    Type t = TY(DT_F32, 5, 37);
    int x = input(&b, "x", t), dy = input(&b, "dy", t), col = input(&b, "col", TY(DT_F32, 5, 1));
    int s = input(&b, "s", SCALAR);
    static const Op un[] = {OP_neg, OP_exp, OP_tanh, OP_gelu, OP_silu, OP_relu};
    static const Op bw[] = {OP_gelu_bwd, OP_silu_bwd, OP_relu_bwd, OP_add, OP_sub, OP_mul, OP_div};
    int outs[48], nout = 0;
    b.kernel = 0;
    for (size_t i = 0; i < sizeof un / sizeof *un; i++) outs[nout++] = val(&b, un[i], INS(x), NOATS);
    for (size_t i = 0; i < sizeof bw / sizeof *bw; i++) outs[nout++] = val(&b, bw[i], INS(dy, x), NOATS);
    int ex = val(&b, OP_exp, INS(x), NOATS);
    outs[nout++] = val(&b, OP_log, INS(ex), NOATS);
    outs[nout++] = val(&b, OP_sqrt, INS(ex), NOATS);
    outs[nout++] = val(&b, OP_rsqrt, INS(ex), NOATS);
    int ci = val(&b, OP_cast, INS(val(&b, OP_mul, INS(x, cnst(&b, t, 10)), NOATS)), ATS(as(&b, "dtype", "i32")));
    outs[nout++] = ci;
    outs[nout++] = val(&b, OP_cast, INS(ci), ATS(as(&b, "dtype", "f32")));
    int bf = val(&b, OP_cast, INS(x), ATS(as(&b, "dtype", "bf16")));
    outs[nout++] = val(&b, OP_cast, INS(bf), ATS(as(&b, "dtype", "f32")));
    outs[nout++] = val(&b, OP_add, INS(x, bcast(&b, cnst(&b, SCALAR, -INFINITY), t)), NOATS);
    /* issue 17 */
    static const Op un17[] = {OP_sigmoid, OP_abs}, bw17[] = {OP_minimum, OP_maximum, OP_abs_bwd};
    static const Op tern17[] = {OP_where, OP_minimum_bwd, OP_maximum_bwd};
    for (size_t i = 0; i < sizeof un17 / sizeof *un17; i++) outs[nout++] = val(&b, un17[i], INS(x), NOATS);
    for (size_t i = 0; i < sizeof bw17 / sizeof *bw17; i++) outs[nout++] = val(&b, bw17[i], INS(dy, x), NOATS);
    for (size_t i = 0; i < sizeof tern17 / sizeof *tern17; i++) outs[nout++] = val(&b, tern17[i], INS(dy, x, ex), NOATS);
    outs[nout++] = val(&b, OP_pow, INS(x), ATS(af(&b, "p", 1.5)));
    val(&b, OP_tanh, INS(dy), NOATS); /* dead: no output, nothing reads it */
    b.kernel = 1;
    int bc = val(&b, OP_mul, INS(x, bcast(&b, col, t)), NOATS);
    outs[nout++] = val(&b, OP_add, INS(bc, bcast(&b, s, t)), NOATS);
    b.kernel = -1;
    for (int i = 0; i < nout; i++) {
        char name[16];
        snprintf(name, sizeof name, "y%d", i);
        output(&b, outs[i], name);
    }
    return b.m;
}

/* ---- generating the text ---- */

static void write_file(const char *path, const char *text);

static char *cuda_text(const Module *m) {
    char *text = NULL, err[1024];
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    if (emit_cuda_text(m, f, err, sizeof err) != 0) fail_msg("emit_cuda_text: %s", err);
    assert_int_equal(fclose(f), 0);
    assert_non_null(text);
    return text;
}

static int count(const char *text, const char *needle) {
    int n = 0;
    for (const char *p = text; (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

/* ---- NVRTC, through the compiler's wrapper (nvrtc_compile.h) ---- */

/* text compiles for arch with an empty log (warnings fail) into an ELF cubin;
 * the wrapper's own failure and warning paths are tested in test_nvrtc */
static void nvrtc_compile(const char *text, const char *arch, const char *what) {
    KilnCubin c;
    char err[8192];
    if (kiln_nvrtc_compile("kiln_fused.cu", text, arch, KILN_NVRTC_WARNINGS_FAIL, &c, err, sizeof err))
        fail_msg("%s for %s: %s", what, arch, err);
    assert_true(c.size > 4);
    assert_memory_equal(c.data, "\x7f" "ELF", 4);
    printf("# %s: %s cubin %zu bytes\n", what, arch, c.size);
    kiln_cubin_free(&c);
}

/* The text is deterministic, has one kernel per distinct key (each named
 * after its first group) and compiles cleanly for sm_90 and sm_80. */
static void check_text(const Module *m, const char *what) {
    char *text = cuda_text(m), *again = cuda_text(m);
    if (strcmp(text, again) != 0) fail_msg("%s: two generations differ", what);
    const char *dump = getenv("KILN_CUDA_DUMP"); /* a directory: keep the text there as WHAT.cu */
    if (dump) {
        char path[4200];
        snprintf(path, sizeof path, "%s/%s.cu", dump, what);
        write_file(path, text);
    }
    const Graph *g = m->stages[0];
    int *order = kg_program_order(g);
    KGroups kg;
    kg_collect(&kg, g, order, g->nnodes);
    int keys = 0;
    for (int k = 0; k < kg.ngroups; k++) {
        if (kg.groups[k].first != k) continue;
        keys++;
        char sig[96];
        snprintf(sig, sizeof sig, "extern \"C\" __global__ void kiln_%s(", kg.groups[k].name);
        if (count(text, sig) != 1) fail_msg("%s: kernel kiln_%s: %d definitions", what, kg.groups[k].name, count(text, sig));
    }
    assert_true(keys > 0);
    assert_int_equal(count(text, "extern \"C\" __global__ void "), keys);
    printf("# %s: %d groups, %d kernels, %zu bytes of CUDA C\n", what, kg.ngroups, keys, strlen(text));
    kg_free(&kg);
    free(order);
    nvrtc_compile(text, "sm_90", what);
    nvrtc_compile(text, "sm_80", what);
    free(text);
    free(again);
}

static void test_tiny_nvrtc(void **st) {
    Module *m = load_model("models/tiny.lua", NULL, 0);
    check_text(m, "tiny");
    char *text = cuda_text(m);
    assert_non_null(strstr(text, "__restrict__")); /* memplan proves the buffers disjoint */
    free(text);
    ir_free(m);
}

static void test_llama_nvrtc(void **st) {
    Module *m = load_model("models/llama.lua", LLAMA_SETS, 8);
    check_text(m, "llama");
    ir_free(m);
}

static void test_all_ops_nvrtc(void **st) {
    Module *m = all_ops_module();
    check_text(m, "all_ops");
    char *text = cuda_text(m);
    assert_non_null(strstr(text, "__int_as_float((int)0xff800000)")); /* the -inf const */
    assert_null(strstr(text, "__restrict__"));                      /* unplanned: not proven disjoint */
    ir_free(m);
    free(text);
}

/* An error, not a crash, for what the GPU kernels cannot take. */
static void test_unsupported(void **st) {
    Bld b = bld_new("f16", "t.lua");
    int x = input(&b, "x", TY(DT_F16, 4));
    b.kernel = 0;
    int y = val(&b, OP_neg, INS(x), NOATS);
    b.kernel = -1;
    output(&b, y, "y");
    char err[256];
    FILE *f = tmpfile();
    assert_non_null(f);
    assert_int_equal(emit_cuda_text(b.m, f, err, sizeof err), -1);
    assert_non_null(strstr(err, "t.lua:2: neg of a dtype the GPU kernels do not support"));
    assert_int_equal(ftell(f), 0); /* nothing written */
    fclose(f);
    ir_free(b.m);
}

/* ---- the CPU twin ---- */

static const char SHIM[] =
    "/* the CPU twin's cuda_bf16.h (tests/test_emit_cuda.c) */\n"
    "#include <math.h>\n"
    "#include <stdint.h>\n"
    "#include <string.h>\n"
    "#define __global__\n"
    "#define __device__\n"
    "#define __forceinline__\n"
    "#define __align__(n) __attribute__((aligned(n)))\n"
    "typedef float __nv_bfloat16;\n"
    "struct kiln_dim3 { unsigned x, y, z; };\n"
    "struct kiln_dim3 blockIdx, blockDim, threadIdx, gridDim;\n"
    "static inline float __bfloat162float(__nv_bfloat16 x) { return x; }\n"
    "static inline __nv_bfloat16 __float2bfloat16(float x) { return x; }\n"
    "static inline __nv_bfloat16 __float2bfloat16_rn(float x) {\n"
    "    uint32_t u; memcpy(&u, &x, 4);\n"
    "    if ((u & 0x7fffffffu) > 0x7f800000u) return x;\n"
    "    u += 0x7fffu + ((u >> 16) & 1u); u &= 0xffff0000u;\n"
    "    memcpy(&x, &u, 4); return x;\n"
    "}\n"
    "static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }\n"
    "static inline float kiln_twin_rsqrtf(float x) { return 1.0f / sqrtf(x); }\n"
    "#define rsqrtf kiln_twin_rsqrtf\n";

typedef void (*TwinFn)(void *const *args, long long n, unsigned grid, unsigned block);

typedef struct {
    char dir[64];
    void *so;
} Twin;

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) fail_msg("cannot open %s", path);
    assert_int_equal(fputs(text, f) >= 0, 1);
    assert_int_equal(fclose(f), 0);
}

/* text with every `extern "C" ` removed, plus twin_<kernel>(args, n, grid,
 * block) per kernel, running the kernel for every block and thread. */
static char *twin_source(const char *text, const KGroups *kg) {
    char *src = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&src, &len);
    assert_non_null(f);
    const char *drop = "extern \"C\" ";
    for (const char *p = text, *q; *p; p = q + strlen(drop)) {
        q = strstr(p, drop);
        if (!q) {
            fputs(p, f);
            break;
        }
        fwrite(p, 1, (size_t)(q - p), f);
    }
    for (int k = 0; k < kg->ngroups; k++) {
        const KGroup *gr = &kg->groups[k];
        if (gr->first != k) continue;
        fprintf(f, "\nvoid twin_kiln_%s(void *const *a, long long n, unsigned grid, unsigned block) {\n"
                   "    gridDim.x = grid; blockDim.x = block;\n"
                   "    for (unsigned b = 0; b < grid; b++)\n"
                   "        for (unsigned t = 0; t < block; t++) {\n"
                   "            blockIdx.x = b; threadIdx.x = t;\n"
                   "            kiln_%s(",
                gr->name, gr->name);
        for (int s = 0; s < gr->nin + gr->nout; s++) fprintf(f, "a[%d], ", s);
        fprintf(f, "n);\n        }\n}\n");
    }
    assert_int_equal(fclose(f), 0);
    return src;
}

static Twin twin_build(const char *text, const KGroups *kg) {
    Twin t = {.dir = "/tmp/kiln_twin_XXXXXX"};
    if (!mkdtemp(t.dir)) fail_msg("mkdtemp: %s", strerror(errno));
    char path[128], so[128], cmd[512];
    snprintf(path, sizeof path, "%s/cuda_bf16.h", t.dir);
    write_file(path, SHIM);
    char *src = twin_source(text, kg);
    snprintf(path, sizeof path, "%s/twin.c", t.dir);
    write_file(path, src);
    free(src);
    snprintf(so, sizeof so, "%s/twin.so", t.dir);
    snprintf(cmd, sizeof cmd, "cc -std=c11 -O1 -fPIC -shared -I%s -o %s %s -lm", t.dir, so, path);
    int status = system(cmd);
    if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) fail_msg("%s failed (status %d)", cmd, status);
    t.so = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    if (!t.so) fail_msg("dlopen %s: %s", so, dlerror());
    return t;
}

static void twin_free(Twin *t) {
    assert_int_equal(dlclose(t->so), 0);
    const char *files[] = {"cuda_bf16.h", "twin.c", "twin.so"};
    for (int i = 0; i < 3; i++) {
        char path[128];
        snprintf(path, sizeof path, "%s/%s", t->dir, files[i]);
        assert_int_equal(unlink(path), 0);
    }
    assert_int_equal(rmdir(t->dir), 0);
}

static TwinFn twin_fn(const Twin *t, const char *kernel_group) {
    char name[80];
    snprintf(name, sizeof name, "twin_kiln_%s", kernel_group);
    void *p = dlsym(t->so, name);
    if (!p) fail_msg("dlsym %s: %s", name, dlerror());
    TwinFn fn;
    memcpy(&fn, &p, sizeof fn);
    return fn;
}

/* A buffer of n elements of the in-memory type of dt, from d (NULL: poison). */
static void *twin_buffer(DType dt, const double *d, int64_t n) {
    size_t es = dt == DT_I64 ? 8 : 4;
    void *b = malloc(es * (size_t)(n ? n : 1));
    assert_non_null(b);
    for (int64_t i = 0; i < n; i++) {
        if (dt == DT_I32) ((int32_t *)b)[i] = d ? (int32_t)d[i] : INT32_MIN;
        else if (dt == DT_I64) ((int64_t *)b)[i] = d ? (int64_t)d[i] : INT64_MIN;
        else ((float *)b)[i] = d ? (float)d[i] : NAN;
    }
    return b;
}

static double twin_at(DType dt, const void *b, int64_t i) {
    if (dt == DT_I32) return ((const int32_t *)b)[i];
    if (dt == DT_I64) return (double)((const int64_t *)b)[i];
    return ((const float *)b)[i];
}

/* max |got - want| / max |want|; every element must be written (not the
 * poison) and equal infinities and NaNs count as equal. */
static double twin_err(DType dt, const void *got, const Tensor *want, const char *what) {
    double diff = 0, scale = 0;
    for (int64_t i = 0; i < want->n; i++) {
        double a = twin_at(dt, got, i), b = want->d[i];
        if (isnan(b) ? isnan(a) : a == b) continue;
        if (isnan(a) || (dt == DT_I32 && a == INT32_MIN)) fail_msg("%s: element %lld not written (or NaN)", what, (long long)i);
        diff = fmax(diff, fabs(a - b));
        if (isfinite(b)) scale = fmax(scale, fabs(b));
    }
    return diff == 0 ? 0 : diff / fmax(scale, 1e-30);
}

/* Run group k of kg on the twin with the interpreter's inputs; returns the
 * worst error of its outputs. */
static double twin_group(const Twin *t, const KGroups *kg, int k, const Interp *it) {
    const KGroup *gr = &kg->groups[k];
    const Graph *g = kg->g;
    int na = gr->nin + gr->nout;
    void **args = calloc((size_t)na + 1, sizeof(void *));
    assert_non_null(args);
    for (int s = 0; s < na; s++) {
        int vid = s < gr->nin ? gr->in[s] : gr->out[s - gr->nin];
        const Tensor *v = interp_value(it, 0, vid);
        if (!v) fail_msg("%s: the interpreter has no value %%%d", gr->name, vid);
        assert_int_equal(v->n, ir_numel(&g->vals[vid].t));
        args[s] = twin_buffer(g->vals[vid].t.dt, s < gr->nin ? v->d : NULL, v->n);
    }
    twin_fn(t, kg->groups[gr->first].name)(args, ir_numel(&gr->shape), 3, 5);
    double worst = 0;
    for (int s = 0; s < gr->nout; s++) {
        char what[96];
        snprintf(what, sizeof what, "%s output %d (%%%d)", gr->name, s, gr->out[s]);
        double e = twin_err(g->vals[gr->out[s]].t.dt, args[gr->nin + s], interp_value(it, 0, gr->out[s]), what);
        if (!(e <= TWIN_TOL)) printf("# %s: relative error %g\n", what, e);
        worst = fmax(worst, e);
    }
    for (int s = 0; s < na; s++) free(args[s]);
    free(args);
    return worst;
}

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* One interpreter step (f32) of m on random inputs: floats in [-2, 2), ids
 * below their bound. */
static Interp *interp_step(const Module *m, uint64_t seed) {
    const Graph *g = m->stages[0];
    Interp *it = interp_new(m, 0);
    assert_non_null(it);
    interp_init_state(it, seed);
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        if (n->op != OP_input) continue;
        const Type *t = &g->vals[n->out[0]].t;
        int64_t cnt = ir_numel(t), bound = ir_index_bound(g, n->out[0], 100);
        double *d = malloc(sizeof(double) * (size_t)(cnt ? cnt : 1));
        assert_non_null(d);
        for (int64_t k = 0; k < cnt; k++)
            d[k] = ir_dtype_is_float(t->dt) ? -2 + 4 * (double)(splitmix(&seed) >> 11) / 9007199254740992.0
                                            : (double)(splitmix(&seed) % (uint64_t)bound);
        assert_int_equal(interp_set_input(it, 0, ir_attr_s(n, "name", ""), d, cnt), 0);
        free(d);
    }
    char err[1024];
    if (interp_run(it, err, sizeof err) != 0) fail_msg("interp_run: %s", err);
    return it;
}

/* Every group of m on the twin of its CUDA C against the interpreter. */
static void twin_vs_interp(const Module *m, const char *what) {
    const Graph *g = m->stages[0];
    char *text = cuda_text(m);
    int *order = kg_program_order(g);
    KGroups kg;
    kg_collect(&kg, g, order, g->nnodes);
    Twin t = twin_build(text, &kg);
    Interp *it = interp_step(m, 4321);
    double worst = 0;
    int ran = 0;
    for (int k = 0; k < kg.ngroups; k++) {
        if (kg.groups[k].nout == 0) continue;
        worst = fmax(worst, twin_group(&t, &kg, k, it));
        ran++;
    }
    printf("# %s: %d groups on the CPU twin, worst relative error %.3g\n", what, ran, worst);
    if (!(worst <= TWIN_TOL)) fail_msg("%s: twin vs interpreter: relative error %g > %g", what, worst, TWIN_TOL);
    interp_free(it);
    twin_free(&t);
    kg_free(&kg);
    free(order);
    free(text);
}

static void test_tiny_twin(void **st) {
    Module *m = load_model("models/tiny.lua", NULL, 0);
    twin_vs_interp(m, "tiny");
    ir_free(m);
}

static void test_llama_twin(void **st) {
    Module *m = load_model("models/llama.lua", LLAMA_SETS, 8);
    twin_vs_interp(m, "llama");
    ir_free(m);
}

static void test_all_ops_twin(void **st) {
    Module *m = all_ops_module();
    twin_vs_interp(m, "all_ops");
    ir_free(m);
}

/* The twin can fail: a kernel text with a wrong operator is caught. */
static void test_twin_catches_a_bug(void **st) {
    Module *m = all_ops_module();
    char *text = cuda_text(m);
    const Graph *g = m->stages[0];
    int *order = kg_program_order(g);
    KGroups kg;
    kg_collect(&kg, g, order, g->nnodes);
    char *mul = strstr(text, "m1 = x1 * m0;"); /* kernel 1: x * broadcast(col) */
    assert_non_null(mul);
    mul[8] = '+';
    Twin t = twin_build(text, &kg);
    Interp *it = interp_step(m, 4321);
    double e = twin_group(&t, &kg, 1, it);
    printf("# a wrong operator: relative error %g\n", e);
    assert_true(e > 1e-3);
    interp_free(it);
    twin_free(&t);
    kg_free(&kg);
    free(order);
    free(text);
    ir_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_nvrtc),
        cmocka_unit_test(test_llama_nvrtc),
        cmocka_unit_test(test_all_ops_nvrtc),
        cmocka_unit_test(test_unsupported),
        cmocka_unit_test(test_tiny_twin),
        cmocka_unit_test(test_llama_twin),
        cmocka_unit_test(test_all_ops_twin),
        cmocka_unit_test(test_twin_catches_a_bug),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
