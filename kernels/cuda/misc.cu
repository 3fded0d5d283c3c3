/* misc.cu — the small library kernels the CUDA program needs besides the
 * big ones: data movement (strided copy, fill, iota, the context-parallel
 * rank iota), reductions (sumto, reduce, max_bwd, the gradient norm's sum of
 * squares), softmax forward and backward, the optimizer's scalar ops
 * (clipscale, lr_cosine) and the ring-attention merge.  Each op's meaning is
 * compiler/ops.def's and runtime/kiln_rt.h's (rtk_copy, rtk_sumto,
 * rtk_reduce, rtk_iota_rank, rtk_attn_merge); the CPU twins are
 * kernels/cpu/copy.c, reduce.c, softmax.c, optim.c, attn_merge.c and
 * runtime/comm_mpi.c's rtk_iota_rank.  kernels/cuda/README.md ("misc.cu")
 * gives every kernel's launch.
 *
 * Element types.  Where the dtype varies the kernel takes `void *` and
 * kiln_rt.h's code (common.cuh: KILN_F32, KILN_BF16, KILN_I32); the math
 * is f32 and a bf16 store rounds once, to nearest even.  copy moves
 * elements of 1, 2, 4, 8 or 16 bytes as integers or vectors (any other size
 * byte by byte), so it serves every dtype; its launcher widens a copy whose
 * innermost dim is contiguous on both sides to 16-byte elements where the
 * strides and addresses allow (runtime/cuda/kernels_cuda.c copy_widen).
 *
 * Determinism.  No atomics.  Every sum has one order fixed by the shapes:
 * kiln_sumto and reduce give each output to one thread, which adds its
 * inputs in row-major order of x; softmax uses common.cuh's fixed block
 * reductions; sumsq and sumto_rows (a bias gradient's [R, K] -> [K]) cut x
 * into parts fixed by the shapes alone (not by the grid) and a final
 * kernel adds the parts in a fixed order.  Every kernel loops with a stride
 * of its grid, so any grid of at least one block gives the same bits.
 *
 * Index arithmetic.  copy and sumto first simplify their index space, in
 * every thread (a few dozen integer operations, the same in all threads):
 * size-1 dims drop out and a dim merges into its outer neighbour when both
 * strides continue it (a slice of whole rows is one long run; a bias
 * gradient [B, T, C] -> [C] sums one merged dim).  Splitting a linear index
 * into dims then takes few divisions, 32-bit ones when the index space
 * fits in 32 bits (64-bit division is a long software sequence on a GPU).
 * copy gives a warp to each row of its innermost run when the run is at
 * least 32 long (one split per row, coalesced when the run is contiguous),
 * else a thread to each element.  A transpose whose innermost dim is
 * strided on one side is therefore uncoalesced on that side (a tiled
 * shared-memory transpose is speed work for later).
 */
#include "common.cuh"

#define MISC_MAX_RANK 5
#define MISC_SUMSQ_CHUNK 2048 /* elements per sumsq part at least */
#define MISC_SUMSQ_PARTS 1024 /* sumsq parts at most */

/* copy splits indices in 32-bit arithmetic when it has at most this many
 * elements; the emulator check lowers it to run the 64-bit path too */
#ifndef MISC_INDEX32_MAX
#define MISC_INDEX32_MAX 0xffffffffLL
#endif

/* ---- the strided copy ---- */

/* An index space after simplification, right-aligned: dims lo..4 are in
 * use, dim 4 is the innermost (the run), and the outer dims of a linear
 * index are split off with loops unrolled at compile time, so that the
 * space's arrays live in registers. */
typedef struct {
    int lo;          /* the outermost dim in use (MISC_MAX_RANK: none, one element) */
    long long total; /* elements; 0 when some dim is 0 */
    long long d[MISC_MAX_RANK], ss[MISC_MAX_RANK], ds[MISC_MAX_RANK];
    long long oss, ods; /* ss[lo], ds[lo] (0 when lo is MISC_MAX_RANK) */
} CopySpace;

/* Built innermost dim first; every array index is a compile-time constant
 * once the loops are unrolled (a run-time index would put the arrays in
 * local memory).  A dim merges into the outermost one so far when its
 * strides continue that one's: the CPU twin's rule, applied inside out. */
static __device__ __forceinline__ CopySpace copy_space(int rank, const long long *d, const long long *ss, const long long *ds) {
    CopySpace c;
    c.lo = MISC_MAX_RANK;
    c.total = 1;
#pragma unroll
    for (int j = 0; j < MISC_MAX_RANK; j++) c.d[j] = 1, c.ss[j] = 0, c.ds[j] = 0;
#pragma unroll
    for (int k = MISC_MAX_RANK - 1; k >= 0; k--) {
        long long n = d[k];
        if (k >= rank || n == 1) continue;
        if (n <= 0) {
            c.total = 0;
            continue;
        }
        c.total *= n;
        long long od = 1, oss = 0, ods = 0; /* the outermost dim so far */
#pragma unroll
        for (int j = 0; j < MISC_MAX_RANK; j++)
            if (j == c.lo) od = c.d[j], oss = c.ss[j], ods = c.ds[j];
        bool merge = c.lo < MISC_MAX_RANK && ss[k] == od * oss && ds[k] == od * ods;
        if (!merge) c.lo--;
#pragma unroll
        for (int j = 0; j < MISC_MAX_RANK; j++)
            if (j == c.lo) {
                if (merge) {
                    c.d[j] *= n;
                } else {
                    c.d[j] = n;
                    c.ss[j] = ss[k];
                    c.ds[j] = ds[k];
                }
            }
    }
    c.oss = c.ods = 0;
#pragma unroll
    for (int j = 0; j < MISC_MAX_RANK; j++)
        if (j == c.lo) c.oss = c.ss[j], c.ods = c.ds[j];
    return c;
}

/* The source and destination element offsets of index i of dims lo..top
 * (top = 4: every dim; top = 3: the rows before the run).  I is unsigned
 * when the space fits in 32 bits: 64-bit division is a long software
 * sequence on a GPU. */
template <class I>
static __device__ __forceinline__ void copy_offsets(const CopySpace &c, int top, I i, long long &so, long long &dof) {
    so = 0;
    dof = 0;
#pragma unroll
    for (int k = MISC_MAX_RANK - 1; k >= 0; k--) {
        if (k > top) continue;
        if (k <= c.lo) { /* what is left of i indexes dim lo (0 when top < lo: no dims to split) */
            so += (long long)i * c.oss;
            dof += (long long)i * c.ods;
            break;
        }
        I n = (I)c.d[k], q = i / n, idx = i - q * n;
        i = q;
        so += (long long)idx * c.ss[k];
        dof += (long long)idx * c.ds[k];
    }
}

/* element so of src to element dof of dst, elements of eb bytes (eb is the
 * same for every thread: the switch costs no divergence) */
static __device__ __forceinline__ void copy_one(const void *src, void *dst, long long eb, long long so, long long dof) {
    switch (eb) {
    case 1: ((unsigned char *)dst)[dof] = ((const unsigned char *)src)[so]; break;
    case 2: ((unsigned short *)dst)[dof] = ((const unsigned short *)src)[so]; break;
    case 4: ((unsigned *)dst)[dof] = ((const unsigned *)src)[so]; break;
    case 8: ((unsigned long long *)dst)[dof] = ((const unsigned long long *)src)[so]; break;
    case 16: ((uint4 *)dst)[dof] = ((const uint4 *)src)[so]; break;
    default:
        for (long long b = 0; b < eb; b++) ((unsigned char *)dst)[dof * eb + b] = ((const unsigned char *)src)[so * eb + b];
    }
}

/* A warp a row of the run when the run is long (coalesced, one index split
 * per row), else a thread an element. */
template <class I>
static __device__ __forceinline__ void copy_elements(const void *src, void *dst, long long eb, const CopySpace &c) {
    const long long run = c.d[MISC_MAX_RANK - 1], rss = c.ss[MISC_MAX_RANK - 1], rds = c.ds[MISC_MAX_RANK - 1];
    if (c.lo < MISC_MAX_RANK && run >= 32) {
        const long long rows = c.total / run, lane = threadIdx.x & 31;
        for (long long row = kiln_gtid() >> 5; row < rows; row += kiln_gstride() >> 5) {
            long long so, dof;
            copy_offsets<I>(c, MISC_MAX_RANK - 2, (I)row, so, dof);
            for (long long j = lane; j < run; j += 32) copy_one(src, dst, eb, so + j * rss, dof + j * rds);
        }
        return;
    }
    for (long long i = kiln_gtid(); i < c.total; i += kiln_gstride()) {
        long long so, dof;
        copy_offsets<I>(c, MISC_MAX_RANK - 1, (I)i, so, dof);
        copy_one(src, dst, eb, so, dof);
    }
}

extern "C" __global__ void __launch_bounds__(KILN_BLOCK)
kiln_copy(const void *src, void *dst, long long eb, int rank, long long d0, long long d1, long long d2, long long d3,
          long long d4, long long ss0, long long ss1, long long ss2, long long ss3, long long ss4, long long ds0,
          long long ds1, long long ds2, long long ds3, long long ds4) {
    const long long d[MISC_MAX_RANK] = {d0, d1, d2, d3, d4}, ss[MISC_MAX_RANK] = {ss0, ss1, ss2, ss3, ss4},
                    ds[MISC_MAX_RANK] = {ds0, ds1, ds2, ds3, ds4};
    CopySpace c = copy_space(rank, d, ss, ds);
    if (c.total <= MISC_INDEX32_MAX) copy_elements<unsigned>(src, dst, eb, c);
    else copy_elements<long long>(src, dst, eb, c);
}

/* ---- sumto ---- */

/* x's dims split into kept dims (kd, x strides kxs, y strides kys) and
 * summed dims (rd, x strides rxs), each merged where contiguous. */
typedef struct {
    int nk, nr;
    long long outputs, nsum; /* products of kd and rd; 0 when a dim is 0 */
    long long kd[MISC_MAX_RANK], kxs[MISC_MAX_RANK], kys[MISC_MAX_RANK];
    long long rd[MISC_MAX_RANK], rxs[MISC_MAX_RANK];
} SumToSpace;

static __device__ SumToSpace sumto_space(int rank, const long long *d, const long long *ys) {
    SumToSpace s;
    s.nk = s.nr = 0;
    s.outputs = s.nsum = 1;
    if (rank > MISC_MAX_RANK) rank = MISC_MAX_RANK;
    long long xs[MISC_MAX_RANK], stride = 1;
    for (int k = rank - 1; k >= 0; k--) {
        xs[k] = stride;
        stride *= d[k] > 0 ? d[k] : 0;
    }
    for (int k = 0; k < rank; k++) {
        long long n = d[k] > 0 ? d[k] : 0;
        if (ys[k] != 0) {
            s.outputs *= n;
        } else {
            s.nsum *= n;
        }
        if (n <= 1) continue; /* size 1 drops out; size 0 has made a product 0 */
        if (ys[k] != 0) {
            int p = s.nk - 1;
            if (p >= 0 && s.kxs[p] == n * xs[k] && s.kys[p] == n * ys[k]) {
                s.kd[p] *= n;
                s.kxs[p] = xs[k];
                s.kys[p] = ys[k];
            } else {
                s.kd[s.nk] = n;
                s.kxs[s.nk] = xs[k];
                s.kys[s.nk] = ys[k];
                s.nk++;
            }
        } else {
            int p = s.nr - 1;
            if (p >= 0 && s.rxs[p] == n * xs[k]) {
                s.rd[p] *= n;
                s.rxs[p] = xs[k];
            } else {
                s.rd[s.nr] = n;
                s.rxs[s.nr] = xs[k];
                s.nr++;
            }
        }
    }
    return s;
}

/* the sum of x[xo + the summed offsets], the summed indices in row-major order */
static __device__ float sumto_one(const void *x, int dtx, const SumToSpace &s, long long xo) {
    float acc = 0.0f;
    if (s.nsum == 0) return acc;
    if (s.nr == 0) return acc + kiln_ld_dt(x, xo, dtx);
    long long idx[MISC_MAX_RANK] = {0, 0, 0, 0, 0}, off = 0;
    const long long L = s.rd[s.nr - 1], rs = s.rxs[s.nr - 1];
    for (;;) {
        for (long long l = 0; l < L; l++) acc += kiln_ld_dt(x, xo + off + l * rs, dtx);
        int k = s.nr - 2;
        for (; k >= 0; k--) { /* the next index of the outer summed dims */
            off += s.rxs[k];
            if (++idx[k] < s.rd[k]) break;
            off -= s.rxs[k] * s.rd[k];
            idx[k] = 0;
        }
        if (k < 0) return acc;
    }
}

extern "C" __global__ void __launch_bounds__(KILN_BLOCK)
kiln_sumto(const void *x, void *y, int dtx, int dty, int rank, long long d0, long long d1, long long d2, long long d3,
           long long d4, long long ys0, long long ys1, long long ys2, long long ys3, long long ys4) {
    const long long d[MISC_MAX_RANK] = {d0, d1, d2, d3, d4}, ys[MISC_MAX_RANK] = {ys0, ys1, ys2, ys3, ys4};
    SumToSpace s = sumto_space(rank, d, ys);
    for (long long j = kiln_gtid(); j < s.outputs; j += kiln_gstride()) {
        long long xo = 0, yo = 0, r = j;
        for (int k = s.nk - 1; k >= 0; k--) {
            long long q = r / s.kd[k], idx = r - q * s.kd[k];
            r = q;
            xo += idx * s.kxs[k];
            yo += idx * s.kys[k];
        }
        kiln_st_dt(y, yo, sumto_one(x, dtx, s, xo), dty);
    }
}

/* ---- sumto over rows: x [R, K] -> y [K] in two stages ---- */

/* The common sumto (a bias gradient: [B*T, C] -> [C]) has few outputs and
 * many rows, so one thread an output leaves the GPU idle.  The rows are
 * cut into `parts` of `rpp` rows (fixed by R alone: the launcher's rule),
 * and a block sums a part for 32 columns: warp w of its 8 adds rows
 * w, w + 8, ... of the part (lane l: column l of the tile, coalesced), then
 * warp 0 adds the 8 sums in order into part[p][c] (f32).  kiln_sumto_parts
 * adds part[0..parts-1][c] in order into y[c].  Every order is fixed by
 * R and K, so any grid gives the same bits. */
#define MISC_SUMTO_WARPS (KILN_BLOCK / 32)

extern "C" __global__ void __launch_bounds__(KILN_BLOCK)
kiln_sumto_rows(const void *x, float *part, int dtx, long long R, long long K, long long rpp, long long parts) {
    __shared__ float sums[MISC_SUMTO_WARPS][32];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const long long tiles = (K + 31) / 32;
    for (long long t = blockIdx.x; t < tiles; t += gridDim.x) {
        const long long c = t * 32 + lane;
        for (long long p = blockIdx.y; p < parts; p += gridDim.y) {
            const long long r1 = p * rpp + rpp < R ? p * rpp + rpp : R;
            float acc = 0.0f;
            if (c < K)
                for (long long r = p * rpp + w; r < r1; r += MISC_SUMTO_WARPS) acc += kiln_ld_dt(x, r * K + c, dtx);
            sums[w][lane] = acc;
            __syncthreads();
            if (w == 0 && c < K) {
                float total = 0.0f;
#pragma unroll
                for (int k = 0; k < MISC_SUMTO_WARPS; k++) total += sums[k][lane];
                part[p * K + c] = total;
            }
            __syncthreads();
        }
    }
}

extern "C" __global__ void __launch_bounds__(KILN_BLOCK)
kiln_sumto_parts(const float *part, void *y, int dty, long long parts, long long K) {
    for (long long c = kiln_gtid(); c < K; c += kiln_gstride()) {
        float total = 0.0f;
        for (long long p = 0; p < parts; p++) total += part[p * K + c];
        kiln_st_dt(y, c, total, dty);
    }
}

/* ---- reduce over one dim, and max's backward ---- */

#define MISC_SUM 0
#define MISC_MEAN 1
#define MISC_MAX 2

extern "C" __global__ void __launch_bounds__(KILN_BLOCK)
kiln_reduce(const void *x, void *y, long long outer, long long n, long long inner, int kind, int dtx, int dty) {
    for (long long out = kiln_gtid(); out < outer * inner; out += kiln_gstride()) {
        long long o = out / inner, j = out - o * inner, base = o * n * inner + j;
        float r;
        if (kind == MISC_MAX) {
            r = kiln_neg_inf(); /* a NaN wins and stays, as the twin's k_max2 */
            for (long long k = 0; k < n; k++) {
                float v = kiln_ld_dt(x, base + k * inner, dtx);
                if (v > r || v != v) r = v;
            }
        } else {
            r = 0.0f;
            for (long long k = 0; k < n; k++) r += kiln_ld_dt(x, base + k * inner, dtx);
            if (kind == MISC_MEAN) r = r / (float)n;
        }
        kiln_st_dt(y, out, r, dty);
    }
}

extern "C" __global__ void __launch_bounds__(KILN_BLOCK)
kiln_max_bwd(const void *dy, const void *x, const void *y, void *dx, long long outer, long long n, long long inner,
             int dt) {
    (void)y; /* the argmax is found again in x: the first one, NaN never wins (the twin's rule) */
    for (long long out = kiln_gtid(); out < outer * inner; out += kiln_gstride()) {
        long long o = out / inner, j = out - o * inner, base = o * n * inner + j, best = 0;
        if (n <= 0) continue;
        float top = kiln_ld_dt(x, base, dt);
        for (long long k = 1; k < n; k++) {
            float v = kiln_ld_dt(x, base + k * inner, dt);
            if (v > top) top = v, best = k;
        }
        float g = kiln_ld_dt(dy, out, dt);
        for (long long k = 0; k < n; k++) kiln_st_dt(dx, base + k * inner, k == best ? g : 0.0f, dt);
    }
}

/* ---- softmax ---- */

extern "C" __global__ void __launch_bounds__(KILN_BLOCK)
kiln_softmax(const void *x, void *y, long long rows, long long C, int dt) {
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const long long o = r * C;
        float m = kiln_neg_inf(), s = 0.0f;
        for (long long i = threadIdx.x; i < C; i += blockDim.x) kiln_lse_add(m, s, kiln_ld_dt(x, o + i, dt));
        float2 t = kiln_block_lse_pair(m, s);
        float inv = 1.0f / t.y;
        for (long long i = threadIdx.x; i < C; i += blockDim.x) kiln_st_dt(y, o + i, expf(kiln_ld_dt(x, o + i, dt) - t.x) * inv, dt);
    }
}

extern "C" __global__ void __launch_bounds__(KILN_BLOCK)
kiln_softmax_bwd(const void *dy, const void *y, void *dx, long long rows, long long C, int dt) {
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const long long o = r * C;
        float dot = 0.0f;
        for (long long i = threadIdx.x; i < C; i += blockDim.x) dot += kiln_ld_dt(dy, o + i, dt) * kiln_ld_dt(y, o + i, dt);
        dot = kiln_block_sum(dot);
        for (long long i = threadIdx.x; i < C; i += blockDim.x)
            kiln_st_dt(dx, o + i, kiln_ld_dt(y, o + i, dt) * (kiln_ld_dt(dy, o + i, dt) - dot), dt);
    }
}

/* ---- the gradient norm's sum of squares ---- */

/* parts of x: fixed by n alone, so that any grid gives the same bits */
static __device__ __forceinline__ long long sumsq_parts(long long n) {
    long long p = (n + MISC_SUMSQ_CHUNK - 1) / MISC_SUMSQ_CHUNK;
    return p < 1 ? 1 : p > MISC_SUMSQ_PARTS ? MISC_SUMSQ_PARTS : p;
}

extern "C" __global__ void __launch_bounds__(KILN_BLOCK)
kiln_sumsq(const void *x, float *partial, long long n, int dt) {
    const long long parts = sumsq_parts(n);
    for (long long p = blockIdx.x; p < parts; p += gridDim.x) {
        long long lo = n * p / parts, hi = n * (p + 1) / parts;
        float s = 0.0f;
        for (long long i = lo + threadIdx.x; i < hi; i += blockDim.x) {
            float v = kiln_ld_dt(x, i, dt);
            s += v * v;
        }
        s = kiln_block_sum(s);
        if (threadIdx.x == 0) partial[p] = s;
    }
}

extern "C" __global__ void __launch_bounds__(KILN_BLOCK)
kiln_sumsq_final(const float *partial, float *out, long long parts) {
    float s = 0.0f;
    for (long long i = threadIdx.x; i < parts; i += blockDim.x) s += partial[i];
    s = kiln_block_sum(s);
    if (threadIdx.x == 0 && blockIdx.x == 0) out[0] = s;
}

/* ---- the optimizer's scalars (one thread; double math, as the twins) ---- */

extern "C" __global__ void __launch_bounds__(1)
kiln_clipscale(const float *norm, float *out, double max) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    double s = max / ((double)norm[0] + 1e-6);
    out[0] = max <= 0 || s > 1 ? 1.0f : (float)s; /* a NaN norm gives NaN */
}

extern "C" __global__ void __launch_bounds__(1)
kiln_lr_cosine(const float *t, float *out, const double *sched) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    const double pi = 3.14159265358979323846;
    double step = t[0], lr = sched[0], min_lr = sched[1], warmup = sched[2], total = sched[3];
    if (warmup > 0 && step <= warmup) {
        out[0] = (float)(lr * step / warmup);
        return;
    }
    double p = total > warmup ? (step - warmup) / (total - warmup) : 1;
    p = p < 0 ? 0 : p > 1 ? 1 : p;
    out[0] = (float)(min_lr + 0.5 * (1 + cos(pi * p)) * (lr - min_lr));
}

/* ---- fill, iota, rank iota ---- */

extern "C" __global__ void __launch_bounds__(KILN_BLOCK)
kiln_fill(void *dst, long long n, double value, int dt) {
    if (dt == KILN_I32) {
        /* truncated toward zero and clamped, NaN 0 (the twin's int_value) */
        double v = value != value ? 0 : value < -2147483648.0 ? -2147483648.0 : value > 2147483647.0 ? 2147483647.0 : trunc(value);
        int iv = (int)v;
        for (long long i = kiln_gtid(); i < n; i += kiln_gstride()) ((int *)dst)[i] = iv;
    } else if (dt == KILN_BF16) {
        __nv_bfloat16 b = __float2bfloat16_rn((float)value); /* through f32, as the interpreter rounds */
        for (long long i = kiln_gtid(); i < n; i += kiln_gstride()) ((__nv_bfloat16 *)dst)[i] = b;
    } else {
        float f = (float)value;
        for (long long i = kiln_gtid(); i < n; i += kiln_gstride()) ((float *)dst)[i] = f;
    }
}

extern "C" __global__ void __launch_bounds__(KILN_BLOCK)
kiln_iota(int *dst, long long n) {
    for (long long i = kiln_gtid(); i < n; i += kiln_gstride()) dst[i] = (int)i;
}

extern "C" __global__ void __launch_bounds__(KILN_BLOCK)
kiln_iota_rank(int *dst, long long n, long long i, long long s, int dual, int all) {
    if (s < 1) s = 1;
    const long long piece = all ? n / s : n, h = piece / 2;
    if (piece <= 0) return;
    for (long long k = kiln_gtid(); k < n; k += kiln_gstride()) {
        long long r = all ? k / piece : i, kk = all ? k - r * piece : k;
        long long v = !dual ? r * piece + kk : kk < h ? r * h + kk : (2 * s - 1 - r) * h + (kk - h);
        dst[k] = (int)v;
    }
}

/* ---- the ring-attention merge ---- */

/* A warp per row: every lane reads the row's two lse, blends its columns,
 * and lane 0 stores the merged lse only after the whole warp has read them
 * (__syncwarp), so lse may be lse_a or lse_b; o[i] is written by the lane
 * that read o_a[i] and o_b[i], so o may be o_a or o_b. */
extern "C" __global__ void __launch_bounds__(KILN_BLOCK)
kiln_attn_merge(const void *o_a, const float *lse_a, const void *o_b, const float *lse_b, void *o, float *lse,
                long long rows, long long D, int dt) {
    const int lane = threadIdx.x & 31;
    const long long warps = blockDim.x >> 5;
    for (long long r = blockIdx.x * warps + (threadIdx.x >> 5); r < rows; r += gridDim.x * warps) {
        float la = lse_a[r], lb = lse_b[r], hi = la > lb ? la : lb, lo = la > lb ? lb : la;
        /* -inf is tested, never subtracted: exp(-inf - -inf) would be NaN */
        float L = hi == kiln_neg_inf() ? kiln_neg_inf() : hi + log1pf(expf(lo - hi));
        float wa = la == kiln_neg_inf() ? 0.0f : expf(la - L), wb = lb == kiln_neg_inf() ? 0.0f : expf(lb - L);
        const long long base = r * D;
        for (long long d = lane; d < D; d += 32)
            kiln_st_dt(o, base + d, wa * kiln_ld_dt(o_a, base + d, dt) + wb * kiln_ld_dt(o_b, base + d, dt), dt);
        __syncwarp();
        if (lane == 0) lse[r] = L;
    }
}
