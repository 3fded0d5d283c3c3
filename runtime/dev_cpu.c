/* dev_cpu.c — the CPU device: kiln_rt.h's runtime half.
 *
 * A context owns the program's memory spaces, one worker thread per stream,
 * the program's events and a thread pool for the kernels' loops.
 *
 * Streams.  rt_step calls the program's step function on the caller's
 * thread; that function only enqueues: rt_launch, rt_record and rt_wait
 * append a command to the stream's in-order queue (a launch keeps a copy of
 * its args), and the stream's worker runs the commands one after another.
 * rt_step then waits until every queue has drained.  The queues are plain
 * arrays emptied at the end of each step, so a steady-state step allocates
 * nothing.
 *
 * Events.  An event remembers the step in which it was last recorded, on
 * two sides: `issued` (the step thread, when rt_record is called) and `done`
 * (the stream worker, when the record command runs).  A wait enqueued in
 * step k holds its stream until done == k, so a record from step k-1 never
 * satisfies a wait of step k.  The runtime insists that, in program order,
 * an event is recorded at most once per step and before any wait for it
 * (otherwise the step fails with a schedule error and the wait is dropped).
 * That rule also rules out deadlock: every wait's record precedes it in one
 * global order and each stream runs in that order, so by induction every
 * command completes.
 *
 * The pool.  rt_parallel_for splits [0,n) into at most 4 chunks per thread
 * and puts the job on a mutex-protected queue; the idle pool workers and the
 * calling thread claim chunks until none is left, then the caller sleeps
 * until the chunks others claimed are finished.  The caller can finish its
 * own job alone, so calls nested in a chunk, or made by several streams at
 * once, always progress.  Idle workers sleep on a condition variable.  The
 * pool has threads-1 workers (the caller is the last thread) and OpenBLAS
 * gets `threads` threads: GEMMs and pool loops alternate on the compute
 * stream, so about `threads` threads are busy at a time.
 *
 * Serial mode (debugging) creates no thread at all: launches run at once on
 * the caller, records and waits are checked in program order, and
 * rt_parallel_for is one call over [0,n).
 *
 * Tracing.  With a trace path every launch appends (name, start, end, bytes
 * sent) to its stream's growable array, written only by that stream's
 * thread; rt_free writes them as Chrome trace JSON through a temp file and a
 * rename.  A launch name "kernel@where" becomes the event's name "kernel"
 * and args {"at": "where", "bytes": N} (bytes only when the launch sent
 * any: rt_comm_thread_bytes before and after).  Kernel names are kept by
 * pointer: they must outlive the context.
 *
 * Ranks (comm_mpi.c).  rt_new first sets up the context's ranks and
 * communicators (rt_comm_new: MPI only when the mesh has more than one rank
 * or the process runs under mpirun), then checks the program's buckets
 * against the mesh.  Params without storage (space -1: --zero 1 programs
 * whose step all-gathers the params at its start) live only as this rank's
 * "param shard" of their bucket (a state with prefix ""); rt_init_params
 * draws each member's part of the shard from the member's own stream at
 * the member's element offsets, so the shard equals the chunk of what a
 * stored param would hold, bit for bit (rng.h: the stream has random
 * access), and check_buckets insists that every storage-less param has
 * exactly one such home.  A trace is per rank: rank 0 writes the path it was
 * given, rank r > 0 writes PATH.rank<r>, and the JSON's pid is the rank, so
 * the files of one run can be concatenated into one timeline.
 *
 * Failures of the system (pthread, clock, memory while running) print one
 * line and exit(1); rt_new reports a bad program or a failed allocation of
 * a space as NULL and a message; kernels report bad data with rt_fail, which
 * fails the step but not the process.
 */
#include <cblas.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "kiln_rt.h"
#include "rng.h"
#include "rt_private.h"

/* ---- system failures ---- */

static void die(const char *what, int err) {
    fprintf(stderr, "kiln runtime: %s: %s\n", what, strerror(err));
    exit(1);
}

#define PT(call)                          \
    do {                                  \
        int e_ = (call);                  \
        if (e_) die(#call, e_);           \
    } while (0)

static void *xrealloc(void *p, size_t n) {
    p = realloc(p, n ? n : 1);
    if (!p) die("out of memory", ENOMEM);
    return p;
}

/* Grow *p (elements of size sz, capacity *cap) to hold at least need. */
static void grow(void **p, int64_t *cap, int64_t need, size_t sz) {
    if (need <= *cap) return;
    int64_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    *p = xrealloc(*p, (size_t)c * sz);
    *cap = c;
}

/* ---- the context ---- */

enum { CMD_LAUNCH, CMD_RECORD, CMD_WAIT };

typedef struct {
    int kind, event;
    int64_t step;    /* record/wait: the step the command belongs to */
    rt_kernel k;
    const char *name;
    int64_t arg0;    /* launch: its args are stream->args[arg0 .. arg0+nargs) */
    int nargs;
} Cmd;

typedef struct {
    const char *name;
    double start, end; /* µs since rt_new */
    int64_t bytes;     /* sent to other ranks */
} Span;

typedef struct {
    rt_ctx *ctx;
    int id;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t work, idle; /* work: commands arrived or quit; idle: drained */
    Cmd *cmd;
    int64_t ncmd, capcmd, next; /* next: the command the worker runs next */
    int64_t *args;
    int64_t nargs, capargs;
    int64_t *local; /* the worker's copy of the running launch's args */
    int64_t caplocal;
    int quit;
    Span *span; /* trace, touched only by this stream's thread */
    int64_t nspan, capspan;
} Stream;

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int64_t done;   /* step whose record has run (under mu) */
    int64_t issued; /* step in which rt_record was called (step thread only) */
} Event;

typedef struct Job {
    void (*fn)(void *data, int64_t i0, int64_t i1);
    void *data;
    int64_t n, chunk, next; /* chunks [next, next+chunk) are handed out in order */
    int running;            /* chunks handed out and not finished */
    struct Job *prev, *link;
} Job;

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t work, done; /* work: a job arrived or quit; done: a chunk finished */
    Job *head, *tail;          /* jobs with chunks left to hand out */
    pthread_t *th;
    int nth, size, quit;       /* nth workers; size = nth + the caller */
} Pool;

struct rt_ctx {
    const rt_program *p;
    int serial;
    char *space[RT_NSPACES];
    size_t mapped[RT_NSPACES];
    Stream *streams;
    int nstreams;
    Event *events;
    int nevents;
    Pool pool;
    int64_t step; /* the current step, from 1 */
    pthread_mutex_t err_mu;
    int failed;
    char err[512];
    struct timespec t0;
    const char *trace_path;
    char *trace_path_rank; /* the rank's trace file when rank > 0 */
    char *trace_tmp;
    FILE *trace;
    RtComm *comm;
};

RtComm *rt_comm_of(rt_ctx *c) { return c->comm; }

static double now_us(const rt_ctx *c) {
    struct timespec t;
    if (clock_gettime(CLOCK_MONOTONIC, &t)) die("clock_gettime", errno);
    return (double)(t.tv_sec - c->t0.tv_sec) * 1e6 + (double)(t.tv_nsec - c->t0.tv_nsec) * 1e-3;
}

static int64_t dtype_size(int dt) {
    switch (dt) {
    case RT_BF16: case RT_F16: return 2;
    case RT_I64: return 8;
    default: return 4;
    }
}

static int64_t tensor_bytes(const rt_tensor *t) {
    int64_t n = 1;
    for (int d = 0; d < t->rank; d++) n *= t->dim[d];
    return n * dtype_size(t->dtype);
}

static int64_t tensor_numel(const rt_tensor *t) { return tensor_bytes(t) / dtype_size(t->dtype); }

/* ---- errors of a step ---- */

static void fail_v(rt_ctx *c, const char *fmt, va_list ap) {
    PT(pthread_mutex_lock(&c->err_mu));
    if (!c->failed) {
        vsnprintf(c->err, sizeof c->err, fmt, ap);
        c->failed = 1;
    }
    PT(pthread_mutex_unlock(&c->err_mu));
}

void rt_fail(rt_ctx *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fail_v(c, fmt, ap);
    va_end(ap);
}

/* ---- the pool ---- */

static void job_unlink(Pool *P, Job *j) {
    if (j->prev) j->prev->link = j->link; else P->head = j->link;
    if (j->link) j->link->prev = j->prev; else P->tail = j->prev;
}

/* Under P->mu: hand out j's next chunk; the last one takes j off the queue. */
static int job_claim(Pool *P, Job *j, int64_t *i0, int64_t *i1) {
    if (j->next >= j->n) return 0;
    *i0 = j->next;
    *i1 = j->n - j->next > j->chunk ? j->next + j->chunk : j->n;
    j->next = *i1;
    j->running++;
    if (j->next >= j->n) job_unlink(P, j);
    return 1;
}

static void *pool_worker(void *arg) {
    Pool *P = arg;
    PT(pthread_mutex_lock(&P->mu));
    for (;;) {
        while (!P->head && !P->quit) PT(pthread_cond_wait(&P->work, &P->mu));
        if (!P->head) break; /* quit */
        Job *j = P->head;
        int64_t i0, i1;
        if (!job_claim(P, j, &i0, &i1)) continue; /* not reached: the queue holds no spent job */
        PT(pthread_mutex_unlock(&P->mu));
        j->fn(j->data, i0, i1);
        PT(pthread_mutex_lock(&P->mu));
        if (--j->running == 0 && j->next >= j->n) PT(pthread_cond_broadcast(&P->done));
    }
    PT(pthread_mutex_unlock(&P->mu));
    return NULL;
}

void rt_parallel_for(rt_ctx *c, int64_t n, void (*fn)(void *data, int64_t i0, int64_t i1), void *data) {
    Pool *P = &c->pool;
    if (n <= 0) return;
    if (c->serial || P->nth == 0 || n == 1) {
        fn(data, 0, n);
        return;
    }
    int64_t chunks = 4 * (int64_t)P->size < n ? 4 * (int64_t)P->size : n;
    Job j = {fn, data, n, (n + chunks - 1) / chunks, 0, 0, NULL, NULL};
    int64_t i0, i1;
    PT(pthread_mutex_lock(&P->mu));
    j.prev = P->tail;
    if (P->tail) P->tail->link = &j; else P->head = &j;
    P->tail = &j;
    PT(pthread_cond_broadcast(&P->work));
    while (job_claim(P, &j, &i0, &i1)) {
        PT(pthread_mutex_unlock(&P->mu));
        fn(data, i0, i1);
        PT(pthread_mutex_lock(&P->mu));
        j.running--;
    }
    while (j.running) PT(pthread_cond_wait(&P->done, &P->mu));
    PT(pthread_mutex_unlock(&P->mu));
}

static void pool_start(Pool *P, int size) {
    PT(pthread_mutex_init(&P->mu, NULL));
    PT(pthread_cond_init(&P->work, NULL));
    PT(pthread_cond_init(&P->done, NULL));
    P->size = size;
    P->nth = size - 1;
    P->th = xrealloc(NULL, sizeof(pthread_t) * (size_t)P->nth);
    for (int i = 0; i < P->nth; i++) PT(pthread_create(&P->th[i], NULL, pool_worker, P));
}

static void pool_stop(Pool *P) {
    PT(pthread_mutex_lock(&P->mu));
    P->quit = 1;
    PT(pthread_cond_broadcast(&P->work));
    PT(pthread_mutex_unlock(&P->mu));
    for (int i = 0; i < P->nth; i++) PT(pthread_join(P->th[i], NULL));
    free(P->th);
    PT(pthread_cond_destroy(&P->done));
    PT(pthread_cond_destroy(&P->work));
    PT(pthread_mutex_destroy(&P->mu));
}

/* ---- streams ---- */

static void run_launch(rt_ctx *c, Stream *s, rt_kernel k, const int64_t *args, const char *name) {
    if (!c->trace) {
        k(c, args);
        return;
    }
    double t = now_us(c);
    int64_t sent = rt_comm_thread_bytes();
    k(c, args);
    grow((void **)&s->span, &s->capspan, s->nspan + 1, sizeof(Span));
    s->span[s->nspan++] = (Span){name, t, now_us(c), rt_comm_thread_bytes() - sent};
}

static void run_record(Event *e, int64_t step) {
    PT(pthread_mutex_lock(&e->mu));
    e->done = step;
    PT(pthread_cond_broadcast(&e->cv));
    PT(pthread_mutex_unlock(&e->mu));
}

static void run_wait(Event *e, int64_t step) {
    PT(pthread_mutex_lock(&e->mu));
    while (e->done < step) PT(pthread_cond_wait(&e->cv, &e->mu));
    PT(pthread_mutex_unlock(&e->mu));
}

static void *stream_worker(void *arg) {
    Stream *s = arg;
    rt_ctx *c = s->ctx;
    PT(pthread_mutex_lock(&s->mu));
    for (;;) {
        while (s->next == s->ncmd && !s->quit) PT(pthread_cond_wait(&s->work, &s->mu));
        if (s->next == s->ncmd) break; /* quit */
        Cmd cmd = s->cmd[s->next];
        if (cmd.kind == CMD_LAUNCH) {
            grow((void **)&s->local, &s->caplocal, cmd.nargs, sizeof(int64_t));
            if (cmd.nargs) memcpy(s->local, s->args + cmd.arg0, sizeof(int64_t) * (size_t)cmd.nargs);
        }
        PT(pthread_mutex_unlock(&s->mu));
        if (cmd.kind == CMD_LAUNCH) run_launch(c, s, cmd.k, s->local, cmd.name);
        else if (cmd.kind == CMD_RECORD) run_record(&c->events[cmd.event], cmd.step);
        else run_wait(&c->events[cmd.event], cmd.step);
        PT(pthread_mutex_lock(&s->mu));
        if (++s->next == s->ncmd) PT(pthread_cond_broadcast(&s->idle));
    }
    PT(pthread_mutex_unlock(&s->mu));
    return NULL;
}

static void enqueue(Stream *s, Cmd cmd, const int64_t *args) {
    PT(pthread_mutex_lock(&s->mu));
    grow((void **)&s->cmd, &s->capcmd, s->ncmd + 1, sizeof(Cmd));
    if (cmd.kind == CMD_LAUNCH) {
        grow((void **)&s->args, &s->capargs, s->nargs + cmd.nargs, sizeof(int64_t));
        if (cmd.nargs) memcpy(s->args + s->nargs, args, sizeof(int64_t) * (size_t)cmd.nargs);
        cmd.arg0 = s->nargs;
        s->nargs += cmd.nargs;
    }
    s->cmd[s->ncmd++] = cmd;
    PT(pthread_cond_signal(&s->work));
    PT(pthread_mutex_unlock(&s->mu));
}

/* Wait until s has run everything, then empty its queue for the next step. */
static void drain(Stream *s) {
    PT(pthread_mutex_lock(&s->mu));
    while (s->next < s->ncmd) PT(pthread_cond_wait(&s->idle, &s->mu));
    s->ncmd = s->next = s->nargs = 0;
    PT(pthread_mutex_unlock(&s->mu));
}

static int check_stream(rt_ctx *c, int stream, const char *who) {
    if (stream >= 0 && stream < c->nstreams) return 1;
    rt_fail(c, "%s: stream %d out of range (program has %d)", who, stream, c->nstreams);
    return 0;
}

static int check_event(rt_ctx *c, int event, const char *who) {
    if (event >= 0 && event < c->nevents) return 1;
    rt_fail(c, "%s: event %d out of range (program has %d)", who, event, c->nevents);
    return 0;
}

void rt_launch(rt_ctx *c, int stream, rt_kernel k, const int64_t *args, int nargs, const char *name) {
    if (!check_stream(c, stream, "rt_launch")) return;
    if (nargs < 0 || !k) {
        rt_fail(c, "rt_launch %s: bad kernel or nargs %d", name ? name : "?", nargs);
        return;
    }
    if (c->serial) run_launch(c, &c->streams[stream], k, args, name);
    else enqueue(&c->streams[stream], (Cmd){.kind = CMD_LAUNCH, .k = k, .name = name, .nargs = nargs}, args);
}

void rt_record(rt_ctx *c, int stream, int event) {
    if (!check_stream(c, stream, "rt_record") || !check_event(c, event, "rt_record")) return;
    Event *e = &c->events[event];
    if (e->issued == c->step) {
        rt_fail(c, "schedule error: event %d recorded twice in one step (stream %d)", event, stream);
        return;
    }
    e->issued = c->step;
    if (c->serial) e->done = c->step;
    else enqueue(&c->streams[stream], (Cmd){.kind = CMD_RECORD, .event = event, .step = c->step}, NULL);
}

void rt_wait(rt_ctx *c, int stream, int event) {
    if (!check_stream(c, stream, "rt_wait") || !check_event(c, event, "rt_wait")) return;
    if (c->events[event].issued != c->step) {
        rt_fail(c, "schedule error: stream %d waits for event %d, which was not recorded before in this step", stream, event);
        return;
    }
    if (!c->serial) enqueue(&c->streams[stream], (Cmd){.kind = CMD_WAIT, .event = event, .step = c->step}, NULL);
}

int rt_step(rt_ctx *c, char *err, int errlen) {
    c->step++;
    c->p->step(c, c->space);
    if (!c->serial)
        for (int i = 0; i < c->nstreams; i++) drain(&c->streams[i]);
    char sends[600];
    if (rt_comm_finish_sends(c->comm, sends, sizeof sends)) rt_fail(c, "%s", sends); /* no step returns with a send in flight */
    PT(pthread_mutex_lock(&c->err_mu));
    int failed = c->failed;
    if (failed && err && errlen > 0) snprintf(err, (size_t)errlen, "%s", c->err);
    c->failed = 0;
    PT(pthread_mutex_unlock(&c->err_mu));
    return failed ? -1 : 0;
}

/* ---- creating and freeing ---- */

static const char *space_name[RT_NSPACES] = {"params", "grads", "opt", "act"};

/* Every tensor inside its space; a param may instead have no storage
 * (space -1, offset -1: its values live in a param shard, check_buckets). */
static int check_tensors(const rt_program *p, const rt_tensor *t, int n, const char *what) {
    int params = t == p->params;
    for (int i = 0; i < n; i++) {
        int sp = t[i].space, ok = t[i].rank >= 0 && t[i].rank <= 5;
        for (int d = 0; ok && d < t[i].rank; d++) ok = t[i].dim[d] >= 0;
        if (ok && params && sp == -1) {
            if (t[i].offset == -1) continue;
            fprintf(stderr, "kiln runtime: param %s has no storage (space -1) but offset %lld, not -1\n", t[i].name, (long long)t[i].offset);
            return 0;
        }
        ok = ok && sp >= 0 && sp < RT_NSPACES && t[i].offset >= 0;
        if (!ok || t[i].offset + tensor_bytes(&t[i]) > p->space_bytes[sp]) {
            fprintf(stderr, "kiln runtime: %s %s lies outside its memory space\n", what, t[i].name);
            return 0;
        }
    }
    return 1;
}

static int check_program(const rt_program *p) {
    if (p->abi_version != RT_ABI_VERSION) {
        fprintf(stderr, "kiln runtime: program ABI version %d, runtime %d: recompile the program\n",
                p->abi_version, RT_ABI_VERSION);
        return 0;
    }
    if (!p->step || p->nstreams < 0 || p->nevents < 0) {
        fprintf(stderr, "kiln runtime: malformed program table\n");
        return 0;
    }
    for (int i = 0; i < RT_NSPACES; i++)
        if (p->space_bytes[i] < 0) {
            fprintf(stderr, "kiln runtime: negative size of space %s\n", space_name[i]);
            return 0;
        }
    return check_tensors(p, p->params, p->nparams, "param") && check_tensors(p, p->states, p->nstates, "state") &&
           check_tensors(p, p->inputs, p->ninputs, "input") && check_tensors(p, p->outputs, p->noutputs, "output");
}

/* The param shards (prefix ""): at most one per bucket, its members of its
 * dtype and without storage of their own; and every param without storage
 * is a member of exactly one bucket that has a param shard (its values
 * must live somewhere, once).  Buckets are already checked. */
static int check_param_shards(const rt_program *p) {
    const char *model = p->model ? p->model : "program";
    int *home = xrealloc(NULL, sizeof(int) * ((size_t)p->nparams + 1)), ok = 1; /* per param: its param shard's state, or -1 */
    for (int i = 0; i < p->nparams; i++) home[i] = -1;
    for (int s = 0; ok && s < p->nstates; s++) {
        const rt_tensor *t = &p->states[s];
        if (!rt_is_param_shard(t)) continue;
        const rt_bucket *k = &p->buckets[t->bucket];
        for (int j = 0; ok && j < k->nmembers; j++) {
            const rt_tensor *m = &p->params[k->param[j]];
            const char *why = home[k->param[j]] >= 0 ? "is in two param shards"
                              : rt_is_stored(m)        ? "has storage of its own (space >= 0)"
                              : m->dtype != t->dtype   ? "has another dtype than the shard"
                                                       : NULL;
            if (why) fprintf(stderr, "kiln runtime: %s: param shard %s: member %s %s\n", model, t->name, m->name, why);
            ok = !why;
            home[k->param[j]] = s;
        }
    }
    for (int i = 0; ok && i < p->nparams; i++)
        if (!rt_is_stored(&p->params[i]) && home[i] < 0) {
            fprintf(stderr, "kiln runtime: %s: param %s has no storage and is in no param shard (state with prefix \"\")\n", model, p->params[i].name);
            ok = 0;
        }
    free(home);
    return ok;
}

/* The distributed optimizer's buckets against the mesh and the params, and
 * the sharded states against their buckets.  A state is a shard when its
 * prefix is set (tables written before buckets existed have bucket 0 and
 * prefix NULL: unsharded). */
static int check_buckets(const rt_program *p) {
    const char *model = p->model ? p->model : "program";
    if (p->nbuckets < 0 || (p->nbuckets > 0 && !p->buckets)) {
        fprintf(stderr, "kiln runtime: %s: malformed bucket table\n", model);
        return 0;
    }
    for (int b = 0; b < p->nbuckets; b++) {
        const rt_bucket *k = &p->buckets[b];
        int size = rt_mesh_group_size(p, k->group);
        if (size == 0 || k->n < 0 || k->n % size || k->nmembers < 0 || (k->nmembers > 0 && (!k->param || !k->offset))) {
            fprintf(stderr, "kiln runtime: %s: bucket %d: bad group %d, length %lld or members\n", model, b, k->group, (long long)k->n);
            return 0;
        }
        for (int j = 0; j < k->nmembers; j++) {
            int i = k->param[j];
            if (i < 0 || i >= p->nparams || k->offset[j] < 0 || k->offset[j] + tensor_numel(&p->params[i]) > k->n) {
                fprintf(stderr, "kiln runtime: %s: bucket %d: member %d (param %d) lies outside the bucket\n", model, b, j, i);
                return 0;
            }
        }
    }
    for (int s = 0; s < p->nstates; s++) {
        const rt_tensor *t = &p->states[s];
        if (!rt_is_shard(t)) continue;
        if (t->bucket < 0 || t->bucket >= p->nbuckets) {
            fprintf(stderr, "kiln runtime: %s: state %s: bucket %d out of range (program has %d)\n", model, t->name, t->bucket, p->nbuckets);
            return 0;
        }
        const rt_bucket *k = &p->buckets[t->bucket];
        if (tensor_numel(t) != k->n / rt_mesh_group_size(p, k->group)) {
            fprintf(stderr, "kiln runtime: %s: state %s: %lld elements, but a shard of bucket %d has %lld\n", model, t->name,
                    (long long)tensor_numel(t), t->bucket, (long long)(k->n / rt_mesh_group_size(p, k->group)));
            return 0;
        }
    }
    return check_param_shards(p);
}

/* Zeroed, page-aligned memory for each space (huge pages where the kernel
 * agrees: advice only, so its result does not matter). */
static int map_spaces(rt_ctx *c) {
    for (int i = 0; i < RT_NSPACES; i++) {
        size_t n = (size_t)c->p->space_bytes[i];
        c->mapped[i] = n < 64 ? 64 : n;
        void *m = mmap(NULL, c->mapped[i], PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) {
            fprintf(stderr, "kiln runtime: cannot allocate %zu bytes for the %s space: %s\n", n, space_name[i],
                    strerror(errno));
            c->mapped[i] = 0;
            return 0;
        }
        if (n >= (2u << 20)) (void)madvise(m, c->mapped[i], MADV_HUGEPAGE);
        c->space[i] = m;
    }
    return 1;
}

static void unmap_spaces(rt_ctx *c) {
    for (int i = 0; i < RT_NSPACES; i++)
        if (c->mapped[i] && munmap(c->space[i], c->mapped[i])) die("munmap", errno);
}

static int open_trace(rt_ctx *c, const char *path) {
    size_t n = strlen(path) + 32;
    int rank = rt_world_rank(c);
    if (rank > 0) {
        c->trace_path_rank = xrealloc(NULL, n);
        snprintf(c->trace_path_rank, n, "%s.rank%d", path, rank);
        path = c->trace_path_rank;
    }
    c->trace_path = path;
    c->trace_tmp = xrealloc(NULL, n);
    snprintf(c->trace_tmp, n, "%s.tmp.%ld", path, (long)getpid());
    c->trace = fopen(c->trace_tmp, "w");
    if (c->trace) return 1;
    fprintf(stderr, "kiln runtime: cannot write trace %s: %s\n", c->trace_tmp, strerror(errno));
    return 0;
}

static int cores(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

static void start_streams(rt_ctx *c) {
    c->streams = xrealloc(NULL, sizeof(Stream) * (size_t)c->nstreams);
    memset(c->streams, 0, sizeof(Stream) * (size_t)c->nstreams);
    for (int i = 0; i < c->nstreams; i++) {
        Stream *s = &c->streams[i];
        s->ctx = c;
        s->id = i;
        if (c->trace) grow((void **)&s->span, &s->capspan, 4096, sizeof(Span));
        if (c->serial) continue;
        PT(pthread_mutex_init(&s->mu, NULL));
        PT(pthread_cond_init(&s->work, NULL));
        PT(pthread_cond_init(&s->idle, NULL));
        PT(pthread_create(&s->th, NULL, stream_worker, s));
    }
}

static void stop_streams(rt_ctx *c) {
    for (int i = 0; i < c->nstreams; i++) {
        Stream *s = &c->streams[i];
        if (!c->serial) {
            PT(pthread_mutex_lock(&s->mu));
            s->quit = 1;
            PT(pthread_cond_signal(&s->work));
            PT(pthread_mutex_unlock(&s->mu));
            PT(pthread_join(s->th, NULL));
            PT(pthread_cond_destroy(&s->idle));
            PT(pthread_cond_destroy(&s->work));
            PT(pthread_mutex_destroy(&s->mu));
        }
        free(s->cmd);
        free(s->args);
        free(s->local);
    }
}

static void start_events(rt_ctx *c) {
    c->events = xrealloc(NULL, sizeof(Event) * (size_t)c->nevents);
    memset(c->events, 0, sizeof(Event) * (size_t)c->nevents);
    for (int i = 0; i < c->nevents; i++) {
        PT(pthread_mutex_init(&c->events[i].mu, NULL));
        PT(pthread_cond_init(&c->events[i].cv, NULL));
    }
}

static void stop_events(rt_ctx *c) {
    for (int i = 0; i < c->nevents; i++) {
        PT(pthread_cond_destroy(&c->events[i].cv));
        PT(pthread_mutex_destroy(&c->events[i].mu));
    }
    free(c->events);
}

rt_ctx *rt_new(const rt_program *p, const rt_options *o) {
    static const rt_options none;
    if (!o) o = &none;
    if (!check_program(p)) return NULL;
    rt_ctx *c = xrealloc(NULL, sizeof *c);
    memset(c, 0, sizeof *c);
    c->p = p;
    c->serial = o->serial;
    c->nstreams = p->nstreams > 0 ? p->nstreams : 1;
    c->nevents = p->nevents;
    if (clock_gettime(CLOCK_MONOTONIC, &c->t0)) die("clock_gettime", errno);
    if (!(c->comm = rt_comm_new(p)) || !check_buckets(p) || !map_spaces(c) || (o->trace_path && !open_trace(c, o->trace_path))) {
        unmap_spaces(c);
        rt_comm_free(c->comm);
        free(c->trace_tmp);
        free(c->trace_path_rank);
        free(c);
        return NULL;
    }
    int threads = o->threads > 0 ? o->threads : cores();
    PT(pthread_mutex_init(&c->err_mu, NULL));
    pool_start(&c->pool, c->serial ? 1 : threads);
    openblas_set_num_threads(c->serial ? 1 : threads);
    start_events(c);
    start_streams(c);
    return c;
}

/* ---- the trace ---- */

/* s up to end (NULL: its end) as a JSON string */
static void json_string(FILE *f, const char *s, const char *end) {
    fputc('"', f);
    for (; s && *s && s != end; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
        else if (ch < 0x20) fprintf(f, "\\u%04x", ch);
        else fputc(ch, f);
    }
    fputc('"', f);
}

static void write_trace(rt_ctx *c) {
    static const char *stream_name[] = {"compute", "comm", "d2h", "h2d"};
    FILE *f = c->trace;
    const char *sep = "";
    int pid = rt_world_rank(c);
    fprintf(f, "{\"traceEvents\":[");
    for (int i = 0; i < c->nstreams; i++) {
        fprintf(f, "%s\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":", sep, pid, i);
        if (i < 4) fprintf(f, "\"%d %s\"}}", i, stream_name[i]);
        else fprintf(f, "\"%d\"}}", i);
        sep = ",";
        for (int64_t k = 0; k < c->streams[i].nspan; k++) {
            const Span *sp = &c->streams[i].span[k];
            const char *name = sp->name ? sp->name : "kernel", *at = strchr(name, '@');
            fprintf(f, ",\n{\"name\":");
            json_string(f, name, at);
            fprintf(f, ",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":%d,\"tid\":%d", sp->start, sp->end - sp->start, pid, i);
            if (at || sp->bytes) {
                fprintf(f, ",\"args\":{");
                if (at) fprintf(f, "\"at\":"), json_string(f, at + 1, NULL);
                if (sp->bytes) fprintf(f, "%s\"bytes\":%lld", at ? "," : "", (long long)sp->bytes);
                fputc('}', f);
            }
            fputc('}', f);
        }
    }
    fprintf(f, "\n]}\n");
    int bad = ferror(f) || fflush(f) || fsync(fileno(f));
    int err = errno;
    if (fclose(f)) bad = 1, err = errno;
    if (!bad && rename(c->trace_tmp, c->trace_path)) bad = 1, err = errno;
    if (bad) {
        unlink(c->trace_tmp);
        fprintf(stderr, "kiln runtime: cannot write trace %s: %s\n", c->trace_path, strerror(err));
        exit(1);
    }
}

void rt_free(rt_ctx *c) {
    if (!c) return;
    stop_streams(c);
    pool_stop(&c->pool);
    stop_events(c);
    if (c->trace) write_trace(c);
    for (int i = 0; i < c->nstreams; i++) free(c->streams[i].span);
    free(c->streams);
    free(c->trace_tmp);
    free(c->trace_path_rank);
    unmap_spaces(c);
    rt_comm_free(c->comm);
    PT(pthread_mutex_destroy(&c->err_mu));
    free(c);
}

/* ---- memory and parameters ---- */

char *rt_space(rt_ctx *c, int space) { return space >= 0 && space < RT_NSPACES ? c->space[space] : NULL; }

/* NULL for a param without storage (space -1). */
void *rt_tensor_ptr(rt_ctx *c, const rt_tensor *t) {
    return t->space >= 0 && t->space < RT_NSPACES ? c->space[t->space] + t->offset : NULL;
}

void rt_normal_fill(float *dst, int64_t n, const char *name, uint64_t seed, double std) {
    rng_normal_f32(dst, 0, n, rng_stream(name, seed), std);
}

/* A "normal" init in blocks on the pool: the stream has random access, so
 * values first .. first+n of a param's stream can be drawn alone (a shard). */
enum { NORMAL_BLOCK = 1 << 16 };

typedef struct {
    float *dst;
    int64_t first, n;
    uint64_t stream;
    double std;
} NormalJob;

static void normal_blocks(void *data, int64_t b0, int64_t b1) {
    const NormalJob *j = data;
    int64_t i0 = b0 * NORMAL_BLOCK, i1 = b1 * NORMAL_BLOCK < j->n ? b1 * NORMAL_BLOCK : j->n;
    rng_normal_f32(j->dst + i0, j->first + i0, i1 - i0, j->stream, j->std);
}

/* Elements first .. first+n of param t's init (row-major) into dst: the
 * same values wherever they land, so a shard holds exactly its chunk of
 * the stored param's init. */
static void init_range(rt_ctx *c, const rt_tensor *t, void *dst, int64_t first, int64_t n, uint64_t seed) {
    const char *init = t->init ? t->init : "normal";
    if (strcmp(init, "zeros") == 0) {
        memset(dst, 0, (size_t)(n * dtype_size(t->dtype)));
        return;
    }
    if (t->dtype != RT_F32) {
        fprintf(stderr, "kiln runtime: param %s: init \"%s\" needs an f32 tensor\n", t->name, init);
        exit(1);
    }
    if (strcmp(init, "ones") == 0) {
        for (int64_t i = 0; i < n; i++) ((float *)dst)[i] = 1.0f;
    } else if (strcmp(init, "normal") == 0) {
        NormalJob j = {dst, first, n, rng_stream(t->name, seed), t->std};
        rt_parallel_for(c, (n + NORMAL_BLOCK - 1) / NORMAL_BLOCK, normal_blocks, &j);
    } else {
        fprintf(stderr, "kiln runtime: param %s: unknown init \"%s\"\n", t->name, init);
        exit(1);
    }
}

/* A param shard: this rank's elements [lo, lo+len) of the flat bucket, each
 * member's part from its init, padding zero. */
static void init_param_shard(rt_ctx *c, const rt_tensor *t, uint64_t seed) {
    const rt_bucket *k = &c->p->buckets[t->bucket];
    int64_t len = k->n / rt_group_size(c, k->group), lo = rt_group_rank(c, k->group) * len, es = dtype_size(t->dtype);
    char *dst = rt_tensor_ptr(c, t);
    memset(dst, 0, (size_t)(len * es));
    for (int j = 0; j < k->nmembers; j++) {
        const rt_tensor *m = &c->p->params[k->param[j]];
        int64_t o = k->offset[j], n = tensor_numel(m);
        int64_t a = lo > o ? lo : o, e = lo + len < o + n ? lo + len : o + n;
        if (a < e) init_range(c, m, dst + (a - lo) * es, a - o, e - a, seed);
    }
}

void rt_init_params(rt_ctx *c, uint64_t seed) {
    const rt_program *p = c->p;
    for (int i = 0; i < p->nparams; i++)
        if (rt_is_stored(&p->params[i])) init_range(c, &p->params[i], rt_tensor_ptr(c, &p->params[i]), 0, tensor_numel(&p->params[i]), seed);
    for (int i = 0; i < p->nstates; i++) {
        const rt_tensor *t = &p->states[i];
        if (rt_is_param_shard(t)) init_param_shard(c, t, seed);
        else memset(rt_tensor_ptr(c, t), 0, (size_t)tensor_bytes(t));
    }
}
