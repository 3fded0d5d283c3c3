/* cp.c — context parallel: attention over a sequence split on cp ranks.
 *
 * Part of the parallelize pass (cp.h).  parallelize.c splits every
 * activation on the sequence dimension and propagates that split through
 * the graph like any other; elementwise ops, norms, GEMMs and the loss then
 * need nothing but local shapes.  Attention is the one op whose result on
 * a rank's tokens needs every other rank's keys and values, and this file
 * builds that communication (DESIGN.md §9.1).
 *
 * Layout.  With the default "dual chunk" layout (DualChunkSwap) the
 * sequence is cut into 2cp chunks and rank r holds chunks r and 2cp-1-r:
 * under a causal mask an early chunk has little to attend to and a late one
 * much, so pairing them gives every rank the same work.  --cp-layout
 * contiguous gives rank r the r-th of cp pieces.  The sequence length must
 * divide into the chunks (cp_check_input).  Positions are global token
 * indices, a function of the rank and the layout: an iota with {group="cp",
 * layout} computes them, so positions never travel unless the model gave its
 * own (then they move with K and V).
 *
 * All-gather (--cp-comm allgather, seed 2, Llama 3): K and V are
 * all-gathered over cp, the rank's queries attend to every key with causal
 * masking by global position, and backward reduce-scatters dK, dV home.
 *
 * Ring (--cp-comm p2p): cp steps; at step i the rank holds the K,V block of
 * the rank i places before it, attends to it (masked by position: the
 * diagonal block causal, the others wholly visible or wholly masked per
 * row), and merges the result into its running output by log-sum-exp
 * (attn_merge), while it sends the block on to the next rank and receives
 * the next one.  Backward runs the same ring with the final O and LSE; dK,
 * dV accumulate while travelling with their block and a last hop brings
 * them home; dQ accumulates locally.
 *
 * GQA: only the kv heads travel (K, V are never expanded to the query heads
 * before communicating), so comm shrinks by heads/kv_heads.
 */
#include <string.h>

#include "cp.h"

void cp_check_input(const CpRank *c, const Node *n, const Type *t) {
    int chunks = c->dual ? 2 * c->cp : c->cp;
    if (c->cp > 1 && (t->rank < 2 || t->dim[1] % chunks))
        error_at(n->loc, "input %s: the sequence %lld is not divisible by %s%d (--cp %d%s)", ir_attr_s(n, "name", "?"),
                 t->rank > 1 ? (long long)t->dim[1] : 0LL, c->dual ? "2 x cp = " : "cp = ", chunks, c->cp,
                 c->dual ? ", dual-chunk layout" : "");
}

int cp_position_attrs(const CpRank *c, Attr at[2]) {
    at[0] = ir_attr_str(c->m, "group", "cp");
    at[1] = ir_attr_str(c->m, "layout", c->dual ? "dual" : "contiguous");
    return 2;
}

/* K or V gathered over cp (all kv heads' tokens in rank order). */
static int gather(CpRank *c, int x, int dim) {
    Attr at[2] = {ir_attr_str(c->m, "group", "cp"), ir_attr_int(c->m, "dim", dim)};
    return ir_build1(c->b, OP_allgather, x, 2, at);
}

/* Global positions of a rank's len tokens: this rank's (from 0), the rank
 * `from` places before it in the cp ring (the block ring attention holds
 * at step `from`), or, all, every rank's in rank order (the all-gathered
 * keys'). */
static int positions(CpRank *c, int64_t len, int from, int all) {
    Type t = {.dt = DT_I32, .rank = 1, .dim = {all ? len * c->cp : len}};
    Attr at[4];
    int na = cp_position_attrs(c, at);
    if (from) at[na++] = ir_attr_int(c->m, "from", from);
    if (all) at[na++] = ir_attr_int(c->m, "all", 1);
    return ir_out(c->b->g, ir_build(c->b, OP_iota, 0, NULL, na, at, &t));
}

/* One hop of the ring: send x to the next cp rank, receive the previous
 * rank's (the same type) — the block moves on while this rank computes. */
static int ring_pass(CpRank *c, int x) {
    Graph *g = c->b->g;
    Type t = g->vals[x].t;
    int64_t tag = c->tag++;
    Attr s[3] = {ir_attr_str(c->m, "group", "cp"), ir_attr_int(c->m, "peer", 1), ir_attr_int(c->m, "tag", tag)};
    Attr r[3] = {ir_attr_str(c->m, "group", "cp"), ir_attr_int(c->m, "peer", -1), ir_attr_int(c->m, "tag", tag)};
    ir_build(c->b, OP_send, 1, &x, 3, s, NULL);
    int y = ir_out(g, ir_build(c->b, OP_recv, 0, NULL, 3, r, &t));
    memcpy(g->vals[y].sh, g->vals[x].sh, sizeof g->vals[y].sh);
    return y;
}

/* One attention node being rewritten: its inputs on this rank, K, V and
 * the positions left to fill in per step. */
typedef struct {
    const Node *n;
    int fwd, has;   /* attention (else attention_bwd); the model gave positions */
    int args[8];    /* the op's inputs: K, V at ki, ki+1, qpos, kpos at na, na+1 */
    int na, ki;
    int k, v, qpos, kpos;
    int64_t len;    /* the rank's tokens */
} Attn;

/* The op on a's args with K, V, kpos as given; its outputs into out[]. */
static void attend(CpRank *c, Attn *a, int k, int v, int kpos, int *out) {
    a->args[a->ki] = k, a->args[a->ki + 1] = v, a->args[a->na] = a->qpos, a->args[a->na + 1] = kpos;
    int j = ir_build(c->b, a->n->op, a->na + 2, a->args, a->n->nattr, a->n->attr, NULL);
    for (int o = 0; o < c->b->g->nodes[j].nout; o++) out[o] = c->b->g->nodes[j].out[o];
}

/* All-gather K, V (and the model's key positions); backward reduce-scatters
 * dK, dV home. */
static void gathered(CpRank *c, Attn *a, int *out) {
    int k = gather(c, a->k, 2), v = gather(c, a->v, 2);
    attend(c, a, k, v, a->has ? gather(c, a->kpos, 0) : positions(c, a->len, 0, 1), out);
    if (!a->fwd) {
        Attr at[2] = {ir_attr_str(c->m, "group", "cp"), ir_attr_int(c->m, "dim", 2)};
        out[1] = ir_build1(c->b, OP_reducescatter, out[1], 2, at);
        out[2] = ir_build1(c->b, OP_reducescatter, out[2], 2, at);
    }
}

/* Ring attention: cp steps, each on the block the ring brought, merged by
 * log-sum-exp (forward) or summed (backward, dK and dV travelling). */
static void ring(CpRank *c, Attn *a, int *out) {
    int k = a->k, v = a->v, kpos = a->kpos, acc[3] = {-1, -1, -1}, part[3];
    for (int step = 0; step < c->cp; step++) {
        if (step > 0) {
            k = ring_pass(c, k), v = ring_pass(c, v);
            kpos = a->has ? ring_pass(c, kpos) : positions(c, a->len, step, 0);
            if (!a->fwd) acc[1] = ring_pass(c, acc[1]), acc[2] = ring_pass(c, acc[2]);
        }
        attend(c, a, k, v, kpos, part);
        if (step == 0) {
            memcpy(acc, part, sizeof acc);
        } else if (a->fwd) {
            int m[4] = {acc[0], acc[1], part[0], part[1]};
            int j = ir_build(c->b, OP_attn_merge, 4, m, 0, NULL, NULL);
            acc[0] = c->b->g->nodes[j].out[0], acc[1] = c->b->g->nodes[j].out[1];
        } else {
            for (int o = 0; o < 3; o++) acc[o] = ir_build2(c->b, OP_add, acc[o], part[o]);
        }
    }
    if (!a->fwd && c->cp > 1) acc[1] = ring_pass(c, acc[1]), acc[2] = ring_pass(c, acc[2]); /* dK, dV home */
    memcpy(out, acc, sizeof(int) * (size_t)a->n->nout);
}

void cp_attention(CpRank *c, const Node *n, const int *in, int *out) {
    Attn a = {.n = n, .fwd = n->op == OP_attention};
    int np = a.fwd ? 3 : 6;
    a.has = n->nin > np;
    a.k = a.fwd ? in[1] : in[2], a.v = a.fwd ? in[2] : in[3];
    int q = a.fwd ? in[0] : in[1];
    a.len = c->b->g->vals[q].t.dim[2];
    /* the model's own positions (split like the tokens) travel with K,V;
     * the default ones are computed where they are needed */
    a.qpos = a.has ? in[np] : positions(c, a.len, 0, 0), a.kpos = a.has ? in[np + 1] : a.qpos;
    if (!a.fwd) a.args[a.na++] = in[0];
    a.args[a.na++] = q, a.na += 2; /* k, v at [na-2], [na-1] */
    if (!a.fwd) a.args[a.na++] = in[4], a.args[a.na++] = in[5];
    a.ki = a.fwd ? 1 : 2;
    if (c->ring) ring(c, &a, out);
    else gathered(c, &a, out);
}
