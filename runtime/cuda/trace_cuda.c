/* trace_cuda.c — `--trace` on the CUDA device (issue 23): per-launch GPU
 * times from CUDA events, written as the CPU trainer's Chrome trace.
 *
 * How.  A traced context runs every step eagerly (no CUDA graph: events
 * between a graph's nodes would need a capture of their own).  rt_launch
 * records a timing event on the launch's stream before and after the
 * launcher enqueues its work (rtc_trace_launch_begin / _end); the first
 * step records one origin event on stream 0 before anything else.  After
 * the step has synchronised (rtc_trace_step_end), each launch's start is
 * cuEventElapsedTime(origin, start) and its duration (start, end), in
 * microseconds: the device's timeline of the whole run, gaps between steps
 * included.  The events are a pool reused every step (the step has
 * finished with them before the next records them again); the spans
 * accumulate per stream until rt_free writes them.
 *
 * The file is the CPU's format (runtime/cpu/dev_cpu.c write_trace): a
 * thread_name metadata event per stream ("0 compute", "1 comm", "2 d2h",
 * "3 h2d"), then one complete ("X") event per launch, its name the launch
 * name before '@' and args {"at": the rest}; pid is the rank, rank r > 0
 * writes PATH.rank<r>; through a temporary file and a rename.  bytes sent
 * are not recorded here (a CUDA launch only enqueues).  What a launch
 * measures: from the point its stream reached the launcher's first
 * enqueued work to the end of its last, so a launcher of several kernels
 * is one span.
 *
 * On the fake CUDA stack (tests/cuda_fake) event times are virtual
 * (fake_cuda.c op_cost_ms), so a traced run gives the same file every time.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rt_cuda.h"
#include "rt_common.h"

typedef struct {
    const char *name; /* the launch name: outlives the context (the program's) */
    int stream;
    double ts, dur; /* microseconds */
} Span;

typedef struct {
    int stream;
    const char *name;
    CUevent start, end; /* the pool's */
} Pending;

struct RtcTrace {
    char *path, *tmp;
    int rank, nstreams;
    CUevent origin;      /* recorded once, at the first step's start */
    CUevent *pool;       /* 2 per launch of a step, reused every step */
    int npool, cappool;
    Pending *pend;       /* this step's launches */
    int npend, cappend;
    Span *span;          /* every step's, in launch order */
    int64_t nspan, capspan;
};

static void *grow(void *p, int64_t *cap, int64_t need, size_t sz) {
    if (need <= *cap) return p;
    int64_t c = *cap ? *cap : 256;
    while (c < need) c *= 2;
    void *q = realloc(p, (size_t)c * sz);
    if (!q) {
        fprintf(stderr, "kiln runtime: out of memory for the trace\n");
        exit(1);
    }
    *cap = c;
    return q;
}

RtcTrace *rtc_trace_new(const char *path, int rank, int nstreams, char *err, size_t errlen) {
    RtcTrace *t = calloc(1, sizeof *t);
    size_t n = strlen(path) + 48;
    if (!t || !(t->path = malloc(n)) || !(t->tmp = malloc(n + 32))) {
        snprintf(err, errlen, "out of memory for the trace");
        rtc_trace_free(t);
        return NULL;
    }
    if (rank > 0) snprintf(t->path, n, "%s.rank%d", path, rank);
    else snprintf(t->path, n, "%s", path);
    snprintf(t->tmp, n + 32, "%s.tmp.%ld", t->path, (long)getpid());
    t->rank = rank, t->nstreams = nstreams;
    CUresult r = cuEventCreate(&t->origin, CU_EVENT_DEFAULT);
    if (r != CUDA_SUCCESS) {
        snprintf(err, errlen, "cuEventCreate (the trace's origin): %s", rtc_error_string(r));
        t->origin = NULL;
        rtc_trace_free(t);
        return NULL;
    }
    return t;
}

/* The pool's event i, created when first needed. */
static CUresult pool_event(RtcTrace *t, int i, CUevent *e) {
    if (i >= t->npool) {
        int64_t cap = t->cappool;
        t->pool = grow(t->pool, &cap, i + 1, sizeof(CUevent));
        t->cappool = (int)cap;
        while (t->npool <= i) {
            CUresult r = cuEventCreate(&t->pool[t->npool], CU_EVENT_DEFAULT);
            if (r != CUDA_SUCCESS) return r;
            t->npool++;
        }
    }
    *e = t->pool[i];
    return CUDA_SUCCESS;
}

CUresult rtc_trace_step_begin(RtcTrace *t, CUstream s0, int64_t step) {
    t->npend = 0;
    return step == 1 ? cuEventRecord(t->origin, s0) : CUDA_SUCCESS;
}

CUresult rtc_trace_launch_begin(RtcTrace *t, int stream, CUstream s, const char *name) {
    int64_t cap = t->cappend;
    t->pend = grow(t->pend, &cap, t->npend + 1, sizeof(Pending));
    t->cappend = (int)cap;
    Pending *p = &t->pend[t->npend];
    CUresult r = pool_event(t, 2 * t->npend, &p->start);
    if (r == CUDA_SUCCESS) r = pool_event(t, 2 * t->npend + 1, &p->end);
    if (r != CUDA_SUCCESS) return r;
    p->stream = stream, p->name = name;
    t->npend++;
    return cuEventRecord(p->start, s);
}

CUresult rtc_trace_launch_end(RtcTrace *t, CUstream s) {
    return t->npend ? cuEventRecord(t->pend[t->npend - 1].end, s) : CUDA_SUCCESS;
}

CUresult rtc_trace_step_end(RtcTrace *t) {
    t->span = grow(t->span, &t->capspan, t->nspan + t->npend, sizeof(Span));
    for (int i = 0; i < t->npend; i++) {
        const Pending *p = &t->pend[i];
        float a, d;
        CUresult r = cuEventElapsedTime(&a, t->origin, p->start);
        if (r == CUDA_SUCCESS) r = cuEventElapsedTime(&d, p->start, p->end);
        if (r != CUDA_SUCCESS) return r;
        t->span[t->nspan++] = (Span){p->name, p->stream, 1e3 * (double)a, 1e3 * (double)d};
    }
    t->npend = 0;
    return CUDA_SUCCESS;
}

static void write_events(const RtcTrace *t, FILE *f) {
    static const char *stream_name[] = {"compute", "comm", "d2h", "h2d"};
    fprintf(f, "{\"traceEvents\":[");
    for (int i = 0; i < t->nstreams; i++) {
        fprintf(f, "%s\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":", i ? "," : "", t->rank, i);
        if (i < 4) fprintf(f, "\"%d %s\"}}", i, stream_name[i]);
        else fprintf(f, "\"%d\"}}", i);
    }
    for (int64_t k = 0; k < t->nspan; k++) {
        const Span *sp = &t->span[k];
        const char *name = sp->name ? sp->name : "kernel", *at = strchr(name, '@');
        fprintf(f, ",\n{\"name\":");
        rt_json_string(f, name, at);
        fprintf(f, ",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":%d,\"tid\":%d", sp->ts, sp->dur, t->rank, sp->stream);
        if (at) fprintf(f, ",\"args\":{\"at\":"), rt_json_string(f, at + 1, NULL), fputc('}', f);
        fputc('}', f);
    }
    fprintf(f, "\n]}\n");
}

int rtc_trace_write(RtcTrace *t) {
    FILE *f = fopen(t->tmp, "w");
    if (!f) {
        fprintf(stderr, "kiln runtime: cannot write trace %s: %s\n", t->tmp, strerror(errno));
        return -1;
    }
    write_events(t, f);
    int bad = ferror(f) || fflush(f) || fsync(fileno(f));
    int err = errno;
    if (fclose(f)) bad = 1, err = errno;
    if (!bad && rename(t->tmp, t->path)) bad = 1, err = errno;
    if (bad) {
        unlink(t->tmp);
        fprintf(stderr, "kiln runtime: cannot write trace %s: %s\n", t->path, strerror(err));
        return -1;
    }
    return 0;
}

int rtc_trace_free(RtcTrace *t) {
    if (!t) return 0;
    int bad = 0;
    for (int i = 0; i < t->npool; i++) bad |= cuEventDestroy(t->pool[i]) != CUDA_SUCCESS;
    if (t->origin) bad |= cuEventDestroy(t->origin) != CUDA_SUCCESS;
    free(t->pool), free(t->pend), free(t->span), free(t->path), free(t->tmp), free(t);
    return bad ? -1 : 0;
}
