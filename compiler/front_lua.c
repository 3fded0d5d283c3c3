/* front_lua.c — the Lua front end: run a model file, build its forward graph.
 *
 * A model is a Lua 5.4 program.  It describes one training step's forward
 * pass by calling DSL primitives (config, input, param, matmul, layernorm,
 * attention, ..., loss) on tensor userdata; every primitive appends nodes to
 * stage 0 of a fresh Module through ir_add_node, so the shape rules live in one
 * place (ir.c) and the front end only translates: Lua's 1-based and negative
 * dims become 0-based IR dims, numpy broadcasting becomes explicit broadcast
 * nodes, Lua numbers become scalar consts, and each node gets the Loc of the
 * model line that made it (the innermost stack frame in the model file itself,
 * so a mistake inside a models/lib helper is reported where the model called
 * it; the innermost Lua frame when the model file is not on the stack).
 *
 * The model is untrusted input, so it runs in a sandbox:
 *   - only the base, table, string, math and utf8 libraries; no io, os,
 *     package, debug, load, loadfile, dofile; `require` is ours and loads
 *     lib/<name>.lua (text only) next to the model, else models/lib/;
 *   - every byte goes through a counting allocator capped at FE_MEM_CAP;
 *   - a count hook every FE_HOOK_EVERY instructions stops it after
 *     FE_INSN_LIMIT instructions (and then raises at every instruction, so
 *     pcall cannot swallow the error);
 *   - a wall-clock limit (Options.frontend_timeout, --frontend-timeout, 10 s
 *     by default) for time spent inside single C calls between instructions
 *     (a vararg copy, table.insert on a long table, string.rep): SIGALRM sets
 *     a hook on every instruction (lua_sethook is signal-safe), which raises
 *     like the instruction limit, as soon as the C call returns;
 *   - the library loops that run in C, where no hook fires, are closed (no
 *     __gc finalizers, no pattern matching, bounds on table.move/insert/remove
 *     and string.rep; see fe_harden).
 * A memory error (LUA_ERRMEM) runs no message handler, so the allocator itself
 * notes the innermost Lua line when it refuses a block (lua_getstack and
 * lua_getinfo only read the call chain, and with a hook set the VM saves its pc
 * before every instruction, so that line is exact; see FE_OOM_WALK).  The count
 * hook also keeps the last line it saw, a fallback for errors that have nowhere
 * better to point.  (A line hook would do the same job at 7x the cost of a
 * tight loop.)
 *
 * Errors: everything runs under one lua_pcall whose message handler makes sure
 * a message starts with "file:line: " and appends a short traceback restricted
 * to the model's own files ("(inside nn.lua:44; called from m.lua:11)"), so an
 * error inside a helper names the model lines that called it; fe_load then
 * turns it into one line (no newline) in err.  Lua's own messages shorten long
 * chunk names to "...tail"; we put the full path back.  Builders raise Lua
 * errors ("file:line: op: message", naming the param() inputs of a refused
 * node) so that Lua's stack unwinds normally.
 *
 * Strictness: an options table may hold only the keys listed next to its
 * primitive (fe_options); names are checked against kiln's own name spaces
 * (fe_reserved) and are unique among params and inputs.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <sys/time.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include "front.h"

#define FE_MEM_CAP ((size_t)256 << 20)
#define FE_INSN_LIMIT 200000000LL
#define FE_HOOK_EVERY 1000
#define FE_MAX_NODES (1 << 19) /* the IR arena is outside the Lua memory cap */
#define FE_MAX_NUMEL ((int64_t)1 << 50)
#define FE_MAX_FILES 32

#define TENSOR_MT "kiln.tensor"
#define REG_CONFIG "kiln.config"   /* the config{} table */
#define REG_PARAMS "kiln.params"   /* param or input name -> "file:line" of its definition */
#define REG_LOADED "kiln.loaded"   /* require cache: lib name -> result */
#define REG_TRACED "kiln.traced"   /* the last message fe_msgh gave a traceback */
#define FE_TRACE_MAX 4             /* frames named on each side of the error line */

typedef struct {
    Module *m;
    Graph *g;
    Options *o;
    const char *path;            /* the model file, as given */
    int nlines;                  /* its line count (where "no loss" points) */
    lua_State *L;
    size_t mem;                  /* bytes held by the Lua state */
    int memfail;                 /* the allocator refused a block */
    char oomfile[512];           /* ... at this line */
    int oomline;
    long long insns;             /* instructions run (in FE_HOOK_EVERY steps) */
    char lastfile[512];          /* the line the count hook saw last */
    int lastline;
    char limitmsg[600];          /* set once the instruction or time limit is hit */
    double timeout;              /* the wall-clock limit, seconds */
    int layer;                   /* inside layer(i, fn): i; else -1 */
    char layer_prefix[128];      /* ... and its param prefix: "h." (default), set, or "" */
    int layer_prefix_off;        /* {prefix=false}: names as given */
    int config_called;
    Loc config_loc;
    int nloss;
    Loc loss_loc;
    const char *files[FE_MAX_FILES]; /* chunks loaded, to undo Lua's "...tail" */
    int nfiles;
    int dropout_step;            /* dropout (issue 17): the state opt.step, -1 before the first */
    int ndropout;                /* dropouts so far: the next one's id */
} Fe;

static Fe *fe_of(lua_State *L) { return *(Fe **)lua_getextraspace(L); }

/* ---------------------------------------------------------------- locations */

/* The innermost Lua frame with a line (in the model file when prefer_model and
 * it is on the stack).  file points into Lua's memory: copy or intern it. */
static int fe_frame(Fe *fe, lua_State *L, int prefer_model, const char **file, int *line)
{
    lua_Debug ar;
    int found = 0;
    for (int lv = 0; lua_getstack(L, lv, &ar); lv++) {
        if (!lua_getinfo(L, "Sl", &ar) || ar.currentline <= 0 || ar.source[0] != '@')
            continue;
        int in_model = strcmp(ar.source + 1, fe->path) == 0;
        if (!found || in_model) {
            *file = ar.source + 1;
            *line = ar.currentline;
            found = 1;
        }
        if (in_model || !prefer_model)
            break;
    }
    return found;
}

/* Where a node made now comes from (line 1 of the model if no Lua runs,
 * e.g. for a load error). */
static Loc fe_loc(lua_State *L)
{
    Fe *fe = fe_of(L);
    const char *file;
    int line;
    if (!fe_frame(fe, L, 1, &file, &line)) {
        file = fe->path;
        line = 1;
    }
    return (Loc){ir_intern(fe->m, file), line};
}

static void fe_copyloc(char *dst, size_t n, const char *src)
{
    snprintf(dst, n, "%s", src);
}

/* Raise "file:line: message" at the current node location. */
static int fe_raise(lua_State *L, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
static int fe_raise(lua_State *L, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    Loc l = fe_loc(L);
    lua_pushfstring(L, "%s:%d: %s", l.file, l.line, msg);
    lua_error(L);
    abort(); /* not reached */
}

/* Raise a message that already carries its location (no luaL_where). */
static int fe_fail(lua_State *L, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    lua_pushvfstring(L, fmt, ap);
    va_end(ap);
    return lua_error(L);
}

/* "file:123: ..." ? */
static int fe_has_loc(const char *s)
{
    const char *c = strchr(s, ':');
    if (!c || c == s || !isdigit((unsigned char)c[1]))
        return 0;
    for (c++; isdigit((unsigned char)*c); c++)
        ;
    return *c == ':';
}

/* ------------------------------------------------------- sandbox machinery */

/* Walking the call chain from inside the allocator only reads it, which is
 * safe up to Lua 5.4.4.  From 5.4.5 on, a stack reallocation turns the
 * chain's pointers into offsets while it allocates; there we fall back to the
 * count hook's last line. */
#define FE_OOM_WALK (LUA_VERSION_RELEASE_NUM <= 50404)

static void *fe_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
    Fe *fe = ud;
    size_t old = ptr ? osize : 0;
    if (nsize == 0) {
        free(ptr);
        fe->mem -= old;
        return NULL;
    }
    void *p = NULL;
    if (nsize <= old || fe->mem - old + nsize <= FE_MEM_CAP)
        p = realloc(ptr, nsize);
    if (!p) { /* Lua retries after an emergency GC; the last refusal counts */
        const char *file;
        fe->memfail = 1;
        if (FE_OOM_WALK && fe->L && fe_frame(fe, fe->L, 0, &file, &fe->oomline))
            fe_copyloc(fe->oomfile, sizeof fe->oomfile, file);
        return NULL;
    }
    fe->mem = fe->mem - old + nsize;
    return p;
}

/* The wall-clock limit: the state the SIGALRM handler hooks, and whether it fired. */
static lua_State *volatile fe_alarm_L;
static volatile sig_atomic_t fe_alarm_fired;

static void fe_hook(lua_State *L, lua_Debug *ar);

static void fe_on_alarm(int sig)
{
    (void)sig;
    fe_alarm_fired = 1;
    if (fe_alarm_L)
        lua_sethook(fe_alarm_L, fe_hook, LUA_MASKCOUNT, 1);
}

static void fe_hook(lua_State *L, lua_Debug *ar)
{
    Fe *fe = fe_of(L);
    const char *file;
    (void)ar;
    fe->insns += FE_HOOK_EVERY;
    if (fe_frame(fe, L, 0, &file, &fe->lastline) && strcmp(file, fe->lastfile) != 0)
        fe_copyloc(fe->lastfile, sizeof fe->lastfile, file);
    if (fe->insns <= FE_INSN_LIMIT && !fe_alarm_fired)
        return;
    if (!fe->limitmsg[0]) {
        /* From now on every instruction raises, so that a pcall cannot
         * catch the error and go on: it reaches the top. */
        const char *f = fe->lastfile[0] ? fe->lastfile : fe->path;
        if (fe_alarm_fired)
            snprintf(fe->limitmsg, sizeof fe->limitmsg, "%s:%d: time limit (%g s) exceeded (--frontend-timeout S)",
                     f, fe->lastline, fe->timeout);
        else
            snprintf(fe->limitmsg, sizeof fe->limitmsg, "%s:%d: instruction limit (%dM) exceeded", f, fe->lastline,
                     (int)(FE_INSN_LIMIT / 1000000));
        lua_sethook(L, fe_hook, LUA_MASKCOUNT, 1);
    }
    lua_pushstring(L, fe->limitmsg);
    lua_error(L);
}

/* Is Lua chunk file one of the model's files (the model, its libraries)? */
static const char *fe_model_file(Fe *fe, const char *file)
{
    for (int i = 0; i < fe->nfiles; i++)
        if (strcmp(fe->files[i], file) == 0)
            return fe->files[i];
    return NULL;
}

/* Does the location "file:line" at the start of msg (file maybe shortened
 * by Lua to "...tail") name file f line `line`? */
static int fe_msg_at(const char *msg, const char *f, int line)
{
    const char *colon = strchr(msg, ':');
    size_t n = (size_t)(colon - msg), fl = strlen(f);
    if (atoi(colon + 1) != line)
        return 0;
    if (n > 3 && strncmp(msg, "...", 3) == 0)
        return fl >= n - 3 && strncmp(f + fl - (n - 3), msg + 3, n - 3) == 0;
    return n == fl && strncmp(msg, f, n) == 0;
}

/* Append frames [a, b) of the model's files as ", file:line": the first
 * FE_TRACE_MAX, then "..." and the last. */
static void fe_trace_list(luaL_Buffer *B, const Loc *fr, int a, int b)
{
    for (int k = a; k < b; k++) {
        if (k > a)
            luaL_addstring(B, ", ");
        if (k - a == FE_TRACE_MAX - 1 && b - a > FE_TRACE_MAX) {
            luaL_addstring(B, "..., ");
            k = b - 1;
        }
        lua_pushfstring(B->L, "%s:%d", fr[k].file, fr[k].line);
        luaL_addvalue(B);
    }
}

/* The error line's place among the model's Lua frames: " (inside the
 * helper lines it ran through; called from the model lines that called it)",
 * or "" when it has none. */
static void fe_push_trace(lua_State *L, Fe *fe, const char *msg)
{
    enum { NFR = 64, NLEVELS = 1000 }; /* lua_getstack(L, lv) walks lv frames */
    Loc fr[NFR];
    int n = 0, at = -1;
    lua_Debug ar;
    for (int lv = 0; n < NFR && lv < NLEVELS && lua_getstack(L, lv, &ar); lv++) {
        if (!lua_getinfo(L, "Sl", &ar) || ar.currentline <= 0 || ar.source[0] != '@')
            continue;
        const char *f = fe_model_file(fe, ar.source + 1);
        if (!f || (n && fr[n - 1].file == f && fr[n - 1].line == ar.currentline))
            continue;
        if (at < 0 && fe_msg_at(msg, f, ar.currentline))
            at = n;
        fr[n++] = (Loc){f, ar.currentline};
    }
    luaL_Buffer B;
    luaL_buffinit(L, &B);
    if (at > 0 || (at >= 0 && at < n - 1)) {
        luaL_addstring(&B, " (");
        if (at > 0) {
            luaL_addstring(&B, "inside ");
            fe_trace_list(&B, fr, 0, at);
        }
        if (at < n - 1) {
            luaL_addstring(&B, at > 0 ? "; called from " : "called from ");
            fe_trace_list(&B, fr, at + 1, n);
        }
        luaL_addstring(&B, ")");
    }
    luaL_pushresult(&B);
}

/* Message handler: every error leaves with a "file:line: " prefix and the
 * model lines it was called from (once: layer() re-raises the message its
 * own handler made). */
static int fe_msgh(lua_State *L)
{
    Fe *fe = fe_of(L);
    if (lua_getfield(L, LUA_REGISTRYINDEX, REG_TRACED) == LUA_TSTRING && lua_rawequal(L, 1, -1))
        return 1;
    lua_pop(L, 1);
    const char *msg = lua_tostring(L, 1);
    if (!msg)
        msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
    if (!fe_has_loc(msg)) {
        Loc l = fe_loc(L);
        msg = lua_pushfstring(L, "%s:%d: %s", l.file, l.line, msg);
    }
    if (fe->limitmsg[0])
        return 1;
    fe_push_trace(L, fe, msg);
    lua_concat(L, 2);
    lua_pushvalue(L, -1);
    lua_setfield(L, LUA_REGISTRYINDEX, REG_TRACED);
    return 1;
}

/* Load a chunk named "@file" (text only) and remember its name. */
static int fe_loadfile(lua_State *L, const char *file)
{
    Fe *fe = fe_of(L);
    if (fe->nfiles < FE_MAX_FILES)
        fe->files[fe->nfiles++] = ir_intern(fe->m, file);
    return luaL_loadfilex(L, file, "t");
}

/* require(name): lib/<name>.lua next to the model, else models/lib/<name>.lua;
 * each lib runs once and its result is cached. */
static int l_require(lua_State *L)
{
    Fe *fe = fe_of(L);
    const char *name = lua_tostring(L, 1);
    if (lua_type(L, 1) != LUA_TSTRING || !*name || strlen(name) > 64 ||
        strspn(name, "abcdefghijklmnopqrstuvwxyz0123456789_") != strlen(name))
        fe_raise(L, "require: library names are [a-z0-9_]+ (models/lib/<name>.lua), got %s",
                 lua_type(L, 1) == LUA_TSTRING ? name : luaL_typename(L, 1));
    lua_settop(L, 1);
    lua_getfield(L, LUA_REGISTRYINDEX, REG_LOADED); /* 2 */
    if (lua_getfield(L, 2, name) != LUA_TNIL) {
        if (lua_islightuserdata(L, -1))
            fe_raise(L, "require: '%s' requires itself (a cycle)", name);
        return 1;
    }
    char file[4096];
    const char *slash = strrchr(fe->path, '/');
    int dirlen = slash ? (int)(slash - fe->path) : 1;
    snprintf(file, sizeof file, "%.*s/lib/%s.lua", dirlen, slash ? fe->path : ".", name);
    FILE *f = fopen(file, "r");
    if (!f) {
        snprintf(file, sizeof file, "models/lib/%s.lua", name);
        f = fopen(file, "r");
    }
    if (!f)
        fe_raise(L, "require: no library '%s' (looked for lib/%s.lua next to the model and models/lib/%s.lua)",
                 name, name, name);
    fclose(f);
    lua_pushlightuserdata(L, fe); /* "loading" mark */
    lua_setfield(L, 2, name);
    if (fe_loadfile(L, file) != LUA_OK)
        lua_error(L);
    lua_pushstring(L, name);
    lua_call(L, 1, 1);
    if (lua_isnil(L, -1)) {
        lua_pop(L, 1);
        lua_pushboolean(L, 1);
    }
    lua_pushvalue(L, -1);
    lua_setfield(L, 2, name);
    return 1;
}

/* print goes to stderr: stdout belongs to `kiln dump`. */
static int l_print(lua_State *L)
{
    int n = lua_gettop(L);
    for (int i = 1; i <= n; i++) {
        fputs(luaL_tolstring(L, i, NULL), stderr);
        fputc(i < n ? '\t' : '\n', stderr);
        lua_pop(L, 1);
    }
    if (n == 0)
        fputc('\n', stderr);
    return 0;
}

/* ------------------------------------------------------- argument helpers */

static const Type *fe_type(lua_State *L, int vid) { return &fe_of(L)->g->vals[vid].t; }

static char *fe_tstr(lua_State *L, int vid, char *buf, size_t n)
{
    return ir_type_str(fe_type(L, vid), buf, n);
}

static int fe_is_tensor(lua_State *L, int i) { return luaL_testudata(L, i, TENSOR_MT) != NULL; }

/* Value id of tensor argument i. */
static int fe_tensor(lua_State *L, int i, const char *what)
{
    int *u = luaL_testudata(L, i, TENSOR_MT);
    if (!u)
        fe_raise(L, "%s: argument %d must be a tensor, got %s", what, i, luaL_typename(L, i));
    return *u;
}

static int64_t fe_int(lua_State *L, int i, const char *what, const char *arg)
{
    int ok;
    lua_Integer v = lua_tointegerx(L, i, &ok);
    if (!ok || lua_type(L, i) != LUA_TNUMBER)
        fe_raise(L, "%s: %s must be an integer, got %s", what, arg,
                 lua_type(L, i) == LUA_TNUMBER ? lua_tostring(L, i) : luaL_typename(L, i));
    return v;
}

static int64_t fe_optint(lua_State *L, int i, const char *what, const char *arg, int64_t dflt)
{
    return lua_isnoneornil(L, i) ? dflt : fe_int(L, i, what, arg);
}

static double fe_optnum(lua_State *L, int i, const char *what, const char *arg, double dflt)
{
    if (lua_isnoneornil(L, i))
        return dflt;
    if (lua_type(L, i) != LUA_TNUMBER)
        fe_raise(L, "%s: %s must be a number, got %s", what, arg, luaL_typename(L, i));
    return lua_tonumber(L, i);
}

static int fe_optbool(lua_State *L, int i, const char *what, const char *arg, int dflt)
{
    switch (lua_type(L, i)) {
    case LUA_TNONE:
    case LUA_TNIL: return dflt;
    case LUA_TBOOLEAN: return lua_toboolean(L, i);
    case LUA_TNUMBER: return lua_tonumber(L, i) != 0;
    default: fe_raise(L, "%s: %s must be a boolean, got %s", what, arg, luaL_typename(L, i));
    }
}

static const char *fe_optstr(lua_State *L, int i, const char *what, const char *arg, const char *dflt)
{
    if (lua_isnoneornil(L, i))
        return dflt;
    if (lua_type(L, i) != LUA_TSTRING)
        fe_raise(L, "%s: %s must be a string, got %s", what, arg, luaL_typename(L, i));
    return lua_tostring(L, i);
}

/* The options table at argument i (none or nil: nothing to check) has only
 * the keys in keys[] (NULL-terminated, the list next to each primitive): a
 * misspelled option ({casual = true}) is an error, not a default. */
static void fe_options(lua_State *L, int i, const char *what, const char *const keys[])
{
    if (lua_isnoneornil(L, i))
        return;
    if (!lua_istable(L, i))
        fe_raise(L, "%s: options must be a table like {%s = ...}, got %s", what, keys[0], luaL_typename(L, i));
    for (lua_pushnil(L); lua_next(L, i); lua_pop(L, 1)) {
        int k = 0;
        while (keys[k] && !(lua_type(L, -2) == LUA_TSTRING && strcmp(lua_tostring(L, -2), keys[k]) == 0))
            k++;
        if (keys[k])
            continue;
        luaL_Buffer B;
        luaL_buffinit(L, &B);
        for (k = 0; keys[k]; k++) {
            luaL_addstring(&B, k ? ", " : "");
            luaL_addstring(&B, keys[k]);
        }
        luaL_pushresult(&B);
        const char *list = lua_tostring(L, -1), *key = luaL_tolstring(L, -3, NULL);
        fe_raise(L, "%s: unknown option %s (options: %s)", what, key, list);
    }
}

static DType fe_dtype(lua_State *L, int i, const char *what)
{
    const char *s = fe_optstr(L, i, what, "dtype", "f32");
    int dt = ir_dtype_lookup(s);
    if (dt < 0)
        fe_raise(L, "%s: unknown dtype '%s' (f32, bf16, f16, i32, i64)", what, s);
    return (DType)dt;
}

/* A 1-based (or negative) Lua dim of a rank-r tensor, as a 0-based IR dim. */
static int fe_dim(lua_State *L, int i, int rank, const char *what, int64_t dflt)
{
    int64_t d = fe_optint(L, i, what, "dim", dflt), z = d < 0 ? d + rank : d - 1;
    if (z < 0 || z >= rank)
        fe_raise(L, "%s: dim %lld out of range for a rank-%d tensor", what, (long long)d, rank);
    return (int)z;
}

static char *fe_dims_str(const int64_t *dim, int rank, char *buf, size_t n)
{
    size_t k = snprintf(buf, n, "[");
    for (int i = 0; i < rank && k < n; i++)
        k += snprintf(buf + k, n - k, "%s%lld", i ? "," : "", (long long)dim[i]);
    if (k < n)
        snprintf(buf + k, n - k, "]");
    return buf;
}

/* A shape table {8, 64, ...} into t->rank/t->dim.  With infer, one -1 is
 * allowed and its index is stored there (else -1). */
static void fe_shape(lua_State *L, int i, const char *what, Type *t, int *infer)
{
    if (infer)
        *infer = -1;
    if (lua_type(L, i) != LUA_TTABLE)
        fe_raise(L, "%s: shape must be a table like {8, 64}, got %s", what, luaL_typename(L, i));
    size_t n = lua_rawlen(L, i);
    if (n > IR_MAXRANK)
        fe_raise(L, "%s: shape has %zu dims, at most %d", what, n, IR_MAXRANK);
    t->rank = (int)n;
    int64_t numel = 1;
    for (int k = 0; k < (int)n; k++) {
        int ok;
        lua_rawgeti(L, i, k + 1);
        lua_Integer d = lua_tointegerx(L, -1, &ok);
        if (!ok || lua_type(L, -1) != LUA_TNUMBER)
            fe_raise(L, "%s: dim %d of the shape is %s, not an integer", what, k + 1,
                     lua_type(L, -1) == LUA_TNUMBER ? lua_tostring(L, -1) : luaL_typename(L, -1));
        lua_pop(L, 1);
        if (d == -1 && infer && *infer < 0) {
            *infer = k;
            d = 1;
        } else if (d < 1 || d > FE_MAX_NUMEL) {
            fe_raise(L, "%s: dim %d of the shape is %lld", what, k + 1, (long long)d);
        }
        t->dim[k] = d;
        if (numel > FE_MAX_NUMEL / d)
            fe_raise(L, "%s: shape has more than 2^50 elements", what);
        numel *= d;
    }
}

/* ------------------------------------------------------------ graph building */

static void fe_push(lua_State *L, int vid)
{
    int *u = lua_newuserdatauv(L, sizeof(int), 0);
    *u = vid;
    luaL_setmetatable(L, TENSOR_MT);
}

/* ", with parameter NAME[, NAME...]" for the inputs among in[] that are
 * param() values ("" when none is), into buf. */
static const char *fe_params_of(Fe *fe, int nin, const int *in, char *buf, size_t n)
{
    size_t k = 0;
    buf[0] = 0;
    for (int i = 0; i < nin && k < n; i++) {
        int d = fe->g->vals[in[i]].def;
        if (d >= 0 && fe->g->nodes[d].op == OP_param)
            k += snprintf(buf + k, n - k, "%s%s", k ? ", " : ", with parameter ",
                          ir_attr_s(&fe->g->nodes[d], "name", "?"));
    }
    return buf;
}

/* Append a node; raise "file:line: op: message" if the IR rejects it. */
static int fe_node(lua_State *L, Op op, int nin, const int *in, int nattr, const Attr *at, const Type *src)
{
    Fe *fe = fe_of(L);
    if (fe->g->nnodes >= FE_MAX_NODES)
        fe_raise(L, "%s: the graph has more than %d nodes", ir_ops[op].name, FE_MAX_NODES);
    static const int none[1];
    NodeSpec s = ir_spec(op, fe_loc(L));
    s.nin = nin;
    s.in = in ? in : none; /* ir_add_node memcpy's it even when nin = 0 */
    s.nattr = nattr;
    s.attr = at;
    s.layer = fe->layer;
    s.phase = PH_FWD;
    s.src_type = src;
    char err[512];
    int n = ir_add_node(fe->g, &s, err, sizeof err);
    if (n < 0) {
        const char *name = ir_ops[op].name;
        size_t k = strlen(name);
        int named = strncmp(err, name, k) == 0 && err[k] == ':';
        char params[512];
        lua_pushfstring(L, "%s:%d: %s%s%s%s", s.loc.file, s.loc.line, named ? "" : name, named ? "" : ": ", err,
                        fe_params_of(fe, nin, in, params, sizeof params));
        lua_error(L);
    }
    return n;
}

/* Node with one output; returns its value id. */
static int fe_node1(lua_State *L, Op op, int nin, const int *in, int nattr, const Attr *at)
{
    return ir_out(fe_of(L)->g, fe_node(L, op, nin, in, nattr, at, NULL));
}

static int fe_const(lua_State *L, double v, const Type *t)
{
    Attr a = ir_attr_float(fe_of(L)->m, "v", v);
    return ir_out(fe_of(L)->g, fe_node(L, OP_const, 0, NULL, 1, &a, t));
}

static int fe_broadcast(lua_State *L, int vid, const Type *to)
{
    const Type *t = fe_type(L, vid);
    if (t->rank == to->rank && memcmp(t->dim, to->dim, sizeof(int64_t) * to->rank) == 0)
        return vid;
    Attr a = ir_attr_ints(fe_of(L)->m, "shape", to->dim, to->rank);
    return fe_node1(L, OP_broadcast, 1, &vid, 1, &a);
}

/* numpy: align trailing dims; equal, or one of them 1. */
static int fe_broadcast_shape(const Type *a, const Type *b, Type *out)
{
    int r = a->rank > b->rank ? a->rank : b->rank;
    out->dt = a->dt;
    out->rank = r;
    for (int i = 0; i < r; i++) {
        int ia = i - (r - a->rank), ib = i - (r - b->rank);
        int64_t x = ia < 0 ? 1 : a->dim[ia], y = ib < 0 ? 1 : b->dim[ib];
        if (x != y && x != 1 && y != 1)
            return 0;
        out->dim[i] = x == 1 ? y : x;
    }
    return 1;
}

/* ------------------------------------------------------------- primitives */

/* a (op) b with numbers as scalar consts and numpy broadcasting. */
static int fe_binary(lua_State *L, Op op)
{
    const char *what = ir_ops[op].name;
    int ta = fe_is_tensor(L, 1), tb = fe_is_tensor(L, 2);
    if (!ta && !tb)
        fe_raise(L, "%s: needs a tensor operand, got %s and %s", what, luaL_typename(L, 1), luaL_typename(L, 2));
    int v[2];
    for (int i = 0; i < 2; i++)
        if (lua_type(L, i + 1) != LUA_TNUMBER)
            v[i] = fe_tensor(L, i + 1, what);
    DType dt = fe_type(L, ta ? v[0] : v[1])->dt;
    for (int i = 0; i < 2; i++)
        if (lua_type(L, i + 1) == LUA_TNUMBER)
            v[i] = fe_const(L, lua_tonumber(L, i + 1), &(Type){.dt = dt, .rank = 0});
    Type out, a = *fe_type(L, v[0]), b = *fe_type(L, v[1]);
    if (!fe_broadcast_shape(&a, &b, &out)) {
        char sa[96], sb[96], params[512];
        fe_raise(L, "%s: %s and %s do not broadcast%s", what, fe_tstr(L, v[0], sa, sizeof sa),
                 fe_tstr(L, v[1], sb, sizeof sb), fe_params_of(fe_of(L), 2, v, params, sizeof params));
    }
    v[0] = fe_broadcast(L, v[0], &out);
    v[1] = fe_broadcast(L, v[1], &out);
    fe_push(L, fe_node1(L, op, 2, v, 0, NULL));
    return 1;
}

static int l_binary(lua_State *L) { return fe_binary(L, (Op)lua_tointeger(L, lua_upvalueindex(1))); }
static int l_add(lua_State *L) { return fe_binary(L, OP_add); }
static int l_sub(lua_State *L) { return fe_binary(L, OP_sub); }
static int l_mul(lua_State *L) { return fe_binary(L, OP_mul); }
static int l_div(lua_State *L) { return fe_binary(L, OP_div); }

static int l_unary(lua_State *L)
{
    Op op = (Op)lua_tointeger(L, lua_upvalueindex(1));
    int x = fe_tensor(L, 1, ir_ops[op].name);
    fe_push(L, fe_node1(L, op, 1, &x, 0, NULL));
    return 1;
}

/* ---- issue 17: pow, where (sigmoid, abs, minimum, maximum: the op table) ---- */

/* pow(x, p), x ^ p: p a number (a tensor exponent is refused) */
static int l_pow(lua_State *L)
{
    if (!fe_is_tensor(L, 1))
        fe_raise(L, "pow: the base must be a tensor, got %s", luaL_typename(L, 1));
    int x = fe_tensor(L, 1, "pow");
    if (lua_type(L, 2) != LUA_TNUMBER)
        fe_raise(L, "pow: the exponent must be a number, got %s", fe_is_tensor(L, 2) ? "a tensor" : luaL_typename(L, 2));
    Attr a = ir_attr_float(fe_of(L)->m, "p", lua_tonumber(L, 2));
    fe_push(L, fe_node1(L, OP_pow, 1, &x, 1, &a));
    return 1;
}

/* where(c, a, b): c != 0 ? a : b, c a float mask; a and b may be numbers;
 * numpy broadcasting over the three */
static int l_where(lua_State *L)
{
    if (!fe_is_tensor(L, 1))
        fe_raise(L, "where: the condition must be a tensor (a float mask, nonzero = true), got %s", luaL_typename(L, 1));
    int v[3] = {fe_tensor(L, 1, "where"), 0, 0};
    DType dt = fe_type(L, v[0])->dt;
    for (int i = 1; i < 3; i++)
        v[i] = lua_type(L, i + 1) == LUA_TNUMBER ? fe_const(L, lua_tonumber(L, i + 1), &(Type){.dt = dt, .rank = 0})
                                                  : fe_tensor(L, i + 1, "where");
    Type out = *fe_type(L, v[0]);
    for (int i = 1; i < 3; i++) {
        Type t = out;
        if (!fe_broadcast_shape(&t, fe_type(L, v[i]), &out)) {
            char sa[96], sb[96];
            fe_raise(L, "where: %s and %s do not broadcast", fe_tstr(L, v[0], sa, sizeof sa), fe_tstr(L, v[i], sb, sizeof sb));
        }
    }
    for (int i = 0; i < 3; i++) v[i] = fe_broadcast(L, v[i], &out);
    fe_push(L, fe_node1(L, OP_where, 3, v, 0, NULL));
    return 1;
}

/* sum/mean/max(x, dim, keep); without dim, over every dim (last first). */
static int l_reduce(lua_State *L)
{
    Fe *fe = fe_of(L);
    Op op = (Op)lua_tointeger(L, lua_upvalueindex(1));
    const char *what = ir_ops[op].name;
    int x = fe_tensor(L, 1, what), rank = fe_type(L, x)->rank;
    if (lua_isnoneornil(L, 2)) {
        for (int d = rank - 1; d >= 0; d--) {
            Attr a[2] = {ir_attr_int(fe->m, "dim", d), ir_attr_int(fe->m, "keep", 0)};
            x = fe_node1(L, op, 1, &x, 2, a);
        }
    } else {
        int d = fe_dim(L, 2, rank, what, -1), keep = fe_optbool(L, 3, what, "keep", 0);
        Attr a[2] = {ir_attr_int(fe->m, "dim", d), ir_attr_int(fe->m, "keep", keep)};
        x = fe_node1(L, op, 1, &x, 2, a);
    }
    fe_push(L, x);
    return 1;
}

/* matmul(a, b, {ta=, tb=}) */
static const char *const matmul_options[] = {"ta", "tb", NULL};

static int l_matmul(lua_State *L)
{
    Fe *fe = fe_of(L);
    int in[2] = {fe_tensor(L, 1, "matmul"), fe_tensor(L, 2, "matmul")};
    Attr at[2];
    int n = 0;
    fe_options(L, 3, "matmul", matmul_options);
    if (!lua_isnoneornil(L, 3)) {
        static const char *const keys[2] = {"ta", "tb"};
        for (int k = 0; k < 2; k++) {
            lua_getfield(L, 3, keys[k]);
            if (fe_optbool(L, -1, "matmul", keys[k], 0))
                at[n++] = ir_attr_int(fe->m, keys[k], 1);
            lua_pop(L, 1);
        }
    }
    fe_push(L, fe_node1(L, OP_matmul, 2, in, n, at));
    return 1;
}

static int l_reshape(lua_State *L)
{
    int x = fe_tensor(L, 1, "reshape"), infer;
    Type t;
    fe_shape(L, 2, "reshape", &t, &infer);
    int64_t have = ir_numel(fe_type(L, x)), want = ir_numel(&t);
    if (infer >= 0 && have % want == 0) {
        t.dim[infer] = have / want;
    } else if (infer >= 0 || want != have) {
        char s[96], d[96];
        if (infer >= 0)
            t.dim[infer] = -1;
        fe_raise(L, "reshape: cannot reshape %s to %s", fe_tstr(L, x, s, sizeof s),
                 fe_dims_str(t.dim, t.rank, d, sizeof d));
    }
    Attr a = ir_attr_ints(fe_of(L)->m, "shape", t.dim, t.rank);
    fe_push(L, fe_node1(L, OP_reshape, 1, &x, 1, &a));
    return 1;
}

static int l_transpose(lua_State *L)
{
    Fe *fe = fe_of(L);
    int x = fe_tensor(L, 1, "transpose"), r = fe_type(L, x)->rank;
    Attr a[2] = {ir_attr_int(fe->m, "a", fe_dim(L, 2, r, "transpose", -2)),
                 ir_attr_int(fe->m, "b", fe_dim(L, 3, r, "transpose", -1))};
    fe_push(L, fe_node1(L, OP_transpose, 1, &x, 2, a));
    return 1;
}

/* slice(x, dim, first, last): 1-based inclusive like string.sub, negative
 * from the end; IR {start, end} is 0-based, end exclusive. */
static int l_slice(lua_State *L)
{
    Fe *fe = fe_of(L);
    int x = fe_tensor(L, 1, "slice");
    Type t = *fe_type(L, x);
    int d = fe_dim(L, 2, t.rank, "slice", -1);
    int64_t n = t.dim[d], first = fe_int(L, 3, "slice", "first"), last = fe_optint(L, 4, "slice", "last", -1);
    int64_t f = first < 0 ? n + first + 1 : first, l = last < 0 ? n + last + 1 : last;
    if (f < 1 || l > n || f > l) {
        char s[96];
        fe_raise(L, "slice: %lld..%lld out of range for dim %d of %s", (long long)first, (long long)last,
                 d + 1, fe_tstr(L, x, s, sizeof s));
    }
    Attr a[3] = {ir_attr_int(fe->m, "dim", d), ir_attr_int(fe->m, "start", f - 1), ir_attr_int(fe->m, "end", l)};
    fe_push(L, fe_node1(L, OP_slice, 1, &x, 3, a));
    return 1;
}

static int l_concat(lua_State *L)
{
    enum { MAXIN = IR_MAXIN };
    int in[MAXIN];
    if (!lua_istable(L, 1))
        fe_raise(L, "concat: the first argument must be a list of tensors, got %s", luaL_typename(L, 1));
    int n = (int)lua_rawlen(L, 1);
    if (n < 1 || n > MAXIN)
        fe_raise(L, "concat: needs 1 to %d tensors, got %d", MAXIN, n);
    for (int k = 0; k < n; k++) {
        lua_rawgeti(L, 1, k + 1);
        int *u = luaL_testudata(L, -1, TENSOR_MT);
        if (!u)
            fe_raise(L, "concat: element %d of the list is a %s, not a tensor", k + 1, luaL_typename(L, -1));
        in[k] = *u;
        lua_pop(L, 1);
    }
    Attr a = ir_attr_int(fe_of(L)->m, "dim", fe_dim(L, 2, fe_type(L, in[0])->rank, "concat", -1));
    fe_push(L, fe_node1(L, OP_concat, n, in, 1, &a));
    return 1;
}

static int l_broadcast(lua_State *L)
{
    int x = fe_tensor(L, 1, "broadcast");
    Type t;
    fe_shape(L, 2, "broadcast", &t, NULL);
    Attr a = ir_attr_ints(fe_of(L)->m, "shape", t.dim, t.rank);
    fe_push(L, fe_node1(L, OP_broadcast, 1, &x, 1, &a));
    return 1;
}

static int l_cast(lua_State *L)
{
    int x = fe_tensor(L, 1, "cast");
    if (lua_isnoneornil(L, 2))
        fe_raise(L, "cast: needs a dtype");
    Attr a = ir_attr_str(fe_of(L)->m, "dtype", ir_dtype_names[fe_dtype(L, 2, "cast")]);
    fe_push(L, fe_node1(L, OP_cast, 1, &x, 1, &a));
    return 1;
}

/* layernorm(x, w, b, eps); b = nil: no bias (issue 17) */
static int l_layernorm(lua_State *L)
{
    int nb = lua_isnoneornil(L, 3) ? 2 : 3;
    int in[3] = {fe_tensor(L, 1, "layernorm"), fe_tensor(L, 2, "layernorm"), nb > 2 ? fe_tensor(L, 3, "layernorm") : 0};
    Attr a = ir_attr_float(fe_of(L)->m, "eps", fe_optnum(L, 4, "layernorm", "eps", 1e-5));
    fe_push(L, fe_node1(L, OP_layernorm, nb, in, 1, &a));
    return 1;
}

static int l_rmsnorm(lua_State *L)
{
    int in[2] = {fe_tensor(L, 1, "rmsnorm"), fe_tensor(L, 2, "rmsnorm")};
    Attr a = ir_attr_float(fe_of(L)->m, "eps", fe_optnum(L, 3, "rmsnorm", "eps", 1e-6));
    fe_push(L, fe_node1(L, OP_rmsnorm, 2, in, 1, &a));
    return 1;
}

static int l_rope(lua_State *L)
{
    int in[2] = {fe_tensor(L, 1, "rope"), fe_tensor(L, 2, "rope")};
    Attr a = ir_attr_float(fe_of(L)->m, "theta", fe_optnum(L, 3, "rope", "theta", 10000));
    fe_push(L, fe_node1(L, OP_rope, 2, in, 1, &a));
    return 1;
}

/* Ops of two tensors and no attributes: embedding, cross_entropy. */
static int l_pair(lua_State *L)
{
    Op op = (Op)lua_tointeger(L, lua_upvalueindex(1));
    int in[2] = {fe_tensor(L, 1, ir_ops[op].name), fe_tensor(L, 2, ir_ops[op].name)};
    fe_push(L, fe_node1(L, op, 2, in, 0, NULL));
    return 1;
}

/* attention(q, k, v, {causal=true, scale=1/sqrt(D), window=W}) -> o, lse.
 * window (sliding-window attention, causal only): query t sees the W keys
 * t-W+1..t; absent (nil) for none. */
static const char *const attention_options[] = {"causal", "scale", "window", NULL};

static int l_attention(lua_State *L)
{
    Fe *fe = fe_of(L);
    int in[3] = {fe_tensor(L, 1, "attention"), fe_tensor(L, 2, "attention"), fe_tensor(L, 3, "attention")};
    const Type *q = fe_type(L, in[0]);
    int causal = 1;
    int64_t window = 0;
    double scale = 1.0 / sqrt((double)(q->rank ? q->dim[q->rank - 1] : 1));
    fe_options(L, 4, "attention", attention_options);
    if (!lua_isnoneornil(L, 4)) {
        lua_getfield(L, 4, "causal");
        causal = fe_optbool(L, -1, "attention", "causal", 1);
        lua_getfield(L, 4, "scale");
        scale = fe_optnum(L, -1, "attention", "scale", scale);
        lua_getfield(L, 4, "window");
        window = fe_optint(L, -1, "attention", "window", 0);
        if (!lua_isnil(L, -1) && (window < 1 || window > INT32_MAX))
            fe_raise(L, "attention: window must be an integer in [1, 2^31-1] (keys per query, itself included), got %lld",
                     (long long)window);
        if (window && !causal) fe_raise(L, "attention: window needs causal = true");
        lua_pop(L, 3);
    }
    Attr a[3] = {ir_attr_int(fe->m, "causal", causal), ir_attr_float(fe->m, "scale", scale),
                 ir_attr_int(fe->m, "window", window)};
    int n = fe_node(L, OP_attention, 3, in, window ? 3 : 2, a, NULL);
    fe_push(L, fe->g->nodes[n].out[0]);
    fe_push(L, fe->g->nodes[n].out[1]);
    return 2;
}

/* ---- dropout (issue 17) ----
 * dropout(x, p) or dropout(x, {p = 0.1}) on x [B,T,...]: inverted dropout
 * whose mask is a hash of (seed, the call's ordinal, the step, the global
 * sample, token and feature index) (ops.def, runtime/rng.h).  The step is
 * the optimizer's counter, state opt.step (the optimizer pass reads the same
 * state); rows and pos are iotas that parallelize turns into global sample
 * indices (axis "batch") and global token positions.  p = 0 and kiln
 * sample's forward program (Options.no_dropout) give x itself. */
static double fe_dropout_p(lua_State *L)
{
    if (lua_type(L, 2) == LUA_TNUMBER) return lua_tonumber(L, 2);
    if (!lua_istable(L, 2)) fe_raise(L, "dropout: p must be a number or a table like {p = 0.1}, got %s", luaL_typename(L, 2));
    for (lua_pushnil(L); lua_next(L, 2); lua_pop(L, 1))
        if (lua_type(L, -2) != LUA_TSTRING || strcmp(lua_tostring(L, -2), "p") != 0)
            fe_raise(L, "dropout: unknown option %s (dropout takes p)",
                     lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : luaL_typename(L, -2));
    lua_getfield(L, 2, "p");
    if (lua_type(L, -1) != LUA_TNUMBER) fe_raise(L, "dropout: p must be a number, got %s", luaL_typename(L, -1));
    double p = lua_tonumber(L, -1);
    lua_pop(L, 1);
    return p;
}

static int l_dropout(lua_State *L)
{
    Fe *fe = fe_of(L);
    int x = fe_tensor(L, 1, "dropout");
    double p = fe_dropout_p(L);
    const Type *t = fe_type(L, x);
    char buf[96];
    if (!(p >= 0 && p < 1)) fe_raise(L, "dropout: p must be in [0, 1), got %g", p);
    if (t->rank < 2) fe_raise(L, "dropout: x must be [B,T,...] (batch, sequence first), got %s", fe_tstr(L, x, buf, sizeof buf));
    if (p == 0 || (fe->o && fe->o->no_dropout)) {
        lua_settop(L, 1);
        return 1;
    }
    if (fe->dropout_step < 0) { /* the step counter belongs to no layer */
        Type st = {.dt = DT_F32, .rank = 0};
        Attr name = ir_attr_str(fe->m, "name", "opt.step");
        int layer = fe->layer;
        fe->layer = -1;
        fe->dropout_step = ir_out(fe->g, fe_node(L, OP_state, 0, NULL, 1, &name, &st));
        fe->layer = layer;
    }
    Type rt = {.dt = DT_I32, .rank = 1, .dim = {t->dim[0]}}, pt = {.dt = DT_I32, .rank = 1, .dim = {t->dim[1]}};
    Attr axis = ir_attr_str(fe->m, "axis", "batch");
    int in[4] = {x, fe->dropout_step, ir_out(fe->g, fe_node(L, OP_iota, 0, NULL, 1, &axis, &rt)),
                 ir_out(fe->g, fe_node(L, OP_iota, 0, NULL, 0, NULL, &pt))};
    Attr a[3] = {ir_attr_float(fe->m, "p", p), ir_attr_int(fe->m, "seed", fe->o ? (int64_t)fe->o->seed : 0),
                 ir_attr_int(fe->m, "id", fe->ndropout++)};
    fe_push(L, fe_node1(L, OP_dropout, 4, in, 3, a));
    return 1;
}

/* loss(x): the one objective; also exposed as program output "loss". */
static int l_loss(lua_State *L)
{
    Fe *fe = fe_of(L);
    int x = fe_tensor(L, 1, "loss");
    if (fe->nloss)
        fe_raise(L, "loss: the model already has a loss (at %s:%d); exactly one is allowed",
                 fe->loss_loc.file, fe->loss_loc.line);
    int y = fe_node1(L, OP_loss, 1, &x, 0, NULL);
    Attr a = ir_attr_str(fe->m, "name", "loss");
    fe_node(L, OP_output, 1, &y, 1, &a, NULL);
    fe->nloss = 1;
    fe->loss_loc = fe_loc(L);
    fe_push(L, y);
    return 1;
}

/* kiln's own names, which a model's param, input or output may not take
 * (after the layer prefix): the compiled step and its checkpoints keep these
 * tensors in the same name space as the model's, and a collision would bind
 * the model's tensor to kiln's (a state of another size, a checkpoint whose
 * entries cannot be told apart).  A prefix rule when the entry ends in . or :,
 * else the whole name.  docs/dsl.md lists them. */
static const struct {
    const char *name, *owner;
} fe_reserved[] = {
    {"opt.", "the optimizer's state (opt.m.<p>, opt.v.<p>, opt.step, opt.m.b<k>; optimizer.c)"},
    {"param.", "the distributed optimizer's master weight shards (param.b<k>; optimizer.c)"},
    {"trainer.", "the checkpoint's trainer state (trainer.step, trainer.rng, trainer.data_pos; checkpoint.c)"},
    {"grad:", "the gradients' outputs (grad:<param>; autodiff.c)"},
    {"__metadata__", "the safetensors header (checkpoints)"},
};

static void fe_check_reserved(lua_State *L, const char *what, const char *name)
{
    for (size_t k = 0; k < sizeof fe_reserved / sizeof fe_reserved[0]; k++) {
        const char *r = fe_reserved[k].name;
        size_t n = strlen(r);
        int prefix = r[n - 1] == '.' || r[n - 1] == ':';
        if (prefix ? strncmp(name, r, n) == 0 : strcmp(name, r) == 0)
            fe_raise(L, "%s: the name %s is reserved: %s%s is %s", what, name, r, prefix ? "*" : "", fe_reserved[k].owner);
    }
}

/* Names of inputs and params: letters, digits and . _ - : / (no control
 * characters, no NUL: C would see a shorter name than Lua's). */
static const char *fe_name(lua_State *L, int i, const char *what)
{
    size_t len;
    const char *s = lua_tolstring(L, i, &len);
    if (lua_type(L, i) != LUA_TSTRING || !*s)
        fe_raise(L, "%s: the first argument must be a name, got %s", what, luaL_typename(L, i));
    if (len > 200)
        fe_raise(L, "%s: name longer than 200 characters", what);
    if (strlen(s) != len)
        fe_raise(L, "%s: name '%s...' contains a NUL byte", what, s);
    for (const char *c = s; *c; c++)
        if (!isalnum((unsigned char)*c) && !strchr("._-:/", *c)) {
            char bad[8];
            snprintf(bad, sizeof bad, isprint((unsigned char)*c) ? "'%c'" : "\\x%02X", (unsigned char)*c);
            fe_raise(L, "%s: bad character %s in a name (use letters, digits and . _ - : /)", what, bad);
        }
    return s;
}

/* A param's or input's name is not reserved and unique among both:
 * REG_PARAMS maps each to "file:line" of its definition. */
static void fe_new_name(lua_State *L, const char *what, const char *name)
{
    fe_check_reserved(L, what, name);
    lua_getfield(L, LUA_REGISTRYINDEX, REG_PARAMS);
    if (lua_getfield(L, -1, name) != LUA_TNIL)
        fe_raise(L, "%s: duplicate %s name %s (first defined at %s)", what,
                 strcmp(what, "param") ? "input or parameter" : "parameter", name, lua_tostring(L, -1));
    Loc l = fe_loc(L);
    lua_pushfstring(L, "%s:%d", l.file, l.line);
    lua_setfield(L, -3, name);
    lua_pop(L, 2);
}

/* output(name, x): expose x as program output `name` (e.g. "logits", which
 * `kiln sample` reads).  Names the compiler gives its own outputs are taken. */
static int l_output(lua_State *L)
{
    Fe *fe = fe_of(L);
    const char *name = fe_name(L, 1, "output");
    int x = fe_tensor(L, 2, "output");
    if (!strcmp(name, "loss") || !strcmp(name, "lr") || !strcmp(name, "grad_norm") || !strncmp(name, "grad:", 5))
        fe_raise(L, "output: the name %s is reserved (loss, lr, grad_norm, grad:*)", name);
    fe_check_reserved(L, "output", name);
    for (int i = 0; i < fe->g->nnodes; i++)
        if (fe->g->nodes[i].op == OP_output && !strcmp(ir_attr_s(&fe->g->nodes[i], "name", ""), name))
            fe_raise(L, "output: duplicate output name %s", name);
    Attr a = ir_attr_str(fe->m, "name", name);
    fe_node(L, OP_output, 1, &x, 1, &a, NULL);
    fe_push(L, x);
    return 1;
}

/* input(name, shape, dtype="f32") */
static int l_input(lua_State *L)
{
    Fe *fe = fe_of(L);
    const char *name = fe_name(L, 1, "input");
    Type t;
    fe_shape(L, 2, "input", &t, NULL);
    t.dt = fe_dtype(L, 3, "input");
    fe_new_name(L, "input", name);
    Attr a = ir_attr_str(fe->m, "name", name);
    fe_push(L, ir_out(fe->g, fe_node(L, OP_input, 0, NULL, 1, &a, &t)));
    return 1;
}

/* normal(std), zeros(), ones(): init descriptions for param() */
static int l_normal(lua_State *L)
{
    double std = fe_optnum(L, 1, "normal", "std", NAN);
    if (!(std >= 0))
        fe_raise(L, "normal: needs a standard deviation >= 0, like normal(0.02)");
    lua_createtable(L, 0, 2);
    lua_pushstring(L, "normal");
    lua_setfield(L, -2, "init");
    lua_pushnumber(L, std);
    lua_setfield(L, -2, "std");
    return 1;
}

static int l_filled(lua_State *L)
{
    lua_createtable(L, 0, 1);
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_setfield(L, -2, "init");
    return 1;
}

/* param(name, shape, init): f32; inside layer(i, fn) named "h.<i>.<name>"
 * (or "<prefix><i>.<name>" with layer's {prefix=...}; as given with
 * {prefix=false}) */
static const char *const param_init_keys[] = {"init", "std", NULL}; /* what normal() etc. make */

static int l_param(lua_State *L)
{
    Fe *fe = fe_of(L);
    int nargs = lua_gettop(L);
    const char *base = fe_name(L, 1, "param");
    Type t;
    fe_shape(L, 2, "param", &t, NULL);
    t.dt = DT_F32;
    if (lua_istable(L, 3))
        fe_options(L, 3, "param", param_init_keys);
    const char *init = NULL;
    double std = 0;
    if (lua_istable(L, 3)) {
        lua_getfield(L, 3, "init");
        lua_getfield(L, 3, "std");
        init = lua_tostring(L, -2);
        std = lua_tonumber(L, -1);
    }
    if (!init || (strcmp(init, "normal") && strcmp(init, "zeros") && strcmp(init, "ones")))
        fe_raise(L, "param: %s needs an init: normal(std), zeros() or ones()", base);
    /* param(name, shape, init, {tp = dim}): the dim tensor parallelism splits
     * (issue 20, docs/parallel.md); 1-based, negative from the end */
    int tpd = -1, tpblocks = 1;
    if (nargs >= 4 && !lua_isnil(L, 4)) {
        static const char *const param_keys[] = {"tp", "tp_blocks", NULL};
        fe_options(L, 4, "param", param_keys);
        lua_getfield(L, 4, "tp");
        if (!lua_isinteger(L, -1))
            fe_raise(L, "param: %s: {tp = dim} needs an integer dim, got %s", base, luaL_typename(L, -1));
        int64_t d = (int64_t)lua_tointeger(L, -1);
        lua_pop(L, 1);
        tpd = (int)(d < 0 ? d + t.rank : d - 1);
        if (tpd < 0 || tpd >= t.rank)
            fe_raise(L, "param: %s: {tp = %lld} out of range for a rank-%d parameter", base, (long long)d, t.rank);
        lua_getfield(L, 4, "tp_blocks"); /* the dim is that many blocks, each split over tp (a fused QKV) */
        if (!lua_isnil(L, -1)) {
            if (!lua_isinteger(L, -1) || lua_tointeger(L, -1) < 1 || t.dim[tpd] % lua_tointeger(L, -1))
                fe_raise(L, "param: %s: {tp_blocks} must be a count of equal blocks of dim %d (size %lld)", base, tpd + 1,
                         (long long)t.dim[tpd]);
            tpblocks = (int)lua_tointeger(L, -1);
        }
        lua_pop(L, 1);
    }
    const char *name = fe->layer >= 0 && !fe->layer_prefix_off
                           ? lua_pushfstring(L, "%s%d.%s", fe->layer_prefix, fe->layer, base) : base;
    fe_new_name(L, "param", name);
    Attr a[5] = {ir_attr_str(fe->m, "name", name), ir_attr_str(fe->m, "init", init),
                 ir_attr_float(fe->m, "std", std)};
    int na = strcmp(init, "normal") ? 2 : 3;
    if (tpd >= 0) a[na++] = ir_attr_int(fe->m, "tp", tpd);
    if (tpblocks > 1) a[na++] = ir_attr_int(fe->m, "tp_blocks", tpblocks);
    int n = fe_node(L, OP_param, 0, NULL, na, a, &t);
    fe_push(L, ir_out(fe->g, n));
    return 1;
}

/* full(shape, value, dtype="f32") */
static int l_full(lua_State *L)
{
    Type t;
    fe_shape(L, 1, "full", &t, NULL);
    if (lua_type(L, 2) != LUA_TNUMBER)
        fe_raise(L, "full: value must be a number, got %s", luaL_typename(L, 2));
    t.dt = fe_dtype(L, 3, "full");
    fe_push(L, fe_const(L, lua_tonumber(L, 2), &t));
    return 1;
}

/* positions(n): i32[n] = 0..n-1 */
static int l_positions(lua_State *L)
{
    int64_t n = fe_int(L, 1, "positions", "n");
    if (n < 1 || n > INT32_MAX)
        fe_raise(L, "positions: n must be >= 1, got %lld", (long long)n);
    Type t = {.dt = DT_I32, .rank = 1, .dim = {n}};
    fe_push(L, ir_out(fe_of(L)->g, fe_node(L, OP_iota, 0, NULL, 0, NULL, &t)));
    return 1;
}

static const char *const layer_options[] = {"prefix", NULL};

/* layer's {prefix=...}: a string (params "<prefix><i>.<name>", e.g.
 * "model.layers." for Hugging Face Llama names) or false (names as
 * given); absent: "h." (GPT-2's names). */
static void layer_prefix(lua_State *L, Fe *fe)
{
    snprintf(fe->layer_prefix, sizeof fe->layer_prefix, "h.");
    fe->layer_prefix_off = 0;
    if (lua_isnoneornil(L, 3))
        return;
    fe_options(L, 3, "layer", layer_options);
    int t = lua_getfield(L, 3, "prefix");
    if (t == LUA_TBOOLEAN && !lua_toboolean(L, -1))
        fe->layer_prefix_off = 1;
    else if (t == LUA_TSTRING) {
        size_t n;
        const char *s = lua_tolstring(L, -1, &n);
        if (n >= sizeof fe->layer_prefix || strlen(s) != n)
            fe_raise(L, "layer: prefix must be a string of at most %d bytes without NUL", (int)sizeof fe->layer_prefix - 1);
        memcpy(fe->layer_prefix, s, n + 1);
    } else if (t != LUA_TNIL)
        fe_raise(L, "layer: prefix must be a string or false, got %s", luaL_typename(L, -1));
    lua_pop(L, 1);
}

/* layer(i, fn[, {prefix=...}]): run fn with layer i (node metadata; param
 * prefix h.<i>. unless the options say otherwise) */
static int l_layer(lua_State *L)
{
    Fe *fe = fe_of(L);
    int64_t i = fe_int(L, 1, "layer", "the layer index");
    if (i < 0 || i > 1000000)
        fe_raise(L, "layer: index must be >= 0, got %lld", (long long)i);
    if (lua_type(L, 2) != LUA_TFUNCTION)
        fe_raise(L, "layer: the second argument must be a function, got %s", luaL_typename(L, 2));
    if (fe->layer >= 0)
        fe_raise(L, "layer: layer(%lld) inside layer(%d); layers do not nest", (long long)i, fe->layer);
    layer_prefix(L, fe);
    lua_settop(L, 2);
    lua_pushcfunction(L, fe_msgh); /* the traceback is taken before the stack unwinds */
    lua_insert(L, 2);
    fe->layer = (int)i;
    int status = lua_pcall(L, 0, LUA_MULTRET, 2);
    fe->layer = -1;
    if (status != LUA_OK)
        lua_error(L);
    return lua_gettop(L) - 2;
}

/* ----------------------------------------------------------------- config */

typedef struct {
    const char *key;
    size_t off;
} OptKey;

static const OptKey fe_optkeys[] = {
    {"lr", offsetof(Options, lr)},
    {"min_lr", offsetof(Options, min_lr)},
    {"warmup", offsetof(Options, warmup)},
    {"steps", offsetof(Options, steps)},
    {"weight_decay", offsetof(Options, weight_decay)},
    {"beta1", offsetof(Options, beta1)},
    {"beta2", offsetof(Options, beta2)},
    {"eps", offsetof(Options, eps)},
    {"grad_clip", offsetof(Options, grad_clip)},
};
enum { NOPTKEYS = sizeof fe_optkeys / sizeof fe_optkeys[0] };

static const OptKey *fe_optkey(const char *key)
{
    for (int i = 0; i < NOPTKEYS; i++)
        if (strcmp(key, fe_optkeys[i].key) == 0)
            return &fe_optkeys[i];
    return NULL;
}

/* Push a --set value: a number if it reads as one, true/false, else a string. */
static void fe_push_setvalue(lua_State *L, const char *v)
{
    if (strcmp(v, "true") == 0 || strcmp(v, "false") == 0)
        lua_pushboolean(L, v[0] == 't');
    else if (!lua_stringtonumber(L, v))
        lua_pushstring(L, v);
}

/* config{k = v, ...}: the table with --set applied (and remembered). */
static int l_config(lua_State *L)
{
    Fe *fe = fe_of(L);
    if (fe->config_called)
        fe_raise(L, "config: called twice (first at %s:%d)", fe->config_loc.file, fe->config_loc.line);
    if (!lua_istable(L, 1))
        fe_raise(L, "config: needs a table, like config{dim = 64}");
    lua_settop(L, 1);
    fe->config_called = 1;
    fe->config_loc = fe_loc(L);
    for (int i = 0; fe->o && i < fe->o->nsets; i++) {
        const KeyVal *kv = &fe->o->sets[i];
        int old = lua_getfield(L, 1, kv->key);
        if (old == LUA_TNIL && !fe_optkey(kv->key))
            fe_raise(L, "--set %s: the model's config{} has no key %s", kv->key, kv->key);
        if (old == LUA_TSTRING)
            lua_pushstring(L, kv->value);
        else
            fe_push_setvalue(L, kv->value);
        if (old != LUA_TNIL && lua_type(L, -1) != old)
            fe_raise(L, "--set %s=%s: config value %s is a %s", kv->key, kv->value, kv->key, lua_typename(L, old));
        lua_setfield(L, 1, kv->key);
        lua_pop(L, 1);
    }
    lua_pushvalue(L, 1);
    lua_setfield(L, LUA_REGISTRYINDEX, REG_CONFIG);
    return 1;
}

/* After the model ran: --set without config{}, optimizer keys into *o. */
static void fe_apply_config(lua_State *L, Fe *fe)
{
    Options *o = fe->o;
    if (!o)
        return;
    if (!fe->config_called) {
        lua_newtable(L);
        for (int i = 0; i < o->nsets; i++) {
            if (!fe_optkey(o->sets[i].key))
                fe_fail(L, "%s:1: --set %s: the model has no config{}", fe->path, o->sets[i].key);
            fe_push_setvalue(L, o->sets[i].value);
            lua_setfield(L, -2, o->sets[i].key);
        }
    } else {
        lua_getfield(L, LUA_REGISTRYINDEX, REG_CONFIG);
    }
    Loc l = fe->config_called ? fe->config_loc : (Loc){fe->path, 1};
    for (int i = 0; i < NOPTKEYS; i++) {
        int t = lua_getfield(L, -1, fe_optkeys[i].key);
        if (t == LUA_TNUMBER)
            *(double *)((char *)o + fe_optkeys[i].off) = lua_tonumber(L, -1);
        else if (t != LUA_TNIL)
            fe_fail(L, "%s:%d: config: %s must be a number, got %s", l.file, l.line, fe_optkeys[i].key,
                    lua_typename(L, t));
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
}

/* ------------------------------------------------------------ tensor type */

static int l_tensor_index(lua_State *L)
{
    int x = *(int *)luaL_checkudata(L, 1, TENSOR_MT);
    const char *k = lua_tostring(L, 2);
    const Type *t = fe_type(L, x);
    if (k && strcmp(k, "shape") == 0) {
        lua_createtable(L, t->rank, 0);
        for (int i = 0; i < t->rank; i++) {
            lua_pushinteger(L, t->dim[i]);
            lua_rawseti(L, -2, i + 1);
        }
    } else if (k && strcmp(k, "dtype") == 0) {
        lua_pushstring(L, ir_dtype_names[t->dt]);
    } else if (k && strcmp(k, "rank") == 0) {
        lua_pushinteger(L, t->rank);
    } else {
        fe_raise(L, "tensor has no field '%s' (fields: shape, dtype, rank)", k ? k : luaL_typename(L, 2));
    }
    return 1;
}

static int l_tensor_unm(lua_State *L)
{
    int x = fe_tensor(L, 1, "neg");
    fe_push(L, fe_node1(L, OP_neg, 1, &x, 0, NULL));
    return 1;
}

static int l_tensor_tostring(lua_State *L)
{
    char s[96];
    lua_pushfstring(L, "tensor %s", fe_tstr(L, *(int *)luaL_checkudata(L, 1, TENSOR_MT), s, sizeof s));
    return 1;
}

static void fe_open_tensor(lua_State *L)
{
    static const luaL_Reg mt[] = {
        {"__index", l_tensor_index}, {"__add", l_add}, {"__sub", l_sub}, {"__mul", l_mul},
        {"__div", l_div}, {"__unm", l_tensor_unm}, {"__pow", l_pow}, {"__tostring", l_tensor_tostring}, {NULL, NULL},
    };
    luaL_newmetatable(L, TENSOR_MT);
    luaL_setfuncs(L, mt, 0);
    lua_pushliteral(L, "tensor");
    lua_setfield(L, -2, "__metatable"); /* models cannot reach the metatable */
    lua_pop(L, 1);
}

/* ------------------------------------------------------------ the sandbox */

static void fe_open_dsl(lua_State *L)
{
    static const luaL_Reg fns[] = {
        {"config", l_config}, {"input", l_input}, {"param", l_param}, {"normal", l_normal},
        {"full", l_full}, {"positions", l_positions}, {"matmul", l_matmul},
        {"reshape", l_reshape}, {"transpose", l_transpose}, {"slice", l_slice},
        {"concat", l_concat}, {"broadcast", l_broadcast}, {"cast", l_cast},
        {"layernorm", l_layernorm}, {"rmsnorm", l_rmsnorm}, {"rope", l_rope},
        {"attention", l_attention}, {"dropout", l_dropout}, {"loss", l_loss}, {"output", l_output}, {"layer", l_layer},
        {"require", l_require}, {"print", l_print}, {"pow", l_pow}, {"where", l_where}, {NULL, NULL},
    };
    static const struct {
        const char *name;
        lua_CFunction fn;
        Op op;
    } ops[] = {
        {"add", l_binary, OP_add}, {"sub", l_binary, OP_sub}, {"mul", l_binary, OP_mul},
        {"div", l_binary, OP_div}, {"neg", l_unary, OP_neg}, {"exp", l_unary, OP_exp},
        {"log", l_unary, OP_log}, {"sqrt", l_unary, OP_sqrt}, {"rsqrt", l_unary, OP_rsqrt},
        {"tanh", l_unary, OP_tanh}, {"gelu", l_unary, OP_gelu}, {"silu", l_unary, OP_silu},
        {"relu", l_unary, OP_relu}, {"softmax", l_unary, OP_softmax}, {"sum", l_reduce, OP_sum},
        {"mean", l_reduce, OP_mean}, {"max", l_reduce, OP_max}, {"embedding", l_pair, OP_embedding},
        {"cross_entropy", l_pair, OP_cross_entropy},
        /* issue 17 */
        {"sigmoid", l_unary, OP_sigmoid}, {"abs", l_unary, OP_abs}, {"minimum", l_binary, OP_minimum},
        {"maximum", l_binary, OP_maximum},
    };
    lua_pushglobaltable(L);
    luaL_setfuncs(L, fns, 0);
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
        lua_pushinteger(L, ops[i].op);
        lua_pushcclosure(L, ops[i].fn, 1);
        lua_setfield(L, -2, ops[i].name);
    }
    static const char *const fills[] = {"zeros", "ones"};
    for (int i = 0; i < 2; i++) {
        lua_pushstring(L, fills[i]);
        lua_pushcclosure(L, l_filled, 1);
        lua_setfield(L, -2, fills[i]);
    }
    lua_pop(L, 1);
    static const char *const regs[] = {REG_PARAMS, REG_LOADED};
    for (int i = 0; i < 2; i++) {
        lua_newtable(L);
        lua_setfield(L, LUA_REGISTRYINDEX, regs[i]);
    }
    fe_open_tensor(L);
}

/* ---- closing the loops that run in C, out of the instruction hook's sight ----
 * The count hook only fires between Lua instructions, and Lua runs __gc
 * finalizers with hooks off.  So: no finalizers, no pattern matching
 * (backtracking is exponential), and bounds on the library loops whose trip
 * count is not bounded by memory: string.rep of empty pieces, table.move over
 * absent keys, table.insert/remove on a __len proxy or a sparse table whose
 * border #t is huge. */
#define FE_MAX_LOOP ((lua_Integer)1 << 24)

/* Call the wrapped library function (upvalue 1) with our arguments. */
static int fe_call_orig(lua_State *L)
{
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
    return lua_gettop(L);
}

static int l_setmetatable(lua_State *L)
{
    if (lua_type(L, 2) == LUA_TTABLE && lua_getfield(L, 2, "__gc") != LUA_TNIL)
        fe_raise(L, "setmetatable: __gc finalizers are not allowed in models (they run outside the instruction limit)");
    lua_settop(L, 2);
    return fe_call_orig(L);
}

static int l_no_patterns(lua_State *L)
{
    fe_raise(L, "string.%s: pattern matching is not available in models (it runs outside the instruction limit)",
             lua_tostring(L, lua_upvalueindex(1)));
}

static int l_rep(lua_State *L)
{
    size_t l = 0, lsep = 0;
    if (lua_type(L, 1) == LUA_TSTRING)
        lua_tolstring(L, 1, &l);
    if (lua_type(L, 3) == LUA_TSTRING)
        lua_tolstring(L, 3, &lsep);
    int sep_ok = lua_type(L, 3) <= LUA_TNIL || lua_type(L, 3) == LUA_TSTRING;
    if (lua_type(L, 1) == LUA_TSTRING && lua_type(L, 2) == LUA_TNUMBER && sep_ok && l + lsep == 0) {
        lua_pushliteral(L, "");
        return 1;
    }
    return fe_call_orig(L);
}

static int l_move(lua_State *L)
{
    lua_Integer f = lua_tointeger(L, 2), e = lua_tointeger(L, 3);
    if (e >= f && (lua_Unsigned)e - (lua_Unsigned)f >= (lua_Unsigned)FE_MAX_LOOP)
        fe_raise(L, "table.move: more than %lld elements", (long long)FE_MAX_LOOP);
    return fe_call_orig(L);
}

/* table.insert / table.remove */
static int l_shift(lua_State *L)
{
    if (lua_type(L, 1) == LUA_TTABLE) {
        if (luaL_getmetafield(L, 1, "__len") != LUA_TNIL)
            fe_raise(L, "table.insert/remove: tables with a __len metamethod are not supported");
        if (lua_rawlen(L, 1) > (lua_Unsigned)FE_MAX_LOOP)
            fe_raise(L, "table.insert/remove: table longer than %lld", (long long)FE_MAX_LOOP);
    }
    return fe_call_orig(L);
}

/* Replace lib[name] (lib NULL: a global) by fn wrapping the original. */
static void fe_wrap(lua_State *L, const char *lib, const char *name, lua_CFunction fn)
{
    if (lib)
        lua_getglobal(L, lib);
    else
        lua_pushglobaltable(L);
    lua_getfield(L, -1, name);
    lua_pushcclosure(L, fn, 1);
    lua_setfield(L, -2, name);
    lua_pop(L, 1);
}

static void fe_harden(lua_State *L)
{
    fe_wrap(L, NULL, "setmetatable", l_setmetatable);
    fe_wrap(L, "string", "rep", l_rep);
    fe_wrap(L, "table", "move", l_move);
    fe_wrap(L, "table", "insert", l_shift);
    fe_wrap(L, "table", "remove", l_shift);
    static const char *const patterns[] = {"find", "match", "gmatch", "gsub"};
    lua_getglobal(L, "string");
    for (int i = 0; i < 4; i++) {
        lua_pushstring(L, patterns[i]);
        lua_pushcclosure(L, l_no_patterns, 1);
        lua_setfield(L, -2, patterns[i]);
    }
    lua_pop(L, 1);
}

static void fe_open_libs(lua_State *L)
{
    static const luaL_Reg libs[] = {
        {LUA_GNAME, luaopen_base}, {LUA_TABLIBNAME, luaopen_table}, {LUA_STRLIBNAME, luaopen_string},
        {LUA_MATHLIBNAME, luaopen_math}, {LUA_UTF8LIBNAME, luaopen_utf8},
    };
    for (size_t i = 0; i < sizeof libs / sizeof libs[0]; i++) {
        luaL_requiref(L, libs[i].name, libs[i].func, 1);
        lua_pop(L, 1);
    }
    static const char *const banned[] = {"dofile", "loadfile", "load", "loadstring"};
    for (size_t i = 0; i < sizeof banned / sizeof banned[0]; i++) {
        lua_pushnil(L);
        lua_setglobal(L, banned[i]);
    }
    fe_harden(L);
}

/* Everything that runs inside the protected call. */
static int fe_run(lua_State *L)
{
    Fe *fe = fe_of(L);
    fe_open_libs(L);
    fe_open_dsl(L);
    if (fe_loadfile(L, fe->path) != LUA_OK)
        lua_error(L);
    lua_sethook(L, fe_hook, LUA_MASKCOUNT, FE_HOOK_EVERY);
    lua_call(L, 0, 0);
    if (!fe->nloss)
        fe_fail(L, "%s:%d: the model has no loss(x)", fe->path, fe->nlines);
    fe_apply_config(L, fe);
    return 0;
}

/* ------------------------------------------------------------------ entry */

/* Lua writes a chunk name longer than LUA_IDSIZE as "...tail": the loaded
 * file that ends in tail (tail's length in *n), or NULL. */
static const char *fe_unshorten(Fe *fe, const char *tail, size_t *n)
{
    for (int i = 0; i < fe->nfiles; i++)
        for (const char *s = fe->files[i]; *s; s++) {
            *n = strlen(s);
            if (strncmp(tail, s, *n) == 0 && tail[*n] == ':')
                return fe->files[i];
        }
    return NULL;
}

/* msg into err as one line, with chunk names made whole. */
static void fe_message(Fe *fe, const char *msg, char *err, size_t errlen)
{
    size_t n;
    const char *full = strncmp(msg, "...", 3) == 0 ? fe_unshorten(fe, msg + 3, &n) : NULL;
    if (full)
        snprintf(err, errlen, "%s%s", full, msg + 3 + n);
    else
        snprintf(err, errlen, "%s", msg);
    for (char *c = err; *c; c++)
        if (*c == '\n' || *c == '\r' || *c == '\t')
            *c = ' ';
}

/* The one line fe_load returns for a failed run. */
static void fe_report(Fe *fe, int status, const char *msg, char *err, size_t errlen)
{
    char buf[8192];
    const char *file = fe->lastfile[0] ? fe->lastfile : fe->path;
    int line = fe->lastfile[0] ? fe->lastline : 1;
    if (status == LUA_ERRMEM || (fe->memfail && (status == LUA_ERRERR || !msg || strstr(msg, "not enough memory")))) {
        if (fe->oomfile[0]) {
            file = fe->oomfile;
            line = fe->oomline;
        }
        snprintf(buf, sizeof buf, "%s:%d: memory limit (%d MiB) exceeded", file, line, (int)(FE_MEM_CAP >> 20));
    } else if (!msg || !fe_has_loc(msg)) { /* error in error handling, C stack overflow, ... */
        snprintf(buf, sizeof buf, "%s:%d: %s", file, line, msg ? msg : "error");
    } else {
        snprintf(buf, sizeof buf, "%s", msg);
    }
    fe_message(fe, buf, err, errlen);
}

static int fe_count_lines(const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "%s:1: cannot open the model: %s", path, strerror(errno));
        return -1;
    }
    int n = 1, c, last = '\n';
    while ((c = getc(f)) != EOF) {
        n += c == '\n';
        last = c;
    }
    fclose(f);
    return last == '\n' && n > 1 ? n - 1 : n;
}

static Module *fe_new_module(const char *path)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    size_t n = strlen(base);
    if (n > 4 && strcmp(base + n - 4, ".lua") == 0)
        n -= 4;
    char name[256];
    snprintf(name, sizeof name, "%.*s", (int)n, base);
    Module *m = ir_module_new(name);
    m->name = ir_intern(m, name);
    return m;
}

/* Arm the wall-clock limit for state L (one front end at a time). */
static void fe_alarm_start(Fe *fe, lua_State *L, struct sigaction *old)
{
    struct sigaction sa = {.sa_handler = fe_on_alarm};
    sigemptyset(&sa.sa_mask);
    fe_alarm_fired = 0;
    fe_alarm_L = L;
    sigaction(SIGALRM, &sa, old);
    double s = fe->timeout;
    struct itimerval t = {.it_value = {(time_t)s, (suseconds_t)((s - (double)(time_t)s) * 1e6)}};
    if (t.it_value.tv_sec == 0 && t.it_value.tv_usec == 0)
        t.it_value.tv_usec = 1;
    setitimer(ITIMER_REAL, &t, NULL);
}

static void fe_alarm_stop(const struct sigaction *old)
{
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    fe_alarm_L = NULL;
    sigaction(SIGALRM, old, NULL);
}

Module *fe_load(const char *path, Options *o, char *err, size_t errlen)
{
    Fe fe = {.path = path, .o = o, .layer = -1, .dropout_step = -1,
             .timeout = o && o->frontend_timeout > 0 ? o->frontend_timeout : 10};
    if ((fe.nlines = fe_count_lines(path, err, errlen)) < 0)
        return NULL;
    fe.m = fe_new_module(path);
    fe.g = fe.m->stages[0];
    fe.path = ir_intern(fe.m, path);
    lua_State *L = lua_newstate(fe_alloc, &fe);
    if (!L) {
        snprintf(err, errlen, "%s:1: cannot create the Lua state", path);
        ir_free(fe.m);
        return NULL;
    }
    fe.L = L;
    *(Fe **)lua_getextraspace(L) = &fe;
    lua_pushcfunction(L, fe_msgh);
    lua_pushcfunction(L, fe_run);
    struct sigaction old;
    fe_alarm_start(&fe, L, &old);
    int status = lua_pcall(L, 0, 0, 1);
    fe_alarm_stop(&old);
    if (status != LUA_OK) {
        fe_report(&fe, status, lua_tostring(L, -1), err, errlen);
        ir_free(fe.m);
        fe.m = NULL;
    }
    lua_close(L);
    return fe.m;
}
