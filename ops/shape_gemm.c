/* ops/shape_gemm.c: shape rules of the GEMM epilogue ops (passes/epilogue.c makes them):
 * a matmul and the elementwise or reduction work that follows it, as one op. The product
 * is typed by matmul's own rule on the first two inputs and the ta / tb flags; the rest
 * is checked against it. The forms are the ones one cuBLASLt call computes: the product
 * one GEMM (b a matrix, a not transposed, so a's batch folds into M), bias and db packed
 * vectors of the product's dtype.
 *
 * Where it sits: with ops/shape.c and ops/shape_bwd.c, run by ir_node_add, ir_verify
 * and fsexec's plan check.
 */
#include <inttypes.h>

#include "ops.h"

/* The product op(in[0]) @ op(in[1]) as matmul's rule types it, in c->out[0]; its M, K, N. */
static int product(ShapeCtx *c, int need_fold, int64_t *M, int64_t *K, int64_t *N)
{
    ShapeCtx m = *c;
    m.op = OP_matmul, m.n_in = 2, m.n_out = 1;
    if (op_shape(&m)) return -1;  // matmul's message, in c->err
    const OpType *a = &c->in[0], *b = &c->in[1], *o = &m.out[0];
    int ta = op_attr_int(&c->attrs, "ta", 0) != 0, tb = op_attr_int(&c->attrs, "tb", 0) != 0;
    if (b->rank != 2 || a->rank < 2 || (need_fold && ta) || (!need_fold && a->rank != 2))
        return shape_fail(c, "%s: the product must be one GEMM (b a matrix, a %s), got ranks %d and %d%s",
                          op_name(c->op), need_fold ? "not transposed" : "a matrix", a->rank, b->rank, ta ? " with ta" : "");
    *N = o->shape[o->rank - 1], *K = b->shape[tb ? 1 : 0], *M = op_type_numel(o) / *N;
    shape_set(c, 0, o->dtype, o->rank, o->shape);
    return 0;
}

/* Input i is a packed vector [n] of output 0's dtype. */
static int want_vector(ShapeCtx *c, int i, int64_t n)
{
    const OpType *v = &c->in[i];
    char t[192];
    if (v->rank != 1 || v->shape[0] != n || v->dtype != c->out[0].dtype)
        return shape_fail(c, "%s: input %d is %s, not %s[%" PRId64 "]", op_name(c->op), i, op_type_str(v, t, sizeof t),
                          dtype_name(c->out[0].dtype), n);
    return 0;
}

static int want_n(ShapeCtx *c, int n)
{
    if (c->n_in != n) return shape_fail(c, "%s: expects %d tensors, got %d", op_name(c->op), n, c->n_in);
    return 0;
}

/* (a, b, bias [N]) -> c [..., N] */
int shape_matmul_bias(ShapeCtx *c)
{
    int64_t M, K, N;
    return want_n(c, 3) || product(c, 1, &M, &K, &N) || want_vector(c, 2, N) ? -1 : 0;
}

/* Input i is a tensor of output 0's type (a residual added to it). */
static int want_like_out(ShapeCtx *c, int i)
{
    char t[192], u[192];
    if (!op_type_same_shape(&c->in[i], &c->out[0]) || c->in[i].dtype != c->out[0].dtype)
        return shape_fail(c, "%s: input %d is %s, the product %s", op_name(c->op), i,
                          op_type_str(&c->in[i], t, sizeof t), op_type_str(&c->out[0], u, sizeof u));
    return 0;
}

/* (a, b, bias [N], r [..., N]) -> c + bias + r [..., N] */
int shape_matmul_bias_add(ShapeCtx *c)
{
    int64_t M, K, N;
    return want_n(c, 4) || product(c, 1, &M, &K, &N) || want_vector(c, 2, N) || want_like_out(c, 3) ? -1 : 0;
}

/* (a, b, r [..., N]) -> c + r [..., N] */
int shape_matmul_add(ShapeCtx *c)
{
    int64_t M, K, N;
    return want_n(c, 3) || product(c, 1, &M, &K, &N) || want_like_out(c, 2) ? -1 : 0;
}

/* (a, b, bias [N]) -> gelu(c + bias), c + bias: both [..., N] */
int shape_matmul_bias_gelu(ShapeCtx *c)
{
    int64_t M, K, N;
    if (want_n(c, 3) || product(c, 1, &M, &K, &N) || want_vector(c, 2, N)) return -1;
    shape_set(c, 1, c->out[0].dtype, c->out[0].rank, c->out[0].shape);
    return 0;
}

/* (a, b, pre [..., N]) -> d [..., N] typed like pre, db [N] */
int shape_matmul_dgelu_bgrad(ShapeCtx *c)
{
    int64_t M, K, N;
    if (want_n(c, 3) || product(c, 1, &M, &K, &N)) return -1;
    if (want_like_out(c, 2)) return -1;
    shape_set(c, 1, c->out[0].dtype, 1, &N);
    return 0;
}

/* (a [M, K] or [K, M] under ta, b [K, N] or [N, K] under tb) -> c [M, N], db: op(b) summed
 * over K, [N] (side 1), or op(a) summed over K, [M] (side 0) */
int shape_matmul_bgrad(ShapeCtx *c)
{
    int64_t M, K, N;
    if (want_n(c, 2) || product(c, 0, &M, &K, &N)) return -1;
    int64_t side = op_attr_int(&c->attrs, "side", 1);
    if (side != 0 && side != 1) return shape_fail(c, "%s: side is %" PRId64 " (0: a, 1: b)", op_name(c->op), side);
    int64_t n = side ? N : M;
    shape_set(c, 1, c->out[0].dtype, 1, &n);
    return 0;
}
