/* tests/unit/test_param_groups.c: frozen params and weight-decay groups in the plan.
 *
 * Frozen params (the `freeze` setting) get no gradient, no optimizer state and no
 * reduction. On the tiny GPT-2 (every unit's size even, so world 2 pads nothing), with F
 * frozen elements of Psi, each gradient and optimizer-state category of --mem (the
 * optimizer's scalars aside) falls by exactly F / Psi of itself, whatever the strategy and
 * precision; and the bytes each rank sends a step (report/comm.c) fall by the frozen
 * params' reductions, b the reduce dtype's bytes:
 *   ddp 2bF (all-reduce), zero1 2bF, zero2 bF, fsdp bF (reduce-scatter); and in fp32,
 *   zero1 and zero2 no longer all-gather the frozen params (they never change): bF more.
 * Decay groups: `weight_decay_on matrices` puts every 1-D param of a unit in a flat
 * unit of its own, updated with weight_decay 0; the others keep the decay.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "report.h"
#include "sample.h"

static const char *const SHARDS[] = {"none", "ddp", "zero1", "zero2", "fsdp"};
static const MemCategory GRAD_OPT[] = {MEM_GRADS16, MEM_GRADS32, MEM_OPT_STATE};

static Plan *compile(const char *shard, const char *precision, const char *freeze, Graph **g)
{
    const Setting set[] = {{"shard", shard}, {"world", strcmp(shard, "none") ? "2" : "1"}, {"precision", precision},
                           {"optimizer", "adamw"}, {"freeze", freeze}};
    return sample_compile("gpt2.fsm", SAMPLE_GPT2, 6, set, 5, g);
}

/* h.1 (a whole block) and wpe (outside blocks: its unit splits in two). */
static int64_t frozen_numel(void)
{
    int64_t C = 64, T = 32;
    return 12 * C * C + 13 * C + T * C;
}

static void check(const char *shard, const char *precision)
{
    char what[64], err[256];
    snprintf(what, sizeof what, "%s %s", shard, precision);
    Graph *g;
    Plan *a = compile(shard, precision, "none", NULL), *b = compile(shard, precision, "h.1,wpe", &g);
    cr_assert_eq(ir_frozen_count(g), frozen_numel(), "%s: %lld frozen", what, (long long)ir_frozen_count(g));
    ir_graph_free(g);
    MemReport *ra = report_mem_new(a, err, sizeof err), *rb = report_mem_new(b, err, sizeof err);
    cr_assert(ra && rb, "%s: %s", what, err);
    int64_t psi = ra->param_count, F = frozen_numel(), scalars = 4;  // the optimizer's step count
    cr_expect(rb->param_count == psi && rb->frozen_count == F && ra->frozen_count == 0, "%s: %lld params, %lld frozen",
              what, (long long)rb->param_count, (long long)rb->frozen_count);
    for (size_t c = 0; c < sizeof GRAD_OPT / sizeof *GRAD_OPT; c++) {
        int64_t extra = GRAD_OPT[c] == MEM_OPT_STATE ? scalars : 0;
        int64_t before = ra->state[GRAD_OPT[c]] - extra, after = rb->state[GRAD_OPT[c]] - extra;
        cr_expect_eq(before * F % psi, 0, "%s: %s: the frozen share is not whole", what,
                     report_category_name(GRAD_OPT[c]));
        cr_expect_eq(before - after, before * F / psi, "%s: %s %lld -> %lld bytes, the frozen share is %lld", what,
                     report_category_name(GRAD_OPT[c]), (long long)before, (long long)after,
                     (long long)(before * F / psi));
    }
    cr_expect_eq(rb->state[MEM_PARAMS32] + rb->state[MEM_PARAMS16], ra->state[MEM_PARAMS32] + ra->state[MEM_PARAMS16],
                 "%s: frozen params are still held", what);
    int fp32 = !strcmp(precision, "fp32");
    double bytes = fp32 ? 4 : 2, times = 0;
    if (!strcmp(shard, "ddp")) times = 2;
    if (!strcmp(shard, "zero1")) times = fp32 ? 3 : 2;
    if (!strcmp(shard, "zero2")) times = fp32 ? 2 : 1;
    if (!strcmp(shard, "fsdp")) times = 1;
    CommTotals ca = comm_totals(a), cb = comm_totals(b);
    cr_expect_eq(ca.bytes - cb.bytes, times * bytes * (double)F, "%s: %.0f -> %.0f bytes sent, want %.0f less", what,
                 ca.bytes, cb.bytes, times * bytes * (double)F);
    report_mem_free(ra);
    report_mem_free(rb);
    plan_free(a);
    plan_free(b);
}

Test(param_groups, frozen_fp32)
{
    for (size_t s = 0; s < sizeof SHARDS / sizeof *SHARDS; s++) check(SHARDS[s], "fp32");
}

Test(param_groups, frozen_bf16)
{
    for (size_t s = 0; s < sizeof SHARDS / sizeof *SHARDS; s++) check(SHARDS[s], "bf16");
}

/* Under zero2 at world 2, each update node's weight decay is its unit's: 0 exactly for
 * the units of 1-D params, and each param lies in the unit of its group. */
Test(param_groups, decay_units)
{
    const Setting set[] = {{"shard", "zero2"}, {"world", "2"}, {"weight_decay", "0.1"}, {"weight_decay_on", "matrices"}};
    Graph *g;
    Plan *p = sample_compile("gpt2.fsm", SAMPLE_GPT2, 6, set, 4, &g);
    int decayed = 0, not_decayed = 0;
    for (int n = 0; n < g->n_nodes; n++) {
        const Node *nd = ir_node(g, n);
        if (nd->op != OP_adamw) continue;
        const Value *pv = ir_value(g, ir_in(g, nd, 0));
        double wd = ir_attr_float(g, nd, "weight_decay", -1);
        cr_expect_eq(wd, pv->no_decay ? 0.0 : 0.1, "update of unit %d: weight_decay %g", pv->unit, wd);
        decayed += !pv->no_decay, not_decayed += pv->no_decay;
    }
    cr_expect_eq(decayed, 3, "h.0, h.1 and the root's matrices: %d units decayed", decayed);
    cr_expect_eq(not_decayed, 3, "their 1-D params: %d units not decayed", not_decayed);
    for (int v = 0; v < g->n_values; v++) {
        const Value *x = ir_value(g, v);
        if (x->role != ROLE_PARAM || !x->name || x->view_of < 0 || x->tied_to >= 0 || x->unit < 0) continue;
        cr_expect_eq(x->no_decay, x->rank < 2, "%s", x->name);
        cr_expect_eq(x->unit / (g->n_blocks + 2), x->rank < 2 ? GROUP_NO_DECAY : GROUP_DECAY, "%s in unit %d", x->name,
                     x->unit);
    }
    ir_graph_free(g);
    plan_free(p);
}

/* `freeze` names: a layer instance, a layer's param in every instance, a param; flags in
 * the source (lora.fsm: every base weight) and `weight_decay_on matrices`. */
Test(param_groups, what_freeze_names)
{
    const Setting set[] = {{"freeze", "h.0, Block.attn.w,wpe"}, {"weight_decay_on", "matrices"}};
    Graph *g;
    Plan *p = sample_compile("gpt2.fsm", SAMPLE_GPT2, 6, set, 2, &g);
    int n = 0;
    for (int v = 0; v < g->n_values; v++) {
        /* The model's params are views of their unit's flat buffer (passes/shard.c, every
         * strategy): the optimizer updates, and the gradient belongs to, that buffer. */
        const Value *x = ir_value(g, v);
        if (x->role != ROLE_PARAM || !x->name || x->tied_to >= 0 || x->view_of < 0) continue;
        const Value *flat = ir_value(g, x->view_of);
        int want = !strncmp(x->name, "h.0.", 4) || !strcmp(x->name, "h.1.attn.w") || !strcmp(x->name, "wpe");
        cr_expect_eq(x->frozen, want, "%s", x->name);
        cr_expect_eq(flat->frozen, want, "%s in %s", x->name, flat->name);
        cr_expect_eq(flat->grad < 0, want, "%s: its unit's gradient %d", x->name, flat->grad);
        cr_expect_eq(x->no_decay, x->rank < 2, "%s", x->name);
        n++;
    }
    cr_expect_eq(n, 12 * 2 + 4, "%d params", n);
    ir_graph_free(g);
    plan_free(p);
    const Define dims[] = {{"L", 2}, {"C", 64}, {"NH", 4}, {"T", 32}, {"V", 256}, {"B", 4}, {"R", 8}};
    p = sample_compile("lora.fsm", dims, 7, NULL, 0, &g);
    int64_t C = 64, R = 8, adapters = 2 * (C * R + R * 3 * C + C * R + R * C);
    cr_expect_eq(ir_param_count(g) - ir_frozen_count(g), adapters, "%lld trainable",
                 (long long)(ir_param_count(g) - ir_frozen_count(g)));
    cr_expect_eq(plan_meta_int(p, "frozen_params", 0), ir_frozen_count(g));
    ir_graph_free(g);
    plan_free(p);
}
