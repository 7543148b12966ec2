/* tests/unit/test_plan.c: the plan file. A small real model (built through ir.h and
 * codegen_plan) round-trips through bytes and through a file field for field; then the
 * reader meets every kind of damage: truncation at every byte, every bit of the header
 * and of every section flipped, wrong magic (and text-mode damage), other versions,
 * unknown, duplicate and missing sections, longer records from a newer minor, hostile
 * files with valid checksums, and the k-th allocation failing for every k. rt_inspect's
 * report is checked for the lines a user reads. The CUDA program (version 1.1) rides
 * along: two hand-made instructions, a LAUNCH and a GEMM, go through every trip, a 1.0
 * file without it still reads, and every bad instruction is refused with its message.
 * Version 2.1's fields (each op's micro-batch and FLOPs, each program's tensor, output
 * and module ranges) ride along too, and a 2.0 file reads with their defaults; so does
 * 2.2's (a tensor's logical rows: a padded vocabulary), and a 2.1 file reads without it.
 *
 * The layout is decoded here by hand, from the description in plan/plan.h, rather than
 * with plan/format.h, so the test also holds the documented format.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "codegen.h"
#include "ir.h"
#include "runtime.h"
#include "build.h"
#include "alloc_count.h"  // the allocation hook: counts, and fails the k-th call when asked

/* ---- the model --------------------------------------------------------------------- */

static Graph *g;
static TrainConfig cfg;
static Plan *plan;      // codegen_plan(g, &cfg, ...)
static uint8_t *bytes;  // plan_write_mem(plan)
static size_t n_bytes;
static int32_t padded;  // 1 + the tensor setup gives logical rows (version 2.2)
static char err[512];

static int value(Role role, const char *name, DType dt, const int64_t *shape, int rank, int block)
{
    return build_value(g, role, name, dt, shape, rank, block, (Loc){0});
}

static int node(OpKind op, const int *in, int n_in, const Attr *attrs, int n_attr, int block, Phase phase, Loc loc)
{
    return build_node(g, op, in, n_in, attrs, n_attr, block, phase, loc);
}
static int out0(int n) { return ir_out(g, ir_node(g, n), 0); }

/* embedding -> block h.0 (layernorm, matmul, add, split) -> tied logits -> loss, a
 * reshape with a list attribute, and a grad made in the backward phase. */
static void build_graph(void)
{
    g = ir_graph_new("tiny");
    int h0 = ir_block_add(g, "h.0", "Block", 0);
    int tokens = value(ROLE_INPUT, "tokens", DT_I32, DIMS(2, 4), -1);
    int targets = value(ROLE_INPUT, "targets", DT_I32, DIMS(2, 4), -1);
    int wte = value(ROLE_PARAM, "wte", DT_F32, DIMS(16, 8), -1);
    int lw = value(ROLE_PARAM, "h.0.ln.w", DT_F32, DIMS(8), h0);
    int lb = value(ROLE_PARAM, "h.0.ln.b", DT_F32, DIMS(8), h0);
    int w = value(ROLE_PARAM, "h.0.w", DT_F32, DIMS(8, 24), h0);
    int b = value(ROLE_PARAM, "h.0.b", DT_F32, DIMS(24), h0);
    int tied = value(ROLE_PARAM, "lm_head", DT_F32, DIMS(16, 8), -1);
    g->values[tied].tied_to = wte;
    g->values[wte].init = INIT_NORMAL, g->values[wte].init_a = 0.02;
    g->values[w].init = INIT_UNIFORM, g->values[w].init_a = -0.5, g->values[w].init_b = 0.5;
    g->values[lw].init = INIT_ONES;
    g->values[b].init = INIT_ZEROS;
    g->values[tied].place = PLACE_HOST;  // read by no op (only copies cross the spaces): the round trip carries both places

    int x = out0(node(OP_embedding, INS(wte, tokens), NULL, 0, -1, PHASE_FORWARD, (Loc){12, 7, 9}));
    int y = out0(node(OP_layernorm, INS(x, lw, lb), ATTRS(AF("eps", 1e-5)), h0, PHASE_FORWARD, (Loc){14, 9, 1}));
    y = out0(node(OP_matmul, INS(y, w), NULL, 0, h0, PHASE_FORWARD, (Loc){14, 20, 1}));
    y = out0(node(OP_add, INS(y, b), NULL, 0, h0, PHASE_FORWARD, (Loc){14, 24, 1}));
    int s = node(OP_split, INS(y), ATTRS(AI("n", 3), AI("axis", -1)), h0, PHASE_FORWARD, (Loc){15, 7, 5});
    int q = ir_out(g, ir_node(g, s), 0);
    int wt = out0(node(OP_transpose, INS(wte), ATTRS(AI("a", -2), AI("b", -1)), -1, PHASE_FORWARD, (Loc){17, 20, 9}));
    int logits = out0(node(OP_matmul, INS(q, wt), NULL, 0, -1, PHASE_FORWARD, (Loc){17, 18, 1}));
    int loss = out0(node(OP_cross_entropy, INS(logits, targets), NULL, 0, -1, PHASE_FORWARD, (Loc){17, 10, 13}));
    int r = out0(node(OP_reshape, INS(logits), ATTRS(AL("shape", 8, -1)), -1, PHASE_BACKWARD, (Loc){0}));
    g->values[r].role = ROLE_GRAD;
    g->values[r].name = "logits.grad";
    ir_output_add(g, loss);
    ir_output_add(g, r);
    /* A memory plan, as memplan would leave it: the reshape is a view of logits. */
    for (int i = 0; i < g->n_values; i++) {
        g->values[i].offset = 64 * i;
        g->values[i].live_start = i % 3;
        g->values[i].live_end = g->n_nodes - i % 2;
    }
    g->values[r].alias = logits;
    g->values[r].offset = g->values[logits].offset;
    g->values[wte].grad = r;
    g->space_bytes[PLACE_DEVICE] = 64 * g->n_values;
    g->planned = 1;
}

/* A LAUNCH and a GEMM at the end of the CUDA program (after any codegen made), so every
 * round trip carries both kinds. The GEMM is the block's matmul: [8, 8] @ [8, 24]. */
static void add_cuda_records(Plan *p)
{
    int32_t last = p->n_ops - 1, args = p->n_ids;
    const Node *mm = NULL;
    for (int i = 0; i < g->n_nodes && !mm; i++)
        if (g->nodes[i].op == OP_matmul) mm = &g->nodes[i];
    cr_assert(plan_id_add(p, 0) >= 0 && plan_id_add(p, 1) >= 0);
    for (int k = 0; k < 2; k++) cr_assert(plan_id_add(p, ir_in(g, mm, k)) >= 0);
    cr_assert(plan_id_add(p, ir_out(g, mm, 0)) >= 0);
    PlanCuda launch = {.op = last, .kind = PLAN_CU_LAUNCH, .kernel = plan_intern(p, "fs_test_0123abcd"), .args = args,
                       .n_args = 2, .grid = {7, 1, 1}, .block = {256, 1, 1}, .smem = 128};
    PlanCuda gemm = {.op = last, .kind = PLAN_CU_GEMM, .kernel = PLAN_NONE, .args = args + 2, .n_args = 3,
                     .m = 8, .n = 24, .k = 8, .lda = 8, .ldb = 24, .ldc = 24, .stride_a = 64, .stride_b = 0,
                     .stride_c = 192, .batch = 1};
    cr_assert(plan_cuda_add(p, &launch) >= 0 && plan_cuda_add(p, &gemm) >= 0);
}

static void setup(void)
{
    plan_set_alloc(NULL, NULL);
    padded = 0;
    build_graph();
    config_default(&cfg);
    const char *set[][2] = {{"shard", "fsdp"}, {"precision", "bf16"}, {"world", "8"}, {"stages", "2"},
                            {"recompute", "Block"}, {"lr", "6e-4"}, {"seed", "42"}};
    for (size_t i = 0; i < sizeof set / sizeof *set; i++)
        cr_assert_eq(config_set(&cfg, set[i][0], set[i][1], err, sizeof err), 0, "%s", err);
    plan = codegen_plan(g, &cfg, err, sizeof err);
    cr_assert_not_null(plan);
    add_cuda_records(plan);
    /* Version 2.1's op fields, none at its default, so every trip carries them. */
    for (int32_t i = 0; i < plan->n_ops; i++) plan->ops[i].microbatch = i % 3 - 1, plan->ops[i].flops = 1e9 * i + 0.25;
    /* Version 2.2's tensor field, on an activation (the params' counts stay the model's). */
    for (int32_t i = 0; i < plan->n_tensors && !padded; i++)
        if (plan->tensors[i].role == PLAN_ROLE_ACT && plan->tensors[i].rank >= 1 && plan->tensors[i].shape[0] > 1)
            plan->tensors[i].logical_rows = plan->tensors[i].shape[0] - 1, padded = i + 1;
    cr_assert(padded, "an activation to give logical rows");
    void *buf;
    cr_assert_eq(plan_write_mem(plan, &buf, &n_bytes, err, sizeof err), 0, "%s", err);
    bytes = buf;
}

static void teardown(void)
{
    plan_set_alloc(NULL, NULL);
    plan_dealloc(bytes);
    plan_free(plan);
    ir_graph_free(g);
}

TestSuite(plan, .init = setup, .fini = teardown);

/* ---- comparing plans ---------------------------------------------------------------- */

static void assert_same_double(double a, double b, const char *what)
{
    cr_assert(!memcmp(&a, &b, sizeof a), "%s: %g vs %g", what, a, b);
}

static void assert_plans_equal(const Plan *a, const Plan *b)
{
    cr_assert_eq(a->n_strs, b->n_strs);
    for (int i = 0; i < a->n_strs; i++) cr_assert_str_eq(a->strs[i], b->strs[i]);
    cr_assert_eq(a->n_meta, b->n_meta);
    for (int i = 0; i < a->n_meta; i++) {
        const PlanMeta *x = &a->meta[i], *y = &b->meta[i];
        cr_assert_eq(x->key, y->key);
        cr_assert_eq(x->kind, y->kind);
        if (x->kind == PLAN_META_STR) cr_assert_eq(x->s, y->s);
        if (x->kind == PLAN_META_INT) cr_assert_eq(x->i, y->i);
        if (x->kind == PLAN_META_FLOAT) assert_same_double(x->f, y->f, plan_str(a, x->key));
    }
    cr_assert_eq(a->n_blocks, b->n_blocks);
    for (int i = 0; i < a->n_blocks; i++) {
        cr_assert_eq(a->blocks[i].name, b->blocks[i].name);
        cr_assert_eq(a->blocks[i].layer, b->blocks[i].layer);
        cr_assert_eq(a->blocks[i].index, b->blocks[i].index);
    }
    cr_assert_eq(a->n_tensors, b->n_tensors);
    for (int i = 0; i < a->n_tensors; i++) {
        const PlanTensor *x = &a->tensors[i], *y = &b->tensors[i];
        cr_assert_eq(x->name, y->name, "tensor %d", i);
        cr_assert_eq(x->dtype, y->dtype, "tensor %d", i);
        cr_assert_eq(x->role, y->role, "tensor %d", i);
        cr_assert_eq(x->place, y->place, "tensor %d", i);
        cr_assert_eq(x->init, y->init, "tensor %d", i);
        cr_assert_eq(x->rank, y->rank, "tensor %d", i);
        for (int d = 0; d < x->rank; d++) cr_assert_eq(x->shape[d], y->shape[d], "tensor %d dim %d", i, d);
        cr_assert_eq(x->block, y->block, "tensor %d", i);
        cr_assert_eq(x->producer, y->producer, "tensor %d", i);
        cr_assert_eq(x->tied_to, y->tied_to, "tensor %d", i);
        assert_same_double(x->init_a, y->init_a, "init_a");
        assert_same_double(x->init_b, y->init_b, "init_b");
        cr_assert_eq(x->grad, y->grad, "tensor %d", i);
        cr_assert_eq(x->offset, y->offset, "tensor %d", i);
        cr_assert_eq(x->live_start, y->live_start, "tensor %d", i);
        cr_assert_eq(x->live_end, y->live_end, "tensor %d", i);
        cr_assert_eq(x->alias, y->alias, "tensor %d", i);
        cr_assert_eq(x->logical_rows, y->logical_rows, "tensor %d", i);
    }
    cr_assert_eq(a->n_ops, b->n_ops);
    for (int i = 0; i < a->n_ops; i++) {
        const PlanOp *x = &a->ops[i], *y = &b->ops[i];
        cr_assert_eq(x->op, y->op, "op %d", i);
        cr_assert_eq(x->block, y->block, "op %d", i);
        cr_assert_eq(x->phase, y->phase, "op %d", i);
        cr_assert_eq(x->line, y->line, "op %d", i);
        cr_assert_eq(x->col, y->col, "op %d", i);
        cr_assert_eq(x->in, y->in, "op %d", i);
        cr_assert_eq(x->n_in, y->n_in, "op %d", i);
        cr_assert_eq(x->out, y->out, "op %d", i);
        cr_assert_eq(x->n_out, y->n_out, "op %d", i);
        cr_assert_eq(x->attr, y->attr, "op %d", i);
        cr_assert_eq(x->n_attr, y->n_attr, "op %d", i);
        cr_assert_eq(x->stream, y->stream, "op %d", i);
        cr_assert(x->wait == y->wait && x->n_wait == y->n_wait, "op %d", i);
        cr_assert_eq(x->microbatch, y->microbatch, "op %d", i);
        assert_same_double(x->flops, y->flops, "flops");
    }
    cr_assert_eq(a->n_waits, b->n_waits);
    for (int i = 0; i < a->n_waits; i++) cr_assert_eq(a->waits[i], b->waits[i]);
    cr_assert_eq(a->n_programs, b->n_programs);
    for (int i = 0; i < a->n_programs; i++) {
        const PlanProgram *x = &a->programs[i], *y = &b->programs[i];
        cr_assert(x->stage == y->stage && x->dp_world == y->dp_world, "program %d", i);
        cr_assert(x->first_op == y->first_op && x->n_ops == y->n_ops, "program %d", i);
        for (int s = 0; s < PLAN_PLACE_COUNT; s++) cr_assert_eq(x->space_bytes[s], y->space_bytes[s], "program %d", i);
        cr_assert(x->first_tensor == y->first_tensor && x->n_tensors == y->n_tensors, "program %d", i);
        cr_assert(x->first_output == y->first_output && x->n_outputs == y->n_outputs, "program %d", i);
        cr_assert(x->module_at == y->module_at && x->module_len == y->module_len, "program %d", i);
    }
    cr_assert_str_eq(a->cuda_module ? a->cuda_module : "", b->cuda_module ? b->cuda_module : "");
    cr_assert_eq(a->n_ids, b->n_ids);
    for (int i = 0; i < a->n_ids; i++) cr_assert_eq(a->ids[i], b->ids[i]);
    cr_assert_eq(a->n_attrs, b->n_attrs);
    for (int i = 0; i < a->n_attrs; i++) {
        const PlanAttr *x = &a->attrs[i], *y = &b->attrs[i];
        cr_assert_eq(x->key, y->key);
        cr_assert_eq(x->kind, y->kind);
        if (x->kind == PLAN_ATTR_INT) cr_assert_eq(x->i, y->i);
        if (x->kind == PLAN_ATTR_FLOAT) assert_same_double(x->f, y->f, "attr");
        if (x->kind == PLAN_ATTR_INTS) cr_assert(x->list == y->list && x->n_list == y->n_list);
    }
    cr_assert_eq(a->n_ints, b->n_ints);
    for (int i = 0; i < a->n_ints; i++) cr_assert_eq(a->ints[i], b->ints[i]);
    cr_assert_eq(a->n_outputs, b->n_outputs);
    for (int i = 0; i < a->n_outputs; i++) cr_assert_eq(a->outputs[i], b->outputs[i]);
    cr_assert_eq(a->n_cuda, b->n_cuda);
    for (int i = 0; i < a->n_cuda; i++) {
        const PlanCuda *x = &a->cuda[i], *y = &b->cuda[i];
        cr_assert(x->op == y->op && x->kind == y->kind && x->kernel == y->kernel && x->args == y->args &&
                  x->n_args == y->n_args && x->smem == y->smem && x->ta == y->ta && x->tb == y->tb, "cuda %d", i);
        for (int d = 0; d < 3; d++) cr_assert(x->grid[d] == y->grid[d] && x->block[d] == y->block[d], "cuda %d", i);
        const int64_t xs[] = {x->m, x->n, x->k, x->lda, x->ldb, x->ldc, x->stride_a, x->stride_b, x->stride_c,
                              x->batch, x->a_off, x->b_off, x->c_off};
        const int64_t ys[] = {y->m, y->n, y->k, y->lda, y->ldb, y->ldc, y->stride_a, y->stride_b, y->stride_c,
                              y->batch, y->a_off, y->b_off, y->c_off};
        for (int k = 0; k < 13; k++) cr_assert_eq(xs[k], ys[k], "cuda %d field %d", i, k);
    }
}

/* ---- the round trip ------------------------------------------------------------------ */

Test(plan, codegen_keeps_the_graph)
{
    cr_assert_eq(plan->n_tensors, g->n_values);
    cr_assert_eq(plan->n_ops, g->n_nodes);
    cr_assert_eq(plan->n_blocks, 1);
    for (int i = 0; i < g->n_nodes; i++) {
        const Node *n = ir_node(g, i);
        cr_assert_str_eq(plan_str(plan, plan->ops[i].op), op_name(n->op));
        cr_assert_eq(plan->ops[i].n_in, n->n_in);
        for (int k = 0; k < n->n_in; k++) cr_assert_eq(plan->ids[plan->ops[i].in + k], ir_in(g, n, k));
        for (int k = 0; k < n->n_out; k++) cr_assert_eq(plan->ids[plan->ops[i].out + k], ir_out(g, n, k));
    }
    for (int i = 0; i < g->n_values; i++) {
        const Value *v = ir_value(g, i);
        const PlanTensor *t = &plan->tensors[i];
        cr_assert_str_eq(plan_dtype_name(t->dtype), dtype_name(v->dtype));
        cr_assert_str_eq(plan_role_name(t->role), role_name(v->role));
        cr_assert_str_eq(plan_place_name(t->place), placement_name(v->place));
        cr_assert_str_eq(plan_init_name(t->init), init_name(v->init));
        cr_assert_str_eq(plan_str(plan, t->name), v->name ? v->name : "");
        cr_assert_eq(plan_tensor_nbytes(t), ir_nbytes(v));
        cr_assert(t->offset == v->offset && t->live_start == v->live_start && t->live_end == v->live_end);
        cr_assert(t->alias == v->alias && t->grad == v->grad && t->tied_to == v->tied_to);
    }
    cr_assert_eq(plan->n_programs, 1);
    cr_assert_eq(plan_space_bytes(plan, PLAN_PLACE_DEVICE), g->space_bytes[PLACE_DEVICE]);
    cr_assert_eq(plan_space_bytes(plan, PLAN_PLACE_HOST), 0);
    cr_assert_eq(plan->programs[0].dp_world, 8);
    cr_assert_eq(plan->programs[0].n_ops, plan->n_ops);
    /* Without a memory plan, no program: fsexec must not take 0 for an arena size. */
    g->planned = 0;
    Plan *q = codegen_plan(g, &cfg, err, sizeof err);
    cr_assert_eq(q->n_programs, 0);
    cr_assert_eq(plan_space_bytes(q, PLAN_PLACE_DEVICE), -1);
    plan_free(q);
    cr_assert_str_eq(plan_meta_str(plan, "model", ""), "tiny");
    cr_assert_str_eq(plan_meta_str(plan, "compiler", ""), "fsc " FS_VERSION);
    cr_assert_str_eq(plan_meta_str(plan, "shard", ""), "fsdp");
    cr_assert_str_eq(plan_meta_str(plan, "precision", ""), "bf16");
    cr_assert_str_eq(plan_meta_str(plan, "recompute", ""), "Block");
    cr_assert_eq(plan_meta_int(plan, "world", 0), 8);
    cr_assert_eq(plan_meta_int(plan, "stages", 0), 2);
    cr_assert_eq(plan_meta_int(plan, "seed", 0), 42);
    cr_assert_eq(plan_meta_int(plan, "params", 0), ir_param_count(g));
    cr_assert_float_eq(plan_meta_float(plan, "lr", 0), 6e-4, 1e-12);
    /* Every key config_set accepts is in the plan. */
    int n;
    const ConfigKey *keys = config_keys(&n);
    for (int i = 0; i < n; i++) cr_assert_not_null(plan_meta_find(plan, keys[i].key), "%s", keys[i].key);
    cr_assert_str_eq(RT_VERSION, FS_VERSION);
}

Test(plan, round_trip)
{
    Plan *back = plan_read_mem(bytes, n_bytes, err, sizeof err);
    cr_assert_not_null(back, "%s", err);
    cr_assert_eq(back->major, PLAN_MAJOR);
    cr_assert_eq(back->minor, PLAN_MINOR);
    assert_plans_equal(plan, back);
    cr_assert_eq(back->n_sections, 13);
    cr_assert_geq(back->n_cuda, 2);
    cr_assert_str_eq(plan_str(back, back->cuda[back->n_cuda - 2].kernel), "fs_test_0123abcd");
    /* Written again, the same bytes. */
    void *again;
    size_t n;
    cr_assert_eq(plan_write_mem(back, &again, &n, err, sizeof err), 0, "%s", err);
    cr_assert_eq(n, n_bytes);
    cr_assert(!memcmp(again, bytes, n));
    plan_dealloc(again);
    plan_free(back);
}

static uint32_t le32(const uint8_t *p) { return p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t le64(const uint8_t *p) { return le32(p) | (uint64_t)le32(p + 4) << 32; }
static void set32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> 8 * i);
}
static void set64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> 8 * i);
}

Test(plan, layout_is_little_endian_with_checksums)
{
    cr_assert(!memcmp(bytes, "\x89" "FSP\r\n\x1a\n", 8));
    cr_assert(bytes[8] == 2 && bytes[9] == 0 && bytes[10] == 2 && bytes[11] == 0, "version 2.2");
    cr_assert_eq(le32(bytes + 12), 13);
    cr_assert_eq(le64(bytes + 16), n_bytes);
    cr_assert_eq(plan_crc32(0, "123456789", 9), 0xCBF43926u);  // the standard check value
    for (uint32_t i = 0; i < 13; i++) {
        const uint8_t *e = bytes + 32 + 24 * i;
        cr_assert_eq(plan_crc32(0, bytes + le64(e + 8), le64(e + 16)), le32(e + 4));
    }
    cr_assert(!memcmp(bytes + 32 + 24 * 4, "NODE", 4));
    /* The CUDA section, before CUMD: count, record size, then 160-byte records; the GEMM last. */
    const uint8_t *e = bytes + 32 + 24 * 11, *cu = bytes + le64(e + 8);
    cr_assert(!memcmp(bytes + 32 + 24 * 10, "PROG", 4) && !memcmp(bytes + 32 + 24 * 12, "CUMD", 4));
    cr_assert(!memcmp(e, "CUDA", 4));
    uint32_t n = le32(cu);
    cr_assert_eq(le32(cu + 4), 160);
    cr_assert_eq(le64(e + 16), 8 + 160 * (uint64_t)n);
    const uint8_t *gm = cu + 8 + 160 * (size_t)(n - 1), *ln = gm - 160;
    cr_assert_eq(le32(ln), (uint32_t)plan->n_ops - 1);
    cr_assert(ln[4] == 0 && gm[4] == 1, "kinds LAUNCH 0, GEMM 1");
    cr_assert(le32(ln + 16) == 2 && le32(ln + 20) == 7 && le32(ln + 32) == 256 && le32(ln + 44) == 128);
    cr_assert(le32(gm + 8) == 0xffffffffu && le32(gm + 16) == 3);
    cr_assert(le64(gm + 56) == 8 && le64(gm + 64) == 24 && le64(gm + 72) == 8 && le64(gm + 96) == 24);
    cr_assert(le64(gm + 104) == 64 && le64(gm + 120) == 192 && le64(gm + 128) == 1);
    /* Version 2.1: NODE records of 64 bytes, the micro-batch at 52 and the FLOPs at 56. */
    cr_assert_eq(PLAN_MINOR, 2, "this test describes version 2.2");
    /* 2.2: TENS records of 144 bytes, the logical rows at 136. */
    const uint8_t *ts = bytes + le64(bytes + 32 + 24 * 3 + 8);
    cr_assert(!memcmp(bytes + 32 + 24 * 3, "TENS", 4) && le32(ts + 4) == 144);
    cr_assert_eq(le64(ts + 8 + 144 * (size_t)(padded - 1) + 136), (uint64_t)plan->tensors[padded - 1].logical_rows);
    const uint8_t *nd = bytes + le64(bytes + 32 + 24 * 4 + 8);
    cr_assert(le32(nd) == (uint32_t)plan->n_ops && le32(nd + 4) == 64);
    const uint8_t *op2 = nd + 8 + 64 * 2;
    double f;
    uint64_t bits = le64(op2 + 56);
    memcpy(&f, &bits, sizeof f);
    cr_assert(le32(op2 + 52) == 1 && f == 2e9 + 0.25, "op 2: micro-batch 1, 2e9 + 0.25 FLOPs");
    cr_assert_eq(le32(nd + 8 + 52), 0xffffffffu, "op 0: no micro-batch, stored as -1");
    /* PROG records of 64 bytes: ..., space_bytes, then the tensor, output and module ranges. */
    const uint8_t *pg = bytes + le64(bytes + 32 + 24 * 10 + 8), *r0 = pg + 8;
    cr_assert(le32(pg) == 1 && le32(pg + 4) == 64);
    cr_assert(le32(r0 + 32) == 0 && le32(r0 + 36) == (uint32_t)plan->n_tensors);
    cr_assert(le32(r0 + 40) == 0 && le32(r0 + 44) == (uint32_t)plan->n_outputs);
    cr_assert(le64(r0 + 48) == 0 && le64(r0 + 56) == strlen(plan->cuda_module) && le64(r0 + 56) > 0);
}

/* ---- damage ------------------------------------------------------------------------- */

static Plan *read_copy(const uint8_t *b, size_t n)
{
    uint8_t *copy = malloc(n ? n : 1);  // exactly n bytes, so ASan sees any overread
    memcpy(copy, b, n);
    Plan *p = plan_read_mem(copy, n, err, sizeof err);
    free(copy);
    return p;
}

Test(plan, truncated_at_every_byte)
{
    for (size_t n = 0; n < n_bytes; n++) {
        err[0] = 0;
        Plan *p = read_copy(bytes, n);
        cr_assert_null(p, "truncated to %zu bytes, yet read", n);
        cr_assert(!strncmp(err, "truncated: ", 11), "at %zu: %s", n, err);
    }
    read_copy(bytes, 0);
    cr_assert_str_eq(err, "truncated: the file is empty");
}

Test(plan, trailing_bytes)
{
    uint8_t *b = malloc(n_bytes + 3);
    memcpy(b, bytes, n_bytes);
    memcpy(b + n_bytes, "xyz", 3);
    cr_assert_null(plan_read_mem(b, n_bytes + 3, err, sizeof err));
    cr_assert(strstr(err, "trailing bytes"), "%s", err);
    free(b);
}

static size_t table_end(void) { return 32 + 24 * (size_t)le32(bytes + 12); }

Test(plan, every_header_bit_flip_fails)
{
    uint8_t *b = malloc(n_bytes);
    for (size_t i = 0; i < table_end(); i++)
        for (int bit = 0; bit < 8; bit++) {
            memcpy(b, bytes, n_bytes);
            b[i] ^= (uint8_t)(1 << bit);
            err[0] = 0;
            cr_assert_null(plan_read_mem(b, n_bytes, err, sizeof err), "flip at %zu bit %d read", i, bit);
            cr_assert(err[0], "no message for flip at %zu", i);
        }
    free(b);
}

Test(plan, every_section_bit_flip_fails_its_checksum)
{
    uint8_t *b = malloc(n_bytes);
    char want[64];
    for (uint32_t s = 0; s < le32(bytes + 12); s++) {
        const uint8_t *e = bytes + 32 + 24 * s;
        snprintf(want, sizeof want, "section %.4s: checksum mismatch (file damaged)", (const char *)e);
        for (size_t i = le64(e + 8); i < le64(e + 8) + le64(e + 16); i++)
            for (int bit = 0; bit < 8; bit++) {
                memcpy(b, bytes, n_bytes);
                b[i] ^= (uint8_t)(1 << bit);
                cr_assert_null(plan_read_mem(b, n_bytes, err, sizeof err), "flip at %zu read", i);
                cr_assert_str_eq(err, want, "flip at %zu bit %d", i, bit);
            }
    }
    cr_assert_eq(table_end() + 0, le64(bytes + 32 + 8), "the first section follows the table");
    free(b);
}

static void expect_magic_error(const void *b, size_t n, const char *part)
{
    cr_assert_null(plan_read_mem(b, n, err, sizeof err));
    cr_assert(!strncmp(err, "not an fsc plan (bad magic)", 27), "%s", err);
    if (part) cr_assert(strstr(err, part), "'%s' lacks '%s'", err, part);
}

/* What a text-mode copy does: every "\n" becomes "\r\n" (to_crlf) or the reverse. */
static uint8_t *convert(int to_crlf, size_t *n)
{
    uint8_t *out = malloc(2 * n_bytes);
    size_t k = 0;
    for (size_t i = 0; i < n_bytes; i++) {
        if (!to_crlf && bytes[i] == '\r' && i + 1 < n_bytes && bytes[i + 1] == '\n') continue;
        if (to_crlf && bytes[i] == '\n') out[k++] = '\r';
        out[k++] = bytes[i];
    }
    *n = k;
    return out;
}

Test(plan, wrong_magic)
{
    const char *src = "model gpt2 {\n  dim B = 4;\n}\n";
    expect_magic_error(src, strlen(src), "looks like a text file");
    expect_magic_error("\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0", 33, NULL);
    expect_magic_error("\x7f" "ELF", 4, NULL);

    size_t n;
    uint8_t *b = convert(0, &n);
    expect_magic_error(b, n, "CRLF to LF");
    free(b);
    b = convert(1, &n);
    expect_magic_error(b, n, "LF to CRLF");
    free(b);
    b = malloc(n_bytes);
    for (size_t i = 0; i < n_bytes; i++) b[i] = bytes[i] & 0x7f;
    expect_magic_error(b, n_bytes, "7-bit");
    free(b);
}

/* ---- other versions and sections: files reassembled with valid checksums ------------ */

typedef struct {
    char tag[4];
    uint8_t *data;
    size_t len;
} Sec;

static int split_sections(Sec *s)
{
    int n = (int)le32(bytes + 12);
    for (int i = 0; i < n; i++) {
        const uint8_t *e = bytes + 32 + 24 * i;
        memcpy(s[i].tag, e, 4);
        s[i].len = le64(e + 16);
        s[i].data = malloc(s[i].len + 1);
        memcpy(s[i].data, bytes + le64(e + 8), s[i].len);
    }
    return n;
}

static void free_sections(Sec *s, int n)
{
    for (int i = 0; i < n; i++) free(s[i].data);
}

/* A well-formed file (every checksum right) around these sections. */
static uint8_t *assemble(const Sec *s, int n, uint16_t major, uint16_t minor, size_t *len)
{
    size_t total = 32 + 24 * (size_t)n;
    for (int i = 0; i < n; i++) total += s[i].len;
    uint8_t *b = calloc(1, total);
    memcpy(b, "\x89" "FSP\r\n\x1a\n", 8);
    b[8] = (uint8_t)major, b[9] = (uint8_t)(major >> 8), b[10] = (uint8_t)minor, b[11] = (uint8_t)(minor >> 8);
    set32(b + 12, (uint32_t)n);
    set64(b + 16, total);
    size_t at = 32 + 24 * (size_t)n;
    for (int i = 0; i < n; i++) {
        uint8_t *e = b + 32 + 24 * i;
        memcpy(e, s[i].tag, 4);
        set32(e + 4, plan_crc32(0, s[i].data, s[i].len));
        set64(e + 8, at);
        set64(e + 16, s[i].len);
        memcpy(b + at, s[i].data, s[i].len);
        at += s[i].len;
    }
    set32(b + 24, plan_crc32(0, b, 32 + 24 * (size_t)n));
    *len = total;
    return b;
}

static Plan *read_sections(const Sec *s, int n, uint16_t major, uint16_t minor)
{
    size_t len;
    uint8_t *b = assemble(s, n, major, minor, &len);
    Plan *p = read_copy(b, len);
    free(b);
    return p;
}

static int find(const Sec *s, int n, const char *tag)
{
    for (int i = 0; i < n; i++)
        if (!memcmp(s[i].tag, tag, 4)) return i;
    cr_assert_fail("no section %s", tag);
    return -1;
}

Test(plan, reassembled_file_reads)
{
    Sec s[16];
    int n = split_sections(s);
    size_t len;
    uint8_t *b = assemble(s, n, 2, 2, &len);
    cr_assert_eq(len, n_bytes);
    cr_assert(!memcmp(b, bytes, len), "the test's assembler agrees with plan_write_mem");
    free(b);
    free_sections(s, n);
}

Test(plan, newer_major_refused)
{
    Sec s[16];
    int n = split_sections(s);
    cr_assert_null(read_sections(s, n, 3, 0));
    cr_assert_str_eq(err, "plan version 3.0 is newer than this fsexec supports (2.x); rebuild fsexec or "
                          "recompile the plan");
    /* Before the header checksum: a newer major may lay its header out differently. */
    uint8_t *b = malloc(n_bytes);
    memcpy(b, bytes, n_bytes);
    b[8] = 4;
    cr_assert_null(plan_read_mem(b, n_bytes, err, sizeof err));
    cr_assert(strstr(err, "plan version 4.2 is newer"), "%s", err);
    cr_assert_null(read_sections(s, n, 0, 9));
    cr_assert(strstr(err, "plan version 0.9 is older"), "%s", err);
    free(b);
    free_sections(s, n);
}

Test(plan, newer_minor_read)
{
    Sec s[16];
    int n = split_sections(s);
    Plan *p = read_sections(s, n, 2, 7);
    cr_assert_not_null(p, "%s", err);
    cr_assert_eq(p->minor, 7);
    assert_plans_equal(plan, p);
    plan_free(p);
    free_sections(s, n);
}

Test(plan, unknown_section_skipped)
{
    Sec s[16];
    int n = split_sections(s);
    /* An unknown section in the middle, and one at the end. */
    memmove(&s[3], &s[2], sizeof *s * (size_t)(n - 2));
    s[2] = (Sec){"XTRA", (uint8_t *)strdup("whatever a newer fsc writes"), 27};
    s[n + 1] = (Sec){"zz\x01\xff", (uint8_t *)strdup(""), 0};
    Plan *p = read_sections(s, n + 2, 2, 3);
    cr_assert_not_null(p, "%s", err);
    assert_plans_equal(plan, p);
    cr_assert_eq(p->n_sections, n + 2);
    cr_assert_str_eq(p->sections[2].tag, "XTRA");
    cr_assert_str_eq(p->sections[n + 1].tag, "zz??");
    plan_free(p);
    free_sections(s, n + 2);
}

Test(plan, missing_and_duplicate_sections)
{
    Sec s[16];
    int n = split_sections(s);
    int node_at = find(s, n, "NODE");
    Sec node = s[node_at];
    memcpy(s[node_at].tag, "NOPE", 4);
    cr_assert_null(read_sections(s, n, 2, 1));
    cr_assert_str_eq(err, "missing section NODE (not a complete plan)");
    s[node_at] = node;
    s[n] = (Sec){"NODE", node.data, node.len};
    cr_assert_null(read_sections(s, n + 1, 2, 1));
    cr_assert_str_eq(err, "section NODE appears twice");
    free_sections(s, n);
}

/* A newer minor version appends fields to records: a reader skips what it does not know. */
Test(plan, longer_records_read)
{
    Sec s[16];
    int n = split_sections(s);
    const char *tags[] = {"META", "BLKS", "TENS", "NODE", "ATTR", "CUDA", "PROG"};
    for (int t = 0; t < 7; t++) {
        Sec *x = &s[find(s, n, tags[t])];
        uint32_t count = le32(x->data), rec = le32(x->data + 4), extra = 12;
        size_t len = 8 + (size_t)count * (rec + extra);
        uint8_t *d = malloc(len);
        memcpy(d, x->data, 8);
        set32(d + 4, rec + extra);
        for (uint32_t i = 0; i < count; i++) {
            memcpy(d + 8 + i * (rec + extra), x->data + 8 + i * rec, rec);
            memset(d + 8 + i * (rec + extra) + rec, 0xab, extra);
        }
        free(x->data);
        x->data = d, x->len = len;
    }
    Plan *p = read_sections(s, n, 2, 2);
    cr_assert_not_null(p, "%s", err);
    assert_plans_equal(plan, p);
    plan_free(p);
    free_sections(s, n);
}

/* CUDA and CUMD are optional: without them a plan reads as one without a CUDA program. */
Test(plan, without_cuda_sections_reads)
{
    Sec s[16];
    int n = split_sections(s);
    for (int k = 0; k < 2; k++) {
        int at = find(s, n, k ? "CUMD" : "CUDA");
        free(s[at].data);
        memmove(&s[at], &s[at + 1], sizeof *s * (size_t)(n - at - 1));
        n--;
    }
    set64(s[find(s, n, "PROG")].data + 8 + 56, 0);  // no module: the program's is empty
    Plan *p = read_sections(s, n, 2, 1);
    cr_assert_not_null(p, "%s", err);
    cr_assert_eq(p->n_cuda, 0);
    cr_assert_null(p->cuda);
    cr_assert_null(p->cuda_module);
    cr_assert_eq(p->n_tensors, plan->n_tensors);
    cr_assert_eq(p->n_ops, plan->n_ops);
    cr_assert_eq(p->n_programs, 1);
    plan_free(p);
    free_sections(s, n);
}

/* A 1.x plan (one op list, one arena, no schedule) is refused, saying to recompile it. */
Test(plan, version_1_refused_with_recompile)
{
    Sec s[16];
    int n = split_sections(s);
    cr_assert_null(read_sections(s, n, 1, 1));
    cr_assert(strstr(err, "plan version 1.1 is older than this fsexec supports (2.x)"), "%s", err);
    cr_assert(strstr(err, "recompile the plan with this fsc"), "%s", err);
    free_sections(s, n);
}

/* Cuts a section's records to their first `to` bytes: what version 2.0 wrote, since 2.1
 * only appended fields to NODE (52 bytes in 2.0) and PROG (32). */
static void cut_records(Sec *x, uint32_t to)
{
    uint32_t count = le32(x->data), rec = le32(x->data + 4);
    cr_assert_geq(rec, to);
    uint8_t *d = malloc(8 + (size_t)count * to + 1);
    memcpy(d, x->data, 8);
    set32(d + 4, to);
    for (uint32_t i = 0; i < count; i++) memcpy(d + 8 + (size_t)i * to, x->data + 8 + (size_t)i * rec, to);
    free(x->data);
    x->data = d, x->len = 8 + (size_t)count * to;
}

/* A 2.1 file (TENS records of 136 bytes) reads with no tensor padded; a 2.2 one with
 * 2.1's records is refused, as any record shorter than its version's. */
Test(plan, version_2_1_reads_without_logical_rows)
{
    Sec s[16];
    int n = split_sections(s);
    cut_records(&s[find(s, n, "TENS")], 136);
    Plan *p = read_sections(s, n, 2, 1);
    cr_assert_not_null(p, "%s", err);
    cr_assert_eq(p->tensors[padded - 1].logical_rows, 0);
    plan->tensors[padded - 1].logical_rows = 0;
    assert_plans_equal(plan, p);
    plan_free(p);
    cr_assert_null(read_sections(s, n, 2, 2));
    cr_assert_str_eq(err, "section TENS: records of 136 bytes, expected at least 144");
    free_sections(s, n);
}

Test(plan, logical_rows_past_the_stored_rows_refused)
{
    PlanTensor *t = &plan->tensors[padded - 1];
    t->logical_rows = t->shape[0] + 1;
    cr_assert_eq(plan_check(plan, err, sizeof err), -1);
    char want[128];
    snprintf(want, sizeof want, "tensor %d: logical rows %lld outside its %lld stored rows", padded - 1,
             (long long)t->logical_rows, (long long)t->shape[0]);
    cr_assert_str_eq(err, want);
    t->logical_rows = -1;
    cr_assert_eq(plan_check(plan, err, sizeof err), -1);
}

/* A 2.0 file reads with 2.1's fields at their defaults: no micro-batch, no FLOPs, and its
 * one program over every tensor, every output and the whole module. */
Test(plan, version_2_0_reads_with_defaults)
{
    Sec s[16];
    int n = split_sections(s);
    cut_records(&s[find(s, n, "NODE")], 52);
    cut_records(&s[find(s, n, "PROG")], 32);
    Plan *p = read_sections(s, n, 2, 0);
    cr_assert_not_null(p, "%s", err);
    cr_assert_eq(p->minor, 0);
    for (int32_t i = 0; i < plan->n_ops; i++) plan->ops[i].microbatch = PLAN_NONE, plan->ops[i].flops = 0;
    assert_plans_equal(plan, p);  // the programs too: the codegen plan's one covers everything
    cr_assert(p->programs[0].n_tensors == p->n_tensors && p->programs[0].n_outputs == p->n_outputs);
    cr_assert_eq(p->programs[0].module_len, (int64_t)strlen(p->cuda_module));
    plan_free(p);

    /* The version decides the layout, not the record size: 2.0 with 2.1's records skips
     * what 2.0 did not have; 2.1 with 2.0's records is refused. */
    Sec w[16];
    int m = split_sections(w);
    p = read_sections(w, m, 2, 0);
    cr_assert_not_null(p, "%s", err);
    cr_assert(p->ops[2].microbatch == PLAN_NONE && p->ops[2].flops == 0);
    plan_free(p);
    cr_assert_null(read_sections(s, n, 2, 1));
    cr_assert_str_eq(err, "section NODE: records of 52 bytes, expected at least 64");
    free_sections(w, m);
    m = split_sections(w);
    cut_records(&w[find(w, m, "PROG")], 32);
    cr_assert_null(read_sections(w, m, 2, 1));
    cr_assert_str_eq(err, "section PROG: records of 32 bytes, expected at least 64");

    /* 2.0 had no pipelines: more than one program is refused; none (no memory plan) reads. */
    Sec *prog = &s[find(s, n, "PROG")];
    uint8_t *two = malloc(8 + 64);
    memcpy(two, prog->data, 8 + 32);
    memcpy(two + 8 + 32, prog->data + 8, 32);
    set32(two, 2);
    free(prog->data);
    prog->data = two, prog->len = 8 + 64;
    cr_assert_null(read_sections(s, n, 2, 0));
    cr_assert_str_eq(err, "section PROG: 2 programs in a version 2.0 plan, which has at most one (recompile the plan)");
    set32(two, 0);
    prog->len = 8;
    p = read_sections(s, n, 2, 0);
    cr_assert_not_null(p, "%s", err);
    cr_assert_eq(p->n_programs, 0);
    plan_free(p);
    free_sections(w, m);
    free_sections(s, n);
}

/* Files whose checksums are right but whose contents are not: each must be refused with
 * a message, without reading out of bounds or allocating what the file cannot hold. */
static void expect_hostile(const char *tag, size_t at, uint64_t value, int width, const char *part)
{
    Sec s[16];
    int n = split_sections(s);
    Sec *x = &s[find(s, n, tag)];
    cr_assert_leq(at + (size_t)width, x->len);
    if (width == 1) x->data[at] = (uint8_t)value;
    if (width == 4) set32(x->data + at, (uint32_t)value);
    if (width == 8) set64(x->data + at, value);
    cr_assert_null(read_sections(s, n, 2, 1), "%s+%zu = %llu was read", tag, at, (unsigned long long)value);
    cr_assert(strstr(err, part), "%s+%zu: '%s' lacks '%s'", tag, at, err, part);
    free_sections(s, n);
}

Test(plan, hostile_contents_refused)
{
    /* counts that the bytes cannot hold */
    expect_hostile("STRS", 0, 0xffffffffu, 4, "section STRS");
    expect_hostile("STRS", 4, 0x7fffffffu, 4, "runs past");
    expect_hostile("TENS", 0, 0x10000000u, 4, "section TENS");
    expect_hostile("TENS", 4, 8, 4, "records of 8 bytes");
    expect_hostile("IDS ", 0, 0xfffffff0u, 4, "section IDS");
    expect_hostile("INTS", 0, 3, 4, "section INTS");
    /* ids out of range; TENS records start at 8, 88 bytes each */
    expect_hostile("TENS", 8 + 0, 999999, 4, "tensor 0: name");
    expect_hostile("TENS", 8 + 4, 9, 1, "tensor 0: unknown dtype");
    expect_hostile("TENS", 8 + 5, 200, 1, "tensor 0: unknown role");
    expect_hostile("TENS", 8 + 8, 7, 1, "tensor 0: rank 7");
    expect_hostile("TENS", 8 + 12, 5, 4, "tensor 0: block 5");
    expect_hostile("TENS", 8 + 16, 12345, 4, "tensor 0: producer");
    expect_hostile("TENS", 8 + 20, 0x80000000u, 4, "tensor 0: tied");
    expect_hostile("TENS", 8 + 40, (uint64_t)-5, 8, "negative dim");
    expect_hostile("TENS", 8 + 40, (uint64_t)1 << 62, 8, "shape too large");
    expect_hostile("TENS", 8 + 88, 5000, 4, "tensor 0: grad 5000");
    expect_hostile("TENS", 8 + 100, (uint64_t)-2, 4, "tensor 0: alias -2");
    /* NODE records: op, block, phase, line, col, in, n_in, out, n_out, attr, n_attr */
    expect_hostile("NODE", 8 + 0, (uint64_t)-1, 4, "op 0: name");
    expect_hostile("NODE", 8 + 8, 77, 1, "unknown phase");
    expect_hostile("NODE", 8 + 20, 0x7ffffff0u, 4, "inputs or outputs out of range");
    expect_hostile("NODE", 8 + 24, 0x7fffffffu, 4, "inputs or outputs out of range");
    expect_hostile("NODE", 8 + 24, (uint64_t)-3, 4, "inputs or outputs out of range");
    expect_hostile("NODE", 8 + 40, 1000, 4, "attributes out of range");
    expect_hostile("IDS ", 4, 4000, 4, "id 0: tensor 4000");
    expect_hostile("OUTS", 4, (uint64_t)-1, 4, "output 0");
    expect_hostile("META", 8 + 4, 9, 1, "unknown kind");
    expect_hostile("ATTR", 8 + 4, 3, 1, "attr 0: unknown kind");
    expect_hostile("BLKS", 8 + 4, 1u << 30, 4, "block 0");
    /* a string with a NUL in it */
    expect_hostile("STRS", 8, 0, 1, "NUL");
    /* version 2.0: streams, waits, step roles, programs */
    expect_hostile("NODE", 8 + 9, 7, 1, "unknown stream 7");
    expect_hostile("NODE", 8 + 44, 1000, 4, "waits out of range");
    expect_hostile("NODE", 8 + 48, (uint64_t)-1, 4, "waits out of range");
    expect_hostile("TENS", 8 + 133, 99, 1, "tensor 0: unknown step role 99");
    expect_hostile("PROG", 4, 8, 4, "records of 8 bytes, expected at least 64");
    expect_hostile("PROG", 8 + 4, 0, 4, "program 0: 0 data-parallel ranks (at least 1)");
    expect_hostile("PROG", 8 + 8, 1, 4, "program 0: ops start at 1, expected 0");
    expect_hostile("PROG", 8 + 12, 3, 4, "the programs hold 3 of the plan's 9 ops");
    expect_hostile("PROG", 8 + 12, 0x7fffffffu, 4, "program 0: 2147483647 ops from 0 do not fit in the plan's 9");
    expect_hostile("PROG", 8 + 16, (uint64_t)-64, 8, "negative device arena");
    /* version 2.1: a program's stage, and its tensor, output and module ranges */
    expect_hostile("PROG", 8 + 0, (uint64_t)-1, 4, "program 0: stage -1 (programs are in stage order");
    expect_hostile("PROG", 8 + 32, 1, 4, "program 0: tensors start at 1, expected 0");
    expect_hostile("PROG", 8 + 36, 3, 4, "the programs hold 3 of the plan's 20 tensors");
    expect_hostile("PROG", 8 + 36, (uint64_t)-1, 4, "program 0: -1 tensors from 0 do not fit in the plan's 20");
    expect_hostile("PROG", 8 + 44, 0, 4, "the programs hold 0 of the plan's 2 outputs");
    expect_hostile("PROG", 8 + 48, 1, 8, "program 0: module bytes start at 1, expected 0");
    expect_hostile("PROG", 8 + 56, 5, 8, "the programs hold 5 of the plan's");
    expect_hostile("PROG", 8 + 56, (uint64_t)1 << 40, 8, "program 0: 1099511627776 module bytes from 0 do not fit");
    expect_hostile("CUMD", 0, 5, 4, "does not fill");
}

/* Offsets of the two hand-made CUDA records (the LAUNCH, then the GEMM) in the section. */
static size_t cuda_record(int gemm)
{
    Sec s[16];
    int n = split_sections(s);
    uint32_t count = le32(s[find(s, n, "CUDA")].data);
    free_sections(s, n);
    return 8 + 160 * (size_t)(count - 2 + (uint32_t)gemm);
}

/* Every reader error of the CUDA section, and every check of its instructions. */
Test(plan, hostile_cuda_refused)
{
    size_t l = cuda_record(0), gm = cuda_record(1);
    expect_hostile("CUDA", 0, 0x10000000u, 4, "section CUDA");
    expect_hostile("CUDA", 4, 40, 4, "records of 40 bytes, expected at least 160");
    expect_hostile("CUDA", l + 0, 100000, 4, "op 100000 out of range");
    expect_hostile("CUDA", gm + 0, 0, 4, "op 0 after op");
    expect_hostile("CUDA", l + 4, 2, 1, "unknown kind 2");
    expect_hostile("CUDA", l + 8, 1u << 30, 4, "kernel name");
    expect_hostile("CUDA", l + 8, (uint64_t)-1, 4, "kernel name");
    expect_hostile("CUDA", l + 12, 1u << 30, 4, "args out of range");
    expect_hostile("CUDA", l + 16, (uint64_t)-1, 4, "args out of range");
    expect_hostile("CUDA", l + 20, 0, 4, "each must be positive");
    expect_hostile("CUDA", l + 32 + 4, (uint64_t)-3, 4, "each must be positive");
    expect_hostile("CUDA", l + 32, 2048, 4, "exceeds CUDA's limits");
    expect_hostile("CUDA", l + 32 + 8, 65, 4, "exceeds CUDA's limits");
    expect_hostile("CUDA", l + 20 + 4, 70000, 4, "exceeds CUDA's limits");
    expect_hostile("CUDA", l + 44, (uint64_t)-1, 4, "negative shared memory");
    expect_hostile("CUDA", gm + 16, 2, 4, "a GEMM takes 3 tensors");
    expect_hostile("CUDA", gm + 5, 9, 1, "GEMM epilogue 9 unknown");
    expect_hostile("CUDA", gm + 5, 1, 1, "a GEMM takes 4 tensors (A, B, C, bias), has 3");  // BIAS without its bias
    expect_hostile("CUDA", gm + 6, 2, 1, "GEMM beta 2 (0 or 1)");
    expect_hostile("CUDA", gm + 6, 1, 1, "a GEMM takes 4 tensors (A, B, C, R), has 3");  // beta 1 without its R
    expect_hostile("CUDA", gm + 48, 2, 4, "transpose flags");
    expect_hostile("CUDA", gm + 56, 0, 8, "GEMM dims must be in");
    expect_hostile("CUDA", gm + 72, (uint64_t)-8, 8, "GEMM dims must be in");
    expect_hostile("CUDA", gm + 128, (uint64_t)1 << 40, 8, "GEMM dims must be in");
    expect_hostile("CUDA", gm + 56, 9, 8, "GEMM reaches outside its tensors");      // m 9 > 8 rows of A
    expect_hostile("CUDA", gm + 88, 23, 8, "GEMM reaches outside its tensors");     // ldb < n
    expect_hostile("CUDA", gm + 128, 2, 8, "GEMM reaches outside its tensors");     // a second batch
    expect_hostile("CUDA", gm + 144, 1, 8, "GEMM reaches outside its tensors");     // b_off
    expect_hostile("CUDA", gm + 104, (uint64_t)-64, 8, "GEMM reaches outside its tensors");
}

/* Random damage under valid checksums: never a crash (ASan and UBSan watch the rest). */
Test(plan, random_hostile_files)
{
    Sec s[16];
    int n = split_sections(s);
    uint64_t x = 0x9e3779b97f4a7c15u;
    int read = 0;
    for (int iter = 0; iter < 4000; iter++) {
        Sec m[16];
        memcpy(m, s, sizeof *s * (size_t)n);
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        int k = (int)(x % (uint64_t)n);
        m[k].data = malloc(s[k].len + 1);
        memcpy(m[k].data, s[k].data, s[k].len);
        int flips = 1 + (int)(x >> 60 & 3);
        for (int f = 0; f < flips && m[k].len; f++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            size_t at = (size_t)(x % m[k].len);
            uint8_t v = (uint8_t)(x >> 32);
            m[k].data[at] = (x >> 40 & 1) ? v : (x >> 41 & 1) ? 0xff : 0;
        }
        Plan *p = read_sections(m, n, 2, 1);
        if (p) {
            FILE *f = fopen("/dev/null", "w");
            rt_inspect(p, f);
            fclose(f);
            plan_free(p);
            read++;
        }
        free(m[k].data);
    }
    cr_assert_lt(read, 4000, "some damage must be caught");
    cr_assert_gt(read, 0, "some damage must reach rt_inspect (a file of this version)");
    free_sections(s, n);
}

/* ---- allocation failure ------------------------------------------------------------- */

Test(plan, read_survives_every_allocation_failure)
{
    count_allocs(0);
    Plan *p = plan_read_mem(bytes, n_bytes, err, sizeof err);
    cr_assert_not_null(p, "%s", err);
    plan_free(p);
    long total = n_allocs;
    cr_assert_gt(total, 5);
    cr_assert_eq(live, 0);
    for (long k = 1; k <= total; k++) {
        count_allocs(k);
        err[0] = 0;
        cr_assert_null(plan_read_mem(bytes, n_bytes, err, sizeof err), "allocation %ld failed, yet read", k);
        cr_assert(strstr(err, "out of memory"), "allocation %ld: %s", k, err);
        cr_assert_eq(live, 0, "allocation %ld failed: %ld blocks leaked", k, live);
    }
    count_allocs(total + 1);
    p = plan_read_mem(bytes, n_bytes, err, sizeof err);
    cr_assert_not_null(p);
    plan_free(p);
}

Test(plan, codegen_and_write_survive_every_allocation_failure)
{
    count_allocs(0);
    Plan *p = codegen_plan(g, &cfg, err, sizeof err);
    cr_assert_not_null(p);
    plan_free(p);
    long total = n_allocs;
    cr_assert_eq(live, 0);
    for (long k = 1; k <= total; k++) {
        count_allocs(k);
        err[0] = 0;
        cr_assert_null(codegen_plan(g, &cfg, err, sizeof err), "allocation %ld failed, yet built", k);
        cr_assert(strstr(err, "out of memory"), "allocation %ld: %s", k, err);
        cr_assert_eq(live, 0, "allocation %ld failed: %ld blocks leaked", k, live);
    }
    void *buf;
    size_t len;
    count_allocs(1);
    cr_assert_eq(plan_write_mem(plan, &buf, &len, err, sizeof err), -1);
    cr_assert(strstr(err, "out of memory"), "%s", err);
    cr_assert_null(buf);
    cr_assert_eq(live, 0);
}

/* ---- the builder and the writer's own checks ---------------------------------------- */

Test(plan, interning_and_meta)
{
    Plan *p = plan_new();
    cr_assert_not_null(p);
    char name[32];
    for (int i = 0; i < 1000; i++) {
        snprintf(name, sizeof name, "s%d", i);
        cr_assert_eq(plan_intern(p, name), i);
    }
    cr_assert_eq(plan_intern(p, "s500"), 500);
    cr_assert_eq(plan_meta_set_int(p, "world", 4), 0);
    cr_assert_eq(plan_meta_set_int(p, "world", 8), 0);
    cr_assert_eq(p->n_meta, 1);
    cr_assert_eq(plan_meta_int(p, "world", 0), 8);
    cr_assert_str_eq(plan_meta_str(p, "nope", "def"), "def");
    plan_free(p);

    /* A plan that was read can be added to. */
    p = plan_read_mem(bytes, n_bytes, err, sizeof err);
    cr_assert_not_null(p, "%s", err);
    int32_t id = plan_intern(p, "wte");
    cr_assert_str_eq(p->strs[id], "wte");
    cr_assert_eq(plan_intern(p, "a new string"), p->n_strs - 1);
    cr_assert_eq(plan_meta_set_str(p, "note", "added"), 0);
    cr_assert_str_eq(plan_meta_str(p, "note", ""), "added");
    plan_free(p);
}

Test(plan, writer_refuses_invalid_plans)
{
    void *buf;
    size_t len;
    plan->ids[0] = plan->n_tensors;
    cr_assert_eq(plan_write_mem(plan, &buf, &len, err, sizeof err), -1);
    cr_assert(strstr(err, "cannot write an invalid plan: id 0"), "%s", err);
    plan->ids[0] = 0;
    plan->tensors[3].rank = PLAN_MAX_RANK + 1;
    cr_assert_eq(plan_write_mem(plan, &buf, &len, err, sizeof err), -1);
    cr_assert(strstr(err, "tensor 3: rank"), "%s", err);
}

/* ---- files ---------------------------------------------------------------------------- */

static char dir[64];

static int count_entries(void)
{
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

Test(plan, written_atomically_to_disk)
{
    strcpy(dir, "/tmp/test_plan.XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    char path[128];
    snprintf(path, sizeof path, "%s/tiny.plan", dir);

    cr_assert_eq(plan_write(plan, path, err, sizeof err), 0, "%s", err);
    cr_assert_eq(count_entries(), 1, "only the plan, no temporary file");
    Plan *p = plan_read(path, err, sizeof err);
    cr_assert_not_null(p, "%s", err);
    assert_plans_equal(plan, p);
    cr_assert_eq(p->n_sections, 13);
    struct stat st;
    cr_assert_eq(stat(path, &st), 0);
    cr_assert_eq((size_t)st.st_size, n_bytes);

    /* Over an existing file: replaced whole. */
    cr_assert_eq(plan_meta_set_str(plan, "model", "other"), 0);
    cr_assert_eq(plan_write(plan, path, err, sizeof err), 0, "%s", err);
    cr_assert_eq(count_entries(), 1);
    Plan *q = plan_read(path, err, sizeof err);
    cr_assert_not_null(q, "%s", err);
    cr_assert_str_eq(plan_meta_str(q, "model", ""), "other");
    plan_free(q);
    plan_free(p);

    /* Failures: a message, nothing left behind. */
    char bad[160];
    snprintf(bad, sizeof bad, "%s/no/such/dir/x.plan", dir);
    cr_assert_eq(plan_write(plan, bad, err, sizeof err), -1);
    cr_assert(strstr(err, "cannot create"), "%s", err);
    cr_assert_null(plan_read(bad, err, sizeof err));
    cr_assert(strstr(err, "cannot open: No such file"), "%s", err);
    cr_assert_null(plan_read(dir, err, sizeof err));
    cr_assert_str_eq(err, "is a directory; give a regular file");
    snprintf(bad, sizeof bad, "%s/sub", dir);
    cr_assert_eq(mkdir(bad, 0700), 0);
    cr_assert_eq(plan_write(plan, bad, err, sizeof err), -1, "rename over a directory fails");
    cr_assert_eq(count_entries(), 2, "the plan and sub/, no temporary file");
    rmdir(bad);
    unlink(path);
    rmdir(dir);
}

/* ---- inspect ---------------------------------------------------------------------------- */

static char *inspect(const Plan *p)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    rt_inspect(p, f);
    fclose(f);
    return buf;
}

Test(plan, inspect_reports_what_a_plan_holds)
{
    Plan *p = plan_read_mem(bytes, n_bytes, err, sizeof err);
    cr_assert_not_null(p, "%s", err);
    char *out = inspect(p);
    const char *want[] = {
        "plan format   2.2\n",
        "model         tiny\n",
        "compiler      fsc " FS_VERSION "\n",
        "ranks         8 (4 data-parallel x 2 pipeline stages)\n",
        "strategy      shard fsdp, precision bf16, recompute Block, offload none\n",
        "device arena  1.2 KiB (1,280 bytes) per rank\n",
        "host arena    0 B (0 bytes) per rank\n",
        "programs      1 (stage, data-parallel ranks, ops: 0/8/9)\n",
        "params        360 (1.4 KiB)\n",   // wte 128 + ln 16 + w 192 + b 24; lm_head is tied
        "\ntraining settings\n",
        "  lr                     0.0006\n",
        "  world                  8\n",
        "\ninputs\n",
        "  tokens       i32[2, 4]                      32 B\n",
        "  targets      i32[2, 4]                      32 B\n",
        "\noutputs\n",
        "  %17          f32[]                           4 B  (loss)\n",
        "\nblocks (1)\n",
        "  h.0     Block                   4             232\n",
        "\nops (9)\n",
        "  matmul                 2\n",
        "  layernorm              1\n",
        "  split                  1\n",
        "\nschedule\n",
        "  compute           9 ops\n",
        "\ntensors by role\n",
        "  param               6              1,440      1.4 KiB\n",
        "  total              20              5,924      5.8 KiB\n",
        "  (1 tied tensor: shares another's bytes, counted once)\n",
        "\nsections\n",
        "  tag          offset          bytes  crc32\n",
        "  STRS            344",
        "  NODE",
        "  OUTS",
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        cr_assert(strstr(out, want[i]), "missing '%s' in:\n%s", want[i], out);
    free(out);
    plan_free(p);

    out = inspect(plan);
    cr_assert(strstr(out, "not read from a file"), "%s", out);
    free(out);
    plan->n_programs = 0;  // as a plan without a memory plan reads
    out = inspect(plan);
    cr_assert(strstr(out, "arena         none (no memory plan)\n"), "%s", out);
    free(out);
}

/* The schedule's and the step roles' invariants, checked on the plan in memory. */
Test(plan, schedule_and_roles_checked)
{
    char why[256];
    Plan *p = plan_read_mem(bytes, n_bytes, err, sizeof err);
    cr_assert_not_null(p, "%s", err);
    cr_assert_geq(p->n_ops, 3);
    PlanOp *o = &p->ops[2];
    o->wait = plan_wait_add(p, 0), o->n_wait = 1;
    p->ops[0].stream = PLAN_STREAM_COMPUTE;
    cr_assert_eq(plan_check(p, why, sizeof why), -1);
    cr_assert(strstr(why, "op 2 (") && strstr(why, "waits for op 0, which is not an earlier op off the compute stream"),
              "%s", why);
    p->ops[0].stream = PLAN_STREAM_COLLECTIVE;
    cr_assert_eq(plan_check(p, why, sizeof why), 0, "%s", why);
    p->waits[o->wait] = 2;  // itself: not earlier
    cr_assert_eq(plan_check(p, why, sizeof why), -1);
    p->waits[o->wait] = 0;
    int32_t a = plan_role_tensor(p, PLAN_SR_LOSS), b = a == 0 ? 1 : 0;
    cr_assert_neq(a, PLAN_NONE, "the plan's loss has its role");
    p->tensors[b].step_role = PLAN_SR_LOSS;
    cr_assert_eq(plan_check(p, why, sizeof why), -1);
    cr_assert(strstr(why, "step role loss is tensor"), "%s", why);
    plan_free(p);
}

/* The forward-only programs (sections EVAL and SAMP): whole plans of one program inside
 * the plan, read back as written and written only when there; one damaged inside is
 * refused naming its section; one of several programs is not written. */
Test(plan, forward_programs_round_trip)
{
    Plan *one = plan_extract_program(plan, 0, err, sizeof err);
    cr_assert_not_null(one, "%s", err);
    one->eval = plan_extract_program(plan, 0, err, sizeof err);
    one->sample = plan_extract_program(plan, 0, err, sizeof err);
    cr_assert(one->eval && one->sample, "%s", err);
    void *buf;
    size_t n;
    cr_assert_eq(plan_write_mem(one, &buf, &n, err, sizeof err), 0, "%s", err);
    Plan *back = plan_read_mem(buf, n, err, sizeof err);
    cr_assert_not_null(back, "%s", err);
    assert_plans_equal(one, back);
    cr_assert(back->eval && back->sample);
    assert_plans_equal(one->eval, back->eval);
    assert_plans_equal(one->sample, back->sample);
    cr_assert_eq(back->n_sections, 15);
    cr_assert_str_eq(back->sections[13].tag, "EVAL");
    cr_assert_str_eq(back->sections[14].tag, "SAMP");
    /* A byte of the evaluation program's own header damaged, the outer checksums made to
     * match: its own reader refuses it. */
    uint8_t *b = buf, *entry = b + 32 + 24 * 13, *data = b + le64(entry + 8);
    data[24] ^= 1;
    set32(entry + 4, plan_crc32(0, data, (size_t)le64(entry + 16)));
    set32(b + 24, 0);
    set32(b + 24, plan_crc32(0, b, 32 + 24 * 15));
    cr_assert_null(read_copy(b, n));
    cr_assert_str_eq(err, "section EVAL (the evaluation program): header checksum mismatch (file damaged)");
    data[24] ^= 1;  // as written again
    set32(entry + 4, plan_crc32(0, data, (size_t)le64(entry + 16)));
    set32(b + 24, 0);
    set32(b + 24, plan_crc32(0, b, 32 + 24 * 15));
    /* A plan with programs of its own as another's EVAL: refused, so plans nest one deep. */
    Sec sec[16];
    int k = split_sections(sec);
    sec[k] = (Sec){"EVAL", buf, n};
    cr_assert_null(read_sections(sec, k + 1, 2, 1));
    cr_assert_str_eq(err, "section EVAL (the evaluation program): section EVAL in the plan of another section: "
                          "programs nest one deep");
    free_sections(sec, k + 1);  // buf too
    plan_free(back);
    /* A sub-plan of its own sub-plans is no program of this format. */
    one->eval->sample = plan_extract_program(plan, 0, err, sizeof err);
    cr_assert_neq(plan_write_mem(one, &buf, &n, err, sizeof err), 0);
    cr_assert(strstr(err, "the evaluation program must have no programs of its own"), "%s", err);
    plan_free(one);
}
