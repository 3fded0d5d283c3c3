/* selftest.c — the fake CUDA stack (fake_cuda.c, fake_cublaslt.c,
 * fake_nccl.c) on its own, before a trainer runs on it.
 *
 * Built like the trainer: linked against the REAL libraries (the driver
 * stub, libcublasLt.so.13, libnccl.so.2) and run with LD_LIBRARY_PATH at
 * the fakes, so it also shows that the fakes satisfy a binary linked
 * against the real ones (tests/t_cuda_fake.sh runs it with LD_BIND_NOW=1:
 * a missing symbol or version fails at load).  It needs
 * KILN_FAKE_CUDA_KERNELS = a kernel library built from the kernels/cuda sources
 * (build_kernels.sh), and compiles kernels/cuda/layernorm.cu for sm_90 with
 * the repository's NVRTC code (compiler/emit/nvrtc_compile.c) to get a real
 * cubin.  It prints TAP, one line per property, and exits 1 on a failure.
 *
 * What it checks:
 *   - which libraries were loaded (dladdr: the fakes, not the toolkit's);
 *   - device, context and memory: the fake device's name and compute
 *     capability, 256-byte aligned allocations, copies and memsets, and the
 *     errors CUDA gives (0 bytes, a copy past an allocation, no current
 *     context on another thread);
 *   - modules and launches: a real sm_90 cubin loads; an sm_80 one, a
 *     non-ELF image and a missing kernel are refused; kiln_layernorm_fwd
 *     against a double-precision reference (|err| <= 2^-7 |ref| + 1e-3
 *     max|ref|, as tests/cuda_emu/check.cpp), a smaller grid giving the
 *     same bits; __launch_bounds__ and dynamic shared-memory limits
 *     (48 KiB, raised by cuFuncSetAttribute up to 227 KiB);
 *   - cuBLASLt: row-major GEMMs set up the way the runtime does (C^T =
 *     B^T A^T, column-major), all four transposes, strided batches with a
 *     broadcast (stride 0) operand, beta 0 with a NaN C (not read), beta 1,
 *     f32 and bf16 outputs, against a naive double reference (f32 D:
 *     |err| <= 2^-23 |ref| + 1e-12 sum|a b|; bf16 D: 2^-7 |ref| + the same:
 *     one rounding of the output costs at most half of that),
 *     and the refusals (wrong attribute size, mismatched shapes, a matrix
 *     past its allocation, unsupported types);
 *   - graph capture: a fork/join capture over two streams with a kernel, a
 *     copy, a GEMM and an NCCL all-reduce runs nothing while capturing,
 *     replays with the parameter values of capture time (the host variables
 *     are changed after the launch), re-reads its inputs at every replay,
 *     gives the eager bits, and the same in the reverse replay order and
 *     replayed concurrently (a thread per stream, the default); a
 *     capture with a missing join-event is right in enqueue order and WRONG
 *     in the reverse order (what KILN_FAKE_CUDA_GRAPH_ORDER=reverse is for)
 *     and, replayed concurrently, wrong on some try of 20;
 *     the capture errors (unjoined fork, synchronising a capturing stream,
 *     cuMemAlloc in a global capture but not a relaxed one, ending on
 *     another stream); event timing;
 *   - NCCL with one rank: the collectives as copies, in place, send/recv to
 *     itself in a group, and the refusals (a rank out of range, 65 ranks, a
 *     2-rank communicator nobody else joins: a timeout, ncclMax, a lone
 *     send to itself); several ranks are selftest_nccl.c's;
 *   - the happens-before check (KILN_FAKE_CUDA_STRICT=1; its count read
 *     with dlsym): no race in the correct fork/join work, eager or
 *     replayed; the capture without the join event reported in the
 *     enqueue-order replay too; on two streams, s1 reading what s0 wrote
 *     with an event is no race, without it one race (whatever the
 *     threads' timing), and with the event but
 *     KILN_FAKE_CUDA_TEST_DROP_WAIT=1 (the planted bug) one race; and,
 *     the streams being threads, s1 copying y with no event while s0's
 *     kernel writes it gets other bytes than y (tried up to 20 times);
 *   - last, faults as a GPU reports them: a kernel given a host pointer
 *     for its output launches fine, writes nothing, and the next
 *     cuStreamSynchronize is CUDA_ERROR_ILLEGAL_ADDRESS, sticky (a correct
 *     launch after it fails too); after the primary context is released
 *     and retained, an emulation error (a 48-thread block: a partial warp
 *     in the block reduction) also launches fine and fails the next
 *     synchronising call (cuMemcpyDtoH) with CUDA_ERROR_LAUNCH_FAILED,
 *     sticky until the context is released.
 * `selftest leak` and `selftest double-free` are for the strict-mode check
 * (KILN_FAKE_CUDA_STRICT=1 must turn them into exit status 1);
 * `selftest getfn NAME` prints what cuModuleGetFunction(NAME) gives on the
 * layernorm cubin (t_cuda_fake.sh: a kernel library whose kiln_layernorm_fwd
 * takes other parameters than the cubin's must be refused).
 */

#include <cublasLt.h>
#include <cuda.h>
#include <dlfcn.h>
#include <math.h>
#include <nccl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nvrtc_compile.h"

/* ---- TAP ---- */

static int tap_count, tap_failures;

__attribute__((format(printf, 2, 3))) static int tap(int ok, const char *fmt, ...) {
    char what[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    printf("%s %d - %s\n", ok ? "ok" : "not ok", ++tap_count, what);
    fflush(stdout);
    tap_failures += !ok;
    return ok;
}

static const char *cu_name(CUresult r) {
    const char *s = NULL;
    return cuGetErrorName(r, &s) == CUDA_SUCCESS && s ? s : "?";
}

/* How many races the fake driver's happens-before check reported (reset:
 * back to 0); -1 when the driver is not the fake (it has no such symbol). */
static int fake_races(int reset) {
    int (*races)(int) = (int (*)(int))dlsym(RTLD_DEFAULT, "kiln_fake_cuda_races");
    return races ? races(reset) : -1;
}

/* a call that must succeed; a failure is a "not ok" line */
static int must(CUresult r, const char *call) {
    if (r != CUDA_SUCCESS) tap(0, "%s: %s", call, cu_name(r));
    return r == CUDA_SUCCESS;
}
#define MUST(call) must((call), #call)

static int expect(CUresult got, CUresult want, const char *what) {
    return tap(got == want, "%s -> %s (want %s)", what, cu_name(got), cu_name(want));
}

static int lt_ok(cublasStatus_t s, const char *call) {
    if (s != CUBLAS_STATUS_SUCCESS) tap(0, "%s: %s", call, cublasLtGetStatusString(s));
    return s == CUBLAS_STATUS_SUCCESS;
}
#define LT(call) lt_ok((call), #call)

/* ---- data ---- */

static uint64_t rng = 88172645463325252ull;
static double urand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) * (1.0 / 9007199254740992.0);
}

static uint16_t bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static double from_bf16(uint16_t v) {
    uint32_t u = (uint32_t)v << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t *random_bf16(size_t n, double lo, double hi) {
    uint16_t *v = malloc(n * 2);
    for (size_t i = 0; i < n; i++) v[i] = bf16((float)(lo + (hi - lo) * urand()));
    return v;
}

static CUdeviceptr dev_alloc(size_t bytes) {
    CUdeviceptr p = 0;
    MUST(cuMemAlloc(&p, bytes));
    return p;
}

static CUdeviceptr dev_upload(const void *host, size_t bytes) {
    CUdeviceptr p = dev_alloc(bytes);
    MUST(cuMemcpyHtoD(p, host, bytes));
    return p;
}

/* ---- libraries, device, context, memory ---- */

static void check_loaded(void) {
    void *syms[3] = {(void *)cuInit, (void *)cublasLtCreate, (void *)ncclGetUniqueId};
    const char *names[3] = {"libcuda.so.1", "libcublasLt.so.13", "libnccl.so.2"};
    for (int i = 0; i < 3; i++) {
        Dl_info info;
        int found = dladdr(syms[i], &info) && info.dli_fname;
        const char *path = found ? info.dli_fname : "?";
        tap(found && !strstr(path, "/usr/local/cuda"), "%s loaded from %s (the fake, not the toolkit's)", names[i], path);
    }
}

static void *no_context_thread(void *out) {
    CUdeviceptr p;
    *(CUresult *)out = cuMemAlloc(&p, 64);
    return NULL;
}

static CUcontext check_device(void) {
    int count = -1, major = 0, minor = 0, sms = 0;
    char name[128] = "";
    CUdevice dev;
    CUcontext ctx = NULL;
    CUdeviceptr p;
    expect(cuMemAlloc(&p, 64), CUDA_ERROR_NOT_INITIALIZED, "cuMemAlloc before cuInit");
    MUST(cuInit(0));
    MUST(cuDeviceGetCount(&count));
    MUST(cuDeviceGet(&dev, 0));
    MUST(cuDeviceGetName(name, sizeof name, dev));
    MUST(cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
    MUST(cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
    MUST(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    tap(count == 1 && strcmp(name, "Fake GPU (kiln emulator)") == 0 && major == 9 && minor == 0 && sms > 0,
        "one device \"%s\", compute capability %d.%d, %d SMs", name, major, minor, sms);
    expect(cuDeviceGet(&dev, 1), CUDA_ERROR_INVALID_DEVICE, "cuDeviceGet(1)");
    expect(cuMemAlloc(&p, 64), CUDA_ERROR_INVALID_CONTEXT, "cuMemAlloc with no current context");
    MUST(cuDevicePrimaryCtxRetain(&ctx, 0));
    MUST(cuCtxSetCurrent(ctx));
    CUresult other = CUDA_SUCCESS;
    pthread_t t;
    if (pthread_create(&t, NULL, no_context_thread, &other) == 0) pthread_join(t, NULL);
    expect(other, CUDA_ERROR_INVALID_CONTEXT, "cuMemAlloc on a thread that never made the context current");
    const char *text = NULL;
    cuGetErrorString(CUDA_ERROR_INVALID_VALUE, &text);
    tap(text && strcmp(text, "invalid argument") == 0, "cuGetErrorString(CUDA_ERROR_INVALID_VALUE) = \"%s\"", text ? text : "");
    return ctx;
}

static void check_memory(void) {
    size_t sizes[] = {1, 1000, 4096, 3 << 20};
    CUdeviceptr p[4];
    int aligned = 1;
    for (int i = 0; i < 4; i++) aligned &= MUST(cuMemAlloc(&p[i], sizes[i])) && p[i] % 256 == 0;
    tap(aligned, "cuMemAlloc of 1, 1000, 4096, 3 MiB: 256-byte aligned");
    size_t free_b = 0, total_b = 0;
    MUST(cuMemGetInfo(&free_b, &total_b));
    tap(total_b >= (80ull << 30) - 1 && free_b < total_b, "cuMemGetInfo: %zu of %zu bytes free", free_b, total_b);
    unsigned char src[1000], back[1000];
    for (int i = 0; i < 1000; i++) src[i] = (unsigned char)(i * 7 + 1);
    int same = MUST(cuMemcpyHtoD(p[1], src, 1000)) && MUST(cuMemsetD8(p[2], 0xab, 4096)) &&
               MUST(cuMemcpyDtoDAsync(p[2] + 8, p[1], 1000, NULL)) && MUST(cuMemcpyDtoH(back, p[2] + 8, 1000)) &&
               memcmp(src, back, 1000) == 0;
    unsigned char edge[8];
    same &= MUST(cuMemcpyDtoH(edge, p[2], 8)) && edge[0] == 0xab && edge[7] == 0xab;
    tap(same, "HtoD, memset, DtoD (async, legacy stream), DtoH round trip");
    expect(cuMemcpyHtoD(p[1] + 900, src, 200), CUDA_ERROR_INVALID_VALUE, "HtoD 100 bytes past an allocation");
    expect(cuMemcpyDtoH(back, (CUdeviceptr)(uintptr_t)back, 10), CUDA_ERROR_INVALID_VALUE, "DtoH from a host address");
    CUdeviceptr z = 0;
    expect(cuMemAlloc(&z, 0), CUDA_ERROR_INVALID_VALUE, "cuMemAlloc(0 bytes)");
    for (int i = 0; i < 4; i++) MUST(cuMemFree(p[i]));
    void *host = NULL;
    tap(MUST(cuMemAllocHost(&host, 4096)) && MUST(cuMemFreeHost(host)), "cuMemAllocHost, cuMemFreeHost");
}

/* ---- modules and the layernorm kernel ---- */

typedef struct {
    CUmodule mod;
    CUfunction fwd;
    void *image; /* the cubin, to load again in a new context */
} Layernorm;

static int load_layernorm(Layernorm *ln) {
    KilnCubin cubin;
    char err[4096];
    if (kiln_nvrtc_compile_file("kernels/cuda/layernorm.cu", "sm_90", KILN_NVRTC_WARNINGS_OK, &cubin, err, sizeof err) != 0)
        return tap(0, "NVRTC: kernels/cuda/layernorm.cu for sm_90: %s", err);
    const char junk[] = "this is not a cubin";
    CUmodule m;
    expect(cuModuleLoadData(&m, junk), CUDA_ERROR_INVALID_IMAGE, "cuModuleLoadData(not an ELF image)");
    unsigned char *sm80 = malloc(cubin.size);
    memcpy(sm80, cubin.data, cubin.size);
    uint32_t flags;
    memcpy(&flags, sm80 + 48, 4); /* e_flags: the arch in bits 8..15 (cubin ELF ABI 8) */
    flags = (flags & ~0xff00u) | (80u << 8);
    memcpy(sm80 + 48, &flags, 4);
    expect(cuModuleLoadData(&m, sm80), CUDA_ERROR_NO_BINARY_FOR_GPU, "cuModuleLoadData(the cubin marked sm_80)");
    free(sm80);
    int ok = MUST(cuModuleLoadData(&ln->mod, cubin.data));
    ln->image = malloc(cubin.size);
    memcpy(ln->image, cubin.data, cubin.size);
    memset(cubin.data, 0, cubin.size); /* the driver keeps its own copy */
    kiln_cubin_free(&cubin);
    if (!ok) return 0;
    CUfunction again;
    ok = MUST(cuModuleGetFunction(&ln->fwd, ln->mod, "kiln_layernorm_fwd")) &&
         MUST(cuModuleGetFunction(&again, ln->mod, "kiln_layernorm_fwd"));
    tap(ok && again == ln->fwd, "cuModuleLoadData (NVRTC sm_90 cubin) + cuModuleGetFunction(kiln_layernorm_fwd), same handle twice");
    /* (a failing lookup, a name the module lacks, is `selftest getfn`'s:
     * under KILN_FAKE_CUDA_STRICT=1 it makes the exit status 1) */
    /* the module's kernels as dev_cuda.c lists them at load: layernorm.cu
     * has kiln_layernorm_fwd, _bwd and _bwd_reduce (kernels/cuda/README.md),
     * not its device helpers; the listed handle is cuModuleGetFunction's */
    unsigned count = 0;
    int listed = MUST(cuModuleGetFunctionCount(&count, ln->mod));
    CUfunction fs[8];
    const char *names[8] = {0};
    int found_fwd = 0, names_ok = listed && count == 3;
    if (names_ok) {
        expect(cuModuleEnumerateFunctions(fs, 2, ln->mod), CUDA_ERROR_INVALID_VALUE, "cuModuleEnumerateFunctions(fewer than the count)");
        names_ok = MUST(cuModuleEnumerateFunctions(fs, count, ln->mod));
        for (unsigned i = 0; names_ok && i < count; i++) {
            names_ok = MUST(cuFuncGetName(&names[i], fs[i])) && names[i] && strncmp(names[i], "kiln_layernorm_", 15) == 0;
            if (names_ok && strcmp(names[i], "kiln_layernorm_fwd") == 0) found_fwd += fs[i] == ln->fwd;
        }
    }
    tap(names_ok && found_fwd == 1,
        "cuModuleGetFunctionCount = %u (want 3), cuModuleEnumerateFunctions + cuFuncGetName: %s %s %s (kiln_layernorm_*; "
        "kiln_layernorm_fwd's handle is cuModuleGetFunction's: %d)",
        count, names[0] ? names[0] : "?", names[1] ? names[1] : "?", names[2] ? names[2] : "?", found_fwd);
    return ok;
}

/* y = layernorm(x) * w + b in double (ops.def), from the same bf16 inputs */
static void layernorm_ref(const uint16_t *x, const uint16_t *w, const uint16_t *b, double *y, long long rows,
                          long long C, double eps) {
    for (long long r = 0; r < rows; r++) {
        double mean = 0, var = 0;
        for (long long c = 0; c < C; c++) mean += from_bf16(x[r * C + c]);
        mean /= (double)C;
        for (long long c = 0; c < C; c++) var += pow(from_bf16(x[r * C + c]) - mean, 2);
        var /= (double)C;
        for (long long c = 0; c < C; c++)
            y[r * C + c] = (from_bf16(x[r * C + c]) - mean) / sqrt(var + eps) * from_bf16(w[c]) + from_bf16(b[c]);
    }
}

/* worst |got - ref| / (2^-7 |ref| + 1e-3 max|ref|): <= 1 passes */
static double layernorm_error(const uint16_t *got, const double *ref, size_t n) {
    double big = 0, worst = 0;
    for (size_t i = 0; i < n; i++) big = fmax(big, fabs(ref[i]));
    for (size_t i = 0; i < n; i++) {
        double e = fabs(from_bf16(got[i]) - ref[i]) / (ldexp(fabs(ref[i]), -7) + 1e-3 * big);
        worst = isnan(e) ? INFINITY : fmax(worst, e);
    }
    return worst;
}

enum { LN_ROWS = 37, LN_C = 200 };

typedef struct {
    CUdeviceptr x, w, b, y;
    uint16_t *hx, *hw, *hb;
} LnData;

static void ln_data(LnData *d) {
    d->hx = random_bf16(LN_ROWS * LN_C, -2, 3);
    d->hw = random_bf16(LN_C, 0.5, 1.5);
    d->hb = random_bf16(LN_C, -0.5, 0.5);
    d->x = dev_upload(d->hx, LN_ROWS * LN_C * 2);
    d->w = dev_upload(d->hw, LN_C * 2);
    d->b = dev_upload(d->hb, LN_C * 2);
    d->y = dev_alloc(LN_ROWS * LN_C * 2);
}

static void ln_free(LnData *d) {
    CUdeviceptr p[4] = {d->x, d->w, d->b, d->y};
    for (int i = 0; i < 4; i++) MUST(cuMemFree(p[i]));
    free(d->hx), free(d->hw), free(d->hb);
}

static CUresult launch_ln(CUfunction f, const LnData *d, CUdeviceptr y, unsigned grid, unsigned block, unsigned smem,
                          CUstream s) {
    long long rows = LN_ROWS, C = LN_C;
    double eps = 1e-5;
    CUdeviceptr x = d->x, w = d->w, b = d->b;
    void *params[] = {&x, &w, &b, &y, &rows, &C, &eps};
    return cuLaunchKernel(f, grid, 1, 1, block, 1, 1, smem, s, params, NULL);
}

static void check_layernorm(const Layernorm *ln) {
    LnData d;
    ln_data(&d);
    CUstream s;
    MUST(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    size_t n = LN_ROWS * LN_C;
    uint16_t *got = malloc(n * 2), *got_small = malloc(n * 2);
    double *ref = malloc(n * sizeof(double));
    layernorm_ref(d.hx, d.hw, d.hb, ref, LN_ROWS, LN_C, 1e-5);
    MUST(cuMemsetD8(d.y, 0xff, n * 2));
    int ok = MUST(launch_ln(ln->fwd, &d, d.y, LN_ROWS, 256, 0, s)) && MUST(cuStreamSynchronize(s)) &&
             MUST(cuMemcpyDtoH(got, d.y, n * 2));
    double err = layernorm_error(got, ref, n);
    tap(ok && err <= 1, "kiln_layernorm_fwd %dx%d on the emulator vs double reference: worst error %.3f of tolerance", LN_ROWS,
        LN_C, err);
    MUST(cuMemsetD8(d.y, 0xff, n * 2));
    ok = MUST(launch_ln(ln->fwd, &d, d.y, 5, 256, 0, s)) && MUST(cuStreamSynchronize(s)) &&
         MUST(cuMemcpyDtoH(got_small, d.y, n * 2));
    tap(ok && memcmp(got, got_small, n * 2) == 0, "kiln_layernorm_fwd with grid 5 (grid-stride): the same bits");
    expect(launch_ln(ln->fwd, &d, d.y, LN_ROWS, 512, 0, s), CUDA_ERROR_INVALID_VALUE,
           "launch with a 512-thread block (__launch_bounds__(256))");
    expect(launch_ln(ln->fwd, &d, d.y, 0, 256, 0, s), CUDA_ERROR_INVALID_VALUE, "launch with grid 0");
    expect(launch_ln(ln->fwd, &d, d.y, LN_ROWS, 256, 64 << 10, s), CUDA_ERROR_INVALID_VALUE,
           "launch with 64 KiB of dynamic shared memory, limit not raised");
    expect(cuFuncSetAttribute(ln->fwd, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 228 << 10), CUDA_ERROR_INVALID_VALUE,
           "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES, 228 KiB)");
    tap(MUST(cuFuncSetAttribute(ln->fwd, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 227 << 10)) &&
            MUST(launch_ln(ln->fwd, &d, d.y, LN_ROWS, 256, 64 << 10, s)),
        "launch with 64 KiB after raising the limit to 227 KiB");
    MUST(cuStreamDestroy(s));
    expect(cuStreamSynchronize(s), CUDA_ERROR_INVALID_HANDLE, "cuStreamSynchronize(a destroyed stream)");
    ln_free(&d);
    free(got), free(got_small), free(ref);
}

/* ---- cuBLASLt ---- */

typedef struct {
    cublasLtHandle_t lt;
    CUdeviceptr workspace;
} Blas;

/* Row-major C[b] (M x N) = op(A[b]) op(B[b]) (+ C[b] when beta), as the
 * runtime's rtk_gemm sets it up: column-major D^T = op(B)^T op(A)^T. */
static cublasStatus_t gemm_rowmajor(const Blas *bl, int ta, int tb, long long M, long long N, long long K, int batch,
                                    long long sa, long long sb, long long sc, float beta, int c_f32, CUdeviceptr A,
                                    CUdeviceptr B, CUdeviceptr C, CUstream s) {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulPreference_t pref;
    int32_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N; /* swapped operands */
    cudaDataType_t ct = c_f32 ? CUDA_R_32F : CUDA_R_16BF;
    cublasStatus_t st;
    if ((st = cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F))) return st;
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb);
    /* operand "A" is B: [K,N] row-major = [N,K] column-major (ld N), or [N,K] (tb) = [K,N] (ld K) */
    cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, tb ? K : N, tb ? N : K, tb ? K : N);
    cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, ta ? M : K, ta ? K : M, ta ? M : K);
    cublasLtMatrixLayoutCreate(&lc, ct, N, M, N);
    cublasLtMatrixLayout_t layouts[3] = {la, lb, lc};
    int64_t strides[3] = {sb, sa, sc};
    for (int i = 0; i < 3; i++) {
        int32_t bc = batch;
        cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc);
        cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &strides[i], sizeof strides[i]);
    }
    cublasLtMatmulPreferenceCreate(&pref);
    uint64_t ws = 32 << 20;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    st = cublasLtMatmulAlgoGetHeuristic(bl->lt, desc, la, lb, lc, lc, pref, 1, &heur, &found);
    if (st == CUBLAS_STATUS_SUCCESS && found != 1) st = CUBLAS_STATUS_NOT_SUPPORTED;
    float alpha = 1.0f;
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmul(bl->lt, desc, &alpha, (void *)(uintptr_t)B, la, (void *)(uintptr_t)A, lb, &beta,
                            (void *)(uintptr_t)C, lc, (void *)(uintptr_t)C, lc, &heur.algo, (void *)(uintptr_t)bl->workspace,
                            ws, (cudaStream_t)s);
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(desc);
    return st;
}

/* worst error / tolerance of row-major C (f32 or bf16) against the double reference */
static double gemm_error(int ta, int tb, long long M, long long N, long long K, int batch, long long sa, long long sb,
                         long long sc, float beta, const uint16_t *A, const uint16_t *B, const void *c_before,
                         const void *c_after, int c_f32) {
    double worst = 0;
    for (int bt = 0; bt < batch; bt++)
        for (long long i = 0; i < M; i++)
            for (long long j = 0; j < N; j++) {
                double ref = 0, mag = 0;
                for (long long l = 0; l < K; l++) {
                    double a = from_bf16(A[bt * sa + (ta ? l * M + i : i * K + l)]);
                    double b = from_bf16(B[bt * sb + (tb ? j * K + l : l * N + j)]);
                    ref += a * b, mag += fabs(a * b);
                }
                long long ci = bt * sc + i * N + j;
                if (beta != 0.0f) {
                    double c = c_f32 ? ((const float *)c_before)[ci] : from_bf16(((const uint16_t *)c_before)[ci]);
                    ref += c, mag += fabs(c);
                }
                double got = c_f32 ? ((const float *)c_after)[ci] : from_bf16(((const uint16_t *)c_after)[ci]);
                double tol = ldexp(fabs(ref), c_f32 ? -23 : -7) + 1e-12 * mag + 1e-30;
                double e = fabs(got - ref) / tol;
                worst = isnan(e) ? INFINITY : fmax(worst, e);
            }
    return worst;
}

static void gemm_case(const Blas *bl, int ta, int tb, int batch, int a_broadcast, float beta, int c_f32) {
    const long long M = 33, N = 17, K = 40;
    long long sa = a_broadcast ? 0 : M * K, sb = K * N, sc = M * N;
    size_t na = (size_t)(a_broadcast ? 1 : batch) * M * K, nb = (size_t)batch * K * N, nc = (size_t)batch * M * N;
    size_t csize = c_f32 ? 4 : 2;
    uint16_t *A = random_bf16(na, -1, 1), *B = random_bf16(nb, -1, 1);
    unsigned char *c_before = malloc(nc * csize), *c_after = malloc(nc * csize);
    for (size_t i = 0; i < nc; i++) {
        if (beta == 0.0f) { /* NaN: must not be read */
            if (c_f32) ((float *)c_before)[i] = NAN;
            else ((uint16_t *)c_before)[i] = 0x7fc0;
        } else if (c_f32) ((float *)c_before)[i] = (float)(urand() - 0.5);
        else ((uint16_t *)c_before)[i] = bf16((float)(urand() - 0.5));
    }
    CUdeviceptr dA = dev_upload(A, na * 2), dB = dev_upload(B, nb * 2), dC = dev_upload(c_before, nc * csize);
    cublasStatus_t st = gemm_rowmajor(bl, ta, tb, M, N, K, batch, sa, sb, sc, beta, c_f32, dA, dB, dC, NULL);
    int ok = lt_ok(st, "cublasLtMatmul") && MUST(cuMemcpyDtoH(c_after, dC, nc * csize));
    double err = ok ? gemm_error(ta, tb, M, N, K, batch, sa, sb, sc, beta, A, B, c_before, c_after, c_f32) : INFINITY;
    tap(ok && err <= 1, "GEMM ta=%d tb=%d batch %d%s beta %g, C %s: worst error %.3f of tolerance", ta, tb, batch,
        a_broadcast ? " (A stride 0)" : "", beta, c_f32 ? "f32" : "bf16", err);
    MUST(cuMemFree(dA)), MUST(cuMemFree(dB)), MUST(cuMemFree(dC));
    free(A), free(B), free(c_before), free(c_after);
}

static void check_gemm_errors(const Blas *bl) {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t l;
    LT(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT(cublasLtMatrixLayoutCreate(&l, CUDA_R_16BF, 4, 4, 4));
    int64_t wide = 2;
    tap(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &wide, sizeof wide) ==
            CUBLAS_STATUS_INVALID_VALUE,
        "cuBLASLt: BATCH_COUNT set from an int64 (the attribute is int32) -> INVALID_VALUE");
    int32_t order = 1;
    tap(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_ORDER, &order, sizeof order) == CUBLAS_STATUS_NOT_SUPPORTED,
        "cuBLASLt: an attribute outside the contract (ORDER) -> NOT_SUPPORTED");
    LT(cublasLtMatrixLayoutDestroy(l));
    LT(cublasLtMatmulDescDestroy(desc));
    CUdeviceptr small = dev_alloc(64);
    /* 33x17x40 into a 64-byte C: past the allocation */
    tap(gemm_rowmajor(bl, 0, 0, 33, 17, 40, 1, 0, 0, 0, 0.0f, 1, small, small, small, NULL) == CUBLAS_STATUS_INVALID_VALUE,
        "cuBLASLt: matrices past their allocation -> INVALID_VALUE");
    MUST(cuMemFree(small));
    cublasLtMatrixLayout_t a, b, c;
    LT(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT(cublasLtMatrixLayoutCreate(&a, CUDA_R_32F, 4, 4, 4));
    LT(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, 5, 4, 5));
    LT(cublasLtMatrixLayoutCreate(&c, CUDA_R_32F, 4, 4, 4));
    cublasLtMatmulPreference_t pref;
    LT(cublasLtMatmulPreferenceCreate(&pref));
    cublasLtMatmulHeuristicResult_t h;
    int found = 0;
    tap(cublasLtMatmulAlgoGetHeuristic(bl->lt, desc, a, b, c, c, pref, 1, &h, &found) == CUBLAS_STATUS_NOT_SUPPORTED && !found,
        "cuBLASLt: an f32 A -> NOT_SUPPORTED");
    LT(cublasLtMatrixLayoutDestroy(a));
    LT(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, 4, 4, 4));
    tap(cublasLtMatmulAlgoGetHeuristic(bl->lt, desc, a, b, c, c, pref, 1, &h, &found) == CUBLAS_STATUS_INVALID_VALUE,
        "cuBLASLt: op(A) 4x4 times op(B) 5x4 -> INVALID_VALUE");
    LT(cublasLtMatmulPreferenceDestroy(pref));
    LT(cublasLtMatrixLayoutDestroy(a)), LT(cublasLtMatrixLayoutDestroy(b)), LT(cublasLtMatrixLayoutDestroy(c));
    LT(cublasLtMatmulDescDestroy(desc));
}

static void check_gemm(Blas *bl) {
    if (!LT(cublasLtCreate(&bl->lt))) return;
    bl->workspace = dev_alloc(32 << 20);
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) gemm_case(bl, ta, tb, 1, 0, 0.0f, 1);
    gemm_case(bl, 0, 1, 3, 0, 0.0f, 0);
    gemm_case(bl, 1, 0, 3, 1, 1.0f, 1);
    gemm_case(bl, 0, 0, 2, 1, 1.0f, 0);
    check_gemm_errors(bl);
}

/* ---- graph capture ---- */

typedef struct {
    CUstream s0, s1;
    CUevent fork, join;
    LnData d;
    CUdeviceptr copy, gemm_out, reduced;
} Capture;

/* What the captured graph computes, on s0: y = layernorm(x); on s1: copy =
 * x, gemm_out = x[0:4,:] x w-ish (row-major [4, C] = x4 [4, C] x I... a GEMM
 * of x's first rows with itself transposed), reduced = allreduce(copy).
 * `join` 0 leaves s1 unjoined until after an extra copy of y that races. */
static CUresult enqueue_work(Capture *c, const Blas *bl, CUfunction fwd, ncclComm_t comm, int race) {
    CUresult r;
    if ((r = cuEventRecord(c->fork, c->s0)) || (r = cuStreamWaitEvent(c->s1, c->fork, 0))) return r;
    if ((r = launch_ln(fwd, &c->d, c->d.y, LN_ROWS, 256, 0, c->s0))) return r;
    if ((r = cuMemcpyDtoDAsync(c->copy, race ? c->d.y : c->d.x, LN_ROWS * LN_C * 2, c->s1))) return r;
    if (gemm_rowmajor(bl, 0, 1, 4, 4, LN_C, 1, 0, 0, 0, 0.0f, 1, c->d.x, c->d.x, c->gemm_out, c->s1) != CUBLAS_STATUS_SUCCESS)
        return CUDA_ERROR_UNKNOWN;
    if (ncclAllReduce((void *)(uintptr_t)c->copy, (void *)(uintptr_t)c->reduced, LN_ROWS * LN_C, ncclBfloat16, ncclSum, comm,
                      (cudaStream_t)c->s1) != ncclSuccess)
        return CUDA_ERROR_UNKNOWN;
    if ((r = cuEventRecord(c->join, c->s1)) || (r = cuStreamWaitEvent(c->s0, c->join, 0))) return r;
    return CUDA_SUCCESS;
}

typedef struct {
    uint16_t *y, *copy, *reduced;
    float gemm[16];
} Results;

static void results_alloc(Results *r) {
    r->y = malloc(LN_ROWS * LN_C * 2), r->copy = malloc(LN_ROWS * LN_C * 2), r->reduced = malloc(LN_ROWS * LN_C * 2);
}
static void results_free(Results *r) { free(r->y), free(r->copy), free(r->reduced); }

static int fetch(const Capture *c, Results *r) {
    size_t n = LN_ROWS * LN_C * 2;
    return MUST(cuMemcpyDtoH(r->y, c->d.y, n)) && MUST(cuMemcpyDtoH(r->copy, c->copy, n)) &&
           MUST(cuMemcpyDtoH(r->reduced, c->reduced, n)) && MUST(cuMemcpyDtoH(r->gemm, c->gemm_out, sizeof r->gemm));
}

static int same_results(const Results *a, const Results *b) {
    size_t n = LN_ROWS * LN_C * 2;
    return !memcmp(a->y, b->y, n) && !memcmp(a->copy, b->copy, n) && !memcmp(a->reduced, b->reduced, n) &&
           !memcmp(a->gemm, b->gemm, sizeof a->gemm);
}

static void poison(const Capture *c) {
    size_t n = LN_ROWS * LN_C * 2;
    MUST(cuMemsetD8(c->d.y, 0xff, n)), MUST(cuMemsetD8(c->copy, 0xff, n)), MUST(cuMemsetD8(c->reduced, 0xff, n)),
        MUST(cuMemsetD8(c->gemm_out, 0xff, 64));
}

static int all_poisoned(const Results *r) {
    for (size_t i = 0; i < LN_ROWS * LN_C; i++)
        if (r->y[i] != 0xffff || r->copy[i] != 0xffff || r->reduced[i] != 0xffff) return 0;
    return 1;
}

/* capture the work into a graph (NULL + a "not ok" on failure) */
static CUgraph capture(Capture *c, const Blas *bl, CUfunction fwd, ncclComm_t comm, int race) {
    CUgraph g = NULL;
    if (!MUST(cuStreamBeginCapture(c->s0, CU_STREAM_CAPTURE_MODE_GLOBAL))) return NULL;
    CUresult r = enqueue_work(c, bl, fwd, comm, race);
    CUresult e = cuStreamEndCapture(c->s0, &g);
    if (r || e) tap(0, "capture: %s / %s", cu_name(r), cu_name(e));
    return r || e ? NULL : g;
}

static int replay(const Capture *c, CUgraph g, const char *order, Results *out) {
    CUgraphExec x;
    setenv("KILN_FAKE_CUDA_GRAPH_ORDER", order, 1); /* "": concurrently */
    int ok = MUST(cuGraphInstantiate(&x, g, 0));
    unsetenv("KILN_FAKE_CUDA_GRAPH_ORDER");
    if (!ok) return 0;
    poison(c);
    ok = MUST(cuGraphLaunch(x, c->s0)) && MUST(cuStreamSynchronize(c->s0)) && fetch(c, out);
    MUST(cuGraphExecDestroy(x));
    return ok;
}

static void check_capture_errors(Capture *c, CUfunction fwd) {
    CUgraph g = NULL;
    /* a fork never joined */
    MUST(cuStreamBeginCapture(c->s0, CU_STREAM_CAPTURE_MODE_GLOBAL));
    MUST(cuEventRecord(c->fork, c->s0)), MUST(cuStreamWaitEvent(c->s1, c->fork, 0));
    MUST(launch_ln(fwd, &c->d, c->d.y, LN_ROWS, 256, 0, c->s1));
    expect(cuStreamEndCapture(c->s0, &g), CUDA_ERROR_STREAM_CAPTURE_UNJOINED, "end capture with work on a forked stream not joined");
    /* synchronising the capturing stream */
    MUST(cuStreamBeginCapture(c->s0, CU_STREAM_CAPTURE_MODE_GLOBAL));
    expect(cuStreamSynchronize(c->s0), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "cuStreamSynchronize of the capturing stream");
    expect(cuStreamEndCapture(c->s0, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "then cuStreamEndCapture");
    /* unsafe calls: global vs relaxed */
    CUdeviceptr p = 0;
    MUST(cuStreamBeginCapture(c->s0, CU_STREAM_CAPTURE_MODE_GLOBAL));
    expect(cuMemAlloc(&p, 256), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "cuMemAlloc during a global capture");
    expect(cuStreamEndCapture(c->s0, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "then cuStreamEndCapture");
    MUST(cuStreamBeginCapture(c->s0, CU_STREAM_CAPTURE_MODE_RELAXED));
    tap(MUST(cuMemAlloc(&p, 256)) && MUST(cuMemFree(p)), "cuMemAlloc/cuMemFree during a relaxed capture");
    tap(MUST(cuStreamEndCapture(c->s0, &g)) && g && MUST(cuGraphDestroy(g)), "an empty relaxed capture ends");
    /* ending on the wrong stream */
    MUST(cuStreamBeginCapture(c->s0, CU_STREAM_CAPTURE_MODE_GLOBAL));
    MUST(cuEventRecord(c->fork, c->s0)), MUST(cuStreamWaitEvent(c->s1, c->fork, 0));
    expect(cuStreamEndCapture(c->s1, &g), CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, "cuStreamEndCapture on the joined stream");
    expect(cuStreamEndCapture(c->s0, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "then on the origin stream");
    /* timing */
    CUevent t0, t1;
    float ms = -1;
    MUST(cuEventCreate(&t0, CU_EVENT_DEFAULT)), MUST(cuEventCreate(&t1, CU_EVENT_DEFAULT));
    int timed = MUST(cuEventRecord(t0, c->s0)) && MUST(cuEventRecord(t1, c->s0)) && MUST(cuEventSynchronize(t1)) &&
                MUST(cuEventElapsedTime(&ms, t0, t1));
    tap(timed && ms >= 0, "cuEventElapsedTime between two recorded events: %.3f ms", ms);
    expect(cuEventElapsedTime(&ms, c->fork, c->join), CUDA_ERROR_INVALID_HANDLE, "cuEventElapsedTime of DISABLE_TIMING events");
    MUST(cuEventDestroy(t0)), MUST(cuEventDestroy(t1));
}

static void check_capture(const Blas *bl, CUfunction fwd, ncclComm_t comm) {
    Capture c;
    ln_data(&c.d);
    size_t n = LN_ROWS * LN_C * 2;
    c.copy = dev_alloc(n), c.reduced = dev_alloc(n), c.gemm_out = dev_alloc(64);
    MUST(cuStreamCreate(&c.s0, CU_STREAM_NON_BLOCKING)), MUST(cuStreamCreate(&c.s1, CU_STREAM_NON_BLOCKING));
    MUST(cuEventCreate(&c.fork, CU_EVENT_DISABLE_TIMING)), MUST(cuEventCreate(&c.join, CU_EVENT_DISABLE_TIMING));
    Results eager, during, graph, rev, again, fresh;
    results_alloc(&eager), results_alloc(&during), results_alloc(&graph), results_alloc(&rev), results_alloc(&again),
        results_alloc(&fresh);

    poison(&c);
    int ok = MUST(enqueue_work(&c, bl, fwd, comm, 0)) && MUST(cuStreamSynchronize(c.s0)) && fetch(&c, &eager);
    tap(ok && memcmp(eager.copy, c.d.hx, n) == 0 && memcmp(eager.reduced, c.d.hx, n) == 0,
        "eager fork/join work on two streams: copy and all-reduce (1 rank) equal x");
    poison(&c);
    CUgraph g = capture(&c, bl, fwd, comm, 0);
    ok = g && fetch(&c, &during);
    tap(ok && all_poisoned(&during), "nothing runs while capturing (kernel, copy, GEMM, all-reduce recorded)");
    ok = ok && replay(&c, g, "enqueue", &graph);
    tap(ok && same_results(&eager, &graph), "cuGraphLaunch replays it: the eager bits");
    ok = ok && replay(&c, g, "reverse", &rev);
    tap(ok && same_results(&eager, &rev), "replayed in the reverse order (KILN_FAKE_CUDA_GRAPH_ORDER=reverse): the same bits");
    ok = ok && replay(&c, g, "", &rev);
    tap(ok && same_results(&eager, &rev), "replayed concurrently (the default: a thread per stream): the same bits");
    /* new inputs are read at replay */
    uint16_t *x2 = random_bf16(LN_ROWS * LN_C, -1, 1);
    MUST(cuMemcpyHtoD(c.d.x, x2, n));
    ok = ok && replay(&c, g, "enqueue", &again);
    poison(&c);
    ok = ok && MUST(enqueue_work(&c, bl, fwd, comm, 0)) && MUST(cuStreamSynchronize(c.s0)) && fetch(&c, &fresh);
    tap(ok && same_results(&again, &fresh) && memcmp(again.copy, x2, n) == 0,
        "after new x is uploaded, the replay computes from it (the eager result on the new x)");
    if (g) MUST(cuGraphDestroy(g));
    /* parameter values are copied at capture time: a kernel launched with
     * rows = 0 (nothing written) while the host variable says otherwise */
    {
        CUgraph g2 = NULL;
        CUgraphExec x2e;
        long long rows = LN_ROWS, C = LN_C;
        double eps = 1e-5;
        CUdeviceptr px = c.d.x, pw = c.d.w, pb = c.d.b, py = c.d.y;
        void *params[] = {&px, &pw, &pb, &py, &rows, &C, &eps};
        MUST(cuStreamBeginCapture(c.s0, CU_STREAM_CAPTURE_MODE_GLOBAL));
        MUST(cuLaunchKernel(fwd, LN_ROWS, 1, 1, 256, 1, 1, 0, c.s0, params, NULL));
        rows = 0, py = 0; /* would write nothing / fault if read at replay */
        ok = MUST(cuStreamEndCapture(c.s0, &g2)) && MUST(cuGraphInstantiate(&x2e, g2, 0));
        poison(&c);
        ok = ok && MUST(cuGraphLaunch(x2e, c.s0)) && MUST(cuStreamSynchronize(c.s0)) && MUST(cuMemcpyDtoH(graph.y, c.d.y, n));
        tap(ok && memcmp(graph.y, fresh.y, n) == 0, "kernel parameters are the values at capture time (host variables changed after)");
        if (ok) MUST(cuGraphExecDestroy(x2e));
        if (g2) MUST(cuGraphDestroy(g2));
    }
    int clean = fake_races(1);
    tap(clean == 0, "the happens-before check: no race in the fork/join work above, eager or replayed (%d reported)", clean);
    /* a missing event between the streams: s1 copies y, which s0's kernel writes */
    CUgraph gr = capture(&c, bl, fwd, comm, 1);
    ok = gr && replay(&c, gr, "enqueue", &graph);
    int seen = fake_races(1);
    ok = ok && replay(&c, gr, "reverse", &rev);
    tap(ok && memcmp(graph.copy, graph.y, n) == 0 && memcmp(rev.copy, rev.y, n) != 0,
        "a race (s1 reads y with no event after s0's kernel): right in enqueue order, caught by the reverse order");
    tap(ok && seen == 1 && fake_races(1) >= 1,
        "the same race caught by the happens-before check in the enqueue-order replay too (%d race reported)", seen);
    int tries = 0, differed = 0;
    while (ok && !differed && tries++ < 20) differed = replay(&c, gr, "", &rev) && memcmp(rev.copy, rev.y, n) != 0;
    fake_races(1);
    tap(differed, "replayed concurrently, the race can go wrong too (s1's copy differed from y on try %d)", tries);
    if (gr) MUST(cuGraphDestroy(gr));
    check_capture_errors(&c, fwd);

    MUST(cuEventDestroy(c.fork)), MUST(cuEventDestroy(c.join));
    MUST(cuStreamDestroy(c.s0)), MUST(cuStreamDestroy(c.s1));
    MUST(cuMemFree(c.copy)), MUST(cuMemFree(c.reduced)), MUST(cuMemFree(c.gemm_out));
    ln_free(&c.d);
    free(x2);
    results_free(&eager), results_free(&during), results_free(&graph), results_free(&rev), results_free(&again),
        results_free(&fresh);
}

/* ---- NCCL ---- */

static ncclComm_t check_nccl(void) {
    ncclUniqueId id;
    ncclComm_t comm = NULL, two = NULL;
    if (ncclGetUniqueId(&id) != ncclSuccess || ncclCommInitRank(&comm, 1, id, 0) != ncclSuccess) {
        tap(0, "ncclGetUniqueId + ncclCommInitRank(1 rank)");
        return NULL;
    }
    tap(ncclCommInitRank(&two, 2, id, 2) == ncclInvalidArgument, "ncclCommInitRank of rank 2 of 2 -> ncclInvalidArgument");
    tap(ncclCommInitRank(&two, 65, id, 0) == ncclInvalidArgument, "ncclCommInitRank with 65 ranks -> ncclInvalidArgument");
    ncclUniqueId alone;
    char *old_timeout = getenv("KILN_FAKE_NCCL_TIMEOUT") ? strdup(getenv("KILN_FAKE_NCCL_TIMEOUT")) : NULL;
    setenv("KILN_FAKE_NCCL_TIMEOUT", "0.3", 1);
    tap(ncclGetUniqueId(&alone) == ncclSuccess && ncclCommInitRank(&two, 2, alone, 0) == ncclSystemError && two == NULL,
        "ncclCommInitRank of rank 0 of 2 with no rank 1 -> ncclSystemError after KILN_FAKE_NCCL_TIMEOUT (0.3 s)");
    if (old_timeout) setenv("KILN_FAKE_NCCL_TIMEOUT", old_timeout, 1), free(old_timeout);
    else unsetenv("KILN_FAKE_NCCL_TIMEOUT");
    float h[64], back[64];
    for (int i = 0; i < 64; i++) h[i] = (float)i - 7.5f;
    CUdeviceptr a = dev_upload(h, sizeof h), b = dev_alloc(sizeof h), c = dev_alloc(sizeof h);
    void *pa = (void *)(uintptr_t)a, *pb = (void *)(uintptr_t)b, *pc = (void *)(uintptr_t)c;
    int ok = ncclAllReduce(pa, pb, 64, ncclFloat32, ncclSum, comm, NULL) == ncclSuccess &&
             ncclAllReduce(pb, pb, 64, ncclFloat32, ncclSum, comm, NULL) == ncclSuccess &&
             ncclReduceScatter(pb, pc, 16, ncclFloat32, ncclSum, comm, NULL) == ncclSuccess && MUST(cuMemcpyDtoH(back, b, sizeof h));
    float part[16];
    ok = ok && MUST(cuMemcpyDtoH(part, c, sizeof part));
    tap(ok && memcmp(back, h, sizeof h) == 0 && memcmp(part, h, sizeof part) == 0,
        "ncclAllReduce (and in place), ncclReduceScatter with 1 rank: copies");
    MUST(cuMemsetD8(c, 0, sizeof h));
    ok = ncclAllGather(pa, pc, 32, ncclBfloat16, comm, NULL) == ncclSuccess && MUST(cuMemcpyDtoH(back, c, sizeof h));
    tap(ok && memcmp(back, h, 64) == 0 && back[16] == 0, "ncclAllGather (bf16, 32 elements) with 1 rank: a copy of 64 bytes");
    MUST(cuMemsetD8(c, 0, sizeof h));
    ok = ncclGroupStart() == ncclSuccess && ncclSend(pa, 64, ncclFloat32, 0, comm, NULL) == ncclSuccess &&
         ncclRecv(pc, 64, ncclFloat32, 0, comm, NULL) == ncclSuccess && ncclGroupEnd() == ncclSuccess &&
         MUST(cuMemcpyDtoH(back, c, sizeof h));
    tap(ok && memcmp(back, h, sizeof h) == 0, "ncclSend + ncclRecv to itself in a group: a copy");
    tap(ncclSend(pa, 64, ncclFloat32, 0, comm, NULL) == ncclInvalidUsage, "ncclSend to itself outside a group -> ncclInvalidUsage");
    tap(ncclAllReduce(pa, pb, 64, ncclFloat32, ncclMax, comm, NULL) == ncclInvalidArgument, "ncclAllReduce(ncclMax) -> ncclInvalidArgument");
    MUST(cuMemFree(a)), MUST(cuMemFree(b)), MUST(cuMemFree(c));
    return comm;
}

/* ---- two streams without an event ---- */

/* s0: y = layernorm(x); s1: y2 = layernorm(y), with and without an event
 * between them: the happens-before check must see the missing event
 * whatever the streams' threads did.  Then the threads themselves: a copy
 * on s1 racing s0's kernel must go wrong on some try. */
static void check_races(CUfunction fwd) {
    LnData d, d2;
    ln_data(&d);
    d2 = d;
    d2.x = d.y;
    size_t n = LN_ROWS * LN_C;
    CUdeviceptr y2 = dev_alloc(n * 2);
    CUstream s0, s1;
    CUevent e;
    MUST(cuStreamCreate(&s0, CU_STREAM_NON_BLOCKING)), MUST(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
    MUST(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
    uint16_t *ordered = malloc(n * 2), *unordered = malloc(n * 2);
    fake_races(1);
    int ok = MUST(launch_ln(fwd, &d, d.y, LN_ROWS, 256, 0, s0)) && MUST(cuEventRecord(e, s0)) &&
             MUST(cuStreamWaitEvent(s1, e, 0)) && MUST(launch_ln(fwd, &d2, y2, LN_ROWS, 256, 0, s1)) &&
             MUST(cuStreamSynchronize(s1));
    int with_event = fake_races(1);
    tap(ok && with_event == 0, "two streams, s1 reads what s0 wrote after cuEventRecord + cuStreamWaitEvent: no race (%d)",
        with_event);
    ok = MUST(launch_ln(fwd, &d, d.y, LN_ROWS, 256, 0, s0)) && MUST(launch_ln(fwd, &d2, y2, LN_ROWS, 256, 0, s1)) &&
         MUST(cuCtxSynchronize());
    int without = fake_races(1);
    tap(ok && without == 1, "the same without the event: the race reported (%d), whatever the threads' timing did", without);
    setenv("KILN_FAKE_CUDA_TEST_DROP_WAIT", "1", 1);
    ok = MUST(launch_ln(fwd, &d, d.y, LN_ROWS, 256, 0, s0)) && MUST(cuEventRecord(e, s0)) &&
         MUST(cuStreamWaitEvent(s1, e, 0)) && MUST(launch_ln(fwd, &d2, y2, LN_ROWS, 256, 0, s1)) &&
         MUST(cuCtxSynchronize());
    unsetenv("KILN_FAKE_CUDA_TEST_DROP_WAIT");
    int dropped = fake_races(1);
    tap(ok && dropped == 1, "with KILN_FAKE_CUDA_TEST_DROP_WAIT=1 (a planted bug: cuStreamWaitEvent orders nothing) "
                            "the ordered version is reported too (%d)", dropped);
    /* each stream is a thread: without the event, s1's copy of y can run
     * while s0's kernel writes it, and the copy differs from y (tried until
     * it does, at most 20 times; in enqueue order it never would) */
    int differed = 0, tries = 0;
    while (!differed && tries++ < 20) {
        ok = MUST(cuMemsetD8(d.y, 0xff, n * 2)) && MUST(launch_ln(fwd, &d, d.y, LN_ROWS, 256, 0, s0)) &&
             MUST(cuMemcpyDtoDAsync(y2, d.y, n * 2, s1)) && MUST(cuCtxSynchronize()) &&
             MUST(cuMemcpyDtoH(ordered, d.y, n * 2)) && MUST(cuMemcpyDtoH(unordered, y2, n * 2));
        differed = ok && memcmp(ordered, unordered, n * 2) != 0;
    }
    fake_races(1);
    tap(differed, "the streams run concurrently: without the event, s1's copy of y ran while s0's kernel wrote it "
                  "(a different result on try %d)", tries);
    MUST(cuEventDestroy(e)), MUST(cuStreamDestroy(s0)), MUST(cuStreamDestroy(s1)), MUST(cuMemFree(y2));
    ln_free(&d);
    free(ordered), free(unordered);
}

/* ---- faults: asynchronous and sticky, as on a GPU ---- */

/* Release the primary context (its error goes with it), retain it again and
 * reload the module: 1, or 0 after a "not ok" line. */
static int fresh_context(Layernorm *ln, CUcontext *ctx) {
    MUST(cuModuleUnload(ln->mod));
    ln->mod = NULL;
    MUST(cuDevicePrimaryCtxRelease(0));
    return MUST(cuDevicePrimaryCtxRetain(ctx, 0)) && MUST(cuModuleLoadData(&ln->mod, ln->image)) &&
           MUST(cuModuleGetFunction(&ln->fwd, ln->mod, "kiln_layernorm_fwd"));
}

/* A kernel that faults (a host pointer for its output; an emulation error)
 * is launched fine; the fault comes at the next synchronising call, and
 * every call after it fails too, until the context is released. */
static void check_faults(Layernorm *ln, CUcontext *ctx) {
    LnData d;
    ln_data(&d);
    size_t n = LN_ROWS * LN_C;
    uint16_t *host_y = calloc(n, 2);
    CUstream s;
    MUST(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    expect(launch_ln(ln->fwd, &d, (CUdeviceptr)(uintptr_t)host_y, LN_ROWS, 256, 0, s), CUDA_SUCCESS,
           "kiln_layernorm_fwd with a host pointer for y: the launch (the fault is asynchronous)");
    expect(cuStreamSynchronize(s), CUDA_ERROR_ILLEGAL_ADDRESS, "cuStreamSynchronize after it");
    int untouched = 1;
    for (size_t i = 0; i < n; i++) untouched &= host_y[i] == 0;
    tap(untouched, "the kernel wrote nothing through the host pointer");
    expect(launch_ln(ln->fwd, &d, d.y, LN_ROWS, 256, 0, s), CUDA_ERROR_ILLEGAL_ADDRESS,
           "a correct launch afterwards (the error is sticky)");
    MUST(cuStreamDestroy(s));
    ln_free(&d);
    if (!fresh_context(ln, ctx)) {
        free(host_y);
        return;
    }
    expect(cuCtxSynchronize(), CUDA_SUCCESS, "cuCtxSynchronize after the primary context was released and retained again");
    ln_data(&d);
    expect(launch_ln(ln->fwd, &d, d.y, LN_ROWS, 48, 0, NULL), CUDA_SUCCESS,
           "kiln_layernorm_fwd with 48 threads (a partial warp in the block reduction: an emulation error): the launch");
    expect(cuMemcpyDtoH(host_y, d.y, 2), CUDA_ERROR_LAUNCH_FAILED, "the next synchronising call (cuMemcpyDtoH)");
    expect(cuCtxSynchronize(), CUDA_ERROR_LAUNCH_FAILED, "cuCtxSynchronize afterwards (the error is sticky)");
    ln_free(&d);
    free(host_y);
    if (!fresh_context(ln, ctx)) return;
    expect(cuCtxSynchronize(), CUDA_SUCCESS, "cuCtxSynchronize in the new context");
    MUST(cuModuleUnload(ln->mod));
}

/* ---- strict-mode helpers: leave something behind ----
 * `selftest leak`: 1000 bytes never freed; `selftest double-free`: the
 * second cuMemFree must fail (else exit 3).  Both exit 0 themselves; with
 * KILN_FAKE_CUDA_STRICT=1 the fake driver's exit report makes it 1. */

static int misbehave(const char *what) {
    CUcontext ctx;
    CUdeviceptr p;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx) || cuMemAlloc(&p, 1000)) return 2;
    if (strcmp(what, "double-free") == 0 && (cuMemFree(p) != CUDA_SUCCESS || cuMemFree(p) != CUDA_ERROR_INVALID_VALUE))
        return 3; /* the second free must fail */
    cuDevicePrimaryCtxRelease(0);
    return 0;
}

/* `selftest getfn NAME`: load layernorm.cu's cubin, print what
 * cuModuleGetFunction(NAME) returns; exit 0 on success. */
static int get_function(const char *name) {
    KilnCubin cubin;
    char err[4096];
    CUcontext ctx;
    CUmodule mod;
    CUfunction f;
    if (kiln_nvrtc_compile_file("kernels/cuda/layernorm.cu", "sm_90", KILN_NVRTC_WARNINGS_OK, &cubin, err, sizeof err) != 0) {
        printf("NVRTC: %s\n", err);
        return 2;
    }
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx) || cuModuleLoadData(&mod, cubin.data)) return 2;
    kiln_cubin_free(&cubin);
    CUresult r = cuModuleGetFunction(&f, mod, name);
    printf("%s\n", cu_name(r));
    cuModuleUnload(mod);
    cuDevicePrimaryCtxRelease(0);
    return r == CUDA_SUCCESS ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc > 2 && strcmp(argv[1], "getfn") == 0) return get_function(argv[2]);
    if (argc > 1) return misbehave(argv[1]);
    check_loaded();
    CUcontext ctx = check_device();
    check_memory();
    Layernorm ln = {0};
    if (load_layernorm(&ln)) check_layernorm(&ln);
    Blas bl = {0};
    check_gemm(&bl);
    ncclComm_t comm = check_nccl();
    if (ln.fwd && bl.lt && comm) check_capture(&bl, ln.fwd, comm);
    if (comm) ncclCommDestroy(comm);
    if (bl.workspace) MUST(cuMemFree(bl.workspace));
    if (bl.lt) cublasLtDestroy(bl.lt);
    if (ln.mod) check_races(ln.fwd);
    if (ln.mod) check_faults(&ln, &ctx);
    free(ln.image);
    MUST(cuDevicePrimaryCtxRelease(0));
    (void)ctx;
    printf("1..%d\n", tap_count);
    return tap_failures ? 1 : 0;
}
