/* checkpoint.h — training checkpoints as safetensors files.
 *
 * A checkpoint is one file DIR/step_00000123.safetensors holding everything
 * a run needs to continue bit-identically: every parameter (the f32
 * master), every state of the program (AdamW moments "opt.m.<p>",
 * "opt.v.<p>", the counter "opt.step") and the trainer's own state in
 * CkptExtra ("trainer.step" i64, "trainer.rng" u64, "trainer.data_pos" i64,
 * all shape []), plus {"model": p->model, "format": "kiln-checkpoint-1"}
 * in "__metadata__".
 *
 * The learning-rate schedule the run trains with (*p->schedule, which the
 * trainer's flags may have changed from the compiled values) is trainer
 * state too, kept in "__metadata__" as decimal strings that read back to
 * the same doubles ("lr", "min_lr", "warmup", "schedule_steps" = its
 * total), whenever the program has a schedule.  Metadata rather than
 * tensors, so the tensor set is unchanged and older readers ignore them.
 * Loading with the trainer's state (x != NULL) restores them into
 * *p->schedule; they are optional: a checkpoint written before they existed
 * has none, and the table keeps what it holds (the compiled values, unless
 * the caller changed them).  All four or none; each must be a finite number
 * >= 0, lr > 0, or the file is rejected like any malformed checkpoint.  A
 * program without a schedule ignores them.
 *
 * Names: a GPT-2-style program (params wte.weight, wpe.weight, h.<i>.*,
 * ln_f.*) stores its params under Hugging Face's names with the prefix
 * "transformer." (transformer.h.0.attn.c_attn.weight), so PyTorch can load
 * them; its moments follow (opt.m.transformer.h.0...).  Loading accepts the
 * prefixed or the bare name.  Other models keep kiln's names.
 *
 * Loading validates the whole file before it writes anything into the
 * program's memory: on any error (a missing, unexpected, misshapen or
 * mistyped tensor; a corrupt or truncated file) the function returns -1
 * with one line in err and the program's state is untouched.
 *
 * Devices: the functions read and write the program's host views
 * (kiln_rt.h): saving pulls the params and states first, loading pushes
 * what it wrote.  A failed pull or push is one line in err and -1 like any
 * error (after a failed push the host views hold the file's values but the
 * device may not; ckpt_resume then stops instead of trying older files).
 *
 * Several ranks: a state that is a shard of a distributed-optimizer bucket
 * (rt_tensor.prefix set) is stored as the logical tensors of the bucket's
 * members, "<prefix><param>" with the param's shape (opt.m.<p>, opt.v.<p>),
 * the same tensors a one-rank program stores; loading cuts every rank's
 * shard out of them, so a checkpoint resumes under any dp or zero mode.
 * ckpt_save is then collective (every rank calls it; world rank 0 writes);
 * loading is not (every rank reads the file).  A param without storage
 * (space -1) whose values live in a param shard (prefix "", param.b<k>) is
 * saved and loaded as the param itself, under its own name: the file does
 * not say where the program keeps its params, so it moves between dp
 * values, zero modes and layouts both ways; --init fills the param shards.
 *
 * Pipeline stages (rt_program.stages): each stage holds only its params
 * and their state; the file holds every tensor once (a tied param, or
 * opt.step, in several stages is written once).  ckpt_save gathers each
 * stage's tensors from its first rank to rank 0 (over the pp group);
 * loading binds the names this rank's stage holds and ignores entries that
 * another stage holds, so a checkpoint resumes at any pp.
 *
 * Test hook: with the environment variable KILN_CKPT_CRASH_AFTER_BYTES=N,
 * ckpt_save kills its own process (SIGKILL) after writing N bytes of the
 * temp file — the kill -9 test of tests/test_checkpoint.c.
 */
#ifndef KILN_CHECKPOINT_H
#define KILN_CHECKPOINT_H
#include <stdint.h>

#include "fsutil.h"
#include "kiln_rt.h"

typedef struct {
    int64_t step;     /* optimizer steps done; also names the file */
    uint64_t rng;     /* the data sampler's generator state */
    int64_t data_pos; /* the data stream's position (0 if the sampler has none) */
} CkptExtra;

/* Write DIR/step_<x->step>.safetensors atomically (DIR is created if
 * missing, one level), then delete older checkpoints so that the newest
 * `keep` remain (keep <= 0: keep all; files of later steps than x->step are
 * left alone).  0, or -1 with one line in err.  With several ranks every
 * rank calls it (it gathers the shards); rank 0 writes and prunes, and all
 * return only once the file is committed, all 0 or all -1. */
int ckpt_save(rt_ctx *ctx, const rt_program *p, const char *dir, const CkptExtra *x, int keep, char *err, int errlen);

/* Create dir if missing and check that a file can be created in it (the
 * trainer calls it before step 1, so a bad --ckpt fails at once, not after
 * the first N steps).  0, or -1 with one line in err. */
int ckpt_prepare_dir(const char *dir, char *err, int errlen);

/* Before a run writes checkpoints into dir: every checkpoint file already
 * there (which a save may replace and pruning delete) is a regular file and
 * none of the n inputs (fsutil.h, rt_check_output).  0 (also when dir does
 * not exist yet), or -1 with one line in err naming --ckpt. */
int ckpt_check_dir(const char *dir, const RtPath *inputs, int n, char *err, int errlen);

/* Load one checkpoint file: params, states and (x != NULL) the trainer's
 * state, which must then be present, and the schedule when the file has
 * one.  0, or -1 with err, state untouched. */
int ckpt_load(rt_ctx *ctx, const rt_program *p, const char *path, CkptExtra *x, char *err, int errlen);

/* Load the newest valid checkpoint of dir; newer ones that fail to load
 * are skipped with one "warning: ..." line on stderr (naming the newest's
 * error) once an older one has loaded.  The file used goes into
 * used (may be NULL).  0; 1 when dir holds no checkpoint file at all (err
 * says so; the caller may start fresh); -1 when dir is unreadable or no
 * checkpoint loads (err gives the newest one's error). */
int ckpt_resume(rt_ctx *ctx, const rt_program *p, const char *dir, CkptExtra *x, char *used, int usedlen, char *err, int errlen);

/* --init FILE: params only, every param present with its shape and dtype.
 * Other tensors are an error, except optimizer/trainer state (opt.*,
 * trainer.*) and, for GPT-2-style programs, Hugging Face's non-parameter
 * buffers (*.attn.bias, *.attn.masked_bias) and the tied lm_head.weight. */
int ckpt_init_weights(rt_ctx *ctx, const rt_program *p, const char *file, char *err, int errlen);

/* The checkpoint file name for a step: DIR/step_%08lld.safetensors. */
void ckpt_path(char *buf, int len, const char *dir, int64_t step);
#endif
