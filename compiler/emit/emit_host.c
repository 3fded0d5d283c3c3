/* emit_host.c — the host program: the step function and the program table,
 * in LLVM IR, for every device (emit_priv.h says who does what).
 *
 * What comes in.  One pipeline stage (Em.g = m->stages[Em.stage]) of a
 * module that has been through fuse, schedule and memplan: every node has its stream and its position in the linear
 * program (Node.stream/pos), every materialised value its memory space and
 * byte offset (Value.space/offset), and each fused group is the run of nodes
 * carrying the int attribute `kernel=K`.
 *
 * What goes out.  Two LLVM functions and two globals, the runtime ABI of
 * runtime/kiln_rt.h, into the module emit_llvm.c made (the kernels of the
 * fused groups are the device's kernel emitter's):
 *
 *   kiln_program   the constant rt_program: memory spaces, params, states,
 *                  inputs, outputs (name, place, type), streams, events,
 *                  FLOPs per step, a pointer to the step function, the mesh,
 *                  the distributed optimizer's buckets (collect_buckets) and
 *                  the cp layout (cp_contiguous, from the rank iotas).
 *                  It is the one external symbol; everything else is local,
 *                  so an object file links into any trainer without clashes.
 *                  With pipeline stages this file runs once per stage
 *                  (em_stages, emit_llvm.c): stage 0's table is
 *                  kiln_program, stage s's the private kiln_program_s<s>,
 *                  and each table's stage/nstages/stages point into the
 *                  array kiln_stages of all of them.
 *                  Its LLVM struct types are checked field by field against
 *                  kiln_rt.h's C layout on the target (check_layout,
 *                  emit_llvm.c).
 *   kiln_schedule  the program's learning-rate schedule (rt_schedule), the
 *                  one mutable global: initialised with the attributes of
 *                  the lr_cosine node(s) (one schedule per program, or an
 *                  internal error), pointed to by kiln_program.schedule and
 *                  passed by address to rtk_lr_cosine, so the trainer can
 *                  set --lr, --min-lr, --warmup and the length at run time.
 *   kiln_step      straight-line code: in program order, one rt_launch per
 *                  library op or fused group, rt_record/rt_wait for events.
 *                  Pointers are spaces[space] + offset, computed from the
 *                  loaded space bases; the args array is one i64 array on
 *                  the stack, refilled for every launch (rt_launch copies).
 *                  It is marked optnone: the optimizer has nothing to gain
 *                  on it and the SLP vectorizer spends seconds on its stores.
 *                  On the CPU a fused group launches its kiln_fused_K
 *                  (emit_llvm.c) with the group's input pointers, its output
 *                  pointers and the element count.
 *
 * Ranks.  The program is SPMD: every rank runs the same step.  Collectives
 * (allreduce, reducescatter, allgather) and shard are library kernels of the
 * runtime (rtk_*, "ranks and communication" in kiln_rt.h) launched on their
 * node's stream like any other; the group is passed as its RT_AXIS_* mask
 * and the runtime finds this rank's index in it.  The mesh is fixed at
 * compile time, so a group of one rank becomes a copy (emit_comm).  Ring
 * attention's send/recv are rtk_send/rtk_recv on the comm stream (the
 * runtime stages each send, so a ring of blocking-looking pairs cannot
 * deadlock) and attn_merge is a library kernel (emit_p2p).  With
 * the distributed optimizer a param's values may live only in the shard
 * state "param.b<k>" of its bucket (prefix ""): memplan gives such a param,
 * which the step never reads, no buffer, and its table entry says so with
 * space = offset = -1 (check_param_storage keeps the two consistent).
 *
 * The CUDA target (EmitTarget, emit.h).  The same table and step; the
 * host code does not change with the device, only what it launches.  No
 * kiln_fused_K is generated: a fused group launches rtk_fused with the
 * index of its CUDA kernel (emit_cuda.c writes one per key, in group
 * order, named as the table's `kernels` list), its element count and its
 * pointers.  The table also carries the device, the arch, the cubins
 * (private constant byte arrays) and the largest scratch one library
 * launch needs (emit_cuda_scratch), and --attention cudnn sends attention
 * that cuDNN's SDPA takes (cudnn_qualifies) to rtk_attention(_bwd)_cudnn.
 * Library launches carry the dtypes of the kernels whose dtypes vary
 * (gemm, reduce, sumto, sumsq, max_bwd, softmax, attn_merge, collectives,
 * fill) on both targets; the CPU's kernels ignore them.
 *
 * Offload's copies (offload.c, F_COPY) are rtk_offload (act -> host space)
 * and rtk_reload (host -> act) on their node's copy stream, the host space
 * the runtime's RT_SPACE_HOST (kiln_rt.h): the schedule's events order them.
 *
 * An op this file cannot launch, an inconsistent bucket or schedule is an
 * internal error naming it.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "emit_priv.h"
#include "kiln_rt.h"
#include "live.h"

enum { LIBARGS = 32 }; /* args of a library launch: at most 20 (rtk_attention_bwd) */

/* ---- small helpers ---- */

static int64_t f64_bits(double d) {
    int64_t b;
    memcpy(&b, &d, 8);
    return b;
}

/* The runtime's number for an IR memory space (kiln_rt.h's RT_SPACE_*): the
 * IR names its spaces itself, so it need not know the ABI; -1 stays -1. */
static int rt_space_of(int space) {
    static const int rt[SPACE_COUNT] = {[SPACE_PARAMS] = RT_SPACE_PARAMS, [SPACE_GRADS] = RT_SPACE_GRADS,
                                        [SPACE_OPT] = RT_SPACE_OPT, [SPACE_ACT] = RT_SPACE_ACT, [SPACE_HOST] = RT_SPACE_HOST};
    _Static_assert((int)SPACE_COUNT == (int)RT_NSPACES, "every IR space has a runtime space");
    return space >= 0 && space < SPACE_COUNT ? rt[space] : -1;
}

/* A constant C string: a private global, as an i8*.  NULL -> null pointer. */
static LLVMValueRef cstr(Em *e, const char *s) {
    if (!s) return LLVMConstNull(e->tp8);
    LLVMValueRef init = LLVMConstStringInContext(e->c, s, (unsigned)strlen(s), 0);
    LLVMValueRef gv = LLVMAddGlobal(e->mod, LLVMTypeOf(init), ".str");
    LLVMSetInitializer(gv, init);
    LLVMSetGlobalConstant(gv, 1);
    LLVMSetLinkage(gv, LLVMPrivateLinkage);
    LLVMSetUnnamedAddress(gv, LLVMGlobalUnnamedAddr);
    LLVMValueRef zero[2] = {I32(e, 0), I32(e, 0)};
    return LLVMConstInBoundsGEP2(LLVMTypeOf(init), gv, zero, 2);
}

/* The library kernel rtk_<name>, declared on first use. */
static LLVMValueRef lib(Em *e, const char *name) {
    char sym[64];
    snprintf(sym, sizeof sym, "rtk_%s", name);
    LLVMValueRef fn = LLVMGetNamedFunction(e->mod, sym);
    return fn ? fn : add_fn(e, sym, e->tkernel, 0);
}

/* ---- the step function ---- */

/* ICE unless value vid has a buffer from memplan.  Values without one are
 * those internal to a fused group (registers of its loop, never passed
 * here) and params the step never reads (their values live in a bucket's
 * "param.b<k>" shard, see collect_buckets): anything that reads or writes
 * one of those through a pointer is a bug in an earlier pass. */
static const Value *planned(Em *e, int vid) {
    const Value *v = &e->g->vals[vid];
    if (v->space < 0 || v->space >= SPACE_COUNT || v->offset < 0) {
        char w[160], wu[160], def[300];
        const Node *d = v->def >= 0 ? &e->g->nodes[v->def] : NULL;
        int param = d && d->op == OP_param;
        if (param) snprintf(def, sizeof def, "param \"%s\"", ir_attr_s(d, "name", ""));
        else snprintf(def, sizeof def, "%s", d ? ir_ops[d->op].name : "?");
        ICE("emit: %%%d (defined by %s at %s) has no planned buffer (space %d, offset %lld), but %s at %s uses it%s", vid, def,
            d ? ir_where(d, w, sizeof w) : "?", v->space, (long long)v->offset, e->user ? ir_ops[e->user->op].name : "?",
            e->user ? ir_where(e->user, wu, sizeof wu) : "?",
            param ? " (a param without storage lives in a \"param.b<k>\" shard: the step may not read it)" : "");
    }
    return v;
}

/* Pointer to value vid (+ extra bytes) as an i64 argument. */
static LLVMValueRef P(Em *e, int vid, int64_t extra) {
    const Value *v = planned(e, vid);
    LLVMValueRef off = I64(e, v->offset + extra);
    LLVMValueRef p = LLVMBuildInBoundsGEP2(e->b, e->ti8, e->base[v->space], &off, 1, "");
    return LLVMBuildPtrToInt(e->b, p, e->ti64, "");
}

static LLVMValueRef F(Em *e, double v) { return I64(e, f64_bits(v)); }

/* Value vid's dtype as the runtime's RT_* code (the same numbering). */
static LLVMValueRef DT(Em *e, int vid) { return I64(e, (int64_t)e->g->vals[vid].t.dt); }

static int stream_of(const Node *n) { return n->stream < 0 ? 0 : n->stream; }

/* The launch's name for the trace: the kernel, then after '@' where it
 * comes from ("matmul@fwd L3 models/gpt.lua:41"; rt_launch). */
static LLVMValueRef launch_name(Em *e, const Node *n, const char *kernel) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s@%s L%d %s:%d", kernel, ir_phase_names[n->phase], n->layer, n->loc.file ? n->loc.file : "?",
             n->loc.line);
    return cstr(e, buf);
}

/* rt_launch(ctx, stream, fn, args, n, name) with args a[0..n) */
static void launch(Em *e, const Node *n, LLVMValueRef fn, const char *kernel, const LLVMValueRef *a, int na) {
    LLVMBuilderRef b = e->b;
    if (na > e->maxargs) ICE("emit: %d kernel args (at most %d)", na, e->maxargs);
    LLVMTypeRef at = LLVMArrayType(e->ti64, (unsigned)e->maxargs);
    for (int k = 0; k < na; k++) {
        LLVMValueRef idx[2] = {I64(e, 0), I64(e, k)};
        LLVMBuildStore(b, a[k], LLVMBuildInBoundsGEP2(b, at, e->args, idx, 2, ""));
    }
    LLVMValueRef idx[2] = {I64(e, 0), I64(e, 0)};
    LLVMValueRef argp = LLVMBuildInBoundsGEP2(b, at, e->args, idx, 2, "");
    LLVMValueRef c[6] = {e->ctx, I32(e, stream_of(n)), fn, argp, I32(e, na), launch_name(e, n, kernel)};
    LLVMBuildCall2(b, e->tlaunch, e->rt_launch, c, 6, "");
}

static const char *opname(Op op) { return ir_ops[op].name; }

/* Launch the library kernel rtk_<kname> for node n. */
static void launch_lib(Em *e, const Node *n, const char *kname, const LLVMValueRef *a, int na) {
    launch(e, n, lib(e, kname), opname(n->op), a, na);
}

static void launch_memcpy(Em *e, const Node *n, int dst, int src) {
    const Value *d = planned(e, dst), *s = planned(e, src);
    if (d->space == s->space && d->offset == s->offset) return; /* already there */
    int64_t bytes = ir_value_bytes(s);
    LLVMValueRef a[] = {P(e, dst, 0), P(e, src, 0), I64(e, bytes)};
    launch(e, n, lib(e, "memcpy"), opname(n->op), a, 3);
}

/* Drop size-1 dims and merge dims that are contiguous in every stride array. */
static int squeeze(int rank, int64_t *d, int ns, int64_t *st[]) {
    int r = 0;
    for (int i = 0; i < rank; i++) {
        if (d[i] == 1) continue;
        int merge = r > 0;
        for (int s = 0; s < ns && merge; s++) merge = st[s][r - 1] == st[s][i] * d[i];
        if (merge) {
            d[r - 1] *= d[i];
            for (int s = 0; s < ns; s++) st[s][r - 1] = st[s][i];
        } else {
            d[r] = d[i];
            for (int s = 0; s < ns; s++) st[s][r] = st[s][i];
            r++;
        }
    }
    if (r == 0) {
        d[0] = 1;
        for (int s = 0; s < ns; s++) st[s][0] = 0;
        r = 1;
    }
    return r;
}

/* rtk_copy of a box of dims d[] from src (strides ss) to dst (strides ds). */
static void launch_copy(Em *e, const Node *n, LLVMValueRef src, LLVMValueRef dst, int64_t esize, int rank,
                        const int64_t *dims, const int64_t *sstr, const int64_t *dstr) {
    int64_t d[IR_MAXRANK], ss[IR_MAXRANK], ds[IR_MAXRANK];
    memcpy(d, dims, sizeof(int64_t) * (size_t)rank);
    memcpy(ss, sstr, sizeof(int64_t) * (size_t)rank);
    memcpy(ds, dstr, sizeof(int64_t) * (size_t)rank);
    int r = squeeze(rank, d, 2, (int64_t *[]){ss, ds});
    LLVMValueRef a[4 + 3 * IR_MAXRANK] = {src, dst, I64(e, esize), I64(e, r)};
    for (int k = 0; k < IR_MAXRANK; k++) {
        a[4 + k] = I64(e, k < r ? d[k] : 1);
        a[4 + IR_MAXRANK + k] = I64(e, k < r ? ss[k] : 0);
        a[4 + 2 * IR_MAXRANK + k] = I64(e, k < r ? ds[k] : 0);
    }
    launch(e, n, lib(e, "copy"), opname(n->op), a, 4 + 3 * IR_MAXRANK);
}

static const Type *TY(Em *e, int vid) { return &e->g->vals[vid].t; }
static int64_t last(const Type *t) { return t->rank ? t->dim[t->rank - 1] : 1; }
static int64_t esize(const Type *t) { return (int64_t)ir_dtype_size(t->dt); }

static void emit_transpose(Em *e, const Node *n) {
    const Type *x = TY(e, n->in[0]), *y = TY(e, n->out[0]);
    int a = (int)ir_attr_i(n, "a", 0), b = (int)ir_attr_i(n, "b", 0);
    int64_t xs[IR_MAXRANK], ys[IR_MAXRANK], ss[IR_MAXRANK];
    kg_row_strides(x, xs);
    kg_row_strides(y, ys);
    for (int d = 0; d < y->rank; d++) ss[d] = xs[d == a ? b : d == b ? a : d];
    launch_copy(e, n, P(e, n->in[0], 0), P(e, n->out[0], 0), esize(x), y->rank, y->dim, ss, ys);
}

static void emit_slice(Em *e, const Node *n) {
    const Type *x = TY(e, n->in[0]), *y = TY(e, n->out[0]);
    int d = (int)ir_attr_i(n, "dim", 0);
    int64_t xs[IR_MAXRANK], ys[IR_MAXRANK];
    kg_row_strides(x, xs);
    kg_row_strides(y, ys);
    int64_t start = ir_attr_i(n, "start", 0);
    if (ir_view_part_in_place(e->g, n, 0)) return; /* a view: the plan put it inside its input (live.h) */
    launch_copy(e, n, P(e, n->in[0], start * xs[d] * esize(x)), P(e, n->out[0], 0), esize(x), y->rank, y->dim, xs, ys);
}

static void emit_concat(Em *e, const Node *n) {
    const Type *y = TY(e, n->out[0]);
    int d = (int)ir_attr_i(n, "dim", 0);
    int64_t ys[IR_MAXRANK], xs[IR_MAXRANK], at = 0;
    kg_row_strides(y, ys);
    for (int k = 0; k < n->nin; k++) {
        const Type *x = TY(e, n->in[k]);
        kg_row_strides(x, xs);
        if (!ir_view_part_in_place(e->g, n, k)) /* else its producer wrote it in place (live.h, a concat's member) */
            launch_copy(e, n, P(e, n->in[k], 0), P(e, n->out[0], at * ys[d] * esize(y)), esize(y), x->rank, x->dim, xs, ys);
        at += x->dim[d];
    }
}

/* Strides of small aligned to big's dims (numpy rule), 0 on broadcast dims. */
static void bcast_strides(const Type *small, const Type *big, int64_t st[IR_MAXRANK]) {
    int64_t ss[IR_MAXRANK];
    kg_row_strides(small, ss);
    int shift = big->rank - small->rank;
    for (int d = 0; d < big->rank; d++) {
        int k = d - shift;
        st[d] = k < 0 || small->dim[k] == 1 ? 0 : ss[k];
    }
}

static void emit_broadcast(Em *e, const Node *n) {
    const Type *x = TY(e, n->in[0]), *y = TY(e, n->out[0]);
    int64_t ss[IR_MAXRANK], ys[IR_MAXRANK];
    bcast_strides(x, y, ss);
    kg_row_strides(y, ys);
    launch_copy(e, n, P(e, n->in[0], 0), P(e, n->out[0], 0), esize(y), y->rank, y->dim, ss, ys);
}

static void emit_sumto(Em *e, const Node *n) {
    const Type *x = TY(e, n->in[0]), *y = TY(e, n->out[0]);
    int64_t d[IR_MAXRANK], ys[IR_MAXRANK];
    memcpy(d, x->dim, sizeof d);
    bcast_strides(y, x, ys);
    int r = squeeze(x->rank, d, 1, (int64_t *[]){ys});
    LLVMValueRef a[5 + 2 * IR_MAXRANK] = {P(e, n->in[0], 0), P(e, n->out[0], 0), I64(e, r)};
    for (int k = 0; k < IR_MAXRANK; k++) {
        a[3 + k] = I64(e, k < r ? d[k] : 1);
        a[3 + IR_MAXRANK + k] = I64(e, k < r ? ys[k] : 0);
    }
    a[3 + 2 * IR_MAXRANK] = DT(e, n->in[0]);
    a[4 + 2 * IR_MAXRANK] = DT(e, n->out[0]);
    launch_lib(e, n, "sumto", a, 5 + 2 * IR_MAXRANK);
}

/* outer, len, inner of t split at dim d */
static void split_at(const Type *t, int d, int64_t *outer, int64_t *len, int64_t *inner) {
    *outer = *inner = 1;
    for (int i = 0; i < d; i++) *outer *= t->dim[i];
    for (int i = d + 1; i < t->rank; i++) *inner *= t->dim[i];
    *len = t->rank ? t->dim[d] : 1;
}

static int dim_of(const Node *n, const Type *t) {
    int64_t d = ir_attr_i(n, "dim", -1);
    if (d < 0 || d >= t->rank) {
        char w[160];
        ICE("emit: %s: %s: dim %lld out of range", ir_where(n, w, sizeof w), ir_ops[n->op].name, (long long)d);
    }
    return (int)d;
}

static void emit_reduce(Em *e, const Node *n) {
    const Type *x = TY(e, n->in[0]);
    int64_t outer, len, inner;
    split_at(x, dim_of(n, x), &outer, &len, &inner);
    int kind = n->op == OP_sum ? 0 : n->op == OP_mean ? 1 : 2;
    LLVMValueRef a[] = {P(e, n->in[0], 0), P(e, n->out[0], 0), I64(e, outer), I64(e, len), I64(e, inner), I64(e, kind),
                        DT(e, n->in[0]), DT(e, n->out[0])};
    launch_lib(e, n, "reduce", a, 8);
}

static void emit_max_bwd(Em *e, const Node *n) {
    const Type *x = TY(e, n->in[1]);
    int64_t outer, len, inner;
    split_at(x, dim_of(n, x), &outer, &len, &inner);
    LLVMValueRef a[] = {P(e, n->in[0], 0), P(e, n->in[1], 0), P(e, n->in[2], 0), P(e, n->out[0], 0),
                        I64(e, outer), I64(e, len), I64(e, inner), DT(e, n->in[1])};
    launch_lib(e, n, "max_bwd", a, 8);
}

/* FLOPs of a GEMM or attention node: every one is hardware work; only those
 * outside phase recompute are model FLOPs (what MFU counts: the model's
 * forward and backward once, as if nothing were recomputed). */
static void add_flops(Em *e, const Node *n, double f) {
    e->hw_flops += f;
    if (n->phase != PH_RECOMPUTE) e->flops += f;
}

/* C[b] = op(A[b]) op(B[b]); a rank-2 B is shared by every batch entry, and
 * then (without ta) the batch folds into M: one large GEMM. */
static void emit_matmul(Em *e, const Node *n) {
    const Type *at = TY(e, n->in[0]), *bt = TY(e, n->in[1]), *yt = TY(e, n->out[0]);
    int64_t ta = ir_attr_i(n, "ta", 0) != 0, tb = ir_attr_i(n, "tb", 0) != 0;
    int64_t M = yt->dim[yt->rank - 2], N = yt->dim[yt->rank - 1], K = at->dim[at->rank - 1 - ta];
    int64_t batch = ir_numel(yt) / (M * N);
    add_flops(e, n, 2.0 * (double)batch * (double)M * (double)N * (double)K);
    int64_t sa = at->rank > 2 ? M * K : 0, sb = bt->rank > 2 ? K * N : 0;
    if (sb == 0 && !ta && batch > 1) {
        M *= batch;
        batch = 1;
        sa = 0;
    }
    LLVMValueRef a[] = {P(e, n->in[0], 0), P(e, n->in[1], 0), P(e, n->out[0], 0), I64(e, batch), I64(e, M), I64(e, N),
                        I64(e, K), I64(e, ta), I64(e, tb), I64(e, sa), I64(e, sb), I64(e, M * N), F(e, 0),
                        DT(e, n->in[0]), DT(e, n->in[1]), DT(e, n->out[0]),
                        NULL, NULL};
    int na = 16;
    switch (n->op) { /* the epilogues' operands (CUDA) */
    case OP_matmul_bias: a[na++] = P(e, n->in[2], 0); break;                                  /* bias */
    case OP_matmul_bias_gelu: a[na++] = P(e, n->in[2], 0), a[na++] = P(e, n->out[1], 0); break; /* bias, aux out */
    case OP_matmul_dgelu_bgrad: a[na++] = P(e, n->in[2], 0), a[na++] = P(e, n->out[1], 0); break; /* aux in, db */
    case OP_matmul_bgrad: a[na++] = P(e, n->out[1], 0), a[na++] = I64(e, ir_attr_i(n, "bgrad", 1) != 0); break; /* db, of b */
    default: break;
    }
    const char *fn = n->op == OP_matmul_bias_gelu     ? "gemm_bias_gelu"
                     : n->op == OP_matmul_bias        ? "gemm_bias"
                     : n->op == OP_matmul_dgelu_bgrad ? "gemm_dgelu_bgrad"
                     : n->op == OP_matmul_bgrad       ? "gemm_bgrad"
                                                      : "gemm";
    launch_lib(e, n, fn, a, na);
}

/* --attention cudnn: cuDNN's SDPA takes bf16 q, k, v and o, index
 * positions (no qpos/kpos: context parallel's chunks stay on kiln's
 * kernel), no sliding window, T == S and a head dim that is a multiple of
 * 8 up to 128 (docs/cudnn.md); anything else runs kiln's kernel. */
static int cudnn_qualifies(Em *e, const Node *n, int pos) {
    int bwd = n->op == OP_attention_bwd, nfixed = 3 + 3 * bwd;
    const Type *q = TY(e, n->in[bwd]), *k = TY(e, n->in[bwd + 1]);
    int64_t D = q->dim[3];
    if (pos || ir_attr_i(n, "window", 0) || q->dim[2] != k->dim[2] || q->dim[2] < 1 || D % 8 || D < 8 || D > 128 || q->dim[1] % k->dim[1]) return 0;
    for (int i = 0; i < nfixed; i++) /* bf16 tensors, f32 lse (the forward's fifth input in the backward) */
        if (TY(e, n->in[i])->dt != (bwd && i == 5 ? DT_F32 : DT_BF16)) return 0;
    for (int i = 0; i < n->nout; i++)
        if (TY(e, n->out[i])->dt != (!bwd && i == 1 ? DT_F32 : DT_BF16)) return 0;
    return 1;
}

/* rtk_attention(_bwd): the fixed inputs (q, k, v; do, q, k, v, o, lse),
 * the outputs, the dims, scale, then the qpos, kpos pointers: the last two
 * inputs when the node has positions, else 0 (positions = indices); then
 * the window (0: none). */
static void emit_attention(Em *e, const Node *n) {
    int bwd = n->op == OP_attention_bwd, nfixed = 3 + 3 * bwd, pos = n->nin == nfixed + 2;
    const Type *q = TY(e, n->in[bwd]), *k = TY(e, n->in[bwd + 1]);
    int64_t B = q->dim[0], H = q->dim[1], T = q->dim[2], D = q->dim[3], KH = k->dim[1], S = k->dim[2];
    int64_t causal = ir_attr_i(n, "causal", 0) != 0, window = causal ? ir_attr_i(n, "window", 0) : 0;
    double scale = ir_attr_f(n, "scale", 1 / sqrt((double)D));
    add_flops(e, n, ir_node_flops(e->g, n));
    LLVMValueRef a[20]; /* attention_bwd: 9 pointers, 8 dims and scale, 2 positions, the window */
    int na = 0;
    for (int i = 0; i < nfixed; i++) a[na++] = P(e, n->in[i], 0);
    for (int i = 0; i < n->nout; i++) a[na++] = P(e, n->out[i], 0);
    int64_t dims[] = {B, H, KH, T, S, D, causal};
    for (int i = 0; i < 7; i++) a[na++] = I64(e, dims[i]);
    a[na++] = F(e, scale);
    a[na++] = pos ? P(e, n->in[nfixed], 0) : I64(e, 0);
    a[na++] = pos ? P(e, n->in[nfixed + 1], 0) : I64(e, 0);
    a[na++] = I64(e, window);
    const char *kname = bwd ? "attention_bwd" : "attention";
    if (e->cuda && e->tgt->attention_cudnn && cudnn_qualifies(e, n, pos)) kname = bwd ? "attention_bwd_cudnn" : "attention_cudnn";
    else if (e->cuda && e->tgt->attention_tc && (D == 16 || D == 32 || D == 64 || D == 128)) /* attention_tc.cu's head dims */
        kname = bwd ? "attention_bwd_tc" : "attention_tc";
    launch_lib(e, n, kname, a, na);
}

/* Pointers of every input then every output, then the extra args. */
static void launch_io(Em *e, const Node *n, const char *kname, const LLVMValueRef *extra, int nextra) {
    LLVMValueRef a[LIBARGS];
    int na = 0;
    if (n->nin + n->nout + nextra > LIBARGS) ICE("emit: %s: too many kernel args", ir_ops[n->op].name);
    for (int i = 0; i < n->nin; i++) a[na++] = P(e, n->in[i], 0);
    for (int i = 0; i < n->nout; i++) a[na++] = P(e, n->out[i], 0);
    for (int i = 0; i < nextra; i++) a[na++] = extra[i];
    launch_lib(e, n, kname, a, na);
}

static void emit_norm(Em *e, const Node *n) {
    int bwd = n->op == OP_layernorm_bwd || n->op == OP_rmsnorm_bwd;
    const Type *x = TY(e, n->in[bwd]);
    int64_t C = last(x);
    LLVMValueRef ex[] = {I64(e, ir_numel(x) / C), I64(e, C), F(e, ir_attr_f(n, "eps", 1e-5))};
    if (n->op == OP_layernorm && n->nin == 2) { /* no bias: a null b (issue 17) */
        LLVMValueRef a[] = {P(e, n->in[0], 0), P(e, n->in[1], 0), I64(e, 0), P(e, n->out[0], 0), ex[0], ex[1], ex[2]};
        launch_lib(e, n, "layernorm", a, 7);
        return;
    }
    launch_io(e, n, ir_ops[n->op].name, ex, 3);
}

static void emit_rope(Em *e, const Node *n) {
    const Type *x = TY(e, n->in[0]);
    LLVMValueRef ex[] = {I64(e, x->dim[0]), I64(e, x->dim[1]), I64(e, x->dim[2]), I64(e, x->dim[3]),
                         F(e, ir_attr_f(n, "theta", 10000)), I64(e, n->op == OP_rope ? 1 : -1)};
    launch_io(e, n, "rope", ex, 6);
}

/* dropout (issue 17): rtk_dropout on [B, T, F]; the mask's key from the
 * node's seed and id and the step input (kiln_rt.h) */
static void emit_dropout(Em *e, const Node *n) {
    const Type *x = TY(e, n->in[0]);
    LLVMValueRef ex[] = {I64(e, x->dim[0]), I64(e, x->dim[1]), I64(e, ir_numel(x) / (x->dim[0] * x->dim[1])),
                         F(e, ir_attr_f(n, "p", 0)), I64(e, ir_attr_i(n, "seed", 0)), I64(e, ir_attr_i(n, "id", 0))};
    launch_io(e, n, "dropout", ex, 6);
}

static void emit_const(Em *e, const Node *n) {
    const Type *t = TY(e, n->out[0]);
    char w[160];
    if (t->dt != DT_F32 && t->dt != DT_I32 && !(e->cuda && t->dt == DT_BF16))
        ICE("emit: %s: const of %s (rtk_fill: f32 or i32; bf16 on CUDA)", ir_where(n, w, sizeof w), ir_dtype_names[t->dt]);
    LLVMValueRef a[] = {P(e, n->out[0], 0), I64(e, ir_numel(t)), F(e, ir_attr_f(n, "v", 0)), DT(e, n->out[0])};
    launch_lib(e, n, "fill", a, 4);
}

/* Collectives and shard over a mesh group (kiln_rt.h, "ranks and
 * communication"), on the node's stream like any kernel.  The mesh is known
 * at compile time, so a group of one rank is a copy (or nothing, when memplan
 * put both in one buffer) and needs no runtime support.  Otherwise:
 *   allreduce: rtk_allreduce(x, y, n, mask, dt), n the element count.
 *   reducescatter, allgather: rtk_<op>(x, y, outer, n, inner, mask, dt),
 *     the tensors viewed as [outer, len, inner] around the node's dim, n
 *     the per-rank length along it (y's for reducescatter, x's for
 *     allgather).  dt is f32 (bf16 too on CUDA; allgather also takes i32
 *     positions).  outer > 1
 *     (context parallel's K, V on T) is fine: the runtime packs through a
 *     temporary.
 *   shard: rtk_shard(x, y, outer, len, inner, elem_bytes, mask), len the
 *     output's (this rank's) length along dim; any dtype. */
static void emit_comm(Em *e, const Node *n) {
    char w[160];
    const Type *x = TY(e, n->in[0]), *y = TY(e, n->out[0]);
    const char *op = ir_ops[n->op].name, *group = ir_attr_s(n, "group", "");
    int mask = ir_group_mask(group), size = ir_group_size(e->m, n);
    if (mask <= 0) ICE("emit: %s: %s: bad group \"%s\"", ir_where(n, w, sizeof w), op, group);
    if (size == 1) {
        launch_memcpy(e, n, n->out[0], n->in[0]);
        return;
    }
    int64_t outer = 1, len = 1, inner = 1;
    if (n->op != OP_allreduce) split_at(y, dim_of(n, y), &outer, &len, &inner);
    if (n->op == OP_shard) {
        LLVMValueRef a[] = {P(e, n->in[0], 0), P(e, n->out[0], 0), I64(e, outer), I64(e, len), I64(e, inner), I64(e, esize(y)),
                            I64(e, mask)};
        launch_lib(e, n, "shard", a, 7);
        return;
    }
    int ok = x->dt == DT_F32 || (n->op == OP_allgather && x->dt == DT_I32) || (e->cuda && x->dt == DT_BF16);
    if (!ok) /* allgather moves bits: i32 positions too */
        ICE("emit: %s: %s of %s over %d ranks: the collectives take f32 (allgather i32 too; bf16 on CUDA)",
            ir_where(n, w, sizeof w), op, ir_dtype_names[x->dt], size);
    if (n->op == OP_allreduce) {
        LLVMValueRef a[] = {P(e, n->in[0], 0), P(e, n->out[0], 0), I64(e, ir_numel(x)), I64(e, mask), DT(e, n->in[0])};
        launch_lib(e, n, op, a, 5);
        return;
    }
    if (n->op == OP_allgather) {
        if (len % size) ICE("emit: %s: allgather to length %lld over %d ranks", ir_where(n, w, sizeof w), (long long)len, size);
        len /= size;
    }
    LLVMValueRef a[] = {P(e, n->in[0], 0), P(e, n->out[0], 0), I64(e, outer), I64(e, len), I64(e, inner), I64(e, mask),
                        DT(e, n->in[0])};
    launch_lib(e, n, op, a, 7);
}

/* Point to point (ring attention): rtk_send(x, bytes, mask, peer, tag) and
 * rtk_recv(y, bytes, mask, peer, tag), any dtype (K, V and the i32 key
 * positions travel).  The runtime handles every group size, a group of one
 * included (the send waits in its staging list for the recv), so the
 * launch does not depend on the mesh.  A posted receive (the pipeline's
 * recv_start ... recv_done) is rtk_recv_start then rtk_recv_done with the
 * same args on the CPU (MPI_Irecv, then MPI_Wait).  On CUDA the start
 * issues nothing and the done is today's rtk_recv: NCCL pairs by order and
 * a receive on the comm stream is a kernel that holds every later launch on
 * that stream until its bytes arrive, so a receive issued at the start
 * would hold the sends of the action in between, which the peer may be
 * waiting for (comm_nccl.c groups a send with the next receive instead). */
static void emit_p2p(Em *e, const Node *n) {
    if (e->cuda && n->op == OP_recv_start) return;
    char w[160];
    const char *group = ir_attr_s(n, "group", "");
    int mask = ir_group_mask(group);
    if (mask <= 0) ICE("emit: %s: %s: bad group \"%s\"", ir_where(n, w, sizeof w), ir_ops[n->op].name, group);
    int vid = n->op == OP_send ? n->in[0] : n->out[0]; /* recv_done: a view of its start's buffer */
    const Type *t = TY(e, vid);
    int64_t tag = ir_attr_i(n, "tag", -1);
    if (tag < 0 || tag > 32767) ICE("emit: %s: %s: tag %lld outside 0..32767", ir_where(n, w, sizeof w), ir_ops[n->op].name, (long long)tag);
    LLVMValueRef a[] = {P(e, vid, 0), I64(e, ir_numel(t) * esize(t)), I64(e, mask), I64(e, ir_attr_i(n, "peer", 0)), I64(e, tag)};
    launch_lib(e, n, e->cuda && n->op == OP_recv_done ? "recv" : ir_ops[n->op].name, a, 5);
}

/* iota: 0..n-1 (rtk_iota), or with a group, a rank's global token
 * indices of a sequence split over it (rtk_iota_rank(dst, n, mask, dual,
 * from, all);
 * layout "dual" or "contiguous", the default, as compiler/interp.c).  Over
 * a group of one rank both layouts are 0..n-1: a plain iota. */
static void emit_iota(Em *e, const Node *n) {
    LLVMValueRef a[] = {P(e, n->out[0], 0), I64(e, ir_numel(TY(e, n->out[0]))), NULL, NULL, NULL, NULL};
    const char *group = ir_attr_s(n, "group", "");
    char w[160];
    int mask = *group ? ir_group_mask(group) : 0;
    if (*group && mask <= 0) ICE("emit: %s: iota: bad group \"%s\"", ir_where(n, w, sizeof w), group);
    if (!*group || ir_group_size(e->m, n) == 1) {
        launch_lib(e, n, "iota", a, 2);
        return;
    }
    a[2] = I64(e, mask);
    a[3] = I64(e, strcmp(ir_attr_s(n, "layout", "contiguous"), "dual") == 0);
    a[4] = I64(e, ir_attr_i(n, "from", 0));
    a[5] = I64(e, ir_attr_i(n, "all", 0) != 0);
    launch_lib(e, n, "iota_rank", a, 6);
}

/* rt_program.cp_contiguous: 1 when the rank-dependent iotas over cp split
 * the sequence contiguously, 0 for the dual layout or without any (all of a
 * program's must agree; iotas over other groups say nothing about cp). */
static int cp_contiguous(Em *e) {
    int found = -1;
    char w[160];
    for (int i = 0; i < e->g->nnodes; i++) {
        const Node *n = &e->g->nodes[i];
        if (n->op != OP_iota || ir_group_mask(ir_attr_s(n, "group", "")) != RT_AXIS_CP) continue;
        int c = strcmp(ir_attr_s(n, "layout", "contiguous"), "dual") != 0;
        if (found >= 0 && c != found) ICE("emit: %s: iota layouts disagree within one program", ir_where(n, w, sizeof w));
        found = c;
    }
    return found > 0;
}

/* The value of the param/state node named `name`, for assign. */
static int state_value(Em *e, const Node *asg) {
    const char *name = ir_attr_s(asg, "name", "");
    for (int i = 0; i < e->g->nnodes; i++) {
        const Node *n = &e->g->nodes[i];
        if ((n->op == OP_param || n->op == OP_state) && strcmp(ir_attr_s(n, "name", ""), name) == 0) return n->out[0];
    }
    char w[160];
    ICE("emit: %s: assign to %s, which no param/state node declares", ir_where(asg, w, sizeof w), name);
}

/* One node of the program. */
static void emit_node(Em *e, int idx) {
    const Node *n = &e->g->nodes[idx];
    char w[160];
    e->user = n;
    if (e->kg.group_of[idx] >= 0) {
        KGroup *gr = &e->kg.groups[e->kg.group_of[idx]];
        if (gr->nodes[0] != idx) return; /* launched at its first member */
        LLVMValueRef *a = xcalloc((size_t)(gr->nin + gr->nout + 3), sizeof(LLVMValueRef));
        int na = 0;
        if (e->cuda && gr->nin + gr->nout > 256) /* rtk_fused's limit (kernels_cuda.c) */
            ICE("emit: %s: a fused group with %d pointers (the CUDA launcher takes at most 256)", ir_where(n, w, sizeof w),
                gr->nin + gr->nout);
        if (e->cuda) { /* rtk_fused: kernel, nptrs, n, pointers */
            a[na++] = I64(e, e->kindex[gr->first]);
            a[na++] = I64(e, gr->nin + gr->nout);
            a[na++] = I64(e, ir_numel(&gr->shape));
        }
        for (int k = 0; k < gr->nin; k++) a[na++] = P(e, gr->in[k], 0);
        for (int k = 0; k < gr->nout; k++) a[na++] = P(e, gr->out[k], 0);
        if (!e->cuda) a[na++] = I64(e, ir_numel(&gr->shape));
        if (gr->nout > 0) launch(e, n, e->cuda ? lib(e, "fused") : e->group_fn[gr->first], gr->name, a, na);
        free(a);
        return;
    }
    if (e->cuda) {
        int64_t s = emit_cuda_scratch(e->m, n);
        if (s > e->scratch) e->scratch = s;
    }
    switch (n->op) {
    case OP_input: case OP_param: case OP_state: case OP_output:
        return;
    case OP_const: emit_const(e, n); return;
    case OP_iota: emit_iota(e, n); return;
    case OP_assign: launch_memcpy(e, n, state_value(e, n), n->in[0]); return;
    case OP_record: case OP_wait: {
        LLVMValueRef a[3] = {e->ctx, I32(e, stream_of(n)), I32(e, (int)ir_attr_i(n, "event", 0))};
        LLVMBuildCall2(e->b, e->tevent, n->op == OP_record ? e->rt_record : e->rt_wait, a, 3, "");
        return;
    }
    case OP_reshape: case OP_loss: launch_memcpy(e, n, n->out[0], n->in[0]); return; /* views: nothing when planned in place */
    case OP_offload: case OP_reload: { /* offload.c's copies, on their node's copy stream (kiln_rt.h) */
        LLVMValueRef a[] = {P(e, n->out[0], 0), P(e, n->in[0], 0), I64(e, ir_value_bytes(&e->g->vals[n->in[0]]))};
        launch_lib(e, n, n->op == OP_offload ? "offload" : "reload", a, 3);
        return;
    }
    case OP_sum: case OP_mean: case OP_max: emit_reduce(e, n); return;
    case OP_max_bwd: emit_max_bwd(e, n); return;
    case OP_sumsq: {
        LLVMValueRef a[] = {P(e, n->in[0], 0), P(e, n->out[0], 0), I64(e, ir_numel(TY(e, n->in[0]))), DT(e, n->in[0])};
        launch_lib(e, n, "sumsq", a, 4);
        return;
    }
    case OP_transpose: emit_transpose(e, n); return;
    case OP_slice: emit_slice(e, n); return;
    case OP_concat: emit_concat(e, n); return;
    case OP_broadcast: emit_broadcast(e, n); return;
    case OP_sumto: emit_sumto(e, n); return;
    case OP_matmul: case OP_matmul_bias: case OP_matmul_bias_gelu: case OP_matmul_dgelu_bgrad: case OP_matmul_bgrad:
        emit_matmul(e, n);
        return;
    case OP_layernorm: case OP_layernorm_bwd: case OP_rmsnorm: case OP_rmsnorm_bwd: emit_norm(e, n); return;
    case OP_softmax: case OP_softmax_bwd: {
        const Type *x = TY(e, n->in[0]);
        LLVMValueRef ex[] = {I64(e, ir_numel(x) / last(x)), I64(e, last(x)), DT(e, n->in[0])};
        launch_io(e, n, ir_ops[n->op].name, ex, 3);
        return;
    }
    case OP_rope: case OP_rope_bwd: emit_rope(e, n); return;
    case OP_dropout: emit_dropout(e, n); return;
    case OP_attention: case OP_attention_bwd: emit_attention(e, n); return;
    case OP_embedding: case OP_embedding_bwd: {
        const Type *tab = TY(e, n->op == OP_embedding ? n->in[0] : n->out[0]);
        LLVMValueRef ex[] = {I64(e, ir_numel(TY(e, n->in[1]))), I64(e, tab->dim[1]), I64(e, tab->dim[0])};
        launch_io(e, n, ir_ops[n->op].name, ex, 3);
        return;
    }
    case OP_cross_entropy: case OP_cross_entropy_bwd: case OP_cross_entropy_fused: { /* fused: args dl, logits, targets, dlogits, loss, rows, V */
        const Type *lg = TY(e, n->in[n->op == OP_cross_entropy ? 0 : 1]);
        LLVMValueRef ex[] = {I64(e, ir_numel(lg) / last(lg)), I64(e, last(lg))};
        launch_io(e, n, ir_ops[n->op].name, ex, 2);
        return;
    }
    case OP_lr_cosine: { /* the constants are the program's schedule table (collect_schedule) */
        if (!e->schedule) ICE("emit: %s: lr_cosine without the program's schedule table", ir_where(n, w, sizeof w));
        LLVMValueRef ex[] = {LLVMBuildPtrToInt(e->b, e->schedule, e->ti64, "")};
        launch_io(e, n, "lr_cosine", ex, 1);
        return;
    }
    case OP_clipscale: {
        LLVMValueRef ex[] = {F(e, ir_attr_f(n, "max", 0))};
        launch_io(e, n, "clipscale", ex, 1);
        return;
    }
    case OP_adamw: {
        LLVMValueRef ex[] = {I64(e, ir_numel(TY(e, n->in[0]))), F(e, ir_attr_f(n, "b1", 0.9)), F(e, ir_attr_f(n, "b2", 0.999)),
                             F(e, ir_attr_f(n, "eps", 1e-8)), F(e, ir_attr_f(n, "wd", 0.01))};
        launch_io(e, n, "adamw", ex, 5);
        return;
    }
    case OP_allreduce: case OP_reducescatter: case OP_allgather: case OP_shard: emit_comm(e, n); return;
    case OP_send: case OP_recv: case OP_recv_start: case OP_recv_done: emit_p2p(e, n); return;
    case OP_attn_merge: { /* o_a [.., D], lse_a [rows], o_b, lse_b -> o, lse */
        const Type *o = TY(e, n->in[0]);
        int64_t rows = ir_numel(TY(e, n->in[1]));
        LLVMValueRef ex[] = {I64(e, rows), I64(e, rows ? ir_numel(o) / rows : 0), DT(e, n->in[0])};
        launch_io(e, n, "attn_merge", ex, 3);
        return;
    }
    default:
        ICE("emit: %s: no code for op %s", ir_where(n, w, sizeof w), ir_ops[n->op].name);
    }
}

/* The program order: nodes by Node.pos (node order when unscheduled). */
static void program_order(Em *e) {
    e->norder = e->g->nnodes;
    e->order = kg_program_order(e->g);
}

/* Recv fences.  memplan's liveness orders a buffer's reuse by program
 * position and keeps a buffer read on another stream than its producer's
 * until the producer's stream has waited for the reader.  A recv has no
 * input, so nothing orders its stream (the comm stream) after the compute
 * stream's last use of the buffer memplan hands it: the recv could write
 * into bytes a compute kernel is still reading.  (Collectives do not have
 * this problem: their input is waited for, which orders them after
 * everything the compute stream launched before it.)  So for each recv on
 * stream sr, and each other stream su, the last node before it on su that
 * reads or writes a buffer overlapping the recv's gets an extra event
 * recorded right after it, and the recv's stream waits for it right before
 * the recv.  The records come early (at the last use, not at the recv), so
 * the ring still overlaps the compute.  The extra events are numbered after
 * the schedule's.  (The proper home of this is memplan/schedule; until then
 * the emitter keeps the CPU program race-free.) */
static int node_touches(const Graph *g, const Node *n, int space, int64_t lo, int64_t hi) {
    for (int io = 0; io < 2; io++)
        for (int k = 0; k < (io ? n->nout : n->nin); k++) {
            const Value *v = &g->vals[io ? n->out[k] : n->in[k]];
            if (v->space != space || v->offset < 0) continue;
            int64_t end = v->offset + ir_value_bytes(v);
            if (v->offset < hi && lo < end) return 1;
        }
    return 0;
}

static void recv_fences(Em *e) {
    const Graph *g = e->g;
    int n = e->norder;
    e->fence_after = xcalloc((size_t)n * 8 + 1, sizeof(int));
    e->fence_after_stream = xcalloc((size_t)n * 8 + 1, sizeof(int));
    e->fence_before = xcalloc((size_t)n * 8 + 1, sizeof(int));
    for (int i = 0; i < n * 8; i++) e->fence_after[i] = e->fence_before[i] = -1;
    e->nevents_base = 0;
    for (int i = 0; i < g->nnodes; i++)
        if (ir_ops[g->nodes[i].op].flags & F_SYNC && ir_attr_i(&g->nodes[i], "event", -1) + 1 > e->nevents_base)
            e->nevents_base = (int)ir_attr_i(&g->nodes[i], "event", -1) + 1;
    for (int p = 0; p < n; p++) {
        const Node *r = &g->nodes[e->order[p]];
        if (r->op != OP_recv && r->op != OP_recv_start) continue; /* a posted receive writes from its start on */
        const Value *v = &g->vals[r->out[0]];
        if (v->space < 0 || v->offset < 0) continue;
        int64_t lo = v->offset, hi = lo + ir_value_bytes(v);
        int sr = stream_of(r), nb = 0;
        for (int su = 0; su < 8; su++) {
            if (su == sr) continue;
            int q = p - 1;
            while (q >= 0 && !(stream_of(&g->nodes[e->order[q]]) == su && node_touches(g, &g->nodes[e->order[q]], v->space, lo, hi))) q--;
            if (q < 0) continue;
            int slot = q * 8;
            while (slot < q * 8 + 8 && e->fence_after[slot] >= 0) slot++;
            if (slot == q * 8 + 8 || nb == 8) ICE("emit: too many recv fences at position %d", q);
            int ev = e->nevents_base + e->nevents_extra++;
            e->fence_after[slot] = ev;
            e->fence_after_stream[slot] = su;
            e->fence_before[p * 8 + nb++] = ev;
        }
    }
}

static void emit_event(Em *e, LLVMValueRef fn, int stream, int ev) {
    LLVMValueRef a[3] = {e->ctx, I32(e, stream), I32(e, ev)};
    LLVMBuildCall2(e->b, e->tevent, fn, a, 3, "");
}

static void emit_step(Em *e) {
    LLVMBuilderRef b = e->b;
    e->step = add_fn(e, "kiln_step", e->tstep, 1);
    add_fn_attr(e, e->step, LLVMAttributeFunctionIndex, "optnone");
    add_fn_attr(e, e->step, LLVMAttributeFunctionIndex, "noinline");
    LLVMPositionBuilderAtEnd(b, LLVMAppendBasicBlockInContext(e->c, e->step, "entry"));
    e->ctx = LLVMGetParam(e->step, 0);
    LLVMValueRef spaces = LLVMGetParam(e->step, 1);
    for (int s = 0; s < SPACE_COUNT; s++) {
        LLVMValueRef idx = I64(e, rt_space_of(s));
        e->base[s] = LLVMBuildLoad2(b, e->tp8, LLVMBuildInBoundsGEP2(b, e->tp8, spaces, &idx, 1, ""), "");
    }
    e->maxargs = LIBARGS;
    for (int k = 0; k < e->kg.ngroups; k++)
        if (e->kg.groups[k].nin + e->kg.groups[k].nout + 3 > e->maxargs) e->maxargs = e->kg.groups[k].nin + e->kg.groups[k].nout + 3;
    e->args = LLVMBuildAlloca(b, LLVMArrayType(e->ti64, (unsigned)e->maxargs), "args");
    recv_fences(e);
    for (int p = 0; p < e->norder; p++) {
        for (int k = 0; k < 8 && e->fence_before[p * 8 + k] >= 0; k++)
            emit_event(e, e->rt_wait, stream_of(&e->g->nodes[e->order[p]]), e->fence_before[p * 8 + k]);
        emit_node(e, e->order[p]);
        for (int k = 0; k < 8 && e->fence_after[p * 8 + k] >= 0; k++)
            emit_event(e, e->rt_record, e->fence_after_stream[p * 8 + k], e->fence_after[p * 8 + k]);
    }
    free(e->fence_after), free(e->fence_after_stream), free(e->fence_before);
    LLVMBuildRetVoid(b);
}

/* ---- the program table ---- */

/* The nodes of `op` that make table entries: the first per name, in node
 * order (idx gets their indices).  Returns the count. */
static int table_nodes(Em *e, Op op, int *idx) {
    const Graph *g = e->g;
    int n = 0;
    for (int i = 0; i < g->nnodes; i++) {
        if (g->nodes[i].op != op) continue;
        const char *name = ir_attr_s(&g->nodes[i], "name", "");
        int dup = 0;
        for (int k = 0; k < n && !dup; k++) dup = strcmp(ir_attr_s(&g->nodes[idx[k]], "name", ""), name) == 0;
        if (!dup) idx[n++] = i;
    }
    return n;
}

/* A private constant array of n elements of type elem; a pointer to its first
 * element (a null pointer when n is 0). */
static LLVMValueRef const_array(Em *e, LLVMTypeRef elem, LLVMValueRef *v, int n, const char *sym) {
    if (n == 0) return LLVMConstNull(LLVMPointerType(elem, 0));
    LLVMValueRef init = LLVMConstArray(elem, v, (unsigned)n);
    LLVMValueRef gv = LLVMAddGlobal(e->mod, LLVMTypeOf(init), sym);
    LLVMSetInitializer(gv, init);
    LLVMSetGlobalConstant(gv, 1);
    LLVMSetLinkage(gv, LLVMPrivateLinkage);
    LLVMValueRef zero[2] = {I32(e, 0), I32(e, 0)};
    return LLVMConstInBoundsGEP2(LLVMTypeOf(init), gv, zero, 2);
}

/* A param without storage: space and offset both -1 (memplan gives none to
 * a param the step never reads; collect_buckets checks that a bucket with
 * prefix "" holds its values). */
static int storageless_param(const Em *e, const Node *nd) {
    const Value *v = &e->g->vals[nd->out[0]];
    return nd->op == OP_param && v->space == -1 && v->offset == -1;
}

/* The rt_tensor of table node nd (param, state, input or output).  A param
 * without storage has space = offset = -1, the rest as usual. */
static LLVMValueRef tensor_entry(Em *e, const Node *nd) {
    int vid = nd->op == OP_output ? nd->in[0] : nd->out[0];
    e->user = nd;
    const Value *v = storageless_param(e, nd) ? &e->g->vals[vid] : planned(e, vid);
    LLVMValueRef dims[5];
    for (int d = 0; d < 5; d++) dims[d] = I64(e, d < v->t.rank ? v->t.dim[d] : 0);
    int param = nd->op == OP_param, bucket = nd->op == OP_state ? (int)ir_attr_i(nd, "bucket", -1) : -1;
    LLVMValueRef f[] = {cstr(e, ir_attr_s(nd, "name", "")), I32(e, rt_space_of(v->space)), I64(e, v->offset), I32(e, (int)v->t.dt),
                        I32(e, v->t.rank), LLVMConstArray(e->ti64, dims, 5),
                        cstr(e, param ? ir_attr_s(nd, "init", "normal") : NULL),
                        LLVMConstReal(e->tf64, param ? ir_attr_f(nd, "std", 0.02) : 0), I32(e, bucket),
                        cstr(e, bucket >= 0 ? ir_attr_s(nd, "prefix", NULL) : NULL),
                        I32(e, param && v->sh[3].kind == SH_SPLIT && e->g->m->mesh[3] > 1 ? v->sh[3].dim + 1 : 0),
                        I32(e, param ? (int)ir_attr_i(nd, "tp_blocks", 1) : 1)};
    return LLVMConstNamedStruct(e->ttensor, f, 12);
}

/* The rt_tensor array of the nodes idx[0..n); a pointer to it. */
static LLVMValueRef tensor_table(Em *e, const int *idx, int n, const char *sym) {
    LLVMValueRef *ent = xcalloc((size_t)n, sizeof(LLVMValueRef));
    for (int k = 0; k < n; k++) ent[k] = tensor_entry(e, &e->g->nodes[idx[k]]);
    LLVMValueRef r = const_array(e, e->ttensor, ent, n, sym);
    free(ent);
    return r;
}

/* ---- buckets of the distributed optimizer ----
 * A bucket is described by the attributes of every state node that holds a
 * shard of it (see collect_buckets); this is one bucket, checked. */
typedef struct {
    const Node *def;    /* the first state node naming it */
    const Node *master; /* its state with prefix "" (the params' own values), or NULL */
    int mask;           /* RT_AXIS_* */
    int64_t n;          /* padded flat length */
    int nmembers;
    int *param;         /* indices into the params table */
    const int64_t *offset;
} Bucket;

static int attr_equal(const Attr *a, const Attr *b) {
    if (!a || !b) return a == b;
    if (a->kind != b->kind) return 0;
    switch (a->kind) {
    case AT_INT: return a->i == b->i;
    case AT_FLOAT: return a->f == b->f;
    case AT_STR: return strcmp(a->s, b->s) == 0;
    case AT_INTS: return a->n == b->n && (a->n == 0 || memcmp(a->v, b->v, sizeof(int64_t) * (size_t)a->n) == 0);
    }
    return 0;
}

/* Index of the param named name[0..len) in the params table, or -1. */
static int param_index(Em *e, const int *pidx, int np, const char *name, size_t len) {
    for (int k = 0; k < np; k++) {
        const char *pn = ir_attr_s(&e->g->nodes[pidx[k]], "name", "");
        if (strlen(pn) == len && strncmp(pn, name, len) == 0) return k;
    }
    return -1;
}

/* Fill bucket k from its first state node and check it: a group of the
 * mesh, members that are params, laid out in order without overlap inside
 * n, n a multiple of the group's size. */
static void bucket_layout(Em *e, Bucket *B, int k, const int *pidx, int np) {
    const Node *d = B->def;
    char w[160];
    ir_where(d, w, sizeof w);
    const char *group = ir_attr_s(d, "group", ""), *params = ir_attr_s(d, "params", "");
    const Attr *off = ir_attr(d, "offsets");
    B->mask = ir_group_mask(group);
    B->n = ir_attr_i(d, "n", -1);
    if (B->mask <= 0) ICE("emit: %s: bucket %d: bad group \"%s\"", w, k, group);
    if (B->n <= 0) ICE("emit: %s: bucket %d: n (the padded length) missing or not positive", w, k);
    int size = ir_group_size(e->m, d);
    if (B->n % size)
        ICE("emit: %s: bucket %d: length %lld is not a multiple of the %s group's size %d", w, k, (long long)B->n, group, size);
    if (!*params) ICE("emit: %s: bucket %d has no params", w, k);
    B->nmembers = 1;
    for (const char *p = params; *p; p++) B->nmembers += *p == ',';
    if (!off || off->kind != AT_INTS || off->n != B->nmembers)
        ICE("emit: %s: bucket %d: offsets must be a list of %d ints, one per param", w, k, B->nmembers);
    B->offset = off->v;
    B->param = xcalloc((size_t)B->nmembers, sizeof(int));
    int64_t end = 0;
    const char *p = params;
    for (int j = 0; j < B->nmembers; j++) {
        size_t len = strcspn(p, ",");
        B->param[j] = param_index(e, pidx, np, p, len);
        if (B->param[j] < 0) ICE("emit: %s: bucket %d: no param named \"%.*s\"", w, k, (int)len, p);
        int64_t numel = ir_numel(&e->g->vals[e->g->nodes[pidx[B->param[j]]].out[0]].t);
        if (B->offset[j] < end || B->offset[j] + numel > B->n)
            ICE("emit: %s: bucket %d: param %.*s at offset %lld (%lld elements) overlaps the one before it or ends past n = %lld",
                w, k, (int)len, p, (long long)B->offset[j], (long long)numel, (long long)B->n);
        end = B->offset[j] + numel;
        p += len + (p[len] == ',');
    }
}

/* Params without storage against the buckets with prefix "" (the
 * distributed optimizer's master weights, state "param.b<k>"): a param has
 * no storage exactly when one such bucket holds it.  A storage-less param
 * outside them would have its values nowhere; a stored one inside would
 * exist twice (and be checkpointed twice under one name). */
static void check_param_storage(Em *e, const Bucket *B, int nb, const int *pidx, int np) {
    char w[160];
    for (int k = 0; k < np; k++) {
        const Node *pn = &e->g->nodes[pidx[k]];
        const char *name = ir_attr_s(pn, "name", "");
        int held = -1;
        for (int b = 0; b < nb; b++)
            for (int j = 0; B[b].master && j < B[b].nmembers; j++) {
                if (B[b].param[j] != k) continue;
                if (held >= 0)
                    ICE("emit: %s: param %s is held by two buckets with prefix \"\" (%d and %d)", ir_where(pn, w, sizeof w), name, held, b);
                held = b;
            }
        const Value *v = &e->g->vals[pn->out[0]];
        if (storageless_param(e, pn) && held < 0)
            ICE("emit: %s: param %s has no storage (memplan: the step never reads it) but no bucket with prefix \"\" holds its values",
                ir_where(pn, w, sizeof w), name);
        if (v->space >= 0 && held >= 0)
            ICE("emit: %s: param %s has storage (space %d, offset %lld) but bucket %d's state %s (prefix \"\") holds its values too",
                ir_where(pn, w, sizeof w), name, v->space, (long long)v->offset, held, ir_attr_s(B[held].master, "name", ""));
    }
}

/* The buckets, from the state nodes that carry them:
 *   state {name="opt.m.b0", bucket=0, group="dp", prefix="opt.m.",
 *          params="a,b", offsets=[0,16384], n=32768}
 * Every state of a bucket carries the same bucket, group, params, offsets
 * and n (its prefix is its own, "" for the params themselves: at most one
 * such state per bucket), and is this rank's shard of it: n/size elements.
 * Indices are dense from 0.  Anything else is an internal error: the
 * optimizer pass wrote an inconsistent program.  Returns the count. */
static int collect_buckets(Em *e, const int *sidx, int ns, const int *pidx, int np, Bucket **out) {
    const Graph *g = e->g;
    Bucket *B = xcalloc((size_t)ns, sizeof(Bucket));
    static const char *const keys[] = {"group", "params", "offsets", "n"};
    char w[160], w2[160];
    int nb = 0;
    for (int s = 0; s < ns; s++) {
        const Node *nd = &g->nodes[sidx[s]];
        const Attr *a = ir_attr(nd, "bucket");
        if (!a) continue;
        const char *name = ir_attr_s(nd, "name", "");
        if (a->kind != AT_INT || a->i < 0 || a->i >= ns)
            ICE("emit: %s: state %s: bucket must be an index in [0, %d)", ir_where(nd, w, sizeof w), name, ns);
        const char *prefix = ir_attr_s(nd, "prefix", NULL);
        if (!prefix) ICE("emit: %s: state %s of bucket %d has no prefix", ir_where(nd, w, sizeof w), name, (int)a->i);
        Bucket *b = &B[a->i];
        if (a->i + 1 > nb) nb = (int)a->i + 1;
        if (!*prefix && b->master)
            ICE("emit: %s: states %s and %s both hold bucket %d's params (prefix \"\")", ir_where(nd, w, sizeof w),
                ir_attr_s(b->master, "name", ""), name, (int)a->i);
        if (!*prefix) b->master = nd;
        if (!b->def) {
            b->def = nd;
            continue;
        }
        for (size_t q = 0; q < sizeof keys / sizeof *keys; q++)
            if (!attr_equal(ir_attr(b->def, keys[q]), ir_attr(nd, keys[q])))
                ICE("emit: %s: state %s describes bucket %d with another %s than state %s at %s", ir_where(nd, w, sizeof w), name,
                    (int)a->i, keys[q], ir_attr_s(b->def, "name", ""), ir_where(b->def, w2, sizeof w2));
    }
    for (int k = 0; k < nb; k++) {
        if (!B[k].def) ICE("emit: bucket %d has no state (bucket indices must be dense, 0..%d)", k, nb - 1);
        bucket_layout(e, &B[k], k, pidx, np);
    }
    for (int s = 0; s < ns; s++) { /* each state is this rank's shard */
        const Node *nd = &g->nodes[sidx[s]];
        int k = (int)ir_attr_i(nd, "bucket", -1);
        if (k < 0) continue;
        int64_t want = B[k].n / ir_group_size(e->m, B[k].def), got = ir_numel(&g->vals[nd->out[0]].t);
        if (got != want)
            ICE("emit: %s: state %s has %lld elements, its shard of bucket %d has %lld", ir_where(nd, w, sizeof w),
                ir_attr_s(nd, "name", ""), (long long)got, k, (long long)want);
    }
    check_param_storage(e, B, nb, pidx, np);
    *out = B;
    return nb;
}

/* The rt_bucket array; a pointer to it. */
static LLVMValueRef bucket_table(Em *e, const Bucket *B, int nb) {
    LLVMValueRef *ent = xcalloc((size_t)nb, sizeof(LLVMValueRef));
    for (int k = 0; k < nb; k++) {
        LLVMValueRef *pv = xcalloc((size_t)B[k].nmembers, sizeof(LLVMValueRef));
        LLVMValueRef *ov = xcalloc((size_t)B[k].nmembers, sizeof(LLVMValueRef));
        for (int j = 0; j < B[k].nmembers; j++) {
            pv[j] = I32(e, B[k].param[j]);
            ov[j] = I64(e, B[k].offset[j]);
        }
        LLVMValueRef f[] = {I32(e, B[k].mask), I64(e, B[k].n), I32(e, B[k].nmembers),
                            const_array(e, e->ti32, pv, B[k].nmembers, "kiln_bucket_params"),
                            const_array(e, e->ti64, ov, B[k].nmembers, "kiln_bucket_offsets")};
        ent[k] = LLVMConstNamedStruct(e->tbucket, f, 5);
        free(pv);
        free(ov);
    }
    LLVMValueRef r = const_array(e, e->tbucket, ent, nb, "kiln_buckets");
    free(ent);
    return r;
}

/* ---- the learning-rate schedule ---- */

static const char *const sched_keys[4] = {"lr", "min_lr", "warmup", "total"}; /* rt_schedule's fields, in order */

/* The program's one schedule: every lr_cosine node must carry the same
 * attributes (numerically; the table has room for one schedule), which
 * become the initial values of kiln_schedule, a mutable rt_schedule of this
 * module (internal: the table points to it, nothing links against it). */
static void collect_schedule(Em *e) {
    char w[160], w2[160];
    for (int i = 0; i < e->g->nnodes; i++) {
        const Node *n = &e->g->nodes[i];
        if (n->op != OP_lr_cosine) continue;
        if (!e->sched) {
            e->sched = n;
            continue;
        }
        for (int k = 0; k < 4; k++)
            if (ir_attr_f(n, sched_keys[k], 0) != ir_attr_f(e->sched, sched_keys[k], 0))
                ICE("emit: %s: lr_cosine with %s=%g, but the one at %s has %s=%g (a program has one learning-rate schedule)",
                    ir_where(n, w, sizeof w), sched_keys[k], ir_attr_f(n, sched_keys[k], 0), ir_where(e->sched, w2, sizeof w2),
                    sched_keys[k], ir_attr_f(e->sched, sched_keys[k], 0));
    }
    if (!e->sched) return;
    LLVMValueRef v[4];
    for (int k = 0; k < 4; k++) v[k] = LLVMConstReal(e->tf64, ir_attr_f(e->sched, sched_keys[k], 0));
    e->schedule = LLVMAddGlobal(e->mod, e->tschedule, "kiln_schedule");
    LLVMSetInitializer(e->schedule, LLVMConstNamedStruct(e->tschedule, v, 4));
    LLVMSetLinkage(e->schedule, LLVMInternalLinkage);
}

/* ---- CUDA: the embedded cubins and the generated kernels' names ---- */

/* The rt_cubin array of the target's cubins (their bytes private constants). */
static LLVMValueRef cubin_table(Em *e) {
    int n = e->cuda ? e->tgt->ncubins : 0;
    LLVMValueRef *ent = xcalloc((size_t)n, sizeof(LLVMValueRef));
    for (int k = 0; k < n; k++) {
        const EmitCubin *cb = &e->tgt->cubins[k];
        LLVMValueRef init = LLVMConstStringInContext(e->c, (const char *)cb->data, (unsigned)cb->size, 1);
        LLVMValueRef gv = LLVMAddGlobal(e->mod, LLVMTypeOf(init), "kiln_cubin");
        LLVMSetInitializer(gv, init);
        LLVMSetGlobalConstant(gv, 1);
        LLVMSetLinkage(gv, LLVMPrivateLinkage);
        LLVMSetAlignment(gv, 16);
        LLVMValueRef zero[2] = {I32(e, 0), I32(e, 0)};
        LLVMValueRef f[] = {cstr(e, cb->name), LLVMConstInBoundsGEP2(LLVMTypeOf(init), gv, zero, 2), I64(e, (int64_t)cb->size)};
        ent[k] = LLVMConstNamedStruct(e->tcubin, f, 3);
    }
    LLVMValueRef r = const_array(e, e->tcubin, ent, n, "kiln_cubins");
    free(ent);
    return r;
}

/* The generated kernels' names, "kiln_" + the first group's name of each
 * key, in group order: emit_cuda.c writes the same kernels in this order. */
static LLVMValueRef kernel_names(Em *e) {
    LLVMValueRef *ent = xcalloc((size_t)e->kg.ngroups, sizeof(LLVMValueRef));
    int n = 0;
    for (int k = 0; k < e->kg.ngroups; k++) {
        if (!e->cuda || e->kg.groups[k].first != k) continue;
        char name[64];
        if (e->m->nstages > 1) snprintf(name, sizeof name, "kiln_s%d_%s", e->stage, e->kg.groups[k].name);
        else snprintf(name, sizeof name, "kiln_%s", e->kg.groups[k].name);
        ent[n++] = cstr(e, name);
    }
    if (n != e->nkernels) ICE("emit: %d generated kernel names for %d kernels", n, e->nkernels);
    LLVMValueRef r = const_array(e, e->tp8, ent, n, "kiln_kernels");
    free(ent);
    return r;
}

/* CUDA: number the generated kernels (one per key) for rtk_fused. */
static void number_kernels(Em *e) {
    e->kindex = xcalloc((size_t)e->kg.ngroups, sizeof(int));
    for (int k = 0; k < e->kg.ngroups; k++)
        if (e->kg.groups[k].first == k) e->kindex[k] = e->nkernels++;
}

static void emit_table(Em *e) {
    const Graph *g = e->g;
    int64_t space[RT_NSPACES] = {0}; /* the runtime's spaces */
    for (int i = 0; i < g->nvals; i++) {
        const Value *v = &g->vals[i];
        int rs = rt_space_of(v->space);
        if (rs < 0) continue;
        int64_t end = v->offset + ir_value_bytes(v);
        if (end > space[rs]) space[rs] = end;
    }
    LLVMValueRef sb[RT_NSPACES];
    for (int s = 0; s < RT_NSPACES; s++) sb[s] = I64(e, (space[s] + 63) / 64 * 64);
    int nstreams = 1, nevents = 0, steps = e->sched ? (int)ir_attr_f(e->sched, "total", 0) : 0;
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        if (n->stream + 1 > nstreams) nstreams = n->stream + 1;
        if (ir_ops[n->op].flags & F_SYNC && ir_attr_i(n, "event", -1) + 1 > nevents) nevents = (int)ir_attr_i(n, "event", -1) + 1;
    }
    nevents += e->nevents_extra; /* recv_fences' */
    static const Op kinds[4] = {OP_param, OP_state, OP_input, OP_output};
    static const char *const syms[4] = {"kiln_params", "kiln_states", "kiln_inputs", "kiln_outputs"};
    int *idx[4], cnt[4];
    LLVMValueRef tab[4];
    for (int k = 0; k < 4; k++) {
        idx[k] = xcalloc((size_t)g->nnodes, sizeof(int));
        cnt[k] = table_nodes(e, kinds[k], idx[k]);
    }
    Bucket *B = NULL;
    int nb = collect_buckets(e, idx[1], cnt[1], idx[0], cnt[0], &B);
    for (int k = 0; k < 4; k++) tab[k] = tensor_table(e, idx[k], cnt[k], syms[k]);
    LLVMValueRef mesh[4];
    for (int a = 0; a < 4; a++) mesh[a] = I32(e, e->m->mesh[a]);
    LLVMValueRef f[] = {I32(e, RT_ABI_VERSION), cstr(e, e->m->name), LLVMConstArray(e->ti64, sb, RT_NSPACES),
                        I32(e, cnt[0]), I32(e, cnt[1]), I32(e, cnt[2]), I32(e, cnt[3]), tab[0], tab[1], tab[2], tab[3],
                        I32(e, nstreams), I32(e, nevents), I32(e, steps), LLVMConstReal(e->tf64, e->flops),
                        LLVMConstReal(e->tf64, e->hw_flops), e->step,
                        LLVMConstArray(e->ti32, mesh, 4), I32(e, nb), bucket_table(e, B, nb),
                        e->schedule ? e->schedule : LLVMConstNull(LLVMPointerType(e->tschedule, 0)), I32(e, cp_contiguous(e)),
                        I32(e, e->cuda ? RT_DEV_CUDA : RT_DEV_CPU), cstr(e, e->cuda ? e->tgt->arch : NULL),
                        I32(e, e->cuda ? e->tgt->ncubins : 0), cubin_table(e), I32(e, e->nkernels), kernel_names(e),
                        I64(e, e->scratch), cstr(e, e->m->sets), I32(e, e->stage), I32(e, e->m->nstages),
                        LLVMConstBitCast(e->stages_gv, LLVMPointerType(LLVMPointerType(e->tprogram, 0), 0))};
    char sym[32];
    snprintf(sym, sizeof sym, e->stage ? "kiln_program_s%d" : "kiln_program", e->stage);
    LLVMValueRef gv = LLVMAddGlobal(e->mod, e->tprogram, sym);
    LLVMSetInitializer(gv, LLVMConstNamedStruct(e->tprogram, f, 33));
    LLVMSetGlobalConstant(gv, 1);
    if (e->stage) LLVMSetLinkage(gv, LLVMPrivateLinkage);
    e->table = gv;
    for (int k = 0; k < nb; k++) free(B[k].param);
    free(B);
    for (int k = 0; k < 4; k++) free(idx[k]);
}


/* ---- the host program ---- */

/* emit_priv.h: the order, the groups, the schedule, the device's kernels
 * (the CPU's from emit_llvm.c; CUDA's only numbered here, emit_cuda.c
 * writes them), then the step that launches them and the table. */
void em_host_program(Em *e) {
    program_order(e);
    kg_collect(&e->kg, e->g, e->order, e->norder);
    collect_schedule(e);
    if (e->cuda) number_kernels(e);
    else em_cpu_kernels(e);
    emit_step(e);
    emit_table(e);
}
