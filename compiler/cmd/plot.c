/* plot.c — `kiln plot`: training curves from JSONL logs, and pipeline
 * timelines (planned and measured), as standalone SVGs.
 *
 *   kiln plot RUN.jsonl [RUN2.jsonl ...] -o OUT.svg [--title T] [--log-y]
 *   kiln plot --trace TRACE.json [TRACE2.json ...] -o OUT.svg [--step N] [--title T]
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
 * Timelines.  Both pipeline pictures are a Timeline: a row per rank of
 * blocks over time (an optional thin lane under each row), arrows between
 * rows, a time axis from 0 and a legend that flows left to right.
 * plot_pp_timeline fills one from a PpPlan and its PpTimes (ppsched.h):
 * an action per block, the shade telling F/B/W and the hue the micro-batch
 * (hsl, 137.5 degrees apart), an arrow per send between ranks, the bubble
 * computed from the times in the title; the input is checked first, so a
 * broken simulation is an error, not a misleading picture.  It needs only
 * the header's types, not ppsched.c.  `kiln plot --trace` fills one from
 * the ranks' Chrome traces (runtime/cpu/dev_cpu.c writes them): the compute
 * stream (tid 0) split into steps at the optimizer (an `opt` kernel
 * followed by another phase), one step drawn per rank from the first event
 * of any stream after the previous step, kernels coloured by the phase in
 * args.at (the trace names no micro-batch), the other streams on the lane,
 * and the compute stream's idle fraction in the title, defined like the
 * planned bubble.  docs/plot.md says more.
 *
 * Writing is atomic: the SVG goes to a temporary file next to OUT, which is
 * flushed, fsync'ed and renamed over OUT; on any error the temporary file is
 * removed and OUT is left as it was.
 */
#include "plot.h"
#include "fsutil.h"
#include "json.h"
#include "ir.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
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

static void svg_head(FILE *f, int w, int h, double title_x, const char *title) {
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
               "font-family=\"Helvetica, Arial, sans-serif\" font-size=\"12\">\n"
               "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
               "<text class=\"title\" x=\"%.1f\" y=\"28\" text-anchor=\"middle\" font-size=\"16\" fill=\"#222\">",
            w, h, w, h, title_x);
    svg_text(f, title, 0);
    fputs("</text>\n", f);
}

static void svg_write(FILE *f, const PlotRun *runs, int nruns, const char *title, bool logy) {
    PlotAxes a;
    axes_fit(&a, runs, nruns, logy);
    svg_head(f, SVG_W, SVG_H, (PAD_L + SVG_W - PAD_R) / 2.0, title);
    svg_grid_and_ticks(f, &a);
    for (int i = 0; i < nruns; i++) svg_series(f, &a, &runs[i].train, plot_colours[i % 10], false);
    for (int i = 0; i < nruns; i++) svg_series(f, &a, &runs[i].val, val_colours[i % 10], true);
    svg_legend(f, runs, nruns);
    fputs("</svg>\n", f);
}

typedef struct {
    const PlotRun *runs;
    int nruns;
    const char *title;
    bool logy;
} PlotCurves;

static void curves_write(FILE *f, const void *ctx) {
    const PlotCurves *c = ctx;
    svg_write(f, c->runs, c->nruns, c->title, c->logy);
}

/* ---- timelines: a row per rank, blocks over time ---- */

/* What both timeline pictures draw: rows (one per pipeline rank) of blocks
 * from t0 to t1, an optional thin lane under each row (the measured comm
 * stream), arrows from the end of a block on one row to the start of one on
 * another (sends), a time axis from 0 and a legend. */
typedef struct {
    int row, lane;   /* lane 0: the row's bar; 1: the thin strip under it */
    double t0, t1;
    const char *cls; /* the rect's class: "act F", "kernel bwd", "comm" */
    unsigned rgb;
    bool hatch;      /* W: a hatched overlay */
    char label[32];  /* drawn inside when it fits, else label2 when that fits */
    char label2[8];
    char tip[112];   /* the hover text */
} TlBlock;

typedef struct {
    int from, to; /* rows */
    double t_from, t_to;
} TlArrow;

enum { TL_NOSWATCH = 0x1000000, TL_MAX_KEYS = 32 };
typedef struct {
    unsigned rgb; /* TL_NOSWATCH: text only */
    bool hatch;
    char text[64];
} TlKey;

typedef struct {
    int nrows;
    char (*rowname)[2][48]; /* [nrows]: two lines beside each row */
    TlBlock *b;
    int nb, capb;
    TlArrow *a;
    int na, capa;
    TlKey key[TL_MAX_KEYS];
    int nkey;
    bool lanes;
    double t_end;     /* the axis covers [0, t_end] at least */
    double scale;     /* axis unit per time unit */
    const char *unit; /* the axis label */
    char title[320];
} Timeline;

enum { TL_W = 1000, TL_L = 130, TL_R = 24, TL_T = 50, TL_ROW = 30, TL_LANE = 9, TL_GAP = 16 };

static int tl_init(Timeline *tl, int nrows) {
    *tl = (Timeline){.nrows = nrows, .scale = 1, .unit = "time"};
    tl->rowname = calloc((size_t)nrows, sizeof *tl->rowname);
    return tl->rowname ? 0 : -1;
}

static void tl_free(Timeline *tl) {
    free(tl->rowname);
    free(tl->b);
    free(tl->a);
}

static TlBlock *tl_block(Timeline *tl) { /* a zeroed new block, NULL when out of memory */
    if (tl->nb == tl->capb) {
        int cap = tl->capb ? 2 * tl->capb : 256;
        TlBlock *b = realloc(tl->b, (size_t)cap * sizeof *b);
        if (!b) return NULL;
        tl->b = b, tl->capb = cap;
    }
    tl->b[tl->nb] = (TlBlock){0};
    return &tl->b[tl->nb++];
}

static int tl_arrow(Timeline *tl, TlArrow a) {
    if (tl->na == tl->capa) {
        int cap = tl->capa ? 2 * tl->capa : 64;
        TlArrow *p = realloc(tl->a, (size_t)cap * sizeof *p);
        if (!p) return -1;
        tl->a = p, tl->capa = cap;
    }
    tl->a[tl->na++] = a;
    return 0;
}

static void tl_key(Timeline *tl, unsigned rgb, bool hatch, const char *text) {
    if (tl->nkey == TL_MAX_KEYS) return;
    TlKey *k = &tl->key[tl->nkey++];
    k->rgb = rgb, k->hatch = hatch;
    snprintf(k->text, sizeof k->text, "%s", text);
}

/* HSL (h in degrees, s and l in [0,1]) as 0xRRGGBB. */
static unsigned hsl_rgb(double h, double s, double l) {
    double c = (1 - fabs(2 * l - 1)) * s, hp = fmod(h, 360) / 60, x = c * (1 - fabs(fmod(hp, 2) - 1)), m = l - c / 2;
    double r = 0, g = 0, b = 0;
    switch ((int)hp) {
    case 0: r = c, g = x; break;
    case 1: r = x, g = c; break;
    case 2: g = c, b = x; break;
    case 3: g = x, b = c; break;
    case 4: r = x, b = c; break;
    default: r = c, b = x;
    }
    return (unsigned)lround((r + m) * 255) << 16 | (unsigned)lround((g + m) * 255) << 8 | (unsigned)lround((b + m) * 255);
}

static bool rgb_dark(unsigned rgb) { /* white text reads better on it */
    return 0.299 * (rgb >> 16) + 0.587 * (rgb >> 8 & 255) + 0.114 * (rgb & 255) < 140;
}

/* The drawing's geometry. */
typedef struct {
    PlotTicks xt;
    double axis_end; /* in axis units */
    int row_h;       /* a row and its lane */
    double bottom;   /* of the last row */
} TlGeom;

static double tl_x(const Timeline *tl, const TlGeom *g, double t) {
    return TL_L + t * tl->scale / g->axis_end * (TL_W - TL_L - TL_R);
}
static double tl_y(const TlGeom *g, int row) { return TL_T + row * (g->row_h + TL_GAP); }

/* The legend flows left to right: the width of key k. */
static double key_width(const TlKey *k) { return (k->rgb == TL_NOSWATCH ? 4 : 22) + 6.4 * text_width(k->text, 64) + 14; }

static int legend_rows(const Timeline *tl) {
    int rows = tl->nkey > 0;
    double x = TL_L;
    for (int i = 0; i < tl->nkey; i++) {
        double w = key_width(&tl->key[i]);
        if (x + w > TL_W - TL_R && x > TL_L) rows++, x = TL_L;
        x += w;
    }
    return rows;
}

static void tl_defs(FILE *f) {
    fputs("<defs>\n<pattern id=\"hatch\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" patternTransform=\"rotate(45)\">"
          "<rect width=\"2.2\" height=\"6\" fill=\"white\" fill-opacity=\"0.55\"/></pattern>\n"
          "<marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"9\" refY=\"5\" markerWidth=\"7\" markerHeight=\"7\" orient=\"auto\">"
          "<path d=\"M0,0 L10,5 L0,10 z\" fill=\"#333\"/></marker>\n</defs>\n",
          f);
}

static void tl_rows(FILE *f, const Timeline *tl, const TlGeom *g) {
    double l = TL_L, r = TL_W - TL_R;
    fputs("<g class=\"rows\">\n", f);
    for (int i = 0; i < tl->nrows; i++) {
        double y = tl_y(g, i);
        fprintf(f, "<rect class=\"row\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%d\" fill=\"#f2f2f2\" stroke=\"#ddd\"/>\n", l, y, r - l, TL_ROW);
        if (tl->lanes)
            fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%d\" fill=\"#fafafa\" stroke=\"#eee\"/>\n", l, y + TL_ROW, r - l, TL_LANE);
        for (int k = 0; k < 2; k++) {
            fprintf(f, "<text class=\"rowname\" x=\"%d\" y=\"%.1f\" text-anchor=\"end\" fill=\"#333\"%s>", TL_L - 8, y + 13 + 13 * k,
                    k ? " font-size=\"10\"" : "");
            svg_text(f, tl->rowname[i][k], 22);
            fputs("</text>\n", f);
        }
    }
    fputs("</g>\n", f);
}

static void tl_block_svg(FILE *f, const Timeline *tl, const TlGeom *g, const TlBlock *b) {
    double x = tl_x(tl, g, b->t0), w = fmax(tl_x(tl, g, b->t1) - x, 0.5);
    double y = tl_y(g, b->row) + (b->lane ? TL_ROW + 1 : 0), h = b->lane ? TL_LANE - 2 : TL_ROW;
    fprintf(f, "<rect class=\"%s\" x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"#%06x\"%s><title>", b->cls, x, y, w, h, b->rgb,
            b->lane ? "" : " stroke=\"white\" stroke-width=\"0.6\"");
    svg_text(f, b->tip, 0);
    fputs("</title></rect>\n", f);
    if (b->hatch) fprintf(f, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"url(#hatch)\"/>\n", x, y, w, h);
    const char *label = w >= 6.0 * text_width(b->label, 32) + 4 ? b->label : w >= 6.0 * text_width(b->label2, 8) + 4 ? b->label2 : "";
    if (!b->lane && *label) {
        fprintf(f, "<text class=\"label\" x=\"%.2f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"10\" fill=\"%s\">", x + w / 2, y + h / 2 + 3.5,
                rgb_dark(b->rgb) ? "white" : "#222");
        svg_text(f, label, 32);
        fputs("</text>\n", f);
    }
}

static void tl_arrow_svg(FILE *f, const Timeline *tl, const TlGeom *g, const TlArrow *a) {
    bool down = a->to > a->from;
    double y1 = tl_y(g, a->from) + (down ? TL_ROW : 0), y2 = tl_y(g, a->to) + (down ? 0 : TL_ROW);
    fprintf(f, "<line class=\"send\" x1=\"%.2f\" y1=\"%.1f\" x2=\"%.2f\" y2=\"%.1f\" stroke=\"#333\" stroke-width=\"1\" marker-end=\"url(#arrow)\"/>\n",
            tl_x(tl, g, a->t_from), y1, tl_x(tl, g, a->t_to), y2);
}

static void tl_axis(FILE *f, const Timeline *tl, const TlGeom *g) {
    double b = g->bottom + 6;
    fputs("<g class=\"axis\" stroke=\"#333\" stroke-width=\"1\">\n", f);
    fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\"/>\n", TL_L, b, TL_W - TL_R, b);
    for (int i = 0; i < g->xt.n; i++) {
        double x = TL_L + g->xt.v[i] / g->axis_end * (TL_W - TL_L - TL_R);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", x, b, x, b + 5);
    }
    fputs("</g>\n<g fill=\"#333\">\n", f);
    for (int i = 0; i < g->xt.n; i++)
        fprintf(f, "<text class=\"xtick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%.*f</text>\n",
                TL_L + g->xt.v[i] / g->axis_end * (TL_W - TL_L - TL_R), b + 18, g->xt.decimals[i], g->xt.v[i]);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">", (TL_L + TL_W - TL_R) / 2.0, b + 34);
    svg_text(f, tl->unit, 0);
    fputs("</text>\n</g>\n", f);
}

static void tl_legend(FILE *f, const Timeline *tl, double y) {
    fputs("<g class=\"legend\" fill=\"#333\">\n", f);
    double x = TL_L;
    for (int i = 0; i < tl->nkey; i++) {
        const TlKey *k = &tl->key[i];
        double w = key_width(k);
        if (x + w > TL_W - TL_R && x > TL_L) y += 18, x = TL_L;
        if (k->rgb != TL_NOSWATCH) {
            fprintf(f, "<rect class=\"key\" x=\"%.1f\" y=\"%.1f\" width=\"16\" height=\"11\" fill=\"#%06x\" stroke=\"#999\" stroke-width=\"0.5\"/>\n", x, y - 10,
                    k->rgb);
            if (k->hatch) fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"16\" height=\"11\" fill=\"url(#hatch)\"/>\n", x, y - 10);
        }
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">", x + (k->rgb == TL_NOSWATCH ? 0 : 22), y);
        svg_text(f, k->text, 64);
        fputs("</text>\n", f);
        x += w;
    }
    fputs("</g>\n", f);
}

static void tl_write(FILE *f, const void *ctx) {
    const Timeline *tl = ctx;
    TlGeom g = {.row_h = TL_ROW + (tl->lanes ? TL_LANE : 0)};
    plot_ticks(&g.xt, 0, tl->t_end * tl->scale, 0, 0);
    g.axis_end = g.xt.v[g.xt.n - 1];
    g.bottom = tl_y(&g, tl->nrows) - TL_GAP;
    int h = (int)ceil(g.bottom + 6 + 50 + 18 * legend_rows(tl) + 8);
    svg_head(f, TL_W, h, (TL_L + TL_W - TL_R) / 2.0, tl->title);
    tl_defs(f);
    tl_rows(f, tl, &g);
    fputs("<g class=\"blocks\">\n", f);
    for (int i = 0; i < tl->nb; i++) tl_block_svg(f, tl, &g, &tl->b[i]);
    fputs("</g>\n<g class=\"sends\">\n", f);
    for (int i = 0; i < tl->na; i++) tl_arrow_svg(f, tl, &g, &tl->a[i]);
    fputs("</g>\n", f);
    tl_axis(f, tl, &g);
    tl_legend(f, tl, g.bottom + 6 + 56);
    fputs("</svg>\n", f);
}

/* ---- the planned pipeline (ppsched.h) ---- */

static const char act_letter[3] = {'F', 'B', 'W'};

/* A plan, its times and where each (kind, chunk, mb) is. */
typedef struct {
    const PpPlan *pl;
    const PpTimes *t;
    int nch;   /* p·v chunks */
    int *at;   /* [3][nch][m]: the action's index into t (off[r] + i), -1 if absent */
    int *rank; /* [off[p]]: the rank of an index */
    double makespan, busy;
} PpView;

static int *pp_slot(const PpView *v, int kind, int chunk, int mb) { return &v->at[((size_t)kind * v->nch + chunk) * v->pl->m + mb]; }

static int pp_fail(char *err, size_t errlen, const PpView *v, int k, const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* "rank R action I (F chunk C mb M): " + the message, for index k (-1: no action) */
static int pp_fail(char *err, size_t errlen, const PpView *v, int k, const char *fmt, ...) {
    int n = 0;
    if (k >= 0) {
        int r = v->rank[k], i = k - v->t->off[r];
        const Action *a = &v->pl->act[r][i];
        n = snprintf(err, errlen, "rank %d action %d (%c chunk %d mb %d): ", r, i, act_letter[a->kind], a->chunk, a->mb);
    }
    va_list ap;
    va_start(ap, fmt);
    if (n >= 0 && (size_t)n < errlen) vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
    va_end(ap);
    return -1;
}

/* The shape: p, v, m >= 1 and the times' offsets matching the lists. */
static int pp_check_shape(const PpPlan *pl, const PpTimes *t, char *err, size_t errlen) {
    if (!pl || !t || !pl->nact || !pl->act || !t->off || !t->start || !t->end) return snprintf(err, errlen, "no plan or no times"), -1;
    if (pl->p < 1 || pl->v < 1 || pl->m < 1) return snprintf(err, errlen, "plan has p %d, v %d, m %d: each must be >= 1", pl->p, pl->v, pl->m), -1;
    if (t->off[0] != 0) return snprintf(err, errlen, "times: off[0] is %d, not 0", t->off[0]), -1;
    for (int r = 0; r < pl->p; r++)
        if (pl->nact[r] < 0 || t->off[r + 1] - t->off[r] != pl->nact[r])
            return snprintf(err, errlen, "times: rank %d has %d actions in the plan but %d times", r, pl->nact[r], t->off[r + 1] - t->off[r]), -1;
    return 0;
}

/* Indexes every action; each kind, chunk and mb in range, each once, its
 * time finite with 0 <= start <= end, and after the rank's previous one. */
static int pp_index(PpView *v, char *err, size_t errlen) {
    const PpPlan *pl = v->pl;
    const PpTimes *t = v->t;
    for (int r = 0; r < pl->p; r++)
        for (int i = 0, k = t->off[r]; i < pl->nact[r]; i++, k++) {
            const Action *a = &pl->act[r][i];
            v->rank[k] = r;
            if ((int)a->kind < 0 || a->kind > ACT_W) return snprintf(err, errlen, "rank %d action %d: kind %d is not F, B or W", r, i, (int)a->kind), -1;
            if (a->chunk < 0 || a->chunk >= v->nch)
                return pp_fail(err, errlen, v, k, "chunk %d out of range [0, %d) (p %d x v %d chunks)", a->chunk, v->nch, pl->p, pl->v);
            if (a->mb < 0 || a->mb >= pl->m) return pp_fail(err, errlen, v, k, "micro-batch out of range [0, %d)", pl->m);
            int *s = pp_slot(v, a->kind, a->chunk, a->mb);
            if (*s >= 0) return pp_fail(err, errlen, v, k, "appears twice (also rank %d action %d)", v->rank[*s], *s - t->off[v->rank[*s]]);
            *s = k;
            double t0 = t->start[k], t1 = t->end[k];
            if (!isfinite(t0) || !isfinite(t1) || t0 < 0) return pp_fail(err, errlen, v, k, "start %g, end %g: not a time >= 0", t0, t1);
            if (t1 < t0) return pp_fail(err, errlen, v, k, "end %g < start %g", t1, t0);
            if (i > 0 && t0 < t->end[k - 1] - 1e-9 * fmax(1, t0))
                return pp_fail(err, errlen, v, k, "starts at %g, before the rank's previous action ends at %g", t0, t->end[k - 1]);
            v->makespan = fmax(v->makespan, t1);
            v->busy += t1 - t0;
        }
    return 0;
}

/* Every F and B of every (chunk, mb) is there, and W for all or for none. */
static int pp_complete(const PpView *v, char *err, size_t errlen) {
    bool any_w = false;
    for (int c = 0; c < v->nch; c++)
        for (int mb = 0; mb < v->pl->m; mb++) any_w |= *pp_slot(v, ACT_W, c, mb) >= 0;
    for (int k = 0; k < (any_w ? 3 : 2); k++)
        for (int c = 0; c < v->nch; c++)
            for (int mb = 0; mb < v->pl->m; mb++)
                if (*pp_slot(v, k, c, mb) < 0) return snprintf(err, errlen, "%c chunk %d mb %d is in no rank's list", act_letter[k], c, mb), -1;
    if (!(v->makespan > 0)) return snprintf(err, errlen, "the plan's makespan is 0: nothing to draw"), -1;
    return 0;
}

/* The action whose value action k receives, -1 if none: F(c,m) takes
 * F(c-1,m)'s activation, B(c,m) takes B(c+1,m)'s gradient.  The plan is
 * complete (pp_complete).  Fails when k starts before that one ends. */
static int pp_input(const PpView *v, int k, char *err, size_t errlen, int *from) {
    const Action *a = &v->pl->act[v->rank[k]][k - v->t->off[v->rank[k]]];
    int c = a->kind == ACT_F ? a->chunk - 1 : a->kind == ACT_B ? a->chunk + 1 : -1;
    *from = -1;
    if (c < 0 || c >= v->nch) return 0;
    *from = *pp_slot(v, a->kind, c, a->mb);
    if (v->t->start[k] < v->t->end[*from] - 1e-9 * fmax(1, v->t->start[k]))
        return pp_fail(err, errlen, v, k, "starts at %g, before its input %c chunk %d mb %d (rank %d) ends at %g", v->t->start[k],
                       act_letter[a->kind], c, a->mb, v->rank[*from], v->t->end[*from]);
    return 0;
}

static unsigned mb_colour(int mb, int kind) { /* a hue per micro-batch, a shade per kind */
    double h = fmod(mb * 137.508, 360);
    return kind == ACT_F ? hsl_rgb(h, 0.70, 0.80) : kind == ACT_B ? hsl_rgb(h, 0.65, 0.36) : hsl_rgb(h, 0.60, 0.56);
}

static int pp_blocks(Timeline *tl, const PpView *v, char *err, size_t errlen) {
    static const char *const cls[3] = {"act F", "act B", "act W"};
    for (int r = 0; r < v->pl->p; r++)
        for (int i = 0, k = v->t->off[r]; i < v->pl->nact[r]; i++, k++) {
            const Action *a = &v->pl->act[r][i];
            int from;
            if (pp_input(v, k, err, errlen, &from)) return -1;
            TlBlock *b = tl_block(tl);
            if (!b) return snprintf(err, errlen, "out of memory"), -1;
            *b = (TlBlock){.row = r, .t0 = v->t->start[k], .t1 = v->t->end[k], .cls = cls[a->kind], .rgb = mb_colour(a->mb, a->kind), .hatch = a->kind == ACT_W};
            snprintf(b->label, sizeof b->label, "c%d m%d", a->chunk, a->mb);
            snprintf(b->label2, sizeof b->label2, "c%d", a->chunk);
            snprintf(b->tip, sizeof b->tip, "rank %d: %c chunk %d mb %d, %g to %g", r, act_letter[a->kind], a->chunk, a->mb, b->t0, b->t1);
            if (from >= 0 && v->rank[from] != r && tl_arrow(tl, (TlArrow){v->rank[from], r, v->t->end[from], b->t0}))
                return snprintf(err, errlen, "out of memory"), -1;
        }
    return 0;
}

static void pp_rows(Timeline *tl, const PpView *v) {
    for (int r = 0; r < v->pl->p; r++) {
        snprintf(tl->rowname[r][0], sizeof tl->rowname[r][0], "rank %d", r);
        char *s = tl->rowname[r][1];
        size_t n = sizeof tl->rowname[r][1], len = 0;
        for (int c = 0; c < v->nch; c++) {
            bool here = false;
            for (int i = 0; i < v->pl->nact[r] && !here; i++) here = v->pl->act[r][i].chunk == c;
            if (here && len < n) len += (size_t)snprintf(s + len, n - len, "%s%d", len ? "," : "chunk ", c);
        }
    }
}

static void pp_legend(Timeline *tl, const PpView *v) {
    static const char *const what[3] = {"F forward", "B backward", "W weight grads"};
    bool has[3] = {false};
    for (int r = 0; r < v->pl->p; r++)
        for (int i = 0; i < v->pl->nact[r]; i++) has[v->pl->act[r][i].kind] = true;
    for (int k = 0; k < 3; k++)
        if (has[k]) tl_key(tl, mb_colour(0, k), k == ACT_W, what[k]);
    tl_key(tl, TL_NOSWATCH, false, "hue = micro-batch:");
    int shown = v->pl->m < 16 ? v->pl->m : 16;
    for (int mb = 0; mb < shown; mb++) {
        char s[16];
        snprintf(s, sizeof s, "m%d", mb);
        tl_key(tl, mb_colour(mb, ACT_F), false, s);
    }
    if (shown < v->pl->m) tl_key(tl, TL_NOSWATCH, false, "...");
    tl_key(tl, TL_NOSWATCH, false, "label: chunk c, micro-batch m; arrows: sends");
}

int plot_pp_timeline(FILE *f, const PpPlan *pl, const PpTimes *t, const char *title, char *err, size_t errlen) {
    if (pp_check_shape(pl, t, err, errlen)) return -1;
    PpView v = {.pl = pl, .t = t, .nch = pl->p * pl->v};
    size_t nslot = (size_t)3 * v.nch * pl->m;
    v.at = malloc(nslot * sizeof *v.at);
    v.rank = malloc(((size_t)t->off[pl->p] + 1) * sizeof *v.rank);
    Timeline tl;
    int rc = -1;
    if (tl_init(&tl, pl->p) || !v.at || !v.rank) snprintf(err, errlen, "out of memory");
    else {
        memset(v.at, -1, nslot * sizeof *v.at);
        rc = pp_index(&v, err, errlen) || pp_complete(&v, err, errlen) || pp_blocks(&tl, &v, err, errlen) ? -1 : 0;
    }
    if (rc == 0) {
        double bubble = 1 - v.busy / (pl->p * v.makespan);
        if (title && *title) snprintf(tl.title, sizeof tl.title, "%s: bubble %.1f%%", title, 100 * bubble);
        else snprintf(tl.title, sizeof tl.title, "Pipeline schedule, p %d, v %d, m %d: bubble %.1f%%", pl->p, pl->v, pl->m, 100 * bubble);
        tl.t_end = v.makespan, tl.unit = "time (the plan's cost unit)";
        pp_rows(&tl, &v);
        pp_legend(&tl, &v);
        tl_write(f, &tl);
        if (ferror(f)) rc = -1, snprintf(err, errlen, "cannot write the SVG: %s", strerror(errno));
    }
    tl_free(&tl);
    free(v.at);
    free(v.rank);
    return rc;
}

/* ---- writing atomically ---- */

/* Writes the SVG (write(f, ctx)) to a temporary file next to out and
 * renames it over out. */
static int svg_save(const char *out, void (*write)(FILE *, const void *), const void *ctx) {
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
        write(f, ctx);
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

/* ---- measured timelines: the ranks' --trace files ---- */

typedef struct {
    double ts, dur; /* microseconds */
    int tid, phase; /* phase: PH_* from args.at, -1 when it names none */
    char name[32];
} TrEvent;

typedef struct {
    const char *path;
    int pid;
    TrEvent *comp, *other; /* the compute stream (tid 0), the others; each by start */
    int ncomp, nother;
    int *step;  /* [nsteps + 1]: a step's first compute event */
    int nsteps;
    double ws, we, busy; /* the drawn step's window and the compute stream's busy time in it */
} TrRank;

static void tr_free(TrRank *r) {
    free(r->comp);
    free(r->other);
    free(r->step);
}

/* The whole file at path, NUL-terminated, its length in *n; NULL after
 * printing the error. */
static char *read_whole(const char *path, size_t *n) {
    char err[1024];
    int fd = rt_open_input(NULL, path, err, sizeof err);
    if (fd < 0) return cmd_error("%s", err), NULL;
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    ssize_t got = 0;
    while (buf && (got = read(fd, buf + len, cap - len - 1)) > 0)
        if ((len += (size_t)got) + 1 == cap) {
            char *b = realloc(buf, cap *= 2);
            if (!b) free(buf);
            buf = b;
        }
    int e = errno;
    close(fd);
    if (!buf) return cmd_error("out of memory reading %s", path), NULL;
    if (got < 0) return free(buf), cmd_error("cannot read %s: %s", path, strerror(e)), NULL;
    buf[len] = 0;
    *n = len;
    return buf;
}

static int phase_of(const json_t *ev) { /* args.at is "PHASE Lk file:line" */
    const char *at = json_string_value(json_object_get(json_object_get(ev, "args"), "at"));
    size_t n = at ? strcspn(at, " ") : 0;
    for (int p = 0; at && p < PH_COUNT; p++)
        if (n == strlen(ir_phase_names[p]) && !strncmp(at, ir_phase_names[p], n)) return p;
    return -1;
}

static int tr_push(TrEvent **v, int *n, TrEvent e) {
    if ((*n & (*n - 1)) == 0) { /* full at 0 and at powers of two: doubles */
        TrEvent *p = realloc(*v, (size_t)(*n ? 2 * *n : 1) * sizeof *p);
        if (!p) return -1;
        *v = p;
    }
    (*v)[(*n)++] = e;
    return 0;
}

/* One "ph":"X" event (i-th of traceEvents) into r; -1 after the error. */
static int tr_event(TrRank *r, const json_t *ev, int i) {
    const json_t *ts = json_object_get(ev, "ts"), *dur = json_object_get(ev, "dur"), *tid = json_object_get(ev, "tid");
    const json_t *pid = json_object_get(ev, "pid"), *name = json_object_get(ev, "name");
    const char *bad = !json_is_number(ts) ? "\"ts\" is not a number" : !json_is_number(dur) || json_number_value(dur) < 0 ? "\"dur\" is not a number >= 0"
                      : !json_is_integer(tid) || json_integer_value(tid) < 0 ? "\"tid\" is not an integer >= 0"
                      : !json_is_integer(pid)                                 ? "\"pid\" is not an integer"
                      : !json_is_string(name)                                 ? "\"name\" is not a string"
                      : !isfinite(json_number_value(ts))                      ? "\"ts\" is not finite"
                                                                              : NULL;
    if (bad) return cmd_error("%s: traceEvents[%d]: %s", r->path, i, bad), -1;
    TrEvent e = {json_number_value(ts), json_number_value(dur), (int)json_integer_value(tid), phase_of(ev), ""};
    snprintf(e.name, sizeof e.name, "%s", json_string_value(name));
    r->pid = (int)json_integer_value(pid);
    bool comp = e.tid == 0;
    if (tr_push(comp ? &r->comp : &r->other, comp ? &r->ncomp : &r->nother, e)) return cmd_error("out of memory reading %s", r->path), -1;
    return 0;
}

static int by_start(const void *a, const void *b) {
    double x = ((const TrEvent *)a)->ts, y = ((const TrEvent *)b)->ts;
    return (x > y) - (x < y);
}

/* Splits the compute stream into steps: a step ends with its optimizer
 * (phase opt), so a kernel of another phase after an opt kernel starts the
 * next one. */
static int tr_steps(TrRank *r) {
    qsort(r->comp, (size_t)r->ncomp, sizeof *r->comp, by_start);
    if (r->nother > 0) qsort(r->other, (size_t)r->nother, sizeof *r->other, by_start); /* NULL when none: qsort's base must not be */
    if (!(r->step = malloc(((size_t)r->ncomp + 1) * sizeof *r->step))) return cmd_error("out of memory reading %s", r->path), -1;
    r->nsteps = 0;
    for (int i = 0; i < r->ncomp; i++)
        if (i == 0 || (r->comp[i - 1].phase == PH_OPT && r->comp[i].phase != PH_OPT)) r->step[r->nsteps++] = i;
    r->step[r->nsteps] = r->ncomp;
    return 0;
}

/* Reads one rank's Chrome trace (what runtime/cpu/dev_cpu.c writes). */
static int tr_read(TrRank *r) {
    size_t n, used;
    char *text = read_whole(r->path, &n);
    if (!text) return -1;
    RtJsonError e;
    json_t *top = rt_json_load(text, n, 0, &used, &e);
    const json_t *evs = json_object_get(top, "traceEvents");
    int rc = -1;
    if (!top) cmd_error("%s: not a trace: %s%s at byte %d", r->path, e.what, e.near, e.byte);
    else if (!rt_json_blank(text + used, n - used)) cmd_error("%s: not a trace: text after the JSON at byte %zu", r->path, used);
    else if (!json_is_array(evs)) cmd_error("%s: not a Chrome trace: no \"traceEvents\" array", r->path);
    else {
        rc = 0;
        for (size_t i = 0; rc == 0 && i < json_array_size(evs); i++) {
            const json_t *ev = json_array_get(evs, i);
            const char *ph = json_string_value(json_object_get(ev, "ph"));
            if (!ph) rc = cmd_error("%s: traceEvents[%zu]: not an event (no \"ph\")", r->path, i);
            else if (!strcmp(ph, "X")) rc = tr_event(r, ev, (int)i);
        }
        if (rc == 0 && r->ncomp == 0) rc = cmd_error("%s: no kernel on the compute stream (tid 0)", r->path);
        if (rc == 0) rc = tr_steps(r);
    }
    json_decref(top);
    free(text);
    return rc;
}

/* Step s's window on r: from the first event of any stream after step
 * s-1's last compute kernel (a receive posted at the step's start counts)
 * to its own last compute kernel's end; and the compute stream's busy time
 * in it (the union of its kernels). */
static void tr_window(TrRank *r, int s) {
    const TrEvent *c = r->comp;
    int i0 = r->step[s], i1 = r->step[s + 1];
    double prev = -INFINITY, busy_to = -INFINITY;
    for (int i = s > 0 ? r->step[s - 1] : i0; i < i0; i++) prev = fmax(prev, c[i].ts + c[i].dur);
    r->ws = c[i0].ts, r->we = c[i0].ts, r->busy = 0;
    for (int i = 0; i < r->nother; i++)
        if (r->other[i].ts > prev && r->other[i].ts < r->ws) r->ws = r->other[i].ts;
    for (int i = i0; i < i1; i++) {
        double a = fmax(c[i].ts, busy_to), b = c[i].ts + c[i].dur;
        if (b > a) r->busy += b - a;
        busy_to = fmax(busy_to, b);
        r->we = fmax(r->we, b);
    }
}

static const unsigned phase_rgb[PH_COUNT + 1] = {0x9ecae1, 0x2b6ca3, 0xfdae6b, 0xa6a6a6, 0x6a51a3, 0xd9d9d9}; /* fwd bwd recompute opt wgrad, other */
static const unsigned comm_rgb = 0x8c6bb1;

static int tr_block(Timeline *tl, int row, const TrRank *r, const TrEvent *e, bool comm) {
    static const char *const cls[PH_COUNT + 1] = {"kernel fwd", "kernel bwd", "kernel recompute", "kernel opt", "kernel wgrad", "kernel"};
    int ph = e->phase >= 0 ? e->phase : PH_COUNT;
    TlBlock *b = tl_block(tl);
    if (!b) return cmd_error("out of memory"), -1;
    *b = (TlBlock){.row = row, .lane = comm, .t0 = e->ts - r->ws, .t1 = e->ts + e->dur - r->ws, .cls = comm ? "comm" : cls[ph],
                   .rgb = comm ? comm_rgb : phase_rgb[ph]};
    snprintf(b->label, sizeof b->label, "%s", e->name);
    snprintf(b->tip, sizeof b->tip, "rank %d %s: %s (%s), %.3f ms", r->pid, comm ? "comm" : "compute", e->name,
             e->phase >= 0 ? ir_phase_names[e->phase] : "no phase", e->dur * 1e-3);
    tl->t_end = fmax(tl->t_end, b->t1);
    return 0;
}

/* Row i: rank r's step window, compute kernels on the bar, the other
 * streams' events that start in it on the lane below. */
static int tr_row(Timeline *tl, int i, const TrRank *r, int s, double makespan) {
    snprintf(tl->rowname[i][0], sizeof tl->rowname[i][0], "rank %d, idle %.1f%%", r->pid, 100 * (1 - r->busy / makespan));
    size_t len = strlen(r->path), cap = sizeof tl->rowname[i][1];
    snprintf(tl->rowname[i][1], cap, "%s", len < cap ? r->path : r->path + len - cap + 1); /* the tail of a long path */
    for (int k = r->step[s]; k < r->step[s + 1]; k++)
        if (tr_block(tl, i, r, &r->comp[k], false)) return -1;
    for (int k = 0; k < r->nother; k++)
        if (r->other[k].ts >= r->ws && r->other[k].ts <= r->we && tr_block(tl, i, r, &r->other[k], true)) return -1;
    return 0;
}

static void tr_legend(Timeline *tl) {
    for (int p = 0; p < PH_COUNT; p++) tl_key(tl, phase_rgb[p], false, ir_phase_names[p]);
    tl_key(tl, phase_rgb[PH_COUNT], false, "no phase");
    tl_key(tl, comm_rgb, false, "comm stream (thin lane)");
    tl_key(tl, TL_NOSWATCH, false, "colour: the kernel's phase (its args.at);");
    tl_key(tl, TL_NOSWATCH, false, "the trace names no micro-batch; W runs inside bwd");
}

/* kiln plot --trace: ranks[0..n) read; draws step `step` (1-based, 0: the
 * last step every file has). */
typedef struct {
    TrRank *ranks;
    int n, step;
    const char *out, *title;
} TrPlot;

static int tr_plot(const TrPlot *a) {
    int nsteps = a->ranks[0].nsteps, fewest = 0;
    for (int i = 1; i < a->n; i++)
        if (a->ranks[i].nsteps < nsteps) nsteps = a->ranks[i].nsteps, fewest = i;
    if (a->step > nsteps)
        return cmd_error("--step %d: %s has %d step%s", a->step, a->ranks[fewest].path, nsteps, nsteps == 1 ? "" : "s");
    int s = (a->step ? a->step : nsteps) - 1;
    double makespan = 0, busy = 0;
    for (int i = 0; i < a->n; i++) {
        tr_window(&a->ranks[i], s);
        makespan = fmax(makespan, a->ranks[i].we - a->ranks[i].ws);
        busy += a->ranks[i].busy;
    }
    if (!(makespan > 0)) return cmd_error("step %d lasts 0 us in every trace: nothing to draw", s + 1);
    Timeline tl;
    int rc = tl_init(&tl, a->n) ? cmd_error("out of memory") : 0;
    tl.t_end = makespan, tl.scale = 1e-3, tl.unit = "time from the step's start on each rank (ms)";
    for (int i = 0; rc == 0 && i < a->n; i++) rc = tr_row(&tl, i, &a->ranks[i], s, makespan);
    if (rc == 0) {
        snprintf(tl.title, sizeof tl.title, "%s: step %d of %d, compute idle %.1f%%", a->title, s + 1, nsteps, 100 * (1 - busy / (a->n * makespan)));
        tr_legend(&tl);
        rc = svg_save(a->out, tl_write, &tl) ? 1 : 0;
    }
    tl_free(&tl);
    return rc;
}

/* ---- the command ---- */

static void plot_usage(FILE *f) {
    fputs("usage: kiln plot RUN.jsonl [RUN2.jsonl ...] -o OUT.svg [--title T] [--log-y]\n"
          "       kiln plot --trace TRACE.json [TRACE2.json ...] -o OUT.svg [--step N] [--title T]\n",
          f);
}

typedef struct {
    const char **inputs;
    int ninputs;
    const char *out, *title;
    bool logy, trace;
    int step; /* --step N, 0: none */
} PlotArgs;

static int step_arg(PlotArgs *a, const char *s) {
    char *end;
    long v = strtol(s, &end, 10);
    if (*s < '0' || *s > '9' || *end || v < 1 || v > 1000000000) return cmd_error("--step: expected a step number >= 1, got '%s'", s), 1;
    a->step = (int)v;
    return 0;
}

/* Returns 0, 1 (error printed) or -1 (--help: exit 0). */
static int plot_args(PlotArgs *a, int argc, char **argv) {
    a->inputs = calloc((size_t)argc, sizeof *a->inputs);
    if (!a->inputs) return cmd_error("out of memory"), 1;
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        bool has_arg = i + 1 < argc;
        if (!strcmp(s, "-h") || !strcmp(s, "--help")) return plot_usage(stdout), -1;
        else if (!strcmp(s, "--log-y")) a->logy = true;
        else if (!strcmp(s, "--trace")) a->trace = true;
        else if ((!strcmp(s, "-o") || !strcmp(s, "--output")) && has_arg) a->out = argv[++i];
        else if (!strcmp(s, "--title") && has_arg) a->title = argv[++i];
        else if (!strcmp(s, "--step") && has_arg) {
            if (step_arg(a, argv[++i])) return 1;
        } else if (!strcmp(s, "-o") || !strcmp(s, "--output") || !strcmp(s, "--title") || !strcmp(s, "--step"))
            return cmd_error("missing value after %s", s), 1;
        else if (s[0] == '-' && s[1])
            return cmd_error("unknown option '%s' (try kiln plot --help)", s), 1;
        else a->inputs[a->ninputs++] = s;
    }
    if (a->trace && a->logy) return cmd_error("--log-y is for loss curves, not --trace"), 1;
    if (!a->trace && a->step) return cmd_error("--step picks a step of --trace files; it needs --trace"), 1;
    if (!a->ninputs && a->trace) return cmd_error("no trace file (usage: kiln plot --trace TRACE.json ... -o OUT.svg)"), 1;
    if (!a->ninputs) return cmd_error("no input log (usage: kiln plot RUN.jsonl ... -o OUT.svg)"), 1;
    if (!a->out) return cmd_error("no output file (-o OUT.svg)"), 1;
    if (!a->title) a->title = a->trace ? "Measured timeline" : "Training loss";
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

/* kiln plot --trace: one row per file. */
static int plot_traces(const PlotArgs *a) {
    TrPlot t = {calloc((size_t)a->ninputs, sizeof *t.ranks), a->ninputs, a->step, a->out, a->title};
    int rc = t.ranks ? 0 : cmd_error("out of memory");
    for (int i = 0; !rc && i < a->ninputs; i++) {
        t.ranks[i].path = a->inputs[i];
        rc = tr_read(&t.ranks[i]) ? 1 : 0;
    }
    if (!rc) rc = tr_plot(&t);
    for (int i = 0; t.ranks && i < a->ninputs; i++) tr_free(&t.ranks[i]);
    free(t.ranks);
    return rc;
}

int kiln_plot_main(int argc, char **argv) {
    cmd_set_prefix("kiln plot: ");
    PlotArgs a = {0};
    int rc = plot_args(&a, argc, argv);
    if (rc) return free(a.inputs), rc < 0 ? 0 : 1;
    rc = plot_check_out(&a);
    if (a.trace) {
        rc = rc ? rc : plot_traces(&a);
        return free(a.inputs), rc;
    }
    PlotRun *runs = calloc((size_t)a.ninputs, sizeof *runs);
    if (!rc && !runs) cmd_error("out of memory"), rc = 1;
    for (int i = 0; !rc && i < a.ninputs; i++) {
        runs[i].path = a.inputs[i];
        rc = run_read(&runs[i], a.logy) ? 1 : 0;
    }
    PlotCurves doc = {runs, a.ninputs, a.title, a.logy};
    if (!rc) rc = svg_save(a.out, curves_write, &doc) ? 1 : 0;
    for (int i = 0; runs && i < a.ninputs; i++) free(runs[i].train.p), free(runs[i].val.p);
    free(runs);
    free(a.inputs);
    return rc;
}
