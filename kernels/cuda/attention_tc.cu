/* attention_tc.cu — flash attention on the tensor cores, forward and
 * backward (issue 23): the same operations and interfaces as attention.cu's
 * kiln_attention_fwd, _bwd_dkdv and _bwd_dq (ops.def attention,
 * attention_bwd; reference compiler/interp.c), so that the runtime can
 * launch either family for a head dim these kernels take.  The backward's
 * Dt = do . o scratch comes from attention.cu's kiln_attention_bwd_prep.
 *
 * q, o [B,H,T,D]; k, v [B,KH,S,D] bf16; lse f32 [B,H,T]; query head h reads
 * kv head h/(H/KH) (GQA).  Scores are scale * q.k.  causal: key s is visible
 * to query t iff kpos[s] <= qpos[t] (i32 positions in any order: context
 * parallel's chunks and ring sections), or s <= t when the positions are
 * NULL; a sliding window of W keys (window > 0, causal only) also needs
 * qpos[t] - kpos[s] < W.  Without causal every key is visible and the
 * positions are ignored.  A row that sees no key gets o = 0, lse = -inf.
 * D must be 16, 32, 64 or 128: one entry point per D (kiln_attention_tc_fwd_d64
 * and so on, at the end of the file), each compiled for its D alone; a D
 * that is not the entry point's writes NaN into o and lse, and the runtime
 * launches attention.cu for the other head dims.
 *
 * The work split is FlashAttention-2's.  A block of ATC_WARPS = 4 warps
 * takes a job (b, h, a tile of ATC_BQ = 64 query rows), each warp 16 rows.
 * The block stages the query tile in shared memory once; each warp loads
 * its 16 rows into mma A fragments with ldmatrix.x4 (kernels/cuda/mma.cuh
 * has the fragment layouts) and keeps them in registers.  Then for every
 * key tile of ATC_BK = 64 keys the block has k and v staged (bf16, rows padded
 * to D + 8 elements so that ldmatrix rows stay 16-byte aligned and spread
 * over the banks; rows past the tile's keys are zero), and each warp
 *   S = q k^T:   per 8-key n-tile, per 16-dim k-step, B from k by ldmatrix.x2
 *                (k's rows are S's columns: no transpose), one mma.sync;
 *   mask, scale, online softmax in registers: a lane holds 2 of the 16 rows
 *                (g = lane/4 and g + 8) and 2 keys per n-tile; a row's max
 *                and sum need the 4 lanes of its group (two xor shuffles);
 *                in base 2: the scores are scaled by scale log2 e, m is
 *                their running max and P = 2^(S - m) (exp2f: one MUFU.EX2;
 *                expf costs a range reduction more), rounded to bf16, and
 *                the row sum l adds the rounded values, so o / l is exactly
 *                the weights P V used;
 *   o = o alpha + P v: P's accumulator fragments of two n-tiles ARE the A
 *                fragment of a 16-key k-step (no shuffle, no shared memory),
 *                B from v by ldmatrix.x4.trans (two 8-dim n-tiles at once).
 * At the end l is summed over the row's 4 lanes, o = o / l and lse =
 * (m + log2 l) ln 2 (natural units, as attention.cu's), stored as bf16 and
 * f32.
 *
 * Masks and skipped tiles are attention.cu's: with causal, qmax (the
 * largest query position of the block's rows) cuts each key tile to its
 * last key with kpos <= qmax and skips tiles with nothing left; a window
 * skips tiles whose latest key is W or more before qmin; the index path
 * stops at the block's last row (atc_next_ktile finds the next tile to
 * do).  Element by element, a masked score is -inf and its p is 0; a tile
 * that every row of the job sees whole (index positions: the tiles below
 * the causal diagonal, all tiles without causal) skips the element masks
 * (atc_full_tile).  Branches on these are uniform over the block.
 *
 * The pipeline (why: on the H200 the first version took 1.85 ms a GPT-2
 * layer, ~9 us per key tile per block, while a tile's mma and exp work is
 * about 1 us: it staged each tile with synchronous loads, a global-memory
 * round trip per 16-byte chunk in turn, behind two barriers).  The key and
 * value tiles live in two stages of shared memory.  The job stages the
 * query tile and the first key tile with cp.async (16 bytes a copy, from
 * every thread; zero rows are plain stores), waits (cp.async.wait_group 0)
 * and syncs.  Then per key tile: issue the NEXT tile's copies into the
 * other stage (no warp still reads it: the barrier that ended the last
 * iteration), compute this tile, wait for the copies, one barrier (the
 * next tile is complete for every warp, and every warp is done with this
 * stage before the iteration after next overwrites it).  So the loads of a
 * tile overlap the mma and softmax of the one before, one barrier a tile.
 * A source that is not 16-byte aligned is staged element by element,
 * synchronously (the same barriers make it visible).  The emulator runs a
 * cp.async as a copy that lands when its thread waits, never earlier, so a
 * missing wait or barrier reads the poisoned shared memory:
 * tests/t_cuda_emu.sh plants both and sees check_attention_tc fail.
 *
 * Precision: bf16 inputs (exact in the mma), products accumulated in f32 by
 * the tensor cores; softmax in f32 (exp2f); P rounded to bf16 for the
 * second product (as FlashAttention does); o rounded once to bf16.  Every
 * sum runs in an order fixed by the shapes: the same bits every run and
 * for any grid.
 *
 * Block ATC_THREADS = 128 (the code assumes it: the staging loops and the
 * warps' rows), grid stride over the jobs (a smaller grid gives the same
 * bits), dynamic shared memory 640 (D + 8) + 768 bytes (the query tile,
 * two stages of k and v; positions).  The backward (below, with its own
 * essay): blocks of 128 too, 768 (D + 8) + 1792 bytes (kernels/cuda/README.md).
 * Registers (ptxas, sm_90, nvcc 13.0) per entry point, fwd / dkdv / dq:
 * D 64: 152 / 243 / 160 (3 / 2 / 3 blocks a SM), D 128: 228 / 255 / 227
 * (dkdv_d128 spills 16 bytes), D 16 and 32: 128-166 (ptxas caps some at 128
 * with a few bytes of spills).  Not here yet (ideas, unmeasured): 32 query
 * rows a warp (each k and v fragment feeds two mma), P kept packed as bf16
 * pairs instead of rounded floats repacked, a dkdv at D = 128 without
 * spills, tiles of 128 keys.
 */
#include "mma.cuh"

#define ATC_WARPS 4
#define ATC_THREADS (32 * ATC_WARPS) /* block size */
#define ATC_BQ (16 * ATC_WARPS)      /* query rows a job: 16 a warp */
#define ATC_BK 64                    /* keys a tile: 8 n-tiles of 8 */
#define ATC_PAD 8                    /* shared rows are D + 8 elements */
#define ATC_POS_MAX 0x7fffffff
#define ATC_POS_MIN (-0x7fffffff - 1)
#define ATC_NOWIN (1LL << 40)
#define ATC_LOG2E 1.4426950408889634f
#define ATC_LN2 0.6931471805599453f

static __device__ __forceinline__ long long atc_min(long long a, long long b) { return a < b ? a : b; }
static __device__ __forceinline__ int atc_pos(const int *pos, long long i) { return pos ? pos[i] : (int)i; }
static __device__ __forceinline__ bool atc_vis(int k, int qp, long long wl) { return k <= qp && (long long)qp - k < wl; }

/* the largest / smallest position of [p0, p0+n), n >= 1 (uniform: broadcast loads) */
static __device__ int atc_pos_max(const int *pos, long long p0, long long n) {
    if (!pos) return (int)(p0 + n - 1);
    int m = ATC_POS_MIN;
    for (long long i = 0; i < n; i++) m = pos[p0 + i] > m ? pos[p0 + i] : m;
    return m;
}
static __device__ int atc_pos_min(const int *pos, long long p0, long long n) {
    if (!pos) return (int)p0;
    int m = ATC_POS_MAX;
    for (long long i = 0; i < n; i++) m = pos[p0 + i] < m ? pos[p0 + i] : m;
    return m;
}

/* Asynchronous copies global -> shared (cp.async, sm_80 and later): a
 * thread issues copies, commits them, and later waits for all of them
 * (atc_cp_wait_all); the data is in shared memory for the issuing thread
 * after its wait and for the block after the barrier that follows. */
#ifdef KILN_HOST_EMU
/* Host emulation (one host thread, blocks one after another): a thread's
 * copies land when it waits, never earlier, so reading a tile before the
 * wait and barrier reads the old bytes (the emulator's NaN poison). */
struct AtcCopy {
    void *dst;
    const void *src;
    int bytes;
    bool committed;
};
struct AtcCopies {
    AtcCopy c[96];
    int n;
    unsigned block;
};
static AtcCopies &atc_copies() {
    static AtcCopies q[ATC_THREADS];
    AtcCopies &c = q[threadIdx.x % ATC_THREADS];
    const unsigned block = blockIdx.x + 65536u * (blockIdx.y + 65536u * blockIdx.z) + 1u;
    if (c.block != block) c.n = 0; /* copies a block never waited for never land (CUDA: lands at no known time) */
    c.block = block;
    return c;
}
static inline void atc_cp_async(void *dst, const void *src, int bytes) {
    AtcCopies &q = atc_copies();
    if (q.n == 96) __builtin_trap(); /* this emulation's limit, not CUDA's (a throw cannot leave a fiber) */
    q.c[q.n++] = {dst, src, bytes, false};
}
static inline void atc_cp_commit() {
    AtcCopies &q = atc_copies();
    for (int i = 0; i < q.n; i++) q.c[i].committed = true;
}
static inline void atc_cp_wait_all() { /* cp.async.wait_group 0: every committed group */
    AtcCopies &q = atc_copies();
    int keep = 0;
    for (int i = 0; i < q.n; i++) {
        if (q.c[i].committed) memcpy(q.c[i].dst, q.c[i].src, q.c[i].bytes);
        else q.c[keep++] = q.c[i];
    }
    q.n = keep;
}
static inline void atc_cp_async16(void *dst, const void *src) { atc_cp_async(dst, src, 16); }
static inline void atc_cp_async4(void *dst, const void *src) { atc_cp_async(dst, src, 4); }
#else
static __device__ __forceinline__ void atc_cp_async16(void *dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(kiln_smem_addr(dst)),
                 "l"((unsigned long long)__cvta_generic_to_global(src))
                 : "memory");
}
static __device__ __forceinline__ void atc_cp_async4(void *dst, const void *src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(kiln_smem_addr(dst)),
                 "l"((unsigned long long)__cvta_generic_to_global(src))
                 : "memory");
}
static __device__ __forceinline__ void atc_cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
static __device__ __forceinline__ void atc_cp_wait_all() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }
#endif

/* dst[r*(D+8) + d] = src[r*D + d] for r < n, 0 for n <= r < R (all d < D),
 * R a multiple of 16: a cp.async of 16 bytes a chunk when src is 16-byte
 * aligned (the caller commits, waits and syncs; the zero rows are plain
 * stores), else synchronous element by element.  The block is ATC_THREADS. */
template <int D>
static __device__ __forceinline__ void atc_stage(__nv_bfloat16 *dst, const __nv_bfloat16 *src, int n, int R) {
    enum { LD = D + ATC_PAD, CH = D / 8 };
    if (((unsigned long long)src & 15) == 0) {
#pragma unroll 4
        for (int e = threadIdx.x; e < R * CH; e += ATC_THREADS) {
            const int r = e / CH, d = (e % CH) * 8;
            if (r < n) {
                atc_cp_async16(dst + r * LD + d, src + (long long)r * D + d);
            } else {
                const __nv_bfloat16 zero = __float2bfloat16_rn(0.0f);
#pragma unroll
                for (int i = 0; i < 8; i++) dst[r * LD + d + i] = zero;
            }
        }
        return;
    }
    const __nv_bfloat16 zero = __float2bfloat16_rn(0.0f);
    for (int e = threadIdx.x; e < R * D; e += ATC_THREADS) {
        int r = e / D, d = e - r * D;
        dst[r * LD + d] = r < n ? src[e] : zero;
    }
}

static __device__ void atc_load_pos(int *dst, const int *pos, long long p0, int n, int R, int fill) {
    for (int i = threadIdx.x; i < R; i += blockDim.x) dst[i] = i < n ? atc_pos(pos, p0 + i) : fill;
}

/* What a warp keeps across the key tiles: its two rows' positions, running
 * max and (partial) sum, and o's accumulator fragments. */
template <int D>
struct AtcRows {
    int qp[2];
    float m[2], l[2];
    float acc[D / 8][4];
};

/* S = q k^T for the tile's first 16*ks16 keys (unscaled), n-tile by n-tile */
template <int D>
static __device__ __forceinline__ void atc_scores(float sc[ATC_BK / 8][4], const unsigned qf[D / 16][4],
                                                  const __nv_bfloat16 *ks, int nt, int lane) {
    enum { LD = D + ATC_PAD };
#pragma unroll
    for (int j = 0; j < ATC_BK / 8; j++) {
        sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
        if (j >= nt) continue;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            unsigned b[2];
            kiln_ldmatrix_x2(b, ks + (j * 8 + (lane & 7)) * LD + kk * 16 + 8 * ((lane >> 3) & 1));
            kiln_mma_bf16(sc[j], qf[kk], b, sc[j]);
        }
    }
}

/* Mask and scale sc (scale2 = scale log2 e: the scores in base 2),
 * update the rows' max (base 2) and sum, turn sc into P (bf16 values, as
 * f32) and rescale the accumulators.  Key `key` of the tile is at position
 * kp[key] (kp non-NULL) or kbase + key; `full`: every key of the tile is
 * visible to every row (no element masks). */
template <int D>
static __device__ __forceinline__ void atc_softmax(AtcRows<D> &w, float sc[ATC_BK / 8][4], const int *kp, int kbase,
                                                   int n, int nt, bool full, bool causal, long long wl, float scale2,
                                                   int t) {
    float mx[2] = {kiln_neg_inf(), kiln_neg_inf()};
#pragma unroll
    for (int j = 0; j < ATC_BK / 8; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int key = j * 8 + 2 * t + (i & 1), h = i >> 1;
            const bool vis =
                full || (j < nt && key < n && (!causal || atc_vis(kp ? kp[key] : kbase + key, w.qp[h], wl)));
            sc[j][i] = vis ? sc[j][i] * scale2 : kiln_neg_inf();
            mx[h] = fmaxf(mx[h], sc[j][i]);
        }
    float mb[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(KILN_FULL_MASK, mx[h], 1));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(KILN_FULL_MASK, mx[h], 2));
        const float mnew = fmaxf(w.m[h], mx[h]);
        mb[h] = mnew == kiln_neg_inf() ? 0.0f : mnew; /* a row with nothing yet: e^-inf = 0 everywhere */
        const float alpha = exp2f(w.m[h] - mb[h]);
        w.m[h] = mnew;
        w.l[h] *= alpha;
#pragma unroll
        for (int dn = 0; dn < D / 8; dn++) w.acc[dn][2 * h] *= alpha, w.acc[dn][2 * h + 1] *= alpha;
    }
#pragma unroll
    for (int j = 0; j < ATC_BK / 8; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int h = i >> 1;
            const float p = __bfloat162float(__float2bfloat16_rn(exp2f(sc[j][i] - mb[h])));
            sc[j][i] = p;
            w.l[h] += p;
        }
}

/* o and lse of the warp's rows (r0 + g, r0 + g + 8 of the job's tile) */
template <int D>
static __device__ void atc_store(AtcRows<D> &w, __nv_bfloat16 *o, float *lse, long long row0, int r0, int rows, int lane) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        w.l[h] += __shfl_xor_sync(KILN_FULL_MASK, w.l[h], 1);
        w.l[h] += __shfl_xor_sync(KILN_FULL_MASK, w.l[h], 2);
        const int r = r0 + g + 8 * h;
        if (r >= rows) continue;
        const bool none = w.m[h] == kiln_neg_inf() || w.l[h] == 0.0f;
        const float inv = none ? 0.0f : 1.0f / w.l[h];
        __nv_bfloat16 *orow = o + (row0 + r) * D;
#pragma unroll
        for (int dn = 0; dn < D / 8; dn++) {
            kiln_st(orow, dn * 8 + 2 * t, w.acc[dn][2 * h] * inv);
            kiln_st(orow, dn * 8 + 2 * t + 1, w.acc[dn][2 * h + 1] * inv);
        }
        if (t == 0) lse[row0 + r] = none ? kiln_neg_inf() : (w.m[h] + log2f(w.l[h])) * ATC_LN2;
    }
}

/* ---- warp-level tile products (forward and backward) ----
 * acc[j] (j < nt) = A (16 rows of `a`, D wide) x B^T, B = rows j*8.. of `b`
 * (D wide): a [16][LD] and b [..][LD] bf16 in shared memory.  S = q k^T,
 * S^T = k q^T, dP = do v^T and dP^T = v do^T are all this form. */
template <int D>
static __device__ __forceinline__ void atc_rows_dot(float acc[ATC_BK / 8][4], const __nv_bfloat16 *a,
                                                    const __nv_bfloat16 *b, int nt, int lane) {
    enum { LD = D + ATC_PAD };
#pragma unroll
    for (int j = 0; j < ATC_BK / 8; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        unsigned af[4];
        kiln_ldmatrix_x4(af, a + ((lane & 7) + 8 * ((lane >> 3) & 1)) * LD + kk * 16 + 8 * (lane >> 4));
#pragma unroll
        for (int j = 0; j < ATC_BK / 8; j++) {
            if (j >= nt) break;
            unsigned bf[2];
            kiln_ldmatrix_x2(bf, b + (j * 8 + (lane & 7)) * LD + kk * 16 + 8 * ((lane >> 3) & 1));
            kiln_mma_bf16(acc[j], af, bf, acc[j]);
        }
    }
}

/* acc (16 x D) += X (16 x 16*ks16: the f32 accumulators x, rounded to bf16)
 * x rows [0, 16*ks16) of `b` (D wide, bf16 in shared memory): the A
 * fragment of k-step s is x's n-tiles 2s and 2s+1 as they stand, B comes
 * by ldmatrix.x4.trans.  o += P v, dv += P^T do, dk += dS^T q and
 * dq += dS k are all this form. */
template <int D>
static __device__ __forceinline__ void atc_acc_rows(float acc[D / 8][4], const float x[ATC_BK / 8][4],
                                                    const __nv_bfloat16 *b, int ks16, int lane) {
    enum { LD = D + ATC_PAD };
#pragma unroll
    for (int s = 0; s < ATC_BK / 16; s++) {
        if (s >= ks16) break;
        const unsigned a[4] = {kiln_pack_bf16(x[2 * s][0], x[2 * s][1]), kiln_pack_bf16(x[2 * s][2], x[2 * s][3]),
                               kiln_pack_bf16(x[2 * s + 1][0], x[2 * s + 1][1]),
                               kiln_pack_bf16(x[2 * s + 1][2], x[2 * s + 1][3])};
        const __nv_bfloat16 *brow = b + (16 * s + (lane & 7) + 8 * ((lane >> 3) & 1)) * LD + 8 * (lane >> 4);
#pragma unroll
        for (int dn = 0; dn < D / 8; dn += 2) {
            unsigned bf[4];
            kiln_ldmatrix_x4_trans(bf, brow + 8 * dn);
            kiln_mma_bf16(acc[dn], a, bf, acc[dn]);
            kiln_mma_bf16(acc[dn + 1], a, bf + 2, acc[dn + 1]);
        }
    }
}

/* rows r (g and g + 8 of the warp's 16, h = 0, 1) of a 16 x D accumulator
 * into dst rows [row0 + r] (D wide, bf16) for r < n */
template <int D>
static __device__ __forceinline__ void atc_store_rows(__nv_bfloat16 *dst, const float acc[D / 8][4], int r0, int n,
                                                      int lane) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = r0 + g + 8 * h;
        if (r >= n) continue;
#pragma unroll
        for (int dn = 0; dn < D / 8; dn++) {
            kiln_st(dst + (long long)r * D, dn * 8 + 2 * t, acc[dn][2 * h]);
            kiln_st(dst + (long long)r * D, dn * 8 + 2 * t + 1, acc[dn][2 * h + 1]);
        }
    }
}

/* The first key tile at or after s0 (< send) with a key that some row of
 * the job sees (qmax, qmin: the rows' largest and smallest positions):
 * its start, and in *n its keys (the tile cut after its last key with
 * position <= qmax under causal); send when there is none.  Uniform. */
static __device__ long long atc_next_ktile(const int *kpos, long long s0, long long send, bool causal, long long wl,
                                           int qmax, int qmin, int *n) {
    for (; s0 < send; s0 += ATC_BK) {
        int c = (int)atc_min(ATC_BK, send - s0);
        if (causal) {
            if (!kpos) {
                const long long last = (long long)qmax - s0 + 1; /* keys s0 .. qmax */
                c = last < 0 ? 0 : (int)atc_min(c, last);
            } else {
                while (c > 0 && kpos[s0 + c - 1] > qmax) c--;
            }
        }
        if (c == 0) continue;
        if (wl != ATC_NOWIN && (long long)qmin - atc_pos_max(kpos, s0, c) >= wl) continue; /* before every window */
        *n = c;
        return s0;
    }
    return send;
}

/* every key of [s0, s0+n) visible to every row [t0, t0+rows) of the job:
 * so far only for index positions (kpos NULL) and full tiles */
static __device__ __forceinline__ bool atc_full_tile(const int *kpos, long long s0, int n, long long t0, int rows,
                                                     bool causal, long long wl) {
    if (n != ATC_BK || rows != ATC_BQ) return false;
    if (!causal) return true;
    return !kpos && s0 + ATC_BK - 1 <= t0 && (wl == ATC_NOWIN || t0 + ATC_BQ - 1 - s0 < wl);
}

/* Shared memory: qs [BQ][D+8]; two stages of ks, vs [BK][D+8] (bf16);
 * qp [BQ]; two stages of kp [BK] (int). */
template <int D>
static __device__ void atc_fwd_job(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v,
                                   const int *qpos, const int *kpos, __nv_bfloat16 *o, float *lse, long long bh,
                                   long long t0, long long H, long long KH, long long T, long long S, bool causal,
                                   long long wl, float scale) {
    enum { LD = D + ATC_PAD, TILE = ATC_BK * LD };
    __nv_bfloat16 *qs = (__nv_bfloat16 *)kiln_smem, *kv = qs + ATC_BQ * LD; /* stage st: ks kv + 2 st TILE, vs + TILE */
    int *qp = (int *)(kv + 4 * TILE), *kpb = qp + ATC_BQ;                   /* stage st: kp = kpb + st BK */
    const int lane = threadIdx.x % 32, r0 = threadIdx.x / 32 * 16, g = lane >> 2, t = lane & 3;
    const int rows = (int)atc_min(ATC_BQ, T - t0);
    const long long bkv = bh / H * KH + bh % H / (H / KH);
    const __nv_bfloat16 *kg = k + bkv * S * D, *vg = v + bkv * S * D;
    const float scale2 = scale * ATC_LOG2E;

    __syncthreads(); /* the previous job is done with shared memory */
    atc_stage<D>(qs, q + (bh * T + t0) * D, rows, ATC_BQ);
    atc_load_pos(qp, qpos, t0, rows, ATC_BQ, ATC_POS_MIN);
    const int qmax = atc_pos_max(qpos, t0, rows), qmin = atc_pos_min(qpos, t0, rows);
    const long long send = causal && !qpos ? atc_min(S, t0 + rows) : S;
    int n = 0;
    long long s0 = atc_next_ktile(kpos, 0, send, causal, wl, qmax, qmin, &n);
    if (s0 < send) {
        atc_stage<D>(kv, kg + s0 * D, n, ATC_BK);
        atc_stage<D>(kv + TILE, vg + s0 * D, n, ATC_BK);
        if (kpos) atc_load_pos(kpb, kpos, s0, n, ATC_BK, ATC_POS_MAX);
    }
    atc_cp_commit();
    atc_cp_wait_all();
    __syncthreads(); /* the query tile and the first key tile are in */
    unsigned qf[D / 16][4];
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++)
        kiln_ldmatrix_x4(qf[kk], qs + (r0 + (lane & 7) + 8 * ((lane >> 3) & 1)) * LD + kk * 16 + 8 * (lane >> 4));
    AtcRows<D> w;
    w.qp[0] = qp[r0 + g], w.qp[1] = qp[r0 + g + 8];
    w.m[0] = w.m[1] = kiln_neg_inf();
    w.l[0] = w.l[1] = 0.0f;
#pragma unroll
    for (int dn = 0; dn < D / 8; dn++) w.acc[dn][0] = w.acc[dn][1] = w.acc[dn][2] = w.acc[dn][3] = 0.0f;

    for (int st = 0; s0 < send; st ^= 1) {
        /* prefetch the next tile into the other stage (every warp is done
         * with it: the barrier that ended the last iteration) */
        int n1 = 0;
        const long long s1 = atc_next_ktile(kpos, s0 + ATC_BK, send, causal, wl, qmax, qmin, &n1);
        if (s1 < send) {
            __nv_bfloat16 *nk = kv + 2 * (st ^ 1) * TILE;
            atc_stage<D>(nk, kg + s1 * D, n1, ATC_BK);
            atc_stage<D>(nk + TILE, vg + s1 * D, n1, ATC_BK);
            if (kpos) atc_load_pos(kpb + (st ^ 1) * ATC_BK, kpos, s1, n1, ATC_BK, ATC_POS_MAX);
            atc_cp_commit();
        }
        const __nv_bfloat16 *ks = kv + 2 * st * TILE, *vs = ks + TILE;
        const int ks16 = (n + 15) / 16;
        const bool full = atc_full_tile(kpos, s0, n, t0, rows, causal, wl);
        float sc[ATC_BK / 8][4];
        atc_scores<D>(sc, qf, ks, 2 * ks16, lane);
        atc_softmax<D>(w, sc, kpos ? kpb + st * ATC_BK : 0, (int)s0, n, 2 * ks16, full, causal, wl, scale2, t);
        atc_acc_rows<D>(w.acc, sc, vs, ks16, lane); /* o += P v */
        if (s1 < send) {
            atc_cp_wait_all();
            __syncthreads(); /* the next tile is in; every warp is done with this one */
        }
        s0 = s1, n = n1;
    }
    atc_store<D>(w, o, lse, bh * T + t0, r0, rows, lane);
}

/* The entry points: one per head dim, kiln_attention_tc_fwd_d16, _d32,
 * _d64, _d128 (and the same for _bwd_dkdv and _bwd_dq), each compiled for
 * its D alone: registers are allocated per kernel, and one kernel holding
 * all four instances (as before) got the D = 128 instance's 255 registers
 * and spills for every D.  The argument D must be the entry point's; any
 * other D writes NaN into the outputs. */
#define ATC_FWD_ARGS q, k, v, qpos, kpos, o, lse, B, H, KH, T, S, D, causal, window, scale

/* the grid-stride loop over the forward's jobs, D's instance */
template <int HD> /* HD: the head dim; D (== HD) the argument */
static __device__ __forceinline__ void atc_fwd(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v, const int *qpos, const int *kpos, __nv_bfloat16 *o, float *lse, long long B, long long H, long long KH, long long T, long long S, long long D, int causal, long long window, double scale) {
    const long long tiles = (T + ATC_BQ - 1) / ATC_BQ, jobs = B * H * tiles;
    const bool bypos = causal && qpos && kpos;
    const long long wl = causal && window > 0 ? window : ATC_NOWIN;
    const int *qp = bypos ? qpos : 0, *kp = bypos ? kpos : 0;
    for (long long job = blockIdx.x; job < jobs; job += gridDim.x) {
        /* the last query tiles (the most keys under causal) first */
        const long long bh = job / tiles, t0 = (tiles - 1 - job % tiles) * ATC_BQ;
        if (D != HD) { /* not this entry point's head dim */
            const long long rows = atc_min(ATC_BQ, T - t0);
            for (long long e = threadIdx.x; e < rows * D; e += blockDim.x) kiln_st(o, (bh * T + t0) * D + e, kiln_nan());
            for (long long r = threadIdx.x; r < rows; r += blockDim.x) lse[bh * T + t0 + r] = kiln_nan();
            continue;
        }
        atc_fwd_job<HD>(q, k, v, qp, kp, o, lse, bh, t0, H, KH, T, S, causal != 0, wl, (float)scale);
    }
}

extern "C" __global__ void __launch_bounds__(ATC_THREADS)
kiln_attention_tc_fwd_d16(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v, const int *qpos,
                          const int *kpos, __nv_bfloat16 *o, float *lse, long long B, long long H, long long KH,
                          long long T, long long S, long long D, int causal, long long window, double scale) {
    atc_fwd<16>(ATC_FWD_ARGS);
}
extern "C" __global__ void __launch_bounds__(ATC_THREADS)
kiln_attention_tc_fwd_d32(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v, const int *qpos,
                          const int *kpos, __nv_bfloat16 *o, float *lse, long long B, long long H, long long KH,
                          long long T, long long S, long long D, int causal, long long window, double scale) {
    atc_fwd<32>(ATC_FWD_ARGS);
}
extern "C" __global__ void __launch_bounds__(ATC_THREADS)
kiln_attention_tc_fwd_d64(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v, const int *qpos,
                          const int *kpos, __nv_bfloat16 *o, float *lse, long long B, long long H, long long KH,
                          long long T, long long S, long long D, int causal, long long window, double scale) {
    atc_fwd<64>(ATC_FWD_ARGS);
}
extern "C" __global__ void __launch_bounds__(ATC_THREADS)
kiln_attention_tc_fwd_d128(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v, const int *qpos,
                           const int *kpos, __nv_bfloat16 *o, float *lse, long long B, long long H, long long KH,
                           long long T, long long S, long long D, int causal, long long window, double scale) {
    atc_fwd<128>(ATC_FWD_ARGS);
}

/* ---- backward ----
 * dq, dk, dv from do, q, k, v, lse and Dt = do . o per query row (f32
 * scratch, written by attention.cu's kiln_attention_bwd_prep), recomputing
 * P = e^(scale q.k - lse):  dv += P^T do;  dS = P (do.v - Dt) scale;
 * dk += dS^T q;  dq += dS k.  Two kernels, as attention.cu's: dk and dv
 * first (a job per key tile, all of its GQA group's query heads and tiles
 * in a fixed order, so the sums need neither atomics nor scratch), then
 * dq (a job per query tile); both deterministic.  Each warp owns 16 rows
 * of its job's tile (keys in dkdv, queries in dq); the tile products are
 * atc_rows_dot and atc_acc_rows.  P and dS are rounded to bf16 for the
 * products that consume them (FlashAttention-2 does the same); a row with
 * lse = -inf adds nothing.  P = 2^(scale log2 e q.k - lse log2 e) (exp2f).
 * The streamed tiles are double-buffered as in the forward: dkdv keeps its
 * key tile and streams the query tiles (q, do, lse, Dt, positions: cp.async
 * of 16 and 4 bytes, atc_next_qtile picks the next one it needs), dq keeps
 * its query tile and streams the key tiles; one barrier a tile. */

/* the query tile [t0, t0+m) of head bh for the backward, staged (the
 * caller commits, waits and syncs): q, do rows, lse (-inf past m), Dt,
 * positions (ATC_POS_MIN past m).  The block is ATC_THREADS = 2 ATC_BQ. */
template <int D>
static __device__ __forceinline__ void atc_stage_qtile(__nv_bfloat16 *qs, __nv_bfloat16 *dos, float *ls, float *dts,
                                                       int *qp, const __nv_bfloat16 *q, const __nv_bfloat16 *dout,
                                                       const float *lse, const float *dt, const int *qpos, long long bh,
                                                       long long T, long long t0, int m) {
    atc_stage<D>(qs, q + (bh * T + t0) * D, m, ATC_BQ);
    atc_stage<D>(dos, dout + (bh * T + t0) * D, m, ATC_BQ);
    const int i = threadIdx.x % ATC_BQ;
    if (threadIdx.x < ATC_BQ) {
        if (i < m) atc_cp_async4(ls + i, lse + bh * T + t0 + i);
        else ls[i] = kiln_neg_inf();
    } else {
        if (i < m) atc_cp_async4(dts + i, dt + bh * T + t0 + i);
        else dts[i] = 0.0f;
        if (i >= m) qp[i] = ATC_POS_MIN;
        else if (qpos) atc_cp_async4(qp + i, qpos + t0 + i);
        else qp[i] = (int)(t0 + i);
    }
}

/* The next query tile (it = hh * qtiles + tile; head hh of the GQA group)
 * at or after it that some key of [kmin, kmax] is visible to; its = rep
 * qtiles when none.  Uniform. */
static __device__ long long atc_next_qtile(const int *qpos, long long it, long long its, long long qtiles, long long T,
                                           bool causal, long long wl, int kmin, int kmax) {
    for (; it < its; it++) {
        const long long t0 = it % qtiles * ATC_BQ;
        const int m = (int)atc_min(ATC_BQ, T - t0);
        if (causal && atc_pos_max(qpos, t0, m) < kmin) continue; /* every query before every key */
        if (wl != ATC_NOWIN && (long long)atc_pos_min(qpos, t0, m) - kmax >= wl) continue; /* after every window */
        return it;
    }
    return its;
}

/* Shared memory: ks, vs [BK][D+8], then two stages of qs, dos [BQ][D+8]
 * (bf16); two stages of ls, dts [BQ] (f32) and qp [BQ] (int); kp [BK]. */
template <int D>
static __device__ void atc_dkdv_job(const __nv_bfloat16 *dout, const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                                    const __nv_bfloat16 *v, const float *lse, const float *dt, const int *qpos,
                                    const int *kpos, __nv_bfloat16 *dk, __nv_bfloat16 *dv, long long bkv, long long s0,
                                    long long H, long long KH, long long T, long long S, bool causal, long long wl,
                                    float scale) {
    enum { LD = D + ATC_PAD, TILE = ATC_BQ * LD };
    __nv_bfloat16 *ks = (__nv_bfloat16 *)kiln_smem, *vs = ks + ATC_BK * LD, *qb = vs + ATC_BK * LD;
    float *fb = (float *)(qb + 4 * TILE); /* stage st: ls = fb + 3 st BQ, dts = ls + BQ, qp = (int *)(dts + BQ) */
    int *kp = (int *)(fb + 6 * ATC_BQ);
    const int lane = threadIdx.x % 32, k0 = threadIdx.x / 32 * 16, g = lane >> 2, t = lane & 3;
    const int n = (int)atc_min(ATC_BK, S - s0);
    const long long b = bkv / KH, rep = H / KH, qtiles = (T + ATC_BQ - 1) / ATC_BQ, its = rep * qtiles;
    const float scale2 = scale * ATC_LOG2E;

    __syncthreads(); /* the previous job is done with shared memory */
    atc_stage<D>(ks, k + (bkv * S + s0) * D, n, ATC_BK);
    atc_stage<D>(vs, v + (bkv * S + s0) * D, n, ATC_BK);
    atc_load_pos(kp, kpos, s0, n, ATC_BK, ATC_POS_MAX);
    const int kmin = atc_pos_min(kpos, s0, n), kmax = atc_pos_max(kpos, s0, n);
    long long it = atc_next_qtile(qpos, 0, its, qtiles, T, causal, wl, kmin, kmax);
    if (it < its) {
        const long long t0 = it % qtiles * ATC_BQ, bh = b * H + bkv % KH * rep + it / qtiles;
        atc_stage_qtile<D>(qb, qb + TILE, fb, fb + ATC_BQ, (int *)(fb + 2 * ATC_BQ), q, dout, lse, dt, qpos, bh, T,
                           t0, (int)atc_min(ATC_BQ, T - t0));
    }
    atc_cp_commit();
    atc_cp_wait_all();
    __syncthreads(); /* the key tile and the first query tile are in */
    float dka[D / 8][4], dva[D / 8][4];
#pragma unroll
    for (int dn = 0; dn < D / 8; dn++)
#pragma unroll
        for (int i = 0; i < 4; i++) dka[dn][i] = dva[dn][i] = 0.0f;
    for (int st = 0; it < its; st ^= 1) {
        const long long t0 = it % qtiles * ATC_BQ;
        const int m = (int)atc_min(ATC_BQ, T - t0);
        /* prefetch the next query tile into the other stage */
        const long long it1 = atc_next_qtile(qpos, it + 1, its, qtiles, T, causal, wl, kmin, kmax);
        if (it1 < its) {
            const long long t1 = it1 % qtiles * ATC_BQ, bh1 = b * H + bkv % KH * rep + it1 / qtiles;
            __nv_bfloat16 *nq = qb + 2 * (st ^ 1) * TILE;
            float *nf = fb + 3 * (st ^ 1) * ATC_BQ;
            atc_stage_qtile<D>(nq, nq + TILE, nf, nf + ATC_BQ, (int *)(nf + 2 * ATC_BQ), q, dout, lse, dt, qpos, bh1,
                               T, t1, (int)atc_min(ATC_BQ, T - t1));
            atc_cp_commit();
        }
        const __nv_bfloat16 *qs = qb + 2 * st * TILE, *dos = qs + TILE;
        const float *ls = fb + 3 * st * ATC_BQ, *dts = ls + ATC_BQ;
        const int *qp = (const int *)(dts + ATC_BQ);
        const int nt = 2 * ((m + 15) / 16);
        float pt[ATC_BK / 8][4], dst[ATC_BK / 8][4]; /* S^T then P^T; dP^T then dS^T */
        atc_rows_dot<D>(pt, ks + k0 * LD, qs, nt, lane);
        atc_rows_dot<D>(dst, vs + k0 * LD, dos, nt, lane);
#pragma unroll
        for (int j = 0; j < ATC_BK / 8; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int key = k0 + g + 8 * (i >> 1), qi = j * 8 + 2 * t + (i & 1);
                const float L = ls[qi];
                const bool vis = j < nt && qi < m && key < n && L != kiln_neg_inf() &&
                                 (!causal || atc_vis(kp[key], qp[qi], wl));
                const float P = vis ? exp2f(pt[j][i] * scale2 - L * ATC_LOG2E) : 0.0f;
                pt[j][i] = P;
                dst[j][i] = P * (dst[j][i] - dts[qi]) * scale;
            }
        atc_acc_rows<D>(dva, pt, dos, nt / 2, lane);
        atc_acc_rows<D>(dka, dst, qs, nt / 2, lane);
        if (it1 < its) {
            atc_cp_wait_all();
            __syncthreads(); /* the next query tile is in; every warp is done with this one */
        }
        it = it1;
    }
    atc_store_rows<D>(dk + (bkv * S + s0) * D, dka, k0, n, lane);
    atc_store_rows<D>(dv + (bkv * S + s0) * D, dva, k0, n, lane);
}

/* Shared memory: qs, dos [BQ][D+8], then two stages of ks, vs [BK][D+8]
 * (bf16); ls, dts [BQ] (f32); qp [BQ], two stages of kp [BK] (int). */
template <int D>
static __device__ void atc_dq_job(const __nv_bfloat16 *dout, const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                                  const __nv_bfloat16 *v, const float *lse, const float *dt, const int *qpos,
                                  const int *kpos, __nv_bfloat16 *dq, long long bh, long long t0, long long H,
                                  long long KH, long long T, long long S, bool causal, long long wl, float scale) {
    enum { LD = D + ATC_PAD, TILE = ATC_BK * LD };
    __nv_bfloat16 *qs = (__nv_bfloat16 *)kiln_smem, *dos = qs + ATC_BQ * LD, *kv = dos + ATC_BQ * LD;
    float *ls = (float *)(kv + 4 * TILE), *dts = ls + ATC_BQ;
    int *qp = (int *)(dts + ATC_BQ), *kpb = qp + ATC_BQ;
    const int lane = threadIdx.x % 32, r0 = threadIdx.x / 32 * 16, g = lane >> 2, t = lane & 3;
    const int rows = (int)atc_min(ATC_BQ, T - t0);
    const long long bkv = bh / H * KH + bh % H / (H / KH);
    const __nv_bfloat16 *kg = k + bkv * S * D, *vg = v + bkv * S * D;
    const float scale2 = scale * ATC_LOG2E;

    __syncthreads(); /* the previous job is done with shared memory */
    atc_stage_qtile<D>(qs, dos, ls, dts, qp, q, dout, lse, dt, qpos, bh, T, t0, rows);
    const int qmax = atc_pos_max(qpos, t0, rows), qmin = atc_pos_min(qpos, t0, rows);
    const long long send = causal && !qpos ? atc_min(S, t0 + rows) : S;
    int n = 0;
    long long s0 = atc_next_ktile(kpos, 0, send, causal, wl, qmax, qmin, &n);
    if (s0 < send) {
        atc_stage<D>(kv, kg + s0 * D, n, ATC_BK);
        atc_stage<D>(kv + TILE, vg + s0 * D, n, ATC_BK);
        if (kpos) atc_load_pos(kpb, kpos, s0, n, ATC_BK, ATC_POS_MAX);
    }
    atc_cp_commit();
    atc_cp_wait_all();
    __syncthreads(); /* the query tile and the first key tile are in */
    const float L2[2] = {ls[r0 + g] * ATC_LOG2E, ls[r0 + g + 8] * ATC_LOG2E}, Dt[2] = {dts[r0 + g], dts[r0 + g + 8]};
    const int qpr[2] = {qp[r0 + g], qp[r0 + g + 8]};
    float dqa[D / 8][4];
#pragma unroll
    for (int dn = 0; dn < D / 8; dn++) dqa[dn][0] = dqa[dn][1] = dqa[dn][2] = dqa[dn][3] = 0.0f;
    for (int st = 0; s0 < send; st ^= 1) {
        int n1 = 0;
        const long long s1 = atc_next_ktile(kpos, s0 + ATC_BK, send, causal, wl, qmax, qmin, &n1);
        if (s1 < send) {
            __nv_bfloat16 *nk = kv + 2 * (st ^ 1) * TILE;
            atc_stage<D>(nk, kg + s1 * D, n1, ATC_BK);
            atc_stage<D>(nk + TILE, vg + s1 * D, n1, ATC_BK);
            if (kpos) atc_load_pos(kpb + (st ^ 1) * ATC_BK, kpos, s1, n1, ATC_BK, ATC_POS_MAX);
            atc_cp_commit();
        }
        const __nv_bfloat16 *ks = kv + 2 * st * TILE, *vs = ks + TILE;
        const int *kp = kpb + st * ATC_BK;
        const int nt = 2 * ((n + 15) / 16);
        float ds[ATC_BK / 8][4], dp[ATC_BK / 8][4]; /* S then dS; dP */
        atc_rows_dot<D>(ds, qs + r0 * LD, ks, nt, lane);
        atc_rows_dot<D>(dp, dos + r0 * LD, vs, nt, lane);
#pragma unroll
        for (int j = 0; j < ATC_BK / 8; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int h = i >> 1, key = j * 8 + 2 * t + (i & 1);
                const bool vis = j < nt && key < n && L2[h] != kiln_neg_inf() &&
                                 (!causal || atc_vis(kpos ? kp[key] : (int)s0 + key, qpr[h], wl));
                const float P = vis ? exp2f(ds[j][i] * scale2 - L2[h]) : 0.0f;
                ds[j][i] = P * (dp[j][i] - Dt[h]) * scale;
            }
        atc_acc_rows<D>(dqa, ds, ks, nt / 2, lane);
        if (s1 < send) {
            atc_cp_wait_all();
            __syncthreads(); /* the next key tile is in; every warp is done with this one */
        }
        s0 = s1, n = n1;
    }
    atc_store_rows<D>(dq + (bh * T + t0) * D, dqa, r0, rows, lane);
}

#define ATC_DKDV_ARGS dout, q, k, v, lse, dt, qpos, kpos, dk, dv, B, H, KH, T, S, D, causal, window, scale
#define ATC_DQ_ARGS dout, q, k, v, lse, dt, qpos, kpos, dq, B, H, KH, T, S, D, causal, window, scale

template <int HD> /* HD: the head dim; D (== HD) the argument */
static __device__ __forceinline__ void atc_dkdv(const __nv_bfloat16 *dout, const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v, const float *lse, const float *dt, const int *qpos, const int *kpos, __nv_bfloat16 *dk, __nv_bfloat16 *dv, long long B, long long H, long long KH, long long T, long long S, long long D, int causal, long long window, double scale) {
    const long long tiles = (S + ATC_BK - 1) / ATC_BK, jobs = B * KH * tiles;
    const bool bypos = causal && qpos && kpos;
    const long long wl = causal && window > 0 ? window : ATC_NOWIN;
    const int *qp = bypos ? qpos : 0, *kp = bypos ? kpos : 0;
    for (long long job = blockIdx.x; job < jobs; job += gridDim.x) {
        const long long bkv = job / tiles, s0 = job % tiles * ATC_BK;
        if (D != HD) { /* not this entry point's head dim */
            const long long n = atc_min(ATC_BK, S - s0);
            for (long long e = threadIdx.x; e < n * D; e += blockDim.x) {
                kiln_st(dk, (bkv * S + s0) * D + e, kiln_nan());
                kiln_st(dv, (bkv * S + s0) * D + e, kiln_nan());
            }
            continue;
        }
        atc_dkdv_job<HD>(dout, q, k, v, lse, dt, qp, kp, dk, dv, bkv, s0, H, KH, T, S, causal != 0, wl, (float)scale);
    }
}

template <int HD> /* HD: the head dim; D (== HD) the argument */
static __device__ __forceinline__ void atc_dq(const __nv_bfloat16 *dout, const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v, const float *lse, const float *dt, const int *qpos, const int *kpos, __nv_bfloat16 *dq, long long B, long long H, long long KH, long long T, long long S, long long D, int causal, long long window, double scale) {
    const long long tiles = (T + ATC_BQ - 1) / ATC_BQ, jobs = B * H * tiles;
    const bool bypos = causal && qpos && kpos;
    const long long wl = causal && window > 0 ? window : ATC_NOWIN;
    const int *qp = bypos ? qpos : 0, *kp = bypos ? kpos : 0;
    for (long long job = blockIdx.x; job < jobs; job += gridDim.x) {
        const long long bh = job / tiles, t0 = (tiles - 1 - job % tiles) * ATC_BQ;
        if (D != HD) { /* not this entry point's head dim */
            const long long rows = atc_min(ATC_BQ, T - t0);
            for (long long e = threadIdx.x; e < rows * D; e += blockDim.x) kiln_st(dq, (bh * T + t0) * D + e, kiln_nan());
            continue;
        }
        atc_dq_job<HD>(dout, q, k, v, lse, dt, qp, kp, dq, bh, t0, H, KH, T, S, causal != 0, wl, (float)scale);
    }
}

extern "C" __global__ void __launch_bounds__(ATC_THREADS)
kiln_attention_tc_bwd_dkdv_d16(const __nv_bfloat16 *dout, const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                               const __nv_bfloat16 *v, const float *lse, const float *dt, const int *qpos,
                               const int *kpos, __nv_bfloat16 *dk, __nv_bfloat16 *dv, long long B, long long H,
                               long long KH, long long T, long long S, long long D, int causal, long long window,
                               double scale) {
    atc_dkdv<16>(ATC_DKDV_ARGS);
}
extern "C" __global__ void __launch_bounds__(ATC_THREADS)
kiln_attention_tc_bwd_dkdv_d32(const __nv_bfloat16 *dout, const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                               const __nv_bfloat16 *v, const float *lse, const float *dt, const int *qpos,
                               const int *kpos, __nv_bfloat16 *dk, __nv_bfloat16 *dv, long long B, long long H,
                               long long KH, long long T, long long S, long long D, int causal, long long window,
                               double scale) {
    atc_dkdv<32>(ATC_DKDV_ARGS);
}
extern "C" __global__ void __launch_bounds__(ATC_THREADS)
kiln_attention_tc_bwd_dkdv_d64(const __nv_bfloat16 *dout, const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                               const __nv_bfloat16 *v, const float *lse, const float *dt, const int *qpos,
                               const int *kpos, __nv_bfloat16 *dk, __nv_bfloat16 *dv, long long B, long long H,
                               long long KH, long long T, long long S, long long D, int causal, long long window,
                               double scale) {
    atc_dkdv<64>(ATC_DKDV_ARGS);
}
extern "C" __global__ void __launch_bounds__(ATC_THREADS)
kiln_attention_tc_bwd_dkdv_d128(const __nv_bfloat16 *dout, const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                                const __nv_bfloat16 *v, const float *lse, const float *dt, const int *qpos,
                                const int *kpos, __nv_bfloat16 *dk, __nv_bfloat16 *dv, long long B, long long H,
                                long long KH, long long T, long long S, long long D, int causal, long long window,
                                double scale) {
    atc_dkdv<128>(ATC_DKDV_ARGS);
}

extern "C" __global__ void __launch_bounds__(ATC_THREADS)
kiln_attention_tc_bwd_dq_d16(const __nv_bfloat16 *dout, const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                             const __nv_bfloat16 *v, const float *lse, const float *dt, const int *qpos,
                             const int *kpos, __nv_bfloat16 *dq, long long B, long long H, long long KH, long long T,
                             long long S, long long D, int causal, long long window, double scale) {
    atc_dq<16>(ATC_DQ_ARGS);
}
extern "C" __global__ void __launch_bounds__(ATC_THREADS)
kiln_attention_tc_bwd_dq_d32(const __nv_bfloat16 *dout, const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                             const __nv_bfloat16 *v, const float *lse, const float *dt, const int *qpos,
                             const int *kpos, __nv_bfloat16 *dq, long long B, long long H, long long KH, long long T,
                             long long S, long long D, int causal, long long window, double scale) {
    atc_dq<32>(ATC_DQ_ARGS);
}
extern "C" __global__ void __launch_bounds__(ATC_THREADS)
kiln_attention_tc_bwd_dq_d64(const __nv_bfloat16 *dout, const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                             const __nv_bfloat16 *v, const float *lse, const float *dt, const int *qpos,
                             const int *kpos, __nv_bfloat16 *dq, long long B, long long H, long long KH, long long T,
                             long long S, long long D, int causal, long long window, double scale) {
    atc_dq<64>(ATC_DQ_ARGS);
}
extern "C" __global__ void __launch_bounds__(ATC_THREADS)
kiln_attention_tc_bwd_dq_d128(const __nv_bfloat16 *dout, const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                              const __nv_bfloat16 *v, const float *lse, const float *dt, const int *qpos,
                              const int *kpos, __nv_bfloat16 *dq, long long B, long long H, long long KH, long long T,
                              long long S, long long D, int causal, long long window, double scale) {
    atc_dq<128>(ATC_DQ_ARGS);
}
