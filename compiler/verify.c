/* verify.c — the IR checker run between passes (ir_verify, ir_verify_module).
 *
 * A pass that breaks an invariant should be caught at that pass, with the
 * model line of the node it broke, not three passes later as a wrong number.
 * So after every pass the driver (always in tests and debug builds) checks:
 *
 *   - SSA: every value is defined by exactly one node output, and vals[].def
 *     and vals[].defout point back at that output; every input is a valid id
 *     defined by an earlier node (nodes are in execution order);
 *   - arity against ir_ops (nin -1: at least one input) and attributes that
 *     are well formed (a key, no key twice, strings and lists present);
 *   - types: every output type equals what ir_infer derives from the inputs
 *     and attributes (for sources ir_infer checks the declared type);
 *   - metadata: a Loc on every node, a valid phase, stream and pos both -1
 *     (before schedule) or both >= 0;
 *   - sharding: a valid kind per mesh axis, a split dim below the rank;
 *   - after fuse (any node with a `kernel` attribute): each group is one
 *     contiguous run, its members are elementwise ops, consts used only in
 *     the group and broadcasts of values from outside it (or of its consts),
 *     and every member output has the group's iteration shape (a const that
 *     only feeds broadcasts excepted);
 *   - after schedule (any node with pos >= 0): pos is the node's index, the
 *     stream is 0..3, and a value used on another stream than its producer's
 *     is ordered by events: a `record` on the producer's stream after the
 *     producer and a `wait` on the user's stream before the use (directly or
 *     through a chain of such pairs); every wait follows its record, and an
 *     event is recorded once;
 *   - after memplan (any value with space >= 0): every value that needs a
 *     buffer (ir_live_build) has a space and a 64-byte aligned offset, views
 *     share their input's buffer, group internals have none, params are in
 *     the params space and states in opt, and no two buffers of a space share
 *     a byte while both are live (params, grads and opt buffers live all step);
 *     the one exception, a value written in place of a param or state, must
 *     be the input of an assign to that param/state and no read of the old
 *     value may happen after the write begins (ir_inplace_conflict: same
 *     stream by position, other streams by a recorded event the writer's
 *     stream waits for); any other value in the params or opt space is a
 *     param or state; and an input of an `add` whose output is a gradient
 *     on the grads space (accumulated in place), or of an F_INPLACE op
 *     (cross_entropy_bwd over the logits), may share the output's buffer
 *     when it is a computed value that nothing reads after the op begins
 *     (the same ir_inplace_conflict); such values are checked against the
 *     other buffers over their own lifetimes;
 *   - offload (offload.c): no node reads a value after its `offload` to the
 *     host (its device buffer is free from there; readers read the reload),
 *     and after memplan the host space holds exactly the offloads' outputs;
 *   - a module marked recompute=gemm-last has no GEMM and no attention
 *     (no EXPENSIVE op) in phase recompute;
 *   - a module with several pipeline stages (one graph per pp rank): the
 *     stage count is mesh pp; every send over group "pp" has exactly one
 *     recv of the same tag and type on the stage it names (peer), and back;
 *     and walking the stages' programs in their blocking order (a send never
 *     blocks, a recv waits for its send, a collective over pp for every
 *     stage) reaches every stage's end: no deadlock (check_pipeline).
 *
 * Checks run in an order that makes the later ones safe (ids are checked
 * before anything indexes with them, types before ir_infer reads them).
 * The first problem is reported as "file:line: node N (op): message", the
 * file:line being the offending node's Loc ("?:0" when it has none).
 */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "live.h"

typedef struct {
    const Graph *g;
    char *err;
    size_t errlen;
    const char *src;  /* a module read from text: its file, and ... */
    const int *lines; /* ... the line of each node of g (NULL: none) */
} Checker;

/* Report a problem at node i (i < 0: no node); always returns -1. */
static int bad(Checker *c, int i, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int bad(Checker *c, int i, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!c->err || !c->errlen) return -1;
    if (i < 0) {
        if (c->src) snprintf(c->err, c->errlen, "%s: %s", c->src, msg);
        else snprintf(c->err, c->errlen, "?:0: %s", msg);
        return -1;
    }
    const Node *n = &c->g->nodes[i];
    const char *op = n->op >= 0 && n->op < OP_COUNT ? ir_ops[n->op].name : "?";
    char src[300] = "";
    if (c->lines) snprintf(src, sizeof src, "%s:%d: ", c->src, c->lines[i]);
    snprintf(c->err, c->errlen, "%s%s:%d: node %d (%s): %s", src, n->loc.file ? n->loc.file : "?",
             n->loc.file ? n->loc.line : 0, i, op, msg);
    return -1;
}

static int valid_id(const Graph *g, int id) { return id >= 0 && id < g->nvals; }

static int check_type(Checker *c, int i, int id) {
    const Type *t = &c->g->vals[id].t;
    if (t->dt < 0 || t->dt >= DT_COUNT) return bad(c, i, "%%%d has a bad dtype %d", id, (int)t->dt);
    if (t->rank < 0 || t->rank > IR_MAXRANK) return bad(c, i, "%%%d has a bad rank %d", id, t->rank);
    for (int d = 0; d < t->rank; d++)
        if (t->dim[d] < 1) return bad(c, i, "%%%d has a bad dim %lld", id, (long long)t->dim[d]);
    return 0;
}

static int check_sharding(Checker *c, int i, int id) {
    static const char *const axes[IR_NAXES] = {"pp", "dp", "cp", "tp"};
    const Value *v = &c->g->vals[id];
    for (int a = 0; a < IR_NAXES; a++) {
        const AxisShard *s = &v->sh[a];
        if (s->kind != SH_REP && s->kind != SH_SPLIT && s->kind != SH_PARTIAL)
            return bad(c, i, "%%%d has a bad sharding kind on %s", id, axes[a]);
        if (s->kind == SH_SPLIT && (s->dim < 0 || s->dim >= v->t.rank))
            return bad(c, i, "%%%d is split on dim %d along %s but has rank %d", id, s->dim, axes[a], v->t.rank);
    }
    return 0;
}

/* Input k of node i: a valid id whose defining output is in an earlier node. */
static int check_input(Checker *c, int i, int k) {
    const Graph *g = c->g;
    int id = g->nodes[i].in[k];
    if (!valid_id(g, id)) return bad(c, i, "input %d is %%%d, not a value", k, id);
    const Value *v = &g->vals[id];
    if (v->def < 0 || v->def >= i) return bad(c, i, "input %%%d is used before its definition", id);
    const Node *d = &g->nodes[v->def];
    if (v->defout < 0 || v->defout >= d->nout || d->out[v->defout] != id)
        return bad(c, i, "input %%%d: vals[].def/defout do not point at its defining output", id);
    return 0;
}

/* Output k of node i: a valid id that points back here, with a sane type and sharding. */
static int check_output(Checker *c, int i, int k) {
    const Graph *g = c->g;
    int id = g->nodes[i].out[k];
    if (!valid_id(g, id)) return bad(c, i, "output %d is %%%d, not a value", k, id);
    const Value *v = &g->vals[id];
    if (v->id != id) return bad(c, i, "%%%d has id %d", id, v->id);
    if (v->def != i || v->defout != k)
        return bad(c, i, "%%%d is defined twice (or vals[].def/defout = %d/%d do not point here)", id, v->def, v->defout);
    return check_type(c, i, id) || check_sharding(c, i, id) ? -1 : 0;
}

static int check_attrs(Checker *c, int i) {
    const Node *n = &c->g->nodes[i];
    if (n->nattr < 0 || (n->nattr > 0 && !n->attr)) return bad(c, i, "bad attribute array");
    for (int k = 0; k < n->nattr; k++) {
        const Attr *a = &n->attr[k];
        if (!a->key) return bad(c, i, "attribute %d has no key", k);
        for (int j = 0; j < k; j++)
            if (strcmp(n->attr[j].key, a->key) == 0) return bad(c, i, "attribute %s given twice", a->key);
        if (a->kind == AT_STR && !a->s) return bad(c, i, "string attribute %s has no value", a->key);
        if (a->kind == AT_INTS && (a->n < 0 || (a->n > 0 && !a->v))) return bad(c, i, "list attribute %s is broken", a->key);
        if (a->kind < AT_INT || a->kind > AT_INTS) return bad(c, i, "attribute %s has a bad kind", a->key);
    }
    return 0;
}

static int check_meta(Checker *c, int i) {
    const Node *n = &c->g->nodes[i];
    if (!n->loc.file) return bad(c, i, "no source location");
    if (n->phase < 0 || n->phase >= PH_COUNT) return bad(c, i, "bad phase %d", (int)n->phase);
    if (!((n->stream == -1 && n->pos == -1) || (n->stream >= 0 && n->pos >= 0)))
        return bad(c, i, "stream %d and pos %d must both be -1 or both >= 0", n->stream, n->pos);
    return 0;
}

static int check_infer(Checker *c, int i) {
    const Graph *g = c->g;
    const Node *n = &g->nodes[i];
    Type out[8] = {{0}};
    char msg[256];
    if (ir_ops[n->op].flags & F_SOURCE) out[0] = g->vals[n->out[0]].t;
    if (ir_infer(g, n, out, msg, sizeof msg) < 0) return bad(c, i, "%s", msg);
    for (int k = 0; k < n->nout; k++) {
        const Type *t = &g->vals[n->out[k]].t;
        if (!ir_type_eq(t, &out[k])) {
            char a[128], b[128];
            return bad(c, i, "%%%d has type %s but the op gives %s", n->out[k], ir_type_str(t, a, sizeof a),
                       ir_type_str(&out[k], b, sizeof b));
        }
    }
    return 0;
}

static int check_node(Checker *c, int i) {
    const Node *n = &c->g->nodes[i];
    if (n->op < 0 || n->op >= OP_COUNT) return bad(c, i, "bad op %d", (int)n->op);
    const OpInfo *info = &ir_ops[n->op];
    if (info->nin >= 0 ? n->nin != info->nin : n->nin < 1)
        return bad(c, i, "%d inputs, the op takes %s%d", n->nin, info->nin < 0 ? "at least " : "", info->nin < 0 ? 1 : info->nin);
    if (n->nout != info->nout) return bad(c, i, "%d outputs, the op has %d", n->nout, info->nout);
    if (check_meta(c, i) || check_attrs(c, i)) return -1;
    for (int k = 0; k < n->nin; k++)
        if (check_input(c, i, k)) return -1;
    for (int k = 0; k < n->nout; k++)
        if (check_output(c, i, k)) return -1;
    return check_infer(c, i);
}

/* Values not reached through a node output: their def must be -1 or point at one. */
static int check_values(Checker *c) {
    const Graph *g = c->g;
    for (int id = 0; id < g->nvals; id++) {
        const Value *v = &g->vals[id];
        if (v->id != id) return bad(c, -1, "vals[%d] has id %d", id, v->id);
        if (v->def == -1) continue;
        if (v->def < 0 || v->def >= g->nnodes) return bad(c, -1, "%%%d: defining node %d does not exist", id, v->def);
        const Node *d = &g->nodes[v->def];
        if (v->defout < 0 || v->defout >= d->nout || d->out[v->defout] != id)
            return bad(c, v->def, "%%%d claims to be output %d of this node but is not", id, v->defout);
    }
    return 0;
}

/* ---- offload (offload.c) ---- */

/* After `offload` copies x to the host, x's device buffer is free: no node
 * after the offload may read x (its readers read the reload). */
static int check_offloaded(Checker *c) {
    const Graph *g = c->g;
    int *off = xcalloc((size_t)g->nvals + 1, sizeof(int)), rc = 0;
    for (int v = 0; v < g->nvals; v++) off[v] = -1;
    for (int i = 0; i < g->nnodes && !rc; i++) {
        const Node *n = &g->nodes[i];
        for (int k = 0; k < n->nin && !rc; k++) {
            int o = off[n->in[k]];
            if (o >= 0)
                rc = bad(c, i, "reads %%%d after its offload to the host (node %d, %s:%d): from there its device buffer is free, read the reload",
                         n->in[k], o, g->nodes[o].loc.file ? g->nodes[o].loc.file : "?", g->nodes[o].loc.line);
        }
        if (n->op == OP_offload) off[n->in[0]] = i;
    }
    free(off);
    return rc;
}

/* ---- fused groups ---- */

static int same_dims(const Type *a, const Type *b) {
    if (a->rank != b->rank) return 0;
    for (int d = 0; d < a->rank; d++)
        if (a->dim[d] != b->dim[d]) return 0;
    return 1;
}

static const char *loc_file(const Node *n) { return n->loc.file ? n->loc.file : "?"; }

typedef struct {
    int64_t k;
    int first, last, shape_node; /* shape_node: its first elementwise member */
} Run;

static int run_by_kernel(const void *a, const void *b) {
    const Run *x = a, *y = b;
    return x->k != y->k ? (x->k > y->k) - (x->k < y->k) : x->first - y->first;
}

/* Members of run r: their ops, broadcast sources, one iteration shape. */
static int check_run(Checker *c, Run *r) {
    const Graph *g = c->g;
    char a[96], b[96];
    r->shape_node = -1;
    for (int i = r->first; i <= r->last; i++) {
        const Node *n = &g->nodes[i];
        if (ir_ops[n->op].flags & F_ELEMENTWISE) {
            if (r->shape_node < 0) r->shape_node = i;
        } else if (n->op == OP_broadcast) {
            int d = g->vals[n->in[0]].def;
            if (d >= r->first && d <= r->last && g->nodes[d].op != OP_const)
                return bad(c, i, "broadcast in fused group %lld reads %%%d from inside the group (only values from outside or its consts)",
                           (long long)r->k, n->in[0]);
        } else if (n->op != OP_const) {
            return bad(c, i, "%s cannot be in fused group %lld (only elementwise ops, broadcasts and consts)", ir_ops[n->op].name,
                       (long long)r->k);
        }
    }
    if (r->shape_node < 0) return bad(c, r->first, "fused group %lld has no elementwise op", (long long)r->k);
    const Type *s = &g->vals[g->nodes[r->shape_node].out[0]].t;
    for (int i = r->first; i <= r->last; i++) {
        const Node *n = &g->nodes[i];
        const Type *t = &g->vals[n->out[0]].t;
        if (n->op != OP_const && !same_dims(t, s))
            return bad(c, i, "%%%d is %s but fused group %lld iterates over %s", n->out[0], ir_type_str(t, a, sizeof a),
                       (long long)r->k, ir_type_str(s, b, sizeof b));
    }
    return 0;
}

/* A const member is read only inside its group, and only by broadcasts
 * unless it has the iteration shape. */
static int check_group_consts(Checker *c, const int64_t *kern, const int *runof, const Run *runs) {
    const Graph *g = c->g;
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        for (int k = 0; k < n->nin; k++) {
            int v = n->in[k], d = g->vals[v].def;
            if (d < 0 || kern[d] < 0 || g->nodes[d].op != OP_const) continue;
            const Run *r = &runs[runof[d]];
            if (kern[i] != kern[d])
                return bad(c, d, "const %%%d of fused group %lld is also read outside the group (node %d, %s:%d)", v, (long long)r->k, i,
                           loc_file(n), n->loc.line);
            if (n->op != OP_broadcast && !same_dims(&g->vals[v].t, &g->vals[g->nodes[r->shape_node].out[0]].t))
                return bad(c, d, "const %%%d of fused group %lld has not the group's shape and feeds node %d (%s)", v, (long long)r->k, i,
                           ir_ops[n->op].name);
        }
    }
    return 0;
}

static int check_groups(Checker *c) {
    const Graph *g = c->g;
    int n = g->nnodes, nruns = 0, rc = 0;
    int64_t *kern = xcalloc((size_t)n, sizeof(int64_t));
    for (int i = 0; i < n; i++) {
        const Attr *a = ir_attr(&g->nodes[i], "kernel");
        kern[i] = a ? a->i : -1;
        if (a && (a->kind != AT_INT || a->i < 0)) {
            free(kern);
            return bad(c, i, "kernel must be an int >= 0 (the node's fused group)");
        }
        if (kern[i] >= 0 && (i == 0 || kern[i - 1] != kern[i])) nruns++;
    }
    if (!nruns) {
        free(kern);
        return 0;
    }
    Run *runs = xcalloc((size_t)nruns, sizeof(Run)), *sorted = xcalloc((size_t)nruns, sizeof(Run));
    int *runof = xcalloc((size_t)n, sizeof(int)), nr = 0;
    for (int i = 0; i < n; i++) {
        if (kern[i] < 0) continue;
        if (i == 0 || kern[i - 1] != kern[i]) runs[nr++] = (Run){kern[i], i, i, -1};
        runs[nr - 1].last = i;
        runof[i] = nr - 1;
    }
    memcpy(sorted, runs, sizeof(Run) * (size_t)nruns);
    qsort(sorted, (size_t)nruns, sizeof(Run), run_by_kernel);
    for (int k = 1; k < nruns && !rc; k++)
        if (sorted[k].k == sorted[k - 1].k)
            rc = bad(c, sorted[k].first, "fused group %lld is not contiguous (it also has nodes %d..%d)", (long long)sorted[k].k,
                     sorted[k - 1].first, sorted[k - 1].last);
    for (int k = 0; k < nruns && !rc; k++) rc = check_run(c, &runs[k]);
    if (!rc) rc = check_group_consts(c, kern, runof, runs);
    free(kern), free(runs), free(sorted), free(runof);
    return rc;
}

/* ---- schedule and events ---- */

typedef struct {
    int64_t event;
    int node;
} Rec;

static int rec_cmp(const void *a, const void *b) {
    const Rec *x = a, *y = b;
    return x->event != y->event ? (x->event > y->event) - (x->event < y->event) : x->node - y->node;
}

static int find_rec(const Rec *recs, int nrec, int64_t e) {
    int lo = 0, hi = nrec - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (recs[mid].event == e) return mid;
        if (recs[mid].event < e) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

/* Vector clocks in program order: known[s][t] is the last position of stream
 * t that stream s has seen complete (its own nodes, and through waits the
 * snapshots the matching records took). */
static int check_events(Checker *c) {
    const Graph *g = c->g;
    int n = g->nnodes, nrec = 0, rc = 0;
    Rec *recs = xcalloc((size_t)n, sizeof(Rec));
    for (int i = 0; i < n; i++)
        if (g->nodes[i].op == OP_record) recs[nrec++] = (Rec){ir_attr_i(&g->nodes[i], "event", -1), i};
    qsort(recs, (size_t)nrec, sizeof(Rec), rec_cmp);
    for (int k = 1; k < nrec && !rc; k++)
        if (recs[k].event == recs[k - 1].event)
            rc = bad(c, recs[k].node, "event %lld is recorded twice (also at node %d)", (long long)recs[k].event, recs[k - 1].node);
    int (*snap)[IR_NSTREAMS] = xcalloc((size_t)(nrec ? nrec : 1), sizeof *snap);
    int known[IR_NSTREAMS][IR_NSTREAMS];
    for (int s = 0; s < IR_NSTREAMS; s++)
        for (int t = 0; t < IR_NSTREAMS; t++) known[s][t] = -1;
    for (int i = 0; i < n && !rc; i++) {
        const Node *nd = &g->nodes[i];
        int s = nd->stream;
        for (int k = 0; k < nd->nin && !rc; k++) {
            int p = g->vals[nd->in[k]].def, sp = g->nodes[p].stream;
            if (sp != s && known[s][sp] < p)
                rc = bad(c, i, "%%%d comes from stream %d (node %d, %s:%d) but stream %d does not wait for an event recorded after it",
                         nd->in[k], sp, p, loc_file(&g->nodes[p]), g->nodes[p].loc.line, s);
        }
        known[s][s] = i;
        if (rc || (nd->op != OP_record && nd->op != OP_wait)) continue;
        int64_t e = ir_attr_i(nd, "event", -1);
        int r = find_rec(recs, nrec, e);
        while (r > 0 && recs[r - 1].event == e) r--; /* the first record of e */
        if (nd->op == OP_record) {
            memcpy(snap[r], known[s], sizeof snap[r]);
        } else if (r < 0) {
            rc = bad(c, i, "waits for event %lld, which is never recorded", (long long)e);
        } else if (recs[r].node > i) {
            rc = bad(c, i, "waits for event %lld before its record (node %d)", (long long)e, recs[r].node);
        } else {
            for (int t = 0; t < IR_NSTREAMS; t++)
                if (snap[r][t] > known[s][t]) known[s][t] = snap[r][t];
        }
    }
    free(recs);
    free(snap);
    return rc;
}

static int check_schedule(Checker *c) {
    const Graph *g = c->g;
    int scheduled = 0;
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i].pos >= 0) scheduled = 1;
    if (!scheduled) return 0;
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        if (n->pos != i) return bad(c, i, "pos %d, but after schedule a node's pos is its index %d", n->pos, i);
        if (n->stream < 0 || n->stream >= IR_NSTREAMS) return bad(c, i, "stream %d is not one of 0..%d", n->stream, IR_NSTREAMS - 1);
    }
    return check_events(c);
}

/* ---- memory plan ---- */

typedef struct {
    int v, start, end, space;
    int64_t off, bytes;
} Span;

static int span_cmp(const void *a, const void *b) {
    const Span *x = a, *y = b;
    if (x->space != y->space) return x->space - y->space;
    if (x->off != y->off) return x->off < y->off ? -1 : 1;
    return x->v - y->v;
}

/* Each value's place on its own: planned, aligned, shared by views, none for group internals. */
static int check_places(Checker *c, const MemLive *L) {
    const Graph *g = c->g;
    for (int v = 0; v < g->nvals; v++) {
        const Value *x = &g->vals[v];
        if (x->def < 0) continue;
        int r = L->root[v], d = x->def;
        const Node *n = &g->nodes[d];
        if (r < 0) {
            if (x->space != -1 || x->offset != -1)
                return bad(c, d, "%%%d is internal to its fused group but has a buffer (%s+%lld)", v, ir_space_name(x->space),
                           (long long)x->offset);
            continue;
        }
        if (x->space < 0 || x->space >= SPACE_COUNT) return bad(c, d, "%%%d has no buffer (space %d) after memplan", v, x->space);
        if (x->offset < 0 || x->offset % IR_MEM_ALIGN || x->offset > INT64_MAX - ir_value_bytes(x))
            return bad(c, d, "%%%d has a bad offset %lld (64-byte aligned, >= 0)", v, (long long)x->offset);
        if (r != v && (x->space != g->vals[r].space || x->offset != g->vals[r].offset + L->voff[v]))
            return bad(c, d, "view %%%d is at %s+%lld but must share the buffer of %%%d (%s+%lld, %lld bytes in)", v, ir_space_name(x->space),
                       (long long)x->offset, r, ir_space_name(g->vals[r].space), (long long)g->vals[r].offset, (long long)L->voff[v]);
        if (r != v && (x->offset < g->vals[r].offset || x->offset + ir_value_bytes(x) > g->vals[r].offset + ir_value_bytes(&g->vals[r])))
            return bad(c, d, "view %%%d (%s+%lld, %lld bytes) reaches outside the buffer of %%%d (%s+%lld, %lld bytes)", v,
                       ir_space_name(x->space), (long long)x->offset, (long long)ir_value_bytes(x), r, ir_space_name(g->vals[r].space),
                       (long long)g->vals[r].offset, (long long)ir_value_bytes(&g->vals[r]));
        if ((n->op == OP_param && x->space != SPACE_PARAMS) || (n->op == OP_state && x->space != SPACE_OPT))
            return bad(c, d, "%%%d is a %s but lives in the %s space", v, ir_ops[n->op].name, ir_space_name(x->space));
        if ((n->op == OP_offload) != (x->space == SPACE_HOST))
            return bad(c, d, "%%%d lives in the %s space, but the host space holds exactly the offloads' outputs", v, ir_space_name(x->space));
    }
    return 0;
}

/* Values written in place of a param or state (ir_inplace_conflict): each
 * is the input of an assign to the param/state whose buffer it has, and no
 * read of the old value can see it; any other value in the params or opt
 * space is a param or state itself.  Marks them in inplace[]. */
static int check_inplace(Checker *c, const MemLive *L, char *inplace) {
    const Graph *g = c->g;
    for (int i = 0; i < g->nnodes; i++) {
        if (g->nodes[i].op != OP_assign) continue;
        int nw = g->nodes[i].in[0], old = ir_assign_target(g, i);
        const Value *x = &g->vals[nw];
        if (old < 0 || old == nw || x->space != g->vals[old].space || x->offset != g->vals[old].offset) continue;
        const char *why;
        int r = ir_inplace_conflict(g, L, old, nw, &why);
        if (r >= 0) {
            const Node *rn = &g->nodes[r];
            return bad(c, i, "%%%d is written in place of %s (%%%d, %s+%lld), but node %d (%s, %s:%d) %s", nw,
                       ir_attr_s(&g->nodes[i], "name", "?"), old, ir_space_name(x->space), (long long)x->offset, r,
                       ir_ops[rn->op].name, loc_file(rn), rn->loc.line, why);
        }
        inplace[nw] = 1;
    }
    for (int v = 0; v < g->nvals; v++) {
        const Value *x = &g->vals[v];
        if (x->def < 0 || L->root[v] != v || inplace[v] || (x->space != SPACE_PARAMS && x->space != SPACE_OPT)) continue;
        if (!(ir_ops[g->nodes[x->def].op].flags & F_STATE))
            return bad(c, x->def, "%%%d is in the %s space but is no param or state, nor written in place of one by an assign", v,
                       ir_space_name(x->space));
    }
    return 0;
}

/* Outputs written over an input (memplan's place_accumulate and
 * place_over): an input of an `add` whose output is a gradient on the grads
 * space, or the input of an F_INPLACE op (cross_entropy_bwd's logits), may
 * share the output's buffer when it is a computed value and no read of it
 * can see the output (ir_inplace_conflict).  Records into[input] = the
 * output. */
static int check_written_over(Checker *c, const MemLive *L, int *into) {
    const Graph *g = c->g;
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        int nw = n->nout ? n->out[0] : -1, acc = n->op == OP_add;
        const Value *x = nw >= 0 ? &g->vals[nw] : NULL;
        if (!x || L->root[nw] != nw || x->space < 0 || !((acc && x->space == SPACE_GRADS) || (ir_ops[n->op].flags & F_INPLACE))) continue;
        for (int k = 0; k < n->nin; k++) {
            int r = L->root[n->in[k]];
            if (r < 0 || r == nw || g->vals[r].space != x->space || g->vals[r].offset != x->offset) continue;
            const char *why = "is no computed value";
            int bad_at = (ir_ops[g->nodes[g->vals[r].def].op].flags & F_SOURCE) ? g->vals[r].def : ir_inplace_conflict(g, L, r, nw, &why);
            if (bad_at >= 0) {
                const Node *rn = &g->nodes[bad_at];
                return bad(c, i, "%%%d is %s %%%d (%s+%lld), but node %d (%s, %s:%d) %s", r,
                           acc ? "accumulated in place into the gradient" : "overwritten in place by", nw, ir_space_name(x->space),
                           (long long)x->offset, bad_at, ir_ops[rn->op].name, loc_file(rn), rn->loc.line, why);
            }
            into[r] = nw;
        }
    }
    return 0;
}

/* a and b are one chain of outputs written over inputs (into[]). */
static int accumulated(const Graph *g, const int *into, int a, int b) {
    for (int x = a, k = 0; into[x] >= 0 && k < g->nvals; k++)
        if ((x = into[x]) == b) return 1;
    for (int x = b, k = 0; into[x] >= 0 && k < g->nvals; k++)
        if ((x = into[x]) == a) return 1;
    return 0;
}

/* No two buffers of one space share a byte while both are live; a value
 * written in place of a param or state shares its buffer by right, and so
 * do the values of one chain of outputs written over inputs (each is done
 * before the next is written; other values are checked against them over
 * their own lifetimes only). */
static int check_overlaps(Checker *c, const MemLive *L, const char *inplace, const int *into) {
    const Graph *g = c->g;
    Span *sp = xcalloc((size_t)g->nvals, sizeof(Span));
    int ns = 0, rc = 0;
    for (int v = 0; v < g->nvals; v++) {
        const Value *x = &g->vals[v];
        if (x->def < 0 || L->root[v] != v || inplace[v]) continue;
        int act = x->space == SPACE_ACT || x->space == SPACE_HOST || into[v] >= 0; /* host: packed by liveness too (live.c, host_read_end) */
        sp[ns++] = (Span){v, act ? L->start[v] : 0, act ? L->end[v] : g->nnodes, x->space, x->offset, ir_value_bytes(x)};
    }
    qsort(sp, (size_t)ns, sizeof(Span), span_cmp);
    for (int i = 0; i < ns && !rc; i++)
        for (int j = i + 1; j < ns && !rc && sp[j].space == sp[i].space && sp[j].off < sp[i].off + sp[i].bytes; j++) {
            const Span *a = &sp[i], *b = &sp[j];
            if (a->end < b->start || b->end < a->start || accumulated(g, into, a->v, b->v)) continue;
            int db = g->vals[b->v].def;
            int64_t hi = a->off + a->bytes < b->off + b->bytes ? a->off + a->bytes : b->off + b->bytes;
            rc = bad(c, g->vals[a->v].def,
                     "%%%d (live %d..%d) and %%%d (node %d %s, %s:%d, live %d..%d) share bytes [%lld, %lld) of the %s space while both are live",
                     a->v, a->start, a->end, b->v, db, ir_ops[g->nodes[db].op].name, loc_file(&g->nodes[db]), g->nodes[db].loc.line,
                     b->start, b->end, (long long)b->off, (long long)hi, ir_space_name(a->space));
        }
    free(sp);
    return rc;
}

/* Aliases (live.h, views by layout): a value whose buffer is part of
 * another's (a slice view, a concat's member) overlaps only its owner.
 * The members of one buffer are each written by their own producer, so no
 * two of them may share a byte (a concat reads them all at once: their
 * lives always meet); views that are only read (slices, reshapes) may
 * overlap anything in their owner. */
static int check_members(Checker *c, const MemLive *L) {
    const Graph *g = c->g;
    Span *sp = xcalloc((size_t)g->nvals + 1, sizeof(Span));
    int ns = 0, rc = 0;
    for (int v = 0; v < g->nvals; v++)
        if (L->member[v] && L->root[v] >= 0 && g->vals[v].space >= 0)
            sp[ns++] = (Span){v, L->root[v], 0, g->vals[v].space, g->vals[v].offset, ir_value_bytes(&g->vals[v])};
    qsort(sp, (size_t)ns, sizeof(Span), span_cmp); /* by space, then offset: members of one owner are adjacent in it */
    for (int i = 0; i + 1 < ns && !rc; i++)
        for (int j = i + 1; j < ns && !rc && sp[j].space == sp[i].space && sp[j].off < sp[i].off + sp[i].bytes; j++) {
            if (sp[j].start != sp[i].start) continue; /* other owners: check_overlaps compares the owners */
            int d = g->vals[sp[j].v].def;
            rc = bad(c, d, "%%%d and %%%d are both written inside the buffer of %%%d (%s+%lld) and share bytes [%lld, %lld): "
                     "a concat's members must not overlap",
                     sp[i].v, sp[j].v, sp[i].start, ir_space_name(sp[i].space), (long long)g->vals[sp[i].start].offset,
                     (long long)sp[j].off, (long long)(sp[i].off + sp[i].bytes < sp[j].off + sp[j].bytes ? sp[i].off + sp[i].bytes : sp[j].off + sp[j].bytes));
        }
    free(sp);
    return rc;
}

static int check_plan(Checker *c) {
    const Graph *g = c->g;
    int planned = 0;
    for (int v = 0; v < g->nvals; v++)
        if (g->vals[v].def >= 0 && g->vals[v].space >= 0) planned = 1;
    if (!planned) return 0;
    MemLive L;
    ir_live_build(g, &L);
    char *inplace = xcalloc((size_t)g->nvals + 1, 1);
    int *into = xcalloc((size_t)g->nvals + 1, sizeof(int));
    for (int v = 0; v < g->nvals; v++) into[v] = -1;
    int rc = check_places(c, &L) || check_members(c, &L) || check_inplace(c, &L, inplace) || check_written_over(c, &L, into) ||
                     check_overlaps(c, &L, inplace, into)
                 ? -1
                 : 0;
    free(inplace), free(into);
    ir_live_free(&L);
    return rc;
}

/* A posted receive (recv_start) and its wait (recv_done) are one transfer:
 * the done reads a start of the same group, peer and tag, and the start's
 * buffer, which the bytes may reach at any time until the done, is read by
 * that done alone (docs/ir.md). */
static int check_recv_pairs(Checker *c) {
    const Graph *g = c->g;
    int *reader = xcalloc((size_t)g->nvals + 1, sizeof(int)), rc = 0;
    for (int i = 0; i < g->nnodes && !rc; i++) {
        const Node *n = &g->nodes[i];
        for (int k = 0; k < n->nin && !rc; k++) {
            int v = n->in[k], d = g->vals[v].def;
            if (d < 0 || g->nodes[d].op != OP_recv_start) continue;
            const Node *s = &g->nodes[d];
            if (n->op != OP_recv_done)
                rc = bad(c, i, "%s reads %%%d, the buffer of a posted receive (node %d): only its recv_done may", ir_ops[n->op].name, v, d);
            else if (reader[v]++)
                rc = bad(c, i, "recv_done waits for the receive of node %d that another recv_done completed", d);
            else if (ir_attr_i(n, "tag", -1) != ir_attr_i(s, "tag", -2) || ir_attr_i(n, "peer", 0) != ir_attr_i(s, "peer", 0) ||
                     strcmp(ir_attr_s(n, "group", ""), ir_attr_s(s, "group", "")) != 0)
                rc = bad(c, i, "recv_done {group, peer, tag} differ from its recv_start's (node %d)", d);
        }
        if (!rc && n->op == OP_recv_done && (g->vals[n->in[0]].def < 0 || g->nodes[g->vals[n->in[0]].def].op != OP_recv_start))
            rc = bad(c, i, "recv_done waits for %%%d, which no recv_start posted", n->in[0]);
    }
    for (int i = 0; i < g->nnodes && !rc; i++)
        if (g->nodes[i].op == OP_recv_start && !reader[g->nodes[i].out[0]])
            rc = bad(c, i, "a posted receive (tag %lld) that no recv_done completes", (long long)ir_attr_i(&g->nodes[i], "tag", 0));
    free(reader);
    return rc;
}

static int verify_graph(const Graph *g, const char *src, const int *lines, char *err, size_t errlen) {
    Checker c = {g, err, errlen, src, lines};
    if (err && errlen) err[0] = 0;
    if (g->nnodes < 0 || g->nvals < 0) return bad(&c, -1, "negative node or value count");
    for (int i = 0; i < g->nnodes; i++)
        if (check_node(&c, i)) return -1;
    if (check_values(&c)) return -1;
    return check_recv_pairs(&c) || check_offloaded(&c) || check_groups(&c) || check_schedule(&c) || check_plan(&c) ? -1 : 0;
}

int ir_verify(const Graph *g, char *err, size_t errlen) { return verify_graph(g, NULL, NULL, err, errlen); }

/* ---- pipeline stages: matched transfers, no deadlock ---- */

static int over_pp(const Node *n) {
    return (ir_ops[n->op].flags & F_COMM) && strcmp(ir_attr_s(n, "group", ""), "pp") == 0;
}

/* The receiving end of a transfer: where it blocks until the bytes are
 * there (a recv, or the done of a posted one; a recv_start never blocks). */
static int blocking_recv(const Node *n) { return n->op == OP_recv || n->op == OP_recv_done; }

/* Each stage's transfers over pp (sends and blocking receives) sorted by
 * (tag, node): transfer_peer looks a tag up instead of reading the peer's
 * whole program for every transfer (quadratic in a long pipeline). */
typedef struct {
    int64_t tag;
    int j;
} TagAt;

static int by_tag(const void *a, const void *b) {
    const TagAt *x = a, *y = b;
    if (x->tag != y->tag) return x->tag < y->tag ? -1 : 1;
    return x->j - y->j;
}

static TagAt **index_transfers(const Module *m, int **count) {
    TagAt **ix = calloc((size_t)m->nstages, sizeof(TagAt *));
    *count = calloc((size_t)m->nstages, sizeof(int));
    if (!ix || !*count) ICE("out of memory");
    for (int s = 0; s < m->nstages; s++) {
        const Graph *h = m->stages[s];
        ix[s] = malloc(sizeof(TagAt) * (size_t)(h->nnodes + 1));
        if (!ix[s]) ICE("out of memory");
        for (int j = 0; j < h->nnodes; j++) {
            const Node *q = &h->nodes[j];
            if ((q->op == OP_send || blocking_recv(q)) && over_pp(q)) ix[s][(*count)[s]++] = (TagAt){ir_attr_i(q, "tag", -1), j};
        }
        qsort(ix[s], (size_t)(*count)[s], sizeof(TagAt), by_tag);
    }
    return ix;
}

/* The node of stage s that is the other end of transfer node i of stage t
 * (its peer's recv for a send, send for a recv), -1 if none; *count: how many. */
static int transfer_peer(const Module *m, TagAt *const *ix, const int *nix, int t, int i, int *count) {
    const Node *n = &m->stages[t]->nodes[i];
    int p = m->nstages, s = (int)(((t + ir_attr_i(n, "peer", 0)) % p + p) % p), found = -1;
    *count = 0;
    const Graph *h = m->stages[s];
    int64_t tag = ir_attr_i(n, "tag", -2);
    int lo = 0, hi = nix[s]; /* the first entry of the tag */
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (ix[s][mid].tag < tag) lo = mid + 1;
        else hi = mid;
    }
    for (int e = lo; e < nix[s] && ix[s][e].tag == tag; e++) {
        int j = ix[s][e].j;
        const Node *q = &h->nodes[j];
        if (n->op == OP_send ? !blocking_recv(q) : q->op != OP_send) continue;
        if ((((s + ir_attr_i(q, "peer", 0)) % p + p) % p) != t) continue;
        if (found < 0) found = j;
        (*count)++;
    }
    return found;
}

static int check_transfers(Checker *c, const Module *m, TagAt *const *ix, const int *nix, int t) {
    const Graph *g = m->stages[t];
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        if ((n->op != OP_send && !blocking_recv(n)) || !over_pp(n)) continue;
        int count, j = transfer_peer(m, ix, nix, t, i, &count), s = (int)(((t + ir_attr_i(n, "peer", 0)) % m->nstages + m->nstages) % m->nstages);
        long long tag = (long long)ir_attr_i(n, "tag", 0);
        if (tag < 0 || tag > 1 << 30) return bad(c, i, "stage %d's %s has tag %lld (0..2^30)", t, ir_ops[n->op].name, tag);
        if (count != 1)
            return bad(c, i, "stage %d's %s with tag %lld has %d matching %s on stage %d (needs exactly 1)", t, ir_ops[n->op].name, tag,
                       count, n->op == OP_send ? "recv" : "send", s);
        const Node *q = &m->stages[s]->nodes[j];
        const Type *a = &g->vals[n->op == OP_send ? n->in[0] : n->out[0]].t;
        const Type *b = &m->stages[s]->vals[q->op == OP_send ? q->in[0] : q->out[0]].t;
        if (!ir_type_eq(a, b)) {
            char ta[64], tb[64];
            return bad(c, i, "stage %d's %s with tag %lld is %s, stage %d's is %s", t, ir_ops[n->op].name, tag, ir_type_str(a, ta, sizeof ta), s,
                       ir_type_str(b, tb, sizeof tb));
        }
    }
    return 0;
}

/* Walk every stage in program order: sends mark their tag sent, a recv
 * (or a posted receive's recv_done) waits until its tag is, a recv_start
 * goes on (posting does not block), a collective over pp waits until every
 * stage is at one.  A stage that cannot move while another is not done: deadlock,
 * reported at the first waiting stage with what each stage waits for. */
static int check_deadlock(Checker *c, const Module *m) {
    int p = m->nstages, *pc = calloc((size_t)(p > 0 ? p : 1), sizeof(int)), maxtag = 0;
    for (int s = 0; s < p; s++)
        for (int i = 0; i < m->stages[s]->nnodes; i++)
            if (over_pp(&m->stages[s]->nodes[i]) && ir_attr_i(&m->stages[s]->nodes[i], "tag", 0) > maxtag)
                maxtag = (int)ir_attr_i(&m->stages[s]->nodes[i], "tag", 0);
    char *sent = calloc((size_t)maxtag + 1, 1);
    if (!pc || !sent) ICE("out of memory");
    for (int moved = 1; moved;) {
        moved = 0;
        int at_coll = 0, done = 0;
        for (int s = 0; s < p; s++) {
            const Graph *g = m->stages[s];
            for (; pc[s] < g->nnodes; pc[s]++, moved = 1) {
                const Node *n = &g->nodes[pc[s]];
                if (!over_pp(n)) continue;
                int64_t tag = ir_attr_i(n, "tag", 0);
                if (n->op == OP_send) sent[tag] = 1;
                else if (blocking_recv(n) && !sent[tag]) break;
                else if (!blocking_recv(n) && n->op != OP_recv_start) break; /* a collective: all stages meet */
            }
            done += pc[s] == g->nnodes;
            at_coll += pc[s] < g->nnodes && !blocking_recv(&g->nodes[pc[s]]);
        }
        if (at_coll == p) {
            for (int s = 0; s < p; s++) pc[s]++;
            moved = 1;
        }
        if (done == p) {
            free(pc), free(sent);
            return 0;
        }
    }
    char msg[400];
    size_t k = 0;
    int first = -1;
    for (int s = 0; s < p && k < sizeof msg; s++) {
        const Graph *g = m->stages[s];
        if (pc[s] >= g->nnodes) continue;
        const Node *n = &g->nodes[pc[s]];
        if (first < 0) first = s;
        k += (size_t)snprintf(msg + k, sizeof msg - k, "%sstage %d waits at %s", k ? ", " : "", s, ir_ops[n->op].name);
        if (k < sizeof msg && blocking_recv(n))
            k += (size_t)snprintf(msg + k, sizeof msg - k, " tag %lld mb %d (node %d)", (long long)ir_attr_i(n, "tag", 0), n->mb, pc[s]);
    }
    c->g = m->stages[first];
    int at = pc[first];
    free(pc), free(sent);
    return bad(c, at, "pipeline deadlock: %s", msg);
}

static int check_pipeline(Checker *c, const Module *m, int *const *lines) {
    if (m->nstages == 1) return 0;
    if (m->nstages != m->mesh[0]) return bad(c, -1, "module %s: %d stages for mesh pp=%d", m->name ? m->name : "?", m->nstages, m->mesh[0]);
    int *nix, bad_at = 0;
    TagAt **ix = index_transfers(m, &nix);
    for (int s = 0; s < m->nstages && !bad_at; s++) {
        c->g = m->stages[s], c->lines = lines ? lines[s] : NULL;
        bad_at = check_transfers(c, m, ix, nix, s) != 0;
    }
    for (int s = 0; s < m->nstages; s++) free(ix[s]);
    free(ix), free(nix);
    if (bad_at) return -1;
    c->lines = NULL;
    return check_deadlock(c, m);
}

static int verify_module(const Module *m, const char *src, int *const *lines, char *err, size_t errlen) {
    static const char *const axes[IR_NAXES] = {"pp", "dp", "cp", "tp"};
    Checker c = {NULL, err, errlen, src, NULL};
    if (err && errlen) err[0] = 0;
    for (int a = 0; a < IR_NAXES; a++)
        if (m->mesh[a] < 1) return bad(&c, -1, "module %s: mesh %s=%d must be >= 1", m->name ? m->name : "?", axes[a], m->mesh[a]);
    if (m->nstages < 1 || !m->stages) return bad(&c, -1, "module %s has no stages", m->name ? m->name : "?");
    for (int s = 0; s < m->nstages; s++) {
        const Graph *g = m->stages[s];
        if (!g) return bad(&c, -1, "stage %d is missing", s);
        if (g->m != m) return bad(&c, -1, "stage %d belongs to another module", s);
        if (verify_graph(g, src, lines ? lines[s] : NULL, err, errlen)) return -1;
        c.g = g;
        c.lines = lines ? lines[s] : NULL;
        for (int i = 0; m->recompute == RC_GEMM_LAST && i < g->nnodes; i++) /* gemm-last's promise */
            if (g->nodes[i].phase == PH_RECOMPUTE && (ir_ops[g->nodes[i].op].flags & (F_GEMM | F_EXPENSIVE)))
                return bad(&c, i, "recompute=gemm-last, yet this expensive op (a GEMM or attention) is in phase recompute");
    }
    return check_pipeline(&c, m, lines);
}

int ir_verify_module(const Module *m, char *err, size_t errlen) { return verify_module(m, NULL, NULL, err, errlen); }

int ir_verify_module_src(const Module *m, const char *src, int *const *lines, char *err, size_t errlen) {
    return verify_module(m, src, lines, err, errlen);
}
