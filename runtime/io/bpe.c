/* bpe.c — GPT-2 byte-level BPE (see bpe.h).
 *
 * Loading.  encoder.json maps token strings to ids (jansson reads it,
 * json.c); vocab.bpe lists the merges "A B" in rank order after a
 * "#version" line.  Both spell bytes with
 * GPT-2's byte-to-unicode map (the 188 printable bytes stand for themselves,
 * the other 68 are U+0100 onward, in byte order), which we undo at once:
 * every token becomes its raw bytes.  Every merge A+B of GPT-2 is itself a
 * token, so a merge is stored as a pair of ids (idA, idB) -> (rank, idAB),
 * and BPE runs on ids: a pre-token starts as one id per byte and the
 * adjacent pair of lowest rank is merged, everywhere left to right, until no
 * pair has a rank (encoder.py's loop, on ids instead of strings).  Results
 * are cached per pre-token, as in encoder.py (the cache is emptied when it
 * grows past a limit, so memory stays bounded on any corpus).
 *
 * Pre-tokenizing.  The GPT-2 regex is matched by hand (bpe_pretoken_end)
 * on code points decoded from UTF-8; a malformed byte is one code point of
 * class "other".  \p{L}, \p{N} and \s are exact for ASCII and Latin-1
 * (U+0000..U+00FF) and \s is Unicode's White_Space everywhere.  Above
 * U+00FF a small range table decides: the main decimal-digit and number
 * blocks are numbers; combining marks, punctuation, symbols, arrows, box
 * drawing, emoji, private use and specials are "other"; everything else is
 * a letter.  That matches Unicode on ordinary text in most scripts, needs no
 * locale, and is the same on every machine.  Where it differs from Unicode
 * the pre-tokens (and so some ids) differ from GPT-2's, but the ids still
 * decode to the exact text.
 */
#include "bpe.h"
#include "json.h"
#include "fsutil.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { CL_OTHER, CL_LETTER, CL_NUMBER, CL_SPACE };
enum { CACHE_MAX_BYTES = 64 << 20 };

/* ---- a byte-string -> (a, b) hash map with its own key arena ------------- */

typedef struct {
    size_t key;   /* offset of the key in keys */
    uint32_t len; /* key length */
    uint32_t a, b;
} MapEntry;

typedef struct {
    uint32_t *slot; /* 0: empty, else entry index + 1 */
    size_t nslot;   /* a power of two */
    MapEntry *e;
    size_t n, ecap;
    char *keys;
    size_t klen, kcap;
} Map;

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static void map_free(Map *m) {
    free(m->slot), free(m->e), free(m->keys);
    memset(m, 0, sizeof *m);
}

/* The entry of key s[n], or NULL. */
static MapEntry *map_get(const Map *m, const char *s, size_t n) {
    if (!m->nslot) return NULL;
    for (size_t i = hash_bytes(s, n) & (m->nslot - 1);; i = (i + 1) & (m->nslot - 1)) {
        if (!m->slot[i]) return NULL;
        MapEntry *e = &m->e[m->slot[i] - 1];
        if (e->len == n && memcmp(m->keys + e->key, s, n) == 0) return e;
    }
}

static int map_grow_slots(Map *m) {
    size_t nslot = m->nslot ? 2 * m->nslot : 1024;
    uint32_t *slot = calloc(nslot, sizeof *slot);
    if (!slot) return -1;
    for (size_t k = 0; k < m->n; k++) {
        size_t i = hash_bytes(m->keys + m->e[k].key, m->e[k].len) & (nslot - 1);
        while (slot[i]) i = (i + 1) & (nslot - 1);
        slot[i] = (uint32_t)k + 1;
    }
    free(m->slot);
    m->slot = slot, m->nslot = nslot;
    return 0;
}

static int grow(void **p, size_t *cap, size_t need, size_t size) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * size);
    if (!q) return -1;
    *p = q, *cap = c;
    return 0;
}

/* Add key s[n] (not present) with values a, b.  0 or -1 (out of memory). */
static int map_put(Map *m, const char *s, size_t n, uint32_t a, uint32_t b) {
    if (2 * (m->n + 1) > m->nslot && map_grow_slots(m) != 0) return -1;
    if (grow((void **)&m->e, &m->ecap, m->n + 1, sizeof *m->e) != 0) return -1;
    if (grow((void **)&m->keys, &m->kcap, m->klen + n + 1, 1) != 0) return -1;
    memcpy(m->keys + m->klen, s, n);
    m->e[m->n] = (MapEntry){m->klen, (uint32_t)n, a, b};
    m->klen += n;
    size_t i = hash_bytes(s, n) & (m->nslot - 1);
    while (m->slot[i]) i = (i + 1) & (m->nslot - 1);
    m->slot[i] = (uint32_t)++m->n;
    return 0;
}

/* ---- the tokenizer ------------------------------------------------------- */

typedef struct {
    uint64_t key; /* idA << 32 | idB, + 1 (0 marks an empty slot) */
    uint32_t rank, id;
} Merge;

struct Bpe {
    Map tok;               /* token bytes -> id */
    uint32_t *tok_of_id;   /* id -> entry index in tok, UINT32_MAX if none */
    uint32_t vocab;        /* largest id + 1 */
    uint32_t byte_id[256]; /* the id of each single byte */
    Merge *merge;          /* open addressing, nmerge_slot a power of two */
    size_t nmerge_slot;
    Map cache;     /* pre-token bytes -> (start in cache_ids, count) */
    uint32_t *cache_ids;
    size_t ncache_ids, cache_ids_cap;
    uint32_t *work; /* the symbols of the pre-token being merged */
    size_t work_cap;
};

static int bfail(char *err, int errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int bfail(char *err, int errlen, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, (size_t)errlen, fmt, ap);
    va_end(ap);
    return -1;
}

/* GPT-2's bytes_to_unicode, inverted: code point -> byte, -1 if none. */
static int unicode_to_byte(uint32_t cp) {
    static int table[324];
    static int ready;
    if (!ready) {
        int extra = 0;
        for (int b = 0; b < 256; b++) {
            int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
            table[printable ? b : 256 + extra++] = b;
        }
        ready = 1;
    }
    return cp < 324 ? table[cp] : -1;
}

/* Decode one UTF-8 code point at s[i] (i < n); *len bytes.  A malformed
 * byte decodes as 0xFFFFFFFF, one byte long. */
static uint32_t utf8_at(const unsigned char *s, size_t n, size_t i, size_t *len) {
    unsigned c = s[i];
    int k = c < 0x80 ? 0 : (c & 0xE0) == 0xC0 ? 1 : (c & 0xF0) == 0xE0 ? 2 : (c & 0xF8) == 0xF0 ? 3 : -1;
    uint32_t cp = k == 0 ? c : k == 1 ? c & 0x1F : k == 2 ? c & 0x0F : c & 0x07;
    if (k < 0 || i + (size_t)k >= n + (k == 0)) goto bad;
    for (int j = 1; j <= k; j++) {
        if ((s[i + j] & 0xC0) != 0x80) goto bad;
        cp = cp << 6 | (s[i + j] & 0x3F);
    }
    static const uint32_t least[4] = {0, 0x80, 0x800, 0x10000};
    if (cp < least[k] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) goto bad;
    *len = (size_t)k + 1;
    return cp;
bad:
    *len = 1;
    return 0xFFFFFFFFu;
}

/* ---- loading ------------------------------------------------------------- */

static char *read_file(const char *path, size_t *n, char *err, int errlen) {
    int fd = rt_open_input(NULL, path, err, errlen); /* a FIFO or a device is refused, not read forever */
    FILE *f = fd < 0 ? NULL : fdopen(fd, "rb");
    if (fd >= 0 && !f) close(fd), bfail(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    if (!f) return NULL;
    char *buf = NULL;
    size_t cap = 0, len = 0, k;
    do {
        if (grow((void **)&buf, &cap, len + 65536 + 1, 1) != 0) {
            free(buf), fclose(f);
            return bfail(err, errlen, "%s: out of memory", path), NULL;
        }
        k = fread(buf + len, 1, 65536, f);
        len += k;
    } while (k > 0);
    int bad = ferror(f);
    fclose(f);
    if (bad) return free(buf), bfail(err, errlen, "%s: read error", path), NULL;
    buf[len] = 0;
    *n = len;
    return buf;
}

/* Append the bytes GPT-2's map spells with the UTF-8 text s[n] to out.
 * -1 if a code point is not in the map. */
static int unmap_bytes(const char *s, size_t n, char *out, size_t *outn) {
    *outn = 0;
    for (size_t i = 0, len; i < n; i += len) {
        int b = unicode_to_byte(utf8_at((const unsigned char *)s, n, i, &len));
        if (b < 0) return -1;
        out[(*outn)++] = (char)b;
    }
    return 0;
}

/* One entry "token": id of encoder.json into b->tok; bytes has room for the
 * token's bytes. */
static int encoder_entry(Bpe *b, const char *path, const char *key, const json_t *v, char *bytes, char *err, int errlen) {
    size_t kn = strlen(key), bn;
    int shown = (int)(kn > 40 ? 40 : kn);
    json_int_t id = json_is_integer(v) ? json_integer_value(v) : -1;
    if (id < 0 || id > 65535) return bfail(err, errlen, "%s: \"%.*s\": expected an id in [0, 65535]", path, shown, key);
    if (unmap_bytes(key, kn, bytes, &bn) != 0 || bn == 0)
        return bfail(err, errlen, "%s: \"%.*s\": not a byte-level BPE token", path, shown, key);
    if (map_get(&b->tok, bytes, bn)) return bfail(err, errlen, "%s: \"%.*s\" appears twice", path, shown, key);
    if (map_put(&b->tok, bytes, bn, (uint32_t)id, 0) != 0) return bfail(err, errlen, "%s: out of memory", path);
    if ((uint32_t)id + 1 > b->vocab) b->vocab = (uint32_t)id + 1;
    return 0;
}

/* encoder.json: {"token": id, ...} into b->tok, parsed by jansson.  A
 * syntax error where an id belongs names the token before it. */
static int load_encoder(Bpe *b, const char *path, char *err, int errlen) {
    size_t len, used;
    char *text = read_file(path, &len, err, errlen);
    if (!text) return -1;
    RtJsonError je;
    json_t *top = rt_json_load(text, len, JSON_REJECT_DUPLICATES, &used, &je);
    char *bytes = malloc(len + 1);
    int rc = -1;
    const char *key;
    json_t *v;
    if (!top && je.at_value)
        bfail(err, errlen, "%s: \"%s\": expected an id in [0, 65535] (%s%s at byte %d)", path, je.key, je.what, je.near, je.byte);
    else if (!top) bfail(err, errlen, "%s: %s%s at byte %d", path, je.what, je.near, je.byte);
    else if (!json_is_object(top)) bfail(err, errlen, "%s: not a JSON object", path);
    else if (!bytes) bfail(err, errlen, "%s: out of memory", path);
    else {
        rc = 0;
        json_object_foreach(top, key, v)
            if ((rc = encoder_entry(b, path, key, v, bytes, err, errlen)) != 0) break;
    }
    json_decref(top);
    free(text), free(bytes);
    return rc;
}

/* id -> entry index; every id must be unique and every byte a token. */
static int index_ids(Bpe *b, const char *path, char *err, int errlen) {
    b->tok_of_id = malloc((b->vocab ? b->vocab : 1) * sizeof *b->tok_of_id);
    if (!b->tok_of_id) return bfail(err, errlen, "%s: out of memory", path);
    memset(b->tok_of_id, 0xFF, b->vocab * sizeof *b->tok_of_id);
    for (size_t k = 0; k < b->tok.n; k++) {
        uint32_t id = b->tok.e[k].a;
        if (b->tok_of_id[id] != UINT32_MAX) return bfail(err, errlen, "%s: id %u is given to two tokens", path, id);
        b->tok_of_id[id] = (uint32_t)k;
    }
    for (int c = 0; c < 256; c++) {
        char ch = (char)c;
        MapEntry *e = map_get(&b->tok, &ch, 1);
        if (!e) return bfail(err, errlen, "%s: byte 0x%02x has no token", path, c);
        b->byte_id[c] = e->a;
    }
    return 0;
}

static uint64_t pair_key(uint32_t x, uint32_t y) { return ((uint64_t)x << 32 | y) + 1; }

static size_t pair_slot(const Bpe *b, uint64_t key) {
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    size_t i = (size_t)(h >> 20) & (b->nmerge_slot - 1);
    while (b->merge[i].key && b->merge[i].key != key) i = (i + 1) & (b->nmerge_slot - 1);
    return i;
}

/* The token id of a vocab.bpe symbol, or -1. */
static long symbol_id(const Bpe *b, const char *s, size_t n, char *tmp) {
    size_t bn;
    if (unmap_bytes(s, n, tmp, &bn) != 0) return -1;
    MapEntry *e = map_get(&b->tok, tmp, bn);
    return e ? (long)e->a : -1;
}

/* vocab.bpe: a header line, then "A B" per line in rank order. */
static int load_merges(Bpe *b, const char *path, char *err, int errlen) {
    size_t len;
    char *text = read_file(path, &len, err, errlen);
    if (!text) return -1;
    char *tmp = malloc(len + 1);
    size_t nlines = 0;
    for (size_t i = 0; i < len; i++) nlines += text[i] == '\n';
    b->nmerge_slot = 1024;
    while (b->nmerge_slot < 2 * (nlines + 1)) b->nmerge_slot *= 2;
    b->merge = calloc(b->nmerge_slot, sizeof *b->merge);
    int rc = -1;
    if (!tmp || !b->merge) {
        bfail(err, errlen, "%s: out of memory", path);
        goto done;
    }
    char *line = strchr(text, '\n'); /* skip the "#version" line */
    uint32_t rank = 0;
    for (int lineno = 2; line && *++line; lineno++) {
        char *eol = strchr(line, '\n');
        size_t n = eol ? (size_t)(eol - line) : strlen(line);
        if (n && line[n - 1] == '\r') n--;
        char *sp = memchr(line, ' ', n);
        if (n == 0 && !eol) break;
        long x = sp ? symbol_id(b, line, (size_t)(sp - line), tmp) : -1;
        long y = sp ? symbol_id(b, sp + 1, n - (size_t)(sp + 1 - line), tmp) : -1;
        long xy = -1; /* the token A+B */
        size_t an, bn;
        if (x >= 0 && y >= 0 && unmap_bytes(line, (size_t)(sp - line), tmp, &an) == 0 &&
            unmap_bytes(sp + 1, n - (size_t)(sp + 1 - line), tmp + an, &bn) == 0) {
            MapEntry *e = map_get(&b->tok, tmp, an + bn);
            xy = e ? (long)e->a : -1;
        }
        if (x < 0 || y < 0 || xy < 0) {
            bfail(err, errlen, "%s:%d: \"%.*s\" is not a merge of two tokens into a token of the encoder", path,
                  lineno, (int)(n > 60 ? 60 : n), line);
            goto done;
        }
        size_t i = pair_slot(b, pair_key((uint32_t)x, (uint32_t)y));
        if (!b->merge[i].key) b->merge[i] = (Merge){pair_key((uint32_t)x, (uint32_t)y), rank, (uint32_t)xy};
        rank++;
        line = eol;
    }
    rc = 0;
done:
    free(text), free(tmp);
    return rc;
}

Bpe *bpe_load(const char *encoder_json, const char *vocab_bpe, char *err, int errlen) {
    Bpe *b = calloc(1, sizeof *b);
    if (!b) return bfail(err, errlen, "out of memory"), NULL;
    if (load_encoder(b, encoder_json, err, errlen) != 0 || index_ids(b, encoder_json, err, errlen) != 0 ||
        load_merges(b, vocab_bpe, err, errlen) != 0) {
        bpe_free(b);
        return NULL;
    }
    return b;
}

void bpe_free(Bpe *b) {
    if (!b) return;
    map_free(&b->tok), map_free(&b->cache);
    free(b->tok_of_id), free(b->merge), free(b->cache_ids), free(b->work);
    free(b);
}

uint32_t bpe_vocab(const Bpe *b) { return b->vocab; }

const char *bpe_token(const Bpe *b, uint32_t id, size_t *len) {
    if (id >= b->vocab || b->tok_of_id[id] == UINT32_MAX) return NULL;
    const MapEntry *e = &b->tok.e[b->tok_of_id[id]];
    *len = e->len;
    return b->tok.keys + e->key;
}

/* ---- pre-tokenizing ------------------------------------------------------ */

typedef struct {
    uint32_t lo, hi;
} Range;

/* Above U+00FF: numbers (checked first), then non-letters; the rest are letters. */
static const Range numbers[] = {
    {0x0660, 0x0669}, {0x06F0, 0x06F9}, {0x07C0, 0x07C9}, {0x0966, 0x096F}, {0x09E6, 0x09EF}, {0x0A66, 0x0A6F},
    {0x0AE6, 0x0AEF}, {0x0B66, 0x0B6F}, {0x0BE6, 0x0BEF}, {0x0C66, 0x0C6F}, {0x0CE6, 0x0CEF}, {0x0D66, 0x0D6F},
    {0x0E50, 0x0E59}, {0x0ED0, 0x0ED9}, {0x0F20, 0x0F33}, {0x1040, 0x1049}, {0x17E0, 0x17E9}, {0x1810, 0x1819},
    {0x2070, 0x2070}, {0x2074, 0x2079}, {0x2080, 0x2089}, {0x2150, 0x2189}, {0x2460, 0x249B}, {0x24EA, 0x24FF},
    {0x2776, 0x2793}, {0x3007, 0x3007}, {0x3021, 0x3029}, {0x3038, 0x303A}, {0xFF10, 0xFF19},
};
static const Range others[] = {
    {0x0300, 0x036F}, /* combining diacritical marks */
    {0x2000, 0x2BFF}, /* punctuation, super/subscripts, currency, letterlike, arrows, math, technical, boxes, dingbats */
    {0x2E00, 0x2E7F}, /* supplemental punctuation */
    {0x3000, 0x3004}, {0x3008, 0x3020}, {0x3030, 0x3037}, {0x303D, 0x303F}, /* CJK symbols and punctuation */
    {0xD800, 0xF8FF}, /* surrogates, private use */
    {0xFE00, 0xFE0F}, {0xFE30, 0xFE6F}, /* variation selectors, CJK compatibility and small forms */
    {0xFF00, 0xFF0F}, {0xFF1A, 0xFF20}, {0xFF3B, 0xFF40}, {0xFF5B, 0xFF65}, /* fullwidth punctuation */
    {0xFFF0, 0xFFFF}, {0x1F000, 0x1FAFF}, /* specials; emoji and pictographs */
    {0xE0000, 0xFFFFFFFF}, /* tags, private use planes, malformed bytes */
};

static int in_ranges(uint32_t c, const Range *r, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (c >= r[i].lo && c <= r[i].hi) return 1;
    return 0;
}

static int char_class(uint32_t c) {
    if ((c >= 9 && c <= 13) || c == ' ' || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
        c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000)
        return CL_SPACE;
    if (c < 0x80) {
        if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return CL_LETTER;
        return c >= '0' && c <= '9' ? CL_NUMBER : CL_OTHER;
    }
    if (c <= 0xFF) {
        if (c == 0xAA || c == 0xB5 || c == 0xBA || (c >= 0xC0 && c != 0xD7 && c != 0xF7)) return CL_LETTER;
        return c == 0xB2 || c == 0xB3 || c == 0xB9 || (c >= 0xBC && c <= 0xBE) ? CL_NUMBER : CL_OTHER;
    }
    if (in_ranges(c, numbers, sizeof numbers / sizeof *numbers)) return CL_NUMBER;
    return in_ranges(c, others, sizeof others / sizeof *others) ? CL_OTHER : CL_LETTER;
}

static int class_at(const unsigned char *s, size_t n, size_t i, size_t *len) {
    return char_class(utf8_at(s, n, i, len));
}

/* The end of the run of class `cl` that starts at s[i]. */
static size_t run_end(const unsigned char *s, size_t n, size_t i, int cl) {
    size_t len;
    while (i < n && class_at(s, n, i, &len) == cl) i += len;
    return i;
}

size_t bpe_pretoken_end(const char *text, size_t n, size_t i) {
    const unsigned char *s = (const unsigned char *)text;
    if (s[i] == '\'' && i + 1 < n) { /* 's|'t|'re|'ve|'m|'ll|'d */
        char c = (char)s[i + 1], d = i + 2 < n ? (char)s[i + 2] : 0;
        if (c == 's' || c == 't' || c == 'm' || c == 'd') return i + 2;
        if ((c == 'r' && d == 'e') || (c == 'v' && d == 'e') || (c == 'l' && d == 'l')) return i + 3;
    }
    size_t len, next;
    int cl = class_at(s, n, i, &len);
    if (s[i] == ' ' && i + 1 < n && class_at(s, n, i + 1, &next) != CL_SPACE) /* " ?\p{L}+" and the like */
        return run_end(s, n, i + 1, class_at(s, n, i + 1, &next));
    if (cl != CL_SPACE) return run_end(s, n, i, cl);
    size_t end = i, last = i; /* \s+(?!\S)|\s+ */
    while (end < n && class_at(s, n, end, &len) == CL_SPACE) last = end, end += len;
    return end == n || last == i ? end : last;
}

size_t bpe_safe_cut(const char *text, size_t n) {
    for (size_t p = n - (n > 0); p >= 2; p--)
        if (text[p - 1] == '\n' && text[p - 2] > ' ' && text[p - 2] < 0x7F && text[p] > ' ' && text[p] < 0x7F)
            return p;
    return 0;
}

/* ---- encoding ------------------------------------------------------------ */

/* BPE on w[0..n) (ids), in place; returns the new length. */
static size_t merge_word(const Bpe *b, uint32_t *w, size_t n) {
    while (n > 1) {
        uint32_t best = UINT32_MAX, x = 0, y = 0, xy = 0;
        for (size_t i = 0; i + 1 < n; i++) {
            const Merge *m = &b->merge[pair_slot(b, pair_key(w[i], w[i + 1]))];
            if (m->key && m->rank < best) best = m->rank, x = w[i], y = w[i + 1], xy = m->id;
        }
        if (best == UINT32_MAX) break;
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
            if (i + 1 < n && w[i] == x && w[i + 1] == y) w[k++] = xy, i++;
            else w[k++] = w[i];
        }
        n = k;
    }
    return n;
}

static int append(uint32_t **ids, size_t *nids, size_t *cap, const uint32_t *w, size_t n) {
    if (grow((void **)ids, cap, *nids + n, sizeof **ids) != 0) return -1;
    memcpy(*ids + *nids, w, n * sizeof *w);
    *nids += n;
    return 0;
}

/* The ids of one pre-token, through the cache. */
static int encode_word(Bpe *b, const char *s, size_t n, uint32_t **ids, size_t *nids, size_t *cap) {
    MapEntry *e = map_get(&b->cache, s, n);
    if (e) return append(ids, nids, cap, b->cache_ids + e->a, e->b);
    if (grow((void **)&b->work, &b->work_cap, n, sizeof *b->work) != 0) return -1;
    for (size_t i = 0; i < n; i++) b->work[i] = b->byte_id[(unsigned char)s[i]];
    size_t k = merge_word(b, b->work, n);
    if (b->cache.klen + b->ncache_ids * 4 > CACHE_MAX_BYTES) map_free(&b->cache), b->ncache_ids = 0;
    if (grow((void **)&b->cache_ids, &b->cache_ids_cap, b->ncache_ids + k, sizeof *b->cache_ids) == 0 &&
        map_put(&b->cache, s, n, (uint32_t)b->ncache_ids, (uint32_t)k) == 0) {
        memcpy(b->cache_ids + b->ncache_ids, b->work, k * sizeof *b->work);
        b->ncache_ids += k;
    }
    return append(ids, nids, cap, b->work, k);
}

int bpe_encode(Bpe *b, const char *text, size_t n, uint32_t **ids, size_t *nids, size_t *cap) {
    for (size_t i = 0, end; i < n; i = end) {
        end = bpe_pretoken_end(text, n, i);
        if (encode_word(b, text + i, end - i, ids, nids, cap) != 0) return -1;
    }
    return 0;
}
