/* calibrate_cuda.c — `kiln calibrate --device cuda`: a device profile
 * measured on this machine's GPU (issue 21), by the CUDA runtime itself.
 *
 *   kiln calibrate --device cuda -o FILE.profile [--quick] [--arch sm_90] [--name NAME] [--base PROFILE]
 *   mpirun -np N kiln calibrate --device cuda -o FILE.profile   (also the links, over NCCL)
 *   kiln-calibrate-cuda --cubins DIR -o FILE.profile ...        (where kiln is not)
 *
 * Why a program of its own.  The measurements run the CUDA runtime
 * (libkilnrt_cuda.a: the launchers, cuBLASLt, NCCL, the CUDA graph), which
 * cannot share a process with the CPU runtime kiln itself links.  So
 * `kiln calibrate --device cuda` compiles the library kernels with NVRTC,
 * exactly as `kiln compile` embeds them, into a memory file (memfd), and
 * replaces itself (execv: under mpirun the rank stays the same process)
 * by this program, kiln-calibrate-cuda, built beside kiln; it reads the
 * cubins from the inherited descriptor (--cubins-fd) and measures.  On a GPU
 * machine without kiln (no LLVM, no Lua: bench/gpu/), bench/gpu/prepare.sh
 * carries it with the cubins, and check.sh runs it with --cubins.  It
 * links no NVRTC, and no MPI unless it is the multi-rank build (make's:
 * runtime/comm_mpi.o; prepare.sh's one-GPU build: comm_single.o).
 *
 * How a number is measured.  As a trainer runs: each measurement is a
 * one-kernel program (rt_program with one stream, its buffers in the act
 * space), rt_new, a first step (eager: cuBLASLt's heuristics, lazy set-up),
 * a second (captured into a CUDA graph), then timed steps, each replaying
 * the graph, wall-clock around rt_step (which waits for the GPU).  A step
 * of n1 launches and a step of n2 (n2 - n1 sized so the kernels take about
 * 2 ms: 1 ms under --quick) give the kernel's time as their difference
 * over n2 - n1, less launch_overhead_s: the step's fixed cost (the graph
 * launch, the synchronisation) cancels, and the launch's cost is the field
 * cost.c adds to every node.  Each time is the median of the timed steps
 * (9; --quick 5).  Three things a GPU would otherwise fake: the kinds'
 * single rates rotate over copies of their buffers (256 MiB in all, n1
 * one launch per copy), so a kernel whose tensors fit the L2 cache (50 MB
 * on an H200) still reads DRAM as a step's large tensors do (the
 * mem_bw_table's sizes do not: a small tensor sits in L2 in a step too);
 * the GEMM and attention inputs are random bf16, not the zeros rt_new
 * gives (tensor cores on zeros draw less power and hold higher clocks);
 * and half a second of copies runs first, so the clocks are up before
 * launch_overhead_s, which every kernel subtracts, is measured.  Under
 * mpirun every rank measures its own GPU at once (as ranks train) and the
 * slowest rank's median counts; every rank must be on one host (the
 * links measured are a node's: refused in one line otherwise), and each
 * measurement's program makes NCCL communicators anew (expect minutes).
 *
 * The fields, and what measures them (bytes as cost.c's node_bytes counts
 * the node after the precision pass: bf16 activations, f32 gradients of
 * params, f32 optimizer state):
 *
 *   peak_flops_bf16, gemm_eff  rtk_gemm (cuBLASLt, bf16 in and out, f32
 *                         accumulation) [8n,n]x[n,n], n 128..8192 (--quick
 *                         256, 1024, 4096): each size's rate over the peak,
 *                         the peak the base profile's (the datasheet's
 *                         dense rate: what MFU is read against) or the best
 *                         rate measured when that is higher;
 *   peak_flops_f32        the base profile's (the CUDA GEMMs take bf16);
 *   attn_eff, attn_bwd_eff rtk_attention / _bwd (kiln's flash kernel, the
 *                         compile default), causal, B 4 H 12 T 1024 D 64:
 *                         FLOPs as ir_node_flops counts them (4D a score
 *                         forward, 10D backward, B·H·T²/2 scores) over the
 *                         time and the peak; the tensor-core kernel
 *                         (--attention tc) is timed too when its cubin is
 *                         there, and stated in the comment;
 *   norm_bw .. sumsq_bw   each kind's kernel at GPT-2 124M's shapes (8192
 *                         rows of 768, vocabulary 50304): layernorm,
 *                         layernorm_bwd, cross_entropy, cross_entropy_fused
 *                         (xent_bwd_bw: the kind cost.c gives the fused op),
 *                         copy, sumto, adamw and sumsq (16 Mi floats);
 *   copy_bw_table         rtk_copy of 32 Mi bf16 (--quick 8 Mi) as the
 *                         attention's head permute [R,8,D] -> [8,R,D] at D
 *                         16, 64, 128, and as one run;
 *   mem_bw, mem_bw_table  rtk_copy of one contiguous run (what a fused
 *                         elementwise kernel does: 16 bytes a thread) of
 *                         64 KiB .. 256 MiB by 4x (--quick .. 16 MiB),
 *                         bytes read + written; mem_bw the largest;
 *   launch_overhead_s     (a step of 256 one-element rtk_fills - a step
 *                         of one) / 255: one more node of a replayed graph;
 *   step_overhead_s       the step of one, less a launch;
 *   h2d_bw, d2h_bw        rtk_reload / rtk_offload of 256 MiB (--quick 64)
 *                         between the act space and the pinned host space:
 *                         the offload pass's copies;
 *   memory_bytes          cuMemGetInfo's free memory with the runtime's
 *                         context, streams and workspaces up (plus the act
 *                         space of the program that measured it): what a
 *                         program's spaces may use (the total is in the
 *                         comment);
 *   intra_*, *_alpha_s, *_beta, *_table   under mpirun with 2 or more
 *                         ranks: rtk_allreduce, rtk_allgather,
 *                         rtk_reducescatter (NCCL, bf16) and rtk_send /
 *                         rtk_recv around the ring, at 64 bytes a rank and
 *                         64 KiB .. 256 MiB by 16x (--quick .. 16 MiB): α
 *                         the smallest's time over the algorithm's steps,
 *                         β the ring formula's bytes over the largest's
 *                         time less the smallest's; the tables are the
 *                         times by size.  One rank: from the base profile,
 *                         and the file says so.  One host: inter = the
 *                         base's (a node's links are not the network's);
 *   node_size             the ranks under mpirun, else the base's;
 *   host_memory_bytes     the base's.
 *
 * --small: shapes a few hundred times smaller, for the fake CUDA stack
 * (tests/cuda_fake runs the kernels on the host emulator): the numbers
 * mean nothing there, the path is what the test checks.
 *
 * The file is written atomically and read back with profile_load before
 * the command succeeds (as the CPU's, calibrate.c).  Errors: one line,
 * exit status 1; a step that fails names the measurement.
 */
#include <cuda.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kiln_rt.h"
#include "profile.h"

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("kiln: calibrate --device cuda: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* ---- the settings ---- */

static int quick, small, world = 1, rank0 = 1, reps = 9;
static double target = 2e-3; /* seconds of kernels a step of N launches aims at */
static const char *arch = "sm_90", *measuring = "";
static rt_cubin *cubins;
static int ncubins;

/* ---- the one-kernel programs ---- */

/* A launch of the step: its args, of which the bits of `act` and `host`
 * are byte offsets into the act space and the host space (the step adds
 * the bases, known only once rt_new has allocated them). */
enum { MAXA = 24 };
typedef struct {
    rt_kernel k;
    int n;
    int64_t a[MAXA];
    uint32_t act, host;
} Call;

static Call calls[2];
static int ncalls, nlaunch;
static int64_t act_top, host_top, scratch_need;
/* Rotation: launch r uses copy r % nsets of the act buffers, so a kernel
 * whose buffers fit in the GPU's L2 (50 MB on an H200) still reads DRAM,
 * as a training step's large tensors do (a kernel repeated on the same
 * buffers would time the cache).  random_fill: the act space filled with
 * bf16 values in [-1, 1) (a GEMM on zeros draws less power and holds
 * higher clocks than on data). */
enum { ROTATE_BYTES = 256 << 20 };
static int rotate, random_fill, nsets = 1;

static void calib_step(rt_ctx *c, char *const *sp) {
    for (int r = 0; r < nlaunch; r++)
        for (int j = 0; j < ncalls; j++) {
            const Call *x = &calls[j];
            int64_t a[MAXA], set = (int64_t)(r % nsets) * act_top;
            for (int i = 0; i < x->n; i++)
                a[i] = x->act >> i & 1 ? rt_ptr_arg(sp[RT_SPACE_ACT] + set + x->a[i])
                       : x->host >> i & 1 ? rt_ptr_arg(sp[RT_SPACE_HOST] + x->a[i])
                                          : x->a[i];
            rt_launch(c, 0, x->k, a, x->n, measuring);
        }
}

static rt_program prog = {.abi_version = RT_ABI_VERSION, .model = "calibrate", .nstreams = 1, .steps = 1, .step = calib_step,
                          .mesh = {1, 1, 1, 1}, .device = RT_DEV_CUDA};

/* A new measurement: no calls, empty spaces. */
static void begin(const char *what) {
    measuring = what;
    ncalls = 0, act_top = 0, host_top = 0, scratch_need = 0, rotate = 0, random_fill = 0;
}
static void begin_dram(const char *what) { /* a kind's single rate: its buffers rotated, from DRAM */
    begin(what);
    rotate = 1;
}
static int64_t buf(int64_t bytes) { /* a buffer in the act space: its offset */
    int64_t off = act_top;
    act_top += (bytes + 255) / 256 * 256;
    return off;
}
static int64_t host_buf(int64_t bytes) {
    int64_t off = host_top;
    host_top += (bytes + 255) / 256 * 256;
    return off;
}
static Call *call(rt_kernel k) {
    Call *x = &calls[ncalls++];
    memset(x, 0, sizeof *x);
    x->k = k;
    return x;
}
static void val(Call *x, int64_t v) {
    if (x->n == MAXA) die("%s: more than %d args (calibrate_cuda.c)", measuring, MAXA);
    x->a[x->n++] = v;
}
static void dev(Call *x, int64_t off) { x->act |= 1u << x->n, val(x, off); }
static void hst(Call *x, int64_t off) { x->host |= 1u << x->n, val(x, off); }
static void f64(Call *x, double d) { val(x, rt_f64_bits(d)); }

static double mem_total, mem_free; /* cuMemGetInfo: total; free with a context up, plus that program's act space */
static int dev_name_set;
static char dev_name[256] = "?";

/* The copies of the act buffers a step rotates over (1 without rotation). */
static int sets_now(void) {
    if (!rotate || act_top <= 0) return 1;
    if (small) return 2; /* the fakes: the path, cheaply */
    int64_t k = (ROTATE_BYTES + act_top - 1) / act_top;
    return k < 1 ? 1 : k > 16 ? 16 : (int)k;
}

static void fill_random(rt_ctx *c, int64_t bytes) {
    uint16_t *h = (uint16_t *)rt_space(c, RT_SPACE_ACT);
    uint32_t st = 0x2545f491u;
    for (int64_t i = 0; i < bytes / 2; i++) { /* bf16 of a uniform in [-1, 1): a float's top half */
        st = st * 1664525u + 1013904223u;
        float v = (float)(st >> 8) * (2.0f / 16777216.0f) - 1.0f;
        uint32_t u;
        memcpy(&u, &v, 4);
        h[i] = (uint16_t)(u >> 16);
    }
    char err[600];
    if (rt_push(c, RT_SPACE_ACT, 0, bytes, err, sizeof err) != 0) die("%s: filling the inputs: %s", measuring, err);
}

/* The median wall-clock seconds of a step of `launches` rounds of the
 * calls, after the eager step and the captured one; under several ranks
 * the slowest rank's median. */
static double time_step(int launches) {
    nlaunch = launches, nsets = sets_now();
    int64_t act = act_top > 0 ? act_top * nsets : 256;
    prog.space_bytes[RT_SPACE_ACT] = act;
    prog.space_bytes[RT_SPACE_HOST] = host_top;
    prog.scratch_bytes = scratch_need;
    rt_ctx *c = rt_new(&prog, NULL);
    if (!c) exit(1); /* rt_new said why, in one line (no device, a cubin for another arch, no memory) */
    if (!dev_name_set) { /* the device, once (a node's GPUs are alike): rt_new made its context current */
        size_t fr = 0, tot = 0;
        CUdevice d;
        if (cuMemGetInfo(&fr, &tot) == CUDA_SUCCESS) mem_free = (double)fr + (double)act, mem_total = (double)tot;
        if (cuDeviceGet(&d, 0) != CUDA_SUCCESS || cuDeviceGetName(dev_name, sizeof dev_name, d) != CUDA_SUCCESS) strcpy(dev_name, "?");
        dev_name_set = 1;
    }
    if (random_fill) fill_random(c, act);
    char err[800];
    double t[64];
    for (int r = 0; r < reps + 2; r++) { /* the eager step, the captured one, then replays */
        double t0 = now();
        if (rt_step(c, err, sizeof err) != 0) die("%s: the step failed: %s", measuring, err);
        if (r >= 2) t[r - 2] = now() - t0;
    }
    qsort(t, (size_t)reps, sizeof t[0], cmp_d);
    double med = t[reps / 2];
    if (world > 1) {
        double all[1024];
        if (world > 1024) die("more than 1024 ranks");
        if (rt_host_allgather(c, RT_AXIS_DP, &med, all, sizeof med, err, sizeof err) != 0) die("%s: gathering the times: %s", measuring, err);
        for (int i = 0; i < world; i++) med = fmax(med, all[i]);
    }
    rt_free(c);
    return med;
}

static double launch_s, step_s; /* launch_overhead_s, step_overhead_s */

/* Seconds one launch of the calls takes beyond launch_s: a step of n1
 * launches (one per copy of the buffers: every launch from DRAM when
 * rotating) against a step of n2 (the step's fixed cost cancels). */
static double kernel_seconds(void) {
    int n1 = sets_now();
    double t1 = time_step(n1);
    double each = fmax((t1 - step_s) / n1 - launch_s, 1e-7);
    int n2 = n1 + (small ? 1 : (int)fmin(512, fmax(n1, ceil(target / each))));
    double t2 = time_step(n2), per = (t2 - t1) / (n2 - n1);
    return fmax(per - launch_s, 0.05 * fmax(per, 1e-9)); /* noise never makes a kernel free */
}

/* ---- the measurements ---- */

static void measure_launch(void) {
    begin("launch overhead (rtk_fill of one element)");
    Call *x = call(rtk_fill);
    dev(x, buf(4)), val(x, 1), f64(x, 0), val(x, RT_F32);
    double one = time_step(1), many = time_step(256);
    launch_s = fmax(0, (many - one) / 255);
    step_s = fmax(0, one - launch_s);
}

typedef struct {
    int n;
    double mnk[8], rate[8], peak;
} Gemms;

static void measure_gemm(Gemms *G, double base_peak) {
    static const int full[] = {128, 256, 512, 1024, 2048, 4096, 8192}, fast[] = {256, 1024, 4096}, tiny[] = {8, 16, 32};
    const int *sz = small ? tiny : quick ? fast : full;
    G->n = small || quick ? 3 : 7;
    G->peak = base_peak;
    for (int i = 0; i < G->n; i++) {
        int64_t n = sz[i], m = 8 * n;
        begin("rtk_gemm bf16 [8n,n]x[n,n]");
        random_fill = 1;
        Call *x = call(rtk_gemm);
        dev(x, buf(2 * m * n)), dev(x, buf(2 * n * n)), dev(x, buf(2 * m * n));
        val(x, 1), val(x, m), val(x, n), val(x, n), val(x, 0), val(x, 0), val(x, 0), val(x, 0), val(x, 0), f64(x, 0);
        val(x, RT_BF16), val(x, RT_BF16), val(x, RT_BF16);
        double t = kernel_seconds();
        G->mnk[i] = (double)m * n * n, G->rate[i] = 2 * G->mnk[i] / t;
        G->peak = fmax(G->peak, G->rate[i]);
    }
}

typedef struct {
    int B, H, T, D;
    double tf, tb, tc_f, tc_b, ef, eb; /* seconds; the tc kernel's (0: no cubin); the fractions of peak */
} Attn;

/* Seconds of one attention launch (fwd or bwd) through launcher k. */
static double attention_at(const Attn *A, rt_kernel k, int bwd) {
    int64_t nq = (int64_t)A->B * A->H * A->T * A->D, nl = (int64_t)A->B * A->H * A->T;
    begin_dram(bwd ? "rtk_attention_bwd" : "rtk_attention");
    random_fill = 1;
    Call *x = call(k);
    int64_t q = buf(2 * nq), kk = buf(2 * nq), v = buf(2 * nq), o = buf(2 * nq), lse = buf(4 * nl);
    if (bwd) {
        dev(x, buf(2 * nq)), dev(x, q), dev(x, kk), dev(x, v), dev(x, o), dev(x, lse);
        dev(x, buf(2 * nq)), dev(x, buf(2 * nq)), dev(x, buf(2 * nq));
        scratch_need = 4 * nl;
    } else dev(x, q), dev(x, kk), dev(x, v), dev(x, o), dev(x, lse);
    val(x, A->B), val(x, A->H), val(x, A->H), val(x, A->T), val(x, A->T), val(x, A->D), val(x, 1);
    f64(x, 1 / sqrt((double)A->D)), val(x, 0), val(x, 0), val(x, 0);
    return kernel_seconds();
}

static int has_cubin(const char *name) {
    for (int i = 0; i < ncubins; i++)
        if (strcmp(cubins[i].name, name) == 0) return 1;
    return 0;
}

static void measure_attention(Attn *A, double peak) {
    *A = small ? (Attn){.B = 1, .H = 2, .T = 32, .D = 16} : (Attn){.B = 4, .H = 12, .T = 1024, .D = 64};
    double scores = (double)A->B * A->H * A->T * A->T * 0.5;
    A->tf = attention_at(A, rtk_attention, 0), A->tb = attention_at(A, rtk_attention_bwd, 1);
    A->ef = fmin(1, 4.0 * A->D * scores / (A->tf * peak)), A->eb = fmin(1, 10.0 * A->D * scores / (A->tb * peak));
    if (has_cubin("attention_tc")) A->tc_f = attention_at(A, rtk_attention_tc, 0), A->tc_b = attention_at(A, rtk_attention_bwd_tc, 1);
}

typedef struct {
    double bw[PK_NKIND];
    double run[4], run_rate[4];           /* copy_bw_table */
    int nbw;
    double bw_bytes[8], bw_rate[8];       /* mem_bw_table */
    double h2d, d2h, host_bytes;
} Kinds;

/* Bytes a second of the calls set up since begin(), moving `bytes`. */
static double rate(double bytes) { return bytes / kernel_seconds(); }

/* rtk_copy args of a rank-3 bf16 copy [d0,d1,d2] with source and destination strides. */
static void copy3(Call *x, int64_t src, int64_t dst, const int64_t d[3], const int64_t ss[3], const int64_t ds[3]) {
    dev(x, src), dev(x, dst), val(x, 2), val(x, 3);
    for (int i = 0; i < 5; i++) val(x, i < 3 ? d[i] : 1);
    for (int i = 0; i < 5; i++) val(x, i < 3 ? ss[i] : 0);
    for (int i = 0; i < 5; i++) val(x, i < 3 ? ds[i] : 0);
}

static double contiguous_copy_rate(int64_t n, int dram) { /* n bf16 elements as one run */
    begin("rtk_copy (one run)");
    rotate = dram;
    int64_t d[3] = {n, 1, 1}, s[3] = {1, 1, 1};
    copy3(call(rtk_copy), buf(2 * n), buf(2 * n), d, s, s);
    return rate(4.0 * (double)n);
}

static void measure_copies(Kinds *K) {
    int64_t n = small ? 16384 : quick ? (int64_t)8 << 20 : (int64_t)32 << 20; /* bf16 elements */
    static const int64_t Ds[3] = {16, 64, 128};
    for (int i = 0; i < 3; i++) { /* the head permute [R,H,D] -> [H,R,D] */
        int64_t D = Ds[i], H = 8, R = n / (H * D);
        begin_dram("rtk_copy (head permute)");
        int64_t d[3] = {R, H, D}, ss[3] = {H * D, D, 1}, ds[3] = {D, R * D, 1};
        copy3(call(rtk_copy), buf(2 * n), buf(2 * n), d, ss, ds);
        K->run[i] = 2.0 * (double)D, K->run_rate[i] = rate(4.0 * (double)n);
    }
    K->run[3] = 2.0 * (double)n, K->run_rate[3] = contiguous_copy_rate(n, 1);
    K->bw[PK_COPY] = K->run_rate[3];
    /* mem_bw_table: 64 KiB .. 256 MiB moved (read + written) by 4x */
    K->nbw = small ? 3 : quick ? 5 : 7;
    for (int i = 0; i < K->nbw; i++) {
        int64_t moved = ((int64_t)64 << 10) << (2 * i);
        if (small) moved = (int64_t)1024 << (2 * i);
        K->bw_bytes[i] = (double)moved, K->bw_rate[i] = contiguous_copy_rate(moved / 4, 0); /* by size: the small ones in L2, as a step's are */
    }
}

static void measure_kinds(Kinds *K) {
    int64_t R = small ? 64 : 8192, C = small ? 256 : 768, V = small ? 256 : 50304, N = small ? 16384 : (int64_t)16 << 20;
    int64_t parts = R < 512 ? R : 512;
    begin_dram("rtk_layernorm");
    Call *x = call(rtk_layernorm);
    dev(x, buf(2 * R * C)), dev(x, buf(2 * C)), dev(x, buf(2 * C)), dev(x, buf(2 * R * C)), val(x, R), val(x, C), f64(x, 1e-5);
    K->bw[PK_NORM] = rate(2.0 * (2 * R * C + 2 * C));
    begin_dram("rtk_layernorm_bwd");
    x = call(rtk_layernorm_bwd);
    dev(x, buf(2 * R * C)), dev(x, buf(2 * R * C)), dev(x, buf(2 * C)), dev(x, buf(2 * R * C)), dev(x, buf(4 * C)), dev(x, buf(4 * C));
    val(x, R), val(x, C), f64(x, 1e-5);
    scratch_need = parts * 2 * C * 4;
    K->bw[PK_NORM_BWD] = rate(2.0 * 3 * R * C + 2.0 * C + 8.0 * C);
    begin_dram("rtk_cross_entropy");
    x = call(rtk_cross_entropy);
    dev(x, buf(2 * R * V)), dev(x, buf(4 * R)), dev(x, buf(4 * R)), val(x, R), val(x, V); /* zero targets: in range */
    K->bw[PK_XENT] = rate(2.0 * R * V + 8.0 * R);
    begin_dram("rtk_cross_entropy_fused");
    x = call(rtk_cross_entropy_fused);
    dev(x, buf(4 * R)), dev(x, buf(2 * R * V)), dev(x, buf(4 * R)), dev(x, buf(2 * R * V)), dev(x, buf(4 * R)), val(x, R), val(x, V);
    K->bw[PK_XENT_BWD] = rate(4.0 * R * V + 12.0 * R);
    begin_dram("rtk_sumto");
    x = call(rtk_sumto); /* a bias's gradient: bf16 [R,C] -> f32 [C] */
    dev(x, buf(2 * R * C)), dev(x, buf(4 * C)), val(x, 2), val(x, R), val(x, C), val(x, 1), val(x, 1), val(x, 1);
    val(x, 0), val(x, 1), val(x, 0), val(x, 0), val(x, 0), val(x, RT_BF16), val(x, RT_F32);
    int64_t sparts = (R + 255) / 256;
    scratch_need = (sparts < 1024 ? sparts : 1024) * C * 4;
    K->bw[PK_SUMTO] = rate(2.0 * R * C + 4.0 * C);
    begin_dram("rtk_adamw");
    x = call(rtk_adamw);
    int64_t p = buf(4 * N), m = buf(4 * N), v = buf(4 * N), sc = buf(16);
    dev(x, p), dev(x, buf(4 * N)), dev(x, m), dev(x, v), dev(x, sc), dev(x, sc + 4), dev(x, sc + 8), dev(x, p), dev(x, m), dev(x, v);
    val(x, N), f64(x, 0.9), f64(x, 0.95), f64(x, 1e-8), f64(x, 0.0);
    K->bw[PK_ADAMW] = rate(4.0 * (7 * N + 3));
    begin_dram("rtk_sumsq");
    x = call(rtk_sumsq);
    dev(x, buf(4 * N)), dev(x, buf(4)), val(x, N), val(x, RT_F32);
    int64_t qparts = (N + 2047) / 2048;
    scratch_need = (qparts < 1024 ? qparts : 1024) * 4;
    K->bw[PK_SUMSQ] = rate(4.0 * (N + 1));
    measure_copies(K);
    /* the offload pass's copies: the act space <-> the pinned host space */
    int64_t hb = small ? (int64_t)64 << 10 : quick ? (int64_t)64 << 20 : (int64_t)256 << 20;
    K->host_bytes = (double)hb;
    begin("rtk_offload (device to pinned host)");
    x = call(rtk_offload);
    hst(x, host_buf(hb)), dev(x, buf(hb)), val(x, hb);
    K->d2h = rate((double)hb);
    begin("rtk_reload (pinned host to device)");
    x = call(rtk_reload);
    dev(x, buf(hb)), hst(x, host_buf(hb)), val(x, hb);
    K->h2d = rate((double)hb);
}

/* ---- the links ---- */

enum { NCOLL = 4 };
static const char *const coll_name[NCOLL] = {"allreduce", "allgather", "reducescatter", "p2p"};
static const char *const coll_what[NCOLL] = {"rtk_allreduce", "rtk_allgather", "rtk_reducescatter", "rtk_send to the next rank, rtk_recv from the previous"};

typedef struct {
    int ntab;
    double bytes[8], t[NCOLL][8], alpha[NCOLL], beta[NCOLL];
} Links;

/* One collective of kind k over every rank, `bytes` the full buffer
 * (bf16): the seconds of one (the slowest rank's). */
static double coll_seconds(int k, int64_t bytes) {
    int64_t n = bytes / 2 / world * world; /* elements, a multiple of the ranks */
    if (n < world) n = world;
    int64_t chunk = n / world;
    begin(coll_what[k]);
    Call *x = call(k == 0 ? rtk_allreduce : k == 1 ? rtk_allgather : k == 2 ? rtk_reducescatter : rtk_send);
    int64_t a = buf(2 * n), b = buf(2 * n);
    if (k == 0) dev(x, a), dev(x, b), val(x, n), val(x, RT_AXIS_DP), val(x, RT_BF16);
    else if (k < 3) dev(x, a), dev(x, b), val(x, 1), val(x, chunk), val(x, 1), val(x, RT_AXIS_DP), val(x, RT_BF16); /* [1, chunk, 1] <-> [1, n, 1] */
    else {
        dev(x, a), val(x, 2 * n), val(x, RT_AXIS_DP), val(x, 1), val(x, 7);
        Call *y = call(rtk_recv);
        dev(y, b), val(y, 2 * n), val(y, RT_AXIS_DP), val(y, world - 1), val(y, 7);
    }
    return kernel_seconds();
}

static void measure_links(Links *L) {
    double n = world;
    L->ntab = small ? 2 : quick ? 4 : 5;
    for (int k = 0; k < NCOLL; k++) {
        double steps = k == 0 ? 2 * (n - 1) : k == 3 ? 1 : n - 1, factor = k == 0 ? 2 * (n - 1) / n : k == 3 ? 1 : (n - 1) / n;
        for (int i = 0; i < L->ntab; i++) {
            int64_t b = i == 0 ? 64 * (int64_t)world : ((int64_t)64 << 10) << (4 * (i - 1)); /* 64 B a rank, 64 KiB, 1 MiB, 16 MiB, 256 MiB */
            L->bytes[i] = (double)b, L->t[k][i] = coll_seconds(k, b);
        }
        double small_t = L->t[k][0], big_t = L->t[k][L->ntab - 1], xfer = big_t - small_t;
        L->alpha[k] = small_t / steps;
        L->beta[k] = factor * L->bytes[L->ntab - 1] / (xfer > 0 ? xfer : big_t);
    }
}

/* ---- the cubins ---- */

static void add_cubin(const char *name, unsigned char *data, long size) {
    rt_cubin *more = realloc(cubins, (size_t)(ncubins + 1) * sizeof *cubins);
    char *copy = strdup(name);
    if (!more || !copy) die("out of memory");
    cubins = more;
    cubins[ncubins++] = (rt_cubin){copy, data, size};
}

/* Every DIR/<stem>.cubin, named <stem> (bench/gpu/prepare.sh writes them). */
static void load_cubin_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) die("--cubins %s: %s", dir, strerror(errno));
    for (struct dirent *e; (e = readdir(d));) {
        size_t len = strlen(e->d_name);
        if (len < 7 || len > 200 || strcmp(e->d_name + len - 6, ".cubin") != 0) continue;
        char path[4400], name[200];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        snprintf(name, sizeof name, "%.*s", (int)(len - 6), e->d_name);
        FILE *f = fopen(path, "rb");
        long size = -1;
        if (!f || fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) <= 0 || fseek(f, 0, SEEK_SET) != 0) die("--cubins: cannot read %s", path);
        unsigned char *data = malloc((size_t)size);
        if (!data || fread(data, 1, (size_t)size, f) != (size_t)size) die("--cubins: cannot read %s", path);
        fclose(f);
        add_cubin(name, data, size);
    }
    closedir(d);
}

/* kiln calibrate's memory file: "NAME SIZE\n" then SIZE bytes, per cubin. */
static void load_cubin_fd(const char *arg) {
    char *e;
    long fd = strtol(arg, &e, 10);
    FILE *f = *arg && !*e && fd >= 0 ? fdopen((int)fd, "rb") : NULL;
    if (!f) die("--cubins-fd %s: not an open descriptor (kiln calibrate --device cuda passes it)", arg);
    char name[200];
    long size;
    while (fscanf(f, "%199s %ld", name, &size) == 2 && fgetc(f) == '\n') {
        unsigned char *data = size > 0 ? malloc((size_t)size) : NULL;
        if (!data || fread(data, 1, (size_t)size, f) != (size_t)size) die("--cubins-fd: cubin %s is cut short", name);
        add_cubin(name, data, size);
    }
    fclose(f);
}

static int by_name(const void *a, const void *b) { return strcmp(((const rt_cubin *)a)->name, ((const rt_cubin *)b)->name); }

/* ---- the file ---- */

typedef struct {
    const Profile *base;
    const Gemms *G;
    const Attn *A;
    const Kinds *K;
    const Links *L;
    double seconds;
} Result;

static void write_fields(FILE *f, const Result *r) {
    const Profile *b = r->base;
    const Gemms *G = r->G;
    const Attn *A = r->A;
    const Kinds *K = r->K;
    fprintf(f, "name              %s\n", b->name);
    if (mem_free > 0)
        fprintf(f, "memory_bytes      %.6g   # cuMemGetInfo: free with the runtime's context, streams and workspaces up (of %.6g total): what a program's spaces may use\n",
                mem_free, mem_total);
    else fprintf(f, "memory_bytes      %.6g   # from %s (cuMemGetInfo failed)\n", b->memory_bytes, b->path);
    fprintf(f, "peak_flops_f32    %.6g   # from %s (the CUDA GEMMs take bf16)\n", b->peak_flops_f32, b->path);
    fprintf(f, "peak_flops_bf16   %.6g   # %s\n", G->peak,
            G->peak > b->peak_flops_bf16 ? "rtk_gemm's best rate measured (above the base profile's)" : "from the base profile (the datasheet's dense rate)");
    fprintf(f, "gemm_eff         ");
    for (int i = 0; i < G->n; i++) fprintf(f, " %.6g:%.4g", G->mnk[i], fmin(1, G->rate[i] / G->peak));
    fprintf(f, "   # rtk_gemm (cuBLASLt) bf16 [8n,n]x[n,n]:");
    for (int i = 0; i < G->n; i++) fprintf(f, " n %.0f %.1f TFLOP/s%s", cbrt(G->mnk[i] / 8), G->rate[i] / 1e12, i + 1 < G->n ? "," : "");
    fprintf(f, "\nattn_eff          %.4g   # rtk_attention (kiln's kernel) causal bf16 B %d H %d T %d D %d: %.4g s", A->ef, A->B, A->H, A->T, A->D, A->tf);
    if (A->tc_f > 0) fprintf(f, " (--attention tc: %.4g s, %.2fx)", A->tc_f, A->tf / A->tc_f);
    fprintf(f, "\nattn_bwd_eff      %.4g   # rtk_attention_bwd, the same: %.4g s", A->eb, A->tb);
    if (A->tc_b > 0) fprintf(f, " (--attention tc: %.4g s, %.2fx)", A->tc_b, A->tb / A->tc_b);
    fputc('\n', f);
    int64_t R = small ? 64 : 8192, C = small ? 256 : 768, V = small ? 256 : 50304, N = small ? 16384 : (int64_t)16 << 20;
    char src[PK_NKIND][200];
    snprintf(src[PK_NORM], 200, "rtk_layernorm [%lld,%lld] bf16: x, w, b read, y written", (long long)R, (long long)C);
    snprintf(src[PK_NORM_BWD], 200, "rtk_layernorm_bwd [%lld,%lld]: dy, x, w read, dx written (bf16), dw, db (f32)", (long long)R, (long long)C);
    snprintf(src[PK_XENT], 200, "rtk_cross_entropy [%lld,%lld]: bf16 logits, targets read, loss written", (long long)R, (long long)V);
    snprintf(src[PK_XENT_BWD], 200, "rtk_cross_entropy_fused [%lld,%lld] (cost.c's kind of the fused op): logits, targets, dl read, loss, dlogits written",
             (long long)R, (long long)V);
    snprintf(src[PK_COPY], 200, "rtk_copy of %.6g bf16 as one run (copy_bw_table below for shorter runs): read + written", K->run[3] / 2);
    snprintf(src[PK_SUMTO], 200, "rtk_sumto bf16 [%lld,%lld] -> f32 [%lld] (a bias's gradient): read + written", (long long)R, (long long)C, (long long)C);
    snprintf(src[PK_ADAMW], 200, "rtk_adamw of %lld f32: p, g, m, v read, p, m, v written", (long long)N);
    snprintf(src[PK_SUMSQ], 200, "rtk_sumsq of %lld f32: read", (long long)N);
    for (int k = 0; k < PK_NKIND; k++) fprintf(f, "%-17s %.6g   # %s, bytes a second\n", profile_kind_fields[k], K->bw[k], src[k]);
    fprintf(f, "copy_bw_table    ");
    for (int i = 0; i < 4; i++) fprintf(f, " %.6g:%.6g", K->run[i], K->run_rate[i]);
    fprintf(f, "   # rtk_copy bf16 [R,8,D]->[8,R,D], D 16, 64, 128, then one run: bytes read + written a second by a contiguous run's bytes\n");
    fprintf(f, "mem_bw            %.6g   # rtk_copy of one run of %.6g bytes moved (read + written): the largest of the table\n", K->bw_rate[K->nbw - 1],
            K->bw_bytes[K->nbw - 1]);
    fprintf(f, "mem_bw_table     ");
    for (int i = 0; i < K->nbw; i++) fprintf(f, " %.6g:%.6g", K->bw_bytes[i], K->bw_rate[i]);
    fprintf(f, "   # rtk_copy of one contiguous run (16 bytes a thread, as the generated elementwise kernels move them): bytes read + written a second by the bytes moved\n");
    fprintf(f, "launch_overhead_s %.4g   # (a step of 256 one-element rtk_fills - a step of 1) / 255, the step a replayed CUDA graph\n", launch_s);
    fprintf(f, "step_overhead_s   %.4g   # a step of one rtk_fill less a launch: the graph's launch and the synchronisation\n", step_s);
    fprintf(f, "h2d_bw            %.6g   # rtk_reload of %.6g bytes, pinned host space to the act space\n", K->h2d, K->host_bytes);
    fprintf(f, "d2h_bw            %.6g   # rtk_offload of %.6g bytes, the act space to the pinned host space\n", K->d2h, K->host_bytes);
}

static void write_links(FILE *f, const Result *r) {
    const Profile *b = r->base;
    const Links *L = r->L;
    if (world < 2) {
        fprintf(f, "intra_alpha_s     %.4g   # not measured (one rank: run under mpirun -np 2 or more); from %s\n", b->intra_alpha, b->path);
        fprintf(f, "intra_beta        %.6g   # as intra_alpha_s\n", b->intra_beta);
    } else {
        fprintf(f, "intra_alpha_s     %.4g   # rtk_allreduce (NCCL) over %d local ranks: %.6g bytes in %.4g s over 2(n-1) steps\n", L->alpha[0], world, L->bytes[0],
                L->t[0][0]);
        fprintf(f, "intra_beta        %.6g   # the same, %.6g bytes in %.4g s: 2(n-1)/n of them a link, less the small one's time\n", L->beta[0],
                L->bytes[L->ntab - 1], L->t[0][L->ntab - 1]);
    }
    fprintf(f, "inter_alpha_s     %.4g   # one host: from %s\n", b->inter_alpha, b->path);
    fprintf(f, "inter_beta        %.6g   # one host: from %s\n", b->inter_beta, b->path);
    for (int k = 0; k < NCOLL && world > 1; k++) {
        fprintf(f, "%s_alpha_s %.4g   # %s, %d ranks, bf16: %.6g bytes in %.4g s over %s steps\n", coll_name[k], L->alpha[k], coll_what[k], world, L->bytes[0],
                L->t[k][0], k == 0 ? "2(n-1)" : k == 3 ? "1" : "n-1");
        fprintf(f, "%s_beta %.6g   # the same, %.6g bytes in %.4g s: %s of them a link, less the small one's time\n", coll_name[k], L->beta[k],
                L->bytes[L->ntab - 1], L->t[k][L->ntab - 1], k == 0 ? "2(n-1)/n" : k == 3 ? "all" : "(n-1)/n");
        fprintf(f, "%s_table", coll_name[k]);
        for (int i = 0; i < L->ntab; i++) fprintf(f, " %.6g:%.4g", L->bytes[i], L->t[k][i]);
        fprintf(f, "   # %s, %d ranks: the median seconds by the full buffer's bytes (the slowest rank's)\n", coll_what[k], world);
    }
    fprintf(f, "node_size         %d   # %s\n", world > 1 ? world : b->node_size, world > 1 ? "the ranks under mpirun" : "from the base profile");
    if (b->host_memory_bytes > 0) fprintf(f, "host_memory_bytes %.6g   # from %s\n", b->host_memory_bytes, b->path);
}

static void write_profile(const Result *r, const char *path, const char *name) {
    char tmp[4200], when[64], host[256], err[1300];
    FILE *f = profile_create(path, tmp, sizeof tmp, when, host, err, sizeof err);
    if (!f) die("%s", err);
    fprintf(f, "# Measured by `kiln calibrate --device cuda%s%s` on %s (%s, %s) at %s, %d rank%s, in %.0f s.\n", quick ? " --quick" : "",
            small ? " --small (the fake CUDA stack's shapes: not a measurement)" : "", dev_name, host, arch, when, world, world == 1 ? "" : "s", r->seconds);
    fprintf(f, "# Each number: the median of timed steps of a one-kernel program through the CUDA runtime, its CUDA graph\n"
               "# replayed (compiler/cmd/calibrate_cuda.c); the fields it does not measure come from %s.\n",
            r->base->path);
    Profile named = *r->base;
    snprintf(named.name, sizeof named.name, "%s", name);
    Result rn = *r;
    rn.base = &named;
    write_fields(f, &rn);
    write_links(f, &rn);
    if (fclose(f) != 0) {
        unlink(tmp);
        die("-o: cannot write %s: %s", tmp, strerror(errno));
    }
    if (profile_commit(tmp, path, err, sizeof err) != 0) die("%s", err);
}

/* ---- the command ---- */

/* Clocks up before anything is timed (an idle GPU runs at low clocks, and
 * launch_overhead_s, measured first, is subtracted from every kernel):
 * about half a second of copies. */
static void warm_up(void) {
    begin("warm-up (rtk_copy)");
    int64_t n = small ? 1024 : (int64_t)32 << 20, d[3] = {n, 1, 1}, one[3] = {1, 1, 1};
    copy3(call(rtk_copy), buf(2 * n), buf(2 * n), d, one, one);
    time_step(small ? 1 : 1024);
}

/* The first of the launchers' variables that is set, else `none`. */
static int env_int(const char *const *names, int none) {
    for (int i = 0; names[i]; i++) {
        const char *v = getenv(names[i]);
        if (v && *v) return atoi(v);
    }
    return none;
}

static void usage(void) {
    die("usage: kiln-calibrate-cuda --cubins DIR -o FILE.profile [--quick] [--small] [--arch sm_XX] [--name NAME] [--base PROFILE]"
        " (kiln calibrate --device cuda passes --cubins-fd N in place of --cubins)");
}

int main(int argc, char **argv) {
    const char *out = NULL, *dir = NULL, *fd = NULL, *name = "cuda-calibrated", *base_name = "h200-sxm";
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (strcmp(f, "--quick") == 0) { quick = 1; continue; }
        if (strcmp(f, "--small") == 0) { small = 1; continue; }
        if (i + 1 >= argc) die("%s: missing value (or unknown flag)", f);
        if (strcmp(f, "-o") == 0) out = argv[++i];
        else if (strcmp(f, "--cubins") == 0) dir = argv[++i];
        else if (strcmp(f, "--cubins-fd") == 0) fd = argv[++i];
        else if (strcmp(f, "--name") == 0) name = argv[++i];
        else if (strcmp(f, "--base") == 0) base_name = argv[++i];
        else if (strcmp(f, "--arch") == 0) arch = argv[++i];
        else if (strcmp(f, "--device") == 0) {
            if (strcmp(argv[++i], "cuda") != 0) die("--device: this program measures cuda, got \"%s\"", argv[i]);
        } else die("%s: unknown flag", f);
    }
    if (!out || !dir == !fd) usage();
    if (!*name || strpbrk(name, " \t#") || strlen(name) >= 64) die("--name: expected one word under 64 characters, got \"%s\"", name);
    if (dir) load_cubin_dir(dir);
    else load_cubin_fd(fd);
    if (ncubins == 0) die("no cubins in %s (kiln calibrate --device cuda or bench/gpu/prepare.sh writes them)", dir ? dir : "--cubins-fd");
    qsort(cubins, (size_t)ncubins, sizeof *cubins, by_name);
    static Profile base;
    char err[1200];
    if (profile_load(&base, base_name, err, sizeof err) != 0) die("--base: %s", err);
    static const char *const sizes[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", NULL};
    static const char *const ranks[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", NULL};
    static const char *const locals[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", NULL};
    world = env_int(sizes, 1), rank0 = env_int(ranks, 0) == 0;
    if (world < 1) world = 1;
    int local = env_int(locals, world);
    if (world > 1 && local != world)
        die("the links measured are one node's: run every rank on one host (%d ranks, %d on this one); the network between nodes is the base profile's", world,
            local);
    prog.mesh[1] = world, prog.arch = arch, prog.ncubins = ncubins, prog.cubins = cubins;
    if (quick) reps = 5, target = 1e-3;
    if (small) reps = 3;
    double t0 = now();
    static Gemms G;
    static Attn A;
    static Kinds K;
    static Links L;
    warm_up();
    measure_launch();
    measure_gemm(&G, base.peak_flops_bf16);
    measure_attention(&A, G.peak);
    measure_kinds(&K);
    if (world > 1) measure_links(&L);
    Result r = {&base, &G, &A, &K, &L, now() - t0};
    if (rank0) {
        write_profile(&r, out, name);
        printf("calibrate: %s in %.1f s on %s: bf16 GEMM %.1f TFLOP/s (n %.0f), attention %.1f%% of peak forward, mem_bw %.0f GB/s, "
               "h2d %.1f GB/s, launch %.3g s%s\n",
               out, r.seconds, dev_name, G.peak / 1e12, cbrt(G.mnk[G.n - 1] / 8), 100 * A.ef, K.bw_rate[K.nbw - 1] / 1e9, K.h2d / 1e9, launch_s,
               world > 1 ? "" : ", links not measured (one rank)");
    }
    return 0;
}
