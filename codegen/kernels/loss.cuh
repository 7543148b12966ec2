// codegen/kernels/loss.cuh: cross_entropy, its backward, and the two fused (passes/xent.c),
// instantiated by codegen/cuda_loss.c. Semantics are runtime/cpu/embed.c's: logits (ROWS,
// V), i32 targets;
//   loss = mean over the counted rows of logsumexp(row) - row[target]   (an f32 scalar)
//   dlogits = (softmax(row) - onehot(target)) * dloss / rows               (logits' dtype)
// A row whose target is IGNORE (ops.h's ignore_index; OPS_NO_IGNORE, outside i32, when none)
// does not count: its terms and its dlogits are 0 (every row ignored: the loss is 0). The
// count is an exact integer, counted once: the mean kernel counts its blocks of rows, and a
// gradient with an IGNORE reads dloss already divided by the count (the op's per_row:
// ir/grad.c's target_count, fs_target_count here, one block for the whole op).
// Over a row's first W columns (the loss's `valid`: a padded vocabulary's, passes/pad_vocab.c,
// W < V), the rest -inf to the softmax: no part of the loss, dlogits 0 there. Rows are V apart.
// A target outside [0, W) that is not IGNORE is bad data: the kernel traps (the launch fails
// and the runtime reports it) rather than read out of bounds, as the CPU stops.
#pragma once
#include "rows.cuh"

template <long long IGNORE> __host__ __device__ constexpr bool fs_xent_ignores()
{
    return IGNORE >= -2147483648LL && IGNORE <= 2147483647LL;
}
// Whether target t is the ignored one (never, without an IGNORE).
template <long long IGNORE> __device__ __forceinline__ bool fs_xent_ignored(int t)
{
    return fs_xent_ignores<IGNORE>() && t == (int)IGNORE;
}

// A row's logsumexp in one pass: each thread keeps a running max m and a sum s of
// exp(x - m) over its elements (rescaling s when m grows); the row's threads combine
// them, M = max m, S = sum s exp(m - M). logsumexp = M + log S.
template <class R, long long V, class T>
__device__ __forceinline__ void fs_row_lse(const T *__restrict__ lg, long long base, int tid, float &M, float &S)
{
    float m = __int_as_float(0xff800000u), s = 0.f;
    for (long long j = tid; j < V; j += R::NTR) {
        const float v = ld(lg, base + j);
        if (v > m) s = s * expf(m - v) + 1.0f, m = v;
        else s += expf(v - m);
    }
    M = R::max(m);
    S = R::sum(s == 0.f ? 0.f : s * expf(m - M));
}

// Forward, kernel 1, a row kernel over every row: the row's terms, its logsumexp and its
// target's logit (terms: (ROWS, 2) f32, the op's second output).
// An ignored row's threads all return here together (one row's target), before any reduction.
template <int KIND, int NTR, long long ROWS, long long V, long long IGNORE, long long W, class T>
__device__ __forceinline__ void fs_xent_rows(const T *__restrict__ lg, const int *__restrict__ tg,
                                             float *__restrict__ terms)
{
    using R = FsRow<KIND, NTR>;
    const R r;
    if (r.past(ROWS)) return;
    const int t = tg[r.row];
    if (fs_xent_ignored<IGNORE>(t)) {
        if (r.tid == 0) terms[2 * r.row] = terms[2 * r.row + 1] = 0.f;
        return;
    }
    if (t < 0 || t >= W) __trap();
    float M, S;
    fs_row_lse<R, W>(lg, r.row * V, r.tid, M, S);
    if (r.tid == 0) terms[2 * r.row] = M + logf(S), terms[2 * r.row + 1] = ld(lg, r.row * V + t);
}

// Forward, kernel 2, one block of BLOCKS threads (ops/ops.h: OPS_LOSS_BLOCKS): the mean of
// the terms in f64, in the CPU's order: thread b adds its block of rows in row order, then
// thread 0 adds the blocks' sums in order; with an IGNORE, over the rows each block counts
// (tg: the targets; nullptr without).
template <long long ROWS, int BLOCKS, long long IGNORE, class TL>
__device__ __forceinline__ void fs_xent_mean(const float *__restrict__ terms, const int *__restrict__ tg,
                                             TL *__restrict__ loss)
{
    __shared__ double part[BLOCKS];
    __shared__ long long counted[BLOCKS];
    constexpr long long BS = (ROWS + BLOCKS - 1) / BLOCKS;
    const long long b = threadIdx.x, r0 = b * BS < ROWS ? b * BS : ROWS, r1 = (b + 1) * BS < ROWS ? (b + 1) * BS : ROWS;
    double s = 0.0;
    long long n = r1 - r0;
    for (long long r = r0; r < r1; r++) s += (double)terms[2 * r] - (double)terms[2 * r + 1];
    if constexpr (fs_xent_ignores<IGNORE>())
        for (long long r = r0; r < r1; r++) n -= fs_xent_ignored<IGNORE>(tg[r]);
    part[b] = s, counted[b] = n;
    __syncthreads();
    if (b != 0) return;
    s = 0.0, n = 0;
    for (int k = 0; k < BLOCKS; k++) s += part[k], n += counted[k];
    st(loss, 0, n ? (float)(s / (double)n) : 0.f);
}

// target_count: the N targets that are not IGNORE, by one block of 256 threads, into an
// f32 (exact: N < 2^24, each thread's count and every partial sum an integer below it).
template <long long N, long long IGNORE> __device__ __forceinline__ void fs_target_count(const int *__restrict__ tg,
                                                                                          float *__restrict__ out)
{
    int n = 0;
    for (long long j = threadIdx.x; j < N; j += blockDim.x) n += !fs_xent_ignored<IGNORE>(tg[j]);
    const float total = fs_block_sum((float)n);
    if (threadIdx.x == 0) out[0] = total;
}

// One row's dlogits, dx = softmax(row) * g less g at the target: g = dloss / ROWS without an
// IGNORE, dloss itself with one (already each counted row's share); 0 for an ignored row.
// With TERMS, the row's terms too, as fs_xent_rows writes them. dx may be x itself (the
// fused op): each element is read and then written by the one thread that owns it, the
// target's logit too (its terms entry is that thread's), so no thread of the row reads what
// another has overwritten.
template <bool TERMS, class R, long long ROWS, long long V, long long IGNORE, long long W, class T, class TG, class TD>
__device__ __forceinline__ void fs_xent_grad_row(const R &r, const T *x, const int *__restrict__ tg,
                                                 const TG *__restrict__ dloss, TD *dx, float *__restrict__ terms)
{
    const long long base = r.row * V;
    const int t = tg[r.row];
    if (fs_xent_ignored<IGNORE>(t)) {  // the row's threads all return, before any reduction
        if (TERMS && r.tid == 0) terms[2 * r.row] = terms[2 * r.row + 1] = 0.f;
        for (long long j = r.tid; j < V; j += R::NTR) st(dx, base + j, 0.f);
        return;
    }
    if (t < 0 || t >= W) __trap();
    float M, S;
    fs_row_lse<R, W>(x, base, r.tid, M, S);
    const float d = ld(dloss, 0), g = fs_xent_ignores<IGNORE>() ? d : d / (float)ROWS, f = g / S;
    if (TERMS && r.tid == 0) terms[2 * r.row] = M + logf(S);
    for (long long j = r.tid; j < W; j += R::NTR) {
        const float v = ld(x, base + j), p = expf(v - M) * f;
        if (TERMS && j == t) terms[2 * r.row + 1] = v;
        st(dx, base + j, j == t ? p - g : p);
    }
    for (long long j = W + r.tid; j < V; j += R::NTR) st(dx, base + j, 0.f);
}

// Backward, a row kernel over every row.
template <int KIND, int NTR, long long ROWS, long long V, long long IGNORE, long long W, class T, class TG, class TD>
__device__ __forceinline__ void fs_xent_bwd(const T *__restrict__ lg, const int *__restrict__ tg,
                                            const TG *__restrict__ dloss, TD *__restrict__ dx)
{
    const FsRow<KIND, NTR> r;
    if (r.past(ROWS)) return;
    fs_xent_grad_row<false, FsRow<KIND, NTR>, ROWS, V, IGNORE, W>(r, lg, tg, dloss, dx, nullptr);
}

// Fused, kernel 1, a row kernel: the row's terms and its dlogits written over the logits x.
// Kernel 2 is fs_xent_mean.
template <int KIND, int NTR, long long ROWS, long long V, long long IGNORE, long long W, class T, class TG>
__device__ __forceinline__ void fs_xent_fused(T *x, const int *__restrict__ tg, const TG *__restrict__ dloss,
                                              float *__restrict__ terms)
{
    const FsRow<KIND, NTR> r;
    if (r.past(ROWS)) return;
    fs_xent_grad_row<true, FsRow<KIND, NTR>, ROWS, V, IGNORE, W>(r, x, tg, dloss, x, terms);
}
