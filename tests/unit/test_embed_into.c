/* tests/unit/test_embed_into.c: a tied embedding's gradient added in place
 * (passes/embed_into.c, embedding_bwd_into).
 *  - With the rewrite (embed_grad_into 1, the default) GPT-2's wte gets its gradient from
 *    an embedding_bwd_into per micro-batch (fp32 accumulation: all but the first) over the
 *    head's gradient, whose bytes it
 *    takes (the plan's alias), and no add of two dense [V, C] tables; the position
 *    embedding, untied, keeps its embedding_bwd. Without it (0), the add is back.
 *  - On the CPU backend both plans give step 1's gradients alike: fp32 to rounding (the
 *    same terms in another association), bf16 and fp16 within 16-bit rounding (the sum
 *    is rounded once, where the add rounded twice), with accumulation too; and both
 *    train three steps to the same losses within that tolerance.
 * The emulator's side is tests/cuda_emu (op_check of both plans against the CPU).
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

static Plan *tiny(const char *precision, const char *into, const char *microbatches)
{
    Setting set[] = {{"precision", precision}, {"embed_grad_into", into}, {"microbatches", microbatches}};
    return sample_compile("gpt2.fsm", SAMPLE_GPT2, 6, set, 3, NULL);
}

/* `into` of the m micro-batches' wte gradients rewritten (fp32 accumulation keeps the first
 * micro-batch's add: its sum lies in the whole sum's bytes, passes/pipeline.c). */
static void same_gradients(const char *precision, const char *microbatches, int into, double tol)
{
    Plan *in = tiny(precision, "1", microbatches), *apart = tiny(precision, "0", microbatches);
    int m = atoi(microbatches);
    cr_assert_eq(count_ops(in, "embedding_bwd_into"), into, "%s M=%d", precision, m);
    cr_assert_eq(count_ops(in, "embedding_bwd"), 2 * m - into, "%s M=%d", precision, m);
    cr_assert_eq(count_ops(apart, "embedding_bwd_into"), 0);
    cr_assert_eq(count_ops(apart, "embedding_bwd"), 2 * m);
    for (int32_t k = 0; k < in->n_ops; k++) {
        const PlanOp *op = &in->ops[k];
        if (strcmp(plan_str(in, op->op), "embedding_bwd_into")) continue;
        const PlanTensor *acc = &in->tensors[in->ids[op->in]], *out = &in->tensors[in->ids[op->out]];
        cr_assert_eq(out->offset, acc->offset, "the rows are added in the head gradient's own bytes");
        cr_assert_eq(acc->place, out->place, "the head's gradient and the sum in one space");
    }
    size_t n_i, n_a;
    float *gi = sample_step1_grads(in, &n_i), *ga = sample_step1_grads(apart, &n_a);
    cr_assert_eq(n_i, n_a);
    double most = 0, worst = 0;
    for (size_t i = 0; i < n_a; i++) most = fmax(most, fabs(ga[i]));
    for (size_t i = 0; i < n_a; i++) worst = fmax(worst, fabs((double)gi[i] - ga[i]));
    cr_log_info("%s M=%s: largest gradient difference %.3g of %.3g", precision, microbatches, worst, most);
    cr_assert(most > 0 && worst <= tol * most, "%s M=%s: gradients differ by %.3g (largest %.3g)", precision,
              microbatches, worst, most);
    free(gi), free(ga);
    plan_free(in), plan_free(apart);
}

Test(embed_into, fp32_to_rounding) { same_gradients("fp32", "1", 1, 1e-6); }
Test(embed_into, fp32_accumulation_to_rounding) { same_gradients("fp32", "2", 1, 1e-6); }
Test(embed_into, bf16_within_its_rounding) { same_gradients("bf16", "1", 1, 1e-2); }
Test(embed_into, fp16_accumulation_within_its_rounding) { same_gradients("fp16", "2", 2, 2e-3); }
