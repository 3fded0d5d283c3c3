/* test_profile.c — device profiles (profile.c): the shipped files, the
 * reader's errors, the time formulas and the offload policy.
 *
 * The shipped profiles load by name and by their short names from the
 * build tree (build/tests/../../profiles), and their numbers are the
 * datasheets' (H200: 141 GB, 4.8 TB/s, 1,979/2 TFLOP/s bf16 dense; H100:
 * 80 GB, 3.35 TB/s; A100: 80 GB, 2,039 GB/s, 312 TFLOP/s) or, for cpu,
 * within what two cores can do.  Each bad-file class (missing, unknown,
 * duplicate, negative, zero where a rate divides, non-numeric, a broken
 * table, a fractional node size) is planted in an otherwise good file and
 * must give its one line naming FILE:LINE and the field, compared whole.
 * The formulas are checked against numbers worked out by hand in the
 * comments (relative 1e-12: a few flops each), the auto fraction also
 * against its defining inequality on both sides of the answer.
 */
#include <unistd.h>

#include "testutil.h"
#include "profile.h"

#define TOL 1e-12

static int close_to(double got, double want) {
    return fabs(got - want) <= TOL * fabs(want);
}
#define EXPECT(got, want) \
    do { \
        double g_ = (got), w_ = (want); \
        if (!close_to(g_, w_)) fail_msg("%s = %.17g, want %.17g", #got, g_, w_); \
    } while (0)

/* A good profile, one field a line (line k+1 holds good[k]). */
static const char *const good[] = {
    "name test",
    "memory_bytes 1e9",
    "peak_flops_f32 1e11",
    "peak_flops_bf16 1e12   # a comment",
    "gemm_eff 1e6:0.5 1e8:0.9",
    "mem_bw 1e11",
    "launch_overhead_s 1e-6",
    "h2d_bw 10e9",
    "d2h_bw 20e9",
    "intra_alpha_s 1e-5",
    "intra_beta 1e10",
    "inter_alpha_s 2e-5",
    "inter_beta 1e9",
    "node_size 4",
    "attn_eff 0.5",
};
enum { NGOOD = sizeof good / sizeof good[0] };

/* good with line `line` (1-based) replaced by repl (NULL: dropped) and
 * extra appended (NULL: none), written to a temporary .profile file. */
static void write_profile(char *path, int line, const char *repl, const char *extra) {
    strcpy(path, "/tmp/kiln_profile_XXXXXX.profile");
    int fd = mkstemps(path, 8);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    for (int k = 0; k < NGOOD; k++) {
        if (k + 1 != line) fprintf(f, "%s\n", good[k]);
        else if (repl) fprintf(f, "%s\n", repl);
    }
    if (extra) fprintf(f, "%s\n", extra);
    fclose(f);
}

static Profile load_good(void) {
    char path[64], err[512];
    Profile p;
    write_profile(path, 0, NULL, NULL);
    if (profile_load(&p, path, err, sizeof err)) fail_msg("%s", err);
    unlink(path);
    return p;
}

/* ---- the shipped profiles ---- */

static Profile load_named(const char *name) {
    Profile p;
    char err[512];
    if (profile_load(&p, name, err, sizeof err)) fail_msg("%s: %s", name, err);
    return p;
}

static void test_shipped(void **state) {
    (void)state;
    static const char *const names[] = {"cpu", "h100-sxm", "h200-sxm", "a100-80g"};
    for (int i = 0; i < 4; i++) {
        Profile p = load_named(names[i]);
        assert_string_equal(p.name, names[i]);
        assert_true(p.peak_flops_bf16 >= p.peak_flops_f32);
        assert_true(p.h2d_bw <= p.mem_bw && p.d2h_bw <= p.mem_bw);
        assert_true(p.inter_beta <= p.intra_beta);
        assert_true(p.node_size >= 1 && p.neff >= 2);
        for (int k = 0; k < p.neff; k++) assert_true(p.eff[k] > 0 && p.eff[k] <= 1);
    }
    Profile h200 = load_named("h200"), h100 = load_named("h100"), a100 = load_named("a100"), cpu = load_named("cpu");
    assert_string_equal(h200.name, "h200-sxm");
    EXPECT(h200.memory_bytes, 141e9);
    EXPECT(h200.mem_bw, 4.8e12);
    EXPECT(h200.peak_flops_bf16, 1979e12 / 2);
    EXPECT(h200.intra_beta, 900e9 / 2);
    EXPECT(h100.memory_bytes, 80e9);
    EXPECT(h100.mem_bw, 3.35e12);
    EXPECT(h100.peak_flops_bf16, h200.peak_flops_bf16); /* one GH100 die */
    EXPECT(a100.memory_bytes, 80e9);
    EXPECT(a100.mem_bw, 2039e9);
    EXPECT(a100.peak_flops_bf16, 312e12);
    EXPECT(a100.peak_flops_f32, 19.5e12);
    /* two AVX2 cores: at most 2 · 16 f32 FMA-flops · 2 units · 4 GHz = 256 GFLOP/s */
    assert_true(cpu.peak_flops_f32 > 1e9 && cpu.peak_flops_f32 < 256e9);
    assert_true(cpu.memory_bytes > 1e9);
    /* the GPU profiles' host copies: the 15-21 GB/s measured range (DESIGN §9.4) */
    assert_true(h200.h2d_bw >= 15e9 && h200.h2d_bw <= 21e9 && a100.d2h_bw >= 15e9 && a100.d2h_bw <= 21e9);
}

static void test_not_found(void **state) {
    (void)state;
    Profile p;
    char err[512];
    assert_int_equal(profile_load(&p, "tpu-v9", err, sizeof err), -1);
    assert_string_equal(err, "no device profile named \"tpu-v9\" (shipped: cpu, h100-sxm, h200-sxm, a100-80g; or give a path)");
    assert_int_equal(profile_load(&p, "/nonexistent/x.profile", err, sizeof err), -1);
    assert_string_equal(err, "/nonexistent/x.profile: cannot open the device profile");
}

/* ---- bad files: one line each, naming file:line and the field ---- */

static void expect_error(int line, const char *repl, const char *extra, const char *want_fmt) {
    char path[64], err[512], want[512];
    Profile p;
    write_profile(path, line, repl, extra);
    snprintf(want, sizeof want, want_fmt, path);
    int rc = profile_load(&p, path, err, sizeof err);
    unlink(path);
    if (rc != -1) fail_msg("no error for line %d = \"%s\"", line, repl ? repl : "(dropped)");
    assert_string_equal(err, want);
    assert_null(strchr(err, '\n'));
}

static void test_bad_files(void **state) {
    (void)state;
    expect_error(14, NULL, NULL, "%s: missing field \"node_size\"");
    expect_error(5, NULL, NULL, "%s: missing field \"gemm_eff\"");
    expect_error(3, "peak_flop_f32 1e11", NULL, "%s:3: unknown field \"peak_flop_f32\"");
    expect_error(0, NULL, "mem_bw 2e11", "%s:16: field \"mem_bw\" given twice (first on line 6)");
    expect_error(8, "h2d_bw -10e9", NULL, "%s:8: field \"h2d_bw\" is negative (-10e9)");
    expect_error(7, "launch_overhead_s -1e-6  # negative", NULL, "%s:7: field \"launch_overhead_s\" is negative (-1e-6)");
    expect_error(9, "d2h_bw fast", NULL, "%s:9: field \"d2h_bw\": expected a number, got \"fast\"");
    expect_error(2, "memory_bytes 80GB", NULL, "%s:2: field \"memory_bytes\": expected a number, got \"80GB\"");
    expect_error(11, "intra_beta inf", NULL, "%s:11: field \"intra_beta\": expected a number, got \"inf\"");
    expect_error(6, "mem_bw", NULL, "%s:6: field \"mem_bw\" has no value");
    expect_error(13, "inter_beta 0", NULL, "%s:13: field \"inter_beta\" must be positive, got \"0\"");
    expect_error(14, "node_size 1.5", NULL, "%s:14: field \"node_size\": expected a whole number of at least 1, got \"1.5\"");
    expect_error(5, "gemm_eff 1e8:0.5 1e6:0.9", NULL,
                 "%s:5: field \"gemm_eff\": expected up to 16 SIZE:EFF pairs, sizes positive and increasing, efficiencies in (0, 1], got \"1e8:0.5 1e6:0.9\"");
    expect_error(5, "gemm_eff 1e6:1.5", NULL,
                 "%s:5: field \"gemm_eff\": expected up to 16 SIZE:EFF pairs, sizes positive and increasing, efficiencies in (0, 1], got \"1e6:1.5\"");
    expect_error(15, NULL, NULL, "%s: missing field \"attn_eff\"");
    expect_error(15, "attn_eff 1.5", NULL, "%s:15: field \"attn_eff\": expected a fraction in (0, 1], got \"1.5\"");
    expect_error(15, "attn_eff -0.5", NULL, "%s:15: field \"attn_eff\" is negative (-0.5)");
    expect_error(1, "name two words", NULL, "%s:1: field \"name\": expected one word under 64 characters, got \"two words\"");
    /* zero latency is allowed (a rate is not) */
    char path[64], err[512];
    Profile p;
    write_profile(path, 10, "intra_alpha_s 0", NULL);
    int rc = profile_load(&p, path, err, sizeof err);
    unlink(path);
    if (rc) fail_msg("%s", err);
}

/* ---- the formulas, against hand computations ---- */

static void test_gemm(void **state) {
    (void)state;
    Profile p = load_good(); /* eff 0.5 at 1e6, 0.9 at 1e8; peaks 1e11 f32, 1e12 bf16; launch 1e-6 */
    EXPECT(profile_gemm_eff(&p, 1e7), 0.7); /* halfway in log between the points */
    EXPECT(profile_gemm_eff(&p, 1e3), 0.5); /* below the table: its first point */
    EXPECT(profile_gemm_eff(&p, 1e12), 0.9);
    EXPECT(profile_gemm_eff(&p, 1e6 * pow(100, 0.25)), 0.6);
    /* 100·100·1000 = 1e7 bf16: 2e7 / (1e12 · 0.7) + 1e-6 = 2.857142857142857e-5 + 1e-6 */
    EXPECT(profile_gemm_seconds(&p, DT_BF16, 100, 100, 1000), 2e7 / 0.7e12 + 1e-6);
    EXPECT(profile_gemm_seconds(&p, DT_BF16, 100, 100, 1000), 2.9571428571428571e-5);
    /* f32, 1e9 (above the table: 0.9): 2e9 / (1e11 · 0.9) + 1e-6 = 0.022223222... */
    EXPECT(profile_gemm_seconds(&p, DT_F32, 1000, 1000, 1000), 0.022222222222222223 + 1e-6);
}

static void test_copy_and_collectives(void **state) {
    (void)state;
    Profile p = load_good(); /* h2d 10 GB/s, d2h 20 GB/s; intra 1e-5 s + 1e10 B/s, inter 2e-5 s + 1e9 B/s */
    EXPECT(profile_copy_seconds(&p, 1e9, 1), 0.05);
    EXPECT(profile_copy_seconds(&p, 1e9, 0), 0.1);
    /* 4 ranks, 1e9 bytes, intra: all-reduce 6·1e-5 + 1.5·0.1 = 0.15006 */
    EXPECT(profile_coll_seconds(&p, COLL_ALL_REDUCE, 1e9, 4, 1), 0.15006);
    /* all-gather, reduce-scatter: 3·1e-5 + 0.75·0.1 = 0.07503; p2p 1e-5 + 0.1 */
    EXPECT(profile_coll_seconds(&p, COLL_ALL_GATHER, 1e9, 4, 1), 0.07503);
    EXPECT(profile_coll_seconds(&p, COLL_REDUCE_SCATTER, 1e9, 4, 1), 0.07503);
    EXPECT(profile_coll_seconds(&p, COLL_P2P, 1e9, 2, 1), 0.10001);
    /* inter, 8 ranks, 1e8 bytes: all-reduce 14·2e-5 + 1.75·0.1 = 0.17528 */
    EXPECT(profile_coll_seconds(&p, COLL_ALL_REDUCE, 1e8, 8, 0), 0.17528);
    assert_true(profile_coll_seconds(&p, COLL_ALL_REDUCE, 1e9, 1, 1) == 0);
}

/* ---- the offload policy ---- */

/* PipeOffload's condition, written out */
static int fits(const Profile *p, double a, double saved, double hide) {
    return (a * saved / p->d2h_bw + a * saved / p->h2d_bw) / 2 <= hide * (1 + 1e-12);
}

static void test_auto_fraction(void **state) {
    (void)state;
    Profile p = load_good(); /* d2h 20 GB/s, h2d 10 GB/s: 1 GB takes (0.05 + 0.1)/2 = 0.075 s */
    EXPECT(offload_auto_fraction(&p, 1e9, 0.03), 0.4);
    EXPECT(offload_auto_fraction(&p, 1e9, 0.0375), 0.5);
    EXPECT(offload_auto_fraction(&p, 1e9, 0.075), 1.0);
    EXPECT(offload_auto_fraction(&p, 1e9, 10), 1.0);
    assert_true(offload_auto_fraction(&p, 1e9, 0) == 0);
    assert_true(offload_auto_fraction(&p, 1e9, -1) == 0);
    assert_true(offload_auto_fraction(&p, 0, 0.01) == 1);
    assert_true(offload_auto_fraction(&p, 1e9, NAN) == 0);
    /* h200: 20 GB/s both ways, 2 GB hide 0.05 s: 0.05 / 0.1 = 0.5 */
    Profile h200 = load_named("h200");
    EXPECT(offload_auto_fraction(&h200, 2e9, 0.05), 0.5);
    /* the largest: it fits, 1e-9 more does not */
    for (double hide = 0.001; hide < 0.07; hide *= 1.7) {
        double a = offload_auto_fraction(&p, 1e9, hide);
        assert_true(fits(&p, a, 1e9, hide));
        assert_false(fits(&p, a + 1e-9, 1e9, hide));
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shipped),
        cmocka_unit_test(test_not_found),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_gemm),
        cmocka_unit_test(test_copy_and_collectives),
        cmocka_unit_test(test_auto_fraction),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
