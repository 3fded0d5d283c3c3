/* fuse.c — group elementwise chains into generated kernels.
 *
 * A fused group is a contiguous run of nodes carrying the int attribute
 * kernel=K.  Its members are elementwise ops (F_ELEMENTWISE: arithmetic,
 * activations and their backward helpers, cast), `broadcast`s whose source
 * lies outside the group (or is a const member) and `const`s used only inside
 * the group.  Every member output has the group's iteration shape, except a
 * const that only feeds broadcasts.  The emitter turns a group into one loop
 * over that shape: it reads the group's inputs (values defined outside and
 * used by members; broadcast sources with broadcast indexing), computes every
 * member in registers, and stores only the group's outputs (member values
 * used outside the group).  Values internal to a group get no buffer
 * (memplan), which is the point: `x + b` then `gelu` reads x once and writes
 * once, and the bias is never expanded in memory.
 *
 * Everything else — GEMMs, attention, norms, reductions, shape ops,
 * embedding, cross-entropy, the optimizer — stays a node of its own and a
 * library kernel.  Every elementwise op ends up in some group (groups of one
 * are fine), so the emitter never needs a standalone elementwise kernel.
 *
 * The algorithm is greedy and keeps the program order of everything it does
 * not fuse.  Walking the nodes in order:
 *
 *   - const and broadcast nodes are "lazy": they are not placed where they
 *     stand but just before their first consumer, or absorbed into its group;
 *   - an elementwise node opens a group with its output shape as the
 *     iteration space; the next WINDOW nodes are scanned and an elementwise
 *     node of the same shape and phase joins (moving up to the group) when it
 *     is related to the group (reads a member's output, or a value a member
 *     reads) and every input is ready: placed before the group, a member, a
 *     lazy node the group can absorb, or a node the group can hoist above
 *     itself (a short chain of producers, GEMMs included, that no member
 *     feeds: `add(add(a, b), matmul(..))` becomes one kernel after the
 *     matmul).  Moving a node up to a point where all its inputs exist keeps
 *     def-before-use, and nodes it skips over cannot use its output (they
 *     precede it);
 *   - any other node is placed where it stands, its lazy inputs just before.
 *
 * When a group closes, a const member that something outside the group also
 * reads moves out, before the group.  Groups never cross phases (fwd, bwd,
 * recompute, opt), so recompute can treat a phase's nodes as a unit.  The
 * pass is deterministic, keeps value ids, and drops any kernel attributes
 * from an earlier run first.
 */
#include <stdlib.h>
#include <string.h>

#include "live.h"
#include "passes.h"

#define WINDOW 64     /* how far ahead a group looks for members */
#define HOIST_DEPTH 6 /* how long a chain of producers a group may hoist above itself */
#define BUDGET 256    /* nodes visited per readiness question */

typedef struct {
    Graph *g;
    int n;
    int *order, norder;  /* the new node order */
    char *placed, *lazy; /* per node */
    int *member;         /* per node: stamp of the group it joined, 0 if none */
    int *readmark;       /* per value: stamp of a group whose elementwise member reads it */
    int *kernel;         /* per node: K, -1 */
    int *grp, ngrp;      /* members of the open group, in order */
    int group_start;     /* norder when the open group opened */
    int stamp, nkernels, budget;
    Type shape; /* iteration space of the open group */
    Phase phase;
    int *ustart, *users; /* users of value v: users[ustart[v] .. ustart[v+1]) */
} Fuser;

static const Node *node(const Fuser *f, int i) { return &f->g->nodes[i]; }
static int def(const Fuser *f, int v) { return f->g->vals[v].def; }
static const Type *out_type(const Fuser *f, int i) { return &f->g->vals[node(f, i)->out[0]].t; }
static int is_member(const Fuser *f, int i) { return f->member[i] == f->stamp; }

static int same_dims(const Type *a, const Type *b) {
    if (a->rank != b->rank) return 0;
    for (int d = 0; d < a->rank; d++)
        if (a->dim[d] != b->dim[d]) return 0;
    return 1;
}

static int elementwise(const Node *n) { return (ir_ops[n->op].flags & F_ELEMENTWISE) != 0; }

/* ---- readiness: can the open group (or a node before it) read a value? ---- */

/* Unplaced node d placed before the open group: a lazy node, or (hoisting) a
 * node of the window that nothing in the group feeds, at most HOIST_DEPTH
 * deep; never an elementwise op (it belongs in a group), a collective, a sink
 * or an event (their order is the program's).  Its inputs must not be
 * members (a const member is fine: one that an outside node reads moves to
 * the front when the group closes).  f->budget bounds the search. */
static int can_place_before(Fuser *f, int d, int depth) {
    const Node *nd = node(f, d);
    if (--f->budget < 0) return 0;
    if (!f->lazy[d]) {
        if (depth >= HOIST_DEPTH || (ir_ops[nd->op].flags & (F_ELEMENTWISE | F_COMM | F_SINK | F_SYNC))) return 0;
        depth++;
    }
    for (int k = 0; k < nd->nin; k++) {
        int dd = def(f, nd->in[k]);
        if (f->placed[dd]) {
            if (is_member(f, dd) && node(f, dd)->op != OP_const) return 0;
        } else if (!can_place_before(f, dd, depth)) {
            return 0;
        }
    }
    return 1;
}

/* A broadcast member's source: outside the group, or a const. */
static int bcast_source_ok(Fuser *f, int v) {
    int d = def(f, v);
    if (f->placed[d]) return !is_member(f, d) || node(f, d)->op == OP_const;
    if (f->lazy[d] && node(f, d)->op == OP_const) return 1;
    return can_place_before(f, d, 0);
}

/* Can the open group absorb the unplaced lazy node d? */
static int can_absorb(Fuser *f, int d) {
    const Node *nd = node(f, d);
    if (!f->lazy[d] || nd->phase != f->phase) return 0;
    if (nd->op == OP_const) return 1;
    return nd->op == OP_broadcast && same_dims(out_type(f, d), &f->shape) && bcast_source_ok(f, nd->in[0]);
}

/* Can an elementwise member read v? */
static int can_read(Fuser *f, int v) {
    int d = def(f, v);
    if (f->placed[d]) return 1;
    return can_absorb(f, d) || can_place_before(f, d, 0);
}

/* ---- placing ---- */

/* Append node d to the program (before the open group, if any), its unplaced
 * inputs (lazy or hoisted) first. */
static void place(Fuser *f, int d) {
    const Node *nd = node(f, d);
    for (int k = 0; k < nd->nin; k++) {
        int dd = def(f, nd->in[k]);
        if (!f->placed[dd]) place(f, dd);
    }
    f->order[f->norder++] = d;
    f->placed[d] = 1;
}

static void join(Fuser *f, int d);

/* Make value v readable by the member being added (the same choice as can_read). */
static void read(Fuser *f, int v) {
    int d = def(f, v);
    if (f->placed[d]) return;
    f->budget = BUDGET;
    if (can_absorb(f, d)) join(f, d);
    else place(f, d);
}

/* Add node d to the open group (its inputs are ready: the caller checked). */
static void join(Fuser *f, int d) {
    const Node *nd = node(f, d);
    for (int k = 0; k < nd->nin; k++) {
        int dd = def(f, nd->in[k]);
        if (f->placed[dd]) continue;
        if (nd->op == OP_broadcast && !(node(f, dd)->op == OP_const && node(f, dd)->phase == f->phase)) place(f, dd);
        else read(f, nd->in[k]);
    }
    f->member[d] = f->stamp;
    f->placed[d] = 1;
    f->grp[f->ngrp++] = d;
    if (elementwise(nd))
        for (int k = 0; k < nd->nin; k++) f->readmark[nd->in[k]] = f->stamp;
}

/* Does elementwise node j read a member's output or a value a member reads? */
static int related(const Fuser *f, int j) {
    const Node *nd = node(f, j);
    for (int k = 0; k < nd->nin; k++) {
        int v = nd->in[k], d = def(f, v);
        if ((f->placed[d] && is_member(f, d)) || f->readmark[v] == f->stamp) return 1;
    }
    return 0;
}

static int can_join(Fuser *f, int j) {
    const Node *nd = node(f, j);
    if (f->placed[j] || f->lazy[j] || !elementwise(nd)) return 0;
    if (nd->phase != f->phase || !same_dims(out_type(f, j), &f->shape) || !related(f, j)) return 0;
    for (int k = 0; k < nd->nin; k++) {
        f->budget = BUDGET;
        if (!can_read(f, nd->in[k])) return 0;
    }
    return 1;
}

static int used_outside(const Fuser *f, int d) {
    int v = node(f, d)->out[0];
    for (int u = f->ustart[v]; u < f->ustart[v + 1]; u++)
        if (!is_member(f, f->users[u])) return 1;
    return 0;
}

/* Place the group: consts that outside nodes also read become plain nodes
 * ahead of everything placed while the group was open (they have no inputs,
 * and their outside readers may be among those), then the members, numbered K. */
static void close_group(Fuser *f) {
    int K = f->nkernels++;
    for (int k = 0; k < f->ngrp; k++) {
        int d = f->grp[k];
        if (node(f, d)->op != OP_const || !used_outside(f, d)) continue;
        f->member[d] = 0;
        memmove(f->order + f->group_start + 1, f->order + f->group_start, sizeof(int) * (size_t)(f->norder - f->group_start));
        f->order[f->group_start++] = d;
        f->norder++;
    }
    for (int k = 0; k < f->ngrp; k++) {
        int d = f->grp[k];
        if (!is_member(f, d)) continue;
        f->order[f->norder++] = d;
        f->kernel[d] = K;
    }
    f->ngrp = 0;
}

/* Open a group at elementwise node i and grow it over the next WINDOW nodes. */
static void grow(Fuser *f, int i) {
    f->stamp++;
    f->group_start = f->norder;
    f->shape = *out_type(f, i);
    f->phase = node(f, i)->phase;
    join(f, i);
    for (int j = i + 1; j < f->n && j <= i + WINDOW; j++)
        if (can_join(f, j)) join(f, j);
    close_group(f);
}

/* ---- the pass ---- */

/* Node i's attributes with kernel=K (K < 0: without a kernel attribute). */
static void set_kernel(Module *m, Node *n, int K) {
    Attr *a = ir_alloc(m, sizeof(Attr) * (size_t)(n->nattr + 1));
    int k = 0;
    for (int j = 0; j < n->nattr; j++)
        if (strcmp(n->attr[j].key, "kernel") != 0) a[k++] = n->attr[j];
    if (K >= 0) a[k++] = ir_attr_int(m, "kernel", K);
    n->attr = a;
    n->nattr = k;
}

static void build_users(Fuser *f) {
    const Graph *g = f->g;
    f->ustart = xcalloc((size_t)(g->nvals + 1), sizeof(int));
    int total = 0;
    for (int i = 0; i < g->nnodes; i++) {
        total += g->nodes[i].nin;
        for (int k = 0; k < g->nodes[i].nin; k++) f->ustart[g->nodes[i].in[k] + 1]++;
    }
    for (int v = 0; v < g->nvals; v++) f->ustart[v + 1] += f->ustart[v];
    f->users = xcalloc((size_t)total, sizeof(int));
    int *fill = xcalloc((size_t)(g->nvals + 1), sizeof(int));
    memcpy(fill, f->ustart, sizeof(int) * (size_t)(g->nvals + 1));
    for (int i = 0; i < g->nnodes; i++)
        for (int k = 0; k < g->nodes[i].nin; k++) f->users[fill[g->nodes[i].in[k]]++] = i;
    free(fill);
}

static void fuse_graph(Graph *g) {
    int n = g->nnodes;
    Fuser f = {.g = g, .n = n};
    f.order = xcalloc((size_t)n, sizeof(int));
    f.placed = xcalloc((size_t)n, 1);
    f.lazy = xcalloc((size_t)n, 1);
    f.member = xcalloc((size_t)n, sizeof(int));
    f.kernel = xcalloc((size_t)n, sizeof(int));
    f.grp = xcalloc((size_t)n, sizeof(int));
    f.readmark = xcalloc((size_t)g->nvals, sizeof(int));
    build_users(&f);
    for (int i = 0; i < n; i++) {
        Node *nd = &g->nodes[i];
        if (ir_attr(nd, "kernel")) set_kernel(g->m, nd, -1);
        f.kernel[i] = -1;
        int v = nd->nout == 1 ? nd->out[0] : -1;
        f.lazy[i] = (nd->op == OP_const || nd->op == OP_broadcast) && v >= 0 && f.ustart[v + 1] > f.ustart[v];
    }
    for (int i = 0; i < n; i++) {
        if (f.placed[i] || f.lazy[i]) continue;
        if (elementwise(&g->nodes[i])) grow(&f, i);
        else place(&f, i);
    }
    if (f.norder != n) ICE("fuse: placed %d of %d nodes", f.norder, n);
    for (int i = 0; i < n; i++)
        if (f.kernel[i] >= 0) set_kernel(g->m, &g->nodes[i], f.kernel[i]);
    ir_reorder(g, f.order);
    free(f.order), free(f.placed), free(f.lazy), free(f.member), free(f.kernel), free(f.grp);
    free(f.readmark), free(f.ustart), free(f.users);
}

void pass_fuse(Module *m, const Options *o) {
    xent_fuse(m, o); /* the fused classifier first: its dl chain then fuses like any other */
    gemm_epilogue(m, o); /* bias adds into their GEMMs (cuBLASLt epilogues) */
    for (int s = 0; s < m->nstages; s++) fuse_graph(m->stages[s]);
}
