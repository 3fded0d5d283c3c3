// fake_register.hpp — turns an emulated kernel into a KilnFakeKernel entry
// (fake_kernels.h): its name, parameter count and sizes, launch bounds, and
// an invoker that unpacks cuLaunchKernel's `void **kernelParams`.
//
// build_kernels.sh writes, for each kernel source FILE.cu, a file
//     #include "emu.h"
//     #include "fake_register.hpp"
//     #include "FILE.cu"                      // the copy rewritten for the emulator
//     KILN_FAKE_KERNEL(kiln_layernorm_fwd, KILN_BLOCK)
//     ...
// one line per `extern "C" __global__` kernel of the file, with its
// __launch_bounds__ expression (1024 without one).  The kernel's parameter
// types are deduced from the function itself (a variadic template over the
// function type), so nothing about them is parsed from the source: each
// parameter's size is its sizeof, its kind (a value, a pointer to const,
// a pointer) comes from its type, and the invoker copies each argument's
// value out of params[i] (memcpy: kernelParams need not be aligned) into a
// tuple before the launch, then calls the kernel with it in every emulated
// thread (emu_launch).  An EmuError (or any exception) becomes the
// invoker's -1 and one-line message.
//
// The entries are collected at load time (a static Registrar per kernel)
// into fake_registry.cpp's table, which kiln_fake_kernels returns.
#pragma once

#include <cstdio>
#include <cstring>
#include <exception>
#include <tuple>
#include <type_traits>
#include <utility>

#include "emu.h"
#include "fake_kernels.h"

namespace kiln_fake {

void add_kernel(const KilnFakeKernel &kernel);  // fake_registry.cpp

template <class T>
T param_value(void *const *params, size_t i) {
    static_assert(std::is_trivially_copyable<T>::value, "kernel parameters are copied byte for byte");
    T value;
    std::memcpy(&value, params[i], sizeof value);
    return value;
}

template <class... A, size_t... I>
std::tuple<A...> unpack(void *const *params, std::index_sequence<I...>) {
    return std::tuple<A...>(param_value<A>(params, I)...);
}

template <class... A>
int launch(void (*kernel)(A...), const unsigned grid[3], const unsigned block[3], size_t smem, void *const *params,
           char *err, size_t errlen) {
    auto args = unpack<std::remove_cv_t<A>...>(params, std::index_sequence_for<A...>{});
    try {
        emu_launch(dim3(grid[0], grid[1], grid[2]), dim3(block[0], block[1], block[2]), smem,
                   [&] { std::apply(kernel, args); });
    } catch (const std::exception &e) {
        snprintf(err, errlen, "%s", e.what());
        return -1;
    }
    return 0;
}

template <class... A>
struct ParamSizes {
    static constexpr size_t value[sizeof...(A) + 1] = {sizeof(A)..., 0};  // +1: no zero-length array
};

template <class T>
constexpr unsigned char param_kind() {
    return !std::is_pointer<T>::value                                 ? KILN_FAKE_PARAM_VALUE
           : std::is_const<typename std::remove_pointer<T>::type>::value ? KILN_FAKE_PARAM_CONST_PTR
                                                                       : KILN_FAKE_PARAM_PTR;
}

template <class... A>
struct ParamKinds {
    static constexpr unsigned char value[sizeof...(A) + 1] = {param_kind<A>()..., 0};
};

typedef int (*Invoker)(const unsigned *grid, const unsigned *block, size_t smem, void *const *params, char *err,
                       size_t errlen);

struct Registrar {
    template <class... A>
    Registrar(const char *name, void (*)(A...), long long max_threads, Invoker invoker) {
        KilnFakeKernel k = {name, (int)sizeof...(A), ParamSizes<A...>::value, ParamKinds<A...>::value, (int)max_threads,
                            invoker};
        add_kernel(k);
    }
};

}  // namespace kiln_fake

#define KILN_FAKE_KERNEL(NAME, MAX_THREADS)                                                                        \
    static const kiln_fake::Registrar kiln_fake_registrar_##NAME(                                                 \
        #NAME, NAME, (MAX_THREADS),                                                                               \
        [](const unsigned *grid, const unsigned *block, size_t smem, void *const *params, char *err, size_t len) { \
            return kiln_fake::launch(NAME, grid, block, smem, params, err, len);                                  \
        });
