// fake_registry.cpp — the table of a kernel library's emulated kernels
// (fake_kernels.h), filled at load time by fake_register.hpp's Registrars
// and returned by the library's one exported symbol, kiln_fake_kernels.
// Two kernels of one name in a library are a build error caught here: the
// table is checked when it is asked for, and a duplicate makes
// kiln_fake_kernels set *count to -1 (the fake driver then names the library).
#include <cstring>
#include <vector>

#include "fake_kernels.h"

namespace kiln_fake {

static std::vector<KilnFakeKernel> &table() {
    static std::vector<KilnFakeKernel> kernels;  // built before first use (static init order)
    return kernels;
}

void add_kernel(const KilnFakeKernel &kernel) { table().push_back(kernel); }

}  // namespace kiln_fake

extern "C" __attribute__((visibility("default"))) const KilnFakeKernel *kiln_fake_kernels(int *count, int *abi) {
    const std::vector<KilnFakeKernel> &t = kiln_fake::table();
    *abi = KILN_FAKE_KERNELS_ABI;
    *count = (int)t.size();
    for (size_t i = 0; i < t.size(); i++)
        for (size_t j = 0; j < i; j++)
            if (std::strcmp(t[i].name, t[j].name) == 0) {
                *count = -1;
                return nullptr;
            }
    return t.data();
}
