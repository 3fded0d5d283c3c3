/* json.h — reading kiln's JSON inputs with jansson (Debian's libjansson).
 *
 * Three readers use it: the safetensors header (safetensors.c), GPT-2's
 * encoder.json (bpe.c) and `kiln plot`'s JSONL logs (compiler/cmd/plot.c).
 * jansson does the parsing; this file puts its errors in kiln's words, so a
 * malformed file still gives the one line the readers always gave: where
 * (a byte offset), what is wrong, and the key a value belongs to. */
#ifndef KILN_JSON_H
#define KILN_JSON_H
#include <jansson.h>
#include <stddef.h>

typedef struct {
    int byte;       /* offset of the error in the text */
    int at_value;   /* 1: the error is where the value of `key` belongs */
    char what[160]; /* what is wrong */
    char near[80];  /* jansson's " near '<token>'" or " near end of file", or "" */
    char key[48];   /* the last string before the error (raw, cut to fit) */
} RtJsonError;

/* Parses the JSON object or array at the start of text[0..n) with jansson
 * (flags: jansson's, e.g. JSON_REJECT_DUPLICATES); *used is the number of
 * bytes it took, so the caller decides what may follow.  NULL on a syntax
 * error, *e then says what and where. */
json_t *rt_json_load(const char *text, size_t n, size_t flags, size_t *used, RtJsonError *e);

/* 1 when s[0..n) is only JSON blanks (space, tab, CR, LF). */
int rt_json_blank(const char *s, size_t n);

/* What a value is, for messages: "'{'", "'['", "a string", "a number",
 * "true", "false" or "null". */
const char *rt_json_kind(const json_t *v);
#endif
