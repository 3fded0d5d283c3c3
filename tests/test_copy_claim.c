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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_helped_copies_run_once_in_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
