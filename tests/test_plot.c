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

/* ---- pipeline timelines: planned (plot_pp_timeline) ---- */

/* A plan built by hand: each rank's list as "F0.1@2-3 ..." (kind, chunk.mb,
 * start-end). */
typedef struct {
    PpPlan pl;
    PpTimes t;
    Action acts[4][32], *rows[4];
    int nact[4], off[5];
    double start[128], end[128];
} HandPlan;

static void hand_plan(HandPlan *h, int p, int v, int m, const char *const *ranks) {
    memset(h, 0, sizeof *h);
    int k = 0;
    for (int r = 0; r < p; r++) {
        const char *s = ranks[r];
        char kind;
        int c, mb, used;
        double t0, t1;
        h->rows[r] = h->acts[r];
        while (sscanf(s, " %c%d.%d@%lf-%lf%n", &kind, &c, &mb, &t0, &t1, &used) == 5) {
            h->acts[r][h->nact[r]++] = (Action){kind == 'F' ? ACT_F : kind == 'B' ? ACT_B : ACT_W, c, mb};
            h->start[k] = t0, h->end[k++] = t1;
            s += used;
        }
        h->off[r + 1] = k;
    }
    h->pl = (PpPlan){PS_1F1B, p, v, m, h->nact, h->rows};
    h->t = (PpTimes){h->start, h->end, h->off, 0, 0};
}

/* 1F1B on 2 ranks, 4 micro-batches, F 1 and B 2 per chunk, no latency:
 * worked out by hand; the step is 15 and the bubble (p-1)/(m+p-1) = 20%. */
static const char *const plan_1f1b[2] = {
    "F0.0@0-1 F0.1@1-2 B0.0@4-6 F0.2@6-7 B0.1@7-9 F0.3@9-10 B0.2@10-12 B0.3@13-15",
    "F1.0@1-2 B1.0@2-4 F1.1@4-5 B1.1@5-7 F1.2@7-8 B1.2@8-10 F1.3@10-11 B1.3@11-13",
};

/* Draws h into NAME; returns plot_pp_timeline's result, the error in err. */
static int pp_svg(const HandPlan *h, const char *title, const char *name, long *written) {
    FILE *f = fopen(at(name), "w");
    assert_non_null(f);
    err[0] = 0;
    int rc = plot_pp_timeline(f, &h->pl, &h->t, title, err, sizeof err);
    *written = ftell(f);
    assert_int_equal(fclose(f), 0);
    return rc;
}

/* Each <rect class="act K" ...>'s fill and its hover title's kind and mb. */
typedef struct {
    char kind;
    int mb;
    unsigned fill;
} Block;

static int blocks(const char *svg, Block *b, int max) {
    int n = 0;
    for (const char *p = svg; (p = strstr(p, "<rect class=\"act ")) && n < max; p++) {
        int r, c;
        const char *fill = strstr(p, "fill=\"#"), *tip = strstr(p, "<title>rank ");
        assert_true(fill && tip);
        assert_int_equal(sscanf(fill, "fill=\"#%x\"", &b[n].fill), 1);
        assert_int_equal(sscanf(tip, "<title>rank %d: %c chunk %d mb %d", &r, &b[n].kind, &c, &b[n].mb), 4);
        assert_int_equal(b[n].kind, p[strlen("<rect class=\"act ")]);
        n++;
    }
    return n;
}

static void test_pp_planned(void **state) {
    HandPlan h;
    long written;
    hand_plan(&h, 2, 1, 4, plan_1f1b);
    assert_int_equal(pp_svg(&h, "1f1b, p 2, m 4", "pp.svg", &written), 0);
    assert_true(xml_ok(at("pp.svg")));
    const char *svg = slurp(at("pp.svg"));
    assert_non_null(strstr(svg, ">1f1b, p 2, m 4: bubble 20.0%</text>"));
    assert_int_equal(count(svg, "<rect class=\"row\""), 2);
    assert_int_equal(count(svg, "<rect class=\"act F\""), 8);
    assert_int_equal(count(svg, "<rect class=\"act B\""), 8);
    assert_int_equal(count(svg, "<rect class=\"act W\""), 0);
    assert_int_equal(count(svg, "class=\"label\""), 16); /* every block is wide enough for "cC mM" */
    assert_non_null(strstr(svg, ">c1 m3</text>"));
    assert_non_null(strstr(svg, ">chunk 1</text>"));
    /* a send per micro-batch each way: F down from rank 0, B up from rank 1, forward in time */
    int down = 0, up = 0;
    for (const char *p = svg; (p = strstr(p, "<line class=\"send\"")); p++) {
        double x1, y1, x2, y2;
        assert_int_equal(sscanf(p, "<line class=\"send\" x1=\"%lf\" y1=\"%lf\" x2=\"%lf\" y2=\"%lf\"", &x1, &y1, &x2, &y2), 4);
        assert_true(x2 >= x1);
        down += y2 > y1, up += y2 < y1;
    }
    assert_int_equal(down, 4);
    assert_int_equal(up, 4);
    /* one colour per (kind, micro-batch): equal within, different across */
    Block b[16];
    assert_int_equal(blocks(svg, b, 16), 16);
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) {
            bool same = b[i].kind == b[j].kind && b[i].mb == b[j].mb;
            if (same != (b[i].fill == b[j].fill))
                fail_msg("%c mb %d is #%06x, %c mb %d is #%06x", b[i].kind, b[i].mb, b[i].fill, b[j].kind, b[j].mb, b[j].fill);
        }
    /* no title: the plan's shape */
    assert_int_equal(pp_svg(&h, NULL, "pp2.svg", &written), 0);
    assert_non_null(strstr(slurp(at("pp2.svg")), ">Pipeline schedule, p 2, v 1, m 4: bubble 20.0%</text>"));
}

/* zb-h1 on 2 ranks, 2 micro-batches, F = B = W = 1: W fills rank 0's wait;
 * the step is 7, busy 12 of 14: bubble 14.3%. */
static void test_pp_planned_w(void **state) {
    static const char *const zb[2] = {
        "F0.0@0-1 F0.1@1-2 B0.0@3-4 W0.0@4-5 B0.1@5-6 W0.1@6-7",
        "F1.0@1-2 B1.0@2-3 F1.1@3-4 B1.1@4-5 W1.0@5-6 W1.1@6-7",
    };
    HandPlan h;
    long written;
    hand_plan(&h, 2, 1, 2, zb);
    h.pl.kind = PS_ZBH1;
    assert_int_equal(pp_svg(&h, "zb-h1", "zb.svg", &written), 0);
    assert_true(xml_ok(at("zb.svg")));
    const char *svg = slurp(at("zb.svg"));
    assert_non_null(strstr(svg, ">zb-h1: bubble 14.3%</text>"));
    assert_int_equal(count(svg, "<rect class=\"act W\""), 4);
    assert_int_equal(count(svg, "fill=\"url(#hatch)\""), 4 + 1); /* + the legend's W */
    assert_int_equal(count(svg, "<line class=\"send\""), 4);
}

/* A broken plan or broken times: -1, one line naming the rank and action,
 * nothing written. */
static void test_pp_planned_bad(void **state) {
    static const struct {
        int rank;
        const char *list, *msg;
    } bad[] = {
        {0, "F0.0@0-1 F0.1@2-1 B0.0@4-6 F0.2@6-7 B0.1@7-9 F0.3@9-10 B0.2@10-12 B0.3@13-15", "rank 0 action 1 (F chunk 0 mb 1): end 1 < start 2"},
        {1, "F1.0@1-2 B2.0@2-4 F1.1@4-5 B1.1@5-7 F1.2@7-8 B1.2@8-10 F1.3@10-11 B1.3@11-13", "rank 1 action 1 (B chunk 2 mb 0): chunk 2 out of range [0, 2)"},
        {1, "F1.0@1-2 B1.0@2-4 F1.1@4-5 B1.1@5-7 F1.2@7-8 B1.2@8-10 F1.3@10-11 B1.4@11-13", "rank 1 action 7 (B chunk 1 mb 4): micro-batch out of range [0, 4)"},
        {1, "F1.0@0.5-2 B1.0@2-4 F1.1@4-5 B1.1@5-7 F1.2@7-8 B1.2@8-10 F1.3@10-11 B1.3@11-13", "rank 1 action 0 (F chunk 1 mb 0): starts at 0.5, before its input F chunk 0 mb 0 (rank 0) ends at 1"},
        {1, "F1.0@1-2 B1.0@2-4 F1.1@3-5 B1.1@5-7 F1.2@7-8 B1.2@8-10 F1.3@10-11 B1.3@11-13", "rank 1 action 2 (F chunk 1 mb 1): starts at 3, before the rank's previous action ends at 4"},
        {1, "F1.0@1-2 B1.0@2-4 F1.0@4-5 B1.1@5-7 F1.2@7-8 B1.2@8-10 F1.3@10-11 B1.3@11-13", "rank 1 action 2 (F chunk 1 mb 0): appears twice (also rank 1 action 0)"},
        {1, "F1.0@1-2 B1.0@2-4 F1.1@4-5 B1.1@5-7 F1.2@7-8 B1.2@8-10 B1.3@11-13", "F chunk 1 mb 3 is in no rank's list"},
        {1, "F1.0@1-2 B1.0@2-4 F1.1@4-5 B1.1@5-7 F1.2@7-8 B1.2@8-10 F1.3@10-11 B1.3@11-13 W1.3@13-14", "W chunk 0 mb 0 is in no rank's list"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        const char *lists[2] = {plan_1f1b[0], plan_1f1b[1]};
        lists[bad[i].rank] = bad[i].list;
        HandPlan h;
        long written;
        hand_plan(&h, 2, 1, 4, lists);
        assert_int_equal(pp_svg(&h, "t", "bad.svg", &written), -1);
        if (!strstr(err, bad[i].msg)) fail_msg("case %zu: '%s' lacks '%s'", i, err, bad[i].msg);
        assert_null(strchr(err, '\n'));
        assert_int_equal(written, 0);
    }
    HandPlan h;
    long written;
    hand_plan(&h, 2, 1, 4, plan_1f1b);
    h.off[1]--;
    assert_int_equal(pp_svg(&h, "t", "bad.svg", &written), -1);
    assert_string_equal(err, "times: rank 0 has 8 actions in the plan but 7 times");
    hand_plan(&h, 2, 1, 4, plan_1f1b);
    h.pl.m = 0;
    assert_int_equal(pp_svg(&h, "t", "bad.svg", &written), -1);
    assert_string_equal(err, "plan has p 2, v 1, m 0: each must be >= 1");
    static const char *const zero[2] = {"F0.0@0-0 F0.1@0-0 B0.0@0-0 B0.1@0-0", "F1.0@0-0 B1.0@0-0 F1.1@0-0 B1.1@0-0"};
    hand_plan(&h, 2, 1, 2, zero);
    assert_int_equal(pp_svg(&h, "t", "bad.svg", &written), -1);
    assert_string_equal(err, "the plan's makespan is 0: nothing to draw");
}

/* ---- pipeline timelines: measured (kiln plot --trace) ---- */

/* Two ranks, two steps (each ends with an opt kernel), times in us.  Step 2:
 * rank 0 runs 100..135 with 30 us of kernels (fwd 10, bwd 15, opt 5);
 * rank 1 posts a receive on the comm stream at 100, computes from 105 to
 * 145, 35 us of kernels.  The step lasts 45 (rank 1): idle 1 - 30/45 =
 * 33.3% on rank 0, 1 - 35/45 = 22.2% on rank 1, 1 - 65/90 = 27.8% in all. */
static const char trace_r0[] =
    "{\"traceEvents\":[\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":0,\"args\":{\"name\":\"0 compute\"}},\n"
    "{\"name\":\"embedding\",\"ph\":\"X\",\"ts\":0,\"dur\":10,\"pid\":0,\"tid\":0,\"args\":{\"at\":\"fwd L-1 m.lua:3\"}},\n"
    "{\"name\":\"matmul\",\"ph\":\"X\",\"ts\":10,\"dur\":20,\"pid\":0,\"tid\":0,\"args\":{\"at\":\"bwd L0 m.lua:4\"}},\n"
    "{\"name\":\"adamw\",\"ph\":\"X\",\"ts\":30,\"dur\":5,\"pid\":0,\"tid\":0,\"args\":{\"at\":\"opt L-1 m.lua:1\"}},\n"
    "{\"name\":\"embedding\",\"ph\":\"X\",\"ts\":100,\"dur\":10,\"pid\":0,\"tid\":0,\"args\":{\"at\":\"fwd L-1 m.lua:3\"}},\n"
    "{\"name\":\"matmul\",\"ph\":\"X\",\"ts\":110,\"dur\":15,\"pid\":0,\"tid\":0,\"args\":{\"at\":\"bwd L0 m.lua:4\"}},\n"
    "{\"name\":\"adamw\",\"ph\":\"X\",\"ts\":130,\"dur\":5,\"pid\":0,\"tid\":0,\"args\":{\"at\":\"opt L-1 m.lua:1\"}}\n]}\n";
static const char trace_r1[] =
    "{\"traceEvents\":[\n"
    "{\"name\":\"embedding\",\"ph\":\"X\",\"ts\":0,\"dur\":10,\"pid\":1,\"tid\":0,\"args\":{\"at\":\"fwd L-1 m.lua:3\"}},\n"
    "{\"name\":\"adamw\",\"ph\":\"X\",\"ts\":30,\"dur\":5,\"pid\":1,\"tid\":0,\"args\":{\"at\":\"opt L-1 m.lua:1\"}},\n"
    "{\"name\":\"recv\",\"ph\":\"X\",\"ts\":100,\"dur\":5,\"pid\":1,\"tid\":1,\"args\":{\"at\":\"fwd L0 m.lua:4\",\"bytes\":64}},\n"
    "{\"name\":\"matmul\",\"ph\":\"X\",\"ts\":105,\"dur\":10,\"pid\":1,\"tid\":0,\"args\":{\"at\":\"fwd L0 m.lua:4\"}},\n"
    "{\"name\":\"kernel\",\"ph\":\"X\",\"ts\":120,\"dur\":20,\"pid\":1,\"tid\":0},\n"
    "{\"name\":\"adamw\",\"ph\":\"X\",\"ts\":140,\"dur\":5,\"pid\":1,\"tid\":0,\"args\":{\"at\":\"opt L-1 m.lua:1\"}}\n]}\n";

static void test_trace(void **state) {
    put(at("t.json"), trace_r0);
    put(at("t.json.rank1"), trace_r1);
    assert_int_equal(PLOT("--trace", at("t.json"), at("t.json.rank1"), "-o", at("tr.svg")), 0);
    assert_true(xml_ok(at("tr.svg")));
    const char *svg = slurp(at("tr.svg"));
    assert_non_null(strstr(svg, ">Measured timeline: step 2 of 2, compute idle 27.8%</text>"));
    assert_int_equal(count(svg, "<rect class=\"row\""), 2);
    assert_non_null(strstr(svg, ">rank 0, idle 33.3%</text>"));
    assert_non_null(strstr(svg, ">rank 1, idle 22.2%</text>"));
    assert_int_equal(count(svg, "<rect class=\"kernel"), 6); /* step 2's compute kernels */
    assert_int_equal(count(svg, "<rect class=\"kernel fwd\""), 2);
    assert_int_equal(count(svg, "<rect class=\"kernel bwd\""), 1);
    assert_int_equal(count(svg, "<rect class=\"kernel opt\""), 2);
    assert_int_equal(count(svg, "<rect class=\"kernel\""), 1); /* no args.at: no phase */
    assert_int_equal(count(svg, "<rect class=\"comm\""), 1);
    /* step 1: rank 0 busy 35 of 35, rank 1 busy 15 of 35 */
    assert_int_equal(PLOT("--trace", at("t.json"), at("t.json.rank1"), "-o", at("tr.svg"), "--step", "1", "--title", "pp"), 0);
    svg = slurp(at("tr.svg"));
    assert_non_null(strstr(svg, ">pp: step 1 of 2, compute idle 28.6%</text>"));
    assert_int_equal(count(svg, "<rect class=\"kernel"), 5);
    assert_int_equal(count(svg, "<rect class=\"comm\""), 0);
}

static void test_trace_bad(void **state) {
    char out[512];
    snprintf(out, sizeof out, "%s", at("keep.svg"));
    put(out, "old\n");
    put(at("t.json"), trace_r0);
    check_bad(PLOT("--trace", at("t.json"), at("missing.json"), "-o", out), "missing.json", out);
    assert_non_null(strstr(err, "cannot open"));
    char cut[sizeof trace_r0] = {0};
    memcpy(cut, trace_r0, sizeof trace_r0 / 2);
    put(at("cut.json"), cut);
    check_bad(PLOT("--trace", at("t.json"), at("cut.json"), "-o", out), "cut.json: not a trace: ", out);
    put(at("log.json"), "{\"step\":1,\"loss\":2}\n");
    check_bad(PLOT("--trace", at("log.json"), "-o", out), "log.json: not a Chrome trace: no \"traceEvents\" array", out);
    put(at("ts.json"), "{\"traceEvents\":[{\"name\":\"a\",\"ph\":\"X\",\"ts\":\"0\",\"dur\":1,\"pid\":0,\"tid\":0}]}");
    check_bad(PLOT("--trace", at("ts.json"), "-o", out), "ts.json: traceEvents[0]: \"ts\" is not a number", out);
    put(at("nocomp.json"), "{\"traceEvents\":[{\"name\":\"a\",\"ph\":\"X\",\"ts\":0,\"dur\":1,\"pid\":0,\"tid\":1}]}");
    check_bad(PLOT("--trace", at("nocomp.json"), "-o", out), "nocomp.json: no kernel on the compute stream", out);
    check_bad(PLOT("--trace", at("t.json"), "-o", out, "--step", "3"), "--step 3: ", out);
    assert_non_null(strstr(err, "t.json has 2 steps"));
    check_bad(PLOT("--trace", at("t.json"), "-o", out, "--step", "0"), "--step: expected a step number", out);
    check_bad(PLOT(at("t.json"), "-o", out, "--step", "1"), "needs --trace", out);
    check_bad(PLOT("--trace", at("t.json"), "-o", out, "--log-y"), "not --trace", out);
    check_bad(PLOT("--trace", "-o", out), "no trace file", out);
    check_bad(PLOT("--trace", out, "-o", out), "not writing over it", out);
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
        cmocka_unit_test_setup_teardown(test_pp_planned, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pp_planned_w, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pp_planned_bad, setup, teardown),
        cmocka_unit_test_setup_teardown(test_trace, setup, teardown),
        cmocka_unit_test_setup_teardown(test_trace_bad, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
