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
 *   - sharding: a valid kind per mesh axis, a split dim below the rank.
 *
 * Checks run in an order that makes the later ones safe (ids are checked
 * before anything indexes with them, types before ir_infer reads them).
 * The first problem is reported as "file:line: node N (op): message", the
 * file:line being the offending node's Loc ("?:0" when it has none).
 */
#include <stdarg.h>
#include <string.h>

#include "ir.h"

typedef struct {
    const Graph *g;
    char *err;
    size_t errlen;
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
        snprintf(c->err, c->errlen, "?:0: %s", msg);
        return -1;
    }
    const Node *n = &c->g->nodes[i];
    const char *op = n->op >= 0 && n->op < OP_COUNT ? ir_ops[n->op].name : "?";
    snprintf(c->err, c->errlen, "%s:%d: node %d (%s): %s", n->loc.file ? n->loc.file : "?", n->loc.file ? n->loc.line : 0, i,
             op, msg);
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

int ir_verify(const Graph *g, char *err, size_t errlen) {
    Checker c = {g, err, errlen};
    if (err && errlen) err[0] = 0;
    if (g->nnodes < 0 || g->nvals < 0) return bad(&c, -1, "negative node or value count");
    for (int i = 0; i < g->nnodes; i++)
        if (check_node(&c, i)) return -1;
    return check_values(&c);
}

int ir_verify_module(const Module *m, char *err, size_t errlen) {
    static const char *const axes[IR_NAXES] = {"pp", "dp", "cp", "tp"};
    Checker c = {NULL, err, errlen};
    if (err && errlen) err[0] = 0;
    for (int a = 0; a < IR_NAXES; a++)
        if (m->mesh[a] < 1) return bad(&c, -1, "module %s: mesh %s=%d must be >= 1", m->name ? m->name : "?", axes[a], m->mesh[a]);
    if (m->nstages < 1 || !m->stages) return bad(&c, -1, "module %s has no stages", m->name ? m->name : "?");
    for (int s = 0; s < m->nstages; s++) {
        const Graph *g = m->stages[s];
        if (!g) return bad(&c, -1, "stage %d is missing", s);
        if (g->m != m) return bad(&c, -1, "stage %d belongs to another module", s);
        if (ir_verify(g, err, errlen)) return -1;
    }
    return 0;
}
