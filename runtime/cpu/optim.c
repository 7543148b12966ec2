/* runtime/cpu/optim.c: the optimizer step: lr_at (the learning-rate schedule),
 * clip_coef (global-norm clipping), adamw and sgd.
 *
 * Scalars travel as rank-0 tensors (f32; the step is an i32 holding the 1-based step
 * number) so the whole update is part of the plan. adamw and sgd follow
 * torch.optim.AdamW and torch.optim.SGD operation for operation (float arithmetic per
 * element, bias corrections in double as Python computes them) and update p and their
 * state in place; the gradient is scaled by the clipping coefficient first. Everything
 * here is f32 (and i32 counts), whatever the compute dtype: the optimizer stays fp32,
 * on fp32 master weights and fp32 gradients.
 */
#include <math.h>

#include "cpu_impl.h"

static float scalar_f(const KTensor *t) { return fdata(t)[0]; }

/* The first n inputs f32 (a broken plan otherwise: the precision pass casts first). */
static void want_f32(const KCall *k, int n, const char *op)
{
    for (int i = 0; i < n; i++)
        KCHECK(k->in[i].dtype == KT_F32, "%s: input %d has dtype %d; the optimizer takes f32 only", op, i, k->in[i].dtype);
}
static int64_t scalar_i(const KTensor *t) { return idata(t)[0]; }

/* lr_at(step; lr, schedule, warmup, steps, min_lr): 0 constant, 1 cosine; linear warmup
 * from lr/warmup at step 1 to lr at step == warmup under both. */
void cpu_lr_at(const KCall *k)
{
    int64_t step = scalar_i(&k->in[0]), warmup = k_int(k, 3), steps = k_int(k, 4);
    double lr = k->attr[1], min_lr = k->attr[5], out = lr;
    int schedule = k_int(k, 2);
    KCHECK(schedule == 0 || schedule == 1, "lr_at: unknown schedule %d", schedule);
    if (warmup > 0 && step <= warmup) {
        out = lr * (double)step / (double)warmup;
    } else if (schedule == 1) {
        double progress = (double)(step - warmup) / (double)imax(1, steps - warmup);
        progress = progress < 0 ? 0 : progress > 1 ? 1 : progress;
        out = min_lr + 0.5 * (lr - min_lr) * (1.0 + cos(KPI * progress));
    }
    fdata(&k->out[0])[0] = (float)out;
}

/* clip_coef(norm; max_norm) = min(1, max_norm / (norm + 1e-6)); 1 when max_norm <= 0. */
/* A norm that is not finite: with skip_nonfinite (an fp16 overflow) NaN, which skips
 * the step; without, 1, so the damage shows in the weights and the loss. */
void cpu_clip_coef(const KCall *k)
{
    want_f32(k, 1, "clip_coef");
    double norm = scalar_f(&k->in[0]), max_norm = k->attr[1], c = 1.0;
    if (!isfinite(norm)) {
        c = k->attr[2] != 0 ? NAN : 1.0;
    } else if (max_norm > 0) {
        c = max_norm / (norm + 1e-6);
        c = c < 1.0 ? c : 1.0;
    }
    fdata(&k->out[0])[0] = (float)c;
}

#define CHUNK 4096  // elements per task

/* adamw(p, g, m, v, lr, coef, step; beta1, beta2, eps, weight_decay) */
void cpu_adamw(const KCall *k)
{
    want_f32(k, 6, "adamw");
    int64_t n = k->in[0].numel, step = scalar_i(&k->in[6]);
    float *p = fdata(&k->in[0]), *m = fdata(&k->in[2]), *v = fdata(&k->in[3]);
    const float *g = fdata(&k->in[1]);
    double lr = scalar_f(&k->in[4]), b1 = k->attr[7], b2 = k->attr[8];
    float coef = scalar_f(&k->in[5]), eps = (float)k->attr[9];
    if (isnan(coef)) return;  // a skipped step
    float decay = (float)(1.0 - lr * k->attr[10]);
    float step_size = (float)(lr / (1.0 - pow(b1, (double)step)));
    float bc2_sqrt = (float)sqrt(1.0 - pow(b2, (double)step));
    float w1 = (float)(1.0 - b1), fb2 = (float)b2, w2 = (float)(1.0 - b2);
    int lerp_low = w1 < 0.5f;  // torch's lerp: two formulas, picked by the weight
    KCHECK(step >= 1, "adamw: step %lld is not 1-based", (long long)step);
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
    for (int64_t t = 0; t < (n + CHUNK - 1) / CHUNK; t++) {
        int64_t i1 = imin(n, (t + 1) * CHUNK);
        VEC_LOOP
        for (int64_t i = t * CHUNK; i < i1; i++) {
            float gi = g[i] * coef;
            m[i] = lerp_low ? m[i] + w1 * (gi - m[i]) : gi - (gi - m[i]) * (1.0f - w1);  // m.lerp_(g, 1 - beta1)
            v[i] = v[i] * fb2 + w2 * gi * gi;                                              // v.mul_(b2).addcmul_(g, g, 1 - b2)
            float denom = sqrtf(v[i]) / bc2_sqrt + eps;
            p[i] = p[i] * decay + -step_size * m[i] / denom;  // p.mul_(1 - lr wd).addcdiv_(m, denom, -step_size)
        }
    }
}

/* sgd(p, g, buf, lr, coef, step; momentum, weight_decay): dampening 0, no nesterov. */
void cpu_sgd(const KCall *k)
{
    want_f32(k, 5, "sgd");
    int64_t n = k->in[0].numel, step = scalar_i(&k->in[5]);
    float *p = fdata(&k->in[0]), *buf = fdata(&k->in[2]);
    const float *g = fdata(&k->in[1]);
    float lr = scalar_f(&k->in[3]), coef = scalar_f(&k->in[4]);
    float mom = (float)k->attr[6], wd = (float)k->attr[7];
    if (isnan(coef)) return;  // a skipped step
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
    for (int64_t t = 0; t < (n + CHUNK - 1) / CHUNK; t++) {
        int64_t i1 = imin(n, (t + 1) * CHUNK);
        VEC_LOOP
        for (int64_t i = t * CHUNK; i < i1; i++) {
            float d = g[i] * coef + wd * p[i];
            if (mom != 0.0f) {
                buf[i] = step == 1 ? d : buf[i] * mom + d;
                d = buf[i];
            }
            p[i] = p[i] - lr * d;
        }
    }
}

/* count_step(count, coef): the optimizer's own step count (AdamW's bias correction, SGD's
 * first momentum step) advances only on steps that are not skipped, as with PyTorch's
 * GradScaler, which skips optimizer.step() altogether. */
void cpu_count_step(const KCall *k)
{
    if (!isnan(scalar_f(&k->in[1]))) ((int32_t *)k->in[0].data)[0] += 1;
}

/* scale_update(norm, scale, good; growth_interval): torch.cuda.amp.GradScaler's update:
 * an overflow halves the scale and restarts the count of good steps; growth_interval
 * good steps in a row double it. */
void cpu_scale_update(const KCall *k)
{
    float *scale = fdata(&k->in[1]);
    int32_t *good = k->in[2].data;
    if (!isfinite(scalar_f(&k->in[0]))) {
        scale[0] *= 0.5f;
        good[0] = 0;
    } else if (++good[0] >= (int32_t)k->attr[3]) {
        scale[0] *= 2.0f;
        good[0] = 0;
    }
}
