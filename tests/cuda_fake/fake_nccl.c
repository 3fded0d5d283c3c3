/* fake_nccl.c — a fake libnccl.so.2 for running the CUDA trainer without a
 * GPU (fake_cuda.c says why and how), on one rank or on several processes
 * of one machine (`mpirun -np N` of a trainer compiled with --dp or --cp).
 *
 * The model.
 *   - A communicator is a shared-memory segment.  ncclGetUniqueId makes a
 *     name ("/kiln-fake-nccl-PID-N-NANOS"); every rank's ncclCommInitRank
 *     opens that POSIX shared-memory object, registers in its header (its
 *     pid and the rank count it was given: two ranks with one number, or
 *     counts that disagree, fail at once), and waits until all have joined;
 *     rank 0 then sizes the segment (the header, one collective slot per
 *     rank, one point-to-point channel per ordered pair of ranks) and
 *     unlinks the name, so nothing is left in /dev/shm once the ranks have
 *     joined (an init that times out removes it too; one refused for
 *     disagreeing counts leaves it, with the reason, for the ranks still to
 *     come).  A communicator of one rank uses private memory (no name).
 *   - Work runs when the fake driver's stream reaches it: every call (or
 *     every ncclGroupStart/End group) becomes ONE host op on the stream
 *     through kiln_fake_cuda_enqueue (fake_cuda.h), so in eager mode it
 *     runs in the call, once the stream's earlier work is done, and is recorded while the stream captures and run at each
 *     cuGraphLaunch of the graph, in the replay order the fake driver
 *     picks.  Matching is by run order, as NCCL's is by issue order: the
 *     k-th collective a rank runs on a communicator meets every other
 *     rank's k-th; the k-th message from rank a to rank b meets b's k-th
 *     receive from a.  Buffers are read and written when the op runs.
 *   - Collectives (ncclAllReduce, ncclReduceScatter, ncclAllGather) move
 *     their data in rounds through the ranks' slots (KILN_FAKE_NCCL_CHUNK
 *     bytes each, default 1 MiB): each rank copies its part of the round
 *     into its slot, all meet at a barrier, each reads every slot and
 *     writes its result, all meet again.  Before the first round's result
 *     each rank compares every rank's descriptor of the call (its number on
 *     the communicator, the collective, count and data type): any
 *     difference fails the call on every rank (ncclInvalidUsage, one line
 *     naming both sides), not a hang.  Sums are taken in rank order,
 *     rounding to the data type after every addition (NCCL sums in the
 *     type's own arithmetic: f32 adds for ncclFloat32, bf16-rounded f32 adds
 *     for ncclBfloat16, wrapping integer adds), so every rank gets the same
 *     bits.
 *   - Point to point (ncclSend, ncclRecv): the channel a->b carries one
 *     chunk at a time (KILN_FAKE_NCCL_CHUNK bytes) with a header (message
 *     number, count, data type); the receiver checks that the message is
 *     the one it expects with the same count and type (else both sides fail
 *     with ncclInvalidUsage).  A send is complete when its last chunk has
 *     been taken, so a lone send waits for the peer's receive, as NCCL's
 *     does.  The sends and receives of one group progress together (a
 *     chunk here, a chunk there), so {send to i+1, recv from i-1} on every
 *     rank of a ring completes; the same calls outside a group deadlock in
 *     NCCL and time out here.  Messages between one pair go in call order.
 *   - Groups: ncclGroupStart/End batch the calls between them; at the
 *     outermost ncclGroupEnd the batch is one host op: its collectives run
 *     in call order, then its sends and receives together.  When the calls
 *     name several streams, the op goes on the first call's stream and the
 *     streams are joined as NCCL joins them (each other stream's work so
 *     far before the op, the op before each other stream's later work:
 *     events, recorded and waited on, so a capture records the edges).
 *   - Waits: every wait (a barrier, a free or full channel, the other ranks
 *     joining) polls shared memory with a backoff (yield, then sleeps up to
 *     1 ms: ranks share the CPUs with the emulator).  A wait fails when the
 *     communicator was aborted by another rank (its message is passed on,
 *     with its result: a mismatch is ncclInvalidUsage on every rank), when
 *     a rank's process is gone (ncclRemoteError), or after
 *     KILN_FAKE_NCCL_TIMEOUT seconds (default 10) without progress:
 *     ncclSystemError, with one line saying what every rank is doing (a
 *     deadlock becomes an error, not a hang).  A failure marks the
 *     communicator aborted for every rank, so the others fail at once.
 *   - Threads: the group state is per thread, as NCCL's; a communicator is
 *     used by one thread at a time (NCCL asks the same).
 *   - Failures at run time are host-op failures of the fake driver
 *     (CUDA_ERROR_LAUNCH_FAILED, sticky; its "fake cuda: ... failed: ..."
 *     line carries the message); the NCCL call that ran the op eagerly
 *     returns the NCCL result above.  In a replayed graph cuGraphLaunch
 *     returns the launch failure.
 *
 * Refused at the call (ncclInvalidArgument / ncclInvalidUsage, with one
 * "fake nccl: " line on stderr): a rank count outside 1..64, a rank out of
 * range, an id not made by ncclGetUniqueId, a peer out of range, a
 * reduction other than ncclSum, a data type other than the contract's
 * (ncclFloat32, ncclBfloat16, ncclInt32, ncclUint8), a NULL or destroyed
 * communicator, a buffer outside the fake driver's allocations, a
 * collective whose buffers overlap other than in NCCL's in-place form
 * (undefined in NCCL; the fake's staging would hide it), a send or
 * receive to the rank itself outside a group, and sends and receives to the
 * rank itself in a group that do not pair up (count and type, in order).
 *
 * Test hooks: KILN_FAKE_NCCL_CHUNK=BYTES (the slot and chunk size, at least
 * 64: small values exercise the rounds), KILN_FAKE_NCCL_TIMEOUT=SECONDS,
 * and KILN_FAKE_NCCL_TEST_DROP_RANK=R, a planted bug for tests to catch:
 * the sums (all-reduce, reduce-scatter) of communicators with more than one
 * rank leave out rank R's contribution.
 */
#include <cuda.h>
#include <errno.h>
#include <fcntl.h>
#include <nccl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fake_cuda.h"

#define COMM_MAGIC 0x6b4e636cu /* "kNcl" */
#define MAX_RANKS 64
#define ID_PREFIX "/kiln-fake-nccl-"
#define DEFAULT_CHUNK (1u << 20)
#define MIN_CHUNK 64
#define DEFAULT_TIMEOUT_S 10.0
#define DOING_LEN 120
#define MSG_LEN 1024

/* ---- the shared segment ---- */

enum { K_ALLREDUCE, K_REDUCESCATTER, K_ALLGATHER, K_SEND, K_RECV };
static const char *const kind_call[] = {"ncclAllReduce", "ncclReduceScatter", "ncclAllGather", "ncclSend", "ncclRecv"};

/* One rank's description of the collective it runs (compared by all). */
typedef struct {
    unsigned long long seq, count;
    int kind, dt;
} Desc;

typedef struct {
    atomic_int present; /* joined */
    int nranks;         /* the count it was given */
    pid_t pid;
    Desc desc;
    char doing[DOING_LEN]; /* for the others' timeout messages (racy reads are fine: diagnostics) */
} RankState;

typedef struct {
    atomic_int arrived, sized;
    atomic_int aborted; /* 0; 1 while the message is written; 2 */
    int abort_result;   /* the aborting rank's ncclResult_t, which every rank's failing call returns */
    char abort_msg[MSG_LEN];
    atomic_uint bar_count, bar_gen;
    /* geometry, written by rank 0 before `sized` */
    int nranks;
    size_t coll_bytes, chunk_bytes, coll_off, chan_off, chan_stride, total;
    RankState rank[MAX_RANKS];
} Header;

/* The channel from one rank to another: one chunk in flight. */
typedef struct {
    atomic_ullong produced, consumed; /* chunks, over all messages */
    unsigned long long msg, count;    /* the chunk's message: number and count */
    size_t offset, len;               /* the chunk's bytes in the message */
    int dt;
} Channel;

struct ncclComm {
    unsigned magic;
    int nranks, rank;
    int dead; /* a call of this rank failed */
    int drop; /* KILN_FAKE_NCCL_TEST_DROP_RANK, or -1 */
    unsigned char *base;
    size_t mapped;
    Header *h;
    unsigned long long seq;           /* collectives run */
    unsigned long long sent[MAX_RANKS], received[MAX_RANKS]; /* messages per peer */
    struct ncclComm *next;            /* the live list */
};

/* ---- errors ---- */

static _Thread_local ncclResult_t run_result; /* the last host op's NCCL result (eager calls return it) */

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

/* ---- small helpers ---- */

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static double timeout_s(void) {
    const char *s = getenv("KILN_FAKE_NCCL_TIMEOUT");
    char *end;
    double v = s && *s ? strtod(s, &end) : DEFAULT_TIMEOUT_S;
    return s && *s && (*end || v <= 0) ? DEFAULT_TIMEOUT_S : v;
}

static size_t chunk_bytes(void) {
    const char *s = getenv("KILN_FAKE_NCCL_CHUNK");
    char *end;
    unsigned long long v = s && *s ? strtoull(s, &end, 10) : DEFAULT_CHUNK;
    if (s && *s && *end) v = DEFAULT_CHUNK;
    if (v < MIN_CHUNK) v = MIN_CHUNK;
    return (size_t)(v + 63) / 64 * 64;
}

static int drop_rank(void) {
    const char *s = getenv("KILN_FAKE_NCCL_TEST_DROP_RANK");
    return s && *s ? atoi(s) : -1;
}

static size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

static size_t type_size(ncclDataType_t t) {
    switch (t) {
    case ncclFloat32: return 4;
    case ncclBfloat16: return 2;
    case ncclInt32: return 4;
    case ncclUint8: return 1;
    default: return 0;
    }
}

static const char *type_name(int t) {
    switch (t) {
    case ncclFloat32: return "f32";
    case ncclBfloat16: return "bf16";
    case ncclInt32: return "i32";
    case ncclUint8: return "u8";
    default: return "?";
    }
}

/* ---- live communicators (a recorded op may outlive its communicator) ---- */

static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static struct ncclComm *live;

static void live_add(struct ncclComm *c) {
    pthread_mutex_lock(&live_mu);
    c->next = live, live = c;
    pthread_mutex_unlock(&live_mu);
}

static void live_remove(struct ncclComm *c) {
    pthread_mutex_lock(&live_mu);
    for (struct ncclComm **p = &live; *p; p = &(*p)->next)
        if (*p == c) {
            *p = c->next;
            break;
        }
    pthread_mutex_unlock(&live_mu);
}

static int is_live(const struct ncclComm *c) {
    int found = 0;
    pthread_mutex_lock(&live_mu);
    for (struct ncclComm *p = live; p && !found; p = p->next) found = p == c;
    pthread_mutex_unlock(&live_mu);
    return found && c->magic == COMM_MAGIC;
}

static ncclResult_t check_comm(const char *call, ncclComm_t comm) {
    if (!comm || !is_live(comm)) return fail(ncclInvalidArgument, "%s: not a live communicator", call);
    return ncclSuccess;
}

/* ---- the segment's parts ---- */

static unsigned char *slot_of(const struct ncclComm *c, int r) { return c->base + c->h->coll_off + (size_t)r * c->h->coll_bytes; }

static Channel *channel_of(const struct ncclComm *c, int from, int to) {
    return (Channel *)(c->base + c->h->chan_off + ((size_t)from * (size_t)c->nranks + (size_t)to) * c->h->chan_stride);
}

static unsigned char *chunk_of(Channel *ch) { return (unsigned char *)ch + align_up(sizeof(Channel), 64); }

static void set_doing(struct ncclComm *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_doing(struct ncclComm *c, const char *fmt, ...) {
    char t[DOING_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t, sizeof t, fmt, ap);
    va_end(ap);
    memcpy(c->h->rank[c->rank].doing, t, sizeof t);
}

/* Mark the communicator aborted for every rank (the first message wins). */
static void abort_comm(struct ncclComm *c, ncclResult_t r, const char *msg) {
    int expect = 0;
    c->dead = 1;
    if (atomic_compare_exchange_strong(&c->h->aborted, &expect, 1)) {
        c->h->abort_result = (int)r;
        snprintf(c->h->abort_msg, sizeof c->h->abort_msg, "rank %d: %.1000s", c->rank, msg);
        atomic_store(&c->h->aborted, 2);
    }
}

/* Fail the running op: err = msg, the communicator aborted, run_result = r. */
static int op_fail(struct ncclComm *c, ncclResult_t r, char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int op_fail(struct ncclComm *c, ncclResult_t r, char *err, size_t errlen, const char *fmt, ...) {
    char t[MSG_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t, sizeof t, fmt, ap);
    va_end(ap);
    snprintf(err, errlen, "%s (%s)", t, ncclGetErrorString(r));
    if (c && c->h) abort_comm(c, r, t);
    run_result = r;
    return -1;
}

/* ---- waiting ---- */

typedef struct {
    double last_progress, last_check;
    int idle; /* polls without progress */
} Waiter;

static Waiter waiter(void) {
    double t = now_s();
    return (Waiter){t, t, 0};
}

static void progressed(Waiter *w) {
    w->last_progress = now_s();
    w->idle = 0;
}

/* What every other rank is doing, for a timeout message. */
static void others_doing(const struct ncclComm *c, char *out, size_t len) {
    size_t k = 0;
    out[0] = 0;
    for (int r = 0; r < c->nranks && k < len; r++) {
        if (r == c->rank) continue;
        char t[DOING_LEN];
        memcpy(t, c->h->rank[r].doing, sizeof t);
        t[DOING_LEN - 1] = 0;
        k += (size_t)snprintf(out + k, len - k, "%srank %d: %s", k ? "; " : "", r, t[0] ? t : "(nothing yet)");
    }
}

/* Called when a poll found nothing to do: pause, then fail on an abort by
 * another rank, the exit of a rank in `waits_on` (bit r: rank r; a rank
 * that finished its part and left is no failure of a wait that does not
 * need it) or the timeout.  0 to poll again, or -1 after op_fail. */
static int stalled(struct ncclComm *c, unsigned long long waits_on, Waiter *w, const char *what, char *err, size_t errlen) {
    if (w->idle < 32) sched_yield();
    else {
        long ns = 20000L << (w->idle < 38 ? w->idle - 32 : 6); /* 20 us .. 1.28 ms */
        if (ns > 1000000L) ns = 1000000L;
        nanosleep(&(struct timespec){0, ns}, NULL);
    }
    w->idle++;
    if (atomic_load(&c->h->aborted) == 2) {
        char msg[MSG_LEN];
        memcpy(msg, c->h->abort_msg, sizeof msg);
        msg[MSG_LEN - 1] = 0;
        c->dead = 1;
        run_result = (ncclResult_t)c->h->abort_result;
        snprintf(err, errlen, "%s: the communicator was aborted by %s", what, msg);
        return -1;
    }
    double t = now_s();
    if (t - w->last_check < 0.1) return 0;
    w->last_check = t;
    for (int r = 0; r < c->nranks; r++) {
        pid_t pid = c->h->rank[r].pid;
        if (r != c->rank && (waits_on >> r & 1) && pid > 0 && kill(pid, 0) != 0 && errno == ESRCH)
            return op_fail(c, ncclRemoteError, err, errlen, "%s: rank %d (pid %d) has exited", what, r, (int)pid);
    }
    double limit = timeout_s();
    if (t - w->last_progress >= limit) {
        char others[900];
        others_doing(c, others, sizeof others);
        return op_fail(c, ncclSystemError, err, errlen,
                       "%s on rank %d of %d: no progress for %.1f s (KILN_FAKE_NCCL_TIMEOUT), a deadlock? %s", what, c->rank,
                       c->nranks, limit, others);
    }
    return 0;
}

/* Every rank of c meets here.  0, or -1 after op_fail. */
static int barrier(struct ncclComm *c, const char *what, char *err, size_t errlen) {
    Header *h = c->h;
    if (c->nranks == 1) return 0;
    unsigned gen = atomic_load(&h->bar_gen);
    if (atomic_fetch_add(&h->bar_count, 1) == (unsigned)c->nranks - 1) {
        atomic_store(&h->bar_count, 0);
        atomic_fetch_add(&h->bar_gen, 1);
        return 0;
    }
    Waiter w = waiter();
    while (atomic_load(&h->bar_gen) == gen)
        if (stalled(c, ~0ull, &w, what, err, errlen)) return -1;
    return 0;
}

/* ---- ids and communicators ---- */

ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId) {
    static atomic_uint counter;
    if (!uniqueId) return fail(ncclInvalidArgument, "ncclGetUniqueId: NULL");
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    memset(uniqueId, 0, sizeof *uniqueId);
    snprintf(uniqueId->internal, sizeof uniqueId->internal, ID_PREFIX "%d-%u-%llx", (int)getpid(), atomic_fetch_add(&counter, 1) + 1,
             (unsigned long long)t.tv_sec * 1000000000ull + (unsigned long long)t.tv_nsec);
    return ncclSuccess;
}

/* The segment's geometry for n ranks, in h. */
static void set_geometry(Header *h, int n) {
    size_t chunk = chunk_bytes(), coll = chunk < (size_t)n * 64 ? (size_t)n * 64 : chunk;
    h->nranks = n;
    h->coll_bytes = coll;
    h->chunk_bytes = chunk;
    h->coll_off = align_up(sizeof(Header), 4096);
    h->chan_stride = align_up(align_up(sizeof(Channel), 64) + chunk, 64);
    h->chan_off = h->coll_off + (size_t)n * coll;
    h->total = h->chan_off + (size_t)n * (size_t)n * h->chan_stride;
}

static struct ncclComm *new_comm(int nranks, int rank) {
    struct ncclComm *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->magic = COMM_MAGIC;
    c->nranks = nranks, c->rank = rank;
    c->drop = nranks > 1 ? drop_rank() : -1;
    return c;
}

/* One rank: private memory. */
static ncclResult_t init_alone(struct ncclComm *c) {
    Header probe;
    set_geometry(&probe, 1);
    void *p = mmap(NULL, probe.total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return fail(ncclSystemError, "ncclCommInitRank: mmap of %zu bytes: %s", probe.total, strerror(errno));
    c->base = p, c->mapped = probe.total, c->h = p;
    *c->h = probe;
    c->h->rank[0].pid = getpid();
    atomic_store(&c->h->rank[0].present, 1);
    return ncclSuccess;
}

/* Wait until all n ranks joined the header (checking that they agree on
 * n); ncclSuccess, or the error after one line. */
static ncclResult_t wait_joined(Header *h, int nranks, int rank, const char *name) {
    double start = now_s(), limit = timeout_s();
    for (int idle = 0;; idle++) {
        /* arrived first: a rank counts itself after publishing its count, so
         * once all have arrived the scan below sees every count */
        int all = atomic_load(&h->arrived) >= nranks;
        for (int r = 0; r < MAX_RANKS; r++)
            if (atomic_load(&h->rank[r].present) == 1 && h->rank[r].nranks != nranks) {
                int expect = 0;
                if (atomic_compare_exchange_strong(&h->aborted, &expect, 1)) { /* tell the ranks that come later */
                    h->abort_result = ncclInvalidUsage;
                    snprintf(h->abort_msg, sizeof h->abort_msg, "rank %d was given %d ranks, rank %d %d", rank, nranks, r,
                             h->rank[r].nranks);
                    atomic_store(&h->aborted, 2);
                }
                return fail(ncclInvalidUsage, "ncclCommInitRank(%s): rank %d was given %d ranks, rank %d %d", name, rank, nranks, r,
                            h->rank[r].nranks);
            }
        if (all) return ncclSuccess; /* (an abort after that is the ops') */
        if (atomic_load(&h->aborted) == 2)
            return fail((ncclResult_t)h->abort_result, "ncclCommInitRank(%s): rank %d: %.900s", name, rank, h->abort_msg);
        if (now_s() - start > limit)
            return fail(ncclSystemError, "ncclCommInitRank(%s): rank %d of %d: only %d ranks joined within %.1f s (KILN_FAKE_NCCL_TIMEOUT)",
                        name, rank, nranks, atomic_load(&h->arrived), limit);
        nanosleep(&(struct timespec){0, idle < 10 ? 50000L : 1000000L}, NULL);
    }
}

/* Several ranks: the id's shared-memory object.  Sets c->base etc. */
static ncclResult_t init_shared(struct ncclComm *c, const char *name) {
    int fd = shm_open(name, O_RDWR | O_CREAT, 0600);
    if (fd < 0) return fail(ncclSystemError, "ncclCommInitRank(%s): shm_open: %s", name, strerror(errno));
    size_t hb = align_up(sizeof(Header), 4096);
    struct stat st;
    ncclResult_t r = ncclSystemError;
    Header *h = MAP_FAILED;
    if (fstat(fd, &st) != 0 || ((size_t)st.st_size < hb && ftruncate(fd, (off_t)hb) != 0)) {
        fail(r, "ncclCommInitRank(%s): sizing the header: %s", name, strerror(errno));
        goto out;
    }
    h = mmap(NULL, hb, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (h == MAP_FAILED) {
        fail(r, "ncclCommInitRank(%s): mmap: %s", name, strerror(errno));
        goto out;
    }
    RankState *me = &h->rank[c->rank];
    int expect = 0;
    if (!atomic_compare_exchange_strong(&me->present, &expect, 2)) { /* 2: claimed, nranks not yet written */
        r = fail(ncclInvalidUsage, "ncclCommInitRank(%s): rank %d joined twice", name, c->rank);
        goto out;
    }
    me->nranks = c->nranks, me->pid = getpid();
    atomic_store(&me->present, 1);
    atomic_fetch_add(&h->arrived, 1);
    if ((r = wait_joined(h, c->nranks, c->rank, name)) != ncclSuccess) goto out;
    r = ncclSystemError;
    if (c->rank == 0) {
        shm_unlink(name); /* everyone has it open */
        Header g;
        set_geometry(&g, c->nranks);
        if (ftruncate(fd, (off_t)g.total) != 0) {
            fail(r, "ncclCommInitRank(%s): growing to %zu bytes: %s", name, g.total, strerror(errno));
            goto out;
        }
        h->nranks = g.nranks, h->coll_bytes = g.coll_bytes, h->chunk_bytes = g.chunk_bytes, h->coll_off = g.coll_off;
        h->chan_off = g.chan_off, h->chan_stride = g.chan_stride, h->total = g.total;
        atomic_store(&h->sized, 1);
    } else {
        double start = now_s();
        while (!atomic_load(&h->sized)) {
            if (now_s() - start > timeout_s()) {
                fail(r, "ncclCommInitRank(%s): rank 0 never sized the segment", name);
                goto out;
            }
            nanosleep(&(struct timespec){0, 100000L}, NULL);
        }
    }
    size_t total = h->total;
    void *p = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        fail(r, "ncclCommInitRank(%s): mmap of %zu bytes: %s", name, total, strerror(errno));
        goto out;
    }
    c->base = p, c->mapped = total, c->h = p;
    r = ncclSuccess;
out:
    if (h != MAP_FAILED) munmap(h, hb);
    close(fd);
    /* after a timeout nobody else is coming: remove the name (ENOENT when
     * it is gone already); after a refusal, ranks still to come must find
     * the segment and its abort message, so the name stays (a test that
     * provokes one removes it: selftest_nccl.c) */
    if (r == ncclSystemError) shm_unlink(name);
    return r;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank) {
    if (!comm) return fail(ncclInvalidArgument, "ncclCommInitRank: comm is NULL");
    *comm = NULL;
    if (nranks < 1 || nranks > MAX_RANKS) return fail(ncclInvalidArgument, "ncclCommInitRank: %d ranks (the fake has 1 to %d)", nranks, MAX_RANKS);
    if (rank < 0 || rank >= nranks) return fail(ncclInvalidArgument, "ncclCommInitRank: rank %d of %d", rank, nranks);
    char name[NCCL_UNIQUE_ID_BYTES + 1];
    memcpy(name, commId.internal, NCCL_UNIQUE_ID_BYTES);
    name[NCCL_UNIQUE_ID_BYTES] = 0;
    if (strncmp(name, ID_PREFIX, strlen(ID_PREFIX)) != 0)
        return fail(ncclInvalidArgument, "ncclCommInitRank: the id was not made by ncclGetUniqueId");
    struct ncclComm *c = new_comm(nranks, rank);
    if (!c) return fail(ncclSystemError, "ncclCommInitRank: out of memory");
    ncclResult_t r = nranks == 1 ? init_alone(c) : init_shared(c, name);
    if (r != ncclSuccess) {
        free(c);
        return r;
    }
    set_doing(c, "joined");
    live_add(c);
    *comm = c;
    return ncclSuccess;
}

static ncclResult_t free_comm(const char *call, ncclComm_t comm, int aborting) {
    ncclResult_t r = check_comm(call, comm);
    if (r) return r;
    live_remove(comm);
    if (aborting) abort_comm(comm, ncclRemoteError, "ncclCommAbort");
    else set_doing(comm, "destroyed its communicator");
    munmap(comm->base, comm->mapped);
    comm->magic = 0;
    free(comm);
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) { return free_comm("ncclCommDestroy", comm, 0); }
ncclResult_t ncclCommAbort(ncclComm_t comm) { return free_comm("ncclCommAbort", comm, 1); }

/* ---- the work: one call of a group ---- */

typedef struct {
    int kind;
    struct ncclComm *comm;
    const unsigned char *send;
    unsigned char *recv;
    size_t count; /* allreduce: n; reducescatter: recvcount; allgather: sendcount; send/recv: count */
    int dt, peer;
    CUstream stream;
} Item;

typedef struct {
    int n;
    Item item[];
} Work;

/* ---- sums ---- */

static float bf16_to_f32(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t f32_to_bf16(float f) { /* round to nearest even; NaN stays NaN */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

/* dst[0..m) = the sum over ranks of src[r][0..m), in rank order (rank
 * `drop` left out: the planted bug), rounded to dt after every add. */
static void sum_into(unsigned char *dst, unsigned char *const *src, int n, int drop, size_t m, int dt) {
    int ranks[MAX_RANKS], k = 0;
    for (int r = 0; r < n; r++)
        if (r != drop) ranks[k++] = r;
    if (k == 0) ranks[k++] = 0;
    for (size_t e = 0; e < m; e++) switch (dt) {
        case ncclFloat32: {
            float acc, x;
            memcpy(&acc, src[ranks[0]] + 4 * e, 4);
            for (int j = 1; j < k; j++) memcpy(&x, src[ranks[j]] + 4 * e, 4), acc += x;
            memcpy(dst + 4 * e, &acc, 4);
            break;
        }
        case ncclBfloat16: {
            uint16_t b;
            memcpy(&b, src[ranks[0]] + 2 * e, 2);
            for (int j = 1; j < k; j++) {
                uint16_t x;
                memcpy(&x, src[ranks[j]] + 2 * e, 2);
                b = f32_to_bf16(bf16_to_f32(b) + bf16_to_f32(x));
            }
            memcpy(dst + 2 * e, &b, 2);
            break;
        }
        case ncclInt32: {
            uint32_t acc, x;
            memcpy(&acc, src[ranks[0]] + 4 * e, 4);
            for (int j = 1; j < k; j++) memcpy(&x, src[ranks[j]] + 4 * e, 4), acc += x;
            memcpy(dst + 4 * e, &acc, 4);
            break;
        }
        default: {
            uint8_t acc = src[ranks[0]][e];
            for (int j = 1; j < k; j++) acc = (uint8_t)(acc + src[ranks[j]][e]);
            dst[e] = acc;
        }
        }
}

/* ---- collectives ---- */

static void describe(char *out, size_t len, const Desc *d) {
    snprintf(out, len, "%s #%llu (%llu x %s)", kind_call[d->kind], d->seq, d->count, type_name(d->dt));
}

/* After the first barrier: every rank's descriptor equals this rank's. */
static int same_call(struct ncclComm *c, const Desc *mine, char *err, size_t errlen) {
    for (int r = 0; r < c->nranks; r++) {
        Desc d = c->h->rank[r].desc;
        if (d.seq == mine->seq && d.kind == mine->kind && d.count == mine->count && d.dt == mine->dt) continue;
        char a[160], b[160];
        describe(a, sizeof a, mine), describe(b, sizeof b, &d);
        return op_fail(c, ncclInvalidUsage, err, errlen,
                       "%s on rank %d of %d meets rank %d's %s: every rank must issue the same collectives, counts and types "
                       "in the same order",
                       a, c->rank, c->nranks, r, b);
    }
    return 0;
}

/* One collective: rounds through the slots.  0, or -1 after op_fail. */
static int run_collective(const Item *it, char *err, size_t errlen) {
    struct ncclComm *c = it->comm;
    int n = c->nranks, me = c->rank;
    size_t es = type_size(it->dt), total = it->count;
    size_t per = it->kind == K_REDUCESCATTER ? c->h->coll_bytes / (es * (size_t)n) : c->h->coll_bytes / es;
    size_t rounds = total ? (total + per - 1) / per : 1;
    Desc d = {++c->seq, it->count, it->kind, it->dt};
    char what[160];
    describe(what, sizeof what, &d);
    set_doing(c, "%s", what);
    c->h->rank[me].desc = d;
    unsigned char *slots[MAX_RANKS];
    for (int r = 0; r < n; r++) slots[r] = slot_of(c, r);
    for (size_t k = 0; k < rounds; k++) {
        size_t off = k * per, m = total - off < per ? total - off : per;
        if (it->kind == K_REDUCESCATTER)
            for (int j = 0; j < n; j++) memcpy(slots[me] + (size_t)j * m * es, it->send + ((size_t)j * total + off) * es, m * es);
        else memcpy(slots[me], it->send + off * es, m * es);
        if (barrier(c, what, err, errlen) || (k == 0 && same_call(c, &d, err, errlen))) return -1;
        if (it->kind == K_ALLREDUCE) sum_into(it->recv + off * es, slots, n, c->drop, m, it->dt);
        else if (it->kind == K_ALLGATHER)
            for (int r = 0; r < n; r++) memcpy(it->recv + ((size_t)r * total + off) * es, slots[r], m * es);
        else {
            unsigned char *mine[MAX_RANKS];
            for (int r = 0; r < n; r++) mine[r] = slots[r] + (size_t)me * m * es;
            sum_into(it->recv + off * es, mine, n, c->drop, m, it->dt);
        }
        if (barrier(c, what, err, errlen)) return -1;
    }
    set_doing(c, "running kernels (last call: %s)", what);
    return 0;
}

/* ---- point to point ---- */

typedef struct {
    const Item *it;
    Channel *ch;
    unsigned long long msg;
    size_t bytes, chunks, done;
    int complete;
    unsigned long long last; /* send: the channel's chunk count after its last chunk */
} P2p;

/* The earlier calls of the group to the same peer and direction are complete. */
static int turn(const P2p *p, int i) {
    for (int j = 0; j < i; j++)
        if (!p[j].complete && p[j].it->kind == p[i].it->kind && p[j].it->comm == p[i].it->comm && p[j].it->peer == p[i].it->peer)
            return 0;
    return 1;
}

/* Move what can be moved now.  1 if something moved, 0 if not, -1 after op_fail. */
static int step_send(P2p *s) {
    Channel *ch = s->ch;
    int moved = 0;
    while (s->done < s->chunks && atomic_load_explicit(&ch->consumed, memory_order_acquire) == atomic_load(&ch->produced)) {
        size_t off = s->done * s->it->comm->h->chunk_bytes, cb = s->it->comm->h->chunk_bytes;
        size_t len = s->bytes - off < cb ? s->bytes - off : cb;
        memcpy(chunk_of(ch), s->it->send + off, len);
        ch->msg = s->msg, ch->count = s->it->count, ch->dt = s->it->dt, ch->offset = off, ch->len = len;
        s->last = atomic_load(&ch->produced) + 1;
        atomic_store_explicit(&ch->produced, s->last, memory_order_release);
        s->done++, moved = 1;
    }
    if (s->done == s->chunks && atomic_load_explicit(&ch->consumed, memory_order_acquire) >= s->last) s->complete = 1, moved = 1;
    return moved;
}

static int step_recv(P2p *p, char *err, size_t errlen) {
    Channel *ch = p->ch;
    const Item *it = p->it;
    int moved = 0;
    while (p->done < p->chunks && atomic_load_explicit(&ch->produced, memory_order_acquire) > atomic_load(&ch->consumed)) {
        if (ch->msg != p->msg || ch->count != it->count || ch->dt != it->dt || ch->offset != p->done * it->comm->h->chunk_bytes)
            return op_fail(it->comm, ncclInvalidUsage, err, errlen,
                           "ncclRecv #%llu from rank %d on rank %d of %d (%zu x %s) meets its ncclSend #%llu (%llu x %s): "
                           "a send and its receive must have the same count and type",
                           p->msg + 1, it->peer, it->comm->rank, it->comm->nranks, it->count, type_name(it->dt), ch->msg + 1,
                           ch->count, type_name(ch->dt));
        memcpy(it->recv + ch->offset, chunk_of(ch), ch->len);
        atomic_store_explicit(&ch->consumed, atomic_load(&ch->consumed) + 1, memory_order_release);
        p->done++, moved = 1;
    }
    if (p->done == p->chunks) p->complete = 1;
    return moved;
}

/* The group's sends and receives, progressed together.  0, or -1. */
static int run_p2p(const Work *w, char *err, size_t errlen) {
    P2p *p = calloc((size_t)w->n, sizeof *p);
    int np = 0, rc = 0;
    char what[200] = "";
    size_t k = 0;
    if (!p) return op_fail(NULL, ncclSystemError, err, errlen, "out of memory");
    for (int i = 0; i < w->n; i++) {
        const Item *it = &w->item[i];
        struct ncclComm *c = it->comm;
        if (it->kind != K_SEND && it->kind != K_RECV) continue;
        int send = it->kind == K_SEND;
        size_t bytes = it->count * type_size(it->dt), cb = c->h->chunk_bytes;
        P2p *q = &p[np++];
        *q = (P2p){it, send ? channel_of(c, c->rank, it->peer) : channel_of(c, it->peer, c->rank),
                   send ? c->sent[it->peer]++ : c->received[it->peer]++, bytes, bytes ? (bytes + cb - 1) / cb : 1, 0, 0, 0};
        if (k < sizeof what)
            k += (size_t)snprintf(what + k, sizeof what - k, "%s%s #%llu %s rank %d", k ? ", " : "", kind_call[it->kind], q->msg + 1,
                                  send ? "to" : "from", it->peer);
    }
    for (int i = 0; i < np; i++) set_doing(p[i].it->comm, "%s", what);
    Waiter wt = waiter();
    for (;;) {
        int moved = 0, left = 0;
        for (int i = 0; i < np && rc == 0; i++) {
            if (p[i].complete || !turn(p, i)) {
                left += !p[i].complete;
                continue;
            }
            int m = p[i].it->kind == K_SEND ? step_send(&p[i]) : step_recv(&p[i], err, errlen);
            if (m < 0) rc = -1;
            moved |= m > 0;
            left += !p[i].complete;
        }
        if (rc || !left) break;
        if (moved) progressed(&wt);
        else {
            /* the first incomplete call's communicator stands for the group */
            int i = 0;
            unsigned long long peers = 0;
            while (p[i].complete) i++;
            for (int j = i; j < np; j++)
                if (!p[j].complete && p[j].it->comm == p[i].it->comm) peers |= 1ull << p[j].it->peer;
            if (stalled(p[i].it->comm, peers, &wt, what, err, errlen)) {
                rc = -1;
                break;
            }
        }
    }
    for (int i = 0; i < np; i++) set_doing(p[i].it->comm, "running kernels (last call: %s)", what);
    free(p);
    return rc;
}

/* The host op: a group's calls (or one call).  0, or -1 with err. */
static int run_work(void *data, char *err, size_t errlen) {
    const Work *w = data;
    run_result = ncclSuccess;
    for (int i = 0; i < w->n; i++) {
        struct ncclComm *c = w->item[i].comm;
        if (!is_live(c)) return op_fail(NULL, ncclInvalidUsage, err, errlen, "%s: its communicator was destroyed", kind_call[w->item[i].kind]);
        if (c->dead)
            return op_fail(NULL, ncclInvalidUsage, err, errlen, "%s: an earlier call on this communicator failed", kind_call[w->item[i].kind]);
    }
    int p2p = 0;
    for (int i = 0; i < w->n; i++) {
        if (w->item[i].kind == K_SEND || w->item[i].kind == K_RECV) p2p = 1;
        else if (run_collective(&w->item[i], err, errlen)) return -1;
    }
    return p2p ? run_p2p(w, err, errlen) : 0;
}

/* ---- enqueueing ---- */

static ncclResult_t cuda_result(const char *call, CUresult r) {
    if (r == CUDA_SUCCESS) return ncclSuccess;
    if (r == CUDA_ERROR_LAUNCH_FAILED && run_result != ncclSuccess) return run_result; /* the op ran and failed */
    return fail(ncclUnhandledCudaError, "%s: the fake driver said CUresult %d", call, (int)r);
}

/* e recorded on `from`, waited on by `to`, then destroyed. */
static CUresult join(CUstream from, CUstream to) {
    CUevent e;
    CUresult r = cuEventCreate(&e, CU_EVENT_DISABLE_TIMING);
    if (r) return r;
    r = cuEventRecord(e, from);
    if (!r) r = cuStreamWaitEvent(to, e, 0);
    CUresult d = cuEventDestroy(e);
    return r ? r : d;
}

/* What a call reads (acc[0]) and writes (acc[1]), for the driver's
 * happens-before check. */
static void item_ranges(const Item *it, KilnFakeAccess acc[2]) {
    size_t bytes = it->count * type_size(it->dt), all = bytes * (size_t)it->comm->nranks;
    size_t sent = it->kind == K_REDUCESCATTER ? all : it->kind == K_RECV ? 0 : bytes;
    size_t received = it->kind == K_ALLGATHER ? all : it->kind == K_SEND ? 0 : bytes;
    acc[0] = (KilnFakeAccess){(CUdeviceptr)(uintptr_t)it->send, sent, 0};
    acc[1] = (KilnFakeAccess){(CUdeviceptr)(uintptr_t)it->recv, received, 1};
}

/* The work as one host op on the first call's stream, the other streams
 * joined before and after it. */
static ncclResult_t enqueue_work(const char *call, const Work *w) {
    if (w->n == 0) return ncclSuccess;
    CUstream first = w->item[0].stream;
    CUresult r = CUDA_SUCCESS;
    for (int i = 1; i < w->n && !r; i++) {
        int seen = w->item[i].stream == first;
        for (int j = 1; j < i && !seen; j++) seen = w->item[j].stream == w->item[i].stream;
        if (!seen) r = join(w->item[i].stream, first);
    }
    if (r) return fail(ncclUnhandledCudaError, "%s: joining the group's streams: CUresult %d", call, (int)r);
    run_result = ncclSuccess;
    size_t bytes = sizeof(Work) + (size_t)w->n * sizeof(Item);
    KilnFakeAccess *acc = calloc((size_t)w->n * 2 + 1, sizeof *acc);
    if (!acc) return fail(ncclSystemError, "%s: out of host memory", call);
    for (int i = 0; i < w->n; i++) item_ranges(&w->item[i], &acc[2 * i]);
    ncclResult_t res = cuda_result(call, kiln_fake_cuda_enqueue(first, call, run_work, w, bytes, acc, 2 * w->n));
    free(acc);
    for (int i = 1; i < w->n && !r; i++) {
        int seen = w->item[i].stream == first;
        for (int j = 1; j < i && !seen; j++) seen = w->item[j].stream == w->item[i].stream;
        if (!seen) r = join(first, w->item[i].stream);
    }
    if (!res && r) res = fail(ncclUnhandledCudaError, "%s: joining the group's streams: CUresult %d", call, (int)r);
    return res;
}

/* ---- groups ---- */

static _Thread_local int group_depth;
static _Thread_local Work *group;      /* the calls since the outermost ncclGroupStart */
static _Thread_local int group_cap;
static _Thread_local ncclResult_t group_error; /* a call in the group failed */

ncclResult_t ncclGroupStart(void) {
    if (group_depth++ == 0) {
        if (group) group->n = 0;
        group_error = ncclSuccess;
    }
    return ncclSuccess;
}

static ncclResult_t add_to_group(const Item *it) {
    if (!group || group->n == group_cap) {
        int cap = group_cap ? 2 * group_cap : 16;
        Work *g = realloc(group, sizeof(Work) + (size_t)cap * sizeof(Item));
        if (!g) return fail(ncclSystemError, "%s: out of memory", kind_call[it->kind]);
        if (!group) g->n = 0;
        group = g, group_cap = cap;
    }
    group->item[group->n++] = *it;
    return ncclSuccess;
}

/* Sends to and receives from the rank itself pair up in order. */
static ncclResult_t self_pairs(const Work *w) {
    for (int i = 0, r = 0; i < w->n; i++) {
        const Item *s = &w->item[i];
        if (s->kind != K_SEND || s->peer != s->comm->rank) continue;
        while (r < w->n && !(w->item[r].kind == K_RECV && w->item[r].comm == s->comm && w->item[r].peer == s->comm->rank)) r++;
        if (r == w->n) return fail(ncclInvalidUsage, "ncclGroupEnd: a send to the rank itself without its receive");
        const Item *v = &w->item[r++];
        if (v->count != s->count || v->dt != s->dt)
            return fail(ncclInvalidUsage, "ncclGroupEnd: a send to the rank itself of %zu x %s meets a receive of %zu x %s", s->count,
                        type_name(s->dt), v->count, type_name(v->dt));
    }
    int sends = 0, recvs = 0;
    for (int i = 0; i < w->n; i++) {
        const Item *it = &w->item[i];
        if (it->peer == it->comm->rank) sends += it->kind == K_SEND, recvs += it->kind == K_RECV;
    }
    if (sends != recvs) return fail(ncclInvalidUsage, "ncclGroupEnd: %d sends and %d receives to the rank itself", sends, recvs);
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
    if (group_depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    if (--group_depth > 0) return ncclSuccess;
    ncclResult_t r = group_error;
    group_error = ncclSuccess;
    if (!group || r) {
        if (group) group->n = 0;
        return r;
    }
    r = self_pairs(group);
    if (!r) r = enqueue_work(group->n == 1 ? kind_call[group->item[0].kind] : "ncclGroupStart/End", group);
    group->n = 0;
    return r;
}

/* ---- the calls ---- */

static ncclResult_t check_range(const char *call, const char *which, const void *p, size_t bytes) {
    char why[512];
    if (bytes == 0) return ncclSuccess;
    if (kiln_fake_cuda_check_range((CUdeviceptr)(uintptr_t)p, bytes, why, sizeof why) != 0)
        return fail(ncclInvalidArgument, "%s: %s: %s", call, which, why);
    return ncclSuccess;
}

static int overlaps(const void *a, size_t na, const void *b, size_t nb) {
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return na && nb && x < y + nb && y < x + na;
}

/* A collective's buffers are disjoint or NCCL's in-place form (any other
 * overlap is undefined in NCCL, though the fake's staging would hide it). */
static ncclResult_t in_place_ok(const Item *it, size_t send_bytes, size_t recv_bytes) {
    size_t own = (size_t)it->comm->rank * it->count * type_size(it->dt);
    const char *form = it->kind == K_ALLREDUCE       ? "recvbuff == sendbuff"
                       : it->kind == K_REDUCESCATTER ? "recvbuff == sendbuff + rank * recvcount"
                                                     : "sendbuff == recvbuff + rank * sendcount";
    int in_place = it->kind == K_ALLREDUCE       ? it->send == it->recv
                   : it->kind == K_REDUCESCATTER ? it->recv == it->send + own
                                                 : it->send == it->recv + own;
    if (in_place || !overlaps(it->send, send_bytes, it->recv, recv_bytes)) return ncclSuccess;
    return fail(ncclInvalidArgument, "%s: the send and receive buffers overlap but are not NCCL's in-place form (%s; rank %d)",
                kind_call[it->kind], form, it->comm->rank);
}

/* Check a call and run it (a group of one) or add it to the group. */
static ncclResult_t submit(const Item *it, size_t send_elems, size_t recv_elems) {
    const char *call = kind_call[it->kind];
    ncclResult_t r = check_comm(call, it->comm);
    size_t es = type_size(it->dt);
    if (!r && !es) r = fail(ncclInvalidArgument, "%s: data type %d is not emulated", call, it->dt);
    if (!r && (it->kind == K_SEND || it->kind == K_RECV) && (it->peer < 0 || it->peer >= it->comm->nranks))
        r = fail(ncclInvalidArgument, "%s: peer %d of %d ranks", call, it->peer, it->comm->nranks);
    if (!r && it->comm->dead) r = fail(ncclInvalidUsage, "%s: an earlier call on this communicator failed", call);
    if (!r && it->count > (SIZE_MAX / 2) / es / (size_t)it->comm->nranks) r = fail(ncclInvalidArgument, "%s: count %zu", call, it->count);
    if (!r) r = check_range(call, "send buffer", it->send, send_elems * es);
    if (!r) r = check_range(call, "receive buffer", it->recv, recv_elems * es);
    if (!r && it->kind != K_SEND && it->kind != K_RECV) r = in_place_ok(it, send_elems * es, recv_elems * es);
    if (!r && group_depth == 0 && (it->kind == K_SEND || it->kind == K_RECV) && it->peer == it->comm->rank)
        r = fail(ncclInvalidUsage, "%s to the rank itself outside ncclGroupStart/End (it would deadlock)", call);
    if (group_depth > 0) {
        if (!r) r = add_to_group(it);
        if (r && !group_error) group_error = r;
        return r;
    }
    if (r) return r;
    Work *w = malloc(sizeof(Work) + sizeof(Item));
    if (!w) return fail(ncclSystemError, "%s: out of memory", call);
    w->n = 1, w->item[0] = *it;
    r = enqueue_work(call, w);
    free(w);
    return r;
}

static ncclResult_t check_sum(const char *call, ncclRedOp_t op) {
    return op == ncclSum ? ncclSuccess : fail(ncclInvalidArgument, "%s: reduction %d is not emulated (ncclSum only)", call, (int)op);
}

static int ranks_of(ncclComm_t comm) { return comm && is_live(comm) ? comm->nranks : 1; }

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
    ncclResult_t r = check_sum("ncclAllReduce", op);
    Item it = {K_ALLREDUCE, comm, sendbuff, recvbuff, count, (int)datatype, 0, (CUstream)stream};
    return r ? r : submit(&it, count, count);
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    ncclResult_t r = check_sum("ncclReduceScatter", op);
    Item it = {K_REDUCESCATTER, comm, sendbuff, recvbuff, recvcount, (int)datatype, 0, (CUstream)stream};
    return r ? r : submit(&it, recvcount * (size_t)ranks_of(comm), recvcount);
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
    Item it = {K_ALLGATHER, comm, sendbuff, recvbuff, sendcount, (int)datatype, 0, (CUstream)stream};
    return submit(&it, sendcount, sendcount * (size_t)ranks_of(comm));
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    Item it = {K_SEND, comm, sendbuff, NULL, count, (int)datatype, peer, (CUstream)stream};
    return submit(&it, count, 0);
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    Item it = {K_RECV, comm, NULL, recvbuff, count, (int)datatype, peer, (CUstream)stream};
    return submit(&it, 0, count);
}
