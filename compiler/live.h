/* live.h — what the backend passes promise each other, as the IR states it.
 *
 * fuse, schedule and memplan each leave a mark on the graph that the next
 * pass, the verifier, the emitters and `kiln plan` read: a fused group (the
 * int attribute kernel=K on a contiguous run of nodes), a stream and a
 * position per node, a space and an aligned offset per buffer.  The names
 * for those marks, and the one definition of which values own a buffer and
 * how long it lives, belong to the IR, not to the pass that makes them: the
 * verifier checks them and several passes read them, and a pass never calls
 * into another pass's file.  So they live here, in the IR layer (live.c);
 * this header includes ir.h and nothing else.
 */
#ifndef KILN_LIVE_H
#define KILN_LIVE_H

#include "ir.h"

#define IR_MEM_ALIGN 64 /* every buffer offset and every space size */

/* The streams a scheduled node runs on (Node.stream); in-order queues that
 * run concurrently, ordered by record/wait events.  Under --schedule lhs
 * (docs/schedule.md) two mesh axes get comm streams of their own:
 * IR_STREAM_TP carries the collectives over the tp axis alone, so a tp
 * all-reduce never queues behind a dp bucket or a blocked pipeline receive;
 * IR_STREAM_PP every transfer over the pp axis alone (sends, receives, the
 * collectives over pp: one communicator, one stream), so a pipeline receive
 * never queues behind a dp bucket's reduce-scatter.  Every other transfer
 * is on IR_STREAM_COMM. */
enum { IR_STREAM_COMPUTE, IR_STREAM_COMM, IR_STREAM_D2H, IR_STREAM_H2D, IR_STREAM_TP, IR_STREAM_PP, IR_NSTREAMS };

/* A stream that runs transfers between ranks. */
static inline int ir_stream_comm(int s) { return s == IR_STREAM_COMM || s == IR_STREAM_TP || s == IR_STREAM_PP; }

/* The fused group (kernel attribute) of node n; -1 when it has none. */
static inline int64_t ir_fused_group(const Node *n) {
    const Attr *a = ir_attr(n, "kernel");
    return a && a->kind == AT_INT ? a->i : -1;
}

/* Put g's nodes in the order order[0..nnodes-1] (a permutation of node
 * indices), keeping value ids; vals[].def follows.  ICE on a non-permutation;
 * def-before-use is the caller's business (the verifier checks it). */
void ir_reorder(Graph *g, const int *order);

/* The other end of point-to-point node i: for a send, the first recv after
 * it with its group and tag (NCCL pairs them in one group call, and the ring
 * of parallelize.c orders them so); for a recv, the last such send before
 * it; -1 when there is none or node i is neither. */
int ir_p2p_peer(const Graph *g, int i);

/* Buffers and their lifetimes over program positions (node indices).
 * A view (F_VIEW: reshape, loss) uses its input's buffer; a value internal
 * to a fused group (every use inside the group) has none; the group as a
 * whole runs at once, so its inputs live to its last node and its outputs
 * from its first.  Program inputs live from 0, values read by output nodes
 * to nnodes (after the last node).  A value used on another stream than its
 * producer's lives until the producer's stream waits for an event recorded
 * after that use (nnodes if none does).  Between tp's comm stream
 * (IR_STREAM_TP) and the other comm stream, which never wait for each
 * other directly, "waits" is transitive (through events of the compute
 * stream: live.c, tp_pair).  memplan places by it; the verifier
 * checks the placement with it. */
typedef struct {
    int nvals, nnodes;
    int *root;        /* per value: the value owning its buffer; -1: no buffer */
    int *start, *end; /* per value with root[v] == v: live over [start, end] */
    int *first, *last; /* per node: the positions its fused group spans (itself when not fused) */
    unsigned used;    /* the streams that have nodes, a bit each */
    unsigned devw;    /* the streams with a node that writes device bytes (any output but an offload's), a bit each */
    int *oend;        /* ordered_end's table (live.c, oend_build); NULL: the scan */
    int *peer;        /* per node: ir_p2p_peer of a send, -1 otherwise; NULL: ir_p2p_peer */
    void *hb;         /* live.c's happens-before clocks (HostOrder), for the pairs of streams with tp's */
    int64_t *voff;    /* per value with a buffer: its byte offset inside its root's buffer (0 for the root
                       * and for reshape-like views; a slice view's start; a concat member's place) */
    char *member;     /* per value: a concat member (below): its producer writes its bytes inside its root's buffer */
    unsigned char *wstreams; /* per root: the streams that write its bytes (its producer's, its members'), a bit each */
    int *rd_at, *rd;         /* per root r: the nodes reading its buffer, rd[rd_at[r] .. rd_at[r+1]), in node order */
} MemLive;

/* Views by layout (docs/parallel.md, "Concat and slice as views").  A slice
 * along a dimension whose outer dims are all 1 (dim 0, or [1,T,C] on dim
 * 1) is a contiguous part of its input: its value is a view at that byte
 * offset (voff), and the emitters copy nothing when the plan puts it
 * there.  A concat along such a dimension is contiguous too: each input
 * whose buffer (its root: a computed value, not a param, input, constant,
 * offload, reload or receive, nor a concat with members of its own, of the
 * concat's dtype and exactly the input's bytes, claimed by no earlier
 * concat) becomes a *member*: its producer writes straight into its place
 * inside the concat's buffer, which is its root, and the concat copies
 * nothing for it.  The root then lives over the union of its members'
 * lives and its own.  Offsets must stay 64-byte aligned: a part that is
 * not stays a copy.  KILN_VIEWS=0 turns both off (for comparison; read in
 * each process: a dump planned with views verifies only with them);
 * KILN_TEST_VIEW_BUG=overlap places each concat's second member over its
 * first (the verifier must refuse it). */
int ir_views_enabled(void);
/* Views on (1) or off (0) in this process until set again (memplan plans
 * without them to compare); returns the previous setting.  A slice or
 * concat with the attribute copy=1 is never a view: memplan marks them all
 * when a stage's plan without views is the smaller. */
int ir_views_set(int on);
/* 1 when node n (a slice or concat) copies nothing in the plan: every
 * output/input part already lies where the op would copy it (the
 * emitters skip those parts part by part; the cost model may count it
 * free). */
int ir_copy_in_place(const Graph *g, const Node *n);
/* Part k of slice/concat n (a concat's input k; a slice's output, k = 0)
 * already lies where the op would copy it: the emitters copy nothing for it. */
int ir_view_part_in_place(const Graph *g, const Node *n, int k);
void ir_live_build(const Graph *g, MemLive *L);
void ir_live_free(MemLive *L);

/* The reference for ir_live_build's tables: the same MemLive by the
 * definition, scanning forward from every cross-stream read for the first
 * wait on an event recorded after it, and pairing sends by ir_p2p_peer
 * (quadratic in the program's length; tests compare the two). */
void ir_live_build_scan(const Graph *g, MemLive *L);

/* The first position at which stream sd has waited for an event that stream
 * su recorded after position u (nnodes if none): the scan that the
 * table of ir_live_build replaces, kept as its reference. */
int ir_ordered_end_scan(const Graph *g, int u, int su, int sd);

/* The value of the param or state node that `assign` node i names; -1 when
 * none does. */
int ir_assign_target(const Graph *g, int i);

/* In-place updates.  An `assign` writes a new value nw over a param or
 * state old at the end of the step, but nw may as well be computed straight
 * into old's buffer (no second buffer, no copy) when no read of old can see
 * it (memplan asks the same of a gradient's add over its first contribution
 * and of an F_INPLACE op's output over its input): every node that reads old (or a view of it) must be done with it
 * before nw's producer starts (its fused group's first position) -- on the
 * producer's stream by position, from another stream by an event recorded
 * after the read that the producer's stream waits for before the write --
 * or be the producer itself reading element j before it writes element j
 * (an elementwise op, an optimizer update or an F_INPLACE op, or an
 * elementwise member at or before the producer in its fused group, reading
 * all of old).  An output
 * reads old at the end of the step, so it always conflicts.  nw must be a
 * computed value with a buffer of its own, of old's dtype and size.
 * Returns -1 when nw may be written over old; else the node in the way (a
 * reader of old, or nw's producer) and in *why what it does wrong.  memplan
 * places by it and the verifier checks the placement with it. */
int ir_inplace_conflict(const Graph *g, const MemLive *L, int old, int nw, const char **why);

#endif
