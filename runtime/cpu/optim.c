/* runtime/cpu/optim.c: the optimizer step: lr_at (the learning-rate schedule),
 * clip_coef (global-norm clipping), adamw and sgd; adamw_cast and sgd_cast, the same updates
 * that also write w, the 16-bit copy of the params they updated (passes/shard.c's
 * cast_in_update), rounded as cast.c rounds, from each chunk while it is in cache.
 *
 * Scalars travel as rank-0 tensors (f32; the step is an i32 holding the 1-based step
 * number) so the whole update is part of the plan. adamw and sgd follow
 * torch.optim.AdamW and torch.optim.SGD operation for operation (float arithmetic per
 * element, bias corrections in double as Python computes them) and update p and their
 * state in place; the gradient is scaled by the clipping coefficient first. Everything
 * here is f32 (and i32 counts), whatever the compute dtype: the optimizer stays fp32,
 * on fp32 master weights; a 16-bit gradient is read as it is and converted per element.
 *
 * adamw and sgd also run on the host for a GPU run whose optimizer is offloaded, so
 * they are built for speed: a step streams 28 bytes a param (adamw: read p, g, m, v,
 * write p, m, v) and is bound by memory bandwidth. Each is an OpenMP loop over
 * CHUNK-element tasks calling a KSIMD chunk function (AVX-512, AVX2 or baseline SSE,
 * picked when the program loads); the parallel region stays outside the cloned
 * function because GCC would not clone its outlined body. Inside, the loop-invariant
 * choices (torch's two lerp formulas, SGD's three momentum cases) are made once per
 * chunk, so each loop is branch-free and vectorizes under VEC_LOOP. This file is
 * built with -fno-math-errno (CMakeLists.txt): sqrtf's errno for a negative argument
 * (v never is) is what kept GCC from vectorizing it, and the result bits are IEEE's
 * either way. No -ffast-math and no FMA contraction (-std=c11), true division and
 * sqrtf: every element is computed by the same operations on every ISA and at any
 * thread count, so results are bitwise identical across both.
 * tests/py/host_optim.py checks all that against torch.optim; bench/host_adamw.py
 * times adamw against the copy bandwidth and PyTorch.
 */
#include <math.h>

#include "cpu_impl.h"
#include "ops.h"  // OPS_LR_*, ops_lr_decay

/* tests/py/host_optim.py checks each ISA's loops against the dispatched ones, bit for
 * bit: its copies of this file are built for one ISA (-mavx2, ...) with this defined. */
#ifdef FS_OPTIM_ONE_ISA
#undef KSIMD
#define KSIMD
#endif

static float scalar_f(const KTensor *t) { return fdata(t)[0]; }

/* The first n inputs f32 (a broken plan otherwise: the precision pass casts first), but
 * for the updates' gradient, input 1 (`grad16`), which may be 16-bit too, and so may sgd's
 * buffer without momentum, which is the gradient itself (never read then). */
static void want_f32(const KCall *k, int n, const char *op, int grad16)
{
    for (int i = 0; i < n; i++)
        KCHECK(k->in[i].dtype == KT_F32 ||
                   (grad16 && (i == 1 || k->in[i].data == k->in[1].data) && k->in[i].dtype != KT_I32),
               "%s: input %d has dtype %d; the optimizer takes f32 only", op, i, k->in[i].dtype);
}
static int64_t scalar_i(const KTensor *t) { return idata(t)[0]; }

/* lr_at(step; lr, schedule, warmup, steps, min_lr, decay_frac): linear warmup from
 * lr/warmup at step 1 to lr at step == warmup, then constant, or a decay from lr to min_lr
 * (cosine, linear; wsd: constant, then linear over the last decay_frac of the steps) over
 * the steps ops_lr_decay gives, min_lr after them. */
void cpu_lr_at(const KCall *k)
{
    int64_t step = scalar_i(&k->in[0]), warmup = k_int(k, 3), steps = k_int(k, 4), start, len;
    double lr = k->attr[1], min_lr = k->attr[5], out = lr;
    int schedule = k_int(k, 2);
    KCHECK(schedule >= 0 && schedule < OPS_LR_COUNT, "lr_at: unknown schedule %d", schedule);
    ops_lr_decay(schedule, warmup, steps, k->attr[6], &start, &len);
    double progress = (double)(step - start) / (double)len;
    progress = progress < 0 ? 0 : progress > 1 ? 1 : progress;
    if (warmup > 0 && step <= warmup)
        out = lr * (double)step / (double)warmup;
    else if (schedule == OPS_LR_COSINE)
        out = min_lr + 0.5 * (lr - min_lr) * (1.0 + cos(KPI * progress));
    else if (schedule != OPS_LR_CONSTANT)
        out = lr - (lr - min_lr) * progress;
    fdata(&k->out[0])[0] = (float)out;
}

/* clip_coef(norm; max_norm) = min(1, max_norm / (norm + 1e-6)); 1 when max_norm <= 0. */
/* A norm that is not finite: with skip_nonfinite (an fp16 overflow) NaN, which skips
 * the step; without, 1, so the damage shows in the weights and the loss. */
void cpu_clip_coef(const KCall *k)
{
    want_f32(k, 1, "clip_coef", 0);
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

/* One AdamW step's constants, as the element loop reads them. */
typedef struct {
    float coef;      // gradient scale (clipping, loss scaling)
    float w1, w1c;   // lerp weight 1 - beta1, and 1 - w1
    float b2, w2;    // beta2, 1 - beta2
    float bc2_sqrt;  // sqrt(1 - beta2^step)
    float eps;
    float decay;     // 1 - lr weight_decay
    float neg_step;  // -lr / (1 - beta1^step)
} AdamWStep;

/* One element, op for op as torch.optim.AdamW. torch's lerp has two formulas, picked by
 * the weight; `low` (w1 < 0.5) is a constant at each call, so the loops have no branch. */
KINLINE void adamw_one(AdamWStep s, int low, float *p, float g, float *m, float *v)
{
    float gi = g * s.coef;
    float mi = low ? *m + s.w1 * (gi - *m) : gi - (gi - *m) * s.w1c;  // m.lerp_(g, 1 - beta1)
    float vi = *v * s.b2 + s.w2 * gi * gi;                             // v.mul_(b2).addcmul_(g, g, 1 - b2)
    float denom = sqrtf(vi) / s.bc2_sqrt + s.eps;
    *p = *p * s.decay + s.neg_step * mi / denom;  // p.mul_(1 - lr wd).addcdiv_(m, denom, -step_size)
    *m = mi, *v = vi;
}

/* The gradient's element i as f32: the updates read f32, f16 and bf16 gradients (the
 * optimizer pass folds a 16-bit gradient's cast up into them). */
#define G_F32(g, i) ((g)[i])
#define G_F16(g, i) ld_f16((g)[i])
#define G_BF16(g, i) ld_bf16((g)[i])

#define ADAMW_CHUNK(NAME, GT, LD)                                                                          \
    KSIMD static void NAME(float *p, const GT *g, float *m, float *v, int64_t n, AdamWStep s)              \
    {                                                                                                      \
        if (s.w1 < 0.5f) {                                                                                 \
            VEC_LOOP                                                                                       \
            for (int64_t i = 0; i < n; i++) adamw_one(s, 1, &p[i], LD(g, i), &m[i], &v[i]);                \
        } else {                                                                                           \
            VEC_LOOP                                                                                       \
            for (int64_t i = 0; i < n; i++) adamw_one(s, 0, &p[i], LD(g, i), &m[i], &v[i]);                \
        }                                                                                                  \
    }
ADAMW_CHUNK(adamw_chunk, float, G_F32)
ADAMW_CHUNK(adamw_chunk_f16, uint16_t, G_F16)
ADAMW_CHUNK(adamw_chunk_bf16, uint16_t, G_BF16)

/* The constants of step `step`: bias corrections in double, as Python computes them. */
static AdamWStep adamw_step(double lr, double b1, double b2, double eps, double wd, float coef, int64_t step)
{
    float w1 = (float)(1.0 - b1);
    return (AdamWStep){
        .coef = coef, .w1 = w1, .w1c = 1.0f - w1, .b2 = (float)b2, .w2 = (float)(1.0 - b2),
        .bc2_sqrt = (float)sqrt(1.0 - pow(b2, (double)step)), .eps = (float)eps,
        .decay = (float)(1.0 - lr * wd), .neg_step = -(float)(lr / (1.0 - pow(b1, (double)step))),
    };
}

/* The checks of an adamw or adamw_cast call (its attributes follow its tensors: 7 or 8),
 * and its step's constants; 0 for a skipped step. */
static int adamw_prep(const KCall *k, AdamWStep *s)
{
    want_f32(k, 6, "adamw", 1);
    int64_t step = scalar_i(&k->in[6]);
    float coef = scalar_f(&k->in[5]);
    if (isnan(coef)) return 0;  // a skipped step
    KCHECK(step >= 1, "adamw: step %lld is not 1-based", (long long)step);
    const double *a = k->attr + k->n_in;
    *s = adamw_step(scalar_f(&k->in[4]), a[0], a[1], a[2], a[3], coef, step);
    return 1;
}

KSIMD static void store_bf16(uint16_t *w, const float *p, int64_t n)
{
    VEC_LOOP
    for (int64_t i = 0; i < n; i++) w[i] = st_bf16(p[i]);
}

KSIMD static void store_f16(uint16_t *w, const float *p, int64_t n)
{
    VEC_LOOP
    for (int64_t i = 0; i < n; i++) w[i] = st_f16(p[i]);
}

/* adamw_cast, sgd_cast: w's elements [i0, i0 + n), the 16-bit copy of p's just updated. */
static void store_w(const KCall *k, int at, int64_t i0, int64_t n)
{
    const KTensor *w = &k->in[at];
    KCHECK(w->dtype == KT_BF16 || w->dtype == KT_F16, "%s: w has dtype %d; it must be 16-bit",
           at == 7 ? "adamw_cast" : "sgd_cast", w->dtype);
    if (w->dtype == KT_BF16) store_bf16((uint16_t *)w->data + i0, fdata(&k->in[0]) + i0, n);
    else store_f16((uint16_t *)w->data + i0, fdata(&k->in[0]) + i0, n);
}

/* Elements [t CHUNK, (t + 1) CHUNK) of an adamw or adamw_cast call. */
static void adamw_task(const KCall *k, AdamWStep s, int64_t t)
{
    int64_t i0 = t * CHUNK, len = imin(CHUNK, k->in[0].numel - i0);
    float *p = fdata(&k->in[0]) + i0, *m = fdata(&k->in[2]) + i0, *v = fdata(&k->in[3]) + i0;
    const void *g = k->in[1].data;
    int gt = k->in[1].dtype;
    if (gt == KT_F32) adamw_chunk(p, (const float *)g + i0, m, v, len, s);
    else if (gt == KT_F16) adamw_chunk_f16(p, (const uint16_t *)g + i0, m, v, len, s);
    else adamw_chunk_bf16(p, (const uint16_t *)g + i0, m, v, len, s);
    if (k->n_in == 8) store_w(k, 7, i0, len);
}

static int64_t chunks(int64_t n) { return (n + CHUNK - 1) / CHUNK; }

/* adamw(p, g, m, v, lr, coef, step; beta1, beta2, eps, weight_decay) */
void cpu_adamw(const KCall *k)
{
    AdamWStep s;
    if (!adamw_prep(k, &s)) return;
    int64_t n = k->in[0].numel;
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
    for (int64_t t = 0; t < chunks(n); t++) adamw_task(k, s, t);
}

/* adamw_cast(p, g, m, v, lr, coef, step, w; beta1, beta2, eps, weight_decay): adamw, then w = p. */
void cpu_adamw_cast(const KCall *k) { cpu_adamw(k); }

/* n adamw (or adamw_cast) calls on disjoint buffers as one loop over all their chunks: each chunk is
 * computed as cpu_adamw computes it, so the bits are the same. first: n + 1 task
 * counts' prefix sums, filled here. */
void cpu_adamw_many(const KCall *const *k, int n, int64_t *first)
{
    AdamWStep s;
    first[0] = 0;
    for (int i = 0; i < n; i++) first[i + 1] = first[i] + (adamw_prep(k[i], &s) ? chunks(k[i]->in[0].numel) : 0);
    int64_t tasks = first[n];
#pragma omp parallel private(s) if (tasks > PAR_MIN / CHUNK)
    {
        int at = -1;  // the call whose constants s holds, on this thread
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tasks; t++) {
            int i = at < 0 ? 0 : at;
            while (first[i + 1] <= t) i++;
            if (i != at) adamw_prep(k[i], &s), at = i;
            adamw_task(k[i], s, t - first[i]);
        }
    }
}

/* One SGD step's constants; `form` says which of torch's three updates it is. */
enum { SGD_PLAIN, SGD_FIRST, SGD_MOMENTUM };  // no momentum; buf = d on step 1; buf = mom buf + d
typedef struct {
    float coef, wd, lr, mom;
    int form;
} SgdStep;

KINLINE void sgd_one(SgdStep s, int form, float *p, float g, float *buf)
{
    float d = g * s.coef + s.wd * *p;
    if (form == SGD_FIRST) *buf = d;
    if (form == SGD_MOMENTUM) *buf = d = *buf * s.mom + d;
    *p = *p - s.lr * d;
}

#define SGD_CHUNK(NAME, GT, LD)                                                                            \
    KSIMD static void NAME(float *p, const GT *g, float *buf, int64_t n, SgdStep s)                        \
    {                                                                                                      \
        if (s.form == SGD_PLAIN) {                                                                         \
            VEC_LOOP                                                                                       \
            for (int64_t i = 0; i < n; i++) sgd_one(s, SGD_PLAIN, &p[i], LD(g, i), &buf[i]);               \
        } else if (s.form == SGD_FIRST) {                                                                  \
            VEC_LOOP                                                                                       \
            for (int64_t i = 0; i < n; i++) sgd_one(s, SGD_FIRST, &p[i], LD(g, i), &buf[i]);               \
        } else {                                                                                           \
            VEC_LOOP                                                                                       \
            for (int64_t i = 0; i < n; i++) sgd_one(s, SGD_MOMENTUM, &p[i], LD(g, i), &buf[i]);            \
        }                                                                                                  \
    }
SGD_CHUNK(sgd_chunk, float, G_F32)
SGD_CHUNK(sgd_chunk_f16, uint16_t, G_F16)
SGD_CHUNK(sgd_chunk_bf16, uint16_t, G_BF16)

/* sgd(p, g, buf, lr, coef, step; momentum, weight_decay): dampening 0, no nesterov; and
 * sgd_cast(p, g, buf, lr, coef, step, w; momentum, weight_decay), which then writes w = p. */
void cpu_sgd(const KCall *k)
{
    want_f32(k, 5, "sgd", 1);
    int64_t n = k->in[0].numel, step = scalar_i(&k->in[5]);
    float *p = fdata(&k->in[0]), *buf = fdata(&k->in[2]);
    const void *g = k->in[1].data;
    int gt = k->in[1].dtype;
    const double *a = k->attr + k->n_in;  // the attributes follow the tensors: 6 or 7
    SgdStep s = {.coef = scalar_f(&k->in[4]), .wd = (float)a[1], .lr = scalar_f(&k->in[3]), .mom = (float)a[0]};
    if (isnan(s.coef)) return;  // a skipped step
    s.form = s.mom == 0.0f ? SGD_PLAIN : step == 1 ? SGD_FIRST : SGD_MOMENTUM;
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
    for (int64_t t = 0; t < (n + CHUNK - 1) / CHUNK; t++) {
        int64_t i0 = t * CHUNK;
        int64_t len = imin(CHUNK, n - i0);
        if (gt == KT_F32) sgd_chunk(p + i0, (const float *)g + i0, buf + i0, len, s);
        else if (gt == KT_F16) sgd_chunk_f16(p + i0, (const uint16_t *)g + i0, buf + i0, len, s);
        else sgd_chunk_bf16(p + i0, (const uint16_t *)g + i0, buf + i0, len, s);
        if (k->n_in == 7) store_w(k, 6, i0, len);
    }
}

void cpu_sgd_cast(const KCall *k) { cpu_sgd(k); }

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
