/* attention.c — tiled ("flash") attention forward and backward.
 *
 * q, o [B,H,T,D]; k, v [B,KH,S,D]; lse f32 [B,H,T].  Query head h reads kv
 * head h/(H/KH) (grouped-query attention).  causal: key s is visible to
 * query t iff s <= t.  Scores are scale * q.k.
 *
 * Positions (context parallel: a rank holds chunks of the sequence, and
 * the keys it gathers come in any order).  With qpos i32[T] and kpos
 * i32[S], causal means key s is visible to query t iff kpos[s] <= qpos[t].
 * There is no index band then: every (query tile, key block) pair is
 * classified by tile_kind from the min and max positions on each side:
 * masked whole (skipped), visible whole (computed as without causal), or
 * mixed (computed whole, and the row functions mask element by element:
 * -inf before the softmax, P = dS = 0 after).  A masked key of a mixed
 * tile still enters the P v and dS k products as 0 * v, 0 * k (NaN if
 * they are not finite, where the interpreter skips the key).  NULL
 * positions (and any positions without causal) take the index path,
 * unchanged.
 *
 * Sliding window (window W > 0, with causal): key s is visible to query t
 * iff qpos[t] - W < kpos[s] <= qpos[t].  It always takes the position path
 * (without positions, with 0, 1, ... for both), where tile_kind also skips
 * a tile whose keys all lie before every row's window and calls a tile
 * whole only when every key is inside every row's window; the row
 * functions mask both edges (kvis).  So a row costs O(W) key blocks, and
 * under context parallel the window spans the ranks' chunks by global
 * position.
 *
 * Forward.  One job per (b, h, tile of BQ query rows).  The job walks the
 * visible keys in blocks of BK: a [BQ, BK] tile of scores, then per row the
 * running max m and running sum l of e^(score - m) are updated, the row of
 * o (which accumulates e^(score - m) v in place) is rescaled by
 * e^(m_old - m_new), and the tile's P v is added.  At the end o /= l and
 * lse = m + log l.  No [T, S] matrix is ever stored.  A row that sees no key
 * (or only -inf scores) gets o = 0 and lse = -inf, never NaN.
 *
 * Backward (FlashAttention-2) recomputes P = e^(scale q.k - lse) from the
 * saved lse, with Dt = do_t . o_t:
 *     dv_s += P do_t;  dS = P (do_t . v_s - Dt) scale;  dq_t += dS k_s;  dk_s += dS q_t
 * One job per (b, h), key blocks outside and query tiles inside, so the
 * dk/dv rows of a key block stay in cache.  A job owns dq of its head; with
 * KH < H several heads add into one kv head's dk/dv, so each head then
 * writes its own dk/dv into scratch and a last pass sums the H/KH heads of
 * every kv head (deterministic, no locks).
 *
 * Tile products.  Every product is C (=|+=) A B on tiles that sit in L1/L2,
 * with A read element by element through two strides (so P^T and dS^T are
 * P and dS with the strides swapped) and B row-major:
 *     S = q kt_blk,  dP = do vt_blk                               (set, K = D)
 *     o += P v_blk,  dq += dS k_blk,  dv += P^T do,  dk += dS^T q  (add)
 * kt_blk, vt_blk are a key block of k, v transposed into one contiguous
 * [D, BK] tile (zero padded; a row stride of S floats would put a block's
 * rows in a few L1 sets when S is a power of two).  The tiles of a kv head
 * are built by the chunk of jobs that needs them, right before use (a
 * Panel): the jobs of one kv head are adjacent, so each chunk transposes
 * the heads it meets once, into a buffer that stays in L2.  Causal tiles
 * pass the diagonal's band to the product ("row i needs only the columns
 * below i + hi", "A(i, k) is zero outside lo <= k - i < hi"), so the work
 * above the diagonal is skipped at the grain of the register block; tiles
 * that are masked whole are never visited.
 *
 * The products are register-blocked micro kernels, picked once per call:
 *   avx512  6 rows x 64 columns of C in 24 zmm registers: per k, four B
 *           vectors and six broadcasts of A feed 24 FMAs.  Masked loads and
 *           stores take the last D % 16 columns, so any D runs at full
 *           speed.  The softmax rows, the backward's P/dS rows and the
 *           16x16 transposes are AVX-512 too.
 *   avx2    6 rows x 16 columns in twelve ymm registers (GCC vector types),
 *           the last D % 8 columns by plain loops; plain rows.
 *   plain   contiguous axpys and loops that the compiler vectorises.
 * KILN_KERNELS_BASELINE in the environment forces plain, and
 * KILN_ATTENTION_MICRO=plain|avx2 caps the choice (the tests run all
 * three; a CPU without the instructions gets the next one down).
 *
 * Speed (bench/attention.sh, 2-core AVX-512 Zen, one thread, the benchmark
 * GPT's attention B8 H4 T=S=256 D64 causal): forward about 140 GFLOP/s,
 * backward about 140, where the previous AVX2 micro kernels (4 x 16, k
 * transposed with a row stride of S) gave 32 and 61 and OpenBLAS sgemm
 * (Haswell kernels on this CPU) gives about 100 per core.  The rest of the
 * time goes to the exponentials and row reductions, the transposes (the
 * first touch of k and v) and zeroing dq, dk, dv.  BQ = 64, BK = 128 came
 * out best of 48..128 x 64..256 there (within the machine's noise).
 *
 * Numerics: scores and products are f32 with FMA (the same sums in the
 * same order in every micro kernel); the row sums of e^(score - m) are
 * double across key blocks (within a block: f32 lanes with AVX-512, double
 * otherwise); Dt is a double sum.  The AVX-512 exponential is k_exp's
 * polynomial.
 */
#include "kern.h"

/* tile sizes (-DBQ=, -DBK= override them, for tuning) */
#ifndef BQ
#define BQ 64 /* query rows per tile */
#endif
#ifndef BK
#define BK 128 /* keys per block */
#endif
_Static_assert(BK % 16 == 0 && BK > 0 && BQ > 0, "BK must be a multiple of 16 (the transposes' and vectors' width)");

/* "no causal limit" for the band arguments of the products */
#define NOLIM ((int64_t)1 << 40)

enum { MM_SET, MM_ADD };

/* C [rows, cols] (row stride ldc), A(i, k) = a[i*ars + k*aks], B [K, cols]
 * (row stride ldb).
 *   MM_SET: C = A B; row i needs only the columns j < i + hi (the others
 *           may be left holding anything; lo is unused).
 *   MM_ADD: C += A B, where A(i, k) is zero unless lo <= k - i < hi, so
 *           only that band of k is read. */
typedef void (*mm_fn)(int mode, float *c, int64_t ldc, int64_t rows, int64_t cols, const float *a, int64_t ars,
                      int64_t aks, const float *b, int64_t ldb, int64_t K, int64_t lo, int64_t hi);
/* the forward's softmax rows of a score tile, see fwd_rows */
typedef void (*fwd_rows_fn)(float *sc, int64_t rows, int64_t ncols, int64_t hi, float scale, float *m, double *l,
                            float *o, int64_t D, const int32_t *kp, const int32_t *qp, int64_t win);
/* the backward's P and dS rows of a tile, see bwd_rows */
typedef void (*bwd_rows_fn)(float *p, float *ds, int64_t rows, int64_t ncols, int64_t hi, float scale,
                            const float *lse, const float *dt, const int32_t *kp, const int32_t *qp, int64_t win);
/* one key block of k or v transposed, see tblock */
typedef void (*tblock_fn)(const float *src, int64_t n, int64_t D, float *tile);

typedef struct {
    const float *q, *k, *v, *o, *lse, *dO;
    float *o_out, *lse_out, *dq, *dk, *dv;
    int64_t B, H, KH, T, S, D, nblk; /* nblk: key blocks, ceil(S / BK) */
    int causal;                 /* by index (s <= t); 0 when positions are given */
    const int32_t *qpos, *kpos; /* causal by position, or NULL: see tile_kind */
    int32_t *iota;              /* a window without positions: qpos = kpos = 0, 1, ... (owned) */
    int64_t win;                /* keys per query under a window, else NOLIM */
    float scale;
    rt_ctx *ctx;
    float *dt;        /* backward: do.o per query row [B,H,T] */
    float *dkh, *dvh; /* backward with H > KH: per query head [B,H,S,D] */
    mm_fn mm;
    fwd_rows_fn fwd_rows;
    bwd_rows_fn bwd_rows;
    tblock_fn tblock;
} Attn;

static inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }

/* ---- the plain ISA: contiguous axpys ---- */

K_CLONES static void mm_plain(int mode, float *c, int64_t ldc, int64_t rows, int64_t cols, const float *a, int64_t ars,
                              int64_t aks, const float *b, int64_t ldb, int64_t K, int64_t lo, int64_t hi) {
    for (int64_t i = 0; i < rows; i++) {
        float *ci = c + i * ldc;
        int64_t n = cols, k0 = 0, k1 = K;
        if (mode == MM_SET) {
            n = imax(0, imin(cols, i + hi));
            memset(ci, 0, sizeof(float) * (size_t)n);
        } else {
            k0 = imax(0, i + lo);
            k1 = imin(K, i + hi);
        }
        for (int64_t k = k0; k < k1; k++) k_axpy(ci, a[i * ars + k * aks], b + k * ldb, n);
    }
}

/* visible keys of tile row r in a block of ncols keys, for the band hi */
static inline int64_t row_nb(int64_t r, int64_t hi, int64_t ncols) { return imax(0, imin(ncols, r + hi)); }

/* the lowest key position the query at position qr sees under a window of
 * win keys (qr - win + 1, clamped to the int32 range) */
static inline int32_t win_lo(int32_t qr, int64_t win) {
    int64_t lo = (int64_t)qr - win + 1;
    return lo < INT32_MIN ? INT32_MIN : (int32_t)lo;
}

/* key position k is visible to the query at qr, whose window starts at lo */
static inline int kvis(int32_t k, int32_t qr, int32_t lo) { return k <= qr && k >= lo; }

/* max of x[0..n) (-inf for n = 0, NaN if any is NaN) in eight lanes
 * without branches (k_max's NaN test branches on every element) */
static inline float row_max(const float *x, int64_t n) {
    float m[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    int nan[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int u = 0; u < 8; u++) {
            float y = x[i + u];
            m[u] = y > m[u] ? y : m[u];
            nan[u] |= y != y;
        }
    for (; i < n; i++) {
        m[0] = x[i] > m[0] ? x[i] : m[0];
        nan[0] |= x[i] != x[i];
    }
    for (int u = 1; u < 8; u++) {
        m[0] = m[u] > m[0] ? m[u] : m[0];
        nan[0] |= nan[u];
    }
    return nan[0] ? NAN : m[0];
}

/* The forward's softmax on a score tile sc [rows, BK]: row r holds q.k
 * for the block's first ncols keys, of which the first row_nb(r, hi, ncols)
 * are visible.  Updates the row's running max m[r] and sum l[r], turns
 * the row into e^(scale q.k - m) (0 where masked) and scales the row of o
 * [rows, D] by e^(m_old - m_new), ready for this block's P v. */
K_CLONES static void fwd_rows(float *sc, int64_t rows, int64_t ncols, int64_t hi, float scale, float *m, double *l,
                              float *o, int64_t D, const int32_t *kp, const int32_t *qp, int64_t win) {
    for (int64_t r = 0; r < rows; r++) {
        float *x = sc + r * BK;
        int64_t nb = row_nb(r, hi, ncols);
        int32_t qr = kp ? qp[r] : 0, lo = win_lo(qr, win);
        for (int64_t j = 0; j < nb; j++) x[j] *= scale;
        if (kp)
            for (int64_t j = 0; j < nb; j++) x[j] = kvis(kp[j], qr, lo) ? x[j] : -INFINITY;
        float mb = row_max(x, nb), mnew = k_max2(m[r], mb);
        if (nb == 0 || mnew == -INFINITY) { /* nothing visible, or only -inf scores so far */
            memset(x, 0, sizeof(float) * (size_t)ncols);
            continue;
        }
        float alpha = k_exp(m[r] - mnew);
        for (int64_t j = 0; j < nb; j++) x[j] = k_exp(x[j] - mnew);
        if (kp)
            for (int64_t j = 0; j < nb; j++) x[j] = kvis(kp[j], qr, lo) ? x[j] : 0;
        for (int64_t j = nb; j < ncols; j++) x[j] = 0;
        l[r] = l[r] * alpha + k_dsum(x, nb);
        m[r] = mnew;
        if (alpha != 1.0f)
            for (int64_t d = 0; d < D; d++) o[r * D + d] *= alpha;
    }
}

/* The backward's rows of a tile: p [rows, BK] holds q.k, ds holds do.v,
 * the first row_nb(r, hi, ncols) keys of row r are visible (none where
 * lse is -inf).  p becomes P = e^(scale q.k - lse), ds becomes
 * P (do.v - Dt) scale; both are 0 where masked. */
K_CLONES static void bwd_rows(float *p, float *ds, int64_t rows, int64_t ncols, int64_t hi, float scale,
                              const float *lse, const float *dt, const int32_t *kp, const int32_t *qp, int64_t win) {
    for (int64_t r = 0; r < rows; r++) {
        float *pr = p + r * BK, *dr = ds + r * BK, L = lse[r], Dt = dt[r];
        int64_t nb = L == -INFINITY ? 0 : row_nb(r, hi, ncols);
        int32_t qr = kp ? qp[r] : 0, lo = win_lo(qr, win);
        for (int64_t j = 0; j < nb; j++) {
            pr[j] = k_exp(pr[j] * scale - L);
            dr[j] = pr[j] * (dr[j] - Dt) * scale;
        }
        if (kp)
            for (int64_t j = 0; j < nb; j++)
                if (!kvis(kp[j], qr, lo)) pr[j] = dr[j] = 0;
        for (int64_t j = nb; j < ncols; j++) pr[j] = dr[j] = 0;
    }
}

/* tile [D, BK] = the key block src [n, D] transposed, zero padded to BK keys */
static void tblock(const float *src, int64_t n, int64_t D, float *tile) {
    for (int64_t s = 0; s < n; s++)
        for (int64_t d = 0; d < D; d++) tile[d * BK + s] = src[s * D + d];
    for (int64_t d = 0; d < D; d++)
        for (int64_t s = n; s < BK; s++) tile[d * BK + s] = 0;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ATTN_X86 1

/* ---- avx2: a 6x16 block of C in twelve ymm registers ---- */

#define AVX2 __attribute__((target("avx2,fma")))
typedef float v8 __attribute__((vector_size(32)));
typedef float v8u __attribute__((vector_size(32), aligned(4), may_alias)); /* unaligned access */
#define LD8(p) (*(const v8u *)(p))
#define ST8(p, x) (*(v8u *)(p) = (x))
#define MR 6 /* rows of the register block (both ISAs) */
#define ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)

/* C[0..R) x [0..8 NV) (=|+=) sum over k < K, NV <= 2; R and NV are
 * constants after inlining, so the guards vanish.  The accumulators are
 * named variables, not an array: GCC keeps an array of them in memory
 * across the k loop. */
AVX2 static inline __attribute__((always_inline)) void blk_avx2(int add, float *c, int64_t ldc, const float *a,
                                                                 int64_t ars, int64_t aks, const float *b, int64_t ldb,
                                                                 int64_t K, const int R, const int NV) {
#define DECL(r) v8 c##r##0 = {0}, c##r##1 = {0};
    ROWS(DECL)
#define LOADC(r)                                                                                                      \
    if (add && (r) < R) {                                                                                             \
        c##r##0 = LD8(c + (r) * ldc);                                                                                 \
        if (NV > 1) c##r##1 = LD8(c + (r) * ldc + 8);                                                                 \
    }
    ROWS(LOADC)
    for (int64_t k = 0; k < K; k++) {
        v8 b0 = LD8(b + k * ldb), b1 = b0;
        if (NV > 1) b1 = LD8(b + k * ldb + 8);
#define FMA(r)                                                                                                        \
    if ((r) < R) {                                                                                                    \
        float s = a[(r) * ars + k * aks];                                                                             \
        c##r##0 += s * b0;                                                                                            \
        if (NV > 1) c##r##1 += s * b1;                                                                                \
    }
        ROWS(FMA)
    }
#define STOREC(r)                                                                                                     \
    if ((r) < R) {                                                                                                    \
        ST8(c + (r) * ldc, c##r##0);                                                                                  \
        if (NV > 1) ST8(c + (r) * ldc + 8, c##r##1);                                                                  \
    }
    ROWS(STOREC)
#undef DECL
#undef LOADC
#undef FMA
#undef STOREC
}

#define BLK2_CASE(R_, NV_)                                                                                            \
    case (R_) * 8 + (NV_):                                                                                            \
        blk_avx2(add, c + j, ldc, a, ars, aks, b + j, ldb, K, R_, NV_);                                               \
        break;
#define BLK2_ROW(R_) BLK2_CASE(R_, 1) BLK2_CASE(R_, 2)

/* C[0..R) x [0..n), R <= 6: 16 columns at a time, then 8, then plain loops */
AVX2 static void blk_any_avx2(int add, float *c, int64_t ldc, const float *a, int64_t ars, int64_t aks, const float *b,
                              int64_t ldb, int64_t K, int64_t R, int64_t n) {
    int64_t n8 = n / 8 * 8;
    for (int64_t j = 0; j < n8; j += 16) switch (R * 8 + (j + 16 <= n ? 2 : 1)) {
            BLK2_ROW(1) BLK2_ROW(2) BLK2_ROW(3) BLK2_ROW(4) BLK2_ROW(5) BLK2_ROW(6)
        default: break;
        }
    for (int64_t i = 0; i < R && n8 < n; i++) {
        float *ci = c + i * ldc + n8;
        if (!add) memset(ci, 0, sizeof(float) * (size_t)(n - n8));
        for (int64_t k = 0; k < K; k++) k_axpy(ci, a[i * ars + k * aks], b + k * ldb + n8, n - n8);
    }
}

AVX2 static void mm_avx2(int mode, float *c, int64_t ldc, int64_t rows, int64_t cols, const float *a, int64_t ars,
                         int64_t aks, const float *b, int64_t ldb, int64_t K, int64_t lo, int64_t hi) {
    int add = mode == MM_ADD;
    for (int64_t r = 0; r < rows; r += MR) {
        int64_t R = imin(MR, rows - r), n = cols, k0 = 0, k1 = K;
        if (add) {
            k0 = imax(0, r + lo);
            k1 = imin(K, r + R - 1 + hi);
            if (k0 >= k1) continue;
        } else { /* the band's columns, rounded up to whole vectors */
            n = imax(0, imin(cols, (r + R - 1 + hi + 15) / 16 * 16));
        }
        blk_any_avx2(add, c + r * ldc, ldc, a + r * ars + k0 * aks, ars, aks, b + k0 * ldb, ldb, k1 - k0, R, n);
    }
}

/* ---- avx512: a 6x64 block of C in 24 zmm registers ---- */

#include <immintrin.h>

#define AVX512 __attribute__((target("avx512f,avx2,fma")))
#define MV 4 /* vectors of 16 columns */

/* C[0..R) x [0..16 NV) (=|+=) sum over k < K; `last` masks the columns of
 * the last vector.  R and NV are constants after inlining, so the guards
 * below vanish.  The accumulators are named variables, not an array: GCC
 * keeps an array of them in memory across the k loop. */
#define MASK(v) ((v) == NV - 1 ? last : (__mmask16)0xFFFF)
AVX512 static inline __attribute__((always_inline)) void blk_avx512(int add, float *c, int64_t ldc, const float *a,
                                                                     int64_t ars, int64_t aks, const float *b,
                                                                     int64_t ldb, int64_t K, const int R,
                                                                     const int NV, __mmask16 last) {
#define DECL(r) __m512 c##r##0 = _mm512_setzero_ps(), c##r##1 = c##r##0, c##r##2 = c##r##0, c##r##3 = c##r##0;
    ROWS(DECL)
#define LOADC(r)                                                                                                      \
    if (add && (r) < R) {                                                                                             \
        c##r##0 = _mm512_maskz_loadu_ps(MASK(0), c + (r) * ldc);                                                      \
        if (NV > 1) c##r##1 = _mm512_maskz_loadu_ps(MASK(1), c + (r) * ldc + 16);                                     \
        if (NV > 2) c##r##2 = _mm512_maskz_loadu_ps(MASK(2), c + (r) * ldc + 32);                                     \
        if (NV > 3) c##r##3 = _mm512_maskz_loadu_ps(MASK(3), c + (r) * ldc + 48);                                     \
    }
    ROWS(LOADC)
    for (int64_t k = 0; k < K; k++) {
        const float *bk = b + k * ldb;
        __m512 b0 = _mm512_maskz_loadu_ps(MASK(0), bk), b1 = b0, b2 = b0, b3 = b0;
        if (NV > 1) b1 = _mm512_maskz_loadu_ps(MASK(1), bk + 16);
        if (NV > 2) b2 = _mm512_maskz_loadu_ps(MASK(2), bk + 32);
        if (NV > 3) b3 = _mm512_maskz_loadu_ps(MASK(3), bk + 48);
#define FMA(r)                                                                                                        \
    if ((r) < R) {                                                                                                    \
        __m512 s = _mm512_set1_ps(a[(r) * ars + k * aks]);                                                            \
        c##r##0 = _mm512_fmadd_ps(s, b0, c##r##0);                                                                    \
        if (NV > 1) c##r##1 = _mm512_fmadd_ps(s, b1, c##r##1);                                                        \
        if (NV > 2) c##r##2 = _mm512_fmadd_ps(s, b2, c##r##2);                                                        \
        if (NV > 3) c##r##3 = _mm512_fmadd_ps(s, b3, c##r##3);                                                        \
    }
        ROWS(FMA)
    }
#define STOREC(r)                                                                                                     \
    if ((r) < R) {                                                                                                    \
        _mm512_mask_storeu_ps(c + (r) * ldc, MASK(0), c##r##0);                                                       \
        if (NV > 1) _mm512_mask_storeu_ps(c + (r) * ldc + 16, MASK(1), c##r##1);                                      \
        if (NV > 2) _mm512_mask_storeu_ps(c + (r) * ldc + 32, MASK(2), c##r##2);                                      \
        if (NV > 3) _mm512_mask_storeu_ps(c + (r) * ldc + 48, MASK(3), c##r##3);                                      \
    }
    ROWS(STOREC)
#undef DECL
#undef LOADC
#undef FMA
#undef STOREC
}

#define BLK_CASE(R_, NV_)                                                                                             \
    case (R_) * 8 + (NV_):                                                                                            \
        blk_avx512(add, c, ldc, a, ars, aks, b, ldb, K, R_, NV_, last);                                               \
        break;
#define BLK_ROW(R_) BLK_CASE(R_, 1) BLK_CASE(R_, 2) BLK_CASE(R_, 3) BLK_CASE(R_, 4)

/* C[0..R) x [0..n), n <= 64; the full 6x64 block without masks */
AVX512 static void blk_any_avx512(int add, float *c, int64_t ldc, const float *a, int64_t ars, int64_t aks,
                                  const float *b, int64_t ldb, int64_t K, int64_t R, int64_t n) {
    if (R == MR && n == 16 * MV) {
        blk_avx512(add, c, ldc, a, ars, aks, b, ldb, K, MR, MV, 0xFFFF);
        return;
    }
    int64_t nv = (n + 15) / 16;
    __mmask16 last = (__mmask16)(n % 16 ? (1u << (n % 16)) - 1 : 0xFFFFu);
    switch (R * 8 + nv) {
        BLK_ROW(1) BLK_ROW(2) BLK_ROW(3) BLK_ROW(4) BLK_ROW(5) BLK_ROW(6)
    default: break;
    }
}

AVX512 static void mm_avx512(int mode, float *c, int64_t ldc, int64_t rows, int64_t cols, const float *a, int64_t ars,
                             int64_t aks, const float *b, int64_t ldb, int64_t K, int64_t lo, int64_t hi) {
    int add = mode == MM_ADD;
    for (int64_t r = 0; r < rows; r += MR) {
        int64_t R = imin(MR, rows - r), n = cols, k0 = 0, k1 = K;
        if (add) {
            k0 = imax(0, r + lo);
            k1 = imin(K, r + R - 1 + hi);
            if (k0 >= k1) continue;
        } else { /* the band's columns, rounded up to whole vectors */
            n = imax(0, imin(cols, (r + R - 1 + hi + 15) / 16 * 16));
        }
        for (int64_t j = 0; j < n; j += 16 * MV)
            blk_any_avx512(add, c + r * ldc + j, ldc, a + r * ars + k0 * aks, ars, aks, b + k0 * ldb + j, ldb, k1 - k0,
                           R, imin(16 * MV, n - j));
    }
}

/* e^x on 16 lanes: k_exp's polynomial, with 2^n applied by scalef, which
 * saturates by itself (to 0 through denormals far below, where k_exp
 * flushes to 0, and to inf far above); x = -inf, where r is NaN, is set to
 * 0 by the mask.  (x = +inf gives NaN, k_exp inf; the callers' x is a
 * score minus the row's max or lse, so only for inf or NaN inputs.) */
AVX512 static inline __m512 exp_avx512(__m512 x) {
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    __m512 y = _mm512_scalef_ps(p, n);
    return _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ), _mm512_setzero_ps());
}

static inline __mmask16 lanes(int64_t n) { return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1); }

/* the lanes of keys [j, j+16) below n that the query at position qr (its
 * window from lo) sees: kp NULL (no element mask) or lo <= kp[key] <= qr */
AVX512 static inline __mmask16 vis16(const int32_t *kp, int32_t qr, int32_t lo, int64_t j, int64_t n) {
    __mmask16 k = lanes(n - j);
    if (!kp) return k;
    __m512i kv = _mm512_maskz_loadu_epi32(k, kp + j);
    k = _mm512_mask_cmp_epi32_mask(k, kv, _mm512_set1_epi32(qr), _MM_CMPINT_LE);
    return _mm512_mask_cmp_epi32_mask(k, kv, _mm512_set1_epi32(lo), _MM_CMPINT_NLT);
}

/* fwd_rows on 16 lanes */
AVX512 static void fwd_rows_avx512(float *sc, int64_t rows, int64_t ncols, int64_t hi, float scale, float *m,
                                   double *l, float *o, int64_t D, const int32_t *kp, const int32_t *qp, int64_t win) {
    __m512 vs = _mm512_set1_ps(scale);
    for (int64_t r = 0; r < rows; r++) {
        float *x = sc + r * BK;
        int64_t nb = row_nb(r, hi, ncols);
        int32_t qr = kp ? qp[r] : 0, lo = win_lo(qr, win);
        __m512 vmax = _mm512_set1_ps(-INFINITY);
        __mmask16 nan = 0;
        for (int64_t j = 0; j < nb; j += 16) {
            __mmask16 k = vis16(kp, qr, lo, j, nb);
            __m512 y = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + j), vs);
            nan |= _mm512_mask_cmp_ps_mask(k, y, y, _CMP_UNORD_Q);
            vmax = _mm512_mask_max_ps(vmax, k, y, vmax);
        }
        float mb = nan ? NAN : _mm512_reduce_max_ps(vmax), mnew = k_max2(m[r], mb);
        if (nb == 0 || mnew == -INFINITY) {
            memset(x, 0, sizeof(float) * (size_t)ncols);
            continue;
        }
        float alpha = k_exp(m[r] - mnew);
        __m512 vm = _mm512_set1_ps(mnew), sum = _mm512_setzero_ps();
        for (int64_t j = 0; j < ncols; j += 16) {
            __mmask16 k = lanes(ncols - j), vis = nb > j ? vis16(kp, qr, lo, j, nb) : 0;
            __m512 e = _mm512_maskz_mov_ps(vis, exp_avx512(_mm512_fmsub_ps(_mm512_maskz_loadu_ps(vis, x + j), vs, vm)));
            _mm512_mask_storeu_ps(x + j, k, e);
            sum = _mm512_add_ps(sum, e);
        }
        l[r] = l[r] * alpha + (double)_mm512_reduce_add_ps(sum);
        m[r] = mnew;
        if (alpha != 1.0f) {
            __m512 va = _mm512_set1_ps(alpha);
            for (int64_t d = 0; d < D; d += 16) {
                __mmask16 k = lanes(D - d);
                _mm512_mask_storeu_ps(o + r * D + d, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, o + r * D + d), va));
            }
        }
    }
}

/* bwd_rows on 16 lanes */
AVX512 static void bwd_rows_avx512(float *p, float *ds, int64_t rows, int64_t ncols, int64_t hi, float scale,
                                   const float *lse, const float *dt, const int32_t *kp, const int32_t *qp, int64_t win) {
    __m512 vs = _mm512_set1_ps(scale);
    for (int64_t r = 0; r < rows; r++) {
        float *pr = p + r * BK, *dr = ds + r * BK;
        int64_t nb = lse[r] == -INFINITY ? 0 : row_nb(r, hi, ncols);
        int32_t qr = kp ? qp[r] : 0, lo = win_lo(qr, win);
        __m512 vl = _mm512_set1_ps(lse[r]), vd = _mm512_set1_ps(dt[r]);
        for (int64_t j = 0; j < ncols; j += 16) {
            __mmask16 k = lanes(ncols - j), vis = nb > j ? vis16(kp, qr, lo, j, nb) : 0;
            __m512 e = _mm512_maskz_mov_ps(vis, exp_avx512(_mm512_fmsub_ps(_mm512_maskz_loadu_ps(vis, pr + j), vs, vl)));
            __m512 d = _mm512_mul_ps(_mm512_mul_ps(e, _mm512_sub_ps(_mm512_maskz_loadu_ps(vis, dr + j), vd)), vs);
            _mm512_mask_storeu_ps(pr + j, k, e);
            _mm512_mask_storeu_ps(dr + j, k, d);
        }
    }
}

/* r[j] = column j of the 16x16 block whose rows are r[0..16) */
AVX512 static inline __attribute__((always_inline)) void transpose16(__m512 *r) {
    __m512 t[16];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
        __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
        r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    /* r[4i+j], 128-bit lane L: element 4L+j of rows 4i..4i+3 */
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        t[j] = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x88);
        t[4 + j] = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xdd);
        t[8 + j] = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x88);
        t[12 + j] = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xdd);
    }
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        r[j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0x88);
        r[4 + j] = _mm512_shuffle_f32x4(t[4 + j], t[12 + j], 0x88);
        r[8 + j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0xdd);
        r[12 + j] = _mm512_shuffle_f32x4(t[4 + j], t[12 + j], 0xdd);
    }
}

/* tblock in 16x16 register transposes */
AVX512 static void tblock_avx512(const float *src, int64_t n, int64_t D, float *tile) {
    for (int64_t s = 0; s < BK; s += 16)
        for (int64_t d = 0; d < D; d += 16) {
            __m512 r[16];
            __mmask16 k = lanes(D - d);
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++)
                r[i] = s + i < n ? _mm512_maskz_loadu_ps(k, src + (s + i) * D + d) : _mm512_setzero_ps();
            transpose16(r);
#pragma GCC unroll 16
            for (int j = 0; j < 16; j++)
                if (d + j < D) _mm512_storeu_ps(tile + (d + j) * BK + s, r[j]);
        }
}
#endif

/* the micro kernels: the best this CPU has, capped by the environment */
static void pick_micro(Attn *t) {
    t->mm = mm_plain;
    t->fwd_rows = fwd_rows;
    t->bwd_rows = bwd_rows;
    t->tblock = tblock;
#ifdef ATTN_X86
    const char *cap = getenv("KILN_ATTENTION_MICRO");
    if (getenv("KILN_KERNELS_BASELINE") || (cap && !strcmp(cap, "plain"))) return;
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return;
    t->mm = mm_avx2;
    if (cap && !strcmp(cap, "avx2")) return;
    if (!__builtin_cpu_supports("avx512f")) return;
    t->mm = mm_avx512;
    t->fwd_rows = fwd_rows_avx512;
    t->bwd_rows = bwd_rows_avx512;
    t->tblock = tblock_avx512;
#endif
}

/* ---- shared pieces ---- */

/* a: the dims (B, H, KH, T, S, D, causal, scale), then qpos, kpos, window.
 * A window without positions takes the position path with positions
 * 0, 1, ... (one i32 array for both; the index band has no lower edge).
 * 0, or -1 (out of memory, the step failed). */
static int attn_args(Attn *t, const int64_t *a) {
    t->B = a[0];
    t->H = a[1];
    t->KH = a[2];
    t->T = a[3];
    t->S = a[4];
    t->D = a[5];
    t->causal = a[6] != 0;
    t->scale = (float)rt_bits_f64(a[7]);
    t->nblk = (t->S + BK - 1) / BK;
    t->win = t->causal && a[10] > 0 ? a[10] : NOLIM;
    if (t->causal && a[8] && a[9]) { /* causal by position: no index band */
        t->qpos = RT_I32P(a[8]);
        t->kpos = RT_I32P(a[9]);
        t->causal = 0;
    } else if (t->win != NOLIM) {
        int64_t n = imax(t->T, t->S);
        t->iota = k_alloc(t->ctx, "attention", sizeof(int32_t) * (size_t)imax(n, 1));
        if (!t->iota) return -1;
        for (int64_t i = 0; i < n; i++) t->iota[i] = (int32_t)i;
        t->qpos = t->kpos = t->iota;
        t->causal = 0;
    }
    pick_micro(t);
    return 0;
}

/* With positions, how keys [s0, s0+*n) meet query rows [t0, t0+rows):
 * TILE_NONE when every key is later than every query (min kpos > max
 * qpos) or, under a window of W keys, older than every query's window
 * (min qpos - max kpos >= W): the tile is skipped; TILE_ALL when every
 * query sees every key (min qpos >= max kpos, max qpos - min kpos < W: no
 * mask), else TILE_SOME (the row functions mask element by element).  *n is first cut to the last key any of the rows
 * sees: a key block that holds the end of one sequence chunk and the start
 * of a later one (a dual-chunk cp rank whose chunks are shorter than BK)
 * then costs only its visible part, which is how ring attention's "full
 * Q x first half of KV" section comes out of one kernel.  Without
 * positions every tile is TILE_ALL here (the index band does the causal
 * work).  O(rows + n), against the tile's O(rows n D). */
enum { TILE_NONE, TILE_SOME, TILE_ALL };
static int tile_kind(const Attn *t, int64_t t0, int64_t rows, int64_t s0, int64_t *n) {
    if (!t->qpos) return TILE_ALL;
    int32_t qmin = INT32_MAX, qmax = INT32_MIN, kmin = INT32_MAX, kmax = INT32_MIN;
    for (int64_t r = t0; r < t0 + rows; r++) {
        qmin = t->qpos[r] < qmin ? t->qpos[r] : qmin;
        qmax = t->qpos[r] > qmax ? t->qpos[r] : qmax;
    }
    while (*n > 0 && t->kpos[s0 + *n - 1] > qmax) --*n;
    if (*n == 0) return TILE_NONE;
    for (int64_t s = s0; s < s0 + *n; s++) {
        kmin = t->kpos[s] < kmin ? t->kpos[s] : kmin;
        kmax = t->kpos[s] > kmax ? t->kpos[s] : kmax;
    }
    if ((int64_t)qmin - kmax >= t->win) return TILE_NONE;
    return qmin >= kmax && (int64_t)qmax - kmin < t->win ? TILE_ALL : TILE_SOME;
}

/* keys visible to query row t: [0, nvis) */
static int64_t nvis(const Attn *t, int64_t row) {
    if (!t->causal) return t->S;
    return row + 1 < t->S ? row + 1 : t->S;
}

/* the causal band of the tile (query rows from t0, keys from s0): query
 * row i sees the keys j < i + hi of the block */
static int64_t band_hi(const Attn *t, int64_t t0, int64_t s0) { return t->causal ? t0 - s0 + 1 : NOLIM; }

/* A chunk of jobs' transposed keys (and values): blocks [0, ready) of kv
 * head bk (= b*KH + kh) as [nblk, D, BK] tiles, zero padded.  Jobs of one
 * kv head come in a row (query heads of a group are adjacent), so a chunk
 * transposes each kv head it meets once, right before use, while the
 * tiles fit in L2. */
typedef struct {
    float *kt, *vt;
    int64_t bk, ready;
} Panel;

/* 0, or -1 (out of memory, the step failed) */
static int panel_open(const Attn *t, Panel *p, int with_v) {
    size_t n = (size_t)(t->nblk * t->D * BK);
    *p = (Panel){.bk = -1};
    p->kt = k_alloc(t->ctx, "attention", sizeof(float) * n * (with_v ? 2 : 1));
    if (!p->kt) return -1;
    if (with_v) p->vt = p->kt + n;
    return 0;
}

/* make blocks [0, nblocks) of kv head bk ready */
static void panel_need(const Attn *t, Panel *p, int64_t bk, int64_t nblocks) {
    int64_t S = t->S, D = t->D;
    if (p->bk != bk) p->bk = bk, p->ready = 0;
    for (; p->ready < nblocks; p->ready++) {
        int64_t s0 = p->ready * BK, off = p->ready * D * BK;
        t->tblock(t->k + (bk * S + s0) * D, imin(BK, S - s0), D, p->kt + off);
        if (p->vt) t->tblock(t->v + (bk * S + s0) * D, imin(BK, S - s0), D, p->vt + off);
    }
}

/* ---- forward ---- */

/* query rows [t0, t0+rows) of head (b, h); kt: the kv head's transposed keys */
K_CLONES static void fwd_tile(const Attn *t, int64_t b, int64_t h, int64_t t0, int64_t rows, const float *kt) {
    int64_t D = t->D, kh = h / (t->H / t->KH);
    const float *q = t->q + ((b * t->H + h) * t->T + t0) * D, *v = t->v + (b * t->KH + kh) * t->S * D;
    float *o = t->o_out + ((b * t->H + h) * t->T + t0) * D, *lse = t->lse_out + (b * t->H + h) * t->T + t0;
    float sc[BQ * BK] __attribute__((aligned(64))), m[BQ];
    double l[BQ];
    memset(o, 0, sizeof(float) * (size_t)(rows * D));
    for (int64_t r = 0; r < rows; r++) m[r] = -INFINITY, l[r] = 0;
    int64_t send = nvis(t, t0 + rows - 1);
    for (int64_t s0 = 0; s0 < send; s0 += BK) {
        int64_t ncols = imin(BK, send - s0), hi = band_hi(t, t0, s0);
        int kind = tile_kind(t, t0, rows, s0, &ncols);
        if (kind == TILE_NONE) continue;
        const int32_t *kp = kind == TILE_SOME ? t->kpos + s0 : NULL, *qp = kind == TILE_SOME ? t->qpos + t0 : NULL;
        t->mm(MM_SET, sc, BK, rows, ncols, q, D, 1, kt + s0 / BK * D * BK, BK, D, 0, hi);
        t->fwd_rows(sc, rows, ncols, hi, t->scale, m, l, o, D, kp, qp, t->win);
        t->mm(MM_ADD, o, D, rows, D, sc, BK, 1, v + s0 * D, D, ncols, -NOLIM, hi);
    }
    for (int64_t r = 0; r < rows; r++) {
        float *orow = o + r * D;
        if (m[r] == -INFINITY || l[r] == 0) {
            memset(orow, 0, sizeof(float) * (size_t)D);
            lse[r] = -INFINITY;
            continue;
        }
        float inv = (float)(1 / l[r]);
        for (int64_t d = 0; d < D; d++) orow[d] *= inv;
        lse[r] = (float)(m[r] + log(l[r]));
    }
}

static void fwd_jobs(void *data, int64_t i0, int64_t i1) {
    const Attn *t = data;
    int64_t ntiles = (t->T + BQ - 1) / BQ;
    Panel p;
    if (panel_open(t, &p, 0)) return;
    for (int64_t i = i0; i < i1; i++) {
        int64_t bh = i / ntiles, t0 = i % ntiles * BQ, rows = imin(BQ, t->T - t0);
        int64_t b = bh / t->H, h = bh % t->H, send = nvis(t, t0 + rows - 1);
        panel_need(t, &p, b * t->KH + h / (t->H / t->KH), (send + BK - 1) / BK);
        fwd_tile(t, b, h, t0, rows, p.kt);
    }
    free(p.kt);
}

static void attn_fwd(Attn *t) {
    if (t->B * t->H * t->T == 0) return;
    if (t->S == 0) { /* no keys: o = 0, lse = -inf */
        memset(t->o_out, 0, sizeof(float) * (size_t)(t->B * t->H * t->T * t->D));
        for (int64_t i = 0; i < t->B * t->H * t->T; i++) t->lse_out[i] = -INFINITY;
        return;
    }
    int64_t ntiles = (t->T + BQ - 1) / BQ;
    k_par(t->ctx, t->B * t->H * ntiles, 4 * BQ * t->S * t->D, fwd_jobs, t);
}

/* args: q, k, v, o, lse, B, H, KH, T, S, D, causal, scale, qpos, kpos, window */
void rtk_attention(rt_ctx *ctx, const int64_t *a) {
    Attn t = {.q = A_F32(0), .k = A_F32(1), .v = A_F32(2), .o_out = A_F32(3), .lse_out = A_F32(4), .ctx = ctx};
    if (attn_args(&t, a + 5)) return;
    attn_fwd(&t);
    free(t.iota);
}

/* ---- backward ---- */

/* head (b, h); kt, vt: the kv head's transposed keys and values */
K_CLONES static void bwd_head(const Attn *t, int64_t b, int64_t h, const float *kt, const float *vt) {
    int64_t T = t->T, S = t->S, D = t->D, kh = h / (t->H / t->KH);
    int64_t qoff = (b * t->H + h) * T * D, koff = (b * t->KH + kh) * S * D;
    const float *q = t->q + qoff, *dO = t->dO + qoff, *o = t->o + qoff, *lse = t->lse + (b * t->H + h) * T;
    const float *k = t->k + koff;
    float *dq = t->dq + qoff, *dt = t->dt + (b * t->H + h) * T;
    float *dk = t->dkh ? t->dkh + (b * t->H + h) * S * D : t->dk + koff;
    float *dv = t->dvh ? t->dvh + (b * t->H + h) * S * D : t->dv + koff;
    float p[BQ * BK] __attribute__((aligned(64))), ds[BQ * BK] __attribute__((aligned(64)));
    for (int64_t row = 0; row < T; row++) dt[row] = (float)k_ddot(dO + row * D, o + row * D, D);
    memset(dq, 0, sizeof(float) * (size_t)(T * D));
    memset(dk, 0, sizeof(float) * (size_t)(S * D));
    memset(dv, 0, sizeof(float) * (size_t)(S * D));
    for (int64_t s0 = 0; s0 < S; s0 += BK) {
        int64_t nblock = imin(BK, S - s0);
        const float *ktb = kt + s0 / BK * D * BK, *vtb = vt + s0 / BK * D * BK;
        for (int64_t t0 = t->causal ? s0 / BQ * BQ : 0; t0 < T; t0 += BQ) {
            int64_t rows = imin(BQ, T - t0), hi = band_hi(t, t0, s0), ncols = nblock;
            int kind = tile_kind(t, t0, rows, s0, &ncols);
            if (kind == TILE_NONE) continue;
            const int32_t *kp = kind == TILE_SOME ? t->kpos + s0 : NULL, *qp = kind == TILE_SOME ? t->qpos + t0 : NULL;
            t->mm(MM_SET, p, BK, rows, ncols, q + t0 * D, D, 1, ktb, BK, D, 0, hi);
            t->mm(MM_SET, ds, BK, rows, ncols, dO + t0 * D, D, 1, vtb, BK, D, 0, hi);
            t->bwd_rows(p, ds, rows, ncols, hi, t->scale, lse + t0, dt + t0, kp, qp, t->win);
            /* runs of rows with a finite lse; rows with lse = -inf see no key and
             * add nothing (not even 0 * q, which is NaN for the -inf q that
             * such a row can have) */
            for (int64_t r0 = 0, r1; r0 < rows; r0 = r1) {
                while (r0 < rows && lse[t0 + r0] == -INFINITY) r0++;
                for (r1 = r0; r1 < rows && lse[t0 + r1] != -INFINITY;) r1++;
                if (r1 == r0) break;
                int64_t tr = t0 + r0, n = r1 - r0;
                /* key row i of the block takes query rows k with tr + k >= s0 + i */
                int64_t lo = t->causal ? s0 - tr : -NOLIM, hi_q = band_hi(t, tr, s0);
                t->mm(MM_ADD, dv + s0 * D, D, ncols, D, p + r0 * BK, 1, BK, dO + tr * D, D, n, lo, NOLIM);  /* P^T do */
                t->mm(MM_ADD, dk + s0 * D, D, ncols, D, ds + r0 * BK, 1, BK, q + tr * D, D, n, lo, NOLIM); /* dS^T q */
                t->mm(MM_ADD, dq + tr * D, D, n, D, ds + r0 * BK, BK, 1, k + s0 * D, D, ncols, -NOLIM, hi_q); /* dS k */
            }
        }
    }
}

static void bwd_jobs(void *data, int64_t i0, int64_t i1) {
    const Attn *t = data;
    Panel p;
    if (panel_open(t, &p, 1)) return;
    for (int64_t i = i0; i < i1; i++) {
        int64_t b = i / t->H, h = i % t->H;
        panel_need(t, &p, b * t->KH + h / (t->H / t->KH), t->nblk);
        bwd_head(t, b, h, p.kt, p.vt);
    }
    free(p.kt);
}

/* dk[b,kh] = sum of the H/KH query heads' dkh (and dv), over elements */
static void sum_groups(void *data, int64_t e0, int64_t e1) {
    const Attn *t = data;
    int64_t rep = t->H / t->KH, SD = t->S * t->D;
    for (int64_t e = e0; e < e1; e++) { /* e = (b*KH + kh) * SD + i */
        int64_t bk = e / SD, i = e % SD, h0 = (bk / t->KH * t->H + bk % t->KH * rep) * SD + i;
        float sk = 0, sv = 0;
        for (int64_t r = 0; r < rep; r++) {
            sk += t->dkh[h0 + r * SD];
            sv += t->dvh[h0 + r * SD];
        }
        t->dk[e] = sk;
        t->dv[e] = sv;
    }
}

static void attn_bwd(Attn *t) {
    int64_t rep = t->H / t->KH, kvn = t->B * t->KH * t->S * t->D;
    if (t->B * t->H == 0) return;
    if (t->T == 0 || t->S == 0 || t->D == 0) {
        memset(t->dq, 0, sizeof(float) * (size_t)(t->B * t->H * t->T * t->D));
        memset(t->dk, 0, sizeof(float) * (size_t)kvn);
        memset(t->dv, 0, sizeof(float) * (size_t)kvn);
        return;
    }
    size_t scratch = (size_t)(t->B * t->H * t->T + (rep > 1 ? 2 * t->B * t->H * t->S * t->D : 0));
    t->dt = k_alloc(t->ctx, "attention_bwd", sizeof(float) * scratch);
    if (!t->dt) return;
    if (rep > 1) {
        t->dkh = t->dt + t->B * t->H * t->T;
        t->dvh = t->dkh + t->B * t->H * t->S * t->D;
    }
    k_par(t->ctx, t->B * t->H, 10 * t->T * t->S * t->D, bwd_jobs, t);
    if (rep > 1) k_par(t->ctx, kvn, 2 * rep, sum_groups, t);
    free(t->dt);
}

/* args: do, q, k, v, o, lse, dq, dk, dv, B, H, KH, T, S, D, causal, scale, qpos, kpos, window */
void rtk_attention_bwd(rt_ctx *ctx, const int64_t *a) {
    Attn t = {.dO = A_F32(0), .q = A_F32(1), .k = A_F32(2), .v = A_F32(3), .o = A_F32(4), .lse = A_F32(5),
              .dq = A_F32(6), .dk = A_F32(7), .dv = A_F32(8), .ctx = ctx};
    if (attn_args(&t, a + 9)) return;
    attn_bwd(&t);
    free(t.iota);
}
