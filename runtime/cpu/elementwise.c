/* runtime/cpu/elementwise.c: pointwise kernels: broadcasting binary ops (add sub mul
 * div, f32 and i32), unary ops, the unary ops' backward (x or y, dy) -> dx, and expand.
 *
 * Binary ops broadcast like numpy. A plan drops the output's unit dims and merges
 * neighbours that both operands walk contiguously, so the innermost loop is as long as
 * it can be and each operand's inner stride is 0 (broadcast) or 1; a row function is
 * specialized for each case so the compiler vectorizes it. Work is cut into
 * (row, chunk) tasks so a single long row still spreads over threads.
 *
 * Aliasing: an output may share its buffer with an input of the same shape (each
 * element is read before it is written); it must not overlap a broadcast input.
 */
#include <math.h>
#include <string.h>

#include "cpu_impl.h"

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

/* A row function for the scalar expression `expr` of u (from a) and v (from b). */
#define ROW(fname, T, expr)                                                              \
    KSIMD static void fname(const void *pa, int64_t ia, const void *pb, int64_t ib,      \
                            void *po, int64_t n)                                         \
    {                                                                                    \
        const T *a = pa, *b = pb;                                                        \
        T *o = po;                                                                       \
        if (ia && ib) {                                                                  \
            VEC_LOOP for (int64_t i = 0; i < n; i++) {                        \
                T u = a[i], v = b[i];                                                    \
                o[i] = (expr);                                                           \
            }                                                                            \
        } else if (ia) {                                                                 \
            const T v = b[0];                                                            \
            VEC_LOOP for (int64_t i = 0; i < n; i++) {                        \
                T u = a[i];                                                              \
                o[i] = (expr);                                                           \
            }                                                                            \
        } else if (ib) {                                                                 \
            const T u = a[0];                                                            \
            VEC_LOOP for (int64_t i = 0; i < n; i++) {                        \
                T v = b[i];                                                              \
                o[i] = (expr);                                                           \
            }                                                                            \
        } else {                                                                         \
            const T u = a[0], v = b[0], w = (expr);                                      \
            for (int64_t i = 0; i < n; i++) o[i] = w;                                    \
        }                                                                                \
    }

/* i32 arithmetic wraps like PyTorch's; do it in unsigned to keep it defined. */
#define IWRAP(e) ((int32_t)(uint32_t)(e))

ROW(add_f32, float, u + v)
ROW(sub_f32, float, u - v)
ROW(mul_f32, float, u * v)
ROW(div_f32, float, u / v)
ROW(add_i32, int32_t, IWRAP((uint32_t)u + (uint32_t)v))
ROW(sub_i32, int32_t, IWRAP((uint32_t)u - (uint32_t)v))
ROW(mul_i32, int32_t, IWRAP((uint32_t)u * (uint32_t)v))
ROW(copy_u32, uint32_t, ((void)v, u))

static void binary(const KCall *k, RowFn f32, RowFn i32)
{
    const KTensor *a = &k->in[0], *b = &k->in[1];
    KCHECK(a->dtype == b->dtype && a->dtype == k->out[0].dtype, "binary op: dtypes differ");
    KCHECK(a->dtype == KT_F32 || (a->dtype == KT_I32 && i32), "binary op: unsupported dtype %d", a->dtype);
    broadcast_run(a, b, &k->out[0], a->dtype == KT_F32 ? f32 : i32);
}

void cpu_add(const KCall *k) { binary(k, add_f32, add_i32); }
void cpu_sub(const KCall *k) { binary(k, sub_f32, sub_i32); }
void cpu_mul(const KCall *k) { binary(k, mul_f32, mul_i32); }
void cpu_div(const KCall *k) { binary(k, div_f32, NULL); }

/* expand(x, shape): x broadcast to the output's shape (any 4-byte dtype). */
void cpu_expand(const KCall *k)
{
    KCHECK(esize(k->in[0].dtype) == 4, "expand: unsupported dtype %d", k->in[0].dtype);
    broadcast_run(&k->in[0], &k->in[0], &k->out[0], copy_u32);
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

#define MAP(fname, T, expr)                                                              \
    KSIMD static void fname(const void *px, void *po, int64_t n)                         \
    {                                                                                    \
        const T *x = px;                                                                 \
        T *o = po;                                                                       \
        VEC_LOOP for (int64_t i = 0; i < n; i++) {                            \
            T u = x[i];                                                                  \
            o[i] = (expr);                                                               \
        }                                                                                \
    }

MAP(neg_f32, float, -u)
MAP(neg_i32, int32_t, IWRAP(0u - (uint32_t)u))
MAP(exp_f32, float, fexp(u))
MAP(log_f32, float, logf(u))
MAP(sqrt_f32, float, sqrtf(u))
MAP(rsqrt_f32, float, 1.0f / sqrtf(u))
MAP(tanh_f32, float, tanhf(u))
MAP(sigmoid_f32, float, fsigmoid(u))
MAP(relu_f32, float, u < 0.0f ? 0.0f : u)
MAP(gelu_f32, float, geluf(u))
MAP(silu_f32, float, u * fsigmoid(u))

static void unary(const KCall *k, MapFn fn)
{
    KCHECK(k->in[0].dtype == KT_F32, "unary op: unsupported dtype %d", k->in[0].dtype);
    map_run(&k->in[0], &k->out[0], fn);
}

void cpu_neg(const KCall *k)
{
    KCHECK(k->in[0].dtype == KT_F32 || k->in[0].dtype == KT_I32, "neg: unsupported dtype %d", k->in[0].dtype);
    map_run(&k->in[0], &k->out[0], k->in[0].dtype == KT_F32 ? neg_f32 : neg_i32);
}
void cpu_exp(const KCall *k) { unary(k, exp_f32); }
void cpu_log(const KCall *k) { unary(k, log_f32); }
void cpu_sqrt(const KCall *k) { unary(k, sqrt_f32); }
void cpu_rsqrt(const KCall *k) { unary(k, rsqrt_f32); }
void cpu_tanh(const KCall *k) { unary(k, tanh_f32); }
void cpu_sigmoid(const KCall *k) { unary(k, sigmoid_f32); }
void cpu_relu(const KCall *k) { unary(k, relu_f32); }
void cpu_gelu(const KCall *k) { unary(k, gelu_f32); }
void cpu_silu(const KCall *k) { unary(k, silu_f32); }

/* ---- unary backward: u is x (or the forward's y), v is dy ------------------------ */

ROW(relu_bwd_f32, float, u > 0.0f ? v : 0.0f)
ROW(gelu_bwd_f32, float, v * gelu_gradf(u))
ROW(silu_bwd_f32, float, v * silu_gradf(u))
ROW(tanh_bwd_f32, float, v * (1.0f - u * u))
ROW(sigmoid_bwd_f32, float, v * u * (1.0f - u))
ROW(sqrt_bwd_f32, float, v * 0.5f / u)
ROW(rsqrt_bwd_f32, float, -0.5f * v * u * u * u)

void cpu_relu_bwd(const KCall *k) { binary(k, relu_bwd_f32, NULL); }
void cpu_gelu_bwd(const KCall *k) { binary(k, gelu_bwd_f32, NULL); }
void cpu_silu_bwd(const KCall *k) { binary(k, silu_bwd_f32, NULL); }
void cpu_tanh_bwd(const KCall *k) { binary(k, tanh_bwd_f32, NULL); }
void cpu_sigmoid_bwd(const KCall *k) { binary(k, sigmoid_bwd_f32, NULL); }
void cpu_sqrt_bwd(const KCall *k) { binary(k, sqrt_bwd_f32, NULL); }
void cpu_rsqrt_bwd(const KCall *k) { binary(k, rsqrt_bwd_f32, NULL); }
