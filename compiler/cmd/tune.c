/* tune.c (command) — `kiln tune`: search the configurations of a model on
 * N devices, rank them by the cost model's predicted step, print the table
 * and the `kiln compile` command of the best (issue 21).
 *
 *   kiln tune MODEL --gpus N --device PROFILE [--memory GiB] [--global-batch B]
 *             [--seq S] [--set k=v ...] [--top K] [--check K] [--precision f32|bf16]
 *             [--tp N] [--pp N] [--cp N] [--pp-schedule S] [--recompute R] [--micro-batches M]
 *             [--verify N]
 *   (--tp .. --micro-batches fix that dimension instead of searching it)
 *
 * The search (every product tp·cp·dp·pp = N):
 *   tp         divisors of N up to the profile's node size (tp's all-reduces
 *              stay on the intra-node link) with heads and kv heads
 *              multiples of tp (tp.c's rule; refused ones: the note), with
 *              sequence parallelism (the compiler's default under tp);
 *   cp         powers of two with seq a multiple of 2·cp, both cp-comm;
 *   pp         divisors of N up to the layer count; schedules 1f1b, zb-h1
 *              (v 1), interleaved (v 2 and 4), zb-v (v 2);
 *   micro-batch size b  powers of two up to 16 dividing batch/dp (m = batch/(dp·b));
 *   recompute  none, selective, gemm-last, full;
 *   offload    all, with a pipeline, only where the same configuration
 *              without offload does not fit (offload can only add time).
 * A candidate the rules refuse (tune_refusal) is skipped.  One whose
 * parameter state alone is over the budget (tune_lower_bound: from any
 * probe of its tp, cp and dp > 1) is counted over without a probe.  Every
 * other one is predicted by the fast path (tune_search.c: its memory
 * first, the pipeline simulated only when it fits) and kept when its memory
 * fits --memory (default: the profile's device memory); the kept ones are
 * ranked by predicted step.  KILN_TUNE_EXHAUSTIVE=1 (tests): no bound,
 * every candidate predicted whole.
 *
 * Then the first rows are verified (--verify N, default 1; 0: not) by the
 * exact plan on a slice (tune_verify): the candidate compiled with all its
 * layers and the fewest micro-batches m' at which every rank holds as many
 * (chunk, micro-batch) pairs in flight at its most, so memplan's per-rank
 * peak is the candidate's, and simulated by cost.c.  Down the ranked list
 * until N rows fit by it and the next row's fast step is no better than
 * the best checked step (at most N + 3 tried): a row over --memory is
 * dropped, and the ones that fit go first, ordered by their checked step
 * (the slice's simulated step, the fast path's error at m' carried to m;
 * equal to the full path's where m' = m).  The best's command is theirs.
 * The fast path prunes; the exact plan decides (docs/tune.md).
 *
 * --check K recomputes the first K by the full path (the whole program
 * compiled and simulated) and prints both and the error, and each rank's
 * memory by both: the fast path's test (tests/t_tune.sh).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#include "live.h"
#include "ppsched.h"
#include "tune.h"

typedef struct {
    TuneCand c;
    TunePred p;
    int ver;      /* tune_verify: 0 not run, 1 fits, -1 over the memory */
    TuneVerify v;
} Row;

static int cmp_row(const void *a, const void *b) {
    double x = ((const Row *)a)->p.step, y = ((const Row *)b)->p.step;
    return x < y ? -1 : x > y;
}

static long parse_pos(const char *flag, const char *v, long max) {
    char *e;
    long x = strtol(v, &e, 10);
    if (!*v || *e || x < 1 || x > max) die("%s: expected a whole number in 1..%ld, got \"%s\"", flag, max, v);
    return x;
}

typedef struct {
    Row *rows;
    int n, cap, tried, refused, nofit;
    char first_refusal[600];
    /* --pp, --cp, --pp-schedule, --recompute, --micro-batches: fixed (-1: searched) */
    int fix_pp, fix_cp, fix_sched, fix_rc, fix_m, fix_tp;
    int exhaustive; /* KILN_TUNE_EXHAUSTIVE=1 (tests): no lower bound, every candidate simulated */
} Search;

static int fixed_out(const Search *S, const TuneCand *c) {
    return (S->fix_pp >= 0 && c->pp != S->fix_pp) || (S->fix_cp >= 0 && c->cp != S->fix_cp) ||
           (S->fix_sched >= 0 && (c->pp == 1 || c->sched != S->fix_sched)) || (S->fix_rc >= 0 && c->rc != S->fix_rc) ||
           (S->fix_m >= 0 && c->m != S->fix_m) || (S->fix_tp >= 0 && c->tp != S->fix_tp);
}

static void push(Search *S, const TuneCand *c, const TunePred *p) {
    if (S->n == S->cap) {
        S->cap = S->cap ? 2 * S->cap : 256;
        S->rows = realloc(S->rows, sizeof(Row) * (size_t)S->cap);
        if (!S->rows) die("out of memory");
    }
    S->rows[S->n++] = (Row){*c, *p, 0, {0}};
}

/* One candidate: refused, predicted, kept if it fits. 1 if it fit. */
static int try_one(Tune *T, Search *S, const TuneCand *c) {
    char why[512];
    if (fixed_out(S, c)) return 1; /* not searched: as if it fit (no offload variant) */
    tune_refusal(T, c, why, sizeof why);
    S->tried++;
    if (why[0]) {
        if (!S->first_refusal[0] && strncmp(why, "tp ", 3) == 0) snprintf(S->first_refusal, sizeof S->first_refusal, "%s", why); /* tp's rules: the note */
        S->refused++;
        return 0;
    }
    double lb = S->exhaustive ? -1 : tune_lower_bound(T, c); /* the model's parameter state alone over the budget: no probe, no prediction */
    if (lb > T->memory) {
        S->nofit++, T->bound_pruned++;
        return 0;
    }
    TunePred p;
    char err[1024];
    if ((S->exhaustive ? tune_predict : tune_predict_fit)(T, c, &p, err, sizeof err) != 0) die("tune: %s", err);
    if (p.mem > T->memory) {
        S->nofit++;
        return 0;
    }
    push(S, c, &p);
    return 1;
}

static void search(Tune *T, Search *S) {
    static const int rcs[] = {RC_NONE, RC_SELECTIVE, RC_GEMM_LAST, RC_FULL};
    static const struct { int sched, v; } scheds[] = {{PS_1F1B, 1}, {PS_ZBH1, 1}, {PS_INTERLEAVED, 2}, {PS_INTERLEAVED, 4}, {PS_ZBV, 2}};
    int N = T->gpus;
    for (int tp = 1; tp <= N && tp <= T->prof.node_size; tp++) { /* tp within a node, heads divisible (tune_refusal) */
        if (N % tp) continue;
        for (int cp = 1; cp <= N / tp && cp <= 32; cp *= 2) { /* cp > 32: a ring of that many steps a layer; not searched */
            if ((N / tp) % cp || (cp > 1 && T->seq % (2 * cp))) continue;
            for (int pp = 1; pp <= N / (tp * cp) && pp <= T->layers; pp++) {
                if ((N / (tp * cp)) % pp) continue;
                int dp = N / (tp * cp * pp);
                if (T->batch % dp) continue;
                for (int b = 1; b <= 16 && b <= T->batch / dp; b *= 2) {
                    if ((T->batch / dp) % b) continue;
                    int m = T->batch / (dp * b);
                    for (size_t s = 0; s < (pp > 1 ? sizeof scheds / sizeof scheds[0] : 1); s++)
                        for (int cc = 0; cc < (cp > 1 ? 2 : 1); cc++)
                            for (size_t r = 0; r < sizeof rcs / sizeof rcs[0]; r++) {
                                TuneCand c = {tp, cp, dp, pp, pp > 1 ? scheds[s].v : 1, m, pp > 1 ? scheds[s].sched : 0, rcs[r], 0, cc};
                                if (!try_one(T, S, &c) && pp > 1) {
                                    c.offload = 1; /* only where it does not fit without */
                                    try_one(T, S, &c);
                                }
                            }
                }
            }
        }
    }
}

static const char *sched_name(const TuneCand *c, char *buf, size_t n) {
    if (c->pp == 1) snprintf(buf, n, "-");
    else if (c->sched == PS_INTERLEAVED) snprintf(buf, n, "interleaved/%d", c->v);
    else snprintf(buf, n, "%s", pp_schedule_names[c->sched]);
    return buf;
}

static void print_verified(const Tune *T, const Row *r, int i) {
    char sn[32], st[3][32];
    const TuneCand *c = &r->c;
    const double x[3] = {r->v.fast_slice, r->v.full_slice, r->v.step};
    for (int k = 0; k < 3; k++) /* over the memory: not simulated */
        snprintf(st[k], sizeof st[k], r->ver > 0 ? "%.2f" : "-", x[k] * 1e3);
    printf("  %3d %3d %3d %4d %3d %-14s %4d %3d %-9s %-3s %4d %10.2f %10s %10s %10s %9.4f %9.4f %4d %s\n", i, c->tp, c->cp, c->dp, c->pp,
           sched_name(c, sn, sizeof sn), c->m, T->batch / (c->dp * c->m), ir_recompute_names[c->rc], c->offload ? "all" : "-", r->v.m,
           r->p.step * 1e3, st[0], st[1], st[2], r->p.mem / (1 << 30), r->v.mem / (1 << 30), r->v.rank, r->ver > 0 ? "fits" : "over: dropped");
    fflush(stdout);
}

static void print_row(int i, const Tune *T, const TuneCand *c, const TunePred *p) {
    char sn[32];
    printf("  %3d %3d %3d %4d %3d %-14s %4d %3d %-9s %-3s %-3s %12.4g %6.1f%% %10.2f %9.2f %9.2f %9.2f %9.2f %9.2f\n", i, c->tp, c->cp, c->dp,
           c->pp, sched_name(c, sn, sizeof sn), c->m, T->batch / (c->dp * c->m), ir_recompute_names[c->rc], c->offload ? "all" : "-",
           c->cp > 1 ? (c->cp_comm ? "p2p" : "ag") : "-", p->tokens_s, 100 * p->mfu, p->step * 1e3, p->compute * 1e3, p->comm * 1e3,
           p->bubble * 1e3, p->copy * 1e3, p->mem / (1 << 30));
}

static int cmp_verified(const void *a, const void *b) {
    double x = ((const Row *)a)->v.step, y = ((const Row *)b)->v.step;
    return x < y ? -1 : x > y;
}

/* Nothing left to rank: free the search and fail with one line (verified:
 * after the exact plan dropped every row tried). */
static int nothing_fits(Tune *T, Search *S, KeyVal *sets, int verified, double memory) {
    free(S->rows);
    tune_free(T);
    free(sets);
    fflush(stdout);
    if (verified) return cmd_error("tune: no configuration tried fits %.4g GiB per device by the exact plan", memory / (1 << 30));
    return cmd_error("tune: no configuration fits %.4g GiB per device (raise --memory, or more --gpus)", memory / (1 << 30));
}

/* A row's family for the verification's memory ratio: the pipeline's
 * shape, offload, recompute and cp (what the fast path's composition
 * depends on), not tp, dp, cp-comm or the micro-batches. */
static int same_family(const TuneCand *a, const TuneCand *b) {
    return a->pp == b->pp && a->sched == b->sched && a->v == b->v && a->offload == b->offload && a->rc == b->rc && a->cp == b->cp;
}

/* Rank order, then the exact plan on a slice (tune_verify) down the list
 * (a row of a family already verified whose fast memory times the
 * family's exact/fast ratio is over the budget: dropped uncompiled)
 * until `want` rows fit by it and the next row's fast step is no better
 * than the best checked step, or `tries` rows were tried: a row over the
 * memory is dropped from S->rows; the ones that fit move to the front,
 * ordered by their checked step.  Returns how many fit. */
static int verify_rows(Tune *T, Search *S, int want, int tries, int *dropped, double *secs) {
    char err[1200];
    int ok = 0, tried = 0, n = 0, nfam = 0;
    *dropped = 0, *secs = 0;
    Row *keep = malloc(sizeof(Row) * (size_t)S->n), *rest = malloc(sizeof(Row) * (size_t)S->n);
    TuneCand *fam = malloc(sizeof(TuneCand) * (size_t)(3 * tries + 1)); /* a family per row tried at most */
    double *ratio = malloc(sizeof(double) * (size_t)(3 * tries + 1));
    if (!keep || !rest || !fam || !ratio) die("out of memory");
    int nk = 0, nr = 0;
    double best = INFINITY, budget = T->memory / (1 + TUNE_VERIFY_MARGIN); /* the best checked step so far */
    for (int i = 0; i < S->n; i++) {
        Row *r = &S->rows[i];
        /* on while fewer than `want` fit (up to 3 x tries rows: the fast
         * path's memory can be low by half on pipelined rows, so the first
         * rows may all be over), or while this row's fast step (the fast
         * path's own ranking) is below the best checked one and fewer than
         * `tries` were tried: it could still win */
        if (!(ok < want ? tried < 3 * tries : tried < tries && r->p.step < best)) {
            rest[nr++] = *r;
            continue;
        }
        /* a family already verified: its exact/fast memory ratio (the
         * largest seen) scales this row's fast memory; over: dropped
         * without compiling (an estimate: the verdict says so) */
        int f = 0;
        while (f < nfam && !same_family(&fam[f], &r->c)) f++;
        if (f < nfam && r->p.mem * ratio[f] > budget) {
            char sn[32];
            (*dropped)++;
            printf("  %3s %3d %3d %4d %3d %-14s %4d %3d %-9s %-3s %4s %10.2f %10s %10s %10s %9.4f %9.4f %4s over by its family's ratio %.3f: dropped\n",
                   "-", r->c.tp, r->c.cp, r->c.dp, r->c.pp, sched_name(&r->c, sn, sizeof sn), r->c.m, T->batch / (r->c.dp * r->c.m), ir_recompute_names[r->c.rc],
                   r->c.offload ? "all" : "-", "-", r->p.step * 1e3, "-", "-", "-", r->p.mem / (1 << 30), r->p.mem * ratio[f] / (1 << 30), "-",
                   ratio[f]);
            continue;
        }
        tried++;
        if (tune_verify(T, &r->c, &r->p, &r->v, err, sizeof err) != 0) die("tune --verify: %s", err);
        *secs += r->v.seconds;
        r->ver = r->v.mem <= budget ? 1 : -1;
        print_verified(T, r, ++n);
        double q = r->v.mem / r->p.mem;
        if (f == nfam) fam[nfam] = r->c, ratio[nfam++] = q;
        else ratio[f] = fmax(ratio[f], q);
        if (r->ver < 0) {
            (*dropped)++;
            continue;
        }
        ok++;
        best = fmin(best, r->v.step);
        keep[nk++] = *r;
    }
    qsort(keep, (size_t)nk, sizeof(Row), cmp_verified);
    memcpy(S->rows, keep, sizeof(Row) * (size_t)nk);
    memcpy(S->rows + nk, rest, sizeof(Row) * (size_t)nr);
    S->n = nk + nr;
    free(keep), free(rest), free(fam), free(ratio);
    return ok;
}

static void header(void) {
    printf("  %3s %3s %3s %4s %3s %-14s %4s %3s %-9s %-3s %-3s %12s %7s %10s %9s %9s %9s %9s %9s\n", "#", "tp", "cp", "dp", "pp", "schedule",
           "m", "b", "recompute", "off", "cpc", "tokens/s", "MFU", "step ms", "compute", "exp.comm", "bubble", "exp.copy", "mem GiB");
}

int kiln_tune_main(int argc, char **argv) {
    /* Tune plans without concat and slice views (live.c): a probe, planned
     * small, keeps views that the whole program's packing may give up, so
     * the fast path and the whole plan would price the copies differently
     * (t_tune: 8.7% apart with views, 5.1% without).  The compiled program
     * has views where they fit, so tune's step is an upper bound, as it is
     * for lhs's order (docs/tune.md). */
    ir_views_set(0);
    const char *model = NULL, *device = NULL;
    int gpus = 0, top = 10, check = 0, batch = 0, seq = 0, prec = -1, verify = 1;
    double memory = 0;
    KeyVal *sets = NULL;
    int nsets = 0;
    Search S = {.fix_pp = -1, .fix_cp = -1, .fix_sched = -1, .fix_rc = -1, .fix_m = -1, .fix_tp = -1};
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (f[0] != '-') {
            if (model) die("tune: unexpected argument \"%s\" (one MODEL)", f);
            model = f;
            continue;
        }
        if (i + 1 >= argc) die("tune: %s: missing value (or unknown flag)", f);
        const char *v = argv[++i];
        if (strcmp(f, "--gpus") == 0) gpus = (int)parse_pos(f, v, 1 << 20);
        else if (strcmp(f, "--device") == 0) device = v;
        else if (strcmp(f, "--top") == 0) top = (int)parse_pos(f, v, 100000);
        else if (strcmp(f, "--check") == 0) check = (int)parse_pos(f, v, 1000);
        else if (strcmp(f, "--verify") == 0) {
            char *e;
            long x = strtol(v, &e, 10);
            if (!*v || *e || x < 0 || x > 100) die("--verify: expected a whole number in 0..100, got \"%s\"", v);
            verify = (int)x;
        }
        else if (strcmp(f, "--global-batch") == 0) batch = (int)parse_pos(f, v, 1 << 24);
        else if (strcmp(f, "--seq") == 0) seq = (int)parse_pos(f, v, 1 << 24);
        else if (strcmp(f, "--pp") == 0) S.fix_pp = (int)parse_pos(f, v, 1 << 20);
        else if (strcmp(f, "--cp") == 0) S.fix_cp = (int)parse_pos(f, v, 1 << 20);
        else if (strcmp(f, "--tp") == 0) S.fix_tp = (int)parse_pos(f, v, 1 << 20);
        else if (strcmp(f, "--micro-batches") == 0) S.fix_m = (int)parse_pos(f, v, 1 << 24);
        else if (strcmp(f, "--pp-schedule") == 0) {
            if ((S.fix_sched = pp_schedule_lookup(v)) < 0) die("--pp-schedule: expected 1f1b, interleaved, zb-h1 or zb-v, got \"%s\"", v);
        } else if (strcmp(f, "--recompute") == 0) {
            if ((S.fix_rc = ir_recompute_lookup(v)) <= 0) die("--recompute: expected none, full, selective or gemm-last, got \"%s\"", v);
        }
        else if (strcmp(f, "--precision") == 0) {
            if (strcmp(v, "f32") && strcmp(v, "bf16")) die("--precision: expected f32 or bf16, got \"%s\"", v);
            prec = strcmp(v, "bf16") == 0;
        } else if (strcmp(f, "--memory") == 0) {
            char *e;
            memory = strtod(v, &e);
            if (!*v || *e || !(memory > 0) || !isfinite(memory)) die("--memory: expected GiB, a positive number, got \"%s\"", v);
            memory *= 1024.0 * 1024 * 1024;
        } else if (strcmp(f, "--set") == 0) {
            char *key = argv[i], *eq = strchr(key, '='); /* cut in place, as main.c's --set */
            if (!eq || eq == key) die("--set: expected key=value, got \"%s\"", v);
            *eq = 0;
            if (!strcmp(key, "batch") || !strcmp(key, "seq")) die("--set %s: use --global-batch / --seq with kiln tune", key);
            cmd_add_set(&sets, &nsets, key, eq + 1);
        } else die("tune: %s: unknown flag", f);
    }
    if (!model) die("usage: kiln tune MODEL --gpus N --device PROFILE [--memory GiB] [--global-batch B] [--seq S] [--top K] [--check K] [--verify N]");
    cmd_check_input("MODEL", model);
    if (!gpus) die("tune: --gpus N is required");
    if (!device) die("tune: --device PROFILE is required (cpu, h100, h200, a100 or a .profile file)");
    Profile p;
    char err[1200];
    if (profile_load(&p, device, err, sizeof err) != 0) die("--device: %s", err);
    if (memory == 0) memory = p.memory_bytes;
    int bf16 = prec >= 0 ? prec : strncmp(p.name, "cpu", 3) != 0; /* a GPU trains in bf16 (DESIGN §6), the CPU in f32 */
    double t0 = cmd_now();
    Tune T;
    tune_init(&T, model, sets, nsets, &p, gpus, memory, batch, seq, bf16);
    printf("kiln tune %s: %d layers, %d heads (%d kv), batch %d, seq %d, %s, on %d x %s (%.4g GiB each, %d a node)\n", model, T.layers, T.heads,
           T.kv_heads, T.batch, T.seq, bf16 ? "bf16" : "f32", gpus, p.name, memory / (1 << 30), p.node_size);
    S.exhaustive = getenv("KILN_TUNE_EXHAUSTIVE") != NULL;
    search(&T, &S);
    if (S.n > 0) qsort(S.rows, (size_t)S.n, sizeof(Row), cmp_row); /* rows is NULL when nothing fits */
    printf("searched %d configurations in %.1f s (%d probes compiled, %.1f s): %d fit, %d do not fit %.4g GiB, %d refused by the rules\n", S.tried,
           cmd_now() - t0, T.nprobes, T.probe_seconds, S.n, S.nofit, memory / (1 << 30), S.refused);
    if (T.bound_pruned) printf("of those over: %d by their parameter state alone (tune_lower_bound), not probed\n", T.bound_pruned);
    if (S.first_refusal[0]) printf("note: %s\n", S.first_refusal);
    if (S.n == 0) return nothing_fits(&T, &S, sets, 0, memory);
    int nver = 0;
    if (verify) {
        int dropped;
        double vs;
        printf("verify: the exact plan of the first rows on a slice (all the layers, m' micro-batches holding as many in flight; memplan per rank, cost.c's step)\n");
        printf("  %3s %3s %3s %4s %3s %-14s %4s %3s %-9s %-3s %4s %10s %10s %10s %10s %9s %9s %4s %s\n", "try", "tp", "cp", "dp", "pp", "schedule", "m",
               "b", "recompute", "off", "m'", "fast ms", "fast m'", "full m'", "checked", "fast GiB", "exact GiB", "rank", "verdict");
        nver = verify_rows(&T, &S, verify, verify + 3, &dropped, &vs);
        printf("verified: %d fit by the exact plan, %d over %.4g GiB dropped, in %.1f s; the table's first %d %s ranked by the checked step\n", nver,
               dropped, memory / (1 << 30), vs, nver, nver == 1 ? "is that row," : "are those,");
        if (nver == 0) printf("note: none of the rows tried fits by the exact plan: the table below is the fast path's, unverified\n");
        if (S.n == 0) return nothing_fits(&T, &S, sets, 1, memory);
    }
    header();
    for (int i = 0; i < S.n && i < top; i++) print_row(i + 1, &T, &S.rows[i].c, &S.rows[i].p);
    char flags[2048];
    printf("best: kiln compile %s %s --target %s -o trainer\n", model, tune_flags(&T, &S.rows[0].c, flags, sizeof flags),
           bf16 ? "cuda:sm_90" : "cpu");
    if (check) {
        printf("check: the fast path against the whole program compiled and simulated (cost_simulate)\n");
        printf("  %3s %12s %12s %8s %12s %12s %8s\n", "#", "fast ms", "full ms", "error", "fast GiB", "full GiB", "error");
        for (int i = 0; i < S.n && i < check; i++) {
            TunePred full;
            if (tune_full(&T, &S.rows[i].c, &full, err, sizeof err) != 0) die("tune --check: %s", err);
            const TunePred *f = &S.rows[i].p;
            printf("  %3d %12.4f %12.4f %7.2f%% %12.4f %12.4f %7.2f%%\n", i + 1, f->step * 1e3, full.step * 1e3, 100 * (f->step / full.step - 1),
                   f->mem / (1 << 30), full.mem / (1 << 30), 100 * (f->mem / full.mem - 1));
            TunePred again; /* the fast path's per-rank memory of this row (T.fast_mem) */
            if (tune_predict(&T, &S.rows[i].c, &again, err, sizeof err) != 0) die("tune --check: %s", err);
            printf("      per rank MiB, fast / full:");
            for (int r = 0; r < T.fast_n && r < T.full_n; r++) printf(" %.1f/%.1f", T.fast_mem[r] / (1 << 20), T.full_mem[r] / (1 << 20));
            printf("\n");
        }
    }
    free(S.rows);
    tune_free(&T);
    free(sets);
    return 0;
}
