/* plot.h — `kiln plot`: training curves from JSONL logs as a standalone SVG. */
#ifndef KILN_PLOT_H
#define KILN_PLOT_H

/* kiln plot RUN.jsonl [RUN2.jsonl ...] -o OUT.svg [--title T] [--log-y]
 * argv[0] is "plot".  Returns the process exit status: 0 on success, 1 after
 * printing a one-line error to stderr (OUT is then left as it was). */
int kiln_plot_main(int argc, char **argv);

/* Axis ticks, exposed for the tests.  Covers [lo, hi] (lo <= hi; both > 0
 * when logscale) with round values: multiples of 1, 2 or 5 x 10^k; on a log
 * axis the same when hi/lo < 10, else m x 10^k (m in 1..9, 1-2-5 or 1).  t->v[0] <= lo and t->v[n-1] >= hi; the axis spans
 * exactly [v[0], v[n-1]].  min_step > 0 bounds the linear step from below
 * (1 for integer steps).  Returns the number of ticks. */
enum { PLOT_MAX_TICKS = 64 };
typedef struct {
    double v[PLOT_MAX_TICKS];
    int n;
    int decimals[PLOT_MAX_TICKS]; /* digits after the point in each label */
} PlotTicks;
int plot_ticks(PlotTicks *t, double lo, double hi, int logscale, double min_step);

#endif
