/* rt_cuda.h — what the CUDA device's parts share: dev_cuda.c (context,
 * memory, host mirrors, streams, events, the CUDA graph), kernels_cuda.c
 * (the rtk_* launchers: library kernels, generated kernels, cuBLASLt GEMMs)
 * and comm_nccl.c (NCCL collectives and point-to-point).  Not part of the
 * ABI: generated code sees only kiln_rt.h.
 *
 * How a launch runs.  On CUDA, rt_launch(ctx, s, k, args, ...) makes stream
 * s current and calls k(ctx, args) on the calling thread; k enqueues its
 * work on rtc_stream(ctx) and returns at once.  Every kernel of one stream
 * shares that stream's scratch buffer (rtc_scratch) and cuBLASLt workspace:
 * the stream runs them one after another, so they never overlap.  Step 1
 * runs eagerly (a launcher may set itself up there: plans, workspaces);
 * step 2 is captured into a CUDA graph that later steps replay, so a
 * launcher must enqueue the same work with the same arguments every time
 * and, from step 2 on, never synchronise, allocate or read device memory
 * on the host.
 *
 * Errors.  A CUDA, cuBLASLt or NCCL call that fails inside a launcher
 * calls rt_fail(ctx, "...") with the call, its error string and the
 * launch's name (rtc_launch_name); the step then fails with that message.
 * RTC_CHECK below does this for driver calls.
 */
#ifndef KILN_RT_CUDA_H
#define KILN_RT_CUDA_H
#include <cuda.h>

#include "rt_private.h"

/* The current launch's CUDA stream (the stream rt_launch made current). */
CUstream rtc_stream(rt_ctx *ctx);
/* The current stream's scratch: at least program->scratch_bytes bytes,
 * 256-byte aligned.  rt_fail + 0 when `bytes` is more than that. */
CUdeviceptr rtc_scratch(rt_ctx *ctx, int64_t bytes);
/* The current stream's cuBLASLt workspace and its size in bytes. */
CUdeviceptr rtc_gemm_workspace(rt_ctx *ctx, size_t *bytes);
/* The cuBLASLt handle (a cublasLtHandle_t) of the context. */
void *rtc_cublaslt(rt_ctx *ctx);
/* The name rt_launch was given for the current launch ("kernel@where"). */
const char *rtc_launch_name(rt_ctx *ctx);
/* A kernel of the program's cubins by name (library "kiln_layernorm_fwd"
 * or generated "kiln_fused_3"), looked up once at rt_new; NULL + rt_fail
 * when there is none. */
CUfunction rtc_function(rt_ctx *ctx, const char *name);
/* The program's generated kernel i (rtk_fused), resolved at rt_new. */
CUfunction rtc_generated(rt_ctx *ctx, int64_t i);
/* cuLaunchKernel on the current stream: a 1-D block of `block` threads, a
 * grid of (gx, gy) blocks, `smem` bytes of dynamic shared memory (the
 * function's attribute raised first when above 48 KiB), and params as
 * cuLaunchKernel's kernelParams.  A grid dimension of 0 launches nothing.
 * rt_fail on error. */
void rtc_launch(rt_ctx *ctx, CUfunction f, int64_t gx, int64_t gy, int block, int64_t smem, void **params);
/* A device copy of the program's rt_schedule (four doubles: lr, min_lr,
 * warmup, total), refreshed from the host's before every step: what
 * kiln_lr_cosine reads. */
CUdeviceptr rtc_schedule(rt_ctx *ctx);
/* The context's CUDA context (for threads that need it current). */
CUcontext rtc_context(rt_ctx *ctx);

/* kernels_cuda.c: free the context's cached cuBLASLt plans (rt_free calls
 * it once, before destroying the cuBLASLt handle). */
void rtc_kernels_free(rt_ctx *ctx);

/* Run fn(ctx) in rt_free, with the CUDA context current and before the
 * cuBLASLt handle and the streams go (at most 8 functions; registering
 * one twice keeps one).  attn_cudnn.c registers rtc_cudnn_free at its
 * first launch, so a program without cuDNN attention never links cuDNN. */
void rtc_at_free(rt_ctx *ctx, void (*fn)(rt_ctx *ctx));
/* attn_cudnn.c: free the context's cuDNN plans and workspaces. */
void rtc_cudnn_free(rt_ctx *ctx);

/* comm_nccl.c: NCCL communicators per group mask, created in rt_new after
 * rt_comm_new (MPI bootstraps them: group rank 0 makes the unique id and
 * broadcasts it over the group's MPI communicator; one rank needs no MPI).
 * NULL + one line on stderr on failure. */
typedef struct RtNccl RtNccl;
RtNccl *rtc_nccl_new(rt_ctx *ctx, const rt_program *p);
void rtc_nccl_free(RtNccl *n);
/* After a failed step: rtc_nccl_free aborts the communicators (the peers
 * may be waiting in a collective that never completes) instead of
 * destroying them. */
void rtc_nccl_break(RtNccl *n);
RtNccl *rtc_nccl_of(rt_ctx *ctx); /* dev_cuda.c owns it */
/* comm_nccl.c: issue the sends noted on stream st (every stream's: NULL)
 * that no recv has taken yet, in one NCCL group; dev_cuda.c calls it before
 * any other launch or event record on the stream and at the step's end. */
void rtc_p2p_flush(rt_ctx *ctx, CUstream st);

/* Report a failed driver call with its name and the launch's name. */
const char *rtc_error_string(CUresult r);
#define RTC_CHECK(ctx, call)                                                                              \
    do {                                                                                                  \
        CUresult rtc_r_ = (call);                                                                         \
        if (rtc_r_ != CUDA_SUCCESS)                                                                       \
            rt_fail((ctx), "%s: %s: %s", rtc_launch_name(ctx), #call, rtc_error_string(rtc_r_));        \
    } while (0)
/* trace_cuda.c: --trace from CUDA events (its essay says how).  new: NULL
 * with one line in err; the others return the failing driver call's
 * result; write and free: 0, or -1 after a line on stderr. */
typedef struct RtcTrace RtcTrace;
RtcTrace *rtc_trace_new(const char *path, int rank, int nstreams, char *err, size_t errlen);
CUresult rtc_trace_step_begin(RtcTrace *t, CUstream s0, int64_t step);
CUresult rtc_trace_launch_begin(RtcTrace *t, int stream, CUstream s, const char *name);
CUresult rtc_trace_launch_end(RtcTrace *t, CUstream s);
CUresult rtc_trace_step_end(RtcTrace *t);
int rtc_trace_write(RtcTrace *t);
int rtc_trace_free(RtcTrace *t);

#endif
