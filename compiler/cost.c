/* cost.c — the cost model: predicted seconds for every node of the planned
 * per-rank programs, and the step they make together (issue 21).
 *
 * kiln's step is one static program per pipeline rank: known ops, shapes,
 * streams and events, nothing decided at run time.  So the model does not
 * guess a schedule; it runs the one the compiler planned, on a clock.
 *
 * Node times (cost_node_seconds).  A roofline from the device profile
 * (profile.h): GEMMs and attention by their FLOPs (ir_node_flops) at the
 * peak of their dtype times an efficiency — the profile's GEMM table at the
 * GEMM's M·N·K, its attn_eff for attention; the inputs' dtype picks the
 * peak — and everything else by the
 * bytes it reads and writes at the memory bandwidth (the profile's
 * mem_bw_table at that many bytes when it has one: a small kernel's bytes
 * stay in the caches); every kernel pays the
 * launch overhead once (a fused group once for all its members).
 * Collectives are the ring algorithms' α + β·bytes (profile_coll_seconds),
 * on the intra-node link when the group's ranks share a node of node_size
 * ranks, else the inter-node one.  Host copies are bytes over the copy
 * bandwidth.  record and wait cost nothing themselves.
 *
 * Kernels by kind (a profile from kiln calibrate; GPU profiles have none
 * of these fields and keep the roofline above, bit for bit).  On the CPU
 * one bandwidth for every non-GEMM kernel was off by 2-5x per kind, in
 * both directions (bench/RESULTS.md, session 7: a 1-rank trace beside
 * KILN_COST_NODES): layernorm runs at a quarter of a transpose's rate,
 * cross-entropy's exp at a tenth, and attention on heads of 16 at a
 * quarter of its rate on heads of 64, its softmax costing per score what
 * the FLOPs do not count.  So such a profile prices each kind by its own
 * measured kernel: attention by FLOPs at attn_eff / attn_bwd_eff plus
 * attn_score_s / attn_bwd_score_s a score (query·key pair); layernorm,
 * rmsnorm, softmax and their backward, cross-entropy and its backward,
 * sumto, adamw and sumsq by bytes at their kind_bw; the strided copies
 * (transpose, slice, concat, broadcast) by bytes at copy_bw_table's rate
 * for the bytes of their contiguous runs (copy_runs), a slice counting
 * only the part it reads, a concat one launch a part, an embedding the
 * rows it gathers; a collective by its measured time table when the
 * profile has one (Open MPI changes algorithm with the size: no single
 * α + β fits 128 bytes to 16 MiB); a send by the runtime's own exchange
 * (p2p_runtime_table: ring attention's send and blocking recv;
 * p2p_posted_table: the pipeline's send and posted receive), which
 * kiln calibrate times through the streams, record to release: a quiet
 * trace of the small model's cp 2 ring (bench/RESULTS.md, session 11) put
 * 50-73 us between the compute stream's record and its release for a K, V
 * exchange of 2 x 64 KiB where MPI_Sendrecv's table says 2 x 11 — the comm
 * thread's wake-up, rtk_send's staging copy, the receive's rendezvous and
 * copy, the compute thread's wake-up, none of them in MPI's own time.  The rest (fused elementwise groups,
 * reductions) keeps mem_bw_table (a calibrated one: a generated
 * elementwise loop's rate), plus ew_transc_s an element for each
 * transcendental op (GELU, tanh, exp, SiLU, sigmoid, log, pow): a GELU
 * group is compute-bound on the CPU (its tanh), a residual add is not.
 * And every non-GEMM kernel over 16 Ki elements (a fused group once) pays
 * pool_wake_s: after a GEMM the pool's worker sleeps and OpenBLAS's
 * threads hold the cores, so a small parallel add took 18 µs in a step
 * where it takes 5 back to back (kiln calibrate times the pair).  A
 * calibrated profile's step_overhead_s (an rt_step of one tiny kernel
 * less a launch: waking the streams and waiting for them) is added once to
 * every rank's step, as compute: a quiet 1-rank trace put the step 0.2-0.3
 * ms beyond its kernels' span.
 *
 * The simulation (cost_simulate).  Every stage's program is replayed with
 * one clock per stream (compute, comm, d2h, h2d), each stream running its
 * nodes in program order, as the runtimes do.  dp, cp (and tp) ranks run
 * the same program, so one program per pipeline rank stands for all of its
 * replicas; the pipeline ranks are simulated together:
 *   - a wait holds its stream until the event's record has run;
 *   - a collective within a stage (dp, cp) starts when its stream reaches
 *     it (its replicas are there at the same time) and lasts its α + β;
 *   - a collective over pp (the loss, the global norm) is matched by order
 *     (the k-th one of that group on every stage, as MPI and NCCL match
 *     them) and ends at the latest participant's arrival plus its α + β:
 *     the straggler sets the time;
 *   - a send occupies its stream for the transfer (ppsched's model: a send
 *     does not wait for its receiver); a recv ends when its matching send
 *     has ended (pp: the send of the same tag from that stage to this one; cp's ring:
 *     the send ir_p2p_peer pairs it with).
 * The replay sweeps stages and streams, running each stream as far as its
 * next blocked node, until every node has run; a sweep that moves nothing
 * is a deadlock, reported with the node each stream is stuck at.
 *
 * Processor sharing.  On a CPU host kiln's ranks are processes sharing
 * the node's cores, and a node's time is not fixed: while three of four
 * ranks sit in a pipeline bubble the fourth gets the cores to itself.  A
 * profile with `cores` (kiln calibrate writes it; GPU profiles have none)
 * makes the replay event-driven: each node's profile time is its speed
 * alone, and when the activities running at once on a domain of shared
 * cores demand more cores than it has, each proceeds at cores/demand of
 * that speed — advance to the next completion, start what can start,
 * recompute the rates (the section below says what demands what).  Where
 * that can never happen the sweep runs, so GPU results are unchanged.
 *
 * The split (CostRank).  The compute stream's own work is compute.  Its
 * idle time happens inside waits (and inside comm nodes it runs itself,
 * world 1 or --no-overlap): a wait on a copy stream's event is exposed
 * copy time; a wait on the comm stream's is exposed communication, except
 * the part the comm node before that record spent blocked on another
 * pipeline rank, which is bubble.  Time after the compute stream's last
 * node goes to the stream that ended last, and time after this rank's
 * end until the slowest rank's to the bubble, so each rank's four numbers
 * add up to the step.
 *
 * MFU counts the GEMMs' and attention's FLOPs outside recompute (the
 * model's FLOPs, not the hardware's) against the peak of the GEMMs' dtype.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cost.h"
#include "live.h"
#include "memplan.h"
#include "passes.h"

/* ---- node times ---- */

static double value_bytes(const Graph *g, int v) { return (double)ir_value_bytes(&g->vals[v]); }

static double peak_of(const Profile *p, DType dt) { return dt == DT_BF16 || dt == DT_F16 ? p->peak_flops_bf16 : p->peak_flops_f32; }

/* 1 when every member of the group of node n (on stage s's first rank)
 * lives on one node of the profile's node_size ranks. */
static int group_intra(const Profile *p, const Graph *g, const Node *n) {
    const Module *m = g->m;
    int mask = ir_group_mask(ir_attr_s(n, "group", ""));
    if (mask <= 0) return 1;
    int world = ir_world(m), idx, *mem = xcalloc((size_t)world, sizeof(int));
    int r = n->stage * (world / (m->mesh[0] ? m->mesh[0] : 1));
    int k = ir_group_members(m, r < world ? r : 0, mask, mem, &idx), intra = 1;
    for (int i = 1; i < k; i++) intra &= mem[i] / p->node_size == mem[0] / p->node_size;
    free(mem);
    return intra;
}

static double comm_seconds(const Profile *p, const Graph *g, const Node *n) {
    int ranks = ir_group_size(g->m, n), intra = group_intra(p, g, n);
    switch (n->op) {
    case OP_allreduce: return profile_coll_seconds(p, COLL_ALL_REDUCE, value_bytes(g, n->in[0]), ranks, intra);
    case OP_allgather: return profile_coll_seconds(p, COLL_ALL_GATHER, value_bytes(g, n->out[0]), ranks, intra);
    case OP_reducescatter: return profile_coll_seconds(p, COLL_REDUCE_SCATTER, value_bytes(g, n->in[0]), ranks, intra);
    case OP_send: { /* a pp transfer's receive is posted (recv_start/done), ring attention's blocks (recv) */
        int mask = ir_group_mask(ir_attr_s(n, "group", "")), pp = g->m->nstages > 1 && mask > 0 && (mask & 1);
        return profile_coll_seconds(p, pp ? COLL_P2P_POSTED : COLL_P2P_RUNTIME, value_bytes(g, n->in[0]), ranks > 1 ? ranks : 2, intra);
    }
    default: return 0; /* recv: its sender's time */
    }
}

/* 1 when n's fused group began at an earlier node (it pays no launch). */
static int fused_tail(const Graph *g, const Node *n) {
    int64_t k = ir_fused_group(n);
    return k >= 0 && n > g->nodes && ir_fused_group(n - 1) == k;
}

/* Bytes a (possibly fused) elementwise node moves: inputs from outside its
 * group, and its outputs, but (root given: ir_live_build's) not the outputs
 * internal to its group, which never reach memory.  by_kind (a profile
 * that rates the CPU runtime's kernels one by one, kind_bw): a slice and
 * an embedding as rtk_copy and rtk_embedding move them, the part read and
 * written, the rows gathered (not the whole input or table), as the CUDA
 * launchers move them too (kiln calibrate --device cuda writes kinds);
 * without it the roofline's count stays (the shipped profiles). */
static double node_bytes(const Graph *g, const Node *n, const int *root, int by_kind) {
    int64_t grp = ir_fused_group(n);
    double b = 0;
    if (by_kind && grp < 0 && n->op == OP_slice) return 2 * value_bytes(g, n->out[0]); /* reads only its part */
    if (by_kind && grp < 0 && n->op == OP_embedding) /* the rows it gathers, not the table */
        return 2 * value_bytes(g, n->out[0]) + value_bytes(g, n->in[1]);
    for (int k = 0; k < n->nin; k++) {
        int d = g->vals[n->in[k]].def;
        if (grp >= 0 && d >= 0 && ir_fused_group(&g->nodes[d]) == grp) continue;
        b += value_bytes(g, n->in[k]);
    }
    for (int k = 0; k < n->nout; k++)
        if (!(root && grp >= 0 && root[n->out[k]] < 0)) b += value_bytes(g, n->out[k]);
    return b;
}

static double node_seconds(const Profile *p, const Graph *g, const Node *n, const int *root);

/* 1 for the elementwise ops built on a transcendental (ew_transc_s an element). */
static int transcendental(Op op) {
    switch (op) {
    case OP_exp: case OP_log: case OP_tanh: case OP_gelu: case OP_gelu_bwd: case OP_silu: case OP_silu_bwd: case OP_sigmoid: case OP_pow: return 1;
    default: return 0;
    }
}

/* 1 when the profile rates kernels by kind (kiln calibrate's CPU profiles). */
static int profile_by_kind(const Profile *p) {
    for (int k = 0; k < PK_NKIND; k++)
        if (p->kind_bw[k] > 0) return 1;
    return 0;
}

/* The profile's kernel kind of an unfused op (kind_bw), -1 for the rest. */
static int node_kind(Op op) {
    switch (op) {
    case OP_layernorm: case OP_rmsnorm: case OP_softmax: return PK_NORM;
    case OP_layernorm_bwd: case OP_rmsnorm_bwd: case OP_softmax_bwd: return PK_NORM_BWD;
    case OP_cross_entropy: return PK_XENT;
    case OP_cross_entropy_bwd: case OP_cross_entropy_fused: return PK_XENT_BWD;
    case OP_transpose: case OP_slice: case OP_concat: case OP_broadcast: return PK_COPY;
    case OP_sumto: return PK_SUMTO;
    case OP_adamw: return PK_ADAMW;
    case OP_sumsq: return PK_SUMSQ;
    default: return -1;
    }
}

/* Elements from dim d on of t (1 past its rank). */
static double inner(const Type *t, int d) {
    double x = 1;
    for (int i = d < 0 ? 0 : d; i < t->rank; i++) x *= (double)t->dim[i];
    return x;
}

/* The contiguous runs a strided copy (emit_host.c's rtk_copy) moves: a
 * transpose's runs are the dims after the later swapped one (one element
 * when it swaps the last); a slice's and each concat part's, its extent
 * along the dim times the dims after it; a broadcast's, its last dim. */
static double copy_runs(const Graph *g, const Node *n) {
    const Type *y = &g->vals[n->out[0]].t;
    double numel = inner(y, 0);
    switch (n->op) {
    case OP_transpose: {
        int a = (int)ir_attr_i(n, "a", 0), b = (int)ir_attr_i(n, "b", 0), hi = a > b ? a : b;
        return numel / inner(y, hi + 1);
    }
    case OP_slice: {
        int d = (int)ir_attr_i(n, "dim", 0);
        return numel / inner(y, d);
    }
    case OP_concat: {
        int d = (int)ir_attr_i(n, "dim", 0);
        double r = 0;
        for (int k = 0; k < n->nin; k++) r += inner(&g->vals[n->in[k]].t, 0) / inner(&g->vals[n->in[k]].t, d);
        return r;
    }
    default: return numel / (y->rank ? (double)y->dim[y->rank - 1] : 1);
    }
}

/* ---- context parallel's positioned attention (CPU kernels) ----
 *
 * With positions (cp: qpos, kpos the last two inputs) kernels/cpu/
 * attention.c has no causal band: each (tile of BQ query rows, block of
 * BK keys) is skipped when every key is later than every query, else its
 * key block is cut to the last key any row sees and computed whole (the
 * rows mask element by element).  The profile's attention rates come from
 * causal attention on the index band, about half the T·S pairs; a rank's
 * dual chunks shorter than a tile make every tile mixed and the kernel
 * computes all T·S (a quiet trace of the small model's cp 2, chunks of 16
 * rows: attention_bwd 160-183 us a call, the 1-rank model's call of the
 * same pairs computed 155-160, the model's half-pairs price 54.5;
 * bench/RESULTS.md, session 11).  pos_factor replays the kernel's tile
 * walk on cp rank 0's positions (the dual layout's chunks c and 2cp-1-c,
 * or contiguous pieces, as the program's cp iotas say): a ring step's keys
 * (S = T: each step's rank in turn, averaged, every step being one such
 * node) or the all-gathered keys (S = cp·T, in rank order), and returns
 * the pairs computed over the causal half.  1 when the shapes fit neither. */
enum { ATT_BQ = 64, ATT_BK = 128 }; /* kernels/cpu/attention.c's tiles */

/* The positions of cp rank r's T tokens (dual: chunks r and 2cp-1-r of T/2). */
static void cp_positions(int dual, int64_t cp, int64_t r, int64_t T, int32_t *pos) {
    int64_t L = T / 2;
    for (int64_t i = 0; i < T; i++)
        pos[i] = (int32_t)(dual ? (i < L ? r * L + i : (2 * cp - 1 - r) * L + (i - L)) : r * T + i);
}

/* Pairs the kernel computes for queries qpos[T] against keys kpos[S]. */
static double tile_pairs(const int32_t *qpos, int64_t T, const int32_t *kpos, int64_t S) {
    double pairs = 0;
    for (int64_t t0 = 0; t0 < T; t0 += ATT_BQ) {
        int64_t rows = T - t0 < ATT_BQ ? T - t0 : ATT_BQ;
        int32_t qmax = qpos[t0];
        for (int64_t r = t0; r < t0 + rows; r++) qmax = qpos[r] > qmax ? qpos[r] : qmax;
        for (int64_t s0 = 0; s0 < S; s0 += ATT_BK) {
            int64_t n = S - s0 < ATT_BK ? S - s0 : ATT_BK;
            while (n > 0 && kpos[s0 + n - 1] > qmax) n--;
            pairs += (double)rows * (double)n;
        }
    }
    return pairs;
}

static double pos_factor(const Graph *g, const Node *n, const Type *q, const Type *k) {
    int64_t cp = g->m->mesh[2], T = q->dim[2], S = k->dim[2];
    if (cp < 2 || !ir_attr_i(n, "causal", 0) || ir_attr_i(n, "window", 0) > 0 || T < 2 || T > 65536 || (S != T && S != cp * T)) return 1;
    int dual = 0;
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i].op == OP_iota && ir_group_mask(ir_attr_s(&g->nodes[i], "group", "")) == 4 /* cp */)
            dual |= strcmp(ir_attr_s(&g->nodes[i], "layout", "contiguous"), "dual") == 0;
    if (dual && T % 2) return 1;
    int32_t *qp = xcalloc((size_t)T, sizeof(int32_t)), *kp = xcalloc((size_t)(cp * T), sizeof(int32_t));
    cp_positions(dual, cp, 0, T, qp);
    double pairs = 0;
    if (S == T) { /* a ring step: rank 0 holds rank (0 - j) mod cp's keys at step j */
        for (int64_t j = 0; j < cp; j++) cp_positions(dual, cp, (cp - j) % cp, T, kp), pairs += tile_pairs(qp, T, kp, S) / (double)cp;
    } else { /* the gathered keys, in rank order */
        for (int64_t r = 0; r < cp; r++) cp_positions(dual, cp, r, T, kp + r * T);
        pairs = tile_pairs(qp, T, kp, S);
    }
    free(qp), free(kp);
    return pairs / (0.5 * (double)T * (double)S);
}

/* Attention: its FLOPs at the peak of q's dtype times attn_eff (the
 * backward's attn_bwd_eff when the profile has it), plus per score (a
 * query·key pair: FLOPs / 4D forward, / 10D backward) attn_score_s or
 * attn_bwd_score_s — the softmax's work, which the head dim does not
 * scale — and per query row (B·H·T) attn_row_s or attn_bwd_row_s: the
 * causal diagonal and the row's passes, which a short sequence pays for
 * fewer scores (all 0 in a GPU profile: the roofline alone). */
static double attention_seconds(const Profile *p, const Graph *g, const Node *n) {
    int bwd = n->op == OP_attention_bwd, positioned = n->nin == 3 + 3 * bwd + 2;
    const Type *q = &g->vals[n->in[bwd]].t;
    double f = ir_node_flops(g, n), eff = bwd && p->attn_bwd_eff > 0 ? p->attn_bwd_eff : p->attn_eff;
    if (positioned && profile_by_kind(p) && p->cores > 0) /* the CPU kernel's tiles (above): a CPU profile's (cores), not a GPU's */
        f *= pos_factor(g, n, q, &g->vals[n->in[bwd + 1]].t);
    double scores = f / ((bwd ? 10.0 : 4.0) * (double)q->dim[3]), rows = (double)ir_numel(q) / (double)q->dim[3];
    return f / (peak_of(p, q->dt) * eff) + scores * (bwd ? p->attn_bwd_score_s : p->attn_score_s) +
           rows * (bwd ? p->attn_bwd_row_s : p->attn_row_s);
}

/* 1 when memplan put assign n's value where its param or state lives (the
 * back ends then launch nothing: emit_host.c's launch_memcpy). */
static int assign_in_place(const Graph *g, const Node *n) {
    int old = ir_assign_target(g, (int)(n - g->nodes));
    const Value *a = &g->vals[n->in[0]];
    return old >= 0 && a->space >= 0 && a->space == g->vals[old].space && a->offset == g->vals[old].offset;
}

double cost_node_seconds(const Profile *p, const Graph *g, const Node *n) { return node_seconds(p, g, n, NULL); }

static double node_seconds(const Profile *p, const Graph *g, const Node *n, const int *root) {
    unsigned fl = ir_ops[n->op].flags;
    if (fl & F_COMM) return comm_seconds(p, g, n);
    if (fl & F_COPY) return profile_copy_seconds(p, value_bytes(g, n->in[0]), n->op == OP_offload);
    if (fl & (F_SYNC | F_VIEW)) return 0;
    if (ir_copy_in_place(g, n)) return 0; /* a slice or concat memplan made a view (live.c): nothing to copy */
    if (n->op == OP_output || ((fl & F_SOURCE) && n->op != OP_const && n->op != OP_iota)) return 0;
    if (n->op == OP_assign && assign_in_place(g, n)) return 0; /* the value was computed into its param's buffer: no copy */
    double launch = fused_tail(g, n) ? 0 : p->launch_s;
    if (fl & F_GEMM) { /* the inputs' dtype picks the units (bf16 in, f32 out: tensor cores) */
        double f = ir_node_flops(g, n);
        return f / (peak_of(p, g->vals[n->in[0]].t.dt) * profile_gemm_eff(p, f / 2)) + launch;
    }
    /* a parallel kernel (over 16 Ki elements: the generated loops' serial
     * limit) first wakes the runtime's pool: once a kernel, a fused group once */
    double wake = !fused_tail(g, n) && n->nout > 0 && ir_numel(&g->vals[n->out[0]].t) > 16384 ? p->pool_wake_s : 0;
    if (n->op == OP_attention || n->op == OP_attention_bwd) return attention_seconds(p, g, n) + wake + launch;
    int by_kind = profile_by_kind(p);
    double bytes = node_bytes(g, n, root, by_kind);
    int k = ir_fused_group(n) < 0 ? node_kind(n->op) : -1;
    if (by_kind && n->op == OP_concat) launch *= n->nin; /* one strided copy per part (emit_host.c) */
    double bw = k >= 0 ? p->kind_bw[k] : 0;
    if (k == PK_COPY && (p->ncopy || bw > 0)) /* by the bytes of its contiguous runs */
        bw = profile_copy_bw(p, value_bytes(g, n->out[0]) / fmax(1, copy_runs(g, n)));
    double transc = k < 0 && transcendental(n->op) ? p->ew_transc_s * (double)ir_numel(&g->vals[n->out[0]].t) : 0;
    return bytes / (bw > 0 ? bw : profile_mem_bw(p, bytes)) + transc + wake + launch;
}

/* ---- the replay ---- */

typedef struct {
    const Module *m;
    double *const *dur;
    CostSim *s;
    int **list, *nlist; /* [stage*NS + stream]: node indices in order */
    int *ptr;           /* [stage*NS + stream]: next in list */
    double *clock;      /* [stage*NS + stream] */
    double **rec;       /* [stage][event]: the record's time, -1 before */
    int **rec_node;     /* [stage][event]: the record node */
    int *nev;
    double **blocked;   /* [stage][node]: time spent waiting for another stage */
    char **done;        /* [stage][node]: it has run */
    /* pp sends: (from, to, tag) -> end, an open-addressing table */
    int64_t *pp_key;    /* -1: empty */
    double *pp_end;
    size_t pp_cap;
    /* collectives over pp: per (group name, k) the arrivals */
    const char **cgroup;
    int ncgroup;
    int **ccount;       /* [stage][group]: the next k */
    int **cnode_k;      /* [stage][node]: its k once arrived, -1 */
    double **carr;      /* [group][k*nstages + stage]: arrival, -1 */
    int *cap_k;         /* [group] */
} Sim;

enum { NS = IR_NSTREAMS };

/* The pp transfer (from, to, tag) as one key; the slot it has or gets. */
static size_t pp_slot(const Sim *S, int from, int to, int64_t tag) {
    int64_t key = (tag * 4096 + from) * 4096 + to;
    size_t h = (size_t)((uint64_t)key * 0x9E3779B97F4A7C15ull) & (S->pp_cap - 1);
    while (S->pp_key[h] != -1 && S->pp_key[h] != key) h = (h + 1) & (S->pp_cap - 1);
    S->pp_key[h] = key;
    return h;
}

static int over_pp(const Module *m, const Node *n) {
    int mask = ir_group_mask(ir_attr_s(n, "group", ""));
    return m->nstages > 1 && mask > 0 && (mask & 1);
}

static int cgroup_id(Sim *S, const char *name) {
    for (int i = 0; i < S->ncgroup; i++)
        if (strcmp(S->cgroup[i], name) == 0) return i;
    return -1;
}

static void sim_init(Sim *S, const Module *m, double *const *dur, CostSim *s) {
    int P = m->nstages;
    memset(S, 0, sizeof *S);
    S->m = m, S->dur = dur, S->s = s;
    S->list = xcalloc((size_t)P * NS, sizeof(int *));
    S->nlist = xcalloc((size_t)P * NS, sizeof(int));
    S->ptr = xcalloc((size_t)P * NS, sizeof(int));
    S->clock = xcalloc((size_t)P * NS, sizeof(double));
    S->rec = xcalloc((size_t)P, sizeof(double *));
    S->rec_node = xcalloc((size_t)P, sizeof(int *));
    S->nev = xcalloc((size_t)P, sizeof(int));
    S->blocked = xcalloc((size_t)P, sizeof(double *));
    S->done = xcalloc((size_t)P, sizeof(char *));
    S->ccount = xcalloc((size_t)P, sizeof(int *));
    S->cnode_k = xcalloc((size_t)P, sizeof(int *));
    S->cgroup = xcalloc(16, sizeof(char *));
    size_t npp = 0;
    for (int st = 0; st < P; st++) {
        const Graph *g = m->stages[st];
        for (int i = 0; i < g->nnodes; i++) {
            const Node *n = &g->nodes[i];
            int k = n->stream >= 0 && n->stream < NS ? n->stream : 0;
            S->nlist[st * NS + k]++;
            if (n->op == OP_record || n->op == OP_wait) {
                int e = (int)ir_attr_i(n, "event", 0);
                if (e + 1 > S->nev[st]) S->nev[st] = e + 1;
            }
            int p2p = n->op == OP_send || n->op == OP_recv || n->op == OP_recv_start || n->op == OP_recv_done; /* a posted receive: start, done */
            if (n->op == OP_send && over_pp(m, n)) npp++;
            if ((ir_ops[n->op].flags & F_COMM) && !p2p && over_pp(m, n) && S->ncgroup < 16 &&
                cgroup_id(S, ir_attr_s(n, "group", "")) < 0)
                S->cgroup[S->ncgroup++] = ir_attr_s(n, "group", "");
        }
        for (int k = 0; k < NS; k++) S->list[st * NS + k] = xcalloc((size_t)S->nlist[st * NS + k] + 1, sizeof(int));
        memset(S->nlist + st * NS, 0, NS * sizeof(int));
        for (int i = 0; i < g->nnodes; i++) {
            int k = g->nodes[i].stream >= 0 && g->nodes[i].stream < NS ? g->nodes[i].stream : 0;
            S->list[st * NS + k][S->nlist[st * NS + k]++] = i;
        }
        S->rec[st] = xcalloc((size_t)S->nev[st] + 1, sizeof(double));
        S->rec_node[st] = xcalloc((size_t)S->nev[st] + 1, sizeof(int));
        for (int e = 0; e < S->nev[st]; e++) S->rec[st][e] = -1, S->rec_node[st][e] = -1;
        S->blocked[st] = xcalloc((size_t)g->nnodes + 1, sizeof(double));
        S->done[st] = xcalloc((size_t)g->nnodes + 1, 1);
        S->cnode_k[st] = xcalloc((size_t)g->nnodes + 1, sizeof(int));
        for (int i = 0; i < g->nnodes; i++) S->cnode_k[st][i] = -1;
    }
    for (int st = 0; st < P; st++) S->ccount[st] = xcalloc(16, sizeof(int));
    for (S->pp_cap = 16; S->pp_cap < 2 * npp + 2; S->pp_cap *= 2) {}
    S->pp_key = xcalloc(S->pp_cap, sizeof(int64_t));
    S->pp_end = xcalloc(S->pp_cap, sizeof(double));
    for (size_t i = 0; i < S->pp_cap; i++) S->pp_key[i] = -1, S->pp_end[i] = -1;
    S->carr = xcalloc(16, sizeof(double *));
    S->cap_k = xcalloc(16, sizeof(int));
}

static void sim_free(Sim *S) {
    int P = S->m->nstages;
    for (int i = 0; i < P * NS; i++) free(S->list[i]);
    for (int st = 0; st < P; st++) free(S->rec[st]), free(S->rec_node[st]), free(S->blocked[st]), free(S->done[st]), free(S->ccount[st]), free(S->cnode_k[st]);
    for (int gI = 0; gI < 16; gI++) free(S->carr[gI]);
    free(S->list), free(S->nlist), free(S->ptr), free(S->clock), free(S->rec), free(S->rec_node), free(S->nev), free(S->blocked), free(S->done);
    free(S->ccount), free(S->cnode_k), free(S->cgroup), free(S->pp_key), free(S->pp_end), free(S->carr), free(S->cap_k);
}

/* The arrival slot of collective k of group gi (grown as needed). */
static double *arrival(Sim *S, int gi, int k) {
    int P = S->m->nstages;
    if (k >= S->cap_k[gi]) {
        int cap = S->cap_k[gi] ? S->cap_k[gi] : 16;
        while (cap <= k) cap *= 2;
        S->carr[gi] = realloc(S->carr[gi], sizeof(double) * (size_t)cap * (size_t)P);
        if (!S->carr[gi]) ICE("out of memory");
        for (int i = S->cap_k[gi] * P; i < cap * P; i++) S->carr[gi][i] = -1;
        S->cap_k[gi] = cap;
    }
    return &S->carr[gi][k * P];
}

/* When node i of stage st, reached by its stream at time t, can begin its
 * own work: t, or later for what it waits on (an event's record, a recv's
 * send, a collective over pp's last participant); -1 while blocked.  Notes
 * the time it spent blocked on another rank, a record's time, a
 * collective's arrival. */
static double node_begin(Sim *S, int st, int i, double t) {
    const Module *m = S->m;
    const Graph *g = m->stages[st];
    const Node *n = &g->nodes[i];
    if (n->op == OP_wait) {
        int e = (int)ir_attr_i(n, "event", 0);
        return S->rec[st][e] < 0 ? -1 : S->rec[st][e] > t ? S->rec[st][e] : t;
    }
    if (n->op == OP_record) {
        int e = (int)ir_attr_i(n, "event", 0);
        S->rec[st][e] = t, S->rec_node[st][e] = i;
        return t;
    }
    if (n->op == OP_recv || n->op == OP_recv_done) { /* a posted receive waits at its done (recv_start does not wait) */
        double sent;
        if (over_pp(m, n)) { /* from the stage (i + peer) mod p */
            int P = m->nstages, from = (int)(((st + ir_attr_i(n, "peer", 0)) % P + P) % P);
            sent = S->pp_end[pp_slot(S, from, st, ir_attr_i(n, "tag", 0))];
        } else {
            int q = ir_p2p_peer(g, i);
            sent = q < 0 ? t : S->done[st][q] ? S->s->end[st][q] : -1;
        }
        if (sent < 0) return -1;
        S->blocked[st][i] = sent > t ? sent - t : 0;
        return sent > t ? sent : t;
    }
    if ((ir_ops[n->op].flags & F_COMM) && n->op != OP_send && n->op != OP_recv_start && over_pp(m, n)) {
        const char *grp = ir_attr_s(n, "group", "");
        int gi = cgroup_id(S, grp), P = m->nstages;
        if (gi < 0) ICE("cost: a collective over pp of an unknown group");
        if (S->cnode_k[st][i] < 0) {
            S->cnode_k[st][i] = S->ccount[st][gi]++;
            arrival(S, gi, S->cnode_k[st][i])[st] = t;
        }
        double *a = arrival(S, gi, S->cnode_k[st][i]), last = 0;
        for (int q = 0; q < P; q++) {
            if (a[q] < 0) return -1;
            if (a[q] > last) last = a[q];
        }
        S->blocked[st][i] = last - t;
        return last;
    }
    return t;
}

/* Its own seconds once begun (a wait and a record: none). */
static double node_work(const Sim *S, int st, int i) {
    Op op = S->m->stages[st]->nodes[i].op;
    return op == OP_wait || op == OP_record ? 0 : S->dur[st][i];
}

/* Node i of stage st ended at e: a send over pp publishes its end. */
static void node_done(Sim *S, int st, int i, double b, double e) {
    const Node *n = &S->m->stages[st]->nodes[i];
    S->s->start[st][i] = b, S->s->end[st][i] = e, S->done[st][i] = 1;
    if (n->op == OP_send && over_pp(S->m, n)) {
        int P = S->m->nstages, to = (int)(((st + ir_attr_i(n, "peer", 0)) % P + P) % P);
        S->pp_end[pp_slot(S, st, to, ir_attr_i(n, "tag", 0))] = e;
    }
}

/* Run stream k of stage st as far as it goes; 1 if it moved.  Each node
 * lasts its duration from when it can begin (no processor sharing). */
static int run_stream(Sim *S, int st, int k) {
    int q = st * NS + k, moved = 0;
    while (S->ptr[q] < S->nlist[q]) {
        int i = S->list[q][S->ptr[q]];
        double t = S->clock[q], b = node_begin(S, st, i, t);
        if (b < 0) break;
        double e = b + node_work(S, st, i);
        node_done(S, st, i, t, e);
        S->clock[q] = e;
        S->ptr[q]++, moved = 1;
    }
    return moved;
}

/* ---- processor sharing (a CPU node's cores) ----
 *
 * A profile with `cores` describes ranks whose threads share a node's
 * cores (the CPU target: kiln's ranks are processes on one host).  Ranks
 * are grouped into sharing domains: a rank runs `threads` threads;
 * local = min(world, node_size) ranks a node; when they are bound to
 * disjoint cores (local·threads <= cores) each rank is its own domain of
 * `threads` cores, else they are unbound (mpirun leaves more ranks than
 * cores unbound) and the node's local ranks share all its cores, one
 * domain (session 10: the runtime runs cores/local threads a rank then,
 * at least 1; with 2 ranks on each of two 1-core domains the pipelined
 * 4-rank rows were predicted 24-38% slow, a core idle while its pair of
 * ranks waited in a bubble).  A stage's program stands for its
 * R = world/pp replicas, so each of its activities counts w = min(R,
 * ranks a domain) times in its domain (the domain of its first rank).
 *
 * Every node with work of its own is an activity while it runs, of demand
 * (cores it keeps busy) thread_speedup for a kernel on the compute stream
 * (its pool and OpenBLAS run `threads` threads, which go thread_speedup
 * times as fast as one: so many cores' worth of work), 1 for a collective
 * or a host copy (the comm or copy stream's one thread: MPI's
 * shared-memory collectives spin and copy, memcpy is CPU work), 0 for a
 * send or a recv (the CPU runtime stages a send and posts MPI_Isend; its
 * receives sleep between tests, coll_mpi.c's wait_posted); a node waiting
 * (an event, a recv's send, a pp collective's partner) demands nothing.  When a domain's
 * running activities demand D > c of its c cores, each proceeds at c/D of
 * its speed alone (the profile's times are one rank's alone).  The
 * simulation is then event-driven: advance to the next completion at the
 * current rates, start what can start, recompute the rates.  Where no
 * domain can ever demand more than its cores (a GPU profile: no `cores`;
 * one rank computing alone) the sweep above runs instead, unchanged. */

typedef struct {
    int *dom;      /* [stage] its domain */
    double *w;     /* [stage] its replicas in that domain */
    int ndom, g;   /* domains; ranks a domain */
    double cores;  /* a domain's cores */
    double threads; /* a compute kernel's demand: the profile's thread_speedup */
} Share;

/* Demand of node i of stage st while it runs (one replica). */
static double node_demand(const Share *sh, const Graph *g, int i) {
    Op op = g->nodes[i].op;
    unsigned fl = ir_ops[op].flags;
    if (op == OP_send || op == OP_recv || op == OP_recv_start || op == OP_recv_done) return 0; /* MPI_Isend of a staged copy; receives sleep */
    return fl & (F_COMM | F_COPY) ? 1 : g->nodes[i].stream == IR_STREAM_COMPUTE || g->nodes[i].stream < 0 ? sh->threads : 1;
}

/* 1 when the profile makes ranks share cores and some domain can demand
 * more than it has (else the sweep is exact). */
int cost_force_shared;

static int share_init(Share *sh, const Module *m, const Profile *p, double *const *dur) {
    memset(sh, 0, sizeof *sh);
    int shared = p && p->cores > 0;
    if (!shared && !cost_force_shared) return 0;
    int P = m->nstages, world = ir_world(m), R = world / P > 0 ? world / P : 1;
    int th = shared ? (p->threads > 0 ? p->threads : p->cores) : 1, node = shared ? p->node_size : 1, local = world < node ? world : node;
    /* bound ranks (local · threads within the cores): a domain each, on its
     * own `threads` cores; else the ranks are unbound (mpirun leaves more
     * ranks than cores unbound) and all of a node's share all its cores,
     * each running `threads` threads (the runtime's: cores / local ranks) */
    int unbound = shared && (int64_t)local * th > p->cores, g = unbound ? local : 1;
    sh->g = g;
    sh->cores = shared ? (unbound ? p->cores : th) : INFINITY, sh->threads = shared && p->thread_speedup > 0 ? p->thread_speedup : th;
    sh->dom = xcalloc((size_t)P, sizeof(int));
    sh->w = xcalloc((size_t)P, sizeof(double));
    double *most = xcalloc((size_t)P + 1, sizeof(double)); /* per domain: the most its activities can demand at once */
    int over = 0;
    for (int st = 0, prev = -1; st < P; st++) { /* the domains numbered in order: stages share one when their first ranks do */
        int d = (int)((int64_t)st * R / g);
        if (d != prev) sh->ndom++, prev = d;
        sh->dom[st] = sh->ndom - 1;
        sh->w[st] = R < g ? R : g;
        const Graph *gr = m->stages[st];
        double lane[NS] = {0};
        for (int i = 0; i < gr->nnodes; i++) {
            int k = gr->nodes[i].stream >= 0 && gr->nodes[i].stream < NS ? gr->nodes[i].stream : 0;
            Op op = gr->nodes[i].op;
            double d = dur[st][i] > 0 && op != OP_wait && op != OP_record ? node_demand(sh, gr, i) : 0;
            if (d > lane[k]) lane[k] = d;
        }
        for (int k = 0; k < NS; k++) most[sh->dom[st]] += sh->w[st] * lane[k];
    }
    for (int d = 0; d < sh->ndom; d++) over |= most[d] > sh->cores;
    free(most);
    if (!over && !cost_force_shared) free(sh->dom), free(sh->w), memset(sh, 0, sizeof *sh);
    return over || cost_force_shared;
}

static void share_free(Share *sh) { free(sh->dom), free(sh->w); }

/* Start what can start on lane q now (its clock is at or before now, and
 * whatever it waits on has happened by now): instant nodes end at once,
 * the first with work becomes running (rem its work, dem its demand). */
static int lane_start(Sim *S, const Share *sh, int q, int *run, double *rem, double *dem) {
    int st = q / NS, moved = 0;
    while (!run[q] && S->ptr[q] < S->nlist[q]) {
        int i = S->list[q][S->ptr[q]];
        double t = S->clock[q], b = node_begin(S, st, i, t);
        if (b < 0) break;
        double w = node_work(S, st, i);
        moved = 1;
        if (w <= 0) {
            node_done(S, st, i, t, b);
            S->clock[q] = b, S->ptr[q]++;
            continue;
        }
        S->s->start[st][i] = t; /* from when its stream reached it, as the sweep counts it */
        run[q] = 1, rem[q] = w, dem[q] = sh->w[st] * node_demand(sh, S->m->stages[st], i);
    }
    return moved;
}

/* The event-driven replay under processor sharing, until nothing runs (a
 * deadlock leaves a lane short of its end: cost_simulate reports it). */
static void run_shared(Sim *S, const Share *sh) {
    int L = S->m->nstages * NS, *run = xcalloc((size_t)L, sizeof(int));
    double *rem = xcalloc((size_t)L, sizeof(double)), *dem = xcalloc((size_t)L, sizeof(double));
    double *load = xcalloc((size_t)sh->ndom + 1, sizeof(double)), *rate = xcalloc((size_t)L, sizeof(double)), now = 0;
    for (;;) {
        for (int moved = 1; moved;) {
            moved = 0;
            for (int q = 0; q < L; q++) moved |= lane_start(S, sh, q, run, rem, dem);
        }
        memset(load, 0, sizeof(double) * (size_t)sh->ndom);
        int nrun = 0;
        for (int q = 0; q < L; q++)
            if (run[q]) load[sh->dom[q / NS]] += dem[q], nrun++;
        if (!nrun) break;
        double dt = INFINITY;
        for (int q = 0; q < L; q++) {
            if (!run[q]) continue;
            double D = load[sh->dom[q / NS]];
            rate[q] = D > sh->cores ? sh->cores / D : 1;
            if (rem[q] / rate[q] < dt) dt = rem[q] / rate[q];
        }
        now += dt;
        for (int q = 0; q < L; q++) {
            if (!run[q]) continue;
            if (rem[q] / rate[q] <= dt * (1 + 1e-12)) { /* ends now */
                int st = q / NS, i = S->list[q][S->ptr[q]];
                node_done(S, st, i, S->s->start[st][i], now);
                S->clock[q] = now, S->ptr[q]++, run[q] = 0;
            } else rem[q] -= dt * rate[q];
        }
    }
    free(run), free(rem), free(dem), free(load), free(rate);
}

static int deadlock(Sim *S, char *err, size_t errlen) {
    size_t len = (size_t)snprintf(err, errlen, "the programs deadlock in the simulation:");
    for (int st = 0; st < S->m->nstages; st++)
        for (int k = 0; k < NS; k++) {
            int q = st * NS + k;
            if (S->ptr[q] >= S->nlist[q] || len >= errlen) continue;
            const Node *n = &S->m->stages[st]->nodes[S->list[q][S->ptr[q]]];
            len += (size_t)snprintf(err + len, errlen - len, " stage %d stream %d at node %d (%s)", st, k, S->list[q][S->ptr[q]], ir_ops[n->op].name);
        }
    return -1;
}

/* ---- the split ---- */

/* The comm-stream node whose end a record on stream k at node r marks: the
 * last node before r on that stream that is not a record or wait. */
static int work_before(const Graph *g, int r) {
    int k = g->nodes[r].stream;
    for (int i = r - 1; i >= 0; i--)
        if (g->nodes[i].stream == k && g->nodes[i].op != OP_record && g->nodes[i].op != OP_wait) return i;
    return -1;
}

const char *const cost_class_names[COST_NCLASS] = {"dp", "cp", "pp", "tp", "d2h", "h2d", "bubble"};

int cost_node_class(const Node *n) {
    unsigned fl = ir_ops[n->op].flags;
    if (fl & F_COPY) return n->op == OP_offload ? COST_D2H : COST_H2D;
    if (!(fl & F_COMM)) return -1;
    int mask = ir_group_mask(ir_attr_s(n, "group", ""));
    static const int axis_class[IR_NAXES] = {COST_PP, COST_DP, COST_CP, COST_TP}; /* the mesh's axis order */
    if (mask <= 0) return COST_DP;
    for (int a = 0; a < IR_NAXES; a++)
        if (mask == 1 << a) return axis_class[a];
    return mask & 2 ? COST_DP : mask & 4 ? COST_CP : mask & 8 ? COST_TP : COST_PP;
}

/* Split `amount` seconds of the compute stream's idle time [b, e], spent
 * waiting for the record at node r of stream k, over the classes of the
 * work that stream ran in [b, e] (each node's active part: after the time
 * it was blocked on another rank), in proportion; none overlapping: the
 * class of the work just before r (a stream's own wait, say).  Walks back
 * from r while the nodes end after b (a stream's times only grow). */
static void attribute(const Sim *S, int st, int r, double b, double e, double amount, double *cls) {
    if (amount <= 0) return;
    const Graph *g = S->m->stages[st];
    int k = g->nodes[r].stream;
    double w[COST_NCLASS] = {0}, tot = 0;
    for (int j = r - 1; j >= 0; j--) {
        const Node *n = &g->nodes[j];
        if (n->stream != k) continue;
        if (S->s->end[st][j] <= b) break;
        int c = cost_node_class(n);
        if (c < 0) continue;
        double lo = fmax(b, S->s->start[st][j] + S->blocked[st][j]), hi = fmin(e, S->s->end[st][j]);
        if (hi > lo) w[c] += hi - lo, tot += hi - lo;
    }
    if (tot <= 0) {
        int j = work_before(g, r), c = j >= 0 ? cost_node_class(&g->nodes[j]) : -1;
        cls[c >= 0 ? c : k == IR_STREAM_D2H ? COST_D2H : k == IR_STREAM_H2D ? COST_H2D : COST_DP] += amount;
        return;
    }
    for (int c = 0; c < COST_NCLASS; c++) cls[c] += amount * w[c] / tot;
}

static void split_rank(Sim *S, int st) {
    const Graph *g = S->m->stages[st];
    CostRank *R = &S->s->rank[st];
    double *b = S->s->start[st], *e = S->s->end[st], cend = 0, last = 0, *cls = R->exposed.s;
    int last_stream = IR_STREAM_COMPUTE, last_node = -1;
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        if (e[i] > last) last = e[i], last_stream = n->stream, last_node = i;
        unsigned fl = ir_ops[n->op].flags;
        if ((fl & (F_GEMM)) || n->op == OP_attention || n->op == OP_attention_bwd)
            if (n->phase != PH_RECOMPUTE) R->flops += ir_node_flops(g, n);
        if (n->stream != IR_STREAM_COMPUTE && n->stream >= 0) continue;
        cend = e[i];
        double gap = e[i] - b[i];
        if (n->op == OP_wait) { /* idle for another stream: split by what that stream ran meanwhile */
            int ev = (int)ir_attr_i(n, "event", 0), r = S->rec_node[st][ev];
            int w = r >= 0 ? work_before(g, r) : -1;
            double bl = w >= 0 ? S->blocked[st][w] : 0, part[COST_NCLASS] = {0};
            bl = bl < gap ? bl : gap;
            if (r >= 0) attribute(S, st, r, b[i], e[i], gap - bl, part);
            else part[COST_DP] += gap - bl;
            R->bubble += bl, cls[COST_BUBBLE] += bl;
            for (int c = 0; c < COST_BUBBLE; c++) {
                cls[c] += part[c];
                if (c == COST_D2H || c == COST_H2D) R->copy += part[c];
                else R->comm += part[c];
            }
        } else if (fl & F_COMM) {
            double bl = S->blocked[st][i] < gap ? S->blocked[st][i] : gap;
            R->bubble += bl, R->comm += gap - bl;
            cls[COST_BUBBLE] += bl, cls[cost_node_class(n)] += gap - bl;
        } else if (fl & F_COPY) {
            R->copy += gap, cls[cost_node_class(n)] += gap;
        } else {
            R->compute += gap;
        }
    }
    R->end = last;
    double tail = last - cend;
    if (last_stream == IR_STREAM_D2H || last_stream == IR_STREAM_H2D) R->copy += tail;
    else R->comm += tail;
    if (tail > 0) {
        int c = last_node >= 0 ? cost_node_class(&g->nodes[last_node]) : -1;
        if (c < 0) { /* a record or wait ended last: the work before it */
            int j = work_before(g, last_node);
            c = j >= 0 ? cost_node_class(&g->nodes[j]) : -1;
        }
        if (last_stream == IR_STREAM_D2H || last_stream == IR_STREAM_H2D) c = last_stream == IR_STREAM_D2H ? COST_D2H : COST_H2D;
        else if (c < 0 || c == COST_D2H || c == COST_H2D) c = COST_DP;
        cls[c] += tail;
    }
    R->peak = memplan_stage_peak(g, SPACE_PARAMS) + memplan_stage_peak(g, SPACE_GRADS) + memplan_stage_peak(g, SPACE_OPT) +
              memplan_stage_peak(g, SPACE_ACT);
    R->host = memplan_stage_peak(g, SPACE_HOST);
}

/* The dtype of the first GEMM's output (the model's compute dtype). */
static DType gemm_dtype(const Module *m) {
    for (int st = 0; st < m->nstages; st++)
        for (int i = 0; i < m->stages[st]->nnodes; i++)
            if (ir_ops[m->stages[st]->nodes[i].op].flags & F_GEMM) return m->stages[st]->vals[m->stages[st]->nodes[i].in[0]].t.dt;
    return DT_F32;
}

int cost_simulate(const Module *m, const Profile *p, double *const *dur, CostSim *out, char *err, size_t errlen) {
    int P = m->nstages;
    memset(out, 0, sizeof *out);
    out->nstages = P;
    out->start = xcalloc((size_t)P, sizeof(double *));
    out->end = xcalloc((size_t)P, sizeof(double *));
    out->rank = xcalloc((size_t)P, sizeof(CostRank));
    double **own = NULL;
    if (!dur) {
        if (!p) ICE("cost_simulate: neither a profile nor durations");
        own = xcalloc((size_t)P, sizeof(double *));
        for (int st = 0; st < P; st++) {
            const Graph *g = m->stages[st];
            MemLive L;
            ir_live_build(g, &L);
            own[st] = xcalloc((size_t)g->nnodes + 1, sizeof(double));
            for (int i = 0; i < g->nnodes; i++) own[st][i] = node_seconds(p, g, &g->nodes[i], L.root);
            ir_live_free(&L);
        }
        dur = own;
    }
    for (int st = 0; st < P; st++) {
        out->start[st] = xcalloc((size_t)m->stages[st]->nnodes + 1, sizeof(double));
        out->end[st] = xcalloc((size_t)m->stages[st]->nnodes + 1, sizeof(double));
    }
    Sim S;
    sim_init(&S, m, dur, out);
    int rc = 0;
    Share sh;
    if (share_init(&sh, m, p, dur)) {
        out->shared = 1, out->domains = sh.ndom, out->domain_ranks = sh.g, out->domain_cores = (int)sh.cores;
        run_shared(&S, &sh);
        share_free(&sh);
    } else
        for (int moved = 1; moved;) {
            moved = 0;
            for (int st = 0; st < P; st++)
                for (int k = 0; k < NS; k++) moved |= run_stream(&S, st, k);
        }
    for (int q = 0; q < P * NS && rc == 0; q++)
        if (S.ptr[q] < S.nlist[q]) rc = deadlock(&S, err, errlen);
    if (rc == 0) {
        for (int st = 0; st < P; st++) split_rank(&S, st);
        for (int st = 0; st < P && p; st++) /* the runtime's fixed cost a step: the host's, counted as compute */
            out->rank[st].end += p->step_overhead_s, out->rank[st].compute += p->step_overhead_s;
        for (int st = 0; st < P; st++) out->step = out->rank[st].end > out->step ? out->rank[st].end : out->step;
        double flops = 0;
        for (int st = 0; st < P; st++) {
            CostRank *R = &out->rank[st];
            R->bubble += out->step - R->end, R->exposed.s[COST_BUBBLE] += out->step - R->end, flops += R->flops;
        }
        out->peak_flops = p ? peak_of(p, gemm_dtype(m)) : 0;
        out->mfu = out->step > 0 && out->peak_flops > 0 ? flops / (P * out->step * out->peak_flops) : 0;
    }
    sim_free(&S);
    if (own) {
        for (int st = 0; st < P; st++) free(own[st]);
        free(own);
    }
    return rc;
}

void cost_sim_free(CostSim *s) {
    for (int st = 0; st < s->nstages; st++) free(s->start[st]), free(s->end[st]);
    free(s->start), free(s->end), free(s->rank);
    memset(s, 0, sizeof *s);
}

static double ms(double s) { return s * 1e3; }

void cost_report(const Module *m, const Profile *p, const CostSim *s, FILE *f) {
    fprintf(f, "predicted step %.3f ms on %s, MFU %.1f%% (model FLOPs against %.4g TFLOP/s per device)\n", ms(s->step), p->name,
            100 * s->mfu, s->peak_flops / 1e12);
    if (s->shared)
        fprintf(f, "  processor sharing: %d rank%s on %d core%s (a domain; %d domain%s), a computing rank keeping %.3g busy (profile: cores %d, threads %d)\n",
                s->domain_ranks, s->domain_ranks == 1 ? "" : "s", s->domain_cores, s->domain_cores == 1 ? "" : "s", s->domains, s->domains == 1 ? "" : "s",
                p->thread_speedup, p->cores, p->threads);
    fprintf(f, "  %5s %11s %11s %11s %11s %11s %12s\n", "stage", "compute ms", "exp. comm", "bubble", "exp. copy", "step ms", "memory MiB");
    for (int st = 0; st < s->nstages; st++) {
        const CostRank *r = &s->rank[st];
        fprintf(f, "  %5d %11.3f %11.3f %11.3f %11.3f %11.3f %12.2f\n", st, ms(r->compute), ms(r->comm), ms(r->bubble), ms(r->copy),
                ms(r->compute + r->comm + r->bubble + r->copy), (double)r->peak / (1 << 20));
    }
    /* exposed time per class: what the compute stream waited for */
    fprintf(f, "  exposed ms by class (compute stream idle, not hidden):\n  %5s", "stage");
    for (int c = 0; c < COST_NCLASS; c++) fprintf(f, " %9s", cost_class_names[c]);
    fputc('\n', f);
    for (int st = 0; st < s->nstages; st++) {
        fprintf(f, "  %5d", st);
        for (int c = 0; c < COST_NCLASS; c++) fprintf(f, " %9.3f", ms(s->rank[st].exposed.s[c]));
        fputc('\n', f);
    }
    /* KILN_COST_NODES=FILE: every node's simulated start and end (tab-separated
     * stage, node, op, stream, fused group, start s, end s), to set beside a
     * trainer's --trace (bench/cost_model.sh's per-kernel check) */
    const char *dump = getenv("KILN_COST_NODES");
    FILE *nf = dump && *dump ? fopen(dump, "w") : NULL;
    if (dump && *dump && !nf) fprintf(stderr, "KILN_COST_NODES: cannot open %s\n", dump);
    for (int st = 0; nf && st < s->nstages; st++)
        for (int i = 0; i < m->stages[st]->nnodes; i++) {
            const Node *n = &m->stages[st]->nodes[i];
            fprintf(nf, "%d\t%d\t%s\t%d\t%lld\t%.9g\t%.9g\n", st, i, ir_ops[n->op].name, n->stream, (long long)ir_fused_group(n),
                    s->start[st][i], s->end[st][i]);
        }
    if (nf && fclose(nf) != 0) fprintf(stderr, "KILN_COST_NODES: cannot write %s\n", dump);
    /* stage 0's compute stream by op: where the predicted time goes */
    double by[OP_COUNT] = {0}, tot = 0;
    const Graph *g = m->stages[0];
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i].stream <= IR_STREAM_COMPUTE && g->nodes[i].op != OP_wait) {
            by[g->nodes[i].op] += s->end[0][i] - s->start[0][i];
            tot += s->end[0][i] - s->start[0][i];
        }
    fprintf(f, "  stage 0 compute stream by op:");
    for (int k = 0; k < 6; k++) {
        int best = -1;
        for (int o = 0; o < OP_COUNT; o++)
            if (by[o] > 0 && (best < 0 || by[o] > by[best])) best = o;
        if (best < 0) break;
        fprintf(f, " %s %.1f%%", ir_ops[best].name, 100 * by[best] / (tot > 0 ? tot : 1));
        by[best] = 0;
    }
    fputc('\n', f);
}
