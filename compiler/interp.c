/* interp.c — the reference interpreter: runs any module, every mesh rank in
 * one process.
 *
 * This is kiln's ground truth.  Every pass is checked by running the module
 * before and after it here and comparing losses and gradients, so the code
 * favours being obviously right over being fast: one C function per op,
 * written as plain loops straight from the op's line in ops.def.  Only the
 * hot loops (matmul in i-k-j order on contiguous rows, attention, the norms)
 * are written with some care, because `kiln run --interp` trains the tiny
 * model with them.
 *
 * Numbers.  Every tensor holds doubles.  In f64 mode nothing is rounded (the
 * mode gradient checks use).  In f32 mode every element an op writes is
 * rounded to its value's dtype right after the op: through (float) for f32,
 * round-to-nearest-even on the f32 bits for bf16, _Float16 for f16.  Ops may
 * accumulate in double before that rounding.  Integers are stored as doubles
 * and truncated toward zero.
 *
 * State.  Each rank owns a dictionary of persistent tensors, one slot per
 * param/state name, created with the type of the first node reading it.
 * interp_init_state fills params from their init attribute; a "normal"
 * param draws from splitmix64 + Box-Muller seeded by hash(name) ^ seed, so
 * every rank (and every interpreter with the same seed) sees the same
 * numbers.  A param split by parallelize draws its *global* tensor and keeps
 * its own block, so a sharded module starts from the same weights as the
 * unsharded one.  `assign` writes are not applied when the node runs: they
 * commit when the rank finishes the step, so every read in a step sees the
 * old value.  All values of the last run are kept for interp_value.
 *
 * Ranks.  All ranks run as cooperative threads of control in one OS
 * thread.  Each rank has a program counter over its stage's graph; the
 * scheduler advances every rank until it blocks, at a recv whose message has
 * not arrived or at a collective.  A collective runs once every member of
 * its group waits at a collective over the same group (and the same op, or
 * it is an error).  send never blocks: it copies into a FIFO mailbox keyed
 * (src, dst, tag).  When no rank can move and not all are done, the run
 * fails with "deadlock: rank 0 waits at recv (file:line), ...".
 *
 * Errors.  interp_run is the one protected boundary: an op that finds bad
 * data (a token id out of range, a size mismatch in a recv) calls fail(),
 * which formats "file:line: op: message" and longjmps back to it.  Ops
 * therefore allocate nothing themselves; scratch buffers live in the Interp.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "interp.h"
#include "rng.h" /* the parameter generator, shared with the runtime */

/* ---- numbers: rounding to a dtype ---- */

static double round_bf16(double x) {
    float f = (float)x;
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return x; /* NaN stays NaN */
    u += 0x7fffu + ((u >> 16) & 1u);               /* round to nearest even */
    u &= 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}

#ifdef __FLT16_MAX__
static double round_f16(double x) { return (double)(_Float16)x; }
#else
/* No _Float16 in this compiler: f16 values are only rounded to f32. */
static double round_f16(double x) { return (float)x; }
#endif

/* Round n values to dtype dt (f64 mode leaves floats exact). */
static void round_to(double *d, int64_t n, DType dt, int f64) {
    switch (dt) {
    case DT_F32:
        if (!f64)
            for (int64_t i = 0; i < n; i++) d[i] = (float)d[i];
        break;
    case DT_BF16:
        if (!f64)
            for (int64_t i = 0; i < n; i++) d[i] = round_bf16(d[i]);
        break;
    case DT_F16:
        if (!f64)
            for (int64_t i = 0; i < n; i++) d[i] = round_f16(d[i]);
        break;
    default:
        for (int64_t i = 0; i < n; i++) d[i] = trunc(d[i]);
    }
}

/* ---- the interpreter's data ---- */

typedef struct {
    const char *name;
    int node; /* the first node naming it */
    Tensor t;
    int set;  /* inputs: given by interp_set_input */
} Slot;

typedef struct {
    int id;
    const Graph *g;
    int pc, done;
    Tensor *vals;  /* [g->nvals]; d is NULL until first computed */
    Slot *state, *inputs;
    int nstate, ninputs;
    int *slot;     /* [g->nnodes]: slot of a param/state/assign/input node, else -1 */
} Rank;

typedef struct Msg {
    int src, dst, node; /* node: the send, for error messages */
    int64_t tag;
    Tensor t;
    struct Msg *next;
} Msg;

enum { NSCRATCH = 3 };

struct Interp {
    const Module *m;
    int f64, world;
    Rank *ranks;
    Msg *mail; /* FIFO: appended at the tail */
    const Tensor **inbuf;
    double *scr[NSCRATCH];
    int64_t scrcap[NSCRATCH];
    int *members, *gmem; /* [world]: group_of's answer; the group being checked */
    jmp_buf jb;
    char msg[1024];
};

static void *xmalloc(size_t n) {
    void *p = calloc(1, n ? n : 1);
    if (!p) ICE("interp: out of memory (%zu bytes)", n);
    return p;
}

static void tensor_alloc(Tensor *t, const Type *ty) {
    t->t = *ty;
    t->n = ir_numel(ty);
    t->d = xmalloc(sizeof(double) * (size_t)t->n);
}

/* Abort the run: "file:line: op: message" (or just the message without n). */
static void fail(Interp *it, const Node *n, const char *fmt, ...) __attribute__((noreturn, format(printf, 3, 4)));
static void fail(Interp *it, const Node *n, const char *fmt, ...) {
    char body[768], where[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(body, sizeof body, fmt, ap);
    va_end(ap);
    if (n)
        snprintf(it->msg, sizeof it->msg, "%s: %s: %s", ir_where(n, where, sizeof where), ir_ops[n->op].name, body);
    else
        snprintf(it->msg, sizeof it->msg, "%s", body);
    longjmp(it->jb, 1);
}

/* Scratch buffer k (of NSCRATCH) with at least n doubles, contents undefined. */
static double *scratch(Interp *it, int k, int64_t n) {
    if (n > it->scrcap[k]) {
        free(it->scr[k]);
        it->scr[k] = xmalloc(sizeof(double) * (size_t)n);
        it->scrcap[k] = n;
    }
    return it->scr[k];
}

/* ---- executing one node: the context every op function gets ---- */

typedef struct {
    Interp *it;
    Rank *R;
    const Node *n;
    const Tensor **in;
    Tensor *out[3];
} Ex;

#define IN(k) (e->in[k]->d)
#define INT(k) (&e->in[k]->t)
#define OUT(k) (e->out[k]->d)
#define NOUT(k) (e->out[k]->n)
#define OUTT(k) (&e->out[k]->t)

/* Split t at dim d: outer (dims before), len, inner (dims after). */
static void split_at(const Type *t, int d, int64_t *outer, int64_t *len, int64_t *inner) {
    *outer = *inner = 1;
    for (int i = 0; i < d; i++) *outer *= t->dim[i];
    for (int i = d + 1; i < t->rank; i++) *inner *= t->dim[i];
    *len = t->rank ? t->dim[d] : 1;
}

static int64_t last_dim(const Type *t) { return t->rank ? t->dim[t->rank - 1] : 1; }

static int attr_dim(Ex *e, const char *key, const Type *t) {
    int64_t d = ir_attr_i(e->n, key, -1);
    if (d < 0 || d >= t->rank) fail(e->it, e->n, "%s=%lld out of range for rank %d", key, (long long)d, t->rank);
    return (int)d;
}

/* ---- sources ---- */

static void ex_source(Ex *e) {
    const Node *n = e->n;
    double *y = OUT(0);
    int64_t cnt = NOUT(0);
    switch (n->op) {
    case OP_const: {
        double v = ir_attr_f(n, "v", 0);
        for (int64_t i = 0; i < cnt; i++) y[i] = v;
        break;
    }
    case OP_iota:
        for (int64_t i = 0; i < cnt; i++) y[i] = (double)i;
        break;
    case OP_param: case OP_state: case OP_input: {
        int s = e->R->slot[n - e->R->g->nodes];
        Slot *sl = n->op == OP_input ? &e->R->inputs[s] : &e->R->state[s];
        if (sl->t.n != cnt)
            fail(e->it, n, "%s has %lld elements, the node declares %lld", sl->name, (long long)sl->t.n, (long long)cnt);
        memcpy(y, sl->t.d, sizeof(double) * (size_t)cnt);
        break;
    }
    default:
        ICE("interp: %s is not a source", ir_ops[n->op].name);
    }
}

/* ---- elementwise ---- */

static const double GELU_K = 0.7978845608028654; /* sqrt(2/pi) */

static double gelu(double x) { return 0.5 * x * (1 + tanh(GELU_K * (x + 0.044715 * x * x * x))); }
static double gelu_d(double x) {
    double th = tanh(GELU_K * (x + 0.044715 * x * x * x));
    return 0.5 * (1 + th) + 0.5 * x * (1 - th * th) * GELU_K * (1 + 3 * 0.044715 * x * x);
}
static double sigmoid(double x) { return 1 / (1 + exp(-x)); }

static void ex_binary(Ex *e) {
    const double *a = IN(0), *b = IN(1);
    double *y = OUT(0);
    int64_t n = NOUT(0);
    switch (e->n->op) {
    case OP_add: for (int64_t i = 0; i < n; i++) y[i] = a[i] + b[i]; break;
    case OP_sub: for (int64_t i = 0; i < n; i++) y[i] = a[i] - b[i]; break;
    case OP_mul: for (int64_t i = 0; i < n; i++) y[i] = a[i] * b[i]; break;
    case OP_div: for (int64_t i = 0; i < n; i++) y[i] = a[i] / b[i]; break;
    /* (dy, x) -> dy * f'(x) */
    case OP_gelu_bwd: for (int64_t i = 0; i < n; i++) y[i] = a[i] * gelu_d(b[i]); break;
    case OP_silu_bwd:
        for (int64_t i = 0; i < n; i++) {
            double s = sigmoid(b[i]);
            y[i] = a[i] * s * (1 + b[i] * (1 - s));
        }
        break;
    case OP_relu_bwd: for (int64_t i = 0; i < n; i++) y[i] = b[i] > 0 ? a[i] : 0; break;
    /* issue 17: NaN propagates through minimum/maximum as in PyTorch */
    case OP_minimum: for (int64_t i = 0; i < n; i++) y[i] = isnan(a[i]) || a[i] < b[i] ? a[i] : b[i]; break;
    case OP_maximum: for (int64_t i = 0; i < n; i++) y[i] = isnan(a[i]) || a[i] > b[i] ? a[i] : b[i]; break;
    case OP_abs_bwd: for (int64_t i = 0; i < n; i++) y[i] = b[i] > 0 ? a[i] : b[i] < 0 ? -a[i] : 0; break;
    default: ICE("interp: %s is not binary", ir_ops[e->n->op].name);
    }
}

static double unary(Op op, double x) {
    switch (op) {
    case OP_neg: return -x;
    case OP_exp: return exp(x);
    case OP_log: return log(x);
    case OP_sqrt: return sqrt(x);
    case OP_rsqrt: return 1 / sqrt(x);
    case OP_tanh: return tanh(x);
    case OP_gelu: return gelu(x);
    case OP_silu: return x * sigmoid(x);
    case OP_relu: return x > 0 ? x : 0;
    case OP_sigmoid: return sigmoid(x);
    case OP_abs: return fabs(x);
    default: ICE("interp: %s is not unary", ir_ops[op].name);
    }
}

static void ex_unary(Ex *e) {
    const double *x = IN(0);
    double *y = OUT(0);
    for (int64_t i = 0; i < NOUT(0); i++) y[i] = unary(e->n->op, x[i]);
}

/* ---- issue 17: pow and the three-input elementwise ops ---- */

static void ex_pow(Ex *e) {
    const double *x = IN(0);
    double p = ir_attr_f(e->n, "p", 1), *y = OUT(0);
    for (int64_t i = 0; i < NOUT(0); i++) y[i] = pow(x[i], p);
}

/* where (c, a, b); minimum_bwd, maximum_bwd (dy, a, b): dy, dy/2 on a tie, 0 */
static void ex_ternary(Ex *e) {
    const double *c = IN(0), *a = IN(1), *b = IN(2);
    double *y = OUT(0);
    int64_t n = NOUT(0);
    switch (e->n->op) {
    case OP_where: for (int64_t i = 0; i < n; i++) y[i] = c[i] != 0 ? a[i] : b[i]; break;
    case OP_minimum_bwd: for (int64_t i = 0; i < n; i++) y[i] = a[i] < b[i] ? c[i] : a[i] == b[i] ? c[i] / 2 : 0; break;
    case OP_maximum_bwd: for (int64_t i = 0; i < n; i++) y[i] = a[i] > b[i] ? c[i] : a[i] == b[i] ? c[i] / 2 : 0; break;
    default: ICE("interp: %s is not ternary", ir_ops[e->n->op].name);
    }
}

/* cast: floats keep their value (rounding to the new dtype follows); ints truncate. */
static void ex_cast(Ex *e) { memcpy(OUT(0), IN(0), sizeof(double) * (size_t)NOUT(0)); }

/* ---- reductions ---- */

static void ex_reduce(Ex *e) {
    int d = attr_dim(e, "dim", INT(0));
    int64_t outer, len, inner;
    split_at(INT(0), d, &outer, &len, &inner);
    const double *x = IN(0);
    double *y = OUT(0);
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < inner; j++) {
            const double *p = x + o * len * inner + j;
            double acc = e->n->op == OP_max ? -INFINITY : 0;
            for (int64_t k = 0; k < len; k++) {
                double v = p[k * inner];
                if (e->n->op == OP_max) acc = v > acc || isnan(v) ? v : acc;
                else acc += v;
            }
            y[o * inner + j] = e->n->op == OP_mean ? acc / (double)len : acc;
        }
}

/* (dy, x, y) -> dx: dy goes to the first argmax of x along dim. */
static void ex_max_bwd(Ex *e) {
    int d = attr_dim(e, "dim", INT(1));
    int64_t outer, len, inner;
    split_at(INT(1), d, &outer, &len, &inner);
    const double *dy = IN(0), *x = IN(1);
    double *dx = OUT(0);
    memset(dx, 0, sizeof(double) * (size_t)NOUT(0));
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < inner; j++) {
            const double *p = x + o * len * inner + j;
            int64_t best = 0;
            for (int64_t k = 1; k < len; k++)
                if (p[k * inner] > p[best * inner]) best = k;
            dx[(o * len + best) * inner + j] = dy[o * inner + j];
        }
}

static void ex_sumsq(Ex *e) {
    double acc = 0;
    const double *x = IN(0);
    for (int64_t i = 0; i < e->in[0]->n; i++) acc += x[i] * x[i];
    OUT(0)[0] = acc;
}

/* ---- shape ops ---- */

static void ex_copy(Ex *e) { memcpy(OUT(0), IN(0), sizeof(double) * (size_t)NOUT(0)); }

static void ex_transpose(Ex *e) {
    int a = attr_dim(e, "a", INT(0)), b = attr_dim(e, "b", INT(0));
    if (a == b) { ex_copy(e); return; }
    if (a > b) { int t = a; a = b; b = t; }
    /* x as [outer, A, mid, B, inner] -> y as [outer, B, mid, A, inner] */
    const Type *t = INT(0);
    int64_t outer = 1, mid = 1, inner = 1, A = t->dim[a], B = t->dim[b];
    for (int i = 0; i < a; i++) outer *= t->dim[i];
    for (int i = a + 1; i < b; i++) mid *= t->dim[i];
    for (int i = b + 1; i < t->rank; i++) inner *= t->dim[i];
    const double *x = IN(0);
    double *y = OUT(0);
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < A; i++)
            for (int64_t m = 0; m < mid; m++)
                for (int64_t j = 0; j < B; j++) {
                    const double *src = x + (((o * A + i) * mid + m) * B + j) * inner;
                    double *dst = y + (((o * B + j) * mid + m) * A + i) * inner;
                    memcpy(dst, src, sizeof(double) * (size_t)inner);
                }
}

static void ex_slice(Ex *e) {
    int d = attr_dim(e, "dim", INT(0));
    int64_t outer, len, inner, start = ir_attr_i(e->n, "start", 0);
    int64_t olen = OUTT(0)->dim[d];
    split_at(INT(0), d, &outer, &len, &inner);
    for (int64_t o = 0; o < outer; o++)
        memcpy(OUT(0) + o * olen * inner, IN(0) + (o * len + start) * inner, sizeof(double) * (size_t)(olen * inner));
}

static void ex_concat(Ex *e) {
    int d = attr_dim(e, "dim", OUTT(0));
    int64_t outer, olen, inner, at = 0;
    split_at(OUTT(0), d, &outer, &olen, &inner);
    for (int k = 0; k < e->n->nin; k++) {
        int64_t len = INT(k)->dim[d];
        for (int64_t o = 0; o < outer; o++)
            memcpy(OUT(0) + (o * olen + at) * inner, IN(k) + o * len * inner, sizeof(double) * (size_t)(len * inner));
        at += len;
    }
}

/* Walk every element of `big`; st[] are the strides into `small`, which
 * broadcasts to big (numpy rule; stride 0 on a broadcast dim).  sum=0:
 * big[i] = small[off]; sum=1: small[off] += big[i]. */
static void bcast_walk(const Type *small, const Type *big, double *sd, double *bd, int sum) {
    int64_t st[IR_MAXRANK], idx[IR_MAXRANK] = {0}, s = 1, off = 0;
    int shift = big->rank - small->rank;
    for (int d = big->rank - 1; d >= 0; d--) {
        int k = d - shift;
        st[d] = k < 0 || small->dim[k] == 1 ? 0 : s;
        if (k >= 0) s *= small->dim[k];
    }
    int64_t n = ir_numel(big);
    for (int64_t i = 0; i < n; i++) {
        if (sum) sd[off] += bd[i];
        else bd[i] = sd[off];
        for (int d = big->rank - 1; d >= 0; d--) {
            off += st[d];
            if (++idx[d] < big->dim[d]) break;
            off -= st[d] * big->dim[d];
            idx[d] = 0;
        }
    }
}

static void ex_broadcast(Ex *e) { bcast_walk(INT(0), OUTT(0), (double *)IN(0), OUT(0), 0); }

static void ex_sumto(Ex *e) {
    memset(OUT(0), 0, sizeof(double) * (size_t)NOUT(0));
    bcast_walk(OUTT(0), INT(0), OUT(0), (double *)IN(0), 1);
}

/* ---- matmul ---- */

/* y += a*x: the inner loop of matmul and attention.  GCC's -O2 vectorizes
 * only loops that need no scalar remainder; this one is worth it (2x on
 * matmul).  Elementwise, so the result is the same bit for bit. */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("tree-vectorize", "vect-cost-model=dynamic")))
#endif
static void axpy(double *restrict y, double a, const double *restrict x, int64_t n) {
    for (int64_t j = 0; j < n; j++) y[j] += a * x[j];
}

/* c[M,N] = a[M,K] b[K,N] (ta: a stored [K,M]); b rows contiguous. */
static void gemm(const double *a, const double *b, double *c, int64_t M, int64_t K, int64_t N, int ta) {
    memset(c, 0, sizeof(double) * (size_t)(M * N));
    if (!ta) { /* i-k-j */
        for (int64_t i = 0; i < M; i++)
            for (int64_t k = 0; k < K; k++) axpy(c + i * N, a[i * K + k], b + k * N, N);
    } else { /* k-i-j: row k of a is column k of the logical a */
        for (int64_t k = 0; k < K; k++)
            for (int64_t i = 0; i < M; i++) axpy(c + i * N, a[k * M + i], b + k * N, N);
    }
}

/* a[..,M,K] x b[K,N] or b[..,K,N] -> [..,M,N]; ta/tb: stored transposed.
 * A rank-2 operand is shared by every batch (stride 0). */
static void ex_matmul(Ex *e) {
    const Type *at = INT(0), *bt = INT(1), *yt = OUTT(0);
    int ta = ir_attr_i(e->n, "ta", 0) != 0, tb = ir_attr_i(e->n, "tb", 0) != 0;
    int64_t M = yt->dim[yt->rank - 2], N = yt->dim[yt->rank - 1];
    int64_t K = at->dim[at->rank - 1 - ta];
    int64_t batch = NOUT(0) / (M * N);
    int64_t sa = at->rank > 2 ? M * K : 0, sb = bt->rank > 2 ? K * N : 0;
    double *bk = tb ? scratch(e->it, 0, K * N) : NULL;
    for (int64_t p = 0; p < batch; p++) {
        const double *b = IN(1) + p * sb;
        if (tb && (p == 0 || sb)) { /* b is [N,K]: transpose into bk[K,N] */
            for (int64_t j = 0; j < N; j++)
                for (int64_t k = 0; k < K; k++) bk[k * N + j] = b[j * K + k];
        }
        gemm(IN(0) + p * sa, tb ? bk : b, OUT(0) + p * M * N, M, K, N, ta);
    }
    if (e->n->op == OP_matmul_bias) /* + bias[N] before the one rounding of the output */
        for (int64_t r = 0; r < NOUT(0) / N; r++)
            for (int64_t j = 0; j < N; j++) OUT(0)[r * N + j] += IN(2)[j];
    if (e->n->op == OP_matmul_bias_gelu) /* GELU_AUX_BIAS: aux p = acc + bias, out gelu(p), each rounded once */
        for (int64_t i = 0, r = 0; r < NOUT(0) / N; r++)
            for (int64_t j = 0; j < N; j++, i++) OUT(1)[i] = OUT(0)[i] + IN(2)[j], OUT(0)[i] = gelu(OUT(1)[i]);
    if (e->n->op == OP_matmul_dgelu_bgrad) { /* DGELU_BGRAD: dz = p gelu'(z), db = column sums of dz, each rounded once */
        memset(OUT(1), 0, sizeof(double) * (size_t)N);
        for (int64_t i = 0, r = 0; r < NOUT(0) / N; r++)
            for (int64_t j = 0; j < N; j++, i++) OUT(0)[i] *= gelu_d(IN(2)[i]), OUT(1)[j] += OUT(0)[i];
    }
    if (e->n->op == OP_matmul_bgrad) { /* BGRADA/B: the sum over K of b [K,N] (bgrad=1) or of a [K,M] (0) */
        int of_b = ir_attr_i(e->n, "bgrad", 1) != 0;
        int64_t X = of_b ? N : M;
        const double *v = IN(of_b ? 1 : 0);
        memset(OUT(1), 0, sizeof(double) * (size_t)X);
        for (int64_t k = 0; k < K; k++)
            for (int64_t j = 0; j < X; j++) OUT(1)[j] += v[k * X + j];
    }
}

/* ---- norms and softmax: x viewed as rows of its last dim C ---- */

static void ex_layernorm(Ex *e) {
    int64_t C = last_dim(INT(0)), rows = e->in[0]->n / C;
    double eps = ir_attr_f(e->n, "eps", 1e-5);
    const double *w = IN(1), *b = e->n->nin > 2 ? IN(2) : NULL; /* no bias: 0 (issue 17) */
    for (int64_t r = 0; r < rows; r++) {
        const double *x = IN(0) + r * C;
        double *y = OUT(0) + r * C, mean = 0, var = 0;
        for (int64_t i = 0; i < C; i++) mean += x[i];
        mean /= (double)C;
        for (int64_t i = 0; i < C; i++) var += (x[i] - mean) * (x[i] - mean);
        double rstd = 1 / sqrt(var / (double)C + eps);
        for (int64_t i = 0; i < C; i++) y[i] = (x[i] - mean) * rstd * w[i] + (b ? b[i] : 0);
    }
}

/* (dy, x, w) -> dx, dw, db.  xhat = (x-mean)*rstd, g = dy*w:
 * dx = rstd*(g - mean(g) - xhat*mean(g*xhat)); dw = sum dy*xhat; db = sum dy. */
static void ex_layernorm_bwd(Ex *e) {
    int64_t C = last_dim(INT(1)), rows = e->in[1]->n / C;
    double eps = ir_attr_f(e->n, "eps", 1e-5);
    const double *w = IN(2);
    double *dw = OUT(1), *db = OUT(2);
    memset(dw, 0, sizeof(double) * (size_t)C);
    memset(db, 0, sizeof(double) * (size_t)C);
    for (int64_t r = 0; r < rows; r++) {
        const double *dy = IN(0) + r * C, *x = IN(1) + r * C;
        double *dx = OUT(0) + r * C, mean = 0, var = 0, mg = 0, mgx = 0;
        for (int64_t i = 0; i < C; i++) mean += x[i];
        mean /= (double)C;
        for (int64_t i = 0; i < C; i++) var += (x[i] - mean) * (x[i] - mean);
        double rstd = 1 / sqrt(var / (double)C + eps);
        for (int64_t i = 0; i < C; i++) {
            double xh = (x[i] - mean) * rstd, g = dy[i] * w[i];
            mg += g;
            mgx += g * xh;
            dw[i] += dy[i] * xh;
            db[i] += dy[i];
        }
        mg /= (double)C;
        mgx /= (double)C;
        for (int64_t i = 0; i < C; i++) dx[i] = rstd * (dy[i] * w[i] - mg - (x[i] - mean) * rstd * mgx);
    }
}

static void ex_rmsnorm(Ex *e) {
    int64_t C = last_dim(INT(0)), rows = e->in[0]->n / C;
    double eps = ir_attr_f(e->n, "eps", 1e-5);
    const double *w = IN(1);
    for (int64_t r = 0; r < rows; r++) {
        const double *x = IN(0) + r * C;
        double *y = OUT(0) + r * C, ms = 0;
        for (int64_t i = 0; i < C; i++) ms += x[i] * x[i];
        double rs = 1 / sqrt(ms / (double)C + eps);
        for (int64_t i = 0; i < C; i++) y[i] = x[i] * rs * w[i];
    }
}

/* (dy, x, w) -> dx, dw.  rs = rsqrt(mean(x^2)+eps), g = dy*w:
 * dx = rs*g - x*rs^3*mean(g*x); dw = sum dy*x*rs. */
static void ex_rmsnorm_bwd(Ex *e) {
    int64_t C = last_dim(INT(1)), rows = e->in[1]->n / C;
    double eps = ir_attr_f(e->n, "eps", 1e-5);
    const double *w = IN(2);
    double *dw = OUT(1);
    memset(dw, 0, sizeof(double) * (size_t)C);
    for (int64_t r = 0; r < rows; r++) {
        const double *dy = IN(0) + r * C, *x = IN(1) + r * C;
        double *dx = OUT(0) + r * C, ms = 0, mgx = 0;
        for (int64_t i = 0; i < C; i++) ms += x[i] * x[i];
        double rs = 1 / sqrt(ms / (double)C + eps);
        for (int64_t i = 0; i < C; i++) {
            mgx += dy[i] * w[i] * x[i];
            dw[i] += dy[i] * x[i] * rs;
        }
        mgx /= (double)C;
        for (int64_t i = 0; i < C; i++) dx[i] = rs * dy[i] * w[i] - x[i] * rs * rs * rs * mgx;
    }
}

static void ex_softmax(Ex *e) {
    int64_t C = last_dim(INT(0)), rows = e->in[0]->n / C;
    for (int64_t r = 0; r < rows; r++) {
        const double *x = IN(0) + r * C;
        double *y = OUT(0) + r * C, m = -INFINITY, s = 0;
        for (int64_t i = 0; i < C; i++) m = x[i] > m ? x[i] : m;
        for (int64_t i = 0; i < C; i++) s += y[i] = exp(x[i] - m);
        for (int64_t i = 0; i < C; i++) y[i] /= s;
    }
}

/* (dy, y) -> y*(dy - sum(dy*y)) */
static void ex_softmax_bwd(Ex *e) {
    int64_t C = last_dim(INT(0)), rows = e->in[0]->n / C;
    for (int64_t r = 0; r < rows; r++) {
        const double *dy = IN(0) + r * C, *y = IN(1) + r * C;
        double *dx = OUT(0) + r * C, s = 0;
        for (int64_t i = 0; i < C; i++) s += dy[i] * y[i];
        for (int64_t i = 0; i < C; i++) dx[i] = y[i] * (dy[i] - s);
    }
}

/* ---- dropout (issue 17): x[B,T,F..], step, rows[B], pos[T]; the mask from
 * runtime/rng.h's hash of the global indices (ops.def), scale 1/(1-p) ---- */

static void ex_dropout(Ex *e) {
    const Type *t = INT(0);
    int64_t B = t->dim[0], T = t->dim[1], F = ir_numel(t) / (B * T);
    double p = ir_attr_f(e->n, "p", 0), scale = 1 / (1 - p);
    uint64_t key = rng_dropout_key((uint64_t)ir_attr_i(e->n, "seed", 0), ir_attr_i(e->n, "id", 0), rng_dropout_step(IN(1)[0]));
    uint32_t thr = rng_dropout_threshold(p);
    for (int64_t b = 0; b < B; b++)
        for (int64_t tt = 0; tt < T; tt++) {
            uint64_t row = rng_dropout_row(key, (int32_t)IN(2)[b], (int32_t)IN(3)[tt]);
            const double *x = IN(0) + (b * T + tt) * F;
            double *y = OUT(0) + (b * T + tt) * F;
            for (int64_t f = 0; f < F; f++) y[f] = rng_dropout_bits(row, f) >= thr ? x[f] * scale : 0;
        }
}

/* ---- rope: x[B,T,H,D], pos[T]; rotate-half, angle = pos*theta^(-2i/D) ---- */

static void ex_rope(Ex *e) {
    const Type *t = INT(0);
    int64_t B = t->dim[0], T = t->dim[1], H = t->dim[2], D = t->dim[3], half = D / 2;
    double theta = ir_attr_f(e->n, "theta", 10000), sgn = e->n->op == OP_rope_bwd ? -1 : 1;
    double *cs = scratch(e->it, 0, half), *sn = scratch(e->it, 1, half);
    for (int64_t tt = 0; tt < T; tt++) {
        double pos = IN(1)[tt];
        for (int64_t i = 0; i < half; i++) {
            double a = pos * pow(theta, -2.0 * (double)i / (double)D);
            cs[i] = cos(a);
            sn[i] = sgn * sin(a);
        }
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++) {
                int64_t off = ((b * T + tt) * H + h) * D;
                const double *x = IN(0) + off;
                double *y = OUT(0) + off;
                for (int64_t i = 0; i < half; i++) {
                    y[i] = x[i] * cs[i] - x[i + half] * sn[i];
                    y[i + half] = x[i + half] * cs[i] + x[i] * sn[i];
                }
            }
    }
}

/* ---- attention: q[B,H,T,D], k,v[B,KH,S,D]; head h reads kv head h/(H/KH) ----
 * Causal masking compares token positions: key s is visible to query t iff
 * kpos[s] <= qpos[t], with the optional position inputs (any order: context
 * parallel chunks, K/V blocks of other ranks) or 0..T-1 and 0..S-1; a
 * window W > 0 (sliding-window attention) also needs qpos[t] - kpos[s] < W,
 * so W keys with the query's own.  Keys are visited in index order either
 * way, so positions 0..T-1 give exactly the arithmetic of the plain op. */

typedef struct {
    int64_t B, H, KH, T, S, D;
    int causal;
    double scale, window; /* window: 0 for none */
    const double *qpos, *kpos; /* NULL: positions are the indices */
} AttnDims;

/* q, k are inputs `first` and `first`+1; qpos, kpos, if present, come after
 * the op's nfixed other inputs. */
static AttnDims attn_dims(Ex *e, int first, int nfixed) {
    const Type *q = INT(first), *k = INT(first + 1);
    AttnDims a = {q->dim[0], q->dim[1], k->dim[1], q->dim[2], k->dim[2], q->dim[3], 0, 0, 0, NULL, NULL};
    a.causal = ir_attr_i(e->n, "causal", 0) != 0;
    a.window = (double)ir_attr_i(e->n, "window", 0);
    a.scale = ir_attr_f(e->n, "scale", 1 / sqrt((double)a.D));
    if (e->n->nin == nfixed + 2) a.qpos = IN(nfixed), a.kpos = IN(nfixed + 1);
    return a;
}

/* key s visible to query t */
static int visible(const AttnDims *a, int64_t t, int64_t s) {
    if (!a->causal) return 1;
    double d = a->qpos ? a->qpos[t] - a->kpos[s] : (double)(t - s);
    return d >= 0 && (a->window == 0 || d < a->window);
}

static double dot(const double *x, const double *y, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += x[i] * y[i];
    return s;
}

static void ex_attention(Ex *e) {
    AttnDims a = attn_dims(e, 0, 3);
    int64_t D = a.D, rep = a.H / a.KH;
    double *p = scratch(e->it, 0, a.S);
    for (int64_t b = 0; b < a.B; b++)
        for (int64_t h = 0; h < a.H; h++) {
            int64_t kh = h / rep;
            const double *q = IN(0) + (b * a.H + h) * a.T * D;
            const double *k = IN(1) + (b * a.KH + kh) * a.S * D, *v = IN(2) + (b * a.KH + kh) * a.S * D;
            double *o = OUT(0) + (b * a.H + h) * a.T * D, *lse = OUT(1) + (b * a.H + h) * a.T;
            for (int64_t t = 0; t < a.T; t++) {
                double *ot = o + t * D, m = -INFINITY, l = 0;
                memset(ot, 0, sizeof(double) * (size_t)D);
                for (int64_t s = 0; s < a.S; s++) {
                    if (!visible(&a, t, s)) continue;
                    p[s] = a.scale * dot(q + t * D, k + s * D, D);
                    m = p[s] > m ? p[s] : m;
                }
                /* no visible key, or every score -inf: o = 0, lse = -inf */
                if (m == -INFINITY) { lse[t] = -INFINITY; continue; }
                for (int64_t s = 0; s < a.S; s++) {
                    if (!visible(&a, t, s)) continue;
                    p[s] = exp(p[s] - m);
                    l += p[s];
                    axpy(ot, p[s], v + s * D, D);
                }
                for (int64_t d = 0; d < D; d++) ot[d] /= l;
                lse[t] = m + log(l);
            }
        }
}

/* (do, q, k, v, o, lse [, qpos, kpos]) -> dq, dk, dv with P = exp(scale q.k - lse)
 * over the visible keys: dv += P do; dS = P (do.v - do.o); dq += scale dS k;
 * dk += scale dS q.  A row with lse = -inf (no key) contributes nothing. */
static void ex_attention_bwd(Ex *e) {
    AttnDims a = attn_dims(e, 1, 6);
    int64_t D = a.D, rep = a.H / a.KH;
    double *dq = OUT(0), *dk = OUT(1), *dv = OUT(2);
    memset(dq, 0, sizeof(double) * (size_t)NOUT(0));
    memset(dk, 0, sizeof(double) * (size_t)NOUT(1));
    memset(dv, 0, sizeof(double) * (size_t)NOUT(2));
    for (int64_t b = 0; b < a.B; b++)
        for (int64_t h = 0; h < a.H; h++) {
            int64_t kh = h / rep, qoff = (b * a.H + h) * a.T * D, koff = (b * a.KH + kh) * a.S * D;
            const double *dO = IN(0) + qoff, *q = IN(1) + qoff, *k = IN(2) + koff, *v = IN(3) + koff;
            const double *o = IN(4) + qoff, *lse = IN(5) + (b * a.H + h) * a.T;
            for (int64_t t = 0; t < a.T; t++) {
                if (lse[t] == -INFINITY) continue;
                const double *dot_ = dO + t * D, *qt = q + t * D;
                double Dt = dot(dot_, o + t * D, D), *dqt = dq + qoff + t * D;
                for (int64_t s = 0; s < a.S; s++) {
                    if (!visible(&a, t, s)) continue;
                    const double *ks = k + s * D, *vs = v + s * D;
                    double *dks = dk + koff + s * D, *dvs = dv + koff + s * D;
                    double P = exp(a.scale * dot(qt, ks, D) - lse[t]);
                    double dS = P * (dot(dot_, vs, D) - Dt) * a.scale;
                    axpy(dvs, P, dot_, D);
                    axpy(dqt, dS, ks, D);
                    axpy(dks, dS, qt, D);
                }
            }
        }
}

/* attn_merge: two partial attentions over disjoint key sets -> the
 * attention over their union.  A part with lse -inf (its keys all masked
 * for that row) weighs 0; both -inf: o = 0, lse = -inf. */
static void ex_attn_merge(Ex *e) {
    int64_t rows = e->in[1]->n, D = e->in[0]->n / (rows ? rows : 1);
    for (int64_t r = 0; r < rows; r++) {
        double la = IN(1)[r], lb = IN(3)[r], hi = la > lb ? la : lb, lo = la > lb ? lb : la;
        double lse = hi == -INFINITY ? -INFINITY : hi + log1p(exp(lo - hi));
        double wa = la == -INFINITY ? 0 : exp(la - lse), wb = lb == -INFINITY ? 0 : exp(lb - lse);
        for (int64_t d = 0; d < D; d++) OUT(0)[r * D + d] = wa * IN(0)[r * D + d] + wb * IN(2)[r * D + d];
        OUT(1)[r] = lse;
    }
}

/* ---- embedding and loss ---- */

/* ids[i] as an index in [0, V), or fail naming the op. */
static int64_t id_at(Ex *e, const double *ids, int64_t i, int64_t V) {
    double id = ids[i];
    if (!(id >= 0 && id < (double)V)) fail(e->it, e->n, "id %.17g out of range [0,%lld)", id, (long long)V);
    return (int64_t)id;
}

static void ex_embedding(Ex *e) {
    int64_t V = INT(0)->dim[0], C = INT(0)->dim[1], n = e->in[1]->n;
    for (int64_t i = 0; i < n; i++)
        memcpy(OUT(0) + i * C, IN(0) + id_at(e, IN(1), i, V) * C, sizeof(double) * (size_t)C);
}

static void ex_embedding_bwd(Ex *e) {
    int64_t V = OUTT(0)->dim[0], C = OUTT(0)->dim[1], n = e->in[1]->n;
    memset(OUT(0), 0, sizeof(double) * (size_t)NOUT(0));
    for (int64_t i = 0; i < n; i++) {
        double *row = OUT(0) + id_at(e, IN(1), i, V) * C;
        for (int64_t c = 0; c < C; c++) row[c] += IN(0)[i * C + c];
    }
}

/* log(sum(exp(x))) over n values, max-shifted */
static double logsumexp(const double *x, int64_t n) {
    double m = -INFINITY, s = 0;
    for (int64_t i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    for (int64_t i = 0; i < n; i++) s += exp(x[i] - m);
    return m + log(s);
}

static void ex_cross_entropy(Ex *e) {
    int64_t V = last_dim(INT(0)), n = e->in[1]->n;
    for (int64_t r = 0; r < n; r++) {
        const double *x = IN(0) + r * V;
        OUT(0)[r] = logsumexp(x, V) - x[id_at(e, IN(1), r, V)];
    }
}

/* One row of cross-entropy's backward: dx = dl*(softmax(x) - onehot(tg));
 * returns the row's loss, read before dx is written (dx may be x: F_INPLACE). */
static double xent_row_grad(const double *x, int64_t V, int64_t tg, double dl, double *dx) {
    double lse = logsumexp(x, V), loss = lse - x[tg];
    for (int64_t i = 0; i < V; i++) dx[i] = dl * (exp(x[i] - lse) - (i == tg));
    return loss;
}

/* (dl, logits, targets) -> dl*(softmax - onehot) */
static void ex_cross_entropy_bwd(Ex *e) {
    int64_t V = last_dim(INT(1)), n = e->in[2]->n;
    for (int64_t r = 0; r < n; r++)
        (void)xent_row_grad(IN(1) + r * V, V, id_at(e, IN(2), r, V), IN(0)[r], OUT(0) + r * V);
}

/* (dl, logits, targets) -> dlogits, loss: the two above in one op (xent_fuse.c) */
static void ex_cross_entropy_fused(Ex *e) {
    int64_t V = last_dim(INT(1)), n = e->in[2]->n;
    for (int64_t r = 0; r < n; r++)
        OUT(1)[r] = xent_row_grad(IN(1) + r * V, V, id_at(e, IN(2), r, V), IN(0)[r], OUT(0) + r * V);
}

/* ---- optimizer ---- */

static void ex_lr_cosine(Ex *e) {
    double t = IN(0)[0], lr = ir_attr_f(e->n, "lr", 0), min_lr = ir_attr_f(e->n, "min_lr", 0);
    double warmup = ir_attr_f(e->n, "warmup", 0), total = ir_attr_f(e->n, "total", 0);
    if (warmup > 0 && t <= warmup) {
        OUT(0)[0] = lr * t / warmup;
        return;
    }
    double p = total > warmup ? (t - warmup) / (total - warmup) : 1;
    p = p < 0 ? 0 : p > 1 ? 1 : p;
    OUT(0)[0] = min_lr + 0.5 * (1 + cos(M_PI * p)) * (lr - min_lr);
}

static void ex_clipscale(Ex *e) {
    double mx = ir_attr_f(e->n, "max", 0), norm = IN(0)[0], s = mx / (norm + 1e-6);
    OUT(0)[0] = mx <= 0 || s > 1 ? 1 : s;
}

/* (p, g, m, v, lr, scale, t) -> p', m', v': torch.optim.AdamW on g*scale. */
static void ex_adamw(Ex *e) {
    double b1 = ir_attr_f(e->n, "b1", 0.9), b2 = ir_attr_f(e->n, "b2", 0.999);
    double eps = ir_attr_f(e->n, "eps", 1e-8), wd = ir_attr_f(e->n, "wd", 0.01);
    double lr = IN(4)[0], scale = IN(5)[0], t = IN(6)[0];
    double bc1 = 1 - pow(b1, t), bc2 = 1 - pow(b2, t);
    for (int64_t i = 0; i < NOUT(0); i++) {
        double g = IN(1)[i] * scale, p = IN(0)[i];
        double m = b1 * IN(2)[i] + (1 - b1) * g;
        double v = b2 * IN(3)[i] + (1 - b2) * g * g;
        p -= lr * wd * p;
        p -= lr * (m / bc1) / (sqrt(v / bc2) + eps);
        OUT(0)[i] = p;
        OUT(1)[i] = m;
        OUT(2)[i] = v;
    }
}

/* ---- dispatch ---- */

static void exec_local(Ex *e) {
    switch (e->n->op) {
    case OP_input: case OP_param: case OP_state: case OP_const: case OP_iota: ex_source(e); break;
    case OP_output: case OP_assign: break; /* outputs are kept values; assigns commit at step end */
    case OP_record: case OP_wait: break;    /* the interpreter runs one stream in program order */
    case OP_offload: case OP_reload: ex_copy(e); break; /* device <-> host copies: the same numbers */
    case OP_add: case OP_sub: case OP_mul: case OP_div:
    case OP_gelu_bwd: case OP_silu_bwd: case OP_relu_bwd: ex_binary(e); break;
    case OP_neg: case OP_exp: case OP_log: case OP_sqrt: case OP_rsqrt:
    case OP_tanh: case OP_gelu: case OP_silu: case OP_relu: ex_unary(e); break;
    /* issue 17 */
    case OP_sigmoid: case OP_abs: ex_unary(e); break;
    case OP_pow: ex_pow(e); break;
    case OP_minimum: case OP_maximum: case OP_abs_bwd: ex_binary(e); break;
    case OP_where: case OP_minimum_bwd: case OP_maximum_bwd: ex_ternary(e); break;
    case OP_sum: case OP_mean: case OP_max: ex_reduce(e); break;
    case OP_max_bwd: ex_max_bwd(e); break;
    case OP_sumsq: ex_sumsq(e); break;
    case OP_reshape: case OP_loss: ex_copy(e); break;
    case OP_transpose: ex_transpose(e); break;
    case OP_slice: ex_slice(e); break;
    case OP_concat: ex_concat(e); break;
    case OP_broadcast: ex_broadcast(e); break;
    case OP_sumto: ex_sumto(e); break;
    case OP_cast: ex_cast(e); break;
    case OP_matmul: case OP_matmul_bias: case OP_matmul_bias_gelu: case OP_matmul_dgelu_bgrad: case OP_matmul_bgrad:
        ex_matmul(e);
        break;
    case OP_layernorm: ex_layernorm(e); break;
    case OP_layernorm_bwd: ex_layernorm_bwd(e); break;
    case OP_rmsnorm: ex_rmsnorm(e); break;
    case OP_rmsnorm_bwd: ex_rmsnorm_bwd(e); break;
    case OP_softmax: ex_softmax(e); break;
    case OP_softmax_bwd: ex_softmax_bwd(e); break;
    case OP_rope: case OP_rope_bwd: ex_rope(e); break;
    case OP_dropout: ex_dropout(e); break;
    case OP_attention: ex_attention(e); break;
    case OP_attention_bwd: ex_attention_bwd(e); break;
    case OP_attn_merge: ex_attn_merge(e); break;
    case OP_embedding: ex_embedding(e); break;
    case OP_embedding_bwd: ex_embedding_bwd(e); break;
    case OP_cross_entropy: ex_cross_entropy(e); break;
    case OP_cross_entropy_bwd: ex_cross_entropy_bwd(e); break;
    case OP_cross_entropy_fused: ex_cross_entropy_fused(e); break;
    case OP_lr_cosine: ex_lr_cosine(e); break;
    case OP_clipscale: ex_clipscale(e); break;
    case OP_adamw: ex_adamw(e); break;
    default: ICE("interp: no local semantics for %s", ir_ops[e->n->op].name);
    }
}

/* The context of node n on rank R: inputs (already computed), outputs
 * (allocated on first use, reused by later runs). */
static Ex ex_of(Interp *it, Rank *R, const Node *n) {
    Ex e = {it, R, n, it->inbuf, {0}};
    for (int k = 0; k < n->nin; k++) {
        const Tensor *t = &R->vals[n->in[k]];
        if (!t->d) ICE("interp: rank %d: %%%d used before it is computed", R->id, n->in[k]);
        it->inbuf[k] = t;
    }
    for (int k = 0; k < n->nout && k < 3; k++) {
        Tensor *t = &R->vals[n->out[k]];
        if (!t->d) tensor_alloc(t, &R->g->vals[n->out[k]].t);
        e.out[k] = t;
    }
    return e;
}

static void round_outputs(Interp *it, Ex *e) {
    for (int k = 0; k < e->n->nout && k < 3; k++) round_to(e->out[k]->d, e->out[k]->n, e->out[k]->t.dt, it->f64);
}

/* ---- communication ---- */

static int is_collective(const Node *n) {
    unsigned f = ir_ops[n->op].flags;
    return (f & F_COMM) && !(f & (F_SINK | F_SOURCE)) && n->op != OP_recv_done;
}

/* A blocking receive: recv, or the wait of a posted one (recv_done). */
static int is_recv(const Node *n) { return n->op == OP_recv || n->op == OP_recv_done; }

/* The node's group: mask, members (into it->members), this rank's index. */
static int group_of(Interp *it, const Rank *R, const Node *n, int *mask, int *index) {
    const char *g = ir_attr_s(n, "group", "");
    *mask = ir_group_mask(g);
    if (*mask < 0) fail(it, n, "bad group \"%s\"", g);
    return ir_group_members(it->m, R->id, *mask, it->members, index);
}

/* The world rank of group-rank (index + {peer}) mod size. */
static int peer_of(Interp *it, const Rank *R, const Node *n) {
    int mask, idx, size = group_of(it, R, n, &mask, &idx);
    int64_t peer = ir_attr_i(n, "peer", 0);
    return it->members[(int)(((idx + peer) % size + size) % size)];
}

static void do_send(Interp *it, Rank *R, const Node *n) {
    Msg *msg = xmalloc(sizeof *msg);
    const Tensor *x = &R->vals[n->in[0]];
    msg->src = R->id;
    msg->dst = peer_of(it, R, n);
    msg->node = (int)(n - R->g->nodes);
    msg->tag = ir_attr_i(n, "tag", 0);
    tensor_alloc(&msg->t, &x->t);
    memcpy(msg->t.d, x->d, sizeof(double) * (size_t)x->n);
    Msg **p = &it->mail;
    while (*p) p = &(*p)->next;
    *p = msg;
}

/* 1 if the message for this recv was there (and is now in its value). */
static int try_recv(Interp *it, Rank *R, const Node *n) {
    int src = peer_of(it, R, n);
    int64_t tag = ir_attr_i(n, "tag", 0);
    for (Msg **p = &it->mail; *p; p = &(*p)->next) {
        Msg *msg = *p;
        if (msg->src != src || msg->dst != R->id || msg->tag != tag) continue;
        Ex ex = ex_of(it, R, n), *e = &ex;
        if (msg->t.n != NOUT(0))
            fail(it, n, "rank %d got %lld elements from rank %d (tag %lld), expected %lld", R->id,
                 (long long)msg->t.n, src, (long long)tag, (long long)NOUT(0));
        memcpy(OUT(0), msg->t.d, sizeof(double) * (size_t)msg->t.n);
        round_outputs(it, e);
        *p = msg->next;
        free(msg->t.d);
        free(msg);
        return 1;
    }
    return 0;
}

/* recv_start: the receive is posted; its buffer holds NaN until its
 * recv_done fills the done's value (nothing else may read it: a reader
 * would see NaN and kiln check would say so). */
static void do_post(Interp *it, Rank *R, const Node *n) {
    Ex ex = ex_of(it, R, n), *e = &ex;
    for (int64_t j = 0; j < NOUT(0); j++) OUT(0)[j] = NAN;
}

/* shard: this rank's chunk (its index in the group) of dim, no communication. */
static void do_shard(Interp *it, Rank *R, const Node *n) {
    Ex ex = ex_of(it, R, n), *e = &ex;
    int mask, idx, size = group_of(it, R, n, &mask, &idx);
    const Type *t = &R->vals[n->in[0]].t;
    int64_t outer, len, inner;
    split_at(t, attr_dim(e, "dim", t), &outer, &len, &inner);
    int64_t c = len / size;
    const double *x = R->vals[n->in[0]].d;
    for (int64_t o = 0; o < outer; o++)
        memcpy(OUT(0) + o * c * inner, x + (o * len + idx * c) * inner, sizeof(double) * (size_t)(c * inner));
    round_outputs(it, e);
}

/* positions of group rank r of size ranks, a piece of len tokens */
static void rank_positions(double *out, int64_t len, int r, int size, int dual) {
    int64_t c = len / 2;
    if (dual)
        for (int64_t k = 0; k < c; k++) out[k] = (double)(r * c + k), out[c + k] = (double)((2 * size - 1 - r) * c + k);
    else
        for (int64_t k = 0; k < len; k++) out[k] = (double)(r * len + k);
}

/* iota {group, layout, from, all}: the global positions of a rank's tokens
 * when the sequence is split over the group: "contiguous" piece i, or
 * "dual" chunks i and 2n-1-i of 2n (context parallel's load-balanced
 * layout).  The rank is this one, or the one `from` places before it in
 * the group (ring attention's travelling K,V block: its positions need no
 * message); with all=1 every rank's, in group order (the all-gathered
 * keys'). */
static void do_rank_iota(Interp *it, Rank *R, const Node *n) {
    Ex ex = ex_of(it, R, n), *e = &ex;
    int mask, idx, size = group_of(it, R, n, &mask, &idx);
    int dual = strcmp(ir_attr_s(n, "layout", "contiguous"), "dual") == 0, all = ir_attr_i(n, "all", 0) != 0;
    int64_t len = NOUT(0), from = ir_attr_i(n, "from", 0), piece = all ? len / size : len;
    if (all && len % size) fail(it, n, "iota: all=1 needs a length divisible by the group's %d ranks, got %lld", size, (long long)len);
    if (dual && piece % 2) fail(it, n, "iota: dual layout needs an even length, got %lld", (long long)piece);
    for (int j = 0; j < (all ? size : 1); j++)
        rank_positions(OUT(0) + j * piece, piece, all ? j : (int)(((idx - from) % size + size) % size), size, dual);
}

static const Node *node_at(const Rank *R) { return R->pc < R->g->nnodes ? &R->g->nodes[R->pc] : NULL; }

/* Run the collective the members (world ranks, in group order) wait at. */
static void run_collective(Interp *it, const int *mem, int size) {
    Rank *R0 = &it->ranks[mem[0]];
    const Node *n0 = node_at(R0);
    const Type *t0 = &R0->vals[n0->in[0]].t;
    int64_t n = ir_numel(t0);
    for (int i = 1; i < size; i++) {
        Rank *R = &it->ranks[mem[i]];
        if (!ir_type_eq(&R->vals[node_at(R)->in[0]].t, t0))
            fail(it, node_at(R), "rank %d's input differs in type from rank %d's", mem[i], mem[0]);
    }
    double *acc = scratch(it, 2, n);
    if (n0->op != OP_allgather) { /* allreduce, reducescatter: sum in group order */
        memset(acc, 0, sizeof(double) * (size_t)n);
        for (int i = 0; i < size; i++) {
            const double *x = it->ranks[mem[i]].vals[node_at(&it->ranks[mem[i]])->in[0]].d;
            for (int64_t j = 0; j < n; j++) acc[j] += x[j];
        }
    }
    for (int i = 0; i < size; i++) {
        Rank *R = &it->ranks[mem[i]];
        Ex ex = ex_of(it, R, node_at(R)), *e = &ex;
        int64_t outer, len, inner;
        if (n0->op == OP_allreduce) {
            if (NOUT(0) != n) fail(it, e->n, "output size differs from the input's");
            memcpy(OUT(0), acc, sizeof(double) * (size_t)n);
        } else if (n0->op == OP_reducescatter) { /* keep chunk i of dim */
            int d = attr_dim(e, "dim", t0);
            split_at(t0, d, &outer, &len, &inner);
            if (len % size) fail(it, e->n, "dim %d of size %lld not divisible by group size %d", d, (long long)len, size);
            int64_t c = len / size;
            if (NOUT(0) != n / size) fail(it, e->n, "output size is not 1/%d of the input's", size);
            for (int64_t o = 0; o < outer; o++)
                memcpy(OUT(0) + o * c * inner, acc + (o * len + i * c) * inner, sizeof(double) * (size_t)(c * inner));
        } else { /* allgather: member j's tensor is chunk j of dim */
            int d = attr_dim(e, "dim", t0);
            split_at(t0, d, &outer, &len, &inner);
            if (NOUT(0) != n * size) fail(it, e->n, "output size is not %d times the input's", size);
            for (int j = 0; j < size; j++) {
                const Rank *S = &it->ranks[mem[j]];
                const double *x = S->vals[node_at(S)->in[0]].d;
                for (int64_t o = 0; o < outer; o++)
                    memcpy(OUT(0) + (o * size + j) * len * inner, x + o * len * inner, sizeof(double) * (size_t)(len * inner));
            }
        }
        round_outputs(it, e);
    }
    for (int i = 0; i < size; i++) it->ranks[mem[i]].pc++;
}

/* Run every collective whose whole group has arrived; 1 if any ran. */
static int step_collectives(Interp *it) {
    int progress = 0, *mem = it->gmem;
    for (int r = 0; r < it->world; r++) {
        Rank *R = &it->ranks[r];
        const Node *n = node_at(R);
        if (!n || !is_collective(n)) continue;
        int mask, idx, size = group_of(it, R, n, &mask, &idx), ready = 1;
        memcpy(mem, it->members, sizeof(int) * (size_t)size);
        for (int i = 0; i < size && ready; i++) {
            const Node *m = node_at(&it->ranks[mem[i]]);
            int mmask = -1, midx;
            if (m && is_collective(m)) group_of(it, &it->ranks[mem[i]], m, &mmask, &midx);
            ready = mmask == mask;
        }
        if (!ready) continue;
        for (int i = 0; i < size; i++) {
            const Node *m = node_at(&it->ranks[mem[i]]);
            if (m->op != n->op) {
                char a[160], b[160];
                fail(it, NULL, "collective mismatch: rank %d at %s (%s), rank %d at %s (%s)", r, ir_ops[n->op].name,
                     ir_where(n, a, sizeof a), mem[i], ir_ops[m->op].name, ir_where(m, b, sizeof b));
            }
        }
        run_collective(it, mem, size);
        progress = 1;
    }
    return progress;
}

/* ---- the scheduler ---- */

/* Apply the buffered assigns of a rank that finished its step (called once
 * every rank has, so a failed run leaves the state as it was). */
static void commit(Interp *it, Rank *R) {
    for (int i = 0; i < R->g->nnodes; i++) {
        const Node *n = &R->g->nodes[i];
        if (n->op != OP_assign) continue;
        Slot *s = &R->state[R->slot[i]];
        const Tensor *x = &R->vals[n->in[0]];
        if (x->n != s->t.n)
            fail(it, n, "%s has %lld elements, the value written has %lld", s->name, (long long)s->t.n, (long long)x->n);
        memcpy(s->t.d, x->d, sizeof(double) * (size_t)x->n);
        round_to(s->t.d, s->t.n, s->t.t.dt, it->f64);
    }
}

/* Advance rank R until it blocks or finishes; 1 if it moved. */
static int advance(Interp *it, Rank *R) {
    int moved = 0;
    for (const Node *n; (n = node_at(R)); R->pc++, moved = 1) {
        if (is_collective(n)) return moved;
        if (is_recv(n)) {
            if (!try_recv(it, R, n)) return moved;
        } else if (n->op == OP_recv_start) {
            do_post(it, R, n);
        } else if (n->op == OP_send) {
            do_send(it, R, n);
        } else if (n->op == OP_shard) {
            do_shard(it, R, n);
        } else if (n->op == OP_iota && ir_attr(n, "group")) {
            do_rank_iota(it, R, n);
        } else {
            Ex e = ex_of(it, R, n);
            exec_local(&e);
            round_outputs(it, &e);
        }
    }
    if (!R->done) R->done = moved = 1;
    return moved;
}

static void deadlock(Interp *it) {
    char *buf = it->msg, where[160];
    size_t k = (size_t)snprintf(buf, sizeof it->msg, "deadlock:");
    for (int r = 0; r < it->world && k < sizeof it->msg; r++) {
        const Node *n = node_at(&it->ranks[r]);
        if (n && is_recv(n))
            k += (size_t)snprintf(buf + k, sizeof it->msg - k, "%s rank %d waits at %s from rank %d, tag %lld, mb %d (%s)",
                                  k > 9 ? "," : "", r, ir_ops[n->op].name, peer_of(it, &it->ranks[r], n), (long long)ir_attr_i(n, "tag", 0), n->mb,
                                  ir_where(n, where, sizeof where));
        else if (n)
            k += (size_t)snprintf(buf + k, sizeof it->msg - k, "%s rank %d waits at %s (%s)", k > 9 ? "," : "", r,
                                  ir_ops[n->op].name, ir_where(n, where, sizeof where));
    }
    longjmp(it->jb, 1);
}

static void check_mail_empty(Interp *it) {
    Msg *msg = it->mail;
    if (!msg) return;
    char where[160];
    const Node *n = &it->ranks[msg->src].g->nodes[msg->node];
    fail(it, NULL, "%s: send: message from rank %d to rank %d (tag %lld) was never received", ir_where(n, where, sizeof where),
         msg->src, msg->dst, (long long)msg->tag);
}

static void clear_mail(Interp *it) {
    while (it->mail) {
        Msg *next = it->mail->next;
        free(it->mail->t.d);
        free(it->mail);
        it->mail = next;
    }
}

static void run_all(Interp *it) {
    for (int r = 0; r < it->world; r++) {
        Rank *R = &it->ranks[r];
        R->pc = R->done = 0;
        for (int i = 0; i < R->ninputs; i++)
            if (!R->inputs[i].set) fail(it, NULL, "input %s not set on rank %d", R->inputs[i].name, r);
    }
    for (;;) {
        int moved = 0, done = 1;
        for (int r = 0; r < it->world; r++) moved |= advance(it, &it->ranks[r]);
        moved |= step_collectives(it);
        for (int r = 0; r < it->world; r++) done &= it->ranks[r].done;
        if (done) break;
        if (!moved) deadlock(it);
    }
    check_mail_empty(it);
    for (int r = 0; r < it->world; r++) commit(it, &it->ranks[r]);
}

/* ---- building the per-rank tables ---- */

static int find_slot(Slot *s, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (strcmp(s[i].name, name) == 0) return i;
    return -1;
}

/* The slot of `name` in (s, *n), created with node i's type if absent. */
static int slot_for(Slot *s, int *n, const Graph *g, int i) {
    const Node *nd = &g->nodes[i];
    const char *name = ir_attr_s(nd, "name", "");
    int k = find_slot(s, *n, name);
    if (k >= 0) return k;
    s[*n].name = name;
    s[*n].node = i;
    tensor_alloc(&s[*n].t, &g->vals[nd->out[0]].t);
    return (*n)++;
}

static void rank_init(Interp *it, Rank *R, int r) {
    const Module *m = it->m;
    int c[IR_NAXES];
    ir_rank_coords(m, r, c);
    R->id = r;
    R->g = m->nstages > 1 ? m->stages[c[0]] : m->stages[0];
    const Graph *g = R->g;
    R->vals = xmalloc(sizeof(Tensor) * (size_t)g->nvals);
    R->slot = xmalloc(sizeof(int) * (size_t)g->nnodes);
    R->state = xmalloc(sizeof(Slot) * (size_t)g->nnodes);
    R->inputs = xmalloc(sizeof(Slot) * (size_t)g->nnodes);
    for (int i = 0; i < g->nnodes; i++) {
        Op op = g->nodes[i].op;
        R->slot[i] = -1;
        if (op == OP_param || op == OP_state) R->slot[i] = slot_for(R->state, &R->nstate, g, i);
        if (op == OP_input) R->slot[i] = slot_for(R->inputs, &R->ninputs, g, i);
    }
    for (int i = 0; i < g->nnodes; i++) { /* assigns after every reader is known */
        const Node *n = &g->nodes[i];
        if (n->op != OP_assign) continue;
        R->slot[i] = find_slot(R->state, R->nstate, ir_attr_s(n, "name", ""));
        if (R->slot[i] < 0) {
            char where[160];
            ICE("interp: %s: assign to %s, which no param/state node reads", ir_where(n, where, sizeof where),
                ir_attr_s(n, "name", ""));
        }
    }
}

/* ---- public API ---- */

Interp *interp_new(const Module *m, int f64) {
    Interp *it = xmalloc(sizeof *it);
    it->m = m;
    it->f64 = f64;
    it->world = ir_world(m);
    if (m->nstages > 1 && m->nstages != m->mesh[0])
        ICE("interp: %d stages for a pipeline axis of %d", m->nstages, m->mesh[0]);
    int maxin = 1;
    for (int s = 0; s < m->nstages; s++)
        for (int i = 0; i < m->stages[s]->nnodes; i++)
            if (m->stages[s]->nodes[i].nin > maxin) maxin = m->stages[s]->nodes[i].nin;
    it->inbuf = xmalloc(sizeof(Tensor *) * (size_t)maxin);
    it->members = xmalloc(sizeof(int) * (size_t)it->world);
    it->gmem = xmalloc(sizeof(int) * (size_t)it->world);
    it->ranks = xmalloc(sizeof(Rank) * (size_t)it->world);
    for (int r = 0; r < it->world; r++) rank_init(it, &it->ranks[r], r);
    return it;
}

void interp_free(Interp *it) {
    if (!it) return;
    clear_mail(it);
    for (int r = 0; r < it->world; r++) {
        Rank *R = &it->ranks[r];
        for (int i = 0; i < R->g->nvals; i++) free(R->vals[i].d);
        for (int i = 0; i < R->nstate; i++) free(R->state[i].t.d);
        for (int i = 0; i < R->ninputs; i++) free(R->inputs[i].t.d);
        free(R->vals);
        free(R->slot);
        free(R->state);
        free(R->inputs);
    }
    for (int k = 0; k < NSCRATCH; k++) free(it->scr[k]);
    free(it->ranks);
    free(it->inbuf);
    free(it->members);
    free(it->gmem);
    free(it);
}

/* The global shape of a value split by parallelize, and the offset of this
 * rank's block in it.  Axes splitting the same dim nest pp, dp, cp, tp
 * (outermost first), like rank numbering. */
static void global_block(const Interp *it, int r, const Value *v, Type *glob, int64_t off[IR_MAXRANK]) {
    int c[IR_NAXES];
    ir_rank_coords(it->m, r, c);
    *glob = v->t;
    for (int d = 0; d < v->t.rank; d++) off[d] = 0;
    for (int a = 0; a < IR_NAXES; a++) {
        if (v->sh[a].kind != SH_SPLIT || it->m->mesh[a] == 1) continue;
        int d = v->sh[a].dim;
        off[d] = off[d] * it->m->mesh[a] + c[a];
        glob->dim[d] *= it->m->mesh[a];
    }
    for (int d = 0; d < v->t.rank; d++) off[d] *= v->t.dim[d];
}

/* Fill a normal param: draw the global tensor, keep this rank's block.  A
 * param split over tp in {tp_blocks} blocks (a fused QKV, tp.c) keeps its
 * slice of every block. */
static void init_normal(Interp *it, int r, const Node *n, const Value *v, Tensor *t, uint64_t seed, double std) {
    Type glob;
    int64_t off[IR_MAXRANK], idx[IR_MAXRANK] = {0};
    global_block(it, r, v, &glob, off);
    int bd = v->sh[3].kind == SH_SPLIT && it->m->mesh[3] > 1 ? v->sh[3].dim : -1, c[IR_NAXES];
    int64_t blocks = ir_attr_i(n, "tp_blocks", 1), bl = bd >= 0 ? v->t.dim[bd] / blocks : 0;
    ir_rank_coords(it->m, r, c);
    int64_t gn = ir_numel(&glob);
    if (gn == t->n) {
        rng_normal_f64(t->d, 0, t->n, seed, std);
        return;
    }
    double *all = xmalloc(sizeof(double) * (size_t)gn);
    rng_normal_f64(all, 0, gn, seed, std);
    for (int64_t i = 0; i < t->n; i++) { /* local multi-index idx -> global offset */
        int64_t g = 0;
        for (int d = 0; d < glob.rank; d++)
            g = g * glob.dim[d] + (d == bd && blocks > 1 ? idx[d] / bl * bl * it->m->mesh[3] + c[3] * bl + idx[d] % bl : off[d] + idx[d]);
        t->d[i] = all[g];
        for (int d = t->t.rank - 1; d >= 0 && ++idx[d] == t->t.dim[d]; d--) idx[d] = 0;
    }
    free(all);
}

/* A state holding a shard of params (prefix "": the distributed optimizer's
 * master weights) starts as this rank's chunk of its flat bucket. */
static void fill_param_shard(Interp *it, Rank *R, Slot *s) {
    const Node *n = &R->g->nodes[s->node];
    const char *prefix = ir_attr_s(n, "prefix", NULL);
    if (n->op != OP_state || !prefix || *prefix) return;
    int mask = ir_group_mask(ir_attr_s(n, "group", "")), idx;
    if (mask <= 0) ICE("interp: state %s: bad group", s->name);
    ir_group_members(it->m, R->id, mask, it->members, &idx);
    int64_t base = idx * s->t.n, off;
    char name[512];
    memset(s->t.d, 0, sizeof(double) * (size_t)s->t.n);
    for (int k = 0; ir_bucket_member(n, k, name, sizeof name, &off) == 0; k++) {
        int j = find_slot(R->state, R->nstate, name);
        if (j < 0) ICE("interp: state %s: no param %s", s->name, name);
        const Tensor *p = &R->state[j].t;
        for (int64_t e = 0; e < p->n; e++)
            if (off + e >= base && off + e < base + s->t.n) s->t.d[off + e - base] = p->d[e];
    }
}

void interp_init_state(Interp *it, uint64_t seed) {
    for (int r = 0; r < it->world; r++) {
        Rank *R = &it->ranks[r];
        for (int i = 0; i < R->nstate; i++) {
            Slot *s = &R->state[i];
            const Node *n = &R->g->nodes[s->node];
            const char *init = ir_attr_s(n, "init", "normal");
            if (n->op == OP_state || strcmp(init, "zeros") == 0) {
                memset(s->t.d, 0, sizeof(double) * (size_t)s->t.n);
            } else if (strcmp(init, "ones") == 0) {
                for (int64_t k = 0; k < s->t.n; k++) s->t.d[k] = 1;
            } else if (strcmp(init, "normal") == 0) {
                init_normal(it, r, n, &R->g->vals[n->out[0]], &s->t, rng_stream(s->name, seed), ir_attr_f(n, "std", 0.02));
            } else {
                error_at(n->loc, "param %s: unknown init \"%s\"", s->name, init);
            }
            round_to(s->t.d, s->t.n, s->t.t.dt, it->f64);
        }
        for (int i = 0; i < R->nstate; i++) fill_param_shard(it, R, &R->state[i]);
    }
}

Tensor *interp_state(Interp *it, int rank, const char *name) {
    if (rank < 0 || rank >= it->world) return NULL;
    Rank *R = &it->ranks[rank];
    int k = find_slot(R->state, R->nstate, name);
    return k < 0 ? NULL : &R->state[k].t;
}

int interp_set_input(Interp *it, int rank, const char *name, const double *data, int64_t n) {
    if (rank < 0 || rank >= it->world) return -1;
    Rank *R = &it->ranks[rank];
    int k = find_slot(R->inputs, R->ninputs, name);
    if (k < 0 || R->inputs[k].t.n != n) return -1;
    Slot *s = &R->inputs[k];
    memcpy(s->t.d, data, sizeof(double) * (size_t)n);
    round_to(s->t.d, n, s->t.t.dt, it->f64);
    s->set = 1;
    return 0;
}

int interp_run(Interp *it, char *err, size_t errlen) {
    if (setjmp(it->jb)) {
        clear_mail(it);
        snprintf(err, errlen, "%s", it->msg);
        return -1;
    }
    run_all(it);
    return 0;
}

const Tensor *interp_output(const Interp *it, int rank, const char *name) {
    if (rank < 0 || rank >= it->world) return NULL;
    const Rank *R = &it->ranks[rank];
    for (int i = 0; i < R->g->nnodes; i++) {
        const Node *n = &R->g->nodes[i];
        if (n->op == OP_output && strcmp(ir_attr_s(n, "name", ""), name) == 0)
            return R->vals[n->in[0]].d ? &R->vals[n->in[0]] : NULL;
    }
    return NULL;
}

const Tensor *interp_value(const Interp *it, int rank, int vid) {
    if (rank < 0 || rank >= it->world) return NULL;
    const Rank *R = &it->ranks[rank];
    if (vid < 0 || vid >= R->g->nvals || !R->vals[vid].d) return NULL;
    return &R->vals[vid];
}
