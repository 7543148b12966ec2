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

#define PAR_MIN 8192  // elements of work below which a loop stays serial

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

/* For the small math helpers that loops must inline to vectorize (fexp, the 16-bit
 * conversions): GCC's inliner gives up on them in files with many callers. */
#if defined(__GNUC__)
#define KINLINE static inline __attribute__((always_inline))
#else
#define KINLINE static inline
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

KINLINE float fexp(float x)
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

KINLINE float fsigmoid(float x) { return 1.0f / (1.0f + fexp(-x)); }

/* tanh-GELU: 0.5 x (1 + tanh(u)) = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3); the
 * sigmoid form needs one exp and has no cancellation. (elementwise.c's gelu and gelu_bwd,
 * epilogue.c's GEMM epilogues.) */
#define GELU_K 0.7978845608028654f  // sqrt(2 / pi)
#define GELU_C 0.044715f

KINLINE float geluf(float x) { return x * fsigmoid(2.0f * GELU_K * (x + GELU_C * x * x * x)); }

/* d/dx: 0.5 (1 + t) + 0.5 x (1 - t^2) u' with t = tanh(u) = 2s - 1, s = sigmoid(2u). */
KINLINE float gelu_gradf(float x)
{
    float s = fsigmoid(2.0f * GELU_K * (x + GELU_C * x * x * x));
    return s + 2.0f * x * s * (1.0f - s) * GELU_K * (1.0f + 3.0f * GELU_C * x * x);
}

/* ---- 16-bit storage ------------------------------------------------------------------
 * f16 and bf16 to and from f32, rounding to nearest even (PyTorch's .half() and
 * .bfloat16(), NaN stays NaN with its payload, overflow goes to infinity). Branch-free,
 * so loops over them vectorize; cast.c's cpu_f32_to_f16 and friends are these. The f16
 * cases are merged with masks, not ?: — GCC would sink the subnormal case's float
 * arithmetic into a branch (it may trap, so it cannot run it unconditionally) and then
 * leave the loop scalar. */
#define KMASK(c) (0u - (uint32_t)(c))  // all ones where c holds

KINLINE float ld_bf16(uint16_t h) { return bitsf((int32_t)((uint32_t)h << 16)); }

KINLINE float ld_f16(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, a = h & 0x7fffu;
    uint32_t sub = (uint32_t)fbits((float)(int32_t)a * 0x1p-24f);  // subnormal: exact
    uint32_t m = KMASK(a >= 0x7c00u), r = (((a << 13) | 0x7f800000u) & m) | (((a << 13) + 0x38000000u) & ~m);  // inf/NaN, or rebias
    m = KMASK(a < 0x0400u);
    return bitsf((int32_t)(sign | (sub & m) | (r & ~m)));
}

KINLINE uint16_t st_bf16(float f)
{
    uint32_t u = (uint32_t)fbits(f);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : r);  // NaN: quiet it
}

KINLINE uint16_t st_f16(float f)
{
    uint32_t u = (uint32_t)fbits(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    uint32_t r = a - 0x38000000u, h = (r + 0x0fffu + ((r >> 13) & 1u)) >> 13;  // normal: rebias, round
    /* Below 2^-14: |f| 2^24 rounded to an integer by adding 2^23 (exact scaling, one rounding). */
    uint32_t sub = (uint32_t)fbits(bitsf((int32_t)a) * 0x1p24f + 0x1p23f) - 0x4b000000u;
    uint32_t m = KMASK(a < 0x38800000u);
    h = (sub & m) | (h & ~m);
    m = KMASK(a >= 0x477ff000u);  // rounds to infinity
    h = (0x7c00u & m) | (h & ~m);
    m = KMASK(a > 0x7f800000u);  // NaN
    h = ((0x7e00u | ((a >> 13) & 0x3ffu)) & m) | (h & ~m);
    return (uint16_t)(sign | h);
}

static inline int lowp(int dtype) { return dtype == KT_F16 || dtype == KT_BF16; }

/* Whether any tensor of the call is stored in 16 bits. */
static inline int lowp_call(const KCall *k)
{
    for (int i = 0; i < k->n_in; i++)
        if (lowp(k->in[i].dtype)) return 1;
    for (int i = 0; i < k->n_out; i++)
        if (lowp(k->out[i].dtype)) return 1;
    return 0;
}

/* runtime/cpu/lowp.c: conversions of runs of elements, and 16-bit calls run as f32
 * calls on staged copies. */
void to_f32(float *dst, const void *src, int dtype, int64_t at, int64_t n);       // src[at, at + n) -> dst
void from_f32(void *dst, int dtype, int64_t at, const float *src, int64_t n);     // src -> dst[at, at + n)
void add_to_f32(float *acc, const void *src, int dtype, int64_t at, int64_t n);   // acc += src[at, at + n)
void to_f32_par(float *dst, const void *src, int dtype, int64_t at, int64_t n);   // the same, in parallel
void from_f32_par(void *dst, int dtype, int64_t at, const float *src, int64_t n);
float kload(const KTensor *t, int64_t i);  // one element as f32 (scalars)

/* How a kernel that works independently on slabs runs in 16 bits: every tensor is
 * (outer, slab) with the slab from some dim to the last, the same outer for all, and
 * the f32 kernel runs on f32 copies of as many whole slabs as fit the workspace (f32
 * and i32 tensors are not copied: the call sees the slabs where they lie). */
enum { SLAB_WHOLE = 0, SLAB_AXIS = -1 };  // else: the slab is the last n dims
typedef struct {
    int8_t at[2 * K_MAX_TENSORS];  // per tensor, inputs then outputs: SLAB_WHOLE (no outer),
                                   // SLAB_AXIS (from the call's axis), n (the last n dims)
    int axis;                      // the attribute holding the axis, or -1
} Slabs;
void slab_run(const KCall *k, const Slabs *s, CpuKernel f32);
CpuWork slab_work(const KCall *k, const Slabs *s);

/* Workspace per thread for kernels that stage a row each: the threads that fit. */
static inline int work_threads(const KCall *k, size_t per, const char *op)
{
    KCHECK(k->work && k->work_floats >= per, "%s: a 16-bit call needs a workspace of %zu floats, has %zu", op, per,
           k->work ? k->work_floats : 0);
    size_t n = k->work_floats / per;
    return n < (size_t)omp_get_max_threads() ? (int)n : omp_get_max_threads();
}

/* The workspace needs of the kernels that use it (table.c maps kernels to them). */
CpuWork cpu_work_matmul(const KCall *k);
CpuWork cpu_work_softmax(const KCall *k);
CpuWork cpu_work_softmax_bwd(const KCall *k);
CpuWork cpu_work_max(const KCall *k);
CpuWork cpu_work_max_bwd(const KCall *k);
CpuWork cpu_work_layernorm(const KCall *k);
CpuWork cpu_work_rmsnorm(const KCall *k);
CpuWork cpu_work_norm_bwd(const KCall *k);
CpuWork cpu_work_cross_entropy(const KCall *k);
CpuWork cpu_work_embedding_bwd(const KCall *k);
CpuWork cpu_work_attention(const KCall *k);
CpuWork cpu_work_attention_bwd(const KCall *k);
CpuWork cpu_work_attention_qkv(const KCall *k);
CpuWork cpu_work_attention_qkv_bwd(const KCall *k);
CpuWork cpu_work_attention_rows(const KCall *k);
CpuWork cpu_work_attention_rows_bwd(const KCall *k);
CpuWork cpu_work_rope_rows(const KCall *k);
CpuWork cpu_work_rope(const KCall *k);
CpuWork cpu_work_rope_at(const KCall *k);
CpuWork cpu_work_attention_masked(const KCall *k);
CpuWork cpu_work_attention_masked_bwd(const KCall *k);
CpuWork cpu_work_attention_qkv_masked(const KCall *k);
CpuWork cpu_work_attention_qkv_masked_bwd(const KCall *k);
CpuWork cpu_work_epilogue(const KCall *k);  // the GEMM epilogue ops: their product's

/* matmul.c: matmul with an epilogue: fn runs on the f32 values of C before they are stored
 * (rounded once to C's dtype), n of them from C's flat element `at`, inside one row. */
typedef struct {
    void (*fn)(const void *ctx, float *c, int64_t at, int64_t n);
    const void *ctx;
} CpuMmEpi;
void cpu_matmul_epi(const KCall *k, const CpuMmEpi *e);

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
