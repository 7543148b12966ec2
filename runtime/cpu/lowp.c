/* runtime/cpu/lowp.c: what 16-bit (f16, bf16) calls share: conversions of runs of
 * elements to and from f32, and the slab runner.
 *
 * Many kernels work on independent slabs: softmax on each (row, column) line along its
 * axis, layernorm on each row, attention on each (batch, head) slice. In 16 bits such
 * a kernel runs as its own f32 kernel on f32 copies of a group of slabs at a time, made
 * in the workspace: convert the group's 16-bit inputs, run, round the 16-bit outputs
 * back. The f32 kernel then sees the same values it would see in f32 storage, so the
 * 16-bit result is exactly its f32 result rounded once. How many slabs make a group
 * depends on the workspace size alone, and no f32 kernel's result for a slab depends
 * on how many slabs share its call, so results do not depend on the thread count.
 */
#include <string.h>

#include "cpu_impl.h"

#define CONV_CHUNK 16384  // elements per parallel conversion task

KSIMD void to_f32(float *dst, const void *src, int dtype, int64_t at, int64_t n)
{
    const uint16_t *h = (const uint16_t *)src + at;
    if (dtype == KT_BF16) {
        VEC_LOOP
        for (int64_t i = 0; i < n; i++) dst[i] = ld_bf16(h[i]);
    } else if (dtype == KT_F16) {
        VEC_LOOP
        for (int64_t i = 0; i < n; i++) dst[i] = ld_f16(h[i]);
    } else {
        memcpy(dst, (const float *)src + at, sizeof(float) * (size_t)n);
    }
}

KSIMD void from_f32(void *dst, int dtype, int64_t at, const float *src, int64_t n)
{
    uint16_t *h = (uint16_t *)dst + at;
    if (dtype == KT_BF16) {
        VEC_LOOP
        for (int64_t i = 0; i < n; i++) h[i] = st_bf16(src[i]);
    } else if (dtype == KT_F16) {
        VEC_LOOP
        for (int64_t i = 0; i < n; i++) h[i] = st_f16(src[i]);
    } else {
        memcpy((float *)dst + at, src, sizeof(float) * (size_t)n);
    }
}

KSIMD void add_to_f32(float *acc, const void *src, int dtype, int64_t at, int64_t n)
{
    const uint16_t *h = (const uint16_t *)src + at;
    const float *f = (const float *)src + at;
    if (dtype == KT_BF16) {
        VEC_LOOP
        for (int64_t i = 0; i < n; i++) acc[i] += ld_bf16(h[i]);
    } else if (dtype == KT_F16) {
        VEC_LOOP
        for (int64_t i = 0; i < n; i++) acc[i] += ld_f16(h[i]);
    } else {
        VEC_LOOP
        for (int64_t i = 0; i < n; i++) acc[i] += f[i];
    }
}

void to_f32_par(float *dst, const void *src, int dtype, int64_t at, int64_t n)
{
    int64_t tasks = (n + CONV_CHUNK - 1) / CONV_CHUNK;
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
    for (int64_t t = 0; t < tasks; t++)
        to_f32(dst + t * CONV_CHUNK, src, dtype, at + t * CONV_CHUNK, imin(CONV_CHUNK, n - t * CONV_CHUNK));
}

void from_f32_par(void *dst, int dtype, int64_t at, const float *src, int64_t n)
{
    int64_t tasks = (n + CONV_CHUNK - 1) / CONV_CHUNK;
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
    for (int64_t t = 0; t < tasks; t++)
        from_f32(dst, dtype, at + t * CONV_CHUNK, src + t * CONV_CHUNK, imin(CONV_CHUNK, n - t * CONV_CHUNK));
}

float kload(const KTensor *t, int64_t i)
{
    switch (t->dtype) {
    case KT_F16: return ld_f16(((const uint16_t *)t->data)[i]);
    case KT_BF16: return ld_bf16(((const uint16_t *)t->data)[i]);
    case KT_I32: return (float)((const int32_t *)t->data)[i];
    default: return ((const float *)t->data)[i];
    }
}

/* ---- the slab runner ---------------------------------------------------------------- */

typedef struct {
    int n;                               // tensors: inputs, then outputs
    const KTensor *t[2 * K_MAX_TENSORS];
    int at[2 * K_MAX_TENSORS];           // the dim each tensor's slab starts at; -1: whole
    int64_t slab[2 * K_MAX_TENSORS];     // elements of a slab (of the whole tensor if at < 0)
    int64_t outer;                       // slabs in each tensor that has them
    int64_t per, fixed;                  // workspace floats per slab (16-bit tensors), and for wholes
} SlabPlan;

static void slab_plan(const KCall *k, const Slabs *s, SlabPlan *p)
{
    int axis = s->axis >= 0 ? norm_axis(k_int(k, s->axis), k->in[0].rank) : 0;
    p->n = k->n_in + k->n_out, p->outer = -1, p->per = 0, p->fixed = 0;
    for (int i = 0; i < p->n; i++) {
        const KTensor *t = i < k->n_in ? &k->in[i] : &k->out[i - k->n_in];
        int at = s->at[i] == SLAB_WHOLE ? -1 : s->at[i] == SLAB_AXIS ? axis : t->rank - s->at[i];
        KCHECK(at < 0 || at <= t->rank, "16-bit call: slab at dim %d of a rank-%d tensor", at, t->rank);
        int64_t outer = 1;
        for (int d = 0; d < at; d++) outer *= t->shape[d];
        p->t[i] = t, p->at[i] = at, p->slab[i] = at < 0 ? t->numel : t->numel / imax(1, outer);
        if (at >= 0) {
            KCHECK(p->outer < 0 || p->outer == outer, "16-bit call: tensors have %lld and %lld slabs", (long long)p->outer,
                   (long long)outer);
            p->outer = outer;
        }
        if (lowp(t->dtype)) *(at < 0 ? &p->fixed : &p->per) += p->slab[i];
    }
    if (p->outer < 0) p->outer = 1;
}

CpuWork slab_work(const KCall *k, const Slabs *s)
{
    if (!lowp_call(k)) return (CpuWork){0, 0};
    SlabPlan p;
    slab_plan(k, s, &p);
    return (CpuWork){(size_t)(p.fixed + p.per), (size_t)(p.fixed + p.per * p.outer)};
}

/* The call on slabs [o0, o0 + g) of every tensor that has slabs: those of rank-r
 * tensors become [g, dims from the slab's start...] (or stay as they are when there is
 * one slab), 16-bit ones as f32 copies at ws; 16-bit wholes (inputs only) are copied
 * to wf once, for the first group. */
static void slab_call(const KCall *k, const Slabs *s, const SlabPlan *p, int64_t o0, int64_t g, float *wf, float *ws,
                      KCall *c)
{
    *c = *k;
    c->work = NULL, c->work_floats = 0;
    int reshape = p->outer > 1;
    if (reshape && s->axis >= 0) c->attr[s->axis] = 1;
    for (int i = 0; i < p->n; i++) {
        const KTensor *t = p->t[i];
        int input = i < k->n_in, whole = p->at[i] < 0;
        KTensor *u = input ? &c->in[i] : &c->out[i - k->n_in];
        int64_t from = whole ? 0 : o0 * p->slab[i], n = whole ? t->numel : g * p->slab[i];
        if (!whole && reshape) {
            u->rank = t->rank - p->at[i] + 1;
            u->shape[0] = g;
            for (int d = p->at[i]; d < t->rank; d++) u->shape[d - p->at[i] + 1] = t->shape[d];
            u->numel = n;
        }
        if (!lowp(t->dtype)) {
            u->data = (char *)t->data + from * esize(t->dtype);
            continue;
        }
        KCHECK(input || !whole, "16-bit call: an output without slabs");
        float **w = whole ? &wf : &ws;
        if (input && (!whole || o0 == 0)) to_f32_par(*w, t->data, t->dtype, from, n);
        u->data = *w, u->dtype = KT_F32;
        *w += n;
    }
}

void slab_run(const KCall *k, const Slabs *s, CpuKernel f32)
{
    SlabPlan p;
    slab_plan(k, s, &p);
    size_t least = (size_t)(p.fixed + p.per);
    KCHECK(k->work && k->work_floats >= least, "a 16-bit call needs a workspace of %zu floats, has %zu", least,
           k->work ? k->work_floats : 0);
    int64_t group = p.per ? imin(p.outer, (int64_t)((k->work_floats - (size_t)p.fixed) / (size_t)p.per)) : p.outer;
    for (int64_t o0 = 0; o0 < p.outer; o0 += group) {
        int64_t g = imin(group, p.outer - o0);
        KCall c;
        slab_call(k, s, &p, o0, g, k->work, k->work + p.fixed, &c);
        f32(&c);
        for (int i = k->n_in; i < p.n; i++)
            if (lowp(p.t[i]->dtype))
                from_f32_par(p.t[i]->data, p.t[i]->dtype, o0 * p.slab[i], c.out[i - k->n_in].data, g * p.slab[i]);
    }
}
