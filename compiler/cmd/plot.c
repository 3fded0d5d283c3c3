/* plot.c — `kiln plot`: training curves from JSONL logs as a standalone SVG.
 *
 *   kiln plot RUN.jsonl [RUN2.jsonl ...] -o OUT.svg [--title T] [--log-y]
 *
 * The trainer writes one flat JSON object per step ({"step":1,"loss":5.5,
 * "lr":...}) and, every N steps, a "val_loss".  This file reads those logs
 * and draws, for each file, the train loss as a solid line and the
 * validation loss as a dashed line with point markers, in the file's own
 * colour, against the step; a legend names the files.  The result is a
 * plain SVG (axes, round tick values, grid, title) that any browser opens:
 * no plotting program or library is involved.
 *
 * Reading.  Each line is parsed by jansson (runtime/io/json.c): the whole
 * line must be one JSON object; members whose value is a number are kept,
 * others (strings, booleans, null, nested values) are skipped.
 * NaN/Infinity (what Python writes) and nan/inf (what printf writes) are
 * accepted as non-finite numbers: jansson does not read them, so outside
 * strings they are quoted first, and a member that is a string spelled so
 * counts as that number.  A line that is not valid JSON is an error
 * "FILE:LINE: ...", except the last line of a file when it has no newline:
 * that is a write cut short (the run is still going, or was killed), so it
 * is skipped with a warning.  A line adds a train point when it has numeric
 * "step" and "loss", a validation point when it has "step" and "val_loss";
 * other lines (no "step", or neither loss) are skipped silently.  Points
 * with a non-finite value, or (with --log-y) a value <= 0, are dropped with
 * one warning per file.  A step at or below the previous one means the run
 * was resumed from an earlier checkpoint and appended to the same log: the
 * earlier points from that step on are dropped, so the later run wins and
 * each series stays ordered by step.
 *
 * Drawing.  Both axes cover the data with round ticks (plot_ticks): 1, 2 or
 * 5 x 10^k apart on a linear axis.  On a log axis: the same linear ticks
 * when the data spans less than a factor of 10 (a loss from 11 down to 2.5
 * gets 2, 3, ..., 11), else m x 10^k with m in 1..9, 1-2-5 or 1 (every few
 * decades) as the span grows.  Train lines are drawn first, validation on
 * top in a darker shade.  Every point is drawn (no decimation).
 *
 * Writing is atomic: the SVG goes to a temporary file next to OUT, which is
 * flushed, fsync'ed and renamed over OUT; on any error the temporary file is
 * removed and OUT is left as it was.
 */
#include "plot.h"
#include "fsutil.h"
#include "json.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cmd.h"

/* ---- the data ---- */

typedef struct { double x, y; } PlotPt;
typedef struct { PlotPt *p; int n, cap; } PlotSeries;
typedef struct {
    const char *path;
    PlotSeries train, val;
    long nonfinite, nonpositive; /* points dropped */
} PlotRun;

/* Appends (x, y); a step at or below the last one first drops the points
 * from that step on (a resumed run appended to the same log). */
static int series_add(PlotSeries *s, double x, double y) {
    while (s->n > 0 && s->p[s->n - 1].x >= x) s->n--;
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 256;
        PlotPt *p = realloc(s->p, (size_t)cap * sizeof *p);
        if (!p) return -1;
        s->p = p, s->cap = cap;
    }
    s->p[s->n++] = (PlotPt){x, y};
    return 0;
}

/* ---- one line, read by jansson ---- */

/* The members of a line's top-level object that we use. */
typedef struct {
    bool has_step, has_loss, has_val;
    double step, loss, val;
} PlotLine;

/* Whether s[0..n) spells a non-finite number (NaN, Infinity, nan, inf,
 * with an optional '-'), and which. */
static bool nonfinite_word(const char *s, size_t n, double *v) {
    static const char *const words[] = {"NaN", "nan", "Infinity", "inf"};
    size_t neg = n > 0 && *s == '-';
    for (int i = 0; i < 4; i++)
        if (n - neg == strlen(words[i]) && memcmp(s + neg, words[i], n - neg) == 0) {
            *v = i < 2 ? NAN : neg ? -INFINITY : INFINITY;
            return true;
        }
    return false;
}

static bool word_char(char c) { return isalnum((unsigned char)c) || c == '-' || c == '+' || c == '.'; }

/* s[0..n) into out (room for 2n bytes) with every non-finite word outside
 * a string quoted, so that jansson reads it (as a string); returns the new
 * length. */
static size_t quote_nonfinite(const char *s, size_t n, char *out) {
    size_t k = 0;
    for (size_t i = 0, j; i < n; i = j) {
        double v;
        bool quote = false;
        j = i + 1;
        if (s[i] == '"') {
            while (j < n && s[j] != '"') j += s[j] == '\\' ? 2 : 1;
            j = j < n ? j + 1 : n;
        } else if (word_char(s[i])) {
            while (j < n && word_char(s[j])) j++;
            quote = nonfinite_word(s + i, j - i, &v);
        }
        if (quote) out[k++] = '"';
        memcpy(out + k, s + i, j - i);
        k += j - i;
        if (quote) out[k++] = '"';
    }
    return k;
}

/* A member's value as a number: a JSON number, or a non-finite word. */
static bool member_number(const json_t *obj, const char *key, double *v) {
    const json_t *m = json_object_get(obj, key);
    if (json_is_number(m)) return *v = json_number_value(m), true;
    return json_is_string(m) && nonfinite_word(json_string_value(m), json_string_length(m), v);
}

/* Parses one line (len bytes, its newline included).  Returns 0, or -1 with
 * what is wrong in why.  A blank line gives an empty PlotLine. */
static int json_line(const char *line, size_t len, PlotLine *out, char *why, size_t whylen) {
    *out = (PlotLine){0};
    if (len > 0 && line[len - 1] == '\n') len--; /* a newline in a string: the string is cut */
    size_t at = 0, qn, used;
    while (at < len && rt_json_blank(line + at, 1)) at++;
    if (at == len) return 0;
    if (line[at] != '{') return snprintf(why, whylen, "expected '{' (a JSON object per line)"), -1;
    char *q = malloc(2 * len);
    if (!q) return snprintf(why, whylen, "out of memory"), -1;
    qn = quote_nonfinite(line, len, q);
    RtJsonError e;
    json_t *top = rt_json_load(q, qn, 0, &used, &e);
    int rc = -1;
    if (!top) snprintf(why, whylen, "%s%s", e.what, e.near);
    else if (!rt_json_blank(q + used, qn - used)) snprintf(why, whylen, "unexpected text after the object");
    else {
        out->has_step = member_number(top, "step", &out->step);
        out->has_loss = member_number(top, "loss", &out->loss);
        out->has_val = member_number(top, "val_loss", &out->val);
        rc = 0;
    }
    json_decref(top);
    free(q);
    return rc;
}

/* ---- reading a log ---- */

static int run_point(PlotRun *r, PlotSeries *s, double x, double y, bool logy) {
    if (!isfinite(x) || !isfinite(y)) return r->nonfinite++, 0;
    if (logy && y <= 0) return r->nonpositive++, 0;
    return series_add(s, x, y);
}

/* Reads r->path into r's series.  Returns 0, or -1 after printing the error. */
static int run_read(PlotRun *r, bool logy) {
    char err[1024];
    int fd = rt_open_input(NULL, r->path, err, sizeof err); /* a FIFO or a device is refused, not read forever */
    FILE *f = fd < 0 ? NULL : fdopen(fd, "r");
    if (fd >= 0 && !f) close(fd), snprintf(err, sizeof err, "%s: cannot open: %s", r->path, strerror(errno));
    if (!f) return cmd_error("%s", err), -1;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    long lineno = 0;
    int rc = 0;
    while (rc == 0 && (len = getline(&line, &cap, f)) >= 0) {
        PlotLine l;
        char why[256];
        lineno++;
        const char *msg = json_line(line, (size_t)len, &l, why, sizeof why) ? why : NULL;
        if (msg && line[len - 1] != '\n') {
            fprintf(stderr, "kiln plot: %s:%ld: warning: last line is incomplete (%s); skipped\n", r->path, lineno, msg);
            break;
        }
        if (msg) {
            fprintf(stderr, "%s:%ld: %s\n", r->path, lineno, msg);
            rc = -1;
        } else if (l.has_step) {
            if (l.has_loss && run_point(r, &r->train, l.step, l.loss, logy)) rc = -2;
            if (l.has_val && run_point(r, &r->val, l.step, l.val, logy)) rc = -2;
        }
    }
    if (rc == -2) cmd_error("out of memory reading %s", r->path);
    else if (rc == 0 && ferror(f)) cmd_error("cannot read %s: %s", r->path, strerror(errno)), rc = -1;
    free(line);
    fclose(f);
    if (rc) return -1;
    if (r->nonfinite) fprintf(stderr, "kiln plot: %s: warning: %ld non-finite values skipped\n", r->path, r->nonfinite);
    if (r->nonpositive) fprintf(stderr, "kiln plot: %s: warning: %ld values <= 0 skipped (--log-y)\n", r->path, r->nonpositive);
    if (r->train.n + r->val.n == 0) {
        cmd_error("%s: no data points (no line has numeric \"step\" and \"loss\" or \"val_loss\")", r->path);
        return -1;
    }
    return 0;
}

/* ---- ticks ---- */

/* Digits after the point that show a multiple of res exactly. */
static int tick_decimals(double res) {
    if (res >= 1) return 0;
    int d = (int)ceil(-log10(res) - 1e-9);
    return d > 12 ? 12 : d;
}

static double nice_step(double raw) {
    double e = pow(10, floor(log10(raw))), f = raw / e;
    return (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * e;
}

/* About `target` intervals of a round step. */
static int ticks_linear(PlotTicks *t, double lo, double hi, double min_step, double target) {
    if (hi - lo < 1e-12 * fmax(fabs(lo), 1) || hi - lo < min_step) {
        double pad = fmax(lo != 0 ? fabs(lo) * 0.1 : 1, min_step);
        lo -= pad, hi += pad;
    }
    double step = fmax(nice_step((hi - lo) / target), min_step);
    double k0 = floor(lo / step + 1e-9), k1 = ceil(hi / step - 1e-9);
    t->n = 0;
    for (double k = k0; k <= k1 && t->n < PLOT_MAX_TICKS; k++) {
        double v = k * step;
        t->v[t->n] = v == 0 ? 0 : v; /* no -0 */
        t->decimals[t->n++] = tick_decimals(step);
    }
    return t->n;
}

static int ticks_log(PlotTicks *t, double lo, double hi) {
    double ratio = hi / lo;
    if (ratio < 10 && ticks_linear(t, lo, hi, 0, ratio < 3 ? 5 : 8) && t->v[0] > 0) return t->n;
    static const double ones[] = {1}, oto[] = {1, 2, 5}, all[] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    const double *m = ratio < 10 ? all : ratio < 1000 ? oto : ones;
    int nm = ratio < 10 ? 9 : ratio < 1000 ? 3 : 1;
    int k0 = (int)floor(log10(lo) + 1e-9), k1 = (int)ceil(log10(hi) - 1e-9);
    int stride = nm == 1 ? (k1 - k0 + 7) / 8 : 1;
    if (stride < 1) stride = 1;
    k0 = (int)floor((double)k0 / stride) * stride;
    t->n = 0;
    for (int k = k0; k <= k1 + stride && t->n < PLOT_MAX_TICKS; k += stride)
        for (int i = 0; i < nm && t->n < PLOT_MAX_TICKS; i++) {
            double v = m[i] * pow(10, k);
            if (v > lo * (1 + 1e-9) && t->n > 0 && t->v[t->n - 1] >= hi * (1 - 1e-9)) return t->n;
            if (v <= lo * (1 + 1e-9)) t->n = 0; /* the largest candidate <= lo starts */
            t->v[t->n] = v;
            t->decimals[t->n++] = tick_decimals(v);
        }
    return t->n;
}

int plot_ticks(PlotTicks *t, double lo, double hi, int logscale, double min_step) {
    if (logscale && lo > 0) return ticks_log(t, lo, hi);
    return ticks_linear(t, lo, hi, min_step, 5);
}

/* ---- drawing ---- */

enum { SVG_W = 800, SVG_H = 500, PAD_L = 72, PAD_R = 24, PAD_T = 44, PAD_B = 52 };
static const char *const plot_colours[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                           "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
/* the same hues, darker: validation points stand out on the noisy train line */
static const char *const val_colours[] = {"#0b3c66", "#a34a00", "#15601a", "#8a1515", "#553477",
                                          "#4d2f29", "#a3337f", "#404040", "#6b6b0d", "#0b6d78"};

/* The data-to-pixel map of the plot area. */
typedef struct {
    PlotTicks xt, yt;
    bool logy;
    double x0, x1, y0, y1; /* axis ends, y in log10 when logy */
} PlotAxes;

static double ax_x(const PlotAxes *a, double x) {
    return PAD_L + (x - a->x0) / (a->x1 - a->x0) * (SVG_W - PAD_L - PAD_R);
}
static double ax_y(const PlotAxes *a, double y) {
    if (a->logy) y = log10(y);
    return SVG_H - PAD_B - (y - a->y0) / (a->y1 - a->y0) * (SVG_H - PAD_T - PAD_B);
}

static void axes_fit(PlotAxes *a, const PlotRun *runs, int nruns, bool logy) {
    double xlo = INFINITY, xhi = -INFINITY, ylo = INFINITY, yhi = -INFINITY;
    for (int i = 0; i < nruns; i++)
        for (int k = 0; k < 2; k++) {
            const PlotSeries *s = k ? &runs[i].val : &runs[i].train;
            for (int j = 0; j < s->n; j++) {
                xlo = fmin(xlo, s->p[j].x), xhi = fmax(xhi, s->p[j].x);
                ylo = fmin(ylo, s->p[j].y), yhi = fmax(yhi, s->p[j].y);
            }
        }
    a->logy = logy;
    plot_ticks(&a->xt, xlo, xhi, 0, 1);
    plot_ticks(&a->yt, ylo, yhi, logy, 0);
    a->x0 = a->xt.v[0], a->x1 = a->xt.v[a->xt.n - 1];
    a->y0 = a->yt.v[0], a->y1 = a->yt.v[a->yt.n - 1];
    if (logy) a->y0 = log10(a->y0), a->y1 = log10(a->y1);
}

/* Text as XML character data: markup escaped, control characters and bytes
 * that are not UTF-8 replaced by '?', at most max code points (the tail is
 * kept: "…" + the end of a long path). */
static void svg_text(FILE *f, const char *s, int max) {
    int ncp = 0;
    for (const char *q = s; *q; q++) ncp += ((unsigned char)*q & 0xC0) != 0x80;
    if (max > 0 && ncp > max) {
        fputs("\xe2\x80\xa6", f); /* … */
        for (; ncp > max - 1; ncp--)
            for (s++; ((unsigned char)*s & 0xC0) == 0x80; s++) {}
    }
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        int n = *p < 0x80 ? 1 : (*p & 0xE0) == 0xC0 ? 2 : (*p & 0xF0) == 0xE0 ? 3 : (*p & 0xF8) == 0xF0 ? 4 : 0;
        bool ok = n > 0;
        for (int i = 1; ok && i < n; i++) ok = (p[i] & 0xC0) == 0x80;
        if (!ok) { fputc('?', f), p++; continue; }
        if (n > 1) { fwrite(p, 1, (size_t)n, f), p += n; continue; }
        switch (*p) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc(*p < 0x20 || *p == 0x7f ? '?' : *p, f);
        }
        p++;
    }
}

static int text_width(const char *s, int max) { /* code points, capped */
    int n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
    return n < max ? n : max;
}

static void svg_grid_and_ticks(FILE *f, const PlotAxes *a) {
    double l = PAD_L, r = SVG_W - PAD_R, t = PAD_T, b = SVG_H - PAD_B;
    fputs("<g class=\"grid\" stroke=\"#e5e5e5\" stroke-width=\"1\">\n", f);
    for (int i = 0; i < a->xt.n; i++) fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", ax_x(a, a->xt.v[i]), t, ax_x(a, a->xt.v[i]), b);
    for (int i = 0; i < a->yt.n; i++) fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", l, ax_y(a, a->yt.v[i]), r, ax_y(a, a->yt.v[i]));
    fputs("</g>\n<g stroke=\"#333\" stroke-width=\"1\">\n", f);
    for (int i = 0; i < a->xt.n; i++) fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", ax_x(a, a->xt.v[i]), b, ax_x(a, a->xt.v[i]), b + 5);
    for (int i = 0; i < a->yt.n; i++) fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", l - 5, ax_y(a, a->yt.v[i]), l, ax_y(a, a->yt.v[i]));
    fputs("</g>\n<g fill=\"#333\">\n", f);
    for (int i = 0; i < a->xt.n; i++)
        fprintf(f, "<text class=\"xtick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%.*f</text>\n", ax_x(a, a->xt.v[i]), b + 19, a->xt.decimals[i], a->xt.v[i]);
    for (int i = 0; i < a->yt.n; i++)
        fprintf(f, "<text class=\"ytick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%.*f</text>\n", l - 8, ax_y(a, a->yt.v[i]) + 4, a->yt.decimals[i], a->yt.v[i]);
    fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">step</text>\n", (l + r) / 2, SVG_H - 12);
    fprintf(f, "<text transform=\"translate(16 %.1f) rotate(-90)\" text-anchor=\"middle\">%s</text>\n", (t + b) / 2,
            a->logy ? "loss (log scale)" : "loss");
    fprintf(f, "</g>\n<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#333\"/>\n", l, t, r - l, b - t);
}

static void svg_series(FILE *f, const PlotAxes *a, const PlotSeries *s, const char *colour, bool val) {
    if (s->n == 0) return;
    fprintf(f, "<polyline class=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"%s\" stroke-linejoin=\"round\"%s points=\"",
            val ? "val" : "train", colour, val ? "1.5" : "1.2", val ? " stroke-dasharray=\"5 3\"" : "");
    for (int i = 0; i < s->n; i++) fprintf(f, "%s%.1f,%.1f", i ? " " : "", ax_x(a, s->p[i].x), ax_y(a, s->p[i].y));
    fputs("\"/>\n", f);
    if (!val) return;
    fprintf(f, "<g class=\"valpoints\" fill=\"%s\" stroke=\"white\" stroke-width=\"0.8\">\n", colour);
    for (int i = 0; i < s->n; i++) fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\"/>\n", ax_x(a, s->p[i].x), ax_y(a, s->p[i].y));
    fputs("</g>\n", f);
}

enum { LEGEND_MAX_CHARS = 48 };

static void svg_legend(FILE *f, const PlotRun *runs, int nruns) {
    int rows = 0, chars = 0;
    for (int i = 0; i < nruns; i++) {
        int w = text_width(runs[i].path, LEGEND_MAX_CHARS) + (runs[i].val.n ? 6 : 0);
        chars = w > chars ? w : chars;
        rows += (runs[i].train.n > 0) + (runs[i].val.n > 0);
    }
    double w = 40 + chars * 6.8, h = rows * 18 + 8, x = SVG_W - PAD_R - 10 - w, y = PAD_T + 10;
    fprintf(f, "<g class=\"legend\">\n<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"white\" fill-opacity=\"0.85\" stroke=\"#bbb\"/>\n", x, y, w, h);
    int row = 0;
    for (int i = 0; i < nruns; i++)
        for (int k = 0; k < 2; k++) {
            const PlotSeries *s = k ? &runs[i].val : &runs[i].train;
            if (!s->n) continue;
            const char *c = (k ? val_colours : plot_colours)[i % 10];
            double ly = y + 15 + 18 * row++;
            fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"1.5\"%s/>\n", x + 8, ly - 4, x + 30, ly - 4, c,
                    k ? " stroke-dasharray=\"5 3\"" : "");
            if (k) fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\" stroke=\"white\" stroke-width=\"0.8\"/>\n", x + 19, ly - 4, c);
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" fill=\"#333\">", x + 36, ly);
            svg_text(f, runs[i].path, LEGEND_MAX_CHARS);
            fputs(k ? " (val)</text>\n" : "</text>\n", f);
        }
    fputs("</g>\n", f);
}

static void svg_write(FILE *f, const PlotRun *runs, int nruns, const char *title, bool logy) {
    PlotAxes a;
    axes_fit(&a, runs, nruns, logy);
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
               "font-family=\"Helvetica, Arial, sans-serif\" font-size=\"12\">\n"
               "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
               "<text class=\"title\" x=\"%.1f\" y=\"28\" text-anchor=\"middle\" font-size=\"16\" fill=\"#222\">",
            SVG_W, SVG_H, SVG_W, SVG_H, (PAD_L + SVG_W - PAD_R) / 2.0);
    svg_text(f, title, 0);
    fputs("</text>\n", f);
    svg_grid_and_ticks(f, &a);
    for (int i = 0; i < nruns; i++) svg_series(f, &a, &runs[i].train, plot_colours[i % 10], false);
    for (int i = 0; i < nruns; i++) svg_series(f, &a, &runs[i].val, val_colours[i % 10], true);
    svg_legend(f, runs, nruns);
    fputs("</svg>\n", f);
}

/* ---- writing atomically ---- */

/* Writes the SVG to a temporary file next to out and renames it over out. */
static int svg_save(const char *out, const PlotRun *runs, int nruns, const char *title, bool logy) {
    size_t n = strlen(out);
    char *tmp = malloc(n + 16);
    if (!tmp) return cmd_error("out of memory"), -1;
    snprintf(tmp, n + 16, "%s.tmp.XXXXXX", out);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        cmd_error("cannot write %s: %s", out, strerror(errno));
        return free(tmp), -1;
    }
    mode_t mask = umask(0);
    umask(mask);
    FILE *f = fdopen(fd, "w");
    int err = 0;
    if (!f) err = errno, close(fd);
    else {
        if (fchmod(fd, 0666 & ~mask)) err = errno;
        svg_write(f, runs, nruns, title, logy);
        if (fflush(f) || ferror(f)) err = err ? err : errno ? errno : EIO;
        if (fsync(fd)) err = err ? err : errno;
        if (fclose(f)) err = err ? err : errno;
    }
    if (!err && rename(tmp, out)) err = errno;
    if (err) {
        cmd_error("cannot write %s: %s", out, strerror(err));
        unlink(tmp);
    }
    free(tmp);
    return err ? -1 : 0;
}

/* ---- the command ---- */

static void plot_usage(FILE *f) {
    fputs("usage: kiln plot RUN.jsonl [RUN2.jsonl ...] -o OUT.svg [--title T] [--log-y]\n", f);
}

typedef struct {
    const char **inputs;
    int ninputs;
    const char *out, *title;
    bool logy;
} PlotArgs;

/* Returns 0, 1 (error printed) or -1 (--help: exit 0). */
static int plot_args(PlotArgs *a, int argc, char **argv) {
    a->inputs = calloc((size_t)argc, sizeof *a->inputs);
    if (!a->inputs) return cmd_error("out of memory"), 1;
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        bool has_arg = i + 1 < argc;
        if (!strcmp(s, "-h") || !strcmp(s, "--help")) return plot_usage(stdout), -1;
        else if (!strcmp(s, "--log-y")) a->logy = true;
        else if ((!strcmp(s, "-o") || !strcmp(s, "--output")) && has_arg) a->out = argv[++i];
        else if (!strcmp(s, "--title") && has_arg) a->title = argv[++i];
        else if (!strcmp(s, "-o") || !strcmp(s, "--output") || !strcmp(s, "--title"))
            return cmd_error("missing value after %s", s), 1;
        else if (s[0] == '-' && s[1])
            return cmd_error("unknown option '%s' (try kiln plot --help)", s), 1;
        else a->inputs[a->ninputs++] = s;
    }
    if (!a->ninputs) return cmd_error("no input log (usage: kiln plot RUN.jsonl ... -o OUT.svg)"), 1;
    if (!a->out) return cmd_error("no output file (-o OUT.svg)"), 1;
    if (!a->title) a->title = "Training loss";
    return 0;
}

/* Refuses to write over one of the inputs, or over what is not a regular
 * file (fsutil.h: renaming over /dev/null would replace it). */
static int plot_check_out(const PlotArgs *a) {
    RtPath *in = calloc((size_t)a->ninputs + 1, sizeof *in);
    char err[1024];
    if (!in) return cmd_error("out of memory"), 1;
    for (int i = 0; i < a->ninputs; i++) in[i] = (RtPath){"input", a->inputs[i]};
    int rc = rt_check_output("-o", a->out, in, a->ninputs, err, sizeof err);
    free(in);
    return rc ? cmd_error("%s", err), 1 : 0;
}

int kiln_plot_main(int argc, char **argv) {
    cmd_set_prefix("kiln plot: ");
    PlotArgs a = {0};
    int rc = plot_args(&a, argc, argv);
    if (rc) return free(a.inputs), rc < 0 ? 0 : 1;
    rc = plot_check_out(&a);
    PlotRun *runs = calloc((size_t)a.ninputs, sizeof *runs);
    if (!rc && !runs) cmd_error("out of memory"), rc = 1;
    for (int i = 0; !rc && i < a.ninputs; i++) {
        runs[i].path = a.inputs[i];
        rc = run_read(&runs[i], a.logy) ? 1 : 0;
    }
    if (!rc) rc = svg_save(a.out, runs, a.ninputs, a.title, a.logy) ? 1 : 0;
    for (int i = 0; runs && i < a.ninputs; i++) free(runs[i].train.p), free(runs[i].val.p);
    free(runs);
    free(a.inputs);
    return rc;
}
