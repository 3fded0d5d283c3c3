/* fake_nccl.c — a fake libnccl.so.2 for ONE rank, for running the CUDA
 * trainer without a GPU (fake_cuda.c says why and how).
 *
 * With one rank every collective is a copy: all-reduce (sum) and
 * all-gather copy the send buffer to the receive buffer, reduce-scatter
 * copies the first recvcount elements; when the buffers are the same
 * (in place) there is nothing to do.  The copies are cuMemcpyDtoDAsync on
 * the given stream, so the fake driver checks both ranges and records them
 * while the stream captures.  ncclSend/ncclRecv to the rank itself (peer 0)
 * are matched inside ncclGroupStart/End, in order, as NCCL pairs them (the
 * receive buffer gets the send buffer, on the receive's stream); a send or
 * receive to itself outside a group would deadlock in NCCL and fails here.
 *
 * Refused (ncclInvalidArgument / ncclInvalidUsage, with one "fake nccl: "
 * line on stderr): more than one rank, a rank other than 0, a peer other
 * than 0, a reduction other than ncclSum, a data type other than the
 * contract's (ncclFloat32, ncclBfloat16, ncclInt32, ncclUint8), a NULL or
 * destroyed communicator, unmatched sends/receives at ncclGroupEnd.
 */
#include <cuda.h>
#include <nccl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_cuda.h"

#define COMM_MAGIC 0x6b4e636cu /* "kNcl" */
#define MAX_PENDING 256

struct ncclComm {
    unsigned magic;
};

typedef struct {
    int is_send;
    const void *send;
    void *recv;
    size_t bytes;
    cudaStream_t stream;
} P2p;

static int group_depth;
static P2p pending[MAX_PENDING];
static int npending;
static unsigned id_counter;

static ncclResult_t fail(ncclResult_t r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static ncclResult_t fail(ncclResult_t r, const char *fmt, ...) {
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "fake nccl: %s (%s)\n", line, ncclGetErrorString(r));
    return r;
}

const char *ncclGetErrorString(ncclResult_t result) {
    switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId) {
    if (!uniqueId) return fail(ncclInvalidArgument, "ncclGetUniqueId: NULL");
    memset(uniqueId, 0, sizeof *uniqueId);
    snprintf(uniqueId->internal, sizeof uniqueId->internal, "kiln-fake-nccl-%u", ++id_counter);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank) {
    (void)commId;
    if (!comm) return fail(ncclInvalidArgument, "ncclCommInitRank: comm is NULL");
    if (nranks != 1) return fail(ncclInvalidArgument, "ncclCommInitRank: %d ranks; the fake has one rank only", nranks);
    if (rank != 0) return fail(ncclInvalidArgument, "ncclCommInitRank: rank %d of 1", rank);
    struct ncclComm *c = calloc(1, sizeof *c);
    if (!c) return fail(ncclSystemError, "ncclCommInitRank: out of memory");
    c->magic = COMM_MAGIC;
    *comm = c;
    return ncclSuccess;
}

static ncclResult_t check_comm(const char *call, ncclComm_t comm) {
    if (!comm || comm->magic != COMM_MAGIC) return fail(ncclInvalidArgument, "%s: not a live communicator", call);
    return ncclSuccess;
}

static ncclResult_t free_comm(const char *call, ncclComm_t comm) {
    ncclResult_t r = check_comm(call, comm);
    if (r) return r;
    comm->magic = 0;
    free(comm);
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) { return free_comm("ncclCommDestroy", comm); }
ncclResult_t ncclCommAbort(ncclComm_t comm) { return free_comm("ncclCommAbort", comm); }

static size_t type_size(ncclDataType_t t) {
    switch (t) {
    case ncclFloat32: return 4;
    case ncclBfloat16: return 2;
    case ncclInt32: return 4;
    case ncclUint8: return 1;
    default: return 0;
    }
}

/* recv = send (count elements of dt) on stream, after the common checks */
static ncclResult_t copy(const char *call, const void *send, void *recv, size_t count, ncclDataType_t dt,
                         ncclComm_t comm, cudaStream_t stream) {
    ncclResult_t r = check_comm(call, comm);
    if (r) return r;
    size_t es = type_size(dt);
    if (!es) return fail(ncclInvalidArgument, "%s: data type %d is not emulated", call, (int)dt);
    if (count == 0) return ncclSuccess;
    char why[512];
    if (kiln_fake_cuda_check_range((CUdeviceptr)(uintptr_t)send, count * es, why, sizeof why) != 0 ||
        kiln_fake_cuda_check_range((CUdeviceptr)(uintptr_t)recv, count * es, why, sizeof why) != 0)
        return fail(ncclInvalidArgument, "%s: %s", call, why);
    if (send == recv) return ncclSuccess;
    CUresult cr = cuMemcpyDtoDAsync((CUdeviceptr)(uintptr_t)recv, (CUdeviceptr)(uintptr_t)send, count * es, (CUstream)stream);
    if (cr != CUDA_SUCCESS) return fail(ncclUnhandledCudaError, "%s: cuMemcpyDtoDAsync failed (CUresult %d)", call, (int)cr);
    return ncclSuccess;
}

static ncclResult_t check_sum(const char *call, ncclRedOp_t op) {
    return op == ncclSum ? ncclSuccess : fail(ncclInvalidArgument, "%s: reduction %d is not emulated (ncclSum only)", call, (int)op);
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
    ncclResult_t r = check_sum("ncclAllReduce", op);
    return r ? r : copy("ncclAllReduce", sendbuff, recvbuff, count, datatype, comm, stream);
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    ncclResult_t r = check_sum("ncclReduceScatter", op);
    return r ? r : copy("ncclReduceScatter", sendbuff, recvbuff, recvcount, datatype, comm, stream);
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
    return copy("ncclAllGather", sendbuff, recvbuff, sendcount, datatype, comm, stream);
}

static ncclResult_t point_to_point(const char *call, int is_send, const void *send, void *recv, size_t count,
                                   ncclDataType_t dt, int peer, ncclComm_t comm, cudaStream_t stream) {
    ncclResult_t r = check_comm(call, comm);
    if (r) return r;
    size_t es = type_size(dt);
    if (!es) return fail(ncclInvalidArgument, "%s: data type %d is not emulated", call, (int)dt);
    if (peer != 0) return fail(ncclInvalidArgument, "%s: peer %d of 1 rank", call, peer);
    if (group_depth == 0)
        return fail(ncclInvalidUsage, "%s to the rank itself outside ncclGroupStart/End (it would deadlock)", call);
    if (npending == MAX_PENDING) return fail(ncclInternalError, "%s: more than %d in one group", call, MAX_PENDING);
    pending[npending++] = (P2p){is_send, send, recv, count * es, stream};
    return ncclSuccess;
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    return point_to_point("ncclSend", 1, sendbuff, NULL, count, datatype, peer, comm, stream);
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    return point_to_point("ncclRecv", 0, NULL, recvbuff, count, datatype, peer, comm, stream);
}

ncclResult_t ncclGroupStart(void) {
    group_depth++;
    return ncclSuccess;
}

/* the k-th send meets the k-th receive */
static ncclResult_t match_pending(void) {
    int sends = 0, recvs = 0;
    for (int i = 0; i < npending; i++) sends += pending[i].is_send, recvs += !pending[i].is_send;
    if (sends != recvs) return fail(ncclInvalidUsage, "ncclGroupEnd: %d sends and %d receives to the rank itself", sends, recvs);
    for (int s = 0, r = 0; s < npending; s++) {
        if (!pending[s].is_send) continue;
        while (pending[r].is_send) r++;
        const P2p *snd = &pending[s], *rcv = &pending[r++];
        if (snd->bytes != rcv->bytes)
            return fail(ncclInvalidUsage, "ncclGroupEnd: a send of %zu bytes meets a receive of %zu", snd->bytes, rcv->bytes);
        ncclResult_t res = copy("ncclSend/ncclRecv", snd->send, rcv->recv, snd->bytes, ncclUint8, &(struct ncclComm){COMM_MAGIC},
                                rcv->stream);
        if (res) return res;
    }
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
    if (group_depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    if (--group_depth > 0) return ncclSuccess;
    ncclResult_t r = match_pending();
    npending = 0;
    return r;
}
