/* ir.h — the one IR header of kiln.
 *
 * A Module holds one Graph per pipeline stage (one until the pipeline pass).
 * A Graph is SSA: Nodes (an op from ops.def, input values, attributes)
 * define Values (dtype + static shape of rank <= 5, and after parallelize a
 * sharding per mesh axis).  Values and nodes are kept in arrays and named by
 * index; a value's id is its index, and nodes appear in a valid execution
 * order (every input is defined by an earlier node).
 *
 * Every node carries a Loc (the model's file:line that created it), its layer,
 * phase, pipeline stage, virtual stage and micro-batch, and after `schedule`
 * its stream and position.  Parameters, optimizer state and data inputs are
 * ordinary source nodes (param/state/input) named by an attribute, so one
 * training step is one self-contained module and the text dump is the whole
 * program.
 *
 * Memory: everything a module owns comes from its arena and is freed at once
 * by ir_free().  Growable arrays are re-allocated from the arena (doubling),
 * so pointers to nodes and values are invalidated by ir_add_node; keep ids.
 */
#ifndef KILN_IR_H
#define KILN_IR_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define IR_MAXRANK 5
#define IR_MAXNUMEL ((int64_t)1 << 48) /* the largest tensor the IR accepts */
#define IR_MAXIN 256 /* inputs of one node (concat's list): the passes size arrays by it */
#define IR_NAXES 4 /* mesh axes pp, dp, cp, tp (tp fastest-varying) */

typedef enum {
#define OP(name, nin, nout, flags, doc) OP_##name,
#include "ops.def"
#undef OP
    OP_COUNT
} Op;

enum { /* op flags: the properties passes ask for (ops.def: when a pass may name an op) */
    F_SOURCE = 1 << 0,      /* no inputs, declared output type */
    F_SINK = 1 << 1,        /* no outputs, has an effect */
    F_ELEMENTWISE = 1 << 2,
    F_REDUCTION = 1 << 3,
    F_SHAPE = 1 << 4,       /* moves/reinterprets data only */
    F_GEMM = 1 << 5,
    F_EXPENSIVE = 1 << 6,   /* never recomputed under gemm-last */
    F_LIBRARY = 1 << 7,     /* a hand-written kernel, not a fused one */
    F_COMM = 1 << 8,
    F_STATE = 1 << 9,       /* reads persistent state */
    F_LOSS = 1 << 10,
    F_OPTIMIZER = 1 << 11,
    F_COPY = 1 << 12,       /* device copies (offload) */
    F_SYNC = 1 << 13,       /* stream events (record/wait) */
    F_VIEW = 1 << 14,       /* the output is the input's bytes: memplan gives it the input's buffer */
    F_INPLACE = 1 << 15,    /* the output may be written over an input of its type (live.h ir_inplace_conflict) */
};

typedef struct {
    const char *name;
    int nin, nout; /* nin -1: variadic */
    unsigned flags;
    const char *doc;
} OpInfo;
extern const OpInfo ir_ops[OP_COUNT];
int ir_op_lookup(const char *name); /* -1 if unknown */

typedef enum { DT_F32, DT_BF16, DT_F16, DT_I32, DT_I64, DT_COUNT } DType;
extern const char *const ir_dtype_names[DT_COUNT];
int ir_dtype_lookup(const char *name); /* -1 if unknown */
int ir_dtype_is_float(DType dt);
size_t ir_dtype_size(DType dt);

typedef struct {
    DType dt;
    int rank;
    int64_t dim[IR_MAXRANK];
} Type;
int64_t ir_numel(const Type *t);
int ir_type_eq(const Type *a, const Type *b);
/* "f32[8,1024,768]" into buf; returns buf */
char *ir_type_str(const Type *t, char *buf, size_t n);

typedef enum { SH_REP, SH_SPLIT, SH_PARTIAL } ShardKind;
typedef struct {
    ShardKind kind;
    int dim; /* SH_SPLIT: the split dim */
} AxisShard;

typedef struct {
    int id;
    Type t;
    int def;     /* defining node index, -1 for none */
    int defout;  /* which output of that node */
    AxisShard sh[IR_NAXES];
    int space;      /* after memplan: its Space; -1 before */
    int64_t offset; /* after memplan: byte offset in that space; -1 before */
} Value;

/* The memory spaces memplan places buffers in (Value.space).  The IR's own
 * names: the emitters map them to the runtime ABI's RT_SPACE_*.  SPACE_HOST
 * is host memory (pinned on CUDA): the outputs of `offload` (offload.c);
 * the runtime has no such space yet, so the emitters refuse it. */
typedef enum { SPACE_PARAMS, SPACE_GRADS, SPACE_OPT, SPACE_ACT, SPACE_HOST, SPACE_COUNT } Space;
const char *ir_space_name(int space); /* "params", "grads", "opt", "act", "host"; "?" for any other */
int64_t ir_value_bytes(const Value *v); /* numel * dtype size */

typedef struct {
    const char *file; /* interned; NULL means "no location" (the verifier rejects it) */
    int line;
} Loc;

/* PH_WGRAD: the weight-gradient part of the backward that the zero-bubble
 * pipeline schedules defer (pp.c, the W actions); bwd is then the rest. */
typedef enum { PH_FWD, PH_BWD, PH_RECOMPUTE, PH_OPT, PH_WGRAD, PH_COUNT } Phase;
extern const char *const ir_phase_names[PH_COUNT];

/* The recompute policy a module was built under (recompute.c; RC_UNSET
 * before that pass).  The verifier holds a gemm-last module to its promise:
 * no GEMM and no attention in phase recompute. */
typedef enum { RC_UNSET, RC_NONE, RC_FULL, RC_SELECTIVE, RC_GEMM_LAST, RC_COUNT } Recompute;
extern const char *const ir_recompute_names[RC_COUNT]; /* "", "none", "full", "selective", "gemm-last" */
int ir_recompute_lookup(const char *name);             /* -1 if unknown */

typedef enum { AT_INT, AT_FLOAT, AT_STR, AT_INTS } AttrKind;
typedef struct {
    const char *key; /* interned */
    AttrKind kind;
    int64_t i;
    double f;
    const char *s;
    int n;           /* AT_INTS: count */
    int64_t *v;      /* AT_INTS: values */
} Attr;

typedef struct {
    Op op;
    int nin, nout;
    int *in;   /* value ids */
    int *out;  /* value ids */
    int nattr;
    Attr *attr;
    Loc loc;
    int layer;   /* -1: outside any layer */
    Phase phase;
    int stage, vstage, mb; /* pipeline stage, virtual stage, micro-batch (0 until pipeline) */
    int stream, pos;       /* after schedule; -1 before */
} Node;

typedef struct Module Module;

typedef struct {
    Module *m;
    Node *nodes;
    int nnodes, capnodes;
    Value *vals;
    int nvals, capvals;
} Graph;

typedef struct Arena Arena;

struct Module {
    Arena *arena;
    const char *name;
    const char *sets;   /* the --set overrides it was built with, "k=v\n..." or NULL:
                         * metadata for checkpoints (kiln sample), not in the text form */
    int mesh[IR_NAXES]; /* pp, dp, cp, tp */
    Recompute recompute;
    Graph **stages;
    int nstages;
};

/* ---- arena and strings ---- */
void *ir_alloc(Module *m, size_t n);           /* zeroed, never NULL (aborts) */
const char *ir_intern(Module *m, const char *s); /* copy into the arena; same string -> same pointer */

/* ---- building ---- */
Module *ir_module_new(const char *name);       /* one empty stage, mesh 1x1x1x1 */
void ir_free(Module *m);
Graph *ir_graph_new(Module *m);                /* a fresh empty graph (not attached) */

/* A node under construction: fill op, inputs, attrs, loc, metadata, then
 * ir_add_node.  NodeSpec.layer defaults to -1 via ir_spec(). */
typedef struct {
    Op op;
    int nin;
    const int *in;
    int nattr;
    const Attr *attr;
    Loc loc;
    int layer;
    Phase phase;
    const Type *src_type; /* for F_SOURCE ops: the declared output type */
} NodeSpec;
NodeSpec ir_spec(Op op, Loc loc);

/* Infer output types, append the node and its output values.  Returns the
 * node index, or -1 with a one-line message (no location prefix) in err. */
int ir_add_node(Graph *g, const NodeSpec *s, char *err, size_t errlen);
/* For passes that build nodes: every node gets the builder's Loc, layer and
 * phase; a node the pass builds wrong is an internal error naming the pass. */
typedef struct {
    Graph *g;
    const char *pass;
    Loc loc;
    int layer;
    Phase phase;
} Builder;
int ir_build(Builder *b, Op op, int nin, const int *in, int nattr, const Attr *at, const Type *src); /* node index */
int ir_build1(Builder *b, Op op, int x, int nattr, const Attr *at); /* first output value */
int ir_build2(Builder *b, Op op, int x, int y);                      /* first output value */

/* Floating-point operations of node n, a model for cost decisions and
 * reports: 2MNK for a GEMM, 4BHTSD (half when causal, at most 4BHTWD with
 * a window of W keys) for attention and
 * 2.5x that for its backward, a small per-element count for the rest
 * (shape ops and communication: 0). */
double ir_node_flops(const Graph *g, const Node *n);

/* Exclusive bound of the ids an integer value may hold: the smallest table
 * or class count among the ops that index with it (embedding rows, the
 * classes of cross_entropy); dflt when nothing indexes with it. */
int64_t ir_index_bound(const Graph *g, int vid, int64_t dflt);

/* "file:line" of n's Loc ("?" without a file) into buf; returns buf. */
const char *ir_where(const Node *n, char *buf, size_t len);

/* Convenience: the first output value id of node index n. */
static inline int ir_out(const Graph *g, int n) { return g->nodes[n].out[0]; }

/* Shape and dtype rule of node n (its inputs and attrs) -> out[]; returns 0, or
 * -1 with a message in err.  Used by ir_add_node, the parser and the verifier. */
int ir_infer(const Graph *g, const Node *n, Type out[], char *err, size_t errlen);

/* ---- attributes ---- */
Attr ir_attr_int(Module *m, const char *key, int64_t v);
Attr ir_attr_float(Module *m, const char *key, double v);
Attr ir_attr_str(Module *m, const char *key, const char *v);
Attr ir_attr_ints(Module *m, const char *key, const int64_t *v, int n);
const Attr *ir_attr(const Node *n, const char *key); /* NULL if absent */
int64_t ir_attr_i(const Node *n, const char *key, int64_t dflt);
double ir_attr_f(const Node *n, const char *key, double dflt); /* AT_INT is converted */
const char *ir_attr_s(const Node *n, const char *key, const char *dflt);

/* ---- checking, text, equality ---- */
/* 0 if g is well formed; else -1 with "file:line: message" (node's Loc) in err. */
int ir_verify(const Graph *g, char *err, size_t errlen);
int ir_verify_module(const Module *m, char *err, size_t errlen);
/* The same for a module read from text: errors start "src:LINE: " with the
 * text line of the node (lines[stage][node]). */
int ir_verify_module_src(const Module *m, const char *src, int *const *lines, char *err, size_t errlen);

/* Text form (docs/ir.md): one node per line, read back by ir_parse. */
void ir_dump(const Module *m, FILE *f);
void ir_dump_dot(const Module *m, FILE *f);
/* Parse a dump; NULL with "name:line: message" in err on bad input. */
Module *ir_parse(const char *text, const char *name, char *err, size_t errlen);
/* A .ir file's len bytes as a command reads it: no NUL byte, parsed, verified
 * (errors name the .ir line), and, when need is a pass name, carrying the
 * marks of the passes up to need (ir_last_pass); else NULL and one line in err. */
Module *ir_parse_file(const char *text, size_t len, const char *name, const char *need, char *err, size_t errlen);
/* The last pass of the training pipeline whose marks m carries: "memplan"
 * (placed values), "schedule" (node positions), "optimizer" (opt-phase
 * nodes), "autodiff" (backward nodes), else "front". */
const char *ir_last_pass(const Module *m);
/* 1 if structurally identical (ops, types, attrs, metadata, locs, shardings, placements). */
int ir_module_equal(const Module *a, const Module *b);

/* ---- mesh ---- */
int ir_world(const Module *m); /* product of mesh */
/* coordinates of rank r: c[0]=pp, c[1]=dp, c[2]=cp, c[3]=tp */
void ir_rank_coords(const Module *m, int r, int c[IR_NAXES]);
/* Parse a group string ("dp", "cp", "dp+cp") into an axis mask; -1 if bad. */
int ir_group_mask(const char *group);
/* Members of rank r's group (ascending rank); returns count, fills members,
 * sets *index to r's position in it. */
int ir_group_members(const Module *m, int r, int mask, int *members, int *index);
/* Ranks in the group of a collective node's {group} attribute (1 without one). */
int ir_group_size(const Module *m, const Node *n);

/* A bucketed state of the distributed optimizer (optimizer.c; attrs bucket,
 * group, prefix, params="a,b,..", offsets=[..], n): member k's param name
 * (into name) and element offset in the flat bucket; -1 if there is no
 * member k. */
int ir_bucket_member(const Node *n, int k, char *name, size_t len, int64_t *offset);

/* calloc that never returns NULL (ICE when out of memory): the passes'
 * scratch, freed by the pass.  Module data comes from ir_alloc. */
void *xcalloc(size_t n, size_t sz);

/* ---- errors ---- */
/* User error at a model location: prints "file:line: msg" and exits 1. */
void error_at(Loc loc, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
/* Internal compiler error: prints the C file:line (and the model line of the
 * node being processed, the last one ir_ice_at or ir_build was given) and aborts. */
#define ICE(...) ir_ice(__FILE__, __LINE__, __VA_ARGS__)
void ir_ice(const char *file, int line, const char *fmt, ...) __attribute__((noreturn, format(printf, 3, 4)));
void ir_ice_at(Loc loc);

#endif
