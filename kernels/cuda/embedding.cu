/* embedding.cu — embedding lookup and its backward, a deterministic
 * scatter-add (ops.def embedding, embedding_bwd; CPU twin kernels/cpu/embed.c).
 *
 * Forward: out[i, :] = table[ids[i], :], bf16 copied as is; one block per
 * id.  An id outside [0, V) (the twin fails the step; a kernel cannot) gives
 * a row of NaN, which the loss then carries to the trainer.
 *
 * Backward: dtable[v, :] = sum of dy[i, :] over the i with ids[i] == v, in
 * f32, every row written (0 where no id points).  Ids repeat, so a
 * scatter with float atomics would add in an order that varies run to run.
 * Instead the (id, i) pairs are sorted by id with a stable LSD radix sort
 * (8-bit digits, so i stays ascending within an id), and then one block per
 * run of equal ids adds that run's dy rows in ascending i: the same order,
 * and in f32 the same bits, as the twin (which adds in i order too).
 *
 * The sort, per pass (digit) p = 0 .. passes-1, in three kernels over tiles
 * of KILN_BLOCK pairs:
 *   hist:    each tile counts its digits into counts[digit][tile] (integer
 *            shared-memory atomics: the counts are exact, so deterministic);
 *   scan:    one block turns counts, read digit-major, into exclusive
 *            prefix sums: where each (digit, tile) group starts in the output;
 *   scatter: each tile writes its pairs there, ranked within the tile by
 *            warp (__match_any_sync) and lane, so the sort is stable.
 * Pass 0 reads ids (with i as the value) and replaces an id outside [0, V)
 * by V, so such ids sort after every real one and are dropped; passes
 * ping-pong between two key/value buffers in the scratch.  `passes` is the
 * number of 8-bit digits of V (README: it and the scratch layout); a pass
 * kernel launched with pass >= passes returns at once, so launching four
 * passes always is also correct.  Then:
 *   zero:    dtable = 0;
 *   sum:     the block of sorted position k, when k starts a run of id v,
 *            writes dtable[v, :] = sum of the run's dy rows.
 *
 * Scratch (int32): keys0[n] vals0[n] keys1[n] vals1[n] counts[256*tiles],
 * tiles = ceil(n / 256).  Everything lives in the scratch and is computed
 * from (n, V), so the kernels need no other state.
 */
#include "common.cuh"

#define EMB_DIGITS 256 /* 8-bit radix */
#define EMB_BATCH 16   /* run entries whose loads kiln_embedding_bwd issues together */

extern "C" __global__ void __launch_bounds__(KILN_BLOCK)
kiln_embedding_fwd(const __nv_bfloat16 *table, const int *ids, __nv_bfloat16 *out, long long n, long long C,
                   long long V) {
    for (long long r = blockIdx.x; r < n; r += gridDim.x) {
        int id = ids[r];
        __nv_bfloat16 *o = out + r * C;
        if (id < 0 || id >= V) {
            for (long long c = threadIdx.x; c < C; c += blockDim.x) kiln_st(o, c, kiln_nan());
            continue;
        }
        const __nv_bfloat16 *src = table + (long long)id * C;
        for (long long c = threadIdx.x; c < C; c += blockDim.x) o[c] = src[c];
    }
}

/* ---- backward: the radix sort ---- */

typedef struct {
    int *work, *counts;
    long long n, tiles;
} EmbWork;

static __device__ EmbWork emb_work(int *work, long long n) {
    EmbWork w;
    w.work = work;
    w.n = n;
    w.counts = work + 4 * n;
    w.tiles = (n + KILN_BLOCK - 1) / KILN_BLOCK;
    return w;
}

/* key and value buffer b (0 or 1) of the ping-pong */
static __device__ __forceinline__ int *emb_keys(const EmbWork &w, long long b) { return w.work + 2 * b * w.n; }
static __device__ __forceinline__ int *emb_vals(const EmbWork &w, long long b) { return w.work + (2 * b + 1) * w.n; }

/* 8-bit digits needed for keys in [0, V] (V itself marks a bad id) */
static __device__ int emb_passes(long long V) {
    int bits = V > 0 ? 64 - __clzll(V) : 1;
    return (bits + 7) / 8;
}

/* the pair at position j as pass `pass` reads it */
static __device__ void emb_load(const EmbWork &w, const int *ids, long long V, long long pass, long long j, int *key,
                                int *val) {
    if (pass == 0) {
        int id = ids[j];
        *key = id < 0 || id >= V ? (int)V : id;
        *val = (int)j;
    } else {
        *key = emb_keys(w, (pass - 1) & 1)[j];
        *val = emb_vals(w, (pass - 1) & 1)[j];
    }
}

static __device__ __forceinline__ int emb_digit(int key, long long pass) { return (key >> (8 * pass)) & 255; }

extern "C" __global__ void __launch_bounds__(KILN_BLOCK)
kiln_embedding_bwd_hist(const int *ids, int *work, long long n, long long V, long long pass) {
    __shared__ int hist[EMB_DIGITS];
    if (pass >= emb_passes(V)) return;
    EmbWork w = emb_work(work, n);
    for (long long tile = blockIdx.x; tile < w.tiles; tile += gridDim.x) {
        hist[threadIdx.x] = 0;
        __syncthreads();
        long long j = tile * KILN_BLOCK + threadIdx.x;
        if (j < n) {
            int key, val;
            emb_load(w, ids, V, pass, j, &key, &val);
            atomicAdd(&hist[emb_digit(key, pass)], 1);
        }
        __syncthreads();
        w.counts[threadIdx.x * w.tiles + tile] = hist[threadIdx.x];
        __syncthreads(); /* hist is read before the next tile clears it */
    }
}

/* exclusive prefix sum of an int over the block, in index order; *total gets the block's sum */
static __device__ int block_exclusive_scan(int v, int *total) {
    __shared__ int warp_incl[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    int x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        int y = __shfl_up_sync(KILN_FULL_MASK, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) warp_incl[warp] = x;
    __syncthreads();
    if (warp == 0) {
        int t = lane < nwarps ? warp_incl[lane] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            int y = __shfl_up_sync(KILN_FULL_MASK, t, o);
            if (lane >= o) t += y;
        }
        if (lane < nwarps) warp_incl[lane] = t;
    }
    __syncthreads();
    int before = (warp > 0 ? warp_incl[warp - 1] : 0) + x - v;
    *total = warp_incl[nwarps - 1];
    __syncthreads(); /* warp_incl is read before a next call writes it */
    return before;
}

extern "C" __global__ void __launch_bounds__(1024)
kiln_embedding_bwd_scan(int *work, long long n, long long V, long long pass) {
    if (pass >= emb_passes(V) || blockIdx.x != 0) return;
    EmbWork w = emb_work(work, n);
    long long total = EMB_DIGITS * w.tiles;
    int carry = 0;
    for (long long base = 0; base < total; base += blockDim.x) {
        long long i = base + threadIdx.x;
        int v = i < total ? w.counts[i] : 0, sum;
        int before = block_exclusive_scan(v, &sum);
        if (i < total) w.counts[i] = carry + before;
        carry += sum;
    }
}

extern "C" __global__ void __launch_bounds__(KILN_BLOCK)
kiln_embedding_bwd_scatter(const int *ids, int *work, long long n, long long V, long long pass) {
    __shared__ int warp_count[KILN_WARPS][EMB_DIGITS];
    if (pass >= emb_passes(V)) return;
    EmbWork w = emb_work(work, n);
    int *okey = emb_keys(w, pass & 1), *oval = emb_vals(w, pass & 1);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (long long tile = blockIdx.x; tile < w.tiles; tile += gridDim.x) {
        for (int k = threadIdx.x; k < KILN_WARPS * EMB_DIGITS; k += blockDim.x) (&warp_count[0][0])[k] = 0;
        __syncthreads();
        long long j = tile * KILN_BLOCK + threadIdx.x;
        int key = 0, val = 0, d = -1; /* -1: past the end; matches no real digit */
        if (j < n) {
            emb_load(w, ids, V, pass, j, &key, &val);
            d = emb_digit(key, pass);
        }
        unsigned peers = __match_any_sync(KILN_FULL_MASK, d);
        int below = __popc(peers & ((1u << lane) - 1u)); /* same digit, lower lane */
        if (d >= 0 && below == 0) warp_count[warp][d] = __popc(peers);
        __syncthreads();
        if (d >= 0) {
            int rank = below;
            for (int v = 0; v < warp; v++) rank += warp_count[v][d];
            long long at = (long long)w.counts[d * w.tiles + tile] + rank;
            okey[at] = key;
            oval[at] = val;
        }
        __syncthreads(); /* warp_count is read before the next tile clears it */
    }
}

/* ---- backward: zero, then sum the runs ---- */

extern "C" __global__ void __launch_bounds__(KILN_BLOCK)
kiln_embedding_bwd_zero(float *dtable, long long V, long long C) {
    long long total = V * C;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x)
        dtable[i] = 0.0f;
}

extern "C" __global__ void __launch_bounds__(KILN_BLOCK)
kiln_embedding_bwd(const __nv_bfloat16 *dy, const int *work, float *dtable, long long n, long long C, long long V) {
    EmbWork w = emb_work((int *)work, n);
    int last = (emb_passes(V) - 1) & 1;
    const int *key = emb_keys(w, last), *val = emb_vals(w, last);
    for (long long k = blockIdx.x; k < n; k += gridDim.x) {
        int id = key[k];
        if (id >= V || (k > 0 && key[k - 1] == id)) continue; /* a bad id, or not the start of a run */
        for (long long c = blockIdx.y * (long long)blockDim.x + threadIdx.x; c < C; c += (long long)gridDim.y * blockDim.x) {
            /* the run's dy rows added in ascending position, EMB_BATCH
             * positions' loads issued at once (a run of a frequent token is
             * thousands long: one dependent load at a time was the cost);
             * the keys are sorted, so the run is a prefix of each batch and
             * only its entries are added: the same additions, the same bits */
            float s = 0.0f;
            for (long long q = k;; q += EMB_BATCH) {
                /* the keys and rows first, unconditionally (positions past n
                 * clamped to n - 1, then not taken): independent loads, so
                 * they are in flight together, not one key's round trip each */
                int kk[EMB_BATCH], row[EMB_BATCH];
#pragma unroll
                for (int u = 0; u < EMB_BATCH; u++) {
                    const long long j = q + u < n ? q + u : n - 1;
                    kk[u] = key[j];
                    row[u] = val[j];
                }
                bool in[EMB_BATCH];
#pragma unroll
                for (int u = 0; u < EMB_BATCH; u++) in[u] = (q + u < n) & (kk[u] == id);
                float v[EMB_BATCH];
#pragma unroll
                for (int u = 0; u < EMB_BATCH; u++) v[u] = in[u] ? kiln_ld(dy, (long long)row[u] * C + c) : 0.0f;
#pragma unroll
                for (int u = 0; u < EMB_BATCH; u++)
                    if (in[u]) s += v[u];
                if (!in[EMB_BATCH - 1]) break;
            }
            dtable[(long long)id * C + c] = s;
        }
    }
}
