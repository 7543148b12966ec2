/* report/timeline.c: the step's schedule on a logical clock (fsc --timeline, the lanes of
 * --mem=html), from the plan alone: where each stage computes, where it waits (the
 * pipeline's bubble), and how long the step takes.
 *
 * Tasks: within each program, a maximal run of consecutive ops of one micro-batch and
 * one phase class is a task: the forward (PLAN_PHASE_FORWARD) or the backward (BACKWARD
 * or RECOMPUTE) of micro-batch m, "F m" and "B m". The step's own work (ops of no
 * micro-batch, and every optimizer op) makes "step" tasks. An op of a micro-batch that
 * is neither (a send, receive or collective, phase COMM) joins its micro-batch's task
 * beside it: a receive the one it precedes, any other the one it follows (else the
 * other side).
 *
 * The clock: each stage runs its tasks one at a time, in program order. A task that
 * holds a receive, or is the first to read what an earlier one received, starts no
 * earlier than the end of the peer's task that holds the matching send (the k-th send
 * from stage a to stage b meets the k-th receive on b from a); a transfer takes no time.
 * A task's time is its ops' FLOPs at a nominal REPORT_TL_RATE (so times read as ms on
 * one such accelerator), or unit costs (forward 1, backward 2, step 0), which make the
 * textbook numbers checkable: GPipe and 1F1B take (M + P - 1) x 3 for P stages and M
 * micro-batches.
 *
 * Later schedules fit as they are: a zero-bubble plan's weight-gradient phase is one
 * more kind (op_kind, UNIT_COST, LETTER); an interleaved plan's model chunk is
 * TlTask.chunk, and a run then also breaks where the chunk changes.
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

enum { LANE_COLS = 100, MAX_STUCK = 4, ALIAS_STEPS = 64 };
static const double MAX_OP_FLOPS = 1e30;

static const double UNIT_COST[TL_KIND_COUNT] = {1, 2, 0};
static const char *const LETTER[TL_KIND_COUNT] = {"F", "B", "step"};

static int32_t microbatch_of(const PlanOp *op) { return op->microbatch < 0 ? PLAN_NONE : op->microbatch; }

/* The kind of task op belongs to; -1 when it takes the kind of its micro-batch's task
 * beside it. */
static int op_kind(const PlanOp *op)
{
    if (microbatch_of(op) == PLAN_NONE) return TL_STEP;
    switch (op->phase) {
    case PLAN_PHASE_FORWARD: return TL_FORWARD;
    case PLAN_PHASE_BACKWARD:
    case PLAN_PHASE_RECOMPUTE: return TL_BACKWARD;
    case PLAN_PHASE_OPTIMIZER: return TL_STEP;
    case PLAN_PHASE_COMM:
    case PLAN_PHASE_COUNT: break;
    }
    return -1;
}

/* Whether op k can take the kind of op n beside it: n is of the same micro-batch and
 * is a forward or a backward. */
static int joins(const Plan *p, const int8_t *kind, int32_t k, int32_t n)
{
    return kind[n] >= 0 && kind[n] != TL_STEP && microbatch_of(&p->ops[n]) == microbatch_of(&p->ops[k]);
}

/* Each op's task kind in program g. One that takes a neighbour's joins the task it
 * feeds or is fed by: a receive the one after it (which reads what it received), any
 * other (a send, a collective) the one before it (which made what it moves); else the
 * other side; failing both, it is the step's work. */
static void resolve_kinds(const Plan *p, const PlanProgram *g, int8_t *kind)
{
    int32_t a = g->first_op, e = g->first_op + g->n_ops;
    for (int32_t k = a; k < e; k++) kind[k] = (int8_t)op_kind(&p->ops[k]);
    for (int32_t k = a + 1; k < e; k++)
        if (kind[k] < 0 && report_op_comm(p, &p->ops[k]) != COMM_RECV && joins(p, kind, k, k - 1)) kind[k] = kind[k - 1];
    for (int32_t k = e - 2; k >= a; k--)
        if (kind[k] < 0 && joins(p, kind, k, k + 1)) kind[k] = kind[k + 1];
    for (int32_t k = a; k < e; k++)
        kind[k] = kind[k] >= 0 ? kind[k] : k > a && joins(p, kind, k, k - 1) ? kind[k - 1] : TL_STEP;
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
    t->tasks = plan_alloc(sizeof *t->tasks * ((size_t)p->n_ops + (size_t)p->n_programs));
    if (!kind || !t->tasks) return plan_dealloc(kind), -1;
    for (int32_t s = 0; s < p->n_programs; s++) {
        const PlanProgram *g = &p->programs[s];
        resolve_kinds(p, g, kind);
        t->stages[s].first_task = t->n_tasks;
        for (int32_t k = g->first_op; k < g->first_op + g->n_ops; k++) {
            TlTask *last = t->n_tasks > t->stages[s].first_task ? &t->tasks[t->n_tasks - 1] : NULL;
            int32_t mb = microbatch_of(&p->ops[k]);
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
    plan_dealloc(kind);
    return 0;
}

static void cost_tasks(Timeline *t)
{
    int any = 0;
    for (int32_t i = 0; i < t->n_tasks; i++) any |= t->tasks[i].flops > 0;
    if (t->cost == TL_COST_FLOPS && !any) t->cost = TL_COST_UNIT, t->fell_back = 1;
    for (int32_t i = 0; i < t->n_tasks; i++) {
        TlTask *x = &t->tasks[i];
        x->cost = t->cost == TL_COST_UNIT ? UNIT_COST[x->kind] : x->flops / REPORT_TL_RATE * 1e3;
    }
}

/* ---- sends meet receives ------------------------------------------------------------ */

typedef struct {
    int32_t from, to, op;  // the sending stage, the receiving stage, the op
} P2p;

static int pair_cmp(const P2p *a, const P2p *b)
{
    if (a->from != b->from) return a->from < b->from ? -1 : 1;
    return a->to < b->to ? -1 : a->to > b->to;
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
            if (c == COMM_SEND)
                sends[(*n_sends)++] = (P2p){s, (int32_t)peer, k};
            else
                recvs[(*n_recvs)++] = (P2p){(int32_t)peer, s, k};
        }
    }
    qsort(sends, (size_t)*n_sends, sizeof *sends, by_pair);
    qsort(recvs, (size_t)*n_recvs, sizeof *recvs, by_pair);
    return 0;
}

/* Where the run of pair (from, to) starting at i ends. */
static int32_t pair_end(const P2p *x, int32_t i, int32_t n)
{
    int32_t e = i;
    while (e < n && x[e].from == x[i].from && x[e].to == x[i].to) e++;
    return e;
}

/* The root buffer of tensor id, as far as ALIAS_STEPS links go. */
static int32_t root_of(const Plan *p, int32_t id)
{
    for (int i = 0; i < ALIAS_STEPS && p->tensors[id].alias != PLAN_NONE; i++) id = p->tensors[id].alias;
    return id;
}

/* The first task after recv's own, in its program, with an op that reads what it
 * received; -1 when none does. */
static int32_t first_reader(const Timeline *t, const int32_t *task_of, int32_t recv)
{
    const Plan *p = t->plan;
    const TlTask *own = &t->tasks[task_of[recv]];
    const PlanProgram *g = &p->programs[own->stage];
    int32_t got = root_of(p, p->ids[p->ops[recv].out]);
    for (int32_t k = own->first_op + own->n_ops; k < g->first_op + g->n_ops; k++)
        for (int32_t i = 0; i < p->ops[k].n_in; i++)
            if (root_of(p, p->ids[p->ops[k].in + i]) == got) return task_of[k];
    return -1;
}

typedef struct {
    int32_t task, dep;
} Edge;

static int by_task(const void *x, const void *y)
{
    const Edge *a = x, *b = y;
    if (a->task != b->task) return a->task < b->task ? -1 : 1;
    return a->dep < b->dep ? -1 : a->dep > b->dep;
}

/* Pairs the k-th send of each (from, to) with the k-th receive: an edge from the
 * receive's task, and from the first task to read it, to the send's task. */
static int match(const Timeline *t, const int32_t *task_of, const P2p *sends, int32_t ns, const P2p *recvs,
                 int32_t nr, Edge *edges, int32_t *n_edges, char *err, size_t errlen)
{
    for (int32_t i = 0, j = 0; i < ns || j < nr;) {
        int c = i == ns ? 1 : j == nr ? -1 : pair_cmp(&sends[i], &recvs[j]);
        int32_t ie = c <= 0 ? pair_end(sends, i, ns) : i, je = c >= 0 ? pair_end(recvs, j, nr) : j;
        if (ie - i != je - j) {
            const P2p *x = c <= 0 ? &sends[i] : &recvs[j];
            snprintf(err, errlen, "stage %d sends %d tensor%s to stage %d, which receives %d from it", x->from, ie - i,
                     ie - i == 1 ? "" : "s", x->to, je - j);
            return -1;
        }
        for (; i < ie; i++, j++) {
            int32_t from = task_of[sends[i].op], reader = first_reader(t, task_of, recvs[j].op);
            edges[(*n_edges)++] = (Edge){task_of[recvs[j].op], from};
            if (reader >= 0) edges[(*n_edges)++] = (Edge){reader, from};
        }
    }
    return 0;
}

static int link_tasks(Timeline *t, const int32_t *task_of, char *err, size_t errlen)
{
    const Plan *p = t->plan;
    size_t n = (size_t)p->n_ops + 1;
    P2p *sends = plan_alloc(sizeof *sends * n), *recvs = plan_alloc(sizeof *recvs * n);
    Edge *edges = plan_alloc(sizeof *edges * 2 * n);
    t->deps = plan_alloc(sizeof *t->deps * 2 * n);
    int32_t ns = 0, nr = 0, ne = 0;
    int rc = !sends || !recvs || !edges || !t->deps ? fail(err, errlen, "out of memory")
             : collect_p2p(p, sends, &ns, recvs, &nr, err, errlen) ? -1
                                                                     : match(t, task_of, sends, ns, recvs, nr, edges, &ne, err, errlen);
    if (!rc) {
        qsort(edges, (size_t)ne, sizeof *edges, by_task);
        for (int32_t i = 0; i < ne; i++) {
            TlTask *x = &t->tasks[edges[i].task];
            if (i && !by_task(&edges[i], &edges[i - 1])) continue;
            if (!x->n_deps) x->first_dep = t->n_deps;
            t->deps[t->n_deps++] = edges[i].dep;
            x->n_deps++;
        }
    }
    plan_dealloc(sends), plan_dealloc(recvs), plan_dealloc(edges);
    return rc;
}

/* ---- the clock ------------------------------------------------------------------------ */

/* The message of a step whose stages wait on each other: each stuck stage's next task
 * and the task it waits for. */
static void stuck(const Timeline *t, const int32_t *next, const uint8_t *done, char *err, size_t errlen)
{
    size_t at = (size_t)snprintf(err, errlen, "the stages wait on each other (a deadlock):");
    int shown = 0;
    for (int32_t s = 0; s < t->n_stages && shown < MAX_STUCK && at < errlen; s++) {
        const TlStage *st = &t->stages[s];
        if (next[s] == st->first_task + st->n_tasks) continue;
        const TlTask *x = &t->tasks[next[s]];
        int32_t d = 0;
        while (done[t->deps[x->first_dep + d]]) d++;
        const TlTask *y = &t->tasks[t->deps[x->first_dep + d]];
        char a[32], b[32];
        at += (size_t)snprintf(err + at, errlen - at, "%s stage %d's %s (op %d) waits for stage %d's %s (op %d)",
                               shown++ ? ";" : "", s, report_task_label(x, a, sizeof a), x->first_op, y->stage,
                               report_task_label(y, b, sizeof b), y->first_op);
    }
}

/* Runs every stage's tasks in order as soon as what they wait for has ended. */
static int run_clock(Timeline *t, char *err, size_t errlen)
{
    int32_t *next = plan_alloc(sizeof *next * (size_t)t->n_stages);
    double *clock = plan_alloc(sizeof *clock * (size_t)t->n_stages);
    uint8_t *done = plan_alloc((size_t)t->n_tasks + 1);
    if (!next || !clock || !done) return plan_dealloc(next), plan_dealloc(clock), plan_dealloc(done), fail(err, errlen, "out of memory");
    memset(done, 0, (size_t)t->n_tasks + 1);
    for (int32_t s = 0; s < t->n_stages; s++) next[s] = t->stages[s].first_task, clock[s] = 0;
    int32_t left = t->n_tasks;
    for (int moved = 1; moved && left;) {
        moved = 0;
        for (int32_t s = 0; s < t->n_stages; s++)
            for (int32_t end = t->stages[s].first_task + t->stages[s].n_tasks; next[s] < end; next[s]++) {
                TlTask *x = &t->tasks[next[s]];
                double start = clock[s];
                int ready = 1;
                for (int32_t d = 0; d < x->n_deps && ready; d++) {
                    const TlTask *y = &t->tasks[t->deps[x->first_dep + d]];
                    ready = done[t->deps[x->first_dep + d]];
                    if (ready && y->end > start) start = y->end;
                }
                if (!ready) break;
                x->start = start, x->end = clock[s] = start + x->cost;
                done[next[s]] = 1, moved = 1, left--;
            }
    }
    int rc = 0;
    if (left) rc = -1, stuck(t, next, done, err, errlen);
    plan_dealloc(next), plan_dealloc(clock), plan_dealloc(done);
    return rc;
}

static void totals(Timeline *t)
{
    for (int32_t i = 0; i < t->n_tasks; i++) {
        t->stages[t->tasks[i].stage].busy += t->tasks[i].cost;
        if (t->tasks[i].end > t->makespan) t->makespan = t->tasks[i].end;
    }
    for (int32_t s = 0; s < t->n_stages; s++) {
        t->stages[s].idle = t->makespan - t->stages[s].busy;
        if (t->stages[s].busy > t->ideal) t->ideal = t->stages[s].busy;
    }
    t->bubble = t->makespan > 0 ? 1 - t->ideal / t->makespan : 0;
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
    if (!rc) rc = link_tasks(t, task_of, err, errlen);
    if (!rc) rc = run_clock(t, err, errlen);
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
    else
        snprintf(buf, n, "%.3f ms", v);
    return buf;
}

static int column(const Timeline *t, double v)
{
    double x = v / t->makespan * LANE_COLS;
    return x <= 0 ? 0 : x >= LANE_COLS ? LANE_COLS : (int)lround(x);
}

/* "|F0|F1|  |B0 |": each task from its start column to its end's, its label cut to fit;
 * idle time blank; tasks that take no time not drawn. */
static void lane(const Timeline *t, int32_t s, FILE *out)
{
    char line[LANE_COLS + 2], label[32];
    memset(line, ' ', sizeof line);
    const TlStage *st = &t->stages[s];
    int last = 0;
    for (int32_t i = st->first_task; i < st->first_task + st->n_tasks; i++) {
        const TlTask *x = &t->tasks[i];
        if (x->cost <= 0) continue;
        int a = column(t, x->start), b = column(t, x->end);
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
    else
        fprintf(out, "unit costs: F = %g, B = %g, step = %g\n", UNIT_COST[TL_FORWARD], UNIT_COST[TL_BACKWARD],
                UNIT_COST[TL_STEP]);
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
