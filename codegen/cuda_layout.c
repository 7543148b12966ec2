/* codegen/cuda_layout.c: CUDA launches of the ops that move elements without arithmetic:
 * copy, reshape, expand, transpose, permute, heads, merge_heads, slice (one gather each),
 * split, concat and slice_bwd; the kernels are codegen/kernels/layout.cuh's templates, instantiated
 * with the shapes and the element size. Semantics: runtime/cpu/layout.c, comm_local.c
 * (copy) and elementwise.c (expand).
 *
 * Every kernel moves raw bits (unsigned int for 4-byte dtypes, unsigned short for 2-byte
 * ones), so one kernel serves every dtype of a size. Each is a grid-stride loop over the
 * output's elements (cu_grid blocks of CU_BLOCK threads). A gather's source offset is a
 * type (cu_index_at: codegen/kernels/index.cuh) built from the output's dims and the
 * source's strides along them, so the shapes are template arguments, not text. split and
 * concat find their axis from the shapes, as the CPU kernels do.
 *
 * A reshape, or a copy, whose output is its input's bytes (same offset and rank stride
 * after memplan: a view) needs no instruction; nor a slice_view lying at its slice's
 * place in its input's bytes.
 *
 * Where it sits: called by codegen_cuda (cuda_program.c) through the op table.
 */
#include <string.h>

#include "cuda_rows.h"

static const char *bits(DType t) { return dtype_size(t) == 4 ? "unsigned int" : "unsigned short"; }

static int same_bytes(const Value *a, const Value *b)
{
    return a->offset == b->offset && a->rank_stride == b->rank_stride;
}

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* y[i] = x[base + AT(i)] for every element i of y, AT an FsIndex type (cu_index_at). */
static int gather(CuCtx *c, const char *prefix, int64_t base, const char *at)
{
    const Value *x = cu_inv(c, 0), *y = cu_outv(c, 0);
    int64_t n = ir_numel(y);
    if (n == 0) return 0;
    const char *T = bits(y->dtype), *from = base ? cu_fmt(c, "x + %lldLL", (long long)base) : "x";
    cu_use(c, "layout.cuh");
    char *src = cu_kernel(c, 0, cu_fmt(c, "const %s *x, %s *y", T, T),
                          cu_fmt(c, "fs_gather<%s, %lldLL, %s>(%s, y)", cu_index(max64(n, ir_numel(x))), (long long)n,
                                 at, from));
    return cu_launch(c, prefix, src, cu_grid(n), (CuDim){CU_BLOCK, 1, 1}, 0,
                     (const int[]){cu_in_id(c, 0), cu_out_id(c, 0)}, 2);
}

/* x (seen with shape xshape, rank dims) with its dims permuted: y's dim j is x's dim perm[j]. */
static int permuted(CuCtx *c, const char *prefix, int rank, const int64_t *xshape, const int *perm)
{
    int64_t xst[IR_MAX_RANK + 1], size[IR_MAX_RANK + 1], stride[IR_MAX_RANK + 1];
    xst[rank - 1] = 1;
    for (int d = rank - 2; d >= 0; d--) xst[d] = xst[d + 1] * xshape[d + 1];
    for (int j = 0; j < rank; j++) size[j] = xshape[perm[j]], stride[j] = xst[perm[j]];
    return gather(c, prefix, 0, cu_index_at(c, rank, size, stride));
}

/* x's dims a and b swapped. */
static int swapped(CuCtx *c, const char *prefix, int rank, const int64_t *xshape, int a, int b)
{
    int perm[IR_MAX_RANK + 1];
    for (int d = 0; d < rank; d++) perm[d] = d;
    perm[a] = b, perm[b] = a;
    return permuted(c, prefix, rank, xshape, perm);
}

/* x seen around an axis as (outer, n, inner), its positions [start, start + len) along
 * it: the offset in x, less start * inner, of element i of that part. */
static char *part_at(CuCtx *c, int64_t outer, int64_t n, int64_t inner, int64_t len)
{
    return cu_index_at(c, 2, (int64_t[]){outer, len * inner}, (int64_t[]){n * inner, 1});
}

static int norm_axis(int64_t axis, int rank) { return (int)(axis < 0 ? axis + rank : axis); }

int cuda_copy(CuCtx *c)
{
    int64_t n = ir_numel(cu_outv(c, 0));
    return same_bytes(cu_inv(c, 0), cu_outv(c, 0)) ? 0 : gather(c, "copy", 0, cu_index_at(c, 1, &n, (int64_t[]){1}));
}

int cuda_reshape(CuCtx *c) { return cuda_copy(c); }

int cuda_expand(CuCtx *c) { return gather(c, "expand", 0, cu_bcast_at(c, cu_outv(c, 0), cu_inv(c, 0))); }

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

/* Equal parts along the axis: output t holds positions [t len, (t + 1) len). Each thread
 * moves element i of every part. */
int cuda_split(CuCtx *c)
{
    const Node *node = cu_node(c);
    const Value *x = cu_inv(c, 0), *y0 = cu_outv(c, 0);
    int axis = differing_dim(x, y0);
    int64_t outer, n, inner, len = y0->shape[axis], part = ir_numel(y0);
    cu_around(x, axis, &outer, &n, &inner);
    if (len * node->n_out != n)
        return cu_fail(c, "%d parts of %lld do not cover %lld", node->n_out, (long long)len, (long long)n);
    if (part == 0) return 0;
    const char *T = bits(x->dtype);
    CuText params = cu_text(c), ys = cu_text(c);
    int args[IR_MAX_OUT + 1] = {cu_in_id(c, 0)};
    cu_text_add(&params, "const %s *x", T);
    for (int t = 0; t < node->n_out; t++) {
        cu_text_add(&params, ", %s *y%d", T, t);
        cu_text_add(&ys, ", y%d", t);
        args[t + 1] = cu_out_id(c, t);
    }
    cu_use(c, "layout.cuh");
    char *src = cu_kernel(c, 0, params.s,
                          cu_fmt(c, "fs_split<%s, %lldLL, %lldLL, %s>(x%s)", cu_index(ir_numel(x)), (long long)part,
                                 (long long)(len * inner), part_at(c, outer, n, inner, len), ys.s));
    return cu_launch(c, "split", src, cu_grid(part), (CuDim){CU_BLOCK, 1, 1}, 0, args, node->n_out + 1);
}

/* Each output element comes from the input whose range along the axis holds it. */
int cuda_concat(CuCtx *c)
{
    const Node *node = cu_node(c);
    const Value *y = cu_outv(c, 0);
    int axis = differing_dim(y, cu_inv(c, 0));
    int64_t outer, n, inner, total = ir_numel(y), at = 0;
    cu_around(y, axis, &outer, &n, &inner);
    if (total == 0) return 0;
    const char *T = bits(y->dtype);
    CuText params = cu_text(c), lens = cu_text(c), xs = cu_text(c);
    int args[IR_MAX_IN + 1];
    for (int t = 0; t < node->n_in; t++) {
        int64_t len = cu_inv(c, t)->shape[axis];
        cu_text_add(&params, "const %s *x%d, ", T, t);
        cu_text_add(&lens, ", %lldLL", (long long)len);
        cu_text_add(&xs, ", x%d", t);
        args[t] = cu_in_id(c, t);
        at += len;
    }
    if (at != n) return cu_fail(c, "parts cover %lld of %lld", (long long)at, (long long)n);
    args[node->n_in] = cu_out_id(c, 0);
    cu_text_add(&params, "%s *y", T);
    cu_use(c, "layout.cuh");
    char *src = cu_kernel(c, 0, params.s,
                          cu_fmt(c, "fs_concat<%s, %lldLL, %lldLL, %lldLL%s>(y%s)", cu_index(total), (long long)total,
                                 (long long)n, (long long)inner, lens.s, xs.s));
    return cu_launch(c, "concat", src, cu_grid(total), (CuDim){CU_BLOCK, 1, 1}, 0, args, node->n_in + 1);
}

/* slice(x, axis, start, len): positions [start, start + len) along the axis. */
int cuda_slice(CuCtx *c)
{
    const Node *node = cu_node(c);
    const Value *x = cu_inv(c, 0);
    int axis = norm_axis(ir_attr_int(c->g, node, "axis", 0), x->rank);
    int64_t outer, n, inner, start = ir_attr_int(c->g, node, "start", 0), len = ir_attr_int(c->g, node, "len", 0);
    if (axis < 0 || axis >= x->rank) return cu_fail(c, "axis %d out of range for rank %d", axis, x->rank);
    cu_around(x, axis, &outer, &n, &inner);
    if (start < 0 || len < 0 || start + len > n)
        return cu_fail(c, "[%lld, +%lld) out of %lld", (long long)start, (long long)len, (long long)n);
    return gather(c, "slice", start * inner, part_at(c, outer, n, inner, len));
}

/* slice_view (passes/slice_view.c): no instruction where memplan laid the output in x's
 * bytes at the slice's place, start x inner elements in; else the slice's gather. */
int cuda_slice_view(CuCtx *c)
{
    const Value *x = cu_inv(c, 0), *y = cu_outv(c, 0);
    int axis = norm_axis(ir_attr_int(c->g, cu_node(c), "axis", 0), x->rank);
    int64_t outer = 0, n = 0, inner = 0, start = ir_attr_int(c->g, cu_node(c), "start", 0);
    if (axis >= 0 && axis < x->rank) cu_around(x, axis, &outer, &n, &inner);
    int64_t at = x->offset + start * inner * (int64_t)dtype_size(x->dtype);
    return outer == 1 && y->offset == at && y->rank_stride == x->rank_stride ? 0 : cuda_slice(c);
}

/* slice_bwd(dy, axis, start, size): each output element is dy's or zero. */
int cuda_slice_bwd(CuCtx *c)
{
    const Node *node = cu_node(c);
    const Value *dy = cu_inv(c, 0), *y = cu_outv(c, 0);
    int axis = norm_axis(ir_attr_int(c->g, node, "axis", 0), y->rank);
    if (axis < 0 || axis >= y->rank) return cu_fail(c, "axis %d out of range for rank %d", axis, y->rank);
    int64_t outer, n, inner, start = ir_attr_int(c->g, node, "start", 0), len = dy->shape[axis], total = ir_numel(y);
    cu_around(y, axis, &outer, &n, &inner);
    if (start < 0 || start + len > n)
        return cu_fail(c, "[%lld, +%lld) out of %lld", (long long)start, (long long)len, (long long)n);
    if (total == 0) return 0;
    const char *T = bits(y->dtype);
    cu_use(c, "layout.cuh");
    char *src = cu_kernel(c, 0, cu_fmt(c, "const %s *dy, %s *y", T, T),
                          cu_fmt(c, "fs_slice_bwd<%s, %lldLL, %lldLL, %lldLL, %lldLL, %lldLL>(dy, y)", cu_index(total),
                                 (long long)total, (long long)n, (long long)inner, (long long)start, (long long)len));
    return cu_launch(c, "slice_bwd", src, cu_grid(total), (CuDim){CU_BLOCK, 1, 1}, 0,
                     (const int[]){cu_in_id(c, 0), cu_out_id(c, 0)}, 2);
}

/* pad(x, axis, start, size): slice_bwd's kernel (passes/pad_vocab.c's padded head). */
int cuda_pad(CuCtx *c) { return cuda_slice_bwd(c); }
