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
 *                             128..1024 (--quick: 64..256): the best rate is
 *                             the peak, each size's rate over it the table;
 *   peak_flops_bf16           = f32 (the CPU target computes in f32);
 *   launch_overhead_s         the runtime's cost of one more kernel in a step:
 *                             a step of 256 4×4×4 rtk_gemms less a step of
 *                             one, over 255 (enqueue, worker, call; the
 *                             step's own start and wait cancel);
 *   attn_eff                  rtk_attention forward + backward, causal,
 *                             B 4 H 4 T 256 D 64 (FLOPs as ir_node_flops
 *                             counts them) over the peak;
 *   mem_bw                    an elementwise-class kernel: rtk_layernorm
 *                             over 16 Mi floats, bytes read + written a
 *                             second (the cost model charges non-GEMM
 *                             kernels by bytes at this rate);
 *   h2d_bw, d2h_bw            memcpy of 64 MiB (the CPU back end's host
 *                             copies are memcpys);
 *   intra_*, inter_*          under mpirun with 2 or more ranks: MPI
 *                             all-reduce of 8 bytes (α = t / 2(n−1)) and of
 *                             16 MiB (β from the ring formula with that α);
 *                             one host, so inter = intra.  Without mpirun
 *                             they are copied from --base (default the
 *                             shipped cpu profile) and the file says so;
 *   memory_bytes              physical memory (sysconf);
 *   node_size                 the ranks under mpirun, else --base's.
 *
 * The file is written atomically (a temporary file, then rename) and read
 * back with profile_load before the command succeeds: what calibrate
 * writes, the loader reads.  --device cuda needs a GPU and the CUDA device's
 * one-kernel programs; it is refused in one line for now (the shipped GPU
 * profiles are datasheets and estimates, marked so).
 */
#include <errno.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cmd.h"
#include "kiln_rt.h"
#include "profile.h"

/* ---- one kernel per step ---- */

static rt_kernel cur_kernel;
static int64_t cur_args[32];
static int cur_nargs, cur_launches = 1; /* launches of the kernel a step */

static void one_kernel_step(rt_ctx *c, char *const *spaces) {
    (void)spaces;
    for (int i = 0; i < cur_launches; i++) rt_launch(c, 0, cur_kernel, cur_args, cur_nargs, "calibrate");
}

static rt_program one_kernel = {.abi_version = RT_ABI_VERSION, .model = "calibrate", .nstreams = 1, .step = one_kernel_step, .mesh = {1, 1, 1, 1}};

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median of reps rt_steps running kernel k on args, in seconds. */
static double best_step(rt_ctx *ctx, rt_kernel k, const int64_t *args, int n, int reps) {
    char err[512];
    cur_kernel = k, cur_nargs = n;
    memcpy(cur_args, args, sizeof(int64_t) * (size_t)n);
    double t[1024];
    reps = reps < 1024 ? reps : 1024;
    for (int r = 0; r < reps + 1; r++) { /* the first is a warm-up */
        double t0 = cmd_now();
        if (rt_step(ctx, err, sizeof err) != 0) die("calibrate: a kernel failed: %s", err);
        if (r > 0) t[r - 1] = cmd_now() - t0;
    }
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
    int ngemm;
    double peak, launch, attn_rate, elem_bw, copy_bw, alpha, beta;
    char note_links[1400];
} Cal;

static double gemm_seconds(rt_ctx *ctx, int n, int reps) {
    float *a = filled((int64_t)n * n), *b = filled((int64_t)n * n), *c = filled((int64_t)n * n);
    int64_t args[] = {rt_ptr_arg(a), rt_ptr_arg(b), rt_ptr_arg(c), 1, n, n, n, 0, 0, 0, 0, 0, rt_f64_bits(0.0)};
    double t = best_step(ctx, rtk_gemm, args, 13, reps);
    free(a), free(b), free(c);
    return t;
}

static void measure_gemm(Cal *C, rt_ctx *ctx) {
    static const int full[] = {128, 256, 512, 1024}, quick[] = {64, 128, 256};
    const int *sz = C->quick ? quick : full;
    int n = C->quick ? 3 : 4;
    /* the cost of one more kernel in a step: a step of 256 tiny GEMMs less a
     * step of one, over 255 (the step's own start and end cancel) */
    double one = gemm_seconds(ctx, 4, C->quick ? 20 : 100);
    cur_launches = 256;
    double many = gemm_seconds(ctx, 4, C->quick ? 5 : 20);
    cur_launches = 1;
    C->launch = fmax(1e-9, (many - one) / 255);
    C->peak = 0;
    for (int i = 0; i < n; i++) {
        double mnk = (double)sz[i] * sz[i] * sz[i], t = gemm_seconds(ctx, sz[i], C->quick ? 3 : (sz[i] >= 1024 ? 5 : 20));
        double rate = 2 * mnk / (t - C->launch > t / 2 ? t - C->launch : t); /* the fixed cost is the launch field's */
        C->gemm_mnk[i] = mnk, C->gemm_rate[i] = rate;
        if (rate > C->peak) C->peak = rate;
    }
    C->ngemm = n;
}

static void measure_attention(Cal *C, rt_ctx *ctx) {
    int64_t B = 4, H = 4, T = C->quick ? 128 : 256, D = 64;
    int64_t nq = B * H * T * D, nl = B * H * T;
    float *q = filled(nq), *k = filled(nq), *v = filled(nq), *o = filled(nq), *lse = filled(nl), *dO = filled(nq);
    float *dq = filled(nq), *dk = filled(nq), *dv = filled(nq);
    double scale = 1 / sqrt((double)D);
    int64_t fwd[] = {rt_ptr_arg(q), rt_ptr_arg(k), rt_ptr_arg(v), rt_ptr_arg(o), rt_ptr_arg(lse), B, H, H, T, T, D, 1, rt_f64_bits(scale), 0, 0, 0};
    int64_t bwd[] = {rt_ptr_arg(dO), rt_ptr_arg(q), rt_ptr_arg(k), rt_ptr_arg(v), rt_ptr_arg(o), rt_ptr_arg(lse), rt_ptr_arg(dq),
                     rt_ptr_arg(dk), rt_ptr_arg(dv), B, H, H, T, T, D, 1, rt_f64_bits(scale), 0, 0, 0};
    int reps = C->quick ? 3 : 10;
    double tf = best_step(ctx, rtk_attention, fwd, 16, reps), tb = best_step(ctx, rtk_attention_bwd, bwd, 20, reps);
    double fl = 4.0 * B * H * T * T * D * 0.5; /* ir_node_flops: causal halves; backward 2.5x */
    C->attn_rate = 3.5 * fl / (tf + tb - 2 * C->launch);
    free(q), free(k), free(v), free(o), free(lse), free(dO), free(dq), free(dk), free(dv);
}

static void measure_memory(Cal *C, rt_ctx *ctx) {
    int64_t rows = C->quick ? 1024 : 16384, cols = 1024, n = rows * cols;
    float *x = filled(n), *y = filled(n), *w = filled(cols), *b = filled(cols);
    int64_t ln[] = {rt_ptr_arg(x), rt_ptr_arg(w), rt_ptr_arg(b), rt_ptr_arg(y), rows, cols, rt_f64_bits(1e-5)};
    double t = best_step(ctx, rtk_layernorm, ln, 7, C->quick ? 3 : 10);
    C->elem_bw = 2.0 * (double)n * 4 / (t - C->launch > t / 2 ? t - C->launch : t);
    double best = INFINITY;
    for (int r = 0; r < (C->quick ? 3 : 10); r++) {
        double t0 = cmd_now();
        memcpy(y, x, (size_t)n * 4);
        double dt = cmd_now() - t0;
        if (dt < best) best = dt;
    }
    C->copy_bw = (double)n * 4 / best;
    free(x), free(y), free(w), free(b);
}

/* All-reduce of bytes over every rank: the best of reps, seconds (rank 0's view: a barrier first). */
static double allreduce_seconds(size_t bytes, int reps) {
    size_t n = bytes / 4 ? bytes / 4 : 1;
    float *a = filled((int64_t)n), *b = filled((int64_t)n);
    double best = INFINITY;
    for (int r = 0; r < reps + 1; r++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        if (MPI_Allreduce(a, b, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD) != MPI_SUCCESS) die("calibrate: MPI_Allreduce failed");
        double t = MPI_Wtime() - t0, tmax;
        MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (r > 0 && tmax < best) best = tmax;
    }
    free(a), free(b);
    return best;
}

static void measure_links(Cal *C) {
    if (C->world < 2) {
        C->alpha = C->base.intra_alpha, C->beta = C->base.intra_beta;
        snprintf(C->note_links, sizeof C->note_links, "not measured (one rank: run under mpirun -np 2 or more); from %s", C->base.path);
        return;
    }
    double n = C->world, small = allreduce_seconds(8, C->quick ? 20 : 200);
    size_t big = C->quick ? (size_t)1 << 20 : (size_t)16 << 20;
    double large = allreduce_seconds(big, C->quick ? 3 : 10);
    C->alpha = small / (2 * (n - 1));
    double xfer = large - 2 * (n - 1) * C->alpha;
    C->beta = 2 * (n - 1) / n * (double)big / (xfer > 0 ? xfer : large);
    snprintf(C->note_links, sizeof C->note_links, "MPI_Allreduce over %d local ranks: 8 bytes %.3g s, %zu bytes %.3g s (ring formula)",
             C->world, small, big, large);
}

/* ---- the file ---- */

static void write_profile(const Cal *C, const char *path, const char *name) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp%d", path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) die("-o: cannot open %s: %s", tmp, strerror(errno));
    time_t now = time(NULL);
    char when[64], host[256] = "?";
    strftime(when, sizeof when, "%Y-%m-%d %H:%M UTC", gmtime(&now));
    gethostname(host, sizeof host - 1);
    double load[1] = {0};
    FILE *la = fopen("/proc/loadavg", "r");
    if (la) {
        if (fscanf(la, "%lf", &load[0]) != 1) load[0] = -1;
        fclose(la);
    }
    fprintf(f, "# Measured by `kiln calibrate --device cpu%s` on %s at %s, %d thread%s, %d rank%s, load average %.2f.\n",
            C->quick ? " --quick" : "", host, when, C->threads, C->threads == 1 ? "" : "s", C->world, C->world == 1 ? "" : "s", load[0]);
    fprintf(f, "# Each number: the median of a few timed rt_steps of one runtime kernel (compiler/cmd/calibrate.c).\n");
    fprintf(f, "name              %s\n", name);
    fprintf(f, "memory_bytes      %.6g   # sysconf: physical memory\n", (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE));
    fprintf(f, "peak_flops_f32    %.6g   # rtk_gemm (OpenBLAS sgemm): the best size's median rate\n", C->peak);
    fprintf(f, "peak_flops_bf16   %.6g   # the CPU target computes in f32: as f32\n", C->peak);
    fprintf(f, "gemm_eff         ");
    for (int i = 0; i < C->ngemm; i++) fprintf(f, " %.6g:%.4f", C->gemm_mnk[i], fmin(1, C->gemm_rate[i] / C->peak));
    fprintf(f, "   # rtk_gemm n^3 =");
    for (int i = 0; i < C->ngemm; i++) fprintf(f, " %.0f^3 %.2f GFLOP/s%s", cbrt(C->gemm_mnk[i]), C->gemm_rate[i] / 1e9, i + 1 < C->ngemm ? "," : "");
    fprintf(f, "\nattn_eff          %.4f   # rtk_attention fwd+bwd causal: %.2f GFLOP/s over the peak\n", fmin(1, C->attn_rate / C->peak),
            C->attn_rate / 1e9);
    fprintf(f, "mem_bw            %.6g   # rtk_layernorm: bytes read + written a second\n", C->elem_bw);
    fprintf(f, "launch_overhead_s %.4g   # (a step of 256 4x4x4 rtk_gemms - a step of 1) / 255\n", C->launch);
    fprintf(f, "h2d_bw            %.6g   # memcpy (the CPU's host copies are memcpys)\n", C->copy_bw);
    fprintf(f, "d2h_bw            %.6g   # as h2d_bw\n", C->copy_bw);
    fprintf(f, "intra_alpha_s     %.4g   # %s\n", C->alpha, C->note_links);
    fprintf(f, "intra_beta        %.6g   # as intra_alpha_s\n", C->beta);
    fprintf(f, "inter_alpha_s     %.4g   # one host: as intra\n", C->alpha);
    fprintf(f, "inter_beta        %.6g   # one host: as intra\n", C->beta);
    fprintf(f, "node_size         %d   # %s\n", C->world > 1 ? C->world : C->base.node_size,
            C->world > 1 ? "the ranks under mpirun" : "from the base profile");
    if (fclose(f) != 0) die("-o: cannot write %s: %s", tmp, strerror(errno));
    Profile back;
    char err[1200];
    if (profile_load(&back, tmp, err, sizeof err) != 0) {
        unlink(tmp);
        die("calibrate: the profile written does not read back: %s", err);
    }
    if (rename(tmp, path) != 0) die("-o: cannot rename %s to %s: %s", tmp, path, strerror(errno));
}

static void usage_die(void) {
    die("usage: kiln calibrate --device cpu|cuda -o FILE.profile [--quick] [--threads N] [--name NAME] [--base PROFILE]");
}

int kiln_calibrate_main(int argc, char **argv) {
    const char *device = NULL, *out = NULL, *name = "cpu-calibrated", *base = "cpu";
    Cal C = {0};
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (strcmp(f, "--quick") == 0) { C.quick = 1; continue; }
        if (i + 1 >= argc) die("calibrate: %s: missing value (or unknown flag)", f);
        if (strcmp(f, "--device") == 0) device = argv[++i];
        else if (strcmp(f, "-o") == 0) out = argv[++i];
        else if (strcmp(f, "--name") == 0) name = argv[++i];
        else if (strcmp(f, "--base") == 0) base = argv[++i];
        else if (strcmp(f, "--threads") == 0) {
            char *e;
            long t = strtol(argv[++i], &e, 10);
            if (*e || t < 1 || t > 1024) die("--threads: expected a whole number in 1..1024, got \"%s\"", argv[i]);
            C.threads = (int)t;
        } else die("calibrate: %s: unknown flag", f);
    }
    if (!device) usage_die();
    if (strcmp(device, "cuda") == 0)
        die("calibrate --device cuda: not available yet (it needs a GPU and the CUDA device's one-kernel programs; "
            "the shipped h100/h200/a100 profiles are datasheets and marked estimates: docs/profiles.md)");
    if (strcmp(device, "cpu") != 0) die("--device: expected cpu or cuda, got \"%s\"", device);
    if (!out) die("calibrate: -o FILE.profile is required");
    if (!*name || strpbrk(name, " \t#") || strlen(name) >= 64) die("--name: expected one word under 64 characters, got \"%s\"", name);
    cmd_check_output("-o", out, NULL, 0);
    char err[1200];
    if (profile_load(&C.base, base, err, sizeof err) != 0) die("--base: %s", err);
    if (C.threads == 0) C.threads = (int)sysconf(_SC_NPROCESSORS_ONLN) > 0 ? (int)sysconf(_SC_NPROCESSORS_ONLN) : 1;
    const char *ws = getenv("OMPI_COMM_WORLD_SIZE"); /* under mpirun: a program of that many (dp) ranks */
    if (ws && atoi(ws) > 1) one_kernel.mesh[1] = atoi(ws);
    rt_options o = {.threads = C.threads};
    rt_ctx *ctx = rt_new(&one_kernel, &o);
    if (!ctx) return 1;
    int inited = 0;
    C.world = 1;
    if (MPI_Initialized(&inited) == MPI_SUCCESS && inited) MPI_Comm_size(MPI_COMM_WORLD, &C.world), MPI_Comm_rank(MPI_COMM_WORLD, &C.rank);
    double t0 = cmd_now();
    measure_gemm(&C, ctx);
    measure_attention(&C, ctx);
    measure_memory(&C, ctx);
    measure_links(&C);
    rt_free(ctx);
    if (C.rank == 0) {
        write_profile(&C, out, name);
        printf("calibrate: %s in %.1f s: sgemm peak %.2f GFLOP/s, attention %.2f GFLOP/s, elementwise %.2f GB/s, memcpy %.2f GB/s, "
               "launch %.3g s, links %.3g s + %.3g GB/s%s\n",
               out, cmd_now() - t0, C.peak / 1e9, C.attn_rate / 1e9, C.elem_bw / 1e9, C.copy_bw / 1e9, C.launch, C.alpha, C.beta / 1e9,
               C.world > 1 ? "" : " (not measured: one rank)");
    }
    return 0;
}
