/* tests/unit/test_opcheck.c: rt_plan_check_ops, the op-table check of runtime/opcheck.c
 * and opcheck_mem.c.
 *  - Every plan fsc makes passes: each sample under every --shard (world 1 and 2), every
 *    --precision, with and without --recompute.
 *  - A valid plan with one op corrupted is refused, each way with a message that names
 *    the op: an input of the wrong dtype (the issue's `matmul: dtypes 0, 2 -> 0` abort),
 *    of the wrong shape, a dropped input, an attribute out of range, of the wrong kind,
 *    unknown or missing, a backward op whose dy does not fit its forward op, and the
 *    values kernels index with (a vocab above the table, indices overwritten before
 *    they are read, an adamw step no counter vouches for), an output over its input.
 *  - Views pushed past their root, on rank 0 and on the last rank, are refused.
 *  - rt_exec_new refuses what the check refuses.
 */
#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "runtime.h"
#include "sample.h"

static const Define GPT2[] = {{"L", 1}, {"C", 32}, {"NH", 2}, {"T", 8}, {"V", 256}, {"B", 2}};
// llama with multi-query attention (2 query heads over 1 kv head)
static const Define LLAMA[] = {{"L", 1}, {"C", 32}, {"NH", 2}, {"NKV", 1}, {"F", 64}, {"T", 8}, {"V", 256}, {"B", 2}};
static const Define MLP[] = {{"B", 8}, {"D", 4}, {"H", 8}, {"K", 3}, {"L", 1}};

static Plan *gpt2(const char *precision, const char *shard, const char *world)
{
    Setting set[] = {{"precision", precision}, {"shard", shard}, {"world", world}};
    return sample_compile("gpt2.fsm", GPT2, 6, set, 3, NULL);
}

/* GPT-2 with its split, heads, attention and merge_heads as written (not one attention_qkv). */
static Plan *gpt2_unpacked(void)
{
    Setting set[] = {{"pack_attention", "0"}};
    return sample_compile("gpt2.fsm", GPT2, 6, set, 1, NULL);
}

static void expect_ok(const Plan *p, const char *what)
{
    char err[1024] = "";
    cr_assert_eq(rt_plan_check_ops(p, err, sizeof err), 0, "%s: %s", what, err);
}

/* Refused, with every one of the NULL-terminated phrases in the message. */
static void expect_refused(const Plan *p, ...)
{
    char err[1024] = "";
    cr_assert_eq(rt_plan_check_ops(p, err, sizeof err), -1, "the corrupted plan passes");
    va_list ap;
    va_start(ap, p);
    for (const char *want; (want = va_arg(ap, const char *));) cr_expect(strstr(err, want), "'%s' lacks '%s'", err, want);
    va_end(ap);
    cr_log_info("%s", err);
}

static const char *op_label(const Plan *p, int32_t k)
{
    static char buf[4][64];
    static int at;
    char *b = buf[at++ % 4];
    snprintf(b, 64, "op %d (%s)", k, plan_str(p, p->ops[k].op));
    return b;
}

/* The n-th op (0-based) named `name`. */
static int32_t find_op(const Plan *p, const char *name, int n)
{
    for (int32_t k = 0; k < p->n_ops; k++)
        if (!strcmp(plan_str(p, p->ops[k].op), name) && n-- == 0) return k;
    cr_assert_fail("no op %s", name);
    return -1;
}

static int32_t find_tensor(const Plan *p, const char *name)
{
    for (int32_t i = 0; i < p->n_tensors; i++)
        if (!strcmp(plan_str(p, p->tensors[i].name), name)) return i;
    cr_assert_fail("no tensor %s", name);
    return -1;
}

static int32_t *input(Plan *p, int32_t k, int i) { return &p->ids[p->ops[k].in + i]; }

/* A new tensor over the same bytes as t (so the layout stays sound), retyped. */
static int32_t retyped(Plan *p, int32_t t, PlanDType dt, int rank, const int64_t *shape)
{
    PlanTensor c = p->tensors[t];
    c.dtype = dt;
    c.rank = rank;
    for (int d = 0; d < rank; d++) c.shape[d] = shape[d];
    c.producer = PLAN_NONE;
    c.name = PLAN_NONE;
    int32_t id = plan_tensor_add(p, &c);
    cr_assert_geq(id, 0);
    return id;
}

static PlanAttr *attr(Plan *p, int32_t k, const char *key)
{
    for (int32_t a = 0; a < p->ops[k].n_attr; a++)
        if (!strcmp(plan_str(p, p->attrs[p->ops[k].attr + a].key), key)) return &p->attrs[p->ops[k].attr + a];
    cr_assert_fail("op %d has no attribute %s", k, key);
    return NULL;
}

/* ---- valid plans pass ---------------------------------------------------------------- */

Test(opcheck, every_plan_fsc_makes_passes)
{
    static const struct { const char *file; const Define *defs; int n; } models[] = {
        {"gpt2.fsm", GPT2, 6}, {"llama.fsm", LLAMA, 8}, {"mlp.fsm", MLP, 5}};
    static const char *const shards[] = {"none", "ddp", "zero1", "zero2", "fsdp"};
    static const char *const precisions[] = {"fp32", "bf16", "fp16"};
    static const char *const recompute[] = {"none", "all"};
    int n = 0;
    for (size_t m = 0; m < 3; m++)
        for (size_t s = 0; s < 5; s++)
            for (int w = 1; w <= 2; w++)
                for (size_t pr = 0; pr < 3; pr++)
                    for (size_t r = 0; r < 2; r++) {
                        if (s == 0 && w == 2) continue;
                        char world[8], what[160];
                        snprintf(world, sizeof world, "%d", w);
                        Setting set[] = {{"shard", shards[s]}, {"world", world}, {"precision", precisions[pr]},
                                         {"recompute", recompute[r]}};
                        Plan *p = sample_compile(models[m].file, models[m].defs, models[m].n, set, 4, NULL);
                        snprintf(what, sizeof what, "%s --shard %s --world %d --precision %s --recompute %s",
                                 models[m].file, shards[s], w, precisions[pr], recompute[r]);
                        expect_ok(p, what);
                        plan_free(p);
                        n++;
                    }
    cr_assert_eq(n, 162);
}

/* Through the file format too, and with the settings that add optimizer ops. */
Test(opcheck, plans_read_back_and_other_settings_pass)
{
    Setting set[] = {{"optimizer", "sgd"}, {"momentum", "0.9"}, {"clip", "0"}, {"lr_schedule", "constant"},
                     {"reduce_dtype", "fp32"}, {"shard", "fsdp"}, {"world", "2"}, {"reshard_after_forward", "0"}};
    Plan *p = sample_compile("llama.fsm", LLAMA, 8, set, 8, NULL);
    void *buf;
    size_t len;
    char err[512];
    cr_assert_eq(plan_write_mem(p, &buf, &len, err, sizeof err), 0, "%s", err);
    Plan *q = plan_read_mem(buf, len, err, sizeof err);
    cr_assert_not_null(q, "%s", err);
    expect_ok(q, "llama sgd fsdp world 2, read back");
    plan_dealloc(buf);
    plan_free(q);
    plan_free(p);
}

/* ---- one op corrupted ------------------------------------------------------------------ */

Test(opcheck, input_of_another_dtype)
{
    Plan *p = gpt2("bf16", "none", "1");
    int32_t k = find_op(p, "matmul_bias", 0), b = *input(p, k, 1);  // the QKV weight's bf16 copy
    const PlanTensor *t = &p->tensors[b];
    *input(p, k, 1) = retyped(p, b, PLAN_DT_F32, t->rank, t->shape);
    expect_refused(p, op_label(p, k), "dtypes differ", "bf16[", "f32[", NULL);
    plan_free(p);
}

Test(opcheck, input_of_another_shape)
{
    Plan *p = gpt2("fp32", "none", "1");
    int32_t k = find_op(p, "matmul", 0), b = *input(p, k, 1);
    const PlanTensor *t = &p->tensors[b];
    cr_assert_eq(t->rank, 2);
    int64_t flipped[] = {t->shape[1], t->shape[0]};  // the same bytes, transposed
    *input(p, k, 1) = retyped(p, b, t->dtype, 2, flipped);
    expect_refused(p, op_label(p, k), "inner dims differ", NULL);
    plan_free(p);
}

Test(opcheck, output_the_rule_does_not_make)
{
    Plan *p = gpt2("fp32", "none", "1");
    int32_t k = find_op(p, "cross_entropy_fused", 0);
    p->tensors[p->ids[p->ops[k].out]].dtype = PLAN_DT_BF16;  // the loss, which nothing views
    expect_refused(p, op_label(p, k), "output 0", "should be f32[] by the shape rule", NULL);
    plan_free(p);
}

Test(opcheck, a_dropped_input)
{
    Plan *p = gpt2("fp32", "none", "1");
    int32_t k = find_op(p, "layernorm", 0);
    p->ops[k].n_in--;
    expect_refused(p, op_label(p, k), "2 inputs and 1 output", "takes 3 input(s)", NULL);
    plan_free(p);
}

Test(opcheck, an_input_made_after_its_reader)
{
    Plan *p = gpt2("fp32", "none", "1");
    int32_t k = find_op(p, "matmul_bias_gelu", 0), later = find_op(p, "cross_entropy_fused", 0);
    *input(p, k, 0) = p->ids[p->ops[later].out];
    expect_refused(p, op_label(p, k), "not before this op", NULL);
    plan_free(p);
}

Test(opcheck, attributes_out_of_range_or_of_the_wrong_kind)
{
    Plan *p = gpt2("fp32", "none", "1");
    int32_t k = find_op(p, "attention_qkv", 0);
    PlanAttr *a = attr(p, k, "causal");
    a->i = 2;
    expect_refused(p, op_label(p, k), "flag 'causal' is 2", NULL);
    a->i = 1;
    a->kind = PLAN_ATTR_FLOAT;
    expect_refused(p, op_label(p, k), "'causal' should be an integer", NULL);
    a->kind = PLAN_ATTR_INT;
    expect_ok(p, "restored");
    a = attr(p, k, "nkv");
    a->i = 3;  // 2 query heads are not a multiple of 3 kv heads
    expect_refused(p, op_label(p, k), "nh = 2 query heads over nkv = 3 kv heads", NULL);
    a->i = 2;
    expect_ok(p, "restored");
    plan_free(p);

    p = gpt2_unpacked();
    k = find_op(p, "split", 0);
    attr(p, k, "axis")->i = 3;  // of a rank-3 tensor
    expect_refused(p, op_label(p, k), "axis 3 is out of range", NULL);
    attr(p, k, "axis")->i = (int64_t)1 << 40;  // would wrap in the kernel's int
    expect_refused(p, op_label(p, k), "outside the int range", NULL);
    attr(p, k, "axis")->i = -1;

    k = find_op(p, "lr_at", 0);
    attr(p, k, "schedule")->i = 7;
    expect_refused(p, op_label(p, k), "schedule 7", NULL);
    attr(p, k, "schedule")->i = 1;
    attr(p, k, "warmup")->key = plan_intern(p, "warm_up");
    expect_refused(p, op_label(p, k), "attribute 'warm_up' is not in this fsexec's signature", NULL);
    attr(p, k, "warm_up")->key = attr(p, k, "lr")->key;
    expect_refused(p, op_label(p, k), "attribute 'lr' is given twice", NULL);
    plan_free(p);
}

Test(opcheck, a_missing_attribute)
{
    Plan *p = gpt2("fp32", "none", "1");
    int32_t k = find_op(p, "reshape", 0);
    p->ops[k].n_attr = 0;
    expect_refused(p, op_label(p, k), "attribute 'shape' is missing", NULL);
    plan_free(p);
}

Test(opcheck, a_collective_for_another_world)
{
    Plan *p = gpt2("fp32", "ddp", "2");
    int32_t k = find_op(p, "all_reduce", 0);
    attr(p, k, "world")->i = 4;
    expect_refused(p, op_label(p, k), "world of 4", NULL);
    plan_free(p);
}

/* Grouped-query attention in a plan: k and v with 1 head under q's 2 pass; a kv head
 * count that does not divide q's is refused with both counts (attention as written: pack_attention 0). */
Test(opcheck, grouped_query_attention_head_counts)
{
    Setting apart = {"pack_attention", "0"};
    Plan *p = sample_compile("llama.fsm", LLAMA, 8, &apart, 1, NULL);
    expect_ok(p, "llama, 2 query heads over 1 kv head");
    int32_t k = find_op(p, "attention", 0), kin = *input(p, k, 1), vin = *input(p, k, 2);
    const PlanTensor *t = &p->tensors[kin];
    int64_t three[PLAN_MAX_RANK];
    for (int d = 0; d < t->rank; d++) three[d] = t->shape[d];
    three[t->rank - 3] = 3;
    three[t->rank - 2] = t->shape[t->rank - 2] / 4;  // 3 heads of a quarter of the keys: within k's bytes
    *input(p, k, 1) = retyped(p, kin, t->dtype, t->rank, three);
    *input(p, k, 2) = retyped(p, vin, p->tensors[vin].dtype, t->rank, three);
    expect_refused(p, op_label(p, k), "q's 2 heads are not a multiple of k and v's 3", NULL);
    plan_free(p);
}

/* Llama's attention on its projections' rows (attention_rows, nh = 2, nkv = 1): k and v rows of half a head are
 * refused, naming the three types and both head counts. */
Test(opcheck, attention_rows_head_widths)
{
    Plan *p = sample_compile("llama.fsm", LLAMA, 8, NULL, 0, NULL);
    expect_ok(p, "llama, attention_rows of 2 query heads over 1 kv head");
    int32_t k = find_op(p, "attention_rows", 0), kin = *input(p, k, 1), vin = *input(p, k, 2);
    const PlanTensor *t = &p->tensors[kin];
    int64_t half[PLAN_MAX_RANK];
    for (int d = 0; d < t->rank; d++) half[d] = t->shape[d];
    half[t->rank - 1] /= 2;  // within k's bytes
    *input(p, k, 1) = retyped(p, kin, t->dtype, t->rank, half);
    *input(p, k, 2) = retyped(p, vin, p->tensors[vin].dtype, t->rank, half);
    expect_refused(p, op_label(p, k), "are not 2 and 1 heads of one width over the same rows", NULL);
    plan_free(p);
}

/* Backward ops' rules trust autodiff; the kernels read dy as the forward op makes it. */
Test(opcheck, backward_ops_against_their_forward_ops)
{
    Plan *p = gpt2("fp32", "none", "1");
    int32_t k = find_op(p, "layernorm_bwd", 0), w = *input(p, k, 1);
    int64_t shorter[] = {p->tensors[w].shape[0] / 2};
    *input(p, k, 1) = retyped(p, w, PLAN_DT_F32, 1, shorter);
    expect_refused(p, op_label(p, k), "layernorm: weight must be", NULL);
    *input(p, k, 1) = w;

    k = find_op(p, "attention_qkv_bwd", 0);
    int32_t lse = *input(p, k, 2);
    const PlanTensor *t = &p->tensors[lse];
    *input(p, k, 2) = retyped(p, lse, PLAN_DT_BF16, t->rank, t->shape);
    expect_refused(p, op_label(p, k), "input 2 (lse)", NULL);
    *input(p, k, 2) = lse;

    k = find_op(p, "embedding_bwd", 0);
    int32_t idx = *input(p, k, 0);
    t = &p->tensors[idx];
    *input(p, k, 0) = retyped(p, idx, PLAN_DT_F32, t->rank, t->shape);
    expect_refused(p, op_label(p, k), "indices must be i32", NULL);
    *input(p, k, 0) = idx;
    expect_ok(p, "restored");
    plan_free(p);

    p = gpt2_unpacked();
    k = find_op(p, "attention_bwd", 0);
    lse = *input(p, k, 4);
    t = &p->tensors[lse];
    *input(p, k, 4) = retyped(p, lse, PLAN_DT_BF16, t->rank, t->shape);
    expect_refused(p, op_label(p, k), "input 4 (lse)", NULL);
    plan_free(p);
}

/* The optimizer's state is f32; its gradient (input 1) may be 16-bit, read as it is,
 * but not an integer; the params it writes besides (adamw_cast's w) are 16-bit. */
Test(opcheck, optimizer_inputs_are_f32)
{
    Plan *p = gpt2("bf16", "none", "1");
    int32_t k = find_op(p, "adamw_cast", 0), m = *input(p, k, 2);
    const PlanTensor *t = &p->tensors[m];
    cr_expect_eq(p->tensors[*input(p, k, 1)].dtype, PLAN_DT_BF16, "adamw reads the bf16 gradient");
    *input(p, k, 2) = retyped(p, m, PLAN_DT_BF16, t->rank, t->shape);
    expect_refused(p, op_label(p, k), "input 2", "should be f32", NULL);
    plan_free(p);
    p = gpt2("bf16", "none", "1");
    k = find_op(p, "adamw_cast", 0);
    int32_t g = *input(p, k, 1);
    *input(p, k, 1) = retyped(p, g, PLAN_DT_I32, p->tensors[g].rank, p->tensors[g].shape);
    expect_refused(p, op_label(p, k), "input 1", "should be a float tensor", NULL);
    plan_free(p);
    p = gpt2("bf16", "none", "1");
    k = find_op(p, "adamw_cast", 0);
    int32_t w = *input(p, k, 7);
    *input(p, k, 7) = retyped(p, w, PLAN_DT_F32, p->tensors[w].rank, p->tensors[w].shape);
    expect_refused(p, op_label(p, k), "w must be a 16-bit copy of p", NULL);
    plan_free(p);
}

/* ---- views and the arena ------------------------------------------------------------------ */

static int32_t find_view(const Plan *p, int strided)
{
    for (int32_t i = 0; i < p->n_tensors; i++)
        if (p->tensors[i].alias != PLAN_NONE && (p->tensors[i].rank_stride != 0) == strided) return i;
    cr_assert_fail("no %sview", strided ? "rank-strided " : "");
    return -1;
}

Test(opcheck, a_view_past_its_root)
{
    Plan *p = gpt2("fp32", "none", "1");
    int32_t v = find_view(p, 0);
    PlanTensor *t = &p->tensors[v], *r = &p->tensors[t->alias];
    int64_t keep = t->offset;
    t->offset = r->offset + plan_tensor_nbytes(r) - plan_tensor_nbytes(t) + plan_dtype_size(t->dtype);
    expect_refused(p, "tensor", "alias", "not a root tensor whose bytes hold this view's", NULL);
    t->offset = keep;
    expect_ok(p, "restored");
    plan_free(p);
}

Test(opcheck, a_shard_past_its_root_on_the_last_rank)
{
    Plan *p = gpt2("fp32", "zero1", "2");
    int32_t v = find_view(p, 1);
    p->tensors[v].rank_stride += plan_dtype_size(p->tensors[v].dtype);  // rank 1 one element past
    expect_refused(p, "alias", "on every rank", NULL);
    plan_free(p);
}

Test(opcheck, tensors_outside_the_arena)
{
    Plan *p = gpt2("fp32", "none", "1");
    p->programs[0].space_bytes[PLAN_PLACE_DEVICE] = 64;
    expect_refused(p, "outside the 64-byte device arena", NULL);
    plan_free(p);
}

/* ---- values kernels index with -------------------------------------------------------------- */

/* A meta vocab above the table: data.c checks tokens against the table's rows too (the
 * least bound of what tokens and targets index: rt_input_bound), so the reads are safe. */
Test(opcheck, a_vocab_above_the_table)
{
    Plan *p = gpt2("fp32", "none", "1");
    plan_meta_set_int(p, "vocab", 1000);
    int32_t by;
    cr_assert_eq(rt_input_bound(p, find_tensor(p, "tokens"), &by), 256);
    cr_assert_eq(by, find_op(p, "embedding", 0));
    cr_assert_eq(rt_input_bound(p, find_tensor(p, "targets"), &by), 256);
    cr_assert_str_eq(plan_str(p, p->ops[by].op), "cross_entropy_fused");
    expect_ok(p, "a meta vocab above the table");
    plan_free(p);
}

/* The targets share their bytes with an activation: by the loss they may hold floats. */
Test(opcheck, indices_overwritten_before_they_are_read)
{
    Plan *p = gpt2("fp32", "none", "1");
    int32_t tg = find_tensor(p, "targets"), k = find_op(p, "matmul_bias_gelu", 0);
    p->tensors[tg].offset = p->tensors[p->ids[p->ops[k].out]].offset;
    expect_refused(p, "(cross_entropy_fused)", "targets", "over its bytes", NULL);
    plan_free(p);
}

/* adamw stops on step 0 unless its coef is NaN; count_step must advance the counter
 * with the same coef first. */
Test(opcheck, an_adamw_step_no_counter_vouches_for)
{
    Plan *p = gpt2("fp32", "none", "1");
    int32_t c = find_op(p, "count_step", 0), a = find_op(p, "adamw", 0);
    *input(p, c, 1) = *input(p, a, 4);  // advanced with lr instead of adamw's coef
    expect_refused(p, op_label(p, a), "step count", "not known to be at least 1", NULL);
    plan_free(p);
}

Test(opcheck, counters_updated_only_by_their_op)
{
    Plan *p = gpt2("fp32", "none", "1");
    int32_t c = find_op(p, "count_step", 0), count = *input(p, c, 0);
    p->tensors[count].init = PLAN_INIT_ONES;  // no longer starts at zero
    expect_refused(p, op_label(p, c), "counter", NULL);
    plan_free(p);
}

/* embedding copies table rows with memcpy: an output over its table is undefined. */
Test(opcheck, an_output_over_its_input)
{
    Plan *p = gpt2("fp32", "none", "1");
    int32_t k = find_op(p, "embedding", 0), out = p->ids[p->ops[k].out];
    p->tensors[out].offset = p->tensors[*input(p, k, 0)].offset;
    expect_refused(p, op_label(p, k), "output 0", "overlaps input 0", NULL);
    plan_free(p);
}

/* ---- the executor runs the check ------------------------------------------------------------ */

Test(opcheck, rt_exec_new_refuses_what_the_check_refuses)
{
    Plan *p = gpt2("bf16", "none", "1");
    int32_t k = find_op(p, "matmul_bias", 0), b = *input(p, k, 1);  // the QKV weight's bf16 copy
    const PlanTensor *t = &p->tensors[b];
    *input(p, k, 1) = retyped(p, b, PLAN_DT_F32, t->rank, t->shape);
    char err[1024] = "";
    cr_assert_null(rt_exec_new(p, &(ExecOptions){.seed = 1}, err, sizeof err));
    cr_assert(strstr(err, op_label(p, k)) && strstr(err, "dtypes differ"), "%s", err);
    plan_free(p);
}
