/* codegen/cuda_loss.c: CUDA launches of cross_entropy, cross_entropy_bwd and
 * cross_entropy_fused, instances of codegen/kernels/loss.cuh. Semantics are
 * runtime/cpu/embed.c's.
 *
 * The forward is two kernels: a row kernel (cuda_rows.h) writes each row's logsumexp and
 * target logit into the op's second output, then one block adds the rows' terms in f64 in
 * the order every backend uses (ops/ops.h: OPS_LOSS_BLOCKS), so the loss does not depend
 * on timing and the rows are spread over the whole GPU. The backward is one row kernel.
 * target_count is one block. The fused op (passes/xent.c) is the forward's two kernels, its row kernel also writing
 * dlogits over the logits: one pointer, the logits' (input 0, read and written), stands
 * for both, since two restrict pointers to the same bytes would be undefined.
 *
 * Where it sits: called by codegen_cuda (cuda_program.c) through the op table.
 */
#include "cuda_rows.h"

/* The loss's shape: logits (rows, V) of which the first W columns are the model's (the
 * `valid` attribute: passes/pad_vocab.c), and its ignore_index (OPS_NO_IGNORE: none); -1
 * (cu_fail) unless float logits and i32 targets. A gradient with an ignore_index needs its
 * dloss divided by the count already (per_row: ir/grad.c), so no kernel counts per row. */
static int loss_shape(CuCtx *c, const char *op, int64_t *rows, int64_t *V, int64_t *W, int64_t *ignore)
{
    if (!dtype_is_float(cu_inv(c, 0)->dtype) || cu_inv(c, 1)->dtype != DT_I32)
        return cu_fail(c, "%s: float logits and i32 targets only", op);
    const Value *lg = cu_inv(c, 0);
    *V = lg->shape[lg->rank - 1], *rows = ir_numel(lg) / *V;
    *ignore = ir_attr_int(c->g, cu_node(c), "ignore_index", OPS_NO_IGNORE);
    *W = ir_attr_int(c->g, cu_node(c), "valid", 0);
    if (!*W) *W = *V;
    if (ops_ignores(*ignore) && *rows >= (1 << 24))
        return cu_fail(c, "%s: ignore_index over %lld rows (at most 2^24 - 1)", op, (long long)*rows);
    if (cu_node(c)->op != OP_cross_entropy && ops_ignores(*ignore) && !ir_attr_int(c->g, cu_node(c), "per_row", 0))
        return cu_fail(c, "%s: an ignore_index without its count (per_row): a plan from an older fsc; compile it again",
                       op);
    cu_use(c, "loss.cuh");
    return 0;
}

/* The forward's second kernel: output 0, the mean of output 1's rows' terms over the rows
 * that count, in one block. */
static int mean_launch(CuCtx *c, const char *prefix, int64_t rows, int64_t ignore)
{
    const char *mean = cu_kernel(
        c, 0, cu_fmt(c, "const float *__restrict__ terms, const int *__restrict__ tg, %s", cu_pout(c, 0, "loss")),
        cu_fmt(c, "fs_xent_mean<%lldLL, %d, %lldLL>(terms, tg, loss)", (long long)rows, OPS_LOSS_BLOCKS,
               (long long)ignore));
    return cu_launch(c, prefix, mean, (CuDim){1, 1, 1}, (CuDim){OPS_LOSS_BLOCKS, 1, 1}, 0,
                     (int[]){cu_out_id(c, 1), cu_in_id(c, 1), cu_out_id(c, 0)}, 3);
}

/* cross_entropy(logits, targets) -> f32 [], terms (rows, 2) f32 */
int cuda_cross_entropy(CuCtx *c)
{
    int64_t rows, V, W, ignore;
    if (loss_shape(c, "cross_entropy", &rows, &V, &W, &ignore)) return -1;
    RowGeo geo = row_geo(rows, V);
    const char *terms = cu_kernel(
        c, 0, cu_fmt(c, "%s, const int *__restrict__ tg, float *__restrict__ terms", cu_pin(c, 0, "lg")),
        cu_fmt(c, "fs_xent_rows<%s, %lldLL, %lldLL, %lldLL, %lldLL>(lg, tg, terms)", row_targs(c, &geo),
               (long long)rows, (long long)V, (long long)ignore, (long long)W));
    if (row_launch(c, "cross_entropy", terms, &geo, (int[]){cu_in_id(c, 0), cu_in_id(c, 1), cu_out_id(c, 1)}, 3))
        return -1;
    return mean_launch(c, "cross_entropy", rows, ignore);
}

/* cross_entropy_fused(logits, targets, dloss) -> f32 [], terms (rows, 2) f32, dlogits (over the logits) */
int cuda_cross_entropy_fused(CuCtx *c)
{
    int64_t rows, V, W, ignore;
    if (loss_shape(c, "cross_entropy_fused", &rows, &V, &W, &ignore)) return -1;
    RowGeo geo = row_geo(rows, V);
    const char *src = cu_kernel(
        c, 0,
        cu_fmt(c, "%s, const int *__restrict__ tg, %s, float *__restrict__ terms", cu_pout(c, 2, "x"),
               cu_pin(c, 2, "dloss")),
        cu_fmt(c, "fs_xent_fused<%s, %lldLL, %lldLL, %lldLL, %lldLL>(x, tg, dloss, terms)", row_targs(c, &geo),
               (long long)rows, (long long)V, (long long)ignore, (long long)W));
    if (row_launch(c, "cross_entropy_fused", src, &geo,
                   (int[]){cu_in_id(c, 0), cu_in_id(c, 1), cu_in_id(c, 2), cu_out_id(c, 1)}, 4))
        return -1;
    return mean_launch(c, "cross_entropy_fused", rows, ignore);
}

/* cross_entropy_bwd(logits, targets, dloss) -> dlogits */
int cuda_cross_entropy_bwd(CuCtx *c)
{
    int64_t rows, V, W, ignore;
    if (loss_shape(c, "cross_entropy_bwd", &rows, &V, &W, &ignore)) return -1;
    RowGeo geo = row_geo(rows, V);
    const char *src = cu_kernel(
        c, 0,
        cu_fmt(c, "%s, const int *__restrict__ tg, %s, %s", cu_pin(c, 0, "lg"), cu_pin(c, 2, "dloss"), cu_pout(c, 0, "dx")),
        cu_fmt(c, "fs_xent_bwd<%s, %lldLL, %lldLL, %lldLL, %lldLL>(lg, tg, dloss, dx)", row_targs(c, &geo),
               (long long)rows, (long long)V, (long long)ignore, (long long)W));
    return row_launch(c, "cross_entropy_bwd", src, &geo,
                      (int[]){cu_in_id(c, 0), cu_in_id(c, 1), cu_in_id(c, 2), cu_out_id(c, 0)}, 4);
}

/* target_count(targets; ignore_index) -> f32 []: one block counts them (loss.cuh). */
int cuda_target_count(CuCtx *c)
{
    const Value *tg = cu_inv(c, 0);
    int64_t n = ir_numel(tg), ignore = ir_attr_int(c->g, cu_node(c), "ignore_index", OPS_NO_IGNORE);
    if (tg->dtype != DT_I32 || !ops_ignores(ignore)) return cu_fail(c, "target_count: i32 targets and an ignore_index");
    if (n >= (1 << 24)) return cu_fail(c, "target_count: %lld targets (at most 2^24 - 1)", (long long)n);
    cu_use(c, "loss.cuh");
    const char *src = cu_kernel(c, 256, "const int *__restrict__ tg, float *__restrict__ out",
                                cu_fmt(c, "fs_target_count<%lldLL, %lldLL>(tg, out)", (long long)n, (long long)ignore));
    return cu_launch(c, "target_count", src, (CuDim){1, 1, 1}, (CuDim){256, 1, 1}, 0,
                     (int[]){cu_in_id(c, 0), cu_out_id(c, 0)}, 2);
}
