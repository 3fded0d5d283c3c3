/* options.c — default values of Options; the model's config{} and the command
 * line override them (front_lua.c, main.c); opt_check refuses optimizer
 * settings no trainer should run with. */
#include <math.h>
#include <stdio.h>
#include <stddef.h>
#include <string.h>

#include "ir.h"
#include "options.h"

void opt_defaults(Options *o) {
    memset(o, 0, sizeof *o);
    o->pp = o->dp = o->cp = o->tp = 1;
    o->tp_chunks = 1;
    o->lr = 3e-4;
    o->min_lr = 0.0; /* cosine decays to 0 unless the model asks for a floor */
    o->warmup = 0;
    o->steps = 1000;
    o->weight_decay = 0.1;
    o->beta1 = 0.9;
    o->beta2 = 0.95;
    o->eps = 1e-8;
    o->grad_clip = 1.0;
    o->seed = 1337;
    o->micro_batches = 1;
    o->zero = 1;
    o->bucket_mb = 25;
    o->recompute = RC_GEMM_LAST;
    o->frontend_timeout = 10;
    o->offload_min_bytes = 1 << 20; /* the seeds' system skips tensors under 1 MiB */
    o->xent_fused = -1;             /* on with --target cuda (main.c) */
    o->schedule = SCHED_LHS;        /* --schedule fixed for the fixed order (docs/schedule.md) */
}

/* Where key's value came from: a --set of it or its shorthand flag
 * (main.c turns --lr X into --set lr=X), else the model's config{}. */
static const char *opt_origin(const Options *o, const char *key, const char *flag, char *buf, size_t len) {
    for (int i = 0; i < o->nsets; i++)
        if (strcmp(o->sets[i].key, key) == 0) {
            snprintf(buf, len, "%s%s--set %s", flag ? flag : "", flag ? "/" : "", key);
            return buf;
        }
    return "the model's config{}";
}

typedef struct {
    const char *key, *flag; /* flag: its shorthand, or NULL (--set only) */
    size_t off;
    double lo, hi;     /* the range */
    int lo_open, hi_open; /* 1: the bound itself is excluded */
    int whole;            /* a whole number (a count of steps) */
} OptRule;

static const OptRule opt_rules[] = {
    {"lr", "--lr", offsetof(Options, lr), 0, INFINITY, 1, 1, 0},
    {"min_lr", "--min-lr", offsetof(Options, min_lr), 0, INFINITY, 0, 1, 0},
    {"warmup", "--warmup", offsetof(Options, warmup), 0, 1e9, 0, 0, 1},
    {"steps", "--steps", offsetof(Options, steps), 1, 1e9, 0, 0, 1},
    {"weight_decay", "--weight-decay", offsetof(Options, weight_decay), 0, INFINITY, 0, 1, 0},
    {"beta1", NULL, offsetof(Options, beta1), 0, 1, 0, 1, 0},
    {"beta2", NULL, offsetof(Options, beta2), 0, 1, 0, 1, 0},
    {"eps", NULL, offsetof(Options, eps), 0, INFINITY, 1, 1, 0},
    {"grad_clip", "--grad-clip", offsetof(Options, grad_clip), 0, INFINITY, 0, 1, 0},
};

static int opt_in_range(const OptRule *r, double x) {
    if (!isfinite(x) || x < r->lo || x > r->hi || (r->lo_open && x == r->lo) || (r->hi_open && x == r->hi)) return 0;
    return !r->whole || x == floor(x);
}

int opt_check(const Options *o, char *err, int errlen) {
    char buf[512];
    for (size_t i = 0; i < sizeof opt_rules / sizeof opt_rules[0]; i++) {
        const OptRule *r = &opt_rules[i];
        double x = *(const double *)((const char *)o + r->off);
        if (opt_in_range(r, x)) continue;
        const char *from = opt_origin(o, r->key, r->flag, buf, sizeof buf);
        char hi[32] = "inf";
        if (isfinite(r->hi)) snprintf(hi, sizeof hi, "%g", r->hi);
        snprintf(err, (size_t)errlen, "%s = %g (from %s): expected a %s in %c%g, %s%c", r->key, x, from,
                 r->whole ? "whole number" : "finite number", r->lo_open ? '(' : '[', r->lo, hi, r->hi_open ? ')' : ']');
        return -1;
    }
    if (o->min_lr > o->lr) {
        const char *from = opt_origin(o, "min_lr", "--min-lr", buf, sizeof buf);
        snprintf(err, (size_t)errlen, "min_lr = %g (from %s) is above lr = %g: the cosine decays from lr down to min_lr", o->min_lr, from, o->lr);
        return -1;
    }
    return 0;
}
