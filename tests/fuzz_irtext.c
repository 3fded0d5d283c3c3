/* fuzz_irtext.c — libFuzzer target for the IR text parser (`make fuzz`).
 *
 * Any input must be parsed or rejected with one line "name:line: message",
 * never crash, hang or leak.  Whatever parses must also verify without
 * crashing (the verdict does not matter: `?:0` locations parse but do not
 * verify) and survive the round trip: dump, parse again, and the two modules
 * are ir_module_equal and the two dumps byte-identical.  The commands' reader,
 * ir_parse_file (NUL bytes, the verifier with .ir lines, the passes a command
 * needs), holds to the same one-line rule.  Seeds: tests/fuzz-seeds.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"

static char *dump(const Module *m, size_t *n) {
    char *buf = NULL;
    FILE *f = open_memstream(&buf, n);
    if (!f) abort();
    ir_dump(m, f);
    fclose(f);
    return buf;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1), err[512];
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = 0;
    Module *mf = ir_parse_file(text, size, "fuzz.ir", "memplan", err, sizeof err);
    if (!mf && (strncmp(err, "fuzz.ir", 7) != 0 || strchr(err, '\n'))) {
        fprintf(stderr, "bad error message from ir_parse_file: %s\n", err);
        abort();
    }
    ir_free(mf);
    Module *m = ir_parse(text, "fuzz.ir", err, sizeof err);
    free(text);
    if (!m) {
        if (strncmp(err, "fuzz.ir:", 8) != 0 || strchr(err, '\n')) {
            fprintf(stderr, "bad error message: %s\n", err);
            abort();
        }
        return 0;
    }
    ir_verify_module(m, err, sizeof err);
    size_t n1, n2;
    char *d1 = dump(m, &n1);
    Module *m2 = ir_parse(d1, "redump.ir", err, sizeof err);
    if (!m2) {
        fprintf(stderr, "the dump does not parse: %s\n%s", err, d1);
        abort();
    }
    if (!ir_module_equal(m, m2)) {
        fprintf(stderr, "parse(dump(m)) != m:\n%s", d1);
        abort();
    }
    char *d2 = dump(m2, &n2);
    if (n1 != n2 || memcmp(d1, d2, n1) != 0) {
        fprintf(stderr, "the re-dump differs:\n%s---\n%s", d1, d2);
        abort();
    }
    FILE *null = fopen("/dev/null", "w");
    if (null) {
        ir_dump_dot(m, null);
        fclose(null);
    }
    free(d1);
    free(d2);
    ir_free(m);
    ir_free(m2);
    return 0;
}
