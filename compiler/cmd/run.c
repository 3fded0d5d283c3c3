/* run.c — `kiln run`: train a model without writing a trainer to disk.
 *
 *   kiln run MODEL --data FILE [--steps N] [--log FILE.jsonl] [--trace FILE.json] [--serial] [--threads N] [--print-every N]
 *       The step JIT-compiled in memory (emit_jit) and handed to the same
 *       loop a compiled trainer runs (rt_train_main), with the flags it
 *       understands passed on.
 *
 *   kiln run MODEL --interp --data FILE [--steps N] [--log FILE.jsonl] [--export FILE.safetensors] [--f64] [--print-every N]
 *       The step in the interpreter (f32, or f64), on random windows of a
 *       text file whose bytes are the tokens: a reference for the compiled
 *       trainer, slow and simple.  --export writes the initial params,
 *       step 1's gradients, every step's tokens and targets and the losses
 *       to a safetensors file, for the PyTorch comparison
 *       (tests/test_torch.py).
 *
 *   Both take --ignore-index ID: the input loss_mask (issue 17) is 0 where
 *   the target is ID and 1 elsewhere (all 1 without the flag), as the
 *   trainer feeds it (runtime/trainer.c).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#include "data.h"
#include "emit.h"
#include "safetensors.h"
#include "trainer.h"

/* ---- kiln run (JIT): the compiled step, in memory, with the trainer's loop ---- */

static int run_jit(Args *a) {
    if (!a->data) die("run: --data FILE is required (a text file; bytes are the tokens)");
    const RtPath in[2] = {{"MODEL", a->model}, {"--trace", a->trace}}; /* the trainer checks them against the data */
    cmd_check_output("--trace", a->trace, in, 1);
    cmd_check_output("--log", a->log, in, 2);
    Module *m = cmd_compile_checked(a);
    cmd_check_fed_inputs(m, a->model);
    char err[1024], seed[32], every[32], ignore[32];
    const rt_program *prog;
    Jit *j = emit_jit(m, &prog, err, sizeof err);
    if (!j) die("run: %s", err);
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)a->o.seed);
    snprintf(every, sizeof every, "%d", a->print_every);
    char *argv[24];
    int argc = 0;
    argv[argc++] = (char *)"kiln run";
    argv[argc++] = (char *)"--data", argv[argc++] = (char *)a->data;
    argv[argc++] = (char *)"--seed", argv[argc++] = seed;
    argv[argc++] = (char *)"--print-every", argv[argc++] = every;
    if (a->log) argv[argc++] = (char *)"--log", argv[argc++] = (char *)a->log;
    if (a->trace) argv[argc++] = (char *)"--trace", argv[argc++] = (char *)a->trace;
    if (a->threads) argv[argc++] = (char *)"--threads", argv[argc++] = (char *)a->threads;
    if (a->serial) argv[argc++] = (char *)"--serial";
    if (a->ignore_index >= 0) {
        snprintf(ignore, sizeof ignore, "%d", a->ignore_index);
        argv[argc++] = (char *)"--ignore-index", argv[argc++] = ignore;
    }
    argv[argc] = NULL;
    int rc = rt_train_main(prog, argc, argv, (int)a->o.steps);
    emit_jit_free(j);
    ir_free(m);
    return rc;
}

/* ---- kiln run --interp: the interpreter on byte-level text ---- */

/* The value id of input `name`, or -1. */
static int find_input(Graph *g, const char *name) {
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i].op == OP_input && strcmp(ir_attr_s(&g->nodes[i], "name", ""), name) == 0)
            return g->nodes[i].out[0];
    return -1;
}

static void export_params(StWriter *w, Interp *it, Graph *g, const char *prefix, int from_outputs) {
    char key[512];
    for (int i = 0; i < g->nnodes; i++) {
        Node *n = &g->nodes[i];
        if (n->op != OP_param) continue;
        const char *name = ir_attr_s(n, "name", "");
        snprintf(key, sizeof key, "%s%s", prefix, name);
        const Tensor *t = from_outputs ? interp_output(it, 0, key) : interp_state(it, 0, name);
        if (!t) die("export: no value for %s", key);
        st_add_f32(w, key, t->t.dim, t->t.rank, t->d);
    }
}

static int run_interp(Args *a) {
    if (!a->data) die("run: --data FILE is required (a text file; bytes are the tokens)");
    const RtPath in[3] = {{"MODEL", a->model}, {"--data", a->data}, {"--log", a->log}};
    cmd_check_output("--log", a->log, in, 2);
    cmd_check_output("--export", a->export_path, in, 3);
    Module *m = cmd_compile_checked(a);
    cmd_check_fed_inputs(m, a->model);
    Graph *g = m->stages[0];
    int tok_id = find_input(g, "tokens"), tgt_id = find_input(g, "targets");
    if (tok_id < 0 || tgt_id < 0) die("run: %s needs inputs named tokens and targets", a->model);
    int has_mask = find_input(g, "loss_mask") >= 0;
    if (a->ignore_index >= 0 && !has_mask) die("--ignore-index: %s has no input loss_mask", a->model);
    const Type *tt = &g->vals[tok_id].t;
    if (tt->rank != 2) die("run: input tokens must be [batch, seq]");
    int64_t B = tt->dim[0], T = tt->dim[1], vocab = ir_index_bound(g, tok_id, 1);
    if (vocab < 256) die("run: byte-level data needs a vocabulary of at least 256 (the model has %lld)", (long long)vocab);
    Corpus c;
    char err[1024];
    if (data_load_text(&c, a->data, err, sizeof err) != 0) die("%s", err);
    if (c.n < (size_t)T + 2) die("--data: %s has %zu bytes, fewer than one window of %lld", a->data, c.n, (long long)T + 1);

    Interp *it = interp_new(m, a->f64);
    interp_init_state(it, a->o.seed);
    StWriter *w = a->export_path ? st_new() : NULL;
    if (w) export_params(w, it, g, "param:", 0);
    FILE *log = a->log ? fopen(a->log, "w") : NULL;
    if (a->log && !log) die("--log: cannot open %s", a->log);

    int steps = (int)a->o.steps;
    double *tok = malloc(sizeof(double) * (size_t)(B * T)), *tgt = malloc(sizeof(double) * (size_t)(B * T));
    double *mask = malloc(sizeof(double) * (size_t)(B * T));
    int32_t *tok32 = malloc(sizeof(int32_t) * (size_t)(B * T)), *tgt32 = malloc(sizeof(int32_t) * (size_t)(B * T));
    double *losses = malloc(sizeof(double) * (size_t)(steps > 0 ? steps : 1));
    if (!tok || !tgt || !mask || !tok32 || !tgt32 || !losses) die("out of memory");
    uint64_t rng = data_rng(a->o.seed);
    double t0 = cmd_now();
    printf("training %s on %s: %d steps of %lld x %lld tokens (interpreter, %s)\n", a->model, a->data, steps,
           (long long)B, (long long)T, a->f64 ? "f64" : "f32");
    for (int step = 1; step <= steps; step++) {
        data_sample_i32(&c, B, T, &rng, tok32, tgt32);
        for (int64_t k = 0; k < B * T; k++) tok[k] = tok32[k], tgt[k] = tgt32[k];
        for (int64_t k = 0; k < B * T; k++) mask[k] = a->ignore_index >= 0 && tgt32[k] == a->ignore_index ? 0 : 1;
        interp_set_input(it, 0, "tokens", tok, B * T);
        interp_set_input(it, 0, "targets", tgt, B * T);
        if (has_mask) interp_set_input(it, 0, "loss_mask", mask, B * T);
        double ts = cmd_now();
        cmd_interp_run(it);
        double dt = cmd_now() - ts, loss = cmd_output_scalar(it, "loss");
        double lr = cmd_output_scalar(it, "lr"), gn = cmd_output_scalar(it, "grad_norm");
        losses[step - 1] = loss;
        if (w) {
            char key[64];
            int64_t shape[2] = {B, T};
            snprintf(key, sizeof key, "tokens.%d", step);
            st_add_i32(w, key, shape, 2, tok);
            snprintf(key, sizeof key, "targets.%d", step);
            st_add_i32(w, key, shape, 2, tgt);
            if (step == 1) export_params(w, it, g, "grad:", 1);
        }
        if (!isfinite(loss)) die("step %d: loss is %g; stopping", step, loss);
        if (step == 1 || step % a->print_every == 0 || step == steps)
            printf("step %4d/%d | loss %.4f | lr %.2e | grad-norm %.3f | %.0f tok/s\n", step, steps, loss, lr, gn,
                   (double)(B * T) / dt);
        if (log)
            fprintf(log, "{\"step\":%d,\"loss\":%.9g,\"lr\":%.9g,\"grad_norm\":%.9g,\"tokens_per_s\":%.1f,\"elapsed\":%.3f}\n",
                    step, loss, lr, gn, (double)(B * T) / dt, cmd_now() - t0);
        fflush(stdout);
    }
    printf("done: %d steps in %.1f s\n", steps, cmd_now() - t0);
    if (log && fclose(log) != 0) die("--log: cannot write %s", a->log);
    if (w) {
        int64_t shape[1] = {steps};
        st_add_f32(w, "loss", shape, 1, losses);
        if (st_write(w, a->export_path, err, sizeof err) != 0) die("--export: %s", err);
    }
    free(tok);
    free(tgt);
    free(mask);
    free(tok32);
    free(tgt32);
    free(losses);
    data_free(&c);
    interp_free(it);
    ir_free(m);
    return 0;
}

int cmd_run(Args *a) { return a->interp ? run_interp(a) : run_jit(a); }
