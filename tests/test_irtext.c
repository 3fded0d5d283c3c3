/* test_irtext.c — the text form (dump/parse/dot/equality) and the verifier.
 *
 * Modules are built by hand with ir_add_node; every one must survive
 * parse(dump(m)) == m and dump(parse(dump(m))) == dump(m) byte for byte.  One
 * small module is also compared against a dump written out by hand (the
 * independent reference for the format), floats are compared bitwise against
 * the doubles that went in, and a table of malformed texts must each be
 * rejected with one line "bad.ir:LINE: ..." naming the right line.  The
 * verifier tests break a valid graph by editing its arrays directly.
 */
#include <float.h>
#include "testutil.h"

static Loc at(int line) { return (Loc){"models/t.lua", line}; }

/* The dump as a malloc'd string (through a temporary file). */
static char *dump_str(const Module *m) {
    FILE *f = tmpfile();
    assert_non_null(f);
    ir_dump(m, f);
    long n = ftell(f);
    char *buf = malloc((size_t)n + 1);
    rewind(f);
    assert_int_equal(fread(buf, 1, (size_t)n, f), n);
    buf[n] = 0;
    fclose(f);
    return buf;
}

static int add(Graph *g, NodeSpec s) {
    char err[256];
    int n = ir_add_node(g, &s, err, sizeof err);
    if (n < 0) fail_msg("ir_add_node: %s", err);
    return ir_out(g, n);
}

static NodeSpec spec(Op op, int line, int nin, const int *in, int nattr, const Attr *attr) {
    NodeSpec s = ir_spec(op, at(line));
    s.nin = nin, s.in = in, s.nattr = nattr, s.attr = attr;
    return s;
}

/* A source op with a declared type and a name. */
static int source(Graph *g, Op op, Type t, const char *name, int line) {
    Attr a = ir_attr_str(g->m, "name", name);
    NodeSpec s = spec(op, line, 0, NULL, 1, &a);
    s.src_type = &t;
    return add(g, s);
}

static int unary(Graph *g, Op op, int x, int line) { return add(g, spec(op, line, 1, &x, 0, NULL)); }

/* The round trip every module must survive; returns the parsed copy's dump checks done. */
static void roundtrip(const Module *m) {
    char err[512];
    char *d1 = dump_str(m);
    Module *p = ir_parse(d1, "rt.ir", err, sizeof err);
    if (!p) fail_msg("parse of the dump failed: %s\n%s", err, d1);
    assert_true(ir_module_equal(m, p));
    assert_true(ir_module_equal(p, m));
    char *d2 = dump_str(p);
    assert_string_equal(d1, d2);
    ir_free(p);
    free(d1);
    free(d2);
}

/* tokens -> embedding -> matmul(tb) -> gelu -> sums -> loss -> output */
static Module *matmul_chain(void) {
    Module *m = ir_module_new("chain");
    Graph *g = m->stages[0];
    int tok = source(g, OP_input, (Type){DT_I32, 2, {2, 8}}, "tokens", 10);
    int wte = source(g, OP_param, (Type){DT_F32, 2, {16, 8}}, "wte.weight", 11);
    int emb = add(g, spec(OP_embedding, 12, 2, (int[]){wte, tok}, 0, NULL));
    int w = source(g, OP_param, (Type){DT_F32, 2, {4, 8}}, "h.1.w", 13);
    Attr tb = ir_attr_int(m, "tb", 1);
    NodeSpec s = spec(OP_matmul, 14, 2, (int[]){emb, w}, 1, &tb);
    s.layer = 1;
    int mm = add(g, s);
    int ge = unary(g, OP_gelu, mm, 15);
    int x = ge;
    for (int d = 2; d >= 0; d--) {
        Attr dim = ir_attr_int(m, "dim", d);
        x = add(g, spec(OP_sum, 16, 1, &x, 1, &dim));
    }
    int l = unary(g, OP_loss, x, 17);
    Attr name = ir_attr_str(m, "name", "loss");
    add(g, spec(OP_output, 18, 1, &l, 1, &name));
    return m;
}

static void test_matmul_chain(void **state) {
    char err[512];
    Module *m = matmul_chain();
    assert_int_equal(ir_verify_module(m, err, sizeof err), 0);
    roundtrip(m);
    char *d = dump_str(m);
    assert_non_null(strstr(d, "%4:f32[2,8,4] = matmul %2, %3 {tb=1}   # models/t.lua:14 L1 fwd\n"));
    free(d);
    ir_free(m);
}

/* The format against a dump written by hand. */
static void test_golden_text(void **state) {
    Module *m = ir_module_new("tiny");
    Graph *g = m->stages[0];
    int x = source(g, OP_param, (Type){DT_F32, 1, {4}}, "w", 3);
    int y = unary(g, OP_neg, x, 4);
    g->nodes[1].stage = 1, g->nodes[1].mb = 2, g->nodes[1].stream = 0, g->nodes[1].pos = 5;
    g->nodes[1].phase = PH_BWD;
    Attr name = ir_attr_str(m, "name", "y");
    add(g, spec(OP_output, 5, 1, &y, 1, &name));
    g->vals[y].sh[1] = (AxisShard){SH_SPLIT, 0};
    g->vals[y].sh[3] = (AxisShard){SH_PARTIAL, 0};
    const char *want =
        "module tiny mesh=1x1x1x1   # pp x dp x cp x tp\n"
        "stage 0\n"
        "%0:f32[4] = param {name=\"w\"}   # models/t.lua:3 L-1 fwd\n"
        "%1:f32[4]<dp=s0,tp=p> = neg %0   # models/t.lua:4 L-1 bwd st1 mb2 stream0 pos5\n"
        "output %1 {name=\"y\"}   # models/t.lua:5 L-1 fwd\n";
    char *d = dump_str(m);
    assert_string_equal(d, want);
    char err[256];
    Module *p = ir_parse(want, "want.ir", err, sizeof err);
    assert_non_null(p);
    assert_true(ir_module_equal(m, p));
    assert_int_equal(p->stages[0]->nodes[1].pos, 5);
    assert_int_equal(p->stages[0]->vals[1].sh[1].kind, SH_SPLIT);
    ir_free(p);
    free(d);
    ir_free(m);
}

static void test_attention_two_outputs(void **state) {
    Module *m = ir_module_new("attn");
    Graph *g = m->stages[0];
    int q = source(g, OP_param, (Type){DT_F32, 4, {2, 4, 8, 16}}, "q", 1);
    int k = source(g, OP_param, (Type){DT_F32, 4, {2, 2, 8, 16}}, "k", 2);
    int v = source(g, OP_param, (Type){DT_F32, 4, {2, 2, 8, 16}}, "v", 3);
    Attr at2[2] = {ir_attr_int(m, "causal", 1), ir_attr_float(m, "scale", 0.25)};
    NodeSpec s = spec(OP_attention, 4, 3, (int[]){q, k, v}, 2, at2);
    s.layer = 0;
    int n = ir_add_node(g, &s, NULL, 0);
    assert_int_equal(n, 3);
    int o = g->nodes[n].out[0], lse = g->nodes[n].out[1];
    Attr name = ir_attr_str(m, "name", "lse");
    add(g, spec(OP_output, 5, 1, &lse, 1, &name));
    name = ir_attr_str(m, "name", "o");
    add(g, spec(OP_output, 6, 1, &o, 1, &name));
    char err[256];
    assert_int_equal(ir_verify_module(m, err, sizeof err), 0);
    roundtrip(m);
    char *d = dump_str(m);
    assert_non_null(strstr(d, "\n%3:f32[2,4,8,16], %4:f32[2,4,8] = attention %0, %1, %2 {causal=1, scale=0.25}   # models/t.lua:4 L0 fwd\n"));
    free(d);
    ir_free(m);
}

static uint64_t bits(double d) {
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
}

static void test_attr_kinds(void **state) {
    static const double fl[] = {0.1, 1e-300, INFINITY, -INFINITY, -0.0, 1.0, 5e-324, DBL_MAX, -2.5e17, 1.0 / 3, 123456789.0};
    enum { NF = sizeof fl / sizeof fl[0] };
    Module *m = ir_module_new("attrs");
    Graph *g = m->stages[0];
    Attr a[NF + 8];
    int n = 0;
    a[n++] = ir_attr_float(m, "v", 0.1);
    for (int i = 0; i < NF; i++) {
        char key[8];
        snprintf(key, sizeof key, "f%d", i);
        a[n++] = ir_attr_float(m, key, fl[i]);
    }
    a[n++] = ir_attr_float(m, "fnan", NAN);
    a[n++] = ir_attr_int(m, "imin", INT64_MIN);
    a[n++] = ir_attr_int(m, "imax", INT64_MAX);
    a[n++] = ir_attr_str(m, "s", "he said \"hi\"\nback\\slash\ttab\x01 #x");
    a[n++] = ir_attr_str(m, "empty", "");
    a[n++] = ir_attr_ints(m, "none", NULL, 0);
    a[n++] = ir_attr_ints(m, "list", (int64_t[]){1, -2, 3000000000000}, 3);
    NodeSpec s = spec(OP_const, 1, 0, NULL, n, a);
    Type t = {DT_BF16, 0, {0}};
    s.src_type = &t;
    add(g, s);
    roundtrip(m);

    char *d = dump_str(m);
    const char *want[] = {"{v=0.1, f0=0.1, f1=1e-300, f2=inf, f3=-inf, f4=-0.0, f5=1.0, f6=5e-324, f7=1.7976931348623157e+308, f8=-2.5e+17, f9=0.3333333333333333, f10=123456789.0, ",
                          "fnan=nan, imin=-9223372036854775808, imax=9223372036854775807, ",
                          "s=\"he said \\\"hi\\\"\\nback\\\\slash\\ttab\\x01 #x\", empty=\"\", none=[], list=[1,-2,3000000000000]}",
                          "%0:bf16[] = const "};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        if (!strstr(d, want[i])) fail_msg("dump lacks %s:\n%s", want[i], d);
    char err[256];
    Module *p = ir_parse(d, "attrs.ir", err, sizeof err);
    assert_non_null(p);
    const Node *pn = &p->stages[0]->nodes[0];
    for (int i = 0; i < NF; i++) {
        char key[8];
        snprintf(key, sizeof key, "f%d", i);
        const Attr *pa = ir_attr(pn, key);
        assert_non_null(pa);
        assert_int_equal(pa->kind, AT_FLOAT);
        assert_true(bits(pa->f) == bits(fl[i]));
    }
    assert_true(isnan(ir_attr_f(pn, "fnan", 0)));
    assert_true(ir_attr(pn, "imin")->kind == AT_INT && ir_attr(pn, "imin")->i == INT64_MIN);
    assert_string_equal(ir_attr_s(pn, "s", ""), "he said \"hi\"\nback\\slash\ttab\x01 #x");
    assert_int_equal(ir_attr(pn, "none")->n, 0);
    assert_true(ir_attr(pn, "list")->v[2] == 3000000000000);
    /* ir_module_equal sees a changed float, string, list or int */
    Node *mn = &g->nodes[0];
    mn->attr[2].f = 1.0000000000000002e-300;
    assert_false(ir_module_equal(m, p));
    mn->attr[2].f = 1e-300;
    assert_true(ir_module_equal(m, p));
    mn->attr[NF + 3].i = 0;
    assert_false(ir_module_equal(m, p));
    ir_free(p);
    free(d);
    ir_free(m);
}

/* Several stages, every piece of metadata, awkward file and module names. */
static void test_stages_and_metadata(void **state) {
    Module *m = ir_module_new("my model #2");
    m->mesh[0] = 2, m->mesh[1] = 3, m->mesh[3] = 2;
    Graph *g1 = ir_graph_new(m);
    Graph **st = ir_alloc(m, 2 * sizeof *st);
    st[0] = m->stages[0], st[1] = g1;
    m->stages = st, m->nstages = 2;
    const char *files[] = {"my dir/#x \"q\".lua", "?", "a:b.lua", "", "models/t.lua"};
    for (int s = 0; s < 2; s++) {
        Graph *g = m->stages[s];
        int x = source(g, OP_param, (Type){DT_F16, 3, {2, 3, 4}}, "w", 1);
        for (int i = 0; i < 5; i++) {
            x = unary(g, OP_exp, x, 100 + i);
            Node *n = &g->nodes[g->nnodes - 1];
            n->loc.file = ir_intern(m, files[i]);
            n->layer = i, n->phase = (Phase)(i % PH_COUNT), n->stage = s, n->vstage = i, n->mb = 7 - i;
            n->stream = i - 1, n->pos = i ? 10 * i : -1;
            g->vals[x].sh[i % IR_NAXES] = (AxisShard){i % 2 ? SH_PARTIAL : SH_SPLIT, i % 3};
        }
    }
    m->stages[0]->nodes[1].loc = (Loc){NULL, 0};
    m->stages[0]->nodes[2].loc.line = -3;
    roundtrip(m);
    char *d = dump_str(m);
    const char *want[] = {"module \"my model #2\" mesh=2x3x1x2   #",
                          "\n\nstage 1\n",
                          "%1:f16[2,3,4]<pp=s0> = exp %0   # ?:0 L0 fwd mb7\n",
                          "# \"?\":-3 L1 bwd v1 mb6 stream0 pos10\n",
                          "%3:f16[2,3,4]<cp=s2> = exp %2   # a:b.lua:102 L2 recompute v2 mb5 stream1 pos20\n",
                          "%4:f16[2,3,4]<tp=p> = exp %3   # \"\":103 L3 opt v3 mb4 stream2 pos30\n",
                          "# models/t.lua:104 L4 wgrad st1 v4 mb3 stream3 pos40\n",
                          "%1:f16[2,3,4]<pp=s0> = exp %0   # \"my dir/#x \\\"q\\\".lua\":100 L0 fwd st1 mb7\n"};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        if (!strstr(d, want[i])) fail_msg("dump lacks %s:\n%s", want[i], d);
    /* the awkward file names survive exactly */
    Module *p = ir_parse(d, "st.ir", NULL, 0);
    assert_non_null(p);
    assert_int_equal(p->nstages, 2);
    assert_string_equal(p->name, "my model #2");
    assert_null(p->stages[0]->nodes[1].loc.file);
    assert_string_equal(p->stages[1]->nodes[1].loc.file, files[0]);
    assert_string_equal(p->stages[0]->nodes[2].loc.file, "?");
    assert_int_equal(p->stages[0]->nodes[2].loc.line, -3);
    assert_string_equal(p->stages[0]->nodes[4].loc.file, "");
    /* ir_module_equal sees metadata changes */
    p->stages[1]->nodes[3].mb++;
    assert_false(ir_module_equal(m, p));
    p->stages[1]->nodes[3].mb--;
    p->stages[0]->vals[1].sh[0].dim = 1; /* pp=s0 -> pp=s1 */
    assert_false(ir_module_equal(m, p));
    ir_free(p);
    free(d);
    ir_free(m);
}

/* Names become ids: any order, gaps are dead placeholder values. */
static void test_parse_names(void **state) {
    const char *text =
        "# a hand-written module\n"
        "module hand mesh=1x2x1x1\n"
        "\n"
        "stage 0\n"
        "%50:f32[3] = param {name=\"a\", init=\"normal\", std=0.02}   # h.lua:1 L-1 fwd\n"
        "   %7:f32[3] = add %50, %50   # h.lua:2 L0 fwd\n"
        "output %7 {name=\"out\"}   # h.lua:3 L-1 fwd\n";
    char err[256];
    Module *m = ir_parse(text, "hand.ir", err, sizeof err);
    if (!m) fail_msg("%s", err);
    assert_int_equal(m->mesh[1], 2);
    Graph *g = m->stages[0];
    assert_int_equal(g->nnodes, 3);
    assert_int_equal(g->nvals, 51);
    assert_int_equal(g->nodes[0].out[0], 50);
    assert_int_equal(g->nodes[1].in[0], 50);
    assert_int_equal(g->nodes[1].in[1], 50);
    assert_int_equal(g->nodes[1].out[0], 7);
    assert_int_equal(g->nodes[2].in[0], 7);
    assert_int_equal(g->vals[7].def, 1);
    assert_int_equal(g->vals[50].def, 0);
    assert_int_equal(g->vals[3].def, -1);
    assert_true(ir_attr_f(&g->nodes[0], "std", 0) == 0.02);
    assert_int_equal(ir_verify_module(m, err, sizeof err), 0);
    char *d = dump_str(m);
    assert_non_null(strstr(d, "\n%7:f32[3] = add %50, %50   # h.lua:2 L0 fwd\n"));
    free(d);
    roundtrip(m);
    ir_free(m);

    /* out of order: kept */
    text = "module o mesh=1x1x1x1\nstage 0\n"
           "%1:f32[3] = param {name=\"a\"}   # h.lua:1 L-1 fwd\n"
           "%0:f32[3] = neg %1   # h.lua:2 L-1 fwd\n";
    m = ir_parse(text, "o.ir", err, sizeof err);
    assert_non_null(m);
    assert_int_equal(ir_verify_module(m, err, sizeof err), 0);
    d = dump_str(m);
    assert_string_equal(d, "module o mesh=1x1x1x1   # pp x dp x cp x tp\nstage 0\n"
                           "%1:f32[3] = param {name=\"a\"}   # h.lua:1 L-1 fwd\n"
                           "%0:f32[3] = neg %1   # h.lua:2 L-1 fwd\n");
    free(d);
    roundtrip(m);
    ir_free(m);

    /* far above the value count: renumbered in definition order */
    text = "module r mesh=1x1x1x1\nstage 0\n"
           "%5000000:f32[3] = param {name=\"a\"}   # h.lua:1 L-1 fwd\n"
           "%9:f32[3] = neg %5000000   # h.lua:2 L-1 fwd\n";
    m = ir_parse(text, "r.ir", err, sizeof err);
    assert_non_null(m);
    assert_int_equal(m->stages[0]->nvals, 2);
    d = dump_str(m);
    assert_non_null(strstr(d, "%1:f32[3] = neg %0   #"));
    free(d);
    roundtrip(m);
    ir_free(m);
}

static void test_dot(void **state) {
    Module *m = matmul_chain();
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    ir_dump_dot(m, f);
    fclose(f);
    assert_true(strncmp(buf, "digraph \"chain\" {", 17) == 0);
    const char *want[] = {"matmul", "embedding", "gelu", "param \\\"wte.weight\\\"", "cluster_s0_l1", "s0_n2 -> s0_n4;",
                          "%4:f32[2,8,4]"};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        if (!strstr(buf, want[i])) fail_msg("dot lacks %s:\n%s", want[i], buf);
    assert_int_equal(buf[n - 2], '}');
    free(buf);
    ir_free(m);
}

/* Every model after every pass so far: verifies, and survives the round trip. */
static void test_models(void **state) {
    static const KeyVal small[] = {{"layers", "2"}, {"dim", "64"}, {"heads", "4"}, {"kv_heads", "2"},
                                   {"ffn", "128"},  {"vocab", "256"}, {"seq", "32"}, {"batch", "2"}};
    const char *models[] = {"models/tiny.lua", "models/gpt2.lua", "models/llama.lua"};
    for (int i = 0; i < 3; i++) {
        Options o;
        char err[1024];
        opt_defaults(&o);
        if (i == 2) o.sets = (KeyVal *)small, o.nsets = 8;
        Module *m = fe_load(models[i], &o, err, sizeof err);
        if (!m) fail_msg("%s", err);
        PassFn passes[] = {NULL, pass_autodiff, pass_optimizer};
        for (int k = 0; k < 3; k++) {
            if (passes[k]) passes[k](m, &o);
            if (ir_verify_module(m, err, sizeof err)) fail_msg("%s after pass %d: %s", models[i], k, err);
            roundtrip(m);
        }
        ir_free(m);
    }
}

/* ---- malformed input: NULL and one line "bad.ir:LINE: ..." ---- */

#define H "module t mesh=1x1x1x1\nstage 0\n"
#define W "%0:f32[4] = param {name=\"w\"}   # a.lua:1 L-1 fwd\n"
#define M "   # a.lua:2 L-1 fwd\n"

static const struct {
    const char *text;
    int line;
    const char *msg; /* a piece of the message */
} bad_texts[] = {
    {"", 1, "no 'module' line"},
    {"# just a comment\n\n", 1, "no 'module' line"},
    {"stage 0\n", 1, "expected 'module"},
    {"module t mesh=1x1x1\n", 1, "expected 'x'"},
    {"module t mesh=0x1x1x1\n", 1, "mesh size out of range"},
    {"module t mesh=65536x65536x1x1\n", 1, "mesh of more than"},
    {"module t\n", 1, "expected mesh="},
    {"module t mesh=1x1x1x1\nmodule u mesh=1x1x1x1\n", 2, "second 'module'"},
    {"module t mesh=1x1x1x1\n" W, 2, "before the first 'stage'"},
    {H "stage 0\n", 3, "expected stage 1"},
    {H "%0:f32[4] = frobnicate" M, 3, "unknown op 'frobnicate'"},
    {H "!!!\n", 3, "expected an op"},
    {H "%0:f33[4] = param {name=\"w\"}" M, 3, "unknown dtype"},
    {H W "%1:f32[4] = add %0" M, 4, "add takes 2 inputs, not 1"},
    {H W "output %0, %0 {name=\"x\"}" M, 4, "output takes 1 input, not 2"},
    {H W "%1:f32[4], %2:f32[4] = neg %0" M, 4, "neg has 1 output, not 2"},
    {H W "%1:f32[4] = neg %7" M, 4, "%7 is not defined"},
    {H W "%0:f32[4] = neg %0" M, 4, "%0 defined twice"},
    {H W "%1:f32[4] = neg %1" M, 4, "%1 is not defined"},
    {H "%0:f32[4] = param {name=\"w\", name=\"v\"}" M, 3, "attribute name given twice"},
    {H W "%1:f32[5] = neg %0" M, 4, "declared f32[5] but the op gives f32[4]"},
    {H W "%1:bf16[4] = neg %0" M, 4, "declared bf16[4]"},
    {H W "%1:f32[4] = matmul %0, %0" M, 4, "matmul"},
    {H W "output %0" M, 4, "needs a name"},
    {H "%0:f32[4] = param {name=\"w\"}   # a.lua:1 L-1\n", 3, "expected a phase"},
    {H "%0:f32[4] = param {name=\"w\"}\n", 3, "expected '#'"},
    {H "%0:f32[4\n", 3, "expected ',' or ']'"},
    {H "%0:f32[4] = param {name=\"w\"   # a.lua:1 L-1 fwd\n", 3, "expected ',' or '}'"},
    {H "%0:f32[1,1,1,1,1,1] = param {name=\"w\"}" M, 3, "rank above 5"},
    {H "%0:f32[-4] = param {name=\"w\"}" M, 3, "dim out of range"},
    {H "%0:f32[0] = param {name=\"w\"}" M, 3, "dim out of range"},
    {H "%0:f32[16777216,16777216,2] = param {name=\"w\"}" M, 3, "more than 2^48"},
    {H "%0:f32[99999999999999999999999] = param {name=\"w\"}" M, 3, "out of range"},
    {H "%99999999999:f32[4] = param {name=\"w\"}" M, 3, "value number out of range"},
    {H "%0:f32[4] = param {name=\"w\", x=99999999999999999999}" M, 3, "integer out of range"},
    {H "%0:f32[4] = param {name=\"w\", x=1e999}" M, 3, "float out of range"},
    {H "%0:f32[4] = param {name=\"w\", x=1.2.3}" M, 3, "bad value for x"},
    {H "%0:f32[4] = param {name=\"w\", x=[1,2}" M, 3, "expected ',' or ']'"},
    {H "%0:f32[4] = param {name=\"w}   # a.lua:1 L-1 fwd\n", 3, "unterminated string"},
    {H "%0:f32[4] = param {name=\"w\\q\"}" M, 3, "bad escape"},
    {H "%0:f32[4] = param {name=\"w\"}   # a.lua:1 L-1 sideways\n", 3, "unknown phase 'sideways'"},
    {H "%0:f32[4] = param {name=\"w\"}   # a.lua:1 L-1 fwd pos3 stream1\n", 3, "in this order"},
    {H "%0:f32[4] = param {name=\"w\"}   # a.lua:1 L-1 fwd extra\n", 3, "unexpected"},
    {H "%0:f32[4] = param {name=\"w\"}   # a.lua L-1 fwd\n", 3, "expected file:line"},
    {H "%0:f32[4] = param {name=\"w\"}   # a.lua:99999999999 L-1 fwd\n", 3, "line number out of range"},
    {H "%0:f32[4]<dp=s1> = param {name=\"w\"}" M, 3, "split dim out of range"},
    {H "%0:f32[]<dp=s0> = param {name=\"w\"}" M, 3, "scalar cannot be split"},
    {H "%0:f32[4]<xx=p> = param {name=\"w\"}" M, 3, "unknown mesh axis"},
    {H "%0:f32[4]<dp=p,dp=s0> = param {name=\"w\"}" M, 3, "sharded twice"},
    {H W "output %0 {name=\"x\"} trailing" M, 4, "expected '#'"},
    {H "\n# comment\n\n%0:f32[4] = bogus" M, 6, "unknown op 'bogus'"},
    {H W "stage 1\n%1:f32[4] = neg %0" M, 5, "%0 is not defined"},
    {H "%0:i32[4] = param {name=\"w\"}" M, 3, "param: must be a float"},
    {H "%0:f32[4] = param {name=\"w\", x=1, x=2}" M, 3, "attribute x given twice"},
};

static void test_too_many_attrs(void **state) {
    size_t cap = 16384, n = 0;
    char *t = malloc(cap), err[256];
    n += (size_t)snprintf(t + n, cap - n, H "%%0:f32[4] = param {name=\"w\"");
    for (int i = 0; i < 300; i++) n += (size_t)snprintf(t + n, cap - n, ", a%d=%d", i, i);
    snprintf(t + n, cap - n, "}" M);
    assert_null(ir_parse(t, "bad.ir", err, sizeof err));
    assert_non_null(strstr(err, "bad.ir:3: more than 256 attributes"));
    free(t);
}

/* ir_parse_file, as the commands read a .ir (issue 17): a NUL byte is an
 * error at its line (ir_parse would stop reading there); names are defined
 * once per stage; the verifier's error names the .ir line; a dump that stops
 * before the passes the command needs is refused in one line. */
static void test_parse_file(void **state) {
    char err[512];
    static const char nul[] = H "%0:f32[4] = param {name=\"w\"}" M "\0%1:f32[4] = neg %0" M;
    assert_null(ir_parse_file(nul, sizeof nul - 1, "n.ir", NULL, err, sizeof err));
    assert_string_equal(err, "n.ir:4: a NUL byte (a .ir file is text)");

    static const char dup[] = H "%0:f32[4] = param {name=\"w\"}" M "%1:f32[4] = input {name=\"w\"}" M;
    assert_null(ir_parse_file(dup, strlen(dup), "d.ir", NULL, err, sizeof err));
    assert_string_equal(err, "d.ir:4: param/input/state name \"w\" defined twice (first at line 3)");
    static const char dupout[] = H "%0:f32[4] = param {name=\"w\"}" M "output %0 {name=\"y\"}" M "output %0 {name=\"y\"}" M;
    assert_null(ir_parse(dupout, "o.ir", err, sizeof err));
    assert_string_equal(err, "o.ir:5: output name \"y\" defined twice (first at line 4)");

    /* parses (the parser checks shapes), but the verifier wants stream and pos together */
    static const char unver[] = H "%0:f32[4] = param {name=\"w\"}" M "\n%1:f32[4] = neg %0   # a.lua:7 L-1 fwd pos1\n";
    Module *m = ir_parse(unver, "v.ir", err, sizeof err);
    assert_non_null(m);
    ir_free(m);
    assert_null(ir_parse_file(unver, strlen(unver), "v.ir", NULL, err, sizeof err));
    if (strncmp(err, "v.ir:5: a.lua:7: node 1 (neg): ", 31) != 0) fail_msg("got \"%s\"", err);

    static const char front[] = H "%0:f32[4] = param {name=\"w\"}" M;
    assert_null(ir_parse_file(front, strlen(front), "f.ir", "memplan", err, sizeof err));
    assert_non_null(strstr(err, "f.ir: the dump stops after front, and this command needs the passes up to memplan"));
    assert_null(strchr(err, '\n'));
    m = ir_parse_file(front, strlen(front), "f.ir", NULL, err, sizeof err);
    assert_non_null(m);
    assert_string_equal(ir_last_pass(m), "front");
    ir_free(m);
}

static void test_malformed(void **state) {
    for (size_t i = 0; i < sizeof bad_texts / sizeof *bad_texts; i++) {
        char err[512], prefix[32];
        strcpy(err, "untouched");
        Module *m = ir_parse(bad_texts[i].text, "bad.ir", err, sizeof err);
        if (m) fail_msg("case %zu parsed:\n%s", i, bad_texts[i].text);
        snprintf(prefix, sizeof prefix, "bad.ir:%d: ", bad_texts[i].line);
        if (strncmp(err, prefix, strlen(prefix)) != 0 || !strstr(err, bad_texts[i].msg) || strchr(err, '\n'))
            fail_msg("case %zu: want \"%s...%s\", got \"%s\"", i, prefix, bad_texts[i].msg, err);
    }
}

/* A truncated copy of a good dump never crashes and never parses into something else silently. */
static void test_truncations(void **state) {
    Module *m = matmul_chain();
    char *d = dump_str(m);
    size_t n = strlen(d);
    /* cuts on the module line after the mesh only lose its comment */
    size_t lo = (size_t)(strstr(d, "1x1x1x1") - d) + 7, hi = (size_t)(strchr(d, '\n') - d);
    for (size_t k = 0; k < n; k++) {
        char *t = strndup(d, k), err[512];
        Module *p = ir_parse(t, "trunc.ir", err, sizeof err);
        if (p) {
            /* only cuts at a line end or in the module line's comment can parse */
            if (!(d[k] == '\n' || d[k - 1] == '\n' || (k >= lo && k < hi)))
                fail_msg("cut at %zu parsed: ...%s", k, t + (k > 40 ? k - 40 : 0));
            ir_free(p);
        } else {
            assert_non_null(strstr(err, "trunc.ir:"));
            assert_null(strchr(err, '\n'));
        }
        free(t);
    }
    free(d);
    ir_free(m);
}

/* ---- verifier ---- */

/* p = param; a = neg p; b = exp a; output b   (lines 1..4) */
static Module *small(void) {
    Module *m = ir_module_new("v");
    Graph *g = m->stages[0];
    int p = source(g, OP_param, (Type){DT_F32, 2, {4, 6}}, "p", 1);
    int a = unary(g, OP_neg, p, 2);
    int b = unary(g, OP_exp, a, 3);
    Attr name = ir_attr_str(m, "name", "b");
    add(g, spec(OP_output, 4, 1, &b, 1, &name));
    return m;
}

static void expect_bad(Module *m, const char *prefix, const char *msg) {
    char err[512];
    assert_int_equal(ir_verify_module(m, err, sizeof err), -1);
    if (strncmp(err, prefix, strlen(prefix)) != 0 || !strstr(err, msg)) fail_msg("want \"%s...%s\", got \"%s\"", prefix, msg, err);
    ir_free(m);
}

static void test_verify_good(void **state) {
    char err[256] = "";
    Module *m = small();
    assert_int_equal(ir_verify_module(m, err, sizeof err), 0);
    assert_string_equal(err, "");
    ir_free(m);
}

static void test_verify_use_before_def(void **state) {
    Module *m = small();
    m->stages[0]->nodes[1].in[0] = 2; /* neg reads exp's output */
    expect_bad(m, "models/t.lua:2: node 1 (neg):", "used before its definition");
}

static void test_verify_bad_input_id(void **state) {
    Module *m = small();
    m->stages[0]->nodes[2].in[0] = 99;
    expect_bad(m, "models/t.lua:3: node 2 (exp):", "not a value");
}

static void test_verify_wrong_type(void **state) {
    Module *m = small();
    m->stages[0]->vals[2].t.dim[1] = 7; /* exp's output */
    expect_bad(m, "models/t.lua:3: node 2 (exp):", "f32[4,7] but the op gives f32[4,6]");
}

static void test_verify_wrong_dtype(void **state) {
    Module *m = small();
    m->stages[0]->vals[1].t.dt = DT_BF16; /* neg's output */
    expect_bad(m, "models/t.lua:2: node 1 (neg):", "bf16[4,6] but the op gives f32[4,6]");
}

static void test_verify_bad_source(void **state) {
    Module *m = small();
    m->stages[0]->vals[0].t.dt = DT_I32; /* a param must be float */
    expect_bad(m, "models/t.lua:1: node 0 (param):", "float");
}

static void test_verify_missing_loc(void **state) {
    Module *m = small();
    m->stages[0]->nodes[2].loc = (Loc){NULL, 0};
    expect_bad(m, "?:0: node 2 (exp):", "no source location");
}

static void test_verify_double_def(void **state) {
    Module *m = small();
    m->stages[0]->nodes[2].out[0] = 1; /* exp claims neg's output */
    expect_bad(m, "models/t.lua:3: node 2 (exp):", "defined twice");
}

static void test_verify_stale_def(void **state) {
    Module *m = small();
    m->stages[0]->vals[2].defout = 1;
    expect_bad(m, "models/t.lua:3: node 2 (exp):", "defined twice");
}

static void test_verify_arity(void **state) {
    Module *m = small();
    m->stages[0]->nodes[3].nin = 0;
    expect_bad(m, "models/t.lua:4: node 3 (output):", "0 inputs");
}

static void test_verify_stream_pos(void **state) {
    Module *m = small();
    m->stages[0]->nodes[1].stream = 0;
    expect_bad(m, "models/t.lua:2: node 1 (neg):", "stream 0 and pos -1");
}

static void test_verify_phase(void **state) {
    Module *m = small();
    m->stages[0]->nodes[1].phase = PH_COUNT;
    expect_bad(m, "models/t.lua:2: node 1 (neg):", "bad phase");
}

static void test_verify_sharding(void **state) {
    Module *m = small();
    m->stages[0]->vals[1].sh[3] = (AxisShard){SH_SPLIT, 2};
    expect_bad(m, "models/t.lua:2: node 1 (neg):", "split on dim 2 along tp but has rank 2");
}

static void test_verify_mesh(void **state) {
    Module *m = small();
    m->mesh[2] = 0;
    expect_bad(m, "?:0: module v: mesh cp=0", "must be >= 1");
}

static void test_verify_dup_attr(void **state) {
    Module *m = small();
    Graph *g = m->stages[0];
    Attr *a = ir_alloc(m, 2 * sizeof *a);
    a[0] = a[1] = ir_attr_str(m, "name", "b");
    g->nodes[3].attr = a, g->nodes[3].nattr = 2;
    expect_bad(m, "models/t.lua:4: node 3 (output):", "given twice");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul_chain),
        cmocka_unit_test(test_golden_text),
        cmocka_unit_test(test_attention_two_outputs),
        cmocka_unit_test(test_attr_kinds),
        cmocka_unit_test(test_stages_and_metadata),
        cmocka_unit_test(test_parse_names),
        cmocka_unit_test(test_dot),
        cmocka_unit_test(test_models),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_parse_file),
        cmocka_unit_test(test_too_many_attrs),
        cmocka_unit_test(test_truncations),
        cmocka_unit_test(test_verify_good),
        cmocka_unit_test(test_verify_use_before_def),
        cmocka_unit_test(test_verify_bad_input_id),
        cmocka_unit_test(test_verify_wrong_type),
        cmocka_unit_test(test_verify_wrong_dtype),
        cmocka_unit_test(test_verify_bad_source),
        cmocka_unit_test(test_verify_missing_loc),
        cmocka_unit_test(test_verify_double_def),
        cmocka_unit_test(test_verify_stale_def),
        cmocka_unit_test(test_verify_arity),
        cmocka_unit_test(test_verify_stream_pos),
        cmocka_unit_test(test_verify_phase),
        cmocka_unit_test(test_verify_sharding),
        cmocka_unit_test(test_verify_mesh),
        cmocka_unit_test(test_verify_dup_attr),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
