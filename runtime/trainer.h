/* trainer.h — the training loop shared by generated binaries and `kiln run`. */
#ifndef KILN_TRAINER_H
#define KILN_TRAINER_H
#include "kiln_rt.h"
/* Parse the trainer's flags (argv[0] is the program name), train, return the
 * exit code.  default_steps: steps when --steps is not given. */
int rt_train_main(const rt_program *p, int argc, char **argv, int default_steps);
#endif
