/* codegen/cuda_reduce.c: CUDA launches of the reductions: sum, mean, max, sum_to,
 * max_bwd, softmax, softmax_bwd, and the gradient norm's sumsq_parts and sum_parts.
 * Semantics are runtime/cpu/reduce.c's. The kernels are codegen/kernels/reduce.cuh's
 * templates, instantiated with the shapes, dtypes, dim groups and geometry.
 *
 * sum, mean, max and sum_to share one engine, as on the CPU: x's dims, unit dims
 * dropped and neighbours of one kind merged, alternate between kept and reduced groups
 * (at most IR_MAX_RANK), and the output holds the kept groups in order. Then
 *   - nothing reduced: a copy (times mean's scale);
 *   - innermost group reduced: each output element reduces runs of x, by one thread,
 *     one warp or one block (by the reduced count), lanes strided over the runs;
 *   - innermost group kept: a block of 32 x BY threads takes 32 adjacent output
 *     columns, its BY rows of threads stride down the reduced index, and thread row 0
 *     adds the BY partial results in order.
 * Offsets are compiled in as divisions by constants (index.cuh's FsIndex, cu_index_at).
 * The axis ops (max_bwd, softmax, softmax_bwd) view x as (outer, n, inner): a row kernel
 * (cuda_rows.h) when inner is 1, else one thread per (outer, inner) column walking down n.
 *
 * Every sum runs in an order fixed by the shapes (and the launch geometry, which is
 * compiled in): results are bitwise reproducible run to run, though not bitwise the
 * CPU's (f32 sums in another order). No atomics anywhere. The norm's first stage,
 * sumsq_parts, is a block per OPS_SUMSQ_CHUNK elements of a flat gradient, each writing
 * its chunk's sum in f64 rounded once (so the chunk sums are the CPU's but for the order
 * of f64 additions); sum_parts adds them up in one block.
 *
 * Where it sits: called by codegen_cuda (cuda_program.c) through the op table.
 */
#include "cuda_rows.h"

typedef enum { RED_SUM, RED_MAX } RedOp;

/* x's dims grouped (see the file comment); strides in elements, contiguous. */
typedef struct {
    int n;
    int64_t sz[IR_MAX_RANK], st[IR_MAX_RANK];
    int red[IR_MAX_RANK];
} Groups;

static Groups groups_of(const Value *x, const int *red)
{
    Groups g = {0};
    for (int d = 0; d < x->rank; d++) {
        if (x->shape[d] == 1) continue;
        if (g.n > 0 && g.red[g.n - 1] == (red[d] != 0)) g.sz[g.n - 1] *= x->shape[d];
        else g.sz[g.n] = x->shape[d], g.red[g.n] = red[d] != 0, g.n++;
    }
    if (g.n > 0) g.st[g.n - 1] = 1;
    for (int d = g.n - 2; d >= 0; d--) g.st[d] = g.st[d + 1] * g.sz[d + 1];
    return g;
}

/* The kept (red 0) or the reduced (red 1) groups of g, outermost first. */
typedef struct {
    int n;
    int64_t sz[IR_MAX_RANK], st[IR_MAX_RANK];
} Split;

static Split groups_with(const Groups *g, int red)
{
    Split s = {0};
    for (int d = 0; d < g->n; d++)
        if (g->red[d] == red) s.sz[s.n] = g->sz[d], s.st[s.n++] = g->st[d];
    return s;
}

/* The kernel's parameters and call arguments: x in, out out, and the scale. */
static char *xo_params(CuCtx *c) { return cu_fmt(c, "%s, %s", cu_pin(c, 0, "x"), cu_pout(c, 0, "out")); }
static char *xo_args(CuCtx *c, float scale) { return cu_fmt(c, "(x, out, %s)", cu_float(c, scale)); }

/* A launch of one thread for each of n items, 256 to a block. */
static int flat_launch(CuCtx *c, const char *prefix, const char *src, int64_t n, const int *args, int n_args)
{
    CuDim grid;
    if (cu_grid1(c, cu_cdiv(n, 256), &grid)) return -1;
    return cu_launch(c, prefix, src, grid, (CuDim){256, 1, 1}, 0, args, n_args);
}

/* Nothing reduced: the output is x in the same order, times scale. */
static int emit_copy(CuCtx *c, const char *prefix, int64_t n, float scale)
{
    const char *call = cu_fmt(c, "fs_reduce_copy<%lldLL>%s", (long long)n, xo_args(c, scale));
    const char *src = cu_kernel(c, 0, xo_params(c), call);
    return flat_launch(c, prefix, src, n, (int[]){cu_in_id(c, 0), cu_out_id(c, 0)}, 2);
}

/* Innermost group reduced: output element `row` reduces nred elements at kept offset
 * + reduced offset, its threads strided over them. */
static int emit_runs(CuCtx *c, const char *prefix, RedOp op, const Groups *g, int64_t nout, int64_t nred, float scale)
{
    Split k = groups_with(g, 0), r = groups_with(g, 1);
    // a thread for a few elements, a warp for some, a block of 256 for many
    RowGeo geo = nred <= 32 ? row_geo_thread(nout) : nred <= 4096 ? row_geo(nout, 1) : row_geo(nout, ROW_WARP_MAX + 1);
    const char *call = cu_fmt(c, "fs_reduce_runs<%s, %s, %lldLL, %lldLL, %s, %s>%s", row_targs(c, &geo),
                              op == RED_MAX ? "true" : "false", (long long)nout, (long long)nred,
                              cu_index_at(c, k.n, k.sz, k.st), cu_index_at(c, r.n, r.sz, r.st), xo_args(c, scale));
    const char *src = cu_kernel(c, 0, xo_params(c), call);
    return row_launch(c, prefix, src, &geo, (int[]){cu_in_id(c, 0), cu_out_id(c, 0)}, 2);
}

/* Innermost group kept: see the file comment. */
static int emit_cols(CuCtx *c, const char *prefix, RedOp op, const Groups *g, int64_t nout, int64_t nred, float scale)
{
    Split k = groups_with(g, 0), r = groups_with(g, 1);
    int64_t inner = k.sz[k.n - 1], rows = nout / inner, ncb = cu_cdiv(inner, 32);
    int by = nred >= 512 ? 32 : 8;
    const char *call = cu_fmt(c, "fs_reduce_cols<%s, %lldLL, %lldLL, %lldLL, %d, %s, %s>%s",
                              op == RED_MAX ? "true" : "false", (long long)inner, (long long)ncb, (long long)nred, by,
                              cu_index_at(c, k.n - 1, k.sz, k.st), cu_index_at(c, r.n, r.sz, r.st), xo_args(c, scale));
    const char *src = cu_kernel(c, 0, xo_params(c), call);
    CuDim grid;
    if (cu_grid1(c, rows * ncb, &grid)) return -1;
    return cu_launch(c, prefix, src, grid, (CuDim){32, by, 1}, 0, (int[]){cu_in_id(c, 0), cu_out_id(c, 0)}, 2);
}

/* out = scale * (x reduced by op over the dims d with red[d]). */
static int emit_engine(CuCtx *c, const char *prefix, RedOp op, const int *red, float scale)
{
    const Value *x = cu_inv(c, 0), *o = cu_outv(c, 0);
    if (!dtype_is_float(x->dtype) || !dtype_is_float(o->dtype)) return cu_fail(c, "%s: float tensors only", prefix);
    cu_use(c, "reduce.cuh");
    Groups g = groups_of(x, red);
    int64_t nout = ir_numel(o), nred = ir_numel(x) / nout;
    int any = 0;
    for (int d = 0; d < g.n; d++) any |= g.red[d];
    if (!any) return emit_copy(c, prefix, nout, scale);
    if (g.red[g.n - 1]) return emit_runs(c, prefix, op, &g, nout, nred, scale);
    return emit_cols(c, prefix, op, &g, nout, nred, scale);
}

static int emit_axis_reduce(CuCtx *c, const char *prefix, RedOp op, int mean)
{
    const Value *x = cu_inv(c, 0);
    int axis = cu_axis(ir_attr_int(c->g, cu_node(c), "axis", -1), x->rank), red[IR_MAX_RANK] = {0};
    if (axis < 0) return cu_fail(c, "%s: axis out of range for rank %d", prefix, x->rank);
    red[axis] = 1;
    return emit_engine(c, prefix, op, red, mean ? 1.0f / (float)x->shape[axis] : 1.0f);
}

int cuda_sum(CuCtx *c) { return emit_axis_reduce(c, "sum", RED_SUM, 0); }
int cuda_mean(CuCtx *c) { return emit_axis_reduce(c, "mean", RED_SUM, 1); }
int cuda_max(CuCtx *c) { return emit_axis_reduce(c, "max", RED_MAX, 0); }

/* sum_to(x, shape): the output's dims align right with x's; leading dims of x, and
 * output dims of 1 that are not 1 in x, are summed. */
int cuda_sum_to(CuCtx *c)
{
    const Value *x = cu_inv(c, 0), *o = cu_outv(c, 0);
    int off = x->rank - o->rank, red[IR_MAX_RANK] = {0};
    if (off < 0) return cu_fail(c, "sum_to: rank %d to %d", x->rank, o->rank);
    for (int d = 0; d < x->rank; d++) {
        if (d < off) {
            red[d] = 1;
            continue;
        }
        int64_t want = o->shape[d - off];
        if (want != x->shape[d] && want != 1)
            return cu_fail(c, "sum_to: dim %d: %lld does not reduce to %lld", d, (long long)x->shape[d], (long long)want);
        red[d] = want != x->shape[d];
    }
    return emit_engine(c, "sum_to", RED_SUM, red, 1.0f);
}

/* ---- axis ops ------------------------------------------------------------------------ */

/* The (outer, n, inner) view of input 0 around the attribute `axis`; -1 (cu_fail) when
 * out of range. */
static int axis_view(CuCtx *c, const char *op, int64_t *outer, int64_t *n, int64_t *inner)
{
    const Value *x = cu_inv(c, 0);
    int axis = cu_axis(ir_attr_int(c->g, cu_node(c), "axis", -1), x->rank);
    if (axis < 0) return cu_fail(c, "%s: axis out of range for rank %d", op, x->rank);
    if (!dtype_is_float(x->dtype)) return cu_fail(c, "%s: float tensors only", op);
    cu_around(x, axis, outer, n, inner);
    return 0;
}

/* An axis op's one kernel (reduce.cuh): fs_OP_cols over (outer, inner) columns when inner
 * > 1, else fs_OP_rows, its rows by row_geo of `row_len` (1: a warp whatever the length);
 * `params` and `args` as cu_kernel's, `ids` the launch's. */
static int emit_axis_op(CuCtx *c, const char *op, int64_t row_len, const char *params, const char *args,
                        const int *ids, int n_ids)
{
    int64_t outer = 0, n = 0, inner = 0;  // set unless axis_view fails (gcc cannot see that)
    if (axis_view(c, op, &outer, &n, &inner)) return -1;
    cu_use(c, "reduce.cuh");
    if (inner > 1) {
        const char *call = cu_fmt(c, "fs_%s_cols<%lldLL, %lldLL, %lldLL>%s", op, (long long)outer, (long long)n,
                                  (long long)inner, args);
        return flat_launch(c, op, cu_kernel(c, 0, params, call), outer * inner, ids, n_ids);
    }
    RowGeo geo = row_geo(outer, row_len ? row_len : n);
    const char *call =
        cu_fmt(c, "fs_%s_rows<%s, %lldLL, %lldLL>%s", op, row_targs(c, &geo), (long long)outer, (long long)n, args);
    return row_launch(c, op, cu_kernel(c, 0, params, call), &geo, ids, n_ids);
}

/* max_bwd(x, dy, axis, keepdim): dx is dy at the first maximum along the axis, 0
 * elsewhere; dy holds outer * inner elements whether or not the axis was kept. Rows are
 * warps whatever their length (the warp reduces (max, index) pairs). */
int cuda_max_bwd(CuCtx *c)
{
    const char *params = cu_fmt(c, "%s, %s, %s", cu_pin(c, 0, "x"), cu_pin(c, 1, "dy"), cu_pout(c, 0, "dx"));
    int ids[3] = {cu_in_id(c, 0), cu_in_id(c, 1), cu_out_id(c, 0)};
    return emit_axis_op(c, "max_bwd", 1, params, "(x, dy, dx)", ids, 3);
}

/* softmax(x, axis): y = exp(x - max) / sum(exp(x - max)), as 1/sum times each term. */
int cuda_softmax(CuCtx *c)
{
    return emit_axis_op(c, "softmax", 0, cu_fmt(c, "%s, %s", cu_pin(c, 0, "x"), cu_pout(c, 0, "y")), "(x, y)",
                        (int[]){cu_in_id(c, 0), cu_out_id(c, 0)}, 2);
}

/* softmax_bwd(y, dy, axis): dx = y * (dy - sum(dy * y)). */
int cuda_softmax_bwd(CuCtx *c)
{
    return emit_axis_op(c, "softmax_bwd", 0,
                        cu_fmt(c, "%s, %s, %s", cu_pin(c, 0, "y"), cu_pin(c, 1, "dy"), cu_pout(c, 0, "dx")),
                        "(y, dy, dx)", (int[]){cu_in_id(c, 0), cu_in_id(c, 1), cu_out_id(c, 0)}, 3);
}

/* sumsq_parts(x) -> f32 [parts]: one block of 256 threads per OPS_SUMSQ_CHUNK elements
 * (reduce.cuh's fs_sumsq_parts), so a flat unit's gradient is one launch over the GPU. */
int cuda_sumsq_parts(CuCtx *c)
{
    const Value *x = cu_inv(c, 0);
    if (!dtype_is_float(x->dtype) || cu_outv(c, 0)->dtype != DT_F32)
        return cu_fail(c, "sumsq_parts: float in, f32 out");
    int64_t parts = ir_numel(cu_outv(c, 0));
    cu_use(c, "reduce.cuh");
    const char *src = cu_kernel(c, 256, cu_fmt(c, "%s, %s", cu_pin(c, 0, "x"), cu_pout(c, 0, "out")),
                                cu_fmt(c, "fs_sumsq_parts<256, %lldLL, %dLL>(x, out)", (long long)ir_numel(x),
                                       OPS_SUMSQ_CHUNK));
    CuDim grid;
    if (cu_grid1(c, parts, &grid)) return -1;
    return cu_launch(c, "sumsq_parts", src, grid, (CuDim){256, 1, 1}, 0, (int[]){cu_in_id(c, 0), cu_out_id(c, 0)}, 2);
}

/* sum_parts(*xs) -> f32 []: one block of 1024 threads (reduce.cuh's FsSumParts). */
int cuda_sum_parts(CuCtx *c)
{
    const Node *n = cu_node(c);
    int args[IR_MAX_IN + 1];
    CuText params = cu_text(c), call = cu_text(c);
    cu_text_add(&call, "FsSumParts<1024> s; ");
    for (int i = 0; i < n->n_in; i++) {
        if (cu_inv(c, i)->dtype != DT_F32) return cu_fail(c, "sum_parts: input %d is not f32", i);
        cu_text_add(&params, "%s, ", cu_pin(c, i, cu_fmt(c, "x%d", i)));
        cu_text_add(&call, "s.add(x%d, %lldLL); ", i, (long long)ir_numel(cu_inv(c, i)));
        args[i] = cu_in_id(c, i);
    }
    cu_text_add(&params, "%s", cu_pout(c, 0, "out"));
    cu_text_add(&call, "s.store(out)");
    args[n->n_in] = cu_out_id(c, 0);
    cu_use(c, "reduce.cuh");
    return cu_launch(c, "sum_parts", cu_kernel(c, 1024, params.s, call.s), (CuDim){1, 1, 1}, (CuDim){1024, 1, 1}, 0,
                     args, n->n_in + 1);
}
