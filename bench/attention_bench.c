/* attention_bench.c — GFLOP/s of the CPU attention kernels next to OpenBLAS
 * sgemm, measured in the same run (bench/attention.sh builds and runs it).
 *
 *     attention_bench [B H KH T S D causal [threads [reps]]]
 *
 * Default shape: the attention of bench/cpu_vs_torch.sh's GPT (batch 8,
 * 4 heads, seq 256, head dim 64, causal).  Each kernel runs through a real
 * runtime (rt_new on a one-kernel program, rt_step per call, `threads` pool
 * threads, OpenBLAS on as many), so the numbers include the same pool
 * overhead as the trainer.  FLOPs are counted as the compiler counts them
 * for the trainer's GFLOP/s (compiler/emit/emit_host.c): forward 4*B*H*T*S*D
 * (halved when causal), backward 2.5x that.  The sgemm reference is a
 * 1024x1024x1024 cblas_sgemm (the size bench/cpu_vs_torch.sh uses) on the
 * same OpenBLAS as the runtime.
 *
 * The three measurements are interleaved round by round so that machine
 * noise (other processes on the cores) hits them alike; each prints the
 * median over the rounds and the best.
 */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kiln_rt.h"

static rt_kernel cur_kernel;
static int64_t cur_args[32];
static int cur_nargs;

static void one_kernel_step(rt_ctx *c, char *const *spaces) { rt_launch(c, 0, cur_kernel, cur_args, cur_nargs, "k"); }

static const rt_program one_kernel = {.abi_version = RT_ABI_VERSION, .model = "attention_bench", .nstreams = 1,
                                      .step = one_kernel_step};

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* seconds for one rt_step running kernel k on args */
static double timed_step(rt_ctx *ctx, rt_kernel k, const int64_t *args, int n) {
    char err[512];
    cur_kernel = k;
    cur_nargs = n;
    memcpy(cur_args, args, sizeof(int64_t) * (size_t)n);
    double t0 = now();
    if (rt_step(ctx, err, sizeof err) != 0) {
        fprintf(stderr, "attention_bench: kernel failed: %s\n", err);
        exit(1);
    }
    return now() - t0;
}

static float *randn(int64_t n, uint32_t seed, float scale) {
    float *x = malloc(sizeof(float) * (size_t)(n ? n : 1));
    if (!x) {
        fprintf(stderr, "attention_bench: out of memory\n");
        exit(1);
    }
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = ((float)(seed >> 8) * (2.0f / 16777216.0f) - 1) * scale;
    }
    return x;
}

/* 1024^3 sgemm on OpenBLAS's own threads (as the runtime configured them) */
static double time_sgemm(const float *a, const float *b, float *c, int n) {
    double t0 = now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
    return now() - t0;
}

static int cmp_double(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

static void report(const char *what, double *sec, int reps, double flops) {
    qsort(sec, (size_t)reps, sizeof *sec, cmp_double);
    double med = sec[reps / 2], best = sec[0];
    printf("%-34s %8.1f GFLOP/s median  %8.1f best  (%.3f ms median)\n", what, flops / med * 1e-9,
           flops / best * 1e-9, med * 1e3);
}

int main(int argc, char **argv) {
    int64_t dims[7] = {8, 4, 4, 256, 256, 64, 1}; /* B H KH T S D causal */
    if (argc != 1 && argc < 8) {
        fprintf(stderr, "usage: attention_bench [B H KH T S D causal [threads [reps]]]\n");
        return 1;
    }
    for (int i = 1; i < argc && i <= 7; i++) dims[i - 1] = atoll(argv[i]);
    int threads = argc > 8 ? atoi(argv[8]) : 0, reps = argc > 9 ? atoi(argv[9]) : 30;
    int64_t B = dims[0], H = dims[1], KH = dims[2], T = dims[3], S = dims[4], D = dims[5], causal = dims[6];
    if (B < 1 || H < 1 || KH < 1 || H % KH || T < 1 || S < 1 || D < 1 || reps < 1) {
        fprintf(stderr, "attention_bench: bad shape (need positive sizes, H a multiple of KH)\n");
        return 1;
    }
    rt_options o = {.threads = threads};
    rt_ctx *ctx = rt_new(&one_kernel, &o);
    if (!ctx) return 1;

    int64_t nq = B * H * T * D, nk = B * KH * S * D, nl = B * H * T;
    float *q = randn(nq, 1, 1), *k = randn(nk, 2, 1), *v = randn(nk, 3, 1), *dO = randn(nq, 4, 1);
    float *out = randn(nq, 5, 1), *lse = randn(nl, 6, 1), *dq = randn(nq, 7, 1), *dk = randn(nk, 8, 1),
          *dv = randn(nk, 9, 1);
    double scale = 1 / sqrt((double)D);
    int64_t fwd[] = {rt_ptr_arg(q), rt_ptr_arg(k), rt_ptr_arg(v), rt_ptr_arg(out), rt_ptr_arg(lse), B, H, KH, T, S, D,
                     causal, rt_f64_bits(scale), 0, 0, 0}; /* no positions: 0..T-1, 0..S-1; no window */
    int64_t bwd[] = {rt_ptr_arg(dO), rt_ptr_arg(q),   rt_ptr_arg(k),  rt_ptr_arg(v),  rt_ptr_arg(out), rt_ptr_arg(lse),
                     rt_ptr_arg(dq), rt_ptr_arg(dk),  rt_ptr_arg(dv), B,              H,               KH,
                     T,              S,               D,              causal,         rt_f64_bits(scale),
                     0,              0,               0};
    int n = 1024;
    float *ga = randn((int64_t)n * n, 10, 1), *gb = randn((int64_t)n * n, 11, 1), *gc = randn((int64_t)n * n, 12, 1);

    double fl = 4.0 * (double)B * (double)H * (double)T * (double)S * (double)D * (causal ? 0.5 : 1);
    double *tf = malloc(sizeof(double) * (size_t)reps), *tb = malloc(sizeof(double) * (size_t)reps),
           *tg = malloc(sizeof(double) * (size_t)reps);
    if (!tf || !tb || !tg) return 1;
    for (int w = 0; w < 2; w++) { /* warm-up: page faults, pool start, OpenBLAS buffers */
        timed_step(ctx, rtk_attention, fwd, 16);
        timed_step(ctx, rtk_attention_bwd, bwd, 20);
        time_sgemm(ga, gb, gc, n);
    }
    for (int r = 0; r < reps; r++) {
        tf[r] = timed_step(ctx, rtk_attention, fwd, 16);
        tb[r] = timed_step(ctx, rtk_attention_bwd, bwd, 20);
        tg[r] = time_sgemm(ga, gb, gc, n);
    }
    printf("attention B%lld H%lld KH%lld T%lld S%lld D%lld%s, threads %s, %d rounds\n", (long long)B, (long long)H,
           (long long)KH, (long long)T, (long long)S, (long long)D, causal ? " causal" : "",
           threads > 0 ? argv[8] : "= cores", reps);
    report("sgemm 1024^3 (OpenBLAS)", tg, reps, 2.0 * n * n * (double)n);
    double sg_med = 2.0 * n * n * (double)n / tg[reps / 2];
    report("attention forward", tf, reps, fl);
    double f_med = fl / tf[reps / 2];
    report("attention backward", tb, reps, 2.5 * fl);
    double b_med = 2.5 * fl / tb[reps / 2];
    printf("%-34s %8.0f%% fwd  %5.0f%% bwd  %5.0f%% fwd+bwd\n", "median / sgemm median", 100 * f_med / sg_med,
           100 * b_med / sg_med, 100 * (3.5 * fl / (tf[reps / 2] + tb[reps / 2])) / sg_med);
    rt_free(ctx);
    free(q), free(k), free(v), free(dO), free(out), free(lse), free(dq), free(dk), free(dv);
    free(ga), free(gb), free(gc), free(tf), free(tb), free(tg);
    return 0;
}
