/* fake_kernels.h — the C interface between the fake libcuda.so.1 and a
 * library of emulated kernels (a "kernel registry").
 *
 * Why: the fake CUDA driver (fake_cuda.c) cannot run a cubin's SASS.  It
 * runs, instead of each kernel the program launches, the same CUDA C source
 * compiled as host C++ for the fiber emulator (tests/cuda_emu/emu.h).
 * tests/cuda_fake/build_kernels.sh builds such a library from any list of
 * .cu files: the sources rewritten for the emulator, emu.cpp, and one
 * generated registration file per source that lists its
 * `extern "C" __global__` kernels (fake_register.hpp unpacks cuLaunchKernel's
 * `void **kernelParams` into each kernel's typed call).  The fake driver
 * dlopens the libraries named in $KILN_FAKE_CUDA_KERNELS (colon separated)
 * and finds a kernel by the name cuModuleGetFunction is given.
 *
 * Each library exports one symbol, kiln_fake_kernels; everything else in it
 * (the emulator's state included) is local, so two libraries (the library
 * kernels and a model's generated kernels) each have their own emulator and
 * never clash.  The table is C, so the driver (C) needs no C++.
 */
#ifndef KILN_FAKE_KERNELS_H
#define KILN_FAKE_KERNELS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bump when KilnFakeKernel changes; the driver refuses another version. */
#define KILN_FAKE_KERNELS_ABI 2

enum { KILN_FAKE_PARAM_VALUE, KILN_FAKE_PARAM_CONST_PTR, KILN_FAKE_PARAM_PTR };

typedef struct {
    const char *name;          /* the kernel's name: its cubin symbol (extern "C") */
    int nparams;               /* how many parameters it takes */
    const size_t *param_sizes; /* [nparams]: sizeof each parameter, in order */
    /* [nparams]: what each parameter is, one of KILN_FAKE_PARAM_*: the
     * driver checks every pointer against its allocations and tracks what
     * a kernel reads and writes through them (a pointer to const is read) */
    const unsigned char *param_kinds;
    int max_threads;           /* __launch_bounds__' first argument; 1024 without one */
    /* Runs the kernel on the host emulator with grid[3], block[3], `smem`
     * bytes of dynamic shared memory and cuLaunchKernel's params (one
     * pointer to each argument's value).  Returns 0, or -1 with a one-line
     * message in err (an EmuError: bad geometry, barrier divergence,
     * deadlock, ...).  Not reentrant: one launch at a time per library. */
    int (*launch)(const unsigned grid[3], const unsigned block[3], size_t smem, void *const *params, char *err,
                  size_t errlen);
} KilnFakeKernel;

/* The library's kernels: *count entries; *abi = KILN_FAKE_KERNELS_ABI.  *count = -1
 * when two kernels have one name (a build mistake). */
const KilnFakeKernel *kiln_fake_kernels(int *count, int *abi);

#ifdef __cplusplus
}
#endif
#endif
