/* calibrate_ew.h — kiln calibrate's elementwise stand-in kernels
 * (calibrate_ew.c says why).  args: x, y (calib_ew_add only; else 0), z, n */
#ifndef KILN_CALIBRATE_EW_H
#define KILN_CALIBRATE_EW_H

#include "kiln_rt.h"

void calib_ew_add(rt_ctx *ctx, const int64_t *a);
void calib_ew_scale(rt_ctx *ctx, const int64_t *a);
void calib_ew_gelu(rt_ctx *ctx, const int64_t *a);

#endif
