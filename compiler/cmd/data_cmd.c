/* data_cmd.c — `kiln data IN... -o PREFIX [--val-fraction F] [--shard-tokens N]
 *                          [--bpe DIR | --encoder FILE --vocab-bpe FILE]`.
 *
 * Turns text files into llm.c token shards (version 1: uint16 ids).  Tokens
 * are bytes (vocabulary 256) by default, or GPT-2 BPE ids (vocabulary 50257,
 * runtime/bpe.c) given GPT-2's encoder.json and vocab.bpe.  Byte-level
 * tokens are streamed; BPE encodes each file on its own, in chunks cut
 * where the encoding cannot change (bpe_safe_cut), and holds the ids in
 * memory (4 bytes a token) to split them.  The inputs are taken in
 * order as one stream; its last F of the tokens (default 0.1) become
 * PREFIX_val_000000.bin, ..., the rest PREFIX_train_000000.bin, ..., each
 * shard holding at most N tokens (default 100,000,000, as llm.c).
 *
 * Every input is checked before anything is written, every shard is written
 * to a temporary file, and the shards are renamed into place only when all
 * of them were written: a bad input or a full disk leaves no half-written
 * dataset and nothing written over.
 */
#include "data_cmd.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bpe.h"
#include "cmd.h"
#include "fsutil.h"
#include "shards.h"

typedef struct {
    char **in;
    RtPath *inpaths; /* in[], then the BPE files: what no output may be */
    int nin, ninpaths;
    const char *out;
    double val_fraction;
    long long shard_tokens;
    const char *bpe_dir, *encoder, *vocab_bpe;
} DataArgs;

/* The shards written so far (all still temporary) and the one being filled. */
typedef struct {
    ShardWriter *w;
    int n, cap;
    const char *out, *split;
    const RtPath *inputs; /* no shard may be one of them (fsutil.h) */
    int ninputs;
    long long per_shard, in_current;
    char err[1024];
} Split;

static const char *data_usage = "usage: kiln data IN... -o OUT_PREFIX [--val-fraction F] [--shard-tokens N]\n"
                                 "                 [--bpe DIR | --encoder encoder.json --vocab-bpe vocab.bpe]\n";

static int parse_args(DataArgs *a, int argc, char **argv) {
    a->val_fraction = 0.1;
    a->shard_tokens = 100000000;
    a->in = calloc((size_t)argc, sizeof *a->in);
    a->inpaths = calloc((size_t)argc + 2, sizeof *a->inpaths);
    if (!a->in || !a->inpaths) return cmd_error("out of memory");
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (strcmp(f, "-h") == 0 || strcmp(f, "--help") == 0) {
            fputs(data_usage, stdout);
            exit(0);
        }
        if (f[0] != '-' || f[1] == 0) {
            a->in[a->nin++] = argv[i];
            continue;
        }
        if (i + 1 >= argc) return cmd_error("%s: unknown flag or missing value", f);
        const char *v = argv[++i];
        char *end;
        if (strcmp(f, "-o") == 0) a->out = v;
        else if (strcmp(f, "--val-fraction") == 0) {
            a->val_fraction = strtod(v, &end);
            if (*v == 0 || *end || !(a->val_fraction >= 0 && a->val_fraction < 1))
                return cmd_error("--val-fraction: expected a number in [0, 1), got \"%s\"", v);
        } else if (strcmp(f, "--shard-tokens") == 0) {
            a->shard_tokens = strtoll(v, &end, 10);
            if (*v == 0 || *end || a->shard_tokens < 1 || a->shard_tokens > INT32_MAX)
                return cmd_error("--shard-tokens: expected an integer in [1, %d], got \"%s\"", INT32_MAX, v);
        } else if (strcmp(f, "--bpe") == 0) a->bpe_dir = v;
        else if (strcmp(f, "--encoder") == 0) a->encoder = v;
        else if (strcmp(f, "--vocab-bpe") == 0) a->vocab_bpe = v;
        else return cmd_error("%s: unknown flag", f);
    }
    if (!a->out || a->nin == 0) {
        fputs(data_usage, stderr);
        return 1;
    }
    if (a->bpe_dir && (a->encoder || a->vocab_bpe)) return cmd_error("--bpe DIR replaces --encoder and --vocab-bpe");
    if (!a->encoder != !a->vocab_bpe) return cmd_error("--encoder and --vocab-bpe go together");
    for (int i = 0; i < a->nin; i++) a->inpaths[a->ninpaths++] = (RtPath){"input", a->in[i]};
    if (a->encoder) a->inpaths[a->ninpaths++] = (RtPath){"--encoder", a->encoder};
    if (a->vocab_bpe) a->inpaths[a->ninpaths++] = (RtPath){"--vocab-bpe", a->vocab_bpe};
    return 0;
}

/* Total bytes of the inputs; every one must be a readable regular file. */
static int check_inputs(const DataArgs *a, long long *total) {
    *total = 0;
    for (int i = 0; i < a->nin; i++) {
        struct stat st;
        if (stat(a->in[i], &st) != 0) return cmd_error("%s: cannot open: %s", a->in[i], strerror(errno));
        if (!S_ISREG(st.st_mode)) return cmd_error("%s: not a regular file", a->in[i]);
        if (access(a->in[i], R_OK) != 0) return cmd_error("%s: cannot read: %s", a->in[i], strerror(errno));
        *total += st.st_size;
    }
    return 0;
}

static int split_put(Split *s, const uint32_t *tok, long long n) {
    while (n > 0) {
        if (s->n == 0 || s->in_current == s->per_shard) {
            if (s->n > 0 && shard_finish(&s->w[s->n - 1]) != 0) return -1;
            if (s->n == s->cap) {
                int cap = s->cap ? 2 * s->cap : 8;
                ShardWriter *w = realloc(s->w, (size_t)cap * sizeof *w);
                if (!w) return snprintf(s->err, sizeof s->err, "out of memory"), -1;
                s->w = w, s->cap = cap;
            }
            char path[4096];
            snprintf(path, sizeof path, "%s_%s_%06d.bin", s->out, s->split, s->n);
            if (rt_check_output("-o", path, s->inputs, s->ninputs, s->err, sizeof s->err) != 0) return -1;
            if (shard_begin(&s->w[s->n], path, 1, s->err, sizeof s->err) != 0) return -1;
            s->n++;
            s->in_current = 0;
        }
        long long k = s->per_shard - s->in_current;
        if (k > n) k = n;
        if (shard_put(&s->w[s->n - 1], tok, (size_t)k) != 0) return -1;
        s->in_current += k, tok += k, n -= k;
    }
    return 0;
}

static void split_abort(Split *s) {
    for (int i = 0; i < s->n; i++) shard_abort(&s->w[i]);
    free(s->w);
}

/* Read every input in order; the first ntrain tokens go to train, the rest to val. */
static int stream_inputs(const DataArgs *a, long long ntrain, long long total, Split *train, Split *val) {
    static unsigned char buf[1 << 16];
    static uint32_t tok[1 << 16];
    long long seen = 0;
    for (int i = 0; i < a->nin; i++) {
        FILE *f = fopen(a->in[i], "rb");
        if (!f) return cmd_error("%s: cannot open: %s", a->in[i], strerror(errno));
        size_t k;
        int rc = 0;
        while (rc == 0 && (k = fread(buf, 1, sizeof buf, f)) > 0) {
            for (size_t j = 0; j < k; j++) tok[j] = buf[j];
            long long to_train = ntrain - seen;
            to_train = to_train < 0 ? 0 : to_train > (long long)k ? (long long)k : to_train;
            if (split_put(train, tok, to_train) != 0) rc = cmd_error("%s", train->err);
            else if (split_put(val, tok + to_train, (long long)k - to_train) != 0) rc = cmd_error("%s", val->err);
            seen += (long long)k;
        }
        if (rc == 0 && ferror(f)) rc = cmd_error("%s: read error", a->in[i]);
        fclose(f);
        if (rc != 0) return rc;
    }
    if (seen != total) return cmd_error("the inputs changed while being read (%lld bytes, expected %lld)", seen, total);
    return 0;
}

/* GPT-2's files from --bpe DIR or --encoder/--vocab-bpe; NULL with a line. */
static Bpe *load_bpe(const DataArgs *a) {
    char enc[4096], merges[4096], err[4096];
    const char *flag = a->bpe_dir ? "--bpe" : "--encoder";
    if (a->bpe_dir) {
        snprintf(enc, sizeof enc, "%s/encoder.json", a->bpe_dir);
        snprintf(merges, sizeof merges, "%s/vocab.bpe", a->bpe_dir);
    } else {
        snprintf(enc, sizeof enc, "%s", a->encoder);
        snprintf(merges, sizeof merges, "%s", a->vocab_bpe);
    }
    Bpe *b = bpe_load(enc, merges, err, sizeof err);
    if (!b) cmd_error("%s: %s", flag, err);
    return b;
}

/* Encode the open file f into *ids, a chunk at a time. */
static int bpe_file(Bpe *b, FILE *f, const char *path, uint32_t **ids, size_t *n, size_t *cap, long long *bytes) {
    enum { CHUNK = 1 << 20 };
    char *buf = NULL;
    size_t have = 0, bufcap = 0, k;
    int rc = 0;
    do {
        if (have + CHUNK > bufcap) {
            char *nb = realloc(buf, bufcap = have + CHUNK);
            if (!nb) return free(buf), cmd_error("out of memory");
            buf = nb;
        }
        k = fread(buf + have, 1, CHUNK, f);
        have += k, *bytes += (long long)k;
        size_t cut = k ? bpe_safe_cut(buf, have) : have; /* at the end: all that is left */
        if (bpe_encode(b, buf, cut, ids, n, cap) != 0) rc = cmd_error("out of memory");
        memmove(buf, buf + cut, have - cut);
        have -= cut;
    } while (rc == 0 && k > 0);
    if (rc == 0 && ferror(f)) rc = cmd_error("%s: read error", path);
    free(buf);
    return rc;
}

/* Every input's BPE ids, each file encoded on its own, in order. */
static int bpe_inputs(const DataArgs *a, Bpe *b, long long total, uint32_t **ids, size_t *n) {
    size_t cap = 0;
    long long bytes = 0;
    for (int i = 0; i < a->nin; i++) {
        FILE *f = fopen(a->in[i], "rb");
        if (!f) return cmd_error("%s: cannot open: %s", a->in[i], strerror(errno));
        int rc = bpe_file(b, f, a->in[i], ids, n, &cap, &bytes);
        fclose(f);
        if (rc != 0) return rc;
    }
    if (bytes != total) return cmd_error("the inputs changed while being read (%lld bytes, expected %lld)", bytes, total);
    return 0;
}

static int finish_and_commit(Split *s) {
    if (s->n > 0 && shard_finish(&s->w[s->n - 1]) != 0) return cmd_error("%s", s->err);
    for (int i = 0; i < s->n; i++)
        if (shard_commit(&s->w[i]) != 0) return cmd_error("%s", s->err);
    char path[4096];
    snprintf(path, sizeof path, "%s_%s_%06d.bin", s->out, s->split, s->n);
    if (access(path, F_OK) == 0)
        fprintf(stderr, "kiln data: warning: %s is left from an earlier run; a glob of %s_%s_*.bin would include it\n",
                path, s->out, s->split);
    return 0;
}

/* BPE: encode everything, then split the ids as the bytes are split. */
static int bpe_main(const DataArgs *a, long long total_bytes) {
    Bpe *b = load_bpe(a);
    if (!b) return 1;
    uint32_t *ids = NULL;
    size_t n = 0;
    int rc = bpe_inputs(a, b, total_bytes, &ids, &n);
    long long total = (long long)n, nval = (long long)(a->val_fraction * (double)total + 0.5), ntrain = total - nval;
    if (rc == 0 && ntrain <= 0) rc = cmd_error("no training tokens: the inputs hold %lld BPE tokens", total);
    Split train = {.out = a->out, .split = "train", .per_shard = a->shard_tokens, .inputs = a->inpaths, .ninputs = a->ninpaths};
    Split val = {.out = a->out, .split = "val", .per_shard = a->shard_tokens, .inputs = a->inpaths, .ninputs = a->ninpaths};
    if (rc == 0 && split_put(&train, ids, ntrain) != 0) rc = cmd_error("%s", train.err);
    if (rc == 0 && split_put(&val, ids + ntrain, nval) != 0) rc = cmd_error("%s", val.err);
    if (rc == 0) rc = finish_and_commit(&train);
    if (rc == 0) rc = finish_and_commit(&val);
    if (rc == 0)
        printf("%lld train tokens in %d shard%s (%s_train_*.bin), %lld validation tokens in %d shard%s (%s_val_*.bin); "
               "GPT-2 BPE, vocabulary %u\n",
               ntrain, train.n, train.n == 1 ? "" : "s", a->out, nval, val.n, val.n == 1 ? "" : "s", a->out,
               bpe_vocab(b));
    split_abort(&train);
    split_abort(&val);
    free(ids);
    bpe_free(b);
    return rc;
}

/* Byte level: stream the inputs' bytes straight into the shards. */
static int bytes_main(const DataArgs *a, long long total) {
    long long nval = (long long)(a->val_fraction * (double)total + 0.5), ntrain = total - nval;
    if (ntrain <= 0) return cmd_error("no training tokens: the inputs hold %lld bytes", total);
    Split train = {.out = a->out, .split = "train", .per_shard = a->shard_tokens, .inputs = a->inpaths, .ninputs = a->ninpaths};
    Split val = {.out = a->out, .split = "val", .per_shard = a->shard_tokens, .inputs = a->inpaths, .ninputs = a->ninpaths};
    int rc = stream_inputs(a, ntrain, total, &train, &val);
    if (rc == 0) rc = finish_and_commit(&train);
    if (rc == 0) rc = finish_and_commit(&val);
    if (rc == 0)
        printf("%lld train tokens in %d shard%s (%s_train_*.bin), %lld validation tokens in %d shard%s (%s_val_*.bin); "
               "byte-level, vocabulary 256\n",
               ntrain, train.n, train.n == 1 ? "" : "s", a->out, nval, val.n, val.n == 1 ? "" : "s", a->out);
    split_abort(&train);
    split_abort(&val);
    return rc;
}

int kiln_data_main(int argc, char **argv) {
    cmd_set_prefix("kiln data: ");
    DataArgs a = {0};
    long long total;
    int rc = parse_args(&a, argc, argv);
    if (rc == 0) rc = check_inputs(&a, &total);
    if (rc == 0) rc = a.bpe_dir || a.encoder ? bpe_main(&a, total) : bytes_main(&a, total);
    free(a.in);
    free(a.inpaths);
    return rc;
}
