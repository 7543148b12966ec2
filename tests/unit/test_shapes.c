/* tests/unit/test_shapes.c: the shape rule of every op in ops/ops.def, through
 * ir_node_add: valid calls give PyTorch's result types, bad calls give a message that
 * starts with the op's name and names the shapes involved. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "ir.h"
#include "build.h"

static Graph *g;
static char err[256];

static void setup(void)
{
    g = ir_graph_new("t");
    err[0] = 0;
}
static void teardown(void) { ir_graph_free(g); }
TestSuite(shapes, .init = setup, .fini = teardown);

static int input(DType dt, const int64_t *shape, int rank)
{
    Value v = {.dtype = dt, .rank = rank, .role = ROLE_INPUT, .block = -1, .producer = -1, .tied_to = -1};
    for (int i = 0; i < rank; i++) v.shape[i] = shape[i];
    return ir_value_add(g, &v);
}
#define F32(...) input(DT_F32, DIMS(__VA_ARGS__))
#define I32(...) input(DT_I32, DIMS(__VA_ARGS__))
#define BF16(...) input(DT_BF16, DIMS(__VA_ARGS__))
#define F32_SCALAR() input(DT_F32, NULL, 0)


static int node(OpKind op, const int *in, int n_in, const Attr *attrs, int n_attr)
{
    err[0] = 0;
    return ir_node_add(g, op, in, n_in, attrs, n_attr, -1, PHASE_FORWARD, (Loc){0}, err, sizeof err);
}
#define INS(...) (int[]){__VA_ARGS__}, (int)(sizeof((int[]){__VA_ARGS__}) / sizeof(int))
#define ATTRS(...) (Attr[]){__VA_ARGS__}, (int)(sizeof((Attr[]){__VA_ARGS__}) / sizeof(Attr))
#define NOATTRS NULL, 0

static const char *out_type(int n, int i)
{
    static char buf[8][192];
    static int k;
    cr_assert_geq(n, 0, "ir_node_add failed: %s", err);
    cr_assert_lt(i, g->nodes[n].n_out);
    char *b = buf[k++ % 8];
    return ir_type_str(ir_value(g, ir_out(g, ir_node(g, n), i)), b, 192);
}
#define EXPECT_TYPE(n, t) cr_assert_str_eq(out_type((n), 0), (t))
#define EXPECT_ERR(n, msg)                                                                                   \
    do {                                                                                                     \
        cr_assert_eq((n), -1, "expected an error %s", msg);                                                  \
        cr_assert_str_eq(err, (msg));                                                                        \
    } while (0)

/* ---- matmul ---------------------------------------------------------------------- */

Test(shapes, matmul_2d)
{
    EXPECT_TYPE(node(OP_matmul, INS(F32(4, 128), F32(128, 64)), NOATTRS), "f32[4, 64]");
}

Test(shapes, matmul_batched_weight)
{
    EXPECT_TYPE(node(OP_matmul, INS(F32(4, 64, 768), F32(768, 2304)), NOATTRS), "f32[4, 64, 2304]");
}

Test(shapes, matmul_batch_broadcast)
{
    EXPECT_TYPE(node(OP_matmul, INS(F32(2, 1, 8, 16), F32(3, 16, 4)), NOATTRS), "f32[2, 3, 8, 4]");
    EXPECT_TYPE(node(OP_matmul, INS(F32(5, 8, 16), F32(1, 16, 4)), NOATTRS), "f32[5, 8, 4]");
}

Test(shapes, matmul_1d_operands)
{
    EXPECT_TYPE(node(OP_matmul, INS(F32(16), F32(16)), NOATTRS), "f32[]");
    EXPECT_TYPE(node(OP_matmul, INS(F32(4, 8, 16), F32(16)), NOATTRS), "f32[4, 8]");
    EXPECT_TYPE(node(OP_matmul, INS(F32(16), F32(16, 5)), NOATTRS), "f32[5]");
    EXPECT_TYPE(node(OP_matmul, INS(F32(16), F32(3, 16, 5)), NOATTRS), "f32[3, 5]");
}

Test(shapes, matmul_keeps_low_precision)
{
    EXPECT_TYPE(node(OP_matmul, INS(BF16(4, 8), BF16(8, 2)), NOATTRS), "bf16[4, 2]");
}

Test(shapes, matmul_inner_dims_differ)
{
    EXPECT_ERR(node(OP_matmul, INS(F32(4, 128), F32(256, 64)), NOATTRS),
               "matmul: inner dims differ: f32[4, 128] @ f32[256, 64] (128 vs 256)");
    EXPECT_ERR(node(OP_matmul, INS(F32(4, 8), F32(9)), NOATTRS), "matmul: inner dims differ: f32[4, 8] @ f32[9] (8 vs 9)");
}

Test(shapes, matmul_batch_dims_differ)
{
    EXPECT_ERR(node(OP_matmul, INS(F32(2, 8, 16), F32(3, 16, 4)), NOATTRS),
               "matmul: batch dims do not broadcast: f32[2, 8, 16] @ f32[3, 16, 4] (dim -3: 2 vs 3)");
}

Test(shapes, matmul_rejects_scalars_ints_and_mixed_dtypes)
{
    EXPECT_ERR(node(OP_matmul, INS(F32_SCALAR(), F32(4)), NOATTRS), "matmul: expects a tensor of rank >= 1, got f32[]");
    EXPECT_ERR(node(OP_matmul, INS(I32(4, 4), I32(4, 4)), NOATTRS), "matmul: expects a float tensor, got i32[4, 4]");
    EXPECT_ERR(node(OP_matmul, INS(F32(4, 4), BF16(4, 4)), NOATTRS), "matmul: dtypes differ: f32[4, 4] and bf16[4, 4]");
}

/* ---- elementwise ----------------------------------------------------------------- */

Test(shapes, binary_broadcast)
{
    EXPECT_TYPE(node(OP_add, INS(F32(4, 64, 768), F32(768)), NOATTRS), "f32[4, 64, 768]");
    EXPECT_TYPE(node(OP_sub, INS(F32(4, 1, 8), F32(3, 1)), NOATTRS), "f32[4, 3, 8]");
    EXPECT_TYPE(node(OP_mul, INS(F32(4, 8), F32_SCALAR()), NOATTRS), "f32[4, 8]");
    EXPECT_TYPE(node(OP_div, INS(F32_SCALAR(), F32(1, 8)), NOATTRS), "f32[1, 8]");
    EXPECT_TYPE(node(OP_add, INS(F32_SCALAR(), F32_SCALAR()), NOATTRS), "f32[]");
    EXPECT_TYPE(node(OP_add, INS(I32(4), I32(4)), NOATTRS), "i32[4]");
}

Test(shapes, binary_errors_name_both_shapes)
{
    EXPECT_ERR(node(OP_add, INS(F32(4, 64, 768), F32(4, 32)), NOATTRS),
               "add: shapes do not broadcast: [4, 64, 768] and [4, 32] (dim -1: 768 vs 32)");
    EXPECT_ERR(node(OP_mul, INS(F32(2, 3, 4), F32(5, 4)), NOATTRS),
               "mul: shapes do not broadcast: [2, 3, 4] and [5, 4] (dim -2: 3 vs 5)");
    EXPECT_ERR(node(OP_sub, INS(F32(4), I32(4)), NOATTRS), "sub: dtypes differ: f32[4] and i32[4]");
    EXPECT_ERR(node(OP_div, INS(I32(4), I32(4)), NOATTRS), "div: expects a float tensor, got i32[4]");
}

Test(shapes, unary_same_type)
{
    OpKind ops[] = {OP_neg, OP_exp, OP_log, OP_sqrt, OP_rsqrt, OP_tanh, OP_sigmoid, OP_relu, OP_gelu, OP_silu};
    for (size_t i = 0; i < sizeof ops / sizeof *ops; i++) {
        EXPECT_TYPE(node(ops[i], INS(F32(4, 64)), NOATTRS), "f32[4, 64]");
        EXPECT_TYPE(node(ops[i], INS(BF16(3)), NOATTRS), "bf16[3]");
    }
    EXPECT_TYPE(node(OP_neg, INS(I32(2, 2)), NOATTRS), "i32[2, 2]");
}

Test(shapes, unary_float_only)
{
    OpKind ops[] = {OP_exp, OP_log, OP_sqrt, OP_rsqrt, OP_tanh, OP_sigmoid, OP_relu, OP_gelu, OP_silu};
    for (size_t i = 0; i < sizeof ops / sizeof *ops; i++) {
        char want[128];
        snprintf(want, sizeof want, "%s: expects a float tensor, got i32[4, 64]", op_name(ops[i]));
        EXPECT_ERR(node(ops[i], INS(I32(4, 64)), NOATTRS), want);
    }
}

/* ---- reductions and norms -------------------------------------------------------- */

Test(shapes, reduce_drops_axis)
{
    EXPECT_TYPE(node(OP_sum, INS(F32(4, 64, 768)), ATTRS(AI("axis", -1), AI("keepdim", 0))), "f32[4, 64]");
    EXPECT_TYPE(node(OP_mean, INS(F32(4, 64, 768)), ATTRS(AI("axis", 1), AI("keepdim", 0))), "f32[4, 768]");
    EXPECT_TYPE(node(OP_max, INS(F32(4, 64, 768)), ATTRS(AI("axis", -3))), "f32[64, 768]");
    EXPECT_TYPE(node(OP_sum, INS(F32(7)), NOATTRS), "f32[]");
}

Test(shapes, reduce_keepdim)
{
    EXPECT_TYPE(node(OP_sum, INS(F32(4, 64, 768)), ATTRS(AI("axis", -1), AI("keepdim", 1))), "f32[4, 64, 1]");
    EXPECT_TYPE(node(OP_max, INS(F32(4, 64, 768)), ATTRS(AI("axis", 0), AI("keepdim", 1))), "f32[1, 64, 768]");
}

Test(shapes, reduce_errors)
{
    EXPECT_ERR(node(OP_sum, INS(F32(4, 64)), ATTRS(AI("axis", 2))), "sum: axis 2 is out of range for f32[4, 64] (rank 2)");
    EXPECT_ERR(node(OP_mean, INS(F32(4, 64)), ATTRS(AI("axis", -3))), "mean: axis -3 is out of range for f32[4, 64] (rank 2)");
    EXPECT_ERR(node(OP_max, INS(F32_SCALAR()), NOATTRS), "max: expects a tensor of rank >= 1, got f32[]");
    EXPECT_ERR(node(OP_sum, INS(I32(4)), NOATTRS), "sum: expects a float tensor, got i32[4]");
}

Test(shapes, softmax)
{
    EXPECT_TYPE(node(OP_softmax, INS(F32(4, 12, 64, 64)), ATTRS(AI("axis", -1))), "f32[4, 12, 64, 64]");
    EXPECT_TYPE(node(OP_softmax, INS(F32(4, 12)), ATTRS(AI("axis", 0))), "f32[4, 12]");
    EXPECT_ERR(node(OP_softmax, INS(F32(4, 12)), ATTRS(AI("axis", 5))), "softmax: axis 5 is out of range for f32[4, 12] (rank 2)");
    EXPECT_ERR(node(OP_softmax, INS(I32(4)), NOATTRS), "softmax: expects a float tensor, got i32[4]");
}

Test(shapes, layernorm)
{
    EXPECT_TYPE(node(OP_layernorm, INS(F32(4, 64, 768), F32(768), F32(768)), ATTRS(AF("eps", 1e-5))), "f32[4, 64, 768]");
    EXPECT_TYPE(node(OP_layernorm, INS(F32(768), F32(768), F32(768)), NOATTRS), "f32[768]");
}

Test(shapes, layernorm_errors)
{
    EXPECT_ERR(node(OP_layernorm, INS(F32(4, 64, 768), F32(64), F32(768)), NOATTRS),
               "layernorm: weight must be [768] for input f32[4, 64, 768], got f32[64]");
    EXPECT_ERR(node(OP_layernorm, INS(F32(4, 64, 768), F32(768), F32(1, 768)), NOATTRS),
               "layernorm: bias must be [768] for input f32[4, 64, 768], got f32[1, 768]");
    EXPECT_ERR(node(OP_layernorm, INS(F32(4, 8), BF16(8), BF16(8)), NOATTRS), "layernorm: dtypes differ: f32[4, 8] and bf16[8]");
    EXPECT_ERR(node(OP_layernorm, INS(F32(4, 8), F32(8), F32(8)), ATTRS(AF("eps", -1))), "layernorm: eps must be >= 0, got -1");
    EXPECT_ERR(node(OP_layernorm, INS(I32(4, 8), F32(8), F32(8)), NOATTRS), "layernorm: expects a float tensor, got i32[4, 8]");
}

Test(shapes, rmsnorm)
{
    EXPECT_TYPE(node(OP_rmsnorm, INS(BF16(2, 16, 64), BF16(64)), ATTRS(AF("eps", 1e-6))), "bf16[2, 16, 64]");
    EXPECT_ERR(node(OP_rmsnorm, INS(F32(2, 16, 64), F32(16)), NOATTRS),
               "rmsnorm: weight must be [64] for input f32[2, 16, 64], got f32[16]");
}

/* ---- embedding and the loss ------------------------------------------------------ */

Test(shapes, embedding)
{
    EXPECT_TYPE(node(OP_embedding, INS(F32(50257, 768), I32(4, 64)), NOATTRS), "f32[4, 64, 768]");
    EXPECT_TYPE(node(OP_embedding, INS(BF16(64, 32), I32(64)), NOATTRS), "bf16[64, 32]");
}

Test(shapes, embedding_errors)
{
    EXPECT_ERR(node(OP_embedding, INS(F32(64, 32), F32(4, 64)), NOATTRS),
               "embedding: indices must be i32, got f32[4, 64] (table f32[64, 32])");
    EXPECT_ERR(node(OP_embedding, INS(F32(64, 32, 2), I32(4)), NOATTRS),
               "embedding: table must be a float [V, C] tensor, got f32[64, 32, 2] (indices i32[4])");
    EXPECT_ERR(node(OP_embedding, INS(F32(8, 4), I32(1, 2, 3, 4, 5, 6)), NOATTRS),
               "embedding: result of rank 7 exceeds the limit of 6 (from i32[1, 2, 3, 4, 5, 6])");
}

Test(shapes, cross_entropy)
{
    EXPECT_TYPE(node(OP_cross_entropy, INS(F32(4, 64, 256), I32(4, 64)), NOATTRS), "f32[]");
    EXPECT_TYPE(node(OP_cross_entropy, INS(BF16(8, 10), I32(8)), NOATTRS), "f32[]");
    EXPECT_TYPE(node(OP_cross_entropy, INS(F32(10), input(DT_I32, NULL, 0)), NOATTRS), "f32[]");
}

Test(shapes, cross_entropy_errors)
{
    EXPECT_ERR(node(OP_cross_entropy, INS(F32(4, 64, 256), I32(4, 32)), NOATTRS),
               "cross_entropy: targets i32[4, 32] do not match logits f32[4, 64, 256] (expected [4, 64])");
    EXPECT_ERR(node(OP_cross_entropy, INS(F32(4, 64, 256), I32(4, 64, 256)), NOATTRS),
               "cross_entropy: targets i32[4, 64, 256] do not match logits f32[4, 64, 256] (expected [4, 64])");
    EXPECT_ERR(node(OP_cross_entropy, INS(F32(4, 256), F32(4)), NOATTRS),
               "cross_entropy: targets must be i32, got f32[4] (logits f32[4, 256])");
    EXPECT_ERR(node(OP_cross_entropy, INS(I32(4, 256), I32(4)), NOATTRS), "cross_entropy: expects a float tensor, got i32[4, 256]");
}

/* ---- views and layout ------------------------------------------------------------ */

Test(shapes, reshape)
{
    EXPECT_TYPE(node(OP_reshape, INS(F32(4, 64, 768)), ATTRS(AL("shape", 256, 768))), "f32[256, 768]");
    EXPECT_TYPE(node(OP_reshape, INS(F32(4, 64, 768)), ATTRS(AL("shape", 4, -1, 12, 64))), "f32[4, 64, 12, 64]");
    EXPECT_TYPE(node(OP_reshape, INS(I32(4, 64)), ATTRS(AL("shape", -1))), "i32[256]");
    EXPECT_TYPE(node(OP_reshape, INS(F32(1, 1)), NOATTRS), "f32[]");
}

Test(shapes, reshape_errors)
{
    EXPECT_ERR(node(OP_reshape, INS(F32(4, 64)), ATTRS(AL("shape", 3, -1))),
               "reshape: cannot reshape f32[4, 64] (256 elements) to [3, -1]");
    EXPECT_ERR(node(OP_reshape, INS(F32(4, 64)), ATTRS(AL("shape", 4, 65))),
               "reshape: cannot reshape f32[4, 64] (256 elements) to [4, 65]");
    EXPECT_ERR(node(OP_reshape, INS(F32(4, 64)), ATTRS(AL("shape", -1, -1))),
               "reshape: more than one -1 in [-1, -1] (input f32[4, 64])");
    EXPECT_ERR(node(OP_reshape, INS(F32(4, 64)), ATTRS(AL("shape", 0, 256))),
               "reshape: dim 0 of [0, 256] must be positive or -1 (input f32[4, 64])");
    EXPECT_ERR(node(OP_reshape, INS(F32(64)), ATTRS(AL("shape", 1, 1, 1, 1, 1, 1, 64))),
               "reshape: result of rank 7 exceeds the limit of 6 (from f32[64])");
}

Test(shapes, transpose)
{
    EXPECT_TYPE(node(OP_transpose, INS(F32(50257, 768)), ATTRS(AI("a", -2), AI("b", -1))), "f32[768, 50257]");
    EXPECT_TYPE(node(OP_transpose, INS(F32(2, 3, 4)), ATTRS(AI("a", 0), AI("b", 2))), "f32[4, 3, 2]");
    EXPECT_TYPE(node(OP_transpose, INS(F32(2, 3, 4)), NOATTRS), "f32[2, 4, 3]");
    EXPECT_ERR(node(OP_transpose, INS(F32(5)), NOATTRS), "transpose: dim -2 is out of range for f32[5] (rank 1)");
    EXPECT_ERR(node(OP_transpose, INS(F32(2, 3)), ATTRS(AI("a", 0), AI("b", 3))),
               "transpose: dim 3 is out of range for f32[2, 3] (rank 2)");
}

Test(shapes, permute)
{
    EXPECT_TYPE(node(OP_permute, INS(F32(2, 3, 4, 5)), ATTRS(AL("dims", 0, 2, 1, 3))), "f32[2, 4, 3, 5]");
    EXPECT_TYPE(node(OP_permute, INS(F32(2, 3, 4)), ATTRS(AL("dims", -1, 0, 1))), "f32[4, 2, 3]");
    EXPECT_ERR(node(OP_permute, INS(F32(2, 3, 4)), ATTRS(AL("dims", 0, 1))), "permute: 2 dims given for f32[2, 3, 4] (rank 3)");
    EXPECT_ERR(node(OP_permute, INS(F32(2, 3, 4)), ATTRS(AL("dims", 0, 1, -3))), "permute: dim -3 appears twice for f32[2, 3, 4]");
    EXPECT_ERR(node(OP_permute, INS(F32(2, 3, 4)), ATTRS(AL("dims", 0, 1, 3))), "permute: dim 3 is out of range for f32[2, 3, 4] (rank 3)");
}

Test(shapes, split)
{
    int n = node(OP_split, INS(F32(4, 64, 2304)), ATTRS(AI("n", 3), AI("axis", -1)));
    cr_assert_geq(n, 0, "%s", err);
    cr_assert_eq(g->nodes[n].n_out, 3);
    for (int i = 0; i < 3; i++) cr_assert_str_eq(out_type(n, i), "f32[4, 64, 768]");
    n = node(OP_split, INS(F32(6, 2)), ATTRS(AI("n", 2), AI("axis", 0)));
    cr_assert_eq(g->nodes[n].n_out, 2);
    cr_assert_str_eq(out_type(n, 1), "f32[3, 2]");
    n = node(OP_split, INS(F32(32)), ATTRS(AI("n", IR_MAX_OUT)));
    cr_assert_eq(g->nodes[n].n_out, IR_MAX_OUT);
    cr_assert_str_eq(out_type(n, IR_MAX_OUT - 1), "f32[2]");
}

Test(shapes, split_errors)
{
    EXPECT_ERR(node(OP_split, INS(F32(4, 64, 768)), ATTRS(AI("n", 5), AI("axis", -1))),
               "split: dim 2 of [4, 64, 768] (768) is not divisible by 5");
    EXPECT_ERR(node(OP_split, INS(F32(4, 64)), ATTRS(AI("n", 0))), "split: n must be in [1, 16], got 0 (input f32[4, 64])");
    EXPECT_ERR(node(OP_split, INS(F32(68)), ATTRS(AI("n", 17))), "split: n must be in [1, 16], got 17 (input f32[68])");
    EXPECT_ERR(node(OP_split, INS(F32(4, 64)), ATTRS(AI("n", 2), AI("axis", 2))),
               "split: axis 2 is out of range for f32[4, 64] (rank 2)");
}

Test(shapes, concat)
{
    EXPECT_TYPE(node(OP_concat, INS(F32(4, 8), F32(4, 16), F32(4, 1)), ATTRS(AI("axis", -1))), "f32[4, 25]");
    EXPECT_TYPE(node(OP_concat, INS(F32(4, 8), F32(2, 8)), ATTRS(AI("axis", 0))), "f32[6, 8]");
    EXPECT_TYPE(node(OP_concat, INS(I32(3)), NOATTRS), "i32[3]");
}

Test(shapes, concat_errors)
{
    EXPECT_ERR(node(OP_concat, INS(F32(4, 8), F32(5, 8)), ATTRS(AI("axis", -1))),
               "concat: shapes differ outside axis 1: f32[4, 8] and f32[5, 8] (dim 0: 4 vs 5)");
    EXPECT_ERR(node(OP_concat, INS(F32(4, 8), F32(4, 8, 1)), NOATTRS), "concat: ranks differ: f32[4, 8] and f32[4, 8, 1] (input 1)");
    EXPECT_ERR(node(OP_concat, INS(F32(4, 8), BF16(4, 8)), NOATTRS), "concat: dtypes differ: f32[4, 8] and bf16[4, 8]");
    EXPECT_ERR(node(OP_concat, INS(F32(4, 8), F32(4, 8)), ATTRS(AI("axis", 2))),
               "concat: axis 2 is out of range for f32[4, 8] (rank 2)");
}

Test(shapes, heads_and_merge_heads)
{
    EXPECT_TYPE(node(OP_heads, INS(F32(4, 64, 768)), ATTRS(AI("n", 12))), "f32[4, 12, 64, 64]");
    EXPECT_TYPE(node(OP_heads, INS(F32(64, 768)), ATTRS(AI("n", 12))), "f32[12, 64, 64]");
    EXPECT_TYPE(node(OP_merge_heads, INS(F32(4, 12, 64, 64)), NOATTRS), "f32[4, 64, 768]");
    EXPECT_TYPE(node(OP_merge_heads, INS(BF16(12, 64, 32)), NOATTRS), "bf16[64, 384]");
}

Test(shapes, heads_errors)
{
    EXPECT_ERR(node(OP_heads, INS(F32(4, 64, 768)), ATTRS(AI("n", 5))), "heads: last dim of f32[4, 64, 768] (768) is not divisible by 5");
    EXPECT_ERR(node(OP_heads, INS(F32(768)), ATTRS(AI("n", 12))), "heads: expects a tensor of rank >= 2, got f32[768]");
    EXPECT_ERR(node(OP_heads, INS(F32(4, 64)), ATTRS(AI("n", 0))), "heads: n must be positive, got 0 (input f32[4, 64])");
    EXPECT_ERR(node(OP_heads, INS(F32(1, 1, 1, 1, 4, 8)), ATTRS(AI("n", 2))),
               "heads: result of rank 7 exceeds the limit of 6 (from f32[1, 1, 1, 1, 4, 8])");
    EXPECT_ERR(node(OP_merge_heads, INS(F32(64, 768)), NOATTRS), "merge_heads: expects a tensor of rank >= 3, got f32[64, 768]");
}

/* ---- attention ------------------------------------------------------------------- */

Test(shapes, rope)
{
    EXPECT_TYPE(node(OP_rope, INS(F32(4, 12, 64, 64)), ATTRS(AF("theta", 10000))), "f32[4, 12, 64, 64]");
    EXPECT_ERR(node(OP_rope, INS(F32(4, 63)), NOATTRS), "rope: last dim of f32[4, 63] must be even");
    EXPECT_ERR(node(OP_rope, INS(F32(64)), NOATTRS), "rope: expects a tensor of rank >= 2, got f32[64]");
    EXPECT_ERR(node(OP_rope, INS(F32(4, 64)), ATTRS(AF("theta", 0))), "rope: theta must be positive, got 0");
}

/* Llama's rope and attention on its projections' rows (passes/packed_attn.c). */
Test(shapes, rope_rows_and_attention_rows)
{
    EXPECT_TYPE(node(OP_rope_rows, INS(F32(4, 64, 96)), ATTRS(AI("n", 4))), "f32[4, 64, 96]");
    EXPECT_ERR(node(OP_rope_rows, INS(F32(4, 64, 96)), ATTRS(AI("n", 5))),
               "rope_rows: f32[4, 64, 96]'s rows are not 5 heads of one even width");
    EXPECT_ERR(node(OP_rope_rows, INS(F32(4, 64, 96)), ATTRS(AI("n", 32))),
               "rope_rows: f32[4, 64, 96]'s rows are not 32 heads of one even width");
    int q = F32(4, 64, 96), k = F32(4, 64, 48);
    int a = node(OP_attention_rows, INS(q, k, k), ATTRS(AI("nh", 4), AI("nkv", 2), AI("causal", 1)));
    EXPECT_TYPE(a, "f32[4, 64, 96]");
    cr_assert_str_eq(out_type(a, 1), "f32[4, 4, 64]");
    EXPECT_ERR(node(OP_attention_rows, INS(q, k, k), ATTRS(AI("nh", 4), AI("nkv", 3))),
               "attention_rows: nh = 4 query heads over nkv = 3 kv heads (both >= 1, nh a multiple of nkv)");
    EXPECT_ERR(node(OP_attention_rows, INS(q, k, F32(4, 32, 48)), ATTRS(AI("nh", 4), AI("nkv", 2))),
               "attention_rows: q f32[4, 64, 96], k f32[4, 64, 48], v f32[4, 32, 48] are not 4 and 2 heads of one "
               "width over the same rows");
    EXPECT_ERR(node(OP_attention_rows, INS(q, k, BF16(4, 64, 48)), ATTRS(AI("nh", 4), AI("nkv", 2))),
               "attention_rows: dtypes differ: f32[4, 64, 96] and bf16[4, 64, 48]");
}

Test(shapes, attention)
{
    int q = F32(4, 12, 64, 32), k = F32(4, 12, 64, 32), v = F32(4, 12, 64, 16);
    EXPECT_TYPE(node(OP_attention, INS(q, k, v), ATTRS(AI("causal", 1))), "f32[4, 12, 64, 16]");
    EXPECT_TYPE(node(OP_attention, INS(F32(8, 32), F32(20, 32), F32(20, 32)), ATTRS(AI("causal", 0))), "f32[8, 32]");
    // grouped-query: 12 query heads over 4 kv heads, and over 1 (multi-query)
    EXPECT_TYPE(node(OP_attention, INS(q, F32(4, 4, 64, 32), F32(4, 4, 64, 16)), ATTRS(AI("causal", 1))), "f32[4, 12, 64, 16]");
    EXPECT_TYPE(node(OP_attention, INS(q, F32(4, 1, 64, 32), F32(4, 1, 64, 16)), ATTRS(AI("causal", 1))), "f32[4, 12, 64, 16]");
}

Test(shapes, attention_errors)
{
    EXPECT_ERR(node(OP_attention, INS(F32(8, 32), F32(20, 32), F32(20, 32)), ATTRS(AI("causal", 1))),
               "attention: causal needs equal lengths: q f32[8, 32], k f32[20, 32] (8 vs 20)");
    EXPECT_ERR(node(OP_attention, INS(F32(2, 4, 8, 32), F32(3, 4, 8, 32), F32(3, 4, 8, 32)), NOATTRS),
               "attention: batch dims differ: q f32[2, 4, 8, 32], k f32[3, 4, 8, 32], v f32[3, 4, 8, 32] (dim 0)");
    EXPECT_ERR(node(OP_attention, INS(F32(2, 8, 32), F32(3, 8, 32), F32(3, 8, 32)), NOATTRS),
               "attention: q's 2 heads are not a multiple of k and v's 3 (grouped-query attention needs NH % NKV == 0): "
               "q f32[2, 8, 32], k f32[3, 8, 32]");
    EXPECT_ERR(node(OP_attention, INS(F32(4, 8, 32), F32(2, 8, 32), F32(1, 8, 32)), NOATTRS),
               "attention: k and v head counts differ: k f32[2, 8, 32] has 2, v f32[1, 8, 32] has 1");
    EXPECT_ERR(node(OP_attention, INS(F32(8, 32), F32(8, 16), F32(8, 32)), NOATTRS),
               "attention: head dims differ: q f32[8, 32], k f32[8, 16] (32 vs 16)");
    EXPECT_ERR(node(OP_attention, INS(F32(8, 32), F32(8, 32), F32(9, 32)), NOATTRS),
               "attention: k and v lengths differ: k f32[8, 32], v f32[9, 32] (8 vs 9)");
    EXPECT_ERR(node(OP_attention, INS(F32(2, 8, 32), F32(8, 32), F32(8, 32)), NOATTRS),
               "attention: ranks differ: q f32[2, 8, 32], k f32[8, 32], v f32[8, 32]");
    EXPECT_ERR(node(OP_attention, INS(F32(8, 32), BF16(8, 32), F32(8, 32)), NOATTRS),
               "attention: dtypes differ: f32[8, 32] and bf16[8, 32]");
}

/* ---- constants ------------------------------------------------------------------- */

Test(shapes, arange_and_scalar)
{
    EXPECT_TYPE(node(OP_arange, NULL, 0, ATTRS(AI("n", 64))), "i32[64]");
    EXPECT_ERR(node(OP_arange, NULL, 0, ATTRS(AI("n", 0))), "arange: n must be positive, got 0");
    EXPECT_TYPE(node(OP_scalar, NULL, 0, ATTRS(AF("value", 0.5))), "f32[]");
}

/* ---- the graph is untouched by a failed rule ------------------------------------- */

Test(shapes, failure_leaves_graph_unchanged)
{
    int a = F32(4, 8), b = F32(9, 2);
    int nv = g->n_values, nn = g->n_nodes, ni = g->n_ids, na = g->n_attrs, nl = g->n_ints;
    cr_assert_eq(node(OP_matmul, INS(a, b), NOATTRS), -1);
    cr_assert_eq(node(OP_reshape, INS(a), ATTRS(AL("shape", 5, 5))), -1);
    cr_assert_eq(g->n_values, nv);
    cr_assert_eq(g->n_nodes, nn);
    cr_assert_eq(g->n_ids, ni);
    cr_assert_eq(g->n_attrs, na);
    cr_assert_eq(g->n_ints, nl);
}

/* Every op in the table has a rule and a FLOP count. */
Test(shapes, every_op_has_hooks)
{
    for (int op = 0; op < OP_COUNT; op++) {
        cr_assert_not_null(op_info((OpKind)op)->shape, "%s", op_name((OpKind)op));
        cr_assert_not_null(ir_op_hooks((OpKind)op)->flops, "%s", op_name((OpKind)op));
    }
}
