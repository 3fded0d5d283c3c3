/* kgroup.c — the fused groups of a planned graph, for every back end.
 *
 * fuse.c leaves each fused group as a contiguous run of nodes carrying
 * kernel=K.  This file reads them back (kg_collect): in program order, a
 * node with a kernel attribute joins the group of that K, and an elementwise
 * node without one becomes a group of its own (the emitters never write a
 * standalone elementwise kernel).  Then, per group:
 *
 *   inputs    values read by members and defined outside the group, in
 *             order of first use: the kernel's input pointers;
 *   outputs   member values that a node outside the group reads: the
 *             kernel's output pointers (values used only inside live in
 *             registers and have no buffer, see memplan);
 *   shape     the iteration space: the shape of every non-const member's
 *             output (a const feeding only broadcasts may be a scalar);
 *   noalias   the memory plan puts no output over another output or an
 *             input, so the generated code may say so (noalias, __restrict__);
 *   key       a text naming everything the kernel's code depends on; groups
 *             with equal keys (the same chain in every layer, on buffers of
 *             another size) share one kernel, the first one's (KGroup.first).
 *
 * kg_bcast_terms is the index arithmetic of a broadcast read, shared so that
 * the back ends index alike.  Everything here is a function of the graph:
 * no target, no code generation.  A group the emitters could not turn into
 * a kernel is an internal error (the messages keep the "emit:" prefix, as
 * they name a bug that the emitter found).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kgroup.h"


void kg_row_strides(const Type *t, int64_t st[IR_MAXRANK]) {
    int64_t s = 1;
    for (int d = t->rank - 1; d >= 0; d--) {
        st[d] = s;
        s *= t->dim[d];
    }
}

int *kg_program_order(const Graph *g) {
    int *order = xcalloc((size_t)g->nnodes, sizeof(int));
    int scheduled = g->nnodes > 0 && g->nodes[0].pos >= 0;
    for (int i = 0; i < g->nnodes; i++) order[i] = -1;
    for (int i = 0; i < g->nnodes; i++) {
        int p = scheduled ? g->nodes[i].pos : i;
        if (p < 0 || p >= g->nnodes || order[p] >= 0) {
            char w[160];
            ICE("emit: %s: bad or duplicate program position %d", ir_where(&g->nodes[i], w, sizeof w), p);
        }
        order[p] = i;
    }
    return order;
}

int kg_in_group(const KGroups *gs, const KGroup *gr, int node) {
    return node >= 0 && gs->group_of[node] == (int)(gr - gs->groups);
}

int kg_outside_bcast(const KGroups *gs, const KGroup *gr, const Node *n) {
    return n->op == OP_broadcast && !kg_in_group(gs, gr, gs->g->vals[n->in[0]].def);
}

static int list_add(int *list, int *n, int v) {
    for (int i = 0; i < *n; i++)
        if (list[i] == v) return i;
    list[*n] = v;
    return (*n)++;
}

static int list_find(const int *list, int n, int v) {
    for (int i = 0; i < n; i++)
        if (list[i] == v) return i;
    return -1;
}

int kg_in_slot(const KGroup *gr, int vid) { return list_find(gr->in, gr->nin, vid); }
int kg_out_slot(const KGroup *gr, int vid) { return list_find(gr->out, gr->nout, vid); }

/* Inputs, outputs and iteration space of a group whose members are set. */
static void group_io(KGroups *gs, KGroup *gr, const int *uses_outside) {
    const Graph *g = gs->g;
    char w[160];
    int cap = 0;
    for (int k = 0; k < gr->nnodes; k++) cap += g->nodes[gr->nodes[k]].nin + g->nodes[gr->nodes[k]].nout;
    gr->in = xcalloc((size_t)cap, sizeof(int));
    gr->out = xcalloc((size_t)cap, sizeof(int));
    int64_t best = -1;
    for (int k = 0; k < gr->nnodes; k++) {
        const Node *n = &g->nodes[gr->nodes[k]];
        unsigned f = ir_ops[n->op].flags;
        if (!(f & F_ELEMENTWISE) && n->op != OP_broadcast && n->op != OP_const)
            ICE("emit: %s: %s in fused group %d is neither elementwise, broadcast nor const", ir_where(n, w, sizeof w),
                ir_ops[n->op].name, gr->kernel);
        for (int i = 0; i < n->nin; i++)
            if (!kg_in_group(gs, gr, g->vals[n->in[i]].def)) list_add(gr->in, &gr->nin, n->in[i]);
        if (n->nout != 1) ICE("emit: %s: group member with %d outputs", ir_where(n, w, sizeof w), n->nout);
        if (uses_outside[n->out[0]]) list_add(gr->out, &gr->nout, n->out[0]);
        const Type *t = &g->vals[n->out[0]].t;
        if (n->op != OP_const && ir_numel(t) != best) {
            if (best >= 0) ICE("emit: %s: fused group %d mixes iteration spaces", ir_where(n, w, sizeof w), gr->kernel);
            best = ir_numel(t);
            gr->shape = *t;
        }
    }
    if (best < 0) gr->shape = g->vals[g->nodes[gr->nodes[0]].out[0]].t; /* consts only */
}

/* Byte ranges of two planned values overlap. */
static int overlap(const Value *a, const Value *b) {
    if (a->space != b->space) return 0;
    int64_t ea = a->offset + ir_value_bytes(a);
    int64_t eb = b->offset + ir_value_bytes(b);
    return a->offset < eb && b->offset < ea;
}

static int group_disjoint(const KGroups *gs, const KGroup *gr) {
    for (int i = 0; i < gr->nout; i++) {
        const Value *o = &gs->g->vals[gr->out[i]];
        for (int j = 0; j < gr->nin; j++)
            if (overlap(o, &gs->g->vals[gr->in[j]])) return 0;
        for (int j = 0; j < gr->nout; j++)
            if (j != i && overlap(o, &gs->g->vals[gr->out[j]])) return 0;
    }
    return 1;
}

/* A growing string. */
typedef struct {
    char *s;
    size_t n, cap;
} Buf;

static void bprintf(Buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void bprintf(Buf *b, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->s + b->n, b->cap - b->n, fmt, ap);
        va_end(ap);
        if (k < 0) ICE("emit: vsnprintf failed");
        if (b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return;
        }
        b->cap = 2 * (b->n + (size_t)k + 64);
        b->s = realloc(b->s, b->cap);
        if (!b->s) ICE("emit: out of memory");
    }
}

static void bshape(Buf *b, const Type *t) {
    bprintf(b, "%s[", ir_dtype_names[t->dt]);
    for (int d = 0; d < t->rank; d++) bprintf(b, "%s%lld", d ? "," : "", (long long)t->dim[d]);
    bprintf(b, "]");
}

/* A text key for everything a group's kernel depends on: the members' ops
 * and attributes, where each operand comes from (a member or an input slot),
 * dtypes, the shapes of broadcasts, which members are outputs, noalias.  The
 * element count is an argument, so groups that differ only in buffers and
 * size (the same chain in every layer) share one kernel. */
static char *group_key(const KGroups *gs, const KGroup *gr) {
    const Graph *g = gs->g;
    Buf b = {0};
    bprintf(&b, "noalias=%d in=", gr->noalias);
    for (int k = 0; k < gr->nin; k++) bprintf(&b, "%s,", ir_dtype_names[g->vals[gr->in[k]].t.dt]);
    for (int j = 0; j < gr->nnodes; j++) {
        const Node *n = &g->nodes[gr->nodes[j]];
        bprintf(&b, ";%s:%s(", ir_ops[n->op].name, ir_dtype_names[g->vals[n->out[0]].t.dt]);
        for (int i = 0; i < n->nin; i++) {
            int def = g->vals[n->in[i]].def, m = -1;
            for (int q = 0; q < j && m < 0; q++)
                if (gr->nodes[q] == def) m = q;
            if (m >= 0) bprintf(&b, "m%d,", m);
            else bprintf(&b, "i%d,", list_find(gr->in, gr->nin, n->in[i]));
        }
        if (n->op == OP_const) bprintf(&b, "v=%.17g", ir_attr_f(n, "v", 0));
        for (int k = 0; k < n->nattr; k++) /* an elementwise op's numbers (pow's p) */
            if (n->op != OP_const && (n->attr[k].kind == AT_FLOAT || n->attr[k].kind == AT_INT) && strcmp(n->attr[k].key, "kernel"))
                bprintf(&b, "%s=%.17g", n->attr[k].key, ir_attr_f(n, n->attr[k].key, 0));
        if (n->op == OP_broadcast) {
            bshape(&b, &g->vals[n->in[0]].t);
            bshape(&b, &g->vals[n->out[0]].t);
        }
        bprintf(&b, ")");
    }
    bprintf(&b, ";out=");
    for (int k = 0; k < gr->nout; k++)
        for (int j = 0; j < gr->nnodes; j++)
            if (g->nodes[gr->nodes[j]].out[0] == gr->out[k]) bprintf(&b, "m%d,", j);
    return b.s;
}

/* Members of each group, in program order. */
static void collect_members(KGroups *gs, const int *order, int norder) {
    const Graph *g = gs->g;
    char w[160];
    for (int p = 0; p < norder; p++) {
        int i = order[p];
        const Node *n = &g->nodes[i];
        const Attr *ka = ir_attr(n, "kernel");
        int k = -1;
        if (ka) {
            if (ka->kind != AT_INT || ka->i < 0) ICE("emit: %s: bad kernel attribute", ir_where(n, w, sizeof w));
            for (int q = 0; q < gs->ngroups && k < 0; q++)
                if (gs->groups[q].kernel == ka->i) k = q;
        } else if (!(ir_ops[n->op].flags & F_ELEMENTWISE)) {
            continue;
        }
        if (k < 0) {
            k = gs->ngroups++;
            gs->groups[k].kernel = ka ? (int)ka->i : -1;
        }
        KGroup *gr = &gs->groups[k];
        if (gr->nnodes > 0 && order[p - 1] != gr->nodes[gr->nnodes - 1])
            ICE("emit: %s: fused group %d is not contiguous in the program", ir_where(n, w, sizeof w), gr->kernel);
        if ((gr->nnodes & (gr->nnodes - 1)) == 0) { /* 0, 1, 2, 4, ...: grow */
            gr->nodes = realloc(gr->nodes, sizeof(int) * (size_t)(gr->nnodes ? 2 * gr->nnodes : 1));
            if (!gr->nodes) ICE("emit: out of memory");
        }
        gr->nodes[gr->nnodes++] = i;
        gs->group_of[i] = k;
    }
}

void kg_collect(KGroups *gs, const Graph *g, const int *order, int norder) {
    *gs = (KGroups){.g = g};
    gs->group_of = xcalloc((size_t)g->nnodes, sizeof(int));
    gs->groups = xcalloc((size_t)g->nnodes, sizeof(KGroup));
    for (int i = 0; i < g->nnodes; i++) gs->group_of[i] = -1;
    collect_members(gs, order, norder);
    int *uses_outside = xcalloc((size_t)g->nvals, sizeof(int));
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        for (int k = 0; k < n->nin; k++) {
            int def = g->vals[n->in[k]].def;
            if (def >= 0 && gs->group_of[def] >= 0 && gs->group_of[def] != gs->group_of[i]) uses_outside[n->in[k]] = 1;
        }
    }
    for (int k = 0; k < gs->ngroups; k++) {
        KGroup *gr = &gs->groups[k];
        group_io(gs, gr, uses_outside);
        gr->noalias = group_disjoint(gs, gr);
        gr->key = group_key(gs, gr);
        gr->first = k;
        for (int j = 0; j < k && gr->first == k; j++)
            if (strcmp(gs->groups[j].key, gr->key) == 0) gr->first = j;
        if (gr->kernel >= 0) snprintf(gr->name, sizeof gr->name, "fused_%d", gr->kernel);
        else snprintf(gr->name, sizeof gr->name, "fused_n%d", gr->nodes[0]);
    }
    free(uses_outside);
}

void kg_free(KGroups *gs) {
    for (int k = 0; k < gs->ngroups; k++) {
        free(gs->groups[k].nodes);
        free(gs->groups[k].in);
        free(gs->groups[k].out);
        free(gs->groups[k].key);
    }
    free(gs->groups);
    free(gs->group_of);
    *gs = (KGroups){0};
}

int kg_bcast_terms(const Type *x, const Type *big, KgTerm terms[IR_MAXRANK]) {
    int64_t ost[IR_MAXRANK], xst[IR_MAXRANK], st[IR_MAXRANK];
    kg_row_strides(big, ost);
    kg_row_strides(x, xst);
    int shift = big->rank - x->rank, nt = 0;
    for (int d = 0; d < big->rank; d++) {
        int k = d - shift;
        st[d] = k < 0 || x->dim[k] == 1 ? 0 : xst[k];
    }
    int64_t total = ir_numel(big);
    for (int d = 0; d < big->rank;) {
        if (st[d] == 0 || big->dim[d] == 1) { d++; continue; }
        int64_t len = big->dim[d];
        int d1 = d + 1;
        for (; d1 < big->rank && st[d1] != 0 && st[d1 - 1] == st[d1] * big->dim[d1]; d1++) len *= big->dim[d1];
        int64_t inner = ost[d1 - 1];
        terms[nt++] = (KgTerm){.inner = inner, .len = len, .stride = st[d1 - 1], .mod = inner * len != total};
        d = d1;
    }
    return nt;
}
