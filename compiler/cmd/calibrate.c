/* calibrate.c — `kiln calibrate`: measure a device profile on this machine
 * (issue 21).
 *
 *   kiln calibrate --device cpu -o FILE.profile [--quick] [--threads N] [--name NAME]
 *   mpirun -np N kiln calibrate --device cpu -o FILE.profile   (also the links)
 *
 * Every number comes from the CPU runtime itself, as a trainer would run it:
 * a one-kernel program (rt_new, rt_step per call, the runtime's thread pool
 * and OpenBLAS on `threads` threads), each kernel timed per rt_step, the
 * median of a few rounds: on a shared machine the median carries the
 * typical disturbance a training step meets, where the best would promise
 * a quiet machine (bench/cost_model.sh measured the best 35-45% too fast
 * against the trainer's steps under a load of 4-6 on 2 cores).  The fields
 * and what measures them:
 *
 *   peak_flops_f32, gemm_eff  rtk_gemm (OpenBLAS sgemm) on square sizes
 *                             128..1024 (--quick: 64..256), round by round
 *                             (9 rounds, each size once a round), each
 *                             size's median: the best size's rate is the
 *                             peak, each size's over it the table;
 *   peak_flops_bf16           = f32 (the CPU target computes in f32);
 *   step_overhead_s           a step of one 4×4×4 rtk_gemm less a launch: the
 *                             runtime's fixed cost a step (waking its
 *                             streams, waiting for them);
 *   launch_overhead_s         the runtime's cost of one more kernel in a step:
 *                             a step of 256 4×4×4 rtk_gemms less a step of
 *                             one, over 255 (enqueue, worker, call; the
 *                             step's own start and wait cancel);
 *   attn_eff                  rtk_attention forward + backward, causal,
 *                             B 4 H 4 T 256 D 64 (FLOPs as ir_node_flops
 *                             counts them) over the peak;
 *   mem_bw                    rtk_layernorm + rtk_copy of 2 MiB, bytes read +
 *                             written a second (the fallback rate);
 *   mem_bw_table, ew_transc_s the fused elementwise loops' stand-ins
 *                             (calibrate_ew.c, measure_elementwise);
 *   h2d_bw, d2h_bw            memcpy of 64 MiB (the CPU back end's host
 *                             copies are memcpys);
 *   intra_*, inter_*          under mpirun with 2 or more ranks: MPI
 *                             all-reduce of 64 bytes a rank (α = t / 2(n−1))
 *                             and of 1 MiB (β from the ring formula with that α);
 *   allreduce_table, ...      each collective's median time at 64 bytes a
 *                             rank and 64 KiB .. 16 MiB (--quick: .. 1 MiB):
 *                             the cost model reads these in place of α + β
 *                             (Open MPI changes algorithm with the size);
 *                             one host, so inter = intra.  Without mpirun
 *                             they are copied from --base (default the
 *                             shipped cpu profile) and the file says so;
 *   p2p_runtime_table,        under mpirun: the runtime's own exchange
 *   p2p_posted_table          through its streams (measure_exchange), by
 *                             size: ring attention's blocking receive and
 *                             the pipeline's posted one;
 *   memory_bytes              physical memory (sysconf);
 *   node_size                 the ranks under mpirun, else --base's.
 *   cores                     sysconf(_SC_NPROCESSORS_ONLN): the host's cores;
 *   threads                   the threads the rates were measured on (the
 *                             runtime's default: this process's affinity);
 *   thread_speedup            OpenBLAS sgemm on 1 thread over on `threads`
 *                             (measure_speedup): the cores a computing rank
 *                             keeps busy.
 *
 * Every rate is one rank's alone (rank 0 measures while the others sleep):
 * how ranks share the cores is the cost model's (cost.c, processor
 * sharing), not priced into the rates.  Only the links cannot be timed
 * alone; when the ranks share cores their times are scaled to one rank's
 * alone by the model's own rule (link_speed).
 *
 * The file is written atomically (a temporary file, then rename) and read
 * back with profile_load before the command succeeds: what calibrate
 * writes, the loader reads.
 *
 * --device cuda is another program (calibrate_cuda.c: the CUDA runtime
 * cannot share this process with the CPU one): run_cuda compiles the
 * library kernels with NVRTC as kiln compile embeds them, into a memory
 * file, and becomes kiln-calibrate-cuda (execv, so under mpirun the rank
 * is the same process), which reads them from the inherited descriptor.
 */
#include <cblas.h>
#include <dlfcn.h>
#include <errno.h>
#include <sched.h>
#include <sys/mman.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "calibrate_ew.h"
#include "cmd.h"
#include "emit.h"
#include "kiln_rt.h"
#include "profile.h"

/* ---- one kernel per step ---- */

static rt_kernel cur_kernel;
static int64_t cur_args[32];
static int cur_nargs, cur_launches = 1; /* launches of the kernel a step */
static rt_kernel cur_kernel2; /* when set, launched after each launch of cur_kernel */
static int64_t cur_args2[32];
static int cur_nargs2;

static void one_kernel_step(rt_ctx *c, char *const *spaces) {
    (void)spaces;
    for (int i = 0; i < cur_launches; i++) {
        rt_launch(c, 0, cur_kernel, cur_args, cur_nargs, "calibrate");
        if (cur_kernel2) rt_launch(c, 0, cur_kernel2, cur_args2, cur_nargs2, "calibrate"); /* measure_pool_wake's pair */
    }
}

static rt_program one_kernel = {.abi_version = RT_ABI_VERSION, .model = "calibrate", .nstreams = 1, .step = one_kernel_step, .mesh = {1, 1, 1, 1}};

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Seconds a step is stretched to (0: off, for the launch measurement):
 * a step's fixed cost (waking the stream's thread, a few us alone, up to a
 * time slice of milliseconds on a loaded machine) must not count in a
 * kernel's time, as it does not in a trainer's step of hundreds of kernels. */
static double step_target = 0.02;

/* The median of reps rt_steps running kernel k on args, in seconds a step
 * of cur_launches launches: each timed step repeats the launches until it
 * lasts about step_target (the warm-up step says how many), its time
 * scaled back. */
static double best_step(rt_ctx *ctx, rt_kernel k, const int64_t *args, int n, int reps) {
    char err[512];
    cur_kernel = k, cur_nargs = n;
    memcpy(cur_args, args, sizeof(int64_t) * (size_t)n);
    double t[1024];
    int l0 = cur_launches;
    reps = reps < 1024 ? reps : 1024;
    for (int r = 0; r < reps + 1; r++) { /* the first is a warm-up */
        double t0 = cmd_now();
        if (rt_step(ctx, err, sizeof err) != 0) die("calibrate: a kernel failed: %s", err);
        double dt = cmd_now() - t0;
        if (r > 0) t[r - 1] = dt * l0 / cur_launches;
        else if (step_target > 0 && dt < step_target)
            cur_launches = (int)fmin(4096.0 * l0, ceil(cur_launches * step_target / fmax(dt, 1e-7)));
    }
    cur_launches = l0;
    qsort(t, (size_t)reps, sizeof t[0], cmp_d);
    return t[reps / 2];
}

static float *filled(int64_t n) {
    float *x = malloc(sizeof(float) * (size_t)(n ? n : 1));
    if (!x) die("calibrate: out of memory");
    uint32_t s = 12345;
    for (int64_t i = 0; i < n; i++) s = s * 1664525u + 1013904223u, x[i] = (float)(s >> 8) * (1.0f / 16777216.0f) - 0.5f;
    return x;
}

/* ---- the measurements ---- */

typedef struct {
    int quick, threads, world, rank;
    Profile base;
    double gemm_rate[8], gemm_mnk[8];
    int gemm_n[8], ngemm;
    int cores, local;  /* the host's cores; the ranks on this host */
    int threads_given; /* --threads was given */
    double speedup, sp_one[2], sp_all[2]; /* thread_speedup; OpenBLAS GEMM seconds on 1 and on threads threads, n 64 and 128 */
    double peak, launch, attn_rate, elem_bw, copy_bw, alpha, beta;
    double step_ov, step_one; /* step_overhead_s; the step of one tiny GEMM it comes from */
    double calpha[4], cbeta[4], csmall[4], clarge[4]; /* per CollKind */
    double tab_bytes[6], tab_t[4][6];                 /* per CollKind: seconds by bytes (alone) */
    double xchg_t[2][6];                              /* the runtime's exchange [blocking, posted] at tab_bytes (measure_exchange) */
    int nxchg;
    int ntab;
    double ln_bw, tr_bw; /* mem_bw's two kernels alone */
    double attn_ef, attn_eb, attn_cf, attn_cb; /* attention: fwd, bwd fraction of peak; seconds a score */
    double attn_t[2][2];                       /* [fwd, bwd][D 16, 64] seconds */
    double attn_t3[2], attn_rf, attn_rb;       /* [fwd, bwd] D 16 at T/4 seconds; attn_row_s, attn_bwd_row_s */
    double kind_bw[PK_NKIND];                  /* per kernel kind (measure_kinds) */
    double ew_transc, ew_gelu_t, ew_scale_t;    /* ew_transc_s; the GELU and scale steps it comes from */
    double wake, wake_pair, wake_g, wake_a;      /* pool_wake_s; the pair's, the GEMM's and the add's seconds */
    double copy_run[4], copy_rate[4];          /* copy_bw_table: run bytes, bytes a second */
    double bw_bytes[8], bw_rate[8]; /* mem_bw_table: calib_ew_add by bytes */
    int nbw;
    size_t big;
    char note_links[1400];
} Cal;

/* The median step of an [m,k]x[k,n] GEMM, seconds. */
static double gemm_seconds(rt_ctx *ctx, int m, int n, int k, int reps) {
    float *a = filled((int64_t)m * k), *b = filled((int64_t)k * n), *c = filled((int64_t)m * n);
    int64_t args[] = {rt_ptr_arg(a), rt_ptr_arg(b), rt_ptr_arg(c), 1, m, n, k, 0, 0, 0, 0, 0, rt_f64_bits(0.0)};
    double t = best_step(ctx, rtk_gemm, args, 13, reps);
    free(a), free(b), free(c);
    return t;
}

/* The GEMM shapes are a transformer's: tall, M = 8n rows (tokens) by
 * N = K = n (the model's widths), n 32..512 (--quick: 32..128) — a square
 * GEMM of the same M·N·K runs faster on OpenBLAS than the layers' tall ones,
 * and the model's GEMMs are these.  They are measured round by round, one
 * timing of each size a round (a step of `launches` GEMMs, long enough to
 * time), so that the machine's load changes hit every size alike, then
 * each size's median. */
static void measure_gemm(Cal *C, rt_ctx *ctx) {
    static const int full[] = {32, 64, 128, 256, 512}, quick[] = {32, 64, 128};
    static const int lfull[] = {256, 64, 16, 4, 1}, lquick[] = {64, 16, 4};
    const int *sz = C->quick ? quick : full, *ln = C->quick ? lquick : lfull;
    int n = C->quick ? 3 : 5, rounds = C->quick ? 3 : 9;
    /* the cost of one more kernel in a step: a step of 256 tiny GEMMs less a
     * step of one, over 255 (the step's own start and end cancel) */
    double target = step_target;
    step_target = 0; /* the step's own cost must cancel here */
    double one = gemm_seconds(ctx, 4, 4, 4, C->quick ? 20 : 100);
    cur_launches = 256;
    double many = gemm_seconds(ctx, 4, 4, 4, C->quick ? 5 : 20);
    cur_launches = 1;
    step_target = target;
    C->launch = fmax(1e-9, (many - one) / 255);
    C->step_ov = fmax(0, one - C->launch), C->step_one = one;
    double t[5][16];
    for (int r = 0; r < rounds; r++)
        for (int i = 0; i < n; i++) {
            cur_launches = ln[i];
            t[i][r] = gemm_seconds(ctx, 8 * sz[i], sz[i], sz[i], 1) / ln[i];
            cur_launches = 1;
        }
    C->peak = 0;
    for (int i = 0; i < n; i++) {
        qsort(t[i], (size_t)rounds, sizeof(double), cmp_d);
        double mnk = 8.0 * sz[i] * sz[i] * sz[i], ti = t[i][rounds / 2];
        double rate = 2 * mnk / (ti - C->launch > ti / 2 ? ti - C->launch : ti); /* the fixed cost is the launch field's */
        C->gemm_mnk[i] = mnk, C->gemm_rate[i] = rate, C->gemm_n[i] = sz[i];
        if (rate > C->peak) C->peak = rate;
    }
    C->ngemm = n;
}

/* thread_speedup: how much faster a kernel runs on `threads` threads than
 * on one, so the cores a computing rank keeps busy (cost.c's processor
 * sharing: k ranks computing on c cores each get c/k cores, at one
 * thread's speed each).  OpenBLAS sgemm on the tall shapes of n 64 and 128
 * (the layers' GEMMs), round by round on 1 and on `threads` threads
 * (openblas_set_num_threads, as rt_new sets it), each size's median time
 * on one over its median on all, the mean of the two sizes, within [1,
 * threads].  1 thread: 1. */
static void measure_speedup(Cal *C) {
    C->speedup = 1;
    if (C->threads < 2) return;
    static const int sz[2] = {64, 128};
    int rounds = C->quick ? 5 : 11;
    double sum = 0;
    for (int s = 0; s < 2; s++) {
        int n = sz[s], m = 8 * n, reps = s ? 8 : 64;
        float *a = filled((int64_t)m * n), *b = filled((int64_t)n * n), *c = filled((int64_t)m * n);
        double t[2][16];
        for (int r = 0; r < rounds; r++)
            for (int k = 0; k < 2; k++) {
                openblas_set_num_threads(k ? 1 : C->threads);
                double t0 = cmd_now();
                for (int i = 0; i < reps; i++) cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
                t[k][r] = (cmd_now() - t0) / reps;
            }
        qsort(t[0], (size_t)rounds, sizeof(double), cmp_d);
        qsort(t[1], (size_t)rounds, sizeof(double), cmp_d);
        C->sp_all[s] = t[0][rounds / 2], C->sp_one[s] = t[1][rounds / 2];
        sum += C->sp_one[s] / C->sp_all[s];
        free(a), free(b), free(c);
    }
    openblas_set_num_threads(C->threads);
    C->speedup = fmin(C->threads, fmax(1, sum / 2));
}

/* The attention kernels at one head dim D: *tf, *tb the forward's and the
 * backward's seconds (B 4, H 4, T 256, --quick 128, causal); *scores the
 * query·key pairs computed (B·H·T²/2: ir_node_flops's count over 4D). */
static void attention_at(Cal *C, rt_ctx *ctx, int64_t D, int64_t T, double *tf, double *tb, double *scores) {
    int64_t B = 4, H = 4;
    int64_t nq = B * H * T * D, nl = B * H * T;
    float *q = filled(nq), *k = filled(nq), *v = filled(nq), *o = filled(nq), *lse = filled(nl), *dO = filled(nq);
    float *dq = filled(nq), *dk = filled(nq), *dv = filled(nq);
    double scale = 1 / sqrt((double)D);
    int64_t fwd[] = {rt_ptr_arg(q), rt_ptr_arg(k), rt_ptr_arg(v), rt_ptr_arg(o), rt_ptr_arg(lse), B, H, H, T, T, D, 1, rt_f64_bits(scale), 0, 0, 0};
    int64_t bwd[] = {rt_ptr_arg(dO), rt_ptr_arg(q), rt_ptr_arg(k), rt_ptr_arg(v), rt_ptr_arg(o), rt_ptr_arg(lse), rt_ptr_arg(dq),
                     rt_ptr_arg(dk), rt_ptr_arg(dv), B, H, H, T, T, D, 1, rt_f64_bits(scale), 0, 0, 0};
    int reps = C->quick ? 3 : 10;
    *tf = best_step(ctx, rtk_attention, fwd, 16, reps) - C->launch;
    *tb = best_step(ctx, rtk_attention_bwd, bwd, 20, reps) - C->launch;
    *scores = (double)B * H * T * T * 0.5;
    free(q), free(k), free(v), free(o), free(lse), free(dO), free(dq), free(dk), free(dv);
}

/* attn_eff, attn_bwd_eff, attn_score_s, attn_bwd_score_s (cost.c's
 * attention_seconds: FLOPs at a fraction of peak plus a cost per score):
 * the same attention at head dims 16 and 64.  A score's FLOPs grow with D
 * (4D forward, 10D backward) and its softmax work does not, so each
 * direction's two times give a line in D: its slope the FLOP rate, its
 * intercept the per-score cost.  A line that does not fit (noise: slope or
 * intercept not positive) keeps D 64's rate alone and no score cost; a
 * rate above the GEMMs' peak takes the peak, and the score cost whatever
 * keeps D 64's time exact. */
static void measure_attention(Cal *C, rt_ctx *ctx) {
    static const double D[2] = {16, 64};
    int64_t T = C->quick ? 128 : 256, Ts = T / 4;
    double S = 0, S3 = 0, B = 4, H = 4;
    for (int i = 0; i < 2; i++) attention_at(C, ctx, (int64_t)D[i], T, &C->attn_t[0][i], &C->attn_t[1][i], &S);
    attention_at(C, ctx, (int64_t)D[0], Ts, &C->attn_t3[0], &C->attn_t3[1], &S3);
    double R = B * H * (double)T, R3 = B * H * (double)Ts; /* query rows */
    for (int b = 0; b < 2; b++) {
        double per = b ? 10.0 : 4.0; /* FLOPs a score per unit of D */
        double slope = (C->attn_t[b][1] - C->attn_t[b][0]) / (D[1] - D[0]), icpt = C->attn_t[b][0] - slope * D[0];
        double eff, cost = 0, row = 0;
        if (slope > 0 && icpt > 0) {
            eff = per * S / (slope * C->peak), cost = icpt / S;
            /* the short sequence's intercept (its FLOPs at the same rate) splits the
             * intercept into a cost a score and a cost a row */
            double icpt3 = C->attn_t3[b] - slope * D[0] * S3 / S, det = S * R3 - S3 * R;
            double c2 = (icpt * R3 - icpt3 * R) / det, r2 = (S * icpt3 - S3 * icpt) / det;
            if (c2 >= 0 && r2 > 0) cost = c2, row = r2;
        } else eff = per * S * D[1] / (C->attn_t[b][1] * C->peak);
        if (eff > 1) /* faster than the GEMMs' peak (noise): the peak, and D 64's time stays exact through the score cost */
            eff = 1, cost = fmax(0, (C->attn_t[b][1] - per * S * D[1] / C->peak) / S), row = 0;
        if (b) C->attn_eb = eff, C->attn_cb = cost, C->attn_rb = row;
        else C->attn_ef = eff, C->attn_cf = cost, C->attn_rf = row;
    }
    C->attn_rate = 14.0 * S * D[1] / (C->attn_t[0][1] + C->attn_t[1][1]); /* D 64, fwd + bwd: the printed rate */
}

/* One kernel kind's bandwidth: `bytes` (as cost.c's node_bytes counts the
 * node: its inputs and outputs) over the median step of kernel k. */
static double kind_rate(Cal *C, rt_ctx *ctx, rt_kernel k, const int64_t *args, int n, double bytes) {
    double t = best_step(ctx, k, args, n, C->quick ? 5 : 15) - C->launch;
    return bytes / (t > 0 ? t : 1e-9);
}

/* copy_bw_table (cost.c: a strided copy's bytes at the rate of its
 * contiguous runs): rtk_copy's head permute [R,4,D] -> [4,R,D] of 128 Ki
 * floats at D 16, 64, 256 (runs of 64 .. 1024 bytes: the attention's
 * heads), and the same floats as one run (512 KiB: a slice of whole rows, a
 * parameter's shard), bytes read + written a second each; copy_bw: the one
 * run's rate.  (D 1024 is left out: its 16 KiB source stride puts every
 * run in the same cache sets, a case no model here makes.) */
static void measure_copy(Cal *C, rt_ctx *ctx) {
    int64_t n = 128 * 1024;
    float *src = filled(n), *dst = filled(n);
    double bytes = 2.0 * 4 * (double)n;
    static const int64_t Ds[3] = {16, 64, 256};
    for (int i = 0; i < 3; i++) {
        int64_t D = Ds[i], H = 4, R = n / (H * D);
        int64_t tr[] = {rt_ptr_arg(src), rt_ptr_arg(dst), 4, 3, H, R, D, 1, 1, D, H * D, 1, 0, 0, R * D, D, 1, 0, 0};
        C->copy_run[i] = 4.0 * (double)D, C->copy_rate[i] = kind_rate(C, ctx, rtk_copy, tr, 19, bytes);
    }
    int64_t whole[] = {rt_ptr_arg(src), rt_ptr_arg(dst), 4, 1, n, 1, 1, 1, 1, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0}; /* one run: a slice of whole rows */
    C->copy_run[3] = 4.0 * (double)n, C->copy_rate[3] = kind_rate(C, ctx, rtk_copy, whole, 19, bytes);
    C->kind_bw[PK_COPY] = C->copy_rate[3];
    free(src), free(dst);
}

/* kind_bw (profile.h's ProfileKind): each kind's own kernel, alone, at a
 * size between the models this machine trains (tiny.lua's small and
 * medium: rows of 64 .. 256 floats, 128 KiB .. 2 MiB a tensor):
 *   norm_bw      rtk_layernorm [1024,128]: x, w, b in, y out
 *   norm_bwd_bw  rtk_layernorm_bwd [1024,128]: dy, x, w in, dx, dw, db out
 *   xent_bw      rtk_cross_entropy [1024,256] (the byte-level vocab):
 *                logits, targets in, loss out
 *   xent_bwd_bw  rtk_cross_entropy_bwd [1024,256]: dl, logits, targets in,
 *                dlogits out
 *   copy_bw      measure_copy (with copy_bw_table)
 *   sumto_bw     rtk_sumto [2048,128] -> [128] (a bias's gradient)
 *   adamw_bw     rtk_adamw of 16 Ki floats: p, g, m, v in, p, m, v out
 *   sumsq_bw     rtk_sumsq of 16 Ki floats: x in */
static void measure_kinds(Cal *C, rt_ctx *ctx) {
    int64_t R = 1024, Cn = 128, V = 256, n = R * Cn;
    float *x = filled(n), *y = filled(n), *dy = filled(n), *w = filled(Cn), *b = filled(Cn), *dw = filled(Cn), *db = filled(Cn);
    int64_t ln[] = {rt_ptr_arg(x), rt_ptr_arg(w), rt_ptr_arg(b), rt_ptr_arg(y), R, Cn, rt_f64_bits(1e-5)};
    C->kind_bw[PK_NORM] = kind_rate(C, ctx, rtk_layernorm, ln, 7, 4.0 * (2 * n + 2 * Cn));
    int64_t lb[] = {rt_ptr_arg(dy), rt_ptr_arg(x), rt_ptr_arg(w), rt_ptr_arg(y), rt_ptr_arg(dw), rt_ptr_arg(db), R, Cn, rt_f64_bits(1e-5)};
    C->kind_bw[PK_NORM_BWD] = kind_rate(C, ctx, rtk_layernorm_bwd, lb, 9, 4.0 * (3 * n + 3 * Cn));
    free(x), free(y), free(dy), free(w), free(b), free(dw), free(db);
    float *lg = filled(R * V), *dl = filled(R * V), *loss = filled(R), *dls = filled(R);
    int32_t *tg = malloc(sizeof(int32_t) * (size_t)R);
    if (!tg) die("calibrate: out of memory");
    for (int64_t i = 0; i < R; i++) tg[i] = (int32_t)((i * 37) % V), dls[i] = 1.0f / (float)R;
    int64_t xf[] = {rt_ptr_arg(lg), rt_ptr_arg(tg), rt_ptr_arg(loss), R, V};
    int64_t xb[] = {rt_ptr_arg(dls), rt_ptr_arg(lg), rt_ptr_arg(tg), rt_ptr_arg(dl), R, V};
    double bf = 4.0 * (R * V + 2 * R), bb = 4.0 * (2 * R * V + 2 * R);
    C->kind_bw[PK_XENT] = kind_rate(C, ctx, rtk_cross_entropy, xf, 5, bf);
    C->kind_bw[PK_XENT_BWD] = kind_rate(C, ctx, rtk_cross_entropy_bwd, xb, 6, bb);
    free(lg), free(dl), free(loss), free(dls), free(tg);
    measure_copy(C, ctx);
    float *sx = filled(2 * n), *sy = filled(Cn);
    int64_t st[] = {rt_ptr_arg(sx), rt_ptr_arg(sy), 2, 2 * R, Cn, 1, 1, 1, 0, 1, 0, 0, 0, RT_F32, RT_F32};
    C->kind_bw[PK_SUMTO] = kind_rate(C, ctx, rtk_sumto, st, 15, 4.0 * (2 * n + Cn));
    free(sx), free(sy);
    int64_t N = 16384;
    float *p = filled(N), *g = filled(N), *m = filled(N), *v = filled(N), lr = 1e-3f, sc = 1.0f, t = 3.0f, out = 0;
    for (int64_t i = 0; i < N; i++) v[i] = v[i] * v[i]; /* a second moment is not negative */
    int64_t ad[] = {rt_ptr_arg(p), rt_ptr_arg(g), rt_ptr_arg(m), rt_ptr_arg(v), rt_ptr_arg(&lr), rt_ptr_arg(&sc), rt_ptr_arg(&t), rt_ptr_arg(p),
                    rt_ptr_arg(m), rt_ptr_arg(v), N, rt_f64_bits(0.9), rt_f64_bits(0.95), rt_f64_bits(1e-8), rt_f64_bits(0.0)};
    C->kind_bw[PK_ADAMW] = kind_rate(C, ctx, rtk_adamw, ad, 15, 4.0 * (7 * N + 3));
    int64_t ss[] = {rt_ptr_arg(g), rt_ptr_arg(&out), N, RT_F32};
    C->kind_bw[PK_SUMSQ] = kind_rate(C, ctx, rtk_sumsq, ss, 4, 4.0 * (N + 1));
    free(p), free(g), free(m), free(v);
}

/* The rate of the kernels the model prices by bytes: a layernorm and a
 * transpose (rtk_copy: every transpose and slice; here the attention's
 * head permute) of a [rows, 512] tensor the size of a layer's activations (2 MiB: in L2
 * and L3 as theirs are; the model's small tensors never reach DRAM), timed
 * as one step each, the median; bytes read + written over the two times. */
/* The two kernels on a [rows, 512] f32 tensor: bytes a second over both. */
static double elem_rate(Cal *C, rt_ctx *ctx, int64_t rows, double *ln_bw, double *tr_bw) {
    int64_t cols = 512, n = rows * cols;
    float *x = filled(n), *y = filled(n), *w = filled(cols), *b = filled(cols);
    int64_t ln[] = {rt_ptr_arg(x), rt_ptr_arg(w), rt_ptr_arg(b), rt_ptr_arg(y), rows, cols, rt_f64_bits(1e-5)};
    /* the attention's head permute [T, H, D] -> [H, T, D] (H 8, D 64): runs of D floats */
    int64_t tr[] = {rt_ptr_arg(x), rt_ptr_arg(y), 4, 3, rows, 8, cols / 8, 1, 1, cols, cols / 8, 1, 0, 0, cols / 8, rows * (cols / 8), 1, 0, 0};
    int reps = C->quick ? 5 : 15;
    double tl = best_step(ctx, rtk_layernorm, ln, 7, reps), tt = best_step(ctx, rtk_copy, tr, 19, reps);
    double fixed = 2 * C->launch, t = tl + tt;
    if (ln_bw) *ln_bw = 2.0 * (double)n * 4 / tl, *tr_bw = 2.0 * (double)n * 4 / tt;
    free(x), free(y), free(w), free(b);
    return 4.0 * (double)n * 4 / (t - fixed > t / 2 ? t - fixed : t);
}

static double kind_rate(Cal *C, rt_ctx *ctx, rt_kernel k, const int64_t *args, int n, double bytes);

/* pool_wake_s: what a parallel kernel costs beyond its own time when it
 * follows a GEMM, as in a step (a layer alternates them): the pool's
 * worker sleeps and OpenBLAS's threads hold the cores after the GEMM, so
 * the kernel first waits for its helper.  Steps of pairs (rtk_gemm
 * [512,64]x[64,64], calib_ew_add of 32 Ki floats: above the generated
 * loops' serial limit of 16 Ki) less the GEMMs alone less the adds alone
 * (back to back: the worker awake), a pair: the median of the rounds'
 * differences (the three timed round by round).  0 when not positive. */
static void measure_pool_wake(Cal *C, rt_ctx *ctx) {
    int64_t n = 32768, m = 512, k = 64;
    float *x = filled(n), *y = filled(n), *z = filled(n), *a = filled(m * k), *b = filled(k * k), *c = filled(m * k);
    int64_t add[] = {rt_ptr_arg(x), rt_ptr_arg(y), rt_ptr_arg(z), n};
    int64_t gm[] = {rt_ptr_arg(a), rt_ptr_arg(b), rt_ptr_arg(c), 1, m, k, k, 0, 0, 0, 0, 0, rt_f64_bits(0.0)};
    int rounds = C->quick ? 5 : 15;
    double d[16], tg[16], ta[16], tp[16];
    for (int r = 0; r < rounds; r++) { /* round by round, so the load's changes hit the three alike; each round's difference */
        tg[r] = best_step(ctx, rtk_gemm, gm, 13, 1), ta[r] = best_step(ctx, calib_ew_add, add, 4, 1);
        cur_kernel2 = calib_ew_add, cur_nargs2 = 4;
        memcpy(cur_args2, add, sizeof add);
        tp[r] = best_step(ctx, rtk_gemm, gm, 13, 1);
        cur_kernel2 = NULL;
        d[r] = tp[r] - tg[r] - ta[r];
    }
    qsort(d, (size_t)rounds, sizeof d[0], cmp_d), qsort(tg, (size_t)rounds, sizeof d[0], cmp_d);
    qsort(ta, (size_t)rounds, sizeof d[0], cmp_d), qsort(tp, (size_t)rounds, sizeof d[0], cmp_d);
    C->wake = fmax(0, d[rounds / 2]), C->wake_pair = tp[rounds / 2], C->wake_g = tg[rounds / 2], C->wake_a = ta[rounds / 2];
    free(x), free(y), free(z), free(a), free(b), free(c);
}

/* mem_bw_table and ew_transc_s: the fused elementwise kernels' stand-ins
 * (calibrate_ew.c).  The table: calib_ew_add (z = x + y) of n = 4 Ki ..
 * 4 Mi floats by 4x (--quick: .. 256 Ki), bytes 12n (two read, one
 * written) a second: the caches' rates to DRAM's, as a generated loop
 * moves them.  ew_transc_s: calib_ew_gelu less calib_ew_scale (the same
 * bytes without the tanh) over 256 Ki elements, a transcendental's cost an
 * element (the cost model charges it per element of a GELU, tanh, exp,
 * SiLU, sigmoid, log or pow node, fused or not); 0 when the difference is
 * not positive (noise). */
static void measure_elementwise(Cal *C, rt_ctx *ctx) {
    int64_t big = (int64_t)4 << 20;
    float *x = filled(big), *y = filled(big), *z = filled(big);
    C->nbw = C->quick ? 4 : 6;
    for (int i = 0; i < C->nbw; i++) {
        int64_t n = (int64_t)4096 << (2 * i);
        int64_t a[] = {rt_ptr_arg(x), rt_ptr_arg(y), rt_ptr_arg(z), n};
        C->bw_bytes[i] = 12.0 * (double)n, C->bw_rate[i] = kind_rate(C, ctx, calib_ew_add, a, 4, 12.0 * (double)n);
    }
    int64_t n = (int64_t)256 << 10, g[] = {rt_ptr_arg(x), 0, rt_ptr_arg(z), n};
    int reps = C->quick ? 5 : 15;
    double tg = best_step(ctx, calib_ew_gelu, g, 4, reps), ts = best_step(ctx, calib_ew_scale, g, 4, reps);
    C->ew_gelu_t = tg, C->ew_scale_t = ts, C->ew_transc = fmax(0, (tg - ts) / (double)n);
    free(x), free(y), free(z);
}

/* The rate of the kernels the model prices by bytes: a layernorm and a
 * transpose (rtk_copy: every transpose and slice; here the attention's
 * head permute) of a [rows, 512] f32 tensor, each timed as steps of many
 * launches, the median; bytes read + written over the two times.  mem_bw:
 * at 1024 rows (2 MiB, a layer's activations: in L2 and L3 as theirs are);
 * the table: measure_elementwise's (session 7: the layernorm + transpose
 * table priced the small model's GELU groups 1.3-2x fast and its plain
 * adds 2.5-2.9x slow). */
static void measure_memory(Cal *C, rt_ctx *ctx) {
    C->elem_bw = elem_rate(C, ctx, 1024, &C->ln_bw, &C->tr_bw);
    measure_elementwise(C, ctx);
    measure_pool_wake(C, ctx);
    int64_t big = (int64_t)16 << 20; /* host copies: 64 MiB memcpys (the offloaded activations are large) */
    float *bx = filled(big), *by = filled(big);
    double best = INFINITY;
    for (int r = 0; r < (C->quick ? 3 : 10); r++) {
        double t0 = cmd_now();
        memcpy(by, bx, (size_t)big * 4);
        double dt = cmd_now() - t0;
        if (dt < best) best = dt;
    }
    C->copy_bw = (double)big * 4 / best;
    free(bx), free(by);
}

/* One collective of kind k (CollKind) over every rank moving `bytes` (the
 * full buffer: all-reduce's, the gathered output, the scattered input, a
 * p2p message to the next rank in a ring): the median of reps of the
 * slowest rank's time, seconds (a barrier before each). */
static double coll_seconds(int k, size_t bytes, int reps) {
    int world, rank;
    MPI_Comm_size(MPI_COMM_WORLD, &world), MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    size_t n = bytes / 4 / (size_t)world * (size_t)world;
    n = n ? n : (size_t)world;
    float *a = filled((int64_t)n), *b = filled((int64_t)n);
    double t[256];
    reps = reps < 256 ? reps : 256;
    for (int r = 0; r < reps + 1; r++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        int rc, c = (int)(n / (size_t)world);
        if (k == COLL_ALL_REDUCE) rc = MPI_Allreduce(a, b, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        else if (k == COLL_ALL_GATHER) rc = MPI_Allgather(a, c, MPI_FLOAT, b, c, MPI_FLOAT, MPI_COMM_WORLD);
        else if (k == COLL_REDUCE_SCATTER) rc = MPI_Reduce_scatter_block(a, b, c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        else rc = MPI_Sendrecv(a, (int)n, MPI_FLOAT, (rank + 1) % world, 7, b, (int)n, MPI_FLOAT, (rank + world - 1) % world, 7,
                               MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) die("calibrate: MPI collective %d of %zu bytes failed", k, n * 4);
        double dt = MPI_Wtime() - t0, tmax;
        MPI_Allreduce(&dt, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (r > 0) t[r - 1] = tmax;
    }
    free(a), free(b);
    qsort(t, (size_t)reps, sizeof t[0], cmp_d);
    return t[reps / 2];
}

/* The sharing domain calibrate itself ran in (cost.c's processor
 * sharing): ranks on this host bound to disjoint cores (local·threads <=
 * cores) each have their own `threads` cores, else local·threads/cores
 * of them share `threads` cores.  During the link measurements every
 * rank's MPI call keeps one thread busy, so each ran at min(1, threads /
 * ranks a domain) of its speed alone: the factor that turns the measured
 * times into one rank's alone, as the profile's other times are. */
static double link_speed(const Cal *C) {
    int g = C->local * C->threads / C->cores;
    g = g < 1 ? 1 : g;
    return g > C->threads ? (double)C->threads / g : 1;
}

/* Per algorithm, α from a tiny message (steps·α) and β from a large one
 * (the ring formula's factor·bytes over the rest), as profile_coll_seconds
 * prices them; intra_* are all-reduce's. */
static void measure_links(Cal *C) {
    if (C->world < 2) {
        C->alpha = C->base.intra_alpha, C->beta = C->base.intra_beta;
        snprintf(C->note_links, sizeof C->note_links, "not measured (one rank: run under mpirun -np 2 or more); from %s", C->base.path);
        return;
    }
    double n = C->world;
    size_t big = (size_t)1 << 20, len = 0;
    /* the tables: 64 bytes a rank, then 64 KiB .. 16 MiB (--quick: .. 1 MiB) by 4x */
    static const int treps[6] = {100, 20, 15, 10, 7, 5};
    C->ntab = C->quick ? 4 : 6;
    for (int k = 0; k < 4; k++) {
        double steps = k == COLL_ALL_REDUCE ? 2 * (n - 1) : k == COLL_P2P ? 1 : n - 1;
        double factor = k == COLL_ALL_REDUCE ? 2 * (n - 1) / n : k == COLL_P2P ? 1 : (n - 1) / n;
        for (int i = 0; i < C->ntab; i++) {
            size_t b = i == 0 ? (size_t)(64 * C->world) : (size_t)65536 << (2 * (i - 1));
            C->tab_bytes[i] = (double)b;
            C->tab_t[k][i] = coll_seconds(k, b, C->quick ? (treps[i] + 4) / 5 : treps[i]);
        }
        double small = C->tab_t[k][0], large = C->tab_t[k][3]; /* 1 MiB */
        C->calpha[k] = small / steps;
        double xfer = large - small;
        C->cbeta[k] = factor * (double)big / (xfer > 0 ? xfer : large);
        C->csmall[k] = small, C->clarge[k] = large;
    }
    double f = link_speed(C); /* the times alone: α shorter, β faster */
    for (int k = 0; k < 4; k++) {
        C->calpha[k] *= f, C->cbeta[k] /= f;
        for (int i = 0; i < C->ntab; i++) C->tab_t[k][i] *= f;
    }
    C->alpha = C->calpha[COLL_ALL_REDUCE], C->beta = C->cbeta[COLL_ALL_REDUCE];
    len += (size_t)snprintf(C->note_links, sizeof C->note_links, "MPI_Allreduce over %d local ranks: %d bytes %.3g s, %zu bytes %.3g s (ring formula), times x %.3g: one rank's alone (%s)",
                            C->world, 64 * C->world, C->csmall[0], big, C->clarge[0], f,
                            f < 1 ? "every rank's MPI thread busy on shared cores during the measurement" : "each rank on cores of its own");
    C->big = big;
    (void)len;
}

/* ---- the runtime's point-to-point exchange ----
 *
 * p2p_runtime_table, p2p_posted_table: the seconds from a compute-stream
 * record to the compute stream's release, through one exchange as a
 * step runs it on every rank at once: the comm stream waits on the
 * record, sends to the next rank (rtk_send: a staging copy, MPI_Isend) and
 * receives from the previous one — rtk_recv (MPI_Recv, blocking: ring
 * attention's) or a receive posted before the record (rtk_recv_start,
 * then rtk_recv_done's sleeping test: the pipeline's) — then records; the
 * compute stream waits on that.  So the time holds what MPI_Sendrecv's
 * table does not: two thread wake-ups (the comm stream's on the record,
 * the compute stream's on the reply), the staging copy, the runtime's
 * locking and the posted receive's polling.  XCHG exchanges a step, the
 * median step of the slowest rank over XCHG, after a barrier each step,
 * scaled like the collectives (link_speed: x 0.5 for 4 ranks on 2 cores).
 * Unscaled, the -np 4 tables (130-400 us an exchange, every rank's two
 * threads on 2 cores) put the small model's pp 4 plan at +22% (15.0 ->
 * 18.4 ms) where session 10's quiet run measured it within +5.5% without
 * them; scaled, +2%. */
enum { XCHG = 32 };
static int64_t xchg_bytes, xchg_world;
static int xchg_posted;
static float *xchg_x, *xchg_y;

static void xchg_step(rt_ctx *c, char *const *spaces) {
    (void)spaces;
    for (int j = 0; j < XCHG; j++) {
        int64_t snd[] = {rt_ptr_arg(xchg_x), xchg_bytes, RT_AXIS_DP, 1, j}, rcv[] = {rt_ptr_arg(xchg_y), xchg_bytes, RT_AXIS_DP, xchg_world - 1, j};
        if (xchg_posted) rt_launch(c, 1, rtk_recv_start, rcv, 5, "calibrate");
        rt_record(c, 0, 2 * j);
        rt_wait(c, 1, 2 * j);
        rt_launch(c, 1, rtk_send, snd, 5, "calibrate");
        rt_launch(c, 1, xchg_posted ? rtk_recv_done : rtk_recv, rcv, 5, "calibrate");
        rt_record(c, 1, 2 * j + 1);
        rt_wait(c, 0, 2 * j + 1);
    }
}

static rt_program xchg_prog = {.abi_version = RT_ABI_VERSION, .model = "calibrate-p2p", .nstreams = 2, .nevents = 2 * XCHG, .step = xchg_step, .mesh = {1, 1, 1, 1}};

static void measure_exchange(Cal *C) {
    if (C->world < 2) return;
    xchg_prog.mesh[1] = C->world, xchg_world = C->world;
    rt_options o = {.threads = C->threads};
    rt_ctx *x = rt_new(&xchg_prog, &o);
    if (!x) die("calibrate: the exchange program (2 streams, %d ranks) failed to start", C->world);
    char err[512];
    int reps = C->quick ? 5 : 15;
    double f = link_speed(C);
    C->nxchg = C->ntab < 4 ? C->ntab : 4; /* 64 bytes a rank .. 1 MiB */
    for (int posted = 0; posted < 2; posted++)
        for (int i = 0; i < C->nxchg; i++) {
            xchg_posted = posted, xchg_bytes = (int64_t)C->tab_bytes[i];
            xchg_x = filled(xchg_bytes / 4), xchg_y = filled(xchg_bytes / 4);
            double t[64];
            for (int r = 0; r < reps + 1; r++) { /* the first: a warm-up */
                MPI_Barrier(MPI_COMM_WORLD);
                double t0 = cmd_now();
                if (rt_step(x, err, sizeof err) != 0) die("calibrate: the exchange step failed: %s", err);
                double dt = cmd_now() - t0, tmax;
                MPI_Allreduce(&dt, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
                if (r > 0) t[r - 1] = tmax;
            }
            qsort(t, (size_t)reps, sizeof t[0], cmp_d);
            C->xchg_t[posted][i] = fmax(1e-9, (t[reps / 2] - C->step_ov) / XCHG) * f;
            free(xchg_x), free(xchg_y);
        }
    rt_free(x);
}

/* ---- the file ---- */

static void write_profile(const Cal *C, const char *path, const char *name) {
    char tmp[4200], when[64], host[256], err[1300];
    FILE *f = profile_create(path, tmp, sizeof tmp, when, host, err, sizeof err);
    if (!f) die("%s", err);
    double load[1] = {0};
    FILE *la = fopen("/proc/loadavg", "r");
    if (la) {
        if (fscanf(la, "%lf", &load[0]) != 1) load[0] = -1;
        fclose(la);
    }
    fprintf(f, "# Measured by `kiln calibrate --device cpu%s` on %s at %s, %d thread%s, %d rank%s, load average %.2f.\n",
            C->quick ? " --quick" : "", host, when, C->threads, C->threads == 1 ? "" : "s", C->world, C->world == 1 ? "" : "s", load[0]);
    fprintf(f, "# Each number: the median of a few timed rt_steps of one runtime kernel (compiler/cmd/calibrate.c), measured by\n"
               "# one rank alone on %d thread%s (the others asleep): one rank's speed alone.  The %d ranks on this host share its\n"
               "# %d cores; the cost model divides them among what runs at once (cores, threads below; cost.c).\n",
            C->threads, C->threads == 1 ? "" : "s", C->local, C->cores);
    fprintf(f, "name              %s\n", name);
    fprintf(f, "memory_bytes      %.6g   # sysconf: physical memory\n", (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE));
    fprintf(f, "peak_flops_f32    %.6g   # rtk_gemm (OpenBLAS sgemm): the best size's median rate\n", C->peak);
    fprintf(f, "peak_flops_bf16   %.6g   # the CPU target computes in f32: as f32\n", C->peak);
    fprintf(f, "gemm_eff         ");
    for (int i = 0; i < C->ngemm; i++) fprintf(f, " %.6g:%.4f", C->gemm_mnk[i], fmin(1, C->gemm_rate[i] / C->peak));
    fprintf(f, "   # rtk_gemm [8n,n]x[n,n], one rank alone:");
    for (int i = 0; i < C->ngemm; i++) fprintf(f, " n %d %.2f GFLOP/s%s", C->gemm_n[i], C->gemm_rate[i] / 1e9, i + 1 < C->ngemm ? "," : "");
    fprintf(f, "\nattn_eff          %.4f   # rtk_attention causal B 4 H 4 T %d at D 16 and 64: %.3g, %.3g s; the line's slope in D (FLOPs) over the peak\n",
            C->attn_ef, C->quick ? 128 : 256, C->attn_t[0][0], C->attn_t[0][1]);
    fprintf(f, "attn_score_s      %.4g   # the same line's intercept over the scores (B H T^2/2), less the rows' part (attn_row_s): the softmax's cost a score\n", C->attn_cf);
    fprintf(f, "attn_bwd_eff      %.4f   # rtk_attention_bwd, the same shapes: %.3g, %.3g s (10 D FLOPs a score)\n", C->attn_eb, C->attn_t[1][0],
            C->attn_t[1][1]);
    fprintf(f, "attn_bwd_score_s  %.4g   # its intercept over the scores (less the rows' part, below)\n", C->attn_cb);
    fprintf(f, "attn_row_s        %.4g   # rtk_attention at D 16, T %d: %.3g s; with the T %d intercept, the intercept split into a cost a score and one a query row (B H T)\n",
            C->attn_rf, C->quick ? 32 : 64, C->attn_t3[0], C->quick ? 128 : 256);
    fprintf(f, "attn_bwd_row_s    %.4g   # rtk_attention_bwd, the same: %.3g s\n", C->attn_rb, C->attn_t3[1]);
    static const char *const kind_src[PK_NKIND] = {
        "rtk_layernorm [1024,128]: x, w, b read, y written",
        "rtk_layernorm_bwd [1024,128]: dy, x, w read, dx, dw, db written",
        "rtk_cross_entropy [1024,256]: logits, targets read, loss written",
        "rtk_cross_entropy_bwd [1024,256]: dl, logits, targets read, dlogits written",
        "rtk_copy of 128 Ki floats as one run (copy_bw_table below for shorter ones): read + written",
        "rtk_sumto [2048,128]->[128]: read + written",
        "rtk_adamw of 16384 floats: p, g, m, v read, p, m, v written",
        "rtk_sumsq of 16384 floats: read"};
    for (int k = 0; k < PK_NKIND; k++)
        fprintf(f, "%-17s %.6g   # %s, bytes a second, one rank alone\n", profile_kind_fields[k], C->kind_bw[k], kind_src[k]);
    fprintf(f, "copy_bw_table    ");
    for (int i = 0; i < 4; i++) fprintf(f, " %.6g:%.6g", C->copy_run[i], C->copy_rate[i]);
    fprintf(f, "   # rtk_copy [R,4,D]->[4,R,D] of 128 Ki floats, D 16, 64, 256, then one run: bytes read + written a second by the bytes of a contiguous run\n");
    fprintf(f, "mem_bw            %.6g   # rtk_layernorm of [1024,512] + rtk_copy [1024,8,64]->[8,1024,64] f32: bytes read + written a second (%.3g, %.3g GB/s)\n",
            C->elem_bw, C->ln_bw / 1e9, C->tr_bw / 1e9);
    fprintf(f, "mem_bw_table     ");
    for (int i = 0; i < C->nbw; i++) fprintf(f, " %.6g:%.6g", C->bw_bytes[i], C->bw_rate[i]);
    fprintf(f, "   # z = x + y over 4 Ki .. %s floats (an elementwise loop as the back end generates one: rt_parallel_for, vectorized): bytes read + written a second by the bytes moved\n",
            C->quick ? "256 Ki" : "4 Mi");
    fprintf(f, "pool_wake_s       %.4g   # a GEMM then a parallel add (32 Ki floats) less each alone, the rounds' median (medians: %.3g s a pair, %.3g s the GEMM, %.3g s the add)\n",
            C->wake, C->wake_pair, C->wake_g, C->wake_a);
    fprintf(f, "ew_transc_s       %.4g   # z = GELU(x) (Cephes tanhf on a Cephes expf, both branches and a select, as emit_llvm.c's) %.3g s less z = 2x %.3g s, over 256 Ki elements: a transcendental's cost an element\n",
            C->ew_transc, C->ew_gelu_t, C->ew_scale_t);
    fprintf(f, "launch_overhead_s %.4g   # (a step of 256 4x4x4 rtk_gemms - a step of 1) / 255\n", C->launch);
    fprintf(f, "step_overhead_s   %.4g   # a step of one 4x4x4 rtk_gemm (%.3g s, the median) less a launch: the runtime's fixed cost a step\n", C->step_ov,
            C->step_one);
    fprintf(f, "h2d_bw            %.6g   # memcpy (the CPU's host copies are memcpys)\n", C->copy_bw);
    fprintf(f, "d2h_bw            %.6g   # as h2d_bw\n", C->copy_bw);
    fprintf(f, "intra_alpha_s     %.4g   # %s\n", C->alpha, C->note_links);
    fprintf(f, "intra_beta        %.6g   # as intra_alpha_s\n", C->beta);
    fprintf(f, "inter_alpha_s     %.4g   # one host: as intra\n", C->alpha);
    fprintf(f, "inter_beta        %.6g   # one host: as intra\n", C->beta);
    static const char *const coll[4] = {"allreduce", "allgather", "reducescatter", "p2p"};
    static const char *const mpi[4] = {"MPI_Allreduce", "MPI_Allgather", "MPI_Reduce_scatter_block", "MPI_Sendrecv around the ring"};
    for (int k = 0; k < 4 && C->world > 1; k++) {
        fprintf(f, "%s_alpha_s %.4g   # %s, %d ranks: %d bytes in %.3g s over %s steps\n", coll[k], C->calpha[k], mpi[k], C->world,
                64 * C->world, C->csmall[k], k == 0 ? "2(n-1)" : k == 3 ? "1" : "n-1");
        fprintf(f, "%s_beta %.6g   # the same, %zu bytes in %.3g s: %s of them a link, less the small one's time; x intra_alpha_s's factor\n", coll[k], C->cbeta[k], C->big,
                C->clarge[k], k == 0 ? "2(n-1)/n" : k == 3 ? "all" : "(n-1)/n");
        fprintf(f, "%s_table", coll[k]);
        for (int i = 0; i < C->ntab; i++) fprintf(f, " %.6g:%.4g", C->tab_bytes[i], C->tab_t[k][i]);
        fprintf(f, "   # %s, %d ranks: the median seconds by bytes (the slowest rank's), x intra_alpha_s's factor\n", mpi[k], C->world);
    }
    for (int k = 0; k < 2 && C->world > 1 && C->nxchg > 0; k++) {
        fprintf(f, "%s", k ? "p2p_posted_table " : "p2p_runtime_table");
        for (int i = 0; i < C->nxchg; i++) fprintf(f, " %.6g:%.4g", C->tab_bytes[i], C->xchg_t[k][i]);
        fprintf(f, "   # the runtime's exchange, %d ranks: compute-stream record, comm stream rtk_send to the next rank and %s from the previous, record, compute-stream wait; the median step of %d over %d, less step_overhead_s (x intra_alpha_s's factor)\n",
                C->world, k ? "rtk_recv_start (before the record) and rtk_recv_done (sleeping test: the pipeline's)" : "rtk_recv (blocking: ring attention's)", XCHG, XCHG);
    }
    fprintf(f, "node_size         %d   # %s\n", C->world > 1 ? C->world : C->base.node_size,
            C->world > 1 ? "the ranks under mpirun" : "from the base profile");
    fprintf(f, "cores             %d   # sysconf(_SC_NPROCESSORS_ONLN): the host's cores, which its ranks' threads share\n", C->cores);
    fprintf(f, "threads           %d   # %s: the cores one rank may run on, its compute threads (the rates above: on that many)\n", C->threads < C->cores ? C->threads : C->cores,
            C->threads_given ? "--threads" : "sched_getaffinity, over the local ranks when they would oversubscribe the cores (the runtime's default thread count)");
    fprintf(f, "thread_speedup    %.4g   # OpenBLAS sgemm [8n,n]x[n,n] on 1 thread over on %d: n 64 %.3g/%.3g s, n 128 %.3g/%.3g s (the mean, in 1..threads)\n",
            fmin(C->speedup, C->threads < C->cores ? C->threads : C->cores), C->threads, C->sp_one[0], C->sp_all[0], C->sp_one[1], C->sp_all[1]);
    if (fclose(f) != 0) die("-o: cannot write %s: %s", tmp, strerror(errno));
    if (profile_commit(tmp, path, err, sizeof err) != 0) die("calibrate: %s", err);
}

/* The runtime's default thread count (dev_cpu.c's cores(), the same rule):
 * the cores this process may run on (mpirun binds each of up to `cores`
 * ranks to one core: one thread each), but when the local ranks are
 * unbound and would run more threads than the host's cores, its cores over
 * them, at least 1 (4 ranks on 2 cores: one thread each). */
static int affinity_cores(void) {
    cpu_set_t set;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    int a = sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0 ? CPU_COUNT(&set) : n > 0 ? (int)n : 1;
    const char *ls = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    long local = ls ? strtol(ls, NULL, 10) : 1;
    if (n > 0 && local > 1 && local * a > n) return (int)(n / local > 1 ? (n / local < a ? n / local : a) : 1);
    return a;
}

/* A barrier that sleeps while it waits (MPI_Barrier polls at full speed). */
static void sleeping_barrier(void) {
    MPI_Request rq;
    if (MPI_Ibarrier(MPI_COMM_WORLD, &rq) != MPI_SUCCESS) die("calibrate: MPI_Ibarrier failed");
    for (int done = 0;;) {
        if (MPI_Test(&rq, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) die("calibrate: MPI_Test failed");
        if (done) return;
        struct timespec t = {0, 1000000};
        nanosleep(&t, NULL);
    }
}

static void usage_die(void) {
    die("usage: kiln calibrate --device cpu|cuda -o FILE.profile [--quick] [--threads N] [--name NAME] [--base PROFILE] [--arch sm_XX]");
}

/* --device cuda: the library cubins into a memory file (memfd: nothing on
 * disk to clean up, whatever happens next), then execv kiln-calibrate-cuda
 * from kiln's own folder with the flags and the file's descriptor. */
static void run_cuda(const char *out, const char *name, const char *base, const char *arch, int quick, int small) {
    char dir[4000], exe[4100], err[4096], fdarg[16];
    cmd_exe_dir(dir, sizeof dir);
    snprintf(exe, sizeof exe, "%s/kiln-calibrate-cuda", dir);
    if (access(exe, X_OK) != 0) die("calibrate --device cuda: %s: %s (make builds it beside kiln)", exe, strerror(errno));
    void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL); /* the program needs it: say so here, in one line */
    if (!driver) die("calibrate --device cuda: no CUDA driver on this machine (%s)", dlerror());
    dlclose(driver);
    Profile b;
    if (profile_load(&b, base, err, sizeof err) != 0) die("--base: %s", err); /* before the compile, not after */
    EmitCubin *cb;
    int n;
    if (emit_cuda_library_cubins(arch, 1, &cb, &n, err, sizeof err) != 0) die("calibrate --device cuda: %s", err);
    int fd = memfd_create("kiln-cubins", 0); /* no close-on-exec: the program reads it */
    if (fd < 0) die("calibrate --device cuda: memfd_create: %s", strerror(errno));
    FILE *f = fdopen(dup(fd), "wb");
    for (int i = 0; f && i < n; i++)
        if (fprintf(f, "%s %zu\n", cb[i].name, cb[i].size) < 0 || fwrite(cb[i].data, 1, cb[i].size, f) != cb[i].size) break;
    if (!f || ferror(f) || fclose(f) != 0 || lseek(fd, 0, SEEK_SET) != 0) die("calibrate --device cuda: cannot write the cubins to a memory file");
    emit_cubins_free(cb, n);
    snprintf(fdarg, sizeof fdarg, "%d", fd);
    char *argv[20];
    int a = 0;
    argv[a++] = exe, argv[a++] = "--cubins-fd", argv[a++] = fdarg, argv[a++] = "-o", argv[a++] = (char *)out;
    argv[a++] = "--name", argv[a++] = (char *)name, argv[a++] = "--base", argv[a++] = (char *)base, argv[a++] = "--arch", argv[a++] = (char *)arch;
    if (quick) argv[a++] = "--quick";
    if (small) argv[a++] = "--small";
    argv[a] = NULL;
    fflush(NULL);
    execv(exe, argv);
    die("calibrate --device cuda: cannot run %s: %s", exe, strerror(errno));
}

int kiln_calibrate_main(int argc, char **argv) {
    const char *device = NULL, *out = NULL, *name = NULL, *base = NULL, *arch = NULL;
    Cal C = {0};
    int small = 0; /* --small: the fake CUDA stack's shapes (tests) */
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (strcmp(f, "--quick") == 0) { C.quick = 1; continue; }
        if (strcmp(f, "--small") == 0) { small = 1; continue; }
        if (i + 1 >= argc) die("calibrate: %s: missing value (or unknown flag)", f);
        if (strcmp(f, "--device") == 0) device = argv[++i];
        else if (strcmp(f, "-o") == 0) out = argv[++i];
        else if (strcmp(f, "--name") == 0) name = argv[++i];
        else if (strcmp(f, "--base") == 0) base = argv[++i];
        else if (strcmp(f, "--arch") == 0) arch = argv[++i];
        else if (strcmp(f, "--threads") == 0) {
            char *e;
            long t = strtol(argv[++i], &e, 10);
            if (*e || t < 1 || t > 1024) die("--threads: expected a whole number in 1..1024, got \"%s\"", argv[i]);
            C.threads = (int)t, C.threads_given = 1;
        } else die("calibrate: %s: unknown flag", f);
    }
    if (!device) usage_die();
    if (C.quick) step_target = 0.005;
    int cuda = strcmp(device, "cuda") == 0;
    if (!cuda && strcmp(device, "cpu") != 0) die("--device: expected cpu or cuda, got \"%s\"", device);
    if (!out) die("calibrate: -o FILE.profile is required");
    name = name ? name : cuda ? "cuda-calibrated" : "cpu-calibrated", base = base ? base : cuda ? "h200-sxm" : "cpu";
    if (!*name || strpbrk(name, " \t#") || strlen(name) >= 64) die("--name: expected one word under 64 characters, got \"%s\"", name);
    cmd_check_output("-o", out, NULL, 0);
    if (cuda && C.threads_given) die("--threads: the CPU's (a GPU rank has no threads to choose)");
    if (!cuda && (arch || small)) die("%s: only with --device cuda", arch ? "--arch" : "--small");
    if (cuda) {
        arch = arch ? arch : "sm_90";
        if (strncmp(arch, "sm_", 3) != 0 || strspn(arch + 3, "0123456789") < 2 || arch[3 + strspn(arch + 3, "0123456789")] != 0)
            die("--arch: expected sm_XX (the GPU's compute capability, sm_90 for an H100 or H200), got \"%s\"", arch);
        run_cuda(out, name, base, arch, C.quick, small);
    }
    char err[1200];
    if (profile_load(&C.base, base, err, sizeof err) != 0) die("--base: %s", err);
    if (C.threads == 0) C.threads = affinity_cores();
    const char *ws = getenv("OMPI_COMM_WORLD_SIZE"); /* under mpirun: a program of that many (dp) ranks */
    if (ws && atoi(ws) > 1) one_kernel.mesh[1] = atoi(ws);
    rt_options o = {.threads = C.threads};
    rt_ctx *ctx = rt_new(&one_kernel, &o);
    if (!ctx) return 1;
    int inited = 0;
    C.world = 1;
    if (MPI_Initialized(&inited) == MPI_SUCCESS && inited) MPI_Comm_size(MPI_COMM_WORLD, &C.world), MPI_Comm_rank(MPI_COMM_WORLD, &C.rank);
    const char *ls = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    C.local = ls && atoi(ls) > 0 ? atoi(ls) : C.world;
    C.cores = (int)sysconf(_SC_NPROCESSORS_ONLN) > 0 ? (int)sysconf(_SC_NPROCESSORS_ONLN) : 1;
    double t0 = cmd_now();
    if (C.rank == 0) { /* the kernels: rank 0 alone, the others asleep (a spinning barrier would take a core) */
        measure_gemm(&C, ctx);
        measure_speedup(&C);
        measure_attention(&C, ctx);
        measure_memory(&C, ctx);
        measure_kinds(&C, ctx);
    }
    if (C.world > 1) sleeping_barrier();
    measure_links(&C);
    rt_free(ctx);
    measure_exchange(&C); /* after the links' MPI calls: its own two-stream program */
    if (C.rank == 0) {
        write_profile(&C, out, name);
        printf("calibrate: %s in %.1f s: sgemm peak %.2f GFLOP/s, attention %.2f GFLOP/s, elementwise %.2f GB/s, memcpy %.2f GB/s, "
               "launch %.3g s, links %.3g s + %.3g GB/s%s\n",
               out, cmd_now() - t0, C.peak / 1e9, C.attn_rate / 1e9, C.elem_bw / 1e9, C.copy_bw / 1e9,
               C.launch, C.alpha, C.beta / 1e9,
               C.world > 1 ? "" : " (not measured: one rank)");
    }
    return 0;
}
