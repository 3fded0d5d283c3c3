/* fake_cuda.h — what the fake libcuda.so.1 (fake_cuda.c) exports beyond
 * the CUDA driver API, for the other fakes (fake_cublaslt.c, fake_nccl.c).
 *
 * A real cuBLASLt or NCCL call enqueues kernels on a stream; the fakes do
 * their work on the host instead, and must still follow the stream's rules:
 * run after the stream's earlier work (the driver runs it on the calling
 * thread once the stream's queue is empty, so its errors are the call's),
 * but be RECORDED, with its arguments copied, while the stream is being
 * captured into a CUDA graph, and run again at every cuGraphLaunch.
 * kiln_fake_cuda_enqueue gives them that.  No program should call these.
 */
#ifndef KILN_FAKE_CUDA_H
#define KILN_FAKE_CUDA_H

#include <cuda.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A device range that host work reads or writes (for the driver's
 * happens-before check, KILN_FAKE_CUDA_STRICT=1). */
typedef struct {
    CUdeviceptr p;
    size_t bytes;
    int write;
} KilnFakeAccess;

/* Host work run(data) on stream s, as the fake driver runs a kernel: at
 * once, or, while s captures, recorded with a copy of data[0..bytes) (so
 * data may be the caller's stack) and run from the copy at each replay.
 * run returns 0, or -1 with a one-line message in err: that is a launch
 * failure (CUDA_ERROR_LAUNCH_FAILED, sticky, as a faulting kernel's).
 * `what` names the work in messages ("cublasLtMatmul").  acc[0..nacc) are
 * the device ranges it reads and writes (copied when recorded).  Returns
 * the driver's CUresult (an invalid stream, a capture error, a failure). */
CUresult kiln_fake_cuda_enqueue(CUstream s, const char *what, int (*run)(void *data, char *err, size_t errlen),
                                const void *data, size_t bytes, const KilnFakeAccess *acc, int nacc);

/* How many unordered conflicting accesses (races) the happens-before
 * check has reported; reset sets the count back to 0.  For selftest.c,
 * which finds it with dlsym (the real libcuda.so.1 has no such symbol). */
int kiln_fake_cuda_races(int reset);

/* 0 when [p, p + bytes) lies inside one live device allocation
 * (cuMemAlloc); otherwise -1 with a one-line message in err. */
int kiln_fake_cuda_check_range(CUdeviceptr p, size_t bytes, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
