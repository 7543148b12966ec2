/* report/timeline.c: the step's schedule on a logical clock (fsc --timeline, the lanes of
 * --mem=html), from the plan alone: where each stage computes, where it waits (the
 * pipeline's bubble), and how long the step takes.
 *
 * Tasks: within each program, a maximal run of consecutive ops of one micro-batch and
 * one phase class is a task: the forward (PLAN_PHASE_FORWARD) or the backward (BACKWARD
 * or RECOMPUTE) of micro-batch m, "F m" and "B m". The step's own work (ops of no
 * micro-batch, and every optimizer op) makes "step" tasks, except where it lies inside
 * a micro-batch's task (ops of that task on both sides: an accumulator zeroed, a
 * reduction started under the last backward), which it then belongs to. An op of a
 * micro-batch that is neither (a send, receive or collective, phase COMM) joins its
 * micro-batch's task beside it: a receive the one it precedes, any other the one it
 * follows (else the other side).
 *
 * The clock: each stage runs its tasks one at a time, in program order. A task's time
 * is its ops' FLOPs at a nominal REPORT_TL_RATE (so times read as ms on one such
 * accelerator), or unit costs (forward 1, backward 2, step 0), which make the textbook
 * numbers checkable: GPipe and 1F1B take (M + P - 1) x 3 for P stages and M
 * micro-batches. The clock runs op by op, each op taking its share of its task's time
 * (by FLOPs; without them, evenly over the ops that are not sends or receives): a
 * receive waits until the matching send is done (the k-th send from stage a to stage b
 * with a tag meets the k-th receive on b from a with it; a transfer takes no time), and the i-th
 * collective over the pipeline group ends on every stage together, once all are at it.
 * A task's receives come first and its sends last, so a task that holds a receive (and
 * so every later task, which reads what it received) starts no earlier than the end of
 * the peer's task that holds the send; and a stage's step can send its tied gradients
 * and then receive its peer's, as the compiler has it, without waiting on itself.
 *
 * A zero-bubble plan's weight-gradient phase is a kind of its own (W: op_kind, UNIT_COST,
 * LETTER); an interleaved plan's model chunks are told apart by micro-batch, as no two
 * chunks of one micro-batch run back to back on a stage.
 *
 * A plan in which no op has a micro-batch (one micro-batch a step, or a 2.0 file) is
 * one micro-batch: its forward and backward are F0 and B0.
 *
 * The plan passed plan_check; what it does not check (micro-batches, FLOPs, peers) is
 * not trusted: a negative micro-batch is none, a FLOP count that is not a finite
 * positive number is 0 (one above MAX_OP_FLOPS counts as MAX_OP_FLOPS), and a peer that is no other
 * stage is an error.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "report.h"

enum { LANE_COLS = 100, MAX_STUCK = 4 };
static const double MAX_OP_FLOPS = 1e30;

/* With weight-gradient tasks (zero-bubble) a backward is the inputs' gradients alone:
 * F = B = W = 1, ZB's own accounting; else F = 1, B = 2. */
static const double UNIT_COST[TL_KIND_COUNT] = {1, 2, 0, 1};
static const char *const LETTER[TL_KIND_COUNT] = {"F", "B", "step", "W"};

static double unit_cost(const Timeline *t, TlKind k) { return k == TL_BACKWARD && t->split_backward ? 1 : UNIT_COST[k]; }

/* Each op's micro-batch: its own (a negative one is none); in a plan where no op has
 * one (a step of one micro-batch, or a 2.0 file), 0 for the forward's and backward's ops. */
static void microbatches_of(const Plan *p, int32_t *mb)
{
    int any = 0;
    for (int32_t k = 0; k < p->n_ops; k++) any |= p->ops[k].microbatch >= 0;
    for (int32_t k = 0; k < p->n_ops; k++) {
        PlanPhase ph = p->ops[k].phase;
        int compute = ph == PLAN_PHASE_FORWARD || ph == PLAN_PHASE_BACKWARD || ph == PLAN_PHASE_RECOMPUTE ||
                      ph == PLAN_PHASE_WGRAD;
        mb[k] = p->ops[k].microbatch >= 0 ? p->ops[k].microbatch : !any && compute ? 0 : PLAN_NONE;
    }
}

/* The kind of task an op of micro-batch mb belongs to; -1 when it takes the kind of its
 * micro-batch's task beside it. */
static int op_kind(const PlanOp *op, int32_t mb)
{
    if (mb == PLAN_NONE) return TL_STEP;
    switch (op->phase) {
    case PLAN_PHASE_FORWARD: return TL_FORWARD;
    case PLAN_PHASE_BACKWARD:
    case PLAN_PHASE_RECOMPUTE: return TL_BACKWARD;
    case PLAN_PHASE_WGRAD: return TL_WEIGHT;
    case PLAN_PHASE_OPTIMIZER: return TL_STEP;
    case PLAN_PHASE_COMM:
    case PLAN_PHASE_COUNT: break;
    }
    return -1;
}

/* Whether op k can take the kind of op n beside it: n is of the same micro-batch and
 * is a forward or a backward. */
static int joins(const int8_t *kind, const int32_t *mb, int32_t k, int32_t n)
{
    return kind[n] >= 0 && kind[n] != TL_STEP && mb[n] == mb[k];
}

/* Each op's task kind in program g. One that takes a neighbour's joins the task it
 * feeds or is fed by: a receive the one after it (which reads what it received), any
 * other (a send, a collective) the one before it (which made what it moves); else the
 * other side; failing both, it is the step's work. */
static void resolve_kinds(const Plan *p, const PlanProgram *g, int8_t *kind, const int32_t *mb)
{
    int32_t a = g->first_op, e = g->first_op + g->n_ops;
    for (int32_t k = a; k < e; k++) kind[k] = (int8_t)op_kind(&p->ops[k], mb[k]);
    for (int32_t k = a + 1; k < e; k++)
        if (kind[k] < 0 && report_op_comm(p, &p->ops[k]) != COMM_RECV && joins(kind, mb, k, k - 1)) kind[k] = kind[k - 1];
    for (int32_t k = e - 2; k >= a; k--)
        if (kind[k] < 0 && joins(kind, mb, k, k + 1)) kind[k] = kind[k + 1];
    for (int32_t k = a; k < e; k++)
        kind[k] = kind[k] >= 0 ? kind[k] : k > a && joins(kind, mb, k, k - 1) ? kind[k - 1] : TL_STEP;
}

/* The step's ops inside a micro-batch's task (a gradient accumulator zeroed where the
 * backward first writes it, a reduction started under the last backward) are part of
 * it, so a task is never cut in two by them: each op's micro-batch becomes its task's. */
static void join_inner_steps(const PlanProgram *g, int8_t *kind, int32_t *mb)
{
    int32_t a = g->first_op, e = g->first_op + g->n_ops;
    for (int32_t k = a; k < e; k++)
        if (kind[k] == TL_STEP) mb[k] = PLAN_NONE;
    for (int32_t i = a; i < e;) {
        int32_t j = i;
        while (j < e && kind[j] == TL_STEP) j++;
        if (j > i && i > a && j < e && kind[i - 1] == kind[j] && mb[i - 1] == mb[j])
            for (int32_t k = i; k < j; k++) kind[k] = kind[j], mb[k] = mb[j];
        i = j > i ? j : i + 1;
    }
}

/* An op's FLOPs, capped so that no sum over a plan's ops overflows. */
static double op_flops(const PlanOp *op)
{
    return !isfinite(op->flops) || op->flops <= 0 ? 0 : op->flops < MAX_OP_FLOPS ? op->flops : MAX_OP_FLOPS;
}

static int fail(char *err, size_t errlen, const char *msg)
{
    snprintf(err, errlen, "%s", msg);
    return -1;
}

/* ---- tasks ----------------------------------------------------------------------- */

static int add_tasks(Timeline *t, int32_t *task_of)
{
    const Plan *p = t->plan;
    int8_t *kind = plan_alloc((size_t)p->n_ops + 1);
    int32_t *mbs = plan_alloc(sizeof *mbs * ((size_t)p->n_ops + 1));
    t->tasks = plan_alloc(sizeof *t->tasks * ((size_t)p->n_ops + (size_t)p->n_programs));
    if (!kind || !mbs || !t->tasks) return plan_dealloc(kind), plan_dealloc(mbs), -1;
    microbatches_of(p, mbs);
    for (int32_t s = 0; s < p->n_programs; s++) {
        const PlanProgram *g = &p->programs[s];
        resolve_kinds(p, g, kind, mbs);
        join_inner_steps(g, kind, mbs);
        t->stages[s].first_task = t->n_tasks;
        for (int32_t k = g->first_op; k < g->first_op + g->n_ops; k++) {
            TlTask *last = t->n_tasks > t->stages[s].first_task ? &t->tasks[t->n_tasks - 1] : NULL;
            int32_t mb = mbs[k];
            if (!last || last->kind != (TlKind)kind[k] || last->microbatch != mb) {
                last = &t->tasks[t->n_tasks++];
                *last = (TlTask){.kind = (TlKind)kind[k], .stage = s, .microbatch = mb, .first_op = k};
                if (mb != PLAN_NONE && mb >= t->n_microbatches) t->n_microbatches = mb < INT32_MAX ? mb + 1 : mb;
            }
            last->n_ops++;
            last->flops += op_flops(&p->ops[k]);
            task_of[k] = t->n_tasks - 1;
        }
        t->stages[s].n_tasks = t->n_tasks - t->stages[s].first_task;
    }
    plan_dealloc(kind), plan_dealloc(mbs);
    return 0;
}

static void cost_tasks(Timeline *t)
{
    int any = 0;
    for (int32_t i = 0; i < t->n_tasks; i++) any |= t->tasks[i].flops > 0;
    if (t->cost == TL_COST_FLOPS && !any) t->cost = TL_COST_UNIT, t->fell_back = 1;
    for (int32_t i = 0; i < t->n_tasks; i++) t->split_backward |= t->tasks[i].kind == TL_WEIGHT;
    for (int32_t i = 0; i < t->n_tasks; i++) {
        TlTask *x = &t->tasks[i];
        x->cost = t->cost == TL_COST_UNIT ? unit_cost(t, x->kind) : x->flops / REPORT_TL_RATE * 1e3;
    }
}

/* ---- sends meet receives ------------------------------------------------------------ */

typedef struct {
    int32_t from, to, op;  // the sending stage, the receiving stage, the op
    int64_t tag;           // the k-th send of a tag meets the k-th receive of it
} P2p;

static int pair_cmp(const P2p *a, const P2p *b)
{
    if (a->from != b->from) return a->from < b->from ? -1 : 1;
    if (a->to != b->to) return a->to < b->to ? -1 : 1;
    return a->tag < b->tag ? -1 : a->tag > b->tag;
}

static int by_pair(const void *x, const void *y)
{
    const P2p *a = x, *b = y;
    int c = pair_cmp(a, b);
    return c ? c : a->op < b->op ? -1 : a->op > b->op;
}

/* Every send (to its peer) and receive (from its peer), sorted by pair and then program
 * order; -1 with a message for a peer that is no other stage. */
static int collect_p2p(const Plan *p, P2p *sends, int32_t *n_sends, P2p *recvs, int32_t *n_recvs, char *err,
                       size_t errlen)
{
    for (int32_t s = 0; s < p->n_programs; s++) {
        const PlanProgram *g = &p->programs[s];
        for (int32_t k = g->first_op; k < g->first_op + g->n_ops; k++) {
            OpComm c = report_op_comm(p, &p->ops[k]);
            if (c != COMM_SEND && c != COMM_RECV) continue;
            int64_t peer = report_op_int(p, &p->ops[k], "peer", -1);
            if (peer < 0 || peer >= p->n_programs || peer == s) {
                snprintf(err, errlen, "op %d (%s on stage %d): peer %lld is not another of the %d stages", k,
                         c == COMM_SEND ? "send" : "recv", s, (long long)peer, p->n_programs);
                return -1;
            }
            int64_t tag = report_op_int(p, &p->ops[k], "tag", 0);
            if (c == COMM_SEND)
                sends[(*n_sends)++] = (P2p){s, (int32_t)peer, k, tag};
            else
                recvs[(*n_recvs)++] = (P2p){(int32_t)peer, s, k, tag};
        }
    }
    qsort(sends, (size_t)*n_sends, sizeof *sends, by_pair);
    qsort(recvs, (size_t)*n_recvs, sizeof *recvs, by_pair);
    return 0;
}

/* Where the run of pair (from, to) and tag starting at i ends. */
static int32_t pair_end(const P2p *x, int32_t i, int32_t n)
{
    int32_t e = i;
    while (e < n && !pair_cmp(&x[e], &x[i])) e++;
    return e;
}

/* What the clock knows of each op beside its task. */
typedef struct {
    Timeline *t;
    const int32_t *task_of;  // [n_ops]
    double *cost;            // [n_ops] the op's share of its task's time
    int32_t *partner;        // [n_ops] a receive's send; -1 for any other op
    int32_t *pipe;           // [n_ops] a pipeline collective's ordinal on its stage; -1 for any other op
    double *sent;            // [n_ops] when a send was done; -1 until then
    double *release;         // [n_pipe] when the i-th pipeline collective ends; -1 until every stage is at it
    int32_t *begins;         // [n_tasks] the op a task's box begins at: its first that takes time
    int32_t *next;           // [n_stages] each stage's next op
    double *clock;           // [n_stages]
    int32_t n_pipe;          // pipeline collectives on every stage
} Clock;

typedef struct {
    int32_t task, dep;
} Edge;

static int by_task(const void *x, const void *y)
{
    const Edge *a = x, *b = y;
    if (a->task != b->task) return a->task < b->task ? -1 : 1;
    return a->dep < b->dep ? -1 : a->dep > b->dep;
}

/* Pairs the k-th send of each (from, to) with the k-th receive: the receive's partner,
 * and an edge from the receive's task to the send's. */
static int match(Clock *c, const P2p *sends, int32_t ns, const P2p *recvs, int32_t nr, Edge *edges, int32_t *n_edges,
                 char *err, size_t errlen)
{
    for (int32_t i = 0, j = 0; i < ns || j < nr;) {
        int cmp = i == ns ? 1 : j == nr ? -1 : pair_cmp(&sends[i], &recvs[j]);
        int32_t ie = cmp <= 0 ? pair_end(sends, i, ns) : i, je = cmp >= 0 ? pair_end(recvs, j, nr) : j;
        if (ie - i != je - j) {
            const P2p *x = cmp <= 0 ? &sends[i] : &recvs[j];
            snprintf(err, errlen, "stage %d sends %d tensor%s to stage %d, which receives %d from it", x->from, ie - i,
                     ie - i == 1 ? "" : "s", x->to, je - j);
            return -1;
        }
        for (; i < ie; i++, j++) {
            c->partner[recvs[j].op] = sends[i].op;
            edges[(*n_edges)++] = (Edge){c->task_of[recvs[j].op], c->task_of[sends[i].op]};
        }
    }
    return 0;
}

/* Each task's list of the tasks that hold the sends of its receives, once each. */
static void set_deps(Timeline *t, Edge *edges, int32_t n)
{
    qsort(edges, (size_t)n, sizeof *edges, by_task);
    for (int32_t i = 0; i < n; i++) {
        TlTask *x = &t->tasks[edges[i].task];
        if (i && !by_task(&edges[i], &edges[i - 1])) continue;
        if (!x->n_deps) x->first_dep = t->n_deps;
        t->deps[t->n_deps++] = edges[i].dep;
        x->n_deps++;
    }
}

static int link_p2p(Clock *c, char *err, size_t errlen)
{
    const Plan *p = c->t->plan;
    size_t n = (size_t)p->n_ops + 1;
    P2p *sends = plan_alloc(sizeof *sends * n), *recvs = plan_alloc(sizeof *recvs * n);
    Edge *edges = plan_alloc(sizeof *edges * n);
    c->t->deps = plan_alloc(sizeof *c->t->deps * n);
    int32_t ns = 0, nr = 0, ne = 0;
    int rc = !sends || !recvs || !edges || !c->t->deps ? fail(err, errlen, "out of memory")
             : collect_p2p(p, sends, &ns, recvs, &nr, err, errlen) ? -1
                                                                     : match(c, sends, ns, recvs, nr, edges, &ne, err, errlen);
    if (!rc) set_deps(c->t, edges, ne);
    plan_dealloc(sends), plan_dealloc(recvs), plan_dealloc(edges);
    return rc;
}

/* The i-th collective over the pipeline group of every stage is one: it ends for all of
 * them together, once the last has reached it. */
static int link_pipe(Clock *c, char *err, size_t errlen)
{
    const Plan *p = c->t->plan;
    for (int32_t s = 0; s < p->n_programs; s++) {
        const PlanProgram *g = &p->programs[s];
        int32_t n = 0;
        for (int32_t k = g->first_op; k < g->first_op + g->n_ops; k++) {
            OpComm kind = report_op_comm(p, &p->ops[k]);
            int coll = kind != COMM_NONE && kind != COMM_SEND && kind != COMM_RECV;
            c->pipe[k] = coll && report_op_int(p, &p->ops[k], "group", OP_GROUP_DATA) == OP_GROUP_PIPE ? n++ : -1;
        }
        if (s && n != c->n_pipe) {
            snprintf(err, errlen, "stage %d runs %d collectives over the pipeline group, stage 0 %d", s, n, c->n_pipe);
            return -1;
        }
        c->n_pipe = n;
    }
    c->release = plan_alloc(sizeof *c->release * ((size_t)c->n_pipe + 1));
    if (!c->release) return fail(err, errlen, "out of memory");
    for (int32_t i = 0; i < c->n_pipe; i++) c->release[i] = -1;
    return 0;
}

/* Spreads each task's time over its ops: by FLOPs, or (none) evenly over the ops that
 * are not sends or receives (over every op of a task of nothing else). A receive at a
 * task's start and a send at its end then wait and are waited for as whole tasks. */
static void share_costs(Clock *c)
{
    const Plan *p = c->t->plan;
    for (int32_t i = 0; i < c->t->n_tasks; i++) {
        const TlTask *x = &c->t->tasks[i];
        int32_t compute = 0;
        for (int32_t k = x->first_op; k < x->first_op + x->n_ops; k++) {
            OpComm kind = report_op_comm(p, &p->ops[k]);
            compute += kind != COMM_SEND && kind != COMM_RECV;
        }
        for (int32_t k = x->first_op; k < x->first_op + x->n_ops; k++) {
            OpComm kind = report_op_comm(p, &p->ops[k]);
            int p2p = kind == COMM_SEND || kind == COMM_RECV;
            c->cost[k] = x->flops > 0 ? x->cost * (op_flops(&p->ops[k]) / x->flops)
                         : compute     ? (p2p ? 0 : x->cost / compute)
                                       : x->cost / x->n_ops;
        }
        c->begins[i] = x->first_op;
        while (c->begins[i] < x->first_op + x->n_ops - 1 && c->cost[c->begins[i]] <= 0) c->begins[i]++;
        if (c->cost[c->begins[i]] <= 0) c->begins[i] = x->first_op;
    }
}

/* When op k of a blocked stage may start: not before its send is done, nor before every
 * stage is at its pipeline collective; -1 while it must wait. */
static double ready_at(Clock *c, int32_t k)
{
    const Timeline *t = c->t;
    if (c->partner[k] >= 0) return c->sent[c->partner[k]];
    int32_t i = c->pipe[k];
    if (i < 0 || c->release[i] >= 0) return i < 0 ? 0 : c->release[i];
    double at = 0;
    for (int32_t s = 0; s < t->n_stages; s++) {
        int32_t n = c->next[s];
        if (n >= t->plan->programs[s].first_op + t->plan->programs[s].n_ops || c->pipe[n] != i) return -1;
        if (c->clock[s] > at) at = c->clock[s];
    }
    return c->release[i] = at;
}

/* Runs stage s's ops in order until one must wait; whether it ran any. */
static int advance(Clock *c, int32_t s)
{
    Timeline *t = c->t;
    const PlanProgram *g = &t->plan->programs[s];
    int moved = 0;
    for (; c->next[s] < g->first_op + g->n_ops; c->next[s]++, moved = 1) {
        int32_t k = c->next[s];
        double at = ready_at(c, k);
        if (at < 0) break;
        if (at < c->clock[s]) at = c->clock[s];
        TlTask *x = &t->tasks[c->task_of[k]];
        if (k == c->begins[c->task_of[k]]) x->start = at;
        c->clock[s] = at + c->cost[k];
        if (k == x->first_op + x->n_ops - 1) {
            /* A task that never waited ends at start + cost exactly, not as the sum of
             * its ops' shares rounds it (15, not 14.999999999999998). */
            if (fabs(c->clock[s] - (x->start + x->cost)) <= 1e-9 * (1 + x->cost)) c->clock[s] = x->start + x->cost;
            x->end = c->clock[s];
        }
        if (report_op_comm(t->plan, &t->plan->ops[k]) == COMM_SEND) c->sent[k] = c->clock[s];
    }
    return moved;
}

/* The message of a step whose stages wait on each other: what each stuck stage waits for. */
static void stuck(const Clock *c, char *err, size_t errlen)
{
    const Timeline *t = c->t;
    size_t at = (size_t)snprintf(err, errlen, "the stages wait on each other (a deadlock):");
    int shown = 0;
    for (int32_t s = 0; s < t->n_stages && shown < MAX_STUCK && at < errlen; s++) {
        int32_t k = c->next[s];
        if (k == t->plan->programs[s].first_op + t->plan->programs[s].n_ops) continue;
        char a[32], b[32];
        const TlTask *x = &t->tasks[c->task_of[k]];
        at += (size_t)snprintf(err + at, errlen - at, "%s stage %d's %s waits at op %d", shown++ ? ";" : "", s,
                               report_task_label(x, a, sizeof a), k);
        if (at >= errlen) break;
        if (c->partner[k] >= 0) {
            const TlTask *y = &t->tasks[c->task_of[c->partner[k]]];
            at += (size_t)snprintf(err + at, errlen - at, " for stage %d's send at op %d (its %s)", y->stage,
                                   c->partner[k], report_task_label(y, b, sizeof b));
        } else {
            at += (size_t)snprintf(err + at, errlen - at, " for every stage at pipeline collective %d", c->pipe[k]);
        }
    }
}

/* Runs every stage's ops in program order, each as soon as what it waits for is done. */
static int run_clock(Clock *c, char *err, size_t errlen)
{
    Timeline *t = c->t;
    for (int32_t s = 0; s < t->n_stages; s++) c->next[s] = t->plan->programs[s].first_op, c->clock[s] = 0;
    for (int32_t k = 0; k < t->plan->n_ops; k++) c->sent[k] = -1;
    for (int moved = 1; moved;) {
        moved = 0;
        for (int32_t s = 0; s < t->n_stages; s++) moved |= advance(c, s);
    }
    for (int32_t s = 0; s < t->n_stages; s++)
        if (c->next[s] < t->plan->programs[s].first_op + t->plan->programs[s].n_ops) {
            stuck(c, err, errlen);
            return -1;
        }
    return 0;
}

/* Links sends to receives and pipeline collectives, and runs the clock. */
static int schedule(Timeline *t, const int32_t *task_of, char *err, size_t errlen)
{
    size_t n = (size_t)t->plan->n_ops + 1, ns = (size_t)t->n_stages;
    Clock c = {.t = t, .task_of = task_of, .cost = plan_alloc(sizeof(double) * n),
               .partner = plan_alloc(sizeof(int32_t) * n), .pipe = plan_alloc(sizeof(int32_t) * n),
               .sent = plan_alloc(sizeof(double) * n), .begins = plan_alloc(sizeof(int32_t) * ((size_t)t->n_tasks + 1)),
               .next = plan_alloc(sizeof(int32_t) * ns), .clock = plan_alloc(sizeof(double) * ns)};
    int rc = !c.cost || !c.partner || !c.pipe || !c.sent || !c.begins || !c.next || !c.clock
                 ? fail(err, errlen, "out of memory")
                 : 0;
    if (!rc) {
        for (int32_t k = 0; k < t->plan->n_ops; k++) c.partner[k] = -1;
        share_costs(&c);
        rc = link_p2p(&c, err, errlen) || link_pipe(&c, err, errlen) || run_clock(&c, err, errlen) ? -1 : 0;
    }
    plan_dealloc(c.cost), plan_dealloc(c.partner), plan_dealloc(c.pipe), plan_dealloc(c.sent);
    plan_dealloc(c.release), plan_dealloc(c.begins), plan_dealloc(c.next), plan_dealloc(c.clock);
    return rc;
}

static void totals(Timeline *t)
{
    for (int32_t i = 0; i < t->n_tasks; i++) {
        t->stages[t->tasks[i].stage].busy += t->tasks[i].cost;
        if (t->tasks[i].end > t->makespan) t->makespan = t->tasks[i].end;
    }
    for (int32_t s = 0; s < t->n_stages; s++) {
        double idle = t->makespan - t->stages[s].busy;  // rounding aside, never negative
        t->stages[s].idle = idle > 1e-9 * t->makespan ? idle : 0;
        if (t->stages[s].busy > t->ideal) t->ideal = t->stages[s].busy;
    }
    t->bubble = t->makespan > 0 && t->ideal < t->makespan ? 1 - t->ideal / t->makespan : 0;
}

Timeline *report_timeline_new(const Plan *p, TlCost cost, char *err, size_t errlen)
{
    if (p->n_programs < 1) {
        fail(err, errlen, "the plan has no program");
        return NULL;
    }
    Timeline *t = plan_alloc(sizeof *t);
    int32_t *task_of = plan_alloc(sizeof *task_of * ((size_t)p->n_ops + 1));
    if (t) *t = (Timeline){.plan = p, .cost = cost, .n_stages = p->n_programs};
    if (t) t->stages = plan_alloc(sizeof *t->stages * (size_t)p->n_programs);
    int rc = !t || !task_of || !t->stages ? fail(err, errlen, "out of memory") : 0;
    if (!rc) memset(t->stages, 0, sizeof *t->stages * (size_t)p->n_programs);
    if (!rc && add_tasks(t, task_of)) rc = fail(err, errlen, "out of memory");
    if (!rc) cost_tasks(t);
    if (!rc) rc = schedule(t, task_of, err, errlen);
    plan_dealloc(task_of);
    if (rc) {
        report_timeline_free(t);
        return NULL;
    }
    totals(t);
    return t;
}

void report_timeline_free(Timeline *t)
{
    if (!t) return;
    plan_dealloc(t->tasks), plan_dealloc(t->deps), plan_dealloc(t->stages);
    plan_dealloc(t);
}

/* ---- text ---------------------------------------------------------------------------- */

const char *report_task_label(const TlTask *t, char *buf, size_t n)
{
    if (t->kind == TL_STEP)
        snprintf(buf, n, "%s", LETTER[t->kind]);
    else if (t->chunk)
        snprintf(buf, n, "%s%d.%d", LETTER[t->kind], t->microbatch, t->chunk);
    else
        snprintf(buf, n, "%s%d", LETTER[t->kind], t->microbatch);
    return buf;
}

const char *report_tl_time(const Timeline *t, double v, char *buf, size_t n)
{
    if (t->cost == TL_COST_UNIT)
        snprintf(buf, n, "%g", v);
    else if (v > 0 && v < 0.1)
        snprintf(buf, n, "%.3g ms", v);
    else
        snprintf(buf, n, "%.3f ms", v);
    return buf;
}

static int column(const Timeline *t, double v)
{
    double x = v / t->makespan * LANE_COLS;
    return x <= 0 ? 0 : x >= LANE_COLS ? LANE_COLS : (int)lround(x);
}

double report_task_drawn_from(const TlTask *t) { return t->end - t->cost > t->start ? t->end - t->cost : t->start; }

/* "|F0|F1|  |B0 |": each task as report_task_drawn_from has it, its label cut to fit;
 * idle time blank; tasks under half a column (the step's work, often) not drawn. */
static void lane(const Timeline *t, int32_t s, FILE *out)
{
    char line[LANE_COLS + 2], label[32];
    memset(line, ' ', sizeof line);
    const TlStage *st = &t->stages[s];
    int last = 0;
    for (int32_t i = st->first_task; i < st->first_task + st->n_tasks; i++) {
        const TlTask *x = &t->tasks[i];
        if (x->cost <= 0) continue;
        int a = column(t, report_task_drawn_from(x)), b = column(t, x->end);
        if (b == a) continue;  // under half a column
        line[a] = '|';
        report_task_label(x, label, sizeof label);
        for (int c = a + 1, k = 0; c < b && label[k]; c++, k++) line[c] = label[k];
        line[b] = '|', last = b;
    }
    line[last + 1] = 0;
    fprintf(out, "  stage %-3d %s\n", s, line);
}

static void print_costs(const Timeline *t, FILE *out)
{
    char model[64];
    fprintf(out, "timeline: %s, %d stage%s, %d micro-batch%s; ", report_clean(plan_meta_str(t->plan, "model", "model"), model, sizeof model),
            t->n_stages, t->n_stages == 1 ? "" : "s", t->n_microbatches, t->n_microbatches == 1 ? "" : "es");
    if (t->cost == TL_COST_FLOPS)
        fprintf(out, "each task's FLOPs at a nominal %g TFLOP/s, in ms\n", REPORT_TL_RATE / 1e12);
    else if (t->split_backward)
        fprintf(out, "unit costs: F = %g, B = %g (input gradients), W = %g (weight gradients), step = %g\n",
                unit_cost(t, TL_FORWARD), unit_cost(t, TL_BACKWARD), unit_cost(t, TL_WEIGHT), unit_cost(t, TL_STEP));
    else
        fprintf(out, "unit costs: F = %g, B = %g, step = %g\n", unit_cost(t, TL_FORWARD), unit_cost(t, TL_BACKWARD),
                unit_cost(t, TL_STEP));
    if (t->fell_back)
        fprintf(out, "  note: the plan's ops carry no FLOPs (compiled without the cost model), so unit costs instead\n");
}

void report_timeline_print(const Timeline *t, FILE *out)
{
    char a[32], b[32], ranks[64];
    print_costs(t, out);
    if (t->makespan > 0) {
        for (int32_t s = 0; s < t->n_stages; s++) lane(t, s, out);
        fprintf(out, "  (a column is %s; F m, B m: micro-batch m's forward, backward; blank: idle)\n",
                report_tl_time(t, t->makespan / LANE_COLS, a, sizeof a));
    } else {
        fprintf(out, "  (nothing to draw: no task takes any time)\n");
    }
    fprintf(out, "\n  %-5s  %-13s %7s %14s %14s %7s\n", "stage", "ranks", "tasks", "busy", "idle", "idle %");
    for (int32_t s = 0; s < t->n_stages; s++) {
        const TlStage *st = &t->stages[s];
        fprintf(out, "  %-5d  %-13s %7d %14s %14s %6.1f%%\n", s, report_stage_ranks(t->plan, s, ranks, sizeof ranks),
                st->n_tasks, report_tl_time(t, st->busy, a, sizeof a), report_tl_time(t, st->idle, b, sizeof b),
                t->makespan > 0 ? 100 * st->idle / t->makespan : 0.0);
    }
    fprintf(out, "  makespan %s; ideal %s (the busiest stage's work alone); bubble %.1f%% of the makespan\n",
            report_tl_time(t, t->makespan, a, sizeof a), report_tl_time(t, t->ideal, b, sizeof b), 100 * t->bubble);
}
