// codegen/kernels/loop.cuh: the grid-stride loop of kernels over N flat elements
// (codegen/cuda.h: cu_grid gives the launch, cu_index the index type I: int where every
// index stays in 31 bits, else long long).
#pragma once
#include "prelude.cuh"

// f(i) for every i in [0, N), this thread's share of them.
template <class I, long long N, class F> __device__ __forceinline__ void fs_grid_loop(F f)
{
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < N; i += (I)gridDim.x * blockDim.x) f(i);
}
