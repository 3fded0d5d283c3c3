// fake_longjmp.cpp — the emulator's fiber switches go straight to libc's
// _longjmp, even inside a program built with AddressSanitizer.
//
// Why: the emulator (tests/cuda_emu/emu.cpp) switches fibers with
// _setjmp/_longjmp, hundreds of times per block.  In an ASan program
// (`make SAN=1` links the trainer with -fsanitize=address) the dynamic
// linker binds the kernel library's _longjmp to ASan's interceptor, which
// makes a sigaltstack system call and tries to unpoison the stack on every
// call: the emulated trainer ran ~40 times slower (30 s a step of tiny.lua
// instead of 0.7 s).  The kernel library itself is not instrumented, so no
// frame on a fiber stack is ever poisoned and the interceptor has nothing
// to do.  build_kernels.sh links with -Wl,--wrap=_longjmp, which sends the
// emulator's calls here; this function calls the _longjmp that libc itself
// defines (looked up in libc.so.6's own scope, where no interceptor sits),
// found once.  Outside ASan it is the same function, one indirection away.
#include <dlfcn.h>
#include <setjmp.h>

#include <cstdio>
#include <cstdlib>

typedef void (*LongJmp)(struct __jmp_buf_tag *, int);

static LongJmp libc_longjmp() {
    void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    void *f = libc ? dlsym(libc, "_longjmp") : nullptr;
    if (!f) {
        fprintf(stderr, "fake kernels: cannot find libc's _longjmp: %s\n", dlerror());
        abort();
    }
    return reinterpret_cast<LongJmp>(f);
}

extern "C" [[noreturn]] void __wrap__longjmp(struct __jmp_buf_tag env[1], int value) {
    static const LongJmp real = libc_longjmp();
    real(env, value);
    __builtin_unreachable();
}
