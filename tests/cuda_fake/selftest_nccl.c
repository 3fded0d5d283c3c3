/* selftest_nccl.c — the fake libnccl.so.2 (fake_nccl.c) with several ranks,
 * on its own: `selftest_nccl N` forks N processes (the ranks; the ids are
 * made before the fork, as MPI_Bcast would share them), each runs the fake
 * driver and NCCL, and the parent prints one TAP line per property, "ok"
 * when every rank saw it.  Built like selftest.c: linked against the REAL
 * libcuda stub and libnccl.so.2, run with LD_LIBRARY_PATH at the fakes.
 *
 * Scenarios (each a fresh set of N processes; the parent sets the
 * environment before forking: KILN_FAKE_NCCL_CHUNK=256, so that every
 * call below takes several rounds or chunks):
 *   - good: ncclAllReduce f32 (out of place), bf16 (in place), i32;
 *     ncclReduceScatter f32 out of place and in NCCL's in-place form;
 *     ncclAllGather bf16 out of place and in place; other overlaps of the
 *     buffers refused at the call (undefined in NCCL); a ring {send to i+1 on
 *     one stream, recv from i-1 on another} in one group, as comm_nccl.c
 *     issues ring attention's pass (ncclUint8 counts); two messages each way
 *     plus a send to itself in one group; a lone send and receive ordered so
 *     that they cannot deadlock (rank 0 sends first, the others receive
 *     first); two communicators (the world and halves of it) interleaved;
 *     and a CUDA graph over two streams with an all-reduce and a ring
 *     group, replayed three times with new inputs, in enqueue and in
 *     reverse order (KILN_FAKE_CUDA_GRAPH_ORDER=reverse).  Inputs are small
 *     integers, so every sum is exact in every type: the expected bits are
 *     computed here, independently of the fake.
 *   - the errors, each must fail on EVERY rank, quickly (not by a timeout)
 *     unless a timeout is the point: counts that differ between ranks,
 *     types that differ, different collectives, a send and its receive of
 *     different sizes, the same mismatch inside a replayed graph
 *     (cuGraphLaunch -> CUDA_ERROR_LAUNCH_FAILED), sends to each other
 *     outside a group (NCCL deadlocks: here ncclSystemError after
 *     KILN_FAKE_NCCL_TIMEOUT=1), ranks that disagree on the rank count, a
 *     communicator one rank never joins (timeout), and a rank that exits
 *     (the others fail at once, ncclRemoteError);
 *   - the planted bug KILN_FAKE_NCCL_TEST_DROP_RANK=1 must make the
 *     all-reduce check fail on every rank.
 * Exit status 1 when a line is "not ok".
 */
#include <cuda.h>
#include <nccl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAXR 8
#define MAXCHK 24
#define SCENARIO_LIMIT_S 60

/* ---- results, shared between the ranks and the parent ---- */

typedef struct {
    int used;
    char name[300];
    int reported[MAXR], ok[MAXR];
    char why[MAXR][400];
} Check;

static Check *checks;          /* MAXCHK, in shared memory */
static int nranks, rank, ncheck;

static void record(int ok, const char *name, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void record(int ok, const char *name, const char *fmt, ...) {
    Check *c = &checks[ncheck++];
    if (ncheck > MAXCHK) abort();
    if (rank == 0) snprintf(c->name, sizeof c->name, "%s", name), c->used = 1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->why[rank], sizeof c->why[rank], fmt, ap);
    va_end(ap);
    c->ok[rank] = ok, c->reported[rank] = 1;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static const char *nccl_name(ncclResult_t r) {
    static const char *const names[] = {"ncclSuccess", "ncclUnhandledCudaError", "ncclSystemError", "ncclInternalError",
                                        "ncclInvalidArgument", "ncclInvalidUsage", "ncclRemoteError", "ncclInProgress"};
    return (unsigned)r < sizeof names / sizeof *names ? names[r] : "?";
}

/* ---- a rank's world ---- */

typedef struct {
    CUcontext ctx;
    CUstream s0, s1;
    ncclComm_t world;
    ncclUniqueId ids[3]; /* the world, the lower half, the upper half */
} Rank;

static int val(int r, long e) { return (int)((e * 7 + r * 13) % 31) - 15; } /* small integers: exact sums */

static uint16_t to_bf16(float f) { /* exact for the small integers used here */
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

static CUdeviceptr dalloc(size_t bytes) {
    CUdeviceptr p = 0;
    if (cuMemAlloc(&p, bytes) != CUDA_SUCCESS) {
        fprintf(stderr, "selftest_nccl: rank %d: cuMemAlloc(%zu) failed\n", rank, bytes);
        _exit(3);
    }
    return p;
}

static void *P(CUdeviceptr p) { return (void *)(uintptr_t)p; }

/* rank r's values val(r + shift, e) of type t (0 f32, 1 bf16, 2 i32) at d */
static void upload(CUdeviceptr d, int t, int r, long n, int shift) {
    size_t es = t == 1 ? 2 : 4;
    unsigned char *h = malloc((size_t)n * es);
    for (long e = 0; e < n; e++) {
        int v = val(r + shift, e);
        float f = (float)v;
        uint16_t b = to_bf16(f);
        if (t == 0) memcpy(h + 4 * e, &f, 4);
        else if (t == 1) memcpy(h + 2 * e, &b, 2);
        else memcpy(h + 4 * e, &v, 4);
    }
    cuMemcpyHtoD(d, h, (size_t)n * es);
    free(h);
}

/* Element e of d (type t) as an int; the index of the first element that
 * differs from want(e), or -1.  want_of(e, arg). */
static long first_bad(CUdeviceptr d, int t, long n, int (*want)(long e, const long *arg), const long *arg, int *got, int *exp) {
    size_t es = t == 1 ? 2 : 4;
    unsigned char *h = malloc((size_t)n * es + 1);
    long bad = -1;
    if (cuMemcpyDtoH(h, d, (size_t)n * es) != CUDA_SUCCESS) bad = 0, *got = -999, *exp = 0;
    for (long e = 0; e < n && bad < 0; e++) {
        int v;
        if (t == 0) {
            float f;
            memcpy(&f, h + 4 * e, 4);
            v = (int)f;
            if ((float)v != f) v = -12345;
        } else if (t == 1) {
            uint16_t b;
            memcpy(&b, h + 2 * e, 2);
            uint32_t u = (uint32_t)b << 16;
            float f;
            memcpy(&f, &u, 4);
            v = (int)f;
            if ((float)v != f) v = -12345;
        } else memcpy(&v, h + 4 * e, 4);
        if (v != want(e, arg)) bad = e, *got = v, *exp = want(e, arg);
    }
    free(h);
    return bad;
}

/* arg: {shift, first rank, ranks, offset} */
static int sum_of(long e, const long *a) {
    int s = 0;
    for (long r = a[1]; r < a[1] + a[2]; r++) s += val((int)(r + a[0]), e + a[3]);
    return s;
}
static int one_rank(long e, const long *a) { return val((int)a[1], e + a[3]); } /* a[1]: the rank */
static int gathered(long e, const long *a) { return val((int)(e / a[2]), e % a[2]); } /* a[2]: chunk length */

static int check_buf(const char *name, CUdeviceptr d, int t, long n, int (*want)(long, const long *), const long *arg) {
    int got = 0, exp = 0;
    long bad = first_bad(d, t, n, want, arg, &got, &exp);
    record(bad < 0, name, bad < 0 ? "%ld elements exact" : "element %ld is %d, want %d", bad < 0 ? n : bad, got, exp);
    return bad < 0;
}

static int sync_ok(void) { return cuStreamSynchronize(NULL) == CUDA_SUCCESS && cuCtxSynchronize() == CUDA_SUCCESS; }

/* ---- the good scenario ---- */

static void good_collectives(Rank *R) {
    long n = 1000, rs = 300, ag = 250;
    CUdeviceptr x = dalloc(4 * (size_t)n * MAXR), y = dalloc(4 * (size_t)n * MAXR);
    long all[4] = {0, 0, nranks, 0};
    upload(x, 0, rank, n, 0);
    ncclResult_t r = ncclAllReduce(P(x), P(y), (size_t)n, ncclFloat32, ncclSum, R->world, R->s1);
    if (r) record(0, "ncclAllReduce f32, 1000 elements (16 rounds of 256 bytes), out of place: the exact sums", "%s", nccl_name(r));
    else check_buf("ncclAllReduce f32, 1000 elements (16 rounds of 256 bytes), out of place: the exact sums", y, 0, n, sum_of, all);
    upload(x, 1, rank, 777, 0);
    r = ncclAllReduce(P(x), P(x), 777, ncclBfloat16, ncclSum, R->world, R->s0);
    if (r) record(0, "ncclAllReduce bf16 in place, 777 elements", "%s", nccl_name(r));
    else check_buf("ncclAllReduce bf16 in place, 777 elements", x, 1, 777, sum_of, all);
    upload(x, 2, rank, 33, 0);
    r = ncclAllReduce(P(x), P(y), 33, ncclInt32, ncclSum, R->world, R->s1);
    if (r) record(0, "ncclAllReduce i32, 33 elements", "%s", nccl_name(r));
    else check_buf("ncclAllReduce i32, 33 elements", y, 2, 33, sum_of, all);

    /* reduce-scatter: rank i gets the sums of chunk i */
    long mine[4] = {0, 0, nranks, rank * rs};
    upload(x, 0, rank, rs * nranks, 0);
    r = ncclReduceScatter(P(x), P(y), (size_t)rs, ncclFloat32, ncclSum, R->world, R->s1);
    if (r) record(0, "ncclReduceScatter f32, 300 per rank, out of place", "%s", nccl_name(r));
    else check_buf("ncclReduceScatter f32, 300 per rank, out of place", y, 0, rs, sum_of, mine);
    upload(x, 0, rank, rs * nranks, 0);
    r = ncclReduceScatter(P(x), P(x + (size_t)(rank * rs * 4)), (size_t)rs, ncclFloat32, ncclSum, R->world, R->s1);
    if (r) record(0, "ncclReduceScatter f32 in place (recv = send + rank * recvcount)", "%s", nccl_name(r));
    else check_buf("ncclReduceScatter f32 in place (recv = send + rank * recvcount)", x + (size_t)(rank * rs * 4), 0, rs, sum_of, mine);

    /* all-gather: chunk r of the result is rank r's input */
    long chunk[4] = {0, 0, ag, 0};
    upload(x, 1, rank, ag, 0);
    r = ncclAllGather(P(x), P(y), (size_t)ag, ncclBfloat16, R->world, R->s0);
    if (r) record(0, "ncclAllGather bf16, 250 per rank, out of place", "%s", nccl_name(r));
    else check_buf("ncclAllGather bf16, 250 per rank, out of place", y, 1, ag * nranks, gathered, chunk);
    upload(y + (size_t)(rank * ag * 2), 1, rank, ag, 0);
    r = ncclAllGather(P(y + (size_t)(rank * ag * 2)), P(y), (size_t)ag, ncclBfloat16, R->world, R->s0);
    if (r) record(0, "ncclAllGather bf16 in place (send = recv + rank * sendcount)", "%s", nccl_name(r));
    else check_buf("ncclAllGather bf16 in place (send = recv + rank * sendcount)", y, 1, ag * nranks, gathered, chunk);

    /* overlaps other than NCCL's in-place forms are refused at the call */
    ncclResult_t e1 = ncclAllReduce(P(x), P(x + 4), 100, ncclFloat32, ncclSum, R->world, R->s0);
    ncclResult_t e2 = ncclReduceScatter(P(x), P(x + (size_t)(rank * 100 * 4) + 4), 100, ncclFloat32, ncclSum, R->world, R->s0);
    ncclResult_t e3 = ncclAllGather(P(y + (size_t)((nranks - 1 - rank) * 100 * 4) + 8), P(y), 100, ncclFloat32, R->world, R->s0);
    record(e1 == ncclInvalidArgument && e2 == ncclInvalidArgument && e3 == ncclInvalidArgument,
           "overlapping buffers that are not NCCL's in-place form (all-reduce, reduce-scatter, all-gather) -> ncclInvalidArgument at "
           "the call",
           "%s, %s, %s", nccl_name(e1), nccl_name(e2), nccl_name(e3));
    cuMemFree(x), cuMemFree(y);
}

/* {send to i+1 on s1, recv from i-1 on s0} in one group; bytes bytes */
static ncclResult_t ring(Rank *R, CUdeviceptr x, CUdeviceptr y, size_t bytes) {
    ncclResult_t r = ncclGroupStart(), e;
    if (!r) r = ncclSend(P(x), bytes, ncclUint8, (rank + 1) % nranks, R->world, R->s1);
    if (!r) r = ncclRecv(P(y), bytes, ncclUint8, (rank + nranks - 1) % nranks, R->world, R->s0);
    e = ncclGroupEnd();
    return r ? r : e;
}

static void good_p2p(Rank *R) {
    long n = 1000;
    CUdeviceptr x = dalloc(4 * (size_t)n), y = dalloc(4 * (size_t)n), z = dalloc(4 * (size_t)n), w = dalloc(4 * (size_t)n);
    int prev = (rank + nranks - 1) % nranks, next = (rank + 1) % nranks;
    long from_prev[4] = {0, prev, 1, 0};
    upload(x, 0, rank, n, 0);
    ncclResult_t r = ring(R, x, y, 4 * (size_t)n);
    const char *name = "ring pass as comm_nccl.c issues it: {ncclSend to i+1 on one stream, ncclRecv from i-1 on another} in "
                       "one group, 4000 bytes (16 chunks)";
    if (r || !sync_ok()) record(0, name, "%s", nccl_name(r));
    else check_buf(name, y, 0, n, one_rank, from_prev);

    /* two messages each way and one to itself, in one group */
    upload(x, 0, rank, n, 0), upload(w, 0, rank, n, 5);
    r = ncclGroupStart();
    ncclResult_t e[7];
    e[0] = ncclSend(P(x), 600, ncclFloat32, next, R->world, R->s0);
    e[1] = ncclRecv(P(y), 600, ncclFloat32, prev, R->world, R->s0);
    e[2] = ncclSend(P(w), 400, ncclFloat32, next, R->world, R->s0);
    e[3] = ncclRecv(P(y + 2400), 400, ncclFloat32, prev, R->world, R->s0);
    e[4] = ncclSend(P(x), 50, ncclInt32, rank, R->world, R->s0);
    e[5] = ncclRecv(P(z), 50, ncclInt32, rank, R->world, R->s0);
    e[6] = ncclGroupEnd();
    for (int i = 0; i < 7; i++) r = r ? r : e[i];
    long self[4] = {0, rank, 1, 0};
    name = "one group: two messages to i+1 and from i-1 (in order) and a send to itself";
    int got = 0, exp = 0;
    long b1 = -2, b2 = -2, b3 = -2;
    if (!r && sync_ok()) {
        b1 = first_bad(y, 0, 600, one_rank, from_prev, &got, &exp);
        if (b1 < 0) b2 = first_bad(y + 2400, 0, 400, sum_of, (long[4]){5, prev, 1, 0}, &got, &exp);
        if (b1 < 0 && b2 < 0) b3 = first_bad(z, 0, 50, one_rank, self, &got, &exp);
    }
    record(!r && b1 < 0 && b2 < 0 && b3 < 0, name, "%s; first bad elements %ld %ld %ld (%d, want %d)", nccl_name(r), b1, b2, b3, got, exp);

    /* lone calls, ordered so that they cannot deadlock: rank 0 sends then
     * receives, the others receive then send (a chain around the ring) */
    upload(x, 0, rank, n, 0);
    if (rank == 0) {
        r = ncclSend(P(x), (size_t)n, ncclFloat32, next, R->world, R->s0);
        if (!r) r = ncclRecv(P(y), (size_t)n, ncclFloat32, prev, R->world, R->s0);
    } else {
        r = ncclRecv(P(y), (size_t)n, ncclFloat32, prev, R->world, R->s0);
        if (!r) r = ncclSend(P(x), (size_t)n, ncclFloat32, next, R->world, R->s0);
    }
    name = "lone ncclSend / ncclRecv outside a group, in an order that completes (a chain around the ring)";
    if (r) record(0, name, "%s", nccl_name(r));
    else check_buf(name, y, 0, n, one_rank, from_prev);
    cuMemFree(x), cuMemFree(y), cuMemFree(z), cuMemFree(w);
}

static void good_two_comms(Rank *R) {
    int half = nranks / 2 ? nranks / 2 : 1, lower = rank < half, first = lower ? 0 : half, size = lower ? half : nranks - half;
    ncclComm_t sub = NULL;
    ncclResult_t r = ncclCommInitRank(&sub, size, R->ids[lower ? 1 : 2], rank - first);
    long n = 500;
    CUdeviceptr x = dalloc(4 * (size_t)n), y = dalloc(4 * (size_t)n), z = dalloc(4 * (size_t)n);
    upload(x, 0, rank, n, 0);
    if (!r) r = ncclAllReduce(P(x), P(y), (size_t)n, ncclFloat32, ncclSum, R->world, R->s0);
    if (!r) r = ncclAllReduce(P(x), P(z), (size_t)n, ncclFloat32, ncclSum, sub, R->s1);
    if (!r) r = ncclAllReduce(P(y), P(y), (size_t)n, ncclFloat32, ncclSum, R->world, R->s0);
    char name[200];
    snprintf(name, sizeof name, "two communicators (the world, and halves of %d ranks) interleaved: the world's sums twice, the half's", half);
    long all[4] = {0, 0, nranks, 0}, part[4] = {0, first, size, 0};
    int got = 0, exp = 0;
    long b1 = -2, b2 = -2;
    if (!r) {
        b1 = first_bad(z, 0, n, sum_of, part, &got, &exp);
        /* y = nranks * the world's sums */
        float *h = malloc(4 * (size_t)n);
        cuMemcpyDtoH(h, y, 4 * (size_t)n);
        b2 = -1;
        for (long e = 0; e < n && b2 < 0; e++)
            if (h[e] != (float)(nranks * sum_of(e, all))) b2 = e, got = (int)h[e], exp = nranks * sum_of(e, all);
        free(h);
    }
    record(!r && b1 < 0 && b2 < 0, name, "%s; first bad %ld %ld (%d, want %d)", nccl_name(r), b1, b2, got, exp);
    if (sub) ncclCommDestroy(sub);
    cuMemFree(x), cuMemFree(y), cuMemFree(z);
}

/* A graph over s0 and s1: an all-reduce on s1, a ring group (send on s1,
 * recv on s0), joined back; replayed with new inputs. */
static void good_graph(Rank *R, const char *order) {
    long n = 700;
    CUdeviceptr x = dalloc(4 * (size_t)n), y = dalloc(4 * (size_t)n), z = dalloc(4 * (size_t)n);
    CUevent fork, joinev;
    CUgraph g = NULL;
    CUgraphExec ex = NULL;
    int prev = (rank + nranks - 1) % nranks, ok = 1;
    char why[300] = "";
    ok = cuEventCreate(&fork, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS && cuEventCreate(&joinev, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS;
    ok = ok && cuStreamBeginCapture(R->s0, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS;
    ok = ok && cuEventRecord(fork, R->s0) == CUDA_SUCCESS && cuStreamWaitEvent(R->s1, fork, 0) == CUDA_SUCCESS;
    ncclResult_t r = ok ? ncclAllReduce(P(x), P(y), (size_t)n, ncclFloat32, ncclSum, R->world, R->s1) : ncclSuccess;
    if (ok && !r) r = ring(R, x, z, 4 * (size_t)n);
    ok = ok && !r && cuEventRecord(joinev, R->s1) == CUDA_SUCCESS && cuStreamWaitEvent(R->s0, joinev, 0) == CUDA_SUCCESS;
    CUresult cr = cuStreamEndCapture(R->s0, &g);
    ok = ok && cr == CUDA_SUCCESS;
    if (order) setenv("KILN_FAKE_CUDA_GRAPH_ORDER", order, 1);
    ok = ok && cuGraphInstantiate(&ex, g, 0) == CUDA_SUCCESS;
    unsetenv("KILN_FAKE_CUDA_GRAPH_ORDER");
    if (!ok) snprintf(why, sizeof why, "capture: %s, end capture CUresult %d", nccl_name(r), (int)cr);
    for (int it = 0; it < 3 && ok; it++) {
        upload(x, 0, rank, n, 10 * it);
        cr = cuGraphLaunch(ex, R->s0);
        if (cr || cuStreamSynchronize(R->s0)) {
            ok = 0, snprintf(why, sizeof why, "replay %d: CUresult %d", it, (int)cr);
            break;
        }
        long all[4] = {10 * it, 0, nranks, 0}, from_prev[4] = {0, prev + 10 * it, 1, 0};
        int got = 0, exp = 0;
        long b1 = first_bad(y, 0, n, sum_of, all, &got, &exp), b2 = b1 < 0 ? first_bad(z, 0, n, one_rank, from_prev, &got, &exp) : -2;
        if (b1 >= 0 || b2 >= 0) ok = 0, snprintf(why, sizeof why, "replay %d: element %ld/%ld is %d, want %d", it, b1, b2, got, exp);
    }
    char name[300];
    snprintf(name, sizeof name,
             "CUDA graph over 2 streams (ncclAllReduce on one, the ring group across both, joined), %s replay order: 3 replays "
             "with new inputs give their exact results",
             order ? order : "enqueue");
    record(ok, name, "%s", ok ? "3 replays exact" : why);
    if (ex) cuGraphExecDestroy(ex);
    if (g) cuGraphDestroy(g);
    cuEventDestroy(fork), cuEventDestroy(joinev);
    cuMemFree(x), cuMemFree(y), cuMemFree(z);
}

static void scenario_good(Rank *R) {
    double t0 = now_s();
    good_collectives(R);
    good_p2p(R);
    good_two_comms(R);
    good_graph(R, NULL);
    good_graph(R, "reverse");
    record(1, "(timing)", "%.2f s", now_s() - t0);
}

/* ---- errors: every rank must fail ---- */

/* ok when r is in want[] (0-terminated) and came within max_s seconds */
static void expect_all(const char *name, ncclResult_t r, double t0, double max_s, const ncclResult_t *want) {
    double dt = now_s() - t0;
    int in = 0;
    for (int i = 0; want[i]; i++) in |= r == want[i];
    record(in && dt <= max_s, name, "%s in %.2f s (at most %.1f s)", nccl_name(r), dt, max_s);
}

static void scenario_count(Rank *R) {
    CUdeviceptr x = dalloc(4096);
    double t0 = now_s();
    ncclResult_t r = ncclAllReduce(P(x), P(x), 100 + (size_t)rank, ncclFloat32, ncclSum, R->world, R->s0);
    expect_all("ncclAllReduce with 100 + rank elements: every rank -> ncclInvalidUsage, at once (not a timeout)", r, t0, 3,
               (ncclResult_t[]){ncclInvalidUsage, 0});
    cuMemFree(x);
}

static void scenario_dtype(Rank *R) {
    CUdeviceptr x = dalloc(4096);
    double t0 = now_s();
    ncclResult_t r = ncclAllReduce(P(x), P(x), 100, rank ? ncclBfloat16 : ncclFloat32, ncclSum, R->world, R->s0);
    expect_all("ncclAllReduce f32 on rank 0, bf16 on the others: every rank -> ncclInvalidUsage, at once", r, t0, 3,
               (ncclResult_t[]){ncclInvalidUsage, 0});
    cuMemFree(x);
}

static void scenario_kind(Rank *R) {
    CUdeviceptr x = dalloc(4096 * MAXR);
    double t0 = now_s();
    ncclResult_t r = rank ? ncclAllGather(P(x + (size_t)(rank * 400)), P(x), 100, ncclFloat32, R->world, R->s0)
                          : ncclAllReduce(P(x), P(x), 100, ncclFloat32, ncclSum, R->world, R->s0);
    expect_all("ncclAllReduce on rank 0, ncclAllGather on the others: every rank -> ncclInvalidUsage, at once", r, t0, 3,
               (ncclResult_t[]){ncclInvalidUsage, 0});
    cuMemFree(x);
}

static void scenario_p2p_size(Rank *R) {
    CUdeviceptr x = dalloc(4096), y = dalloc(4096);
    double t0 = now_s();
    ncclResult_t r = ncclGroupStart(), e;
    if (!r) r = ncclSend(P(x), 1000, ncclUint8, (rank + 1) % nranks, R->world, R->s0);
    if (!r) r = ncclRecv(P(y), rank == 0 ? 600 : 1000, ncclUint8, (rank + nranks - 1) % nranks, R->world, R->s0);
    e = ncclGroupEnd();
    r = r ? r : e;
    /* rank 0 sees the mismatch; the others see it aborted (or their send never taken) */
    /* rank 0 sees the mismatch, rank N-1's send is never taken; a rank between may finish its own pair first */
    int involved = rank == 0 || rank == nranks - 1;
    expect_all("ring group where rank 0 receives 600 bytes of a 1000-byte send: ranks 0 and N-1 -> ncclInvalidUsage (the others "
               "too, unless their own pair finished), at once",
               involved || r ? r : ncclInvalidUsage, t0, 3, (ncclResult_t[]){ncclInvalidUsage, 0});
    cuMemFree(x), cuMemFree(y);
}

static void scenario_graph_mismatch(Rank *R) {
    CUdeviceptr x = dalloc(4096);
    CUgraph g = NULL;
    CUgraphExec ex = NULL;
    CUresult cr = cuStreamBeginCapture(R->s0, CU_STREAM_CAPTURE_MODE_GLOBAL);
    ncclResult_t r = ncclAllReduce(P(x), P(x), 100 + (size_t)rank, ncclFloat32, ncclSum, R->world, R->s0);
    if (!cr) cr = cuStreamEndCapture(R->s0, &g);
    if (!cr) cr = cuGraphInstantiate(&ex, g, 0);
    double t0 = now_s();
    CUresult launch = cr || r ? CUDA_ERROR_UNKNOWN : cuGraphLaunch(ex, R->s0);
    double dt = now_s() - t0;
    record(!r && !cr && launch == CUDA_ERROR_LAUNCH_FAILED && dt < 3,
           "a captured ncclAllReduce with 100 + rank elements: capture succeeds, cuGraphLaunch -> CUDA_ERROR_LAUNCH_FAILED on every rank, at once",
           "capture %s / CUresult %d, launch CUresult %d in %.2f s", nccl_name(r), (int)cr, (int)launch, dt);
    if (ex) cuGraphExecDestroy(ex);
    if (g) cuGraphDestroy(g);
    cuMemFree(x);
}

static void scenario_deadlock(Rank *R) {
    CUdeviceptr x = dalloc(4096);
    double t0 = now_s();
    ncclResult_t r = ncclSend(P(x), 100, ncclFloat32, (rank + 1) % nranks, R->world, R->s0);
    expect_all("every rank sends to i+1 outside a group (NCCL deadlocks): every rank -> ncclSystemError after KILN_FAKE_NCCL_TIMEOUT=1",
               r, t0, 4, (ncclResult_t[]){ncclSystemError, 0});
    cuMemFree(x);
}

static void scenario_exit(Rank *R) {
    CUdeviceptr x = dalloc(4096);
    if (rank == nranks - 1) _exit(0); /* leaves without a word */
    double t0 = now_s();
    ncclResult_t r = ncclAllReduce(P(x), P(x), 100, ncclFloat32, ncclSum, R->world, R->s0);
    expect_all("the last rank exits before an all-reduce: the others -> ncclRemoteError within a second, not after the 10 s timeout",
               r, t0, 3, (ncclResult_t[]){ncclRemoteError, 0});
    cuMemFree(x);
}

static void scenario_drop(Rank *R) {
    long n = 300;
    CUdeviceptr x = dalloc(4 * (size_t)n);
    long all[4] = {0, 0, nranks, 0};
    upload(x, 0, rank, n, 0);
    ncclResult_t r = ncclAllReduce(P(x), P(x), (size_t)n, ncclFloat32, ncclSum, R->world, R->s0);
    int got = 0, exp = 0;
    long bad = r ? -2 : first_bad(x, 0, n, sum_of, all, &got, &exp);
    record(!r && bad >= 0, "planted bug KILN_FAKE_NCCL_TEST_DROP_RANK=1 (the sums leave rank 1 out): the all-reduce check catches it",
           "%s, first wrong element %ld: %d instead of %d", nccl_name(r), bad, got, exp);
    cuMemFree(x);
}

/* ---- running a scenario ---- */

typedef struct {
    const char *tag;
    void (*run)(Rank *);
    const char *env[4]; /* NAME=VALUE */
    int init;           /* 0: make the world communicator first; 1: the scenario's init (world of nranks+1); 2: rank counts disagree */
} Scenario;

static void init_scenario(Rank *R, int how) {
    double t0 = now_s();
    ncclResult_t r;
    if (how == 1) {
        r = ncclCommInitRank(&R->world, nranks + 1, R->ids[0], rank);
        expect_all("ncclCommInitRank with one rank more than there are: every rank -> ncclSystemError after the timeout (1 s)", r, t0,
                   4, (ncclResult_t[]){ncclSystemError, 0});
    } else {
        r = ncclCommInitRank(&R->world, rank == 0 ? nranks : nranks + 1, R->ids[0], rank);
        expect_all("ncclCommInitRank where rank 0 says N ranks and the others N + 1: every rank -> ncclInvalidUsage, at once", r, t0, 1,
                   (ncclResult_t[]){ncclInvalidUsage, 0});
    }
    if (!r) ncclCommDestroy(R->world);
    R->world = NULL;
}

static int child(const Scenario *s, Rank *R) {
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&R->ctx, 0) || cuCtxSetCurrent(R->ctx) ||
        cuStreamCreate(&R->s0, CU_STREAM_NON_BLOCKING) || cuStreamCreate(&R->s1, CU_STREAM_NON_BLOCKING)) {
        fprintf(stderr, "selftest_nccl: rank %d: the fake driver did not start\n", rank);
        return 2;
    }
    if (s->init) init_scenario(R, s->init);
    else {
        ncclResult_t r = ncclCommInitRank(&R->world, nranks, R->ids[0], rank);
        if (r) {
            record(0, "ncclCommInitRank", "%s", nccl_name(r));
            return 1;
        }
        s->run(R);
        ncclCommDestroy(R->world);
    }
    cuStreamDestroy(R->s0), cuStreamDestroy(R->s1);
    cuDevicePrimaryCtxRelease(0);
    return 0;
}

static int tap_n, tap_bad;

static void run_scenario(const Scenario *s) {
    Rank R;
    memset(&R, 0, sizeof R);
    memset(checks, 0, sizeof(Check) * MAXCHK);
    for (int i = 0; i < 3; i++) ncclGetUniqueId(&R.ids[i]);
    for (int i = 0; s->env[i]; i++) putenv((char *)s->env[i]);
    pid_t pids[MAXR];
    for (int r = 0; r < nranks; r++) {
        fflush(NULL);
        pids[r] = fork();
        if (pids[r] == 0) {
            rank = r, ncheck = 0;
            _exit(child(s, &R));
        }
    }
    for (int i = 0; s->env[i]; i++) {
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)(strchr(s->env[i], '=') - s->env[i]), s->env[i]);
        unsetenv(name);
    }
    int status[MAXR], left = nranks;
    double t0 = now_s();
    for (int r = 0; r < nranks; r++) status[r] = -1;
    while (left > 0) {
        for (int r = 0; r < nranks; r++) {
            int st;
            if (status[r] == -1 && waitpid(pids[r], &st, WNOHANG) == pids[r]) status[r] = st, left--;
        }
        if (left && now_s() - t0 > SCENARIO_LIMIT_S) {
            for (int r = 0; r < nranks; r++)
                if (status[r] == -1) kill(pids[r], SIGKILL), waitpid(pids[r], &status[r], 0), status[r] = -2, left--;
        }
        if (left) nanosleep(&(struct timespec){0, 5000000L}, NULL);
    }
    for (int i = 0; i < 3; i++) shm_unlink(R.ids[i].internal); /* a refused init leaves its name (fake_nccl.c) */
    for (int k = 0; k < MAXCHK && checks[k].used; k++) {
        Check *c = &checks[k];
        int ok = 1, bad = -1;
        for (int r = 0; r < nranks; r++)
            if (!c->reported[r] || !c->ok[r]) {
                if (s->run == scenario_exit && r == nranks - 1) continue; /* it left on purpose */
                ok = 0, bad = bad < 0 ? r : bad;
            }
        if (strcmp(c->name, "(timing)") == 0) {
            printf("# selftest_nccl %s, %d ranks: %s\n", s->tag, nranks, c->why[0]);
            continue;
        }
        tap_bad += !ok;
        if (ok) printf("ok %d - [%d ranks] %s: rank 0: %s\n", ++tap_n, nranks, c->name, c->why[0]);
        else if (!c->reported[bad])
            printf("not ok %d - [%d ranks] %s: rank %d never reported (status %d%s)\n", ++tap_n, nranks, c->name, bad, status[bad],
                   status[bad] == -2 ? ", killed after 60 s" : "");
        else printf("not ok %d - [%d ranks] %s: rank %d: %s\n", ++tap_n, nranks, c->name, bad, c->why[bad]);
    }
    if (!checks[0].used) {
        tap_bad++;
        printf("not ok %d - [%d ranks] scenario %s: no rank reported (statuses %d %d)\n", ++tap_n, nranks, s->tag, status[0],
               nranks > 1 ? status[1] : 0);
    }
    fflush(stdout);
}

int main(int argc, char **argv) {
    nranks = argc > 1 ? atoi(argv[1]) : 2;
    if (nranks < 2 || nranks > MAXR) {
        fprintf(stderr, "usage: selftest_nccl N (2 <= N <= %d) [SCENARIO]\n", MAXR);
        return 2;
    }
    checks = mmap(NULL, sizeof(Check) * MAXCHK, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (checks == MAP_FAILED) return 2;
    setenv("KILN_FAKE_NCCL_CHUNK", "256", 1);
    static const Scenario all[] = {
        {"good", scenario_good, {NULL}, 0},
        {"count", scenario_count, {"KILN_FAKE_NCCL_TIMEOUT=10", NULL}, 0},
        {"dtype", scenario_dtype, {"KILN_FAKE_NCCL_TIMEOUT=10", NULL}, 0},
        {"kind", scenario_kind, {"KILN_FAKE_NCCL_TIMEOUT=10", NULL}, 0},
        {"p2p-size", scenario_p2p_size, {"KILN_FAKE_NCCL_TIMEOUT=10", NULL}, 0},
        {"graph-mismatch", scenario_graph_mismatch, {"KILN_FAKE_NCCL_TIMEOUT=10", NULL}, 0},
        {"deadlock", scenario_deadlock, {"KILN_FAKE_NCCL_TIMEOUT=1", NULL}, 0},
        {"exit", scenario_exit, {"KILN_FAKE_NCCL_TIMEOUT=10", NULL}, 0},
        {"missing-rank", NULL, {"KILN_FAKE_NCCL_TIMEOUT=1", NULL}, 1},
        {"rank-counts", NULL, {"KILN_FAKE_NCCL_TIMEOUT=1", NULL}, 2},
        {"drop", scenario_drop, {"KILN_FAKE_NCCL_TEST_DROP_RANK=1", NULL}, 0},
    };
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        if (argc <= 2 || strcmp(argv[2], all[i].tag) == 0) run_scenario(&all[i]);
    printf("1..%d\n", tap_n);
    return tap_bad ? 1 : 0;
}
