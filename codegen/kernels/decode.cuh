// codegen/kernels/decode.cuh: attention_decode's attention over the KV caches (after
// codegen/cuda_attention.c's kv_write has put the new rows in), instantiated there.
// Semantics are runtime/cpu/attention.c's: query row i of slice bh, at position
// pos[0] + i, sees cache rows 0..pos[0] + i of kv slice bh / G; o = softmax(q k^T scale) v.
//
// Flash-decoding within a block: one block of NW warps per query row (blockIdx.x =
// bh * TQ + i), which is all a decode step has (TQ is 1 or a few). The visible cache rows
// are split into NW contiguous chunks, warp w the w-th. A warp walks its chunk key by key,
// lanes over the head dims (coalesced rows of k and v), the dot product by a warp sum,
// with an online softmax (running max m, sum l) rescaling its f32 accumulator of p v.
// Then warp 0 combines the warps' (m, l, acc) in warp order 0..NW-1 through shared
// memory: one order fixed by the shapes, so bitwise reproducible. A warp whose chunk is
// empty (fewer visible rows than warps) contributes nothing; every row sees row 0, so L > 0.
#pragma once
#include "prelude.cuh"

template <int TQ, int S, int D, int DV, int G, int NW, class TQT, class TK, class TV, class TO>
__device__ __forceinline__ void fs_attn_decode(const TQT *__restrict__ q, const TK *__restrict__ kc,
                                               const TV *__restrict__ vc, const int *__restrict__ pos,
                                               TO *__restrict__ o, float scale)
{
    constexpr int CD = (D + 31) / 32, CV = (DV + 31) / 32;
    __shared__ float sm[NW], sl[NW], sacc[NW][CV * 32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const long long row = blockIdx.x, kv = row / TQ / G * S;  // kv: the slice's first cache row
    const int n = min(S, pos[0] + (int)(row % TQ) + 1);     // the visible cache rows
    const int chunk = (n + NW - 1) / NW, j0 = min(n, warp * chunk), j1 = min(n, j0 + chunk);
    float qr[CD], acc[CV], m = __int_as_float(0xff800000u), l = 0.f;
#pragma unroll
    for (int c = 0; c < CD; c++) qr[c] = lane + 32 * c < D ? ld(q, row * D + lane + 32 * c) : 0.f;
#pragma unroll
    for (int c = 0; c < CV; c++) acc[c] = 0.f;
    for (int j = j0; j < j1; j++) {
        float s = 0.f;
#pragma unroll
        for (int c = 0; c < CD; c++)
            if (lane + 32 * c < D) s += qr[c] * ld(kc, (kv + j) * D + lane + 32 * c);
        s = fs_warp_sum(s) * scale;
        const float mx = fmaxf(m, s), corr = expf(m - mx), p = expf(s - mx);  // the first key: corr = 0
        l = l * corr + p, m = mx;
#pragma unroll
        for (int c = 0; c < CV; c++)
            acc[c] = acc[c] * corr + (lane + 32 * c < DV ? p * ld(vc, (kv + j) * DV + lane + 32 * c) : 0.f);
    }
    if (lane == 0) sm[warp] = m, sl[warp] = l;
#pragma unroll
    for (int c = 0; c < CV; c++) sacc[warp][lane + 32 * c] = acc[c];
    __syncthreads();
    if (warp) return;
    float M = sm[0], L = 0.f, out[CV];
    for (int w = 1; w < NW; w++) M = fmaxf(M, sm[w]);
#pragma unroll
    for (int c = 0; c < CV; c++) out[c] = 0.f;
    for (int w = 0; w < NW; w++) {
        if (!(sl[w] > 0.f)) continue;  // an empty chunk
        const float f = expf(sm[w] - M);
        L += sl[w] * f;
#pragma unroll
        for (int c = 0; c < CV; c++) out[c] += sacc[w][lane + 32 * c] * f;
    }
#pragma unroll
    for (int c = 0; c < CV; c++)
        if (lane + 32 * c < DV) st(o, row * DV + lane + 32 * c, out[c] / L);
}
