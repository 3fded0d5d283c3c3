/* pp.c — the pipeline pass: one rank program becomes one program per
 * pipeline rank, each the unrolled schedule of its chunks.
 *
 * Input: the step of one rank after parallelize and recompute — every
 * micro-batch's forward and backward unrolled (Node.mb), each node tagged
 * with its layer and phase.  Output: Module.stages[r] for every pipeline rank
 * r (mesh[0] = p), the program that every world rank with pp coordinate r
 * runs; send/recv over group "pp" carry activations forward and their
 * gradients backward.
 *
 * 1. Chunks.  The layers are cut into p·v contiguous chunks (virtual
 *    stages): --pp-layers, or balanced by the forward FLOPs of each layer
 *    with the embedding (the layer −1 work before the first layer) counted
 *    in chunk 0 and the head and loss (the layer −1 work after) in the last.
 * 2. Anchoring.  A node of layer L belongs to L's chunk.  A node outside
 *    the layers follows its inputs: forward and recompute nodes go to the
 *    latest chunk among their inputs' (the head follows the last layer),
 *    backward nodes to the earliest (the embedding's gradient follows layer
 *    0's).  A node none of whose inputs belongs to a chunk — params, inputs,
 *    constants, positions and what only they compute — is *floating*: every
 *    rank that reads it builds its own copy where it first needs it (a
 *    param read on two ranks, GPT-2's tied embedding, is the one case that
 *    carries state; see 5).
 * 3. Actions.  Each anchored node is part of an action (kind, chunk,
 *    micro-batch): forward nodes F; backward and recompute nodes B; for the
 *    zero-bubble schedules the backward is split: B is what the gradient
 *    sent to the previous chunk needs (every node it depends on inside the
 *    chunk's backward: the dX GEMMs, norms' and attention's backward), W the
 *    rest (the dW GEMMs, bias sums and their accumulation) — autodiff built
 *    them as separate nodes, so the split is exact and free.  W's nodes
 *    get phase wgrad (the dump, the trace and kiln plan tell them apart).
 * 4. Unrolling.  Each rank's program is its actions in ppsched's order
 *    (ppsched.h), each action's nodes in their original order; a value
 *    that an action on another rank reads is sent right after the action
 *    that computes it and received right before the first action that reads
 *    it (one transfer per value and reading rank, tags numbered once per
 *    step).  A receive is a pair: recv_start, posted before the previous
 *    action of the rank (so the bytes can land while it computes), and
 *    recv_done where the value is needed (docs/ir.md).  ppsched_prove
 *    has checked that this blocking order cannot deadlock (a post does not
 *    block, its done does); the verifier and the interpreter check it again
 *    on the real programs.
 * 5. The step's ends.  The loss is computed on the last chunk's rank; every
 *    rank reports it through an all-reduce over pp (the other ranks add 0),
 *    so the trainer and kiln check read "loss" anywhere.  A param read on
 *    several ranks has its gradient summed on one (where the anchoring puts
 *    the sum: the earliest chunk), which then sends the sum to the others;
 *    their copy of the param is marked {replica=1} and the optimizer updates
 *    it from the same gradient, so the copies stay equal, and leaves it out
 *    of the global gradient norm, which it all-reduces over pp.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "passes.h"
#include "ppsched.h"

enum { FLOAT = -1 };

typedef struct {
    Module *m;
    const Options *o;
    const Graph *g; /* the rank program of parallelize and recompute */
    PpPlan pl;
    int nchunks;
    int *chunk;  /* per node: its chunk, or FLOAT */
    char *kind;  /* per node: ACT_F, ACT_B or ACT_W (anchored nodes) */
    int *mb;     /* per node: its micro-batch, or the latest of its inputs' (a step's sum over micro-batches) */
    char *joins; /* per node: an add that joins ranks' partial gradient sums (regroup) */
    int **seq, *nseq, *at; /* plan_transfers: per (sender, receiver) the values in send order; a value's place there */
    int *got;              /* building rank r: per sender, how many of its values r has received (recv_done) */
    int *pgot;             /* building rank r: per sender, how many of its values r has posted (recv_start) */
    int *posted;           /* building rank r: old value -> its recv_start's output, -1 */
    char *xfer;  /* [value][rank]: 1 when that rank reads the value from another rank */
    int *tag;    /* [value][rank]: the transfer's tag */
    int *rtag;   /* [value][rank]: the tag the receiver posts (tag, but for --test-pp-bug swap-recv) */
    int ntags;
    /* building rank r */
    Builder b;
    int *map;    /* old value -> value in rank r's graph, -1 */
} Pp;

static const Node *def_of(const Graph *g, int v) { return g->vals[v].def >= 0 ? &g->nodes[g->vals[v].def] : NULL; }
static int rank_of(const Pp *P, int chunk) { return pp_chunk_rank(&P->pl, chunk); }
static int zero_bubble(const Pp *P);
static void split_backward(Pp *P);
static int is_output(const Node *n, const char *name) { return n->op == OP_output && strcmp(ir_attr_s(n, "name", ""), name) == 0; }

/* ---- 1. chunks ---- */

static int max_layer(const Graph *g) {
    int L = -1;
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i].layer > L) L = g->nodes[i].layer;
    return L;
}

/* Forward FLOPs per layer; pre and post: layer -1 forward work before the
 * first layer (nothing of a layer feeds it) and after. */
static void layer_costs(const Graph *g, int L, double *cost, double *pre, double *post) {
    char *after = xcalloc((size_t)g->nvals, 1);
    *pre = *post = 0;
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        int dep = n->layer >= 0;
        for (int k = 0; k < n->nin; k++) dep |= after[n->in[k]];
        for (int k = 0; k < n->nout; k++) after[n->out[k]] = (char)dep;
        if (n->phase != PH_FWD) continue;
        double f = ir_node_flops(g, n) + 1; /* +1: a layer of shape ops still weighs */
        if (n->layer >= 0 && n->layer < L) cost[n->layer] += f;
        else if (n->layer < 0) *(dep ? post : pre) += f;
    }
    free(after);
}

/* The chunk of every layer: --pp-layers or balanced. */
static int *layer_chunks(Pp *P) {
    const Graph *g = P->g;
    int L = max_layer(g) + 1, K = P->nchunks;
    Loc where = g->nnodes ? g->nodes[g->nnodes - 1].loc : (Loc){0};
    if (L < K)
        error_at(where, "--pp %d x --vpp %d: %d chunks, but the model has %d layer%s (at least one layer per chunk)", P->pl.p,
                 P->pl.v, K, L, L == 1 ? "" : "s");
    int *first = xcalloc((size_t)K + 1, sizeof(int)), *of = xcalloc((size_t)L, sizeof(int));
    if (P->o->npp_layers) {
        if (P->o->npp_layers != K) error_at(where, "--pp-layers: %d numbers for %d chunks (--pp x --vpp)", P->o->npp_layers, K);
        int s = 0;
        for (int k = 0; k < K; k++) {
            if (P->o->pp_layers[k] < 1) error_at(where, "--pp-layers: chunk %d has %d layers (at least 1)", k, P->o->pp_layers[k]);
            first[k] = s, s += P->o->pp_layers[k];
        }
        if (s != L) error_at(where, "--pp-layers: the counts sum to %d, but the model has %d layers", s, L);
    } else {
        double *cost = xcalloc((size_t)L, sizeof(double)), pre, post;
        layer_costs(g, L, cost, &pre, &post);
        ppsched_balance(cost, L, K, pre, post, first);
        free(cost);
    }
    first[K] = L;
    for (int k = 0; k < K; k++)
        for (int l = first[k]; l < first[k + 1]; l++) of[l] = k;
    free(first);
    return of;
}

/* ---- 2, 3. anchoring and actions ---- */

static void anchor(Pp *P, const int *of_layer) {
    const Graph *g = P->g;
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        int c = n->layer >= 0 ? of_layer[n->layer] : FLOAT;
        for (int k = 0; n->layer < 0 && k < n->nin; k++) {
            const Node *d = def_of(g, n->in[k]);
            int cd = d ? P->chunk[d - g->nodes] : FLOAT;
            if (cd == FLOAT) continue;
            if (c == FLOAT || (n->phase == PH_BWD ? cd < c : cd > c)) c = cd;
        }
        if (c == FLOAT && (ir_ops[n->op].flags & F_SINK)) c = P->nchunks - 1; /* an output of a constant */
        P->chunk[i] = c;
        P->mb[i] = n->mb;
        for (int k = 0; k < n->nin; k++) {
            const Node *d = def_of(g, n->in[k]);
            if (d && P->chunk[d - g->nodes] != FLOAT && P->mb[d - g->nodes] > P->mb[i]) P->mb[i] = P->mb[d - g->nodes];
        }
        P->kind[i] = n->phase == PH_FWD ? ACT_F : ACT_B;
    }
}

/* For recompute's estimate of the saved bytes per rank (recompute.c): the
 * action of every node of g as this pass would cut and anchor it, before
 * regrouping shared gradient sums (which moves only gradient adds, never a
 * forward value's reader).  chunk[i] is FLOAT (-1) for floating nodes. */
void pp_actions(const Graph *g, const Options *o, const PpPlan *pl, PpActions *out) {
    Pp P = {.o = o, .g = g, .pl = *pl, .nchunks = pl->p * pl->v};
    P.chunk = xcalloc((size_t)g->nnodes + 1, sizeof(int));
    P.kind = xcalloc((size_t)g->nnodes + 1, 1);
    P.mb = xcalloc((size_t)g->nnodes + 1, sizeof(int));
    P.joins = xcalloc((size_t)g->nnodes + 1, 1);
    int *of_layer = layer_chunks(&P);
    anchor(&P, of_layer);
    if (zero_bubble(&P)) split_backward(&P);
    free(of_layer), free(P.joins);
    *out = (PpActions){P.chunk, P.kind, P.mb};
}

/* ---- a gradient summed on several ranks (tied params) ----
 *
 * Autodiff and parallelize sum a param's gradient as one chain of adds,
 * contribution after contribution, micro-batch after micro-batch: for GPT-2's
 * tied wte (head_0 + emb_0) + (head_1 + emb_1) + ...  Anchored as it stands,
 * every add would pull a head contribution from the last rank to the
 * first: a [V, C] transfer per micro-batch.  So the chain is rebuilt: each
 * rank adds up its own contributions as they come (in its own chunk and
 * micro-batch, where the old chain's adds were), and one add per other rank
 * joins the ranks' partial sums after the last contribution: one transfer
 * per step, the one Megatron's embedding all-reduce makes. */

/* The leaves of the add chain ending at value v (values) and its adds (nodes). */
static void sum_leaves(const Pp *P, int v, const int *uses, int *leaves, int *n, int *adds, int *nadds) {
    const Node *d = def_of(P->g, v);
    int i = d ? (int)(d - P->g->nodes) : -1;
    if (d && d->op == OP_add && d->phase == PH_BWD && P->chunk[i] != FLOAT && uses[v] == 1) {
        adds[(*nadds)++] = i;
        sum_leaves(P, d->in[0], uses, leaves, n, adds, nadds);
        sum_leaves(P, d->in[1], uses, leaves, n, adds, nadds);
    } else {
        leaves[(*n)++] = v;
    }
}

typedef struct {
    int *leaf_of;  /* per old value: the gradient (output node index) it is a leaf of, -1 */
    int *last;     /* per output node: the node after which all its leaves exist */
    char *interior; /* per old node: an add of a chain being rebuilt */
    int *outs, any; /* the outputs whose chains are rebuilt */
} Regroup;

static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

static Regroup find_sums(const Pp *P) {
    const Graph *g = P->g;
    Regroup R = {xcalloc((size_t)g->nvals + 1, sizeof(int)), xcalloc((size_t)g->nnodes + 1, sizeof(int)), xcalloc((size_t)g->nnodes + 1, 1),
                 xcalloc((size_t)g->nnodes + 1, sizeof(int)), 0};
    int *uses = xcalloc((size_t)g->nvals + 1, sizeof(int)), *leaves = xcalloc((size_t)g->nnodes + 1, sizeof(int));
    int *adds = xcalloc((size_t)g->nnodes + 1, sizeof(int));
    for (int v = 0; v < g->nvals; v++) R.leaf_of[v] = -1;
    for (int i = 0; i < g->nnodes; i++)
        for (int k = 0; k < g->nodes[i].nin; k++) uses[g->nodes[i].in[k]]++;
    for (int o = 0; o < g->nnodes; o++) {
        const Node *n = &g->nodes[o];
        if (n->op != OP_output || strncmp(ir_attr_s(n, "name", ""), "grad:", 5) != 0) continue;
        int nl = 0, na = 0, r0 = -1, many = 0;
        sum_leaves(P, n->in[0], uses, leaves, &nl, adds, &na);
        for (int k = 0; k < nl; k++) {
            const Node *d = def_of(g, leaves[k]);
            int c = d ? P->chunk[d - g->nodes] : FLOAT;
            if (c == FLOAT) continue;
            if (r0 >= 0 && rank_of(P, c) != r0) many = 1;
            r0 = rank_of(P, c);
        }
        if (!many) continue;
        R.outs[R.any++] = o;
        qsort(leaves, (size_t)nl, sizeof(int), cmp_int);
        for (int k = 0; k < nl; k++) {
            R.leaf_of[leaves[k]] = o;
            if (g->vals[leaves[k]].def > R.last[o]) R.last[o] = g->vals[leaves[k]].def;
        }
        for (int k = 0; k < na; k++) R.interior[adds[k]] = 1;
    }
    free(uses), free(leaves), free(adds);
    return R;
}

/* The rebuilt graph; *joins marks (per new node) the adds that join ranks. */
static Graph *regroup(Pp *P, const Regroup *R, char **joins) {
    const Graph *g = P->g;
    int p = P->pl.p;
    Graph *h = ir_graph_new(P->m);
    Builder b = {h, "pipeline", {0}, -1, PH_BWD};
    int *map = xcalloc((size_t)g->nvals + 1, sizeof(int)), *acc = xcalloc((size_t)g->nnodes * (size_t)p + 1, sizeof(int));
    for (int v = 0; v < g->nvals; v++) map[v] = -1;
    for (int k = 0; k < g->nnodes * p; k++) acc[k] = -1;
    *joins = xcalloc((size_t)g->nnodes * 2 + (size_t)p + 1, 1);
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        if (R->interior[i]) continue;
        int in[IR_MAXIN];
        for (int k = 0; k < n->nin; k++) in[k] = map[n->in[k]];
        b.loc = n->loc, b.layer = n->layer, b.phase = n->phase;
        const Type *src = ir_ops[n->op].flags & F_SOURCE ? &g->vals[n->out[0]].t : NULL;
        int j = ir_build(&b, n->op, n->nin, in, n->nattr, n->attr, src);
        h->nodes[j].stage = n->stage, h->nodes[j].vstage = n->vstage, h->nodes[j].mb = n->mb;
        for (int k = 0; k < n->nout; k++) {
            memcpy(h->vals[h->nodes[j].out[k]].sh, g->vals[n->out[k]].sh, sizeof g->vals[0].sh);
            map[n->out[k]] = h->nodes[j].out[k];
            int o = R->leaf_of[n->out[k]];
            if (o < 0) continue;
            int r = P->chunk[i] == FLOAT ? 0 : rank_of(P, P->chunk[i]), *a = &acc[o * p + r];
            b.layer = n->layer, b.phase = PH_BWD; /* the rank's running sum, in the contribution's action */
            *a = *a < 0 ? map[n->out[k]] : ir_build2(&b, OP_add, *a, map[n->out[k]]);
            h->nodes[h->nnodes - 1].mb = n->mb;
        }
        for (int q = 0; q < R->any; q++) { /* after a gradient's last contribution: join the ranks' sums */
            int o = R->outs[q];
            if (R->last[o] != i) continue;
            int total = -1;
            b.loc = g->nodes[o].loc, b.layer = -1, b.phase = PH_BWD;
            for (int r = 0; r < p; r++) {
                int a = acc[o * p + r];
                if (a < 0) continue;
                if (total < 0) total = a;
                else total = ir_build2(&b, OP_add, total, a), h->nodes[h->nnodes - 1].mb = n->mb, (*joins)[h->nnodes - 1] = 1;
            }
            map[g->nodes[o].in[0]] = total;
        }
    }
    free(map), free(acc);
    return h;
}

static int zero_bubble(const Pp *P) { return P->pl.kind == PS_ZBH1 || P->pl.kind == PS_ZBV; }

/* Zero-bubble split: B keeps what a backward value read by another chunk
 * depends on inside its own chunk's backward, and the chunk's communication
 * (context parallel's ring sends dK, dV on while its receives are in B: the
 * two must stay in one action, or the ring's ranks wait for each other);
 * the rest becomes W. */
static void split_backward(Pp *P) {
    const Graph *g = P->g;
    char *needed = xcalloc((size_t)g->nnodes + 1, 1);
    for (int i = g->nnodes - 1; i >= 0; i--) {
        const Node *n = &g->nodes[i];
        if (P->chunk[i] == FLOAT || P->kind[i] == ACT_F) continue;
        for (int k = 0; k < n->nin; k++) {
            const Node *d = def_of(g, n->in[k]);
            if (!d) continue;
            int j = (int)(d - g->nodes);
            if (P->chunk[j] == FLOAT || P->kind[j] == ACT_F) continue;
            if ((P->chunk[j] != P->chunk[i] && !P->joins[i]) || needed[i] || (ir_ops[n->op].flags & F_COMM))
                needed[j] = 1; /* sent on (but to a ranks' gradient sum: W's), or B needs it */
        }
    }
    for (int i = 0; i < g->nnodes; i++)
        if (P->chunk[i] != FLOAT && P->kind[i] == ACT_B && !needed[i] && !(ir_ops[g->nodes[i].op].flags & F_COMM)) P->kind[i] = ACT_W;
    free(needed);
}

/* ---- 4. transfers ---- */

/* The nodes of each action, in program order: list k = (kind * chunks +
 * chunk) * m + mb, nodes first[k] .. first[k+1]-1 of `node`. */
typedef struct {
    int *first, *node;
} Lists;

static int action_key(const Pp *P, int kind, int chunk, int mb) { return (kind * P->nchunks + chunk) * P->pl.m + mb; }

static Lists action_lists(const Pp *P) {
    const Graph *g = P->g;
    int nk = 3 * P->nchunks * P->pl.m;
    Lists l = {xcalloc((size_t)nk + 2, sizeof(int)), xcalloc((size_t)g->nnodes + 1, sizeof(int))};
    for (int i = 0; i < g->nnodes; i++)
        if (P->chunk[i] != FLOAT) {
            int mb = P->mb[i];
            if (mb < 0 || mb >= P->pl.m) ICE("pipeline: node %d has micro-batch %d of %d", i, mb, P->pl.m);
            l.first[action_key(P, P->kind[i], P->chunk[i], mb) + 2]++;
        }
    for (int k = 0; k < nk; k++) l.first[k + 2] += l.first[k + 1];
    for (int i = 0; i < g->nnodes; i++)
        if (P->chunk[i] != FLOAT) l.node[l.first[action_key(P, P->kind[i], P->chunk[i], P->mb[i]) + 1]++] = i;
    return l;
}

/* Which values travel to which rank (xfer), then their tags in the order
 * their senders send them: each rank's actions in its schedule's order,
 * an action's values in program order (as run_action sends them); per
 * (sender, receiver) pair the values in that order (seq), and each value's
 * place in its pair's list (at). */
static void plan_transfers(Pp *P, const Lists *l) {
    const Graph *g = P->g;
    int p = P->pl.p;
    P->xfer = xcalloc((size_t)g->nvals * (size_t)p, 1);
    P->tag = xcalloc((size_t)g->nvals * (size_t)p, sizeof(int));
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        if (P->chunk[i] == FLOAT) continue;
        int b = rank_of(P, P->chunk[i]);
        for (int k = 0; k < n->nin; k++) {
            const Node *d = def_of(g, n->in[k]);
            if (d && P->chunk[d - g->nodes] != FLOAT && rank_of(P, P->chunk[d - g->nodes]) != b) P->xfer[n->in[k] * p + b] = 1;
        }
    }
    P->rtag = xcalloc((size_t)g->nvals * (size_t)p, sizeof(int));
    P->at = xcalloc((size_t)g->nvals * (size_t)p, sizeof(int));
    P->nseq = xcalloc((size_t)p * (size_t)p, sizeof(int));
    P->seq = xcalloc((size_t)p * (size_t)p, sizeof(int *));
    int *cap = xcalloc((size_t)p * (size_t)p, sizeof(int));
    int planted[2] = {-1, -1}; /* --test-pp-bug swap-recv: the first forward values of mb 0 and 1 rank 1 receives */
    for (int a = 0; a < p; a++)
        for (int x = 0; x < P->pl.nact[a]; x++) {
            const Action *ac = &P->pl.act[a][x];
            int key = action_key(P, ac->kind, ac->chunk, ac->mb);
            for (int q = l->first[key]; q < l->first[key + 1]; q++) {
                const Node *n = &g->nodes[l->node[q]];
                for (int k = 0; k < n->nout; k++)
                    for (int r = 0; r < p; r++) {
                        int v = n->out[k];
                        if (!P->xfer[v * p + r]) continue;
                        P->tag[v * p + r] = P->rtag[v * p + r] = P->ntags++;
                        int pr = a * p + r;
                        if (P->nseq[pr] == cap[pr]) {
                            P->seq[pr] = realloc(P->seq[pr], sizeof(int) * (size_t)(cap[pr] = cap[pr] ? 2 * cap[pr] : 16));
                            if (!P->seq[pr]) ICE("out of memory");
                        }
                        P->at[v * p + r] = P->nseq[pr];
                        P->seq[pr][P->nseq[pr]++] = v;
                        int mb = P->mb[n - g->nodes];
                        if (r == 1 && P->kind[n - g->nodes] == ACT_F && mb < 2 && planted[mb] < 0) planted[mb] = v;
                    }
            }
        }
    free(cap);
    if (P->o->pp_bug == 2 && planted[0] >= 0 && planted[1] >= 0) {
        P->rtag[planted[0] * p + 1] = P->tag[planted[1] * p + 1];
        P->rtag[planted[1] * p + 1] = P->tag[planted[0] * p + 1];
    }
}

/* ---- building one rank's program ---- */

static int copy_node(Pp *P, const Node *n, int r, int chunk) {
    const Graph *g = P->g;
    int *in = xcalloc((size_t)n->nin + 1, sizeof(int));
    for (int k = 0; k < n->nin; k++) {
        in[k] = P->map[n->in[k]];
        if (in[k] < 0) {
            char w[160];
            ICE("pipeline: rank %d: %s %s reads %%%d before it is computed (the schedule orders them wrong)", r,
                ir_ops[n->op].name, ir_where(n, w, sizeof w), n->in[k]);
        }
    }
    int i = (int)(n - g->nodes), w = P->chunk[i] != FLOAT && P->kind[i] == ACT_W && n->phase == PH_BWD;
    P->b.loc = n->loc, P->b.layer = n->layer, P->b.phase = w ? PH_WGRAD : n->phase; /* a W action's own nodes: phase wgrad */
    const Type *src = ir_ops[n->op].flags & F_SOURCE ? &g->vals[n->out[0]].t : NULL;
    int j = ir_build(&P->b, n->op, n->nin, in, n->nattr, n->attr, src);
    free(in);
    Node *c = &P->b.g->nodes[j];
    c->stage = r, c->vstage = chunk >= 0 ? pp_chunk_vstage(&P->pl, chunk) : 0, c->mb = n->mb;
    for (int k = 0; k < n->nout; k++) {
        memcpy(P->b.g->vals[c->out[k]].sh, g->vals[n->out[k]].sh, sizeof g->vals[0].sh);
        P->map[n->out[k]] = c->out[k];
    }
    return j;
}

/* Value v on rank r: floating values are built here on first use. */
static void need(Pp *P, int v, int r, int chunk) {
    if (P->map[v] >= 0) return;
    const Node *d = def_of(P->g, v);
    if (!d || P->chunk[d - P->g->nodes] != FLOAT) return; /* copy_node names the culprit */
    for (int k = 0; k < d->nin; k++) need(P, d->in[k], r, chunk);
    copy_node(P, d, r, chunk);
}

static Attr p2p_attrs(Pp *P, int peer, int tag, Attr *at) {
    at[0] = ir_attr_str(P->m, "group", "pp");
    at[1] = ir_attr_int(P->m, "peer", peer);
    at[2] = ir_attr_int(P->m, "tag", tag);
    return at[0];
}

/* A receive is two nodes: recv_start posts it (the buffer may fill from
 * there on) and recv_done waits for it, where the value is needed; between
 * them the rank computes.  start_value posts the receive of v, done_value
 * completes it (P->map[v] is then the received value). */
static void start_value(Pp *P, int v, int from, int r, int tag) {
    const Value *x = &P->g->vals[v];
    Attr at[3];
    p2p_attrs(P, from - r, tag, at);
    const Node *d = def_of(P->g, v);
    P->b.loc = d->loc, P->b.layer = d->layer, P->b.phase = d->phase; /* the transfer's metadata: its value's */
    int j = ir_build(&P->b, OP_recv_start, 0, NULL, 3, at, &x->t);
    Node *n = &P->b.g->nodes[j];
    n->stage = r, n->mb = d->mb;
    memcpy(P->b.g->vals[n->out[0]].sh, x->sh, sizeof x->sh);
    P->posted[v] = n->out[0];
}

static void done_value(Pp *P, int v, int from, int r, int tag) {
    Attr at[3];
    p2p_attrs(P, from - r, tag, at);
    const Node *d = def_of(P->g, v);
    P->b.loc = d->loc, P->b.layer = d->layer, P->b.phase = d->phase;
    int x = P->posted[v];
    if (x < 0) ICE("pipeline: rank %d completes a receive it never posted (tag %d)", r, tag);
    int j = ir_build(&P->b, OP_recv_done, 1, &x, 3, at, NULL);
    Node *n = &P->b.g->nodes[j];
    n->stage = r, n->mb = d->mb;
    memcpy(P->b.g->vals[n->out[0]].sh, P->g->vals[v].sh, sizeof P->g->vals[v].sh);
    P->map[v] = n->out[0];
}

/* Post sender a's values to rank r up to its place `at` in their order. */
static void post_upto(Pp *P, int a, int r, int at) {
    int p = P->pl.p;
    while (P->pgot[a] <= at) {
        int u = P->seq[a * p + r][P->pgot[a]++];
        start_value(P, u, a, r, P->rtag[u * p + r]);
    }
}

static void send_value(Pp *P, int v, int to, int r, int tag) {
    Attr at[3];
    p2p_attrs(P, to - r, tag, at);
    const Node *d = def_of(P->g, v);
    P->b.loc = d->loc, P->b.layer = d->layer, P->b.phase = d->phase;
    int x = P->map[v], j = ir_build(&P->b, OP_send, 1, &x, 3, at, NULL);
    P->b.g->nodes[j].stage = r, P->b.g->nodes[j].mb = def_of(P->g, v)->mb;
}

/* The action's receives, first, so its compute follows its inputs' arrival.
 * From each sender in the order it sends (NCCL pairs two ranks' sends and
 * receives by order, not by tag): a value that sender sent before the one
 * needed is received now too, early — it was sent before, so taking it
 * never waits longer than the needed one does. */
static void receive_inputs(Pp *P, const Lists *l, int lo, int hi, int r, int post_only) {
    const Graph *g = P->g;
    int p = P->pl.p;
    for (int q = lo; q < hi; q++) {
        const Node *nd = &g->nodes[l->node[q]];
        for (int k = 0; k < nd->nin; k++) {
            int v = nd->in[k];
            if (P->map[v] >= 0 || !P->xfer[v * p + r]) continue;
            int a = rank_of(P, P->chunk[def_of(g, v) - g->nodes]);
            post_upto(P, a, r, P->at[v * p + r]);
            while (!post_only && P->got[a] <= P->at[v * p + r]) {
                int u = P->seq[a * p + r][P->got[a]++];
                done_value(P, u, a, r, P->rtag[u * p + r]);
            }
        }
    }
}

/* The receives of rank r's next action are posted before this action's
 * (and its own receives' waits): they fill while this one computes.  When
 * the next action has no nodes (the first chunk's B under zb-h1 and zb-v:
 * it sends no input gradient, so its backward is all W) the one after it
 * is posted too, and so on to the next action with work.
 * --test-pp-bug late-post skips it (each receive posted where it waits). */
static void post_next(Pp *P, const Lists *l, int k, int r) {
    if (P->o->pp_bug == 3) return;
    for (int x = k + 1; x < P->pl.nact[r]; x++) {
        const Action *a = &P->pl.act[r][x];
        int key = action_key(P, a->kind, a->chunk, a->mb);
        receive_inputs(P, l, l->first[key], l->first[key + 1], r, 1);
        if (l->first[key + 1] > l->first[key]) break;
    }
}

static void run_action(Pp *P, const Lists *l, int x, int r) {
    const Graph *g = P->g;
    const Action *a = &P->pl.act[r][x];
    int p = P->pl.p, key = action_key(P, a->kind, a->chunk, a->mb), lo = l->first[key], hi = l->first[key + 1];
    post_next(P, l, x, r);
    receive_inputs(P, l, lo, hi, r, 0);
    for (int q = lo; q < hi; q++) {
        const Node *n = &g->nodes[l->node[q]];
        if (is_output(n, "loss")) continue;
        for (int k = 0; k < n->nin; k++) need(P, n->in[k], r, a->chunk);
        copy_node(P, n, r, a->chunk);
    }
    for (int q = lo; q < hi; q++) { /* then every value another rank reads leaves */
        const Node *n = &g->nodes[l->node[q]];
        for (int k = 0; k < n->nout; k++)
            for (int to = 0; to < p; to++)
                if (P->xfer[n->out[k] * p + to]) send_value(P, n->out[k], to, r, P->tag[n->out[k] * p + to]);
    }
}

/* ---- 5. the step's ends ---- */

/* Rank r's copies of params it shares with another rank: their gradient
 * comes from the rank that sums it (the one holding output grad:<p>). */
typedef struct {
    const char *name;
    int j;
} ParamAt;

static int by_param_name(const void *a, const void *b) {
    const ParamAt *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : x->j - y->j;
}

/* Rank h's params sorted by (name, node), so share_gradients finds a
 * param's first node by its name without reading the whole program for
 * every gradient and rank (quadratic in a long pipeline). */
static ParamAt *params_by_name(const Graph *h, int *n) {
    ParamAt *a = malloc(sizeof(ParamAt) * (size_t)(h->nnodes + 1));
    if (!a) ICE("out of memory");
    *n = 0;
    for (int j = 0; j < h->nnodes; j++)
        if (h->nodes[j].op == OP_param) a[(*n)++] = (ParamAt){ir_attr_s(&h->nodes[j], "name", ""), j};
    qsort(a, (size_t)*n, sizeof(ParamAt), by_param_name);
    return a;
}

/* The first param node named name in a (params_by_name), or -1. */
static int param_named(const ParamAt *a, int n, const char *name) {
    int lo = 0, hi = n;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (strcmp(a[mid].name, name) < 0) lo = mid + 1;
        else hi = mid;
    }
    return lo < n && strcmp(a[lo].name, name) == 0 ? a[lo].j : -1;
}

static void share_gradients(Pp *P, Graph **out) {
    const Graph *g = P->g;
    int p = P->pl.p;
    ParamAt **byname = malloc(sizeof(ParamAt *) * (size_t)p);
    int *nby = malloc(sizeof(int) * (size_t)p);
    if (!byname || !nby) ICE("out of memory");
    for (int r = 0; r < p; r++) byname[r] = params_by_name(out[r], &nby[r]); /* the loop below adds no params */
    for (int i = 0; i < g->nnodes; i++) {
        const Node *o = &g->nodes[i];
        const char *name = ir_attr_s(o, "name", "");
        if (o->op != OP_output || strncmp(name, "grad:", 5) != 0) continue;
        int owner = rank_of(P, P->chunk[i]);
        for (int r = 0; r < p; r++) {
            Graph *h = out[r];
            int pi = param_named(byname[r], nby[r], name + 5);
            if (r == owner || pi < 0) continue;
            Attr *at = ir_alloc(P->m, sizeof(Attr) * (size_t)(h->nodes[pi].nattr + 1));
            memcpy(at, h->nodes[pi].attr, sizeof(Attr) * (size_t)h->nodes[pi].nattr);
            at[h->nodes[pi].nattr] = ir_attr_int(P->m, "replica", 1);
            h->nodes[pi].attr = at, h->nodes[pi].nattr++;
            int tag = P->ntags++;
            Attr s[3], q[3];
            p2p_attrs(P, r - owner, tag, s);
            p2p_attrs(P, owner - r, tag, q);
            Builder bo = {out[owner], "pipeline", o->loc, -1, PH_BWD}, br = {h, "pipeline", o->loc, -1, PH_BWD};
            int x = -1;
            for (int j = 0; j < out[owner]->nnodes; j++)
                if (is_output(&out[owner]->nodes[j], name)) x = out[owner]->nodes[j].in[0];
            if (x < 0) ICE("pipeline: rank %d lost output %s", owner, name);
            ir_build(&bo, OP_send, 1, &x, 3, s, NULL);
            int y = ir_out(h, ir_build(&br, OP_recv_start, 0, NULL, 3, q, &out[owner]->vals[x].t)); /* nothing left to overlap */
            memcpy(h->vals[y].sh, out[owner]->vals[x].sh, sizeof h->vals[0].sh);
            y = ir_out(h, ir_build(&br, OP_recv_done, 1, &y, 3, q, NULL));
            memcpy(h->vals[y].sh, out[owner]->vals[x].sh, sizeof h->vals[0].sh);
            if (P->o->pp_bug == 1) { /* planted: the replica's gradient is zero */
                Attr z = ir_attr_float(P->m, "v", 0.0);
                Type t = h->vals[y].t;
                y = ir_out(h, ir_build(&br, OP_const, 0, NULL, 1, &z, &t));
            }
            Attr nm = ir_attr_str(P->m, "name", name);
            ir_build(&br, OP_output, 1, &y, 1, &nm, NULL);
        }
    }
    for (int r = 0; r < p; r++) free(byname[r]);
    free(byname), free(nby);
}

/* Every rank reports the loss: all-reduce over pp, the others adding 0. */
static void share_loss(Pp *P, Graph **out, int **maps) {
    const Graph *g = P->g;
    for (int i = 0; i < g->nnodes; i++) {
        const Node *o = &g->nodes[i];
        if (!is_output(o, "loss")) continue;
        int owner = rank_of(P, P->chunk[i]);
        for (int r = 0; r < P->pl.p; r++) {
            Builder b = {out[r], "pipeline", o->loc, -1, PH_FWD};
            int x;
            if (r == owner) {
                x = maps[owner][o->in[0]];
            } else {
                Attr z = ir_attr_float(P->m, "v", 0.0);
                x = ir_out(out[r], ir_build(&b, OP_const, 0, NULL, 1, &z, &g->vals[o->in[0]].t));
            }
            Attr at[2] = {ir_attr_str(P->m, "group", "pp"), ir_attr_str(P->m, "name", "loss")};
            int y = ir_build1(&b, OP_allreduce, x, 1, at);
            memcpy(out[r]->vals[y].sh, g->vals[o->in[0]].sh, sizeof g->vals[0].sh);
            ir_build(&b, OP_output, 1, &y, 1, &at[1], NULL);
        }
    }
}

/* ---- the pass ---- */

static void build_rank(Pp *P, const Lists *l, int r, Graph **out, int **maps) {
    P->b = (Builder){out[r], "pipeline", {0}, -1, PH_FWD};
    P->map = maps[r];
    memset(P->got, 0, sizeof(int) * (size_t)P->pl.p);
    memset(P->pgot, 0, sizeof(int) * (size_t)P->pl.p);
    for (int v = 0; v < P->g->nvals; v++) P->posted[v] = -1;
    for (int k = 0; k < P->pl.nact[r]; k++) run_action(P, l, k, r);
}

/* Every anchored node went to its rank exactly once. */
static void check_emitted(Pp *P, int **maps) {
    const Graph *g = P->g;
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        if (P->chunk[i] == FLOAT || n->nout == 0) continue;
        if (maps[rank_of(P, P->chunk[i])][n->out[0]] < 0) {
            char w[160];
            ICE("pipeline: %s %s (chunk %d, %s, mb %d) is in no action of the schedule", ir_ops[n->op].name,
                ir_where(n, w, sizeof w), P->chunk[i], pp_act_names[(int)P->kind[i]], P->mb[i]);
        }
    }
}

void pass_pipeline(Module *m, const Options *o) {
    if (o->pp <= 1) return;
    if (m->nstages != 1) ICE("pipeline: expects one stage, got %d", m->nstages);
    Pp P = {.m = m, .o = o, .g = m->stages[0]};
    char err[256];
    if (ppsched_build(&P.pl, (PpSchedule)o->pp_schedule, o->pp, o->vpp, o->micro_batches, err, sizeof err) != 0 ||
        ppsched_prove(&P.pl, err, sizeof err) != 0)
        error_at(P.g->nnodes ? P.g->nodes[0].loc : (Loc){0}, "%s", err);
    const Graph *g = P.g;
    P.nchunks = P.pl.p * P.pl.v;
    P.chunk = xcalloc((size_t)g->nnodes + 1, sizeof(int));
    P.kind = xcalloc((size_t)g->nnodes + 1, 1);
    P.mb = xcalloc((size_t)g->nnodes + 1, sizeof(int));
    int *of_layer = layer_chunks(&P);
    anchor(&P, of_layer);
    Regroup R = find_sums(&P);
    if (R.any) { /* rebuild the gradient sums shared by ranks, then anchor the new graph */
        P.g = g = regroup(&P, &R, &P.joins);
        free(P.chunk), free(P.kind), free(P.mb);
        P.chunk = xcalloc((size_t)g->nnodes + 1, sizeof(int));
        P.kind = xcalloc((size_t)g->nnodes + 1, 1);
        P.mb = xcalloc((size_t)g->nnodes + 1, sizeof(int));
        anchor(&P, of_layer);
    } else {
        P.joins = xcalloc((size_t)g->nnodes + 1, 1);
    }
    free(R.leaf_of), free(R.last), free(R.interior), free(R.outs);
    if (zero_bubble(&P)) split_backward(&P);
    Lists l = action_lists(&P);
    plan_transfers(&P, &l);
    P.got = xcalloc((size_t)P.pl.p, sizeof(int));
    P.pgot = xcalloc((size_t)P.pl.p, sizeof(int));
    P.posted = xcalloc((size_t)g->nvals + 1, sizeof(int));
    Graph **out = ir_alloc(m, sizeof(Graph *) * (size_t)P.pl.p);
    int **maps = xcalloc((size_t)P.pl.p, sizeof(int *));
    for (int r = 0; r < P.pl.p; r++) {
        out[r] = ir_graph_new(m);
        maps[r] = xcalloc((size_t)g->nvals, sizeof(int));
        for (int v = 0; v < g->nvals; v++) maps[r][v] = -1;
        build_rank(&P, &l, r, out, maps);
    }
    check_emitted(&P, maps);
    share_loss(&P, out, maps);
    share_gradients(&P, out);
    m->stages = out, m->nstages = P.pl.p;
    for (int r = 0; r < P.pl.p; r++) free(maps[r]);
    free(maps), free(of_layer), free(P.chunk), free(P.kind), free(P.mb), free(P.joins), free(P.xfer), free(P.tag), free(P.rtag), free(l.first), free(l.node), free(P.at), free(P.nseq), free(P.got), free(P.pgot), free(P.posted);
    for (int k = 0; k < P.pl.p * P.pl.p; k++) free(P.seq[k]);
    free(P.seq);
    ppsched_free(&P.pl);
}
