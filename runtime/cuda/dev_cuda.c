/* dev_cuda.c — the CUDA device: kiln_rt.h's runtime half on one NVIDIA GPU
 * per rank, through the driver API.
 *
 * What a context owns.  The device's primary context; one cuMemAlloc per
 * non-empty memory space (the step receives these device bases, so the
 * generated code is the same host code as on the CPU); a host mirror of
 * each space; every cubin the program embeds, loaded once, and its
 * generated kernels resolved by name; the program's streams (non-blocking,
 * so nothing orders them but the schedule's events) and events (timing
 * off); a cuBLASLt handle; per stream a 32 MiB cuBLASLt workspace and the
 * program's scratch_bytes of scratch, in one allocation; a 32-byte device
 * copy of the learning-rate schedule; and the ranks (comm_mpi.c) and, when
 * the world has more than one rank, the NCCL communicators (comm_nccl.c).
 *
 * Launches.  The step function runs on the calling thread and only
 * enqueues.  rt_launch makes its stream current and calls the kernel's
 * launcher at once; the launcher (kernels_cuda.c, comm_nccl.c) puts its
 * work on rtc_stream and returns.  rt_record and rt_wait are
 * cuEventRecord and cuStreamWaitEvent.  As on the CPU, an event must be
 * recorded before any wait for it in the same step, at most once: a wait
 * for an event recorded only in an earlier step would be satisfied by
 * that stale record (a race the CPU device refuses), so it fails the step
 * as a schedule error instead.
 *
 * The graph.  Launch overhead of a few microseconds per kernel is a large
 * part of a small model's step, so the second step is captured into a CUDA
 * graph and every later step replays it with one cuGraphLaunch.  The first
 * step runs eagerly: the launchers' lazy set-up (cuBLASLt heuristics per
 * GEMM shape, cuDNN plans and their workspaces, kernel lookups) happens
 * there, outside any capture, where allocating is allowed.  Capture
 * starts on stream 0; the other streams join it by waiting on a fork event
 * recorded on stream 0 first, and stream 0 waits on a join event recorded
 * on each of them at the end (a capture must end with every stream joined
 * back to where it began).  The capture mode is thread-local: a launcher
 * that calls something not allowed in a capture fails this thread's
 * capture, but no other thread (MPI's, NCCL's) is disturbed.  Replaying
 * is only correct because the program is static: every launch has the
 * same arguments every step.  The two things the trainer may change
 * between steps reach the graph through device memory: the inputs through
 * rt_push into their fixed place, and the lr schedule (rt_schedule, four
 * doubles the trainer may set) through its device copy (rtc_schedule),
 * which rt_step refreshes from the host's before every step.  A failed
 * capture (a launcher called rt_fail, or the driver refused) fails the
 * step and leaves no graph; the next step captures again.
 * KILN_NO_GRAPH=1 (the trainer's --no-graph) runs the step function
 * eagerly every step instead: the debugging path, where a launcher's
 * errors show at the launch that caused them.
 *
 * The end of a step.  rt_step synchronises every stream, so a step returns
 * only when the GPU is idle; an asynchronous error (an illegal address in
 * a kernel) surfaces there and fails the step with the driver's text.
 * Such an error is sticky: the context is unusable and every later step
 * fails too, which is what the trainer wants (it stops at the first).
 *
 * Host views.  rt_space and rt_tensor_ptr return the mirror, zeroed
 * anonymous pages (rt_common.c), so a mirror of a large activation space
 * costs only the pages the trainer touches.  rt_pull and rt_push copy a
 * range between the mirror and the device on stream 0 and wait for it:
 * a copy from pageable memory may return before the DMA finishes, and the
 * streams are non-blocking, so without that wait the next step could
 * read the old values.  The device spaces start zeroed (cuMemsetD8), like
 * the CPU's, so mirror and device agree before anything is pushed.
 *
 * Parameters.  rt_init_params runs rt_common.c's generator, the CPU's own
 * code, into the mirror (rt_parallel_for is a plain loop here: only host
 * code calls it on this device), then pushes every stored param and every
 * state: a CUDA run starts from the CPU's f32 master weights bit for bit.
 *
 * Devices and ranks.  Under a launcher each rank takes the GPU of its local
 * rank (OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID or SLURM_LOCALID)
 * modulo the device count, read from the environment because MPI is not
 * initialised yet when the device is chosen (rt_comm_new comes after the
 * context, so a CUDA-aware MPI finds it).  A plain process takes device 0
 * (CUDA_VISIBLE_DEVICES chooses another).
 *
 * Errors.  rt_new prints one line and returns NULL for a bad program, no
 * driver or device ("kiln: no CUDA device: cuInit: ..."), a cubin the GPU
 * cannot load, a generated kernel missing from the cubins, or memory the
 * GPU does not have (with its free and total memory); it frees whatever it
 * made.  A launcher's failed call goes through rt_fail with the launch's
 * name (rtc_launch_name) and fails the step.  Every driver and cuBLASLt
 * return code is checked; rt_free reports the first failure of its
 * teardown in one line and goes on freeing (nothing after a step met an
 * asynchronous error: the context is gone and the step said why).
 *
 * Activation offload (issue 19).  The host space (RT_SPACE_HOST) is pinned
 * host memory from cuMemAllocHost (cuMemHostAlloc with no flags): the
 * step's base for it is the host pointer, its mirror the memory itself
 * (rt_pull/rt_push of it copy nothing).  rtk_offload is cuMemcpyDtoHAsync
 * and rtk_reload cuMemcpyHtoDAsync on the launch's stream (the copy
 * streams 2 and 3); the schedule's events order them, captured into the
 * graph like the rest.  KILN_MEASURE_PEAK=1 fills the act space with 0xff
 * instead of zeros and after each step pulls what lies above the mark so
 * far and finds the highest byte no longer 0xff (rt_act_high_water; the
 * CPU's definition, dev_cpu.c).  KILN_TEST_DROP_COPY_WAIT=N (tests only)
 * drops stream 0's first N waits per step for an event recorded on stream
 * 3 (a reload's): the fake CUDA's happens-before check must report it.
 *
 * --trace (trace_cuda.c): every step runs eagerly, each launch between two
 * timing events on its stream; the spans are read after the step's
 * synchronisation and written at rt_free in the CPU's Chrome trace format.
 *
 * What is not here: rt_options.threads and .serial (meaningless on this
 * device).
 */
#include <cublasLt.h>
#include <cuda.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln_rt.h"
#include "rt_common.h"
#include "rt_cuda.h"

enum {
    GEMM_WORKSPACE = 32 << 20, /* bytes of cuBLASLt workspace per stream */
    DEVICE_ALIGN = 256,        /* alignment of every device buffer we hand out */
    DEFAULT_SMEM = 48 << 10,   /* dynamic shared memory a kernel may use unasked */
};

/* A kernel by name (rtc_function): every module's, listed at load (index_module). */
typedef struct {
    char *name; /* NULL: empty slot */
    CUfunction f;
} NamedFunction;

/* The largest dynamic shared memory granted to a function so far. */
typedef struct {
    CUfunction f;
    int64_t smem;
} SmemGrant;

struct rt_ctx {
    const rt_program *p;
    RtComm *comm;
    RtNccl *nccl;
    /* the device */
    int ordinal;
    char device_name[128];
    int cc_major, cc_minor;
    CUdevice dev;
    CUcontext cu; /* the primary context, retained when non-NULL */
    /* memory */
    CUdeviceptr dspace[RT_NSPACES]; /* 0 for an empty space */
    char *base[RT_NSPACES];         /* the same as the step's char pointers */
    char *mirror[RT_NSPACES];
    size_t mapped[RT_NSPACES];
    CUdeviceptr schedule;           /* rtc_schedule */
    /* code */
    CUmodule *modules;
    int nmodules;
    CUfunction *generated;          /* program->kernels[i] */
    NamedFunction *named;
    int nnamed, capnamed;           /* capnamed: a power of two */
    SmemGrant *grants;
    int ngrants, capgrants;
    /* streams and events */
    int nstreams, nevents;
    CUstream *streams;
    CUevent *events;
    int64_t *issued;                /* per event: the step that last recorded it */
    CUevent fork, *join;            /* the capture's fork and per-stream join events */
    CUdeviceptr *scratch;           /* per stream: GEMM_WORKSPACE bytes, then the scratch */
    int64_t scratch_bytes;          /* program->scratch_bytes, rounded up to DEVICE_ALIGN */
    cublasLtHandle_t lt;
    /* the step */
    int eager;                      /* KILN_NO_GRAPH */
    int broken;                     /* a step met an asynchronous CUDA error: the context is unusable */
    CUgraphExec graph;
    int64_t graph_bytes; /* what the captured step sends (rt_comm_bytes): a replay runs no launcher to count it */
    void (*at_free[8])(rt_ctx *); /* rtc_at_free's teardown functions */
    int step_failed;              /* some step failed: NCCL is torn down with abort */
    int nat_free;
    int64_t step;
    int cur;                        /* the current launch's stream */
    const char *name;               /* and its name */
    pthread_mutex_t err_mu;
    int failed;
    char err[512];
    /* activation offload (see the top) */
    int *recorder;                  /* per event: the stream of its last rt_record */
    int drop_copy_wait, dropped;
    int64_t act_hw;                 /* -1: not measured */
    const char *trace_path;         /* --trace: the context's (rt_options) */
    RtcTrace *trace;                /* made once the rank is known (build) */
};

/* ---- errors ---- */

const char *rtc_error_string(CUresult r) {
    static _Thread_local char buf[256];
    const char *name = NULL, *text = NULL;
    if (cuGetErrorName(r, &name) != CUDA_SUCCESS) name = NULL;
    if (cuGetErrorString(r, &text) != CUDA_SUCCESS) text = NULL;
    if (name && text) snprintf(buf, sizeof buf, "%s (%s)", text, name);
    else snprintf(buf, sizeof buf, "CUDA error %d", (int)r);
    return buf;
}

static const char *lt_error_string(cublasStatus_t s) {
    static _Thread_local char buf[128];
    const char *text = cublasLtGetStatusString(s);
    if (text) snprintf(buf, sizeof buf, "%s", text);
    else snprintf(buf, sizeof buf, "cuBLAS status %d", (int)s);
    return buf;
}

void rt_fail(rt_ctx *c, const char *fmt, ...) {
    va_list ap;
    if (pthread_mutex_lock(&c->err_mu)) abort();
    if (!c->failed) {
        va_start(ap, fmt);
        vsnprintf(c->err, sizeof c->err, fmt, ap);
        va_end(ap);
        c->failed = 1;
    }
    if (pthread_mutex_unlock(&c->err_mu)) abort();
}

/* The step's first failure into err (cleared); 0 or -1. */
static int take_failure(rt_ctx *c, char *err, int errlen) {
    if (pthread_mutex_lock(&c->err_mu)) abort();
    int failed = c->failed;
    if (failed && err && errlen > 0) snprintf(err, (size_t)errlen, "%s", c->err);
    c->failed = 0;
    if (pthread_mutex_unlock(&c->err_mu)) abort();
    return failed ? -1 : 0;
}

static int has_failed(rt_ctx *c) {
    if (pthread_mutex_lock(&c->err_mu)) abort();
    int failed = c->failed;
    if (pthread_mutex_unlock(&c->err_mu)) abort();
    return failed;
}

/* rt_new's checks: 1, or 0 after one line on stderr. */
static int cu_ok(CUresult r, const char *what) {
    if (r == CUDA_SUCCESS) return 1;
    fprintf(stderr, "kiln runtime: %s: %s\n", what, rtc_error_string(r));
    return 0;
}

/* A step's own driver calls: 1, or 0 after rt_fail. */
static int step_ok(rt_ctx *c, CUresult r, const char *what) {
    if (r == CUDA_SUCCESS) return 1;
    rt_fail(c, "%s: %s", what, rtc_error_string(r));
    return 0;
}

/* rt_free: the first failure of the teardown, in one line. */
static void free_ok(int *reported, CUresult r, const char *what) {
    if (r == CUDA_SUCCESS || *reported) return;
    fprintf(stderr, "kiln runtime: freeing the CUDA context: %s: %s\n", what, rtc_error_string(r));
    *reported = 1;
}

/* ---- what the launchers see (rt_cuda.h) ---- */

CUstream rtc_stream(rt_ctx *c) { return c->streams[c->cur]; }
const char *rtc_launch_name(rt_ctx *c) { return c->name ? c->name : "kiln runtime"; }
void *rtc_cublaslt(rt_ctx *c) { return c->lt; }
CUdeviceptr rtc_schedule(rt_ctx *c) { return c->schedule; }
CUcontext rtc_context(rt_ctx *c) { return c->cu; }
RtNccl *rtc_nccl_of(rt_ctx *c) { return c->nccl; }
RtComm *rt_comm_of(rt_ctx *c) { return c->comm; }

CUdeviceptr rtc_gemm_workspace(rt_ctx *c, size_t *bytes) {
    *bytes = GEMM_WORKSPACE;
    return c->scratch[c->cur];
}

CUdeviceptr rtc_scratch(rt_ctx *c, int64_t bytes) {
    if (bytes < 0 || bytes > c->p->scratch_bytes) {
        rt_fail(c, "%s: needs %lld bytes of scratch, but the program gives each stream %lld (scratch_bytes)", rtc_launch_name(c),
                (long long)bytes, (long long)c->p->scratch_bytes);
        return 0;
    }
    return c->scratch[c->cur] + GEMM_WORKSPACE;
}

/* ---- kernels by name ---- */

static uint64_t hash_name(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static NamedFunction *named_slot(NamedFunction *t, int cap, const char *name) {
    int i = (int)(hash_name(name) & (uint64_t)(cap - 1));
    while (t[i].name && strcmp(t[i].name, name)) i = (i + 1) & (cap - 1);
    return &t[i];
}

/* Remember name -> f; 0, or -1 when out of memory. */
static int named_put(rt_ctx *c, const char *name, CUfunction f) {
    if (2 * (c->nnamed + 1) > c->capnamed) {
        int cap = c->capnamed ? 2 * c->capnamed : 64;
        NamedFunction *t = calloc((size_t)cap, sizeof *t);
        if (!t) return -1;
        for (int i = 0; i < c->capnamed; i++)
            if (c->named[i].name) *named_slot(t, cap, c->named[i].name) = c->named[i];
        free(c->named);
        c->named = t;
        c->capnamed = cap;
    }
    NamedFunction *s = named_slot(c->named, c->capnamed, name);
    if (!(s->name = strdup(name))) return -1;
    s->f = f;
    c->nnamed++;
    return 0;
}

/* The kernel `name` of the program's modules: CUDA_SUCCESS, or
 * CUDA_ERROR_NOT_FOUND.  A table lookup only: load_code put every module's
 * kernels into the name table (index_module), so no name is ever tried on a
 * module that lacks it.  (Probing each module with cuModuleGetFunction made
 * the driver return CUDA_ERROR_NOT_FOUND for every other module, an API
 * error that compute-sanitizer memcheck lists: hundreds per run on the
 * H200, 2026-12-04.) */
static CUresult find_function(rt_ctx *c, const char *name, CUfunction *f) {
    if (c->capnamed) {
        NamedFunction *s = named_slot(c->named, c->capnamed, name);
        if (s->name) {
            *f = s->f;
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_NOT_FOUND;
}

/* Module `mod`'s kernels into the name table, through the driver's own
 * list (cuModuleGetFunctionCount, cuModuleEnumerateFunctions, cuFuncGetName:
 * CUDA 12.4+); a name an earlier module has keeps the earlier one, as the
 * probe in module order did.  1, or 0 after one line. */
static int index_module(rt_ctx *c, CUmodule mod, const char *cubin) {
    unsigned n = 0;
    CUresult r = cuModuleGetFunctionCount(&n, mod);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "kiln runtime: cuModuleGetFunctionCount(cubin %s): %s\n", cubin, rtc_error_string(r));
        return 0;
    }
    if (n == 0) return 1;
    CUfunction *fs = calloc(n, sizeof *fs);
    if (!fs) {
        fprintf(stderr, "kiln runtime: out of memory listing the kernels of cubin %s\n", cubin);
        return 0;
    }
    r = cuModuleEnumerateFunctions(fs, n, mod);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "kiln runtime: cuModuleEnumerateFunctions(cubin %s, %u): %s\n", cubin, n, rtc_error_string(r));
        free(fs);
        return 0;
    }
    for (unsigned i = 0; i < n; i++) {
        const char *name = NULL;
        CUfunction seen;
        r = cuFuncGetName(&name, fs[i]);
        if (r != CUDA_SUCCESS || !name || !*name) {
            fprintf(stderr, "kiln runtime: cuFuncGetName(kernel %u of cubin %s): %s\n", i, cubin,
                    r != CUDA_SUCCESS ? rtc_error_string(r) : "no name");
            free(fs);
            return 0;
        }
        if (find_function(c, name, &seen) == CUDA_SUCCESS) continue; /* an earlier module's */
        if (named_put(c, name, fs[i])) {
            fprintf(stderr, "kiln runtime: out of memory indexing kernel %s\n", name);
            free(fs);
            return 0;
        }
    }
    free(fs);
    return 1;
}

CUfunction rtc_function(rt_ctx *c, const char *name) {
    CUfunction f = NULL;
    if (find_function(c, name, &f) != CUDA_SUCCESS) {
        rt_fail(c, "%s: no kernel %s in the program's %d cubins", rtc_launch_name(c), name, c->nmodules);
        return NULL;
    }
    return f;
}

CUfunction rtc_generated(rt_ctx *c, int64_t i) {
    if (i >= 0 && i < c->p->nkernels) return c->generated[i];
    rt_fail(c, "%s: generated kernel %lld out of range (program has %d)", rtc_launch_name(c), (long long)i, c->p->nkernels);
    return NULL;
}

/* f's grant, added (smem 0) when it has none; NULL after rt_fail. */
static SmemGrant *grant_of(rt_ctx *c, CUfunction f) {
    for (int i = 0; i < c->ngrants; i++)
        if (c->grants[i].f == f) return &c->grants[i];
    if (c->ngrants == c->capgrants) {
        int cap = c->capgrants ? 2 * c->capgrants : 16;
        SmemGrant *g = realloc(c->grants, sizeof *g * (size_t)cap);
        if (!g) {
            rt_fail(c, "%s: out of memory", rtc_launch_name(c));
            return NULL;
        }
        c->grants = g;
        c->capgrants = cap;
    }
    c->grants[c->ngrants] = (SmemGrant){f, 0};
    return &c->grants[c->ngrants++];
}

/* Raise f's dynamic shared memory limit to smem unless already granted at
 * least that (never lowered: a captured launch keeps needing its size). */
static int grant_smem(rt_ctx *c, CUfunction f, int64_t smem) {
    SmemGrant *g = grant_of(c, f);
    if (!g) return 0;
    if (g->smem >= smem) return 1;
    CUresult r = cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)smem);
    if (r != CUDA_SUCCESS) {
        rt_fail(c, "%s: cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES, %lld): %s", rtc_launch_name(c), (long long)smem, rtc_error_string(r));
        return 0;
    }
    g->smem = smem;
    return 1;
}

void rtc_launch(rt_ctx *c, CUfunction f, int64_t gx, int64_t gy, int block, int64_t smem, void **params) {
    if (gx == 0 || gy == 0) return;
    if (!f || gx < 0 || gx > INT32_MAX || gy < 0 || gy > 65535 || block < 1 || block > 1024 || smem < 0 || smem > INT32_MAX) {
        rt_fail(c, "%s: bad launch: kernel %p, grid %lld x %lld, block %d, %lld bytes of shared memory", rtc_launch_name(c), (void *)f,
                (long long)gx, (long long)gy, block, (long long)smem);
        return;
    }
    if (smem > DEFAULT_SMEM && !grant_smem(c, f, smem)) return;
    CUresult r = cuLaunchKernel(f, (unsigned)gx, (unsigned)gy, 1, (unsigned)block, 1, 1, (unsigned)smem, rtc_stream(c), params, NULL);
    if (r != CUDA_SUCCESS)
        rt_fail(c, "%s: cuLaunchKernel(grid %lld x %lld, block %d, smem %lld): %s", rtc_launch_name(c), (long long)gx, (long long)gy,
                block, (long long)smem, rtc_error_string(r));
}

/* ---- what the step function calls ---- */

static int check_stream(rt_ctx *c, int stream, const char *who) { return rt_in_range(c, stream, c->nstreams, "stream", who); }
static int check_event(rt_ctx *c, int event, const char *who) { return rt_in_range(c, event, c->nevents, "event", who); }

void rt_launch(rt_ctx *c, int stream, rt_kernel k, const int64_t *args, int nargs, const char *name) {
    if (!rt_launch_ok(c, stream, c->nstreams, k, nargs, name)) return;
    c->cur = stream;
    c->name = name;
    if (k != rtk_send && k != rtk_recv) rtc_p2p_flush(c, c->streams[stream]); /* comm_nccl.c: noted sends go first */
    if (c->trace && !step_ok(c, rtc_trace_launch_begin(c->trace, stream, c->streams[stream], name), "--trace: cuEventRecord"))
        return;
    k(c, args);
    if (c->trace) step_ok(c, rtc_trace_launch_end(c->trace, c->streams[stream]), "--trace: cuEventRecord");
}

void rt_record(rt_ctx *c, int stream, int event) {
    if (!check_stream(c, stream, "rt_record") || !check_event(c, event, "rt_record")) return;
    if (c->issued[event] == c->step) {
        rt_fail(c, "schedule error: event %d recorded twice in one step (stream %d)", event, stream);
        return;
    }
    c->issued[event] = c->step;
    c->recorder[event] = stream;
    rtc_p2p_flush(c, c->streams[stream]); /* what another stream waits for includes the noted sends' reads */
    CUresult r = cuEventRecord(c->events[event], c->streams[stream]);
    if (r != CUDA_SUCCESS) rt_fail(c, "rt_record: cuEventRecord(event %d, stream %d): %s", event, stream, rtc_error_string(r));
}

void rt_wait(rt_ctx *c, int stream, int event) {
    if (!check_stream(c, stream, "rt_wait") || !check_event(c, event, "rt_wait")) return;
    if (c->issued[event] != c->step) {
        rt_fail(c, "schedule error: stream %d waits for event %d, which was not recorded before in this step", stream, event);
        return;
    }
    if (c->dropped < c->drop_copy_wait && stream == 0 && c->recorder[event] == 3) {
        c->dropped++; /* KILN_TEST_DROP_COPY_WAIT: the planted bug */
        return;
    }
    CUresult r = cuStreamWaitEvent(c->streams[stream], c->events[event], 0);
    if (r != CUDA_SUCCESS) rt_fail(c, "rt_wait: cuStreamWaitEvent(stream %d, event %d): %s", stream, event, rtc_error_string(r));
}

/* Only host code calls it on this device (rt_init_params' generator). */
void rt_parallel_for(rt_ctx *c, int64_t n, void (*fn)(void *data, int64_t i0, int64_t i1), void *data) {
    if (n > 0) fn(data, 0, n);
}

/* ---- the step ---- */

/* bytes host -> device on stream 0, waited for: the copy is complete and
 * ordered before anything any stream does next.  CUDA_SUCCESS or the error. */
static CUresult copy_in(rt_ctx *c, CUdeviceptr dst, const void *src, int64_t bytes) {
    CUresult r = cuMemcpyHtoDAsync(dst, src, (size_t)bytes, c->streams[0]);
    return r != CUDA_SUCCESS ? r : cuStreamSynchronize(c->streams[0]);
}

static CUresult copy_out(rt_ctx *c, void *dst, CUdeviceptr src, int64_t bytes) {
    CUresult r = cuMemcpyDtoHAsync(dst, src, (size_t)bytes, c->streams[0]);
    return r != CUDA_SUCCESS ? r : cuStreamSynchronize(c->streams[0]);
}

/* The other streams join stream 0's capture (fork) and rejoin it (join). */
static int fork_streams(rt_ctx *c) {
    if (c->nstreams == 1) return 1;
    if (!step_ok(c, cuEventRecord(c->fork, c->streams[0]), "capture: cuEventRecord(fork, stream 0)")) return 0;
    for (int i = 1; i < c->nstreams; i++)
        if (!step_ok(c, cuStreamWaitEvent(c->streams[i], c->fork, 0), "capture: cuStreamWaitEvent(fork)")) return 0;
    return 1;
}

static int join_streams(rt_ctx *c) {
    for (int i = 1; i < c->nstreams; i++) {
        if (!step_ok(c, cuEventRecord(c->join[i], c->streams[i]), "capture: cuEventRecord(join)")) return 0;
        if (!step_ok(c, cuStreamWaitEvent(c->streams[0], c->join[i], 0), "capture: cuStreamWaitEvent(join, stream 0)")) return 0;
    }
    return 1;
}

/* The second step: capture the step function into c->graph and launch it.
 * A failure leaves no graph (the next step captures again). */
static void capture_step(rt_ctx *c) {
    CUgraph g = NULL;
    if (!step_ok(c, cuStreamBeginCapture(c->streams[0], CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "cuStreamBeginCapture")) return;
    if (fork_streams(c)) {
        int64_t sent = rt_comm_bytes(c);
        c->p->step(c, c->base);
        rtc_p2p_flush(c, NULL);
        c->graph_bytes = rt_comm_bytes(c) - sent;
        c->name = "kiln runtime";
        join_streams(c);
    }
    CUresult r = cuStreamEndCapture(c->streams[0], &g); /* always: the stream must leave capture mode */
    step_ok(c, r, "capturing the step into a CUDA graph: cuStreamEndCapture");
    if (r == CUDA_SUCCESS && !has_failed(c))
        step_ok(c, cuGraphInstantiate(&c->graph, g, 0), "cuGraphInstantiate");
    if (g) step_ok(c, cuGraphDestroy(g), "cuGraphDestroy");
    if (c->graph && has_failed(c)) {
        step_ok(c, cuGraphExecDestroy(c->graph), "cuGraphExecDestroy");
        c->graph = NULL;
    }
    if (c->graph) step_ok(c, cuGraphLaunch(c->graph, c->streams[0]), "cuGraphLaunch");
}

/* Wait for every stream; an asynchronous error of the step fails it. */
static void finish_streams(rt_ctx *c) {
    for (int i = 0; i < c->nstreams; i++) {
        CUresult r = cuStreamSynchronize(c->streams[i]);
        if (r == CUDA_SUCCESS) continue;
        c->broken = 1;
        rt_fail(c, "the step's GPU work failed (stream %d): %s (KILN_NO_GRAPH=1 CUDA_LAUNCH_BLOCKING=1 finds the launch)", i,
                rtc_error_string(r));
    }
}

static void measure_act(rt_ctx *c);

int rt_step(rt_ctx *c, char *err, int errlen) {
    c->step++;
    c->dropped = 0;
    c->cur = 0;
    c->name = "kiln runtime";
    int ok = step_ok(c, cuCtxSetCurrent(c->cu), "cuCtxSetCurrent");
    if (ok && c->p->schedule) ok = step_ok(c, copy_in(c, c->schedule, c->p->schedule, sizeof(rt_schedule)), "copying the lr schedule to the GPU");
    if (ok && c->trace) ok = step_ok(c, rtc_trace_step_begin(c->trace, c->streams[0], c->step), "--trace: cuEventRecord");
    if (ok && (c->eager || c->step == 1)) { /* step 1 warms up outside any capture */
        c->p->step(c, c->base);
        rtc_p2p_flush(c, NULL);
    } else if (ok && !c->graph) {
        capture_step(c);
    } else if (ok && step_ok(c, cuGraphLaunch(c->graph, c->streams[0]), "cuGraphLaunch")) {
        rt_comm_count(c->comm, c->graph_bytes);
    }
    finish_streams(c);
    if (c->trace && !has_failed(c)) step_ok(c, rtc_trace_step_end(c->trace), "--trace: cuEventElapsedTime");
    if (c->act_hw >= 0 && !has_failed(c)) measure_act(c);
    char sends[600];
    if (rt_comm_finish_sends(c->comm, sends, sizeof sends)) rt_fail(c, "%s", sends);
    int rc = take_failure(c, err, errlen);
    if (rc != 0) c->step_failed = 1;
    return rc;
}

void rtc_at_free(rt_ctx *c, void (*fn)(rt_ctx *)) {
    for (int i = 0; i < c->nat_free; i++)
        if (c->at_free[i] == fn) return;
    if (c->nat_free == 8) {
        rt_fail(c, "rtc_at_free: more than 8 teardown functions");
        return;
    }
    c->at_free[c->nat_free++] = fn;
}

/* ---- activation offload ---- */

/* args: dst (host), src (device), bytes */
void rtk_offload(rt_ctx *c, const int64_t *a) {
    if (a[2] <= 0) return;
    CUresult r = cuMemcpyDtoHAsync(rt_arg_ptr(a[0]), (CUdeviceptr)(uintptr_t)a[1], (size_t)a[2], rtc_stream(c));
    if (r != CUDA_SUCCESS) rt_fail(c, "%s: cuMemcpyDtoHAsync(%lld bytes): %s", rtc_launch_name(c), (long long)a[2], rtc_error_string(r));
}

/* args: dst (device), src (host), bytes */
void rtk_reload(rt_ctx *c, const int64_t *a) {
    if (a[2] <= 0) return;
    CUresult r = cuMemcpyHtoDAsync((CUdeviceptr)(uintptr_t)a[0], rt_arg_ptr(a[1]), (size_t)a[2], rtc_stream(c));
    if (r != CUDA_SUCCESS) rt_fail(c, "%s: cuMemcpyHtoDAsync(%lld bytes): %s", rtc_launch_name(c), (long long)a[2], rtc_error_string(r));
}

int64_t rt_act_high_water(rt_ctx *c) { return c->act_hw; }

/* The act space above the mark so far into the mirror; the highest byte
 * that is no longer 0xff raises the mark. */
static void measure_act(rt_ctx *c) {
    int64_t top = c->p->space_bytes[RT_SPACE_ACT], lo = c->act_hw;
    if (top <= lo) return;
    const unsigned char *m = (const unsigned char *)c->mirror[RT_SPACE_ACT];
    if (!step_ok(c, copy_out(c, c->mirror[RT_SPACE_ACT] + lo, c->dspace[RT_SPACE_ACT] + (CUdeviceptr)lo, top - lo), "measuring the act space"))
        return;
    while (top > lo && m[top - 1] == 0xff) top--;
    c->act_hw = top;
}

/* ---- host views ---- */

char *rt_space(rt_ctx *c, int space) { return space >= 0 && space < RT_NSPACES ? c->mirror[space] : NULL; }

/* NULL for a param without storage (space -1). */
void *rt_tensor_ptr(rt_ctx *c, const rt_tensor *t) {
    return t->space >= 0 && t->space < RT_NSPACES ? c->mirror[t->space] + t->offset : NULL;
}

/* The range [offset, offset+bytes) of a space: 1, or 0 with a message. */
static int check_range(rt_ctx *c, const char *who, int space, int64_t offset, int64_t bytes, char *err, int errlen) {
    if (space < 0 || space >= RT_NSPACES) {
        snprintf(err, (size_t)errlen, "%s: no space %d", who, space);
        return 0;
    }
    if (offset >= 0 && bytes >= 0 && offset <= c->p->space_bytes[space] - bytes) return 1;
    snprintf(err, (size_t)errlen, "%s: bytes [%lld, %lld) lie outside the %s space (%lld bytes)", who, (long long)offset,
             (long long)offset + (long long)bytes, rt_space_name[space], (long long)c->p->space_bytes[space]);
    return 0;
}

static int host_copy(rt_ctx *c, int pull, int space, int64_t offset, int64_t bytes, char *err, int errlen) {
    const char *who = pull ? "rt_pull" : "rt_push";
    if (!check_range(c, who, space, offset, bytes, err, errlen)) return -1;
    if (bytes == 0 || space == RT_SPACE_HOST) return 0; /* the host space is its own mirror */
    CUresult r = cuCtxSetCurrent(c->cu);
    if (r == CUDA_SUCCESS)
        r = pull ? copy_out(c, c->mirror[space] + offset, c->dspace[space] + (CUdeviceptr)offset, bytes)
                 : copy_in(c, c->dspace[space] + (CUdeviceptr)offset, c->mirror[space] + offset, bytes);
    if (r == CUDA_SUCCESS) return 0;
    snprintf(err, (size_t)errlen, "%s: %lld bytes of the %s space %s the GPU: %s", who, (long long)bytes, rt_space_name[space],
             pull ? "from" : "to", rtc_error_string(r));
    return -1;
}

int rt_pull(rt_ctx *c, int space, int64_t offset, int64_t bytes, char *err, int errlen) {
    return host_copy(c, 1, space, offset, bytes, err, errlen);
}

int rt_push(rt_ctx *c, int space, int64_t offset, int64_t bytes, char *err, int errlen) {
    return host_copy(c, 0, space, offset, bytes, err, errlen);
}

int rt_pull_tensor(rt_ctx *c, const rt_tensor *t, char *err, int errlen) {
    return rt_is_stored(t) ? rt_pull(c, t->space, t->offset, rt_tensor_bytes(t), err, errlen) : 0;
}

int rt_push_tensor(rt_ctx *c, const rt_tensor *t, char *err, int errlen) {
    return rt_is_stored(t) ? rt_push(c, t->space, t->offset, rt_tensor_bytes(t), err, errlen) : 0;
}

/* The CPU's generator into the mirror, then every stored param and every
 * state to the GPU.  A failed copy is a broken device: one line, exit 1
 * (rt_init_params has no error result, as on the CPU). */
void rt_init_params(rt_ctx *c, uint64_t seed) {
    const rt_program *p = c->p;
    char err[512];
    rt_init_host(c, p, seed);
    for (int i = 0; i < p->nparams; i++)
        if (rt_push_tensor(c, &p->params[i], err, sizeof err)) goto fail;
    for (int i = 0; i < p->nstates; i++)
        if (rt_push_tensor(c, &p->states[i], err, sizeof err)) goto fail;
    return;
fail:
    fprintf(stderr, "kiln runtime: initialising the parameters: %s\n", err);
    exit(1);
}

/* ---- creating ---- */

/* The CUDA part of the table: modules and kernel names present. */
static int check_cuda_tables(const rt_program *p) {
    if (p->ncubins < 0 || (p->ncubins > 0 && !p->cubins) || p->nkernels < 0 || (p->nkernels > 0 && !p->kernels) || p->scratch_bytes < 0) {
        fprintf(stderr, "kiln runtime: malformed CUDA program table (cubins, kernels or scratch_bytes)\n");
        return 0;
    }
    for (int i = 0; i < p->ncubins; i++)
        if (!p->cubins[i].data || p->cubins[i].size <= 0) {
            fprintf(stderr, "kiln runtime: cubin %d (%s) is empty\n", i, p->cubins[i].name ? p->cubins[i].name : "?");
            return 0;
        }
    for (int i = 0; i < p->nkernels; i++)
        if (!p->kernels[i]) {
            fprintf(stderr, "kiln runtime: generated kernel %d has no name\n", i);
            return 0;
        }
    return 1;
}

/* This process's local rank under a launcher (0 in a plain process):
 * 1, or 0 after one line for a malformed value. */
static int local_rank(int *rank) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"};
    *rank = 0;
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (!v) continue;
        char *end;
        long r = strtol(v, &end, 10);
        if (!*v || *end || r < 0 || r > INT32_MAX) {
            fprintf(stderr, "kiln runtime: %s=\"%s\": not a local rank\n", vars[i], v);
            return 0;
        }
        *rank = (int)r;
        return 1;
    }
    return 1;
}

/* cuInit, the device of this local rank, its primary context (current). */
static int open_device(rt_ctx *c) {
    int count = 0, local;
    CUresult r = cuInit(0);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "kiln: no CUDA device: cuInit: %s\n", rtc_error_string(r));
        return 0;
    }
    if (!cu_ok(cuDeviceGetCount(&count), "cuDeviceGetCount")) return 0;
    if (count < 1) {
        fprintf(stderr, "kiln: no CUDA device: the driver sees none\n");
        return 0;
    }
    if (!local_rank(&local)) return 0;
    c->ordinal = local % count;
    if (!cu_ok(cuDeviceGet(&c->dev, c->ordinal), "cuDeviceGet") ||
        !cu_ok(cuDeviceGetName(c->device_name, (int)sizeof c->device_name, c->dev), "cuDeviceGetName") ||
        !cu_ok(cuDeviceGetAttribute(&c->cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, c->dev), "cuDeviceGetAttribute") ||
        !cu_ok(cuDeviceGetAttribute(&c->cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, c->dev), "cuDeviceGetAttribute"))
        return 0;
    c->device_name[sizeof c->device_name - 1] = 0;
    CUcontext cu = NULL;
    if (!cu_ok(cuDevicePrimaryCtxRetain(&cu, c->dev), "cuDevicePrimaryCtxRetain")) return 0;
    c->cu = cu;
    return cu_ok(cuCtxSetCurrent(cu), "cuCtxSetCurrent");
}

/* cuMemAlloc with a message that says what for and what the GPU has. */
static int device_alloc(rt_ctx *c, CUdeviceptr *d, int64_t bytes, const char *what) {
    CUresult r = cuMemAlloc(d, (size_t)bytes);
    if (r == CUDA_SUCCESS) return 1;
    *d = 0;
    size_t free_b = 0, total_b = 0;
    char have[96] = "";
    if (cuMemGetInfo(&free_b, &total_b) == CUDA_SUCCESS)
        snprintf(have, sizeof have, ", %.2f of %.2f GiB free", (double)free_b / (1 << 30), (double)total_b / (1 << 30));
    fprintf(stderr, "kiln runtime: cannot allocate %lld bytes for %s on GPU %d (%s%s): %s\n", (long long)bytes, what, c->ordinal,
            c->device_name, have, rtc_error_string(r));
    return 0;
}

/* Per space: the device buffer (zeroed) and the host mirror; the schedule's copy. */
static int alloc_spaces(rt_ctx *c) {
    char what[64];
    c->act_hw = -1;
    const char *peak = getenv("KILN_MEASURE_PEAK");
    if (peak && atoi(peak) > 0) c->act_hw = 0;
    for (int i = 0; i < RT_NSPACES; i++) {
        int64_t n = c->p->space_bytes[i];
        if (i == RT_SPACE_HOST) { /* pinned host memory, its own mirror */
            void *h = NULL;
            if (n > 0 && !cu_ok(cuMemAllocHost(&h, (size_t)n), "cuMemAllocHost (the host space)")) return 0;
            if (h) memset(h, 0, (size_t)n);
            c->base[i] = c->mirror[i] = h;
            continue;
        }
        snprintf(what, sizeof what, "the %s space", rt_space_name[i]);
        unsigned char fill = i == RT_SPACE_ACT && c->act_hw >= 0 ? 0xff : 0;
        if (n > 0 && (!device_alloc(c, &c->dspace[i], n, what) || !cu_ok(cuMemsetD8(c->dspace[i], fill, (size_t)n), "cuMemsetD8")))
            return 0;
        c->base[i] = (char *)(uintptr_t)c->dspace[i];
        if (!(c->mirror[i] = rt_map_host(n, rt_space_name[i], &c->mapped[i]))) return 0;
    }
    return device_alloc(c, &c->schedule, DEVICE_ALIGN, "the lr schedule") &&
           cu_ok(cuMemsetD8(c->schedule, 0, DEVICE_ALIGN), "cuMemsetD8");
}

static const char *cubin_name(const rt_program *p, int i) { return p->cubins[i].name ? p->cubins[i].name : "?"; }

/* Every cubin, then every generated kernel by name. */
static int load_code(rt_ctx *c) {
    const rt_program *p = c->p;
    if (!(c->modules = calloc((size_t)p->ncubins + 1, sizeof *c->modules)) ||
        !(c->generated = calloc((size_t)p->nkernels + 1, sizeof *c->generated))) {
        fprintf(stderr, "kiln runtime: out of memory\n");
        return 0;
    }
    for (int i = 0; i < p->ncubins; i++) {
        CUresult r = cuModuleLoadData(&c->modules[i], p->cubins[i].data);
        if (r != CUDA_SUCCESS) {
            fprintf(stderr, "kiln runtime: cannot load cubin %s (%lld bytes, for %s) on GPU %d (%s, sm_%d%d): %s\n", cubin_name(p, i),
                    (long long)p->cubins[i].size, p->arch ? p->arch : "?", c->ordinal, c->device_name, c->cc_major, c->cc_minor,
                    rtc_error_string(r));
            return 0;
        }
        c->nmodules++;
        if (!index_module(c, c->modules[i], cubin_name(p, i))) return 0;
    }
    for (int i = 0; i < p->nkernels; i++)
        if (find_function(c, p->kernels[i], &c->generated[i]) != CUDA_SUCCESS) {
            fprintf(stderr, "kiln runtime: generated kernel %s is in none of the program's %d cubins\n", p->kernels[i], p->ncubins);
            return 0;
        }
    return 1;
}

/* Streams (non-blocking), events (no timing), the capture's fork and join
 * events, per-stream workspace + scratch, cuBLASLt. */
static int make_streams(rt_ctx *c) {
    int n = c->nstreams;
    if (!(c->streams = calloc((size_t)n, sizeof *c->streams)) || !(c->join = calloc((size_t)n, sizeof *c->join)) ||
        !(c->scratch = calloc((size_t)n, sizeof *c->scratch)) || !(c->events = calloc((size_t)c->nevents + 1, sizeof *c->events)) ||
        !(c->issued = calloc((size_t)c->nevents + 1, sizeof *c->issued)) ||
        !(c->recorder = calloc((size_t)c->nevents + 1, sizeof *c->recorder))) {
        fprintf(stderr, "kiln runtime: out of memory\n");
        return 0;
    }
    c->scratch_bytes = (c->p->scratch_bytes + DEVICE_ALIGN - 1) / DEVICE_ALIGN * DEVICE_ALIGN;
    for (int i = 0; i < n; i++) {
        if (!cu_ok(cuStreamCreate(&c->streams[i], CU_STREAM_NON_BLOCKING), "cuStreamCreate") ||
            (i > 0 && !cu_ok(cuEventCreate(&c->join[i], CU_EVENT_DISABLE_TIMING), "cuEventCreate")) ||
            !device_alloc(c, &c->scratch[i], GEMM_WORKSPACE + c->scratch_bytes, "a stream's GEMM workspace and scratch"))
            return 0;
    }
    for (int i = 0; i < c->nevents; i++)
        if (!cu_ok(cuEventCreate(&c->events[i], CU_EVENT_DISABLE_TIMING), "cuEventCreate")) return 0;
    if (!cu_ok(cuEventCreate(&c->fork, CU_EVENT_DISABLE_TIMING), "cuEventCreate")) return 0;
    cublasStatus_t s = cublasLtCreate(&c->lt);
    if (s != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "kiln runtime: cublasLtCreate: %s\n", lt_error_string(s));
        c->lt = NULL;
        return 0;
    }
    return 1;
}

static int use_graph(void) {
    const char *v = getenv("KILN_NO_GRAPH");
    return !v || !*v || strcmp(v, "0") == 0;
}

static int build(rt_ctx *c) {
    if (!open_device(c) || !(c->comm = rt_comm_new(c->p)) || !rt_check_buckets(c->p) || !alloc_spaces(c) || !load_code(c) ||
        !make_streams(c))
        return 0;
    /* the memsets ran on the legacy stream, which the non-blocking streams do not wait for */
    if (!cu_ok(cuCtxSynchronize(), "cuCtxSynchronize")) return 0;
    if (c->trace_path) {
        char err[300];
        if (!(c->trace = rtc_trace_new(c->trace_path, rt_world_rank(c), c->nstreams, err, sizeof err))) {
            fprintf(stderr, "kiln runtime: --trace: %s\n", err);
            return 0;
        }
    }
    return rt_world_size(c) == 1 || (c->nccl = rtc_nccl_new(c, c->p)) != NULL;
}

rt_ctx *rt_new(const rt_program *p, const rt_options *o) {
    static const rt_options none;
    if (!o) o = &none;
    if (!rt_check_program(p, RT_DEV_CUDA) || !check_cuda_tables(p)) return NULL;
    rt_ctx *c = calloc(1, sizeof *c);
    if (!c || pthread_mutex_init(&c->err_mu, NULL)) {
        fprintf(stderr, "kiln runtime: cannot create a context\n");
        free(c);
        return NULL;
    }
    c->p = p;
    c->nstreams = p->nstreams > 0 ? p->nstreams : 1;
    c->nevents = p->nevents;
    c->trace_path = o->trace_path;
    c->eager = !use_graph() || o->trace_path; /* a traced step runs eagerly: events around every launch */
    c->act_hw = -1;
    const char *drop = getenv("KILN_TEST_DROP_COPY_WAIT");
    c->drop_copy_wait = drop ? atoi(drop) : 0;
    c->name = "kiln runtime";
    if (!build(c)) {
        rt_free(c);
        return NULL;
    }
    return c;
}

/* ---- freeing (also a half-built context) ---- */

static void free_streams(rt_ctx *c, int *reported) {
    if (c->lt) {
        cublasStatus_t s = cublasLtDestroy(c->lt);
        if (s != CUBLAS_STATUS_SUCCESS && !*reported) {
            fprintf(stderr, "kiln runtime: freeing the CUDA context: cublasLtDestroy: %s\n", lt_error_string(s));
            *reported = 1;
        }
    }
    for (int i = 0; c->streams && i < c->nstreams; i++) {
        if (c->scratch[i]) free_ok(reported, cuMemFree(c->scratch[i]), "cuMemFree");
        if (c->join[i]) free_ok(reported, cuEventDestroy(c->join[i]), "cuEventDestroy");
        if (c->streams[i]) free_ok(reported, cuStreamDestroy(c->streams[i]), "cuStreamDestroy");
    }
    for (int i = 0; c->events && i < c->nevents; i++)
        if (c->events[i]) free_ok(reported, cuEventDestroy(c->events[i]), "cuEventDestroy");
    if (c->fork) free_ok(reported, cuEventDestroy(c->fork), "cuEventDestroy");
    free(c->streams);
    free(c->join);
    free(c->scratch);
    free(c->events);
    free(c->issued);
    free(c->recorder);
}

static void free_code(rt_ctx *c, int *reported) {
    for (int i = 0; i < c->nmodules; i++) free_ok(reported, cuModuleUnload(c->modules[i]), "cuModuleUnload");
    free(c->modules);
    free(c->generated);
    for (int i = 0; i < c->capnamed; i++) free(c->named[i].name);
    free(c->named);
    free(c->grants);
}

static void free_spaces(rt_ctx *c, int *reported) {
    if (c->mirror[RT_SPACE_HOST]) free_ok(reported, cuMemFreeHost(c->mirror[RT_SPACE_HOST]), "cuMemFreeHost");
    c->mirror[RT_SPACE_HOST] = NULL;
    for (int i = 0; i < RT_NSPACES; i++) {
        if (c->dspace[i]) free_ok(reported, cuMemFree(c->dspace[i]), "cuMemFree");
        if (rt_unmap_host(c->mirror[i], c->mapped[i])) *reported = 1;
    }
    if (c->schedule) free_ok(reported, cuMemFree(c->schedule), "cuMemFree");
}

void rt_free(rt_ctx *c) {
    if (!c) return;
    if (c->act_hw >= 0 && c->p)
        fprintf(stderr, "kiln runtime: rank %d stage %d: act high-water mark %lld bytes (measured; act space %lld, host space %lld)\n",
                c->comm ? rt_world_rank(c) : 0, c->p->stage, (long long)c->act_hw, (long long)c->p->space_bytes[RT_SPACE_ACT],
                (long long)c->p->space_bytes[RT_SPACE_HOST]);
    int reported = c->broken; /* the step already said why: the teardown's errors would repeat it */
    if (c->cu) {
        free_ok(&reported, cuCtxSetCurrent(c->cu), "cuCtxSetCurrent");
        free_ok(&reported, cuCtxSynchronize(), "cuCtxSynchronize");
    }
    if (c->trace) { /* written as the CPU's are, at the end; a failure to write is the run's failure */
        int bad = c->cu && rtc_trace_write(c->trace) != 0;
        if (rtc_trace_free(c->trace) != 0 && !reported) {
            fprintf(stderr, "kiln runtime: freeing the CUDA context: the trace's events: cuEventDestroy failed\n");
            reported = 1;
        }
        c->trace = NULL;
        if (bad) exit(1);
    }
    /* the graph first: a graph that captured NCCL calls holds its
     * communicators, and ncclCommDestroy waits for them */
    if (c->graph) free_ok(&reported, cuGraphExecDestroy(c->graph), "cuGraphExecDestroy");
    c->graph = NULL;
    if (c->nccl && c->step_failed) rtc_nccl_break(c->nccl); /* peers may wait in a collective: abort, never destroy */
    if (c->nccl) rtc_nccl_free(c->nccl);
    if (c->cu) {
        rtc_kernels_free(c); /* cuBLASLt plans, before the handle goes */
        for (int i = 0; i < c->nat_free; i++) c->at_free[i](c); /* e.g. cuDNN's plans (rtc_at_free) */
    }
    free_streams(c, &reported);
    free_code(c, &reported);
    free_spaces(c, &reported);
    if (c->cu) free_ok(&reported, cuDevicePrimaryCtxRelease(c->dev), "cuDevicePrimaryCtxRelease");
    if (c->comm) rt_comm_free(c->comm);
    if (pthread_mutex_destroy(&c->err_mu)) abort();
    free(c);
}
