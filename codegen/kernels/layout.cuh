// codegen/kernels/layout.cuh: the kernels of the ops that move elements without arithmetic
// (copy, reshape, expand, transpose, permute, heads, merge_heads, slice: one gather each;
// split, concat and slice_bwd), instantiated per plan by codegen/cuda_layout.c. They move raw bits (T is
// unsigned int for 4-byte dtypes, unsigned short for 2-byte ones), so one kernel serves every
// dtype of a size. Each is a grid-stride loop over N elements with index type I (int when
// every index fits: codegen/cuda.h's cu_grid, cu_loop and cu_index), on blocks of 256.
#pragma once
#include "index.cuh"

// y[i] = x[AT::of(i)] for the N elements of y; AT an FsIndex (index.cuh).
template <class I, long long N, class AT, class T> __device__ __forceinline__ void fs_gather(const T *x, T *y)
{
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < (I)N; i += (I)gridDim.x * blockDim.x) y[i] = x[AT::of(i)];
}

// Equal parts of x along an axis: output t of y... holds element i of its part (PART
// elements each) from x[AT::of(i) + t STEP], STEP the part's length times the elements after
// the axis. One thread moves element i of every part.
template <class I, long long PART, long long STEP, class AT, class T, class... Y>
__device__ __forceinline__ void fs_split(const T *x, Y *...y)
{
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < (I)PART; i += (I)gridDim.x * blockDim.x) {
        const I at = AT::of(i);
        I off = 0;
        ((y[i] = x[at + off], off += (I)STEP), ...);  // each output in order, the next part's offset
    }
}

// y's element i, (o, a, r) around the axis, from the first of x, xs... whose range along the
// axis, [AT, AT + LEN) then the next LENs', holds a: its element (o, a - AT, r).
template <class I, long long INNER, long long AT, long long LEN, long long... LENS, class T, class X, class... XS>
__device__ __forceinline__ void fs_concat_from(T *y, I i, I o, I a, I r, const X *x, const XS *...xs)
{
    if (a < (I)(AT + LEN)) y[i] = x[(o * (I)LEN + a - (I)AT) * (I)INNER + r];
    else if constexpr (sizeof...(LENS) > 0) fs_concat_from<I, INNER, AT + LEN, LENS...>(y, i, o, a, r, xs...);
}

// y (N elements, seen around the concatenation axis as (outer, AXIS, INNER)) from the parts
// x..., whose lengths along the axis are LENS... (they add up to AXIS).
template <class I, long long N, long long AXIS, long long INNER, long long... LENS, class T, class... X>
__device__ __forceinline__ void fs_concat(T *y, const X *...x)
{
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < (I)N; i += (I)gridDim.x * blockDim.x) {
        const I o = i / (I)(AXIS * INNER), a = i / (I)INNER % (I)AXIS, r = i % (I)INNER;
        fs_concat_from<I, INNER, 0, LENS...>(y, i, o, a, r, x...);
    }
}

// slice's gradient: y (N elements, seen around the slice's axis as (outer, SIZE, INNER)) is
// zero but at positions [START, START + LEN) along the axis, which hold dy's elements. The
// zero is the bit pattern 0, +0.0 in every float dtype.
template <class I, long long N, long long SIZE, long long INNER, long long START, long long LEN, class T>
__device__ __forceinline__ void fs_slice_bwd(const T *dy, T *y)
{
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < (I)N; i += (I)gridDim.x * blockDim.x) {
        const I o = i / (I)(SIZE * INNER), a = i / (I)INNER % (I)SIZE, r = i % (I)INNER;
        y[i] = a >= (I)START && a < (I)(START + LEN) ? dy[(o * (I)LEN + a - (I)START) * (I)INNER + r] : (T)0;
    }
}
