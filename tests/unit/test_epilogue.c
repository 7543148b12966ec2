/* tests/unit/test_epilogue.c: GEMM epilogues (passes/epilogue.c, runtime/cpu/epilogue.c).
 *  - The rewrite (fuse_gemm 1, the default) leaves GPT-2 no gelu, gelu_bwd or bias-sized
 *    sum_to: each block's three bias adds, its GELU, the GELU's gradient and four bias
 *    gradients are in matmul_bias (matmul_bias_add where a residual follows:
 *    test_residual.c), matmul_bias_gelu, matmul_dgelu_bgrad and matmul_bgrad.
 *    A frozen bias keeps its GELU's gelu_bwd (there is no bias gradient to fuse), a frozen
 *    weight its bias's sum_to (there is no weight GEMM to fuse it into). BERT's exact GELU
 *    keeps its gelu and gelu_bwd (cuBLASLt's GELU epilogues are the tanh form).
 *  - On the CPU backend a plan with the rewrite trains as one without it: four steps'
 *    losses and the params after them, GPT-2 and the MLP, fp32 to rounding (the residual's
 *    bias is added as x + (h w + b)), bf16 and fp16 to their tolerance (the fused ops round
 *    once, as cuBLASLt does), with accumulation and loss scaling, recompute, fsdp, and
 *    frozen params.
 *  - Residual adds (fuse_residual 1, the default, under fuse_gemm): each GPT-2 block's two
 *    residual adds are matmul_bias_adds (x + (h w + b), cuBLASLt's C with beta 1) and its
 *    two residual-gradient adds layernorm_bwd_adds; Llama's are matmul_adds (no bias),
 *    which also sum its dX GEMMs, and rmsnorm_bwd_adds. A plan with them trains as one
 *    without (fuse_residual 0): fp32 bit for bit (r is added in f32 after the product and
 *    bias, as the add did), with fsdp, recompute and accumulation too; bf16 and fp16 to
 *    their tolerance.
 *  - The fused ops' numbers against formulas in double: GELU's gradient (itself against
 *    finite differences of tanh-GELU) times the product, the bias gradient as the sum of the
 *    rows, BGRAD of either operand, (a b + bias) + r; and the norms' _add forms as the plain
 *    forms' dx plus r, bit for bit (test_cpu_lowp.c holds their 16-bit calls to the f32).
 * The emulated cuBLASLt side is tests/cuda_emu (epilogue.fsm and the samples, op_check
 * against the CPU).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "rand.h"
#include "sample.h"

static int count_ops(const Plan *p, const char *name)
{
    int n = 0;
    for (int32_t k = 0; k < p->n_ops; k++) n += !strcmp(plan_str(p, p->ops[k].op), name);
    return n;
}

static Plan *gpt2(const char *fuse, const Setting *more, int n_more)
{
    Setting set[8] = {{"fuse_gemm", fuse}};
    for (int i = 0; i < n_more; i++) set[i + 1] = more[i];
    return sample_compile("gpt2.fsm", SAMPLE_GPT2, 6, set, n_more + 1, NULL);
}

Test(epilogue, gpt2_ops)
{
    Plan *on = gpt2("1", NULL, 0), *off = gpt2("0", NULL, 0);
    const char *fused[] = {"matmul_bias", "matmul_bias_add", "matmul_bias_gelu", "matmul_dgelu_bgrad", "matmul_bgrad"};
    /* attn; proj, fcproj (their residuals too: test_residual.c); fc; fc's; attn, proj, fcproj */
    const int per_block[] = {1, 2, 1, 1, 3};
    for (int i = 0; i < 5; i++) {
        cr_assert_eq(count_ops(on, fused[i]), 2 * per_block[i], "%s", fused[i]);
        cr_assert_eq(count_ops(off, fused[i]), 0, "%s", fused[i]);
    }
    cr_assert_eq(count_ops(on, "gelu") + count_ops(on, "gelu_bwd"), 0);
    cr_assert_eq(count_ops(off, "gelu"), 2);
    cr_assert_eq(count_ops(off, "gelu_bwd"), 2);
    /* Bias sums left: the position embedding's sum over the batch, per step. */
    cr_assert_eq(count_ops(on, "sum_to"), count_ops(off, "sum_to") - 8);
    plan_free(on), plan_free(off);
}

/* cuBLASLt's GELU epilogues are the tanh form: an exact (erf) GELU keeps its gelu and
 * gelu_bwd ops, its matmul takes the bias alone, and the plan trains as the one without
 * the rewrite. */
Test(epilogue, exact_gelu_stays_apart)
{
    const char *src = sample_source("gpt2.fsm");
    const char *at = strstr(src, "@ fc.w + fc.b)");
    cr_assert_not_null(at, "gpt2.fsm's MLP reads gelu(h @ fc.w + fc.b)");
    static char patched[1 << 16];
    size_t head = (size_t)(at - src);
    snprintf(patched, sizeof patched, "%.*s@ fc.w + fc.b, exact)%s", (int)head, src, at + strlen("@ fc.w + fc.b)"));
    Setting on_s = {"fuse_gemm", "1"}, off_s = {"fuse_gemm", "0"};
    Plan *on = sample_compile_source("gpt2.fsm", patched, SAMPLE_GPT2, 6, &on_s, 1, NULL);
    Plan *off = sample_compile_source("gpt2.fsm", patched, SAMPLE_GPT2, 6, &off_s, 1, NULL);
    cr_assert_eq(count_ops(on, "matmul_bias_gelu") + count_ops(on, "matmul_dgelu_bgrad"), 0);
    cr_assert_eq(count_ops(on, "gelu"), 2);
    cr_assert_eq(count_ops(on, "gelu_bwd"), 2);
    float a[4], b[4];
    sample_losses(on, 3, 4, a);
    sample_losses(off, 3, 4, b);
    for (int s = 0; s < 4; s++) cr_assert_float_eq(a[s], b[s], 2e-6 * fabsf(b[s]), "step %d: %g vs %g", s + 1, a[s], b[s]);
    plan_free(on), plan_free(off);
}

Test(epilogue, frozen_bias_or_weight)
{
    Setting frozen = {"freeze", "h.0.fc.b,h.1.attn.w"};
    Plan *p = gpt2("1", &frozen, 1);
    cr_assert_eq(count_ops(p, "matmul_dgelu_bgrad"), 1, "h.0's GELU has no bias gradient to fuse");
    cr_assert_eq(count_ops(p, "gelu_bwd"), 1);
    cr_assert_eq(count_ops(p, "matmul_bgrad"), 5, "h.1.attn.b's sum has no weight GEMM");
    cr_assert_eq(count_ops(p, "matmul_bias_gelu"), 2, "the forward fuses whatever is frozen");
    plan_free(p);
}

/* BERT's exact (erf) GELU is no cuBLASLt epilogue (those are tanh): it and its gradient stay
 * ops of their own, while the bias adds and the bias gradients still fuse. */
Test(epilogue, exact_gelu_stays)
{
    const Define dims[] = {{"L", 2}, {"C", 64}, {"NH", 4}, {"T", 32}, {"V", 300}, {"B", 4}};
    Plan *p = sample_compile("bert.fsm", dims, 6, (Setting[]){{"fuse_gemm", "1"}}, 1, NULL);
    cr_assert_eq(count_ops(p, "matmul_bias_gelu") + count_ops(p, "matmul_dgelu_bgrad"), 0);
    cr_assert_eq(count_ops(p, "gelu"), 3, "the two blocks' and the masked-LM head's");
    cr_assert_eq(count_ops(p, "gelu_bwd"), 3);
    cr_assert_gt(count_ops(p, "matmul_bias"), 0);
    cr_assert_gt(count_ops(p, "matmul_bgrad"), 0);
    plan_free(p);
}

/* Largest |x - y| over largest |y|. */
static double rel(const float *x, const float *y, size_t n)
{
    double most = 0, worst = 0;
    for (size_t i = 0; i < n; i++) most = fmax(most, fabs(y[i])), worst = fmax(worst, fabs((double)x[i] - y[i]));
    return most > 0 ? worst / most : worst;
}

/* Four steps with setting `key` 1 and 0: losses and params within tol (0: bit for bit). */
static void trains_alike(const char *key, const char *file, const Define *defs, int n_defs, const Setting *more,
                         int n_more, double tol)
{
    enum { STEPS = 4 };
    Setting set[8];
    for (int i = 0; i < n_more; i++) set[i] = more[i];
    set[n_more] = (Setting){key, "1"};
    Plan *on = sample_compile(file, defs, n_defs, set, n_more + 1, NULL);
    set[n_more].value = "0";
    Plan *off = sample_compile(file, defs, n_defs, set, n_more + 1, NULL);
    cr_assert_lt(count_ops(on, "add"), count_ops(off, "add"), "the rewrite ran");
    float l_on[STEPS], l_off[STEPS];
    size_t n_on, n_off;
    float *p_on = sample_trained(on, 7, STEPS, l_on, &n_on), *p_off = sample_trained(off, 7, STEPS, l_off, &n_off);
    cr_assert_eq(n_on, n_off);
    for (int s = 0; s < STEPS; s++)
        cr_assert(fabsf(l_on[s] - l_off[s]) <= tol * fabsf(l_off[s]), "%s %s step %d: loss %.9g, apart %.9g", key, file,
                  s + 1, l_on[s], l_off[s]);
    double d = rel(p_on, p_off, n_off);
    cr_log_info("%s %s: params after %d steps differ by %.3g (relative)", key, file, STEPS, d);
    if (tol == 0) cr_assert(!memcmp(p_on, p_off, n_off * sizeof *p_on), "%s %s: params differ by %.3g", key, file, d);
    cr_assert(d <= tol, "%s %s: params differ by %.3g of the largest", key, file, d);
    free(p_on), free(p_off);
    plan_free(on), plan_free(off);
}

static void same_training(const char *file, const Define *defs, int n_defs, const Setting *more, int n_more, double tol)
{
    trains_alike("fuse_gemm", file, defs, n_defs, more, n_more, tol);
}

Test(epilogue, gpt2_fp32_trains_as_apart) { same_training("gpt2.fsm", SAMPLE_GPT2, 6, NULL, 0, 2e-6); }
Test(epilogue, gpt2_bf16_trains_as_apart)
{
    same_training("gpt2.fsm", SAMPLE_GPT2, 6, (Setting[]){{"precision", "bf16"}}, 1, 1e-2);
}
Test(epilogue, gpt2_fp16_loss_scaling_and_accumulation)
{
    same_training("gpt2.fsm", SAMPLE_GPT2, 6, (Setting[]){{"precision", "fp16"}, {"microbatches", "2"}}, 2, 1e-2);
}
Test(epilogue, gpt2_fp32_fsdp_recompute_accumulation)
{
    Setting s[] = {{"shard", "fsdp"}, {"recompute", "Block"}, {"microbatches", "2"}};
    same_training("gpt2.fsm", SAMPLE_GPT2, 6, s, 3, 2e-6);
}
Test(epilogue, gpt2_bf16_zero2_frozen)
{
    Setting s[] = {{"precision", "bf16"}, {"shard", "zero2"}, {"freeze", "h.0.fc.b,h.1.attn.w"}};
    same_training("gpt2.fsm", SAMPLE_GPT2, 6, s, 3, 1e-2);
}
Test(epilogue, mlp_fp32_trains_as_apart) { same_training("mlp.fsm", NULL, 0, NULL, 0, 2e-6); }
Test(epilogue, mlp_bf16_trains_as_apart) { same_training("mlp.fsm", NULL, 0, (Setting[]){{"precision", "bf16"}}, 1, 1e-2); }

/* ---- residual adds (fuse_residual) ---------------------------------------------------- */

static Plan *compile(const char *file, const char *resid, const char *gemm)
{
    const Define *dims = strcmp(file, "llama.fsm") ? SAMPLE_GPT2 : SAMPLE_LLAMA;
    Setting set[] = {{"fuse_residual", resid}, {"fuse_gemm", gemm}};
    return sample_compile(file, dims, strcmp(file, "llama.fsm") ? 6 : 7, set, 2, NULL);
}

Test(epilogue, residual_gpt2_ops)
{
    Plan *on = compile("gpt2.fsm", "1", "1"), *off = compile("gpt2.fsm", "0", "1"), *none = compile("gpt2.fsm", "1", "0");
    /* L = 2 blocks, two residuals each; the bias adds of the attention projections stay. */
    cr_assert_eq(count_ops(on, "matmul_bias_add"), 4);
    cr_assert_eq(count_ops(on, "layernorm_bwd_add"), 4);
    cr_assert_eq(count_ops(on, "layernorm_bwd"), 1, "lnf's gradient has no residual to add");
    cr_assert_eq(count_ops(on, "matmul_bias"), 2);
    cr_assert_eq(count_ops(off, "matmul_bias_add") + count_ops(off, "layernorm_bwd_add"), 0);
    cr_assert_eq(count_ops(off, "matmul_bias"), 6);
    cr_assert_eq(count_ops(on, "add"), count_ops(off, "add") - 8);
    cr_assert_eq(count_ops(none, "matmul_bias_add") + count_ops(none, "layernorm_bwd_add"), 0, "under fuse_gemm only");
    plan_free(on), plan_free(off), plan_free(none);
}

Test(epilogue, residual_llama_ops)
{
    Plan *on = compile("llama.fsm", "1", "1"), *off = compile("llama.fsm", "0", "1");
    /* Per block: x + attn @ wo and x + mlp @ w2 (no bias), and in the backward h's gradient,
     * the sum of the dX GEMMs of its three (wq, wk, wv) and two (w1, w3) readers: three adds. */
    cr_assert_eq(count_ops(on, "matmul_add"), 2 * (2 + 3));
    cr_assert_eq(count_ops(on, "rmsnorm_bwd_add"), 4);
    cr_assert_eq(count_ops(off, "matmul_add") + count_ops(off, "rmsnorm_bwd_add"), 0);
    cr_assert_eq(count_ops(on, "add"), count_ops(off, "add") - 14);
    plan_free(on), plan_free(off);
}

static void resid_training(const char *file, const Setting *more, int n_more, double tol)
{
    int llama = !strcmp(file, "llama.fsm");
    trains_alike("fuse_residual", file, llama ? SAMPLE_LLAMA : SAMPLE_GPT2, llama ? 7 : 6, more, n_more, tol);
}

Test(epilogue, residual_gpt2_fp32_bit_for_bit) { resid_training("gpt2.fsm", NULL, 0, 0); }
Test(epilogue, residual_gpt2_fp32_fsdp_recompute_accumulation_bit_for_bit)
{
    Setting s[] = {{"shard", "fsdp"}, {"recompute", "Block"}, {"microbatches", "2"}};
    resid_training("gpt2.fsm", s, 3, 0);
}
Test(epilogue, residual_gpt2_bf16) { resid_training("gpt2.fsm", (Setting[]){{"precision", "bf16"}}, 1, 1e-2); }
Test(epilogue, residual_gpt2_fp16_accumulation)
{
    resid_training("gpt2.fsm", (Setting[]){{"precision", "fp16"}, {"microbatches", "2"}}, 2, 1e-2);
}
Test(epilogue, residual_llama_fp32_bit_for_bit) { resid_training("llama.fsm", NULL, 0, 0); }
Test(epilogue, residual_llama_bf16) { resid_training("llama.fsm", (Setting[]){{"precision", "bf16"}}, 1, 1e-2); }

/* ---- the kernels against formulas ----------------------------------------------------- */

#define SQRT_2_OVER_PI 0.79788456080286535588  // sqrt(2 / pi)

static double gelu_d(double x) { return 0.5 * x * (1 + tanh(SQRT_2_OVER_PI * (x + 0.044715 * x * x * x))); }

static double gelu_grad_d(double x)
{
    double k = SQRT_2_OVER_PI, t = tanh(k * (x + 0.044715 * x * x * x));
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x);
}

static KTensor f32(float *d, int rank, int64_t a, int64_t b, int64_t c)
{
    KTensor t = {.data = d, .dtype = KT_F32, .rank = rank, .shape = {a, b, c}};
    t.numel = a * (rank > 1 ? b : 1) * (rank > 2 ? c : 1);
    return t;
}

static void fill(float *x, int n, float lo, float hi)
{
    for (int i = 0; i < n; i++) x[i] = urand(lo, hi);
}

Test(epilogue, gelu_gradient_against_finite_differences)
{
    for (double x = -4; x <= 4; x += 0.125) {
        double h = 1e-5, fd = (gelu_d(x + h) - gelu_d(x - h)) / (2 * h);
        cr_assert(fabs(fd - gelu_grad_d(x)) < 1e-8, "x %g: %.10g vs %.10g", x, fd, gelu_grad_d(x));
    }
}

/* dy [2, 3, 4] @ w^T (w [5, 4], tb) times gelu'(pre), and its rows' sum. */
Test(epilogue, dgelu_bgrad_kernel)
{
    float dy[24], w[20], pre[30], d[30], db[5];
    fill(dy, 24, -1, 1), fill(w, 20, -1, 1), fill(pre, 30, -3, 3);
    KCall k = {.n_in = 3, .n_out = 2, .attr = {0, 0, 0, 0, 1}};
    k.in[0] = f32(dy, 3, 2, 3, 4), k.in[1] = f32(w, 2, 5, 4, 1), k.in[2] = f32(pre, 3, 2, 3, 5);
    k.out[0] = f32(d, 3, 2, 3, 5), k.out[1] = f32(db, 1, 5, 1, 1);
    cpu_matmul_dgelu_bgrad(&k);
    double sum[5] = {0};
    for (int r = 0; r < 6; r++)
        for (int j = 0; j < 5; j++) {
            double c = 0;
            for (int l = 0; l < 4; l++) c += (double)dy[r * 4 + l] * w[j * 4 + l];
            double want = c * gelu_grad_d(pre[r * 5 + j]);
            sum[j] += want;
            cr_assert(fabs(d[r * 5 + j] - want) < 1e-5, "d[%d, %d] %g, want %g", r, j, d[r * 5 + j], want);
        }
    for (int j = 0; j < 5; j++) cr_assert(fabs(db[j] - sum[j]) < 1e-5, "db[%d] %g, want %g", j, db[j], sum[j]);
}

/* x [6, 3] (ta) and dy [6, 4]: x^T dy, and dy's rows summed (side 1); dy^T x with dy under ta
 * and its rows summed (side 0). */
Test(epilogue, bgrad_kernel_either_side)
{
    float x[18], dy[24], c[12], db[4];
    fill(x, 18, -1, 1), fill(dy, 24, -1, 1);
    for (int side = 0; side < 2; side++) {
        KCall k = {.n_in = 2, .n_out = 2, .attr = {0, 0, 1, 0, side}};
        k.in[side ? 0 : 1] = f32(x, 2, 6, 3, 1), k.in[side] = f32(dy, 2, 6, 4, 1);
        k.out[0] = side ? f32(c, 2, 3, 4, 1) : f32(c, 2, 4, 3, 1), k.out[1] = f32(db, 1, 4, 1, 1);
        cpu_matmul_bgrad(&k);
        for (int j = 0; j < 4; j++) {
            double s = 0;
            for (int r = 0; r < 6; r++) s += dy[r * 4 + j];
            cr_assert(fabs(db[j] - s) < 1e-5, "side %d db[%d] %g, want %g", side, j, db[j], s);
            for (int i = 0; i < 3; i++) {
                double want = 0;
                for (int r = 0; r < 6; r++) want += (double)x[r * 3 + i] * dy[r * 4 + j];
                float got = side ? c[i * 4 + j] : c[j * 3 + i];
                cr_assert(fabs(got - want) < 1e-5, "side %d c %g, want %g", side, got, want);
            }
        }
    }
}

/* gelu(a b + bias) and the pre-activation. */
Test(epilogue, bias_gelu_kernel)
{
    float a[12], b[15], bias[5], y[20], pre[20];
    fill(a, 12, -1, 1), fill(b, 15, -1, 1), fill(bias, 5, -1, 1);
    KCall k = {.n_in = 3, .n_out = 2};
    k.in[0] = f32(a, 2, 4, 3, 1), k.in[1] = f32(b, 2, 3, 5, 1), k.in[2] = f32(bias, 1, 5, 1, 1);
    k.out[0] = f32(y, 2, 4, 5, 1), k.out[1] = f32(pre, 2, 4, 5, 1);
    cpu_matmul_bias_gelu(&k);
    for (int r = 0; r < 4; r++)
        for (int j = 0; j < 5; j++) {
            double p = bias[j];
            for (int l = 0; l < 3; l++) p += (double)a[r * 3 + l] * b[l * 5 + j];
            cr_assert(fabs(pre[r * 5 + j] - p) < 1e-5 && fabs(y[r * 5 + j] - gelu_d(p)) < 1e-5, "[%d, %d]", r, j);
        }
}

/* dx of the _add form is the plain form's dx + r, bit for bit; dw and db are the same. */
Test(epilogue, residual_norm_bwd_add_is_dx_plus_r)
{
    enum { R = 70, C = 24 };
    static float x[R * C], w[C], dy[R * C], r[R * C], dx[R * C], dx2[R * C], dw[C], db[C], dw2[C], db2[C];
    fill(x, R * C, -3, 3), fill(w, C, 0.5f, 1.5f), fill(dy, R * C, -1, 1), fill(r, R * C, -2, 2);
    for (int rms = 0; rms < 2; rms++) {
        KCall k = {.n_in = 3, .n_out = rms ? 2 : 3, .attr = {0, 0, 0, 1e-5}};
        k.in[0] = f32(x, 2, R, C, 1), k.in[1] = f32(w, 1, C, 1, 1), k.in[2] = f32(dy, 2, R, C, 1);
        k.out[0] = f32(dx, 2, R, C, 1), k.out[1] = f32(dw, 1, C, 1, 1), k.out[2] = f32(db, 1, C, 1, 1);
        (rms ? cpu_rmsnorm_bwd : cpu_layernorm_bwd)(&k);
        KCall f = k;
        f.n_in = 4, f.in[3] = f32(r, 2, R, C, 1), f.attr[3] = 0, f.attr[4] = 1e-5;
        f.out[0] = f32(dx2, 2, R, C, 1), f.out[1] = f32(dw2, 1, C, 1, 1), f.out[2] = f32(db2, 1, C, 1, 1);
        (rms ? cpu_rmsnorm_bwd_add : cpu_layernorm_bwd_add)(&f);
        for (int i = 0; i < R * C; i++) {
            float want = r[i] + dx[i];
            cr_assert(!memcmp(&dx2[i], &want, sizeof want), "rms %d dx[%d] %.9g, want %.9g", rms, i, dx2[i], want);
        }
        cr_assert(!memcmp(dw, dw2, sizeof dw), "rms %d: dw", rms);
        cr_assert(rms || !memcmp(db, db2, sizeof db), "db");
    }
}

/* a [2, 3, 4] @ b [4, 5] (+ bias [5]) + r [2, 3, 5] against the sum in double. */
Test(epilogue, residual_matmul_add_kernels)
{
    float a[24], b[20], bias[5], r[30], c[30];
    fill(a, 24, -1, 1), fill(b, 20, -1, 1), fill(bias, 5, -2, 2), fill(r, 30, -3, 3);
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        KCall k = {.n_in = with_bias ? 4 : 3, .n_out = 1};
        k.in[0] = f32(a, 3, 2, 3, 4), k.in[1] = f32(b, 2, 4, 5, 1);
        k.in[with_bias ? 2 : 0] = with_bias ? f32(bias, 1, 5, 1, 1) : k.in[0];
        k.in[with_bias ? 3 : 2] = f32(r, 3, 2, 3, 5);
        k.out[0] = f32(c, 3, 2, 3, 5);
        (with_bias ? cpu_matmul_bias_add : cpu_matmul_add)(&k);
        for (int i = 0; i < 6; i++)
            for (int j = 0; j < 5; j++) {
                double want = r[i * 5 + j] + (with_bias ? bias[j] : 0);
                for (int l = 0; l < 4; l++) want += (double)a[i * 4 + l] * b[l * 5 + j];
                cr_assert(fabs(c[i * 5 + j] - want) < 1e-5, "bias %d [%d, %d]: %g, want %g", with_bias, i, j,
                          c[i * 5 + j], want);
            }
    }
}
