/* profile.c — device profiles: reading them, and the formulas that turn a
 * profile into seconds for a GEMM, a host copy and a collective, and the
 * offload pass's `auto` fraction.
 *
 * The file.  One field a line, `key value`, `#` to the end of the line a
 * comment (the shipped files name each number's source there), blank lines
 * ignored.  Every field of the table below is required, exactly once (but
 * the optional ones at its end: per-algorithm collective α and β, a pair
 * together, and mem_bw_table, BYTES:BYTES_PER_S pairs like gemm_eff's); a
 * number must be all of its token, finite, and not negative (bandwidths,
 * peaks and memory not zero either: they divide).  gemm_eff is a table on
 * one line, SIZE:EFF pairs with M·N·K sizes strictly increasing and
 * efficiencies in (0, 1].  Any other line is an error naming FILE:LINE and
 * the field; a missing field names the file and the field.  The reader
 * stops at the first error: one line, as everywhere in kiln.
 *
 * Optional too, each alone: step_overhead_s, ew_transc_s, pool_wake_s, allreduce_table, allgather_table,
 * reducescatter_table, p2p_table, p2p_runtime_table, p2p_posted_table (BYTES:SECONDS pairs as mem_bw_table's:
 * a collective's measured time by size, the CPU runtime's p2p exchange's, profile.h), attn_bwd_eff, attn_score_s, attn_bwd_score_s,
 * attn_row_s, attn_bwd_row_s
 * and the per-kind bandwidths norm_bw, norm_bwd_bw, xent_bw, xent_bwd_bw,
 * copy_bw, copy_bw_table (RUN_BYTES:BYTES_PER_S pairs), sumto_bw, adamw_bw, sumsq_bw (profile.h: the CPU runtime's kernels one by one, as kiln
 * calibrate measures them; absent, the roofline's attn_eff and mem_bw).
 *
 * Optional too: cores, threads and thread_speedup (a CPU host's cores
 * shared by its ranks, the cores one rank runs on, its threads' speedup
 * over one: cost.c's processor sharing); threads and thread_speedup only
 * with cores, threads at most cores, thread_speedup in [1, threads].
 *
 * Finding a shipped profile by name: profile.h says where it looks.  A
 * fresh clone's build/kiln finds <repo>/profiles through the binary's own
 * path, as the CUDA kernels are found (nvrtc_compile.c), and the tests in
 * build/tests/ one folder further up; $KILN_PROFILES overrides both.
 *
 * The formulas (the cost model's first approximation, issue 21; kiln
 * calibrate measures the numbers they read):
 *   GEMM        2·M·N·K / (peak(dtype) · eff(M·N·K)) + launch overhead;
 *               eff interpolated linearly in log(M·N·K) between the table's
 *               points, the end points' values outside them.
 *   host copy   bytes / bandwidth of that direction (pinned memory; the
 *               copy engine's setup is within the measured bandwidth).
 *   collectives the ring algorithms (Patarasuk and Yuan 2009; NCCL's
 *               "bus bandwidth" factors in nccl-tests' PERFORMANCE.md):
 *               all-reduce moves 2(n−1)/n of the buffer through each link
 *               in 2(n−1) steps, all-gather and reduce-scatter (n−1)/n in
 *               n−1 steps, p2p the buffer once: steps·α + factor·bytes/β.
 *
 * The offload policy (issue 19): PipeOffload (Wan et al., arXiv
 * 2503.01328, §3) finds an offload free when the mean of its device→host
 * and host→device copy times fits in the compute between the forward that
 * saves an activation and the backward that reads it, the two copies
 * running on their own engines beside the compute.  The largest fraction α
 * of a stage's saved bytes that satisfies it is
 *     α = hide / (saved · (1/d2h_bw + 1/h2d_bw) / 2), clamped to [0, 1].
 * Kuaishou's system (the seeds' 002, and DESIGN.md §9.4) adds two rules,
 * kept here as predicates for the pass: tensors under 1 MiB stay (their
 * copies cost more in fixed overhead than they free), and the model's last
 * virtual stage stays (its backward follows its forward at once) — unless
 * it is the only one: without a pipeline the pass offloads across the
 * layers of one stage (issue 19), which is its own decision.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "profile.h"

typedef enum { F_NAME, F_POS, F_NONNEG, F_INT, F_TABLE } FieldKind;

static const struct {
    const char *key;
    FieldKind kind;
    size_t off;
} fields[] = {
    {"name", F_NAME, offsetof(Profile, name)},
    {"memory_bytes", F_POS, offsetof(Profile, memory_bytes)},
    {"peak_flops_f32", F_POS, offsetof(Profile, peak_flops_f32)},
    {"peak_flops_bf16", F_POS, offsetof(Profile, peak_flops_bf16)},
    {"gemm_eff", F_TABLE, 0},
    {"attn_eff", F_POS, offsetof(Profile, attn_eff)},
    {"mem_bw", F_POS, offsetof(Profile, mem_bw)},
    {"launch_overhead_s", F_NONNEG, offsetof(Profile, launch_s)},
    {"h2d_bw", F_POS, offsetof(Profile, h2d_bw)},
    {"d2h_bw", F_POS, offsetof(Profile, d2h_bw)},
    {"intra_alpha_s", F_NONNEG, offsetof(Profile, intra_alpha)},
    {"intra_beta", F_POS, offsetof(Profile, intra_beta)},
    {"inter_alpha_s", F_NONNEG, offsetof(Profile, inter_alpha)},
    {"inter_beta", F_POS, offsetof(Profile, inter_beta)},
    {"node_size", F_INT, offsetof(Profile, node_size)},
    /* optional (NREQUIRED below): per collective algorithm on the intra-node link, in pairs */
    {"allreduce_alpha_s", F_NONNEG, offsetof(Profile, coll_alpha[COLL_ALL_REDUCE])},
    {"allreduce_beta", F_POS, offsetof(Profile, coll_beta[COLL_ALL_REDUCE])},
    {"allgather_alpha_s", F_NONNEG, offsetof(Profile, coll_alpha[COLL_ALL_GATHER])},
    {"allgather_beta", F_POS, offsetof(Profile, coll_beta[COLL_ALL_GATHER])},
    {"reducescatter_alpha_s", F_NONNEG, offsetof(Profile, coll_alpha[COLL_REDUCE_SCATTER])},
    {"reducescatter_beta", F_POS, offsetof(Profile, coll_beta[COLL_REDUCE_SCATTER])},
    {"p2p_alpha_s", F_NONNEG, offsetof(Profile, coll_alpha[COLL_P2P])},
    {"p2p_beta", F_POS, offsetof(Profile, coll_beta[COLL_P2P])},
    {"mem_bw_table", F_TABLE, 1}, /* optional, alone (off 1: the bandwidth table) */
    /* optional: the cores the ranks of a node share (cost.c's processor sharing) */
    {"cores", F_INT, offsetof(Profile, cores)},
    {"threads", F_INT, offsetof(Profile, threads)},
    {"thread_speedup", F_POS, offsetof(Profile, thread_speedup)},
    {"host_memory_bytes", F_POS, offsetof(Profile, host_memory_bytes)}, /* optional, alone: host memory per device (offload's host space) */
    /* optional, each alone: per kernel kind (profile.h; kiln calibrate measures them on the CPU) */
    {"attn_bwd_eff", F_POS, offsetof(Profile, attn_bwd_eff)},
    {"step_overhead_s", F_NONNEG, offsetof(Profile, step_overhead_s)},
    {"ew_transc_s", F_NONNEG, offsetof(Profile, ew_transc_s)},
    {"pool_wake_s", F_NONNEG, offsetof(Profile, pool_wake_s)},
    {"attn_score_s", F_NONNEG, offsetof(Profile, attn_score_s)},
    {"attn_bwd_score_s", F_NONNEG, offsetof(Profile, attn_bwd_score_s)},
    {"attn_row_s", F_NONNEG, offsetof(Profile, attn_row_s)},
    {"attn_bwd_row_s", F_NONNEG, offsetof(Profile, attn_bwd_row_s)},
    {"norm_bw", F_POS, offsetof(Profile, kind_bw[PK_NORM])},
    {"norm_bwd_bw", F_POS, offsetof(Profile, kind_bw[PK_NORM_BWD])},
    {"xent_bw", F_POS, offsetof(Profile, kind_bw[PK_XENT])},
    {"xent_bwd_bw", F_POS, offsetof(Profile, kind_bw[PK_XENT_BWD])},
    {"copy_bw", F_POS, offsetof(Profile, kind_bw[PK_COPY])},
    {"copy_bw_table", F_TABLE, 6}, /* off 6: the copies' rate by run bytes */
    {"sumto_bw", F_POS, offsetof(Profile, kind_bw[PK_SUMTO])},
    {"adamw_bw", F_POS, offsetof(Profile, kind_bw[PK_ADAMW])},
    {"sumsq_bw", F_POS, offsetof(Profile, kind_bw[PK_SUMSQ])},
    /* optional, each alone: per collective algorithm, seconds by bytes (F_TABLE, off 2 + CollKind) */
    {"allreduce_table", F_TABLE, 2 + COLL_ALL_REDUCE},
    {"allgather_table", F_TABLE, 2 + COLL_ALL_GATHER},
    {"reducescatter_table", F_TABLE, 2 + COLL_REDUCE_SCATTER},
    {"p2p_table", F_TABLE, 2 + COLL_P2P},
    /* optional, each alone: the CPU runtime's own exchange, seconds by bytes (off 7, 8: COLL_P2P_RUNTIME, COLL_P2P_POSTED) */
    {"p2p_runtime_table", F_TABLE, 7},
    {"p2p_posted_table", F_TABLE, 8},
};
const char *const profile_kind_fields[PK_NKIND] = {"norm_bw", "norm_bwd_bw", "xent_bw", "xent_bwd_bw", "copy_bw", "sumto_bw", "adamw_bw", "sumsq_bw"};
enum { NFIELDS = sizeof fields / sizeof fields[0], NREQUIRED = 15, NPAIRED = 23, F_CORES = 24, F_THREADS = 25, F_SPEEDUP = 26 };

static int fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t errlen, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

/* ---- finding a shipped profile ---- */

static int is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* The folder of the running binary, "" when /proc/self/exe cannot be read. */
static void exe_dir(char *buf, size_t n) {
    ssize_t k = readlink("/proc/self/exe", buf, n - 1);
    buf[k > 0 ? k : 0] = 0;
    char *slash = strrchr(buf, '/');
    if (slash) *slash = 0;
}

static const char *const aliases[][2] = {{"h100", "h100-sxm"}, {"h200", "h200-sxm"}, {"a100", "a100-80g"}};

/* NAME's file into out (profile.h lists the folders); -1 with err when none has it. */
static int find_named(const char *name, char *out, size_t n, char *err, size_t errlen) {
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
        if (strcmp(name, aliases[i][0]) == 0) name = aliases[i][1];
    char exe[4096];
    exe_dir(exe, sizeof exe);
    const char *env = getenv("KILN_PROFILES");
    const char *dirs[4] = {env && *env ? env : NULL, NULL, NULL, "profiles"};
    char up1[4200], up2[4200];
    if (*exe) {
        snprintf(up1, sizeof up1, "%s/../profiles", exe);
        snprintf(up2, sizeof up2, "%s/../../profiles", exe);
        dirs[1] = up1;
        dirs[2] = up2;
    }
    for (int i = 0; i < 4; i++) {
        if (!dirs[i]) continue;
        int k = snprintf(out, n, "%s/%s.profile", dirs[i], name);
        if (k > 0 && (size_t)k < n && is_file(out)) return 0;
    }
    return fail(err, errlen, "no device profile named \"%s\" (shipped: cpu, h100-sxm, h200-sxm, a100-80g; or give a path)", name);
}

/* ---- parsing ---- */

static int parse_number(const char *s, double *x) {
    char *end;
    errno = 0;
    *x = strtod(s, &end);
    return end != s && *end == 0 && errno == 0 && isfinite(*x);
}

/* "SIZE:V SIZE:V ...", sizes increasing, values positive and at most max,
 * into size[], val[], *n. */
static int parse_pairs(char *v, double max, double *size_out, double *val_out, int *n) {
    *n = 0;
    for (char *tok = strtok(v, " \t"); tok; tok = strtok(NULL, " \t")) {
        char *colon = strchr(tok, ':');
        if (!colon || *n == PROFILE_MAX_EFF) return 0;
        *colon = 0;
        double size, val;
        if (!parse_number(tok, &size) || !parse_number(colon + 1, &val)) return 0;
        if (!(size > 0) || !(val > 0) || val > max) return 0;
        if (*n && size <= size_out[*n - 1]) return 0;
        size_out[*n] = size;
        val_out[(*n)++] = val;
    }
    return *n > 0;
}

/* One field's value into p; -1 with err naming file:line and the field. */
static int set_field(Profile *p, int f, char *v, const char *file, int line, char *err, size_t errlen) {
    const char *key = fields[f].key;
    if (!*v) return fail(err, errlen, "%s:%d: field \"%s\" has no value", file, line, key);
    if (fields[f].kind == F_NAME) {
        if (strlen(v) >= sizeof p->name || strpbrk(v, " \t"))
            return fail(err, errlen, "%s:%d: field \"name\": expected one word under %zu characters, got \"%s\"", file, line, sizeof p->name, v);
        strcpy(p->name, v);
        return 0;
    }
    if (fields[f].kind == F_TABLE) {
        char copy[1024];
        snprintf(copy, sizeof copy, "%s", v);
        int bw = fields[f].off == 1 || fields[f].off == 6, coll = fields[f].off >= 2 && fields[f].off < 6 ? (int)fields[f].off - 2
                                                                                        : fields[f].off == 7 ? COLL_P2P_RUNTIME
                                                                                        : fields[f].off == 8 ? COLL_P2P_POSTED : -1;
        if (fields[f].off == 6 && !parse_pairs(copy, INFINITY, p->copy_run, p->copy_bw, &p->ncopy))
            return fail(err, errlen, "%s:%d: field \"%s\": expected up to %d RUN_BYTES:BYTES_PER_S pairs, sizes positive and increasing, rates positive, got \"%s\"",
                        file, line, key, PROFILE_MAX_EFF, v);
        if (fields[f].off == 6) return 0;
        if (coll >= 0) {
            if (!parse_pairs(copy, INFINITY, p->coll_size[coll], p->coll_t[coll], &p->ncoll[coll]))
                return fail(err, errlen, "%s:%d: field \"%s\": expected up to %d BYTES:SECONDS pairs, sizes positive and increasing, times positive, got \"%s\"",
                            file, line, key, PROFILE_MAX_EFF, v);
            return 0;
        }
        if (bw ? !parse_pairs(copy, INFINITY, p->bw_size, p->bw, &p->nbw) : !parse_pairs(copy, 1, p->eff_size, p->eff, &p->neff))
            return fail(err, errlen, bw ? "%s:%d: field \"%s\": expected up to %d BYTES:BYTES_PER_S pairs, sizes positive and increasing, rates positive, got \"%s\""
                                        : "%s:%d: field \"%s\": expected up to %d SIZE:EFF pairs, sizes positive and increasing, efficiencies in (0, 1], got \"%s\"",
                        file, line, key, PROFILE_MAX_EFF, v);
        return 0;
    }
    double x;
    if (!parse_number(v, &x)) return fail(err, errlen, "%s:%d: field \"%s\": expected a number, got \"%s\"", file, line, key, v);
    if (x < 0) return fail(err, errlen, "%s:%d: field \"%s\" is negative (%s)", file, line, key, v);
    if (fields[f].kind == F_INT) {
        if (x < 1 || x > 1e6 || x != floor(x)) return fail(err, errlen, "%s:%d: field \"%s\": expected a whole number of at least 1, got \"%s\"", file, line, key, v);
        *(int *)((char *)p + fields[f].off) = (int)x;
        return 0;
    }
    if (fields[f].kind == F_POS && x == 0) return fail(err, errlen, "%s:%d: field \"%s\" must be positive, got \"%s\"", file, line, key, v);
    if ((strcmp(key, "attn_eff") == 0 || strcmp(key, "attn_bwd_eff") == 0) && x > 1)
        return fail(err, errlen, "%s:%d: field \"%s\": expected a fraction in (0, 1], got \"%s\"", file, line, key, v);
    *(double *)((char *)p + fields[f].off) = x;
    return 0;
}

static char *trim(char *s) {
    while (isspace((unsigned char)*s)) s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1])) *--e = 0;
    return s;
}

/* One line (comment and blanks already gone): "key value". */
static int parse_line(Profile *p, char *s, int *seen, const char *file, int line, char *err, size_t errlen) {
    char *v = s;
    while (*v && !isspace((unsigned char)*v)) v++;
    if (*v) *v++ = 0;
    v = trim(v);
    for (int f = 0; f < NFIELDS; f++) {
        if (strcmp(s, fields[f].key) != 0) continue;
        if (seen[f]) return fail(err, errlen, "%s:%d: field \"%s\" given twice (first on line %d)", file, line, s, seen[f]);
        seen[f] = line;
        return set_field(p, f, v, file, line, err, errlen);
    }
    return fail(err, errlen, "%s:%d: unknown field \"%s\"", file, line, s);
}

static int parse_file(Profile *p, FILE *f, const char *file, char *err, size_t errlen) {
    int seen[NFIELDS] = {0};
    char buf[2048];
    for (int line = 1; fgets(buf, sizeof buf, f); line++) {
        size_t len = strlen(buf);
        if (len == sizeof buf - 1 && buf[len - 1] != '\n') return fail(err, errlen, "%s:%d: line longer than %zu characters", file, line, sizeof buf - 2);
        char *hash = strchr(buf, '#');
        if (hash) *hash = 0;
        char *s = trim(buf);
        if (*s && parse_line(p, s, seen, file, line, err, errlen) != 0) return -1;
    }
    for (int k = 0; k < NREQUIRED; k++)
        if (!seen[k]) return fail(err, errlen, "%s: missing field \"%s\"", file, fields[k].key);
    for (int k = NREQUIRED; k < NPAIRED; k += 2) /* the optional pairs: α and β together */
        if (!seen[k] != !seen[k + 1])
            return fail(err, errlen, "%s:%d: field \"%s\" without \"%s\"", file, seen[k] ? seen[k] : seen[k + 1], fields[seen[k] ? k : k + 1].key,
                        fields[seen[k] ? k + 1 : k].key);
    if (seen[F_THREADS] && !seen[F_CORES]) return fail(err, errlen, "%s:%d: field \"threads\" without \"cores\"", file, seen[F_THREADS]);
    if (seen[F_CORES] && !seen[F_THREADS]) p->threads = p->cores;
    if (p->threads > p->cores)
        return fail(err, errlen, "%s:%d: field \"threads\" (%d) is more than \"cores\" (%d)", file, seen[F_THREADS], p->threads, p->cores);
    if (seen[F_SPEEDUP] && !seen[F_CORES]) return fail(err, errlen, "%s:%d: field \"thread_speedup\" without \"cores\"", file, seen[F_SPEEDUP]);
    if (seen[F_SPEEDUP] && (p->thread_speedup < 1 || p->thread_speedup > p->threads))
        return fail(err, errlen, "%s:%d: field \"thread_speedup\": expected 1 .. threads (%d), got %g", file, seen[F_SPEEDUP], p->threads, p->thread_speedup);
    if (!seen[F_SPEEDUP]) p->thread_speedup = p->threads;
    return 0;
}

int profile_load(Profile *p, const char *path_or_name, char *err, size_t errlen) {
    memset(p, 0, sizeof *p);
    size_t n = strlen(path_or_name);
    int is_path = strchr(path_or_name, '/') || (n > 8 && strcmp(path_or_name + n - 8, ".profile") == 0);
    if (!*path_or_name) return fail(err, errlen, "device profile: empty name");
    if (is_path) snprintf(p->path, sizeof p->path, "%s", path_or_name);
    else if (find_named(path_or_name, p->path, sizeof p->path, err, errlen) != 0) return -1;
    FILE *f = is_file(p->path) ? fopen(p->path, "r") : NULL;
    if (!f) return fail(err, errlen, "%s: cannot open the device profile", p->path);
    int rc = parse_file(p, f, p->path, err, errlen);
    fclose(f);
    return rc;
}

FILE *profile_create(const char *path, char *tmp, size_t tmplen, char when[64], char host[256], char *err, size_t errlen) {
    snprintf(tmp, tmplen, "%s.tmp%d", path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) {
        fail(err, errlen, "-o: cannot open %s: %s", tmp, strerror(errno));
        return NULL;
    }
    time_t now = time(NULL);
    strftime(when, 64, "%Y-%m-%d %H:%M UTC", gmtime(&now));
    if (gethostname(host, 255) != 0) strcpy(host, "?");
    host[255] = 0;
    return f;
}

int profile_commit(const char *tmp, const char *path, char *err, size_t errlen) {
    Profile back;
    char why[1200];
    if (profile_load(&back, tmp, why, sizeof why) != 0) {
        unlink(tmp);
        return fail(err, errlen, "the profile written does not read back: %s", why);
    }
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return fail(err, errlen, "-o: cannot rename %s to %s: %s", tmp, path, strerror(e));
    }
    return 0;
}

void profile_describe(FILE *f, const Profile *p) {
    fprintf(f, "device %s (%s): %.4g GB (%.1f GiB), %.4g TFLOP/s bf16, %.4g TFLOP/s f32, memory %.4g GB/s, "
               "h2d %.4g GB/s, d2h %.4g GB/s, intra %.4g GB/s + %.3g us, inter %.4g GB/s + %.3g us, %d per node\n",
            p->name, p->path, p->memory_bytes / 1e9, p->memory_bytes / (1024.0 * 1024 * 1024), p->peak_flops_bf16 / 1e12,
            p->peak_flops_f32 / 1e12, p->mem_bw / 1e9, p->h2d_bw / 1e9, p->d2h_bw / 1e9, p->intra_beta / 1e9, p->intra_alpha * 1e6,
            p->inter_beta / 1e9, p->inter_alpha * 1e6, p->node_size);
}

/* ---- the formulas ---- */

double profile_gemm_eff(const Profile *p, double mnk) {
    if (mnk <= p->eff_size[0]) return p->eff[0];
    for (int i = 1; i < p->neff; i++) {
        if (mnk > p->eff_size[i]) continue;
        double t = log(mnk / p->eff_size[i - 1]) / log(p->eff_size[i] / p->eff_size[i - 1]);
        return p->eff[i - 1] + t * (p->eff[i] - p->eff[i - 1]);
    }
    return p->eff[p->neff - 1];
}

double profile_mem_bw(const Profile *p, double bytes) {
    if (p->nbw == 0) return p->mem_bw;
    if (bytes <= p->bw_size[0]) return p->bw[0];
    for (int i = 1; i < p->nbw; i++) {
        if (bytes > p->bw_size[i]) continue;
        double t = log(bytes / p->bw_size[i - 1]) / log(p->bw_size[i] / p->bw_size[i - 1]);
        return p->bw[i - 1] + t * (p->bw[i] - p->bw[i - 1]);
    }
    return p->bw[p->nbw - 1];
}

double profile_copy_bw(const Profile *p, double run) {
    if (p->ncopy == 0) return p->kind_bw[PK_COPY];
    if (run <= p->copy_run[0]) return p->copy_bw[0];
    for (int i = 1; i < p->ncopy; i++) {
        if (run > p->copy_run[i]) continue;
        double t = log(run / p->copy_run[i - 1]) / log(p->copy_run[i] / p->copy_run[i - 1]);
        return p->copy_bw[i - 1] + t * (p->copy_bw[i] - p->copy_bw[i - 1]);
    }
    return p->copy_bw[p->ncopy - 1];
}

double profile_gemm_seconds(const Profile *p, DType dt, double m, double n, double k) {
    double peak = dt == DT_BF16 ? p->peak_flops_bf16 : p->peak_flops_f32;
    double mnk = m * n * k;
    return 2 * mnk / (peak * profile_gemm_eff(p, mnk)) + p->launch_s;
}

double profile_copy_seconds(const Profile *p, double bytes, int d2h) {
    return bytes / (d2h ? p->d2h_bw : p->h2d_bw);
}

/* A measured table's seconds at bytes (profile.h). */
static double coll_table(const Profile *p, CollKind k, double bytes) {
    const double *x = p->coll_size[k], *t = p->coll_t[k];
    int n = p->ncoll[k];
    if (bytes <= x[0]) return t[0];
    for (int i = 1; i < n; i++) {
        if (bytes > x[i]) continue;
        double f = log(bytes / x[i - 1]) / log(x[i] / x[i - 1]);
        return exp(log(t[i - 1]) + f * (log(t[i]) - log(t[i - 1])));
    }
    return t[n - 1] * bytes / x[n - 1];
}

double profile_coll_seconds(const Profile *p, CollKind kind, double bytes, int ranks, int intra) {
    if (ranks <= 1) return 0;
    if (kind >= COLL_P2P_RUNTIME) { /* the runtime's exchange: its table on one node, else a plain p2p */
        if (intra && p->ncoll[kind] > 0) return coll_table(p, kind, bytes);
        kind = COLL_P2P;
    }
    if (intra && p->ncoll[kind] > 0) { /* measured over node_size ranks: other group sizes by the ring's factor */
        double n = ranks, m = p->node_size > 1 ? p->node_size : 2;
        double f = kind == COLL_P2P ? 1 : (n - 1) / n / ((m - 1) / m);
        return coll_table(p, kind, bytes) * f;
    }
    double alpha = intra ? p->intra_alpha : p->inter_alpha, beta = intra ? p->intra_beta : p->inter_beta;
    if (intra && p->coll_beta[kind] > 0) alpha = p->coll_alpha[kind], beta = p->coll_beta[kind];
    double n = ranks;
    switch (kind) {
    case COLL_ALL_REDUCE: return 2 * (n - 1) * alpha + 2 * (n - 1) / n * bytes / beta;
    case COLL_ALL_GATHER:
    case COLL_REDUCE_SCATTER: return (n - 1) * alpha + (n - 1) / n * bytes / beta;
    case COLL_P2P: return alpha + bytes / beta;
    case COLL_P2P_RUNTIME:
    case COLL_P2P_POSTED: break; /* mapped to COLL_P2P above */
    }
    return 0;
}

/* ---- the offload policy ---- */

double offload_auto_fraction(const Profile *p, double saved_bytes, double hide_seconds) {
    if (isnan(saved_bytes) || isnan(hide_seconds)) return 0;
    if (saved_bytes <= 0) return 1;
    if (hide_seconds <= 0) return 0;
    double full = saved_bytes * (1 / p->d2h_bw + 1 / p->h2d_bw) / 2; /* mean copy time of all of it */
    double a = hide_seconds / full;
    return a >= 1 ? 1 : a;
}
