// codegen/kernels/attn_layout.cuh: where attention's kernels (flash.cuh, flash_bwd.cuh,
// attention_f32.cuh) find a row of a head. attention's tensors are contiguous slices
// [BH, T, D]; attention_qkv's heads are column ranges of the QKV projection's rows
// [B, T, (NH + 2 NKV) D] and its output's [B, T, NH D] (passes/packed_attn.c). Both are:
// row i of slice s starts s / N * B + s % N * H + i * R elements in, with N the slices a
// batch item holds (1 for the contiguous ones, whose H is then 0).
#pragma once

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
