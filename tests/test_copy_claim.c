/* test_copy_claim.c — a waiting stream runs the copy stream's copies itself
 * (runtime/cpu/dev_cpu.c, "Helping", issue 19), exactly once and in order.
 *
 * The program: a compute stream (0) and two copy streams (2 d2h, 3 h2d, as
 * the offload pass emits them; 1 is idle).  In each of R rounds the compute
 * stream writes a round value into its slot S (a kernel that sleeps a
 * pseudo-random 0-150 µs first), records; the copy stream of the round
 * waits for that, copies S -> T (a scratch shared by all rounds on that
 * stream), then T -> R_i, and records; the compute stream waits for that
 * record and checks R_i holds the round's value.  The two copies of a
 * round are ordered only by their stream's in-order rule, and T is reused
 * by every round, so a copy run out of order, or at the same time as the
 * one before it, leaves a wrong value in some R_i: the check kernel fails
 * the step.  KILN_CHECK_COPIES=1 makes the runtime fail a copy that starts
 * twice ("ran twice": the claim was not exclusive) and a launch that
 * reads a copy's bytes before the copy finished.  KILN_COPY_DELAY_US=30
 * makes each copy last long enough for the worker and a helper to meet.
 * The trace shows who ran each copy: the test asks that the compute stream
 * ran some (args "by": 0), so the helping path is exercised, and that
 * every copy appears exactly once (2 per round per step).
 *
 * Shown to fail (by hand, not in the suite): with the claim's `r->running
 * = 1` removed from wait_helping the step fails with "ran twice" or a
 * wrong value; with a helper taking the command after `next` likewise.
 */
#include "testutil.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kiln_rt.h"

enum { ROUNDS = 48, N = 64, STEPS = 6 };
/* act space: S[ROUNDS][N], T[2][N], R[ROUNDS][N] floats */
#define OFF_S(i) ((int64_t)(i) * N * 4)
#define OFF_T(j) (OFF_S(ROUNDS) + (int64_t)(j) * N * 4)
#define OFF_R(i) (OFF_T(2) + (int64_t)(i) * N * 4)
#define ACT_BYTES OFF_R(ROUNDS)

static void sleep_us(int64_t us) {
    struct timespec t = {0, us * 1000};
    while (nanosleep(&t, &t)) {}
}

/* args: x, n, value, µs */
static void k_write(rt_ctx *c, const int64_t *a) {
    sleep_us(a[3]);
    for (int64_t i = 0; i < a[1]; i++) __atomic_store_n(RT_I32P(a[0]) + i, (int32_t)a[2], __ATOMIC_RELAXED);
}

/* args: x, n, value */
static void k_check(rt_ctx *c, const int64_t *a) {
    for (int64_t i = 0; i < a[1]; i++) {
        int32_t v = __atomic_load_n(RT_I32P(a[0]) + i, __ATOMIC_RELAXED);
        if (v != (int32_t)a[2]) {
            rt_fail(c, "round value %d: read %d at %d", (int)a[2], (int)v, (int)i);
            return;
        }
    }
}

static int64_t nstep;

static void step(rt_ctx *c, char *const *sp) {
    char *act = sp[RT_SPACE_ACT];
    uint32_t rnd = (uint32_t)nstep * 2654435761u + 1;
    nstep++;
    for (int i = 0; i < ROUNDS; i++) {
        int cs = 2 + i % 2, value = (int)(nstep * 1000 + i);
        rnd = rnd * 1103515245u + 12345u;
        int64_t us = (rnd >> 16) % 151;
        int64_t w[] = {rt_ptr_arg(act + OFF_S(i)), N, value, us};
        rt_launch(c, 0, k_write, w, 4, "write");
        rt_record(c, 0, 2 * i);
        rt_wait(c, cs, 2 * i);
        int64_t c1[] = {rt_ptr_arg(act + OFF_T(cs - 2)), rt_ptr_arg(act + OFF_S(i)), N * 4};
        rt_launch(c, cs, cs == 2 ? rtk_offload : rtk_reload, c1, 3, "S->T");
        int64_t c2[] = {rt_ptr_arg(act + OFF_R(i)), rt_ptr_arg(act + OFF_T(cs - 2)), N * 4};
        rt_launch(c, cs, cs == 2 ? rtk_offload : rtk_reload, c2, 3, "T->R");
        rt_record(c, cs, 2 * i + 1);
        rt_wait(c, 0, 2 * i + 1);
        int64_t k[] = {rt_ptr_arg(act + OFF_R(i)), N, value};
        rt_launch(c, 0, k_check, k, 3, "check");
    }
}

static void test_helped_copies_run_once_in_order(void **st) {
    char dir[] = "/tmp/kiln-claim-XXXXXX", path[256], cmd[1024];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/trace.json", dir);
    assert_int_equal(setenv("KILN_CHECK_COPIES", "1", 1), 0);
    assert_int_equal(setenv("KILN_COPY_DELAY_US", "30", 1), 0);
    rt_program p = {.abi_version = RT_ABI_VERSION, .model = "claim", .space_bytes = {0, 0, 0, ACT_BYTES},
                    .nstreams = 4, .nevents = 2 * ROUNDS, .step = step};
    rt_options o = {.threads = 1, .trace_path = path};
    rt_ctx *c = rt_new(&p, &o);
    assert_non_null(c);
    for (int k = 0; k < STEPS; k++) {
        char err[256] = "";
        if (rt_step(c, err, sizeof err)) fail_msg("step %d: %s", k + 1, err);
    }
    rt_free(c);
    unsetenv("KILN_CHECK_COPIES");
    unsetenv("KILN_COPY_DELAY_US");
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 -c 'import json,sys\n"
             "x = [v for v in json.load(open(sys.argv[1]))[\"traceEvents\"] if v[\"ph\"] == \"X\"]\n"
             "cp = [v for v in x if v[\"name\"] in (\"S->T\", \"T->R\")]\n"
             "assert len(cp) == %d, len(cp)\n"
             "assert all(v[\"tid\"] in (2, 3) for v in cp)\n"
             "by = sum(v.get(\"args\", {}).get(\"by\") == 0 for v in cp)\n"
             "print(\"copies %%d, run by the compute stream %%d\" %% (len(cp), by))\n"
             "assert by > 0, \"no copy was helped\"' %s",
             2 * ROUNDS * STEPS, path);
    if (system(cmd) != 0) fail_msg("trace check failed");
    unlink(path);
    rmdir(dir);
}

/* rtk_offload writes with non-temporal stores from 4 KiB up (dev_cpu.c,
 * copy_out): its aligned body, unaligned head and tail.  Every size around
 * the thresholds at every misalignment of either side must copy exactly
 * the bytes, and not one byte past either end (guards of 0x5a).  The
 * same copy by rtk_reload (memcpy) is the reference. */
static void test_offload_copy_exact(void **st) {
    rt_program p = {.abi_version = RT_ABI_VERSION, .model = "copy", .space_bytes = {0, 0, 0, 0}, .nstreams = 1, .step = step};
    rt_options o = {.threads = 1};
    rt_ctx *c = rt_new(&p, &o);
    assert_non_null(c);
    enum { MAX = (1 << 20) + 200 };
    unsigned char *src = malloc(MAX + 64), *dst = malloc(MAX + 128), *ref = malloc(MAX + 128);
    assert_non_null(src), assert_non_null(dst), assert_non_null(ref);
    for (int i = 0; i < MAX + 64; i++) src[i] = (unsigned char)(i * 131 + 7);
    const int64_t sizes[] = {0, 1, 63, 4095, 4096, 4097, 4096 + 63, 65536 + 13, 1 << 20};
    int n = 0;
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++)
        for (int so = 0; so < 16; so += 5)
            for (int d0 = 0; d0 < 17; d0 += 4) {
                memset(dst, 0x5a, MAX + 128), memset(ref, 0x5a, MAX + 128);
                int64_t a[] = {rt_ptr_arg(dst + 32 + d0), rt_ptr_arg(src + so), sizes[k]};
                int64_t b[] = {rt_ptr_arg(ref + 32 + d0), rt_ptr_arg(src + so), sizes[k]};
                rtk_offload(c, a);
                rtk_reload(c, b);
                if (memcmp(dst, ref, MAX + 128) != 0) fail_msg("offload copy of %lld bytes (src +%d, dst +%d) differs", (long long)sizes[k], so, 32 + d0);
                n++;
            }
    print_message("%d offload copies exact, guards intact\n", n);
    free(src), free(dst), free(ref);
    rt_free(c);
}

/* ---- no priority inversion (dev_cpu.c, "Priority") ----
 * The d2h worker runs at idle priority.  Each step: the compute stream
 * records e0; d2h waits for it, runs k_gate (which sets the spinners
 * going: one normal-priority thread per core, busy) and then a copy that
 * sleeps 3 ms first (KILN_COPY_DELAY_US), holding its claim, and records
 * e1; the compute stream sleeps 1 ms and waits for e1, finding the claim
 * held by the worker.  With the boost the worker gets a fair share of a
 * core when its sleep ends; without it (KILN_TEST_NO_BOOST=1) it competes
 * at idle priority with the busy spinners (four per core).  The median
 * step of each is measured; the boosted one must stay under 100 ms (about
 * 3 ms: the copy's sleep).  The control is printed, not asserted: on this
 * machine's kernel (6.18, EEVDF) it came out at 288 ms in one run and
 * 4 ms in the next (a SCHED_IDLE thread's wait for a core among busy
 * threads varies by that much), which is why the boost exists and why a
 * test cannot require the control to be slow. */
static volatile int spin_on, spin_quit;

static void *spinner(void *arg) {
    while (!spin_quit)
        if (spin_on) for (volatile int i = 0; i < 100000; i++) {}
        else sleep_us(50);
    return NULL;
}

static void k_gate(rt_ctx *c, const int64_t *a) { spin_on = 1; }
static void k_stop(rt_ctx *c, const int64_t *a) { spin_on = 0; }
static void k_nap(rt_ctx *c, const int64_t *a) { sleep_us(a[0]); }

static void step_inv(rt_ctx *c, char *const *sp) {
    char *act = sp[RT_SPACE_ACT];
    rt_record(c, 0, 0);
    rt_wait(c, 2, 0);
    rt_launch(c, 2, k_gate, NULL, 0, "gate");
    int64_t cp[] = {rt_ptr_arg(act + 4096), rt_ptr_arg(act), 4096};
    rt_launch(c, 2, rtk_offload, cp, 3, "copy");
    rt_record(c, 2, 1);
    int64_t nap[] = {1000};
    rt_launch(c, 0, k_nap, nap, 1, "nap");
    rt_wait(c, 0, 1);
    rt_launch(c, 0, k_stop, NULL, 0, "stop");
}

static int by_double(const void *a, const void *b) { return *(const double *)a < *(const double *)b ? -1 : *(const double *)a > *(const double *)b; }

static double median_step_ms(int boost) {
    if (!boost) assert_int_equal(setenv("KILN_TEST_NO_BOOST", "1", 1), 0);
    assert_int_equal(setenv("KILN_COPY_DELAY_US", "3000", 1), 0);
    rt_program p = {.abi_version = RT_ABI_VERSION, .model = "inversion", .space_bytes = {0, 0, 0, 8192}, .nstreams = 4, .nevents = 2, .step = step_inv};
    rt_options o = {.threads = 1};
    rt_ctx *c = rt_new(&p, &o);
    assert_non_null(c);
    double ms[9];
    for (int k = 0; k < 9; k++) {
        struct timespec t0, t1;
        char err[256] = "";
        assert_int_equal(clock_gettime(CLOCK_MONOTONIC, &t0), 0);
        if (rt_step(c, err, sizeof err)) fail_msg("step %d: %s", k + 1, err);
        assert_int_equal(clock_gettime(CLOCK_MONOTONIC, &t1), 0);
        ms[k] = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-6;
    }
    rt_free(c);
    unsetenv("KILN_TEST_NO_BOOST");
    unsetenv("KILN_COPY_DELAY_US");
    qsort(ms, 9, sizeof *ms, by_double);
    return ms[4];
}

static void test_idle_worker_boosted(void **st) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) n = 1;
    pthread_t th[64];
    int nt = 4 * n > 64 ? 64 : 4 * (int)n;
    spin_quit = 0;
    for (int i = 0; i < nt; i++) assert_int_equal(pthread_create(&th[i], NULL, spinner, NULL), 0);
    double off = median_step_ms(0), on = median_step_ms(1);
    spin_quit = 1;
    for (int i = 0; i < nt; i++) assert_int_equal(pthread_join(th[i], NULL), 0);
    print_message("median step with the copy worker's claim awaited under %d busy threads: %.1f ms boosted, %.1f ms not\n", nt, on, off);
    if (!(on < 100)) fail_msg("the boosted worker's claim held the compute stream %.1f ms a step (not boosted: %.1f ms)", on, off);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_helped_copies_run_once_in_order),
        cmocka_unit_test(test_offload_copy_exact),
        cmocka_unit_test(test_idle_worker_boosted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
