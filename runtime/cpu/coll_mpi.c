/* coll_mpi.c — the CPU device's collective kernels over MPI: rtk_allreduce,
 * rtk_reducescatter, rtk_allgather, rtk_shard, rtk_send, rtk_recv and
 * rtk_iota_rank (kiln_rt.h, "ranks and communication", is the contract).
 * The ranks, groups and communicators they use are comm_mpi.c's, which
 * both devices link; the CUDA device has its own kernels (comm_nccl.c).
 *
 * Threads.  Collectives are kernels, so they run on the thread of the
 * stream that launched them (the comm stream, 1) while the compute stream
 * goes on: the overlap is real.  Every MPI call sits under rt_mpi_lock
 * (a real lock only below MPI_THREAD_MULTIPLE) and every return code is
 * checked: a failure fails the step (rt_fail) with MPI_Error_string's text
 * and breaks the context (rt_comm_break), so later collectives fail at once.
 * A wait that may be long, for a posted receive or a small all-reduce (the
 * loss, the gradient norm: where ranks wait for each other), tests and
 * sleeps (wait_posted) instead of MPI's spinning wait, which would take a
 * core from a compute thread when ranks share cores.
 *
 * Dtypes.  The last arg of the three collectives is the elements' dtype.
 * The CPU sums f32 only (allreduce, reducescatter: RT_F32); allgather moves
 * bits, so any 4-byte type (RT_F32, RT_I32: context parallel's positions).
 * Anything else fails the step naming the kernel and the dtype, before any
 * data moves, on every group size (the same program fails the same way on
 * every rank, so nobody waits in a collective).
 *
 * Sizes.  MPI counts are ints; a buffer of more than INT_MAX elements is
 * moved in pieces of rt_comm_piece() (allreduce: element ranges; allgather:
 * rt_mpi_allgather's resized datatype; reduce-scatter: piece o of every
 * chunk packed into a temporary, since Open MPI reduces only predefined
 * types).  The test hook KILN_RT_COMM_CHUNK makes the pieces small.
 *
 * Volume.  rt_comm_bytes counts what this rank sends through the collective
 * kernels in the ring algorithm's terms, the bus volume a plan predicts:
 * with s ranks in the group and n f32 elements (n = the kernel's n arg)
 * allreduce 2(s-1)n*4/s bytes (integer division), reduce-scatter and
 * allgather (s-1)n*4 with n the per-rank chunk (outer*n*inner of their
 * args); a group of one and shard send nothing.
 *
 * Strided chunks.  reducescatter and allgather along a dim with rows
 * before it (args outer > 1; context parallel's K, V [B, KH, T/cp, D]
 * gathered on T) pack through a temporary [size, outer, n*inner] and move
 * it with the flat collective, so the flat case (outer 1) keeps its
 * zero-copy path and its speed.
 *
 * Point to point (ring attention, --cp-comm p2p).  rtk_send and rtk_recv
 * run on the comm stream, and every rank of a ring sends before it
 * receives, so a blocking send of a message above the eager limit would
 * deadlock the whole ring.  rtk_send therefore copies x into a staging
 * buffer (the memory plan may reuse x's buffer as soon as the kernel
 * returns) and posts MPI_Isend from it, in pieces of at most
 * KILN_RT_COMM_CHUNK (or INT_MAX) bytes under one tag: MPI does not let
 * messages with the same source, tag and communicator overtake each other,
 * so rtk_recv's MPI_Recv pieces match them in order.  The staged sends sit
 * in the context's RtColl; every later send/recv tests the list and frees
 * what finished, and rt_comm_finish_sends (called by rt_step after the
 * streams drained) waits for the rest, so no step returns with a send in
 * flight.  A send to this rank itself (a group of one, or peer = 0 mod
 * size) never touches MPI: the staged copy waits in the list and the
 * matching rtk_recv (same group and tag, first posted first) copies it
 * out.  Bytes: rtk_send counts its payload when it goes to another rank.
 *
 * Rank iota.  rtk_iota_rank writes this rank's global token indices (IR
 * iota with a group, compiler/interp.c do_rank_iota); it lives here because
 * it needs the group index.
 */
#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "rt_private.h"

enum { NMASKS = 16 };

/* One rtk_send's copy of x: in flight through MPI (nreq requests), or
 * waiting for this rank's own rtk_recv (local). */
typedef struct Staged {
    struct Staged *next;
    char *buf;
    int64_t bytes;
    int mask, tag, local, nreq;
    MPI_Request *req;
} Staged;

/* One rtk_recv_start's receive, posted and waiting for its rtk_recv_done:
 * nreq MPI_Irecv pieces into y, or (local) a receive from this rank itself,
 * done by recv_local at the done. */
typedef struct Posted {
    struct Posted *next;
    char *y;
    int64_t bytes;
    int mask, tag, src, local, nreq;
    MPI_Request *req;
} Posted;

/* The context's collective state: rtk_send's buffers still in use and the
 * receives posted by rtk_recv_start. */
struct RtColl {
    Staged *staged; /* oldest first */
    Posted *posted; /* oldest first */
    pthread_mutex_t mu;
};

RtColl *rt_coll_new(void) {
    RtColl *k = calloc(1, sizeof *k);
    if (!k) {
        fprintf(stderr, "kiln runtime: out of memory\n");
        return NULL;
    }
    if (pthread_mutex_init(&k->mu, NULL)) {
        fprintf(stderr, "kiln runtime: pthread_mutex_init failed\n");
        free(k);
        return NULL;
    }
    return k;
}

static void staged_free(Staged *s) {
    free(s->buf);
    free(s->req);
    free(s);
}

/* rt_comm_free calls it after rt_comm_finish_sends, which empties the
 * list; anything still there is freed if it is local, and left to MPI
 * (leaked) if MPI may still read it. */
void rt_coll_free(RtColl *k) {
    if (!k) return;
    for (Staged *s = k->staged, *nx; s; s = nx) {
        nx = s->next;
        if (s->local) staged_free(s);
    }
    for (Posted *q = k->posted, *nx; q; q = nx) { /* after a failed step; MPI may still write y: only the local ones go */
        nx = q->next;
        if (q->local) free(q->req), free(q);
    }
    if (pthread_mutex_destroy(&k->mu)) fprintf(stderr, "kiln runtime: pthread_mutex_destroy failed\n");
    free(k);
}

/* ---- the collectives, piecewise (under rt_mpi_lock) ---- */

#define TRY(call)                           \
    do {                                    \
        int rc_ = (call);                   \
        if (rc_ != MPI_SUCCESS) return rc_; \
    } while (0)

/* y[k] = sum over the group of x[index*n + k]; x NULL: in place (y holds
 * the input, the result lands in its first n elements).  Piecewise, each
 * rank's piece o of every chunk is first packed into a temporary (Open MPI
 * reduces only predefined datatypes); in place, writing piece o of chunk 0
 * never touches a piece still to be packed. */
static int reducescatter_pieces(MPI_Comm comm, const float *x, float *y, int64_t n, int size) {
    int64_t limit = rt_comm_piece();
    if (n <= limit) return MPI_Reduce_scatter_block(x ? (const void *)x : MPI_IN_PLACE, y, (int)n, MPI_FLOAT, MPI_SUM, comm);
    int64_t piece = (1 << 26) / size > 0 ? (1 << 26) / size : 1; /* a temporary of at most 256 MB */
    if (piece > limit) piece = limit;
    const float *src = x ? x : y;
    float *tmp = malloc((size_t)(size * piece) * 4);
    if (!tmp) return MPI_ERR_NO_MEM;
    int rc = MPI_SUCCESS;
    for (int64_t o = 0; o < n && rc == MPI_SUCCESS; o += piece) {
        int64_t len = n - o < piece ? n - o : piece;
        for (int j = 0; j < size; j++) memcpy(tmp + j * len, src + j * n + o, (size_t)len * 4);
        rc = MPI_Reduce_scatter_block(tmp, y + o, (int)len, MPI_FLOAT, MPI_SUM, comm);
    }
    free(tmp);
    return rc;
}

/* y = sum over the group of x; x NULL: in place. */
static int allreduce_pieces(MPI_Comm comm, const float *x, float *y, int64_t n) {
    int64_t limit = rt_comm_piece();
    for (int64_t o = 0; o < n; o += limit) {
        int64_t len = n - o < limit ? n - o : limit;
        TRY(MPI_Allreduce(x ? (const void *)(x + o) : MPI_IN_PLACE, y + o, (int)len, MPI_FLOAT, MPI_SUM, comm));
    }
    return MPI_SUCCESS;
}

static int overlap(const void *a, int64_t na, const void *b, int64_t nb) {
    const char *x = a, *y = b;
    return na > 0 && nb > 0 && x < y + nb && y < x + na;
}

/* MPI_Waitall without spinning: MPI's blocking wait polls at full speed,
 * and on a machine whose cores the ranks' compute threads already use
 * (the CPU trainer: one rank per core) that poll takes the core from a
 * compute thread for as long as the receive waits.  Test, then sleep,
 * 5 us doubling up to 50 us between tests (the most it adds to a
 * transfer; a test costs about a microsecond, so a waiting receive takes
 * a few percent of a core), with the lock free in between.  The sleeping
 * thread's timer slack is set to 1 us first (Linux rounds a sleep up by
 * the slack, 50 us by default, which would double the poll's period). */
static int wait_posted(int n, MPI_Request *req, MPI_Status *st) {
    static _Thread_local int slack_set;
#ifdef __linux__
    if (!slack_set) slack_set = 1, (void)prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL); /* best effort: a refusal only keeps the default */
#endif
    long ns = 5000;
    for (;;) {
        int done = 0;
        rt_mpi_lock();
        int rc = MPI_Testall(n, req, &done, st);
        rt_mpi_unlock();
        if (rc != MPI_SUCCESS || done) return rc;
        struct timespec t = {0, ns};
        nanosleep(&t, NULL);
        if (ns < 50000) ns *= 2;
    }
}

/* A small all-reduce (at most SMALL_ALLREDUCE elements, in one piece): the
 * loss over pp, the global gradient norm's sum of squares.  These are
 * where ranks wait for each other at the step's end (a pipeline rank that
 * finished its actions waits for the last one), so MPI_Allreduce's
 * spinning wait would take a core from a rank still computing whenever
 * the ranks share cores; MPI_Iallreduce and wait_posted's sleeping test
 * instead.  Every rank of the group decides alike (by n and the piece
 * size, the same on all), as MPI requires: a blocking and a non-blocking
 * collective do not match.  Larger all-reduces (data parallel's gradient
 * buckets) keep the blocking call, whose tuned algorithms move bytes
 * without waiting for this thread's next test. */
enum { SMALL_ALLREDUCE = 1024 };

static int small_allreduce(int64_t n) { return n <= SMALL_ALLREDUCE && n <= rt_comm_piece(); }

static int allreduce_polled(MPI_Comm comm, const float *x, float *y, int64_t n) {
    MPI_Request req;
    MPI_Status st;
    rt_mpi_lock();
    int rc = MPI_Iallreduce(x ? (const void *)x : MPI_IN_PLACE, y, (int)n, MPI_FLOAT, MPI_SUM, comm, &req);
    rt_mpi_unlock();
    return rc == MPI_SUCCESS ? wait_posted(1, &req, &st) : rc;
}

/* ---- kernels ---- */

typedef struct {
    RtComm *cm;
    RtColl *coll;
    const char *op;
    int mask, size, index;
    MPI_Comm comm;
} Group;

/* Check a kernel's mask and count; 0, or -1 after rt_fail. */
static int group_of(rt_ctx *c, const char *op, int64_t mask, int64_t n, Group *g) {
    RtComm *cm = rt_comm_of(c);
    if (mask <= 0 || mask >= NMASKS || n < 0 || n > INT64_MAX / 4 / rt_world_size(c)) {
        rt_fail(c, "%s: bad group mask %lld or count %lld", op, (long long)mask, (long long)n);
        return -1;
    }
    RtGroup r = rt_comm_group(cm, (int)mask);
    *g = (Group){cm, rt_comm_coll(cm), op, r.mask, r.size, r.index, r.comm};
    if (g->size > 1 && rt_comm_broken(cm)) {
        char name[32];
        rt_fail(c, "%s over %s: not run: an earlier MPI call of this rank failed", op, rt_group_name(g->mask, name, sizeof name));
        return -1;
    }
    return 0;
}

static const char *dtype_name(int64_t dt, char *buf, int len) {
    static const char *const names[] = {"f32", "bf16", "f16", "i32", "i64"}; /* kiln_rt.h's RT_F32 ... RT_I64 */
    if (dt >= 0 && dt < (int64_t)(sizeof names / sizeof *names)) return names[dt];
    snprintf(buf, (size_t)len, "code %lld", (long long)dt);
    return buf;
}

/* The CPU's collectives sum f32; allgather (any4) moves any 4-byte type.
 * 0, or -1 after rt_fail naming the kernel and the dtype. */
static int check_dtype(rt_ctx *c, const char *op, int64_t dt, int any4) {
    char buf[32];
    if (dt == RT_F32 || (any4 && dt == RT_I32)) return 0;
    if (any4) rt_fail(c, "%s: dtype %s: the CPU's allgather moves 4-byte types only (f32, i32)", op, dtype_name(dt, buf, sizeof buf));
    else rt_fail(c, "%s: dtype %s: the CPU's collectives sum f32 only", op, dtype_name(dt, buf, sizeof buf));
    return -1;
}

/* what this thread has sent (rt_private.h: the trace's bytes per launch) */
static _Thread_local int64_t thread_sent;
int64_t rt_comm_thread_bytes(void) { return thread_sent; }

/* Count a finished collective's bytes, or fail the step with MPI's text. */
static void finish(rt_ctx *c, const Group *g, int rc, int64_t bytes) {
    if (rc == MPI_SUCCESS) {
        rt_comm_count(g->cm, bytes);
        thread_sent += bytes;
        return;
    }
    char name[32], t[512];
    rt_comm_break(g->cm);
    rt_fail(c, "%s over %s (%d ranks): MPI: %s", g->op, rt_group_name(g->mask, name, sizeof name), g->size, rt_mpi_text(rc, t, sizeof t));
}

/* args: x, y, n, mask, dt */
void rtk_allreduce(rt_ctx *c, const int64_t *a) {
    float *x = RT_F32P(a[0]), *y = RT_F32P(a[1]);
    int64_t n = a[2];
    Group g;
    if (check_dtype(c, "allreduce", a[4], 0) || group_of(c, "allreduce", a[3], n, &g)) return;
    if (g.size == 1 || n == 0) {
        if (x != y && n) memmove(y, x, (size_t)n * 4);
        return;
    }
    if (x != y && overlap(x, n * 4, y, n * 4)) { /* elementwise: move, then reduce in place */
        memmove(y, x, (size_t)n * 4);
        x = y;
    }
    int rc;
    if (small_allreduce(n)) {
        rc = allreduce_polled(g.comm, x == y ? NULL : x, y, n);
    } else {
        rt_mpi_lock();
        rc = allreduce_pieces(g.comm, x == y ? NULL : x, y, n);
        rt_mpi_unlock();
    }
    finish(c, &g, rc, 2 * (int64_t)(g.size - 1) * n * 4 / g.size);
}

/* Returned by a collective's helper that already failed the step (rt_fail);
 * MPI's codes are >= 0. */
enum { FAILED = -1 };

/* Check a strided collective's shape (outer, n, inner >= 0, a chunk that
 * fits); 0, or -1 after rt_fail. */
static int strided_shape(rt_ctx *c, const char *op, int64_t outer, int64_t n, int64_t inner, int64_t *count) {
    if (outer < 0 || n < 0 || inner < 0 || (n && inner > INT64_MAX / n) || (n * inner != 0 && outer > INT64_MAX / (n * inner))) {
        rt_fail(c, "%s: bad shape %lld x %lld x %lld", op, (long long)outer, (long long)n, (long long)inner);
        return -1;
    }
    *count = outer * n * inner;
    return 0;
}

/* tmp [size, outer, m] <-> v [outer, size*m]: pack (to_tmp) or unpack. */
static void regroup(float *tmp, float *v, int64_t outer, int64_t m, int size, int to_tmp) {
    for (int j = 0; j < size; j++)
        for (int64_t o = 0; o < outer; o++) {
            float *t = tmp + (j * outer + o) * m, *w = v + (o * size + j) * m;
            if (to_tmp) memcpy(t, w, (size_t)m * 4);
            else memcpy(w, t, (size_t)m * 4);
        }
}

/* outer 1: flat chunks of count elements, in place where the layout allows. */
static int reducescatter_flat(rt_ctx *c, const Group *g, float *x, float *y, int64_t count) {
    float *out = y, *tmp = NULL;
    if (x != y && overlap(x, g->size * count * 4, y, count * 4)) { /* e.g. y = this rank's chunk of x: reduce into a temporary */
        if (!(tmp = malloc((size_t)count * 4))) {
            rt_fail(c, "reducescatter: out of memory for %lld floats", (long long)count);
            return FAILED;
        }
        out = tmp;
    }
    rt_mpi_lock();
    int rc = reducescatter_pieces(g->comm, x == y ? NULL : x, out, count, g->size);
    rt_mpi_unlock();
    if (tmp && rc == MPI_SUCCESS) memcpy(y, tmp, (size_t)count * 4);
    free(tmp);
    return rc;
}

/* outer > 1: chunk j of every row packed together, then a flat reduce-scatter
 * whose result is y [outer, n, inner] as it stands. */
static int reducescatter_strided(rt_ctx *c, const Group *g, float *x, float *y, int64_t outer, int64_t m) {
    float *tmp = malloc((size_t)(g->size * outer * m) * 4);
    if (!tmp) {
        rt_fail(c, "reducescatter: out of memory for %lld floats", (long long)(g->size * outer * m));
        return FAILED;
    }
    regroup(tmp, x, outer, m, g->size, 1);
    rt_mpi_lock();
    int rc = reducescatter_pieces(g->comm, tmp, y, outer * m, g->size);
    rt_mpi_unlock();
    free(tmp);
    return rc;
}

/* args: x, y, outer, n, inner, mask, dt */
void rtk_reducescatter(rt_ctx *c, const int64_t *a) {
    float *x = RT_F32P(a[0]), *y = RT_F32P(a[1]);
    int64_t outer = a[2], count;
    Group g;
    if (check_dtype(c, "reducescatter", a[6], 0) || strided_shape(c, "reducescatter", outer, a[3], a[4], &count) ||
        group_of(c, "reducescatter", a[5], count, &g))
        return;
    if (g.size == 1 || count == 0) {
        if (x != y && count) memmove(y, x, (size_t)count * 4);
        return;
    }
    int rc = outer == 1 ? reducescatter_flat(c, &g, x, y, count) : reducescatter_strided(c, &g, x, y, outer, a[3] * a[4]);
    if (rc != FAILED) finish(c, &g, rc, (int64_t)(g.size - 1) * count * 4);
}

/* t: the 4-byte elements' MPI type (the bits move untouched either way). */
static int allgather_flat(rt_ctx *c, const Group *g, const float *x, float *y, int64_t count, MPI_Datatype t) {
    float *tmp = NULL;
    const float *in = x == y + g->index * count ? NULL : x; /* NULL: this rank's chunk is already in place */
    if (in && overlap(x, count * 4, y, g->size * count * 4)) {
        if (!(tmp = malloc((size_t)count * 4))) {
            rt_fail(c, "allgather: out of memory for %lld elements", (long long)count);
            return FAILED;
        }
        in = memcpy(tmp, x, (size_t)count * 4);
    }
    rt_mpi_lock();
    int rc = rt_mpi_allgather(g->comm, in, y, count, t, 4);
    rt_mpi_unlock();
    free(tmp);
    return rc;
}

/* outer > 1: gather the chunks whole into a temporary [size, outer, m], then
 * interleave them into y (x is only read by the gather, so it may overlap y). */
static int allgather_strided(rt_ctx *c, const Group *g, const float *x, float *y, int64_t outer, int64_t m, MPI_Datatype t) {
    float *tmp = malloc((size_t)(g->size * outer * m) * 4);
    if (!tmp) {
        rt_fail(c, "allgather: out of memory for %lld elements", (long long)(g->size * outer * m));
        return FAILED;
    }
    rt_mpi_lock();
    int rc = rt_mpi_allgather(g->comm, x, tmp, outer * m, t, 4);
    rt_mpi_unlock();
    if (rc == MPI_SUCCESS) regroup(tmp, y, outer, m, g->size, 0);
    free(tmp);
    return rc;
}

/* args: x, y, outer, n, inner, mask, dt (f32 or i32) */
void rtk_allgather(rt_ctx *c, const int64_t *a) {
    float *x = RT_F32P(a[0]), *y = RT_F32P(a[1]);
    int64_t outer = a[2], count;
    Group g;
    if (check_dtype(c, "allgather", a[6], 1) || strided_shape(c, "allgather", outer, a[3], a[4], &count) ||
        group_of(c, "allgather", a[5], count, &g))
        return;
    if (g.size == 1 || count == 0) {
        if (x != y && count) memmove(y, x, (size_t)count * 4);
        return;
    }
    MPI_Datatype t = a[6] == RT_I32 ? MPI_INT32_T : MPI_FLOAT;
    int rc = outer == 1 ? allgather_flat(c, &g, x, y, count, t) : allgather_strided(c, &g, x, y, outer, a[3] * a[4], t);
    if (rc != FAILED) finish(c, &g, rc, (int64_t)(g.size - 1) * count * 4);
}

static void rank_positions(int32_t *d, int64_t n, int64_t r, int64_t size, int dual) {
    int64_t h = n / 2;
    if (!dual)
        for (int64_t k = 0; k < n; k++) d[k] = (int32_t)(r * n + k);
    else
        for (int64_t k = 0; k < h; k++) d[k] = (int32_t)(r * h + k), d[h + k] = (int32_t)((2 * size - 1 - r) * h + k);
}

/* Global token indices of a rank's part of a split sequence (kiln_rt.h;
 * compiler/interp.c do_rank_iota is the reference): this rank's, the rank
 * `from` places before it, or (all) every rank's in group order.
 * args: dst, n, mask, dual, from, all */
void rtk_iota_rank(rt_ctx *c, const int64_t *a) {
    int32_t *d = RT_I32P(a[0]);
    int64_t n = a[1], dual = a[3], from = a[4], all = a[5];
    Group g;
    if (group_of(c, "iota_rank", a[2], 0, &g)) return;
    int64_t piece = all ? n / g.size : n;
    if (n < 0 || (all && n % g.size) || (dual && piece % 2) || (int64_t)g.size * piece > INT32_MAX) {
        rt_fail(c, "iota_rank: bad length %lld for %s layout over %d ranks", (long long)n, dual ? "the dual" : "a contiguous", g.size);
        return;
    }
    for (int64_t j = 0; j < (all ? g.size : 1); j++)
        rank_positions(d + j * piece, piece, all ? j : ((g.index - from) % g.size + g.size) % g.size, g.size, (int)dual);
}

/* args: x, y, outer, len, inner, elem_bytes, mask */
void rtk_shard(rt_ctx *c, const int64_t *a) {
    const char *x = rt_arg_ptr(a[0]);
    char *y = rt_arg_ptr(a[1]);
    int64_t outer = a[2], len = a[3], inner = a[4], eb = a[5];
    Group g;
    if (outer < 0 || len < 0 || inner < 0 || eb <= 0) {
        rt_fail(c, "shard: bad shape %lld x %lld x %lld of %lld-byte elements", (long long)outer, (long long)len, (long long)inner,
                (long long)eb);
        return;
    }
    if (group_of(c, "shard", a[6], 0, &g)) return;
    int64_t row = len * inner * eb; /* bytes of y per outer index */
    for (int64_t o = 0; o < outer; o++) memmove(y + o * row, x + (o * g.size + g.index) * row, (size_t)row);
}

/* ---- point to point: rtk_send, rtk_recv ---- */

static int64_t piece_bytes(void) { return rt_comm_piece() < INT_MAX ? rt_comm_piece() : INT_MAX; }
static int npieces(int64_t bytes) { return bytes ? (int)((bytes + piece_bytes() - 1) / piece_bytes()) : 1; }

static void lock(RtColl *k) {
    if (pthread_mutex_lock(&k->mu)) abort();
}
static void unlock(RtColl *k) {
    if (pthread_mutex_unlock(&k->mu)) abort();
}

/* Free the staged sends MPI has finished with (wait: block until all have).
 * Under k->mu; MPI's code. */
static int reap_sends(RtColl *k, int wait) {
    int rc = MPI_SUCCESS;
    for (Staged **pp = &k->staged; *pp && rc == MPI_SUCCESS;) {
        Staged *s = *pp;
        int done = 0;
        if (!s->local) {
            rt_mpi_lock();
            rc = wait ? MPI_Waitall(s->nreq, s->req, MPI_STATUSES_IGNORE) : MPI_Testall(s->nreq, s->req, &done, MPI_STATUSES_IGNORE);
            rt_mpi_unlock();
            done = done || (wait && rc == MPI_SUCCESS);
        }
        if (done) {
            *pp = s->next;
            staged_free(s);
        } else {
            pp = &s->next;
        }
    }
    return rc;
}

int rt_comm_finish_sends(RtComm *cm, char *err, int errlen) {
    RtColl *k = rt_comm_coll(cm);
    char t[512];
    int rc = MPI_SUCCESS, lost = -1;
    if (!k) return 0;
    lock(k);
    if (k->staged && !rt_comm_broken(cm)) rc = reap_sends(k, 1);
    for (Staged *s = k->staged, *nx; s; s = nx) { /* local leftovers; after a failure, sends MPI may still read: leaked */
        nx = s->next;
        if (s->local) lost = s->tag;
        if (s->local) staged_free(s);
    }
    k->staged = NULL;
    int unfinished = -1;
    for (Posted *q = k->posted, *nx; q; q = nx) { /* a start without its done: only after a failed step */
        nx = q->next;
        unfinished = q->tag;
        if (!q->local && !rt_comm_broken(cm)) {
            rt_mpi_lock();
            for (int j = 0; j < q->nreq; j++) MPI_Cancel(&q->req[j]);
            MPI_Waitall(q->nreq, q->req, MPI_STATUSES_IGNORE);
            rt_mpi_unlock();
        }
        free(q->req), free(q);
    }
    k->posted = NULL;
    unlock(k);
    if (unfinished >= 0 && rc == MPI_SUCCESS && lost < 0)
        return snprintf(err, (size_t)errlen, "recv_start with tag %d was never completed by its recv_done", unfinished), -1;
    if (rc != MPI_SUCCESS) {
        rt_comm_break(cm);
        return snprintf(err, (size_t)errlen, "send: completing at the end of the step: MPI: %s", rt_mpi_text(rc, t, sizeof t)), -1;
    }
    if (lost >= 0) return snprintf(err, (size_t)errlen, "send to this rank itself with tag %d was never received", lost), -1;
    return 0;
}

/* Stage x and post it; MPI's code, or FAILED after rt_fail. */
static int post_send(rt_ctx *c, const Group *g, const char *x, int64_t bytes, int dest, int tag) {
    Staged *s = calloc(1, sizeof *s);
    int local = dest == g->index, n = local ? 0 : npieces(bytes), rc = MPI_SUCCESS, posted = 0;
    if (s) s->buf = malloc(bytes ? (size_t)bytes : 1);
    if (s && n) s->req = malloc(sizeof(MPI_Request) * (size_t)n);
    if (!s || !s->buf || (n && !s->req)) {
        if (s) staged_free(s);
        rt_fail(c, "send: out of memory for a %lld-byte staging buffer", (long long)bytes);
        return FAILED;
    }
    memcpy(s->buf, x, (size_t)bytes);
    *s = (Staged){NULL, s->buf, bytes, g->mask, tag, local, 0, s->req};
    rt_mpi_lock();
    for (int k = 0; k < n && rc == MPI_SUCCESS; k++) {
        int64_t o = k * piece_bytes(), len = bytes - o < piece_bytes() ? bytes - o : piece_bytes();
        rc = MPI_Isend(s->buf + o, (int)len, MPI_BYTE, dest, tag, g->comm, &s->req[k]);
        if (rc == MPI_SUCCESS) posted++;
    }
    rt_mpi_unlock();
    s->nreq = posted;
    lock(g->coll);
    Staged **pp = &g->coll->staged;
    while (*pp) pp = &(*pp)->next;
    *pp = s; /* even after a failed post: the posted pieces may still read buf */
    if (rc == MPI_SUCCESS) rc = reap_sends(g->coll, 0);
    unlock(g->coll);
    return rc;
}

/* Group-rank (index + peer) mod size. */
static int ring_peer(const Group *g, int64_t peer) { return (int)(((g->index + peer) % g->size + g->size) % g->size); }

/* Check send/recv args; 0, or -1 after rt_fail. */
static int p2p_args(rt_ctx *c, const char *op, const int64_t *a, Group *g) {
    if (group_of(c, op, a[2], 0, g)) return -1;
    if (a[1] < 0 || a[4] < 0 || a[4] > 32767) { /* 32767: the least MPI_TAG_UB MPI allows */
        rt_fail(c, "%s: bad size %lld or tag %lld", op, (long long)a[1], (long long)a[4]);
        return -1;
    }
    return 0;
}

/* args: x, bytes, mask, peer, tag */
void rtk_send(rt_ctx *c, const int64_t *a) {
    Group g;
    if (p2p_args(c, "send", a, &g)) return;
    int dest = ring_peer(&g, a[3]);
    int rc = post_send(c, &g, rt_arg_ptr(a[0]), a[1], dest, (int)a[4]);
    if (rc != FAILED) finish(c, &g, rc, dest == g.index ? 0 : a[1]);
}

/* A recv from this rank itself: the first staged local send of (mask, tag). */
static void recv_local(rt_ctx *c, const Group *g, char *y, int64_t bytes, int tag) {
    Staged *s = NULL;
    lock(g->coll);
    for (Staged **pp = &g->coll->staged; *pp; pp = &(*pp)->next)
        if ((*pp)->local && (*pp)->mask == g->mask && (*pp)->tag == tag) {
            s = *pp;
            *pp = s->next;
            break;
        }
    unlock(g->coll);
    if (!s || s->bytes != bytes) {
        rt_fail(c, "recv from this rank itself, tag %d: %s", tag, s ? "size differs from the send's" : "no send of that tag came first");
        if (s) staged_free(s);
        return;
    }
    memcpy(y, s->buf, (size_t)bytes);
    staged_free(s);
}

/* rtk_recv_start and rtk_recv_done: the receive in two halves.  The start
 * posts MPI_Irecv of every piece (the same pieces as rtk_send's MPI_Isend,
 * so they match in order) and returns; the bytes may land in y from then
 * on, which the memory plan allows (the buffer is live from the start).
 * The done, on the same stream later, finds the start of (mask, tag, y),
 * waits for its pieces and checks their sizes.  Posting early lets the
 * transfer move while the streams compute (a large message needs its
 * receive posted before MPI moves it).  A receive from this rank itself is
 * only noted at the start and copied from the staged send at the done. */

/* args: y, bytes, mask, peer, tag */
void rtk_recv_start(rt_ctx *c, const int64_t *a) {
    Group g;
    if (p2p_args(c, "recv_start", a, &g)) return;
    int src = ring_peer(&g, a[3]), local = src == g.index, n = local ? 0 : npieces(a[1]), rc = MPI_SUCCESS, posted = 0;
    Posted *q = calloc(1, sizeof *q);
    if (q && n) q->req = malloc(sizeof(MPI_Request) * (size_t)n);
    if (!q || (n && !q->req)) {
        if (q) free(q->req), free(q);
        rt_fail(c, "recv_start: out of memory");
        return;
    }
    *q = (Posted){NULL, rt_arg_ptr(a[0]), a[1], g.mask, (int)a[4], src, local, 0, q->req};
    rt_mpi_lock();
    for (int k = 0; k < n && rc == MPI_SUCCESS; k++) {
        int64_t o = k * piece_bytes(), len = a[1] - o < piece_bytes() ? a[1] - o : piece_bytes();
        rc = MPI_Irecv(q->y + o, (int)len, MPI_BYTE, src, q->tag, g.comm, &q->req[k]);
        if (rc == MPI_SUCCESS) posted++;
    }
    rt_mpi_unlock();
    q->nreq = posted;
    lock(g.coll);
    Posted **pp = &g.coll->posted;
    while (*pp) pp = &(*pp)->next;
    *pp = q; /* even after a failed post: the posted pieces may still write y */
    unlock(g.coll);
    finish(c, &g, rc, 0);
}

/* args: y, bytes, mask, peer, tag (those of its rtk_recv_start) */
void rtk_recv_done(rt_ctx *c, const int64_t *a) {
    Group g;
    if (p2p_args(c, "recv_done", a, &g)) return;
    char *y = rt_arg_ptr(a[0]);
    int tag = (int)a[4], rc = MPI_SUCCESS;
    Posted *q = NULL;
    lock(g.coll);
    for (Posted **pp = &g.coll->posted; *pp; pp = &(*pp)->next)
        if ((*pp)->mask == g.mask && (*pp)->tag == tag && (*pp)->y == y) {
            q = *pp;
            *pp = q->next;
            break;
        }
    unlock(g.coll);
    if (!q || q->bytes != a[1]) {
        rt_fail(c, "recv_done, tag %d: %s", tag, q ? "size differs from its recv_start's" : "no recv_start of that tag and buffer came first");
        if (q) free(q->req), free(q);
        return;
    }
    if (q->local) {
        recv_local(c, &g, y, q->bytes, tag);
        free(q->req), free(q);
        return;
    }
    MPI_Status *st = calloc((size_t)(q->nreq ? q->nreq : 1), sizeof *st);
    if (!st) {
        rt_fail(c, "recv_done: out of memory");
        return; /* q stays lost: MPI may still write y */
    }
    rc = wait_posted(q->nreq, q->req, st);
    rt_mpi_lock();
    for (int k = 0; k < q->nreq && rc == MPI_SUCCESS; k++) {
        int64_t o = k * piece_bytes(), len = q->bytes - o < piece_bytes() ? q->bytes - o : piece_bytes();
        int got = -1;
        rc = MPI_Get_count(&st[k], MPI_BYTE, &got);
        if (rc == MPI_SUCCESS && got != len) {
            rt_mpi_unlock();
            rt_fail(c, "recv_done from group-rank %d, tag %d: %d bytes arrived, %lld expected", q->src, tag, got, (long long)len);
            free(st), free(q->req), free(q);
            return;
        }
    }
    rt_mpi_unlock();
    free(st), free(q->req), free(q);
    if (rc == MPI_SUCCESS) {
        lock(g.coll);
        rc = reap_sends(g.coll, 0);
        unlock(g.coll);
    }
    finish(c, &g, rc, 0);
}

/* args: y, bytes, mask, peer, tag */
void rtk_recv(rt_ctx *c, const int64_t *a) {
    Group g;
    if (p2p_args(c, "recv", a, &g)) return;
    char *y = rt_arg_ptr(a[0]);
    int64_t bytes = a[1];
    int src = ring_peer(&g, a[3]), tag = (int)a[4], rc = MPI_SUCCESS;
    if (src == g.index) {
        recv_local(c, &g, y, bytes, tag);
        return;
    }
    for (int k = 0, n = npieces(bytes); k < n && rc == MPI_SUCCESS; k++) {
        int64_t o = k * piece_bytes(), len = bytes - o < piece_bytes() ? bytes - o : piece_bytes();
        MPI_Status st;
        int got = -1;
        rt_mpi_lock();
        rc = MPI_Recv(y + o, (int)len, MPI_BYTE, src, tag, g.comm, &st);
        if (rc == MPI_SUCCESS) rc = MPI_Get_count(&st, MPI_BYTE, &got);
        rt_mpi_unlock();
        if (rc == MPI_SUCCESS && got != len) {
            rt_fail(c, "recv from group-rank %d, tag %d: %d bytes arrived, %lld expected", src, tag, got, (long long)len);
            return;
        }
    }
    if (rc == MPI_SUCCESS) {
        lock(g.coll);
        rc = reap_sends(g.coll, 0);
        unlock(g.coll);
    }
    finish(c, &g, rc, 0);
}
