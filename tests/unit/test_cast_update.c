/* tests/unit/test_cast_update.c: the update writing the 16-bit params (cast_in_update,
 * passes/shard.c; adamw_cast and sgd_cast, runtime/cpu/optim.c; rt_exec_cast_params).
 *  - The plan: with the setting on, a mixed-precision plan updates each trained unit with
 *    adamw_cast or sgd_cast, casts no trained unit's master in the step (none, ddp: no
 *    cast of the storage; zero1, zero2, fsdp: the gathers send the 16-bit params the
 *    update wrote), and keeps those params between steps (role param16, persistent);
 *    with offload the host's update writes them there, and the copy to the device sends
 *    them (no host cast); frozen units and fp32 plans keep their old path.
 *  - The CPU backend trains a plan with it as the one without, bit for bit: every step's
 *    loss and every fp32 param after four steps, for AdamW and SGD, bf16 and fp16 (with
 *    its loss scale), shard none, zero1, zero2 and fsdp, gradient accumulation, recompute,
 *    a frozen param and offload; and after every step the 16-bit params equal cast(master).
 * The emulated CUDA kernels: tests/cuda_emu (op_check compares adamw_cast's w with the
 * CPU's; train.py trains with and without the setting on the emulator).
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "sample.h"

static Plan *gpt2(const char *on, const Setting *more, int n_more)
{
    Setting set[12] = {{"cast_in_update", on}, {"clip", "1.0"}};
    for (int i = 0; i < n_more; i++) set[i + 2] = more[i];
    return sample_compile("gpt2.fsm", SAMPLE_GPT2, 6, set, n_more + 2, NULL);
}

static int count_ops(const Plan *p, const char *name)
{
    int n = 0;
    for (int32_t k = 0; k < p->n_ops; k++) n += !strcmp(plan_str(p, p->ops[k].op), name);
    return n;
}

/* Casts whose input is an fp32 param storage (a unit's master): the per-step casts the
 * setting takes away. */
static int master_casts(const Plan *p)
{
    int n = 0;
    for (int32_t k = 0; k < p->n_ops; k++) {
        const PlanOp *op = &p->ops[k];
        if (strcmp(plan_str(p, op->op), "cast") || op->n_in < 1) continue;
        const PlanTensor *x = &p->tensors[p->ids[op->in]];
        n += x->role == PLAN_ROLE_PARAM && x->dtype == PLAN_DT_F32;
    }
    return n;
}

static int count_role(const Plan *p, PlanRole r)
{
    int n = 0;
    for (int32_t i = 0; i < p->n_tensors; i++) n += p->tensors[i].role == r && p->tensors[i].alias == PLAN_NONE;
    return n;
}

Test(cast_update, plan)
{
    const char *shards[] = {"none", "ddp", "zero1", "zero2", "fsdp"};
    for (int s = 0; s < 5; s++) {
        Setting more[] = {{"precision", "bf16"}, {"shard", shards[s]}};
        Plan *on = gpt2("1", more, 2), *off = gpt2("0", more, 2);
        int units = count_ops(off, "adamw");
        cr_assert_gt(units, 0);
        cr_expect_eq(count_ops(on, "adamw_cast"), units, "%s: one adamw_cast per unit", shards[s]);
        cr_expect_eq(count_ops(on, "adamw"), 0, "%s", shards[s]);
        cr_expect_eq(master_casts(on), 0, "%s: no cast of a master in the step", shards[s]);
        cr_expect_gt(master_casts(off), 0, "%s: the old path casts each unit", shards[s]);
        cr_expect_eq(count_role(on, PLAN_ROLE_PARAM16), units, "%s: a 16-bit copy per unit", shards[s]);
        cr_expect_eq(count_role(off, PLAN_ROLE_PARAM16), 0, "%s", shards[s]);
        for (int32_t i = 0; i < on->n_tensors; i++)
            if (on->tensors[i].role == PLAN_ROLE_PARAM16) cr_expect(plan_tensor_is_persistent(&on->tensors[i]));
        plan_free(on), plan_free(off);
    }
    /* fp32 has no 16-bit params; offload's are on the host, sent as they are, when the update is delayed (else the
     * host casts, as without the setting: passes/offload.c says why); a frozen unit is cast once a step. */
    Setting fp32[] = {{"precision", "fp32"}},
            offload[] = {{"precision", "bf16"}, {"offload", "optimizer"}, {"delayed_update", "1"}};
    Setting frozen[] = {{"precision", "bf16"}, {"freeze", "h.0"}};
    Plan *a = gpt2("1", fp32, 1), *b = gpt2("1", offload, 3), *c = gpt2("1", frozen, 2);
    Plan *b0 = gpt2("0", offload, 3);
    cr_expect_eq(count_ops(a, "adamw_cast"), 0);
    cr_expect_eq(count_ops(b, "adamw_cast"), count_ops(b0, "adamw"));
    cr_expect_eq(master_casts(b), 0, "offload: the host's update writes the 16-bit params");
    cr_expect_eq(master_casts(b0), count_ops(b0, "adamw"), "offload without: a host cast per unit");
    for (int32_t i = 0; i < b->n_tensors; i++)
        if (b->tensors[i].role == PLAN_ROLE_PARAM16) cr_expect_eq(b->tensors[i].place, PLAN_PLACE_HOST);
    plan_free(b0);
    Plan *plain = gpt2("1", (Setting[]){{"precision", "bf16"}, {"offload", "optimizer"}}, 2);
    cr_expect_eq(count_ops(plain, "adamw_cast"), 0, "offload, no delay: the host casts");
    cr_expect_eq(master_casts(plain), count_ops(plain, "adamw"));
    plan_free(plain);
    cr_expect_gt(count_ops(c, "adamw_cast"), 0);
    cr_expect_eq(count_ops(c, "adamw"), 0);
    cr_expect_eq(master_casts(c), 1, "the frozen block's cast, each step");
    plan_free(a), plan_free(b), plan_free(c);
}

/* After each step of e, every adamw_cast's and sgd_cast's w is the cast of its p. */
static void expect_copies_cast(const Exec *e, const char *what, int step)
{
    const Plan *p = rt_exec_plan(e);
    int seen = 0;
    for (int32_t k = 0; k < p->n_ops; k++) {
        int at = ops_update_copy_input(op_lookup(plan_str(p, p->ops[k].op)));
        if (at < 0) continue;
        int32_t m = p->ids[p->ops[k].in], w = p->ids[p->ops[k].in + at];
        const float *src = rt_exec_data(e, m);
        const uint16_t *dst = rt_exec_data(e, w);
        int bf16 = p->tensors[w].dtype == PLAN_DT_BF16;
        for (int64_t i = 0; i < plan_tensor_numel(&p->tensors[m]); i++) {
            uint16_t want = bf16 ? cpu_f32_to_bf16(src[i]) : cpu_f32_to_f16(src[i]);
            if (dst[i] != want)
                cr_assert_fail("%s, step %d: op %d's w[%lld] is %#x, cast(p) %#x", what, step, k, (long long)i, dst[i],
                               want);
        }
        seen++;
    }
    cr_assert_gt(seen, 0, "%s: no update writes 16-bit params", what);
}

/* Four steps of the plan with and without the setting: the same losses and fp32 params,
 * to the bit; the 16-bit params cast(master) from init on. */
static void same_training(const char *what, const Setting *more, int n_more)
{
    enum { STEPS = 4 };
    Plan *on = gpt2("1", more, n_more), *off = gpt2("0", more, n_more);
    float la[STEPS], lb[STEPS];
    size_t na, nb;
    float *a = sample_trained(on, 7, STEPS, la, &na), *b = sample_trained(off, 7, STEPS, lb, &nb);
    cr_assert_eq(na, nb, "%s", what);
    cr_assert(na > 0);
    for (int s = 0; s < STEPS; s++)
        cr_expect_eq(la[s], lb[s], "%s, step %d: loss %.9g vs %.9g", what, s + 1, la[s], lb[s]);
    cr_expect_eq(memcmp(a, b, sizeof(float) * na), 0, "%s: the fp32 params differ after %d steps", what, STEPS);
    free(a), free(b);
    RtData *data;
    Exec *e = sample_exec(on, 7, &data);
    expect_copies_cast(e, what, 0);
    for (int s = 1; s <= 2; s++) {
        rt_data_fill(data, s);
        cr_assert_eq(rt_exec_run(e, s, RT_PHASES_ALL), 0, "%s: step %d", what, s);
        expect_copies_cast(e, what, s);
    }
    rt_exec_free(e), rt_data_close(data);
    plan_free(on), plan_free(off);
}

Test(cast_update, adamw_bf16_none) { same_training("adamw bf16", (Setting[]){{"precision", "bf16"}}, 1); }
Test(cast_update, adamw_fp16_loss_scale)
{
    same_training("adamw fp16", (Setting[]){{"precision", "fp16"}}, 1);
}
Test(cast_update, sgd_bf16_momentum)
{
    same_training("sgd bf16", (Setting[]){{"precision", "bf16"}, {"optimizer", "sgd"}, {"momentum", "0.9"}}, 3);
}
Test(cast_update, zero1_fp16_sgd)
{
    same_training("zero1 fp16 sgd", (Setting[]){{"precision", "fp16"}, {"shard", "zero1"}, {"optimizer", "sgd"}}, 3);
}
Test(cast_update, zero2_bf16_accumulate)
{
    same_training("zero2 bf16 accumulation", (Setting[]){{"precision", "bf16"}, {"shard", "zero2"},
                                                         {"microbatches", "2"}}, 3);
}
Test(cast_update, offload_bf16_adamw)
{
    same_training("offload bf16 delayed", (Setting[]){{"precision", "bf16"}, {"offload", "optimizer"},
                                                      {"delayed_update", "1"}}, 3);
}
Test(cast_update, offload_fp16_sgd)
{
    same_training("offload fp16 sgd delayed", (Setting[]){{"precision", "fp16"}, {"offload", "optimizer"},
                                                          {"optimizer", "sgd"}, {"momentum", "0.9"},
                                                          {"delayed_update", "1"}}, 5);
}
Test(cast_update, fsdp_bf16_recompute_frozen)
{
    same_training("fsdp bf16 recompute frozen", (Setting[]){{"precision", "bf16"}, {"shard", "fsdp"},
                                                            {"recompute", "Block"}, {"freeze", "h.1.ln1.w"}}, 4);
}
