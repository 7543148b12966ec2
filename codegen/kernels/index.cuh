// codegen/kernels/index.cuh: the offset, in some tensor, of element i of a row-major walk
// over other dims, as a type: FsIndex<FsTerm<OS, SZ, ST>...>::of(i), the sum of its terms
// innermost first. codegen/cuda_module.c (cu_index_at, cu_bcast_at) writes the terms from
// the walk's dims and the tensor's strides along them, after dropping unit dims, merging the
// dims the tensor walks as one and leaving out the broadcast ones (stride 0); so a transpose
// of the last two dims costs one div and mod each. The index type I is the loop's: int when
// every offset a kernel forms fits (codegen/cuda.h: cu_index), so every constant is cast to
// it and the arithmetic stays in I.
#pragma once
#include "prelude.cuh"

// i / OS % SZ * ST, where OS 1 divides by nothing, SZ 0 (the outermost dim, which i never
// passes) wraps at nothing, and ST 1 multiplies by nothing.
template <long long OS, long long SZ, long long ST> struct FsTerm {
    template <class I> static __device__ __forceinline__ I of(I i)
    {
        I q = i;
        if constexpr (OS != 1) q = q / (I)OS;
        if constexpr (SZ != 0) q = q % (I)SZ;
        if constexpr (ST != 1) q = q * (I)ST;
        return q;
    }
};

// The sum of the terms, left to right; 0 with none (every dim broadcast).
template <class... TERMS> struct FsIndex {
    template <class I> static __device__ __forceinline__ I of(I i) { return ((I)0 + ... + TERMS::of(i)); }
};
