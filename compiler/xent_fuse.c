/* xent_fuse.c — the fused classifier (issue 23): softmax cross-entropy's
 * forward and backward as one op at the forward.
 *
 * What it rewrites.  autodiff leaves the classifier as two library ops:
 *
 *     loss_tok = cross_entropy logits, targets              (forward)
 *     ...      the loss: mean, loss, output
 *     dl       = the seed chain: const 1, broadcasts, / N   (backward)
 *     dlogits  = cross_entropy_bwd dl, logits, targets      (backward)
 *
 * The backward reads the logits again (and recomputes each row's
 * log-sum-exp: three reads of the [rows, V] logits in two launches).  When
 * dl can be computed before the forward op — nothing it depends on depends
 * on loss_tok, which holds for a mean (1/N), a loss mask's weights and any
 * constant loss scale: the seed of the loss is the constant 1, never the
 * loss value — the pair becomes
 *
 *     dlogits, loss_tok = cross_entropy_fused dl, logits, targets
 *
 * at the forward op's place, with dl's computation (the nodes after the
 * forward op that dl depends on, in their order) moved before it.  The
 * fused kernel (kernels/cuda/xent_fused.cu) reads each row twice back to
 * back and writes the gradient once; the backward reads nothing.  Value ids
 * are kept: dlogits and loss_tok are the same values as before, defined by
 * the new node, so every reader is untouched.
 *
 * What it refuses (leaves the pair unfused): a backward whose logits or
 * targets are not the forward's values (logits recomputed in the backward
 * under a recompute policy: the forward's are not kept, and fusing would
 * keep them); a dl whose cone reaches the forward op or holds a collective,
 * an event or a copy (moving those would reorder communication); tensor
 * parallelism (tp > 1: the vocab-parallel loss is several ops with
 * all-reduces, tp.c, and is not the pattern anyway).
 *
 * Memory.  dlogits is written over the logits (F_INPLACE, memplan's
 * place_over), as cross_entropy_bwd's was: the logits' buffer lived from the
 * forward to the backward before, and the gradient's now lives over the
 * same span, so the plan's peak is unchanged.  If something else reads the
 * logits after the fused op (a model output "logits"), memplan gives
 * dlogits its own buffer, from the forward to its last reader.
 *
 * Where it runs: at the start of `fuse` (pass_fuse), when Options.xent_fused
 * is 1 (main.c: on with --target cuda, --xent-fused on|off).  The CPU
 * runtime has no fused kernel, so main.c refuses it for a CPU program; dump,
 * check, plan and run --interp accept it, and the interpreter implements
 * the op, so `kiln check --xent-fused on` checks the rewritten program.
 */
#include <stdlib.h>
#include <string.h>

#include "live.h"
#include "passes.h"

static int same_attrs(const Node *a, const Node *b) {
    if (a->nattr != b->nattr) return 0;
    for (int k = 0; k < a->nattr; k++) {
        const Attr *x = &a->attr[k], *y = &b->attr[k];
        if (x->key != y->key || x->kind != y->kind || x->i != y->i || x->f != y->f || x->n != y->n) return 0;
        if (x->kind == AT_STR && strcmp(x->s, y->s) != 0) return 0;
        if (x->kind == AT_INTS && memcmp(x->v, y->v, sizeof(int64_t) * (size_t)x->n) != 0) return 0;
    }
    return 1;
}

/* a and b hold the same data: one value, or the same shape op (slice,
 * reshape: a micro-batch's targets, sliced again for the backward) of the
 * same data.  depth bounds the walk. */
static int same_data(const Graph *g, int a, int b, int depth) {
    if (a == b) return 1;
    int da = g->vals[a].def, db = g->vals[b].def;
    if (depth <= 0 || da < 0 || db < 0) return 0;
    const Node *x = &g->nodes[da], *y = &g->nodes[db];
    if (x->op != y->op || !(ir_ops[x->op].flags & F_SHAPE) || x->nin != 1 || y->nin != 1 || x->nout != 1 || y->nout != 1 ||
        !ir_type_eq(&g->vals[a].t, &g->vals[b].t) || !same_attrs(x, y))
        return 0;
    return same_data(g, x->in[0], y->in[0], depth - 1);
}

/* The forward cross_entropy over the same logits (the value itself) and
 * targets (the same data) as bwd node j, or -1. */
static int forward_of(const Graph *g, int j) {
    const Node *b = &g->nodes[j];
    for (int i = 0; i < j; i++) {
        const Node *n = &g->nodes[i];
        if (n->op == OP_cross_entropy && n->in[0] == b->in[1] && same_data(g, n->in[1], b->in[2], 4)) return i;
    }
    return -1;
}

/* Mark in cone[] the nodes after i that value v depends on; 0, or -1 when
 * the cone reaches node i or holds a node that must not move. */
static int mark_cone(const Graph *g, int i, int v, char *cone, int *stack) {
    int sp = 0;
    if (g->vals[v].def > i) stack[sp++] = g->vals[v].def;
    while (sp > 0) {
        int d = stack[--sp];
        if (d == i) return -1;
        if (cone[d]) continue;
        const Node *n = &g->nodes[d];
        if (ir_ops[n->op].flags & (F_COMM | F_SYNC | F_COPY | F_SINK | F_LOSS)) return -1;
        cone[d] = 1;
        for (int k = 0; k < n->nin; k++) {
            int p = g->vals[n->in[k]].def;
            if (p == i) return -1;
            if (p > i && !cone[p]) stack[sp++] = p;
        }
    }
    return 0;
}

/* Rewrite the pair (forward i, backward j) with dl's cone moved before i. */
static void rewrite(Graph *g, int i, int j, const char *cone) {
    Node *f = &g->nodes[i], *b = &g->nodes[j];
    int *in = ir_alloc(g->m, 3 * sizeof(int)), *out = ir_alloc(g->m, 2 * sizeof(int));
    in[0] = b->in[0], in[1] = f->in[0], in[2] = f->in[1]; /* the forward's targets: defined before i */
    out[0] = b->out[0], out[1] = f->out[0];
    f->op = OP_cross_entropy_fused;
    f->nin = 3, f->in = in, f->nout = 2, f->out = out;
    b->nin = 0, b->nout = 0; /* dropped below: it defines nothing now */
    g->vals[out[0]].defout = 0, g->vals[out[1]].defout = 1; /* def: ir_reorder */
    int n = g->nnodes, k = 0, *order = xcalloc((size_t)n, sizeof(int));
    for (int x = 0; x < i; x++) order[k++] = x;
    for (int x = i + 1; x < n; x++)
        if (cone[x]) order[k++] = x;
    order[k++] = i;
    for (int x = i + 1; x < n; x++)
        if (!cone[x] && x != j) order[k++] = x;
    order[k++] = j; /* last, then dropped */
    ir_reorder(g, order);
    g->nnodes--;
    free(order);
}

/* One pair fused; 1 if one was found. */
static int fuse_one(Graph *g) {
    int n = g->nnodes, done = 0;
    char *cone = xcalloc((size_t)n + 1, 1);
    int *stack = xcalloc((size_t)n + 1, sizeof(int));
    for (int j = 0; j < n && !done; j++) {
        if (g->nodes[j].op != OP_cross_entropy_bwd) continue;
        int i = forward_of(g, j);
        memset(cone, 0, (size_t)n);
        if (i < 0 || mark_cone(g, i, g->nodes[j].in[0], cone, stack) < 0) continue;
        rewrite(g, i, j, cone);
        done = 1;
    }
    free(cone), free(stack);
    return done;
}

void xent_fuse(Module *m, const Options *o) {
    if (o->xent_fused != 1 || m->mesh[3] > 1) return;
    for (int s = 0; s < m->nstages; s++)
        while (fuse_one(m->stages[s])) {
        }
}
