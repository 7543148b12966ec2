/* tests/unit/test_cpu_kernels.c: the CPU kernels of runtime/cpu, one call at a time.
 *
 * Forward kernels against hand-computed values and naive double references (numpy
 * broadcasting, torch.matmul's 1-D and batch rules, attention across several tiles);
 * every backward kernel against central differences of its forward kernel; the
 * optimizer steps against a scalar re-implementation; and bitwise determinism of the
 * parallel paths. Output buffers start as NaN, so a kernel that leaves any output
 * element unwritten (or accumulates into it) fails.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "ops.h"
#include "rand.h"
#include "tensors.h"

/* ---- tensors, freed after each test ---------------------------------------------- */

TestSuite(cpu, .fini = tensors_free);

#define NOSHAPE 0, NULL

/* A tensor of NaNs (f32) or of 0x7fc00000 (i32). */
static KTensor ten(int dtype, int rank, const int64_t *shape)
{
    KTensor t = {.dtype = dtype, .rank = rank, .numel = 1};
    for (int d = 0; d < rank; d++) t.shape[d] = shape[d], t.numel *= shape[d];
    uint32_t *p = track((size_t)t.numel * 4);
    for (int64_t i = 0; i < t.numel; i++) p[i] = 0x7fc00000u;
    t.data = p;
    return t;
}

static float *F(const KTensor *t) { return (float *)t->data; }
static int32_t *I(const KTensor *t) { return (int32_t *)t->data; }

static KTensor fvals(int rank, const int64_t *shape, const float *v)
{
    KTensor t = ten(KT_F32, rank, shape);
    memcpy(t.data, v, sizeof(float) * (size_t)t.numel);
    return t;
}

static KTensor ivals(int rank, const int64_t *shape, const int32_t *v)
{
    KTensor t = ten(KT_I32, rank, shape);
    memcpy(t.data, v, sizeof(int32_t) * (size_t)t.numel);
    return t;
}

static KTensor fscalar(float v) { return fvals(NOSHAPE, &v); }
static KTensor iscalar(int32_t v) { return ivals(NOSHAPE, &v); }

/* Uniform in [lo, hi], nudged away from 0 by at least 0.05. */
static KTensor frand(int rank, const int64_t *shape, float lo, float hi)
{
    KTensor t = ten(KT_F32, rank, shape);
    for (int64_t i = 0; i < t.numel; i++) {
        float v = urand(lo, hi);
        F(&t)[i] = fabsf(v) < 0.05f ? (v < 0 ? -0.05f : 0.05f) : v;
    }
    return t;
}

static KTensor like(const KTensor *t) { return ten(t->dtype, t->rank, t->shape); }

static void expect_close(const float *got, const float *want, int64_t n, double tol, const char *what)
{
    for (int64_t i = 0; i < n; i++)
        if (!(fabs((double)got[i] - want[i]) <= tol * (1 + fabs((double)want[i])))) {
            cr_expect_fail("%s[%lld]: got %.7g, want %.7g", what, (long long)i, (double)got[i], (double)want[i]);
            return;
        }
}

static void expect_bits(const KTensor *a, const KTensor *b, const char *what)
{
    cr_expect(a->numel == b->numel && !memcmp(a->data, b->data, (size_t)a->numel * 4), "%s: results differ bitwise", what);
}

/* ---- finite differences ------------------------------------------------------------ */

/* loss = sum(out[o] * w), out from running f on k. */
typedef struct {
    CpuKernel f;
    KCall k;
    int o;
    const float *w;
} Fwd;

static double loss_of(Fwd *c)
{
    c->f(&c->k);
    const KTensor *out = &c->k.out[c->o];
    double s = 0;
    for (int64_t i = 0; i < out->numel; i++) s += (double)F(out)[i] * c->w[i];
    return s;
}

/* grad (n elements) against central differences of the loss in x, at about 40 points. */
static void fd_check(Fwd *c, float *x, int64_t n, const float *grad, double h, double tol, const char *what)
{
    int64_t step = n > 40 ? n / 40 : 1;
    for (int64_t i = 0; i < n; i += step) {
        float x0 = x[i], xp = (float)(x0 + h), xm = (float)(x0 - h);
        x[i] = xp;
        double lp = loss_of(c);
        x[i] = xm;
        double lm = loss_of(c);
        x[i] = x0;
        double num = (lp - lm) / ((double)xp - (double)xm);
        cr_expect(fabs(num - grad[i]) <= tol * (1 + fabs(num)), "%s[%lld]: finite difference %.6g, kernel %.6g", what,
                  (long long)i, num, (double)grad[i]);
    }
    loss_of(c);
}

/* ---- the table ----------------------------------------------------------------------- */

Test(cpu, table_has_every_op)
{
    int n = 0;
#define OP(name, ...) cr_expect(cpu_kernels[n++] == cpu_##name, #name);
#include "ops.def"
#undef OP
    cr_expect_eq(n, cpu_kernel_count);
    cr_expect(cpu_kernel_by_name("attention_bwd") == cpu_attention_bwd);
    cr_expect(cpu_kernel_by_name("matmul") == cpu_matmul);
    cr_expect_null(cpu_kernel_by_name("no_such_op"));
}

/* ---- matmul -------------------------------------------------------------------------- */

/* Naive torch.matmul on op(a), op(b), in double. */
static void matmul_ref(const KTensor *a, const KTensor *b, int ta, int tb, const KTensor *o, float *want)
{
    int ra = a->rank, rb = b->rank;
    int64_t M = ra == 1 ? 1 : a->shape[ra - (ta ? 1 : 2)], K = ra == 1 ? a->shape[0] : a->shape[ra - (ta ? 2 : 1)];
    int64_t N = rb == 1 ? 1 : b->shape[rb - (tb ? 2 : 1)];
    int ba = ra > 2 ? ra - 2 : 0, bb = rb > 2 ? rb - 2 : 0, nb = ba > bb ? ba : bb;
    int64_t nbatch = o->numel / (M * N);
    for (int64_t bi = 0; bi < nbatch; bi++) {
        int64_t rem = bi, offa = 0, offb = 0, sa = M * K, sbb = K * N;
        for (int i = 1; i <= nb; i++) {
            int64_t da = i <= ba ? a->shape[ba - i] : 1, db = i <= bb ? b->shape[bb - i] : 1, dn = da > db ? da : db;
            int64_t c = rem % dn;
            rem /= dn;
            if (da != 1) offa += c * sa;
            if (db != 1) offb += c * sbb;
            sa *= da, sbb *= db;
        }
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) {
                double s = 0;
                for (int64_t kk = 0; kk < K; kk++) {
                    double av = F(a)[offa + (ta ? kk * M + m : m * K + kk)];
                    double bv = rb == 1 ? F(b)[kk] : F(b)[offb + (tb ? n * K + kk : kk * N + n)];
                    s += av * bv;
                }
                want[bi * M * N + m * N + n] = (float)s;
            }
    }
}

static void check_matmul(KTensor a, KTensor b, int ta, int tb, int rank, const int64_t *oshape)
{
    KTensor o = ten(KT_F32, rank, oshape);
    float *want = malloc(sizeof(float) * (size_t)o.numel);
    KCall k = {.n_in = 2, .in = {a, b}, .n_out = 1, .out = {o}, .attr = {0, 0, ta, tb}};
    cpu_matmul(&k);
    matmul_ref(&a, &b, ta, tb, &o, want);
    expect_close(F(&o), want, o.numel, 1e-5, "matmul");
    free(want);
}

Test(cpu, matmul_hand)
{
    KTensor a = fvals(S(2, 3), (float[]){1, 2, 3, 4, 5, 6}), b = fvals(S(3, 2), (float[]){7, 8, 9, 10, 11, 12});
    KTensor o = ten(KT_F32, S(2, 2));
    KCall k = {.n_in = 2, .in = {a, b}, .n_out = 1, .out = {o}};
    cpu_matmul(&k);
    expect_close(F(&o), (float[]){58, 64, 139, 154}, 4, 0, "matmul");
    KTensor bt = fvals(S(2, 3), (float[]){7, 9, 11, 8, 10, 12});  // b stored transposed
    KCall kt = {.n_in = 2, .in = {a, bt}, .n_out = 1, .out = {o}, .attr = {0, 0, 0, 1}};
    cpu_matmul(&kt);
    expect_close(F(&o), (float[]){58, 64, 139, 154}, 4, 0, "matmul tb");
}

Test(cpu, matmul_transposes_and_batches)
{
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            KTensor a = ta ? frand(S(3, 5, 4), -1, 1) : frand(S(3, 4, 5), -1, 1);  // op(a): [3, 4, 5]
            KTensor b = tb ? frand(S(3, 6, 5), -1, 1) : frand(S(3, 5, 6), -1, 1);  // op(b): [3, 5, 6]
            check_matmul(a, b, ta, tb, S(3, 4, 6));
            KTensor b2 = tb ? frand(S(6, 5), -1, 1) : frand(S(5, 6), -1, 1);  // 2-D b: folds unless ta
            check_matmul(a, b2, ta, tb, S(3, 4, 6));
        }
}

Test(cpu, matmul_broadcast_batch)
{
    check_matmul(frand(S(2, 1, 3, 4), -1, 1), frand(S(5, 4, 2), -1, 1), 0, 0, S(2, 5, 3, 2));
    check_matmul(frand(S(3, 4), -1, 1), frand(S(2, 2, 4, 3), -1, 1), 0, 0, S(2, 2, 3, 3));
    check_matmul(frand(S(2, 1, 4, 3), -1, 1), frand(S(1, 3, 2, 4), -1, 1), 1, 1, S(2, 3, 3, 2));
}

Test(cpu, matmul_vectors)
{
    check_matmul(frand(S(4), -1, 1), frand(S(4, 3), -1, 1), 0, 0, S(3));            // [K] @ [K, N]
    check_matmul(frand(S(4), -1, 1), frand(S(2, 4, 3), -1, 1), 0, 0, S(2, 3));      // [K] @ [B, K, N]
    check_matmul(frand(S(3, 4), -1, 1), frand(S(4), -1, 1), 0, 0, S(3));            // [M, K] @ [K]
    check_matmul(frand(S(2, 3, 4), -1, 1), frand(S(4), -1, 1), 0, 0, S(2, 3));      // [B, M, K] @ [K]
    check_matmul(frand(S(4, 3), -1, 1), frand(S(4), -1, 1), 1, 0, S(3));            // [K, M]^T @ [K]
    check_matmul(frand(S(4), -1, 1), frand(S(4), -1, 1), 0, 0, NOSHAPE);            // dot
    check_matmul(frand(S(64, 96), -1, 1), frand(S(96, 80), -1, 1), 0, 0, S(64, 80));  // threaded OpenBLAS
}

/* With OpenBLAS on one thread (as fsexec runs it), a large GEMM is split over the OpenMP
 * threads by N, or by M when M is the larger, in every transpose: each against the
 * double reference (as the one-thread product is), the same bits twice at 3 threads. */
Test(cpu, matmul_split_over_threads)
{
    void openblas_set_num_threads(int);
    int openblas_get_num_threads(void);
    int blas = openblas_get_num_threads(), omp = omp_get_max_threads();
    openblas_set_num_threads(1);
    const int64_t shapes[][3] = {{40, 200, 72}, {200, 40, 72}, {37, 131, 90}};  // M, N, K; a ragged last piece
    for (int s = 0; s < 3; s++)
        for (int t = 0; t < 4; t++) {
            int ta = t & 1, tb = t >> 1;
            int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
            KTensor a = ta ? frand(S(K, M), -1, 1) : frand(S(M, K), -1, 1);
            KTensor b = tb ? frand(S(N, K), -1, 1) : frand(S(K, N), -1, 1);
            KTensor o1 = ten(KT_F32, S(M, N)), o3 = ten(KT_F32, S(M, N)), again = ten(KT_F32, S(M, N));
            KCall k1 = {.n_in = 2, .in = {a, b}, .n_out = 1, .out = {o1}, .attr = {0, 0, ta, tb}};
            KCall k3 = k1, k3b = k1;
            k3.out[0] = o3, k3b.out[0] = again;
            omp_set_num_threads(1);
            cpu_matmul(&k1);
            omp_set_num_threads(3);
            cpu_matmul(&k3);
            cpu_matmul(&k3b);
            float *want = malloc(sizeof(float) * (size_t)o3.numel);
            matmul_ref(&a, &b, ta, tb, &o3, want);
            expect_close(F(&o1), want, o1.numel, 1e-5, "matmul on one thread");
            expect_close(F(&o3), want, o3.numel, 1e-5, "split matmul");
            expect_bits(&o3, &again, "split matmul, twice at 3 threads");
            free(want);
        }
    omp_set_num_threads(omp);
    openblas_set_num_threads(blas);
}

/* ---- elementwise -------------------------------------------------------------------- */

/* Index into t of output element oi, numpy broadcasting. */
static int64_t bidx(int64_t oi, const KTensor *o, const KTensor *t)
{
    int64_t idx = 0, st = 1;
    for (int i = 1; i <= o->rank; i++) {
        int64_t c = oi % o->shape[o->rank - i];
        oi /= o->shape[o->rank - i];
        int d = t->rank - i;
        if (d >= 0) {
            if (t->shape[d] != 1) idx += c * st;
            st *= t->shape[d];
        }
    }
    return idx;
}

static void check_binary(int rank_a, const int64_t *sa, int rank_b, const int64_t *sb, int rank, const int64_t *so)
{
    KTensor a = frand(rank_a, sa, -2, 2), b = frand(rank_b, sb, 0.5f, 2), o = ten(KT_F32, rank, so);
    CpuKernel ks[] = {cpu_add, cpu_sub, cpu_mul, cpu_div};
    for (int op = 0; op < 4; op++) {
        KCall k = {.n_in = 2, .in = {a, b}, .n_out = 1, .out = {o}};
        ks[op](&k);
        for (int64_t i = 0; i < o.numel; i++) {
            float u = F(&a)[bidx(i, &o, &a)], v = F(&b)[bidx(i, &o, &b)];
            float want = op == 0 ? u + v : op == 1 ? u - v : op == 2 ? u * v : u / v;
            cr_expect_eq(F(&o)[i], want, "op %d [%lld]: %g vs %g", op, (long long)i, (double)F(&o)[i], (double)want);
        }
    }
}

Test(cpu, binary_broadcast)
{
    check_binary(S(2, 3), S(2, 3), S(2, 3));
    check_binary(S(2, 3, 4), S(4), S(2, 3, 4));         // bias
    check_binary(S(2, 3, 1), S(4), S(2, 3, 4));
    check_binary(S(3, 1), S(1, 4), S(3, 4));            // outer product
    check_binary(S(2, 1, 4), S(3, 1), S(2, 3, 4));
    check_binary(NOSHAPE, S(2, 3), S(2, 3));            // scalar
    check_binary(S(5, 1, 7), NOSHAPE, S(5, 1, 7));
    check_binary(S(1), S(1), S(1));
    check_binary(S(300, 1, 130), S(1, 4, 130), S(300, 4, 130));  // parallel path
}

Test(cpu, binary_hand)
{
    KTensor a = fvals(S(2, 3), (float[]){1, 2, 3, 4, 5, 6}), b = fvals(S(3), (float[]){10, 20, 30}), o = like(&a);
    KCall k = {.n_in = 2, .in = {a, b}, .n_out = 1, .out = {o}};
    cpu_add(&k);
    expect_close(F(&o), (float[]){11, 22, 33, 14, 25, 36}, 6, 0, "add");
    cpu_div(&k);
    expect_close(F(&o), (float[]){0.1f, 0.1f, 0.1f, 0.4f, 0.25f, 0.2f}, 6, 1e-7, "div");
}

Test(cpu, binary_i32)
{
    KTensor a = ivals(S(2, 2), (int32_t[]){1, -2, 3, 7}), b = ivals(S(2), (int32_t[]){10, 3}), o = like(&a);
    KCall k = {.n_in = 2, .in = {a, b}, .n_out = 1, .out = {o}};
    cpu_add(&k);
    cr_expect(!memcmp(I(&o), (int32_t[]){11, 1, 13, 10}, 16));
    cpu_sub(&k);
    cr_expect(!memcmp(I(&o), (int32_t[]){-9, -5, -7, 4}, 16));
    cpu_mul(&k);
    cr_expect(!memcmp(I(&o), (int32_t[]){10, -6, 30, 21}, 16));
    KCall kn = {.n_in = 1, .in = {a}, .n_out = 1, .out = {o}};
    cpu_neg(&kn);
    cr_expect(!memcmp(I(&o), (int32_t[]){-1, 2, -3, -7}, 16));
}

static double gelu_ref(double x) { return 0.5 * x * (1 + tanh(sqrt(2 / 3.14159265358979323846) * (x + 0.044715 * x * x * x))); }

Test(cpu, unary_values)
{
    const float xs[] = {-2.5f, -1, -0.3f, 0.4f, 1, 3};
    KTensor x = fvals(S(6), xs), o = like(&x);
    struct { CpuKernel f; const char *name; } ops[] = {{cpu_neg, "neg"},   {cpu_exp, "exp"},   {cpu_tanh, "tanh"},
                                                        {cpu_sigmoid, "sigmoid"}, {cpu_relu, "relu"}, {cpu_gelu, "gelu"},
                                                        {cpu_silu, "silu"}};
    for (size_t op = 0; op < sizeof ops / sizeof *ops; op++) {
        KCall k = {.n_in = 1, .in = {x}, .n_out = 1, .out = {o}};
        ops[op].f(&k);
        float want[6];
        for (int i = 0; i < 6; i++) {
            double v = xs[i], s = 1 / (1 + exp(-v));
            double w[] = {-v, exp(v), tanh(v), s, v > 0 ? v : 0, gelu_ref(v), v * s};
            want[i] = (float)w[op];
        }
        expect_close(F(&o), want, 6, 1e-6, ops[op].name);
    }
    KTensor p = fvals(S(3), (float[]){0.25f, 4, 9}), q = like(&p);
    KCall k = {.n_in = 1, .in = {p}, .n_out = 1, .out = {q}};
    cpu_sqrt(&k);
    expect_close(F(&q), (float[]){0.5f, 2, 3}, 3, 1e-7, "sqrt");
    cpu_rsqrt(&k);
    expect_close(F(&q), (float[]){2, 0.5f, 1 / 3.0f}, 3, 1e-7, "rsqrt");
    cpu_log(&k);
    expect_close(F(&q), (float[]){(float)log(0.25), (float)log(4), (float)log(9)}, 3, 1e-7, "log");
    expect_close((float[]){(float)gelu_ref(1)}, (float[]){0.8411920f}, 1, 1e-6, "gelu(1)");
}

/* exp (the kernels' own vectorizable one) within 1 ulp, and the ops built on it at the
 * extremes: no NaN, the right limits. */
Test(cpu, exp_accuracy_and_limits)
{
    enum { N = 4096 };
    KTensor x = ten(KT_F32, S(N)), y = like(&x);
    for (int i = 0; i < N; i++) F(&x)[i] = urand(-87, 88.7f);
    F(&x)[0] = 0, F(&x)[1] = -INFINITY, F(&x)[2] = INFINITY, F(&x)[3] = NAN, F(&x)[4] = 88.8f, F(&x)[5] = -120;
    KCall k = {.n_in = 1, .in = {x}, .n_out = 1, .out = {y}};
    cpu_exp(&k);
    cr_expect(F(&y)[0] == 1 && F(&y)[1] == 0 && isinf(F(&y)[2]) && isnan(F(&y)[3]) && isinf(F(&y)[4]) && F(&y)[5] == 0);
    for (int i = 6; i < N; i++) {
        double want = exp((double)F(&x)[i]);
        cr_expect(fabs(F(&y)[i] - want) <= 1.2e-7 * want, "exp(%.9g) = %.9g, want %.9g", (double)F(&x)[i], (double)F(&y)[i], want);
    }
    KTensor e = fvals(S(2), (float[]){-100, 100}), o = like(&e);
    KCall ke = {.n_in = 1, .in = {e}, .n_out = 1, .out = {o}};
    cpu_sigmoid(&ke);
    expect_close(F(&o), (float[]){0, 1}, 2, 0, "sigmoid limits");
    cpu_gelu(&ke);
    expect_close(F(&o), (float[]){0, 100}, 2, 0, "gelu limits");
    cpu_silu(&ke);
    expect_close(F(&o), (float[]){0, 100}, 2, 0, "silu limits");
}

static void check_unary_bwd(CpuKernel fwd, CpuKernel bwd, int takes_y, float lo, float hi, const char *what)
{
    KTensor x = frand(S(3, 7), lo, hi), y = like(&x), dy = frand(S(3, 7), -1, 1), dx = like(&x);
    Fwd c = {.f = fwd, .k = {.n_in = 1, .in = {x}, .n_out = 1, .out = {y}}, .w = F(&dy)};
    loss_of(&c);
    KCall kb = {.n_in = 2, .in = {takes_y ? y : x, dy}, .n_out = 1, .out = {dx}};
    bwd(&kb);
    fd_check(&c, F(&x), x.numel, F(&dx), 1e-2, 5e-4, what);
}

Test(cpu, unary_bwd_fd)
{
    check_unary_bwd(cpu_relu, cpu_relu_bwd, 0, -2, 2, "relu_bwd");
    check_unary_bwd(cpu_gelu, cpu_gelu_bwd, 0, -3, 3, "gelu_bwd");
    check_unary_bwd(cpu_silu, cpu_silu_bwd, 0, -3, 3, "silu_bwd");
    check_unary_bwd(cpu_tanh, cpu_tanh_bwd, 1, -2, 2, "tanh_bwd");
    check_unary_bwd(cpu_sigmoid, cpu_sigmoid_bwd, 1, -3, 3, "sigmoid_bwd");
    check_unary_bwd(cpu_sqrt, cpu_sqrt_bwd, 1, 0.5f, 3, "sqrt_bwd");
    check_unary_bwd(cpu_rsqrt, cpu_rsqrt_bwd, 1, 0.5f, 3, "rsqrt_bwd");
}

/* ---- reductions ---------------------------------------------------------------------- */

Test(cpu, sum_mean_max_hand)
{
    KTensor x = fvals(S(2, 3), (float[]){1, 5, 3, 4, 2, 6}), o3 = ten(KT_F32, S(3)), o2 = ten(KT_F32, S(2, 1));
    KCall k = {.n_in = 1, .in = {x}, .n_out = 1, .out = {o3}, .attr = {0, 0, 0}};
    cpu_sum(&k);
    expect_close(F(&o3), (float[]){5, 7, 9}, 3, 0, "sum axis 0");
    cpu_mean(&k);
    expect_close(F(&o3), (float[]){2.5f, 3.5f, 4.5f}, 3, 0, "mean axis 0");
    cpu_max(&k);
    expect_close(F(&o3), (float[]){4, 5, 6}, 3, 0, "max axis 0");
    KCall kk = {.n_in = 1, .in = {x}, .n_out = 1, .out = {o2}, .attr = {0, -1, 1}};
    cpu_sum(&kk);
    expect_close(F(&o2), (float[]){9, 12}, 2, 0, "sum axis -1 keepdim");
    cpu_mean(&kk);
    expect_close(F(&o2), (float[]){3, 4}, 2, 1e-7, "mean axis -1");
    cpu_max(&kk);
    expect_close(F(&o2), (float[]){5, 6}, 2, 0, "max axis -1");
}

/* sum, mean and max over each axis of a [4, 5, 6] tensor against loops. */
Test(cpu, reductions_every_axis)
{
    KTensor x = frand(S(4, 5, 6), -1, 1);
    for (int axis = 0; axis < 3; axis++) {
        int64_t shape[2], r = 0;
        for (int d = 0; d < 3; d++)
            if (d != axis) shape[r++] = x.shape[d];
        KTensor o = ten(KT_F32, 2, shape);
        float want[3][64];
        for (int64_t i = 0; i < o.numel; i++) {
            int64_t a = i / shape[1], b = i % shape[1];
            double s = 0, m = -INFINITY;
            for (int64_t j = 0; j < x.shape[axis]; j++) {
                int64_t id[3];
                int q = 0;
                for (int d = 0; d < 3; d++) id[d] = d == axis ? j : q++ == 0 ? a : b;
                double v = F(&x)[(id[0] * 5 + id[1]) * 6 + id[2]];
                s += v, m = v > m ? v : m;
            }
            want[0][i] = (float)s, want[1][i] = (float)(s / (double)x.shape[axis]), want[2][i] = (float)m;
        }
        CpuKernel ks[] = {cpu_sum, cpu_mean, cpu_max};
        for (int op = 0; op < 3; op++) {
            KCall k = {.n_in = 1, .in = {x}, .n_out = 1, .out = {o}, .attr = {0, axis - 3 * (axis == 2), 0}};
            ks[op](&k);
            expect_close(F(&o), want[op], o.numel, 1e-6, "reduction");
        }
    }
}

Test(cpu, max_bwd_fd)
{
    for (int axis = 0; axis < 3; axis++)
        for (int keep = 0; keep < 2; keep++) {
            KTensor x = frand(S(3, 4, 5), -1, 1), dx = like(&x);
            int64_t shape[3];
            int r = 0;
            for (int d = 0; d < 3; d++)
                if (d != axis || keep) shape[r++] = d == axis ? 1 : x.shape[d];
            KTensor y = ten(KT_F32, r, shape), dy = frand(r, shape, -1, 1);
            Fwd c = {.f = cpu_max, .k = {.n_in = 1, .in = {x}, .n_out = 1, .out = {y}, .attr = {0, axis, keep}}, .w = F(&dy)};
            KCall kb = {.n_in = 2, .in = {x, dy}, .n_out = 1, .out = {dx}, .attr = {0, 0, axis, keep}};
            cpu_max_bwd(&kb);
            fd_check(&c, F(&x), x.numel, F(&dx), 1e-3, 1e-4, "max_bwd");
        }
}

Test(cpu, max_bwd_first_of_ties)
{
    KTensor x = fvals(S(1, 4), (float[]){1, 3, 3, 2}), dy = fscalar(5), dx = like(&x);
    dy.rank = 1, dy.shape[0] = 1;
    KCall k = {.n_in = 2, .in = {x, dy}, .n_out = 1, .out = {dx}, .attr = {0, 0, -1, 0}};
    cpu_max_bwd(&k);
    expect_close(F(&dx), (float[]){0, 5, 0, 0}, 4, 0, "max_bwd ties");
}

Test(cpu, softmax_values)
{
    KTensor x = fvals(S(2, 3), (float[]){1, 2, 3, 1000, 1000, 1000}), y = like(&x);
    KCall k = {.n_in = 1, .in = {x}, .n_out = 1, .out = {y}, .attr = {0, -1}};
    cpu_softmax(&k);
    double z = exp(1) + exp(2) + exp(3);
    float want[] = {(float)(exp(1) / z), (float)(exp(2) / z), (float)(exp(3) / z), 1 / 3.0f, 1 / 3.0f, 1 / 3.0f};
    expect_close(F(&y), want, 6, 1e-6, "softmax");
    KCall k0 = {.n_in = 1, .in = {x}, .n_out = 1, .out = {y}, .attr = {0, 0}};
    cpu_softmax(&k0);
    float e = (float)(1 / (1 + exp(999)));  // columns (1, 1000)
    expect_close(F(&y), (float[]){e, e, e, 1 - e, 1 - e, 1 - e}, 6, 1e-6, "softmax axis 0");
}

Test(cpu, softmax_bwd_fd)
{
    for (int axis = -1; axis <= 1; axis++) {
        KTensor x = frand(S(4, 5, 3), -2, 2), y = like(&x), dy = frand(S(4, 5, 3), -1, 1), dx = like(&x);
        Fwd c = {.f = cpu_softmax, .k = {.n_in = 1, .in = {x}, .n_out = 1, .out = {y}, .attr = {0, axis}}, .w = F(&dy)};
        loss_of(&c);
        KCall kb = {.n_in = 2, .in = {y, dy}, .n_out = 1, .out = {dx}, .attr = {0, 0, axis}};
        cpu_softmax_bwd(&kb);
        fd_check(&c, F(&x), x.numel, F(&dx), 1e-2, 5e-4, "softmax_bwd");
    }
}

/* sum_to against loops, and as the adjoint of expand: <expand(a), y> == <a, sum_to(y)>. */
static void check_sum_to(int rank, const int64_t *to)
{
    KTensor y = frand(S(3, 4, 5), -1, 1), s = ten(KT_F32, rank, to), a = frand(rank, to, -1, 1), e = like(&y);
    KCall k = {.n_in = 1, .in = {y}, .n_out = 1, .out = {s}};
    cpu_sum_to(&k);
    float want[64] = {0};
    for (int64_t i = 0; i < y.numel; i++) want[bidx(i, &y, &s)] += F(&y)[i];
    expect_close(F(&s), want, s.numel, 1e-6, "sum_to");
    KCall ke = {.n_in = 1, .in = {a}, .n_out = 1, .out = {e}};
    cpu_expand(&ke);
    double l = 0, r = 0;
    for (int64_t i = 0; i < y.numel; i++) {
        l += (double)F(&e)[i] * F(&y)[i];
        cr_expect_eq(F(&e)[i], F(&a)[bidx(i, &y, &a)]);
    }
    for (int64_t i = 0; i < s.numel; i++) r += (double)F(&a)[i] * F(&s)[i];
    cr_expect(fabs(l - r) < 1e-5, "expand/sum_to not adjoint: %g vs %g", l, r);
}

Test(cpu, sum_to_and_expand)
{
    check_sum_to(S(3, 4, 5));
    check_sum_to(S(5));
    check_sum_to(S(4, 1));
    check_sum_to(S(3, 1, 5));
    check_sum_to(S(1, 4, 1));
    check_sum_to(S(3, 4, 1));
    check_sum_to(NOSHAPE);
}

Test(cpu, sum_to_bias_grad_parallel)
{
    KTensor y = frand(S(64, 8, 77), -1, 1), s = ten(KT_F32, S(77)), s2 = like(&s);
    KCall k = {.n_in = 1, .in = {y}, .n_out = 1, .out = {s}};
    cpu_sum_to(&k);
    float want[77] = {0};
    for (int64_t i = 0; i < y.numel; i++) want[i % 77] += F(&y)[i];
    expect_close(F(&s), want, 77, 1e-5, "sum_to");
    omp_set_num_threads(1);
    k.out[0] = s2;
    cpu_sum_to(&k);
    expect_bits(&s, &s2, "sum_to 1 vs many threads");
}

/* ---- norms --------------------------------------------------------------------------- */

Test(cpu, layernorm_rmsnorm_hand)
{
    KTensor x = fvals(S(1, 4), (float[]){1, 2, 3, 4}), w = fvals(S(4), (float[]){1, 2, 1, 1});
    KTensor b = fvals(S(4), (float[]){0, 0, 0, 1}), y = like(&x);
    KCall k = {.n_in = 3, .in = {x, w, b}, .n_out = 1, .out = {y}, .attr = {0, 0, 0, 1e-5}};
    cpu_layernorm(&k);
    float r = (float)(1 / sqrt(1.25 + 1e-5));
    expect_close(F(&y), (float[]){-1.5f * r, -1.0f * r, 0.5f * r, 1.5f * r + 1}, 4, 1e-6, "layernorm");
    KCall kr = {.n_in = 2, .in = {x, w}, .n_out = 1, .out = {y}, .attr = {0, 0, 1e-5}};
    cpu_rmsnorm(&kr);
    r = (float)(1 / sqrt(7.5 + 1e-5));
    expect_close(F(&y), (float[]){r, 4 * r, 3 * r, 4 * r}, 4, 1e-6, "rmsnorm");
}

static void check_norm_bwd(int rms, int rows, int C)
{
    KTensor x = frand(S(rows, C), -2, 2), w = frand(S(C), 0.5f, 1.5f), b = frand(S(C), -1, 1), y = like(&x);
    KTensor dy = frand(S(rows, C), -1, 1), dx = like(&x), dw = like(&w), db = like(&b);
    Fwd c = {.f = rms ? cpu_rmsnorm : cpu_layernorm, .w = F(&dy)};
    KCall f = {.n_in = 3, .in = {x, w, b}, .n_out = 1, .out = {y}, .attr = {0, 0, 0, 1e-5}};
    KCall fr = {.n_in = 2, .in = {x, w}, .n_out = 1, .out = {y}, .attr = {0, 0, 1e-5}};
    c.k = rms ? fr : f;
    KCall kb = {.n_in = 3, .in = {x, w, dy}, .n_out = 3 - rms, .out = {dx, dw, db}, .attr = {0, 0, 0, 1e-5}};
    (rms ? cpu_rmsnorm_bwd : cpu_layernorm_bwd)(&kb);
    fd_check(&c, F(&x), x.numel, F(&dx), 1e-2, 1e-3, "norm dx");
    fd_check(&c, F(&w), w.numel, F(&dw), 1e-2, 5e-4, "norm dw");
    if (!rms) fd_check(&c, F(&b), b.numel, F(&db), 1e-2, 5e-4, "norm db");
}

Test(cpu, norm_bwd_fd)
{
    check_norm_bwd(0, 6, 10);
    check_norm_bwd(1, 6, 10);
    check_norm_bwd(0, 130, 300);  // parallel passes
    check_norm_bwd(1, 130, 300);
}

/* ---- embedding and the loss ------------------------------------------------------ */

Test(cpu, embedding_hand)
{
    KTensor t = fvals(S(3, 2), (float[]){0, 1, 2, 3, 4, 5}), idx = ivals(S(1, 3), (int32_t[]){2, 0, 2});
    KTensor o = ten(KT_F32, S(1, 3, 2));
    KCall k = {.n_in = 2, .in = {t, idx}, .n_out = 1, .out = {o}};
    cpu_embedding(&k);
    expect_close(F(&o), (float[]){4, 5, 0, 1, 4, 5}, 6, 0, "embedding");
}

Test(cpu, embedding_bwd_fd)
{
    KTensor t = frand(S(7, 5), -1, 1), idx = ivals(S(2, 3), (int32_t[]){3, 0, 3, 6, 3, 1});
    KTensor o = ten(KT_F32, S(2, 3, 5)), dy = frand(S(2, 3, 5), -1, 1), dt = like(&t);
    Fwd c = {.f = cpu_embedding, .k = {.n_in = 2, .in = {t, idx}, .n_out = 1, .out = {o}}, .w = F(&dy)};
    KCall kb = {.n_in = 2, .in = {idx, dy}, .n_out = 1, .out = {dt}, .attr = {0, 0, 7}};
    cpu_embedding_bwd(&kb);
    fd_check(&c, F(&t), t.numel, F(&dt), 1e-2, 1e-4, "embedding_bwd");
    for (int c2 = 0; c2 < 5; c2++) cr_expect_eq(F(&dt)[2 * 5 + c2], 0.0f, "unused row not zero");
}

Test(cpu, cross_entropy_hand)
{
    KTensor lg = fvals(S(2, 3), (float[]){0.5f, 0.5f, 0.5f, 1, 2, 3}), tg = ivals(S(2), (int32_t[]){1, 2});
    KTensor o = ten(KT_F32, NOSHAPE), terms = ten(KT_F32, S(2, 2));
    KCall k = {.n_in = 2, .in = {lg, tg}, .n_out = 2, .out = {o, terms}};
    cpu_cross_entropy(&k);
    double lse1 = 0.5 + log(3), lse2 = log(exp(1) + exp(2) + exp(3)), l1 = lse1 - 0.5, l2 = lse2 - 3;
    expect_close(F(&o), (float[]){(float)((l1 + l2) / 2)}, 1, 1e-6, "cross_entropy");
    // each row's logsumexp and target logit, the terms every backend sums in one order
    expect_close(F(&terms), (float[]){(float)lse1, 0.5f, (float)lse2, 3}, 4, 1e-6, "cross_entropy terms");
}

Test(cpu, cross_entropy_bwd_fd)
{
    KTensor lg = frand(S(2, 3, 11), -3, 3), tg = ivals(S(2, 3), (int32_t[]){0, 10, 4, 4, 7, 2});
    KTensor o = ten(KT_F32, NOSHAPE), dl = fscalar(0.7f), dx = like(&lg);
    Fwd c = {.f = cpu_cross_entropy, .k = {.n_in = 2, .in = {lg, tg}, .n_out = 2, .out = {o, ten(KT_F32, S(2, 3, 2))}},
             .w = F(&dl)};
    KCall kb = {.n_in = 3, .in = {lg, tg, dl}, .n_out = 1, .out = {dx}};
    cpu_cross_entropy_bwd(&kb);
    fd_check(&c, F(&lg), lg.numel, F(&dx), 1e-2, 5e-4, "cross_entropy_bwd");
}

/* ---- layout ------------------------------------------------------------------------- */

Test(cpu, reshape_transpose_hand)
{
    KTensor x = fvals(S(2, 3), (float[]){1, 2, 3, 4, 5, 6}), r = ten(KT_F32, S(3, 2)), t = ten(KT_F32, S(3, 2));
    KCall kr = {.n_in = 1, .in = {x}, .n_out = 1, .out = {r}, .ints = (int64_t[]){3, 2}, .n_ints = 2};
    cpu_reshape(&kr);
    expect_close(F(&r), F(&x), 6, 0, "reshape");
    KCall kt = {.n_in = 1, .in = {x}, .n_out = 1, .out = {t}, .attr = {0, -2, -1}};
    cpu_transpose(&kt);
    expect_close(F(&t), (float[]){1, 4, 2, 5, 3, 6}, 6, 0, "transpose");
}

/* permute of an i32 tensor against index arithmetic (row-copy and tiled paths). */
static void check_permute(int rank, const int64_t *shape, const int *perm)
{
    KTensor x = ten(KT_I32, rank, shape);
    for (int64_t i = 0; i < x.numel; i++) I(&x)[i] = (int32_t)i;
    int64_t os[6], xst[6], ints[6];
    xst[rank - 1] = 1;
    for (int d = rank - 2; d >= 0; d--) xst[d] = xst[d + 1] * shape[d + 1];
    for (int i = 0; i < rank; i++) os[i] = shape[perm[i]], ints[i] = perm[i] - (i % 2) * rank;  // some negative
    KTensor o = ten(KT_I32, rank, os);
    KCall k = {.n_in = 1, .in = {x}, .n_out = 1, .out = {o}, .ints = ints, .n_ints = rank};
    cpu_permute(&k);
    for (int64_t i = 0; i < o.numel; i++) {
        int64_t rem = i, src = 0;
        for (int d = rank - 1; d >= 0; d--) src += (rem % os[d]) * xst[perm[d]], rem /= os[d];
        if (I(&o)[i] != src) {
            cr_expect_fail("permute [%lld]: %d, want %lld", (long long)i, I(&o)[i], (long long)src);
            return;
        }
    }
}

Test(cpu, permute)
{
    check_permute(S(2, 3, 4, 5), (int[]){2, 0, 3, 1});
    check_permute(S(2, 3, 4, 5), (int[]){0, 2, 1, 3});
    check_permute(S(3, 70, 45), (int[]){0, 2, 1});
    check_permute(S(70, 1, 45), (int[]){2, 1, 0});
    check_permute(S(33, 40, 3), (int[]){2, 1, 0});
    check_permute(S(200, 300), (int[]){1, 0});
}

Test(cpu, heads_merge_heads)
{
    KTensor x = frand(S(2, 5, 12), -1, 1), h = ten(KT_F32, S(2, 3, 5, 4)), m = like(&x);
    KCall k = {.n_in = 1, .in = {x}, .n_out = 1, .out = {h}, .attr = {0, 3}};
    cpu_heads(&k);
    for (int b = 0; b < 2; b++)
        for (int n = 0; n < 3; n++)
            for (int t = 0; t < 5; t++)
                for (int d = 0; d < 4; d++)
                    cr_expect_eq(F(&h)[((b * 3 + n) * 5 + t) * 4 + d], F(&x)[(b * 5 + t) * 12 + n * 4 + d]);
    KCall km = {.n_in = 1, .in = {h}, .n_out = 1, .out = {m}};
    cpu_merge_heads(&km);
    expect_bits(&m, &x, "merge_heads(heads(x))");
}

Test(cpu, split_concat_slice)
{
    KTensor x = frand(S(2, 6, 3), -1, 1), p[3], y = like(&x), s = ten(KT_F32, S(2, 3, 3));
    for (int i = 0; i < 3; i++) p[i] = ten(KT_F32, S(2, 2, 3));
    KCall k = {.n_in = 1, .in = {x}, .n_out = 3, .out = {p[0], p[1], p[2]}, .attr = {0, 3, 1}};
    cpu_split(&k);
    for (int b = 0; b < 2; b++)
        for (int j = 0; j < 6; j++)
            for (int c = 0; c < 3; c++) cr_expect_eq(F(&p[j / 2])[(b * 2 + j % 2) * 3 + c], F(&x)[(b * 6 + j) * 3 + c]);
    KCall kc = {.n_in = 3, .in = {p[0], p[1], p[2]}, .n_out = 1, .out = {y}, .attr = {0, 1}};
    cpu_concat(&kc);
    expect_bits(&y, &x, "concat(split(x))");
    KCall ks = {.n_in = 1, .in = {x}, .n_out = 1, .out = {s}, .attr = {0, -2, 2, 3}};
    cpu_slice(&ks);
    for (int b = 0; b < 2; b++)
        for (int j = 0; j < 3; j++)
            for (int c = 0; c < 3; c++) cr_expect_eq(F(&s)[(b * 3 + j) * 3 + c], F(&x)[(b * 6 + j + 2) * 3 + c]);
    /* slice's gradient: s's rows back at [2, 5) along the axis, zeros elsewhere. */
    KTensor d = frand(S(2, 6, 3), -1, 1);  // not zero before: the kernel writes every element
    KCall kb = {.n_in = 1, .in = {s}, .n_out = 1, .out = {d}, .attr = {0, 1, 2, 6}};
    cpu_slice_bwd(&kb);
    for (int b = 0; b < 2; b++)
        for (int j = 0; j < 6; j++)
            for (int c = 0; c < 3; c++)
                cr_expect_eq(F(&d)[(b * 6 + j) * 3 + c], j >= 2 && j < 5 ? F(&x)[(b * 6 + j) * 3 + c] : 0.0f);
}

/* ---- rope and attention ------------------------------------------------------------ */

Test(cpu, rope_hand)
{
    KTensor x = fvals(S(2, 4), (float[]){1, 2, 3, 4, 1, 2, 3, 4}), y = like(&x);
    KCall k = {.n_in = 1, .in = {x}, .n_out = 1, .out = {y}, .attr = {0, 100, 0}};
    cpu_rope(&k);
    double c1 = cos(1), s1 = sin(1), c2 = cos(0.1), s2 = sin(0.1);  // t = 1: angles 1 and 100^-0.5
    float want[] = {1, 2, 3, 4, (float)(c1 - 3 * s1), (float)(2 * c2 - 4 * s2), (float)(3 * c1 + s1), (float)(4 * c2 + 2 * s2)};
    expect_close(F(&y), want, 8, 1e-6, "rope");
}

Test(cpu, rope_inverse_is_adjoint)
{
    KTensor x = frand(S(2, 3, 9, 8), -1, 1), g = frand(S(2, 3, 9, 8), -1, 1), rx = like(&x), rg = like(&x), back = like(&x);
    KCall f = {.n_in = 1, .in = {x}, .n_out = 1, .out = {rx}, .attr = {0, 10000, 0}};
    KCall b = {.n_in = 1, .in = {g}, .n_out = 1, .out = {rg}, .attr = {0, 10000, 1}};
    KCall rt = {.n_in = 1, .in = {rx}, .n_out = 1, .out = {back}, .attr = {0, 10000, 1}};
    cpu_rope(&f), cpu_rope(&b), cpu_rope(&rt);
    double l = 0, r = 0;
    for (int64_t i = 0; i < x.numel; i++) l += (double)F(&rx)[i] * F(&g)[i], r += (double)F(&x)[i] * F(&rg)[i];
    cr_expect(fabs(l - r) < 1e-5, "<rope(x), g> = %.9g, <x, rope_inv(g)> = %.9g", l, r);
    expect_close(F(&back), F(&x), x.numel, 1e-6, "rope_inv(rope(x))");
}

Test(cpu, attention_hand)
{
    KTensor q = fvals(S(1, 1), (float[]){1}), k = fvals(S(2, 1), (float[]){0, 1}), v = fvals(S(2, 1), (float[]){1, 3});
    KTensor o = ten(KT_F32, S(1, 1)), lse = ten(KT_F32, S(1));
    KCall c = {.n_in = 3, .in = {q, k, v}, .n_out = 2, .out = {o, lse}};
    cpu_attention(&c);
    double e = exp(1);
    expect_close(F(&o), (float[]){(float)((1 + 3 * e) / (1 + e))}, 1, 1e-6, "attention");
    expect_close(F(&lse), (float[]){(float)log(1 + e)}, 1, 1e-6, "lse");
    KTensor q2 = fvals(S(2, 1), (float[]){1, 1}), o2 = ten(KT_F32, S(2, 1)), lse2 = ten(KT_F32, S(2));
    KCall cc = {.n_in = 3, .in = {q2, k, v}, .n_out = 2, .out = {o2, lse2}, .attr = {0, 0, 0, 1}};
    cpu_attention(&cc);
    expect_close(F(&o2), (float[]){1, (float)((1 + 3 * e) / (1 + e))}, 2, 1e-6, "causal attention");
    expect_close(F(&lse2), (float[]){0, (float)log(1 + e)}, 2, 1e-6, "causal lse");
}

/* Naive attention in double: out, lse and (given dout) dq, dk, dv. k and v may have
 * fewer slices than q (grouped-query attention): query slice b reads kv slice b / G. */
static void attention_ref(const KTensor *q, const KTensor *k, const KTensor *v, const float *dout, int causal, float *o,
                          float *lse, float *dq, float *dk, float *dv)
{
    int r = q->rank;
    int64_t T = q->shape[r - 2], D = q->shape[r - 1], S_ = k->shape[r - 2], Dv = v->shape[r - 1], BH = q->numel / (T * D);
    int64_t G = BH / (k->numel / (S_ * D));
    double scale = 1 / sqrt((double)D), *p = malloc(sizeof(double) * (size_t)S_), *dp = malloc(sizeof(double) * (size_t)S_);
    if (dq) memset(dq, 0, sizeof(float) * (size_t)q->numel), memset(dk, 0, sizeof(float) * (size_t)k->numel);
    if (dv) memset(dv, 0, sizeof(float) * (size_t)v->numel);
    for (int64_t b = 0; b < BH; b++)
        for (int64_t i = 0; i < T; i++) {
            const float *qi = F(q) + (b * T + i) * D;
            int64_t kb = b / G;
            int64_t n = causal ? i + 1 : S_;
            double m = -INFINITY, z = 0;
            for (int64_t j = 0; j < n; j++) {
                double s = 0;
                for (int64_t d = 0; d < D; d++) s += (double)qi[d] * F(k)[(kb * S_ + j) * D + d];
                p[j] = s * scale, m = p[j] > m ? p[j] : m;
            }
            for (int64_t j = 0; j < n; j++) p[j] = exp(p[j] - m), z += p[j];
            for (int64_t j = 0; j < n; j++) p[j] /= z;
            lse[b * T + i] = (float)(m + log(z));
            for (int64_t d = 0; d < Dv; d++) {
                double s = 0;
                for (int64_t j = 0; j < n; j++) s += p[j] * F(v)[(kb * S_ + j) * Dv + d];
                o[(b * T + i) * Dv + d] = (float)s;
            }
            if (!dq) continue;
            const float *gi = dout + (b * T + i) * Dv;
            double Di = 0;
            for (int64_t j = 0; j < n; j++) {
                dp[j] = 0;
                for (int64_t d = 0; d < Dv; d++) dp[j] += (double)gi[d] * F(v)[(kb * S_ + j) * Dv + d];
                Di += p[j] * dp[j];
            }
            for (int64_t j = 0; j < n; j++) {
                double ds = p[j] * (dp[j] - Di) * scale;
                for (int64_t d = 0; d < D; d++) {
                    dq[(b * T + i) * D + d] += (float)(ds * F(k)[(kb * S_ + j) * D + d]);
                    dk[(kb * S_ + j) * D + d] += (float)(ds * qi[d]);
                }
                for (int64_t d = 0; d < Dv; d++) dv[(kb * S_ + j) * Dv + d] += (float)(p[j] * gi[d]);
            }
        }
    free(p), free(dp);
}

/* Forward and backward of a q [B, H, T, D], k and v [B, HKV, S, D] case against the
 * naive reference. */
static void check_gqa(int64_t B, int64_t H, int64_t HKV, int64_t T, int64_t S_, int64_t D, int64_t Dv, int causal)
{
    KTensor q = frand(S(B, H, T, D), -1, 1), k = frand(S(B, HKV, S_, D), -1, 1), v = frand(S(B, HKV, S_, Dv), -1, 1);
    KTensor o = ten(KT_F32, S(B, H, T, Dv)), lse = ten(KT_F32, S(B, H, T)), g = frand(S(B, H, T, Dv), -1, 1);
    KTensor dq = like(&q), dk = like(&k), dv = like(&v), wo = like(&o), wl = like(&lse);
    KTensor rq = like(&q), rk = like(&k), rv = like(&v);
    KCall c = {.n_in = 3, .in = {q, k, v}, .n_out = 2, .out = {o, lse}, .attr = {0, 0, 0, causal}};
    cpu_attention(&c);
    KCall kb = {.n_in = 6, .in = {q, k, v, o, lse, g}, .n_out = 3, .out = {dq, dk, dv}, .attr = {[6] = causal}};
    cpu_attention_bwd(&kb);
    attention_ref(&q, &k, &v, F(&g), causal, F(&wo), F(&wl), F(&rq), F(&rk), F(&rv));
    expect_close(F(&o), F(&wo), o.numel, 2e-5, "attention out");
    expect_close(F(&lse), F(&wl), lse.numel, 2e-5, "attention lse");
    expect_close(F(&dq), F(&rq), q.numel, 1e-4, "attention dq");
    expect_close(F(&dk), F(&rk), k.numel, 1e-4, "attention dk");
    expect_close(F(&dv), F(&rv), v.numel, 1e-4, "attention dv");
}

static void check_attention(int64_t B, int64_t H, int64_t T, int64_t S_, int64_t D, int64_t Dv, int causal)
{
    check_gqa(B, H, H, T, S_, D, Dv, causal);
}

/* Grouped-query (and multi-query) attention: dK and dV sum over each group; the large
 * cases run in parallel, over whole kv slices or (one kv slice) over key blocks. */
Test(cpu, attention_grouped_query_against_reference)
{
    check_gqa(2, 4, 2, 9, 9, 4, 4, 1);
    check_gqa(1, 6, 3, 5, 7, 4, 3, 0);
    check_gqa(2, 4, 1, 70, 70, 8, 8, 1);
    check_gqa(1, 4, 2, 150, 150, 64, 64, 1);
    check_gqa(1, 4, 1, 130, 130, 64, 32, 1);
}

Test(cpu, attention_against_reference)
{
    check_attention(1, 2, 5, 7, 4, 3, 0);
    check_attention(2, 1, 6, 6, 4, 4, 1);
    check_attention(1, 2, 150, 150, 128, 128, 1);  // several tiles of 64 x 32
    check_attention(1, 3, 70, 130, 16, 40, 0);
    check_attention(2, 1, 129, 129, 8, 8, 1);
}

Test(cpu, attention_bwd_fd)
{
    for (int causal = 0; causal < 2; causal++) {
        KTensor q = frand(S(2, 3, 4), -1, 1), k = frand(S(2, 3, 4), -1, 1), v = frand(S(2, 3, 5), -1, 1);
        KTensor o = ten(KT_F32, S(2, 3, 5)), lse = ten(KT_F32, S(2, 3)), g = frand(S(2, 3, 5), -1, 1);
        KTensor dq = like(&q), dk = like(&k), dv = like(&v);
        Fwd c = {.f = cpu_attention, .k = {.n_in = 3, .in = {q, k, v}, .n_out = 2, .out = {o, lse}, .attr = {0, 0, 0, causal}},
                 .w = F(&g)};
        loss_of(&c);
        KCall kb = {.n_in = 6, .in = {q, k, v, o, lse, g}, .n_out = 3, .out = {dq, dk, dv}, .attr = {[6] = causal}};
        cpu_attention_bwd(&kb);
        fd_check(&c, F(&q), q.numel, F(&dq), 1e-2, 5e-4, "attention dq");
        fd_check(&c, F(&k), k.numel, F(&dk), 1e-2, 5e-4, "attention dk");
        fd_check(&c, F(&v), v.numel, F(&dv), 1e-2, 5e-4, "attention dv");
    }
}

/* ---- constants ---------------------------------------------------------------------- */

Test(cpu, arange_scalar_full)
{
    KTensor a = ten(KT_I32, S(5)), s = ten(KT_F32, NOSHAPE), f = ten(KT_F32, S(2, 3)), fi = ten(KT_I32, S(3));
    KCall ka = {.n_out = 1, .out = {a}, .attr = {5}};
    cpu_arange(&ka);
    cr_expect(!memcmp(I(&a), (int32_t[]){0, 1, 2, 3, 4}, 20));
    KCall ks = {.n_out = 1, .out = {s}, .attr = {-2.5}};
    cpu_scalar(&ks);
    cr_expect_eq(F(&s)[0], -2.5f);
    KCall kf = {.n_out = 1, .out = {f}, .attr = {0.25}, .ints = (int64_t[]){2, 3}, .n_ints = 2};
    cpu_full(&kf);
    for (int i = 0; i < 6; i++) cr_expect_eq(F(&f)[i], 0.25f);
    KCall kfi = {.n_out = 1, .out = {fi}, .attr = {7}, .ints = (int64_t[]){3}, .n_ints = 1};
    cpu_full(&kfi);
    cr_expect(!memcmp(I(&fi), (int32_t[]){7, 7, 7}, 12));
}

/* ---- optimizer ---------------------------------------------------------------------- */

Test(cpu, sumsq_parts_sum_parts_clip_coef)
{
    KTensor x = fvals(S(3), (float[]){1, -2, 3}), o = ten(KT_F32, NOSHAPE), one = ten(KT_F32, S(1));
    KCall k = {.n_in = 1, .in = {x}, .n_out = 1, .out = {one}};
    cpu_sumsq_parts(&k);
    cr_expect_eq(F(&one)[0], 14.0f);
    /* A chunk of OPS_SUMSQ_CHUNK ones and a part of 2 twos: two parts, 4096 and 8. */
    KTensor y = ten(KT_F32, S(OPS_SUMSQ_CHUNK + 2)), two = ten(KT_F32, S(2));
    for (int64_t i = 0; i < y.numel; i++) F(&y)[i] = i < OPS_SUMSQ_CHUNK ? 1.0f : -2.0f;
    KCall kp = {.n_in = 1, .in = {y}, .n_out = 1, .out = {two}};
    cpu_sumsq_parts(&kp);
    cr_expect(F(&two)[0] == (float)OPS_SUMSQ_CHUNK && F(&two)[1] == 8.0f, "parts %g %g", (double)F(&two)[0],
              (double)F(&two)[1]);
    KCall ks = {.n_in = 2, .in = {one, two}, .n_out = 1, .out = {o}};
    cpu_sum_parts(&ks);
    cr_expect_eq(F(&o)[0], 14.0f + OPS_SUMSQ_CHUNK + 8.0f);
    float norms[] = {0.5f, 4.0f, 4.0f}, maxn[] = {1.0f, 1.0f, 0.0f};
    for (int i = 0; i < 3; i++) {
        KTensor n = fscalar(norms[i]);
        KCall kc = {.n_in = 1, .in = {n}, .n_out = 1, .out = {o}, .attr = {0, maxn[i]}};
        cpu_clip_coef(&kc);
        float want = maxn[i] <= 0 ? 1.0f : (float)fmin(1.0, maxn[i] / (norms[i] + 1e-6));
        cr_expect_float_eq(F(&o)[0], want, 1e-7, "clip_coef(%g, %g)", (double)norms[i], (double)maxn[i]);
    }
}

static float lr_at(int step, int schedule, int warmup, int steps)
{
    KTensor s = iscalar(step), o = ten(KT_F32, NOSHAPE);
    KCall k = {.n_in = 1, .in = {s}, .n_out = 1, .out = {o}, .attr = {0, 1.0, schedule, warmup, steps, 0.1}};
    cpu_lr_at(&k);
    return F(&o)[0];
}

Test(cpu, lr_at_edges)
{
    double pi = 3.14159265358979323846;
    cr_expect_float_eq(lr_at(1, 1, 10, 100), 0.1f, 1e-7);
    cr_expect_float_eq(lr_at(10, 1, 10, 100), 1.0f, 1e-7);  // last warmup step
    cr_expect_float_eq(lr_at(11, 1, 10, 100), (float)(0.1 + 0.45 * (1 + cos(pi / 90))), 1e-7);
    cr_expect_float_eq(lr_at(55, 1, 10, 100), 0.55f, 1e-6);  // halfway
    cr_expect_float_eq(lr_at(100, 1, 10, 100), 0.1f, 1e-7);
    cr_expect_float_eq(lr_at(150, 1, 10, 100), 0.1f, 1e-7);  // past the end: clamped
    cr_expect_float_eq(lr_at(1, 1, 0, 100), (float)(0.1 + 0.45 * (1 + cos(pi / 100))), 1e-7);
    cr_expect_float_eq(lr_at(5, 0, 10, 100), 0.5f, 1e-7);
    cr_expect_float_eq(lr_at(11, 0, 10, 100), 1.0f, 1e-7);
    cr_expect_float_eq(lr_at(3, 1, 10, 5), 0.3f, 1e-7);  // warmup longer than the run
}

Test(cpu, adamw_three_steps)
{
    enum { N = 40 };
    KTensor p = frand(S(N), -1, 1), g = frand(S(N), -1, 1), m = fvals(S(N), (float[N]){0}), v = fvals(S(N), (float[N]){0});
    KTensor lr = fscalar(0.01f), coef = fscalar(0.5f);
    double rp[N], rm[N] = {0}, rv[N] = {0}, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
    for (int i = 0; i < N; i++) rp[i] = F(&p)[i];
    for (int step = 1; step <= 3; step++) {
        for (int i = 0; i < N; i++) F(&g)[i] = urand(-1, 1);
        KTensor st = iscalar(step);
        KCall k = {.n_in = 7, .in = {p, g, m, v, lr, coef, st}, .attr = {[7] = b1, [8] = b2, [9] = eps, [10] = wd}};
        cpu_adamw(&k);
        for (int i = 0; i < N; i++) {
            double gr = F(&g)[i] * 0.5, lrd = 0.01f;
            rp[i] *= 1 - lrd * wd;
            rm[i] = b1 * rm[i] + (1 - b1) * gr;
            rv[i] = b2 * rv[i] + (1 - b2) * gr * gr;
            double bc1 = 1 - pow(b1, step), bc2 = 1 - pow(b2, step);
            rp[i] -= lrd / bc1 * rm[i] / (sqrt(rv[i]) / sqrt(bc2) + eps);
        }
        for (int i = 0; i < N; i++) {
            cr_expect(fabs(F(&p)[i] - rp[i]) < 1e-6, "step %d p[%d]: %.8g vs %.8g", step, i, (double)F(&p)[i], rp[i]);
            cr_expect(fabs(F(&m)[i] - rm[i]) < 1e-6 && fabs(F(&v)[i] - rv[i]) < 1e-6, "step %d state[%d]", step, i);
        }
    }
}

Test(cpu, sgd_three_steps)
{
    enum { N = 40 };
    for (int with_momentum = 0; with_momentum < 2; with_momentum++) {
        KTensor p = frand(S(N), -1, 1), g = frand(S(N), -1, 1), buf = frand(S(N), -1, 1);
        KTensor lr = fscalar(0.05f), coef = fscalar(0.8f);
        double mom = with_momentum ? 0.9 : 0, wd = 0.01, rp[N], rb[N];
        for (int i = 0; i < N; i++) rp[i] = F(&p)[i], rb[i] = F(&buf)[i];
        for (int step = 1; step <= 3; step++) {
            for (int i = 0; i < N; i++) F(&g)[i] = urand(-1, 1);
            KTensor st = iscalar(step);
            KCall k = {.n_in = 6, .in = {p, g, buf, lr, coef, st}, .attr = {[6] = mom, [7] = wd}};
            cpu_sgd(&k);
            for (int i = 0; i < N; i++) {
                double d = F(&g)[i] * 0.8f + wd * rp[i];
                if (mom != 0) d = rb[i] = step == 1 ? d : mom * rb[i] + d;
                rp[i] -= 0.05f * d;
                cr_expect(fabs(F(&p)[i] - rp[i]) < 1e-6, "step %d p[%d]: %.8g vs %.8g", step, i, (double)F(&p)[i], rp[i]);
            }
        }
    }
}

/* ---- determinism ---------------------------------------------------------------------- */

/* Runs f on k twice, the second time into fresh outputs, and compares bitwise. */
static void twice(CpuKernel f, KCall *k, const char *what)
{
    KCall k2 = *k;
    for (int i = 0; i < k->n_out; i++) k2.out[i] = like(&k->out[i]);
    f(k), f(&k2);
    for (int i = 0; i < k->n_out; i++) expect_bits(&k->out[i], &k2.out[i], what);
}

Test(cpu, deterministic_with_two_threads)
{
    omp_set_num_threads(2);
    KTensor x = frand(S(96, 384), -2, 2), w = frand(S(384), 0.5f, 1.5f), dy = frand(S(96, 384), -1, 1);
    KCall ln = {.n_in = 3, .in = {x, w, dy}, .n_out = 3, .out = {like(&x), like(&w), like(&w)}, .attr = {0, 0, 0, 1e-5}};
    twice(cpu_layernorm_bwd, &ln, "layernorm_bwd");
    KTensor idx = ten(KT_I32, S(96));
    for (int i = 0; i < 96; i++) I(&idx)[i] = (i * 7) % 13;
    KCall eb = {.n_in = 2, .in = {idx, dy}, .n_out = 1, .out = {ten(KT_F32, S(13, 384))}, .attr = {0, 0, 13}};
    twice(cpu_embedding_bwd, &eb, "embedding_bwd");
    KTensor tg = ten(KT_I32, S(96));
    for (int i = 0; i < 96; i++) I(&tg)[i] = (i * 5) % 384;
    KCall ce = {.n_in = 2, .in = {x, tg}, .n_out = 2, .out = {ten(KT_F32, NOSHAPE), ten(KT_F32, S(96, 2))}};
    twice(cpu_cross_entropy, &ce, "cross_entropy");
    int64_t parts = (x.numel + OPS_SUMSQ_CHUNK - 1) / OPS_SUMSQ_CHUNK;
    KCall ss = {.n_in = 1, .in = {x}, .n_out = 1, .out = {ten(KT_F32, S(parts))}};
    twice(cpu_sumsq_parts, &ss, "sumsq_parts");
    KCall st = {.n_in = 1, .in = {x}, .n_out = 1, .out = {ten(KT_F32, S(384))}};
    twice(cpu_sum_to, &st, "sum_to");
    KCall sm = {.n_in = 1, .in = {x}, .n_out = 1, .out = {like(&x)}, .attr = {0, 0}};
    twice(cpu_softmax, &sm, "softmax axis 0");
    KCall mm = {.n_in = 2, .in = {x, dy}, .n_out = 1, .out = {ten(KT_F32, S(384, 384))}, .attr = {0, 0, 1, 0}};
    twice(cpu_matmul, &mm, "matmul");
}

/* The forward, then the backward twice at 2 threads and once at 1: the same bits. */
static void attention_same_bits(KTensor q, KTensor k, KTensor v, int causal)
{
    KTensor o = like(&q), lse = ten(KT_F32, q.rank - 1, q.shape), g = frand(q.rank, q.shape, -1, 1);
    omp_set_num_threads(2);
    KCall f = {.n_in = 3, .in = {q, k, v}, .n_out = 2, .out = {o, lse}, .attr = {0, 0, 0, causal}};
    twice(cpu_attention, &f, "attention");
    KCall b = {.n_in = 6, .in = {q, k, v, o, lse, g}, .n_out = 3, .out = {like(&q), like(&k), like(&v)}, .attr = {[6] = causal}};
    twice(cpu_attention_bwd, &b, "attention_bwd");
    omp_set_num_threads(1);
    KCall b1 = b;
    for (int i = 0; i < 3; i++) b1.out[i] = like(&b.out[i]);
    cpu_attention_bwd(&b1);
    for (int i = 0; i < 3; i++) expect_bits(&b.out[i], &b1.out[i], "attention_bwd 1 vs 2 threads");
}

/* Attention over 3 slices: with 2 threads the backward takes its two-pass path, with one
 * thread the per-slice path; both must give the same bits. */
Test(cpu, attention_deterministic_across_threads)
{
    KTensor q = frand(S(3, 200, 64), -1, 1), k = frand(S(3, 200, 64), -1, 1), v = frand(S(3, 200, 64), -1, 1);
    for (int causal = 0; causal < 2; causal++) attention_same_bits(q, k, v, causal);
}

/* Multi-query attention, 4 query slices over 1 kv slice: with 2 threads the two-pass
 * path sums dK and dV over the group, with one the per-slice path. */
Test(cpu, grouped_attention_deterministic_across_threads)
{
    attention_same_bits(frand(S(4, 200, 64), -1, 1), frand(S(1, 200, 64), -1, 1), frand(S(1, 200, 64), -1, 1), 1);
}
