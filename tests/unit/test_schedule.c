/* tests/unit/test_schedule.c: the schedule pass (passes/schedule.c) and the check that
 * makes a stored schedule safe to run as stored (plan/schedule.c), on the samples'
 * plans under every strategy:
 *  - collectives are on the collective stream, everything else on compute, and each
 *    wait names an earlier collective;
 *  - the stored waits are enough on every rank (plan_check_schedule), and not one too
 *    many: removing any single wait makes the check fail, naming the op;
 *  - memplan keeps a collective's input and output until the op that waits for it (no
 *    other buffer's bytes overlap them before then);
 *  - fsdp's gathers are prefetched: each block's forward gather comes before the
 *    previous block's first op that reads its params, and the gathered buffer is then
 *    waited for at its own first reader;
 *  - zero2's and fsdp's reduce-scatters are waited for a block later;
 *  - offload without clipping: each unit's host update runs during the backward (but the
 *    last two), after the next unit's gradient copy, waiting for its own, between device
 *    ops;
 *  - offload with delayed_update (clipping on): each unit's host update runs before the
 *    step's backward, with the step's device work after it, reading the gradient the
 *    step before left on the host, which this step's copy overwrites only after it.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "sample.h"

static Plan *compile(const char *file, const char *shard, const char *world, const char *precision)
{
    Setting set[] = {{"shard", shard}, {"world", world}, {"precision", precision}};
    int gpt = !strcmp(file, "gpt2.fsm");
    return sample_compile(file, gpt ? SAMPLE_GPT2 : SAMPLE_LLAMA, gpt ? 6 : 7, set, 3, NULL);
}

static int is_collective(const Plan *p, int32_t k)
{
    const char *op = plan_str(p, p->ops[k].op);
    return !strcmp(op, "all_reduce") || !strcmp(op, "reduce_scatter") || !strcmp(op, "all_gather");
}

static int overlap(const PlanTensor *a, const PlanTensor *b, int rank)
{
    int64_t alo = a->offset + rank * a->rank_stride, blo = b->offset + rank * b->rank_stride;
    return a->place == b->place && alo < blo + plan_tensor_nbytes(b) && blo < alo + plan_tensor_nbytes(a) &&
           plan_tensor_nbytes(a) && plan_tensor_nbytes(b);
}

static void check_plan(const char *file, const char *shard, const char *world, const char *precision)
{
    Plan *p = compile(file, shard, world, precision);
    char err[512];
    int w = atoi(world), n_waits = 0;
    for (int32_t k = 0; k < p->n_ops; k++) {
        const PlanOp *o = &p->ops[k];
        cr_assert_eq(o->stream, is_collective(p, k) ? PLAN_STREAM_COLLECTIVE : PLAN_STREAM_COMPUTE, "op %d (%s)", k,
                     plan_str(p, o->op));
        for (int32_t i = 0; i < o->n_wait; i++) cr_assert(is_collective(p, p->waits[o->wait + i]));
        n_waits += o->n_wait;
    }
    if (strcmp(shard, "none")) cr_assert_gt(n_waits, 0, "%s %s: a sharded plan waits for its collectives", file, shard);
    for (int rank = 0; rank < w; rank++)
        cr_assert_eq(plan_check_schedule(p, rank, err, sizeof err), 0, "%s %s rank %d: %s", file, shard, rank, err);

    /* A collective's buffers are its alone until it is waited for: no tensor another op
     * writes in between overlaps them. */
    for (int32_t c = 0; c < p->n_ops; c++) {
        if (!is_collective(p, c)) continue;
        int32_t done = p->n_ops;
        for (int32_t k = c + 1; k < p->n_ops && done == p->n_ops; k++)
            for (int32_t i = 0; i < p->ops[k].n_wait; i++)
                if (p->waits[p->ops[k].wait + i] == c) done = k;
        const PlanTensor *x = &p->tensors[p->ids[p->ops[c].in]], *y = &p->tensors[p->ids[p->ops[c].out]];
        for (int32_t k = c + 1; k < done; k++)
            for (int32_t j = 0; j < p->ops[k].n_out; j++) {
                const PlanTensor *t = &p->tensors[p->ids[p->ops[k].out + j]];
                for (int rank = 0; rank < w; rank++)
                    cr_assert(!overlap(t, x, rank) && !overlap(t, y, rank),
                              "%s %s: op %d writes bytes of collective op %d before op %d waits for it", file, shard,
                              k, c, done);
            }
    }

    /* Each wait is needed: without it the schedule is unsafe. */
    for (int32_t k = 0; k < p->n_ops; k++) {
        PlanOp *o = &p->ops[k];
        for (int32_t i = 0; i < o->n_wait; i++) {
            int32_t *a = &p->waits[o->wait + i], *last = &p->waits[o->wait + o->n_wait - 1], keep = *a, fails = 0;
            *a = *last, *last = keep, o->n_wait--;  // wait i dropped
            for (int rank = 0; rank < w && !fails; rank++) fails = plan_check_schedule(p, rank, err, sizeof err) != 0;
            o->n_wait++, *last = *a, *a = keep;
            cr_assert(fails, "%s %s: op %d's wait for op %d is not needed", file, shard, k, keep);
            cr_assert(strstr(err, "the schedule is unsafe"), "%s", err);
        }
    }
    plan_free(p);
}

Test(schedule, gpt2_every_strategy)
{
    static const char *const shards[] = {"ddp", "zero1", "zero2", "fsdp"};
    check_plan("gpt2.fsm", "none", "1", "fp32");
    for (int s = 0; s < 4; s++) {
        check_plan("gpt2.fsm", shards[s], "2", "fp32");
        check_plan("gpt2.fsm", shards[s], "4", "bf16");
    }
}

Test(schedule, llama_every_strategy)
{
    static const char *const shards[] = {"ddp", "zero1", "zero2", "fsdp"};
    for (int s = 0; s < 4; s++) check_plan("llama.fsm", shards[s], "2", s % 2 ? "bf16" : "fp32");
}

/* The first op of each block that reads the block's params (in the forward). */
static int32_t first_param_reader(const Plan *p, int32_t block)
{
    for (int32_t k = 0; k < p->n_ops; k++) {
        const PlanOp *o = &p->ops[k];
        if (o->phase != PLAN_PHASE_FORWARD) continue;
        for (int32_t i = 0; i < o->n_in; i++) {
            const PlanTensor *t = &p->tensors[p->ids[o->in + i]];
            if (t->role == PLAN_ROLE_PARAM && t->block == block && t->alias != PLAN_NONE) return k;
        }
    }
    return p->n_ops;
}

Test(schedule, fsdp_gathers_one_block_ahead)
{
    const Define four[] = {{"L", 4}, {"C", 64}, {"NH", 4}, {"T", 32}, {"V", 256}, {"B", 4}};
    Setting set[] = {{"shard", "fsdp"}, {"world", "2"}};
    Plan *p = sample_compile("gpt2.fsm", four, 6, set, 2, NULL);
    cr_assert_eq(p->n_blocks, 4);
    for (int32_t b = 1; b < p->n_blocks; b++) {
        int32_t gather = -1;
        for (int32_t k = 0; k < p->n_ops && gather < 0; k++)
            if (!strcmp(plan_str(p, p->ops[k].op), "all_gather") && p->ops[k].block == b &&
                p->ops[k].phase == PLAN_PHASE_COMM)
                gather = k;
        cr_assert_geq(gather, 0, "block %d has a gather", b);
        int32_t prev = first_param_reader(p, b - 1), mine = first_param_reader(p, b);
        cr_assert_lt(gather, prev, "block %d's gather (op %d) comes before block %d computes (op %d)", b, gather,
                     b - 1, prev);
        int waited = 0;
        for (int32_t i = 0; i < p->ops[mine].n_wait; i++) waited |= p->waits[p->ops[mine].wait + i] == gather;
        cr_assert(waited, "block %d's first reader (op %d) waits for its gather (op %d)", b, mine, gather);
    }
    plan_free(p);
}

/* zero2's and fsdp's gradient reduce-scatters are waited for a block later (the first
 * compute op after the next one starts), not at the step's end: each block's full
 * gradient buffer is then free for the blocks after it (ZeRO-2's saving). */
Test(schedule, reduce_scatters_complete_a_block_later)
{
    static const char *const shards[] = {"zero2", "fsdp"};
    for (int s = 0; s < 2; s++) {
        Plan *p = compile("gpt2.fsm", shards[s], "2", "fp32");
        int32_t rs[64], n = 0;
        for (int32_t k = 0; k < p->n_ops && n < 64; k++)
            if (!strcmp(plan_str(p, p->ops[k].op), "reduce_scatter")) rs[n++] = k;
        cr_assert_geq(n, 3, "%s: one reduce-scatter per unit", shards[s]);
        for (int i = 0; i + 1 < n; i++) {
            int32_t done = p->n_ops;
            for (int32_t k = rs[i] + 1; k < p->n_ops && done == p->n_ops; k++)
                for (int32_t w = 0; w < p->ops[k].n_wait; w++)
                    if (p->waits[p->ops[k].wait + w] == rs[i]) done = k;
            int32_t by = i + 2 < n ? rs[i + 2] : p->n_ops;
            cr_expect_lt(done, by, "%s: reduce-scatter op %d is waited for at op %d, after the one two later (op %d)",
                         shards[s], rs[i], done, by);
            cr_expect_eq(p->ops[done].stream, PLAN_STREAM_COMPUTE, "%s: op %d", shards[s], done);
        }
        plan_free(p);
    }
}

/* The stored waits are safe on every rank of the plan's world; the plan freed. */
static void expect_safe_then_free(Plan *p, const char *shard, const char *world)
{
    char err[512];
    for (int rank = 0; rank < atoi(world); rank++)
        cr_expect_eq(plan_check_schedule(p, rank, err, sizeof err), 0, "%s rank %d: %s", shard, rank, err);
    plan_free(p);
}

/* Offload without clipping, GPT-2 of 4 blocks: the update of each flat unit (a host op)
 * comes after its gradient's copy to the host, which it waits for, and after the next
 * unit's copy; so all but the last two units' (the embeddings' gradient is the last done,
 * the first block's the one before) run before the backward ends, with device ops on
 * both sides of them in the stored order (the plan's logical clock). The stored waits are
 * safe on every rank. */
static void check_host_updates_in_backward(const char *shard, const char *world, const char *precision)
{
    Setting set[] = {{"shard", shard}, {"world", world}, {"precision", precision}, {"offload", "optimizer"},
                     {"optimizer", "adamw"}, {"clip", "0"}};
    const Define four[] = {{"L", 4}, {"C", 64}, {"NH", 4}, {"T", 32}, {"V", 256}, {"B", 4}};
    Plan *p = sample_compile("gpt2.fsm", four, 6, set, 6, NULL);
    int32_t last_backward = -1, n_updates = 0, n_in_backward = 0;
    for (int32_t k = 0; k < p->n_ops; k++)
        if (p->ops[k].phase == PLAN_PHASE_BACKWARD && !plan_op_on_host(p, k)) last_backward = k;
    for (int32_t k = 0; k < p->n_ops; k++) {
        if (strcmp(plan_str(p, p->ops[k].op), "adamw") && strcmp(plan_str(p, p->ops[k].op), "adamw_cast")) continue;
        cr_assert(plan_op_on_host(p, k), "%s: op %d", shard, k);
        n_updates++;
        int32_t grad = p->ids[p->ops[k].in + 1], copy = -1;
        for (int32_t c = 0; c < k; c++)
            if (!strcmp(plan_str(p, p->ops[c].op), "to_host") && p->ids[p->ops[c].out] == grad) copy = c;
        cr_assert_geq(copy, 0, "%s: update op %d reads a gradient no copy before it brought", shard, k);
        int waits = 0;
        for (int32_t w = 0; w < p->ops[k].n_wait; w++) waits |= p->waits[p->ops[k].wait + w] == copy;
        cr_expect(waits, "%s: update op %d does not wait for its gradient's copy (op %d)", shard, k, copy);
        if (k > last_backward) continue;  // the last unit's: its gradient is done when the backward is
        n_in_backward++;
        int device_before = 0, device_after = 0;
        for (int32_t j = copy + 1; j < k; j++)
            device_before |= !plan_op_on_host(p, j) && p->ops[j].stream == PLAN_STREAM_COMPUTE;
        for (int32_t j = k + 1; j <= last_backward; j++) device_after |= !plan_op_on_host(p, j);
        cr_expect(device_before && device_after, "%s: update op %d is not between device ops", shard, k);
    }
    cr_expect_eq(n_updates, 5, "%s: one update per flat unit", shard);
    cr_expect_eq(n_in_backward, n_updates - 2, "%s: %d of %d updates run during the backward", shard, n_in_backward,
                 n_updates);
    expect_safe_then_free(p, shard, world);
}

Test(schedule, offload_updates_run_during_the_backward)
{
    check_host_updates_in_backward("none", "1", "bf16");
    check_host_updates_in_backward("zero2", "2", "bf16");
    check_host_updates_in_backward("none", "1", "fp32");
}

/* delayed_update: the update of unit u reads `<unit>.pending_grad` (state on the host that
 * no op makes) and goes after the copy of its master to the device, before the step's
 * first backward op, with device compute after it (the host runs it while the device
 * computes); the one copy that writes its pending gradient (a view of it) comes after it,
 * as do those of the pending lr, coef and step count, and no update waits for a copy to
 * the host. The stored waits are safe on
 * every rank. */
static void check_delayed_updates(const char *shard, const char *world, const char *precision)
{
    Setting set[] = {{"shard", shard}, {"world", world}, {"precision", precision}, {"offload", "optimizer"},
                     {"optimizer", "adamw"}, {"clip", "1.0"}, {"delayed_update", "1"}};
    const Define four[] = {{"L", 4}, {"C", 64}, {"NH", 4}, {"T", 32}, {"V", 256}, {"B", 4}};
    Plan *p = sample_compile("gpt2.fsm", four, 6, set, 7, NULL);
    int32_t first_backward = p->n_ops, n_updates = 0;
    for (int32_t k = p->n_ops - 1; k >= 0; k--)
        if (p->ops[k].phase == PLAN_PHASE_BACKWARD && !plan_op_on_host(p, k)) first_backward = k;
    for (int32_t k = 0; k < p->n_ops; k++) {
        const char *upd = plan_str(p, p->ops[k].op);
        int writes16 = !strcmp(upd, "adamw_cast");  // cast_in_update: it writes w, the 16-bit params the copy sends
        if (strcmp(upd, "adamw") && !writes16) continue;
        n_updates++;
        cr_assert(plan_op_on_host(p, k), "%s: op %d", shard, k);
        int32_t grad = p->ids[p->ops[k].in + 1], master = p->ids[p->ops[k].in];
        int32_t w16 = writes16 ? p->ids[p->ops[k].in + p->ops[k].n_in - 1] : PLAN_NONE;
        const PlanTensor *g = &p->tensors[grad];
        cr_assert(g->role == PLAN_ROLE_OPT_STATE && g->producer == PLAN_NONE && g->place == PLAN_PLACE_HOST &&
                      strstr(plan_str(p, g->name), ".pending_grad"),
                  "%s: update op %d reads %s, not a pending gradient", shard, k, plan_tensor_label(p, grad));
        cr_expect_lt(k, first_backward, "%s: update op %d is not before the backward (op %d)", shard, k,
                     first_backward);
        int32_t to_device = -1, writer = -1, device_after = 0;
        for (int32_t c = 0; c < p->n_ops; c++) {
            const char *op = plan_str(p, p->ops[c].op);
            int32_t out = p->ops[c].n_out ? p->ids[p->ops[c].out] : PLAN_NONE;
            if (c < k && (!strcmp(op, "to_device") || !strcmp(op, "cast")))
                for (int32_t i = 0; i < p->ops[c].n_in; i++)
                    if (p->ids[p->ops[c].in + i] == master || p->ids[p->ops[c].in + i] == w16) to_device = c;
            if (!strcmp(op, "to_host") && out != PLAN_NONE && p->tensors[out].alias == grad) {
                cr_expect_eq(writer, -1, "%s: two copies write %s", shard, plan_tensor_label(p, grad));
                writer = c;
            }
            for (int32_t i = 0; c < k && out != PLAN_NONE && i < p->ops[k].n_in; i++)  // its lr, coef, step count too
                cr_expect_neq(p->tensors[out].alias, p->ids[p->ops[k].in + i], "%s: op %d writes what update op %d "
                              "reads of the step before, before it", shard, c, k);
            if (c > k && c < first_backward)
                device_after |= !plan_op_on_host(p, c) && p->ops[c].stream == PLAN_STREAM_COMPUTE;
        }
        cr_expect_geq(to_device, 0, "%s: update op %d is not after its master's copy to the device", shard, k);
        cr_expect_gt(writer, k, "%s: the copy into update op %d's pending gradient (op %d) is not after it", shard, k,
                     writer);
        cr_expect(device_after, "%s: no device op after update op %d in the forward", shard, k);
        for (int32_t w = 0; w < p->ops[k].n_wait; w++)
            cr_expect_neq(strcmp(plan_str(p, p->ops[p->waits[p->ops[k].wait + w]].op), "to_host"), 0,
                          "%s: update op %d waits for a copy to the host", shard, k);
    }
    cr_expect_eq(n_updates, 5, "%s: one update per flat unit", shard);
    expect_safe_then_free(p, shard, world);
}

Test(schedule, delayed_updates_run_during_the_next_step)
{
    check_delayed_updates("none", "1", "bf16");
    check_delayed_updates("zero2", "2", "bf16");
    check_delayed_updates("none", "1", "fp32");
    check_delayed_updates("fsdp", "2", "fp32");
}
