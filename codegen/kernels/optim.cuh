// codegen/kernels/optim.cuh: the optimizer's updates, adamw and sgd, a grid-stride loop over
// the N elements of what they update: a flat unit's fp32 buffer, or this rank's shard of one
// (passes/shard.c), so a step launches one update per unit. codegen/cuda_optim.c
// instantiates them with N, the index type and the gradient's storage type, and passes the
// hyperparameters as literals, each as the CPU rounds it. runtime/cpu/optim.c is the
// reference, operation for operation: the same f32 expression per element, the
// step-dependent factors in double rounded to float once. A NaN coef (clip_coef's skipped
// step) leaves everything untouched. No __restrict__: sgd without momentum is given the
// gradient as its buffer (never read then). With CAST (adamw_cast, sgd_cast) each element's
// new p is also stored, rounded as a cast rounds, into w: the 16-bit params the next step's
// forward reads (passes/shard.c's cast_in_update).
#pragma once
#include "loop.cuh"

// adamw(p, g, m, v, lr, coef, step), as torch.optim.AdamW: w1 = 1 - beta1 and torch's lerp,
// which picks its formula by the weight (LERP_LOW: w1 < 0.5); b2 = beta2 and c2 = 1 - beta2
// as f32, beta1 and beta2 as double for the bias corrections.
template <class I, long long N, bool LERP_LOW, class TG, bool CAST = false, class TW = float>
__device__ __forceinline__ void fs_adamw(float *p, const TG *g, float *m, float *v, const float *lr_,
                                         const float *coef_, const int *step_, double weight_decay, double beta1,
                                         double beta2, float w1, float b2, float c2, float eps, TW *w = nullptr)
{
    const float coef = coef_[0];
    if (coef != coef) return;  // NaN: a skipped step
    const double lr = lr_[0], step = step_[0];
    const float decay = (float)(1.0 - lr * weight_decay);
    const float step_size = (float)(lr / (1.0 - pow(beta1, step)));
    const float bc2_sqrt = (float)sqrt(1.0 - pow(beta2, step));
    fs_grid_loop<I, N>([&](I i) {
        const float gi = ld(g, i) * coef, mi = m[i];
        const float m1 = LERP_LOW ? mi + w1 * (gi - mi) : gi - (gi - mi) * (1.0f - w1);  // m.lerp_(g, 1 - beta1)
        const float v1 = v[i] * b2 + c2 * gi * gi;  // v.mul_(beta2).addcmul_(g, g, 1 - beta2)
        m[i] = m1;
        v[i] = v1;
        const float denom = sqrtf(v1) / bc2_sqrt + eps;
        const float p1 = p[i] * decay + -step_size * m1 / denom;  // p.mul_(1 - lr wd).addcdiv_(m, denom, -step_size)
        p[i] = p1;
        if constexpr (CAST) st(w, i, p1);
    });
}

// sgd(p, g, buf, lr, coef, step): dampening 0, no nesterov; with MOMENTUM the buffer starts
// as the first step's update.
template <class I, long long N, bool MOMENTUM, class TG, bool CAST = false, class TW = float>
__device__ __forceinline__ void fs_sgd(float *p, const TG *g, float *buf, const float *lr_, const float *coef_,
                                       const int *step_, float momentum, float weight_decay, TW *w = nullptr)
{
    const float coef = coef_[0], lr = lr_[0];
    if (coef != coef) return;  // NaN: a skipped step
    const int step = step_[0];
    fs_grid_loop<I, N>([&](I i) {
        float d = ld(g, i) * coef + weight_decay * p[i];
        if constexpr (MOMENTUM) {
            const float b = step == 1 ? d : buf[i] * momentum + d;
            buf[i] = b;
            d = b;
        }
        const float p1 = p[i] - lr * d;
        p[i] = p1;
        if constexpr (CAST) st(w, i, p1);
    });
}
