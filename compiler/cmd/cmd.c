/* cmd.c — the commands' one way to fail and the helpers they share (cmd.h). */
#include "cmd.h"
#include "memplan.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *error_prefix = "kiln: ";

void cmd_set_prefix(const char *prefix) { error_prefix = prefix; }

static void verror(const char *fmt, va_list ap) {
    fputs(error_prefix, stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
}

int cmd_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    verror(fmt, ap);
    va_end(ap);
    return 1;
}

void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    verror(fmt, ap);
    va_end(ap);
    exit(1);
}

void cmd_check_output(const char *flag, const char *path, const RtPath *inputs, int n) {
    char err[1024];
    if (path && rt_check_output(flag, path, inputs, n, err, sizeof err) != 0) die("%s", err);
}

void cmd_check_input(const char *flag, const char *path) {
    char err[1024];
    if (path && rt_check_input(flag, path, err, sizeof err) != 0) die("%s", err);
}

Module *cmd_compile_checked(Args *a) {
    Module *m = compile(a);
    char err[1024];
    if (opt_check(&a->o, err, sizeof err) != 0) die("%s", err);
    if (memplan_host_check(m, &a->o, err, sizeof err) != 0) die("%s", err); /* offload's host space vs the profile's host memory */
    return m;
}

void cmd_add_set(KeyVal **sets, int *nsets, const char *key, const char *value) {
    *sets = realloc(*sets, sizeof(KeyVal) * (size_t)(*nsets + 1));
    if (!*sets) die("out of memory");
    (*sets)[(*nsets)++] = (KeyVal){key, value};
}

void cmd_exe_dir(char *buf, size_t n) {
    ssize_t k = readlink("/proc/self/exe", buf, n - 1);
    if (k <= 0) die("cannot find the kiln binary (/proc/self/exe)");
    buf[k] = 0;
    char *slash = strrchr(buf, '/');
    if (slash) *slash = 0;
}

double cmd_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void cmd_interp_run(Interp *it) {
    char err[1024];
    if (interp_run(it, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        exit(1);
    }
}

double cmd_output_scalar(Interp *it, const char *name) {
    const Tensor *t = interp_output(it, 0, name);
    return t ? t->d[0] : NAN;
}
