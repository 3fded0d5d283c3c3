/* json.c — see json.h.
 *
 * jansson reports a syntax error as "<message> near '<token>'" with the
 * byte offset where it stopped.  rt_json_load keeps the offset and the
 * token and says the message the way kiln's own parsers said it before
 * jansson replaced them ("'}' expected" is "expected ',' or '}'", a lone
 * "0" before a digit is a leading zero, ...): users and tests know those
 * words.  A message with no translation is passed on as jansson wrote it.
 * For an error where a value belongs, the key before it is found by
 * scanning the text's strings up to the error, since jansson names only
 * the token it stopped at.
 */
#include "json.h"

#include <stdio.h>
#include <string.h>

static const struct {
    const char *jansson, *kiln;
} PHRASES[] = {
    {"'}' expected", "expected ',' or '}'"},
    {"']' expected", "expected ',' or ']'"},
    {"':' expected", "expected ':' after a key"},
    {"string or '}' expected", "expected a key or '}'"},
    {"'[' or '{' expected", "expected '{' or '['"},
    {"control character", "control character in a string"},
    {"premature end of input", "unterminated string"},
    {"invalid escape", "malformed JSON string (bad escape)"},
    {"invalid Unicode", "malformed JSON string (bad \\u escape)"},
    {"\\u0000 is not allowed", "malformed JSON string (\\u0000)"},
    {"unable to decode byte", "invalid UTF-8"},
    {"too big integer", "number too large"},
    {"real number overflow", "number too large"},
    {"duplicate object key", "key appears twice"},
    {"unexpected token", "bad value"},
};

int rt_json_blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n') return 0;
    return 1;
}

const char *rt_json_kind(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "'{'";
    case JSON_ARRAY: return "'['";
    case JSON_STRING: return "a string";
    case JSON_INTEGER:
    case JSON_REAL: return "a number";
    case JSON_TRUE: return "true";
    case JSON_FALSE: return "false";
    default: return "null";
    }
}

/* An invalid token: jansson's lexer stops on a bad number or a bad word. */
static const char *invalid_token(const char *tok) {
    if (strcmp(tok, "0") == 0 || strcmp(tok, "-0") == 0) return "expected ',' or '}' after a 0 (JSON numbers have no leading zeros)";
    return (*tok >= '0' && *tok <= '9') || *tok == '-' ? "bad number" : "bad value";
}

/* The last string that starts before text[at], raw, into key. */
static void last_string(const char *text, size_t at, char *key, size_t keylen) {
    const char *s = NULL;
    size_t n = 0;
    for (size_t i = 0; i < at; i++) {
        if (text[i] != '"') continue;
        size_t j = i + 1;
        while (j < at && text[j] != '"') j += text[j] == '\\' ? 2 : 1;
        s = text + i + 1, n = (j < at ? j : at) - (i + 1);
        i = j;
    }
    snprintf(key, keylen, "%.*s", s ? (int)n : 0, s ? s : "");
}

/* e->what and e->at_value from jansson's message; the token it names into tok. */
static void describe(const json_error_t *je, RtJsonError *e, char *tok, size_t toklen) {
    const char *near = strstr(je->text, " near ");
    size_t head = near ? (size_t)(near - je->text) : strlen(je->text);
    *tok = 0;
    if (near && near[6] == '\'') snprintf(tok, toklen, "%.*s", (int)strlen(near + 7) - 1, near + 7);
    const char *kiln = NULL;
    for (size_t i = 0; i < sizeof PHRASES / sizeof *PHRASES && !kiln; i++)
        if (strncmp(je->text, PHRASES[i].jansson, strlen(PHRASES[i].jansson)) == 0) kiln = PHRASES[i].kiln;
    if (strncmp(je->text, "invalid token", 13) == 0) kiln = invalid_token(tok);
    e->at_value = strncmp(je->text, "':' expected", 12) == 0 || strncmp(je->text, "unexpected token", 16) == 0 ||
                  strncmp(je->text, "invalid token", 13) == 0;
    snprintf(e->what, sizeof e->what, "%.*s", kiln ? (int)strlen(kiln) : (int)head, kiln ? kiln : je->text);
    snprintf(e->near, sizeof e->near, "%s", near ? near : "");
}

json_t *rt_json_load(const char *text, size_t n, size_t flags, size_t *used, RtJsonError *e) {
    json_error_t je;
    json_t *v = json_loadb(text, n, flags | JSON_DISABLE_EOF_CHECK, &je);
    memset(e, 0, sizeof *e);
    if (v) {
        *used = (size_t)je.position;
        return v;
    }
    char tok[64];
    e->byte = je.position;
    describe(&je, e, tok, sizeof tok);
    size_t at = (size_t)je.position < n ? (size_t)je.position : n; /* the key: before the token */
    last_string(text, at > strlen(tok) ? at - strlen(tok) : 0, e->key, sizeof e->key);
    return NULL;
}
