/* main.c — the kiln driver.
 *
 * It reads as the pipeline: the Lua front end builds the forward graph, then
 * each pass of `passes[]` rewrites the module in turn, with the verifier run
 * between every two passes, so a pass that breaks an invariant is named at
 * once.  `--after PASS` stops there (for `dump`).
 *
 *   kiln dump  MODEL [--after front|autodiff|optimizer] [--format text|dot] [-o FILE]
 *              (MODEL may be a .ir dump: it is parsed and used as it is)
 *   kiln check MODEL            run the step in f32 and in f64 on random inputs, compare
 *   kiln run   MODEL --interp --data FILE [--steps N] [--log F.jsonl] [--export F.safetensors]
 *
 * Every command takes --set key=value (the model's config{}), --seed N, and
 * the optimizer flags --lr --min-lr --warmup --weight-decay --grad-clip
 * (shorthands for --set).  User errors are one line and exit 1.
 */
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <errno.h>
#include <sys/wait.h>
#include <unistd.h>

#include "emit.h"
#include "front.h"
#include "interp.h"
#include "passes.h"
#include "memplan.h"
#include "plot.h"
#include "data_cmd.h"
#include "sample.h"
#include "trainer.h"
#include "data.h"
#include "safetensors.h"

static const struct {
    const char *name;
    PassFn run;
} passes[] = {
    {"autodiff", pass_autodiff},
    {"parallelize", pass_parallelize},
    {"recompute", pass_recompute},
    {"optimizer", pass_optimizer},
    {"precision", pass_precision},
    {"fuse", pass_fuse},
    {"schedule", pass_schedule},
    {"memplan", pass_memplan},
};
#define NPASSES ((int)(sizeof passes / sizeof passes[0]))

typedef struct {
    Options o;
    const char *cmd, *model, *after, *format, *out, *data, *log, *export_path, *target, *emit, *trace;
    const char *threads, *steps_flag;
    const char *cuda_arch; /* --target cuda:ARCH: "sm_90"; NULL for the CPU */
    const char *attention; /* --attention kiln|cudnn (CUDA) */
    int interp, f64, print_every, serial;
} Args;

/* sm_ followed by two or three digits and an optional a (sm_90a): NVRTC's real targets. */
static int cuda_arch_ok(const char *arch) {
    if (strncmp(arch, "sm_", 3) != 0) return 0;
    const char *p = arch + 3;
    int digits = 0;
    while (*p >= '0' && *p <= '9') p++, digits++;
    if (*p == 'a') p++;
    return (digits == 2 || digits == 3) && *p == 0;
}

static void die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("kiln: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

static void usage(FILE *f) {
    fputs("usage: kiln dump  MODEL [--after front|autodiff|optimizer] [--format text|dot] [-o FILE]\n"
          "       kiln check MODEL\n"
          "       kiln plan  MODEL                      memory per rank: params, grads, optimizer, activations\n"
          "       kiln plot  RUN.jsonl [RUN2.jsonl ...] -o OUT.svg [--title T] [--log-y]\n"
          "       kiln data  TEXT... -o PREFIX [--val-fraction F] [--shard-tokens N] [--bpe DIR]   llm.c token shards\n"
          "       kiln sample CHECKPOINT --prompt TEXT [--tokens N] [--temperature T] [--top-k K] [--seed S]\n"
          "       kiln compile MODEL --target cpu|cuda:sm_XX -o FILE [--emit llvm|cuda|schedule] [--attention kiln|cudnn]\n"
          "       kiln run   MODEL --data FILE [--steps N] [--log FILE.jsonl] [--trace FILE.json] [--serial] [--threads N]\n"
          "       kiln run   MODEL --interp --data FILE [--steps N] [--log FILE.jsonl] [--export FILE.safetensors] [--f64]\n"
          "common: --set key=value  --seed N  --lr X --min-lr X --warmup N --weight-decay X --grad-clip X\n"
          "        --dp N --micro-batches M --zero 0|1 --cp N --cp-layout dual|contiguous --cp-comm allgather|p2p\n"
          "        --recompute none|full|selective|gemm-last (plan: all) --memory-budget BYTES\n"
          "        --precision f32|bf16 (bf16: the GPU's mixed precision, on with --target cuda; for dump/check/plan/run --interp too;\n"
          "        the CPU runs f32)\n",
          f);
}

/* ---- the pipeline ---- */

static void verify_or_die(Module *m, const char *after) {
    char err[1024];
    if (ir_verify_module(m, err, sizeof err) != 0) die("verifier failed after %s: %s", after, err);
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* A .ir file is a dump read back as it is (no passes run). */
static Module *load_ir(const char *path) {
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
    Module *m = ir_parse(text, path, err, sizeof err);
    free(text);
    if (!m) {
        fprintf(stderr, "%s\n", err);
        exit(1);
    }
    verify_or_die(m, "parse");
    return m;
}

static Module *compile(Args *a) {
    char err[1024];
    if (ends_with(a->model, ".ir")) return load_ir(a->model);
    Module *m = fe_load(a->model, &a->o, err, sizeof err);
    if (!m) {
        fprintf(stderr, "%s\n", err);
        exit(1);
    }
    verify_or_die(m, "front");
    if (a->after && strcmp(a->after, "front") == 0) return m;
    for (int i = 0; i < NPASSES; i++) {
        passes[i].run(m, &a->o);
        verify_or_die(m, passes[i].name);
        if (a->after && strcmp(a->after, passes[i].name) == 0) break;
    }
    return m;
}

/* ---- flags ---- */

static void add_set(Args *a, const char *key, const char *value) {
    a->o.sets = realloc(a->o.sets, sizeof(KeyVal) * (size_t)(a->o.nsets + 1));
    if (!a->o.sets) die("out of memory");
    a->o.sets[a->o.nsets++] = (KeyVal){key, value};
}

static int parse_int_flag(const char *flag, const char *v) {
    char *end;
    long n = strtol(v, &end, 10);
    if (*v == 0 || *end || n < 0 || n > 1000000000) die("%s: expected a non-negative integer, got \"%s\"", flag, v);
    return (int)n;
}

static double parse_double_flag(const char *flag, const char *v) {
    char *end;
    double x = strtod(v, &end);
    if (*v == 0 || *end || !(x > 0) || x > 1e9) die("%s: expected a positive number, got \"%s\"", flag, v);
    return x;
}

/* bytes: an integer with an optional K, M, G or T suffix (powers of 1024, "GiB" too) */
static double parse_bytes_flag(const char *flag, const char *v) {
    char *end;
    double x = strtod(v, &end);
    static const char *const unit[] = {"", "K", "M", "G", "T"};
    int u = -1;
    for (int k = 0; k < 5; k++)
        if (strcmp(end, unit[k]) == 0 || (k && (end[0] == unit[k][0] && (strcmp(end + 1, "iB") == 0 || strcmp(end + 1, "B") == 0))))
            u = k;
    if (*v == 0 || u < 0 || !(x > 0)) die("%s: expected a positive number of bytes (e.g. 4000000000 or 40GiB), got \"%s\"", flag, v);
    for (int k = 0; k < u; k++) x *= 1024;
    return x;
}

static void parse_args(Args *a, int argc, char **argv) {
    static const struct { const char *flag, *key; } shorthands[] = {
        {"--lr", "lr"}, {"--min-lr", "min_lr"}, {"--warmup", "warmup"}, {"--steps", "steps"},
        {"--weight-decay", "weight_decay"}, {"--grad-clip", "grad_clip"},
    };
    opt_defaults(&a->o);
    a->print_every = 10;
    if (argc < 2) { usage(stderr); exit(1); }
    a->cmd = argv[1];
    if (strcmp(a->cmd, "-h") == 0 || strcmp(a->cmd, "--help") == 0) { usage(stdout); exit(0); }
    if (strcmp(a->cmd, "dump") && strcmp(a->cmd, "check") && strcmp(a->cmd, "run") && strcmp(a->cmd, "plan") &&
        strcmp(a->cmd, "compile"))
        die("unknown command \"%s\" (dump, check, plan, compile, run, plot, data; see kiln --help)", a->cmd);
    for (int i = 2; i < argc; i++) {
        const char *f = argv[i];
        int has = i + 1 < argc;
        int matched = 0;
        for (size_t s = 0; s < sizeof shorthands / sizeof *shorthands; s++)
            if (strcmp(f, shorthands[s].flag) == 0) {
                if (!has) die("%s needs a value", f);
                add_set(a, shorthands[s].key, argv[++i]);
                matched = 1;
            }
        if (matched) continue;
        if (f[0] != '-') {
            if (a->model) die("unexpected argument \"%s\"", f);
            a->model = f;
        } else if (strcmp(f, "--interp") == 0) a->interp = 1;
        else if (strcmp(f, "--f64") == 0) a->f64 = 1;
        else if (strcmp(f, "--serial") == 0) a->serial = 1;
        else if (strcmp(f, "--no-overlap") == 0) a->o.no_overlap = 1;
        else if (strcmp(f, "--test-drop-event") == 0) a->o.drop_event = 1;
        else if (strcmp(f, "-h") == 0 || strcmp(f, "--help") == 0) { usage(stdout); exit(0); }
        else if (!has) die("%s: unknown flag or missing value", f);
        else if (strcmp(f, "--set") == 0) {
            char *eq = strchr(argv[++i], '=');
            if (!eq || eq == argv[i]) die("--set: expected key=value, got \"%s\"", argv[i]);
            *eq = 0;
            add_set(a, argv[i], eq + 1);
        } else if (strcmp(f, "--after") == 0) a->after = argv[++i];
        else if (strcmp(f, "--format") == 0) a->format = argv[++i];
        else if (strcmp(f, "-o") == 0) a->out = argv[++i];
        else if (strcmp(f, "--data") == 0) a->data = argv[++i];
        else if (strcmp(f, "--log") == 0) a->log = argv[++i];
        else if (strcmp(f, "--export") == 0) a->export_path = argv[++i];
        else if (strcmp(f, "--target") == 0) a->target = argv[++i];
        else if (strcmp(f, "--emit") == 0) a->emit = argv[++i];
        else if (strcmp(f, "--attention") == 0) a->attention = argv[++i];
        else if (strcmp(f, "--trace") == 0) a->trace = argv[++i];
        else if (strcmp(f, "--threads") == 0) a->threads = argv[++i];
        else if (strcmp(f, "--seed") == 0) a->o.seed = (uint64_t)parse_int_flag(f, argv[++i]);
        else if (strcmp(f, "--print-every") == 0) a->print_every = parse_int_flag(f, argv[++i]);
        else if (strcmp(f, "--dp") == 0) a->o.dp = parse_int_flag(f, argv[++i]);
        else if (strcmp(f, "--micro-batches") == 0) a->o.micro_batches = parse_int_flag(f, argv[++i]);
        else if (strcmp(f, "--zero") == 0) a->o.zero = parse_int_flag(f, argv[++i]);
        else if (strcmp(f, "--bucket-mb") == 0) a->o.bucket_mb = parse_double_flag(f, argv[++i]);
        else if (strcmp(f, "--cp") == 0) a->o.cp = parse_int_flag(f, argv[++i]);
        else if (strcmp(f, "--cp-layout") == 0) {
            const char *v = argv[++i];
            if (strcmp(v, "dual") && strcmp(v, "contiguous")) die("--cp-layout: expected dual or contiguous, got \"%s\"", v);
            a->o.cp_contiguous = strcmp(v, "contiguous") == 0;
        } else if (strcmp(f, "--cp-comm") == 0) {
            const char *v = argv[++i];
            if (strcmp(v, "allgather") == 0) a->o.cp_comm = 0;
            else if (strcmp(v, "p2p") == 0) a->o.cp_comm = 1;
            else die("--cp-comm: expected p2p or allgather, got \"%s\"", v);
        } else if (strcmp(f, "--recompute") == 0) {
            const char *v = argv[++i];
            int r = ir_recompute_lookup(v);
            if (r < 0 && strcmp(v, "all") != 0) die("--recompute: expected none, full, selective or gemm-last, got \"%s\"", v);
            a->o.recompute = r < 0 ? RC_UNSET : r; /* all: kiln plan's table of every policy */
        } else if (strcmp(f, "--memory-budget") == 0) {
            a->o.memory_budget = parse_bytes_flag(f, argv[++i]);
        } else if (strcmp(f, "--precision") == 0) {
            const char *v = argv[++i];
            if (strcmp(v, "f32") && strcmp(v, "bf16")) die("--precision: expected f32 or bf16, got \"%s\"", v);
            a->o.precision_bf16 = strcmp(v, "bf16") == 0;
        } else if (strcmp(f, "--tp") == 0 || strcmp(f, "--pp") == 0) {
            if (parse_int_flag(f, argv[++i]) != 1) die("%s: this parallel axis is not available yet (only 1; --dp and --cp are)", f);
        } else die("%s: unknown flag", f);
    }
    if (!a->model) die("%s: no model file given", a->cmd);
    if (a->after) {
        int ok = strcmp(a->after, "front") == 0;
        for (int i = 0; i < NPASSES; i++) ok |= strcmp(a->after, passes[i].name) == 0;
        if (!ok) die("--after: unknown pass \"%s\" (front, autodiff, parallelize, recompute, optimizer, precision, fuse, schedule, memplan)", a->after);
    }
    if (a->o.recompute == RC_UNSET && strcmp(a->cmd, "plan") != 0) die("--recompute all: only for kiln plan (one policy per program)");
    if (a->target && strcmp(a->target, "cpu") != 0) {
        if (strncmp(a->target, "cuda:", 5) != 0 || !cuda_arch_ok(a->target + 5))
            die("--target: expected cpu or cuda:sm_XX (e.g. cuda:sm_90), got \"%s\"", a->target);
        if (strcmp(a->cmd, "compile") != 0) die("--target %s: only kiln compile builds for a GPU", a->target);
        a->cuda_arch = a->target + 5;
        a->o.precision_bf16 = 1; /* DESIGN §6: bf16 activations, f32 master weights */
    }
    if (a->attention && strcmp(a->attention, "kiln") && strcmp(a->attention, "cudnn"))
        die("--attention: expected kiln or cudnn, got \"%s\"", a->attention);
    if (a->attention && strcmp(a->attention, "cudnn") == 0 && !a->cuda_arch) die("--attention cudnn: only with --target cuda:sm_XX");
    if (a->o.precision_bf16 && !a->cuda_arch && (strcmp(a->cmd, "compile") == 0 || (strcmp(a->cmd, "run") == 0 && !a->interp)))
        die("--precision bf16: the CPU target is f32 (use --target cuda:sm_XX, or bf16 with dump, check, plan or run --interp)");
    if (a->o.dp < 1) die("--dp: expected at least 1");
    if (a->o.cp < 1) die("--cp: expected at least 1");
    if (a->o.micro_batches < 1) die("--micro-batches: expected at least 1");
    if (a->o.zero != 0 && a->o.zero != 1) die("--zero: expected 0 (all-reduce) or 1 (distributed optimizer), got %d", a->o.zero);
    if (a->format && strcmp(a->format, "text") && strcmp(a->format, "dot"))
        die("--format: expected text or dot, got \"%s\"", a->format);
    if (a->print_every < 1) a->print_every = 1;
    if (a->emit && strcmp(a->emit, "llvm") && strcmp(a->emit, "cuda") && strcmp(a->emit, "schedule"))
        die("--emit: expected llvm, cuda or schedule, got \"%s\"", a->emit);
}

/* ---- helpers over the compiled step ---- */

static Graph *step_graph(Module *m) { return m->stages[0]; }

/* The value id of input `name`, or -1. */
static int find_input(Graph *g, const char *name) {
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i].op == OP_input && strcmp(ir_attr_s(&g->nodes[i], "name", ""), name) == 0)
            return g->nodes[i].out[0];
    return -1;
}

static uint64_t rng_next(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void run_or_die(Interp *it) {
    char err[1024];
    if (interp_run(it, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        exit(1);
    }
}

static double output_scalar(Interp *it, const char *name) {
    const Tensor *t = interp_output(it, 0, name);
    return t ? t->d[0] : NAN;
}

/* ---- kiln dump ---- */

static int cmd_dump(Args *a) {
    Module *m = compile(a);
    FILE *f = a->out ? fopen(a->out, "w") : stdout;
    if (!f) die("-o: cannot open %s", a->out);
    if (a->format && strcmp(a->format, "dot") == 0) ir_dump_dot(m, f);
    else ir_dump(m, f);
    if (f != stdout && fclose(f) != 0) die("-o: cannot write %s", a->out);
    ir_free(m);
    return 0;
}

/* ---- kiln check: the same step in f32 and f64 on the same random inputs ---- */

static void fill_random_inputs(Interp *it, Graph *g, uint64_t seed) {
    uint64_t s = seed;
    for (int i = 0; i < g->nnodes; i++) {
        Node *n = &g->nodes[i];
        if (n->op != OP_input) continue;
        const Type *t = &g->vals[n->out[0]].t;
        int64_t cnt = ir_numel(t), bound = ir_index_bound(g, n->out[0], 1);
        double *d = malloc(sizeof(double) * (size_t)cnt);
        if (!d) die("out of memory");
        for (int64_t k = 0; k < cnt; k++)
            d[k] = ir_dtype_is_float(t->dt) ? (double)(rng_next(&s) >> 11) / 9007199254740992.0 - 0.5
                                            : (double)(rng_next(&s) % (uint64_t)bound);
        interp_set_input(it, 0, ir_attr_s(n, "name", ""), d, cnt);
        free(d);
    }
}

/* ---- kiln check --dp N [--micro-batches M] [--zero 0|1]: the rank programs
 * against the single-device one, in f64, on one random global batch ---- */

/* Random global inputs: one array per input of the unsharded graph. */
static double **random_global_inputs(Graph *g, uint64_t seed) {
    double **in = calloc((size_t)g->nnodes, sizeof(double *));
    uint64_t s = seed;
    if (!in) die("out of memory");
    for (int i = 0; i < g->nnodes; i++) {
        Node *n = &g->nodes[i];
        if (n->op != OP_input) continue;
        const Type *t = &g->vals[n->out[0]].t;
        int64_t cnt = ir_numel(t), bound = ir_index_bound(g, n->out[0], 1);
        if (!(in[i] = malloc(sizeof(double) * (size_t)cnt))) die("out of memory");
        for (int64_t k = 0; k < cnt; k++)
            in[i][k] = ir_dtype_is_float(t->dt) ? (double)(rng_next(&s) >> 11) / 9007199254740992.0 - 0.5
                                                : (double)(rng_next(&s) % (uint64_t)bound);
    }
    return in;
}

/* Largest |x - y| relative to the largest |y|. */
static double rel_err(const Tensor *x, const Tensor *y) {
    double worst = 0, scale = 1e-300;
    for (int64_t k = 0; k < y->n; k++) scale = fmax(scale, fabs(y->d[k]));
    for (int64_t k = 0; k < y->n; k++) worst = fmax(worst, fabs(x->d[k] - y->d[k]) / scale);
    return x->n == y->n ? worst : INFINITY;
}

/* Param `name` as rank r's group holds it: from the shards of the state with
 * prefix "" that has it as a member (the distributed optimizer's master
 * weights), else the param's own value.  Into out (numel values). */
static void logical_param(Interp *it, Module *m, int r, const char *name, double *out, int64_t numel) {
    Graph *g = step_graph(m);
    char member[512];
    int64_t off;
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        const char *prefix = ir_attr_s(n, "prefix", NULL);
        if (n->op != OP_state || !prefix || *prefix) continue;
        for (int k = 0; ir_bucket_member(n, k, member, sizeof member, &off) == 0; k++) {
            if (strcmp(member, name)) continue;
            int mem[64], idx, size = ir_group_members(m, r, ir_group_mask(ir_attr_s(n, "group", "")), mem, &idx);
            const char *sname = ir_attr_s(n, "name", "");
            int64_t c = interp_state(it, mem[0], sname)->n;
            for (int64_t e = 0; e < numel; e++) {
                int64_t gidx = off + e;
                if (gidx / c >= size) die("check: %s: member %s past its bucket", sname, name);
                out[e] = interp_state(it, mem[gidx / c], sname)->d[gidx % c];
            }
            return;
        }
    }
    const Tensor *t = interp_state(it, r, name);
    if (!t || t->n != numel) die("check: no param %s", name);
    memcpy(out, t->d, sizeof(double) * (size_t)numel);
}

/* Rank r's piece of a global input [B, T, ...]: rows of its dp coordinate,
 * and with cp the tokens of its cp coordinate (dual chunk: chunks c and
 * 2cp-1-c of 2cp; contiguous: piece c).  *n: its element count. */
static double *rank_input(const Module *m, int r, const Type *t, const double *x, int contiguous, int64_t *n) {
    int c[IR_NAXES], dp = m->mesh[1], cp = m->mesh[2];
    ir_rank_coords(m, r, c);
    int64_t B = t->dim[0], T = t->rank > 1 ? t->dim[1] : 1, inner = ir_numel(t) / (B * T);
    int64_t b = B / dp, tl = T / cp, half = tl / 2;
    double *y = malloc(sizeof(double) * (size_t)(b * tl * inner + 1));
    if (!y) die("out of memory");
    for (int64_t i = 0; i < b; i++)
        for (int64_t j = 0; j < tl; j++) {
            int64_t gj = cp == 1 ? j : contiguous ? c[2] * tl + j
                                   : j < half ? c[2] * half + j : (2 * cp - 1 - c[2]) * half + (j - half);
            memcpy(y + (i * tl + j) * inner, x + ((c[1] * b + i) * T + gj) * inner, sizeof(double) * (size_t)inner);
        }
    *n = b * tl * inner;
    return y;
}

static int check_parallel(Args *a) {
    Args ref = *a;
    ref.o.dp = 1, ref.o.micro_batches = 1, ref.o.cp = 1;
    ref.o.recompute = RC_NONE, ref.o.memory_budget = 0; /* the reference saves everything */
    Module *m1 = compile(&ref), *mp = compile(a);
    Graph *g1 = step_graph(m1), *gp = step_graph(mp);
    Interp *it1 = interp_new(m1, 1), *itp = interp_new(mp, 1);
    interp_init_state(it1, a->o.seed);
    interp_init_state(itp, a->o.seed);
    const double tol = 1e-9; /* f64 against f64: only the summation order differs */
    double worst = 0, loss[2] = {0, 0};
    int world = ir_world(mp), dp = mp->mesh[1], bad = 0, checked = 0;
    /* two steps: after one, AdamW's update is nearly sign(g), blind to a
     * gradient's scale; the second step's loss and update are not */
    for (int step = 0; step < 2; step++) {
        double **in = random_global_inputs(g1, a->o.seed + 1 + (uint64_t)step);
        for (int i = 0; i < g1->nnodes; i++) {
            if (!in[i]) continue;
            const char *name = ir_attr_s(&g1->nodes[i], "name", "");
            const Type *t = &g1->vals[g1->nodes[i].out[0]].t;
            int64_t cnt = ir_numel(t);
            interp_set_input(it1, 0, name, in[i], cnt);
            for (int r = 0; r < world; r++) {
                int64_t per;
                double *mine = rank_input(mp, r, t, in[i], a->o.cp_contiguous, &per);
                if (interp_set_input(itp, r, name, mine, per) != 0)
                    die("check: rank %d has no input %s of %lld values", r, name, (long long)per);
                free(mine);
            }
            free(in[i]);
        }
        free(in);
        run_or_die(it1);
        run_or_die(itp);
        loss[step] = output_scalar(itp, "loss");
        for (int r = 0; r < world; r++) {
            for (int i = 0; i < gp->nnodes; i++) { /* scalar outputs, and gradients where the program has them */
                if (gp->nodes[i].op != OP_output) continue;
                const char *name = ir_attr_s(&gp->nodes[i], "name", "");
                const Tensor *x = interp_output(itp, r, name), *y = interp_output(it1, 0, name);
                if (!y) die("check: the single-device program has no output %s", name);
                double e = rel_err(x, y);
                worst = fmax(worst, e), checked++;
                if (!(e <= tol)) printf("MISMATCH step %d rank %d output %-30s rel err %.3g (tolerance %.0e)\n", step + 1, r, name, e, tol), bad++;
            }
            for (int i = 0; i < gp->nnodes; i++) { /* updated params (assigns commit after the step) */
                if (gp->nodes[i].op != OP_param) continue;
                const char *name = ir_attr_s(&gp->nodes[i], "name", "");
                const Tensor *y = interp_state(it1, 0, name);
                if (!y) die("check: no param %s", name);
                Tensor x = *y;
                if (!(x.d = malloc(sizeof(double) * (size_t)y->n))) die("out of memory");
                logical_param(itp, mp, r, name, x.d, y->n);
                double e = rel_err(&x, y);
                free(x.d);
                worst = fmax(worst, e), checked++;
                if (!(e <= tol)) printf("MISMATCH step %d rank %d param %-31s rel err %.3g (tolerance %.0e)\n", step + 1, r, name, e, tol), bad++;
            }
        }
    }
    printf("check %s --dp %d --cp %d%s%s --micro-batches %d --zero %d --recompute %s: %d ranks, 2 steps; loss %.12f, %.12f; "
           "%d values compared with the single-device program, worst rel err %.2g, %d mismatched\n",
           a->model, dp, mp->mesh[2], a->o.cp_contiguous ? " --cp-layout contiguous" : "",
           mp->mesh[2] > 1 ? (a->o.cp_comm ? " --cp-comm p2p" : " --cp-comm allgather") : "", a->o.micro_batches, a->o.zero,
           ir_recompute_names[mp->recompute], world, loss[0], loss[1], checked, worst, bad);
    interp_free(it1);
    interp_free(itp);
    ir_free(m1);
    ir_free(mp);
    return bad ? 1 : 0;
}

static int cmd_check(Args *a) {
    if (a->o.dp > 1 || a->o.micro_batches > 1 || a->o.cp > 1) return check_parallel(a);
    Module *m = compile(a);
    Graph *g = step_graph(m);
    Interp *it[2];
    for (int p = 0; p < 2; p++) {
        it[p] = interp_new(m, p);
        interp_init_state(it[p], a->o.seed);
        fill_random_inputs(it[p], g, a->o.seed + 1);
        run_or_die(it[p]);
    }
    /* Tolerance: f32 rounds every op; relative to each tensor's largest
     * element, the f32 run must agree with f64 to 1e-3. */
    const double tol = a->o.precision_bf16 ? 0.1 : 1e-3; /* bf16: the f64 run keeps the bf16 roundings exactly */
    int bad = 0, checked = 0;
    for (int i = 0; i < g->nnodes; i++) {
        Node *n = &g->nodes[i];
        if (n->op != OP_output) continue;
        const char *name = ir_attr_s(n, "name", "");
        const Tensor *x = interp_output(it[0], 0, name), *y = interp_output(it[1], 0, name);
        double worst = 0, scale = 1e-12;
        for (int64_t k = 0; k < y->n; k++) scale = fmax(scale, fabs(y->d[k]));
        for (int64_t k = 0; k < y->n; k++) worst = fmax(worst, fabs(x->d[k] - y->d[k]) / scale);
        checked++;
        if (!(worst <= tol)) {
            printf("MISMATCH %-40s f32 vs f64 max rel err %.3g (tolerance %.0e)\n", name, worst, tol);
            bad++;
        }
    }
    printf("check %s: loss f32 %.7f f64 %.7f; %d outputs compared, %d mismatched\n", a->model,
           output_scalar(it[0], "loss"), output_scalar(it[1], "loss"), checked, bad);
    interp_free(it[0]);
    interp_free(it[1]);
    ir_free(m);
    return bad ? 1 : 0;
}

/* ---- kiln plan: the recompute table ---- */

typedef struct {
    int64_t saved, saved_layers, peak;
    double flops, extra;
    int layers;
} RcStats;

static RcStats rc_stats(const Module *m) {
    const Graph *g = m->stages[0];
    RcStats r = {recompute_saved_bytes(g, INT_MIN), 0, memplan_fwd_bwd_peak(m), 0, 0, 0};
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        double f = ir_node_flops(g, n);
        r.flops += f;
        if (n->phase == PH_RECOMPUTE) r.extra += f;
        if (n->layer + 1 > r.layers) r.layers = n->layer + 1;
    }
    for (int L = 0; L < r.layers; L++) r.saved_layers += recompute_saved_bytes(g, L);
    return r;
}

/* s, b, h, a of one rank's step from its first forward attention: its
 * sequence piece, its batch over all micro-batches (what it saves) */
static int attention_shape(const Module *m, int micro_batches, double *s, double *b, double *h, double *heads) {
    const Graph *g = m->stages[0];
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        if (n->op != OP_attention || n->phase != PH_FWD) continue;
        const Type *q = &g->vals[n->in[0]].t;
        *b = (double)q->dim[0] * micro_batches, *heads = (double)q->dim[1], *s = (double)q->dim[2];
        *h = (double)(q->dim[1] * q->dim[3]);
        return 1;
    }
    return 0;
}

/* kiln plan --recompute all: every policy side by side, per rank, next to
 * Korthikanti et al. 2022's bytes per layer (16-bit activations, with
 * dropout; ours are f32, flash attention, no dropout: docs/recompute.md) */
static void plan_recompute_table(Args *a) {
    static const Recompute pol[] = {RC_NONE, RC_SELECTIVE, RC_GEMM_LAST, RC_FULL};
    RcStats st[4];
    double s = 0, b = 0, h = 0, heads = 0;
    for (int k = 0; k < 4; k++) {
        Args one = *a;
        one.o.recompute = pol[k];
        one.o.memory_budget = 0;
        Module *m = compile(&one);
        st[k] = rc_stats(m);
        if (k == 0 && !attention_shape(m, a->o.micro_batches, &s, &b, &h, &heads)) die("plan --recompute all: the model has no attention");
        ir_free(m);
    }
    double sbh = s * b * h, L = st[0].layers ? st[0].layers : 1;
    printf("recompute policies (per rank; s %.0f, b %.0f, h %.0f, a %.0f, %d layers; f32 activations):\n", s, b, h, heads, st[0].layers);
    printf("  %-10s %14s %9s %9s %14s %14s %9s %10s\n", "policy", "saved/layer", "x s.b.h", "vs none", "saved total", "act. peak",
           "vs none", "+FLOPs");
    for (int k = 0; k < 4; k++) {
        double per = (double)st[k].saved_layers / L;
        printf("  %-10s %10.2f MiB %9.2f %8.1f%% %10.2f MiB %10.2f MiB %8.1f%% %9.2f%%\n", ir_recompute_names[pol[k]],
               per / (1 << 20), per / (4 * sbh), 100.0 * (per / ((double)st[0].saved_layers / L) - 1),
               (double)st[k].saved / (1 << 20), (double)st[k].peak / (1 << 20), 100.0 * ((double)st[k].peak / (double)st[0].peak - 1),
               100.0 * st[k].extra / st[k].flops);
    }
    printf("  Korthikanti et al. 2022, bytes per layer at 2 bytes per value: none 34sbh+5as^2b = %.2f MiB (%.1f sbh), "
           "selective 34sbh = %.2f MiB, full 2sbh = %.2f MiB\n",
           (34 * sbh + 5 * heads * s * s * b) / (1 << 20), 34 + 5 * heads * s / h, 34 * sbh / (1 << 20), 2 * sbh / (1 << 20));
    printf("  ours at 2 bytes per value: none %.1f sbh, selective %.1f sbh, gemm-last %.1f sbh, full %.1f sbh "
           "(x s.b.h above counts f32 values: bytes / 4sbh)\n",
           2 * (double)st[0].saved_layers / L / (4 * sbh), 2 * (double)st[1].saved_layers / L / (4 * sbh),
           2 * (double)st[2].saved_layers / L / (4 * sbh), 2 * (double)st[3].saved_layers / L / (4 * sbh));
}

static int cmd_plan(Args *a) {
    if (a->o.recompute == RC_UNSET) {
        plan_recompute_table(a);
        return 0;
    }
    Module *m = compile(a);
    memplan_report(m, stdout);
    printf("recompute %s: %.2f MiB saved from forward for backward per rank (%lld bytes)\n", ir_recompute_names[m->recompute],
           (double)recompute_saved_bytes(m->stages[0], INT_MIN) / (1 << 20), (long long)recompute_saved_bytes(m->stages[0], INT_MIN));
    if (m->mesh[2] > 1) { /* context parallel: activation memory against the same program at cp = 1 */
        Args one = *a;
        one.o.cp = 1;
        Module *m1 = compile(&one);
        int64_t act = memplan_fwd_bwd_peak(m), act1 = memplan_fwd_bwd_peak(m1);
        printf("  fwd+bwd activations per rank: %.2f MiB at cp %d, %.2f MiB at cp 1 (%.3fx)\n", (double)act / (1 << 20),
               m->mesh[2], (double)act1 / (1 << 20), act1 ? (double)act / (double)act1 : 0.0);
        ir_free(m1);
    }
    ir_free(m);
    return 0;
}

/* ---- kiln compile: object file + runtime library = a standalone trainer ---- */

#ifndef KILN_LINK_FLAGS
#define KILN_LINK_FLAGS "" /* the Makefile passes the sanitizer flags of a SAN=1 build */
#endif
#ifndef KILN_RT_LIBS
#define KILN_RT_LIBS "-lopenblas -lpthread -lm" /* the Makefile passes the runtime's libraries (MPI too) */
#endif

/* The folder of the running kiln binary: build/ holds libkilnrt.a and runtime/trainer_main.o. */
static void exe_dir(char *buf, size_t n) {
    ssize_t k = readlink("/proc/self/exe", buf, n - 1);
    if (k <= 0) die("cannot find the kiln binary (/proc/self/exe)");
    buf[k] = 0;
    char *slash = strrchr(buf, '/');
    if (slash) *slash = 0;
}

static void emit_inspection(Args *a, Module *m, const EmitTarget *t, const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) die("--emit: cannot open %s", path);
    char err[1024];
    if (strcmp(a->emit, "llvm") == 0) {
        if (emit_llvm_text_target(m, t, f, err, sizeof err) != 0) die("--emit llvm: %s", err);
    } else if (strcmp(a->emit, "cuda") == 0) {
        if (emit_cuda_text(m, f, err, sizeof err) != 0) die("--emit cuda: %s", err);
    } else ir_dump(m, f);
    if (fclose(f) != 0) die("--emit: cannot write %s", path);
}

/* Link obj with the runtime into out: cc, run without a shell (paths may hold
 * any character).  KILN_LINK_FLAGS (before the objects) and KILN_RT_LIBS
 * (after them): space-separated words, or empty. */
static void link_trainer(const char *out, const char *obj, int cuda) {
    char dir[4096], main_o[4200], rtlib[4200];
    exe_dir(dir, sizeof dir);
    snprintf(main_o, sizeof main_o, "%s/runtime/trainer_main.o", dir);
    snprintf(rtlib, sizeof rtlib, "%s/%s", dir, cuda ? "libkilnrt_cuda.a" : "libkilnrt.a");
    char *argv[64], flags[] = KILN_LINK_FLAGS, cpu_libs[] = KILN_RT_LIBS, cuda_libs[] = KILN_RT_CUDA_LIBS;
    char *libs = cuda ? cuda_libs : cpu_libs;
    int n = 0;
    argv[n++] = "cc";
    for (char *w = strtok(flags, " "); w && n < 24; w = strtok(NULL, " ")) argv[n++] = w;
    argv[n++] = "-o", argv[n++] = (char *)out, argv[n++] = (char *)obj, argv[n++] = main_o, argv[n++] = rtlib;
    for (char *w = strtok(libs, " "); w && n < 62; w = strtok(NULL, " ")) argv[n++] = w;
    argv[n] = NULL;
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) die("compile: fork: %s", strerror(errno));
    if (pid == 0) {
        execvp(argv[0], argv);
        fprintf(stderr, "kiln: compile: cannot run cc: %s\n", strerror(errno));
        _exit(127);
    }
    int status;
    if (waitpid(pid, &status, 0) < 0) die("compile: waitpid: %s", strerror(errno));
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) die("compile: linking %s with the runtime in %s failed", out, dir);
}

static int cmd_compile(Args *a) {
    if (!a->out) die("compile: -o FILE is required");
    Module *m = compile(a);
    char err[1024], path[4200];
    EmitTarget cuda = {.device = RT_DEV_CUDA, .arch = a->cuda_arch, .attention_cudnn = a->attention && !strcmp(a->attention, "cudnn")};
    EmitTarget *t = a->cuda_arch ? &cuda : NULL;
    EmitCubin *cubins = NULL;
    snprintf(path, sizeof path, "%s.cu", a->out);
    if (t && emit_cuda_cubins(m, t->arch, path, &cubins, &cuda.ncubins, err, sizeof err) != 0) die("compile: %s", err);
    cuda.cubins = cubins;
    if (a->emit) {
        const char *ext = strcmp(a->emit, "llvm") == 0 ? "ll" : strcmp(a->emit, "cuda") == 0 ? "cu" : "schedule.ir";
        snprintf(path, sizeof path, "%s.%s", a->out, ext);
        emit_inspection(a, m, t, path);
    }
    snprintf(path, sizeof path, "%s.o", a->out);
    if (emit_object_for(m, t, path, err, sizeof err) != 0) die("compile: %s", err);
    emit_cubins_free(cubins, cuda.ncubins);
    link_trainer(a->out, path, t != NULL);
    if (unlink(path) != 0) die("compile: cannot remove %s: %s", path, strerror(errno));
    printf("wrote %s%s%s\n", a->out, t ? " for " : "", t ? a->target : "");
    ir_free(m);
    return 0;
}

/* ---- kiln run (JIT): the compiled step, in memory, with the trainer's loop ---- */

static int cmd_run_jit(Args *a) {
    if (!a->data) die("run: --data FILE is required (a text file; bytes are the tokens)");
    Module *m = compile(a);
    char err[1024], seed[32], every[32];
    const rt_program *prog;
    Jit *j = emit_jit(m, &prog, err, sizeof err);
    if (!j) die("run: %s", err);
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)a->o.seed);
    snprintf(every, sizeof every, "%d", a->print_every);
    char *argv[24];
    int argc = 0;
    argv[argc++] = (char *)"kiln run";
    argv[argc++] = (char *)"--data", argv[argc++] = (char *)a->data;
    argv[argc++] = (char *)"--seed", argv[argc++] = seed;
    argv[argc++] = (char *)"--print-every", argv[argc++] = every;
    if (a->log) argv[argc++] = (char *)"--log", argv[argc++] = (char *)a->log;
    if (a->trace) argv[argc++] = (char *)"--trace", argv[argc++] = (char *)a->trace;
    if (a->threads) argv[argc++] = (char *)"--threads", argv[argc++] = (char *)a->threads;
    if (a->serial) argv[argc++] = (char *)"--serial";
    argv[argc] = NULL;
    int rc = rt_train_main(prog, argc, argv, (int)a->o.steps);
    emit_jit_free(j);
    ir_free(m);
    return rc;
}

/* ---- kiln run --interp: train on byte-level text ---- */

static void export_params(StWriter *w, Interp *it, Graph *g, const char *prefix, int from_outputs) {
    char key[512];
    for (int i = 0; i < g->nnodes; i++) {
        Node *n = &g->nodes[i];
        if (n->op != OP_param) continue;
        const char *name = ir_attr_s(n, "name", "");
        snprintf(key, sizeof key, "%s%s", prefix, name);
        const Tensor *t = from_outputs ? interp_output(it, 0, key) : interp_state(it, 0, name);
        if (!t) die("export: no value for %s", key);
        st_add_f32(w, key, t->t.dim, t->t.rank, t->d);
    }
}

static int cmd_run(Args *a) {
    if (!a->interp) return cmd_run_jit(a);
    if (!a->data) die("run: --data FILE is required (a text file; bytes are the tokens)");
    Module *m = compile(a);
    Graph *g = step_graph(m);
    int tok_id = find_input(g, "tokens"), tgt_id = find_input(g, "targets");
    if (tok_id < 0 || tgt_id < 0) die("run: %s needs inputs named tokens and targets", a->model);
    const Type *tt = &g->vals[tok_id].t;
    if (tt->rank != 2) die("run: input tokens must be [batch, seq]");
    int64_t B = tt->dim[0], T = tt->dim[1], vocab = ir_index_bound(g, tok_id, 1);
    if (vocab < 256) die("run: byte-level data needs a vocabulary of at least 256 (the model has %lld)", (long long)vocab);
    Corpus c;
    char err[1024];
    if (data_load_text(&c, a->data, err, sizeof err) != 0) die("%s", err);
    if (c.n < (size_t)T + 2) die("--data: %s has %zu bytes, fewer than one window of %lld", a->data, c.n, (long long)T + 1);

    Interp *it = interp_new(m, a->f64);
    interp_init_state(it, a->o.seed);
    StWriter *w = a->export_path ? st_new() : NULL;
    if (w) export_params(w, it, g, "param:", 0);
    FILE *log = a->log ? fopen(a->log, "w") : NULL;
    if (a->log && !log) die("--log: cannot open %s", a->log);

    int steps = (int)a->o.steps;
    double *tok = malloc(sizeof(double) * (size_t)(B * T)), *tgt = malloc(sizeof(double) * (size_t)(B * T));
    int32_t *tok32 = malloc(sizeof(int32_t) * (size_t)(B * T)), *tgt32 = malloc(sizeof(int32_t) * (size_t)(B * T));
    double *losses = malloc(sizeof(double) * (size_t)(steps > 0 ? steps : 1));
    if (!tok || !tgt || !tok32 || !tgt32 || !losses) die("out of memory");
    uint64_t rng = data_rng(a->o.seed);
    double t0 = now();
    printf("training %s on %s: %d steps of %lld x %lld tokens (interpreter, %s)\n", a->model, a->data, steps,
           (long long)B, (long long)T, a->f64 ? "f64" : "f32");
    for (int step = 1; step <= steps; step++) {
        data_sample_i32(&c, B, T, &rng, tok32, tgt32);
        for (int64_t k = 0; k < B * T; k++) tok[k] = tok32[k], tgt[k] = tgt32[k];
        interp_set_input(it, 0, "tokens", tok, B * T);
        interp_set_input(it, 0, "targets", tgt, B * T);
        double ts = now();
        run_or_die(it);
        double dt = now() - ts, loss = output_scalar(it, "loss");
        double lr = output_scalar(it, "lr"), gn = output_scalar(it, "grad_norm");
        losses[step - 1] = loss;
        if (w) {
            char key[64];
            int64_t shape[2] = {B, T};
            snprintf(key, sizeof key, "tokens.%d", step);
            st_add_i32(w, key, shape, 2, tok);
            snprintf(key, sizeof key, "targets.%d", step);
            st_add_i32(w, key, shape, 2, tgt);
            if (step == 1) export_params(w, it, g, "grad:", 1);
        }
        if (!isfinite(loss)) die("step %d: loss is %g; stopping", step, loss);
        if (step == 1 || step % a->print_every == 0 || step == steps)
            printf("step %4d/%d | loss %.4f | lr %.2e | grad-norm %.3f | %.0f tok/s\n", step, steps, loss, lr, gn,
                   (double)(B * T) / dt);
        if (log)
            fprintf(log, "{\"step\":%d,\"loss\":%.9g,\"lr\":%.9g,\"grad_norm\":%.9g,\"tokens_per_s\":%.1f,\"elapsed\":%.3f}\n",
                    step, loss, lr, gn, (double)(B * T) / dt, now() - t0);
        fflush(stdout);
    }
    printf("done: %d steps in %.1f s\n", steps, now() - t0);
    if (log && fclose(log) != 0) die("--log: cannot write %s", a->log);
    if (w) {
        int64_t shape[1] = {steps};
        st_add_f32(w, "loss", shape, 1, losses);
        if (st_write(w, a->export_path, err, sizeof err) != 0) die("--export: %s", err);
    }
    free(tok);
    free(tgt);
    free(tok32);
    free(tgt32);
    free(losses);
    data_free(&c);
    interp_free(it);
    ir_free(m);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "plot") == 0) return kiln_plot_main(argc - 1, argv + 1);
    if (argc > 1 && strcmp(argv[1], "data") == 0) return kiln_data_main(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "sample")) return kiln_sample_main(argc - 1, argv + 1);
    Args a = {0};
    parse_args(&a, argc, argv);
    int rc;
    if (strcmp(a.cmd, "dump") == 0) rc = cmd_dump(&a);
    else if (strcmp(a.cmd, "check") == 0) rc = cmd_check(&a);
    else if (strcmp(a.cmd, "plan") == 0) rc = cmd_plan(&a);
    else if (strcmp(a.cmd, "compile") == 0) rc = cmd_compile(&a);
    else rc = cmd_run(&a);
    free(a.o.sets);
    return rc;
}
