// emu.h — run CUDA C kernels on the host, one fiber per CUDA thread.
//
// Why: this machine has the CUDA toolkit but no GPU, so the kernels in
// kernels/cuda/ can be compiled (NVRTC, tests/test_nvrtc.c) but not run.
// This emulator runs the same source as host C++, so that a check file can
// compare each kernel with an independent reference, exercise its grid,
// block and shared-memory logic, and catch barrier and warp-shuffle
// mistakes.  It says nothing about speed and does not replace a GPU run
// (bench/gpu/check.sh): the memory model and the math library differ.
//
// Use:
//     #include "emu.h"
//     #include "rope.cu"            // the kernel source, as host C++
//     ...
//     emu_launch(dim3(B * T), dim3(256), 4 * D, [&] {   // grid, block, smem
//         kiln_rope_fwd(x, pos, y, B, T, H, D, theta);  // host pointers
//     });
// emu_launch calls the callable once per CUDA thread, as that thread, and
// returns when every thread has returned; it throws EmuError on any
// emulation error (below).  tests/cuda_emu/check.cpp is the worked example.
//
// How a kernel file becomes host C++.  The check file includes this header,
// then the kernel sources: the kernels become plain functions of one
// translation unit.  This header maps the CUDA vocabulary:
//   - __global__, __device__, __host__, __forceinline__ (inline),
//     __noinline__ and __launch_bounds__(...) vanish; launch bounds are
//     NOT enforced, so the check must launch with the block sizes the
//     kernel's README gives.  __align__(n) is alignas(n); __restrict__ is
//     g++'s own keyword.
//   - __shared__ becomes `static` (in the section emu_shared, see
//     "Shared memory"), so `__shared__ float part[32];` in a device
//     function is one array for all the fibers: shared memory, since one
//     block runs at a time.
//   - threadIdx, blockIdx, blockDim, gridDim, warpSize: the running fiber's
//     and the launch's (dim3 and uint3 as in CUDA).
//   - __nv_bfloat16, float2 and the intrinsics the kernels use are defined
//     below (bf16 conversion rounds to nearest even, NaN to 0x7fff, as the
//     hardware does); the math functions (expf, logf, sqrtf, pow, sincos)
//     are the host libm's.
// Two lines cannot be mapped by a header and are rewritten in a COPY of
// the kernel sources (tests/t_cuda_emu.sh, which fails loudly when they
// change shape): `#include <cuda_bf16.h>` (this header has the types), and
// the dynamic shared-memory declaration `extern __shared__ ... kiln_smem[];`
// (neither `extern` nor `static` fits), which becomes
// `#define kiln_smem emu_dynamic_smem`.
//
// What is emulated.
//   - Launch: the geometry is checked against CUDA's limits (at most 1024
//     threads a block, no zero dimension, at most EMU_MAX_DYNAMIC_SMEM of
//     dynamic shared memory).  1-, 2- and 3-D grids and blocks; a warp is
//     32 consecutive linear thread ids (x fastest), as on the hardware.
//   - Scheduling: blocks run one after another (x fastest, then y, z).
//     Each thread is a fiber that runs until it waits (at __syncthreads or
//     a warp collective) or returns; a waiting fiber is resumed when its
//     barrier is complete.  The warps of a block run one at a time, each as
//     far as it can go (its collectives completed at once) before the next
//     starts, so one warp always runs ahead of the others up to the next
//     __syncthreads; the order is forward (warp 0, lane 0 first) in even
//     blocks and reverse in odd ones (emu_set_order changes that).  A
//     missing __syncthreads then shows as a wrong value or NaN in one of
//     the two orders.  A heuristic, not a race detector.
//   - __syncthreads: every thread of the block must reach the same call
//     site (file:line).  Threads waiting there while others have returned or
//     wait at another __syncthreads is an error (CUDA: undefined behaviour).
//   - Warp collectives (__shfl_sync, __shfl_up_sync, __shfl_down_sync,
//     __shfl_xor_sync with the optional width, __match_any_sync,
//     __ballot_sync, __any_sync, __all_sync, __syncwarp; and the tensor
//     cores' mma.sync m16n8k16 bf16 and ldmatrix m8n8: see "tensor cores"
//     at the end of this file), values of up to 8
//     bytes: every lane of the warp must arrive at the same kind of
//     collective with the mask of the whole warp (0xffffffff; in a partial
//     last warp, the mask of its lanes).  Results follow PTX's shfl.sync
//     rules (segments of `width` lanes; a lane outside gets its own value).
//     Errors: a partial mask (not emulated), lanes at different collectives
//     (divergence), lanes at a collective while others of the warp have
//     returned or wait at __syncthreads, a read of a lane that does not
//     exist.  Between collectives lanes run independently (Volta's
//     independent thread scheduling), so code that assumes lockstep warps
//     gets no protection here.
//   - Deadlock: when no fiber can run and no barrier can be released, the
//     launch throws with where each group of threads waits.  A thread that
//     spins (waits for a flag set by another thread or block) never yields
//     and hangs: run checks under `timeout`.
//   - Errors: EmuError (a std::runtime_error) leaves emu_launch naming the
//     block, thread and source line; the fibers are abandoned and the next
//     launch starts fresh ones.  A segmentation fault in a kernel thread
//     (out-of-bounds access, fiber stack overflow, an access past the
//     launch's dynamic shared memory) prints the thread, the block and the
//     likely cause, then kills the process.
//   - Shared memory starts as 0xff bytes in every block (NaN as f32 and
//     bf16, -1 as int), so a value read before any thread wrote it is NaN:
//     the dynamic region (emu_dynamic_smem: exactly dynamic_smem_bytes,
//     rounded up to 16, followed by an inaccessible page) and every static
//     __shared__ variable (all in the ELF section emu_shared, which the
//     linker bounds).  Limits of that trick: a __shared__ variable in a
//     non-static inline function fails to compile ("section type
//     conflict"; make the function static, as kernels/cuda does), one in a
//     function template is not poisoned.  -DEMU_NO_SHARED_POISON turns the
//     section off.  The 48 KiB opt-in rule for dynamic shared memory is not
//     checked.
//
// What is not emulated.
//   - The memory model: fibers share the host's memory and only one runs at
//     a time, so every access is atomic and sequentially consistent; no
//     caching, reordering or tearing; __threadfence and volatile mean
//     nothing.  Races within a block show only through the run order
//     (above); races between blocks never (blocks run in a fixed order, the
//     last writer wins).  Nothing that needs blocks to run at the same time
//     works (grid-wide sync, inter-block flags: they hang).
//     Within a warp, a shared-memory read by some lanes and a write of the
//     same location by another lane with only a shuffle between them is a
//     hazard on a GPU (a shuffle orders no memory; compute-sanitizer
//     racecheck reports it) but never shows here: every collective is a
//     point where all lanes stop, so the reads before it always come before
//     the write after it.  Such a hazard needs __syncwarp(), and only
//     racecheck on a GPU finds a missing one (kernels/cuda/README.md,
//     "Warps and shared memory").
//   - Atomics: atomicAdd on int and unsigned is a plain read-modify-write,
//     atomic here because fibers are never preempted.  Float atomics are
//     deliberately absent (kernels/cuda/README.md forbids them): a kernel
//     that uses one does not compile.
//   - Bounds: global memory is host memory; out-of-bounds reads are not
//     detected, out-of-bounds writes only by the check's guard zones.
//   - Numerics: host libm (CUDA's expf, logf... differ by up to 2 ulp) and
//     no FMA contraction (NVRTC contracts a*b+c by default), so results
//     differ from a GPU's by a few f32 ulps: compare with references at a
//     tolerance, and compare bits only between two emulated runs (grid
//     independence, in-place variants, order of a sum).
//   - Timing, occupancy, coalescing, bank conflicts, registers, streams,
//     events, textures, cooperative groups; of the tensor cores, only
//     mma.sync.m16n8k16 bf16 (f32 accumulate) and ldmatrix m8n8 (.x1/.x2/.x4,
//     .trans) exist, with PTX's fragment layouts (see the end of this file).
//
// Extending it (the flash-attention check, say): add an intrinsic below,
// as an inline function when it involves one thread, or on top of
// emu_warp_collective (emu.cpp: warp_result computes the whole warp's
// results) when lanes exchange values.  Keep helpers with __shared__
// variables static (above).
//
// Building: g++ -std=c++17 -Wall; emu.cpp compiled on its own, the check
// file with -I at the rewritten kernel copies (tests/t_cuda_emu.sh).  POSIX
// and glibc (ucontext, _setjmp/_longjmp, mmap, sigaltstack); one host
// thread; not under AddressSanitizer (it cannot follow the stack switches)
// nor LTO (static __shared__ variables rely on the compiler assuming that a
// barrier, an opaque call, may change them).
#pragma once

// kernels/cuda/mma.cuh: call the emulator's tensor-core functions, not PTX
#define KILN_HOST_EMU 1

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

// ---- launch geometry ----

struct uint3 {
    unsigned x, y, z;
};

struct alignas(16) uint4 {  // misc.cu's 16-byte copy element
    unsigned x, y, z, w;
};

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

// What a kernel sees.  The emulator sets them; kernels only read them.
extern uint3 blockIdx;
extern dim3 blockDim, gridDim;
extern const uint3 *emu_thread_idx;  // the running fiber's thread index
extern unsigned char *emu_dynamic_smem;  // this launch's dynamic shared memory
#define threadIdx (*emu_thread_idx)
constexpr int warpSize = 32;

// sm_90's largest dynamic shared memory per block (kernels/cuda/README.md)
constexpr size_t EMU_MAX_DYNAMIC_SMEM = 227 * 1024;

// ---- launching ----

// Every emulation error (bad launch, barrier divergence, deadlock, bad mask).
struct EmuError : std::runtime_error {
    explicit EmuError(const std::string &what) : std::runtime_error(what) {}
};

// The order of a block's warps, and of the lanes within a warp: forward
// (warp 0, lane 0 first), reverse, or alternate (the default: forward in
// even blocks, reverse in odd ones; blocks counted x fastest).
enum class EmuOrder { forward, reverse, alternate };
void emu_set_order(EmuOrder order);

// Runs `kernel_thread(context)` once per thread of every block (the type-
// erased form of emu_launch below).
void emu_launch_erased(dim3 grid, dim3 block, size_t dynamic_smem_bytes, void (*kernel_thread)(void *),
                       void *context);

// Launches `kernel_call` (a callable taking no arguments, usually a lambda
// that calls the kernel) as a grid of blocks, like
//     kernel<<<grid, block, dynamic_smem_bytes>>>(args...);
// and returns when every thread has returned.  Throws EmuError.
template <class F>
void emu_launch(dim3 grid, dim3 block, size_t dynamic_smem_bytes, F &&kernel_call) {
    using Fn = typename std::remove_reference<F>::type;
    emu_launch_erased(grid, block, dynamic_smem_bytes, [](void *f) { (*static_cast<Fn *>(f))(); },
                      const_cast<void *>(static_cast<const void *>(&kernel_call)));
}

// ---- barriers and warp collectives ----

#define EMU_STRINGIFY2(x) #x
#define EMU_STRINGIFY(x) EMU_STRINGIFY2(x)
#define EMU_SITE __FILE__ ":" EMU_STRINGIFY(__LINE__)

enum EmuWarpOp {
    EMU_SHFL_IDX,
    EMU_SHFL_UP,
    EMU_SHFL_DOWN,
    EMU_SHFL_XOR,
    EMU_MATCH_ANY,
    EMU_BALLOT,
    EMU_ANY,
    EMU_ALL,
    EMU_SYNCWARP,
    EMU_MMA,       // mma.sync (emu_mma_m16n8k16_bf16): a fragment exchange
    EMU_LDMATRIX,  // ldmatrix.sync (emu_ldmatrix): a row-address exchange
};

// Blocks the calling fiber until the whole block arrives (at `site`).
void emu_syncthreads(const char *site);

// Blocks the calling fiber until its whole warp arrives, then returns this
// lane's result of `op` over the lanes' (value, arg) (emu.cpp: warp_result).
uint64_t emu_warp_collective(const char *site, EmuWarpOp op, unsigned mask, uint64_t value, int arg, int width);

// Blocks the calling fiber until its whole warp (all 32 lanes: mma.sync and
// ldmatrix have no partial form) arrives at the same exchange (op, and the
// same `kind`), then copies every lane's `bytes` bytes at `mine` into
// this lane's all[lane * bytes]: the warp machinery behind the tensor-core
// instructions below, which then compute each lane's registers from the
// whole warp's operands.
void emu_warp_exchange(const char *site, EmuWarpOp op, int kind, const void *mine, void *all, size_t bytes);

// True when [p, p + n) lies in shared memory: the launch's dynamic region or
// the static __shared__ section.
bool emu_in_shared(const void *p, size_t n);

template <class T>
inline uint64_t emu_to_bits(T v) {
    static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= 8, "warp collectives move at most 8 bytes");
    uint64_t u = 0;
    memcpy(&u, &v, sizeof v);
    return u;
}

template <class T>
inline T emu_from_bits(uint64_t u) {
    T v;
    memcpy(&v, &u, sizeof v);
    return v;
}

template <class T>
inline T emu_shfl(const char *site, EmuWarpOp op, unsigned mask, T v, int arg, int width = warpSize) {
    return emu_from_bits<T>(emu_warp_collective(site, op, mask, emu_to_bits(v), arg, width));
}

template <class T>
inline unsigned emu_vote(const char *site, EmuWarpOp op, unsigned mask, T v) {
    return (unsigned)emu_warp_collective(site, op, mask, emu_to_bits(v), 0, warpSize);
}

inline void emu_syncwarp(const char *site, unsigned mask = 0xffffffffu) {
    emu_warp_collective(site, EMU_SYNCWARP, mask, 0, 0, warpSize);
}

#define __syncthreads() emu_syncthreads(EMU_SITE)
#define __syncwarp(...) emu_syncwarp(EMU_SITE __VA_OPT__(, ) __VA_ARGS__)
#define __shfl_sync(mask, v, ...) emu_shfl(EMU_SITE, EMU_SHFL_IDX, mask, v, __VA_ARGS__)
#define __shfl_up_sync(mask, v, ...) emu_shfl(EMU_SITE, EMU_SHFL_UP, mask, v, __VA_ARGS__)
#define __shfl_down_sync(mask, v, ...) emu_shfl(EMU_SITE, EMU_SHFL_DOWN, mask, v, __VA_ARGS__)
#define __shfl_xor_sync(mask, v, ...) emu_shfl(EMU_SITE, EMU_SHFL_XOR, mask, v, __VA_ARGS__)
#define __match_any_sync(mask, v) emu_vote(EMU_SITE, EMU_MATCH_ANY, mask, v)
#define __ballot_sync(mask, p) emu_vote(EMU_SITE, EMU_BALLOT, mask, (int)(bool)(p))
#define __any_sync(mask, p) ((int)emu_vote(EMU_SITE, EMU_ANY, mask, (int)(bool)(p)))
#define __all_sync(mask, p) ((int)emu_vote(EMU_SITE, EMU_ALL, mask, (int)(bool)(p)))

// ---- function qualifiers ----

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#ifdef EMU_NO_SHARED_POISON
#define __shared__ static
#else
#define __shared__ static __attribute__((section("emu_shared")))
#endif
#define __align__(n) alignas(n)

// ---- types and single-thread intrinsics ----

struct float2 {
    float x, y;
};
inline float2 make_float2(float x, float y) { return float2{x, y}; }
struct alignas(16) float4 {
    float x, y, z, w;
};

// bf16: the upper half of an f32.  `bits` is the emulator's field name (the
// kernels never touch the representation; a check may).
struct __nv_bfloat16 {
    uint16_t bits;
};

inline float __bfloat162float(__nv_bfloat16 v) {
    uint32_t u = (uint32_t)v.bits << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// round to nearest even; NaN becomes the canonical 0x7fff, as cvt.rn.bf16.f32
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return __nv_bfloat16{0x7fff};
    u += 0x7fffu + ((u >> 16) & 1u);
    return __nv_bfloat16{(uint16_t)(u >> 16)};
}
inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 v) { return v.bits; }

inline float __int_as_float(int i) { return emu_from_bits<float>(emu_to_bits(i)); }
inline int __float_as_int(float f) { return emu_from_bits<int>(emu_to_bits(f)); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll((unsigned long long)x); }
inline int __ffs(int x) { return __builtin_ffs(x); }

// Atomic because fibers are never preempted (see "Atomics" above).
inline int atomicAdd(int *p, int v) {
    int old = *p;
    *p = old + v;
    return old;
}
inline unsigned atomicAdd(unsigned *p, unsigned v) {
    unsigned old = *p;
    *p = old + v;
    return old;
}

// ---- tensor cores: mma.sync and ldmatrix (issue 23) ----
//
// kernels/cuda/mma.cuh calls these on the host in place of its inline PTX.
// Both are warp collectives (emu_warp_exchange: every lane of a full warp
// at the same instruction, else EmuError); each lane then builds the whole
// warp's operands from the exchanged registers and computes its own.  The
// fragment layouts are the PTX ISA's (PTX ISA 8.x, §9.7.14.5.8 "Matrix
// Fragments for mma.m16n8k16 with floating point type", and §9.7.14.5.15
// "Warp-level matrix load instruction: ldmatrix"), with
//     g = lane >> 2 (groupID), t = lane & 3 (threadID_in_group);
// a .b32 register holds two 16-bit elements, the lower-indexed one in its
// low half.
//
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 d, a, b, c:
// D[16x8] = A[16x16] B[16x8] + C[16x8]:
//   a[0] = A[g][2t, 2t+1]      a[1] = A[g+8][2t, 2t+1]
//   a[2] = A[g][2t+8, 2t+9]    a[3] = A[g+8][2t+8, 2t+9]
//   b[0] = B[2t, 2t+1][g]      b[1] = B[2t+8, 2t+9][g]
//   c[0], c[1] = C[g][2t, 2t+1]    c[2], c[3] = C[g+8][2t, 2t+1]   (d alike)
// The products of bf16 are exact in f32; PTX leaves the accumulation's
// order and intermediate rounding unspecified, so the emulator sums in
// double and rounds once to f32 (a GPU differs in the last f32 bits).
//
// ldmatrix.sync.aligned.m8n8.x{1,2,4}[.trans].shared.b16 r, [p]: matrix i
// (8 rows of 8 16-bit elements, 16 bytes a row, 16-byte aligned, in shared
// memory) has its row j at the address lane 8i + j supplies; lanes beyond
// 8 * num supply nothing.  Register r[i] of lane (g, t) gets
//   M_i[g][2t, 2t+1]            without .trans,
//   M_i[2t][g], M_i[2t+1][g]    with .trans.
// The emulator checks each used address: in shared memory, 16-byte aligned
// (EmuError otherwise, like every emulation error raised by the scheduler:
// an exception cannot leave a fiber).

inline unsigned emu_lane() {
    const uint3 &t = *emu_thread_idx;
    return (t.x + blockDim.x * (t.y + blockDim.y * t.z)) % 32u;
}

inline float emu_bf16_lo(uint32_t r) { return __bfloat162float(__nv_bfloat16{(uint16_t)(r & 0xffffu)}); }
inline float emu_bf16_hi(uint32_t r) { return __bfloat162float(__nv_bfloat16{(uint16_t)(r >> 16)}); }

struct EmuMmaOperands {
    uint32_t a[4], b[2];
    float c[4];
};

inline void emu_mma_m16n8k16_bf16(const char *site, float d[4], const uint32_t a[4], const uint32_t b[2],
                                  const float c[4]) {
    EmuMmaOperands mine, all[32];
    memcpy(mine.a, a, sizeof mine.a);
    memcpy(mine.b, b, sizeof mine.b);
    memcpy(mine.c, c, sizeof mine.c);
    emu_warp_exchange(site, EMU_MMA, 0, &mine, all, sizeof mine);
    float A[16][16], B[16][8], C[16][8];
    for (unsigned l = 0; l < 32; l++) {
        const unsigned g = l >> 2, t = l & 3;
        const EmuMmaOperands &o = all[l];
        for (unsigned hi = 0; hi < 2; hi++) {  // the element's half of the register
            const unsigned h = hi;
            A[g][2 * t + h] = hi ? emu_bf16_hi(o.a[0]) : emu_bf16_lo(o.a[0]);
            A[g + 8][2 * t + h] = hi ? emu_bf16_hi(o.a[1]) : emu_bf16_lo(o.a[1]);
            A[g][2 * t + 8 + h] = hi ? emu_bf16_hi(o.a[2]) : emu_bf16_lo(o.a[2]);
            A[g + 8][2 * t + 8 + h] = hi ? emu_bf16_hi(o.a[3]) : emu_bf16_lo(o.a[3]);
            B[2 * t + h][g] = hi ? emu_bf16_hi(o.b[0]) : emu_bf16_lo(o.b[0]);
            B[2 * t + 8 + h][g] = hi ? emu_bf16_hi(o.b[1]) : emu_bf16_lo(o.b[1]);
            C[g][2 * t + h] = o.c[h];
            C[g + 8][2 * t + h] = o.c[2 + h];
        }
    }
    const unsigned g = emu_lane() >> 2, t = emu_lane() & 3;
    for (unsigned i = 0; i < 4; i++) {
        const unsigned row = g + 8 * (i >> 1), col = 2 * t + (i & 1);
        double sum = C[row][col];
        for (unsigned k = 0; k < 16; k++) sum += (double)A[row][k] * (double)B[k][col];
        d[i] = (float)sum;
    }
}

inline void emu_ldmatrix(const char *site, uint32_t *r, int num, bool trans, const void *row) {
    const void *rows[32];
    emu_warp_exchange(site, EMU_LDMATRIX, num * 2 + (int)trans, &row, rows, sizeof row);
    // (the scheduler checked the rows used: emu.cpp, check_ldmatrix_rows)
    const unsigned g = emu_lane() >> 2, t = emu_lane() & 3;
    for (int i = 0; i < num; i++) {
        uint16_t lo, hi;
        const uint16_t *const *m = (const uint16_t *const *)(rows + 8 * i);
        if (!trans) lo = m[g][2 * t], hi = m[g][2 * t + 1];
        else lo = m[2 * t][g], hi = m[2 * t + 1][g];
        r[i] = (uint32_t)lo | (uint32_t)hi << 16;
    }
}
