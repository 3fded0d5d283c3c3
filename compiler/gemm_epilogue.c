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
 * (--gemm-epilogue bias) or 2 (gelu); CUDA only: the CPU runtime has no
 * rtk_gemm_bias / rtk_gemm_bias_gelu.
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
 * unfused pair took it of the bf16 z): the interpreter does the same.  The
 * backward's DGELU_BGRAD / BGRADB are not made yet (docs/decisions.md).
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

static void epilogue_graph(Graph *g, int gelu) {
    int n = g->nnodes, ndead = 0, k = 0;
    Ep E = {xcalloc((size_t)g->nvals + 1, sizeof(int)), xcalloc((size_t)n + 1, 1)};
    for (int i = 0; i < n; i++)
        for (int a = 0; a < g->nodes[i].nin; a++) E.uses[g->nodes[i].in[a]]++;
    int any = 0;
    for (int j = 0; j < n; j++) any |= rewrite(g, &E, j);
    for (int j = 0; gelu && j < n; j++) any |= rewrite_gelu(g, &E, j);
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
    for (int s = 0; s < m->nstages; s++) epilogue_graph(m->stages[s], o->gemm_epilogue == 2);
}
