/* check_epilogue.c — the fake cuBLASLt's backward epilogues (issue 23)
 * against the separate computation they replace.
 *
 * Linked against the REAL libcuda stub and libcublasLt.so.13, run with
 * LD_LIBRARY_PATH at the fakes (tests/t_cuda_epilogue_bwd.sh), like
 * selftest.c.  Column-major, cuBLASLt's own terms: D [m,n] = op(A) op(B),
 * op(A) [m,k], op(B) [k,n].  Prints TAP; exit 1 on a failure.
 *
 *   1. DGELU_BGRAD (bf16 and f32 D, AUX_LD 40 > m = 24 so that a wrong
 *      leading dimension reads other elements) against the separate path:
 *      the fake's plain GEMM into f32 (epilogue DEFAULT), then this file's
 *      dGELU — a central difference of the tanh GELU in double (h = 1e-4:
 *      error ~1e-9, independent of the fake's closed form) — and the row
 *      sums in double.  Tolerance, per element: bf16 D |err| <= 2^-7 |ref|
 *      + 1e-6 (one rounding to bf16 is at most 2^-8 relative: 8 significant
 *      bits), f32 D 1e-5 |ref| + 1e-6; the bias gradient, per entry, the same relative bound
 *      of the sum of |terms| (the fake sums unrounded values; so does this).
 *   2. BGRADA (op(A) = A, not transposed: the sums over k of A's rows,
 *      length m) and BGRADB (op(B) = B^T: the sums over k of op(B)'s
 *      columns, length n), f32 D, against host sums in double (1e-6
 *      relative of the sum of |terms|), and D against the plain GEMM (the
 *      same bits: the epilogue must not touch it).
 *   3. What cuBLASLt refuses (the library's messages, docs/decisions.md):
 *      BGRADA with a transposed A, BGRADB with a non-transposed B,
 *      AUX_LD 20 (not a multiple of 8), AUX_LD 16 (< m), no BIAS_POINTER,
 *      BIAS_DATA_TYPE f32 with a bf16 D, a misaligned bias gradient, two
 *      batches.
 * With KILN_FAKE_CUBLASLT_TEST_DGELU_AUX_LD=1 or
 * KILN_FAKE_CUBLASLT_TEST_BGRAD=half (the planted bugs) some of 1-2 must
 * fail; the test script checks that they do.
 */
#include <cublasLt.h>
#include <cuda.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int ntap, nfail;
static void tap(int ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s %d - ", ok ? "ok" : "not ok", ++ntap);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    nfail += !ok;
}

#define MUST(call)                                                                                                     \
    do {                                                                                                               \
        CUresult r_ = (call);                                                                                          \
        if (r_ != CUDA_SUCCESS) {                                                                                      \
            printf("not ok %d - %s: CUresult %d\n", ++ntap, #call, (int)r_);                                           \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double urand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (double)(rng >> 11) * (1.0 / 9007199254740992.0);
}
static uint16_t bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static double from_bf16(uint16_t v) {
    uint32_t u = (uint32_t)v << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static double gelu(double x) { return 0.5 * x * (1 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }
static double dgelu(double x) { return (gelu(x + 1e-4) - gelu(x - 1e-4)) / 2e-4; }

static CUstream stream;
static cublasLtHandle_t lt;

static CUdeviceptr upload(const void *h, size_t bytes) {
    CUdeviceptr p;
    MUST(cuMemAlloc(&p, bytes));
    MUST(cuMemcpyHtoD(p, h, bytes));
    return p;
}

/* What one call sets: the epilogue and its pointers and attributes. */
typedef struct {
    uint32_t ep;
    CUdeviceptr bias, aux;
    int64_t aux_ld;
    int32_t bias_type; /* -1: unset */
    int ta, tb, batch;
} Call;

/* D = op(A) op(B) with call c; D's type f32 or bf16.  The status of the
 * heuristic or of the matmul, whichever failed first. */
static cublasStatus_t matmul(const Call *c, int64_t m, int64_t n, int64_t k, CUdeviceptr A, CUdeviceptr B, CUdeviceptr D,
                             int d_f32) {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasStatus_t st;
    if ((st = cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F))) return st;
    int32_t opa = c->ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = c->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb);
    if (c->ep) cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &c->ep, sizeof c->ep);
    void *bias = (void *)(uintptr_t)c->bias, *aux = (void *)(uintptr_t)c->aux;
    if (bias) cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
    if (aux) cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux);
    if (c->aux_ld) cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &c->aux_ld, sizeof c->aux_ld);
    if (c->bias_type != -1)
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &c->bias_type, sizeof c->bias_type);
    cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, c->ta ? k : m, c->ta ? m : k, c->ta ? k : m);
    cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, c->tb ? n : k, c->tb ? k : n, c->tb ? n : k);
    cublasLtMatrixLayoutCreate(&ld, d_f32 ? CUDA_R_32F : CUDA_R_16BF, m, n, m);
    if (c->batch > 1) {
        cublasLtMatrixLayout_t ls[3] = {la, lb, ld};
        int64_t strides[3] = {0, 0, m * n};
        for (int i = 0; i < 3; i++) {
            int32_t b = c->batch;
            cublasLtMatrixLayoutSetAttribute(ls[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &b, sizeof b);
            cublasLtMatrixLayoutSetAttribute(ls[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &strides[i], sizeof strides[i]);
        }
    }
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    float alpha = 1, beta = 0;
    st = cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 1, &heur, &found);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmul(lt, desc, &alpha, (void *)(uintptr_t)A, la, (void *)(uintptr_t)B, lb, &beta, (void *)(uintptr_t)D,
                            ld, (void *)(uintptr_t)D, ld, &heur.algo, NULL, 0, (cudaStream_t)stream);
    if (st == CUBLAS_STATUS_SUCCESS && cuStreamSynchronize(stream) != CUDA_SUCCESS) st = CUBLAS_STATUS_EXECUTION_FAILED;
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(desc);
    return st;
}

/* element i of a downloaded D-typed buffer */
static double val(const void *h, int64_t i, int f32) { return f32 ? ((const float *)h)[i] : from_bf16(((const uint16_t *)h)[i]); }

static void *download(CUdeviceptr p, size_t bytes) {
    void *h = malloc(bytes);
    MUST(cuMemcpyDtoH(h, p, bytes));
    return h;
}

enum { M = 24, N = 20, KK = 16, LD = 40 };

static void check_dgelu(CUdeviceptr A, CUdeviceptr B, int f32) {
    size_t es = f32 ? 4 : 2;
    /* aux: the GELU input, LD x N, values in [-3, 3] (the padding rows too: a wrong ld reads them) */
    void *aux_h = malloc((size_t)LD * N * es);
    for (int64_t i = 0; i < (int64_t)LD * N; i++) {
        double x = -3 + 6 * urand();
        if (f32) ((float *)aux_h)[i] = (float)x;
        else ((uint16_t *)aux_h)[i] = bf16((float)x);
    }
    CUdeviceptr aux = upload(aux_h, (size_t)LD * N * es), D, P, db;
    MUST(cuMemAlloc(&D, (size_t)M * N * es)); MUST(cuMemAlloc(&P, (size_t)M * N * 4)); MUST(cuMemAlloc(&db, (size_t)M * es));
    Call plain = {0, 0, 0, 0, -1, 0, 0, 1}, c = {CUBLASLT_EPILOGUE_DGELU_BGRAD, db, aux, LD, -1, 0, 0, 1};
    cublasStatus_t s1 = matmul(&plain, M, N, KK, A, B, P, 1), s2 = matmul(&c, M, N, KK, A, B, D, f32);
    float *p = download(P, (size_t)M * N * 4);
    void *d = download(D, (size_t)M * N * es), *g = download(db, (size_t)M * es);
    double rel = f32 ? 1e-5 : ldexp(1, -7), wd = 0, wb = 0;
    for (int64_t i = 0; i < M; i++) {
        double sum = 0, mag = 0;
        for (int64_t j = 0; j < N; j++) {
            double ref = p[i + j * M] * dgelu(val(aux_h, i + j * LD, f32));
            sum += ref, mag += fabs(ref);
            wd = fmax(wd, fabs(val(d, i + j * M, f32) - ref) / (rel * fabs(ref) + 1e-6));
        }
        wb = fmax(wb, fabs(val(g, i, f32) - sum) / (rel * mag + 1e-6));
    }
    tap(s1 == 0 && s2 == 0 && wd <= 1 && wb <= 1,
        "DGELU_BGRAD, %s D, AUX_LD %d: dGELU(aux) x product within %.2g of the separate GEMM + dGELU (worst %.2f of it), "
        "bias gradient within that of the row sums (worst %.2f)",
        f32 ? "f32" : "bf16", LD, rel, wd, wb);
    free(aux_h), free(p), free(d), free(g);
}

static void check_bgrad(CUdeviceptr A, CUdeviceptr B, CUdeviceptr Bt, const uint16_t *a_h, const uint16_t *bt_h) {
    CUdeviceptr D, P, db;
    MUST(cuMemAlloc(&D, (size_t)M * N * 4)); MUST(cuMemAlloc(&P, (size_t)M * N * 4)); MUST(cuMemAlloc(&db, (size_t)(M > N ? M : N) * 4));
    for (int which = 0; which < 2; which++) { /* 0: BGRADA over A [M,K]; 1: BGRADB over op(B) = Bt^T, Bt [N,K] */
        Call plain = {0, 0, 0, 0, -1, 0, which, 1};
        Call c = {which ? CUBLASLT_EPILOGUE_BGRADB : CUBLASLT_EPILOGUE_BGRADA, db, 0, 0, -1, 0, which, 1};
        CUdeviceptr b = which ? Bt : B;
        cublasStatus_t s1 = matmul(&plain, M, N, KK, A, b, P, 1), s2 = matmul(&c, M, N, KK, A, b, D, 1);
        float *p = download(P, (size_t)M * N * 4), *d = download(D, (size_t)M * N * 4), *g = download(db, (size_t)(which ? N : M) * 4);
        double w = 0;
        int64_t len = which ? N : M;
        for (int64_t i = 0; i < len; i++) {
            double sum = 0, mag = 0;
            for (int64_t l = 0; l < KK; l++) {
                double v = which ? from_bf16(bt_h[i + l * N]) : from_bf16(a_h[i + l * M]);
                sum += v, mag += fabs(v);
            }
            w = fmax(w, fabs(g[i] - sum) / (1e-6 * mag + 1e-9));
        }
        tap(s1 == 0 && s2 == 0 && w <= 1 && memcmp(p, d, (size_t)M * N * 4) == 0,
            "%s: the bias gradient (%lld long) is the sum over k of %s within 1e-6 (worst %.2f of it), D the plain GEMM's bits",
            which ? "BGRADB" : "BGRADA", (long long)len, which ? "op(B) = B^T" : "A", w);
        free(p), free(d), free(g);
    }
}

static void check_refusals(CUdeviceptr A, CUdeviceptr B) {
    CUdeviceptr D, db, aux;
    MUST(cuMemAlloc(&D, (size_t)2 * M * N * 2)); MUST(cuMemAlloc(&db, (size_t)2 * M * 4)); MUST(cuMemAlloc(&aux, (size_t)LD * N * 2));
    const uint32_t DG = CUBLASLT_EPILOGUE_DGELU_BGRAD;
    const struct {
        Call c;
        int m, k;
        const char *what;
    } cases[] = {
        {{CUBLASLT_EPILOGUE_BGRADA, db, 0, 0, -1, 1, 0, 1}, M, KK, "BGRADA with a transposed A"},
        {{CUBLASLT_EPILOGUE_BGRADB, db, 0, 0, -1, 0, 0, 1}, M, KK, "BGRADB with a non-transposed B"},
        {{DG, db, aux, 20, -1, 0, 0, 1}, 16, KK, "DGELU_BGRAD with AUX_LD 20 (not a multiple of 8)"},
        {{DG, db, aux, 16, -1, 0, 0, 1}, M, KK, "DGELU_BGRAD with AUX_LD 16 < 24 rows"},
        {{DG, 0, aux, LD, -1, 0, 0, 1}, M, KK, "DGELU_BGRAD without a BIAS_POINTER"},
        {{DG, db, 0, LD, -1, 0, 0, 1}, M, KK, "DGELU_BGRAD without an AUX_POINTER"},
        {{DG, db, aux, LD, CUDA_R_32F, 0, 0, 1}, M, KK, "DGELU_BGRAD, bf16 D, BIAS_DATA_TYPE f32"},
        {{DG, db + 1, aux, LD, -1, 0, 0, 1}, M, KK, "DGELU_BGRAD with a bias gradient 1 byte off bf16's alignment"},
        {{DG, db, aux, LD, -1, 0, 0, 2}, M, KK, "DGELU_BGRAD with two batches"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cublasStatus_t st = matmul(&cases[i].c, cases[i].m, N, cases[i].k, A, B, D, 0);
        tap(st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE, "refused: %s (%s)", cases[i].what,
            cublasLtGetStatusString(st));
    }
}

int main(void) {
    CUcontext ctx;
    MUST(cuInit(0));
    MUST(cuDevicePrimaryCtxRetain(&ctx, 0));
    MUST(cuCtxSetCurrent(ctx));
    MUST(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) return printf("not ok 1 - cublasLtCreate\n"), 1;
    /* A [M,K] (also [K,M]-shaped data for the transposed refusals: M*M >= M*K), B [K,N], Bt [N,K] */
    uint16_t *a_h = malloc((size_t)M * M * 2), *b_h = malloc((size_t)KK * N * 2), *bt_h = malloc((size_t)N * KK * 2);
    for (int i = 0; i < M * M; i++) a_h[i] = bf16((float)(urand() * 2 - 1));
    for (int i = 0; i < KK * N; i++) b_h[i] = bf16((float)(urand() * 2 - 1)), bt_h[i] = bf16((float)(urand() * 2 - 1));
    CUdeviceptr A = upload(a_h, (size_t)M * M * 2), B = upload(b_h, (size_t)KK * N * 2), Bt = upload(bt_h, (size_t)N * KK * 2);
    check_dgelu(A, B, 0);
    check_dgelu(A, B, 1);
    check_bgrad(A, B, Bt, a_h, bt_h);
    check_refusals(A, B);
    printf("1..%d\n", ntap);
    free(a_h), free(b_h), free(bt_h);
    return nfail ? 1 : 0;
}
