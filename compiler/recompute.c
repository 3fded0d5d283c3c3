/* recompute.c — which forward values backward reads from memory, and which
 * it recomputes (DESIGN.md §9.2).
 *
 * After autodiff and parallelize the step is one graph: forward nodes, then
 * backward nodes that read forward values directly.  Every forward value a
 * backward node reads is *saved*: it stays live from forward to backward,
 * and those values are most of a training step's activation memory.  This
 * pass chooses a set of forward values to *recompute* instead: every
 * backward read of such a value reads a clone, built in phase `recompute`
 * right before the first backward node that needs it, from the values that
 * stay saved.  The memory plan then sees the short lifetimes.  Recomputing
 * is deterministic, so the step's numbers do not change.
 *
 * The choice is a set rc of values (rc[v]: backward reads a clone of v).  A
 * clone's inputs are clones where rc says so and the saved values
 * elsewhere, so rc alone fixes both what is recomputed and what is saved
 * (saved_bytes simulates it; rewrite builds it).  The policies:
 *
 *   none       rc is empty.
 *   full       every value computed in a layer, except the layer's inputs
 *              (values a later layer reads) and communication results:
 *              backward re-runs the layer's forward from its inputs
 *              (Megatron's full, uniform) — as much of it as backward
 *              reads: a GEMM whose output only feeds the residual is not
 *              repeated.  Outside the layers, gemm-last's chains.
 *   selective  the outputs of attention (Megatron's selective: the core
 *              attention is recomputed, its Q, K, V stay saved), each
 *              attention only where that saves bytes: never more saved
 *              than `none` (see selective() for --cp).
 *   gemm-last  cheap chains only.  A candidate is a saved value made by a
 *              cheap op (not EXPENSIVE, not communication): its chain runs
 *              back through cheap ops to values that are saved anyway or
 *              are outputs of expensive ops (GEMMs, attention), which then
 *              become saved.  The chain is taken when it saves bytes (the
 *              candidate's bytes minus the new saved values') at a cost of
 *              at most MAX_FLOPS_PER_BYTE added FLOPs per byte saved.  No
 *              GEMM and no attention is ever re-executed, and the verifier
 *              holds a module marked gemm-last to that.
 *
 * --activation-budget B (bytes of saved activations per rank, at the
 * schedule's peak): the cheapest set that fits: nothing if `none` fits;
 * else gemm-last's chains, the fewest FLOPs per byte saved first, as few
 * as fit; else layers switched to full one by one from the first (the
 * module is then marked full: some of its layers re-run GEMMs); else an
 * error naming full's minimum.  A rank's saved bytes at the peak: the
 * program here holds every micro-batch of the step (and, before the
 * pipeline pass, every layer), but a rank keeps only the micro-batches in
 * flight of its own chunks.  So each saved value counts from its forward
 * action (chunk, micro-batch: pp.c's cut, pp_actions) to the last backward
 * action that reads it (B, or W under the zero-bubble schedules), and the
 * ranks' action lists (ppsched.h; one rank running F0 B0 F1 B1 ... without
 * --pp) give the most alive at once on any rank.  An estimate of memplan's
 * activations (a value whose only readers are clones counts until B), not
 * its peak: the device total is --memory-budget's (cmd/pipeline.c).
 *
 * Values made outside the forward (backward's own), parameters, inputs and
 * constants are never counted or cloned; communication is never repeated
 * (a clone reads the saved result of a collective or a receive).
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "passes.h"
#include "ppsched.h"

#define MAX_FLOPS_PER_BYTE 32.0

typedef struct {
    const Graph *g;
    char *rc;    /* value: backward reads a clone */
    char *saved; /* value: live from forward into backward (scratch of saved_bytes) */
    char *seen;  /* value: clone visited (scratch) */
    int *touched, ntouched; /* the values chain_of marked in seen (reset without a pass over every value) */
    char *data;  /* value: computed from the step's data (data_values): what counts */
} Rc;

static const Node *def_of(const Graph *g, int v) { return g->vals[v].def >= 0 ? &g->nodes[g->vals[v].def] : NULL; }

/* 1 for values computed from the step's data (inputs, received blocks):
 * the activations; params gathered for the step (--zero 1) are not */
static char *data_values(const Graph *g) {
    char *data = xcalloc((size_t)g->nvals, 1);
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        unsigned fl = ir_ops[n->op].flags;
        int d = n->op == OP_input || (fl & F_SOURCE && fl & F_COMM); /* the data, and what a rank receives */
        for (int k = 0; k < n->nin; k++) d |= data[n->in[k]];
        for (int k = 0; k < n->nout; k++) data[n->out[k]] = (char)d;
    }
    return data;
}

/* a forward value that counts as an activation: made by a forward node that
 * is not a param, input or constant (a receive counts: it holds data) */
static int activation(const Graph *g, int v) {
    const Node *d = def_of(g, v);
    if (!d || d->phase != PH_FWD) return 0;
    unsigned fl = ir_ops[d->op].flags;
    return !(fl & F_SOURCE) || (fl & F_COMM);
}

/* a forward op recomputing may repeat: not expensive, not communication */
static int cheap(const Node *d) {
    unsigned fl = ir_ops[d->op].flags;
    return d->phase == PH_FWD && !(fl & (F_EXPENSIVE | F_COMM | F_SOURCE | F_SINK));
}

static int reads_back(const Node *n) { return n->phase == PH_BWD || n->phase == PH_RECOMPUTE || n->phase == PH_WGRAD; }

/* ---- what rc saves: the simulation of rewrite ---- */

static void visit_clone(Rc *R, int v);

static void need(Rc *R, int v) {
    if (!activation(R->g, v)) return;
    if (R->rc[v]) visit_clone(R, v);
    else R->saved[v] = 1;
}

static void visit_clone(Rc *R, int v) {
    const Node *d = def_of(R->g, v);
    if (R->seen[v]) return;
    for (int k = 0; k < d->nout; k++) R->seen[d->out[k]] = 1;
    for (int k = 0; k < d->nin; k++) need(R, d->in[k]);
}

/* Bytes saved for backward under rc (the values in R->saved after). */
static int64_t saved_bytes(Rc *R) {
    const Graph *g = R->g;
    memset(R->saved, 0, (size_t)g->nvals);
    memset(R->seen, 0, (size_t)g->nvals);
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i].phase == PH_BWD)
            for (int k = 0; k < g->nodes[i].nin; k++) need(R, g->nodes[i].in[k]);
    memset(R->seen, 0, (size_t)g->nvals), R->ntouched = 0; /* chain_of's scratch starts clean */
    int64_t total = 0;
    for (int v = 0; v < g->nvals; v++)
        if (R->saved[v] && R->data[v]) total += ir_value_bytes(&g->vals[v]);
    return total;
}

/* ---- the policies ---- */

/* full for layer L: every value made in L that no other layer reads */
static void full_layer(Rc *R, int L) {
    const Graph *g = R->g;
    char *outside = xcalloc((size_t)g->nvals, 1);
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        if (n->phase == PH_FWD && n->layer != L)
            for (int k = 0; k < n->nin; k++) outside[n->in[k]] = 1;
    }
    for (int v = 0; v < g->nvals; v++) {
        const Node *d = def_of(g, v);
        if (d && d->layer == L && activation(g, v) && !(ir_ops[d->op].flags & F_COMM) && !outside[v]) R->rc[v] = 1;
    }
    free(outside);
}

/* selective: each layer's attention outputs, where recomputing them saves
 * bytes.  Under --cp all-gather none keeps the local K, V (backward gathers
 * them again) and a clone would keep the gathered ones, cp times larger;
 * under --cp p2p backward reads attn_merge's outputs, not attention's.
 * There no attention is taken, and selective saves what none saves. */
/* The saved bytes when node n's outputs are recomputed too, from R->saved
 * (the saved set under the current choice), without the whole walk of
 * saved_bytes: when none of n's inputs or outputs is recomputed already,
 * cloning n changes only n's outputs (no longer saved) and, if one of them
 * was needed, n's activation inputs (saved now, as saved_bytes' need would
 * mark them).  -1 when that does not hold (saved_bytes must walk). */
static int64_t saved_with(Rc *R, const Node *n, int64_t now) {
    const Graph *g = R->g;
    int reached = 0;
    for (int k = 0; k < n->nin; k++)
        if (R->rc[n->in[k]]) return -1;
    for (int k = 0; k < n->nout; k++) {
        int o = n->out[k];
        if (R->rc[o]) return -1;
        if (activation(g, o) && R->saved[o]) reached = 1, now -= R->data[o] ? ir_value_bytes(&g->vals[o]) : 0;
    }
    for (int k = 0; k < n->nin && reached; k++) { /* each input once (seen: scratch) */
        int v = n->in[k];
        if (activation(g, v) && !R->saved[v] && !R->seen[v]) now += R->data[v] ? ir_value_bytes(&g->vals[v]) : 0;
        R->seen[v] = 1;
    }
    for (int k = 0; k < n->nin; k++) R->seen[n->in[k]] = 0;
    return now;
}

static void selective(Rc *R) {
    const Graph *g = R->g;
    int64_t best = saved_bytes(R); /* R->saved: the saved set under the choice so far */
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        unsigned fl = ir_ops[n->op].flags;
        if (!(n->phase == PH_FWD && n->layer >= 0 && (fl & F_EXPENSIVE) && !(fl & F_GEMM))) continue;
        int64_t fast = saved_with(R, n, best);
        if (fast >= 0) { /* the walk's answer without the walk (each attention of a long program walked it whole: quadratic) */
            if (fast >= best) continue;
            int reached = 0;
            for (int k = 0; k < n->nout; k++) reached |= activation(g, n->out[k]) && R->saved[n->out[k]];
            for (int k = 0; k < n->nout; k++) R->rc[n->out[k]] = 1, R->saved[n->out[k]] = 0;
            for (int k = 0; k < n->nin && reached; k++)
                if (activation(g, n->in[k])) R->saved[n->in[k]] = 1;
            best = fast;
            continue;
        }
        for (int k = 0; k < n->nout; k++) R->rc[n->out[k]] = 1;
        int64_t now = saved_bytes(R);
        if (now < best) best = now;
        else {
            for (int k = 0; k < n->nout; k++) R->rc[n->out[k]] = 0;
            saved_bytes(R); /* R->saved back to the choice kept */
        }
    }
}

/* One gemm-last candidate: v's chain back to saved values. */
typedef struct {
    int64_t gain;   /* bytes saved (v's, less the newly saved inputs') */
    double flops;   /* added by the clones */
} Chain;

/* Walk v's chain under the current choice (R->rc, R->saved): cheap values
 * not saved join the chain (mark 2 in seen), saved values and clones that
 * exist cost nothing, anything else becomes newly saved (mark 3). */
static void see(Rc *R, int v, char mark) {
    if (!R->seen[v]) R->touched[R->ntouched++] = v;
    R->seen[v] = mark;
}

static void walk(Rc *R, int v, Chain *c, int apply) {
    const Graph *g = R->g;
    const Node *d = def_of(g, v);
    if (R->seen[v]) return;
    if (!activation(g, v) || R->saved[v] || R->rc[v] || !cheap(d)) {
        if (activation(g, v) && !R->saved[v] && !R->rc[v]) {
            see(R, v, 3);
            if (R->data[v]) c->gain -= ir_value_bytes(&g->vals[v]);
            if (apply) R->saved[v] = 1;
        } else {
            see(R, v, 1);
        }
        return;
    }
    see(R, v, 2);
    c->flops += ir_node_flops(g, d);
    if (apply) R->rc[v] = 1;
    for (int k = 0; k < d->nin; k++) walk(R, d->in[k], c, apply);
}

static Chain chain_of(Rc *R, int v, int apply) {
    Chain c = {R->data[v] ? ir_value_bytes(&R->g->vals[v]) : 0, 0};
    while (R->ntouched) R->seen[R->touched[--R->ntouched]] = 0; /* the last chain's marks only */
    const Node *d = def_of(R->g, v);
    see(R, v, 2);
    c.flops += ir_node_flops(R->g, d);
    for (int k = 0; k < d->nin; k++) walk(R, d->in[k], &c, apply);
    if (apply) R->rc[v] = 1, R->saved[v] = 0;
    return c;
}

static int candidate(Rc *R, int v) {
    const Node *d = def_of(R->g, v);
    return R->saved[v] && !R->rc[v] && d && cheap(d);
}

static int worth(const Chain *c, int any_cost) {
    return c->gain > 0 && (any_cost || c->flops <= MAX_FLOPS_PER_BYTE * (double)c->gain);
}

/* gemm-last: every chain worth taking, in value order (no budget) */
static void gemm_last(Rc *R) {
    saved_bytes(R);
    for (int v = 0; v < R->g->nvals; v++) {
        if (!candidate(R, v)) continue;
        Chain c = chain_of(R, v, 0);
        if (worth(&c, 0)) chain_of(R, v, 1);
    }
}

/* ---- --activation-budget: saved bytes per rank at the schedule's peak ---- */

typedef struct {
    PpPlan pl;      /* the ranks' actions (one rank's 1f1b without --pp: F0 B0 F1 B1 ...) */
    PpActions a;    /* every node's action */
    char *freed_w;  /* value: read by a W action (freed there, not at B) */
    int64_t *bytes; /* scratch [3][chunks * m]: allocated at F, freed at B, at W */
} Sched;

static Sched sched_of(const Graph *g, const Options *o) {
    Sched S = {0};
    char err[256];
    int p = o->pp > 1 ? o->pp : 1;
    PpSchedule kind = p > 1 ? (PpSchedule)o->pp_schedule : PS_1F1B;
    if (ppsched_build(&S.pl, kind, p, p > 1 ? o->vpp : 1, o->micro_batches > 0 ? o->micro_batches : 1, err, sizeof err) != 0)
        error_at(g->nnodes ? g->nodes[0].loc : (Loc){0}, "%s", err);
    pp_actions(g, o, &S.pl, &S.a);
    S.freed_w = xcalloc((size_t)g->nvals, 1);
    for (int i = 0; i < g->nnodes; i++)
        if (S.a.chunk[i] >= 0 && S.a.kind[i] == ACT_W)
            for (int k = 0; k < g->nodes[i].nin; k++) S.freed_w[g->nodes[i].in[k]] = 1;
    S.bytes = xcalloc((size_t)3 * (size_t)(S.pl.p * S.pl.v * S.pl.m), sizeof(int64_t));
    return S;
}

static void sched_free(Sched *S) {
    free(S->a.chunk), free(S->a.kind), free(S->a.mb), free(S->freed_w), free(S->bytes);
    ppsched_free(&S->pl);
}

/* The most saved bytes alive at once on any rank under R's choice (R->saved
 * as saved_bytes left it). */
static int64_t peak_saved(const Rc *R, Sched *S) {
    const Graph *g = R->g;
    int n = S->pl.p * S->pl.v * S->pl.m;
    int64_t *at_f = S->bytes, *at_b = S->bytes + n, *at_w = S->bytes + 2 * n;
    memset(S->bytes, 0, (size_t)3 * (size_t)n * sizeof(int64_t));
    for (int v = 0; v < g->nvals; v++) {
        if (!R->saved[v] || !R->data[v]) continue;
        int d = g->vals[v].def, c = S->a.chunk[d] >= 0 ? S->a.chunk[d] : 0, key = c * S->pl.m + S->a.mb[d];
        int64_t b = ir_value_bytes(&g->vals[v]);
        at_f[key] += b;
        (S->freed_w[v] ? at_w : at_b)[key] += b;
    }
    int64_t peak = 0;
    for (int r = 0; r < S->pl.p; r++) {
        int64_t alive = 0;
        for (int k = 0; k < S->pl.nact[r]; k++) {
            const Action *x = &S->pl.act[r][k];
            int key = x->chunk * S->pl.m + x->mb;
            if (x->kind == ACT_F) alive += at_f[key], peak = alive > peak ? alive : peak;
            else alive -= (x->kind == ACT_B ? at_b : at_w)[key];
        }
    }
    return peak;
}

static int fits(Rc *R, Sched *S, double budget) {
    saved_bytes(R);
    return (double)peak_saved(R, S) <= budget;
}

typedef struct {
    int v;
    double ratio;
} Cand;

static int by_ratio(const void *a, const void *b) {
    const Cand *x = a, *y = b;
    return x->ratio < y->ratio ? -1 : x->ratio > y->ratio ? 1 : x->v - y->v;
}

/* The first k chains of the order, each taken if it still saves bytes when
 * its turn comes (the chains before it may have changed it). */
static void take_first(Rc *R, const Cand *order, int k) {
    memset(R->rc, 0, (size_t)R->g->nvals);
    saved_bytes(R);
    for (int j = 0; j < k; j++) {
        int v = order[j].v;
        if (!candidate(R, v)) continue;
        Chain c = chain_of(R, v, 0);
        if (worth(&c, 1)) chain_of(R, v, 1);
    }
}

/* gemm-last's chains, the fewest FLOPs per byte saved first (as priced with
 * nothing recomputed), as few as fit the budget; 1 if they do.  The shortest
 * prefix that fits is found by bisection (taking more chains never saves
 * more), so a long program is walked O(log n) times, not once a chain. */
static int gemm_last_until(Rc *R, Sched *S, double budget) {
    const Graph *g = R->g;
    Cand *order = xcalloc((size_t)g->nvals + 1, sizeof(Cand));
    int n = 0;
    saved_bytes(R);
    for (int v = 0; v < g->nvals; v++) {
        if (!candidate(R, v)) continue;
        Chain c = chain_of(R, v, 0);
        if (worth(&c, 1)) order[n++] = (Cand){v, c.flops / (double)c.gain};
    }
    qsort(order, (size_t)n, sizeof(Cand), by_ratio);
    take_first(R, order, n);
    int ok = fits(R, S, budget);
    for (int lo = 0, hi = n; ok && lo < hi;) { /* the answer lies in (lo, hi] */
        int mid = lo + (hi - lo) / 2;
        take_first(R, order, mid);
        if (fits(R, S, budget)) hi = mid;
        else lo = mid + 1;
        if (lo == hi) take_first(R, order, hi);
    }
    free(order);
    return ok;
}

static int max_layer(const Graph *g) {
    int L = -1;
    for (int i = 0; i < g->nnodes; i++) L = g->nodes[i].layer > L ? g->nodes[i].layer : L;
    return L;
}

static Recompute within_budget(Rc *R, const Options *o) {
    const Graph *g = R->g;
    double budget = o->activation_budget;
    Sched S = sched_of(g, o);
    Recompute got = RC_NONE;
    if (fits(R, &S, budget)) goto done;
    got = RC_GEMM_LAST;
    if (gemm_last_until(R, &S, budget)) goto done;
    got = RC_FULL; /* layers 0..L full, the rest gemm-last */
    for (int L = 0, last = max_layer(g); L <= last; L++) {
        full_layer(R, L);
        if (fits(R, &S, budget)) goto done;
    }
    fprintf(stderr, "kiln: --activation-budget %.0f bytes: below the minimum of %lld bytes of saved activations per rank (--recompute full)\n",
            budget, (long long)peak_saved(R, &S));
    exit(1);
done:
    sched_free(&S);
    return got;
}

/* ---- the rewrite ---- */

typedef struct {
    const Graph *g;
    const char *rc;
    Builder b;
    int *map;   /* old value -> new value */
    int *clone; /* old value -> its clone in the new graph, -1 */
} Rw;

static int copy_node(Rw *W, const Node *n, const int *in, Phase phase) {
    W->b.loc = n->loc, W->b.layer = n->layer, W->b.phase = phase;
    const Type *src = ir_ops[n->op].flags & F_SOURCE ? &W->g->vals[n->out[0]].t : NULL;
    int j = ir_build(&W->b, n->op, n->nin, in, n->nattr, n->attr, src);
    Node *c = &W->b.g->nodes[j];
    c->stage = n->stage, c->vstage = n->vstage, c->mb = n->mb;
    for (int k = 0; k < n->nout; k++) memcpy(W->b.g->vals[c->out[k]].sh, W->g->vals[n->out[k]].sh, sizeof W->g->vals[0].sh);
    return j;
}

static int clone_of(Rw *W, int v) {
    if (W->clone[v] >= 0) return W->clone[v];
    const Node *d = def_of(W->g, v);
    int *in = xcalloc((size_t)d->nin, sizeof(int));
    for (int k = 0; k < d->nin; k++) {
        int u = d->in[k];
        in[k] = W->rc[u] && activation(W->g, u) ? clone_of(W, u) : W->map[u];
    }
    int j = copy_node(W, d, in, PH_RECOMPUTE);
    free(in);
    for (int k = 0; k < d->nout; k++) W->clone[d->out[k]] = W->b.g->nodes[j].out[k];
    return W->clone[v];
}

static Graph *rewrite(Module *m, const Graph *g, const char *rc) {
    Rw W = {g, rc, {.g = ir_graph_new(m), .pass = "recompute"}, xcalloc((size_t)g->nvals, sizeof(int)),
            xcalloc((size_t)g->nvals, sizeof(int))};
    for (int v = 0; v < g->nvals; v++) W.map[v] = W.clone[v] = -1;
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        int *in = xcalloc((size_t)n->nin, sizeof(int));
        for (int k = 0; k < n->nin; k++) {
            int u = n->in[k];
            in[k] = n->phase == PH_BWD && rc[u] && activation(g, u) ? clone_of(&W, u) : W.map[u];
        }
        int j = copy_node(&W, n, in, n->phase);
        free(in);
        for (int k = 0; k < n->nout; k++) W.map[n->out[k]] = W.b.g->nodes[j].out[k];
    }
    free(W.map), free(W.clone);
    return W.b.g;
}

/* ---- the pass ---- */

int64_t recompute_saved_bytes(const Graph *g, int layer) {
    char *sv = xcalloc((size_t)g->nvals, 1), *data = data_values(g);
    for (int i = 0; i < g->nnodes; i++)
        if (reads_back(&g->nodes[i]))
            for (int k = 0; k < g->nodes[i].nin; k++) sv[g->nodes[i].in[k]] = 1;
    int64_t total = 0;
    for (int v = 0; v < g->nvals; v++)
        if (sv[v] && data[v] && activation(g, v) && (layer == INT_MIN || def_of(g, v)->layer == layer)) total += ir_value_bytes(&g->vals[v]);
    free(sv), free(data);
    return total;
}

void pass_recompute(Module *m, const Options *o) {
    Recompute policy = o->recompute == RC_UNSET ? RC_GEMM_LAST : (Recompute)o->recompute;
    for (int s = 0; s < m->nstages; s++) {
        const Graph *g = m->stages[s];
        Rc R = {g, xcalloc((size_t)g->nvals, 1), xcalloc((size_t)g->nvals, 1), xcalloc((size_t)g->nvals, 1),
                xcalloc((size_t)g->nvals + 1, sizeof(int)), 0, data_values(g)};
        if (o->activation_budget > 0) {
            policy = within_budget(&R, o);
        } else if (policy == RC_FULL) { /* the layers whole; outside them the cheap chains */
            gemm_last(&R);
            for (int L = 0; L <= max_layer(g); L++) full_layer(&R, L);
        } else if (policy == RC_SELECTIVE) {
            selective(&R);
        } else if (policy == RC_GEMM_LAST) {
            gemm_last(&R);
        }
        m->stages[s] = rewrite(m, g, R.rc);
        free(R.rc), free(R.saved), free(R.seen), free(R.touched), free(R.data);
    }
    m->recompute = policy;
}
