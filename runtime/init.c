/* runtime/init.c: parameter initialization with a counter-based RNG.
 *
 * Every random number in the runtime is Philox4x32-10 (ops/philox.h, which dropout's CPU
 * and CUDA kernels use too): a pure function of a 64-bit key and a 128-bit
 * counter, so any element can be made without the ones before it. A parameter's element
 * i is drawn from key = seed, counter = (i, FNV-1a 64 of the param's full name): each
 * rank of a sharded plan makes exactly its own slice, identical to the same slice of the
 * unsharded tensor, and the values do not depend on the thread count or the order in
 * which parameters are visited.
 *
 * One counter block gives four 32-bit words; an element uses one block:
 *   uniform(a, b)   a + (b - a) * u, u in [0, 1) from words 0-1 (53 bits)
 *   normal(0, std)  std * Box-Muller(u1 in (0, 1] from words 0-1, u2 in [0, 1) from words 2-3)
 * computed in double, rounded once to f32.
 *
 * Flat layouts (sharded plans): a unit's params are views into one flat buffer, and its
 * storage holds that buffer or one rank's shard of it. The storage is what gets
 * initialized: each param's part that falls in the range the storage holds on this rank,
 * by element index within the param, so every rank makes exactly its own slice and the
 * slices put together are the unsharded tensors. Views are never initialized on their own.
 * A padded param (passes/pad_vocab.c) is initialized as its logical tensor, its first
 * elements; its padding rows start at zero.
 *
 * 16-bit params an update writes (cast_in_update: adamw_cast, sgd_cast) are never drawn
 * nor saved: rt_exec_cast_params makes them from their master after init and after every
 * load, as the update's kernel would, so the first step reads what the master holds.
 */
#include <math.h>
#include <string.h>

#include "kernels.h"
#include "ops.h"
#include "philox.h"
#include "runtime.h"

void rt_philox(uint64_t key, const uint32_t ctr[4], uint32_t out[4]) { fs_philox(key, ctr[0], ctr[1], ctr[2], ctr[3], out); }

uint64_t rt_fnv1a(const char *s) { return plan_fnv1a(PLAN_FNV1A_INIT, s, strlen(s)); }

/* [0, 1) with 53 random bits. */
double rt_unit(uint32_t hi, uint32_t lo)
{
    return (double)((((uint64_t)hi << 32) | lo) >> 11) * 0x1p-53;
}

double rt_normal(const uint32_t w[4])
{
    double u1 = 1.0 - rt_unit(w[0], w[1]);  // (0, 1]: log(u1) is finite
    double u2 = rt_unit(w[2], w[3]);
    return sqrt(-2.0 * log(u1)) * cos(2.0 * 3.14159265358979323846 * u2);
}

void rt_init_param(const char *name, uint64_t seed, PlanInit kind, double a, double b, int64_t first, int64_t count,
                   float *out)
{
    if (kind == PLAN_INIT_NONE || kind == PLAN_INIT_ZEROS || kind == PLAN_INIT_ONES || kind == PLAN_INIT_FULL) {
        float v = kind == PLAN_INIT_ONES ? 1.0f : kind == PLAN_INIT_FULL ? (float)a : 0.0f;
        for (int64_t i = 0; i < count; i++) out[i] = v;
        return;
    }
    uint64_t h = rt_fnv1a(name);
    int normal = kind == PLAN_INIT_NORMAL;
#pragma omp parallel for schedule(static) if (count > 65536)
    for (int64_t i = 0; i < count; i++) {
        uint64_t at = (uint64_t)(first + i);
        uint32_t ctr[4] = {(uint32_t)at, (uint32_t)(at >> 32), (uint32_t)h, (uint32_t)(h >> 32)}, w[4];
        rt_philox(seed, ctr, w);
        out[i] = normal ? (float)(b + a * rt_normal(w)) : (float)(a + (b - a) * rt_unit(w[0], w[1]));
    }
}

/* ---- flat layouts ------------------------------------------------------------------- */

int rt_flat_is_storage(const Plan *p, int32_t id)
{
    const PlanTensor *t = &p->tensors[id];
    if (t->role != PLAN_ROLE_PARAM || t->alias != PLAN_NONE || t->unit == PLAN_NONE) return 0;
    if (t->sharded) return 1;
    /* A unit with params in it (plans built by hand may leave unit 0 on every tensor). */
    for (int32_t i = 0; i < p->n_tensors; i++)
        if (rt_flat_is_param(&p->tensors[i], t->unit)) return 1;
    return 0;
}

int rt_flat_is_param(const PlanTensor *t, int32_t unit)
{
    return t->role == PLAN_ROLE_PARAM && t->alias != PLAN_NONE && t->unit == unit && t->unit != PLAN_NONE &&
           t->name != PLAN_NONE && t->rank_stride == 0 && !t->sharded && t->tied_to == PLAN_NONE;
}

void rt_flat_held(const PlanTensor *s, int rank, int64_t *first, int64_t *count)
{
    *count = plan_tensor_numel(s);
    *first = s->flat_offset + (s->sharded ? (int64_t)rank * *count : 0);
}

int64_t rt_flat_length(const Plan *p, int32_t storage, int world)
{
    const PlanTensor *s = &p->tensors[storage];
    int64_t first, count, end;
    rt_flat_held(s, world - 1, &first, &count);
    end = first + count;
    for (int32_t i = 0; i < p->n_tensors; i++) {
        const PlanTensor *v = &p->tensors[i];
        if (rt_flat_is_param(v, s->unit) && v->flat_offset + plan_tensor_numel(v) > end)
            end = v->flat_offset + plan_tensor_numel(v);
    }
    return end;
}

int rt_flat_init(const Plan *p, int32_t storage, int rank, uint64_t seed, float *out, char *err, size_t errlen)
{
    const PlanTensor *s = &p->tensors[storage];
    if (s->dtype != PLAN_DT_F32)
        return plan_fail(err, errlen, "flat storage '%s' is %s; this fsexec initializes f32 storage only",
                       plan_str(p, s->name), plan_dtype_name(s->dtype));
    int64_t first, count;
    rt_flat_held(s, rank, &first, &count);
    memset(out, 0, sizeof *out * (size_t)count);
    for (int32_t i = 0; i < p->n_tensors; i++) {
        const PlanTensor *v = &p->tensors[i];
        if (!rt_flat_is_param(v, s->unit) || v->init == PLAN_INIT_NONE || v->init == PLAN_INIT_ZEROS) continue;
        int64_t lo = v->flat_offset > first ? v->flat_offset : first;
        int64_t hi = v->flat_offset + plan_tensor_logical_numel(v), held_end = first + count;  // padding rows: 0
        if (hi > held_end) hi = held_end;
        if (lo >= hi) continue;
        rt_init_param(plan_str(p, v->name), seed, v->init, v->init_a, v->init_b, lo - v->flat_offset, hi - lo,
                      out + (lo - first));
    }
    return 0;
}

void rt_flat_owned(const Plan *p, int32_t storage, int world, RtOwned *o)
{
    const PlanTensor *s = &p->tensors[storage];
    int64_t n = plan_tensor_numel(s), es = plan_dtype_size(s->dtype);
    if (s->sharded) {
        *o = (RtOwned){.flat_first = s->flat_offset, .flat_stride = n, .count = n, .byte_offset = s->offset};
        return;
    }
    /* A rank-strided view of a full buffer: the shard that rank updates. */
    for (int32_t i = 0; i < p->n_tensors && world > 1; i++) {
        const PlanTensor *v = &p->tensors[i];
        if (v->alias != storage || v->rank_stride == 0 || v->dtype != s->dtype) continue;
        *o = (RtOwned){.flat_first = s->flat_offset + (v->offset - s->offset) / es,
                       .flat_stride = v->rank_stride / es, .count = plan_tensor_numel(v),
                       .byte_offset = v->offset, .byte_stride = v->rank_stride};
        return;
    }
    *o = (RtOwned){.flat_first = s->flat_offset, .count = n, .byte_offset = s->offset, .replicated = 1};
}

/* ---- 16-bit params the update writes ------------------------------------------------ */

void rt_exec_cast_params(Exec *e)
{
    const Plan *p = rt_exec_plan(e);
    for (int32_t k = 0; k < p->n_ops; k++) {
        int at = ops_update_copy_input(op_lookup(plan_str(p, p->ops[k].op)));
        if (at < 0 || p->ops[k].n_in <= at) continue;
        int32_t master = p->ids[p->ops[k].in], w = p->ids[p->ops[k].in + at];
        const float *src = rt_exec_data(e, master);
        uint16_t *dst = rt_exec_data(e, w);
        int bf16 = p->tensors[w].dtype == PLAN_DT_BF16;
        int64_t n = plan_tensor_numel(&p->tensors[master]);
        if (!src || !dst) continue;  // a host mirror holds both (persistent state), or neither
#pragma omp parallel for schedule(static) if (n > 65536)
        for (int64_t i = 0; i < n; i++) dst[i] = bf16 ? cpu_f32_to_bf16(src[i]) : cpu_f32_to_f16(src[i]);
    }
}
