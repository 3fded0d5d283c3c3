/* memplan.h — what the memory plan tells `kiln plan` and the tests.
 *
 * pass_memplan (passes.h) gives every value that needs a buffer a Value.space
 * (a Space of ir.h) and an IR_MEM_ALIGN-aligned Value.offset; values internal
 * to a fused group keep -1.  Which values need a buffer, and for how long, is
 * the IR's liveness (live.h), which the verifier checks the plan with.  This
 * header is the plan's own: its sizes, its lower bound and its report.
 */
#ifndef KILN_MEMPLAN_H
#define KILN_MEMPLAN_H

#include <stdio.h>

#include "ir.h"
#include "options.h"

/* Bytes of a space per rank (max over stages): the end of its last buffer,
 * rounded up to IR_MEM_ALIGN. */
int64_t memplan_peak(const Module *m, int space);
/* The same for one stage's program (kiln plan --pp: per pipeline stage). */
int64_t memplan_stage_peak(const Graph *g, int space);
/* What pass_memplan would make of one stage's program, without planning it
 * (g is not changed: an analysis, schedule.c's memory rule calls it on
 * candidate orders): the device bytes per rank, params + grads + optimizer
 * state + activations, the sum of memplan_stage_peak over those spaces
 * after pass_memplan. */
int64_t memplan_stage_total(const Graph *g);
/* The best any placement could do for ACT: the largest sum of live ACT
 * buffer bytes at one position (max over stages). */
int64_t memplan_lower_bound(const Module *m);
/* The same bound over the model's activations alone: values computed in
 * forward or backward from the data, not gradients, gathered params or
 * optimizer values (what sequence length, recompute and cp change). */
int64_t memplan_fwd_bwd_peak(const Module *m);
/* Peak memory per rank: params, grads, optimizer state, activations (and
 * the phase where they peak), workspace. */
void memplan_report(const Module *m, FILE *f);
/* What sets the activation arena's peak (kiln plan --peak): the position
 * where the most act bytes are live (its phase, op and model line) and the
 * buffers live there, largest first, each with its producer's line and why
 * it is still live (written there, or its last reader and where). */
void memplan_peak_report(const Module *m, FILE *f);

/* The host space's bound (--offload): the largest sum of live host
 * buffer bytes at one position of g (a host buffer lives from its offload
 * until the d2h stream knows its reload done, live.c). */
int64_t memplan_host_bound(const Graph *g);
/* The host capacity check (docs/decisions.md): when the offload pass used a
 * device profile (--offload auto, or --device-profile) that gives
 * host_memory_bytes, a rank whose host space exceeds it: -1 with one line
 * in err; else 0.  kiln compile and run refuse; kiln plan warns. */
int memplan_host_check(const Module *m, const Options *o, char *err, size_t n);

#endif
