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

Module *compile(Args *a) {
    if (ends_with(a->model, ".ir")) {
        int runs = strcmp(a->cmd, "compile") == 0 || strcmp(a->cmd, "run") == 0;
        return load_ir(a->model, !runs ? NULL : a->interp && strcmp(a->cmd, "run") == 0 ? "optimizer" : "memplan");
    }
    Module *m = pipeline_front(a->model, &a->o);
    if (a->after && strcmp(a->after, "front") == 0) return m;
    pipeline_run(m, PIPE_TRAIN, &a->o, a->after);
    return m;
}
