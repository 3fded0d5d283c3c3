/* graphbuild.h — building IR graphs by hand in tests (include after testutil.h).
 *
 *     Bld b = bld_new("t", "t.lua");          module "t", nodes at t.lua:1, :2, ...
 *     int x = input(&b, "x", TY(DT_F32, 4, 2));
 *     int y = val(&b, OP_sum, INS(x), ATS(ai(&b, "dim", 0), ai(&b, "keep", 0)));
 *     output(&b, y, "y");
 *
 * node() adds one node (failing the test if ir_add_node refuses it) and
 * returns its id; val() returns the id of its first output value.  Each node
 * gets the next source line.  While b.kernel >= 0 every new node also gets the
 * attribute {kernel=K} (at most 7 attributes of its own then).
 */
#ifndef KILN_GRAPHBUILD_H
#define KILN_GRAPHBUILD_H
#include "testutil.h"

typedef struct {
    Module *m;
    Graph *g;  /* m->stages[0] */
    Loc loc;   /* of the next node */
    int kernel; /* >= 0: new nodes get {kernel=K} */
} Bld;

static inline Bld bld_new(const char *module, const char *file) {
    Bld b = {ir_module_new(module), NULL, {0}, -1};
    b.g = b.m->stages[0];
    b.loc = (Loc){ir_intern(b.m, file), 1};
    return b;
}

/* inputs and attributes as argument pairs: f(..., INS(x, y), ATS(a, b)) or NOATS */
#define INS(...) (const int[]){__VA_ARGS__}, (int)(sizeof((int[]){__VA_ARGS__}) / sizeof(int))
#define ATS(...) (const Attr[]){__VA_ARGS__}, (int)(sizeof((Attr[]){__VA_ARGS__}) / sizeof(Attr))
#define NOATS NULL, 0
/* a type: TY(DT_F32, 2, 3); SCALAR is an f32 scalar */
#define TY(dt, ...) ty(dt, (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__})
#define SCALAR ((Type){.dt = DT_F32, .rank = 0})

static inline Type ty(DType dt, int rank, const int64_t *d) {
    Type t = {.dt = dt, .rank = rank};
    for (int i = 0; i < rank; i++) t.dim[i] = d[i];
    return t;
}

static inline int node(Bld *b, Op op, const int *in, int nin, const Attr *at, int nat, const Type *src) {
    Attr all[8];
    if (b->kernel >= 0) {
        assert_true(nat < 8);
        for (int i = 0; i < nat; i++) all[i] = at[i];
        all[nat++] = ir_attr_int(b->m, "kernel", b->kernel);
        at = all;
    }
    NodeSpec s = ir_spec(op, b->loc);
    s.in = in;
    s.nin = nin;
    s.attr = at;
    s.nattr = nat;
    s.src_type = src;
    char err[256];
    int n = ir_add_node(b->g, &s, err, sizeof err);
    if (n < 0) fail_msg("ir_add_node: %s", err);
    b->loc.line++;
    return n;
}

/* value id of the node's first output */
static inline int val(Bld *b, Op op, const int *in, int nin, const Attr *at, int nat) {
    return ir_out(b->g, node(b, op, in, nin, at, nat, NULL));
}

static inline Attr ai(Bld *b, const char *k, int64_t v) { return ir_attr_int(b->m, k, v); }
static inline Attr af(Bld *b, const char *k, double v) { return ir_attr_float(b->m, k, v); }
static inline Attr as(Bld *b, const char *k, const char *v) { return ir_attr_str(b->m, k, v); }
static inline Attr shape(Bld *b, const Type t) { return ir_attr_ints(b->m, "shape", t.dim, t.rank); }

/* source ops (each returns its value) and sinks */
static inline int input(Bld *b, const char *name, Type t) {
    return ir_out(b->g, node(b, OP_input, NULL, 0, ATS(as(b, "name", name)), &t));
}
static inline int param(Bld *b, const char *name, Type t, const char *init, double std) {
    return ir_out(b->g, node(b, OP_param, NULL, 0, ATS(as(b, "name", name), as(b, "init", init), af(b, "std", std)), &t));
}
static inline int state(Bld *b, const char *name, Type t) {
    return ir_out(b->g, node(b, OP_state, NULL, 0, ATS(as(b, "name", name)), &t));
}
static inline int cnst(Bld *b, Type t, double v) {
    return ir_out(b->g, node(b, OP_const, NULL, 0, ATS(af(b, "v", v)), &t));
}
static inline void output(Bld *b, int v, const char *name) { node(b, OP_output, INS(v), ATS(as(b, "name", name)), NULL); }
static inline void assign(Bld *b, int v, const char *name) { node(b, OP_assign, INS(v), ATS(as(b, "name", name)), NULL); }
static inline int bcast(Bld *b, int x, Type to) { return val(b, OP_broadcast, INS(x), ATS(shape(b, to))); }
#endif
