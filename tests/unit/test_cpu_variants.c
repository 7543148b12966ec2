/* tests/unit/test_cpu_variants.c: the CPU kernels of issue 37's op variants, one call at a
 * time: exact (erf) GELU, x ** p, GPT-J's interleaved rope, cross_entropy's ignore_index
 * (the loss, its backward and the fused op), and the linear and wsd learning-rate
 * schedules. Values against double references of PyTorch's formulas, gradients against
 * central differences of their forward kernel; outputs start as NaN, so an element left
 * unwritten fails. (test_cpu_kernels.c holds the other kernels.)
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "kernels.h"
#include "ops.h"
#include "rand.h"
#include "tensors.h"

TestSuite(cpu_variants, .fini = tensors_free);

static KTensor ten(int dtype, int rank, const int64_t *shape)
{
    KTensor t = {.dtype = dtype, .rank = rank, .numel = 1};
    for (int i = 0; i < rank; i++) t.shape[i] = shape[i], t.numel *= shape[i];
    t.data = track((size_t)t.numel * 4);
    for (int64_t i = 0; i < t.numel; i++) ((float *)t.data)[i] = NAN;
    return t;
}

static float *F(const KTensor *t) { return (float *)t->data; }
static KTensor like(const KTensor *t) { return ten(t->dtype, t->rank, t->shape); }

static KTensor frand(int rank, const int64_t *shape, float lo, float hi)
{
    KTensor t = ten(KT_F32, rank, shape);
    for (int64_t i = 0; i < t.numel; i++) F(&t)[i] = urand(lo, hi);
    return t;
}

/* got against want within tol relative to max(1, |want|); NaN only where want is NaN. */
static void expect_close(const float *got, const double *want, int64_t n, double tol, const char *what)
{
    for (int64_t i = 0; i < n; i++) {
        if (isnan(want[i])) {
            cr_expect(isnan(got[i]), "%s[%lld]: %.9g, want NaN", what, (long long)i, (double)got[i]);
            continue;
        }
        int ok = got[i] == want[i] || fabs(got[i] - want[i]) <= tol * fmax(1, fabs(want[i]));
        cr_expect(ok, "%s[%lld]: %.9g, want %.9g", what, (long long)i, (double)got[i], want[i]);
    }
}

/* The gradient dx = bwd(x, dy) of y = fwd(x) against central differences of sum(y * dy). */
static void fd_check(CpuKernel fwd, CpuKernel bwd, const double *attr, int n_attr, float lo, float hi, const char *what)
{
    KTensor x = frand(S(3, 7), lo, hi), y = like(&x), dy = frand(S(3, 7), -1, 1), dx = like(&x);
    KCall kf = {.n_in = 1, .in = {x}, .n_out = 1, .out = {y}};
    KCall kb = {.n_in = 2, .in = {x, dy}, .n_out = 1, .out = {dx}};
    for (int i = 0; i < n_attr; i++) kf.attr[1 + i] = attr[i], kb.attr[2 + i] = attr[i];
    bwd(&kb);
    for (int64_t i = 0; i < x.numel; i++) {
        float x0 = F(&x)[i];
        double l[2];
        for (int s = 0; s < 2; s++) {
            F(&x)[i] = x0 + (s ? -1e-2f : 1e-2f);
            fwd(&kf);
            l[s] = 0;
            for (int64_t j = 0; j < x.numel; j++) l[s] += (double)F(&y)[j] * F(&dy)[j];
        }
        double h = ((double)(x0 + 1e-2f) - (double)(x0 - 1e-2f)), num = (l[0] - l[1]) / h;
        F(&x)[i] = x0;
        cr_expect(fabs(num - F(&dx)[i]) <= 2e-3 * (1 + fabs(num)), "%s[%lld]: finite difference %.6g, kernel %.6g",
                  what, (long long)i, num, (double)F(&dx)[i]);
    }
}

/* ---- exact GELU ----------------------------------------------------------------------- */

Test(cpu_variants, gelu_exact_values_and_gradient)
{
    const float xs[] = {-6, -2.5f, -1, -0.3f, 0, 0.4f, 1, 3, 10};
    KTensor x = ten(KT_F32, S(9)), y = like(&x), t = like(&x);
    memcpy(x.data, xs, sizeof xs);
    KCall k = {.n_in = 1, .in = {x}, .n_out = 1, .out = {y}, .attr = {0, 1}};
    cpu_gelu(&k);
    double want[9];
    for (int i = 0; i < 9; i++) want[i] = 0.5 * xs[i] * (1 + erf(xs[i] / sqrt(2.0)));  // torch's approximate='none'
    expect_close(F(&y), want, 9, 2e-7, "gelu exact");
    KCall kt = {.n_in = 1, .in = {x}, .n_out = 1, .out = {t}, .attr = {0, 0}};
    cpu_gelu(&kt);
    cr_expect(fabs(F(&t)[2] - F(&y)[2]) > 1e-4, "exact and tanh forms differ at -1: %.9g, %.9g", (double)F(&t)[2],
              (double)F(&y)[2]);
    fd_check(cpu_gelu, cpu_gelu_bwd, (double[]){1}, 1, -4, 4, "gelu_bwd exact");
}

/* ---- x ** p ---------------------------------------------------------------------------- */

Test(cpu_variants, pow_values)
{
    const float xs[] = {-2, -0.5f, 0, 0.25f, 1, 3};
    const double ps[] = {2, 3, 0.5, -0.5, -1, -2, 0, 1, 1.5, -0.7, 4};
    KTensor x = ten(KT_F32, S(6)), y = like(&x);
    memcpy(x.data, xs, sizeof xs);
    for (size_t j = 0; j < sizeof ps / sizeof *ps; j++) {
        KCall k = {.n_in = 1, .in = {x}, .n_out = 1, .out = {y}, .attr = {0, ps[j]}};
        cpu_pow(&k);
        double want[6];
        for (int i = 0; i < 6; i++) want[i] = pow(xs[i], ps[j]);  // a negative x to a fraction: NaN, as torch
        char what[32];
        snprintf(what, sizeof what, "x ** %g", ps[j]);
        expect_close(F(&y), want, 6, 4e-7, what);
    }
}

Test(cpu_variants, pow_gradient)
{
    const double ps[] = {2, 3, 0.5, -0.5, -1, -2, 1.5, -0.7, 1};
    for (size_t j = 0; j < sizeof ps / sizeof *ps; j++) {
        char what[32];
        snprintf(what, sizeof what, "pow_bwd p = %g", ps[j]);
        fd_check(cpu_pow, cpu_pow_bwd, &ps[j], 1, 0.5f, 2, what);
    }
    fd_check(cpu_pow, cpu_pow_bwd, (double[]){3}, 1, -2, 2, "pow_bwd p = 3, negative x");
    /* p = 0: the gradient is 0, even at x = 0 (torch's zeros, not 0 * inf) */
    KTensor x = ten(KT_F32, S(3)), dy = like(&x), dx = like(&x);
    memcpy(x.data, (float[]){0, -1, 2}, 12);
    memcpy(dy.data, (float[]){1, 1, 1}, 12);
    KCall kb = {.n_in = 2, .in = {x, dy}, .n_out = 1, .out = {dx}, .attr = {0, 0, 0}};
    cpu_pow_bwd(&kb);
    cr_expect(F(&dx)[0] == 0 && F(&dx)[1] == 0 && F(&dx)[2] == 0);
}

/* ---- interleaved rope ------------------------------------------------------------------ */

/* rope(x, interleaved) is rotate-half rope on x with its pairs (2i, 2i + 1) moved to
 * (i, i + D/2), and back: the same angles, the same arithmetic, bit for bit. */
Test(cpu_variants, rope_interleaved_is_rotate_half_on_the_pairs)
{
    enum { T = 9, D = 8, H = D / 2 };
    KTensor x = frand(S(2, T, D), -1, 1), y = like(&x), px = like(&x), py = like(&x);
    for (int64_t r = 0; r < 2 * T; r++)
        for (int i = 0; i < H; i++) {
            F(&px)[r * D + i] = F(&x)[r * D + 2 * i];
            F(&px)[r * D + H + i] = F(&x)[r * D + 2 * i + 1];
        }
    KCall ki = {.n_in = 1, .in = {x}, .n_out = 1, .out = {y}, .attr = {0, 500, 0, 1}};
    KCall kh = {.n_in = 1, .in = {px}, .n_out = 1, .out = {py}, .attr = {0, 500, 0, 0}};
    cpu_rope(&ki), cpu_rope(&kh);
    for (int64_t r = 0; r < 2 * T; r++)
        for (int i = 0; i < H; i++) {
            cr_expect_eq(F(&y)[r * D + 2 * i], F(&py)[r * D + i]);
            cr_expect_eq(F(&y)[r * D + 2 * i + 1], F(&py)[r * D + H + i]);
        }
    /* the inverse undoes it; row 0 (position 0) is unchanged */
    KTensor back = like(&x);
    KCall kr = {.n_in = 1, .in = {y}, .n_out = 1, .out = {back}, .attr = {0, 500, 1, 1}};
    cpu_rope(&kr);
    double want[2 * T * D];
    for (int64_t i = 0; i < x.numel; i++) want[i] = F(&x)[i];
    expect_close(F(&back), want, x.numel, 1e-6, "rope_inv(rope(x)) interleaved");
    cr_expect(!memcmp(F(&y), F(&x), sizeof(float) * D));
}

/* rope_at at position p turns an interleaved row as rope turns row p. */
Test(cpu_variants, rope_at_interleaved_is_ropes_row)
{
    enum { T = 6, D = 10 };
    KTensor x = frand(S(T, D), -1, 1), y = like(&x), row = ten(KT_F32, S(1, D)), out = like(&row);
    KTensor pos = ten(KT_I32, S(1));
    KCall k = {.n_in = 1, .in = {x}, .n_out = 1, .out = {y}, .attr = {0, 10000, 0, 1}};
    cpu_rope(&k);
    for (int p = 0; p < T; p++) {
        memcpy(row.data, F(&x) + p * D, sizeof(float) * D);
        ((int32_t *)pos.data)[0] = p;
        KCall ka = {.n_in = 2, .in = {row, pos}, .n_out = 1, .out = {out}, .attr = {0, 0, 10000, 0, 1}};
        cpu_rope_at(&ka);
        cr_expect(!memcmp(out.data, F(&y) + p * D, sizeof(float) * D), "rope_at %d", p);
    }
}

/* ---- cross_entropy's ignore_index ------------------------------------------------------ */

enum { ROWS = 7, V = 5 };

/* The loss of logits x over rows whose target is not `ignore`, in double, and its gradient
 * (softmax - onehot) / counted rows, 0 on the ignored rows. */
static double loss_ref(const float *x, const int32_t *t, int32_t ignore, double *grad)
{
    double s = 0;
    int counted = 0;
    for (int r = 0; r < ROWS; r++) counted += t[r] != ignore;
    for (int r = 0; r < ROWS; r++) {
        const float *row = x + r * V;
        double m = row[0], z = 0;
        for (int j = 1; j < V; j++) m = fmax(m, row[j]);
        for (int j = 0; j < V; j++) z += exp(row[j] - m);
        for (int j = 0; j < V; j++)
            grad[r * V + j] = t[r] == ignore ? 0 : (exp(row[j] - m) / z - (j == t[r])) / counted;
        if (t[r] != ignore) s += m + log(z) - row[t[r]];
    }
    return s / counted;
}

static KCall loss_call(KTensor *x, KTensor *t, KTensor *dl, KTensor *loss, KTensor *terms, KTensor *dx, int64_t ignore,
                       int fused)
{
    KCall k = {.n_in = fused ? 3 : 2, .in = {*x, *t, *dl}, .n_out = fused ? 3 : 2, .out = {*loss, *terms}};
    if (dx) k.out[2] = *dx;
    k.attr[fused ? 3 : 2] = (double)ignore;
    return k;
}

static void check_ignore(const int32_t *tg, int32_t ignore, const char *what)
{
    KTensor x = frand(S(ROWS, V), -2, 2), t = ten(KT_I32, S(ROWS)), dl = ten(KT_F32, S(1)), loss = ten(KT_F32, S(1));
    KTensor terms = ten(KT_F32, S(ROWS, 2)), dx = like(&x), fx = like(&x), floss = like(&loss), fterms = like(&terms);
    memcpy(t.data, tg, sizeof(int32_t) * ROWS);
    F(&dl)[0] = 1;
    memcpy(fx.data, x.data, sizeof(float) * ROWS * V);
    double g[ROWS * V], want = loss_ref(F(&x), tg, ignore, g);

    KCall kl = loss_call(&x, &t, &dl, &loss, &terms, NULL, ignore, 0);
    cpu_cross_entropy(&kl);
    expect_close(F(&loss), &want, 1, 1e-6, what);
    KCall kb = {.n_in = 3, .in = {x, t, dl}, .n_out = 1, .out = {dx}, .attr = {0, 0, 0, (double)ignore}};
    cpu_cross_entropy_bwd(&kb);
    expect_close(F(&dx), g, ROWS * V, 1e-6, what);
    /* per_row (ir/grad.c): dloss divided by target_count's count first; the same gradient, bit for bit */
    KTensor c = ten(KT_F32, S(1)), share = ten(KT_F32, S(1)), px = like(&x);
    KCall kc = {.n_in = 1, .in = {t}, .n_out = 1, .out = {c}, .attr = {0, (double)ignore}};
    cpu_target_count(&kc);
    int counted = 0;
    for (int r = 0; r < ROWS; r++) counted += tg[r] != ignore;
    cr_expect_eq(F(&c)[0], (float)counted, "%s: target_count %g, not %d", what, F(&c)[0], counted);
    F(&share)[0] = F(&dl)[0] / F(&c)[0];
    KCall kp = {.n_in = 3, .in = {x, t, share}, .n_out = 1, .out = {px}, .attr = {0, 0, 0, (double)ignore, 0, 1}};
    cpu_cross_entropy_bwd(&kp);
    cr_expect(!memcmp(px.data, dx.data, sizeof(float) * ROWS * V), "%s: per_row's gradient differs", what);
    /* the fused op: the same loss, terms and gradient (over the logits), bit for bit */
    KCall kf = loss_call(&fx, &t, &dl, &floss, &fterms, &fx, ignore, 1);
    cpu_cross_entropy_fused(&kf);
    cr_expect(!memcmp(floss.data, loss.data, 4) && !memcmp(fterms.data, terms.data, sizeof(float) * ROWS * 2) &&
                  !memcmp(fx.data, dx.data, sizeof(float) * ROWS * V),
              "%s: the fused op differs from the two", what);
}

Test(cpu_variants, cross_entropy_ignore_index)
{
    check_ignore((int32_t[]){0, 2, 4, 2, 1, 3, 2}, 2, "ignore 2 (three rows)");
    check_ignore((int32_t[]){0, -100, 4, 2, -100, 3, 1}, -100, "ignore -100");
    check_ignore((int32_t[]){0, 1, 4, 2, 1, 3, 2}, 7, "ignore 7 (no row)");
}

/* Every target ignored: the loss is 0 (torch's 0/0 is NaN: ops/ops.h), every gradient 0, with dloss divided
 * by the count in the kernel or already (per_row: ir/grad.c's target_count, 0 here, so dloss / 0). */
Test(cpu_variants, cross_entropy_every_row_ignored)
{
    KTensor x = frand(S(ROWS, V), -2, 2), t = ten(KT_I32, S(ROWS)), dl = ten(KT_F32, S(1)), loss = ten(KT_F32, S(1));
    KTensor terms = ten(KT_F32, S(ROWS, 2)), dx = like(&x);
    for (int r = 0; r < ROWS; r++) ((int32_t *)t.data)[r] = 3;
    F(&dl)[0] = 1;
    KCall kf = loss_call(&x, &t, &dl, &loss, &terms, &x, 3, 1);
    cpu_cross_entropy_fused(&kf);
    cr_expect_eq(F(&loss)[0], 0.0f);
    for (int i = 0; i < ROWS * V; i++) cr_expect_eq(F(&x)[i], 0.0f);
    for (int per_row = 0; per_row <= 1; per_row++) {
        KTensor c = ten(KT_F32, S(1)), share = ten(KT_F32, S(1));
        KCall kc = {.n_in = 1, .in = {t}, .n_out = 1, .out = {c}, .attr = {0, 3}};
        cpu_target_count(&kc);
        cr_expect_eq(F(&c)[0], 0.0f);
        F(&share)[0] = per_row ? F(&dl)[0] / F(&c)[0] : F(&dl)[0];  // per_row: 1 / 0, inf
        for (int i = 0; i < ROWS * V; i++) F(&dx)[i] = 7;
        KCall kb = {.n_in = 3, .in = {x, t, share}, .n_out = 1, .out = {dx}, .attr = {0, 0, 0, 3, 0, per_row}};
        cpu_cross_entropy_bwd(&kb);
        for (int i = 0; i < ROWS * V; i++)
            cr_expect_eq(F(&dx)[i], 0.0f, "per_row %d: dx[%d] = %g", per_row, i, F(&dx)[i]);
    }
}

/* ---- learning-rate schedules ------------------------------------------------------------- */

static float lr_at(int step, int schedule, int warmup, int steps, double decay_frac)
{
    KTensor s = ten(KT_I32, 0, NULL), o = ten(KT_F32, 0, NULL);
    ((int32_t *)s.data)[0] = step;
    KCall k = {.n_in = 1, .in = {s}, .n_out = 1, .out = {o}};
    memcpy(k.attr, (double[]){0, 1.0, schedule, warmup, steps, 0.1, decay_frac}, 7 * sizeof(double));  // lr 1, min_lr 0.1
    cpu_lr_at(&k);
    return F(&o)[0];
}

/* linear (BERT's get_linear_schedule_with_warmup, to min_lr 0.1): warmup 10, then from 1 at
 * step 10 to 0.1 at step 100. */
Test(cpu_variants, lr_linear)
{
    for (int s = 1; s <= 120; s++) {
        double want = s <= 10 ? s / 10.0 : 1 - 0.9 * fmin(1, (s - 10) / 90.0);
        cr_expect_float_eq(lr_at(s, OPS_LR_LINEAR, 10, 100, 0.2), (float)want, 1e-7, "step %d", s);
    }
    cr_expect_float_eq(lr_at(1, OPS_LR_LINEAR, 0, 100, 0.2), (float)(1 - 0.9 / 100), 1e-7);
}

/* wsd: warmup 10, lr until the decay's last round(0.25 * 100) = 25 steps, linear to 0.1 at
 * step 100; a decay that would reach into the warmup starts after it. */
Test(cpu_variants, lr_wsd)
{
    for (int s = 1; s <= 120; s++) {
        double want = s <= 10 ? s / 10.0 : s <= 75 ? 1 : 1 - 0.9 * fmin(1, (s - 75) / 25.0);
        cr_expect_float_eq(lr_at(s, OPS_LR_WSD, 10, 100, 0.25), (float)want, 1e-7, "step %d", s);
    }
    cr_expect_float_eq(lr_at(11, OPS_LR_WSD, 10, 20, 0.9), (float)(1 - 0.9 / 10), 1e-7);  // decay from step 10
    cr_expect_float_eq(lr_at(20, OPS_LR_WSD, 10, 20, 0.9), 0.1f, 1e-7);
    cr_expect_float_eq(lr_at(20, OPS_LR_WSD, 0, 20, 0), 1.0f, 1e-7);  // decay_frac 0: no decay up to `steps`
    cr_expect_float_eq(lr_at(21, OPS_LR_WSD, 0, 20, 0), 0.1f, 1e-7);
    cr_expect_float_eq(lr_at(1, OPS_LR_WSD, 0, 20, 1), (float)(1 - 0.9 / 20), 1e-7);  // decay_frac 1: linear
}
