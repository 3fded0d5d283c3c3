/* data_cmd.h — `kiln data`: text files to llm.c token shards. */
#ifndef KILN_DATA_CMD_H
#define KILN_DATA_CMD_H
/* argv[0] is "data" (or the program name); returns the exit code. */
int kiln_data_main(int argc, char **argv);
#endif
