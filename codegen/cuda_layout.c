/* codegen/cuda_layout.c: the CUDA emitters of the ops that move elements without
 * arithmetic: copy, reshape, expand, transpose, permute, heads, merge_heads (one gather
 * each), split, concat and slice. Semantics: runtime/cpu/layout.c, comm_local.c (copy)
 * and elementwise.c (expand).
 *
 * Every kernel moves raw bits (unsigned int for 4-byte dtypes, unsigned short for 2-byte
 * ones), so one kernel serves every dtype of a size. Each is a grid-stride loop over the
 * output's elements with the source offset compiled in: for a gather, from the output's
 * dims and the source's strides along them (cu_index_expr merges the dims the source
 * walks contiguously, so a transpose of the last two dims costs one div and mod each).
 * split and concat find their axis from the shapes, as the CPU kernels do.
 *
 * A reshape, or a copy, whose output is its input's bytes (same offset and rank stride
 * after memplan: a view) needs no instruction.
 */
#include <string.h>

#include "cuda.h"

static const char *bits(DType t) { return dtype_size(t) == 4 ? "unsigned int" : "unsigned short"; }

static int same_bytes(const Value *a, const Value *b) { return a->offset == b->offset && a->rank_stride == b->rank_stride; }

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* y[i] = x[at] for every element i of y, `at` an expression of i. */
static int gather(CuCtx *c, const char *prefix, const char *at)
{
    const Value *x = cu_inv(c, 0), *y = cu_outv(c, 0);
    int64_t n = ir_numel(y);
    if (n == 0) return 0;
    const char *T = bits(y->dtype);
    char *src = cu_fmt(c,
                       "extern \"C\" __global__ void KNAME(const %s *x, %s *y)\n"
                       "{\n"
                       "    %s y[i] = x[%s];\n"
                       "}\n",
                       T, T, cu_loop(c, cu_index(max64(n, ir_numel(x))), n), at);
    return cu_launch(c, prefix, src, cu_grid(n), (CuDim){CU_BLOCK, 1, 1}, 0, (const int[]){cu_in_id(c, 0), cu_out_id(c, 0)},
                     2);
}

/* x (seen with shape xshape, rank dims) with its dims permuted: y's dim j is x's dim perm[j]. */
static int permuted(CuCtx *c, const char *prefix, int rank, const int64_t *xshape, const int *perm)
{
    int64_t xst[IR_MAX_RANK + 1], size[IR_MAX_RANK + 1], stride[IR_MAX_RANK + 1];
    xst[rank - 1] = 1;
    for (int d = rank - 2; d >= 0; d--) xst[d] = xst[d + 1] * xshape[d + 1];
    for (int j = 0; j < rank; j++) size[j] = xshape[perm[j]], stride[j] = xst[perm[j]];
    return gather(c, prefix, cu_index_expr(c, rank, size, stride, "i"));
}

/* x's dims a and b swapped. */
static int swapped(CuCtx *c, const char *prefix, int rank, const int64_t *xshape, int a, int b)
{
    int perm[IR_MAX_RANK + 1];
    for (int d = 0; d < rank; d++) perm[d] = d;
    perm[a] = b, perm[b] = a;
    return permuted(c, prefix, rank, xshape, perm);
}

static int norm_axis(int64_t axis, int rank) { return (int)(axis < 0 ? axis + rank : axis); }

int cuda_copy(CuCtx *c) { return same_bytes(cu_inv(c, 0), cu_outv(c, 0)) ? 0 : gather(c, "copy", "i"); }

int cuda_reshape(CuCtx *c) { return same_bytes(cu_inv(c, 0), cu_outv(c, 0)) ? 0 : gather(c, "copy", "i"); }

int cuda_expand(CuCtx *c) { return gather(c, "expand", cu_bcast_index(c, cu_outv(c, 0), cu_inv(c, 0), "i")); }

int cuda_transpose(CuCtx *c)
{
    const Node *n = cu_node(c);
    const Value *x = cu_inv(c, 0);
    int a = norm_axis(ir_attr_int(c->g, n, "a", -2), x->rank), b = norm_axis(ir_attr_int(c->g, n, "b", -1), x->rank);
    return swapped(c, "transpose", x->rank, x->shape, a, b);
}

int cuda_permute(CuCtx *c)
{
    const Value *x = cu_inv(c, 0);
    int len, perm[IR_MAX_RANK];
    const int64_t *dims = ir_attr_ints(c->g, cu_node(c), "dims", &len);
    if (len != x->rank) return cu_fail(c, "%d dims for rank %d", len, x->rank);
    for (int j = 0; j < len; j++) perm[j] = norm_axis(dims[j], x->rank);
    return permuted(c, "permute", x->rank, x->shape, perm);
}

/* [..., T, C] seen as [..., T, n, D], T and n swapped: [..., n, T, D]. */
int cuda_heads(CuCtx *c)
{
    const Value *x = cu_inv(c, 0);
    int r = x->rank;
    int64_t n = ir_attr_int(c->g, cu_node(c), "n", 1), shape[IR_MAX_RANK + 1];
    if (r < 2 || n < 1 || x->shape[r - 1] % n) return cu_fail(c, "bad heads (rank %d, n %lld)", r, (long long)n);
    memcpy(shape, x->shape, sizeof(int64_t) * (size_t)r);
    shape[r - 1] = n, shape[r] = x->shape[r - 1] / n;
    return swapped(c, "heads", r + 1, shape, r - 2, r - 1);
}

/* [..., n, T, D] -> [..., T, n, D], stored as [..., T, n * D]. */
int cuda_merge_heads(CuCtx *c)
{
    const Value *x = cu_inv(c, 0);
    if (x->rank < 3) return cu_fail(c, "rank %d", x->rank);
    return swapped(c, "merge_heads", x->rank, x->shape, x->rank - 3, x->rank - 2);
}

/* The one dim where a and b differ (0 if none does). */
static int differing_dim(const Value *a, const Value *b)
{
    for (int d = 0; d < a->rank; d++)
        if (a->shape[d] != b->shape[d]) return d;
    return 0;
}

/* x seen around its axis as (outer, n, inner): the elements before and after it. */
static void around_axis(const Value *x, int axis, int64_t *n, int64_t *inner)
{
    *inner = 1;
    for (int d = axis + 1; d < x->rank; d++) *inner *= x->shape[d];
    *n = x->shape[axis];
}

/* Equal parts along the axis: output t holds positions [t len, (t + 1) len). Each thread
 * moves element i of every part. */
int cuda_split(CuCtx *c)
{
    const Node *node = cu_node(c);
    const Value *x = cu_inv(c, 0), *y0 = cu_outv(c, 0);
    int axis = differing_dim(x, y0);
    int64_t n, inner, len = y0->shape[axis], part = ir_numel(y0);
    around_axis(x, axis, &n, &inner);
    if (len * node->n_out != n) return cu_fail(c, "%d parts of %lld do not cover %lld", node->n_out, (long long)len, (long long)n);
    if (part == 0) return 0;
    const char *T = bits(x->dtype);
    CuText src = cu_text(c);
    int args[IR_MAX_OUT + 1] = {cu_in_id(c, 0)};
    cu_text_add(&src, "extern \"C\" __global__ void KNAME(const %s *x", T);
    for (int t = 0; t < node->n_out; t++) {
        cu_text_add(&src, ", %s *y%d", T, t);
        args[t + 1] = cu_out_id(c, t);
    }
    cu_text_add(&src, ")\n{\n    %s {\n", cu_loop(c, cu_index(ir_numel(x)), part));
    cu_text_add(&src, "        const %s at = i / %lld * %lld + i %% %lld;\n", cu_index(ir_numel(x)), (long long)(len * inner),
                (long long)(n * inner), (long long)(len * inner));
    for (int t = 0; t < node->n_out; t++) cu_text_add(&src, "        y%d[i] = x[at + %lld];\n", t, (long long)(t * len * inner));
    cu_text_add(&src, "    }\n}\n");
    return cu_launch(c, "split", src.s, cu_grid(part), (CuDim){CU_BLOCK, 1, 1}, 0, args, node->n_out + 1);
}

/* Each output element comes from the input whose range along the axis holds it. */
int cuda_concat(CuCtx *c)
{
    const Node *node = cu_node(c);
    const Value *y = cu_outv(c, 0);
    int axis = differing_dim(y, cu_inv(c, 0));
    int64_t n, inner, total = ir_numel(y), at = 0;
    around_axis(y, axis, &n, &inner);
    if (total == 0) return 0;
    const char *T = bits(y->dtype), *idx = cu_index(total);
    CuText src = cu_text(c);
    int args[IR_MAX_IN + 1];
    cu_text_add(&src, "extern \"C\" __global__ void KNAME(");
    for (int t = 0; t < node->n_in; t++) {
        cu_text_add(&src, "const %s *x%d, ", T, t);
        args[t] = cu_in_id(c, t);
    }
    args[node->n_in] = cu_out_id(c, 0);
    cu_text_add(&src, "%s *y)\n{\n    %s {\n", T, cu_loop(c, idx, total));
    /* element i is (o, a, r) around the axis; part t holds a in [at, at + len) */
    cu_text_add(&src, "        const %s o = i / %lld, a = i / %lld %% %lld, r = i %% %lld;\n", idx, (long long)(n * inner),
                (long long)inner, (long long)n, (long long)inner);
    for (int t = 0; t < node->n_in; t++) {
        int64_t len = cu_inv(c, t)->shape[axis];
        cu_text_add(&src, "        %sif (a < %lld) y[i] = x%d[(o * %lld + a - %lld) * %lld + r];\n", t ? "else " : "",
                    (long long)(at + len), t, (long long)len, (long long)at, (long long)inner);
        at += len;
    }
    if (at != n) return cu_fail(c, "parts cover %lld of %lld", (long long)at, (long long)n);
    cu_text_add(&src, "    }\n}\n");
    return cu_launch(c, "concat", src.s, cu_grid(total), (CuDim){CU_BLOCK, 1, 1}, 0, args, node->n_in + 1);
}

/* slice(x, axis, start, len): positions [start, start + len) along the axis. */
int cuda_slice(CuCtx *c)
{
    const Node *node = cu_node(c);
    const Value *x = cu_inv(c, 0);
    int axis = norm_axis(ir_attr_int(c->g, node, "axis", 0), x->rank);
    int64_t n, inner, start = ir_attr_int(c->g, node, "start", 0), len = ir_attr_int(c->g, node, "len", 0);
    if (axis < 0 || axis >= x->rank) return cu_fail(c, "axis %d out of range for rank %d", axis, x->rank);
    around_axis(x, axis, &n, &inner);
    if (start < 0 || len < 0 || start + len > n)
        return cu_fail(c, "[%lld, +%lld) out of %lld", (long long)start, (long long)len, (long long)n);
    char *at = cu_fmt(c, "i / %lld * %lld + %lld + i %% %lld", (long long)(len * inner), (long long)(n * inner),
                      (long long)(start * inner), (long long)(len * inner));
    return gather(c, "slice", at);
}
