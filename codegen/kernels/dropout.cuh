// codegen/kernels/dropout.cuh: dropout(x, rng; p, key, batch, mb, mbs), instantiated per
// plan by codegen/cuda_dropout.c. runtime/cpu/dropout.c is the reference: element i is
// kept when fs_dropout_keep(seed, step, KEY, base + i, THRESHOLD), ops/philox.h's mask on
// the element's index in the global tensor, and is then x * scale, else x * 0, in f32,
// stored to its dtype once. The rng words (seed low and high, step, data-parallel index)
// are read on the device, so a step needs no host round trip and can be a CUDA graph.
#pragma once
#include "loop.cuh"

// ops/philox.h's text, which every module carries after the prelude (codegen/cuda_module.c
// appends FS_PHILOX_CUDA), defines it; declared here so that this file compiles alone.
__device__ int fs_dropout_keep(unsigned long long seed, unsigned int step, unsigned int op, unsigned long long elem,
                               unsigned long long threshold);

// BATCH: the tensor is micro-batch MB of MBS on data-parallel rank rng[3], N elements
// each, so its elements start at (rng[3] * MBS + MB) * N of the global batch; else at 0.
template <class I, long long N, unsigned int KEY, unsigned long long THRESHOLD, bool BATCH, long long MBS, long long MB,
          class TX, class TY>
__device__ __forceinline__ void fs_dropout(const TX *x, const int *rng, TY *y, float scale)
{
    const unsigned long long seed = (unsigned int)rng[0] | (unsigned long long)(unsigned int)rng[1] << 32;
    const unsigned int step = (unsigned int)rng[2];
    const unsigned long long base = BATCH ? (unsigned long long)(((long long)rng[3] * MBS + MB) * N) : 0ull;
    fs_grid_loop<I, N>([&](I i) {
        st(y, i, ld(x, i) * (fs_dropout_keep(seed, step, KEY, base + (unsigned long long)i, THRESHOLD) ? scale : 0.0f));
    });
}
