/* tests/unit/test_recompute.c: activation checkpointing changes memory, never numbers.
 *  - Gradients with recompute are bit-identical to gradients without it (CPU backend),
 *    for GPT-2 and Llama, for `recompute all` and for a named layer.
 *  - The plan needs less memory, and the extra forward shows in the FLOPs.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "codegen.h"
#include "frontend.h"
#include "passes.h"
#include "runtime.h"
#include "sample.h"

static const Define GPT2[] = {{"L", 3}, {"C", 64}, {"NH", 4}, {"T", 32}, {"V", 256}, {"B", 4}};
static const Define LLAMA[] = {{"L", 3}, {"C", 64}, {"NH", 4}, {"F", 176}, {"T", 32}, {"V", 256}, {"B", 4}};

typedef struct {
    Plan *plan;
    double flops[PHASE_COUNT];
} Compiled;

static Compiled compile(const char *file, const Define *defs, int n_defs, const char *recompute)
{
    Setting set[] = {{"recompute", recompute}};
    Graph *g;
    Compiled c = {sample_compile(file, defs, n_defs, set, 1, &g), {0}};
    for (int n = 0; n < g->n_nodes; n++) c.flops[g->nodes[n].phase] += op_info(g->nodes[n].op)->flops(g, &g->nodes[n]);
    ir_graph_free(g);
    return c;
}

/* Every gradient of step 1, in tensor order, concatenated. */
static float *gradients(const Plan *p, size_t *n)
{
    char err[256];
    ExecOptions eo = {.seed = 5};
    Exec *e = rt_exec_new(p, &eo, err, sizeof err);
    cr_assert_not_null(e, "%s", err);
    RtData *data = rt_data_open(e, NULL, RT_ORDER_SEQUENTIAL, 5, err, sizeof err);
    cr_assert_not_null(data, "%s", err);
    rt_data_fill(data, 1);
    cr_assert_eq(rt_exec_run(e, 1, RT_PHASE(PLAN_PHASE_FORWARD) | RT_PHASE(PLAN_PHASE_RECOMPUTE) | RT_PHASE(PLAN_PHASE_BACKWARD)), 0);
    size_t total = 0;
    for (int32_t i = 0; i < p->n_tensors; i++)
        if (p->tensors[i].role == PLAN_ROLE_PARAM && p->tensors[i].grad != PLAN_NONE) total += (size_t)plan_tensor_numel(&p->tensors[p->tensors[i].grad]);
    float *out = malloc(sizeof(float) * total), *at = out;
    for (int32_t i = 0; i < p->n_tensors; i++) {
        if (p->tensors[i].role != PLAN_ROLE_PARAM || p->tensors[i].grad == PLAN_NONE) continue;
        RtTensor t;
        rt_exec_tensor_id(e, p->tensors[i].grad, &t);
        memcpy(at, t.data, sizeof(float) * (size_t)t.numel);
        at += t.numel;
    }
    *n = total;
    rt_data_close(data);
    rt_exec_free(e);
    return out;
}

static void check_identical(const char *file, const Define *defs, int n_defs, const char *recompute)
{
    Compiled plain = compile(file, defs, n_defs, "none"), ckpt = compile(file, defs, n_defs, recompute);
    size_t na, nb;
    float *a = gradients(plain.plan, &na), *b = gradients(ckpt.plan, &nb);
    cr_assert_eq(na, nb);
    cr_assert_gt(na, 1000);
    size_t diff = 0;
    for (size_t i = 0; i < na; i++) diff += memcmp(&a[i], &b[i], sizeof(float)) != 0;
    cr_expect_eq(diff, 0, "%s, recompute %s: %zu of %zu gradient elements differ", file, recompute, diff, na);
    int64_t arena_a = plan_meta_int(plain.plan, "arena_bytes", 0), arena_b = plan_meta_int(ckpt.plan, "arena_bytes", 0);
    cr_expect_lt(arena_b, arena_a, "%s: recompute %s plans %ld bytes, without %ld", file, recompute, (long)arena_b,
                 (long)arena_a);
    cr_expect_eq(plain.flops[PHASE_RECOMPUTE], 0);
    cr_expect_gt(ckpt.flops[PHASE_RECOMPUTE], 0.5 * plain.flops[PHASE_FORWARD],
                 "%s: recompute %.3g FLOPs, forward %.3g", file, ckpt.flops[PHASE_RECOMPUTE], plain.flops[PHASE_FORWARD]);
    free(a);
    free(b);
    plan_free(plain.plan);
    plan_free(ckpt.plan);
}

Test(recompute, gpt2_all_bit_identical) { check_identical("gpt2.fsm", GPT2, 6, "all"); }
Test(recompute, gpt2_block_bit_identical) { check_identical("gpt2.fsm", GPT2, 6, "Block"); }
Test(recompute, llama_all_bit_identical) { check_identical("llama.fsm", LLAMA, 7, "all"); }
