/* testutil.h — what every cmocka test file includes. */
#ifndef KILN_TESTUTIL_H
#define KILN_TESTUTIL_H
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "front.h"
#include "interp.h"
#include "passes.h"

/* max |a-b| / max(|b|, floor) over n elements */
static inline double rel_err(const double *a, const double *b, int64_t n, double floor_) {
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs(a[i] - b[i]), s = fabs(b[i]) > floor_ ? fabs(b[i]) : floor_;
        if (d / s > worst) worst = d / s;
    }
    return worst;
}
#endif
