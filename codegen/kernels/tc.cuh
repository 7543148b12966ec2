// codegen/kernels/tc.cuh: what a fast kernel is made of, as small __device__ functions:
// the tensor-core multiply-adds (mma.sync), the shared-memory matrix loads that feed them
// (ldmatrix), the asynchronous global-to-shared copies (cp.async with commit and wait
// groups), 128-bit vector loads and stores, and the rounding of an f32 to tf32.
//
// On a GPU (NVRTC, sm_80 and later) each is one PTX instruction in inline asm. Compiled
// by the CPU emulator (tests/cuda_emu/emu.hpp, which defines FS_CUDA_EMU) each calls
// the emulator's own implementation of that instruction (tests/cuda_emu/emu_tc.hpp,
// whose header says what it models and what not). Either way the fragments are the
// PTX ISA's ("Matrix Fragments for mma.m16n8k16 with floating point type", "... for
// mma.m16n8k8", ldmatrix); with g = lane / 4 and t = lane % 4:
//   m16n8k16 .bf16/.f16, A 16x16 row-major: a[r] holds two elements, the lower column
//     in the low 16 bits, at row g + 8 (r & 1), columns 2t + 8 (r >> 1) + {0, 1};
//   B 16x8 ("col"): b[r] holds rows 2t + 8r + {0, 1} of column g;
//   C and D 16x8 f32: c[i] is row g + 8 (i >> 1), column 2t + (i & 1);
//   m16n8k8 .tf32, A 16x8: a[r] is row g + 8 (r & 1), column t + 4 (r >> 1);
//     B 8x8: b[r] is row t + 4r of column g; C and D as above;
//   ldmatrix .m8n8 .b16 .x1/.x2/.x4: lanes 8i..8i+7 pass the row addresses (16 bytes
//     each, 16-byte aligned, in shared memory) of matrix i; r[i] gets row l / 4, columns
//     2 (l % 4) + {0, 1} of matrix i, the layout of an A or B fragment above; .trans
//     gets rows 2 (l % 4) + {0, 1} of column l / 4.
// Warp-collective functions (fs_mma_*, fs_ldmatrix_*) must be reached by all 32 lanes of
// the warp together.
//
// The module concatenates this file into the plan's CUDA source; it includes nothing and
// needs nothing from the prelude.
#ifndef FS_KERNELS_TC_CUH  // a guard, not #pragma once: the module concatenates this file into its main file
#define FS_KERNELS_TC_CUH

// D = A B + C, bf16 (or f16) inputs, f32 accumulators; d may be c.
__device__ __forceinline__ void fs_mma_m16n8k16_bf16(float d[4], const unsigned a[4], const unsigned b[2],
                                                     const float c[4])
{
#ifdef FS_CUDA_EMU
    emu::mma(emu::MMA_BF16, d, a, b, c);
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%10, %11, %12, %13};\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
                   "f"(c[3]));
#endif
}

__device__ __forceinline__ void fs_mma_m16n8k16_f16(float d[4], const unsigned a[4], const unsigned b[2],
                                                    const float c[4])
{
#ifdef FS_CUDA_EMU
    emu::mma(emu::MMA_F16, d, a, b, c);
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%10, %11, %12, %13};\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
                   "f"(c[3]));
#endif
}

// D = A B + C with tf32 inputs (f32 bit patterns; the low 13 bits are not read).
__device__ __forceinline__ void fs_mma_m16n8k8_tf32(float d[4], const unsigned a[4], const unsigned b[2],
                                                    const float c[4])
{
#ifdef FS_CUDA_EMU
    emu::mma(emu::MMA_TF32, d, a, b, c);
#else
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%10, %11, %12, %13};\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
                   "f"(c[3]));
#endif
}

// f32 rounded to tf32, to nearest with ties away from zero (cvt.rna.tf32.f32), as bits.
__device__ __forceinline__ unsigned fs_to_tf32(float x)
{
#ifdef FS_CUDA_EMU
    unsigned u = __float_as_uint(x);
    if ((u & 0x7f800000u) == 0x7f800000u) return u;  // infinities and NaNs as they are
    return (u + 0x1000u) & 0xffffe000u;
#else
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
    return r;
#endif
}

#ifndef FS_CUDA_EMU
__device__ __forceinline__ unsigned fs_smem_addr(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }
#endif

// ldmatrix: `row` is this lane's row address (lanes 0-7 for x1, 0-15 for x2, all for x4).
__device__ __forceinline__ void fs_ldmatrix_x1(unsigned r[1], const void *row)
{
#ifdef FS_CUDA_EMU
    emu::ldmatrix(r, 1, false, row);
#else
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(fs_smem_addr(row)));
#endif
}

__device__ __forceinline__ void fs_ldmatrix_x2(unsigned r[2], const void *row)
{
#ifdef FS_CUDA_EMU
    emu::ldmatrix(r, 2, false, row);
#else
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(fs_smem_addr(row)));
#endif
}

__device__ __forceinline__ void fs_ldmatrix_x4(unsigned r[4], const void *row)
{
#ifdef FS_CUDA_EMU
    emu::ldmatrix(r, 4, false, row);
#else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(fs_smem_addr(row)));
#endif
}

__device__ __forceinline__ void fs_ldmatrix_x1_trans(unsigned r[1], const void *row)
{
#ifdef FS_CUDA_EMU
    emu::ldmatrix(r, 1, true, row);
#else
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(fs_smem_addr(row)));
#endif
}

__device__ __forceinline__ void fs_ldmatrix_x2_trans(unsigned r[2], const void *row)
{
#ifdef FS_CUDA_EMU
    emu::ldmatrix(r, 2, true, row);
#else
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(fs_smem_addr(row)));
#endif
}

__device__ __forceinline__ void fs_ldmatrix_x4_trans(unsigned r[4], const void *row)
{
#ifdef FS_CUDA_EMU
    emu::ldmatrix(r, 4, true, row);
#else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(fs_smem_addr(row)));
#endif
}

// cp.async.cg of 16 bytes from global src to shared dst, both 16-byte aligned. The bytes
// are there only after a wait that covers the copy's group (and, for other threads,
// after a barrier that follows that wait).
__device__ __forceinline__ void fs_cp_async16(void *dst, const void *src)
{
#ifdef FS_CUDA_EMU
    emu::cp_async(dst, src, 16);
#else
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(fs_smem_addr(dst)), "l"(src) : "memory");
#endif
}

// The same with src_bytes (0 to 16) read from src and the rest of the 16 zero-filled: a
// tile's edge; src is not read at all when src_bytes is 0.
__device__ __forceinline__ void fs_cp_async16_zfill(void *dst, const void *src, int src_bytes)
{
#ifdef FS_CUDA_EMU
    emu::cp_async(dst, src, src_bytes);
#else
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(fs_smem_addr(dst)), "l"(src), "r"(src_bytes)
                 : "memory");
#endif
}

// Closes the thread's open group of copies.
__device__ __forceinline__ void fs_cp_async_commit()
{
#ifdef FS_CUDA_EMU
    emu::cp_async_commit();
#else
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// Waits until at most N of the thread's newest committed groups are still in flight.
template <int N> __device__ __forceinline__ void fs_cp_async_wait()
{
#ifdef FS_CUDA_EMU
    emu::cp_async_wait(N);
#else
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// Waits for every copy of the thread, the open group's included.
__device__ __forceinline__ void fs_cp_async_wait_all()
{
#ifdef FS_CUDA_EMU
    emu::cp_async_wait(-1);
#else
    asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

// 128-bit loads and stores (global or shared; p 16-byte aligned): one vector instruction
// on a GPU, one 16-byte access in the emulator (whose UBSan stops at a misaligned p).
__device__ __forceinline__ uint4 fs_ld128(const void *p) { return *reinterpret_cast<const uint4 *>(p); }
__device__ __forceinline__ void fs_st128(void *p, uint4 v) { *reinterpret_cast<uint4 *>(p) = v; }

#endif
