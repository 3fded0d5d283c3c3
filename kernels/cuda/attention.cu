/* attention.cu — kiln's own flash attention on the GPU, forward and backward
 * (ops.def attention, attention_bwd; reference compiler/interp.c; CPU twin
 * kernels/cpu/attention.c, whose essay this follows).
 *
 * q, o [B,H,T,D]; k, v [B,KH,S,D]; lse f32 [B,H,T]; query head h reads kv
 * head h/(H/KH) (GQA).  Scores are scale * q.k.  causal: key s is visible
 * to query t iff kpos[s] <= qpos[t], with the optional i32 positions qpos[T],
 * kpos[S] in any order (context-parallel chunks, ring blocks), or the indices
 * t and s when they are NULL; without causal every key is visible and the
 * positions are ignored.  A sliding window of W keys (window > 0, causal
 * only) also needs qpos[t] - kpos[s] < W.  A row that sees no key gets o =
 * 0 and lse = -inf.
 *
 * Precision: q, k, v, o, do, dq, dk, dv are bf16 in memory, loaded into
 * shared-memory tiles as f32 (exact); all math is f32 (expf, logf), and each
 * bf16 output is rounded once.  lse and the backward's scratch are f32.
 *
 * Plain CUDA C: no tensor cores, no wmma/mma, no float atomics, so the host
 * emulator (tests/cuda_emu) runs the same source.  Every block has
 * ATT_THREADS = 256 threads, and every kernel walks its jobs with a stride of
 * the grid, so a smaller grid gives the same bits.
 *
 * Thread layout.  The two tile products of every kernel use one layout: the
 * threads are ATT_COLS = 64 columns by ATT_RG = 4 row groups; thread
 * (col, rg) owns the rows rg, rg+4, rg+8, ... of the tile in column col (or
 * col+64, col+128, col+192 of a D-wide tile: ATT_DCH = 4 chunks of 64, so
 * D <= ATT_DMAX = 256).  Its accumulators stay in registers across the whole
 * job.  A warp is 32 consecutive columns of one row group, so one operand is
 * read by the warp as a broadcast (the same row) and the other as 32
 * consecutive words: tiles in shared memory have a row stride of D+1 floats
 * (score tiles BK+1), which makes the column reads conflict-free too.
 *
 * Forward (kiln_attention_fwd).  A job is (b, h, a tile of BQ = 64 query
 * rows); the block walks the key tiles of BK = 64 keys: S = q k^T into
 * shared memory (masked scores -inf), then per row (4 threads a row, two
 * shuffles) the running max m and sum l are updated and the row becomes
 * P = e^(S - m), while v replaces k in the shared tile; then o (registers)
 * is rescaled by e^(m_old - m_new) and P v is added.  At the end o /= l and
 * lse = m + log l, or o = 0 and lse = -inf for a row that saw nothing.
 *
 * Masks, tiles and sections (as the twin's tile_kind).  With causal, the
 * block knows qmax, the largest position of its query rows; a key tile is
 * first cut to its last key with kpos <= qmax, and skipped when nothing is
 * left.  So the keys that no row of the tile can see cost nothing, a ring
 * step's block whose second half is later than every local query costs only
 * its first half, and query tiles that see nothing of a block skip it.
 * Within the tiles that remain, the mask is applied element by element
 * (a thread whose whole column is later than qmax skips its dot products).
 * The index path (no positions) is the same code with qpos[t] = t,
 * kpos[s] = s, and the key loop stops at the tile's last query row.
 * Under a window (wl: W keys, or ATT_NOWIN) a key tile whose latest key
 * is W or more before the tile's earliest query is skipped the same way
 * (the backward: a query tile against a key tile), so a row's work is
 * O(W), not O(T); the window's lower edge is masked element by element
 * with the causal one (att_vis).
 *
 * Backward (FlashAttention-2, recomputing P = e^(scale q.k - lse) from the
 * saved lse, with Dt = do_t . o_t):
 *     dv_s += P do_t;  dS = P (do_t . v_s - Dt) scale;  dq_t += dS k_s;  dk_s += dS q_t
 * in three kernels, one stream, in this order:
 *   kiln_attention_bwd_prep  Dt for every query row into f32 scratch (a warp a row);
 *   kiln_attention_bwd_dkdv  a job is (b, kv head, a tile of BK keys): the
 *       block holds its k and v tiles and its dk, dv in registers, and walks
 *       every query head of the GQA group and every query tile of BQB = 32
 *       rows, in order, recomputing P and dS; so dk and dv are summed over
 *       the group in one block, in a fixed order, without scratch or atomics;
 *   kiln_attention_bwd_dq    a job is (b, h, a tile of BQB query rows): the
 *       block walks the key tiles, recomputes P and dS, and adds dS k.
 * dq is recomputed apart from dk, dv (two more tile products than one fused
 * pass) because a fused pass would have to add dq across blocks (atomics,
 * whose order varies) or keep a dq per key tile in scratch.  Rows with lse
 * = -inf add nothing, as in the twin and the interpreter.
 *
 * D > ATT_DMAX: the kernels cannot hold the accumulators, so they write NaN
 * into their outputs (the runtime should never launch them so; see README).
 */
#include "common.cuh"

#define ATT_THREADS 256                /* block size of every attention kernel */
#define ATT_COLS 64                    /* thread columns */
#define ATT_RG (ATT_THREADS / ATT_COLS) /* thread row groups: 4 */
#define ATT_BQ 64                      /* forward: query rows per tile */
#define ATT_BQB 32                     /* backward: query rows per tile */
#define ATT_BK 64                      /* keys per tile (forward and backward) */
#define ATT_PL (ATT_BK + 1)            /* row stride of the score tiles */
#define ATT_DMAX 256                   /* the largest head dim */
#define ATT_DCH (ATT_DMAX / ATT_COLS)  /* column chunks of a D-wide tile: 4 */
#define ATT_POS_MAX 0x7fffffff
#define ATT_POS_MIN (-0x7fffffff - 1)
#define ATT_NOWIN (1LL << 40) /* "no window": more keys than any distance of int positions */

static __device__ __forceinline__ long long att_min(long long a, long long b) { return a < b ? a : b; }

/* key position k visible to the query at position qp under causal with a
 * window of wl keys (ATT_NOWIN: none) */
static __device__ __forceinline__ bool att_vis(int k, int qp, long long wl) { return k <= qp && (long long)qp - k < wl; }

/* the window's keys for the kernels' window arg (0: none) */
static __device__ __forceinline__ long long att_wl(int causal, long long window) {
    return causal && window > 0 ? window : ATT_NOWIN;
}

/* position of query or key i: pos[i], or i without positions */
static __device__ __forceinline__ int att_pos(const int *pos, long long i) { return pos ? pos[i] : (int)i; }

/* the largest position of rows [t0, t0+n) (n >= 1), read by every thread
 * alike (broadcast loads), so that branches on it are uniform */
static __device__ int att_pos_max(const int *pos, long long t0, long long n) {
    if (!pos) return (int)(t0 + n - 1);
    int m = ATT_POS_MIN;
    for (long long i = 0; i < n; i++) m = pos[t0 + i] > m ? pos[t0 + i] : m;
    return m;
}

/* the smallest position of keys [s0, s0+n) (n >= 1), as att_pos_max */
static __device__ int att_pos_min(const int *pos, long long s0, long long n) {
    if (!pos) return (int)s0;
    int m = ATT_POS_MAX;
    for (long long i = 0; i < n; i++) m = pos[s0 + i] < m ? pos[s0 + i] : m;
    return m;
}

/* keys [s0, s0+n) cut to the last one with position <= qmax (0: none
 * visible); uniform across the block */
static __device__ int att_cut(const int *kpos, long long s0, int n, int qmax) {
    while (n > 0 && att_pos(kpos, s0 + n - 1) > qmax) n--;
    return n;
}

/* dst[r*(D+1) + d] = src[r*D + d] in f32 for r < n, 0 for n <= r < R */
static __device__ void att_load(float *dst, const __nv_bfloat16 *src, int n, int R, int D) {
    for (int e = threadIdx.x; e < R * D; e += blockDim.x) {
        int r = e / D, d = e - r * D;
        dst[r * (D + 1) + d] = r < n ? kiln_ld(src, e) : 0.0f;
    }
}

/* pos[i] for i < n (positions from p0), fill for n <= i < R */
static __device__ void att_load_pos(int *dst, const int *pos, long long p0, int n, int R, int fill) {
    for (int i = threadIdx.x; i < R; i += blockDim.x) dst[i] = i < n ? att_pos(pos, p0 + i) : fill;
}

/* s[i] = a[row i] . b[col] over D, rows rg + ATT_RG*i of a (row stride
 * D+1), row col of b; NR rows */
template <int NR>
static __device__ __forceinline__ void att_dots(float *s, const float *a, const float *b, int col, int rg, int D) {
    const int ld = D + 1;
#pragma unroll
    for (int i = 0; i < NR; i++) s[i] = 0.0f;
    for (int d = 0; d < D; d++) {
        float bv = b[col * ld + d];
#pragma unroll
        for (int i = 0; i < NR; i++) s[i] += a[(rg + ATT_RG * i) * ld + d] * bv;
    }
}

/* ---- forward ---- */

/* Shared memory (floats, then ints): qs [BQ][D+1], kv [BK][D+1] (k, then
 * v), ps [BQ][PL], m, l, alpha [BQ]; qp [BQ], kp [BK]. */
static __device__ void att_fwd_job(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v,
                                   const int *qpos, const int *kpos, __nv_bfloat16 *o, float *lse, long long bh,
                                   long long t0, long long H, long long KH, long long T, long long S, int D,
                                   bool causal, long long wl, float scale) {
    const int ld = D + 1, tid = threadIdx.x, col = tid % ATT_COLS, rg = tid / ATT_COLS;
    float *qs = (float *)kiln_smem, *kv = qs + ATT_BQ * ld, *ps = kv + ATT_BK * ld;
    float *mrow = ps + ATT_BQ * ATT_PL, *lrow = mrow + ATT_BQ, *alpha = lrow + ATT_BQ;
    int *qp = (int *)(alpha + ATT_BQ), *kp = qp + ATT_BQ;
    const int rows = (int)att_min(ATT_BQ, T - t0);
    const long long bkv = bh / H * KH + bh % H / (H / KH);
    const __nv_bfloat16 *kg = k + bkv * S * D, *vg = v + bkv * S * D;
    enum { NR = ATT_BQ / ATT_RG };

    __syncthreads(); /* the previous job is done with shared memory */
    att_load(qs, q + (bh * T + t0) * D, rows, ATT_BQ, D);
    att_load_pos(qp, qpos, t0, rows, ATT_BQ, ATT_POS_MIN);
    for (int r = tid; r < ATT_BQ; r += blockDim.x) mrow[r] = kiln_neg_inf(), lrow[r] = 0.0f;
    const int qmax = att_pos_max(qpos, t0, rows), qmin = att_pos_min(qpos, t0, rows);
    float acc[ATT_DCH][NR];
#pragma unroll
    for (int c = 0; c < ATT_DCH; c++)
#pragma unroll
        for (int i = 0; i < NR; i++) acc[c][i] = 0.0f;

    const long long send = causal && !qpos ? att_min(S, t0 + rows) : S;
    for (long long s0 = 0; s0 < send; s0 += ATT_BK) {
        int n = (int)att_min(ATT_BK, send - s0);
        if (causal && (n = att_cut(kpos, s0, n, qmax)) == 0) continue;
        if (wl != ATT_NOWIN && (long long)qmin - att_pos_max(kpos, s0, n) >= wl) continue; /* before every window */
        __syncthreads(); /* the last tile's P v is done with kv and ps */
        att_load(kv, kg + s0 * D, n, n, D);
        att_load_pos(kp, kpos, s0, n, ATT_BK, ATT_POS_MAX);
        __syncthreads();
        /* scores, -inf where masked */
        {
            const int j = col;
            const bool live = j < n && (!causal || (kp[j] <= qmax && (long long)qmin - kp[j] < wl));
            float s[NR];
            if (live) att_dots<NR>(s, qs, kv, j, rg, D);
#pragma unroll
            for (int i = 0; i < NR; i++) {
                int r = rg + ATT_RG * i;
                bool vis = live && r < rows && (!causal || att_vis(kp[j], qp[r], wl));
                ps[r * ATT_PL + j] = vis ? s[i] * scale : kiln_neg_inf();
            }
        }
        __syncthreads();
        /* the rows' online softmax: 4 threads a row, 16 columns each */
        {
            const int r = tid / 4, sub = tid % 4;
            float *x = ps + r * ATT_PL + sub * (ATT_BK / 4), mx = kiln_neg_inf(), sum = 0.0f;
            for (int j = 0; j < ATT_BK / 4; j++) mx = fmaxf(mx, x[j]);
            mx = fmaxf(mx, __shfl_xor_sync(KILN_FULL_MASK, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(KILN_FULL_MASK, mx, 2));
            const float mold = mrow[r], mnew = fmaxf(mold, mx);
            for (int j = 0; j < ATT_BK / 4; j++) {
                float p = x[j] == kiln_neg_inf() ? 0.0f : expf(x[j] - mnew);
                x[j] = p;
                sum += p;
            }
            sum += __shfl_xor_sync(KILN_FULL_MASK, sum, 1);
            sum += __shfl_xor_sync(KILN_FULL_MASK, sum, 2);
            /* every sub has read mrow[r] (mold, above) before sub 0 rewrites
             * it: a shuffle synchronizes the lanes' values but orders no
             * memory access (compute-sanitizer racecheck reported this
             * read/write pair on the H200, 2026-12-04); __syncwarp does */
            __syncwarp();
            if (sub == 0) {
                float a = mnew == kiln_neg_inf() ? 1.0f : expf(mold - mnew);
                alpha[r] = a;
                lrow[r] = lrow[r] * a + sum;
                mrow[r] = mnew;
            }
        }
        att_load(kv, vg + s0 * D, n, n, D); /* k is no longer needed */
        __syncthreads();
        /* o = o alpha + P v */
#pragma unroll
        for (int c = 0; c < ATT_DCH; c++) {
            const int d = col + ATT_COLS * c;
            if (d >= D) break;
#pragma unroll
            for (int i = 0; i < NR; i++) {
                const int r = rg + ATT_RG * i;
                const float *p = ps + r * ATT_PL;
                float a = acc[c][i] * alpha[r];
                for (int j = 0; j < n; j++) a += p[j] * kv[j * ld + d];
                acc[c][i] = a;
            }
        }
    }
    __syncthreads(); /* m and l are final */
#pragma unroll
    for (int c = 0; c < ATT_DCH; c++) {
        const int d = col + ATT_COLS * c;
        if (d >= D) break;
#pragma unroll
        for (int i = 0; i < NR; i++) {
            const int r = rg + ATT_RG * i;
            if (r >= rows) break;
            const float L = lrow[r];
            kiln_st(o, (bh * T + t0 + r) * D + d, mrow[r] == kiln_neg_inf() || L == 0.0f ? 0.0f : acc[c][i] / L);
        }
    }
    for (int r = tid; r < rows; r += blockDim.x) {
        const float M = mrow[r], L = lrow[r];
        lse[bh * T + t0 + r] = M == kiln_neg_inf() || L == 0.0f ? kiln_neg_inf() : M + logf(L);
    }
}

extern "C" __global__ void __launch_bounds__(ATT_THREADS)
kiln_attention_fwd(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v, const int *qpos,
                   const int *kpos, __nv_bfloat16 *o, float *lse, long long B, long long H, long long KH, long long T,
                   long long S, long long D, int causal, long long window, double scale) {
    const long long tiles = (T + ATT_BQ - 1) / ATT_BQ, jobs = B * H * tiles;
    const bool bypos = causal && qpos && kpos;
    for (long long job = blockIdx.x; job < jobs; job += gridDim.x) {
        /* the last query tiles (the most keys under causal) first */
        const long long bh = job / tiles, t0 = (tiles - 1 - job % tiles) * ATT_BQ;
        if (D > ATT_DMAX) {
            const long long rows = att_min(ATT_BQ, T - t0);
            for (long long e = threadIdx.x; e < rows * D; e += blockDim.x) kiln_st(o, (bh * T + t0) * D + e, kiln_nan());
            for (long long r = threadIdx.x; r < rows; r += blockDim.x) lse[bh * T + t0 + r] = kiln_nan();
            continue;
        }
        att_fwd_job(q, k, v, bypos ? qpos : 0, bypos ? kpos : 0, o, lse, bh, t0, H, KH, T, S, (int)D, causal != 0,
                    att_wl(causal, window), (float)scale);
    }
}

/* ---- backward ---- */

/* Dt = do . o per row */
extern "C" __global__ void __launch_bounds__(ATT_THREADS)
kiln_attention_bwd_prep(const __nv_bfloat16 *dout, const __nv_bfloat16 *o, float *dt, long long rows, long long D) {
    const int lane = threadIdx.x % 32, warps = blockDim.x / 32;
    for (long long r = (long long)blockIdx.x * warps + threadIdx.x / 32; r < rows; r += (long long)gridDim.x * warps) {
        float s = 0.0f;
        for (long long d = lane; d < D; d += 32) s += kiln_ld(dout, r * D + d) * kiln_ld(o, r * D + d);
        s = kiln_warp_sum(s);
        if (lane == 0) dt[r] = s;
    }
}

/* A backward query tile in shared memory: rows of q and do ([BQB][D+1]),
 * their lse (-inf past the tile's rows), Dt and positions. */
struct AttQTile {
    float *qs, *dos, *ls, *dts;
    int *qp;
};

static __device__ void att_load_qtile(const AttQTile &t, const __nv_bfloat16 *q, const __nv_bfloat16 *dout,
                                      const float *lse, const float *dt, const int *qpos, long long bh, long long T,
                                      long long t0, int rows, int D) {
    att_load(t.qs, q + (bh * T + t0) * D, rows, ATT_BQB, D);
    att_load(t.dos, dout + (bh * T + t0) * D, rows, ATT_BQB, D);
    att_load_pos(t.qp, qpos, t0, rows, ATT_BQB, ATT_POS_MIN);
    for (int r = threadIdx.x; r < ATT_BQB; r += blockDim.x) {
        t.ls[r] = r < rows ? lse[bh * T + t0 + r] : kiln_neg_inf();
        t.dts[r] = r < rows ? dt[bh * T + t0 + r] : 0.0f;
    }
}

/* P and dS of the query tile against the key tile (n keys: ks, vs [BK][D+1],
 * positions kp) into ps (unless NULL) and dss [BQB][PL]; 0 where masked, past
 * the tile or on rows with lse = -inf. */
static __device__ void att_p_ds(const AttQTile &t, const float *ks, const float *vs, const int *kp, int n, int D,
                                bool causal, long long wl, int qmin, int qmax, float scale, float *ps, float *dss) {
    enum { NR = ATT_BQB / ATT_RG };
    const int j = threadIdx.x % ATT_COLS, rg = threadIdx.x / ATT_COLS;
    const bool live = j < n && (!causal || (kp[j] <= qmax && (long long)qmin - kp[j] < wl));
    float s[NR], dp[NR];
    if (live) {
        att_dots<NR>(s, t.qs, ks, j, rg, D);
        att_dots<NR>(dp, t.dos, vs, j, rg, D);
    }
#pragma unroll
    for (int i = 0; i < NR; i++) {
        const int r = rg + ATT_RG * i;
        const float L = t.ls[r];
        const bool vis = live && L != kiln_neg_inf() && (!causal || att_vis(kp[j], t.qp[r], wl));
        const float p = vis ? expf(s[i] * scale - L) : 0.0f;
        if (ps) ps[r * ATT_PL + j] = p;
        dss[r * ATT_PL + j] = vis ? p * (dp[i] - t.dts[r]) * scale : 0.0f;
    }
}

/* Shared memory (floats, then ints): ks, vs [BK][D+1], qs, dos [BQB][D+1],
 * ps, dss [BQB][PL], ls, dts [BQB]; qp [BQB], kp [BK], live [BQB]. */
static __device__ void att_dkdv_job(const __nv_bfloat16 *dout, const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                                    const __nv_bfloat16 *v, const float *lse, const float *dt, const int *qpos,
                                    const int *kpos, __nv_bfloat16 *dk, __nv_bfloat16 *dv, long long bkv,
                                    long long s0, long long H, long long KH, long long T, long long S, int D,
                                    bool causal, long long wl, float scale) {
    const int ld = D + 1, tid = threadIdx.x, col = tid % ATT_COLS, rg = tid / ATT_COLS;
    float *ks = (float *)kiln_smem, *vs = ks + ATT_BK * ld;
    AttQTile t;
    t.qs = vs + ATT_BK * ld;
    t.dos = t.qs + ATT_BQB * ld;
    float *ps = t.dos + ATT_BQB * ld, *dss = ps + ATT_BQB * ATT_PL;
    t.ls = dss + ATT_BQB * ATT_PL;
    t.dts = t.ls + ATT_BQB;
    t.qp = (int *)(t.dts + ATT_BQB);
    int *kp = t.qp + ATT_BQB, *live = kp + ATT_BK;
    const int n = (int)att_min(ATT_BK, S - s0);
    const long long b = bkv / KH, rep = H / KH, h0 = b * H + bkv % KH * rep;
    enum { NR = ATT_BK / ATT_RG };

    __syncthreads(); /* the previous job is done with shared memory */
    att_load(ks, k + (bkv * S + s0) * D, n, ATT_BK, D);
    att_load(vs, v + (bkv * S + s0) * D, n, ATT_BK, D);
    att_load_pos(kp, kpos, s0, n, ATT_BK, ATT_POS_MAX);
    const int kmin = att_pos_min(kpos, s0, n), kmax = att_pos_max(kpos, s0, n);
    float gk[ATT_DCH][NR], gv[ATT_DCH][NR];
#pragma unroll
    for (int c = 0; c < ATT_DCH; c++)
#pragma unroll
        for (int i = 0; i < NR; i++) gk[c][i] = gv[c][i] = 0.0f;

    for (long long bh = h0; bh < h0 + rep; bh++)
        for (long long t0 = causal && !qpos ? s0 / ATT_BQB * ATT_BQB : 0; t0 < T; t0 += ATT_BQB) {
            const int rows = (int)att_min(ATT_BQB, T - t0);
            const int qmax = att_pos_max(qpos, t0, rows), qmin = att_pos_min(qpos, t0, rows);
            if (causal && (qmax < kmin || (long long)qmin - kmax >= wl)) continue; /* the tile sees none of these keys */
            __syncthreads(); /* the last tile is done with the query tile */
            att_load_qtile(t, q, dout, lse, dt, qpos, bh, T, t0, rows, D);
            for (int r = tid; r < ATT_BQB; r += blockDim.x) {
                const int qr = r < rows ? att_pos(qpos, t0 + r) : 0;
                live[r] = r < rows && lse[bh * T + t0 + r] != kiln_neg_inf() &&
                          (!causal || (qr >= kmin && (long long)qr - kmax < wl));
            }
            __syncthreads();
            att_p_ds(t, ks, vs, kp, n, D, causal, wl, qmin, qmax, scale, ps, dss);
            __syncthreads();
            /* dv += P^T do, dk += dS^T q over the live rows */
            for (int r = 0; r < rows; r++) {
                if (!live[r]) continue;
                const float *pr = ps + r * ATT_PL, *dr = dss + r * ATT_PL;
#pragma unroll
                for (int c = 0; c < ATT_DCH; c++) {
                    const int d = col + ATT_COLS * c;
                    if (d >= D) break;
                    const float qd = t.qs[r * ld + d], dd = t.dos[r * ld + d];
#pragma unroll
                    for (int i = 0; i < NR; i++) {
                        const int j = rg + ATT_RG * i;
                        gv[c][i] += pr[j] * dd;
                        gk[c][i] += dr[j] * qd;
                    }
                }
            }
        }
#pragma unroll
    for (int c = 0; c < ATT_DCH; c++) {
        const int d = col + ATT_COLS * c;
        if (d >= D) break;
#pragma unroll
        for (int i = 0; i < NR; i++) {
            const int j = rg + ATT_RG * i;
            if (j >= n) break;
            kiln_st(dk, (bkv * S + s0 + j) * D + d, gk[c][i]);
            kiln_st(dv, (bkv * S + s0 + j) * D + d, gv[c][i]);
        }
    }
}

extern "C" __global__ void __launch_bounds__(ATT_THREADS)
kiln_attention_bwd_dkdv(const __nv_bfloat16 *dout, const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                        const __nv_bfloat16 *v, const float *lse, const float *dt, const int *qpos, const int *kpos,
                        __nv_bfloat16 *dk, __nv_bfloat16 *dv, long long B, long long H, long long KH, long long T,
                        long long S, long long D, int causal, long long window, double scale) {
    const long long tiles = (S + ATT_BK - 1) / ATT_BK, jobs = B * KH * tiles;
    const bool bypos = causal && qpos && kpos;
    for (long long job = blockIdx.x; job < jobs; job += gridDim.x) {
        const long long bkv = job / tiles, s0 = job % tiles * ATT_BK;
        if (D > ATT_DMAX) {
            const long long n = att_min(ATT_BK, S - s0);
            for (long long e = threadIdx.x; e < n * D; e += blockDim.x) {
                kiln_st(dk, (bkv * S + s0) * D + e, kiln_nan());
                kiln_st(dv, (bkv * S + s0) * D + e, kiln_nan());
            }
            continue;
        }
        att_dkdv_job(dout, q, k, v, lse, dt, bypos ? qpos : 0, bypos ? kpos : 0, dk, dv, bkv, s0, H, KH, T, S,
                     (int)D, causal != 0, att_wl(causal, window), (float)scale);
    }
}

/* Shared memory (floats, then ints): qs, dos [BQB][D+1], ks, vs [BK][D+1],
 * dss [BQB][PL], ls, dts [BQB]; qp [BQB], kp [BK]. */
static __device__ void att_dq_job(const __nv_bfloat16 *dout, const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                                  const __nv_bfloat16 *v, const float *lse, const float *dt, const int *qpos,
                                  const int *kpos, __nv_bfloat16 *dq, long long bh, long long t0, long long H,
                                  long long KH, long long T, long long S, int D, bool causal, long long wl,
                                  float scale) {
    const int ld = D + 1, col = threadIdx.x % ATT_COLS, rg = threadIdx.x / ATT_COLS;
    AttQTile t;
    t.qs = (float *)kiln_smem;
    t.dos = t.qs + ATT_BQB * ld;
    float *ks = t.dos + ATT_BQB * ld, *vs = ks + ATT_BK * ld, *dss = vs + ATT_BK * ld;
    t.ls = dss + ATT_BQB * ATT_PL;
    t.dts = t.ls + ATT_BQB;
    t.qp = (int *)(t.dts + ATT_BQB);
    int *kp = t.qp + ATT_BQB;
    const int rows = (int)att_min(ATT_BQB, T - t0);
    const long long bkv = bh / H * KH + bh % H / (H / KH);
    const __nv_bfloat16 *kg = k + bkv * S * D, *vg = v + bkv * S * D;
    enum { NR = ATT_BQB / ATT_RG };

    __syncthreads(); /* the previous job is done with shared memory */
    att_load_qtile(t, q, dout, lse, dt, qpos, bh, T, t0, rows, D);
    const int qmax = att_pos_max(qpos, t0, rows), qmin = att_pos_min(qpos, t0, rows);
    float g[ATT_DCH][NR];
#pragma unroll
    for (int c = 0; c < ATT_DCH; c++)
#pragma unroll
        for (int i = 0; i < NR; i++) g[c][i] = 0.0f;

    const long long send = causal && !qpos ? att_min(S, t0 + rows) : S;
    for (long long s0 = 0; s0 < send; s0 += ATT_BK) {
        int n = (int)att_min(ATT_BK, send - s0);
        if (causal && (n = att_cut(kpos, s0, n, qmax)) == 0) continue;
        if (wl != ATT_NOWIN && (long long)qmin - att_pos_max(kpos, s0, n) >= wl) continue; /* before every window */
        __syncthreads(); /* the last tile's dS k is done with ks and dss */
        att_load(ks, kg + s0 * D, n, ATT_BK, D);
        att_load(vs, vg + s0 * D, n, ATT_BK, D);
        att_load_pos(kp, kpos, s0, n, ATT_BK, ATT_POS_MAX);
        __syncthreads();
        att_p_ds(t, ks, vs, kp, n, D, causal, wl, qmin, qmax, scale, 0, dss);
        __syncthreads();
        /* dq += dS k */
#pragma unroll
        for (int c = 0; c < ATT_DCH; c++) {
            const int d = col + ATT_COLS * c;
            if (d >= D) break;
#pragma unroll
            for (int i = 0; i < NR; i++) {
                const float *dr = dss + (rg + ATT_RG * i) * ATT_PL;
                float a = g[c][i];
                for (int j = 0; j < n; j++) a += dr[j] * ks[j * ld + d];
                g[c][i] = a;
            }
        }
    }
#pragma unroll
    for (int c = 0; c < ATT_DCH; c++) {
        const int d = col + ATT_COLS * c;
        if (d >= D) break;
#pragma unroll
        for (int i = 0; i < NR; i++) {
            const int r = rg + ATT_RG * i;
            if (r >= rows) break;
            kiln_st(dq, (bh * T + t0 + r) * D + d, g[c][i]);
        }
    }
}

extern "C" __global__ void __launch_bounds__(ATT_THREADS)
kiln_attention_bwd_dq(const __nv_bfloat16 *dout, const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                      const __nv_bfloat16 *v, const float *lse, const float *dt, const int *qpos, const int *kpos,
                      __nv_bfloat16 *dq, long long B, long long H, long long KH, long long T, long long S, long long D,
                      int causal, long long window, double scale) {
    const long long tiles = (T + ATT_BQB - 1) / ATT_BQB, jobs = B * H * tiles;
    const bool bypos = causal && qpos && kpos;
    for (long long job = blockIdx.x; job < jobs; job += gridDim.x) {
        const long long bh = job / tiles, t0 = (tiles - 1 - job % tiles) * ATT_BQB;
        if (D > ATT_DMAX) {
            const long long rows = att_min(ATT_BQB, T - t0);
            for (long long e = threadIdx.x; e < rows * D; e += blockDim.x) kiln_st(dq, (bh * T + t0) * D + e, kiln_nan());
            continue;
        }
        att_dq_job(dout, q, k, v, lse, dt, bypos ? qpos : 0, bypos ? kpos : 0, dq, bh, t0, H, KH, T, S, (int)D,
                   causal != 0, att_wl(causal, window), (float)scale);
    }
}
