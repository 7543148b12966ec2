/* tests/unit/test_pipeline.c: gradient accumulation (passes/pipeline.c) changes memory
 * and the order of sums, never the gradient.
 *  - Step 1's gradients with M = 2 and 4 micro-batches equal M = 1's on the same global
 *    batch (to fp32 rounding: the sums run in another order), for GPT-2 and Llama,
 *    unsharded and with every strategy at world 1 (flat buffers, gathers, regathers),
 *    with recompute, and in bf16 (to its tolerance).
 *  - The partial sums lie in the last one's bytes: no param holds M gradient buffers.
 *  - Each param is cast to 16 bits once a step, before the micro-batches: one copy.
 *  - ddp reduces once per step at any M; fsdp gathers each block per micro-batch for
 *    forward and backward, or once per step with reshard_after_forward 0.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen.h"
#include "frontend.h"
#include "passes.h"
#include "runtime.h"
#include "sample.h"

static const Define GPT2[] = {{"L", 2}, {"C", 32}, {"NH", 2}, {"T", 16}, {"V", 256}, {"B", 8}};
static const Define LLAMA[] = {{"L", 2}, {"C", 32}, {"NH", 2}, {"F", 64}, {"T", 16}, {"V", 256}, {"B", 8}};

/* With cast_in_update (0 or 1; passes/shard.c) as `cast`. */
static Plan *compile_cast(const char *file, const Define *defs, int n_defs, int m, const char *shard,
                          const char *precision, const char *recompute, const char *reshard, const char *cast)
{
    char mb[16];
    snprintf(mb, sizeof mb, "%d", m);
    Setting set[] = {{"microbatches", mb}, {"shard", shard}, {"precision", precision}, {"recompute", recompute},
                     {"reshard_after_forward", reshard}, {"cast_in_update", cast}};
    return sample_compile(file, defs, n_defs, set, 6, NULL);
}

static Plan *compile(const char *file, const Define *defs, int n_defs, int m, const char *shard, const char *precision,
                     const char *recompute, const char *reshard)
{
    return compile_cast(file, defs, n_defs, m, shard, precision, recompute, reshard, "1");
}

static void check_same_gradients(const char *file, const Define *defs, int n_defs, const char *shard,
                                 const char *precision, const char *recompute, double tol)
{
    Plan *one = compile(file, defs, n_defs, 1, shard, precision, recompute, "1");
    size_t n1;
    float *g1 = sample_step1_grads(one, &n1);
    double norm = 0;
    cr_assert_gt(n1, 1000);
    for (size_t i = 0; i < n1; i++) norm += g1[i] * g1[i];
    for (int m = 2; m <= 4; m *= 2) {
        Plan *acc = compile(file, defs, n_defs, m, shard, precision, recompute, "1");
        size_t n;
        float *g = sample_step1_grads(acc, &n);
        double diff = 0;
        cr_assert_eq(n, n1);
        for (size_t i = 0; i < n; i++) diff += (g[i] - g1[i]) * (g[i] - g1[i]);
        cr_expect_leq(sqrt(diff / norm), tol, "%s %s %s recompute %s, M %d: gradients differ from M = 1 by rel %.2e",
                      file, shard, precision, recompute, m, sqrt(diff / norm));
        cr_expect_lt(plan_space_bytes(acc, PLAN_PLACE_DEVICE), plan_space_bytes(one, PLAN_PLACE_DEVICE));
        free(g);
        plan_free(acc);
    }
    free(g1);
    plan_free(one);
}

Test(pipeline, gpt2_gradients) { check_same_gradients("gpt2.fsm", GPT2, 6, "none", "fp32", "none", 1e-6); }
Test(pipeline, llama_gradients) { check_same_gradients("llama.fsm", LLAMA, 7, "none", "fp32", "none", 1e-6); }
Test(pipeline, gpt2_gradients_ddp) { check_same_gradients("gpt2.fsm", GPT2, 6, "ddp", "fp32", "none", 1e-6); }
Test(pipeline, gpt2_gradients_zero1) { check_same_gradients("gpt2.fsm", GPT2, 6, "zero1", "fp32", "none", 1e-6); }
Test(pipeline, gpt2_gradients_zero2) { check_same_gradients("gpt2.fsm", GPT2, 6, "zero2", "fp32", "none", 1e-6); }
Test(pipeline, gpt2_gradients_fsdp) { check_same_gradients("gpt2.fsm", GPT2, 6, "fsdp", "fp32", "none", 1e-6); }
Test(pipeline, gpt2_gradients_fsdp_recompute) { check_same_gradients("gpt2.fsm", GPT2, 6, "fsdp", "fp32", "all", 1e-6); }
/* bf16: each micro-batch's gradient rounds to bf16 before it is summed. */
Test(pipeline, gpt2_gradients_fsdp_bf16) { check_same_gradients("gpt2.fsm", GPT2, 6, "fsdp", "bf16", "none", 2e-2); }
Test(pipeline, llama_gradients_zero2_bf16) { check_same_gradients("llama.fsm", LLAMA, 7, "zero2", "bf16", "all", 2e-2); }

static int count_ops(const Plan *p, const char *name)
{
    int n = 0;
    for (int32_t k = 0; k < p->n_ops; k++) n += !strcmp(plan_str(p, p->ops[k].op), name);
    return n;
}

Test(pipeline, partial_sums_share_the_last_ones_bytes)
{
    Plan *p = compile("gpt2.fsm", GPT2, 6, 4, "none", "fp32", "none", "1");
    int params = 0;
    for (int32_t i = 0; i < p->n_tensors; i++) {
        /* The model's params are views of their unit's flat buffer, and each one's gradient
         * ("<param>.grad") a view of the unit's flat gradient: the micro-batches' partial
         * sums lie in that gradient's bytes. */
        const PlanTensor *t = &p->tensors[i];
        if (t->role != PLAN_ROLE_PARAM || t->alias == PLAN_NONE) continue;
        char name[160];
        snprintf(name, sizeof name, "%s.grad", plan_str(p, t->name));
        int32_t g = 0;
        while (g < p->n_tensors && (p->tensors[g].name == PLAN_NONE || strcmp(plan_str(p, p->tensors[g].name), name)))
            g++;
        cr_assert_lt(g, p->n_tensors, "%s has no gradient", name);
        int32_t root = p->tensors[g].alias;
        cr_assert_neq(root, PLAN_NONE, "%s lies in no flat gradient", name);
        params++;
        int inside = 0;
        for (int32_t k = 0; k < p->n_tensors; k++)
            inside += k != g && p->tensors[k].alias == root && p->tensors[k].offset == p->tensors[g].offset;
        cr_expect_geq(inside, 3, "%s: %d partial sums in its gradient's bytes, not 3", name, inside);
    }
    cr_expect_gt(params, 10);
    /* Each micro-batch's rows of tokens and targets: views of the inputs (passes/slice_view.c). */
    cr_expect_eq(count_ops(p, "slice_view"), 2 * 4, "tokens and targets, each micro-batch's rows");
    cr_expect_eq(count_ops(p, "slice"), 0, "no copy of a micro-batch's rows");
    plan_free(p);
}

/* With cast_in_update 0, each unit's params are cast to 16 bits once a step (its whole
 * flat buffer in one cast), whatever the micro-batches and recompute: as many casts to
 * bf16 as with one micro-batch, one per unit (and none in a recompute), and every cast
 * before the first micro-batch's first op (the step's work, no micro-batch). With it on
 * (the default) the update writes them: no cast of a param at all. */
Test(pipeline, params_cast_once_a_step)
{
    Plan *kept = compile("gpt2.fsm", GPT2, 6, 4, "none", "bf16", "all", "1");
    for (int32_t k = 0; k < kept->n_ops; k++)
        cr_expect(strcmp(plan_str(kept, kept->ops[k].op), "cast") ||
                      kept->tensors[kept->ids[kept->ops[k].in]].role != PLAN_ROLE_PARAM,
                  "op %d casts a param: the update writes the 16-bit params", k);
    plan_free(kept);
    for (int r = 0; r < 2; r++) {
        const char *recompute = r ? "all" : "none";
        Plan *one = compile_cast("gpt2.fsm", GPT2, 6, 1, "none", "bf16", "none", "1", "0");
        Plan *four = compile_cast("gpt2.fsm", GPT2, 6, 4, "none", "bf16", recompute, "1", "0");
        int casts = 0, last_cast = -1, first_mb = four->n_ops;
        for (int32_t k = 0; k < four->n_ops; k++) {
            const PlanOp *op = &four->ops[k];
            if (op->microbatch != PLAN_NONE && k < first_mb) first_mb = k;
            if (strcmp(plan_str(four, op->op), "cast") || four->tensors[four->ids[op->in]].role != PLAN_ROLE_PARAM)
                continue;
            casts++, last_cast = k;
            cr_expect_eq(op->microbatch, PLAN_NONE, "op %d casts a param in micro-batch %d", k, op->microbatch);
        }
        int want = 0, units = 0;
        for (int32_t k = 0; k < one->n_ops; k++)
            want += !strcmp(plan_str(one, one->ops[k].op), "cast") && one->tensors[one->ids[one->ops[k].in]].role ==
                    PLAN_ROLE_PARAM;
        for (int32_t i = 0; i < one->n_tensors; i++)
            units += one->tensors[i].role == PLAN_ROLE_PARAM && one->tensors[i].alias == PLAN_NONE;
        cr_expect_eq(want, units, "%d casts of params with one micro-batch, %d units", want, units);
        cr_expect_geq(units, 3, "2 blocks and the params outside them: %d units", units);
        cr_expect_eq(casts, want, "recompute %s: %d casts of params with 4 micro-batches, %d with one", recompute,
                     casts, want);
        cr_expect_lt(last_cast, first_mb, "recompute %s: a param cast (op %d) after micro-batch 0 began (op %d)",
                     recompute, last_cast, first_mb);
        plan_free(one), plan_free(four);
    }
}

Test(pipeline, ddp_reduces_once_fsdp_gathers_per_micro_batch)
{
    Plan *d1 = compile("gpt2.fsm", GPT2, 6, 1, "ddp", "fp32", "none", "1");
    Plan *d4 = compile("gpt2.fsm", GPT2, 6, 4, "ddp", "fp32", "none", "1");
    cr_expect_eq(count_ops(d4, "all_reduce"), count_ops(d1, "all_reduce"));
    plan_free(d1);
    plan_free(d4);
    /* 2 blocks, and the params outside blocks gathered once for the step. */
    Plan *f1 = compile("gpt2.fsm", GPT2, 6, 1, "fsdp", "fp32", "none", "1");
    Plan *f4 = compile("gpt2.fsm", GPT2, 6, 4, "fsdp", "fp32", "none", "1");
    Plan *once = compile("gpt2.fsm", GPT2, 6, 4, "fsdp", "fp32", "none", "0");
    cr_expect_eq(count_ops(f1, "all_gather"), 2 * 2 + 1);
    cr_expect_eq(count_ops(f4, "all_gather"), 2 * 2 * 4 + 1);
    cr_expect_eq(count_ops(once, "all_gather"), 2 + 1);
    cr_expect_eq(count_ops(f4, "reduce_scatter"), count_ops(f1, "reduce_scatter"));
    plan_free(f1);
    plan_free(f4);
    plan_free(once);
}
