/* trainer.c — the training loop around a compiled program.
 *
 * The generated binary's main() (trainer_main.c) and `kiln run` (which JITs
 * the same program in memory) both call rt_train_main, so the two give
 * identical losses by construction: same runtime, same initial weights (the
 * interpreter's generator), same batches (data.c's sampler).
 *
 * Everything the step needs was decided at compile time; the trainer only
 * feeds the inputs "tokens" and "targets" (and "loss_mask" when the model
 * has one: from --ignore-index and --loss-mask, else ones; SeqBuf), runs the step, and reads the
 * outputs "loss", "lr" and "grad_norm".  Shapes (batch, sequence) are part
 * of the program, so --batch names the compile-time flag instead.  The one
 * exception is the learning-rate schedule (kiln_rt.h, rt_schedule): its
 * four numbers live in a table the step reads, and the trainer sets them
 * before the first step, in this order of precedence (later wins):
 *   1. the compiled values (kiln compile --lr --min-lr --warmup --steps);
 *   2. with --resume, the values the checkpoint was saved with (a resumed
 *      run keeps the schedule it started with; checkpoints from before the
 *      schedule was saved have none and keep 1);
 *   3. the flags --lr, --min-lr, --warmup, and for the length (total):
 *      --schedule-steps N, else --steps N when given — so `--steps 5000`
 *      decays the cosine over those 5000 steps, and a run that stops early
 *      on purpose says --schedule-steps for the full length.
 * Without --steps the run trains to the end of its schedule (total after
 * 1-3), so a resumed run without flags finishes the run it continues.
 *
 * Data (shards.h): --data and --val take a file or a glob of llm.c token
 * shards (.bin) or of text files (bytes are tokens).  A text file gives the
 * same batches as before shards existed, so its losses are unchanged.
 *
 * Validation: the compiled step always ends with the AdamW update, and the
 * program has no forward-only entry.  The loss it reports is computed by the
 * forward pass on the weights as they were before the update, so the
 * validation loss is measured by saving the parameter, gradient and
 * optimizer spaces, running the step on validation windows, reading "loss",
 * and restoring the three spaces byte for byte (params kept only in param
 * shards, kiln_rt.h, live in the optimizer space, so they are restored
 * too): the model and the optimizer
 * (step count, moments, learning-rate schedule) are exactly as if the
 * validation had not run (tests/t_data.sh checks the training losses are
 * bit-identical with and without --val).  It costs a full step per
 * validation batch; a forward-only program would cost a third of that.
 *
 * Several ranks (a program whose mesh has more than one rank, run under
 * mpirun).  Every rank runs this loop; the program's inputs are this rank's
 * rows: the rank with data-parallel coordinate d of DP draws the global
 * batch of DP x B windows from the shared generator and keeps windows
 * [d*B, (d+1)*B) (shards.h), so the union over ranks is the one-rank batch
 * of DP x B windows and every rank's generator stays in step.  With
 * context parallel (cp > 1) the program's T is this rank's T/cp tokens of
 * each window: the rank draws its dp slice of windows of cp x T tokens and
 * keeps its cp columns, chunks c and 2cp-1-c of 2cp (dual layout) or piece
 * c of cp (rt_program.cp_contiguous), tokens and targets alike, so the
 * union over the dp x cp ranks is again the one-rank batch.  Only world
 * rank 0 prints and writes --log; checkpoints are saved collectively
 * (checkpoint.h: rank 0 writes).  Every rank validates, since the step has
 * collectives.  The loss is all-reduced by the program, so a NaN stops
 * every rank at the same step.  Errors found before the first step (flags,
 * data, checkpoints) are agreed on by all ranks (rt_host_agree) and printed
 * once by rank 0; a failed step prints on the rank that failed, which
 * exits, and mpirun then ends the others.
 *
 * Pipeline stages (kiln_rt.h, rt_program.stages; docs/parallel.md).  The
 * trainer is handed kiln_program and runs the table of its rank's pp
 * coordinate (stage_program).  It feeds only the inputs that table
 * declares (the first stage tokens, the last targets and loss_mask), yet
 * every rank draws the batch (the ranks of one dp/cp coordinate the same
 * slice), so the generators stay in step; shapes come from whichever
 * stage has tokens or targets.  Every stage outputs the same loss, lr and
 * grad_norm, so rank 0 (stage 0) logs them as before; the FLOPs are the
 * stages' summed.  Checkpoints gather the stages (checkpoint.h).
 *
 * Devices (kiln_rt.h, "Host views").  The trainer only ever touches host
 * views of the program's memory: the CPU's memory itself, a GPU's host
 * mirror.  So every read of a view is preceded by a pull and every write
 * followed by a push: the inputs are pushed after they are drawn, the
 * outputs pulled after the step, and the validation's save and restore of
 * the kept spaces pull and push those spaces whole.  (Checkpoints pull and
 * push their own tensors, checkpoint.c.)  On the CPU these calls do
 * nothing, so the CPU trainer's behaviour is unchanged.  A failed pull or
 * push fails the step like a kernel error: one line, exit 1.  --no-graph
 * sets KILN_NO_GRAPH=1 before rt_new: the CUDA device then runs the step
 * function eagerly every step instead of replaying the CUDA graph it
 * captures on the first (for debugging; the CPU ignores it).
 *
 * Files (fsutil.h).  Before anything is opened, --log, --trace and the
 * checkpoints already in --ckpt must be absent or regular files that are
 * none of the inputs (--data, --val, --init, --resume's checkpoints), and
 * the inputs are opened so that a FIFO or a device is refused, not read.
 * --resume DIR without --ckpt keeps saving into DIR.  The log is written
 * a whole line per write(2) (log_open says why), and a failed write stops
 * the run at that step.  The schedule the run trains with is checked after
 * the flags and the checkpoint (check_schedule), as kiln compile checks the
 * compiled one (options.h, opt_check).
 */
#include "trainer.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "checkpoint.h"
#include "data.h"
#include "fsutil.h"
#include "rt_private.h"
#include "shards.h"

typedef struct {
    const char *data, *val, *log, *trace, *ckpt, *resume, *init;
    const char *loss_mask; /* --loss-mask FILE|GLOB: per-token weights aligned with --data */
    int steps, serial, no_graph, threads, print_every, val_every, val_batches, ckpt_every, keep;
    uint64_t seed;
    /* the schedule's flags: NAN / -1 when not given */
    double lr, min_lr;
    long warmup, schedule_steps;
    long ignore_index; /* --ignore-index: the target id whose positions the loss mask zeroes; -1: none */
} TrainArgs;

/* This process's rank as its launcher says, before MPI is initialised. */
static int launch_rank(void) {
    const char *r = getenv("OMPI_COMM_WORLD_RANK");
    if (!r) r = getenv("PMIX_RANK");
    return r ? atoi(r) : 0;
}

/* An error every rank meets alike (flags, the agreed errors): rank 0 says it. */
static void die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (launch_rank() == 0) {
        vfprintf(stderr, fmt, ap);
        fputc('\n', stderr);
    }
    va_end(ap);
    exit(1);
}

/* Every rank: exit 1 unless every rank passed rc == 0 (err: this rank's
 * message); rank 0 prints the first failure.  mpirun tears the job down at
 * the first rank's non-zero exit, which could come before rank 0 had
 * written the message (t_mpi.sh once saw exit 1 and no message), so every
 * rank waits at a barrier until rank 0 has said it, then exits. */
static void agree_or_die(rt_ctx *ctx, int rc, char *err, int errlen) {
    if (rt_host_agree(ctx, rc, err, errlen) == 0) return;
    if (launch_rank() == 0) fprintf(stderr, "%s\n", err);
    char e[512];
    if (rt_host_barrier(ctx, e, sizeof e) != 0 && launch_rank() == 0) fprintf(stderr, "%s\n", e);
    exit(1);
}

static const char *usage =
    "usage: %s --data FILE|GLOB [--val FILE|GLOB --val-every N [--val-batches N]]\n"
    "          [--steps N] [--seed N] [--log FILE.jsonl] [--trace FILE.json]\n"
    "          [--lr X] [--min-lr X] [--warmup N] [--schedule-steps N]\n"
    "          [--serial] [--threads N] [--no-graph] [--print-every N]\n"
    "          [--ckpt DIR [--ckpt-every N] [--keep K]] [--resume DIR] [--init FILE.safetensors]\n"
    "          [--ignore-index ID] [--loss-mask FILE|GLOB]\n"
    "  FILE|GLOB: llm.c token shards (.bin) or text files (bytes are tokens); quote globs\n"
    "  the cosine schedule: compiled values, then a --resume checkpoint's, then these flags;\n"
    "  its length is --schedule-steps, else --steps when given; without --steps, train to its end\n"
    "  --resume DIR: continue from DIR's newest checkpoint and save into DIR (unless --ckpt says where)\n"
    "  --ignore-index ID: targets equal to ID weigh 0 in the loss (the model's input loss_mask)\n"
    "  --loss-mask FILE|GLOB: shards of per-token weights, value i weighing the target that is token i of --data\n"
    "  --no-graph: on a GPU, run every step eagerly instead of replaying a CUDA graph\n"
    "    (sets KILN_NO_GRAPH=1; for debugging; the CPU ignores it)\n";

static long int_flag(const char *flag, const char *v) {
    char *end;
    long n = strtol(v, &end, 10);
    if (*v == 0 || *end || n < 0 || n > 1000000000) die("%s: expected a non-negative integer, got \"%s\"", flag, v);
    return n;
}

/* A finite real >= min (> min when strict). */
static double real_flag(const char *flag, const char *v, double min, int strict) {
    char *end;
    double x = strtod(v, &end);
    if (*v == 0 || *end || !isfinite(x) || x < min || (strict && x == min))
        die("%s: expected a finite number %s %g, got \"%s\"", flag, strict ? ">" : ">=", min, v);
    return x;
}

static int schedule_flag(const char *f) {
    return strcmp(f, "--lr") == 0 || strcmp(f, "--min-lr") == 0 || strcmp(f, "--warmup") == 0 || strcmp(f, "--schedule-steps") == 0;
}

static const rt_tensor *find(const rt_tensor *t, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (strcmp(t[i].name, name) == 0) return &t[i];
    return NULL;
}

/* Input `name` of the first pipeline stage that has one (kiln_rt.h,
 * rt_program.stages: the first stage reads tokens, the last targets), so
 * every rank knows the batch's shape whatever its stage reads; NULL if no
 * stage has it. */
static const rt_tensor *stage_input(const rt_program *p, const char *name) {
    for (int s = 0; s < rt_nstages(p); s++) {
        const rt_program *q = rt_stage(p, s);
        const rt_tensor *t = find(q->inputs, q->ninputs, name);
        if (t) return t;
    }
    return NULL;
}

/* The global batch the program was compiled for: its tokens' rows times dp. */
static long global_batch(const rt_program *p) {
    const rt_tensor *t = stage_input(p, "tokens");
    return t && t->rank >= 1 ? (long)t->dim[0] * (p->mesh[1] > 0 ? p->mesh[1] : 1) : 0;
}

static void parse(TrainArgs *a, const rt_program *p, int argc, char **argv) {
    a->steps = -1;
    a->lr = a->min_lr = NAN;
    a->warmup = a->schedule_steps = -1;
    a->seed = 1337;
    a->print_every = 10;
    a->val_batches = 4;
    a->keep = 3;
    a->ignore_index = -1;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        int has = i + 1 < argc;
        if (strcmp(f, "--serial") == 0) { a->serial = 1; continue; }
        if (strcmp(f, "--no-graph") == 0) { a->no_graph = 1; continue; }
        if (strcmp(f, "-h") == 0 || strcmp(f, "--help") == 0) { printf(usage, argv[0]); exit(0); }
        if (!has) die("%s: unknown flag or missing value", f);
        if (strcmp(f, "--batch") == 0) { /* shapes are compiled in: accept the compiled global batch, name the way to others */
            long want = int_flag(f, argv[++i]), have = global_batch(p);
            if (want != have)
                die("--batch %ld: %s was compiled for a global batch of %ld; recompile with kiln compile --set batch=%ld "
                    "(--micro-batches M keeps the memory per step)", want, p->model, have, want);
            continue;
        }
        const char *v = argv[++i];
        if (schedule_flag(f) && !p->schedule) die("%s: %s has no learning-rate schedule (no lr_cosine) to set", f, p->model);
        if (strcmp(f, "--data") == 0) a->data = v;
        else if (strcmp(f, "--lr") == 0) a->lr = real_flag(f, v, 0, 1);
        else if (strcmp(f, "--min-lr") == 0) a->min_lr = real_flag(f, v, 0, 0);
        else if (strcmp(f, "--warmup") == 0) a->warmup = int_flag(f, v);
        else if (strcmp(f, "--schedule-steps") == 0) {
            if ((a->schedule_steps = int_flag(f, v)) < 1) die("%s: expected at least 1, got \"%s\"", f, v);
        }
        else if (strcmp(f, "--val") == 0) a->val = v;
        else if (strcmp(f, "--val-every") == 0) a->val_every = (int)int_flag(f, v);
        else if (strcmp(f, "--val-batches") == 0) a->val_batches = (int)int_flag(f, v);
        else if (strcmp(f, "--log") == 0) a->log = v;
        else if (strcmp(f, "--trace") == 0) a->trace = v;
        else if (strcmp(f, "--steps") == 0) a->steps = (int)int_flag(f, v);
        else if (strcmp(f, "--seed") == 0) a->seed = (uint64_t)int_flag(f, v);
        else if (strcmp(f, "--threads") == 0) a->threads = (int)int_flag(f, v);
        else if (strcmp(f, "--print-every") == 0) a->print_every = (int)int_flag(f, v);
        else if (strcmp(f, "--ckpt") == 0) a->ckpt = v;
        else if (strcmp(f, "--ckpt-every") == 0) a->ckpt_every = (int)int_flag(f, v);
        else if (strcmp(f, "--keep") == 0) a->keep = (int)int_flag(f, v);
        else if (strcmp(f, "--resume") == 0) a->resume = v;
        else if (strcmp(f, "--init") == 0) a->init = v;
        else if (strcmp(f, "--ignore-index") == 0) a->ignore_index = int_flag(f, v);
        else if (strcmp(f, "--loss-mask") == 0) a->loss_mask = v;
        else die("%s: unknown flag", f);
    }
    if (!a->data) die("--data FILE|GLOB is required (llm.c token shards .bin, or text files whose bytes are the tokens)");
    if (a->val_every > 0 && !a->val) die("--val-every: needs --val FILE|GLOB");
    if (a->val && a->val_every == 0) die("--val: needs --val-every N (validate every N steps)");
    if (a->val_batches < 1) die("--val-batches: expected at least 1");
    if (a->print_every < 1) a->print_every = 1;
    if (a->resume && !a->ckpt) a->ckpt = a->resume; /* a resumed run keeps saving where it resumed from */
    if (a->ckpt_every && !a->ckpt) die("--ckpt-every: needs --ckpt DIR (or --resume DIR)");
    if (a->resume && a->init) die("--init: not with --resume (the checkpoint holds the weights)");
}

/* The schedule's flags over what the table holds (compiled, or resumed);
 * then the run's length (the essay's rule). */
static void set_schedule(const rt_program *p, TrainArgs *a, int default_steps) {
    rt_schedule *s = p->schedule;
    if (!s) {
        if (a->steps < 0) a->steps = default_steps;
        return;
    }
    if (!isnan(a->lr)) s->lr = a->lr;
    if (!isnan(a->min_lr)) s->min_lr = a->min_lr;
    if (a->warmup >= 0) s->warmup = (double)a->warmup;
    if (a->schedule_steps >= 0) s->total = (double)a->schedule_steps;
    else if (a->steps >= 0) s->total = a->steps;
    if (a->steps < 0) a->steps = s->total < 1 ? default_steps : s->total < 1e9 ? (int)s->total : 1000000000;
}

/* The schedule the run trains with, after set_schedule: the flags judge
 * their own values, but min-lr above lr can come from two sources (a flag
 * and the compiled or resumed table), and a .ir or an old checkpoint may
 * hold what kiln compile now refuses (options.h, opt_check). */
static void check_schedule(const rt_program *p, const TrainArgs *a) {
    const rt_schedule *s = p->schedule;
    if (!s) return;
    const char *lr = isnan(a->lr) ? "the learning rate" : "--lr", *min = isnan(a->min_lr) ? "the schedule's min-lr" : "--min-lr";
    if (!(s->lr > 0 && isfinite(s->lr))) die("%s %g: expected a finite number > 0", lr, s->lr);
    if (!(s->min_lr >= 0 && s->min_lr <= s->lr)) die("%s %g: expected a number in [0, %s %g]", min, s->min_lr, lr, s->lr);
    if (!(s->warmup >= 0 && s->warmup <= 1e9)) die("the schedule's warmup %g: expected a number of steps >= 0", s->warmup);
    if (!(s->total >= 1 && s->total <= 1e9)) die("the schedule's length %g: expected a number of steps >= 1", s->total);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* "1:02:03" or "2:03" */
static const char *hms(double s, char *buf, size_t n) {
    long t = s > 0 && s < 1e9 ? (long)(s + 0.5) : 0;
    if (t >= 3600) snprintf(buf, n, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else snprintf(buf, n, "%ld:%02ld", t / 60, t % 60);
    return buf;
}

/* The terminal progress line between printed steps (rewritten in place). */
static void progress(int step, int steps, double loss, double tps, double eta) {
    char bar[31], buf[32];
    int fill = steps > 0 ? (int)(30.0 * step / steps) : 30;
    for (int i = 0; i < 30; i++) bar[i] = i < fill ? '=' : ' ';
    bar[30] = 0;
    printf("\r\033[K[%s] %d/%d | loss %.4f | %.0f tok/s | ETA %s", bar, step, steps, loss, tps, hms(eta, buf, sizeof buf));
    fflush(stdout);
}

/* Output t (an f32 scalar) after a step, pulled first; NAN when the
 * program has no such output.  0, or -1 with err. */
static int read_scalar(rt_ctx *ctx, const rt_tensor *t, double *v, char *err, int errlen) {
    *v = NAN;
    if (!t) return 0;
    if (rt_pull_tensor(ctx, t, err, errlen) != 0) return -1;
    *v = *(float *)rt_tensor_ptr(ctx, t);
    return 0;
}

static int open_data(Dataset *d, const char *pattern, const char *flag, int64_t T, char *err, int errlen) {
    if (dataset_open(d, pattern, 0, flag, err, errlen) != 0) return -1;
    if (d->n >= (size_t)T + 1) return 0;
    snprintf(err, (size_t)errlen, "%s: %s holds %zu tokens, fewer than one window of %lld", flag, pattern, d->n, (long long)T + 1);
    return -1;
}

/* The --loss-mask stream: weights aligned with the data, one per token. */
static int open_weights(Dataset *w, const char *pattern, const Dataset *data, char *err, int errlen) {
    if (dataset_open(w, pattern, 0, "--loss-mask", err, errlen) != 0) return -1;
    if (w->n == data->n) return 0;
    snprintf(err, (size_t)errlen, "--loss-mask: %s holds %zu weights, --data holds %zu tokens; they must align one to one",
             pattern, w->n, data->n);
    return -1;
}

/* This rank's place among the pipeline, data-parallel and context-parallel ranks. */
typedef struct {
    int rank, world, dp, d; /* world rank and size; DP and this rank's dp coordinate */
    int pp;                 /* PP: pipeline stages */
    int cp, c;              /* CP and this rank's cp coordinate */
    int cp_contiguous;      /* rt_program.cp_contiguous */
    int say;                /* world rank 0: prints and writes the log */
} Ranks;

/* Column k < T/cp of this rank's part of a sequence of T tokens (kiln_rt.h,
 * rt_program.cp_contiguous): contiguous, piece c of cp; dual, chunks c and
 * 2cp-1-c of 2cp, in that order. */
static int64_t cp_column(const Ranks *R, int64_t T, int64_t k) {
    int64_t Tl = T / R->cp;
    if (R->cp_contiguous) return R->c * Tl + k;
    int64_t h = Tl / 2;
    return k < h ? R->c * h + k : (2 * R->cp - 1 - R->c) * h + (k - h);
}

/* Buffers of the global sequence [B, T] that this rank's rows are drawn
 * into before it keeps its cp columns and the inputs its stage reads; and the loss
 * mask's feed (issue 17): the program's input loss_mask (NULL if none),
 * the target id it zeroes (--ignore-index, -1: none), the weights stream
 * (--loss-mask, NULL: none; weight i goes with token i of the data, so a
 * window at offset o weighs target t by weight o+t+1) and the offsets of
 * this rank's B windows.  Without either the mask is all ones. */
typedef struct {
    int64_t B, T; /* this rank's windows and the global sequence's length */
    int32_t *tok, *tgt;
    const rt_tensor *mask;
    long ignore;
    const Dataset *weights;
    size_t *off;
} SeqBuf;

/* The program's inputs for this rank: the dp slice of the global batch of
 * DP x B windows of T = cp x T/cp tokens (shards.h), then, with cp, this
 * rank's columns of it, so the union over ranks is the one-rank batch;
 * written into their host views and pushed.  A pipeline stage feeds only
 * the inputs it has (tok, tgt, sb->mask may be NULL) but draws the batch
 * all the same, so every rank's generator stays in step.  0, or -1 with
 * err. */
static int sample_inputs(rt_ctx *ctx, const Dataset *d, const Ranks *R, const rt_tensor *tok, const rt_tensor *tgt,
                         const SeqBuf *sb, uint64_t *rng, char *err, int errlen) {
    int64_t B = sb->B, Tl = sb->T / R->cp, T = sb->T;
    int32_t *mt = tok ? rt_tensor_ptr(ctx, tok) : NULL, *mg = tgt ? rt_tensor_ptr(ctx, tgt) : NULL;
    float *mm = sb->mask ? rt_tensor_ptr(ctx, sb->mask) : NULL;
    size_t *off = sb->weights ? sb->off : NULL;
    dataset_sample(d, B, T, R->d, R->dp, rng, sb->tok, sb->tgt, off);
    for (int64_t b = 0; b < B; b++)
        for (int64_t k = 0; k < Tl; k++) {
            int64_t col = R->cp == 1 ? k : cp_column(R, T, k), at = b * T + col;
            if (mt) mt[b * Tl + k] = sb->tok[at];
            if (mg) mg[b * Tl + k] = sb->tgt[at];
            float w = off ? (float)dataset_token(sb->weights, off[b] + (size_t)col + 1) : 1.0f;
            if (mm) mm[b * Tl + k] = sb->ignore >= 0 && sb->tgt[at] == sb->ignore ? 0.0f : w;
        }
    if ((tok && rt_push_tensor(ctx, tok, err, errlen) != 0) || (tgt && rt_push_tensor(ctx, tgt, err, errlen) != 0)) return -1;
    return mm ? rt_push_tensor(ctx, sb->mask, err, errlen) : 0;
}

/* The inputs the loop feeds (tokens, targets, loss_mask; kiln compile
 * refuses a model with others): dies on a program with another, a
 * loss_mask not shaped like targets in f32, or --ignore-index without one. */
static void check_fed(const rt_program *p, const TrainArgs *a) {
    for (int s = 0; s < rt_nstages(p); s++)
        for (int i = 0; i < rt_stage(p, s)->ninputs; i++) {
            const char *n = rt_stage(p, s)->inputs[i].name;
            if (strcmp(n, "tokens") && strcmp(n, "targets") && strcmp(n, "loss_mask"))
                die("%s: input %s: the trainer feeds only tokens, targets and loss_mask", p->model, n);
        }
    const rt_tensor *tgt = stage_input(p, "targets"), *mask = stage_input(p, "loss_mask");
    if (mask && (mask->dtype != RT_F32 || mask->rank != 2 || mask->dim[0] != tgt->dim[0] || mask->dim[1] != tgt->dim[1]))
        die("%s: input loss_mask: the trainer feeds it as f32 shaped like targets", p->model);
    if ((a->ignore_index >= 0 || a->loss_mask) && !mask)
        die("%s: %s has no input loss_mask (write the loss as sum(ce * m) / sum(m), docs/dsl.md)",
            a->loss_mask ? "--loss-mask" : "--ignore-index", p->model);
}

/* The step's outputs loss, lr and grad_norm (each pulled; NAN for one the
 * program lacks).  0, or -1 with err. */
static int read_outputs(rt_ctx *ctx, const rt_tensor *loss_t, const rt_tensor *lr_t, const rt_tensor *gn_t, double *loss, double *lr,
                        double *gn, char *err, int errlen) {
    if (read_scalar(ctx, loss_t, loss, err, errlen) != 0 || read_scalar(ctx, lr_t, lr, err, errlen) != 0) return -1;
    return read_scalar(ctx, gn_t, gn, err, errlen);
}

/* One step on inputs drawn from d, then its loss (pulled): 0, or -1 with
 * err when the inputs, the step or the read fails. */
static int loss_step(rt_ctx *ctx, const Dataset *d, const Ranks *R, const rt_tensor *tok, const rt_tensor *tgt, const SeqBuf *sb,
                      uint64_t *rng, const rt_tensor *loss_t, double *loss, char *err, int errlen) {
    if (sample_inputs(ctx, d, R, tok, tgt, sb, rng, err, errlen) != 0 || rt_step(ctx, err, errlen) != 0) return -1;
    return read_scalar(ctx, loss_t, loss, err, errlen);
}

/* The spaces a step changes for good: restored after a validation step. */
static const int kept[] = {RT_SPACE_PARAMS, RT_SPACE_GRADS, RT_SPACE_OPT};
enum { NKEPT = sizeof kept / sizeof kept[0] };

/* Copy the kept spaces into save, each pulled whole first.  0, or -1 with err. */
static int save_kept(rt_ctx *ctx, const rt_program *p, char **save, char *err, int errlen) {
    for (int i = 0; i < NKEPT; i++) {
        int64_t n = p->space_bytes[kept[i]];
        if (n > 0 && rt_pull(ctx, kept[i], 0, n, err, errlen) != 0) return -1;
        memcpy(save[i], rt_space(ctx, kept[i]), (size_t)n);
    }
    return 0;
}

/* Write save back into the kept spaces and push them whole.  0, or -1 with err. */
static int restore_kept(rt_ctx *ctx, const rt_program *p, char *const *save, char *err, int errlen) {
    for (int i = 0; i < NKEPT; i++) {
        int64_t n = p->space_bytes[kept[i]];
        memcpy(rt_space(ctx, kept[i]), save[i], (size_t)n);
        if (n > 0 && rt_push(ctx, kept[i], 0, n, err, errlen) != 0) return -1;
    }
    return 0;
}

/* Mean loss over the fixed validation windows (the same every time: the
 * generator restarts from the seed), leaving the model untouched; NAN and a
 * message in err when a step (or a pull or push) fails. */
static double validate(rt_ctx *ctx, const rt_program *p, const Dataset *val, const TrainArgs *a, const Ranks *R, const rt_tensor *tok,
                       const rt_tensor *tgt, const SeqBuf *sb, const rt_tensor *loss_t, char **save, char *err, int errlen) {
    err[0] = 0;
    if (save_kept(ctx, p, save, err, errlen) != 0) return NAN;
    uint64_t rng = data_rng(a->seed);
    double sum = 0, loss;
    for (int k = 0; k < a->val_batches && !isnan(sum); k++)
        sum = loss_step(ctx, val, R, tok, tgt, sb, &rng, loss_t, &loss, err, errlen) == 0 ? sum + loss : NAN;
    char e[1024];
    if (restore_kept(ctx, p, save, e, sizeof e) != 0) { /* the model is not as it was: that error first */
        snprintf(err, (size_t)errlen, "%s", e);
        return NAN;
    }
    return sum / a->val_batches;
}

/* "FLAG: err" in err; -1. */
static int prefix_err(const char *flag, char *err, int errlen) {
    size_t k = strlen(flag) + 2, n = strlen(err);
    if (k + 1 >= (size_t)errlen) return -1;
    if (k + n + 1 > (size_t)errlen) n = (size_t)errlen - k - 1;
    memmove(err + k, err, n);
    memcpy(err, flag, k - 2);
    memcpy(err + k - 2, ": ", 2);
    err[k + n] = 0;
    return -1;
}

/* --resume on every rank; all must land on the same step. */
static void resume(rt_ctx *ctx, const rt_program *p, const TrainArgs *a, const Ranks *R, uint64_t *rng, int *first) {
    CkptExtra x = {0};
    char used[4096], err[1024] = "", e[512];
    int r = ckpt_resume(ctx, p, a->resume, &x, used, sizeof used, err, sizeof err);
    if (r < 0) prefix_err("--resume", err, sizeof err);
    agree_or_die(ctx, r < 0, err, sizeof err);
    int64_t mine = r == 0 ? x.step : -1, *all = calloc((size_t)R->world, sizeof *all);
    if (!all) die("--resume: out of memory");
    if (rt_host_allgather(ctx, RT_AXIS_PP | RT_AXIS_DP | RT_AXIS_CP | RT_AXIS_TP, &mine, all, sizeof mine, e, sizeof e) != 0) die("--resume: %s", e);
    for (int k = 0; k < R->world; k++)
        if (all[k] != mine) die("--resume: rank %d resumed at step %lld, rank %d at %lld (ranks see different files in %s)", k,
                                (long long)all[k], R->rank, (long long)mine, a->resume);
    free(all);
    if (r != 0) {
        if (R->say) printf("--resume: no checkpoint in %s yet; starting from step 1\n", a->resume);
        return;
    }
    *rng = x.rng;
    *first = (int)x.step + 1;
    if (R->say) printf("resumed from %s (step %lld)\n", used, (long long)x.step);
}

/* Before anything is opened: the outputs (--trace, this rank's trace file,
 * --log, the checkpoints already in --ckpt) are plain files or absent and
 * none is an input (fsutil.h); the inputs are read by rt_open_input, which
 * refuses FIFOs and devices.  A resumed run's checkpoints are inputs of the
 * log and the trace, not of --ckpt: writing new checkpoints beside them and
 * pruning old ones is what --ckpt does. */
static void check_files(const TrainArgs *a) {
    char resumed[4200], rank_trace[4200], err[1024];
    snprintf(resumed, sizeof resumed, "%s/step_*.safetensors", a->resume ? a->resume : "");
    RtPath in[6] = {{"--data", a->data}, {"--val", a->val}, {"--init", a->init}, {"--resume", a->resume ? resumed : NULL},
                    {"--trace", a->trace}};
    if (a->ckpt && ckpt_check_dir(a->ckpt, in, 3, err, sizeof err) != 0) die("%s", err);
    if (a->trace && rt_check_output("--trace", a->trace, in, 4, err, sizeof err) != 0) die("%s", err);
    int rank = launch_rank();
    snprintf(rank_trace, sizeof rank_trace, "%s.rank%d", a->trace ? a->trace : "", rank);
    if (a->trace && rank > 0 && rt_check_output("--trace", rank_trace, in, 4, err, sizeof err) != 0) { /* this rank's own */
        fprintf(stderr, "rank %d: %s\n", rank, err);
        exit(1);
    }
    if (a->log && rt_check_output("--log", a->log, in, 5, err, sizeof err) != 0) die("%s", err);
}

/* The JSONL log (world rank 0).  Each line is built whole and handed to
 * one write(2) on an O_APPEND descriptor, so a killed run leaves whole
 * lines (the kernel has them once write returns; no stdio buffer holds
 * half of one).  A resumed run appends; when the file does not end in a
 * newline (a writer killed mid-line, or a file cut short), it starts a
 * new line first, so the partial line stays on its own and every later
 * line parses.  The descriptor, or -1 with err. */
static int log_open(const char *path, int append, char *err, int errlen) {
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | (append ? O_APPEND : O_TRUNC), 0644);
    if (fd < 0) return snprintf(err, (size_t)errlen, "--log: %s: cannot open: %s", path, strerror(errno)), -1;
    struct stat st;
    char last = '\n';
    if (append && (fstat(fd, &st) != 0 || (st.st_size > 0 && pread(fd, &last, 1, st.st_size - 1) != 1) ||
                   (last != '\n' && write(fd, "\n", 1) != 1))) {
        snprintf(err, (size_t)errlen, "--log: %s: cannot end its last line: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

/* line[0..n) with one write (a short write, which only an error causes
 * on a regular file, is finished or fails).  0, or -1 with errno set. */
static int log_write(int fd, const char *line, size_t n) {
    while (n > 0) {
        ssize_t k = write(fd, line, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return errno = k < 0 ? errno : EIO, -1;
        line += k, n -= (size_t)k;
    }
    return 0;
}

/* The device the program runs on, for the start-up line: "cpu", "cuda sm_90". */
static const char *device_name(const rt_program *p, char *buf, size_t n) {
    if (p->device == RT_DEV_CUDA) snprintf(buf, n, "cuda %s", p->arch && *p->arch ? p->arch : "(no arch)");
    else if (p->device == RT_DEV_CPU) snprintf(buf, n, "cpu");
    else snprintf(buf, n, "device %d", p->device);
    return buf;
}

/* The table this rank runs: its pipeline stage's (kiln_rt.h,
 * rt_program.stages), the stage being the pp coordinate of the launcher's
 * rank.  A rank past the mesh gets stage 0, whose rt_new then says how
 * many processes to launch; so does a table of another ABI (not read
 * further). */
static const rt_program *stage_program(const rt_program *p) {
    if (rt_nstages(p) == 1) return p;
    int per = 1;
    for (int a = 1; a < 4; a++) per *= p->mesh[a] > 0 ? p->mesh[a] : 1;
    int s = launch_rank() / per;
    return s < p->nstages ? p->stages[s] : p;
}

/* Model FLOPs (or hardware FLOPs) of one step of the whole job: every
 * stage's, times the ranks that run it. */
static double job_flops(const rt_program *p, int world, int hw) {
    double f = 0;
    for (int s = 0; s < rt_nstages(p); s++) f += hw ? rt_stage(p, s)->hw_flops : rt_stage(p, s)->flops;
    return f * world / rt_nstages(p);
}

int rt_train_main(const rt_program *all, int argc, char **argv, int default_steps) {
    TrainArgs a = {0};
    const rt_program *p = stage_program(all);
    parse(&a, p, argc, argv);
    /* the batch's shape from whichever stage reads tokens or targets */
    const rt_tensor *tok = find(p->inputs, p->ninputs, "tokens"), *tgt = find(p->inputs, p->ninputs, "targets");
    const rt_tensor *tok0 = stage_input(p, "tokens"), *tgt0 = stage_input(p, "targets");
    if (!tok0 || !tgt0 || tok0->rank != 2 || tok0->dtype != RT_I32 || tgt0->rank != 2 || tgt0->dim[0] != tok0->dim[0] ||
        tgt0->dim[1] != tok0->dim[1])
        die("%s: the program needs i32 inputs tokens and targets [batch, seq]", p->model);
    const rt_tensor *loss_t = find(p->outputs, p->noutputs, "loss");
    const rt_tensor *lr_t = find(p->outputs, p->noutputs, "lr"), *gn_t = find(p->outputs, p->noutputs, "grad_norm");
    if (!loss_t) die("%s: the program has no loss output", p->model);
    int64_t B = tok0->dim[0], T = tok0->dim[1];

    check_files(&a);
    rt_options o = {.threads = a.threads, .serial = a.serial, .trace_path = a.trace};
    if (a.no_graph && setenv("KILN_NO_GRAPH", "1", 1) != 0) die("--no-graph: cannot set KILN_NO_GRAPH: %s", strerror(errno));
    rt_ctx *ctx = rt_new(p, &o);
    if (!ctx) return 1;
    Ranks R = {.rank = rt_world_rank(ctx), .world = rt_world_size(ctx), .dp = rt_group_size(ctx, RT_AXIS_DP),
               .d = rt_group_rank(ctx, RT_AXIS_DP), .cp = rt_group_size(ctx, RT_AXIS_CP), .c = rt_group_rank(ctx, RT_AXIS_CP),
               .cp_contiguous = p->cp_contiguous != 0, .pp = rt_group_size(ctx, RT_AXIS_PP)};
    R.say = R.rank == 0;
    if (rt_group_size(ctx, RT_AXIS_TP) > 1 && a.init) /* issue 20: --init's padded vocabularies know no tp pieces yet */
        die("%s: --init: not yet with a tensor-parallel program (--tp %d)", p->model, rt_group_size(ctx, RT_AXIS_TP));
    if (R.cp > 1 && !R.cp_contiguous && T % 2)
        die("%s: the dual cp layout needs an even number of tokens per rank, the program has %lld", p->model, (long long)T);
    T *= R.cp; /* the global sequence */
    SeqBuf sb = {.B = B, .T = T, .mask = find(p->inputs, p->ninputs, "loss_mask"), .ignore = a.ignore_index};
    check_fed(p, &a);
    if (!(sb.tok = malloc((size_t)(B * T) * 4)) || !(sb.tgt = malloc((size_t)(B * T) * 4))) die("out of memory");
    char err[1024] = "";
    Dataset train = {0}, val = {0}, weights = {0};
    int rc = open_data(&train, a.data, "--data", T, err, sizeof err);
    if (rc == 0 && a.val) rc = open_data(&val, a.val, "--val", T, err, sizeof err);
    if (rc == 0 && a.loss_mask) rc = open_weights(&weights, a.loss_mask, &train, err, sizeof err);
    SeqBuf vsb = sb; /* validation windows come from --val: no weights stream */
    if (a.loss_mask) {
        sb.weights = &weights;
        if (!(sb.off = malloc(sizeof(size_t) * (size_t)B))) die("out of memory");
    }
    agree_or_die(ctx, rc, err, sizeof err);
    char *save[NKEPT] = {0};
    for (int i = 0; a.val && i < NKEPT; i++)
        if (!(save[i] = malloc((size_t)p->space_bytes[kept[i]] + 1))) die("--val: out of memory");
    rt_init_params(ctx, a.seed);
    uint64_t rng = data_rng(a.seed);
    int first = 1;
    if (a.ckpt && ckpt_prepare_dir(a.ckpt, err, sizeof err) != 0) rc = prefix_err("--ckpt", err, sizeof err);
    agree_or_die(ctx, rc, err, sizeof err);
    if (a.init && ckpt_init_weights(ctx, p, a.init, err, sizeof err) != 0) rc = prefix_err("--init", err, sizeof err);
    agree_or_die(ctx, rc, err, sizeof err);
    if (a.resume) resume(ctx, p, &a, &R, &rng, &first);
    set_schedule(p, &a, default_steps);
    check_schedule(p, &a);
    /* a resumed run appends to its log (kiln plot keeps the later points) */
    int log = a.log && R.say ? log_open(a.log, a.resume != NULL, err, sizeof err) : -1;
    if (R.say && a.log && log < 0) rc = -1;
    agree_or_die(ctx, rc, err, sizeof err);
    int64_t gB = B * R.dp; /* the global batch */
    if (R.say) {
        char dev[64];
        printf("training %s on %s: %d steps of %lld x %lld tokens (compiled, %s", p->model, a.data, a.steps, (long long)gB,
               (long long)T, device_name(p, dev, sizeof dev));
        if (p->device == RT_DEV_CPU) printf(", %s", a.serial ? "serial" : "threaded"); /* a GPU's streams are its own */
        if (R.world > 1) printf(", %d ranks, dp %d", R.world, R.dp);
        if (R.pp > 1) printf(", pp %d", R.pp);
        if (R.cp > 1) printf(", cp %d (%s)", R.cp, R.cp_contiguous ? "contiguous" : "dual");
        printf(")\n");
        const rt_schedule *s = p->schedule;
        if (s) printf("lr schedule: %g -> %g cosine over %g steps, warmup %g\n", s->lr, s->min_lr, s->total, s->warmup);
    }
    double t0 = now();
    int tty = R.say && R.world == 1 && isatty(STDOUT_FILENO); /* mpirun hands ranks a pty whatever its own stdout is */
    char buf[32], who[32] = "";
    if (R.world > 1) snprintf(who, sizeof who, "rank %d: ", R.rank);
    int64_t comm0 = rt_comm_bytes(ctx);
    for (int step = first; step <= a.steps; step++) {
        double dt = 0, loss, lr, gn;
        int bad = sample_inputs(ctx, &train, &R, tok, tgt, &sb, &rng, err, sizeof err) != 0;
        if (!bad) {
            double ts = now();
            bad = rt_step(ctx, err, sizeof err) != 0;
            dt = now() - ts;
        }
        if (bad || read_outputs(ctx, loss_t, lr_t, gn_t, &loss, &lr, &gn, err, sizeof err) != 0) {
            fprintf(stderr, "%sstep %d: %s\n", who, step, err);
            rc = 1;
            break;
        }
        int64_t comm = rt_comm_bytes(ctx) - comm0;
        comm0 += comm;
        /* p->flops (model) and p->hw_flops (recompute included) are one
         * rank's step: the job does every stage's times its ranks */
        double tps = (double)(gB * T) / dt, gflops = job_flops(p, R.world, 0) / dt * 1e-9;
        double hw_gflops = job_flops(p, R.world, 1) / dt * 1e-9;
        if (!isfinite(loss)) { /* the loss is all-reduced: every rank stops here */
            if (R.say) fprintf(stderr, "step %d: loss is %g; stopping\n", step, loss);
            rc = 1;
            break;
        }
        double vloss = NAN;
        if (a.val && (step % a.val_every == 0 || step == a.steps)) {
            vloss = validate(ctx, p, &val, &a, &R, tok, tgt, &vsb, loss_t, save, err, sizeof err);
            if (!isfinite(vloss)) {
                if (R.say || (isnan(vloss) && *err))
                    fprintf(stderr, "%sstep %d: validation: %s\n", *err ? who : "", step, isnan(vloss) && *err ? err : "loss is not finite");
                rc = 1;
                break;
            }
            if (R.say) printf("%sstep %4d/%d | val loss %.4f\n", tty ? "\r\033[K" : "", step, a.steps, vloss);
        }
        double elapsed = now() - t0, eta = elapsed / (step - first + 1) * (a.steps - step);
        if (R.say && (step == 1 || step % a.print_every == 0 || step == a.steps))
            printf("%sstep %4d/%d | loss %.4f | lr %.2e | grad-norm %.3f | %.0f tok/s | %.1f GFLOP/s model, %.1f hw | ETA %s\n",
                   tty ? "\r\033[K" : "", step, a.steps, loss, lr, gn, tps, gflops, hw_gflops, hms(eta, buf, sizeof buf));
        else if (tty) /* rank 0 only */
            progress(step, a.steps, loss, tps, eta);
        if (log >= 0) { /* one line, one write; a failed write stops the run here (a full disk, a file size limit) */
            char line[512], vl[40] = "", cb[40] = "";
            if (!isnan(vloss)) snprintf(vl, sizeof vl, "\"val_loss\":%.9g,", vloss);
            if (R.world > 1) snprintf(cb, sizeof cb, "\"comm_bytes\":%lld,", (long long)comm);
            int k = snprintf(line, sizeof line, "{\"step\":%d,\"loss\":%.9g,%s%s\"lr\":%.9g,\"grad_norm\":%.9g,\"tokens_per_s\":%.1f,"
                             "\"gflops\":%.3f,\"hw_gflops\":%.3f,\"elapsed\":%.3f,\"eta\":%.1f}\n",
                             step, loss, vl, cb, lr, gn, tps, gflops, hw_gflops, elapsed, eta);
            if (log_write(log, line, (size_t)k < sizeof line ? (size_t)k : sizeof line - 1) != 0) {
                fprintf(stderr, "step %d: --log %s: cannot write: %s; stopping\n", step, a.log, strerror(errno));
                rc = 1;
                break;
            }
        }
        if (a.ckpt && ((a.ckpt_every && step % a.ckpt_every == 0) || step == a.steps)) {
            CkptExtra x = {.step = step, .rng = rng, .data_pos = 0};
            if (ckpt_save(ctx, p, a.ckpt, &x, a.keep, err, sizeof err) != 0) { /* every rank fails alike */
                if (R.say) fprintf(stderr, "step %d: %s\n", step, err);
                rc = 1;
                break;
            }
        }
        fflush(stdout);
    }
    if (rc != 0 && tty) printf("\n"); /* end the progress line before the error's */
    if (rc == 0 && R.say) printf("done: %d steps in %.1f s\n", a.steps - first + 1, now() - t0);
    if (log >= 0 && close(log) != 0) die("--log: %s: cannot write: %s", a.log, strerror(errno));
    rt_free(ctx);
    dataset_close(&train);
    dataset_close(&val);
    dataset_close(&weights);
    free(sb.off);
    for (int i = 0; i < NKEPT; i++) free(save[i]);
    free(sb.tok);
    free(sb.tgt);
    return rc;
}
