/* fake_cuda.c — a fake libcuda.so.1 that runs the CUDA trainer on the host.
 *
 * Why: this machine has the CUDA toolkit but no GPU and no driver, so a
 * trainer built with `kiln compile --target cuda:sm_90` (dev_cuda.c,
 * kernels_cuda.c, comm_nccl.c) links but cannot start.  This library has
 * the real driver's soname and implements exactly the driver API subset of
 * the CUDA contract (/tmp/kiln/cuda_contract.md, docs/cuda.md), on the
 * host, so that a test can run the trainer with
 *     LD_LIBRARY_PATH=<the fakes> KILN_FAKE_CUDA_KERNELS=<kernel libraries>
 * and compare its losses with the CPU trainer's.  fake_cublaslt.c and
 * fake_nccl.c are its siblings (libcublasLt.so.13, libnccl.so.2).
 *
 * The model.
 *   - One device, "Fake GPU (kiln emulator)", compute capability 9.0, with
 *     an H100's attributes (cuDeviceGetAttribute answers the common ones
 *     and fails, naming the attribute, on the rest).  Its primary context
 *     is the only context; the current context is per thread, as in CUDA,
 *     so a thread that never made it current gets CUDA_ERROR_INVALID_CONTEXT.
 *   - Device memory is host memory: a CUdeviceptr is a host address,
 *     aligned to 256 bytes, 80 GiB in all.  Every allocation is tracked:
 *     copies, memsets and the fake cuBLASLt's matrices must lie inside one
 *     (else CUDA_ERROR_INVALID_VALUE, naming the range), cuMemAlloc of 0
 *     bytes and a free of anything not allocated fail as in CUDA.  Every
 *     pointer argument of a kernel (the kernel library knows which
 *     parameters are pointers) must point into a live allocation (or
 *     cuMemAllocHost's pinned memory; NULL passes): a host pointer, freed
 *     memory or an address past an allocation is the kernel's fault,
 *     CUDA_ERROR_ILLEGAL_ADDRESS, and the kernel does not run.
 *   - Streams run concurrently: outside a capture each stream has a thread
 *     that runs its queue (kernels, copies, memsets, event records and
 *     waits), so work of two streams is ordered only by events, and a
 *     missing event can change a result (the section "the streams'
 *     workers" says what runs on the calling thread instead: host work,
 *     the legacy stream; graph replays have their own threads).  One emulated kernel runs at a
 *     time (the emulator is single-threaded); the host work of the fake
 *     cuBLASLt and NCCL runs beside it.  Synchronisations wait for the
 *     queues; cuMemFree and cuModuleUnload wait for all of them.
 *   - The happens-before check (KILN_FAKE_CUDA_STRICT=1): whatever the
 *     timing, vector clocks say whether two streams' conflicting accesses
 *     are ordered by events (its section says how); each race is a line,
 *     and the exit status becomes 1.  The fake cuBLASLt and NCCL declare
 *     the ranges they read and write; a kernel's accesses are the bytes
 *     its pointer arguments point at (read through a pointer to const).
 *     KILN_FAKE_CUDA_TEST_DROP_WAIT=1 plants the bug it is for:
 *     cuStreamWaitEvent outside a capture orders nothing.
 *     cuMemAllocHost's pinned memory is tracked like device memory (the
 *     host space of activation offload: a reload must be ordered after the
 *     offload that wrote its source), and a kernel that touches memory a
 *     copy writes without being ordered after it is reported as touching
 *     it "while a copy into it may still be in flight" (tests/t_offload_cuda.sh
 *     plants that: dev_cuda.c's KILN_TEST_DROP_COPY_WAIT).
 *   - Kernels: cuModuleLoadData checks that the image is an ELF cubin for
 *     sm_90 (else CUDA_ERROR_INVALID_IMAGE / NO_BINARY_FOR_GPU) and keeps a
 *     copy.  cuModuleGetFunctionCount / cuModuleEnumerateFunctions /
 *     cuFuncGetName list the cubin's kernels (global function symbols marked
 *     STO_CUDA_ENTRY), as dev_cuda.c indexes them at load; a listed kernel
 *     the fake cannot run (not in the libraries below, or other parameters)
 *     fails at cuLaunchKernel.  A cuModuleGetFunction of a name the module
 *     lacks returns CUDA_ERROR_NOT_FOUND quietly, as the driver does, but
 *     is counted: under KILN_FAKE_CUDA_STRICT=1 each is a "failed lookup:"
 *     line and the exit status is 1 (compute-sanitizer memcheck reports
 *     every such call as an API error).
 *     cuModuleGetFunction requires the name among the cubin's
 *     kernels and in a kernel library of $KILN_FAKE_CUDA_KERNELS
 *     (fake_kernels.h, built by build_kernels.sh: the same CUDA C compiled
 *     for the fiber emulator, tests/cuda_emu; when two libraries have a
 *     kernel of one name, the first listed wins, so a library put first
 *     overrides a kernel: a planted bug, an instrumented copy); when the
 *     cubin's parameter table (.nv.info.NAME) can be read, its parameter
 *     sizes must equal the emulated kernel's (a stale kernel library fails
 *     here).
 *     cuLaunchKernel checks the geometry (CUDA's limits and the kernel's
 *     __launch_bounds__) and the dynamic shared memory against the
 *     function's limit (48 KiB unless cuFuncSetAttribute raised it, at most
 *     227 KiB), then queues the emulated kernel.  A kernel's fault (a bad
 *     pointer argument, CUDA_ERROR_ILLEGAL_ADDRESS; an emulation error:
 *     barrier divergence, deadlock, bad shuffle..., CUDA_ERROR_LAUNCH_FAILED;
 *     KILN_FAKE_CUDA_TEST_FAULT=NAME[@N], a planted illegal address in
 *     kernel NAME, every run or the N-th) is printed when it happens but is
 *     asynchronous, as on a GPU: the launch succeeded, and the fault is
 *     returned by the next call that can report it (synchronisations,
 *     copies, launches, allocations) and by every one after it, sticky,
 *     until the primary context is released; nothing more runs.  With
 *     CUDA_LAUNCH_BLOCKING=1 every launch runs before it returns, and
 *     returns its own fault.  A segmentation fault inside a kernel kills
 *     the process with the emulator's message (emu.h).
 *     KILN_FAKE_CUDA_TEST_SLOW=NAME:S (no fault) makes every run of kernel
 *     NAME S seconds slower: a timing (kiln calibrate --device cuda) must see it.
 *   - Graph capture (cuStreamBeginCapture .. cuStreamEndCapture): work
 *     enqueued on a capturing stream, or on a stream that joined the
 *     capture by waiting on an event recorded in it, is RECORDED instead of
 *     run: kernel parameter VALUES are copied at capture time (each
 *     kernel's parameter sizes come from its library), copies keep their
 *     pointers (a host source is read at replay, as in CUDA).  The capture
 *     tracks CUDA's dependency sets (a stream's tail, an event's recorded
 *     set) so that it can refuse what CUDA refuses: cuStreamEndCapture with
 *     work not joined back into the origin stream (UNJOINED), ending on
 *     another stream (UNMATCHED), synchronising or querying a capturing
 *     stream or a captured event, the legacy stream while a blocking stream
 *     captures (IMPLICIT), and the "potentially unsafe" calls (cuMemAlloc,
 *     cuMemFree, cuMemAllocHost, cuMemFreeHost, synchronous copies and
 *     memsets, cuCtxSynchronize) while a GLOBAL capture is active (or a
 *     THREAD_LOCAL one of this thread): those fail with
 *     CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidate the capture,
 *     whose end then fails with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED.
 *     cuGraphInstantiate copies the recorded work; cuGraphLaunch replays it
 *     after the launch stream's queue, and returns when it is done:
 *     concurrently, a thread per recorded stream running that stream's
 *     work in order, each piece once its recorded dependencies are done;
 *     or, with KILN_FAKE_CUDA_GRAPH_ORDER=enqueue or reverse, serially on
 *     the calling thread, in enqueue order or in another order that the
 *     dependencies allow (of the work ready to run, the latest enqueued
 *     first): a missing event between two streams then shows as a wrong
 *     result every time; the happens-before check sees it in any order.
 *   - Errors are returned as CUDA would, and each one the fake detects is
 *     also printed on stderr, one line starting "fake cuda: ", with the call
 *     and CUDA's error name.  cuGetErrorName/String give CUDA's texts.
 *   - KILN_FAKE_CUDA_STRICT=1: new device memory is filled with 0xff bytes
 *     (NaN as f32 and bf16), so reading memory never written shows; at exit
 *     every allocation, host allocation, stream, event, module, graph and
 *     graph exec still alive is reported as a leak, and if there was a leak,
 *     a bad free (double free, freeing an address never allocated) or a
 *     race, the process exits with status 1 after flushing its output.
 *   - KILN_FAKE_CUDA_DEVICES=0 pretends there is no device (cuDeviceGet
 *     fails), to test a program's error path.
 *   - KILN_FAKE_CUDA_PROFILE=1 prints at exit the host time spent in each
 *     kernel (and in the fake cuBLASLt's GEMMs, copies, memsets): where an
 *     emulated run spends its time, nothing about a GPU's.
 *
 * Threads: one lock serialises every call; the streams' threads never take
 * it (work_mu and emu_mu, below, are theirs).  The fake cuBLASLt and NCCL
 * enqueue their host work through kiln_fake_cuda_enqueue (fake_cuda.h), so
 * it is ordered, captured and replayed like a kernel.
 */
#include <cuda.h>
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fake_cuda.h"
#include "fake_kernels.h"

#define FAKE_DEVICE_NAME "Fake GPU (kiln emulator)"
#define TOTAL_MEMORY (80ull << 30)
#define ALLOC_ALIGN 256
#define DEFAULT_DYNAMIC_SMEM (48 * 1024)
#define MAX_DYNAMIC_SMEM (227 * 1024)
#define DEVICE_ARCH 90
#ifndef EM_CUDA
#define EM_CUDA 190
#endif

/* ---- the lock: every entry point holds it for its whole body ---- */

static pthread_mutex_t api_lock = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
static void api_unlock(int *unused) {
    (void)unused;
    pthread_mutex_unlock(&api_lock);
}
#define API_LOCKED int api_guard_ __attribute__((cleanup(api_unlock), unused)) = (pthread_mutex_lock(&api_lock), 0)

/* The streams' workers never take api_lock (an entry point may wait for
 * them while holding it).  work_mu guards what they share with the entry
 * points: the queues, the event signals, the allocation list (its bases
 * and sizes), the sticky error and the profile; work_cv is broadcast on
 * every change.  emu_mu: one emulated kernel at a time (each kernel
 * library's emulator is single-threaded). */
static pthread_mutex_t work_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t work_cv = PTHREAD_COND_INITIALIZER;
static pthread_mutex_t emu_mu = PTHREAD_MUTEX_INITIALIZER;

/* ---- error names and texts ---- */

typedef struct {
    CUresult code;
    const char *name, *text;
} ErrorText;

#define E(code, text) {code, #code, text}
static const ErrorText error_texts[] = {
    E(CUDA_SUCCESS, "no error"),
    E(CUDA_ERROR_INVALID_VALUE, "invalid argument"),
    E(CUDA_ERROR_OUT_OF_MEMORY, "out of memory"),
    E(CUDA_ERROR_NOT_INITIALIZED, "initialization error"),
    E(CUDA_ERROR_DEINITIALIZED, "driver shutting down"),
    E(CUDA_ERROR_STUB_LIBRARY, "CUDA driver is a stub library"),
    E(CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected"),
    E(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal"),
    E(CUDA_ERROR_INVALID_IMAGE, "device kernel image is invalid"),
    E(CUDA_ERROR_INVALID_CONTEXT, "invalid device context"),
    E(CUDA_ERROR_NO_BINARY_FOR_GPU, "no kernel image is available for execution on the device"),
    E(CUDA_ERROR_INVALID_PTX, "a PTX JIT compilation failed"),
    E(CUDA_ERROR_INVALID_SOURCE, "device kernel image is invalid"),
    E(CUDA_ERROR_FILE_NOT_FOUND, "file not found"),
    E(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle"),
    E(CUDA_ERROR_ILLEGAL_STATE, "the operation cannot be performed in the present state"),
    E(CUDA_ERROR_NOT_FOUND, "named symbol not found"),
    E(CUDA_ERROR_NOT_READY, "device not ready"),
    E(CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered"),
    E(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "too many resources requested for launch"),
    E(CUDA_ERROR_LAUNCH_TIMEOUT, "the launch timed out and was terminated"),
    E(CUDA_ERROR_CONTEXT_IS_DESTROYED, "context is destroyed"),
    E(CUDA_ERROR_ASSERT, "device-side assert triggered"),
    E(CUDA_ERROR_MISALIGNED_ADDRESS, "misaligned address"),
    E(CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure"),
    E(CUDA_ERROR_NOT_PERMITTED, "operation not permitted"),
    E(CUDA_ERROR_NOT_SUPPORTED, "operation not supported"),
    E(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "operation not permitted when stream is capturing"),
    E(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "operation failed due to a previous error during capture"),
    E(CUDA_ERROR_STREAM_CAPTURE_MERGE, "operation would result in a merge of separate capture sequences"),
    E(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, "capture was not ended in the same stream as it began"),
    E(CUDA_ERROR_STREAM_CAPTURE_UNJOINED, "capturing stream has unjoined work"),
    E(CUDA_ERROR_STREAM_CAPTURE_ISOLATION, "dependency created on uncaptured work in another stream"),
    E(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
      "operation would make the legacy stream depend on a capturing blocking stream"),
    E(CUDA_ERROR_CAPTURED_EVENT, "operation not permitted on an event last recorded in a capturing stream"),
    E(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD,
      "attempt to terminate a thread-local capture sequence from another thread"),
    E(CUDA_ERROR_TIMEOUT, "wait operation timed out"),
    E(CUDA_ERROR_UNKNOWN, "unknown error"),
};
#undef E

static const ErrorText *error_text(CUresult r) {
    for (size_t i = 0; i < sizeof error_texts / sizeof *error_texts; i++)
        if (error_texts[i].code == r) return &error_texts[i];
    return NULL;
}

static const char *error_name(CUresult r) {
    const ErrorText *t = error_text(r);
    return t ? t->name : "CUDA_ERROR_?";
}

/* Print one line about a failure the fake detected and return r. */
static CUresult fail(CUresult r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static CUresult fail(CUresult r, const char *fmt, ...) {
    char line[1536];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "fake cuda: %s (%s)\n", line, error_name(r));
    return r;
}

static void *xrealloc(void *p, size_t bytes) {
    void *q = realloc(p, bytes ? bytes : 1);
    if (!q) {
        fprintf(stderr, "fake cuda: out of host memory (%zu bytes)\n", bytes);
        abort();
    }
    return q;
}

static int env_flag(const char *name) {
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}

/* ---- small sets ---- */

typedef struct {
    int *v;
    int n, cap;
} IntSet;

static void ints_add(IntSet *s, int x) {
    for (int i = 0; i < s->n; i++)
        if (s->v[i] == x) return;
    if (s->n == s->cap) s->v = xrealloc(s->v, sizeof(int) * (size_t)(s->cap = s->cap ? 2 * s->cap : 4));
    s->v[s->n++] = x;
}
static void ints_union(IntSet *dst, const IntSet *src) {
    for (int i = 0; i < src->n; i++) ints_add(dst, src->v[i]);
}
static void ints_set(IntSet *dst, const IntSet *src) {
    dst->n = 0;
    ints_union(dst, src);
}
static void ints_free(IntSet *s) {
    free(s->v);
    *s = (IntSet){0};
}

typedef struct {
    void **v;
    int n, cap;
} PtrList;

static void ptrs_add(PtrList *l, void *p) {
    if (l->n == l->cap) l->v = xrealloc(l->v, sizeof(void *) * (size_t)(l->cap = l->cap ? 2 * l->cap : 8));
    l->v[l->n++] = p;
}
static int ptrs_has(const PtrList *l, const void *p) {
    for (int i = 0; i < l->n; i++)
        if (l->v[i] == p) return 1;
    return 0;
}
static void ptrs_remove(PtrList *l, const void *p) {
    for (int i = 0; i < l->n; i++)
        if (l->v[i] == p) {
            l->v[i] = l->v[--l->n];
            return;
        }
}

/* ---- the objects ---- */

struct CUctx_st {
    int retains;
};

/* A vector clock: per lane (a stream, or a stream of a graph exec), the
 * last of its ops known to have completed (the happens-before check). */
#define MAX_LANES 128
typedef struct {
    uint32_t c[MAX_LANES];
} VClock;

typedef struct Capture Capture;

struct CUstream_st {
    unsigned flags;
    int id;           /* 0 is the legacy stream */
    Capture *capture; /* the capture it belongs to, or NULL */
    IntSet tail;      /* in a capture: the recorded work its next work depends on */
    int lane;         /* its lane of the vector clocks, -1 when they ran out */
    VClock vc;        /* what its next op is ordered after */
    struct Work *head, *last; /* its queue (work_mu); the legacy stream has none */
    int busy, quit;           /* the worker runs head / is told to end */
    pthread_t worker;
    double clock_ms;          /* its virtual clock (event_clock): what its enqueued work has cost */
};

struct CUevent_st {
    unsigned flags;
    int recorded;     /* recorded outside any capture: complete, with a time */
    double time_ms;
    Capture *capture; /* recorded in this (active) capture */
    IntSet deps;      /*   with this dependency set */
    VClock vc;        /* recorded outside a capture: what a wait on it is ordered after */
    struct Signal *signal; /* its last record outside a capture (work_mu) */
};

/* One record of an event: done when its stream reaches it.  Shared by the
 * event and the queued record and waits (refs), so an event destroyed
 * while a wait for it is queued is still waited for, as in CUDA. */
typedef struct Signal {
    int done, refs;
} Signal;

struct CUmod_st {
    unsigned char *image; /* a copy of the cubin */
    size_t size;
};

struct CUfunc_st {
    CUmodule mod;
    const KilnFakeKernel *kernel; /* NULL: listed by cuModuleEnumerateFunctions, but not launchable (defect says why) */
    int max_dynamic_smem;
    char name[256];
    CUresult defect;        /* CUDA_SUCCESS, or what cuLaunchKernel returns */
    char defect_why[1536];  /* with this message */
};

typedef enum { OP_KERNEL, OP_COPY, OP_SET, OP_HOST } OpKind;

/* One piece of stream work.  Transient (run at once) or recorded (owned
 * copies in args / data, dependencies in deps). */
typedef struct {
    OpKind kind;
    int stream; /* the stream's id, for messages */
    IntSet deps;
    /* OP_KERNEL */
    CUfunction f;
    unsigned grid[3], block[3];
    size_t smem;
    void *const *params;  /* transient: the caller's kernelParams */
    unsigned char *args;  /* recorded: the values, each at an 8-byte aligned offset */
    /* OP_COPY, OP_SET */
    void *dst;
    const void *src;
    size_t bytes;
    unsigned char value;
    /* OP_HOST */
    const char *what;
    int (*run)(void *, char *, size_t);
    const void *host_data; /* transient */
    unsigned char *data;   /* recorded */
    size_t data_bytes;
    const KilnFakeAccess *host_acc; /* transient */
    KilnFakeAccess *acc;            /* recorded */
    int nacc;
} Op;

/* Queued work of a stream: an op, or a record of / a wait for a signal. */
typedef struct Work {
    Op op;
    Signal *record, *wait;
    struct Work *next;
} Work;

struct Capture {
    CUstream origin;
    CUstreamCaptureMode mode;
    pthread_t thread;
    int invalid;
    Op *ops;
    int nops, cap;
};

struct CUgraph_st {
    Op *ops;
    int nops;
};

struct CUgraphExec_st {
    Op *ops;
    int nops;
    int *order; /* the replay order: indices into ops */
    int serial; /* replayed in that order on the calling thread (KILN_FAKE_CUDA_GRAPH_ORDER set), else concurrently */
    int *lanes; /* per op, the lane of its stream in this exec; NULL when the lanes ran out */
    VClock *vcs; /* per op, during a replay */
};

/* A range an op read or wrote, kept until every later op is ordered after it. */
typedef struct {
    uintptr_t lo, hi;
    int lane, write, stream, replay;
    int copy; /* a copy's access (the in-flight message) */
    uint32_t clock;
    const char *what;
} Access;

typedef struct {
    uintptr_t base;
    size_t size;
    int host; /* cuMemAllocHost */
    Access *acc;
    int nacc, cap_acc;
} Alloc;

static int initialized;
static struct CUctx_st primary;
static __thread CUcontext current_ctx;
static CUresult sticky_error; /* a kernel's fault, until the context is released (work_mu) */
static int launch_blocking;   /* CUDA_LAUNCH_BLOCKING=1, read at cuInit */
static struct CUstream_st legacy_stream = {.flags = CU_STREAM_DEFAULT, .id = 0, .lane = 0};
static int next_stream_id = 1;
static PtrList streams, events, modules, functions, graphs, execs, captures;
static Alloc *allocs;
static int nallocs, cap_allocs;
static unsigned long long device_bytes;
static int bad_frees;
/* Failing cuModuleGetFunction calls (the name is not in the module): a real
 * driver returns CUDA_ERROR_NOT_FOUND quietly, but compute-sanitizer memcheck
 * lists each as an API error (hundreds per run on the H200 before dev_cuda.c
 * listed each module's kernels at load).  KILN_FAKE_CUDA_STRICT=1 prints a
 * line for each and makes the exit status 1. */
static int failed_lookups;


/* KILN_FAKE_CUDA_PROFILE=1: time per kernel (and per kind of host work), printed at exit */
typedef struct {
    const char *name;
    long long count;
    double seconds;
} ProfileRow;
static ProfileRow *profile;
static int nprofile, profiling; /* KILN_FAKE_CUDA_PROFILE, read at cuInit */

static CUresult sticky(void) {
    pthread_mutex_lock(&work_mu);
    CUresult r = sticky_error;
    pthread_mutex_unlock(&work_mu);
    return r;
}

static void set_sticky(CUresult r) {
    pthread_mutex_lock(&work_mu);
    if (!sticky_error || r == CUDA_SUCCESS) sticky_error = r;
    pthread_mutex_unlock(&work_mu);
}

/* ---- context and capture rules ---- */

static CUresult need_ctx(const char *call) {
    if (!initialized) return fail(CUDA_ERROR_NOT_INITIALIZED, "%s before cuInit", call);
    if (!current_ctx || primary.retains == 0)
        return fail(CUDA_ERROR_INVALID_CONTEXT,
                    "%s: no current context on this thread (cuDevicePrimaryCtxRetain, then cuCtxSetCurrent)", call);
    return CUDA_SUCCESS;
}

static const char *mode_name(CUstreamCaptureMode m) {
    switch (m) {
    case CU_STREAM_CAPTURE_MODE_GLOBAL: return "global";
    case CU_STREAM_CAPTURE_MODE_THREAD_LOCAL: return "thread-local";
    case CU_STREAM_CAPTURE_MODE_RELAXED: return "relaxed";
    default: return "?";
    }
}

/* A potentially unsafe call (CUDA's term) while a capture forbids it. */
static CUresult capture_forbids(const char *call) {
    for (int i = 0; i < captures.n; i++) {
        Capture *c = captures.v[i];
        int mine = pthread_equal(c->thread, pthread_self());
        if (c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL || (c->mode == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL && mine)) {
            c->invalid = 1;
            return fail(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                        "%s while stream %d is being captured (%s mode): not permitted; the capture is invalidated",
                        call, c->origin->id, mode_name(c->mode));
        }
    }
    return CUDA_SUCCESS;
}

/* Work on the legacy stream waits for every blocking stream: not while one captures. */
static CUresult legacy_allowed(const char *call) {
    for (int i = 0; i < streams.n; i++) {
        struct CUstream_st *s = streams.v[i];
        if (s->capture && !(s->flags & CU_STREAM_NON_BLOCKING)) {
            s->capture->invalid = 1;
            return fail(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
                        "%s on the legacy stream while blocking stream %d is being captured; the capture is invalidated",
                        call, s->id);
        }
    }
    return CUDA_SUCCESS;
}

static CUresult stream_of(CUstream h, const char *call, struct CUstream_st **out) {
    if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
        *out = &legacy_stream;
        return CUDA_SUCCESS;
    }
    if (!ptrs_has(&streams, h)) return fail(CUDA_ERROR_INVALID_HANDLE, "%s: stream %p is not a live stream", call, (void *)h);
    *out = h;
    return CUDA_SUCCESS;
}

/* ---- memory ---- */

static Alloc *find_alloc(uintptr_t p, int host) {
    for (int i = 0; i < nallocs; i++)
        if (allocs[i].host == host && p >= allocs[i].base && p - allocs[i].base < allocs[i].size) return &allocs[i];
    return NULL;
}

static int range_ok(CUdeviceptr p, size_t bytes, char *err, size_t errlen) {
    if (bytes == 0) return 0;
    const Alloc *a = find_alloc((uintptr_t)p, 0);
    if (a && bytes <= a->size - ((uintptr_t)p - a->base)) return 0;
    if (a)
        snprintf(err, errlen, "device range 0x%llx + %zu bytes runs %zu bytes past its allocation (0x%llx, %zu bytes)",
                 (unsigned long long)p, bytes, bytes - (a->size - ((uintptr_t)p - a->base)), (unsigned long long)a->base,
                 a->size);
    else
        snprintf(err, errlen, "device address 0x%llx (+ %zu bytes) is not in any device allocation",
                 (unsigned long long)p, bytes);
    return -1;
}

static CUresult check_range(const char *call, const char *which, CUdeviceptr p, size_t bytes) {
    char why[256];
    if (range_ok(p, bytes, why, sizeof why) == 0) return CUDA_SUCCESS;
    return fail(CUDA_ERROR_INVALID_VALUE, "%s: %s: %s", call, which, why);
}

static void add_alloc(void *p, size_t size, int host) {
    pthread_mutex_lock(&work_mu);
    if (nallocs == cap_allocs) allocs = xrealloc(allocs, sizeof *allocs * (size_t)(cap_allocs = cap_allocs ? 2 * cap_allocs : 16));
    allocs[nallocs++] = (Alloc){.base = (uintptr_t)p, .size = size, .host = host};
    pthread_mutex_unlock(&work_mu);
    if (!host) device_bytes += size;
}

static CUresult free_alloc(const char *call, uintptr_t p, int host) {
    for (int i = 0; i < nallocs; i++)
        if (allocs[i].base == p && allocs[i].host == host) {
            if (!host) device_bytes -= allocs[i].size;
            free((void *)p);
            free(allocs[i].acc);
            pthread_mutex_lock(&work_mu);
            allocs[i] = allocs[--nallocs];
            pthread_mutex_unlock(&work_mu);
            return CUDA_SUCCESS;
        }
    bad_frees++;
    return fail(CUDA_ERROR_INVALID_VALUE, "%s(%p): not a live %s allocation (double free, or never allocated)", call,
                (void *)p, host ? "cuMemAllocHost" : "cuMemAlloc");
}

static void *alloc_aligned(size_t bytes) {
    size_t rounded = (bytes + ALLOC_ALIGN - 1) / ALLOC_ALIGN * ALLOC_ALIGN;
    return aligned_alloc(ALLOC_ALIGN, rounded);
}

/* ---- the happens-before check (KILN_FAKE_CUDA_STRICT=1) ----
 * Streams run serially here, so two streams racing on memory still run in
 * one order and give the same bits; what differs on a GPU is whether that
 * order is guaranteed.  Vector clocks say whether it is.  Each stream, and
 * each stream of a graph exec, is a lane; an op ticks its lane's clock; a
 * stream's clock takes in an event's at cuStreamWaitEvent, the host's
 * (everything the host has synchronised with) at every enqueue, and the
 * legacy stream's or the blocking streams' as CUDA's implicit
 * synchronisation says; a replayed graph op takes in its dependencies'.
 * Every device range an op touches (copies and memsets, the fake
 * cuBLASLt's and NCCL's buffers as they declare them, and for a kernel the
 * byte each pointer argument points at: read through a pointer to const,
 * written through any other) is kept, per allocation, with its lane and
 * clock.  An access that overlaps a kept one of another lane, one of the
 * two a write, while its clock does not cover the kept one, is a race: one
 * line on stderr, and strict mode's exit status 1.  A kept access goes
 * when the host has synchronised with it (nothing later can race it), when
 * a later access of its lane covers it, or when its memory is freed. */

static int nlanes = 1; /* lane 0: the legacy stream */
static uint32_t lane_clock[MAX_LANES];
static VClock host_vc;
static int races, race_check = -1;

static int checking_races(void) {
    if (race_check < 0) race_check = env_flag("KILN_FAKE_CUDA_STRICT");
    return race_check;
}

static void vc_join(VClock *a, const VClock *b) {
    for (int i = 0; i < nlanes; i++)
        if (b->c[i] > a->c[i]) a->c[i] = b->c[i];
}

/* A new lane, or -1 (and the check off, said once) when they ran out. */
static int new_lane(void) {
    if (nlanes < MAX_LANES) return nlanes++;
    if (checking_races())
        fprintf(stderr, "fake cuda: more than %d streams and graph streams: the happens-before check is off from here\n",
                MAX_LANES);
    race_check = 0;
    return -1;
}

static void report_race(const Access *old, const Access *now) {
    if (++races > 10) {
        if (races == 11) fprintf(stderr, "fake cuda: race: more races, not printed\n");
        return;
    }
    if (old->copy && old->write && !now->copy) { /* a kernel touches what an unordered copy writes */
        fprintf(stderr,
                "fake cuda: race: %s on stream %d%s %s device memory 0x%llx (+%llu bytes) while %s into it on stream %d%s "
                "may still be in flight (nothing orders the kernel after the copy: a missing cuStreamWaitEvent?)\n",
                now->what, now->stream, now->replay ? " (graph replay)" : "", now->write ? "writes" : "reads",
                (unsigned long long)now->lo, (unsigned long long)(now->hi - now->lo), old->what, old->stream,
                old->replay ? " (graph replay)" : "");
        return;
    }
    fprintf(stderr,
            "fake cuda: race: %s on stream %d%s %s device memory 0x%llx (+%llu bytes) that %s on stream %d%s %s, "
            "and nothing orders the two (a missing cuStreamWaitEvent?)\n",
            now->what, now->stream, now->replay ? " (graph replay)" : "", now->write ? "writes" : "reads",
            (unsigned long long)now->lo, (unsigned long long)(now->hi - now->lo), old->what, old->stream,
            old->replay ? " (graph replay)" : "", old->write ? "wrote" : "read");
}

/* Check one access against the kept ones of its allocation, then keep it. */
static void hb_access(Access now, const VClock *vc) {
    Alloc *a = find_alloc(now.lo, 0);
    if (!a) a = find_alloc(now.lo, 1); /* pinned host memory (offload's host space) */
    if (!a) return; /* pageable host memory: not tracked */
    if (now.hi > a->base + a->size) now.hi = a->base + a->size;
    int kept = 0;
    for (int i = 0; i < a->nacc; i++) {
        const Access *o = &a->acc[i];
        int overlap = o->lo < now.hi && now.lo < o->hi;
        if (overlap && o->lane != now.lane && (o->write || now.write) && vc->c[o->lane] < o->clock) report_race(o, &now);
        int covered = o->lane == now.lane && now.lo <= o->lo && o->hi <= now.hi && (now.write || !o->write);
        if (!covered) a->acc[kept++] = *o;
    }
    a->nacc = kept;
    if (a->nacc == a->cap_acc) a->acc = xrealloc(a->acc, sizeof *a->acc * (size_t)(a->cap_acc = a->cap_acc ? 2 * a->cap_acc : 16));
    a->acc[a->nacc++] = now;
}

/* Kernel parameter i's value: recorded args or the caller's kernelParams. */
static const void *param_value(const Op *op, int i) {
    if (!op->args) return op->params[i];
    const KilnFakeKernel *k = op->f->kernel;
    size_t off = 0;
    for (int j = 0; j < i; j++) off += (k->param_sizes[j] + 7) / 8 * 8;
    return op->args + off;
}

/* What op reads and writes, checked and kept: it runs on `lane` at clock vc. */
static void hb_op(const Op *op, int lane, const VClock *vc, int replay) {
    Access x = {.lane = lane, .clock = vc->c[lane], .stream = op->stream, .replay = replay};
    switch (op->kind) {
    case OP_KERNEL: {
        const KilnFakeKernel *k = op->f->kernel;
        x.what = k->name;
        for (int i = 0; i < k->nparams; i++) {
            uintptr_t p;
            if (k->param_kinds[i] == KILN_FAKE_PARAM_VALUE || k->param_sizes[i] != sizeof p) continue;
            memcpy(&p, param_value(op, i), sizeof p);
            x.lo = p, x.hi = p + 1, x.write = k->param_kinds[i] == KILN_FAKE_PARAM_PTR;
            if (p) hb_access(x, vc);
        }
        return;
    }
    case OP_COPY:
        x.what = op->what ? op->what : "a copy";
        x.copy = 1;
        x.lo = (uintptr_t)op->src, x.hi = x.lo + op->bytes, x.write = 0;
        hb_access(x, vc);
        x.lo = (uintptr_t)op->dst, x.hi = x.lo + op->bytes, x.write = 1;
        hb_access(x, vc);
        return;
    case OP_SET:
        x.what = "a memset";
        x.lo = (uintptr_t)op->dst, x.hi = x.lo + op->bytes, x.write = 1;
        hb_access(x, vc);
        return;
    case OP_HOST: {
        const KilnFakeAccess *acc = op->acc ? op->acc : op->host_acc;
        x.what = op->what;
        for (int i = 0; i < op->nacc; i++) {
            x.lo = (uintptr_t)acc[i].p, x.hi = x.lo + acc[i].bytes, x.write = acc[i].write;
            if (acc[i].bytes) hb_access(x, vc);
        }
        return;
    }
    }
}

/* An op run on stream s outside a capture: ordered after s's work, what the
 * host synchronised with, and CUDA's implicit synchronisation. */
static void hb_eager(struct CUstream_st *s, const Op *op) {
    if (!checking_races() || s->lane < 0) return;
    vc_join(&s->vc, &host_vc);
    if (s == &legacy_stream) {
        for (int i = 0; i < streams.n; i++) {
            struct CUstream_st *t = streams.v[i];
            if (!(t->flags & CU_STREAM_NON_BLOCKING)) vc_join(&s->vc, &t->vc);
        }
    } else if (!(s->flags & CU_STREAM_NON_BLOCKING))
        vc_join(&s->vc, &legacy_stream.vc);
    s->vc.c[s->lane] = ++lane_clock[s->lane];
    hb_op(op, s->lane, &s->vc, 0);
}

/* Replayed op i of x, its dependencies done, on a replay that began at
 * base; the launch stream's clock `after` takes it in. */
static void hb_replayed(struct CUgraphExec_st *x, int i, const VClock *base, VClock *after) {
    if (!checking_races() || !x->lanes) return;
    VClock *v = &x->vcs[i];
    *v = *base;
    for (int j = 0; j < x->ops[i].deps.n; j++) vc_join(v, &x->vcs[x->ops[i].deps.v[j]]);
    v->c[x->lanes[i]] = ++lane_clock[x->lanes[i]];
    hb_op(&x->ops[i], x->lanes[i], v, 1);
    vc_join(after, v);
}

/* The host synchronised with everything vc covers: nothing later races it. */
static void hb_host_waits(const VClock *vc) {
    if (!checking_races()) return;
    vc_join(&host_vc, vc);
    for (int i = 0; i < nallocs; i++) {
        Alloc *a = &allocs[i];
        int kept = 0;
        for (int j = 0; j < a->nacc; j++)
            if (a->acc[j].clock > host_vc.c[a->acc[j].lane]) a->acc[kept++] = a->acc[j];
        a->nacc = kept;
    }
}

/* ---- the kernel libraries ($KILN_FAKE_CUDA_KERNELS) ---- */

typedef struct {
    const KilnFakeKernel *kernel;
    const char *library;
} Registered;

static Registered *registry;
static int nregistry, registry_loaded;
static char registry_error[1024];

static int load_library(const char *path) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(registry_error, sizeof registry_error, "cannot load kernel library %s: %s", path, dlerror());
        return -1;
    }
    const KilnFakeKernel *(*get)(int *, int *) = (const KilnFakeKernel *(*)(int *, int *))dlsym(h, "kiln_fake_kernels");
    int count = 0, abi = 0;
    const KilnFakeKernel *table = get ? get(&count, &abi) : NULL;
    const char *why = !get ? "no symbol kiln_fake_kernels (not built by build_kernels.sh?)"
                      : abi != KILN_FAKE_KERNELS_ABI ? "another KILN_FAKE_KERNELS_ABI (rebuild it)"
                      : count < 0 ? "two kernels of one name"
                                  : NULL;
    if (why) {
        snprintf(registry_error, sizeof registry_error, "kernel library %s: %s", path, why);
        return -1;
    }
    char *name = strdup(path);
    if (!name) abort();
    for (int i = 0; i < count; i++) {
        int taken = 0; /* by an earlier library: the first one listed wins */
        for (int j = 0; j < nregistry && !taken; j++) taken = strcmp(registry[j].kernel->name, table[i].name) == 0;
        if (taken) continue;
        registry = xrealloc(registry, sizeof *registry * (size_t)(nregistry + 1));
        registry[nregistry++] = (Registered){&table[i], name};
    }
    return 0;
}

static int load_registry(void) {
    if (registry_loaded) return registry_error[0] ? -1 : 0;
    registry_loaded = 1;
    const char *paths = getenv("KILN_FAKE_CUDA_KERNELS");
    if (!paths || !*paths) {
        snprintf(registry_error, sizeof registry_error,
                 "KILN_FAKE_CUDA_KERNELS is not set (colon-separated kernel libraries from build_kernels.sh)");
        return -1;
    }
    char *copy = strdup(paths), *save = NULL;
    if (!copy) abort();
    int rc = 0;
    for (char *p = strtok_r(copy, ":", &save); p && rc == 0; p = strtok_r(NULL, ":", &save)) rc = load_library(p);
    free(copy);
    return rc;
}

static const Registered *find_kernel(const char *name) {
    for (int i = 0; i < nregistry; i++)
        if (strcmp(registry[i].kernel->name, name) == 0) return &registry[i];
    return NULL;
}

/* ---- cubins (ELF) ---- */

static const Elf64_Shdr *section(const unsigned char *img, int i) {
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)img;
    return (const Elf64_Shdr *)(img + eh->e_shoff + (size_t)i * eh->e_shentsize);
}

static const char *section_name(const unsigned char *img, const Elf64_Shdr *sh) {
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)img;
    return (const char *)img + section(img, eh->e_shstrndx)->sh_offset + sh->sh_name;
}

static int cubin_arch(const Elf64_Ehdr *eh) {
    return eh->e_ident[EI_ABIVERSION] >= 8 ? (int)((eh->e_flags >> 8) & 0xff) : (int)(eh->e_flags & 0xff);
}

/* Checks an image and finds its size; CUDA_SUCCESS or the error to return. */
static CUresult cubin_check(const unsigned char *img, size_t *size) {
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)img;
    if (memcmp(img, ELFMAG, SELFMAG) != 0)
        return fail(CUDA_ERROR_INVALID_IMAGE, "cuModuleLoadData: the image is not an ELF cubin (no \\177ELF magic)");
    if (eh->e_ident[EI_CLASS] != ELFCLASS64 || eh->e_machine != EM_CUDA || eh->e_shentsize != sizeof(Elf64_Shdr) ||
        eh->e_shnum == 0 || eh->e_shstrndx >= eh->e_shnum)
        return fail(CUDA_ERROR_INVALID_IMAGE, "cuModuleLoadData: an ELF image but not a 64-bit CUDA cubin (machine %d)",
                    eh->e_machine);
    if (cubin_arch(eh) != DEVICE_ARCH)
        return fail(CUDA_ERROR_NO_BINARY_FOR_GPU, "cuModuleLoadData: a cubin for sm_%d; the device is sm_%d",
                    cubin_arch(eh), DEVICE_ARCH);
    size_t end = eh->e_shoff + (size_t)eh->e_shnum * eh->e_shentsize;
    for (int i = 0; i < eh->e_shnum; i++) {
        const Elf64_Shdr *sh = section(img, i);
        if (sh->sh_type != SHT_NOBITS && sh->sh_offset + sh->sh_size > end) end = sh->sh_offset + sh->sh_size;
    }
    *size = end;
    return CUDA_SUCCESS;
}

/* A kernel's symbol: a global function marked as an entry (st_other's
 * STO_CUDA_ENTRY, 0x10), as NVRTC's cubins mark extern "C" __global__
 * functions; device functions the compiler kept (the $__internal_ division
 * helpers, weak) are not kernels. */
static int sym_is_kernel(const Elf64_Sym *s) {
    return ELF64_ST_TYPE(s->st_info) == STT_FUNC && ELF64_ST_BIND(s->st_info) == STB_GLOBAL && (s->st_other & 0x10);
}

/* 1 when the cubin defines a kernel `name`. */
static int cubin_has_kernel(const unsigned char *img, const char *name) {
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)img;
    for (int i = 0; i < eh->e_shnum; i++) {
        const Elf64_Shdr *sh = section(img, i);
        if (sh->sh_type != SHT_SYMTAB || sh->sh_entsize != sizeof(Elf64_Sym) || sh->sh_link >= eh->e_shnum) continue;
        const char *strtab = (const char *)img + section(img, (int)sh->sh_link)->sh_offset;
        const Elf64_Sym *sym = (const Elf64_Sym *)(img + sh->sh_offset);
        for (size_t j = 0; j < sh->sh_size / sizeof *sym; j++)
            if (sym_is_kernel(&sym[j]) && strcmp(strtab + sym[j].st_name, name) == 0) return 1;
    }
    return 0;
}

/* The parameter sizes the cubin records for kernel `name` (.nv.info.NAME:
 * EIATTR_KPARAM_INFO records, size in the top 14 bits of the last word);
 * the count, or -1 when the table cannot be read (then nothing is checked). */
static int cubin_param_sizes(const unsigned char *img, const char *name, size_t *sizes, int max) {
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)img;
    char want[300];
    snprintf(want, sizeof want, ".nv.info.%s", name);
    for (int i = 0; i < eh->e_shnum; i++) {
        const Elf64_Shdr *sh = section(img, i);
        if (strcmp(section_name(img, sh), want) != 0) continue;
        const unsigned char *p = img + sh->sh_offset, *end = p + sh->sh_size;
        int count = 0, seen[256] = {0};
        while (p + 4 <= end) {
            int format = p[0], attr = p[1];
            if (format == 3) { p += 4; continue; } /* EIFMT_HVAL */
            if (format != 4) break;                 /* anything else: stop reading */
            uint16_t len;
            memcpy(&len, p + 2, 2);
            if (p + 4 + len > end) return -1;
            if (attr == 0x17 && len == 12) { /* EIATTR_KPARAM_INFO */
                uint16_t ordinal;
                uint32_t word;
                memcpy(&ordinal, p + 8, 2);
                memcpy(&word, p + 12, 4);
                if (ordinal >= max || ordinal >= 256) return -1;
                sizes[ordinal] = word >> 18;
                if (!seen[ordinal]) count++;
                seen[ordinal] = 1;
            }
            p += 4 + len;
        }
        for (int j = 0; j < count; j++)
            if (!seen[j]) return -1;
        return count;
    }
    return -1;
}

/* ---- running and recording work ---- */

static size_t args_bytes(const KilnFakeKernel *k) {
    size_t total = 0;
    for (int i = 0; i < k->nparams; i++) total += (k->param_sizes[i] + 7) / 8 * 8;
    return total;
}

/* A kernel's pointer arguments must point into memory the device can
 * reach (a live cuMemAlloc, or cuMemAllocHost's pinned memory; NULL is
 * allowed, it may be an unused optional argument): 0, or -1 with err. */
static int kernel_pointers_ok(const Op *op, char *err, size_t errlen) {
    const KilnFakeKernel *k = op->f->kernel;
    for (int i = 0; i < k->nparams; i++) {
        uintptr_t p;
        if (k->param_kinds[i] == KILN_FAKE_PARAM_VALUE || k->param_sizes[i] != sizeof p) continue;
        memcpy(&p, param_value(op, i), sizeof p);
        pthread_mutex_lock(&work_mu);
        int live = !p || find_alloc(p, 0) || find_alloc(p, 1);
        pthread_mutex_unlock(&work_mu);
        if (!live) {
            snprintf(err, errlen,
                     "parameter %d (a pointer) is 0x%llx, in no live device allocation (a host pointer, freed memory, "
                     "or past an allocation's end)",
                     i, (unsigned long long)p);
            return -1;
        }
    }
    return 0;
}

/* A kernel's fault: sticky, CUDA's asynchronous error. */
static CUresult kernel_fault(const Op *op, CUresult code, const char *err) {
    set_sticky(code);
    const KilnFakeKernel *k = op->f->kernel;
    return fail(code, "kernel %s<<<(%u,%u,%u), (%u,%u,%u), %zu>>> on stream %d faulted: %s; reported %s, and by every "
                      "call after it",
                k->name, op->grid[0], op->grid[1], op->grid[2], op->block[0], op->block[1], op->block[2], op->smem,
                op->stream, err,
                launch_blocking ? "by its launch (CUDA_LAUNCH_BLOCKING=1)" : "at the next synchronisation");
}

/* A fault that the call enqueueing op does not return: a kernel's, which
 * the driver reports at the next synchronisation (sticky_error), unless
 * CUDA_LAUNCH_BLOCKING=1 makes every launch synchronous. */
static int deferred(const Op *op, CUresult r) {
    return op->kind == OP_KERNEL && (r == CUDA_ERROR_ILLEGAL_ADDRESS || r == CUDA_ERROR_LAUNCH_FAILED) && !launch_blocking;
}

/* KILN_FAKE_CUDA_TEST_FAULT=NAME (every run of kernel NAME) or NAME@N (its
 * N-th run, eager or replayed): a planted illegal address, for tests.
 * Read at cuInit; called under emu_mu. */
static char planted_name[256];
static long long planted_at;

static int planted_fault(const char *name) {
    static long long runs;
    if (!planted_name[0] || strcmp(name, planted_name) != 0) return 0;
    return !planted_at || ++runs == planted_at;
}

static void read_planted_fault(void) {
    const char *v = getenv("KILN_FAKE_CUDA_TEST_FAULT"), *at = v ? strchr(v, '@') : NULL;
    snprintf(planted_name, sizeof planted_name, "%.*s", v ? (int)(at ? at - v : (long)strlen(v)) : 0, v ? v : "");
    planted_at = at ? atoll(at + 1) : 0;
}

/* KILN_FAKE_CUDA_TEST_SLOW=NAME:SECONDS (tests only): every run of
 * kernel NAME takes SECONDS longer (a sleep before it), so a test can
 * check that a timing (kiln calibrate --device cuda) sees that kernel. */
static void planted_slowness(const char *name) {
    static char slow_name[256];
    static double slow_s = -1;
    if (slow_s < 0) {
        const char *v = getenv("KILN_FAKE_CUDA_TEST_SLOW"), *colon = v ? strrchr(v, ':') : NULL;
        snprintf(slow_name, sizeof slow_name, "%.*s", colon ? (int)(colon - v) : 0, colon ? v : "");
        slow_s = colon ? atof(colon + 1) : 0;
    }
    if (slow_s <= 0 || strcmp(name, slow_name) != 0) return;
    struct timespec t = {(time_t)slow_s, (long)((slow_s - (double)(time_t)slow_s) * 1e9)};
    while (nanosleep(&t, &t) != 0 && errno == EINTR) {}
}

static CUresult run_op_now(const Op *op) {
    char err[2048] = "";
    switch (op->kind) {
    case OP_KERNEL: {
        const KilnFakeKernel *k = op->f->kernel;
        planted_slowness(k->name);
        if (kernel_pointers_ok(op, err, sizeof err) != 0) return kernel_fault(op, CUDA_ERROR_ILLEGAL_ADDRESS, err);
        void *stack_ptrs[64], **ptrs = stack_ptrs;
        if (op->args) {
            if (k->nparams > 64) ptrs = xrealloc(NULL, sizeof(void *) * (size_t)k->nparams);
            for (int i = 0; i < k->nparams; i++) ptrs[i] = (void *)param_value(op, i);
        }
        pthread_mutex_lock(&emu_mu);
        int planted = planted_fault(k->name);
        int rc = planted ? 0 : k->launch(op->grid, op->block, op->smem, op->args ? (void *const *)ptrs : op->params, err, sizeof err);
        pthread_mutex_unlock(&emu_mu);
        if (ptrs != stack_ptrs) free(ptrs);
        if (planted) return kernel_fault(op, CUDA_ERROR_ILLEGAL_ADDRESS, "KILN_FAKE_CUDA_TEST_FAULT: a planted illegal address");
        return rc == 0 ? CUDA_SUCCESS : kernel_fault(op, CUDA_ERROR_LAUNCH_FAILED, err);
    }
    case OP_COPY: memmove(op->dst, op->src, op->bytes); return CUDA_SUCCESS;
    case OP_SET: memset(op->dst, op->value, op->bytes); return CUDA_SUCCESS;
    case OP_HOST:
        if (op->run(op->data ? op->data : (void *)op->host_data, err, sizeof err) == 0) return CUDA_SUCCESS;
        set_sticky(CUDA_ERROR_LAUNCH_FAILED);
        return fail(CUDA_ERROR_LAUNCH_FAILED, "%s on stream %d failed: %s", op->what, op->stream, err);
    }
    return CUDA_ERROR_UNKNOWN;
}

static double now_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void profile_add(const char *name, double seconds) {
    pthread_mutex_lock(&work_mu);
    int i = 0;
    while (i < nprofile && strcmp(profile[i].name, name) != 0) i++;
    if (i == nprofile) {
        profile = xrealloc(profile, sizeof *profile * (size_t)(nprofile + 1));
        profile[nprofile++] = (ProfileRow){name, 0, 0};
    }
    profile[i].count++;
    profile[i].seconds += seconds;
    pthread_mutex_unlock(&work_mu);
}

static CUresult run_op(const Op *op) {
    if (!profiling) return run_op_now(op);
    double t0 = now_seconds();
    CUresult r = run_op_now(op);
    const char *name = op->kind == OP_KERNEL ? op->f->kernel->name
                       : op->kind == OP_HOST ? op->what
                       : op->kind == OP_COPY ? "(copy)"
                                             : "(memset)";
    profile_add(name, now_seconds() - t0);
    return r;
}

static int by_time(const void *a, const void *b) {
    double x = ((const ProfileRow *)a)->seconds, y = ((const ProfileRow *)b)->seconds;
    return x < y ? 1 : x > y ? -1 : 0;
}

static void print_profile(void) {
    if (nprofile == 0) return;
    double total = 0;
    for (int i = 0; i < nprofile; i++) total += profile[i].seconds;
    qsort(profile, (size_t)nprofile, sizeof *profile, by_time);
    fprintf(stderr, "fake cuda: profile (KILN_FAKE_CUDA_PROFILE=1): %.3f s in stream work\n", total);
    for (int i = 0; i < nprofile; i++)
        fprintf(stderr, "fake cuda:   %8.3f s %5.1f%% %7lld x  %s\n", profile[i].seconds,
                total > 0 ? 100 * profile[i].seconds / total : 0.0, profile[i].count, profile[i].name);
}

/* Make a transient op own what it points at (recording). */
static void own(Op *op) {
    if (op->kind == OP_KERNEL) {
        const KilnFakeKernel *k = op->f->kernel;
        op->args = xrealloc(NULL, args_bytes(k));
        size_t off = 0;
        for (int i = 0; i < k->nparams; i++) {
            memcpy(op->args + off, op->params[i], k->param_sizes[i]);
            off += (k->param_sizes[i] + 7) / 8 * 8;
        }
        op->params = NULL;
    } else if (op->kind == OP_HOST) {
        op->data = xrealloc(NULL, op->data_bytes);
        memcpy(op->data, op->host_data, op->data_bytes);
        op->host_data = NULL;
        op->acc = xrealloc(NULL, sizeof *op->acc * (size_t)op->nacc);
        if (op->nacc) memcpy(op->acc, op->host_acc, sizeof *op->acc * (size_t)op->nacc);
        op->host_acc = NULL;
    }
}

static Op copy_op(const Op *src) {
    Op op = *src;
    op.deps = (IntSet){0};
    ints_union(&op.deps, &src->deps);
    if (src->args && !ptrs_has(&functions, src->f)) op.args = NULL; /* its module is gone: run_op refuses it */
    else if (src->args) {
        size_t n = args_bytes(src->f->kernel);
        op.args = xrealloc(NULL, n);
        memcpy(op.args, src->args, n);
    }
    if (src->data) {
        op.data = xrealloc(NULL, src->data_bytes);
        memcpy(op.data, src->data, src->data_bytes);
    }
    if (src->acc) {
        op.acc = xrealloc(NULL, sizeof *op.acc * (size_t)src->nacc);
        if (src->nacc) memcpy(op.acc, src->acc, sizeof *op.acc * (size_t)src->nacc);
    }
    return op;
}

static void free_op(Op *op);

static void free_ops(Op *ops, int n) {
    for (int i = 0; i < n; i++) free_op(&ops[i]);
    free(ops);
}

/* ---- the streams' workers ----
 * Outside a capture, each stream (but the legacy one) has a thread that
 * runs its queue in order: kernels, copies and memsets, and the records of
 * and waits for events, so work on different streams runs concurrently,
 * ordered only by stream order and events.  What runs on the calling
 * thread instead, once its stream's queue is empty: host work (the fake
 * cuBLASLt's and NCCL's: their errors are the call's, and an NCCL op waits
 * for the other ranks), a copy into pageable host memory (CUDA returns
 * only once it is done), everything under CUDA_LAUNCH_BLOCKING=1, graph
 * replays (their own threads, or serially: cuGraphLaunch), and the legacy stream's work
 * (after every blocking stream's).  A copy from pageable host memory takes
 * its bytes at the call, as CUDA's staging does. */

static Signal *signal_new(int done, int refs) {
    Signal *g = xrealloc(NULL, sizeof *g);
    *g = (Signal){done, refs};
    return g;
}

static void signal_put(Signal *g) { /* under work_mu */
    if (g && --g->refs == 0) free(g);
}

static void free_op(Op *op) {
    free(op->args);
    free(op->data);
    free(op->acc);
    ints_free(&op->deps);
}

static void *stream_worker(void *arg) {
    struct CUstream_st *s = arg;
    pthread_mutex_lock(&work_mu);
    for (;;) {
        Work *w = s->head;
        if (!w && s->quit) break;
        if (!w || (w->wait && !w->wait->done)) {
            pthread_cond_wait(&work_cv, &work_mu);
            continue;
        }
        s->busy = 1;
        int skip = w->record || w->wait || sticky_error; /* a faulted context runs nothing more */
        pthread_mutex_unlock(&work_mu);
        if (!skip) run_op(&w->op);
        pthread_mutex_lock(&work_mu);
        if (w->record) w->record->done = 1;
        signal_put(w->record);
        signal_put(w->wait);
        s->head = w->next;
        if (!s->head) s->last = NULL;
        s->busy = 0;
        free_op(&w->op);
        free(w);
        pthread_cond_broadcast(&work_cv);
    }
    pthread_mutex_unlock(&work_mu);
    return NULL;
}

static void start_worker(struct CUstream_st *s) {
    if (pthread_create(&s->worker, NULL, stream_worker, s) != 0) {
        fprintf(stderr, "fake cuda: cannot start a stream's thread\n");
        abort();
    }
}

static void stop_worker(struct CUstream_st *s) {
    pthread_mutex_lock(&work_mu);
    s->quit = 1;
    pthread_cond_broadcast(&work_cv);
    pthread_mutex_unlock(&work_mu);
    pthread_join(s->worker, NULL);
}

/* Queue w on s (an owned op, or a record or wait). */
static void push(struct CUstream_st *s, Work *w) {
    pthread_mutex_lock(&work_mu);
    w->next = NULL;
    if (s->last) s->last->next = w;
    else s->head = w;
    s->last = w;
    pthread_cond_broadcast(&work_cv);
    pthread_mutex_unlock(&work_mu);
}

/* Wait until s's queue has run. */
static void drain(struct CUstream_st *s) {
    pthread_mutex_lock(&work_mu);
    while (s->head) pthread_cond_wait(&work_cv, &work_mu);
    pthread_mutex_unlock(&work_mu);
}

/* Every stream's queue (blocking_only: the blocking streams', as the legacy stream waits for). */
static void drain_streams(int blocking_only) {
    for (int i = 0; i < streams.n; i++) {
        struct CUstream_st *t = streams.v[i];
        if (!blocking_only || !(t->flags & CU_STREAM_NON_BLOCKING)) drain(t);
    }
}
static void drain_all(void) { drain_streams(0); }

/* Before work on s runs on the calling thread. */
static void drain_for(struct CUstream_st *s) {
    if (s == &legacy_stream) drain_streams(1);
    else drain(s);
}

static int pageable(const void *p) {
    pthread_mutex_lock(&work_mu);
    int host = !find_alloc((uintptr_t)p, 0) && !find_alloc((uintptr_t)p, 1);
    pthread_mutex_unlock(&work_mu);
    return host;
}

/* Run op on stream s (outside a capture): queued, or here; a kernel's
 * fault is not returned but reported at the next synchronisation. */
static CUresult run_eager(struct CUstream_st *s, const Op *op) {
    if (sticky()) return sticky();
    hb_eager(s, op);
    int here = s == &legacy_stream || launch_blocking || op->kind == OP_HOST || (op->kind == OP_COPY && pageable(op->dst));
    if (!here) {
        Work *w = xrealloc(NULL, sizeof *w);
        *w = (Work){.op = *op};
        own(&w->op);
        if (w->op.kind == OP_COPY && pageable(w->op.src)) {
            w->op.data = xrealloc(NULL, w->op.bytes);
            memcpy(w->op.data, w->op.src, w->op.bytes);
            w->op.src = w->op.data;
        }
        push(s, w);
        return CUDA_SUCCESS;
    }
    drain_for(s);
    CUresult r = run_op(op);
    return deferred(op, r) ? CUDA_SUCCESS : r;
}

/* Event times are virtual, so that a trace from events is the same every
 * run: each stream keeps a clock that every op enqueued on it outside a
 * capture advances by a cost of its own shape (a kernel 2 us plus 1 ns per
 * thread, a copy or set 1 us plus 1 ns per 16 bytes, a host op 1 us); a
 * record reads the stream's clock, a wait moves the waiting stream's clock
 * up to the event's.  So cuEventElapsedTime is deterministic and ordered
 * like the work, never the host's timing. */
static double op_cost_ms(const Op *op) {
    switch (op->kind) {
    case OP_KERNEL: {
        double threads = (double)op->grid[0] * op->grid[1] * op->grid[2] * op->block[0] * op->block[1] * op->block[2];
        return 2e-3 + threads * 1e-6;
    }
    case OP_COPY: case OP_SET: return 1e-3 + (double)op->bytes / 16 * 1e-6;
    default: return 1e-3;
    }
}

/* Run op on stream h now, or record it when h captures. */
static CUresult enqueue(CUstream h, const char *call, Op *op) {
    struct CUstream_st *s;
    CUresult r = stream_of(h, call, &s);
    if (r) return r;
    op->stream = s->id;
    if (s->capture) {
        Capture *c = s->capture;
        if (c->invalid)
            return fail(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "%s on stream %d: its capture was invalidated", call,
                        s->id);
        own(op);
        ints_union(&op->deps, &s->tail);
        if (c->nops == c->cap) c->ops = xrealloc(c->ops, sizeof(Op) * (size_t)(c->cap = c->cap ? 2 * c->cap : 64));
        c->ops[c->nops] = *op;
        s->tail.n = 0;
        ints_add(&s->tail, c->nops++);
        return CUDA_SUCCESS;
    }
    if (s == &legacy_stream && (r = legacy_allowed(call))) return r;
    s->clock_ms += op_cost_ms(op);
    return run_eager(s, op);
}

/* The capture ends: every stream and event leaves it. */
static void end_capture(Capture *c) {
    for (int i = 0; i < streams.n; i++) {
        struct CUstream_st *s = streams.v[i];
        if (s->capture == c) {
            s->capture = NULL;
            s->tail.n = 0;
        }
    }
    for (int i = 0; i < events.n; i++) {
        struct CUevent_st *e = events.v[i];
        if (e->capture == c) {
            e->capture = NULL;
            e->deps.n = 0;
        }
    }
    ptrs_remove(&captures, c);
}

/* Every recorded op that nothing depends on must be an ancestor of the
 * origin stream's tail: the forks are joined back. */
static CUresult check_joined(const Capture *c) {
    int n = c->nops;
    char *has_successor = calloc((size_t)n + 1, 1), *joined = calloc((size_t)n + 1, 1);
    int *stack = xrealloc(NULL, sizeof(int) * ((size_t)n + 1)), top = 0;
    if (!has_successor || !joined) abort();
    for (int i = 0; i < n; i++)
        for (int j = 0; j < c->ops[i].deps.n; j++) has_successor[c->ops[i].deps.v[j]] = 1;
    for (int i = 0; i < c->origin->tail.n; i++) stack[top++] = c->origin->tail.v[i];
    while (top > 0) {
        int i = stack[--top];
        if (joined[i]) continue;
        joined[i] = 1;
        for (int j = 0; j < c->ops[i].deps.n; j++)
            if (!joined[c->ops[i].deps.v[j]]) stack[top++] = c->ops[i].deps.v[j];
    }
    int bad = -1;
    for (int i = 0; i < n && bad < 0; i++)
        if (!has_successor[i] && !joined[i]) bad = i;
    free(has_successor);
    free(joined);
    free(stack);
    if (bad < 0) return CUDA_SUCCESS;
    const Op *op = &c->ops[bad];
    return fail(CUDA_ERROR_STREAM_CAPTURE_UNJOINED,
                "cuStreamEndCapture on stream %d: work %d (%s) on stream %d is not joined back into it "
                "(record an event after it and wait on it on the origin stream)",
                c->origin->id, bad, op->kind == OP_KERNEL ? op->f->kernel->name : op->kind == OP_HOST ? op->what : "copy/memset",
                op->stream);
}

/* ---- the exit report (KILN_FAKE_CUDA_STRICT=1) ---- */

__attribute__((destructor)) static void exit_report(void) {
    fflush(NULL);
    print_profile();
    if (!env_flag("KILN_FAKE_CUDA_STRICT")) return;
    int problems = bad_frees + races + failed_lookups;
    int dev = 0, host = 0;
    unsigned long long dev_bytes = 0, host_bytes = 0;
    for (int i = 0; i < nallocs; i++) {
        if (allocs[i].host) host++, host_bytes += allocs[i].size;
        else dev++, dev_bytes += allocs[i].size;
    }
    fflush(NULL);
    if (dev) fprintf(stderr, "fake cuda: leak: %d device allocations (%llu bytes) never freed\n", dev, dev_bytes);
    if (host) fprintf(stderr, "fake cuda: leak: %d host allocations (%llu bytes) never freed\n", host, host_bytes);
    const struct {
        const char *what;
        int n;
    } live[] = {{"streams", streams.n}, {"events", events.n}, {"modules", modules.n}, {"graphs", graphs.n},
                {"graph execs", execs.n}};
    for (size_t i = 0; i < sizeof live / sizeof *live; i++)
        if (live[i].n) fprintf(stderr, "fake cuda: leak: %d %s never destroyed\n", live[i].n, live[i].what), problems++;
    if (bad_frees) fprintf(stderr, "fake cuda: %d bad frees (double free or never allocated)\n", bad_frees);
    if (races) fprintf(stderr, "fake cuda: %d races between streams (the happens-before check; see the race: lines)\n", races);
    if (failed_lookups)
        fprintf(stderr, "fake cuda: %d failed cuModuleGetFunction lookups (a name the module does not have: CUDA_ERROR_NOT_FOUND, "
                        "which compute-sanitizer memcheck reports as API errors; see the failed lookup: lines)\n", failed_lookups);
    problems += dev + host;
    if (problems) {
        fprintf(stderr, "fake cuda: KILN_FAKE_CUDA_STRICT=1: exit status 1\n");
        _exit(1);
    }
}

/* ======================== the driver API ======================== */

/* ---- errors ---- */

CUresult cuGetErrorString(CUresult error, const char **pStr) {
    const ErrorText *t = error_text(error);
    if (!pStr) return CUDA_ERROR_INVALID_VALUE;
    *pStr = t ? t->text : NULL;
    return t ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorName(CUresult error, const char **pStr) {
    const ErrorText *t = error_text(error);
    if (!pStr) return CUDA_ERROR_INVALID_VALUE;
    *pStr = t ? t->name : NULL;
    return t ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ---- initialisation, device, context ---- */

static int device_count(void) {
    const char *v = getenv("KILN_FAKE_CUDA_DEVICES");
    return v && strcmp(v, "0") == 0 ? 0 : 1;
}

CUresult cuInit(unsigned int Flags) {
    API_LOCKED;
    if (Flags != 0) return fail(CUDA_ERROR_INVALID_VALUE, "cuInit(%u): flags must be 0", Flags);
    initialized = 1;
    profiling = env_flag("KILN_FAKE_CUDA_PROFILE");
    launch_blocking = env_flag("CUDA_LAUNCH_BLOCKING");
    read_planted_fault();
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count) {
    API_LOCKED;
    if (!initialized) return fail(CUDA_ERROR_NOT_INITIALIZED, "%s before cuInit", __func__);
    if (!count) return fail(CUDA_ERROR_INVALID_VALUE, "%s: count is NULL", __func__);
    *count = device_count();
    return CUDA_SUCCESS;
}

static CUresult check_device(const char *call, CUdevice dev) {
    if (!initialized) return fail(CUDA_ERROR_NOT_INITIALIZED, "%s before cuInit", call);
    if (dev < 0 || dev >= device_count()) return fail(CUDA_ERROR_INVALID_DEVICE, "%s: no device %d", call, dev);
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    API_LOCKED;
    CUresult r = check_device(__func__, ordinal);
    if (r) return r;
    if (!device) return fail(CUDA_ERROR_INVALID_VALUE, "%s: device is NULL", __func__);
    *device = ordinal;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
    API_LOCKED;
    CUresult r = check_device(__func__, dev);
    if (r) return r;
    if (!name || len <= 0) return fail(CUDA_ERROR_INVALID_VALUE, "%s: no buffer", __func__);
    snprintf(name, (size_t)len, "%s", FAKE_DEVICE_NAME);
    return CUDA_SUCCESS;
}

/* an H100 SXM's values */
static int attribute_value(CUdevice_attribute a, int *v) {
    switch (a) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = DEVICE_ARCH / 10; return 0;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = DEVICE_ARCH % 10; return 0;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = 132; return 0;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *v = 1024; return 0;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: *v = 1024; return 0;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: *v = 1024; return 0;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: *v = 64; return 0;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: *v = 2147483647; return 0;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: *v = 65535; return 0;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: *v = 65535; return 0;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *v = 32; return 0;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: *v = DEFAULT_DYNAMIC_SMEM; return 0;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *v = MAX_DYNAMIC_SMEM; return 0;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: *v = 228 * 1024; return 0;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: *v = 65536; return 0;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR: *v = 65536; return 0;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: *v = 2048; return 0;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR: *v = 32; return 0;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: *v = 65536; return 0;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: *v = 1980000; return 0;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: *v = 2619000; return 0;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: *v = 5120; return 0;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: *v = 50 * 1024 * 1024; return 0;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: *v = 1; return 0;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: *v = 1; return 0;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: *v = 3; return 0;
    case CU_DEVICE_ATTRIBUTE_INTEGRATED: *v = 0; return 0;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: *v = 1; return 0;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_MODE: *v = CU_COMPUTEMODE_DEFAULT; return 0;
    case CU_DEVICE_ATTRIBUTE_ECC_ENABLED: *v = 1; return 0;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: *v = 0x18; return 0;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: *v = 0; return 0;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: *v = 0; return 0;
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: *v = 1; return 0;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: *v = 1; return 0;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: *v = 1; return 0;
    case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED: *v = 1; return 0;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED: *v = 1; return 0;
    case CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED: *v = 1; return 0;
    case CU_DEVICE_ATTRIBUTE_TCC_DRIVER: *v = 0; return 0;
    case CU_DEVICE_ATTRIBUTE_KERNEL_EXEC_TIMEOUT: *v = 0; return 0;
    case CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD: *v = 0; return 0;
    default: return -1;
    }
}

CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev) {
    API_LOCKED;
    CUresult r = check_device(__func__, dev);
    if (r) return r;
    if (!pi) return fail(CUDA_ERROR_INVALID_VALUE, "%s: pi is NULL", __func__);
    if (attribute_value(attrib, pi) != 0)
        return fail(CUDA_ERROR_INVALID_VALUE, "%s: attribute %d is not emulated (tests/cuda_fake/fake_cuda.c: attribute_value)",
                    __func__, (int)attrib);
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    API_LOCKED;
    CUresult r = check_device(__func__, dev);
    if (r) return r;
    if (!pctx) return fail(CUDA_ERROR_INVALID_VALUE, "%s: pctx is NULL", __func__);
    primary.retains++;
    *pctx = &primary;
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
    API_LOCKED;
    CUresult r = check_device(__func__, dev);
    if (r) return r;
    if (primary.retains == 0) return fail(CUDA_ERROR_INVALID_CONTEXT, "%s: the primary context is not retained", __func__);
    if (--primary.retains == 0) {
        drain_all();
        set_sticky(CUDA_SUCCESS); /* the context is destroyed with its error */
    }
    return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
    API_LOCKED;
    if (!initialized) return fail(CUDA_ERROR_NOT_INITIALIZED, "%s before cuInit", __func__);
    if (ctx && (ctx != &primary || primary.retains == 0))
        return fail(CUDA_ERROR_INVALID_CONTEXT, "%s(%p): not the retained primary context", __func__, (void *)ctx);
    current_ctx = ctx;
    return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize(void) {
    API_LOCKED;
    CUresult r = need_ctx(__func__);
    if (r || (r = capture_forbids(__func__))) return r;
    drain_all();
    hb_host_waits(&legacy_stream.vc);
    for (int i = 0; i < streams.n; i++) hb_host_waits(&((struct CUstream_st *)streams.v[i])->vc);
    return sticky();
}

/* ---- memory ---- */

CUresult cuMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    API_LOCKED;
    CUresult r = need_ctx(__func__);
    if (r) return r;
    if (!free_bytes || !total_bytes) return fail(CUDA_ERROR_INVALID_VALUE, "%s: NULL argument", __func__);
    *total_bytes = TOTAL_MEMORY;
    *free_bytes = TOTAL_MEMORY - device_bytes;
    return CUDA_SUCCESS;
}

CUresult cuMemAlloc(CUdeviceptr *dptr, size_t bytesize) {
    API_LOCKED;
    CUresult r = need_ctx(__func__);
    if (r) return r;
    if (!dptr || bytesize == 0)
        return fail(CUDA_ERROR_INVALID_VALUE, "%s: %s", __func__, !dptr ? "dptr is NULL" : "0 bytes (CUDA refuses it)");
    if ((r = capture_forbids(__func__))) return r;
    if (sticky()) return sticky();
    void *p = bytesize <= TOTAL_MEMORY - device_bytes ? alloc_aligned(bytesize) : NULL;
    if (!p)
        return fail(CUDA_ERROR_OUT_OF_MEMORY, "%s(%zu bytes): %llu of %llu bytes in use", __func__, bytesize, device_bytes,
                    TOTAL_MEMORY);
    if (env_flag("KILN_FAKE_CUDA_STRICT")) memset(p, 0xff, bytesize);
    add_alloc(p, bytesize, 0);
    *dptr = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}

CUresult cuMemFree(CUdeviceptr dptr) {
    API_LOCKED;
    CUresult r = need_ctx(__func__);
    if (r) return r;
    if (dptr == 0) return CUDA_SUCCESS;
    if ((r = capture_forbids(__func__))) return r;
    drain_all(); /* cuMemFree synchronises */
    return free_alloc(__func__, (uintptr_t)dptr, 0);
}

CUresult cuMemAllocHost(void **pp, size_t bytesize) {
    API_LOCKED;
    CUresult r = need_ctx(__func__);
    if (r) return r;
    if (!pp || bytesize == 0)
        return fail(CUDA_ERROR_INVALID_VALUE, "%s: %s", __func__, !pp ? "pp is NULL" : "0 bytes (CUDA refuses it)");
    if ((r = capture_forbids(__func__))) return r;
    if (sticky()) return sticky();
    void *p = alloc_aligned(bytesize);
    if (!p) return fail(CUDA_ERROR_OUT_OF_MEMORY, "%s(%zu bytes)", __func__, bytesize);
    add_alloc(p, bytesize, 1);
    *pp = p;
    return CUDA_SUCCESS;
}

CUresult cuMemFreeHost(void *p) {
    API_LOCKED;
    CUresult r = need_ctx(__func__);
    if (r) return r;
    if ((r = capture_forbids(__func__))) return r;
    drain_all();
    return free_alloc(__func__, (uintptr_t)p, 1);
}

/* The synchronous copies and memset: unsafe during capture, run on the legacy stream. */
static CUresult sync_op(const char *call, Op *op) {
    CUresult r = need_ctx(call);
    if (r || (r = capture_forbids(call))) return r;
    r = run_eager(&legacy_stream, op);
    hb_host_waits(&legacy_stream.vc);
    return r;
}

CUresult cuMemcpyHtoD(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount) {
    API_LOCKED;
    CUresult r = check_range(__func__, "destination", dstDevice, ByteCount);
    Op op = {.kind = OP_COPY, .dst = (void *)(uintptr_t)dstDevice, .src = srcHost, .bytes = ByteCount};
    return r ? r : sync_op(__func__, &op);
}

CUresult cuMemcpyDtoH(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount) {
    API_LOCKED;
    CUresult r = check_range(__func__, "source", srcDevice, ByteCount);
    Op op = {.kind = OP_COPY, .dst = dstHost, .src = (const void *)(uintptr_t)srcDevice, .bytes = ByteCount};
    return r ? r : sync_op(__func__, &op);
}

CUresult cuMemsetD8(CUdeviceptr dstDevice, unsigned char uc, size_t N) {
    API_LOCKED;
    CUresult r = check_range(__func__, "destination", dstDevice, N);
    Op op = {.kind = OP_SET, .dst = (void *)(uintptr_t)dstDevice, .value = uc, .bytes = N};
    return r ? r : sync_op(__func__, &op);
}

static CUresult async_op(const char *call, CUstream s, Op *op) {
    CUresult r = need_ctx(call);
    return r ? r : enqueue(s, call, op);
}

CUresult cuMemcpyHtoDAsync(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream) {
    API_LOCKED;
    CUresult r = check_range(__func__, "destination", dstDevice, ByteCount);
    Op op = {.kind = OP_COPY, .dst = (void *)(uintptr_t)dstDevice, .src = srcHost, .bytes = ByteCount, .what = "a copy (cuMemcpyHtoDAsync)"};
    return r ? r : async_op(__func__, hStream, &op);
}

CUresult cuMemcpyDtoHAsync(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream) {
    API_LOCKED;
    CUresult r = check_range(__func__, "source", srcDevice, ByteCount);
    Op op = {.kind = OP_COPY, .dst = dstHost, .src = (const void *)(uintptr_t)srcDevice, .bytes = ByteCount, .what = "a copy (cuMemcpyDtoHAsync)"};
    return r ? r : async_op(__func__, hStream, &op);
}

CUresult cuMemcpyDtoDAsync(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream) {
    API_LOCKED;
    CUresult r = check_range(__func__, "destination", dstDevice, ByteCount);
    if (!r) r = check_range(__func__, "source", srcDevice, ByteCount);
    Op op = {.kind = OP_COPY, .dst = (void *)(uintptr_t)dstDevice, .src = (const void *)(uintptr_t)srcDevice,
             .bytes = ByteCount};
    return r ? r : async_op(__func__, hStream, &op);
}

CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream) {
    API_LOCKED;
    CUresult r = check_range(__func__, "destination", dstDevice, N);
    Op op = {.kind = OP_SET, .dst = (void *)(uintptr_t)dstDevice, .value = uc, .bytes = N};
    return r ? r : async_op(__func__, hStream, &op);
}

/* ---- modules and kernels ---- */

CUresult cuModuleLoadData(CUmodule *module, const void *image) {
    API_LOCKED;
    CUresult r = need_ctx(__func__);
    if (r) return r;
    if (!module || !image) return fail(CUDA_ERROR_INVALID_VALUE, "%s: NULL argument", __func__);
    size_t size = 0;
    if ((r = cubin_check(image, &size))) return r;
    struct CUmod_st *m = xrealloc(NULL, sizeof *m);
    m->image = xrealloc(NULL, size);
    memcpy(m->image, image, size);
    m->size = size;
    ptrs_add(&modules, m);
    *module = m;
    return CUDA_SUCCESS;
}

CUresult cuModuleUnload(CUmodule hmod) {
    API_LOCKED;
    CUresult r = need_ctx(__func__);
    if (r) return r;
    if (!ptrs_has(&modules, hmod)) return fail(CUDA_ERROR_INVALID_HANDLE, "%s: %p is not a loaded module", __func__, (void *)hmod);
    drain_all();
    for (int i = functions.n - 1; i >= 0; i--) {
        struct CUfunc_st *f = functions.v[i];
        if (f->mod == hmod) {
            ptrs_remove(&functions, f);
            free(f);
        }
    }
    ptrs_remove(&modules, hmod);
    free(hmod->image);
    free(hmod);
    return CUDA_SUCCESS;
}

/* 0 when the cubin's parameter sizes for `name` match the emulated kernel's
 * (or cannot be read), else -1 with why. */
static int check_params_quiet(const char *name, const CUmodule m, const KilnFakeKernel *k, char *why, size_t whylen) {
    size_t sizes[256];
    int n = cubin_param_sizes(m->image, name, sizes, 256);
    if (n < 0) return 0;
    int same = n == k->nparams;
    for (int i = 0; same && i < n; i++) same = sizes[i] == k->param_sizes[i];
    if (same) return 0;
    snprintf(why, whylen, "the cubin's parameter sizes (%d) differ from the emulated kernel's (%d): the kernel library was "
             "built from other sources", n, k->nparams);
    return -1;
}

static CUresult check_params(const char *name, const CUmodule m, const KilnFakeKernel *k) {
    size_t sizes[256];
    int n = cubin_param_sizes(m->image, name, sizes, 256);
    if (n < 0) return CUDA_SUCCESS; /* unreadable: nothing to compare */
    int same = n == k->nparams;
    for (int i = 0; same && i < n; i++) same = sizes[i] == k->param_sizes[i];
    if (same) return CUDA_SUCCESS;
    char cubin[512] = "", emulated[512] = "";
    for (int i = 0; i < n; i++) snprintf(cubin + strlen(cubin), sizeof cubin - strlen(cubin), " %zu", sizes[i]);
    for (int i = 0; i < k->nparams; i++)
        snprintf(emulated + strlen(emulated), sizeof emulated - strlen(emulated), " %zu", k->param_sizes[i]);
    return fail(CUDA_ERROR_INVALID_IMAGE,
                "cuModuleGetFunction(%s): the cubin's parameter sizes (%d:%s) differ from the emulated kernel's (%d:%s): "
                "the kernel library was built from other sources",
                name, n, cubin, k->nparams, emulated);
}

/* The handle for kernel `name` of module hmod (one per module and name):
 * CUDA_SUCCESS with *out, or the error (with its message unless quiet, the
 * enumeration's case, which records the defect in the handle instead). */
static CUresult module_function(CUmodule hmod, const char *name, struct CUfunc_st **out, int enumerating) {
    for (int i = 0; i < functions.n; i++) {
        struct CUfunc_st *f = functions.v[i];
        if (f->mod == hmod && strcmp(f->name, name) == 0) {
            if (!enumerating && f->defect) return fail(f->defect, "cuModuleGetFunction(%s): %s", name, f->defect_why);
            *out = f;
            return CUDA_SUCCESS;
        }
    }
    if (strlen(name) >= sizeof ((struct CUfunc_st *)0)->name)
        return fail(CUDA_ERROR_INVALID_VALUE, "cuModuleGetFunction: name too long for the fake");
    CUresult defect = CUDA_SUCCESS;
    char why[1536] = "";
    const Registered *reg = NULL;
    if (load_registry() != 0) {
        defect = CUDA_ERROR_NOT_FOUND;
        snprintf(why, sizeof why, "%.1100s", registry_error);
    } else if (!(reg = find_kernel(name))) {
        defect = CUDA_ERROR_NOT_FOUND;
        snprintf(why, sizeof why, "in the cubin, but no emulated kernel of that name in KILN_FAKE_CUDA_KERNELS (%.1100s)",
                 getenv("KILN_FAKE_CUDA_KERNELS"));
    } else if (!enumerating) {
        CUresult r = check_params(name, hmod, reg->kernel);
        if (r) return r;
    } else if (check_params_quiet(name, hmod, reg->kernel, why, sizeof why)) {
        defect = CUDA_ERROR_INVALID_IMAGE;
    }
    if (defect && !enumerating) return fail(defect, "cuModuleGetFunction(%s): %s", name, why);
    struct CUfunc_st *f = xrealloc(NULL, sizeof *f);
    f->mod = hmod;
    f->kernel = defect ? NULL : reg->kernel;
    f->max_dynamic_smem = DEFAULT_DYNAMIC_SMEM;
    snprintf(f->name, sizeof f->name, "%s", name);
    f->defect = defect;
    snprintf(f->defect_why, sizeof f->defect_why, "%s", why);
    ptrs_add(&functions, f);
    *out = f;
    return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name) {
    API_LOCKED;
    CUresult r = need_ctx(__func__);
    if (r) return r;
    if (!hfunc || !name) return fail(CUDA_ERROR_INVALID_VALUE, "%s: NULL argument", __func__);
    if (!ptrs_has(&modules, hmod)) return fail(CUDA_ERROR_INVALID_HANDLE, "%s(%s): not a loaded module", __func__, name);
    if (!cubin_has_kernel(hmod->image, name)) {
        /* a real driver says nothing; memcheck reports it */
        failed_lookups++;
        if (env_flag("KILN_FAKE_CUDA_STRICT"))
            fprintf(stderr, "fake cuda: failed lookup: cuModuleGetFunction(%s) on a module without it (CUDA_ERROR_NOT_FOUND; "
                            "compute-sanitizer memcheck reports this as an API error)\n", name);
        return CUDA_ERROR_NOT_FOUND;
    }
    return module_function(hmod, name, hfunc, 0);
}

/* the cubin's kernels (entry functions), in symbol-table order: the count,
 * and the first `max` names into names[] (when names is not NULL) */
static unsigned cubin_kernels(const unsigned char *img, const char **names, unsigned max) {
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)img;
    unsigned n = 0;
    for (int i = 0; i < eh->e_shnum; i++) {
        const Elf64_Shdr *sh = section(img, i);
        if (sh->sh_type != SHT_SYMTAB || sh->sh_entsize != sizeof(Elf64_Sym) || sh->sh_link >= eh->e_shnum) continue;
        const char *strtab = (const char *)img + section(img, (int)sh->sh_link)->sh_offset;
        const Elf64_Sym *sym = (const Elf64_Sym *)(img + sh->sh_offset);
        for (size_t j = 0; j < sh->sh_size / sizeof *sym; j++)
            if (sym_is_kernel(&sym[j])) {
                if (names && n < max) names[n] = strtab + sym[j].st_name;
                n++;
            }
    }
    return n;
}

CUresult cuModuleGetFunctionCount(unsigned int *count, CUmodule mod) {
    API_LOCKED;
    CUresult r = need_ctx(__func__);
    if (r) return r;
    if (!count) return fail(CUDA_ERROR_INVALID_VALUE, "%s: NULL argument", __func__);
    if (!ptrs_has(&modules, mod)) return fail(CUDA_ERROR_INVALID_HANDLE, "%s: %p is not a loaded module", __func__, (void *)mod);
    *count = cubin_kernels(mod->image, NULL, 0);
    return CUDA_SUCCESS;
}

/* Handles for the module's kernels.  One the fake cannot run (no emulated
 * kernel of that name, or other parameters than the cubin's) is still
 * listed, as a real driver lists it, and fails at cuLaunchKernel. */
CUresult cuModuleEnumerateFunctions(CUfunction *functions_out, unsigned int numFunctions, CUmodule mod) {
    API_LOCKED;
    CUresult r = need_ctx(__func__);
    if (r) return r;
    if (!functions_out && numFunctions) return fail(CUDA_ERROR_INVALID_VALUE, "%s: NULL argument", __func__);
    if (!ptrs_has(&modules, mod)) return fail(CUDA_ERROR_INVALID_HANDLE, "%s: %p is not a loaded module", __func__, (void *)mod);
    unsigned n = cubin_kernels(mod->image, NULL, 0);
    if (numFunctions != n)
        return fail(CUDA_ERROR_INVALID_VALUE, "%s: numFunctions %u; the module has %u (cuModuleGetFunctionCount)", __func__,
                    numFunctions, n);
    const char **names = xrealloc(NULL, (n ? n : 1) * sizeof *names);
    cubin_kernels(mod->image, names, n);
    for (unsigned i = 0; i < n; i++)
        if ((r = module_function(mod, names[i], &functions_out[i], 1))) break;
    free(names);
    return r;
}

CUresult cuFuncGetName(const char **name, CUfunction hfunc) {
    API_LOCKED;
    CUresult r = need_ctx(__func__);
    if (r) return r;
    if (!name) return fail(CUDA_ERROR_INVALID_VALUE, "%s: NULL argument", __func__);
    if (!ptrs_has(&functions, hfunc)) return fail(CUDA_ERROR_INVALID_HANDLE, "%s: %p is not a live function", __func__, (void *)hfunc);
    *name = hfunc->name;
    return CUDA_SUCCESS;
}

CUresult cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib, int value) {
    API_LOCKED;
    CUresult r = need_ctx(__func__);
    if (r) return r;
    if (!ptrs_has(&functions, hfunc)) return fail(CUDA_ERROR_INVALID_HANDLE, "%s: not a live function", __func__);
    if (attrib == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) {
        if (value < 0 || value > MAX_DYNAMIC_SMEM)
            return fail(CUDA_ERROR_INVALID_VALUE, "%s(%s, MAX_DYNAMIC_SHARED_SIZE_BYTES, %d): sm_90 allows at most %d",
                        __func__, hfunc->name, value, MAX_DYNAMIC_SMEM);
        hfunc->max_dynamic_smem = value;
        return CUDA_SUCCESS;
    }
    if (attrib == CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT) return CUDA_SUCCESS; /* a hint */
    return fail(CUDA_ERROR_INVALID_VALUE, "%s(%s): attribute %d is not emulated (the contract sets only MAX_DYNAMIC_SHARED_SIZE_BYTES)",
                __func__, hfunc->name, (int)attrib);
}

CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                        unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                        unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra) {
    API_LOCKED;
    CUresult r = need_ctx(__func__);
    if (r) return r;
    if (!ptrs_has(&functions, f)) return fail(CUDA_ERROR_INVALID_HANDLE, "%s: %p is not a live function", __func__, (void *)f);
    if (f->defect) return fail(f->defect, "%s(%s): %s", __func__, f->name, f->defect_why);
    const KilnFakeKernel *k = f->kernel;
    if (extra) return fail(CUDA_ERROR_NOT_SUPPORTED, "%s(%s): `extra` is not emulated (use kernelParams)", __func__, f->name);
    if (!kernelParams && k->nparams > 0)
        return fail(CUDA_ERROR_INVALID_VALUE, "%s(%s): kernelParams is NULL, the kernel takes %d", __func__, f->name, k->nparams);
    unsigned long long threads = (unsigned long long)blockDimX * blockDimY * blockDimZ;
    const char *bad = !gridDimX || !gridDimY || !gridDimZ                             ? "a grid dimension is 0"
                      : gridDimX > 2147483647u || gridDimY > 65535 || gridDimZ > 65535 ? "the grid is too large"
                      : !blockDimX || !blockDimY || !blockDimZ                         ? "a block dimension is 0"
                      : blockDimX > 1024 || blockDimY > 1024 || blockDimZ > 64 || threads > 1024
                          ? "the block is too large"
                          : NULL;
    if (bad)
        return fail(CUDA_ERROR_INVALID_VALUE, "%s(%s) grid (%u,%u,%u) block (%u,%u,%u): %s", __func__, f->name, gridDimX,
                    gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, bad);
    if (threads > (unsigned long long)k->max_threads)
        return fail(CUDA_ERROR_INVALID_VALUE, "%s(%s): a block of %llu threads; its __launch_bounds__ allow %d", __func__,
                    f->name, threads, k->max_threads);
    if ((int)sharedMemBytes > f->max_dynamic_smem || sharedMemBytes > MAX_DYNAMIC_SMEM)
        return fail(CUDA_ERROR_INVALID_VALUE,
                    "%s(%s): %u bytes of dynamic shared memory, above the function's limit of %d "
                    "(cuFuncSetAttribute CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES raises it, up to %d)",
                    __func__, f->name, sharedMemBytes, f->max_dynamic_smem, MAX_DYNAMIC_SMEM);
    Op op = {.kind = OP_KERNEL,
             .f = f,
             .grid = {gridDimX, gridDimY, gridDimZ},
             .block = {blockDimX, blockDimY, blockDimZ},
             .smem = sharedMemBytes,
             .params = kernelParams};
    return enqueue(hStream, __func__, &op);
}

/* ---- streams ---- */

CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags) {
    API_LOCKED;
    CUresult r = need_ctx(__func__);
    if (r) return r;
    if (!phStream) return fail(CUDA_ERROR_INVALID_VALUE, "%s: phStream is NULL", __func__);
    if (Flags & ~(unsigned)CU_STREAM_NON_BLOCKING) return fail(CUDA_ERROR_INVALID_VALUE, "%s: flags 0x%x", __func__, Flags);
    struct CUstream_st *s = xrealloc(NULL, sizeof *s);
    *s = (struct CUstream_st){.flags = Flags, .id = next_stream_id++, .lane = new_lane()};
    start_worker(s);
    ptrs_add(&streams, s);
    *phStream = s;
    return CUDA_SUCCESS;
}

CUresult cuStreamDestroy(CUstream hStream) {
    API_LOCKED;
    CUresult r = need_ctx(__func__);
    if (r) return r;
    if (!ptrs_has(&streams, hStream))
        return fail(CUDA_ERROR_INVALID_HANDLE, "%s: %p is not a live stream", __func__, (void *)hStream);
    if (hStream->capture)
        return fail(CUDA_ERROR_ILLEGAL_STATE, "%s: stream %d is being captured", __func__, hStream->id);
    drain(hStream);
    stop_worker(hStream);
    ptrs_remove(&streams, hStream);
    ints_free(&hStream->tail);
    free(hStream);
    return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize(CUstream hStream) {
    API_LOCKED;
    struct CUstream_st *s;
    CUresult r = need_ctx(__func__);
    if (r || (r = stream_of(hStream, __func__, &s))) return r;
    if (s->capture) {
        s->capture->invalid = 1;
        return fail(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "%s: stream %d is being captured; the capture is invalidated",
                    __func__, s->id);
    }
    if (s == &legacy_stream && (r = capture_forbids(__func__))) return r;
    drain_for(s);
    hb_host_waits(&s->vc);
    return sticky();
}

/* s waits for e's last record (outside a capture). */
static void wait_event(struct CUstream_st *s, struct CUevent_st *e) {
    vc_join(&s->vc, &e->vc);
    pthread_mutex_lock(&work_mu);
    Signal *g = e->signal;
    if (g && !g->done && s == &legacy_stream) /* the legacy stream's work runs here: wait now */
        while (!g->done) pthread_cond_wait(&work_cv, &work_mu);
    else if (g && !g->done) {
        g->refs++;
        Work *w = xrealloc(NULL, sizeof *w);
        *w = (Work){.wait = g};
        pthread_mutex_unlock(&work_mu);
        push(s, w);
        return;
    }
    pthread_mutex_unlock(&work_mu);
}

/* e is recorded on s (outside a capture): done when s's queue reaches it. */
static void record_event(struct CUstream_st *s, struct CUevent_st *e) {
    if (s == &legacy_stream) drain_streams(1);
    Signal *g = signal_new(s == &legacy_stream, 1 + (s != &legacy_stream));
    pthread_mutex_lock(&work_mu);
    signal_put(e->signal);
    e->signal = g;
    pthread_mutex_unlock(&work_mu);
    if (s == &legacy_stream) return;
    Work *w = xrealloc(NULL, sizeof *w);
    *w = (Work){.record = g};
    push(s, w);
}

CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags) {
    API_LOCKED;
    struct CUstream_st *s;
    CUresult r = need_ctx(__func__);
    if (r || (r = stream_of(hStream, __func__, &s))) return r;
    if (!ptrs_has(&events, hEvent)) return fail(CUDA_ERROR_INVALID_HANDLE, "%s: %p is not a live event", __func__, (void *)hEvent);
    if (Flags != 0) return fail(CUDA_ERROR_NOT_SUPPORTED, "%s: flags 0x%x are not emulated", __func__, Flags);
    Capture *c = hEvent->capture;
    if (!c) { /* the planted bug forgets the wait */
        if (s == &legacy_stream && (r = legacy_allowed(__func__))) return r;
        if (!env_flag("KILN_FAKE_CUDA_TEST_DROP_WAIT")) {
            wait_event(s, hEvent);
            if (hEvent->recorded && hEvent->time_ms > s->clock_ms) s->clock_ms = hEvent->time_ms;
        }
        return CUDA_SUCCESS;
    }
    if (s->capture && s->capture != c)
        return fail(CUDA_ERROR_STREAM_CAPTURE_MERGE, "%s: stream %d and the event belong to different captures", __func__,
                    s->id);
    if (s == &legacy_stream)
        return fail(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, "%s: the legacy stream cannot join a capture", __func__);
    if (!s->capture) { /* the stream joins the capture */
        s->capture = c;
        ints_set(&s->tail, &hEvent->deps);
    } else
        ints_union(&s->tail, &hEvent->deps);
    return CUDA_SUCCESS;
}

/* ---- events ---- */

CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags) {
    API_LOCKED;
    CUresult r = need_ctx(__func__);
    if (r) return r;
    if (!phEvent) return fail(CUDA_ERROR_INVALID_VALUE, "%s: phEvent is NULL", __func__);
    unsigned known = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
    if ((Flags & ~known) || ((Flags & CU_EVENT_INTERPROCESS) && !(Flags & CU_EVENT_DISABLE_TIMING)))
        return fail(CUDA_ERROR_INVALID_VALUE, "%s: flags 0x%x", __func__, Flags);
    struct CUevent_st *e = xrealloc(NULL, sizeof *e);
    *e = (struct CUevent_st){.flags = Flags};
    ptrs_add(&events, e);
    *phEvent = e;
    return CUDA_SUCCESS;
}

CUresult cuEventDestroy(CUevent hEvent) {
    API_LOCKED;
    CUresult r = need_ctx(__func__);
    if (r) return r;
    if (!ptrs_has(&events, hEvent)) return fail(CUDA_ERROR_INVALID_HANDLE, "%s: %p is not a live event", __func__, (void *)hEvent);
    ptrs_remove(&events, hEvent);
    ints_free(&hEvent->deps);
    pthread_mutex_lock(&work_mu);
    signal_put(hEvent->signal);
    pthread_mutex_unlock(&work_mu);
    free(hEvent);
    return CUDA_SUCCESS;
}

CUresult cuEventRecord(CUevent hEvent, CUstream hStream) {
    API_LOCKED;
    struct CUstream_st *s;
    CUresult r = need_ctx(__func__);
    if (r || (r = stream_of(hStream, __func__, &s))) return r;
    if (!ptrs_has(&events, hEvent)) return fail(CUDA_ERROR_INVALID_HANDLE, "%s: %p is not a live event", __func__, (void *)hEvent);
    if (s->capture) {
        if (s->capture->invalid)
            return fail(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "%s on stream %d: its capture was invalidated", __func__, s->id);
        hEvent->capture = s->capture;
        ints_set(&hEvent->deps, &s->tail);
        hEvent->recorded = 0;
        return CUDA_SUCCESS;
    }
    if (s == &legacy_stream && (r = legacy_allowed(__func__))) return r;
    vc_join(&s->vc, &host_vc);
    hEvent->vc = s->vc;
    record_event(s, hEvent);
    hEvent->capture = NULL;
    hEvent->deps.n = 0;
    hEvent->recorded = 1;
    hEvent->time_ms = s->clock_ms; /* virtual (op_cost_ms) */
    return CUDA_SUCCESS;
}

CUresult cuEventSynchronize(CUevent hEvent) {
    API_LOCKED;
    CUresult r = need_ctx(__func__);
    if (r) return r;
    if (!ptrs_has(&events, hEvent)) return fail(CUDA_ERROR_INVALID_HANDLE, "%s: %p is not a live event", __func__, (void *)hEvent);
    if (hEvent->capture) {
        hEvent->capture->invalid = 1;
        return fail(CUDA_ERROR_CAPTURED_EVENT, "%s: the event was recorded in an active capture; the capture is invalidated",
                    __func__);
    }
    pthread_mutex_lock(&work_mu);
    while (hEvent->signal && !hEvent->signal->done) pthread_cond_wait(&work_cv, &work_mu);
    pthread_mutex_unlock(&work_mu);
    hb_host_waits(&hEvent->vc);
    return sticky();
}

CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd) {
    API_LOCKED;
    CUresult r = need_ctx(__func__);
    if (r) return r;
    if (!pMilliseconds) return fail(CUDA_ERROR_INVALID_VALUE, "%s: pMilliseconds is NULL", __func__);
    CUevent ev[2] = {hStart, hEnd};
    for (int i = 0; i < 2; i++) {
        if (!ptrs_has(&events, ev[i])) return fail(CUDA_ERROR_INVALID_HANDLE, "%s: %p is not a live event", __func__, (void *)ev[i]);
        if (ev[i]->capture) return fail(CUDA_ERROR_CAPTURED_EVENT, "%s: an event recorded in an active capture", __func__);
        if (ev[i]->flags & CU_EVENT_DISABLE_TIMING)
            return fail(CUDA_ERROR_INVALID_HANDLE, "%s: an event created with CU_EVENT_DISABLE_TIMING", __func__);
        if (!ev[i]->recorded) return fail(CUDA_ERROR_INVALID_HANDLE, "%s: an event never recorded", __func__);
    }
    *pMilliseconds = (float)(hEnd->time_ms - hStart->time_ms);
    return sticky();
}

/* ---- capture and graphs ---- */

CUresult cuStreamBeginCapture(CUstream hStream, CUstreamCaptureMode mode) {
    API_LOCKED;
    struct CUstream_st *s;
    CUresult r = need_ctx(__func__);
    if (r || (r = stream_of(hStream, __func__, &s))) return r;
    if (s == &legacy_stream)
        return fail(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "%s: the legacy stream cannot be captured", __func__);
    if (s->capture) return fail(CUDA_ERROR_ILLEGAL_STATE, "%s: stream %d is already being captured", __func__, s->id);
    if (mode != CU_STREAM_CAPTURE_MODE_GLOBAL && mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
        mode != CU_STREAM_CAPTURE_MODE_RELAXED)
        return fail(CUDA_ERROR_INVALID_VALUE, "%s: mode %d", __func__, (int)mode);
    if (sticky()) return sticky();
    Capture *c = xrealloc(NULL, sizeof *c);
    *c = (Capture){.origin = s, .mode = mode, .thread = pthread_self()};
    ptrs_add(&captures, c);
    s->capture = c;
    s->tail.n = 0;
    return CUDA_SUCCESS;
}

CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph) {
    API_LOCKED;
    struct CUstream_st *s;
    CUresult r = need_ctx(__func__);
    if (r || (r = stream_of(hStream, __func__, &s))) return r;
    if (!phGraph) return fail(CUDA_ERROR_INVALID_VALUE, "%s: phGraph is NULL", __func__);
    Capture *c = s->capture;
    if (!c) return fail(CUDA_ERROR_ILLEGAL_STATE, "%s: stream %d is not being captured", __func__, s->id);
    if (c->origin != s) {
        c->invalid = 1;
        return fail(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, "%s on stream %d: the capture began on stream %d; it is invalidated",
                    __func__, s->id, c->origin->id);
    }
    if (c->mode != CU_STREAM_CAPTURE_MODE_RELAXED && !pthread_equal(c->thread, pthread_self()))
        return fail(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, "%s: the capture began on another thread", __func__);
    r = c->invalid ? fail(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "%s on stream %d: the capture was invalidated by an "
                                                                 "earlier error (see above)",
                          __func__, s->id)
                   : check_joined(c);
    end_capture(c);
    *phGraph = NULL;
    if (r) {
        free_ops(c->ops, c->nops);
        free(c);
        return r;
    }
    struct CUgraph_st *g = xrealloc(NULL, sizeof *g);
    g->ops = c->ops;
    g->nops = c->nops;
    free(c);
    ptrs_add(&graphs, g);
    *phGraph = g;
    return CUDA_SUCCESS;
}

/* The replay order: enqueue order, or (reverse) of the ops whose
 * dependencies have run, the latest enqueued first. */
static int *replay_order(const Op *ops, int n, int reverse) {
    int *order = xrealloc(NULL, sizeof(int) * ((size_t)n + 1));
    char *done = calloc((size_t)n + 1, 1);
    if (!done) abort();
    for (int k = 0; k < n; k++) {
        int pick = -1;
        for (int i = reverse ? n - 1 : 0; reverse ? i >= 0 : i < n; i += reverse ? -1 : 1) {
            if (done[i]) continue;
            int ready = 1;
            for (int j = 0; j < ops[i].deps.n && ready; j++) ready = done[ops[i].deps.v[j]];
            if (ready) {
                pick = i;
                break;
            }
        }
        order[k] = pick; /* deps point backwards, so some op is always ready */
        done[pick] = 1;
    }
    free(done);
    return order;
}

/* Per op, the lane of its stream in a new exec (each of its streams gets
 * one); NULL when the lanes ran out. */
static int *graph_lanes(const Op *ops, int n) {
    int *lanes = xrealloc(NULL, sizeof(int) * ((size_t)n + 1));
    for (int i = 0; i < n; i++) {
        lanes[i] = -2;
        for (int j = 0; j < i && lanes[i] == -2; j++)
            if (ops[j].stream == ops[i].stream) lanes[i] = lanes[j];
        if (lanes[i] == -2 && (lanes[i] = new_lane()) < 0) {
            free(lanes);
            return NULL;
        }
    }
    return lanes;
}

CUresult cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags) {
    API_LOCKED;
    CUresult r = need_ctx(__func__);
    if (r) return r;
    if (!phGraphExec) return fail(CUDA_ERROR_INVALID_VALUE, "%s: phGraphExec is NULL", __func__);
    if (!ptrs_has(&graphs, hGraph)) return fail(CUDA_ERROR_INVALID_HANDLE, "%s: %p is not a live graph", __func__, (void *)hGraph);
    if (flags != 0) return fail(CUDA_ERROR_NOT_SUPPORTED, "%s: flags 0x%llx are not emulated", __func__, flags);
    const char *order = getenv("KILN_FAKE_CUDA_GRAPH_ORDER");
    int reverse = order && strcmp(order, "reverse") == 0;
    if (order && *order && !reverse && strcmp(order, "enqueue") != 0)
        return fail(CUDA_ERROR_INVALID_VALUE, "%s: KILN_FAKE_CUDA_GRAPH_ORDER=%s (expected enqueue or reverse)", __func__, order);
    struct CUgraphExec_st *x = xrealloc(NULL, sizeof *x);
    x->nops = hGraph->nops;
    x->ops = xrealloc(NULL, sizeof(Op) * ((size_t)x->nops + 1));
    for (int i = 0; i < x->nops; i++) x->ops[i] = copy_op(&hGraph->ops[i]);
    x->order = replay_order(x->ops, x->nops, reverse);
    x->serial = order && *order;
    x->lanes = checking_races() ? graph_lanes(x->ops, x->nops) : NULL;
    x->vcs = x->lanes ? xrealloc(NULL, sizeof(VClock) * ((size_t)x->nops + 1)) : NULL;
    if (profiling) {
        int moved = 0, nstreams = 0, seen[64] = {0};
        for (int i = 0; i < x->nops; i++) {
            moved += x->order[i] != i;
            int id = x->ops[i].stream;
            if (id >= 0 && id < 64 && !seen[id]) seen[id] = 1, nstreams++;
        }
        if (x->serial)
            fprintf(stderr, "fake cuda: graph: %d ops on %d streams; the %s replay order moves %d of them\n", x->nops,
                    nstreams, reverse ? "reverse" : "enqueue", moved);
        else
            fprintf(stderr, "fake cuda: graph: %d ops on %d streams; replayed concurrently, a thread per stream\n", x->nops,
                    nstreams);
    }
    ptrs_add(&execs, x);
    *phGraphExec = x;
    return CUDA_SUCCESS;
}

/* A concurrent replay: a thread per recorded stream runs that stream's ops
 * in enqueue order, each once its dependencies are done (they point
 * backwards, so the lowest op not done can always run).  After a failure
 * (a kernel's sticky fault, a host op's error) the rest is skipped but
 * marked done, so no thread waits forever.  The calling thread waits for
 * them all and returns a host op's error (a kernel's fault is reported at
 * the next synchronisation, as in the serial replay). */
typedef struct {
    const struct CUgraphExec_st *x;
    char *done;      /* per op (work_mu) */
    CUresult failed; /* the first host op's error (work_mu) */
} Replay;

typedef struct {
    Replay *replay;
    int stream;
} ReplayLane;

static void *replay_lane(void *arg) {
    const ReplayLane *lane = arg;
    Replay *rp = lane->replay;
    const struct CUgraphExec_st *x = rp->x;
    for (int i = 0; i < x->nops; i++) {
        const Op *op = &x->ops[i];
        if (op->stream != lane->stream) continue;
        pthread_mutex_lock(&work_mu);
        for (int j = 0; j < op->deps.n; j++)
            while (!rp->done[op->deps.v[j]]) pthread_cond_wait(&work_cv, &work_mu);
        int skip = rp->failed || sticky_error;
        pthread_mutex_unlock(&work_mu);
        CUresult r = skip ? CUDA_SUCCESS : run_op(op);
        pthread_mutex_lock(&work_mu);
        if (r && !deferred(op, r) && !rp->failed) rp->failed = r;
        rp->done[i] = 1;
        pthread_cond_broadcast(&work_cv);
        pthread_mutex_unlock(&work_mu);
    }
    return NULL;
}

static CUresult replay_concurrently(const struct CUgraphExec_st *x) {
    Replay rp = {x, calloc((size_t)x->nops + 1, 1), CUDA_SUCCESS};
    ReplayLane *lanes = xrealloc(NULL, sizeof *lanes * ((size_t)x->nops + 1));
    pthread_t *threads = xrealloc(NULL, sizeof *threads * ((size_t)x->nops + 1));
    int n = 0;
    if (!rp.done) abort();
    for (int i = 0; i < x->nops; i++) {
        int seen = 0;
        for (int j = 0; j < n && !seen; j++) seen = lanes[j].stream == x->ops[i].stream;
        if (seen) continue;
        lanes[n] = (ReplayLane){&rp, x->ops[i].stream};
        if (pthread_create(&threads[n], NULL, replay_lane, &lanes[n]) != 0) {
            fprintf(stderr, "fake cuda: cannot start a replay thread\n");
            abort();
        }
        n++;
    }
    for (int j = 0; j < n; j++) pthread_join(threads[j], NULL);
    free(rp.done), free(lanes), free(threads);
    return rp.failed;
}

CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
    API_LOCKED;
    struct CUstream_st *s;
    CUresult r = need_ctx(__func__);
    if (r || (r = stream_of(hStream, __func__, &s))) return r;
    if (!ptrs_has(&execs, hGraphExec))
        return fail(CUDA_ERROR_INVALID_HANDLE, "%s: %p is not a live graph exec", __func__, (void *)hGraphExec);
    if (s->capture)
        return fail(CUDA_ERROR_NOT_SUPPORTED, "%s: launching a graph into a capturing stream is not emulated", __func__);
    if (s == &legacy_stream && (r = legacy_allowed(__func__))) return r;
    if (sticky()) return sticky();
    for (int i = 0; i < hGraphExec->nops; i++) {
        const Op *op = &hGraphExec->ops[i];
        if (op->kind == OP_KERNEL && (!op->args || !ptrs_has(&functions, op->f)))
            return fail(CUDA_ERROR_INVALID_HANDLE, "%s: a kernel whose module was unloaded", __func__);
    }
    drain_for(s);
    VClock base = s->vc;
    vc_join(&base, &host_vc);
    for (int k = 0; k < hGraphExec->nops; k++) hb_replayed(hGraphExec, hGraphExec->order[k], &base, &s->vc);
    if (!hGraphExec->serial) return replay_concurrently(hGraphExec);
    for (int k = 0; k < hGraphExec->nops; k++) {
        const Op *op = &hGraphExec->ops[hGraphExec->order[k]];
        r = run_op(op);
        if (r) return deferred(op, r) ? CUDA_SUCCESS : r; /* a kernel's fault ends the replay */
    }
    return CUDA_SUCCESS;
}

CUresult cuGraphExecDestroy(CUgraphExec hGraphExec) {
    API_LOCKED;
    CUresult r = need_ctx(__func__);
    if (r) return r;
    if (!ptrs_has(&execs, hGraphExec))
        return fail(CUDA_ERROR_INVALID_HANDLE, "%s: %p is not a live graph exec", __func__, (void *)hGraphExec);
    ptrs_remove(&execs, hGraphExec);
    free_ops(hGraphExec->ops, hGraphExec->nops);
    free(hGraphExec->order);
    free(hGraphExec->lanes);
    free(hGraphExec->vcs);
    free(hGraphExec);
    return CUDA_SUCCESS;
}

CUresult cuGraphDestroy(CUgraph hGraph) {
    API_LOCKED;
    CUresult r = need_ctx(__func__);
    if (r) return r;
    if (!ptrs_has(&graphs, hGraph)) return fail(CUDA_ERROR_INVALID_HANDLE, "%s: %p is not a live graph", __func__, (void *)hGraph);
    ptrs_remove(&graphs, hGraph);
    free_ops(hGraph->ops, hGraph->nops);
    free(hGraph);
    return CUDA_SUCCESS;
}

/* ---- outside the contract ---- */

/* NVRTC, when libcuda.so.1 can be loaded into its process, calls cuInit and
 * then asks cuGetExportTable for the driver's private tables, and crashes
 * when the symbol is missing.  No table here: NOT_SUPPORTED, and NVRTC
 * carries on without the driver (a process may compile with NVRTC while
 * the fakes are on its LD_LIBRARY_PATH: tests/cuda_fake/selftest.c). */
CUresult cuGetExportTable(const void **ppExportTable, const CUuuid *pExportTableId) {
    (void)pExportTableId;
    if (ppExportTable) *ppExportTable = NULL;
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* ---- for the fake cuBLASLt and NCCL (fake_cuda.h) ---- */

CUresult kiln_fake_cuda_enqueue(CUstream s, const char *what, int (*run)(void *data, char *err, size_t errlen),
                                const void *data, size_t bytes, const KilnFakeAccess *acc, int nacc) {
    API_LOCKED;
    CUresult r = need_ctx(what);
    Op op = {.kind = OP_HOST, .what = what, .run = run, .host_data = data, .data_bytes = bytes, .host_acc = acc, .nacc = nacc};
    return r ? r : enqueue(s, what, &op);
}

int kiln_fake_cuda_races(int reset) {
    API_LOCKED;
    int n = races;
    if (reset) races = 0;
    return n;
}

int kiln_fake_cuda_check_range(CUdeviceptr p, size_t bytes, char *err, size_t errlen) {
    API_LOCKED;
    return range_ok(p, bytes, err, errlen);
}
