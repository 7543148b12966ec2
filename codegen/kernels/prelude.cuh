// codegen/kernels/prelude.cuh: what every kernel of a plan's CUDA module may use. It opens
// every module (codegen/cuda_module.c), and every template file here includes it, so each
// file also compiles alone (nvcc -std=c++17 -I codegen/kernels, or NVRTC).
//
// ld / st move elements between storage and f32 (16-bit: round to nearest even, as the
// CPU backend's st_f16 / st_bf16); fs_rn_* round an f32 through a 16-bit dtype (the value
// a 16-bit tensor would hold); the math helpers are the CPU kernels' formulas
// (runtime/cpu/elementwise.c); block reductions assume 1-D blocks whose size is a
// multiple of 32. The CPU emulator (tests/cuda_emu/emu.hpp) runs this text as it is.
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>

__device__ __forceinline__ float ld(const float *p, long long i) { return p[i]; }
__device__ __forceinline__ float ld(const __half *p, long long i) { return __half2float(p[i]); }
__device__ __forceinline__ float ld(const __nv_bfloat16 *p, long long i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ float ld(const int *p, long long i) { return (float)p[i]; }
__device__ __forceinline__ void st(float *p, long long i, float v) { p[i] = v; }
__device__ __forceinline__ void st(__half *p, long long i, float v) { p[i] = __float2half_rn(v); }
__device__ __forceinline__ void st(__nv_bfloat16 *p, long long i, float v) { p[i] = __float2bfloat16_rn(v); }
__device__ __forceinline__ void st(int *p, long long i, float v) { p[i] = __float2int_rn(v); }
__device__ __forceinline__ float fs_rn_f16(float v) { return __half2float(__float2half_rn(v)); }
__device__ __forceinline__ float fs_rn_bf16(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

__device__ __forceinline__ bool fs_isfinite(float x) { return fabsf(x) <= 3.40282347e38f; }
__device__ __forceinline__ float fs_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
/* tanh-GELU as x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3), and its derivative. */
__device__ __forceinline__ float fs_gelu(float x)
{
    return x * fs_sigmoid(2.0f * 0.7978845608028654f * (x + 0.044715f * x * x * x));
}
__device__ __forceinline__ float fs_gelu_grad(float x)
{
    float s = fs_sigmoid(2.0f * 0.7978845608028654f * (x + 0.044715f * x * x * x));
    return s + 2.0f * x * s * (1.0f - s) * 0.7978845608028654f * (1.0f + 3.0f * 0.044715f * x * x);
}
/* Exact GELU, x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)), and its derivative Phi(x) + x phi(x). */
__device__ __forceinline__ float fs_gelu_erf(float x) { return x * 0.5f * (1.0f + erff(x * 0.70710678118654752f)); }
__device__ __forceinline__ float fs_gelu_erf_grad(float x)
{
    return 0.5f * (1.0f + erff(x * 0.70710678118654752f)) + x * expf(-0.5f * x * x) * 0.39894228040143268f;
}
__device__ __forceinline__ float fs_silu_grad(float x)
{
    float s = fs_sigmoid(x);
    return s * (1.0f + x * (1.0f - s));
}

__device__ __forceinline__ float fs_warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float fs_warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
/* Over a 1-D block of up to 1024 threads (a multiple of 32); every thread gets the
 * result. The first __syncthreads lets calls follow each other on the same scratch. */
__device__ float fs_block_sum(float v)
{
    __shared__ float part[32];
    v = fs_warp_sum(v);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
    __syncthreads();
    v = (threadIdx.x & 31) < (blockDim.x >> 5) ? part[threadIdx.x & 31] : 0.0f;
    return fs_warp_sum(v);
}
__device__ float fs_block_max(float v)
{
    __shared__ float part[32];
    v = fs_warp_max(v);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
    __syncthreads();
    v = (threadIdx.x & 31) < (blockDim.x >> 5) ? part[threadIdx.x & 31] : -__int_as_float(0x7f800000);
    return fs_warp_max(v);
}
