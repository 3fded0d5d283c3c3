/* fake_cublaslt.c — a fake libcublasLt.so.13: the contract's cuBLASLt
 * subset as a host GEMM, for running the CUDA trainer without a GPU
 * (fake_cuda.c says why and how).
 *
 * What it computes: cublasLtMatmul's D = alpha * op(A) op(B) + beta * C,
 * column-major (CUBLASLT_ORDER_COL, the only order), for the contract's
 * types only: compute CUBLAS_COMPUTE_32F, scale CUDA_R_32F (alpha, beta as
 * host floats: the default pointer mode), A and B CUDA_R_16BF, C and D both
 * CUDA_R_16BF or both CUDA_R_32F; TRANSA/TRANSB N or T; strided batches
 * (BATCH_COUNT, STRIDED_BATCH_OFFSET in elements, stride 0 = the same
 * matrix for every batch entry, refused for D).  beta = 0 does not read C.
 * Accumulation: each dot product is summed in DOUBLE, in order of k, then
 * alpha * sum + beta * C is rounded once to f32 (and from f32 to bf16,
 * nearest even, for a bf16 D) — so the fake is more exact than the GPU
 * (f32 tensor-core accumulation); compare a trainer with bf16 tolerances.
 *
 * What it checks, as cuBLASLt would (CUBLAS_STATUS_INVALID_VALUE or
 * NOT_SUPPORTED, one "fake cublasLt: " line on stderr): the types above,
 * the dimensions of op(A) [m,k], op(B) [k,n], C and D [m,n], ld >= rows,
 * equal batch counts, C == D only with the same layout, attribute sizes
 * (an int32 attribute set from an int64 fails), only the contract's
 * attributes (TRANSA, TRANSB, BATCH_COUNT, STRIDED_BATCH_OFFSET,
 * MAX_WORKSPACE_BYTES, MIN_ALIGNMENT_*_BYTES; anything else is refused with its number).  And
 * what a GPU would fault on: every matrix it reads or writes, all batches,
 * must lie inside one device allocation of the fake driver.
 *
 * Epilogues (issue 23): CUBLASLT_MATMUL_DESC_EPILOGUE DEFAULT or BIAS,
 * with BIAS_POINTER (required for BIAS: a device vector of D's rows, read
 * like the matrices, inside one allocation) and BIAS_DATA_TYPE (-1, the
 * default, is D's type; else it must be D's).  BIAS adds bias[i] to row i
 * of every batch entry's alpha * op(A) op(B) + beta * C, in double, before
 * the one rounding — the fake's own reading of the header's contract, not
 * the runtime's.  KILN_FAKE_CUBLASLT_TEST_DROP_BIAS=1 (tests only) plants a
 * bug: the bias is not added.
 *
 * GELU_AUX_BIAS (issue 23): as BIAS, then D = GELU(v) of the unrounded sum v,
 * the GELU being the tanh approximation the header's GELU epilogues name
 * (x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), written here from that
 * formula), and v itself, rounded to the aux type, stored to
 * EPILOGUE_AUX_POINTER with EPILOGUE_AUX_LD (required: a multiple of 8, at
 * least D's rows; the aux matrix lies in one allocation);
 * EPILOGUE_AUX_DATA_TYPE must be -1 or D's type; one batch only (no
 * AUX_BATCH_STRIDE).  KILN_FAKE_CUBLASLT_TEST_GELU_AUX (tests only) plants
 * a bug: =post, the aux output holds GELU(v), not v; =nobias, it holds v
 * without the bias.
 *
 * The backward epilogues (issue 23), from the header (cublasLt.h) and the
 * library's own error messages (strings of libcublasLt.so.13; sources in
 * docs/decisions.md, "Backward GEMM epilogues"):
 *   DGELU_BGRAD: D = v * GELU'(aux) of the unrounded v (aux, the GELU input,
 *     read with EPILOGUE_AUX_LD: a multiple of 8, >= D's rows; its type -1
 *     or D's), and the bias gradient (BIAS_POINTER: required, D's rows long,
 *     in D's type, the header's rule; BIAS_DATA_TYPE -1 or D's) = the sum of
 *     those unrounded values over each row of D, rounded once;
 *   BGRADA: the bias gradient (D's rows long) = the sum over k of op(A),
 *     which must not be transposed ("BGRADA only works with non-transposed
 *     A"); BGRADB: D's columns long, the sum over k of op(B), which must be
 *     transposed ("BGRADB only works with transposed B"); D is computed as
 *     without an epilogue.
 * All three: one batch (the fake sets no BIAS_BATCH_STRIDE), the bias
 * gradient inside one allocation and aligned to D's element size ("The
 * bias vector pointer must be aligned to output data type").  Planted bugs
 * (tests only): KILN_FAKE_CUBLASLT_TEST_DGELU_AUX_LD=1 reads aux with the
 * leading dimension 8 short; KILN_FAKE_CUBLASLT_TEST_BGRAD=half sums only
 * the first half of k (BGRADA/B) or of D's columns (DGELU_BGRAD).  Other
 * epilogues are refused with their number.
 *
 * The work is enqueued on the stream through kiln_fake_cuda_enqueue
 * (fake_cuda.h) with its arguments copied, so a GEMM launched while the
 * stream captures is recorded and replayed by cuGraphLaunch like a kernel.
 * cublasLtMatmulAlgoGetHeuristic returns one algorithm (no workspace).
 * The exports carry the real library's symbol version (libcublasLt.so.13),
 * so a binary linked against the real library loads this one.
 */
#include <cublasLt.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_cuda.h"

#define HANDLE_MAGIC 0x6b6c4c74u /* "kLLt" */
#define DESC_MAGIC 0x6b446573u
#define LAYOUT_MAGIC 0x6b4c6179u
#define PREF_MAGIC 0x6b507266u
#define ALGO_MAGIC 0x6b416c67u

struct cublasLtContext {
    unsigned magic;
};

typedef struct {
    unsigned magic;
    int32_t compute, scale, transa, transb;
    uint32_t epilogue;  /* CUBLASLT_EPILOGUE_DEFAULT or _BIAS */
    const void *bias;   /* BIAS_POINTER */
    int32_t bias_type;  /* BIAS_DATA_TYPE: -1 = D's */
    void *aux;          /* EPILOGUE_AUX_POINTER (GELU_AUX_BIAS) */
    int64_t aux_ld;     /* EPILOGUE_AUX_LD: 0 = unset */
    int32_t aux_type;   /* EPILOGUE_AUX_DATA_TYPE: -1 = D's */
} Desc;

typedef struct {
    unsigned magic;
    int32_t type;
    uint64_t rows, cols;
    int64_t ld;
    int32_t batch;
    int64_t stride;
} Layout;

typedef struct {
    unsigned magic;
    uint64_t max_workspace;
    uint32_t align[4]; /* MIN_ALIGNMENT_{A,B,C,D}_BYTES: 256 unless set */
} Pref;

static cublasStatus_t fail(cublasStatus_t s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static cublasStatus_t fail(cublasStatus_t s, const char *fmt, ...) {
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "fake cublasLt: %s (%s)\n", line, cublasLtGetStatusString(s));
    return s;
}

const char *cublasLtGetStatusString(cublasStatus_t status) {
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR: return "the functionality requested requires some license";
    default: return "unknown error";
    }
}

/* ---- handles and descriptors ---- */

static void *new_object(size_t bytes) { return calloc(1, bytes); }

cublasStatus_t cublasLtCreate(cublasLtHandle_t *lightHandle) {
    if (!lightHandle) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtCreate: NULL handle pointer");
    struct cublasLtContext *h = new_object(sizeof *h);
    if (!h) return fail(CUBLAS_STATUS_ALLOC_FAILED, "cublasLtCreate");
    h->magic = HANDLE_MAGIC;
    *lightHandle = h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle) {
    if (!lightHandle || lightHandle->magic != HANDLE_MAGIC)
        return fail(CUBLAS_STATUS_NOT_INITIALIZED, "cublasLtDestroy: not a live handle");
    lightHandle->magic = 0;
    free(lightHandle);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *matmulDesc, cublasComputeType_t computeType,
                                        cudaDataType_t scaleType) {
    if (!matmulDesc) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulDescCreate: NULL pointer");
    Desc *d = new_object(sizeof *d);
    if (!d) return fail(CUBLAS_STATUS_ALLOC_FAILED, "cublasLtMatmulDescCreate");
    *d = (Desc){DESC_MAGIC, (int32_t)computeType, (int32_t)scaleType, CUBLAS_OP_N, CUBLAS_OP_N, CUBLASLT_EPILOGUE_DEFAULT, NULL, -1, NULL, 0, -1};
    *matmulDesc = (cublasLtMatmulDesc_t)d;
    return CUBLAS_STATUS_SUCCESS;
}

static Desc *desc_of(cublasLtMatmulDesc_t h) {
    Desc *d = (Desc *)h;
    return d && d->magic == DESC_MAGIC ? d : NULL;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc) {
    Desc *d = desc_of(matmulDesc);
    if (!d) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulDescDestroy: not a live descriptor");
    d->magic = 0;
    free(d);
    return CUBLAS_STATUS_SUCCESS;
}

/* an attribute's value of `size` bytes; INVALID_VALUE when the size is not `want` */
static cublasStatus_t attribute(const char *call, const char *name, const void *buf, size_t size, size_t want,
                                void *out) {
    if (!buf || size != want)
        return fail(CUBLAS_STATUS_INVALID_VALUE, "%s(%s): %zu bytes given, the attribute has %zu", call, name, size, want);
    memcpy(out, buf, want);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc, cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t sizeInBytes) {
    const char *call = "cublasLtMatmulDescSetAttribute";
    Desc *d = desc_of(matmulDesc);
    if (!d) return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: not a live descriptor", call);
    int32_t op = 0;
    cublasStatus_t s;
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
    case CUBLASLT_MATMUL_DESC_TRANSB:
        s = attribute(call, attr == CUBLASLT_MATMUL_DESC_TRANSA ? "TRANSA" : "TRANSB", buf, sizeInBytes, sizeof op, &op);
        if (s) return s;
        if (op != CUBLAS_OP_N && op != CUBLAS_OP_T) return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: operation %d", call, op);
        *(attr == CUBLASLT_MATMUL_DESC_TRANSA ? &d->transa : &d->transb) = op;
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_EPILOGUE: {
        uint32_t ep = 0;
        if ((s = attribute(call, "EPILOGUE", buf, sizeInBytes, sizeof ep, &ep))) return s;
        if (ep != CUBLASLT_EPILOGUE_DEFAULT && ep != CUBLASLT_EPILOGUE_BIAS && ep != CUBLASLT_EPILOGUE_GELU_AUX_BIAS &&
            ep != CUBLASLT_EPILOGUE_DGELU_BGRAD && ep != CUBLASLT_EPILOGUE_BGRADA && ep != CUBLASLT_EPILOGUE_BGRADB)
            return fail(CUBLAS_STATUS_NOT_SUPPORTED,
                        "%s: epilogue %u is not emulated (DEFAULT, BIAS, GELU_AUX_BIAS, DGELU_BGRAD, BGRADA, BGRADB)", call, ep);
        d->epilogue = ep;
        return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
        return attribute(call, "BIAS_POINTER", buf, sizeInBytes, sizeof d->bias, &d->bias);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
        return attribute(call, "BIAS_DATA_TYPE", buf, sizeInBytes, sizeof d->bias_type, &d->bias_type);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER:
        return attribute(call, "EPILOGUE_AUX_POINTER", buf, sizeInBytes, sizeof d->aux, &d->aux);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD:
        return attribute(call, "EPILOGUE_AUX_LD", buf, sizeInBytes, sizeof d->aux_ld, &d->aux_ld);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE:
        return attribute(call, "EPILOGUE_AUX_DATA_TYPE", buf, sizeInBytes, sizeof d->aux_type, &d->aux_type);
    default:
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, "%s: attribute %d is not emulated (the contract sets TRANSA, TRANSB)", call,
                    (int)attr);
    }
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *matLayout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
    if (!matLayout) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatrixLayoutCreate: NULL pointer");
    Layout *l = new_object(sizeof *l);
    if (!l) return fail(CUBLAS_STATUS_ALLOC_FAILED, "cublasLtMatrixLayoutCreate");
    *l = (Layout){LAYOUT_MAGIC, (int32_t)type, rows, cols, ld, 1, 0};
    *matLayout = (cublasLtMatrixLayout_t)l;
    return CUBLAS_STATUS_SUCCESS;
}

static Layout *layout_of(cublasLtMatrixLayout_t h) {
    Layout *l = (Layout *)h;
    return l && l->magic == LAYOUT_MAGIC ? l : NULL;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout) {
    Layout *l = layout_of(matLayout);
    if (!l) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatrixLayoutDestroy: not a live layout");
    l->magic = 0;
    free(l);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t matLayout, cublasLtMatrixLayoutAttribute_t attr,
                                                const void *buf, size_t sizeInBytes) {
    const char *call = "cublasLtMatrixLayoutSetAttribute";
    Layout *l = layout_of(matLayout);
    if (!l) return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: not a live layout", call);
    switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: {
        int32_t v = 0;
        cublasStatus_t s = attribute(call, "BATCH_COUNT", buf, sizeInBytes, sizeof v, &v);
        if (s) return s;
        if (v < 1) return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: BATCH_COUNT %d", call, v);
        l->batch = v;
        return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: {
        int64_t v = 0;
        cublasStatus_t s = attribute(call, "STRIDED_BATCH_OFFSET", buf, sizeInBytes, sizeof v, &v);
        if (s) return s;
        if (v < 0) return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: STRIDED_BATCH_OFFSET %lld", call, (long long)v);
        l->stride = v;
        return CUBLAS_STATUS_SUCCESS;
    }
    default:
        return fail(CUBLAS_STATUS_NOT_SUPPORTED,
                    "%s: attribute %d is not emulated (the contract sets BATCH_COUNT, STRIDED_BATCH_OFFSET)", call, (int)attr);
    }
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref) {
    if (!pref) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulPreferenceCreate: NULL pointer");
    Pref *p = new_object(sizeof *p);
    if (!p) return fail(CUBLAS_STATUS_ALLOC_FAILED, "cublasLtMatmulPreferenceCreate");
    p->magic = PREF_MAGIC;
    for (int i = 0; i < 4; i++) p->align[i] = 256;
    *pref = (cublasLtMatmulPreference_t)p;
    return CUBLAS_STATUS_SUCCESS;
}

static Pref *pref_of(cublasLtMatmulPreference_t h) {
    Pref *p = (Pref *)h;
    return p && p->magic == PREF_MAGIC ? p : NULL;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
    Pref *p = pref_of(pref);
    if (!p) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulPreferenceDestroy: not a live preference");
    p->magic = 0;
    free(p);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
                                                    size_t sizeInBytes) {
    const char *call = "cublasLtMatmulPreferenceSetAttribute";
    Pref *p = pref_of(pref);
    if (!p) return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: not a live preference", call);
    static const struct {
        cublasLtMatmulPreferenceAttributes_t attr;
        const char *name;
    } aligns[4] = {{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, "MIN_ALIGNMENT_A_BYTES"},
                   {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, "MIN_ALIGNMENT_B_BYTES"},
                   {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, "MIN_ALIGNMENT_C_BYTES"},
                   {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, "MIN_ALIGNMENT_D_BYTES"}};
    for (int i = 0; i < 4; i++)
        if (attr == aligns[i].attr) {
            uint32_t v = 0;
            cublasStatus_t s = attribute(call, aligns[i].name, buf, sizeInBytes, sizeof v, &v);
            if (s) return s;
            p->align[i] = v;
            return CUBLAS_STATUS_SUCCESS;
        }
    if (attr != CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES)
        return fail(CUBLAS_STATUS_NOT_SUPPORTED,
                    "%s: attribute %d is not emulated (the contract sets MAX_WORKSPACE_BYTES, MIN_ALIGNMENT_{A,B,C,D}_BYTES)",
                    call, (int)attr);
    return attribute(call, "MAX_WORKSPACE_BYTES", buf, sizeInBytes, sizeof p->max_workspace, &p->max_workspace);
}

/* ---- the GEMM ---- */

typedef struct {
    int transa, transb, d_bf16; /* d_bf16: C and D are bf16 (else f32) */
    int64_t m, n, k, batch;
    int64_t lda, ldb, ldc, ldd, stra, strb, strc, strd;
    const uint16_t *a, *b;
    const void *c;
    void *d;
    float alpha, beta;
    const void *bias; /* the BIAS epilogue's vector (D's type), or NULL */
    void *aux;        /* GELU_AUX_BIAS: the GELU input (D's type), or NULL */
    int64_t aux_ld;
    int aux_bug;      /* the planted bugs: 1 aux gets the GELU's output, 2 the sum without the bias */
    uint32_t bgrad;   /* 0, or DGELU_BGRAD, BGRADA, BGRADB: the bias gradient goes to bgrad */
    void *bgrad_out;  /* D's type */
    const void *daux; /* DGELU_BGRAD: the GELU input (D's type), read with aux_ld */
    int bgrad_bug;    /* planted: 1 sums half of the reduced dim */
    int dgelu_ld_bug; /* planted: 1 reads daux with aux_ld - 8 */
} Gemm;

static cublasStatus_t check_bgrad(const char *call, const Desc *dd, const Layout *ld, const Gemm *g);

/* GELU, tanh approximation (cublasLt.h's GELU epilogues). */
static double gelu_tanh(double x) {
    const double c = sqrt(2.0 / 3.14159265358979323846);
    return 0.5 * x * (1.0 + tanh(c * (x + 0.044715 * x * x * x)));
}

/* Its derivative, from the same formula: with u = c (x + 0.044715 x^3),
 * d/dx = (1 + tanh u) / 2 + x (1 - tanh^2 u) c (1 + 3 * 0.044715 x^2) / 2. */
static double gelu_tanh_grad(double x) {
    const double c = sqrt(2.0 / 3.14159265358979323846);
    double t = tanh(c * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x * x);
}

static double bf16_value(uint16_t v) {
    uint32_t u = (uint32_t)v << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t bf16_round(float f) { /* nearest even; NaN -> 0x7fff (as emu.h and the hardware) */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* The stored value of element i of a D-typed buffer. */
static double d_value(const Gemm *g, const void *p, int64_t i) {
    return g->d_bf16 ? bf16_value(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

static void d_store(const Gemm *g, void *p, int64_t i, double v) {
    if (g->d_bf16) ((uint16_t *)p)[i] = bf16_round((float)v);
    else ((float *)p)[i] = (float)v;
}

/* BGRADA / BGRADB: the sums over k of op(A) (rows i) or op(B) (columns j),
 * from ar / br as run_gemm lays them out; sums[] gets len entries. */
static void operand_sums(const Gemm *g, const double *ar, const double *br, double *sums) {
    int a = g->bgrad == CUBLASLT_EPILOGUE_BGRADA;
    int64_t len = a ? g->m : g->n, kk = g->bgrad_bug ? g->k / 2 : g->k;
    for (int64_t i = 0; i < len; i++) {
        double s = 0;
        for (int64_t l = 0; l < kk; l++) s += (a ? ar : br)[i * g->k + l];
        sums[i] = s;
    }
}

static int run_gemm(void *data, char *err, size_t errlen) {
    const Gemm *g = data;
    double *ar = malloc(sizeof(double) * (size_t)(g->m * g->k + 1)), *br = malloc(sizeof(double) * (size_t)(g->n * g->k + 1));
    double *sums = calloc((size_t)(g->m > g->n ? g->m : g->n) + 1, sizeof(double));
    if (!ar || !br || !sums) {
        free(ar);
        free(br);
        free(sums);
        snprintf(err, errlen, "out of host memory");
        return -1;
    }
    for (int64_t bt = 0; bt < g->batch; bt++) {
        const uint16_t *a = g->a + bt * g->stra, *b = g->b + bt * g->strb;
        /* ar[i][l] = op(A)(i, l), br[j][l] = op(B)(l, j): contiguous in l */
        for (int64_t i = 0; i < g->m; i++)
            for (int64_t l = 0; l < g->k; l++) ar[i * g->k + l] = bf16_value(g->transa ? a[l + i * g->lda] : a[i + l * g->lda]);
        for (int64_t j = 0; j < g->n; j++)
            for (int64_t l = 0; l < g->k; l++) br[j * g->k + l] = bf16_value(g->transb ? b[j + l * g->ldb] : b[l + j * g->ldb]);
        for (int64_t j = 0; j < g->n; j++)
            for (int64_t i = 0; i < g->m; i++) {
                double acc = 0;
                const double *x = ar + i * g->k, *y = br + j * g->k;
                for (int64_t l = 0; l < g->k; l++) acc += x[l] * y[l];
                double v = (double)g->alpha * acc;
                int64_t ci = bt * g->strc + i + j * g->ldc, di = bt * g->strd + i + j * g->ldd;
                if (g->beta != 0.0f)
                    v += (double)g->beta * (g->d_bf16 ? bf16_value(((const uint16_t *)g->c)[ci]) : ((const float *)g->c)[ci]);
                double bv = 0;
                if (g->bias) bv = g->d_bf16 ? bf16_value(((const uint16_t *)g->bias)[i]) : ((const float *)g->bias)[i];
                v += bv;
                if (g->aux) {
                    double gv = gelu_tanh(v), av = g->aux_bug == 1 ? gv : g->aux_bug == 2 ? v - bv : v;
                    int64_t xi = i + j * g->aux_ld;
                    if (g->d_bf16) ((uint16_t *)g->aux)[xi] = bf16_round((float)av);
                    else ((float *)g->aux)[xi] = (float)av;
                    v = gv;
                }
                if (g->daux) { /* DGELU_BGRAD: the GELU's gradient at its input, summed per row of D */
                    v *= gelu_tanh_grad(d_value(g, g->daux, i + j * (g->aux_ld - 8 * g->dgelu_ld_bug)));
                    if (!g->bgrad_bug || j < g->n / 2) sums[i] += v;
                }
                d_store(g, g->d, di, v);
            }
        if (g->bgrad == CUBLASLT_EPILOGUE_BGRADA || g->bgrad == CUBLASLT_EPILOGUE_BGRADB) operand_sums(g, ar, br, sums);
    }
    if (g->bgrad) /* one batch (checked) */
        for (int64_t i = 0, len = g->bgrad == CUBLASLT_EPILOGUE_BGRADB ? g->n : g->m; i < len; i++) d_store(g, g->bgrad_out, i, sums[i]);
    free(ar);
    free(br);
    free(sums);
    return 0;
}

static cublasStatus_t check_layout(const char *call, const char *which, const Layout *l, uint64_t rows, uint64_t cols,
                                   int32_t batch) {
    if (!l) return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: %s: not a live layout", call, which);
    if (l->rows != rows || l->cols != cols)
        return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: %s is %llux%llu, the product needs %llux%llu", call, which,
                    (unsigned long long)l->rows, (unsigned long long)l->cols, (unsigned long long)rows,
                    (unsigned long long)cols);
    if (l->ld < (int64_t)(l->rows ? l->rows : 1))
        return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: %s: ld %lld < rows %llu (column-major)", call, which, (long long)l->ld,
                    (unsigned long long)l->rows);
    if (l->batch != batch)
        return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: %s: BATCH_COUNT %d, D has %d", call, which, l->batch, batch);
    return CUBLAS_STATUS_SUCCESS;
}

/* Checks the types and shapes and fills g's shape fields. */
static cublasStatus_t plan(const char *call, const Desc *d, const Layout *A, const Layout *B, const Layout *C,
                           const Layout *D, Gemm *g) {
    if (!d) return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: not a live matmul descriptor", call);
    if (!D) return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: D: not a live layout", call);
    if (d->compute != CUBLAS_COMPUTE_32F || d->scale != CUDA_R_32F)
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, "%s: compute type %d, scale type %d (the fake has 32F/R_32F only)", call,
                    d->compute, d->scale);
    if (!A || !B || !C) return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: a layout is not live", call);
    if (A->type != CUDA_R_16BF || B->type != CUDA_R_16BF || C->type != D->type ||
        (D->type != CUDA_R_16BF && D->type != CUDA_R_32F))
        return fail(CUBLAS_STATUS_NOT_SUPPORTED,
                    "%s: types A %d B %d C %d D %d (the fake has A, B CUDA_R_16BF; C = D CUDA_R_16BF or CUDA_R_32F)", call,
                    A->type, B->type, C->type, D->type);
    uint64_t m = D->rows, n = D->cols, k = d->transa == CUBLAS_OP_T ? A->rows : A->cols;
    cublasStatus_t s;
    if ((s = check_layout(call, "A", A, d->transa == CUBLAS_OP_T ? k : m, d->transa == CUBLAS_OP_T ? m : k, D->batch)) ||
        (s = check_layout(call, "B", B, d->transb == CUBLAS_OP_T ? n : k, d->transb == CUBLAS_OP_T ? k : n, D->batch)) ||
        (s = check_layout(call, "C", C, m, n, D->batch)) || (s = check_layout(call, "D", D, m, n, D->batch)))
        return s;
    if (D->batch > 1 && D->stride == 0 && m * n > 0)
        return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: D: BATCH_COUNT %d with STRIDED_BATCH_OFFSET 0 (the batches overlap)",
                    call, D->batch);
    *g = (Gemm){.transa = d->transa == CUBLAS_OP_T, .transb = d->transb == CUBLAS_OP_T, .d_bf16 = D->type == CUDA_R_16BF,
                .m = (int64_t)m, .n = (int64_t)n, .k = (int64_t)k, .batch = D->batch,
                .lda = A->ld, .ldb = B->ld, .ldc = C->ld, .ldd = D->ld,
                .stra = A->stride, .strb = B->stride, .strc = C->stride, .strd = D->stride};
    return CUBLAS_STATUS_SUCCESS;
}

/* The bytes a batched column-major matrix spans from its base. */
static size_t span_bytes(const Layout *l, size_t esize) {
    if (l->rows == 0 || l->cols == 0) return 0;
    uint64_t last = (uint64_t)(l->batch - 1) * (uint64_t)l->stride + (l->cols - 1) * (uint64_t)l->ld + l->rows;
    return (size_t)last * esize;
}

static cublasStatus_t check_memory(const char *call, const char *which, const void *p, const Layout *l) {
    char why[512];
    size_t bytes = span_bytes(l, l->type == CUDA_R_32F ? 4 : 2);
    if (bytes == 0 || kiln_fake_cuda_check_range((CUdeviceptr)(uintptr_t)p, bytes, why, sizeof why) == 0)
        return CUBLAS_STATUS_SUCCESS;
    return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: %s: %s", call, which, why);
}

/* An algorithm chosen for MIN_ALIGNMENT bytes assumes the matrix's base
 * pointer is that aligned (the heuristic's default: 256); the real library
 * refuses or faults otherwise, the fake refuses.  The batch strides are not
 * checked: they are in the layout, which the heuristic sees (the pointers
 * it does not). */
static cublasStatus_t check_align(const char *call, char which, const void *p, uint64_t align) {
    uint64_t base = (uint64_t)(uintptr_t)p;
    if (align == 0) align = 256;
    if (base % align == 0) return CUBLAS_STATUS_SUCCESS;
    return fail(CUBLAS_STATUS_NOT_SUPPORTED,
                "%s: %c at 0x%llx is not %llu-byte aligned, which its algorithm assumes "
                "(MIN_ALIGNMENT_%c_BYTES: 256 unless the preference says less)",
                call, which, (unsigned long long)base, (unsigned long long)align, which);
}

static int same_layout(const Layout *a, const Layout *b) {
    return a->type == b->type && a->rows == b->rows && a->cols == b->cols && a->ld == b->ld && a->batch == b->batch &&
           a->stride == b->stride;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc,
                                              cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                              cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                              cublasLtMatmulPreference_t preference, int requestedAlgoCount,
                                              cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
                                              int *returnAlgoCount) {
    const char *call = "cublasLtMatmulAlgoGetHeuristic";
    if (!lightHandle || lightHandle->magic != HANDLE_MAGIC)
        return fail(CUBLAS_STATUS_NOT_INITIALIZED, "%s: not a live handle", call);
    if (!pref_of(preference)) return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: not a live preference", call);
    if (requestedAlgoCount < 1 || !heuristicResultsArray || !returnAlgoCount)
        return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: requestedAlgoCount %d / NULL results", call, requestedAlgoCount);
    Gemm g;
    *returnAlgoCount = 0;
    cublasStatus_t s = plan(call, desc_of(operationDesc), layout_of(Adesc), layout_of(Bdesc), layout_of(Cdesc),
                            layout_of(Ddesc), &g);
    if (s) return s;
    const Desc *dd = desc_of(operationDesc);
    if ((dd->epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD || dd->epilogue == CUBLASLT_EPILOGUE_BGRADA ||
         dd->epilogue == CUBLASLT_EPILOGUE_BGRADB) &&
        (s = check_bgrad(call, dd, layout_of(Ddesc), &g)))
        return s;
    const Pref *p = pref_of(preference);
    const Layout *ls[4] = {layout_of(Adesc), layout_of(Bdesc), layout_of(Cdesc), layout_of(Ddesc)};
    for (int i = 0; i < 4; i++) {
        uint32_t a = p->align[i], es = ls[i]->type == CUDA_R_32F ? 4 : 2;
        if (a < es || (a & (a - 1)))
            return fail(CUBLAS_STATUS_NOT_SUPPORTED, "%s: no algorithm: MIN_ALIGNMENT_%c_BYTES %u (want a power of two >= %u, the element size)",
                        call, "ABCD"[i], a, es);
    }
    memset(&heuristicResultsArray[0], 0, sizeof heuristicResultsArray[0]);
    heuristicResultsArray[0].algo.data[0] = ALGO_MAGIC;
    for (int i = 0; i < 4; i++) heuristicResultsArray[0].algo.data[1 + i] = p->align[i];
    heuristicResultsArray[0].workspaceSize = 0;
    heuristicResultsArray[0].state = CUBLAS_STATUS_SUCCESS;
    heuristicResultsArray[0].wavesCount = 1.0f;
    *returnAlgoCount = 1;
    return CUBLAS_STATUS_SUCCESS;
}

/* GELU_AUX_BIAS's aux matrix: its attributes checked, g->aux set (its
 * bytes in *bytes for the access list). */
/* The aux matrix's attributes, for the epilogue named ep (GELU_AUX_BIAS's
 * output, DGELU_BGRAD's input): 0 or the failure. */
static cublasStatus_t check_aux(const char *call, const char *ep, const Desc *dd, const Layout *ld, const Gemm *g) {
    if (!dd->aux) return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: %s without an EPILOGUE_AUX_POINTER", call, ep);
    if (dd->aux_ld <= 0 || dd->aux_ld % 8 || dd->aux_ld < g->m)
        return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: EPILOGUE_AUX_LD %lld (a multiple of 8, >= D's %lld rows)", call,
                    (long long)dd->aux_ld, (long long)g->m);
    if (dd->aux_type != -1 && dd->aux_type != ld->type)
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, "%s: EPILOGUE_AUX_DATA_TYPE %d, D is %d (the fake: D's type)", call,
                    dd->aux_type, ld->type);
    return CUBLAS_STATUS_SUCCESS;
}

static cublasStatus_t gelu_aux(const char *call, const Desc *dd, const Layout *ld, Gemm *g, size_t *bytes) {
    cublasStatus_t st = check_aux(call, "GELU_AUX_BIAS", dd, ld, g);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    if (g->batch != 1) return fail(CUBLAS_STATUS_NOT_SUPPORTED, "%s: GELU_AUX_BIAS with %lld batches (the fake: one)", call, (long long)g->batch);
    *bytes = g->n ? (size_t)(dd->aux_ld * (g->n - 1) + g->m) * (ld->type == CUDA_R_32F ? 4 : 2) : 0;
    char why[512];
    if (*bytes && kiln_fake_cuda_check_range((CUdeviceptr)(uintptr_t)dd->aux, *bytes, why, sizeof why) != 0)
        return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: aux: %s", call, why);
    const char *bug = getenv("KILN_FAKE_CUBLASLT_TEST_GELU_AUX");
    g->aux = dd->aux, g->aux_ld = dd->aux_ld, g->aux_bug = !bug ? 0 : strcmp(bug, "post") == 0 ? 1 : strcmp(bug, "nobias") == 0 ? 2 : 0;
    return CUBLAS_STATUS_SUCCESS;
}

/* The backward epilogues' rules (the essay): 0 or the failure. */
static cublasStatus_t check_bgrad(const char *call, const Desc *dd, const Layout *ld, const Gemm *g) {
    uint32_t ep = dd->epilogue;
    if (ep == CUBLASLT_EPILOGUE_BGRADA && g->transa)
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, "%s: BGRADA only works with non-transposed A", call);
    if (ep == CUBLASLT_EPILOGUE_BGRADB && !g->transb)
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, "%s: BGRADB only works with transposed B", call);
    if (g->batch != 1) return fail(CUBLAS_STATUS_NOT_SUPPORTED, "%s: a bias gradient with %lld batches (the fake: one)", call, (long long)g->batch);
    if (!dd->bias) return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: epilogue %u without a BIAS_POINTER (the bias gradient)", call, ep);
    if (dd->bias_type != -1 && dd->bias_type != ld->type)
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, "%s: BIAS_DATA_TYPE %d for a bias gradient, D is %d (the header: D's type)", call,
                    dd->bias_type, ld->type);
    size_t es = ld->type == CUDA_R_32F ? 4 : 2;
    if ((uintptr_t)dd->bias % es)
        return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: the bias gradient at %p is not aligned to D's %zu-byte type", call, dd->bias, es);
    if (ep == CUBLASLT_EPILOGUE_DGELU_BGRAD) return check_aux(call, "DGELU_BGRAD (the GELU input)", dd, ld, g);
    return CUBLAS_STATUS_SUCCESS;
}

/* A backward epilogue's buffers: checked against the allocations, set in g,
 * their bytes in *bias_bytes (written) and *aux_bytes (read). */
static cublasStatus_t bgrad_buffers(const char *call, const Desc *dd, const Layout *ld, Gemm *g, size_t *bias_bytes,
                                    size_t *aux_bytes) {
    cublasStatus_t s = check_bgrad(call, dd, ld, g);
    if (s) return s;
    size_t es = ld->type == CUDA_R_32F ? 4 : 2;
    char why[512];
    *bias_bytes = (size_t)(dd->epilogue == CUBLASLT_EPILOGUE_BGRADB ? g->n : g->m) * es;
    if (*bias_bytes && kiln_fake_cuda_check_range((CUdeviceptr)(uintptr_t)dd->bias, *bias_bytes, why, sizeof why) != 0)
        return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: bias gradient: %s", call, why);
    *aux_bytes = 0;
    if (dd->epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD) {
        *aux_bytes = g->n ? (size_t)(dd->aux_ld * (g->n - 1) + g->m) * es : 0;
        if (*aux_bytes && kiln_fake_cuda_check_range((CUdeviceptr)(uintptr_t)dd->aux, *aux_bytes, why, sizeof why) != 0)
            return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: aux: %s", call, why);
        g->daux = dd->aux, g->aux_ld = dd->aux_ld;
        const char *ldbug = getenv("KILN_FAKE_CUBLASLT_TEST_DGELU_AUX_LD");
        g->dgelu_ld_bug = ldbug && strcmp(ldbug, "1") == 0 && dd->aux_ld > 8;
    }
    const char *bug = getenv("KILN_FAKE_CUBLASLT_TEST_BGRAD");
    g->bgrad = dd->epilogue, g->bgrad_out = (void *)(uintptr_t)dd->bias, g->bgrad_bug = bug && strcmp(bug, "half") == 0;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc, const void *alpha,
                              const void *A, cublasLtMatrixLayout_t Adesc, const void *B, cublasLtMatrixLayout_t Bdesc,
                              const void *beta, const void *C, cublasLtMatrixLayout_t Cdesc, void *D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t *algo, void *workspace,
                              size_t workspaceSizeInBytes, cudaStream_t stream) {
    const char *call = "cublasLtMatmul";
    if (!lightHandle || lightHandle->magic != HANDLE_MAGIC)
        return fail(CUBLAS_STATUS_NOT_INITIALIZED, "%s: not a live handle", call);
    if (!alpha || !beta) return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: alpha or beta is NULL", call);
    if (algo && algo->data[0] != ALGO_MAGIC)
        return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: algo not from cublasLtMatmulAlgoGetHeuristic", call);
    const Layout *la = layout_of(Adesc), *lb = layout_of(Bdesc), *lc = layout_of(Cdesc), *ld = layout_of(Ddesc);
    Gemm g;
    cublasStatus_t s = plan(call, desc_of(computeDesc), la, lb, lc, ld, &g);
    if (s) return s;
    if (C == D && !same_layout(lc, ld)) return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: C == D with different layouts", call);
    memcpy(&g.alpha, alpha, sizeof g.alpha);
    memcpy(&g.beta, beta, sizeof g.beta);
    g.a = A, g.b = B, g.c = C, g.d = D;
    const Desc *dd = desc_of(computeDesc);
    size_t bias_bytes = 0, aux_bytes = 0, daux_bytes = 0;
    g.aux = NULL, g.daux = NULL, g.bgrad = 0, g.bgrad_out = NULL, g.bias = NULL;
    int backward = dd->epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD || dd->epilogue == CUBLASLT_EPILOGUE_BGRADA ||
                   dd->epilogue == CUBLASLT_EPILOGUE_BGRADB;
    if (backward && (s = bgrad_buffers(call, dd, ld, &g, &bias_bytes, &daux_bytes))) return s;
    if (dd->epilogue == CUBLASLT_EPILOGUE_BIAS || dd->epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) {
        if (!dd->bias) return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: EPILOGUE_BIAS without a BIAS_POINTER", call);
        if (dd->bias_type != -1 && dd->bias_type != ld->type)
            return fail(CUBLAS_STATUS_NOT_SUPPORTED, "%s: BIAS_DATA_TYPE %d, D is %d (the fake: D's type)", call, dd->bias_type, ld->type);
        bias_bytes = (size_t)g.m * (ld->type == CUDA_R_32F ? 4 : 2);
        char bwhy[512];
        if (bias_bytes && kiln_fake_cuda_check_range((CUdeviceptr)(uintptr_t)dd->bias, bias_bytes, bwhy, sizeof bwhy) != 0)
            return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: bias: %s", call, bwhy);
        const char *drop = getenv("KILN_FAKE_CUBLASLT_TEST_DROP_BIAS");
        g.bias = drop && strcmp(drop, "1") == 0 ? NULL : dd->bias;
    }
    if (dd->epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS && (s = gelu_aux(call, dd, ld, &g, &aux_bytes))) return s;
    if ((s = check_memory(call, "A", A, la)) || (s = check_memory(call, "B", B, lb)) ||
        (g.beta != 0.0f && (s = check_memory(call, "C", C, lc))) || (s = check_memory(call, "D", D, ld)))
        return s;
    if (algo && ((s = check_align(call, 'A', A, algo->data[1])) || (s = check_align(call, 'B', B, algo->data[2])) ||
                 (g.beta != 0.0f && (s = check_align(call, 'C', C, algo->data[3]))) ||
                 (s = check_align(call, 'D', D, algo->data[4]))))
        return s;
    char why[512];
    if (workspaceSizeInBytes && workspace &&
        kiln_fake_cuda_check_range((CUdeviceptr)(uintptr_t)workspace, workspaceSizeInBytes, why, sizeof why) != 0)
        return fail(CUBLAS_STATUS_INVALID_VALUE, "%s: workspace: %s", call, why);
    if (g.m == 0 || g.n == 0) return CUBLAS_STATUS_SUCCESS;
    size_t ea = la->type == CUDA_R_32F ? 4 : 2, eb = lb->type == CUDA_R_32F ? 4 : 2, ec = lc->type == CUDA_R_32F ? 4 : 2,
           ed = ld->type == CUDA_R_32F ? 4 : 2;
    KilnFakeAccess acc[] = {{(CUdeviceptr)(uintptr_t)A, span_bytes(la, ea), 0},
                            {(CUdeviceptr)(uintptr_t)B, span_bytes(lb, eb), 0},
                            {(CUdeviceptr)(uintptr_t)C, g.beta != 0.0f ? span_bytes(lc, ec) : 0, 0},
                            {(CUdeviceptr)(uintptr_t)D, span_bytes(ld, ed), 1},
                            {(CUdeviceptr)(uintptr_t)workspace, workspace ? workspaceSizeInBytes : 0, 1},
                            {(CUdeviceptr)(uintptr_t)dd->bias, bias_bytes, backward},
                            {(CUdeviceptr)(uintptr_t)dd->aux, aux_bytes ? aux_bytes : daux_bytes, !backward}};
    int nacc = 5;
    if (bias_bytes) acc[nacc++] = acc[5];
    if (aux_bytes || daux_bytes) acc[nacc++] = acc[6];
    CUresult r = kiln_fake_cuda_enqueue((CUstream)stream, "cublasLtMatmul", run_gemm, &g, sizeof g, acc, nacc);
    if (r != CUDA_SUCCESS) return fail(CUBLAS_STATUS_EXECUTION_FAILED, "%s: the fake driver refused the work (CUresult %d)", call, (int)r);
    return CUBLAS_STATUS_SUCCESS;
}
