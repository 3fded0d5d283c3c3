/* plan_tp.c — `kiln plan MODEL --compare-tp-cp N`: tensor parallel against
 * context parallel at the same degree, side by side (issue 20).
 *
 * The model is compiled twice: `--tp N` (sequence parallel on) and
 * `--cp N --cp-comm p2p` (ring attention).  For each program, per rank:
 *
 *   - comm per layer: the elements (and bytes, at the values' dtype) the
 *     rank sends over the layout's group (tp or cp) in one layer's forward
 *     and backward, measured from the planned program's collectives (an
 *     all-reduce of n elements sends 2n(N-1)/N, an all-gather of a local n
 *     sends n(N-1), a reduce-scatter of n sends n(N-1)/N, a send its
 *     input), averaged over the layers and micro-batches that have any
 *     (the distributed optimizer's param all-gathers, which read its
 *     state and may fall in a layer's forward, are not counted);
 *     beside the forward formula: TP+SP 4·b·s·h·(N-1)/N (two all-gathers
 *     and two reduce-scatters of [b,s,h]); CP 2·b·s·kv_heads·head_dim·
 *     (N-1)/N (K and V travel the ring; DESIGN.md §9.1).  b and s are the
 *     model's global batch (over the micro-batches) and sequence.
 *   - activation bytes per rank: the memory plan's fwd+bwd activation peak.
 *   - the GEMM shapes per rank: the first layer's forward matmuls, as
 *     their operands' local shapes.
 *
 * The comparison is the seeds' thesis in numbers: TP's traffic is the
 * hidden size per token and sits between the GEMMs; CP's is only the kv
 * heads (GQA shrinks it by heads/kv_heads) and can hide behind attention.
 */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "cmd.h"
#include "memplan.h"
#include "passes.h"

typedef struct {
    double el[2], bytes[2]; /* sent per layer and micro-batch: forward, backward */
    double b, s, h, kvh, hd;
} TpCp;

static double sent_elements(const Graph *g, const Node *n, int N) {
    double in = (double)ir_numel(&g->vals[n->in[0]].t), f = (double)(N - 1) / N;
    switch (n->op) {
    case OP_allreduce: return 2 * f * in;
    case OP_allgather: return f * in * N;
    case OP_reducescatter: return f * in;
    case OP_send: return in;
    default: return 0;
    }
}

static TpCp measure(const Module *m, const char *group, int N, int micro_batches) {
    const Graph *g = m->stages[0];
    TpCp r = {0};
    int lo = INT_MAX, hi = INT_MIN;
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        if ((n->op == OP_layernorm || n->op == OP_rmsnorm) && n->layer >= 0 && !r.h) r.h = (double)ir_numel(&g->vals[n->in[1]].t);
        if (n->op == OP_attention && n->phase == PH_FWD && !r.kvh)
            r.kvh = (double)g->vals[n->in[1]].t.dim[1], r.hd = (double)g->vals[n->in[1]].t.dim[3];
        if (!(ir_ops[n->op].flags & F_COMM) || n->nin < 1 || n->layer < 0 || strcmp(ir_attr_s(n, "group", ""), group)) continue;
        if (n->phase != PH_FWD && n->phase != PH_BWD) continue;
        int def = g->vals[n->in[0]].def; /* the distributed optimizer's param gathers read its state: not a layer's */
        if (def >= 0 && g->nodes[def].op == OP_state) continue;
        double e = sent_elements(g, n, N);
        r.el[n->phase == PH_BWD] += e;
        r.bytes[n->phase == PH_BWD] += e * (double)ir_dtype_size(g->vals[n->in[0]].t.dt);
        lo = n->layer < lo ? n->layer : lo, hi = n->layer > hi ? n->layer : hi;
    }
    double per = hi < lo ? 1 : (double)(hi - lo + 1) * micro_batches;
    for (int k = 0; k < 2; k++) r.el[k] /= per, r.bytes[k] /= per;
    return r;
}

static void print_shape(const Type *t) {
    printf("[");
    for (int d = 0; d < t->rank; d++) printf("%s%lld", d ? "," : "", (long long)t->dim[d]);
    printf("]");
}

static void print_gemms(const Module *m) {
    const Graph *g = m->stages[0];
    int layer = INT_MAX, count = 0;
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i].op == OP_matmul && g->nodes[i].phase == PH_FWD && g->nodes[i].layer >= 0 && g->nodes[i].layer < layer)
            layer = g->nodes[i].layer;
    printf("    GEMMs per rank (layer %d forward):", layer == INT_MAX ? -1 : layer);
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        if (n->op != OP_matmul || n->phase != PH_FWD || n->layer != layer) continue;
        printf("%s", count++ % 4 ? "  " : "\n      ");
        print_shape(&g->vals[n->in[0]].t);
        printf("x");
        print_shape(&g->vals[n->in[1]].t);
    }
    printf("\n");
}

static void report(const char *name, const Module *m, const TpCp *r, double formula, const char *fname) {
    printf("  %s\n", name);
    printf("    comm per layer and micro-batch, per rank: forward %.0f elements (%.0f bytes; formula %s = %.0f), backward %.0f elements (%.0f bytes)\n",
           r->el[0], r->bytes[0], fname, formula, r->el[1], r->bytes[1]);
    int64_t act = memplan_fwd_bwd_peak(m);
    printf("    activations per rank (fwd+bwd peak): %lld bytes (%.2f MiB)\n", (long long)act, (double)act / (1 << 20));
    print_gemms(m);
}

void plan_compare_tp_cp(Args *a) {
    int N = a->compare_tp_cp, mb = a->o.micro_batches > 0 ? a->o.micro_batches : 1;
    Args t = *a, c = *a;
    t.o.tp = N, t.o.sp = 1, t.comparison = 1;
    c.o.cp = N, c.o.cp_comm = 1, c.comparison = 1;
    Module *mt = compile(&t);
    Module *mc = compile(&c);
    TpCp rt = measure(mt, "tp", N, mb), rc = measure(mc, "cp", N, mb);
    /* the global b and s: tp's rank holds the whole batch piece and sequence */
    const Graph *g = mt->stages[0];
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i].op == OP_input && g->vals[g->nodes[i].out[0]].t.rank >= 2) {
            rt.b = (double)g->vals[g->nodes[i].out[0]].t.dim[0] / mb, rt.s = (double)g->vals[g->nodes[i].out[0]].t.dim[1];
            break;
        }
    double f = (double)(N - 1) / N;
    printf("tp %d (sequence parallel) vs cp %d (p2p ring): b %.0f s %.0f h %.0f kv_heads %.0f head_dim %.0f\n", N, N, rt.b, rt.s,
           rt.h, rc.kvh, rc.hd);
    report("tp (Megatron + sp)", mt, &rt, 4 * rt.b * rt.s * rt.h * f, "4 b s h (N-1)/N");
    report("cp (ring, p2p)", mc, &rc, 2 * rt.b * rt.s * rc.kvh * rc.hd * f, "2 b s kv_heads head_dim (N-1)/N");
    ir_free(mt);
    ir_free(mc);
}
