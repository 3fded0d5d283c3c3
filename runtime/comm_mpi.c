/* comm_mpi.c — ranks, process groups and MPI for both devices: what the
 * CPU's collective kernels (coll_mpi.c) and CUDA's (comm_nccl.c, which
 * bootstraps NCCL over these communicators) stand on, and the trainer's
 * host calls.  kiln_rt.h, "ranks and communication", is the contract;
 * rt_private.h declares what the kernels' files see of it.
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
 * every MPI call takes one process-wide lock, rt_mpi_lock; but not for a
 * program with tp's own comm stream, stream 4 of --schedule lhs: two
 * threads blocking in collectives on different communicators under one
 * lock can deadlock across ranks, so rt_comm_new refuses it) and the process
 * count must equal the mesh's world; otherwise world rank 0 prints one line
 * and rt_new fails.
 *
 * Communicators.  rt_comm_new splits one communicator per group mask whose
 * group has more than one rank (MPI_Comm_split, color = the coordinates on
 * the other axes, key = the world rank, so the communicator's rank is the
 * group index; checked).  All fifteen masks are split up front, on the
 * thread that calls rt_new: a split is a collective over the world, and
 * splitting lazily from a kernel would put a world-wide collective on the
 * comm stream of whichever rank first met the mask.  Every communicator
 * has MPI_ERRORS_RETURN and every return code is checked: a failed call
 * fails the step (rt_fail) or the host call with MPI_Error_string's text,
 * and marks the context broken (rt_comm_break), so later calls fail at once
 * instead of talking to a communicator in an unknown state.
 *
 * The kernels' state.  rt_comm_new also makes the collective kernels' own
 * state (rt_coll_new: coll_mpi.c's staged sends, comm_nccl.c's sends
 * waiting for their recv) and rt_comm_free completes and frees it
 * (rt_comm_finish_sends, rt_coll_free) before it frees the communicators.
 * Which file defines them is the device's choice at link time.
 *
 * Exit.  If this file initialised MPI it registers an on_exit handler that
 * calls MPI_Finalize when the process exits with status 0.  A process that
 * exits with an error does NOT finalise: its peers may be blocked in a
 * collective waiting for it, and Open MPI's MPI_Finalize waits for every
 * rank (a hang).  Exiting non-zero without MPI_Finalize makes mpirun tear
 * the whole job down, which is also what happens when a rank dies.
 *
 * Sizes.  MPI counts are ints; a buffer of more than INT_MAX elements is
 * moved in pieces (rt_mpi_allgather: a resized contiguous datatype whose
 * extent is the whole chunk, so piece o of every rank's chunk lands in
 * place).  Test hook: the environment variable KILN_RT_COMM_CHUNK=N sets
 * the piece size to N elements (rt_comm_piece), so that tests/t_mpi.sh can
 * exercise the piecewise paths with small buffers.
 *
 * Host calls (rt_host_allgather, rt_host_barrier, rt_host_agree) run on the
 * main thread between steps and are not counted in rt_comm_bytes (they are
 * the checkpoint's, not the step's).
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
    atomic_int broken;        /* a communication call failed */
    RtColl *coll;             /* the collective kernels' state */
};

/* Process-wide MPI state. */
static struct {
    int started; /* MPI is initialised (by us or by the program) */
    int level;   /* provided thread level */
    pthread_mutex_t mu;
} M = {.mu = PTHREAD_MUTEX_INITIALIZER};

static int64_t chunk_limit = INT_MAX;

/* ---- mesh arithmetic (no MPI) ---- */

static int mesh_dim(const rt_program *p, int a) { return p->mesh[a] > 0 ? p->mesh[a] : 1; }

/* rt_mesh_group_size and rt_group_name: rt_common.c (comm_single.c uses them too) */

/* Mixed-radix number of cm's coordinates on the axes in (want_in ? mask : ~mask). */
static int coord_index(const RtComm *cm, int mask, int want_in) {
    int v = 0;
    for (int a = 0; a < NAXES; a++)
        if (((mask >> a) & 1) == want_in) v = v * cm->mesh[a] + cm->coord[a];
    return v;
}

/* ---- MPI plumbing ---- */

const char *rt_mpi_text(int rc, char *buf, int len) {
    int n = 0;
    char t[MPI_MAX_ERROR_STRING];
    if (MPI_Error_string(rc, t, &n) != MPI_SUCCESS) snprintf(buf, (size_t)len, "MPI error code %d", rc);
    else snprintf(buf, (size_t)len, "%.*s", n, t);
    return buf;
}

/* Below MPI_THREAD_MULTIPLE, one thread at a time may be inside MPI. */
void rt_mpi_lock(void) {
    if (M.level < MPI_THREAD_MULTIPLE && pthread_mutex_lock(&M.mu)) abort();
}
void rt_mpi_unlock(void) {
    if (M.level < MPI_THREAD_MULTIPLE && pthread_mutex_unlock(&M.mu)) abort();
}

static void finalize_at_exit(int status, void *arg) {
    (void)arg;
    int done = 1;
    if (status != 0 || MPI_Finalized(&done) != MPI_SUCCESS || done) return;
    int rc = MPI_Finalize();
    if (rc != MPI_SUCCESS) {
        char t[512];
        fprintf(stderr, "kiln runtime: MPI_Finalize: %s\n", rt_mpi_text(rc, t, sizeof t));
    }
}

static int under_launcher(void) { return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK"); }

/* 0, or -1 after one line on stderr. */
static int mpi_start(void) {
    char t[512];
    if (M.started) return 0;
    int inited = 0, rc = MPI_Initialized(&inited);
    if (rc != MPI_SUCCESS) {
        fprintf(stderr, "kiln runtime: MPI_Initialized: %s\n", rt_mpi_text(rc, t, sizeof t));
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
        fprintf(stderr, "kiln runtime: MPI initialisation: %s\n", rt_mpi_text(rc, t, sizeof t));
        return -1;
    }
    const char *cap = getenv("KILN_TEST_MPI_THREAD_LEVEL"); /* tests: act as if MPI provided only this level (never more) */
    if (cap && *cap && atoi(cap) < M.level) M.level = atoi(cap);
    if (M.level < MPI_THREAD_SERIALIZED) {
        fprintf(stderr, "kiln runtime: MPI provides thread level %d; kiln needs MPI_THREAD_SERIALIZED or more\n", M.level);
        return -1;
    }
    rc = MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    if (rc != MPI_SUCCESS) {
        fprintf(stderr, "kiln runtime: MPI_Comm_set_errhandler: %s\n", rt_mpi_text(rc, t, sizeof t));
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
                    rt_mpi_text(rc, t, sizeof t));
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
    if (!(cm->coll = rt_coll_new())) {
        free(cm);
        return NULL;
    }
    for (int a = 0; a < NAXES; a++) cm->mesh[a] = mesh_dim(p, a);
    cm->world = world;
    cm->mpi = world > 1 || under_launcher();
    if (cm->mpi) {
        int size = 0, rc;
        if (mpi_start()) goto fail;
        if (p->nstreams > 4 && M.level < MPI_THREAD_MULTIPLE) { /* a second comm stream (4: tp's, 5: pp's, --schedule lhs) */
            fprintf(stderr, "kiln runtime: this program runs collectives on two comm streams at once, which needs MPI_THREAD_MULTIPLE; "
                            "MPI provides thread level %d (compile with --schedule fixed for one comm stream)\n", M.level);
            goto fail;
        }
        rc = MPI_Comm_size(MPI_COMM_WORLD, &size);
        if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(MPI_COMM_WORLD, &cm->rank);
        if (rc != MPI_SUCCESS) {
            fprintf(stderr, "kiln runtime: MPI_COMM_WORLD: %s\n", rt_mpi_text(rc, t, sizeof t));
            goto fail;
        }
        if (size != world) {
            if (cm->rank == 0)
                fprintf(stderr, "%s: compiled for %d ranks (pp x dp x cp x tp = %d x %d x %d x %d); launched with %d processes (use mpirun -np %d)\n",
                        p->model ? p->model : "program", world, cm->mesh[0], cm->mesh[1], cm->mesh[2], cm->mesh[3], size, world);
            /* every rank fails here; the others wait for rank 0's line so
             * mpirun does not abort the job before it is out */
            if (MPI_Barrier(MPI_COMM_WORLD) != MPI_SUCCESS) fprintf(stderr, "kiln runtime: MPI_Barrier failed after a launch size mismatch\n");
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

void rt_comm_free(RtComm *cm) {
    if (!cm) return;
    char t[512];
    if (rt_comm_finish_sends(cm, t, sizeof t)) fprintf(stderr, "kiln runtime: %s\n", t);
    rt_coll_free(cm->coll);
    for (int m = 1; m < NMASKS; m++)
        if (cm->comm[m] != MPI_COMM_NULL) {
            int rc = MPI_Comm_free(&cm->comm[m]);
            if (rc != MPI_SUCCESS) {
                fprintf(stderr, "kiln runtime: MPI_Comm_free: %s\n", rt_mpi_text(rc, t, sizeof t));
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

/* ---- for the collective kernels (rt_private.h) ---- */

RtColl *rt_comm_coll(RtComm *cm) { return cm->coll; }
void rt_comm_count(RtComm *cm, int64_t bytes) { atomic_fetch_add(&cm->bytes, (long long)bytes); }
void rt_comm_break(RtComm *cm) { atomic_store(&cm->broken, 1); }
int rt_comm_broken(RtComm *cm) { return atomic_load(&cm->broken); }
int64_t rt_comm_piece(void) { return chunk_limit; }

RtGroup rt_comm_group(RtComm *cm, int mask) { return (RtGroup){mask, cm->gsize[mask], cm->gindex[mask], cm->comm[mask]}; }

int rt_group_bcast(RtComm *cm, int mask, void *buf, int64_t bytes, char *err, int errlen) {
    char t[512];
    if (mask <= 0 || mask >= NMASKS || bytes < 0 || bytes > INT_MAX)
        return snprintf(err, (size_t)errlen, "rt_group_bcast: bad group mask %d or size %lld", mask, (long long)bytes), -1;
    if (cm->gsize[mask] == 1 || bytes == 0) return 0;
    rt_mpi_lock();
    int rc = MPI_Bcast(buf, (int)bytes, MPI_BYTE, 0, cm->comm[mask]);
    rt_mpi_unlock();
    if (rc == MPI_SUCCESS) return 0;
    atomic_store(&cm->broken, 1);
    snprintf(err, (size_t)errlen, "MPI: %s", rt_mpi_text(rc, t, sizeof t));
    return -1;
}

#define TRY(call)                           \
    do {                                    \
        int rc_ = (call);                   \
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

int rt_mpi_allgather(MPI_Comm comm, const void *xv, void *yv, int64_t count, MPI_Datatype t, int64_t ext) {
    const char *x = xv;
    char *y = yv;
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

static int overlap(const void *a, int64_t na, const void *b, int64_t nb) {
    const char *x = a, *y = b;
    return na > 0 && nb > 0 && x < y + nb && y < x + na;
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
    rt_mpi_lock();
    int rc = rt_mpi_allgather(cm->comm[mask], in, y, bytes, MPI_BYTE, 1);
    rt_mpi_unlock();
    free(tmp);
    if (rc == MPI_SUCCESS) return 0;
    atomic_store(&cm->broken, 1);
    snprintf(err, (size_t)errlen, "allgather over %s (%d ranks): MPI: %s", rt_group_name(mask, name, sizeof name), size, rt_mpi_text(rc, t, sizeof t));
    return -1;
}

/* Point to point in pieces of chunk_limit bytes, group index 0 receiving
 * every other member's x in index order (MPI orders the messages of one
 * source, so a fixed tag serves). */
static int gather_to_first(const RtComm *cm, int mask, const char *x, char *y, int64_t bytes) {
    const int tag = 4242;
    int size = cm->gsize[mask], index = cm->gindex[mask];
    for (int j = 1; j < size; j++) {
        if (index != 0 && index != j) continue;
        for (int64_t o = 0; o < bytes; o += chunk_limit) {
            int len = (int)(bytes - o < chunk_limit ? bytes - o : chunk_limit);
            int rc = index == 0 ? MPI_Recv(y + j * bytes + o, len, MPI_BYTE, j, tag, cm->comm[mask], MPI_STATUS_IGNORE)
                                : MPI_Send(x + o, len, MPI_BYTE, 0, tag, cm->comm[mask]);
            if (rc != MPI_SUCCESS) return rc;
        }
    }
    return MPI_SUCCESS;
}

int rt_host_gather(rt_ctx *ctx, int mask, const void *x, void *y, int64_t bytes, char *err, int errlen) {
    RtComm *cm = rt_comm_of(ctx);
    char name[32], t[512];
    if (mask <= 0 || mask >= NMASKS || bytes < 0)
        return snprintf(err, (size_t)errlen, "rt_host_gather: bad group mask %d or size %lld", mask, (long long)bytes), -1;
    int size = cm->gsize[mask], index = cm->gindex[mask];
    if (index == 0 && x != y && bytes) memmove(y, x, (size_t)bytes);
    if (size == 1 || bytes == 0) return 0;
    if (atomic_load(&cm->broken))
        return snprintf(err, (size_t)errlen, "gather over %s: not run: an earlier MPI call of this rank failed",
                        rt_group_name(mask, name, sizeof name)), -1;
    rt_mpi_lock();
    int rc = gather_to_first(cm, mask, x, y, bytes);
    rt_mpi_unlock();
    if (rc == MPI_SUCCESS) return 0;
    atomic_store(&cm->broken, 1);
    snprintf(err, (size_t)errlen, "gather over %s (%d ranks): MPI: %s", rt_group_name(mask, name, sizeof name), size, rt_mpi_text(rc, t, sizeof t));
    return -1;
}

int rt_host_barrier(rt_ctx *ctx, char *err, int errlen) {
    RtComm *cm = rt_comm_of(ctx);
    char t[512];
    if (!cm->mpi || cm->world == 1) return 0;
    if (atomic_load(&cm->broken)) return snprintf(err, (size_t)errlen, "barrier: not run: an earlier MPI call of this rank failed"), -1;
    rt_mpi_lock();
    int rc = MPI_Barrier(MPI_COMM_WORLD);
    rt_mpi_unlock();
    if (rc == MPI_SUCCESS) return 0;
    atomic_store(&cm->broken, 1);
    snprintf(err, (size_t)errlen, "barrier: MPI: %s", rt_mpi_text(rc, t, sizeof t));
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
