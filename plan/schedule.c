/* plan/schedule.c: that a plan's stored schedule is safe to run as stored, on one rank.
 *
 * The backends run the schedule the compiler stored (streams and waits: plan.h) and look
 * for no hazard of their own; this check, run once when a plan is loaded, is what makes
 * that safe for a file nobody vouches for. It walks the program as every backend runs
 * it: an op off the compute stream is in flight from its place in the order until an op
 * waits for it (or the step ends); no op that computes may read or write a byte of an
 * op in flight (its inputs and outputs, at this rank's offsets, in the same space). A
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

/* A view: one output lying where its one input starts, as the backends skip it. */
static int computes_nothing(const Plan *p, const PlanOp *o, int rank)
{
    if (o->n_in < 1 || o->n_out != 1) return 0;
    int32_t x = p->ids[o->in], y = p->ids[o->out];
    Bytes bx = bytes_of(p, x, rank), by = bytes_of(p, y, rank);
    return p->tensors[y].alias != PLAN_NONE && bx.space == by.space && bx.lo == by.lo;
}

/* Whether op k's tensors overlap op c's. */
static int touches(const Plan *p, int32_t k, int32_t c, int rank)
{
    const PlanOp *o = &p->ops[k], *q = &p->ops[c];
    for (int32_t i = 0; i < o->n_in + o->n_out; i++) {
        Bytes a = bytes_of(p, p->ids[i < o->n_in ? o->in + i : o->out + i - o->n_in], rank);
        for (int32_t j = 0; j < q->n_in + q->n_out; j++)
            if (overlap(a, bytes_of(p, p->ids[j < q->n_in ? q->in + j : q->out + j - q->n_in], rank))) return 1;
    }
    return 0;
}

int plan_check_schedule(const Plan *p, int rank, char *err, size_t errlen)
{
    int32_t *pending = plan_alloc(sizeof *pending * ((size_t)p->n_ops + 1)), n_pending = 0;
    if (!pending) return plan_fail(err, errlen, "out of memory");
    int rc = 0;
    for (int32_t k = 0; k < p->n_ops && !rc; k++) {
        const PlanOp *o = &p->ops[k];
        for (int32_t w = 0; w < o->n_wait; w++) {
            int32_t c = p->waits[o->wait + w];
            for (int32_t j = 0; j < n_pending; j++)
                if (pending[j] == c) pending[j--] = pending[--n_pending];
        }
        if (o->stream == PLAN_STREAM_COMPUTE && computes_nothing(p, o, rank)) continue;
        for (int32_t j = 0; j < n_pending && !rc; j++) {
            int32_t c = pending[j];
            if (!touches(p, k, c, rank)) continue;
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
    return rc;
}
