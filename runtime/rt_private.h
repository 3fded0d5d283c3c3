/* rt_private.h — what the CPU device's two halves share: dev_cpu.c (memory,
 * streams, events, the pool) and comm_mpi.c (ranks, groups, collectives).
 * Not part of the ABI: generated code sees only kiln_rt.h. */
#ifndef KILN_RT_PRIVATE_H
#define KILN_RT_PRIVATE_H
#include "kiln_rt.h"

typedef struct RtComm RtComm;

/* Ranks and communicators for p's mesh: MPI is initialised when the mesh
 * has more than one rank or the process runs under mpirun; the process
 * count must equal the mesh's world.  NULL after one line on stderr. */
RtComm *rt_comm_new(const rt_program *p);
void rt_comm_free(RtComm *cm);
/* Complete rtk_send's staged sends still in flight (MPI_Wait) and drop
 * sends to this rank itself that nobody received; rt_step calls it after
 * the streams drained, rt_comm_free too.  0, or -1 with a message in err. */
int rt_comm_finish_sends(RtComm *cm, char *err, int errlen);
/* Bytes the calling thread has sent through the comm backend so far (the
 * part of rt_comm_bytes it sent): the trace's bytes of one launch. */
int64_t rt_comm_thread_bytes(void);
/* The context's communication state (dev_cpu.c owns the context). */
RtComm *rt_comm_of(rt_ctx *ctx);
/* The size of group `mask` in p's mesh (an unset mesh entry counts as 1);
 * 0 for a mask outside 1..15. */
int rt_mesh_group_size(const rt_program *p, int mask);
/* Between steps, every rank of the world: exchange each rank's outcome rc
 * (0 = success) and message.  0 when every rank passed 0; otherwise -1 on
 * every rank with the first failing rank's message in err ("rank N: ..."
 * for N > 0), so that rank 0 can print it once.  One rank: returns rc. */
int rt_host_agree(rt_ctx *ctx, int rc, char *err, int errlen);
/* "dp+cp" for RT_AXIS_DP|RT_AXIS_CP. */
const char *rt_group_name(int mask, char *buf, int len);

/* The distributed optimizer's sharded states (kiln_rt.h, rt_tensor.bucket):
 * a shard of a flat bucket (prefix set), and among those the shards that
 * hold the params themselves (prefix "", state "param.b<k>"), whose
 * members have no storage of their own. */
static inline int rt_is_shard(const rt_tensor *t) { return t->prefix != NULL; }
static inline int rt_is_param_shard(const rt_tensor *t) { return t->prefix && !t->prefix[0]; }
/* A param without storage (space -1): its values live in a param shard. */
static inline int rt_is_stored(const rt_tensor *t) { return t->space >= 0; }
#endif
