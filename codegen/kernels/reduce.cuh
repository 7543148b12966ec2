// codegen/kernels/reduce.cuh: the reductions (sum, mean, max, sum_to) and the axis ops
// (max_bwd, softmax, softmax_bwd), instantiated per plan by codegen/cuda_reduce.c, which
// groups x's dims and picks each shape's kernel and geometry. Semantics are
// runtime/cpu/reduce.c's. Every sum runs in an order the template arguments fix (shapes
// and launch geometry): bitwise reproducible run to run, though not bitwise the CPU's.
// No atomics.
#pragma once
#include "index.cuh"
#include "rows.cuh"

__device__ __forceinline__ float fs_neg_inf() { return __int_as_float(0xff800000u); }

// A sum (MAX false) or a max: its start, and v folded into acc.
template <bool MAX> __device__ __forceinline__ float fs_fold_init() { return MAX ? fs_neg_inf() : 0.f; }
template <bool MAX> __device__ __forceinline__ void fs_fold(float &acc, float v)
{
    if constexpr (MAX) acc = fmaxf(acc, v);
    else acc += v;
}
// mean's factor; sum and max pass 1 and get no multiply (scale is the entry point's literal).
__device__ __forceinline__ float fs_scaled(float v, float scale) { return scale == 1.0f ? v : v * scale; }

// Nothing reduced: out = x * scale, one thread an element, 256 to a block.
template <long long N, class TX, class TO>
__device__ __forceinline__ void fs_reduce_copy(const TX *__restrict__ x, TO *__restrict__ out, float scale)
{
    const long long e = (long long)blockIdx.x * 256 + threadIdx.x;
    if (e < N) st(out, e, fs_scaled(ld(x, e), scale));
}

// Innermost dims reduced: out[row], one row of FsRow<KIND, NTR> per output element, folds
// the NRED elements at KEPT::of(row) + RED::of(q), its threads strided over q.
template <int KIND, int NTR, bool MAX, long long NOUT, long long NRED, class KEPT, class RED, class TX, class TO>
__device__ __forceinline__ void fs_reduce_runs(const TX *__restrict__ x, TO *__restrict__ out, float scale)
{
    using R = FsRow<KIND, NTR>;
    const R r;
    if (r.past(NOUT)) return;
    const long long xb = KEPT::of(r.row);
    float acc = fs_fold_init<MAX>();
    for (long long q = r.tid; q < NRED; q += NTR) fs_fold<MAX>(acc, ld(x, xb + RED::of(q)));
    if constexpr (MAX) acc = R::max(acc);
    else acc = R::sum(acc);
    if (r.tid == 0) st(out, r.row, fs_scaled(acc, scale));
}

// Innermost dims kept, INNER output columns to an outer index r: a block of 32 x BY
// threads takes 32 adjacent columns of one r (NCB blocks per r), its BY rows of threads
// stride down the reduced index q, and thread row 0 folds the BY partials in order.
// KEPT holds the kept dims but the innermost.
template <bool MAX, long long INNER, long long NCB, long long NRED, int BY, class KEPT, class RED, class TX, class TO>
__device__ __forceinline__ void fs_reduce_cols(const TX *__restrict__ x, TO *__restrict__ out, float scale)
{
    __shared__ float part[BY][33];
    const long long r = blockIdx.x / NCB;
    const long long i = (blockIdx.x % NCB) * 32 + threadIdx.x;
    float acc = fs_fold_init<MAX>();
    if (i < INNER) {
        const long long xb = KEPT::of(r) + i;
        for (long long q = threadIdx.y; q < NRED; q += BY) fs_fold<MAX>(acc, ld(x, xb + RED::of(q)));
    }
    part[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && i < INNER) {
        for (int y = 1; y < BY; y++) fs_fold<MAX>(acc, part[y][threadIdx.x]);
        st(out, r * INNER + i, fs_scaled(acc, scale));
    }
}

// ---- axis ops: x viewed as (OUTER, N, INNER) around the axis ---------------------------
// INNER 1: a row kernel (FsRow) per row of N; else one thread per (outer, inner) column,
// 256 to a block, walking down N.

template <long long OUTER, long long N, long long INNER> struct FsColumn {
    long long t;     // the column, [0, OUTER * INNER)
    long long base;  // its first element; the next ones are INNER apart
    __device__ __forceinline__ FsColumn()
        : t((long long)blockIdx.x * 256 + threadIdx.x), base(t / INNER * (N * INNER) + t % INNER)
    {
    }
    __device__ __forceinline__ bool past() const { return t >= OUTER * INNER; }
};

// max_bwd: dx is dy at the first maximum along the axis, 0 elsewhere; dy holds one
// element per column (or row).
template <long long OUTER, long long N, long long INNER, class TX, class TG, class TD>
__device__ __forceinline__ void fs_max_bwd_cols(const TX *__restrict__ x, const TG *__restrict__ dy,
                                                TD *__restrict__ dx)
{
    const FsColumn<OUTER, N, INNER> col;
    if (col.past()) return;
    float best = ld(x, col.base);
    long long arg = 0;
    for (long long j = 1; j < N; j++) {
        const float v = ld(x, col.base + j * INNER);
        if (v > best) best = v, arg = j;
    }
    const float g = ld(dy, col.t);
    for (long long j = 0; j < N; j++) st(dx, col.base + j * INNER, j == arg ? g : 0.f);
}

// A warp per row, whatever its length: the warp reduces to (max, first index), ties to
// the lower index, and takes lane 0's answer so that every lane agrees even on NaN.
template <int KIND, int NTR, long long ROWS, long long N, class TX, class TG, class TD>
__device__ __forceinline__ void fs_max_bwd_rows(const TX *__restrict__ x, const TG *__restrict__ dy,
                                                TD *__restrict__ dx)
{
    static_assert(KIND == FS_ROW_WARP && NTR == 32, "max_bwd's rows are warps");
    const FsRow<KIND, NTR> r;
    if (r.past(ROWS)) return;
    const long long base = r.row * N;
    float best = 0.f;
    long long arg = N;  // N: this lane has seen nothing yet
    for (long long j = r.tid; j < N; j += 32) {
        const float v = ld(x, base + j);
        if (arg == N || v > best) best = v, arg = j;
    }
    for (int s = 16; s > 0; s >>= 1) {
        const float ob = __shfl_xor_sync(0xffffffffu, best, s);
        const long long oa = __shfl_xor_sync(0xffffffffu, arg, s);
        if (oa != N && (arg == N || ob > best || (ob == best && oa < arg))) best = ob, arg = oa;
    }
    arg = __shfl_sync(0xffffffffu, arg, 0);
    const float g = ld(dy, r.row);
    for (long long j = r.tid; j < N; j += 32) st(dx, base + j, j == arg ? g : 0.f);
}

// softmax: y = exp(x - max) / sum(exp(x - max)), as 1/sum times each term.
template <long long OUTER, long long N, long long INNER, class TX, class TY>
__device__ __forceinline__ void fs_softmax_cols(const TX *__restrict__ x, TY *__restrict__ y)
{
    const FsColumn<OUTER, N, INNER> col;
    if (col.past()) return;
    const long long base = col.base;
    float m = fs_neg_inf();
    for (long long j = 0; j < N; j++) m = fmaxf(m, ld(x, base + j * INNER));
    float s = 0.f;
    for (long long j = 0; j < N; j++) s += expf(ld(x, base + j * INNER) - m);
    const float r = 1.0f / s;
    for (long long j = 0; j < N; j++) st(y, base + j * INNER, expf(ld(x, base + j * INNER) - m) * r);
}

template <int KIND, int NTR, long long ROWS, long long N, class TX, class TY>
__device__ __forceinline__ void fs_softmax_rows(const TX *__restrict__ x, TY *__restrict__ y)
{
    using R = FsRow<KIND, NTR>;
    const R r;
    if (r.past(ROWS)) return;
    const long long base = r.row * N;
    float m = fs_neg_inf();
    for (long long j = r.tid; j < N; j += NTR) m = fmaxf(m, ld(x, base + j));
    m = R::max(m);
    float s = 0.f;
    for (long long j = r.tid; j < N; j += NTR) s += expf(ld(x, base + j) - m);
    const float rs = 1.0f / R::sum(s);
    for (long long j = r.tid; j < N; j += NTR) st(y, base + j, expf(ld(x, base + j) - m) * rs);
}

// softmax_bwd: dx = y * (dy - sum(dy * y)).
template <long long OUTER, long long N, long long INNER, class TY, class TG, class TD>
__device__ __forceinline__ void fs_softmax_bwd_cols(const TY *__restrict__ y, const TG *__restrict__ dy,
                                                    TD *__restrict__ dx)
{
    const FsColumn<OUTER, N, INNER> col;
    if (col.past()) return;
    float s = 0.f;
    for (long long j = 0; j < N; j++) s += ld(y, col.base + j * INNER) * ld(dy, col.base + j * INNER);
    for (long long j = 0; j < N; j++) {
        const long long e = col.base + j * INNER;
        st(dx, e, ld(y, e) * (ld(dy, e) - s));
    }
}

template <int KIND, int NTR, long long ROWS, long long N, class TY, class TG, class TD>
__device__ __forceinline__ void fs_softmax_bwd_rows(const TY *__restrict__ y, const TG *__restrict__ dy,
                                                    TD *__restrict__ dx)
{
    using R = FsRow<KIND, NTR>;
    const R r;
    if (r.past(ROWS)) return;
    const long long base = r.row * N;
    float s = 0.f;
    for (long long j = r.tid; j < N; j += NTR) s += ld(y, base + j) * ld(dy, base + j);
    s = R::sum(s);
    for (long long j = r.tid; j < N; j += NTR) st(dx, base + j, ld(y, base + j) * (ld(dy, base + j) - s));
}

// ---- the gradient norm: one launch per flat unit, then one per 16 units (ops.h's OPS_SUMSQ_CHUNK)

// A double summed over a block of NT threads (a multiple of 32): a shuffle tree per warp,
// then thread 0 adds the warp sums in order. Thread 0 gets the total.
template <int NT> __device__ __forceinline__ double fs_block_dsum(double v)
{
    __shared__ double part[NT / 32];
    for (int s = 16; s > 0; s >>= 1) v += __shfl_xor_sync(0xffffffffu, v, s);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
    __syncthreads();
    double t = 0.0;
    if (threadIdx.x == 0)
        for (int w = 0; w < NT / 32; w++) t += part[w];
    return t;
}

// sumsq_parts: block b writes the sum of squares of x[b CHUNK, min(N, (b + 1) CHUNK)) in f64,
// rounded once; with N 0, block 0 writes 0.
template <int NT, long long N, long long CHUNK, class TX>
__device__ __forceinline__ void fs_sumsq_parts(const TX *__restrict__ x, float *__restrict__ out)
{
    const long long i0 = (long long)blockIdx.x * CHUNK, end = i0 + CHUNK < N ? i0 + CHUNK : N;
    double acc = 0.0;
    for (long long i = i0 + threadIdx.x; i < end; i += NT) {
        const double v = ld(x, i);
        acc += v * v;
    }
    acc = fs_block_dsum<NT>(acc);
    if (threadIdx.x == 0) out[blockIdx.x] = (float)acc;
}

// sum_parts: one block of NT threads adds every element of its inputs (add them in order),
// thread t the elements at t, t + NT, ... of each in f64, then the block's fixed tree.
template <int NT> struct FsSumParts {
    double acc = 0.0;
    __device__ __forceinline__ void add(const float *__restrict__ x, long long n)
    {
        for (long long i = threadIdx.x; i < n; i += NT) acc += x[i];
    }
    __device__ __forceinline__ void store(float *__restrict__ out)
    {
        const double t = fs_block_dsum<NT>(acc);
        if (threadIdx.x == 0) out[0] = (float)t;
    }
};
