/* test_shards.c — token shards (runtime/io/shards.c): write → read round trips
 * for both versions, every bad input with its one-line error (and nothing
 * written over), globs in order, and the window sampler: determinism, the
 * text path draw for draw, and the rank/world split. */
#include "testutil.h"

#include <sys/stat.h>
#include <unistd.h>

#include "data.h"
#include "shards.h"

static char dir[64];

static const char *at(const char *name) {
    static char buf[4][256];
    static int k;
    char *b = buf[k++ % 4];
    snprintf(b, 256, "%s/%s", dir, name);
    return b;
}

static int setup(void **st) {
    snprintf(dir, sizeof dir, "/tmp/kiln_shards_XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **st) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(p, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

static size_t file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (size_t)st.st_size : (size_t)-1;
}

static void round_trip(int version, uint32_t bound) {
    enum { N = 5000 };
    uint32_t *tok = malloc(N * sizeof *tok);
    uint64_t s = 7;
    for (int i = 0; i < N; i++) tok[i] = (uint32_t)(data_next(&s) % bound);
    char err[512];
    const char *path = at(version == 1 ? "v1.bin" : "v2.bin");
    assert_int_equal(shard_write(path, tok, N, version, err, sizeof err), 0);
    assert_int_equal(file_size(path), SHARD_HEADER_BYTES + N * (version == 1 ? 2 : 4));
    assert_int_equal(access(at(version == 1 ? "v1.bin.tmp" : "v2.bin.tmp"), F_OK), -1);
    Dataset d;
    assert_int_equal(dataset_open(&d, path, bound, "--data", err, sizeof err), 0);
    assert_int_equal(d.n, N);
    for (int i = 0; i < N; i++) assert_int_equal(dataset_token(&d, (size_t)i), tok[i]);
    dataset_close(&d);
    free(tok);
}

static void test_round_trip_v1(void **st) { round_trip(1, 65536); }
static void test_round_trip_v2(void **st) { round_trip(2, 100277); }

/* A writer that fails leaves the file it would have replaced untouched. */
static void test_failed_write_keeps_old_file(void **st) {
    char err[512];
    uint32_t ok[3] = {1, 2, 3}, bad[2] = {5, 70000};
    const char *path = at("keep.bin");
    assert_int_equal(shard_write(path, ok, 3, 1, err, sizeof err), 0);
    assert_int_equal(shard_write(path, bad, 2, 1, err, sizeof err), -1);
    assert_non_null(strstr(err, "70000"));
    assert_int_equal(access(at("keep.bin.tmp"), F_OK), -1);
    Dataset d;
    assert_int_equal(dataset_open(&d, path, 0, "--data", err, sizeof err), 0);
    assert_int_equal(d.n, 3);
    assert_int_equal(dataset_token(&d, 2), 3);
    dataset_close(&d);
    assert_int_equal(shard_write(at("nodir/x.bin"), ok, 3, 1, err, sizeof err), -1);
    assert_non_null(strstr(err, "nodir/x.bin"));
}

/* Open path (a file written with the given header and payload) and expect
 * failure with an error naming the file and containing `want`, on one line;
 * the file is unchanged afterwards. */
static void expect_bad(const char *name, int32_t magic, int32_t version, int32_t count, size_t payload, int64_t vocab,
                       const char *want) {
    size_t n = SHARD_HEADER_BYTES + payload;
    unsigned char *buf = calloc(1, n);
    int32_t h[3] = {magic, version, count};
    memcpy(buf, h, sizeof h);
    for (size_t i = SHARD_HEADER_BYTES; i < n; i++) buf[i] = (unsigned char)(i * 37);
    const char *path = at(name);
    write_bytes(path, buf, n);
    char err[512] = "";
    Dataset d;
    assert_int_equal(dataset_open(&d, path, vocab, "--data", err, sizeof err), -1);
    printf("# %s\n", err);
    assert_non_null(strstr(err, path));
    assert_non_null(strstr(err, want));
    assert_null(strchr(err, '\n'));
    assert_int_equal(d.files, NULL);
    FILE *f = fopen(path, "rb");
    unsigned char *again = malloc(n + 1);
    assert_int_equal(fread(again, 1, n + 1, f), n);
    fclose(f);
    assert_memory_equal(buf, again, n);
    free(buf);
    free(again);
}

static void test_bad_inputs(void **st) {
    expect_bad("magic.bin", 20240521, 1, 10, 20, 0, "wrong magic 20240521");
    expect_bad("version.bin", SHARD_MAGIC, 3, 10, 20, 0, "unknown version 3");
    expect_bad("trunc.bin", SHARD_MAGIC, 1, 11, 20, 0, "truncated");
    expect_bad("trunc2.bin", SHARD_MAGIC, 2, 10, 20, 0, "truncated");
    expect_bad("long.bin", SHARD_MAGIC, 1, 9, 20, 0, "2 bytes after the 9 tokens");
    expect_bad("neg.bin", SHARD_MAGIC, 1, -1, 0, 0, "negative token count");
    expect_bad("vocab.bin", SHARD_MAGIC, 1, 10, 20, 256, ">= the vocabulary size 256");
    /* a header cut short */
    const char *path = at("short.bin");
    write_bytes(path, "abc", 3);
    char err[512];
    Dataset d;
    assert_int_equal(dataset_open(&d, path, 0, "--val", err, sizeof err), -1);
    assert_non_null(strstr(err, "--val: "));
    assert_non_null(strstr(err, "truncated header"));
    /* missing file, and a glob that matches nothing */
    assert_int_equal(dataset_open(&d, at("missing.bin"), 0, "--data", err, sizeof err), -1);
    assert_non_null(strstr(err, "missing.bin: cannot open: No such file"));
    assert_int_equal(dataset_open(&d, at("none_*.bin"), 0, "--data", err, sizeof err), -1);
    assert_non_null(strstr(err, "no file matches"));
}

/* Shards of a glob are read in sorted order as one stream; empty shards are
 * fine; text and shards do not mix. */
static void test_glob_in_order(void **st) {
    uint32_t a[5] = {1, 2, 3, 4, 5}, b[3] = {6, 7, 8}, c[2] = {9, 10};
    char err[512];
    assert_int_equal(shard_write(at("g_000002.bin"), c, 2, 2, err, sizeof err), 0);
    assert_int_equal(shard_write(at("g_000000.bin"), a, 5, 1, err, sizeof err), 0);
    assert_int_equal(shard_write(at("g_000001.bin"), NULL, 0, 1, err, sizeof err), 0);
    assert_int_equal(shard_write(at("g_000001b.bin"), b, 3, 1, err, sizeof err), 0);
    Dataset d;
    assert_int_equal(dataset_open(&d, at("g_*.bin"), 11, "--data", err, sizeof err), 0);
    assert_int_equal(d.nfiles, 4);
    assert_int_equal(d.n, 10);
    for (size_t i = 0; i < 10; i++) assert_int_equal(dataset_token(&d, i), i + 1);
    dataset_close(&d);
    assert_int_equal(dataset_open(&d, at("g_*.bin"), 10, "--data", err, sizeof err), -1);
    assert_non_null(strstr(err, "g_000002.bin: token id 10 at position 1 >= the vocabulary size 10"));
    write_bytes(at("g_text.txt"), "hello", 5);
    assert_int_equal(dataset_open(&d, at("g_*"), 0, "--data", err, sizeof err), -1);
    assert_non_null(strstr(err, "both .bin shards and text files"));
}

static void make_text(const char *name, size_t n) {
    char *t = malloc(n);
    uint64_t s = 3;
    for (size_t i = 0; i < n; i++) t[i] = (char)('a' + data_next(&s) % 26);
    write_bytes(at(name), t, n);
    free(t);
}

/* Windows are exactly the tokens at their offsets; the same seed gives the
 * same windows; a different seed different ones; windows cross files. */
static void test_sampling_deterministic(void **st) {
    enum { B = 8, T = 16 };
    char err[512];
    uint32_t tok[100];
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < 100; i++) tok[i] = (uint32_t)(k * 1000 + i);
        char name[32];
        snprintf(name, sizeof name, "s_%06d.bin", k);
        assert_int_equal(shard_write(at(name), tok, 100, 1, err, sizeof err), 0);
    }
    Dataset d;
    assert_int_equal(dataset_open(&d, at("s_*.bin"), 0, "--data", err, sizeof err), 0);
    int32_t x1[B * T], y1[B * T], x2[B * T], y2[B * T];
    size_t o1[B], o2[B];
    int crossed = 0;
    uint64_t r1 = data_rng(42), r2 = data_rng(42), r3 = data_rng(43);
    for (int step = 0; step < 20; step++) {
        dataset_sample(&d, B, T, 0, 1, &r1, x1, y1, o1);
        dataset_sample(&d, B, T, 0, 1, &r2, x2, y2, o2);
        assert_memory_equal(x1, x2, sizeof x1);
        assert_memory_equal(y1, y2, sizeof y1);
        for (int b = 0; b < B; b++) {
            assert_true(o1[b] + T < d.n);
            crossed += o1[b] / 100 != (o1[b] + T) / 100;
            for (int t = 0; t < T; t++) {
                assert_int_equal(x1[b * T + t], dataset_token(&d, o1[b] + (size_t)t));
                assert_int_equal(y1[b * T + t], dataset_token(&d, o1[b] + (size_t)t + 1));
            }
        }
    }
    assert_int_equal(r1, r2);
    assert_true(crossed > 0);
    dataset_sample(&d, B, T, 0, 1, &r3, x2, y2, o2);
    assert_memory_not_equal(x1, x2, sizeof x1);
    dataset_close(&d);
}

/* A text file through the Dataset gives data.c's text sampler, draw for draw
 * (so training on a .txt file keeps its losses bit-identical). */
static void test_text_matches_byte_sampler(void **st) {
    enum { B = 4, T = 32 };
    make_text("corpus.txt", 3000);
    char err[512];
    Corpus c;
    Dataset d;
    assert_int_equal(data_load_text(&c, at("corpus.txt"), err, sizeof err), 0);
    assert_int_equal(dataset_open(&d, at("corpus.txt"), 256, "--data", err, sizeof err), 0);
    assert_int_equal(d.n, c.n);
    uint64_t r1 = data_rng(1337), r2 = data_rng(1337);
    int32_t x1[B * T], y1[B * T], x2[B * T], y2[B * T];
    for (int step = 0; step < 10; step++) {
        data_sample_i32(&c, B, T, &r1, x1, y1);
        dataset_sample(&d, B, T, 0, 1, &r2, x2, y2, NULL);
        assert_memory_equal(x1, x2, sizeof x1);
        assert_memory_equal(y1, y2, sizeof y1);
    }
    assert_int_equal(r1, r2);
    data_free(&c);
    dataset_close(&d);
}

/* Rank r of w takes windows [r*B, (r+1)*B) of the one-rank batch of w*B:
 * every window of that batch goes to exactly one rank, and every rank's
 * generator ends where the one-rank generator does. */
static void test_rank_split(void **st) {
    enum { B = 3, T = 8, W = 4 };
    make_text("ranks.txt", 500);
    char err[512];
    Dataset d;
    assert_int_equal(dataset_open(&d, at("ranks.txt"), 0, "--data", err, sizeof err), 0);
    uint64_t r_all = data_rng(9);
    int32_t xa[W * B * T], ya[W * B * T], x[B * T], y[B * T];
    size_t oa[W * B], o[B];
    int taken[W * B] = {0};
    for (int step = 0; step < 5; step++) {
        uint64_t start = r_all;
        dataset_sample(&d, W * B, T, 0, 1, &r_all, xa, ya, oa);
        memset(taken, 0, sizeof taken);
        for (int r = 0; r < W; r++) {
            uint64_t rr = start;
            dataset_sample(&d, B, T, r, W, &rr, x, y, o);
            assert_int_equal(rr, r_all);
            assert_memory_equal(x, xa + r * B * T, sizeof x);
            assert_memory_equal(y, ya + r * B * T, sizeof y);
            for (int b = 0; b < B; b++)
                for (int g = 0; g < W * B; g++)
                    if (oa[g] == o[b] && g / B == r && g % B == b) taken[g]++;
        }
        for (int g = 0; g < W * B; g++) assert_int_equal(taken[g], 1);
    }
    dataset_close(&d);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_v1),
        cmocka_unit_test(test_round_trip_v2),
        cmocka_unit_test(test_failed_write_keeps_old_file),
        cmocka_unit_test(test_bad_inputs),
        cmocka_unit_test(test_glob_in_order),
        cmocka_unit_test(test_sampling_deterministic),
        cmocka_unit_test(test_text_matches_byte_sampler),
        cmocka_unit_test(test_rank_split),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
