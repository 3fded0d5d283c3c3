/* rt_private.h — what the runtime's files share behind kiln_rt.h: the
 * devices (dev_cpu.c, dev_cuda.c: memory, streams, events), comm_mpi.c
 * (MPI, ranks, groups: both devices; comm_single.c replaces it in a
 * one-rank CUDA trainer, which then needs no libmpi) and each device's
 * collective kernels (coll_mpi.c on the CPU, comm_nccl.c on CUDA).
 * mpi.h is included for its types only: comm_single.c and comm_nccl.c
 * name no MPI symbol (a macro such as MPI_COMM_NULL would pull libmpi).  Not part of the ABI:
 * generated code sees only kiln_rt.h. */
#ifndef KILN_RT_PRIVATE_H
#define KILN_RT_PRIVATE_H
#include <mpi.h>

#include "kiln_rt.h"

typedef struct RtComm RtComm;

/* Ranks and communicators for p's mesh: MPI is initialised when the mesh
 * has more than one rank or the process runs under mpirun; the process
 * count must equal the mesh's world.  NULL after one line on stderr. */
RtComm *rt_comm_new(const rt_program *p);
void rt_comm_free(RtComm *cm);
/* Complete rtk_send's sends still in flight and drop sends to this rank
 * itself that nobody received (CPU: MPI_Wait on the staged sends; CUDA:
 * sends still waiting for their recv are an error); rt_step calls it after
 * the step, rt_comm_free too.  0, or -1 with a message in err. */
int rt_comm_finish_sends(RtComm *cm, char *err, int errlen);
/* Bytes the calling thread has sent through the comm backend so far (the
 * part of rt_comm_bytes it sent): the trace's bytes of one launch. */
int64_t rt_comm_thread_bytes(void);
/* The context's communication state (the device owns the context). */
RtComm *rt_comm_of(rt_ctx *ctx);
/* The size of group `mask` in p's mesh (an unset mesh entry counts as 1);
 * 0 for a mask outside 1..15. */
int rt_mesh_group_size(const rt_program *p, int mask);
/* Between steps, every rank of the world: exchange each rank's outcome rc
 * (0 = success) and message.  0 when every rank passed 0; otherwise -1 on
 * every rank with the first failing rank's message in err ("rank N: ..."
 * for N > 0), so that rank 0 can print it once.  One rank: returns rc. */
int rt_host_agree(rt_ctx *ctx, int rc, char *err, int errlen);
/* Between steps, on the main thread, every rank of group `mask`: group
 * index 0 receives every member's `bytes` bytes of x into y (size*bytes,
 * group-rank order; its own x copied to y); the others send and leave y
 * alone (it may be NULL there).  0, or -1 with a message in err. */
int rt_host_gather(rt_ctx *ctx, int mask, const void *x, void *y, int64_t bytes, char *err, int errlen);
/* "dp+cp" for RT_AXIS_DP|RT_AXIS_CP. */
const char *rt_group_name(int mask, char *buf, int len);
/* Outside a step, every rank of group `mask`: group index 0's `bytes`
 * bytes of buf overwrite the others' (comm_nccl.c broadcasts its NCCL ids
 * with it).  A group of one: nothing.  0, or -1 with a message in err.
 * (comm_mpi.c: MPI_Bcast; comm_single.c, the one-rank comm layer without
 * MPI: groups of one only.) */
int rt_group_bcast(RtComm *cm, int mask, void *buf, int64_t bytes, char *err, int errlen);

/* ---- comm_mpi.c for the collective kernels (coll_mpi.c, comm_nccl.c) ----
 * The kernels' own per-context state (coll_mpi.c: rtk_send's staging
 * list; comm_nccl.c: the sends waiting for their recv) is an RtColl that
 * each device's collective file defines: rt_comm_new makes it with
 * rt_coll_new (NULL after one line on stderr), rt_comm_free frees it with
 * rt_coll_free after rt_comm_finish_sends. */
typedef struct RtColl RtColl;
RtColl *rt_coll_new(void);
void rt_coll_free(RtColl *coll);
RtColl *rt_comm_coll(RtComm *cm);
/* Add what a collective sent to rt_comm_bytes. */
void rt_comm_count(RtComm *cm, int64_t bytes);
/* A communication call failed: later ones fail at once instead of talking
 * to a communicator in an unknown state. */
void rt_comm_break(RtComm *cm);
int rt_comm_broken(RtComm *cm);
/* The most elements (bytes, for point to point) one MPI call moves:
 * INT_MAX, or the test hook KILN_RT_COMM_CHUNK. */
int64_t rt_comm_piece(void);
/* Group `mask` (1..15, the caller checks): its size, this rank's index in
 * it and its communicator (MPI_COMM_NULL for a group of one). */
typedef struct {
    int mask, size, index;
    MPI_Comm comm;
} RtGroup;
RtGroup rt_comm_group(RtComm *cm, int mask);
/* Below MPI_THREAD_MULTIPLE, one thread at a time may be inside MPI: every
 * MPI call of the runtime sits between these two. */
void rt_mpi_lock(void);
void rt_mpi_unlock(void);
/* MPI_Error_string of rc, in buf. */
const char *rt_mpi_text(int rc, char *buf, int len);
/* Under rt_mpi_lock: y[j*count + k] = x of group-rank j [k] for elements
 * of type t (extent ext bytes), in pieces of rt_comm_piece(); x NULL: in
 * place (this rank's chunk already sits in y).  MPI's code. */
int rt_mpi_allgather(MPI_Comm comm, const void *x, void *y, int64_t count, MPI_Datatype t, int64_t ext);

/* Pipeline stages (kiln_rt.h, rt_program.stages): their count and stage s's
 * table.  A table of another ABI, or one built by hand without stages
 * (nstages 0, stages NULL: the tests'), is one stage, itself. */
static inline int rt_nstages(const rt_program *p) {
    return p->abi_version == RT_ABI_VERSION && p->nstages > 1 && p->stages ? p->nstages : 1;
}
static inline const rt_program *rt_stage(const rt_program *p, int s) { return rt_nstages(p) > 1 ? p->stages[s] : p; }

/* The distributed optimizer's sharded states (kiln_rt.h, rt_tensor.bucket):
 * a shard of a flat bucket (prefix set), and among those the shards that
 * hold the params themselves (prefix "", state "param.b<k>"), whose
 * members have no storage of their own. */
static inline int rt_is_shard(const rt_tensor *t) { return t->prefix != NULL; }
static inline int rt_is_param_shard(const rt_tensor *t) { return t->prefix && !t->prefix[0]; }
/* A param without storage (space -1): its values live in a param shard. */
static inline int rt_is_stored(const rt_tensor *t) { return t->space >= 0; }
#endif
