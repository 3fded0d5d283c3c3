/* emit_cuda.c — the fused elementwise kernels as CUDA C (`--emit cuda`).
 *
 * What comes in.  A module that has been through fuse, schedule and memplan,
 * like emit_host.c's.  Which nodes form each fused group, the group's inputs
 * (values from outside), outputs (member values used outside), iteration
 * shape and key come from kgroup.c, the same as for the CPU kernels, so a
 * group's CUDA kernel and its CPU kernel take the same arguments in the same
 * order and groups share kernels alike.
 *
 * What goes out.  One CUDA C translation unit: `#include <cuda_bf16.h>`,
 * the few device helpers the kernels use (sigmoid, the GELU tanh and the
 * backward formulas), then one kernel per distinct group key, named after
 * the first group with that key (kiln_fused_K, as on the CPU):
 *
 *     extern "C" __global__ void kiln_fused_K(const T *in0, ..., T *out0, ..., long long n)
 *
 * Each kernel is a grid-stride loop over the n elements of the iteration
 * space, any launch shape covers them all: first a vector loop, 8 elements
 * per thread and iteration with 16-byte loads and stores (when the arrays
 * it reads and writes at element i are 16-byte aligned; a broadcast's index
 * is computed once per vector where kg_bcast_terms allow), then the scalar
 * loop over what is left (all of it when unaligned).  Both run the same
 * per-element statements, so the bits do not depend on which loop took an
 * element (tests/t_cuda_vec.sh).  Per element it computes the
 * whole chain in registers and stores only the outputs: the code of
 * emit_llvm.c's group_element written as C statements, one `const` local per
 * member (m<j> for member j, x<s> for the element of input s, loaded where
 * first used).  Members whose value nothing reads and that are no output
 * are left out, and helpers no kernel calls are not written: NVRTC warns of
 * unused locals and functions, and the build fails on any warning.
 *
 * Numbers.  In memory each dtype is its own: f32 is float, bf16
 * __nv_bfloat16, i32 int and i64 long long; f16 is not supported.  The
 * precision pass (precision.c, on for `--target cuda`) has already made
 * activations bf16 and kept master weights, gradients and losses f32
 * (DESIGN §6).  The arithmetic is f32: bf16 loads widen with __bfloat162float,
 * bf16 stores round with __float2bfloat16, and a cast to bf16 rounds in the
 * register too (__float2bfloat16_rn, the same rounding spelled apart so
 * that a CPU twin of the text can keep f32 stores and still round casts),
 * so that what a cast promises holds before the store.  The
 * math functions are CUDA's accurate ones (expf, tanhf, logf, sqrtf,
 * rsqrtf); fast-math is for the NVRTC options to decide.  Constants are
 * printed as the float they become, with nine significant digits (exact for
 * a float), infinities and NaNs through __int_as_float.
 *
 * Broadcasts.  A member broadcasting a group input reads it at the index the
 * numpy rule gives, with the terms of kg_bcast_terms, the arithmetic the CPU
 * kernels use: a sum of ((i / inner) % len) * stride.  Its shapes are part
 * of the group key, so the divisors are literals, and when the broadcast's
 * element count fits 32 bits the index is computed in 32 bits (the GPU has
 * no 64-bit divide; by a constant, 32 bits is a multiply and a shift).  A
 * broadcast of a const member is that const.
 *
 * Pipeline stages.  One unit holds every stage's kernels, each stage's
 * named kiln_s<stage>_fused_K (K a group of that stage's graph, so the
 * prefix keeps two stages' kernels apart; emit_host.c's kernel_names names
 * them alike).  NCCL pairs two ranks' sends and receives in issue order,
 * not by tag, so a program whose sends between two stages are not in the
 * order the peer receives them is refused (emit_cuda_p2p_order; see
 * comm_nccl.c).
 *
 * The text depends only on the module, so two generations are byte for byte
 * the same (the kernel cache hashes it).  A dtype or an op that the GPU
 * kernels cannot take comes back as an error naming the node.
 */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emit.h"
#include "kgroup.h"
#include "nvrtc_compile.h"

/* the device helpers, in the order they are written (helper_text) */
enum { H_SIGMOID, H_GELU_TH, H_GELU_BWD, H_SILU_BWD, H_COUNT };

typedef struct {
    const Graph *g;
    int stage, nstages; /* a pipeline stage's kernels are named kiln_s<stage>_... (emit_host.c's kernel_names) */
    KGroups kg;
    FILE *f; /* the text being built (a memory stream) */
    int vec;  /* writing the vector body: direct loads from v<s>.v[e], stores to o<s>.v[e] (kernel) */
    int use_i, use_i0; /* the vector body reads i (an element's index) or i0 (its vector's first) */
    char *err;
    size_t errlen;
} Cu;

typedef struct {
    char (*reg)[16];  /* [member]: the name of its value, "" until written */
    char *live;       /* [member]: its value is read or stored */
    char *loaded;     /* [input slot]: x<s> is declared */
    char *stored;     /* [output slot]: out<s> is written */
} Regs;

/* elements per thread per iteration of the vector body (16 bytes of bf16) */
enum { VEC = 8 };

static const double GELU_K = 0.7978845608028654; /* sqrt(2/pi), as in emit_llvm.c */


static int fail(Cu *c, const Node *n, const char *what) {
    char w[160];
    snprintf(c->err, c->errlen, "emit cuda: %s: %s %s", ir_where(n, w, sizeof w), ir_ops[n->op].name, what);
    return -1;
}

/* ---- types and literals ---- */

/* The C type of a value in memory and in a register; NULL if unsupported. */
static const char *mem_type(DType dt) {
    switch (dt) {
    case DT_F32: return "float";
    case DT_BF16: return "__nv_bfloat16";
    case DT_I32: return "int";
    case DT_I64: return "long long";
    default: return NULL;
    }
}

/* (liveness has rejected the other dtypes) */
static const char *reg_type(DType dt) {
    switch (dt) {
    case DT_F32: case DT_BF16: return "float";
    case DT_I32: return "int";
    case DT_I64: return "long long";
    default: ICE("emit cuda: no register type for %s", ir_dtype_names[dt]);
    }
}

static int is_float(DType dt) { return dt == DT_F32 || dt == DT_BF16; }

/* A float literal for v rounded to float: "0.5f", "8.0f", "1.00000002e+30f". */
static void float_lit(double v, char *buf, size_t len) {
    float f = (float)v;
    if (isnan(f)) {
        snprintf(buf, len, "__int_as_float(0x7fffffff)");
        return;
    }
    if (isinf(f)) {
        snprintf(buf, len, "__int_as_float(%s)", f > 0 ? "0x7f800000" : "(int)0xff800000");
        return;
    }
    char s[40];
    snprintf(s, sizeof s, "%.9g", (double)f);
    snprintf(buf, len, "%s%sf", s, strpbrk(s, ".e") ? "" : ".0");
}

static void const_lit(DType dt, double v, char *buf, size_t len) {
    if (is_float(dt)) float_lit(v, buf, len);
    else if (dt == DT_I32) snprintf(buf, len, "%d", (int)v);
    else if (v <= -9223372036854775807.0) snprintf(buf, len, "(-9223372036854775807LL - 1)"); /* no literal for INT64_MIN */
    else snprintf(buf, len, "%lldLL", (long long)v);
}

/* ---- the device helpers ---- */

static unsigned helper_of(Op op) {
    switch (op) {
    case OP_silu: case OP_sigmoid: return 1u << H_SIGMOID;
    case OP_gelu: return 1u << H_GELU_TH;
    case OP_gelu_bwd: return 1u << H_GELU_BWD | 1u << H_GELU_TH;
    case OP_silu_bwd: return 1u << H_SILU_BWD | 1u << H_SIGMOID;
    default: return 0;
    }
}

/* The same formulas, in the same order of operations, as emit_llvm.c's. */
static void helper_text(Cu *c, int h) {
    char k[40], a[40], three_a[40];
    float_lit(GELU_K, k, sizeof k);
    float_lit(0.044715, a, sizeof a);
    float_lit(3 * 0.044715, three_a, sizeof three_a);
    const char *pre = "static __device__ __forceinline__ float";
    switch (h) {
    case H_SIGMOID:
        fprintf(c->f, "%s kiln_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }\n", pre);
        break;
    case H_GELU_TH: /* tanh(k (x + 0.044715 x^3)) */
        fprintf(c->f, "%s kiln_gelu_th(float x) { return tanhf(%s * (x + %s * (x * x * x))); }\n", pre, k, a);
        break;
    case H_GELU_BWD: /* dy (0.5 (1+th) + 0.5 x (1-th^2) k (1 + 3*0.044715 x^2)) */
        fprintf(c->f,
                "%s kiln_gelu_bwd(float dy, float x) {\n"
                "    const float th = kiln_gelu_th(x);\n"
                "    const float t1 = 0.5f * (1.0f + th);\n"
                "    const float sech2 = 1.0f - th * th;\n"
                "    const float poly = 1.0f + %s * (x * x);\n"
                "    const float t2 = 0.5f * x * sech2 * %s * poly;\n"
                "    return dy * (t1 + t2);\n"
                "}\n",
                pre, three_a, k);
        break;
    case H_SILU_BWD: /* dy s (1 + x (1 - s)) */
        fprintf(c->f,
                "%s kiln_silu_bwd(float dy, float x) {\n"
                "    const float s = kiln_sigmoid(x);\n"
                "    return dy * s * (1.0f + x * (1.0f - s));\n"
                "}\n",
                pre);
        break;
    }
}

/* ---- one member ---- */

/* issue 17's ops, as emit_llvm.c's ew_op17 (x != x: x is NaN). */
static int op_expr17(const Node *n, const char *a, const char *b, const char *c, char *buf, size_t len) {
    char p[40];
    switch (n->op) {
    case OP_sigmoid: snprintf(buf, len, "kiln_sigmoid(%s)", a); return 0;
    case OP_abs: snprintf(buf, len, "fabsf(%s)", a); return 0;
    case OP_pow:
        float_lit(ir_attr_f(n, "p", 1), p, sizeof p);
        snprintf(buf, len, "powf(%s, %s)", a, p);
        return 0;
    case OP_minimum: snprintf(buf, len, "%s != %s || %s < %s ? %s : %s", a, a, a, b, a, b); return 0;
    case OP_maximum: snprintf(buf, len, "%s != %s || %s > %s ? %s : %s", a, a, a, b, a, b); return 0;
    case OP_where: snprintf(buf, len, "%s != 0.0f ? %s : %s", a, b, c); return 0;
    case OP_abs_bwd: snprintf(buf, len, "%s > 0.0f ? %s : (%s < 0.0f ? -%s : 0.0f)", b, a, b, a); return 0;
    case OP_minimum_bwd: snprintf(buf, len, "%s < %s ? %s : (%s == %s ? %s * 0.5f : 0.0f)", b, c, a, b, c, a); return 0;
    case OP_maximum_bwd: snprintf(buf, len, "%s > %s ? %s : (%s == %s ? %s * 0.5f : 0.0f)", b, c, a, b, c, a); return 0;
    default: return -1;
    }
}

/* The expression of elementwise op n on operands a (and b, c); -1 if unknown. */
static int op_expr(const Node *n, const char *a, const char *b, const char *c, char *buf, size_t len) {
    switch (n->op) {
    case OP_add: snprintf(buf, len, "%s + %s", a, b); return 0;
    case OP_sub: snprintf(buf, len, "%s - %s", a, b); return 0;
    case OP_mul: snprintf(buf, len, "%s * %s", a, b); return 0;
    case OP_div: snprintf(buf, len, "%s / %s", a, b); return 0;
    case OP_neg: snprintf(buf, len, "-%s", a); return 0;
    case OP_exp: snprintf(buf, len, "expf(%s)", a); return 0;
    case OP_log: snprintf(buf, len, "logf(%s)", a); return 0;
    case OP_sqrt: snprintf(buf, len, "sqrtf(%s)", a); return 0;
    case OP_rsqrt: snprintf(buf, len, "rsqrtf(%s)", a); return 0;
    case OP_tanh: snprintf(buf, len, "tanhf(%s)", a); return 0;
    case OP_gelu: snprintf(buf, len, "0.5f * %s * (1.0f + kiln_gelu_th(%s))", a, a); return 0;
    case OP_silu: snprintf(buf, len, "%s * kiln_sigmoid(%s)", a, a); return 0;
    case OP_relu: snprintf(buf, len, "%s > 0.0f ? %s : 0.0f", a, a); return 0;
    case OP_gelu_bwd: snprintf(buf, len, "kiln_gelu_bwd(%s, %s)", a, b); return 0;
    case OP_silu_bwd: snprintf(buf, len, "kiln_silu_bwd(%s, %s)", a, b); return 0;
    case OP_relu_bwd: snprintf(buf, len, "%s > 0.0f ? %s : 0.0f", b, a); return 0;
    default: return op_expr17(n, a, b, c, buf, len);
    }
}

/* A value of type dt loaded from p[idx] into a register. */
static void load_expr(DType dt, const char *p, const char *idx, char *buf, size_t len) {
    if (dt == DT_BF16) snprintf(buf, len, "__bfloat162float(%s[%s])", p, idx);
    else snprintf(buf, len, "%s[%s]", p, idx);
}

/* The index into input x of a broadcast to big at element `iv` (kg_bcast_terms). */
static void bcast_expr(const Type *x, const Type *big, const char *iv, char *buf, size_t len) {
    KgTerm t[IR_MAXRANK];
    int nt = kg_bcast_terms(x, big, t), narrow = ir_numel(big) <= (int64_t)UINT32_MAX;
    char i[40];
    snprintf(i, sizeof i, narrow ? "(unsigned)%s" : "%s", iv);
    const char *u = narrow ? "u" : "ull";
    size_t n = 0;
    buf[0] = 0;
    if (nt == 0) snprintf(buf, len, "0");
    for (int k = 0; k < nt && n < len; k++) {
        n += (size_t)snprintf(buf + n, len - n, "%s%s", k ? " + " : "", i);
        if (n < len && t[k].inner != 1) n += (size_t)snprintf(buf + n, len - n, " / %lld%s", (long long)t[k].inner, u);
        if (n < len && t[k].mod) n += (size_t)snprintf(buf + n, len - n, " %% %lld%s", (long long)t[k].len, u);
        if (n < len && t[k].stride != 1) n += (size_t)snprintf(buf + n, len - n, " * %lld%s", (long long)t[k].stride, u);
    }
}

/* Whether the broadcast index of elements i0 + e (i0 a multiple of VEC, 0 <=
 * e < VEC) is idx(i0) + e (*step 1) or idx(i0) (*step 0): every term either
 * has an inner extent that is a multiple of VEC (the same for the VEC
 * elements) or is the innermost, unstrided term with no wrap inside a vector
 * (inner 1, stride 1, no modulus or one that VEC divides).  The vector body
 * then computes the index once per vector instead of once per element. */
static int bcast_affine(const Type *x, const Type *big, int *step) {
    KgTerm t[IR_MAXRANK];
    int nt = kg_bcast_terms(x, big, t);
    *step = 0;
    for (int k = 0; k < nt; k++) {
        if (t[k].inner % VEC == 0) continue;
        if (t[k].inner == 1 && t[k].stride == 1 && (!t[k].mod || t[k].len % VEC == 0) && !*step) {
            *step = 1;
            continue;
        }
        return 0;
    }
    return 1;
}

/* The register name of member input k of node n into name, loading a group
 * input at element i first if this is its first use. */
static void operand(Cu *c, const KGroup *gr, Regs *r, const Node *n, int k, char name[16]) {
    int vid = n->in[k], def = c->g->vals[vid].def;
    if (kg_in_group(&c->kg, gr, def)) {
        for (int j = 0; j < gr->nnodes; j++)
            if (gr->nodes[j] == def) {
                snprintf(name, 16, "%s", r->reg[j]);
                return;
            }
    }
    int s = kg_in_slot(gr, vid);
    if (s < 0) ICE("emit cuda: fused group %d: %%%d is neither a member nor an input", gr->kernel, vid);
    snprintf(name, 16, "x%d", s);
    if (!r->loaded[s]) {
        DType dt = c->g->vals[vid].t.dt;
        char p[16], e[64];
        snprintf(p, sizeof p, c->vec ? "v%d.v" : "in%d", s);
        load_expr(dt, p, c->vec ? "e" : "i", e, sizeof e);
        fprintf(c->f, "%s        const %s %s = %s;\n", c->vec ? "        " : "", reg_type(dt), name, e);
        r->loaded[s] = 1;
    }
}

/* The statement for member j of gr (its register m<j>), or nothing. */
static int member(Cu *c, const KGroup *gr, Regs *r, int j) {
    const Graph *g = c->g;
    const Node *n = &g->nodes[gr->nodes[j]];
    DType dt = g->vals[n->out[0]].t.dt;
    char e[512];
    snprintf(r->reg[j], 16, "m%d", j);
    if (n->op == OP_const) {
        const_lit(dt, ir_attr_f(n, "v", 0), e, sizeof e);
    } else if (kg_outside_bcast(&c->kg, gr, n)) {
        int vid = n->in[0], s = kg_in_slot(gr, vid);
        char p[16], idx[400];
        snprintf(p, sizeof p, "in%d", s);
        int step;
        if (c->vec && bcast_affine(&g->vals[vid].t, &g->vals[n->out[0]].t, &step)) {
            size_t l = 0;
            idx[l++] = '(';
            bcast_expr(&g->vals[vid].t, &g->vals[n->out[0]].t, "i0", idx + l, sizeof idx - l - 8);
            strcat(idx, step ? ") + e" : ")");
            if (strstr(idx, "i0")) c->use_i0 = 1; /* not for a scalar broadcast: "(0)" */
        } else {
            c->use_i = 1;
            bcast_expr(&g->vals[vid].t, &g->vals[n->out[0]].t, "i", idx, sizeof idx);
        }
        load_expr(g->vals[vid].t.dt, p, idx, e, sizeof e);
    } else if (n->op == OP_broadcast) {
        const Node *d = &g->nodes[g->vals[n->in[0]].def];
        if (d->op != OP_const) return fail(c, n, "of a computed group member (only a const member may be broadcast inside a group)");
        operand(c, gr, r, n, 0, r->reg[j]); /* the const itself */
        return 0;
    } else if (n->op == OP_cast) {
        DType from = g->vals[n->in[0]].t.dt;
        char a[16];
        operand(c, gr, r, n, 0, a);
        if (dt == DT_BF16) snprintf(e, sizeof e, "__bfloat162float(__float2bfloat16_rn(%s%s))", is_float(from) ? "" : "(float)", a);
        else if (is_float(dt) && is_float(from)) snprintf(e, sizeof e, "%s", a);
        else snprintf(e, sizeof e, "(%s)%s", reg_type(dt), a);
    } else {
        if (!is_float(dt)) return fail(c, n, "on integers (the GPU kernels compute f32)");
        char a[16], b[16] = "", z[16] = "";
        operand(c, gr, r, n, 0, a);
        if (n->nin > 1) operand(c, gr, r, n, 1, b);
        if (n->nin > 2) operand(c, gr, r, n, 2, z);
        if (op_expr(n, a, b, z, e, sizeof e) != 0) return fail(c, n, "is not an elementwise op the CUDA back end knows");
    }
    fprintf(c->f, "%s        const %s m%d = %s;\n", c->vec ? "        " : "", reg_type(dt), j, e);
    return 0;
}

/* ---- one kernel ---- */

/* live[j]: member j is stored or read by a live member; also checks dtypes. */
static int liveness(Cu *c, const KGroup *gr, Regs *r) {
    const Graph *g = c->g;
    for (int j = gr->nnodes - 1; j >= 0; j--) {
        const Node *n = &g->nodes[gr->nodes[j]];
        if (!mem_type(g->vals[n->out[0]].t.dt)) return fail(c, n, "of a dtype the GPU kernels do not support (f32, bf16, i32, i64)");
        if (kg_out_slot(gr, n->out[0]) >= 0) r->live[j] = 1;
        if (!r->live[j]) continue;
        for (int k = 0; k < n->nin; k++) {
            int def = g->vals[n->in[k]].def;
            if (!kg_in_group(&c->kg, gr, def)) continue;
            for (int q = 0; q < j; q++)
                if (gr->nodes[q] == def) r->live[q] = 1;
        }
    }
    for (int s = 0; s < gr->nin; s++)
        if (!mem_type(g->vals[gr->in[s]].t.dt)) return fail(c, &g->nodes[gr->nodes[0]], "reads a dtype the GPU kernels do not support");
    return 0;
}

static void signature(Cu *c, const KGroup *gr, const char *name) {
    const char *restrict_ = gr->noalias ? "__restrict__ " : "";
    fprintf(c->f, "extern \"C\" __global__ void %s(", name);
    for (int s = 0; s < gr->nin; s++)
        fprintf(c->f, "const %s *%sin%d, ", mem_type(c->g->vals[gr->in[s]].t.dt), restrict_, s);
    for (int s = 0; s < gr->nout; s++) fprintf(c->f, "%s *%sout%d, ", mem_type(c->g->vals[gr->out[s]].t.dt), restrict_, s);
    fprintf(c->f, "long long n) {\n");
}

/* A comment naming where the first group of kernel k is and every group
 * that runs it (lines of about 100 columns). */
static void kernel_comment(Cu *c, int k) {
    const KGroup *gr = &c->kg.groups[k];
    char w[160];
    int col = fprintf(c->f, "\n/* %s: groups", ir_where(&c->g->nodes[gr->nodes[0]], w, sizeof w)) - 1;
    for (int q = k; q < c->kg.ngroups; q++) {
        if (c->kg.groups[q].first != k) continue;
        if (col > 100) col = fprintf(c->f, "\n *") - 1;
        col += fprintf(c->f, " %s", c->kg.groups[q].name);
    }
    fprintf(c->f, " */\n");
}

/* The store of member j's register to its output slot s. */
static void store(Cu *c, const KGroup *gr, Regs *r, int j, int s) {
    DType dt = c->g->vals[gr->out[s]].t.dt;
    char dst[32];
    snprintf(dst, sizeof dst, c->vec ? "o%d.v[e]" : "out%d[i]", s);
    const char *ind = c->vec ? "                " : "        ";
    if (dt == DT_BF16) fprintf(c->f, "%s%s = __float2bfloat16(%s);\n", ind, dst, r->reg[j]);
    else fprintf(c->f, "%s%s = %s;\n", ind, dst, r->reg[j]);
    r->stored[s] = 1;
}

static Regs regs_new(const KGroup *gr) {
    return (Regs){xcalloc((size_t)gr->nnodes, 16), xcalloc((size_t)gr->nnodes, 1), xcalloc((size_t)gr->nin + 1, 1),
                  xcalloc((size_t)gr->nout + 1, 1)};
}

static void regs_free(Regs *r) {
    free(r->reg);
    free(r->live);
    free(r->loaded);
    free(r->stored);
}

/* The helpers that the live members of kernel k call (a mask of H_*). */
static int helpers_of(Cu *c, int k, unsigned *mask) {
    const KGroup *gr = &c->kg.groups[k];
    Regs r = regs_new(gr);
    int rc = liveness(c, gr, &r);
    for (int j = 0; j < gr->nnodes && rc == 0; j++)
        if (r.live[j]) *mask |= helper_of(c->g->nodes[gr->nodes[j]].op);
    regs_free(&r);
    return rc;
}

/* The vector type of 8 elements of dt (kiln_<t>x8, written by translation_unit). */
static const char *vec_type(DType dt) {
    switch (dt) {
    case DT_F32: return "kiln_f32x8";
    case DT_BF16: return "kiln_bf16x8";
    case DT_I32: return "kiln_i32x8";
    default: return "kiln_i64x8";
    }
}

/* The per-element statements of gr's live members (and their stores), in
 * scalar (element i) or vector (element e of vector q) form; the text in
 * *body (malloc'd).  r's loaded/stored say which slots the body reads
 * directly and writes. */
static int element_body(Cu *c, const KGroup *gr, Regs *r, int vec, char **body) {
    FILE *outer = c->f;
    size_t len = 0;
    *body = NULL;
    c->f = open_memstream(body, &len);
    if (!c->f) {
        c->f = outer;
        snprintf(c->err, c->errlen, "emit cuda: open_memstream: %s", strerror(errno));
        return -1;
    }
    c->vec = vec, c->use_i = c->use_i0 = 0;
    memset(r->loaded, 0, (size_t)gr->nin);
    memset(r->stored, 0, (size_t)gr->nout);
    for (int j = 0; j < gr->nnodes; j++) r->reg[j][0] = 0;
    int rc = 0;
    for (int j = 0; j < gr->nnodes && rc == 0; j++) {
        if (!r->live[j]) continue;
        rc = member(c, gr, r, j);
        int s = kg_out_slot(gr, c->g->nodes[gr->nodes[j]].out[0]);
        if (rc == 0 && s >= 0) store(c, gr, r, j, s);
    }
    int bad = ferror(c->f);
    if (fclose(c->f) != 0 || bad) {
        if (rc == 0) snprintf(c->err, c->errlen, "emit cuda: writing the text in memory failed");
        rc = -1;
    }
    c->f = outer, c->vec = 0;
    return rc;
}

/* The kernel of group k.  Its element loop is the scalar body (element i);
 * when every array the body reads or writes at element i is 16-byte
 * aligned, a vector loop first takes the elements [0, n/8*8) eight per
 * thread and iteration: 16-byte loads of each input (one per 8 bf16), the
 * same per-element statements for e = 0..7 on the registers, 16-byte
 * stores; the scalar loop then does the rest.  The math per element is the
 * scalar body's, so the bits are the same whichever loop takes an element.
 * Both loops stride over the grid, so any launch shape covers n (the
 * launcher's grid is ceil(n / (256 * 8)) blocks, capped). */
static int kernel(Cu *c, int k) {
    const KGroup *gr = &c->kg.groups[k];
    Regs r = regs_new(gr);
    int rc = liveness(c, gr, &r);
    char *vbody = NULL, *sbody = NULL;
    if (rc == 0) rc = element_body(c, gr, &r, 1, &vbody);
    char *vin = xcalloc((size_t)gr->nin + 1, 1), *vout = xcalloc((size_t)gr->nout + 1, 1);
    int use_i = c->use_i, use_i0 = c->use_i || c->use_i0; /* the vector body's */
    if (rc == 0) {
        memcpy(vin, r.loaded, (size_t)gr->nin);
        memcpy(vout, r.stored, (size_t)gr->nout);
        rc = element_body(c, gr, &r, 0, &sbody);
    }
    if (rc == 0) {
        char name[64];
        if (c->nstages > 1) snprintf(name, sizeof name, "kiln_s%d_%s", c->stage, gr->name);
        else snprintf(name, sizeof name, "kiln_%s", gr->name);
        kernel_comment(c, k);
        signature(c, gr, name);
        int nvout = 0;
        for (int s = 0; s < gr->nout; s++) nvout += vout[s];
        const char *gid = "blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x";
        const char *gstride = "(unsigned long long)gridDim.x * blockDim.x";
        if (nvout > 0) {
            fprintf(c->f, "    unsigned long long first = 0; /* the scalar loop's first element */\n    if (((");
            int np = 0;
            for (int s = 0; s < gr->nin; s++)
                if (vin[s]) fprintf(c->f, "%s(unsigned long long)in%d", np++ ? " | " : "", s);
            for (int s = 0; s < gr->nout; s++)
                if (vout[s]) fprintf(c->f, "%s(unsigned long long)out%d", np++ ? " | " : "", s);
            fprintf(c->f, ") & 15) == 0) {\n");
            fprintf(c->f, "        const unsigned long long nv = (unsigned long long)n / %d;\n", VEC);
            fprintf(c->f, "        for (unsigned long long q = %s; q < nv; q += %s) {\n", gid, gstride);
            if (use_i0) fprintf(c->f, "            const unsigned long long i0 = q * %d;\n", VEC);
            for (int s = 0; s < gr->nin; s++)
                if (vin[s]) {
                    const char *t = vec_type(c->g->vals[gr->in[s]].t.dt);
                    fprintf(c->f, "            const %s v%d = ((const %s *)in%d)[q];\n", t, s, t, s);
                }
            for (int s = 0; s < gr->nout; s++)
                if (vout[s]) fprintf(c->f, "            %s o%d;\n", vec_type(c->g->vals[gr->out[s]].t.dt), s);
            fprintf(c->f, "#pragma unroll\n            for (int e = 0; e < %d; e++) {\n", VEC);
            if (use_i) fprintf(c->f, "                const unsigned long long i = i0 + e;\n");
            fputs(vbody, c->f);
            fprintf(c->f, "            }\n");
            for (int s = 0; s < gr->nout; s++)
                if (vout[s]) fprintf(c->f, "            ((%s *)out%d)[q] = o%d;\n", vec_type(c->g->vals[gr->out[s]].t.dt), s, s);
            fprintf(c->f, "        }\n        first = nv * %d;\n    }\n", VEC);
            fprintf(c->f, "    for (unsigned long long i = first + %s; i < (unsigned long long)n; i += %s) {\n", gid, gstride);
        } else {
            fprintf(c->f, "    for (unsigned long long i = %s; i < (unsigned long long)n; i += %s) {\n", gid, gstride);
        }
        fputs(sbody, c->f);
        fprintf(c->f, "    }\n}\n");
    }
    free(vbody), free(sbody), free(vin), free(vout);
    regs_free(&r);
    return rc;
}

/* ---- the translation unit ---- */

/* c's groups for stage s (kg_free'd by the caller) */
static void stage_groups(Cu *c, const Module *m, int s) {
    c->g = m->stages[s], c->stage = s;
    int *order = kg_program_order(c->g);
    kg_collect(&c->kg, c->g, order, c->g->nnodes);
    free(order);
}

/* One unit for every pipeline stage: the helpers any kernel calls, then
 * each stage's kernels in stage and group order. */
static int translation_unit(Cu *c, const Module *m) {
    unsigned helpers = 0;
    int rc = 0;
    for (int s = 0; s < m->nstages && rc == 0; s++) {
        stage_groups(c, m, s);
        for (int k = 0; k < c->kg.ngroups && rc == 0; k++)
            if (c->kg.groups[k].first == k) rc = helpers_of(c, k, &helpers);
        kg_free(&c->kg);
    }
    if (rc != 0) return -1;
    fprintf(c->f,
            "/* %s: the fused elementwise kernels as CUDA C (kiln, emit_cuda.c).\n"
            " * Memory: f32 as float, bf16 as __nv_bfloat16, i32 as int, i64 as long long; arithmetic in f32.\n"
            " * Arguments: the group's input pointers, its output pointers, the element count n. */\n"
            "#include <cuda_bf16.h>\n"
            "\n/* eight elements, for the vector loops' 16-byte loads and stores */\n"
            "typedef struct __align__(16) kiln_f32x8 { float v[8]; } kiln_f32x8;\n"
            "typedef struct __align__(16) kiln_bf16x8 { __nv_bfloat16 v[8]; } kiln_bf16x8;\n"
            "typedef struct __align__(16) kiln_i32x8 { int v[8]; } kiln_i32x8;\n"
            "typedef struct __align__(16) kiln_i64x8 { long long v[8]; } kiln_i64x8;\n",
            m->name);
    if (helpers) fprintf(c->f, "\n");
    for (int h = 0; h < H_COUNT; h++)
        if (helpers & 1u << h) helper_text(c, h);
    for (int s = 0; s < m->nstages && rc == 0; s++) {
        stage_groups(c, m, s);
        for (int k = 0; k < c->kg.ngroups && rc == 0; k++)
            if (c->kg.groups[k].first == k) rc = kernel(c, k);
        kg_free(&c->kg);
    }
    return rc;
}

int emit_cuda_text(const Module *m, FILE *f, char *err, size_t errlen) {
    if (emit_cuda_p2p_order(m, err, errlen) != 0) return -1;
    Cu c = {.nstages = m->nstages, .err = err, .errlen = errlen};
    char *text = NULL;
    size_t len = 0;
    c.f = open_memstream(&text, &len);
    if (!c.f) {
        snprintf(err, errlen, "emit cuda: open_memstream: %s", strerror(errno));
        return -1;
    }
    int rc = translation_unit(&c, m);
    int bad = ferror(c.f);
    if (fclose(c.f) != 0 || bad) {
        if (rc == 0) snprintf(err, errlen, "emit cuda: writing the text in memory failed");
        rc = -1;
    }
    if (rc == 0 && fwrite(text, 1, len, f) != len) {
        snprintf(err, errlen, "emit cuda: write failed: %s", strerror(errno));
        rc = -1;
    }
    free(text);
    return rc;
}

/* ---- pipeline transfers: NCCL's order ---- */

/* The tags of stage s's pipeline sends to stage r (recv 0) or of its
 * receives from r (recv 1), in program order; their count in *n. */
static int *transfer_tags(const Module *m, int s, int r, int recv, int *n) {
    const Graph *g = m->stages[s];
    int *tags = xcalloc((size_t)g->nnodes + 1, sizeof(int)), p = m->nstages;
    *n = 0;
    for (int i = 0; i < g->nnodes; i++) {
        const Node *x = &g->nodes[i];
        if (x->op != (recv ? OP_recv_done : OP_send) || strcmp(ir_attr_s(x, "group", ""), "pp") != 0) continue;
        if ((int)(((s + ir_attr_i(x, "peer", 0)) % p + p) % p) == r) tags[(*n)++] = (int)ir_attr_i(x, "tag", 0);
    }
    return tags;
}

int emit_cuda_p2p_order(const Module *m, char *err, size_t errlen) {
    for (int s = 0; s < m->nstages; s++)
        for (int r = 0; r < m->nstages; r++) {
            int ns, nr, k = 0;
            int *sent = transfer_tags(m, s, r, 0, &ns), *got = transfer_tags(m, r, s, 1, &nr);
            while (k < ns && k < nr && sent[k] == got[k]) k++;
            int bad = k < ns || k < nr;
            if (bad)
                snprintf(err, errlen,
                         "emit cuda: pipeline stage %d's send #%d to stage %d has tag %d, but stage %d's receive #%d from stage %d has tag %d: "
                         "NCCL pairs two ranks' sends and receives in order, not by tag (docs/pipeline.md)",
                         s, k + 1, r, k < ns ? sent[k] : -1, r, k + 1, s, k < nr ? got[k] : -1);
            free(sent), free(got);
            if (bad) return -1;
        }
    return 0;
}

/* ---- the cubins a CUDA program embeds ---- */

static int add_cubin(EmitCubin **out, int *n, const char *name, const char *path, const char *src, const char *arch, char *err,
                     size_t errlen) {
    KilnCubin cb;
    if (kiln_nvrtc_compile_cached(path, src, arch, KILN_NVRTC_WARNINGS_FAIL, &cb, err, errlen) != 0) {
        kiln_cubin_free(&cb);
        return -1;
    }
    EmitCubin *grown = realloc(*out, (size_t)(*n + 1) * sizeof **out);
    if (!grown) ICE("emit cuda: out of memory");
    *out = grown;
    EmitCubin *c = &grown[(*n)++];
    snprintf(c->name, sizeof c->name, "%s", name);
    c->data = cb.data, c->size = cb.size;
    cb.data = NULL;
    kiln_cubin_free(&cb);
    return 0;
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The *.cu files of the library kernels' directory, sorted; malloc'd. */
static char **library_files(int *n, char *err, size_t errlen) {
    const char *dir = kiln_cuda_kernel_dir();
    DIR *d = opendir(dir);
    if (!d) {
        snprintf(err, errlen, "emit cuda: the library kernels' directory %s: %s (set KILN_CUDA_KERNELS)", dir, strerror(errno));
        return NULL;
    }
    char **names = NULL;
    *n = 0;
    for (struct dirent *de; (de = readdir(d));) {
        size_t len = strlen(de->d_name);
        if (len < 4 || strcmp(de->d_name + len - 3, ".cu") != 0) continue;
        names = realloc(names, (size_t)(*n + 1) * sizeof *names);
        if (!names) ICE("emit cuda: out of memory");
        names[(*n)++] = strdup(de->d_name);
    }
    closedir(d);
    if (*n) qsort(names, (size_t)*n, sizeof *names, by_name);
    return names;
}

/* Every library file, but the tensor-core attention only for a program
 * that launches it (--attention tc): its twelve kernels (three per head
 * dim) are 3.9 MB of cubin, more than half of what a trainer embeds. */
static int library_cubins(const EmitTarget *t, EmitCubin **out, int *n, char *err, size_t errlen) {
    int nf = 0, rc = 0;
    char **files = library_files(&nf, err, errlen);
    if (!files && nf == 0 && err[0]) return -1;
    for (int i = 0; i < nf; i++) {
        char path[4096], stem[32];
        snprintf(path, sizeof path, "%s/%s", kiln_cuda_kernel_dir(), files[i]);
        snprintf(stem, sizeof stem, "%.*s", (int)(strlen(files[i]) - 3), files[i]);
        if (!t->attention_tc && strcmp(stem, "attention_tc") == 0) {
            free(files[i]);
            continue;
        }
        char *src = rc == 0 ? kiln_read_source(path, err, errlen) : NULL;
        if (rc == 0 && (!src || add_cubin(out, n, stem, path, src, t->arch, err, errlen) != 0)) rc = -1;
        free(src);
        free(files[i]);
    }
    free(files);
    return rc;
}

/* The generated source that NVRTC refused, at path, named at the end of err. */
static void keep_source(const char *text, size_t len, const char *path, char *err, size_t errlen) {
    FILE *f = fopen(path, "w");
    int ok = f && fwrite(text, 1, len, f) == len;
    if (f && fclose(f) != 0) ok = 0;
    size_t used = strlen(err);
    if (used < errlen)
        snprintf(err + used, errlen - used, ok ? " (the generated source: %s)" : " (could not write the generated source to %s)", path);
}

int emit_cuda_cubins(const Module *m, const EmitTarget *t, const char *keep_src, EmitCubin **out, int *n, char *err,
                     size_t errlen) {
    *out = NULL, *n = 0;
    err[0] = 0;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) {
        snprintf(err, errlen, "emit cuda: open_memstream: %s", strerror(errno));
        return -1;
    }
    int rc = emit_cuda_text(m, f, err, errlen);
    if (fclose(f) != 0 && rc == 0) {
        snprintf(err, errlen, "emit cuda: writing the text in memory failed");
        rc = -1;
    }
    if (rc == 0 && strstr(text, "__global__")) {
        rc = add_cubin(out, n, "generated", "generated.cu", text, t->arch, err, errlen);
        if (rc != 0 && keep_src) keep_source(text, len, keep_src, err, errlen);
    }
    free(text);
    if (rc == 0) rc = library_cubins(t, out, n, err, errlen);
    if (rc != 0) {
        emit_cubins_free(*out, *n);
        *out = NULL, *n = 0;
    }
    return rc;
}

int emit_cuda_library_cubins(const char *arch, int attention_tc, EmitCubin **out, int *n, char *err, size_t errlen) {
    EmitTarget t = {.arch = arch, .attention_tc = attention_tc};
    *out = NULL, *n = 0;
    err[0] = 0;
    int rc = library_cubins(&t, out, n, err, errlen);
    if (rc != 0) emit_cubins_free(*out, *n), *out = NULL, *n = 0;
    return rc;
}

void emit_cubins_free(EmitCubin *c, int n) {
    for (int i = 0; i < n; i++) free(c[i].data);
    free(c);
}

/* ---- scratch per library launch (kernels/cuda/README.md) ---- */

/* The planned buffers of values a and b share a byte. */
static int overlap(const Graph *g, int a, int b) {
    const Value *x = &g->vals[a], *y = &g->vals[b];
    if (x->space < 0 || x->space != y->space) return 0;
    return x->offset < y->offset + ir_value_bytes(&g->vals[b]) && y->offset < x->offset + ir_value_bytes(&g->vals[a]);
}

/* the pipeline stage whose graph holds node n */
static const Graph *stage_of(const Module *m, const Node *n) {
    for (int s = 0; s < m->nstages; s++)
        if (n >= m->stages[s]->nodes && n < m->stages[s]->nodes + m->stages[s]->nnodes) return m->stages[s];
    ICE("emit cuda: a node of no stage");
}

int64_t emit_cuda_scratch(const Module *m, const Node *n) {
    const Graph *g = stage_of(m, n);
    const Type *t0 = n->nin ? &g->vals[n->in[0]].t : NULL, *t1 = n->nin > 1 ? &g->vals[n->in[1]].t : NULL;
    int64_t bytes = 0;
    switch (n->op) {
    case OP_layernorm_bwd: case OP_rmsnorm_bwd: {
        int64_t C = t1->rank ? t1->dim[t1->rank - 1] : 1, rows = C ? ir_numel(t1) / C : 0, parts = rows < 512 ? rows : 512;
        bytes = parts * C * 4 * (n->op == OP_layernorm_bwd ? 2 : 1);
        break;
    }
    case OP_embedding_bwd: {
        int64_t ids = ir_numel(t1), tiles = (ids + 255) / 256;
        bytes = (4 * ids + 256 * tiles) * 4;
        break;
    }
    case OP_attention_bwd: bytes = ir_numel(t1) / (t1->rank ? t1->dim[t1->rank - 1] : 1) * 4; break; /* q [B,H,T,D]: B*H*T f32 */
    case OP_sumto: { /* kernels_cuda.c sumto_rows: parts(R) * K f32, K the outputs, R = x's elements / K */
        int64_t K = ir_numel(&g->vals[n->out[0]].t), R = K ? ir_numel(t0) / K : 0, parts = (R + 255) / 256;
        bytes = (parts < 1 ? 1 : parts > 1024 ? 1024 : parts) * K * 4;
        break;
    }
    case OP_sumsq: {
        int64_t parts = (ir_numel(t0) + 2047) / 2048;
        bytes = (parts < 1 ? 1 : parts > 1024 ? 1024 : parts) * 4;
        break;
    }
    case OP_allgather: case OP_reducescatter: case OP_allreduce: case OP_shard: {
        /* comm_nccl.c packs through scratch when the layout is strided
         * (outer > 1) or x and y overlap other than in place: room for the
         * larger of the two covers every case */
        const Type *y = &g->vals[n->out[0]].t;
        int64_t d = n->op == OP_allreduce ? 0 : ir_attr_i(n, "dim", 0), outer = 1;
        for (int i = 0; i < d && i < y->rank; i++) outer *= y->dim[i];
        int64_t bx = ir_value_bytes(&g->vals[n->in[0]]), by = ir_value_bytes(&g->vals[n->out[0]]);
        if (ir_group_size(m, n) > 1 && (outer > 1 || overlap(g, n->in[0], n->out[0]))) bytes = bx > by ? bx : by;
        break;
    }
    case OP_recv: /* a group of one: the recv copies its own send, through scratch when they overlap */
        if (ir_group_size(m, n) == 1) bytes = ir_value_bytes(&g->vals[n->out[0]]);
        break;
    default: break;
    }
    return (bytes + 255) / 256 * 256;
}
