/* compile.c — `kiln compile`: a model to a standalone trainer.
 *
 *   kiln compile MODEL --target cpu|cuda:sm_XX -o FILE [--emit llvm|cuda|schedule] [--attention kiln|cudnn|tc]
 *
 * The compiled step becomes an object file (emit/: LLVM for the host
 * program and the CPU's kernels; with a CUDA target, the kernels compiled
 * by NVRTC to cubins it embeds), which is linked with the runtime's trainer
 * main and library, found beside the kiln binary, into FILE.  --emit also
 * writes what was generated for inspection: FILE.ll, FILE.cu or
 * FILE.schedule.ir (the scheduled IR).
 *
 * The link uses the flags kiln itself was built with: the Makefile passes
 * KILN_LINK_FLAGS (a SAN=1 build's sanitizers, before the objects) and the
 * runtime's libraries KILN_RT_LIBS / KILN_RT_CUDA_LIBS (after them) when it
 * compiles this file.  A CUDA trainer gets its comm layer here: a program
 * whose mesh is one rank links runtime/comm_single.o and KILN_RT_CUDA1_LIBS
 * (no MPI: a single-GPU trainer neither links nor needs libmpi), any other
 * runtime/comm_mpi.o and KILN_RT_CUDA_LIBS (issue 23).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cmd.h"
#include "emit.h"
#include "kiln_rt.h"

#ifndef KILN_LINK_FLAGS
#define KILN_LINK_FLAGS "" /* the Makefile passes the sanitizer flags of a SAN=1 build */
#endif
#ifndef KILN_RT_CUDA1_LIBS
#define KILN_RT_CUDA1_LIBS KILN_RT_CUDA_LIBS
#endif
#ifndef KILN_RT_LIBS
#define KILN_RT_LIBS "-lopenblas -lpthread -lm" /* the Makefile passes the runtime's libraries (MPI too) */
#endif

static void emit_inspection(Args *a, Module *m, const EmitTarget *t, const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) die("--emit: cannot open %s", path);
    char err[1024];
    if (strcmp(a->emit, "llvm") == 0) {
        if (emit_llvm_text_target(m, t, f, err, sizeof err) != 0) die("--emit llvm: %s", err);
    } else if (strcmp(a->emit, "cuda") == 0) {
        if (emit_cuda_text(m, f, err, sizeof err) != 0) die("--emit cuda: %s", err);
    } else ir_dump(m, f);
    if (fclose(f) != 0) die("--emit: cannot write %s", path);
}

/* Link obj with the runtime into out: cc, run without a shell (paths may hold
 * any character).  KILN_LINK_FLAGS (before the objects) and KILN_RT_LIBS
 * (after them): space-separated words, or empty. */
static void link_trainer(const char *out, const char *obj, int cuda, int one_rank) {
    char dir[4096], main_o[4200], rtlib[4200], comm_o[4200];
    cmd_exe_dir(dir, sizeof dir); /* build/ holds libkilnrt.a and runtime/trainer_main.o */
    snprintf(main_o, sizeof main_o, "%s/runtime/trainer_main.o", dir);
    snprintf(rtlib, sizeof rtlib, "%s/%s", dir, cuda ? "libkilnrt_cuda.a" : "libkilnrt.a");
    snprintf(comm_o, sizeof comm_o, "%s/runtime/%s", dir, one_rank ? "comm_single.o" : "comm_mpi.o");
    char *argv[64], flags[] = KILN_LINK_FLAGS, cpu_libs[] = KILN_RT_LIBS, cuda_libs[] = KILN_RT_CUDA_LIBS, cuda1_libs[] = KILN_RT_CUDA1_LIBS;
    char *libs = !cuda ? cpu_libs : one_rank ? cuda1_libs : cuda_libs;
    int n = 0;
    argv[n++] = "cc";
    for (char *w = strtok(flags, " "); w && n < 24; w = strtok(NULL, " ")) argv[n++] = w;
    argv[n++] = "-o", argv[n++] = (char *)out, argv[n++] = (char *)obj, argv[n++] = main_o;
    if (cuda) argv[n++] = comm_o; /* the CUDA archive has no comm layer (Makefile) */
    argv[n++] = rtlib;
    for (char *w = strtok(libs, " "); w && n < 62; w = strtok(NULL, " ")) argv[n++] = w;
    argv[n] = NULL;
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) die("compile: fork: %s", strerror(errno));
    if (pid == 0) {
        execvp(argv[0], argv);
        fprintf(stderr, "kiln: compile: cannot run cc: %s\n", strerror(errno));
        _exit(127);
    }
    int status;
    if (waitpid(pid, &status, 0) < 0) die("compile: waitpid: %s", strerror(errno));
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) die("compile: linking %s with the runtime in %s failed", out, dir);
}

/* ---- the inputs the trainer feeds (issue 17) ---- */

/* The first input node of m named name (stages in order), its graph in *gout. */
static const Node *find_input_node(const Module *m, const char *name, const Graph **gout) {
    for (int s = 0; s < m->nstages; s++) {
        const Graph *g = m->stages[s];
        for (int i = 0; i < g->nnodes; i++)
            if (g->nodes[i].op == OP_input && strcmp(ir_attr_s(&g->nodes[i], "name", ""), name) == 0)
                return *gout = g, &g->nodes[i];
    }
    return NULL;
}

/* The trainer (runtime/trainer.c) fills tokens and targets from the data
 * and loss_mask from --ignore-index or --loss-mask; any other input would
 * stay unfed, so a compiled program refuses it here, at the model's line.
 * kiln check feeds every input random values and keeps accepting them. */
void cmd_check_fed_inputs(const Module *m, const char *model) {
    const Graph *gt = NULL, *gm = NULL;
    const Node *tok = find_input_node(m, "tokens", &gt), *tgt = find_input_node(m, "targets", &gt);
    if (!tok || !tgt) die("%s: the trainer needs inputs named tokens and targets (i32 [batch, seq])", model);
    const Type *tt = &gt->vals[tgt->out[0]].t;
    for (int s = 0; s < m->nstages; s++) {
        const Graph *g = m->stages[s];
        for (int i = 0; i < g->nnodes; i++) {
            const Node *n = &g->nodes[i];
            if (n->op != OP_input) continue;
            const char *name = ir_attr_s(n, "name", "");
            const Type *t = &g->vals[n->out[0]].t;
            if (strcmp(name, "tokens") == 0 || strcmp(name, "targets") == 0) {
                if (t->dt != DT_I32 || t->rank != 2)
                    error_at(n->loc, "input %s: the trainer feeds it as i32 [batch, seq]", name);
            } else if (strcmp(name, "loss_mask") != 0) {
                error_at(n->loc, "input %s: the trainer feeds only tokens, targets and loss_mask (kiln check feeds any input)", name);
            }
        }
    }
    const Node *mask = find_input_node(m, "loss_mask", &gm);
    Type want = *tt;
    want.dt = DT_F32;
    if (mask && !ir_type_eq(&gm->vals[mask->out[0]].t, &want))
        error_at(mask->loc, "input loss_mask: the trainer feeds it as f32 shaped like targets");
}

int cmd_compile(Args *a) {
    if (!a->out) die("compile: -o FILE is required");
    char err[1024], path[4200];
    const RtPath model = {"MODEL", a->model};
    cmd_check_output("-o", a->out, &model, 1);
    for (const char *const *ext = (const char *const[]){"o", "cu", "ll", "schedule.ir", NULL}; *ext; ext++) {
        snprintf(path, sizeof path, "%s.%s", a->out, *ext); /* what compile writes beside FILE */
        cmd_check_output(**ext == 'o' ? "-o" : "--emit", path, &model, 1);
    }
    Module *m = cmd_compile_checked(a);
    cmd_check_fed_inputs(m, a->model);
    EmitTarget cuda = {.device = RT_DEV_CUDA, .arch = a->cuda_arch, .attention_cudnn = a->attention && !strcmp(a->attention, "cudnn"),
                         .attention_tc = a->attention && !strcmp(a->attention, "tc")};
    EmitTarget *t = a->cuda_arch ? &cuda : NULL;
    EmitCubin *cubins = NULL;
    snprintf(path, sizeof path, "%s.cu", a->out);
    if (t && emit_cuda_cubins(m, t, path, &cubins, &cuda.ncubins, err, sizeof err) != 0) die("compile: %s", err);
    cuda.cubins = cubins;
    if (a->emit) {
        const char *ext = strcmp(a->emit, "llvm") == 0 ? "ll" : strcmp(a->emit, "cuda") == 0 ? "cu" : "schedule.ir";
        snprintf(path, sizeof path, "%s.%s", a->out, ext);
        emit_inspection(a, m, t, path);
    }
    snprintf(path, sizeof path, "%s.o", a->out);
    if (emit_object_for(m, t, path, err, sizeof err) != 0) die("compile: %s", err);
    emit_cubins_free(cubins, cuda.ncubins);
    int world = 1;
    for (int k = 0; k < IR_NAXES; k++) world *= m->mesh[k] > 0 ? m->mesh[k] : 1;
    link_trainer(a->out, path, t != NULL, world == 1);
    if (unlink(path) != 0) die("compile: cannot remove %s: %s", path, strerror(errno));
    printf("wrote %s%s%s\n", a->out, t ? " for " : "", t ? a->target : "");
    ir_free(m);
    return 0;
}
