/* trainer_main.c — main() of a trainer built by `kiln compile`: the
 * generated object defines kiln_program; everything else is the runtime. */
#include "trainer.h"

extern const rt_program kiln_program;

int main(int argc, char **argv) { return rt_train_main(&kiln_program, argc, argv, kiln_program.steps > 0 ? kiln_program.steps : 100); }
