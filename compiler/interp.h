/* interp.h — the reference interpreter (interp.c): runs any module, all mesh
 * ranks in one process, in f32 or f64. */
#ifndef KILN_INTERP_H
#define KILN_INTERP_H

#include <stddef.h>
#include <stdint.h>

#include "ir.h"

typedef struct {
    Type t;
    int64_t n;  /* element count */
    double *d;  /* values; f32 mode rounds every result through float */
} Tensor;

typedef struct Interp Interp;
/* f64 = 0: f32 semantics (every op result rounded to float); 1: f64. */
Interp *interp_new(const Module *m, int f64);
void interp_free(Interp *it);
/* Params from their init attrs (normal(std) from a generator seeded by
 * hash(name) ^ seed, identical on every rank), states zero. */
void interp_init_state(Interp *it, uint64_t seed);
/* Persistent tensor (param or state) `name` of a rank; NULL if none.
 * Writable: tests perturb parameters through it. */
Tensor *interp_state(Interp *it, int rank, const char *name);
/* Copy n values into input `name` of rank; -1 if no such input or n differs. */
int interp_set_input(Interp *it, int rank, const char *name, const double *data, int64_t n);
/* Execute one step on every rank.  0, or -1 with a message (e.g. a token id
 * out of range, a deadlock in send/recv) in err. */
int interp_run(Interp *it, char *err, size_t errlen);
/* After a run: output `name` of rank, or the value with id vid. NULL if none. */
const Tensor *interp_output(const Interp *it, int rank, const char *name);
const Tensor *interp_value(const Interp *it, int rank, int vid);

#endif
