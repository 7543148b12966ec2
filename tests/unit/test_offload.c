/* tests/unit/test_offload.c: the offload pass (passes/offload.c) against ZeRO-Offload's
 * accounting, from the plan alone, and one run each way.
 *  - zero2 in bf16 over W ranks (Psi_pad the padded flat units): without offload, ZeRO-2's
 *    layout (the fp32 master shard, 4 bytes x Psi_pad / W, and the moments, 8 x Psi_pad /
 *    W, on the device, the params as 16-bit buffers of Psi_pad, 16-bit collectives of
 *    2 Psi_pad bytes each); with it, the host holds exactly the master shard and the
 *    moments, and the device no optimizer state but the step count, no fp32 param, the
 *    16-bit params and their shard. A step copies 2 x Psi_pad / W bytes each way (+ 12
 *    bytes of scalars to the host); fp32 zero1 copies 4 x.
 *  - Only the copies touch both spaces: a plan whose update reads a device tensor fails
 *    plan_check.
 *  - The CUDA program leaves the ops of the host space to the host.
 *  - The same training: two steps of the unsharded plan in bf16 with and without
 *    offload (and, without clipping, with the updates run during the backward; in fp32
 *    too) leave every param bitwise equal (poisoning dead buffers, and guarding both
 *    arenas: the host space's live ranges and bounds hold), and the executor's copy
 *    counters are the plan's bytes.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "backend.h"
#include "report.h"
#include "sample.h"

static const Define GPT2[] = {{"L", 2}, {"C", 32}, {"NH", 2}, {"T", 16}, {"V", 256}, {"B", 4}};

/* clip: "1.0" is the sample's own; "0" lets the schedule run the host updates during
 * the backward (passes/schedule.c). */
static Plan *compile_clip(const char *shard, const char *precision, const char *world, const char *offload,
                          const char *clip)
{
    Setting set[] = {{"shard", shard}, {"precision", precision}, {"world", world}, {"offload", offload},
                     {"optimizer", "adamw"}, {"clip", clip}};
    return sample_compile("gpt2.fsm", GPT2, 6, set, 6, NULL);
}

static Plan *compile(const char *shard, const char *precision, const char *world, const char *offload)
{
    return compile_clip(shard, precision, world, offload, "1.0");
}

/* The elements of every unit's flat param buffer, padding included: Psi_pad. */
static int64_t padded_params(const Plan *p)
{
    int64_t n = 0;
    for (int32_t i = 0; i < p->n_tensors; i++)
        if (p->tensors[i].role == PLAN_ROLE_PARAM && rt_flat_is_storage(p, i)) n += plan_tensor_numel(&p->tensors[i]);
    return n;
}

/* Bytes of the buffers (roots) of `role` in `place`, of dtype dt (PLAN_DT_COUNT: any). */
static int64_t bytes_of(const Plan *p, PlanRole role, PlanPlace place, PlanDType dt)
{
    int64_t n = 0;
    for (int32_t i = 0; i < p->n_tensors; i++) {
        const PlanTensor *t = &p->tensors[i];
        if (t->alias == PLAN_NONE && t->role == role && t->place == place && (dt == PLAN_DT_COUNT || t->dtype == dt))
            n += plan_tensor_nbytes(t);
    }
    return n;
}

Test(offload, zero2_bf16_holds_zero_offloads_partition)
{
    const int W = 4;
    Plan *off = compile("zero2", "bf16", "4", "optimizer"), *dev = compile("zero2", "bf16", "4", "none");
    int64_t psi = padded_params(dev) * W;  // zero2 in 16 bits stores this rank's fp32 shard of each unit
    cr_assert_gt(psi, 30000);
    /* Without offload: ZeRO-2's layout on the device, the fp32 master and the moments sharded. */
    cr_expect_eq(bytes_of(dev, PLAN_ROLE_PARAM, PLAN_PLACE_DEVICE, PLAN_DT_F32), 4 * psi / W);
    cr_expect_eq(bytes_of(dev, PLAN_ROLE_OPT_STATE, PLAN_PLACE_DEVICE, PLAN_DT_F32), 8 * psi / W);
    cr_expect_eq(bytes_of(dev, PLAN_ROLE_PARAM16, PLAN_PLACE_DEVICE, PLAN_DT_BF16), 2 * psi,
                 "the 16-bit params, which the update writes (cast_in_update)");
    /* The host: the master shard and the moments, exactly; the device held them before. */
    cr_expect_eq(bytes_of(off, PLAN_ROLE_PARAM, PLAN_PLACE_HOST, PLAN_DT_F32), 4 * psi / W);
    cr_expect_eq(bytes_of(off, PLAN_ROLE_OPT_STATE, PLAN_PLACE_HOST, PLAN_DT_F32), 8 * psi / W);
    /* The device: the step count, no fp32 params, the params in 16 bits (and their shard). */
    cr_expect_eq(bytes_of(off, PLAN_ROLE_OPT_STATE, PLAN_PLACE_DEVICE, PLAN_DT_COUNT), 4);
    cr_expect_eq(bytes_of(off, PLAN_ROLE_PARAM, PLAN_PLACE_DEVICE, PLAN_DT_COUNT), 0);
    cr_expect_eq(bytes_of(off, PLAN_ROLE_GATHERED, PLAN_PLACE_DEVICE, PLAN_DT_BF16), 2 * psi + 2 * psi / W);
    cr_expect_lt(plan_space_bytes(off, PLAN_PLACE_DEVICE), plan_space_bytes(dev, PLAN_PLACE_DEVICE));
    cr_expect_eq(plan_space_bytes(dev, PLAN_PLACE_HOST), 0);
    cr_expect_geq(plan_space_bytes(off, PLAN_PLACE_HOST), 12 * psi / W);
    /* What crosses per step and rank: 16-bit gradients and params of this rank's shard;
     * the collectives move what they did. */
    CommTotals c = comm_totals(off), none = comm_totals(dev);
    cr_expect_eq(c.to_device_bytes, 2.0 * (double)psi / W);
    cr_expect_eq(c.to_host_bytes, 2.0 * (double)psi / W + 12);
    cr_expect_eq(none.copies, 0);
    cr_expect_eq(c.bytes, none.bytes, "%.0f vs %.0f bytes", c.bytes, none.bytes);
    cr_expect_eq(none.bytes, 2.0 * 2 * (double)psi + 2 * 2 * 4, "ZeRO-2: a 16-bit reduce-scatter and all-gather of "
                 "Psi each, and the all-reduces of the loss and the norm: %.0f bytes", none.bytes);
    /* The memory report's model state, per space. */
    char err[256];
    MemReport *r = report_mem_new(off, err, sizeof err), *q = report_mem_new(dev, err, sizeof err);
    cr_assert(r && q, "%s", err);
    cr_expect_eq(r->host_state[MEM_OPT_STATE], q->state[MEM_OPT_STATE] - 4, "the moments moved; the step count stays");
    cr_expect_eq(r->host_state[MEM_PARAMS32], 4 * psi / W);
    cr_expect_eq(r->state[MEM_PARAMS16], 2 * psi, "the device's 16-bit params: gathered once a step (the 16-bit "
                 "shard copied from the host is part of them)");
    cr_expect_eq(r->state[MEM_OPT_STATE] + r->state[MEM_PARAMS32], 4);
    report_mem_free(r);
    report_mem_free(q);
    plan_free(off);
    plan_free(dev);
}

Test(offload, fp32_copies_fp32)
{
    Plan *off = compile("zero1", "fp32", "2", "optimizer");
    int64_t psi = bytes_of(off, PLAN_ROLE_PARAM, PLAN_PLACE_HOST, PLAN_DT_F32) / 4 * 2;
    CommTotals c = comm_totals(off);
    cr_expect_eq(c.to_device_bytes, 4.0 * (double)psi / 2);
    cr_expect_eq(c.to_host_bytes, 4.0 * (double)psi / 2 + 12);
    cr_expect_eq(bytes_of(off, PLAN_ROLE_GATHERED, PLAN_PLACE_DEVICE, PLAN_DT_F32), 4 * psi);
    plan_free(off);
}

Test(offload, only_copies_cross_spaces)
{
    Plan *p = compile("none", "fp32", "1", "optimizer");
    char err[512];
    cr_assert_eq(plan_check(p, err, sizeof err), 0, "%s", err);
    int32_t k = 0;
    while (k < p->n_ops && strcmp(plan_str(p, p->ops[k].op), "adamw")) k++;
    cr_assert_lt(k, p->n_ops);
    PlanTensor *m = &p->tensors[p->ids[p->ops[k].in + 2]];  // exp_avg
    cr_assert_eq(m->place, PLAN_PLACE_HOST);
    m->place = PLAN_PLACE_DEVICE;
    cr_assert_neq(plan_check(p, err, sizeof err), 0);
    cr_expect_not_null(strstr(err, "only to_host and to_device cross"), "%s", err);
    plan_free(p);
}

/* Two steps of p, with every debug check on: dead buffers poisoned, and the guard proving
 * each op stays inside its buffers in both spaces. Every master's bytes (the params that
 * are no view: each unit's fp32 flat buffer), in tensor order, into a new buffer. The
 * model's params are views of the unit's compute-dtype copy, made once a step on either
 * side and dead (poisoned) after its last reader, so what they hold at the end is no
 * state of the training. */
static uint8_t *train2(const Plan *p, int64_t *to_host, int64_t *to_device, size_t *n)
{
    char err[256];
    ExecOptions eo = {.seed = 5, .nan_fill = 1, .guard = 1};
    Exec *e = rt_exec_new(p, &eo, err, sizeof err);
    cr_assert_not_null(e, "%s", err);
    cr_assert_eq(rt_exec_space_bytes(e, PLAN_PLACE_HOST), plan_space_bytes(p, PLAN_PLACE_HOST));
    RtData *data = rt_data_open(e, NULL, RT_ORDER_SEQUENTIAL, 5, err, sizeof err);
    cr_assert_not_null(data, "%s", err);
    for (int step = 1; step <= 2; step++) {
        rt_data_fill(data, step);
        cr_assert_eq(rt_exec_run(e, step, RT_PHASES_ALL), 0, "%s", rt_exec_error(e));
    }
    rt_exec_copied(e, to_host, to_device);
    size_t total = 0;
    for (int32_t i = 0; i < p->n_tensors; i++)
        if (p->tensors[i].role == PLAN_ROLE_PARAM && p->tensors[i].alias == PLAN_NONE)
            total += (size_t)plan_tensor_nbytes(&p->tensors[i]);
    uint8_t *out = malloc(total + 1);
    *n = 0;
    for (int32_t i = 0; i < p->n_tensors; i++) {
        if (p->tensors[i].role != PLAN_ROLE_PARAM || p->tensors[i].alias != PLAN_NONE) continue;
        memcpy(out + *n, rt_exec_data(e, i), (size_t)plan_tensor_nbytes(&p->tensors[i]));
        *n += (size_t)plan_tensor_nbytes(&p->tensors[i]);
    }
    rt_data_close(data);
    rt_exec_free(e);
    return out;
}

static void same_training(const char *precision, const char *clip)
{
    Plan *off = compile_clip("none", precision, "1", "optimizer", clip);
    Plan *dev = compile_clip("none", precision, "1", "none", clip);
    int64_t h, d, h0, d0;
    size_t n, n0;
    uint8_t *a = train2(off, &h, &d, &n), *b = train2(dev, &h0, &d0, &n0);
    cr_assert_eq(n, n0);
    cr_expect_eq(memcmp(a, b, n), 0, "%s, clip %s: the params after two steps differ", precision, clip);
    CommTotals c = comm_totals(off);
    cr_expect_eq((double)h, 2 * c.to_host_bytes);
    cr_expect_eq((double)d, 2 * c.to_device_bytes);
    cr_expect_eq(h0 + d0, 0);
    free(a);
    free(b);
    plan_free(off);
    plan_free(dev);
}

Test(offload, same_training_and_counted_copies)
{
    same_training("bf16", "1.0");
    same_training("bf16", "0");  // the updates run during the backward
    same_training("fp32", "0");
}

/* The CUDA program has no instruction for an op of the host space (the host runs those),
 * and the CUDA backend takes the plan. */
Test(offload, cuda_program_leaves_host_ops_to_the_host)
{
    Plan *off = compile("zero2", "bf16", "2", "optimizer");
    char err[512];
    cr_expect_eq(rt_backend_plan_has_cuda(off, err, sizeof err), 0, "%s", err);
    int host_ops = 0;
    for (int32_t k = 0; k < off->n_ops; k++) host_ops += plan_op_on_host(off, k);
    int updates = 0;
    for (int32_t k = 0; k < off->n_ops; k++)
        updates += !strcmp(plan_str(off, off->ops[k].op), "adamw") && plan_op_on_host(off, k);
    cr_expect_geq(updates, 3, "the updates run on the host (the host casts: cast_in_update waits for delayed_update)");
    cr_expect_geq(host_ops, updates);
    for (int32_t i = 0; i < off->n_cuda; i++)
        cr_expect(!plan_op_on_host(off, off->cuda[i].op), "instruction %d is op %d (%s), of the host space", i,
                  off->cuda[i].op, plan_str(off, off->ops[off->cuda[i].op].op));
    plan_free(off);
}
