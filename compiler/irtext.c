/* irtext.c — the IR's text form: ir_dump, ir_parse, ir_dump_dot, ir_module_equal.
 *
 * The dump is the whole program, one node per line, and the parser reads back
 * exactly what the dumper writes (docs/ir.md has the grammar):
 *
 *     module tiny mesh=1x1x1x1   # pp x dp x cp x tp
 *     stage 0
 *     %3:f32[256,64] = param {name="wte.weight", init="normal", std=0.02}   # models/tiny.lua:20 L-1 fwd
 *     %12:f32[8,64,256]<tp=s2> = matmul %3, %7 {tb=1}   # models/tiny.lua:31 L1 fwd st1 mb2
 *     %13:f32[8,64,256]@act+1024 = gelu %12 {kernel=3}   # models/tiny.lua:32 L1 fwd stream0 pos7
 *     output %9 {name="loss"}   # models/tiny.lua:40 L-1 fwd
 *
 * Two promises hold it together: parse(dump(m)) is ir_module_equal to m, and
 * dump(parse(dump(m))) is byte-identical to dump(m).  Values are named by
 * their ids, and the parser gives each value back the id its name says (see
 * finish_stage), so ids survive even when a pass defined them out of order or
 * left dead ones behind.  And the dump must be unambiguous:
 * floats always carry a '.', 'e', inf or nan (ints never do) and are written
 * with the fewest digits that read back to the same double; strings and file
 * names that would not read back as one bare token are quoted with C escapes.
 *
 * The parser does not build nodes itself: it calls ir_add_node, so the shape
 * rules of ir_infer are checked on every line, then compares the declared
 * output types with the inferred ones and sets the metadata and shardings on
 * the new node.  It is a hand-written scanner over one line at a time; any
 * error longjmps to the single boundary in ir_parse, which frees the
 * half-built module and returns NULL with one line "name:line: message".
 * Every number is range-checked (no dim product above 2^48, no rank above 5,
 * no integer overflow), so hostile input costs memory and time linear in its
 * length; tests/fuzz_irtext.c holds it to that.
 */
#include <ctype.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"

static const char *const axis_names[IR_NAXES] = {"pp", "dp", "cp", "tp"};

#define MAX_MESH (1 << 16)            /* largest size of one mesh axis */
#define MAX_WORLD (1 << 20)           /* largest mesh (product of the four axes) */
#define MAX_ATTRS 256                 /* per node (keeps the duplicate check cheap) */
#define MAX_NODES (1 << 22)           /* per module: 8x the front end's graph limit, room for the passes */

/* ======================================================================
 * Writing
 * ====================================================================== */

/* A name (file or module) needs quotes when it would not read back as one bare token. */
static int needs_quotes(const char *s) {
    if (!*s || strcmp(s, "?") == 0) return 1;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c <= ' ' || c == 0x7f || c == '"' || c == '#' || c == '\\') return 1;
    }
    return 0;
}

static void put_quoted(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"') fputs("\\\"", f);
        else if (c == '\\') fputs("\\\\", f);
        else if (c == '\n') fputs("\\n", f);
        else if (c == '\t') fputs("\\t", f);
        else if (c < ' ' || c == 0x7f) fprintf(f, "\\x%02x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

static void put_name(FILE *f, const char *s) {
    if (needs_quotes(s)) put_quoted(f, s);
    else fputs(s, f);
}

/* The shortest %g that reads back to d, marked as a float (".0" if needed). */
static void fmt_float(char *buf, size_t n, double d) {
    if (isnan(d)) {
        snprintf(buf, n, "nan");
        return;
    }
    if (isinf(d)) {
        snprintf(buf, n, d < 0 ? "-inf" : "inf");
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, n, "%.*g", prec, d);
        if (strtod(buf, NULL) == d) break;
    }
    if (!strpbrk(buf, ".e")) strncat(buf, ".0", n - strlen(buf) - 1);
}

static void put_type(FILE *f, const Type *t) {
    fputs(t->dt >= 0 && t->dt < DT_COUNT ? ir_dtype_names[t->dt] : "?", f);
    fputc('[', f);
    for (int i = 0; i < t->rank && i < IR_MAXRANK; i++) fprintf(f, "%s%" PRId64, i ? "," : "", t->dim[i]);
    fputc(']', f);
}

/* "<dp=s0,tp=p>" for the non-replicated axes; nothing when all are replicated. */
static void put_sharding(FILE *f, const AxisShard sh[IR_NAXES]) {
    int first = 1;
    for (int a = 0; a < IR_NAXES; a++) {
        if (sh[a].kind == SH_REP) continue;
        fprintf(f, "%c%s=", first ? '<' : ',', axis_names[a]);
        if (sh[a].kind == SH_SPLIT) fprintf(f, "s%d", sh[a].dim);
        else if (sh[a].kind == SH_PARTIAL) fputc('p', f);
        else fputc('?', f);
        first = 0;
    }
    if (!first) fputc('>', f);
}

static void put_attr(FILE *f, const Attr *a) {
    char buf[40];
    fprintf(f, "%s=", a->key ? a->key : "?");
    switch (a->kind) {
    case AT_INT: fprintf(f, "%" PRId64, a->i); break;
    case AT_FLOAT: fmt_float(buf, sizeof buf, a->f); fputs(buf, f); break;
    case AT_STR: put_quoted(f, a->s ? a->s : ""); break;
    case AT_INTS:
        fputc('[', f);
        for (int i = 0; i < a->n; i++) fprintf(f, "%s%" PRId64, i ? "," : "", a->v[i]);
        fputc(']', f);
        break;
    default: fputc('?', f);
    }
}

/* "   # file:line Llayer phase [st v mb stream pos]" */
static void put_meta(FILE *f, const Node *n) {
    fputs("   # ", f);
    if (n->loc.file) put_name(f, n->loc.file);
    else fputc('?', f);
    fprintf(f, ":%d L%d %s", n->loc.line, n->layer,
            n->phase >= 0 && n->phase < PH_COUNT ? ir_phase_names[n->phase] : "?");
    if (n->stage) fprintf(f, " st%d", n->stage);
    if (n->vstage) fprintf(f, " v%d", n->vstage);
    if (n->mb) fprintf(f, " mb%d", n->mb);
    if (n->stream != -1) fprintf(f, " stream%d", n->stream);
    if (n->pos != -1) fprintf(f, " pos%d", n->pos);
}

/* "@act+1024" once memplan has placed the value; nothing before. */
static void put_place(FILE *f, const Value *v) {
    if (v->space < 0) return;
    fprintf(f, "@%s+%" PRId64, ir_space_name(v->space), v->offset);
}

/* Defensive about broken graphs: a dump is how one debugs them. */
static void dump_node(const Graph *g, const Node *n, FILE *f) {
    for (int k = 0; k < n->nout; k++) {
        int id = n->out[k];
        fprintf(f, "%s%%%d:", k ? ", " : "", id);
        if (id >= 0 && id < g->nvals) {
            put_type(f, &g->vals[id].t);
            put_sharding(f, g->vals[id].sh);
            put_place(f, &g->vals[id]);
        } else {
            fputs("?", f);
        }
    }
    if (n->nout) fputs(" = ", f);
    fputs(n->op >= 0 && n->op < OP_COUNT ? ir_ops[n->op].name : "?", f);
    for (int k = 0; k < n->nin; k++) fprintf(f, "%s%%%d", k ? ", " : " ", n->in[k]);
    for (int k = 0; k < n->nattr; k++) {
        fputs(k ? ", " : " {", f);
        put_attr(f, &n->attr[k]);
    }
    if (n->nattr) fputc('}', f);
    put_meta(f, n);
    fputc('\n', f);
}

void ir_dump(const Module *m, FILE *f) {
    fputs("module ", f);
    put_name(f, m->name ? m->name : "");
    fprintf(f, " mesh=%dx%dx%dx%d", m->mesh[0], m->mesh[1], m->mesh[2], m->mesh[3]);
    if (m->recompute != RC_UNSET) fprintf(f, " recompute=%s", ir_recompute_names[m->recompute]);
    fprintf(f, "   # pp x dp x cp x tp\n");
    for (int s = 0; s < m->nstages; s++) {
        const Graph *g = m->stages[s];
        fprintf(f, "%sstage %d\n", s ? "\n" : "", s);
        for (int i = 0; i < g->nnodes; i++) dump_node(g, &g->nodes[i], f);
    }
}

/* ======================================================================
 * Graphviz
 * ====================================================================== */

static void dot_escaped(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') fputc('\\', f);
        if (*s == '\n') fputs("\\n", f);
        else fputc(*s, f);
    }
}

static void dot_node(const Graph *g, int s, int i, FILE *f, const char *indent) {
    static const char *const fill[PH_COUNT] = {"white", "#dbe8ff", "#fff2cc", "#e2f0d9", "#c9dcff"};
    const Node *n = &g->nodes[i];
    fprintf(f, "%ss%d_n%d [label=\"%s", indent, s, i, n->op >= 0 && n->op < OP_COUNT ? ir_ops[n->op].name : "?");
    const char *name = ir_attr_s(n, "name", NULL);
    if (name) {
        fputs(" \\\"", f);
        dot_escaped(f, name);
        fputs("\\\"", f);
    }
    for (int k = 0; k < n->nout; k++) {
        char buf[128];
        int id = n->out[k];
        if (id < 0 || id >= g->nvals) continue;
        fprintf(f, "\\n%%%d:%s", id, ir_type_str(&g->vals[id].t, buf, sizeof buf));
    }
    fprintf(f, "\", fillcolor=\"%s\"];\n", n->phase >= 0 && n->phase < PH_COUNT ? fill[n->phase] : "red");
}

typedef struct {
    int layer, idx;
} LayerIdx;

static int by_layer(const void *a, const void *b) {
    const LayerIdx *x = a, *y = b;
    return x->layer != y->layer ? (x->layer > y->layer) - (x->layer < y->layer) : (x->idx > y->idx) - (x->idx < y->idx);
}

/* One cluster per stage, inside it one per layer; edges from the defining node. */
static void dot_stage(const Graph *g, int s, FILE *f) {
    fprintf(f, "  subgraph cluster_s%d {\n    label=\"stage %d\";\n", s, s);
    LayerIdx *order = malloc(sizeof *order * (size_t)(g->nnodes ? g->nnodes : 1));
    if (!order) ICE("out of memory");
    for (int i = 0; i < g->nnodes; i++) order[i] = (LayerIdx){g->nodes[i].layer, i};
    qsort(order, (size_t)g->nnodes, sizeof *order, by_layer);
    for (int k = 0; k < g->nnodes;) {
        int layer = order[k].layer;
        if (layer < 0) {
            dot_node(g, s, order[k++].idx, f, "    ");
            continue;
        }
        fprintf(f, "    subgraph cluster_s%d_l%d {\n      label=\"layer %d\";\n", s, layer, layer);
        for (; k < g->nnodes && order[k].layer == layer; k++) dot_node(g, s, order[k].idx, f, "      ");
        fputs("    }\n", f);
    }
    free(order);
    for (int i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        for (int k = 0; k < n->nin; k++) {
            int id = n->in[k];
            if (id < 0 || id >= g->nvals || g->vals[id].def < 0) continue;
            fprintf(f, "    s%d_n%d -> s%d_n%d;\n", s, g->vals[id].def, s, i);
        }
    }
    fputs("  }\n", f);
}

void ir_dump_dot(const Module *m, FILE *f) {
    fputs("digraph \"", f);
    dot_escaped(f, m->name ? m->name : "");
    fputs("\" {\n  node [shape=box, style=filled, fontname=\"monospace\", fontsize=10];\n", f);
    for (int s = 0; s < m->nstages; s++) dot_stage(m->stages[s], s, f);
    fputs("}\n", f);
}

/* ======================================================================
 * Parsing
 * ====================================================================== */

typedef struct {
    const char *name; /* of the input, for errors */
    char *err;
    size_t errlen;
    jmp_buf jb;
    int line;             /* 1-based number of the line being read */
    const char *p, *end;  /* cursor in that line */
    char nearbuf[32];
    Module *m;            /* NULL until the module line */
    Graph *g;             /* the stage being read; NULL before the first stage line */
    Graph **stages;       /* arena */
    int nstages, capstages;
    /* value name -> id in the current stage: open addressing, key -1 = empty */
    int *keys, *ids, capmap, nmap;
    /* per-line scratch, reused (malloc; freed by ir_parse) */
    int *in, capin;
    Attr *attr;
    int capattr;
    int64_t *ints;
    int capints;
    char *sbuf;
    size_t capsbuf;
    /* the text line of every node, all stages in order; stage s starts at first[s] */
    int *nodeline, capnodeline, nnodes;
    int *first, capfirst;
    /* names of the current stage's params, inputs and states (one name space)
     * and outputs (another): open addressing, s NULL = empty */
    struct NameEnt {
        const char *s;
        int cls, line;
    } *names;
    int capnames, nnames;
} Parser;

static void *xrealloc(void *p, size_t n) {
    p = realloc(p, n ? n : 1);
    if (!p) ICE("out of memory (%zu bytes)", n);
    return p;
}

/* Make room for n+1 elements in a scratch array. */
#define RESERVE(P, arr, cap, n)                                                  \
    do {                                                                         \
        if ((n) >= (P)->cap) {                                                   \
            (P)->cap = (P)->cap ? 2 * (P)->cap : 16;                             \
            (P)->arr = xrealloc((P)->arr, sizeof *(P)->arr * (size_t)(P)->cap); \
        }                                                                        \
    } while (0)

static void fail(Parser *P, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
static void fail(Parser *P, const char *fmt, ...) {
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (P->err && P->errlen) snprintf(P->err, P->errlen, "%s:%d: %s", P->name, P->line, msg);
    longjmp(P->jb, 1);
}

/* ---- scanning one line ---- */

static void skip_ws(Parser *P) {
    while (P->p < P->end && (*P->p == ' ' || *P->p == '\t' || *P->p == '\r')) P->p++;
}

static int peek(Parser *P) {
    skip_ws(P);
    return P->p < P->end ? (unsigned char)*P->p : 0;
}

static int accept(Parser *P, int c) {
    if (peek(P) != c) return 0;
    P->p++;
    return 1;
}

/* "'rest of line'" (printable, truncated) or "end of line", for messages. */
static const char *near(Parser *P) {
    skip_ws(P);
    if (P->p >= P->end) return "end of line";
    size_t n = 0;
    P->nearbuf[n++] = '\'';
    for (const char *q = P->p; q < P->end && n < 20; q++) P->nearbuf[n++] = isprint((unsigned char)*q) ? *q : '?';
    P->nearbuf[n++] = '\'';
    P->nearbuf[n] = 0;
    return P->nearbuf;
}

static void expect(Parser *P, int c, const char *what) {
    if (!accept(P, c)) fail(P, "expected %s, found %s", what, near(P));
}

/* [A-Za-z_][A-Za-z0-9_]* into buf */
static void ident(Parser *P, char *buf, size_t n, const char *what) {
    skip_ws(P);
    const char *q = P->p;
    while (q < P->end && (isalnum((unsigned char)*q) || *q == '_')) q++;
    if (q == P->p || isdigit((unsigned char)*P->p)) fail(P, "expected %s, found %s", what, near(P));
    if ((size_t)(q - P->p) >= n) fail(P, "%s too long: %s", what, near(P));
    memcpy(buf, P->p, (size_t)(q - P->p));
    buf[q - P->p] = 0;
    P->p = q;
}

/* A decimal integer (optional '-') in [lo, hi]. */
static int64_t integer(Parser *P, int64_t lo, int64_t hi, const char *what) {
    skip_ws(P);
    const char *q = P->p;
    int neg = q < P->end && *q == '-';
    q += neg;
    if (q >= P->end || !isdigit((unsigned char)*q)) fail(P, "expected %s, found %s", what, near(P));
    uint64_t v = 0, limit = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    int big = 0;
    for (; q < P->end && isdigit((unsigned char)*q); q++) {
        unsigned d = (unsigned)(*q - '0');
        if (v > (limit - d) / 10) big = 1;
        else v = v * 10 + d;
    }
    int64_t x = !neg ? (int64_t)v : v == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)v;
    if (big || x < lo || x > hi) fail(P, "%s out of range [%" PRId64 ", %" PRId64 "]: %.*s", what, lo, hi, (int)(q - P->p) > 24 ? 24 : (int)(q - P->p), P->p);
    P->p = q;
    return x;
}

static void sbuf_put(Parser *P, size_t i, char c) {
    if (i >= P->capsbuf) {
        P->capsbuf = P->capsbuf ? 2 * P->capsbuf : 64;
        P->sbuf = xrealloc(P->sbuf, P->capsbuf);
    }
    P->sbuf[i] = c;
}

static int hexval(int c) {
    return isdigit(c) ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* A double-quoted string with put_quoted's escapes; valid until the next string. */
static const char *string(Parser *P) {
    expect(P, '"', "'\"'");
    size_t n = 0;
    for (;;) {
        if (P->p >= P->end) fail(P, "unterminated string");
        char c = *P->p++;
        if (c == '"') break;
        if (c == '\\') {
            if (P->p >= P->end) fail(P, "unterminated string");
            char e = *P->p++;
            if (e == '"' || e == '\\') c = e;
            else if (e == 'n') c = '\n';
            else if (e == 't') c = '\t';
            else if (e == 'x' && P->end - P->p >= 2 && hexval((unsigned char)P->p[0]) >= 0 && hexval((unsigned char)P->p[1]) >= 0) {
                c = (char)(hexval((unsigned char)P->p[0]) * 16 + hexval((unsigned char)P->p[1]));
                P->p += 2;
                if (!c) fail(P, "\\x00 in a string");
            } else {
                fail(P, "bad escape '\\%c' in a string", isprint((unsigned char)e) ? e : '?');
            }
        }
        sbuf_put(P, n++, c);
    }
    sbuf_put(P, n, 0);
    return P->sbuf;
}

/* A name as put_name writes it: quoted, or the bare token up to a blank. */
static const char *name_token(Parser *P, const char *what) {
    if (peek(P) == '"') return string(P);
    const char *q = P->p;
    while (q < P->end && !isspace((unsigned char)*q)) q++;
    if (q == P->p) fail(P, "expected %s, found %s", what, near(P));
    size_t n = (size_t)(q - P->p);
    for (size_t i = 0; i < n; i++) sbuf_put(P, i, P->p[i]);
    sbuf_put(P, n, 0);
    P->p = q;
    return P->sbuf;
}

/* ---- value names: name -> id of the current stage ---- */

static unsigned map_slot(int name, int cap) { return ((unsigned)name * 2654435761u) & (unsigned)(cap - 1); }

static int map_find(const Parser *P, int name) {
    if (!P->capmap) return -1;
    for (unsigned h = map_slot(name, P->capmap);; h = (h + 1) & (unsigned)(P->capmap - 1)) {
        if (P->keys[h] == -1) return -1;
        if (P->keys[h] == name) return P->ids[h];
    }
}

static void map_put(Parser *P, int name, int id);
static void map_grow(Parser *P) {
    int oldcap = P->capmap, *oldkeys = P->keys, *oldids = P->ids;
    P->capmap = oldcap ? 2 * oldcap : 64;
    P->keys = xrealloc(NULL, sizeof(int) * (size_t)P->capmap);
    P->ids = xrealloc(NULL, sizeof(int) * (size_t)P->capmap);
    memset(P->keys, 0xff, sizeof(int) * (size_t)P->capmap); /* all -1 */
    P->nmap = 0;
    for (int i = 0; i < oldcap; i++)
        if (oldkeys[i] != -1) map_put(P, oldkeys[i], oldids[i]);
    free(oldkeys);
    free(oldids);
}

static void map_put(Parser *P, int name, int id) {
    if (2 * (P->nmap + 1) > P->capmap) map_grow(P);
    unsigned h = map_slot(name, P->capmap);
    while (P->keys[h] != -1) h = (h + 1) & (unsigned)(P->capmap - 1);
    P->keys[h] = name;
    P->ids[h] = id;
    P->nmap++;
}

static void map_clear(Parser *P) {
    if (P->capmap) memset(P->keys, 0xff, sizeof(int) * (size_t)P->capmap);
    P->nmap = 0;
}

/* "%N" */
static int value_name(Parser *P) {
    expect(P, '%', "'%'");
    return (int)integer(P, 0, INT_MAX, "a value number");
}

/* ---- the pieces of a node line ---- */

/* dtype[d0,d1,...] */
static void type(Parser *P, Type *t) {
    char dt[16];
    memset(t, 0, sizeof *t);
    ident(P, dt, sizeof dt, "a dtype");
    int d = ir_dtype_lookup(dt);
    if (d < 0) fail(P, "unknown dtype '%s'", dt);
    t->dt = (DType)d;
    expect(P, '[', "'[' after the dtype");
    if (accept(P, ']')) return;
    int64_t numel = 1;
    do {
        if (t->rank == IR_MAXRANK) fail(P, "rank above %d", IR_MAXRANK);
        int64_t x = integer(P, 1, IR_MAXNUMEL, "a dim");
        if (numel > IR_MAXNUMEL / x) fail(P, "more than 2^48 elements");
        numel *= x;
        t->dim[t->rank++] = x;
    } while (accept(P, ','));
    expect(P, ']', "',' or ']' in the shape");
}

/* <axis=sN|p,...> */
static void sharding(Parser *P, const Type *t, AxisShard sh[IR_NAXES]) {
    unsigned seen = 0;
    expect(P, '<', "'<'");
    do {
        char ax[8];
        int a = -1;
        ident(P, ax, sizeof ax, "a mesh axis (pp, dp, cp, tp)");
        for (int i = 0; i < IR_NAXES; i++)
            if (strcmp(ax, axis_names[i]) == 0) a = i;
        if (a < 0) fail(P, "unknown mesh axis '%s'", ax);
        if (seen & (1u << a)) fail(P, "mesh axis %s sharded twice", ax);
        seen |= 1u << a;
        expect(P, '=', "'=' after the mesh axis");
        if (accept(P, 'p')) {
            sh[a].kind = SH_PARTIAL;
        } else if (accept(P, 's')) {
            if (t->rank == 0) fail(P, "a scalar cannot be split");
            sh[a].kind = SH_SPLIT;
            sh[a].dim = (int)integer(P, 0, t->rank - 1, "a split dim");
        } else {
            fail(P, "expected sN or p, found %s", near(P));
        }
    } while (accept(P, ','));
    expect(P, '>', "',' or '>' in the sharding");
}

/* @space+offset */
static void place(Parser *P, int *space, int64_t *offset) {
    char name[16];
    expect(P, '@', "'@'");
    ident(P, name, sizeof name, "a memory space (params, grads, opt, act)");
    *space = -1;
    for (int i = 0; i < SPACE_COUNT; i++)
        if (strcmp(name, ir_space_name(i)) == 0) *space = i;
    if (*space < 0) fail(P, "unknown memory space '%s'", name);
    expect(P, '+', "'+' and the byte offset after the memory space");
    *offset = integer(P, 0, INT64_MAX, "a byte offset");
}

/* Is tok a float as fmt_float writes it: -?D+(.D*)?([eE][+-]?D+)? with a '.' or an exponent. */
static int is_float_token(const char *s) {
    int marked = 0;
    if (*s == '-') s++;
    if (!isdigit((unsigned char)*s)) return 0;
    while (isdigit((unsigned char)*s)) s++;
    if (*s == '.') {
        marked = 1;
        for (s++; isdigit((unsigned char)*s);) s++;
    }
    if (*s == 'e' || *s == 'E') {
        marked = 1;
        s++;
        if (*s == '+' || *s == '-') s++;
        if (!isdigit((unsigned char)*s)) return 0;
        while (isdigit((unsigned char)*s)) s++;
    }
    return marked && !*s;
}

static int is_int_token(const char *s) {
    if (*s == '-') s++;
    if (!*s) return 0;
    for (; *s; s++)
        if (!isdigit((unsigned char)*s)) return 0;
    return 1;
}

/* An int or a float attribute value. */
static Attr number(Parser *P, const char *key) {
    skip_ws(P);
    const char *q = P->p;
    while (q < P->end && (isalnum((unsigned char)*q) || *q == '.' || *q == '-' || *q == '+')) q++;
    char tok[48];
    size_t n = (size_t)(q - P->p);
    if (n == 0) fail(P, "expected a value for %s, found %s", key, near(P));
    if (n >= sizeof tok) fail(P, "number too long: %s", near(P));
    memcpy(tok, P->p, n);
    tok[n] = 0;
    if (is_int_token(tok)) return ir_attr_int(P->m, key, integer(P, INT64_MIN, INT64_MAX, "an integer"));
    double d;
    if (strcmp(tok, "inf") == 0) d = INFINITY;
    else if (strcmp(tok, "-inf") == 0) d = -INFINITY;
    else if (strcmp(tok, "nan") == 0) d = NAN;
    else if (is_float_token(tok)) {
        d = strtod(tok, NULL);
        if (isinf(d)) fail(P, "float out of range: %s", tok);
    } else fail(P, "bad value for %s: '%s'", key, tok);
    P->p = q;
    return ir_attr_float(P->m, key, d);
}

/* [i, j, ...] */
static Attr int_list(Parser *P, const char *key) {
    int n = 0;
    expect(P, '[', "'['");
    if (!accept(P, ']')) {
        do {
            RESERVE(P, ints, capints, n);
            P->ints[n++] = integer(P, INT64_MIN, INT64_MAX, "an integer");
        } while (accept(P, ','));
        expect(P, ']', "',' or ']' in the list");
    }
    RESERVE(P, ints, capints, 0);
    return ir_attr_ints(P->m, key, P->ints, n);
}

/* {key=value, ...} into P->attr; returns the count. */
static int attrs(Parser *P) {
    int n = 0;
    if (!accept(P, '{')) return 0;
    do {
        char key[64];
        ident(P, key, sizeof key, "an attribute name");
        for (int i = 0; i < n; i++)
            if (strcmp(P->attr[i].key, key) == 0) fail(P, "attribute %s given twice", key);
        expect(P, '=', "'=' after the attribute name");
        if (n == MAX_ATTRS) fail(P, "more than %d attributes", MAX_ATTRS);
        RESERVE(P, attr, capattr, n);
        int c = peek(P);
        P->attr[n++] = c == '"' ? ir_attr_str(P->m, key, string(P)) : c == '[' ? int_list(P, key) : number(P, key);
    } while (accept(P, ','));
    expect(P, '}', "',' or '}' after an attribute");
    return n;
}

/* "# file:line Llayer phase [stN] [vN] [mbN] [streamN] [posN]" into s and meta[] */
static void metadata(Parser *P, NodeSpec *s, int meta[5]) {
    static const char *const fields[5] = {"st", "v", "mb", "stream", "pos"};
    expect(P, '#', "'#' and the node's metadata (file:line Llayer phase)");
    if (peek(P) == '"') {
        s->loc.file = ir_intern(P->m, string(P));
        expect(P, ':', "':' and a line number after the file name");
    } else { /* bare file:line, split at the last ':'; "?" is no location */
        const char *q = P->p, *colon = NULL;
        for (; q < P->end && !isspace((unsigned char)*q); q++)
            if (*q == ':') colon = q;
        if (!colon || colon == P->p) fail(P, "expected file:line, found %s", near(P));
        size_t n = (size_t)(colon - P->p);
        for (size_t i = 0; i < n; i++) sbuf_put(P, i, P->p[i]);
        sbuf_put(P, n, 0);
        s->loc.file = strcmp(P->sbuf, "?") == 0 ? NULL : ir_intern(P->m, P->sbuf);
        P->p = colon + 1;
    }
    s->loc.line = (int)integer(P, INT_MIN, INT_MAX, "a line number");
    expect(P, 'L', "'L' and the layer");
    s->layer = (int)integer(P, INT_MIN, INT_MAX, "a layer");
    char ph[16];
    int phase = -1;
    ident(P, ph, sizeof ph, "a phase (fwd, bwd, recompute, opt)");
    for (int i = 0; i < PH_COUNT; i++)
        if (strcmp(ph, ir_phase_names[i]) == 0) phase = i;
    if (phase < 0) fail(P, "unknown phase '%s'", ph);
    s->phase = (Phase)phase;
    for (int next = 0; peek(P);) {
        const char *q = P->p;
        while (q < P->end && isalpha((unsigned char)*q)) q++;
        int k = next;
        while (k < 5 && ((size_t)(q - P->p) != strlen(fields[k]) || memcmp(P->p, fields[k], (size_t)(q - P->p)) != 0)) k++;
        if (k == 5) fail(P, "unexpected %s in the metadata (st, v, mb, stream, pos may follow the phase, in this order)", near(P));
        P->p = q;
        meta[k] = (int)integer(P, INT_MIN, INT_MAX, fields[k]);
        next = k + 1;
    }
}

#define MAXOUT 8

/* [outs =] op [inputs] [{attrs}] # metadata */
/* ---- names: a param, input or state name (one name space) or an output
 * name is defined once per stage ---- */

static unsigned name_hash(const char *s, int cls) {
    unsigned h = 2166136261u ^ (unsigned)cls;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

static void names_grow(Parser *P) {
    struct NameEnt *old = P->names;
    int oldcap = P->capnames;
    P->capnames = oldcap ? 2 * oldcap : 64;
    P->names = calloc((size_t)P->capnames, sizeof *P->names);
    if (!P->names) ICE("out of memory");
    for (int i = 0; i < oldcap; i++) {
        if (!old[i].s) continue;
        unsigned k = name_hash(old[i].s, old[i].cls) & (unsigned)(P->capnames - 1);
        while (P->names[k].s) k = (k + 1) & (unsigned)(P->capnames - 1);
        P->names[k] = old[i];
    }
    free(old);
}

static void unique_name(Parser *P, const Node *n) {
    int cls = n->op == OP_output ? 1 : n->op == OP_param || n->op == OP_input || n->op == OP_state ? 0 : -1;
    const char *s = cls < 0 ? NULL : ir_attr_s(n, "name", NULL);
    if (!s) return;
    if (2 * (P->nnames + 1) > P->capnames) names_grow(P);
    unsigned k = name_hash(s, cls) & (unsigned)(P->capnames - 1);
    for (; P->names[k].s; k = (k + 1) & (unsigned)(P->capnames - 1))
        if (P->names[k].cls == cls && strcmp(P->names[k].s, s) == 0)
            fail(P, "%s name \"%s\" defined twice (first at line %d)", cls ? "output" : "param/input/state", s,
                 P->names[k].line);
    P->names[k] = (struct NameEnt){s, cls, P->line};
    P->nnames++;
}

static void names_clear(Parser *P) {
    if (P->names) memset(P->names, 0, sizeof *P->names * (size_t)P->capnames);
    P->nnames = 0;
}

static void node_line(Parser *P) {
    Type decl[MAXOUT];
    AxisShard sh[MAXOUT][IR_NAXES];
    int names[MAXOUT], nout = 0, space[MAXOUT];
    int64_t offset[MAXOUT];
    Graph *g = P->g;
    if (!g) fail(P, "a node before the first 'stage' line");
    memset(sh, 0, sizeof sh);
    if (peek(P) == '%') {
        do {
            if (nout == MAXOUT) fail(P, "too many outputs");
            int name = value_name(P);
            for (int k = 0; k < nout; k++)
                if (names[k] == name) fail(P, "%%%d defined twice", name);
            if (map_find(P, name) >= 0) fail(P, "%%%d defined twice", name);
            names[nout] = name;
            expect(P, ':', "':' and the type of the value");
            type(P, &decl[nout]);
            if (peek(P) == '<') sharding(P, &decl[nout], sh[nout]);
            space[nout] = -1, offset[nout] = -1;
            if (peek(P) == '@') place(P, &space[nout], &offset[nout]);
            nout++;
        } while (accept(P, ','));
        expect(P, '=', "'=' after the outputs");
    }
    char opname[32];
    ident(P, opname, sizeof opname, "an op");
    int op = ir_op_lookup(opname);
    if (op < 0) fail(P, "unknown op '%s'", opname);
    const OpInfo *info = &ir_ops[op];
    if (nout != info->nout) fail(P, "%s has %d output%s, not %d", opname, info->nout, info->nout == 1 ? "" : "s", nout);

    int nin = 0;
    RESERVE(P, in, capin, 0); /* never pass NULL, even for no inputs */
    if (peek(P) == '%') {
        do {
            int name = value_name(P), id = map_find(P, name);
            if (id < 0) fail(P, "%%%d is not defined", name);
            RESERVE(P, in, capin, nin);
            P->in[nin++] = id;
        } while (accept(P, ','));
    }
    if (info->nin >= 0 ? nin != info->nin : nin < 1)
        fail(P, "%s takes %s%d input%s, not %d", opname, info->nin < 0 ? "at least " : "", info->nin < 0 ? 1 : info->nin,
             info->nin == 1 || info->nin < 0 ? "" : "s", nin);
    int nattr = attrs(P);

    NodeSpec s = ir_spec((Op)op, (Loc){0});
    int meta[5] = {0, 0, 0, -1, -1};
    metadata(P, &s, meta);
    s.nin = nin;
    s.in = P->in;
    s.nattr = nattr;
    s.attr = P->attr;
    s.src_type = info->flags & F_SOURCE ? &decl[0] : NULL;

    char msg[200];
    if (P->nnodes >= MAX_NODES) fail(P, "more than %d nodes", MAX_NODES);
    int ni = ir_add_node(g, &s, msg, sizeof msg);
    if (ni < 0) fail(P, "%s", msg);
    RESERVE(P, nodeline, capnodeline, P->nnodes);
    P->nodeline[P->nnodes++] = P->line;
    Node *n = &g->nodes[ni];
    unique_name(P, n);
    n->stage = meta[0], n->vstage = meta[1], n->mb = meta[2], n->stream = meta[3], n->pos = meta[4];
    for (int k = 0; k < nout; k++) {
        Value *v = &g->vals[n->out[k]];
        if (!ir_type_eq(&v->t, &decl[k])) {
            char a[96], b[96];
            fail(P, "%s: %%%d declared %s but the op gives %s", opname, names[k], ir_type_str(&decl[k], a, sizeof a),
                 ir_type_str(&v->t, b, sizeof b));
        }
        memcpy(v->sh, sh[k], sizeof v->sh);
        v->space = space[k], v->offset = offset[k];
        map_put(P, names[k], v->id);
    }
}

/* module NAME mesh=PPxDPxCPxTP [recompute=POLICY] */
static void module_line(Parser *P) {
    char word[8];
    const char *name = name_token(P, "a module name");
    P->m = ir_module_new(name);
    ident(P, word, sizeof word, "mesh=");
    if (strcmp(word, "mesh") != 0) fail(P, "expected mesh=, found '%s'", word);
    expect(P, '=', "'=' after mesh");
    int64_t world = 1;
    for (int a = 0; a < IR_NAXES; a++) {
        if (a) expect(P, 'x', "'x' between mesh sizes (pp x dp x cp x tp)");
        P->m->mesh[a] = (int)integer(P, 1, MAX_MESH, "a mesh size");
        world *= P->m->mesh[a];
        if (world > MAX_WORLD) fail(P, "mesh of more than %d ranks", MAX_WORLD);
    }
    if (peek(P) == 'r') {
        char key[16], policy[16];
        ident(P, key, sizeof key, "recompute=");
        if (strcmp(key, "recompute") != 0) fail(P, "expected recompute=, found '%s'", key);
        expect(P, '=', "'=' after recompute");
        skip_ws(P);
        size_t n = 0;
        while (P->p < P->end && (isalnum((unsigned char)*P->p) || *P->p == '-') && n + 1 < sizeof policy) policy[n++] = *P->p++;
        policy[n] = 0;
        int r = ir_recompute_lookup(policy);
        if (r < 0) fail(P, "unknown recompute policy '%s' (none, full, selective, gemm-last)", policy);
        P->m->recompute = (Recompute)r;
    }
    P->m->nstages = 0; /* the stage lines add them back */
    P->stages = P->m->stages;
    P->capstages = 1;
}

/* Give every value of the stage just read the id its name says, so a dump's
 * ids survive the round trip even when a pass defined them out of order or
 * left dead values behind (those come back as undefined f32[] placeholders).
 * Names far above the value count (a hand-written %1000000) are not worth the
 * placeholders: then the ids stay in definition order. */
static void finish_stage(Parser *P) {
    Graph *g = P->g;
    int n = g ? g->nvals : 0, maxname = -1;
    for (int i = 0; i < P->capmap; i++)
        if (P->keys[i] > maxname) maxname = P->keys[i];
    if (n == 0 || maxname >= 2 * n + 1024) return;
    int nn = maxname + 1, *newid = xrealloc(NULL, sizeof(int) * (size_t)n);
    Value *vals = ir_alloc(P->m, sizeof(Value) * (size_t)nn);
    for (int i = 0; i < nn; i++) vals[i] = (Value){.id = i, .t = {DT_F32, 0, {0}}, .def = -1, .space = -1, .offset = -1};
    for (int i = 0; i < P->capmap; i++) {
        if (P->keys[i] < 0) continue;
        int name = P->keys[i], id = P->ids[i];
        newid[id] = name;
        vals[name] = g->vals[id];
        vals[name].id = name;
    }
    for (int i = 0; i < g->nnodes; i++) {
        Node *nd = &g->nodes[i];
        for (int k = 0; k < nd->nin; k++) nd->in[k] = newid[nd->in[k]];
        for (int k = 0; k < nd->nout; k++) nd->out[k] = newid[nd->out[k]];
    }
    free(newid);
    g->vals = vals;
    g->nvals = g->capvals = nn;
}

/* stage N */
static void stage_line(Parser *P) {
    int n = (int)integer(P, 0, INT_MAX, "a stage number");
    if (n != P->nstages) fail(P, "expected stage %d, found stage %d", P->nstages, n);
    Graph *g = n == 0 ? P->stages[0] : ir_graph_new(P->m);
    if (P->nstages == P->capstages) {
        Graph **s = ir_alloc(P->m, sizeof(Graph *) * (size_t)(2 * P->capstages));
        memcpy(s, P->stages, sizeof(Graph *) * (size_t)P->nstages);
        P->stages = s;
        P->capstages *= 2;
    }
    finish_stage(P);
    RESERVE(P, first, capfirst, P->nstages);
    P->first[P->nstages] = P->nnodes;
    P->stages[P->nstages++] = g;
    P->m->stages = P->stages;
    P->m->nstages = P->nstages;
    P->g = g;
    map_clear(P);
    names_clear(P);
}

/* A trailing "# comment" is allowed on module and stage lines. */
static void end_of_line(Parser *P, int comment_ok) {
    if (comment_ok && peek(P) == '#') P->p = P->end;
    if (peek(P)) fail(P, "unexpected %s", near(P));
}

static void parse_line(Parser *P) {
    int c = peek(P);
    if (!c || c == '#') return;
    const char *start = P->p;
    char word[16] = "";
    if (isalpha(c)) {
        const char *q = P->p;
        while (q < P->end && isalnum((unsigned char)*q)) q++;
        if (q - P->p < (long)sizeof word) memcpy(word, P->p, (size_t)(q - P->p)), word[q - P->p] = 0;
        P->p = q;
    }
    if (strcmp(word, "module") == 0) {
        if (P->m) fail(P, "a second 'module' line");
        module_line(P);
        end_of_line(P, 1);
        return;
    }
    if (!P->m) fail(P, "expected 'module NAME mesh=PPxDPxCPxTP' first, found %s", near(P));
    if (strcmp(word, "stage") == 0) {
        stage_line(P);
        end_of_line(P, 1);
        return;
    }
    P->p = start;
    node_line(P);
    end_of_line(P, 0);
}

static void parse_text(Parser *P, const char *text) {
    for (const char *s = text;; P->line++) {
        const char *e = strchr(s, '\n');
        if (!e) e = s + strlen(s);
        P->p = s;
        P->end = e;
        parse_line(P);
        if (!*e) break;
        s = e + 1;
    }
    if (!P->m) {
        P->line = 1;
        fail(P, "no 'module' line");
    }
    finish_stage(P);
}

/* The one error boundary: 0, or -1 after a longjmp from fail(). */
static int parse_protected(Parser *P, const char *text) {
    if (setjmp(P->jb)) return -1;
    parse_text(P, text);
    return 0;
}

/* Parse text; with verify, also verify the module naming each node's line. */
static Module *parse(const char *text, const char *name, int verify, char *err, size_t errlen) {
    Parser *P = calloc(1, sizeof *P);
    if (!P) ICE("out of memory");
    P->name = name ? name : "<ir>";
    P->err = err;
    P->errlen = errlen;
    P->line = 1;
    if (err && errlen) err[0] = 0;
    Module *m = NULL;
    if (parse_protected(P, text ? text : "") == 0) m = P->m;
    else ir_free(P->m);
    if (m && verify) {
        int **lines = xrealloc(NULL, sizeof(int *) * (size_t)m->nstages);
        for (int s = 0; s < m->nstages; s++) lines[s] = P->nodeline + P->first[s];
        if (ir_verify_module_src(m, P->name, lines, err, errlen)) {
            ir_free(m);
            m = NULL;
        }
        free(lines);
    }
    free(P->nodeline);
    free(P->first);
    free(P->names);
    free(P->keys);
    free(P->ids);
    free(P->in);
    free(P->attr);
    free(P->ints);
    free(P->sbuf);
    free(P);
    return m;
}

Module *ir_parse(const char *text, const char *name, char *err, size_t errlen) {
    return parse(text, name, 0, err, errlen);
}

/* The passes whose marks a module can carry, in pipeline order. */
static const char *const marked_passes[] = {"front", "autodiff", "optimizer", "schedule", "memplan"};
enum { NMARKED = sizeof marked_passes / sizeof marked_passes[0] };

static int last_pass_index(const Module *m) {
    int last = 0;
    for (int s = 0; s < m->nstages; s++) {
        const Graph *g = m->stages[s];
        for (int i = 0; i < g->nnodes; i++) {
            const Node *n = &g->nodes[i];
            int k = n->phase == PH_BWD || n->phase == PH_RECOMPUTE || n->phase == PH_WGRAD ? 1 : n->phase == PH_OPT ? 2 : 0;
            if (n->pos >= 0) k = 3;
            for (int o = 0; o < n->nout; o++)
                if (g->vals[n->out[o]].space >= 0) k = 4;
            if (k > last) last = k;
        }
    }
    return last;
}

const char *ir_last_pass(const Module *m) { return marked_passes[last_pass_index(m)]; }

Module *ir_parse_file(const char *text, size_t len, const char *name, const char *need, char *err, size_t errlen) {
    const char *nul = memchr(text, 0, len);
    if (nul) {
        int line = 1;
        for (const char *c = text; c < nul; c++) line += *c == '\n';
        snprintf(err, errlen, "%s:%d: a NUL byte (a .ir file is text)", name, line);
        return NULL;
    }
    Module *m = parse(text, name, 1, err, errlen);
    if (!m || !need) return m;
    int want = -1, have = last_pass_index(m);
    for (int k = 0; k < NMARKED; k++)
        if (strcmp(need, marked_passes[k]) == 0) want = k;
    if (want < 0) ICE("ir_parse_file: %s is not a pass with marks", need);
    if (have < want) {
        snprintf(err, errlen,
                 "%s: the dump stops after %s, and this command needs the passes up to %s (dump the model with --after %s, "
                 "or without --after)", name, marked_passes[have], need, need);
        ir_free(m);
        return NULL;
    }
    return m;
}

/* ======================================================================
 * Equality
 * ====================================================================== */

static int str_eq(const char *a, const char *b) { return strcmp(a ? a : "", b ? b : "") == 0; }

static int type_eq(const Type *a, const Type *b) {
    if (a->dt != b->dt || a->rank != b->rank) return 0;
    for (int i = 0; i < a->rank && i < IR_MAXRANK; i++)
        if (a->dim[i] != b->dim[i]) return 0;
    return 1;
}

static int shard_eq(const AxisShard *a, const AxisShard *b) {
    for (int i = 0; i < IR_NAXES; i++)
        if (a[i].kind != b[i].kind || (a[i].kind == SH_SPLIT && a[i].dim != b[i].dim)) return 0;
    return 1;
}

static int attr_eq(const Attr *a, const Attr *b) {
    if (!str_eq(a->key, b->key) || a->kind != b->kind) return 0;
    switch (a->kind) {
    case AT_INT: return a->i == b->i;
    case AT_FLOAT: return memcmp(&a->f, &b->f, sizeof a->f) == 0 || (isnan(a->f) && isnan(b->f));
    case AT_STR: return str_eq(a->s, b->s);
    case AT_INTS: return a->n == b->n && (a->n <= 0 || memcmp(a->v, b->v, sizeof(int64_t) * (size_t)a->n) == 0);
    }
    return 1;
}

/* Value id -> its output slot number in definition order (-1: no node defines it). */
static int *def_positions(const Graph *g) {
    int *pos = malloc(sizeof(int) * (size_t)(g->nvals ? g->nvals : 1)), slot = 0;
    if (!pos) ICE("out of memory");
    for (int i = 0; i < g->nvals; i++) pos[i] = -1;
    for (int i = 0; i < g->nnodes; i++)
        for (int k = 0; k < g->nodes[i].nout; k++, slot++) {
            int id = g->nodes[i].out[k];
            if (id >= 0 && id < g->nvals && pos[id] < 0) pos[id] = slot;
        }
    return pos;
}

/* The same value up to renumbering: same defining slot, or both undefined with the same id. */
static int use_eq(const Graph *ga, const int *pa, int a, const Graph *gb, const int *pb, int b) {
    int da = a >= 0 && a < ga->nvals ? pa[a] : -1, db = b >= 0 && b < gb->nvals ? pb[b] : -1;
    return da >= 0 || db >= 0 ? da == db : a == b;
}

static int value_eq(const Graph *ga, int a, const Graph *gb, int b) {
    int va = a >= 0 && a < ga->nvals, vb = b >= 0 && b < gb->nvals;
    if (!va || !vb) return !va && !vb && a == b;
    const Value *x = &ga->vals[a], *y = &gb->vals[b];
    return type_eq(&x->t, &y->t) && shard_eq(x->sh, y->sh) && x->space == y->space && x->offset == y->offset;
}

static int node_eq(const Graph *ga, const int *pa, const Node *a, const Graph *gb, const int *pb, const Node *b) {
    if (a->op != b->op || a->nin != b->nin || a->nout != b->nout || a->nattr != b->nattr) return 0;
    if (a->loc.line != b->loc.line || !a->loc.file != !b->loc.file || (a->loc.file && strcmp(a->loc.file, b->loc.file) != 0)) return 0;
    if (a->layer != b->layer || a->phase != b->phase || a->stage != b->stage || a->vstage != b->vstage || a->mb != b->mb ||
        a->stream != b->stream || a->pos != b->pos)
        return 0;
    for (int k = 0; k < a->nin; k++)
        if (!use_eq(ga, pa, a->in[k], gb, pb, b->in[k])) return 0;
    for (int k = 0; k < a->nout; k++)
        if (!use_eq(ga, pa, a->out[k], gb, pb, b->out[k]) || !value_eq(ga, a->out[k], gb, b->out[k])) return 0;
    for (int k = 0; k < a->nattr; k++)
        if (!attr_eq(&a->attr[k], &b->attr[k])) return 0;
    return 1;
}

static int graph_eq(const Graph *a, const Graph *b) {
    if (a->nnodes != b->nnodes) return 0;
    int *pa = def_positions(a), *pb = def_positions(b), eq = 1;
    for (int i = 0; eq && i < a->nnodes; i++) eq = node_eq(a, pa, &a->nodes[i], b, pb, &b->nodes[i]);
    free(pa);
    free(pb);
    return eq;
}

int ir_module_equal(const Module *a, const Module *b) {
    if (a == b) return 1;
    if (!a || !b || !str_eq(a->name, b->name) || a->nstages != b->nstages) return 0;
    if (memcmp(a->mesh, b->mesh, sizeof a->mesh) != 0 || a->recompute != b->recompute) return 0;
    for (int s = 0; s < a->nstages; s++)
        if (!graph_eq(a->stages[s], b->stages[s])) return 0;
    return 1;
}
