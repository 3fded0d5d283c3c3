/* comm_nccl.c — the CUDA device's collective kernels on NCCL: rtk_allreduce,
 * rtk_reducescatter, rtk_allgather, rtk_shard, rtk_send, rtk_recv and
 * rtk_iota_rank (kiln_rt.h, "ranks and communication", is the contract),
 * and the NCCL communicators they use (rtc_nccl_new / rtc_nccl_free,
 * rt_cuda.h).  The ranks, groups and MPI communicators are comm_mpi.c's,
 * which both devices link; the CPU has its own kernels (coll_mpi.c).
 *
 * Communicators.  One NCCL communicator per distinct group with more than
 * one rank.  Masks whose groups are the same ranks (on a dp 4 mesh "dp",
 * "dp+cp" and "pp+dp" are all the 4 ranks) share one: a group is fixed by
 * the axes of its mask whose mesh size is above 1 (its "live" mask), and
 * the group index on those axes equals the index on the whole mask, so a
 * dp x cp mesh makes at most three communicators, a dp-only mesh one.  Each
 * is made in rt_new (rtc_nccl_new, after rt_comm_new, with the device's
 * context current): group rank 0 calls ncclGetUniqueId and broadcasts it
 * over the group (rt_group_bcast: comm_mpi.c's MPI; no MPI symbol here, so
 * a one-rank trainer links comm_single.c instead and no libmpi) (with a flag, so that a failure there
 * reaches the others instead of leaving them waiting), then every member
 * calls ncclCommInitRank with its group index.  Every rank creates them in
 * the same mask order, and each init involves only its group, so no cycle
 * of waits can form.  rtc_nccl_free destroys them (ncclCommAbort after a
 * failed call, whose communicator may be in any state).  A world of one
 * rank needs none: every group is of one, and dev_cuda.c makes no RtNccl.
 *
 * Launchers.  As every CUDA launcher (rt_cuda.h), each one only enqueues
 * on rtc_stream(ctx), never synchronises, allocates device memory or reads
 * it, and enqueues the same work for the same args every time (the second
 * step is captured into a CUDA graph; NCCL supports capture).  Only the
 * NCCL calls of the contract are used: ncclAllReduce, ncclReduceScatter,
 * ncclAllGather, ncclSend, ncclRecv, ncclGroupStart/End.  Every return
 * code is checked: a failure fails the step (rt_fail with the launch's
 * name, the call and ncclGetErrorString) and breaks the context
 * (rt_comm_break), so the launchers of the rest of that step fail at once.
 *
 * Dtypes.  dt (the collectives' last arg) picks ncclFloat32, ncclBfloat16
 * or ncclInt32 for every one of the three; the sums are NCCL's, in the
 * dtype's own arithmetic.  Anything else fails the step naming kernel and
 * dtype.  eb below is the element size in bytes.
 *
 * Layouts (kiln_rt.h).  A group of one is a device copy, or nothing when
 * x == y.  Flat (outer 1): allreduce in place when y == x; reducescatter
 * into y == x + i*n*inner and allgather from x == y + i*n*inner are NCCL's
 * own in-place forms; reducescatter with y == x (the result in x's first
 * chunk, kiln's in-place form) reduces in place into x's chunk i and then
 * copies it down to y (the two ranges are disjoint for i > 0).  Any other
 * overlap of x and y goes through the stream's scratch (rtc_scratch): the
 * input is staged there (allreduce, allgather) or the output lands there
 * first (reducescatter).  Strided (outer > 1): reducescatter packs x
 * [outer, s*n, inner] into scratch as [s, outer, n*inner] with kiln_copy
 * and reduce-scatters that, whose result is y as it stands; allgather
 * gathers into scratch [s, outer, n*inner] and unpacks into y with
 * kiln_copy.  Scratch bytes one launch needs (the compiler sizes
 * program->scratch_bytes for them):
 *     reducescatter, allgather, outer > 1    s * outer*n*inner * eb
 *     reducescatter, x and y overlapping     outer*n*inner * eb
 *       (other than y == x or y == x + i*n*inner*eb)
 *     allgather, x and y overlapping         outer*n*inner * eb
 *       (other than x == y + i*n*inner*eb)
 *     allreduce, x != y overlapping          n * eb
 *     shard, x and y overlapping             outer*len*inner * eb
 *     a group-of-one copy or a recv from
 *       this rank itself, overlapping        the bytes copied
 * Disjoint buffers and the in-place forms need none.
 *
 * Point to point (ring attention, pipeline stages).  NCCL's send and recv
 * each block on the GPU until the peer's matching call runs, and every
 * rank of a ring sends before it receives: a send enqueued alone would
 * wait for a recv queued behind the peer's own send, around the whole
 * ring.  A pipeline is the same: in 1F1B's steady state stage i sends an
 * activation forward and then receives a gradient from i+1, while i+1
 * sends that gradient back and then receives the activation (Megatron's
 * send_forward_recv_backward).  NCCL's answer is to issue them in one
 * ncclGroupStart/End, whose calls progress together, so rtk_send does not
 * enqueue anything: it notes the send (x, bytes, peer, tag, stream) in the
 * context's RtColl, and the next rtk_recv on the same stream issues every
 * send noted there (any group, any tag) and itself in one NCCL group.  A
 * send noted to this rank itself waits for the recv of its tag instead.
 * What is still noted goes out alone, in one group, before any other
 * launch or event record on its stream (dev_cuda.c: rtc_p2p_flush) and at
 * the end of the step function, so a send never moves past what orders
 * the other streams after it.
 *
 * Why this cannot deadlock where the compiler's blocking order does not:
 * the verifier (and pp.c's ppsched_prove) simulate each rank's program
 * with sends that never block and recvs that wait for their send.  Here a
 * send is enqueued no later than the next recv or other work on its
 * stream, and in the same group as that recv, so it progresses while the
 * recv waits: a recv is the only point where a rank's comm stream blocks,
 * as in the simulation.  NCCL has no tags: two ranks' sends and recvs
 * pair in issue order, so the compiler must emit, between every two
 * ranks, the sends in the order the peer receives them (emit_cuda.c's
 * emit_cuda_p2p_order refuses a program that does not; the cp ring's
 * pairs are back to back).  The fake NCCL (tests/cuda_fake) is a
 * rendezvous that checks each pair's sizes, so a wrong pairing fails.
 *
 * The price: unlike the CPU's staged copy, x is read when the group is
 * enqueued, so x must hold its value until then (the compiler's ring_pass
 * emits the pair back to back; memplan keeps a comm-stream read live
 * until the other streams have waited past it).  A noted send to this
 * rank whose recv never comes fails the step at its end
 * (rt_comm_finish_sends).  A send to this rank itself in a group of one
 * is a device copy at the recv.  Tags must be in 0..32767 as on the CPU.
 *
 * Volume.  rt_comm_bytes counts as the CPU does, the ring algorithm's
 * bytes with the dtype's element size: allreduce 2(s-1)*n*eb/s,
 * reducescatter and allgather (s-1)*outer*n*inner*eb, send its bytes when
 * the peer is another rank; a group of one, shard and iota nothing.  They
 * are counted when the launcher enqueues, i.e. once per run of the step
 * function; a replayed CUDA graph runs no launcher, so dev_cuda.c adds
 * the captured step's bytes on every replay.
 *
 * Rank iota.  rtk_iota_rank computes the group index i = (index - from)
 * mod s on the host and launches kiln_iota_rank (kernels/cuda/misc.cu).
 */
#include <cuda.h>
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt_cuda.h"

_Static_assert(sizeof(CUdeviceptr) == sizeof(void *), "a CUdeviceptr parameter must be pointer-sized");

enum { NAXES = 4, NMASKS = 16, BLOCK = 256, MAX_TAG = 32767 };
#define ELEM_GRID_MAX 65535LL /* misc.cu's element kernels: min(ceil(n/256), 65535) blocks */

struct RtNccl {
    ncclComm_t comm[NMASKS]; /* by mask; masks of one group share their live mask's; NULL for a group of one */
    int broken;              /* an NCCL call failed: abort instead of destroy */
};

/* A send noted by rtk_send, waiting for this rank's next recv (of its tag, if to this rank itself). */
typedef struct Pending {
    struct Pending *next;
    CUdeviceptr x;
    int64_t bytes;
    int mask, tag, dest; /* dest: group rank */
    int self;            /* to this rank itself: waits for the recv of its tag */
    CUstream stream;
} Pending;

struct RtColl {
    Pending *pending; /* oldest first */
};

/* ---- the context's state (rt_private.h) ---- */

RtColl *rt_coll_new(void) {
    RtColl *k = calloc(1, sizeof *k);
    if (!k) fprintf(stderr, "kiln runtime: out of memory\n");
    return k;
}

static void drop_pending(RtColl *k) {
    for (Pending *p = k->pending, *nx; p; p = nx) {
        nx = p->next;
        free(p);
    }
    k->pending = NULL;
}

void rt_coll_free(RtColl *k) {
    if (!k) return;
    drop_pending(k);
    free(k);
}

/* NCCL's sends and recvs complete in their stream, so nothing is in
 * flight after the streams drained; what is left are sends to this rank
 * itself that no recv of their tag took. */
int rt_comm_finish_sends(RtComm *cm, char *err, int errlen) {
    RtColl *k = rt_comm_coll(cm);
    if (!k || !k->pending) return 0;
    char name[32];
    Pending *p = k->pending;
    snprintf(err, (size_t)errlen,
             "send over %s with tag %d to this rank itself was never received: on CUDA it goes out with this rank's recv of its tag",
             rt_group_name(p->mask, name, sizeof name), p->tag);
    drop_pending(k);
    return -1;
}

/* what this thread has sent (rt_private.h: the trace's bytes per launch) */
static _Thread_local int64_t thread_sent;
int64_t rt_comm_thread_bytes(void) { return thread_sent; }

/* ---- communicators ---- */

/* The axes of p's mesh with more than one rank, as a mask. */
static int live_axes(const rt_program *p) {
    int m = 0;
    for (int a = 0; a < NAXES; a++)
        if (p->mesh[a] > 1) m |= 1 << a;
    return m;
}

/* What group rank 0 broadcasts: its id, or ok 0 when it could not make one. */
typedef struct {
    int ok;
    ncclUniqueId id;
} IdMessage;

/* The communicator of group `mask` (its live mask): 0, or -1 after one
 * line on stderr. */
static int init_comm(RtComm *cm, int mask, ncclComm_t *out) {
    RtGroup g = rt_comm_group(cm, mask);
    IdMessage msg;
    char name[32], t[512];
    memset(&msg, 0, sizeof msg);
    rt_group_name(mask, name, sizeof name);
    if (g.index == 0) {
        ncclResult_t r = ncclGetUniqueId(&msg.id);
        msg.ok = r == ncclSuccess;
        if (!msg.ok) fprintf(stderr, "kiln runtime: NCCL communicator for group %s: ncclGetUniqueId: %s\n", name, ncclGetErrorString(r));
    }
    if (rt_group_bcast(cm, mask, &msg, (int64_t)sizeof msg, t, sizeof t) != 0) {
        fprintf(stderr, "kiln runtime: NCCL communicator for group %s: broadcasting its id: %s\n", name, t);
        return -1;
    }
    if (!msg.ok) {
        if (g.index != 0) fprintf(stderr, "kiln runtime: NCCL communicator for group %s: its rank 0 could not make an id\n", name);
        return -1;
    }
    ncclResult_t r = ncclCommInitRank(out, g.size, msg.id, g.index);
    if (r != ncclSuccess) {
        *out = NULL;
        fprintf(stderr, "kiln runtime: NCCL communicator for group %s (%d ranks, index %d): ncclCommInitRank: %s\n", name, g.size,
                g.index, ncclGetErrorString(r));
        return -1;
    }
    return 0;
}

RtNccl *rtc_nccl_new(rt_ctx *ctx, const rt_program *p) {
    RtComm *cm = rt_comm_of(ctx);
    RtNccl *n = calloc(1, sizeof *n);
    if (!n) {
        fprintf(stderr, "kiln runtime: out of memory\n");
        return NULL;
    }
    int live = live_axes(p);
    for (int m = 1; m < NMASKS; m++)
        if ((m & live) == m && init_comm(cm, m, &n->comm[m])) {
            n->broken = 1;
            rtc_nccl_free(n);
            return NULL;
        }
    for (int m = 1; m < NMASKS; m++) n->comm[m] = n->comm[m & live];
    return n;
}

void rtc_nccl_break(RtNccl *n) {
    if (n) n->broken = 1;
}

/* Each distinct communicator once (masks of one group share it). */
void rtc_nccl_free(RtNccl *n) {
    if (!n) return;
    for (int m = 1; m < NMASKS; m++) {
        int first = n->comm[m] != NULL;
        for (int q = 1; q < m && first; q++) first = n->comm[q] != n->comm[m];
        if (!first) continue;
        ncclResult_t r = n->broken ? ncclCommAbort(n->comm[m]) : ncclCommDestroy(n->comm[m]);
        if (r != ncclSuccess)
            fprintf(stderr, "kiln runtime: %s: %s\n", n->broken ? "ncclCommAbort" : "ncclCommDestroy", ncclGetErrorString(r));
    }
    free(n);
}

/* ---- helpers of the launchers ---- */

static CUdeviceptr dptr(int64_t a) { return (CUdeviceptr)(uint64_t)a; }
static void *vptr(CUdeviceptr p) { return (void *)(uintptr_t)p; }
static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static int64_t grid_elems(int64_t n) { return n <= 0 ? 0 : min64((n + BLOCK - 1) / BLOCK, ELEM_GRID_MAX); }

static int overlap(CUdeviceptr a, int64_t na, CUdeviceptr b, int64_t nb) { return na > 0 && nb > 0 && a < b + (uint64_t)nb && b < a + (uint64_t)na; }

/* A launch's group. */
typedef struct {
    rt_ctx *ctx;
    RtComm *cm;
    RtNccl *nc;
    const char *op;
    int mask, size, index;
    ncclComm_t comm; /* NULL for a group of one */
} Group;

/* Check a launch's mask (and, with need_comm, that a group of more than
 * one rank has its communicator); 0, or -1 after rt_fail. */
static int group_of(rt_ctx *ctx, const char *op, int64_t mask, int need_comm, Group *g) {
    char name[32];
    if (mask <= 0 || mask >= NMASKS) {
        rt_fail(ctx, "%s: %s: bad group mask %lld", rtc_launch_name(ctx), op, (long long)mask);
        return -1;
    }
    RtComm *cm = rt_comm_of(ctx);
    RtGroup r = rt_comm_group(cm, (int)mask);
    RtNccl *nc = rtc_nccl_of(ctx);
    *g = (Group){ctx, cm, nc, op, r.mask, r.size, r.index, nc ? nc->comm[mask] : NULL};
    if (g->size > 1 && rt_comm_broken(cm)) {
        rt_fail(ctx, "%s: %s over %s: not run: an earlier NCCL call of this rank failed", rtc_launch_name(ctx), op,
                rt_group_name(g->mask, name, sizeof name));
        return -1;
    }
    if (need_comm && g->size > 1 && !g->comm) {
        rt_fail(ctx, "%s: %s over %s: no NCCL communicator for the group", rtc_launch_name(ctx), op, rt_group_name(g->mask, name, sizeof name));
        return -1;
    }
    return 0;
}

/* An NCCL call's result: 1, or 0 after failing the step and breaking the
 * context. */
static int nccl_ok(const Group *g, const char *call, ncclResult_t r) {
    if (r == ncclSuccess) return 1;
    char name[32];
    if (g->nc) g->nc->broken = 1;
    rt_comm_break(g->cm);
    rt_fail(g->ctx, "%s: %s over %s (%d ranks): %s: %s", rtc_launch_name(g->ctx), g->op, rt_group_name(g->mask, name, sizeof name), g->size,
            call, ncclGetErrorString(r));
    return 0;
}
#define NCCL_OK(g, call) nccl_ok((g), #call, (call))

/* A driver call's result: 1, or 0 after failing the step. */
static int cu_ok(rt_ctx *ctx, const char *op, const char *call, CUresult r) {
    if (r == CUDA_SUCCESS) return 1;
    rt_fail(ctx, "%s: %s: %s: %s", rtc_launch_name(ctx), op, call, rtc_error_string(r));
    return 0;
}
#define CU_OK(ctx, op, call) cu_ok((ctx), (op), #call, (call))

static const char *dtype_name(int64_t dt, char *buf, int len) {
    static const char *const names[] = {"f32", "bf16", "f16", "i32", "i64"}; /* kiln_rt.h's RT_F32 ... RT_I64 */
    if (dt >= 0 && dt < (int64_t)(sizeof names / sizeof *names)) return names[dt];
    snprintf(buf, (size_t)len, "code %lld", (long long)dt);
    return buf;
}

/* dt's NCCL type and element size; 0, or -1 after rt_fail. */
static int nccl_dtype(rt_ctx *ctx, const char *op, int64_t dt, ncclDataType_t *t, int64_t *eb) {
    char buf[32];
    switch (dt) {
    case RT_F32: *t = ncclFloat32, *eb = 4; return 0;
    case RT_BF16: *t = ncclBfloat16, *eb = 2; return 0;
    case RT_I32: *t = ncclInt32, *eb = 4; return 0;
    default:
        rt_fail(ctx, "%s: %s: dtype %s: the CUDA collectives take f32, bf16 or i32", rtc_launch_name(ctx), op, dtype_name(dt, buf, sizeof buf));
        return -1;
    }
}

/* Check a strided shape (outer, n, inner >= 0; the chunk's bytes times
 * any group size, < 2^24 ranks, fit an int64); eb >= 1.  0, or -1 after
 * rt_fail. */
static int strided_shape(rt_ctx *ctx, const char *op, int64_t outer, int64_t n, int64_t inner, int64_t eb, int64_t *count) {
    int64_t lim = (INT64_MAX / eb) >> 24;
    if (outer < 0 || n < 0 || inner < 0 || (n && inner > lim / n) || (n * inner != 0 && outer > lim / (n * inner))) {
        rt_fail(ctx, "%s: %s: bad shape %lld x %lld x %lld", rtc_launch_name(ctx), op, (long long)outer, (long long)n, (long long)inner);
        return -1;
    }
    *count = outer * n * inner;
    return 0;
}

/* Count what a launch sends. */
static void sent(const Group *g, int64_t bytes) {
    rt_comm_count(g->cm, bytes);
    thread_sent += bytes;
}

/* `bytes` of the stream's scratch in *p; 0, or -1 after rtc_scratch failed the step. */
static int scratch(rt_ctx *ctx, int64_t bytes, CUdeviceptr *p) {
    *p = rtc_scratch(ctx, bytes);
    return *p ? 0 : -1;
}

/* dst = src, `bytes` bytes, on the stream: nothing when they are the same
 * range, through scratch when they overlap otherwise (a device copy's
 * ranges must be disjoint).  0, or -1 after rt_fail. */
static int move(rt_ctx *ctx, const char *op, CUdeviceptr dst, CUdeviceptr src, int64_t bytes) {
    CUdeviceptr tmp;
    if (bytes <= 0 || dst == src) return 0;
    if (!overlap(dst, bytes, src, bytes))
        return CU_OK(ctx, op, cuMemcpyDtoDAsync(dst, src, (size_t)bytes, rtc_stream(ctx))) ? 0 : -1;
    if (scratch(ctx, bytes, &tmp)) return -1;
    if (!CU_OK(ctx, op, cuMemcpyDtoDAsync(tmp, src, (size_t)bytes, rtc_stream(ctx)))) return -1;
    return CU_OK(ctx, op, cuMemcpyDtoDAsync(dst, tmp, (size_t)bytes, rtc_stream(ctx))) ? 0 : -1;
}

/* kiln_copy of a rank-3 [d0, d1, d2] view of eb-byte elements, element
 * strides ss (source) and ds (destination).  0, or -1 after rt_fail. */
static int copy3(rt_ctx *ctx, CUdeviceptr src, CUdeviceptr dst, long long eb, const long long d3[3], const long long ss3[3],
                 const long long ds3[3]) {
    CUfunction f = rtc_function(ctx, "kiln_copy");
    if (!f) return -1; /* rtc_function failed the step */
    int rank = 3;
    long long d[5] = {d3[0], d3[1], d3[2], 1, 1}, ss[5] = {ss3[0], ss3[1], ss3[2], 0, 0}, ds[5] = {ds3[0], ds3[1], ds3[2], 0, 0};
    void *params[] = {&src,  &dst,  &eb,   &rank, &d[0],  &d[1],  &d[2],  &d[3],  &d[4],  &ss[0],
                      &ss[1], &ss[2], &ss[3], &ss[4], &ds[0], &ds[1], &ds[2], &ds[3], &ds[4]};
    rtc_launch(ctx, f, grid_elems(d[0] * d[1] * d[2]), 1, BLOCK, 0, params);
    return 0;
}

/* tmp [s, outer, m] <-> v [outer, s*m] (elements of eb bytes): pack (to_tmp) or unpack. */
static int regroup(rt_ctx *ctx, CUdeviceptr tmp, CUdeviceptr v, int64_t eb, int64_t outer, int64_t m, int s, int to_tmp) {
    const long long d[3] = {s, outer, m}, t[3] = {outer * m, m, 1}, w[3] = {m, s * m, 1};
    return to_tmp ? copy3(ctx, v, tmp, eb, d, w, t) : copy3(ctx, tmp, v, eb, d, t, w);
}

/* ---- collectives ---- */

/* args: x, y, n, mask, dt */
void rtk_allreduce(rt_ctx *ctx, const int64_t *a) {
    CUdeviceptr x = dptr(a[0]), y = dptr(a[1]);
    int64_t n = a[2], eb;
    ncclDataType_t t;
    Group g;
    if (nccl_dtype(ctx, "allreduce", a[4], &t, &eb) || group_of(ctx, "allreduce", a[3], 1, &g)) return;
    if (n < 0 || n > INT64_MAX / 16 / eb) {
        rt_fail(ctx, "%s: allreduce: bad count %lld", rtc_launch_name(ctx), (long long)n);
        return;
    }
    if (g.size == 1 || n == 0) {
        move(ctx, "allreduce", y, x, n * eb);
        return;
    }
    if (x != y && overlap(x, n * eb, y, n * eb)) { /* elementwise: move, then reduce in place */
        if (move(ctx, "allreduce", y, x, n * eb)) return;
        x = y;
    }
    if (NCCL_OK(&g, ncclAllReduce(vptr(x), vptr(y), (size_t)n, t, ncclSum, g.comm, rtc_stream(ctx))))
        sent(&g, 2 * (int64_t)(g.size - 1) * n * eb / g.size);
}

/* outer 1: y [count] = the sum of chunk i of x [s*count].  0, or -1 after rt_fail. */
static int reducescatter_flat(const Group *g, CUdeviceptr x, CUdeviceptr y, int64_t count, ncclDataType_t t, int64_t eb) {
    rt_ctx *ctx = g->ctx;
    CUdeviceptr own = x + (uint64_t)(g->index * count * eb), out = y; /* own: x's chunk i, NCCL's in-place output */
    if (y == x) out = own; /* kiln's in place: into chunk i, then down to chunk 0 */
    else if (y != own && overlap(x, g->size * count * eb, y, count * eb) && scratch(ctx, count * eb, &out)) /* out: scratch */
        return -1;
    if (!NCCL_OK(g, ncclReduceScatter(vptr(x), vptr(out), (size_t)count, t, ncclSum, g->comm, rtc_stream(ctx)))) return -1;
    return out == y ? 0 : move(ctx, "reducescatter", y, out, count * eb);
}

/* outer > 1: chunk i of every row packed together in scratch, then a flat
 * reduce-scatter whose result is y [outer, n, inner] as it stands. */
static int reducescatter_strided(const Group *g, CUdeviceptr x, CUdeviceptr y, int64_t outer, int64_t m, ncclDataType_t t, int64_t eb) {
    CUdeviceptr tmp;
    if (scratch(g->ctx, g->size * outer * m * eb, &tmp) || regroup(g->ctx, tmp, x, eb, outer, m, g->size, 1)) return -1;
    return NCCL_OK(g, ncclReduceScatter(vptr(tmp), vptr(y), (size_t)(outer * m), t, ncclSum, g->comm, rtc_stream(g->ctx))) ? 0 : -1;
}

/* args: x, y, outer, n, inner, mask, dt */
void rtk_reducescatter(rt_ctx *ctx, const int64_t *a) {
    CUdeviceptr x = dptr(a[0]), y = dptr(a[1]);
    int64_t outer = a[2], count, eb;
    ncclDataType_t t;
    Group g;
    if (nccl_dtype(ctx, "reducescatter", a[6], &t, &eb) || strided_shape(ctx, "reducescatter", outer, a[3], a[4], eb, &count) ||
        group_of(ctx, "reducescatter", a[5], 1, &g))
        return;
    if (g.size == 1 || count == 0) {
        move(ctx, "reducescatter", y, x, count * eb);
        return;
    }
    int rc = outer == 1 ? reducescatter_flat(&g, x, y, count, t, eb) : reducescatter_strided(&g, x, y, outer, a[3] * a[4], t, eb);
    if (rc == 0) sent(&g, (int64_t)(g.size - 1) * count * eb);
}

/* outer 1: y [s*count] = every rank's x [count], in place when x is this
 * rank's chunk of y; x staged in scratch when it overlaps y otherwise. */
static int allgather_flat(const Group *g, CUdeviceptr x, CUdeviceptr y, int64_t count, ncclDataType_t t, int64_t eb) {
    rt_ctx *ctx = g->ctx;
    CUdeviceptr in = x;
    if (x != y + (uint64_t)(g->index * count * eb) && overlap(x, count * eb, y, g->size * count * eb)) {
        if (scratch(ctx, count * eb, &in) || !CU_OK(ctx, "allgather", cuMemcpyDtoDAsync(in, x, (size_t)(count * eb), rtc_stream(ctx))))
            return -1;
    }
    return NCCL_OK(g, ncclAllGather(vptr(in), vptr(y), (size_t)count, t, g->comm, rtc_stream(ctx))) ? 0 : -1;
}

/* outer > 1: gather the chunks whole into scratch [s, outer, m], then
 * interleave them into y (x is only read by the gather, so it may overlap y). */
static int allgather_strided(const Group *g, CUdeviceptr x, CUdeviceptr y, int64_t outer, int64_t m, ncclDataType_t t, int64_t eb) {
    CUdeviceptr tmp;
    if (scratch(g->ctx, g->size * outer * m * eb, &tmp)) return -1;
    if (!NCCL_OK(g, ncclAllGather(vptr(x), vptr(tmp), (size_t)(outer * m), t, g->comm, rtc_stream(g->ctx)))) return -1;
    return regroup(g->ctx, tmp, y, eb, outer, m, g->size, 0);
}

/* args: x, y, outer, n, inner, mask, dt */
void rtk_allgather(rt_ctx *ctx, const int64_t *a) {
    CUdeviceptr x = dptr(a[0]), y = dptr(a[1]);
    int64_t outer = a[2], count, eb;
    ncclDataType_t t;
    Group g;
    if (nccl_dtype(ctx, "allgather", a[6], &t, &eb) || strided_shape(ctx, "allgather", outer, a[3], a[4], eb, &count) ||
        group_of(ctx, "allgather", a[5], 1, &g))
        return;
    if (g.size == 1 || count == 0) {
        move(ctx, "allgather", y, x, count * eb);
        return;
    }
    int rc = outer == 1 ? allgather_flat(&g, x, y, count, t, eb) : allgather_strided(&g, x, y, outer, a[3] * a[4], t, eb);
    if (rc == 0) sent(&g, (int64_t)(g.size - 1) * count * eb);
}

/* ---- local: shard, rank iota ---- */

/* This rank's chunk of the middle dim: y[o, j, k] = x[o, i*len + j, k],
 * moved as rows of len*inner elements of eb bytes (kiln_copy takes any
 * element size).  args: x, y, outer, len, inner, elem_bytes, mask */
void rtk_shard(rt_ctx *ctx, const int64_t *a) {
    CUdeviceptr x = dptr(a[0]), y = dptr(a[1]), out = y;
    int64_t outer = a[2], len = a[3], inner = a[4], eb = a[5], count;
    Group g;
    if (eb <= 0) {
        rt_fail(ctx, "%s: shard: %lld-byte elements", rtc_launch_name(ctx), (long long)eb);
        return;
    }
    if (strided_shape(ctx, "shard", outer, len, inner, eb, &count) || group_of(ctx, "shard", a[6], 0, &g)) return;
    int64_t m = len * inner, bytes = count * eb; /* m: elements of y per outer index */
    CUdeviceptr src = x + (uint64_t)(g.index * m * eb);
    if (bytes == 0) return;
    if (outer == 1 || g.size == 1) { /* one contiguous run */
        move(ctx, "shard", y, g.size == 1 ? x : src, bytes);
        return;
    }
    int through = overlap(x, outer * g.size * m * eb, y, bytes);
    if (through && scratch(ctx, bytes, &out)) return;
    const long long d[3] = {1, outer, m}, ss[3] = {0, g.size * m, 1}, ds[3] = {0, m, 1};
    if (copy3(ctx, src, out, eb, d, ss, ds) == 0 && through) move(ctx, "shard", y, out, bytes);
}

/* Global token indices of a rank's part of a split sequence (kiln_rt.h;
 * coll_mpi.c is the CPU twin).  args: dst, n, mask, dual, from, all */
void rtk_iota_rank(rt_ctx *ctx, const int64_t *a) {
    CUdeviceptr dst = dptr(a[0]);
    long long n = a[1], from = a[4];
    int dual = a[3] != 0, all = a[5] != 0;
    Group g;
    if (group_of(ctx, "iota_rank", a[2], 0, &g)) return;
    long long s = g.size, piece = all ? n / s : n;
    if (n < 0 || (all && n % s) || (dual && piece % 2) || s * piece > INT32_MAX) {
        rt_fail(ctx, "%s: iota_rank: bad length %lld for %s layout over %lld ranks", rtc_launch_name(ctx), n,
                dual ? "the dual" : "a contiguous", s);
        return;
    }
    long long i = ((g.index - from) % s + s) % s;
    CUfunction f = n > 0 ? rtc_function(ctx, "kiln_iota_rank") : NULL;
    if (!f) return; /* nothing to write, or rtc_function failed the step */
    void *params[] = {&dst, &n, &i, &s, &dual, &all};
    rtc_launch(ctx, f, grid_elems(n), 1, BLOCK, 0, params);
}

/* ---- point to point ---- */

/* Group-rank (index + peer) mod size. */
static int ring_peer(const Group *g, int64_t peer) { return (int)(((g->index + peer) % g->size + g->size) % g->size); }

/* Check send/recv args; 0, or -1 after rt_fail. */
static int p2p_args(rt_ctx *ctx, const char *op, const int64_t *a, Group *g) {
    if (group_of(ctx, op, a[2], 1, g)) return -1;
    if (a[1] < 0 || a[4] < 0 || a[4] > MAX_TAG) {
        rt_fail(ctx, "%s: %s: bad size %lld or tag %lld", rtc_launch_name(ctx), op, (long long)a[1], (long long)a[4]);
        return -1;
    }
    return 0;
}

/* Issue, in one NCCL group, stream st's noted sends to other ranks (every
 * stream's when st is NULL), then `self` (a noted send to this rank, taken
 * off the list) and the recv into y when rg is given.  0, or -1 after
 * rt_fail (a started group ends, even after a failed call in it). */
static int p2p_group(rt_ctx *ctx, CUstream st, Pending *self, const Group *rg, CUdeviceptr y, int64_t bytes, int src) {
    RtComm *cm = rt_comm_of(ctx);
    RtColl *k = cm ? rt_comm_coll(cm) : NULL;
    Pending *first = NULL;
    for (Pending *p = k ? k->pending : NULL; p && !first; p = p->next)
        if (!p->self && (!st || p->stream == st)) first = p;
    Group g, eg; /* g: a send's group; eg: the group errors are reported for */
    if (rg) eg = *rg;
    else if (!first || group_of(ctx, "send", first->mask, 1, &eg) != 0) return first ? -1 : 0;
    if (!NCCL_OK(&eg, ncclGroupStart())) return -1;
    int ok = 1;
    for (Pending **pp = k ? &k->pending : &first; *pp;) {
        Pending *p = *pp;
        if (p->self || (st && p->stream != st)) {
            pp = &p->next;
            continue;
        }
        *pp = p->next;
        if (ok) ok = group_of(ctx, "send", p->mask, 1, &g) == 0 &&
                     NCCL_OK(&g, ncclSend(vptr(p->x), (size_t)p->bytes, ncclUint8, p->dest, g.comm, p->stream));
        free(p);
    }
    if (ok && self) ok = NCCL_OK(&eg, ncclSend(vptr(self->x), (size_t)self->bytes, ncclUint8, self->dest, eg.comm, self->stream));
    if (ok && rg) ok = NCCL_OK(&eg, ncclRecv(vptr(y), (size_t)bytes, ncclUint8, src, eg.comm, rtc_stream(ctx)));
    ncclResult_t r = ncclGroupEnd();
    if (ok) ok = NCCL_OK(&eg, r);
    return ok ? 0 : -1;
}

void rtc_p2p_flush(rt_ctx *ctx, CUstream st) { p2p_group(ctx, st, NULL, NULL, 0, 0, 0); }

/* Note the send; this rank's next recv on the stream (of its tag, if to
 * this rank itself), another launch or record on it, or the step's end
 * issues it (p2p_group).
 * args: x, bytes, mask, peer, tag */
void rtk_send(rt_ctx *ctx, const int64_t *a) {
    Group g;
    if (p2p_args(ctx, "send", a, &g)) return;
    RtColl *k = rt_comm_coll(g.cm);
    Pending *p = calloc(1, sizeof *p);
    if (!p) {
        rt_fail(ctx, "%s: send: out of memory", rtc_launch_name(ctx));
        return;
    }
    *p = (Pending){NULL, dptr(a[0]), a[1], g.mask, (int)a[4], ring_peer(&g, a[3]), ring_peer(&g, a[3]) == g.index, rtc_stream(ctx)};
    Pending **pp = &k->pending;
    while (*pp) pp = &(*pp)->next;
    *pp = p;
    if (p->dest != g.index) sent(&g, p->bytes);
}

/* The oldest noted send of (mask, tag) to this rank itself, taken off the
 * list; NULL if none. */
static Pending *take_self(RtColl *k, int mask, int tag) {
    for (Pending **pp = &k->pending; *pp; pp = &(*pp)->next)
        if ((*pp)->mask == mask && (*pp)->tag == tag && (*pp)->self) {
            Pending *p = *pp;
            *pp = p->next;
            return p;
        }
    return NULL;
}

/* args: y, bytes, mask, peer, tag */
void rtk_recv(rt_ctx *ctx, const int64_t *a) {
    Group g;
    if (p2p_args(ctx, "recv", a, &g)) return;
    CUdeviceptr y = dptr(a[0]);
    int64_t bytes = a[1];
    int src = ring_peer(&g, a[3]), tag = (int)a[4];
    Pending *p = src == g.index ? take_self(rt_comm_coll(g.cm), g.mask, tag) : NULL;
    if (src == g.index && (!p || p->bytes != bytes)) { /* from this rank itself: its own send must match */
        rt_fail(ctx, "%s: recv from this rank itself, tag %d: %s", rtc_launch_name(ctx), tag,
                p ? "size differs from the send's" : "no send of that tag to this rank came first");
        free(p);
        return;
    }
    if (g.size == 1) { /* a group of one: the send was to this rank */
        if (p2p_group(ctx, rtc_stream(ctx), NULL, NULL, 0, 0, 0) == 0) move(ctx, "recv", y, p->x, bytes);
        free(p);
        return;
    }
    p2p_group(ctx, rtc_stream(ctx), p, &g, y, bytes, src);
    free(p);
}
