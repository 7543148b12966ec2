// codegen/kernels/embed.cuh: embedding, its backward, and rope, instantiated per plan by
// codegen/cuda_embed.c (which says how the work is split and why). Semantics are
// runtime/cpu/embed.c's and attention.c's (rope). An index outside [0, V) is a broken plan
// or bad data: the kernel traps (the launch fails and the runtime reports it) rather than
// read or write out of bounds.
#pragma once
#include "prelude.cuh"

// out [N / C, C] = table [V, C] rows at idx, one thread per output element of blocks of 256;
// the same dtype in and out: no rounding.
template <long long N, long long V, long long C, class T>
__device__ __forceinline__ void fs_embedding(const T *__restrict__ table, const int *__restrict__ idx,
                                             T *__restrict__ out)
{
    const long long e = (long long)blockIdx.x * 256 + threadIdx.x;
    if (e >= N) return;
    const int r = idx[e / C];
    if (r < 0 || r >= V) __trap();
    out[e] = table[(long long)r * C + e % C];
}

// dtable [V, C] = 0, then dy [N, C]'s rows added at idx [N], without atomics, by blocks of 256
// threads: a block owns R rows of the table and 256 columns (block b: rows from b / ceil(C /
// 256) * R, columns from b % ceil(C / 256) * 256), accumulated in shared memory. It scans the
// N indices in tiles of 256: each tile's matches (indices in its rows) are compacted in index
// order (warp ballots, then warp offsets), and thread t adds dy[i, c0 + t] of each match to its
// own column. So every element sums its dy rows in index order, as on the CPU, and rows
// nothing indexes come out 0. INTO (embedding_bwd_into): the sums start from out's own
// elements instead of 0, each read and written back by the one thread that owns it.
template <int R, bool INTO, long long N, long long V, long long C, class TG, class TO>
__device__ __forceinline__ void fs_embedding_bwd_rows(const int *__restrict__ idx, const TG *__restrict__ dy,
                                                      TO *__restrict__ out)
{
    constexpr long long NCB = (C + 255) / 256;  // column blocks
    __shared__ float acc[R][256];
    __shared__ int m_pos[256], m_row[256], w_cnt[8];
    const long long v0 = (long long)(blockIdx.x / NCB) * R;
    const long long col = (long long)(blockIdx.x % NCB) * 256 + threadIdx.x;
    const int t = threadIdx.x, lane = t % 32, warp = t / 32;
    for (int r = 0; r < R; r++) acc[r][t] = INTO && col < C && v0 + r < V ? ld(out, (v0 + r) * C + col) : 0.f;
    for (long long i0 = 0; i0 < N; i0 += 256) {
        int r = -1;
        if (i0 + t < N) {
            const int v = idx[i0 + t];
            if (v < 0 || v >= V) __trap();
            if (v >= v0 && v < v0 + R) r = (int)(v - v0);
        }
        const unsigned hit = __ballot_sync(0xffffffffu, r >= 0);
        if (lane == 0) w_cnt[warp] = __popc(hit);
        __syncthreads();
        int at = 0, total = 0;
        for (int w = 0; w < 8; w++) at += w < warp ? w_cnt[w] : 0, total += w_cnt[w];
        if (r >= 0) {
            const int k = at + __popc(hit & ((1u << lane) - 1u));
            m_pos[k] = t, m_row[k] = r;
        }
        __syncthreads();
        if (col < C)
            for (int k = 0; k < total; k++) acc[m_row[k]][t] += ld(dy, (i0 + m_pos[k]) * C + col);
        __syncthreads();
    }
    if (col < C)
        for (int r = 0; r < R && v0 + r < V; r++) st(out, (v0 + r) * C + col, acc[r][t]);
}

template <int R, long long N, long long V, long long C, class TG, class TO>
__device__ __forceinline__ void fs_embedding_bwd(const int *__restrict__ idx, const TG *__restrict__ dy,
                                                 TO *__restrict__ out)
{
    fs_embedding_bwd_rows<R, false, N, V, C>(idx, dy, out);
}

// embedding_bwd_into: out [V, C] (the acc input's bytes) += dy's rows at idx, in index order.
template <int R, long long N, long long V, long long C, class TG, class TO>
__device__ __forceinline__ void fs_embedding_bwd_into(const int *__restrict__ idx, const TG *__restrict__ dy,
                                                      TO *__restrict__ out)
{
    fs_embedding_bwd_rows<R, true, N, V, C>(idx, dy, out);
}

// y = x [OUTER / N, T, N D] with the pair (i, i + D/2) of each of row t's N heads (INTERLEAVED:
// (2i, 2i + 1)) turned by p * theta^(-2i/D), p = t (AT: pos[0] + t, the i32 position on the
// device), backwards under INVERSE (rope: N = 1; rope_rows: the heads of [B, T, N D] rows).
// Blocks of 256 threads: a thread takes one (t, i) of blockIdx.x's and computes the angle in
// f64 as the CPU does (pow, then cos and sin rounded to f32), then turns that pair in every
// (slice, head) o of the OUTER ones with o = blockIdx.y mod SPLIT (gridDim.y = SPLIT).
template <bool AT, bool INVERSE, bool INTERLEAVED, long long OUTER, int SPLIT, long long T, long long D, long long N,
          class TX, class TY>
__device__ __forceinline__ void fs_rope(const TX *__restrict__ x, const int *__restrict__ pos, TY *__restrict__ y,
                                        double theta)
{
    constexpr long long H = D / 2;
    const long long e = (long long)blockIdx.x * 256 + threadIdx.x;
    if (e >= T * H) return;
    const long long t = e / H, i = e % H;
    long long p = t;
    if constexpr (AT) p = pos[0] + t;
    const double ang = (INVERSE ? -1.0 : 1.0) * (double)p * pow(theta, -2.0 * (double)i / (double)D);
    const float cs = (float)cos(ang), sn = (float)sin(ang);
    for (long long o = blockIdx.y; o < OUTER; o += SPLIT) {
        const long long a = ((o / N) * T + t) * (N * D) + o % N * D + (INTERLEAVED ? 2 * i : i);
        const long long b = a + (INTERLEAVED ? 1 : H);
        const float u = ld(x, a), w = ld(x, b);
        st(y, a, u * cs - w * sn);
        st(y, b, w * cs + u * sn);
    }
}
