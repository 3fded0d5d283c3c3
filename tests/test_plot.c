/* test_plot.c — `kiln plot`: JSONL training logs to a standalone SVG.
 *
 * Each test writes synthetic logs into a fresh temporary directory, runs
 * kiln_plot_main in-process (stderr captured) and reads the SVG back: it must
 * parse as XML (python3's xml.dom.minidom), hold one polyline per series with
 * one point per logged step, tick labels that are round numbers covering the
 * data, and the validation series when the log has val_loss.  Bad inputs must
 * give exit 1, exactly one line on stderr, and leave an existing output file
 * untouched with no temporary file left behind.
 */
#include "testutil.h"
#include "plot.h"

#include <dirent.h>
#include <stdbool.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[64];

static int setup(void **state) {
    strcpy(dir, "/tmp/kiln_plot_XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd);
}

static const char *at(const char *name) { /* a path in the test directory; 4 live at once */
    static char buf[4][512];
    static int k;
    char *p = buf[k++ % 4];
    snprintf(p, 512, "%s/%s", dir, name);
    return p;
}

static void put(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    return buf;
}

/* A log of n steps, loss = 2 + 8 exp(-step/20) (+ val_loss every `every`
 * steps when every > 0). */
static void put_log(const char *path, int n, int every) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    for (int s = 1; s <= n; s++) {
        double l = 2 + 8 * exp(-s / 20.0);
        fprintf(f, "{\"step\":%d,\"loss\":%.9g,\"lr\":0.0006,\"grad_norm\":1.5,\"elapsed\":%.3f", s, l, s * 0.1);
        if (every > 0 && s % every == 0) fprintf(f, ",\"val_loss\":%.9g", l + 0.1);
        fputs("}\n", f);
    }
    assert_int_equal(fclose(f), 0);
}

/* Runs `kiln plot ARGS...`; stderr goes to err. */
static char err[4096];
static int plot_argv(const char **args) {
    char *argv[32] = {"plot"};
    int argc = 1;
    while (*args) argv[argc++] = (char *)*args++;
    fflush(stderr);
    int saved = dup(2);
    FILE *tf = tmpfile();
    assert_true(saved >= 0 && tf);
    dup2(fileno(tf), 2);
    int rc = kiln_plot_main(argc, argv);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    rewind(tf);
    size_t n = fread(err, 1, sizeof err - 1, tf);
    err[n] = 0;
    fclose(tf);
    return rc;
}
#define PLOT(...) plot_argv((const char *[]){__VA_ARGS__, NULL})

static int xml_ok(const char *path) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 -c 'import xml.dom.minidom,sys; xml.dom.minidom.parse(sys.argv[1])' '%s'", path);
    return system(cmd) == 0;
}

static int count(const char *s, const char *needle) {
    int n = 0;
    for (const char *p = s; (p = strstr(p, needle)); p++) n++;
    return n;
}

/* The points of the k-th <polyline class="cls">: count, and up to max (x, y). */
static int polyline(const char *svg, const char *cls, int k, double *xy, int max) {
    char tag[64];
    snprintf(tag, sizeof tag, "<polyline class=\"%s\"", cls);
    const char *p = svg;
    for (int i = 0; i <= k; i++, p++)
        if (!(p = strstr(p, tag))) return -1;
    p = strstr(p, "points=\"") + 8;
    int n = 0;
    double x, y;
    int used;
    while (sscanf(p, "%lf,%lf%n", &x, &y, &used) == 2) {
        if (n < max) xy[2 * n] = x, xy[2 * n + 1] = y;
        n++, p += used;
    }
    return n;
}

/* The tick labels of class cls ("xtick" or "ytick") and their pixel position. */
static int ticks(const char *svg, const char *cls, double *v, double *px, int max) {
    char tag[64];
    snprintf(tag, sizeof tag, "<text class=\"%s\"", cls);
    int n = 0;
    for (const char *p = svg; n < max && (p = strstr(p, tag)); p++) {
        double x, y;
        assert_int_equal(sscanf(p + strlen(tag), " x=\"%lf\" y=\"%lf\"", &x, &y), 2);
        const char *t = strchr(p, '>') + 1;
        char *end;
        v[n] = strtod(t, &end);
        assert_true(end > t && *end == '<'); /* a plain number */
        px[n++] = cls[0] == 'x' ? x : y;
    }
    return n;
}

static bool is_round(double step) { /* 1, 2 or 5 x 10^k */
    double e = pow(10, floor(log10(step) + 1e-9)), m = step / e;
    return fabs(m - 1) < 1e-6 || fabs(m - 2) < 1e-6 || fabs(m - 5) < 1e-6;
}

/* Linear ticks: equally spaced by a round step, covering [lo, hi]. */
static void check_linear(const double *v, int n, double lo, double hi) {
    assert_true(n >= 3 && n <= 12);
    double step = v[1] - v[0];
    assert_true(is_round(step));
    for (int i = 1; i < n; i++) assert_true(fabs(v[i] - v[i - 1] - step) < 1e-6 * step);
    for (int i = 0; i < n; i++) assert_true(fabs(v[i] / step - round(v[i] / step)) < 1e-6);
    assert_true(v[0] <= lo && v[n - 1] >= hi);
    assert_true(v[0] > lo - step - 1e-9 && v[n - 1] < hi + step + 1e-9); /* tight */
}

static void check_one_line_error(int rc, const char *needle) {
    assert_int_equal(rc, 1);
    assert_true(strlen(err) > 0 && strchr(err, '\n') == err + strlen(err) - 1);
    if (!strstr(err, needle)) fail_msg("error '%s' lacks '%s'", err, needle);
}

/* ---- tests ---- */

static void test_basic(void **state) {
    put_log(at("run.jsonl"), 50, 0);
    assert_int_equal(PLOT(at("run.jsonl"), "-o", at("loss.svg")), 0);
    assert_true(xml_ok(at("loss.svg")));
    const char *svg = slurp(at("loss.svg"));
    assert_int_equal(count(svg, "<polyline"), 1);
    assert_int_equal(polyline(svg, "train", 0, NULL, 0), 50);
    assert_int_equal(count(svg, "class=\"val\""), 0);
    assert_non_null(strstr(svg, "Training loss"));
    assert_non_null(strstr(svg, "run.jsonl</text>"));
    double v[64], px[64];
    int n = ticks(svg, "xtick", v, px, 64);
    check_linear(v, n, 1, 50);
    n = ticks(svg, "ytick", v, px, 64);
    check_linear(v, n, 2 + 8 * exp(-50 / 20.0), 2 + 8 * exp(-1 / 20.0));
    for (int i = 1; i < n; i++) assert_true(px[i] < px[i - 1]); /* up the page */
}

static void test_val_series(void **state) {
    put_log(at("run.jsonl"), 50, 10);
    assert_int_equal(PLOT(at("run.jsonl"), "-o", at("loss.svg"), "--title", "GPT <2> & co"), 0);
    assert_true(xml_ok(at("loss.svg")));
    const char *svg = slurp(at("loss.svg"));
    assert_int_equal(count(svg, "<polyline"), 2);
    assert_int_equal(polyline(svg, "train", 0, NULL, 0), 50);
    double xy[10];
    assert_int_equal(polyline(svg, "val", 0, xy, 5), 5);
    assert_int_equal(count(svg, "<circle"), 5 + 1); /* + the legend's marker */
    assert_non_null(strstr(svg, "run.jsonl (val)</text>"));
    assert_non_null(strstr(svg, ">GPT &lt;2&gt; &amp; co</text>"));
    for (int i = 1; i < 5; i++) assert_true(xy[2 * i] > xy[2 * i - 2]);
}

static void test_several_files(void **state) {
    put_log(at("a&b<c>.jsonl"), 30, 0);
    put_log(at("b.jsonl"), 80, 20);
    put(at("c.jsonl"), "{\"step\":1,\"val_loss\":4}\n{\"step\":2,\"val_loss\":3.5}\n"); /* val only */
    assert_int_equal(PLOT(at("a&b<c>.jsonl"), at("b.jsonl"), at("c.jsonl"), "-o", at("loss.svg")), 0);
    assert_true(xml_ok(at("loss.svg")));
    const char *svg = slurp(at("loss.svg"));
    assert_int_equal(count(svg, "<polyline"), 4);
    assert_int_equal(polyline(svg, "train", 0, NULL, 0), 30);
    assert_int_equal(polyline(svg, "train", 1, NULL, 0), 80);
    assert_int_equal(polyline(svg, "val", 0, NULL, 0), 4);
    assert_int_equal(polyline(svg, "val", 1, NULL, 0), 2);
    assert_non_null(strstr(svg, "a&amp;b&lt;c&gt;.jsonl</text>"));
    double v[64], px[64];
    check_linear(v, ticks(svg, "xtick", v, px, 64), 1, 80);
}

static void test_ticks(void **state) {
    static const double r[][2] = {{0, 1}, {2.31, 10.9}, {0.00123, 0.00187}, {1, 100000}, {-3, 7}, {1e-9, 3e-9}};
    PlotTicks t;
    for (size_t i = 0; i < sizeof r / sizeof *r; i++) {
        plot_ticks(&t, r[i][0], r[i][1], 0, 0);
        check_linear(t.v, t.n, r[i][0], r[i][1]);
    }
    plot_ticks(&t, 3.5, 3.5, 0, 0); /* one value: padded around it */
    check_linear(t.v, t.n, t.v[0], t.v[t.n - 1]);
    assert_true(t.v[0] < 3.5 && t.v[t.n - 1] > 3.5);
    plot_ticks(&t, 7, 7, 0, 1); /* one step */
    check_linear(t.v, t.n, 7, 7);
    assert_true(t.v[1] - t.v[0] >= 1);
    /* log: the decades when the data spans many */
    plot_ticks(&t, 0.5, 500, 1, 0);
    assert_int_equal(t.n, 5);
    for (int i = 0; i < 5; i++) assert_true(fabs(t.v[i] - pow(10, i - 1)) < 1e-12 * t.v[i]);
    plot_ticks(&t, 0.03, 7, 1, 0); /* 1-2-5 */
    assert_true(t.v[0] <= 0.03 && t.v[t.n - 1] >= 7 && t.n <= 12);
    for (int i = 0; i < t.n; i++) assert_true(is_round(t.v[i]));
}

/* Loss halving each step is a straight line on a log axis. */
static void test_log_y(void **state) {
    put(at("run.jsonl"), "{\"step\":1,\"loss\":10}\n{\"step\":2,\"loss\":5}\n{\"step\":3,\"loss\":2.5}\n");
    double xy[6];
    assert_int_equal(PLOT(at("run.jsonl"), "-o", at("lin.svg")), 0);
    assert_int_equal(polyline(slurp(at("lin.svg")), "train", 0, xy, 3), 3);
    assert_true(fabs((xy[3] - xy[1]) - (xy[5] - xy[3])) > 10);
    assert_int_equal(PLOT(at("run.jsonl"), "-o", at("log.svg"), "--log-y"), 0);
    assert_true(xml_ok(at("log.svg")));
    const char *svg = slurp(at("log.svg"));
    assert_non_null(strstr(svg, "loss (log scale)"));
    assert_int_equal(polyline(svg, "train", 0, xy, 3), 3);
    assert_true(fabs((xy[3] - xy[1]) - (xy[5] - xy[3])) < 0.15);
    double v[64], px[64];
    int n = ticks(svg, "ytick", v, px, 64);
    assert_true(n >= 3 && v[0] <= 2.5 && v[n - 1] >= 10 && v[0] > 0);
    for (int i = 0; i < n; i++) assert_true(v[i] == round(v[i])); /* 2, 3, ... 10 */

    /* many decades: ticks at the powers of ten, equally spaced */
    put(at("wide.jsonl"), "{\"step\":1,\"loss\":500}\n{\"step\":2,\"loss\":0.5}\n{\"step\":3,\"loss\":0}\n");
    assert_int_equal(PLOT(at("wide.jsonl"), "-o", at("wide.svg"), "--log-y"), 0);
    assert_non_null(strstr(err, "1 values <= 0 skipped")); /* the 0 */
    svg = slurp(at("wide.svg"));
    assert_int_equal(polyline(svg, "train", 0, NULL, 0), 2);
    n = ticks(svg, "ytick", v, px, 64);
    assert_int_equal(n, 5);
    for (int i = 0; i < n; i++) assert_true(fabs(v[i] - pow(10, i - 1)) < 1e-9);
    for (int i = 2; i < n; i++) assert_true(fabs((px[i] - px[i - 1]) - (px[1] - px[0])) < 0.15);
}

/* Tolerated: other value types, spacing, CRLF, blank lines, NaN, lines
 * without a loss, an incomplete last line; a resumed run replaces steps. */
static void test_tolerant_reader(void **state) {
    put(at("run.jsonl"),
        "{\"run\":\"gpt2 \\\"small\\\"\",\"config\":{\"layers\":[1,2,{\"x\":null}]},\"ok\":true}\n"
        "\n"
        "  { \"step\" : 1 , \"loss\" : 5.5e0, \"note\": \"}\" }\r\n"
        "{\"step\":2,\"loss\":NaN}\n"
        "{\"step\":3,\"loss\":-Infinity,\"val_loss\":5}\n"
        "{\"step\":4,\"loss\":4.5,\"lr\":1E-4}\n"
        "{\"loss\":4.4}\n"
        "{\"step\":5,\"loss\":4.2");
    assert_int_equal(PLOT(at("run.jsonl"), "-o", at("loss.svg")), 0);
    assert_non_null(strstr(err, "run.jsonl:8: warning: last line is incomplete"));
    assert_non_null(strstr(err, "2 non-finite values skipped"));
    const char *svg = slurp(at("loss.svg"));
    assert_int_equal(polyline(svg, "train", 0, NULL, 0), 2);
    assert_int_equal(polyline(svg, "val", 0, NULL, 0), 1);

    /* resumed at step 20 after reaching 30: steps 1..40 once each */
    FILE *f = fopen(at("resumed.jsonl"), "w");
    for (int s = 1; s <= 30; s++) fprintf(f, "{\"step\":%d,\"loss\":%d}\n", s, 100 - s);
    for (int s = 20; s <= 40; s++) fprintf(f, "{\"step\":%d,\"loss\":%d}\n", s, 50 - s);
    fclose(f);
    assert_int_equal(PLOT(at("resumed.jsonl"), "-o", at("loss.svg")), 0);
    double xy[80];
    assert_int_equal(polyline(slurp(at("loss.svg")), "train", 0, xy, 40), 40);
    for (int i = 1; i < 40; i++) assert_true(xy[2 * i] > xy[2 * i - 2]);
}

/* A bad input: exit 1, one line, OUT untouched, no temporary file left. */
static void check_bad(int rc, const char *needle, const char *out) {
    check_one_line_error(rc, needle);
    assert_string_equal(slurp(out), "old\n");
    DIR *d = opendir(dir);
    struct dirent *e;
    while ((e = readdir(d))) assert_null(strstr(e->d_name, ".tmp."));
    closedir(d);
}

static void test_bad_inputs(void **state) {
    char out[512];
    snprintf(out, sizeof out, "%s", at("keep.svg"));
    put(out, "old\n");
    put_log(at("good.jsonl"), 10, 0);
    check_bad(PLOT(at("missing.jsonl"), "-o", out), "cannot open", out);
    put(at("empty.jsonl"), "");
    check_bad(PLOT(at("empty.jsonl"), "-o", out), "no data points", out);
    put(at("noloss.jsonl"), "{\"step\":1,\"lr\":3}\n\n{\"loss\":2}\n");
    check_bad(PLOT(at("good.jsonl"), at("noloss.jsonl"), "-o", out), "no data points", out);
    static const char *bad[] = {
        "{\"step\":3,\"loss\":1}\n{\"step\":4 \"loss\":1}\n",   "expected ',' or '}'",
        "{\"step\":3,\"loss\":1}\n{\"step\":4,\"loss\":01}\n",  "expected ',' or '}'", /* 0, then 1 */
        "{\"step\":3,\"loss\":1}\nstep 4 loss 2\n",            "expected '{'",
        "{\"step\":3,\"loss\":1}\n{\"step\":4,\"loss\":.5}\n",  "bad value",
        "{\"step\":3,\"loss\":1}\n{\"step\":4,\"loss\":1} x\n",  "unexpected text",
        "{\"step\":3,\"loss\":1}\n{\"step\":4,\"loss\":1.}\n",  "bad number",
        "{\"step\":3,\"loss\":1}\n{\"step\":4,\"a\":\"x}\n",     "unterminated string",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i += 2) {
        put(at("bad.jsonl"), bad[i]);
        check_bad(PLOT(at("bad.jsonl"), "-o", out), bad[i + 1], out);
        char where[600];
        snprintf(where, sizeof where, "%s:2: ", at("bad.jsonl"));
        assert_ptr_equal(strstr(err, where), err); /* FILE:LINE: ... */
    }
    /* a cut line in the middle of the file is an error, not a warning */
    put(at("bad.jsonl"), "{\"step\":3,\"loss\":1}\n{\"step\":4,\"lo\n{\"step\":5,\"loss\":1}\n");
    check_bad(PLOT(at("bad.jsonl"), "-o", out), "bad.jsonl:2: unterminated string", out);

    check_bad(PLOT(at("good.jsonl"), "-o", at("nodir/loss.svg")), "cannot write", out);
    check_bad(PLOT(at("good.jsonl"), "-o", at("keep.svg/loss.svg")), "cannot write", out);
    check_bad(PLOT(at("good.jsonl"), "-o", dir), "cannot write", out); /* a directory */
    check_bad(PLOT(out, "-o", out), "not writing over it", out);
    check_bad(PLOT(at("good.jsonl")), "no output file", out);
    check_bad(PLOT("-o", out), "no input", out);
    check_bad(PLOT(at("good.jsonl"), "-o", out, "--log"), "unknown option", out);
    check_bad(PLOT(at("good.jsonl"), "-o", out, "--title"), "missing value", out);
    assert_int_equal(PLOT("--help"), 0);
    /* and a good run does replace it */
    assert_int_equal(PLOT(at("good.jsonl"), "-o", out), 0);
    assert_non_null(strstr(slurp(out), "<svg"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_basic, setup, teardown),
        cmocka_unit_test_setup_teardown(test_val_series, setup, teardown),
        cmocka_unit_test_setup_teardown(test_several_files, setup, teardown),
        cmocka_unit_test(test_ticks),
        cmocka_unit_test_setup_teardown(test_log_y, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tolerant_reader, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_inputs, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
