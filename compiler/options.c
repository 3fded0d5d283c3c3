/* options.c — default values of Options; the model's config{} and the command
 * line override them (front_lua.c, main.c). */
#include <string.h>

#include "ir.h"
#include "options.h"

void opt_defaults(Options *o) {
    memset(o, 0, sizeof *o);
    o->pp = o->dp = o->cp = o->tp = 1;
    o->lr = 3e-4;
    o->min_lr = 0.0; /* cosine decays to 0 unless the model asks for a floor */
    o->warmup = 0;
    o->steps = 1000;
    o->weight_decay = 0.1;
    o->beta1 = 0.9;
    o->beta2 = 0.95;
    o->eps = 1e-8;
    o->grad_clip = 1.0;
    o->seed = 1337;
    o->micro_batches = 1;
    o->zero = 1;
    o->bucket_mb = 25;
    o->recompute = RC_GEMM_LAST;
    o->frontend_timeout = 10;
}
