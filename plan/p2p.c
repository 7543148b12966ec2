/* plan/p2p.c: that the pipeline's programs, run as stored, meet each other and finish.
 *
 * First the pairing: the k-th send from stage a to stage b meets the k-th receive on b
 * whose peer is a (in program order), with the same dtype and element count; the i-th
 * collective over the pipeline (group 1) of every program meets the i-th of every other,
 * the same op over the same dtype and element count. Then a simulation, as the CPU
 * runtime runs a step: each program starts its ops in order, one at a time, an op once
 * every op its waits name is complete; starting never blocks. A send or receive is
 * complete once its partner has started (a synchronous send: the worst case, with no
 * reliance on eager buffering); a pipeline collective once every program has started
 * its counterpart; any other op (a data-parallel collective included: every rank of a
 * stage runs the same program) once started. A program is done at its end with nothing
 * it started pending. A program that cannot go on waits on one op; a worklist of
 * programs, each woken when an op it waits on completes, makes the simulation linear in
 * the ops (the pairing sorts, n log n). Whatever stops it is reported as a deadlock that
 * follows the chain of waits from stage to stage. Needs plan_check.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_op.h"
#include "plan.h"

typedef struct {
    const Plan *p;
    char *err;
    size_t errlen;
    int32_t n_slots;   // pipeline collectives each program runs
    /* per op */
    int32_t *partner;  // a send's or receive's partner op, else PLAN_NONE
    int32_t *slot;     // a pipeline collective's index among its program's, else PLAN_NONE
    uint8_t *started;
    /* per slot i: how many programs have started it, and program g's op for it */
    int32_t *slot_started, *slot_op;  // slot_op[g * n_slots + i]
    /* per program */
    int32_t *pc, *wi;   // the op it is at (from its first), and how many of its waits are complete
    int32_t *pending;   // ops it started that are not complete
    int32_t *queue, n_queue;
    uint8_t *queued;
} Sim;

__attribute__((format(printf, 2, 3))) static int fail(Sim *s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    plan_vfail(s->err, s->errlen, fmt, ap);
    va_end(ap);
    return -1;
}

/* The program (stage) that holds op k. */
static int32_t stage_of(const Plan *p, int32_t k)
{
    int32_t lo = 0, hi = p->n_programs - 1;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo + 1) / 2;
        if (p->programs[mid].first_op <= k) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* A message built piece by piece in a buffer of len bytes, cut at its end. */
typedef struct {
    char *buf;
    size_t len, at;
} Msg;

__attribute__((format(printf, 2, 3))) static void say(Msg *m, const char *fmt, ...)
{
    if (m->at + 1 >= m->len) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(m->buf + m->at, m->len - m->at, fmt, ap);
    va_end(ap);
    if (n > 0) m->at = m->at + (size_t)n < m->len ? m->at + (size_t)n : m->len - 1;
}

/* "op 40 (recv from stage 1, micro-batch 1)", for messages. */
static const char *describe(const Plan *p, int32_t k, char *buf, size_t n)
{
    const PlanOp *o = &p->ops[k];
    CommOpKind kind = comm_op_kind(p, o);
    Msg m = {buf, n, 0};
    say(&m, "op %d (%s", k, plan_str(p, o->op));
    if (kind == COMM_OP_SEND || kind == COMM_OP_RECV)
        say(&m, " %s stage %" PRId64, kind == COMM_OP_SEND ? "to" : "from", comm_op_peer(p, o));
    if (kind == COMM_OP_COLLECTIVE && comm_op_group(p, o) == COMM_GROUP_PIPE) say(&m, " over the pipeline");
    if (o->microbatch != PLAN_NONE) say(&m, ", micro-batch %d", o->microbatch);
    say(&m, ")");
    return buf;
}

/* "1024 f32": what op k's tensor (a send's or collective's input, a receive's output) holds. */
static const char *payload(const Plan *p, int32_t k, char *buf, size_t n)
{
    const PlanOp *o = &p->ops[k];
    const PlanTensor *t = &p->tensors[p->ids[o->n_in ? o->in : o->out]];
    snprintf(buf, n, "%" PRId64 " %s", plan_tensor_numel(t), plan_dtype_name(t->dtype));
    return buf;
}

static int same_payload(const Plan *p, int32_t a, int32_t b)
{
    char x[64], y[64];
    return !strcmp(payload(p, a, x, sizeof x), payload(p, b, y, sizeof y));
}

/* ---- pairing ------------------------------------------------------------------------- */

typedef struct {
    int32_t from, to;
    int64_t tag;
    int32_t op;
} Leg;

static int leg_cmp(const void *a, const void *b)
{
    const Leg *x = a, *y = b;
    if (x->from != y->from) return x->from < y->from ? -1 : 1;
    if (x->to != y->to) return x->to < y->to ? -1 : 1;
    if (x->tag != y->tag) return x->tag < y->tag ? -1 : 1;
    return (x->op > y->op) - (x->op < y->op);
}

static const char *nth(int32_t i, char *buf, size_t n)
{
    int32_t k = i + 1;
    const char *suffix = k % 100 >= 11 && k % 100 <= 13 ? "th" : k % 10 == 1 ? "st" : k % 10 == 2 ? "nd" : k % 10 == 3 ? "rd" : "th";
    snprintf(buf, n, "%d%s", k, suffix);
    return buf;
}

/* Sends and receives, each sorted by (from, to, program order), are matched group by
 * group: the k-th of each pair. */
static int pair_legs(Sim *s, const Leg *send, int32_t n_send, const Leg *recv, int32_t n_recv)
{
    const Plan *p = s->p;
    int32_t i = 0, j = 0;
    while (i < n_send || j < n_recv) {
        const Leg *key = j == n_recv || (i < n_send && leg_cmp(&send[i], &recv[j]) <= 0) ? &send[i] : &recv[j];
        int32_t a = key->from, b = key->to, ns = 0, nr = 0;
        int64_t tag = key->tag;
        while (i + ns < n_send && send[i + ns].from == a && send[i + ns].to == b && send[i + ns].tag == tag) ns++;
        while (j + nr < n_recv && recv[j + nr].from == a && recv[j + nr].to == b && recv[j + nr].tag == tag) nr++;
        if (ns != nr) {
            char with[32] = "";
            if (tag) snprintf(with, sizeof with, " with tag %" PRId64, tag);
            return fail(s, "stage %d sends %d tensor%s to stage %d%s, which receives %d from it", a, ns,
                        ns == 1 ? "" : "s", b, with, nr);
        }
        for (int32_t k = 0; k < ns; k++) {
            int32_t x = send[i + k].op, y = recv[j + k].op;
            s->partner[x] = y, s->partner[y] = x;
            if (!same_payload(p, x, y)) {
                char dx[160], dy[160], px[64], py[64], n[16];
                return fail(s, "%s sends %s, but its partner, %s, receives %s (the %s tensor from stage %d to stage %d)",
                            describe(p, x, dx, sizeof dx), payload(p, x, px, sizeof px), describe(p, y, dy, sizeof dy),
                            payload(p, y, py, sizeof py), nth(k, n, sizeof n), a, b);
            }
        }
        i += ns, j += nr;
    }
    return 0;
}

static int pair_p2p(Sim *s)
{
    const Plan *p = s->p;
    int32_t n = 0;
    for (int32_t k = 0; k < p->n_ops; k++) {
        CommOpKind kind = comm_op_kind(p, &p->ops[k]);
        n += kind == COMM_OP_SEND || kind == COMM_OP_RECV;
    }
    Leg *legs = plan_alloc(sizeof *legs * (size_t)n);
    if (!legs) return fail(s, "out of memory checking the pipeline's sends and receives");
    int32_t n_send = 0, n_recv = n;  // sends fill from the front, receives from the back
    for (int32_t g = 0; g < p->n_programs; g++) {
        const PlanProgram *pg = &p->programs[g];
        for (int32_t k = pg->first_op; k < pg->first_op + pg->n_ops; k++) {
            CommOpKind kind = comm_op_kind(p, &p->ops[k]);
            int32_t peer = (int32_t)comm_op_peer(p, &p->ops[k]);
            int64_t tag = comm_op_tag(p, &p->ops[k]);
            if (kind == COMM_OP_SEND) legs[n_send++] = (Leg){g, peer, tag, k};
            if (kind == COMM_OP_RECV) legs[--n_recv] = (Leg){peer, g, tag, k};
        }
    }
    qsort(legs, (size_t)n_send, sizeof *legs, leg_cmp);
    qsort(legs + n_send, (size_t)(n - n_send), sizeof *legs, leg_cmp);
    int rc = pair_legs(s, legs, n_send, legs + n_send, n - n_send);
    plan_dealloc(legs);
    return rc;
}

static int is_pipe_collective(const Plan *p, const PlanOp *o)
{
    return comm_op_kind(p, o) == COMM_OP_COLLECTIVE && comm_op_group(p, o) == COMM_GROUP_PIPE;
}

/* The i-th pipeline collective of every program meets the i-th of program 0. */
static int pair_collectives(Sim *s)
{
    const Plan *p = s->p;
    int32_t P = p->n_programs;
    for (int32_t g = 0; g < P; g++) {
        const PlanProgram *pg = &p->programs[g];
        int32_t n = 0;
        for (int32_t k = pg->first_op; k < pg->first_op + pg->n_ops; k++) n += is_pipe_collective(p, &p->ops[k]);
        if (!g) s->n_slots = n;
        else if (n != s->n_slots)
            return fail(s, "stage %d runs %d collective%s over the pipeline, stage 0 runs %d (every stage runs each)", g,
                        n, n == 1 ? "" : "s", s->n_slots);
    }
    s->slot_started = plan_alloc(sizeof *s->slot_started * (size_t)s->n_slots);
    s->slot_op = plan_alloc(sizeof *s->slot_op * (size_t)P * (size_t)s->n_slots);
    if (!s->slot_started || !s->slot_op) return fail(s, "out of memory checking the pipeline's collectives");
    memset(s->slot_started, 0, sizeof *s->slot_started * (size_t)s->n_slots);
    for (int32_t g = 0; g < P; g++) {
        const PlanProgram *pg = &p->programs[g];
        int32_t i = 0;
        for (int32_t k = pg->first_op; k < pg->first_op + pg->n_ops; k++)
            if (is_pipe_collective(p, &p->ops[k])) s->slot[k] = i, s->slot_op[g * s->n_slots + i++] = k;
    }
    for (int32_t g = 1; g < P; g++)
        for (int32_t i = 0; i < s->n_slots; i++) {
            int32_t x = s->slot_op[i], y = s->slot_op[g * s->n_slots + i];
            if (strcmp(plan_str(p, p->ops[x].op), plan_str(p, p->ops[y].op)) || !same_payload(p, x, y)) {
                char dx[160], dy[160], px[64], py[64], n[16];
                return fail(s, "the %s collective over the pipeline differs: stage 0 runs %s over %s, stage %d %s over %s",
                            nth(i, n, sizeof n), describe(p, x, dx, sizeof dx), payload(p, x, px, sizeof px), g,
                            describe(p, y, dy, sizeof dy), payload(p, y, py, sizeof py));
            }
        }
    return 0;
}

/* ---- the simulation ---------------------------------------------------------------- */

static int complete(const Sim *s, int32_t k)
{
    if (s->partner[k] != PLAN_NONE) return s->started[s->partner[k]];
    if (s->slot[k] != PLAN_NONE) return s->slot_started[s->slot[k]] == s->p->n_programs;
    return s->started[k];
}

static void wake(Sim *s, int32_t g)
{
    if (!s->queued[g]) s->queued[g] = 1, s->queue[s->n_queue++] = g;
}

/* Starts op k of program g: what waited on its start (a partner, a collective's other
 * programs) completes, or it waits itself. */
static void start(Sim *s, int32_t g, int32_t k)
{
    s->started[k] = 1;
    int32_t y = s->partner[k], i = s->slot[k], P = s->p->n_programs;
    if (y != PLAN_NONE && !s->started[y]) s->pending[g]++;  // complete once y starts
    if (y != PLAN_NONE && s->started[y]) {                  // y was waiting for k
        int32_t h = stage_of(s->p, y);
        s->pending[h]--;
        wake(s, h);
    }
    if (i != PLAN_NONE && ++s->slot_started[i] < P) s->pending[g]++;
    else if (i != PLAN_NONE)  // the last program to start it completes every program's
        for (int32_t h = 0; h < P; h++)
            if (h != g) s->pending[h]--, wake(s, h);
}

/* Runs program g until its end or an op whose waits are not all complete. */
static void run(Sim *s, int32_t g)
{
    const Plan *p = s->p;
    const PlanProgram *pg = &p->programs[g];
    while (s->pc[g] < pg->n_ops) {
        int32_t k = pg->first_op + s->pc[g];
        const PlanOp *o = &p->ops[k];
        while (s->wi[g] < o->n_wait && complete(s, p->waits[o->wait + s->wi[g]])) s->wi[g]++;
        if (s->wi[g] < o->n_wait) return;  // woken again when that op completes
        start(s, g, k);
        s->pc[g]++, s->wi[g] = 0;
    }
}

static int stuck(const Sim *s, int32_t g) { return s->pc[g] < s->p->programs[g].n_ops || s->pending[g] > 0; }

/* ---- the deadlock, as a chain of waits ------------------------------------------------ */

/* An op program g started that is not complete (g is at its end). */
static int32_t pending_op(const Sim *s, int32_t g)
{
    const PlanProgram *pg = &s->p->programs[g];
    for (int32_t k = pg->first_op; k < pg->first_op + pg->n_ops; k++)
        if (s->started[k] && !complete(s, k)) return k;
    return PLAN_NONE;
}

/* Says what stuck program g waits on; returns the stage that keeps that op from
 * completing (itself stuck: it has not started the op's counterpart). */
static int32_t explain(const Sim *s, Msg *m, int32_t g)
{
    const Plan *p = s->p;
    const PlanProgram *pg = &p->programs[g];
    char a[160], b[160];
    int32_t w;
    if (s->pc[g] < pg->n_ops) {
        int32_t k = pg->first_op + s->pc[g];
        w = p->waits[p->ops[k].wait + s->wi[g]];
        say(m, "stage %d waits at %s for %s", g, describe(p, k, a, sizeof a), describe(p, w, b, sizeof b));
    } else {
        w = pending_op(s, g);
        say(m, "stage %d ends with %s pending", g, describe(p, w, a, sizeof a));
    }
    int32_t y = s->partner[w];
    if (y == PLAN_NONE) {  // a pipeline collective: the first program that has not started it
        int32_t i = s->slot[w];
        for (int32_t h = 0; h < p->n_programs; h++) {
            y = s->slot_op[h * s->n_slots + i];
            if (!s->started[y]) break;
        }
    }
    int32_t h = stage_of(p, y);
    const char *verb = s->partner[w] == PLAN_NONE                         ? "runs"
                       : comm_op_kind(p, &p->ops[y]) == COMM_OP_SEND ? "sends"
                                                                     : "receives";
    say(m, ", which stage %d %s at op %d, not %s", h, verb, y,
        y == p->programs[h].first_op + s->pc[h] ? "started" : "reached");
    return h;
}

static int deadlock(const Sim *s)
{
    const Plan *p = s->p;
    Msg m = {s->err, s->errlen, 0};
    if (!m.buf || !m.len) return -1;
    m.buf[0] = 0;
    say(&m, "deadlock: ");
    uint8_t *told = s->queued;  // the worklist is empty: its flags are free
    memset(told, 0, (size_t)p->n_programs);
    int first = 1;
    for (int32_t g = 0; g < p->n_programs; g++) {
        if (!stuck(s, g) || told[g]) continue;
        say(&m, first ? "" : "; ");
        first = 0;
        for (int32_t h = g; !told[h]; ) {  // along the chain while it reaches stages not told
            told[h] = 1;
            h = explain(s, &m, h);
            if (!told[h]) say(&m, ": ");
        }
    }
    return -1;
}

/* ---- the check ----------------------------------------------------------------------- */

static void sim_free(Sim *s)
{
    plan_dealloc(s->partner), plan_dealloc(s->slot), plan_dealloc(s->started);
    plan_dealloc(s->slot_started), plan_dealloc(s->slot_op);
    plan_dealloc(s->pc), plan_dealloc(s->wi), plan_dealloc(s->pending);
    plan_dealloc(s->queue), plan_dealloc(s->queued);
}

static int simulate(Sim *s)
{
    const Plan *p = s->p;
    size_t n = (size_t)p->n_ops, P = (size_t)p->n_programs;
    s->partner = plan_alloc(sizeof *s->partner * n), s->slot = plan_alloc(sizeof *s->slot * n);
    s->started = plan_alloc(n);
    s->pc = plan_alloc(sizeof *s->pc * P), s->wi = plan_alloc(sizeof *s->wi * P);
    s->pending = plan_alloc(sizeof *s->pending * P);
    s->queue = plan_alloc(sizeof *s->queue * P), s->queued = plan_alloc(P);
    if (!s->partner || !s->slot || !s->started || !s->pc || !s->wi || !s->pending || !s->queue || !s->queued)
        return fail(s, "out of memory checking the pipeline's sends and receives");
    for (size_t k = 0; k < n; k++) s->partner[k] = s->slot[k] = PLAN_NONE;
    memset(s->started, 0, n);
    memset(s->pc, 0, sizeof *s->pc * P), memset(s->wi, 0, sizeof *s->wi * P);
    memset(s->pending, 0, sizeof *s->pending * P), memset(s->queued, 0, P);
    if (pair_p2p(s) || pair_collectives(s)) return -1;
    for (int32_t g = (int32_t)P - 1; g >= 0; g--) wake(s, g);  // popped in stage order
    while (s->n_queue) {
        int32_t g = s->queue[--s->n_queue];
        s->queued[g] = 0;
        run(s, g);
    }
    for (int32_t g = 0; g < p->n_programs; g++)
        if (stuck(s, g)) return deadlock(s);
    return 0;
}

int plan_check_p2p(const Plan *p, char *err, size_t errlen)
{
    if (p->n_programs < 2) return 0;
    Sim s = {.p = p, .err = err, .errlen = errlen};
    int rc = simulate(&s);
    sim_free(&s);
    return rc;
}
