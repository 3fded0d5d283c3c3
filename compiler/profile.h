/* profile.h — device profiles: what one device and its links can do, read
 * from a text file, and the few formulas that turn them into seconds.
 *
 * A profile is the cost model's (issue 21) and the offload pass's (issue 19)
 * only knowledge of the hardware.  It is a library like options.c, not a
 * pass: any pass or command may call it.  The file format, the fields and
 * where each shipped number comes from: docs/profiles.md and the files in
 * profiles/.
 */
#ifndef KILN_PROFILE_H
#define KILN_PROFILE_H

#include <stddef.h>
#include <stdio.h>

#include "ir.h"

#define PROFILE_MAX_EFF 16 /* points of the GEMM efficiency table */

typedef struct {
    char name[64];
    char path[1024];        /* the file it was read from */
    double memory_bytes;    /* device memory */
    double peak_flops_f32;  /* dense FLOP/s */
    double peak_flops_bf16; /* dense FLOP/s (tensor cores on a GPU) */
    /* achieved fraction of peak by GEMM size M·N·K: neff points, sizes
     * strictly increasing, efficiencies in (0, 1] */
    int neff;
    double eff_size[PROFILE_MAX_EFF], eff[PROFILE_MAX_EFF];
    double attn_eff;        /* attention kernels' fraction of peak (cost.c) */
    double mem_bw;          /* device memory bandwidth, bytes/s */
    double launch_s;        /* per-kernel launch overhead, s */
    double h2d_bw, d2h_bw;  /* host <-> device copy bandwidth, bytes/s */
    double intra_alpha, intra_beta; /* link inside a node: latency s, bytes/s */
    double inter_alpha, inter_beta; /* link between nodes */
    int node_size;          /* devices per node */
    /* optional, per collective algorithm (CollKind order) on the intra-node
     * link: α s and β bytes/s fitted to that algorithm alone (kiln calibrate
     * under mpirun); beta 0 when absent: intra_alpha, intra_beta */
    double coll_alpha[4], coll_beta[4];
    /* optional, per collective algorithm on the intra-node link: measured
     * seconds by the full buffer's bytes (allreduce_table ...: BYTES:SECONDS
     * pairs, sizes increasing), which replace α + β·bytes there: an MPI
     * library switches algorithms with the size (Open MPI's reduce-scatter
     * drops from ~2 GB/s to ~0.4 at 4 MiB on this host), so no one line
     * fits; ncoll[k] 0 when absent */
    int ncoll[6]; /* PROFILE_NCOLL, CollKind order (the last two: tables only) */
    double coll_size[6][PROFILE_MAX_EFF], coll_t[6][PROFILE_MAX_EFF];
    /* optional: memory bandwidth by the bytes a kernel moves (the caches:
     * a small kernel's bytes never leave them), nbw points, sizes strictly
     * increasing; 0 points: mem_bw at every size */
    int nbw;
    double bw_size[PROFILE_MAX_EFF], bw[PROFILE_MAX_EFF];
    /* optional: processor sharing (cost.c).  cores: the node's cores, which
     * its ranks' threads share; threads: the cores one rank may run on (its
     * affinity) and the compute threads it runs there, the rates above
     * being that rank's alone (default: cores).  0 cores: not applicable
     * (a GPU: one device a rank, nothing shared); thread_speedup: a compute
     * kernel's speed on `threads` threads over its speed on one, in [1,
     * threads] (default threads): the cores a computing rank keeps busy */
    int cores, threads;
    double thread_speedup;
    /* optional: host memory per device, bytes (what offload's host space
     * may use: a node's memory over its devices); 0 when absent: unchecked */
    double host_memory_bytes;
    /* optional: per kernel kind, the CPU runtime's kernels measured one by
     * one (kiln calibrate; GPU profiles have none, so they price by the
     * roofline alone).  attn_bwd_eff: the backward's fraction of peak (0:
     * attn_eff, which is then the forward's); attn_score_s,
     * attn_bwd_score_s: seconds per attention score (query·key pair
     * computed) beyond its FLOPs — the softmax's exp, max and scaling,
     * which do not grow with the head dim, so small heads run far below
     * the FLOP rate; kind_bw[k]: bytes a second of the kernels of kind k
     * (ProfileKind), 0 when absent: profile_mem_bw's rate */
    double attn_bwd_eff, attn_score_s, attn_bwd_score_s;
    /* optional: seconds per query row (B·H·T) beyond its scores, forward
     * and backward — the causal diagonal block and each row's softmax
     * passes, which a short sequence pays for fewer scores (0 when absent) */
    double attn_row_s, attn_bwd_row_s;
    double ew_transc_s;     /* optional: an elementwise transcendental's cost an element (GELU, tanh, exp, SiLU, sigmoid, log, pow), 0 when absent */
    double pool_wake_s;     /* optional: a parallel non-GEMM kernel's cost to wake the runtime's pool after a GEMM, 0 when absent */
    double step_overhead_s; /* optional: the runtime's fixed cost a step (waking its streams, the final wait), 0 when absent */
    double kind_bw[8];
    /* optional: strided copies' (PK_COPY) bytes a second by the bytes of
     * their contiguous runs, ncopy points (a head permute's 64-byte runs
     * move at a tenth of a slice's long ones); 0 points: kind_bw[PK_COPY] */
    int ncopy;
    double copy_run[PROFILE_MAX_EFF], copy_bw[PROFILE_MAX_EFF];
} Profile;

/* The kinds of non-GEMM kernels a profile may rate apart (kind_bw):
 * layernorm/rmsnorm/softmax forward, their backward, cross-entropy
 * forward, its backward, the strided copies (transpose, slice, concat,
 * broadcast: bytes at copy_bw_table's rate for their runs), sumto (a
 * bias's gradient), the AdamW update, the sum of squares (the global
 * norm). */

typedef enum { PK_NORM, PK_NORM_BWD, PK_XENT, PK_XENT_BWD, PK_COPY, PK_SUMTO, PK_ADAMW, PK_SUMSQ, PK_NKIND } ProfileKind;
extern const char *const profile_kind_fields[PK_NKIND]; /* "norm_bw", ... */

/* Load a profile.  path_or_name is a path when it holds a '/' or ends in
 * ".profile"; otherwise a shipped profile's name (cpu, h100-sxm, h200-sxm,
 * a100-80g, and the short names h100, h200, a100), looked up as
 * NAME.profile in, in order: $KILN_PROFILES, <kiln binary's dir>/../profiles
 * (build/kiln of any clone), <binary's dir>/../../profiles (build/tests/),
 * ./profiles.  Every field is required, once.  0, or -1 with one line in
 * err: "FILE:LINE: ..." for an unknown, duplicate, negative or non-numeric
 * field, "FILE: missing field X" for a missing one. */
int profile_load(Profile *p, const char *path_or_name, char *err, size_t errlen);
/* kiln calibrate's first step: FILE's temporary name in tmp (PATH.tmpPID),
 * opened for writing, and when (UTC) and host for its header; NULL with
 * one line in err.  profile_commit is the last. */
FILE *profile_create(const char *path, char *tmp, size_t tmplen, char when[64], char host[256], char *err, size_t errlen);
/* kiln calibrate's last step: the profile written to tmp must read back
 * (profile_load), then tmp is renamed to path; else tmp is removed.  0, or
 * -1 with one line in err. */
int profile_commit(const char *tmp, const char *path, char *err, size_t errlen);

/* One line: name, memory, peaks, memory and copy bandwidth, links. */
void profile_describe(FILE *f, const Profile *p);

/* The GEMM efficiency at size M·N·K: linear in log(size) between the
 * table's points, the end points' values outside them. */
double profile_gemm_eff(const Profile *p, double mnk);

/* Seconds of an [M,K]x[K,N] GEMM in dtype (bf16, else f32's peak):
 * 2·M·N·K / (peak · eff(M·N·K)) + launch overhead. */
double profile_gemm_seconds(const Profile *p, DType dt, double m, double n, double k);

/* A strided copy's bytes a second for contiguous runs of run_bytes:
 * copy_bw_table's, linear in log(run_bytes) between its points, the end
 * points' outside them; copy_bw without a table, 0 without either. */
double profile_copy_bw(const Profile *p, double run_bytes);

/* The memory bandwidth a kernel moving `bytes` sees: mem_bw_table's,
 * linear in log(bytes) between its points, the end points' outside them;
 * mem_bw without a table. */
double profile_mem_bw(const Profile *p, double bytes);

/* Seconds to copy bytes to the host (d2h != 0) or back: bytes / bandwidth. */
double profile_copy_seconds(const Profile *p, double bytes, int d2h);

/* COLL_P2P_RUNTIME, COLL_P2P_POSTED: the CPU runtime's own point-to-point
 * exchange (kiln calibrate's p2p_runtime_table, p2p_posted_table: a table
 * only, no α or β): a send and its receive as a step runs them — the
 * compute stream's record waking the comm stream's thread, rtk_send's
 * staging copy and MPI_Isend, the receive (rtk_recv's blocking MPI_Recv;
 * the posted one's MPI_Irecv and sleeping test), the record waking the
 * compute stream — from the record to the compute stream's release. */
typedef enum { COLL_ALL_REDUCE, COLL_ALL_GATHER, COLL_REDUCE_SCATTER, COLL_P2P, COLL_P2P_RUNTIME, COLL_P2P_POSTED } CollKind;
#define PROFILE_NCOLL 6

/* Seconds of a collective over ranks ranks on the intra-node (intra != 0)
 * or inter-node link (α latency, β bytes/s), bytes the full buffer (the
 * gathered output, the scattered input, the message), ring algorithms:
 *   all-reduce          2(n−1)·α + 2(n−1)/n · bytes/β
 *   all-gather, r-scat   (n−1)·α +  (n−1)/n · bytes/β
 *   p2p                        α +           bytes/β
 * 0 for one rank (nothing moves; p2p too).  On the intra-node link an
 * algorithm's own α, β (the optional fields allreduce_alpha_s, _beta,
 * allgather_*, reducescatter_*, p2p_*) replace intra's when the profile
 * has them, and its measured table (allreduce_table, ...) replaces both
 * when it has one: the time at bytes, interpolated linearly in
 * log(bytes)-log(time) between the points, the first point's below them,
 * bytes in proportion above the last; measured over node_size ranks (kiln
 * calibrate's), so a group of n ranks scales it by the ring's factor,
 * (n−1)/n over (node_size−1)/node_size (p2p: 1). */
double profile_coll_seconds(const Profile *p, CollKind kind, double bytes, int ranks, int intra);

/* ---- the offload pass's `auto` policy (issue 19) ---- */

/* The largest α in [0, 1] with
 *     (α·saved/d2h_bw + α·saved/h2d_bw) / 2 <= hide_seconds,
 * PipeOffload's (arXiv 2503.01328) condition for a free offload: the mean of
 * the two copies fits in the compute between the forward and the backward
 * it hides behind.  1 when saved_bytes <= 0 (nothing to copy); 0 when
 * hide_seconds <= 0 or an argument is not a number. */
double offload_auto_fraction(const Profile *p, double saved_bytes, double hide_seconds);

#endif
