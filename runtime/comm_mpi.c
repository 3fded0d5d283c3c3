/* comm_mpi.c — ranks, process groups and collectives of the CPU device, over
 * MPI (Open MPI).  kiln_rt.h, "ranks and communication", is the contract.
 *
 * Ranks.  A program runs on the mesh pp x dp x cp x tp (rt_program.mesh);
 * world rank r has coordinates with tp fastest,
 * r = ((pp*DP + dp)*CP + cp)*TP + tp, as compiler/ir.c's ir_rank_coords.
 * The group of mask m holds the ranks that agree with r on every axis NOT in
 * m, in ascending world rank; r's index in it is the mixed-radix number of
 * its coordinates on the axes in m (pp most significant), which is its
 * position in that ascending list (ir_group_members).
 *
 * When MPI is used.  Only when it is needed: the program's world is more
 * than one rank, or the process was started by mpirun (OMPI_COMM_WORLD_SIZE
 * or PMIX_RANK set).  A one-rank program in a plain process never touches
 * MPI and every collective is a copy.  MPI is initialised once per process
 * (MPI_THREAD_MULTIPLE requested, MPI_THREAD_SERIALIZED accepted: then
 * every MPI call takes one process-wide lock) and the process count must
 * equal the mesh's world; otherwise world rank 0 prints one line and rt_new
 * fails.
 *
 * Communicators.  rt_comm_new splits one communicator per group mask whose
 * group has more than one rank (MPI_Comm_split, color = the coordinates on
 * the other axes, key = the world rank, so the communicator's rank is the
 * group index; checked).  All fifteen masks are split up front, on the
 * thread that calls rt_new: a split is a collective over the world, and
 * splitting lazily from a kernel would put a world-wide collective on the
 * comm stream of whichever rank first met the mask.  Every communicator
 * has MPI_ERRORS_RETURN and every return code is checked: a failed
 * collective fails the step (rt_fail) with MPI_Error_string's text, and
 * marks the context broken, so later collectives fail at once instead of
 * talking to a communicator in an unknown state.
 *
 * Threads.  Collectives are kernels, so they run on the thread of the
 * stream that launched them (the comm stream, 1) while the compute stream
 * goes on: the overlap is real.  The trainer's host calls
 * (rt_host_allgather, rt_host_barrier) run on the main thread between steps.
 *
 * Exit.  If this file initialised MPI it registers an on_exit handler that
 * calls MPI_Finalize when the process exits with status 0.  A process that
 * exits with an error does NOT finalise: its peers may be blocked in a
 * collective waiting for it, and Open MPI's MPI_Finalize waits for every
 * rank (a hang).  Exiting non-zero without MPI_Finalize makes mpirun tear
 * the whole job down, which is also what happens when a rank dies.
 *
 * Sizes.  MPI counts are ints; a buffer of more than INT_MAX elements is
 * moved in pieces (allreduce: element ranges; allgather: a resized
 * contiguous datatype whose extent is the whole chunk, so piece o of every
 * rank's chunk lands in place; reduce-scatter: piece o of every chunk
 * packed into a temporary, since Open MPI reduces only predefined types).  Test hook: the environment
 * variable KILN_RT_COMM_CHUNK=N sets the piece size to N elements, so that
 * tests/t_mpi.sh can exercise the piecewise path with small buffers.
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
 * in a list; every later send/recv tests the list and frees what finished,
 * and rt_comm_step_end (called by rt_step after the streams drained) waits
 * for the rest, so no step returns with a send in flight.  A send to this
 * rank itself (a group of one, or peer = 0 mod size) never touches MPI: the
 * staged copy waits in the list and the matching rtk_recv (same group and
 * tag, first posted first) copies it out.  Bytes: rtk_send counts its
 * payload when it goes to another rank.
 *
 * Rank iota.  rtk_iota_rank writes this rank's global token indices (IR
 * iota with a group, compiler/interp.c do_rank_iota); it lives here because
 * it needs the group index.  Host calls are
 * not counted (they are the checkpoint's, not the step's).
 */
#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt_private.h"

enum { NAXES = 4, NMASKS = 16 };

struct RtComm {
    int mpi;                  /* this context talks MPI */
    int world, rank;
    int mesh[NAXES];          /* pp, dp, cp, tp; each >= 1 */
    int coord[NAXES];
    int gsize[NMASKS], gindex[NMASKS];
    MPI_Comm comm[NMASKS];    /* MPI_COMM_NULL where the group has one rank */
    atomic_llong bytes;       /* rt_comm_bytes */
    atomic_int broken;        /* an MPI call failed */
    struct Staged *staged;    /* rtk_send's buffers still in use, oldest first */
    pthread_mutex_t staged_mu;
};

/* One rtk_send's copy of x: in flight through MPI (nreq requests), or
 * waiting for this rank's own rtk_recv (local). */
typedef struct Staged {
    struct Staged *next;
    char *buf;
    int64_t bytes;
    int mask, tag, local, nreq;
    MPI_Request *req;
} Staged;

/* Process-wide MPI state. */
static struct {
    int started; /* MPI is initialised (by us or by the program) */
    int level;   /* provided thread level */
    pthread_mutex_t mu;
} M = {.mu = PTHREAD_MUTEX_INITIALIZER};

static int64_t chunk_limit = INT_MAX;

/* ---- mesh arithmetic (no MPI) ---- */

static int mesh_dim(const rt_program *p, int a) { return p->mesh[a] > 0 ? p->mesh[a] : 1; }

int rt_mesh_group_size(const rt_program *p, int mask) {
    if (mask <= 0 || mask >= NMASKS) return 0;
    int s = 1;
    for (int a = 0; a < NAXES; a++)
        if (mask & (1 << a)) s *= mesh_dim(p, a);
    return s;
}

const char *rt_group_name(int mask, char *buf, int len) {
    static const char *const axes[NAXES] = {"pp", "dp", "cp", "tp"};
    int k = 0;
    buf[0] = 0;
    for (int a = 0; a < NAXES; a++)
        if (mask & (1 << a)) k += snprintf(buf + k, (size_t)(len - k > 0 ? len - k : 0), "%s%s", k ? "+" : "", axes[a]);
    if (!buf[0]) snprintf(buf, (size_t)len, "mask %d", mask);
    return buf;
}

/* Mixed-radix number of cm's coordinates on the axes in (want_in ? mask : ~mask). */
static int coord_index(const RtComm *cm, int mask, int want_in) {
    int v = 0;
    for (int a = 0; a < NAXES; a++)
        if (((mask >> a) & 1) == want_in) v = v * cm->mesh[a] + cm->coord[a];
    return v;
}

/* ---- MPI plumbing ---- */

static const char *mpi_text(int rc, char *buf, int len) {
    int n = 0;
    char t[MPI_MAX_ERROR_STRING];
    if (MPI_Error_string(rc, t, &n) != MPI_SUCCESS) snprintf(buf, (size_t)len, "MPI error code %d", rc);
    else snprintf(buf, (size_t)len, "%.*s", n, t);
    return buf;
}

/* Below MPI_THREAD_MULTIPLE, one thread at a time may be inside MPI. */
static void mpi_lock(void) {
    if (M.level < MPI_THREAD_MULTIPLE && pthread_mutex_lock(&M.mu)) abort();
}
static void mpi_unlock(void) {
    if (M.level < MPI_THREAD_MULTIPLE && pthread_mutex_unlock(&M.mu)) abort();
}

static void finalize_at_exit(int status, void *arg) {
    (void)arg;
    int done = 1;
    if (status != 0 || MPI_Finalized(&done) != MPI_SUCCESS || done) return;
    int rc = MPI_Finalize();
    if (rc != MPI_SUCCESS) {
        char t[512];
        fprintf(stderr, "kiln runtime: MPI_Finalize: %s\n", mpi_text(rc, t, sizeof t));
    }
}

static int under_launcher(void) { return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK"); }

/* 0, or -1 after one line on stderr. */
static int mpi_start(void) {
    char t[512];
    if (M.started) return 0;
    int inited = 0, rc = MPI_Initialized(&inited);
    if (rc != MPI_SUCCESS) {
        fprintf(stderr, "kiln runtime: MPI_Initialized: %s\n", mpi_text(rc, t, sizeof t));
        return -1;
    }
    if (inited) {
        rc = MPI_Query_thread(&M.level);
    } else {
        rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &M.level);
        if (rc == MPI_SUCCESS && on_exit(finalize_at_exit, NULL) != 0) {
            fprintf(stderr, "kiln runtime: on_exit: cannot register MPI_Finalize\n");
            return -1;
        }
    }
    if (rc != MPI_SUCCESS) {
        fprintf(stderr, "kiln runtime: MPI initialisation: %s\n", mpi_text(rc, t, sizeof t));
        return -1;
    }
    if (M.level < MPI_THREAD_SERIALIZED) {
        fprintf(stderr, "kiln runtime: MPI provides thread level %d; kiln needs MPI_THREAD_SERIALIZED or more\n", M.level);
        return -1;
    }
    rc = MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    if (rc != MPI_SUCCESS) {
        fprintf(stderr, "kiln runtime: MPI_Comm_set_errhandler: %s\n", mpi_text(rc, t, sizeof t));
        return -1;
    }
    M.started = 1;
    return 0;
}

static int read_chunk_hook(void) {
    const char *v = getenv("KILN_RT_COMM_CHUNK");
    if (!v) return 0;
    char *end;
    long long k = strtoll(v, &end, 10);
    if (*v == 0 || *end || k < 1 || k > INT_MAX) {
        fprintf(stderr, "kiln runtime: KILN_RT_COMM_CHUNK: expected an element count in [1, %d], got \"%s\"\n", INT_MAX, v);
        return -1;
    }
    chunk_limit = k;
    return 0;
}

/* Split the communicator of every mask with more than one rank. */
static int split_groups(RtComm *cm) {
    char t[512], g[32];
    for (int m = 1; m < NMASKS; m++) {
        if (cm->gsize[m] == 1) continue;
        int rc = MPI_Comm_split(MPI_COMM_WORLD, coord_index(cm, m, 0), cm->rank, &cm->comm[m]), r = -1;
        if (rc == MPI_SUCCESS) rc = MPI_Comm_set_errhandler(cm->comm[m], MPI_ERRORS_RETURN);
        if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(cm->comm[m], &r);
        if (rc != MPI_SUCCESS) {
            fprintf(stderr, "kiln runtime: rank %d: communicator for group %s: %s\n", cm->rank, rt_group_name(m, g, sizeof g),
                    mpi_text(rc, t, sizeof t));
            return -1;
        }
        if (r != cm->gindex[m]) {
            fprintf(stderr, "kiln runtime: rank %d: group %s: MPI rank %d, mesh index %d\n", cm->rank, rt_group_name(m, g, sizeof g), r,
                    cm->gindex[m]);
            return -1;
        }
    }
    return 0;
}

static int check_mesh(const rt_program *p, int *world) {
    int64_t w = 1;
    for (int a = 0; a < NAXES; a++) {
        if (p->mesh[a] < 0 || p->mesh[a] > (1 << 20)) {
            fprintf(stderr, "kiln runtime: program %s: malformed mesh entry %d\n", p->model ? p->model : "?", p->mesh[a]);
            return -1;
        }
        w *= mesh_dim(p, a);
    }
    if (w > (1 << 24)) {
        fprintf(stderr, "kiln runtime: program %s: mesh of %lld ranks\n", p->model ? p->model : "?", (long long)w);
        return -1;
    }
    *world = (int)w;
    return 0;
}

RtComm *rt_comm_new(const rt_program *p) {
    char t[512];
    int world;
    if (check_mesh(p, &world) || read_chunk_hook()) return NULL;
    RtComm *cm = calloc(1, sizeof *cm);
    if (!cm) {
        fprintf(stderr, "kiln runtime: out of memory\n");
        return NULL;
    }
    for (int m = 0; m < NMASKS; m++) cm->comm[m] = MPI_COMM_NULL;
    if (pthread_mutex_init(&cm->staged_mu, NULL)) {
        fprintf(stderr, "kiln runtime: pthread_mutex_init failed\n");
        free(cm);
        return NULL;
    }
    for (int a = 0; a < NAXES; a++) cm->mesh[a] = mesh_dim(p, a);
    cm->world = world;
    cm->mpi = world > 1 || under_launcher();
    if (cm->mpi) {
        int size = 0, rc;
        if (mpi_start()) goto fail;
        rc = MPI_Comm_size(MPI_COMM_WORLD, &size);
        if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(MPI_COMM_WORLD, &cm->rank);
        if (rc != MPI_SUCCESS) {
            fprintf(stderr, "kiln runtime: MPI_COMM_WORLD: %s\n", mpi_text(rc, t, sizeof t));
            goto fail;
        }
        if (size != world) {
            if (cm->rank == 0)
                fprintf(stderr, "%s: compiled for %d ranks (pp x dp x cp x tp = %d x %d x %d x %d); launched with %d processes (use mpirun -np %d)\n",
                        p->model ? p->model : "program", world, cm->mesh[0], cm->mesh[1], cm->mesh[2], cm->mesh[3], size, world);
            goto fail;
        }
    }
    for (int a = NAXES - 1, r = cm->rank; a >= 0; a--) {
        cm->coord[a] = r % cm->mesh[a];
        r /= cm->mesh[a];
    }
    for (int m = 1; m < NMASKS; m++) {
        cm->gsize[m] = rt_mesh_group_size(p, m);
        cm->gindex[m] = coord_index(cm, m, 1);
    }
    if (cm->mpi && split_groups(cm)) goto fail;
    return cm;
fail:
    rt_comm_free(cm);
    return NULL;
}

static void staged_free(Staged *s) {
    free(s->buf);
    free(s->req);
    free(s);
}

void rt_comm_free(RtComm *cm) {
    if (!cm) return;
    char t[512];
    if (rt_comm_finish_sends(cm, t, sizeof t)) fprintf(stderr, "kiln runtime: %s\n", t);
    for (Staged *s = cm->staged, *nx; s; s = nx) { /* local sends nobody received */
        nx = s->next;
        staged_free(s);
    }
    if (pthread_mutex_destroy(&cm->staged_mu)) fprintf(stderr, "kiln runtime: pthread_mutex_destroy failed\n");
    for (int m = 1; m < NMASKS; m++)
        if (cm->comm[m] != MPI_COMM_NULL) {
            int rc = MPI_Comm_free(&cm->comm[m]);
            if (rc != MPI_SUCCESS) {
                char t[512];
                fprintf(stderr, "kiln runtime: MPI_Comm_free: %s\n", mpi_text(rc, t, sizeof t));
            }
        }
    free(cm);
}

/* ---- ranks ---- */

int rt_world_rank(rt_ctx *ctx) { return rt_comm_of(ctx)->rank; }
int rt_world_size(rt_ctx *ctx) { return rt_comm_of(ctx)->world; }
int rt_group_rank(rt_ctx *ctx, int mask) { return mask > 0 && mask < NMASKS ? rt_comm_of(ctx)->gindex[mask] : -1; }
int rt_group_size(rt_ctx *ctx, int mask) { return mask > 0 && mask < NMASKS ? rt_comm_of(ctx)->gsize[mask] : 0; }
int64_t rt_comm_bytes(rt_ctx *ctx) { return (int64_t)atomic_load(&rt_comm_of(ctx)->bytes); }

/* ---- the collectives, piecewise (under mpi_lock) ---- */

#define TRY(call)                          \
    do {                                   \
        int rc_ = (call);                  \
        if (rc_ != MPI_SUCCESS) return rc_; \
    } while (0)

/* A contiguous run of len elements of t whose extent is `stride` bytes: one
 * piece of every rank's chunk. */
static int piece_type(int64_t len, MPI_Datatype t, int64_t stride, MPI_Datatype *out) {
    MPI_Datatype c;
    TRY(MPI_Type_contiguous((int)len, t, &c));
    int rc = MPI_Type_create_resized(c, 0, (MPI_Aint)stride, out);
    int rc2 = MPI_Type_free(&c);
    TRY(rc);
    if (rc2 != MPI_SUCCESS) {
        MPI_Type_free(out);
        return rc2;
    }
    rc = MPI_Type_commit(out);
    if (rc != MPI_SUCCESS) MPI_Type_free(out);
    return rc;
}

/* y[j*count + k] = x of group-rank j [k]; x NULL: in place (this rank's
 * chunk already sits in y). */
static int allgather_pieces(MPI_Comm comm, const char *x, char *y, int64_t count, MPI_Datatype t, int64_t ext) {
    if (count <= chunk_limit)
        return MPI_Allgather(x ? (const void *)x : MPI_IN_PLACE, (int)count, t, y, (int)count, t, comm);
    for (int64_t o = 0; o < count; o += chunk_limit) {
        int64_t len = count - o < chunk_limit ? count - o : chunk_limit;
        MPI_Datatype piece;
        TRY(piece_type(len, t, count * ext, &piece));
        int rc = MPI_Allgather(x ? (const void *)(x + o * ext) : MPI_IN_PLACE, (int)len, t, y + o * ext, 1, piece, comm);
        int rc2 = MPI_Type_free(&piece);
        TRY(rc);
        TRY(rc2);
    }
    return MPI_SUCCESS;
}

/* y[k] = sum over the group of x[index*n + k]; x NULL: in place (y holds
 * the input, the result lands in its first n elements).  Piecewise, each
 * rank's piece o of every chunk is first packed into a temporary (Open MPI
 * reduces only predefined datatypes); in place, writing piece o of chunk 0
 * never touches a piece still to be packed. */
static int reducescatter_pieces(MPI_Comm comm, const float *x, float *y, int64_t n, int size) {
    if (n <= chunk_limit) return MPI_Reduce_scatter_block(x ? (const void *)x : MPI_IN_PLACE, y, (int)n, MPI_FLOAT, MPI_SUM, comm);
    int64_t piece = (1 << 26) / size > 0 ? (1 << 26) / size : 1; /* a temporary of at most 256 MB */
    if (piece > chunk_limit) piece = chunk_limit;
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
    for (int64_t o = 0; o < n; o += chunk_limit) {
        int64_t len = n - o < chunk_limit ? n - o : chunk_limit;
        TRY(MPI_Allreduce(x ? (const void *)(x + o) : MPI_IN_PLACE, y + o, (int)len, MPI_FLOAT, MPI_SUM, comm));
    }
    return MPI_SUCCESS;
}

static int overlap(const void *a, int64_t na, const void *b, int64_t nb) {
    const char *x = a, *y = b;
    return na > 0 && nb > 0 && x < y + nb && y < x + na;
}

/* ---- kernels ---- */

typedef struct {
    RtComm *cm;
    const char *op;
    int mask, size, index;
    MPI_Comm comm;
} Group;

/* Check a kernel's mask and count; 0, or -1 after rt_fail. */
static int group_of(rt_ctx *c, const char *op, int64_t mask, int64_t n, Group *g) {
    RtComm *cm = rt_comm_of(c);
    if (mask <= 0 || mask >= NMASKS || n < 0 || n > INT64_MAX / 4 / cm->world) {
        rt_fail(c, "%s: bad group mask %lld or count %lld", op, (long long)mask, (long long)n);
        return -1;
    }
    *g = (Group){cm, op, (int)mask, cm->gsize[mask], cm->gindex[mask], cm->comm[mask]};
    if (g->size > 1 && atomic_load(&cm->broken)) {
        char name[32];
        rt_fail(c, "%s over %s: not run: an earlier MPI call of this rank failed", op, rt_group_name(g->mask, name, sizeof name));
        return -1;
    }
    return 0;
}

/* what this thread has sent (rt_private.h: the trace's bytes per launch) */
static _Thread_local int64_t thread_sent;
int64_t rt_comm_thread_bytes(void) { return thread_sent; }

/* Count a finished collective's bytes, or fail the step with MPI's text. */
static void finish(rt_ctx *c, const Group *g, int rc, int64_t bytes) {
    if (rc == MPI_SUCCESS) {
        atomic_fetch_add(&g->cm->bytes, (long long)bytes);
        thread_sent += bytes;
        return;
    }
    char name[32], t[512];
    atomic_store(&g->cm->broken, 1);
    rt_fail(c, "%s over %s (%d ranks): MPI: %s", g->op, rt_group_name(g->mask, name, sizeof name), g->size, mpi_text(rc, t, sizeof t));
}

void rtk_allreduce(rt_ctx *c, const int64_t *a) {
    float *x = RT_F32P(a[0]), *y = RT_F32P(a[1]);
    int64_t n = a[2];
    Group g;
    if (group_of(c, "allreduce", a[3], n, &g)) return;
    if (g.size == 1 || n == 0) {
        if (x != y && n) memmove(y, x, (size_t)n * 4);
        return;
    }
    if (x != y && overlap(x, n * 4, y, n * 4)) { /* elementwise: move, then reduce in place */
        memmove(y, x, (size_t)n * 4);
        x = y;
    }
    mpi_lock();
    int rc = allreduce_pieces(g.comm, x == y ? NULL : x, y, n);
    mpi_unlock();
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
    mpi_lock();
    int rc = reducescatter_pieces(g->comm, x == y ? NULL : x, out, count, g->size);
    mpi_unlock();
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
    mpi_lock();
    int rc = reducescatter_pieces(g->comm, tmp, y, outer * m, g->size);
    mpi_unlock();
    free(tmp);
    return rc;
}

void rtk_reducescatter(rt_ctx *c, const int64_t *a) {
    float *x = RT_F32P(a[0]), *y = RT_F32P(a[1]);
    int64_t outer = a[2], count;
    Group g;
    if (strided_shape(c, "reducescatter", outer, a[3], a[4], &count) || group_of(c, "reducescatter", a[5], count, &g)) return;
    if (g.size == 1 || count == 0) {
        if (x != y && count) memmove(y, x, (size_t)count * 4);
        return;
    }
    int rc = outer == 1 ? reducescatter_flat(c, &g, x, y, count) : reducescatter_strided(c, &g, x, y, outer, a[3] * a[4]);
    if (rc != FAILED) finish(c, &g, rc, (int64_t)(g.size - 1) * count * 4);
}

static int allgather_flat(rt_ctx *c, const Group *g, const float *x, float *y, int64_t count) {
    float *tmp = NULL;
    const float *in = x == y + g->index * count ? NULL : x; /* NULL: this rank's chunk is already in place */
    if (in && overlap(x, count * 4, y, g->size * count * 4)) {
        if (!(tmp = malloc((size_t)count * 4))) {
            rt_fail(c, "allgather: out of memory for %lld floats", (long long)count);
            return FAILED;
        }
        in = memcpy(tmp, x, (size_t)count * 4);
    }
    mpi_lock();
    int rc = allgather_pieces(g->comm, (const char *)in, (char *)y, count, MPI_FLOAT, 4);
    mpi_unlock();
    free(tmp);
    return rc;
}

/* outer > 1: gather the chunks whole into a temporary [size, outer, m], then
 * interleave them into y (x is only read by the gather, so it may overlap y). */
static int allgather_strided(rt_ctx *c, const Group *g, const float *x, float *y, int64_t outer, int64_t m) {
    float *tmp = malloc((size_t)(g->size * outer * m) * 4);
    if (!tmp) {
        rt_fail(c, "allgather: out of memory for %lld floats", (long long)(g->size * outer * m));
        return FAILED;
    }
    mpi_lock();
    int rc = allgather_pieces(g->comm, (const char *)x, (char *)tmp, outer * m, MPI_FLOAT, 4);
    mpi_unlock();
    if (rc == MPI_SUCCESS) regroup(tmp, y, outer, m, g->size, 0);
    free(tmp);
    return rc;
}

void rtk_allgather(rt_ctx *c, const int64_t *a) {
    float *x = RT_F32P(a[0]), *y = RT_F32P(a[1]);
    int64_t outer = a[2], count;
    Group g;
    if (strided_shape(c, "allgather", outer, a[3], a[4], &count) || group_of(c, "allgather", a[5], count, &g)) return;
    if (g.size == 1 || count == 0) {
        if (x != y && count) memmove(y, x, (size_t)count * 4);
        return;
    }
    int rc = outer == 1 ? allgather_flat(c, &g, x, y, count) : allgather_strided(c, &g, x, y, outer, a[3] * a[4]);
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

static int64_t piece_bytes(void) { return chunk_limit < INT_MAX ? chunk_limit : INT_MAX; }
static int npieces(int64_t bytes) { return bytes ? (int)((bytes + piece_bytes() - 1) / piece_bytes()) : 1; }

/* Free the staged sends MPI has finished with (wait: block until all have).
 * Under staged_mu; MPI's code. */
static int reap_sends(RtComm *cm, int wait) {
    int rc = MPI_SUCCESS;
    for (Staged **pp = &cm->staged; *pp && rc == MPI_SUCCESS;) {
        Staged *s = *pp;
        int done = 0;
        if (!s->local) {
            mpi_lock();
            rc = wait ? MPI_Waitall(s->nreq, s->req, MPI_STATUSES_IGNORE) : MPI_Testall(s->nreq, s->req, &done, MPI_STATUSES_IGNORE);
            mpi_unlock();
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
    char t[512];
    int rc = MPI_SUCCESS, lost = -1;
    if (pthread_mutex_lock(&cm->staged_mu)) abort();
    if (cm->staged && !atomic_load(&cm->broken)) rc = reap_sends(cm, 1);
    for (Staged *s = cm->staged, *nx; s; s = nx) { /* local leftovers; after a failure, sends MPI may still read: leaked */
        nx = s->next;
        if (s->local) lost = s->tag;
        if (s->local) staged_free(s);
    }
    cm->staged = NULL;
    if (pthread_mutex_unlock(&cm->staged_mu)) abort();
    if (rc != MPI_SUCCESS) {
        atomic_store(&cm->broken, 1);
        return snprintf(err, (size_t)errlen, "send: completing at the end of the step: MPI: %s", mpi_text(rc, t, sizeof t)), -1;
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
    mpi_lock();
    for (int k = 0; k < n && rc == MPI_SUCCESS; k++) {
        int64_t o = k * piece_bytes(), len = bytes - o < piece_bytes() ? bytes - o : piece_bytes();
        rc = MPI_Isend(s->buf + o, (int)len, MPI_BYTE, dest, tag, g->comm, &s->req[k]);
        if (rc == MPI_SUCCESS) posted++;
    }
    mpi_unlock();
    s->nreq = posted;
    if (pthread_mutex_lock(&g->cm->staged_mu)) abort();
    Staged **pp = &g->cm->staged;
    while (*pp) pp = &(*pp)->next;
    *pp = s; /* even after a failed post: the posted pieces may still read buf */
    if (rc == MPI_SUCCESS) rc = reap_sends(g->cm, 0);
    if (pthread_mutex_unlock(&g->cm->staged_mu)) abort();
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
    if (pthread_mutex_lock(&g->cm->staged_mu)) abort();
    for (Staged **pp = &g->cm->staged; *pp; pp = &(*pp)->next)
        if ((*pp)->local && (*pp)->mask == g->mask && (*pp)->tag == tag) {
            s = *pp;
            *pp = s->next;
            break;
        }
    if (pthread_mutex_unlock(&g->cm->staged_mu)) abort();
    if (!s || s->bytes != bytes) {
        rt_fail(c, "recv from this rank itself, tag %d: %s", tag, s ? "size differs from the send's" : "no send of that tag came first");
        if (s) staged_free(s);
        return;
    }
    memcpy(y, s->buf, (size_t)bytes);
    staged_free(s);
}

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
        mpi_lock();
        rc = MPI_Recv(y + o, (int)len, MPI_BYTE, src, tag, g.comm, &st);
        if (rc == MPI_SUCCESS) rc = MPI_Get_count(&st, MPI_BYTE, &got);
        mpi_unlock();
        if (rc == MPI_SUCCESS && got != len) {
            rt_fail(c, "recv from group-rank %d, tag %d: %d bytes arrived, %lld expected", src, tag, got, (long long)len);
            return;
        }
    }
    if (rc == MPI_SUCCESS) {
        if (pthread_mutex_lock(&g.cm->staged_mu)) abort();
        rc = reap_sends(g.cm, 0);
        if (pthread_mutex_unlock(&g.cm->staged_mu)) abort();
    }
    finish(c, &g, rc, 0);
}

/* ---- host calls ---- */

int rt_host_allgather(rt_ctx *ctx, int mask, const void *x, void *y, int64_t bytes, char *err, int errlen) {
    RtComm *cm = rt_comm_of(ctx);
    char name[32], t[512];
    if (mask <= 0 || mask >= NMASKS || bytes < 0)
        return snprintf(err, (size_t)errlen, "rt_host_allgather: bad group mask %d or size %lld", mask, (long long)bytes), -1;
    int size = cm->gsize[mask], index = cm->gindex[mask];
    if (size == 1 || bytes == 0) {
        if (x != y && bytes) memmove(y, x, (size_t)bytes);
        return 0;
    }
    if (atomic_load(&cm->broken))
        return snprintf(err, (size_t)errlen, "allgather over %s: not run: an earlier MPI call of this rank failed",
                        rt_group_name(mask, name, sizeof name)), -1;
    const char *in = (const char *)x == (char *)y + index * bytes ? NULL : x;
    void *tmp = NULL;
    if (in && overlap(x, bytes, y, size * bytes)) {
        if (!(tmp = malloc((size_t)bytes))) return snprintf(err, (size_t)errlen, "allgather: out of memory"), -1;
        in = memcpy(tmp, x, (size_t)bytes);
    }
    mpi_lock();
    int rc = allgather_pieces(cm->comm[mask], in, y, bytes, MPI_BYTE, 1);
    mpi_unlock();
    free(tmp);
    if (rc == MPI_SUCCESS) return 0;
    atomic_store(&cm->broken, 1);
    snprintf(err, (size_t)errlen, "allgather over %s (%d ranks): MPI: %s", rt_group_name(mask, name, sizeof name), size, mpi_text(rc, t, sizeof t));
    return -1;
}

int rt_host_barrier(rt_ctx *ctx, char *err, int errlen) {
    RtComm *cm = rt_comm_of(ctx);
    char t[512];
    if (!cm->mpi || cm->world == 1) return 0;
    if (atomic_load(&cm->broken)) return snprintf(err, (size_t)errlen, "barrier: not run: an earlier MPI call of this rank failed"), -1;
    mpi_lock();
    int rc = MPI_Barrier(MPI_COMM_WORLD);
    mpi_unlock();
    if (rc == MPI_SUCCESS) return 0;
    atomic_store(&cm->broken, 1);
    snprintf(err, (size_t)errlen, "barrier: MPI: %s", mpi_text(rc, t, sizeof t));
    return -1;
}

int rt_host_agree(rt_ctx *ctx, int rc, char *err, int errlen) {
    typedef struct {
        int rc;
        char msg[500];
    } Outcome;
    RtComm *cm = rt_comm_of(ctx);
    if (cm->world == 1) return rc;
    Outcome mine = {rc != 0, ""}, *all = malloc(sizeof(Outcome) * (size_t)cm->world);
    char e[512];
    if (!all) return snprintf(err, (size_t)errlen, "out of memory"), -1;
    if (rc && err) snprintf(mine.msg, sizeof mine.msg, "%s", err);
    if (rt_host_allgather(ctx, NMASKS - 1, &mine, all, sizeof mine, e, sizeof e) != 0) {
        free(all);
        return snprintf(err, (size_t)errlen, "%s", e), -1;
    }
    int bad = -1;
    for (int r = 0; r < cm->world && bad < 0; r++)
        if (all[r].rc) bad = r;
    if (bad > 0) snprintf(err, (size_t)errlen, "rank %d: %s", bad, all[bad].msg);
    else if (bad == 0) snprintf(err, (size_t)errlen, "%s", all[0].msg);
    free(all);
    return bad < 0 ? 0 : -1;
}
