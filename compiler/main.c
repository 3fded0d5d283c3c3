/* main.c — the kiln driver: it reads the command line and hands it to one
 * command.
 *
 * Most commands compile a model first: the Lua front end builds the forward
 * graph of one step, and a list of passes rewrites it, with the verifier run
 * after the front end and after each pass (the two lists: cmd/pipeline.c):
 *
 *   front ─▶ autodiff ─▶ parallelize ─▶ recompute ─▶ optimizer ─▶ precision
 *         ─▶ fuse ─▶ schedule ─▶ memplan           (the training step)
 *   front ─▶ forward ─▶ fuse ─▶ schedule ─▶ memplan  (kiln sample: logits out)
 *
 * The commands: dump here, each other one in its file in cmd/ (cmd.h says
 * what they share):
 *
 *   kiln dump    MODEL [--after PASS] [--format text|dot] [-o FILE]
 *                the IR after PASS (front or a pass of the training step;
 *                default: all of them)
 *   kiln check   MODEL            f32 against f64 on random inputs; with
 *                --dp/--cp/--micro-batches, the ranks against one device (check.c)
 *   kiln plan    MODEL [--peak]   memory per rank; --peak: what is live where the
 *                                activations peak; --recompute all: every policy (plan.c);
 *                                --pp N: per stage, bubble, bytes over pp; --pp-schedule all:
 *                                every schedule; --timeline FILE.svg (plan_pp.c)
 *   kiln compile MODEL --target cpu|cuda:sm_XX -o FILE [--emit llvm|cuda|schedule]
 *                [--attention kiln|cudnn|tc]      a standalone trainer (compile.c)
 *   kiln run     MODEL --data FILE [--steps N] [--log FILE.jsonl] [--trace FILE.json]
 *                [--serial] [--threads N]      the JIT-compiled step (run.c)
 *   kiln run     MODEL --interp --data FILE [--steps N] [--log FILE.jsonl]
 *                [--export FILE.safetensors] [--f64]   the interpreter (run.c)
 *   kiln plot    RUN.jsonl [RUN2.jsonl ...] -o OUT.svg [--title T] [--log-y]   (plot.c)
 *   kiln plot    --trace TRACE.json [TRACE2.json ...] -o OUT.svg [--step N]    (plot.c)
 *   kiln data    TEXT... -o PREFIX [--val-fraction F] [--shard-tokens N]
 *                [--bpe DIR | --encoder encoder.json --vocab-bpe vocab.bpe]    (data_cmd.c)
 *   kiln sample  CHECKPOINT --prompt TEXT [--model FILE.lua] [--set key=value]
 *                [--tokens N] [--temperature T] [--top-k K] [--seed S] [--threads N]   (sample.c)
 *
 * plot, data and sample parse their own flags.  For dump, check, plan,
 * compile and run, MODEL is a .lua model or a .ir dump (read back and used
 * as it is: no pass runs), and they share these flags (parse_args below;
 * each command ignores those it has no use for):
 *
 *   --set key=value (the model's config{}), --seed N, --print-every N (run);
 *   --lr X --min-lr X --warmup N --steps N --weight-decay X --grad-clip X
 *     (shorthands for --set);
 *   --dp N --micro-batches M --zero 0|1 --bucket-mb X --no-overlap;
 *   --schedule lhs|fixed (default lhs; docs/schedule.md);
 *   --cp N --cp-layout dual|contiguous --cp-comm allgather|p2p;
 *   --recompute none|full|selective|gemm-last (plan: all) --activation-budget BYTES;
 *   --memory-budget BYTES (the plan's device bytes per rank, cmd/pipeline.c);
 *   --precision f32|bf16 (bf16 with --target cuda:sm_XX, and for dump, check,
 *     plan and run --interp; the CPU trainer is f32);
 *   --pp N --vpp V --pp-schedule S (plan: all) --pp-layers A,B,... (docs/pipeline.md);
 *   --tp N (tensor parallel, docs/parallel.md) --tp-chunks K (tp_overlap.c);
 *   --device-profile FILE|NAME (profile.h; kiln plan prints it on its first line);
 *   --offload none|all|auto|F --offload-stages LIST --offload-min-bytes BYTES
 *     (docs/offload.md);
 *   --test-drop-event (tests only: the schedule forgets its first wait),
 *   --test-offload-bug early-read (tests only: a backward reader keeps the
 *     device copy of an offloaded value).
 *   kiln plan --max-seq --memory GiB: the longest sequence that fits per
 *     recompute/offload policy (cmd/plan_offload.c).
 *
 * User errors are one line on stderr and exit status 1.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#include "data_cmd.h"
#include "plot.h"
#include "ppsched.h"
#include "profile.h"
#include "sample.h"

static void usage(FILE *f) {
    fputs("usage: kiln dump    MODEL [--after PASS] [--format text|dot] [-o FILE]   (MODEL: a .lua model or a .ir dump)\n"
          "       kiln check   MODEL                      f32 against f64; with --dp/--cp/--micro-batches, ranks against one device\n"
          "       kiln plan    MODEL [--peak]             memory per rank: params, grads, optimizer, activations;\n"
          "                                               --peak: what is live where the activations peak\n"
          "                    [--pp N --pp-schedule S|all] [--timeline FILE.svg]   per pipeline stage; every schedule; the plan drawn\n"
          "                    [--compare-tp-cp N]   tp N + sp vs cp N p2p: comm per layer, activations, GEMM shapes per rank\n"
          "       kiln compile MODEL --target cpu|cuda:sm_XX -o FILE [--emit llvm|cuda|schedule] [--attention kiln|cudnn|tc]\n"
          "       kiln run     MODEL --data FILE [--steps N] [--log FILE.jsonl] [--trace FILE.json] [--serial] [--threads N]\n"
          "       kiln run     MODEL --interp --data FILE [--steps N] [--log FILE.jsonl] [--export FILE.safetensors] [--f64]\n"
          "                    (both: [--ignore-index ID], targets equal to ID weigh 0 through the input loss_mask)\n"
          "       kiln plot    RUN.jsonl [RUN2.jsonl ...] -o OUT.svg [--title T] [--log-y]\n"
          "       kiln plot    --trace TRACE.json [TRACE2.json ...] -o OUT.svg [--step N] [--title T]   ranks' timelines\n"
          "       kiln data    TEXT... -o PREFIX [--val-fraction F] [--shard-tokens N]\n"
          "                    [--bpe DIR | --encoder encoder.json --vocab-bpe vocab.bpe]   llm.c token shards\n"
          "       kiln sample  CHECKPOINT --prompt TEXT [--model FILE.lua] [--set key=value] [--tokens N]\n"
          "                    [--temperature T] [--top-k K] [--seed S] [--threads N]\n"
          "       kiln calibrate --device cpu -o FILE.profile [--quick] [--threads N] [--name NAME]   measure a device profile (docs/profiles.md)\n"
          "       kiln tune    MODEL --gpus N --device PROFILE [--memory GiB] [--global-batch B] [--seq S] [--top K] [--check K] [--verify N]\n"
          "                    the best tp x dp x cp x pp x schedule x micro-batches x recompute x offload by the cost model (docs/tune.md)\n"
          "PASS: front autodiff parallelize tp_overlap recompute optimizer precision fuse schedule memplan\n"
          "common (dump, check, plan, compile, run):\n"
          "        --set key=value  --frontend-timeout S (the model's run, default 10)  --seed N  --print-every N  --lr X --min-lr X --warmup N --steps N --weight-decay X --grad-clip X\n"
          "        --dp N --micro-batches M --zero 0|1 --bucket-mb X --no-overlap  --schedule lhs|fixed (default lhs; docs/schedule.md)\n"
          "        --cp N --cp-layout dual|contiguous --cp-comm allgather|p2p\n"
          "        --recompute none|full|selective|gemm-last (plan: all) --activation-budget BYTES (saved activations per rank)\n"
          "        --memory-budget BYTES (device memory per rank: the plan must fit; picks the recompute policy when --recompute is not given)\n"
          "        --device-profile FILE|NAME (cpu, h100, h200, a100, or a .profile file: docs/profiles.md)\n"
          "        --precision f32|bf16 (bf16: the GPU's mixed precision, on with --target cuda; for dump/check/plan/run --interp too;\n"
          "        the CPU runs f32)\n"
          "        --pp N --vpp V --pp-schedule 1f1b|interleaved|zb-h1|zb-v (plan: all) --pp-layers A,B,... (layers per chunk)\n"
          "        --offload none|all|auto|F (F in (0,1]; auto: from --device-profile, default cpu) --offload-stages LIST --offload-min-bytes BYTES (docs/offload.md)\n"
          "        --gemm-epilogue bias|gelu|bgrad|all|none (cuBLASLt epilogues, each value adding to the one before: bias adds, bias + GELU,\n"
          "          weight-gradient GEMMs' bias gradients (BGRADA/B), dGELU + bias gradient (DGELU_BGRAD); default none, CUDA only)\n"
          "        --xent-fused on|off (the fused classifier: cross-entropy's loss and logits' gradient at the forward; default on with --target cuda)\n"
          "        --tp N (tensor parallel: Megatron's layout) --sp|--no-sp (sequence parallel, default on with tp > 1)\n"
          "        --tp-chunks K (sp's all-gathers and reduce-scatters cut into K token chunks that overlap the MLP's and attention's GEMMs; default 1: off)\n"
          "        --test-drop-event --test-pp-bug drop-tied|swap-recv|late-post\n"
          "        --test-offload-bug early-read --test-tp-bug drop-bwd-reduce|xent-max|norm-grad|chunk-order (tests only)\n"
          "        kiln plan --offload X: copies per rank and virtual stage; kiln plan --max-seq --memory GiB: the longest sequence per policy\n",
          f);
}

/* ---- the commands ---- */

static int cmd_dump(Args *a) {
    cmd_check_output("-o", a->out, &(RtPath){"MODEL", a->model}, 1);
    Module *m = compile(a);
    FILE *f = a->out ? fopen(a->out, "w") : stdout;
    if (!f) die("-o: cannot open %s", a->out);
    if (a->format && strcmp(a->format, "dot") == 0) ir_dump_dot(m, f);
    else ir_dump(m, f);
    if (f != stdout && fclose(f) != 0) die("-o: cannot write %s", a->out);
    ir_free(m);
    return 0;
}

typedef struct {
    const char *name;
    int (*run)(Args *a);
} Command;

static const Command commands[] = {
    {"dump", cmd_dump}, {"check", cmd_check}, {"plan", cmd_plan}, {"compile", cmd_compile}, {"run", cmd_run},
};

/* kiln plot, data and sample: argv[0] is the command's name */
static const struct {
    const char *name;
    int (*main)(int argc, char **argv);
} own_flags[] = {{"plot", kiln_plot_main}, {"data", kiln_data_main}, {"sample", kiln_sample_main},
                 {"calibrate", kiln_calibrate_main}, {"tune", kiln_tune_main}};

static const Command *find_command(const char *name) {
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(name, commands[i].name) == 0) return &commands[i];
    return NULL;
}

/* Every command's name, from the two tables: "dump, check, ..., sample". */
static const char *command_names(char *buf, size_t n) {
    size_t len = 0, nc = sizeof commands / sizeof commands[0], no = sizeof own_flags / sizeof own_flags[0];
    buf[0] = 0;
    for (size_t i = 0; i < nc + no; i++)
        len += (size_t)snprintf(buf + len, len < n ? n - len : 0, "%s%s", i ? ", " : "", i < nc ? commands[i].name : own_flags[i - nc].name);
    return buf;
}

/* ---- flags ---- */

/* sm_ followed by two or three digits and an optional a (sm_90a): NVRTC's real targets. */
static int cuda_arch_ok(const char *arch) {
    if (strncmp(arch, "sm_", 3) != 0) return 0;
    const char *p = arch + 3;
    int digits = 0;
    while (*p >= '0' && *p <= '9') p++, digits++;
    if (*p == 'a') p++;
    return (digits == 2 || digits == 3) && *p == 0;
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
/* --pp-layers A,B,...: positive layer counts, one per chunk. */
static void parse_pp_layers(Options *o, const char *v) {
    int n = 1;
    for (const char *c = v; *c; c++) n += *c == ',';
    free(o->pp_layers);
    o->pp_layers = calloc((size_t)n, sizeof(int));
    if (!o->pp_layers) die("out of memory");
    const char *p = v;
    for (int k = 0; k < n; k++) {
        char *end;
        long x = strtol(p, &end, 10);
        if (end == p || x < 1 || x > 1000000 || (*end && *end != ',')) die("--pp-layers: expected positive layer counts like 3,3,2, got \"%s\"", v);
        o->pp_layers[k] = (int)x;
        p = end + 1;
    }
    o->npp_layers = n;
}

/* --offload none|all|auto|F: 0, 1, OFFLOAD_AUTO, or F in (0,1]. */
static double parse_offload(const char *v) {
    if (strcmp(v, "none") == 0) return 0;
    if (strcmp(v, "all") == 0) return 1;
    if (strcmp(v, "auto") == 0) return OFFLOAD_AUTO;
    char *end;
    double x = strtod(v, &end);
    if (end == v || *end || !(x > 0 && x <= 1)) die("--offload: expected none, all, auto or a fraction in (0,1], got \"%s\"", v);
    return x;
}

/* --offload-stages 0,2: local virtual stage indices, a bit each (checked
 * against the pipeline's virtual stages in check_args). */
static uint64_t parse_offload_stages(const char *v) {
    uint64_t mask = 0;
    for (const char *p = v;; p++) {
        char *end;
        long x = strtol(p, &end, 10);
        if (end == p || x < 0 || x > 63 || (*end && *end != ','))
            die("--offload-stages: expected virtual stage indices like 0,1, got \"%s\"", v);
        mask |= (uint64_t)1 << x;
        if (!*(p = end)) return mask;
    }
}

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

/* argv into a; dies on anything it does not know. */
static void parse_args(Args *a, int argc, char **argv) {
    static const struct { const char *flag, *key; } shorthands[] = {
        {"--lr", "lr"}, {"--min-lr", "min_lr"}, {"--warmup", "warmup"}, {"--steps", "steps"},
        {"--weight-decay", "weight_decay"}, {"--grad-clip", "grad_clip"},
    };
    opt_defaults(&a->o);
    a->print_every = 10;
    a->ignore_index = -1;
    if (argc < 2) { usage(stderr); exit(1); }
    a->cmd = argv[1];
    if (strcmp(a->cmd, "-h") == 0 || strcmp(a->cmd, "--help") == 0) { usage(stdout); exit(0); }
    if (!find_command(a->cmd)) {
        char names[256];
        die("unknown command \"%s\" (%s; see kiln --help)", a->cmd, command_names(names, sizeof names));
    }
    for (int i = 2; i < argc; i++) {
        const char *f = argv[i];
        int has = i + 1 < argc;
        int matched = 0;
        for (size_t s = 0; s < sizeof shorthands / sizeof *shorthands; s++)
            if (strcmp(f, shorthands[s].flag) == 0) {
                if (!has) die("%s needs a value", f);
                cmd_add_set(&a->o.sets, &a->o.nsets, shorthands[s].key, argv[++i]);
                matched = 1;
            }
        if (matched) continue;
        if (f[0] != '-') {
            if (a->model) die("unexpected argument \"%s\"", f);
            a->model = f;
        } else if (strcmp(f, "--interp") == 0) a->interp = 1;
        else if (strcmp(f, "--f64") == 0) a->f64 = 1;
        else if (strcmp(f, "--peak") == 0) a->peak = 1;
        else if (strcmp(f, "--max-seq") == 0) a->max_seq = 1;
        else if (strcmp(f, "--serial") == 0) a->serial = 1;
        else if (strcmp(f, "--no-overlap") == 0) a->o.no_overlap = 1;
        else if (strcmp(f, "--sp") == 0) a->o.sp = 1;    /* sequence parallel (the default with --tp > 1) */
        else if (strcmp(f, "--no-sp") == 0) a->o.sp = 2;
        else if (strcmp(f, "--test-drop-event") == 0) a->o.drop_event = 1;
        else if (strcmp(f, "-h") == 0 || strcmp(f, "--help") == 0) { usage(stdout); exit(0); }
        else if (!has) die("%s: unknown flag or missing value", f);
        else if (strcmp(f, "--set") == 0) {
            char *eq = strchr(argv[++i], '=');
            if (!eq || eq == argv[i]) die("--set: expected key=value, got \"%s\"", argv[i]);
            *eq = 0;
            cmd_add_set(&a->o.sets, &a->o.nsets, argv[i], eq + 1);
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
        else if (strcmp(f, "--timeline") == 0) a->timeline = argv[++i];
        else if (strcmp(f, "--device-profile") == 0) a->o.device_profile = argv[++i];
        else if (strcmp(f, "--threads") == 0) a->threads = argv[++i];
        else if (strcmp(f, "--seed") == 0) a->o.seed = (uint64_t)parse_int_flag(f, argv[++i]);
        else if (strcmp(f, "--print-every") == 0) a->print_every = parse_int_flag(f, argv[++i]);
        else if (strcmp(f, "--ignore-index") == 0) a->ignore_index = parse_int_flag(f, argv[++i]);
        else if (strcmp(f, "--dp") == 0) a->o.dp = parse_int_flag(f, argv[++i]);
        else if (strcmp(f, "--micro-batches") == 0) a->o.micro_batches = parse_int_flag(f, argv[++i]);
        else if (strcmp(f, "--zero") == 0) a->o.zero = parse_int_flag(f, argv[++i]);
        else if (strcmp(f, "--bucket-mb") == 0) a->o.bucket_mb = parse_double_flag(f, argv[++i]);
        else if (strcmp(f, "--frontend-timeout") == 0) a->o.frontend_timeout = parse_double_flag(f, argv[++i]);
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
            a->recompute_given = 1;
        } else if (strcmp(f, "--memory-budget") == 0) {
            a->o.memory_budget = parse_bytes_flag(f, argv[++i]);
        } else if (strcmp(f, "--activation-budget") == 0) {
            a->o.activation_budget = parse_bytes_flag(f, argv[++i]);
        } else if (strcmp(f, "--gemm-epilogue") == 0) {
            const char *v = argv[++i];
            static const char *const levels[] = {"none", "bias", "gelu", "bgrad", "all"};
            int l = 0;
            while (l < 5 && strcmp(v, levels[l])) l++;
            if (l == 5) die("--gemm-epilogue: expected bias, gelu, bgrad, all or none, got \"%s\"", v);
            a->o.gemm_epilogue = l;
        } else if (strcmp(f, "--xent-fused") == 0) {
            const char *v = argv[++i];
            if (strcmp(v, "on") && strcmp(v, "off")) die("--xent-fused: expected on or off, got \"%s\"", v);
            a->o.xent_fused = strcmp(v, "on") == 0;
        } else if (strcmp(f, "--schedule") == 0) {
            const char *v = argv[++i];
            if (strcmp(v, "fixed") && strcmp(v, "lhs")) die("--schedule: expected fixed or lhs, got \"%s\"", v);
            a->o.schedule = strcmp(v, "lhs") == 0 ? SCHED_LHS : SCHED_FIXED;
        } else if (strcmp(f, "--precision") == 0) {
            const char *v = argv[++i];
            if (strcmp(v, "f32") && strcmp(v, "bf16")) die("--precision: expected f32 or bf16, got \"%s\"", v);
            a->o.precision_bf16 = strcmp(v, "bf16") == 0;
        } else if (strcmp(f, "--pp") == 0) {
            a->o.pp = parse_int_flag(f, argv[++i]);
        } else if (strcmp(f, "--vpp") == 0) {
            a->o.vpp = parse_int_flag(f, argv[++i]);
        } else if (strcmp(f, "--pp-schedule") == 0) {
            const char *v = argv[++i];
            a->o.pp_schedule = strcmp(v, "all") == 0 ? PS_COUNT : pp_schedule_lookup(v); /* all: kiln plan's table */
            if (a->o.pp_schedule < 0) die("--pp-schedule: expected 1f1b, interleaved, zb-h1 or zb-v (plan: all), got \"%s\"", v);
        } else if (strcmp(f, "--pp-layers") == 0) {
            parse_pp_layers(&a->o, argv[++i]);
        } else if (strcmp(f, "--test-pp-bug") == 0) {
            const char *v = argv[++i];
            if (strcmp(v, "drop-tied") && strcmp(v, "swap-recv") && strcmp(v, "late-post"))
                die("--test-pp-bug: expected drop-tied, swap-recv or late-post, got \"%s\"", v);
            a->o.pp_bug = strcmp(v, "drop-tied") == 0 ? 1 : strcmp(v, "swap-recv") == 0 ? 2 : 3;
        } else if (strcmp(f, "--offload") == 0) {
            a->o.offload = parse_offload(argv[++i]);
        } else if (strcmp(f, "--offload-stages") == 0) {
            a->o.offload_stages = parse_offload_stages(argv[++i]);
        } else if (strcmp(f, "--memory") == 0) {
            a->memory_gib = parse_double_flag(f, argv[++i]);
            if (!(a->memory_gib > 0)) die("--memory: expected GiB of device memory per rank > 0, got \"%s\"", argv[i]);
        } else if (strcmp(f, "--offload-min-bytes") == 0) {
            a->o.offload_min_bytes = parse_bytes_flag(f, argv[++i]);
        } else if (strcmp(f, "--test-offload-bug") == 0) {
            if (strcmp(argv[++i], "early-read")) die("--test-offload-bug: expected early-read, got \"%s\"", argv[i]);
            a->o.offload_bug = 1;
        } else if (strcmp(f, "--compare-tp-cp") == 0) {
            a->compare_tp_cp = parse_int_flag(f, argv[++i]); /* kiln plan: tp N vs cp N (plan_tp.c) */
            if (a->compare_tp_cp < 2) die("--compare-tp-cp: expected a degree >= 2, got %d", a->compare_tp_cp);
        } else if (strcmp(f, "--tp") == 0) {
            a->o.tp = parse_int_flag(f, argv[++i]); /* tensor parallel (docs/parallel.md, issue 20) */
        } else if (strcmp(f, "--tp-chunks") == 0) {
            a->o.tp_chunks = parse_int_flag(f, argv[++i]); /* tp comm overlap by token chunks (tp_overlap.c, issue 22) */
            if (a->o.tp_chunks < 1) die("--tp-chunks: expected at least 1 (1: off), got %d", a->o.tp_chunks);
        } else if (strcmp(f, "--test-tp-bug") == 0) {
            const char *v = argv[++i];
            if (strcmp(v, "drop-bwd-reduce") && strcmp(v, "xent-max") && strcmp(v, "norm-grad") && strcmp(v, "chunk-order"))
                die("--test-tp-bug: expected drop-bwd-reduce, xent-max, norm-grad or chunk-order, got \"%s\"", v);
            a->o.tp_bug = !strcmp(v, "drop-bwd-reduce") ? 1 : !strcmp(v, "xent-max") ? 2 : !strcmp(v, "norm-grad") ? 3 : 4;

        } else die("%s: unknown flag", f);
    }
}

/* The --device-profile's contents, loaded by check_args. */
static Profile device_profile;

/* What the flags say together, and the values no one flag can judge. */
static void check_args(Args *a) {
    if (!a->model) die("%s: no model file given", a->cmd);
    cmd_check_input("MODEL", a->model);
    if (a->after) pipeline_check_after(a->after);
    if (a->o.recompute == RC_UNSET && strcmp(a->cmd, "plan") != 0) die("--recompute all: only for kiln plan (one policy per program)");
    if (a->target && strcmp(a->target, "cpu") != 0) {
        if (strncmp(a->target, "cuda:", 5) != 0 || !cuda_arch_ok(a->target + 5))
            die("--target: expected cpu or cuda:sm_XX (e.g. cuda:sm_90), got \"%s\"", a->target);
        if (strcmp(a->cmd, "compile") != 0) die("--target %s: only kiln compile builds for a GPU", a->target);
        a->cuda_arch = a->target + 5;
        a->o.precision_bf16 = 1; /* DESIGN §6: bf16 activations, f32 master weights */
    }
    if (a->attention && strcmp(a->attention, "kiln") && strcmp(a->attention, "cudnn") && strcmp(a->attention, "tc"))
        die("--attention: expected kiln, cudnn or tc, got \"%s\"", a->attention);
    if (a->attention && strcmp(a->attention, "tc") == 0 && !a->cuda_arch) die("--attention tc: only with --target cuda:sm_XX");
    if (a->attention && strcmp(a->attention, "cudnn") == 0 && !a->cuda_arch) die("--attention cudnn: only with --target cuda:sm_XX");
    if (a->o.xent_fused == 1 && !a->cuda_arch && (strcmp(a->cmd, "compile") == 0 || (strcmp(a->cmd, "run") == 0 && !a->interp)))
        die("--xent-fused on: the CPU target has no fused classifier (use --target cuda:sm_XX, or dump, check, plan or run --interp)");
    if (a->o.gemm_epilogue && !a->cuda_arch && (strcmp(a->cmd, "compile") == 0 || (strcmp(a->cmd, "run") == 0 && !a->interp)))
        die("--gemm-epilogue: the CPU target has no GEMM epilogues (use --target cuda:sm_XX, or dump, check, plan or run --interp)");
    if (a->o.xent_fused < 0) a->o.xent_fused = a->cuda_arch != NULL; /* default: on for the GPU */
    if (a->o.precision_bf16 && !a->cuda_arch && (strcmp(a->cmd, "compile") == 0 || (strcmp(a->cmd, "run") == 0 && !a->interp)))
        die("--precision bf16: the CPU target is f32 (use --target cuda:sm_XX, or bf16 with dump, check, plan or run --interp)");
    if (a->o.dp < 1) die("--dp: expected at least 1");
    if (a->o.cp < 1) die("--cp: expected at least 1");
    if (a->o.tp < 1) die("--tp: expected at least 1");
    if (a->o.tp_chunks > 1 && (a->o.tp == 1 || a->o.sp == 2))
        die("--tp-chunks %d: chunks the sequence-parallel collectives; it needs --tp > 1 with sequence parallelism (not --no-sp)", a->o.tp_chunks);
    if (a->o.sp == 1 && a->o.tp == 1) die("--sp: sequence parallelism splits over the tensor-parallel ranks; it needs --tp > 1");
    if (a->o.micro_batches < 1) die("--micro-batches: expected at least 1");
    if (a->o.pp < 1) die("--pp: expected at least 1");
    if (a->o.vpp < 0) die("--vpp: expected at least 1");
    if (a->o.pp_schedule == PS_COUNT && strcmp(a->cmd, "plan") != 0) die("--pp-schedule all: only for kiln plan (one schedule per program)");
    if (a->timeline && strcmp(a->cmd, "plan") != 0) die("--timeline: only for kiln plan");
    if ((a->o.pp_schedule == PS_COUNT || a->timeline) && a->o.pp < 2)
        die("%s: only with --pp 2 or more", a->timeline ? "--timeline" : "--pp-schedule all");
    if (a->timeline && a->o.pp_schedule == PS_COUNT) die("--timeline draws one schedule: not with --pp-schedule all");
    if (a->o.recompute == RC_UNSET && (a->o.pp_schedule == PS_COUNT || a->timeline))
        die("--recompute all: one table at a time (not with %s)", a->timeline ? "--timeline" : "--pp-schedule all");
    int vstages = 1; /* virtual stages per rank (--pp-schedule all: the most any row runs) */
    if (a->o.pp > 1) { /* the schedule's own rules (m >= p, m % p for interleaved, --vpp per schedule); all: per row */
        PpPlan pl;
        char err[256];
        if (a->o.pp_schedule != PS_COUNT &&
            ppsched_build(&pl, (PpSchedule)a->o.pp_schedule, a->o.pp, a->o.vpp, a->o.micro_batches, err, sizeof err) != 0)
            die("%s", err);
        vstages = a->o.pp_schedule == PS_COUNT ? (a->o.vpp > 2 ? a->o.vpp : 2) : pl.v;
        if (a->o.pp_schedule != PS_COUNT) ppsched_free(&pl);
    } else if (a->o.vpp > 1 || a->o.npp_layers) {
        die("%s: only with --pp 2 or more", a->o.vpp > 1 ? "--vpp" : "--pp-layers");
    }
    for (int s = vstages; s < 64; s++)
        if (a->o.offload_stages >> s & 1)
            die("--offload-stages: virtual stage %d is out of range (each rank runs %d: 0..%d)", s, vstages, vstages - 1);
    if (a->o.zero != 0 && a->o.zero != 1) die("--zero: expected 0 (all-reduce) or 1 (distributed optimizer), got %d", a->o.zero);
    if (a->format && strcmp(a->format, "text") && strcmp(a->format, "dot"))
        die("--format: expected text or dot, got \"%s\"", a->format);
    if (a->print_every < 1) a->print_every = 1;
    if (a->emit && strcmp(a->emit, "llvm") && strcmp(a->emit, "cuda") && strcmp(a->emit, "schedule"))
        die("--emit: expected llvm, cuda or schedule, got \"%s\"", a->emit);
    char err[1200];
    if (a->o.device_profile && profile_load(&device_profile, a->o.device_profile, err, sizeof err) != 0) die("--device-profile: %s", err);
}

int main(int argc, char **argv) {
    for (size_t i = 0; argc > 1 && i < sizeof own_flags / sizeof own_flags[0]; i++)
        if (strcmp(argv[1], own_flags[i].name) == 0) return own_flags[i].main(argc - 1, argv + 1);
    Args a = {0};
    parse_args(&a, argc, argv);
    check_args(&a);
    if (a.o.device_profile && strcmp(a.cmd, "plan") == 0) profile_describe(stdout, &device_profile);
    int rc = find_command(a.cmd)->run(&a);
    free(a.o.sets);
    free(a.o.pp_layers);
    return rc;
}
