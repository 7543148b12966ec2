/* tests/unit/test_packed_attn.c: attention on the QKV projection's packed output
 * (passes/packed_attn.c, attention_qkv), and Llama's on its projections' rows (attention_rows, rope_rows).
 *  - With the rewrite (pack_attention 1, the default) a GPT-2 training plan has one
 *    attention_qkv and one attention_qkv_bwd per block and not one split, heads,
 *    merge_heads, concat or attention; without it (0) the chain is back. Llama (rope on q
 *    and k after heads, grouped-query attention) gets rope_rows and attention_rows instead:
 *    no heads, merge_heads or rope left.
 *  - On the CPU backend both plans train alike (fp32 to rounding, bf16 and fp16 within
 *    their rounding): step 1's gradients and three steps' losses, with full and selective
 *    (`attention:`) recompute and with gradient accumulation. The emulator's side is
 *    tests/cuda_emu (op_check of attn_qkv.fsm and of GPT-2's and Llama's plans against the CPU).
 *  - The layout copies' tensors leave the memory plan: in the plan without the rewrite
 *    they hold, per block and micro-batch, (3 + 3 + 1) B T C elements made by the forward
 *    (split's q, k, v, heads' three, merge_heads' y) and 1 + 3 + 3 + 1 by the backward
 *    (heads of y's gradient, merge_heads of dq, dk, dv, their concat, merge_heads made again
 *    for the projection's weight gradient: passes/recompute.c); with it, none.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sample.h"

static int count_ops(const Plan *p, const char *name)
{
    int n = 0;
    for (int32_t k = 0; k < p->n_ops; k++) n += !strcmp(plan_str(p, p->ops[k].op), name);
    return n;
}

static const char *const COPIES[] = {"split", "heads", "merge_heads", "concat"};

static Plan *tiny(const char *file, const char *precision, const char *pack, const char *microbatches,
                  const char *recompute)
{
    Setting set[] = {{"precision", precision}, {"pack_attention", pack}, {"microbatches", microbatches},
                     {"recompute", recompute}};
    int gpt2 = !strcmp(file, "gpt2.fsm");
    return sample_compile(file, gpt2 ? SAMPLE_GPT2 : SAMPLE_LLAMA, gpt2 ? 6 : 7, set, 4, NULL);
}

/* The largest difference of a and b relative to the largest |b|. */
static double rel_diff(const float *a, const float *b, size_t n)
{
    double most = 0, worst = 0;
    for (size_t i = 0; i < n; i++) most = fmax(most, fabs(b[i]));
    for (size_t i = 0; i < n; i++) worst = fmax(worst, fabs((double)a[i] - b[i]));
    return most > 0 ? worst / most : worst;
}

/* The ops of `file`'s packed attention (GPT-2: attention_qkv; Llama: rope_rows and attention_rows). */
typedef struct {
    const char *file, *fwd, *bwd;
} Packed;
static const Packed GPT2 = {"gpt2.fsm", "attention_qkv", "attention_qkv_bwd"};
static const Packed LLAMA = {"llama.fsm", "attention_rows", "attention_rows_bwd"};

static void same_training(const Packed *m, const char *precision, const char *microbatches, const char *recompute,
                          double tol)
{
    Plan *in = tiny(m->file, precision, "1", microbatches, recompute);
    Plan *apart = tiny(m->file, precision, "0", microbatches, recompute);
    int mb = atoi(microbatches), L = 2;
    cr_assert_eq(count_ops(in, m->bwd), L * mb, "%s %s: one packed backward per block and micro-batch", m->file,
                 precision);
    cr_assert_geq(count_ops(in, m->fwd), L * mb);
    for (size_t i = 0; i < sizeof COPIES / sizeof *COPIES; i++)
        cr_assert_eq(count_ops(in, COPIES[i]), 0, "%s %s: a %s is left", m->file, precision, COPIES[i]);
    cr_assert_eq(count_ops(in, "attention") + count_ops(in, "attention_bwd") + count_ops(in, "rope"), 0);
    cr_assert_eq(count_ops(apart, m->fwd) + count_ops(apart, m->bwd) + count_ops(apart, "rope_rows"), 0);
    cr_assert_eq(count_ops(apart, "attention_bwd"), L * mb);

    size_t n_i, n_a;
    float *gi = sample_step1_grads(in, &n_i), *ga = sample_step1_grads(apart, &n_a);
    cr_assert_eq(n_i, n_a);
    double d = rel_diff(gi, ga, n_a);
    cr_log_info("%s %s M=%s %s: gradients differ by %.3g of the largest", m->file, precision, microbatches, recompute,
                d);
    cr_assert(d <= tol, "%s %s M=%s %s: gradients differ by %.3g of the largest", m->file, precision, microbatches,
              recompute, d);
    float li[3], la[3];
    sample_losses(in, 3, 3, li), sample_losses(apart, 3, 3, la);
    for (int s = 0; s < 3; s++)
        cr_assert(fabs(li[s] - la[s]) <= tol * fabs(la[s]), "%s %s: step %d loss %.9g packed, %.9g apart", m->file,
                  precision, s + 1, li[s], la[s]);
    free(gi), free(ga);
    plan_free(in), plan_free(apart);
}

Test(packed_attn, fp32_to_rounding) { same_training(&GPT2, "fp32", "1", "none", 1e-6); }
Test(packed_attn, fp32_full_recompute) { same_training(&GPT2, "fp32", "1", "Block", 1e-6); }
Test(packed_attn, fp32_selective_recompute_and_accumulation)
{
    same_training(&GPT2, "fp32", "2", "attention:Block", 1e-6);
}
Test(packed_attn, bf16_within_its_rounding) { same_training(&GPT2, "bf16", "1", "none", 1e-2); }
Test(packed_attn, fp16_accumulation_within_its_rounding) { same_training(&GPT2, "fp16", "2", "attention:Block", 2e-3); }

/* Llama: rope on q and k, grouped-query attention (4 query heads over 2 kv heads). */
Test(packed_attn, llama_fp32_to_rounding) { same_training(&LLAMA, "fp32", "1", "none", 1e-6); }
Test(packed_attn, llama_fp32_full_recompute) { same_training(&LLAMA, "fp32", "1", "Block", 1e-6); }
Test(packed_attn, llama_fp32_selective_recompute_and_accumulation)
{
    same_training(&LLAMA, "fp32", "2", "attention:Block", 1e-6);
}
Test(packed_attn, llama_bf16_within_its_rounding) { same_training(&LLAMA, "bf16", "1", "none", 1e-2); }
Test(packed_attn, llama_fp16_accumulation_within_its_rounding)
{
    same_training(&LLAMA, "fp16", "2", "attention:Block", 2e-3);
}

/* Selective recompute reruns the packed op (and the QKV projection that feeds it) before the backward. */
Test(packed_attn, selective_recompute_reruns_the_packed_op)
{
    Plan *p = tiny("gpt2.fsm", "fp32", "1", "1", "attention:Block");
    cr_assert_eq(count_ops(p, "attention_qkv"), 2 * 2, "each block's forward and its rerun");
    plan_free(p);
    p = tiny("llama.fsm", "fp32", "1", "1", "attention:Block");
    cr_assert_eq(count_ops(p, "attention_rows"), 2 * 2, "each block's forward and its rerun");
    cr_assert_eq(count_ops(p, "rope_rows"), 2 * 2 * 2 + 2 * 2, "q's and k's rope, forward, rerun and backward");
    plan_free(p);
}

/* Elements of the tensors the layout copies make. */
static int64_t copy_elements(const Plan *p)
{
    int64_t n = 0;
    for (int32_t k = 0; k < p->n_ops; k++) {
        const PlanOp *op = &p->ops[k];
        for (size_t c = 0; c < sizeof COPIES / sizeof *COPIES; c++) {
            if (strcmp(plan_str(p, op->op), COPIES[c])) continue;
            for (int32_t o = 0; o < op->n_out; o++) {
                const PlanTensor *t = &p->tensors[p->ids[op->out + o]];
                int64_t e = 1;
                for (int d = 0; d < t->rank; d++) e *= t->shape[d];
                n += e;
            }
        }
    }
    return n;
}

Test(packed_attn, the_layout_copies_leave_the_memory_plan)
{
    Plan *in = tiny("gpt2.fsm", "fp32", "1", "1", "none"), *apart = tiny("gpt2.fsm", "fp32", "0", "1", "none");
    int64_t L = 2, B = 4, T = 32, C = 64;  // SAMPLE_GPT2
    cr_assert_eq(copy_elements(in), 0);
    cr_assert_eq(copy_elements(apart), L * (7 + 8) * B * T * C, "%lld elements of layout copies, want %lld",
                 (long long)copy_elements(apart), (long long)(L * 15 * B * T * C));
    /* What the backward keeps is x and y (and lse) instead of the three heads and y: the same bytes. */
    cr_assert_leq(plan_space_bytes(in, PLAN_PLACE_DEVICE), plan_space_bytes(apart, PLAN_PLACE_DEVICE));
    plan_free(in), plan_free(apart);
}

/* Llama's copies, per block and micro-batch: heads of q, k, v and merge_heads of the output forward; heads of the
 * output's gradient, merge_heads of dq, dk, dv and merge_heads made again for wo's weight gradient backward: 5 B T C
 * and 4 B T NKV HD elements. Packed, none (rope_rows and attention_rows read and write the projections' rows). */
Test(packed_attn, llama_layout_copies_leave_the_memory_plan)
{
    Plan *in = tiny("llama.fsm", "fp32", "1", "1", "none"), *apart = tiny("llama.fsm", "fp32", "0", "1", "none");
    int64_t L = 2, B = 4, T = 32, C = 64, KV = 2 * 16;  // SAMPLE_LLAMA, NKV = 2 heads of HD = C / NH = 16
    cr_assert_eq(copy_elements(in), 0);
    cr_assert_eq(copy_elements(apart), L * B * T * (5 * C + 4 * KV), "%lld elements of layout copies, want %lld",
                 (long long)copy_elements(apart), (long long)(L * B * T * (5 * C + 4 * KV)));
    /* Saved for the backward: the turned q and k, v and o where they lie instead of their heads: the same bytes. */
    cr_assert_leq(plan_space_bytes(in, PLAN_PLACE_DEVICE), plan_space_bytes(apart, PLAN_PLACE_DEVICE));
    plan_free(in), plan_free(apart);
}
