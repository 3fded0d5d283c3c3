/* tp_overlap.c — tensor-parallel communication overlap by token chunks
 * (`--tp-chunks K`, issue 22; Megatron/TransformerEngine's "tp comm
 * overlap", DeepSpeed Domino).
 *
 * With sequence parallelism (parallelize.c, tp.c) each column/row pair of a
 * transformer layer reads an all-gather over tp on the sequence (dim 1 of
 * [B,T/tp,C] -> [B,T,C]) and ends in a reduce-scatter back to [B,T/tp,C].
 * Under --schedule lhs those collectives run on tp's own stream, but each
 * all-gather feeds the next GEMM and each reduce-scatter the next norm:
 * nothing in the micro-batch is independent of them, so their whole time is
 * exposed (docs/schedule.md, KILN_LHS_EXPOSED).
 *
 * The MLP between them is token-wise.  Cut the rank's local tokens [T/tp]
 * into K contiguous sub-chunks; the all-gather of sub-chunk i gives the rows
 * {(r', i) for every tp rank r'} ([B,T/K,C], rank-major); a token-wise chain
 * on those rows is independent of the other chunks; the reduce-scatter of
 * chunk i's output hands rank r exactly its own sub-chunk i back; a concat
 * of the K results on dim 1 restores the local layout.  So the chain becomes
 * K independent pipelines AG_i -> GEMM -> act -> GEMM -> RS_i, and the
 * scheduler overlaps AG_{i+1} and RS_{i-1} with chunk i's GEMMs.  The nodes
 * are emitted node-major (each original node's K copies together), so the
 * comm chain, whose order lhs keeps, is AG_0..AG_{K-1} then RS_0..RS_{K-1}:
 * every all-gather but the first can run under an earlier chunk's GEMM, and
 * every reduce-scatter but the last under a later one's.
 *
 * Which nodes.  Found by the graph, not by model names: a *seed* is an
 * all-gather {group="tp", dim=1} of a value split over tp on dim 1 (the sp
 * gathers); its output is a region value [B,T,..] (the gathered tokens at
 * dim 1; a transpose of dims 1 and 2 moves them to dim 2, attention's
 * [B,H,T,D]).  A node reading a region value joins the region when it is
 * token-wise: an elementwise op (its other inputs uniform along the tokens
 * — a broadcast bias, a constant: rebuilt at the chunk's shape — or whole
 * values read by chunk: Llama's residual stream, a partial sum over tp
 * until its reduce-scatter, sliced [B,tp,K,s,..] at i), a GEMM [B,T,K] x
 * W[K,N] with W independent of the data, a reshape that keeps dims 0 and
 * 1, a transpose, slice or concat away from the tokens, rope (each chunk
 * with its tokens' positions).  A reshape to rows [B*T, X] makes a *rows*
 * value, which only a weight-gradient GEMM (ta=1: it contracts the rows)
 * may read.  Attention (and its backward) needs the whole sequence: it
 * runs once over the chunks joined in chunk-major order (chunk i at
 * [iT/K, (i+1)T/K)) with the tokens' positions given explicitly (qpos,
 * kpos: the rank's positions [tp, K, s] with dims 0 and 1 swapped), so its
 * causal mask and window are the single device's, and its outputs are
 * sliced back into chunks where read.  Exits: a reduce-scatter
 * {group="tp", dim=1} (K of them, concatenated), a weight-gradient GEMM
 * whose two inputs are both rows values (below), a sumto that sums dims 0
 * and 1 away (a bias gradient: the K chunks' sums added).  Regions are the
 * connected components of these nodes (union-find): a layer's forward and
 * backward are one component (gelu_bwd reads the forward's pre-activation
 * chunk by chunk; every component chunks alike, so chunk i means the same
 * tokens everywhere).  A component with any other reader of a region value
 * (the LM head's logits, which the loss reads whole) is left as it is.
 *
 * Weight gradients contract over the tokens: dW = sum over chunks.  Two
 * ways: K partial GEMMs and K-1 adds of dW ([C,4C/tp] f32, 151M elements at
 * GPT-3 175B's tp 4: each add streams 1.8 GB), or one GEMM over the K chunks
 * concatenated (both inputs concatenated in the same chunk-major token order,
 * which a contraction over the tokens does not see): [B*T, C] and [B*T, F],
 * 25M elements each at that shape, 8x fewer bytes than one add.  The
 * concatenation wins by cost, and its memory is a transient copy of the
 * inputs (freed after the GEMM) against K partial dW buffers: kiln uses it.
 * Bias gradients (sumto to [F]) are K sums of chunks, added ([F]: small).
 *
 * Where in the pipeline: right after parallelize, which places the
 * collectives, and before recompute, so the recompute policy sees (and
 * saves or rebuilds) the chunks the backward reads, and before pipeline, so
 * pp.c's B/W split finds the dW GEMMs and their concats by the graph as W.
 * K = 1 (the default) leaves the module untouched.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "passes.h"

enum { R_NONE, R_SEED, R_TOK, R_RS, R_DW, R_SUMTO, R_ROPE, R_ATT, R_BAD };
/* region value kinds: the gathered tokens at dim 1 ([B,T,..]) or 2 ([B,H,T,D], attention's layout); rows [B*T, X] */
enum { K_NONE, K_TOK, K_TOK2, K_ROWS };

typedef struct {
    const Graph *g;
    int K, tp, bug; /* bug: --test-tp-bug chunk-order */
    int mlp_only;   /* KILN_TP_CHUNKS_MLP_ONLY=1: attention reads the sequence whole (its collectives stay whole) */
    int64_t Tg;     /* the gathered sequence (dim 1 of region values) */
    char *kind;     /* per value: K_* */
    char *role;     /* per node: R_* */
    char *var;      /* per value: depends on the data (inputs, positions) */
    char *uni;      /* per value: memo of uniform(): 0 unknown, 1 no, 2 yes */
    int *parent;    /* union-find over nodes */
    char *reject;   /* per root */
    int *nuse;      /* per value: readers */
    /* the rewrite */
    Builder b;
    int *map;       /* old value -> new value (whole) */
    int *chunk;     /* [old value][K]: chunk i of a region value */
    int *unic;      /* old uniform value -> its chunk-shaped copy */
    int *cat;       /* old rows value -> its chunks concatenated (chunk-major) */
    int *entry;     /* [old value][K]: chunk i of a whole value a token-wise op reads (entry_chunk) */
    int *whole;     /* old region value -> its chunks joined, chunk-major (attention's inputs and outputs) */
    int *perm;      /* old positions value (nvals: 0..T-1) -> the positions in chunk-major order */
    char *drop;     /* per node: a broadcast or const only chunked readers read (not copied) */
    char *att_only; /* per value: read, and only, by accepted attention nodes (emit_swap_whole) */
} Ov;

static const Node *def_of(const Ov *O, int v) {
    int d = O->g->vals[v].def;
    return d >= 0 ? &O->g->nodes[d] : NULL;
}
static const Type *vty(const Ov *O, int v) { return &O->g->vals[v].t; }

static int find(Ov *O, int x) {
    while (O->parent[x] != x) x = O->parent[x] = O->parent[O->parent[x]];
    return x;
}
static void unite(Ov *O, int a, int b) {
    a = find(O, a), b = find(O, b);
    if (a != b) O->parent[a] = b;
}
static int accepted(Ov *O, int node) { return !O->reject[find(O, node)]; }

/* An sp all-gather over tp: {group="tp", dim=1} of a [B,T/tp,C] value split over tp on dim 1. */
static int is_seed(const Ov *O, const Node *n) {
    if (n->op != OP_allgather || strcmp(ir_attr_s(n, "group", ""), "tp") || ir_attr_i(n, "dim", -1) != 1) return 0;
    const Value *x = &O->g->vals[n->in[0]];
    return x->t.rank == 3 && x->sh[3].kind == SH_SPLIT && x->sh[3].dim == 1;
}
static int is_rs(const Node *n) {
    return n->op == OP_reducescatter && !strcmp(ir_attr_s(n, "group", ""), "tp") && ir_attr_i(n, "dim", -1) == 1;
}

/* v is the same along dim 1 (the tokens): a constant, a broadcast along
 * it, an elementwise chain of those. */
static int uniform(Ov *O, int v) {
    if (O->uni[v]) return O->uni[v] == 2;
    const Node *n = def_of(O, v);
    const Type *t = vty(O, v);
    int u = 0;
    if (n && !O->kind[v] && t->rank >= 2 && t->dim[1] == O->Tg) {
        if (n->op == OP_const) u = 1;
        else if (n->op == OP_broadcast) {
            const Type *x = vty(O, n->in[0]);
            int di = 1 - (t->rank - x->rank);
            u = di < 0 || x->dim[di] == 1;
        } else if (ir_ops[n->op].flags & F_ELEMENTWISE) {
            u = 1;
            for (int k = 0; k < n->nin && u; k++) u = uniform(O, n->in[k]);
        }
    }
    O->uni[v] = (char)(u ? 2 : 1);
    return u;
}

/* The kind all region inputs of n share (K_NONE: none, -1: they differ). */
static int region_kind(const Ov *O, const Node *n) {
    int kd = K_NONE;
    for (int k = 0; k < n->nin; k++) {
        int c = O->kind[n->in[k]];
        if (c && kd && c != kd) return -1;
        if (c) kd = c;
    }
    return kd;
}

/* attention (q, k, v [, qpos, kpos]) or attention_bwd (do, q, k, v, o, lse
 * [, qpos, kpos]): every tensor input a region value in attention's layout */
static int attention_ok(const Ov *O, const Node *n) {
    int nt = n->op == OP_attention ? 3 : 6;
    if (n->nin != nt && n->nin != nt + 2) return 0;
    for (int k = 0; k < n->nin; k++)
        if ((O->kind[n->in[k]] == K_TOK2) != (k < nt)) return 0;
    return 1;
}

/* The role of node n, which reads a region value, and its outputs' kind. */
static int classify(Ov *O, const Node *n, int *okind) {
    const Type *to = n->nout ? vty(O, n->out[0]) : NULL;
    int kd = region_kind(O, n);
    *okind = kd;
    if (kd < 0) return R_BAD;
    if (n->op == OP_attention || n->op == OP_attention_bwd) return !O->mlp_only && attention_ok(O, n) ? R_ATT : R_BAD;
    if (n->nout > 1) return R_BAD;
    unsigned f = ir_ops[n->op].flags;
    if (f & F_ELEMENTWISE) { /* other inputs: uniform (rebuilt at the chunk's shape) or whole (sliced: entry_chunk) */
        if (kd == K_ROWS) return R_BAD;
        for (int k = 0; k < n->nin; k++)
            if (!O->kind[n->in[k]] && kd != K_TOK) return R_BAD;
        return R_TOK;
    }
    const Type *t0 = vty(O, n->in[0]);
    int dim = (int)ir_attr_i(n, "dim", 0);
    switch (n->op) {
    case OP_matmul: {
        int ta = (int)ir_attr_i(n, "ta", 0), tb = (int)ir_attr_i(n, "tb", 0);
        if (!ta && O->kind[n->in[0]] == K_TOK && t0->rank >= 3 && !O->kind[n->in[1]] && !O->var[n->in[1]] && vty(O, n->in[1])->rank == 2)
            return R_TOK;
        if (ta && !tb && O->kind[n->in[0]] == K_ROWS && O->kind[n->in[1]] == K_ROWS) return *okind = K_NONE, R_DW;
        return R_BAD;
    }
    case OP_reshape:
        if (kd != K_TOK) return R_BAD;
        if (to->rank >= 2 && to->dim[0] == t0->dim[0] && to->dim[1] == O->Tg) return R_TOK;
        if (to->rank == 2 && to->dim[0] == t0->dim[0] * O->Tg) return *okind = K_ROWS, R_TOK;
        return R_BAD;
    case OP_transpose: {
        int a = (int)ir_attr_i(n, "a", 0), b = (int)ir_attr_i(n, "b", 0);
        if (kd == K_ROWS || a == 0 || b == 0) return R_BAD;
        if (a + b == 3) return *okind = kd == K_TOK ? K_TOK2 : K_TOK, R_TOK; /* dims 1 and 2 swapped */
        return a != kd && b != kd ? R_TOK : R_BAD;
    }
    case OP_slice:
        return kd != K_ROWS && dim > 0 && dim != kd ? R_TOK : R_BAD;
    case OP_concat:
        for (int k = 0; k < n->nin; k++)
            if (!O->kind[n->in[k]]) return R_BAD;
        return kd != K_ROWS && dim > 0 && dim != kd ? R_TOK : R_BAD;
    case OP_rope: case OP_rope_bwd: /* (x [B,T,H,D], pos [T]): each chunk rotated by its tokens' positions */
        return kd == K_TOK && !O->kind[n->in[1]] ? R_ROPE : R_BAD;
    case OP_reducescatter:
        return is_rs(n) && kd == K_TOK && t0->rank == 3 ? (*okind = K_NONE, R_RS) : R_BAD;
    case OP_sumto:
        return kd == K_TOK && to->rank <= t0->rank - 2 ? (*okind = K_NONE, R_SUMTO) : R_BAD;
    default:
        return R_BAD;
    }
}

/* The regions: roles, kinds, components; components with a reader the
 * rule does not know are rejected. */
static void find_regions(Ov *O) {
    const Graph *g = O->g;
    int *bad = xcalloc((size_t)g->nnodes + 1, sizeof(int)), nbad = 0;
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        int var = n->op == OP_input || n->op == OP_iota;
        for (int k = 0; k < n->nin; k++) var |= O->var[n->in[k]];
        for (int k = 0; k < n->nout; k++) O->var[n->out[k]] = (char)var;
        if (is_seed(O, n)) {
            int64_t t = vty(O, n->out[0])->dim[1], l = vty(O, n->in[0])->dim[1];
            if (!O->Tg) O->Tg = t;
            if (t != O->Tg) continue;
            if (l % O->K)
                error_at(n->loc, "--tp-chunks %d does not divide the per-rank sequence %lld (the sequence / cp / tp)", O->K, (long long)l);
            O->role[i] = R_SEED, O->kind[n->out[0]] = K_TOK;
            continue;
        }
        int reads = 0;
        for (int k = 0; k < n->nin; k++) reads |= O->kind[n->in[k]] != K_NONE;
        if (!reads) continue;
        int ok;
        O->role[i] = (char)classify(O, n, &ok);
        if (O->role[i] == R_BAD) bad[nbad++] = i;
        else
            for (int k = 0; k < n->nout; k++) O->kind[n->out[k]] = (char)ok;
        for (int k = 0; k < n->nin; k++)
            if (O->kind[n->in[k]]) unite(O, i, g->vals[n->in[k]].def);
    }
    for (int j = 0; j < nbad; j++) O->reject[find(O, bad[j])] = 1;
    free(bad);
}

/* ---- the rewrite ---- */

static void at_node(Ov *O, const Node *n) { O->b.loc = n->loc, O->b.layer = n->layer, O->b.phase = n->phase; }

/* A node built like old node n (its metadata), outputs sharded like like[k]. */
static int emit(Ov *O, const Node *n, Op op, int nin, const int *in, int nattr, const Attr *at, const Type *src, const int *like) {
    at_node(O, n);
    int j = ir_build(&O->b, op, nin, in, nattr, at, src);
    Node *c = &O->b.g->nodes[j];
    c->stage = n->stage, c->vstage = n->vstage, c->mb = n->mb;
    for (int k = 0; k < c->nout; k++)
        if (like[k] >= 0) memcpy(O->b.g->vals[c->out[k]].sh, O->g->vals[like[k]].sh, sizeof O->g->vals[0].sh);
    return j;
}
static int emit1(Ov *O, const Node *n, Op op, int nin, const int *in, int nattr, const Attr *at, int like) {
    return ir_out(O->b.g, emit(O, n, op, nin, in, nattr, at, NULL, &like));
}

/* t with its token dim (dim 1, or rows dim 0) cut into K. */
static Type chunk_type(const Ov *O, const Type *t, int kind) {
    Type c = *t;
    c.dim[kind == K_ROWS ? 0 : kind] /= O->K;
    return c;
}

/* n's attrs with {shape} the chunk's (reshape, broadcast). */
static const Attr *chunk_attrs(Ov *O, const Node *n, const Type *ct) {
    Attr *a = ir_alloc(O->g->m, sizeof(Attr) * (size_t)(n->nattr + 1));
    for (int k = 0; k < n->nattr; k++)
        a[k] = strcmp(n->attr[k].key, "shape") ? n->attr[k] : ir_attr_ints(O->g->m, "shape", ct->dim, ct->rank);
    return a;
}

/* A value uniform along the tokens at the chunk's shape (one for every chunk). */
static int uni_chunk(Ov *O, int v) {
    if (O->unic[v] >= 0) return O->unic[v];
    const Node *n = def_of(O, v);
    Type ct = chunk_type(O, vty(O, v), K_TOK);
    int x;
    if (n->op == OP_const) {
        x = ir_out(O->b.g, emit(O, n, OP_const, 0, NULL, n->nattr, n->attr, &ct, &v));
    } else if (n->op == OP_broadcast) {
        int in = O->map[n->in[0]];
        x = emit1(O, n, OP_broadcast, 1, &in, n->nattr, chunk_attrs(O, n, &ct), v);
    } else {
        Attr s[3] = {ir_attr_int(O->g->m, "dim", 1), ir_attr_int(O->g->m, "start", 0), ir_attr_int(O->g->m, "end", ct.dim[1])};
        x = emit1(O, n, OP_slice, 1, &O->map[v], 3, s, v);
    }
    return O->unic[v] = x;
}

static int *chunks(Ov *O, int v) { return O->chunk + (size_t)v * (size_t)O->K; }

/* Chunk i of region value v, read by n: built, or sliced from v whole
 * (an attention output: the chunks in chunk-major order, so chunk i is
 * the contiguous i-th K-th of the token dim). */
static int chunk_of(Ov *O, const Node *n, int v, int i) {
    int *c = chunks(O, v);
    if (c[i] >= 0) return c[i];
    if (O->whole[v] < 0) ICE("tp_overlap: chunk %d of %%%d read before it is built", i, v);
    int d = O->kind[v];
    int64_t l = vty(O, v)->dim[d] / O->K;
    Attr a[3] = {ir_attr_int(O->g->m, "dim", d), ir_attr_int(O->g->m, "start", i * l), ir_attr_int(O->g->m, "end", (i + 1) * l)};
    return c[i] = emit1(O, n, OP_slice, 1, &O->whole[v], 3, a, v);
}

/* Region value v whole, its tokens in chunk-major order (chunk i's tokens
 * {(r', i)} at [i T/K, (i+1) T/K)): the chunks concatenated. */
static int join(Ov *O, const Node *n, int v) {
    if (O->whole[v] >= 0) return O->whole[v];
    int *c = xcalloc((size_t)O->K, sizeof(int));
    for (int i = 0; i < O->K; i++) c[i] = chunk_of(O, n, v, i);
    Attr d = ir_attr_int(O->g->m, "dim", O->kind[v]);
    O->whole[v] = emit1(O, n, OP_concat, O->K, c, 1, &d, v);
    free(c);
    return O->whole[v];
}

/* The positions of the tokens in chunk-major order: pos (i32 [T], the
 * rank's positions in order; -1: 0..T-1) as [tp, K, s] with its first two
 * dims swapped.  Once per pos. */
static int perm_pos(Ov *O, const Node *n, int pos) {
    int *slot = &O->perm[pos < 0 ? O->g->nvals : pos];
    if (*slot >= 0) return *slot;
    Module *m = O->g->m;
    Type t = {.dt = DT_I32, .rank = 1, .dim = {O->Tg}};
    int x = pos < 0 ? ir_out(O->b.g, emit(O, n, OP_iota, 0, NULL, 0, NULL, &t, (int[]){-1})) : O->map[pos];
    int64_t three[3] = {O->tp, O->K, O->Tg / ((int64_t)O->tp * O->K)};
    Attr a = ir_attr_ints(m, "shape", three, 3), tr[2] = {ir_attr_int(m, "a", 0), ir_attr_int(m, "b", 1)}, b = ir_attr_ints(m, "shape", t.dim, 1);
    x = emit1(O, n, OP_reshape, 1, &x, 1, &a, -1);
    x = emit1(O, n, OP_transpose, 1, &x, 2, tr, -1);
    return *slot = emit1(O, n, OP_reshape, 1, &x, 1, &b, -1);
}

/* rope, rope_bwd (x, pos): chunk i rotated by its tokens' positions */
static void emit_rope(Ov *O, const Node *n) {
    int p = perm_pos(O, n, n->in[1]);
    int64_t l = O->Tg / O->K;
    for (int i = 0; i < O->K; i++) {
        Attr a[3] = {ir_attr_int(O->g->m, "dim", 0), ir_attr_int(O->g->m, "start", i * l), ir_attr_int(O->g->m, "end", (i + 1) * l)};
        int in[2] = {chunk_of(O, n, n->in[0], i), emit1(O, n, OP_slice, 1, &p, 3, a, -1)};
        chunks(O, n->out[0])[i] = emit1(O, n, n->op, 2, in, n->nattr, n->attr, n->out[0]);
    }
}

/* attention, attention_bwd: one node over the whole sequence in chunk-major
 * order (its inputs joined; the tokens' positions given explicitly, so
 * the causal mask and window are the single device's); its outputs whole,
 * their chunks sliced where read. */
static void emit_att(Ov *O, const Node *n) {
    int nt = n->op == OP_attention ? 3 : 6, in[8];
    for (int k = 0; k < nt; k++) in[k] = join(O, n, n->in[k]);
    in[nt] = perm_pos(O, n, n->nin > nt ? n->in[nt] : -1);
    in[nt + 1] = perm_pos(O, n, n->nin > nt ? n->in[nt + 1] : -1);
    int j = emit(O, n, n->op, nt + 2, in, n->nattr, n->attr, NULL, n->out);
    for (int k = 0; k < n->nout; k++) O->whole[n->out[k]] = O->b.g->nodes[j].out[k];
}

/* Chunk i of a whole value u [B,T,..] (not a region value: Llama's
 * residual stream, a partial sum over tp until its reduce-scatter) that a
 * token-wise op reads beside region values: its tokens {(r', i)} in
 * rank-major order, [B, tp, K, s, R] sliced at i on dim 2 (one strided
 * copy of 1/K of u), built where n first needs it. */
static int entry_chunk(Ov *O, const Node *n, int u, int i) {
    int *c = O->entry + (size_t)u * (size_t)O->K;
    if (c[i] >= 0) return c[i];
    const Type *t = vty(O, u);
    Module *m = O->g->m;
    int64_t B = t->dim[0], s = O->Tg / ((int64_t)O->tp * O->K), R = ir_numel(t) / (B * O->Tg);
    int64_t five[5] = {B, O->tp, O->K, s, R};
    Attr a = ir_attr_ints(m, "shape", five, 5);
    int x = emit1(O, n, OP_reshape, 1, &O->map[u], 1, &a, u);
    Attr sl[3] = {ir_attr_int(m, "dim", 2), ir_attr_int(m, "start", i), ir_attr_int(m, "end", i + 1)};
    x = emit1(O, n, OP_slice, 1, &x, 3, sl, u);
    Type ct = chunk_type(O, t, K_TOK);
    Attr b = ir_attr_ints(m, "shape", ct.dim, ct.rank);
    return c[i] = emit1(O, n, OP_reshape, 1, &x, 1, &b, u);
}

/* seed: the rank's tokens cut into K slices, each all-gathered */
static void emit_seed(Ov *O, const Node *n) {
    int x = O->map[n->in[0]], *c = chunks(O, n->out[0]);
    int64_t s = vty(O, n->in[0])->dim[1] / O->K;
    for (int i = 0; i < O->K; i++) {
        Attr a[3] = {ir_attr_int(O->g->m, "dim", 1), ir_attr_int(O->g->m, "start", i * s), ir_attr_int(O->g->m, "end", (i + 1) * s)};
        int p = emit1(O, n, OP_slice, 1, &x, 3, a, n->in[0]);
        c[i] = emit1(O, n, OP_allgather, 1, &p, n->nattr, n->attr, n->out[0]);
    }
}

/* A transpose of the tokens and the heads (dims 1 and 2) whose input is
 * whole (attention's outputs, no chunk sliced yet) or whose readers are all
 * attention (q, k, v, and the backward's dO) runs once, on the whole value:
 * its chunks are then slices along dim 1 of [B,T,H,D] and its input's
 * join a concat along dim 1, both one contiguous run per chunk when B is 1
 * (views: live.h), where K transposes would join and slice along dim 2 of
 * [B,H,T,D] (a strided copy each).  Same bytes transposed. */
static int emit_swap_whole(Ov *O, const Node *n) {
    int v = n->in[0], y = n->out[0], a = (int)ir_attr_i(n, "a", 0), b = (int)ir_attr_i(n, "b", 0), built = 0;
    if (n->op != OP_transpose || a + b != 3 || a * b != 2) return 0;
    for (int i = 0; i < O->K; i++) built |= chunks(O, v)[i] >= 0;
    int whole_in = O->whole[v] >= 0 && !built;
    if (!whole_in && !O->att_only[y]) return 0;
    int w = whole_in ? O->whole[v] : join(O, n, v);
    O->whole[y] = emit1(O, n, OP_transpose, 1, &w, n->nattr, n->attr, y);
    return 1;
}

/* token-wise node: K copies, each on its chunks */
static void emit_tok(Ov *O, const Node *n) {
    if (emit_swap_whole(O, n)) return;
    const Attr *at = n->attr;
    if (n->op == OP_reshape) {
        Type ct = chunk_type(O, vty(O, n->out[0]), O->kind[n->out[0]]);
        at = chunk_attrs(O, n, &ct);
    }
    int *in = xcalloc((size_t)n->nin, sizeof(int)), ew = (ir_ops[n->op].flags & F_ELEMENTWISE) != 0;
    for (int i = 0; i < O->K; i++) {
        for (int k = 0; k < n->nin; k++) {
            int u = n->in[k];
            in[k] = O->kind[u] ? chunk_of(O, n, u, i) : !ew ? O->map[u] : uniform(O, u) ? uni_chunk(O, u) : entry_chunk(O, n, u, i);
        }
        chunks(O, n->out[0])[i] = emit1(O, n, n->op, n->nin, in, n->nattr, at, n->out[0]);
    }
    free(in);
}

/* reduce-scatter: K of them, the rank's K sub-chunks concatenated in order */
static void emit_rs(Ov *O, const Node *n) {
    int *rs = xcalloc((size_t)O->K, sizeof(int));
    for (int i = 0; i < O->K; i++) rs[i] = emit1(O, n, OP_reducescatter, 1, (int[]){chunk_of(O, n, n->in[0], i)}, n->nattr, n->attr, n->out[0]);
    if (O->bug && n->phase == PH_FWD) /* --test-tp-bug chunk-order: the rank's sub-chunks joined in reverse */
        for (int i = 0; i < O->K / 2; i++) {
            int t = rs[i];
            rs[i] = rs[O->K - 1 - i], rs[O->K - 1 - i] = t;
        }
    Attr d = ir_attr_int(O->g->m, "dim", 1);
    O->map[n->out[0]] = emit1(O, n, OP_concat, O->K, rs, 1, &d, n->out[0]);
    free(rs);
}

/* The first value that is v by construction: autodiff reshapes a saved
 * input once per reader (x for the q, k and v projections' weight
 * gradients), so equal reshapes of one value share one concat of chunks. */
static int first_equal(const Ov *O, int v) {
    const Node *n = def_of(O, v);
    if (!n || n->op != OP_reshape) return v;
    for (const Node *m = O->g->nodes; m < n; m++)
        if (m->op == OP_reshape && m->in[0] == n->in[0] && ir_type_eq(vty(O, m->out[0]), vty(O, v)) &&
            O->kind[m->out[0]] == O->kind[v])
            return m->out[0];
    return v;
}

/* dW = A^T dY over every token: one GEMM over the chunks concatenated
 * (the same chunk-major order in both inputs) */
static void emit_dw(Ov *O, const Node *n) {
    int in[2];
    for (int k = 0; k < 2; k++) {
        int v = first_equal(O, n->in[k]);
        if (O->cat[v] < 0) {
            Attr d = ir_attr_int(O->g->m, "dim", 0);
            O->cat[v] = emit1(O, n, OP_concat, O->K, chunks(O, v), 1, &d, v);
        }
        in[k] = O->cat[v];
    }
    O->map[n->out[0]] = emit1(O, n, OP_matmul, 2, in, n->nattr, n->attr, n->out[0]);
}

/* a bias gradient: the chunks' sums added */
static void emit_sumto(Ov *O, const Node *n) {
    int acc = -1;
    for (int i = 0; i < O->K; i++) {
        int s = emit1(O, n, OP_sumto, 1, (int[]){chunk_of(O, n, n->in[0], i)}, n->nattr, n->attr, n->out[0]);
        if (acc < 0) acc = s;
        else {
            int in[2] = {acc, s};
            acc = emit1(O, n, OP_add, 2, in, 0, NULL, n->out[0]);
        }
    }
    O->map[n->out[0]] = acc;
}

static void emit_copy(Ov *O, const Node *n) {
    int *in = xcalloc((size_t)n->nin + 1, sizeof(int));
    for (int k = 0; k < n->nin; k++) {
        in[k] = O->map[n->in[k]];
        if (in[k] < 0) ICE("tp_overlap: %%%d read before it is built", n->in[k]);
    }
    const Type *src = ir_ops[n->op].flags & F_SOURCE ? vty(O, n->out[0]) : NULL;
    int j = emit(O, n, n->op, n->nin, in, n->nattr, n->attr, src, n->out);
    for (int k = 0; k < n->nout; k++) O->map[n->out[k]] = O->b.g->nodes[j].out[k];
    free(in);
}

/* A const or broadcast that only accepted token-wise nodes read (as their
 * uniform input) is not copied: they read its chunk-shaped copy. */
static void mark_drops(Ov *O) {
    const Graph *g = O->g;
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        if (O->role[i] != R_TOK || !accepted(O, i) || !(ir_ops[n->op].flags & F_ELEMENTWISE)) continue;
        for (int k = 0; k < n->nin; k++)
            if (!O->kind[n->in[k]] && uniform(O, n->in[k])) O->nuse[n->in[k]]--; /* readers that take the chunk-shaped copy */
    }
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        if ((n->op == OP_const || n->op == OP_broadcast) && O->uni[n->out[0]] == 2 && O->nuse[n->out[0]] == 0) O->drop[i] = 1;
    }
}

void pass_tp_overlap(Module *m, const Options *o) {
    if (o->tp_chunks <= 1 || m->mesh[3] <= 1 || m->nstages != 1) return;
    const Graph *g = m->stages[0];
    size_t nv = (size_t)g->nvals, nn = (size_t)g->nnodes;
    const char *mo = getenv("KILN_TP_CHUNKS_MLP_ONLY");
    Ov O = {.g = g, .K = o->tp_chunks, .tp = m->mesh[3], .bug = o->tp_bug == 4, .mlp_only = mo && *mo && strcmp(mo, "0")};
    O.kind = xcalloc(nv, 1), O.var = xcalloc(nv, 1), O.uni = xcalloc(nv, 1), O.role = xcalloc(nn + 1, 1);
    O.parent = xcalloc(nn + 1, sizeof(int)), O.reject = xcalloc(nn + 1, 1), O.nuse = xcalloc(nv, sizeof(int));
    for (size_t i = 0; i < nn; i++) O.parent[i] = (int)i;
    find_regions(&O);

    O.b = (Builder){.g = ir_graph_new(m), .pass = "tp_overlap", .layer = -1};
    O.map = xcalloc(nv, sizeof(int)), O.chunk = xcalloc(nv * (size_t)O.K, sizeof(int));
    O.unic = xcalloc(nv, sizeof(int)), O.cat = xcalloc(nv, sizeof(int)), O.drop = xcalloc(nn + 1, 1);
    O.entry = xcalloc(nv * (size_t)O.K, sizeof(int));
    O.whole = xcalloc(nv, sizeof(int)), O.perm = xcalloc(nv + 1, sizeof(int));
    for (size_t v = 0; v <= nv; v++) O.perm[v] = -1;
    for (size_t v = 0; v < nv; v++) O.whole[v] = -1;
    for (size_t v = 0; v < nv * (size_t)O.K; v++) O.chunk[v] = -1;
    for (size_t v = 0; v < nv * (size_t)O.K; v++) O.entry[v] = -1;
    for (size_t v = 0; v < nv; v++) O.map[v] = O.unic[v] = O.cat[v] = -1;
    for (size_t i = 0; i < nn; i++)
        for (int k = 0; k < g->nodes[i].nin; k++) O.nuse[g->nodes[i].in[k]]++;
    int *att = xcalloc(nv + 1, sizeof(int));
    O.att_only = xcalloc(nv + 1, 1);
    for (size_t i = 0; i < nn; i++)
        for (int k = 0; O.role[i] == R_ATT && accepted(&O, (int)i) && k < g->nodes[i].nin; k++) att[g->nodes[i].in[k]]++;
    for (size_t v = 0; v < nv; v++) O.att_only[v] = (char)(att[v] > 0 && att[v] == O.nuse[v]);
    free(att);
    mark_drops(&O);
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        ir_ice_at(n->loc);
        int r = O.role[i];
        if (O.drop[i]) continue;
        if (r == R_NONE || r == R_BAD || !accepted(&O, i)) {
            emit_copy(&O, n);
            continue;
        }
        switch (r) {
        case R_SEED: emit_seed(&O, n); break;
        case R_TOK: emit_tok(&O, n); break;
        case R_RS: emit_rs(&O, n); break;
        case R_DW: emit_dw(&O, n); break;
        case R_SUMTO: emit_sumto(&O, n); break;
        case R_ROPE: emit_rope(&O, n); break;
        default: emit_att(&O, n); break;
        }
    }
    m->stages[0] = O.b.g;
    free(O.kind), free(O.var), free(O.uni), free(O.role), free(O.parent), free(O.reject), free(O.nuse);
    free(O.map), free(O.chunk), free(O.unic), free(O.cat), free(O.drop), free(O.entry), free(O.whole), free(O.perm), free(O.att_only);
}
