/* plan/check.c: the invariants of a Plan. The reader has already made sure every byte
 * is the one the writer wrote; this makes sure that what the writer wrote is whole:
 * every id in range, every range inside its pool, every enum known, every shape small
 * enough that its byte count fits in int64, and every CUDA instruction sound (sorted by
 * op, launches within CUDA's limits, GEMMs inside their tensors). With programs, each
 * holds its own: their ranges lie back to back over every op, tensor, output and module
 * byte, and nothing of a program names another's (plan.h, PlanProgram); a send or recv
 * names another stage, and only a copy between the memory spaces touches both. After it
 * passes, the runtime may index the plan's arrays without further checks. Shared by
 * plan_read and plan_write.
 *
 * A plan of one program may be any stage's (an extract, plan_extract_program), and its
 * sends and receives name stages it does not hold: there a peer need only be a stage.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "comm_op.h"
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
    if (!opt_in_range(t->unit, PLAN_UNITS(p->n_blocks)))
        return fail(c, "tensor %d: unit %d out of range (%d blocks)", i, t->unit, p->n_blocks);
    if ((unsigned)t->step_role >= PLAN_SR_COUNT)
        return fail(c, "tensor %d: unknown step role %d", i, (int)t->step_role);
    if (t->sharded > 1 || t->rank_stride < 0 || t->flat_offset < 0)
        return fail(c, "tensor %d: bad flat layout (sharded %d, rank stride %" PRId64 ", flat offset %" PRId64 ")", i,
                    t->sharded, t->rank_stride, t->flat_offset);
    if (t->logical_rows && (t->logical_rows < 0 || t->rank < 1 || t->logical_rows > t->shape[0]))
        return fail(c, "tensor %d: logical rows %" PRId64 " outside its %" PRId64 " stored rows", i, t->logical_rows,
                    t->rank ? t->shape[0] : 0);
    return 0;
}

/* Only a copy between the spaces touches both: to_host moves one device tensor to a host
 * tensor of the same type, to_device the other way; every other op's tensors lie in one
 * space (the backend runs it there). */
static int check_spaces(Check *c, int32_t i, const PlanOp *o, CommOpKind kind)
{
    const Plan *p = c->p;
    const char *name = p->strs[o->op];
    for (int32_t k = 0; k < o->n_in + o->n_out; k++)
        if (!in_range(p->ids[k < o->n_in ? o->in + k : o->out + k - o->n_in], p->n_tensors)) return 0;  // check_owners says
    if (kind == COMM_OP_TO_HOST || kind == COMM_OP_TO_DEVICE) {
        if (o->n_in != 1 || o->n_out != 1)
            return fail(c, "op %d (%s): %d inputs and %d outputs, expected 1 and 1", i, name, o->n_in, o->n_out);
        const PlanTensor *x = &p->tensors[p->ids[o->in]], *y = &p->tensors[p->ids[o->out]];
        PlanPlace from = kind == COMM_OP_TO_HOST ? PLAN_PLACE_DEVICE : PLAN_PLACE_HOST;
        if (x->place != from || y->place == from)
            return fail(c, "op %d (%s): copies from the %s space to the %s, not from %s to %s", i, name,
                        plan_place_name(from), plan_place_name(from == PLAN_PLACE_HOST ? PLAN_PLACE_DEVICE : PLAN_PLACE_HOST),
                        plan_place_name(x->place), plan_place_name(y->place));
        if (x->dtype != y->dtype || plan_tensor_numel(x) != plan_tensor_numel(y))
            return fail(c, "op %d (%s): its input and output differ in type", i, name);
        return 0;
    }
    for (int32_t k = 1; k < o->n_in + o->n_out; k++) {
        int32_t a = p->ids[o->n_in ? o->in : o->out], b = p->ids[k < o->n_in ? o->in + k : o->out + k - o->n_in];
        if (p->tensors[a].place != p->tensors[b].place)
            return fail(c, "op %d (%s): tensor %d is in the %s space and tensor %d in the %s; only to_host and "
                        "to_device cross", i, name, a, plan_place_name(p->tensors[a].place), b,
                        plan_place_name(p->tensors[b].place));
    }
    return 0;
}

/* Send and recv move one tensor to or from a peer stage; a collective runs over a group
 * (p2p.c pairs their tensors). */
static int check_comm(Check *c, int32_t i, const PlanOp *o)
{
    const Plan *p = c->p;
    const char *name = p->strs[o->op];
    CommOpKind kind = comm_op_kind(p, o);
    if (check_spaces(c, i, o, kind)) return -1;
    if (kind == COMM_OP_SEND || kind == COMM_OP_RECV) {
        int send = kind == COMM_OP_SEND;
        if (o->n_in != send || o->n_out != !send)
            return fail(c, "op %d (%s): %d inputs and %d outputs, expected %d and %d", i, name, o->n_in, o->n_out,
                        send, !send);
        const PlanAttr *a = comm_op_attr(p, o, "peer");
        if (!a || a->kind != PLAN_ATTR_INT || a->i < 0)
            return fail(c, "op %d (%s): no peer (an int attribute, the stage it %s, >= 0)", i, name,
                        send ? "sends to" : "receives from");
    }
    if (kind == COMM_OP_COLLECTIVE) {
        const PlanAttr *a = comm_op_attr(p, o, "group");
        if (a && (a->kind != PLAN_ATTR_INT || a->i < COMM_GROUP_DATA || a->i > COMM_GROUP_REPLICA))
            return fail(c, "op %d (%s): group must be the int 0 (the stage's data-parallel ranks), 1 (the pipeline), "
                        "2 (the shard group) or 3 (the replica group)", i, name);
        if (o->n_in != 1) return fail(c, "op %d (%s): %d inputs, expected 1", i, name, o->n_in);
    }
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
    return check_comm(c, i, o);
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

/* An epilogue's GEMM is one call (batch 1, no offsets) and its bias and aux tensors are
 * C's dtype and sizes: bias packed [n] ([m] for BGRAD_A), aux [m, n] with C's row stride;
 * a bias gradient reduces an operand stored [k, len] (cuBLASLt's BGRADA reads its A
 * untransposed, BGRADB its B transposed: schedule.h swaps the plan's A and B). */
static int check_epilogue(Check *c, int32_t i, const PlanCuda *g)
{
    const Plan *p = c->p;
    const PlanTensor *d = &p->tensors[p->ids[g->args + 2]], *bias = &p->tensors[p->ids[g->args + 3]];
    if (g->batch != 1 || g->a_off || g->b_off || g->c_off)
        return fail(c, "cuda %d: a GEMM with an epilogue is one call (batch 1, no offsets)", i);
    if ((g->epilogue == PLAN_EPI_BGRAD_A && !g->ta) || (g->epilogue == PLAN_EPI_BGRAD_B && g->tb))
        return fail(c, "cuda %d: a bias gradient of %s needs it stored [k, len] (%s)", i,
                    g->epilogue == PLAN_EPI_BGRAD_A ? "A" : "B", g->epilogue == PLAN_EPI_BGRAD_A ? "ta" : "no tb");
    int64_t len = g->epilogue == PLAN_EPI_BGRAD_A ? g->m : g->n;
    if (bias->dtype != d->dtype || plan_tensor_numel(bias) != len)
        return fail(c, "cuda %d: the epilogue's bias has %" PRId64 " elements of dtype %d, not %" PRId64 " of C's", i,
                    plan_tensor_numel(bias), (int)bias->dtype, len);
    if (plan_epilogue_args(g->epilogue) < 2) return 0;
    const PlanTensor *aux = &p->tensors[p->ids[g->args + 4]];
    if (aux->dtype != d->dtype || !span_ok(0, 1, 0, g->m, g->ldc, g->n, plan_tensor_numel(aux)))
        return fail(c, "cuda %d: the epilogue's aux is not an [m, n] tensor of C's dtype", i);
    return 0;
}

/* A GEMM with beta 1 adds R, its last arg: one call (batch 1, no offsets) with no epilogue
 * or a bias, R an [m, n] tensor of C's dtype and row stride in bytes of its own (cuBLASLt's
 * C beside its D). */
static int check_beta(Check *c, int32_t i, const PlanCuda *g)
{
    const Plan *p = c->p;
    if (g->beta != 0 && g->beta != 1) return fail(c, "cuda %d: GEMM beta %d (0 or 1)", i, g->beta);
    if (!g->beta) return 0;
    if (g->epilogue != PLAN_EPI_NONE && g->epilogue != PLAN_EPI_BIAS)
        return fail(c, "cuda %d: a GEMM that adds R has no epilogue or a bias, not %s", i,
                    plan_epilogue_name(g->epilogue));
    if (g->batch != 1 || g->a_off || g->b_off || g->c_off)
        return fail(c, "cuda %d: a GEMM that adds R is one call (batch 1, no offsets)", i);
    const PlanTensor *d = &p->tensors[p->ids[g->args + 2]], *r = &p->tensors[p->ids[g->args + g->n_args - 1]];
    if (r->dtype != d->dtype || !span_ok(0, 1, 0, g->m, g->ldc, g->n, plan_tensor_numel(r)))
        return fail(c, "cuda %d: the GEMM's R is not an [m, n] tensor of C's dtype", i);
    int64_t r_end = r->offset + plan_tensor_nbytes(r), d_end = d->offset + plan_tensor_nbytes(d);
    if (r->place == d->place && r->offset < d_end && d->offset < r_end)
        return fail(c, "cuda %d: the GEMM's R shares bytes with its C", i);
    return 0;
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
    if (g->epilogue < 0 || g->epilogue >= PLAN_EPI_COUNT)
        return fail(c, "cuda %d: GEMM epilogue %d unknown", i, g->epilogue);
    int extra = plan_epilogue_args(g->epilogue), r = g->beta == 1;
    if (g->n_args != 3 + extra + r)
        return fail(c, "cuda %d: a GEMM takes %d tensors (A, B, C%s%s), has %d", i, 3 + extra + r,
                    extra == 2 ? ", bias, aux" : extra ? ", bias" : "", r ? ", R" : "", g->n_args);
    if ((g->ta != 0 && g->ta != 1) || (g->tb != 0 && g->tb != 1))
        return fail(c, "cuda %d: GEMM transpose flags %d, %d (0 or 1)", i, g->ta, g->tb);
    if ((g->epilogue && check_epilogue(c, i, g)) || check_beta(c, i, g)) return -1;
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

/* Program i's range [first, first + n) of one kind of item must start where program
 * i - 1's ends (*next) and stay inside the plan's `total`; *next moves past it. */
static int follows(Check *c, int32_t i, const char *what, int64_t first, int64_t n, int64_t *next, int64_t total)
{
    if (first != *next)
        return fail(c, "program %d: %s start at %" PRId64 ", expected %" PRId64 " (%s)", i, what, first, *next,
                    i ? "where the program before ends" : "the first program's start at 0");
    if (n < 0 || n > total - first)
        return fail(c, "program %d: %" PRId64 " %s from %" PRId64 " do not fit in the plan's %" PRId64, i, n, what,
                    first, total);
    *next += n;
    return 0;
}

/* Programs in stage order with one data-parallel world, their ranges back to back over
 * every op, tensor, output and module byte. A plan without a memory plan has none (the
 * runtime refuses it). */
static int check_programs(Check *c)
{
    const Plan *p = c->p;
    if (!p->n_programs) return 0;
    const char *what[] = {"ops", "tensors", "outputs", "module bytes"};
    const int64_t total[] = {p->n_ops, p->n_tensors, p->n_outputs, p->cuda_module ? (int64_t)strlen(p->cuda_module) : 0};
    int64_t next[4] = {0};
    for (int32_t i = 0; i < p->n_programs; i++) {
        const PlanProgram *g = &p->programs[i];
        if (p->n_programs > 1 ? g->stage != i : g->stage < 0)
            return fail(c, "program %d: stage %d (programs are in stage order, from 0)", i, g->stage);
        if (g->dp_world < 1) return fail(c, "program %d: %d data-parallel ranks (at least 1)", i, g->dp_world);
        if (g->dp_world != p->programs[0].dp_world)
            return fail(c, "program %d: %d data-parallel ranks, program 0 %d (every stage has as many)", i,
                        g->dp_world, p->programs[0].dp_world);
        const int64_t first[] = {g->first_op, g->first_tensor, g->first_output, g->module_at};
        const int64_t n[] = {g->n_ops, g->n_tensors, g->n_outputs, g->module_len};
        for (int k = 0; k < 4; k++)
            if (follows(c, i, what[k], first[k], n[k], &next[k], total[k])) return -1;
        for (int s = 0; s < PLAN_PLACE_COUNT; s++)
            if (g->space_bytes[s] < 0)
                return fail(c, "program %d: negative %s arena (%" PRId64 " bytes)", i, plan_place_name((PlanPlace)s),
                            g->space_bytes[s]);
    }
    for (int k = 0; k < 4; k++)
        if (next[k] != total[k])
            return fail(c, "the programs hold %" PRId64 " of the plan's %" PRId64 " %s", next[k], total[k], what[k]);
    return 0;
}

/* ---- each program refers to its own ------------------------------------------------- */

/* The stage that holds tensor t, or op k: for a message, once a check has failed. */
static int32_t tensor_stage(const Plan *p, int32_t t)
{
    for (int32_t g = 0; g < p->n_programs; g++)
        if (t >= p->programs[g].first_tensor && t < p->programs[g].first_tensor + p->programs[g].n_tensors) return g;
    return PLAN_NONE;
}

static int32_t op_stage(const Plan *p, int32_t k)
{
    for (int32_t g = 0; g < p->n_programs; g++)
        if (k >= p->programs[g].first_op && k < p->programs[g].first_op + p->programs[g].n_ops) return g;
    return PLAN_NONE;
}

static int holds_tensor(const PlanProgram *g, int32_t t) { return t >= g->first_tensor && t - g->first_tensor < g->n_tensors; }
static int holds_op(const PlanProgram *g, int32_t k) { return k >= g->first_op && k - g->first_op < g->n_ops; }

static int check_program_op(Check *c, const PlanProgram *g, int32_t k)
{
    const Plan *p = c->p;
    const PlanOp *o = &p->ops[k];
    const char *name = p->strs[o->op];
    for (int32_t j = 0; j < o->n_in + o->n_out; j++) {
        int32_t t = p->ids[j < o->n_in ? o->in + j : o->out + j - o->n_in];
        if (!holds_tensor(g, t))
            return fail(c, "op %d (%s, stage %d): %s tensor %d belongs to stage %d", k, name, g->stage,
                        j < o->n_in ? "input" : "output", t, tensor_stage(p, t));
    }
    for (int32_t j = 0; j < o->n_wait; j++) {
        int32_t w = p->waits[o->wait + j];
        if (!holds_op(g, w))
            return fail(c, "op %d (%s, stage %d): waits for op %d of stage %d", k, name, g->stage, w, op_stage(p, w));
    }
    CommOpKind kind = comm_op_kind(p, o);
    int64_t peer = comm_op_peer(p, o);
    if ((kind == COMM_OP_SEND || kind == COMM_OP_RECV) && p->n_programs > 1 && (peer >= p->n_programs || peer == g->stage))
        return fail(c, "op %d (%s, stage %d): peer %" PRId64 " is not another stage (stages 0 to %d)", k, name, g->stage,
                    peer, p->n_programs - 1);
    return 0;
}

static int check_program_tensor(Check *c, const PlanProgram *g, int32_t t)
{
    const Plan *p = c->p;
    const PlanTensor *x = &p->tensors[t];
    if (x->producer != PLAN_NONE && !holds_op(g, x->producer))
        return fail(c, "tensor %d (stage %d): producer op %d belongs to stage %d", t, g->stage, x->producer,
                    op_stage(p, x->producer));
    const char *what[] = {"grad", "alias", "tied"};
    const int32_t other[] = {x->grad, x->alias, x->tied_to};
    for (int k = 0; k < 3; k++)
        if (other[k] != PLAN_NONE && !holds_tensor(g, other[k]))
            return fail(c, "tensor %d (stage %d): %s tensor %d belongs to stage %d", t, g->stage, what[k], other[k],
                        tensor_stage(p, other[k]));
    return 0;
}

/* Each step role at most once among tensors [first, first + n): in each program, which
 * has its own step loop (a plan without programs: in the plan). */
static int check_roles(Check *c, int32_t first, int32_t n, const char *stage)
{
    const Plan *p = c->p;
    int32_t seen[PLAN_SR_COUNT];
    for (int r = 0; r < PLAN_SR_COUNT; r++) seen[r] = PLAN_NONE;
    for (int32_t t = first; t < first + n; t++) {
        PlanStepRole r = p->tensors[t].step_role;
        if (r == PLAN_SR_NONE) continue;
        if (seen[r] != PLAN_NONE)
            return fail(c, "tensor %d%s: step role %s is tensor %d's already", t, stage, plan_step_role_name(r), seen[r]);
        seen[r] = t;
    }
    return 0;
}

/* Every op, tensor, output and CUDA instruction of a program names only its own. */
static int check_owners(Check *c)
{
    const Plan *p = c->p;
    if (!p->n_programs) return check_roles(c, 0, p->n_tensors, "");
    int32_t cu = 0;  // instructions are sorted by op
    for (int32_t i = 0; i < p->n_programs; i++) {
        const PlanProgram *g = &p->programs[i];
        char stage[32];
        snprintf(stage, sizeof stage, " (stage %d)", g->stage);
        if (check_roles(c, g->first_tensor, g->n_tensors, p->n_programs > 1 ? stage : "")) return -1;
        for (int32_t k = g->first_op; k < g->first_op + g->n_ops; k++)
            if (check_program_op(c, g, k)) return -1;
        for (int32_t t = g->first_tensor; t < g->first_tensor + g->n_tensors; t++)
            if (check_program_tensor(c, g, t)) return -1;
        for (int32_t o = g->first_output; o < g->first_output + g->n_outputs; o++)
            if (!holds_tensor(g, p->outputs[o]))
                return fail(c, "output %d (stage %d): tensor %d belongs to stage %d", o, g->stage, p->outputs[o],
                            tensor_stage(p, p->outputs[o]));
        for (; cu < p->n_cuda && holds_op(g, p->cuda[cu].op); cu++)
            for (int32_t a = 0; a < p->cuda[cu].n_args; a++) {
                int32_t t = p->ids[p->cuda[cu].args + a];
                if (!holds_tensor(g, t))
                    return fail(c, "cuda %d (op %d, stage %d): arg %d: tensor %d belongs to stage %d", cu, p->cuda[cu].op,
                                g->stage, a, t, tensor_stage(p, t));
            }
    }
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
    return check_programs(&c) || check_owners(&c) ? -1 : 0;
}
