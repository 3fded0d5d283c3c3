/* fsutil.c — see fsutil.h. */
#include "fsutil.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <libgen.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int rt_errf(char *err, int errlen, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, (size_t)errlen, fmt, ap);
    va_end(ap);
    return -1;
}

int rt_fsync_dir_of(const char *path) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    int dfd = open(dirname(dir), O_RDONLY | O_DIRECTORY);
    if (dfd < 0) return -1;
    int rc = fsync(dfd);
    close(dfd);
    return rc;
}

/* What a file that is not regular is, for messages. */
static const char *kind(mode_t m) {
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISDIR(m)) return "a directory";
    if (S_ISSOCK(m)) return "a socket";
    return "not a regular file";
}

int rt_open_input(const char *flag, const char *path, char *err, int errlen) {
    const char *f = flag ? flag : "", *sep = flag ? ": " : "";
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return rt_errf(err, errlen, "%s%s%s: cannot open: %s", f, sep, path, strerror(errno));
    struct stat st;
    int fl = -1;
    if (fstat(fd, &st) != 0) rt_errf(err, errlen, "%s%s%s: cannot stat: %s", f, sep, path, strerror(errno));
    else if (!S_ISREG(st.st_mode))
        rt_errf(err, errlen, "%s%s%s is %s, not a regular file; not reading it", f, sep, path, kind(st.st_mode));
    else if ((fl = fcntl(fd, F_GETFL)) < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0)
        rt_errf(err, errlen, "%s%s%s: %s", f, sep, path, strerror(errno)), fl = -1;
    if (fl >= 0) return fd;
    close(fd);
    return -1;
}

int rt_check_input(const char *flag, const char *path, char *err, int errlen) {
    struct stat st;
    if (stat(path, &st) != 0 || S_ISREG(st.st_mode)) return 0;
    return rt_errf(err, errlen, "%s: %s is %s, not a regular file; not reading it", flag, path, kind(st.st_mode));
}

static int same_file(const struct stat *a, const char *path) {
    struct stat b;
    return stat(path, &b) == 0 && a->st_dev == b.st_dev && a->st_ino == b.st_ino;
}

/* The file of input `in` (itself, or a file its pattern matches) that is
 * the file `out`, copied into buf; 0 when none is. */
static int input_clash(const struct stat *out, const RtPath *in, char *buf, size_t len) {
    if (same_file(out, in->path)) return snprintf(buf, len, "%s", in->path), 1;
    glob_t g;
    int hit = 0;
    if (glob(in->path, 0, NULL, &g) != 0) return 0;
    for (size_t i = 0; i < g.gl_pathc && !hit; i++)
        if (same_file(out, g.gl_pathv[i])) hit = 1, snprintf(buf, len, "%s", g.gl_pathv[i]);
    globfree(&g);
    return hit;
}

int rt_check_output(const char *flag, const char *path, const RtPath *inputs, int n, char *err, int errlen) {
    struct stat st;
    /* absent: nothing to destroy; a directory cannot be written over (the writer's open or rename fails and says so) */
    if (stat(path, &st) != 0 || S_ISDIR(st.st_mode)) return 0;
    if (!S_ISREG(st.st_mode))
        return rt_errf(err, errlen, "%s: %s is %s, not a regular file; not writing over it", flag, path, kind(st.st_mode));
    char hit[4096];
    for (int i = 0; i < n; i++)
        if (inputs[i].path && input_clash(&st, &inputs[i], hit, sizeof hit))
            return rt_errf(err, errlen, "%s: %s is the same file as %s %s; not writing over it", flag, path, inputs[i].flag, hit);
    return 0;
}
