/* mpi_comm.c — the multi-rank runtime (runtime/comm_mpi.c and the CPU's
 * collective kernels in runtime/cpu/coll_mpi.c, the sharded
 * checkpoints of runtime/io/checkpoint.c, the trainer's ranks) on hand-built
 * programs, no compiler involved.  tests/t_mpi.sh runs it under mpirun;
 * it is not a test_* program because it needs mpirun and arguments.
 *
 *   mpi_comm plain           a one-rank program in a plain process: MPI is
 *                            never initialised, collectives are copies; a
 *                            dtype other than f32 (allgather: f32, i32)
 *                            fails the step naming kernel and dtype
 *   mpi_comm coll DP CP      (mpirun -np DP*CP) allreduce, reducescatter,
 *                            allgather (also in place, piecewise and
 *                            strided: chunks of a middle dim) and shard over
 *                            dp, cp and dp+cp, rank iotas (dual and
 *                            contiguous), rank ids and group indices,
 *                            rt_comm_bytes, the host calls
 *   mpi_comm ckpt DIR        (mpirun -np 4) a sharded save at dp 4 stores
 *                            the logical tensors of a --zero 0 program, byte
 *                            for byte; loading it at dp 2 (and over dp+cp)
 *                            gives every rank its shard
 *   mpi_comm pckpt DP DIR    (mpirun -np DP, or plain for 1) params without
 *                            storage in a param shard (prefix ""): its init
 *                            is the chunk of the stored params' init; its
 *                            checkpoint is the stored-params program's file
 *                            byte for byte; it loads the files of earlier
 *                            runs at other dp in DIR, --init both ways
 *   mpi_comm die             (mpirun -np 4) rank 1 SIGKILLs itself in step 3
 *   mpi_comm p2p CP          (mpirun -np CP, or plain for 1) rtk_send /
 *                            rtk_recv around the cp ring, both ways, to
 *                            this rank itself, and an 8 MiB message (past
 *                            any eager limit: every rank sends before it
 *                            receives, so a blocking send would deadlock);
 *                            x is overwritten right after its send (the
 *                            send must have staged it); the 8 MiB and the
 *                            self receive are posted before the sends
 *                            (rtk_recv_start) and completed last
 *                            (rtk_recv_done); rt_comm_bytes counts the
 *                            bytes sent to other ranks
 *   mpi_comm train DP GB -- TRAINER FLAGS
 *                            rt_train_main on a tiny model with a global
 *                            batch of GB rows over DP data-parallel ranks
 *   mpi_comm train-ps DP GB -- ...  the same with the params in a param shard
 *   mpi_comm train-cp DP CP LAYOUT GB -- ...  the same over dp x cp ranks,
 *                            the sequence split in LAYOUT (dual|contiguous,
 *                            or mismatch: the table and the positions disagree)
 *
 * The checks compare with values computed here from the rank ids alone
 * (small integers, exact in f32).  Each check prints "PASS name" or
 * "FAIL name" on world rank 0, after the outcome of every rank has been
 * gathered; t_mpi.sh turns them into TAP.
 */
#include <math.h>
#include <mpi.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "checkpoint.h"
#include "kiln_rt.h"
#include "safetensors.h"
#include "trainer.h"

#define ALL (RT_AXIS_PP | RT_AXIS_DP | RT_AXIS_CP | RT_AXIS_TP)

static void die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "mpi_comm: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(2);
}

/* ---- checks, agreed over the ranks ---- */

enum { MAXCHECKS = 64 };
static struct {
    int n;
    const char *name[MAXCHECKS];
    char ok[MAXCHECKS];
} C;

static void check(int ok, const char *name) {
    if (C.n == MAXCHECKS) die("too many checks");
    C.name[C.n] = name;
    C.ok[C.n++] = (char)(ok != 0);
}

/* Rank 0 prints each check, passed when it passed on every rank. */
static int report(rt_ctx *ctx) {
    int world = rt_world_size(ctx), failed = 0;
    char *all = malloc((size_t)world * MAXCHECKS), err[512];
    if (!all) die("out of memory");
    if (rt_host_allgather(ctx, ALL, C.ok, all, MAXCHECKS, err, sizeof err)) die("report: %s", err);
    for (int i = 0; i < C.n; i++) {
        int ok = 1;
        for (int r = 0; r < world; r++) ok &= all[r * MAXCHECKS + i];
        if (rt_world_rank(ctx) == 0) printf("%s %s\n", ok ? "PASS" : "FAIL", C.name[i]);
        failed += !ok;
    }
    fflush(stdout);
    free(all);
    C.n = 0;
    return failed;
}

static rt_ctx *new_ctx(const rt_program *p) {
    rt_options o = {.threads = 1};
    rt_ctx *c = rt_new(p, &o);
    if (!c) die("rt_new failed");
    return c;
}

static void step_or_die(rt_ctx *c) {
    char err[512];
    if (rt_step(c, err, sizeof err)) die("rank %d: step: %s", rt_world_rank(c), err);
}

#define LAUNCH(c, s, k, name, ...) \
    rt_launch(c, s, k, (const int64_t[]){__VA_ARGS__}, (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), name)

/* args: dst, src, bytes */
static void k_copy(rt_ctx *c, const int64_t *a) { memcpy(rt_arg_ptr(a[0]), rt_arg_ptr(a[1]), (size_t)a[2]); }

/* ---- plain: one rank, no MPI ---- */

static void step_nothing(rt_ctx *c, char *const *sp) { (void)c, (void)sp; }

/* The dtype arg of the collectives: the CPU sums f32 only and its allgather
 * moves 4-byte types; anything else fails the step naming kernel and dtype.
 * The launch of case k (the last one passes). */
static const struct {
    const char *want; /* in rt_step's message; NULL: the step passes */
} bad_dtypes[] = {{"allreduce: dtype bf16"}, {"reducescatter: dtype i32"}, {"allgather: dtype bf16"}, {"allreduce: dtype code 42"},
                  {NULL}};
static int bad_case;

static void step_bad_dtype(rt_ctx *c, char *const *sp) {
    float *f = (float *)sp[RT_SPACE_ACT];
    int64_t x = rt_ptr_arg(f), y = rt_ptr_arg(f + 8);
    switch (bad_case) {
    case 0: LAUNCH(c, 1, rtk_allreduce, "allreduce", x, y, 8, RT_AXIS_DP, RT_BF16); break;
    case 1: LAUNCH(c, 1, rtk_reducescatter, "reducescatter", x, y, 1, 8, 1, RT_AXIS_DP, RT_I32); break;
    case 2: LAUNCH(c, 1, rtk_allgather, "allgather", x, y, 1, 8, 1, RT_AXIS_DP, RT_BF16); break;
    case 3: LAUNCH(c, 1, rtk_allreduce, "allreduce", x, y, 8, RT_AXIS_DP, 42); break;
    default: LAUNCH(c, 1, rtk_allgather, "allgather", x, y, 1, 8, 1, RT_AXIS_DP, RT_I32); break;
    }
}

static void check_dtypes(void) {
    rt_program p = {.abi_version = RT_ABI_VERSION, .model = "dtypes", .space_bytes = {0, 0, 0, 4096}, .nstreams = 2, .step = step_bad_dtype};
    int ok = 1;
    for (bad_case = 0; bad_case < (int)(sizeof bad_dtypes / sizeof *bad_dtypes); bad_case++) {
        rt_ctx *c = new_ctx(&p);
        int32_t *v = (int32_t *)rt_space(c, RT_SPACE_ACT);
        for (int i = 0; i < 16; i++) v[i] = i < 8 ? 7 * i + 1 : -1;
        char err[512] = "";
        int rc = rt_step(c, err, sizeof err);
        if (bad_dtypes[bad_case].want) ok &= rc != 0 && strstr(err, bad_dtypes[bad_case].want) != NULL;
        else
            for (int i = 0; i < 8; i++) ok &= rc == 0 && v[8 + i] == 7 * i + 1;
        if (!ok) fprintf(stderr, "mpi_comm: dtype case %d: rc %d, \"%s\"\n", bad_case, rc, err);
        rt_free(c);
    }
    check(ok, "one rank: allreduce bf16, reducescatter i32, allgather bf16, dtype 42 fail the step naming kernel and dtype; allgather i32 copies");
}

static int run_plain(void) {
    rt_program p = {.abi_version = RT_ABI_VERSION, .model = "plain", .space_bytes = {0, 0, 0, 4096}, .nstreams = 2, .step = step_nothing};
    rt_ctx *c = new_ctx(&p);
    float *x = (float *)rt_space(c, RT_SPACE_ACT), *y = x + 64;
    for (int i = 0; i < 8; i++) x[i] = (float)i + 1;
    rtk_allreduce(c, (const int64_t[]){rt_ptr_arg(x), rt_ptr_arg(y), 8, RT_AXIS_DP, RT_F32});
    int ok = 1;
    for (int i = 0; i < 8; i++) ok &= y[i] == (float)i + 1;
    memset(y, 0, 32);
    rtk_reducescatter(c, (const int64_t[]){rt_ptr_arg(x), rt_ptr_arg(y), 2, 2, 2, RT_AXIS_DP | RT_AXIS_CP, RT_F32});
    for (int i = 0; i < 8; i++) ok &= y[i] == (float)i + 1;
    memset(y, 0, 32);
    rtk_allgather(c, (const int64_t[]){rt_ptr_arg(x), rt_ptr_arg(y), 2, 4, 1, ALL, RT_F32});
    for (int i = 0; i < 8; i++) ok &= y[i] == (float)i + 1;
    check(ok, "one rank: allreduce, reducescatter and allgather are copies");
    int inited = 1;
    check(MPI_Initialized(&inited) == MPI_SUCCESS && !inited, "one rank in a plain process: MPI is not initialised");
    check(rt_world_rank(c) == 0 && rt_world_size(c) == 1 && rt_group_size(c, RT_AXIS_DP) == 1 && rt_group_rank(c, ALL) == 0,
          "one rank: rank 0 of 1, groups of one");
    check(rt_comm_bytes(c) == 0, "one rank: rt_comm_bytes is 0");
    check_dtypes();
    int failed = report(c);
    rt_free(c);
    return failed != 0;
}

/* ---- coll: the collectives on a dp x cp mesh ---- */

enum { N = 5, MAXG = 8, SH_OUTER = 2, SH_LEN = 3, SH_INNER = 3 };
/* strided reducescatter / allgather [SO, *, SI] (chunks of SN along the
 * middle dim interleave); rank iotas of IN positions */
enum { SO = 3, SN = 2, SI = 2, IN = 4 };

/* The act space, in floats. */
enum {
    X_AR = 0,                     /* allreduce input [N] */
    Y_AR = X_AR + N,              /* allreduce output [N] */
    IP_AR = Y_AR + N,             /* in-place allreduce [N] */
    X_RS = IP_AR + N,             /* reducescatter input [MAXG*N] */
    Y_RS = X_RS + MAXG * N,       /* reducescatter output [N] */
    OWN_RS = Y_RS + N,            /* reducescatter into its own chunk [MAXG*N] */
    X_AG = OWN_RS + MAXG * N,     /* allgather input [N] */
    Y_AG = X_AG + N,              /* allgather output [MAXG*N] */
    IP_AG = Y_AG + MAXG * N,      /* in-place allgather [MAXG*N] */
    X_SH = IP_AG + MAXG * N,      /* shard input [outer, MAXG*len, inner] */
    Y_SH = X_SH + SH_OUTER * MAXG * SH_LEN * SH_INNER,
    X_SRS = Y_SH + SH_OUTER * SH_LEN * SH_INNER, /* strided reducescatter input [SO, MAXG*SN, SI] */
    Y_SRS = X_SRS + SO * MAXG * SN * SI,          /* its output [SO, SN, SI] */
    X_SAG = Y_SRS + SO * SN * SI,                 /* strided allgather input [SO, SN, SI] */
    Y_SAG = X_SAG + SO * SN * SI,                 /* its output [SO, MAXG*SN, SI] */
    I_DUAL = Y_SAG + SO * MAXG * SN * SI,         /* rank iota, dual layout: i32 [IN] */
    I_CONT = I_DUAL + IN,                         /* rank iota, contiguous: i32 [IN] */
    I_ALL = I_CONT + IN,                          /* the dual iotas all-gathered (i32: moved as bits) [MAXG*IN] */
    OUT = I_ALL + MAXG * IN, /* stream 0's copy of everything above */
    NFLOATS = 2 * OUT
};

typedef struct {
    int mask;    /* the group under test */
    int rank;    /* world rank */
    int size, index;
    int kill_at; /* die: the step at which rank 1 kills itself (0: never) */
    int64_t step;
} CollState;
static CollState G;

/* args: act base.  Rank-dependent inputs (rank r, group of size s). */
static void k_fill(rt_ctx *c, const int64_t *a) {
    float *f = RT_F32P(a[0]);
    int r = G.rank, s = G.size;
    if (G.kill_at && ++G.step == G.kill_at && r == 1) raise(SIGKILL);
    for (int i = 0; i < N; i++) f[X_AR + i] = f[IP_AR + i] = (float)((r + 1) * (i + 1));
    for (int k = 0; k < s * N; k++) f[X_RS + k] = f[OWN_RS + k] = (float)((r + 1) * (k + 1));
    for (int i = 0; i < N; i++) f[X_AG + i] = f[IP_AG + G.index * N + i] = (float)(100 * r + i);
    for (int k = 0; k < SH_OUTER * s * SH_LEN * SH_INNER; k++) f[X_SH + k] = (float)k;
    for (int k = 0; k < SO * s * SN * SI; k++) f[X_SRS + k] = (float)((r + 1) * (k + 1));
    for (int k = 0; k < SO * SN * SI; k++) f[X_SAG + k] = (float)(1000 * r + k);
}

static void step_coll(rt_ctx *c, char *const *sp) {
    float *f = (float *)sp[RT_SPACE_ACT];
    int m = G.mask, s = G.size, i = G.index;
    LAUNCH(c, 0, k_fill, "fill", rt_ptr_arg(f));
    rt_record(c, 0, 0);
    rt_wait(c, 1, 0);
    LAUNCH(c, 1, rtk_allreduce, "allreduce", rt_ptr_arg(f + X_AR), rt_ptr_arg(f + Y_AR), N, m, RT_F32);
    LAUNCH(c, 1, rtk_allreduce, "allreduce in place", rt_ptr_arg(f + IP_AR), rt_ptr_arg(f + IP_AR), N, m, RT_F32);
    LAUNCH(c, 1, rtk_reducescatter, "reducescatter", rt_ptr_arg(f + X_RS), rt_ptr_arg(f + Y_RS), 1, N, 1, m, RT_F32);
    LAUNCH(c, 1, rtk_reducescatter, "reducescatter into own chunk", rt_ptr_arg(f + OWN_RS), rt_ptr_arg(f + OWN_RS + i * N), 1, N, 1, m,
           RT_F32);
    LAUNCH(c, 1, rtk_allgather, "allgather", rt_ptr_arg(f + X_AG), rt_ptr_arg(f + Y_AG), 1, N, 1, m, RT_F32);
    LAUNCH(c, 1, rtk_allgather, "allgather in place", rt_ptr_arg(f + IP_AG + i * N), rt_ptr_arg(f + IP_AG), 1, N, 1, m, RT_F32);
    LAUNCH(c, 1, rtk_reducescatter, "strided reducescatter", rt_ptr_arg(f + X_SRS), rt_ptr_arg(f + Y_SRS), SO, SN, SI, m, RT_F32);
    LAUNCH(c, 1, rtk_allgather, "strided allgather", rt_ptr_arg(f + X_SAG), rt_ptr_arg(f + Y_SAG), SO, SN, SI, m, RT_F32);
    LAUNCH(c, 1, rtk_iota_rank, "iota dual", rt_ptr_arg(f + I_DUAL), IN, m, 1, 0, 0);
    LAUNCH(c, 1, rtk_iota_rank, "iota contiguous", rt_ptr_arg(f + I_CONT), IN, m, 0, 0, 0);
    LAUNCH(c, 1, rtk_allgather, "allgather i32", rt_ptr_arg(f + I_DUAL), rt_ptr_arg(f + I_ALL), 1, IN, 1, m, RT_I32);
    LAUNCH(c, 1, rtk_shard, "shard", rt_ptr_arg(f + X_SH), rt_ptr_arg(f + Y_SH), SH_OUTER, SH_LEN, SH_INNER, 4, m);
    rt_record(c, 1, 1);
    rt_wait(c, 0, 1);
    LAUNCH(c, 0, k_copy, "results", rt_ptr_arg(f + OUT), rt_ptr_arg(f), OUT * 4);
    (void)s;
}

/* The world ranks of r's group under mask on a 1 x DP x CP x 1 mesh,
 * ascending (written out per mask, not with the runtime's arithmetic). */
static int members(int mask, int r, int DP, int CP, int *out) {
    int d = r / CP, cc = r % CP, n = 0;
    if (mask == RT_AXIS_DP)
        for (int k = 0; k < DP; k++) out[n++] = k * CP + cc;
    else if (mask == RT_AXIS_CP)
        for (int k = 0; k < CP; k++) out[n++] = d * CP + k;
    else
        for (int k = 0; k < DP * CP; k++) out[n++] = k;
    return n;
}

static int close_to(const float *got, const double *want, int n) {
    for (int k = 0; k < n; k++)
        if ((double)got[k] != want[k]) return 0;
    return 1;
}

/* Rank iotas: the contiguous one is positions [idx*IN, (idx+1)*IN); the
 * dual one cuts a sequence of s*IN positions into 2s chunks of IN/2 and
 * holds chunks idx and 2s-1-idx, in that order; and over the group the dual
 * positions (all-gathered by rtk_allgather as i32, small ints that are
 * denormals as floats: bits must pass untouched) cover every position of
 * the sequence exactly once. */
static void check_iota(const int32_t *dual, const int32_t *cont, const int32_t *all, int s, int idx, const char *gname, char *n1,
                       char *n2) {
    int ok = 1, h = IN / 2;
    for (int k = 0; k < IN; k++) ok &= cont[k] == idx * IN + k;
    snprintf(n1, 96, "%s: rank iota, contiguous layout = idx*n + k", gname);
    check(ok, n1);
    int chunk[2] = {idx, 2 * s - 1 - idx};
    ok = 1;
    for (int q = 0; q < 2; q++)
        for (int k = 0; k < h; k++) ok &= dual[q * h + k] == chunk[q] * h + k;
    int32_t seen[MAXG * IN] = {0};
    for (int k = 0; ok && k < s * IN; k++) {
        ok &= all[k] >= 0 && all[k] < s * IN;
        if (ok) seen[all[k]]++;
    }
    for (int k = 0; ok && k < s * IN; k++) ok &= seen[k] == 1;
    snprintf(n2, 96, "%s: rank iota, dual: chunks idx, 2s-1-idx; all-gathered (i32) they cover the sequence once", gname);
    check(ok, n2);
}

static void check_group(rt_ctx *c, const float *o, int mask, const char *gname, int DP, int CP) {
    static char names[16][10][96];
    static int slot;
    int mem[MAXG], s = members(mask, G.rank, DP, CP, mem), idx = -1;
    for (int k = 0; k < s; k++)
        if (mem[k] == G.rank) idx = k;
    double want[MAXG * (N > SO * SN * SI ? N : SO * SN * SI)]; /* the largest check: the strided allgather */
    char(*nm)[96] = names[slot++ % 16];
    snprintf(nm[0], 96, "%s: group size and index from the mesh (dp %d x cp %d)", gname, DP, CP);
    check(rt_group_size(c, mask) == s && rt_group_rank(c, mask) == idx, nm[0]);
    for (int i = 0; i < N; i++) {
        want[i] = 0;
        for (int k = 0; k < s; k++) want[i] += (mem[k] + 1) * (i + 1);
    }
    snprintf(nm[1], 96, "%s: allreduce (and in place) = sum over the group", gname);
    check(close_to(o + Y_AR, want, N) && close_to(o + IP_AR, want, N), nm[1]);
    for (int i = 0; i < N; i++) {
        want[i] = 0;
        for (int k = 0; k < s; k++) want[i] += (mem[k] + 1) * (idx * N + i + 1);
    }
    snprintf(nm[2], 96, "%s: reducescatter (and into its own chunk) = sum of chunk i", gname);
    check(close_to(o + Y_RS, want, N) && close_to(o + OWN_RS + idx * N, want, N), nm[2]);
    for (int k = 0; k < s; k++)
        for (int i = 0; i < N; i++) want[k * N + i] = 100 * mem[k] + i;
    snprintf(nm[3], 96, "%s: allgather (and in place) = chunk j from group rank j", gname);
    check(close_to(o + Y_AG, want, s * N) && close_to(o + IP_AG, want, s * N), nm[3]);
    for (int oo = 0; oo < SH_OUTER; oo++)
        for (int j = 0; j < SH_LEN; j++)
            for (int i = 0; i < SH_INNER; i++)
                want[(oo * SH_LEN + j) * SH_INNER + i] = (oo * s * SH_LEN + idx * SH_LEN + j) * SH_INNER + i;
    snprintf(nm[4], 96, "%s: shard = this rank's chunk of the middle dim", gname);
    check(close_to(o + Y_SH, want, SH_OUTER * SH_LEN * SH_INNER), nm[4]);
    /* strided: y[o, j, i] = sum over the group of x[o, idx*SN + j, i] */
    for (int oo = 0; oo < SO; oo++)
        for (int j = 0; j < SN; j++)
            for (int i = 0; i < SI; i++) {
                double *w = &want[(oo * SN + j) * SI + i];
                *w = 0;
                for (int k = 0; k < s; k++) *w += (mem[k] + 1) * (((oo * s * SN + idx * SN + j) * SI + i) + 1);
            }
    snprintf(nm[6], 96, "%s: strided reducescatter [%d, s*%d, %d] = sum of chunk i of the middle dim", gname, SO, SN, SI);
    check(close_to(o + Y_SRS, want, SO * SN * SI), nm[6]);
    /* y[o, k*SN + j, i] = x of group rank k [o, j, i] */
    for (int oo = 0; oo < SO; oo++)
        for (int k = 0; k < s; k++)
            for (int j = 0; j < SN; j++)
                for (int i = 0; i < SI; i++) want[((oo * s + k) * SN + j) * SI + i] = 1000 * mem[k] + (oo * SN + j) * SI + i;
    snprintf(nm[7], 96, "%s: strided allgather [%d, %d, %d] -> chunk j of the middle dim from group rank j", gname, SO, SN, SI);
    check(close_to(o + Y_SAG, want, SO * s * SN * SI), nm[7]);
    check_iota((const int32_t *)(o + I_DUAL), (const int32_t *)(o + I_CONT), (const int32_t *)(o + I_ALL), s, idx, gname, nm[8], nm[9]);
    /* per step: 2 allreduces, 2 reducescatters, 2 allgathers of N floats, a
     * strided reducescatter and allgather of SO*SN*SI, an allgather of IN i32 */
    int64_t bytes = s == 1 ? 0
                           : 2 * (2 * (int64_t)(s - 1) * N * 4 / s) + 4 * (int64_t)(s - 1) * N * 4 + 2 * (int64_t)(s - 1) * SO * SN * SI * 4 +
                                 (int64_t)(s - 1) * IN * 4;
    snprintf(nm[5], 96, "%s: rt_comm_bytes = 2(2(s-1)4n/s) + 4(s-1)4n + 2(s-1)4m + (s-1)4i per step", gname);
    check(rt_comm_bytes(c) == 2 * bytes, nm[5]); /* two steps were run */
}

static int run_coll(int DP, int CP) {
    static const struct {
        int mask;
        const char *name;
    } groups[] = {{RT_AXIS_DP, "dp"}, {RT_AXIS_CP, "cp"}, {RT_AXIS_DP | RT_AXIS_CP, "dp+cp"}};
    int failed = 0;
    for (int g = 0; g < 3; g++) {
        rt_program p = {.abi_version = RT_ABI_VERSION, .model = "coll", .space_bytes = {0, 0, 0, NFLOATS * 4},
                        .nstreams = 2, .nevents = 2, .step = step_coll, .mesh = {1, DP, CP, 1}};
        rt_ctx *c = new_ctx(&p);
        G.mask = groups[g].mask;
        G.rank = rt_world_rank(c);
        G.size = rt_group_size(c, G.mask);
        G.index = rt_group_rank(c, G.mask);
        if (G.size > MAXG) die("group too large");
        step_or_die(c);
        memset(rt_space(c, RT_SPACE_ACT), 0, NFLOATS * 4);
        step_or_die(c); /* a second step: events and communicators are reused */
        check_group(c, (const float *)rt_space(c, RT_SPACE_ACT) + OUT, G.mask, groups[g].name, DP, CP);
        if (g == 0) {
            int world = rt_world_size(c), mine = 10 * G.rank + 1, got[MAXG] = {0}, mem[MAXG];
            char err[512];
            check(world == DP * CP && G.rank >= 0 && G.rank < world, "world rank and size");
            int s = members(RT_AXIS_DP, G.rank, DP, CP, mem), ok = rt_host_allgather(c, RT_AXIS_DP, &mine, got, sizeof mine, err, sizeof err) == 0;
            for (int k = 0; ok && k < s; k++) ok = got[k] == 10 * mem[k] + 1;
            check(ok, "rt_host_allgather over dp: ints in group-rank order");
            check(rt_host_barrier(c, err, sizeof err) == 0, "rt_host_barrier");
        }
        failed += report(c);
        rt_free(c);
    }
    return failed != 0;
}

static int run_die(void) {
    rt_program p = {.abi_version = RT_ABI_VERSION, .model = "die", .space_bytes = {0, 0, 0, NFLOATS * 4},
                    .nstreams = 2, .nevents = 2, .step = step_coll, .mesh = {1, 4, 1, 1}};
    rt_ctx *c = new_ctx(&p);
    G = (CollState){.mask = RT_AXIS_DP, .rank = rt_world_rank(c), .size = 4, .index = rt_group_rank(c, RT_AXIS_DP), .kill_at = 3};
    for (int s = 0; s < 10; s++) step_or_die(c);
    fprintf(stderr, "mpi_comm die: rank %d survived its peer's death\n", G.rank);
    rt_free(c);
    return 0;
}

/* ---- p2p: send/recv rings ---- */

/* act space, in floats: small x/y pairs for three rings, then the big pair */
enum { PN = 16, PBIG = 2 << 20, P_XS = 0, P_YS = 16, P_XR = 32, P_YR = 48, P_XL = 64, P_YL = 80, P_XB = 128, P_YB = P_XB + PBIG,
       P_FLOATS = P_YB + PBIG };
static struct {
    int index, size;
    int64_t step;
} PP;

static float p2p_small(int r, int64_t step, int k, int ring) { return (float)(1000 * r + 300 * ring + k) + (float)step; }
static float p2p_big(int r, int64_t step, int64_t k) { return (float)(7 * r + k % 1000) + (float)step; }

/* args: base, value (0: this rank's data, 1: clobber with -1) */
static void k_p2p_fill(rt_ctx *c, const int64_t *a) {
    (void)c;
    float *f = RT_F32P(a[0]);
    for (int ring = 0; ring < 3; ring++)
        for (int k = 0; k < PN; k++) f[32 * ring + k] = a[1] ? -1.0f : p2p_small(PP.index, PP.step, k, ring);
    for (int64_t k = 0; k < PBIG; k++) f[P_XB + k] = a[1] ? -1.0f : p2p_big(PP.index, PP.step, k);
}

static void step_p2p(rt_ctx *c, char *const *sp) {
    float *f = (float *)sp[RT_SPACE_ACT];
    int64_t m = RT_AXIS_CP;
    LAUNCH(c, 1, k_p2p_fill, "fill", rt_ptr_arg(f), 0);
    /* the big ring's and the self receive are posted before any send
     * (rtk_recv_start), completed after the others (rtk_recv_done) */
    LAUNCH(c, 1, rtk_recv_start, "post big", rt_ptr_arg(f + P_YB), (int64_t)PBIG * 4, m, -1, 1);
    LAUNCH(c, 1, rtk_recv_start, "post self", rt_ptr_arg(f + P_YL), PN * 4, m, 0, 3);
    LAUNCH(c, 1, rtk_send, "send ring", rt_ptr_arg(f + P_XS), PN * 4, m, 1, 0);
    LAUNCH(c, 1, rtk_send, "send big", rt_ptr_arg(f + P_XB), (int64_t)PBIG * 4, m, 1, 1);
    LAUNCH(c, 1, rtk_send, "send reverse", rt_ptr_arg(f + P_XR), PN * 4, m, -1, 2);
    LAUNCH(c, 1, rtk_send, "send self", rt_ptr_arg(f + P_XL), PN * 4, m, PP.size, 3);
    LAUNCH(c, 1, k_p2p_fill, "clobber", rt_ptr_arg(f), 1);
    LAUNCH(c, 1, rtk_recv, "recv ring", rt_ptr_arg(f + P_YS), PN * 4, m, -1, 0);
    LAUNCH(c, 1, rtk_recv, "recv reverse", rt_ptr_arg(f + P_YR), PN * 4, m, 1, 2);
    LAUNCH(c, 1, rtk_recv_done, "done self", rt_ptr_arg(f + P_YL), PN * 4, m, 0, 3);
    LAUNCH(c, 1, rtk_recv_done, "done big", rt_ptr_arg(f + P_YB), (int64_t)PBIG * 4, m, -1, 1);
}

static int run_p2p(int CP) {
    rt_program p = {.abi_version = RT_ABI_VERSION, .model = "p2p", .space_bytes = {0, 0, 0, (int64_t)P_FLOATS * 4},
                    .nstreams = 2, .step = step_p2p, .mesh = {1, 1, CP, 1}};
    rt_ctx *c = new_ctx(&p);
    PP.index = rt_group_rank(c, RT_AXIS_CP);
    PP.size = rt_group_size(c, RT_AXIS_CP);
    int left = (PP.index + PP.size - 1) % PP.size, right = (PP.index + 1) % PP.size;
    int ok_s = 1, ok_b = 1, ok_r = 1, ok_l = 1, ok_bytes = 1;
    for (PP.step = 1; PP.step <= 2; PP.step++) { /* a second step reuses tags and staging */
        int64_t before = rt_comm_bytes(c);
        step_or_die(c);
        const float *f = (const float *)rt_space(c, RT_SPACE_ACT);
        for (int k = 0; k < PN; k++) {
            ok_s &= f[P_YS + k] == p2p_small(left, PP.step, k, 0);
            ok_r &= f[P_YR + k] == p2p_small(right, PP.step, k, 1);
            ok_l &= f[P_YL + k] == p2p_small(PP.index, PP.step, k, 2);
        }
        for (int64_t k = 0; k < PBIG; k++) ok_b &= f[P_YB + k] == p2p_big(left, PP.step, k);
        ok_bytes &= rt_comm_bytes(c) - before == (PP.size > 1 ? (2 * PN + (int64_t)PBIG) * 4 : 0);
    }
    check(ok_s, "send/recv ring: x of group-rank i-1 arrives");
    check(ok_b, "recv_start/recv_done ring: 8 MiB messages posted before every send, completed last (in the send's pieces)");
    check(ok_r, "send/recv reverse ring (peer -1 / +1)");
    check(ok_l, "send to this rank itself, its receive posted first (peer = size / 0)");
    check(ok_bytes, "rt_comm_bytes counts the bytes sent to other ranks");
    int failed = report(c);
    rt_free(c);
    return failed != 0;
}

/* ---- ckpt: sharded save and load ---- */

/* Two params a [3,5] and b [7]; bucket members a at 0, b at 15. */
enum { NA = 15, NB = 7 };
static const rt_tensor ck_params[2] = {
    {.name = "a", .space = RT_SPACE_PARAMS, .offset = 0, .dtype = RT_F32, .rank = 2, .dim = {3, 5}, .bucket = -1},
    {.name = "b", .space = RT_SPACE_PARAMS, .offset = NA * 4, .dtype = RT_F32, .rank = 1, .dim = {NB}, .bucket = -1},
};
static const int ck_members[2] = {0, 1};
static const int64_t ck_offsets[2] = {0, NA};

/* The logical values: params, and the moments (which = 0 m, 1 v). */
static float param_value(int p, int e) { return p == 0 ? 0.5f * (float)e + 1 : 100.0f + (float)e; }
static float moment_value(int which, int p, int e) { return (which ? -1.0f : 1.0f) * (1000.0f * (float)(p + 1) + (float)e); }

/* A program over mesh with one bucket of length n over group, or (n = 0)
 * the --zero 0 program: full states opt.m.a, opt.m.b, opt.v.a, opt.v.b. */
typedef struct {
    rt_program p;
    rt_bucket bucket;
    rt_tensor states[5];
} CkProg;

static void ck_program(CkProg *c, int dp, int cp, int group, int64_t n) {
    memset(c, 0, sizeof *c);
    int size = (group & RT_AXIS_DP ? dp : 1) * (group & RT_AXIS_CP ? cp : 1);
    int64_t shard = n / size;
    c->bucket = (rt_bucket){.group = group, .n = n, .nmembers = 2, .param = ck_members, .offset = ck_offsets};
    rt_tensor step = {.name = "opt.step", .space = RT_SPACE_OPT, .dtype = RT_F32, .rank = 1, .dim = {1}, .bucket = -1};
    if (n) {
        c->states[0] = (rt_tensor){.name = "opt.m.bucket0", .space = RT_SPACE_OPT, .offset = 0, .dtype = RT_F32, .rank = 1,
                                   .dim = {shard}, .bucket = 0, .prefix = "opt.m."};
        c->states[1] = (rt_tensor){.name = "opt.v.bucket0", .space = RT_SPACE_OPT, .offset = shard * 4, .dtype = RT_F32, .rank = 1,
                                   .dim = {shard}, .bucket = 0, .prefix = "opt.v."};
        step.offset = 2 * shard * 4;
        c->states[2] = step;
        c->p.nstates = 3;
        c->p.nbuckets = 1;
        c->p.buckets = &c->bucket;
    } else {
        static const char *names[4] = {"opt.m.a", "opt.m.b", "opt.v.a", "opt.v.b"};
        int64_t off = 0;
        for (int k = 0; k < 4; k++) {
            const rt_tensor *pt = &ck_params[k % 2];
            c->states[k] = (rt_tensor){.name = names[k], .space = RT_SPACE_OPT, .offset = off, .dtype = RT_F32, .rank = pt->rank,
                                       .dim = {pt->dim[0], pt->dim[1]}, .bucket = -1};
            off += (k % 2 ? NB : NA) * 4;
        }
        step.offset = off;
        c->states[4] = step;
        c->p.nstates = 5;
    }
    c->p.abi_version = RT_ABI_VERSION;
    c->p.model = "ckpt";
    c->p.space_bytes[RT_SPACE_PARAMS] = (n > NA + NB ? n : NA + NB) * 4;
    c->p.space_bytes[RT_SPACE_OPT] = 64 * 4;
    c->p.nparams = 2;
    c->p.params = ck_params;
    c->p.states = c->states;
    c->p.nstreams = 1;
    c->p.step = step_nothing;
    c->p.mesh[1] = dp;
    c->p.mesh[2] = cp;
}

/* Logical element e of the flat bucket: (param, element), or -1 for padding. */
static int bucket_elem(int64_t e, int *el) {
    if (e < NA) return *el = (int)e, 0;
    if (e < NA + NB) return *el = (int)(e - NA), 1;
    return -1;
}

/* Fill this rank's shards as a trained program would, and its params with
 * only its own chunk fresh (the rest stale, as between an update and the
 * next step's all-gather). */
static void ck_fill_sharded(rt_ctx *ctx, const CkProg *c) {
    int idx = rt_group_rank(ctx, c->bucket.group);
    int64_t len = c->bucket.n / rt_group_size(ctx, c->bucket.group);
    float *pa = (float *)rt_space(ctx, RT_SPACE_PARAMS);
    for (int64_t e = 0; e < c->bucket.n; e++) {
        int el, p = bucket_elem(e, &el), mine = e / len == idx;
        pa[e] = !mine ? -999.0f : p < 0 ? 0 : param_value(p, el);
    }
    for (int w = 0; w < 2; w++) {
        float *s = rt_tensor_ptr(ctx, &c->states[w]);
        for (int64_t k = 0; k < len; k++) {
            int el, p = bucket_elem(idx * len + k, &el);
            s[k] = p < 0 ? 777.0f : moment_value(w, p, el); /* padding must not reach the file */
        }
    }
    *(float *)rt_tensor_ptr(ctx, &c->states[2]) = 42;
}

static void ck_fill_full(rt_ctx *ctx, const CkProg *c) {
    for (int p = 0; p < 2; p++) {
        float *pa = rt_tensor_ptr(ctx, &ck_params[p]);
        for (int e = 0; e < (p ? NB : NA); e++) pa[e] = param_value(p, e);
    }
    for (int k = 0; k < 4; k++) {
        float *s = rt_tensor_ptr(ctx, &c->states[k]);
        for (int e = 0; e < (k % 2 ? NB : NA); e++) s[e] = moment_value(k / 2, k % 2, e);
    }
    *(float *)rt_tensor_ptr(ctx, &c->states[4]) = 42;
}

static int ck_save(rt_ctx *ctx, const rt_program *p, const char *dir) {
    char err[1024];
    CkptExtra x = {.step = 7, .rng = 99, .data_pos = 0};
    if (ckpt_save(ctx, p, dir, &x, 0, err, sizeof err)) {
        fprintf(stderr, "rank %d: ckpt_save: %s\n", rt_world_rank(ctx), err);
        return 0;
    }
    return 1;
}

/* The file holds exactly the logical tensors, with their values. */
static int ck_file_logical(const char *path) {
    StFile f;
    char err[1024];
    if (st_open(&f, path, err, sizeof err)) return fprintf(stderr, "%s\n", err), 0;
    static const char *names[6] = {"a", "b", "opt.m.a", "opt.m.b", "opt.v.a", "opt.v.b"};
    int ok = f.n == 10; /* + opt.step and trainer.{step,rng,data_pos} */
    for (int k = 0; ok && k < 6; k++) {
        const StEntry *e = st_find(&f, names[k]);
        int p = k % 2, n = p ? NB : NA;
        ok = e && e->dtype == ST_F32 && e->end - e->begin == (uint64_t)n * 4 && e->rank == ck_params[p].rank;
        for (int i = 0; ok && i < n; i++) {
            float got = ((const float *)st_data(&f, e))[i];
            ok = got == (k < 2 ? param_value(p, i) : moment_value(k / 4, p, i));
        }
    }
    ok = ok && st_find(&f, "opt.step") && !st_find(&f, "opt.m.bucket0");
    st_close(&f);
    return ok;
}

/* Identical entries (names, dtypes, shapes, bytes) in both files. */
static int same_tensors(const char *x, const char *y) {
    StFile f, g;
    char err[1024];
    if (st_open(&f, x, err, sizeof err)) return 0;
    if (st_open(&g, y, err, sizeof err)) return st_close(&f), 0;
    int ok = f.n == g.n;
    for (int i = 0; ok && i < f.n; i++) {
        const StEntry *a = &f.t[i], *b = st_find(&g, a->name);
        ok = b && a->dtype == b->dtype && a->rank == b->rank && a->end - a->begin == b->end - b->begin &&
             memcmp(a->shape, b->shape, sizeof a->shape) == 0 && memcmp(st_data(&f, a), st_data(&g, b), a->end - a->begin) == 0;
    }
    st_close(&f);
    st_close(&g);
    return ok;
}

/* After a load: params whole, this rank's shards cut from the logical
 * tensors, padding zero. */
static int ck_loaded_ok(rt_ctx *ctx, const CkProg *c) {
    int ok = 1, idx = rt_group_rank(ctx, c->bucket.group);
    int64_t len = c->bucket.n / rt_group_size(ctx, c->bucket.group);
    for (int p = 0; p < 2; p++)
        for (int e = 0; e < (p ? NB : NA); e++) ok &= ((float *)rt_tensor_ptr(ctx, &ck_params[p]))[e] == param_value(p, e);
    for (int w = 0; w < 2; w++)
        for (int64_t k = 0; k < len; k++) {
            int el, p = bucket_elem(idx * len + k, &el);
            ok &= ((float *)rt_tensor_ptr(ctx, &c->states[w]))[k] == (p < 0 ? 0.0f : moment_value(w, p, el));
        }
    return ok && *(float *)rt_tensor_ptr(ctx, &c->states[2]) == 42;
}

static int ck_load(rt_ctx *ctx, const CkProg *c, const char *path) {
    char err[1024];
    CkptExtra x;
    for (int i = 0; i < c->p.nstates; i++) memset(rt_tensor_ptr(ctx, &c->states[i]), 0x55, 4); /* not zero: the load must write */
    if (ckpt_load(ctx, &c->p, path, &x, err, sizeof err)) return fprintf(stderr, "rank %d: %s\n", rt_world_rank(ctx), err), 0;
    return x.step == 7 && x.rng == 99;
}

static int run_ckpt(const char *dir) {
    char d1[4096], d0[4096], f1[4200], f0[4200];
    snprintf(d1, sizeof d1, "%s/zero1", dir);
    snprintf(d0, sizeof d0, "%s/zero0", dir);
    ckpt_path(f1, sizeof f1, d1, 7);
    ckpt_path(f0, sizeof f0, d0, 7);
    int failed = 0;
    CkProg c4, c22, cdc, c0;
    ck_program(&c4, 4, 1, RT_AXIS_DP, 24);                /* 22 elements padded to 24 over 4 ranks */
    ck_program(&c22, 2, 2, RT_AXIS_DP, 22);               /* dp 2: shards of 11 */
    ck_program(&cdc, 2, 2, RT_AXIS_DP | RT_AXIS_CP, 28);  /* over dp+cp: shards of 7 */
    ck_program(&c0, 4, 1, RT_AXIS_DP, 0);                 /* --zero 0: full states */

    rt_ctx *ctx = new_ctx(&c4.p);
    ck_fill_sharded(ctx, &c4);
    check(ck_save(ctx, &c4.p, d1), "dp 4: ckpt_save with sharded states succeeds on every rank");
    check(rt_world_rank(ctx) != 0 || ck_file_logical(f1), "dp 4: the file holds the logical tensors (params gathered, no padding)");
    rt_free(ctx);

    ctx = new_ctx(&c0.p);
    ck_fill_full(ctx, &c0);
    check(ck_save(ctx, &c0.p, d0), "--zero 0: ckpt_save");
    check(rt_world_rank(ctx) != 0 || same_tensors(f0, f1), "the sharded checkpoint == the --zero 0 program's, tensor for tensor");
    memset(rt_space(ctx, RT_SPACE_OPT), 0, 64 * 4);
    CkptExtra x;
    char err[1024];
    int ok = ckpt_load(ctx, &c0.p, f1, &x, err, sizeof err) == 0;
    for (int k = 0; ok && k < 4; k++)
        for (int e = 0; e < (k % 2 ? NB : NA); e++) ok &= ((float *)rt_tensor_ptr(ctx, &c0.states[k]))[e] == moment_value(k / 2, k % 2, e);
    check(ok, "--zero 0 loads the sharded checkpoint");
    failed += report(ctx);
    rt_free(ctx);

    ctx = new_ctx(&c22.p);
    check(ck_load(ctx, &c22, f1) && ck_loaded_ok(ctx, &c22), "dp 4 -> dp 2 (x cp 2): every rank gets its shard, padding zero");
    rt_free(ctx);
    ctx = new_ctx(&cdc.p);
    check(ck_load(ctx, &cdc, f1) && ck_loaded_ok(ctx, &cdc), "dp 4 -> a bucket over dp+cp (28 = 4 x 7): shards re-cut");
    check(ck_load(ctx, &cdc, f0) && ck_loaded_ok(ctx, &cdc), "--zero 0 checkpoint -> sharded program");
    failed += report(ctx);
    rt_free(ctx);
    return failed != 0;
}

/* ---- pckpt: params without storage, in a param shard ----
 *
 * The --zero 1 layout whose step all-gathers the params at its start: the
 * params have no storage (space -1) and live in the param shard
 * "param.b0" (prefix "").  S is that program on dp W; R the same model with
 * its params stored and full states (--zero 0).  Three GPT-2-named params
 * (so the files use the "transformer." names), one per init, in a bucket
 * of 28 in another order than the params' (P2 at 0, P1 at 3, P0 at 10,
 * padding 25..27), so that shards cut through members. */

enum { PN0 = 15, PN1 = 7, PN2 = 3, PBUCKET = 28 };
static const int pk_members[3] = {2, 1, 0};
static const int64_t pk_offsets[3] = {0, PN2, PN2 + PN1};
static const int64_t pk_numel[3] = {PN0, PN1, PN2};
static const char *pk_names[3] = {"wte.weight", "h.0.ln_1.weight", "h.0.ln_1.bias"};

typedef struct {
    rt_program p;
    rt_bucket bucket;
    rt_tensor params[3], states[7];
    int64_t len; /* S: the shard length */
    int sharded;
} PkProg;

/* S (sharded = 1): states opt.m.b0, param.b0, opt.v.b0, opt.step (the
 * param shard between the moments: the save must skip it, not stop).  R:
 * params stored in their order; opt.m.<p>, opt.v.<p> in the bucket's member
 * order (the order S's file lists them) and opt.step. */
static void pk_program(PkProg *c, int dp, int sharded) {
    memset(c, 0, sizeof *c);
    c->sharded = sharded;
    c->len = PBUCKET / dp;
    static const int64_t dims[3][2] = {{3, 5}, {PN1, 0}, {PN2, 0}};
    static const char *inits[3] = {"normal", "ones", "zeros"};
    int64_t off = 0;
    for (int k = 0; k < 3; k++) {
        c->params[k] = (rt_tensor){.name = pk_names[k], .space = sharded ? -1 : RT_SPACE_PARAMS, .offset = sharded ? -1 : off * 4,
                                   .dtype = RT_F32, .rank = k ? 1 : 2, .dim = {dims[k][0], dims[k][1]}, .init = inits[k], .std = 0.5,
                                   .bucket = -1};
        off += pk_numel[k];
    }
    if (sharded) {
        static const char *names[3] = {"opt.m.b0", "param.b0", "opt.v.b0"}, *prefixes[3] = {"opt.m.", "", "opt.v."};
        for (int k = 0; k < 3; k++)
            c->states[k] = (rt_tensor){.name = names[k], .space = RT_SPACE_OPT, .offset = k * c->len * 4, .dtype = RT_F32, .rank = 1,
                                       .dim = {c->len}, .bucket = 0, .prefix = prefixes[k]};
        c->states[3] = (rt_tensor){.name = "opt.step", .space = RT_SPACE_OPT, .offset = 3 * c->len * 4, .dtype = RT_F32, .rank = 1, .dim = {1}, .bucket = -1};
        c->p.nstates = 4;
        c->bucket = (rt_bucket){.group = RT_AXIS_DP, .n = PBUCKET, .nmembers = 3, .param = pk_members, .offset = pk_offsets};
        c->p.nbuckets = 1;
        c->p.buckets = &c->bucket;
    } else {
        static char names[6][64];
        int64_t so = 0;
        for (int k = 0; k < 6; k++) {
            const rt_tensor *pt = &c->params[pk_members[k % 3]];
            snprintf(names[k], sizeof names[k], "%s%s", k < 3 ? "opt.m." : "opt.v.", pt->name);
            c->states[k] = (rt_tensor){.name = names[k], .space = RT_SPACE_OPT, .offset = so * 4, .dtype = RT_F32, .rank = pt->rank,
                                       .dim = {pt->dim[0], pt->dim[1]}, .bucket = -1};
            so += pk_numel[pk_members[k % 3]];
        }
        c->states[6] = (rt_tensor){.name = "opt.step", .space = RT_SPACE_OPT, .offset = so * 4, .dtype = RT_F32, .rank = 1, .dim = {1}, .bucket = -1};
        c->p.nstates = 7;
    }
    c->p.abi_version = RT_ABI_VERSION;
    c->p.model = "pshard";
    c->p.space_bytes[RT_SPACE_PARAMS] = sharded ? 0 : off * 4;
    c->p.space_bytes[RT_SPACE_OPT] = (3 * PBUCKET + 1) * 4; /* S at dp 1: three shards of the whole bucket */
    c->p.nparams = 3;
    c->p.params = c->params;
    c->p.states = c->states;
    c->p.nstreams = 1;
    c->p.step = step_nothing;
    c->p.mesh[1] = dp;
}

/* The logical values of the trained model: params and moments (w 0 m, 1 v). */
static float pk_param(int p, int64_t e) { return (float)(100 * p + e) + 0.25f; }
static float pk_moment(int w, int p, int64_t e) { return (w ? -1.0f : 1.0f) * (float)(1000 * (p + 1) + e); }

/* Element e of the flat bucket: its param (element in *el), or -1: padding. */
static int pk_elem(int64_t e, int64_t *el) {
    for (int j = 0; j < 3; j++)
        if (e >= pk_offsets[j] && e < pk_offsets[j] + pk_numel[pk_members[j]]) return *el = e - pk_offsets[j], pk_members[j];
    return -1;
}

/* S's shard of state w (0 opt.m, 1 param, 2 opt.v), at this rank. */
static float *pk_shard(rt_ctx *ctx, const PkProg *c, int w) { return rt_tensor_ptr(ctx, &c->states[w]); }
static int64_t pk_lo(rt_ctx *ctx, const PkProg *c) { return rt_group_rank(ctx, RT_AXIS_DP) * c->len; }

/* The trained values: S as shards (padding 777: it must not reach the file), R whole. */
static void pk_fill(rt_ctx *ctx, const PkProg *c) {
    if (c->sharded) {
        for (int64_t k = 0, el; k < c->len; k++) {
            int p = pk_elem(pk_lo(ctx, c) + k, &el);
            pk_shard(ctx, c, 0)[k] = p < 0 ? 777.0f : pk_moment(0, p, el);
            pk_shard(ctx, c, 1)[k] = p < 0 ? 777.0f : pk_param(p, el);
            pk_shard(ctx, c, 2)[k] = p < 0 ? 777.0f : pk_moment(1, p, el);
        }
        *(float *)rt_tensor_ptr(ctx, &c->states[3]) = 42;
        return;
    }
    for (int p = 0; p < 3; p++)
        for (int64_t e = 0; e < pk_numel[p]; e++) ((float *)rt_tensor_ptr(ctx, &c->params[p]))[e] = pk_param(p, e);
    for (int k = 0; k < 6; k++)
        for (int64_t e = 0; e < pk_numel[pk_members[k % 3]]; e++) ((float *)rt_tensor_ptr(ctx, &c->states[k]))[e] = pk_moment(k / 3, pk_members[k % 3], e);
    *(float *)rt_tensor_ptr(ctx, &c->states[6]) = 42;
}

/* After a load: the trained values (S: this rank's shards, padding 0);
 * params only: the states still hold the 0x55 bytes pk_poison wrote. */
static int pk_loaded(rt_ctx *ctx, const PkProg *c, int params_only) {
    int ok = 1;
    float poison;
    memset(&poison, 0x55, 4);
    if (c->sharded) {
        for (int64_t k = 0, el; k < c->len; k++) {
            int p = pk_elem(pk_lo(ctx, c) + k, &el);
            ok &= pk_shard(ctx, c, 1)[k] == (p < 0 ? 0.0f : pk_param(p, el));
            for (int w = 0; w < 2; w++) ok &= pk_shard(ctx, c, 2 * w)[k] == (params_only ? poison : p < 0 ? 0.0f : pk_moment(w, p, el));
        }
        return ok && *(float *)rt_tensor_ptr(ctx, &c->states[3]) == (params_only ? poison : 42);
    }
    for (int p = 0; p < 3; p++)
        for (int64_t e = 0; e < pk_numel[p]; e++) ok &= ((float *)rt_tensor_ptr(ctx, &c->params[p]))[e] == pk_param(p, e);
    for (int k = 0; k < 6; k++)
        for (int64_t e = 0; e < pk_numel[pk_members[k % 3]]; e++)
            ok &= ((float *)rt_tensor_ptr(ctx, &c->states[k]))[e] == (params_only ? poison : pk_moment(k / 3, pk_members[k % 3], e));
    return ok && *(float *)rt_tensor_ptr(ctx, &c->states[6]) == (params_only ? poison : 42);
}

static void pk_poison(rt_ctx *ctx, const PkProg *c) {
    memset(rt_space(ctx, RT_SPACE_OPT), 0x55, (size_t)c->p.space_bytes[RT_SPACE_OPT]);
    if (!c->sharded) memset(rt_space(ctx, RT_SPACE_PARAMS), 0x55, (size_t)c->p.space_bytes[RT_SPACE_PARAMS]);
}

/* Load path into c after poisoning it (init: --init, params only). */
static int pk_load(rt_ctx *ctx, const PkProg *c, const char *path, int init) {
    char err[1024];
    CkptExtra x = {0};
    pk_poison(ctx, c);
    int rc = init ? ckpt_init_weights(ctx, &c->p, path, err, sizeof err) : ckpt_load(ctx, &c->p, path, &x, err, sizeof err);
    if (rc) return fprintf(stderr, "rank %d: %s: %s\n", rt_world_rank(ctx), path, err), 0;
    return pk_loaded(ctx, c, init) && (init || (x.step == 7 && x.rng == 99));
}

/* S's init against the chunk of R's (the stored params' init, the
 * reference) laid out as the bucket, padding 0, the other states zero; R's
 * init itself: normal values distinct and nonzero, ones, zeros. */
static int pk_init_ok(rt_ctx *cs, const PkProg *s, rt_ctx *cr, const PkProg *r) {
    pk_poison(cs, s);
    pk_poison(cr, r);
    rt_init_params(cs, 1234);
    rt_init_params(cr, 1234);
    const float *w = rt_tensor_ptr(cr, &r->params[0]);
    int ok = 1;
    for (int e = 0; e < PN0; e++) ok &= w[e] != 0 && (e == 0 || w[e] != w[e - 1]) && fabsf(w[e]) < 5;
    for (int e = 0; e < PN1; e++) ok &= ((float *)rt_tensor_ptr(cr, &r->params[1]))[e] == 1.0f;
    for (int e = 0; e < PN2; e++) ok &= ((float *)rt_tensor_ptr(cr, &r->params[2]))[e] == 0.0f;
    for (int64_t k = 0, el; k < s->len; k++) {
        int p = pk_elem(pk_lo(cs, s) + k, &el);
        ok &= pk_shard(cs, s, 1)[k] == (p < 0 ? 0.0f : ((float *)rt_tensor_ptr(cr, &r->params[p]))[el]);
        ok &= pk_shard(cs, s, 0)[k] == 0 && pk_shard(cs, s, 2)[k] == 0;
    }
    return ok && *(float *)rt_tensor_ptr(cs, &s->states[3]) == 0;
}

/* The whole file's bytes equal. */
static int same_file(const char *x, const char *y) {
    FILE *f = fopen(x, "rb"), *g = fopen(y, "rb");
    int ok = f && g, a = 0, b = 0;
    while (ok && (a = getc(f)) == (b = getc(g)) && a != EOF) {}
    ok = ok && a == EOF && b == EOF;
    if (f) fclose(f);
    if (g) fclose(g);
    return ok;
}

/* The file under the HF names: transformer.<p> with the values, the
 * moments opt.m.transformer.<p>, nothing of the shards' own names. */
static int pk_file_ok(const char *path) {
    StFile f;
    char err[1024], name[128];
    if (st_open(&f, path, err, sizeof err)) return fprintf(stderr, "%s\n", err), 0;
    int ok = f.n == 3 + 6 + 1 + 3;
    for (int k = 0; ok && k < 9; k++) {
        int p = k % 3;
        snprintf(name, sizeof name, "%s" "transformer.%s", k < 3 ? "" : k < 6 ? "opt.m." : "opt.v.", pk_names[p]);
        const StEntry *e = st_find(&f, name);
        ok = e && e->dtype == ST_F32 && e->end - e->begin == (uint64_t)pk_numel[p] * 4 && e->rank == (p ? 1 : 2);
        for (int64_t i = 0; ok && i < pk_numel[p]; i++) {
            float got = ((const float *)st_data(&f, e))[i];
            ok = got == (k < 3 ? pk_param(p, i) : pk_moment(k / 6, p, i));
        }
    }
    ok = ok && !st_find(&f, "param.b0") && !st_find(&f, "transformer.param.b0") && !st_find(&f, "opt.m.b0");
    st_close(&f);
    return ok;
}

/* Programs rt_new must refuse (one line each on stderr). */
static int pk_rejected(int dp) {
    PkProg c;
    int ok = 1;
    pk_program(&c, dp, 1);
    c.states[1].prefix = "opt.x."; /* no param shard: the params live nowhere */
    ok &= rt_new(&c.p, NULL) == NULL;
    pk_program(&c, dp, 1);
    c.params[1].offset = 0; /* space -1 needs offset -1 */
    ok &= rt_new(&c.p, NULL) == NULL;
    pk_program(&c, dp, 1);
    c.params[2] = (rt_tensor){.name = pk_names[2], .space = RT_SPACE_PARAMS, .offset = 0, .dtype = RT_F32, .rank = 1, .dim = {PN2}, .bucket = -1};
    c.p.space_bytes[RT_SPACE_PARAMS] = PN2 * 4; /* a member of a param shard with storage of its own */
    ok &= rt_new(&c.p, NULL) == NULL;
    return ok;
}

static const char *pk_file(char *buf, size_t len, const char *dir, int dp, const char *which) {
    char d[4200];
    snprintf(d, sizeof d, "%s/dp%d%s", dir, dp, which);
    ckpt_path(buf, (int)len, d, 7);
    return buf;
}

/* At dp W (mesh 1 x W): init, save (S's file == R's, byte for byte; this
 * run's file == the earlier runs' at other dp), load every file found in
 * DIR (written at any dp) into S and R, --init both ways. */
static int run_pckpt(int W, const char *dir) {
    static char names[16][160];
    int nn = 0, failed = 0;
#define NAME(...) (snprintf(names[nn], sizeof names[nn], __VA_ARGS__), names[nn++])
    PkProg s, r;
    pk_program(&s, W, 1);
    pk_program(&r, W, 0);
    check(pk_rejected(W), NAME("dp %d: rt_new refuses a storage-less param outside a param shard, offset != -1, a stored member", W));
    rt_ctx *cs = new_ctx(&s.p), *cr = new_ctx(&r.p);
    check(pk_init_ok(cs, &s, cr, &r), NAME("dp %d: param shard init == this rank's chunk of the stored params' init (normal, ones, zeros; padding 0)", W));
    char fs[4400], fr[4400], fo[4400], d[4200];
    pk_fill(cs, &s);
    pk_fill(cr, &r);
    check(ck_save(cs, &s.p, (snprintf(d, sizeof d, "%s/dp%dS", dir, W), d)) && ck_save(cr, &r.p, (snprintf(d, sizeof d, "%s/dp%dR", dir, W), d)),
          NAME("dp %d: ckpt_save with params in a param shard", W));
    pk_file(fs, sizeof fs, dir, W, "S");
    pk_file(fr, sizeof fr, dir, W, "R");
    int rank0 = rt_world_rank(cs) == 0;
    check(!rank0 || pk_file_ok(fs), NAME("dp %d: the file holds transformer.<p> and opt.m/v.transformer.<p>, gathered, no padding", W));
    check(!rank0 || same_file(fs, fr), NAME("dp %d: the file == the stored-params program's, byte for byte", W));
    failed += report(cs);
    for (int o = 1; o <= 4; o *= 2) {
        if (o == W || access(pk_file(fo, sizeof fo, dir, o, "S"), F_OK) != 0) continue;
        check(!rank0 || same_file(fs, fo), NAME("dp %d: the file == the one saved at dp %d", W, o));
        check(pk_load(cs, &s, fo, 0) && pk_load(cs, &s, pk_file(fo, sizeof fo, dir, o, "R"), 0),
              NAME("dp %d: loads dp %d's files (params in shards / stored) into param shards", W, o));
        check(pk_load(cr, &r, pk_file(fo, sizeof fo, dir, o, "S"), 0), NAME("dp %d: the stored-params program loads dp %d's param-shard file", W, o));
        failed += report(cs);
    }
    check(pk_load(cs, &s, fs, 0) && pk_load(cs, &s, fr, 0) && pk_load(cr, &r, fs, 0), NAME("dp %d: load at the same dp, both ways", W));
    check(pk_load(cs, &s, fr, 1) && pk_load(cr, &r, fs, 1), NAME("dp %d: --init fills the param shards (and only the params), both ways", W));
    failed += report(cs);
    rt_free(cr);
    rt_free(cs);
    return failed != 0;
#undef NAME
}

/* ---- train: a tiny model through rt_train_main ----
 *
 * loss = mean over the global batch of (w[target] + u[(token + pos/3) & 3] - token/100)^2
 * with pos the token's position in its window (global: rtk_iota_rank over
 * cp), params w [256], u [4] in one bucket over dp; the step all-gathers
 * the params at its start (the update leaves only this rank's chunk fresh),
 * computes the local loss and gradients, all-reduces the loss and
 * reduce-scatters the gradients, and runs momentum SGD on this rank's
 * shard: m = 0.9 m + g, p -= 0.5 m.
 *
 * train-ps: the same model and arithmetic with the params stored nowhere
 * (space -1): they live in the param shard "param.b0" (prefix ""), which
 * the step all-gathers into the act space at its start and updates in
 * place at its end, so its losses equal train's bit for bit and the
 * checkpoints of the two move between them.
 *
 * train-cp: the same model over dp x cp ranks, each with T/cp tokens of
 * every window as the trainer hands them out (rt_program.cp_contiguous);
 * positions from rtk_iota_rank in the layout given, the bucket, the loss
 * and the gradients over dp+cp.  Layout "mismatch" says contiguous in the
 * table but computes dual positions: a wrong hand-out, which must show. */

enum { V = 256, NU = 4 };
static struct {
    rt_program p;
    rt_tensor params[2], states[3], inputs[2], outputs[1];
    rt_bucket bucket;
    int members[2];
    int64_t offsets[2];
    int64_t n, len, B, T, ntot;
    int dp, ps, cp, group, dual; /* group: of the bucket, loss and grads; dual: the iota's layout */
} M;

/* args: tokens, targets, params, grads, loss, positions */
static void k_fwd_bwd(rt_ctx *c, const int64_t *a) {
    const int32_t *tok = RT_I32P(a[0]), *tgt = RT_I32P(a[1]), *pos = RT_I32P(a[5]);
    const float *w = RT_F32P(a[2]), *u = w + V;
    float *gw = RT_F32P(a[3]), *gu = gw + V;
    memset(gw, 0, (size_t)M.n * 4);
    double loss = 0;
    for (int64_t k = 0; k < M.B * M.T; k++) {
        int j = (tok[k] + pos[k % M.T] / 3) & 3; /* / 3: not periodic in the chunk lengths */
        double e = (double)w[tgt[k]] + u[j] - tok[k] / 100.0;
        loss += e * e / (double)M.ntot;
        gw[tgt[k]] += (float)(2 * e / (double)M.ntot);
        gu[j] += (float)(2 * e / (double)M.ntot);
    }
    *RT_F32P(a[4]) = (float)loss;
}

/* args: params chunk, m, g, len */
static void k_update(rt_ctx *c, const int64_t *a) {
    float *p = RT_F32P(a[0]), *m = RT_F32P(a[1]);
    const float *g = RT_F32P(a[2]);
    for (int64_t k = 0; k < a[3]; k++) {
        m[k] = 0.9f * m[k] + g[k];
        p[k] -= 0.5f * m[k];
    }
}

/* The act space: loss [16], the gradient shard [len], (train-ps) the
 * gathered params [n], tokens, targets, positions [T]. */
static void step_train(rt_ctx *c, char *const *sp) {
    char *act = sp[RT_SPACE_ACT];
    float *grads = (float *)sp[RT_SPACE_GRADS], *m = (float *)sp[RT_SPACE_OPT];
    float *loss = (float *)act, *gshard = loss + 16;
    int32_t *tok = (int32_t *)(act + M.inputs[0].offset), *tgt = (int32_t *)(act + M.inputs[1].offset), *pos = tgt + M.B * M.T;
    float *params = M.ps ? gshard + M.len : (float *)sp[RT_SPACE_PARAMS];
    float *mine = M.ps ? (float *)(sp[RT_SPACE_OPT] + M.states[2].offset) : params + rt_group_rank(c, M.group) * M.len;
    LAUNCH(c, 1, rtk_allgather, "allgather params", rt_ptr_arg(mine), rt_ptr_arg(params), 1, M.len, 1, M.group, RT_F32);
    LAUNCH(c, 0, rtk_iota_rank, "positions", rt_ptr_arg(pos), M.T, RT_AXIS_CP, M.dual, 0, 0);
    rt_record(c, 1, 0);
    rt_wait(c, 0, 0);
    LAUNCH(c, 0, k_fwd_bwd, "fwd_bwd", rt_ptr_arg(tok), rt_ptr_arg(tgt), rt_ptr_arg(params), rt_ptr_arg(grads), rt_ptr_arg(loss),
           rt_ptr_arg(pos));
    rt_record(c, 0, 1);
    rt_wait(c, 1, 1);
    LAUNCH(c, 1, rtk_allreduce, "allreduce loss", rt_ptr_arg(loss), rt_ptr_arg(loss), 1, M.group, RT_F32);
    LAUNCH(c, 1, rtk_reducescatter, "reducescatter grads", rt_ptr_arg(grads), rt_ptr_arg(gshard), 1, M.len, 1, M.group, RT_F32);
    rt_record(c, 1, 2);
    rt_wait(c, 0, 2);
    LAUNCH(c, 0, k_update, "update", rt_ptr_arg(mine), rt_ptr_arg(m), rt_ptr_arg(gshard), M.len);
}

/* layout: 0 dual, 1 contiguous, 2 mismatch (see above) */
static int run_train(int dp, int cp, int layout, int gb, int ps, int argc, char **argv) {
    if (dp < 1 || gb % dp) die("train: global batch %d not divisible by dp %d", gb, dp);
    if (cp < 1 || 16 % (2 * cp)) die("train: cp %d does not divide the window of 16 into 2cp chunks", cp);
    M.dp = dp;
    M.ps = ps;
    M.cp = cp;
    M.group = cp > 1 ? RT_AXIS_DP | RT_AXIS_CP : RT_AXIS_DP;
    M.dual = layout != 1;
    M.B = gb / dp;
    M.T = 16 / cp;
    M.ntot = (int64_t)gb * 16;
    M.n = (V + NU + dp * cp - 1) / (dp * cp) * (dp * cp);
    M.len = M.n / (dp * cp);
    M.params[0] = (rt_tensor){.name = "w", .space = RT_SPACE_PARAMS, .offset = 0, .dtype = RT_F32, .rank = 1, .dim = {V}, .init = "normal", .std = 0.02, .bucket = -1};
    M.params[1] = (rt_tensor){.name = "u", .space = RT_SPACE_PARAMS, .offset = V * 4, .dtype = RT_F32, .rank = 1, .dim = {NU}, .init = "ones", .bucket = -1};
    M.members[0] = 0, M.members[1] = 1, M.offsets[0] = 0, M.offsets[1] = V;
    M.bucket = (rt_bucket){.group = M.group, .n = M.n, .nmembers = 2, .param = M.members, .offset = M.offsets};
    M.states[0] = (rt_tensor){.name = "opt.m.bucket0", .space = RT_SPACE_OPT, .dtype = RT_F32, .rank = 1, .dim = {M.len}, .bucket = 0, .prefix = "opt.m."};
    M.states[1] = (rt_tensor){.name = "opt.step", .space = RT_SPACE_OPT, .offset = M.len * 4, .dtype = RT_F32, .rank = 1, .dim = {1}, .bucket = -1};
    M.states[2] = (rt_tensor){.name = "param.b0", .space = RT_SPACE_OPT, .offset = (M.len + 1) * 4, .dtype = RT_F32, .rank = 1, .dim = {M.len}, .bucket = 0, .prefix = ""};
    for (int i = 0; ps && i < 2; i++) M.params[i].space = -1, M.params[i].offset = -1;
    int64_t in0 = (16 + M.len + (ps ? M.n : 0)) * 4, inb = M.B * M.T * 4;
    M.inputs[0] = (rt_tensor){.name = "tokens", .space = RT_SPACE_ACT, .offset = in0, .dtype = RT_I32, .rank = 2, .dim = {M.B, M.T}, .bucket = -1};
    M.inputs[1] = (rt_tensor){.name = "targets", .space = RT_SPACE_ACT, .offset = in0 + inb, .dtype = RT_I32, .rank = 2, .dim = {M.B, M.T}, .bucket = -1};
    M.outputs[0] = (rt_tensor){.name = "loss", .space = RT_SPACE_ACT, .offset = 0, .dtype = RT_F32, .rank = 0, .bucket = -1};
    M.p = (rt_program){.abi_version = RT_ABI_VERSION, .model = "mini", .space_bytes = {ps ? 0 : M.n * 4, M.n * 4, (2 * M.len + 1) * 4, in0 + 2 * inb + M.T * 4},
                       .nparams = 2, .nstates = ps ? 3 : 2, .ninputs = 2, .noutputs = 1, .params = M.params, .states = M.states,
                       .inputs = M.inputs, .outputs = M.outputs, .nstreams = 2, .nevents = 3, .steps = 20, .step = step_train,
                       .mesh = {1, dp, cp, 1}, .nbuckets = 1, .buckets = &M.bucket, .cp_contiguous = layout != 0};
    return rt_train_main(&M.p, argc, argv, 20);
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    if (strcmp(mode, "plain") == 0) return run_plain();
    if (strcmp(mode, "coll") == 0 && argc == 4) return run_coll(atoi(argv[2]), atoi(argv[3]));
    if (strcmp(mode, "ckpt") == 0 && argc == 3) return run_ckpt(argv[2]);
    if (strcmp(mode, "pckpt") == 0 && argc == 4) return run_pckpt(atoi(argv[2]), argv[3]);
    if (strcmp(mode, "die") == 0) return run_die();
    if (strcmp(mode, "p2p") == 0 && argc == 3) return run_p2p(atoi(argv[2]));
    int ps = strcmp(mode, "train-ps") == 0;
    if ((ps || strcmp(mode, "train") == 0) && argc >= 5 && strcmp(argv[4], "--") == 0) {
        argv[4] = argv[0];
        return run_train(atoi(argv[2]), 1, 0, atoi(argv[3]), ps, argc - 4, argv + 4);
    }
    if (strcmp(mode, "train-cp") == 0 && argc >= 7 && strcmp(argv[6], "--") == 0) {
        static const char *const layouts[] = {"dual", "contiguous", "mismatch"};
        int layout = -1;
        for (int k = 0; k < 3; k++)
            if (strcmp(argv[4], layouts[k]) == 0) layout = k;
        if (layout < 0) die("train-cp: layout dual, contiguous or mismatch, got \"%s\"", argv[4]);
        argv[6] = argv[0];
        return run_train(atoi(argv[2]), atoi(argv[3]), layout, atoi(argv[5]), 0, argc - 6, argv + 6);
    }
    die("usage: mpi_comm plain | coll DP CP | p2p CP | ckpt DIR | pckpt DP DIR | die | train[-ps] DP GLOBAL_BATCH -- TRAINER FLAGS | "
        "train-cp DP CP dual|contiguous|mismatch GLOBAL_BATCH -- TRAINER FLAGS");
}
