/* emit_llvm.c — the LLVM plumbing of the back end, and the CPU's kernels.
 *
 * The host program (kiln_step, kiln_program, kiln_schedule) is emit_host.c's
 * and the same for every device; emit_priv.h says who does what.  This file
 * makes the module it is built into: the context, the target machine, the
 * runtime ABI's LLVM types (init_types: rt_kernel, rt_launch, rt_tensor,
 * rt_program ..., field for field as kiln_rt.h, which check_layout verifies
 * against the C layout on the target) and the runtime's entry points.  Then
 * it turns the built module into what was asked for: a JIT, an object file
 * or text.
 *
 * The CPU's kernel emitter (em_cpu_kernels):
 *
 *   kiln_fused_K   the kernel of group K (an rt_kernel): args are the group's
 *                  input pointers, its output pointers and the element count.
 *                  It hands the whole range to rt_parallel_for with `args`
 *                  itself as the data (the runtime's queue copy of the array
 *                  lives until the kernel returns).  The body loads the
 *                  pointers and calls an always-inlined loop function whose
 *                  pointer parameters are `noalias` when the memory plan
 *                  proves the buffers disjoint, so the vectorizer needs no
 *                  run-time overlap checks.  The loop computes the whole
 *                  chain in registers, element by element, in f32.  A
 *                  broadcast member reads its outside input at the index the
 *                  numpy rule gives; to keep div/mod out of the inner loop the
 *                  space is walked in rows along which every broadcast reads
 *                  contiguously or one element (group_row), with the source
 *                  indices computed once per row.  Groups that compute the
 *                  same thing (the same chain in every layer) share one
 *                  kernel (the group key); each keeps its own trace name.
 *                  Which nodes form a group, its inputs, outputs, shape and
 *                  key come from kgroup.c, shared with the CUDA back end.
 *
 * Transcendentals.  llvm.exp.f32 on x86 becomes a call to expf per element
 * even inside a vector loop, so exp (and tanh, gelu, silu built on it) use
 * kiln_expf, a Cephes-style polynomial written here in IR (range reduction
 * by ln 2, degree-5 polynomial, 2^n from the exponent bits in two halves so
 * that denormal results and overflow come out right, NaN passed through):
 * about 1 ulp and it vectorizes.  tanh is Cephes tanhf on top of it (an odd
 * polynomial below 0.625, 1 - 2/(e^2|x|+1) above).  log, sqrt and pow are
 * the intrinsics (sqrt is an instruction; log and pow, a libm call per
 * element, are rare in fused chains).
 *
 * The module is verified (LLVMVerifyModule), optimized with "default<O3>"
 * for the host CPU (or a named one, for golden tests), then either JIT'd by
 * ORC LLJIT with a generator that resolves rt_* and rtk_* from the process,
 * written as an object file, or printed.  An op this file cannot emit is an
 * internal error naming it; LLVM failures come back as messages.
 */
#include <llvm-c/Analysis.h>
#include <llvm-c/Core.h>
#include <llvm-c/Error.h>
#include <llvm-c/LLJIT.h>
#include <llvm-c/Orc.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>
#include <llvm-c/Transforms/PassBuilder.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "emit_priv.h"
#include "kiln_rt.h"

/* ---- LLVM helpers ---- */

static LLVMValueRef intrinsic(Em *e, const char *name, LLVMTypeRef *fty) {
    unsigned id = LLVMLookupIntrinsicID(name, strlen(name));
    if (!id) ICE("emit: no intrinsic %s", name);
    LLVMTypeRef t = e->tf32;
    *fty = LLVMIntrinsicGetType(e->c, id, &t, 1);
    return LLVMGetIntrinsicDeclaration(e->mod, id, &t, 1);
}

static LLVMValueRef call1(Em *e, const char *intr, LLVMValueRef x) {
    LLVMTypeRef fty;
    LLVMValueRef fn = intrinsic(e, intr, &fty);
    return LLVMBuildCall2(e->b, fty, fn, &x, 1, "");
}

static LLVMValueRef call2(Em *e, const char *intr, LLVMValueRef x, LLVMValueRef y) {
    LLVMTypeRef fty;
    LLVMValueRef fn = intrinsic(e, intr, &fty), a[2] = {x, y};
    return LLVMBuildCall2(e->b, fty, fn, a, 2, "");
}

/* ---- the runtime ABI in LLVM ---- */

static void init_types(Em *e) {
    LLVMContextRef c = e->c;
    e->tvoid = LLVMVoidTypeInContext(c);
    e->ti8 = LLVMInt8TypeInContext(c);
    e->ti32 = LLVMInt32TypeInContext(c);
    e->ti64 = LLVMInt64TypeInContext(c);
    e->tf32 = LLVMFloatTypeInContext(c);
    e->tf64 = LLVMDoubleTypeInContext(c);
    e->tp8 = LLVMPointerType(e->ti8, 0);
    e->tpp8 = LLVMPointerType(e->tp8, 0);
    e->tp64 = LLVMPointerType(e->ti64, 0);
    /* void kernel(rt_ctx *, const int64_t *) */
    e->tkernel = LLVMFunctionType(e->tvoid, (LLVMTypeRef[]){e->tp8, e->tp64}, 2, 0);
    /* void body(void *data, int64_t i0, int64_t i1) */
    e->tbody = LLVMFunctionType(e->tvoid, (LLVMTypeRef[]){e->tp8, e->ti64, e->ti64}, 3, 0);
    /* void step(rt_ctx *, char *const *spaces) */
    e->tstep = LLVMFunctionType(e->tvoid, (LLVMTypeRef[]){e->tp8, e->tpp8}, 2, 0);
    /* void rt_launch(rt_ctx *, int stream, rt_kernel, const int64_t *args, int nargs, const char *name) */
    e->tlaunch = LLVMFunctionType(
        e->tvoid, (LLVMTypeRef[]){e->tp8, e->ti32, LLVMPointerType(e->tkernel, 0), e->tp64, e->ti32, e->tp8}, 6, 0);
    /* void rt_record/rt_wait(rt_ctx *, int stream, int event) */
    e->tevent = LLVMFunctionType(e->tvoid, (LLVMTypeRef[]){e->tp8, e->ti32, e->ti32}, 3, 0);
    /* void rt_parallel_for(rt_ctx *, int64_t n, body, void *data) */
    e->tpfor = LLVMFunctionType(e->tvoid, (LLVMTypeRef[]){e->tp8, e->ti64, LLVMPointerType(e->tbody, 0), e->tp8}, 4, 0);
    /* rt_tensor, rt_bucket and rt_program, field for field as in kiln_rt.h
     * (the C layout is LLVM's natural one for these element types on x86-64;
     * check_layout makes sure) */
    e->ttensor = LLVMStructCreateNamed(c, "rt_tensor");
    LLVMTypeRef tf[] = {e->tp8, e->ti32, e->ti64, e->ti32, e->ti32, LLVMArrayType(e->ti64, 5), e->tp8, e->tf64,
                        e->ti32 /* bucket */, e->tp8 /* prefix */, e->ti32 /* tp_split */, e->ti32 /* tp_blocks */};
    LLVMStructSetBody(e->ttensor, tf, 12, 0);
    LLVMTypeRef tpt = LLVMPointerType(e->ttensor, 0);
    /* rt_bucket: group, n, nmembers, param, offset */
    e->tbucket = LLVMStructCreateNamed(c, "rt_bucket");
    LLVMTypeRef bf[] = {e->ti32, e->ti64, e->ti32, LLVMPointerType(e->ti32, 0), e->tp64};
    LLVMStructSetBody(e->tbucket, bf, 5, 0);
    /* rt_schedule: lr, min_lr, warmup, total */
    e->tschedule = LLVMStructCreateNamed(c, "rt_schedule");
    LLVMTypeRef sf[] = {e->tf64, e->tf64, e->tf64, e->tf64};
    LLVMStructSetBody(e->tschedule, sf, 4, 0);
    /* rt_cubin: name, data, size */
    e->tcubin = LLVMStructCreateNamed(c, "rt_cubin");
    LLVMTypeRef cf[] = {e->tp8, e->tp8, e->ti64};
    LLVMStructSetBody(e->tcubin, cf, 3, 0);
    e->tprogram = LLVMStructCreateNamed(c, "rt_program");
    LLVMTypeRef pf[] = {e->ti32, e->tp8, LLVMArrayType(e->ti64, RT_NSPACES), e->ti32, e->ti32, e->ti32, e->ti32,
                        tpt, tpt, tpt, tpt, e->ti32, e->ti32, e->ti32, e->tf64, e->tf64 /* hw_flops */,
                        LLVMPointerType(e->tstep, 0),
                        LLVMArrayType(e->ti32, 4) /* mesh */, e->ti32 /* nbuckets */, LLVMPointerType(e->tbucket, 0),
                        LLVMPointerType(e->tschedule, 0) /* schedule */, e->ti32 /* cp_contiguous */,
                        e->ti32 /* device */, e->tp8 /* arch */, e->ti32 /* ncubins */, LLVMPointerType(e->tcubin, 0),
                        e->ti32 /* nkernels */, e->tpp8 /* kernels */, e->ti64 /* scratch_bytes */, e->tp8 /* sets */,
                        e->ti32 /* stage */, e->ti32 /* nstages */,
                        LLVMPointerType(LLVMPointerType(e->tprogram, 0), 0) /* stages */};
    LLVMStructSetBody(e->tprogram, pf, 33, 0);
}

/* The table's LLVM types must lay out exactly as kiln_rt.h's C structs (the
 * JIT hands kiln_program to C code; a trainer links the object file): every
 * field's offset and each struct's size, as this target's data layout puts
 * them, against the compiler's. */
static void check_struct(LLVMTargetDataRef dl, LLVMTypeRef t, const char *name, const size_t *off, unsigned n, size_t size) {
    if (LLVMCountStructElementTypes(t) != n) ICE("emit: %s has %u fields in LLVM, %u in kiln_rt.h", name, LLVMCountStructElementTypes(t), n);
    for (unsigned i = 0; i < n; i++)
        if (LLVMOffsetOfElement(dl, t, i) != off[i])
            ICE("emit: %s field %u at byte %llu in LLVM, %zu in kiln_rt.h", name, i, LLVMOffsetOfElement(dl, t, i), off[i]);
    if (LLVMABISizeOfType(dl, t) != size)
        ICE("emit: %s is %llu bytes in LLVM, %zu in kiln_rt.h", name, LLVMABISizeOfType(dl, t), size);
}

static void check_layout(Em *e, LLVMTargetDataRef dl) {
#define O(T, f) offsetof(T, f)
    static const size_t tensor[] = {O(rt_tensor, name), O(rt_tensor, space), O(rt_tensor, offset), O(rt_tensor, dtype),
                                    O(rt_tensor, rank), O(rt_tensor, dim), O(rt_tensor, init), O(rt_tensor, std),
                                    O(rt_tensor, bucket), O(rt_tensor, prefix), O(rt_tensor, tp_split), O(rt_tensor, tp_blocks)};
    static const size_t bucket[] = {O(rt_bucket, group), O(rt_bucket, n), O(rt_bucket, nmembers), O(rt_bucket, param),
                                    O(rt_bucket, offset)};
    static const size_t program[] = {O(rt_program, abi_version), O(rt_program, model), O(rt_program, space_bytes),
                                     O(rt_program, nparams), O(rt_program, nstates), O(rt_program, ninputs),
                                     O(rt_program, noutputs), O(rt_program, params), O(rt_program, states),
                                     O(rt_program, inputs), O(rt_program, outputs), O(rt_program, nstreams),
                                     O(rt_program, nevents), O(rt_program, steps), O(rt_program, flops),
                                     O(rt_program, hw_flops), O(rt_program, step),
                                     O(rt_program, mesh), O(rt_program, nbuckets), O(rt_program, buckets),
                                     O(rt_program, schedule), O(rt_program, cp_contiguous), O(rt_program, device),
                                     O(rt_program, arch), O(rt_program, ncubins), O(rt_program, cubins),
                                     O(rt_program, nkernels), O(rt_program, kernels), O(rt_program, scratch_bytes),
                                     O(rt_program, sets), O(rt_program, stage), O(rt_program, nstages),
                                     O(rt_program, stages)};
    static const size_t cubin[] = {O(rt_cubin, name), O(rt_cubin, data), O(rt_cubin, size)};
    static const size_t schedule[] = {O(rt_schedule, lr), O(rt_schedule, min_lr), O(rt_schedule, warmup), O(rt_schedule, total)};
#undef O
    check_struct(dl, e->ttensor, "rt_tensor", tensor, sizeof tensor / sizeof *tensor, sizeof(rt_tensor));
    check_struct(dl, e->tbucket, "rt_bucket", bucket, sizeof bucket / sizeof *bucket, sizeof(rt_bucket));
    check_struct(dl, e->tschedule, "rt_schedule", schedule, sizeof schedule / sizeof *schedule, sizeof(rt_schedule));
    check_struct(dl, e->tcubin, "rt_cubin", cubin, sizeof cubin / sizeof *cubin, sizeof(rt_cubin));
    check_struct(dl, e->tprogram, "rt_program", program, sizeof program / sizeof *program, sizeof(rt_program));
}

static void declare_runtime(Em *e) {
    e->rt_launch = add_fn(e, "rt_launch", e->tlaunch, 0);
    e->rt_record = add_fn(e, "rt_record", e->tevent, 0);
    e->rt_wait = add_fn(e, "rt_wait", e->tevent, 0);
    e->rt_parallel_for = add_fn(e, "rt_parallel_for", e->tpfor, 0);
}

/* ---- math in registers (f32) ---- */

/* An inlined float(float) function named name, the builder at its entry. */
static LLVMValueRef math_fn(Em *e, const char *name) {
    LLVMValueRef fn = add_fn(e, name, LLVMFunctionType(e->tf32, &e->tf32, 1, 0), 1);
    add_fn_attr(e, fn, LLVMAttributeFunctionIndex, "alwaysinline");
    LLVMPositionBuilderAtEnd(e->b, LLVMAppendBasicBlockInContext(e->c, fn, "entry"));
    return fn;
}

/* float kiln_expf(float): see the essay. */
static LLVMValueRef build_expf(Em *e) {
    LLVMValueRef fn = math_fn(e, "kiln_expf");
    LLVMBuilderRef b = e->b;
    LLVMValueRef x = LLVMGetParam(fn, 0);
    LLVMValueRef nan = LLVMBuildFCmp(b, LLVMRealUNO, x, x, "");
    LLVMValueRef xc = LLVMBuildSelect(b, nan, F32(e, 0), x, "");
    xc = LLVMBuildSelect(b, LLVMBuildFCmp(b, LLVMRealOLT, xc, F32(e, -104), ""), F32(e, -104), xc, "");
    xc = LLVMBuildSelect(b, LLVMBuildFCmp(b, LLVMRealOGT, xc, F32(e, 89), ""), F32(e, 89), xc, "");
    LLVMValueRef fx = LLVMBuildFAdd(b, LLVMBuildFMul(b, xc, F32(e, 1.44269504088896341), ""), F32(e, 0.5), "");
    fx = call1(e, "llvm.floor", fx);
    LLVMValueRef r = LLVMBuildFSub(b, xc, LLVMBuildFMul(b, fx, F32(e, 0.693359375), ""), "");
    r = LLVMBuildFSub(b, r, LLVMBuildFMul(b, fx, F32(e, -2.12194440e-4), ""), "");
    static const double P[] = {1.9875691500E-4, 1.3981999507E-3, 8.3334519073E-3,
                               4.1665795894E-2, 1.6666665459E-1, 5.0000001201E-1};
    LLVMValueRef y = F32(e, P[0]);
    for (int i = 1; i < 6; i++) y = LLVMBuildFAdd(b, LLVMBuildFMul(b, y, r, ""), F32(e, P[i]), "");
    y = LLVMBuildFMul(b, y, LLVMBuildFMul(b, r, r, ""), "");
    y = LLVMBuildFAdd(b, LLVMBuildFAdd(b, y, r, ""), F32(e, 1), "");
    /* 2^n as 2^n1 * 2^n2, n1 = n >> 1: both halves are normal floats */
    LLVMValueRef n = LLVMBuildFPToSI(b, fx, e->ti32, "");
    LLVMValueRef n1 = LLVMBuildAShr(b, n, I32(e, 1), ""), n2 = LLVMBuildSub(b, n, n1, "");
    LLVMValueRef s1 = LLVMBuildBitCast(b, LLVMBuildShl(b, LLVMBuildAdd(b, n1, I32(e, 127), ""), I32(e, 23), ""), e->tf32, "");
    LLVMValueRef s2 = LLVMBuildBitCast(b, LLVMBuildShl(b, LLVMBuildAdd(b, n2, I32(e, 127), ""), I32(e, 23), ""), e->tf32, "");
    y = LLVMBuildFMul(b, LLVMBuildFMul(b, y, s1, ""), s2, "");
    LLVMBuildRet(b, LLVMBuildSelect(b, nan, x, y, ""));
    return fn;
}

/* float kiln_tanhf(float): Cephes tanhf on kiln_expf. */
static LLVMValueRef build_tanhf(Em *e) {
    LLVMValueRef fn = math_fn(e, "kiln_tanhf");
    LLVMBuilderRef b = e->b;
    LLVMValueRef x = LLVMGetParam(fn, 0), ax = call1(e, "llvm.fabs", x);
    /* small: x + x^3 P(x^2) */
    static const double P[] = {-5.70498872745E-3, 2.06390887954E-2, -5.37397155531E-2, 1.33314422036E-1, -3.33332819422E-1};
    LLVMValueRef z = LLVMBuildFMul(b, x, x, ""), p = F32(e, P[0]);
    for (int i = 1; i < 5; i++) p = LLVMBuildFAdd(b, LLVMBuildFMul(b, p, z, ""), F32(e, P[i]), "");
    p = LLVMBuildFAdd(b, LLVMBuildFMul(b, LLVMBuildFMul(b, p, z, ""), x, ""), x, "");
    /* large: sign(x) (1 - 2/(e^2|x| + 1)) */
    LLVMValueRef ex = LLVMBuildCall2(b, LLVMGlobalGetValueType(e->expf_), e->expf_, (LLVMValueRef[]){LLVMBuildFMul(b, ax, F32(e, 2), "")}, 1, "");
    LLVMValueRef t = LLVMBuildFSub(b, F32(e, 1), LLVMBuildFDiv(b, F32(e, 2), LLVMBuildFAdd(b, ex, F32(e, 1), ""), ""), "");
    t = call2(e, "llvm.copysign", t, x);
    LLVMBuildRet(b, LLVMBuildSelect(b, LLVMBuildFCmp(b, LLVMRealOLT, ax, F32(e, 0.625), ""), p, t, ""));
    return fn;
}

static LLVMValueRef vexp(Em *e, LLVMValueRef x) {
    return LLVMBuildCall2(e->b, LLVMGlobalGetValueType(e->expf_), e->expf_, &x, 1, "");
}
static LLVMValueRef vtanh(Em *e, LLVMValueRef x) {
    return LLVMBuildCall2(e->b, LLVMGlobalGetValueType(e->tanhf_), e->tanhf_, &x, 1, "");
}
static LLVMValueRef vsigmoid(Em *e, LLVMValueRef x) { /* 1 / (1 + e^-x) */
    LLVMBuilderRef b = e->b;
    return LLVMBuildFDiv(b, F32(e, 1), LLVMBuildFAdd(b, F32(e, 1), vexp(e, LLVMBuildFNeg(b, x, "")), ""), "");
}

static const double GELU_K = 0.7978845608028654; /* sqrt(2/pi) */

/* th = tanh(k (x + 0.044715 x^3)) */
static LLVMValueRef gelu_th(Em *e, LLVMValueRef x) {
    LLVMBuilderRef b = e->b;
    LLVMValueRef x3 = LLVMBuildFMul(b, LLVMBuildFMul(b, x, x, ""), x, "");
    LLVMValueRef u = LLVMBuildFAdd(b, x, LLVMBuildFMul(b, F32(e, 0.044715), x3, ""), "");
    return vtanh(e, LLVMBuildFMul(b, F32(e, GELU_K), u, ""));
}

/* ---- fused groups ---- */

static LLVMTypeRef elem_type(Em *e, DType dt, const Node *n) {
    char w[160];
    switch (dt) {
    case DT_F32: return e->tf32;
    case DT_I32: return e->ti32;
    case DT_I64: return e->ti64;
    default: ICE("emit: %s: %s values are not supported on the CPU (f32, i32, i64)", ir_where(n, w, sizeof w), ir_dtype_names[dt]);
    }
}

static LLVMValueRef cast(Em *e, LLVMValueRef x, DType from, DType to, const Node *n) {
    LLVMTypeRef t = elem_type(e, to, n);
    elem_type(e, from, n);
    int ff = ir_dtype_is_float(from), tf = ir_dtype_is_float(to);
    if (from == to) return x;
    if (ff && !tf) return LLVMBuildFPToSI(e->b, x, t, "");
    if (!ff && tf) return LLVMBuildSIToFP(e->b, x, t, "");
    return LLVMBuildIntCast2(e->b, x, t, 1, ""); /* i32 <-> i64 */
}

/* issue 17's ops: the same formulas as interp.c, NaN included (minimum and
 * maximum return a NaN a, else b: NaN when b is) */
static LLVMValueRef ew_op17(Em *e, const Node *n, LLVMValueRef a, LLVMValueRef b_, LLVMValueRef c) {
    LLVMBuilderRef b = e->b;
    LLVMValueRef zero = F32(e, 0);
    switch (n->op) {
    case OP_sigmoid: return vsigmoid(e, a);
    case OP_abs: return call1(e, "llvm.fabs", a);
    case OP_pow: return call2(e, "llvm.pow", a, F32(e, ir_attr_f(n, "p", 1)));
    case OP_minimum: case OP_maximum: { /* a if a is NaN or wins, else b */
        LLVMValueRef wins = LLVMBuildFCmp(b, n->op == OP_minimum ? LLVMRealOLT : LLVMRealOGT, a, b_, "");
        return LLVMBuildSelect(b, LLVMBuildOr(b, LLVMBuildFCmp(b, LLVMRealUNO, a, a, ""), wins, ""), a, b_, "");
    }
    case OP_where: return LLVMBuildSelect(b, LLVMBuildFCmp(b, LLVMRealUNE, a, zero, ""), b_, c, "");
    case OP_abs_bwd: /* (dy, x): dy sign(x) */
        return LLVMBuildSelect(b, LLVMBuildFCmp(b, LLVMRealOGT, b_, zero, ""), a,
                               LLVMBuildSelect(b, LLVMBuildFCmp(b, LLVMRealOLT, b_, zero, ""), LLVMBuildFNeg(b, a, ""), zero, ""), "");
    case OP_minimum_bwd: case OP_maximum_bwd: { /* (dy, x, y): dy where x wins, dy/2 on a tie */
        LLVMRealPredicate wins = n->op == OP_minimum_bwd ? LLVMRealOLT : LLVMRealOGT;
        LLVMValueRef tie = LLVMBuildSelect(b, LLVMBuildFCmp(b, LLVMRealOEQ, b_, c, ""), LLVMBuildFMul(b, a, F32(e, 0.5), ""), zero, "");
        return LLVMBuildSelect(b, LLVMBuildFCmp(b, wins, b_, c, ""), a, tie, "");
    }
    default: return NULL;
    }
}

/* One elementwise op on registers a (and b, c). */
static LLVMValueRef ew_op(Em *e, const Node *n, LLVMValueRef a, LLVMValueRef b_, LLVMValueRef c) {
    LLVMBuilderRef b = e->b;
    char w[160];
    switch (n->op) {
    case OP_add: return LLVMBuildFAdd(b, a, b_, "");
    case OP_sub: return LLVMBuildFSub(b, a, b_, "");
    case OP_mul: return LLVMBuildFMul(b, a, b_, "");
    case OP_div: return LLVMBuildFDiv(b, a, b_, "");
    case OP_neg: return LLVMBuildFNeg(b, a, "");
    case OP_exp: return vexp(e, a);
    case OP_log: return call1(e, "llvm.log", a);
    case OP_sqrt: return call1(e, "llvm.sqrt", a);
    case OP_rsqrt: return LLVMBuildFDiv(b, F32(e, 1), call1(e, "llvm.sqrt", a), "");
    case OP_tanh: return vtanh(e, a);
    case OP_gelu: { /* 0.5 x (1 + th) */
        LLVMValueRef th = gelu_th(e, a);
        return LLVMBuildFMul(b, LLVMBuildFMul(b, F32(e, 0.5), a, ""), LLVMBuildFAdd(b, F32(e, 1), th, ""), "");
    }
    case OP_silu: return LLVMBuildFMul(b, a, vsigmoid(e, a), "");
    case OP_relu: return LLVMBuildSelect(b, LLVMBuildFCmp(b, LLVMRealOGT, a, F32(e, 0), ""), a, F32(e, 0), "");
    case OP_gelu_bwd: { /* dy (0.5 (1+th) + 0.5 x (1-th^2) k (1 + 3*0.044715 x^2)) */
        LLVMValueRef x = b_, th = gelu_th(e, x);
        LLVMValueRef t1 = LLVMBuildFMul(b, F32(e, 0.5), LLVMBuildFAdd(b, F32(e, 1), th, ""), "");
        LLVMValueRef sech2 = LLVMBuildFSub(b, F32(e, 1), LLVMBuildFMul(b, th, th, ""), "");
        LLVMValueRef poly = LLVMBuildFAdd(b, F32(e, 1), LLVMBuildFMul(b, F32(e, 3 * 0.044715), LLVMBuildFMul(b, x, x, ""), ""), "");
        LLVMValueRef t2 = LLVMBuildFMul(b, LLVMBuildFMul(b, F32(e, 0.5), x, ""), sech2, "");
        t2 = LLVMBuildFMul(b, LLVMBuildFMul(b, t2, F32(e, GELU_K), ""), poly, "");
        return LLVMBuildFMul(b, a, LLVMBuildFAdd(b, t1, t2, ""), "");
    }
    case OP_silu_bwd: { /* dy s (1 + x (1 - s)) */
        LLVMValueRef x = b_, s = vsigmoid(e, x);
        LLVMValueRef t = LLVMBuildFAdd(b, F32(e, 1), LLVMBuildFMul(b, x, LLVMBuildFSub(b, F32(e, 1), s, ""), ""), "");
        return LLVMBuildFMul(b, LLVMBuildFMul(b, a, s, ""), t, "");
    }
    case OP_relu_bwd: return LLVMBuildSelect(b, LLVMBuildFCmp(b, LLVMRealOGT, b_, F32(e, 0), ""), a, F32(e, 0), "");
    default: break;
    }
    LLVMValueRef r = ew_op17(e, n, a, b_, c);
    if (!r) ICE("emit: %s: %s is not an elementwise op this back end knows", ir_where(n, w, sizeof w), ir_ops[n->op].name);
    return r;
}

/* Index into x (broadcast to `big` by the numpy rule) of element i of big:
 * the terms of kg_bcast_terms. */
static LLVMValueRef bcast_index(Em *e, const Type *x, const Type *big, LLVMValueRef i) {
    KgTerm terms[IR_MAXRANK];
    int nt = kg_bcast_terms(x, big, terms);
    LLVMValueRef idx = NULL;
    for (int k = 0; k < nt; k++) {
        LLVMValueRef t = i;
        if (terms[k].inner != 1) t = LLVMBuildUDiv(e->b, t, I64(e, terms[k].inner), "");
        if (terms[k].mod) t = LLVMBuildURem(e->b, t, I64(e, terms[k].len), "");
        if (terms[k].stride != 1) t = LLVMBuildMul(e->b, t, I64(e, terms[k].stride), "");
        idx = idx ? LLVMBuildAdd(e->b, idx, t, "") : t;
    }
    return idx ? idx : I64(e, 0);
}

static LLVMValueRef load_at(Em *e, LLVMValueRef ptr, DType dt, LLVMValueRef idx, const Node *n) {
    LLVMTypeRef t = elem_type(e, dt, n);
    return LLVMBuildLoad2(e->b, t, LLVMBuildInBoundsGEP2(e->b, t, ptr, &idx, 1, ""), "");
}

/* The register of member input k of node n at element i. */
static LLVMValueRef operand(Em *e, KGroup *gr, const Node *n, int k, LLVMValueRef *ptrs, LLVMValueRef i) {
    int vid = n->in[k];
    if (e->reg[vid]) return e->reg[vid];
    int slot = kg_in_slot(gr, vid);
    if (slot < 0) ICE("emit: fused group %d: %%%d has no register", gr->kernel, vid);
    return e->reg[vid] = load_at(e, ptrs[slot], e->g->vals[vid].t.dt, i, n);
}

/* Where the loop is: element i of the iteration space; with rows (see
 * group_row), also the column c in the row and, per member broadcast, the
 * index of its row start in the source. */
typedef struct {
    LLVMValueRef i, c;
    LLVMValueRef *base; /* [member]: NULL without rows */
    const int *contig;  /* [member]: the broadcast's source is contiguous along a row */
} Iter;

/* The chain of a group at one element: registers for every member, stores
 * of its outputs. */
static void group_element(Em *e, KGroup *gr, LLVMValueRef *ptrs, const Iter *it) {
    const Graph *g = e->g;
    LLVMValueRef i = it->i;
    char w[160];
    for (int k = 0; k < gr->nnodes; k++) {
        const Node *n = &g->nodes[gr->nodes[k]];
        const Type *ot = &g->vals[n->out[0]].t;
        LLVMValueRef r;
        if (n->op == OP_const) {
            double v = ir_attr_f(n, "v", 0);
            r = ir_dtype_is_float(ot->dt) ? LLVMConstReal(elem_type(e, ot->dt, n), v)
                                         : LLVMConstInt(elem_type(e, ot->dt, n), (unsigned long long)(int64_t)v, 1);
        } else if (kg_outside_bcast(&e->kg, gr, n)) {
            int vid = n->in[0], slot = kg_in_slot(gr, vid);
            LLVMValueRef idx;
            if (!it->base) idx = bcast_index(e, &g->vals[vid].t, ot, i);
            else idx = it->contig[k] ? LLVMBuildNUWAdd(e->b, it->base[k], it->c, "") : it->base[k];
            r = load_at(e, ptrs[slot], g->vals[vid].t.dt, idx, n);
        } else if (n->op == OP_broadcast) {
            int def = g->vals[n->in[0]].def;
            if (g->nodes[def].op != OP_const)
                ICE("emit: %s: broadcast of a computed group member in group %d", ir_where(n, w, sizeof w), gr->kernel);
            r = e->reg[n->in[0]];
        } else if (n->op == OP_cast) {
            r = cast(e, operand(e, gr, n, 0, ptrs, i), g->vals[n->in[0]].t.dt, ot->dt, n);
        } else {
            if (ot->dt != DT_F32) ICE("emit: %s: %s on %s (the CPU computes f32)", ir_where(n, w, sizeof w), ir_ops[n->op].name, ir_dtype_names[ot->dt]);
            LLVMValueRef a = operand(e, gr, n, 0, ptrs, i), b = n->nin > 1 ? operand(e, gr, n, 1, ptrs, i) : NULL;
            r = ew_op(e, n, a, b, n->nin > 2 ? operand(e, gr, n, 2, ptrs, i) : NULL);
        }
        e->reg[n->out[0]] = r;
        int slot = kg_out_slot(gr, n->out[0]);
        if (slot >= 0) {
            LLVMTypeRef t = elem_type(e, ot->dt, n);
            LLVMBuildStore(e->b, r, LLVMBuildInBoundsGEP2(e->b, t, ptrs[gr->nin + slot], &i, 1, ""));
        }
    }
    for (int k = 0; k < gr->nnodes; k++) /* registers live for one element */
        e->reg[g->nodes[gr->nodes[k]].out[0]] = NULL;
    for (int k = 0; k < gr->nin; k++) e->reg[gr->in[k]] = NULL;
}

/* Rows for broadcasts.  Computing a broadcast's source index per element
 * takes a div/mod per run of dims, which keeps the vectorizer away.  So the
 * iteration space is cut into rows of W elements, W the product of the
 * longest run of trailing dims along which every outside broadcast reads
 * either contiguously (contig[k] = 1: its source index is row base + c) or
 * one element (0: the row base).  Row bases are computed once per row; the
 * loop along a row is plain.  Returns 0 when the group has no outside
 * broadcast (one flat loop). */
static int64_t group_row(Em *e, KGroup *gr, int *contig) {
    const Graph *g = e->g;
    const Type *big = &gr->shape;
    int any = 0, D = big->rank;
    for (int k = 0; k < gr->nnodes; k++) {
        contig[k] = -1;
        any |= kg_outside_bcast(&e->kg, gr, &g->nodes[gr->nodes[k]]);
    }
    if (!any) return 0;
    for (int d = big->rank - 1; d >= 0; d--) {
        int ok = 1;
        for (int k = 0; k < gr->nnodes && ok && big->dim[d] > 1; k++) {
            const Node *n = &g->nodes[gr->nodes[k]];
            if (!kg_outside_bcast(&e->kg, gr, n)) continue;
            const Type *x = &g->vals[n->in[0]].t;
            int xd = d - (big->rank - x->rank), reads = xd >= 0 && x->dim[xd] != 1;
            ok = contig[k] < 0 || contig[k] == reads;
        }
        if (!ok) break;
        for (int k = 0; k < gr->nnodes && big->dim[d] > 1; k++) {
            const Node *n = &g->nodes[gr->nodes[k]];
            if (!kg_outside_bcast(&e->kg, gr, n)) continue;
            const Type *x = &g->vals[n->in[0]].t;
            int xd = d - (big->rank - x->rank);
            contig[k] = xd >= 0 && x->dim[xd] != 1;
        }
        D = d;
    }
    int64_t W = 1;
    for (int d = D; d < big->rank; d++) W *= big->dim[d];
    for (int k = 0; k < gr->nnodes; k++) contig[k] = contig[k] == 1;
    return W;
}

/* for i in [i0, i1): one flat loop */
static void flat_loop(Em *e, KGroup *gr, LLVMValueRef fn, LLVMValueRef *ptrs) {
    LLVMBuilderRef b = e->b;
    LLVMBasicBlockRef entry = LLVMAppendBasicBlockInContext(e->c, fn, "entry");
    LLVMBasicBlockRef loop = LLVMAppendBasicBlockInContext(e->c, fn, "loop");
    LLVMBasicBlockRef done = LLVMAppendBasicBlockInContext(e->c, fn, "done");
    LLVMValueRef i0 = LLVMGetParam(fn, 0), i1 = LLVMGetParam(fn, 1);
    LLVMPositionBuilderAtEnd(b, entry);
    LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntSLT, i0, i1, ""), loop, done);
    LLVMPositionBuilderAtEnd(b, loop);
    LLVMValueRef i = LLVMBuildPhi(b, e->ti64, "i");
    group_element(e, gr, ptrs, &(Iter){.i = i});
    LLVMValueRef next = LLVMBuildNUWAdd(b, i, I64(e, 1), "");
    LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntSLT, next, i1, ""), loop, done);
    LLVMAddIncoming(i, (LLVMValueRef[]){i0, next}, (LLVMBasicBlockRef[]){entry, LLVMGetInsertBlock(b)}, 2);
    LLVMPositionBuilderAtEnd(b, done);
    LLVMBuildRetVoid(b);
}

/* for i in [i0, i1) by rows of W:
 *   row: r = i / W, start = r*W, c0 = i - start, c1 = min(W, c0 + i1 - i), row bases
 *   col: for c in [c0, c1): element start + c */
static void row_loop(Em *e, KGroup *gr, LLVMValueRef fn, LLVMValueRef *ptrs, int64_t W, const int *contig) {
    const Graph *g = e->g;
    LLVMBuilderRef b = e->b;
    LLVMBasicBlockRef entry = LLVMAppendBasicBlockInContext(e->c, fn, "entry");
    LLVMBasicBlockRef row = LLVMAppendBasicBlockInContext(e->c, fn, "row");
    LLVMBasicBlockRef col = LLVMAppendBasicBlockInContext(e->c, fn, "col");
    LLVMBasicBlockRef next_row = LLVMAppendBasicBlockInContext(e->c, fn, "next_row");
    LLVMBasicBlockRef done = LLVMAppendBasicBlockInContext(e->c, fn, "done");
    LLVMValueRef i0 = LLVMGetParam(fn, 0), i1 = LLVMGetParam(fn, 1), w = I64(e, W);
    LLVMPositionBuilderAtEnd(b, entry);
    LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntSLT, i0, i1, ""), row, done);

    LLVMPositionBuilderAtEnd(b, row);
    LLVMValueRef i = LLVMBuildPhi(b, e->ti64, "i");
    LLVMValueRef start = LLVMBuildNUWMul(b, LLVMBuildUDiv(b, i, w, ""), w, "start");
    LLVMValueRef c0 = LLVMBuildNUWSub(b, i, start, "c0");
    LLVMValueRef c1 = LLVMBuildNUWAdd(b, c0, LLVMBuildNUWSub(b, i1, i, ""), "");
    c1 = LLVMBuildSelect(b, LLVMBuildICmp(b, LLVMIntULT, c1, w, ""), c1, w, "c1");
    LLVMValueRef *base = xcalloc((size_t)gr->nnodes, sizeof(LLVMValueRef));
    for (int k = 0; k < gr->nnodes; k++) {
        const Node *n = &g->nodes[gr->nodes[k]];
        if (kg_outside_bcast(&e->kg, gr, n)) base[k] = bcast_index(e, &g->vals[n->in[0]].t, &g->vals[n->out[0]].t, start);
    }
    LLVMBuildBr(b, col);

    LLVMPositionBuilderAtEnd(b, col);
    LLVMValueRef c = LLVMBuildPhi(b, e->ti64, "c");
    group_element(e, gr, ptrs, &(Iter){.i = LLVMBuildNUWAdd(b, start, c, ""), .c = c, .base = base, .contig = contig});
    LLVMValueRef cn = LLVMBuildNUWAdd(b, c, I64(e, 1), "");
    LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntULT, cn, c1, ""), col, next_row);
    LLVMAddIncoming(c, (LLVMValueRef[]){c0, cn}, (LLVMBasicBlockRef[]){row, LLVMGetInsertBlock(b)}, 2);

    LLVMPositionBuilderAtEnd(b, next_row);
    LLVMValueRef in = LLVMBuildNUWAdd(b, start, c1, "");
    LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntSLT, in, i1, ""), row, done);
    LLVMAddIncoming(i, (LLVMValueRef[]){i0, in}, (LLVMBasicBlockRef[]){entry, next_row}, 2);

    LLVMPositionBuilderAtEnd(b, done);
    LLVMBuildRetVoid(b);
    free(base);
}

/* void loop(i64 i0, i64 i1, T *in..., T *out...): elements [i0, i1) */
static LLVMValueRef group_loop(Em *e, KGroup *gr, const char *name) {
    const Graph *g = e->g;
    int np = gr->nin + gr->nout;
    LLVMTypeRef *pt = xcalloc((size_t)np + 2, sizeof(LLVMTypeRef));
    pt[0] = pt[1] = e->ti64;
    for (int k = 0; k < np; k++) {
        int vid = k < gr->nin ? gr->in[k] : gr->out[k - gr->nin];
        pt[2 + k] = LLVMPointerType(elem_type(e, g->vals[vid].t.dt, &g->nodes[gr->nodes[0]]), 0);
    }
    LLVMValueRef fn = add_fn(e, name, LLVMFunctionType(e->tvoid, pt, (unsigned)np + 2, 0), 1);
    free(pt);
    add_fn_attr(e, fn, LLVMAttributeFunctionIndex, "alwaysinline");
    LLVMValueRef *ptrs = xcalloc((size_t)np, sizeof(LLVMValueRef));
    for (int k = 0; k < np; k++) {
        ptrs[k] = LLVMGetParam(fn, (unsigned)k + 2);
        if (gr->noalias) add_fn_attr(e, fn, (LLVMAttributeIndex)k + 3, "noalias");
    }
    int *contig = xcalloc((size_t)gr->nnodes, sizeof(int));
    int64_t W = group_row(e, gr, contig);
    if (W > 0) row_loop(e, gr, fn, ptrs, W, contig);
    else flat_loop(e, gr, fn, ptrs);
    free(contig);
    free(ptrs);
    return fn;
}

/* void body(void *data, i64 i0, i64 i1): data is the kernel's args array. */
static LLVMValueRef group_body(Em *e, KGroup *gr, LLVMValueRef loop, const char *name) {
    LLVMValueRef fn = add_fn(e, name, e->tbody, 1);
    LLVMBuilderRef b = e->b;
    LLVMPositionBuilderAtEnd(b, LLVMAppendBasicBlockInContext(e->c, fn, "entry"));
    int np = gr->nin + gr->nout;
    LLVMValueRef *a = xcalloc((size_t)np + 2, sizeof(LLVMValueRef));
    LLVMValueRef args = LLVMBuildBitCast(b, LLVMGetParam(fn, 0), e->tp64, "args");
    a[0] = LLVMGetParam(fn, 1);
    a[1] = LLVMGetParam(fn, 2);
    for (int k = 0; k < np; k++) {
        LLVMValueRef idx = I64(e, k);
        LLVMValueRef v = LLVMBuildLoad2(b, e->ti64, LLVMBuildInBoundsGEP2(b, e->ti64, args, &idx, 1, ""), "");
        a[2 + k] = LLVMBuildIntToPtr(b, v, LLVMTypeOf(LLVMGetParam(loop, (unsigned)k + 2)), "");
    }
    LLVMBuildCall2(b, LLVMGlobalGetValueType(loop), loop, a, (unsigned)np + 2, "");
    LLVMBuildRetVoid(b);
    free(a);
    return fn;
}

/* Below this many elements a kernel runs its loop on the calling thread:
 * waking the pool costs more than the loop. */
enum { PARALLEL_MIN = 1 << 14 };

/* void kiln_fused_K(rt_ctx *ctx, const int64_t *args):
 *   n <= PARALLEL_MIN ? body(args, 0, n) : rt_parallel_for(ctx, n, body, args) */
static void emit_group(Em *e, KGroup *gr) {
    char name[64], sub[80];
    if (gr->kernel >= 0) snprintf(name, sizeof name, "kiln_fused_%d", gr->kernel);
    else snprintf(name, sizeof name, "kiln_fused_n%d", gr->nodes[0]);
    snprintf(sub, sizeof sub, "%s_loop", name);
    LLVMValueRef loop = group_loop(e, gr, sub);
    snprintf(sub, sizeof sub, "%s_body", name);
    LLVMValueRef body = group_body(e, gr, loop, sub);
    LLVMValueRef fn = add_fn(e, name, e->tkernel, 1);
    LLVMBuilderRef b = e->b;
    LLVMPositionBuilderAtEnd(b, LLVMAppendBasicBlockInContext(e->c, fn, "entry"));
    LLVMValueRef args = LLVMGetParam(fn, 1), idx = I64(e, gr->nin + gr->nout);
    LLVMValueRef n = LLVMBuildLoad2(b, e->ti64, LLVMBuildInBoundsGEP2(b, e->ti64, args, &idx, 1, ""), "n");
    LLVMValueRef data = LLVMBuildBitCast(b, args, e->tp8, "");
    LLVMBasicBlockRef small = LLVMAppendBasicBlockInContext(e->c, fn, "small");
    LLVMBasicBlockRef big = LLVMAppendBasicBlockInContext(e->c, fn, "big");
    LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntSLE, n, I64(e, PARALLEL_MIN), ""), small, big);
    LLVMPositionBuilderAtEnd(b, small);
    LLVMBuildCall2(b, e->tbody, body, (LLVMValueRef[]){data, I64(e, 0), n}, 3, "");
    LLVMBuildRetVoid(b);
    LLVMPositionBuilderAtEnd(b, big);
    LLVMValueRef a[4] = {LLVMGetParam(fn, 0), n, body, data};
    LLVMBuildCall2(b, e->tpfor, e->rt_parallel_for, a, 4, "");
    LLVMBuildRetVoid(b);
    e->group_fn[gr - e->kg.groups] = fn;
}

/* The CPU's kernel emitter (emit_priv.h): one kernel per group key. */
void em_cpu_kernels(Em *e) {
    e->group_fn = xcalloc((size_t)e->kg.ngroups, sizeof(LLVMValueRef));
    for (int k = 0; k < e->kg.ngroups; k++) /* one kernel per key */
        if (e->kg.groups[k].first == k) emit_group(e, &e->kg.groups[k]);
}

/* ---- building, checking and optimizing a module ---- */

/* What one stage's program allocated (the module-wide state stays). */
static void em_free_stage(Em *e) {
    kg_free(&e->kg);
    free(e->kindex);
    free(e->group_fn);
    free(e->order);
    free(e->reg);
}

/* The pipeline stages' tables, one program each (emit_priv.h): every stage
 * starts from the module-wide state in base (types, runtime declarations,
 * math helpers) and builds its own step, kernels and table; kiln_stages,
 * the array of the tables' addresses, gets its initializer once all exist. */
static void em_stages(Em *base) {
    const Module *m = base->m;
    LLVMTypeRef tpp = LLVMPointerType(base->tprogram, 0), tarr = LLVMArrayType(tpp, (unsigned)m->nstages);
    base->stages_gv = LLVMAddGlobal(base->mod, tarr, "kiln_stages");
    LLVMSetGlobalConstant(base->stages_gv, 1);
    LLVMSetLinkage(base->stages_gv, LLVMPrivateLinkage);
    LLVMValueRef *tab = xcalloc((size_t)m->nstages, sizeof(LLVMValueRef));
    for (int s = 0; s < m->nstages; s++) {
        Em e = *base;
        e.stage = s;
        e.g = m->stages[s];
        e.reg = xcalloc((size_t)e.g->nvals + 1, sizeof(LLVMValueRef));
        em_host_program(&e);
        tab[s] = e.table;
        em_free_stage(&e);
    }
    LLVMSetInitializer(base->stages_gv, LLVMConstArray(tpp, tab, (unsigned)m->nstages));
    free(tab);
}

/* The LLVM module for m in context c, laid out for tm.  Verified. */
static LLVMModuleRef build_module(const Module *m, const EmitTarget *t, LLVMContextRef c, LLVMTargetMachineRef tm, char *err,
                                  size_t errlen) {
    if (m->nstages < 1 || (m->nstages > 1 && m->mesh[0] != m->nstages))
        ICE("emit: %d pipeline stages on a mesh of pp %d", m->nstages, m->mesh[0]);
    if (t && t->device == RT_DEV_CUDA && emit_cuda_p2p_order(m, err, errlen) != 0) return NULL;
    Em e = {0};
    e.m = m;
    e.tgt = t;
    e.cuda = t && t->device == RT_DEV_CUDA;
    e.c = c;
    e.mod = LLVMModuleCreateWithNameInContext(m->name, c);
    char *triple = LLVMGetTargetMachineTriple(tm);
    LLVMSetTarget(e.mod, triple);
    LLVMDisposeMessage(triple);
    LLVMTargetDataRef dl = LLVMCreateTargetDataLayout(tm);
    LLVMSetModuleDataLayout(e.mod, dl);
    e.b = LLVMCreateBuilderInContext(c);
    init_types(&e);
    check_layout(&e, dl);
    LLVMDisposeTargetData(dl);
    declare_runtime(&e);
    e.expf_ = build_expf(&e);
    e.tanhf_ = build_tanhf(&e);
    em_stages(&e);
    LLVMDisposeBuilder(e.b);
    char *msg = NULL;
    if (LLVMVerifyModule(e.mod, LLVMReturnStatusAction, &msg)) {
        snprintf(err, errlen, "emit: invalid LLVM module: %s", msg ? msg : "?");
        LLVMDisposeMessage(msg);
        LLVMDisposeModule(e.mod);
        return NULL;
    }
    LLVMDisposeMessage(msg);
    return e.mod;
}

/* Report an LLVMErrorRef (consumed) as "what: message"; returns -1. */
static int llvm_error(LLVMErrorRef le, const char *what, char *err, size_t errlen) {
    char *msg = LLVMGetErrorMessage(le);
    snprintf(err, errlen, "%s: %s", what, msg);
    LLVMDisposeErrorMessage(msg);
    return -1;
}

static pthread_once_t llvm_once = PTHREAD_ONCE_INIT;
static int llvm_ready;
static void llvm_init(void) {
    llvm_ready = !LLVMInitializeNativeTarget() && !LLVMInitializeNativeAsmPrinter();
}

/* A target machine for cpu/features (NULL: the host's), PIC, -O3. */
static LLVMTargetMachineRef target_machine(const char *cpu, const char *features, char *err, size_t errlen) {
    int rc = pthread_once(&llvm_once, llvm_init);
    if (rc != 0 || !llvm_ready) {
        snprintf(err, errlen, "emit: cannot initialise LLVM's native target");
        return NULL;
    }
    char *triple = LLVMGetDefaultTargetTriple(), *msg = NULL;
    char *hcpu = cpu ? NULL : LLVMGetHostCPUName(), *hfeat = features ? NULL : LLVMGetHostCPUFeatures();
    LLVMTargetRef t;
    LLVMTargetMachineRef tm = NULL;
    if (LLVMGetTargetFromTriple(triple, &t, &msg)) {
        snprintf(err, errlen, "emit: target %s: %s", triple, msg ? msg : "?");
    } else {
        tm = LLVMCreateTargetMachine(t, triple, cpu ? cpu : hcpu, features ? features : hfeat, LLVMCodeGenLevelAggressive,
                                     LLVMRelocPIC, LLVMCodeModelDefault);
        if (!tm) snprintf(err, errlen, "emit: cannot create a target machine for %s", triple);
    }
    LLVMDisposeMessage(msg);
    LLVMDisposeMessage(triple);
    if (hcpu) LLVMDisposeMessage(hcpu);
    if (hfeat) LLVMDisposeMessage(hfeat);
    return tm;
}

static int optimize(LLVMModuleRef mod, LLVMTargetMachineRef tm, char *err, size_t errlen) {
    LLVMPassBuilderOptionsRef po = LLVMCreatePassBuilderOptions();
    LLVMErrorRef le = LLVMRunPasses(mod, "default<O3>", tm, po);
    LLVMDisposePassBuilderOptions(po);
    return le ? llvm_error(le, "emit: optimizing", err, errlen) : 0;
}

/* Build and optimize m in context c for tm. */
static LLVMModuleRef compile(const Module *m, const EmitTarget *t, LLVMContextRef c, LLVMTargetMachineRef tm, char *err,
                             size_t errlen) {
    LLVMModuleRef mod = build_module(m, t, c, tm, err, errlen);
    if (mod && optimize(mod, tm, err, errlen) != 0) {
        LLVMDisposeModule(mod);
        return NULL;
    }
    return mod;
}

/* ---- the public entry points ---- */

struct Jit {
    LLVMOrcLLJITRef jit;
};

Jit *emit_jit(const Module *m, const rt_program **prog, char *err, size_t errlen) {
    *prog = NULL;
    LLVMTargetMachineRef tm = target_machine(NULL, NULL, err, errlen);
    if (!tm) return NULL;
    LLVMTargetMachineRef jtm = target_machine(NULL, NULL, err, errlen);
    if (!jtm) {
        LLVMDisposeTargetMachine(tm);
        return NULL;
    }
    LLVMOrcThreadSafeContextRef tsc = LLVMOrcCreateNewThreadSafeContext();
    LLVMModuleRef mod = compile(m, NULL, LLVMOrcThreadSafeContextGetContext(tsc), tm, err, errlen);
    LLVMDisposeTargetMachine(tm);
    if (!mod) {
        LLVMDisposeTargetMachine(jtm);
        LLVMOrcDisposeThreadSafeContext(tsc);
        return NULL;
    }
    /* the JIT compiles for the same machine the optimizer targeted */
    LLVMOrcLLJITBuilderRef jb = LLVMOrcCreateLLJITBuilder();
    LLVMOrcLLJITBuilderSetJITTargetMachineBuilder(jb, LLVMOrcJITTargetMachineBuilderCreateFromTargetMachine(jtm));
    LLVMOrcLLJITRef jit;
    LLVMErrorRef le = LLVMOrcCreateLLJIT(&jit, jb);
    if (le) {
        llvm_error(le, "emit: creating the JIT", err, errlen);
        LLVMDisposeModule(mod);
        LLVMOrcDisposeThreadSafeContext(tsc);
        return NULL;
    }
    Jit *j = xcalloc(1, sizeof *j);
    j->jit = jit;
    LLVMOrcDefinitionGeneratorRef gen;
    le = LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess(&gen, LLVMOrcLLJITGetGlobalPrefix(jit), NULL, NULL);
    if (le) {
        llvm_error(le, "emit: process symbols for the JIT", err, errlen);
        LLVMDisposeModule(mod);
        LLVMOrcDisposeThreadSafeContext(tsc);
        emit_jit_free(j);
        return NULL;
    }
    LLVMOrcJITDylibAddGenerator(LLVMOrcLLJITGetMainJITDylib(jit), gen);
    LLVMOrcThreadSafeModuleRef tsm = LLVMOrcCreateNewThreadSafeModule(mod, tsc);
    LLVMOrcDisposeThreadSafeContext(tsc); /* the module keeps it alive */
    le = LLVMOrcLLJITAddLLVMIRModule(jit, LLVMOrcLLJITGetMainJITDylib(jit), tsm);
    if (le) {
        llvm_error(le, "emit: adding the module to the JIT", err, errlen);
        emit_jit_free(j);
        return NULL;
    }
    LLVMOrcExecutorAddress addr = 0;
    le = LLVMOrcLLJITLookup(jit, &addr, "kiln_program");
    if (le) {
        llvm_error(le, "emit: JIT", err, errlen);
        emit_jit_free(j);
        return NULL;
    }
    *prog = (const rt_program *)(uintptr_t)addr;
    return j;
}

void emit_jit_free(Jit *j) {
    if (!j) return;
    LLVMErrorRef le = LLVMOrcDisposeLLJIT(j->jit);
    if (le) {
        char *msg = LLVMGetErrorMessage(le);
        fprintf(stderr, "kiln: disposing the JIT: %s\n", msg);
        LLVMDisposeErrorMessage(msg);
    }
    free(j);
}

int emit_object(const Module *m, const char *path, char *err, size_t errlen) { return emit_object_for(m, NULL, path, err, errlen); }

int emit_object_for(const Module *m, const EmitTarget *t, const char *path, char *err, size_t errlen) {
    LLVMTargetMachineRef tm = target_machine(NULL, NULL, err, errlen);
    if (!tm) return -1;
    LLVMContextRef c = LLVMContextCreate();
    LLVMModuleRef mod = compile(m, t, c, tm, err, errlen);
    int rc = mod ? 0 : -1;
    char *msg = NULL;
    if (mod && LLVMTargetMachineEmitToFile(tm, mod, (char *)path, LLVMObjectFile, &msg)) {
        snprintf(err, errlen, "emit: writing %s: %s", path, msg ? msg : "?");
        rc = -1;
    }
    LLVMDisposeMessage(msg);
    if (mod) LLVMDisposeModule(mod);
    LLVMContextDispose(c);
    LLVMDisposeTargetMachine(tm);
    return rc;
}

static int llvm_text(const Module *m, const EmitTarget *t, FILE *f, const char *cpu, const char *features, char *err,
                     size_t errlen) {
    LLVMTargetMachineRef tm = target_machine(cpu, features, err, errlen);
    if (!tm) return -1;
    LLVMContextRef c = LLVMContextCreate();
    LLVMModuleRef mod = compile(m, t, c, tm, err, errlen);
    int rc = mod ? 0 : -1;
    if (mod) {
        char *text = LLVMPrintModuleToString(mod);
        if (fputs(text, f) == EOF || fflush(f) != 0) {
            snprintf(err, errlen, "emit: cannot write the LLVM IR");
            rc = -1;
        }
        LLVMDisposeMessage(text);
        LLVMDisposeModule(mod);
    }
    LLVMContextDispose(c);
    LLVMDisposeTargetMachine(tm);
    return rc;
}

int emit_llvm_text_for(const Module *m, FILE *f, const char *cpu, const char *features, char *err, size_t errlen) {
    return llvm_text(m, NULL, f, cpu, features, err, errlen);
}

int emit_llvm_text_target(const Module *m, const EmitTarget *t, FILE *f, char *err, size_t errlen) {
    return llvm_text(m, t, f, NULL, NULL, err, errlen);
}

int emit_llvm_text(const Module *m, FILE *f, char *err, size_t errlen) { return llvm_text(m, NULL, f, NULL, NULL, err, errlen); }
