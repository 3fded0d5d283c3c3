/* fsutil.h — small helpers the runtime's file readers and writers share,
 * and the one check every command and the trainer run on the files they
 * are given.
 *
 * Inputs and outputs that are not plain files.  kiln reads its inputs (a
 * model, data shards, checkpoints, --init weights, BPE files, logs) to the
 * end and writes its outputs either in place (--log, --trace, kiln dump -o)
 * or to a temporary file renamed over the name (checkpoints, kiln plot -o,
 * kiln data's shards, --export).  Neither is safe on anything but a regular
 * file: reading a FIFO blocks until a writer comes (open itself blocks),
 * reading /dev/zero never ends, and renaming over /dev/null as root
 * replaces the machine's /dev/null with a file.  So an input must be a
 * regular file (rt_open_input, rt_check_input), and an output must be
 * absent or a regular file (rt_check_output); symlinks are followed, so a
 * symlink to a FIFO or a device is refused like the thing itself.
 *
 * An output over an input.  Writing the log over the data shard it trains
 * on, or a plot over the log it draws, destroys the input.  rt_check_output
 * takes the inputs of the command and refuses an output that is the same
 * file as any of them: the same st_dev and st_ino, so a second name for the
 * file (a symlink, a hard link, "./x" for "x") is caught too.  An input is a
 * path or a glob pattern (--data takes globs); every file it matches counts.
 * The commands and the generated trainer call the same functions: this file
 * is in the runtime, which the compiler links. */
#ifndef KILN_FSUTIL_H
#define KILN_FSUTIL_H
/* Format a one-line message into err; returns -1 (for `return rt_errf(...)`). */
int rt_errf(char *err, int errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* fsync the directory holding path, so a rename into it is durable.  0 or -1 (errno set). */
int rt_fsync_dir_of(const char *path);

/* A file a command was given: the flag that named it ("--data", "MODEL")
 * and its path, or a glob pattern. */
typedef struct {
    const char *flag, *path;
} RtPath;

/* Open path read-only; it must be a regular file (a FIFO cannot block the
 * open: it is opened non-blocking, then checked).  The descriptor, or -1
 * with "FLAG: PATH: why" in err ("PATH: why" when flag is NULL). */
int rt_open_input(const char *flag, const char *path, char *err, int errlen);
/* 0 when path is absent (its reader reports that) or a regular file; -1
 * with "FLAG: PATH is a FIFO ..." in err otherwise. */
int rt_check_input(const char *flag, const char *path, char *err, int errlen);
/* 0 when path may be written as output `flag`: absent, or a regular file
 * that is not one of the n files `inputs` (nor what their patterns match),
 * or a directory (nothing writes over one: the writer's own error says so).
 * -1 with one line in err naming flag, path and, for a clash, the input. */
int rt_check_output(const char *flag, const char *path, const RtPath *inputs, int n, char *err, int errlen);
#endif
