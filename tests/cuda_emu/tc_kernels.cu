// tests/cuda_emu/tc_kernels.cu: kernels that use every function of codegen/kernels/tc.cuh,
// and kernels of known memory-access patterns. test_tc.c runs them in the emulator (the
// module is tc.cuh, then this file), checking results against the PTX ISA's layouts and
// the measures against numbers derived by hand; tests/cuda/nvrtc_compile.c compiles the
// same text for sm_80 and sm_90, so what the emulator checks is what a GPU would run.
// Every kernel is one block; fragments move between global memory and registers as
// arrays indexed [lane][element], so the host sees each lane's fragment elements.
#include "tc.cuh"

// d[lane][i] = (A B + C) fragments from a[lane][4], b[lane][2], c[lane][4].
template <int TYPE> __device__ void mma_fragments(const unsigned *a, const unsigned *b, const float *c, float *d)
{
    int l = threadIdx.x;
    unsigned fa[4] = {a[4 * l], a[4 * l + 1], a[4 * l + 2], a[4 * l + 3]}, fb[2] = {b[2 * l], b[2 * l + 1]};
    float fc[4] = {c[4 * l], c[4 * l + 1], c[4 * l + 2], c[4 * l + 3]}, fd[4];
    if (TYPE == 0) fs_mma_m16n8k16_bf16(fd, fa, fb, fc);
    if (TYPE == 1) fs_mma_m16n8k16_f16(fd, fa, fb, fc);
    if (TYPE == 2) fs_mma_m16n8k8_tf32(fd, fa, fb, fc);
    for (int i = 0; i < 4; i++) d[4 * l + i] = fd[i];
}
extern "C" __global__ void tc_mma_bf16(const unsigned *a, const unsigned *b, const float *c, float *d)
{
    mma_fragments<0>(a, b, c, d);
}
extern "C" __global__ void tc_mma_f16(const unsigned *a, const unsigned *b, const float *c, float *d)
{
    mma_fragments<1>(a, b, c, d);
}
extern "C" __global__ void tc_mma_tf32(const unsigned *a, const unsigned *b, const float *c, float *d)
{
    mma_fragments<2>(a, b, c, d);
}

// x: four 8x8 matrices of 16-bit elements, row-major, one after another. They go to
// shared memory with rows 24 elements (48 bytes) apart, then every ldmatrix form reads
// them: out[form][lane][4] (forms x1, x2, x4, then the same .trans; unused slots 0).
// Lane l passes the address of row l % 8 of matrix l / 8.
extern "C" __global__ void tc_ldmatrix(const unsigned short *x, unsigned *out)
{
    __shared__ __align__(16) unsigned short s[32 * 24];
    int l = threadIdx.x;
    for (int e = 0; e < 8; e++) s[l * 24 + e] = x[l * 8 + e];
    __syncthreads();
    const void *row = &s[l * 24];
    unsigned r[6][4] = {};
    fs_ldmatrix_x1(r[0], row);
    fs_ldmatrix_x2(r[1], row);
    fs_ldmatrix_x4(r[2], row);
    fs_ldmatrix_x1_trans(r[3], row);
    fs_ldmatrix_x2_trans(r[4], row);
    fs_ldmatrix_x4_trans(r[5], row);
    for (int f = 0; f < 6; f++)
        for (int i = 0; i < 4; i++) out[(f * 32 + l) * 4 + i] = r[f][i];
}

// Each of 32 threads copies 16 bytes of x into s0 with cp.async and commits (group 0),
// then 16 more into s1 and commits (group 1), waits as WAIT says, and after a barrier
// writes its parts of both buffers out (y[0, 128) = s0, y[128, 256) = s1). WAIT 0: no
// wait (s0 and s1 still poisoned); 1: wait_group 1 (s0 landed, s1 not); 2: wait_all.
// The last two threads' second copies zero-fill: thread 30 reads no byte of x, thread 31
// 8 of its 16.
template <int WAIT> __device__ void cp_async_groups(const float *x, float *y)
{
    __shared__ __align__(16) float s0[128], s1[128];
    int l = threadIdx.x;
    fs_cp_async16(&s0[4 * l], &x[4 * l]);
    fs_cp_async_commit();
    if (l < 30) fs_cp_async16(&s1[4 * l], &x[128 + 4 * l]);
    else fs_cp_async16_zfill(&s1[4 * l], &x[128 + 4 * l], l == 31 ? 8 : 0);
    fs_cp_async_commit();
    if (WAIT == 1) fs_cp_async_wait<1>();
    if (WAIT == 2) fs_cp_async_wait_all();
    __syncthreads();
    for (int i = 0; i < 4; i++) y[4 * l + i] = s0[4 * l + i], y[128 + 4 * l + i] = s1[4 * l + i];
}
extern "C" __global__ void tc_cp_async_nowait(const float *x, float *y) { cp_async_groups<0>(x, y); }
extern "C" __global__ void tc_cp_async_wait1(const float *x, float *y) { cp_async_groups<1>(x, y); }
extern "C" __global__ void tc_cp_async_waitall(const float *x, float *y) { cp_async_groups<2>(x, y); }

// y[i] = x[S i] over 256 threads (8 warps): S = 1 reads coalesced, 2 and 8 stride.
template <int S> __device__ void strided(const float *x, float *y) { y[threadIdx.x] = x[S * threadIdx.x]; }
extern "C" __global__ void tc_stride1(const float *x, float *y) { strided<1>(x, y); }
extern "C" __global__ void tc_stride2(const float *x, float *y) { strided<2>(x, y); }
extern "C" __global__ void tc_stride8(const float *x, float *y) { strided<8>(x, y); }

// The same copy through fs_ld128/fs_st128: each lane 16 bytes, contiguous.
extern "C" __global__ void tc_vector(const float *x, float *y)
{
    fs_st128(&y[4 * threadIdx.x], fs_ld128(&x[4 * threadIdx.x]));
}

// One warp transposes a 32x32 tile through shared memory, lane l owning row l of s:
// the warp's accesses go down a column, 32 rows of PAD + 32 words apart.
template <int PAD> __device__ void transpose(const float *x, float *y)
{
    __shared__ float s[32][32 + PAD];
    int l = threadIdx.x;
    for (int j = 0; j < 32; j++) s[l][j] = x[32 * j + l];
    __syncwarp();
    for (int j = 0; j < 32; j++) y[32 * j + l] = s[j][l] + s[l][j];
}
extern "C" __global__ void tc_banks_conflict(const float *x, float *y) { transpose<0>(x, y); }
extern "C" __global__ void tc_banks_padded(const float *x, float *y) { transpose<1>(x, y); }

// A 200 KiB dynamic shared buffer (above the 48 KiB a launch gets without opting in):
// thread t fills every 256th float from t, then y[t] = the sum of its neighbour's.
extern "C" __global__ void tc_dynamic_shared(const float *x, float *y)
{
    extern __shared__ __align__(16) float dyn[];
    int t = threadIdx.x, n = 200 * 1024 / 4;
    for (int i = t; i < n; i += 256) dyn[i] = x[t] + (float)(i / 256);
    __syncthreads();
    float sum = 0.f;
    for (int i = (t + 1) % 256; i < n; i += 256) sum += dyn[i];
    y[t] = sum;
}
