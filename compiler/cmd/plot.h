/* plot.h — `kiln plot`: training curves from JSONL logs as a standalone SVG. */
#ifndef KILN_PLOT_H
#define KILN_PLOT_H

#include "ppsched.h"

#include <stddef.h>
#include <stdio.h>

/* kiln plot RUN.jsonl [RUN2.jsonl ...] -o OUT.svg [--title T] [--log-y]
 * kiln plot --trace TRACE.json [TRACE2.json ...] -o OUT.svg [--step N] [--title T]
 * argv[0] is "plot".  Returns the process exit status: 0 on success, 1 after
 * printing a one-line error to stderr (OUT is then left as it was). */
int kiln_plot_main(int argc, char **argv);

/* A pipeline schedule as an SVG timeline on f: a row per rank, an action a
 * block from its start to its end (t: ppsched_simulate's times, or any with
 * the same layout), F light, B dark, W a middle shade hatched, the hue
 * telling the micro-batch, labelled "cC mM" (or "cC" when narrow); an arrow
 * per send (F(c-1,m) -> F(c,m), B(c+1,m) -> B(c,m) on another rank) from
 * the producer's end to the consumer's start; a time axis, a legend, and
 * "TITLE: bubble X%" on top, the bubble 1 - busy / (p x the latest end)
 * from the times.  Checks the input first: every action's kind, chunk and
 * mb in range and there once, F and B of every (chunk, mb) (W for all or
 * none), 0 <= start <= end, no overlap on a rank, no action starting before
 * its input ends.  0, or -1 with one line in err (nothing written). */
int plot_pp_timeline(FILE *f, const PpPlan *pl, const PpTimes *t, const char *title, char *err, size_t errlen);

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
