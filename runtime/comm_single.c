/* comm_single.c — the one-rank comm layer: comm_mpi.c's functions for a
 * program whose mesh is one rank, without MPI, so that a single-GPU CUDA
 * trainer neither links nor loads libmpi (issue 23).
 *
 * Which file a trainer links is decided by `kiln compile` at link time
 * (compiler/cmd/compile.c, link_trainer): a CUDA program whose world
 * (pp x dp x cp x tp) is one rank links build/runtime/comm_single.o and
 * the CUDA libraries without MPI's; a multi-rank one links comm_mpi.o and
 * MPI.  Neither object is in libkilnrt_cuda.a, so a trainer has exactly
 * one of them (two would be duplicate symbols; none, undefined ones: both
 * fail the link, by name).  The CPU's runtime (libkilnrt.a) keeps
 * comm_mpi.c: its collective kernels (coll_mpi.c) are MPI's.
 *
 * Semantics are comm_mpi.c's for a world of one in a plain process: rank
 * 0, every group of one (size 1, index 0), host collectives are copies,
 * the barrier returns at once, rt_host_agree returns its rc, and
 * rt_group_bcast has nothing to send.  rt_comm_new refuses, with one line,
 * a program compiled for more than one rank (a table linked by hand) and a
 * process that a launcher started as one of several (OMPI_COMM_WORLD_SIZE
 * or PMI_SIZE above 1): such a trainer cannot talk to its peers.  Under
 * `mpirun -np 1` it runs as in a plain process.
 *
 * It names no MPI symbol (rt_private.h includes mpi.h for its types only:
 * RtGroup.comm is left zero, never MPI_COMM_NULL, which is a libmpi
 * symbol in Open MPI).  tests/t_cuda_target.sh checks with ldd that a
 * one-rank CUDA trainer needs no MPI library and that a dp 2 one does.
 */
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt_private.h"

enum { NMASKS = 16 };

struct RtComm {
    atomic_llong bytes;   /* rt_comm_bytes (sends to this rank itself count nothing) */
    atomic_int broken;    /* a communication call failed */
    RtColl *coll;         /* the collective kernels' state */
};

/* The world size a launcher gave this process (1 when none). */
static long launcher_size(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"};
    for (int i = 0; i < 2; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v) return strtol(v, NULL, 10);
    }
    return 1;
}

RtComm *rt_comm_new(const rt_program *p) {
    const char *model = p->model ? p->model : "program";
    int world = rt_mesh_group_size(p, NMASKS - 1);
    for (int a = 0; a < 4; a++)
        if (p->mesh[a] < 0) world = -1;
    if (world != 1) {
        fprintf(stderr, "%s: compiled for a mesh of %d x %d x %d x %d ranks but linked without MPI (comm_single.c): relink with kiln compile\n",
                model, p->mesh[0], p->mesh[1], p->mesh[2], p->mesh[3]);
        return NULL;
    }
    long size = launcher_size();
    if (size != 1) {
        fprintf(stderr, "%s: a one-rank trainer (no MPI) launched as one of %ld processes: run it without mpirun, or compile for %ld ranks\n",
                model, size, size);
        return NULL;
    }
    RtComm *cm = calloc(1, sizeof *cm);
    if (!cm) {
        fprintf(stderr, "kiln runtime: out of memory\n");
        return NULL;
    }
    if (!(cm->coll = rt_coll_new())) {
        free(cm);
        return NULL;
    }
    return cm;
}

void rt_comm_free(RtComm *cm) {
    if (!cm) return;
    char t[512];
    if (rt_comm_finish_sends(cm, t, sizeof t)) fprintf(stderr, "kiln runtime: %s\n", t);
    rt_coll_free(cm->coll);
    free(cm);
}

/* ---- ranks: one ---- */

int rt_world_rank(rt_ctx *ctx) { return (void)ctx, 0; }
int rt_world_size(rt_ctx *ctx) { return (void)ctx, 1; }
int rt_group_rank(rt_ctx *ctx, int mask) { return (void)ctx, mask > 0 && mask < NMASKS ? 0 : -1; }
int rt_group_size(rt_ctx *ctx, int mask) { return (void)ctx, mask > 0 && mask < NMASKS ? 1 : 0; }
int64_t rt_comm_bytes(rt_ctx *ctx) { return (int64_t)atomic_load(&rt_comm_of(ctx)->bytes); }

/* ---- for the collective kernels (rt_private.h) ---- */

RtColl *rt_comm_coll(RtComm *cm) { return cm->coll; }
void rt_comm_count(RtComm *cm, int64_t bytes) { atomic_fetch_add(&cm->bytes, (long long)bytes); }
void rt_comm_break(RtComm *cm) { atomic_store(&cm->broken, 1); }
int rt_comm_broken(RtComm *cm) { return atomic_load(&cm->broken); }
int64_t rt_comm_piece(void) { return INT_MAX; }

RtGroup rt_comm_group(RtComm *cm, int mask) {
    (void)cm;
    RtGroup g;
    memset(&g, 0, sizeof g); /* g.comm: no communicator (see the essay) */
    g.mask = mask, g.size = 1, g.index = 0;
    return g;
}

static int bad_mask(const char *who, int mask, int64_t bytes, char *err, int errlen) {
    if (mask > 0 && mask < NMASKS && bytes >= 0) return 0;
    snprintf(err, (size_t)errlen, "%s: bad group mask %d or size %lld", who, mask, (long long)bytes);
    return -1;
}

int rt_group_bcast(RtComm *cm, int mask, void *buf, int64_t bytes, char *err, int errlen) {
    (void)cm, (void)buf;
    return bad_mask("rt_group_bcast", mask, bytes, err, errlen);
}

/* ---- host calls: copies ---- */

int rt_host_allgather(rt_ctx *ctx, int mask, const void *x, void *y, int64_t bytes, char *err, int errlen) {
    (void)ctx;
    if (bad_mask("rt_host_allgather", mask, bytes, err, errlen)) return -1;
    if (x != y && bytes) memmove(y, x, (size_t)bytes);
    return 0;
}

int rt_host_gather(rt_ctx *ctx, int mask, const void *x, void *y, int64_t bytes, char *err, int errlen) {
    return rt_host_allgather(ctx, mask, x, y, bytes, err, errlen);
}

int rt_host_barrier(rt_ctx *ctx, char *err, int errlen) { return (void)ctx, (void)err, (void)errlen, 0; }

int rt_host_agree(rt_ctx *ctx, int rc, char *err, int errlen) { return (void)ctx, (void)err, (void)errlen, rc; }
