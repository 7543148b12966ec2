/* tests/unit/test_ir.c: the IR's text form (ir_print), its JSON (ir_print_json),
 * ir_verify on sound and corrupted graphs, and FLOP counts against their formulas. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ir.h"
#include "build.h"

static Graph *g;
static char err[256];

static int value(Role role, const char *name, DType dt, const int64_t *shape, int rank, int block, Loc loc)
{
    return build_value(g, role, name, dt, shape, rank, block, loc);
}

static int node(OpKind op, const int *in, int n_in, const Attr *attrs, int n_attr, int block, Phase phase, Loc loc)
{
    return build_node(g, op, in, n_in, attrs, n_attr, block, phase, loc);
}
static int out0(int n) { return ir_out(g, ir_node(g, n), 0); }

/* A small model: embedding, a block with a projection and a split, tied logits, the
 * loss, and one backward node whose output is a named grad. */
static void build(void)
{
    g = ir_graph_new("tiny");
    int h0 = ir_block_add(g, "h.0", "Block", 0);
    int tokens = value(ROLE_INPUT, "tokens", DT_I32, DIMS(2, 4), -1, (Loc){3, 3, 6});   // %0
    int targets = value(ROLE_INPUT, "targets", DT_I32, DIMS(2, 4), -1, (Loc){4, 3, 7}); // %1
    int wte = value(ROLE_PARAM, "wte", DT_F32, DIMS(16, 8), -1, (Loc){5, 3, 3});        // %2
    int w = value(ROLE_PARAM, "h.0.w", DT_F32, DIMS(8, 24), h0, (Loc){8, 5, 1});        // %3
    int b = value(ROLE_PARAM, "h.0.b", DT_F32, DIMS(24), h0, (Loc){9, 5, 1});           // %4
    g->values[wte].init = INIT_NORMAL, g->values[wte].init_a = 0.02;
    g->values[w].init = INIT_UNIFORM, g->values[w].init_a = -0.5, g->values[w].init_b = 0.5;
    g->values[b].init = INIT_ZEROS;

    int x = out0(node(OP_embedding, INS(wte, tokens), NULL, 0, -1, PHASE_FORWARD, (Loc){12, 7, 9}));   // n0 %5
    int y = out0(node(OP_matmul, INS(x, w), NULL, 0, h0, PHASE_FORWARD, (Loc){14, 9, 1}));              // n1 %6
    y = out0(node(OP_add, INS(y, b), NULL, 0, h0, PHASE_FORWARD, (Loc){14, 13, 1}));                    // n2 %7
    int s = node(OP_split, INS(y), ATTRS(AI("n", 3), AI("axis", -1)), h0, PHASE_FORWARD, (Loc){15, 7, 5}); // n3 %8 %9 %10
    int q = ir_out(g, ir_node(g, s), 0);
    int wt = out0(node(OP_transpose, INS(wte), ATTRS(AI("a", -2), AI("b", -1)), -1, PHASE_FORWARD, (Loc){17, 20, 9})); // n4 %11
    int logits = out0(node(OP_matmul, INS(q, wt), NULL, 0, -1, PHASE_FORWARD, (Loc){17, 18, 1}));       // n5 %12
    int loss = out0(node(OP_cross_entropy, INS(logits, targets), NULL, 0, -1, PHASE_FORWARD, (Loc){17, 10, 13})); // n6 %13
    int half = out0(node(OP_scalar, NULL, 0, ATTRS(AF("value", 0.5)), -1, PHASE_FORWARD, (Loc){0}));    // n7 %14
    int r = out0(node(OP_reshape, INS(logits), ATTRS(AL("shape", 8, -1)), -1, PHASE_BACKWARD, (Loc){0})); // n8 %15
    g->values[r].role = ROLE_GRAD;
    g->values[r].name = "logits.grad";
    ir_output_add(g, loss);
    ir_output_add(g, r);
    (void)half;
}

static void teardown(void) { ir_graph_free(g); }
TestSuite(ir, .init = build, .fini = teardown);

static char *capture(void (*fn)(FILE *))
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cr_assert_not_null(f);
    fn(f);
    fclose(f);
    return buf;
}
static void print_text(FILE *f) { ir_print(g, f); }
static void print_json(FILE *f) { cr_assert_eq(ir_print_json(g, f), 0); }
static void verify(FILE *f) { ir_verify(g, f); }

/* ---- ir_print -------------------------------------------------------------------- */

Test(ir, print_exact_text)
{
    const char *want =
        "model tiny\n"
        "\n"
        "block 0 h.0: Block 0\n"
        "\n"
        "input %0 tokens: i32[2, 4]  @3:3\n"
        "input %1 targets: i32[2, 4]  @4:3\n"
        "param %2 wte: f32[16, 8] = normal(0.02)  @5:3\n"
        "param %3 h.0.w: f32[8, 24] = uniform(-0.5, 0.5)  [block h.0] @8:5\n"
        "param %4 h.0.b: f32[24] = zeros  [block h.0] @9:5\n"
        "\n"
        "%5: f32[2, 4, 8] = embedding(%2:wte, %0:tokens)  @12:7\n"
        "%6: f32[2, 4, 24] = matmul(%5, %3:h.0.w)  [block h.0] @14:9\n"
        "%7: f32[2, 4, 24] = add(%6, %4:h.0.b)  [block h.0] @14:13\n"
        "%8, %9, %10: f32[2, 4, 8] = split(%7, n=3, axis=-1)  [block h.0] @15:7\n"
        "%11: f32[8, 16] = transpose(%2:wte, a=-2, b=-1)  @17:20\n"
        "%12: f32[2, 4, 16] = matmul(%8, %11)  @17:18\n"
        "%13: f32[], %14: f32[2, 4, 2] = cross_entropy(%12, %1:targets)  @17:10\n"
        "%15: f32[] = scalar(value=0.5)\n"
        "%16:logits.grad: grad f32[8, 16] = reshape(%12, shape=[8, -1])  [backward]\n"
        "\n"
        "outputs: loss=%13, logits.grad=%16\n";
    char *got = capture(print_text);
    cr_assert_str_eq(got, want);
    free(got);
}

Test(ir, print_is_deterministic)
{
    char *a = capture(print_text), *b = capture(print_text);
    cr_assert_str_eq(a, b);
    free(a);
    free(b);
}

Test(ir, print_host_tied_and_floats)
{
    int t = value(ROLE_PARAM, "lm_head.w", DT_F32, DIMS(16, 8), -1, (Loc){0});
    g->values[t].tied_to = 2;
    g->values[t].place = PLACE_HOST;
    int x = value(ROLE_INPUT, "x", DT_BF16, DIMS(4, 8), -1, (Loc){0});
    int w = value(ROLE_PARAM, "w", DT_BF16, DIMS(8), -1, (Loc){0});
    int bb = value(ROLE_PARAM, "b", DT_BF16, DIMS(8), -1, (Loc){0});
    node(OP_layernorm, INS(x, w, bb), ATTRS(AF("eps", 1e-5)), -1, PHASE_RECOMPUTE, (Loc){0});
    char *got = capture(print_text);
    cr_assert(strstr(got, "param %17 lm_head.w: f32[16, 8] tied %2  [host]\n"), "%s", got);
    cr_assert(strstr(got, "%21: bf16[4, 8] = layernorm(%18:x, %19:w, %20:b, eps=1e-05)  [recompute]\n"), "%s", got);
    free(got);
}

/* ---- ir_print_json --------------------------------------------------------------- */

Test(ir, json_round_trips)
{
    char *text = capture(print_json);
    json_error_t jerr;
    json_t *root = json_loads(text, 0, &jerr);
    cr_assert_not_null(root, "%s at line %d", jerr.text, jerr.line);
    free(text);

    cr_assert_str_eq(json_string_value(json_object_get(root, "model")), "tiny");
    json_t *blocks = json_object_get(root, "blocks");
    cr_assert_eq(json_array_size(blocks), 1);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(blocks, 0), "name")), "h.0");
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(blocks, 0), "layer")), "Block");

    json_t *values = json_object_get(root, "values");
    cr_assert_eq(json_array_size(values), (size_t)g->n_values);
    json_t *w = json_array_get(values, 3);
    cr_assert_eq(json_integer_value(json_object_get(w, "id")), 3);
    cr_assert_str_eq(json_string_value(json_object_get(w, "name")), "h.0.w");
    cr_assert_str_eq(json_string_value(json_object_get(w, "dtype")), "f32");
    cr_assert_str_eq(json_string_value(json_object_get(w, "role")), "param");
    cr_assert_str_eq(json_string_value(json_object_get(w, "placement")), "device");
    cr_assert_eq(json_integer_value(json_object_get(w, "block")), 0);
    cr_assert(json_is_null(json_object_get(w, "producer")));
    json_t *shape = json_object_get(w, "shape");
    cr_assert_eq(json_array_size(shape), 2);
    cr_assert_eq(json_integer_value(json_array_get(shape, 1)), 24);
    json_t *init = json_object_get(w, "init");
    cr_assert_str_eq(json_string_value(json_object_get(init, "kind")), "uniform");
    cr_assert_float_eq(json_real_value(json_object_get(init, "low")), -0.5, 1e-12);
    cr_assert_float_eq(json_real_value(json_object_get(init, "high")), 0.5, 1e-12);
    json_t *wte = json_array_get(values, 2);
    cr_assert_float_eq(json_real_value(json_object_get(json_object_get(wte, "init"), "std")), 0.02, 1e-12);
    cr_assert(json_is_null(json_object_get(wte, "block")));
    json_t *act = json_array_get(values, 5);
    cr_assert(json_is_null(json_object_get(act, "name")));
    cr_assert_eq(json_integer_value(json_object_get(act, "producer")), 0);
    cr_assert_null(json_object_get(act, "init"));
    cr_assert_eq(json_array_size(json_object_get(json_array_get(values, 13), "shape")), 0);

    json_t *nodes = json_object_get(root, "nodes");
    cr_assert_eq(json_array_size(nodes), (size_t)g->n_nodes);
    json_t *split = json_array_get(nodes, 3);
    cr_assert_str_eq(json_string_value(json_object_get(split, "op")), "split");
    cr_assert_eq(json_array_size(json_object_get(split, "inputs")), 1);
    json_t *outs = json_object_get(split, "outputs");
    cr_assert_eq(json_array_size(outs), 3);
    cr_assert_eq(json_integer_value(json_array_get(outs, 2)), 10);
    json_t *attrs = json_object_get(split, "attrs");
    cr_assert_eq(json_integer_value(json_object_get(attrs, "n")), 3);
    cr_assert_eq(json_integer_value(json_object_get(attrs, "axis")), -1);
    cr_assert_eq(json_integer_value(json_object_get(split, "block")), 0);
    cr_assert_str_eq(json_string_value(json_object_get(split, "phase")), "forward");
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(split, "loc"), "line")), 15);
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(split, "loc"), "col")), 7);

    json_t *scalar = json_array_get(nodes, 7);
    cr_assert_float_eq(json_real_value(json_object_get(json_object_get(scalar, "attrs"), "value")), 0.5, 1e-12);
    json_t *reshape = json_array_get(nodes, 8);
    cr_assert_str_eq(json_string_value(json_object_get(reshape, "phase")), "backward");
    json_t *list = json_object_get(json_object_get(reshape, "attrs"), "shape");
    cr_assert_eq(json_array_size(list), 2);
    cr_assert_eq(json_integer_value(json_array_get(list, 1)), -1);

    json_t *outputs = json_object_get(root, "outputs");
    cr_assert_eq(json_array_size(outputs), 2);
    cr_assert_eq(json_integer_value(json_array_get(outputs, 0)), 13);
    json_decref(root);
}

/* ---- ir_verify ------------------------------------------------------------------- */

static void expect_problem(const char *what)
{
    char *got = capture(verify);
    cr_assert_eq(ir_verify(g, NULL), -1, "verify passed; wanted: %s", what);
    cr_assert(strstr(got, what), "wanted \"%s\" in:\n%s", what, got);
    free(got);
}

Test(ir, verify_accepts_sound_graph)
{
    char *got = capture(verify);
    cr_assert_str_eq(got, "");
    cr_assert_eq(ir_verify(g, stderr), 0);
    free(got);
}

Test(ir, verify_input_out_of_range)
{
    g->ids[g->nodes[1].in] = 999;
    expect_problem("ir_verify: node 1 (matmul): input 0 is value 999, out of range");
}

Test(ir, verify_producer_mismatch)
{
    g->values[6].producer = 2;
    expect_problem("ir_verify: node 1 (matmul): output %6 records producer 2");
    expect_problem("ir_verify: value 6: producer 2 does not list it as an output");
}

Test(ir, verify_value_produced_twice)
{
    g->ids[g->nodes[2].out] = 6;  // add claims matmul's output
    expect_problem("ir_verify: node 2 (add): output %6 is also made by node 1");
}

Test(ir, verify_use_before_definition)
{
    g->ids[g->nodes[1].in] = 12;  // matmul reads the logits, made by node 5
    expect_problem("ir_verify: node 1 (matmul): input 0 (%12) is produced by node 5, not before it");
}

Test(ir, verify_recorded_type_differs)
{
    g->values[6].shape[2] = 25;
    expect_problem("ir_verify: node 1 (matmul): output 0 (%6) is f32[2, 4, 25], the shape rule says f32[2, 4, 24]");
}

Test(ir, verify_bad_attribute)
{
    g->attrs[g->nodes[3].attr + 1].i = 3;  // split's axis
    expect_problem("ir_verify: node 3 (split): shape rule fails: split: axis 3 is out of range for f32[2, 4, 24] (rank 3)");
}

Test(ir, verify_unknown_and_missing_attribute)
{
    g->attrs[g->nodes[3].attr].key = "parts";  // split's n
    expect_problem("ir_verify: node 3 (split): unknown attribute 'parts'");
    expect_problem("ir_verify: node 3 (split): attribute 'n' is missing");
}

Test(ir, verify_wrong_arity)
{
    g->nodes[2].n_in = 1;
    expect_problem("ir_verify: node 2 (add): 1 inputs, the signature \"a, b\" takes 2");
}

Test(ir, verify_block_and_enum_ranges)
{
    g->nodes[1].block = 4;
    g->values[0].dtype = (DType)17;
    expect_problem("ir_verify: node 1 (matmul): block 4 out of range");
    expect_problem("ir_verify: value 0: bad dtype 17");
}

Test(ir, verify_ids_range)
{
    g->nodes[4].in = g->n_ids;
    expect_problem("ir_verify: node 4 (transpose): input, output or attribute range out of bounds");
}

Test(ir, verify_output_out_of_range)
{
    g->outputs[1] = -3;
    expect_problem("ir_verify: output 1: value -3 out of range");
}

Test(ir, verify_flag_range)
{
    int q = value(ROLE_INPUT, "q", DT_F32, DIMS(4, 8), -1, (Loc){0});
    int n = node(OP_attention, INS(q, q, q), ATTRS(AI("causal", 1)), -1, PHASE_FORWARD, (Loc){0});
    cr_assert_eq(ir_verify(g, stderr), 0);
    g->attrs[g->nodes[n].attr].i = 2;
    expect_problem("ir_verify: node 9 (attention): flag 'causal' is 2, not 0 or 1");
}

/* ---- FLOPs ----------------------------------------------------------------------- */

static double flops(int n) { return ir_op_hooks(g->nodes[n].op)->flops(g, ir_node(g, n)); }

Test(ir, flops_matmul)
{
    cr_assert_float_eq(flops(1), 2.0 * (2 * 4) * 24 * 8, 1e-9);  // [2, 4, 8] @ [8, 24]
    int a = value(ROLE_INPUT, "a", DT_F32, DIMS(3, 1, 5, 7), -1, (Loc){0});
    int b = value(ROLE_INPUT, "b", DT_F32, DIMS(2, 7, 11), -1, (Loc){0});
    int v = value(ROLE_INPUT, "v", DT_F32, DIMS(7), -1, (Loc){0});
    cr_assert_float_eq(flops(node(OP_matmul, INS(a, b), NULL, 0, -1, PHASE_FORWARD, (Loc){0})), 2.0 * 5 * 11 * 7 * (3 * 2), 1e-9);
    cr_assert_float_eq(flops(node(OP_matmul, INS(v, v), NULL, 0, -1, PHASE_FORWARD, (Loc){0})), 2.0 * 7, 1e-9);
    cr_assert_float_eq(flops(node(OP_matmul, INS(v, b), NULL, 0, -1, PHASE_FORWARD, (Loc){0})), 2.0 * 2 * 11 * 7, 1e-9);
}

Test(ir, flops_attention)
{
    int q = value(ROLE_INPUT, "q", DT_F32, DIMS(2, 3, 16, 8), -1, (Loc){0});
    int k = value(ROLE_INPUT, "k", DT_F32, DIMS(2, 3, 16, 8), -1, (Loc){0});
    int n = node(OP_attention, INS(q, k, k), ATTRS(AI("causal", 1)), -1, PHASE_FORWARD, (Loc){0});
    cr_assert_float_eq(flops(n), 4.0 * 16 * 16 * 8 * (2 * 3), 1e-9);  // causal is not halved
    int k2 = value(ROLE_INPUT, "k2", DT_F32, DIMS(2, 3, 10, 8), -1, (Loc){0});
    int v2 = value(ROLE_INPUT, "v2", DT_F32, DIMS(2, 3, 10, 4), -1, (Loc){0});
    n = node(OP_attention, INS(q, k2, v2), NULL, 0, -1, PHASE_FORWARD, (Loc){0});
    cr_assert_float_eq(flops(n), 2.0 * 16 * 10 * (8 + 4) * (2 * 3), 1e-9);
    // grouped-query: 3 query heads over 1 kv head do the same products as over 3
    int k1 = value(ROLE_INPUT, "k1", DT_F32, DIMS(2, 1, 16, 8), -1, (Loc){0});
    n = node(OP_attention, INS(q, k1, k1), ATTRS(AI("causal", 1)), -1, PHASE_FORWARD, (Loc){0});
    cr_assert_float_eq(flops(n), 4.0 * 16 * 16 * 8 * (2 * 3), 1e-9);
    const Node *fn = ir_node(g, n);
    int b = node(OP_attention_bwd, INS(q, k1, k1, ir_out(g, fn, 0), ir_out(g, fn, 1), ir_out(g, fn, 0)),
                 ATTRS(AI("causal", 1)), -1, PHASE_BACKWARD, (Loc){0});
    cr_assert_float_eq(flops(b), 2.0 * 16 * 16 * (2 * 3) * 5 * 8, 1e-9);
}

/* The backward's own work is twice the forward's; its Q K^T again is recompute. */
Test(ir, flops_attention_backward_redoes_the_scores)
{
    int q = value(ROLE_INPUT, "q", DT_F32, DIMS(2, 3, 16, 8), -1, (Loc){0});
    int f = node(OP_attention, INS(q, q, q), ATTRS(AI("causal", 1)), -1, PHASE_FORWARD, (Loc){0});
    const Node *fn = ir_node(g, f);
    int o = ir_out(g, fn, 0), lse = ir_out(g, fn, 1);
    int b = node(OP_attention_bwd, INS(q, q, q, o, lse, o), ATTRS(AI("causal", 1)), -1, PHASE_BACKWARD, (Loc){0});
    double scores = 16.0 * 16 * (2 * 3), D = 8;
    cr_assert_float_eq(flops(b), 2.0 * scores * 5 * D, 1e-9);
    cr_assert_float_eq(ir_node_redone_flops(g, ir_node(g, b)), 2.0 * scores * D, 1e-9);
    cr_assert_float_eq(flops(b) - ir_node_redone_flops(g, ir_node(g, b)), 2 * flops(f), 1e-9);
    cr_assert_float_eq(ir_node_redone_flops(g, fn), 0, 1e-9);
}

Test(ir, flops_elementwise_and_layout)
{
    cr_assert_float_eq(flops(2), 2 * 4 * 24, 1e-9);  // add
    cr_assert_float_eq(flops(3), 0, 1e-9);           // split
    cr_assert_float_eq(flops(4), 0, 1e-9);           // transpose
    cr_assert_float_eq(flops(0), 0, 1e-9);           // embedding
    int x = value(ROLE_INPUT, "x", DT_F32, DIMS(4, 8), -1, (Loc){0});
    int gl = node(OP_gelu, INS(x), NULL, 0, -1, PHASE_FORWARD, (Loc){0});
    cr_assert_gt(flops(gl), 32);  // a few per element
    for (int op = 0; op < OP_COUNT; op++) {
        if (op_info((OpKind)op)->n_tensors != 1 || op == OP_split || op == OP_heads || op == OP_reshape || op == OP_permute)
            continue;
        int n = ir_node_add(g, (OpKind)op, &x, 1, NULL, 0, -1, PHASE_FORWARD, (Loc){0}, err, sizeof err);
        if (n >= 0) cr_assert_geq(flops(n), 0, "%s", op_name((OpKind)op));
    }
}
