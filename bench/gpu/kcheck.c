/* kcheck.c — every CUDA library kernel against its CPU twin, on random data.
 *
 * What it checks.  kiln_rt.h promises that a library kernel means the same
 * thing on both devices: rt_launch(rtk_X, args) with the same argument
 * array (pointers aside, and the dtype fields, which the CPU takes as f32)
 * gives the same result on the CPU (kernels/cpu) and on CUDA (the launcher
 * in runtime/cuda/kernels_cuda.c, which runs kernels/cuda/ *.cu or cuBLASLt).
 * kcheck holds each CUDA launcher to that: for every case it draws fresh
 * random inputs, rounds them to the GPU's dtype (bf16 activations, f32
 * statistics, i32 ids) so that both devices see exactly the same values,
 * runs the CPU twin on them in f32, runs the CUDA launcher through the real
 * runtime (rt_new, rt_push, rt_step, rt_pull: the same path as a trainer,
 * CUDA graph included), and compares.
 *
 * Why the launchers and not raw cuLaunchKernel: the launcher is the unit the
 * compiler relies on.  Its grid, block, shared memory, scratch and argument
 * order are where a kernel file and the runtime can disagree, and a raw
 * harness would have to restate all of that (and could restate it wrongly in
 * the same way); through rt_launch one case table drives both devices with
 * one argument layout, cuBLASLt GEMMs and the misc kernels included.  A
 * failure names the rtk_* kernel; kernels/cuda/README.md then says which
 * .cu kernels it launches.
 *
 * How a case runs on the GPU.  Each case builds its own rt_program: one
 * activation space holding its tensors (256-byte aligned, each followed by
 * a guard of at least 256 bytes), one stream, the library cubins
 * (bench/gpu/prepare.sh writes them with the compiler's own NVRTC call and
 * options, so they are the cubins a trainer embeds), and a step function
 * that launches the one kernel.  Before the step the host mirror is staged:
 * inputs, outputs poisoned with a NaN whose payload no arithmetic produces
 * (f32 0x7fbadbad, bf16 0x7fbd; i32 outputs 0x7fbadbad; byte-copy outputs
 * 0xff bytes), guards 0xa5.  After it: every output element must have been
 * written (no poison left), no guard byte and no input may have changed, and
 * every output element must agree with the twin:
 *     |gpu - cpu| <= rtol |cpu| + atol * rms(cpu)
 * with both NaN, or both the same infinity, counting as equal; and the
 * normwise error ||gpu - cpu|| / ||cpu|| <= nrel.  Tolerances (per output):
 *     bf16 outputs:  rtol 1/128, atol 1/128, nrel 1e-2  (two bf16 ulps; one
 *                    rounding is 1/512; METHOD.md's 1e-3..1e-2 for bf16)
 *     f32 outputs:   rtol 1e-3, atol 1e-3, nrel 1e-3    (f32 math on bf16
 *                    inputs; sums in another order)
 *     elementwise f32 (adamw, lr_cosine, clipscale): 1e-5, 1e-6, 1e-5
 *     i32 and byte copies: bit for bit.
 * The step is then run a second time with the same inputs (the first run
 * captures the CUDA graph, the second replays it; with KILN_NO_GRAPH=1 both
 * run eagerly), and the outputs must be the same bits: the kernels promise
 * determinism (README.md: no float atomics, fixed summation orders).
 *
 * The CPU twins are kernels/cpu/ *.c compiled with their rtk_* names, and
 * rt_fail / rt_parallel_for, renamed by -D (prepare.sh: -Drtk_X=cpu_rtk_X),
 * so they link beside the CUDA runtime's rtk_*; kcheck provides the renamed
 * rt_fail (records the message) and rt_parallel_for (pthreads).  The GEMM's
 * twin is kcheck's own f64-accumulated product, not kernels/cpu/gemm.c
 * (OpenBLAS is not on the GPU machine, and a naive f64 reference is the
 * better judge anyway).  cuDNN's attention (rtk_attention_cudnn and
 * _bwd_cudnn, the args of rtk_attention) is checked against the same twins
 * on the shapes it accepts, in full-size runs only (the fake CUDA stack has
 * no cuDNN).  Not checked here: the collectives (NCCL; one rank has none),
 * rtk_iota_rank and rtk_fused (generated kernels): the training runs of
 * check.sh cover them.
 *
 * usage: kcheck --cubins DIR [--arch sm_90] [--small] [--seed N] [--only SUBSTR] [--list]
 *        kcheck --cpu [--small] ...
 *   --small: shapes a few hundred times smaller (for the fake CUDA stack of
 *   tests/cuda_fake, which runs the kernels on the host emulator).
 *   --cpu: a self-test of this harness alone, linked with the CPU runtime
 *   (libkilnrt.a) instead of the CUDA one: the "GPU" side is kiln's CPU
 *   device, every tensor f32, so every case must pass (the twins are the
 *   same code; the GEMM is OpenBLAS against the f64 reference).
 * Output: TAP ("ok N - case: details" / "not ok N - case: why"; a cuDNN
 * case whose library is older than the graphs need: "ok N - case # SKIP
 * why"), then "kcheck: P passed, F failed" (", S skipped" when any); exit
 * status 1 when any case failed, 2 on a usage or setup error.
 */
#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kiln_rt.h"

/* ---- the CPU twins (kernels/cpu, renamed at compile time) ---- */
#define TWINS(X)                                                                                                          \
    X(layernorm) X(layernorm_bwd) X(rmsnorm) X(rmsnorm_bwd) X(softmax) X(softmax_bwd) X(rope) X(attention)             \
    X(attention_bwd) X(attn_merge) X(embedding) X(embedding_bwd) X(cross_entropy) X(cross_entropy_bwd) X(adamw)        \
    X(lr_cosine) X(clipscale) X(reduce) X(max_bwd) X(sumsq) X(copy) X(sumto) X(fill) X(iota) X(memcpy)
#define DECLARE_TWIN(k) void cpu_rtk_##k(rt_ctx *ctx, const int64_t *a);
TWINS(DECLARE_TWIN)

/* The twins' rt_fail: remember the first message. */
static char twin_error[512];
void kc_cpu_fail(rt_ctx *ctx, const char *fmt, ...) {
    (void)ctx;
    if (twin_error[0]) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(twin_error, sizeof twin_error, fmt, ap);
    va_end(ap);
}

/* The twins' rt_parallel_for: contiguous chunks on up to 16 threads. */
typedef struct {
    void (*fn)(void *, int64_t, int64_t);
    void *data;
    int64_t i0, i1;
} Chunk;

static void *run_chunk(void *p) {
    Chunk *c = p;
    c->fn(c->data, c->i0, c->i1);
    return NULL;
}

static int cpu_threads = 1;

void kc_cpu_parallel_for(rt_ctx *ctx, int64_t n, void (*fn)(void *, int64_t, int64_t), void *data) {
    (void)ctx;
    int t = n < cpu_threads ? (int)n : cpu_threads;
    if (t <= 1) {
        if (n > 0) fn(data, 0, n);
        return;
    }
    pthread_t th[16];
    Chunk ch[16];
    int started = 0;
    for (int k = 0; k < t; k++) {
        ch[k] = (Chunk){fn, data, n * k / t, n * (k + 1) / t};
        if (k > 0 && pthread_create(&th[k], NULL, run_chunk, &ch[k]) == 0) started |= 1 << k;
        else if (k > 0) run_chunk(&ch[k]); /* no thread: run it here */
    }
    run_chunk(&ch[0]);
    for (int k = 1; k < t; k++)
        if (started & (1 << k)) pthread_join(th[k], NULL);
}

/* ---- numbers ---- */

static uint64_t rng_next(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double rng_unif(uint64_t *s) { return (double)(rng_next(s) >> 11) * 0x1p-53; }
/* Box-Muller, both values used (the draw is single-threaded; run_case
 * clears `have` so a case's inputs depend on its seed alone) */
static double spare;
static int have;
static double rng_normal(uint64_t *s) {
    if (have) {
        have = 0;
        return spare;
    }
    double u = rng_unif(s), v = rng_unif(s), r = sqrt(-2 * log(u > 0 ? u : 0x1p-60));
    spare = r * sin(2 * M_PI * v), have = 1;
    return r * cos(2 * M_PI * v);
}

static uint16_t f2bf(float f) { /* round to nearest even; NaN stays NaN */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}
static float bf2f(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static float round_dt(float x, int dt) { return dt == RT_BF16 ? bf2f(f2bf(x)) : x; }

/* ---- cases ---- */

enum { IN, OUT, INOUT };
enum { INIT_NORMAL, INIT_UNIFORM, INIT_INTS, INIT_BYTES, INIT_PREP /* the case's prep fills it */ };

typedef struct {
    double rtol, atol, nrel; /* see the essay; all 0: bit for bit */
} Tol;
static const Tol TOL_BF16 = {1.0 / 128, 1.0 / 128, 1e-2}, TOL_F32 = {1e-3, 1e-3, 1e-3}, TOL_TIGHT = {1e-5, 1e-6, 1e-5},
                 TOL_EXACT = {0, 0, 0};
/* the tensor-core attention's lse against its rounding twin (below): lse =
 * m + log l, l the sum of the ROUNDED p, the same in both up to the
 * kernel's f32 arithmetic (its scores are f32 sums of 64 products), so 20x
 * tighter than TOL_F32.  On the emulator (the GPU seed of 2026-12-04): the
 * kernel at most 0.18 of it (T = 1024); a copy whose l sums the unrounded p
 * (o / l then not the weights P v used; o moves less than its own
 * tolerance) 2 to 33 of it in every case, while the exact twin at TOL_F32
 * passed that copy. */
static const Tol TOL_LSE_TC = {5e-5, 5e-6, 5e-5};

typedef struct {
    const char *name;
    int role;
    int dt;      /* on the GPU: RT_F32, RT_BF16 or RT_I32 */
    int eb;      /* > 0: raw bytes of eb each (copies), the twin sees the same bytes */
    int64_t n;   /* elements */
    int init;
    double a, b; /* normal(a, b), uniform [a, b), ints [a, b) */
    Tol tol;
    /* at run time */
    int64_t off;  /* bytes into the activation space */
    void *in;     /* inputs and INOUT's initial values: f32, i32 or raw bytes */
    void *out;    /* outputs: the twin's result, same representation */
} Ten;

typedef struct Case Case;
typedef int (*ArgsFn)(const Case *c, void *const *p, int gpu, int64_t *a);
struct Case {
    char name[128];
    rt_kernel gpu, cpu;
    ArgsFn args;
    void (*prep)(Case *c); /* derived inputs, after the random draw */
    int nt;
    Ten t[12];
    int64_t p[20];
    double d[4];
    rt_schedule sched;
};

static Case *cases;
static int ncases, capcases;

static Case *new_case(rt_kernel gpu, rt_kernel cpu, ArgsFn args, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static Case *new_case(rt_kernel gpu, rt_kernel cpu, ArgsFn args, const char *fmt, ...) {
    if (ncases == capcases) {
        capcases = capcases ? 2 * capcases : 64;
        cases = realloc(cases, (size_t)capcases * sizeof *cases);
        if (!cases) {
            fprintf(stderr, "kcheck: out of memory\n");
            exit(2);
        }
    }
    Case *c = &cases[ncases++];
    memset(c, 0, sizeof *c);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->name, sizeof c->name, fmt, ap);
    va_end(ap);
    c->gpu = gpu, c->cpu = cpu, c->args = args;
    return c;
}

/* --cpu: the "GPU" side runs on kiln's CPU device, everything f32 */
static int on_cpu;

static int ten(Case *c, const char *name, int role, int dt, int64_t n, int init, double a, double b) {
    Ten *t = &c->t[c->nt];
    if (on_cpu && dt == RT_BF16) dt = RT_F32;
    *t = (Ten){.name = name, .role = role, .dt = dt, .n = n, .init = init, .a = a, .b = b};
    t->tol = dt == RT_BF16 ? TOL_BF16 : dt == RT_F32 ? TOL_F32 : TOL_EXACT;
    return c->nt++;
}
/* a tensor of raw elements of eb bytes (copies: compared bit for bit) */
static int raw(Case *c, const char *name, int role, int eb, int64_t n) {
    int k = ten(c, name, role, RT_I32, n, INIT_BYTES, 0, 0);
    c->t[k].eb = eb;
    c->t[k].tol = TOL_EXACT;
    return k;
}

static int64_t gpu_bytes(const Ten *t) { return t->n * (t->eb ? t->eb : t->dt == RT_BF16 ? 2 : 4); }
static int64_t host_bytes(const Ten *t) { return t->n * (t->eb ? t->eb : 4); }

/* argument helpers: P(k) the tensor's pointer on this device; DT(k) its dtype
 * there (the CPU computes in f32) */
#define P(k) rt_ptr_arg(p[k])
#define DT(k) (gpu ? c->t[k].dt : RT_F32)
#define F(x) rt_f64_bits(x)

static int put(int64_t *a, const int64_t *v, int n) {
    memcpy(a, v, (size_t)n * sizeof *v);
    return n;
}
#define PUT(...)                                                                                      \
    do {                                                                                              \
        const int64_t v_[] = {__VA_ARGS__};                                                           \
        return put(a, v_, (int)(sizeof v_ / sizeof v_[0]));                                           \
    } while (0)

/* ---- GEMM: the reference is a product accumulated in f64 ---- */

typedef struct {
    const float *At, *Bt; /* [M][K] and [N][K] */
    float *C;
    int64_t M, N, K;
    int beta;
} GemmJob;

static void gemm_rows(void *data, int64_t i0, int64_t i1) {
    const GemmJob *g = data;
    for (int64_t i = i0; i < i1; i++)
        for (int64_t j = 0; j < g->N; j++) {
            const float *x = g->At + i * g->K, *y = g->Bt + j * g->K;
            double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
            int64_t k = 0;
            for (; k + 4 <= g->K; k += 4) {
                s0 += (double)x[k] * y[k];
                s1 += (double)x[k + 1] * y[k + 1];
                s2 += (double)x[k + 2] * y[k + 2];
                s3 += (double)x[k + 3] * y[k + 3];
            }
            for (; k < g->K; k++) s0 += (double)x[k] * y[k];
            double s = (s0 + s1) + (s2 + s3);
            float *o = &g->C[i * g->N + j];
            *o = (float)(g->beta ? *o + s : s);
        }
}

/* args: A, B, C, batch, M, N, K, ta, tb, strideA, strideB, strideC, beta, dtA, dtB, dtC (f32 here) */
static void ref_gemm(rt_ctx *ctx, const int64_t *a) {
    const float *A = rt_arg_ptr(a[0]), *B = rt_arg_ptr(a[1]);
    float *C = rt_arg_ptr(a[2]);
    int64_t batch = a[3], M = a[4], N = a[5], K = a[6], ta = a[7], tb = a[8], sA = a[9], sB = a[10], sC = a[11];
    float *At = malloc(sizeof(float) * (size_t)(M * K + 1)), *Bt = malloc(sizeof(float) * (size_t)(N * K + 1));
    if (!At || !Bt) {
        kc_cpu_fail(ctx, "gemm reference: out of memory");
        free(At), free(Bt);
        return;
    }
    for (int64_t b = 0; b < batch; b++) {
        const float *Ab = A + b * sA, *Bb = B + b * sB;
        for (int64_t i = 0; i < M; i++)
            for (int64_t k = 0; k < K; k++) At[i * K + k] = ta ? Ab[k * M + i] : Ab[i * K + k];
        for (int64_t j = 0; j < N; j++)
            for (int64_t k = 0; k < K; k++) Bt[j * K + k] = tb ? Bb[j * K + k] : Bb[k * N + j];
        GemmJob g = {At, Bt, C + b * sC, M, N, K, rt_bits_f64(a[12]) != 0};
        kc_cpu_parallel_for(ctx, M, gemm_rows, &g);
    }
    free(At), free(Bt);
}

static int args_gemm(const Case *c, void *const *p, int gpu, int64_t *a) {
    const int64_t *q = c->p;
    PUT(P(0), P(1), P(2), q[0], q[1], q[2], q[3], q[4], q[5], q[6], q[7], q[8], F(c->d[0]), DT(0), DT(1), DT(2));
}

/* C[b] = op(A[b]) op(B[b]) (+ C with beta 1); sA/sB 0 share one matrix */
static void add_gemm(int64_t batch, int64_t M, int64_t N, int64_t K, int ta, int tb, int shareB, int beta, int dtC) {
    Case *c = new_case(rtk_gemm, ref_gemm, args_gemm, "gemm batch=%lld %lldx%lldx%lld ta=%d tb=%d%s beta=%d C=%s",
                       (long long)batch, (long long)M, (long long)N, (long long)K, ta, tb, shareB ? " sharedB" : "", beta,
                       dtC == RT_F32 ? "f32" : "bf16");
    int64_t sA = M * K, sB = shareB ? 0 : K * N, sC = M * N;
    ten(c, "A", IN, RT_BF16, batch * sA, INIT_NORMAL, 0, 1);
    ten(c, "B", IN, RT_BF16, shareB ? K * N : batch * sB, INIT_NORMAL, 0, 1);
    ten(c, "C", beta ? INOUT : OUT, dtC, batch * sC, INIT_NORMAL, 0, 4);
    int64_t q[] = {batch, M, N, K, ta, tb, batch > 1 ? sA : 0, sB, sC};
    memcpy(c->p, q, sizeof q);
    c->d[0] = beta;
}

/* rtk_gemm_bias (--gemm-epilogue bias, cuBLASLt's BIAS epilogue; weak: the
 * CPU runtime has none): the reference product, then + bias[j] on every
 * row.  args: rtk_gemm's 16, then bias */
#pragma weak rtk_gemm_bias
static void ref_gemm_bias(rt_ctx *ctx, const int64_t *a) {
    ref_gemm(ctx, a);
    float *C = rt_arg_ptr(a[2]);
    const float *bias = rt_arg_ptr(a[16]);
    for (int64_t r = 0; r < a[3] * a[4]; r++)
        for (int64_t j = 0; j < a[5]; j++) C[r * a[5] + j] += bias[j];
}
static int args_gemm_bias(const Case *c, void *const *p, int gpu, int64_t *a) {
    const int64_t *q = c->p;
    PUT(P(0), P(1), P(2), q[0], q[1], q[2], q[3], q[4], q[5], q[6], q[7], q[8], F(0), DT(0), DT(1), DT(2), P(3));
}

static void add_gemm_bias(int64_t batch, int64_t M, int64_t N, int64_t K, int ta, int tb) {
    Case *c = new_case(rtk_gemm_bias, ref_gemm_bias, args_gemm_bias, "gemm_bias batch=%lld %lldx%lldx%lld ta=%d tb=%d C=bf16",
                       (long long)batch, (long long)M, (long long)N, (long long)K, ta, tb);
    ten(c, "A", IN, RT_BF16, batch * M * K, INIT_NORMAL, 0, 1);
    ten(c, "B", IN, RT_BF16, K * N, INIT_NORMAL, 0, 1);
    ten(c, "C", OUT, RT_BF16, batch * M * N, 0, 0, 0);
    ten(c, "bias", IN, RT_BF16, N, INIT_NORMAL, 0, 4);
    int64_t q[] = {batch, M, N, K, ta, tb, batch > 1 ? M * K : 0, 0, M * N};
    memcpy(c->p, q, sizeof q);
}

/* ---- norms ---- */

static int args_layernorm(const Case *c, void *const *p, int gpu, int64_t *a) {
    PUT(P(0), P(1), P(2), P(3), c->p[0], c->p[1], F(c->d[0]));
}
static int args_layernorm_bwd(const Case *c, void *const *p, int gpu, int64_t *a) {
    PUT(P(0), P(1), P(2), P(3), P(4), P(5), c->p[0], c->p[1], F(c->d[0]));
}
static int args_rmsnorm(const Case *c, void *const *p, int gpu, int64_t *a) { PUT(P(0), P(1), P(2), c->p[0], c->p[1], F(c->d[0])); }
static int args_rmsnorm_bwd(const Case *c, void *const *p, int gpu, int64_t *a) {
    PUT(P(0), P(1), P(2), P(3), P(4), c->p[0], c->p[1], F(c->d[0]));
}

static void add_norms(int64_t rows, int64_t C) {
    Case *c = new_case(rtk_layernorm, cpu_rtk_layernorm, args_layernorm, "layernorm rows=%lld C=%lld", (long long)rows,
                       (long long)C);
    ten(c, "x", IN, RT_BF16, rows * C, INIT_NORMAL, 0.5, 2);
    ten(c, "w", IN, RT_BF16, C, INIT_NORMAL, 1, 0.2);
    ten(c, "b", IN, RT_BF16, C, INIT_NORMAL, 0, 0.2);
    ten(c, "y", OUT, RT_BF16, rows * C, 0, 0, 0);
    c->p[0] = rows, c->p[1] = C, c->d[0] = 1e-5;

    c = new_case(rtk_layernorm_bwd, cpu_rtk_layernorm_bwd, args_layernorm_bwd, "layernorm_bwd rows=%lld C=%lld",
                 (long long)rows, (long long)C);
    ten(c, "dy", IN, RT_BF16, rows * C, INIT_NORMAL, 0, 1);
    ten(c, "x", IN, RT_BF16, rows * C, INIT_NORMAL, 0.5, 2);
    ten(c, "w", IN, RT_BF16, C, INIT_NORMAL, 1, 0.2);
    ten(c, "dx", OUT, RT_BF16, rows * C, 0, 0, 0);
    ten(c, "dw", OUT, RT_F32, C, 0, 0, 0);
    ten(c, "db", OUT, RT_F32, C, 0, 0, 0);
    c->p[0] = rows, c->p[1] = C, c->d[0] = 1e-5;

    c = new_case(rtk_rmsnorm, cpu_rtk_rmsnorm, args_rmsnorm, "rmsnorm rows=%lld C=%lld", (long long)rows, (long long)C);
    ten(c, "x", IN, RT_BF16, rows * C, INIT_NORMAL, 0.5, 2);
    ten(c, "w", IN, RT_BF16, C, INIT_NORMAL, 1, 0.2);
    ten(c, "y", OUT, RT_BF16, rows * C, 0, 0, 0);
    c->p[0] = rows, c->p[1] = C, c->d[0] = 1e-6;

    c = new_case(rtk_rmsnorm_bwd, cpu_rtk_rmsnorm_bwd, args_rmsnorm_bwd, "rmsnorm_bwd rows=%lld C=%lld", (long long)rows,
                 (long long)C);
    ten(c, "dy", IN, RT_BF16, rows * C, INIT_NORMAL, 0, 1);
    ten(c, "x", IN, RT_BF16, rows * C, INIT_NORMAL, 0.5, 2);
    ten(c, "w", IN, RT_BF16, C, INIT_NORMAL, 1, 0.2);
    ten(c, "dx", OUT, RT_BF16, rows * C, 0, 0, 0);
    ten(c, "dw", OUT, RT_F32, C, 0, 0, 0);
    c->p[0] = rows, c->p[1] = C, c->d[0] = 1e-6;
}

/* ---- softmax ---- */

static int args_softmax(const Case *c, void *const *p, int gpu, int64_t *a) { PUT(P(0), P(1), c->p[0], c->p[1], DT(0)); }
static int args_softmax_bwd(const Case *c, void *const *p, int gpu, int64_t *a) {
    PUT(P(0), P(1), P(2), c->p[0], c->p[1], DT(0));
}

/* y of the backward is a softmax output (rows summing to 1) */
static void prep_softmax_bwd(Case *c) {
    Ten *y = &c->t[1];
    float *x = malloc(sizeof(float) * (size_t)(y->n + 1));
    uint64_t s = (uint64_t)c->p[2];
    for (int64_t i = 0; i < y->n; i++) x[i] = (float)(3 * rng_normal(&s));
    int64_t a[] = {rt_ptr_arg(x), rt_ptr_arg(y->in), c->p[0], c->p[1], RT_F32};
    cpu_rtk_softmax(NULL, a);
    for (int64_t i = 0; i < y->n; i++) ((float *)y->in)[i] = round_dt(((float *)y->in)[i], y->dt);
    free(x);
}

static void add_softmax(int64_t rows, int64_t C, int dt) {
    const char *dn = dt == RT_BF16 ? "bf16" : "f32";
    Case *c = new_case(rtk_softmax, cpu_rtk_softmax, args_softmax, "softmax rows=%lld C=%lld %s", (long long)rows, (long long)C, dn);
    ten(c, "x", IN, dt, rows * C, INIT_NORMAL, 0, 3);
    ten(c, "y", OUT, dt, rows * C, 0, 0, 0);
    c->p[0] = rows, c->p[1] = C;
    c = new_case(rtk_softmax_bwd, cpu_rtk_softmax_bwd, args_softmax_bwd, "softmax_bwd rows=%lld C=%lld %s", (long long)rows,
                 (long long)C, dn);
    ten(c, "dy", IN, dt, rows * C, INIT_NORMAL, 0, 1);
    ten(c, "y", IN, dt, rows * C, INIT_PREP, 0, 0);
    ten(c, "dx", OUT, dt, rows * C, 0, 0, 0);
    c->p[0] = rows, c->p[1] = C, c->p[2] = (int64_t)(rows * 7919 + C);
    c->prep = prep_softmax_bwd;
}

/* ---- rope ---- */

static int args_rope(const Case *c, void *const *p, int gpu, int64_t *a) {
    PUT(P(0), P(1), P(2), c->p[0], c->p[1], c->p[2], c->p[3], F(c->d[0]), c->p[4]);
}

static void add_rope(int64_t B, int64_t T, int64_t H, int64_t D, double theta, int sign) {
    Case *c = new_case(rtk_rope, cpu_rtk_rope, args_rope, "rope B=%lld T=%lld H=%lld D=%lld theta=%g sign=%+d", (long long)B,
                       (long long)T, (long long)H, (long long)D, theta, sign);
    ten(c, "x", IN, RT_BF16, B * T * H * D, INIT_NORMAL, 0, 1);
    ten(c, "pos", IN, RT_I32, T, INIT_INTS, 0, 8192); /* any positions (context parallel) */
    ten(c, "y", OUT, RT_BF16, B * T * H * D, 0, 0, 0);
    int64_t q[] = {B, T, H, D, sign};
    memcpy(c->p, q, sizeof q);
    c->d[0] = theta;
}

/* ---- attention ---- */

/* p: B, H, KH, T, S, D, causal, positions (0 none, 1 given), window (0 none) */
enum { AT_B, AT_H, AT_KH, AT_T, AT_S, AT_D, AT_CAUSAL, AT_POS, AT_WIN };

static int args_attention(const Case *c, void *const *p, int gpu, int64_t *a) {
    const int64_t *q = c->p;
    int pos = (int)q[AT_POS];
    PUT(P(0), P(1), P(2), P(3), P(4), q[AT_B], q[AT_H], q[AT_KH], q[AT_T], q[AT_S], q[AT_D], q[AT_CAUSAL], F(c->d[0]),
        pos ? P(5) : 0, pos ? P(6) : 0, q[AT_WIN]);
}
static int args_attention_bwd(const Case *c, void *const *p, int gpu, int64_t *a) {
    const int64_t *q = c->p;
    int pos = (int)q[AT_POS];
    PUT(P(0), P(1), P(2), P(3), P(4), P(5), P(6), P(7), P(8), q[AT_B], q[AT_H], q[AT_KH], q[AT_T], q[AT_S], q[AT_D],
        q[AT_CAUSAL], F(c->d[0]), pos ? P(9) : 0, pos ? P(10) : 0, q[AT_WIN]);
}

/* Positions of a context-parallel rank: queries are chunks 0 and 3 of a
 * sequence of 2T in 4 (the dual layout, cp 2, rank 0), keys the whole
 * sequence of S = 2T in a shuffled order. */
static void fill_positions(int32_t *qpos, int64_t T, int32_t *kpos, int64_t S, uint64_t seed) {
    int64_t h = T / 2;
    for (int64_t t = 0; t < T; t++) qpos[t] = (int32_t)(t < h ? t : 3 * h + (t - h));
    for (int64_t s = 0; s < S; s++) kpos[s] = (int32_t)s;
    for (int64_t s = S - 1; s > 0; s--) {
        int64_t r = (int64_t)(rng_next(&seed) % (uint64_t)(s + 1));
        int32_t x = kpos[s];
        kpos[s] = kpos[r], kpos[r] = x;
    }
}

static void prep_attention(Case *c) {
    if (c->p[AT_POS]) fill_positions(c->t[5].in, c->p[AT_T], c->t[6].in, c->p[AT_S], (uint64_t)c->p[AT_T] * 31);
}

/* o and lse of the backward's inputs are the forward's on the same q, k, v */
static void prep_attention_bwd(Case *c) {
    const int64_t *q = c->p;
    int pos = (int)q[AT_POS];
    if (pos) fill_positions(c->t[9].in, q[AT_T], c->t[10].in, q[AT_S], (uint64_t)q[AT_T] * 31);
    Ten *o = &c->t[4], *lse = &c->t[5];
    int64_t a[] = {rt_ptr_arg(c->t[1].in), rt_ptr_arg(c->t[2].in), rt_ptr_arg(c->t[3].in), rt_ptr_arg(o->in),
                   rt_ptr_arg(lse->in), q[AT_B], q[AT_H], q[AT_KH], q[AT_T], q[AT_S], q[AT_D], q[AT_CAUSAL],
                   F(c->d[0]), pos ? rt_ptr_arg(c->t[9].in) : 0, pos ? rt_ptr_arg(c->t[10].in) : 0, q[AT_WIN]};
    cpu_rtk_attention(NULL, a);
    for (int64_t i = 0; i < o->n; i++) ((float *)o->in)[i] = round_dt(((float *)o->in)[i], o->dt);
}

/* the CUDA runtime's cuDNN attention (attn_cudnn.c, --attention cudnn): the
 * args of rtk_attention(_bwd); weak, as the CPU runtime (--cpu) has none */
#pragma weak rtk_attention_cudnn
#pragma weak rtk_attention_bwd_cudnn
/* the tensor-core attention (attention_tc.cu, --attention tc; issue 23):
 * weak for the same reason */
#pragma weak rtk_attention_tc
#pragma weak rtk_attention_bwd_tc

static void tc_twin_attention(rt_ctx *ctx, const int64_t *a);
static void tc_twin_attention_bwd(rt_ctx *ctx, const int64_t *a);
static void *xmalloc(size_t n);

/* fwd, bwd: the launchers under test; what: "", " (cudnn)" or " (tc)" (whose
 * twins round P as the kernel does: tc_twin_attention below) */
static void add_attention_with(rt_kernel fwd, rt_kernel bwd, const char *what, int64_t B, int64_t H, int64_t KH, int64_t T,
                               int64_t S, int64_t D, int causal, int pos, int64_t window) {
    int64_t q[] = {B, H, KH, T, S, D, causal, pos, window};
    char shape[160], win[32] = "";
    if (window) snprintf(win, sizeof win, " window %lld", (long long)window);
    snprintf(shape, sizeof shape, "B=%lld H=%lld KH=%lld T=%lld S=%lld D=%lld%s%s%s%s", (long long)B, (long long)H,
             (long long)KH, (long long)T, (long long)S, (long long)D, causal ? " causal" : "", pos ? " positions" : "",
             win, what);
    const int tc = strstr(what, "(tc)") != NULL;
    Case *c = new_case(fwd, tc ? tc_twin_attention : cpu_rtk_attention, args_attention, "attention %s", shape);
    ten(c, "q", IN, RT_BF16, B * H * T * D, INIT_NORMAL, 0, 1);
    ten(c, "k", IN, RT_BF16, B * KH * S * D, INIT_NORMAL, 0, 1);
    ten(c, "v", IN, RT_BF16, B * KH * S * D, INIT_NORMAL, 0, 1);
    ten(c, "o", OUT, RT_BF16, B * H * T * D, 0, 0, 0);
    ten(c, "lse", OUT, RT_F32, B * H * T, 0, 0, 0);
    ten(c, "qpos", IN, RT_I32, pos ? T : 0, INIT_PREP, 0, 0);
    ten(c, "kpos", IN, RT_I32, pos ? S : 0, INIT_PREP, 0, 0);
    memcpy(c->p, q, sizeof q);
    c->d[0] = 1 / sqrt((double)D);
    c->prep = prep_attention;
    if (tc) c->t[4].tol = TOL_LSE_TC;

    c = new_case(bwd, tc ? tc_twin_attention_bwd : cpu_rtk_attention_bwd, args_attention_bwd, "attention_bwd %s", shape);
    ten(c, "do", IN, RT_BF16, B * H * T * D, INIT_NORMAL, 0, 1);
    ten(c, "q", IN, RT_BF16, B * H * T * D, INIT_NORMAL, 0, 1);
    ten(c, "k", IN, RT_BF16, B * KH * S * D, INIT_NORMAL, 0, 1);
    ten(c, "v", IN, RT_BF16, B * KH * S * D, INIT_NORMAL, 0, 1);
    ten(c, "o", IN, RT_BF16, B * H * T * D, INIT_PREP, 0, 0);
    ten(c, "lse", IN, RT_F32, B * H * T, INIT_PREP, 0, 0);
    ten(c, "dq", OUT, RT_BF16, B * H * T * D, 0, 0, 0);
    ten(c, "dk", OUT, RT_BF16, B * KH * S * D, 0, 0, 0);
    ten(c, "dv", OUT, RT_BF16, B * KH * S * D, 0, 0, 0);
    ten(c, "qpos", IN, RT_I32, pos ? T : 0, INIT_PREP, 0, 0);
    ten(c, "kpos", IN, RT_I32, pos ? S : 0, INIT_PREP, 0, 0);
    memcpy(c->p, q, sizeof q);
    c->d[0] = 1 / sqrt((double)D);
    c->prep = prep_attention_bwd;
}

/* ---- the tensor-core attention's twins ----
 *
 * attention_tc.cu (issue 23) rounds P to bf16 before the products that sum
 * it (o = P v in the forward; dv = P^T do, and dS for dk = dS^T q and
 * dq = dS k in the backward), as FlashAttention does.  Against the exact
 * twin (kernels/cpu/attention.c) that rounding is an error of up to 2^-9
 * per weight that does not shrink with the output: in o_d = sum_j w_j v_jd
 * (w = p / l, l summing the same rounded p) it is sum_j w_j (e_j - e) v_jd,
 * |e_j| <= 2^-9 (e the weighted mean), up to 2^-8 max|v_jd - o_d|, while o
 * itself averages the v's towards 0; the largest errors are in the rows that
 * see few keys (row 1 of a causal head: 2 keys, o near their mean, the error
 * a fraction of |v1 - v2| 2^-9).  On the H200 (2026-12-04, seed 1311958232)
 * the T=1024 causal forward was 1.99 of TOL_BF16 at element 81 (row 1: gpu
 * 0.0603, exact 0.0621), and the backward's dv 1.02 and 1.22 of the 4x
 * tolerance the backward had; the fake CUDA stack (the kernel's own source
 * on the host emulator) gives the same elements, the same worst-of-tol
 * (1.00, 0.95, 0.93, ... for the smaller cases, bit for bit the GPU's):
 * precision, not a GPU-only bug.
 *
 * So the (tc) cases are checked against these twins, which round as the
 * kernel does: the forward walks each row's keys in tiles of ATC_BK (64)
 * with the running max m (online softmax), p = bf16(e^(s - m)), l and the
 * accumulator rescaled by e^(m_old - m_new) and adding the rounded p; the
 * backward rounds P = e^(scale q.k - lse) and dS = P (do.v - Dt) scale to
 * bf16 before each product.  Scores, sums and exponentials in double.  What
 * is left is the f32 arithmetic of the kernel (its scores, sums and expf,
 * ~1e-6 relative) and the bf16 rounding of the outputs (2^-9 relative),
 * plus the rare weight whose f32 and double values round to neighbouring
 * bf16 numbers (one bf16 ulp of that weight); TOL_BF16 (two bf16 ulps
 * elementwise, 1e-2 normwise) holds these with room, and is 4x tighter for
 * the backward than the exact twin allowed.  KC_ATC_BK must equal
 * attention_tc.cu's ATC_BK (prepare.sh refuses to build kcheck otherwise):
 * with another tiling the running max, and so the rounding, differ. */
enum { KC_ATC_BK = 64 };

static double kc_bits_f64(int64_t b) {
    double d;
    memcpy(&d, &b, 8);
    return d;
}
static double kc_bf16(double x) { return bf2f(f2bf((float)x)); }

/* key s visible to query t (ops.def attention): causal by position when both
 * position arrays are given, else by index; a window W > 0 (causal only)
 * also needs q - k < W */
static int kc_visible(int causal, const int32_t *qpos, const int32_t *kpos, int64_t t, int64_t s, int64_t win) {
    if (!causal) return 1;
    int64_t qt = qpos && kpos ? qpos[t] : t, ks = qpos && kpos ? kpos[s] : s;
    return ks <= qt && (win <= 0 || qt - ks < win);
}

/* args: q, k, v, o, lse, B, H, KH, T, S, D, causal, scale, qpos, kpos, window */
static void tc_twin_attention(rt_ctx *ctx, const int64_t *a) {
    (void)ctx;
    const float *q = RT_F32P(a[0]), *k = RT_F32P(a[1]), *v = RT_F32P(a[2]);
    float *o = RT_F32P(a[3]), *lse = RT_F32P(a[4]);
    const int64_t B = a[5], H = a[6], KH = a[7], T = a[8], S = a[9], D = a[10], win = a[15];
    const int causal = a[11] != 0;
    const double scale = kc_bits_f64(a[12]);
    const int32_t *qpos = RT_I32P(a[13]), *kpos = RT_I32P(a[14]);
    double *acc = xmalloc((size_t)(D > 0 ? D : 1) * sizeof *acc), sc[KC_ATC_BK];
    for (int64_t bh = 0; bh < B * H; bh++) {
        const int64_t kvh = bh / H * KH + bh % H / (H / KH);
        const float *kb = k + kvh * S * D, *vb = v + kvh * S * D;
        for (int64_t t = 0; t < T; t++) {
            const float *qr = q + (bh * T + t) * D;
            double m = -INFINITY, l = 0;
            for (int64_t d = 0; d < D; d++) acc[d] = 0;
            for (int64_t s0 = 0; s0 < S; s0 += KC_ATC_BK) {
                const int64_t n = S - s0 < KC_ATC_BK ? S - s0 : KC_ATC_BK;
                double mx = -INFINITY;
                for (int64_t j = 0; j < n; j++) {
                    sc[j] = -INFINITY;
                    if (!kc_visible(causal, qpos, kpos, t, s0 + j, win)) continue;
                    double dot = 0;
                    for (int64_t d = 0; d < D; d++) dot += (double)qr[d] * kb[(s0 + j) * D + d];
                    sc[j] = dot * scale;
                    if (sc[j] > mx) mx = sc[j];
                }
                const double mnew = m > mx ? m : mx, alpha = mnew == -INFINITY ? 1 : exp(m - mnew);
                m = mnew;
                l *= alpha;
                for (int64_t d = 0; d < D; d++) acc[d] *= alpha;
                for (int64_t j = 0; j < n; j++) {
                    if (sc[j] == -INFINITY) continue;
                    const double p = kc_bf16(exp(sc[j] - m));
                    l += p;
                    for (int64_t d = 0; d < D; d++) acc[d] += p * vb[(s0 + j) * D + d];
                }
            }
            const int none = m == -INFINITY || l == 0;
            for (int64_t d = 0; d < D; d++) o[(bh * T + t) * D + d] = none ? 0.0f : (float)(acc[d] / l);
            lse[bh * T + t] = none ? -INFINITY : (float)(m + log(l));
        }
    }
    free(acc);
}

/* args: do, q, k, v, o, lse, dq, dk, dv, B, H, KH, T, S, D, causal, scale, qpos, kpos, window */
static void tc_twin_attention_bwd(rt_ctx *ctx, const int64_t *a) {
    (void)ctx;
    const float *dO = RT_F32P(a[0]), *q = RT_F32P(a[1]), *k = RT_F32P(a[2]), *v = RT_F32P(a[3]), *o = RT_F32P(a[4]),
                *lse = RT_F32P(a[5]);
    float *dq = RT_F32P(a[6]), *dk = RT_F32P(a[7]), *dv = RT_F32P(a[8]);
    const int64_t B = a[9], H = a[10], KH = a[11], T = a[12], S = a[13], D = a[14], win = a[19];
    const int causal = a[15] != 0;
    const double scale = kc_bits_f64(a[16]);
    const int32_t *qpos = RT_I32P(a[17]), *kpos = RT_I32P(a[18]);
    const size_t nkv = (size_t)(B * KH * S * D), nq = (size_t)(D > 0 ? D : 1);
    double *gk = xmalloc((nkv ? nkv : 1) * sizeof *gk), *gv = xmalloc((nkv ? nkv : 1) * sizeof *gv), *gq = xmalloc(nq * sizeof *gq);
    for (size_t i = 0; i < nkv; i++) gk[i] = gv[i] = 0;
    for (int64_t bh = 0; bh < B * H; bh++) {
        const int64_t kvh = bh / H * KH + bh % H / (H / KH);
        const float *kb = k + kvh * S * D, *vb = v + kvh * S * D;
        double *gkb = gk + kvh * S * D, *gvb = gv + kvh * S * D;
        for (int64_t t = 0; t < T; t++) {
            const float *qr = q + (bh * T + t) * D, *dr = dO + (bh * T + t) * D, *orow = o + (bh * T + t) * D;
            const double L = lse[bh * T + t];
            double Dt = 0;
            for (int64_t d = 0; d < D; d++) Dt += (double)dr[d] * orow[d], gq[d] = 0;
            for (int64_t s = 0; L != -INFINITY && s < S; s++) {
                if (!kc_visible(causal, qpos, kpos, t, s, win)) continue;
                double dot = 0, dp = 0;
                for (int64_t d = 0; d < D; d++) dot += (double)qr[d] * kb[s * D + d], dp += (double)dr[d] * vb[s * D + d];
                const double P = exp(dot * scale - L), Pr = kc_bf16(P), dSr = kc_bf16(P * (dp - Dt) * scale);
                for (int64_t d = 0; d < D; d++) {
                    gvb[s * D + d] += Pr * dr[d];
                    gkb[s * D + d] += dSr * qr[d];
                    gq[d] += dSr * kb[s * D + d];
                }
            }
            for (int64_t d = 0; d < D; d++) dq[(bh * T + t) * D + d] = (float)gq[d];
        }
    }
    for (size_t i = 0; i < nkv; i++) dk[i] = (float)gk[i], dv[i] = (float)gv[i];
    free(gk), free(gv), free(gq);
}

static void add_attention(int64_t B, int64_t H, int64_t KH, int64_t T, int64_t S, int64_t D, int causal, int pos,
                          int64_t window) {
    add_attention_with(rtk_attention, rtk_attention_bwd, "", B, H, KH, T, S, D, causal, pos, window);
}

/* args: o_a, lse_a, o_b, lse_b, o, lse, rows, D, dt */
static int args_attn_merge(const Case *c, void *const *p, int gpu, int64_t *a) {
    PUT(P(0), P(1), P(2), P(3), P(4), P(5), c->p[0], c->p[1], DT(0));
}

/* some rows see no key on one side (lse -inf), a few on both */
static void prep_attn_merge(Case *c) {
    float *la = c->t[1].in, *lb = c->t[3].in;
    for (int64_t r = 0; r < c->p[0]; r++) {
        if (r % 7 == 3) la[r] = -INFINITY;
        if (r % 11 == 5) lb[r] = -INFINITY;
    }
}

static void add_attn_merge(int64_t rows, int64_t D) {
    Case *c = new_case(rtk_attn_merge, cpu_rtk_attn_merge, args_attn_merge, "attn_merge rows=%lld D=%lld", (long long)rows,
                       (long long)D);
    ten(c, "o_a", IN, RT_BF16, rows * D, INIT_NORMAL, 0, 1);
    ten(c, "lse_a", IN, RT_F32, rows, INIT_NORMAL, 0, 3);
    ten(c, "o_b", IN, RT_BF16, rows * D, INIT_NORMAL, 0, 1);
    ten(c, "lse_b", IN, RT_F32, rows, INIT_NORMAL, 0, 3);
    ten(c, "o", OUT, RT_BF16, rows * D, 0, 0, 0);
    ten(c, "lse", OUT, RT_F32, rows, 0, 0, 0);
    c->p[0] = rows, c->p[1] = D;
    c->prep = prep_attn_merge;
}

/* ---- embedding, cross-entropy ---- */

static int args_embedding(const Case *c, void *const *p, int gpu, int64_t *a) { PUT(P(0), P(1), P(2), c->p[0], c->p[1], c->p[2]); }

static void add_embedding(int64_t n, int64_t C, int64_t V, int64_t id_lo) {
    Case *c = new_case(rtk_embedding, cpu_rtk_embedding, args_embedding, "embedding n=%lld C=%lld V=%lld", (long long)n,
                       (long long)C, (long long)V);
    ten(c, "table", IN, RT_BF16, V * C, INIT_NORMAL, 0, 0.02);
    ten(c, "ids", IN, RT_I32, n, INIT_INTS, 0, (double)V);
    ten(c, "out", OUT, RT_BF16, n * C, 0, 0, 0);
    c->p[0] = n, c->p[1] = C, c->p[2] = V;
    /* the backward: ids in [id_lo, V) (a narrow range: many repeats) */
    c = new_case(rtk_embedding_bwd, cpu_rtk_embedding_bwd, args_embedding, "embedding_bwd n=%lld C=%lld V=%lld ids>=%lld",
                 (long long)n, (long long)C, (long long)V, (long long)id_lo);
    ten(c, "dy", IN, RT_BF16, n * C, INIT_NORMAL, 0, 1);
    ten(c, "ids", IN, RT_I32, n, INIT_INTS, (double)id_lo, (double)V);
    ten(c, "dtable", OUT, RT_F32, V * C, 0, 0, 0);
    c->p[0] = n, c->p[1] = C, c->p[2] = V;
}

static int args_xent(const Case *c, void *const *p, int gpu, int64_t *a) { PUT(P(0), P(1), P(2), c->p[0], c->p[1]); }
static int args_xent_bwd(const Case *c, void *const *p, int gpu, int64_t *a) { PUT(P(0), P(1), P(2), P(3), c->p[0], c->p[1]); }

static void add_xent(int64_t rows, int64_t V) {
    Case *c = new_case(rtk_cross_entropy, cpu_rtk_cross_entropy, args_xent, "cross_entropy rows=%lld V=%lld", (long long)rows,
                       (long long)V);
    ten(c, "logits", IN, RT_BF16, rows * V, INIT_NORMAL, 0, 2);
    ten(c, "targets", IN, RT_I32, rows, INIT_INTS, 0, (double)V);
    ten(c, "loss", OUT, RT_F32, rows, 0, 0, 0);
    c->p[0] = rows, c->p[1] = V;
    c = new_case(rtk_cross_entropy_bwd, cpu_rtk_cross_entropy_bwd, args_xent_bwd, "cross_entropy_bwd rows=%lld V=%lld",
                 (long long)rows, (long long)V);
    ten(c, "dl", IN, RT_F32, rows, INIT_UNIFORM, 0.5 / (double)rows, 2.0 / (double)rows);
    ten(c, "logits", IN, RT_BF16, rows * V, INIT_NORMAL, 0, 2);
    ten(c, "targets", IN, RT_I32, rows, INIT_INTS, 0, (double)V);
    ten(c, "dlogits", OUT, RT_BF16, rows * V, 0, 0, 0);
    c->p[0] = rows, c->p[1] = V;
}

/* The fused classifier's twin: the CPU's forward then backward (no CPU
 * kernel of its own; weak: the CPU runtime, --cpu, has none).
 * args: dl, logits, targets, dlogits, loss, rows, V */
#pragma weak rtk_cross_entropy_fused
static void cpu_xent_fused(rt_ctx *ctx, const int64_t *a) {
    int64_t f[] = {a[1], a[2], a[4], a[5], a[6]}, b[] = {a[0], a[1], a[2], a[3], a[5], a[6]};
    cpu_rtk_cross_entropy(ctx, f);
    cpu_rtk_cross_entropy_bwd(ctx, b);
}
static int args_xent_fused(const Case *c, void *const *p, int gpu, int64_t *a) {
    PUT(P(0), P(1), P(2), P(3), P(4), c->p[0], c->p[1]);
}

static void add_xent_fused(int64_t rows, int64_t V) {
    Case *c = new_case(rtk_cross_entropy_fused, cpu_xent_fused, args_xent_fused, "cross_entropy_fused rows=%lld V=%lld",
                       (long long)rows, (long long)V);
    ten(c, "dl", IN, RT_F32, rows, INIT_UNIFORM, 0.5 / (double)rows, 2.0 / (double)rows);
    ten(c, "logits", IN, RT_BF16, rows * V, INIT_NORMAL, 0, 2);
    ten(c, "targets", IN, RT_I32, rows, INIT_INTS, 0, (double)V);
    ten(c, "dlogits", OUT, RT_BF16, rows * V, 0, 0, 0);
    ten(c, "loss", OUT, RT_F32, rows, 0, 0, 0);
    c->p[0] = rows, c->p[1] = V;
}

/* ---- optimizer ---- */

/* args: p, g, m, v, lr, scale, t, p_out, m_out, v_out, n, b1, b2, eps, wd */
static int args_adamw(const Case *c, void *const *p, int gpu, int64_t *a) {
    PUT(P(0), P(1), P(2), P(3), P(4), P(5), P(6), P(7), P(8), P(9), c->p[0], F(0.9), F(0.95), F(1e-8), F(c->d[0]));
}

static void add_adamw(int64_t n, double wd, double step) {
    Case *c = new_case(rtk_adamw, cpu_rtk_adamw, args_adamw, "adamw n=%lld wd=%g t=%g", (long long)n, wd, step);
    ten(c, "p", IN, RT_F32, n, INIT_NORMAL, 0, 0.05);
    ten(c, "g", IN, RT_F32, n, INIT_NORMAL, 0, 0.01);
    ten(c, "m", IN, RT_F32, n, INIT_NORMAL, 0, 0.003);
    ten(c, "v", IN, RT_F32, n, INIT_UNIFORM, 0, 1e-4);
    ten(c, "lr", IN, RT_F32, 1, INIT_UNIFORM, 6e-4, 6e-4);
    ten(c, "scale", IN, RT_F32, 1, INIT_UNIFORM, 0.7, 0.7);
    ten(c, "t", IN, RT_F32, 1, INIT_UNIFORM, step, step);
    for (int k = 0; k < 3; k++) c->t[ten(c, k == 0 ? "p_out" : k == 1 ? "m_out" : "v_out", OUT, RT_F32, n, 0, 0, 0)].tol = TOL_TIGHT;
    c->p[0] = n, c->d[0] = wd;
}

static int args_lr_cosine(const Case *c, void *const *p, int gpu, int64_t *a) { PUT(P(0), P(1), rt_ptr_arg(&c->sched)); }

static void add_lr_cosine(double t) {
    Case *c = new_case(rtk_lr_cosine, cpu_rtk_lr_cosine, args_lr_cosine, "lr_cosine t=%g (lr 6e-4 -> 6e-5, warmup 10, total 1000)", t);
    ten(c, "t", IN, RT_F32, 1, INIT_UNIFORM, t, t);
    c->t[ten(c, "lr", OUT, RT_F32, 1, 0, 0, 0)].tol = TOL_TIGHT;
    c->sched = (rt_schedule){6e-4, 6e-5, 10, 1000};
}

static int args_clipscale(const Case *c, void *const *p, int gpu, int64_t *a) { PUT(P(0), P(1), F(c->d[0])); }

static void add_clipscale(double norm, double max) {
    Case *c = new_case(rtk_clipscale, cpu_rtk_clipscale, args_clipscale, "clipscale norm=%g max=%g", norm, max);
    ten(c, "norm", IN, RT_F32, 1, INIT_UNIFORM, norm, norm);
    c->t[ten(c, "scale", OUT, RT_F32, 1, 0, 0, 0)].tol = TOL_TIGHT;
    c->d[0] = max;
}

/* ---- reductions ---- */

/* args: x, y, outer, n, inner, kind, dtx, dty */
static int args_reduce(const Case *c, void *const *p, int gpu, int64_t *a) {
    PUT(P(0), P(1), c->p[0], c->p[1], c->p[2], c->p[3], DT(0), DT(1));
}

static const char *dname(int dt) { return dt == RT_BF16 ? "bf16" : dt == RT_F32 ? "f32" : "i32"; }

static void add_reduce(int64_t outer, int64_t n, int64_t inner, int kind, int dtx, int dty) {
    static const char *kinds[] = {"sum", "mean", "max"};
    Case *c = new_case(rtk_reduce, cpu_rtk_reduce, args_reduce, "reduce %s [%lld,%lld,%lld] %s->%s", kinds[kind], (long long)outer,
                       (long long)n, (long long)inner, dname(dtx), dname(dty));
    ten(c, "x", IN, dtx, outer * n * inner, INIT_NORMAL, 0.1, 1);
    ten(c, "y", OUT, dty, outer * inner, 0, 0, 0);
    int64_t q[] = {outer, n, inner, kind};
    memcpy(c->p, q, sizeof q);
}

/* args: dy, x, y, dx, outer, n, inner, dt */
static int args_max_bwd(const Case *c, void *const *p, int gpu, int64_t *a) {
    PUT(P(0), P(1), P(2), P(3), c->p[0], c->p[1], c->p[2], DT(0));
}

/* y = max of x (exact: one of the x); x from a few values, so ties are common
 * and "the first argmax" is tested */
static void prep_max_bwd(Case *c) {
    Ten *x = &c->t[1], *y = &c->t[2];
    float *xv = x->in;
    for (int64_t i = 0; i < x->n; i++) xv[i] = (float)floor(xv[i]);
    int64_t a[] = {rt_ptr_arg(x->in), rt_ptr_arg(y->in), c->p[0], c->p[1], c->p[2], 2, RT_F32, RT_F32};
    cpu_rtk_reduce(NULL, a);
}

static void add_max_bwd(int64_t outer, int64_t n, int64_t inner, int dt) {
    Case *c = new_case(rtk_max_bwd, cpu_rtk_max_bwd, args_max_bwd, "max_bwd [%lld,%lld,%lld] %s", (long long)outer, (long long)n,
                       (long long)inner, dname(dt));
    ten(c, "dy", IN, dt, outer * inner, INIT_NORMAL, 0, 1);
    ten(c, "x", IN, dt, outer * n * inner, INIT_UNIFORM, -4, 4);
    ten(c, "y", IN, dt, outer * inner, INIT_PREP, 0, 0);
    ten(c, "dx", OUT, dt, outer * n * inner, 0, 0, 0);
    int64_t q[] = {outer, n, inner};
    memcpy(c->p, q, sizeof q);
    c->prep = prep_max_bwd;
}

static int args_sumsq(const Case *c, void *const *p, int gpu, int64_t *a) { PUT(P(0), P(1), c->p[0], DT(0)); }

static void add_sumsq(int64_t n, int dt) {
    Case *c = new_case(rtk_sumsq, cpu_rtk_sumsq, args_sumsq, "sumsq n=%lld %s", (long long)n, dname(dt));
    ten(c, "x", IN, dt, n, INIT_NORMAL, 0, 1);
    ten(c, "out", OUT, RT_F32, 1, 0, 0, 0);
    c->p[0] = n;
}

/* args: x, y, rank, d0..d4, ys0..ys4, dtx, dty; y's strides are 0 on the
 * summed dims and row-major over the kept ones */
static int args_sumto(const Case *c, void *const *p, int gpu, int64_t *a) {
    a[0] = P(0), a[1] = P(1), a[2] = c->p[0];
    for (int d = 0; d < 10; d++) a[3 + d] = c->p[1 + d];
    a[13] = DT(0), a[14] = DT(1);
    return 15;
}

static void add_sumto(int rank, const int64_t *dims, const int *kept, int dtx, int dty) {
    char desc[96] = "";
    int64_t nx = 1, ny = 1, ys[5] = {0};
    for (int d = rank - 1; d >= 0; d--) {
        nx *= dims[d];
        if (kept[d]) ys[d] = ny, ny *= dims[d];
    }
    for (int d = 0; d < rank; d++)
        snprintf(desc + strlen(desc), sizeof desc - strlen(desc), "%s%lld%s", d ? "," : "", (long long)dims[d], kept[d] ? "" : "*");
    Case *c = new_case(rtk_sumto, cpu_rtk_sumto, args_sumto, "sumto [%s] (* summed) %s->%s", desc, dname(dtx), dname(dty));
    ten(c, "x", IN, dtx, nx, INIT_NORMAL, 0.1, 1);
    ten(c, "y", OUT, dty, ny, 0, 0, 0);
    c->p[0] = rank;
    for (int d = 0; d < 5; d++) c->p[1 + d] = d < rank ? dims[d] : 1, c->p[6 + d] = d < rank ? ys[d] : 0;
}

/* ---- copies and fills (bit for bit) ---- */

/* args: src, dst, elem_bytes, rank, d0..d4, ss0..ss4, ds0..ds4 */
static int args_copy(const Case *c, void *const *p, int gpu, int64_t *a) {
    a[0] = rt_ptr_arg((const char *)p[0] + c->p[16] * c->t[0].eb), a[1] = P(1), a[2] = c->t[0].eb, a[3] = c->p[0];
    for (int d = 0; d < 15; d++) a[4 + d] = c->p[1 + d];
    return 19;
}

/* dst (dense, row-major over dims) = src from element `start` on, read
 * through strides ss (a permutation of src's own row-major strides, or 0 to
 * broadcast); src holds nsrc elements */
static void add_copy(const char *what, int eb, int rank, const int64_t *dims, const int64_t *ss, int64_t start, int64_t nsrc) {
    Case *c = new_case(rtk_copy, cpu_rtk_copy, args_copy, "copy %s eb=%d", what, eb);
    int64_t n = 1, ds[5];
    for (int d = rank - 1; d >= 0; d--) ds[d] = n, n *= dims[d];
    raw(c, "src", IN, eb, nsrc);
    raw(c, "dst", OUT, eb, n);
    c->p[0] = rank;
    for (int d = 0; d < 5; d++) {
        c->p[1 + d] = d < rank ? dims[d] : 1;
        c->p[6 + d] = d < rank ? ss[d] : 0;
        c->p[11 + d] = d < rank ? ds[d] : 0;
    }
    c->p[16] = start;
}

static int args_memcpy(const Case *c, void *const *p, int gpu, int64_t *a) { PUT(P(1), P(0), c->p[0]); }

static void add_memcpy(int64_t bytes) {
    Case *c = new_case(rtk_memcpy, cpu_rtk_memcpy, args_memcpy, "memcpy bytes=%lld", (long long)bytes);
    raw(c, "src", IN, 1, bytes);
    raw(c, "dst", OUT, 1, bytes);
    c->p[0] = bytes;
}

/* args: dst, n, value(bits), dtype; the CPU fills f32 (compared after the
 * GPU's bf16 rounding, within bf16 tolerance) or i32 */
static int args_fill(const Case *c, void *const *p, int gpu, int64_t *a) {
    PUT(P(0), c->p[0], F(c->d[0]), gpu ? c->t[0].dt : c->t[0].dt == RT_I32 ? RT_I32 : RT_F32);
}

static void add_fill(int64_t n, double value, int dt) {
    Case *c = new_case(rtk_fill, cpu_rtk_fill, args_fill, "fill n=%lld value=%g %s", (long long)n, value, dname(dt));
    ten(c, "dst", OUT, dt, n, 0, 0, 0);
    c->p[0] = n, c->d[0] = value;
}

static int args_iota(const Case *c, void *const *p, int gpu, int64_t *a) { PUT(P(0), c->p[0]); }

static void add_iota(int64_t n) {
    Case *c = new_case(rtk_iota, cpu_rtk_iota, args_iota, "iota n=%lld", (long long)n);
    ten(c, "dst", OUT, RT_I32, n, 0, 0, 0);
    c->p[0] = n;
}

/* ---- the case table ---- */

/* rtk_gemm_bgrad (--gemm-epilogue bgrad, cuBLASLt's BGRADA; weak): the
 * weight gradient C = A^T B (ta, f32) and db[j] = the sum over K of B's
 * column j.  args: rtk_gemm's 16, then db, of_b (1) */
#pragma weak rtk_gemm_bgrad
static void ref_gemm_bgrad(rt_ctx *ctx, const int64_t *a) {
    ref_gemm(ctx, a);
    const float *B = rt_arg_ptr(a[1]);
    float *db = rt_arg_ptr(a[16]);
    for (int64_t j = 0; j < a[5]; j++) {
        double s = 0;
        for (int64_t k = 0; k < a[6]; k++) s += B[k * a[5] + j];
        db[j] = (float)s;
    }
}
static int args_gemm_bgrad(const Case *c, void *const *p, int gpu, int64_t *a) {
    const int64_t *q = c->p;
    PUT(P(0), P(1), P(2), q[0], q[1], q[2], q[3], q[4], q[5], q[6], q[7], q[8], F(0), DT(0), DT(1), DT(2), P(3), 1);
}
static void add_gemm_bgrad(int64_t M, int64_t N, int64_t K) {
    Case *c = new_case(rtk_gemm_bgrad, ref_gemm_bgrad, args_gemm_bgrad, "gemm_bgrad %lldx%lldx%lld ta=1 C=f32 (BGRADA)",
                       (long long)M, (long long)N, (long long)K);
    ten(c, "A", IN, RT_BF16, K * M, INIT_NORMAL, 0, 1);
    ten(c, "B", IN, RT_BF16, K * N, INIT_NORMAL, 0, 1);
    ten(c, "C", OUT, RT_F32, M * N, 0, 0, 0);
    ten(c, "db", OUT, RT_F32, N, 0, 0, 0);
    int64_t q[] = {1, M, N, K, 1, 0, 0, 0, M * N};
    memcpy(c->p, q, sizeof q);
}

/* rtk_gemm_dgelu_bgrad (--gemm-epilogue all, DGELU_BGRAD; weak): C = (A
 * B^T) * gelu'(aux) (tanh form, written here from its formula), db[j] =
 * the sum of C's column j, both bf16.  args: rtk_gemm's 16, then aux, db */
#pragma weak rtk_gemm_dgelu_bgrad
static void ref_gemm_dgelu_bgrad(rt_ctx *ctx, const int64_t *a) {
    ref_gemm(ctx, a);
    float *C = rt_arg_ptr(a[2]), *db = rt_arg_ptr(a[17]);
    const float *aux = rt_arg_ptr(a[16]);
    int64_t rows = a[3] * a[4], N = a[5];
    const double k0 = 0.7978845608028654, k1 = 0.044715;
    for (int64_t j = 0; j < N; j++) db[j] = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < N; j++) {
            double x = aux[r * N + j], t = tanh(k0 * (x + k1 * x * x * x));
            double g = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k0 * (1 + 3 * k1 * x * x);
            C[r * N + j] = (float)(C[r * N + j] * g);
            db[j] += C[r * N + j];
        }
}
static int args_gemm_dgelu_bgrad(const Case *c, void *const *p, int gpu, int64_t *a) {
    const int64_t *q = c->p;
    PUT(P(0), P(1), P(2), q[0], q[1], q[2], q[3], q[4], q[5], q[6], q[7], q[8], F(0), DT(0), DT(1), DT(2), P(3), P(4));
}
static void add_gemm_dgelu_bgrad(int64_t M, int64_t N, int64_t K) {
    Case *c = new_case(rtk_gemm_dgelu_bgrad, ref_gemm_dgelu_bgrad, args_gemm_dgelu_bgrad,
                       "gemm_dgelu_bgrad %lldx%lldx%lld tb=1 C=bf16 (DGELU_BGRAD)", (long long)M, (long long)N, (long long)K);
    ten(c, "A", IN, RT_BF16, M * K, INIT_NORMAL, 0, 1);
    ten(c, "B", IN, RT_BF16, N * K, INIT_NORMAL, 0, 1);
    ten(c, "C", OUT, RT_BF16, M * N, 0, 0, 0);
    ten(c, "aux", IN, RT_BF16, M * N, INIT_NORMAL, 0, 1);
    ten(c, "db", OUT, RT_BF16, N, 0, 0, 0);
    int64_t q[] = {1, M, N, K, 0, 1, 0, 0, M * N};
    memcpy(c->p, q, sizeof q);
}

/* s: 1 full size (a GPU), small > 1 divides the big dimensions (the fake
 * CUDA stack's emulator runs every CUDA thread as a host fiber) */
static void build_cases(int small) {
    int64_t rows = small ? 24 : 4096, C = small ? 64 : 768, V = small ? 1000 : 50304;
    /* GEMMs: odd shapes, every transpose, batched, shared B, accumulate, f32 C, and model-like ones */
    add_gemm(1, 77, 130, 96, 0, 0, 0, 0, RT_BF16);
    add_gemm(1, 77, 130, 96, 1, 0, 0, 0, RT_BF16);
    add_gemm(1, 77, 130, 96, 0, 1, 0, 0, RT_BF16);
    add_gemm(1, 77, 130, 96, 1, 1, 0, 0, RT_F32);
    add_gemm(3, 64, 48, 40, 0, 1, 0, 0, RT_BF16);  /* attention-like scores */
    add_gemm(4, 33, 65, 17, 0, 0, 1, 0, RT_BF16);  /* shared weight */
    add_gemm(1, 96, 80, 200, 1, 0, 0, 1, RT_F32);  /* weight gradient, accumulated */
    add_gemm(1, 50, 70, 30, 0, 0, 0, 1, RT_F32);
    if (rtk_gemm_bias) {
        add_gemm_bias(1, 77, 130, 96, 0, 0);
        add_gemm_bias(1, 77, 130, 96, 0, 1);
        add_gemm_bias(4, 33, 65, 17, 0, 0); /* [batch*M, K] x B, folded */
    }
    if (rtk_gemm_bgrad) add_gemm_bgrad(96, 80, 200);          /* a weight gradient and its bias' */
    if (rtk_gemm_dgelu_bgrad) add_gemm_dgelu_bgrad(77, 136, 96); /* N a multiple of 8 (AUX_LD) */
    if (!small) {
        add_gemm(1, 2048, 3072, 768, 0, 0, 0, 0, RT_BF16); /* c_fc */
        add_gemm(1, 768, 3072, 2048, 1, 0, 0, 0, RT_F32);  /* its weight gradient */
        add_gemm(1, 64, 50304, 768, 0, 1, 0, 0, RT_BF16);  /* tied classifier */
    }
    add_norms(rows, C);
    add_norms(37, 100);
    add_norms(small ? 3 : 1000, small ? 40 : 1600);
    add_softmax(small ? 10 : 300, small ? 50 : 1000, RT_BF16);
    add_softmax(7, 3, RT_F32);
    add_softmax(small ? 3 : 64, small ? 300 : 4097, RT_F32);
    add_rope(2, small ? 16 : 64, 4, 64, 10000, 1);
    add_rope(1, small ? 7 : 37, 3, 128, 500000, -1);
    /* attention: causal, GQA with odd T, unmasked T != S at D 128, context-parallel positions, S = 0, D 32,
     * sliding windows */
    if (small) {
        add_attention(1, 2, 2, 40, 40, 32, 1, 0, 0);
        add_attention(1, 4, 2, 33, 33, 16, 1, 0, 0);
        add_attention(1, 2, 1, 20, 30, 64, 0, 0, 0);
        add_attention(1, 2, 2, 32, 64, 16, 1, 1, 0);
        add_attention(1, 2, 2, 16, 0, 16, 1, 0, 0);
        add_attention(1, 2, 2, 40, 40, 32, 1, 0, 7); /* sliding window by index */
        add_attention(1, 2, 2, 32, 64, 16, 1, 1, 9); /* sliding window by position */
    } else {
        add_attention(2, 4, 4, 256, 256, 64, 1, 0, 0);
        add_attention(1, 8, 2, 200, 200, 64, 1, 0, 0);
        add_attention(2, 2, 2, 100, 130, 128, 0, 0, 0);
        add_attention(1, 4, 4, 128, 256, 64, 1, 1, 0);
        add_attention(1, 2, 2, 64, 0, 64, 1, 0, 0);
        add_attention(1, 2, 1, 70, 70, 32, 1, 0, 0);
        add_attention(1, 4, 2, 200, 200, 64, 1, 0, 37); /* sliding window by index */
        add_attention(1, 4, 4, 128, 256, 64, 1, 1, 50); /* sliding window by position */
        /* cuDNN's fused SDPA where it qualifies (docs/cudnn.md: T = S, no
         * positions, D a multiple of 8 up to 128); not with --small: the
         * fake CUDA stack has no cuDNN */
        if (rtk_attention_cudnn && rtk_attention_bwd_cudnn) {
            add_attention_with(rtk_attention_cudnn, rtk_attention_bwd_cudnn, " (cudnn)", 2, 4, 4, 256, 256, 64, 1, 0, 0);
            add_attention_with(rtk_attention_cudnn, rtk_attention_bwd_cudnn, " (cudnn)", 1, 8, 2, 200, 200, 64, 1, 0, 0);
            add_attention_with(rtk_attention_cudnn, rtk_attention_bwd_cudnn, " (cudnn)", 2, 2, 2, 100, 100, 128, 0, 0, 0);
        }
    }
    /* the tensor-core kernels (D 16, 32, 64, 128): the same cases as above
     * where they qualify, against the same CPU twin and tolerances */
    if (rtk_attention_tc && rtk_attention_bwd_tc) {
        if (small) {
            add_attention_with(rtk_attention_tc, rtk_attention_bwd_tc, " (tc)", 1, 2, 2, 40, 40, 32, 1, 0, 0);
            add_attention_with(rtk_attention_tc, rtk_attention_bwd_tc, " (tc)", 1, 2, 2, 32, 64, 16, 1, 1, 9);
        } else {
            add_attention_with(rtk_attention_tc, rtk_attention_bwd_tc, " (tc)", 2, 4, 4, 256, 256, 64, 1, 0, 0);
            add_attention_with(rtk_attention_tc, rtk_attention_bwd_tc, " (tc)", 1, 8, 2, 200, 200, 64, 1, 0, 0);
            add_attention_with(rtk_attention_tc, rtk_attention_bwd_tc, " (tc)", 2, 2, 2, 100, 130, 128, 0, 0, 0);
            add_attention_with(rtk_attention_tc, rtk_attention_bwd_tc, " (tc)", 1, 4, 4, 128, 256, 64, 1, 1, 0);
            add_attention_with(rtk_attention_tc, rtk_attention_bwd_tc, " (tc)", 1, 2, 2, 64, 0, 64, 1, 0, 0);
            add_attention_with(rtk_attention_tc, rtk_attention_bwd_tc, " (tc)", 1, 4, 2, 200, 200, 64, 1, 0, 37);
            add_attention_with(rtk_attention_tc, rtk_attention_bwd_tc, " (tc)", 1, 12, 12, 1024, 1024, 64, 1, 0, 0); /* GPT-2's */
        }
    }
    add_attn_merge(small ? 30 : 300, 64);
    add_attn_merge(17, 128);
    add_embedding(rows, C, V, 0);
    add_embedding(small ? 50 : 2000, 64, 70000, 69900); /* 3 radix passes, many repeats */
    add_embedding(0, 32, 100, 0);                       /* no rows: dtable = 0 */
    add_xent(small ? 8 : 512, V);
    add_xent(37, 1000);
    if (rtk_cross_entropy_fused) {
        add_xent_fused(small ? 8 : 512, V);
        add_xent_fused(37, 1000);
    }
    add_adamw(small ? 5000 : (1 << 20) + 3, 0.1, 5);
    add_adamw(1000, 0, 1);
    for (int i = 0; i < 5; i++) add_lr_cosine((double[]){1, 7, 10, 500, 2000}[i]);
    add_clipscale(3.7, 1), add_clipscale(0.5, 1), add_clipscale(0, 1), add_clipscale(5, 0);
    add_reduce(8, 300, 5, 0, RT_BF16, RT_F32);
    add_reduce(8, 300, 5, 1, RT_F32, RT_BF16);
    add_reduce(8, 300, 5, 2, RT_BF16, RT_BF16);
    add_reduce(1, small ? 5000 : 100000, 1, 0, RT_BF16, RT_F32);
    add_reduce(64, 1, 33, 1, RT_F32, RT_F32);
    add_max_bwd(8, 300, 5, RT_BF16);
    add_max_bwd(16, 50, 1, RT_F32);
    add_sumsq(small ? 10007 : 1000007, RT_BF16);
    add_sumsq(3, RT_F32);
    add_sumsq(5000, RT_F32);
    add_sumto(2, (int64_t[]){rows, C}, (int[]){0, 1}, RT_BF16, RT_F32); /* a bias gradient */
    add_sumto(3, (int64_t[]){4, 30, 7}, (int[]){0, 1, 0}, RT_BF16, RT_F32);
    add_sumto(3, (int64_t[]){5, 6, 7}, (int[]){1, 0, 1}, RT_F32, RT_BF16);
    add_sumto(5, (int64_t[]){2, 3, 4, 5, 6}, (int[]){0, 0, 0, 0, 0}, RT_F32, RT_F32);
    {
        int64_t B = 2, T = small ? 16 : 64, H = 4, D = 64; /* [B,T,H,D] -> [B,H,T,D] */
        add_copy("transpose [B,T,H,D]->[B,H,T,D]", 2, 4, (int64_t[]){B, H, T, D}, (int64_t[]){T * H * D, D, H * D, 1}, 0, B * T * H * D);
        add_copy("broadcast [64]->[100,64]", 4, 2, (int64_t[]){100, 64}, (int64_t[]){0, 1}, 0, 64);
        add_copy("slice [300,96][:,32:64]", 2, 2, (int64_t[]){300, 32}, (int64_t[]){96, 1}, 32, 300 * 96);
        add_copy("rank-5 permutation", 1, 5, (int64_t[]){3, 4, 5, 6, 7}, (int64_t[]){1, 3, 12, 60, 360}, 0, 2520);
        add_copy("rank-3 permutation", 8, 3, (int64_t[]){5, 7, 9}, (int64_t[]){9, 45, 1}, 0, 315);
    }
    add_memcpy(1000003);
    add_memcpy(1);
    add_fill(1000003, 3.25, RT_F32);
    add_fill(777, -0.1, RT_BF16);
    add_fill(100, 42, RT_I32);
    add_iota(100003);
}

/* ---- running one case ---- */

#define POISON32 0x7fbadbadu
#define POISON16 0x7fbdu
#define POISON_RAW 0xffu
#define GUARD 0xa5u

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "kcheck: out of memory (%zu bytes)\n", n);
        exit(2);
    }
    return p;
}

/* random inputs, already rounded to the GPU's dtype */
static void draw(Ten *t, uint64_t *s) {
    t->in = xmalloc((size_t)host_bytes(t));
    if (t->eb) {
        unsigned char *b = t->in;
        for (int64_t i = 0; i < host_bytes(t); i++) b[i] = (unsigned char)(rng_next(s) & 0x7f); /* never the poison byte */
        return;
    }
    for (int64_t i = 0; i < t->n; i++) {
        if (t->dt == RT_I32) {
            ((int32_t *)t->in)[i] = t->init == INIT_INTS ? (int32_t)(t->a + floor(rng_unif(s) * (t->b - t->a))) : 0;
            continue;
        }
        double x = t->init == INIT_NORMAL ? t->a + t->b * rng_normal(s) : t->init == INIT_UNIFORM ? t->a + (t->b - t->a) * rng_unif(s) : 0;
        ((float *)t->in)[i] = round_dt((float)x, t->dt);
    }
}

static void poison_host(Ten *t) {
    t->out = xmalloc((size_t)host_bytes(t));
    if (t->role == INOUT) memcpy(t->out, t->in, (size_t)host_bytes(t));
    else if (t->eb) memset(t->out, POISON_RAW, (size_t)host_bytes(t));
    else
        for (int64_t i = 0; i < t->n; i++) ((float *)t->out)[i] = NAN;
}

/* the GPU's bytes of a host tensor (inputs) or the poison (outputs) */
static void encode(const Ten *t, const void *host, unsigned char *dst) {
    if (t->eb) {
        memcpy(dst, host, (size_t)gpu_bytes(t));
        return;
    }
    for (int64_t i = 0; i < t->n; i++) {
        if (t->dt == RT_BF16) {
            uint16_t h = f2bf(((const float *)host)[i]);
            memcpy(dst + 2 * i, &h, 2);
        } else {
            memcpy(dst + 4 * i, (const char *)host + 4 * i, 4);
        }
    }
}
static void encode_poison(const Ten *t, unsigned char *dst) {
    if (t->eb) {
        memset(dst, POISON_RAW, (size_t)gpu_bytes(t));
        return;
    }
    uint32_t p32 = POISON32;
    uint16_t p16 = POISON16;
    for (int64_t i = 0; i < t->n; i++) {
        if (t->dt == RT_BF16) memcpy(dst + 2 * i, &p16, 2);
        else memcpy(dst + 4 * i, &p32, 4);
    }
}

static int is_poison(const Ten *t, const unsigned char *g, int64_t i) {
    if (t->eb) {
        for (int k = 0; k < t->eb; k++)
            if (g[i * t->eb + k] != POISON_RAW) return 0;
        return 1;
    }
    if (t->dt == RT_BF16) {
        uint16_t h;
        memcpy(&h, g + 2 * i, 2);
        return h == POISON16;
    }
    uint32_t u;
    memcpy(&u, g + 4 * i, 4);
    return u == POISON32;
}
static double decode(const Ten *t, const unsigned char *g, int64_t i) {
    if (t->dt == RT_BF16) {
        uint16_t h;
        memcpy(&h, g + 2 * i, 2);
        return bf2f(h);
    }
    if (t->dt == RT_I32) {
        int32_t v;
        memcpy(&v, g + 4 * i, 4);
        return v;
    }
    float f;
    memcpy(&f, g + 4 * i, 4);
    return f;
}
static double ref_value(const Ten *t, int64_t i) {
    return t->dt == RT_I32 ? ((const int32_t *)t->out)[i] : ((const float *)t->out)[i];
}

/* the layout: every tensor 256-aligned, at least GUARD_BYTES of guard after
 * it (and before the first) */
#define GUARD_BYTES 256
static int64_t layout(Case *c) {
    int64_t off = GUARD_BYTES;
    for (int k = 0; k < c->nt; k++) {
        c->t[k].off = off;
        off = (off + gpu_bytes(&c->t[k]) + GUARD_BYTES + 255) / 256 * 256;
    }
    return off;
}

static void stage(const Case *c, unsigned char *m, int64_t total) {
    memset(m, GUARD, (size_t)total);
    for (int k = 0; k < c->nt; k++) {
        const Ten *t = &c->t[k];
        if (t->role == OUT) encode_poison(t, m + t->off);
        else encode(t, t->in, m + t->off);
    }
}

/* ---- the GPU side: one program per case ---- */

static const Case *running;
static rt_cubin *cubins;
static int ncubins;
static const char *arch = "sm_90";

static void kcheck_step(rt_ctx *ctx, char *const *spaces) {
    void *p[12];
    int64_t a[64];
    for (int k = 0; k < running->nt; k++) p[k] = spaces[RT_SPACE_ACT] + running->t[k].off;
    int n = running->args(running, p, 1, a);
    rt_launch(ctx, 0, running->gpu, a, n, running->name);
}

/* Run the case's kernel on the GPU twice; the activation space after each
 * run in run[0], run[1] (malloc'd).  0, or -1 with a message in why. */
static int run_gpu(Case *c, int64_t total, unsigned char **run, char *why, size_t len) {
    rt_program p = {0};
    p.abi_version = RT_ABI_VERSION;
    p.model = c->name;
    for (int s = 0; s < RT_NSPACES; s++) p.space_bytes[s] = 256;
    p.space_bytes[RT_SPACE_ACT] = total;
    p.nstreams = 1;
    p.steps = 1;
    p.step = kcheck_step;
    p.mesh[0] = p.mesh[1] = p.mesh[2] = p.mesh[3] = 1;
    p.schedule = &c->sched;
    if (!on_cpu) {
        p.device = RT_DEV_CUDA;
        p.arch = arch;
        p.ncubins = ncubins;
        p.cubins = cubins;
        p.scratch_bytes = 64ll << 20; /* more than any case needs: kernels/cuda/README.md's sizes */
    }
    rt_options o = {0};
    running = c;
    fflush(stdout);
    rt_ctx *ctx = rt_new(&p, &o);
    if (!ctx) {
        snprintf(why, len, "rt_new failed (its message is on stderr)");
        return -1;
    }
    char err[1024] = "";
    int rc = 0;
    for (int r = 0; r < 2 && rc == 0; r++) {
        unsigned char *m = (unsigned char *)rt_space(ctx, RT_SPACE_ACT);
        stage(c, m, total);
        if (rt_push(ctx, RT_SPACE_ACT, 0, total, err, sizeof err) != 0 || rt_step(ctx, err, sizeof err) != 0 ||
            rt_pull(ctx, RT_SPACE_ACT, 0, total, err, sizeof err) != 0) {
            snprintf(why, len, "run %d: %s", r + 1, err);
            rc = -1;
            break;
        }
        run[r] = xmalloc((size_t)total);
        memcpy(run[r], m, (size_t)total);
    }
    rt_free(ctx);
    return rc;
}

/* ---- comparing ---- */

typedef struct {
    char *buf;
    size_t len, used;
    int failed;
} Report;

static void say(Report *r, int fail, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(Report *r, int fail, const char *fmt, ...) {
    if (r->used < r->len) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(r->buf + r->used, r->len - r->used, fmt, ap);
        va_end(ap);
        if (n > 0) r->used += (size_t)n < r->len - r->used ? (size_t)n : r->len - r->used - 1;
    }
    r->failed |= fail;
}

/* one output against the twin's */
static void compare(const Ten *t, const unsigned char *g, Report *r) {
    int64_t unwritten = 0, bad = 0, first_unwritten = -1, first_bad = -1, nfin = 0;
    double scale = 0, num = 0, den = 0, worst = 0;
    int exact = t->tol.rtol == 0 && t->tol.atol == 0;
    for (int64_t i = 0; i < t->n && !t->eb; i++) {
        double y = ref_value(t, i);
        if (isfinite(y)) scale += y * y, nfin++;
    }
    den = scale; /* ||cpu||^2 over the finite elements */
    scale = nfin ? sqrt(scale / (double)nfin) : 0;
    if (scale == 0) scale = 1;
    for (int64_t i = 0; i < t->n; i++) {
        if (t->role == OUT && is_poison(t, g, i)) {
            if (unwritten++ == 0) first_unwritten = i;
            continue;
        }
        if (t->eb) {
            if (memcmp(g + i * t->eb, (const char *)t->out + i * t->eb, (size_t)t->eb) != 0 && bad++ == 0) first_bad = i;
            continue;
        }
        double x = decode(t, g, i), y = ref_value(t, i);
        if ((isnan(x) && isnan(y)) || x == y) continue;
        if (!isfinite(x) || !isfinite(y) || exact) {
            if (bad++ == 0) first_bad = i;
            worst = INFINITY;
            continue;
        }
        double e = fabs(x - y), lim = t->tol.rtol * fabs(y) + t->tol.atol * scale;
        num += e * e;
        if (e / lim > worst) worst = e / lim;
        if (e > lim && bad++ == 0) first_bad = i;
    }
    double nrel = den > 0 ? sqrt(num / den) : sqrt(num);
    say(r, 0, " %s:", t->name);
    if (unwritten)
        say(r, 1, " %lld of %lld NOT WRITTEN (first [%lld])", (long long)unwritten, (long long)t->n, (long long)first_unwritten);
    if (t->eb || exact) {
        if (bad) say(r, 1, " %lld DIFFER (first [%lld])", (long long)bad, (long long)first_bad);
        else say(r, 0, " exact");
        return;
    }
    say(r, 0, " worst %.2f of tol, nrel %.1e", worst, nrel);
    if (bad) {
        double x = decode(t, g, first_bad), y = ref_value(t, first_bad);
        say(r, 1, " %lld OUT OF TOLERANCE (first [%lld]: gpu %.8g cpu %.8g)", (long long)bad, (long long)first_bad, x, y);
    }
    if (nrel > t->tol.nrel) say(r, 1, " NREL > %.0e", t->tol.nrel);
}

/* guards and inputs unchanged, outputs as the twin's, the second run as the first */
static void judge(const Case *c, unsigned char *const *run, int64_t total, Report *r) {
    unsigned char *g = run[0], *want = xmalloc((size_t)total);
    stage(c, want, total);
    int64_t guard = 0;
    for (int64_t i = 0, k = 0; i < total; i++) {
        while (k < c->nt && i >= c->t[k].off + gpu_bytes(&c->t[k])) k++;
        int inside = k < c->nt && i >= c->t[k].off;
        if (!inside && g[i] != GUARD) guard++;
    }
    if (guard) say(r, 1, " %lld GUARD BYTES CHANGED (a write out of bounds);", (long long)guard);
    for (int k = 0; k < c->nt; k++) {
        const Ten *t = &c->t[k];
        if (t->role == IN && memcmp(g + t->off, want + t->off, (size_t)gpu_bytes(t)) != 0) say(r, 1, " INPUT %s CHANGED;", t->name);
    }
    free(want);
    for (int k = 0; k < c->nt; k++)
        if (c->t[k].role != IN) compare(&c->t[k], g + c->t[k].off, r);
    if (memcmp(run[0], run[1], (size_t)total) != 0) say(r, 1, "; THE SECOND RUN (graph replay) GAVE OTHER BITS");
}

static double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A cuDNN case whose library is older than attn_cudnn.c's graphs need
 * (its rt_fail: "cuDNN N is older than the M these graphs need"): the
 * machine's cuDNN, not kiln, so the case is skipped, not failed (the GPU
 * run of 2026-12-04 found cuDNN 9.14 first on the library path). Only that
 * reason: any other cuDNN failure fails. */
static int cudnn_too_old(const Case *c, const char *why) {
    return strstr(c->name, "(cudnn)") && strstr(why, "attention (cudnn): cuDNN ") && strstr(why, " is older than the ") &&
           strstr(why, " these graphs need");
}

/* 1 passed, 0 failed, 2 skipped */
static int run_case(Case *c, int index, int number, uint64_t seed) {
    uint64_t s = seed ^ (0x9e3779b97f4a7c15ull * (uint64_t)(index + 1));
    have = 0;
    double t0 = seconds();
    for (int k = 0; k < c->nt; k++) {
        Ten *t = &c->t[k];
        t->in = t->out = NULL;
        if (t->role != OUT) draw(t, &s);
    }
    if (c->prep) c->prep(c);
    for (int k = 0; k < c->nt; k++)
        if (c->t[k].role != IN) poison_host(&c->t[k]);
    /* the twin */
    void *hp[12];
    int64_t a[64];
    for (int k = 0; k < c->nt; k++) hp[k] = c->t[k].role == IN ? c->t[k].in : c->t[k].out;
    int n = c->args(c, hp, 0, a);
    twin_error[0] = 0;
    c->cpu(NULL, a);
    (void)n;
    double t1 = seconds();
    char text[2048] = "";
    Report r = {text, sizeof text, 0, 0};
    if (twin_error[0]) say(&r, 1, " the CPU twin failed: %s", twin_error);
    int64_t total = layout(c);
    unsigned char *run[2] = {NULL, NULL};
    char why[1200] = "";
    int skip = 0;
    if (!r.failed && run_gpu(c, total, run, why, sizeof why) != 0) {
        if (cudnn_too_old(c, why)) skip = 1;
        else say(&r, 1, " %s", why);
    }
    if (!r.failed && !skip) judge(c, run, total, &r);
    double t2 = seconds();
    if (skip) printf("ok %d - %s # SKIP %s\n", number, c->name, why);
    else printf("%s %d - %s:%s (cpu %.2fs, gpu %.2fs)\n", r.failed ? "not ok" : "ok", number, c->name, text, t1 - t0, t2 - t1);
    fflush(stdout);
    for (int k = 0; k < c->nt; k++) free(c->t[k].in), free(c->t[k].out);
    free(run[0]), free(run[1]);
    return skip ? 2 : !r.failed;
}

/* ---- cubins ---- */

static int by_name(const void *a, const void *b) { return strcmp(((const rt_cubin *)a)->name, ((const rt_cubin *)b)->name); }

static int load_cubins(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "kcheck: --cubins %s: cannot open the directory\n", dir);
        return -1;
    }
    for (struct dirent *e; (e = readdir(d));) {
        size_t len = strlen(e->d_name);
        if (len < 7 || strcmp(e->d_name + len - 6, ".cubin") != 0) continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        FILE *f = fopen(path, "rb");
        long size = -1;
        if (f && fseek(f, 0, SEEK_END) == 0) size = ftell(f);
        unsigned char *data = size > 0 ? malloc((size_t)size) : NULL;
        if (!f || !data || fseek(f, 0, SEEK_SET) != 0 || fread(data, 1, (size_t)size, f) != (size_t)size) {
            fprintf(stderr, "kcheck: %s: cannot read\n", path);
            if (f) fclose(f);
            closedir(d);
            return -1;
        }
        fclose(f);
        cubins = realloc(cubins, (size_t)(ncubins + 1) * sizeof *cubins);
        char *name = strndup(e->d_name, len - 6);
        if (!cubins || !name) {
            fprintf(stderr, "kcheck: out of memory\n");
            exit(2);
        }
        cubins[ncubins++] = (rt_cubin){name, data, size};
    }
    closedir(d);
    if (ncubins == 0) {
        fprintf(stderr, "kcheck: no .cubin files in %s (bench/gpu/prepare.sh writes them)\n", dir);
        return -1;
    }
    qsort(cubins, (size_t)ncubins, sizeof *cubins, by_name);
    return 0;
}

static const char *usage =
    "usage: kcheck --cubins DIR [--arch sm_90] [--small] [--seed N] [--only SUBSTR] [--list]\n"
    "       kcheck --cpu [--small] [--seed N] [--only SUBSTR]   (self-test, linked with the CPU runtime)\n"
    "  every CUDA library kernel (runtime/cuda/kernels_cuda.c) against its CPU twin (kernels/cpu) on random data\n";

int main(int argc, char **argv) {
    const char *dir = NULL, *only = NULL;
    int small = 0, list = 0;
    uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(f, "--small") == 0) small = 1;
        else if (strcmp(f, "--cpu") == 0) on_cpu = 1;
        else if (strcmp(f, "--list") == 0) list = 1;
        else if (strcmp(f, "--cubins") == 0 && v) dir = v, i++;
        else if (strcmp(f, "--arch") == 0 && v) arch = v, i++;
        else if (strcmp(f, "--only") == 0 && v) only = v, i++;
        else if (strcmp(f, "--seed") == 0 && v) seed = strtoull(v, NULL, 10), i++;
        else {
            fputs(usage, stderr);
            return 2;
        }
    }
    build_cases(small);
    if (list) {
        for (int i = 0; i < ncases; i++) printf("%d %s\n", i + 1, cases[i].name);
        return 0;
    }
    if (!dir && !on_cpu) {
        fputs(usage, stderr);
        return 2;
    }
    if (!on_cpu && load_cubins(dir) != 0) return 2;
    long nproc = sysconf(_SC_NPROCESSORS_ONLN);
    cpu_threads = nproc < 1 ? 1 : nproc > 16 ? 16 : (int)nproc;
    int planned = 0;
    for (int i = 0; i < ncases; i++) planned += !only || strstr(cases[i].name, only);
    if (on_cpu)
        printf("# kcheck --cpu (harness self-test on the CPU device): %d cases, seed %llu, %s shapes\n", planned,
               (unsigned long long)seed, small ? "small" : "full");
    else
        printf("# kcheck: %d cases, seed %llu, %s shapes, %d cubins from %s, arch %s, graph %s\n", planned, (unsigned long long)seed,
               small ? "small" : "full", ncubins, dir, arch, getenv("KILN_NO_GRAPH") ? "off (KILN_NO_GRAPH)" : "on");
    printf("1..%d\n", planned);
    int passed = 0, failed = 0, skipped = 0;
    for (int i = 0; i < ncases; i++) {
        if (only && !strstr(cases[i].name, only)) continue;
        int v = run_case(&cases[i], i, passed + failed + skipped + 1, seed);
        if (v == 2) skipped++;
        else if (v) passed++;
        else failed++;
    }
    if (skipped)
        printf("kcheck: %d passed, %d failed, %d skipped (seed %llu)\n", passed, failed, skipped, (unsigned long long)seed);
    else
        printf("kcheck: %d passed, %d failed (seed %llu)\n", passed, failed, (unsigned long long)seed);
    return failed ? 1 : 0;
}
