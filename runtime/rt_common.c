/* rt_common.c — the device-neutral host half of the runtime, shared by the
 * CPU device (dev_cpu.c) and the CUDA device (dev_cuda.c): checking a
 * program table, mapping host memory for the spaces, and initialising the
 * parameters.
 *
 * One copy, because the two devices must agree bit for bit.  A CUDA run and
 * a CPU run of the same model start from the same f32 master weights only
 * if both draw them from the same generator in the same order; keeping one
 * copy of that code is what makes "the GPU's loss after 10 steps is within
 * bf16 tolerance of the CPU's" a statement about the kernels and not about
 * two initialisers drifting apart.
 *
 * Checking.  rt_check_program refuses, in one line each, a program of
 * another ABI version, one compiled for another device (a CUDA program
 * handed to the CPU runtime, or the reverse), a malformed table, and a
 * tensor outside its space.  A param may instead have no storage (space -1,
 * offset -1: a --zero 1 program keeps it only in a param shard);
 * rt_check_buckets then insists that every such param has exactly one home
 * and that the buckets fit the mesh and their members.
 *
 * Initialisation.  rt_init_host writes through rt_tensor_ptr, so it fills
 * whatever the device calls its host view: the program's memory on the
 * CPU, the host mirror on a GPU (dev_cuda.c pushes it afterwards).  A
 * "normal" param is drawn in blocks of 64 Ki values on rt_parallel_for: the
 * generator (rng.h) has random access, so block b computes values
 * [b*64Ki, (b+1)*64Ki) of the param's stream alone, and the result does not
 * depend on how the blocks are spread over threads.  The same random access
 * lets a param shard (prefix "") draw each member's part of this rank's
 * chunk of the flat bucket directly: the shard equals the chunk of what a
 * stored param would hold, bit for bit.
 *
 * Host memory.  rt_map_host maps zeroed, page-aligned anonymous memory:
 * untouched pages cost nothing, so a GPU's mirror of a large activation
 * space costs only the pages the trainer actually reads and writes.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "rng.h"
#include "rt_common.h"

const char *const rt_space_name[RT_NSPACES] = {"params", "grads", "opt", "act", "host"};

/* ---- mesh arithmetic (rt_private.h; comm_mpi.c and comm_single.c) ---- */

int rt_mesh_group_size(const rt_program *p, int mask) {
    if (mask <= 0 || mask >= 16) return 0;
    int s = 1;
    for (int a = 0; a < 4; a++)
        if (mask & (1 << a)) s *= (p->mesh[a] > 0 ? p->mesh[a] : 1);
    return s;
}

const char *rt_group_name(int mask, char *buf, int len) {
    static const char *const axes[4] = {"pp", "dp", "cp", "tp"};
    int k = 0;
    buf[0] = 0;
    for (int a = 0; a < 4; a++)
        if (mask & (1 << a)) k += snprintf(buf + k, (size_t)(len - k > 0 ? len - k : 0), "%s%s", k ? "+" : "", axes[a]);
    if (!buf[0]) snprintf(buf, (size_t)len, "mask %d", mask);
    return buf;
}

const char *rt_device_name(int device, const char *arch, char *buf, int len) {
    if (device == RT_DEV_CPU) snprintf(buf, (size_t)len, "the CPU device");
    else if (device == RT_DEV_CUDA && arch) snprintf(buf, (size_t)len, "the CUDA device (%s)", arch);
    else if (device == RT_DEV_CUDA) snprintf(buf, (size_t)len, "the CUDA device");
    else snprintf(buf, (size_t)len, "an unknown device (%d)", device);
    return buf;
}

/* ---- checking a program ---- */

/* Every tensor inside its space; a param may instead have no storage
 * (space -1, offset -1: its values live in a param shard, rt_check_buckets). */
static int check_tensors(const rt_program *p, const rt_tensor *t, int n, const char *what) {
    int params = t == p->params;
    if (n > 0 && !t) {
        fprintf(stderr, "kiln runtime: malformed program table: %d %ss but no table\n", n, what);
        return 0;
    }
    for (int i = 0; i < n; i++) {
        int sp = t[i].space, ok = t[i].rank >= 0 && t[i].rank <= 5;
        for (int d = 0; ok && d < t[i].rank; d++) ok = t[i].dim[d] >= 0;
        if (ok && params && sp == -1) {
            if (t[i].offset == -1) continue;
            fprintf(stderr, "kiln runtime: param %s has no storage (space -1) but offset %lld, not -1\n", t[i].name, (long long)t[i].offset);
            return 0;
        }
        ok = ok && sp >= 0 && sp < RT_NSPACES && t[i].offset >= 0;
        if (!ok || t[i].offset + rt_tensor_bytes(&t[i]) > p->space_bytes[sp]) {
            fprintf(stderr, "kiln runtime: %s %s lies outside its memory space\n", what, t[i].name);
            return 0;
        }
    }
    return 1;
}

int rt_check_program(const rt_program *p, int device) {
    char want[64], got[64];
    if (p->abi_version != RT_ABI_VERSION) {
        fprintf(stderr, "kiln runtime: program ABI version %d, runtime %d: recompile the program\n",
                p->abi_version, RT_ABI_VERSION);
        return 0;
    }
    if (p->device != device) {
        fprintf(stderr, "kiln runtime: %s was compiled for %s, but this runtime runs on %s: compile it with --target %s\n",
                p->model ? p->model : "the program", rt_device_name(p->device, p->arch, got, sizeof got),
                rt_device_name(device, NULL, want, sizeof want), device == RT_DEV_CPU ? "cpu" : "cuda:sm_XX");
        return 0;
    }
    if (!p->step || p->nstreams < 0 || p->nevents < 0 || p->nparams < 0 || p->nstates < 0 || p->ninputs < 0 || p->noutputs < 0) {
        fprintf(stderr, "kiln runtime: malformed program table\n");
        return 0;
    }
    for (int i = 0; i < RT_NSPACES; i++)
        if (p->space_bytes[i] < 0) {
            fprintf(stderr, "kiln runtime: negative size of space %s\n", rt_space_name[i]);
            return 0;
        }
    return check_tensors(p, p->params, p->nparams, "param") && check_tensors(p, p->states, p->nstates, "state") &&
           check_tensors(p, p->inputs, p->ninputs, "input") && check_tensors(p, p->outputs, p->noutputs, "output");
}

/* The param shards (prefix ""): at most one per bucket, its members of its
 * dtype and without storage of their own; and every param without storage
 * is a member of exactly one bucket that has a param shard (its values
 * must live somewhere, once).  Buckets are already checked. */
static int check_param_shards(const rt_program *p) {
    const char *model = p->model ? p->model : "program";
    int *home = malloc(sizeof(int) * ((size_t)p->nparams + 1)), ok = 1; /* per param: its param shard's state, or -1 */
    if (!home) {
        fprintf(stderr, "kiln runtime: out of memory checking the param shards\n");
        return 0;
    }
    for (int i = 0; i < p->nparams; i++) home[i] = -1;
    for (int s = 0; ok && s < p->nstates; s++) {
        const rt_tensor *t = &p->states[s];
        if (!rt_is_param_shard(t)) continue;
        const rt_bucket *k = &p->buckets[t->bucket];
        for (int j = 0; ok && j < k->nmembers; j++) {
            const rt_tensor *m = &p->params[k->param[j]];
            const char *why = home[k->param[j]] >= 0 ? "is in two param shards"
                              : rt_is_stored(m)        ? "has storage of its own (space >= 0)"
                              : m->dtype != t->dtype   ? "has another dtype than the shard"
                                                       : NULL;
            if (why) fprintf(stderr, "kiln runtime: %s: param shard %s: member %s %s\n", model, t->name, m->name, why);
            ok = !why;
            home[k->param[j]] = s;
        }
    }
    for (int i = 0; ok && i < p->nparams; i++)
        if (!rt_is_stored(&p->params[i]) && home[i] < 0) {
            fprintf(stderr, "kiln runtime: %s: param %s has no storage and is in no param shard (state with prefix \"\")\n", model, p->params[i].name);
            ok = 0;
        }
    free(home);
    return ok;
}

/* A state is a shard when its prefix is set (tables written before buckets
 * existed have bucket 0 and prefix NULL: unsharded). */
int rt_check_buckets(const rt_program *p) {
    const char *model = p->model ? p->model : "program";
    if (p->nbuckets < 0 || (p->nbuckets > 0 && !p->buckets)) {
        fprintf(stderr, "kiln runtime: %s: malformed bucket table\n", model);
        return 0;
    }
    for (int b = 0; b < p->nbuckets; b++) {
        const rt_bucket *k = &p->buckets[b];
        int size = rt_mesh_group_size(p, k->group);
        if (size == 0 || k->n < 0 || k->n % size || k->nmembers < 0 || (k->nmembers > 0 && (!k->param || !k->offset))) {
            fprintf(stderr, "kiln runtime: %s: bucket %d: bad group %d, length %lld or members\n", model, b, k->group, (long long)k->n);
            return 0;
        }
        for (int j = 0; j < k->nmembers; j++) {
            int i = k->param[j];
            if (i < 0 || i >= p->nparams || k->offset[j] < 0 || k->offset[j] + rt_tensor_numel(&p->params[i]) > k->n) {
                fprintf(stderr, "kiln runtime: %s: bucket %d: member %d (param %d) lies outside the bucket\n", model, b, j, i);
                return 0;
            }
        }
    }
    for (int s = 0; s < p->nstates; s++) {
        const rt_tensor *t = &p->states[s];
        if (!rt_is_shard(t)) continue;
        if (t->bucket < 0 || t->bucket >= p->nbuckets) {
            fprintf(stderr, "kiln runtime: %s: state %s: bucket %d out of range (program has %d)\n", model, t->name, t->bucket, p->nbuckets);
            return 0;
        }
        const rt_bucket *k = &p->buckets[t->bucket];
        if (rt_tensor_numel(t) != k->n / rt_mesh_group_size(p, k->group)) {
            fprintf(stderr, "kiln runtime: %s: state %s: %lld elements, but a shard of bucket %d has %lld\n", model, t->name,
                    (long long)rt_tensor_numel(t), t->bucket, (long long)(k->n / rt_mesh_group_size(p, k->group)));
            return 0;
        }
    }
    return check_param_shards(p);
}

/* ---- host memory ---- */

char *rt_map_host(int64_t bytes, const char *space, size_t *mapped) {
    size_t n = bytes < 64 ? 64 : (size_t)bytes;
    void *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
        fprintf(stderr, "kiln runtime: cannot allocate %lld bytes for the %s space: %s\n", (long long)bytes, space, strerror(errno));
        *mapped = 0;
        return NULL;
    }
    if (n >= (2u << 20)) (void)madvise(m, n, MADV_HUGEPAGE); /* advice only: its result does not matter */
    *mapped = n;
    return m;
}

int rt_unmap_host(char *m, size_t mapped) {
    if (!mapped || munmap(m, mapped) == 0) return 0;
    fprintf(stderr, "kiln runtime: munmap: %s\n", strerror(errno));
    return -1;
}

/* ---- parameters ---- */

void rt_normal_fill(float *dst, int64_t n, const char *name, uint64_t seed, double std) {
    rng_normal_f32(dst, 0, n, rng_stream(name, seed), std);
}

/* A "normal" init in blocks on the pool: the stream has random access, so
 * values first .. first+n of a param's stream can be drawn alone (a shard). */
enum { NORMAL_BLOCK = 1 << 16 };

typedef struct {
    float *dst;
    int64_t first, n;
    uint64_t stream;
    double std;
} NormalJob;

static void normal_blocks(void *data, int64_t b0, int64_t b1) {
    const NormalJob *j = data;
    int64_t i0 = b0 * NORMAL_BLOCK, i1 = b1 * NORMAL_BLOCK < j->n ? b1 * NORMAL_BLOCK : j->n;
    rng_normal_f32(j->dst + i0, j->first + i0, i1 - i0, j->stream, j->std);
}

/* Elements first .. first+n of this rank's piece of a param split over tp
 * (tp_split, tp_blocks): each run of elements contiguous in the logical
 * tensor drawn at its logical position, so the piece holds exactly its
 * part of the unsplit param's init. */
static void init_tp_piece(rt_ctx *c, const rt_tensor *t, void *dst, int64_t first, int64_t n, uint64_t seed) {
    int d = t->tp_split - 1, tp = rt_group_size(c, RT_AXIS_TP), r = rt_group_rank(c, RT_AXIS_TP);
    int64_t blocks = t->tp_blocks > 1 ? t->tp_blocks : 1, inner = 1, bl = t->dim[d] / blocks; /* local block length */
    for (int k = d + 1; k < t->rank; k++) inner *= t->dim[k];
    int64_t run = bl * inner; /* elements of one local block row: contiguous in both */
    uint64_t stream = rng_stream(t->name, seed);
    for (int64_t i = first; i < first + n;) {
        int64_t row = i / run, off = i % run, len = run - off < first + n - i ? run - off : first + n - i;
        int64_t outer = row / blocks, b = row % blocks; /* row = outer index x blocks + block */
        int64_t g = ((outer * blocks + b) * tp + r) * run + off; /* the logical element */
        rng_normal_f32((float *)dst + (i - first), g, len, stream, t->std);
        i += len;
    }
}

/* Elements first .. first+n of param t's init (row-major) into dst: the
 * same values wherever they land, so a shard holds exactly its chunk of
 * the stored param's init. */
static void init_range(rt_ctx *c, const rt_tensor *t, void *dst, int64_t first, int64_t n, uint64_t seed) {
    const char *init = t->init ? t->init : "normal";
    if (strcmp(init, "zeros") == 0) {
        memset(dst, 0, (size_t)(n * rt_dtype_size(t->dtype)));
        return;
    }
    if (t->dtype != RT_F32) {
        fprintf(stderr, "kiln runtime: param %s: init \"%s\" needs an f32 tensor\n", t->name, init);
        exit(1);
    }
    if (strcmp(init, "ones") == 0) {
        for (int64_t i = 0; i < n; i++) ((float *)dst)[i] = 1.0f;
    } else if (strcmp(init, "normal") == 0 && t->tp_split > 0) {
        init_tp_piece(c, t, dst, first, n, seed);
    } else if (strcmp(init, "normal") == 0) {
        NormalJob j = {dst, first, n, rng_stream(t->name, seed), t->std};
        rt_parallel_for(c, (n + NORMAL_BLOCK - 1) / NORMAL_BLOCK, normal_blocks, &j);
    } else {
        fprintf(stderr, "kiln runtime: param %s: unknown init \"%s\"\n", t->name, init);
        exit(1);
    }
}

/* A param shard: this rank's elements [lo, lo+len) of the flat bucket, each
 * member's part from its init, padding zero. */
static void init_param_shard(rt_ctx *c, const rt_program *p, const rt_tensor *t, uint64_t seed) {
    const rt_bucket *k = &p->buckets[t->bucket];
    int64_t len = k->n / rt_group_size(c, k->group), lo = rt_group_rank(c, k->group) * len, es = rt_dtype_size(t->dtype);
    char *dst = rt_tensor_ptr(c, t);
    memset(dst, 0, (size_t)(len * es));
    for (int j = 0; j < k->nmembers; j++) {
        const rt_tensor *m = &p->params[k->param[j]];
        int64_t o = k->offset[j], n = rt_tensor_numel(m);
        int64_t a = lo > o ? lo : o, e = lo + len < o + n ? lo + len : o + n;
        if (a < e) init_range(c, m, dst + (a - lo) * es, a - o, e - a, seed);
    }
}

void rt_init_host(rt_ctx *c, const rt_program *p, uint64_t seed) {
    for (int i = 0; i < p->nparams; i++)
        if (rt_is_stored(&p->params[i])) init_range(c, &p->params[i], rt_tensor_ptr(c, &p->params[i]), 0, rt_tensor_numel(&p->params[i]), seed);
    for (int i = 0; i < p->nstates; i++) {
        const rt_tensor *t = &p->states[i];
        if (rt_is_param_shard(t)) init_param_shard(c, p, t, seed);
        else memset(rt_tensor_ptr(c, t), 0, (size_t)rt_tensor_bytes(t));
    }
}

int rt_in_range(rt_ctx *c, int v, int n, const char *what, const char *who) {
    if (v >= 0 && v < n) return 1;
    rt_fail(c, "%s: %s %d out of range (program has %d)", who, what, v, n);
    return 0;
}

int rt_launch_ok(rt_ctx *c, int stream, int nstreams, rt_kernel k, int nargs, const char *name) {
    if (!rt_in_range(c, stream, nstreams, "stream", "rt_launch")) return 0;
    if (nargs >= 0 && k) return 1;
    rt_fail(c, "rt_launch %s: bad kernel or nargs %d", name ? name : "?", nargs);
    return 0;
}

/* s up to end (NULL: its end) as a JSON string */
void rt_json_string(FILE *f, const char *s, const char *end) {
    fputc('"', f);
    for (; s && *s && s != end; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
        else if (ch < 0x20) fprintf(f, "\\u%04x", ch);
        else fputc(ch, f);
    }
    fputc('"', f);
}

