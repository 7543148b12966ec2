/* runtime/state.c: one rank's training state as pieces of named tensors, for checkpoints.
 *
 * A plan's state is every persistent tensor that training writes: the params' fp32
 * storage, the optimizer state, the step counter and the loss scale. A checkpoint never
 * stores it as one plan lays it out (flat buffers, shards, padding, memory spaces,
 * stages) but as logical tensors, the same for every plan of the model:
 *   - a param under its name ("h.0.attn.w"), in its shape (a padded vocabulary's own,
 *     passes/pad_vocab.c: its first elements; the padding rows are no piece, zero);
 *   - a param's optimizer state under the param's name and the state's, as torch's
 *     AdamW and SGD name it ("h.0.attn.w.exp_avg", ".exp_avg_sq", ".momentum_buffer"):
 *     the optimizer pass names every state tensor "<target>.<state>", and the target is
 *     the first input of the update op (an effect op) that reads the state;
 *   - any other state under its own name ("opt_step", "loss_scale",
 *     "loss_scale.good_steps").
 * A piece is elements [first, first + count) (row-major) of one logical tensor, at some
 * bytes of this rank's arenas. rt_state_new lists every piece a rank holds (what a load
 * fills; the holders' other bytes are padding, zero) and marks those it owns (what a
 * save writes). Over the world, every element of every logical tensor is owned exactly
 * once:
 *   - a rank's own part (the fsdp shard; zero1/zero2's shard of the fp32 params and its
 *     optimizer state) is its own;
 *   - a replicated holder (ddp, world 1, the counters) is split evenly over the stage's
 *     data-parallel ranks, so every rank writes a share;
 *   - a logical tensor that an earlier pipeline stage also holds (a tied embedding, the
 *     counters) is that stage's alone.
 */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "ops.h"
#include "runtime.h"

struct RtState {
    RtPiece *pieces;
    int32_t n, cap;
    char **names;        // every name made (and a padded param's logical shape), freed with the state
    int32_t n_names, cap_names;
    int32_t *holders;    // the root tensors the pieces lie in
    int32_t n_holders;
};

/* A param view of a flat unit, for the walk over a holder's range. */
typedef struct {
    int32_t unit, id;
    int64_t at, n;       // flat elements [at, at + n)
} View;

static int by_unit_at(const void *a, const void *b)
{
    const View *x = a, *y = b;
    if (x->unit != y->unit) return x->unit < y->unit ? -1 : 1;
    return x->at < y->at ? -1 : x->at > y->at;
}

typedef struct {
    const Plan *p;
    const Exec *e;       // NULL: no data
    int rank, dp;
    int shard;           // the ranks a shard is split over (plan_shard_group): a sharded holder lies at
                         // rank % shard, and its dp / shard replicas each write an even part of it
    int names;           // every logical tensor the plan holds, whole, whichever rank
    RtState *s;
    View *views;         // sorted by (unit, at); fsdp's second view of a param left out
    int32_t n_views;
    int32_t *target;     // by tensor: the update target whose state it is, or PLAN_NONE
    int failed;
} Walk;

static void *keep(Walk *w, char *name)
{
    RtState *s = w->s;
    if (!name) return w->failed = 1, NULL;
    if (s->n_names == s->cap_names) {
        int32_t cap = s->cap_names ? 2 * s->cap_names : 64;
        char **grown = plan_alloc(sizeof *grown * (size_t)cap);
        if (!grown) {
            plan_dealloc(name);
            return w->failed = 1, NULL;
        }
        if (s->n_names) memcpy(grown, s->names, sizeof *grown * (size_t)s->n_names);
        plan_dealloc(s->names);
        s->names = grown, s->cap_names = cap;
    }
    return s->names[s->n_names++] = name;
}

static const char *keep_name(Walk *w, char *name) { return keep(w, name); }

/* The logical shape of t (a padded param's own: passes/pad_vocab.c), kept with the state. */
static const int64_t *logical_shape(Walk *w, const PlanTensor *t)
{
    if (!t->logical_rows) return t->shape;
    int64_t *shape = plan_alloc(sizeof *shape * PLAN_MAX_RANK);
    if (shape) plan_tensor_logical_shape(t, shape);
    return keep(w, (char *)shape);
}

/* "name" or "name.suffix", kept with the state. */
static const char *logical_name(Walk *w, const char *name, const char *suffix)
{
    size_t a = strlen(name), b = suffix ? strlen(suffix) : 0;
    char *s = plan_alloc(a + b + 2);
    if (s) snprintf(s, a + b + 2, b ? "%s.%s" : "%s", name, suffix ? suffix : "");
    return keep_name(w, s);
}

static void add_piece(Walk *w, const RtPiece *piece)
{
    RtState *s = w->s;
    if (w->failed || !piece->name) return;
    if (s->n == s->cap) {
        int32_t cap = s->cap ? 2 * s->cap : 64;
        RtPiece *grown = plan_alloc(sizeof *grown * (size_t)cap);
        if (!grown) {
            w->failed = 1;
            return;
        }
        if (s->n) memcpy(grown, s->pieces, sizeof *grown * (size_t)s->n);
        plan_dealloc(s->pieces);
        s->pieces = grown, s->cap = cap;
    }
    s->pieces[s->n++] = *piece;
}

/* Elements [lo, hi) of logical tensor `name` (kind, shape of t), which sit at element
 * `at` of the holder's bytes; split where the owned range [own_lo, own_hi) starts and
 * ends. */
static void add_range(Walk *w, const char *name, RtStateKind kind, const PlanTensor *shape_of, int32_t holder,
                      int64_t lo, int64_t hi, int64_t at, int64_t own_lo, int64_t own_hi)
{
    const PlanTensor *h = &w->p->tensors[holder];
    const int64_t *shape = logical_shape(w, shape_of);
    uint8_t *base = w->e ? rt_exec_data(w->e, holder) : NULL;
    int64_t cut[4] = {lo, own_lo > lo ? (own_lo < hi ? own_lo : hi) : lo, own_hi < hi ? (own_hi > lo ? own_hi : lo) : hi,
                      hi};
    if (cut[2] < cut[1]) cut[2] = cut[1];
    for (int k = 0; k < 3; k++) {
        if (cut[k + 1] <= cut[k]) continue;
        RtPiece piece = {.name = name, .kind = kind, .dtype = h->dtype, .rank = shape_of->rank, .shape = shape,
                         .first = cut[k], .count = cut[k + 1] - cut[k], .holder = holder, .own = k == 1,
                         .data = base ? base + (at + cut[k] - lo) * plan_dtype_size(h->dtype) : NULL};
        add_piece(w, &piece);
    }
}

/* Holder t's elements as flat elements [*first, *first + *count) of its unit (*unit), or
 * (*unit PLAN_NONE) as a whole logical tensor of its own; and whether they are this rank's
 * own (a shard) rather than replicated over the stage's ranks. */
static int coords(const Walk *w, int32_t id, int64_t *first, int64_t *count, int32_t *unit)
{
    const Plan *p = w->p;
    const PlanTensor *t = &p->tensors[id];
    if (t->alias != PLAN_NONE) {  // a rank's shard view of a full flat buffer (zero1, zero2)
        const PlanTensor *s = &p->tensors[t->alias];
        int64_t es = plan_dtype_size(s->dtype);
        int sharded = coords(w, t->alias, first, count, unit);
        *first += (t->offset - s->offset) / es + (int64_t)(w->rank % w->shard) * (t->rank_stride / es);
        *count = plan_tensor_numel(t);
        return sharded || t->rank_stride != 0 || t->sharded;
    }
    if (rt_flat_is_storage(p, id)) {
        *unit = t->unit;
        rt_flat_held(t, w->rank % w->shard, first, count);
        return t->sharded;
    }
    *unit = PLAN_NONE, *first = 0, *count = plan_tensor_logical_numel(t);  // the rest of a padded param: zero
    return 0;
}

/* This rank's share [*lo, *hi) of a holder's range [first, first + count): all of it when
 * it is a shard (with hybrid sharding: its even part over the shard's replicas); else its
 * even part over the stage's ranks. */
static void share(const Walk *w, int sharded, int64_t first, int64_t count, int64_t *lo, int64_t *hi)
{
    int64_t k = sharded ? w->rank / w->shard : w->rank, n = sharded ? w->dp / w->shard : w->dp;
    *lo = first + count * k / n;
    *hi = first + count * (k + 1) / n;
}

/* The pieces of holder id: a param storage (target PLAN_NONE) or the optimizer state of
 * update target `target` (suffix: the state's name). */
static void holder_pieces(Walk *w, int32_t id, int32_t target, const char *suffix)
{
    const Plan *p = w->p;
    int64_t first, count, lo, hi;
    int32_t unit;
    int sharded = coords(w, target != PLAN_NONE ? target : id, &first, &count, &unit);
    RtStateKind kind = target != PLAN_NONE ? RT_STATE_OPTIM : RT_STATE_PARAM;
    if (target == PLAN_NONE && unit != PLAN_NONE) {  // a storage: zero1/zero2's rank-strided view is what it owns
        RtOwned o;
        rt_flat_owned(p, id, w->dp, &o);
        if (!o.replicated) {
            share(w, 1, o.flat_first + (int64_t)(w->rank % w->shard) * o.flat_stride, o.count, &lo, &hi);
        } else {
            share(w, sharded, first, count, &lo, &hi);
        }
    } else {
        share(w, sharded, first, count, &lo, &hi);
    }
    if (w->names && unit != PLAN_NONE) first = 0, count = INT64_MAX / 2;
    if (unit == PLAN_NONE) {
        const PlanTensor *named = &p->tensors[target != PLAN_NONE ? target : id];
        add_range(w, logical_name(w, plan_str(p, named->name), suffix), kind, named, id, 0, count, 0, lo, hi);
        return;
    }
    /* The unit's params, in flat order, over [first, first + count). */
    View key = {.unit = unit, .at = -1};
    int32_t v = 0, n = w->n_views;
    while (n > 0) {  // the first view of the unit
        int32_t half = n / 2;
        if (by_unit_at(&w->views[v + half], &key) < 0) v += half + 1, n -= half + 1;
        else n = half;
    }
    for (; v < w->n_views && w->views[v].unit == unit && !w->failed; v++) {
        const View *x = &w->views[v];
        int64_t a = x->at > first ? x->at : first, b = x->at + x->n < first + count ? x->at + x->n : first + count;
        if (a >= b) continue;
        const PlanTensor *pv = &p->tensors[x->id];
        add_range(w, logical_name(w, plan_str(p, pv->name), suffix), kind, pv, id, a - x->at, b - x->at, a - first,
                  lo - x->at, hi - x->at);
    }
}

/* The param views of every unit, by (unit, flat offset), each param once. */
static int collect_views(Walk *w)
{
    const Plan *p = w->p;
    if (!(w->views = plan_alloc(sizeof *w->views * (size_t)(p->n_tensors + 1)))) return -1;
    for (int32_t i = 0; i < p->n_tensors; i++) {
        const PlanTensor *t = &p->tensors[i];
        if (rt_flat_is_param(t, t->unit))
            w->views[w->n_views++] =
                (View){.unit = t->unit, .id = i, .at = t->flat_offset, .n = plan_tensor_logical_numel(t)};
    }
    qsort(w->views, (size_t)w->n_views, sizeof *w->views, by_unit_at);
    int32_t kept = 0;
    for (int32_t i = 0; i < w->n_views; i++) {
        const View *x = &w->views[i], *last = kept ? &w->views[kept - 1] : NULL;
        if (last && last->unit == x->unit && last->at == x->at && last->n == x->n) continue;  // fsdp's second view
        w->views[kept++] = *x;
    }
    w->n_views = kept;
    return 0;
}

/* For each optimizer state tensor, the param (or shard) it is the state of: an effect
 * op's first input when that is a param, its other inputs that are state of its size. */
static int find_targets(Walk *w)
{
    const Plan *p = w->p;
    if (!(w->target = plan_alloc(sizeof *w->target * (size_t)(p->n_tensors + 1)))) return -1;
    for (int32_t i = 0; i < p->n_tensors; i++) w->target[i] = PLAN_NONE;
    for (int32_t k = 0; k < p->n_ops; k++) {
        const PlanOp *op = &p->ops[k];
        const OpInfo *info = op_info_by_name(plan_str(p, op->op));
        if (!info || !(info->flags & OPF_EFFECT) || op->n_in < 2) continue;
        int32_t x = p->ids[op->in];
        PlanRole r = p->tensors[x].role;
        if (r != PLAN_ROLE_PARAM && r != PLAN_ROLE_MASTER) continue;
        for (int32_t j = 1; j < op->n_in; j++) {
            int32_t s = p->ids[op->in + j];
            const PlanTensor *st = &p->tensors[s];
            if (st->role == PLAN_ROLE_OPT_STATE && st->alias == PLAN_NONE &&
                plan_tensor_numel(st) == plan_tensor_numel(&p->tensors[x]))
                w->target[s] = x;
        }
    }
    return 0;
}

static int is_holder(const Plan *p, int32_t i)
{
    const PlanTensor *t = &p->tensors[i];
    return (t->role == PLAN_ROLE_PARAM || t->role == PLAN_ROLE_MASTER || t->role == PLAN_ROLE_OPT_STATE) &&
           t->alias == PLAN_NONE && t->tied_to == PLAN_NONE;
}

static RtState *walk(const Plan *p, const Exec *e, int rank, int dp, int names, char *err, size_t errlen)
{
    RtState *s = plan_alloc(sizeof *s);
    if (!s) {
        plan_fail(err, errlen, "out of memory");
        return NULL;
    }
    memset(s, 0, sizeof *s);
    Walk w = {.p = p, .e = e, .rank = rank, .dp = dp, .shard = (int)plan_shard_group(p, dp), .names = names, .s = s};
    int rc = collect_views(&w) || find_targets(&w) ||
             !(s->holders = plan_alloc(sizeof *s->holders * (size_t)(p->n_tensors + 1)));
    for (int32_t i = 0; i < p->n_tensors && !rc && !w.failed; i++) {
        if (!is_holder(p, i)) continue;
        const PlanTensor *t = &p->tensors[i];
        const char *name = plan_str(p, t->name);
        if (t->name == PLAN_NONE) {
            rc = plan_fail(err, errlen, "tensor %d (%s %s) is training state without a name: it cannot be saved", i,
                           plan_role_name(t->role), plan_dtype_name(t->dtype));
            break;
        }
        s->holders[s->n_holders++] = i;
        if (w.target[i] != PLAN_NONE) {
            const char *dot = strrchr(name, '.');
            if (!dot || !dot[1]) {
                rc = plan_fail(err, errlen, "optimizer state '%s' is not named <param>.<state>", name);
                break;
            }
            holder_pieces(&w, i, w.target[i], dot + 1);
        } else if (t->role != PLAN_ROLE_OPT_STATE) {
            holder_pieces(&w, i, PLAN_NONE, NULL);
        } else {  // the step's own state: a counter, the loss scale
            int64_t n = plan_tensor_numel(t), lo, hi;
            share(&w, 0, 0, n, &lo, &hi);
            const char *ln = logical_name(&w, name, NULL);
            add_range(&w, ln, RT_STATE_OTHER, t, i, 0, n, 0, lo, hi);
        }
    }
    plan_dealloc(w.views);
    plan_dealloc(w.target);
    if (!rc && w.failed) rc = plan_fail(err, errlen, "out of memory listing the training state");
    if (rc) {
        rt_state_free(s);
        return NULL;
    }
    return s;
}

static int by_name(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

RtState *rt_state_new(const Exec *e, char *err, size_t errlen)
{
    const Plan *p = rt_exec_plan(e), *whole = rt_exec_whole(e);
    RtState *s = walk(p, e, rt_exec_rank(e), rt_exec_world(e), 0, err, errlen);
    /* What an earlier stage holds is its to write. */
    for (int k = 0; s && k < rt_exec_stage(e); k++) {
        char why[512];
        Plan *one = plan_extract_program(whole, k, why, sizeof why);
        RtState *earlier = one ? walk(one, NULL, 0, 1, 1, why, sizeof why) : NULL;
        if (!earlier) {
            plan_fail(err, errlen, "stage %d: %s", k, why);
            plan_free(one);
            rt_state_free(s);
            return NULL;
        }
        const char **names = plan_alloc(sizeof *names * (size_t)(earlier->n + 1));
        for (int32_t i = 0; names && i < earlier->n; i++) names[i] = earlier->pieces[i].name;
        if (names) qsort(names, (size_t)earlier->n, sizeof *names, by_name);
        for (int32_t i = 0; names && i < s->n; i++)
            if (s->pieces[i].own && bsearch(&s->pieces[i].name, names, (size_t)earlier->n, sizeof *names, by_name))
                s->pieces[i].own = 0;
        int oom = !names;
        plan_dealloc(names);
        rt_state_free(earlier);
        plan_free(one);
        if (oom) {
            plan_fail(err, errlen, "out of memory");
            rt_state_free(s);
            return NULL;
        }
    }
    return s;
}

RtState *rt_state_of_plan(const Plan *p, char *err, size_t errlen) { return walk(p, NULL, 0, 1, 1, err, errlen); }

RtState *rt_state_at(const Plan *p, int rank, int dp, char *err, size_t errlen)
{
    return walk(p, NULL, rank, dp, 0, err, errlen);
}

void rt_state_free(RtState *s)
{
    if (!s) return;
    for (int32_t i = 0; i < s->n_names; i++) plan_dealloc(s->names[i]);
    plan_dealloc(s->names);
    plan_dealloc(s->pieces);
    plan_dealloc(s->holders);
    plan_dealloc(s);
}

int32_t rt_state_count(const RtState *s) { return s->n; }
const RtPiece *rt_state_piece(const RtState *s, int32_t i) { return &s->pieces[i]; }
int32_t rt_state_holders(const RtState *s, const int32_t **ids)
{
    *ids = s->holders;
    return s->n_holders;
}

const char *rt_state_kind_name(RtStateKind k)
{
    return k == RT_STATE_PARAM ? "param" : k == RT_STATE_OPTIM ? "optimizer" : "state";
}

/* ---- the domain of the state's values (what a checkpoint may hold) ------------------ */

static double value_at(const uint8_t *p, int64_t i, PlanDType dt)
{
    if (dt == PLAN_DT_I32) {
        int32_t v;
        memcpy(&v, p + 4 * i, 4);
        return v;
    }
    if (dt == PLAN_DT_F32) {
        float v;
        memcpy(&v, p + 4 * i, 4);
        return v;
    }
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    return dt == PLAN_DT_F16 ? cpu_f16_to_f32(h) : cpu_bf16_to_f32(h);
}

static int is_float(PlanDType dt) { return dt == PLAN_DT_F32 || dt == PLAN_DT_F16 || dt == PLAN_DT_BF16; }

static int ends_with(const char *s, const char *tail)
{
    size_t n = strlen(s), m = strlen(tail);
    return n >= m && !strcmp(s + n - m, tail);
}

int rt_state_check(const char *name, RtStateKind k, PlanDType dtype, const void *data, int64_t first, int64_t count,
                   int64_t step, char *err, size_t errlen)
{
    const uint8_t *p = data;
    int counter = !strcmp(name, "opt_step") || !strcmp(name, "loss_scale.good_steps") ||
                  !strcmp(name, "pending.opt_step");  // a delayed update's (passes/offload.c)
    int scale = !strcmp(name, "loss_scale"), second = k == RT_STATE_OPTIM && ends_with(name, ".exp_avg_sq");
    int coef = !strcmp(name, "pending.coef");  // NaN: no update pending, or a skipped step's
    const char *want = counter ? "i32" : "a float dtype (f32, f16, bf16)";
    if (counter ? dtype != PLAN_DT_I32 : !is_float(dtype))
        return plan_fail(err, errlen, "tensor '%s' is %s; a %s is %s", name, plan_dtype_name(dtype),
                         counter ? "step counter" : rt_state_kind_name(k), want);
    int64_t bad = counter || coef ? -1 : rt_st_first_nonfinite(p, count, dtype);
    const char *why = "a value in a checkpoint is finite";
    for (int64_t i = 0; bad < 0 && i < count && (counter || scale || second || coef); i++) {
        double v = value_at(p, i, dtype);
        if (counter && (v < 0 || v > (double)step)) bad = i, why = "a step counter is from 0 to the checkpoint's step";
        else if (coef && !isnan(v) && !(v > 0 && isfinite(v))) bad = i, why = "a pending coefficient is > 0 or NaN";
        else if (scale && !(v > 0)) bad = i, why = "a loss scale is > 0";
        else if (second && v < 0) bad = i, why = "a second moment (exp_avg_sq) is >= 0";
    }
    if (bad < 0) return 0;
    char value[48];
    snprintf(value, sizeof value, counter ? "%.0f" : "%.9g", value_at(p, bad, dtype));
    return plan_fail(err, errlen, "tensor '%s' element %" PRId64 " is %s, but %s: the checkpoint is damaged or was "
                     "not written by fsexec", name, first + bad, value, why);
}
