// codegen/kernels/attn_layout.cuh: where attention's kernels (flash.cuh, flash_bwd.cuh,
// attention_f32.cuh) find a row of a head. attention's tensors are contiguous slices
// [BH, T, D]; attention_qkv's heads are column ranges of the QKV projection's rows
// [B, T, (NH + 2 NKV) D] and its output's [B, T, NH D] (passes/packed_attn.c). Both are:
// row i of slice s starts s / N * B + s % N * H + i * R elements in, with N the slices a
// batch item holds (1 for the contiguous ones, whose H is then 0).
//
// attention_masked's key mask: one row of S keys per batch item, read by the MPER query
// slices of that item (slice bh reads row bh / MPER). An i32 mask is boolean (0 masks the
// key: bias -inf, else 0), a float one additive (the bias itself; -inf masks the key), the
// bias added to the scaled score q.k scale. MPER = 0: no mask (bias 0, never read).
#pragma once
#include "prelude.cuh"

__device__ __forceinline__ float fs_key_bias(const int *m, long long i)
{
    return m[i] ? 0.f : __int_as_float(0xff800000u);
}
template <class E>
__device__ __forceinline__ float fs_key_bias(const E *m, long long i)
{
    return ld(m, i);
}
// The bias of key j for query slice bh (j < S).
template <int MPER, int S, class M>
__device__ __forceinline__ float fs_key_bias(const M *m, long long bh, int j)
{
    return MPER ? fs_key_bias(m, bh / (MPER ? MPER : 1) * S + j) : 0.f;
}

// NH, QB, QH, QR: q and dq (query slices); NKV, KB, KH, KR: k and dk (kv slices); VB, VH,
// VR: v and dv (kv slices); OB, OH, OR: o and dO (query slices).
template <int NH, long long QB, long long QH, long long QR, int NKV, long long KB, long long KH, long long KR,
          long long VB, long long VH, long long VR, long long OB, long long OH, long long OR>
struct FsAttLay {
    static constexpr long long q_pitch = QR, k_pitch = KR, v_pitch = VR, o_pitch = OR;
    static __device__ __forceinline__ long long q(long long s, long long i)
    {
        return s / NH * QB + s % NH * QH + i * QR;
    }
    static __device__ __forceinline__ long long k(long long s, long long i)
    {
        return s / NKV * KB + s % NKV * KH + i * KR;
    }
    static __device__ __forceinline__ long long v(long long s, long long i)
    {
        return s / NKV * VB + s % NKV * VH + i * VR;
    }
    static __device__ __forceinline__ long long o(long long s, long long i)
    {
        return s / NH * OB + s % NH * OH + i * OR;
    }
};
