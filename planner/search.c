/* planner/search.c: the search of fsc --fit. One compile of the model (one rank, nothing
 * sharded) gives its facts; then every valid candidate of the space gets a lower bound
 * on its time (cost.c), and the candidates are taken in the order of their bounds. A
 * candidate is compiled (frontend, passes through memplan, the plan without its CUDA
 * program, its memory report and modelled time) unless
 *   - its bound is above the best time that fits (then so is any after it; at the best
 *     time it may tie with a smaller arena, which wins);
 *   - a compiled one, slower than the best, differs from it only by less recompute or
 *     reshard_after_forward 0 (space_time_up: from there the time only rises);
 *   - one value of an axis dominates its value (space_dominated).
 * No rule assumes the arena or the time monotone along an axis: at small sizes memplan's
 * placement makes neither hold exactly (recompute of one more block can grow the arena
 * by a few hundred bytes), and a rule that assumes it misses the winner at a budget
 * between the two (tests/unit/test_planner.c finds such pairs).
 * The winner is the fastest that fits; a tie in time goes to the smaller arena, then to
 * the earlier candidate in that order (before), in the search and in brute force alike,
 * and the Pareto front is sorted by the same rule, so the winner is on it.
 * Deterministic: no clock, no hash order, the same order every run, and the same
 * candidates compiled whatever the core count (compile_batch).
 */
#include <float.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <threads.h>
#include <unistd.h>

#include "codegen.h"
#include "passes.h"
#include "planner.h"
#include "report.h"

enum { MAX_SETS = 512 };

/* The model compiled with the user's settings and `extra` after them; NULL after errors
 * (to `msgs`). */
static Graph *compile(const FitRequest *q, const Setting *extra, int n_extra, FILE *msgs, TrainConfig *t)
{
    const FrontendOptions *fo = q->fo;
    if (fo->n_settings + n_extra > MAX_SETS) return NULL;
    Setting sets[MAX_SETS];
    int ns = 0;
    for (int i = 0; i < fo->n_settings; i++) sets[ns++] = fo->settings[i];
    for (int i = 0; i < n_extra; i++) sets[ns++] = extra[i];
    Diag d;
    diag_init(&d, q->path, q->src, q->len, msgs);
    FrontendOptions o2 = {fo->defines, fo->n_defines, sets, ns};
    Options o = {0};
    Graph *g = fe_compile(q->src, q->len, &o2, &o.train, &d);
    if (g && (passes_run(g, &o, &d) || d.n_errors)) {
        ir_graph_free(g);
        g = NULL;
    }
    *t = o.train;
    return g;
}

/* The facts of the model on one rank, one stage, nothing sharded or recomputed. */
static int probe(const FitRequest *q, ModelFacts *f, char *err, size_t errlen)
{
    static const Setting one[] = {{"world", "1"}, {"stages", "1"}, {"microbatches", "1"}, {"shard", "none"},
                                  {"recompute", "none"}, {"offload", "none"}};
    char *text = NULL;
    size_t len = 0;
    FILE *msgs = open_memstream(&text, &len);
    if (!msgs) return snprintf(err, errlen, "out of memory"), -1;
    TrainConfig t;
    Graph *g = compile(q, one, 6, msgs, &t);
    fclose(msgs);
    if (!g) {
        snprintf(err, errlen, "the model and the command line's settings, compiled first on one rank:\n%s", text ? text : "");
        free(text);
        return -1;
    }
    free(text);
    memset(f, 0, sizeof *f);
    f->params = ir_param_count(g) - ir_frozen_count(g);
    f->checkpoint = t.checkpoint;
    f->n_blocks = g->n_blocks < 1024 ? g->n_blocks : 1024;
    f->gpus_per_node = q->machine.gpus_per_node;
    /* The instances' stem, when block b is named stem + b: "h." of h.0, h.1, ... */
    if (g->n_blocks && g->n_blocks == f->n_blocks) {
        const char *first = g->blocks[0].name;
        size_t n = strlen(first);
        if (n > 1 && first[n - 1] == '0' && n - 1 < sizeof f->stem) memcpy(f->stem, first, n - 1);
        for (int b = 0; b < g->n_blocks && f->stem[0]; b++) {
            char want[96];
            snprintf(want, sizeof want, "%s%d", f->stem, b);
            if (strcmp(g->blocks[b].name, want)) f->stem[0] = 0;
        }
    }
    for (int i = 0; i < g->n_nodes; i++)
        f->attention |=
            (g->nodes[i].op == OP_attention || g->nodes[i].op == OP_attention_masked) && g->nodes[i].block >= 0;
    for (int i = 0; i < g->n_values && !f->batch; i++)
        if (g->values[i].role == ROLE_INPUT && g->values[i].rank > 0) f->batch = g->values[i].shape[0];
    /* after[n], read through node n's inputs, from nodes of its own direction (forward,
     * or backward and wgrad): AFTER_BLOCK, it reads a block's node; AFTER_LAST, the last
     * block's forward. Outside blocks, stages.c puts a forward node that reads the last
     * block's (the head, the loss) on the last stage, and so the backward nodes that read
     * no block's (the loss's and the head's). Any other such node counts on no stage: a
     * free one (the embedding) is copied to the stages that read it, the embedding's
     * backward is the first stage's, and the tied weight's gradient sum a pipeline makes
     * a collective. */
    enum { AFTER_BLOCK = 1, AFTER_LAST = 2 };
    char *after = calloc((size_t)g->n_nodes + 1, 1);
    if (!after) {
        ir_graph_free(g);
        return snprintf(err, errlen, "out of memory"), -1;
    }
    for (int i = 0; i < g->n_nodes; i++) {
        const Node *nd = &g->nodes[i];
        int fwd = nd->phase == PHASE_FORWARD;
        after[i] = (char)((nd->block >= 0 ? AFTER_BLOCK : 0) | (fwd && nd->block == g->n_blocks - 1 ? AFTER_LAST : 0));
        for (int k = 0; k < nd->n_in; k++) {
            int pr = ir_value(g, ir_in(g, nd, k))->producer;
            if (pr >= 0 && (g->nodes[pr].phase == PHASE_FORWARD) == fwd) after[i] |= after[pr];
        }
    }
    for (int i = 0; i < g->n_nodes; i++) {  // as cost.c prices them; no view moves bytes
        const Node *nd = &g->nodes[i];
        int fwd = nd->phase == PHASE_FORWARD, bwd = nd->phase == PHASE_BACKWARD || nd->phase == PHASE_WGRAD;
        if ((!fwd && !bwd) || (op_info(nd->op)->flags & OPF_VIEW) || op_info(nd->op)->comm != COMM_NONE) continue;
        int in_block = nd->block >= 0 && nd->block < f->n_blocks;
        double fl = ir_op_hooks(nd->op)->flops(g, nd), bytes = 0;
        for (int k = 0; k < nd->n_in; k++) bytes += (double)ir_nbytes(ir_value(g, ir_in(g, nd, k)));
        for (int k = 0; k < nd->n_out; k++) bytes += (double)ir_nbytes(ir_value(g, ir_out(g, nd, k)));
        for (int w = 0; w < 2; w++) {  // 16-bit: every tensor at most half as wide
            double tw = cost_roofline(&q->machine, fl, w ? bytes / 2 : bytes, w);
            f->step_time[w] += tw;
            if (fwd && in_block) f->block_time[w][nd->block] += tw;
            if (in_block) f->block_step[w][nd->block] += tw;
            if (nd->block < 0 && (fwd ? after[i] & AFTER_LAST : !after[i])) f->last_time[w] += tw;
        }
    }
    free(after);
    if (f->batch < 1) f->batch = 1;
    ir_graph_free(g);
    return 0;
}

/* Compiles point p: its arenas and modelled time; p->compiled 1, or -1 when the compiler
 * refuses the settings (its messages go to msgs). */
static void compile_point(const FitRequest *q, const Space *s, FitPoint *p, FILE *msgs)
{
    Setting sets[AX_COUNT + 1];
    int n = space_settings(s, &p->cand, sets);
    TrainConfig t;
    Graph *g = compile(q, sets, n, msgs, &t);
    char err[600];
    Plan *plan = g ? codegen_plan_report(g, &t, err, sizeof err) : NULL;
    MemStages *st = plan ? report_stages_new(plan, err, sizeof err) : NULL;
    p->compiled = -1;
    if (st && !cost_plan(&q->machine, plan, &p->cost, err, sizeof err)) {
        const MemReport *r = report_stages_largest(st);
        p->arena = r->arena_bytes, p->host_arena = r->host_arena_bytes;
        p->compiled = 1;
    }
    report_stages_free(st);
    plan_free(plan);
    ir_graph_free(g);
}

/* Candidates are compiled BATCH at a time, on as many threads as the machine has cores
 * (up to BATCH; the compiler keeps no state between compiles), each thread taking the
 * batch's next candidate when it is done with one; the results are then taken in bound
 * order. A batch is chosen from the results before it, so a later candidate of it may
 * be one that an earlier one's result would have pruned: that costs a compile, never
 * the winner (a pruned candidate cannot beat the best). BATCH is fixed, not the core
 * count, so every machine compiles the same candidates and prints the same counts. */
enum { BATCH = 2 };

typedef struct {
    const FitRequest *q;
    const Space *s;
    FitPoint *points;
    const int64_t *batch;
    int nb;
    atomic_int next;  // the batch's next candidate to compile
    FILE *msgs;
} Batch;

static int worker(void *arg)
{
    Batch *w = arg;
    for (int b; (b = atomic_fetch_add(&w->next, 1)) < w->nb;)
        compile_point(w->q, w->s, &w->points[w->batch[b]], w->msgs);
    return 0;
}

static void compile_batch(const FitRequest *q, const Space *s, FitPoint *points, const int64_t *batch, int nb,
                          FILE *msgs)
{
    Batch w = {q, s, points, batch, nb, 0, msgs};
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int n_threads = cores < 1 ? 0 : (int)(cores < nb ? cores : nb) - 1, n_started = 0;
    thrd_t th[BATCH];
    while (n_started < n_threads && thrd_create(&th[n_started], worker, &w) == thrd_success) n_started++;
    worker(&w);  // this thread too; alone when no other could start
    for (int t = 0; t < n_started; t++) thrd_join(th[t], NULL);
}

/* Whether a agrees with b on every axis but the space_time_up ones, and is at or below b on those. */
static int time_below(const Cand *a, const Cand *b)
{
    for (int x = 0; x < AX_COUNT; x++)
        if (space_time_up(x) ? a->v[x] > b->v[x] : a->v[x] != b->v[x]) return 0;
    return 1;
}

/* Whether a compiled point already shows that point p cannot beat `best`. */
static int slower_than(const FitResult *r, const int64_t *done, int64_t n_done, const FitPoint *p, double best)
{
    for (int64_t j = 0; j < n_done; j++) {
        const FitPoint *z = &r->points[done[j]];
        if (z->compiled == 1 && z->cost.time > best && time_below(&z->cand, &p->cand)) return 1;
    }
    return 0;
}

static const FitPoint *sort_points;

static int by_bound(const void *a, const void *b)
{
    const FitPoint *x = &sort_points[*(const int64_t *)a], *y = &sort_points[*(const int64_t *)b];
    if (x->lb != y->lb) return x->lb < y->lb ? -1 : 1;
    return *(const int64_t *)a < *(const int64_t *)b ? -1 : 1;
}

/* The one order of the winner and the front: the faster; at the same time the smaller
 * arena; then the earlier in bound order. So the winner (the first of the points that
 * fit) is the front's point at its time. */
static int before(const FitPoint *pts, int64_t i, int64_t j)
{
    const FitPoint *x = &pts[i], *y = &pts[j];
    if (x->cost.time != y->cost.time) return x->cost.time < y->cost.time ? -1 : 1;
    if (x->arena != y->arena) return x->arena < y->arena ? -1 : 1;
    if (x->lb != y->lb) return x->lb < y->lb ? -1 : 1;
    return i < j ? -1 : i > j;
}

static int by_time(const void *a, const void *b)
{
    return before(sort_points, *(const int64_t *)a, *(const int64_t *)b);
}

static int search(const FitRequest *q, FitResult *r, int64_t *order, int64_t *done)
{
    FILE *msgs = fopen("/dev/null", "w");
    if (!msgs) return -1;
    double best = DBL_MAX;
    int64_t n_done = 0;
    r->winner = r->smallest = -1;
    for (int64_t k = 0; k < r->n_points;) {
        /* The next BATCH candidates that the results so far do not prune. */
        int64_t batch[BATCH];
        int nb = 0;
        for (; k < r->n_points && nb < BATCH; k++) {
            int64_t i = order[k];
            const FitPoint *p = &r->points[i];
            if (!q->brute) {
                if (space_dominated(&r->space, &p->cand)) {
                    r->n_dominated++;
                    continue;
                }
                if (p->lb > best || slower_than(r, done, n_done, p, best)) {
                    r->n_time_pruned++;
                    continue;
                }
            }
            batch[nb++] = i;
        }
        compile_batch(q, &r->space, r->points, batch, nb, msgs);
        for (int b = 0; b < nb; b++) {  // in order, as one by one
            int64_t i = batch[b];
            const FitPoint *p = &r->points[i];
            done[n_done++] = i;
            r->n_compiled++;
            if (p->compiled != 1) {
                r->n_failed++;
                continue;
            }
            if (p->arena <= q->budget && (r->winner < 0 || before(r->points, i, r->winner) < 0))
                best = p->cost.time, r->winner = i;
            const FitPoint *s = r->smallest >= 0 ? &r->points[r->smallest] : NULL;
            if (!s || p->arena < s->arena || (p->arena == s->arena && p->cost.time < s->cost.time)) r->smallest = i;
        }
    }
    fclose(msgs);
    /* The front: by time, each point smaller than every faster one. */
    int64_t n_ok = 0;
    for (int64_t j = 0; j < n_done; j++)
        if (r->points[done[j]].compiled == 1) done[n_ok++] = done[j];
    sort_points = r->points;
    qsort(done, (size_t)n_ok, sizeof *done, by_time);
    r->front = malloc(sizeof *r->front * (size_t)(n_ok ? n_ok : 1));
    if (!r->front) return -1;
    for (int64_t j = 0; j < n_ok; j++)
        if (!r->n_front || r->points[done[j]].arena < r->points[r->front[r->n_front - 1]].arena)
            r->front[r->n_front++] = done[j];
    return 0;
}

int planner_fit(const FitRequest *q, FitResult *r, char *err, size_t errlen)
{
    memset(r, 0, sizeof *r);
    r->winner = r->smallest = -1;
    ModelFacts *f = malloc(sizeof *f);
    if (!f) return snprintf(err, errlen, "out of memory"), -1;
    int rc = probe(q, f, err, errlen) || space_build(&r->space, f, q->world, q->fo->settings, q->fo->n_settings, err, errlen);
    free(f);
    if (rc) return -1;
    Cand *cands = NULL;
    r->n_product = 1;
    for (int a = 0; a < AX_COUNT; a++) r->n_product *= r->space.axes[a].n;
    r->n_points = space_enumerate(&r->space, &cands);
    r->points = r->n_points >= 0 ? calloc((size_t)(r->n_points ? r->n_points : 1), sizeof *r->points) : NULL;
    int64_t *order = malloc(sizeof *order * (size_t)(r->n_points > 0 ? r->n_points : 1));
    int64_t *done = malloc(sizeof *done * (size_t)(r->n_points > 0 ? r->n_points : 1));
    rc = !r->points || !order || !done;
    for (int64_t i = 0; !rc && i < r->n_points; i++) {
        r->points[i].cand = cands[i];
        r->points[i].lb = cost_lower_bound(&q->machine, &r->space, &cands[i]);
        order[i] = i;
    }
    free(cands);
    if (!rc) {
        sort_points = r->points;
        qsort(order, (size_t)r->n_points, sizeof *order, by_bound);
        rc = search(q, r, order, done);
    }
    free(order);
    free(done);
    if (rc) snprintf(err, errlen, "out of memory");
    return rc ? -1 : 0;
}

void planner_free(FitResult *r)
{
    free(r->points);
    free(r->front);
    memset(r, 0, sizeof *r);
}
