/* cmd.h — what kiln's commands share: the parsed command line, the pipeline
 * that turns a model into a program, and one way to fail.
 *
 * The driver (main.c) parses the command line into Args and hands it to one
 * command; each command lives in a file of its own in this folder:
 *
 *   check.c    kiln check    the step in f32 against f64, or the rank
 *                            programs against the single-device one
 *   plan.c     kiln plan     memory per rank; --peak: what is live at the
 *                            activations' peak; --recompute all: every policy
 *   plan_pp.c                --pp N: the pipeline section, --pp-schedule all,
 *                            --timeline FILE.svg
 *   compile.c  kiln compile  object file + runtime library = a trainer
 *   run.c      kiln run      the JIT-compiled step in the trainer's loop, or
 *                            (--interp) the interpreter on byte-level text
 *   plot.c, data_cmd.c, sample.c: kiln plot, data, sample (their own flags;
 *                            declared in plot.h, data_cmd.h, sample.h)
 *
 * `kiln dump` is a few lines and stays in main.c.
 *
 * Errors.  A user error is one line on stderr and exit status 1: die()
 * prints it and exits; cmd_error() prints it and returns 1, for a command
 * that must clean up first (plot and data remove their temporary files).
 * The line starts with the running command's prefix: "kiln: " unless the
 * command set its own with cmd_set_prefix ("kiln plot: ", "kiln data: ",
 * "kiln: sample: ", the prefixes those commands have always printed).
 *
 * The pipeline (pipeline.c): compile() runs the training pipeline on
 * Args's model; kiln sample runs the forward-only one through
 * pipeline_front() and pipeline_run().  The verifier runs after the front
 * end and after every pass.
 */
#ifndef KILN_CMD_H
#define KILN_CMD_H

#include "fsutil.h"
#include "interp.h"
#include "ir.h"
#include "options.h"

/* The command line of dump, check, plan, compile and run (main.c's parse_args). */
typedef struct {
    Options o;
    const char *cmd, *model, *after, *format, *out, *data, *log, *export_path, *target, *emit, *trace;
    const char *timeline;  /* kiln plan --timeline FILE.svg: the pipeline schedule drawn */
    const char *threads;
    const char *cuda_arch; /* --target cuda:ARCH: "sm_90"; NULL for the CPU */
    const char *attention; /* --attention kiln|cudnn|tc (CUDA) */
    int interp, f64, print_every, serial, peak; /* peak: kiln plan --peak */
    int ignore_index;                           /* kiln run --ignore-index ID (issue 17); -1: none */
    int max_seq;                                /* kiln plan --max-seq (plan_offload.c) */
    int compare_tp_cp;                          /* kiln plan --compare-tp-cp N (plan_tp.c); 0: off */
    double memory_gib;                          /* kiln plan --memory GiB: the device memory per rank */
    int recompute_given; /* --recompute on the command line (else --memory-budget may pick it) */
    int comparison; /* a compile only to compare with the user's (kiln plan's tables): --memory-budget bounds lhs
                       there but picks no policy and refuses nothing (pipeline.c) */
} Args;

/* ---- errors ---- */

void cmd_set_prefix(const char *prefix);
int cmd_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

/* Files (runtime/io/fsutil.h): die unless path may be written as output
 * `flag` (absent, or a regular file that is none of the inputs), or read
 * as input `flag` (absent or a regular file: not a FIFO or a device). */
void cmd_check_output(const char *flag, const char *path, const RtPath *inputs, int n);
void cmd_check_input(const char *flag, const char *path);

/* ---- the pipeline (pipeline.c) ---- */

typedef enum {
    PIPE_TRAIN,   /* the training step: autodiff ... memplan */
    PIPE_FORWARD, /* kiln sample: the forward-only step, logits out */
} Pipeline;

/* The Lua front end's module for path, verified; exits after one line on a user error. */
Module *pipeline_front(const char *path, Options *o);
/* The passes of p in order, each followed by the verifier; stops after the
 * pass named after (NULL: none). */
void pipeline_run(Module *m, Pipeline p, const Options *o, const char *after);
/* Dies unless after names "front" or a pass of the training pipeline (--after). */
void pipeline_check_after(const char *after);
/* a->model through the training pipeline up to --after; a .ir file is a
 * dump, parsed and used as it is (no passes run). */
Module *compile(Args *a);
/* compile(), then the optimizer settings a trainer must not get (options.h,
 * opt_check): kiln compile and kiln run build trainers with them. */
Module *cmd_compile_checked(Args *a);

/* ---- helpers ---- */

/* Dies naming the model's line unless the trainer can feed every input of
 * m (compile.c, issue 17): i32 tokens and targets [batch, seq], optionally
 * an f32 loss_mask of their shape. */
void cmd_check_fed_inputs(const Module *m, const char *model);

/* Appends key=value to a --set list. */
void cmd_add_set(KeyVal **sets, int *nsets, const char *key, const char *value);
/* The folder of the running kiln binary (/proc/self/exe), or die. */
void cmd_exe_dir(char *buf, size_t n);
double cmd_now(void); /* seconds, monotonic */
/* The interpreter's step; exits after the interpreter's one-line error. */
void cmd_interp_run(Interp *it);
/* Rank 0's scalar output name, or NaN when the program has none. */
double cmd_output_scalar(Interp *it, const char *name);

/* ---- kiln plan's pipeline section (plan_pp.c) ---- */

/* Per stage: memory, in-flight bound, the bubble from the ops' costs beside
 * the closed form, bytes sent over pp; with a->timeline the SVG too. */
void plan_pp_report(const Args *a, const Module *m);
/* --pp-schedule all: a row per schedule, or the reason it is refused. */
void plan_pp_schedules(Args *a);
/* plan_offload.c (issue 19): kiln plan --offload's table per rank and
 * virtual stage; kiln plan --max-seq --memory GiB. */
void plan_offload_report(Args *a, const Module *m);
void plan_max_seq(Args *a);
/* kiln plan --compare-tp-cp N: tp N + sp against cp N p2p (plan_tp.c) */
void plan_compare_tp_cp(Args *a);

/* ---- the commands (each returns the exit status) ---- */

int cmd_check(Args *a);
int cmd_plan(Args *a);
int cmd_compile(Args *a);
int cmd_run(Args *a);
/* kiln calibrate and kiln tune parse their own flags (calibrate.c, tune.c; issue 21) */
int kiln_calibrate_main(int argc, char **argv);
int kiln_tune_main(int argc, char **argv);

#endif
