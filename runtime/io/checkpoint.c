/* checkpoint.c — see checkpoint.h.
 *
 * Saving hands safetensors.c views of the program's memory (nothing is
 * copied: params and states are written straight from their spaces), so a
 * checkpoint costs one pass over the model's bytes.  The file appears
 * atomically (st_write: temp file, fsync, rename, fsync of the directory);
 * only then are older checkpoints pruned, so a crash at any point leaves
 * the previous checkpoint intact.
 *
 * Loading is two-phase: `bind` matches every tensor the program needs to an
 * entry of the (already validated) file and checks names, dtypes and
 * shapes, and rejects entries it cannot account for; only when all of that
 * holds does `copy_in` write the program's memory.  A failed load therefore
 * never leaves a half-loaded model behind, which is what lets ckpt_resume
 * fall back from a corrupt newest checkpoint to the one before.
 *
 * Several ranks (kiln_rt.h, rt_bucket).  A state with a prefix is this
 * rank's shard of a flat bucket of optimizer state; the file holds the
 * LOGICAL tensors instead: "<prefix><param>" with the param's shape for
 * every member of the bucket, which is exactly what a one-rank (or
 * --zero 0) program stores as its states opt.m.<p> and opt.v.<p>.  Saving
 * is collective: every rank passes its shards to rt_host_allgather over
 * the bucket's group, world rank 0 writes the file from the gathered
 * buckets (the other ranks write nothing), and a world-wide exchange of
 * outcomes (rt_host_agree) makes every rank return only after the file is
 * committed, all with the same result.  Params are replicated across data-parallel ranks, but a
 * program that all-gathers updated params at the start of the next step
 * leaves only this rank's chunk of each bucket fresh between steps; so when
 * a bucket's members lie in the params space as the flat bucket, the save
 * gathers the params chunk by chunk too (a no-op when they are already
 * identical).  Loading needs no communication: every rank reads the file
 * and cuts its own shard out of the logical tensors (padding zero), so a
 * checkpoint resumes under any dp and either zero mode.
 *
 * Pipeline stages: see "pipeline stages" below (gather_stages) and
 * ignorable (loading skips the other stages' names).
 *
 * Params without storage (space -1; kiln_rt.h).  A program that all-gathers
 * the params at the start of its step keeps them only as "param shards",
 * states with prefix "" (param.b<k>).  Saving gathers such a shard like
 * opt.m and hands its members to list_params, which writes every param in
 * the params' order under the param's own file name (file_name: the
 * "transformer." naming of a GPT-2-style program), and list_states skips the
 * shard itself; the file is therefore byte for byte the one a program with
 * stored params writes for the same weights and states in the same order.
 * Loading binds every param by name whether it has storage or not; a param
 * shard's members are those entries, and the shard is cut out of them like
 * any other.  --init loads params only, which includes the param shards.
 *
 * Devices (kiln_rt.h, "Host views").  Both directions work on host views:
 * saving first pulls every stored param and every state from the device
 * (then agrees with the other ranks that all pulls succeeded, so that no
 * rank gathers or writes stale data), and loading pushes every tensor it
 * wrote once all are written.  On the CPU the pulls and pushes do nothing.
 * A failed push leaves the host views loaded but the device not: the load
 * fails with that error, and ckpt_resume does not try an older file (it is
 * not the file's fault).  The schedule needs no push: the device reads
 * *p->schedule afresh before every step.
 */
#include "fsutil.h"
#include "checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rt_private.h"
#include "safetensors.h"

#define HF_PREFIX "transformer."


static int starts(const char *s, const char *prefix) { return strncmp(s, prefix, strlen(prefix)) == 0; }
static int ends(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* ---- names ---- */

/* The schedule's metadata keys (checkpoint.h), in rt_schedule's order. */
static const char *const sched_keys[4] = {"lr", "min_lr", "warmup", "schedule_steps"};

static double *sched_field(rt_schedule *s, int i) {
    double *f[4] = {&s->lr, &s->min_lr, &s->warmup, &s->total};
    return f[i];
}

/* GPT-2 style: wte.weight present and every param is wte/wpe/h.<i>./ln_f,
 * over every pipeline stage's params (so all stages name alike). */
static int is_gpt2(const rt_program *p) {
    int wte = 0;
    for (int s = 0; s < rt_nstages(p); s++) {
        const rt_program *q = rt_stage(p, s);
        for (int i = 0; i < q->nparams; i++) {
            const char *n = q->params[i].name;
            wte |= strcmp(n, "wte.weight") == 0;
            if (strcmp(n, "wte.weight") && strcmp(n, "wpe.weight") && !starts(n, "h.") && !starts(n, "ln_f.")) return 0;
        }
    }
    return wte;
}

static int is_param(const rt_program *p, const char *name) {
    for (int i = 0; i < p->nparams; i++)
        if (strcmp(p->params[i].name, name) == 0) return 1;
    return 0;
}

/* ---- tensor parallel (issue 20): a param split over tp, and its AdamW
 * moments, are logical tensors in the file.  A rank's piece of dim d is
 * its slice of each of tp_blocks blocks (rt_tensor.tp_split); the local
 * tensor's rows of `run` elements (one block's slice times the dims after
 * d) sit at logical row (row * tp + tp rank). ---- */

/* The param whose piece t (param, "opt.m.<p>"/"opt.v.<p>" of the same
 * shape, or a sharded member pm) holds, when it is split over tp; NULL. */
static const rt_tensor *tp_param_of(const rt_program *p, const rt_tensor *t) {
    if (t->tp_split > 0) return t;
    const char *n = t->name;
    if (!starts(n, "opt.m.") && !starts(n, "opt.v.")) return NULL;
    for (int i = 0; i < p->nparams; i++) {
        const rt_tensor *q = &p->params[i];
        if (q->tp_split > 0 && strcmp(q->name, n + 6) == 0 && q->rank == t->rank && !memcmp(q->dim, t->dim, sizeof q->dim)) return q;
    }
    return NULL;
}

static int64_t tp_run(const rt_tensor *q) {
    int d = q->tp_split - 1;
    int64_t run = q->dim[d] / (q->tp_blocks > 1 ? q->tp_blocks : 1);
    for (int k = d + 1; k < q->rank; k++) run *= q->dim[k];
    return run;
}

/* The logical shape of q's tensors: dim d times tp. */
static void tp_logical_dims(const rt_tensor *q, int tp, int64_t *dim) {
    for (int k = 0; k < 5; k++) dim[k] = q->dim[k];
    dim[q->tp_split - 1] *= tp;
}

/* Rank r's piece (local layout, numel n) <-> the logical tensor: to_logical
 * places it, else cuts it out. */
static void tp_move(const rt_tensor *q, int tp, int r, char *local, char *logical, int64_t n, size_t es, int to_logical) {
    int64_t run = tp_run(q), bytes = run * (int64_t)es;
    for (int64_t row = 0; row < n / run; row++) {
        char *l = local + row * bytes, *g = logical + (row * tp + r) * bytes;
        if (to_logical) memcpy(g, l, (size_t)bytes);
        else memcpy(l, g, (size_t)bytes);
    }
}

/* The name a program tensor has in a checkpoint file. */
static void file_name(const rt_program *p, int gpt2, const char *name, char *buf, size_t len) {
    if (gpt2 && is_param(p, name)) { snprintf(buf, len, HF_PREFIX "%s", name); return; }
    if (gpt2 && (starts(name, "opt.m.") || starts(name, "opt.v.")) && is_param(p, name + 6)) {
        snprintf(buf, len, "%.6s" HF_PREFIX "%s", name, name + 6);
        return;
    }
    snprintf(buf, len, "%s", name);
}

static int st_dtype_of(int rt_dtype) {
    switch (rt_dtype) {
    case RT_F32: return ST_F32;
    case RT_BF16: return ST_BF16;
    case RT_F16: return ST_F16;
    case RT_I32: return ST_I32;
    case RT_I64: return ST_I64;
    }
    return -1;
}

static size_t elem_bytes(const rt_tensor *t) { return (size_t)st_dtype_size(st_dtype_of(t->dtype)); }

static int64_t tensor_numel(const rt_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->rank; i++) n *= t->dim[i];
    return n;
}

static size_t tensor_bytes(const rt_tensor *t) { return elem_bytes(t) * (size_t)tensor_numel(t); }

/* ---- shards ---- */

static int is_shard(const rt_tensor *t) { return rt_is_shard(t); }

/* The logical tensor of member j of sharded state t: "<prefix><param>". */
static void member_name(const rt_program *p, const rt_tensor *t, int j, char *buf, size_t len) {
    snprintf(buf, len, "%s%s", t->prefix, p->params[p->buckets[t->bucket].param[j]].name);
}

/* Where params and states are written from: the program's memory, or
 * whole buckets gathered from every rank's chunk (owned here). */
typedef struct {
    const void **param;  /* per param: its data */
    char **state;        /* per state: the gathered bucket (sharded states), else NULL */
    char **bucket_param; /* per bucket: the gathered params, or NULL */
    char **joined;       /* tensors joined over tp (tp_join), freed with the rest */
    int njoined;
} Gathered;

static void free_gathered(const rt_program *p, Gathered *g) {
    for (int i = 0; i < g->njoined; i++) free(g->joined[i]);
    free(g->joined);
    for (int i = 0; g->state && i < p->nstates; i++) free(g->state[i]);
    for (int b = 0; g->bucket_param && b < p->nbuckets; b++) free(g->bucket_param[b]);
    free(g->param);
    free(g->state);
    free(g->bucket_param);
}

/* The byte offset in the params space where bucket k's flat layout starts
 * when every member sits there (all of one dtype), else -1. */
static int64_t flat_params_base(const rt_program *p, const rt_bucket *k) {
    int64_t base = -1;
    if (k->nmembers == 0) return -1;
    size_t es = elem_bytes(&p->params[k->param[0]]);
    for (int j = 0; j < k->nmembers; j++) {
        const rt_tensor *t = &p->params[k->param[j]];
        int64_t b = t->offset - k->offset[j] * (int64_t)es;
        if (t->space != RT_SPACE_PARAMS || elem_bytes(t) != es || (j && b != base)) return -1;
        base = b;
    }
    return base >= 0 && base + k->n * (int64_t)es <= p->space_bytes[RT_SPACE_PARAMS] ? base : -1;
}

/* Every rank: all-gather `chunk` bytes per group member into a new buffer. */
static int gather(rt_ctx *ctx, int group, const void *mine, int64_t chunk, char **out, const char *what, char *err, int errlen) {
    int size = rt_group_size(ctx, group);
    char e[512];
    if (!(*out = malloc((size_t)(chunk * size) + 1))) return rt_errf(err, errlen, "%s: out of memory", what);
    if (rt_host_allgather(ctx, group, mine, *out, chunk, e, sizeof e) != 0) return rt_errf(err, errlen, "%s: %s", what, e);
    return 0;
}

/* Every rank, collectively: the data of every param and the whole buckets
 * of every sharded state; a param without storage points into its param
 * shard's gathered bucket. */
static int gather_all(rt_ctx *ctx, const rt_program *p, Gathered *g, char *err, int errlen) {
    g->param = calloc((size_t)p->nparams + 1, sizeof *g->param);
    g->state = calloc((size_t)p->nstates + 1, sizeof *g->state);
    g->bucket_param = calloc((size_t)p->nbuckets + 1, sizeof *g->bucket_param);
    if (!g->param || !g->state || !g->bucket_param) return rt_errf(err, errlen, "checkpoint: out of memory");
    for (int i = 0; i < p->nparams; i++) g->param[i] = rt_tensor_ptr(ctx, &p->params[i]);
    for (int b = 0; b < p->nbuckets; b++) {
        const rt_bucket *k = &p->buckets[b];
        int64_t base = flat_params_base(p, k), size = rt_group_size(ctx, k->group);
        if (base < 0 || size == 1) continue;
        int64_t es = (int64_t)elem_bytes(&p->params[k->param[0]]), chunk = k->n / size * es;
        const char *mine = rt_space(ctx, RT_SPACE_PARAMS) + base + rt_group_rank(ctx, k->group) * chunk;
        if (gather(ctx, k->group, mine, chunk, &g->bucket_param[b], "checkpoint: gathering params", err, errlen)) return -1;
        for (int j = 0; j < k->nmembers; j++) g->param[k->param[j]] = g->bucket_param[b] + k->offset[j] * es;
    }
    for (int i = 0; i < p->nstates; i++) {
        const rt_tensor *t = &p->states[i];
        if (!is_shard(t)) continue;
        char what[600];
        snprintf(what, sizeof what, "checkpoint: gathering %s", t->name);
        const rt_bucket *k = &p->buckets[t->bucket];
        if (gather(ctx, k->group, rt_tensor_ptr(ctx, t), (int64_t)tensor_bytes(t), &g->state[i], what, err, errlen)) return -1;
        for (int j = 0; rt_is_param_shard(t) && j < k->nmembers; j++) /* the members' values: the gathered bucket */
            g->param[k->param[j]] = g->state[i] + k->offset[j] * (int64_t)elem_bytes(t);
    }
    return 0;
}

/* ---- saving ---- */

void ckpt_path(char *buf, int len, const char *dir, int64_t step) {
    snprintf(buf, (size_t)len, "%s/step_%08lld.safetensors", dir, (long long)step);
}

/* The tensors a save writes, as a list (file name, dtype, shape, data):
 * rank 0 adds its own and those the other pipeline stages send it. */
typedef struct {
    char name[512];
    int dtype, rank; /* ST_* */
    int64_t dim[5];
    const void *data;
} Ent;

typedef struct {
    Ent *e;
    int n, cap;
} Ents;

static int ents_add(Ents *l, const char *name, int dtype, const int64_t *dim, int rank, const void *data) {
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        Ent *e = realloc(l->e, (size_t)cap * sizeof *e);
        if (!e) return -1;
        l->e = e, l->cap = cap;
    }
    Ent *t = &l->e[l->n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = dtype, t->rank = rank, t->data = data;
    for (int d = 0; d < 5; d++) t->dim[d] = d < rank ? dim[d] : 0;
    return 0;
}

static int64_t ent_bytes(const Ent *t) {
    int64_t n = st_dtype_size(t->dtype);
    for (int d = 0; d < t->rank; d++) n *= t->dim[d];
    return n;
}

static int tp_join(rt_ctx *ctx, const rt_tensor *q, const void *data, int64_t n, size_t es, Gathered *g, const void **out,
                   int64_t *dim, char *err, int errlen);

/* Every param, stored or not, in the params' order, so that the file is
 * the same whether the params live in the params space or in param shards. */
static int list_params(Ents *l, rt_ctx *ctx, const rt_program *p, int gpt2, Gathered *g, char *err, int errlen) {
    char name[512];
    for (int i = 0; i < p->nparams; i++) {
        const rt_tensor *t = &p->params[i];
        const void *data = g->param[i];
        int64_t dim[5];
        memcpy(dim, t->dim, sizeof dim);
        if (t->tp_split > 0 && tp_join(ctx, t, data, tensor_numel(t), elem_bytes(t), g, &data, dim, err, errlen)) return -1;
        file_name(p, gpt2, t->name, name, sizeof name);
        if (ents_add(l, name, st_dtype_of(t->dtype), dim, t->rank, data)) return rt_errf(err, errlen, "checkpoint: out of memory");
    }
    return 0;
}

/* Every rank of the tp group, collectively: the logical tensor of piece
 * `data` of q (numel n, es bytes each) into *out (owned by g), dims into
 * dim.  0, or -1 with err. */
static int tp_join(rt_ctx *ctx, const rt_tensor *q, const void *data, int64_t n, size_t es, Gathered *g, const void **out,
                   int64_t *dim, char *err, int errlen) {
    int tp = rt_group_size(ctx, RT_AXIS_TP);
    char e[512], *all = malloc((size_t)n * es * (size_t)tp + 1), *lg = malloc((size_t)n * es * (size_t)tp + 1);
    char **j = realloc(g->joined, sizeof *j * (size_t)(g->njoined + 1));
    if (j) g->joined = j;
    if (!all || !lg || !j) return free(all), free(lg), rt_errf(err, errlen, "checkpoint: out of memory");
    g->joined[g->njoined++] = lg;
    if (rt_host_allgather(ctx, RT_AXIS_TP, data, all, n * (int64_t)es, e, sizeof e) != 0)
        return free(all), rt_errf(err, errlen, "checkpoint: gathering %s over tp: %s", q->name, e);
    for (int r = 0; r < tp; r++) tp_move(q, tp, r, all + (size_t)r * (size_t)n * es, lg, n, es, 1);
    free(all);
    tp_logical_dims(q, tp, dim);
    *out = lg;
    return 0;
}

/* Unsharded states as they are; a sharded one as its logical tensors; a
 * param shard not at all (list_params listed its members). */
static int list_states(Ents *l, rt_ctx *ctx, const rt_program *p, int gpt2, Gathered *g, char *err, int errlen) {
    char logical[512], name[512];
    for (int i = 0; i < p->nstates; i++) {
        const rt_tensor *t = &p->states[i], *q;
        const void *data;
        int64_t dim[5];
        if (rt_is_param_shard(t)) continue;
        if (!is_shard(t)) {
            data = rt_tensor_ptr(ctx, t);
            memcpy(dim, t->dim, sizeof dim);
            if ((q = tp_param_of(p, t)) && tp_join(ctx, q, data, tensor_numel(t), elem_bytes(t), g, &data, dim, err, errlen)) return -1;
            file_name(p, gpt2, t->name, name, sizeof name);
            if (ents_add(l, name, st_dtype_of(t->dtype), dim, t->rank, data)) return rt_errf(err, errlen, "checkpoint: out of memory");
            continue;
        }
        const rt_bucket *k = &p->buckets[t->bucket];
        for (int j = 0; j < k->nmembers; j++) {
            const rt_tensor *m = &p->params[k->param[j]];
            data = g->state[i] + k->offset[j] * (int64_t)elem_bytes(t);
            memcpy(dim, m->dim, sizeof dim);
            if (m->tp_split > 0 && tp_join(ctx, m, data, tensor_numel(m), elem_bytes(t), g, &data, dim, err, errlen)) return -1;
            member_name(p, t, j, logical, sizeof logical);
            file_name(p, gpt2, logical, name, sizeof name);
            if (ents_add(l, name, st_dtype_of(t->dtype), dim, m->rank, data)) return rt_errf(err, errlen, "checkpoint: out of memory");
        }
    }
    return 0;
}

/* ---- pipeline stages: what the other stages hold, sent to rank 0 ----
 * Each stage's tensors are complete on its first rank (dp, cp, tp
 * coordinates 0) once gather_all has run, so those ranks, one per stage,
 * form rank 0's pp group: each packs its params and states (packed: per
 * entry its name, dtype, rank, dims, byte count and bytes, params before
 * states), the group all-gathers the packs' lengths and sends the packs,
 * padded to the largest, to rank 0 (rt_host_gather: no other rank holds
 * more than its own stage).
 * Rank 0 lists every stage's params, then every stage's states, each name
 * once (a tied param, or opt.step, is in several stages with the same
 * values), so the file is the logical one a single-stage program writes. */
typedef struct {
    char *buf;
    int64_t len, cap;
} Pack;

static int pack_put(Pack *k, const void *x, int64_t n) {
    if (k->len + n > k->cap) {
        int64_t cap = k->cap ? 2 * k->cap : 1 << 16;
        while (cap < k->len + n) cap *= 2;
        char *b = realloc(k->buf, (size_t)cap);
        if (!b) return -1;
        k->buf = b, k->cap = cap;
    }
    memcpy(k->buf + k->len, x, (size_t)n);
    k->len += n;
    return 0;
}

/* l's entries (state: 0 params, 1 states) into k. */
static int pack_ents(Pack *k, const Ents *l, int32_t state) {
    for (int i = 0; i < l->n; i++) {
        const Ent *t = &l->e[i];
        int32_t hdr[3] = {state, t->dtype, t->rank};
        int64_t bytes = ent_bytes(t), nlen = (int64_t)strlen(t->name);
        if (pack_put(k, hdr, sizeof hdr) || pack_put(k, t->dim, sizeof t->dim) || pack_put(k, &nlen, 8) || pack_put(k, t->name, nlen) ||
            pack_put(k, &bytes, 8) || pack_put(k, t->data, bytes))
            return -1;
    }
    return 0;
}

/* A pack of len bytes back into lists (views into the pack).  0, or -1
 * when it is malformed or memory runs out. */
static int unpack_ents(const char *b, int64_t len, Ents *params, Ents *states) {
    int64_t at = 0;
    while (at < len) {
        int32_t hdr[3];
        int64_t dim[5], nlen, bytes;
        char name[512];
        if (len - at < (int64_t)(sizeof hdr + sizeof dim + 8)) return -1;
        memcpy(hdr, b + at, sizeof hdr), at += sizeof hdr;
        memcpy(dim, b + at, sizeof dim), at += sizeof dim;
        memcpy(&nlen, b + at, 8), at += 8;
        if (nlen < 0 || nlen >= (int64_t)sizeof name || len - at < nlen + 8 || hdr[2] < 0 || hdr[2] > 5) return -1;
        memcpy(name, b + at, (size_t)nlen), at += nlen;
        name[nlen] = 0;
        memcpy(&bytes, b + at, 8), at += 8;
        if (bytes < 0 || len - at < bytes) return -1;
        if (ents_add(hdr[0] ? states : params, name, hdr[1], dim, hdr[2], b + at)) return -1;
        at += bytes;
    }
    return 0;
}

/* On the first rank of every stage (the pp group of world rank 0): gather
 * the packs to rank 0 (rt_host_gather); *all (malloc'd, on rank 0 only)
 * holds pp packs of *each bytes, the first 8 of each its length.  Other
 * ranks: nothing. */
static int gather_stages(rt_ctx *ctx, const Ents *params, const Ents *states, char **all, int64_t *each, char *err, int errlen) {
    *all = NULL;
    if (rt_group_size(ctx, RT_AXIS_PP) == 1 || rt_group_rank(ctx, RT_AXIS_DP | RT_AXIS_CP | RT_AXIS_TP) != 0) return 0;
    Pack k = {0};
    int64_t zero = 0, mine, *lens = NULL, max = 0;
    int pp = rt_group_size(ctx, RT_AXIS_PP), rc = -1;
    char e[512];
    if (pack_put(&k, &zero, 8) || pack_ents(&k, params, 0) || pack_ents(&k, states, 1) || !(lens = malloc(sizeof *lens * (size_t)pp))) {
        rt_errf(err, errlen, "checkpoint: out of memory packing this stage's tensors");
        goto done;
    }
    mine = k.len - 8;
    memcpy(k.buf, &mine, 8);
    if (rt_host_allgather(ctx, RT_AXIS_PP, &k.len, lens, 8, e, sizeof e) != 0) {
        rt_errf(err, errlen, "checkpoint: gathering the stages: %s", e);
        goto done;
    }
    for (int s = 0; s < pp; s++) max = lens[s] > max ? lens[s] : max;
    if (rt_world_rank(ctx) == 0 && !(*all = malloc((size_t)(max * pp) + 1))) {
        rt_errf(err, errlen, "checkpoint: out of memory gathering the stages");
        goto done;
    }
    while (k.len < max) { /* pad to the largest pack */
        char pad[256] = {0};
        int64_t n = max - k.len < 256 ? max - k.len : 256;
        if (pack_put(&k, pad, n)) { rt_errf(err, errlen, "checkpoint: out of memory padding"); goto done; }
    }
    if (rt_host_gather(ctx, RT_AXIS_PP, k.buf, *all, max, e, sizeof e) != 0) {
        rt_errf(err, errlen, "checkpoint: gathering the stages: %s", e);
        goto done;
    }
    *each = max;
    rc = 0;
done:
    if (rc) free(*all), *all = NULL;
    free(lens);
    free(k.buf);
    return rc;
}

/* The entries of src whose names dst lacks, appended to dst. */
static int merge_new(Ents *dst, const Ents *src) {
    for (int i = 0; i < src->n; i++) {
        int dup = 0;
        for (int j = 0; j < dst->n && !dup; j++) dup = strcmp(dst->e[j].name, src->e[i].name) == 0;
        const Ent *t = &src->e[i];
        if (!dup && ents_add(dst, t->name, t->dtype, t->dim, t->rank, t->data)) return -1;
    }
    return 0;
}

/* The crash hook's byte count, -1 when unset. */
static int crash_hook(int64_t *n, char *err, int errlen) {
    const char *v = getenv("KILN_CKPT_CRASH_AFTER_BYTES");
    *n = -1;
    if (!v) return 0;
    char *end;
    errno = 0;
    long long k = strtoll(v, &end, 10);
    if (*v == 0 || *end || errno || k < 0) return rt_errf(err, errlen, "KILN_CKPT_CRASH_AFTER_BYTES: expected a byte count, got \"%s\"", v);
    *n = k;
    return 0;
}

typedef struct {
    int64_t step;
    char name[64];
} Found;

/* step_<digits>.safetensors -> its step, else -1. */
static int64_t parse_ckpt_name(const char *n) {
    if (!starts(n, "step_")) return -1;
    const char *d = n + 5, *e = d;
    while (*e >= '0' && *e <= '9') e++;
    if (e == d || e - d > 18 || strcmp(e, ".safetensors") != 0) return -1;
    return strtoll(d, NULL, 10);
}

static int cmp_found_desc(const void *a, const void *b) {
    int64_t x = ((const Found *)a)->step, y = ((const Found *)b)->step;
    return x > y ? -1 : x < y;
}

/* The checkpoint files of dir, newest first. */
static int list_ckpts(const char *dir, Found **out, int *n, char *err, int errlen) {
    *out = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) return rt_errf(err, errlen, "%s: cannot read the checkpoint directory: %s", dir, strerror(errno));
    int cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        int64_t s = parse_ckpt_name(e->d_name);
        if (s < 0 || strlen(e->d_name) >= sizeof((Found *)0)->name) continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            Found *f = realloc(*out, (size_t)cap * sizeof *f);
            if (!f) { closedir(d); free(*out); *out = NULL; return rt_errf(err, errlen, "%s: out of memory", dir); }
            *out = f;
        }
        (*out)[*n].step = s;
        snprintf((*out)[*n].name, sizeof(*out)[*n].name, "%s", e->d_name);
        (*n)++;
    }
    closedir(d);
    if (*n) qsort(*out, (size_t)*n, sizeof **out, cmp_found_desc);
    return 0;
}

/* Keep the newest `keep` checkpoints up to step (counting the new one). */
static void prune(const char *dir, int64_t step, int keep) {
    Found *f;
    int n, kept = 1;
    char err[512], path[4096];
    if (keep <= 0) return;
    if (list_ckpts(dir, &f, &n, err, sizeof err) != 0) { fprintf(stderr, "warning: %s\n", err); return; }
    for (int i = 0; i < n; i++) {
        if (f[i].step >= step) continue;
        if (kept < keep) { kept++; continue; }
        snprintf(path, sizeof path, "%s/%s", dir, f[i].name);
        if (unlink(path) != 0) fprintf(stderr, "warning: cannot delete old checkpoint %s: %s\n", path, strerror(errno));
    }
    free(f);
}

static int ensure_dir(const char *dir, char *err, int errlen) {
    struct stat sb;
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) return rt_errf(err, errlen, "%s: cannot create the checkpoint directory: %s", dir, strerror(errno));
    if (stat(dir, &sb) != 0) return rt_errf(err, errlen, "%s: cannot use the checkpoint directory: %s", dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode)) return rt_errf(err, errlen, "%s: the checkpoint directory is not a directory", dir);
    return 0;
}

int ckpt_prepare_dir(const char *dir, char *err, int errlen) {
    if (ensure_dir(dir, err, errlen)) return -1;
    char probe[4096];
    snprintf(probe, sizeof probe, "%s/.kiln-probe.%d", dir, (int)getpid());
    int fd = open(probe, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return rt_errf(err, errlen, "%s: cannot write into the checkpoint directory: %s", dir, strerror(errno));
    close(fd);
    unlink(probe);
    return 0;
}

int ckpt_check_dir(const char *dir, const RtPath *inputs, int n, char *err, int errlen) {
    struct stat sb;
    if (stat(dir, &sb) != 0) return 0; /* created later; ckpt_prepare_dir reports what is wrong with it */
    Found *f;
    int nf, rc = 0;
    char path[4200];
    if (list_ckpts(dir, &f, &nf, err, errlen) != 0) return 0;
    for (int i = 0; i < nf && rc == 0; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, f[i].name);
        rc = rt_check_output("--ckpt", path, inputs, n, err, errlen);
    }
    free(f);
    return rc;
}

/* Rank 0: write the file from the lists, then prune. */
static int write_ckpt(const rt_program *p, const char *dir, const CkptExtra *x, int keep, const Ents *params, const Ents *states,
                      char *err, int errlen) {
    int64_t crash;
    if (crash_hook(&crash, err, errlen) || ensure_dir(dir, err, errlen)) return -1;
    StWriter *w = st_new();
    char stepstr[32];
    snprintf(stepstr, sizeof stepstr, "%lld", (long long)x->step);
    st_add_meta(w, "format", "kiln-checkpoint-1");
    st_add_meta(w, "model", p->model ? p->model : "");
    if (p->sets && *p->sets) st_add_meta(w, "sets", p->sets);
    st_add_meta(w, "step", stepstr);
    for (int i = 0; i < params->n; i++) st_add_view(w, params->e[i].name, params->e[i].dtype, params->e[i].dim, params->e[i].rank, params->e[i].data);
    for (int i = 0; i < states->n; i++) st_add_view(w, states->e[i].name, states->e[i].dtype, states->e[i].dim, states->e[i].rank, states->e[i].data);
    st_add_raw(w, "trainer.step", ST_I64, NULL, 0, &x->step);
    st_add_raw(w, "trainer.rng", ST_U64, NULL, 0, &x->rng);
    st_add_raw(w, "trainer.data_pos", ST_I64, NULL, 0, &x->data_pos);
    for (int i = 0; p->schedule && i < 4; i++) { /* %.17g: the double back exactly */
        char v[40];
        snprintf(v, sizeof v, "%.17g", *sched_field(p->schedule, i));
        st_add_meta(w, sched_keys[i], v);
    }
    char path[4096];
    ckpt_path(path, sizeof path, dir, x->step);
    if (st_write_ex(w, path, crash, err, errlen) != 0) return -1;
    prune(dir, x->step, keep);
    return 0;
}

/* Every stored param and every state into its host view (what the save
 * reads).  0, or -1 with err. */
static int pull_all(rt_ctx *ctx, const rt_program *p, const char *dir, char *err, int errlen) {
    char e[512];
    for (int i = 0; i < p->nparams; i++)
        if (rt_pull_tensor(ctx, &p->params[i], e, sizeof e) != 0) return rt_errf(err, errlen, "%s: reading %s: %s", dir, p->params[i].name, e);
    for (int i = 0; i < p->nstates; i++)
        if (rt_pull_tensor(ctx, &p->states[i], e, sizeof e) != 0) return rt_errf(err, errlen, "%s: reading %s: %s", dir, p->states[i].name, e);
    return 0;
}

int ckpt_save(rt_ctx *ctx, const rt_program *p, const char *dir, const CkptExtra *x, int keep, char *err, int errlen) {
    if (x->step < 0) return rt_errf(err, errlen, "%s: negative step %lld", dir, (long long)x->step);
    /* every rank, before any gathers: all pulled, or all fail here */
    if (rt_host_agree(ctx, pull_all(ctx, p, dir, err, errlen), err, errlen) != 0) return -1;
    Gathered g = {0};
    Ents params = {0}, states = {0}, all_params = {0}, all_states = {0};
    char *packs = NULL;
    int64_t each = 0;
    int gpt2 = is_gpt2(p), rc = gather_all(ctx, p, &g, err, errlen);
    if (rc == 0 && (list_params(&params, ctx, p, gpt2, &g, err, errlen) || list_states(&states, ctx, p, gpt2, &g, err, errlen)))
        rc = -1;
    if (rc == 0) rc = gather_stages(ctx, &params, &states, &packs, &each, err, errlen);
    if (rc == 0 && rt_world_rank(ctx) == 0) {
        Ents *sp = calloc((size_t)rt_nstages(p) * 2, sizeof *sp); /* per stage: params, states */
        if (!sp) rc = rt_errf(err, errlen, "checkpoint: out of memory");
        for (int s = 0; rc == 0 && s < rt_nstages(p); s++) {
            int64_t len;
            if (s == 0) {
                sp[0] = params, sp[1] = states;
                continue;
            }
            memcpy(&len, packs + s * each, 8);
            if (len < 0 || len > each - 8 || unpack_ents(packs + s * each + 8, len, &sp[2 * s], &sp[2 * s + 1]))
                rc = rt_errf(err, errlen, "checkpoint: stage %d sent a malformed list of tensors", s);
        }
        for (int s = 0; rc == 0 && s < rt_nstages(p); s++)
            if (merge_new(&all_params, &sp[2 * s])) rc = rt_errf(err, errlen, "checkpoint: out of memory");
        for (int s = 0; rc == 0 && s < rt_nstages(p); s++)
            if (merge_new(&all_states, &sp[2 * s + 1])) rc = rt_errf(err, errlen, "checkpoint: out of memory");
        if (rc == 0) rc = write_ckpt(p, dir, x, keep, &all_params, &all_states, err, errlen);
        for (int s = 1; sp && s < rt_nstages(p); s++) free(sp[2 * s].e), free(sp[2 * s + 1].e);
        free(sp);
    }
    free(packs);
    free(params.e), free(states.e), free(all_params.e), free(all_states.e);
    free_gathered(p, &g);
    return rt_host_agree(ctx, rc, err, errlen); /* also holds every rank until rank 0 has committed */
}

/* ---- loading ---- */

typedef struct {
    const StFile *f;
    const rt_program *p;
    rt_ctx *ctx;
    int gpt2;
    int init;             /* --init: a padded vocabulary may take fewer rows */
    int note;             /* ... and rank 0 says so */
    char *used;           /* per file entry: accounted for */
    const StEntry **src;  /* per program tensor (params then states) */
    const StEntry **msrc; /* sharded state i's members: msrc[moff[i] ..] */
    int *moff;
    const StEntry *xt[3]; /* trainer.step, trainer.rng, trainer.data_pos */
    int has_sched;        /* the file's metadata holds the schedule ... */
    double sched[4];      /* ... in rt_schedule's order */
    char missing[1024];   /* the first missing tensor's error, "" if none */
} Binding;

/* The entry for program tensor `name` (prefixed or bare), NULL if absent. */
static int find_entry(Binding *b, const char *name, const StEntry **out, char *err, int errlen) {
    char fn[512];
    file_name(b->p, b->gpt2, name, fn, sizeof fn);
    const StEntry *e = st_find(b->f, fn), *bare = strcmp(fn, name) ? st_find(b->f, name) : NULL;
    if (e && bare) return rt_errf(err, errlen, "%s: both \"%s\" and \"%s\" are present", b->f->path, fn, name);
    *out = e ? e : bare;
    if (*out) b->used[*out - b->f->t] = 1;
    return 0;
}

/* --init of a checkpoint whose vocabulary the model pads (GPT-2's 50257
 * rows into nn.round_up's 50304): the same shape but for fewer rows, the
 * file's rows not a multiple of 64, the model's the file's rounded up to a
 * power of two >= 64 that divides them.  Anything else is a shape error. */
static int padded_rows(const StEntry *e, const int64_t *dim, int rank) {
    if (e->rank != rank || rank < 1 || e->shape[0] >= dim[0] || e->shape[0] < 1 || e->shape[0] % 64 == 0) return 0;
    for (int i = 1; i < rank; i++)
        if (e->shape[i] != dim[i]) return 0;
    int64_t m = dim[0] & -dim[0]; /* the largest power of two dividing the model's rows */
    return m >= 64 && (e->shape[0] + m - 1) / m * m == dim[0];
}

/* Elements of e (the file's; fewer than the model's for padded rows). */
static int64_t entry_numel(const StEntry *e) {
    int64_t n = 1;
    for (int i = 0; i < e->rank; i++) n *= e->shape[i];
    return n;
}

static int check_entry(const Binding *b, const StEntry *e, const char *name, int dtype, const int64_t *dim, int rank, char *err, int errlen) {
    char fs[256], ms[256];
    st_shape_str(dim, rank, ms, sizeof ms);
    if (!e) return rt_errf(err, errlen, "%s: missing tensor \"%s\" (shape %s in model %s)", b->f->path, name, ms, b->p->model);
    st_shape_str(e->shape, e->rank, fs, sizeof fs);
    if (e->dtype != dtype)
        return rt_errf(err, errlen, "%s: tensor \"%s\": dtype %s in the file, %s in the model", b->f->path, e->name, st_dtype_name(e->dtype), st_dtype_name(dtype));
    int same = e->rank == rank;
    for (int i = 0; same && i < rank; i++) same = e->shape[i] == dim[i];
    if (!same && b->init && padded_rows(e, dim, rank)) {
        if (b->note) /* once, not per rank */
            fprintf(stderr, "--init: %s: tensor \"%s\": shape %s in the file, %s in the model: rows %lld..%lld keep their initial values\n",
                    b->f->path, e->name, fs, ms, (long long)e->shape[0], (long long)dim[0] - 1);
        return 0;
    }
    if (!same) return rt_errf(err, errlen, "%s: tensor \"%s\": shape %s in the file, %s in the model", b->f->path, e->name, fs, ms);
    return 0;
}

/* Match and check one tensor the program needs; a missing one is noted in
 * b->missing (the first) and binding goes on, so that the error can also
 * name the file's unexpected tensor — usually the same tensor under
 * another name. */
static int bind_one(Binding *b, const char *name, int dtype, const int64_t *dim, int rank, const StEntry **src, char *err, int errlen) {
    if (find_entry(b, name, src, err, errlen)) return -1;
    if (!*src && b->missing[0]) return 0;
    if (check_entry(b, *src, name, dtype, dim, rank, *src ? err : b->missing, *src ? errlen : (int)sizeof b->missing) && *src) return -1;
    return 0;
}

/* Every param, stored or not; then a param shard's members are its
 * params' entries. */
static int bind_params(Binding *b, char *err, int errlen) {
    const rt_program *p = b->p;
    for (int i = 0; i < p->nparams; i++) {
        const rt_tensor *t = &p->params[i];
        int64_t dim[5];
        memcpy(dim, t->dim, sizeof dim);
        if (t->tp_split > 0) tp_logical_dims(t, rt_group_size(b->ctx, RT_AXIS_TP), dim); /* the file holds the logical tensor */
        if (bind_one(b, t->name, st_dtype_of(t->dtype), dim, t->rank, &b->src[i], err, errlen)) return -1;
    }
    for (int i = 0; i < p->nstates; i++) {
        const rt_bucket *k = rt_is_param_shard(&p->states[i]) ? &p->buckets[p->states[i].bucket] : NULL;
        for (int j = 0; k && j < k->nmembers; j++) b->msrc[b->moff[i] + j] = b->src[k->param[j]];
    }
    return 0;
}

/* A sharded state binds the logical tensors of its bucket's members. */
static int bind_states(Binding *b, char *err, int errlen) {
    const rt_program *p = b->p;
    char logical[512];
    for (int i = 0; i < p->nstates; i++) {
        const rt_tensor *t = &p->states[i];
        if (rt_is_param_shard(t)) continue; /* bound with the params */
        int64_t dim[5];
        const rt_tensor *q;
        if (!is_shard(t)) {
            memcpy(dim, t->dim, sizeof dim);
            if ((q = tp_param_of(p, t))) tp_logical_dims(q, rt_group_size(b->ctx, RT_AXIS_TP), dim);
            if (bind_one(b, t->name, st_dtype_of(t->dtype), dim, t->rank, &b->src[p->nparams + i], err, errlen)) return -1;
            continue;
        }
        const rt_bucket *k = &p->buckets[t->bucket];
        for (int j = 0; j < k->nmembers; j++) {
            const rt_tensor *m = &p->params[k->param[j]];
            memcpy(dim, m->dim, sizeof dim);
            if (m->tp_split > 0) tp_logical_dims(m, rt_group_size(b->ctx, RT_AXIS_TP), dim);
            member_name(p, t, j, logical, sizeof logical);
            if (bind_one(b, logical, st_dtype_of(t->dtype), dim, m->rank, &b->msrc[b->moff[i] + j], err, errlen)) return -1;
        }
    }
    return 0;
}

/* The optional schedule in the metadata: all four keys or none, each a
 * finite number >= 0 (lr > 0); checked here, before anything is written. */
static int bind_schedule(Binding *b, char *err, int errlen) {
    int found = 0;
    for (int i = 0; i < 4; i++) found += st_meta(b->f, sched_keys[i]) != NULL;
    if (found == 0) return 0;
    for (int i = 0; i < 4; i++) {
        const char *v = st_meta(b->f, sched_keys[i]);
        if (!v) return rt_errf(err, errlen, "%s: metadata has part of the learning-rate schedule but not \"%s\"", b->f->path, sched_keys[i]);
        char *end;
        double x = strtod(v, &end);
        if (*v == 0 || *end || !isfinite(x) || x < 0 || (i == 0 && x == 0))
            return rt_errf(err, errlen, "%s: metadata \"%s\": \"%s\" is not a valid value (a finite number %s 0)", b->f->path,
                           sched_keys[i], v, i == 0 ? ">" : ">=");
        b->sched[i] = x;
    }
    b->has_sched = 1;
    return 0;
}

/* The trainer's state against itself and the file: trainer.step in
 * [0, 1e9] (the trainer counts steps in an int), equal to the step in the
 * file's name (step_<N>.safetensors; another name is not checked), to the
 * metadata "step" when present, and to the optimizer's counter opt.step
 * (the AdamW steps taken, an f32: exact up to 2^24) when the file has one; trainer.data_pos >= 0;
 * the schedule's min_lr <= lr and its length >= 1.  Checked before
 * anything is written, like every other field. */
static int check_extra(Binding *b, char *err, int errlen) {
    int64_t step, pos;
    memcpy(&step, st_data(b->f, b->xt[0]), 8);
    memcpy(&pos, st_data(b->f, b->xt[2]), 8);
    const char *path = b->f->path, *base = strrchr(path, '/'), *meta = st_meta(b->f, "step");
    int64_t named = parse_ckpt_name(base ? base + 1 : path);
    if (step < 0 || step > 1000000000) return rt_errf(err, errlen, "%s: trainer.step %lld is out of range [0, 1e9]", path, (long long)step);
    if (named >= 0 && named != step)
        return rt_errf(err, errlen, "%s: trainer.step %lld does not match the file name's step %lld", path, (long long)step, (long long)named);
    char *end;
    if (meta && (strtoll(meta, &end, 10) != step || *end || !*meta))
        return rt_errf(err, errlen, "%s: trainer.step %lld does not match the metadata \"step\": \"%s\"", path, (long long)step, meta);
    const StEntry *t = st_find(b->f, "opt.step");
    float adam;
    if (t && t->dtype == ST_F32 && t->rank == 0 && step <= (1 << 24) && (memcpy(&adam, st_data(b->f, t), 4), (double)adam != (double)step))
        return rt_errf(err, errlen, "%s: trainer.step %lld does not match the optimizer's opt.step %g", path, (long long)step, (double)adam);
    if (pos < 0) return rt_errf(err, errlen, "%s: trainer.data_pos %lld is negative", path, (long long)pos);
    if (b->has_sched && b->sched[1] > b->sched[0])
        return rt_errf(err, errlen, "%s: metadata \"min_lr\" %g is above \"lr\" %g", path, b->sched[1], b->sched[0]);
    if (b->has_sched && (b->sched[3] < 1 || b->sched[2] > 1e9 || b->sched[3] > 1e9))
        return rt_errf(err, errlen, "%s: metadata \"%s\" %g is out of range", path, b->sched[3] < 1 || b->sched[3] > 1e9 ? "schedule_steps" : "warmup",
                       b->sched[3] < 1 || b->sched[3] > 1e9 ? b->sched[3] : b->sched[2]);
    return 0;
}

static int bind_extra(Binding *b, char *err, int errlen) {
    static const char *names[3] = {"trainer.step", "trainer.rng", "trainer.data_pos"};
    static const int dtypes[3] = {ST_I64, ST_U64, ST_I64};
    for (int i = 0; i < 3; i++)
        if (bind_one(b, names[i], dtypes[i], NULL, 0, &b->xt[i], err, errlen)) return -1;
    if (b->missing[0]) return 0; /* check_complete reports it */
    return bind_schedule(b, err, errlen) || check_extra(b, err, errlen) ? -1 : 0;
}

/* 1 when program q (a pipeline stage) has a tensor the file names fname
 * (prefixed or bare): a param, a state, or a member of a sharded one. */
static int stage_holds(const rt_program *q, int gpt2, const char *fname) {
    char fn[512], logical[512];
    for (int i = 0; i < q->nparams; i++) {
        file_name(q, gpt2, q->params[i].name, fn, sizeof fn);
        if (!strcmp(fn, fname) || !strcmp(q->params[i].name, fname)) return 1;
    }
    for (int i = 0; i < q->nstates; i++) {
        const rt_tensor *t = &q->states[i];
        int nm = is_shard(t) ? q->buckets[t->bucket].nmembers : 1;
        for (int j = 0; j < nm; j++) {
            if (is_shard(t)) member_name(q, t, j, logical, sizeof logical);
            else snprintf(logical, sizeof logical, "%s", t->name);
            file_name(q, gpt2, logical, fn, sizeof fn);
            if (!strcmp(fn, fname) || !strcmp(logical, fname)) return 1;
        }
    }
    return 0;
}

/* Entries the load did not bind that it may ignore: another pipeline
 * stage's tensors (each stage loads the names it holds), and ... */
static int ignorable(const Binding *b, const char *name, int init, int with_extra) {
    for (int s = 0; s < rt_nstages(b->p); s++)
        if (s != b->p->stage && stage_holds(rt_stage(b->p, s), b->gpt2, name)) return 1;
    if (init) {
        if (starts(name, "opt.") || starts(name, "trainer.")) return 1;
        if (!b->gpt2) return 0;
        return strcmp(name, "lm_head.weight") == 0 || ends(name, ".attn.bias") || ends(name, ".attn.masked_bias");
    }
    return !with_extra && starts(name, "trainer.");
}

/* After binding: the first missing tensor and/or the first unexpected one. */
static int check_complete(const Binding *b, int init, int with_extra, char *err, int errlen) {
    const char *unexpected = NULL;
    for (int i = 0; i < b->f->n && !unexpected; i++)
        if (!b->used[i] && !ignorable(b, b->f->t[i].name, init, with_extra)) unexpected = b->f->t[i].name;
    if (b->missing[0] && unexpected) return rt_errf(err, errlen, "%s; the file has an unexpected tensor \"%s\"", b->missing, unexpected);
    if (b->missing[0]) return rt_errf(err, errlen, "%s", b->missing);
    if (unexpected)
        return rt_errf(err, errlen, "%s: unexpected tensor \"%s\" (model %s has no such %s)", b->f->path, unexpected, b->p->model,
                    init ? "parameter" : "parameter or state");
    return 0;
}

/* Tensors with storage (a param without storage is filled by its shard). */
static void copy_in(rt_ctx *ctx, const StFile *f, const rt_program *p, const rt_tensor *t, int n, const StEntry **src) {
    for (int i = 0; i < n; i++) {
        if (!rt_is_stored(&t[i])) continue;
        const rt_tensor *q = tp_param_of(p, &t[i]);
        if (q) /* this rank's piece of the logical tensor */
            tp_move(q, rt_group_size(ctx, RT_AXIS_TP), rt_group_rank(ctx, RT_AXIS_TP), rt_tensor_ptr(ctx, &t[i]), (char *)st_data(f, src[i]),
                    tensor_numel(&t[i]), elem_bytes(&t[i]), 0);
        else memcpy(rt_tensor_ptr(ctx, &t[i]), st_data(f, src[i]), (size_t)entry_numel(src[i]) * elem_bytes(&t[i]));
    }
}

/* This rank's shard of t: elements [lo, lo+len) of the flat bucket, cut out
 * of the members' logical tensors; padding zero. */
static void copy_shard(rt_ctx *ctx, const StFile *f, const rt_program *p, const rt_tensor *t, const StEntry **src, int init) {
    const rt_bucket *k = &p->buckets[t->bucket];
    int64_t len = k->n / rt_group_size(ctx, k->group), lo = rt_group_rank(ctx, k->group) * len, es = (int64_t)elem_bytes(t);
    char *dst = rt_tensor_ptr(ctx, t);
    if (!init) memset(dst, 0, (size_t)(len * es));
    else { /* only the bucket's padding: a member's rows beyond the file's (a padded vocabulary) keep their init */
        int64_t cur = lo;
        for (int j = 0; j <= k->nmembers; j++) { /* members in offset order, then the tail */
            int64_t o = j < k->nmembers ? k->offset[j] : k->n, a = cur, e = o < lo + len ? o : lo + len;
            if (a < e) memset(dst + (a - lo) * es, 0, (size_t)((e - a) * es));
            if (j < k->nmembers && o + tensor_numel(&p->params[k->param[j]]) > cur) cur = o + tensor_numel(&p->params[k->param[j]]);
        }
    }
    for (int j = 0; j < k->nmembers; j++) {
        const rt_tensor *m = &p->params[k->param[j]];
        int64_t o = k->offset[j], n = m->tp_split > 0 ? tensor_numel(m) : entry_numel(src[j]);
        int64_t a = lo > o ? lo : o, e = lo + len < o + n ? lo + len : o + n;
        if (a >= e) continue;
        char *piece = NULL; /* a member split over tp: this rank's piece of the logical tensor */
        if (m->tp_split > 0 && (piece = malloc((size_t)(n * es)))) 
            tp_move(m, rt_group_size(ctx, RT_AXIS_TP), rt_group_rank(ctx, RT_AXIS_TP), piece, (char *)st_data(f, src[j]), n, (size_t)es, 0);
        else if (m->tp_split > 0) { fprintf(stderr, "kiln runtime: checkpoint: out of memory\n"); exit(1); }
        memcpy(dst + (a - lo) * es, (piece ? piece : (const char *)st_data(f, src[j])) + (a - o) * es, (size_t)((e - a) * es));
        free(piece);
    }
}

/* The states a load writes: every one; init (--init, params only): the
 * param shards alone. */
static int loads_state(const rt_tensor *t, int init) { return !init || rt_is_param_shard(t); }

static void copy_states(rt_ctx *ctx, const Binding *b, int init) {
    for (int i = 0; i < b->p->nstates; i++) {
        const rt_tensor *t = &b->p->states[i];
        if (!loads_state(t, init)) continue;
        if (is_shard(t)) copy_shard(ctx, b->f, b->p, t, b->msrc + b->moff[i], init);
        else copy_in(ctx, b->f, b->p, t, 1, b->src + b->p->nparams + i);
    }
}

/* Push what the load wrote into the host views (every stored param, the
 * states copy_states wrote) to the device.  0, or -1 with err. */
static int push_loaded(rt_ctx *ctx, const rt_program *p, const char *path, int init, char *err, int errlen) {
    char e[512];
    for (int i = 0; i < p->nparams; i++)
        if (rt_push_tensor(ctx, &p->params[i], e, sizeof e) != 0) return rt_errf(err, errlen, "%s: loading %s: %s", path, p->params[i].name, e);
    for (int i = 0; i < p->nstates; i++)
        if (loads_state(&p->states[i], init) && rt_push_tensor(ctx, &p->states[i], e, sizeof e) != 0)
            return rt_errf(err, errlen, "%s: loading %s: %s", path, p->states[i].name, e);
    return 0;
}

/* Room for the members of every sharded state. */
static int member_slots(Binding *b) {
    const rt_program *p = b->p;
    int total = 0;
    if (!(b->moff = calloc((size_t)p->nstates + 1, sizeof *b->moff))) return -1;
    for (int i = 0; i < p->nstates; i++) {
        b->moff[i] = total;
        if (is_shard(&p->states[i])) total += p->buckets[p->states[i].bucket].nmembers;
    }
    return (b->msrc = calloc((size_t)total + 1, sizeof *b->msrc)) ? 0 : -1;
}

/* Load path into the program: params (stored, and the param shards cut
 * from them), the other states unless init, the trainer's state when
 * x != NULL.  0; -1 with err when the file does not fit (nothing written);
 * -2 with err when a push to the device failed (the host views written). */
static int load(rt_ctx *ctx, const rt_program *p, const char *path, int init, CkptExtra *x, char *err, int errlen) {
    StFile f;
    if (st_open(&f, path, err, errlen) != 0) return -1;
    Binding b = {.f = &f, .p = p, .ctx = ctx, .gpt2 = is_gpt2(p), .init = init, .note = init && rt_world_rank(ctx) == 0, .used = calloc((size_t)f.n + 1, 1),
                 .src = calloc((size_t)p->nparams + (size_t)p->nstates + 1, sizeof(StEntry *))};
    int rc = -1;
    if (!b.used || !b.src || member_slots(&b)) { rt_errf(err, errlen, "%s: out of memory", path); goto done; }
    if (bind_params(&b, err, errlen)) goto done;
    if (!init && bind_states(&b, err, errlen)) goto done;
    if (x && bind_extra(&b, err, errlen)) goto done;
    if (check_complete(&b, init, x != NULL, err, errlen)) goto done;
    /* everything checked: now write the program's memory */
    copy_in(ctx, &f, p, p->params, p->nparams, b.src);
    copy_states(ctx, &b, init);
    if (push_loaded(ctx, p, path, init, err, errlen) != 0) {
        rc = -2;
        goto done;
    }
    if (x) {
        memcpy(&x->step, st_data(&f, b.xt[0]), 8);
        memcpy(&x->rng, st_data(&f, b.xt[1]), 8);
        memcpy(&x->data_pos, st_data(&f, b.xt[2]), 8);
        for (int i = 0; p->schedule && b.has_sched && i < 4; i++) *sched_field(p->schedule, i) = b.sched[i];
    }
    rc = 0;
done:
    free(b.used);
    free(b.src);
    free(b.msrc);
    free(b.moff);
    st_close(&f);
    return rc;
}

int ckpt_load(rt_ctx *ctx, const rt_program *p, const char *path, CkptExtra *x, char *err, int errlen) {
    return load(ctx, p, path, 0, x, err, errlen) == 0 ? 0 : -1;
}

int ckpt_init_weights(rt_ctx *ctx, const rt_program *p, const char *file, char *err, int errlen) {
    return load(ctx, p, file, 1, NULL, err, errlen) == 0 ? 0 : -1;
}

int ckpt_resume(rt_ctx *ctx, const rt_program *p, const char *dir, CkptExtra *x, char *used, int usedlen, char *err, int errlen) {
    Found *f;
    int n;
    if (list_ckpts(dir, &f, &n, err, errlen) != 0) return -1;
    if (n == 0) {
        free(f);
        rt_errf(err, errlen, "%s: no checkpoint (step_*.safetensors) in it", dir);
        return 1;
    }
    char path[4096], e[1024], first[1024] = "";
    int rc = -1;
    for (int i = 0; i < n && rc != 0; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, f[i].name);
        int r = load(ctx, p, path, 0, x, e, sizeof e);
        if (r == -2) { /* the device failed, not the file: an older one would too */
            free(f);
            return rt_errf(err, errlen, "%s", e);
        }
        if (r == 0) {
            if (used) snprintf(used, (size_t)usedlen, "%s", path);
            if (i > 0) fprintf(stderr, "warning: skipped %d newer checkpoint%s; the newest: %s\n", i, i > 1 ? "s" : "", first);
            rc = 0;
        } else if (!first[0]) snprintf(first, sizeof first, "%s", e);
    }
    if (rc) rt_errf(err, errlen, "%s: no valid checkpoint among %d; the newest: %s", dir, n, first);
    free(f);
    return rc;
}
