/* tests/unit/test_shard.c: what the shard pass plans, checked from first principles.
 *  - Model-state bytes per rank follow ZeRO's accounting for every strategy and world:
 *    with Psi the fp32 bytes of a unit's params padded to a multiple of the world,
 *    params Psi (fsdp: Psi/N), gradients the optimizer reads Psi (zero2, fsdp: Psi/N),
 *    optimizer state K Psi (zero1, zero2, fsdp: K Psi/N; AdamW K = 2, SGD with momentum 1).
 *  - Communication per rank and step: ddp 2 Psi, zero1 (FairScale's OSS: all-reduce,
 *    then all-gather of the updated shards) 3 Psi, zero2 2 Psi, fsdp 3 Psi = 1.5 x ddp
 *    for blocks; fsdp keeps the params outside blocks gathered from forward to backward
 *    (like FairScale's root instance), 2 Psi for those.
 *  - Under mixed precision zero1 and zero2 shard the fp32 master and gather 16 bits.
 *  - reshard_root 1: fsdp gathers the params outside blocks for each stretch between
 *    blocks that reads them (GPT-2: the embedding, the head, the head's backward), so
 *    every param's model state is ZeRO-3's 16 Psi / N; the gradients stay bit for bit.
 *  - The plan does not grow with the world.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "codegen.h"
#include "frontend.h"
#include "passes.h"
#include "report.h"
#include "runtime.h"
#include "sample.h"

static Plan *compile(const char *file, const char *shard, int world)
{
    char w[16];
    snprintf(w, sizeof w, "%d", world);
    /* B = 24 splits over 1, 2, 3 and 4 ranks. */
    const Define small[] = {{"L", 2}, {"C", 64}, {"NH", 4}, {"T", 32}, {"V", 256}, {"B", 24}};
    Setting set[] = {{"shard", shard}, {"world", w}};
    int gpt = !strcmp(file, "gpt2.fsm");
    return sample_compile(file, gpt ? small : small + 5, gpt ? 6 : 1, set, 2, NULL);
}

/* Elements of each unit's params in the unsharded plan: blocks, then outside blocks. The
 * model's params are the views in their unit's flat buffer (shard none flattens as ddp at
 * world 1 does); the buffer itself, no view, holds them and is not counted again. */
static void unit_sizes(const Plan *p, int64_t *numel)
{
    for (int32_t i = 0; i <= p->n_blocks; i++) numel[i] = 0;
    for (int32_t i = 0; i < p->n_tensors; i++) {
        const PlanTensor *t = &p->tensors[i];
        if (t->role == PLAN_ROLE_PARAM && t->alias != PLAN_NONE)
            numel[t->block >= 0 ? t->block : p->n_blocks] += plan_tensor_numel(t);
    }
}

typedef struct {
    int64_t params, grads, state;
} State;

/* Model state as the plan holds it: param storage, the gradients the optimizer reads,
 * optimizer state; each buffer once. */
static State plan_state(const Plan *p)
{
    State s = {0};
    char *seen = calloc((size_t)p->n_tensors, 1);
    for (int32_t i = 0; i < p->n_tensors; i++) {
        const PlanTensor *t = &p->tensors[i];
        if (t->role == PLAN_ROLE_PARAM && t->alias == PLAN_NONE) s.params += plan_tensor_nbytes(t);
        if (t->role == PLAN_ROLE_OPT_STATE && t->rank > 0) s.state += plan_tensor_nbytes(t);  // not the step count
        if (t->role == PLAN_ROLE_PARAM && t->grad != PLAN_NONE) {
            int32_t g = p->tensors[t->grad].alias == PLAN_NONE ? t->grad : p->tensors[t->grad].alias;
            if (!seen[g]) s.grads += plan_tensor_nbytes(&p->tensors[g]);
            seen[g] = 1;
        }
    }
    free(seen);
    return s;
}

static void check_accounting(const char *file)
{
    static const char *const strategies[] = {"ddp", "zero1", "zero2", "fsdp"};
    Plan *none = compile(file, "none", 1);
    int64_t numel[64], K = strcmp(plan_meta_str(none, "optimizer", "adamw"), "sgd") ? 2 : 1;
    unit_sizes(none, numel);
    for (int w = 1; w <= 4; w++)
        for (int k = 0; k < 4; k++) {
            int64_t psi = 0, root = 4 * ((numel[none->n_blocks] + w - 1) / w * w);
            for (int32_t u = 0; u <= none->n_blocks; u++) psi += 4 * ((numel[u] + w - 1) / w * w);
            Plan *p = compile(file, strategies[k], w);
            State s = plan_state(p);
            int params_sharded = k == 3, grads_sharded = k >= 2, state_sharded = k >= 1;
            cr_expect_eq(s.params, params_sharded ? psi / w : psi, "%s %s world %d: params %ld, expected %ld", file,
                         strategies[k], w, (long)s.params, (long)(params_sharded ? psi / w : psi));
            cr_expect_eq(s.grads, grads_sharded ? psi / w : psi, "%s %s world %d: grads %ld", file, strategies[k], w,
                         (long)s.grads);
            cr_expect_eq(s.state, state_sharded ? K * psi / w : K * psi, "%s %s world %d: optimizer state %ld",
                         file, strategies[k], w, (long)s.state);
            /* The collectives: grads and params as above, plus two scalars (the loss and
             * the sum of squares of sharded gradients). */
            static const double psis[] = {2, 3, 2, 3};
            CommTotals c = comm_totals(p);
            double scalars = 8 + (grads_sharded || k == 1 ? 8 : 0);
            double want = psis[k] * (double)psi - (k == 3 ? (double)root : 0);
            cr_expect(c.bytes >= want && c.bytes <= want + scalars, "%s %s world %d: %.0f bytes sent, expected %.0f",
                      file, strategies[k], w, c.bytes, want);
            plan_free(p);
        }
    plan_free(none);
}

Test(shard, zero_accounting_gpt2) { check_accounting("gpt2.fsm"); }
Test(shard, zero_accounting_mlp) { check_accounting("mlp.fsm"); }

/* Bytes of the collectives on blocks' buffers (not the params outside blocks). */
static double block_bytes(const Plan *p)
{
    double b = 0;
    for (int32_t i = 0; i < p->n_ops; i++) {
        const char *name = plan_str(p, p->ops[i].op);
        if (p->ops[i].block < 0) continue;
        int gather = !strcmp(name, "all_gather"), reduce = !strcmp(name, "all_reduce"), rs = !strcmp(name, "reduce_scatter");
        if (!gather && !reduce && !rs) continue;
        const PlanTensor *t = &p->tensors[gather ? p->ids[p->ops[i].out] : p->ids[p->ops[i].in]];
        b += (reduce ? 2.0 : 1.0) * (double)plan_tensor_nbytes(t);
    }
    return b;
}

Test(shard, fsdp_moves_one_and_a_half_times_ddp)
{
    Plan *ddp = compile("gpt2.fsm", "ddp", 4), *fsdp = compile("gpt2.fsm", "fsdp", 4);
    double r = block_bytes(fsdp) / block_bytes(ddp);
    cr_expect(r > 1.4999 && r < 1.5001, "fsdp / ddp bytes for the blocks = %.4f", r);
    plan_free(ddp);
    plan_free(fsdp);
}

Test(shard, plan_does_not_grow_with_world)
{
    for (int k = 0; k < 4; k++) {
        static const char *const strategies[] = {"ddp", "zero1", "zero2", "fsdp"};
        Plan *a = compile("gpt2.fsm", strategies[k], 2), *b = compile("gpt2.fsm", strategies[k], 4);
        cr_expect_eq(a->n_ops, b->n_ops, "%s", strategies[k]);
        cr_expect_eq(a->n_tensors, b->n_tensors, "%s", strategies[k]);
        void *ba, *bb;
        size_t la, lb;
        char err[256];
        cr_assert_eq(plan_write_mem(a, &ba, &la, err, sizeof err), 0);
        cr_assert_eq(plan_write_mem(b, &bb, &lb, err, sizeof err), 0);
        /* The CUDA source spells each rank's shard sizes in decimal, so its length may move
         * by a digit here and there; everything else is the same size. */
        const char *sa = a->cuda_module ? a->cuda_module : "", *sb = b->cuda_module ? b->cuda_module : "";
        cr_expect_eq(a->n_cuda, b->n_cuda, "%s", strategies[k]);
        cr_expect(strlen(sa) * 1000 <= strlen(sb) * 1001 && strlen(sb) * 1000 <= strlen(sa) * 1001, "%s: CUDA sources of %zu and %zu bytes",
                  strategies[k], strlen(sa), strlen(sb));
        la -= strlen(sa), lb -= strlen(sb);
        cr_expect_eq(la, lb, "%s: plan of world 2 has %zu bytes, of world 4 %zu (besides the CUDA source)", strategies[k], la, lb);
        plan_dealloc(ba);
        plan_dealloc(bb);
        plan_free(a);
        plan_free(b);
    }
}

/* Mixed precision moves 16-bit bytes: fsdp gathers the compute copy and reduces in the
 * compute dtype (half of fp32's bytes); with reduce_dtype fp32 only the gathers halve
 * (blocks: 2 x 0.5 + 1 over 3). The params the forward and backward read are 16-bit
 * views into the gathered buffers, with no cast per param left; the optimizer reads fp32. */
static Plan *compile_mixed(const char *precision, const char *reduce)
{
    Setting set[] = {{"shard", "fsdp"}, {"world", "4"}, {"precision", precision}, {"reduce_dtype", reduce}};
    return sample_compile("gpt2.fsm", SAMPLE_GPT2, 6, set, 4, NULL);
}

Test(shard, fsdp_bf16_gathers_and_reduces_16_bit)
{
    Plan *f32 = compile_mixed("fp32", "compute"), *bf = compile_mixed("bf16", "compute");
    Plan *bf_f32 = compile_mixed("bf16", "fp32");
    double r = block_bytes(bf) / block_bytes(f32), r2 = block_bytes(bf_f32) / block_bytes(f32);
    cr_expect(r > 0.4999 && r < 0.5001, "bf16 / fp32 block bytes = %.4f", r);
    cr_expect(r2 > 2.0 / 3 - 1e-4 && r2 < 2.0 / 3 + 1e-4, "bf16 with fp32 reductions / fp32 block bytes = %.4f", r2);
    for (int32_t i = 0; i < bf->n_ops; i++) {
        const PlanOp *op = &bf->ops[i];
        const PlanTensor *in = op->n_in ? &bf->tensors[bf->ids[op->in]] : NULL;
        const char *name = plan_str(bf, op->op);
        cr_expect(!(in && !strcmp(name, "cast") && plan_tensor_is_model_param(in)), "op %d casts param %s", i,
                  plan_str(bf, in ? in->name : PLAN_NONE));
        if (!strcmp(name, "all_gather") || !strcmp(name, "reduce_scatter"))
            cr_expect_eq(in->dtype, PLAN_DT_BF16, "op %d: %s of %s", i, name, plan_dtype_name(in->dtype));
        if (!strcmp(name, "adamw"))  // the reduced 16-bit shard, read as it is: no fp32 copy of it
            cr_expect_eq(bf->tensors[bf->ids[op->in + 1]].dtype, PLAN_DT_BF16, "op %d: adamw's gradient", i);
    }
    for (int32_t i = 0; i < bf->n_tensors; i++) {
        const PlanTensor *t = &bf->tensors[i];
        if (plan_tensor_is_model_param(t) && t->alias != PLAN_NONE)
            cr_expect_eq(t->dtype, PLAN_DT_BF16, "param %s is %s", plan_str(bf, t->name), plan_dtype_name(t->dtype));
    }
    plan_free(f32);
    plan_free(bf);
    plan_free(bf_f32);
}

/* zero1 and zero2 under mixed precision keep ZeRO's layout: each rank stores only its
 * fp32 shard of the master (ZeRO-2: 2 Psi16 + 14 Psi16 / N with the moments, not 4 Psi16 +
 * 12 Psi16 / N), the params are 16-bit views of buffers gathered in 16 bits, no param is
 * cast, and the blocks' collectives move half of fp32's bytes. In fp32 they keep the full
 * fp32 params (ZeRO with K = 8). */
Test(shard, zero_bf16_shards_the_fp32_master)
{
    const char *zero[] = {"zero1", "zero2"};
    for (int z = 0; z < 2; z++) {
        Setting set[] = {{"shard", zero[z]}, {"world", "4"}, {"precision", "bf16"}};
        Plan *bf = sample_compile("gpt2.fsm", SAMPLE_GPT2, 6, set, 3, NULL);
        set[2].value = "fp32";
        Plan *f32 = sample_compile("gpt2.fsm", SAMPLE_GPT2, 6, set, 3, NULL);
        int64_t full = 0, shard = 0, gathered = 0;
        for (int32_t i = 0; i < f32->n_tensors; i++)
            if (f32->tensors[i].role == PLAN_ROLE_PARAM && f32->tensors[i].alias == PLAN_NONE)
                full += plan_tensor_nbytes(&f32->tensors[i]);
        for (int32_t i = 0; i < bf->n_tensors; i++) {
            const PlanTensor *t = &bf->tensors[i];
            if (t->alias != PLAN_NONE) continue;
            if (t->role == PLAN_ROLE_PARAM) shard += plan_tensor_nbytes(t);
            // the whole 16-bit params: kept between steps, written by the update (cast_in_update)
            if (t->role == PLAN_ROLE_GATHERED || t->role == PLAN_ROLE_PARAM16) gathered += plan_tensor_nbytes(t);
        }
        cr_expect_eq(shard * 4, full, "%s: the fp32 master is sharded (%lld of %lld bytes)", zero[z], (long long)shard,
                     (long long)full);
        cr_expect_eq(gathered * 2, full, "%s: the params are gathered in 16 bits", zero[z]);
        double r = block_bytes(bf) / block_bytes(f32);
        cr_expect(r > 0.4999 && r < 0.5001, "%s: bf16 / fp32 block bytes = %.4f", zero[z], r);
        for (int32_t i = 0; i < bf->n_ops; i++) {
            const PlanOp *op = &bf->ops[i];
            const PlanTensor *in = op->n_in ? &bf->tensors[bf->ids[op->in]] : NULL;
            const char *name = plan_str(bf, op->op);
            cr_expect(!(in && !strcmp(name, "cast") && plan_tensor_is_model_param(in)), "%s: op %d casts param %s",
                      zero[z], i, plan_str(bf, in ? in->name : PLAN_NONE));
            if (!strcmp(name, "all_gather")) cr_expect_eq(in->dtype, PLAN_DT_BF16, "%s: op %d gathers fp32", zero[z], i);
        }
        plan_free(bf);
        plan_free(f32);
    }
}

/* The global gradient norm of step 1 (the plan's "grad_norm" output). */
static float step1_norm(const Plan *p)
{
    char err[256];
    ExecOptions eo = {.seed = 3};
    Exec *e = rt_exec_new(p, &eo, err, sizeof err);
    cr_assert_not_null(e, "%s", err);
    RtData *d = rt_data_open(e, NULL, RT_ORDER_SEQUENTIAL, 3, err, sizeof err);
    cr_assert_not_null(d, "%s", err);
    rt_data_fill(d, 1);
    cr_assert_eq(rt_exec_run(e, 1, RT_PHASES_ALL), 0);
    RtTensor t;
    cr_assert_eq(rt_exec_tensor(e, "grad_norm", &t), 0);
    float norm = *(const float *)t.data;
    rt_data_close(d);
    rt_exec_free(e);
    return norm;
}

/* At world 1 a reduction changes nothing, and every strategy (none too) holds the same
 * flat gradient buffers, so the norm (sumsq_parts per unit, then sum_parts in unit order)
 * is the same, bit for bit, in fp32 and in bf16 (whose 16-bit buffers hold exactly the
 * gradients the backward rounded; a gradient written into the buffer before it is zeroed
 * would show here). */
Test(shard, flat_gradient_norm_equal_across_strategies)
{
    static const char *const strategies[] = {"none", "ddp", "zero1", "zero2", "fsdp"};
    static const char *const precisions[] = {"fp32", "bf16"};
    for (int q = 0; q < 2; q++) {
        float norms[5];
        for (int k = 0; k < 5; k++) {
            Setting set[] = {{"shard", strategies[k]}, {"precision", precisions[q]}};
            Plan *p = sample_compile("gpt2.fsm", SAMPLE_GPT2, 6, set, 2, NULL);
            norms[k] = step1_norm(p);
            plan_free(p);
            cr_expect(norms[k] == norms[0] && norms[k] > 0, "%s %s: gradient norm %.9g, none's %.9g", precisions[q],
                      strategies[k], norms[k], norms[0]);
        }
    }
}

/* The params outside blocks resharded like a block's: gathered three times (the
 * embedding; the final layernorm and the tied head; their backward; the embedding's
 * backward reads no param), so model state per rank is ZeRO-3's 16 Psi / N in bf16 (the
 * root kept gathered adds its 2 bytes a param in full), and at world 1 the gradient norm
 * is the kept root's, bit for bit. */
Test(shard, fsdp_reshard_root_gathers_per_use)
{
    const Define dims[] = {{"L", 2}, {"C", 64}, {"NH", 4}, {"T", 32}, {"V", 256}, {"B", 8}};
    Setting set[] = {{"shard", "fsdp"}, {"world", "4"}, {"precision", "bf16"}, {"reshard_root", "1"}};
    char err[256];
    for (int root = 0; root < 2; root++) {
        set[3].value = root ? "1" : "0";
        Plan *p = sample_compile("gpt2.fsm", dims, 6, set, 4, NULL);
        int root_gathers = 0;
        for (int32_t i = 0; i < p->n_ops; i++) {
            const PlanOp *op = &p->ops[i];
            if (strcmp(plan_str(p, op->op), "all_gather")) continue;
            root_gathers += op->block == PLAN_NONE;
        }
        cr_expect_eq(root_gathers, root ? 3 : 1, "reshard_root %d: the root gathered %d times", root, root_gathers);
        MemReport *r = report_mem_new(p, err, sizeof err);
        cr_assert_not_null(r, "%s", err);
        int64_t shard = 0;  // Psi / N: this rank's elements of every unit, padded to a multiple of the world
        for (int32_t i = 0; i < p->n_tensors; i++)
            if (p->tensors[i].role == PLAN_ROLE_PARAM && p->tensors[i].alias == PLAN_NONE && p->tensors[i].sharded)
                shard += plan_tensor_numel(&p->tensors[i]);
        int64_t state = report_state_sum(r->state) - 4;  // less the optimizer's step count
        if (root)
            cr_expect_eq(state, 16 * shard, "reshard_root 1: model state %lld bytes, ZeRO-3's 16 Psi / N = %lld",
                         (long long)state, (long long)(16 * shard));
        else
            cr_expect_gt(state, 16 * shard, "reshard_root 0 holds the root's 16-bit params in full");
        report_mem_free(r);
        plan_free(p);
    }
    float norms[2];
    for (int root = 0; root < 2; root++) {
        Setting one[] = {{"shard", "fsdp"}, {"precision", "bf16"}, {"reshard_root", root ? "1" : "0"}};
        Plan *p = sample_compile("gpt2.fsm", SAMPLE_GPT2, 6, one, 3, NULL);
        norms[root] = step1_norm(p);
        plan_free(p);
    }
    cr_expect(norms[1] == norms[0], "reshard_root 1: gradient norm %.9g, kept root %.9g", norms[1], norms[0]);
}

/* The flat gradient buffer is made by no kernel (buffer); a full of zeros covers exactly
 * the elements no gradient is made in: the padding to the world's multiple and a param
 * without a gradient (mlp's `spare`, in the unit outside blocks), never a gradient's.
 * Every element is written by one of them, once, in every strategy, world, precision. */
static void check_gaps(const Graph *g, int *n_buffers, int *n_zeroed)
{
    for (int n = 0; n < g->n_nodes; n++) {
        const Node *node = ir_node(g, n);
        cr_expect(node->op != OP_full || ir_value(g, ir_out(g, node, 0))->role != ROLE_GRAD ||
                      ir_value(g, ir_out(g, node, 0))->view_of >= 0,
                  "a full makes a whole gradient buffer");
        if (node->op != OP_buffer) continue;
        int b = ir_out(g, node, 0);
        int64_t numel = ir_numel(ir_value(g, b)), es = dtype_size(ir_value(g, b)->dtype);
        char *by = calloc((size_t)numel, 1);  // element: 0 unwritten, 1 a gradient, 2 a zero
        for (int v = 0; v < g->n_values; v++) {
            const Value *val = ir_value(g, v);
            if (val->view_of != b || val->producer < 0) continue;
            const Node *w = ir_node(g, val->producer);
            if (op_info(w->op)->flags & OPF_COLLECTIVE) continue;  // the reduction, in place over all of it
            int64_t at = val->view_offset / es, len = ir_numel(val);
            cr_assert(at >= 0 && at + len <= numel);
            for (int64_t i = at; i < at + len; i++) {
                cr_expect(!by[i], "%s: element %lld written twice", val->name, (long long)i);
                by[i] = w->op == OP_full ? 2 : 1;
            }
            *n_zeroed += w->op == OP_full;
        }
        for (int64_t i = 0; i < numel; i++) cr_expect(by[i], "%s: element %lld never written", ir_value(g, b)->name,
                                                      (long long)i);
        free(by);
        ++*n_buffers;
    }
}

Test(shard, gradient_buffer_zeroes_only_its_gaps)
{
    const char *src = sample_source_with("mlp.fsm", "  param w_out", "  param spare: [5] = normal(1);\n");
    static const char *const strategies[] = {"none", "ddp", "zero1", "zero2", "fsdp"};
    const Define b[] = {{"B", 48}};
    for (int k = 0; k < 5; k++)
        for (int world = 1; world <= 3; world += 2)
            for (int low = 0; low < 2; low++) {
                if (k == 0 && world > 1) continue;
                char w[8];
                snprintf(w, sizeof w, "%d", world);
                Setting set[] = {{"shard", strategies[k]}, {"world", w}, {"precision", low ? "bf16" : "fp32"}};
                Graph *g = NULL;
                Plan *p = sample_compile_source("mlp.fsm", src, b, 1, set, 3, &g);
                int buffers = 0, zeroed = 0;
                check_gaps(g, &buffers, &zeroed);
                /* 3 units (2 blocks, the rest); spare's 5 elements; at world 3 each unit is padded. */
                cr_expect_eq(buffers, 3, "%s world %d: %d gradient buffers", strategies[k], world, buffers);
                cr_expect_eq(zeroed, world == 1 ? 1 : 3, "%s world %d %s: %d zeroed ranges", strategies[k], world,
                             set[2].value, zeroed);
                ir_graph_free(g);
                plan_free(p);
            }
}
