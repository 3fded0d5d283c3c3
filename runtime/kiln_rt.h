/* kiln_rt.h — the only interface between generated code and the runtime.
 *
 * A compiled kiln program is a table (rt_program: its memory spaces, its
 * parameters, state, inputs and outputs with their places in memory) and a
 * `step` function: straight-line code that issues, in schedule order, kernel
 * launches and event record/wait calls on numbered streams.  Nothing is
 * decided at run time except the rank indices and the learning-rate
 * schedule's four numbers (rt_schedule), which the trainer may set.
 *
 * Every kernel, library or generated, has one signature:
 *
 *     void kernel(rt_ctx *ctx, const int64_t *args);
 *
 * Its arguments are one flat int64 array whose layout each kernel documents
 * below: pointers are stored as (int64_t)(intptr_t)p, sizes and flags as
 * integers, and real attributes (eps, scale, ...) as the bit pattern of a
 * double (rt_f64_bits / rt_bits_f64).  rt_launch copies the array, so the
 * generated code may build it on its stack.
 *
 * Streams are in-order queues, each served by its own worker thread; events
 * are real synchronisation objects: rt_record(s, e) completes event e when
 * stream s reaches it, rt_wait(s, e) holds stream s until e has completed in
 * this step.  A schedule that forgets an event therefore races instead of
 * passing by luck.  Kernels parallelise their own loops with
 * rt_parallel_for, which runs on a pool shared by all streams.
 *
 * Memory: the runtime allocates one buffer per space (64-byte aligned) of
 * the program's space_bytes[]; the step function receives their bases.
 * Parameters, gradients and optimizer state have their own spaces so that
 * checkpoints and the distributed optimizer see contiguous buffers.
 *
 * Precision on the CPU: f32 tensors, i32 token ids.  On a GPU (device
 * RT_DEV_CUDA, runtime/dev_cuda.c) the program's dtypes are exact (the
 * precision pass has run): bf16 activations and weight copies, f32 master
 * weights, optimizer state, weight gradients and losses.
 *
 * Two devices implement this header: the CPU (dev_cpu.c, kernels/cpu,
 * comm_mpi.c + coll_mpi.c) and CUDA (dev_cuda.c, kernels_cuda.c,
 * comm_mpi.c + comm_nccl.c).  A program names its device; the generated
 * code is the same host code for both (rt_launch of rtk_* kernels with the
 * same args), except that a CUDA program launches its generated kernels
 * through rtk_fused.  On CUDA, rt_launch enqueues: every kernel, copy and
 * collective is asynchronous on the stream's CUDA stream.
 */
#ifndef KILN_RT_H
#define KILN_RT_H

#include <stdint.h>
#include <string.h>

/* 11: rt_program gained stage, nstages and stages (pipeline parallelism:
 * one table per pipeline stage, all reachable from kiln_program).
 * 12: the host space RT_SPACE_HOST (activation offload, issue 19):
 * space_bytes has RT_NSPACES = 5 entries.
 * 13: rtk_recv_start and rtk_recv_done (a receive posted early).
 * 14: rt_tensor gained tp_split and tp_blocks (tensor parallelism).
 * 15: the CUDA launchers rtk_cross_entropy_fused, rtk_gemm_bias and
 * rtk_gemm_bias_gelu (issue 23, added at 14 without a bump), and
 * rtk_gemm_dgelu_bgrad and rtk_gemm_bgrad. */
#define RT_ABI_VERSION 15

typedef struct rt_ctx rt_ctx;
typedef void (*rt_kernel)(rt_ctx *ctx, const int64_t *args);

/* ---- args encoding ---- */
static inline int64_t rt_ptr_arg(const void *p) { return (int64_t)(intptr_t)p; }
static inline void *rt_arg_ptr(int64_t a) { return (void *)(intptr_t)a; }
static inline int64_t rt_f64_bits(double d) { int64_t b; memcpy(&b, &d, 8); return b; }
static inline double rt_bits_f64(int64_t b) { double d; memcpy(&d, &b, 8); return d; }
#define RT_F32P(a) ((float *)rt_arg_ptr(a))
#define RT_I32P(a) ((int32_t *)rt_arg_ptr(a))

/* ---- the program ---- */
/* RT_SPACE_HOST: host memory that the step's copies (rtk_offload,
 * rtk_reload) move saved activations to and from; pinned on CUDA, a
 * separate arena on the CPU.  No tensor of the table lives there. */
enum { RT_SPACE_PARAMS, RT_SPACE_GRADS, RT_SPACE_OPT, RT_SPACE_ACT, RT_SPACE_HOST, RT_NSPACES };
enum { RT_F32, RT_BF16, RT_F16, RT_I32, RT_I64 }; /* same order as the IR's DType */
enum { RT_DEV_CPU, RT_DEV_CUDA };

/* A CUDA module the program embeds: a cubin for the program's arch. */
typedef struct {
    const char *name;          /* "generated", "layernorm", ...: for messages */
    const unsigned char *data; /* the cubin (an ELF image) */
    int64_t size;
} rt_cubin;

typedef struct {
    const char *name;
    int space;       /* RT_SPACE_* */
    int64_t offset;  /* bytes into the space */
    int dtype;       /* RT_F32, ... */
    int rank;
    int64_t dim[5];
    const char *init; /* params: "normal" | "zeros" | "ones"; NULL otherwise */
    double std;
    /* States only: bucket >= 0 marks this rank's shard of a flat bucket
     * (rt_bucket) of optimizer state; the logical tensors it holds are
     * "<prefix><param name>" for the bucket's members (prefix "opt.m." or
     * "opt.v."), which is what checkpoints store.  -1 / NULL otherwise.
     * Prefix "" (state "param.b<k>"): the shard holds the params
     * themselves (the distributed optimizer's master weights; the step
     * all-gathers them at its start).  Those params have no storage of
     * their own: space = -1 and offset = -1 in params[]; rt_init_params
     * fills the shard from their init (normal: the same full-tensor draw as
     * a stored param, this rank's chunk), and checkpoints store them under
     * the param's own (checkpoint) name, exactly as a stored param. */
    int bucket;
    const char *prefix;
    /* Params split over tensor parallelism (issue 20): tp_split = d + 1 when
     * this rank holds group-rank i's piece of dim d (0: not split); the dim
     * is tp_blocks blocks (0 or 1: one), each cut into the tp pieces, so a
     * rank holds its piece of every block (a fused QKV).  rt_init_params
     * draws the logical tensor's values for exactly those elements. */
    int tp_split, tp_blocks;
} rt_tensor;

/* Mesh axes as group masks (the IR's ir_group_mask: "dp" = RT_AXIS_DP,
 * "dp+cp" = RT_AXIS_DP|RT_AXIS_CP).  World rank r has coordinates
 * (pp, dp, cp, tp) with tp fastest: r = ((pp*DP + dp)*CP + cp)*TP + tp. */
enum { RT_AXIS_PP = 1, RT_AXIS_DP = 2, RT_AXIS_CP = 4, RT_AXIS_TP = 8 };

/* A flat bucket of the distributed optimizer (kiln compile --zero 1): the
 * members params[param[j]], flattened row-major, start at element
 * offset[j]; the rest up to n is zero padding, n a multiple of the group's
 * size.  Group-rank i of `group` holds elements [i*n/size, (i+1)*n/size) of
 * every state with this bucket. */
typedef struct {
    int group;             /* RT_AXIS_* mask */
    int64_t n;             /* padded length, elements */
    int nmembers;
    const int *param;      /* indices into rt_program.params */
    const int64_t *offset; /* element offsets of the members */
} rt_bucket;

/* The learning-rate schedule of op lr_cosine (ops.def), one per program.
 * The generated module holds it as a mutable global initialised with the
 * compiled attributes; rtk_lr_cosine reads it every step, so the trainer may
 * set it before training (--lr, --min-lr, --warmup, --schedule-steps) and a
 * checkpoint restores it.  Write it only between steps. */
typedef struct {
    double lr, min_lr, warmup, total;
} rt_schedule;

typedef struct rt_program {
    int abi_version; /* RT_ABI_VERSION */
    const char *model;
    int64_t space_bytes[RT_NSPACES];
    int nparams, nstates, ninputs, noutputs;
    const rt_tensor *params;  /* trainable, initialised by rt_init_params */
    const rt_tensor *states;  /* optimizer state etc., zero at start */
    const rt_tensor *inputs;  /* written by the trainer before each step ("tokens", "targets") */
    const rt_tensor *outputs; /* read after each step ("loss", "lr", "grad_norm", "grad:<p>") */
    int nstreams, nevents;
    int steps;    /* length of the compiled learning-rate schedule (schedule->total): the default --steps */
    /* FLOPs of one step, GEMMs and attention: model FLOPs (the forward and
     * backward once, what MFU counts; recomputed work not included) and
     * hardware FLOPs (what runs, recompute included; >= flops). */
    double flops, hw_flops;
    void (*step)(rt_ctx *ctx, char *const *spaces);
    int mesh[4];  /* pp, dp, cp, tp: the program runs on their product of ranks */
    int nbuckets;
    const rt_bucket *buckets;
    rt_schedule *schedule; /* the lr_cosine schedule (mutable; starts at the compiled values); NULL without one */
    /* How the sequence is split over the cp ranks (mesh[2] > 1), as the
     * program's rank-dependent iotas say: 0 dual (the sequence in 2*cp equal
     * chunks, cp coordinate c holds chunks c and 2cp-1-c, in that order), 1
     * contiguous (c holds piece c of cp).  0 without cp.  The trainer hands
     * each rank its tokens accordingly. */
    int cp_contiguous;
    /* The device the program was compiled for (RT_DEV_*); a runtime refuses
     * a program for another device in one line.  The rest is CUDA's (zero
     * or NULL on the CPU): */
    int device;
    const char *arch;            /* "sm_90" */
    int ncubins;                 /* the modules to load: the library kernels' */
    const rt_cubin *cubins;      /*   and the generated kernels' ("generated") */
    int nkernels;                /* the generated kernels' names, in a module of */
    const char *const *kernels;  /*   cubins[]; rtk_fused's args[0] indexes them */
    int64_t scratch_bytes;       /* the most scratch one library launch needs
                                  * (kernels/cuda/README.md); the runtime gives
                                  * every stream its own buffer of this size */
    const char *sets;            /* kiln compile's --set overrides, "k=v" lines, or NULL:
                                  * checkpoint metadata "sets" (kiln sample) */
    /* Pipeline stages (mesh[0] = pp).  A program with pp > 1 is one table
     * per stage: stages[s] is the step program of every world rank whose
     * pp coordinate is s, each with its own spaces, tensors, streams,
     * events, buckets and schedule (it holds only the params and inputs it
     * reads).  Every stage's table has the same nstages and stages; the
     * object's one external symbol kiln_program is stages[0], so a trainer
     * picks stages[pp coordinate] (trainer.c).  Without pipeline stages:
     * stage 0, nstages 1, stages[0] = the program itself. */
    int stage, nstages;
    const struct rt_program *const *stages;
} rt_program;

/* ---- the runtime (runtime/dev_cpu.c) ---- */
typedef struct {
    int threads;            /* pool size; 0 = the number of cores */
    int serial;             /* 1: every stream and kernel on the calling thread (debugging) */
    const char *trace_path; /* non-NULL: write a Chrome trace JSON at rt_free */
} rt_options;

rt_ctx *rt_new(const rt_program *p, const rt_options *o); /* NULL + message on stderr on failure */
void rt_free(rt_ctx *ctx);
/* Host views.  rt_space and rt_tensor_ptr return host memory that the
 * trainer reads and writes between steps (never during one).  On the CPU it
 * is the program's memory itself.  On a GPU it is a host mirror of the
 * device's memory: rt_pull copies a range device -> mirror, rt_push mirror
 * -> device, synchronously (the streams idle).  On the CPU both return 0
 * and do nothing.  A caller that reads a tensor pulls it first and one
 * that writes it pushes it after; the _tensor forms do nothing for a
 * tensor without storage (space -1).  0, or -1 with a one-line message in
 * err. */
char *rt_space(rt_ctx *ctx, int space);      /* host view of a space */
void *rt_tensor_ptr(rt_ctx *ctx, const rt_tensor *t);
int rt_pull(rt_ctx *ctx, int space, int64_t offset, int64_t bytes, char *err, int errlen);
int rt_push(rt_ctx *ctx, int space, int64_t offset, int64_t bytes, char *err, int errlen);
int rt_pull_tensor(rt_ctx *ctx, const rt_tensor *t, char *err, int errlen);
int rt_push_tensor(rt_ctx *ctx, const rt_tensor *t, char *err, int errlen);
/* Params from their init (normal: the interpreter's generator, seeded by
 * hash(name) ^ seed, so both start from bit-identical weights); states zero. */
void rt_init_params(rt_ctx *ctx, uint64_t seed);
/* Run one step: p->step, then wait until every stream is idle.  0, or -1
 * when a kernel reported an error (rt_fail), with the message in err. */
int rt_step(rt_ctx *ctx, char *err, int errlen);

/* The step function receives the device's bases of the spaces (device
 * pointers on a GPU), so generated code never dereferences them.
 * Called by the step function, in schedule order.  name: "kernel" or
 * "kernel@where" (the compiler writes "matmul@fwd L3 models/gpt.lua:41"),
 * for the trace. */
void rt_launch(rt_ctx *ctx, int stream, rt_kernel k, const int64_t *args, int nargs, const char *name);
void rt_record(rt_ctx *ctx, int stream, int event);
void rt_wait(rt_ctx *ctx, int stream, int event);

/* Called by kernels. */
void rt_parallel_for(rt_ctx *ctx, int64_t n, void (*fn)(void *data, int64_t i0, int64_t i1), void *data);
/* A kernel found bad data (a token id out of range): the step fails with msg. */
void rt_fail(rt_ctx *ctx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Same generator as the interpreter: normal(0, std) draws for `name`. */
void rt_normal_fill(float *dst, int64_t n, const char *name, uint64_t seed, double std);

/* ---- ranks and communication (runtime/comm_mpi.c: ranks and groups over
 * MPI; the collective kernels: coll_mpi.c on the CPU, comm_nccl.c on CUDA) ----
 * A program for one rank runs in a plain process.  A program whose mesh has
 * more ranks runs under `mpirun -np <world>`: rt_new initialises MPI (thread
 * level at least MPI_THREAD_SERIALIZED), checks the process count equals the
 * mesh's world (a one-line error otherwise) and splits one communicator per
 * group mask.  Collectives are kernels: they run on the thread of the stream
 * that launches them (the comm stream, 1; under --schedule lhs the tp
 * collectives on their own stream, 4), so they overlap the compute
 * stream's kernels; during a step only those streams call MPI, each on
 * its own communicators (two of them need MPI_THREAD_MULTIPLE).  Every MPI
 * return code is checked; a failure fails the step with MPI's message.  A
 * rank that dies makes the others fail (mpirun tears the job down). */
int rt_world_rank(rt_ctx *ctx);
int rt_world_size(rt_ctx *ctx);
int rt_group_rank(rt_ctx *ctx, int mask); /* this rank's index in its group (mesh order) */
int rt_group_size(rt_ctx *ctx, int mask);
/* Between steps, on the calling (main) thread, for the trainer: every rank of
 * the group passes `bytes` bytes; y receives size*bytes, group-rank order.
 * 0, or -1 with a message in err. */
int rt_host_allgather(rt_ctx *ctx, int mask, const void *x, void *y, int64_t bytes, char *err, int errlen);
int rt_host_barrier(rt_ctx *ctx, char *err, int errlen);
/* Bytes this rank has sent through the collective kernels since rt_new, in
 * the ring algorithm's terms (s ranks in the group, n the kernel's n):
 * allreduce 2(s-1)n*eb/s, reducescatter and allgather (s-1)n*eb with n the
 * per-rank chunk's element count (outer*n*inner in their args) and eb the
 * element's bytes (4 on the CPU; 2 for bf16 on CUDA). */
int64_t rt_comm_bytes(rt_ctx *ctx);
/* f32 collectives over group `mask` (group size 1: a copy).  i = this
 * rank's group index.  reducescatter and allgather work along the middle dim
 * of a row-major [outer, *, inner] view (outer 1: flat chunks):
 * dt (last arg of the three): the elements' dtype, RT_F32 (the CPU's only
 * one), RT_BF16 or RT_I32 (allgather of positions); sums are in the
 * dtype's own arithmetic on the GPU (NCCL), f32 on the CPU.
 * allreduce:     x [n] -> y [n], the sum over the group; y may be x.  args: x, y, n, mask, dt
 * reducescatter: x [outer, size*n, inner] -> y [outer, n, inner], the sum over
 *                the group of x[:, i*n:(i+1)*n, :].  args: x, y, outer, n, inner, mask, dt
 * allgather:     x [outer, n, inner] -> y [outer, size*n, inner], y[:, j*n:(j+1)*n, :]
 *                = x of group-rank j.  args: x, y, outer, n, inner, mask, dt
 *                It moves bits, so any 4-byte type (i32 positions) works too.
 * In place, without a copy (outer 1 only): reducescatter y == x (the result
 * in x's first n*inner), allgather x == y + i*n*inner (this rank's chunk
 * already in place); any other overlap of x and y goes through a
 * temporary.  outer > 1 always packs through a temporary, so x and y may
 * overlap in any way (on CUDA the temporary is the stream's scratch, which
 * the compiler sizes for it). */
void rtk_allreduce(rt_ctx *ctx, const int64_t *a);
void rtk_reducescatter(rt_ctx *ctx, const int64_t *a);
void rtk_allgather(rt_ctx *ctx, const int64_t *a);
/* This rank's chunk of x (IR op `shard`): y[o,j,i] = x[o, r*len + j, i] for
 * o < outer, j < len, i < inner (elements of elem_bytes), r = group index.
 * args: x, y, outer, len, inner, elem_bytes, mask */
void rtk_shard(rt_ctx *ctx, const int64_t *a);
/* Point to point over group `mask` (IR send/recv; ring attention), peer
 * relative in the group: the other side is group-rank (i + peer) mod size.
 * send copies x's bytes into a staging buffer and posts it without
 * blocking (on the CPU x may be reused as soon as it returns; on CUDA the
 * send is issued with its recv, so x must keep its value until the recv
 * with its tag, which memplan ensures); the send completes in
 * a later send/recv or at the end of the step (rt_step waits for it).
 * recv blocks until the matching send (same group and tag, posted by the
 * peer) has arrived in y.  A send to this rank itself waits in the staging
 * list for its recv.  rt_comm_bytes counts what send sends to other ranks.
 * args: send: x, bytes, mask, peer, tag;  recv: y, bytes, mask, peer, tag
 * (tag in 0..32767). */
void rtk_send(rt_ctx *ctx, const int64_t *a);
void rtk_recv(rt_ctx *ctx, const int64_t *a);
/* A receive in two halves (IR recv_start / recv_done, the pipeline's
 * transfers; the CPU device only: CUDA programs issue the pair as one
 * rtk_recv at the done, compiler/emit/emit_host.c says why).  recv_start
 * posts the receive into y and returns at once: y's bytes may change until
 * the matching recv_done (same y, bytes, mask, peer, tag; later on the same
 * stream), which blocks until they have all arrived.  args as rtk_recv. */
void rtk_recv_start(rt_ctx *ctx, const int64_t *a);
void rtk_recv_done(rt_ctx *ctx, const int64_t *a);

/* ---- library kernels (kernels/cpu/) and their args ----
 * Shapes are row-major; "rows" is the product of all leading dims. */

/* C[b] = op(A[b]) x op(B[b]) for b < batch; A [M,K] ([K,M] if ta), B [K,N]
 * ([N,K] if tb), C [M,N]; strides in elements between batch entries (0 =
 * the same matrix for every b).  beta: 0 overwrite, 1 accumulate.
 * dtA, dtB, dtC: RT_F32 or RT_BF16 (the CPU takes f32 only; CUDA: A and B
 * bf16, C bf16 or f32, f32 accumulation).
 * args: A, B, C, batch, M, N, K, ta, tb, strideA, strideB, strideC, beta(bits), dtA, dtB, dtC */
void rtk_gemm(rt_ctx *ctx, const int64_t *a);
/* rtk_gemm + bias[N] added to every row of C before its rounding (IR
 * matmul_bias; CUDA only: cuBLASLt's BIAS epilogue, the CPU runtime has
 * none and the compiler never emits it there).  bias has C's dtype.
 * args: rtk_gemm's 16, then bias */
void rtk_gemm_bias(rt_ctx *ctx, const int64_t *a);
/* rtk_gemm_bias, then C = gelu (tanh form) of that sum, the sum itself
 * (rounded to C's dtype) written to aux (IR matmul_bias_gelu; CUDA only:
 * cuBLASLt's GELU_AUX_BIAS epilogue).  args: rtk_gemm_bias's 17, then aux */
void rtk_gemm_bias_gelu(rt_ctx *ctx, const int64_t *a);
/* rtk_gemm (one batch, beta 0), then C = p * gelu'(aux) (tanh form) of the
 * unrounded product p, and db[N] = the sum of that over C's rows, both in
 * C's dtype (IR matmul_dgelu_bgrad; CUDA only: cuBLASLt's DGELU_BGRAD
 * epilogue, aux its input, the pre-activation rtk_gemm_bias_gelu saved).
 * args: rtk_gemm's 16, then aux (C's dtype and shape), db */
void rtk_gemm_dgelu_bgrad(rt_ctx *ctx, const int64_t *a);
/* rtk_gemm (one batch, beta 0), and db = the sum over K of B ([K,N], tb 0:
 * db[N], of_b 1) or of A ([K,M], ta 1: db[M], of_b 0), in C's dtype (IR
 * matmul_bgrad; CUDA only: cuBLASLt's BGRADA / BGRADB).
 * args: rtk_gemm's 16, then db, of_b */
void rtk_gemm_bgrad(rt_ctx *ctx, const int64_t *a);

/* args: x, w, b, y, rows, C, eps */
void rtk_layernorm(rt_ctx *ctx, const int64_t *a);
/* args: dy, x, w, dx, dw, db, rows, C, eps   (dw, db overwritten) */
void rtk_layernorm_bwd(rt_ctx *ctx, const int64_t *a);
/* args: x, w, y, rows, C, eps */
void rtk_rmsnorm(rt_ctx *ctx, const int64_t *a);
/* args: dy, x, w, dx, dw, rows, C, eps */
void rtk_rmsnorm_bwd(rt_ctx *ctx, const int64_t *a);
/* softmax over the last dim.  dt: the dtype of x and y (RT_F32/RT_BF16).  args: x, y, rows, C, dt */
void rtk_softmax(rt_ctx *ctx, const int64_t *a);
/* args: dy, y, dx, rows, C, dt */
void rtk_softmax_bwd(rt_ctx *ctx, const int64_t *a);
/* rotate-half RoPE on x [B,T,H,D] with pos i32[T].  args: x, pos, y, B, T, H, D, theta, sign (+1 fwd, -1 bwd) */
void rtk_rope(rt_ctx *ctx, const int64_t *a);
/* Inverted dropout (IR dropout, issue 17) on x [B,T,F] (F: the dims after
 * T): y = x/(1-p) where kept, else 0, kept iff runtime/rng.h's
 * rng_dropout_bits(rng_dropout_row(rng_dropout_key(seed, id, step), rows[b],
 * pos[t]), f) >= rng_dropout_threshold(p); step points to an f32 scalar (the
 * step counter), rows i32[B] and pos i32[T] are global sample and token
 * indices.  The backward is the same kernel on dy.
 * args: x, step, rows, pos, y, B, T, F, p(bits), seed, id */
void rtk_dropout(rt_ctx *ctx, const int64_t *a);
/* Flash-style tiled attention, q [B,H,T,D], k/v [B,KH,S,D], o [B,H,T,D],
 * lse f32 [B,H,T]; head h reads kv head h/(H/KH).  qpos i32[T], kpos
 * i32[S] (any order; context parallel): causal means key s visible to query
 * t iff kpos[s] <= qpos[t]; both 0 (NULL) mean positions 0..T-1 and
 * 0..S-1, i.e. s <= t (the fast path).  Without causal they are ignored.
 * window W > 0 (sliding window, with causal only): also qpos[t] - kpos[s]
 * < W; 0 for none.  A row that sees no key gets o = 0, lse = -inf.
 * args: q, k, v, o, lse, B, H, KH, T, S, D, causal, scale, qpos, kpos, window */
void rtk_attention(rt_ctx *ctx, const int64_t *a);
/* masked as rtk_attention.
 * args: do, q, k, v, o, lse, dq, dk, dv, B, H, KH, T, S, D, causal, scale, qpos, kpos, window
 * (dq, dk, dv overwritten) */
void rtk_attention_bwd(rt_ctx *ctx, const int64_t *a);
/* Merge two attention parts over disjoint key sets (IR attn_merge; ring
 * attention), per row r < rows of D values, in f32:
 * lse = max + log1p(exp(min - max)) of lse_a[r], lse_b[r] (-inf if both
 * are), o = exp(lse_a - lse) o_a + exp(lse_b - lse) o_b, a part whose lse is
 * -inf weighing 0 (both -inf: o = 0, never NaN).  o may be o_a or o_b and
 * lse may be lse_a or lse_b (exactly, not a partial overlap).
 * dt: the dtype of o_a, o_b and o (lse is f32).
 * args: o_a, lse_a, o_b, lse_b, o, lse, rows, D, dt */
void rtk_attn_merge(rt_ctx *ctx, const int64_t *a);
/* out[i,:] = table[ids[i],:].  args: table, ids, out, n, C, V (an id outside [0,V) fails the step) */
void rtk_embedding(rt_ctx *ctx, const int64_t *a);
/* dtable = scatter-add of dy rows (overwritten).  args: dy, ids, dtable, n, C, V */
void rtk_embedding_bwd(rt_ctx *ctx, const int64_t *a);
/* loss[i] = logsumexp(logits[i,:]) - logits[i, t[i]].  args: logits, targets, loss, rows, V */
void rtk_cross_entropy(rt_ctx *ctx, const int64_t *a);
/* dlogits = dl[i] * (softmax - onehot).  args: dl, logits, targets, dlogits, rows, V */
void rtk_cross_entropy_bwd(rt_ctx *ctx, const int64_t *a);
/* The two in one pass (IR cross_entropy_fused; CUDA only: the CPU runtime
 * has none and the compiler never emits it for the CPU): loss[i] as
 * rtk_cross_entropy, dlogits as rtk_cross_entropy_bwd; dlogits may be
 * logits.  args: dl, logits, targets, dlogits, loss, rows, V */
void rtk_cross_entropy_fused(rt_ctx *ctx, const int64_t *a);
/* torch AdamW on g*scale[0]; lr, scale, t point to f32 scalars.
 * args: p, g, m, v, lr, scale, t, p_out, m_out, v_out, n, b1, b2, eps, wd (may alias p_out=p etc.) */
void rtk_adamw(rt_ctx *ctx, const int64_t *a);
/* out = lr_cosine(t) (ops.def) with the values *schedule holds when the
 * kernel runs.  args: t, out, schedule (an rt_schedule pointer) */
void rtk_lr_cosine(rt_ctx *ctx, const int64_t *a);
/* args: norm, out, max  (ops.def clipscale) */
void rtk_clipscale(rt_ctx *ctx, const int64_t *a);
/* Reduce x viewed as [outer, n, inner] over n.  kind 0 sum, 1 mean, 2 max.
 * dtx, dty: RT_F32 or RT_BF16, the math f32.
 * args: x, y, outer, n, inner, kind, dtx, dty */
void rtk_reduce(rt_ctx *ctx, const int64_t *a);
/* dx = dy routed to the first argmax.  dt: the dtype of all four.  args: dy, x, y, dx, outer, n, inner, dt */
void rtk_max_bwd(rt_ctx *ctx, const int64_t *a);
/* out[0] = sum of squares of x (f32 scalar).  dtx: x's dtype.  args: x, out, n, dtx */
void rtk_sumsq(rt_ctx *ctx, const int64_t *a);
/* Strided copy: for every index (i0..i4) < (d0..d4),
 * dst[sum i_k*ds_k] = src[sum i_k*ss_k] (element strides; a 0 source
 * stride broadcasts).  Serves transpose, slice, broadcast and each part of a
 * concat.  args: src, dst, elem_bytes, rank, d0..d4, ss0..ss4, ds0..ds4 */
void rtk_copy(rt_ctx *ctx, const int64_t *a);
/* sumto: y (shape of x with broadcast dims summed away) = sum of x over the
 * dims where ystride is 0.  dtx, dty: RT_F32 or RT_BF16 (a bias's gradient:
 * bf16 x, f32 y).  args: x, y, rank, d0..d4 (x dims), ys0..ys4 (y strides, 0 = summed), dtx, dty */
void rtk_sumto(rt_ctx *ctx, const int64_t *a);
/* args: dst, n, value(bits), dtype   (f32, bf16 or i32 fill) */
void rtk_fill(rt_ctx *ctx, const int64_t *a);
/* i32 0..n-1.  args: dst, n */
void rtk_iota(rt_ctx *ctx, const int64_t *a);
/* i32 global token indices of a rank's part of a sequence split over
 * group `mask` (IR iota {group, layout, from, all}; size s; coll_mpi.c / comm_nccl.c)
 * for group rank i = (this rank's index - from) mod s:
 * dual 0 (contiguous): dst[k] = i*n + k;
 * dual 1: n even, c = n/2, dst[k] = i*c + k and dst[c+k] = (2s-1-i)*c + k
 * for k < c.  all 1: n = s*p, and dst[j*p ..] is rank j's piece of p for
 * every j (the all-gathered keys' positions).  args: dst, n, mask, dual, from, all */
void rtk_iota_rank(rt_ctx *ctx, const int64_t *a);
/* args: dst, src, bytes */
void rtk_memcpy(rt_ctx *ctx, const int64_t *a);

/* CUDA only (attn_cudnn.c, `kiln compile --attention cudnn`): rtk_attention
 * and rtk_attention_bwd on cuDNN's SDPA graphs, with their args; the
 * compiler uses them only for attention that qualifies (docs/cudnn.md). */
void rtk_attention_cudnn(rt_ctx *ctx, const int64_t *a);
void rtk_attention_bwd_cudnn(rt_ctx *ctx, const int64_t *a);
/* CUDA only (kernels_cuda.c, `kiln compile --attention tc`): rtk_attention
 * and rtk_attention_bwd on the tensor cores (kernels/cuda/attention_tc.cu),
 * with their args; the compiler uses them only for D 16, 32, 64 or 128. */
void rtk_attention_tc(rt_ctx *ctx, const int64_t *a);
void rtk_attention_bwd_tc(rt_ctx *ctx, const int64_t *a);

/* CUDA only (kernels_cuda.c): launch the generated kernel
 * program->kernels[a[0]] over a[2] elements; its parameters are the a[1]
 * pointers a[3 .. 3+a[1]) then the element count (emit_cuda.c: inputs,
 * outputs, long long n), grid-stride, so any grid covers them.
 * args: kernel, nptrs, n, ptr... */
void rtk_fused(rt_ctx *ctx, const int64_t *a);

/* ---- activation offload (issue 19; dev_cpu.c, dev_cuda.c) ----
 * Copies between the device's act space and the host space, launched on
 * the copy streams (2: d2h, 3: h2d) like any kernel; the schedule's
 * events order them.  CPU: a memcpy on the stream's worker thread.  CUDA:
 * cuMemcpyDtoHAsync / cuMemcpyHtoDAsync on the stream's CUDA stream.
 * args: dst, src, bytes */
void rtk_offload(rt_ctx *ctx, const int64_t *a); /* device -> host */
void rtk_reload(rt_ctx *ctx, const int64_t *a);  /* host -> device */
/* The device act space's high-water mark: the highest byte offset + 1 that
 * any step of this context has written in the act space, measured by the
 * runtime (not read from the program), or -1 when not measured.  It is
 * measured when the environment has KILN_MEASURE_PEAK=1 at rt_new: the
 * act space starts filled with 0xff bytes (an f32 NaN, so a read of a
 * byte no one wrote shows in the loss) and after each step the runtime
 * finds the highest byte that is no longer 0xff (docs/offload.md). */
int64_t rt_act_high_water(rt_ctx *ctx);

#endif
