/* test_checkpoint.c — safetensors reading (runtime/io/safetensors.c) and
 * checkpoints (runtime/io/checkpoint.c).
 *
 * The strict header parser against hand-written files, each malformed one
 * giving one line that names the file and the field.  Checkpoints of a real
 * program: a small tiny-GPT (models/tiny.lua, --set to shrink it) JIT'd
 * once for the whole file.  A round trip restores params, states and the
 * trainer's state bit-identically (and one more step gives the same loss and
 * the same state bit for bit); keep-last-K; resume falls back past a
 * truncated and a corrupt newest; each bad file gives one line and leaves
 * the program untouched; an unwritable directory; Hugging Face names; --init;
 * and kill -9 in the middle of a write (the fault hook, in a forked child).
 */
#include "testutil.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "checkpoint.h"
#include "emit.h"
#include "kiln_rt.h"
#include "safetensors.h"

/* ---- helpers ---- */

/* Buffers the helpers hand out (snapshots, temp dir names) live until the
 * test ends: free_owned runs as every test's teardown. */
static void *owned[1024];
static int nowned;

static void *own(void *p) {
    assert_non_null(p);
    assert_true(nowned < 1024);
    return owned[nowned++] = p;
}

static int free_owned(void **st) {
    (void)st;
    while (nowned) free(owned[--nowned]);
    return 0;
}

static char *tmpdir(void) {
    char t[] = "/tmp/kiln-ckpt-XXXXXX";
    char *d = mkdtemp(t);
    assert_non_null(d);
    return own(strdup(d));
}

static void rm_rf(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char p[4096];
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            unlink(p);
        }
    closedir(d);
    rmdir(dir);
}

static int exists(const char *path) { return access(path, F_OK) == 0; }

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc(*n + 1);
    assert_int_equal(fread(b, 1, *n, f), *n);
    fclose(f);
    return b;
}

static void spit(const char *path, const void *b, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

/* A safetensors file from a header string and data bytes. */
static void write_raw(const char *path, const char *header, size_t data_len) {
    size_t h = strlen(header);
    char *b = calloc(8 + h + data_len + 1, 1);
    uint64_t le = h;
    memcpy(b, &le, 8);
    memcpy(b + 8, header, h);
    spit(path, b, 8 + h + data_len);
    free(b);
}

static void assert_one_line(const char *err, const char *want) {
    if (!strstr(err, want)) fail_msg("error \"%s\" does not contain \"%s\"", err, want);
    assert_null(strchr(err, '\n'));
}

/* ---- the safetensors reader ---- */

static void test_reader_accepts_valid(void **st) {
    char *d = tmpdir(), path[4096];
    snprintf(path, sizeof path, "%s/a.safetensors", d);
    write_raw(path, "{\"__metadata__\":{\"model\":\"m\"} , \"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                    "\"b\":{\"data_offsets\":[8,8],\"shape\":[0,3],\"dtype\":\"I64\"},\"c\":{\"dtype\":\"U64\",\"shape\":[],\"data_offsets\":[8,16]}}   ", 16);
    StFile f;
    char err[512];
    if (st_open(&f, path, err, sizeof err) != 0) fail_msg("%s", err);
    assert_int_equal(f.n, 3);
    assert_string_equal(st_meta(&f, "model"), "m");
    const StEntry *c = st_find(&f, "c");
    assert_non_null(c);
    assert_int_equal(c->dtype, ST_U64);
    assert_int_equal(c->rank, 0);
    assert_int_equal(st_find(&f, "b")->shape[1], 3);
    st_close(&f);
    rm_rf(d);
}

static void test_writer_reader_round_trip(void **st) {
    char *d = tmpdir(), path[4096], err[512];
    snprintf(path, sizeof path, "%s/w.safetensors", d);
    StWriter *w = st_new();
    int64_t shape[2] = {2, 3};
    double x[6] = {1, 2, 3, 4, 5, 6};
    uint64_t u = 0xfedcba9876543210ull;
    st_add_meta(w, "note", "a \"quoted\" \\ value\n");
    st_add_f32(w, "we\"ird\\name", shape, 2, x);
    st_add_i32(w, "ids", shape, 2, x);
    st_add_raw(w, "u", ST_U64, NULL, 0, &u);
    assert_int_equal(st_write(w, path, err, sizeof err), 0);
    StFile f;
    if (st_open(&f, path, err, sizeof err) != 0) fail_msg("%s", err);
    assert_string_equal(st_meta(&f, "note"), "a \"quoted\" \\ value\n");
    const StEntry *e = st_find(&f, "we\"ird\\name");
    assert_non_null(e);
    assert_true(((const float *)st_data(&f, e))[5] == 6.0f);
    assert_int_equal(((const int32_t *)st_data(&f, st_find(&f, "ids")))[4], 5);
    uint64_t v;
    memcpy(&v, st_data(&f, st_find(&f, "u")), 8);
    assert_true(v == u);
    assert_int_equal((8 + (f.data - (const unsigned char *)f.map - 8)) % 8, 0); /* data 8-aligned */
    st_close(&f);
    rm_rf(d);
}

static void test_reader_rejects_malformed(void **st) {
    static const struct {
        const char *header;
        size_t data;
        const char *want;
    } cases[] = {
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, "needs 12 bytes"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, "overlap"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, "gap"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 12, "trailing bytes"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, "truncated"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, "end before they begin"},
        {"{\"a\":{\"dtype\":\"F31\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "unknown dtype \"F31\""},
        {"{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8, "missing field \"shape\""},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}}", 8, "unknown field \"x\""},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, "non-negative integer (tensor \"a\" shape)"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", 8, "expected an integer"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8, "data_offsets needs 2"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}} x", 8, "unexpected bytes after"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,8]}}", 8, "appears twice"},
        {"{\"__metadata__\":{\"k\":1}}", 0, "metadata values are strings"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}", 8, "expected ',' or '}'"},
        {"{\"a\x01\":{}}", 0, "control character in a string (in the header)"},
        {"{\"a\":[]}", 0, "expected '{' for tensor \"a\", found '['"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999],\"data_offsets\":[0,8]}}", 8, "too large"},
        {"[1,2]", 0, "does not start with '{'"},
    };
    char *d = tmpdir(), path[4096], err[512];
    snprintf(path, sizeof path, "%s/bad.safetensors", d);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_raw(path, cases[i].header, cases[i].data);
        StFile f;
        err[0] = 0;
        if (st_open(&f, path, err, sizeof err) == 0) fail_msg("case %zu accepted: %s", i, cases[i].header);
        assert_non_null(strstr(err, path)); /* names the file */
        assert_one_line(err, cases[i].want);
        assert_null(f.t);
    }
    /* not safetensors at all: the length word is text */
    spit(path, "hello, this is not a safetensors file", 37);
    StFile f;
    assert_int_equal(st_open(&f, path, err, sizeof err), -1);
    assert_one_line(err, "does not fit the file");
    spit(path, "abc", 3);
    assert_int_equal(st_open(&f, path, err, sizeof err), -1);
    assert_one_line(err, "too short");
    rm_rf(d);
}

/* ---- a real program: a small tiny-GPT ---- */

typedef struct {
    Module *m;
    Jit *jit;
    const rt_program *p;
} Prog;

static Prog G;

static int compile_tiny(const char *const (*sets)[2], int nsets) {
    Options o;
    opt_defaults(&o);
    KeyVal kv[8];
    for (int i = 0; i < nsets; i++) kv[i] = (KeyVal){sets[i][0], sets[i][1]};
    o.sets = kv;
    o.nsets = nsets;
    char err[1024];
    G.m = fe_load("models/tiny.lua", &o, err, sizeof err);
    if (!G.m) { fprintf(stderr, "%s\n", err); return -1; }
    pass_autodiff(G.m, &o);
    pass_optimizer(G.m, &o);
    pass_fuse(G.m, &o);
    pass_schedule(G.m, &o);
    pass_memplan(G.m, &o);
    G.jit = emit_jit(G.m, &G.p, err, sizeof err);
    if (!G.jit) { fprintf(stderr, "%s\n", err); return -1; }
    return 0;
}

static int setup(void **st) {
    static const char *const sets[][2] = {{"batch", "2"}, {"seq", "16"}, {"dim", "32"}, {"heads", "2"}};
    return compile_tiny(sets, 4);
}

static int teardown(void **st) {
    emit_jit_free(G.jit);
    ir_free(G.m);
    return 0;
}

static rt_ctx *ctx_new(uint64_t seed) {
    rt_options o = {.threads = 2};
    rt_ctx *c = rt_new(G.p, &o);
    assert_non_null(c);
    rt_init_params(c, seed);
    return c;
}

static const rt_tensor *find(const rt_tensor *t, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (strcmp(t[i].name, name) == 0) return &t[i];
    fail_msg("no tensor %s", name);
    return NULL;
}

static size_t nbytes(const rt_tensor *t) {
    size_t n = 4;
    for (int i = 0; i < t->rank; i++) n *= (size_t)t->dim[i];
    return n;
}

/* The inputs: a batch fixed by k. */
static void fill_batch(rt_ctx *c, int k) {
    const rt_tensor *tok = find(G.p->inputs, G.p->ninputs, "tokens"), *tgt = find(G.p->inputs, G.p->ninputs, "targets");
    int32_t *a = rt_tensor_ptr(c, tok), *b = rt_tensor_ptr(c, tgt);
    for (int64_t i = 0; i < tok->dim[0] * tok->dim[1]; i++) a[i] = (int32_t)((i * 7 + k * 13) % 256), b[i] = (int32_t)((i * 5 + k * 3 + 1) % 256);
}

/* One training step on batch k; the loss's bits. */
static uint32_t step(rt_ctx *c, int k) {
    fill_batch(c, k);
    char err[512];
    if (rt_step(c, err, sizeof err) != 0) fail_msg("rt_step: %s", err);
    uint32_t bits;
    memcpy(&bits, rt_tensor_ptr(c, find(G.p->outputs, G.p->noutputs, "loss")), 4);
    return bits;
}

/* Params and states of the program, tensor by tensor. */
typedef struct {
    char *b;
    size_t n;
} Snap;

static Snap snap(rt_ctx *c) {
    Snap s = {0};
    for (int i = 0; i < G.p->nparams; i++) s.n += nbytes(&G.p->params[i]);
    for (int i = 0; i < G.p->nstates; i++) s.n += nbytes(&G.p->states[i]);
    s.b = own(malloc(s.n));
    size_t k = 0;
    for (int i = 0; i < G.p->nparams; i++) memcpy(s.b + k, rt_tensor_ptr(c, &G.p->params[i]), nbytes(&G.p->params[i])), k += nbytes(&G.p->params[i]);
    for (int i = 0; i < G.p->nstates; i++) memcpy(s.b + k, rt_tensor_ptr(c, &G.p->states[i]), nbytes(&G.p->states[i])), k += nbytes(&G.p->states[i]);
    return s;
}

static void assert_snap_equal(Snap a, Snap b, const char *what) {
    assert_int_equal(a.n, b.n);
    if (memcmp(a.b, b.b, a.n) != 0) fail_msg("%s: params/states differ", what);
}

static void assert_snap_differ(Snap a, Snap b) { assert_true(memcmp(a.b, b.b, a.n) != 0); }

static const CkptExtra X = {3, 0x0123456789abcdefull, 77};

/* A trained context (3 steps from seed 1) saved as step 3 in dir. */
static rt_ctx *trained_and_saved(const char *dir, int steps) {
    rt_ctx *c = ctx_new(1);
    for (int k = 0; k < steps; k++) step(c, k);
    char err[1024];
    CkptExtra x = X;
    x.step = steps;
    if (ckpt_save(c, G.p, dir, &x, 0, err, sizeof err) != 0) fail_msg("ckpt_save: %s", err);
    return c;
}

static void test_round_trip_is_exact(void **st) {
    char *d = tmpdir(), path[4096], err[1024];
    rt_ctx *a = trained_and_saved(d, 3);
    Snap sa = snap(a);
    uint32_t la = step(a, 3);
    Snap sa2 = snap(a);

    rt_ctx *b = ctx_new(2);
    assert_snap_differ(snap(b), sa);
    CkptExtra x = {0};
    ckpt_path(path, sizeof path, d, 3);
    if (ckpt_load(b, G.p, path, &x, err, sizeof err) != 0) fail_msg("%s", err);
    assert_snap_equal(snap(b), sa, "after load");
    assert_int_equal(x.step, 3);
    assert_true(x.rng == X.rng);
    assert_int_equal(x.data_pos, 77);
    uint32_t lb = step(b, 3);
    assert_int_equal(la, lb); /* bit-identical loss */
    assert_snap_equal(snap(b), sa2, "after one more step");
    rt_free(a);
    rt_free(b);
    rm_rf(d);
}

static void test_gpt2_names_are_hugging_face(void **st) {
    char *d = tmpdir(), path[4096], err[1024];
    rt_ctx *a = trained_and_saved(d, 1);
    ckpt_path(path, sizeof path, d, 1);
    StFile f;
    if (st_open(&f, path, err, sizeof err) != 0) fail_msg("%s", err);
    assert_non_null(st_find(&f, "transformer.wte.weight"));
    assert_non_null(st_find(&f, "transformer.h.0.attn.c_attn.weight"));
    assert_non_null(st_find(&f, "transformer.h.1.mlp.c_proj.bias"));
    assert_non_null(st_find(&f, "transformer.ln_f.weight"));
    assert_non_null(st_find(&f, "opt.m.transformer.h.0.attn.c_attn.weight"));
    assert_non_null(st_find(&f, "opt.v.transformer.wpe.weight"));
    assert_non_null(st_find(&f, "opt.step"));
    assert_non_null(st_find(&f, "trainer.rng"));
    assert_null(st_find(&f, "wte.weight"));
    assert_int_equal(f.n, G.p->nparams + G.p->nstates + 3);
    assert_string_equal(st_meta(&f, "model"), G.p->model);
    assert_string_equal(st_meta(&f, "format"), "kiln-checkpoint-1");
    const StEntry *e = st_find(&f, "transformer.h.0.attn.c_attn.weight");
    assert_int_equal(e->rank, 2);
    assert_int_equal(e->shape[0], 32);
    assert_int_equal(e->shape[1], 96); /* [in, out], as HF's Conv1D */
    st_close(&f);
    rt_free(a);
    rm_rf(d);
}

static void test_keep_last_k(void **st) {
    char *d = tmpdir(), path[4096], err[1024];
    rt_ctx *c = ctx_new(1);
    snprintf(path, sizeof path, "%s/notes.txt", d);
    spit(path, "x", 1);
    snprintf(path, sizeof path, "%s/step_00000009.safetensors.tmp.1", d); /* a stale temp file */
    spit(path, "x", 1);
    for (int s = 1; s <= 5; s++) {
        CkptExtra x = {s, 1, 0};
        if (ckpt_save(c, G.p, d, &x, 2, err, sizeof err) != 0) fail_msg("%s", err);
    }
    for (int s = 1; s <= 5; s++) {
        ckpt_path(path, sizeof path, d, s);
        if (exists(path) != (s >= 4)) fail_msg("step %d: exists=%d", s, exists(path));
    }
    snprintf(path, sizeof path, "%s/notes.txt", d);
    assert_true(exists(path));
    /* keep <= 0 keeps everything */
    for (int s = 6; s <= 7; s++) {
        CkptExtra x = {s, 1, 0};
        assert_int_equal(ckpt_save(c, G.p, d, &x, 0, err, sizeof err), 0);
    }
    for (int s = 4; s <= 7; s++) ckpt_path(path, sizeof path, d, s), assert_true(exists(path));
    /* keep 1 deletes all older ones */
    CkptExtra x = {8, 1, 0};
    assert_int_equal(ckpt_save(c, G.p, d, &x, 1, err, sizeof err), 0);
    for (int s = 1; s <= 7; s++) ckpt_path(path, sizeof path, d, s), assert_false(exists(path));
    ckpt_path(path, sizeof path, d, 8);
    assert_true(exists(path));
    rt_free(c);
    rm_rf(d);
}

/* A saved context per step 1..3, their snapshots in s[1..3]. */
static void three_checkpoints(const char *d, Snap *s) {
    rt_ctx *c = ctx_new(1);
    char err[1024];
    for (int k = 1; k <= 3; k++) {
        step(c, k);
        CkptExtra x = {k, 100 + (uint64_t)k, 10 * k};
        if (ckpt_save(c, G.p, d, &x, 5, err, sizeof err) != 0) fail_msg("%s", err);
        s[k] = snap(c);
    }
    rt_free(c);
}

static void corrupt_header(const char *path) {
    size_t n;
    char *b = slurp(path, &n);
    char *at = strstr(b + 8, "\"dtype\"");
    assert_non_null(at);
    at[5] = 'f'; /* "dtypf": an unknown field */
    spit(path, b, n);
    free(b);
}

static void test_resume_falls_back(void **st) {
    char *d = tmpdir(), path[4096], used[4096], err[1024];
    Snap s[4];
    three_checkpoints(d, s);
    rt_ctx *c = ctx_new(9);
    CkptExtra x;
    assert_int_equal(ckpt_resume(c, G.p, d, &x, used, sizeof used, err, sizeof err), 0);
    ckpt_path(path, sizeof path, d, 3);
    assert_string_equal(used, path);
    assert_snap_equal(snap(c), s[3], "resume newest");
    assert_int_equal(x.step, 3);
    assert_int_equal(x.data_pos, 30);
    /* truncate the newest: resume takes step 2 */
    assert_int_equal(truncate(path, 1000), 0);
    rt_ctx *c2 = ctx_new(9);
    assert_int_equal(ckpt_resume(c2, G.p, d, &x, used, sizeof used, err, sizeof err), 0);
    ckpt_path(path, sizeof path, d, 2);
    assert_string_equal(used, path);
    assert_snap_equal(snap(c2), s[2], "resume past a truncated newest");
    assert_true(x.rng == 102);
    /* and a corrupt header on step 2: step 1 */
    corrupt_header(path);
    rt_ctx *c3 = ctx_new(9);
    assert_int_equal(ckpt_resume(c3, G.p, d, &x, used, sizeof used, err, sizeof err), 0);
    ckpt_path(path, sizeof path, d, 1);
    assert_string_equal(used, path);
    assert_snap_equal(snap(c3), s[1], "resume past a corrupt header");
    /* nothing valid: -1, one line naming the newest's problem, state untouched */
    corrupt_header(path);
    rt_ctx *c4 = ctx_new(9);
    Snap before = snap(c4);
    assert_int_equal(ckpt_resume(c4, G.p, d, &x, used, sizeof used, err, sizeof err), -1);
    assert_one_line(err, "no valid checkpoint among 3");
    assert_one_line(err, "step_00000003.safetensors");
    assert_snap_equal(snap(c4), before, "failed resume");
    /* an empty directory: 1; a missing one: -1 */
    char *e = tmpdir();
    assert_int_equal(ckpt_resume(c4, G.p, e, &x, used, sizeof used, err, sizeof err), 1);
    assert_one_line(err, "no checkpoint");
    rm_rf(e);
    assert_int_equal(ckpt_resume(c4, G.p, e, &x, used, sizeof used, err, sizeof err), -1);
    assert_one_line(err, "cannot read the checkpoint directory");
    rt_free(c);
    rt_free(c2);
    rt_free(c3);
    rt_free(c4);
    rm_rf(d);
}

/* Copy src to dst through the writer, changing one tensor: drop it, rename
 * it, give it a flat shape, call it I32, or (add) append a new tensor. */
enum { DROP, RENAME, FLATTEN, RETYPE, ADD };
static void rewrite(const char *src, const char *dst, const char *name, int how) {
    StFile f;
    char err[1024];
    if (st_open(&f, src, err, sizeof err) != 0) fail_msg("%s", err);
    StWriter *w = st_new();
    int hit = 0;
    for (int i = 0; i < f.n; i++) {
        const StEntry *e = &f.t[i];
        int64_t numel = 1;
        for (int k = 0; k < e->rank; k++) numel *= e->shape[k];
        if (strcmp(e->name, name) != 0) { st_add_view(w, e->name, e->dtype, e->shape, e->rank, st_data(&f, e)); continue; }
        hit = 1;
        if (how == DROP) continue;
        if (how == RENAME) st_add_view(w, "transformer.ln_f.bais", e->dtype, e->shape, e->rank, st_data(&f, e));
        if (how == FLATTEN) st_add_view(w, e->name, e->dtype, &numel, 1, st_data(&f, e));
        if (how == RETYPE) st_add_view(w, e->name, ST_I32, e->shape, e->rank, st_data(&f, e));
        if (how == ADD) {
            st_add_view(w, e->name, e->dtype, e->shape, e->rank, st_data(&f, e));
            st_add_view(w, "extra.weight", e->dtype, e->shape, e->rank, st_data(&f, e));
        }
    }
    assert_true(hit);
    if (st_write(w, dst, err, sizeof err) != 0) fail_msg("%s", err);
    st_close(&f);
}

static void test_load_errors_leave_state_untouched(void **st) {
    char *d = tmpdir(), good[4096], bad[4096], err[1024];
    rt_ctx *a = trained_and_saved(d, 2);
    ckpt_path(good, sizeof good, d, 2);
    snprintf(bad, sizeof bad, "%s/bad.safetensors", d);
    rt_ctx *c = ctx_new(5);
    step(c, 0);
    Snap before = snap(c);
    CkptExtra x = {-1, 0, -1};
    size_t n;
    char *bytes = slurp(good, &n);

    struct { const char *what, *want; } cases[] = {
        {"missing file", "cannot open"},
        {"garbage", "does not fit the file"},
        {"wrong magic", "not a safetensors file"},
        {"truncated data", "truncated file?"},
        {"missing tensor", "missing tensor \"h.1.ln_2.weight\" (shape [32]"},
        {"wrong shape", "tensor \"transformer.h.0.attn.c_attn.weight\": shape [3072] in the file, [32,96] in the model"},
        {"name mismatch", "missing tensor \"ln_f.bias\" (shape [32] in model tiny); the file has an unexpected tensor \"transformer.ln_f.bais\""},
        {"wrong dtype", "tensor \"opt.step\": dtype I32 in the file, F32 in the model"},
        {"extra tensor", "unexpected tensor \"extra.weight\""},
        {"missing trainer state", "missing tensor \"trainer.rng\""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        unlink(bad);
        switch (i) {
        case 0: break;
        case 1: spit(bad, "garbage garbage garbage garbage", 31); break;
        case 2: { char *b = malloc(n); memcpy(b, bytes, n); b[8] = '['; spit(bad, b, n); free(b); break; }
        case 3: spit(bad, bytes, n - 100); break;
        case 4: rewrite(good, bad, "transformer.h.1.ln_2.weight", DROP); break;
        case 5: rewrite(good, bad, "transformer.h.0.attn.c_attn.weight", FLATTEN); break;
        case 6: rewrite(good, bad, "transformer.ln_f.bias", RENAME); break;
        case 7: rewrite(good, bad, "opt.step", RETYPE); break;
        case 8: rewrite(good, bad, "opt.step", ADD); break;
        case 9: rewrite(good, bad, "trainer.rng", DROP); break;
        }
        err[0] = 0;
        if (ckpt_load(c, G.p, bad, &x, err, sizeof err) == 0) fail_msg("%s: accepted", cases[i].what);
        printf("# %s: %s\n", cases[i].what, err);
        assert_one_line(err, cases[i].want);
        assert_non_null(strstr(err, bad));
        assert_snap_equal(snap(c), before, cases[i].what);
        assert_int_equal(x.step, -1);
    }
    /* without x, trainer state is optional (and ignored) */
    assert_int_equal(ckpt_load(c, G.p, bad, NULL, err, sizeof err), 0);
    free(bytes);
    rt_free(a);
    rt_free(c);
    rm_rf(d);
}

static void test_unwritable_directory(void **st) {
    char err[1024];
    rt_ctx *c = ctx_new(1);
    CkptExtra x = {1, 0, 0};
    /* a path under a regular file fails even for root */
    assert_int_equal(ckpt_save(c, G.p, "/dev/null/ckpt", &x, 2, err, sizeof err), -1);
    assert_one_line(err, "/dev/null/ckpt: cannot create the checkpoint directory");
    assert_int_equal(ckpt_save(c, G.p, "/dev/null", &x, 2, err, sizeof err), -1);
    assert_one_line(err, "not a directory");
    assert_int_equal(ckpt_prepare_dir("/dev/null/ckpt", err, sizeof err), -1);
    assert_one_line(err, "/dev/null/ckpt: cannot create the checkpoint directory");
    /* a directory on a read-only file system, when there is one */
    if (access("/proc/sys", F_OK) == 0) {
        assert_int_equal(ckpt_prepare_dir("/proc/sys", err, sizeof err), -1);
        assert_one_line(err, "/proc/sys: cannot write into the checkpoint directory");
        assert_int_equal(ckpt_save(c, G.p, "/proc/sys", &x, 2, err, sizeof err), -1);
        assert_one_line(err, "/proc/sys/step_00000001.safetensors: cannot create");
    }
    char *d = tmpdir();
    assert_int_equal(ckpt_prepare_dir(d, err, sizeof err), 0);
    DIR *dd = opendir(d);
    int n = 0;
    while (readdir(dd)) n++;
    closedir(dd);
    assert_int_equal(n, 2); /* the probe is gone */
    rm_rf(d);
    rt_free(c);
}

static void test_init_weights(void **st) {
    char *d = tmpdir(), good[4096], bad[4096], err[1024];
    rt_ctx *a = trained_and_saved(d, 2);
    ckpt_path(good, sizeof good, d, 2);
    snprintf(bad, sizeof bad, "%s/init.safetensors", d);
    rt_ctx *c = ctx_new(5);
    step(c, 0); /* non-zero moments: --init must not touch them */
    Snap before = snap(c);
    if (ckpt_init_weights(c, G.p, good, err, sizeof err) != 0) fail_msg("%s", err);
    for (int i = 0; i < G.p->nparams; i++)
        assert_memory_equal(rt_tensor_ptr(c, &G.p->params[i]), rt_tensor_ptr(a, &G.p->params[i]), nbytes(&G.p->params[i]));
    for (int i = 0; i < G.p->nstates; i++) {
        const rt_tensor *t = &G.p->states[i];
        size_t off = 0;
        for (int k = 0; k < G.p->nparams; k++) off += nbytes(&G.p->params[k]);
        for (int k = 0; k < i; k++) off += nbytes(&G.p->states[k]);
        assert_memory_equal(rt_tensor_ptr(c, t), before.b + off, nbytes(t));
    }
    /* Hugging Face's own files: bare names and non-parameter buffers */
    StFile f;
    if (st_open(&f, good, err, sizeof err) != 0) fail_msg("%s", err);
    StWriter *w = st_new();
    for (int i = 0; i < f.n; i++) {
        const StEntry *e = &f.t[i];
        if (strncmp(e->name, "transformer.", 12) == 0) st_add_view(w, e->name + 12, e->dtype, e->shape, e->rank, st_data(&f, e));
    }
    int64_t one = 1;
    float z = 0;
    st_add_raw(w, "h.0.attn.bias", ST_F32, &one, 1, &z);
    st_add_raw(w, "lm_head.weight", ST_F32, &one, 1, &z);
    assert_int_equal(st_write(w, bad, err, sizeof err), 0);
    st_close(&f);
    rt_ctx *h = ctx_new(6);
    if (ckpt_init_weights(h, G.p, bad, err, sizeof err) != 0) fail_msg("%s", err);
    for (int i = 0; i < G.p->nparams; i++)
        assert_memory_equal(rt_tensor_ptr(h, &G.p->params[i]), rt_tensor_ptr(a, &G.p->params[i]), nbytes(&G.p->params[i]));
    /* errors: a missing param, an unknown tensor */
    rewrite(good, bad, "transformer.wpe.weight", DROP);
    Snap hb = snap(h);
    assert_int_equal(ckpt_init_weights(h, G.p, bad, err, sizeof err), -1);
    assert_one_line(err, "missing tensor \"wpe.weight\" (shape [16,32]");
    rewrite(good, bad, "opt.step", ADD);
    assert_int_equal(ckpt_init_weights(h, G.p, bad, err, sizeof err), -1);
    assert_one_line(err, "unexpected tensor \"extra.weight\"");
    assert_snap_equal(snap(h), hb, "failed init");
    rt_free(a);
    rt_free(c);
    rt_free(h);
    rm_rf(d);
}

/* kill -9 in the middle of a checkpoint write (the fault hook, in a child). */
static void crash_while_saving(const char *d, rt_ctx *c, long long after) {
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        char n[32], err[1024];
        snprintf(n, sizeof n, "%lld", after);
        setenv("KILN_CKPT_CRASH_AFTER_BYTES", n, 1);
        CkptExtra x = {2, 5, 5};
        ckpt_save(c, G.p, d, &x, 1, err, sizeof err);
        _exit(3); /* not reached: the hook kills us */
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status));
    assert_int_equal(WTERMSIG(status), SIGKILL);
}

static void test_kill_9_during_save(void **st) {
    char *d = tmpdir(), p1[4096], p2[4096], used[4096], err[1024];
    rt_ctx *c = trained_and_saved(d, 1);
    Snap s1 = snap(c);
    ckpt_path(p1, sizeof p1, d, 1);
    ckpt_path(p2, sizeof p2, d, 2);
    size_t n1, n;
    char *before = slurp(p1, &n1);
    step(c, 7); /* the state the child tries to save differs */
    long long points[] = {1000, (long long)n1}; /* mid-data; every byte written but not renamed */
    for (int k = 0; k < 2; k++) {
        crash_while_saving(d, c, points[k]);
        char *after = slurp(p1, &n);
        assert_int_equal(n, n1);
        assert_memory_equal(after, before, n); /* the previous checkpoint is intact */
        free(after);
        assert_false(exists(p2));              /* the half file is no checkpoint */
        rt_ctx *r = ctx_new(3);
        CkptExtra x;
        assert_int_equal(ckpt_resume(r, G.p, d, &x, used, sizeof used, err, sizeof err), 0);
        assert_string_equal(used, p1);
        assert_snap_equal(snap(r), s1, "resume after kill -9");
        assert_int_equal(x.step, 1);
        rt_free(r);
    }
    /* the half-written temp files are there, and ignored */
    DIR *dd = opendir(d);
    int tmps = 0;
    struct dirent *e;
    while ((e = readdir(dd))) tmps += strstr(e->d_name, ".tmp.") != NULL;
    closedir(dd);
    assert_int_equal(tmps, 2);
    /* a bad hook value is an error, not a crash */
    setenv("KILN_CKPT_CRASH_AFTER_BYTES", "soon", 1);
    CkptExtra x = {2, 0, 0};
    assert_int_equal(ckpt_save(c, G.p, d, &x, 1, err, sizeof err), -1);
    assert_one_line(err, "KILN_CKPT_CRASH_AFTER_BYTES");
    unsetenv("KILN_CKPT_CRASH_AFTER_BYTES");
    free(before);
    rt_free(c);
    rm_rf(d);
}

/* For tests/test_torch.py: `test_checkpoint --torch-fixture DIR` trains
 * tiny GPT (its test config: heads 4, seq 64, batch 4) for 2 steps, saves
 * DIR/step_00000002.safetensors, runs step 3 on a fixed batch and writes
 * that batch and kiln's loss on it (the loss of the saved params) to
 * DIR/batch.safetensors. */
static int torch_fixture(const char *dir) {
    static const char *const sets[][2] = {{"heads", "4"}, {"seq", "64"}, {"batch", "4"}};
    if (compile_tiny(sets, 3) != 0) return 1;
    rt_ctx *c = ctx_new(1337);
    step(c, 0);
    step(c, 1);
    char err[1024], path[4096];
    CkptExtra x = {2, 1, 0};
    if (ckpt_save(c, G.p, dir, &x, 0, err, sizeof err) != 0) { fprintf(stderr, "%s\n", err); return 1; }
    const rt_tensor *tok = find(G.p->inputs, G.p->ninputs, "tokens"), *tgt = find(G.p->inputs, G.p->ninputs, "targets");
    StWriter *w = st_new();
    fill_batch(c, 2); /* copied before the step: memplan may reuse input buffers */
    st_add_raw(w, "tokens", ST_I32, tok->dim, 2, rt_tensor_ptr(c, tok));
    st_add_raw(w, "targets", ST_I32, tgt->dim, 2, rt_tensor_ptr(c, tgt));
    uint32_t bits = step(c, 2);
    st_add_raw(w, "loss", ST_F32, NULL, 0, &bits);
    snprintf(path, sizeof path, "%s/batch.safetensors", dir);
    if (st_write(w, path, err, sizeof err) != 0) { fprintf(stderr, "%s\n", err); return 1; }
    rt_free(c);
    teardown(NULL);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--torch-fixture") == 0) return torch_fixture(argv[2]);
    const struct CMUnitTest reader[] = {
        cmocka_unit_test_teardown(test_reader_accepts_valid, free_owned),
        cmocka_unit_test_teardown(test_writer_reader_round_trip, free_owned),
        cmocka_unit_test_teardown(test_reader_rejects_malformed, free_owned),
    };
    const struct CMUnitTest ckpt[] = {
        cmocka_unit_test_teardown(test_round_trip_is_exact, free_owned),
        cmocka_unit_test_teardown(test_gpt2_names_are_hugging_face, free_owned),
        cmocka_unit_test_teardown(test_keep_last_k, free_owned),
        cmocka_unit_test_teardown(test_resume_falls_back, free_owned),
        cmocka_unit_test_teardown(test_load_errors_leave_state_untouched, free_owned),
        cmocka_unit_test_teardown(test_unwritable_directory, free_owned),
        cmocka_unit_test_teardown(test_init_weights, free_owned),
        cmocka_unit_test_teardown(test_kill_9_during_save, free_owned),
    };
    int fails = cmocka_run_group_tests_name("safetensors", reader, NULL, NULL);
    fails += cmocka_run_group_tests_name("checkpoint", ckpt, setup, teardown);
    return fails ? 1 : 0;
}
