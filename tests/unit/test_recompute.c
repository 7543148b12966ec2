/* tests/unit/test_recompute.c: activation checkpointing changes memory, never numbers.
 *  - Gradients with recompute are bit-identical to gradients without it (CPU backend),
 *    for GPT-2 and Llama, for `recompute all` and for a named layer, unsharded and with
 *    every sharding strategy (world 1: the shard pass's flat buffers, gathers and
 *    regathers all run), and in bf16.
 *  - The plan needs less memory, and the extra forward shows in the FLOPs: about a
 *    forward for a full recompute; for `recompute attention` (selective) exactly the
 *    attention core's forward: the QKV projection (and its bias, split, heads; Llama's
 *    rope), the attention and its merge_heads, per block.
 *  - Per-instance items (h.0-1, attention:h.2) recompute those blocks alone.
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
    double rerun;  // the forward FLOPs the recompute setting reruns: its full blocks', and its
                   // attention blocks' cores (see the top)
} Compiled;

/* Whether forward node n is in its block's attention core: the attention, what feeds it
 * back to the QKV projection, and merge_heads of its output (by the ops GPT-2 and Llama
 * write there: the projection is the block's first matmuls, before the attention; GPT-2's
 * split, heads, attention and merge_heads are one attention_qkv under pack_attention, Llama's
 * heads, rope, attention and merge_heads rope_rows and attention_rows; with its bias, one
 * matmul_bias: passes/epilogue.c). */
static int in_core(const Graph *g, int n)
{
    const Node *node = &g->nodes[n];
    if (node->block < 0 || node->phase != PHASE_FORWARD) return 0;
    int attention = -1, first = -1;
    for (int k = 0; k < g->n_nodes; k++)
        if (g->nodes[k].block == node->block && g->nodes[k].phase == PHASE_FORWARD) {
            if (first < 0) first = k;
            if (g->nodes[k].op == OP_attention || g->nodes[k].op == OP_attention_qkv ||
                g->nodes[k].op == OP_attention_rows)
                attention = k;
        }
    if (n > attention) return n == attention + 1 && node->op == OP_merge_heads;
    return node->op == OP_attention || node->op == OP_attention_qkv || node->op == OP_attention_rows ||
           node->op == OP_heads || node->op == OP_rope || node->op == OP_rope_rows ||
           node->op == OP_split || node->op == OP_matmul || node->op == OP_matmul_bias ||
           (node->op == OP_add && g->nodes[n - 1].op == OP_matmul && n > first + 1);
}

static Compiled compile(const char *file, const Define *defs, int n_defs, const char *recompute, const char *shard,
                        const char *precision)
{
    Setting set[] = {{"recompute", recompute}, {"shard", shard}, {"precision", precision}};
    Graph *g;
    Compiled c = {sample_compile(file, defs, n_defs, set, 3, &g), {0}, 0};
    for (int n = 0; n < g->n_nodes; n++) {
        double f = ir_op_hooks(g->nodes[n].op)->flops(g, &g->nodes[n]);
        c.flops[g->nodes[n].phase] += f;
        /* A cast of a unit's params (16-bit none and ddp cast the flat buffer once a step,
         * in its block's forward) is the step's work, not the block's: never rerun. */
        int param_cast = g->nodes[n].op == OP_cast && ir_value(g, ir_in(g, &g->nodes[n], 0))->role == ROLE_PARAM;
        RecomputeMode m = g->nodes[n].block >= 0 && g->nodes[n].phase == PHASE_FORWARD && !param_cast
                              ? recompute_mode(recompute, &g->blocks[g->nodes[n].block]) : RC_NONE;
        if (m == RC_FULL || (m == RC_ATTENTION && in_core(g, n))) c.rerun += f;
    }
    ir_graph_free(g);
    return c;
}

static void check_strategy(const char *file, const Define *defs, int n_defs, const char *recompute, const char *shard,
                           const char *precision)
{
    Compiled plain = compile(file, defs, n_defs, "none", shard, precision);
    Compiled ckpt = compile(file, defs, n_defs, recompute, shard, precision);
    size_t na, nb;
    float *a = sample_step1_grads(plain.plan, &na), *b = sample_step1_grads(ckpt.plan, &nb);
    cr_assert_eq(na, nb);
    cr_assert_gt(na, 1000);
    size_t diff = 0;
    for (size_t i = 0; i < na; i++) diff += memcmp(&a[i], &b[i], sizeof(float)) != 0;
    cr_expect_eq(diff, 0, "%s, recompute %s, shard %s, %s: %zu of %zu gradient elements differ", file, recompute, shard,
                 precision, diff, na);
    int64_t arena_a = plan_space_bytes(plain.plan, PLAN_PLACE_DEVICE), arena_b = plan_space_bytes(ckpt.plan, PLAN_PLACE_DEVICE);
    cr_expect_lt(arena_b, arena_a, "%s: recompute %s plans %ld bytes, without %ld", file, recompute, (long)arena_b,
                 (long)arena_a);
    cr_expect_eq(plain.flops[PHASE_RECOMPUTE], 0);
    cr_expect_eq(ckpt.flops[PHASE_RECOMPUTE], ckpt.rerun, "%s: recompute %s: %.6g FLOPs, the forward it reruns %.6g",
                 file, recompute, ckpt.flops[PHASE_RECOMPUTE], ckpt.rerun);
    if (!strstr(recompute, "attention"))
        cr_expect_gt(ckpt.flops[PHASE_RECOMPUTE], 0.5 * plain.flops[PHASE_FORWARD], "%s: recompute %.3g FLOPs, forward "
                     "%.3g", file, ckpt.flops[PHASE_RECOMPUTE], plain.flops[PHASE_FORWARD]);
    free(a);
    free(b);
    plan_free(plain.plan);
    plan_free(ckpt.plan);
}

static void check_identical(const char *file, const Define *defs, int n_defs, const char *recompute)
{
    check_strategy(file, defs, n_defs, recompute, "none", "fp32");
}

Test(recompute, gpt2_all_bit_identical) { check_identical("gpt2.fsm", GPT2, 6, "all"); }
Test(recompute, gpt2_block_bit_identical) { check_identical("gpt2.fsm", GPT2, 6, "Block"); }
Test(recompute, llama_all_bit_identical) { check_identical("llama.fsm", LLAMA, 7, "all"); }

/* Per strategy: the shard pass puts gradients in flat buffers and (fsdp) regathers params
 * for the backward; recompute reads them through the same views. bf16 adds the 16-bit
 * gathers and gradient buffers. */
Test(recompute, gpt2_block_bit_identical_ddp) { check_strategy("gpt2.fsm", GPT2, 6, "Block", "ddp", "fp32"); }
Test(recompute, gpt2_block_bit_identical_zero1) { check_strategy("gpt2.fsm", GPT2, 6, "Block", "zero1", "fp32"); }
Test(recompute, gpt2_block_bit_identical_zero2) { check_strategy("gpt2.fsm", GPT2, 6, "Block", "zero2", "fp32"); }
Test(recompute, gpt2_block_bit_identical_fsdp) { check_strategy("gpt2.fsm", GPT2, 6, "Block", "fsdp", "fp32"); }
Test(recompute, gpt2_block_bit_identical_fsdp_bf16) { check_strategy("gpt2.fsm", GPT2, 6, "Block", "fsdp", "bf16"); }
Test(recompute, gpt2_all_bit_identical_bf16) { check_strategy("gpt2.fsm", GPT2, 6, "all", "none", "bf16"); }

/* Selective recompute: the attention core only, in every block, or per instance. */
Test(recompute, gpt2_attention_bit_identical) { check_identical("gpt2.fsm", GPT2, 6, "attention"); }
Test(recompute, llama_attention_bit_identical) { check_identical("llama.fsm", LLAMA, 7, "attention"); }
Test(recompute, gpt2_attention_bit_identical_fsdp_bf16) { check_strategy("gpt2.fsm", GPT2, 6, "attention", "fsdp", "bf16"); }
Test(recompute, gpt2_instances_bit_identical) { check_identical("gpt2.fsm", GPT2, 6, "h.0-1,attention:h.2"); }
