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
 * Helping (issue 19).  On an oversubscribed machine (the offload bench: 4
 * ranks of 4 streams on 2 cores) a copy stream's worker gets a core only
 * once the compute thread blocks, so a wait for a 50 µs copy used to last
 * 0.05-5 ms.  So a worker about to block on an event first looks at the
 * stream that records it (the wait's `src`, noted by rt_wait): while that
 * stream's next command is a copy launch (rtk_offload, rtk_reload), a record
 * or a wait that is already satisfied, the waiter claims it and runs it
 * itself, then looks again, until its own event is done.  The claim is the
 * stream's `running` flag, set under the stream's mutex by whoever (its
 * worker or a helper) takes the command at `next`; nobody takes a command
 * while it is set, and whoever set it clears it and advances `next` in one
 * critical section.  So each command runs exactly once, one at a time, in
 * the queue's order, and a record still runs exactly once: the stream's
 * in-order semantics are those of one worker that happened to run on
 * another thread.  A worker blocked in a wait of its own holds no claim
 * (so a helper can pass that wait once it is satisfied, without waiting
 * for the worker to get a core); on waking the worker advances `next`
 * only if no command of its stream finished meanwhile (`finished`).  When the next command is a wait that is not satisfied,
 * the helper waits for that wait's event, helping its recorder in turn
 * (recorded, in program order, before the copy stream's wait and so
 * before its own wait: the deadlock argument above still holds, and the
 * chain ends) and looks again; when it is running or is
 * a launch of another kernel, the helper sleeps until the stream makes
 * progress (`progress`, broadcast at every advance of `next`).  Only
 * memcpys are run by helpers: they are short, have no effect besides their
 * bytes, and use no thread-local state of their stream (a kernel that
 * calls rt_parallel_for or MPI stays on its own thread).  A helped launch's
 * trace span sits on its own stream's row with args {"by": helper stream}.
 *
 * Priority (issue 19).  On the CPU the copy engine is the cores the ranks
 * compute on: every byte an offload or reload copies takes a core from
 * some compute thread unless it is copied while a core would idle (a rank
 * waiting for a receive sleeps in coll_mpi.c's wait_posted).  So the copy
 * streams' workers (d2h 2, h2d 3) run at SCHED_IDLE: they take a core only
 * when no normal thread wants it, and a copy that is needed before that
 * is run by its consumer, the helping above.  A low-priority worker must
 * never keep a normal thread waiting (priority inversion: with the other
 * ranks' compute threads runnable it could wait for a core for as long as
 * they run): a helper that finds the worker holding the claim, or rt_step
 * draining its queue, puts it back to SCHED_OTHER (`boost`) until it takes
 * its next command with no drain under way (`unboost`), both under the
 * stream's mutex so the two never cross; and an idle worker that waits for
 * an event does not help (it would hold another stream's claim at idle
 * priority), while a normal helper that finds a copy stream blocked in a
 * wait helps the stream that wait is for, down the chain (a reload behind
 * its offload).  Taking a thread from SCHED_IDLE back to SCHED_OTHER needs
 * CAP_SYS_NICE or a permissive RLIMIT_NICE: rt_new tries both on a thread
 * of its own first and, if either fails, leaves every worker at normal
 * priority (as before).  KILN_COPY_PRIORITY=normal does the same (for
 * comparisons).  Neither changes any byte: only who runs a copy and when.
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
 * against the mesh.  A trace is per rank: rank 0 writes the path it was
 * given, rank r > 0 writes PATH.rank<r>, and the JSON's pid is the rank, so
 * the files of one run can be concatenated into one timeline.
 *
 * What both devices share lives in rt_common.c: checking the program table
 * (which also refuses a program compiled for another device), mapping the
 * spaces, and rt_init_params' generator, including the param shards of
 * storage-less params (--zero 1), drawn member by member so that a shard
 * equals its chunk of the stored params bit for bit.  The CPU's host views
 * are its memory, so rt_pull and rt_push have nothing to do.
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
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__) && defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "kiln_rt.h"
#include "rt_common.h"

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
    int64_t seq;     /* launch: its place in the step's program order (the copy check) */
    int64_t copy;    /* launch of rtk_offload/rtk_reload: its index in ctx->copies; -1 */
    int src;         /* wait: the stream that records its event (the helping) */
} Cmd;

typedef struct {
    const char *name;
    double start, end; /* µs since rt_new */
    int64_t bytes;     /* sent to other ranks */
    int by;            /* the stream whose thread ran it when it helped; -1 */
} Span;

typedef struct {
    rt_ctx *ctx;
    int id;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t work, idle; /* work: commands arrived, quit or a helper finished; idle: drained */
    pthread_cond_t progress;   /* next advanced (helpers sleep on it) */
    Cmd *cmd;
    int64_t ncmd, capcmd, next; /* next: the command the worker runs next */
    int running;                /* the claim: command `next` is being run (by the worker or a helper) */
    int64_t finished;           /* commands finished since rt_new (a waiting worker's check) */
    int64_t *args;
    int64_t nargs, capargs;
    int64_t *local; /* the worker's copy of the running launch's args */
    int64_t caplocal;
    int quit;
    int runner;     /* the stream whose thread holds the claim (s->id: its worker) */
    int low;        /* a copy stream whose worker runs at idle priority (see "Priority") */
    int boosted;    /* that worker is at normal priority now (a thread waits for its claim) */
    int draining;   /* rt_step waits for the queue to drain: the worker stays boosted */
    int64_t ran_self, ran_helped; /* copies of this stream run by its worker / by a helper (atomics) */
    int64_t boosts;                /* times its worker was put back to normal priority (under mu) */
    Span *span; /* trace, touched only by this stream's thread */
    int64_t nspan, capspan;
} Stream;

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int64_t done;   /* step whose record has run (under mu) */
    int64_t issued; /* step in which rt_record was called (step thread only) */
    int recorder;   /* the stream of that rt_record (step thread only) */
} Event;

/* A copy of this step (rtk_offload, rtk_reload) for the copy check: its
 * destination [lo, hi), its place in program order, and whether its
 * worker has started it and finished it (under ctx->copy_mu). */
typedef struct {
    char *lo, *hi;
    int64_t seq;
    int started, done;
    const char *name;
} Copy;

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
    /* activation offload (issue 19): the copy check, the planted bug and
     * the measured act high-water mark (see "copies" below) */
    int check_copies, drop_copy_wait, dropped;
    long copy_delay_us;
    pthread_mutex_t copy_mu;
    Copy *copies;
    int64_t ncopies, capcopies, seq;
    int64_t act_hw; /* -1: not measured */
    int copy_idle;  /* the copy streams' workers run at idle priority ("Priority") */
    int copy_plain; /* KILN_COPY_PLAIN=1: offloads by memcpy too (comparisons) */
    int no_boost;   /* KILN_TEST_NO_BOOST=1 (tests): the priority inversion left in */
};

static void check_copies(rt_ctx *c, const Cmd *cmd, const int64_t *args, int when);

RtComm *rt_comm_of(rt_ctx *c) { return c->comm; }

static double now_us(const rt_ctx *c) {
    struct timespec t;
    if (clock_gettime(CLOCK_MONOTONIC, &t)) die("clock_gettime", errno);
    return (double)(t.tv_sec - c->t0.tv_sec) * 1e6 + (double)(t.tv_nsec - c->t0.tv_nsec) * 1e-3;
}

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

/* The copy the running launch is (rtk_offload/rtk_reload find their entry). */
static __thread int64_t tl_copy = -1;

static void run_launch(rt_ctx *c, Stream *s, const Cmd *cmd, const int64_t *args, int by) {
    rt_kernel k = cmd->k;
    const char *name = cmd->name;
    if (cmd->k == rtk_offload || cmd->k == rtk_reload) __atomic_fetch_add(by >= 0 ? &s->ran_helped : &s->ran_self, 1, __ATOMIC_RELAXED);
    if (c->check_copies) check_copies(c, cmd, args, 0);
    tl_copy = cmd->copy;
    if (!c->trace) {
        k(c, args);
        if (c->check_copies) check_copies(c, cmd, args, 1);
        return;
    }
    double t = now_us(c);
    int64_t sent = rt_comm_thread_bytes();
    k(c, args);
    if (c->check_copies) check_copies(c, cmd, args, 1);
    grow((void **)&s->span, &s->capspan, s->nspan + 1, sizeof(Span));
    s->span[s->nspan++] = (Span){name, t, now_us(c), rt_comm_thread_bytes() - sent, by};
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

static int event_done(Event *e, int64_t step) {
    PT(pthread_mutex_lock(&e->mu));
    int done = e->done >= step;
    PT(pthread_mutex_unlock(&e->mu));
    return done;
}

/* Under s->mu: the command at next has run (its claim, if any, ends). */
static void finish_cmd(Stream *s) {
    s->running = 0;
    s->finished++;
    if (++s->next == s->ncmd) PT(pthread_cond_broadcast(&s->idle));
    PT(pthread_cond_broadcast(&s->progress));
    PT(pthread_cond_signal(&s->work)); /* the worker may sleep on a helper's claim */
}

/* ---- priority (see "Priority" at the top) ---- */

static int set_policy(pthread_t th, int policy) {
    struct sched_param sp = {0};
    return pthread_setschedparam(th, policy, &sp);
}

/* Under s->mu: s's worker runs at normal priority until it next takes a
 * command with no one waiting (a thread waits for what it holds or for
 * the queue to drain). */
static void boost(Stream *s) {
    if (!s->low || s->boosted || s->ctx->no_boost) return;
    PT(set_policy(s->th, SCHED_OTHER));
    s->boosted = 1;
    s->boosts++;
}

/* Under s->mu, on s's worker: back to idle priority once no one waits. */
static void unboost(Stream *s) {
    if (!s->boosted || s->draining) return;
    PT(set_policy(pthread_self(), SCHED_IDLE));
    s->boosted = 0;
}

/* Whether this process may put a thread at idle priority and take it back
 * to normal (Linux: SCHED_IDLE -> SCHED_OTHER needs CAP_SYS_NICE or an
 * RLIMIT_NICE that allows nice 0): tried on a thread of its own. */
static void *probe_idle(void *arg) {
    int *ok = arg;
    *ok = set_policy(pthread_self(), SCHED_IDLE) == 0 && set_policy(pthread_self(), SCHED_OTHER) == 0;
    return NULL;
}

static int idle_priority_ok(void) {
    const char *v = getenv("KILN_COPY_PRIORITY");
    if (v && strcmp(v, "normal") == 0) return 0;
    int ok = 0;
    pthread_t th;
    PT(pthread_create(&th, NULL, probe_idle, &ok));
    PT(pthread_join(th, NULL));
    return ok;
}

/* s waits for event ev of step `step`, recorded by stream src, running the
 * copies, records and satisfied waits that src has next (see "Helping"):
 * when src is itself blocked in a wait, the same for that wait's event
 * (the chain ends: each wait's record comes earlier in program order). */
static void wait_helping(rt_ctx *c, Stream *s, int ev, int64_t step, int src) {
    Event *e = &c->events[ev];
    if (src < 0 || src == s->id) {
        run_wait(e, step);
        return;
    }
    Stream *r = &c->streams[src];
    int64_t local[8];
    PT(pthread_mutex_lock(&r->mu));
    while (!event_done(e, step)) {
        if (r->next == r->ncmd) { /* not reached: e's record is queued on r */
            PT(pthread_cond_wait(&r->progress, &r->mu));
            continue;
        }
        Cmd x = r->cmd[r->next];
        if (x.kind == CMD_LAUNCH && ((x.k != rtk_offload && x.k != rtk_reload) || x.nargs > 8)) {
            PT(pthread_mutex_unlock(&r->mu)); /* not a copy: no help, the plain wait */
            run_wait(e, step);
            return;
        }
        if (x.kind == CMD_WAIT && !event_done(&c->events[x.event], x.step)) {
            PT(pthread_mutex_unlock(&r->mu)); /* r is blocked: wait (helping) for what r waits for */
            wait_helping(c, s, x.event, x.step, x.src);
            PT(pthread_mutex_lock(&r->mu));
            continue;
        }
        if (r->running) { /* r's worker or another helper runs it */
            if (r->runner == r->id) boost(r); /* an idle-priority worker must not keep us waiting */
            PT(pthread_cond_wait(&r->progress, &r->mu));
            continue;
        }
        r->running = 1; /* the claim */
        r->runner = s->id;
        if (x.kind == CMD_LAUNCH && x.nargs) memcpy(local, r->args + x.arg0, sizeof(int64_t) * (size_t)x.nargs);
        PT(pthread_mutex_unlock(&r->mu));
        if (x.kind == CMD_LAUNCH) run_launch(c, r, &x, local, s->id);
        else if (x.kind == CMD_RECORD) run_record(&c->events[x.event], x.step);
        PT(pthread_mutex_lock(&r->mu)); /* a satisfied wait: nothing to run */
        finish_cmd(r);
    }
    PT(pthread_mutex_unlock(&r->mu));
}

/* A wait is not claimed while its worker blocks (a helper may pass it once
 * it is satisfied); the worker then advances next only if no one else has
 * finished a command of s meanwhile. */
static void worker_wait(rt_ctx *c, Stream *s, const Cmd *cmd) {
    int64_t finished = s->finished;
    PT(pthread_mutex_unlock(&s->mu));
    if (s->low) run_wait(&c->events[cmd->event], cmd->step); /* an idle-priority worker holds no one else's claim */
    else wait_helping(c, s, cmd->event, cmd->step, cmd->src);
    PT(pthread_mutex_lock(&s->mu));
    if (s->finished == finished && !s->running) finish_cmd(s);
}

static void *stream_worker(void *arg) {
    Stream *s = arg;
    rt_ctx *c = s->ctx;
    PT(pthread_mutex_lock(&s->mu));
    if (s->low) PT(set_policy(pthread_self(), SCHED_IDLE));
    for (;;) {
        while ((s->next == s->ncmd && !s->quit) || s->running) PT(pthread_cond_wait(&s->work, &s->mu));
        if (s->next == s->ncmd) break; /* quit */
        unboost(s);
        Cmd cmd = s->cmd[s->next];
        if (cmd.kind == CMD_WAIT) {
            worker_wait(c, s, &cmd);
            continue;
        }
        s->running = 1; /* the claim */
        s->runner = s->id;
        if (cmd.kind == CMD_LAUNCH) {
            grow((void **)&s->local, &s->caplocal, cmd.nargs, sizeof(int64_t));
            if (cmd.nargs) memcpy(s->local, s->args + cmd.arg0, sizeof(int64_t) * (size_t)cmd.nargs);
        }
        PT(pthread_mutex_unlock(&s->mu));
        if (cmd.kind == CMD_LAUNCH) run_launch(c, s, &cmd, s->local, -1);
        else run_record(&c->events[cmd.event], cmd.step);
        PT(pthread_mutex_lock(&s->mu));
        finish_cmd(s);
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
    if (s->next < s->ncmd) {
        s->draining = 1; /* an idle-priority worker must not hold the step's end */
        boost(s);
    }
    while (s->next < s->ncmd) PT(pthread_cond_wait(&s->idle, &s->mu));
    s->draining = 0;
    s->ncmd = s->next = s->nargs = 0;
    PT(pthread_mutex_unlock(&s->mu));
}

static int check_stream(rt_ctx *c, int stream, const char *who) { return rt_in_range(c, stream, c->nstreams, "stream", who); }
static int check_event(rt_ctx *c, int event, const char *who) { return rt_in_range(c, event, c->nevents, "event", who); }

static int64_t note_copy(rt_ctx *c, rt_kernel k, const int64_t *args, int nargs, const char *name);

void rt_launch(rt_ctx *c, int stream, rt_kernel k, const int64_t *args, int nargs, const char *name) {
    if (!rt_launch_ok(c, stream, c->nstreams, k, nargs, name)) return;
    Cmd cmd = {.kind = CMD_LAUNCH, .k = k, .name = name, .nargs = nargs, .seq = ++c->seq, .copy = -1};
    if (c->check_copies) cmd.copy = note_copy(c, k, args, nargs, name);
    if (c->serial) run_launch(c, &c->streams[stream], &cmd, args, -1);
    else enqueue(&c->streams[stream], cmd, args);
}

void rt_record(rt_ctx *c, int stream, int event) {
    if (!check_stream(c, stream, "rt_record") || !check_event(c, event, "rt_record")) return;
    Event *e = &c->events[event];
    if (e->issued == c->step) {
        rt_fail(c, "schedule error: event %d recorded twice in one step (stream %d)", event, stream);
        return;
    }
    e->issued = c->step;
    e->recorder = stream;
    if (c->serial) e->done = c->step;
    else enqueue(&c->streams[stream], (Cmd){.kind = CMD_RECORD, .event = event, .step = c->step}, NULL);
}

void rt_wait(rt_ctx *c, int stream, int event) {
    if (!check_stream(c, stream, "rt_wait") || !check_event(c, event, "rt_wait")) return;
    if (c->events[event].issued != c->step) {
        rt_fail(c, "schedule error: stream %d waits for event %d, which was not recorded before in this step", stream, event);
        return;
    }
    if (c->dropped < c->drop_copy_wait && stream == 0 && c->events[event].recorder == 3) {
        c->dropped++; /* KILN_TEST_DROP_COPY_WAIT: the planted bug (see "copies") */
        return;
    }
    if (!c->serial)
        enqueue(&c->streams[stream], (Cmd){.kind = CMD_WAIT, .event = event, .step = c->step, .src = c->events[event].recorder}, NULL);
}

static void measure_act(rt_ctx *c);

int rt_step(rt_ctx *c, char *err, int errlen) {
    c->step++;
    c->ncopies = c->seq = c->dropped = 0;
    c->p->step(c, c->space);
    if (!c->serial)
        for (int i = 0; i < c->nstreams; i++) drain(&c->streams[i]);
    if (c->act_hw >= 0) measure_act(c);
    char sends[600];
    if (rt_comm_finish_sends(c->comm, sends, sizeof sends)) rt_fail(c, "%s", sends); /* no step returns with a send in flight */
    PT(pthread_mutex_lock(&c->err_mu));
    int failed = c->failed;
    if (failed && err && errlen > 0) snprintf(err, (size_t)errlen, "%s", c->err);
    c->failed = 0;
    PT(pthread_mutex_unlock(&c->err_mu));
    return failed ? -1 : 0;
}

/* ---- copies (activation offload, issue 19) ----
 *
 * rtk_offload and rtk_reload are memcpys that run on the copy streams'
 * workers (d2h 2, h2d 3) between the act space and the host space, a
 * separate mapping: the schedule's events alone order them against the
 * compute and comm streams, and memplan reuses the act bytes an offload
 * freed, so a missing event shows as a race on real memory.
 *
 * The copy check (KILN_CHECK_COPIES=1 in the environment at rt_new; the
 * tests set it): rt_launch numbers the step's launches in program order
 * and notes every copy's destination range; each launch, when it starts
 * and when it ends, looks at its pointer args.  A pointer into the
 * destination of a copy issued before it that has not finished means the
 * launch ran while the copy was still writing what it uses (a missing
 * wait); into a copy issued after it that has already started, the copy
 * overwrote what the launch was still using (a missing fence).  Either
 * fails the step naming both.  A pointer arg is compared by address, so a
 * size or flag arg never matches (they are far below any mapping).
 * Serial mode runs everything in program order: no check.
 *
 * For the tests: KILN_COPY_DELAY_US=N makes each copy sleep N µs before
 * its memcpy (so an unordered reader reliably overtakes it), and
 * KILN_TEST_DROP_COPY_WAIT=N plants the bug: in each step the compute
 * stream's first N waits for an event recorded on the h2d stream (a
 * reload's) are dropped.  The check must then fail the step.
 *
 * The act high-water mark (KILN_MEASURE_PEAK=1 at rt_new): the act space
 * starts filled with 0xff bytes (f32 NaN: a read of a byte no one wrote
 * poisons the loss) and after each step the runtime scans down from the
 * top for the highest byte that is no longer 0xff.  It is the highest
 * offset + size of any act buffer written in the run (by a kernel, a copy
 * or the trainer's inputs), as the memory saw it, not the plan's number;
 * the tests compare the two.  Once found, later steps scan only above it. */

static long env_long(const char *name) {
    const char *v = getenv(name);
    return v && *v ? strtol(v, NULL, 10) : 0;
}

static void start_copies(rt_ctx *c) {
    PT(pthread_mutex_init(&c->copy_mu, NULL));
    c->check_copies = !c->serial && env_long("KILN_CHECK_COPIES") > 0;
    c->drop_copy_wait = (int)env_long("KILN_TEST_DROP_COPY_WAIT");
    c->copy_delay_us = env_long("KILN_COPY_DELAY_US");
    c->copy_plain = env_long("KILN_COPY_PLAIN") > 0;
    c->no_boost = env_long("KILN_TEST_NO_BOOST") > 0;
    c->act_hw = -1;
    if (env_long("KILN_MEASURE_PEAK") > 0) {
        memset(c->space[RT_SPACE_ACT], 0xff, (size_t)c->p->space_bytes[RT_SPACE_ACT]);
        c->act_hw = 0;
    }
}

static void measure_act(rt_ctx *c) {
    const unsigned char *a = (const unsigned char *)c->space[RT_SPACE_ACT];
    int64_t top = c->p->space_bytes[RT_SPACE_ACT];
    while (top > c->act_hw && a[top - 1] == 0xff) top--;
    if (top > c->act_hw) c->act_hw = top;
}

int64_t rt_act_high_water(rt_ctx *c) { return c->act_hw; }

/* Step thread: a launch of a copy gets an entry; its index, or -1. */
static int64_t note_copy(rt_ctx *c, rt_kernel k, const int64_t *args, int nargs, const char *name) {
    if ((k != rtk_offload && k != rtk_reload) || nargs < 3) return -1;
    PT(pthread_mutex_lock(&c->copy_mu));
    grow((void **)&c->copies, &c->capcopies, c->ncopies + 1, sizeof(Copy));
    char *lo = rt_arg_ptr(args[0]);
    c->copies[c->ncopies] = (Copy){lo, lo + args[2], c->seq, 0, 0, name};
    int64_t i = c->ncopies++;
    PT(pthread_mutex_unlock(&c->copy_mu));
    return i;
}

/* A worker, when the launch cmd starts (when 0) or ends (1). */
static void check_copies(rt_ctx *c, const Cmd *cmd, const int64_t *args, int when) {
    PT(pthread_mutex_lock(&c->copy_mu));
    for (int64_t i = 0; i < c->ncopies; i++) {
        const Copy *cp = &c->copies[i];
        if (i == cmd->copy) continue;
        int early = cp->seq < cmd->seq && !cp->done, late = cp->seq > cmd->seq && cp->started;
        if (!early && !late) continue;
        for (int a = 0; a < cmd->nargs; a++) {
            char *ptr = rt_arg_ptr(args[a]);
            if (ptr < cp->lo || ptr >= cp->hi) continue;
            rt_fail(c, "copy check: %s %s while %s into the bytes it uses (arg %d) %s: a missing event on the copy stream",
                    cmd->name ? cmd->name : "a kernel", when ? "ended" : "started", cp->name ? cp->name : "a copy", a,
                    early ? "had not finished" : "had already started");
            break;
        }
    }
    PT(pthread_mutex_unlock(&c->copy_mu));
}

/* An offload's copy: its host bytes are read only by its reload, most of
 * a pipeline period later, when they have long left the caches, so they
 * are written with non-temporal stores (x86-64's SSE2 movntdq, 64 bytes
 * an iteration, an sfence at the end so the record that follows publishes
 * them): no read for ownership of the destination's lines and no eviction
 * of the compute's working set by bytes nobody reads soon.  A reload keeps
 * memcpy: its backward reads the bytes next.  Same bytes either way.
 * Below 4 KiB, or off x86-64, memcpy. */
#if defined(__x86_64__) && defined(__SSE2__)
static void copy_out(char *d, const char *s, size_t n) {
    if (n < 4096) {
        memcpy(d, s, n);
        return;
    }
    size_t head = (16 - ((uintptr_t)d & 15)) & 15;
    memcpy(d, s, head);
    d += head, s += head, n -= head;
    size_t m = n & ~(size_t)63;
    for (size_t i = 0; i < m; i += 64) {
        __m128i x0 = _mm_loadu_si128((const __m128i *)(s + i)), x1 = _mm_loadu_si128((const __m128i *)(s + i + 16));
        __m128i x2 = _mm_loadu_si128((const __m128i *)(s + i + 32)), x3 = _mm_loadu_si128((const __m128i *)(s + i + 48));
        _mm_stream_si128((__m128i *)(d + i), x0);
        _mm_stream_si128((__m128i *)(d + i + 16), x1);
        _mm_stream_si128((__m128i *)(d + i + 32), x2);
        _mm_stream_si128((__m128i *)(d + i + 48), x3);
    }
    _mm_sfence();
    memcpy(d + m, s + m, n - m);
}
#else
static void copy_out(char *d, const char *s, size_t n) { memcpy(d, s, n); }
#endif

/* args: dst, src, bytes; out: an offload (copy_out) */
static void run_copy(rt_ctx *c, const int64_t *a, int out) {
    if (c->check_copies && tl_copy >= 0) {
        PT(pthread_mutex_lock(&c->copy_mu));
        if (c->copies[tl_copy].started) rt_fail(c, "copy check: %s ran twice", c->copies[tl_copy].name ? c->copies[tl_copy].name : "a copy");
        c->copies[tl_copy].started = 1;
        PT(pthread_mutex_unlock(&c->copy_mu));
    }
    if (c->copy_delay_us > 0) usleep((useconds_t)c->copy_delay_us);
    if (a[2] > 0 && out && !c->copy_plain) copy_out(rt_arg_ptr(a[0]), rt_arg_ptr(a[1]), (size_t)a[2]);
    else if (a[2] > 0) memcpy(rt_arg_ptr(a[0]), rt_arg_ptr(a[1]), (size_t)a[2]);
    if (c->check_copies && tl_copy >= 0) {
        PT(pthread_mutex_lock(&c->copy_mu));
        c->copies[tl_copy].done = 1;
        PT(pthread_mutex_unlock(&c->copy_mu));
    }
}

void rtk_offload(rt_ctx *c, const int64_t *a) { run_copy(c, a, 1); }
void rtk_reload(rt_ctx *c, const int64_t *a) { run_copy(c, a, 0); }

/* ---- creating and freeing ---- */

/* Zeroed, page-aligned memory for each space (rt_common.c). */
static int map_spaces(rt_ctx *c) {
    for (int i = 0; i < RT_NSPACES; i++)
        if (!(c->space[i] = rt_map_host(c->p->space_bytes[i], rt_space_name[i], &c->mapped[i]))) return 0;
    return 1;
}

static void unmap_spaces(rt_ctx *c) {
    for (int i = 0; i < RT_NSPACES; i++)
        if (rt_unmap_host(c->space[i], c->mapped[i])) exit(1);
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

/* The default thread count: the cores this process may run on, but, when
 * the local ranks (OMPI_COMM_WORLD_LOCAL_SIZE) are unbound and together
 * would run more threads than the host has cores, the host's cores over
 * them (at least 1): 4 ranks of 2 threads on 2 cores ran the small model's
 * dp 4 step at 16.7-17.3 ms against 12.0-12.3 with one thread each — a
 * GEMM's static split waits for its descheduled OpenBLAS helper, and the
 * spinning helpers made 170 000 context switches a second (bench/RESULTS.md,
 * session 10).  kiln calibrate (affinity_cores) applies the same rule. */
static int cores(void) {
    cpu_set_t set;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    int a = sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0 ? CPU_COUNT(&set) : n > 0 ? (int)n : 1;
    const char *ls = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    long local = ls ? strtol(ls, NULL, 10) : 1;
    if (n > 0 && local > 1 && local * a > n) { /* oversubscribed: the host's cores shared among its ranks */
        long share = n / local;
        return share < 1 ? 1 : share < a ? (int)share : a;
    }
    return a;
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
        PT(pthread_cond_init(&s->progress, NULL));
        s->low = c->copy_idle && (i == 2 || i == 3); /* d2h, h2d (schedule.c) */
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
            PT(pthread_cond_destroy(&s->progress));
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
    if (!rt_check_program(p, RT_DEV_CPU)) return NULL;
    rt_ctx *c = xrealloc(NULL, sizeof *c);
    memset(c, 0, sizeof *c);
    c->p = p;
    c->serial = o->serial;
    c->nstreams = p->nstreams > 0 ? p->nstreams : 1;
    c->nevents = p->nevents;
    if (clock_gettime(CLOCK_MONOTONIC, &c->t0)) die("clock_gettime", errno);
    if (!(c->comm = rt_comm_new(p)) || !rt_check_buckets(p) || !map_spaces(c) || (o->trace_path && !open_trace(c, o->trace_path))) {
        unmap_spaces(c);
        rt_comm_free(c->comm);
        free(c->trace_tmp);
        free(c->trace_path_rank);
        free(c);
        return NULL;
    }
    int threads = o->threads > 0 ? o->threads : cores();
    PT(pthread_mutex_init(&c->err_mu, NULL));
    start_copies(c);
    pool_start(&c->pool, c->serial ? 1 : threads);
    openblas_set_num_threads(c->serial ? 1 : threads);
    start_events(c);
    c->copy_idle = !c->serial && idle_priority_ok();
    start_streams(c);
    return c;
}

/* ---- the trace ---- */

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
            rt_json_string(f, name, at);
            fprintf(f, ",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":%d,\"tid\":%d", sp->start, sp->end - sp->start, pid, i);
            if (at || sp->bytes || sp->by >= 0) {
                fprintf(f, ",\"args\":{");
                if (at) fprintf(f, "\"at\":"), rt_json_string(f, at + 1, NULL);
                if (sp->bytes) fprintf(f, "%s\"bytes\":%lld", at ? "," : "", (long long)sp->bytes);
                if (sp->by >= 0) fprintf(f, "%s\"by\":%d", at || sp->bytes ? "," : "", sp->by);
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

/* KILN_THREAD_CPU=1: each rank prints its threads' CPU seconds at the end
 * (the step thread, each stream's worker; the process's, which adds the
 * pool's and MPI's threads) and who ran the copies: what the copies cost
 * the cores, by thread, whatever else runs on the machine. */
static void print_thread_cpu(rt_ctx *c) {
    static const char *nm[] = {"compute", "comm", "d2h", "h2d"};
    char line[600];
    int n = snprintf(line, sizeof line, "kiln runtime: rank %d cpu s:", rt_world_rank(c));
    struct timespec t;
    for (int i = 0; i < c->nstreams && i < 4 && n < (int)sizeof line - 80; i++) {
        clockid_t id;
        if (c->serial || pthread_getcpuclockid(c->streams[i].th, &id) || clock_gettime(id, &t)) continue;
        n += snprintf(line + n, sizeof line - (size_t)n, " %s %.3f", nm[i], (double)t.tv_sec + t.tv_nsec * 1e-9);
    }
    if (n < (int)sizeof line - 80 && !clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t))
        n += snprintf(line + n, sizeof line - (size_t)n, " main %.3f", (double)t.tv_sec + t.tv_nsec * 1e-9);
    if (n < (int)sizeof line - 80 && !clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t))
        n += snprintf(line + n, sizeof line - (size_t)n, " process %.3f", (double)t.tv_sec + t.tv_nsec * 1e-9);
    for (int i = 2; i < c->nstreams && i < 4 && n < (int)sizeof line - 60; i++)
        n += snprintf(line + n, sizeof line - (size_t)n, "; %s copies by worker %lld, by helpers %lld, boosts %lld", nm[i],
                      (long long)c->streams[i].ran_self, (long long)c->streams[i].ran_helped, (long long)c->streams[i].boosts);
    fprintf(stderr, "%s%s\n", line, c->copy_idle ? " (copy workers at idle priority)" : "");
}

void rt_free(rt_ctx *c) {
    if (!c) return;
    if (env_long("KILN_THREAD_CPU") > 0) print_thread_cpu(c);
    if (c->act_hw >= 0)
        fprintf(stderr, "kiln runtime: rank %d stage %d: act high-water mark %lld bytes (measured; act space %lld, host space %lld)\n",
                rt_world_rank(c), c->p->stage, (long long)c->act_hw, (long long)c->p->space_bytes[RT_SPACE_ACT],
                (long long)c->p->space_bytes[RT_SPACE_HOST]);
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
    PT(pthread_mutex_destroy(&c->copy_mu));
    free(c->copies);
    free(c);
}

/* ---- memory and parameters ---- */

char *rt_space(rt_ctx *c, int space) { return space >= 0 && space < RT_NSPACES ? c->space[space] : NULL; }

/* NULL for a param without storage (space -1). */
void *rt_tensor_ptr(rt_ctx *c, const rt_tensor *t) {
    return t->space >= 0 && t->space < RT_NSPACES ? c->space[t->space] + t->offset : NULL;
}


/* The CPU's host views are the program's memory itself: nothing to copy. */
int rt_pull(rt_ctx *c, int space, int64_t offset, int64_t bytes, char *err, int errlen) { return 0; }
int rt_push(rt_ctx *c, int space, int64_t offset, int64_t bytes, char *err, int errlen) { return 0; }
int rt_pull_tensor(rt_ctx *c, const rt_tensor *t, char *err, int errlen) { return 0; }
int rt_push_tensor(rt_ctx *c, const rt_tensor *t, char *err, int errlen) { return 0; }

/* rt_common.c: the generator both devices share. */
void rt_init_params(rt_ctx *c, uint64_t seed) { rt_init_host(c, c->p, seed); }
