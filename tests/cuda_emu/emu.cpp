// emu.cpp — the fiber scheduler behind emu.h (read emu.h first: what is
// emulated and what is not).
//
// Fibers.  There is one fiber per thread slot (at most 1024, a block's
// limit), each with its own stack: STACK_BYTES above an inaccessible guard
// page, so an overflow faults instead of corrupting the neighbour.  A slot
// is started once with makecontext/swapcontext (which cost system calls);
// from then on every switch is a _setjmp/_longjmp pair (no system call):
// a fiber that waits saves its place in `resume` and jumps to the
// scheduler's `scheduler` buffer; the scheduler resumes it by jumping back.
// A fiber whose kernel thread returns does not end either: it waits at the
// top of its loop (fiber_main) and the next block resumes it as a new
// thread.  After an emulation error the fibers' stacks are abandoned and
// the slots started afresh by the next launch.  (_FORTIFY_SOURCE is
// switched off below: its longjmp check rejects jumps between stacks.)
//
// A block.  Every thread starts runnable; shared memory is poisoned (the
// dynamic region and the section emu_shared).  A round takes the warps in
// the block's order; each warp runs its runnable lanes until they wait or
// return, and as long as all its lanes then wait at a collective, the
// scheduler checks that they agree (same operation, whole-warp mask, valid
// width; complete_collective), gives each lane its result (warp_result,
// PTX's shfl.sync rules) and runs the warp again (run_warp).  After the
// round no fiber is runnable, and release_block
//   1. releases every thread when all wait at one __syncthreads;
//   2. ends the block when every thread has returned;
//   3. otherwise throws EmuError with where each group of threads waits:
//      nothing could ever run again (deadlock or divergence).
//
// Faults.  A SIGSEGV/SIGBUS handler, on its own signal stack, names the
// kernel thread and block that faulted and what the address was (a stack
// guard, the page after the dynamic shared memory, or anything else), then
// lets the fault kill the process.
#undef _FORTIFY_SOURCE
#include "emu.h"

#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <vector>

uint3 blockIdx;
dim3 blockDim, gridDim;
const uint3 *emu_thread_idx;
unsigned char *emu_dynamic_smem;

// the static __shared__ variables (emu.h: section emu_shared), bounds from the linker
extern "C" unsigned char __start_emu_shared[] __attribute__((weak));
extern "C" unsigned char __stop_emu_shared[] __attribute__((weak));

namespace {

constexpr unsigned MAX_THREADS = 1024;
constexpr size_t STACK_BYTES = 128 * 1024;
constexpr unsigned WARP = 32;

enum class State { runnable, at_barrier, at_warp, returned };

struct Fiber {
    jmp_buf resume;   // where a waiting fiber continues
    ucontext_t boot;  // only to start the slot
    bool started;
    State state;
    const char *site;  // where it waits (EMU_SITE)
    uint3 idx;
    // a warp collective: what the lane brings, what it gets
    EmuWarpOp op;
    unsigned mask;
    uint64_t value, result;
    int arg, width;
};

struct Emulator {
    bool ready, in_kernel;
    std::vector<Fiber> fibers;
    size_t page, stack_stride;
    unsigned char *stacks;        // MAX_THREADS slots of [guard page][stack]
    unsigned char *smem_region;   // smem_capacity bytes, then a guard page
    size_t smem_capacity, smem_bytes;
    jmp_buf scheduler;
    ucontext_t scheduler_context;
    Fiber *current;
    void (*kernel_thread)(void *);
    void *context;
    EmuOrder order = EmuOrder::alternate;
    unsigned nthreads;
};

Emulator emu;

std::string format(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return buf;
}

[[noreturn]] void system_failure(const char *what) { throw EmuError(format("emu: %s: %s", what, strerror(errno))); }

std::string xyz(uint3 v) { return format("(%u,%u,%u)", v.x, v.y, v.z); }
std::string xyz(dim3 v) { return format("(%u,%u,%u)", v.x, v.y, v.z); }

// ---- faults ----

void on_fault(int sig, siginfo_t *info, void *) {
    uintptr_t a = (uintptr_t)info->si_addr, stacks = (uintptr_t)emu.stacks;
    uintptr_t smem_guard = (uintptr_t)emu.smem_region + emu.smem_capacity;
    char why[256], msg[512];
    if (a >= smem_guard && a < smem_guard + emu.page)
        snprintf(why, sizeof why, "an access past the launch's %zu bytes of dynamic shared memory", emu.smem_bytes);
    else if (a >= stacks && a < stacks + MAX_THREADS * emu.stack_stride && (a - stacks) % emu.stack_stride < emu.page)
        snprintf(why, sizeof why, "a fiber stack overflow (stacks are %zu KiB: emu.cpp STACK_BYTES)", STACK_BYTES >> 10);
    else
        snprintf(why, sizeof why, "address %p (out of bounds? NULL?)", info->si_addr);
    if (emu.in_kernel && emu.current) {
        uint3 t = emu.current->idx, b = blockIdx;
        snprintf(msg, sizeof msg, "emu: %s in kernel thread (%u,%u,%u) of block (%u,%u,%u): %s\n", strsignal(sig),
                 t.x, t.y, t.z, b.x, b.y, b.z, why);
    }
    else
        snprintf(msg, sizeof msg, "emu: %s outside any kernel: %s\n", strsignal(sig), why);
    ssize_t ignored = write(2, msg, strlen(msg));
    (void)ignored;
    signal(sig, SIG_DFL);  // returning repeats the access, which now kills the process
}

// Each thread that runs kernels (the fake CUDA stack runs a stream per
// thread) gets its own alternate signal stack, mmap'ed: two threads must not
// share one, and AddressSanitizer unmaps a thread's alternate stack when the
// thread ends, which fails on heap memory.
void install_fault_handler() {
    static thread_local bool has_alt_stack = false;
    if (!has_alt_stack) {
        const size_t n = 1 << 16;
        void *p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) system_failure("mmap");
        stack_t ss = {};
        ss.ss_sp = p;
        ss.ss_size = n;
        if (sigaltstack(&ss, nullptr) != 0) system_failure("sigaltstack");
        has_alt_stack = true;
    }
    struct sigaction sa = {};
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGSEGV, &sa, nullptr) != 0 || sigaction(SIGBUS, &sa, nullptr) != 0) system_failure("sigaction");
}

// ---- memory: fiber stacks and dynamic shared memory, each with guard pages ----

unsigned char *map_bytes(size_t bytes) {
    void *p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) system_failure("mmap");
    return (unsigned char *)p;
}

void guard(unsigned char *page_start, size_t page) {
    if (mprotect(page_start, page, PROT_NONE) != 0) system_failure("mprotect");
}

void init_once() {
    if (emu.ready) return;
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0) system_failure("sysconf(_SC_PAGESIZE)");
    emu.page = (size_t)page;
    emu.fibers.resize(MAX_THREADS);
    emu.stack_stride = emu.page + STACK_BYTES;
    emu.stacks = map_bytes(MAX_THREADS * emu.stack_stride);
    for (unsigned t = 0; t < MAX_THREADS; t++) guard(emu.stacks + t * emu.stack_stride, emu.page);
    emu.smem_capacity = (EMU_MAX_DYNAMIC_SMEM + emu.page - 1) / emu.page * emu.page;
    emu.smem_region = map_bytes(emu.smem_capacity + emu.page);
    guard(emu.smem_region + emu.smem_capacity, emu.page);
    install_fault_handler();
    emu.ready = true;
}

// ---- fibers ----

[[noreturn]] void fiber_main() {
    for (;;) {
        emu.kernel_thread(emu.context);
        emu.current->state = State::returned;
        if (_setjmp(emu.current->resume) == 0) _longjmp(emu.scheduler, 1);
    }
}

void start_fiber(Fiber &f) {
    size_t slot = (size_t)(&f - emu.fibers.data());
    if (getcontext(&f.boot) != 0) system_failure("getcontext");
    f.boot.uc_stack.ss_sp = emu.stacks + slot * emu.stack_stride + emu.page;
    f.boot.uc_stack.ss_size = STACK_BYTES;
    f.boot.uc_link = nullptr;
    makecontext(&f.boot, fiber_main, 0);
    f.started = true;
    if (swapcontext(&emu.scheduler_context, &f.boot) != 0) system_failure("swapcontext");
}

// Runs fiber f until it waits or returns.
__attribute__((noinline)) void run_fiber(Fiber &f) {
    emu.current = &f;
    emu_thread_idx = &f.idx;
    if (_setjmp(emu.scheduler) == 0) {
        if (!f.started) start_fiber(f);
        else _longjmp(f.resume, 1);
    }
}

// Called on a fiber: park it in `state` at `site` until the scheduler resumes it.
void wait_here(State state, const char *site) {
    Fiber *f = emu.current;
    f->state = state;
    f->site = site;
    if (_setjmp(f->resume) == 0) _longjmp(emu.scheduler, 1);
}

// ---- warp collectives ----

const char *op_name(EmuWarpOp op) {
    static const char *const names[] = {"__shfl_sync", "__shfl_up_sync", "__shfl_down_sync", "__shfl_xor_sync",
                                        "__match_any_sync", "__ballot_sync", "__any_sync", "__all_sync",
                                        "__syncwarp", "mma.sync", "ldmatrix.sync"};
    return names[op];
}

const char *waits_at(const Fiber &f) {
    switch (f.state) {
    case State::at_barrier: return "__syncthreads";
    case State::at_warp: return op_name(f.op);
    case State::returned: return "returned";
    default: return "runnable";
    }
}

bool is_shuffle(EmuWarpOp op) { return op <= EMU_SHFL_XOR; }
bool is_exchange(EmuWarpOp op) { return op == EMU_MMA || op == EMU_LDMATRIX; }

// What a lane brings to an exchange (emu_warp_exchange): its bytes, and
// where the whole warp's go.
struct Exchange {
    const void *mine;
    void *all;
    size_t bytes;
};

// ldmatrix's rows (kind = 2 num + trans): lanes 0 .. 8 num - 1 give a row of
// 16 bytes each, 16-byte aligned, in shared memory.
void check_ldmatrix_rows(const Fiber *warp) {
    int num = warp[0].arg / 2;
    for (int l = 0; l < 8 * num && l < (int)WARP; l++) {
        const void *row = *(const void *const *)((const Exchange *)(uintptr_t)warp[l].value)->mine;
        if (((uintptr_t)row & 15u) == 0 && emu_in_shared(row, 16)) continue;
        throw EmuError(format("emu: block %s, thread %s: ldmatrix.sync at %s: lane %d's row address %p is not 16-byte aligned shared memory",
                              xyz(blockIdx).c_str(), xyz(warp[l].idx).c_str(), warp[l].site, l, row));
    }
}

// Every lane's bytes into every lane's `all`, in lane order.
void complete_exchange(Fiber *warp, unsigned lanes) {
    if (warp[0].op == EMU_LDMATRIX) check_ldmatrix_rows(warp);
    for (unsigned d = 0; d < lanes; d++) {
        const Exchange *to = (const Exchange *)(uintptr_t)warp[d].value;
        for (unsigned l = 0; l < lanes; l++) {
            const Exchange *from = (const Exchange *)(uintptr_t)warp[l].value;
            memcpy((unsigned char *)to->all + l * to->bytes, from->mine, to->bytes);
        }
    }
}

// The lane whose value lane `lane` reads, as PTX shfl.sync computes it
// (b: 5 bits of the lane or offset; segments of `width` lanes).
unsigned shuffle_source(EmuWarpOp op, unsigned lane, int arg, int width) {
    unsigned b = (unsigned)arg & 31u, segmask = WARP - (unsigned)width;
    unsigned min_lane = lane & segmask, max_lane = min_lane | (31u & ~segmask);
    int j;
    bool valid;
    switch (op) {
    case EMU_SHFL_UP: j = (int)lane - (int)b, valid = j >= (int)min_lane; break;
    case EMU_SHFL_DOWN: j = (int)(lane + b), valid = j <= (int)max_lane; break;
    case EMU_SHFL_XOR: j = (int)(lane ^ b), valid = j <= (int)max_lane; break;
    default: j = (int)(min_lane | (b & ~segmask)), valid = j <= (int)max_lane; break;
    }
    return valid ? (unsigned)j : lane;
}

// Result of lane `lane` of the collective of warp[0..lanes).
uint64_t warp_result(const Fiber *warp, unsigned lanes, unsigned lane) {
    const Fiber &f = warp[lane];
    unsigned votes = 0, same = 0;
    for (unsigned l = 0; l < lanes; l++) {
        votes |= (unsigned)(warp[l].value != 0) << l;
        same |= (unsigned)(warp[l].value == f.value) << l;
    }
    switch (f.op) {
    case EMU_MATCH_ANY: return same;
    case EMU_BALLOT: return votes;
    case EMU_ANY: return votes != 0;
    case EMU_ALL: return votes == warp[0].mask;
    case EMU_SYNCWARP:
    case EMU_MMA:
    case EMU_LDMATRIX: return 0;
    default: break;
    }
    unsigned src = shuffle_source(f.op, lane, f.arg, f.width);
    if (src >= lanes)
        throw EmuError(format("emu: block %s, thread %s: %s at %s reads lane %u, which this partial warp lacks",
                              xyz(blockIdx).c_str(), xyz(f.idx).c_str(), op_name(f.op), f.site, src));
    return warp[src].value;
}

// Lanes warp[0..lanes) all wait at a collective: check that they agree, then
// give each its result and make them runnable.
void complete_collective(Fiber *warp, unsigned lanes) {
    unsigned full = lanes == WARP ? 0xffffffffu : (1u << lanes) - 1u;
    for (unsigned l = 0; l < lanes; l++) {
        const Fiber &f = warp[l], &f0 = warp[0];
        bool bad_width = is_shuffle(f.op) && (f.width < 1 || f.width > 32 || (f.width & (f.width - 1)));
        bool bad_exchange = is_exchange(f.op) && (f.arg != f0.arg || lanes != WARP);
        if (f.op == f0.op && f.mask == full && !bad_width && !bad_exchange) continue;
        std::string where = format("emu: block %s, thread %s: %s mask 0x%x at %s", xyz(blockIdx).c_str(),
                                   xyz(f.idx).c_str(), op_name(f.op), f.mask, f.site);
        if (f.op != f0.op)
            throw EmuError(format("%s, while thread %s of its warp waits at %s at %s (divergence)", where.c_str(),
                                  xyz(f0.idx).c_str(), op_name(f0.op), f0.site));
        if (bad_exchange)
            throw EmuError(format("%s: %s", where.c_str(),
                                  lanes != WARP ? "a warp of fewer than 32 lanes (the instruction needs all 32)"
                                                : "lanes at different forms of the instruction (divergence)"));
        if (f.mask != full)
            throw EmuError(format("%s: the mask must name every lane of the warp (0x%x); partial masks are not emulated",
                                  where.c_str(), full));
        throw EmuError(format("%s: width %d is not a power of two in [1, 32]", where.c_str(), f.width));
    }
    if (is_exchange(warp[0].op)) complete_exchange(warp, lanes);
    for (unsigned l = 0; l < lanes; l++) warp[l].result = warp_result(warp, lanes, l);
    for (unsigned l = 0; l < lanes; l++) warp[l].state = State::runnable;
}

// ---- a block ----

bool same_site(const char *a, const char *b) { return a == b || strcmp(a, b) == 0; }

bool same_wait(const Fiber &a, const Fiber &b) {
    if (a.state != b.state) return false;
    if (a.state == State::at_warp && a.op != b.op) return false;
    return a.state == State::returned || same_site(a.site, b.site);
}

// "threads 0..31 __shfl_xor_sync at f.cu:9; threads 32..255 __syncthreads at f.cu:12"
std::string where_threads_wait() {
    std::string out;
    unsigned n = emu.nthreads;
    for (unsigned t = 0; t < n;) {
        const Fiber &f = emu.fibers[t];
        unsigned u = t + 1;
        while (u < n && same_wait(emu.fibers[u], f)) u++;
        out += out.empty() ? "" : "; ";
        out += u - t == 1 ? format("thread %u", t) : format("threads %u..%u", t, u - 1);
        out += format(" %s", waits_at(f));
        if (f.state != State::returned) out += format(" at %s", f.site);
        t = u;
    }
    return out;
}

// After a round (no fiber runnable): release what can be released; false when
// the block is done.
bool release_block() {
    unsigned n = emu.nthreads, at_barrier = 0, returned = 0;
    for (unsigned t = 0; t < n; t++) {
        at_barrier += emu.fibers[t].state == State::at_barrier;
        returned += emu.fibers[t].state == State::returned;
    }
    if (returned == n) return false;
    bool one_site = at_barrier == n;
    for (unsigned t = 1; t < n && one_site; t++) one_site = same_site(emu.fibers[t].site, emu.fibers[0].site);
    if (!one_site)
        throw EmuError(format("emu: block %s can never finish (deadlock or divergent barrier); by linear thread id: %s",
                              xyz(blockIdx).c_str(), where_threads_wait().c_str()));
    for (unsigned t = 0; t < n; t++) emu.fibers[t].state = State::runnable;
    return true;
}

// Runs the warp of lanes fibers[lo, lo + lanes) as far as it can go: its
// lanes until each waits or returns, its collectives completed at once, until
// it waits at __syncthreads, has returned or is stuck.
void run_warp(unsigned lo, unsigned lanes, bool reverse) {
    for (;;) {
        for (unsigned i = 0; i < lanes; i++) {
            Fiber &f = emu.fibers[lo + (reverse ? lanes - 1 - i : i)];
            if (f.state == State::runnable) run_fiber(f);
        }
        for (unsigned l = 0; l < lanes; l++)
            if (emu.fibers[lo + l].state != State::at_warp) return;
        complete_collective(&emu.fibers[lo], lanes);
    }
}

void run_block(bool reverse) {
    unsigned n = emu.nthreads, warps = (n + WARP - 1) / WARP;
    for (unsigned t = 0; t < n; t++) {
        Fiber &f = emu.fibers[t];
        f.idx = uint3{t % blockDim.x, t / blockDim.x % blockDim.y, t / (blockDim.x * blockDim.y)};
        f.state = State::runnable;
    }
    memset(emu_dynamic_smem, 0xff, emu.smem_region + emu.smem_capacity - emu_dynamic_smem);
    if (__start_emu_shared) memset(__start_emu_shared, 0xff, __stop_emu_shared - __start_emu_shared);
    do {
        for (unsigned i = 0; i < warps; i++) {
            unsigned lo = (reverse ? warps - 1 - i : i) * WARP;
            run_warp(lo, n - lo < WARP ? n - lo : WARP, reverse);
        }
    } while (release_block());
}

void check_geometry(dim3 grid, dim3 block, size_t smem) {
    const char *problem = nullptr;
    unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
    if (!grid.x || !grid.y || !grid.z) problem = "a grid dimension is 0";
    else if (grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535) problem = "the grid is too large";
    else if (!block.x || !block.y || !block.z) problem = "a block dimension is 0";
    else if (block.x > 1024 || block.y > 1024 || block.z > 64 || threads > MAX_THREADS) problem = "the block is too large";
    else if (smem > EMU_MAX_DYNAMIC_SMEM) problem = "more dynamic shared memory than sm_90 has";
    if (problem)
        throw EmuError(format("emu: bad launch: grid %s block %s dynamic smem %zu: %s", xyz(grid).c_str(),
                              xyz(block).c_str(), smem, problem));
}

}  // namespace

// ---- the interface (emu.h) ----

void emu_set_order(EmuOrder order) { emu.order = order; }

void emu_syncthreads(const char *site) {
    if (!emu.in_kernel) throw EmuError(format("emu: __syncthreads outside a kernel at %s", site));
    wait_here(State::at_barrier, site);
}

uint64_t emu_warp_collective(const char *site, EmuWarpOp op, unsigned mask, uint64_t value, int arg, int width) {
    if (!emu.in_kernel) throw EmuError(format("emu: %s outside a kernel at %s", op_name(op), site));
    Fiber *f = emu.current;
    f->op = op;
    f->mask = mask;
    f->value = value;
    f->arg = arg;
    f->width = width;
    wait_here(State::at_warp, site);
    return f->result;
}

void emu_warp_exchange(const char *site, EmuWarpOp op, int kind, const void *mine, void *all, size_t bytes) {
    Exchange x = {mine, all, bytes};
    emu_warp_collective(site, op, 0xffffffffu, (uint64_t)(uintptr_t)&x, kind, warpSize);
}

bool emu_in_shared(const void *p, size_t n) {
    const unsigned char *a = (const unsigned char *)p;
    const unsigned char *dyn_end = emu.smem_region + emu.smem_capacity;
    if (a >= emu_dynamic_smem && a + n <= dyn_end && emu.in_kernel) return true;
    return __start_emu_shared && a >= __start_emu_shared && a + n <= __stop_emu_shared;
}

void emu_launch_erased(dim3 grid, dim3 block, size_t dynamic_smem_bytes, void (*kernel_thread)(void *),
                       void *context) {
    if (emu.in_kernel) throw EmuError("emu: emu_launch called from a kernel thread");
    check_geometry(grid, block, dynamic_smem_bytes);
    init_once();
    install_fault_handler(); // this thread's alternate stack (once per thread)
    emu.kernel_thread = kernel_thread;
    emu.context = context;
    emu.nthreads = block.x * block.y * block.z;
    emu.smem_bytes = dynamic_smem_bytes;
    emu_dynamic_smem = emu.smem_region + emu.smem_capacity - (dynamic_smem_bytes + 15) / 16 * 16;
    gridDim = grid;
    blockDim = block;
    emu.in_kernel = true;
    try {
        unsigned long long linear = 0;
        for (unsigned z = 0; z < grid.z; z++)
            for (unsigned y = 0; y < grid.y; y++)
                for (unsigned x = 0; x < grid.x; x++, linear++) {
                    blockIdx = uint3{x, y, z};
                    bool odd = linear & 1;
                    run_block(emu.order == EmuOrder::reverse || (emu.order == EmuOrder::alternate && odd));
                }
    } catch (...) {
        for (Fiber &f : emu.fibers) f.started = false;  // abandon the stacks
        emu.in_kernel = false;
        emu.current = nullptr;
        throw;
    }
    emu.in_kernel = false;
    emu.current = nullptr;
}
