/* fsutil.h — small helpers the runtime's file writers share. */
#ifndef KILN_FSUTIL_H
#define KILN_FSUTIL_H
/* Format a one-line message into err; returns -1 (for `return rt_errf(...)`). */
int rt_errf(char *err, int errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* fsync the directory holding path, so a rename into it is durable.  0 or -1 (errno set). */
int rt_fsync_dir_of(const char *path);
#endif
