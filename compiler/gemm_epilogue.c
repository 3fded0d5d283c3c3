/* gemm_epilogue.c — a GEMM's bias add (and GELU) as a cuBLASLt epilogue (issue 23).
 *
 * What it rewrites.  A linear layer is, after precision,
 *
 *     y  = matmul x, W                      (bf16)
 *     bb = broadcast b {shape = y's}        (b: bf16[N], the bias' cast)
 *     z  = add y, bb                        (or add bb, y)
 *
 * and becomes `z = matmul_bias x, W, b` at the add's place (b may be made
 * after the matmul: the cast is placed lazily), the matmul and, when
 * nothing else reads it, the broadcast dropped.  The CUDA runtime runs it
 * as one cuBLASLt call with CUBLASLT_EPILOGUE_BIAS (rtk_gemm_bias): the
 * bias is added to the f32 accumulator before the one rounding to bf16,
 * where the unfused pair rounded twice; the interpreter does the same, so
 * `kiln check` covers it.  What the add was fused with (a GELU) stays an
 * elementwise kernel reading z.
 *
 * What it leaves: y read by anything but the add (its value is gone after
 * the rewrite), a bias that is not one vector over y's last dim, dtypes
 * other than bf16 (the CUDA program's activations), a batched b.
 *
 * Where it runs: at the start of `fuse`, when Options.gemm_epilogue is 1
 * (--gemm-epilogue bias), 2 (gelu), 3 (bgrad) or 4 (all); CUDA only: the
 * CPU runtime has no rtk_gemm_bias / _bias_gelu / _bgrad / _dgelu_bgrad.
 * Opt-in until a GPU has checked it (bench/gpu/check.sh), as --attention tc.
 *
 * GELU (--gemm-epilogue gelu, which implies bias).  A matmul_bias whose
 * output feeds a gelu of its own phase becomes `h, z = matmul_bias_gelu`
 * (rewrite_gelu): cuBLASLt's GELU_AUX_BIAS epilogue writes h = gelu(z) and
 * the pre-activation z as its aux output, the tensor gelu_bwd (and
 * gemm-last recompute's gelu copy) reads.  Sound because kiln's gelu op is
 * the tanh approximation (ops.def, interp.c gelu()), the form cuBLASLt's
 * GELU epilogues compute; an erf GELU would have to be refused here.  The
 * GELU is taken of the f32 accumulator + bias before rounding (where the
 * unfused pair took it of the bf16 z): the interpreter does the same.
 *
 * The backward (issue 23, session 6).  With --gemm-epilogue bgrad (3) a
 * bias' gradient, `db = sumto dy {shape = [N]}`, goes into the weight-
 * gradient GEMM that reads the same dy as its b [K, N] (dW = x^T dy):
 * `dW, db = matmul_bgrad x, dy {bgrad = 1}`, cuBLASLt's BGRADA (the sum
 * over K of its A, our b, which must not be transposed); dy read as a
 * [K, M] with ta is BGRADB's (bgrad = 0).  With all (4) first the MLP's
 * `dh = matmul dy, W`, `dz = gelu_bwd dh, z` and `db = sumto dz` become
 * `dz, db16 = matmul_dgelu_bgrad dy, W, z` at the matmul's place and the
 * sumto a cast of db16: DGELU_BGRAD reads z as its aux input and writes the
 * bias gradient in D's type (bf16), the header's rule.  The facts and their
 * sources: docs/decisions.md, "Backward GEMM epilogues".
 */
#include <stdlib.h>
#include <string.h>

#include "live.h"
#include "passes.h"

typedef struct {
    int *uses;  /* [value]: readers */
    char *dead; /* [node]: dropped */
} Ep;

/* The bias vector when value v is broadcast b {shape = y's} of a bf16[N], else -1. */
static int bias_of(const Graph *g, int v, const Type *y) {
    int d = g->vals[v].def;
    if (d < 0 || g->nodes[d].op != OP_broadcast) return -1;
    int b = g->nodes[d].in[0];
    const Type *t = &g->vals[b].t;
    if (t->rank != 1 || t->dt != DT_BF16 || t->dim[0] != y->dim[y->rank - 1] || !ir_type_eq(&g->vals[v].t, y)) return -1;
    return b;
}

/* Rewrite add node j if it is matmul + broadcast bias: 1 if done. */
static int rewrite(Graph *g, Ep *E, int j) {
    Node *n = &g->nodes[j];
    if (n->op != OP_add || n->nin != 2 || E->dead[j]) return 0;
    for (int side = 0; side < 2; side++) {
        int y = n->in[side], bb = n->in[1 - side], m = g->vals[y].def;
        if (m < 0 || g->nodes[m].op != OP_matmul || E->uses[y] != 1) continue;
        const Type *yt = &g->vals[y].t;
        if (yt->dt != DT_BF16 || g->vals[g->nodes[m].in[1]].t.rank != 2) continue;
        int b = bias_of(g, bb, yt);
        if (b < 0) continue;
        int *in = ir_alloc(g->m, 3 * sizeof(int));
        in[0] = g->nodes[m].in[0], in[1] = g->nodes[m].in[1], in[2] = b;
        n->op = OP_matmul_bias;
        n->nin = 3, n->in = in;
        n->nattr = g->nodes[m].nattr, n->attr = g->nodes[m].attr; /* ta, tb */
        E->dead[m] = 1;
        g->nodes[m].nin = g->nodes[m].nout = 0;
        g->vals[y].def = -1; /* no reader left */
        if (--E->uses[bb] == 0) {
            int d = g->vals[bb].def;
            E->dead[d] = 1;
            g->nodes[d].nin = g->nodes[d].nout = 0;
            g->vals[bb].def = -1;
        }
        return 1;
    }
    return 0;
}

/* With --gemm-epilogue gelu: matmul_bias node j whose output z is read by a
 * gelu of the same phase, stage and micro-batch becomes
 * (h, z) = matmul_bias_gelu at j, h the gelu's output, the gelu dropped:
 * cuBLASLt's GELU_AUX_BIAS writes h = gelu(z) and z itself (the aux output)
 * that gelu_bwd and gemm-last's recomputed gelu read.  Its aux leading
 * dimension must be a multiple of 8: N % 8.  1 if done. */
static int rewrite_gelu(Graph *g, Ep *E, int j) {
    Node *n = &g->nodes[j];
    if (n->op != OP_matmul_bias || E->dead[j]) return 0;
    int z = n->out[0];
    const Type *zt = &g->vals[z].t;
    if (zt->dim[zt->rank - 1] % 8 || ir_attr_i(n, "ta", 0)) return 0; /* ta: batches stay apart (no aux stride) */
    for (int k = j + 1; k < g->nnodes; k++) {
        Node *q = &g->nodes[k];
        if (E->dead[k] || q->op != OP_gelu || q->nin != 1 || q->in[0] != z) continue;
        if (q->phase != n->phase || q->stage != n->stage || q->vstage != n->vstage || q->mb != n->mb) continue;
        if (!ir_type_eq(&g->vals[q->out[0]].t, zt)) continue;
        int *out = ir_alloc(g->m, 2 * sizeof(int));
        out[0] = q->out[0], out[1] = z;
        n->op = OP_matmul_bias_gelu;
        n->nout = 2, n->out = out;
        g->vals[out[0]].def = j, g->vals[out[0]].defout = 0;
        g->vals[z].defout = 1;
        E->dead[k] = 1;
        q->nin = q->nout = 0;
        return 1;
    }
    return 0;
}

static int same_place(const Node *a, const Node *b) {
    return a->phase == b->phase && a->stage == b->stage && a->vstage == b->vstage && a->mb == b->mb;
}

static void kill(Graph *g, Ep *E, int i) {
    E->dead[i] = 1;
    g->nodes[i].nin = g->nodes[i].nout = 0;
}

/* The sumto node after node `from` that reduces value v [.., N] to [N], or -1. */
static int bias_sumto(const Graph *g, const Ep *E, int v, int from) {
    const Type *vt = &g->vals[v].t;
    for (int k = from + 1; k < g->nnodes; k++) {
        const Node *s = &g->nodes[k];
        if (E->dead[k] || s->op != OP_sumto || s->nin != 1 || s->in[0] != v) continue;
        const Type *t = &g->vals[s->out[0]].t;
        if (t->rank == 1 && t->dim[0] == vt->dim[vt->rank - 1]) return k;
    }
    return -1;
}

/* With --gemm-epilogue all: gelu_bwd node k, dz = gelu_bwd(dh, z), whose dh
 * is a matmul's only use and whose dz is summed to a bias gradient db by a
 * sumto, becomes (dz, db16) = matmul_dgelu_bgrad(dy, W, z) at the matmul's
 * place, and the sumto a cast of db16 to db's dtype: cuBLASLt's
 * DGELU_BGRAD reads z as its aux input (AUX_LD = N, a multiple of 8) and
 * writes the bias gradient in D's type (the header: "Bias gradient vector
 * elements are the same type as the output elements"), bf16 here, so the
 * f32 gradient is its cast.  1 if done. */
static int rewrite_dgelu(Graph *g, Ep *E, int k) {
    const Node *q = &g->nodes[k];
    if (E->dead[k] || q->op != OP_gelu_bwd || q->nin != 2) return 0;
    int dh = q->in[0], z = q->in[1], dz = q->out[0], m = g->vals[dh].def;
    if (m < 0 || E->dead[m] || g->nodes[m].op != OP_matmul || E->uses[dh] != 1 || !same_place(&g->nodes[m], q)) return 0;
    const Node *mm = &g->nodes[m];
    const Type *zt = &g->vals[z].t;
    if (zt->dt != DT_BF16 || !ir_type_eq(zt, &g->vals[dh].t) || !ir_type_eq(zt, &g->vals[dz].t)) return 0;
    if (zt->dim[zt->rank - 1] % 8 || ir_attr_i(mm, "ta", 0) || g->vals[mm->in[1]].t.rank != 2) return 0;
    if (g->vals[z].def >= m) return 0; /* z made after the matmul (recomputed): not there yet */
    int s = bias_sumto(g, E, dz, k);
    if (s < 0 || !same_place(&g->nodes[s], q)) return 0;
    Builder b = {g, "gemm_epilogue", mm->loc, mm->layer, mm->phase};
    int in[3] = {mm->in[0], mm->in[1], z};
    int K = ir_build(&b, OP_matmul_dgelu_bgrad, 3, in, mm->nattr, mm->attr, NULL); /* may move g->nodes */
    Node *f = &g->nodes[K];
    const Node *m2 = &g->nodes[m];
    f->stage = m2->stage, f->vstage = m2->vstage, f->mb = m2->mb, f->stream = m2->stream, f->pos = m2->pos;
    int db16 = f->out[1];
    g->vals[f->out[0]].def = -1; /* unused: dz keeps its id */
    f->out[0] = dz;
    Node *sn = &g->nodes[s];
    Attr *at = ir_alloc(g->m, sizeof(Attr));
    *at = ir_attr_str(g->m, "dtype", ir_dtype_names[g->vals[sn->out[0]].t.dt]);
    sn->op = OP_cast, sn->in[0] = db16, sn->nattr = 1, sn->attr = at;
    E->uses[dz]--, E->uses[db16]++;
    g->vals[dh].def = -1;
    kill(g, E, m), kill(g, E, k);
    Node t = g->nodes[m]; /* the new node takes the matmul's place */
    g->nodes[m] = g->nodes[K], g->nodes[K] = t;
    E->dead[m] = 0, E->dead[K] = 1;
    for (int o = 0; o < g->nodes[m].nout; o++) g->vals[g->nodes[m].out[o]].def = m, g->vals[g->nodes[m].out[o]].defout = o;
    return 1;
}

/* 1 when a GEMM operand is v itself or a reshape of v (to [numel / last,
 * last]), else 0. */
static int is_rows_of(const Graph *g, int operand, int v) {
    if (operand == v) return 1;
    int d = g->vals[operand].def;
    return d >= 0 && g->nodes[d].op == OP_reshape && g->nodes[d].in[0] == v;
}

/* With --gemm-epilogue bgrad (or all): sumto node s, db = the sum of v
 * [.., N] over all but its last dim, where a 2-D matmul w of the same phase
 * reads v as its b [K, N] without tb (a weight gradient x^T dy) or as its a
 * [K, N] with ta, and db has w's output dtype: w becomes (C, db) =
 * matmul_bgrad {bgrad = 1 (b) or 0 (a)}, cuBLASLt's BGRADA (its A, our b,
 * must not be transposed) or BGRADB (its B, our a, must be), which write the
 * bias gradient in D's type; the sumto is dropped.  Refused when something
 * reads db between the sumto and w (it would be read before it is made).
 * 1 if done. */
static int rewrite_bgrad(Graph *g, Ep *E, int s) {
    const Node *sn = &g->nodes[s];
    if (E->dead[s] || sn->op != OP_sumto || sn->nin != 1) return 0;
    int v = sn->in[0], db = sn->out[0];
    const Type *vt = &g->vals[v].t, *dt = &g->vals[db].t;
    if (dt->rank != 1 || vt->rank < 2 || dt->dim[0] != vt->dim[vt->rank - 1]) return 0;
    for (int w = 0; w < g->nnodes; w++) {
        const Node *mm = &g->nodes[w];
        if (E->dead[w] || mm->op != OP_matmul || mm->nin != 2 || mm->nout != 1 || !same_place(mm, sn)) continue;
        const Type *at = &g->vals[mm->in[0]].t, *bt = &g->vals[mm->in[1]].t;
        if (at->rank != 2 || bt->rank != 2 || g->vals[mm->out[0]].t.dt != dt->dt) continue;
        int of_b = !ir_attr_i(mm, "tb", 0) && is_rows_of(g, mm->in[1], v) && bt->dim[1] == dt->dim[0];
        int of_a = !of_b && ir_attr_i(mm, "ta", 0) && is_rows_of(g, mm->in[0], v) && at->dim[1] == dt->dim[0];
        if (!of_b && !of_a) continue;
        int early = 0;
        for (int i = s + 1; i <= w && !early; i++)
            for (int a = 0; a < g->nodes[i].nin; a++) early |= g->nodes[i].in[a] == db;
        if (early) continue;
        Node *n = &g->nodes[w];
        Attr *attr = ir_alloc(g->m, sizeof(Attr) * (size_t)(n->nattr + 1));
        if (n->nattr) memcpy(attr, n->attr, sizeof(Attr) * (size_t)n->nattr);
        attr[n->nattr] = ir_attr_int(g->m, "bgrad", of_b);
        int *out = ir_alloc(g->m, 2 * sizeof(int));
        out[0] = n->out[0], out[1] = db;
        n->op = OP_matmul_bgrad, n->attr = attr, n->nattr++, n->out = out, n->nout = 2;
        g->vals[db].def = w, g->vals[db].defout = 1;
        E->uses[v]--;
        kill(g, E, s);
        return 1;
    }
    return 0;
}

static void epilogue_graph(Graph *g, int level) {
    int n = g->nnodes, ndead = 0, k = 0;
    Ep E = {xcalloc((size_t)g->nvals + 2 * (size_t)n + 1, sizeof(int)), xcalloc(2 * (size_t)n + 1, 1)};
    for (int i = 0; i < n; i++)
        for (int a = 0; a < g->nodes[i].nin; a++) E.uses[g->nodes[i].in[a]]++;
    int any = 0;
    for (int j = 0; j < n; j++) any |= rewrite(g, &E, j);
    for (int j = 0; level >= 2 && j < n; j++) any |= rewrite_gelu(g, &E, j);
    for (int j = 0; level >= 4 && j < n; j++) any |= rewrite_dgelu(g, &E, j); /* adds one node each (at most n) */
    for (int j = 0; level >= 3 && j < n; j++) any |= rewrite_bgrad(g, &E, j);
    n = g->nnodes;
    if (any) {
        int *order = xcalloc((size_t)n, sizeof(int));
        for (int i = 0; i < n; i++)
            if (!E.dead[i]) order[k++] = i;
        for (int i = 0; i < n; i++)
            if (E.dead[i]) order[k++] = i, ndead++;
        ir_reorder(g, order);
        g->nnodes -= ndead;
        free(order);
    }
    free(E.uses), free(E.dead);
}

void gemm_epilogue(Module *m, const Options *o) {
    if (o->gemm_epilogue < 1) return;
    for (int s = 0; s < m->nstages; s++) epilogue_graph(m->stages[s], o->gemm_epilogue);
}
