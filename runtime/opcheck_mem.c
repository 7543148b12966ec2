/* runtime/opcheck_mem.c: the memory plan of a plan, and the values kernels index with.
 *
 * rt_plan_check_layout: every tensor lies inside its space's arena (the program's) for every
 * rank of the world (offset + rank * rank_stride), roots 64-aligned and views aligned to
 * their dtype, every view inside a root tensor's bytes on every rank, live ranges inside
 * the ops, and flat offsets far enough from overflow for the flat layout's arithmetic.
 * (The executor checks the same for the world it runs; the words are the same.)
 *
 * rt_plan_check_values: a few kernels read values, not just shapes, and stop on a bad
 * one: embedding and embedding_bwd index rows, cross_entropy and its backward index
 * classes, adamw divides by 1 - beta^step (step >= 1), count_step and scale_update
 * increment i32 counters. For each such read this proves, from the plan alone, that the
 * value is in range whatever the data:
 *   - where it comes from: a data input (below the bound data.c checks it against, from
 *     the ops it reaches: rt_input_bound; blob labels below their class count), the
 *     "step" input (>= 1), a tensor that starts as zeros, an arange, or a copy of one of
 *     these through layout ops;
 *   - that nothing overwrites it between its write and the read: no op writes bytes that
 *     overlap it (outputs, and inputs an effect op updates in place), the debug modes do
 *     not poison (nan_fill, after a buffer's last use) or canary (guard, outside live
 *     buffers) it, and setup writes no other tensor over it. Bytes are compared over every
 *     rank's part (offset to offset + (world - 1) * rank_stride + bytes).
 *   - adamw's step is the "step" input, or a counter that a count_step(counter, coef)
 *     before it increments unless coef is NaN, with the same coef unchanged since: adamw
 *     returns before its check when coef is NaN, so the counter is >= 1 when it looks;
 *     or (a delayed update) such a pair as the step before copied it to the host, where
 *     the coef starts as NaN.
 * Counters overflow after 2^31 steps; that is not checked.
 * Also here: no op's output overlaps its inputs except where its kernel is written to
 * share bytes (kernels memcpy rows; an overlap would be undefined behaviour), and, as
 * the guard and memplan assume, an effect op updates in place only persistent state
 * (params, optimizer state, master weights).
 *
 * Float values are never proved: a float read after its buffer died gives NaN, which is
 * what nan_fill is for, not a stop.
 *
 * Where it sits: rt_plan_check_ops (opcheck.c) runs the layout check before the ops and
 * the value check after them, so these may rely on every op fitting the op table.
 */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ops.h"
#include "runtime.h"

enum { ARENA_ALIGN = 64, MAX_COPIES = 64 };
/* More than any machine gives one rank; below it, no sum or product of a few tensor
 * sizes (the shape rules make some) can overflow. */
#define MAX_ARENA ((int64_t)1 << 48)

/* ---- layout ----------------------------------------------------------------------------- */

static int check_tensor_layout(const Plan *p, int32_t i, int64_t world, char *err, size_t errlen)
{
    const PlanTensor *t = &p->tensors[i];
    int64_t arena = p->programs[0].space_bytes[t->place];
    int64_t n = plan_tensor_nbytes(t), es = plan_dtype_size(t->dtype), reach;
    int view = t->alias != PLAN_NONE;
    int64_t align = view ? es : ARENA_ALIGN;
    int overflow = __builtin_mul_overflow(t->rank_stride, world - 1, &reach);
    if (overflow || t->offset < 0 || t->offset % align || t->rank_stride % es || t->offset > arena ||
        n > arena - t->offset || reach > arena - t->offset - n)
        return plan_fail(err, errlen,
                       "tensor %d (%s): bytes [%lld, %lld) (rank stride %lld over %lld ranks) lie outside the %lld-byte "
                       "%s arena or are not %lld-aligned (plan damaged, or made by a different fsc)",
                         i, plan_tensor_label(p, i), (long long)t->offset, (long long)(t->offset + n),
                         (long long)t->rank_stride, (long long)world, (long long)arena, plan_place_name(t->place),
                         (long long)align);
    if (t->live_start < 0 || t->live_end < t->live_start || t->live_end > p->n_ops)
        return plan_fail(err, errlen, "tensor %d (%s): live range [%d, %d] outside the %d ops", i,
                         plan_tensor_label(p, i), t->live_start, t->live_end, p->n_ops);
    /* rt_flat_* adds rank * numel and numel to flat offsets. */
    int64_t flat_end;
    if (__builtin_mul_overflow(plan_tensor_numel(t), world + 1, &flat_end) || t->flat_offset > INT64_MAX / 2 - flat_end)
        return plan_fail(err, errlen, "tensor %d (%s): flat offset %lld is too large", i, plan_tensor_label(p, i),
                       (long long)t->flat_offset);
    if (!view) return 0;
    const PlanTensor *r = &p->tensors[t->alias];
    if (t->alias == i || r->alias != PLAN_NONE || r->rank_stride != 0 || t->offset < r->offset ||
        t->offset + reach + n > r->offset + plan_tensor_nbytes(r)) {
        char made[96] = "";
        if (t->producer != PLAN_NONE)
            snprintf(made, sizeof made, " made by op %d (%s)", t->producer, plan_str(p, p->ops[t->producer].op));
        return plan_fail(err, errlen, "tensor %d (%s)%s: alias %d is not a root tensor whose bytes hold this view's on "
                       "every rank", i, plan_tensor_label(p, i), made, t->alias);
    }
    return 0;
}

int rt_plan_check_layout(const Plan *p, char *err, size_t errlen)
{
    if (p->n_programs < 1)
        return plan_fail(err, errlen, "the plan has no program (no memory plan); recompile it with this version of fsc");
    const PlanProgram *prog = &p->programs[0];
    for (int s = 0; s < PLAN_PLACE_COUNT; s++)
        if (prog->space_bytes[s] > MAX_ARENA)
            return plan_fail(err, errlen, "the plan's %s arena of %lld bytes is more than a rank can address here (2^48)",
                             plan_place_name((PlanPlace)s), (long long)prog->space_bytes[s]);
    int64_t world = prog->dp_world, stages = plan_meta_int(p, "stages", 1);
    if (world > RT_MAX_WORLD || stages < 1 || stages > RT_MAX_WORLD ||
        world * stages != plan_meta_int(p, "world", world * stages))
        return plan_fail(err, errlen, "the plan's world of %lld ranks%s is not in [1, %d], or not its setting 'world'",
                         (long long)(world * stages), stages > 1 ? " (its stages x data-parallel ranks)" : "",
                         RT_MAX_WORLD);
    for (int32_t i = 0; i < p->n_tensors; i++)
        if (check_tensor_layout(p, i, plan_shard_group(p, world), err, errlen)) return -1;  // views: a shard group's
    return 0;
}

/* ---- the values kernels index with --------------------------------------------------------- */

typedef struct {
    int known;
    int64_t lo, hi;  // every value in [lo, hi]
} Bound;

static const Bound TOP = {0, 0, 0};

typedef struct {
    const Plan *p;
    int64_t world;
    int32_t *root;          // [n_tensors] the tensor whose buffer each lies in
    int64_t *lo, *hi;       // [n_tensors] bytes spanned over every rank
    int32_t *ok_upto;       // [n_tensors] intact() proved up to this op (-1: not yet)
    Bound *data;            // [n_tensors] what data.c leaves in each data input of this program (known: 0 for others)
    uint8_t *is_data;       // [n_tensors] whether it is one
    int32_t step;           // the "step" input the executor writes, or PLAN_NONE
    OpKind *kind;           // [n_ops] each op's kind (names are looked up once)
    Bound *made;            // [n_tensors] what its producer leaves in a tensor, once known
    uint8_t *made_known;    // [n_tensors] whether made[] is filled
    char why[384];          // why the last bound is not known
} Mem;

__attribute__((format(printf, 2, 3))) static void because(Mem *m, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->why, sizeof m->why, fmt, ap);
    va_end(ap);
}

static OpKind kind_of(const Mem *m, int32_t k) { return m->kind[k]; }
static int32_t in_of(const Plan *p, int32_t k, int i) { return p->ids[p->ops[k].in + i]; }
static int32_t out_of(const Plan *p, int32_t k, int i) { return p->ids[p->ops[k].out + i]; }

static int overlap(const Mem *m, int32_t a, int32_t b) { return m->lo[a] < m->hi[b] && m->lo[b] < m->hi[a]; }

/* The inputs an effect op updates in place (runtime/cpu/optim.c), as a bit mask; an
 * effect op not listed is taken to update all of them. */
static unsigned updated_inputs(OpKind k)
{
    static const unsigned mask[OP_COUNT] = {
        [OP_adamw] = 1u << 0 | 1u << 2 | 1u << 3,  // p, m, v
        [OP_sgd] = 1u << 0 | 1u << 2,              // p, buf
        [OP_adamw_cast] = 1u << 0 | 1u << 2 | 1u << 3 | 1u << 7,  // p, m, v, w
        [OP_sgd_cast] = 1u << 0 | 1u << 2 | 1u << 6,              // p, buf, w
        [OP_count_step] = 1u << 0,                 // count
        [OP_scale_update] = 1u << 1 | 1u << 2,     // scale, good
        [OP_attention_decode] = 1u << 3 | 1u << 4, // kcache, vcache
    };
    if (!(op_info(k)->flags & OPF_EFFECT) || (op_info(k)->flags & OPF_P2P)) return 0;  // a send reads its input
    return mask[k] ? mask[k] : ~0u;
}

/* A view op whose output lies in its input's bytes (a reshape on them, a slice_view at
 * its slice's place) moves no bytes (exec.c skips it). */
static int moves_nothing(const Mem *m, int32_t q, int32_t u)
{
    const Plan *p = m->p;
    if (!(op_info(kind_of(m, q))->flags & OPF_VIEW)) return 0;
    const PlanTensor *x = &p->tensors[in_of(p, q, 0)], *y = &p->tensors[u];
    return x->rank_stride == y->rank_stride && y->offset >= x->offset &&
           y->offset + plan_tensor_nbytes(y) <= x->offset + plan_tensor_nbytes(x);
}

/* Whether op q writes bytes of t, other than t's own making; `allow` and `slot` let one
 * kind of effect op update t itself (a counter's increments). */
static int clobbers(Mem *m, int32_t q, int32_t t, OpKind allow, int slot)
{
    const Plan *p = m->p;
    const PlanOp *op = &p->ops[q];
    OpKind kind = kind_of(m, q);
    for (int32_t i = 0; i < op->n_out; i++) {
        int32_t u = out_of(p, q, i);
        if (u != t && overlap(m, u, t) && !moves_nothing(m, q, u)) {
            because(m, "op %d (%s) writes tensor %d (%s) over its bytes", q, op_name(kind), u, plan_tensor_label(p, u));
            return 1;
        }
    }
    unsigned upd = updated_inputs(kind);
    for (int32_t i = 0; i < op->n_in && upd; i++) {
        int32_t u = in_of(p, q, i);
        if (!((upd >> i) & 1) || !overlap(m, u, t)) continue;
        if (u == t && kind == allow && i == slot) continue;
        because(m, "op %d (%s) updates tensor %d (%s) in place over its bytes", q, op_name(kind), u, plan_tensor_label(p, u));
        return 1;
    }
    return 0;
}

/* Whether t, as its producer (or setup, when none) left it, is what op r reads: nothing
 * writes, poisons or canaries its bytes in between (for a tensor set before the step:
 * during the whole step, since the next step reads it again). */
static int intact(Mem *m, int32_t t, int32_t r, OpKind allow, int slot)
{
    const Plan *p = m->p;
    const PlanTensor *x = &p->tensors[t];
    int32_t w = x->producer, from = w == PLAN_NONE ? 0 : w, to = w == PLAN_NONE ? p->n_ops - 1 : r;
    if (m->ok_upto[t] >= to && allow == OP_COUNT) return 1;
    const PlanTensor *R = &p->tensors[m->root[t]];
    if (w != PLAN_NONE && R->producer != PLAN_NONE && !(R->live_start <= w && r <= R->live_end)) {
        because(m, "its buffer, tensor %d (%s), is not live from op %d to op %d (live [%d, %d])", m->root[t],
                plan_tensor_label(p, m->root[t]), w, r, R->live_start, R->live_end);
        return 0;
    }
    for (int32_t q = from; q <= to; q++)
        if (clobbers(m, q, t, allow, slot)) return 0;
    for (int32_t u = 0; u < p->n_tensors; u++) {
        const PlanTensor *y = &p->tensors[u];
        if (u == t || !overlap(m, u, t)) continue;
        /* nan_fill poisons a non-persistent buffer after its last use, y->live_end. */
        int poisoned = y->alias == PLAN_NONE && !plan_tensor_is_persistent(y) && y->live_end < p->n_ops &&
                       (w == PLAN_NONE || (w <= y->live_end && y->live_end < r));
        /* Setup initializes every buffer no op makes; data and the step are written before each step. */
        int set_up = w == PLAN_NONE && ((y->alias == PLAN_NONE && y->producer == PLAN_NONE) || m->is_data[u] ||
                                        u == m->step);
        if (poisoned || set_up) {
            because(m, "tensor %d (%s) shares its bytes and is %s", u, plan_tensor_label(p, u),
                    poisoned ? "poisoned after its last use (nan_fill)" : "written before the step");
            return 0;
        }
    }
    if (allow == OP_COUNT) m->ok_upto[t] = to;
    return 1;
}

static Bound join(Bound a, Bound b)
{
    if (!a.known || !b.known) return TOP;
    return (Bound){1, a.lo < b.lo ? a.lo : b.lo, a.hi > b.hi ? a.hi : b.hi};
}

/* The values of i32 tensor t when op r reads it; TOP with the reason in m->why. */
static Bound bound_at(Mem *m, int32_t t, int32_t r, int depth)
{
    const Plan *p = m->p;
    const PlanTensor *x = &p->tensors[t];
    if (x->dtype != PLAN_DT_I32) {
        because(m, "tensor %d (%s) is %s", t, plan_tensor_label(p, t), plan_dtype_name(x->dtype));
        return TOP;
    }
    if (!intact(m, t, r, OP_COUNT, -1)) return TOP;
    int32_t w = x->producer;
    if (w == PLAN_NONE) {
        if (x->alias != PLAN_NONE || !plan_tensor_is_persistent(x)) {
            because(m, "tensor %d (%s) is neither made by an op nor an input or state of its own", t, plan_tensor_label(p, t));
            return TOP;
        }
        if (m->is_data[t]) return m->data[t];
        if (t == m->step) return (Bound){1, 1, INT32_MAX};
        if ((x->init == PLAN_INIT_NONE || x->init == PLAN_INIT_ZEROS) && !rt_flat_is_storage(p, t))
            return (Bound){1, 0, 0};
        because(m, "tensor %d (%s) starts as %s", t, plan_tensor_label(p, t), plan_init_name(x->init));
        return TOP;
    }
    /* What the producer made does not depend on the reader: worked out once, so copies of
     * copies (concat fans in) cost each tensor one visit. */
    if (m->made_known[t]) {
        if (!m->made[t].known) because(m, "tensor %d (%s) is not made of indices", t, plan_tensor_label(p, t));
        return m->made[t];
    }
    OpKind kind = kind_of(m, w);
    int copies = rt_op_copies_values(plan_str(p, p->ops[w].op));
    Bound b = {1, INT64_MAX, INT64_MIN};
    if (kind == OP_arange) {
        b = (Bound){1, 0, p->tensors[out_of(p, w, 0)].shape[0] - 1};
    } else if (!copies) {
        because(m, "tensor %d (%s) is computed by op %d (%s)", t, plan_tensor_label(p, t), w, op_name(kind));
        b = TOP;
    } else if (depth >= MAX_COPIES) {
        because(m, "tensor %d (%s) is a copy of a copy, %d deep", t, plan_tensor_label(p, t), depth);
        return TOP;  // not remembered: from nearer the start of the chain it may be known
    } else {
        for (int32_t i = 0; i < p->ops[w].n_in && b.known; i++) b = join(b, bound_at(m, in_of(p, w, i), w, depth + 1));
    }
    m->made[t] = b, m->made_known[t] = 1;
    return b;
}

/* ---- the reads ------------------------------------------------------------------------------ */

__attribute__((format(printf, 5, 6))) static int fail_op(Mem *m, int32_t k, char *err, size_t errlen, const char *fmt, ...)
{
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return plan_fail(err, errlen, "op %d (%s): %s", k, plan_str(m->p, m->p->ops[k].op), msg);
}

/* Op k reads tensor t (its `what`) as indices below n. */
static int check_index(Mem *m, int32_t k, int32_t t, const char *what, int64_t n, char *err, size_t errlen)
{
    Bound b = bound_at(m, t, k, 0);
    if (!b.known)
        return fail_op(m, k, err, errlen, "its %s, tensor %d (%s), are not known to stay in [0, %" PRId64 "): %s", what, t,
                       plan_tensor_label(m->p, t), n, m->why);
    int64_t s;
    if (b.lo < 0 && rt_op_index_sentinel(m->p, k, &s) && b.lo == s && s < 0) b.lo = 0;  // data_bounds' sentinel
    if (b.lo < 0 || b.hi >= n)
        return fail_op(m, k, err, errlen, "its %s, tensor %d (%s), may be %" PRId64 " to %" PRId64 ", outside [0, %" PRId64 ")",
                       what, t, plan_tensor_label(m->p, t), b.lo, b.hi, n);
    return 0;
}

/* An i32 counter that starts at zero and only op kind `kind` (as input `slot`) changes. */
static int counter(Mem *m, int32_t t, OpKind kind, int slot)
{
    const Plan *p = m->p;
    const PlanTensor *x = &p->tensors[t];
    if (x->producer != PLAN_NONE || x->alias != PLAN_NONE || !plan_tensor_is_persistent(x) || t == m->step ||
        m->is_data[t] || (x->init != PLAN_INIT_NONE && x->init != PLAN_INIT_ZEROS)) {
        because(m, "tensor %d (%s) is not state of its own that starts at zero", t, plan_tensor_label(p, t));
        return 0;
    }
    return intact(m, t, p->n_ops - 1, kind, slot);
}

/* What op k reads as t: when t is a copy (OPF_COPY: offload's scalars on the host) that
 * reaches k intact, the copy's source, as op *at (the copy) read it; else t, at k. */
static int32_t through_copy(Mem *m, int32_t t, int32_t k, int32_t *at)
{
    const Plan *p = m->p;
    int32_t q = p->tensors[t].producer;
    *at = k;
    if (q == PLAN_NONE || !(op_info(kind_of(m, q))->flags & OPF_COPY) || !intact(m, t, k, OP_COUNT, -1)) return t;
    *at = q;
    return in_of(p, q, 0);
}

/* The one op that writes bytes of state t (no producer of its own) in a step, if that
 * is a copy (offload's to the host); else -1 with the reason. */
static int32_t only_copy_into(Mem *m, int32_t t)
{
    int32_t w = -1;
    for (int32_t q = 0; q < m->p->n_ops; q++) {
        if (!clobbers(m, q, t, OP_COUNT, -1)) continue;
        if (w >= 0 || !(op_info(kind_of(m, q))->flags & OPF_COPY)) return -1;
        w = q;
    }
    if (w < 0) because(m, "no op writes tensor %d (%s)", t, plan_tensor_label(m->p, t));
    return w;
}

/* A delayed update (delayed_update, passes/offload.c) reads the step count s and the
 * coef c that the step before left on the host: state that starts as NaN (c: adamw
 * returns first) and that one copy each writes, after op k, from a counter and a coef
 * that pass check_step's proof where the copies read them. */
static int pending_pair(Mem *m, int32_t s, int32_t c, int32_t k)
{
    const Plan *p = m->p;
    const PlanTensor *S = &p->tensors[s], *C = &p->tensors[c];
    if (S->producer != PLAN_NONE || C->producer != PLAN_NONE || S->alias != PLAN_NONE || C->alias != PLAN_NONE ||
        !plan_tensor_is_persistent(S) || !plan_tensor_is_persistent(C) || C->init != PLAN_INIT_FULL ||
        !isnan(C->init_a))
        return 0;
    int32_t qs = only_copy_into(m, s), qc = only_copy_into(m, c);
    if (qs <= k || qc <= k) return 0;
    int32_t s0 = in_of(p, qs, 0), c0 = in_of(p, qc, 0), before = qs < qc ? qs : qc;
    if (!counter(m, s0, OP_count_step, 0) || !intact(m, c0, qc, OP_COUNT, -1)) return 0;
    for (int32_t q = 0; q < before; q++)
        if (kind_of(m, q) == OP_count_step && in_of(p, q, 0) == s0 && in_of(p, q, 1) == c0) return 1;
    return 0;
}

/* adamw stops unless step >= 1 (when coef is not NaN: a NaN coef returns first). */
static int check_step(Mem *m, int32_t k, char *err, size_t errlen)
{
    const Plan *p = m->p;
    int32_t s = in_of(p, k, 6), coef = in_of(p, k, 5);
    Bound b = bound_at(m, s, k, 0);
    if (b.known && b.lo >= 1) return 0;
    char why[sizeof m->why];
    snprintf(why, sizeof why, "%s", m->why);
    int32_t ks, kc, s0 = through_copy(m, s, k, &ks), c0 = through_copy(m, coef, k, &kc);
    int32_t before = ks < kc ? ks : kc;
    if (counter(m, s0, OP_count_step, 0) && intact(m, c0, kc, OP_COUNT, -1))
        for (int32_t q = 0; q < before; q++)
            if (kind_of(m, q) == OP_count_step && in_of(p, q, 0) == s0 && in_of(p, q, 1) == c0) return 0;
    if (pending_pair(m, s, coef, k)) return 0;
    return fail_op(m, k, err, errlen, "its step count, tensor %d (%s), is not known to be at least 1: neither the step "
                   "input (%s) nor a counter that count_step advances with this op's coef, tensor %d (%s)", s,
                   plan_tensor_label(p, s), b.known ? "it may be below 1" : why, coef, plan_tensor_label(p, coef));
}

static int check_read(Mem *m, int32_t k, char *err, size_t errlen)
{
    const Plan *p = m->p;
    int32_t idx;
    int64_t n;
    RtIndexKind index = rt_op_index(p, k, &idx, &n);
    if (index != RT_INDEX_NONE)
        return check_index(m, k, idx, index == RT_INDEX_ROWS ? "indices" : "targets", n, err, errlen);
    switch (kind_of(m, k)) {
    case OP_adamw:
    case OP_adamw_cast: return check_step(m, k, err, errlen);
    case OP_count_step:
    case OP_scale_update: {
        int slot = kind_of(m, k) == OP_count_step ? 0 : 2;
        int32_t t = in_of(p, k, slot);
        if (counter(m, t, kind_of(m, k), slot)) return 0;
        return fail_op(m, k, err, errlen, "its counter, tensor %d (%s), may hold anything: %s", t, plan_tensor_label(p, t), m->why);
    }
    default: return 0;
    }
}

/* Whether op k has a float (or int) attribute `key` equal to 0. */
static int attr_is_zero(const Plan *p, int32_t k, const char *key)
{
    for (int32_t a = 0; a < p->ops[k].n_attr; a++) {
        const PlanAttr *at = &p->attrs[p->ops[k].attr + a];
        if (strcmp(plan_str(p, at->key), key)) continue;
        return at->kind == PLAN_ATTR_FLOAT ? at->f == 0 : at->kind == PLAN_ATTR_INT && at->i == 0;
    }
    return 0;
}

/* An effect op updates only persistent state in place (attention_decode: its KV caches):
 * what the guard lets it write.
 * SGD without momentum has no buffer and leaves its `buf` (the gradient) alone. */
static int check_updates(Mem *m, int32_t k, char *err, size_t errlen)
{
    const Plan *p = m->p;
    unsigned upd = updated_inputs(kind_of(m, k));
    if ((kind_of(m, k) == OP_sgd || kind_of(m, k) == OP_sgd_cast) && attr_is_zero(p, k, "momentum")) upd &= ~(1u << 2);
    for (int32_t i = 0; i < p->ops[k].n_in && upd; i++) {
        if (!((upd >> i) & 1)) continue;
        int32_t t = in_of(p, k, i);
        PlanRole role = p->tensors[m->root[t]].role;
        if (role != PLAN_ROLE_PARAM && role != PLAN_ROLE_OPT_STATE && role != PLAN_ROLE_MASTER &&
            role != PLAN_ROLE_KV_CACHE && role != PLAN_ROLE_PARAM16)
            return fail_op(m, k, err, errlen, "updates input %d, tensor %d (%s), in place, but its buffer is %s, not a "
                           "param, its 16-bit copy, optimizer state, master weight or KV cache", i, t,
                           plan_tensor_label(p, t), plan_role_name(role));
    }
    return 0;
}

/* An op's output overlaps none of its inputs' bytes: kernels copy rows with memcpy and
 * read inputs after writing outputs. Exceptions are the ways kernels are written to
 * share: an elementwise op writing over an input of the same bytes (each element read
 * before it is written), an in-place op's last output on its first input (OPF_INPLACE,
 * likewise), and ops that move bytes with memmove or MPI's in-place collectives (views,
 * copy, collectives). */
static int check_aliasing(Mem *m, int32_t k, char *err, size_t errlen)
{
    const Plan *p = m->p;
    int flags = op_info(kind_of(m, k))->flags;
    if (flags & (OPF_VIEW | OPF_COLLECTIVE) || kind_of(m, k) == OP_copy) return 0;
    for (int32_t o = 0; o < p->ops[k].n_out; o++)
        for (int32_t i = 0; i < p->ops[k].n_in; i++) {
            int32_t u = out_of(p, k, o), x = in_of(p, k, i);
            if (!overlap(m, u, x)) continue;
            int same = m->lo[u] == m->lo[x] && m->hi[u] == m->hi[x] &&
                       p->tensors[u].rank_stride == p->tensors[x].rank_stride;
            if (same && (flags & OPF_ELEMWISE)) continue;
            if (same && (flags & OPF_INPLACE) && o == p->ops[k].n_out - 1 && i == 0) continue;
            return fail_op(m, k, err, errlen, "output %d, tensor %d (%s), overlaps input %d, tensor %d (%s): bytes [%lld, "
                           "%lld) and [%lld, %lld)", o, u, plan_tensor_label(p, u), i, x, plan_tensor_label(p, x), (long long)m->lo[u],
                           (long long)m->hi[u], (long long)m->lo[x], (long long)m->hi[x]);
        }
    return 0;
}

/* What data.c writes into the data inputs. An input that an op indexes with stays below
 * its bound (rt_input_bound), or is the one value every such read allows besides
 * (rt_input_sentinel: an ignore_index, below 0): the loader checks .npy arrays against
 * them, and token files against the least bound of tokens and targets (and the vocab);
 * labels it draws as blobs stay below the class count, which may be more. Nothing is
 * known of an input no op indexes with (.npy data is checked only where it indexes). A
 * stage's data inputs are the whole plan's, and so are their bounds. An input fsexec
 * does not feed (no step run, --predict's labels) stays zeros, inside every bound. */
static int data_bounds(Mem *m, const Plan *whole)
{
    int32_t n = rt_data_input_list(whole, NULL, 0), by, *in = plan_alloc(sizeof *in * (size_t)(n + 1));
    if (!in) return -1;
    rt_data_input_list(whole, in, n);
    int64_t classes = rt_plan_classes(whole), sentinel;
    int two = rt_data_kind(whole) == RT_DATA_CLASSES;
    for (int32_t k = 0; k < n; k++) {
        int32_t t = rt_stage_input(whole, in[k], m->p);
        if (t == PLAN_NONE) continue;
        int64_t most = rt_input_bound(whole, in[k], &by);
        if (most < 0) return plan_dealloc(in), -1;
        if (most > 0 && two && k == 1 && classes > most) most = classes;
        m->is_data[t] = 1;
        m->data[t] = most > 0 ? (Bound){1, 0, most - 1} : TOP;
        if (most > 0 && rt_input_sentinel(whole, in[k], &sentinel) && sentinel < 0) m->data[t].lo = sentinel;
    }
    plan_dealloc(in);
    return 0;
}

/* The tensor the executor writes the step number into (step role PLAN_SR_STEP). */
static int32_t step_input(const Plan *p)
{
    int32_t s = plan_role_tensor(p, PLAN_SR_STEP);
    if (s == PLAN_NONE) return s;
    const PlanTensor *t = &p->tensors[s];
    return t->dtype == PLAN_DT_I32 && t->rank == 0 && t->alias == PLAN_NONE && t->rank_stride == 0 ? s : PLAN_NONE;
}

int rt_plan_check_values(const Plan *p, const Plan *whole, char *err, size_t errlen)
{
    size_t n = (size_t)p->n_tensors + 1;
    Mem m = {.p = p, .world = plan_shard_group(p, p->n_programs ? p->programs[0].dp_world : 1), .step = step_input(p)};
    m.root = plan_alloc(sizeof *m.root * n);
    m.ok_upto = plan_alloc(sizeof *m.ok_upto * n);
    m.lo = plan_alloc(sizeof *m.lo * n);
    m.hi = plan_alloc(sizeof *m.hi * n);
    m.kind = plan_alloc(sizeof *m.kind * ((size_t)p->n_ops + 1));
    m.made = plan_alloc(sizeof *m.made * n);
    m.made_known = plan_alloc(n);
    m.data = plan_alloc(sizeof *m.data * n);
    m.is_data = plan_alloc(n);
    int rc = 0;
    if (m.is_data) memset(m.is_data, 0, n);
    if (!m.root || !m.ok_upto || !m.lo || !m.hi || !m.kind || !m.made || !m.made_known || !m.data || !m.is_data ||
        data_bounds(&m, whole ? whole : p)) {
        rc = plan_fail(err, errlen, "out of memory");
    } else {
        for (int32_t i = 0; i < p->n_tensors; i++) {
            const PlanTensor *t = &p->tensors[i];
            m.root[i] = t->alias == PLAN_NONE ? i : t->alias;
            /* The spaces apart: the host arena's bytes sit above every device byte. */
            int64_t base = t->place == PLAN_PLACE_HOST ? 2 * MAX_ARENA : 0;
            m.lo[i] = base + t->offset;
            m.hi[i] = base + t->offset + t->rank_stride * (m.world - 1) + plan_tensor_nbytes(t);  // no overflow
            m.ok_upto[i] = -1;
            m.made_known[i] = 0;
        }
        for (int32_t k = 0; k < p->n_ops; k++) m.kind[k] = op_lookup(plan_str(p, p->ops[k].op));
        for (int32_t k = 0; k < p->n_ops && !rc; k++)
            rc = check_aliasing(&m, k, err, errlen) || check_updates(&m, k, err, errlen) || check_read(&m, k, err, errlen);
    }
    plan_dealloc(m.root);
    plan_dealloc(m.ok_upto);
    plan_dealloc(m.lo);
    plan_dealloc(m.hi);
    plan_dealloc(m.kind);
    plan_dealloc(m.made);
    plan_dealloc(m.made_known);
    plan_dealloc(m.data);
    plan_dealloc(m.is_data);
    return rc ? -1 : 0;
}
