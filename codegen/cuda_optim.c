/* codegen/cuda_optim.c: the CUDA emitters of the optimizer step: lr_at, clip_coef,
 * count_step, scale_update (one thread each: they compute a scalar; codegen/kernels/
 * step.cuh's templates), adamw and sgd, and adamw_cast and sgd_cast that also write the 16-bit
 * params (a grid-stride loop over a flat unit's buffer or shard, one launch per unit;
 * codegen/kernels/optim.cuh's templates).
 *
 * runtime/cpu/optim.c is the reference, operation for operation: the same float
 * expressions per element, the same step-dependent factors computed in double and
 * rounded to float once, attributes rounded as the CPU rounds them (compiled in as exact
 * literals). Scalars (lr, coef, the norm, the loss scale) are read on the device, so the
 * step needs no host round trip; a NaN coef (clip_coef's skipped step) makes adamw, sgd
 * and count_step leave everything untouched. Everything is f32, with i32 counts.
 */
#include "cuda.h"

static double attr(CuCtx *c, const char *key) { return ir_attr_float(c->g, cu_node(c), key, 0); }

/* The first n inputs f32; with grad16 the update's gradient, input 1, may be f16 or bf16
 * too (the optimizer pass folds a 16-bit gradient's cast up into the update), and so may
 * sgd's momentum buffer without momentum, which is the gradient itself. */
static int want_f32_but(CuCtx *c, int n, int grad16)
{
    const Node *node = cu_node(c);
    for (int i = 0; i < n; i++)
        if (cu_inv(c, i)->dtype != DT_F32 &&
            !(grad16 && ir_in(c->g, node, i) == ir_in(c->g, node, 1) && cu_inv(c, i)->dtype != DT_I32))
            return cu_fail(c, "input %d is %s; the optimizer takes f32 only", i, dtype_name(cu_inv(c, i)->dtype));
    return 0;
}
static int want_f32(CuCtx *c, int n) { return want_f32_but(c, n, 0); }

/* A one-thread kernel over the node's inputs then outputs, with these parameters. */
static int single(CuCtx *c, const char *prefix, const char *src)
{
    const Node *n = cu_node(c);
    int args[IR_MAX_IN + IR_MAX_OUT], k = 0;
    for (int i = 0; i < n->n_in; i++) args[k++] = ir_in(c->g, n, i);
    for (int i = 0; i < n->n_out; i++) args[k++] = ir_out(c->g, n, i);
    return cu_launch(c, prefix, src, (CuDim){1, 1, 1}, (CuDim){1, 1, 1}, 0, args, k);
}

/* lr_at(step; lr, schedule, warmup, steps, min_lr, decay_frac): linear warmup, then constant
 * (0) or a decay to min_lr: cosine (1), linear (2), wsd (3) over ops_lr_decay's steps. */
int cuda_lr_at(CuCtx *c)
{
    int64_t schedule = ir_attr_int(c->g, cu_node(c), "schedule", 0), warmup = ir_attr_int(c->g, cu_node(c), "warmup", 0),
            steps = ir_attr_int(c->g, cu_node(c), "steps", 0), start, len;
    if (schedule < 0 || schedule >= OPS_LR_COUNT) return cu_fail(c, "unknown schedule %lld", (long long)schedule);
    if (cu_inv(c, 0)->dtype != DT_I32) return cu_fail(c, "the step must be i32");
    ops_lr_decay((int)schedule, warmup, steps, ir_attr_float(c->g, cu_node(c), "decay_frac", 0.2), &start, &len);
    cu_use(c, "step.cuh");
    return single(c, "lr_at",
                  cu_kernel(c, 0, "const int *step, float *out",
                            cu_fmt(c, "fs_lr_at<%d, %lldLL, %lldLL, %lldLL>(step, out, %s, %s)", (int)schedule,
                                   (long long)warmup, (long long)start, (long long)len, cu_double(c, attr(c, "lr")),
                                   cu_double(c, attr(c, "min_lr")))));
}

/* clip_coef(norm; max_norm, skip_nonfinite) = min(1, max_norm / (norm + 1e-6)); 1 when
 * max_norm <= 0; for a norm that is not finite, NaN (skip the step) or 1. */
int cuda_clip_coef(CuCtx *c)
{
    if (want_f32(c, 1)) return -1;
    int skip = ir_attr_int(c->g, cu_node(c), "skip_nonfinite", 0) != 0;
    cu_use(c, "step.cuh");
    return single(c, "clip_coef",
                  cu_kernel(c, 0, "const float *norm, float *out",
                            cu_fmt(c, "fs_clip_coef<%s>(norm, out, %s)", skip ? "true" : "false",
                                   cu_double(c, attr(c, "max_norm")))));
}

/* count_step(count, coef): the optimizer's step count advances unless the step is skipped. */
int cuda_count_step(CuCtx *c)
{
    if (cu_inv(c, 0)->dtype != DT_I32 || cu_inv(c, 1)->dtype != DT_F32) return cu_fail(c, "needs i32 and f32 scalars");
    cu_use(c, "step.cuh");
    return single(c, "count_step", cu_kernel(c, 0, "int *count, const float *coef", "fs_count_step(count, coef)"));
}

/* scale_update(norm, scale, good; growth_interval): GradScaler's update: an overflow
 * halves the scale, growth_interval good steps in a row double it. */
int cuda_scale_update(CuCtx *c)
{
    if (want_f32(c, 2) || cu_inv(c, 2)->dtype != DT_I32) return cu_fail(c, "needs f32, f32 and i32 scalars");
    int64_t interval = ir_attr_int(c->g, cu_node(c), "growth_interval", 2000);
    cu_use(c, "step.cuh");
    return single(c, "scale_update",
                  cu_kernel(c, 0, "const float *norm, float *scale, int *good",
                            cu_fmt(c, "fs_scale_update<%d>(norm, scale, good)", (int)interval)));
}

/* A grid-stride launch of optim.cuh's update `call` over input 0's elements (the unit's
 * buffer or shard); parameters `params`, the node's inputs in order. */
static int update(CuCtx *c, const char *prefix, const char *params, const char *call)
{
    int64_t n = ir_numel(cu_inv(c, 0));
    if (n == 0) return 0;
    const Node *node = cu_node(c);
    int args[IR_MAX_IN];
    for (int i = 0; i < node->n_in; i++) args[i] = ir_in(c->g, node, i);
    cu_use(c, "optim.cuh");
    return cu_launch(c, prefix, cu_kernel(c, 0, params, call), cu_grid(n), (CuDim){CU_BLOCK, 1, 1}, 0, args,
                     node->n_in);
}

/* The template arguments (the gradient's type, CAST, w's type) and the parameter of w, input
 * `at`, for adamw_cast and sgd_cast (at < 0: adamw and sgd, none: their gradient's type is deduced). */
static const char *cast_targs(CuCtx *c, int at)
{
    return at < 0 ? "" : cu_fmt(c, ", %s, true, %s", cu_tin(c, 1), cu_tin(c, at));
}
static const char *cast_param(CuCtx *c, int at) { return at < 0 ? "" : cu_fmt(c, ", %s *w", cu_tin(c, at)); }

/* adamw(p, g, m, v, lr, coef, step; beta1, beta2, eps, weight_decay), as torch.optim.AdamW;
 * adamw_cast(p, g, m, v, lr, coef, step, w; ...) writes w = p after (w at input 7). */
static int adamw(CuCtx *c, int w)
{
    if (want_f32_but(c, 6, 1)) return -1;
    if (cu_inv(c, 6)->dtype != DT_I32) return cu_fail(c, "the step must be i32");
    int64_t n = ir_numel(cu_inv(c, 0));
    double b1 = attr(c, "beta1"), b2 = attr(c, "beta2");
    float w1 = (float)(1.0 - b1);
    const char *params = cu_fmt(c, "float *p, const %s *g, float *m, float *v, const float *lr, const float *coef, "
                                   "const int *step%s", cu_tin(c, 1), cast_param(c, w));
    const char *call = cu_fmt(c, "fs_adamw<%s, %lldLL, %s%s>(p, g, m, v, lr, coef, step, %s, %s, %s, %s, %s, %s, "
                              "%s%s)", cu_index(n), (long long)n, w1 < 0.5f ? "true" : "false", cast_targs(c, w),
                              cu_double(c, attr(c, "weight_decay")), cu_double(c, b1), cu_double(c, b2),
                              cu_float(c, w1), cu_float(c, (float)b2), cu_float(c, (float)(1.0 - b2)),
                              cu_float(c, (float)attr(c, "eps")), w < 0 ? "" : ", w");
    return update(c, w < 0 ? "adamw" : "adamw_cast", params, call);
}
int cuda_adamw(CuCtx *c) { return adamw(c, -1); }
int cuda_adamw_cast(CuCtx *c) { return adamw(c, 7); }

/* sgd(p, g, buf, lr, coef, step; momentum, weight_decay): dampening 0, no nesterov;
 * sgd_cast(p, g, buf, lr, coef, step, w; ...) writes w = p after (w at input 6). */
static int sgd(CuCtx *c, int w)
{
    if (want_f32_but(c, 5, 1)) return -1;
    if (cu_inv(c, 5)->dtype != DT_I32) return cu_fail(c, "the step must be i32");
    int64_t n = ir_numel(cu_inv(c, 0));
    float mom = (float)attr(c, "momentum");
    const char *params = cu_fmt(c, "float *p, const %s *g, float *buf, const float *lr, const float *coef, "
                                   "const int *step%s", cu_tin(c, 1), cast_param(c, w));
    const char *call = cu_fmt(c, "fs_sgd<%s, %lldLL, %s%s>(p, g, buf, lr, coef, step, %s, %s%s)", cu_index(n),
                              (long long)n, mom != 0.0f ? "true" : "false", cast_targs(c, w),
                              cu_float(c, mom), cu_float(c, (float)attr(c, "weight_decay")), w < 0 ? "" : ", w");
    return update(c, w < 0 ? "sgd" : "sgd_cast", params, call);
}
int cuda_sgd(CuCtx *c) { return sgd(c, -1); }
int cuda_sgd_cast(CuCtx *c) { return sgd(c, 6); }
