/* ir.c — the IR's core: arena and strings, the op table, types, building
 * nodes, the shape/dtype rule of every op, attributes, mesh groups, errors.
 *
 * ir_infer() is the single place where an op's shape and dtype rule lives.
 * The front end calls it (through ir_add_node) to reject a model at the line
 * that wrote the bad op, the parser to check a dump, and the verifier to
 * re-check every node after every pass; so a pass that builds a node with the
 * wrong shape is caught at the pass, not three passes later.
 */
#include <assert.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"

const OpInfo ir_ops[OP_COUNT] = {
#define OP(name, nin, nout, flags, doc) {#name, nin, nout, flags, doc},
#include "ops.def"
#undef OP
};

const char *const ir_dtype_names[DT_COUNT] = {"f32", "bf16", "f16", "i32", "i64"};
const char *const ir_phase_names[PH_COUNT] = {"fwd", "bwd", "recompute", "opt", "wgrad"};
const char *const ir_recompute_names[RC_COUNT] = {"", "none", "full", "selective", "gemm-last"};

int ir_recompute_lookup(const char *name) {
    for (int r = RC_NONE; r < RC_COUNT; r++)
        if (strcmp(name, ir_recompute_names[r]) == 0) return r;
    return -1;
}

int ir_op_lookup(const char *name) {
    for (int i = 0; i < OP_COUNT; i++)
        if (strcmp(ir_ops[i].name, name) == 0) return i;
    return -1;
}

int ir_dtype_lookup(const char *name) {
    for (int i = 0; i < DT_COUNT; i++)
        if (strcmp(ir_dtype_names[i], name) == 0) return i;
    return -1;
}

int ir_dtype_is_float(DType dt) { return dt == DT_F32 || dt == DT_BF16 || dt == DT_F16; }

size_t ir_dtype_size(DType dt) {
    static const size_t sz[DT_COUNT] = {4, 2, 2, 4, 8};
    return sz[dt];
}

const char *ir_space_name(int space) {
    static const char *const names[SPACE_COUNT] = {"params", "grads", "opt", "act", "host"};
    return space >= 0 && space < SPACE_COUNT ? names[space] : "?";
}

int64_t ir_value_bytes(const Value *v) { return ir_numel(&v->t) * (int64_t)ir_dtype_size(v->t.dt); }

int64_t ir_numel(const Type *t) {
    int64_t n = 1;
    for (int i = 0; i < t->rank; i++) n *= t->dim[i];
    return n;
}

int ir_type_eq(const Type *a, const Type *b) {
    if (a->dt != b->dt || a->rank != b->rank) return 0;
    for (int i = 0; i < a->rank; i++)
        if (a->dim[i] != b->dim[i]) return 0;
    return 1;
}

char *ir_type_str(const Type *t, char *buf, size_t n) {
    size_t k = (size_t)snprintf(buf, n, "%s[", ir_dtype_names[t->dt]);
    for (int i = 0; i < t->rank && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? "," : "", (long long)t->dim[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
    return buf;
}

/* ---- errors ---- */

void error_at(Loc loc, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s:%d: ", loc.file ? loc.file : "?", loc.line);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

/* The node being processed, for ir_ice: a copy, since the module that owns
 * loc.file may be freed before the next ICE (tests build many). */
static char ice_file[256];
static int ice_line;

void ir_ice_at(Loc loc) {
    ice_line = loc.line;
    if (!loc.file) ice_file[0] = 0;
    else if (strncmp(ice_file, loc.file, sizeof ice_file)) snprintf(ice_file, sizeof ice_file, "%s", loc.file);
}

void ir_ice(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "internal compiler error at %s:%d", file, line);
    if (ice_file[0]) fprintf(stderr, " (model line %s:%d)", ice_file, ice_line);
    fputs(": ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    abort();
}

/* ---- arena: chunks freed all at once; an intern table for strings ---- */

typedef struct Chunk {
    struct Chunk *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
} Chunk;

struct Arena {
    Chunk *head;
    const char **strs; /* open-addressing intern table */
    size_t nstrs, capstrs;
};

void *xcalloc(size_t n, size_t sz) {
    void *p = calloc(n ? n : 1, sz ? sz : 1);
    if (!p) ICE("out of memory (%zu x %zu bytes)", n, sz);
    return p;
}

void *ir_alloc(Module *m, size_t n) {
    Arena *a = m->arena;
    n = (n + 15) & ~(size_t)15;
    if (!a->head || a->head->used + n > a->head->cap) {
        /* chunks double from 16 KiB up to 1 MiB: small modules (tests, the
         * fuzzer) stay cheap, big ones allocate rarely */
        size_t prev = a->head ? a->head->cap : 0;
        size_t cap = prev ? (prev < (1u << 20) ? 2 * prev : prev) : (1u << 14);
        if (cap < n) cap = n;
        Chunk *c = xcalloc(1, sizeof(Chunk) + cap);
        c->cap = cap;
        c->next = a->head;
        a->head = c;
    }
    void *p = a->head->data + a->head->used;
    a->head->used += n;
    return p; /* chunks come zeroed from calloc and are never reused */
}

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

const char *ir_intern(Module *m, const char *s) {
    Arena *a = m->arena;
    if (2 * (a->nstrs + 1) > a->capstrs) {
        size_t cap = a->capstrs ? 2 * a->capstrs : 256;
        const char **t = xcalloc(cap, sizeof *t);
        for (size_t i = 0; i < a->capstrs; i++)
            if (a->strs[i]) {
                size_t j = hash_str(a->strs[i]) & (cap - 1);
                while (t[j]) j = (j + 1) & (cap - 1);
                t[j] = a->strs[i];
            }
        free(a->strs);
        a->strs = t;
        a->capstrs = cap;
    }
    size_t j = hash_str(s) & (a->capstrs - 1);
    for (; a->strs[j]; j = (j + 1) & (a->capstrs - 1))
        if (strcmp(a->strs[j], s) == 0) return a->strs[j];
    size_t n = strlen(s) + 1;
    char *copy = ir_alloc(m, n);
    memcpy(copy, s, n);
    a->strs[j] = copy;
    a->nstrs++;
    return copy;
}

/* ---- modules and graphs ---- */

Module *ir_module_new(const char *name) {
    Module *m = xcalloc(1, sizeof *m);
    m->arena = xcalloc(1, sizeof *m->arena);
    m->name = ir_intern(m, name);
    for (int i = 0; i < IR_NAXES; i++) m->mesh[i] = 1;
    m->nstages = 1;
    m->stages = ir_alloc(m, sizeof(Graph *));
    m->stages[0] = ir_graph_new(m);
    return m;
}

void ir_free(Module *m) {
    if (!m) return;
    for (Chunk *c = m->arena->head, *next; c; c = next) {
        next = c->next;
        free(c);
    }
    free(m->arena->strs);
    free(m->arena);
    free(m);
}

Graph *ir_graph_new(Module *m) {
    Graph *g = ir_alloc(m, sizeof *g);
    g->m = m;
    return g;
}

static void *grow(Module *m, void *old, int n, int *cap, size_t elem) {
    if (n < *cap) return old;
    int ncap = *cap ? 2 * *cap : 64;
    void *p = ir_alloc(m, (size_t)ncap * elem);
    if (old) memcpy(p, old, (size_t)n * elem);
    *cap = ncap;
    return p;
}

NodeSpec ir_spec(Op op, Loc loc) {
    NodeSpec s = {0};
    s.op = op;
    s.loc = loc;
    s.layer = -1;
    s.phase = PH_FWD;
    return s;
}

int ir_add_node(Graph *g, const NodeSpec *s, char *err, size_t errlen) {
    Module *m = g->m;
    const OpInfo *info = &ir_ops[s->op];
    if (s->nin > IR_MAXIN) {
        snprintf(err, errlen, "%s: %d inputs, at most %d", info->name, s->nin, IR_MAXIN);
        return -1;
    }
    if (info->nin >= 0 ? s->nin != info->nin : s->nin < 1) {
        snprintf(err, errlen, "%s: expects %d inputs, got %d", info->name, info->nin, s->nin);
        return -1;
    }
    for (int i = 0; i < s->nin; i++)
        if (s->in[i] < 0 || s->in[i] >= g->nvals) {
            snprintf(err, errlen, "%s: input %d is not a defined value", info->name, i);
            return -1;
        }
    Node n = {0};
    n.op = s->op;
    n.nin = s->nin;
    n.in = ir_alloc(m, sizeof(int) * (size_t)(s->nin ? s->nin : 1));
    if (s->nin) memcpy(n.in, s->in, sizeof(int) * (size_t)s->nin);
    n.nattr = s->nattr;
    n.attr = ir_alloc(m, sizeof(Attr) * (size_t)(s->nattr ? s->nattr : 1));
    if (s->nattr) memcpy(n.attr, s->attr, sizeof(Attr) * (size_t)s->nattr);
    n.loc = s->loc;
    n.layer = s->layer;
    n.phase = s->phase;
    n.stream = n.pos = -1;

    Type out[8] = {0};
    if (info->flags & F_SOURCE) {
        if (!s->src_type) {
            snprintf(err, errlen, "%s: a source op needs a declared type", info->name);
            return -1;
        }
        out[0] = *s->src_type;
    }
    if (ir_infer(g, &n, out, err, errlen) < 0) return -1;

    n.nout = info->nout;
    n.out = ir_alloc(m, sizeof(int) * (size_t)(n.nout ? n.nout : 1));
    int idx = g->nnodes;
    for (int i = 0; i < n.nout; i++) {
        g->vals = grow(m, g->vals, g->nvals, &g->capvals, sizeof(Value));
        Value *v = &g->vals[g->nvals];
        memset(v, 0, sizeof *v);
        v->id = g->nvals++;
        v->t = out[i];
        v->def = idx;
        v->defout = i;
        v->space = -1;
        v->offset = -1;
        n.out[i] = v->id;
    }
    g->nodes = grow(m, g->nodes, g->nnodes, &g->capnodes, sizeof(Node));
    g->nodes[g->nnodes++] = n;
    return idx;
}

int ir_build(Builder *b, Op op, int nin, const int *in, int nattr, const Attr *at, const Type *src) {
    NodeSpec s = ir_spec(op, b->loc);
    s.nin = nin;
    s.in = in;
    s.nattr = nattr;
    s.attr = at;
    s.layer = b->layer;
    s.phase = b->phase;
    s.src_type = src;
    char err[256];
    ir_ice_at(b->loc);
    int n = ir_add_node(b->g, &s, err, sizeof err);
    if (n < 0) ICE("%s: %s: %s", b->pass, ir_ops[op].name, err);
    return n;
}

int ir_build1(Builder *b, Op op, int x, int nattr, const Attr *at) {
    return ir_out(b->g, ir_build(b, op, 1, &x, nattr, at, NULL));
}

int ir_build2(Builder *b, Op op, int x, int y) {
    int in[2] = {x, y};
    return ir_out(b->g, ir_build(b, op, 2, in, 0, NULL, NULL));
}

/* ---- attributes ---- */

Attr ir_attr_int(Module *m, const char *key, int64_t v) {
    return (Attr){.key = ir_intern(m, key), .kind = AT_INT, .i = v};
}
Attr ir_attr_float(Module *m, const char *key, double v) {
    return (Attr){.key = ir_intern(m, key), .kind = AT_FLOAT, .f = v};
}
Attr ir_attr_str(Module *m, const char *key, const char *v) {
    return (Attr){.key = ir_intern(m, key), .kind = AT_STR, .s = ir_intern(m, v)};
}
Attr ir_attr_ints(Module *m, const char *key, const int64_t *v, int n) {
    Attr a = {.key = ir_intern(m, key), .kind = AT_INTS, .n = n};
    a.v = ir_alloc(m, sizeof(int64_t) * (size_t)(n ? n : 1));
    if (n) memcpy(a.v, v, sizeof(int64_t) * (size_t)n);
    return a;
}

const Attr *ir_attr(const Node *n, const char *key) {
    for (int i = 0; i < n->nattr; i++)
        if (strcmp(n->attr[i].key, key) == 0) return &n->attr[i];
    return NULL;
}
int64_t ir_attr_i(const Node *n, const char *key, int64_t dflt) {
    const Attr *a = ir_attr(n, key);
    return a && a->kind == AT_INT ? a->i : dflt;
}
double ir_attr_f(const Node *n, const char *key, double dflt) {
    const Attr *a = ir_attr(n, key);
    if (!a) return dflt;
    return a->kind == AT_FLOAT ? a->f : a->kind == AT_INT ? (double)a->i : dflt;
}
const char *ir_attr_s(const Node *n, const char *key, const char *dflt) {
    const Attr *a = ir_attr(n, key);
    return a && a->kind == AT_STR ? a->s : dflt;
}

/* ---- shape and dtype rules ---- */

#define FAIL(...) do { snprintf(err, errlen, __VA_ARGS__); return -1; } while (0)

static const char *tstr(const Type *t, char *buf) { return ir_type_str(t, buf, 96); }

/* A dim attribute in [0, rank), else -1. */
static int dim_attr(const Node *n, const char *key, int rank) {
    const Attr *a = ir_attr(n, key);
    if (!a || a->kind != AT_INT || a->i < 0 || a->i >= rank) return -1;
    return (int)a->i;
}

static int shape_attr(const Node *n, Type *out, char *err, size_t errlen, const char *op) {
    const Attr *a = ir_attr(n, "shape");
    if (!a || a->kind != AT_INTS) FAIL("%s: needs an int list attribute shape", op);
    if (a->n > IR_MAXRANK) FAIL("%s: rank %d exceeds %d", op, a->n, IR_MAXRANK);
    out->rank = a->n;
    int64_t numel = 1;
    for (int i = 0; i < a->n; i++) {
        if (a->v[i] < 1 || a->v[i] > IR_MAXNUMEL / numel) FAIL("%s: bad dim %lld (at most 2^48 elements)", op, (long long)a->v[i]);
        numel *= out->dim[i] = a->v[i];
    }
    return 0;
}

/* numpy rule: `small` broadcasts to `big`. */
static int broadcastable(const Type *small, const Type *big) {
    if (small->rank > big->rank) return 0;
    for (int i = 1; i <= small->rank; i++) {
        int64_t s = small->dim[small->rank - i], b = big->dim[big->rank - i];
        if (s != b && s != 1) return 0;
    }
    return 1;
}

static int need_float(const Type *t, const char *op, const char *what, char *err, size_t errlen) {
    if (!ir_dtype_is_float(t->dt)) FAIL("%s: %s must be a float tensor, got %s", op, what, ir_dtype_names[t->dt]);
    return 0;
}

static int need_int(const Type *t, const char *op, const char *what, char *err, size_t errlen) {
    if (t->dt != DT_I32 && t->dt != DT_I64) FAIL("%s: %s must be i32 or i64, got %s", op, what, ir_dtype_names[t->dt]);
    return 0;
}

static int same_type(const Type *a, const Type *b, const char *op, char *err, size_t errlen) {
    char x[96], y[96];
    if (!ir_type_eq(a, b)) FAIL("%s: %s and %s differ", op, tstr(a, x), tstr(b, y));
    return 0;
}

static Type scalar_f32(void) { return (Type){.dt = DT_F32, .rank = 0}; }

/* The rules below, one per op or family of ops, get the node with the
 * types of its first 8 inputs (all checked defined) and its op's name. */
typedef struct {
    const Graph *g;
    const Node *n;
    const Type *t[8];
    const char *op;
} Infer;
typedef int (*InferFn)(const Infer *in, Type out[], char *err, size_t errlen);

/* ---- sources and sinks ---- */

/* out[0] holds the declared type; ir_infer bounds its dims */
static int infer_source(const Node *n, const Type *out, char *err, size_t errlen) {
    const char *op = ir_ops[n->op].name;
    if (out->rank < 0 || out->rank > IR_MAXRANK) FAIL("%s: bad rank", op);
    if (n->op == OP_iota && (out->rank != 1 || out->dt != DT_I32)) FAIL("iota: type must be i32[n]");
    if ((n->op == OP_param || n->op == OP_state) && !ir_dtype_is_float(out->dt)) FAIL("%s: must be a float tensor", op);
    if ((n->op == OP_input || n->op == OP_param || n->op == OP_state) && !ir_attr_s(n, "name", NULL))
        FAIL("%s: needs a name attribute", op);
    if (n->op == OP_const && !ir_attr(n, "v")) FAIL("const: needs a value attribute v");
    return 0;
}

/* output, assign */
static int infer_named_sink(const Infer *in, Type out[], char *err, size_t errlen) {
    (void)out;
    if (!ir_attr_s(in->n, "name", NULL)) FAIL("%s: needs a name attribute", in->op);
    return 0;
}

/* record, wait */
static int infer_sync(const Infer *in, Type out[], char *err, size_t errlen) {
    (void)out;
    if (ir_attr_i(in->n, "event", -1) < 0) FAIL("%s: needs an event attribute >= 0", in->op);
    return 0;
}

/* offload (device -> host) and reload (host -> device): the same type; a
 * reload reads an offload's output and an offload a device value. */
static int infer_copy(const Infer *in, Type out[], char *err, size_t errlen) {
    int d = in->g->vals[in->n->in[0]].def;
    int host = d >= 0 && in->g->nodes[d].op == OP_offload;
    if (in->n->op == OP_reload && !host) FAIL("reload: its input must be an offload's output (a host copy)");
    if (in->n->op == OP_offload && host) FAIL("offload: its input is already a host copy (an offload's output)");
    out[0] = *in->t[0];
    return 0;
}

/* ---- elementwise ---- */

/* add, sub, mul, div and the (dy, x) backward helpers */
static int infer_binary(const Infer *in, Type out[], char *err, size_t errlen) {
    const Type *const *t = in->t;
    if (need_float(t[0], in->op, "a", err, errlen) || same_type(t[0], t[1], in->op, err, errlen)) return -1;
    out[0] = *t[0];
    return 0;
}

static int infer_unary(const Infer *in, Type out[], char *err, size_t errlen) {
    if (need_float(in->t[0], in->op, "input", err, errlen)) return -1;
    out[0] = *in->t[0];
    return 0;
}

/* issue 17: pow {p}; where (c, a, b) and minimum_bwd, maximum_bwd (dy, a, b):
 * three inputs of one float type */
static int infer_pow(const Infer *in, Type out[], char *err, size_t errlen) {
    const Attr *p = ir_attr(in->n, "p");
    if (!p || (p->kind != AT_FLOAT && p->kind != AT_INT)) FAIL("pow: needs a number exponent p");
    return infer_unary(in, out, err, errlen);
}

static int infer_ternary(const Infer *in, Type out[], char *err, size_t errlen) {
    const Type *const *t = in->t;
    if (need_float(t[0], in->op, "input", err, errlen) || same_type(t[0], t[1], in->op, err, errlen) ||
        same_type(t[0], t[2], in->op, err, errlen)) return -1;
    out[0] = *t[0];
    return 0;
}

static int infer_cast(const Infer *in, Type out[], char *err, size_t errlen) {
    int dt = ir_dtype_lookup(ir_attr_s(in->n, "dtype", ""));
    if (dt < 0) FAIL("cast: unknown dtype \"%s\"", ir_attr_s(in->n, "dtype", ""));
    out[0] = *in->t[0];
    out[0].dt = (DType)dt;
    return 0;
}

/* ---- reductions ---- */

/* x reduced over {dim} ({keep}: as size 1) */
static int reduced_type(const Node *n, const Type *x, Type *out, char *err, size_t errlen, const char *op) {
    int d = dim_attr(n, "dim", x->rank);
    if (d < 0) FAIL("%s: dim out of range for rank %d", op, x->rank);
    if (need_float(x, op, "input", err, errlen)) return -1;
    *out = *x;
    if (ir_attr_i(n, "keep", 0)) {
        out->dim[d] = 1;
    } else {
        for (int i = d; i < x->rank - 1; i++) out->dim[i] = x->dim[i + 1];
        out->rank--;
    }
    return 0;
}

/* sum, mean, max */
static int infer_reduce(const Infer *in, Type out[], char *err, size_t errlen) {
    return reduced_type(in->n, in->t[0], &out[0], err, errlen, in->op);
}

static int infer_max_bwd(const Infer *in, Type out[], char *err, size_t errlen) {
    const Type *const *t = in->t;
    Type r;
    if (reduced_type(in->n, t[1], &r, err, errlen, in->op) || same_type(t[0], &r, in->op, err, errlen) ||
        same_type(t[2], &r, in->op, err, errlen)) return -1;
    out[0] = *t[1];
    return 0;
}

static int infer_sumsq(const Infer *in, Type out[], char *err, size_t errlen) {
    if (need_float(in->t[0], in->op, "input", err, errlen)) return -1;
    out[0] = scalar_f32();
    return 0;
}

/* ---- shape ops ---- */

static int infer_reshape(const Infer *in, Type out[], char *err, size_t errlen) {
    const Type *x = in->t[0];
    char a[96], b[96];
    if (shape_attr(in->n, &out[0], err, errlen, in->op)) return -1;
    out[0].dt = x->dt;
    if (ir_numel(&out[0]) != ir_numel(x)) FAIL("reshape: %s to %s changes the element count", tstr(x, a), tstr(&out[0], b));
    return 0;
}

static int infer_transpose(const Infer *in, Type out[], char *err, size_t errlen) {
    const Type *x = in->t[0];
    int a = dim_attr(in->n, "a", x->rank), b = dim_attr(in->n, "b", x->rank);
    if (a < 0 || b < 0) FAIL("transpose: dims out of range for rank %d", x->rank);
    out[0] = *x;
    out[0].dim[a] = x->dim[b];
    out[0].dim[b] = x->dim[a];
    return 0;
}

static int infer_slice(const Infer *in, Type out[], char *err, size_t errlen) {
    const Type *x = in->t[0];
    int d = dim_attr(in->n, "dim", x->rank);
    int64_t s = ir_attr_i(in->n, "start", -1), e = ir_attr_i(in->n, "end", -1);
    if (d < 0) FAIL("slice: dim out of range for rank %d", x->rank);
    if (s < 0 || e <= s || e > x->dim[d])
        FAIL("slice: [%lld:%lld] out of range for dim %d of size %lld", (long long)s, (long long)e, d, (long long)x->dim[d]);
    out[0] = *x;
    out[0].dim[d] = e - s;
    return 0;
}

static int infer_concat(const Infer *in, Type out[], char *err, size_t errlen) {
    const Type *t0 = in->t[0];
    char x[96], y[96];
    int d = dim_attr(in->n, "dim", t0->rank);
    if (d < 0) FAIL("concat: dim out of range for rank %d", t0->rank);
    out[0] = *t0;
    for (int i = 1; i < in->n->nin; i++) {
        const Type *u = &in->g->vals[in->n->in[i]].t;
        Type a = *u, b = *t0;
        a.dim[d] = b.dim[d] = 1;
        if (!ir_type_eq(&a, &b)) FAIL("concat: %s and %s differ outside dim %d", tstr(t0, x), tstr(u, y), d);
        out[0].dim[d] += u->dim[d];
    }
    return 0;
}

static int infer_broadcast(const Infer *in, Type out[], char *err, size_t errlen) {
    char x[96], y[96];
    if (shape_attr(in->n, &out[0], err, errlen, in->op)) return -1;
    out[0].dt = in->t[0]->dt;
    if (!broadcastable(in->t[0], &out[0])) FAIL("broadcast: %s does not broadcast to %s", tstr(in->t[0], x), tstr(&out[0], y));
    return 0;
}

static int infer_sumto(const Infer *in, Type out[], char *err, size_t errlen) {
    char x[96], y[96];
    if (shape_attr(in->n, &out[0], err, errlen, in->op)) return -1;
    out[0].dt = in->t[0]->dt;
    if (!broadcastable(&out[0], in->t[0])) FAIL("sumto: %s does not broadcast to %s", tstr(&out[0], x), tstr(in->t[0], y));
    return 0;
}

/* ---- GEMM ---- */

static int infer_matmul(const Infer *in, Type out[], char *err, size_t errlen) {
    const Type *a = in->t[0], *b = in->t[1];
    char x[96], y[96];
    int ta = ir_attr_i(in->n, "ta", 0) != 0, tb = ir_attr_i(in->n, "tb", 0) != 0;
    if (need_float(a, "matmul", "a", err, errlen) || need_float(b, "matmul", "b", err, errlen)) return -1;
    if (a->dt != b->dt) FAIL("matmul: dtypes %s and %s differ", ir_dtype_names[a->dt], ir_dtype_names[b->dt]);
    if (a->rank < 2 || b->rank < 2) FAIL("matmul: %s x %s: operands need rank >= 2", tstr(a, x), tstr(b, y));
    if (b->rank != 2 && b->rank != a->rank)
        FAIL("matmul: %s x %s: b must be rank 2 or have a's batch dims", tstr(a, x), tstr(b, y));
    for (int i = 0; b->rank > 2 && i < a->rank - 2; i++)
        if (a->dim[i] != b->dim[i]) FAIL("matmul: %s x %s: batch dims differ", tstr(a, x), tstr(b, y));
    int64_t M = a->dim[a->rank - 2 + ta], K = a->dim[a->rank - 1 - ta];
    int64_t Kb = b->dim[b->rank - 2 + tb], N = b->dim[b->rank - 1 - tb];
    if (K != Kb) FAIL("matmul: %s x %s: inner dims differ", tstr(a, x), tstr(b, y));
    out[0] = *a;
    out[0].dim[a->rank - 2] = M;
    out[0].dim[a->rank - 1] = N;
    if (in->n->op == OP_matmul_bias || in->n->op == OP_matmul_bias_gelu) {
        const Type *c = in->t[2];
        if (c->dt != a->dt || c->rank != 1 || c->dim[0] != N)
            FAIL("%s: bias %s must be %s[%lld]", ir_ops[in->n->op].name, tstr(c, x), ir_dtype_names[a->dt], (long long)N);
    }
    if (in->n->op == OP_matmul_bias_gelu) out[1] = out[0]; /* the aux output: the pre-activation */
    if (in->n->op == OP_matmul_dgelu_bgrad) { /* (dy, b, z): dz as z, db[N] */
        if (!ir_type_eq(in->t[2], &out[0])) FAIL("matmul_dgelu_bgrad: z %s must be the product's %s", tstr(in->t[2], x), tstr(&out[0], y));
        out[1] = out[0];
        out[1].rank = 1, out[1].dim[0] = N;
    }
    if (in->n->op == OP_matmul_bgrad) { /* db: the sum over K of b ([N], tb = 0) or of a ([M], ta = 1) */
        int of_b = ir_attr_i(in->n, "bgrad", 1) != 0;
        if (a->rank != 2 || b->rank != 2) FAIL("matmul_bgrad: %s x %s: rank-2 operands only", tstr(a, x), tstr(b, y));
        if (of_b ? tb : !ta) FAIL("matmul_bgrad: the bias gradient of %s needs %s", of_b ? "b" : "a", of_b ? "tb = 0" : "ta = 1");
        out[1] = out[0];
        out[1].rank = 1, out[1].dim[0] = of_b ? N : M;
    }
    return 0;
}

/* ---- library ops: norms, softmax, rope ---- */

/* layernorm, rmsnorm: (x, weights of x's last dim); layernorm's bias is
 * optional (issue 17) */
static int infer_norm(const Infer *in, Type out[], char *err, size_t errlen) {
    const Type *const *t = in->t, *xt = t[0];
    char x[96], y[96];
    if (in->n->op == OP_layernorm && in->n->nin != 2 && in->n->nin != 3)
        FAIL("layernorm: takes x, w and an optional b, got %d inputs", in->n->nin);
    if (need_float(xt, in->op, "x", err, errlen)) return -1;
    if (xt->rank < 1) FAIL("%s: x must have rank >= 1", in->op);
    for (int i = 1; i < in->n->nin; i++)
        if (t[i]->rank != 1 || t[i]->dim[0] != xt->dim[xt->rank - 1] || t[i]->dt != xt->dt)
            FAIL("%s: weight %s does not match the last dim of %s", in->op, tstr(t[i], x), tstr(xt, y));
    out[0] = *xt;
    return 0;
}

/* layernorm_bwd, rmsnorm_bwd: (dy, x, w) -> dx and the weights' gradients */
static int infer_norm_bwd(const Infer *in, Type out[], char *err, size_t errlen) {
    const Type *const *t = in->t;
    if (same_type(t[0], t[1], in->op, err, errlen)) return -1;
    if (t[2]->rank != 1 || t[1]->rank < 1 || t[2]->dim[0] != t[1]->dim[t[1]->rank - 1]) FAIL("%s: weight does not match x", in->op);
    out[0] = *t[1];
    out[1] = out[2] = *t[2];
    return 0;
}

static int infer_softmax(const Infer *in, Type out[], char *err, size_t errlen) {
    if (need_float(in->t[0], in->op, "x", err, errlen)) return -1;
    if (in->t[0]->rank < 1) FAIL("softmax: x must have rank >= 1");
    out[0] = *in->t[0];
    return 0;
}

static int infer_softmax_bwd(const Infer *in, Type out[], char *err, size_t errlen) {
    if (same_type(in->t[0], in->t[1], in->op, err, errlen)) return -1;
    out[0] = *in->t[0];
    return 0;
}

/* rope, rope_bwd: (x [B,T,H,D], pos [T]) */
static int infer_rope(const Infer *in, Type out[], char *err, size_t errlen) {
    const Type *const *t = in->t;
    const char *op = in->op;
    char x[96], y[96];
    if (need_float(t[0], op, "x", err, errlen) || need_int(t[1], op, "pos", err, errlen)) return -1;
    if (t[0]->rank != 4 || t[0]->dim[3] % 2) FAIL("%s: x must be [B,T,H,D] with even D, got %s", op, tstr(t[0], x));
    if (t[1]->rank != 1 || t[1]->dim[0] != t[0]->dim[1]) FAIL("%s: pos %s must be [T] for x %s", op, tstr(t[1], x), tstr(t[0], y));
    out[0] = *t[0];
    return 0;
}

/* dropout (issue 17): (x [B,T,..], step f32[], rows i32[B], pos i32[T]) {p in [0,1)} */
static int infer_dropout(const Infer *in, Type out[], char *err, size_t errlen) {
    const Type *const *t = in->t;
    char x[96], y[96];
    double p = ir_attr_f(in->n, "p", -1);
    if (need_float(t[0], "dropout", "x", err, errlen) || need_int(t[2], "dropout", "rows", err, errlen) ||
        need_int(t[3], "dropout", "pos", err, errlen)) return -1;
    if (t[0]->rank < 2) FAIL("dropout: x must be [B,T,...] (batch, sequence first), got %s", tstr(t[0], x));
    if (t[1]->rank != 0 || t[1]->dt != DT_F32) FAIL("dropout: step must be f32[], got %s", tstr(t[1], x));
    if (t[2]->rank != 1 || t[2]->dim[0] != t[0]->dim[0]) FAIL("dropout: rows %s must be [B] for x %s", tstr(t[2], x), tstr(t[0], y));
    if (t[3]->rank != 1 || t[3]->dim[0] != t[0]->dim[1]) FAIL("dropout: pos %s must be [T] for x %s", tstr(t[3], x), tstr(t[0], y));
    if (!(p >= 0 && p < 1)) FAIL("dropout: p must be in [0, 1), got %g", p);
    out[0] = *t[0];
    return 0;
}

/* ---- library ops: attention ---- */

/* q, k, v are t[first..first+2] (attention_bwd: after do); the optional
 * qpos, kpos follow the op's nfixed other inputs (3, or 6 after lse). */
static int check_attention(const Node *n, const Type *const *t, int first, int nfixed, char *err, size_t errlen) {
    char x[96], y[96];
    const char *op = ir_ops[n->op].name;
    int npos = n->nin - nfixed;
    if (npos != 0 && npos != 2)
        FAIL("%s: takes %d inputs, or %d with qpos and kpos, got %d", op, nfixed, nfixed + 2, n->nin);
    const Type *q = t[first], *k = t[first + 1], *v = t[first + 2];
    for (int i = 0; i < 3; i++)
        if (need_float((const Type *[]){q, k, v}[i], "attention", "q/k/v", err, errlen)) return -1;
    if (q->rank != 4 || k->rank != 4 || v->rank != 4) FAIL("attention: q, k, v must be [B,H,T,D]");
    if (!ir_type_eq(k, v)) FAIL("attention: k %s and v %s differ", tstr(k, x), tstr(v, y));
    if (q->dt != k->dt) FAIL("attention: q and k dtypes differ");
    if (q->dim[0] != k->dim[0] || q->dim[3] != k->dim[3])
        FAIL("attention: q %s and k %s differ in batch or head dim", tstr(q, x), tstr(k, y));
    if (k->dim[1] < 1 || q->dim[1] % k->dim[1] != 0)
        FAIL("attention: %lld query heads not a multiple of %lld kv heads", (long long)q->dim[1], (long long)k->dim[1]);
    int64_t w = ir_attr_i(n, "window", 0);
    if (w < 0 || w > INT32_MAX) FAIL("%s: window %lld must be in [0, 2^31-1] (0: none)", op, (long long)w);
    if (w && !ir_attr_i(n, "causal", 0)) FAIL("%s: window %lld needs causal", op, (long long)w);
    if (npos == 0 && ir_attr_i(n, "causal", 0) && q->dim[2] != k->dim[2])
        FAIL("attention: causal without positions needs equal query and key lengths (%lld vs %lld)",
             (long long)q->dim[2], (long long)k->dim[2]);
    for (int i = 0; i < npos; i++) {
        const Type *p = t[nfixed + i];
        int64_t len = (i ? k : q)->dim[2];
        if (p->dt != DT_I32 || p->rank != 1 || p->dim[0] != len)
            FAIL("%s: %s must be i32[%lld] (the %s length), got %s", op, i ? "kpos" : "qpos", (long long)len,
                 i ? "key" : "query", tstr(p, x));
    }
    return 0;
}

static int infer_attention(const Infer *in, Type out[], char *err, size_t errlen) {
    const Type *const *t = in->t;
    if (check_attention(in->n, t, 0, 3, err, errlen)) return -1;
    out[0] = *t[0];
    out[1] = (Type){.dt = DT_F32, .rank = 3, .dim = {t[0]->dim[0], t[0]->dim[1], t[0]->dim[2]}};
    return 0;
}

static int infer_attention_bwd(const Infer *in, Type out[], char *err, size_t errlen) {
    const Type *const *t = in->t;
    char x[96], y[96];
    if (check_attention(in->n, t, 1, 6, err, errlen)) return -1;
    if (same_type(t[0], t[1], in->op, err, errlen) || same_type(t[4], t[1], in->op, err, errlen)) return -1;
    if (t[5]->dt != DT_F32 || t[5]->rank != 3 || t[5]->dim[0] != t[1]->dim[0] || t[5]->dim[1] != t[1]->dim[1] ||
        t[5]->dim[2] != t[1]->dim[2])
        FAIL("attention_bwd: lse %s must be f32[B,H,T] for q %s", tstr(t[5], x), tstr(t[1], y));
    out[0] = *t[1];
    out[1] = *t[2];
    out[2] = *t[3];
    return 0;
}

static int infer_attn_merge(const Infer *in, Type out[], char *err, size_t errlen) {
    const Type *const *t = in->t;
    const char *op = in->op;
    char x[96], y[96];
    if (need_float(t[0], op, "o_a", err, errlen) || same_type(t[0], t[2], op, err, errlen) || same_type(t[1], t[3], op, err, errlen)) return -1;
    if (t[0]->rank != 4 || t[1]->dt != DT_F32 || t[1]->rank != 3 || t[1]->dim[0] != t[0]->dim[0] ||
        t[1]->dim[1] != t[0]->dim[1] || t[1]->dim[2] != t[0]->dim[2])
        FAIL("attn_merge: o %s must be [B,H,T,D] and lse %s f32[B,H,T]", tstr(t[0], x), tstr(t[1], y));
    out[0] = *t[0];
    out[1] = *t[1];
    return 0;
}

/* ---- library ops: embedding, cross entropy, loss ---- */

static int infer_embedding(const Infer *in, Type out[], char *err, size_t errlen) {
    const Type *const *t = in->t;
    char x[96];
    if (need_float(t[0], in->op, "table", err, errlen) || need_int(t[1], in->op, "ids", err, errlen)) return -1;
    if (t[0]->rank != 2) FAIL("embedding: table must be [V,C], got %s", tstr(t[0], x));
    if (t[1]->rank + 1 > IR_MAXRANK) FAIL("embedding: ids rank too large");
    out[0] = *t[1];
    out[0].dt = t[0]->dt;
    out[0].dim[out[0].rank++] = t[0]->dim[1];
    return 0;
}

static int infer_embedding_bwd(const Infer *in, Type out[], char *err, size_t errlen) {
    const Type *const *t = in->t;
    char x[96], y[96];
    int64_t v = ir_attr_i(in->n, "v", 0);
    if (need_float(t[0], in->op, "dy", err, errlen) || need_int(t[1], in->op, "ids", err, errlen)) return -1;
    if (v < 1) FAIL("embedding_bwd: needs a vocabulary size v");
    if (t[0]->rank != t[1]->rank + 1) FAIL("embedding_bwd: dy %s does not match ids %s", tstr(t[0], x), tstr(t[1], y));
    for (int i = 0; i < t[1]->rank; i++)
        if (t[0]->dim[i] != t[1]->dim[i]) FAIL("embedding_bwd: dy %s does not match ids %s", tstr(t[0], x), tstr(t[1], y));
    out[0] = (Type){.dt = t[0]->dt, .rank = 2, .dim = {v, t[0]->dim[t[0]->rank - 1]}};
    return 0;
}

/* cross_entropy (logits, targets), cross_entropy_bwd (dl, logits, targets) */
static int infer_cross_entropy(const Infer *in, Type out[], char *err, size_t errlen) {
    const Type *const *t = in->t;
    const char *op = in->op;
    char x[96], y[96];
    int fwd = in->n->op == OP_cross_entropy, fused = in->n->op == OP_cross_entropy_fused;
    const Type *lg = t[fwd ? 0 : 1], *tg = t[fwd ? 1 : 2];
    if (need_float(lg, op, "logits", err, errlen) || need_int(tg, op, "targets", err, errlen)) return -1;
    int ok = lg->rank == tg->rank + 1;
    for (int i = 0; ok && i < tg->rank; i++) ok = lg->dim[i] == tg->dim[i];
    if (!ok) FAIL("%s: logits %s do not match targets %s", op, tstr(lg, x), tstr(tg, y));
    Type per_tok = *tg;
    per_tok.dt = DT_F32;
    if (!fwd && !ir_type_eq(t[0], &per_tok)) FAIL("%s: dl must be %s", op, tstr(&per_tok, x));
    out[0] = fwd ? per_tok : *lg;
    if (fused) out[1] = per_tok;
    return 0;
}

static int infer_loss(const Infer *in, Type out[], char *err, size_t errlen) {
    char x[96];
    if (in->t[0]->dt != DT_F32 || in->t[0]->rank != 0) FAIL("loss: must be a scalar f32, got %s", tstr(in->t[0], x));
    out[0] = *in->t[0];
    return 0;
}

/* ---- optimizer ---- */

/* lr_cosine, clipscale: f32[] -> f32[] */
static int infer_scalar_fn(const Infer *in, Type out[], char *err, size_t errlen) {
    if (in->t[0]->dt != DT_F32 || in->t[0]->rank != 0) FAIL("%s: input must be f32[]", in->op);
    out[0] = scalar_f32();
    return 0;
}

static int infer_adamw(const Infer *in, Type out[], char *err, size_t errlen) {
    const Type *const *t = in->t;
    for (int i = 1; i < 4; i++)
        if (same_type(t[0], t[i], in->op, err, errlen)) return -1;
    for (int i = 4; i < 7; i++)
        if (t[i]->dt != DT_F32 || t[i]->rank != 0) FAIL("adamw: lr, scale and t must be f32[]");
    out[0] = out[1] = out[2] = *t[0];
    return 0;
}

/* ---- communication ---- */

/* allreduce, reducescatter, allgather, shard, send over {group} */
static int infer_comm(const Infer *in, Type out[], char *err, size_t errlen) {
    const Node *n = in->n;
    const Type *x = in->t[0];
    const char *op = in->op;
    const char *group = ir_attr_s(n, "group", NULL);
    if (!group || ir_group_mask(group) <= 0) FAIL("%s: needs a group attribute (dp, cp, tp, pp or a+b)", op);
    int mask = ir_group_mask(group), size = 1;
    for (int a = 0; a < IR_NAXES; a++)
        if (mask & (1 << a)) size *= in->g->m->mesh[a];
    out[0] = *x;
    if (n->op == OP_reducescatter || n->op == OP_allgather || n->op == OP_shard) {
        int d = dim_attr(n, "dim", x->rank);
        if (d < 0) FAIL("%s: dim out of range for rank %d", op, x->rank);
        if (n->op != OP_allgather) {
            if (x->dim[d] % size) FAIL("%s: dim %d of size %lld not divisible by group size %d", op, d, (long long)x->dim[d], size);
            out[0].dim[d] = x->dim[d] / size;
        } else {
            if (x->dim[d] > IR_MAXNUMEL / size) FAIL("%s: dim %d too large", op, d);
            out[0].dim[d] = x->dim[d] * size;
        }
    }
    return 0;
}

/* The shape rule of each op (sources: infer_source). */
static const InferFn infer_op[OP_COUNT] = {
    [OP_output] = infer_named_sink, [OP_assign] = infer_named_sink, [OP_record] = infer_sync, [OP_wait] = infer_sync,
    [OP_offload] = infer_copy, [OP_reload] = infer_copy,
    [OP_add] = infer_binary, [OP_sub] = infer_binary, [OP_mul] = infer_binary, [OP_div] = infer_binary,
    [OP_gelu_bwd] = infer_binary, [OP_silu_bwd] = infer_binary, [OP_relu_bwd] = infer_binary,
    [OP_neg] = infer_unary, [OP_exp] = infer_unary, [OP_log] = infer_unary, [OP_sqrt] = infer_unary,
    [OP_rsqrt] = infer_unary, [OP_tanh] = infer_unary, [OP_gelu] = infer_unary, [OP_silu] = infer_unary,
    [OP_relu] = infer_unary, [OP_cast] = infer_cast,
    /* issue 17 */
    [OP_sigmoid] = infer_unary, [OP_abs] = infer_unary, [OP_pow] = infer_pow, [OP_minimum] = infer_binary,
    [OP_maximum] = infer_binary, [OP_where] = infer_ternary, [OP_abs_bwd] = infer_binary,
    [OP_minimum_bwd] = infer_ternary, [OP_maximum_bwd] = infer_ternary,
    [OP_sum] = infer_reduce, [OP_mean] = infer_reduce, [OP_max] = infer_reduce, [OP_max_bwd] = infer_max_bwd,
    [OP_sumsq] = infer_sumsq,
    [OP_reshape] = infer_reshape, [OP_transpose] = infer_transpose, [OP_slice] = infer_slice,
    [OP_concat] = infer_concat, [OP_broadcast] = infer_broadcast, [OP_sumto] = infer_sumto,
    [OP_matmul] = infer_matmul, [OP_matmul_bias] = infer_matmul, [OP_matmul_bias_gelu] = infer_matmul,
    [OP_matmul_dgelu_bgrad] = infer_matmul, [OP_matmul_bgrad] = infer_matmul,
    [OP_layernorm] = infer_norm, [OP_rmsnorm] = infer_norm, [OP_layernorm_bwd] = infer_norm_bwd,
    [OP_rmsnorm_bwd] = infer_norm_bwd, [OP_softmax] = infer_softmax, [OP_softmax_bwd] = infer_softmax_bwd,
    [OP_rope] = infer_rope, [OP_rope_bwd] = infer_rope, [OP_dropout] = infer_dropout,
    [OP_attention] = infer_attention, [OP_attention_bwd] = infer_attention_bwd, [OP_attn_merge] = infer_attn_merge,
    [OP_embedding] = infer_embedding, [OP_embedding_bwd] = infer_embedding_bwd,
    [OP_cross_entropy] = infer_cross_entropy, [OP_cross_entropy_bwd] = infer_cross_entropy, [OP_cross_entropy_fused] = infer_cross_entropy, [OP_loss] = infer_loss,
    [OP_lr_cosine] = infer_scalar_fn, [OP_clipscale] = infer_scalar_fn, [OP_adamw] = infer_adamw,
    [OP_allreduce] = infer_comm, [OP_reducescatter] = infer_comm, [OP_allgather] = infer_comm,
    [OP_shard] = infer_comm, [OP_send] = infer_comm, [OP_recv_done] = infer_comm,
};

/* The checks every op shares (defined inputs, arity), then the op's rule. */
static int infer_rule(const Graph *g, const Node *n, Type out[], char *err, size_t errlen) {
    const OpInfo *info = &ir_ops[n->op];
    Infer in = {.g = g, .n = n, .op = info->name};
    for (int i = 0; i < n->nin && i < 8; i++) {
        if (n->in[i] < 0 || n->in[i] >= g->nvals) FAIL("%s: input %d is not a defined value", in.op, i);
        in.t[i] = &g->vals[n->in[i]].t;
    }
    if (info->nin >= 0 ? n->nin != info->nin : n->nin < 1) FAIL("%s: expects %d inputs, got %d", in.op, info->nin, n->nin);
    if (info->flags & F_SOURCE) return infer_source(n, &out[0], err, errlen);
    if (!infer_op[n->op]) FAIL("%s: no shape rule", in.op);
    return infer_op[n->op](&in, out, err, errlen);
}

/* {out_dtype}: the precision pass's override of the float outputs' dtype
 * (a param gradient written in f32 by a node that reads bf16).  One dtype
 * for every float output ("f32"), or one per output, "-" keeping the rule's
 * ("-,f32,f32": layernorm_bwd's dx stays, dw and db are f32). */
static int apply_out_dtype(const Node *n, Type out[], char *err, size_t errlen) {
    const char *spec = ir_attr_s(n, "out_dtype", NULL), *op = ir_ops[n->op].name;
    int nout = ir_ops[n->op].nout;
    if (!spec) return 0;
    if (ir_ops[n->op].flags & F_SOURCE) FAIL("%s: out_dtype on a source (declare the type instead)", op);
    int single = strchr(spec, ',') == NULL;
    for (int o = 0; o < nout; o++) {
        char name[16];
        size_t len = strcspn(spec, ",");
        if (!*spec && !single) FAIL("%s: out_dtype \"%s\" needs one dtype per output (%d)", op, ir_attr_s(n, "out_dtype", ""), nout);
        if (len >= sizeof name) FAIL("%s: bad out_dtype", op);
        memcpy(name, spec, len), name[len] = 0;
        if (!single) spec += len + (spec[len] == ',');
        if (strcmp(name, "-") == 0) continue;
        int dt = ir_dtype_lookup(name);
        if (dt < 0 || !ir_dtype_is_float((DType)dt)) FAIL("%s: out_dtype \"%s\" is not a float dtype", op, name);
        if (ir_dtype_is_float(out[o].dt)) out[o].dt = (DType)dt;
        else if (!single) FAIL("%s: out_dtype for output %d, which is not float", op, o);
    }
    if (!single && *spec) FAIL("%s: out_dtype has more entries than the %d outputs", op, nout);
    return 0;
}

/* The op's rule and its out_dtype, then a bound on every output's size
 * (dims multiply, so a rule fed huge dims must not overflow int64). */
int ir_infer(const Graph *g, const Node *n, Type out[], char *err, size_t errlen) {
    if (infer_rule(g, n, out, err, errlen) < 0 || apply_out_dtype(n, out, err, errlen) < 0) return -1;
    for (int o = 0; o < ir_ops[n->op].nout; o++) {
        int64_t numel = 1;
        for (int i = 0; i < out[o].rank; i++) {
            if (out[o].dim[i] < 1 || out[o].dim[i] > IR_MAXNUMEL / numel)
                FAIL("%s: output %d has more than 2^48 elements", ir_ops[n->op].name, o);
            numel *= out[o].dim[i];
        }
    }
    return 0;
}

/* ---- mesh ---- */

int ir_world(const Module *m) {
    int w = 1;
    for (int a = 0; a < IR_NAXES; a++) w *= m->mesh[a];
    return w;
}

void ir_rank_coords(const Module *m, int r, int c[IR_NAXES]) {
    for (int a = IR_NAXES - 1; a >= 0; a--) {
        c[a] = r % m->mesh[a];
        r /= m->mesh[a];
    }
}

int ir_group_mask(const char *group) {
    static const char *const axes[IR_NAXES] = {"pp", "dp", "cp", "tp"};
    int mask = 0;
    const char *p = group;
    for (;;) {
        int hit = -1;
        for (int a = 0; a < IR_NAXES; a++)
            if (strncmp(p, axes[a], 2) == 0) hit = a;
        if (hit < 0 || (mask & (1 << hit))) return -1;
        mask |= 1 << hit;
        p += 2;
        if (*p == 0) return mask;
        if (*p++ != '+') return -1;
    }
}

int ir_group_members(const Module *m, int r, int mask, int *members, int *index) {
    int c[IR_NAXES], cnt = 0, world = ir_world(m);
    ir_rank_coords(m, r, c);
    for (int q = 0; q < world; q++) {
        int d[IR_NAXES], same = 1;
        ir_rank_coords(m, q, d);
        for (int a = 0; a < IR_NAXES; a++)
            if (!(mask & (1 << a)) && d[a] != c[a]) same = 0;
        if (!same) continue;
        if (q == r && index) *index = cnt;
        if (members) members[cnt] = q;
        cnt++;
    }
    return cnt;
}

int ir_group_size(const Module *m, const Node *n) {
    int mask = ir_group_mask(ir_attr_s(n, "group", "")), size = 1;
    for (int a = 0; mask > 0 && a < IR_NAXES; a++)
        if (mask & (1 << a)) size *= m->mesh[a];
    return size;
}

int ir_bucket_member(const Node *n, int k, char *name, size_t len, int64_t *offset) {
    const char *p = ir_attr_s(n, "params", NULL);
    const Attr *off = ir_attr(n, "offsets");
    if (!p || !off || off->kind != AT_INTS || k < 0 || k >= off->n || len == 0) return -1;
    for (int i = 0; i < k; i++)
        if (!(p = strchr(p, ','))) return -1;
        else p++;
    size_t m = strcspn(p, ",");
    if (m >= len) m = len - 1;
    memcpy(name, p, m);
    name[m] = 0;
    *offset = off->v[k];
    return 0;
}

/* ---- a FLOP model (ir.h) ---- */

/* floating-point operations per element of the node's first input (or
 * output) for the ops that are not GEMMs or attention */
static double per_element(Op op) {
    switch (op) {
    case OP_add: case OP_sub: case OP_mul: case OP_div: case OP_neg: case OP_relu: case OP_relu_bwd:
    case OP_sum: case OP_mean: case OP_max: case OP_max_bwd: case OP_sumto: case OP_embedding_bwd: return 1;
    case OP_sumsq: return 2;
    case OP_exp: case OP_log: case OP_sqrt: case OP_rsqrt: return 4;
    case OP_tanh: case OP_silu: case OP_silu_bwd: return 8;
    case OP_abs: case OP_minimum: case OP_maximum: case OP_where: case OP_abs_bwd: return 1; /* issue 17 */
    case OP_minimum_bwd: case OP_maximum_bwd: return 2;
    case OP_sigmoid: return 6;
    case OP_pow: return 8;
    case OP_gelu: case OP_gelu_bwd: return 12;
    case OP_rope: case OP_rope_bwd: return 3;
    case OP_dropout: return 2;
    case OP_rmsnorm: return 5;
    case OP_rmsnorm_bwd: return 8;
    case OP_layernorm: return 8;
    case OP_layernorm_bwd: return 12;
    case OP_softmax: case OP_cross_entropy: case OP_cross_entropy_bwd: return 6;
    case OP_cross_entropy_fused: return 12;
    case OP_softmax_bwd: case OP_attn_merge: return 4;
    case OP_adamw: return 12;
    default: return 0; /* sources, sinks, shape ops, casts, communication, sync */
    }
}

double ir_node_flops(const Graph *g, const Node *n) {
    unsigned fl = ir_ops[n->op].flags;
    if (fl & F_GEMM) {
        const Type *a = &g->vals[n->in[0]].t, *y = &g->vals[n->out[0]].t;
        int64_t K = a->dim[a->rank - 1 - (ir_attr_i(n, "ta", 0) != 0)];
        return 2.0 * (double)ir_numel(y) * (double)K;
    }
    if (n->op == OP_attention || n->op == OP_attention_bwd) {
        int bwd = n->op == OP_attention_bwd;
        const Type *q = &g->vals[n->in[bwd]].t, *k = &g->vals[n->in[bwd + 1]].t;
        double T = (double)q->dim[2], pairs = T * (double)k->dim[2], w = (double)ir_attr_i(n, "window", 0);
        if (ir_attr_i(n, "causal", 0)) pairs *= 0.5;
        if (w > 0 && w * T < pairs) pairs = w * T; /* a window of w keys per query */
        double f = 4.0 * (double)q->dim[0] * (double)q->dim[1] * pairs * (double)q->dim[3];
        return bwd ? 2.5 * f : f;
    }
    const Type *t = n->nin ? &g->vals[n->in[n->op == OP_embedding_bwd || n->op == OP_cross_entropy_bwd || n->op == OP_cross_entropy_fused ? 1 : 0]].t
                           : n->nout ? &g->vals[n->out[0]].t : NULL;
    return t ? per_element(n->op) * (double)ir_numel(t) : 0;
}

int64_t ir_index_bound(const Graph *g, int vid, int64_t dflt) {
    int64_t bound = INT64_MAX;
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        for (int k = 0; k < n->nin; k++) {
            if (n->in[k] != vid) continue;
            int64_t b = INT64_MAX;
            if (n->op == OP_embedding) b = g->vals[n->in[0]].t.dim[0];
            if ((n->op == OP_cross_entropy && k == 1) || (n->op == OP_cross_entropy_fused && k == 2)) {
                const Type *t = &g->vals[n->in[n->op == OP_cross_entropy_fused]].t;
                b = t->dim[t->rank - 1];
            }
            if (b < bound) bound = b;
        }
    }
    return bound == INT64_MAX ? dflt : bound;
}

const char *ir_where(const Node *n, char *buf, size_t len) {
    snprintf(buf, len, "%s:%d", n->loc.file ? n->loc.file : "?", n->loc.line);
    return buf;
}
