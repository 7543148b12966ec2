/* tests/unit/test_residual.c: residual adds in their producer (passes/epilogue.c with
 * fuse_residual, runtime/cpu/epilogue.c and norm.c).
 *  - With the rewrite (fuse_residual 1, the default, under fuse_gemm) each GPT-2 block's
 *    two residual adds are matmul_bias_adds (x + (h w + b), cuBLASLt's C with beta 1) and
 *    its two residual-gradient adds layernorm_bwd_adds; Llama's are matmul_adds (no bias)
 *    and rmsnorm_bwd_adds. Without it (0) the adds are back; fuse_gemm 0 has neither.
 *  - On the CPU backend a plan with the rewrite trains as one without it: four steps'
 *    losses and the params after them, fp32 bit for bit (the fused ops add r in f32 after
 *    the product and bias, as the add did), also with fsdp, recompute and accumulation,
 *    and bf16 within its tolerance (one rounding where the add made a second).
 *  - The kernels in f32: layernorm_bwd_add and rmsnorm_bwd_add give layernorm_bwd's dx
 *    plus r bit for bit; matmul_bias_add and matmul_add give (a b + bias) + r against
 *    the sum in double. (tests/unit/test_cpu_lowp.c holds the 16-bit calls to the f32
 *    ones; tests/cuda_emu's epilogue.fsm runs every form on the emulated cuBLASLt and
 *    norm kernels against the CPU.)
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

static Plan *compile(const char *file, const char *resid, const char *gemm)
{
    const Define *dims = strcmp(file, "llama.fsm") ? SAMPLE_GPT2 : SAMPLE_LLAMA;
    Setting set[] = {{"fuse_residual", resid}, {"fuse_gemm", gemm}};
    return sample_compile(file, dims, strcmp(file, "llama.fsm") ? 6 : 7, set, 2, NULL);
}

Test(residual, gpt2_ops)
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

Test(residual, llama_ops)
{
    Plan *on = compile("llama.fsm", "1", "1"), *off = compile("llama.fsm", "0", "1");
    cr_assert_eq(count_ops(on, "matmul_add"), 4, "x + attn @ wo and x + mlp @ w2, no bias");
    cr_assert_eq(count_ops(on, "rmsnorm_bwd_add"), 4);
    cr_assert_eq(count_ops(off, "matmul_add") + count_ops(off, "rmsnorm_bwd_add"), 0);
    cr_assert_eq(count_ops(on, "add"), count_ops(off, "add") - 8);
    plan_free(on), plan_free(off);
}

/* Largest |x - y| over largest |y|. */
static double rel(const float *x, const float *y, size_t n)
{
    double most = 0, worst = 0;
    for (size_t i = 0; i < n; i++) most = fmax(most, fabs(y[i])), worst = fmax(worst, fabs((double)x[i] - y[i]));
    return most > 0 ? worst / most : worst;
}

/* Four steps with and without the rewrite: losses and params within tol (0: bit for bit). */
static void same_training(const char *file, const Setting *more, int n_more, double tol)
{
    enum { STEPS = 4 };
    int llama = !strcmp(file, "llama.fsm");
    Setting set[8];
    for (int i = 0; i < n_more; i++) set[i] = more[i];
    set[n_more] = (Setting){"fuse_residual", "1"};
    Plan *on = sample_compile(file, llama ? SAMPLE_LLAMA : SAMPLE_GPT2, llama ? 7 : 6, set, n_more + 1, NULL);
    set[n_more].value = "0";
    Plan *off = sample_compile(file, llama ? SAMPLE_LLAMA : SAMPLE_GPT2, llama ? 7 : 6, set, n_more + 1, NULL);
    cr_assert_lt(count_ops(on, "add"), count_ops(off, "add"), "the rewrite ran");
    float l_on[STEPS], l_off[STEPS];
    size_t n_on, n_off;
    float *p_on = sample_trained(on, 7, STEPS, l_on, &n_on), *p_off = sample_trained(off, 7, STEPS, l_off, &n_off);
    cr_assert_eq(n_on, n_off);
    for (int s = 0; s < STEPS; s++)
        cr_assert(fabsf(l_on[s] - l_off[s]) <= tol * fabsf(l_off[s]), "%s step %d: loss %.9g, apart %.9g", file, s + 1,
                  l_on[s], l_off[s]);
    double d = rel(p_on, p_off, n_off);
    cr_log_info("%s: params after %d steps differ by %.3g (relative)", file, STEPS, d);
    if (tol == 0) cr_assert(!memcmp(p_on, p_off, n_off * sizeof *p_on), "%s: params differ by %.3g", file, d);
    cr_assert(d <= tol, "%s: params differ by %.3g of the largest", file, d);
    free(p_on), free(p_off);
    plan_free(on), plan_free(off);
}

Test(residual, gpt2_fp32_bit_for_bit) { same_training("gpt2.fsm", NULL, 0, 0); }
Test(residual, gpt2_fp32_fsdp_recompute_accumulation_bit_for_bit)
{
    Setting s[] = {{"shard", "fsdp"}, {"recompute", "Block"}, {"microbatches", "2"}};
    same_training("gpt2.fsm", s, 3, 0);
}
Test(residual, gpt2_bf16) { same_training("gpt2.fsm", (Setting[]){{"precision", "bf16"}}, 1, 1e-2); }
Test(residual, gpt2_fp16_accumulation)
{
    same_training("gpt2.fsm", (Setting[]){{"precision", "fp16"}, {"microbatches", "2"}}, 2, 1e-2);
}
Test(residual, llama_fp32_bit_for_bit) { same_training("llama.fsm", NULL, 0, 0); }
Test(residual, llama_bf16) { same_training("llama.fsm", (Setting[]){{"precision", "bf16"}}, 1, 1e-2); }

/* ---- the kernels in f32 -------------------------------------------------------------------- */

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

/* dx of the _add form is the plain form's dx + r, bit for bit; dw and db are the same. */
Test(residual, norm_bwd_add_is_dx_plus_r)
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
Test(residual, matmul_add_kernels)
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
