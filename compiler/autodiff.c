/* autodiff.c — reverse-mode differentiation of the forward graph.
 *
 * The front end hands us one forward graph ending in a single `loss` node.
 * pass_autodiff appends, to that same graph, the backward program of one
 * micro-batch: the forward nodes stay exactly as they were (same order, same
 * metadata; only the model's own output nodes, such as "logits", are
 * dropped: they serve forward-only programs), then come the gradient nodes in reverse order of the forward
 * nodes they differentiate, then the outputs
 *
 *     output %loss {name="loss"}
 *     output %g    {name="grad:<param>"}     one per param, in param order
 *
 * Which values get a gradient is decided up front, from two sets: the float
 * values that depend on a param (a forward sweep) and the float values that
 * reach the loss (a backward sweep).  Only their intersection is
 * differentiated, so no work is spent on data paths (token ids, positions,
 * masks) or on branches that never reach the loss.  A param the loss does not
 * depend on gets a zero constant as its gradient.
 *
 * The sweep seeds d(loss) = 1 and visits the forward nodes last to first.  A
 * node with a gradient on any output calls the VJP rule of its op; the rule
 * returns one contribution per input that wants one, and contributions to the
 * same value are summed with `add`.  Each rule is a small function below, in
 * the order of ops.def, and uses only ops of ops.def: fused ops have fused
 * backward ops (layernorm_bwd, attention_bwd, ...), everything else is built
 * from primitives.  Every node a rule emits carries phase bwd and the Loc and
 * layer of the forward node it differentiates, so errors, dumps and the
 * pipeline/recompute passes can attribute it.
 *
 * The one non-obvious rule is attention's second output.  lse_t =
 * log sum_s exp(score_ts), so d score_ts += dlse_t * p_ts.  attention_bwd
 * computes d score_ts = p_ts * (do_t . v_s - do_t . o_t); called again with
 * do' = dlse_t in the first lane (zeros elsewhere), v' = ones and o' = 0 (and
 * the forward's positions, if it has them) it yields exactly p_ts * dlse_t,
 * and its dq, dk are the lse contributions.
 */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

/* The gradient of `slice %x {dim, start, end}` is dy placed at [start, end)
 * of dim.  Slices that split one value (q, k and v from one projection) are
 * kept as pieces and joined by a single concat, with zeros only for the gaps,
 * instead of one zero-padded copy per slice summed with adds. */
typedef struct Piece {
    int v, dim, dy;
    int64_t start, end;
    Loc loc;
    int layer;
} Piece;

typedef struct {
    Module *m;
    Builder bld; /* the graph, and the Loc/layer of the forward node being differentiated */
    int nfwd;   /* forward node count */
    int nval;   /* forward value count */
    char *need; /* per forward value: gets a gradient */
    int *grad;  /* per forward value: accumulated gradient id, -1 none */
    struct Piece *pieces; /* gradients of slices, joined when their value's gradient is read */
    int npieces, cappieces;
} Ad;

/* A VJP rule: node n (a copy; its arrays stay valid), output gradients dy
 * (-1: none), fills dx[i] for each input i with a->need (others: leave -1). */
typedef void (*VjpFn)(Ad *a, const Node *n, const int *dy, int *dx);

/* ---- emitting backward nodes ---- */

static Type vtype(Ad *a, int v) { return a->bld.g->vals[v].t; }

static int wants(Ad *a, const Node *n, int i) { return a->need[n->in[i]]; }

/* A constant of type t filled with v. */
static int cnst(Ad *a, Type t, double v) {
    Attr at = ir_attr_float(a->m, "v", v);
    return ir_out(a->bld.g, ir_build(&a->bld, OP_const, 0, NULL, 1, &at, &t));
}

static Attr shape_attr(Ad *a, const char *key, const Type *t) {
    return ir_attr_ints(a->m, key, t->dim, t->rank);
}

static int reshape(Ad *a, int x, Type t) {
    Attr at = shape_attr(a, "shape", &t);
    return ir_build1(&a->bld, OP_reshape, x, 1, &at);
}

static int broadcast(Ad *a, int x, Type t) {
    Attr at = shape_attr(a, "shape", &t);
    return ir_build1(&a->bld, OP_broadcast, x, 1, &at);
}

/* A scalar constant broadcast to t (the cheap way to write "v everywhere"). */
static int fill(Ad *a, Type t, double v) {
    Type s = {.dt = t.dt, .rank = 0};
    int c = cnst(a, s, v);
    return t.rank ? broadcast(a, c, t) : c;
}

static int transpose(Ad *a, int x, int d0, int d1) {
    Attr at[2] = {ir_attr_int(a->m, "a", d0), ir_attr_int(a->m, "b", d1)};
    return ir_build1(&a->bld, OP_transpose, x, 2, at);
}

static int cast(Ad *a, int x, DType dt) {
    if (vtype(a, x).dt == dt) return x;
    Attr at = ir_attr_str(a->m, "dtype", ir_dtype_names[dt]);
    return ir_build1(&a->bld, OP_cast, x, 1, &at);
}

static int slice(Ad *a, int x, int dim, int64_t start, int64_t end) {
    Attr at[3] = {ir_attr_int(a->m, "dim", dim), ir_attr_int(a->m, "start", start),
                  ir_attr_int(a->m, "end", end)};
    return ir_build1(&a->bld, OP_slice, x, 3, at);
}

static int matmul(Ad *a, int x, int y, int ta, int tb) {
    Attr at[2] = {ir_attr_int(a->m, "ta", ta), ir_attr_int(a->m, "tb", tb)};
    int in[2] = {x, y};
    return ir_out(a->bld.g, ir_build(&a->bld, OP_matmul, 2, in, 2, at, NULL));
}

/* A node with the forward node's attributes (the bwd op takes the same ones). */
static int emit_like(Ad *a, Op op, const Node *n, int nin, const int *in) {
    return ir_build(&a->bld, op, nin, in, n->nattr, n->attr, NULL);
}

/* ---- VJP rules, in ops.def order ---- */

static void vjp_add(Ad *a, const Node *n, const int *dy, int *dx) {
    dx[0] = dy[0];
    dx[1] = dy[0];
}

static void vjp_sub(Ad *a, const Node *n, const int *dy, int *dx) {
    dx[0] = dy[0];
    if (wants(a, n, 1)) dx[1] = ir_build1(&a->bld, OP_neg, dy[0], 0, NULL);
}

static void vjp_mul(Ad *a, const Node *n, const int *dy, int *dx) {
    if (wants(a, n, 0)) dx[0] = ir_build2(&a->bld, OP_mul, dy[0], n->in[1]);
    if (wants(a, n, 1)) dx[1] = ir_build2(&a->bld, OP_mul, dy[0], n->in[0]);
}

static void vjp_div(Ad *a, const Node *n, const int *dy, int *dx) {
    int x = n->in[0], y = n->in[1];
    if (wants(a, n, 0)) dx[0] = ir_build2(&a->bld, OP_div, dy[0], y);
    if (wants(a, n, 1)) { /* -dy * x / (y * y) */
        int num = ir_build2(&a->bld, OP_mul, dy[0], x), den = ir_build2(&a->bld, OP_mul, y, y);
        dx[1] = ir_build1(&a->bld, OP_neg, ir_build2(&a->bld, OP_div, num, den), 0, NULL);
    }
}

static void vjp_neg(Ad *a, const Node *n, const int *dy, int *dx) {
    dx[0] = ir_build1(&a->bld, OP_neg, dy[0], 0, NULL);
}

static void vjp_exp(Ad *a, const Node *n, const int *dy, int *dx) {
    dx[0] = ir_build2(&a->bld, OP_mul, dy[0], n->out[0]);
}

static void vjp_log(Ad *a, const Node *n, const int *dy, int *dx) {
    dx[0] = ir_build2(&a->bld, OP_div, dy[0], n->in[0]);
}

static void vjp_sqrt(Ad *a, const Node *n, const int *dy, int *dx) { /* dy * 0.5 / y */
    int y = n->out[0];
    dx[0] = ir_build2(&a->bld, OP_div, ir_build2(&a->bld, OP_mul, dy[0], fill(a, vtype(a, y), 0.5)), y);
}

static void vjp_rsqrt(Ad *a, const Node *n, const int *dy, int *dx) { /* dy * -0.5 * y^3 */
    int y = n->out[0];
    int h = ir_build2(&a->bld, OP_mul, dy[0], fill(a, vtype(a, y), -0.5));
    dx[0] = ir_build2(&a->bld, OP_mul, ir_build2(&a->bld, OP_mul, ir_build2(&a->bld, OP_mul, h, y), y), y);
}

static void vjp_tanh(Ad *a, const Node *n, const int *dy, int *dx) { /* dy * (1 - y^2) */
    int y = n->out[0];
    int one = fill(a, vtype(a, y), 1.0);
    dx[0] = ir_build2(&a->bld, OP_mul, dy[0], ir_build2(&a->bld, OP_sub, one, ir_build2(&a->bld, OP_mul, y, y)));
}

static void vjp_gelu(Ad *a, const Node *n, const int *dy, int *dx) {
    dx[0] = ir_build2(&a->bld, OP_gelu_bwd, dy[0], n->in[0]);
}

static void vjp_silu(Ad *a, const Node *n, const int *dy, int *dx) {
    dx[0] = ir_build2(&a->bld, OP_silu_bwd, dy[0], n->in[0]);
}

static void vjp_relu(Ad *a, const Node *n, const int *dy, int *dx) {
    dx[0] = ir_build2(&a->bld, OP_relu_bwd, dy[0], n->in[0]);
}

/* ---- issue 17: sigmoid, abs, pow, minimum, maximum, where ---- */

static void vjp_sigmoid(Ad *a, const Node *n, const int *dy, int *dx) { /* dy * y * (1 - y) */
    int y = n->out[0];
    int one = fill(a, vtype(a, y), 1.0);
    dx[0] = ir_build2(&a->bld, OP_mul, ir_build2(&a->bld, OP_mul, dy[0], y), ir_build2(&a->bld, OP_sub, one, y));
}

static void vjp_abs(Ad *a, const Node *n, const int *dy, int *dx) { /* dy * sign(x), 0 at 0 as PyTorch */
    dx[0] = ir_build2(&a->bld, OP_abs_bwd, dy[0], n->in[0]);
}

/* dy * p * x^(p-1); p = 0 has none (PyTorch masks it to 0, also at x = 0) */
static void vjp_pow(Ad *a, const Node *n, const int *dy, int *dx) {
    double p = ir_attr_f(n, "p", 1);
    Type t = vtype(a, dy[0]);
    if (p == 0) {
        dx[0] = fill(a, t, 0.0);
        return;
    }
    Attr at = ir_attr_float(a->m, "p", p - 1);
    int d = ir_build1(&a->bld, OP_pow, n->in[0], 1, &at);
    dx[0] = ir_build2(&a->bld, OP_mul, dy[0], ir_build2(&a->bld, OP_mul, fill(a, t, p), d));
}

static int ternary(Ad *a, Op op, int x, int y, int z) {
    int in[3] = {x, y, z};
    return ir_out(a->bld.g, ir_build(&a->bld, op, 3, in, 0, NULL, NULL));
}

/* minimum, maximum: the smaller (larger) side gets dy, a tie dy/2 each */
static void vjp_minmax(Ad *a, const Node *n, const int *dy, int *dx) {
    Op bwd = n->op == OP_minimum ? OP_minimum_bwd : OP_maximum_bwd;
    if (wants(a, n, 0)) dx[0] = ternary(a, bwd, dy[0], n->in[0], n->in[1]);
    if (wants(a, n, 1)) dx[1] = ternary(a, bwd, dy[0], n->in[1], n->in[0]);
}

/* where(c, a, b): dy to a where c, to b elsewhere; the mask gets none */
static void vjp_where(Ad *a, const Node *n, const int *dy, int *dx) {
    int c = n->in[0], zero = fill(a, vtype(a, dy[0]), 0.0);
    if (wants(a, n, 1)) dx[1] = ternary(a, OP_where, c, dy[0], zero);
    if (wants(a, n, 2)) dx[2] = ternary(a, OP_where, c, zero, dy[0]);
}

/* dy of a reduction over `dim`, spread back over x's shape. */
static int spread(Ad *a, const Node *n, int dy) {
    Type tx = vtype(a, n->in[0]);
    if (!ir_attr_i(n, "keep", 0)) {
        Type k = tx;
        k.dim[ir_attr_i(n, "dim", 0)] = 1;
        dy = reshape(a, dy, k);
    }
    return broadcast(a, dy, tx);
}

static void vjp_sum(Ad *a, const Node *n, const int *dy, int *dx) {
    dx[0] = spread(a, n, dy[0]);
}

static void vjp_mean(Ad *a, const Node *n, const int *dy, int *dx) {
    Type tx = vtype(a, n->in[0]);
    int s = spread(a, n, dy[0]), cnt = fill(a, tx, (double)tx.dim[ir_attr_i(n, "dim", 0)]);
    dx[0] = ir_build2(&a->bld, OP_div, s, cnt);
}

static void vjp_max(Ad *a, const Node *n, const int *dy, int *dx) {
    int in[3] = {dy[0], n->in[0], n->out[0]};
    dx[0] = ir_out(a->bld.g, emit_like(a, OP_max_bwd, n, 3, in));
}

static void vjp_sumsq(Ad *a, const Node *n, const int *dy, int *dx) { /* 2 x dy */
    Type tx = vtype(a, n->in[0]);
    int d = broadcast(a, cast(a, dy[0], tx.dt), tx), xd = ir_build2(&a->bld, OP_mul, d, n->in[0]);
    dx[0] = ir_build2(&a->bld, OP_mul, xd, fill(a, tx, 2.0));
}

static void vjp_reshape(Ad *a, const Node *n, const int *dy, int *dx) {
    dx[0] = reshape(a, dy[0], vtype(a, n->in[0]));
}

static void vjp_transpose(Ad *a, const Node *n, const int *dy, int *dx) {
    dx[0] = transpose(a, dy[0], (int)ir_attr_i(n, "a", 0), (int)ir_attr_i(n, "b", 0));
}

/* Recorded as a piece of the input's gradient (see Piece); joined by join_pieces. */
static void vjp_slice(Ad *a, const Node *n, const int *dy, int *dx) {
    if (a->npieces == a->cappieces) {
        a->cappieces = a->cappieces ? 2 * a->cappieces : 64;
        a->pieces = realloc(a->pieces, sizeof(Piece) * (size_t)a->cappieces);
        if (!a->pieces) ICE("autodiff: out of memory");
    }
    a->pieces[a->npieces++] = (Piece){n->in[0], (int)ir_attr_i(n, "dim", 0), dy[0], ir_attr_i(n, "start", 0),
                                      ir_attr_i(n, "end", 0), a->bld.loc, a->bld.layer};
    dx[0] = -1;
}

static int by_start(const void *x, const void *y) {
    const Piece *p = x, *q = y;
    return p->start < q->start ? -1 : p->start > q->start;
}

/* Concatenate pieces of v sorted by start, all on dim, not overlapping:
 * zeros fill the gaps. */
static int concat_pieces(Ad *a, int v, Piece *p, int np, int dim) {
    Type tv = vtype(a, v), z = tv;
    int *parts = malloc(sizeof(int) * (size_t)(2 * np + 1)), k = 0;
    if (!parts) ICE("autodiff: out of memory");
    int64_t at = 0;
    for (int i = 0; i <= np; i++) {
        int64_t next = i < np ? p[i].start : tv.dim[dim];
        if (next > at) z.dim[dim] = next - at, parts[k++] = cnst(a, z, 0.0);
        if (i < np) parts[k++] = p[i].dy, at = p[i].end;
    }
    Attr att = ir_attr_int(a->m, "dim", dim);
    int r = k == 1 ? parts[0] : ir_out(a->bld.g, ir_build(&a->bld, OP_concat, k, parts, 1, &att, NULL));
    free(parts);
    return r;
}

/* Fold the slice pieces of v into its gradient: one concat when they lie on
 * one dim without overlapping, else one concat per piece. */
static void join_pieces(Ad *a, int v) {
    Piece *mine = malloc(sizeof(Piece) * (size_t)(a->npieces ? a->npieces : 1));
    if (!mine) ICE("autodiff: out of memory");
    int np = 0, keep = 0;
    for (int i = 0; i < a->npieces; i++)
        if (a->pieces[i].v == v) mine[np++] = a->pieces[i];
        else a->pieces[keep++] = a->pieces[i];
    a->npieces = keep;
    if (np) {
        qsort(mine, (size_t)np, sizeof *mine, by_start);
        int disjoint = 1;
        for (int i = 0; i < np; i++)
            disjoint &= mine[i].dim == mine[0].dim && (i == 0 || mine[i].start >= mine[i - 1].end);
        a->bld.loc = mine[0].loc, a->bld.layer = mine[0].layer;
        int dv = disjoint ? concat_pieces(a, v, mine, np, mine[0].dim) : -1;
        for (int i = 0; !disjoint && i < np; i++) {
            int one = concat_pieces(a, v, &mine[i], 1, mine[i].dim);
            dv = dv < 0 ? one : ir_build2(&a->bld, OP_add, dv, one);
        }
        a->grad[v] = a->grad[v] < 0 ? dv : ir_build2(&a->bld, OP_add, a->grad[v], dv);
    }
    free(mine);
}

static void vjp_concat(Ad *a, const Node *n, const int *dy, int *dx) {
    int dim = (int)ir_attr_i(n, "dim", 0);
    int64_t off = 0;
    for (int i = 0; i < n->nin; i++) {
        int64_t len = vtype(a, n->in[i]).dim[dim];
        if (wants(a, n, i)) dx[i] = slice(a, dy[0], dim, off, off + len);
        off += len;
    }
}

static void vjp_broadcast(Ad *a, const Node *n, const int *dy, int *dx) {
    Type tx = vtype(a, n->in[0]);
    Attr at = shape_attr(a, "shape", &tx);
    dx[0] = ir_build1(&a->bld, OP_sumto, dy[0], 1, &at);
}

static void vjp_sumto(Ad *a, const Node *n, const int *dy, int *dx) {
    dx[0] = broadcast(a, dy[0], vtype(a, n->in[0]));
}

static void vjp_cast(Ad *a, const Node *n, const int *dy, int *dx) {
    dx[0] = cast(a, dy[0], vtype(a, n->in[0]).dt);
}

/* y = op(a) op(b) with op(a) = A[..,M,K], op(b) = B[K,N]:
 * dA = dy B^T, dB = A^T dy; each written as one matmul with flags.  b may be
 * rank 2 under a batched a: then dB sums over the batch, which is one matmul
 * of a and dy folded to rank 2. */
static void vjp_matmul(Ad *a, const Node *n, const int *dy, int *dx) {
    int x = n->in[0], w = n->in[1], g = dy[0];
    int ta = (int)ir_attr_i(n, "ta", 0), tb = (int)ir_attr_i(n, "tb", 0);
    Type tx = vtype(a, x), tw = vtype(a, w), tg = vtype(a, g);
    int r = tx.rank, shared = tw.rank == 2 && r > 2;
    if (wants(a, n, 0)) {
        if (!ta) dx[0] = matmul(a, g, w, 0, !tb);          /* dy B^T        [..,M,K] */
        else if (!shared) dx[0] = matmul(a, w, g, tb, 1);  /* B dy^T        [..,K,M] */
        else dx[0] = transpose(a, matmul(a, g, w, 0, !tb), r - 2, r - 1);
    }
    if (wants(a, n, 1)) {
        int x2 = x, g2 = g, ta2 = ta;
        if (shared) { /* fold the batch into rows: [..,M,K] -> [BM,K], dy -> [BM,N] */
            if (ta) x2 = transpose(a, x, r - 2, r - 1), ta2 = 0;
            Type f = {.dt = tx.dt, .rank = 2};
            f.dim[0] = ir_numel(&tg) / tg.dim[r - 1];
            f.dim[1] = tx.dim[ta ? r - 2 : r - 1];
            x2 = reshape(a, x2, f);
            Type fg = {.dt = tg.dt, .rank = 2, .dim = {f.dim[0], tg.dim[r - 1]}};
            g2 = reshape(a, g, fg);
        }
        if (!tb) dx[1] = matmul(a, x2, g2, !ta2, 0); /* A^T dy [K,N] */
        else dx[1] = matmul(a, g2, x2, 1, ta2);      /* dy^T A [N,K] */
    }
}

/* Each fused op's backward op takes (dy, saved inputs) and the same attrs and
 * returns one gradient per differentiable input. */
static void fused_bwd(Ad *a, const Node *n, Op op, int nin, const int *in, int *dx) {
    int b = emit_like(a, op, n, nin, in);
    Node *bn = &a->bld.g->nodes[b];
    for (int i = 0; i < bn->nout && i < n->nin; i++) /* layernorm without a bias: db unread */
        if (wants(a, n, i)) dx[i] = bn->out[i];
}

static void vjp_layernorm(Ad *a, const Node *n, const int *dy, int *dx) {
    int in[3] = {dy[0], n->in[0], n->in[1]};
    fused_bwd(a, n, OP_layernorm_bwd, 3, in, dx);
}

static void vjp_rmsnorm(Ad *a, const Node *n, const int *dy, int *dx) {
    int in[3] = {dy[0], n->in[0], n->in[1]};
    fused_bwd(a, n, OP_rmsnorm_bwd, 3, in, dx);
}

static void vjp_softmax(Ad *a, const Node *n, const int *dy, int *dx) {
    dx[0] = ir_build2(&a->bld, OP_softmax_bwd, dy[0], n->out[0]);
}

static void vjp_rope(Ad *a, const Node *n, const int *dy, int *dx) {
    int in[2] = {dy[0], n->in[1]};
    fused_bwd(a, n, OP_rope_bwd, 2, in, dx);
}

/* dropout (issue 17): y = x*mask/(1-p) is linear in x with the same mask,
 * so dx is the same op on dy: the mask is recomputed from the hash, never
 * saved; step, rows and pos get no gradient. */
static void vjp_dropout(Ad *a, const Node *n, const int *dy, int *dx) {
    int in[4] = {dy[0], n->in[1], n->in[2], n->in[3]};
    dx[0] = ir_out(a->bld.g, emit_like(a, OP_dropout, n, 4, in));
}

/* Accumulate into dx[i] (for rules that contribute twice). */
static void add_to(Ad *a, int *dx, int v) { *dx = *dx < 0 ? v : ir_build2(&a->bld, OP_add, *dx, v); }

/* attention_bwd gets the forward's positions (inputs 3, 4 when present) and
 * masks as the forward did; positions are integers and get no gradient. */
static void vjp_attention(Ad *a, const Node *n, const int *dy, int *dx) {
    int q = n->in[0], k = n->in[1], v = n->in[2], o = n->out[0], lse = n->out[1];
    int npos = n->nin - 3, nin = 6 + npos;
    if (npos != 0 && npos != 2) ICE("autodiff: attention with %d inputs", n->nin);
    if (dy[0] >= 0) {
        int in[8] = {dy[0], q, k, v, o, lse};
        for (int i = 0; i < npos; i++) in[6 + i] = n->in[3 + i];
        fused_bwd(a, n, OP_attention_bwd, nin, in, dx);
    }
    if (dy[1] >= 0) { /* see the essay: d score += dlse * p */
        Type tq = vtype(a, q), col = vtype(a, dy[1]);
        col.rank = 4;
        col.dim[3] = 1;
        int lane = cast(a, reshape(a, dy[1], col), tq.dt); /* [B,H,T,1] */
        int dout = lane;
        if (tq.dim[3] > 1) {
            Type z = tq;
            z.dim[3] -= 1;
            int parts[2] = {lane, cnst(a, z, 0.0)};
            Attr at = ir_attr_int(a->m, "dim", 3);
            dout = ir_out(a->bld.g, ir_build(&a->bld, OP_concat, 2, parts, 1, &at, NULL));
        }
        int ones = fill(a, vtype(a, v), 1.0), zero = cnst(a, tq, 0.0);
        int in[8] = {dout, q, k, ones, zero, lse};
        for (int i = 0; i < npos; i++) in[6 + i] = n->in[3 + i];
        int b = emit_like(a, OP_attention_bwd, n, nin, in);
        int dq = a->bld.g->nodes[b].out[0], dk = a->bld.g->nodes[b].out[1];
        if (wants(a, n, 0)) add_to(a, &dx[0], dq);
        if (wants(a, n, 1)) add_to(a, &dx[1], dk);
    }
}

static void vjp_embedding(Ad *a, const Node *n, const int *dy, int *dx) {
    Attr at = ir_attr_int(a->m, "v", vtype(a, n->in[0]).dim[0]);
    int in[2] = {dy[0], n->in[1]};
    dx[0] = ir_out(a->bld.g, ir_build(&a->bld, OP_embedding_bwd, 2, in, 1, &at, NULL));
}

static void vjp_cross_entropy(Ad *a, const Node *n, const int *dy, int *dx) {
    int in[3] = {dy[0], n->in[0], n->in[1]};
    dx[0] = ir_out(a->bld.g, ir_build(&a->bld, OP_cross_entropy_bwd, 3, in, 0, NULL, NULL));
}

static void vjp_loss(Ad *a, const Node *n, const int *dy, int *dx) { dx[0] = dy[0]; }

/* Collectives: the transpose of a linear map over the group. */
static void vjp_allreduce(Ad *a, const Node *n, const int *dy, int *dx) {
    dx[0] = ir_out(a->bld.g, emit_like(a, OP_allreduce, n, 1, dy));
}

static void vjp_reducescatter(Ad *a, const Node *n, const int *dy, int *dx) {
    dx[0] = ir_out(a->bld.g, emit_like(a, OP_allgather, n, 1, dy));
}

static void vjp_allgather(Ad *a, const Node *n, const int *dy, int *dx) {
    dx[0] = ir_out(a->bld.g, emit_like(a, OP_reducescatter, n, 1, dy));
}

static const VjpFn vjp[OP_COUNT] = {
    [OP_add] = vjp_add, [OP_sub] = vjp_sub, [OP_mul] = vjp_mul, [OP_div] = vjp_div,
    [OP_neg] = vjp_neg, [OP_exp] = vjp_exp, [OP_log] = vjp_log, [OP_sqrt] = vjp_sqrt,
    [OP_rsqrt] = vjp_rsqrt, [OP_tanh] = vjp_tanh, [OP_gelu] = vjp_gelu, [OP_silu] = vjp_silu,
    [OP_relu] = vjp_relu,
    [OP_sigmoid] = vjp_sigmoid, [OP_abs] = vjp_abs, [OP_pow] = vjp_pow, [OP_minimum] = vjp_minmax,
    [OP_maximum] = vjp_minmax, [OP_where] = vjp_where, /* issue 17 */
    [OP_sum] = vjp_sum, [OP_mean] = vjp_mean, [OP_max] = vjp_max,
    [OP_sumsq] = vjp_sumsq, [OP_reshape] = vjp_reshape, [OP_transpose] = vjp_transpose,
    [OP_slice] = vjp_slice, [OP_concat] = vjp_concat, [OP_broadcast] = vjp_broadcast,
    [OP_sumto] = vjp_sumto, [OP_cast] = vjp_cast, [OP_matmul] = vjp_matmul,
    [OP_layernorm] = vjp_layernorm, [OP_rmsnorm] = vjp_rmsnorm, [OP_softmax] = vjp_softmax,
    [OP_rope] = vjp_rope, [OP_dropout] = vjp_dropout, [OP_attention] = vjp_attention, [OP_embedding] = vjp_embedding,
    [OP_cross_entropy] = vjp_cross_entropy, [OP_loss] = vjp_loss,
    [OP_allreduce] = vjp_allreduce, [OP_reducescatter] = vjp_reducescatter,
    [OP_allgather] = vjp_allgather,
};

/* ---- the sweep ---- */

static int is_float(const Graph *g, int v) { return ir_dtype_is_float(g->vals[v].t.dt); }

/* need[v] = v is float, depends on a param, and reaches the loss. */
static void find_needed(Ad *a, int loss_val) {
    Graph *g = a->bld.g;
    char *dep = calloc(a->nval, 1), *reach = calloc(a->nval, 1);
    for (int i = 0; i < a->nfwd; i++) {
        const Node *n = &g->nodes[i];
        int d = n->op == OP_param;
        for (int j = 0; j < n->nin; j++) d |= dep[n->in[j]];
        for (int j = 0; j < n->nout; j++) dep[n->out[j]] = d && is_float(g, n->out[j]);
    }
    reach[loss_val] = 1;
    for (int i = a->nfwd - 1; i >= 0; i--) {
        const Node *n = &g->nodes[i];
        int r = 0;
        for (int j = 0; j < n->nout; j++) r |= reach[n->out[j]];
        for (int j = 0; j < n->nin && r; j++) reach[n->in[j]] |= is_float(g, n->in[j]);
    }
    for (int v = 0; v < a->nval; v++) a->need[v] = dep[v] && reach[v];
    free(dep);
    free(reach);
}

static void accumulate(Ad *a, int v, int dv) {
    Type tv = vtype(a, v), td = vtype(a, dv);
    if (!ir_type_eq(&tv, &td)) {
        char b1[64], b2[64];
        ICE("autodiff: gradient of %%%d has type %s, want %s", v, ir_type_str(&td, b2, sizeof b2),
            ir_type_str(&tv, b1, sizeof b1));
    }
    a->grad[v] = a->grad[v] < 0 ? dv : ir_build2(&a->bld, OP_add, a->grad[v], dv);
}

static void backprop_node(Ad *a, int i) {
    Node n = a->bld.g->nodes[i]; /* a copy: emitting reallocates the node array */
    int any_in = 0, dy[8], dx[IR_MAXIN];
    ir_ice_at(n.loc);
    if (n.nin > IR_MAXIN || n.nout > 8) ICE("autodiff: op %s has too many operands", ir_ops[n.op].name);
    for (int j = 0; j < n.nin; j++) any_in |= a->need[n.in[j]];
    if (!any_in) return;
    int any_out = 0;
    for (int j = 0; j < n.nout; j++) {
        if (a->need[n.out[j]]) join_pieces(a, n.out[j]);
        dy[j] = a->need[n.out[j]] ? a->grad[n.out[j]] : -1;
        any_out |= dy[j] >= 0;
    }
    if (!any_out) return;
    if (!vjp[n.op]) ICE("autodiff: no VJP rule for op %s", ir_ops[n.op].name);
    for (int j = 0; j < n.nin; j++) dx[j] = -1;
    a->bld.loc = n.loc;
    a->bld.layer = n.layer;
    vjp[n.op](a, &n, dy, dx);
    for (int j = 0; j < n.nin; j++)
        if (dx[j] >= 0 && a->need[n.in[j]]) accumulate(a, n.in[j], dx[j]);
}

static void add_output(Ad *a, int v, const char *name, Loc loc, int layer, Phase ph) {
    Attr at = ir_attr_str(a->m, "name", name);
    NodeSpec s = ir_spec(OP_output, loc);
    s.nin = 1;
    s.in = &v;
    s.nattr = 1;
    s.attr = &at;
    s.layer = layer;
    s.phase = ph;
    char err[256];
    if (ir_add_node(a->bld.g, &s, err, sizeof err) < 0) ICE("autodiff: output %s: %s", name, err);
}

static int find_loss(const Graph *g) {
    int loss = -1;
    for (int i = 0; i < g->nnodes; i++)
        if (ir_ops[g->nodes[i].op].flags & F_LOSS) {
            if (loss >= 0) ICE("autodiff: more than one loss node");
            loss = i;
        }
    if (loss < 0) ICE("autodiff: no loss node");
    return loss;
}

static int has_output(const Graph *g, const char *name) {
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i].op == OP_output && !strcmp(ir_attr_s(&g->nodes[i], "name", ""), name))
            return 1;
    return 0;
}

/* The training step exposes the loss and the gradients.  The model's own
 * outputs (output("logits", x)) are for forward-only programs (sampling);
 * kept here they would hold their buffers to the end of the step. */
static void drop_model_outputs(Graph *g) {
    int k = 0;
    for (int i = 0; i < g->nnodes; i++) {
        Node *n = &g->nodes[i];
        if (n->op == OP_output && strcmp(ir_attr_s(n, "name", ""), "loss") != 0) continue;
        for (int j = 0; j < n->nout; j++) g->vals[n->out[j]].def = k;
        g->nodes[k++] = *n;
    }
    g->nnodes = k;
}

void pass_autodiff(Module *m, const Options *o) {
    (void)o;
    if (m->nstages != 1) ICE("autodiff: expects one stage, got %d", m->nstages);
    Graph *g = m->stages[0];
    drop_model_outputs(g);
    Ad a = {.m = m, .nfwd = g->nnodes, .nval = g->nvals};
    a.bld = (Builder){.g = g, .pass = "autodiff", .layer = -1, .phase = PH_BWD};
    a.need = calloc(a.nval, 1);
    a.grad = malloc(sizeof(int) * a.nval);
    for (int v = 0; v < a.nval; v++) a.grad[v] = -1;

    int ln = find_loss(g), lv = ir_out(g, ln);
    Loc lloc = g->nodes[ln].loc;
    int llayer = g->nodes[ln].layer;
    find_needed(&a, lv);

    a.bld.loc = lloc, a.bld.layer = llayer;
    if (a.need[lv]) a.grad[lv] = cnst(&a, vtype(&a, lv), 1.0);
    for (int i = a.nfwd - 1; i >= 0; i--) backprop_node(&a, i);

    if (!has_output(g, "loss")) add_output(&a, lv, "loss", lloc, llayer, PH_FWD);
    for (int i = 0; i < a.nfwd; i++) {
        Node p = g->nodes[i];
        if (p.op != OP_param) continue;
        join_pieces(&a, p.out[0]);
        int gv = a.grad[p.out[0]];
        a.bld.loc = p.loc, a.bld.layer = p.layer;
        if (gv < 0) gv = cnst(&a, vtype(&a, p.out[0]), 0.0);
        char name[512];
        snprintf(name, sizeof name, "grad:%s", ir_attr_s(&p, "name", "?"));
        add_output(&a, gv, name, p.loc, p.layer, PH_BWD);
    }
    free(a.need);
    free(a.grad);
    free(a.pieces);
}
