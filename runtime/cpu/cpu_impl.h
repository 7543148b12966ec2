/* runtime/cpu/cpu_impl.h: what the CPU kernel files share, and nothing else includes.
 *
 * Tensors are contiguous and row-major. A kernel views a tensor around one axis as
 * (outer, n, inner): element (o, j, i) sits at (o * n + j) * inner + i. Loops go
 * parallel only above PAR_MIN elements of work, so tiny tensors never pay for a
 * parallel region. Every reduction runs in an order fixed by the shapes alone, never
 * by the thread count, so results are bitwise reproducible. Exponentials go through
 * fexp, which vectorizes (libm's expf does not without -ffast-math).
 */
#ifndef FS_CPU_IMPL_H
#define FS_CPU_IMPL_H

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels.h"

#define PAR_MIN 32768  // elements of work below which a loop stays serial

#define KPI 3.14159265358979323846

/* Exp-heavy element loops get AVX2 and AVX-512 clones, chosen when the program loads
 * (as PyTorch dispatches at run time); the default build stays baseline x86-64. There
 * is no FMA contraction under -std=c11, so every clone computes the same bits for an
 * element; explicit LANES sums keep the same order too. Put it only on functions
 * without OpenMP regions inside (the outlined bodies would not be cloned). */
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(__clang__)
#define KSIMD __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define KSIMD
#endif

/* Asks GCC to vectorize the loop that follows: at -O2 it vectorizes only loops whose
 * trip count it knows. clang vectorizes such loops by itself, and warns (an error
 * under -Werror) about any it was asked to but cannot, so it gets no request. */
#if defined(__GNUC__) && !defined(__clang__)
#define VEC_LOOP _Pragma("omp simd")
#else
#define VEC_LOOP
#endif

/* A broken call is a bug in the plan or the executor: say where, and stop. */
#define KCHECK(cond, ...)                                                              \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            fprintf(stderr, "%s:%d: cpu kernel: ", __FILE__, __LINE__);                \
            fprintf(stderr, __VA_ARGS__);                                              \
            fputc('\n', stderr);                                                       \
            abort();                                                                   \
        }                                                                              \
    } while (0)

static inline float *fdata(const KTensor *t) { return (float *)t->data; }
static inline int32_t *idata(const KTensor *t) { return (int32_t *)t->data; }

static inline int k_int(const KCall *k, int i) { return (int)k->attr[i]; }

static inline int esize(int dtype) { return dtype == KT_F16 || dtype == KT_BF16 ? 2 : 4; }

/* axis in [-rank, rank) -> [0, rank) */
static inline int norm_axis(int axis, int rank)
{
    int a = axis < 0 ? axis + rank : axis;
    KCHECK(a >= 0 && a < rank, "axis %d out of range for rank %d", axis, rank);
    return a;
}

static inline void around_axis(const KTensor *t, int axis, int64_t *outer, int64_t *n, int64_t *inner)
{
    *outer = 1, *inner = 1;
    for (int d = 0; d < axis; d++) *outer *= t->shape[d];
    for (int d = axis + 1; d < t->rank; d++) *inner *= t->shape[d];
    *n = t->shape[axis];
}

static inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }

/* e^x within 1 ulp (checked over every float in [-104.5, 88.8]): Cephes' polynomial
 * with the exponent set by hand. Written without calls, branches or trapping
 * conversions (the clamp runs on the bits, where compares cannot trap) so that loops
 * over it vectorize under `omp simd` at -O2. Underflows gradually to 0; inf above
 * 88.72; NaN stays NaN. */
typedef union { float f; int32_t i; } FBits;

static inline int32_t fbits(float x) { return (FBits){.f = x}.i; }
static inline float bitsf(int32_t i) { return (FBits){.i = i}.f; }
static inline int32_t ford(int32_t i) { return i ^ (-(int32_t)((uint32_t)i >> 31) & 0x7fffffff); }  // int order = float order
static inline float pow2i(int32_t e) { return bitsf((e + 127) * (1 << 23)); }                       // e in [-126, 127]

static inline float fexp(float x)
{
    int32_t ix = fbits(x), nan = (ix & 0x7fffffff) > 0x7f800000, o = ford(ix);
    int32_t lo = ford(fbits(-104.0f)), hi = ford(fbits(89.0f));
    o = o < lo ? lo : o;
    o = o > hi ? hi : o;
    float c = bitsf(ford(o));
    float n = (c * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round to nearest
    float r = c - n * 0.693359375f + n * 2.12194440e-4f;                // c - n ln2, in two parts
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    int32_t k = (int32_t)n, k1 = k / 2;  // 2^k in two factors: k spans [-150, 128]
    float y = (p * r * r + r + 1.0f) * pow2i(k1) * pow2i(k - k1);
    return bitsf(fbits(y) | (-nan & 0x7fc00000));
}

static inline float fsigmoid(float x) { return 1.0f / (1.0f + fexp(-x)); }

/* Offset of flat index idx over dims (sizes, strides), the last dim fastest. */
static inline int64_t offset_of(int64_t idx, int nd, const int64_t *sizes, const int64_t *strides)
{
    int64_t off = 0;
    for (int d = nd - 1; d >= 0; d--) {
        off += (idx % sizes[d]) * strides[d];
        idx /= sizes[d];
    }
    return off;
}

/* Columns per task when `rows` rows of `inner` columns are cut into (row, columns)
 * tasks: whole rows when there are enough rows to go round. */
static inline int64_t col_chunk(int64_t rows, int64_t inner)
{
    int64_t want = 4 * (int64_t)omp_get_max_threads();
    if (rows >= want) return inner;
    int64_t c = (inner + want - 1) / want;
    return imin(inner, imax(64, (c + 15) / 16 * 16));
}

/* Sums and dots over LANES independent float lanes, added up in a fixed order at the
 * end: vectorizable without -ffast-math, and the same bits on every run. */
#define LANES 16

static inline float vsum(const float *x, int64_t n)
{
    float a[LANES] = {0}, s = 0;
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) a[j] += x[i + j];
    for (; i < n; i++) s += x[i];
    for (int j = 0; j < LANES; j++) s += a[j];
    return s;
}

static inline float vdot(const float *x, const float *y, int64_t n)
{
    float a[LANES] = {0}, s = 0;
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) a[j] += x[i + j] * y[i + j];
    for (; i < n; i++) s += x[i] * y[i];
    for (int j = 0; j < LANES; j++) s += a[j];
    return s;
}

static inline float row_max(const float *x, int64_t n)
{
    float a[LANES], m = -INFINITY;
    int64_t i = 0;
    for (int j = 0; j < LANES; j++) a[j] = -INFINITY;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) a[j] = x[i + j] > a[j] ? x[i + j] : a[j];
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    for (int j = 0; j < LANES; j++) m = a[j] > m ? a[j] : m;
    return m;
}

/* sum((x - m)^2) */
static inline float vsqdev(const float *x, float m, int64_t n)
{
    float a[LANES] = {0}, s = 0;
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) a[j] += (x[i + j] - m) * (x[i + j] - m);
    for (; i < n; i++) s += (x[i] - m) * (x[i] - m);
    for (int j = 0; j < LANES; j++) s += a[j];
    return s;
}

#endif
