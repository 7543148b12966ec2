// codegen/kernels/norm.cuh: layernorm and rmsnorm over the last dim, and their backward,
// instantiated per plan by codegen/cuda_norm.c (which says how the work is split and why
// every sum has one order fixed by the shapes). Semantics are runtime/cpu/norm.c's: x is
// (ROWS, C); layernorm takes PyTorch's biased variance in two passes (mean, then the
// centred sum of squares), rstd = 1 / sqrt(var + eps); rmsnorm has mean 0.
#pragma once
#include "rows.cuh"

// The statistics of the row at `base`, reduced over the row's NTR threads by R::sum.
template <class R, bool RMS, long long C, class TX>
__device__ __forceinline__ void fs_norm_stats(const TX *__restrict__ x, long long base, int tid, float eps,
                                              float &mean, float &rstd)
{
    mean = 0.f;
    if constexpr (!RMS) {
        for (long long j = tid; j < C; j += R::NTR) mean += ld(x, base + j);
        mean = R::sum(mean) / (float)C;
    }
    float var = 0.f;
    for (long long j = tid; j < C; j += R::NTR) {
        const float d = ld(x, base + j) - mean;
        var += d * d;
    }
    rstd = 1.0f / sqrtf(R::sum(var) / (float)C + eps);
}

// y = (x - mean) * rstd * w + b; rmsnorm: y = x * rstd * w (b unused).
template <int KIND, int NTR, bool RMS, long long ROWS, long long C, class TX, class TW, class TB, class TY>
__device__ __forceinline__ void fs_norm(const TX *__restrict__ x, const TW *__restrict__ w, const TB *__restrict__ b,
                                        TY *__restrict__ y, float eps)
{
    using R = FsRow<KIND, NTR>;
    const R r;
    if (r.past(ROWS)) return;
    const long long base = r.row * C;
    float mean, rstd;
    fs_norm_stats<R, RMS, C>(x, base, r.tid, eps, mean, rstd);
    for (long long j = r.tid; j < C; j += NTR) {
        if constexpr (RMS) st(y, base + j, ld(x, base + j) * rstd * ld(w, j));
        else st(y, base + j, (ld(x, base + j) - mean) * rstd * ld(w, j) + ld(b, j));
    }
}

// Backward kernel 1, blocks of 256 threads: block p of P takes rows [p ROWS / P, (p+1) ROWS
// / P) (32 to 63 of them), its warps put each row's mean and rstd in shared memory, then
// each thread sums, for its columns and in row order, dy * xhat and dy over the chunk.
// P > 1: the partial sums go to `out` as f32 scratch, P rows of 2C floats (dw's, then
// db's); P = 1: they are dw (`out`) and db.
template <bool RMS, long long ROWS, long long C, long long P, class TX, class TG, class TO, class TB>
__device__ __forceinline__ void fs_norm_bwd_partials(const TX *__restrict__ x, const TG *__restrict__ dy,
                                                     TO *__restrict__ out, TB *__restrict__ db, float eps)
{
    __shared__ float s_mean[64], s_rstd[64];
    const long long p = blockIdx.x, r0 = p * ROWS / P, r1 = (p + 1) * ROWS / P;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (long long r = r0 + warp; r < r1; r += 8) {
        float mean, rstd;
        fs_norm_stats<FsRow<FS_ROW_WARP, 32>, RMS, C>(x, r * C, lane, eps, mean, rstd);
        if (lane == 0) s_mean[r - r0] = mean, s_rstd[r - r0] = rstd;
    }
    __syncthreads();
    for (long long c = threadIdx.x; c < C; c += 256) {
        float aw = 0.f, ab = 0.f;
        for (long long r = r0; r < r1; r++) {
            const float g = ld(dy, r * C + c);
            aw += g * ((ld(x, r * C + c) - s_mean[r - r0]) * s_rstd[r - r0]);
            ab += g;
        }
        if constexpr (P > 1) {
            float *part = reinterpret_cast<float *>(out) + p * (2 * C);
            part[c] = aw;
            if constexpr (!RMS) part[C + c] = ab;
        } else {
            st(out, c, aw);
            if constexpr (!RMS) st(db, c, ab);
        }
    }
}

// Backward kernel 2 (P > 1), blocks of 32 x 8 threads: dw[c] and db[c] add the P partials
// in order, 8 threads down p, whose 8 partial sums are then added in order.
template <bool RMS, long long C, long long P, class TS, class TW, class TB>
__device__ __forceinline__ void fs_norm_bwd_finish(const TS *__restrict__ dx, TW *__restrict__ dw, TB *__restrict__ db)
{
    __shared__ float pw[8][33], pb[8][33];
    const long long c = (long long)blockIdx.x * 32 + threadIdx.x;
    const float *part = reinterpret_cast<const float *>(dx);
    float aw = 0.f, ab = 0.f;
    if (c < C)
        for (long long p = threadIdx.y; p < P; p += 8) aw += part[p * 2 * C + c], ab += part[p * 2 * C + C + c];
    pw[threadIdx.y][threadIdx.x] = aw, pb[threadIdx.y][threadIdx.x] = ab;
    __syncthreads();
    if (threadIdx.y != 0 || c >= C) return;
    for (int y = 1; y < 8; y++) aw += pw[y][threadIdx.x], ab += pb[y][threadIdx.x];
    st(dw, c, aw);
    if constexpr (!RMS) st(db, c, ab);
}

// Backward kernel 3: dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * w, row by
// row with the statistics recomputed (rmsnorm: no mean(g) term). It overwrites kernel 1's
// scratch, which kernel 2 has finished reading. With res (the _add ops' r: a residual
// stream's gradient, never dx's bytes) dx is res + that, summed in f32 and rounded once.
template <int KIND, int NTR, bool RMS, long long ROWS, long long C, class TX, class TW, class TG, class TD,
          class TR = float>
__device__ __forceinline__ void fs_norm_bwd_dx(const TX *__restrict__ x, const TW *__restrict__ w,
                                               const TG *__restrict__ dy, TD *__restrict__ dx, float eps,
                                               const TR *__restrict__ res = nullptr)
{
    using R = FsRow<KIND, NTR>;
    const R r;
    if (r.past(ROWS)) return;
    const long long base = r.row * C;
    float mean, rstd;
    fs_norm_stats<R, RMS, C>(x, base, r.tid, eps, mean, rstd);
    float a = 0.f, b = 0.f;
    for (long long j = r.tid; j < C; j += NTR) {
        const float g = ld(dy, base + j) * ld(w, j), h = (ld(x, base + j) - mean) * rstd;
        a += g, b += g * h;
    }
    a = RMS ? 0.f : R::sum(a) / (float)C;
    b = R::sum(b) / (float)C;
    for (long long j = r.tid; j < C; j += NTR) {
        const float g = ld(dy, base + j) * ld(w, j), h = (ld(x, base + j) - mean) * rstd;
        const float d = rstd * (g - a - h * b);
        st(dx, base + j, res ? ld(res, base + j) + d : d);
    }
}
