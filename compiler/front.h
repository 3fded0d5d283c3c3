/* front.h — the Lua front end (front_lua.c): a model file to its forward graph. */
#ifndef KILN_FRONT_H
#define KILN_FRONT_H

#include <stddef.h>

#include "ir.h"
#include "options.h"

/* Run the model file in the Lua sandbox and build its forward graph.  On a
 * user error returns NULL with one line "file:line: message" in err.  The
 * model's final config{} values (after --set) that name optimizer settings
 * (lr, min_lr, warmup, steps, weight_decay, beta1, beta2, eps, grad_clip) are
 * written into *o unless the command line gave them. */
Module *fe_load(const char *path, Options *o, char *err, size_t errlen);

#endif
