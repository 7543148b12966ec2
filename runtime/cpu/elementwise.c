/* runtime/cpu/elementwise.c: pointwise kernels: broadcasting binary ops (add sub mul
 * div; f32, f16, bf16 and i32), unary ops, the unary ops' backward (x or y, dy) -> dx,
 * and expand.
 *
 * Binary ops broadcast like numpy. A plan drops the output's unit dims and merges
 * neighbours that both operands walk contiguously, so the innermost loop is as long as
 * it can be and each operand's inner stride is 0 (broadcast) or 1; a row function is
 * specialized for each case so the compiler vectorizes it. Work is cut into
 * (row, chunk) tasks so a single long row still spreads over threads. Each float
 * expression has three row functions, one per storage dtype; the 16-bit ones load each
 * element as f32, evaluate the same f32 expression and round the result once.
 *
 * Aliasing: an output may share its buffer with an input of the same shape (each
 * element is read before it is written); it must not overlap a broadcast input.
 */
#include <math.h>
#include <string.h>

#include "cpu_impl.h"
#include "powc.h"

#define CHUNK 8192  // elements of one task

typedef struct {
    int rank;                   // merged dims, innermost first
    int64_t shape[K_MAX_RANK];  // elements along each merged dim
    int64_t sa[K_MAX_RANK];     // element strides of a, 0 where it broadcasts
    int64_t sb[K_MAX_RANK];     // same for b
} Bcast;

/* Strides of t's dims right-aligned to an output of rank r, 0 along broadcast dims. */
static void aligned_strides(const KTensor *t, int r, int64_t *st)
{
    int64_t s = 1;
    for (int i = 1; i <= r; i++) {
        int d = t->rank - i;
        st[r - i] = d >= 0 && t->shape[d] != 1 ? s : 0;
        if (d >= 0) s *= t->shape[d];
    }
}

static void bcast_plan(const KTensor *a, const KTensor *b, const KTensor *o, Bcast *p)
{
    int64_t sa[K_MAX_RANK], sb[K_MAX_RANK];
    KCHECK(a->rank <= o->rank && b->rank <= o->rank, "broadcast: input rank exceeds output rank %d", o->rank);
    aligned_strides(a, o->rank, sa);
    aligned_strides(b, o->rank, sb);
    p->rank = 0;
    for (int d = o->rank - 1; d >= 0; d--) {
        if (o->shape[d] == 1) continue;
        int q = p->rank - 1;
        if (q >= 0 && sa[d] == p->sa[q] * p->shape[q] && sb[d] == p->sb[q] * p->shape[q]) {
            p->shape[q] *= o->shape[d];
            continue;
        }
        p->shape[p->rank] = o->shape[d], p->sa[p->rank] = sa[d], p->sb[p->rank] = sb[d];
        p->rank++;
    }
    if (p->rank == 0) p->shape[0] = 1, p->sa[0] = 0, p->sb[0] = 0, p->rank = 1;
}

/* o[i] = f(a[i * ia], b[i * ib]) for i < n; ia, ib are 0 or 1. */
typedef void (*RowFn)(const void *a, int64_t ia, const void *b, int64_t ib, void *o, int64_t n);

static void broadcast_run(const KTensor *A, const KTensor *B, const KTensor *O, RowFn fn)
{
    Bcast p;
    bcast_plan(A, B, O, &p);
    int esz = esize(O->dtype);
    int64_t n = p.shape[0], rows = O->numel / n, nch = (n + CHUNK - 1) / CHUNK, tasks = rows * nch;
    const char *a = A->data, *b = B->data;
    char *o = O->data;
#pragma omp parallel for if (O->numel > PAR_MIN) schedule(static)
    for (int64_t t = 0; t < tasks; t++) {
        int64_t r = t / nch, c0 = (t % nch) * CHUNK, len = imin(CHUNK, n - c0);
        int64_t oa = c0 * p.sa[0], ob = c0 * p.sb[0], rem = r;
        for (int d = 1; d < p.rank; d++) {
            int64_t i = rem % p.shape[d];
            rem /= p.shape[d];
            oa += i * p.sa[d], ob += i * p.sb[d];
        }
        fn(a + oa * esz, p.sa[0], b + ob * esz, p.sb[0], o + (r * n + c0) * esz, len);
    }
}

/* A row function for the scalar expression `expr` of u (from a) and v (from b), both
 * of type T, in storage of type S: LD turns an S into a T, ST a T into an S. */
#define ROW_AS(fname, S, T, LD, ST, expr)                                                \
    KSIMD static void fname(const void *pa, int64_t ia, const void *pb, int64_t ib,      \
                            void *po, int64_t n)                                         \
    {                                                                                    \
        const S *a = pa, *b = pb;                                                        \
        S *o = po;                                                                       \
        if (ia && ib) {                                                                  \
            VEC_LOOP for (int64_t i = 0; i < n; i++) {                                   \
                T u = LD(a[i]), v = LD(b[i]);                                            \
                o[i] = ST(expr);                                                         \
            }                                                                            \
        } else if (ia) {                                                                 \
            const T v = LD(b[0]);                                                        \
            VEC_LOOP for (int64_t i = 0; i < n; i++) {                                   \
                T u = LD(a[i]);                                                          \
                o[i] = ST(expr);                                                         \
            }                                                                            \
        } else if (ib) {                                                                 \
            const T u = LD(a[0]);                                                        \
            VEC_LOOP for (int64_t i = 0; i < n; i++) {                                   \
                T v = LD(b[i]);                                                          \
                o[i] = ST(expr);                                                         \
            }                                                                            \
        } else {                                                                         \
            const T u = LD(a[0]), v = LD(b[0]);                                          \
            const S w = ST(expr);                                                        \
            for (int64_t i = 0; i < n; i++) o[i] = w;                                    \
        }                                                                                \
    }

#define AS_IS(x) (x)
#define ROW(fname, T, expr) ROW_AS(fname, T, T, AS_IS, AS_IS, expr)

/* The row functions of a float expression, by storage dtype. */
typedef struct {
    RowFn f32, f16, bf16;
} FloatRows;

#define FROWS(name, expr)                                                                \
    ROW(name##_f32, float, expr)                                                         \
    ROW_AS(name##_f16, uint16_t, float, ld_f16, st_f16, expr)                            \
    ROW_AS(name##_bf16, uint16_t, float, ld_bf16, st_bf16, expr)                         \
    static const FloatRows name = {name##_f32, name##_f16, name##_bf16};

/* i32 arithmetic wraps like PyTorch's; do it in unsigned to keep it defined. */
#define IWRAP(e) ((int32_t)(uint32_t)(e))

FROWS(add_rows, u + v)
FROWS(sub_rows, u - v)
FROWS(mul_rows, u * v)
FROWS(div_rows, u / v)
ROW(add_i32, int32_t, IWRAP((uint32_t)u + (uint32_t)v))
ROW(sub_i32, int32_t, IWRAP((uint32_t)u - (uint32_t)v))
ROW(mul_i32, int32_t, IWRAP((uint32_t)u * (uint32_t)v))
ROW(copy_u32, uint32_t, ((void)v, u))
ROW(copy_u16, uint16_t, ((void)v, u))

static RowFn float_row(const FloatRows *f, int dtype)
{
    return dtype == KT_F32 ? f->f32 : dtype == KT_F16 ? f->f16 : dtype == KT_BF16 ? f->bf16 : NULL;
}

static void binary(const KCall *k, const FloatRows *f, RowFn i32)
{
    const KTensor *a = &k->in[0], *b = &k->in[1];
    KCHECK(a->dtype == b->dtype && a->dtype == k->out[0].dtype, "binary op: dtypes differ");
    RowFn fn = a->dtype == KT_I32 ? i32 : float_row(f, a->dtype);
    KCHECK(fn, "binary op: unsupported dtype %d", a->dtype);
    broadcast_run(a, b, &k->out[0], fn);
}

void cpu_add(const KCall *k) { binary(k, &add_rows, add_i32); }
void cpu_sub(const KCall *k) { binary(k, &sub_rows, sub_i32); }
void cpu_mul(const KCall *k) { binary(k, &mul_rows, mul_i32); }
void cpu_div(const KCall *k) { binary(k, &div_rows, NULL); }

/* expand(x, shape): x broadcast to the output's shape (any dtype: bits are copied). */
void cpu_expand(const KCall *k)
{
    broadcast_run(&k->in[0], &k->in[0], &k->out[0], esize(k->in[0].dtype) == 4 ? copy_u32 : copy_u16);
}

/* ---- unary ------------------------------------------------------------------------ */

/* tanh-GELU: 0.5 x (1 + tanh(u)) = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3); the
 * sigmoid form needs one exp and has no cancellation. */
#define GELU_K 0.7978845608028654f  // sqrt(2 / pi)
#define GELU_C 0.044715f

static inline float geluf(float x) { return x * fsigmoid(2.0f * GELU_K * (x + GELU_C * x * x * x)); }

/* d/dx: 0.5 (1 + t) + 0.5 x (1 - t^2) u' with t = tanh(u) = 2s - 1, s = sigmoid(2u). */
static inline float gelu_gradf(float x)
{
    float s = fsigmoid(2.0f * GELU_K * (x + GELU_C * x * x * x));
    return s + 2.0f * x * s * (1.0f - s) * GELU_K * (1.0f + 3.0f * GELU_C * x * x);
}

/* Exact GELU (PyTorch's approximate='none'): x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)), and
 * its derivative Phi(x) + x phi(x), phi(x) = exp(-x^2 / 2) / sqrt(2 pi), as PyTorch writes both. */
#define SQRT1_2 0.70710678118654752f
#define INV_SQRT_2PI 0.39894228040143268f

static inline float gelu_erff(float x) { return x * 0.5f * (1.0f + erff(x * SQRT1_2)); }

static inline float gelu_erf_gradf(float x)
{
    return 0.5f * (1.0f + erff(x * SQRT1_2)) + x * expf(-0.5f * x * x) * INV_SQRT_2PI;
}

static inline float silu_gradf(float x)
{
    float s = fsigmoid(x);
    return s * (1.0f + x * (1.0f - s));
}

typedef void (*MapFn)(const void *x, void *o, int64_t n);

static void map_run(const KTensor *X, const KTensor *O, MapFn fn)
{
    int64_t n = O->numel, tasks = (n + CHUNK - 1) / CHUNK;
    int esz = esize(O->dtype);
    KCHECK(X->numel == n, "unary op: %lld elements in, %lld out", (long long)X->numel, (long long)n);
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
    for (int64_t t = 0; t < tasks; t++) {
        int64_t i0 = t * CHUNK;
        fn((const char *)X->data + i0 * esz, (char *)O->data + i0 * esz, imin(CHUNK, n - i0));
    }
}

#define MAP_AS(fname, S, T, LD, ST, expr)                                                \
    KSIMD static void fname(const void *px, void *po, int64_t n)                         \
    {                                                                                    \
        const S *x = px;                                                                 \
        S *o = po;                                                                       \
        VEC_LOOP for (int64_t i = 0; i < n; i++) {                                       \
            T u = LD(x[i]);                                                              \
            o[i] = ST(expr);                                                             \
        }                                                                                \
    }

typedef struct {
    MapFn f32, f16, bf16;
} FloatMaps;

#define FMAPS(name, expr)                                                                \
    MAP_AS(name##_f32, float, float, AS_IS, AS_IS, expr)                                 \
    MAP_AS(name##_f16, uint16_t, float, ld_f16, st_f16, expr)                            \
    MAP_AS(name##_bf16, uint16_t, float, ld_bf16, st_bf16, expr)                         \
    static const FloatMaps name = {name##_f32, name##_f16, name##_bf16};

FMAPS(neg_maps, -u)
MAP_AS(neg_i32, int32_t, int32_t, AS_IS, AS_IS, IWRAP(0u - (uint32_t)u))
FMAPS(exp_maps, fexp(u))
FMAPS(log_maps, logf(u))
FMAPS(sqrt_maps, sqrtf(u))
FMAPS(rsqrt_maps, 1.0f / sqrtf(u))
FMAPS(tanh_maps, tanhf(u))
FMAPS(sigmoid_maps, fsigmoid(u))
FMAPS(relu_maps, u < 0.0f ? 0.0f : u)
FMAPS(gelu_maps, geluf(u))
FMAPS(gelu_erf_maps, gelu_erff(u))
FMAPS(silu_maps, u * fsigmoid(u))

static void unary(const KCall *k, const FloatMaps *f, MapFn i32)
{
    int dt = k->in[0].dtype;
    MapFn fn = dt == KT_F32 ? f->f32 : dt == KT_F16 ? f->f16 : dt == KT_BF16 ? f->bf16 : dt == KT_I32 ? i32 : NULL;
    KCHECK(fn && k->out[0].dtype == dt, "unary op: unsupported dtypes %d -> %d", dt, k->out[0].dtype);
    map_run(&k->in[0], &k->out[0], fn);
}

void cpu_neg(const KCall *k) { unary(k, &neg_maps, neg_i32); }
void cpu_exp(const KCall *k) { unary(k, &exp_maps, NULL); }
void cpu_log(const KCall *k) { unary(k, &log_maps, NULL); }
void cpu_sqrt(const KCall *k) { unary(k, &sqrt_maps, NULL); }
void cpu_rsqrt(const KCall *k) { unary(k, &rsqrt_maps, NULL); }
void cpu_tanh(const KCall *k) { unary(k, &tanh_maps, NULL); }
void cpu_sigmoid(const KCall *k) { unary(k, &sigmoid_maps, NULL); }
void cpu_relu(const KCall *k) { unary(k, &relu_maps, NULL); }
/* gelu(x, exact): attr[1] picks the erf form. */
void cpu_gelu(const KCall *k) { unary(k, k_int(k, 1) ? &gelu_erf_maps : &gelu_maps, NULL); }
void cpu_silu(const KCall *k) { unary(k, &silu_maps, NULL); }

/* ---- unary backward: u is x (or the forward's y), v is dy ------------------------ */

FROWS(relu_bwd_rows, u > 0.0f ? v : 0.0f)
FROWS(gelu_bwd_rows, v * gelu_gradf(u))
FROWS(gelu_erf_bwd_rows, v * gelu_erf_gradf(u))
FROWS(silu_bwd_rows, v * silu_gradf(u))
FROWS(tanh_bwd_rows, v * (1.0f - u * u))
FROWS(sigmoid_bwd_rows, v * u * (1.0f - u))
FROWS(sqrt_bwd_rows, v * 0.5f / u)
FROWS(rsqrt_bwd_rows, -0.5f * v * u * u * u)

void cpu_relu_bwd(const KCall *k) { binary(k, &relu_bwd_rows, NULL); }
void cpu_gelu_bwd(const KCall *k) { binary(k, k_int(k, 2) ? &gelu_erf_bwd_rows : &gelu_bwd_rows, NULL); }
void cpu_silu_bwd(const KCall *k) { binary(k, &silu_bwd_rows, NULL); }
void cpu_tanh_bwd(const KCall *k) { binary(k, &tanh_bwd_rows, NULL); }
void cpu_sigmoid_bwd(const KCall *k) { binary(k, &sigmoid_bwd_rows, NULL); }
void cpu_sqrt_bwd(const KCall *k) { binary(k, &sqrt_bwd_rows, NULL); }
void cpu_rsqrt_bwd(const KCall *k) { binary(k, &rsqrt_bwd_rows, NULL); }

/* ---- x ** p, p a constant attribute: ops/powc.h's fs_pow, the CUDA kernels' too ---- */

/* o[i] = expr of u = x[i], v = dy[i] (pow passes x as dy) and the exponent p. */
typedef void (*PowFn)(const void *x, const void *dy, void *o, int64_t n, float p);

#define POW_AS(fname, S, LD, ST, expr)                                                   \
    KSIMD static void fname(const void *px, const void *pd, void *po, int64_t n, float p) \
    {                                                                                    \
        const S *x = px, *d = pd;                                                        \
        S *o = po;                                                                       \
        for (int64_t i = 0; i < n; i++) {                                                \
            float u = LD(x[i]), v = LD(d[i]);                                            \
            o[i] = ST(expr);                                                             \
        }                                                                                \
    }

#define POWS(name, expr)                                                                 \
    POW_AS(name##_f32, float, AS_IS, AS_IS, expr)                                        \
    POW_AS(name##_f16, uint16_t, ld_f16, st_f16, expr)                                   \
    POW_AS(name##_bf16, uint16_t, ld_bf16, st_bf16, expr)                                \
    static const PowFn name[3] = {[KT_F32] = name##_f32, [KT_F16] = name##_f16, [KT_BF16] = name##_bf16};

POWS(pow_fns, ((void)v, fs_pow(u, p)))
POWS(pow_bwd_fns, v * fs_pow_grad(u, p))

static void pow_run(const KCall *k, const KTensor *D, float p, const PowFn *f, const char *op)
{
    const KTensor *X = &k->in[0], *O = &k->out[0];
    int dt = X->dtype, esz = esize(dt);
    KCHECK(dt != KT_I32 && O->dtype == dt && O->numel == X->numel && D->dtype == dt && D->numel == X->numel,
           "%s: unsupported dtypes or sizes", op);
    int64_t n = O->numel, tasks = (n + CHUNK - 1) / CHUNK;
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
    for (int64_t t = 0; t < tasks; t++) {
        int64_t i0 = t * CHUNK;
        f[dt]((const char *)X->data + i0 * esz, (const char *)D->data + i0 * esz, (char *)O->data + i0 * esz,
              imin(CHUNK, n - i0), p);
    }
}

/* pow(x, p): attr[1] is p; pow_bwd(x, dy, p): attr[2]. */
void cpu_pow(const KCall *k) { pow_run(k, &k->in[0], (float)k->attr[1], pow_fns, "pow"); }
void cpu_pow_bwd(const KCall *k) { pow_run(k, &k->in[1], (float)k->attr[2], pow_bwd_fns, "pow_bwd"); }
