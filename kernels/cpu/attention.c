/* attention.c — tiled ("flash") attention forward and backward.
 *
 * q, o [B,H,T,D]; k, v [B,KH,S,D]; lse f32 [B,H,T].  Query head h reads kv
 * head h/(H/KH) (grouped-query attention).  causal: key s is visible to
 * query t iff s <= t.  Scores are scale * q.k.
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
 * Products.  Every tile product is one of two shapes (the "micro" kernels):
 *     dot: C[r][j]  = sum_d X[r][d] Yt[d][j]      (scores: X = q, Yt = k^T)
 *     acc: C[r][d] += sum_j P(r,j) Y[j][d]        (P v, dS k, P^T do, dS^T q)
 * k and v are transposed once per call into kt, vt [B,KH,D,Sp] (Sp = S
 * rounded up to 16, zero padded) so that dot reads contiguous keys.  On a
 * CPU with AVX2 and FMA the micro kernels hold a 4x16 block of C in
 * registers (GCC vector types; about 5x the axpy loops below); elsewhere
 * they are plain loops over contiguous rows that GCC vectorises.  Setting
 * KILN_KERNELS_BASELINE in the environment forces the plain loops (tests run
 * both).  Exponentials use the branch-free k_exp.
 */
#include "kern.h"

#define BQ 32 /* query rows per tile */
#define BK 64 /* keys per block: a multiple of 16, the micro kernels' width */
#define MW 16

typedef void (*dot_fn)(float *c, int64_t ldc, const float *x, int64_t ldx, int64_t rows, const float *yt, int64_t ldy,
                       int64_t cols, int64_t D);
typedef void (*acc_fn)(float *c, int64_t ldc, int64_t rows, const float *p, int64_t prs, int64_t pjs, const float *y,
                       int64_t ldy, int64_t n, int64_t D);

typedef struct {
    const float *q, *k, *v, *o, *lse, *dO;
    float *o_out, *lse_out, *dq, *dk, *dv;
    int64_t B, H, KH, T, S, D, Sp;
    int causal;
    float scale;
    float *kt, *vt;   /* [B,KH,D,Sp] */
    float *dt;        /* backward: do.o per query row [B,H,T] */
    float *dkh, *dvh; /* backward with H > KH: per query head [B,H,S,D] */
    dot_fn dot;
    acc_fn acc;
} Attn;

/* ---- micro kernels, plain: contiguous axpys ---- */

/* C[r][j] = sum_d x[r*ldx+d] yt[d*ldy+j] for r < rows, j < cols */
static void dot_plain(float *c, int64_t ldc, const float *x, int64_t ldx, int64_t rows, const float *yt, int64_t ldy,
                      int64_t cols, int64_t D) {
    for (int64_t r = 0; r < rows; r++) {
        float *cr = c + r * ldc;
        memset(cr, 0, sizeof(float) * (size_t)cols);
        for (int64_t d = 0; d < D; d++) k_axpy(cr, x[r * ldx + d], yt + d * ldy, cols);
    }
}

/* C[r][d] += sum_{j<n} p[r*prs+j*pjs] y[j*ldy+d] for r < rows, d < D */
static void acc_plain(float *c, int64_t ldc, int64_t rows, const float *p, int64_t prs, int64_t pjs, const float *y,
                      int64_t ldy, int64_t n, int64_t D) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < n; j++) k_axpy(c + r * ldc, p[r * prs + j * pjs], y + j * ldy, D);
}

/* ---- micro kernels, AVX2 + FMA: a 4x16 block of C in eight registers ---- */

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ATTN_AVX2 1
#define AVX2 __attribute__((target("avx2,fma")))
typedef float v8 __attribute__((vector_size(32)));
typedef float v8u __attribute__((vector_size(32), aligned(4), may_alias)); /* unaligned access */
#define LD(p) (*(const v8u *)(p))
#define ST(p, x) (*(v8u *)(p) = (x))

/* dot for a multiple of 16 columns (yt readable there) */
AVX2 static void dot_avx2(float *c, int64_t ldc, const float *x, int64_t ldx, int64_t rows, const float *yt,
                          int64_t ldy, int64_t cols, int64_t D) {
    for (int64_t j = 0; j < cols; j += MW) {
        int64_t r = 0;
        for (; r + 4 <= rows; r += 4) {
            const float *x0 = x + r * ldx, *x1 = x0 + ldx, *x2 = x1 + ldx, *x3 = x2 + ldx;
            v8 a0 = {0}, b0 = {0}, a1 = {0}, b1 = {0}, a2 = {0}, b2 = {0}, a3 = {0}, b3 = {0};
            for (int64_t d = 0; d < D; d++) {
                v8 y0 = LD(yt + d * ldy + j), y1 = LD(yt + d * ldy + j + 8);
                a0 += x0[d] * y0, b0 += x0[d] * y1;
                a1 += x1[d] * y0, b1 += x1[d] * y1;
                a2 += x2[d] * y0, b2 += x2[d] * y1;
                a3 += x3[d] * y0, b3 += x3[d] * y1;
            }
            float *c0 = c + r * ldc + j;
            ST(c0, a0), ST(c0 + 8, b0), ST(c0 + ldc, a1), ST(c0 + ldc + 8, b1);
            ST(c0 + 2 * ldc, a2), ST(c0 + 2 * ldc + 8, b2), ST(c0 + 3 * ldc, a3), ST(c0 + 3 * ldc + 8, b3);
        }
        for (; r < rows; r++) {
            const float *x0 = x + r * ldx;
            v8 a0 = {0}, b0 = {0};
            for (int64_t d = 0; d < D; d++) a0 += x0[d] * LD(yt + d * ldy + j), b0 += x0[d] * LD(yt + d * ldy + j + 8);
            ST(c + r * ldc + j, a0), ST(c + r * ldc + j + 8, b0);
        }
    }
}

AVX2 static void acc_avx2(float *c, int64_t ldc, int64_t rows, const float *p, int64_t prs, int64_t pjs,
                          const float *y, int64_t ldy, int64_t n, int64_t D) {
    int64_t D16 = D / MW * MW;
    for (int64_t d = 0; d < D16; d += MW) {
        int64_t r = 0;
        for (; r + 4 <= rows; r += 4) {
            float *c0 = c + r * ldc + d;
            const float *p0 = p + r * prs;
            v8 a0 = LD(c0), b0 = LD(c0 + 8), a1 = LD(c0 + ldc), b1 = LD(c0 + ldc + 8);
            v8 a2 = LD(c0 + 2 * ldc), b2 = LD(c0 + 2 * ldc + 8), a3 = LD(c0 + 3 * ldc), b3 = LD(c0 + 3 * ldc + 8);
            for (int64_t j = 0; j < n; j++) {
                v8 y0 = LD(y + j * ldy + d), y1 = LD(y + j * ldy + d + 8);
                const float *pj = p0 + j * pjs;
                float s0 = pj[0], s1 = pj[prs], s2 = pj[2 * prs], s3 = pj[3 * prs];
                a0 += s0 * y0, b0 += s0 * y1;
                a1 += s1 * y0, b1 += s1 * y1;
                a2 += s2 * y0, b2 += s2 * y1;
                a3 += s3 * y0, b3 += s3 * y1;
            }
            ST(c0, a0), ST(c0 + 8, b0), ST(c0 + ldc, a1), ST(c0 + ldc + 8, b1);
            ST(c0 + 2 * ldc, a2), ST(c0 + 2 * ldc + 8, b2), ST(c0 + 3 * ldc, a3), ST(c0 + 3 * ldc + 8, b3);
        }
        for (; r < rows; r++) {
            float *c0 = c + r * ldc + d;
            v8 a0 = LD(c0), b0 = LD(c0 + 8);
            for (int64_t j = 0; j < n; j++) {
                float s = p[r * prs + j * pjs];
                a0 += s * LD(y + j * ldy + d), b0 += s * LD(y + j * ldy + d + 8);
            }
            ST(c0, a0), ST(c0 + 8, b0);
        }
    }
    if (D16 < D) /* the last D % 16 columns */
        for (int64_t r = 0; r < rows; r++)
            for (int64_t j = 0; j < n; j++) k_axpy(c + r * ldc + D16, p[r * prs + j * pjs], y + j * ldy + D16, D - D16);
}
#endif

static void pick_micro(Attn *t) {
    t->dot = dot_plain;
    t->acc = acc_plain;
#ifdef ATTN_AVX2
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && !getenv("KILN_KERNELS_BASELINE")) {
        t->dot = dot_avx2;
        t->acc = acc_avx2;
    }
#endif
}

/* ---- shared pieces ---- */

static void attn_args(Attn *t, const int64_t *a) {
    t->B = a[0];
    t->H = a[1];
    t->KH = a[2];
    t->T = a[3];
    t->S = a[4];
    t->D = a[5];
    t->causal = a[6] != 0;
    t->scale = (float)rt_bits_f64(a[7]);
    t->Sp = (t->S + MW - 1) / MW * MW;
    pick_micro(t);
}

/* keys visible to query row t: [0, nvis) */
static int64_t nvis(const Attn *t, int64_t row) {
    if (!t->causal) return t->S;
    return row + 1 < t->S ? row + 1 : t->S;
}

/* visible keys of query row `row` in the block [s0, s0+ncols) */
static int64_t nvis_block(const Attn *t, int64_t row, int64_t s0, int64_t ncols) {
    int64_t nb = nvis(t, row) - s0;
    return nb < 0 ? 0 : nb > ncols ? ncols : nb;
}

/* kt[b,kh] = k[b,kh]^T, zero-padded to Sp columns (and vt), one job per (b, kh) */
static void transpose_kv(void *data, int64_t i0, int64_t i1) {
    const Attn *t = data;
    int64_t S = t->S, D = t->D, Sp = t->Sp;
    for (int64_t i = i0; i < i1; i++)
        for (int w = 0; w < 2; w++) {
            const float *src = (w ? t->v : t->k) + i * S * D;
            float *dst = (w ? t->vt : t->kt);
            if (!dst) continue;
            dst += i * D * Sp;
            for (int64_t d = 0; d < D; d++) {
                for (int64_t s = 0; s < S; s++) dst[d * Sp + s] = src[s * D + d];
                for (int64_t s = S; s < Sp; s++) dst[d * Sp + s] = 0;
            }
        }
}

/* ---- forward ---- */

/* One row of a score tile: sc[0..ncols) holds q.k, the first nb keys are
 * visible.  Updates the row's running max *m and sum *l, turns sc into
 * e^(scale q.k - m) (0 where masked) and returns the factor by which the
 * row's output must be scaled before this block's P v is added. */
static inline float online_row(float *sc, int64_t nb, int64_t ncols, float scale, float *m, double *l) {
    for (int64_t j = 0; j < nb; j++) sc[j] *= scale;
    float mb = k_max(sc, nb), mnew = k_max2(*m, mb);
    if (nb == 0 || mnew == -INFINITY) { /* nothing visible, or only -inf scores so far */
        memset(sc, 0, sizeof(float) * (size_t)ncols);
        return 1;
    }
    float alpha = k_exp(*m - mnew);
    for (int64_t j = 0; j < nb; j++) sc[j] = k_exp(sc[j] - mnew);
    for (int64_t j = nb; j < ncols; j++) sc[j] = 0;
    *l = *l * alpha + k_dsum(sc, nb);
    *m = mnew;
    return alpha;
}

K_CLONES static void fwd_tile(const Attn *t, int64_t b, int64_t h, int64_t t0, int64_t rows) {
    int64_t D = t->D, kh = h / (t->H / t->KH);
    const float *q = t->q + ((b * t->H + h) * t->T + t0) * D;
    const float *kt = t->kt + (b * t->KH + kh) * D * t->Sp, *v = t->v + (b * t->KH + kh) * t->S * D;
    float *o = t->o_out + ((b * t->H + h) * t->T + t0) * D, *lse = t->lse_out + (b * t->H + h) * t->T + t0;
    float sc[BQ * BK], m[BQ];
    double l[BQ];
    memset(o, 0, sizeof(float) * (size_t)(rows * D));
    for (int64_t r = 0; r < rows; r++) m[r] = -INFINITY, l[r] = 0;
    int64_t send = nvis(t, t0 + rows - 1);
    for (int64_t s0 = 0; s0 < send; s0 += BK) {
        int64_t ncols = send - s0 < BK ? send - s0 : BK, c16 = (ncols + MW - 1) / MW * MW;
        t->dot(sc, BK, q, D, rows, kt + s0, t->Sp, c16, D);
        for (int64_t r = 0; r < rows; r++) {
            float alpha = online_row(sc + r * BK, nvis_block(t, t0 + r, s0, ncols), ncols, t->scale, &m[r], &l[r]);
            if (alpha != 1.0f)
                for (int64_t d = 0; d < D; d++) o[r * D + d] *= alpha;
        }
        t->acc(o, D, rows, sc, BK, 1, v + s0 * D, D, ncols, D);
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
    for (int64_t i = i0; i < i1; i++) {
        int64_t bh = i / ntiles, t0 = i % ntiles * BQ;
        fwd_tile(t, bh / t->H, bh % t->H, t0, t->T - t0 < BQ ? t->T - t0 : BQ);
    }
}

/* args: q, k, v, o, lse, B, H, KH, T, S, D, causal, scale */
void rtk_attention(rt_ctx *ctx, const int64_t *a) {
    Attn t = {.q = A_F32(0), .k = A_F32(1), .v = A_F32(2), .o_out = A_F32(3), .lse_out = A_F32(4)};
    attn_args(&t, a + 5);
    if (t.B * t.H * t.T == 0) return;
    if (t.S == 0) { /* no keys: o = 0, lse = -inf */
        memset(t.o_out, 0, sizeof(float) * (size_t)(t.B * t.H * t.T * t.D));
        for (int64_t i = 0; i < t.B * t.H * t.T; i++) t.lse_out[i] = -INFINITY;
        return;
    }
    t.kt = k_alloc(ctx, "attention", sizeof(float) * (size_t)(t.B * t.KH * t.D * t.Sp));
    if (!t.kt) return;
    k_par(ctx, t.B * t.KH, t.S * t.D, transpose_kv, &t);
    int64_t ntiles = (t.T + BQ - 1) / BQ;
    k_par(ctx, t.B * t.H * ntiles, 4 * BQ * t.S * t.D, fwd_jobs, &t);
    free(t.kt);
}

/* ---- backward ---- */

K_CLONES static void bwd_head(const Attn *t, int64_t b, int64_t h) {
    int64_t T = t->T, S = t->S, D = t->D, kh = h / (t->H / t->KH);
    int64_t qoff = (b * t->H + h) * T * D, koff = (b * t->KH + kh) * S * D, toff = (b * t->KH + kh) * D * t->Sp;
    const float *q = t->q + qoff, *dO = t->dO + qoff, *o = t->o + qoff, *lse = t->lse + (b * t->H + h) * T;
    const float *k = t->k + koff, *kt = t->kt + toff, *vt = t->vt + toff;
    float *dq = t->dq + qoff, *dt = t->dt + (b * t->H + h) * T;
    float *dk = t->dkh ? t->dkh + (b * t->H + h) * S * D : t->dk + koff;
    float *dv = t->dvh ? t->dvh + (b * t->H + h) * S * D : t->dv + koff;
    float p[BQ * BK], ds[BQ * BK];
    for (int64_t row = 0; row < T; row++) dt[row] = (float)k_ddot(dO + row * D, o + row * D, D);
    memset(dq, 0, sizeof(float) * (size_t)(T * D));
    memset(dk, 0, sizeof(float) * (size_t)(S * D));
    memset(dv, 0, sizeof(float) * (size_t)(S * D));
    for (int64_t s0 = 0; s0 < S; s0 += BK) {
        int64_t ncols = S - s0 < BK ? S - s0 : BK, c16 = (ncols + MW - 1) / MW * MW;
        for (int64_t t0 = t->causal ? s0 / BQ * BQ : 0; t0 < T; t0 += BQ) {
            int64_t rows = T - t0 < BQ ? T - t0 : BQ;
            t->dot(p, BK, q + t0 * D, D, rows, kt + s0, t->Sp, c16, D);
            t->dot(ds, BK, dO + t0 * D, D, rows, vt + s0, t->Sp, c16, D);
            for (int64_t r = 0; r < rows; r++) {
                float *pr = p + r * BK, *dsr = ds + r * BK, L = lse[t0 + r], Dt = dt[t0 + r];
                int64_t nb = L == -INFINITY ? 0 : nvis_block(t, t0 + r, s0, ncols);
                for (int64_t j = 0; j < nb; j++) {
                    pr[j] = k_exp(pr[j] * t->scale - L);
                    dsr[j] = pr[j] * (dsr[j] - Dt) * t->scale;
                }
                for (int64_t j = nb; j < ncols; j++) pr[j] = dsr[j] = 0;
            }
            /* runs of rows with a finite lse; rows with lse = -inf see no key and
             * add nothing (not even 0 * q, which is NaN for the -inf q that
             * such a row can have) */
            for (int64_t r0 = 0, r1; r0 < rows; r0 = r1) {
                while (r0 < rows && lse[t0 + r0] == -INFINITY) r0++;
                for (r1 = r0; r1 < rows && lse[t0 + r1] != -INFINITY;) r1++;
                if (r1 == r0) break;
                int64_t tr = t0 + r0, n = r1 - r0;
                t->acc(dv + s0 * D, D, ncols, p + r0 * BK, 1, BK, dO + tr * D, D, n, D); /* P^T do */
                t->acc(dk + s0 * D, D, ncols, ds + r0 * BK, 1, BK, q + tr * D, D, n, D); /* dS^T q */
                t->acc(dq + tr * D, D, n, ds + r0 * BK, BK, 1, k + s0 * D, D, ncols, D); /* dS k */
            }
        }
    }
}

static void bwd_jobs(void *data, int64_t i0, int64_t i1) {
    const Attn *t = data;
    for (int64_t i = i0; i < i1; i++) bwd_head(t, i / t->H, i % t->H);
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

/* args: do, q, k, v, o, lse, dq, dk, dv, B, H, KH, T, S, D, causal, scale */
void rtk_attention_bwd(rt_ctx *ctx, const int64_t *a) {
    Attn t = {.dO = A_F32(0), .q = A_F32(1), .k = A_F32(2), .v = A_F32(3), .o = A_F32(4), .lse = A_F32(5),
              .dq = A_F32(6), .dk = A_F32(7), .dv = A_F32(8)};
    attn_args(&t, a + 9);
    int64_t rep = t.H / t.KH, kvn = t.B * t.KH * t.S * t.D, ktn = t.B * t.KH * t.D * t.Sp;
    if (t.B * t.H == 0) return;
    if (t.T == 0 || t.S == 0 || t.D == 0) {
        memset(t.dq, 0, sizeof(float) * (size_t)(t.B * t.H * t.T * t.D));
        memset(t.dk, 0, sizeof(float) * (size_t)kvn);
        memset(t.dv, 0, sizeof(float) * (size_t)kvn);
        return;
    }
    size_t scratch = (size_t)(2 * ktn + t.B * t.H * t.T + (rep > 1 ? 2 * t.B * t.H * t.S * t.D : 0));
    t.kt = k_alloc(ctx, "attention_bwd", sizeof(float) * scratch);
    if (!t.kt) return;
    t.vt = t.kt + ktn;
    t.dt = t.vt + ktn;
    if (rep > 1) {
        t.dkh = t.dt + t.B * t.H * t.T;
        t.dvh = t.dkh + t.B * t.H * t.S * t.D;
    }
    k_par(ctx, t.B * t.KH, 2 * t.S * t.D, transpose_kv, &t);
    k_par(ctx, t.B * t.H, 10 * t.T * t.S * t.D, bwd_jobs, &t);
    if (rep > 1) k_par(ctx, kvn, 2 * rep, sum_groups, &t);
    free(t.kt);
}
