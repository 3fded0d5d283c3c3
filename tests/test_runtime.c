/* test_runtime.c — the CPU runtime (runtime/cpu/dev_cpu.c) on hand-written programs.
 *
 * Each test writes an rt_program table and a step function by hand, with
 * small kernels defined here ("add 1", "sleep then write", "copy a->b"),
 * and checks what the runtime promises: streams run in order, events really
 * synchronise (the same program without its wait reads an unwritten
 * buffer: the producer sleeps, so the race is deterministic), events do
 * not carry over to the next step, serial mode agrees and rejects a wait
 * before its record, rt_parallel_for covers [0,n) exactly once (also nested
 * and from two streams at once), rt_fail fails one step only, the trace is
 * valid JSON with one event per launch, and rt_init_params starts from the
 * f32 interpreter's weights bit for bit.
 */
#include "testutil.h"
#include "graphbuild.h"

#include <time.h>
#include <unistd.h>

#include "kiln_rt.h"

/* ---- kernels ---- */

static void sleep_ms(int64_t ms) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000};
    while (nanosleep(&t, &t)) {}
}

/* args: x, n */
static void k_add1(rt_ctx *c, const int64_t *a) {
    for (int64_t i = 0; i < a[1]; i++) RT_F32P(a[0])[i] += 1;
}

/* The producer and consumer below move floats as relaxed atomic words: the
 * test without a wait races on purpose, and so stays clean under TSan. */

/* args: x, n, value(bits), ms: sleep, then x[:] = value */
static void k_sleep_write(rt_ctx *c, const int64_t *a) {
    sleep_ms(a[3]);
    float v = (float)rt_bits_f64(a[2]);
    uint32_t w;
    memcpy(&w, &v, 4);
    for (int64_t i = 0; i < a[1]; i++) __atomic_store_n((uint32_t *)rt_arg_ptr(a[0]) + i, w, __ATOMIC_RELAXED);
}

/* args: src, dst, n */
static void k_copy(rt_ctx *c, const int64_t *a) {
    const uint32_t *src = rt_arg_ptr(a[0]);
    uint32_t *dst = rt_arg_ptr(a[1]);
    for (int64_t i = 0; i < a[2]; i++) __atomic_store_n(dst + i, __atomic_load_n(src + i, __ATOMIC_RELAXED), __ATOMIC_RELAXED);
}

/* args: log (int32: [0] = count, then entries), value */
static void k_append(rt_ctx *c, const int64_t *a) {
    int32_t *log = RT_I32P(a[0]);
    log[1 + log[0]++] = (int32_t)a[1];
}

static void k_fail(rt_ctx *c, const int64_t *a) { rt_fail(c, "token %d out of range", (int)a[0]); }

/* ---- programs ---- */

/* Buffers in the ACT space: a, b (16 floats each), and a log. */
enum { OFF_A = 0, OFF_B = 64, OFF_LOG = 128, NBUF = 16, ACT_BYTES = 8192 };

static rt_program program(int nstreams, int nevents, void (*step)(rt_ctx *, char *const *)) {
    return (rt_program){.abi_version = RT_ABI_VERSION, .model = "test", .space_bytes = {0, 0, 0, ACT_BYTES},
                        .nstreams = nstreams, .nevents = nevents, .step = step};
}

static float *buf(rt_ctx *c, int64_t off) { return (float *)(rt_space(c, RT_SPACE_ACT) + off); }

static rt_ctx *ctx_new(const rt_program *p, int serial, int threads, const char *trace) {
    rt_options o = {.threads = threads, .serial = serial, .trace_path = trace};
    rt_ctx *c = rt_new(p, &o);
    assert_non_null(c);
    return c;
}

static void step_ok(rt_ctx *c) {
    char err[256] = "";
    if (rt_step(c, err, sizeof err)) fail_msg("rt_step: %s", err);
}

/* The step fails and its message contains want. */
static void step_fails(rt_ctx *c, const char *want) {
    char err[256] = "";
    assert_int_equal(rt_step(c, err, sizeof err), -1);
    if (!strstr(err, want)) fail_msg("error \"%s\" lacks \"%s\"", err, want);
}

static void launch(rt_ctx *c, int s, rt_kernel k, const int64_t *args, int n, const char *name) {
    rt_launch(c, s, k, args, n, name);
}
#define LAUNCH(c, s, k, name, ...) \
    launch(c, s, k, (const int64_t[]){__VA_ARGS__}, (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), name)

static struct {
    int wait;     /* the consumer waits for the producer's event */
    int record;   /* the producer records it */
    int fail;     /* a kernel calls rt_fail */
    int64_t step; /* steps run so far by the step function */
} cfg;

/* ---- one stream ---- */

/* A slow write, then a copy and 100 log entries interleaved with "add 1". */
static void step_in_order(rt_ctx *c, char *const *sp) {
    char *act = sp[RT_SPACE_ACT];
    LAUNCH(c, 0, k_sleep_write, "slow write", rt_ptr_arg(act + OFF_A), NBUF, rt_f64_bits(3), 50);
    LAUNCH(c, 0, k_copy, "copy", rt_ptr_arg(act + OFF_A), rt_ptr_arg(act + OFF_B), NBUF);
    for (int i = 0; i < 100; i++) {
        LAUNCH(c, 0, k_append, "append", rt_ptr_arg(act + OFF_LOG), i);
        LAUNCH(c, 0, k_add1, "add1", rt_ptr_arg(act + OFF_B), NBUF);
    }
}

static void check_in_order(int serial) {
    rt_program p = program(1, 0, step_in_order);
    rt_ctx *c = ctx_new(&p, serial, 2, NULL);
    step_ok(c);
    int32_t *log = (int32_t *)buf(c, OFF_LOG);
    assert_int_equal(log[0], 100);
    for (int i = 0; i < 100; i++) assert_int_equal(log[1 + i], i);
    for (int i = 0; i < NBUF; i++) assert_true(buf(c, OFF_B)[i] == 103.0f);
    rt_free(c);
}

static void test_one_stream_in_order(void **st) { check_in_order(0); }
static void test_serial_in_order(void **st) { check_in_order(1); }

/* ---- two streams and an event ---- */

/* Stream 0 sleeps 150 ms and writes a = step number, then records event 0;
 * stream 1 waits for it (if cfg.wait) and copies a to b. */
static void step_two_streams(rt_ctx *c, char *const *sp) {
    char *act = sp[RT_SPACE_ACT];
    cfg.step++;
    LAUNCH(c, 0, k_sleep_write, "produce", rt_ptr_arg(act + OFF_A), NBUF, rt_f64_bits((double)cfg.step), 150);
    if (cfg.record) rt_record(c, 0, 0);
    if (cfg.wait) rt_wait(c, 1, 0);
    LAUNCH(c, 1, k_copy, "consume", rt_ptr_arg(act + OFF_A), rt_ptr_arg(act + OFF_B), NBUF);
}

static rt_ctx *two_streams(int serial, int wait, int record) {
    static rt_program p;
    p = program(2, 1, step_two_streams);
    cfg.wait = wait, cfg.record = record, cfg.step = 0;
    return ctx_new(&p, serial, 2, NULL);
}

static void all_equal(const float *x, float v) {
    for (int i = 0; i < NBUF; i++)
        if (x[i] != v) fail_msg("element %d is %g, want %g", i, x[i], v);
}

static void test_event_orders_streams(void **st) {
    rt_ctx *c = two_streams(0, 1, 1);
    step_ok(c);
    all_equal(buf(c, OFF_B), 1);
    step_ok(c); /* step 2 must wait for step 2's record, not reuse step 1's */
    all_equal(buf(c, OFF_B), 2);
    rt_free(c);
}

static void test_missing_wait_races(void **st) {
    rt_ctx *c = two_streams(0, 0, 1);
    step_ok(c);
    all_equal(buf(c, OFF_A), 1); /* the producer did run ... */
    all_equal(buf(c, OFF_B), 0); /* ... after the consumer copied the unwritten a */
    rt_free(c);
}

static void test_event_does_not_leak_across_steps(void **st) {
    rt_ctx *c = two_streams(0, 1, 1);
    step_ok(c);
    cfg.record = 0; /* step 2 waits for event 0, recorded only in step 1 */
    step_fails(c, "not recorded");
    cfg.record = 1;
    step_ok(c);
    all_equal(buf(c, OFF_B), 3);
    rt_free(c);
}

static void test_serial_two_streams(void **st) {
    rt_ctx *c = two_streams(1, 1, 1);
    step_ok(c);
    all_equal(buf(c, OFF_B), 1);
    step_ok(c);
    all_equal(buf(c, OFF_B), 2);
    cfg.record = 0;
    step_fails(c, "not recorded");
    rt_free(c);
}

/* The consumer waits before the producer's record is issued. */
static void step_wait_first(rt_ctx *c, char *const *sp) {
    rt_wait(c, 1, 0);
    rt_record(c, 0, 0);
}

static void test_wait_before_record_is_an_error(void **st) {
    rt_program p = program(2, 1, step_wait_first);
    for (int serial = 0; serial < 2; serial++) {
        rt_ctx *c = ctx_new(&p, serial, 2, NULL);
        step_fails(c, "schedule error: stream 1 waits for event 0");
        rt_free(c);
    }
}

static void step_bad_indices(rt_ctx *c, char *const *sp) {
    rt_record(c, 0, 0);
    rt_record(c, 0, 0);
    rt_wait(c, 1, 5);
    LAUNCH(c, 7, k_add1, "add1", 0, 0);
}

static void test_bad_indices_fail_the_step(void **st) {
    rt_program p = program(2, 1, step_bad_indices);
    rt_ctx *c = ctx_new(&p, 0, 2, NULL);
    step_fails(c, "recorded twice");
    rt_free(c);
}

/* ---- rt_fail ---- */

static void step_maybe_fail(rt_ctx *c, char *const *sp) {
    char *act = sp[RT_SPACE_ACT];
    if (cfg.fail) LAUNCH(c, 0, k_fail, "fail", 1234);
    LAUNCH(c, 0, k_add1, "add1", rt_ptr_arg(act + OFF_B), NBUF);
}

static void test_fail_fails_one_step(void **st) {
    rt_program p = program(1, 0, step_maybe_fail);
    for (int serial = 0; serial < 2; serial++) {
        rt_ctx *c = ctx_new(&p, serial, 2, NULL);
        cfg.fail = 1;
        step_fails(c, "token 1234 out of range");
        cfg.fail = 0;
        step_ok(c);
        all_equal(buf(c, OFF_B), 2);
        rt_free(c);
    }
}

/* ---- rt_parallel_for ---- */

typedef struct {
    rt_ctx *ctx;
    int32_t *count; /* hits per index */
    int64_t n, inner;
    int bad;        /* a chunk outside [0,n) or empty */
} Cover;

static void mark(void *data, int64_t i0, int64_t i1) {
    Cover *cv = data;
    if (i0 < 0 || i1 > cv->n || i0 >= i1) __atomic_store_n(&cv->bad, 1, __ATOMIC_RELAXED);
    for (int64_t i = i0; i < i1 && i >= 0 && i < cv->n; i++) __atomic_fetch_add(&cv->count[i], 1, __ATOMIC_RELAXED);
}

/* Each outer index runs an inner rt_parallel_for over its row. */
static void mark_rows(void *data, int64_t r0, int64_t r1) {
    Cover *cv = data;
    for (int64_t r = r0; r < r1; r++) {
        Cover row = {cv->ctx, cv->count + r * cv->inner, cv->inner, 0, 0};
        rt_parallel_for(cv->ctx, cv->inner, mark, &row);
        if (row.bad) __atomic_store_n(&cv->bad, 1, __ATOMIC_RELAXED);
    }
}

static void check_cover(Cover *cv, int64_t n) {
    if (cv->bad) fail_msg("n=%lld: a chunk outside [0,n) or empty", (long long)n);
    for (int64_t i = 0; i < n; i++)
        if (cv->count[i] != 1) fail_msg("n=%lld: index %lld covered %d times", (long long)n, (long long)i, cv->count[i]);
}

static void test_parallel_for_covers_once(void **st) {
    static const int64_t ns[] = {0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 100, 1000, 4097, 100003};
    static const int threads[] = {1, 2, 3, 5, 8};
    rt_program p = program(1, 0, step_in_order);
    int32_t *count = malloc(sizeof(int32_t) * 100003);
    assert_non_null(count);
    for (int serial = 0; serial < 2; serial++)
        for (size_t t = 0; t < sizeof threads / sizeof *threads; t++) {
            rt_ctx *c = ctx_new(&p, serial, threads[t], NULL);
            for (size_t k = 0; k < sizeof ns / sizeof *ns; k++) {
                memset(count, 0, sizeof(int32_t) * 100003);
                Cover cv = {c, count, ns[k], 0, 0};
                rt_parallel_for(c, ns[k], mark, &cv);
                check_cover(&cv, ns[k]);
            }
            memset(count, 0, sizeof(int32_t) * 100003);
            Cover cv = {c, count, 37, 1001, 0}; /* nested: 37 rows of 1001 */
            rt_parallel_for(c, 37, mark_rows, &cv);
            cv.n = 37 * 1001;
            check_cover(&cv, cv.n);
            rt_free(c);
        }
    free(count);
}

/* args: count, n, nested: a kernel covering its own array */
static void k_cover(rt_ctx *c, const int64_t *a) {
    int32_t *count = RT_I32P(a[0]);
    int64_t n = a[1];
    memset(count, 0, sizeof(int32_t) * (size_t)n);
    Cover cv = {c, count, a[2] ? n / 100 : n, 100, 0};
    rt_parallel_for(c, cv.n, a[2] ? mark_rows : mark, &cv);
    cv.n = n;
    for (int64_t i = 0; i < n; i++)
        if (count[i] != 1) cv.bad = 1;
    if (cv.bad) rt_fail(c, "rt_parallel_for did not cover [0,%lld) exactly once", (long long)n);
}

enum { COVER_N = 20000 };
static int32_t cover_buf[2][COVER_N];

static void step_cover_two_streams(rt_ctx *c, char *const *sp) {
    for (int i = 0; i < 20; i++)
        for (int s = 0; s < 2; s++) LAUNCH(c, s, k_cover, "cover", rt_ptr_arg(cover_buf[s]), COVER_N, i % 2);
}

static void test_parallel_for_from_two_streams(void **st) {
    rt_program p = program(2, 0, step_cover_two_streams);
    for (int threads = 2; threads <= 4; threads += 2) {
        rt_ctx *c = ctx_new(&p, 0, threads, NULL);
        for (int k = 0; k < 3; k++) step_ok(c);
        rt_free(c);
    }
}

/* ---- trace ---- */

static void step_traced(rt_ctx *c, char *const *sp) {
    char *act = sp[RT_SPACE_ACT];
    LAUNCH(c, 0, k_sleep_write, "produce \"a\"\\", rt_ptr_arg(act + OFF_A), NBUF, rt_f64_bits(1), 2);
    rt_record(c, 0, 0);
    LAUNCH(c, 0, k_add1, "add1", rt_ptr_arg(act + OFF_LOG), NBUF); /* not a: stream 1 reads it */
    rt_wait(c, 1, 0);
    LAUNCH(c, 1, k_copy, "consume", rt_ptr_arg(act + OFF_A), rt_ptr_arg(act + OFF_B), NBUF);
}

static int count_files(const char *dir) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "ls -A '%s' | wc -l", dir);
    FILE *f = popen(cmd, "r");
    int n = -1;
    if (!f || fscanf(f, "%d", &n) != 1) n = -1;
    if (f) pclose(f);
    return n;
}

static void test_trace_is_json(void **st) {
    char dir[] = "/tmp/kiln-trace-XXXXXX", path[256], cmd[1024];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/trace.json", dir);
    rt_program p = program(2, 1, step_traced);
    for (int serial = 0; serial < 2; serial++) {
        rt_ctx *c = ctx_new(&p, serial, 2, path);
        for (int k = 0; k < 4; k++) step_ok(c);
        rt_free(c);
        snprintf(cmd, sizeof cmd,
                 "/usr/bin/python3 -c 'import json,sys\n"
                 "e = json.load(open(sys.argv[1]))[\"traceEvents\"]\n"
                 "x = [v for v in e if v[\"ph\"] == \"X\"]\n"
                 "assert len(x) == 12, len(x)\n"
                 "assert sorted(v[\"tid\"] for v in x) == [0] * 8 + [1] * 4\n"
                 "assert sum(v[\"name\"] == \"produce \\\"a\\\"\\\\\" for v in x) == 4, x\n"
                 "assert all(v[\"dur\"] >= 0 and v[\"ts\"] >= 0 for v in x)\n"
                 "c = [v for v in x if v[\"name\"] == \"consume\"]\n"
                 "p = [v for v in x if v[\"name\"].startswith(\"produce\")]\n"
                 "assert all(a[\"ts\"] >= b[\"ts\"] + b[\"dur\"] for a, b in zip(c, p))' %s",
                 path);
        if (system(cmd) != 0) fail_msg("trace check failed (serial=%d)", serial);
        assert_int_equal(count_files(dir), 1); /* no temp file left behind */
    }
    unlink(path);
    rmdir(dir);
}

/* ---- rt_new checks ---- */

static void test_new_rejects_bad_programs(void **st) {
    rt_program p = program(1, 0, step_in_order);
    p.abi_version = RT_ABI_VERSION + 1;
    assert_null(rt_new(&p, NULL));
    p = program(1, 0, step_in_order);
    rt_tensor t = {.name = "w", .space = RT_SPACE_PARAMS, .offset = 0, .dtype = RT_F32, .rank = 1, .dim = {4}};
    p.params = &t;
    p.nparams = 1; /* the params space is empty */
    assert_null(rt_new(&p, NULL));
    p.space_bytes[RT_SPACE_PARAMS] = 16;
    rt_ctx *c = rt_new(&p, NULL);
    assert_non_null(c);
    assert_true((uintptr_t)rt_space(c, RT_SPACE_PARAMS) % 64 == 0);
    assert_true(rt_tensor_ptr(c, &t) == rt_space(c, RT_SPACE_PARAMS));
    rt_free(c);
}

/* ---- rt_init_params == the f32 interpreter's init ---- */

static void noop_step(rt_ctx *c, char *const *sp) {}

typedef struct {
    const char *name, *init;
    int64_t dim[2];
    double std;
} PSpec;

static void test_init_params_match_interp(void **st) {
    static const PSpec ps[] = {
        {"h.0.attn.w", "normal", {3, 5}, 0.02}, /* odd count: the last sin is dropped */
        {"wte", "normal", {401, 500}, 0.5},     /* several blocks of the parallel fill */
        {"ln.w", "ones", {7, 1}, 0},
        {"ln.b", "zeros", {7, 1}, 0},
    };
    enum { NP = 4, SEED = 42 };
    Bld b = bld_new("t", "t.lua");
    rt_tensor params[NP], state = {.name = "opt.step", .space = RT_SPACE_OPT, .dtype = RT_F32, .rank = 0};
    int64_t off = 0;
    for (int i = 0; i < NP; i++) {
        Type t = {.dt = DT_F32, .rank = 2, .dim = {ps[i].dim[0], ps[i].dim[1]}};
        output(&b, param(&b, ps[i].name, t, ps[i].init, ps[i].std), ps[i].name);
        params[i] = (rt_tensor){.name = ps[i].name, .space = RT_SPACE_PARAMS, .offset = off, .dtype = RT_F32,
                                .rank = 2, .dim = {ps[i].dim[0], ps[i].dim[1]}, .init = ps[i].init, .std = ps[i].std};
        off += (ps[i].dim[0] * ps[i].dim[1] * 4 + 63) / 64 * 64;
    }
    Interp *it = interp_new(b.m, 0);
    assert_non_null(it);
    interp_init_state(it, SEED);

    rt_program p = {.abi_version = RT_ABI_VERSION, .model = "t", .space_bytes = {off, 0, 64, 0},
                    .nparams = NP, .params = params, .nstates = 1, .states = &state, .nstreams = 1, .step = noop_step};
    for (int serial = 0; serial < 2; serial++) {
        rt_ctx *c = ctx_new(&p, serial, 3, NULL);
        memset(rt_space(c, RT_SPACE_PARAMS), 0x7f, (size_t)off);
        *(float *)rt_tensor_ptr(c, &state) = 5;
        rt_init_params(c, SEED);
        assert_true(*(float *)rt_tensor_ptr(c, &state) == 0);
        for (int i = 0; i < NP; i++) {
            const Tensor *ref = interp_state(it, 0, ps[i].name);
            assert_non_null(ref);
            const float *got = rt_tensor_ptr(c, &params[i]);
            for (int64_t k = 0; k < ref->n; k++)
                if ((double)got[k] != ref->d[k])
                    fail_msg("%s[%lld]: runtime %.9g, interpreter %.9g", ps[i].name, (long long)k, got[k], ref->d[k]);
            if (strcmp(ps[i].init, "normal") == 0) { /* and the serial generator agrees */
                float *again = malloc(sizeof(float) * (size_t)ref->n);
                assert_non_null(again);
                rt_normal_fill(again, ref->n, ps[i].name, SEED, ps[i].std);
                assert_memory_equal(again, got, sizeof(float) * (size_t)ref->n);
                free(again);
            }
        }
        rt_free(c);
    }
    interp_free(it);
    ir_free(b.m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_stream_in_order),
        cmocka_unit_test(test_serial_in_order),
        cmocka_unit_test(test_event_orders_streams),
        cmocka_unit_test(test_missing_wait_races),
        cmocka_unit_test(test_event_does_not_leak_across_steps),
        cmocka_unit_test(test_serial_two_streams),
        cmocka_unit_test(test_wait_before_record_is_an_error),
        cmocka_unit_test(test_bad_indices_fail_the_step),
        cmocka_unit_test(test_fail_fails_one_step),
        cmocka_unit_test(test_parallel_for_covers_once),
        cmocka_unit_test(test_parallel_for_from_two_streams),
        cmocka_unit_test(test_trace_is_json),
        cmocka_unit_test(test_new_rejects_bad_programs),
        cmocka_unit_test(test_init_params_match_interp),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
