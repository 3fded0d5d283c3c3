/* live.c — the backend's shared facts about a graph: node order, p2p pairs,
 * buffer lifetimes (live.h).
 *
 * These are IR-layer functions that more than one pass (and the verifier)
 * relies on, so that no pass calls into another pass's file:
 *
 *   ir_reorder     puts the nodes in a new order and keeps value ids; fuse,
 *                  the optimizer (placing --zero 1's gathers) and schedule
 *                  each choose an order and hand it here.
 *   ir_p2p_peer    pairs a send with its recv by group and tag.  memplan
 *                  needs it because a send's bytes are read when the pair is
 *                  issued (at the recv on the GPU: NCCL pairs them in one
 *                  group call, comm_nccl.c); precision because a recv
 *                  receives the dtype its send sends.
 *   ir_live_build  is the one definition of which values own a buffer and
 *                  over which program positions (the schedule's node order)
 *                  it lives; memplan places buffers by it and the verifier
 *                  rejects any two that share bytes while both are live.
 *   ir_inplace_conflict  says whether the value an `assign` writes may be
 *                  computed straight into the buffer of the param or state
 *                  it replaces (no read of the old value after the write
 *                  begins), and likewise a gradient over its first
 *                  contribution or cross_entropy_bwd's output over the
 *                  logits; memplan places by it, the verifier checks it.
 *
 * Liveness.  A buffer lives from its producer to its last reader (a fused
 * group counts as one step spanning its nodes); program inputs live from the
 * start and values read by `output` nodes to the end, since the trainer
 * writes and reads those between steps.  Views (F_VIEW) share their input's
 * buffer and extend its life, and so do slices and concats laid out as
 * views (live.h; decide_views says which pay, claim_members places a
 * concat's members inside its buffer, whose life becomes the union of
 * theirs and whose writers are all of theirs); values internal to a fused group, and a param
 * the step never reads (--zero 1 keeps it in a shard state), have none.
 * Streams complicate both ends.  A reader on another stream than the
 * producer's keeps the buffer until the producer's stream has waited for an
 * event recorded after the read (or to the end when none does); a buffer
 * written off the compute stream may be written as soon as its stream gets
 * there, so it counts as live from just after the last position of each
 * other stream that its stream has waited for.  The copy streams need no
 * wait after a read on compute or comm (copy_ordered): d2h writes no device
 * bytes, and a reload's write already counts from just after the compute
 * and comm positions h2d waited for (schedule.c's reload fence, right
 * before each reload), so a read before that is ordered before the write.
 *
 * Host buffers (the outputs of `offload`, issue 19) follow a rule of their
 * own: only the d2h stream writes host bytes and only reloads read them,
 * so a host buffer lives from its offload until the d2h stream knows its
 * reload done through any chain of events (host_order_build, vector
 * clocks: events are transitive on every back end), and its start is not
 * pulled back.  So a later offload reuses the bytes of a reload the
 * compute stream has waited for, with no event added (docs/offload.md,
 * "Host memory").
 *
 * Between tp's or pp's comm stream (lhs's IR_STREAM_TP, IR_STREAM_PP) and
 * the other streams off compute, a read's end is by the transitive happens-before order
 * (tp_pair, pair_end), the rule the host buffers already used: those
 * streams never wait for each other directly.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "live.h"

void ir_reorder(Graph *g, const int *order) {
    int n = g->nnodes;
    Node *nodes = ir_alloc(g->m, sizeof(Node) * (size_t)(n ? n : 1));
    char *seen = xcalloc((size_t)(n ? n : 1), 1);
    for (int k = 0; k < n; k++) {
        int i = order[k];
        if (i < 0 || i >= n || seen[i]) ICE("ir_reorder: order is not a permutation (node %d at %d)", i, k);
        seen[i] = 1;
        nodes[k] = g->nodes[i];
        for (int o = 0; o < nodes[k].nout; o++) g->vals[nodes[k].out[o]].def = k;
    }
    free(seen);
    g->nodes = nodes;
    g->capnodes = n;
}

/* a and b have the same group and tag */
static int p2p_pair(const Node *a, const Node *b) {
    return ir_attr_i(a, "tag", -1) == ir_attr_i(b, "tag", -2) && strcmp(ir_attr_s(a, "group", ""), ir_attr_s(b, "group", "")) == 0;
}

int ir_p2p_peer(const Graph *g, int i) {
    const Node *n = &g->nodes[i];
    if (n->op == OP_send) {
        for (int j = i + 1; j < g->nnodes; j++)
            if ((g->nodes[j].op == OP_recv || g->nodes[j].op == OP_recv_done) && p2p_pair(&g->nodes[j], n)) return j;
    } else if (n->op == OP_recv || n->op == OP_recv_done) {
        for (int j = i - 1; j >= 0; j--)
            if (g->nodes[j].op == OP_send && p2p_pair(&g->nodes[j], n)) return j;
    }
    return -1;
}

int ir_ordered_end_scan(const Graph *g, int u, int su, int sd) {
    int n = g->nnodes, nrec = 0, cap = 16;
    int64_t *rec = xcalloc((size_t)cap, sizeof(int64_t));
    for (int w = u + 1; w < n; w++) {
        const Node *nd = &g->nodes[w];
        if (nd->op == OP_record && nd->stream == su) {
            if (nrec == cap && !(rec = realloc(rec, sizeof(int64_t) * (size_t)(cap *= 2)))) ICE("out of memory");
            rec[nrec++] = ir_attr_i(nd, "event", -1);
        } else if (nd->op == OP_wait && nd->stream == sd && nrec) {
            int64_t e = ir_attr_i(nd, "event", -2);
            for (int k = nrec - 1; k >= 0; k--)
                if (rec[k] == e) {
                    free(rec);
                    return w;
                }
        }
    }
    free(rec);
    return n;
}

/* ir_p2p_peer for every send at once (L->peer; -1 elsewhere), by sorting
 * the sends and receives on (group, tag, position): a send's peer is the
 * next receive of its run.  The keys are p2p_pair's exactly: a recv's tag
 * defaults to -1 and a send's to -2, so one without a tag pairs with none. */
typedef struct {
    const char *group;
    int64_t tag;
    int pos, is_send;
} P2pKey;

static int p2p_key_cmp(const void *a, const void *b) {
    const P2pKey *x = a, *y = b;
    int c = strcmp(x->group, y->group);
    if (c) return c;
    if (x->tag != y->tag) return x->tag < y->tag ? -1 : 1;
    return (x->pos > y->pos) - (x->pos < y->pos);
}

static void peers_build(const Graph *g, MemLive *L) {
    int n = g->nnodes, k = 0;
    P2pKey *key = xcalloc((size_t)n + 1, sizeof(P2pKey));
    L->peer = xcalloc((size_t)n + 1, sizeof(int));
    for (int i = 0; i < n; i++) {
        const Node *nd = &g->nodes[i];
        L->peer[i] = -1;
        int send = nd->op == OP_send;
        if (send || nd->op == OP_recv || nd->op == OP_recv_done)
            key[k++] = (P2pKey){ir_attr_s(nd, "group", ""), ir_attr_i(nd, "tag", send ? -2 : -1), i, send};
    }
    qsort(key, (size_t)k, sizeof *key, p2p_key_cmp);
    for (int j = k - 1, next = -1; j >= 0; j--) {
        if (j == k - 1 || p2p_key_cmp(&(P2pKey){key[j].group, key[j].tag, 0, 0}, &(P2pKey){key[j + 1].group, key[j + 1].tag, 0, 0}))
            next = -1; /* a new run */
        if (key[j].is_send) L->peer[key[j].pos] = next;
        else next = key[j].pos;
    }
    free(key);
}

/* ordered_end's answers for every position at once (L->oend), in linear
 * time per pair of streams.  For a wait w of stream sd on event e, let
 * R(w) be the last position before w where stream su recorded e (-1 if
 * none).  The scan from u stops at the first wait w with R(w) > u (a
 * record of its event between u and w), so
 *     ordered_end(u, su, sd) = min { w : R(w) > u },
 * a suffix minimum over R: at[r] = the first wait whose R is r, then
 * oend[u] = min over r > u of at[r].  Events are ids >= 0 (ir.c checks
 * it); a graph with one outside [0, 4n + 16) keeps the scan (oend NULL). */
static void oend_build(const Graph *g, MemLive *L) {
    enum { NS = IR_NSTREAMS };
    int n = g->nnodes;
    int64_t *ev = xcalloc((size_t)n + 1, sizeof(int64_t)), maxev = -1;
    L->oend = NULL;
    for (int i = 0; i < n; i++) {
        const Node *nd = &g->nodes[i];
        if (nd->op != OP_record && nd->op != OP_wait) continue;
        ev[i] = ir_attr_i(nd, "event", -1);
        if (ev[i] < 0 || ev[i] >= 4 * (int64_t)n + 16 || nd->stream < 0 || nd->stream >= NS) { /* keep the scan */
            free(ev);
            return;
        }
        if (ev[i] > maxev) maxev = ev[i];
    }
    int *lastrec = xcalloc((size_t)(maxev + 1) * NS + 1, sizeof(int)), *at = xcalloc((size_t)n + 1, sizeof(int));
    L->oend = xcalloc((size_t)NS * NS * ((size_t)n + 1), sizeof(int));
    for (int su = 0; su < NS; su++) {
        for (int sd = 0; sd < NS; sd++) {
            int *oe = L->oend + ((size_t)su * NS + (size_t)sd) * ((size_t)n + 1);
            if (!(L->used >> su & 1) || !(L->used >> sd & 1) || su == sd) {
                for (int u = 0; u <= n; u++) oe[u] = n; /* no record or no wait: never; su == sd: not asked */
                continue;
            }
            for (int64_t e = 0; e <= maxev; e++) lastrec[e] = -1;
            for (int r = 0; r <= n; r++) at[r] = n;
            for (int w = 0; w < n; w++) {
                const Node *nd = &g->nodes[w];
                if (nd->op == OP_record && nd->stream == su) lastrec[ev[w]] = w;
                else if (nd->op == OP_wait && nd->stream == sd && lastrec[ev[w]] >= 0 && at[lastrec[ev[w]]] == n) at[lastrec[ev[w]]] = w;
            }
            int best = n;
            for (int u = n; u >= 0; u--) {
                oe[u] = best; /* min over r > u */
                if (u < n && at[u] < best) best = at[u];
            }
        }
    }
    free(ev), free(lastrec), free(at);
}

/* The first position at which stream sd has waited for an event that stream
 * su recorded after position u; n if there is none (oend_build's table, or
 * the scan). */
static int ordered_end(const Graph *g, const MemLive *L, int u, int su, int sd) {
    if (!L->oend || su < 0 || sd < 0 || su >= IR_NSTREAMS || sd >= IR_NSTREAMS || su == sd || u < 0 || u >= g->nnodes)
        return ir_ordered_end_scan(g, u, su, sd);
    return L->oend[((size_t)su * IR_NSTREAMS + (size_t)sd) * ((size_t)g->nnodes + 1) + (size_t)u];
}

static int max_i(int a, int b) { return a > b ? a : b; }

/* Host buffers (the outputs of `offload`, written only by the d2h stream,
 * read only by `reload`s) by happens-before, transitively: events chain
 * (a stream that waits for an event waits for everything the recording
 * stream had waited for before it records, on the CPU's worker threads as
 * on CUDA), so a reload is done before a later offload when, say, the
 * compute stream waited for the reload (its reader's data edge) and the
 * d2h stream then waited for a compute event recorded after that (the
 * offload's data edge).  Vector clocks over the program: clk[s][t] is the
 * last position of stream t known done where stream s is; after each wait
 * of stream s, its clock is kept (hbpos[s][k], hbclk[s][k]). */
typedef struct {
    int n[IR_NSTREAMS], *pos[IR_NSTREAMS], *clk[IR_NSTREAMS]; /* per stream its waits: position, clock after it (IR_NSTREAMS a wait) */
    int *prev_on; /* [s * (nnodes + 1) + p]: stream s's last node at or before p other than a record or wait, -1 if none (pair_end) */
} HostOrder;

/* A record or a wait: reads and writes no buffer. */
static int sync_op(Op op) { return op == OP_record || op == OP_wait; }

static void host_order_build(const Graph *g, HostOrder *H) {
    enum { NS = IR_NSTREAMS };
    int n = g->nnodes, clk[NS][NS];
    int64_t maxev = -1;
    for (int i = 0; i < n; i++)
        if (g->nodes[i].op == OP_record) maxev = ir_attr_i(&g->nodes[i], "event", -1) > maxev ? ir_attr_i(&g->nodes[i], "event", -1) : maxev;
    int *snap = xcalloc((size_t)(maxev + 2) * NS, sizeof(int));
    for (int e = 0; e < (maxev + 2) * NS; e++) snap[e] = -1;
    H->prev_on = xcalloc((size_t)NS * ((size_t)n + 1), sizeof(int));
    for (int s = 0; s < NS; s++)
        for (int p = 0; p < n; p++) H->prev_on[s * (n + 1) + p] = g->nodes[p].stream == s && !sync_op(g->nodes[p].op) ? p : p > 0 ? H->prev_on[s * (n + 1) + p - 1] : -1;
    for (int s = 0; s < NS; s++) {
        H->n[s] = 0, H->pos[s] = xcalloc((size_t)n + 1, sizeof(int)), H->clk[s] = xcalloc(((size_t)n + 1) * NS, sizeof(int));
        for (int t = 0; t < NS; t++) clk[s][t] = -1;
    }
    for (int i = 0; i < n; i++) {
        const Node *nd = &g->nodes[i];
        int s = nd->stream;
        int64_t e = ir_attr_i(nd, "event", -1);
        if (s < 0 || s >= NS) continue;
        if (nd->op == OP_record && e >= 0 && e <= maxev) {
            for (int t = 0; t < NS; t++) snap[e * NS + t] = clk[s][t];
            snap[e * NS + s] = i; /* everything stream s issued before the record */
        } else if (nd->op == OP_wait && e >= 0 && e <= maxev) {
            for (int t = 0; t < NS; t++) clk[s][t] = max_i(clk[s][t], snap[e * NS + t]);
            H->pos[s][H->n[s]] = i;
            memcpy(H->clk[s] + (size_t)H->n[s]++ * NS, clk[s], sizeof clk[s]);
        }
    }
    free(snap);
}

static void host_order_free(HostOrder *H) {
    for (int s = 0; s < IR_NSTREAMS; s++) free(H->pos[s]), free(H->clk[s]);
    free(H->prev_on);
}

/* The first position at which stream sd knows (transitively) that position
 * u of stream su is done: its first wait after which clk[sd][su] >= u; n
 * if none (clocks only grow: a binary search). */
static int hb_end(const Graph *g, const HostOrder *H, int u, int su, int sd) {
    int lo = 0, hi = H->n[sd];
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (H->clk[sd][(size_t)mid * IR_NSTREAMS + su] >= u) hi = mid;
        else lo = mid + 1;
    }
    return lo < H->n[sd] && H->pos[sd][lo] > u ? H->pos[sd][lo] : g->nnodes;
}

/* Whether stream su's position u is known done at stream sd by the
 * transitive rule (hb_end) rather than by sd's own waits (ordered_end): for
 * the pairs of tp's or pp's comm stream and another stream that runs
 * transfers (pp's, since 2026-12-03 session 11, by the same argument: a
 * send waits for the compute stream that made its input, the compute
 * stream for the receive it reads).
 * Those two never wait for each other directly (lhs.h: tp's collectives
 * have their own stream so that they never queue behind dp's), so by
 * direct waits alone every buffer one of them reads would stay live to
 * the step's end for the other, and every buffer one writes would be live
 * from the step's start (29 GB for a 19.5 GB plan in the GPT-3 175B
 * slice).  But each waits for the compute stream (its inputs), and the
 * compute stream for each (their consumers), and events chain (a wait
 * orders the waiting stream after everything the recording stream had
 * waited for, on CUDA as on the CPU's workers; host_order_build's clocks).
 * The other pairs keep the direct rule (their plans unchanged). */
static int own_stream(int s) { return s == IR_STREAM_TP || s == IR_STREAM_PP; }

static int tp_pair(int su, int sd) {
    return su != sd && (own_stream(su) || own_stream(sd)) && su != IR_STREAM_COMPUTE && sd != IR_STREAM_COMPUTE && su >= 0 && sd >= 0 &&
           su < IR_NSTREAMS && sd < IR_NSTREAMS;
}

/* A buffer written off the compute stream (a collective's or a recv's
 * output) may be written as soon as its stream gets there, before the other
 * streams have finished with the bytes' earlier owners: it counts as live
 * from just after the last position of each other stream that its stream
 * has waited for (an event recorded there), 0 if none.  Not for d2h (it
 * writes host bytes only, and its reads of device bytes end where the other
 * streams waited for them, read_end) nor for h2d: it reads host bytes only,
 * and the device bytes a reload writes are read on compute (or comm, or
 * d2h) after a wait for its event, so a stream that has waited for those
 * reads (the rule for their streams here, read_end's for comm and d2h) has
 * transitively waited for the write.  (Until 2026-12-03 h2d counted too,
 * and schedule.c's comm fence made every collective and receive wait for
 * the reloads issued so far to keep its buffer from living from the step's
 * start.) */
static void pull_back_starts(const Graph *g, MemLive *L, unsigned used) {
    enum { NS = IR_NSTREAMS };
    int known[NS][NS], n = g->nnodes;
    for (int a = 0; a < NS; a++)
        for (int b = 0; b < NS; b++) known[a][b] = -1;
    int64_t maxev = -1;
    for (int i = 0; i < n; i++) {
        int64_t e = g->nodes[i].op == OP_record ? ir_attr_i(&g->nodes[i], "event", -1) : -1;
        if (e > maxev) maxev = e;
    }
    int *recpos = xcalloc((size_t)(maxev + 2), sizeof(int)), *recstream = xcalloc((size_t)(maxev + 2), sizeof(int));
    for (int i = 0; i < n; i++) {
        const Node *nd = &g->nodes[i];
        int s = nd->stream;
        if (s < 0 || s >= NS) continue;
        int64_t e = ir_attr_i(nd, "event", -1);
        if (nd->op == OP_record && e >= 0 && e <= maxev) recpos[e] = i, recstream[e] = s;
        if (nd->op == OP_wait && e >= 0 && e <= maxev && recstream[e] != s) known[s][recstream[e]] = max_i(known[s][recstream[e]], recpos[e]);
        if (s == IR_STREAM_COMPUTE || nd->op == OP_offload) continue; /* host bytes: their earlier owners end by the d2h stream's order (host_order_build) */
        for (int k = 0; k < nd->nout; k++) {
            int v = nd->out[k], r = L->root[v];
            if (r < 0 || (r != v && !L->member[v])) continue; /* a concat's member: its writer pulls back the root's start */
            for (int t = 0; t < NS; t++) { /* not d2h nor h2d: see above */
                if (!(used >> t & 1) || t == s || t == IR_STREAM_D2H || t == IR_STREAM_H2D) continue;
                if (tp_pair(t, s)) continue; /* t's reads end where s knows them done (read_end, pair_end): no pull back */
                if (known[s][t] + 1 < L->start[r]) L->start[r] = known[s][t] + 1;
            }
        }
    }
    free(recpos), free(recstream);
}

/* Whether a read on stream su needs no wait of copy stream t after it before
 * t may overwrite the bytes: the d2h stream writes no device bytes (its
 * offloads write host bytes; L->devw says so), and the h2d stream's device writes (reloads)
 * count as live from just after the last compute and comm positions it has
 * waited for (pull_back_starts; schedule.c's reload fence waits for both
 * right before each reload), so a read on compute or comm before a reload
 * is ordered before its write without a later wait.  Without this a reload's
 * buffer (written on h2d, read on compute) lived until the next reload's
 * fence after its last reader, and a buffer read on comm (a send's, a
 * collective's input) until both copy streams had next waited for comm:
 * hundreds of positions where reloads are bunched (issue 19, "offload must
 * never raise a rank's device peak"; docs/offload.md). */
static int copy_ordered(const MemLive *L, int su, int t) {
    return (su == IR_STREAM_COMPUTE || su == IR_STREAM_COMM) && ((t == IR_STREAM_D2H && !(L->devw >> t & 1)) || t == IR_STREAM_H2D);
}

/* The first position from which stream sd may overwrite what node i (on
 * stream su) reads: the end of i's group when sd is su (an in-order queue)
 * or either is unscheduled, else where sd has waited for an event recorded
 * after the read (ordered_end).  A send's bytes are read at its recv (a recv
 * reads nothing); a read off the compute stream counts as done only when
 * every other stream is past it too. */
/* For a tp_pair: only sd's nodes between u and where sd knows u done
 * (hb_end) can overwrite what u reads without knowing it, so the read
 * ends at the last of them that is not a record or a wait (at u when there
 * is none: sd's later nodes all know; a stream that never learns and has
 * no node after u never writes over it). */
static int pair_end(const Graph *g, const MemLive *L, int u, int su, int sd) {
    if (!L->hb || !tp_pair(su, sd)) return ordered_end(g, L, u, su, sd);
    const HostOrder *H = L->hb;
    int e = hb_end(g, H, u, su, sd), q = e > 0 ? H->prev_on[sd * (g->nnodes + 1) + e - 1] : -1;
    return q > u ? q : u;
}

static int read_end(const Graph *g, const MemLive *L, int i, int sd) {
    int peer = g->nodes[i].op == OP_send ? (L->peer ? L->peer[i] : ir_p2p_peer(g, i)) : -1, u = peer >= 0 ? peer : i; /* where the read happens */
    int su = g->nodes[i].stream, e = L->last[u];
    if (su >= 0 && sd >= 0 && su != sd && !copy_ordered(L, su, sd)) e = max_i(e, pair_end(g, L, u, su, sd));
    for (int t = 0; su > IR_STREAM_COMPUTE && t < 32; t++)
        if ((L->used >> t & 1) && t != su && !copy_ordered(L, su, t)) e = max_i(e, pair_end(g, L, u, su, t));
    return e;
}

/* A read of a host buffer (an offload's output, by a reload on node i):
 * only the stream that writes host bytes, sd (the offload's, d2h), can
 * overwrite it, so the read ends where sd knows it done, transitively
 * (hb_end); unscheduled or on sd itself: read_end's rule. */
static int host_read_end(const Graph *g, const MemLive *L, const HostOrder *H, int i, int sd) {
    int su = g->nodes[i].stream;
    if (su < 0 || sd < 0 || su == sd || su >= IR_NSTREAMS || sd >= IR_NSTREAMS) return read_end(g, L, i, sd);
    return max_i(L->last[i], hb_end(g, H, L->last[i], su, sd));
}


/* ---- views by layout (live.h) ---- */

static int views_off; /* ir_views_set(0): memplan's plan without views, for comparison */

int ir_views_enabled(void) {
    const char *e = getenv("KILN_VIEWS");
    return !views_off && !(e && strcmp(e, "0") == 0);
}

int ir_views_set(int on) {
    int was = !views_off;
    views_off = !on;
    return was;
}

/* Bytes of t from dim d + 1 on (one step along dim d); -1 unless every dim
 * before d is 1 (then a range along d is one contiguous run of bytes). */
static int64_t step_bytes(const Type *t, int d) {
    if (d < 0 || d >= t->rank) return -1;
    for (int k = 0; k < d; k++)
        if (t->dim[k] != 1) return -1;
    int64_t b = (int64_t)ir_dtype_size(t->dt);
    for (int k = d + 1; k < t->rank; k++) b *= t->dim[k];
    return b;
}

/* Where the bytes a slice or concat moves sit as one run in the bigger
 * buffer: a slice's output inside its input (k = 0), a concat's input k
 * inside its output; -1 when they are not one run or not 64-byte aligned. */
static int64_t view_offset(const Graph *g, const Node *n, int k) {
    int d = (int)ir_attr_i(n, "dim", -1);
    int64_t off = -1;
    if (ir_attr_i(n, "copy", 0)) return -1; /* memplan kept it a copy (its plan without views was smaller) */
    if (n->op == OP_slice && k == 0 && n->nin == 1) {
        int64_t st = step_bytes(&g->vals[n->in[0]].t, d);
        off = st < 0 ? -1 : ir_attr_i(n, "start", 0) * st;
    } else if (n->op == OP_concat && k >= 0 && k < n->nin && n->nout == 1) {
        const Type *y = &g->vals[n->out[0]].t;
        int64_t st = step_bytes(y, d), at = 0;
        for (int j = 0; j < k; j++) at += g->vals[n->in[j]].t.dim[d];
        off = st < 0 ? -1 : at * st;
    }
    return off < 0 || off % IR_MEM_ALIGN ? -1 : off;
}

/* Part k of slice/concat n is where the op would copy it. */
static int part_in_place(const Graph *g, const Node *n, int k) {
    int64_t off = view_offset(g, n, k);
    const Value *big = &g->vals[n->op == OP_slice ? n->in[0] : n->out[0]], *part = &g->vals[n->op == OP_slice ? n->out[0] : n->in[k]];
    return off >= 0 && big->space >= 0 && big->offset >= 0 && part->space == big->space && part->offset == big->offset + off;
}

int ir_copy_in_place(const Graph *g, const Node *n) {
    if (n->op != OP_slice && n->op != OP_concat) return 0;
    for (int k = 0; k < n->nin; k++)
        if (!part_in_place(g, n, k)) return 0;
    return n->nin > 0;
}

int ir_view_part_in_place(const Graph *g, const Node *n, int k) {
    return (n->op == OP_slice || n->op == OP_concat) && part_in_place(g, n, k);
}

/* Concat n's inputs lie in one buffer, each where the concat puts it
 * (the slices of a buffer joined back in order): its output is a view
 * of that buffer at the first one's place. */
static int rejoin_view(const Graph *g, MemLive *L, const Node *n) {
    int r = n->nin ? L->root[n->in[0]] : -1, y = n->out[0];
    for (int k = 0; r >= 0 && k < n->nin; k++) {
        int64_t part = view_offset(g, n, k);
        if (part < 0 || L->root[n->in[k]] != r || L->voff[n->in[k]] != L->voff[n->in[0]] + part) return 0;
    }
    if (r < 0 || L->voff[n->in[0]] + ir_value_bytes(&g->vals[y]) > ir_value_bytes(&g->vals[r])) return 0;
    L->root[y] = r, L->voff[y] = L->voff[n->in[0]];
    return 1;
}

/* The concats' members (live.h): each input's buffer (root) that may be
 * written straight into its place inside the concat's buffer is given that
 * buffer as its root, at its place (voff), with every view of it; the
 * root then lives over the union of its members' lives and its own, and
 * remembers the streams that write it (wstreams: reads on another stream
 * end where each of them knows the read done). */
static void claim_members(const Graph *g, MemLive *L, const int64_t *kern, const char *allow) {
    int nv = g->nvals, *owner = xcalloc((size_t)nv + 1, sizeof(int));
    int64_t *base = xcalloc((size_t)nv + 1, sizeof(int64_t));
    char *has = xcalloc((size_t)nv + 1, 1);
    const char *bug = getenv("KILN_TEST_VIEW_BUG");
    int overlap = bug && strcmp(bug, "overlap") == 0;
    for (int v = 0; v < nv; v++) owner[v] = -1;
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        if (n->op != OP_concat || kern[i] >= 0 || n->nout != 1 || L->root[n->out[0]] != n->out[0]) continue;
        int y = n->out[0], claimed = 0;
        int64_t first = 0;
        for (int k = 0; k < n->nin; k++) {
            int u = n->in[k], x = L->root[u];
            int64_t part = view_offset(g, n, k);
            if (part < 0 || x < 0 || x == y || !allow[x] || owner[x] >= 0 || has[x] || L->voff[u] != 0) continue;
            const Node *d = g->vals[x].def >= 0 ? &g->nodes[g->vals[x].def] : NULL;
            if (!d || d->nout != 1 || (ir_ops[d->op].flags & (F_SOURCE | F_VIEW | F_COPY | F_SYNC)) || d->op == OP_recv ||
                d->op == OP_recv_start || d->op == OP_recv_done || g->vals[x].t.dt != g->vals[y].t.dt ||
                ir_value_bytes(&g->vals[x]) != ir_value_bytes(&g->vals[u]))
                continue;
            owner[x] = y, base[x] = overlap && claimed == 1 ? first : part, has[y] = 1; /* the planted bug: the second over the first */
            if (!claimed++) first = part;
        }
    }
    for (int v = 0; v < nv; v++) {
        int r = L->root[v];
        if (r >= 0 && owner[r] >= 0) L->root[v] = owner[r], L->voff[v] += base[r];
    }
    for (int x = 0; x < nv; x++) {
        int y = owner[x];
        if (y < 0) continue;
        const Node *d = &g->nodes[g->vals[x].def];
        L->member[x] = 1;
        if (L->start[x] < L->start[y]) L->start[y] = L->start[x];
        if (L->end[x] > L->end[y]) L->end[y] = L->end[x];
        if (d->stream >= 0 && d->stream < 8) L->wstreams[y] |= (unsigned char)(1u << d->stream);
    }
    free(owner), free(base), free(has);
}

/* L->rd_at, L->rd: per root r, the nodes reading a value of that buffer,
 * rd[rd_at[r] .. rd_at[r+1]), each once, in node order (ir_inplace_conflict
 * reads a value's readers without scanning every node). */
static void readers_build(const Graph *g, MemLive *L) {
    int nv = g->nvals, n = g->nnodes, *lastn = xcalloc((size_t)nv + 1, sizeof(int));
    L->rd_at = xcalloc((size_t)nv + 2, sizeof(int));
    for (int pass = 0; pass < 2; pass++) {
        for (int v = 0; v < nv; v++) lastn[v] = -1;
        for (int i = 0; i < n; i++)
            for (int k = 0; k < g->nodes[i].nin; k++) {
                int r = L->root[g->nodes[i].in[k]];
                if (r < 0 || lastn[r] == i) continue;
                lastn[r] = i;
                if (pass == 0) L->rd_at[r + 1]++;
                else L->rd[L->rd_at[r]++] = i;
            }
        if (pass == 0) {
            for (int v = 0; v < nv; v++) L->rd_at[v + 1] += L->rd_at[v];
            L->rd = xcalloc((size_t)L->rd_at[nv] + 1, sizeof(int));
        } else {
            for (int v = nv; v > 0; v--) L->rd_at[v] = L->rd_at[v - 1]; /* the fill moved each start to its end */
            L->rd_at[0] = 0;
        }
    }
    free(lastn);
}

static void live_build_with(const Graph *g, MemLive *L, int fast, const char *vslice, const char *vmember) {
    int n = g->nnodes, nv = g->nvals;
    L->nnodes = n, L->nvals = nv, L->oend = L->peer = NULL, L->hb = NULL;
    L->root = xcalloc((size_t)nv, sizeof(int));
    L->start = xcalloc((size_t)nv, sizeof(int));
    L->end = xcalloc((size_t)nv, sizeof(int));
    L->voff = xcalloc((size_t)nv + 1, sizeof(int64_t));
    L->member = xcalloc((size_t)nv + 1, 1);
    L->wstreams = xcalloc((size_t)nv + 1, 1);
    int64_t *kern = xcalloc((size_t)n, sizeof(int64_t));
    int *first = L->first = xcalloc((size_t)n + 1, sizeof(int)), *last = L->last = xcalloc((size_t)n + 1, sizeof(int));
    char *outside = xcalloc((size_t)nv, 1);

    /* each node's group span [first, last] (itself when not fused) */
    for (int i = 0; i < n; i++) {
        kern[i] = ir_fused_group(&g->nodes[i]);
        first[i] = i > 0 && kern[i] >= 0 && kern[i - 1] == kern[i] ? first[i - 1] : i;
    }
    for (int i = n - 1; i >= 0; i--) last[i] = i < n - 1 && kern[i] >= 0 && kern[i + 1] == kern[i] ? last[i + 1] : i;

    /* values read outside their producer's group */
    for (int i = 0; i < n; i++)
        for (int k = 0; k < g->nodes[i].nin; k++) {
            int v = g->nodes[i].in[k], d = g->vals[v].def;
            if (d >= 0 && (kern[d] < 0 || first[i] != first[d])) outside[v] = 1;
        }

    char *read = xcalloc((size_t)nv, 1);
    for (int i = 0; i < n; i++)
        for (int k = 0; k < g->nodes[i].nin; k++) read[g->nodes[i].in[k]] = 1;
    for (int v = 0; v < nv; v++) L->root[v] = -1;
    for (int i = 0; i < n; i++) {
        const Node *nd = &g->nodes[i];
        for (int k = 0; k < nd->nout; k++) {
            int v = nd->out[k];
            if (nd->op == OP_param && !read[v]) continue; /* lives in a shard state (--zero 1): no storage */
            if ((ir_ops[nd->op].flags & F_VIEW) && L->root[nd->in[0]] >= 0) {
                L->root[v] = L->root[nd->in[0]], L->voff[v] = L->voff[nd->in[0]];
                continue;
            }
            if (vslice && vslice[i] && nd->op == OP_concat && kern[i] < 0 && rejoin_view(g, L, nd)) continue;
            int64_t delta = vslice && vslice[i] && nd->op == OP_slice && kern[i] < 0 && L->root[nd->in[0]] >= 0 ? view_offset(g, nd, 0) : -1;
            if (delta >= 0 && g->nodes[g->vals[L->root[nd->in[0]]].def].op != OP_offload) { /* a slice view (live.h) */
                L->root[v] = L->root[nd->in[0]], L->voff[v] = L->voff[nd->in[0]] + delta;
                continue;
            }
            if (kern[i] >= 0 && !outside[v]) continue; /* internal to its group */
            L->root[v] = v;
            L->start[v] = nd->op == OP_input ? 0 : first[i];
            L->end[v] = last[i];
        }
    }

    if (vmember) claim_members(g, L, kern, vmember);

    HostOrder *H = xcalloc(1, sizeof *H);
    host_order_build(g, H);
    L->hb = H;
    L->used = L->devw = 0; /* streams with nodes; those that write device bytes */
    for (int i = 0; i < n; i++)
        if (g->nodes[i].stream >= 0 && g->nodes[i].stream < 32) {
            L->used |= 1u << g->nodes[i].stream;
            if (g->nodes[i].nout && g->nodes[i].op != OP_offload) L->devw |= 1u << g->nodes[i].stream;
        }
    if (fast) oend_build(g, L), peers_build(g, L);
    for (int i = 0; i < n; i++) {
        const Node *nd = &g->nodes[i];
        for (int k = 0; k < nd->nin; k++) {
            int r = L->root[nd->in[k]];
            if (r < 0) continue;
            const Node *w = &g->nodes[g->vals[r].def];
            int e = nd->op == OP_output ? n : w->op == OP_offload ? host_read_end(g, L, H, i, w->stream) : read_end(g, L, i, w->stream);
            for (int s = 0; s < 8 && nd->op != OP_output && w->op != OP_offload; s++) /* a concat's members written on other streams */
                if ((L->wstreams[r] >> s & 1) && s != w->stream) e = max_i(e, read_end(g, L, i, s));
            L->end[r] = max_i(L->end[r], e);
        }
    }
    pull_back_starts(g, L, L->used);
    readers_build(g, L);
    free(kern), free(outside), free(read);
}


/* Which views pay (live.h): decided on the lifetimes without views (L0),
 * so that the live bytes never rise above their peak without views.  A
 * slice becomes a view only when its input's buffer outlives it anyway (a
 * view of a flat buffer read long after would keep all of it alive: the
 * --zero 1 params sliced from their gathered bucket); that removes its
 * bytes where it lived.  A concat's members move into its buffer, which
 * then lives from the first member's write: before the concat its bytes
 * count whole where only the members written so far did, and after it the
 * members no longer count beside it.  The concats are taken in program
 * order, each with the members that do not outlive it, dropping the
 * earliest written until the bytes they add before the concat keep every
 * position at or under the peak (a segment tree of the live bytes, with
 * what earlier choices added and saved). */
typedef struct {
    int n;
    int64_t *mx, *add;
} Seg;

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

static void seg_build(Seg *s, int x, int lo, int hi, const int64_t *base) {
    if (lo == hi) {
        s->mx[x] = base[lo];
        return;
    }
    int mid = (lo + hi) / 2;
    seg_build(s, 2 * x, lo, mid, base), seg_build(s, 2 * x + 1, mid + 1, hi, base);
    s->mx[x] = max64(s->mx[2 * x], s->mx[2 * x + 1]);
}

static void seg_add(Seg *s, int x, int lo, int hi, int a, int b, int64_t v) {
    if (b < lo || hi < a || a > b) return;
    if (a <= lo && hi <= b) {
        s->mx[x] += v, s->add[x] += v;
        return;
    }
    int mid = (lo + hi) / 2;
    seg_add(s, 2 * x, lo, mid, a, b, v), seg_add(s, 2 * x + 1, mid + 1, hi, a, b, v);
    s->mx[x] = max64(s->mx[2 * x], s->mx[2 * x + 1]) + s->add[x];
}

static int64_t seg_max(const Seg *s, int x, int lo, int hi, int a, int b) {
    if (b < lo || hi < a || a > b) return INT64_MIN / 4;
    if (a <= lo && hi <= b) return s->mx[x];
    int mid = (lo + hi) / 2;
    return max64(seg_max(s, 2 * x, lo, mid, a, b), seg_max(s, 2 * x + 1, mid + 1, hi, a, b)) + s->add[x];
}

/* x, the buffer of concat n's input k (L0's root), may be written in its place: claim_members' rule */
static int member_ok(const Graph *g, const MemLive *L0, const Node *n, int k, const char *taken, const char *owner, const char *vslice,
                     const int *vend) {
    int u = n->in[k], x = L0->root[u], y = n->out[0];
    if (view_offset(g, n, k) < 0 || x < 0 || x == y || taken[x] || owner[x]) return 0;
    const Node *d = g->vals[x].def >= 0 ? &g->nodes[g->vals[x].def] : NULL;
    return d && d->nout == 1 && !(ir_ops[d->op].flags & (F_SOURCE | F_VIEW | F_COPY | F_SYNC)) && d->op != OP_recv && d->op != OP_recv_start &&
           d->op != OP_recv_done && !(d->op == OP_slice && vslice[g->vals[x].def]) && g->vals[x].t.dt == g->vals[y].t.dt &&
           ir_value_bytes(&g->vals[x]) == ir_value_bytes(&g->vals[u]);
}

static int by_start(const void *a, const void *b, void *l) {
    const int *st = l, x = *(const int *)a, y = *(const int *)b;
    return st[x] != st[y] ? (st[x] > st[y]) - (st[x] < st[y]) : x - y;
}

/* The bytes concat y's members m[0..nm) (by start) add: before it, its
 * whole buffer from the first member's write where only the members
 * written so far counted; after its last read, the whole buffer until the
 * last member's end (a read on another stream holds a member longer) where
 * only the members still held counted.  They fit when every position stays
 * at or under peak; apply: added, with the members' own bytes taken away
 * from the concat on (they are inside its buffer). */
static int concat_fits(Seg *s, const MemLive *L0, int *vend, const Graph *g, int y, const int *m, int nm, int64_t peak, int apply) {
    int hi = s->n - 1, byend[IR_MAXIN + 1];
    int64_t whole = ir_value_bytes(&g->vals[y]), sum = 0, alive = 0;
    for (int j = 0; j < nm; j++) {
        sum += ir_value_bytes(&g->vals[m[j]]);
        int a = L0->start[m[j]], b = (j + 1 < nm ? L0->start[m[j + 1]] : L0->start[y]) - 1;
        if (apply) seg_add(s, 1, 0, hi, a, b, whole - sum);
        else if (a <= b && seg_max(s, 1, 0, hi, a, b) + whole - sum > peak) return 0;
    }
    for (int j = 0; j < nm; j++) { /* by end (insertion: nm is small) */
        int x = m[j], at = j;
        while (at > 0 && vend[byend[at - 1]] > vend[x]) byend[at] = byend[at - 1], at--;
        byend[at] = x, alive += ir_value_bytes(&g->vals[x]);
    }
    int prev = vend[y];
    for (int j = 0; j < nm; j++) {
        int e = vend[byend[j]];
        if (e > prev) {
            if (apply) seg_add(s, 1, 0, hi, prev + 1, e, whole);
            else if (seg_max(s, 1, 0, hi, prev + 1, e) + whole - alive > peak) return 0;
            prev = e;
        }
        alive -= ir_value_bytes(&g->vals[byend[j]]);
    }
    if (!apply) return 1;
    for (int j = 0; j < nm; j++) seg_add(s, 1, 0, hi, L0->start[y], vend[m[j]], -ir_value_bytes(&g->vals[m[j]]));
    vend[y] = prev;
    return 1;
}

struct EndKey {
    const Graph *g;
    const MemLive *L0;
};

static int by_end(const void *a, const void *b, void *k) {
    const struct EndKey *K = k;
    int x = K->L0->end[K->g->nodes[*(const int *)a].out[0]], y = K->L0->end[K->g->nodes[*(const int *)b].out[0]];
    return x != y ? (x > y) - (x < y) : *(const int *)a - *(const int *)b;
}

/* Slices sl[0..ns) of buffer r (by their ends) as views: r lives to the
 * last one's end, holding its whole bytes where only the slices still
 * read held theirs; they fit when that keeps every position at or under
 * peak.  apply: r's extension added, the slices' own bytes taken away. */
static int slices_fit(Seg *s, const MemLive *L0, const Graph *g, int r, int end_r, const int *sl, int ns, int64_t peak, int apply) {
    int hi = s->n - 1, prev = end_r;
    int64_t whole = ir_value_bytes(&g->vals[r]), alive = 0;
    for (int j = 0; j < ns; j++) alive += ir_value_bytes(&g->vals[g->nodes[sl[j]].out[0]]);
    for (int j = 0; j < ns; j++) {
        int o = g->nodes[sl[j]].out[0], e = L0->end[o];
        if (e > prev) {
            if (apply) seg_add(s, 1, 0, hi, prev + 1, e, whole);
            else if (seg_max(s, 1, 0, hi, prev + 1, e) + whole - alive > peak) return 0;
            prev = e;
        }
        alive -= ir_value_bytes(&g->vals[o]);
    }
    for (int j = 0; apply && j < ns; j++) {
        int o = g->nodes[sl[j]].out[0];
        seg_add(s, 1, 0, hi, L0->start[o], L0->end[o], -ir_value_bytes(&g->vals[o]));
    }
    return 1;
}

/* Concat n joins slices that are views of one buffer, in order and
 * adjacent (chunks sliced and joined back: --tp-chunks' weight-gradient
 * inputs read from attention's output): that buffer (L0's root of the
 * slices' input), else -1.  Each part's place is checked by offsets in
 * live_build_with (rejoin_view). */
static int rejoin_root(const Graph *g, const MemLive *L0, const Node *n, const char *vslice) {
    int r = -1;
    for (int k = 0; k < n->nin; k++) {
        int x = L0->root[n->in[k]], d = x >= 0 ? g->vals[x].def : -1;
        if (d < 0 || g->nodes[d].op != OP_slice || !vslice[d] || view_offset(g, n, k) < 0) return -1;
        int rk = L0->root[g->nodes[d].in[0]];
        if (k && rk != r) return -1;
        r = rk;
    }
    return r;
}

/* KILN_VIEWS_TRACE: 1 memplan's with/without and the copies left (memplan.c), 2 also why each concat's inputs are not members */
static int trace_level(void) {
    const char *e = getenv("KILN_VIEWS_TRACE");
    return e ? atoi(e) : 0;
}

static void decide_views(const Graph *g, const MemLive *L0, char *vslice, char *vmember) {
    int n = g->nnodes, nv = g->nvals;
    int64_t *base = xcalloc((size_t)n + 2, sizeof(int64_t)), peak = 0, live = 0;
    for (int v = 0; v < nv; v++)
        if (L0->root[v] == v && g->vals[v].def >= 0 && g->nodes[g->vals[v].def].op != OP_offload) {
            base[L0->start[v]] += ir_value_bytes(&g->vals[v]);
            base[L0->end[v] + 1] -= ir_value_bytes(&g->vals[v]);
        }
    for (int p = 0; p <= n; p++) base[p] = live += base[p], peak = max64(peak, live);
    Seg s = {n + 1, xcalloc(4 * ((size_t)n + 1), sizeof(int64_t)), xcalloc(4 * ((size_t)n + 1), sizeof(int64_t))};
    seg_build(&s, 1, 0, n, base);
    int *vend = xcalloc((size_t)nv + 1, sizeof(int)), *head = xcalloc((size_t)nv + 1, sizeof(int)), *next = xcalloc((size_t)n + 1, sizeof(int));
    int *grp = xcalloc((size_t)n + 1, sizeof(int));
    for (int v = 0; v < nv; v++) vend[v] = L0->end[v], head[v] = -1;
    for (int i = n - 1; i >= 0; i--) { /* the slice candidates of each buffer, in program order */
        const Node *nd = &g->nodes[i];
        if (nd->op != OP_slice || ir_fused_group(nd) >= 0 || view_offset(g, nd, 0) < 0) continue;
        int r = L0->root[nd->in[0]], o = nd->out[0];
        if (r < 0 || L0->root[o] != o || g->nodes[g->vals[r].def].op == OP_offload) continue;
        next[i] = head[r], head[r] = i;
    }
    for (int i = 0; i < n; i++)
        for (int k = 0; k < g->nodes[i].nout; k++) {
            int r = g->nodes[i].out[k], ng = 0;
            if (head[r] < 0) continue;
            for (int j = head[r]; j >= 0; j = next[j]) grp[ng++] = j;
            if (g->nodes[i].op == OP_slice && vslice[i]) { /* r is a view itself: its slices may not outlive it */
                int keep = 0;
                for (int j = 0; j < ng; j++)
                    if (L0->end[g->nodes[grp[j]].out[0]] <= L0->end[r]) grp[keep++] = grp[j];
                ng = keep;
            } else {
                struct EndKey key = {g, L0};
                qsort_r(grp, (size_t)ng, sizeof(int), by_end, &key);
                while (ng > 0 && !slices_fit(&s, L0, g, r, vend[r], grp, ng, peak, 0)) ng--; /* drop the one read latest */
            }
            if (!ng) continue;
            slices_fit(&s, L0, g, r, vend[r], grp, ng, peak, 1);
            for (int j = 0; j < ng; j++) {
                vslice[grp[j]] = 1;
                vend[r] = vend[r] > L0->end[g->nodes[grp[j]].out[0]] ? vend[r] : L0->end[g->nodes[grp[j]].out[0]];
            }
        }
    free(head), free(next), free(grp);
    char *owner = xcalloc((size_t)nv + 1, 1);
    int *m = xcalloc(IR_MAXIN + 1, sizeof(int));
    for (int i = 0; i < n; i++) {
        const Node *nd = &g->nodes[i];
        int y = nd->nout == 1 ? nd->out[0] : -1, nm = 0;
        if (nd->op != OP_concat || ir_fused_group(nd) >= 0 || L0->root[y] != y) continue;
        int r = rejoin_root(g, L0, nd, vslice);
        if (r >= 0 && slices_fit(&s, L0, g, r, vend[r], &i, 1, peak, 0)) { /* the slices of one buffer joined back: a view of it */
            slices_fit(&s, L0, g, r, vend[r], &i, 1, peak, 1);
            vslice[i] = 1;
            vend[r] = vend[r] > L0->end[y] ? vend[r] : L0->end[y];
            continue;
        }
        for (int k = 0; k < nd->nin; k++) {
            if (trace_level() > 1 && !member_ok(g, L0, nd, k, vmember, owner, vslice, vend)) {
                int u = nd->in[k], x = L0->root[u];
                fprintf(stderr, "views: concat %%%d at %d, input %d %%%d (root %%%d, %s): off %lld taken %d owner %d vend %d > %d vslice %d dt %d %d bytes %lld %lld\n", y, i, k, u, x,
                        x >= 0 && g->vals[x].def >= 0 ? ir_ops[g->nodes[g->vals[x].def].op].name : "-", (long long)view_offset(g, nd, k),
                        x >= 0 ? vmember[x] : -1, x >= 0 ? owner[x] : -1, x >= 0 ? vend[x] : -1, vend[y], x >= 0 && g->vals[x].def >= 0 ? vslice[g->vals[x].def] : -1,
                        x >= 0 ? (int)g->vals[x].t.dt : -1, (int)g->vals[y].t.dt, x >= 0 ? (long long)ir_value_bytes(&g->vals[x]) : -1, (long long)ir_value_bytes(&g->vals[u]));
            }
            if (member_ok(g, L0, nd, k, vmember, owner, vslice, vend)) {
                int dup = 0;
                for (int j = 0; j < nm; j++) dup |= m[j] == L0->root[nd->in[k]];
                if (!dup) m[nm++] = L0->root[nd->in[k]];
            }
        }
        qsort_r(m, (size_t)nm, sizeof(int), by_start, L0->start);
        int lo = 0;
        while (lo < nm && !concat_fits(&s, L0, vend, g, y, m + lo, nm - lo, peak, 0)) lo++; /* drop the earliest */
        if (trace_level() > 1 && lo) {
            fprintf(stderr, "views: concat %%%d at %d (live %d..%d): %d of %d members eligible, %d dropped;", y, i, L0->start[y], L0->end[y], nm,
                    nd->nin, lo);
            for (int j = 0; j < nm; j++) fprintf(stderr, " %%%d %d..%d(%d)", m[j], L0->start[m[j]], L0->end[m[j]], vend[m[j]]);
            fprintf(stderr, "\n");
        }
        if (lo == nm) continue;
        concat_fits(&s, L0, vend, g, y, m + lo, nm - lo, peak, 1);
        for (int j = lo; j < nm; j++) vmember[m[j]] = 1;
        owner[y] = 1;
    }
    free(base), free(s.mx), free(s.add), free(owner), free(m), free(vend);
}

static void live_build(const Graph *g, MemLive *L, int fast) {
    int cand = 0;
    for (int i = 0; i < g->nnodes && !cand; i++) cand = g->nodes[i].op == OP_slice || g->nodes[i].op == OP_concat;
    if (!cand || !ir_views_enabled()) {
        live_build_with(g, L, fast, NULL, NULL);
        return;
    }
    MemLive L0;
    live_build_with(g, &L0, fast, NULL, NULL);
    char *vslice = xcalloc((size_t)g->nnodes + 1, 1), *vmember = xcalloc((size_t)g->nvals + 1, 1);
    decide_views(g, &L0, vslice, vmember);
    ir_live_free(&L0);
    live_build_with(g, L, fast, vslice, vmember);
    free(vslice), free(vmember);
}

void ir_live_build(const Graph *g, MemLive *L) { live_build(g, L, 1); }

void ir_live_build_scan(const Graph *g, MemLive *L) { live_build(g, L, 0); }

void ir_live_free(MemLive *L) {
    if (L->hb) host_order_free(L->hb), free(L->hb);
    free(L->oend), free(L->peer);
    free(L->root), free(L->start), free(L->end), free(L->first), free(L->last);
    free(L->voff), free(L->member), free(L->wstreams), free(L->rd_at), free(L->rd);
    memset(L, 0, sizeof *L);
}

int ir_assign_target(const Graph *g, int i) {
    const char *name = ir_attr_s(&g->nodes[i], "name", "");
    for (int j = 0; j < g->nnodes; j++) {
        const Node *n = &g->nodes[j];
        if ((ir_ops[n->op].flags & F_STATE) && strcmp(ir_attr_s(n, "name", ""), name) == 0) return n->out[0];
    }
    return -1;
}

/* Whether node i, a member of the group that writes nw (the same position
 * span; i == p when p is not fused), reads element j of old before p writes
 * element j of nw: i is p or an elementwise member before it, p writes
 * element by element (elementwise, or an optimizer update such as adamw) or
 * promises to read what element j depends on first (F_INPLACE:
 * cross_entropy_bwd), and the read covers the whole value, not a broadcast
 * of part of it. */
static const char *producer_read(const Graph *g, int i, int p, int in, int nw) {
    unsigned per_element = F_ELEMENTWISE | F_OPTIMIZER | F_INPLACE;
    if (i > p) return "reads the old value in the writer's fused group, after the member that writes the new one";
    if (!(ir_ops[g->nodes[p].op].flags & per_element) || !(ir_ops[g->nodes[i].op].flags & (i == p ? per_element : F_ELEMENTWISE)) ||
        ir_numel(&g->vals[in].t) != ir_numel(&g->vals[nw].t))
        return "reads the old value other than element by element while the new one is written over it";
    return NULL;
}

int ir_inplace_conflict(const Graph *g, const MemLive *L, int old, int nw, const char **why) {
    const Value *o = &g->vals[old], *x = &g->vals[nw];
    int p = x->def;
    *why = NULL;
    if (p < 0 || (ir_ops[g->nodes[p].op].flags & F_SOURCE) || L->root[old] != old || L->root[nw] != nw || o->t.dt != x->t.dt ||
        ir_numel(&o->t) != ir_numel(&x->t)) {
        *why = "is not a computed value of the replaced value's type with a buffer of its own";
        return p;
    }
    int write = L->first[p], sw = g->nodes[p].stream;
    for (int j = L->rd_at[old]; j < L->rd_at[old + 1]; j++) { /* the nodes reading old's buffer, in order */
        int i = L->rd[j];
        const Node *n = &g->nodes[i];
        for (int k = 0; k < n->nin; k++) {
            if (L->root[n->in[k]] != old) continue;
            if (n->op == OP_output) *why = "reads the old value at the end of the step";
            else if (L->first[i] == write) *why = producer_read(g, i, p, n->in[k], nw);
            else if (read_end(g, L, i, sw) >= write)
                *why = n->stream == sw || n->stream < 0 || sw < 0
                           ? "reads the old value after the write of the new one begins"
                           : "reads the old value on another stream, and the writer's stream waits for no event recorded after that read before the write";
            if (*why) return i;
        }
    }
    return -1;
}
