// codegen/kernels/fill.cuh: the constants (scalar, full, arange), instantiated per plan by
// codegen/cuda_misc.c with the element count, the index type and the value, which the
// entry point passes as a literal: f32 exactly as the CPU rounds it (runtime/cpu/embed.c),
// an i32 output's as an int.
#pragma once
#include "loop.cuh"

// scalar(value): an f32 [], one thread.
__device__ __forceinline__ void fs_scalar(float *__restrict__ y, float v) { y[0] = v; }

// full(value): v rounded to the output's dtype once (st); an i32 output takes the int.
template <class T> __device__ __forceinline__ void fs_fill_set(T *__restrict__ y, long long i, float v) { st(y, i, v); }
__device__ __forceinline__ void fs_fill_set(int *__restrict__ y, long long i, int v) { y[i] = v; }

template <class I, long long N, class T, class V> __device__ __forceinline__ void fs_full(T *__restrict__ y, V v)
{
    fs_grid_loop<I, N>([&](I i) { fs_fill_set(y, i, v); });
}

// arange(n): i32 0, 1, ..., N - 1.
template <class I, long long N> __device__ __forceinline__ void fs_arange(int *__restrict__ y)
{
    fs_grid_loop<I, N>([&](I i) { y[i] = (int)i; });
}
