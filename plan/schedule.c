/* plan/schedule.c: that a plan's stored schedule is safe to run as stored, on one rank.
 *
 * The backends run the schedule the compiler stored (streams and waits: plan.h) and look
 * for no hazard of their own; this check, run once when a plan is loaded, is what makes
 * that safe for a file nobody vouches for. It walks the program as every backend runs
 * it: an op off the compute stream is in flight from its place in the order until an op
 * waits for it (or the step ends); no op that computes may read or write a byte of an
 * op in flight (its inputs, outputs and CUDA instruction arguments, at this rank's
 * offsets, in the same space). A
 * view op on the compute stream computes nothing (its one output starts where its input
 * does, inside it) and touches no bytes; an op in place on another stream (an all-reduce
 * into its input) is in flight all the same. Needs plan_check.
 */
#include <stdio.h>

#include "plan.h"

typedef struct {
    PlanPlace space;
    int64_t lo, hi;
} Bytes;

static Bytes bytes_of(const Plan *p, int32_t id, int rank)
{
    const PlanTensor *t = &p->tensors[id];
    int64_t lo = t->offset + (int64_t)rank * t->rank_stride;
    return (Bytes){t->place, lo, lo + plan_tensor_nbytes(t)};
}

static int overlap(Bytes a, Bytes b)
{
    return a.space == b.space && a.lo < a.hi && b.lo < b.hi && a.lo < b.hi && b.lo < a.hi;
}

/* Every tensor each op's work reads or writes: its inputs and outputs, and the arguments
 * of its CUDA instructions (a fused group's one launch, at its last member, reads the
 * inputs of all its members). ids[at[k] .. at[k + 1]) are op k's. */
typedef struct {
    int32_t *at, *ids;
} Touched;

static int touched_new(const Plan *p, Touched *t)
{
    int64_t n = 0;
    for (int32_t k = 0; k < p->n_ops; k++) n += p->ops[k].n_in + p->ops[k].n_out;
    for (int32_t i = 0; i < p->n_cuda; i++) n += p->cuda[i].n_args;
    t->at = plan_alloc(sizeof *t->at * ((size_t)p->n_ops + 1));
    t->ids = plan_alloc(sizeof *t->ids * ((size_t)n + 1));
    if (!t->at || !t->ids) return -1;
    int32_t m = 0, c = 0;  // instructions are sorted by op (plan_check)
    for (int32_t k = 0; k < p->n_ops; k++) {
        const PlanOp *o = &p->ops[k];
        t->at[k] = m;
        for (int32_t i = 0; i < o->n_in; i++) t->ids[m++] = p->ids[o->in + i];
        for (int32_t i = 0; i < o->n_out; i++) t->ids[m++] = p->ids[o->out + i];
        for (; c < p->n_cuda && p->cuda[c].op == k; c++)
            for (int32_t a = 0; a < p->cuda[c].n_args; a++) t->ids[m++] = p->ids[p->cuda[c].args + a];
    }
    t->at[p->n_ops] = m;
    return 0;
}

/* A view: one output lying where its one input starts, and no CUDA instruction, as the
 * backends skip it (an in-place sum of gradients, two inputs, computes). */
static int computes_nothing(const Plan *p, const Touched *t, int32_t k, int rank)
{
    const PlanOp *o = &p->ops[k];
    if (o->n_in != 1 || o->n_out != 1 || t->at[k + 1] - t->at[k] != 2) return 0;
    int32_t x = p->ids[o->in], y = p->ids[o->out];
    Bytes bx = bytes_of(p, x, rank), by = bytes_of(p, y, rank);
    return p->tensors[y].alias != PLAN_NONE && bx.space == by.space && bx.lo == by.lo;
}

/* Whether op k's tensors overlap op c's. */
static int touches(const Plan *p, const Touched *t, int32_t k, int32_t c, int rank)
{
    for (int32_t i = t->at[k]; i < t->at[k + 1]; i++) {
        Bytes a = bytes_of(p, t->ids[i], rank);
        for (int32_t j = t->at[c]; j < t->at[c + 1]; j++)
            if (overlap(a, bytes_of(p, t->ids[j], rank))) return 1;
    }
    return 0;
}

int plan_check_schedule(const Plan *p, int rank, char *err, size_t errlen)
{
    int32_t *pending = plan_alloc(sizeof *pending * ((size_t)p->n_ops + 1)), n_pending = 0;
    Touched t = {0};
    int rc = !pending || touched_new(p, &t) ? plan_fail(err, errlen, "out of memory") : 0;
    for (int32_t k = 0; k < p->n_ops && !rc; k++) {
        const PlanOp *o = &p->ops[k];
        for (int32_t w = 0; w < o->n_wait; w++) {
            int32_t c = p->waits[o->wait + w];
            for (int32_t j = 0; j < n_pending; j++)
                if (pending[j] == c) pending[j--] = pending[--n_pending];
        }
        if (o->stream == PLAN_STREAM_COMPUTE && computes_nothing(p, &t, k, rank)) continue;
        for (int32_t j = 0; j < n_pending && !rc; j++) {
            int32_t c = pending[j];
            if (!touches(p, &t, k, c, rank)) continue;
            const PlanOp *q = &p->ops[c];
            char at[48] = "";
            if (o->line > 0) snprintf(at, sizeof at, " (source line %d:%d)", o->line, o->col);
            rc = plan_fail(err, errlen, "the schedule is unsafe on rank %d: op %d (%s)%s touches the bytes of op %d "
                           "(%s, on the %s stream) while it may still run: no wait for it comes first (the plan is "
                           "damaged or from a different fsc; recompile it)", rank, k, plan_str(p, o->op), at, c,
                           plan_str(p, q->op), plan_stream_name(q->stream));
        }
        if (o->stream != PLAN_STREAM_COMPUTE) pending[n_pending++] = k;
    }
    plan_dealloc(pending);
    plan_dealloc(t.at);
    plan_dealloc(t.ids);
    return rc;
}
