/* mma.cuh — the tensor-core primitives of kiln's CUDA kernels: one warp's
 * bf16 matrix product with f32 accumulation and the shared-memory loads that
 * feed it, as small functions over the instructions' register fragments.
 *
 *   kiln_mma_bf16(d, a, b, c)    mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32:
 *                                d[4] = a[4] (A 16x16) x b[2] (B 16x8) + c[4] (C 16x8)
 *   kiln_ldmatrix_x4(r, p)       ldmatrix.sync.aligned.m8n8.x4.shared.b16: r[4]
 *   kiln_ldmatrix_x2(r, p)       .x2: r[2]
 *   kiln_ldmatrix_x4_trans(r, p) .x4.trans: r[4]
 *   kiln_ldmatrix_x2_trans(r, p) .x2.trans: r[2]
 *   kiln_pack_bf16(lo, hi)       two f32 rounded to bf16 in one register (lo in the low half)
 *
 * All of them are warp collectives: the 32 lanes of a warp call them
 * together (convergent, no lane masked out).  Fragment layouts (PTX ISA
 * 8.x, §9.7.14.5.8 "Matrix Fragments for mma.m16n8k16 with floating point
 * type" and §9.7.14.5.15 "ldmatrix"), g = lane >> 2, t = lane & 3, two
 * 16-bit elements a register, the lower index in the low half:
 *   A (row major): a[0] = A[g][2t..2t+1], a[1] = A[g+8][2t..], a[2] = A[g][2t+8..], a[3] = A[g+8][2t+8..]
 *   B (col major): b[0] = B[2t..2t+1][g], b[1] = B[2t+8..2t+9][g]
 *   C, D (f32):    c[0..1] = C[g][2t..2t+1], c[2..3] = C[g+8][2t..2t+1]
 *   ldmatrix: lane 8i + j gives the address of row j of matrix i (16 bytes,
 *   16-byte aligned, shared memory); r[i] of lane (g, t) = M_i[g][2t..2t+1],
 *   or with .trans M_i[2t][g], M_i[2t+1][g].
 * So one ldmatrix.x4 of a row-major 16x16 bf16 tile, lane l pointing at row
 * (l & 7) + 8 ((l >> 3) & 1), column 8 (l >> 4), gives exactly A's a[0..3];
 * an .x2 of 8 rows n x 16 columns k of a row-major [n][k] tile gives B's
 * b[0..1] (B = the tile transposed: S = Q K^T); and .trans of a row-major
 * [k][n] tile gives B directly (O = P V).
 *
 * On the GPU they are inline PTX (sm_80 and later: NVRTC compiles them for
 * sm_90 in make test, tests/test_nvrtc.c).  On the host emulator
 * (tests/cuda_emu/emu.h defines KILN_HOST_EMU) they are the emulator's own
 * functions, which exchange the fragments across the warp with its warp
 * machinery and compute every lane's registers from the PTX layouts above;
 * tests/cuda_emu/check_mma.cpp checks them against plain matrix products.
 */
#pragma once

#include "common.cuh"

static __device__ __forceinline__ unsigned kiln_pack_bf16(float lo, float hi) {
    return (unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(lo)) |
           (unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(hi)) << 16;
}

#ifdef KILN_HOST_EMU
#define kiln_mma_bf16(d, a, b, c) emu_mma_m16n8k16_bf16(EMU_SITE, d, a, b, c)
#define kiln_ldmatrix_x4(r, p) emu_ldmatrix(EMU_SITE, r, 4, false, p)
#define kiln_ldmatrix_x2(r, p) emu_ldmatrix(EMU_SITE, r, 2, false, p)
#define kiln_ldmatrix_x4_trans(r, p) emu_ldmatrix(EMU_SITE, r, 4, true, p)
#define kiln_ldmatrix_x2_trans(r, p) emu_ldmatrix(EMU_SITE, r, 2, true, p)
#else
static __device__ __forceinline__ void kiln_mma_bf16(float *d, const unsigned *a, const unsigned *b, const float *c) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%10, %11, %12, %13};"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
                   "f"(c[2]), "f"(c[3]));
}

/* the shared-window address of a generic pointer into shared memory */
static __device__ __forceinline__ unsigned kiln_smem_addr(const void *p) {
    return (unsigned)__cvta_generic_to_shared(p);
}

static __device__ __forceinline__ void kiln_ldmatrix_x4(unsigned *r, const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(kiln_smem_addr(p)));
}
static __device__ __forceinline__ void kiln_ldmatrix_x2(unsigned *r, const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(kiln_smem_addr(p)));
}
static __device__ __forceinline__ void kiln_ldmatrix_x4_trans(unsigned *r, const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(kiln_smem_addr(p)));
}
static __device__ __forceinline__ void kiln_ldmatrix_x2_trans(unsigned *r, const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(kiln_smem_addr(p)));
}
#endif
