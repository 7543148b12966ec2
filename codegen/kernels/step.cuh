// codegen/kernels/step.cuh: the optimizer step's scalars, one thread each, read and written
// on the device so a step needs no host round trip (codegen/cuda_optim.c launches them).
// runtime/cpu/optim.c is the reference, operation for operation: step-dependent factors in
// double, rounded to float once. A NaN coef (clip_coef's skipped step) makes the updates
// and count_step leave everything untouched.
#pragma once
#include "prelude.cuh"

// The learning rate at step: linear warmup over WARMUP steps, then constant (SCHEDULE 0), or
// a decay from lr to min_lr over the LEN steps after step START: a cosine (1), linear (2, and
// 3: wsd, whose START comes after a constant stretch); ops/ops.h's ops_lr_decay gives both.
template <int SCHEDULE, long long WARMUP, long long START, long long LEN>
__device__ __forceinline__ void fs_lr_at(const int *step_, float *out, double lr, double min_lr)
{
    const long long step = step_[0];
    if constexpr (WARMUP > 0) {
        if (step <= WARMUP) {
            out[0] = (float)(lr * (double)step / (double)WARMUP);
            return;
        }
    }
    double at = lr, progress = (double)(step - START) / (double)LEN;
    progress = progress < 0 ? 0 : progress > 1 ? 1 : progress;
    if constexpr (SCHEDULE == 1) at = min_lr + 0.5 * (lr - min_lr) * (1.0 + cos(3.14159265358979323846 * progress));
    if constexpr (SCHEDULE >= 2) at = lr - (lr - min_lr) * progress;
    out[0] = (float)at;
}

// min(1, max_norm / (norm + 1e-6)); 1 when max_norm <= 0; for a norm that is not finite,
// NaN (SKIP: the step is skipped) or 1.
template <bool SKIP> __device__ __forceinline__ void fs_clip_coef(const float *norm_, float *out, double max_norm)
{
    const double norm = norm_[0];
    double coef = 1.0;
    if (!fs_isfinite(norm_[0])) {
        coef = SKIP ? __longlong_as_double(0x7ff8000000000000LL) : 1.0;
    } else if (max_norm > 0) {
        coef = max_norm / (norm + 1e-6);
        coef = coef < 1.0 ? coef : 1.0;
    }
    out[0] = (float)coef;
}

// The optimizer's step count advances unless the step is skipped (coef NaN).
__device__ __forceinline__ void fs_count_step(int *count, const float *coef)
{
    if (coef[0] == coef[0]) count[0] += 1;
}

// GradScaler's update: an overflow halves the scale, INTERVAL good steps in a row double it.
template <int INTERVAL> __device__ __forceinline__ void fs_scale_update(const float *norm, float *scale, int *good)
{
    if (!fs_isfinite(norm[0])) {
        scale[0] *= 0.5f;
        good[0] = 0;
    } else if (++good[0] >= INTERVAL) {
        scale[0] *= 2.0f;
        good[0] = 0;
    }
}
