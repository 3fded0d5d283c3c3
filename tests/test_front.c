/* test_front.c — the Lua front end (front_lua.c) and the model files.
 *
 * The three models load and verify; their parameter element counts equal
 * closed-form counts written here from the architectures (and GPT-2 124M's
 * the published 124,475,904 with the vocabulary padded to 50304); GQA keeps
 * kv_heads K/V heads; every node is forward, in stage 0, and located in the
 * model file.  --set overrides config{} values and writes optimizer keys into
 * Options; an unknown key is an error.  A small model written to a temporary
 * file checks each primitive's shape rules and Lua-side fields with assert()
 * (an assert failure comes back as a load error), and the C side checks the
 * attributes the primitives wrote.  Last, every file in tests/bad/ is one test:
 * its first line says `-- expect: LINE: SUBSTRING`, and fe_load must fail with
 * one line starting "tests/bad/<file>.lua:LINE:" and containing SUBSTRING.
 *
 * Run from the repository root (tests/run.sh does).
 */
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>
#include "testutil.h"

static char err[2048];

static Options opts(void) {
    Options o;
    opt_defaults(&o);
    return o;
}

static Options opts_with(KeyVal *sets, int n) {
    Options o = opts();
    o.sets = sets;
    o.nsets = n;
    return o;
}

static Module *load_ok(const char *path, Options *o) {
    Module *m = fe_load(path, o, err, sizeof err);
    if (!m) fail_msg("fe_load(%s): %s", path, err);
    if (ir_verify_module(m, err, sizeof err) != 0) fail_msg("ir_verify_module(%s): %s", path, err);
    return m;
}

static Graph *g0(Module *m) {
    assert_int_equal(m->nstages, 1);
    return m->stages[0];
}

static int64_t param_elements(Module *m, int *count) {
    Graph *g = g0(m);
    int64_t n = 0;
    *count = 0;
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i].op == OP_param) {
            n += ir_numel(&g->vals[g->nodes[i].out[0]].t);
            ++*count;
        }
    return n;
}

static const Node *find_param(Module *m, const char *name) {
    Graph *g = g0(m);
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i].op == OP_param && strcmp(ir_attr_s(&g->nodes[i], "name", ""), name) == 0)
            return &g->nodes[i];
    fail_msg("no param %s", name);
    return NULL;
}

static const Type *out_type(Module *m, const Node *n) { return &g0(m)->vals[n->out[0]].t; }
static const Type *in_type(Module *m, const Node *n, int i) { return &g0(m)->vals[n->in[i]].t; }

static void assert_shape(const Type *t, DType dt, int rank, const int64_t *dim) {
    char a[96];
    assert_int_equal(t->dt, dt);
    assert_int_equal(t->rank, rank);
    for (int i = 0; i < rank; i++)
        if (t->dim[i] != dim[i]) fail_msg("shape %s: dim %d is not %lld", ir_type_str(t, a, sizeof a), i, (long long)dim[i]);
}
#define SHAPE(t, dt, ...) assert_shape(t, dt, sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t), (int64_t[]){__VA_ARGS__})

static int count_op(Module *m, Op op) {
    Graph *g = g0(m);
    int n = 0;
    for (int i = 0; i < g->nnodes; i++) n += g->nodes[i].op == op;
    return n;
}

static const Node *nth_op(Module *m, Op op, int k) {
    Graph *g = g0(m);
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i].op == op && k-- == 0) return &g->nodes[i];
    fail_msg("no %s number %d", ir_ops[op].name, k);
    return NULL;
}

/* Every node: forward, stage 0, located in `file`, params named h.<i>.* in layer i. */
static void check_nodes(Module *m, const char *file) {
    Graph *g = g0(m);
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        assert_int_equal(n->phase, PH_FWD);
        assert_int_equal(n->stage, 0);
        assert_non_null(n->loc.file);
        assert_string_equal(n->loc.file, file);
        assert_true(n->loc.line >= 1);
        if (n->op == OP_param) {
            int layer = -1;
            sscanf(ir_attr_s(n, "name", ""), "h.%d.", &layer);
            assert_int_equal(n->layer, layer);
        }
    }
    /* exactly one loss, exposed as output "loss", a scalar f32; before it
     * output "logits" f32[B,T,V] for kiln sample */
    assert_int_equal(count_op(m, OP_loss), 1);
    assert_int_equal(count_op(m, OP_output), 2);
    const Node *logits = nth_op(m, OP_output, 0), *out = nth_op(m, OP_output, 1);
    assert_string_equal(ir_attr_s(logits, "name", ""), "logits");
    assert_int_equal(in_type(m, logits, 0)->rank, 3);
    assert_string_equal(ir_attr_s(out, "name", ""), "loss");
    assert_int_equal(in_type(m, out, 0)->dt, DT_F32);
    assert_int_equal(in_type(m, out, 0)->rank, 0);
}

static void check_inputs(Module *m, int64_t batch, int64_t seq) {
    for (int k = 0; k < 2; k++) {
        const Node *n = nth_op(m, OP_input, k);
        assert_string_equal(ir_attr_s(n, "name", ""), k ? "targets" : "tokens");
        SHAPE(out_type(m, n), DT_I32, batch, seq);
    }
}

/* ---- the models ---- */

/* GPT-2 architecture: wte, wpe, per layer 2 LN + c_attn + c_proj + c_fc + c_proj, ln_f. */
static int64_t gpt_params(int64_t V, int64_t T, int64_t C, int64_t L) {
    int64_t layer = 2 * 2 * C + (C * 3 * C + 3 * C) + (C * C + C) + (C * 4 * C + 4 * C) + (4 * C * C + C);
    return V * C + T * C + L * layer + 2 * C;
}

static void test_tiny(void **state) {
    Options o = opts();
    Module *m = load_ok("models/tiny.lua", &o);
    assert_string_equal(m->name, "tiny");
    check_nodes(m, "models/tiny.lua");
    check_inputs(m, 8, 64);
    int n;
    assert_int_equal(param_elements(m, &n), gpt_params(256, 64, 64, 2));
    assert_int_equal(n, 2 + 12 * 2 + 2);
    assert_int_equal(count_op(m, OP_attention), 2);
    assert_int_equal(count_op(m, OP_matmul), 4 * 2 + 1);
    /* tied embeddings: the last matmul reads wte with tb=1 */
    const Node *head = nth_op(m, OP_matmul, 8);
    assert_int_equal(ir_attr_i(head, "tb", 0), 1);
    assert_int_equal(head->in[1], find_param(m, "wte.weight")->out[0]);
    SHAPE(out_type(m, head), DT_F32, 8, 64, 256);
    /* config{} optimizer keys went into Options; others kept their defaults */
    assert_true(o.lr == 3e-3 && o.warmup == 10 && o.steps == 300 && o.weight_decay == 0.0 && o.grad_clip == 1.0);
    Options d = opts();
    assert_true(o.beta1 == d.beta1 && o.beta2 == d.beta2 && o.eps == d.eps);
    ir_free(m);
}

static void test_gpt2(void **state) {
    Options o = opts();
    Module *m = load_ok("models/gpt2.lua", &o);
    check_nodes(m, "models/gpt2.lua");
    check_inputs(m, 8, 1024);
    int n;
    int64_t total = param_elements(m, &n);
    assert_int_equal(total, 124475904); /* GPT-2 124M, vocab padded to 50304 */
    assert_int_equal(total, gpt_params(50304, 1024, 768, 12));
    assert_int_equal(n, 2 + 12 * 12 + 2);
    SHAPE(out_type(m, find_param(m, "wte.weight")), DT_F32, 50304, 768);
    SHAPE(out_type(m, find_param(m, "wpe.weight")), DT_F32, 1024, 768);
    SHAPE(out_type(m, find_param(m, "h.0.attn.c_attn.weight")), DT_F32, 768, 2304);
    SHAPE(out_type(m, find_param(m, "h.11.mlp.c_fc.weight")), DT_F32, 768, 3072);
    SHAPE(out_type(m, find_param(m, "h.11.mlp.c_proj.weight")), DT_F32, 3072, 768);
    const Node *p = find_param(m, "h.5.attn.c_proj.weight");
    assert_string_equal(ir_attr_s(p, "init", ""), "normal");
    assert_true(fabs(ir_attr_f(p, "std", 0) - 0.02 / sqrt(24)) < 1e-15);
    assert_true(ir_attr_f(find_param(m, "h.5.attn.c_attn.weight"), "std", 0) == 0.02);
    assert_string_equal(ir_attr_s(find_param(m, "h.3.ln_2.weight"), "init", ""), "ones");
    assert_string_equal(ir_attr_s(find_param(m, "h.3.mlp.c_fc.bias"), "init", ""), "zeros");
    assert_string_equal(ir_attr_s(find_param(m, "ln_f.bias"), "init", ""), "zeros");
    assert_int_equal(count_op(m, OP_attention), 12);
    SHAPE(out_type(m, nth_op(m, OP_attention, 0)), DT_F32, 8, 12, 1024, 64);
    ir_free(m);
}

static KeyVal llama_small[] = {
    {"layers", "2"}, {"dim", "64"}, {"heads", "4"}, {"kv_heads", "2"},
    {"ffn", "128"}, {"vocab", "256"}, {"seq", "32"}, {"batch", "2"},
};

/* Llama, untied: embedding, per layer 2 norms + wq, wk, wv (KH heads), wo + w1, w3, w2; norm; output. */
static int64_t llama_params(int64_t V, int64_t C, int64_t L, int64_t H, int64_t KH, int64_t F) {
    int64_t D = C / H;
    return 2 * V * C + C + L * (2 * C + C * H * D + 2 * C * KH * D + H * D * C + 3 * C * F);
}

static void test_llama_small(void **state) {
    Options o = opts_with(llama_small, 8);
    Module *m = load_ok("models/llama.lua", &o);
    check_nodes(m, "models/llama.lua");
    check_inputs(m, 2, 32);
    int n;
    assert_int_equal(param_elements(m, &n), llama_params(256, 64, 2, 4, 2, 128));
    assert_int_equal(n, 1 + 2 * 9 + 2);
    SHAPE(out_type(m, find_param(m, "h.1.attention.wk.weight")), DT_F32, 64, 32);
    SHAPE(out_type(m, find_param(m, "output.weight")), DT_F32, 64, 256);
    /* GQA: 4 query heads read 2 kv heads, never expanded */
    assert_int_equal(count_op(m, OP_attention), 2);
    const Node *a = nth_op(m, OP_attention, 1);
    SHAPE(in_type(m, a, 0), DT_F32, 2, 4, 32, 16);
    SHAPE(in_type(m, a, 1), DT_F32, 2, 2, 32, 16);
    SHAPE(in_type(m, a, 2), DT_F32, 2, 2, 32, 16);
    assert_int_equal(ir_attr_i(a, "causal", 0), 1);
    assert_true(fabs(ir_attr_f(a, "scale", 0) - 0.25) < 1e-15);
    /* RoPE on q and k of each layer, before the transpose: x [B,T,H,D] */
    assert_int_equal(count_op(m, OP_rope), 4);
    SHAPE(in_type(m, nth_op(m, OP_rope, 1), 0), DT_F32, 2, 32, 2, 16);
    assert_true(ir_attr_f(nth_op(m, OP_rope, 0), "theta", 0) == 500000);
    assert_int_equal(count_op(m, OP_rmsnorm), 2 * 2 + 1);
    assert_int_equal(count_op(m, OP_layernorm), 0);
    ir_free(m);
}

static void test_llama_default(void **state) {
    Options o = opts();
    Module *m = load_ok("models/llama.lua", &o);
    int n;
    assert_int_equal(param_elements(m, &n), llama_params(128256, 2048, 16, 32, 8, 8192));
    SHAPE(in_type(m, nth_op(m, OP_attention, 15), 1), DT_F32, 1, 8, 2048, 64);
    check_inputs(m, 1, 2048);
    ir_free(m);
}

/* Same file twice -> the same module. */
static void test_deterministic(void **state) {
    Options o = opts();
    Module *a = load_ok("models/gpt2.lua", &o), *b = load_ok("models/gpt2.lua", &o);
    assert_true(ir_module_equal(a, b));
    ir_free(a);
    ir_free(b);
}

/* ---- config{} and --set ---- */

static void test_set_override(void **state) {
    KeyVal sets[] = {{"layers", "1"}, {"dim", "32"}, {"lr", "0.01"}, {"steps", "5"}};
    Options o = opts_with(sets, 4);
    Module *m = load_ok("models/tiny.lua", &o);
    int n;
    assert_int_equal(param_elements(m, &n), gpt_params(256, 64, 32, 1));
    assert_int_equal(count_op(m, OP_attention), 1);
    assert_true(o.lr == 0.01 && o.steps == 5 && o.warmup == 10);
    ir_free(m);
}

/* Optimizer keys are accepted even when config{} does not define them. */
static void test_set_optimizer_key(void **state) {
    KeyVal sets[] = {{"beta2", "0.99"}, {"eps", "1e-6"}};
    Options o = opts_with(sets, 2);
    Module *m = load_ok("models/tiny.lua", &o);
    assert_true(o.beta2 == 0.99 && o.eps == 1e-6 && o.lr == 3e-3);
    ir_free(m);
}

static void expect_error(const char *path, KeyVal *sets, int nsets, const char *prefix, const char *sub) {
    Options o = opts_with(sets, nsets);
    Module *m = fe_load(path, &o, err, sizeof err);
    if (m) fail_msg("%s loaded; expected an error containing \"%s\"", path, sub);
    if (strncmp(err, prefix, strlen(prefix)) != 0 || !strstr(err, sub) || strchr(err, '\n'))
        fail_msg("want one line \"%s...%s...\", got \"%s\"", prefix, sub, err);
}

static void test_set_unknown_key(void **state) {
    KeyVal sets[] = {{"dim", "32"}, {"foo", "1"}};
    expect_error("models/tiny.lua", sets, 2, "models/tiny.lua:5:", "--set foo: the model's config{} has no key foo");
}

static void test_set_wrong_type(void **state) {
    KeyVal sets[] = {{"layers", "many"}};
    expect_error("models/tiny.lua", sets, 1, "models/tiny.lua:5:", "--set layers=many");
}

static void test_missing_file(void **state) {
    expect_error("models/nosuch.lua", NULL, 0, "models/nosuch.lua:1:", "cannot open");
}

/* ---- primitives, through a model in a temporary directory ---- */

static char tmpdir[512];

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static const char *tmp_path(const char *name) {
    static char buf[1024];
    snprintf(buf, sizeof buf, "%s/%s", tmpdir, name);
    return buf;
}

static const char ops_lua[] =
    "local c = config{flag = true, name = 'x', n = 1, f = 0.5}\n"
    "assert(c.flag == false and c.name == 'abc' and c.n == 3 and math.type(c.n) == 'integer' and c.f == 0.25)\n"
    "local x = input('x', {2, 3, 4})\n"
    "assert(x.rank == 3 and x.dtype == 'f32' and x.shape[1] == 2 and x.shape[3] == 4 and #x.shape == 3)\n"
    "local s = x.shape; s[1] = 99; assert(x.shape[1] == 2)\n"
    "local y = 1 - x * 2 + input('b', {4})\n"                         /* line 6 */
    "assert(y.shape[1] == 2 and y.shape[2] == 3 and y.shape[3] == 4)\n"
    "assert(tostring(-x / x) == 'tensor f32[2,3,4]')\n"
    "assert(slice(x, -1, 2).shape[3] == 3)\n"                         /* line 9 */
    "assert(slice(x, 2, 1, 1).shape[2] == 1)\n"
    "assert(reshape(x, {-1, 4}).shape[1] == 6)\n"
    "assert(transpose(x, 1, -1).shape[1] == 4)\n"                     /* line 12 */
    "assert(concat({x, x, x}, 2).shape[2] == 9)\n"
    "assert(sum(x, 2, true).shape[2] == 1 and sum(x, -1).rank == 2 and mean(x).rank == 0 and max(x, 1).rank == 2)\n"
    "assert(broadcast(input('c', {3, 1}), {2, 3, 4}).shape[1] == 2)\n"
    "assert(cast(x, 'bf16').dtype == 'bf16')\n"
    "assert(full({2, 2}, 7).dtype == 'f32' and positions(5).dtype == 'i32' and positions(5).shape[1] == 5)\n"
    "local q, kv = input('q', {2, 4, 8, 16}), input('kv', {2, 2, 8, 16})\n"
    "local o, lse = attention(q, kv, kv, {causal = false, scale = 0.5})\n"
    "assert(o.shape[2] == 4 and lse.rank == 3 and lse.dtype == 'f32')\n"
    "assert(softmax(x).rank == 3 and exp(x).rank == 3 and relu(x).rank == 3)\n"
    "local w, seven = layer(5, function() return param('w', {4}, ones()), 7 end)\n"
    "assert(seven == 7 and w.shape[1] == 4)\n"
    "local lib = require 'mylib'\n"
    "assert(lib.twice(3) == 6 and require('mylib') == lib)\n"
    "assert(rmsnorm(x, w).rank == 3 and layernorm(x, w, w, 0.1).rank == 3)\n"
    "assert(matmul(x, input('m', {5, 4}), {tb = true}).shape[3] == 5)\n"
    "assert(string.rep('', 1e15) == '' and string.rep('ab', 2, '-') == 'ab-ab')\n"
    "local tt = {1, 2, 3}; table.insert(tt, 1, 0); table.remove(tt); assert(table.concat(tt, ',') == '0,1,2')\n"
    "assert(#table.move({1, 2, 3}, 1, 3, 2, {}) == 4 and getmetatable(setmetatable({}, {__index = {}})) ~= nil)\n"
    "assert(attention(q, kv, kv, {window = 3}).shape[2] == 4)\n"
    "loss(mean(x))\n";

static void test_primitives(void **state) {
    write_file(tmp_path("ops.lua"), ops_lua);
    write_file(tmp_path("lib/mylib.lua"), "return {twice = function(n) return 2 * n end}\n");
    KeyVal sets[] = {{"flag", "false"}, {"name", "abc"}, {"n", "3"}, {"f", "0.25"}};
    Options o = opts_with(sets, 4);
    Options before = o;
    Module *m = load_ok(tmp_path("ops.lua"), &o);
    assert_string_equal(m->name, "ops");
    assert_true(o.lr == before.lr && o.steps == before.steps); /* no optimizer keys: untouched */
    /* 1 - x*2 + b: the numbers are f32[] consts, broadcast explicitly */
    const Node *c1 = nth_op(m, OP_const, 0), *c2 = nth_op(m, OP_const, 1);
    assert_true(ir_attr_f(c1, "v", 0) == 2 && ir_attr_f(c2, "v", 0) == 1);
    assert_int_equal(out_type(m, c1)->dt, DT_F32);
    assert_int_equal(out_type(m, c1)->rank, 0);
    const Node *sub = nth_op(m, OP_sub, 0);
    Graph *g = g0(m);
    const Node *lhs = &g->nodes[g->vals[sub->in[0]].def];
    assert_int_equal(lhs->op, OP_broadcast);            /* 1 - ...: the const is the left operand */
    assert_int_equal(lhs->in[0], c2->out[0]);
    const Node *add = nth_op(m, OP_add, 0);
    const Node *bb = &g->nodes[g->vals[add->in[1]].def];  /* b [4] -> [2,3,4] */
    assert_int_equal(bb->op, OP_broadcast);
    SHAPE(out_type(m, bb), DT_F32, 2, 3, 4);
    assert_int_equal(add->loc.line, 6);
    /* 1-based dims -> 0-based attributes; slice is inclusive */
    const Node *sl = nth_op(m, OP_slice, 0);
    assert_int_equal(ir_attr_i(sl, "dim", -9), 2);
    assert_int_equal(ir_attr_i(sl, "start", -9), 1);
    assert_int_equal(ir_attr_i(sl, "end", -9), 4);
    assert_int_equal(sl->loc.line, 9);
    const Node *tr = nth_op(m, OP_transpose, 0);
    assert_int_equal(ir_attr_i(tr, "a", -9), 0);
    assert_int_equal(ir_attr_i(tr, "b", -9), 2);
    assert_int_equal(tr->loc.line, 12);
    /* mean(x) with no dim: over every dim, last first */
    const Node *mean = nth_op(m, OP_mean, 0);
    assert_int_equal(ir_attr_i(mean, "dim", -9), 2);
    assert_int_equal(ir_attr_i(mean, "keep", -9), 0);
    const Node *at = nth_op(m, OP_attention, 0);
    assert_int_equal(ir_attr_i(at, "causal", -9), 0);
    assert_true(ir_attr_f(at, "scale", 0) == 0.5);
    assert_int_equal(ir_attr_i(at, "window", -9), -9); /* no window: no attribute */
    const Node *win = nth_op(m, OP_attention, 1);
    assert_int_equal(ir_attr_i(win, "causal", -9), 1);
    assert_int_equal(ir_attr_i(win, "window", -9), 3);
    const Node *w = find_param(m, "h.5.w");
    assert_int_equal(w->layer, 5);
    assert_true(ir_attr_f(nth_op(m, OP_layernorm, 0), "eps", 0) == 0.1);
    assert_true(ir_attr_f(nth_op(m, OP_rmsnorm, 0), "eps", 0) == 1e-6);
    ir_free(m);
}

/* --set without config{}: optimizer keys still reach Options, others are errors. */
static void test_set_without_config(void **state) {
    char path[1024];
    snprintf(path, sizeof path, "%s", tmp_path("noconfig.lua"));
    write_file(path, "local x = input('x', {4})\nloss(sum(x * x))\n");
    KeyVal ok[] = {{"lr", "0.5"}, {"grad_clip", "0"}};
    Options o = opts_with(ok, 2);
    Module *m = load_ok(path, &o);
    assert_true(o.lr == 0.5 && o.grad_clip == 0);
    ir_free(m);
    char prefix[1100];
    snprintf(prefix, sizeof prefix, "%s:1:", path);
    KeyVal bad[] = {{"dim", "3"}};
    expect_error(path, bad, 1, prefix, "--set dim: the model has no config{}");
    KeyVal nan[] = {{"lr", "fast"}};
    expect_error(path, nan, 1, prefix, "config: lr must be a number, got string");
}

/* Lua shortens chunk names over 60 characters to "...tail"; errors must still
 * carry the whole path, in the model and in its libs. */
static void test_long_paths(void **state) {
    char dir[1024], model[1200], lib[1200], prefix[1300];
    snprintf(dir, sizeof dir, "%s/a_directory_name_long_enough_to_be_shortened_by_lua", tmpdir);
    mkdir(dir, 0700);
    snprintf(lib, sizeof lib, "%s/lib", dir);
    mkdir(lib, 0700);
    snprintf(lib, sizeof lib, "%s/lib/broken.lua", dir);
    write_file(lib, "local M = {}\nfunction M.f(t)\n  return t.missing.field\nend\nreturn M\n");
    snprintf(model, sizeof model, "%s/runtime.lua", dir);
    write_file(model, "local x = 1\nlocal y = x.field\n");
    snprintf(prefix, sizeof prefix, "%s:2:", model);
    expect_error(model, NULL, 0, prefix, "attempt to index a number value");
    write_file(model, "local x = 1\nlocal y = = x\n");
    expect_error(model, NULL, 0, prefix, "unexpected symbol");
    write_file(model, "local b = require 'broken'\nb.f({})\n");
    snprintf(prefix, sizeof prefix, "%s:3:", lib);
    expect_error(model, NULL, 0, prefix, "field 'missing'");
    write_file(model, "\x1bLua binary\n");
    snprintf(prefix, sizeof prefix, "%s:1:", model);
    expect_error(model, NULL, 0, prefix, "binary chunk");
}

static int make_tmpdir(void **state) {
    snprintf(tmpdir, sizeof tmpdir, "%s/kiln_test_front_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(tmpdir)) return -1;
    char lib[600];
    snprintf(lib, sizeof lib, "%s/lib", tmpdir);
    return mkdir(lib, 0700);
}

static int remove_tmpdir(void **state) {
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

/* ---- tests/bad/ files: one test each ---- */

static void test_bad_file(void **state) {
    const char *path = *state;
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char first[512], sub[512], prefix[600];
    int line = 0;
    if (!fgets(first, sizeof first, f) || sscanf(first, "-- expect: %d: %511[^\n]", &line, sub) != 2)
        fail_msg("%s: the first line must be \"-- expect: LINE: SUBSTRING\"", path);
    fclose(f);
    snprintf(prefix, sizeof prefix, "%s:%d:", path, line);
    expect_error(path, NULL, 0, prefix, sub);
}

int main(void) {
    static const struct CMUnitTest fixed[] = {
        cmocka_unit_test(test_tiny),
        cmocka_unit_test(test_gpt2),
        cmocka_unit_test(test_llama_small),
        cmocka_unit_test(test_llama_default),
        cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_set_override),
        cmocka_unit_test(test_set_optimizer_key),
        cmocka_unit_test(test_set_unknown_key),
        cmocka_unit_test(test_set_wrong_type),
        cmocka_unit_test(test_missing_file),
        cmocka_unit_test(test_primitives),
        cmocka_unit_test(test_set_without_config),
        cmocka_unit_test(test_long_paths),
    };
    enum { NFIXED = sizeof fixed / sizeof fixed[0] };
    glob_t bad;
    if (glob("tests/bad/*.lua", 0, NULL, &bad) != 0 || bad.gl_pathc < 10) {
        fprintf(stderr, "test_front: run from the repository root (tests/bad/*.lua: need at least 10 files)\n");
        return 1;
    }
    size_t n = NFIXED + bad.gl_pathc;
    struct CMUnitTest *tests = calloc(n, sizeof *tests);
    memcpy(tests, fixed, sizeof fixed);
    for (size_t i = 0; i < bad.gl_pathc; i++)
        tests[NFIXED + i] = (struct CMUnitTest){bad.gl_pathv[i], test_bad_file, NULL, NULL, bad.gl_pathv[i]};
    int rc = _cmocka_run_group_tests("front", tests, n, make_tmpdir, remove_tmpdir);
    free(tests);
    globfree(&bad);
    return rc;
}
