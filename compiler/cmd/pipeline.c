/* pipeline.c — the two pipelines kiln runs, in one place.
 *
 * The Lua front end builds the forward graph of one training step (global
 * shapes, loss out).  A pipeline is a list of passes that then rewrite the
 * module in turn, with the verifier run after the front end and after every
 * pass, so a pass that breaks an invariant is named at once ("verifier
 * failed after fuse: ...").
 *
 *   train:    autodiff, parallelize, tp_overlap, recompute, pipeline, offload, optimizer, precision,
 *             fuse, schedule, memplan — the step every command but sample compiles
 *             (`--after PASS` stops there, for kiln dump)
 *   forward:  forward (keep what output "logits" needs: no loss, no autodiff,
 *             no optimizer), then the same fuse, schedule and memplan —
 *             kiln sample's program
 *
 * A .ir file given as the model is a dump read back as it is: parsed,
 * verified, and used without running a pass; a command that needs passes the
 * dump stops before (compile and run: memplan; run --interp: the optimizer)
 * refuses it (ir_parse_file).
 *
 * The lists live here, not in main.c, because kiln sample (sample.c, in the
 * compiler library with the other commands) needs the forward one and the
 * tests link that library without main.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#include "front.h"
#include "memplan.h"
#include "passes.h"

typedef struct {
    const char *name;
    PassFn run;
} Pass;

static const Pass train_passes[] = {
    {"autodiff", pass_autodiff},
    {"parallelize", pass_parallelize},
    {"tp_overlap", pass_tp_overlap},
    {"recompute", pass_recompute},
    {"pipeline", pass_pipeline},
    {"offload", pass_offload},
    {"optimizer", pass_optimizer},
    {"precision", pass_precision},
    {"fuse", pass_fuse},
    {"schedule", pass_schedule},
    {"memplan", pass_memplan},
};

static const Pass forward_passes[] = {
    {"forward", pass_forward},
    {"fuse", pass_fuse},
    {"schedule", pass_schedule},
    {"memplan", pass_memplan},
};

#define COUNT(a) ((int)(sizeof a / sizeof a[0]))

static void verify_or_die(const Module *m, const char *after) {
    char err[1024];
    if (ir_verify_module(m, err, sizeof err) != 0) die("verifier failed after %s: %s", after, err);
}

/* The --set overrides, "k=v" lines, kept in the module for the program's
 * checkpoints: kiln sample rebuilds the model with them. */
static void record_sets(Module *m, const Options *o) {
    size_t n = 1;
    for (int i = 0; i < o->nsets; i++) n += strlen(o->sets[i].key) + strlen(o->sets[i].value) + 2;
    char *s = ir_alloc(m, n), *p = s;
    for (int i = 0; i < o->nsets; i++) p += sprintf(p, "%s%s=%s", i ? "\n" : "", o->sets[i].key, o->sets[i].value);
    m->sets = o->nsets ? s : NULL;
}

Module *pipeline_front(const char *path, Options *o) {
    char err[1024];
    Module *m = fe_load(path, o, err, sizeof err);
    if (!m) {
        fprintf(stderr, "%s\n", err);
        exit(1);
    }
    verify_or_die(m, "front");
    record_sets(m, o);
    return m;
}

void pipeline_run(Module *m, Pipeline p, const Options *o, const char *after) {
    const Pass *passes = p == PIPE_TRAIN ? train_passes : forward_passes;
    int n = p == PIPE_TRAIN ? COUNT(train_passes) : COUNT(forward_passes);
    for (int i = 0; i < n; i++) {
        passes[i].run(m, o);
        verify_or_die(m, passes[i].name);
        if (after && strcmp(after, passes[i].name) == 0) break;
    }
}

void pipeline_check_after(const char *after) {
    char names[256] = "front";
    int ok = strcmp(after, "front") == 0;
    for (int i = 0; i < COUNT(train_passes); i++) {
        ok |= strcmp(after, train_passes[i].name) == 0;
        strcat(strcat(names, ", "), train_passes[i].name);
    }
    if (!ok) die("--after: unknown pass \"%s\" (%s)", after, names);
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

static Module *load_ir(const char *path, const char *need) {
    FILE *f = fopen(path, "rb");
    if (!f) die("%s: cannot open", path);
    size_t n = 0, cap = 1 << 16;
    char *text = malloc(cap + 1);
    for (size_t k; text && (k = fread(text + n, 1, cap - n, f)) > 0;)
        if ((n += k) == cap) text = realloc(text, (cap *= 2) + 1);
    if (!text || ferror(f)) die("%s: cannot read", path);
    fclose(f);
    text[n] = 0;
    char err[1024];
    Module *m = ir_parse_file(text, n, path, need, err, sizeof err);
    free(text);
    if (!m) {
        fprintf(stderr, "%s\n", err);
        exit(1);
    }
    verify_or_die(m, "parse");
    return m;
}

static Module *compile_once(Args *a) {
    Module *m = pipeline_front(a->model, &a->o);
    if (a->after && strcmp(a->after, "front") == 0) return m;
    pipeline_run(m, PIPE_TRAIN, &a->o, a->after);
    return m;
}

/* The largest plan of any rank (memplan's device total) and which. */
static int64_t largest_plan(const Module *m, int *rank) {
    int64_t most = -1;
    for (int s = 0; s < m->nstages; s++) {
        int64_t t = memplan_stage_total(m->stages[s]);
        if (t > most) most = t, *rank = s;
    }
    return most;
}

/* --memory-budget B: the device bytes a rank's plan may use (memplan's
 * total: parameters, gradients, optimizer state, activations, what kiln plan
 * prints).  lhs keeps its order within it (schedule.c); here, without
 * --recompute or --activation-budget, the first of none, gemm-last and full
 * (the fewest FLOPs first) whose plan fits on every rank is compiled —
 * each tried whole, as only memplan knows the peak exactly — and a plan
 * over the budget is an error that names the rank.  Compiles that only
 * compare with the user's (a->comparison) and stops before memplan are
 * not held to it. */
static Module *compile_within(Args *a) {
    static const Recompute order[] = {RC_NONE, RC_GEMM_LAST, RC_FULL};
    int pick = !a->recompute_given && a->o.activation_budget <= 0, n = pick ? 3 : 1, rank = 0;
    int64_t most = 0;
    for (int k = 0; k < n; k++) {
        if (pick) a->o.recompute = order[k];
        Module *m = compile_once(a);
        if ((most = largest_plan(m, &rank)) <= (int64_t)a->o.memory_budget) return m;
        ir_free(m);
    }
    die("--memory-budget %.0f bytes: the plan needs %lld bytes on pipeline rank %d (%.2f GiB; %s); "
        "try --offload, more --pp/--tp, or fewer micro-batches in flight",
        a->o.memory_budget, (long long)most, rank, (double)most / (1 << 30),
        pick ? "the smallest of --recompute none, gemm-last and full" : "with the --recompute given");
}

Module *compile(Args *a) {
    if (ends_with(a->model, ".ir")) {
        int runs = strcmp(a->cmd, "compile") == 0 || strcmp(a->cmd, "run") == 0;
        return load_ir(a->model, !runs ? NULL : a->interp && strcmp(a->cmd, "run") == 0 ? "optimizer" : "memplan");
    }
    if (a->o.memory_budget > 0 && !a->comparison && !a->after) return compile_within(a);
    return compile_once(a);
}
