/* tests/unit/test_xent.c: the fused classifier (passes/xent.c, cross_entropy_fused).
 *  - With the rewrite (fuse_loss 1, the default) a training plan has one
 *    cross_entropy_fused per loss and no cross_entropy_bwd; the logits lie in dlogits'
 *    buffer (the plan's alias); without it (fuse_loss 0) the two ops are as before.
 *  - On the CPU backend both plans train bit for bit alike: step 1's gradients and three
 *    steps' losses, in fp32, bf16 and fp16 (its loss scale the seed), with gradient
 *    accumulation (the seed 1/M) and with recompute. The emulator's side is
 *    tests/cuda_emu (op_check of both plans against the CPU).
 *  - Logits that something else reads (a step output) are not written over.
 *  - GPT-2 124M, B=8, T=1024, bf16: the arena falls by the logits' gradient buffer less
 *    what the new peak holds beside it: the head's input gradient and the flat gradient
 *    of the params outside blocks, zeroed before the head's backward GEMM writes wte's.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "sample.h"

static int count_ops(const Plan *p, const char *name)
{
    int n = 0;
    for (int32_t k = 0; k < p->n_ops; k++) n += !strcmp(plan_str(p, p->ops[k].op), name);
    return n;
}

static Plan *tiny(const char *precision, const char *fuse, const char *microbatches, const char *recompute)
{
    Setting set[] = {{"precision", precision}, {"fuse_loss", fuse}, {"microbatches", microbatches},
                     {"recompute", recompute}};
    return sample_compile("gpt2.fsm", SAMPLE_GPT2, 6, set, 4, NULL);
}

static void same_training(const char *precision, const char *microbatches, const char *recompute)
{
    Plan *fused = tiny(precision, "1", microbatches, recompute), *apart = tiny(precision, "0", microbatches, recompute);
    int m = atoi(microbatches);
    cr_assert_eq(count_ops(fused, "cross_entropy_fused"), m, "%s: one fused loss per micro-batch", precision);
    cr_assert_eq(count_ops(fused, "cross_entropy_bwd") + count_ops(fused, "cross_entropy"), 0);
    cr_assert_eq(count_ops(apart, "cross_entropy_bwd"), m);
    cr_assert_eq(count_ops(apart, "cross_entropy_fused"), 0);
    for (int32_t k = 0; k < fused->n_ops; k++) {
        const PlanOp *op = &fused->ops[k];
        if (strcmp(plan_str(fused, op->op), "cross_entropy_fused")) continue;
        const PlanTensor *lg = &fused->tensors[fused->ids[op->in]], *dx = &fused->tensors[fused->ids[op->out + 2]];
        cr_assert_eq(lg->alias, fused->ids[op->out + 2], "the logits lie in dlogits' buffer");
        cr_assert_eq(dx->offset, lg->offset);
    }
    size_t n_f, n_a;
    float *gf = sample_step1_grads(fused, &n_f), *ga = sample_step1_grads(apart, &n_a);
    cr_assert_eq(n_f, n_a);
    for (size_t i = 0; i < n_f; i++)
        cr_assert(!memcmp(&gf[i], &ga[i], sizeof(float)), "%s M=%s %s: gradient element %zu: %.9g fused, %.9g apart",
                  precision, microbatches, recompute, i, gf[i], ga[i]);
    float lf[3], la[3];
    sample_losses(fused, 3, 3, lf), sample_losses(apart, 3, 3, la);
    for (int s = 0; s < 3; s++)
        cr_assert(!memcmp(&lf[s], &la[s], sizeof(float)), "%s: step %d loss %.9g fused, %.9g apart", precision, s + 1,
                  lf[s], la[s]);
    free(gf), free(ga);
    plan_free(fused), plan_free(apart);
}

Test(xent, fp32_trains_bit_for_bit_as_the_two_ops) { same_training("fp32", "1", "none"); }
Test(xent, bf16_trains_bit_for_bit_as_the_two_ops) { same_training("bf16", "1", "none"); }
Test(xent, fp16_loss_scaling_and_accumulation) { same_training("fp16", "2", "none"); }
Test(xent, bf16_accumulation_with_recompute) { same_training("bf16", "2", "Block"); }

/* Logits the step outputs are read after the loss: the two ops stay apart. */
Test(xent, logits_read_after_the_loss_are_kept)
{
    static const char SRC[] = "model m {\n"
                              "  dim B = 4, D = 8, K = 5;\n"
                              "  input x: f32[B, D];\n"
                              "  input y: i32[B];\n"
                              "  param w: [D, K] = normal(0.1);\n"
                              "  logits = x @ w;\n"
                              "  loss = cross_entropy(logits, y);\n"
                              "  output logits;\n"
                              "}\n";
    Plan *p = sample_compile_source("kept.fsm", SRC, NULL, 0, NULL, 0, NULL);
    cr_assert_eq(count_ops(p, "cross_entropy_fused"), 0);
    cr_assert_eq(count_ops(p, "cross_entropy"), 1);
    cr_assert_eq(count_ops(p, "cross_entropy_bwd"), 1);
    plan_free(p);
}

static int64_t align64(int64_t n) { return (n + 63) / 64 * 64; }

/* GPT-2 124M (the sample's own dims: B=8, T=1024, V=50257, C=768) in bf16. Apart, the
 * peak is the backward of the loss, where the logits and their gradient are both live;
 * fused, the largest live set holds one of them, the head's input gradient [B, T, C] that
 * its backward GEMM writes while it reads them, and the root unit's flat bf16 gradient
 * (wte, wpe, lnf: 39,385,344 elements), zeroed before that GEMM writes wte's part. (A
 * zero-fill of only the parts no GEMM overwrites would take those 75 MiB back.) */
Test(xent, gpt2_124m_bf16_arena_loses_the_logits_gradient, .timeout = 120)
{
    Setting fused_set[] = {{"precision", "bf16"}}, apart_set[] = {{"precision", "bf16"}, {"fuse_loss", "0"}};
    Plan *fused = sample_compile("gpt2.fsm", NULL, 0, fused_set, 1, NULL);
    Plan *apart = sample_compile("gpt2.fsm", NULL, 0, apart_set, 2, NULL);
    int64_t dlogits = align64(8LL * 1024 * 50257 * 2), dx = align64(8LL * 1024 * 768 * 2) + align64(39385344LL * 2);
    int64_t a = plan_space_bytes(apart, PLAN_PLACE_DEVICE), f = plan_space_bytes(fused, PLAN_PLACE_DEVICE);
    cr_log_info("arena %lld apart, %lld fused: %lld less", (long long)a, (long long)f, (long long)(a - f));
    cr_assert_geq(a - f, dlogits - dx, "arena %lld apart, %lld fused: %lld less, want at least %lld", (long long)a,
                  (long long)f, (long long)(a - f), (long long)(dlogits - dx));
    /* No buffer of the gradient's size is left: the logits' is the only one that large. */
    int big = 0;
    for (int32_t t = 0; t < fused->n_tensors; t++)
        big += fused->tensors[t].alias == PLAN_NONE && plan_tensor_nbytes(&fused->tensors[t]) >= 8LL * 1024 * 50257 * 2;
    cr_assert_eq(big, 1, "buffers of the logits' size: %d", big);
    plan_free(fused), plan_free(apart);
}
