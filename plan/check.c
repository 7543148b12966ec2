/* plan/check.c: the invariants of a Plan. The reader has already made sure every byte
 * is the one the writer wrote; this makes sure that what the writer wrote is whole:
 * every id in range, every range inside its pool, every enum known, every shape small
 * enough that its byte count fits in int64, and every CUDA instruction sound (sorted by
 * op, launches within CUDA's limits, GEMMs inside their tensors). After it passes, the
 * runtime may index the plan's arrays without further checks. Shared by plan_read and
 * plan_write.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>

#include "plan.h"

typedef struct {
    const Plan *p;
    char *err;
    size_t errlen;
} Check;

__attribute__((format(printf, 2, 3))) static int fail(Check *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    plan_vfail(c->err, c->errlen, fmt, ap);
    va_end(ap);
    return -1;
}

static int in_range(int32_t id, int32_t n) { return id >= 0 && id < n; }
static int opt_in_range(int32_t id, int32_t n) { return id == PLAN_NONE || in_range(id, n); }
/* [start, start + n) inside a pool of `pool` items. */
static int range_ok(int32_t start, int32_t n, int32_t pool)
{
    return start >= 0 && n >= 0 && (int64_t)start + n <= pool;
}

static int check_tensor(Check *c, int32_t i, const PlanTensor *t)
{
    const Plan *p = c->p;
    if (!opt_in_range(t->name, p->n_strs))
        return fail(c, "tensor %d: name %d out of range (%d strings)", i, t->name, p->n_strs);
    if ((unsigned)t->dtype >= PLAN_DT_COUNT) return fail(c, "tensor %d: unknown dtype %d", i, (int)t->dtype);
    if ((unsigned)t->role >= PLAN_ROLE_COUNT) return fail(c, "tensor %d: unknown role %d", i, (int)t->role);
    if ((unsigned)t->place >= PLAN_PLACE_COUNT)
        return fail(c, "tensor %d: unknown placement %d", i, (int)t->place);
    if ((unsigned)t->init >= PLAN_INIT_COUNT) return fail(c, "tensor %d: unknown init %d", i, (int)t->init);
    if (t->rank < 0 || t->rank > PLAN_MAX_RANK)
        return fail(c, "tensor %d: rank %d out of range (at most %d)", i, t->rank, PLAN_MAX_RANK);
    int64_t n = plan_dtype_size(t->dtype);
    for (int32_t d = 0; d < t->rank; d++) {
        if (t->shape[d] < 0) return fail(c, "tensor %d: negative dim %" PRId64, i, t->shape[d]);
        if (t->shape[d] && n > INT64_MAX / t->shape[d]) return fail(c, "tensor %d: shape too large", i);
        n *= t->shape[d];
    }
    if (!opt_in_range(t->block, p->n_blocks))
        return fail(c, "tensor %d: block %d out of range (%d blocks)", i, t->block, p->n_blocks);
    if (!opt_in_range(t->producer, p->n_ops))
        return fail(c, "tensor %d: producer %d out of range (%d ops)", i, t->producer, p->n_ops);
    if (!opt_in_range(t->tied_to, p->n_tensors))
        return fail(c, "tensor %d: tied to %d, out of range (%d tensors)", i, t->tied_to, p->n_tensors);
    if (!opt_in_range(t->grad, p->n_tensors))
        return fail(c, "tensor %d: grad %d out of range (%d tensors)", i, t->grad, p->n_tensors);
    if (!opt_in_range(t->alias, p->n_tensors))
        return fail(c, "tensor %d: alias %d out of range (%d tensors)", i, t->alias, p->n_tensors);
    if (!opt_in_range(t->unit, p->n_blocks + 1))
        return fail(c, "tensor %d: unit %d out of range (%d blocks)", i, t->unit, p->n_blocks);
    if ((unsigned)t->step_role >= PLAN_SR_COUNT)
        return fail(c, "tensor %d: unknown step role %d", i, (int)t->step_role);
    if (t->step_role != PLAN_SR_NONE && plan_role_tensor(p, t->step_role) != i)
        return fail(c, "tensor %d: step role %s is tensor %d's already", i, plan_step_role_name(t->step_role),
                    plan_role_tensor(p, t->step_role));
    if (t->sharded > 1 || t->rank_stride < 0 || t->flat_offset < 0)
        return fail(c, "tensor %d: bad flat layout (sharded %d, rank stride %" PRId64 ", flat offset %" PRId64 ")", i,
                    t->sharded, t->rank_stride, t->flat_offset);
    return 0;
}

static int check_op(Check *c, int32_t i, const PlanOp *o)
{
    const Plan *p = c->p;
    if (!in_range(o->op, p->n_strs)) return fail(c, "op %d: name %d out of range (%d strings)", i, o->op, p->n_strs);
    const char *name = p->strs[o->op];
    if (!opt_in_range(o->block, p->n_blocks))
        return fail(c, "op %d (%s): block %d out of range (%d blocks)", i, name, o->block, p->n_blocks);
    if ((unsigned)o->phase >= PLAN_PHASE_COUNT) return fail(c, "op %d (%s): unknown phase %d", i, name, (int)o->phase);
    if (!range_ok(o->in, o->n_in, p->n_ids) || !range_ok(o->out, o->n_out, p->n_ids))
        return fail(c, "op %d (%s): inputs or outputs out of range (%d ids)", i, name, p->n_ids);
    if (!range_ok(o->attr, o->n_attr, p->n_attrs))
        return fail(c, "op %d (%s): attributes out of range (%d attrs)", i, name, p->n_attrs);
    if ((unsigned)o->stream >= PLAN_STREAM_COUNT)
        return fail(c, "op %d (%s): unknown stream %d", i, name, (int)o->stream);
    if (!range_ok(o->wait, o->n_wait, p->n_waits))
        return fail(c, "op %d (%s): waits out of range (%d waits)", i, name, p->n_waits);
    for (int32_t k = 0; k < o->n_wait; k++) {
        int32_t w = p->waits[o->wait + k];
        if (w < 0 || w >= i || p->ops[w].stream == PLAN_STREAM_COMPUTE)
            return fail(c, "op %d (%s): waits for op %d, which is not an earlier op off the compute stream", i, name,
                        w);
    }
    for (int32_t k = 0; k < o->n_out; k++) {
        int32_t t = p->ids[o->out + k];
        if (in_range(t, p->n_tensors) && p->tensors[t].producer != i)
            return fail(c, "op %d (%s): output tensor %d names op %d as its producer", i, name, t,
                        p->tensors[t].producer);
    }
    return 0;
}

static int check_attr(Check *c, int32_t i, const PlanAttr *a)
{
    const Plan *p = c->p;
    if (!in_range(a->key, p->n_strs)) return fail(c, "attr %d: key %d out of range (%d strings)", i, a->key, p->n_strs);
    if ((unsigned)a->kind >= PLAN_ATTR_COUNT) return fail(c, "attr %d: unknown kind %d", i, (int)a->kind);
    if (a->kind == PLAN_ATTR_INTS && !range_ok(a->list, a->n_list, p->n_ints))
        return fail(c, "attr %d: list out of range (%d ints)", i, p->n_ints);
    return 0;
}

/* Whether elements [off, off + (batch - 1) * stride + (rows - 1) * ld + cols) lie in a
 * tensor of n elements, computed without overflow (rows, cols, ld, batch in [1, 2^31)),
 * so the runtime hands cuBLAS a GEMM's pointers without checking them again. */
static int span_ok(int64_t off, int64_t batch, int64_t stride, int64_t rows, int64_t ld, int64_t cols, int64_t n)
{
    if (off < 0 || stride < 0 || ld < cols) return 0;
    int64_t last = (rows - 1) * ld + cols;  // one matrix: below 2^62
    if (last > n || (batch > 1 && stride > (n - last) / (batch - 1))) return 0;
    return off <= n - ((batch - 1) * stride + last);
}

static int check_gemm(Check *c, int32_t i, const PlanCuda *g)
{
    const Plan *p = c->p;
    const int64_t dims[] = {g->m, g->n, g->k, g->batch, g->lda, g->ldb, g->ldc};
    for (int d = 0; d < 7; d++)
        if (dims[d] < 1 || dims[d] > INT32_MAX)
            return fail(c, "cuda %d: GEMM dims must be in [1, 2^31): m %" PRId64 ", n %" PRId64 ", k %" PRId64
                        ", batch %" PRId64 ", lda %" PRId64 ", ldb %" PRId64 ", ldc %" PRId64, i, g->m, g->n, g->k,
                        g->batch, g->lda, g->ldb, g->ldc);
    if (g->n_args != 3) return fail(c, "cuda %d: a GEMM takes 3 tensors (A, B, C), has %d", i, g->n_args);
    if ((g->ta != 0 && g->ta != 1) || (g->tb != 0 && g->tb != 1))
        return fail(c, "cuda %d: GEMM transpose flags %d, %d (0 or 1)", i, g->ta, g->tb);
    const PlanTensor *a = &p->tensors[p->ids[g->args]], *b = &p->tensors[p->ids[g->args + 1]],
                     *d = &p->tensors[p->ids[g->args + 2]];
    if (a->dtype == PLAN_DT_I32 || b->dtype == PLAN_DT_I32 || d->dtype == PLAN_DT_I32)
        return fail(c, "cuda %d: GEMM on i32 tensors", i);
    if (!span_ok(g->a_off, g->batch, g->stride_a, g->ta ? g->k : g->m, g->lda, g->ta ? g->m : g->k, plan_tensor_numel(a)) ||
        !span_ok(g->b_off, g->batch, g->stride_b, g->tb ? g->n : g->k, g->ldb, g->tb ? g->k : g->n, plan_tensor_numel(b)) ||
        !span_ok(g->c_off, g->batch, g->stride_c, g->m, g->ldc, g->n, plan_tensor_numel(d)))
        return fail(c, "cuda %d: GEMM reaches outside its tensors", i);
    return 0;
}

/* CUDA's own limits: block x, y <= 1024 and z <= 64 threads, 1024 in all; grid y, z <= 65535. */
static int check_launch(Check *c, int32_t i, const PlanCuda *l)
{
    const Plan *p = c->p;
    if (!in_range(l->kernel, p->n_strs) || !p->strs[l->kernel][0])
        return fail(c, "cuda %d: kernel name %d out of range (%d strings)", i, l->kernel, p->n_strs);
    int64_t threads = 1;
    for (int d = 0; d < 3; d++) {
        if (l->grid[d] < 1 || l->block[d] < 1)
            return fail(c, "cuda %d: grid %dx%dx%d, block %dx%dx%d: each must be positive", i, l->grid[0], l->grid[1],
                        l->grid[2], l->block[0], l->block[1], l->block[2]);
        threads *= l->block[d] <= 1024 ? l->block[d] : 1025;  // saturates above the limit: no overflow
    }
    if (threads > 1024 || l->block[2] > 64 || l->grid[1] > 65535 || l->grid[2] > 65535)
        return fail(c, "cuda %d: grid %dx%dx%d, block %dx%dx%d exceeds CUDA's limits (1024 threads a block)", i,
                    l->grid[0], l->grid[1], l->grid[2], l->block[0], l->block[1], l->block[2]);
    if (l->smem < 0) return fail(c, "cuda %d: negative shared memory %d", i, l->smem);
    return 0;
}

static int check_cuda(Check *c, int32_t i, const PlanCuda *cu)
{
    const Plan *p = c->p;
    if (!in_range(cu->op, p->n_ops)) return fail(c, "cuda %d: op %d out of range (%d ops)", i, cu->op, p->n_ops);
    if (i > 0 && cu->op < p->cuda[i - 1].op)
        return fail(c, "cuda %d: op %d after op %d (instructions are sorted by op)", i, cu->op, p->cuda[i - 1].op);
    if ((unsigned)cu->kind >= PLAN_CU_COUNT) return fail(c, "cuda %d: unknown kind %d", i, (int)cu->kind);
    if (!range_ok(cu->args, cu->n_args, p->n_ids)) return fail(c, "cuda %d: args out of range (%d ids)", i, p->n_ids);
    for (int32_t k = 0; k < cu->n_args; k++)
        if (!in_range(p->ids[cu->args + k], p->n_tensors))
            return fail(c, "cuda %d: arg %d: tensor %d out of range (%d tensors)", i, k, p->ids[cu->args + k], p->n_tensors);
    return cu->kind == PLAN_CU_GEMM ? check_gemm(c, i, cu) : check_launch(c, i, cu);
}

/* Programs in stage order, their op ranges back to back over every op, each wait inside
 * its own program. A plan without a memory plan has none (the runtime refuses it). */
static int check_programs(Check *c)
{
    const Plan *p = c->p;
    int32_t next = 0;
    for (int32_t i = 0; i < p->n_programs; i++) {
        const PlanProgram *g = &p->programs[i];
        if (g->stage != i || g->dp_world < 1 || g->first_op != next || g->n_ops < 0 || g->n_ops > p->n_ops - next)
            return fail(c, "program %d: stage %d, %d data-parallel ranks, ops [%d, +%d) do not follow program %d", i,
                        g->stage, g->dp_world, g->first_op, g->n_ops, i - 1);
        for (int s = 0; s < PLAN_PLACE_COUNT; s++)
            if (g->space_bytes[s] < 0)
                return fail(c, "program %d: negative %s arena (%" PRId64 " bytes)", i, plan_place_name((PlanPlace)s),
                            g->space_bytes[s]);
        for (int32_t k = g->first_op; k < g->first_op + g->n_ops; k++)
            for (int32_t w = 0; w < p->ops[k].n_wait; w++)
                if (p->waits[p->ops[k].wait + w] < g->first_op)
                    return fail(c, "op %d waits for op %d of another program", k, p->waits[p->ops[k].wait + w]);
        next += g->n_ops;
    }
    if (p->n_programs && next != p->n_ops)
        return fail(c, "the programs hold %d of the plan's %d ops", next, p->n_ops);
    return 0;
}

static int check_counts(Check *c)
{
    const Plan *p = c->p;
    const struct { const char *what; int32_t n; const void *arr; } pools[] = {
        {"strings", p->n_strs, p->strs},     {"meta", p->n_meta, p->meta},
        {"blocks", p->n_blocks, p->blocks},  {"tensors", p->n_tensors, p->tensors},
        {"ops", p->n_ops, p->ops},           {"ids", p->n_ids, p->ids},
        {"attrs", p->n_attrs, p->attrs},     {"ints", p->n_ints, p->ints},
        {"outputs", p->n_outputs, p->outputs},  {"cuda instructions", p->n_cuda, p->cuda},
        {"waits", p->n_waits, p->waits},     {"programs", p->n_programs, p->programs},
    };
    for (size_t i = 0; i < sizeof pools / sizeof *pools; i++)
        if (pools[i].n < 0 || (pools[i].n && !pools[i].arr))
            return fail(c, "%s: bad count %d", pools[i].what, pools[i].n);
    for (int32_t i = 0; i < p->n_strs; i++)
        if (!p->strs[i]) return fail(c, "string %d missing", i);
    return 0;
}

int plan_check(const Plan *p, char *err, size_t errlen)
{
    Check c = {p, err, errlen};
    if (check_counts(&c)) return -1;
    for (int32_t i = 0; i < p->n_meta; i++) {
        const PlanMeta *m = &p->meta[i];
        if (!in_range(m->key, p->n_strs)) return fail(&c, "meta %d: key %d out of range (%d strings)", i, m->key, p->n_strs);
        if ((unsigned)m->kind >= PLAN_META_COUNT) return fail(&c, "meta %s: unknown kind %d", p->strs[m->key], (int)m->kind);
        if (m->kind == PLAN_META_STR && !in_range(m->s, p->n_strs))
            return fail(&c, "meta %s: value %d out of range (%d strings)", p->strs[m->key], m->s, p->n_strs);
    }
    for (int32_t i = 0; i < p->n_blocks; i++)
        if (!in_range(p->blocks[i].name, p->n_strs) || !in_range(p->blocks[i].layer, p->n_strs))
            return fail(&c, "block %d: name out of range (%d strings)", i, p->n_strs);
    for (int32_t i = 0; i < p->n_tensors; i++)
        if (check_tensor(&c, i, &p->tensors[i])) return -1;
    for (int32_t i = 0; i < p->n_ids; i++)
        if (!in_range(p->ids[i], p->n_tensors))
            return fail(&c, "id %d: tensor %d out of range (%d tensors)", i, p->ids[i], p->n_tensors);
    for (int32_t i = 0; i < p->n_attrs; i++)
        if (check_attr(&c, i, &p->attrs[i])) return -1;
    for (int32_t i = 0; i < p->n_ops; i++)
        if (check_op(&c, i, &p->ops[i])) return -1;
    for (int32_t i = 0; i < p->n_outputs; i++)
        if (!in_range(p->outputs[i], p->n_tensors))
            return fail(&c, "output %d: tensor %d out of range (%d tensors)", i, p->outputs[i], p->n_tensors);
    for (int32_t i = 0; i < p->n_cuda; i++)
        if (check_cuda(&c, i, &p->cuda[i])) return -1;
    return check_programs(&c);
}
