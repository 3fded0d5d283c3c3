/* memplan.c — static memory: every buffer gets a space and a byte offset.
 *
 * The runtime allocates one buffer per memory space (kiln_rt.h) and the step
 * function addresses every tensor as spaces[space] + offset, so all memory is
 * decided here, once, at compile time:
 *
 *   params  the param values, contiguous in param order;
 *   grads   the gradients exposed by `output {name="grad:<p>"}`, contiguous
 *           in the order backward produces them (the order a bucketed
 *           reduce-scatter wants them);
 *   opt     the state values (AdamW moments, the step counter);
 *   act     everything else, packed by liveness;
 *   host    the outputs of `offload` (offload.c): saved activations waiting
 *           in host memory between forward and backward, packed the same way
 *           over their own lifetimes (live.c: until the d2h stream knows the
 *           reload done), so the space is the peak of live offloaded bytes;
 *           memplan_host_check holds it to the profile's host memory.
 *
 * In-place updates.  The optimizer step computes a new value for every param
 * and state (AdamW's p', m', v', the step counter; under --zero 1 the
 * shards' master weights and moments) and `assign`s it, which commits at the
 * end of the step.  Held in the act space until then, these new values
 * would all be live together: an arena of three times the parameters, above
 * any model's activations.  So each value an assign writes is placed on the
 * buffer of the param or state it replaces whenever no read of the old value
 * can see it (ir_inplace_conflict, live.c: every reader is done before the
 * producer starts, across streams by events, or is the producer itself
 * reading element j before writing element j); the emitter then skips the
 * assign's copy (source and destination are one buffer).  Otherwise it
 * falls back to the act space and the copy.  The verifier checks each such
 * placement with the same rule.
 *
 * The same rule serves two more placements.  Gradients accumulated where
 * they land: a gradient with several contributions (tied embeddings; every
 * parameter under --micro-batches) is an `add` on its grads buffer, and one
 * contribution is computed straight into that buffer and added to in place
 * (place_accumulate), instead of waiting in the act space for the others.
 * And an op flagged F_INPLACE (cross_entropy_bwd) writes its output over
 * its input of the same type (the logits) when nothing reads that later
 * (place_over): the two share one act buffer.  The reports count such
 * shared bytes once (buf_ends).
 *
 * A param the step never reads has no buffer: with the distributed
 * optimizer its values live in the shard state "param.b<k>" and the step
 * reads the all-gathered copy.
 *
 * Views share their input's buffer: `reshape` (row-major, same bytes) and
 * `loss` (identity) get their input's space and offset and extend its life.
 * So do slices and concats along a dimension whose outer dims are all 1
 * (live.h, "views by layout"): a slice is its input's bytes at an offset,
 * and a concat's inputs (its *members*) are placed inside its buffer, each
 * where the concat would copy it, so their producers write straight there
 * and the back ends copy nothing (TransformerEngine's userbuffers do the
 * same for tp's chunked collectives; --tp-chunks is where it pays).
 * ir_live_build decides which by the lifetimes without views, so the live
 * bytes never rise; and since best-fit packing is a heuristic, a stage is
 * also planned without views and keeps whichever plan is smaller (the
 * loser's slices and concats get copy=1, which ir_live_build honours, so
 * the verifier and the emitters see the same plan).
 * Values internal to a fused group, and nodes without outputs, get none
 * (space = offset = -1).  Offsets are IR_MEM_ALIGN (64) byte aligned.
 *
 * Liveness (ir_live_build, live.c: the IR's, since the verifier checks the
 * plan by it) is measured in program positions, the schedule's node order.
 * A buffer lives from its producer to its last reader (a fused group counts
 * as one step spanning its nodes); program inputs live from the start and
 * values read by `output` nodes to the end, since the trainer writes and
 * reads those between steps.
 *
 * Placement in the act space is "greedy by size, best fit" (TFLite's arena
 * planner; XLA's heap simulator does the same family): buffers sorted by
 * size, largest first; each goes into the smallest gap, between the buffers
 * already placed that are live at the same time, that holds it, or above
 * them all.  Big buffers get settled first and small ones fill the holes, so
 * the arena peak stays close to the lower bound: the largest number of bytes
 * live at one position (memplan_lower_bound), which `kiln plan` prints next
 * to it.  The verifier re-derives liveness with ir_live_build and rejects
 * any two buffers that share bytes while both are live.
 *
 * The reports.  memplan_report is `kiln plan`'s table: each space's size,
 * the arena beside its lower bound and beside the model's activations
 * alone, and the phase where the most act bytes are live; with --offload
 * the host space and the act bound with and without the offloaded values
 * on the device (kept_bound).
 * memplan_peak_report (`kiln plan --peak`) says what sets that peak: the
 * position, its op and model line, and every act buffer live there, largest
 * first, with the line that made it and why it is still live (its last
 * reader), so a user can see which activations to recompute or offload.
 *
 * Op names.  Where a family is meant the plan asks the op flags (F_COMM,
 * F_VIEW through the liveness); it names an op where that op itself is
 * meant: params and states have spaces of their own, program inputs are the
 * data, `output {name="grad:<p>"}` names the gradients, and the reports give
 * each collective its ring formula, read cp's layout off its `iota` and
 * count the ring's `send`s.
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "live.h"
#include "memplan.h"
#include "passes.h"
#include "profile.h"

static int64_t align_up(int64_t x) { return (x + IR_MEM_ALIGN - 1) / IR_MEM_ALIGN * IR_MEM_ALIGN; }

/* ======================================================================
 * Placement
 * ====================================================================== */

typedef struct {
    int v, start, end;
    int64_t off, size; /* size rounded up to IR_MEM_ALIGN */
} Buf;

/* The packing order: 0 largest first, earlier start first among equals
 * (the default); 1 largest first, later start first; 2 largest area
 * (bytes x positions live) first.  plan_graph tries 1 and 2 when the plan
 * with views packs worse than the plan without. */
static int pack_order;

static int by_size(const void *a, const void *b) {
    const Buf *x = a, *y = b;
    if (pack_order == 2) {
        double ax = (double)x->size * (x->end - x->start + 1), ay = (double)y->size * (y->end - y->start + 1);
        if (ax != ay) return ax > ay ? -1 : 1;
    }
    if (x->size != y->size) return x->size > y->size ? -1 : 1;
    if (x->start != y->start) return (x->start < y->start ? -1 : 1) * (pack_order == 1 ? -1 : 1);
    return x->v - y->v;
}

/* One step of the best-fit scan over a placed buffer p (in offset order):
 * a gap below p that holds b and is the smallest so far is remembered, and
 * cur rises to p's end.  A buffer seen twice, or one of several at the same
 * offset, changes nothing the second time (cur is past its start). */
static inline void fit_step(const Buf *p, const Buf *b, int64_t *cur, int64_t *best, int64_t *best_gap) {
    if (p->end < b->start || b->end < p->start) return;
    if (p->off > *cur && p->off - *cur >= b->size && p->off - *cur < *best_gap) *best = *cur, *best_gap = p->off - *cur;
    if (p->off + p->size > *cur) *cur = p->off + p->size;
}

/* Every placed buffer in offset order, as columns: the scan of them all
 * reads a buffer's lifetime (8 bytes) to skip it, not the whole Buf. */
typedef struct {
    int (*life)[2]; /* start, end */
    int64_t *off, *size;
    int n;
} Placed;

/* Best fit of b among the placed buffers live at the same time (fit_step's
 * scan, the same offsets). */
static int64_t best_fit(const Placed *P, const Buf *b) {
    int64_t cur = 0, best = -1, best_gap = INT64_MAX;
    for (int k = 0; k < P->n; k++) {
        if (P->life[k][1] < b->start || b->end < P->life[k][0]) continue;
        int64_t off = P->off[k], top = off + P->size[k];
        if (off > cur && off - cur >= b->size && off - cur < best_gap) best = cur, best_gap = off - cur;
        if (top > cur) cur = top;
    }
    return best >= 0 ? best : cur;
}

/* b into P after every buffer at its offset or below (the order a linear
 * insertion from the end kept). */
static void placed_insert(Placed *P, const Buf *b) {
    int lo = 0, hi = P->n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (P->off[mid] <= b->off) lo = mid + 1;
        else hi = mid;
    }
    size_t k = (size_t)(P->n - lo);
    memmove(P->life + lo + 1, P->life + lo, sizeof *P->life * k);
    memmove(P->off + lo + 1, P->off + lo, sizeof *P->off * k);
    memmove(P->size + lo + 1, P->size + lo, sizeof *P->size * k);
    P->life[lo][0] = b->start, P->life[lo][1] = b->end, P->off[lo] = b->off, P->size[lo] = b->size;
    P->n++;
}

/* The placed buffers by time: the positions cut into at most PACK_BLOCKS
 * blocks, each with the placed buffers live in it, sorted by offset.  A
 * buffer's best fit reads only the blocks of its lifetime (merged in offset
 * order; a buffer in several is seen several times, which best_fit's scan
 * ignores) instead of every placed buffer: the same offsets as the scan of
 * them all, since a buffer outside those blocks does not overlap it. */
#define PACK_BLOCKS 64
typedef struct {
    Buf *b;
    int n, cap;
} Block;

static void block_insert(Block *k, const Buf *b) {
    if (k->n == k->cap) {
        k->cap = k->cap ? 2 * k->cap : 16;
        k->b = realloc(k->b, sizeof(Buf) * (size_t)k->cap);
        if (!k->b) ICE("out of memory");
    }
    int at = k->n;
    while (at > 0 && k->b[at - 1].off > b->off) at--;
    memmove(k->b + at + 1, k->b + at, sizeof(Buf) * (size_t)(k->n - at));
    k->b[at] = *b;
    k->n++;
}

/* best_fit over a few blocks merged in offset order by picking the
 * smallest head each time (cheaper than a heap for a handful of lists;
 * the order among equal offsets does not matter to fit_step). */
static int64_t best_fit_few(const Block *blk, int lo, int hi, const Buf *b) {
    int64_t cur = 0, best = -1, best_gap = INT64_MAX;
    const Buf *p[8], *e[8];
    int m = 0;
    for (int k = lo; k <= hi; k++)
        if (blk[k].n) p[m] = blk[k].b, e[m] = blk[k].b + blk[k].n, m++;
    while (m) {
        int j = 0;
        for (int i = 1; i < m; i++)
            if (p[i]->off < p[j]->off) j = i;
        fit_step(p[j], b, &cur, &best, &best_gap);
        if (++p[j] == e[j]) m--, p[j] = p[m], e[j] = e[m];
    }
    return best >= 0 ? best : cur;
}

/* best_fit over blocks lo..hi merged in offset order (a heap of their heads). */
static int64_t best_fit_blocks(const Block *blk, int lo, int hi, const Buf *b) {
    if (hi - lo < 8) return best_fit_few(blk, lo, hi, b);
    int64_t cur = 0, best = -1, best_gap = INT64_MAX;
    int heap[PACK_BLOCKS], pos[PACK_BLOCKS], nh = 0;
    for (int k = lo; k <= hi; k++) {
        if (!blk[k].n) continue;
        pos[k - lo] = 0;
        int x = nh++; /* sift up */
        while (x > 0 && blk[heap[(x - 1) / 2]].b[0].off > blk[k].b[0].off) heap[x] = heap[(x - 1) / 2], x = (x - 1) / 2;
        heap[x] = k;
    }
    while (nh) {
        int k = heap[0];
        fit_step(&blk[k].b[pos[k - lo]], b, &cur, &best, &best_gap);
        if (++pos[k - lo] == blk[k].n) k = heap[--nh]; /* that block is done: its place to the last */
        if (!nh) break;
        int64_t key = blk[k].b[pos[k - lo]].off;
        int x = 0; /* sift down */
        for (;;) {
            int c = 2 * x + 1;
            if (c >= nh) break;
            if (c + 1 < nh && blk[heap[c + 1]].b[pos[heap[c + 1] - lo]].off < blk[heap[c]].b[pos[heap[c] - lo]].off) c++;
            if (blk[heap[c]].b[pos[heap[c] - lo]].off >= key) break;
            heap[x] = heap[c], x = c;
        }
        heap[x] = k;
    }
    return best >= 0 ? best : cur;
}

/* Pack the act buffers: every root that has no space yet, but the
 * offloads' outputs, which go to the host space (packed the same way).  A
 * value that takes over the buffer of an input it is written over
 * (over[v] >= 0, place_over) gets that input's place, which lives until
 * both are done. */
static void place_packed(Graph *g, const MemLive *L, const int *over, int space) {
    Buf *bufs = xcalloc((size_t)g->nvals, sizeof(Buf));
    Placed P = {xcalloc((size_t)g->nvals + 1, sizeof *P.life), xcalloc((size_t)g->nvals + 1, sizeof(int64_t)),
                xcalloc((size_t)g->nvals + 1, sizeof(int64_t)), 0};
    int *end = xcalloc((size_t)g->nvals + 1, sizeof(int)), nb = 0, maxpos = 0;
    for (int v = 0; v < g->nvals; v++) end[v] = L->end[v];
    for (int v = 0; v < g->nvals; v++)
        if (over[v] >= 0 && L->end[v] > end[over[v]]) end[over[v]] = L->end[v]; /* over[] points at the first of a chain */
    for (int v = 0; v < g->nvals; v++)
        if (L->root[v] == v && g->vals[v].space < 0 && over[v] < 0 && (g->nodes[g->vals[v].def].op == OP_offload) == (space == SPACE_HOST)) {
            bufs[nb++] = (Buf){v, L->start[v], end[v], 0, align_up(ir_value_bytes(&g->vals[v]))};
            if (end[v] > maxpos) maxpos = end[v];
        }
    qsort(bufs, (size_t)nb, sizeof(Buf), by_size);
    int bsz = maxpos / PACK_BLOCKS + 1, nblk = maxpos / bsz + 1;
    Block *blk = xcalloc((size_t)nblk, sizeof(Block));
    for (int k = 0; k < nb; k++) {
        Buf b = bufs[k];
        int lo = b.start < 0 ? 0 : b.start / bsz, hi = b.end < 0 ? 0 : b.end / bsz, seen = 0;
        if (lo >= nblk) lo = nblk - 1;
        if (hi >= nblk) hi = nblk - 1;
        for (int q = lo; q <= hi; q++) seen += blk[q].n;
        /* the blocks when merging their entries (a heap of hi - lo + 1 heads) reads less than all the buffers placed */
        int lg = 0;
        while ((1 << lg) < hi - lo + 1) lg++;
        b.off = lo <= hi && (double)seen * (lg ? 2 + lg : 1) < P.n ? best_fit_blocks(blk, lo, hi, &b) : best_fit(&P, &b);
        placed_insert(&P, &b);
        for (int q = lo; q <= hi; q++) block_insert(&blk[q], &b);
        g->vals[b.v].space = space;
        g->vals[b.v].offset = b.off;
    }
    for (int v = 0; v < g->nvals; v++)
        if (over[v] >= 0) g->vals[v].space = g->vals[over[v]].space, g->vals[v].offset = g->vals[over[v]].offset;
    for (int q = 0; q < nblk; q++) free(blk[q].b);
    free(blk), free(bufs), free(P.life), free(P.off), free(P.size), free(end);
}

static void put(Graph *g, int v, int space, int64_t *top) {
    g->vals[v].space = space;
    g->vals[v].offset = top[space];
    top[space] += align_up(ir_value_bytes(&g->vals[v]));
}

static int by_def(const void *a, const void *b, void *g) {
    const Value *vals = ((const Graph *)g)->vals;
    return vals[*(const int *)a].def - vals[*(const int *)b].def;
}

/* The roots of the gradient outputs in backward-production order. */
static void place_grads(Graph *g, const MemLive *L, int64_t *top) {
    int *roots = xcalloc((size_t)g->nnodes, sizeof(int)), nr = 0;
    for (int i = 0; i < g->nnodes; i++) {
        const Node *nd = &g->nodes[i];
        if (nd->op != OP_output || strncmp(ir_attr_s(nd, "name", ""), "grad:", 5) != 0) continue;
        int r = L->root[nd->in[0]];
        if (r < 0 || g->vals[r].space >= 0 || g->nodes[g->vals[r].def].op == OP_input) continue;
        g->vals[r].space = SPACE_GRADS; /* mark: a value named by two grad outputs is placed once */
        roots[nr++] = r;
    }
    qsort_r(roots, (size_t)nr, sizeof(int), by_def, g);
    for (int k = 0; k < nr; k++) put(g, roots[k], SPACE_GRADS, top);
    free(roots);
}

/* The value each assign writes goes straight into the buffer of the
 * param or state it replaces when ir_inplace_conflict allows it (no
 * reader of the old value is left); otherwise it stays for the act space
 * and the assign copies it at the end of the step. */
static void place_inplace(Graph *g, const MemLive *L) {
    for (int i = 0; i < g->nnodes; i++) {
        if (g->nodes[i].op != OP_assign) continue;
        int nw = g->nodes[i].in[0], old = ir_assign_target(g, i);
        const char *why;
        if (old < 0 || g->vals[old].space < 0 || g->vals[nw].space >= 0 || ir_inplace_conflict(g, L, old, nw, &why) >= 0) continue;
        g->vals[nw].space = g->vals[old].space;
        g->vals[nw].offset = g->vals[old].offset;
    }
}

/* Gradients accumulated where they land.  A gradient with several
 * contributions (a tied embedding: the classifier's and the embedding's;
 * every parameter under --micro-batches) is an `add` of them; the add's
 * output is the gradient's buffer, and one of its inputs may be computed
 * straight into that buffer and added to in place, so it is not held in the
 * act space until the other contribution arrives.  Going backward through
 * the program, each add whose output is on a grads buffer takes the input
 * that lives longest there when ir_inplace_conflict allows it (no read of
 * the input after the add starts, but the add's own element by element);
 * an input that is itself such an add hands the buffer on to its inputs. */
static void place_accumulate(Graph *g, const MemLive *L) {
    for (int i = g->nnodes - 1; i >= 0; i--) {
        const Node *n = &g->nodes[i];
        int nw = n->out[0], best = -1;
        if (n->op != OP_add || L->root[nw] != nw || g->vals[nw].space != SPACE_GRADS) continue;
        for (int k = 0; k < n->nin; k++) {
            int r = L->root[n->in[k]];
            const char *why;
            if (r < 0 || r == nw || g->vals[r].space >= 0 || (ir_ops[g->nodes[g->vals[r].def].op].flags & F_SOURCE) ||
                ir_inplace_conflict(g, L, r, nw, &why) >= 0)
                continue;
            if (best < 0 || L->start[r] < L->start[best]) best = r;
        }
        if (best < 0) continue;
        g->vals[best].space = SPACE_GRADS;
        g->vals[best].offset = g->vals[nw].offset;
    }
}

/* Ops that may write their output over an input of its type (F_INPLACE:
 * cross-entropy backward over the logits) do so when ir_inplace_conflict
 * allows it (nothing reads the input after the op starts): over[output] =
 * the value whose act buffer it takes, the first of the chain. */
static int *place_over(const Graph *g, const MemLive *L) {
    int *over = xcalloc((size_t)g->nvals + 1, sizeof(int));
    for (int v = 0; v < g->nvals; v++) over[v] = -1;
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        int nw = n->out[0];
        if (!(ir_ops[n->op].flags & F_INPLACE) || L->root[nw] != nw || g->vals[nw].space >= 0) continue;
        for (int k = 0; k < n->nin; k++) {
            int r = L->root[n->in[k]];
            const char *why;
            if (r < 0 || g->vals[r].space >= 0 || (ir_ops[g->nodes[g->vals[r].def].op].flags & F_SOURCE) ||
                ir_inplace_conflict(g, L, r, nw, &why) >= 0)
                continue;
            over[nw] = over[r] >= 0 ? over[r] : r;
            break;
        }
    }
    return over;
}

static void place_all(Graph *g) {
    MemLive L;
    ir_live_build(g, &L);
    int64_t top[SPACE_COUNT] = {0};
    for (int v = 0; v < g->nvals; v++) g->vals[v].space = -1, g->vals[v].offset = -1;
    for (int i = 0; i < g->nnodes; i++) {
        const Node *nd = &g->nodes[i];
        if (nd->op == OP_param && L.root[nd->out[0]] >= 0) put(g, nd->out[0], SPACE_PARAMS, top);
        if (nd->op == OP_state) put(g, nd->out[0], SPACE_OPT, top);
    }
    place_inplace(g, &L);
    place_grads(g, &L, top);
    place_accumulate(g, &L);
    int *over = place_over(g, &L);
    place_packed(g, &L, over, SPACE_HOST);
    place_packed(g, &L, over, SPACE_ACT);
    free(over);
    for (int v = 0; v < g->nvals; v++) {
        int r = L.root[v];
        if (r >= 0 && r != v) g->vals[v].space = g->vals[r].space, g->vals[v].offset = g->vals[r].offset + L.voff[v];
    }
    ir_live_free(&L);
}

static int64_t stage_peak(const Graph *g, int space);
static int64_t live_peak(const Graph *g, int activations);

/* The bytes of the spaces a stage's plan uses (host too: offload's). */
static int64_t plan_total(const Graph *g) {
    int64_t b = 0;
    for (int sp = 0; sp < SPACE_COUNT; sp++) b += stage_peak(g, sp);
    return b;
}

static int any_view(const Graph *g) {
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        for (int k = 0; (n->op == OP_slice || n->op == OP_concat) && k < n->nin; k++)
            if (ir_view_part_in_place(g, n, k)) return 1;
    }
    return 0;
}

/* Place g's values: with views (live.h) unless that plan needs more than
 * the plan without them, or than cap when cap is larger (pass_memplan:
 * the largest stage's plan without views).  The live bytes never rise
 * with views, but best-fit packing is a heuristic: fewer, larger and
 * longer-lived buffers (a concat's owner) can pack worse, so two other
 * packing orders are tried first.  mark: if the views lose, give every
 * slice and concat copy=1, so the verifier, the emitters and any later
 * liveness see the plan's choice; else (memplan_stage_total's private
 * copy) just the smaller plan. */
static void plan_graph(Graph *g, int mark, int64_t cap, const Value *without_views) {
    place_all(g);
    if (!ir_views_enabled() || !any_view(g)) return;
    int64_t with = plan_total(g), lbw = getenv("KILN_VIEWS_TRACE") ? live_peak(g, 0) : 0;
    Value *keep = xcalloc((size_t)g->nvals + 1, sizeof(Value));
    memcpy(keep, g->vals, sizeof(Value) * (size_t)g->nvals);
    ir_views_set(0);
    if (without_views) memcpy(g->vals, without_views, sizeof(Value) * (size_t)g->nvals); /* pass_memplan's: the same plan */
    else place_all(g);
    int64_t lbo = getenv("KILN_VIEWS_TRACE") ? live_peak(g, 0) : 0;
    ir_views_set(1);
    int64_t without = plan_total(g);
    Value *alt = xcalloc((size_t)g->nvals + 1, sizeof(Value));
    memcpy(alt, g->vals, sizeof(Value) * (size_t)g->nvals); /* the plan without views */
    int64_t limit = without > cap ? without : cap; /* the views' plan may use up to this */
    for (int order = 1; order <= 2 && with > limit; order++) { /* other packing orders for the views */
        pack_order = order;
        place_all(g);
        pack_order = 0;
        if (plan_total(g) < with) with = plan_total(g), memcpy(keep, g->vals, sizeof(Value) * (size_t)g->nvals);
    }
    memcpy(g->vals, alt, sizeof(Value) * (size_t)g->nvals);
    free(alt);
    if (getenv("KILN_VIEWS_TRACE"))
        fprintf(stderr, "memplan: %lld bytes with views (live bound %lld), %lld without (%lld), limit %lld: %s\n", (long long)with, (long long)lbw,
                (long long)without, (long long)lbo, (long long)limit, limit < with ? "without" : "with");
    if (limit < with) {
        for (int i = 0; mark && i < g->nnodes; i++) {
            Node *n = &g->nodes[i];
            if ((n->op != OP_slice && n->op != OP_concat) || ir_attr(n, "copy")) continue;
            Attr *a = ir_alloc(g->m, sizeof(Attr) * (size_t)(n->nattr + 1));
            memcpy(a, n->attr, sizeof(Attr) * (size_t)n->nattr);
            a[n->nattr] = ir_attr_int(g->m, "copy", 1);
            n->attr = a, n->nattr++;
        }
    } else memcpy(g->vals, keep, sizeof(Value) * (size_t)g->nvals);
    free(keep);
}

/* Each stage may take views up to the largest stage's plan without them
 * (the module's memory per rank, what must fit the device); with
 * KILN_VIEWS_STRICT=1 up to its own plan without them. */
void pass_memplan(Module *m, const Options *o) {
    (void)o;
    int64_t cap = 0;
    const char *strict = getenv("KILN_VIEWS_STRICT");
    Value **without = xcalloc((size_t)m->nstages + 1, sizeof(Value *)); /* each stage's plan without views, when made here */
    if (m->nstages > 1 && ir_views_enabled() && !(strict && strcmp(strict, "0"))) {
        ir_views_set(0);
        for (int s = 0; s < m->nstages; s++) {
            Graph *g = m->stages[s];
            place_all(g);
            int64_t t = plan_total(g);
            cap = t > cap ? t : cap;
            without[s] = xcalloc((size_t)g->nvals + 1, sizeof(Value)); /* plan_graph needs it again: not packed twice */
            memcpy(without[s], g->vals, sizeof(Value) * (size_t)g->nvals);
        }
        ir_views_set(1);
    }
    for (int s = 0; s < m->nstages; s++) plan_graph(m->stages[s], 1, cap, without[s]), free(without[s]);
    free(without);
}

/* ======================================================================
 * Sizes and the report
 * ====================================================================== */

static int64_t stage_peak(const Graph *g, int space) {
    int64_t peak = 0;
    for (int v = 0; v < g->nvals; v++) {
        const Value *x = &g->vals[v];
        if (x->def >= 0 && x->space == space && x->offset >= 0 && x->offset + ir_value_bytes(x) > peak) peak = x->offset + ir_value_bytes(x);
    }
    return align_up(peak);
}

/* 1 for the model's activations: values computed in forward or backward
 * from the data, not partial sums (gradients) — what sequence length,
 * recompute and cp change, without params gathered for the step, gradient
 * buckets or the AdamW outputs that wait for the end of the step. */
static char *activation_values(const Graph *g) {
    char *data = xcalloc((size_t)g->nvals, 1), *act = xcalloc((size_t)g->nvals, 1);
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        int d = n->op == OP_input;
        for (int k = 0; k < n->nin; k++) d |= data[n->in[k]];
        for (int k = 0; k < n->nout; k++) {
            int v = n->out[k], part = 0;
            for (int a = 0; a < IR_NAXES; a++) part |= g->vals[v].sh[a].kind == SH_PARTIAL;
            data[v] = (char)d;
            act[v] = (char)(d && !part && n->phase != PH_OPT);
        }
    }
    free(data);
    return act;
}

/* Per buffer (root value): the last position its bytes are its own.  That
 * is where it stops being live, except for a value that the op reading it
 * last writes over (cross_entropy_bwd over the logits, an add over a
 * gradient's first contribution: the plan gives both one place): the bytes
 * pass to the new value where it starts, so they count once. */
static int *buf_ends(const Graph *g, const MemLive *L) {
    int *end = xcalloc((size_t)g->nvals + 1, sizeof(int));
    for (int v = 0; v < g->nvals; v++) end[v] = L->end[v];
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        int nw = n->nout ? n->out[0] : -1;
        if (nw < 0 || L->root[nw] != nw || g->vals[nw].space < 0 || !(n->op == OP_add || (ir_ops[n->op].flags & F_INPLACE))) continue;
        for (int k = 0; k < n->nin; k++) {
            int r = L->root[n->in[k]];
            if (r >= 0 && r != nw && g->vals[r].space == g->vals[nw].space && g->vals[r].offset == g->vals[nw].offset &&
                L->start[nw] - 1 >= L->start[r] && L->start[nw] - 1 < end[r])
                end[r] = L->start[nw] - 1;
        }
    }
    return end;
}

/* The position (0..nnodes) where the ACT buffers live at once have the most
 * bytes, the first if several; those bytes in *bytes.  only: count just the
 * values it marks (NULL: all). */
static int peak_position(const Graph *g, const MemLive *L, const char *only, int64_t *bytes) {
    int64_t *delta = xcalloc((size_t)g->nnodes + 2, sizeof(int64_t)), live = 0;
    int at = 0, *end = buf_ends(g, L);
    *bytes = 0;
    for (int v = 0; v < g->nvals; v++)
        if (L->root[v] == v && g->vals[v].space == SPACE_ACT && (!only || only[v])) {
            delta[L->start[v]] += ir_value_bytes(&g->vals[v]);
            delta[end[v] + 1] -= ir_value_bytes(&g->vals[v]);
        }
    free(end);
    for (int i = 0; i <= g->nnodes; i++) {
        live += delta[i];
        if (live > *bytes) *bytes = live, at = i;
    }
    free(delta);
    return at;
}

/* The largest sum of live ACT buffer bytes at one position; activations:
 * only the model's activations (activation_values). */
static int64_t live_peak(const Graph *g, int activations) {
    MemLive L;
    ir_live_build(g, &L);
    char *act = activations ? activation_values(g) : NULL;
    int64_t peak;
    peak_position(g, &L, act, &peak);
    free(act);
    ir_live_free(&L);
    return peak;
}

static int64_t stage_lower_bound(const Graph *g) { return live_peak(g, 0); }

/* The ACT liveness bound had nothing been offloaded: each offloaded value
 * stays on the device until its reload's last reader, and the reloads'
 * buffers are not there.  *copies: the offloaded values. */
static int64_t kept_bound(const Graph *g, int *copies) {
    MemLive L;
    ir_live_build(g, &L);
    int *end = buf_ends(g, &L), *lastread = xcalloc((size_t)g->nvals + 1, sizeof(int));
    char *gone = xcalloc((size_t)g->nvals + 1, 1);
    for (int i = 0; i < g->nnodes; i++)
        for (int k = 0; k < g->nodes[i].nin; k++)
            if (L.root[g->nodes[i].in[k]] >= 0) lastread[L.root[g->nodes[i].in[k]]] = L.last[i];
    *copies = 0;
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        if (n->op != OP_reload) continue;
        int y = L.root[n->out[0]], x = L.root[g->nodes[g->vals[n->in[0]].def].in[0]];
        if (y < 0 || x < 0) continue;
        end[x] = end[x] > lastread[y] ? end[x] : lastread[y];
        gone[y] = 1, ++*copies;
    }
    int64_t *delta = xcalloc((size_t)g->nnodes + 2, sizeof(int64_t)), live = 0, peak = 0;
    for (int v = 0; v < g->nvals; v++)
        if (L.root[v] == v && g->vals[v].space == SPACE_ACT && !gone[v]) {
            delta[L.start[v]] += ir_value_bytes(&g->vals[v]);
            delta[end[v] + 1] -= ir_value_bytes(&g->vals[v]);
        }
    for (int i = 0; i <= g->nnodes; i++)
        if ((live += delta[i]) > peak) peak = live;
    free(end), free(lastread), free(gone), free(delta);
    ir_live_free(&L);
    return peak;
}

int64_t memplan_fwd_bwd_peak(const Module *m) {
    int64_t peak = 0;
    for (int s = 0; s < m->nstages; s++) {
        int64_t p = live_peak(m->stages[s], 1);
        if (p > peak) peak = p;
    }
    return peak;
}

int64_t memplan_stage_peak(const Graph *g, int space) { return stage_peak(g, space); }

int64_t memplan_peak(const Module *m, int space) {
    int64_t peak = 0;
    for (int s = 0; s < m->nstages; s++) {
        int64_t p = stage_peak(m->stages[s], space);
        if (p > peak) peak = p;
    }
    return peak;
}

int64_t memplan_lower_bound(const Module *m) {
    int64_t lb = 0;
    for (int s = 0; s < m->nstages; s++) {
        int64_t b = stage_lower_bound(m->stages[s]);
        if (b > lb) lb = b;
    }
    return lb;
}

/* ---- the host space (--offload) ----
 *
 * The offloads' outputs are packed by liveness like the act arena: a host
 * buffer lives from its offload (d2h) until the d2h stream knows its reload
 * done, through any chain of events (live.c, host_read_end: the compute
 * stream waits for the reload, and d2h waits for a compute event recorded
 * after that), so a later offload reuses its bytes and no copy in flight
 * loses them.  The host space is then about the peak of live offloaded
 * bytes (memplan_host_bound), not their sum: in 1F1B a pipeline stage r of
 * p holds p − r micro-batches' offloads, where the sum held all of them. */

int64_t memplan_host_bound(const Graph *g) {
    MemLive L;
    ir_live_build(g, &L);
    int64_t *delta = xcalloc((size_t)g->nnodes + 2, sizeof(int64_t)), live = 0, peak = 0;
    for (int v = 0; v < g->nvals; v++)
        if (L.root[v] == v && g->vals[v].space == SPACE_HOST) {
            delta[L.start[v]] += ir_value_bytes(&g->vals[v]);
            delta[L.end[v] + 1] -= ir_value_bytes(&g->vals[v]);
        }
    for (int i = 0; i <= g->nnodes; i++)
        if ((live += delta[i]) > peak) peak = live;
    free(delta);
    ir_live_free(&L);
    return peak;
}

int memplan_host_check(const Module *m, const Options *o, char *err, size_t n) {
    if (!(o->offload == OFFLOAD_AUTO || o->device_profile) || memplan_peak(m, SPACE_HOST) == 0) return 0;
    Profile p;
    char perr[512];
    if (profile_load(&p, o->device_profile ? o->device_profile : "cpu", perr, sizeof perr) != 0) return snprintf(err, n, "--device-profile: %s", perr), -1;
    for (int s = 0; s < m->nstages && p.host_memory_bytes > 0; s++) {
        int64_t h = memplan_stage_peak(m->stages[s], SPACE_HOST);
        if ((double)h > p.host_memory_bytes)
            return snprintf(err, n, "--offload: the host space of pipeline rank %d needs %.3g GiB, above the %.3g GiB of host memory per device of profile %s "
                            "(host_memory_bytes, %s): offload less (--offload F) or shorten the sequence",
                            s, (double)h / (1 << 30), p.host_memory_bytes / (1 << 30), p.name, p.path), -1;
    }
    return 0;
}

static void put_bytes(FILE *f, const char *what, int64_t b, const char *note) {
    fprintf(f, "  %-16s %12.2f MiB %16lld bytes%s%s\n", what, (double)b / (1 << 20), (long long)b, note ? "   " : "", note ? note : "");
}

/* The group gradients are reduced over and the distributed optimizer
 * shards over: dp, times cp (a cp rank's gradients are partial sums over
 * its tokens of the same sequences).  "dp = 2", "dp x cp = 2 x 2 = 4";
 * *div: "dp" or "(dp x cp)", for formulas. */
static int red_group(const Module *m, char *text, size_t n, const char **div) {
    int dp = m->mesh[1], cp = m->mesh[2];
    if (cp > 1) snprintf(text, n, "dp x cp = %d x %d = %d", dp, cp, dp * cp);
    else snprintf(text, n, "dp = %d", dp);
    if (div) *div = cp > 1 ? "(dp x cp)" : "dp";
    return dp * cp;
}

/* The bytes of one gathered parameter under --zero 1: 2 when the flats'
 * all-gathers move bf16 (precision.c casts the shard before gathering), 4
 * when they move the f32 masters. */
static int gathered_bytes(const Graph *g) {
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        if (n->op != OP_allgather) continue;
        const Node *d = &g->nodes[g->vals[n->in[0]].def];
        if (d->op == OP_cast) d = &g->nodes[g->vals[d->in[0]].def];
        if (d->op == OP_state && ir_attr(d, "bucket")) return (int)ir_dtype_size(g->vals[n->out[0]].t.dt);
    }
    return 4;
}

/* Data parallel: bytes per parameter against Megatron's, the gradient
 * buckets in the order they are reduced, and what each rank sends per step
 * (ring algorithms: all-reduce 2(n-1)/n of the buffer, reduce-scatter and
 * all-gather (n-1)/n of the full buffer). */
static void report_comm(const Module *m, const Graph *g, FILE *f) {
    int dp = m->mesh[1], nb = 0, mbs = 1;
    int64_t nparam = 0, shard_state = 0;
    double sent[3] = {0, 0, 0}; /* allreduce, reducescatter, allgather */
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        if (n->mb + 1 > mbs) mbs = n->mb + 1;
        if (n->op == OP_param) nparam += ir_numel(&g->vals[n->out[0]].t);
        if (n->op == OP_state && ir_attr(n, "bucket")) shard_state += ir_value_bytes(&g->vals[n->out[0]]);
    }
    int zero = shard_state > 0;
    char grp[64];
    const char *div;
    int red = red_group(m, grp, sizeof grp, &div);
    fprintf(f, "data parallel: dp %d, %d micro-batch%s per step, %s over %s ranks\n", dp, mbs, mbs > 1 ? "es" : "",
            zero ? "gradients reduce-scattered, distributed optimizer (--zero 1)" : "gradients all-reduced (--zero 0)", grp);
    int gb = zero ? gathered_bytes(g) : 4;
    double per = zero ? gb + 4 + 12.0 / red : 4 + 4 + 8;
    if (zero)
        fprintf(f, "  bytes per parameter: %.2f (gathered %s params %d (activations) + f32 gradients 4 + master weights, AdamW m, v 12/%s)\n",
                per, gb == 2 ? "bf16" : "f32", gb, div);
    else fprintf(f, "  bytes per parameter: %.2f (f32 params 4 + f32 gradients 4 + AdamW m, v 8)\n", per);
    fprintf(f, "  Megatron, bf16 params + f32 grads: %.2f (6 + 12/%s with its distributed optimizer; 18 without)\n", 6 + 12.0 / red,
            div);
    fprintf(f, "  %lld parameters\n", (long long)nparam);
    fprintf(f, "  gradient buckets (in reduction order):\n");
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        if (!(ir_ops[n->op].flags & F_COMM)) continue;
        int size = ir_group_size(m, n);
        const Value *x = &g->vals[n->in[0]], *y = &g->vals[n->out[0]];
        int64_t bx = ir_value_bytes(x), by = ir_value_bytes(y);
        if (n->op == OP_allreduce) sent[0] += 2.0 * (size - 1) / size * (double)bx;
        if (n->op == OP_reducescatter) sent[1] += (double)(size - 1) / size * (double)bx;
        if (n->op == OP_allgather) sent[2] += (double)(size - 1) / size * (double)by;
        if (n->phase == PH_OPT && (n->op == OP_reducescatter || (n->op == OP_allreduce && x->t.rank == 1 && ir_numel(&x->t) > 1)))
            fprintf(f, "    %3d  %-13s %12lld elements %10.2f MiB   completed by layer %d's gradients (%s:%d)\n", nb++,
                    ir_ops[n->op].name, (long long)ir_numel(&x->t), (double)bx / (1 << 20), n->layer,
                    n->loc.file ? n->loc.file : "?", n->loc.line);
    }
    fprintf(f, "  sent per rank per step: all-reduce %.2f MiB, reduce-scatter %.2f MiB, all-gather %.2f MiB (ring algorithms)\n",
            sent[0] / (1 << 20), sent[1] / (1 << 20), sent[2] / (1 << 20));
}

/* Causal (query, key) pairs rank c of cp sees under a layout: query at
 * global position p sees p + 1 keys. */
static int64_t causal_pairs(int64_t T, int cp, int c, int dual) {
    int64_t pairs = 0, tl = T / cp, half = tl / 2;
    for (int64_t j = 0; j < tl; j++) {
        int64_t p = !dual ? c * tl + j : j < half ? c * half + j : (2 * cp - 1 - c) * half + (j - half);
        pairs += p + 1;
    }
    return pairs;
}

/* Context parallel: the balance of causal attention work over the cp ranks
 * and the K,V bytes each rank sends per layer, next to the formula
 * 2 b s kv_heads head_dim (cp-1)/cp elements. */
static void report_cp(const Module *m, const Graph *g, FILE *f) {
    int cp = m->mesh[2], dual = 1, natt = 0, p2p = 0, last_layer = INT_MIN;
    double sent = 0, formula = 0;
    int64_t T = 0;
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        if (n->op == OP_iota && ir_attr(n, "layout")) dual = strcmp(ir_attr_s(n, "layout", ""), "dual") == 0;
        int kv = n->phase == PH_FWD && n->nin && strcmp(ir_attr_s(n, "group", ""), "cp") == 0 &&
                 g->vals[n->in[0]].t.rank == 4; /* K or V [b, kv_heads, s/cp, head_dim] */
        if (kv && n->op == OP_allgather) sent += (double)(cp - 1) / cp * (double)ir_numel(&g->vals[n->out[0]].t), p2p = 0;
        if (kv && n->op == OP_send) sent += (double)ir_numel(&g->vals[n->in[0]].t), p2p = 1;
        if (n->op == OP_attention && n->nin == 5 && n->layer != last_layer) { /* once per layer (a ring has cp) */
            last_layer = n->layer, natt++;
            const Type *q = &g->vals[n->in[0]].t, *k = &g->vals[n->in[1]].t;
            formula += 2.0 * (double)(k->dim[0] * k->dim[1] * q->dim[2] * cp * k->dim[3]) * (cp - 1) / cp;
            T = q->dim[2] * cp;
        }
    }
    fprintf(f, "context parallel: cp %d, %s layout, %s attention\n", cp, dual ? "dual-chunk" : "contiguous",
            p2p ? "ring (p2p)" : "all-gather");
    if (!natt || !T) return;
    int64_t lo = INT64_MAX, hi = 0;
    fprintf(f, "  causal attention work per cp rank (query-key pairs per sequence and head):");
    for (int c = 0; c < cp; c++) {
        int64_t p = causal_pairs(T, cp, c, dual);
        lo = p < lo ? p : lo, hi = p > hi ? p : hi;
        fprintf(f, " %lld", (long long)p);
    }
    fprintf(f, "\n  balance max/min %.3f\n", (double)hi / (double)lo);
    fprintf(f, "  K,V sent per rank per layer, forward: %.0f elements (formula 2 b s kv_heads head_dim (cp-1)/cp = %.0f)\n",
            sent / natt, formula / natt);
}

/* ======================================================================
 * What sets the peak
 * ====================================================================== */

/* "models/gpt2.lua:31 L3 fwd" for node i; "after the step" past the last. */
static const char *node_line(const Graph *g, int i, char *buf, size_t n) {
    if (i >= g->nnodes) return snprintf(buf, n, "after the step"), buf;
    const Node *nd = &g->nodes[i];
    snprintf(buf, n, "%s:%d L%d %s", nd->loc.file ? nd->loc.file : "?", nd->loc.line, nd->layer, ir_phase_names[nd->phase]);
    return buf;
}

/* Per buffer (root value): the node that reads it last, -1 when none does. */
static int *last_readers(const Graph *g, const MemLive *L) {
    int *last = xcalloc((size_t)g->nvals, sizeof(int));
    for (int v = 0; v < g->nvals; v++) last[v] = -1;
    for (int i = 0; i < g->nnodes; i++)
        for (int k = 0; k < g->nodes[i].nin; k++) {
            int r = L->root[g->nodes[i].in[k]];
            if (r >= 0) last[r] = i;
        }
    return last;
}

/* Why buffer v is still live at position at: made there, or its last
 * reader (and, when another stream's read holds it longer, until when). */
static void why_live(const Graph *g, const MemLive *L, int v, int reader, int at, char *buf, size_t n) {
    char where[160];
    if (L->start[v] == at) {
        snprintf(buf, n, "written here");
        return;
    }
    if (reader < 0) {
        snprintf(buf, n, "never read");
        return;
    }
    const Node *r = &g->nodes[reader];
    int k = r->op == OP_output ? snprintf(buf, n, "read by output %s after the step", ir_attr_s(r, "name", "?"))
                               : snprintf(buf, n, "read by %s at %s pos %d", ir_ops[r->op].name, node_line(g, reader, where, sizeof where), reader);
    if (r->op != OP_output && L->end[v] > reader && k > 0 && (size_t)k < n)
        snprintf(buf + k, n - (size_t)k, ", held to pos %d for another stream", L->end[v]);
}

typedef struct {
    int v;
    int64_t bytes;
} LiveBuf;

static int by_bytes(const void *a, const void *b) {
    const LiveBuf *x = a, *y = b;
    return x->bytes != y->bytes ? (x->bytes < y->bytes) - (x->bytes > y->bytes) : x->v - y->v;
}

enum { PEAK_ROWS = 24 };

/* What the buffers live at the peak are, in bytes (docs/memory.md "kiln
 * plan --peak"): saved activations still on the device (made in forward,
 * last read in backward), per micro-batch; values waiting for their d2h
 * copy (last read by an offload: held until its release); reloads; values
 * received over pp; bf16 copies of parameters (a cast of a param); the
 * forward's working set (made and last read in forward); the backward's
 * (made in backward or recompute); the rest. */
static void peak_breakdown(const Graph *g, const LiveBuf *live, int nb, const int *reader, FILE *f) {
    enum { SAVED, OFFQ, RELOAD, RECV, PCOPY, FWD, BWD, OTHER, NC };
    static const char *const name[NC] = {"saved activations kept", "waiting for their d2h copy", "reloaded", "received over pp",
                                         "bf16 parameter copies", "forward working set", "backward working set", "other"};
    enum { MAXMB = 64 };
    int64_t sum[NC] = {0}, mb[MAXMB] = {0};
    for (int k = 0; k < nb; k++) {
        int v = live[k].v;
        const Node *d = &g->nodes[g->vals[v].def], *r = reader[v] >= 0 ? &g->nodes[reader[v]] : NULL;
        int bwd_r = r && (r->phase == PH_BWD || r->phase == PH_RECOMPUTE || r->phase == PH_WGRAD), c = OTHER;
        if (d->op == OP_reload) c = RELOAD;
        else if (d->op == OP_recv_start || d->op == OP_recv_done) c = RECV;
        else if (d->op == OP_cast && d->nin && g->vals[d->in[0]].space == SPACE_PARAMS) c = PCOPY;
        else if (r && r->op == OP_offload) c = OFFQ;
        else if (d->phase == PH_FWD && bwd_r) c = SAVED;
        else if (d->phase == PH_FWD) c = FWD;
        else if (d->phase == PH_BWD || d->phase == PH_RECOMPUTE || d->phase == PH_WGRAD) c = BWD;
        sum[c] += live[k].bytes;
        if (c == SAVED && d->mb >= 0 && d->mb < MAXMB) mb[d->mb] += live[k].bytes;
    }
    fprintf(f, "  at the peak, MiB:");
    for (int c = 0; c < NC; c++) fprintf(f, "%s %s %.2f", c ? "," : "", name[c], (double)sum[c] / (1 << 20));
    fprintf(f, "\n  saved activations kept, per micro-batch (MiB):");
    for (int k = 0; k < MAXMB; k++)
        if (mb[k]) fprintf(f, " mb %d %.2f", k, (double)mb[k] / (1 << 20));
    fprintf(f, "\n");
}

static void stage_peak_report(const Graph *g, FILE *f) {
    MemLive L;
    ir_live_build(g, &L);
    int64_t bytes;
    int at = peak_position(g, &L, NULL, &bytes), *reader = last_readers(g, &L), *end = buf_ends(g, &L), nb = 0;
    char where[160], why[320], type[96];
    LiveBuf *live = xcalloc((size_t)g->nvals + 1, sizeof(LiveBuf));
    for (int v = 0; v < g->nvals; v++)
        if (L.root[v] == v && g->vals[v].space == SPACE_ACT && L.start[v] <= at && at <= end[v])
            live[nb++] = (LiveBuf){v, ir_value_bytes(&g->vals[v])};
    qsort(live, (size_t)nb, sizeof(LiveBuf), by_bytes);
    fprintf(f, "activation arena %.2f MiB; most bytes live at pos %d of %d, %s%s%s: %.2f MiB in %d buffers\n",
            (double)stage_peak(g, SPACE_ACT) / (1 << 20), at, g->nnodes, at < g->nnodes ? ir_ops[g->nodes[at].op].name : "",
            at < g->nnodes ? " at " : "", node_line(g, at, where, sizeof where), (double)bytes / (1 << 20), nb);
    fprintf(f, "  %14s  %-7s %-22s %-18s %-32s %s\n", "bytes", "value", "type", "op", "made at", "why still live");
    int64_t rest = 0;
    for (int k = 0; k < nb; k++) {
        int v = live[k].v;
        if (k >= PEAK_ROWS) {
            rest += live[k].bytes;
            continue;
        }
        const Node *d = &g->nodes[g->vals[v].def];
        why_live(g, &L, v, reader[v], at, why, sizeof why);
        fprintf(f, "  %10.2f MiB  %%%-6d %-22s %-18s %-32s %s\n", (double)live[k].bytes / (1 << 20), v,
                ir_type_str(&g->vals[v].t, type, sizeof type), ir_ops[d->op].name, node_line(g, g->vals[v].def, where, sizeof where), why);
    }
    if (nb > PEAK_ROWS) fprintf(f, "  %10.2f MiB  in %d smaller buffers\n", (double)rest / (1 << 20), nb - PEAK_ROWS);
    peak_breakdown(g, live, nb, reader, f);
    free(live), free(reader), free(end);
    ir_live_free(&L);
}

void memplan_peak_report(const Module *m, FILE *f) {
    for (int s = 0; s < m->nstages; s++) {
        if (m->nstages > 1) fprintf(f, "pipeline stage %d: ", s);
        stage_peak_report(m->stages[s], f);
    }
}

/* "bwd at pos 812 (models/gpt2.lua:40 L11, attention_bwd)": where the most
 * act bytes are live. */
static void put_peak_phase(const Graph *g, FILE *f) {
    MemLive L;
    ir_live_build(g, &L);
    int64_t bytes;
    int at = peak_position(g, &L, NULL, &bytes);
    char where[160];
    if (at >= g->nnodes) fprintf(f, "  %-16s after the step\n", "peak set in");
    else
        fprintf(f, "  %-16s %s, at pos %d of %d (%s, %s)\n", "peak set in", ir_phase_names[g->nodes[at].phase], at, g->nnodes,
                node_line(g, at, where, sizeof where), ir_ops[g->nodes[at].op].name);
    ir_live_free(&L);
}

/* Slices and concats the plan made views (live.h): the parts placed where
 * the op would copy them, which the back ends do not copy; printed when
 * there are any. */
static void report_views(const Graph *g, FILE *f) {
    int ns = 0, nsv = 0, nc = 0, ncv = 0, parts = 0, pv = 0;
    double saved = 0, left = 0;
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        if ((n->op != OP_slice && n->op != OP_concat) || ir_fused_group(n) >= 0) continue;
        int all = 1;
        for (int k = 0; k < n->nin; k++) {
            int in = ir_view_part_in_place(g, n, k);
            double b = (double)ir_value_bytes(&g->vals[n->op == OP_slice ? n->out[0] : n->in[k]]);
            all &= in, parts++, pv += in;
            *(in ? &saved : &left) += b;
        }
        if (n->op == OP_slice) ns++, nsv += all;
        else nc++, ncv += all;
        if (!all && getenv("KILN_VIEWS_TRACE")) { /* what is still copied, and where */
            char t[96], w[160];
            fprintf(f, "    copied: %s %s {dim=%lld} of %d parts at %s\n", ir_ops[n->op].name, ir_type_str(&g->vals[n->out[0]].t, t, sizeof t),
                    (long long)ir_attr_i(n, "dim", -1), n->nin, node_line(g, i, w, sizeof w));
        }
    }
    if (nsv + pv)
        fprintf(f, "  %-16s %d of %d slices and %d of %d concats copy nothing (%d of %d parts in place: %.2f MiB per step not copied, %.2f MiB still copied)%s\n",
                "views", nsv, ns, ncv, nc, pv, parts, saved / (1 << 20), left / (1 << 20), ir_views_enabled() ? "" : " [KILN_VIEWS=0]");
}

void memplan_report(const Module *m, FILE *f) {
    for (int s = 0; s < m->nstages; s++) {
        const Graph *g = m->stages[s];
        int64_t p = stage_peak(g, SPACE_PARAMS), gr = stage_peak(g, SPACE_GRADS);
        int64_t o = stage_peak(g, SPACE_OPT), a = stage_peak(g, SPACE_ACT), lb = stage_lower_bound(g);
        char note[160];
        if (m->nstages == 1) fprintf(f, "memory per rank:\n");
        else fprintf(f, "memory per rank of pipeline stage %d:\n", s);
        put_bytes(f, "params", p, ir_world(m) > 1 && !p ? "(--zero 1: params are gathered into the activation arena each step)" : NULL);
        char grp[64], gnote[160], onote[160];
        const char *div;
        red_group(m, grp, sizeof grp, &div);
        snprintf(gnote, sizeof gnote, gr ? "(all-reduced in buckets over %s ranks)"
                                         : "(accumulated in the activation arena, reduce-scattered in buckets over %s ranks)", grp);
        snprintf(onote, sizeof onote, "(1/%s of the master weights and AdamW moments, %s; step)", div, grp);
        put_bytes(f, "grads", gr, ir_world(m) > 1 ? gnote : NULL);
        put_bytes(f, "optimizer state", o, p || ir_world(m) == 1 ? "(AdamW moments, step)" : onote);
        snprintf(note, sizeof note, "(arena peak; liveness lower bound %.2f MiB, %.3fx)", (double)lb / (1 << 20),
                 lb ? (double)a / (double)lb : 1.0);
        put_bytes(f, "activations", a, note);
        put_bytes(f, "  of which model", live_peak(g, 1), "(peak of the forward/backward activations alone: what sequence length and cp change)");
        put_peak_phase(g, f);
        int64_t host = stage_peak(g, SPACE_HOST);
        if (host) { /* --offload: what went to the host, and the device bound it lowered */
            int copies;
            int64_t kept = kept_bound(g, &copies);
            snprintf(note, sizeof note, "(%d values offloaded, live peak %.2f MiB; device act bound %.2f MiB with offload, %.2f MiB without)",
                     copies, (double)memplan_host_bound(g) / (1 << 20), (double)lb / (1 << 20), (double)kept / (1 << 20));
            put_bytes(f, "host (offload)", host, note);
        }
        put_bytes(f, "workspace", 0, "(scratch of library kernels beyond their outputs: none on the CPU)");
        report_views(g, f);
        put_bytes(f, "total", p + gr + o + a, NULL);
        if (ir_world(m) > 1) report_comm(m, g, f);
        if (m->mesh[2] > 1) report_cp(m, g, f);
    }
}

/* ======================================================================
 * The plan's peak, without planning (schedule.c's memory rule)
 * ====================================================================== */

/* The same placement as pass_memplan on a private copy of g's values (the
 * only thing plan_graph writes: each value's space and offset), so g is
 * unchanged: the bytes of params, grads, optimizer state and activations
 * that pass_memplan would give this stage, memplan_stage_peak's sum.  With
 * pipeline stages pass_memplan may keep a stage's views up to the largest
 * stage's plan without them; this one stage alone holds them to its own
 * (KILN_VIEWS_STRICT's rule). */
int64_t memplan_stage_total(const Graph *g) {
    Graph copy = *g;
    copy.vals = xcalloc((size_t)g->nvals + 1, sizeof(Value));
    memcpy(copy.vals, g->vals, sizeof(Value) * (size_t)g->nvals);
    plan_graph(&copy, 0, 0, NULL);
    int64_t b = 0;
    for (int sp = SPACE_PARAMS; sp <= SPACE_ACT; sp++) b += stage_peak(&copy, sp);
    free(copy.vals);
    return b;
}
