/* tests/unit/test_timeline.c: the step's schedule on a logical clock (report/timeline.c)
 * and the per-stage reports of plans of several programs.
 *  - Pipelines built by hand, one program per stage as GPipe or 1F1B orders its
 *    micro-batches (a tiny generator: per micro-batch a forward op, a backward op, and
 *    the receives and sends between stages), give the textbook makespans with unit
 *    costs: (M + P - 1) x 3, so 15 for P = 2, M = 4 and 33 for P = 4, M = 8; each
 *    stage's busy time is 3M and the bubble (P - 1) / (M + P - 1).
 *  - Tasks are the runs the report says (a receive or send joins its micro-batch's
 *    task; the optimizer is a step task); FLOP costs scale with the nominal rate; a plan
 *    of one program (gradient accumulation) has no bubble.
 *  - The compiler's own GPipe and 1F1B plans (gpt2 over 2 and 4 stages) take the same
 *    textbook times, with one task per micro-batch's forward and backward on every
 *    stage, ZeRO-2's reductions inside a backward included.
 *  - Unmatched sends, bad peers and crossed receives (a deadlock) fail with messages
 *    that name the stages.
 *  - Communication: point-to-point bytes per stage by peer; collectives over the
 *    pipeline group, and their ring bytes over its ranks.
 *  - fsexec --inspect lists the programs, the schedule and each stage's memory and
 *    communication, in that order.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "report.h"
#include "runtime.h"
#include "sample.h"

typedef enum { GPIPE, ONE_F_ONE_B } Schedule;

enum { ACT = 16 };  // elements of one micro-batch's activation (f32)

/* ---- the generator -------------------------------------------------------------------- */

static int32_t tensor(Plan *p, const char *name, PlanRole role, int32_t producer)
{
    PlanTensor t = {.name = name ? plan_intern(p, name) : PLAN_NONE, .dtype = PLAN_DT_F32, .role = role, .rank = 1,
                    .shape = {ACT}, .block = PLAN_NONE, .producer = producer, .tied_to = PLAN_NONE,
                    .grad = PLAN_NONE, .alias = PLAN_NONE, .unit = PLAN_NONE, .live_start = 0,
                    .live_end = 0};
    int32_t id = plan_tensor_add(p, &t);
    cr_assert_geq(id, 0);
    return id;
}

/* An op of micro-batch mb (PLAN_NONE: the step's) reading in[0..n_in), making one
 * output when `out` (its id returned; else -1), with attribute peer when >= 0. */
static int32_t op(Plan *p, const char *name, PlanPhase phase, int32_t mb, double flops, const int32_t *in, int n_in,
                  int out, int peer)
{
    int32_t k = p->n_ops, y = out ? tensor(p, NULL, PLAN_ROLE_ACT, k) : -1;
    PlanOp o = {.op = plan_intern(p, name), .block = PLAN_NONE, .phase = phase, .in = p->n_ids, .n_in = n_in,
                .attr = p->n_attrs, .microbatch = mb, .flops = flops};
    for (int i = 0; i < n_in; i++) plan_id_add(p, in[i]);
    o.out = p->n_ids, o.n_out = out ? 1 : 0;
    if (out) plan_id_add(p, y);
    if (peer >= 0) {
        PlanAttr a = {.key = plan_intern(p, "peer"), .kind = PLAN_ATTR_INT, .i = peer};
        plan_attr_add(p, &a);
        o.n_attr = 1;
    }
    o.stream = peer >= 0 ? PLAN_STREAM_COLLECTIVE : PLAN_STREAM_COMPUTE;
    cr_assert_eq(plan_op_add(p, &o), k);
    return y;
}

/* Stage s's order of tasks: +m+1 a forward of micro-batch m, -(m+1) its backward. */
static int order(Schedule k, int s, int P, int M, int *seq)
{
    int n = 0;
    if (k == GPIPE) {
        for (int m = 0; m < M; m++) seq[n++] = m + 1;
        for (int m = 0; m < M; m++) seq[n++] = -(m + 1);
        return n;
    }
    int warm = P - 1 - s < M ? P - 1 - s : M;
    for (int m = 0; m < warm; m++) seq[n++] = m + 1;
    for (int i = 0; i < M - warm; i++) seq[n++] = warm + i + 1, seq[n++] = -(i + 1);
    for (int m = M - warm; m < M; m++) seq[n++] = -(m + 1);
    return n;
}

/* An all-reduce of x over the pipeline group (a tied weight's gradient, say). */
static void pipe_all_reduce(Plan *p, int32_t x, int P)
{
    int32_t k = p->n_ops, y = tensor(p, NULL, PLAN_ROLE_GRAD, k);
    PlanOp o = {.op = plan_intern(p, "all_reduce"), .block = PLAN_NONE, .phase = PLAN_PHASE_COMM, .in = p->n_ids,
                .n_in = 1, .attr = p->n_attrs, .n_attr = 2, .stream = PLAN_STREAM_COLLECTIVE, .microbatch = PLAN_NONE};
    plan_id_add(p, x);
    o.out = p->n_ids, o.n_out = 1;
    plan_id_add(p, y);
    PlanAttr world = {.key = plan_intern(p, "world"), .kind = PLAN_ATTR_INT, .i = P};
    PlanAttr group = {.key = plan_intern(p, "group"), .kind = PLAN_ATTR_INT, .i = 1};
    plan_attr_add(p, &world), plan_attr_add(p, &group);
    cr_assert_eq(plan_op_add(p, &o), k);
}

/* One stage's program: forwards receive the activation from s - 1 (stage 0 reads its
 * input), run, and send to s + 1; backwards receive the gradient from s + 1 (the last
 * stage starts from its own activation), run, and send to s - 1; then the optimizer,
 * after an all-reduce over the pipeline group with PIPE_REDUCE. Sends and receives are
 * of their task's phase, or with P2P_COMM of phase COMM, to be placed by the report. */
enum { PIPE_REDUCE = 1, P2P_COMM = 2 };

static Plan *stage_program_with(Schedule k, int s, int P, int M, int dp, int flags)
{
    PlanPhase fwd = flags & P2P_COMM ? PLAN_PHASE_COMM : PLAN_PHASE_FORWARD,
              bwd = flags & P2P_COMM ? PLAN_PHASE_COMM : PLAN_PHASE_BACKWARD;
    Plan *p = plan_new();
    cr_assert_not_null(p);
    plan_meta_set_str(p, "model", "pipe");
    plan_meta_set_int(p, "stages", P);
    plan_meta_set_int(p, "world", (int64_t)P * dp);
    int32_t w = tensor(p, "w", PLAN_ROLE_PARAM, PLAN_NONE), act_in[64], act[64], seq[128];
    int n = order(k, s, P, M, seq);
    char name[32];
    for (int i = 0; i < n; i++) {
        int m = abs(seq[i]) - 1;
        if (seq[i] > 0) {
            snprintf(name, sizeof name, "x%d", m);
            act_in[m] = s ? op(p, "recv", fwd, m, 0, NULL, 0, 1, s - 1)
                          : tensor(p, name, PLAN_ROLE_INPUT, PLAN_NONE);
            int32_t in[2] = {act_in[m], w};
            act[m] = op(p, "matmul", PLAN_PHASE_FORWARD, m, 1e9, in, 2, 1, -1);
            if (s < P - 1) op(p, "send", fwd, m, 0, &act[m], 1, 0, s + 1);
        } else {
            int32_t g = s < P - 1 ? op(p, "recv", bwd, m, 0, NULL, 0, 1, s + 1) : act[m];
            int32_t in[3] = {g, act_in[m], w};
            int32_t dx = op(p, "matmul", PLAN_PHASE_BACKWARD, m, 2e9, in, 3, 1, -1);
            if (s > 0) op(p, "send", bwd, m, 0, &dx, 1, 0, s - 1);
        }
    }
    if (flags & PIPE_REDUCE) pipe_all_reduce(p, w, P);
    op(p, "sgd_step", PLAN_PHASE_OPTIMIZER, PLAN_NONE, 3e6, &w, 1, 0, -1);
    cr_assert_eq(plan_set_one_program(p, dp, 1 << 16, 0), 0);
    return p;
}

static Plan *stage_program(Schedule k, int s, int P, int M, int dp) { return stage_program_with(k, s, P, M, dp, 0); }

static Plan *pipeline_with(Schedule k, int P, int M, int dp, int flags)
{
    Plan *p = plan_new();
    char err[256];
    for (int s = 0; s < P; s++) {
        Plan *one = stage_program_with(k, s, P, M, dp, flags);
        cr_assert_eq(plan_append_program(p, one, err, sizeof err), 0, "%s", err);
        plan_free(one);
    }
    cr_assert_eq(plan_check(p, err, sizeof err), 0, "%s", err);
    cr_assert_eq(plan_check_p2p(p, err, sizeof err), 0, "runs with synchronous sends: %s", err);
    cr_assert_eq(p->n_programs, P);
    return p;
}

static Plan *pipeline(Schedule k, int P, int M, int dp) { return pipeline_with(k, P, M, dp, 0); }

static Timeline *timeline(const Plan *p, TlCost cost)
{
    char err[256];
    Timeline *t = report_timeline_new(p, cost, err, sizeof err);
    cr_assert_not_null(t, "%s", err);
    return t;
}

/* Runs the statements after `out`, which write to FILE *f, and leaves what they wrote in
 * `out`, NUL-terminated (free it). */
#define CAPTURE(out, ...) do { size_t len_ = 0; FILE *f = open_memstream(&(out), &len_); cr_assert_not_null(f); \
                                __VA_ARGS__; cr_assert_eq(fclose(f), 0); } while (0)

static char *print_timeline(const Timeline *t)
{
    char *buf = NULL;
    CAPTURE(buf, report_timeline_print(t, f));
    return buf;
}

/* ---- the textbook numbers ------------------------------------------------------------ */

static void check_makespan(Schedule k, int P, int M)
{
    const char *name = k == GPIPE ? "GPipe" : "1F1B";
    Plan *p = pipeline(k, P, M, 2);
    Timeline *t = timeline(p, TL_COST_UNIT);
    double want = (M + P - 1) * 3.0;
    cr_expect_eq(t->makespan, want, "%s P=%d M=%d: makespan %g, expected %g", name, P, M, t->makespan, want);
    cr_expect_eq(t->ideal, 3.0 * M, "%s: ideal %g", name, t->ideal);
    cr_expect_float_eq(t->bubble, (P - 1.0) / (M + P - 1.0), 1e-12, "%s: bubble %g", name, t->bubble);
    cr_expect_eq(t->n_microbatches, M);
    for (int s = 0; s < P; s++) {
        cr_expect_eq(t->stages[s].busy, 3.0 * M, "%s stage %d: busy %g", name, s, t->stages[s].busy);
        cr_expect_eq(t->stages[s].idle, want - 3.0 * M, "%s stage %d: idle %g", name, s, t->stages[s].idle);
        cr_expect_eq(t->stages[s].n_tasks, 2 * M + 1, "%s stage %d: %d tasks", name, s, t->stages[s].n_tasks);
    }
    char *text = print_timeline(t), line[128];
    snprintf(line, sizeof line, "makespan %g; ideal %g", want, 3.0 * M);
    cr_expect(strstr(text, line), "'%s' not in:\n%s", line, text);
    free(text);
    report_timeline_free(t);
    plan_free(p);
}

Test(timeline, gpipe_p2_m4_takes_15) { check_makespan(GPIPE, 2, 4); }
Test(timeline, gpipe_p4_m8_takes_33) { check_makespan(GPIPE, 4, 8); }
Test(timeline, one_f_one_b_p2_m4_takes_15) { check_makespan(ONE_F_ONE_B, 2, 4); }
Test(timeline, one_f_one_b_p4_m8_takes_33) { check_makespan(ONE_F_ONE_B, 4, 8); }

Test(timeline, more_microbatches_shrink_the_bubble)
{
    for (int M = 1; M <= 16; M *= 2) {
        Plan *p = pipeline(ONE_F_ONE_B, 4, M, 1);
        Timeline *t = timeline(p, TL_COST_UNIT);
        cr_expect_eq(t->makespan, (M + 3) * 3.0, "M=%d: %g", M, t->makespan);
        report_timeline_free(t);
        plan_free(p);
    }
}

/* 1F1B by hand for P = 2, M = 4: stage 1 alternates from the start, stage 0 runs one
 * forward ahead; every start below is worked out on paper from the rules. */
Test(timeline, one_f_one_b_starts_as_worked_out_by_hand)
{
    static const char *const labels[2][9] = {{"F0", "F1", "B0", "F2", "B1", "F3", "B2", "B3", "step"},
                                            {"F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3", "step"}};
    static const double starts[2][9] = {{0, 1, 4, 6, 7, 9, 10, 13, 15}, {1, 2, 4, 5, 7, 8, 10, 11, 13}};
    Plan *p = pipeline(ONE_F_ONE_B, 2, 4, 1);
    Timeline *t = timeline(p, TL_COST_UNIT);
    char label[32];
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < 9; i++) {
            const TlTask *x = &t->tasks[t->stages[s].first_task + i];
            cr_expect_str_eq(report_task_label(x, label, sizeof label), labels[s][i], "stage %d task %d", s, i);
            cr_expect_eq(x->start, starts[s][i], "stage %d %s: starts at %g, expected %g", s, label, x->start,
                         starts[s][i]);
        }
    report_timeline_free(t);
    plan_free(p);
}

/* ---- tasks and costs ----------------------------------------------------------------- */

Test(timeline, sends_and_receives_join_their_microbatchs_task)
{
    Plan *p = pipeline(GPIPE, 2, 2, 1);
    Timeline *t = timeline(p, TL_COST_UNIT);
    /* Stage 1's F0: recv then matmul; its B0: matmul then send. */
    const TlTask *f0 = &t->tasks[t->stages[1].first_task], *b0 = &t->tasks[t->stages[1].first_task + 2];
    cr_expect_eq(f0->kind, TL_FORWARD);
    cr_expect_eq(f0->n_ops, 2);
    cr_expect_str_eq(plan_str(p, p->ops[f0->first_op].op), "recv");
    cr_expect_eq(f0->n_deps, 1, "F0 waits for stage 0's F0");
    cr_expect_eq(t->deps[f0->first_dep], t->stages[0].first_task);
    cr_expect_eq(b0->kind, TL_BACKWARD);
    cr_expect_eq(b0->n_ops, 2);
    const TlTask *step = &t->tasks[t->stages[1].first_task + t->stages[1].n_tasks - 1];
    cr_expect_eq(step->kind, TL_STEP);
    cr_expect_eq(step->microbatch, PLAN_NONE);
    cr_expect_eq(step->cost, 0);
    report_timeline_free(t);
    plan_free(p);
}

/* Sends and receives of phase COMM: a receive joins the task after it, a send the one
 * before, so stage 0's receive of B0's gradient, right after F0's send when M = 1, is
 * B0's (in F0 it would wait for the B0 that waits for F0). */
Test(timeline, comm_phase_sends_and_receives_join_the_task_they_serve)
{
    for (int k = 0; k < 2; k++) {
        Plan *p = pipeline_with(k ? ONE_F_ONE_B : GPIPE, 2, 1, 1, P2P_COMM);
        Timeline *t = timeline(p, TL_COST_UNIT);
        cr_expect_eq(t->makespan, 6, "%g", t->makespan);
        const TlTask *b0 = &t->tasks[t->stages[0].first_task + 1];
        cr_expect_eq(b0->kind, TL_BACKWARD);
        cr_expect_str_eq(plan_str(p, p->ops[b0->first_op].op), "recv");
        report_timeline_free(t);
        plan_free(p);
        p = pipeline_with(k ? ONE_F_ONE_B : GPIPE, 4, 8, 1, P2P_COMM);
        t = timeline(p, TL_COST_UNIT);
        cr_expect_eq(t->makespan, 33, "%g", t->makespan);
        for (int s = 0; s < 4; s++) cr_expect_eq(t->stages[s].n_tasks, 2 * 8 + 1);
        report_timeline_free(t);
        plan_free(p);
    }
}

Test(timeline, flop_costs_at_the_nominal_rate_in_ms)
{
    Plan *p = pipeline(GPIPE, 2, 4, 1);
    Timeline *t = timeline(p, TL_COST_FLOPS);
    cr_expect_eq(t->cost, TL_COST_FLOPS);
    cr_expect(!t->fell_back);
    /* A forward is 1e9 FLOPs: 1 ms at 1e12 FLOP/s; a backward 2 ms; the step 3e6: 0.003 ms. */
    const TlTask *f0 = &t->tasks[0];
    cr_expect_float_eq(f0->cost, 1e9 / REPORT_TL_RATE * 1e3, 1e-12);
    cr_expect_float_eq(t->makespan, 15 + 0.003, 1e-9, "%g", t->makespan);
    char *text = print_timeline(t);
    cr_expect(strstr(text, "makespan 15.003 ms"), "%s", text);
    cr_expect(strstr(text, "nominal 1 TFLOP/s"), "%s", text);
    free(text);
    report_timeline_free(t);
    plan_free(p);
}

Test(timeline, a_plan_without_flops_falls_back_to_units)
{
    Plan *p = pipeline(GPIPE, 2, 4, 1);
    for (int32_t k = 0; k < p->n_ops; k++) p->ops[k].flops = 0;
    Timeline *t = timeline(p, TL_COST_FLOPS);
    cr_expect(t->fell_back);
    cr_expect_eq(t->cost, TL_COST_UNIT);
    cr_expect_eq(t->makespan, 15);
    char *text = print_timeline(t);
    cr_expect(strstr(text, "carry no FLOPs"), "%s", text);
    free(text);
    report_timeline_free(t);
    plan_free(p);
}

Test(timeline, lanes_are_about_100_columns_and_show_the_tasks)
{
    Plan *p = pipeline(GPIPE, 2, 4, 4);
    Timeline *t = timeline(p, TL_COST_UNIT);
    char *text = print_timeline(t);
    const char *s0 = strstr(text, "  stage 0   |F0"), *s1 = strstr(text, "  stage 1   ");
    cr_assert(s0 && s1, "%s", text);
    size_t len = strcspn(s0, "\n");
    cr_expect(len >= 90 && len <= 115, "%zu columns:\n%s", len, text);
    cr_expect(strstr(s1, "|F0") && strstr(s1, "|B3"), "%s", text);
    cr_expect(s1[12] == ' ', "stage 1 idles while stage 0 runs F0:\n%s", text);
    cr_expect(strstr(text, "ranks 4-7"), "stage 1's ranks:\n%s", text);
    cr_expect(strstr(text, "bubble 20.0% of the makespan"), "%s", text);
    free(text);
    report_timeline_free(t);
    plan_free(p);
}

/* Gradient accumulation on one stage: F0 B0 F1 B1 ... then the step; nothing waits. */
Test(timeline, one_program_has_no_bubble)
{
    Plan *p = stage_program(GPIPE, 0, 1, 3, 1);
    Timeline *t = timeline(p, TL_COST_UNIT);
    cr_expect_eq(t->n_stages, 1);
    cr_expect_eq(t->makespan, 9);
    cr_expect_eq(t->bubble, 0);
    report_timeline_free(t);
    plan_free(p);
}

/* ---- plans the compiler makes -------------------------------------------------------------- */

/* gpt2 with 4 blocks over P stages and M micro-batches, one data-parallel rank each. */
static Plan *compiled(const char *schedule, int P, int M, const char *shard, int dp)
{
    static const Define D[] = {{"L", 4}, {"C", 64}, {"NH", 4}, {"T", 32}, {"V", 256}, {"B", 16}};
    char stages[8], micro[8], world[8];
    snprintf(stages, sizeof stages, "%d", P), snprintf(micro, sizeof micro, "%d", M);
    snprintf(world, sizeof world, "%d", P * dp);
    Setting set[] = {{"stages", stages}, {"microbatches", micro}, {"world", world}, {"schedule", schedule},
                     {"shard", shard}};
    return sample_compile("gpt2.fsm", D, 6, set, 5, NULL);
}

/* Every stage has one forward and one backward task per micro-batch: nothing of the
 * step's cuts one in two. */
static void expect_one_task_per_microbatch(const Timeline *t, int M)
{
    for (int32_t s = 0; s < t->n_stages; s++) {
        int seen[2][64] = {{0}};
        for (int32_t i = t->stages[s].first_task; i < t->stages[s].first_task + t->stages[s].n_tasks; i++) {
            const TlTask *x = &t->tasks[i];
            if (x->kind == TL_STEP) continue;
            cr_assert(x->microbatch >= 0 && x->microbatch < M, "stage %d: micro-batch %d", s, x->microbatch);
            seen[x->kind][x->microbatch]++;
        }
        for (int k = 0; k < 2; k++)
            for (int m = 0; m < M; m++)
                cr_expect_eq(seen[k][m], 1, "stage %d: %d %s tasks of micro-batch %d", s, seen[k][m], k ? "B" : "F", m);
    }
}

Test(timeline, the_compilers_gpipe_and_1f1b_take_the_textbook_times)
{
    static const struct {
        const char *schedule;
        int P, M;
    } cases[] = {{"gpipe", 2, 4}, {"1f1b", 2, 4}, {"gpipe", 4, 8}, {"1f1b", 4, 8}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int P = cases[i].P, M = cases[i].M;
        Plan *p = compiled(cases[i].schedule, P, M, "none", 1);
        Timeline *t = timeline(p, TL_COST_UNIT);
        cr_expect_eq(t->n_stages, P);
        cr_expect_eq(t->n_microbatches, M);
        cr_expect_eq(t->makespan, (M + P - 1) * 3.0, "%s P=%d M=%d: makespan %g", cases[i].schedule, P, M, t->makespan);
        for (int s = 0; s < P; s++) cr_expect_eq(t->stages[s].busy, 3.0 * M, "%s stage %d", cases[i].schedule, s);
        expect_one_task_per_microbatch(t, M);
        report_timeline_free(t);
        t = timeline(p, TL_COST_FLOPS);
        cr_expect(!t->fell_back, "the compiler gives every op its FLOPs");
        cr_expect(t->makespan > t->ideal && t->ideal > 0, "%s: makespan %g, ideal %g", cases[i].schedule, t->makespan,
                  t->ideal);
        report_timeline_free(t);
        plan_free(p);
    }
}

/* ZeRO-2 over 2 data-parallel ranks a stage: accumulators zeroed inside the first
 * backward and the gradients' reduce-scatter started under the last are the tasks'. */
Test(timeline, the_steps_ops_inside_a_backward_are_its)
{
    Plan *p = compiled("1f1b", 2, 4, "zero2", 2);
    Timeline *t = timeline(p, TL_COST_UNIT);
    cr_expect_eq(t->makespan, 15);
    expect_one_task_per_microbatch(t, 4);
    report_timeline_free(t);
    plan_free(p);
}

/* A plan of no micro-batches is one: F0, B0 and the step. */
Test(timeline, a_step_of_one_microbatch_is_f0_and_b0)
{
    Plan *p = sample_compile("mlp.fsm", NULL, 0, NULL, 0, NULL);
    Timeline *t = timeline(p, TL_COST_UNIT);
    cr_expect_eq(t->n_microbatches, 1);
    cr_expect_eq(t->makespan, 3);
    expect_one_task_per_microbatch(t, 1);
    report_timeline_free(t);
    plan_free(p);
}

/* ---- bad pipelines ----------------------------------------------------------------------- */

static void expect_refused(const Plan *p, const char *why)
{
    char err[512];
    Timeline *t = report_timeline_new(p, TL_COST_UNIT, err, sizeof err);
    cr_expect_null(t);
    cr_expect(strstr(err, why), "'%s' lacks '%s'", err, why);
    report_timeline_free(t);
}

Test(timeline, unmatched_sends_and_bad_peers_are_refused)
{
    Plan *p = pipeline(GPIPE, 2, 2, 1);
    int32_t recv = -1;
    for (int32_t k = p->programs[1].first_op; k < p->n_ops && recv < 0; k++)
        if (!strcmp(plan_str(p, p->ops[k].op), "recv")) recv = k;
    p->ops[recv].op = plan_intern(p, "relu");  // stage 1 receives once less
    expect_refused(p, "stage 0 sends 2 tensors to stage 1, which receives 1 from it");
    p->ops[recv].op = plan_intern(p, "recv");
    p->attrs[p->ops[recv].attr].i = 1;  // from itself
    expect_refused(p, "peer 1 is not another of the 2 stages");
    p->attrs[p->ops[recv].attr].i = 5;
    expect_refused(p, "peer 5 is not another of the 2 stages");
    plan_free(p);
}

/* FLOPs and micro-batches are not checked by plan_check: whatever they hold, the times
 * stay finite and the lanes inside their columns. */
Test(timeline, hostile_flops_and_microbatches_are_reported_without_a_crash)
{
    Plan *p = pipeline(GPIPE, 2, 4, 1);
    const double flops[] = {NAN, INFINITY, -5, 1e300, 1e9};
    for (int32_t k = 0; k < p->n_ops; k++) p->ops[k].flops = flops[k % 5];
    p->ops[1].microbatch = -7;
    p->ops[3].microbatch = 1 << 30;
    Timeline *t = timeline(p, TL_COST_FLOPS);
    cr_expect(isfinite(t->makespan) && t->makespan > 0, "%g", t->makespan);
    cr_expect_eq(t->n_microbatches, (1 << 30) + 1);
    char *text = print_timeline(t);
    for (const char *line = strstr(text, "  stage 0   "); line && !strncmp(line, "  stage ", 8); line = strchr(line, '\n') + 1)
        cr_expect_leq(strcspn(line, "\n"), 12 + 101, "%s", text);
    free(text);
    report_timeline_free(t);
    plan_free(p);
}

/* Stage 0 receives the gradient of micro-batch 0 before it sends the activation stage 1
 * needs to make it: each waits for the other. */
Test(timeline, crossed_receives_are_a_deadlock)
{
    Plan *p = plan_new();
    char err[256];
    Plan *a = plan_new(), *b = plan_new();
    int32_t w = tensor(a, "w", PLAN_ROLE_PARAM, PLAN_NONE);
    int32_t g = op(a, "recv", PLAN_PHASE_BACKWARD, 0, 0, NULL, 0, 1, 1);
    int32_t in[2] = {g, w};
    int32_t y = op(a, "matmul", PLAN_PHASE_FORWARD, 0, 1, in, 2, 1, -1);
    op(a, "send", PLAN_PHASE_FORWARD, 0, 0, &y, 1, 0, 1);
    plan_set_one_program(a, 1, 64, 0);
    int32_t x = op(b, "recv", PLAN_PHASE_FORWARD, 0, 0, NULL, 0, 1, 0);
    int32_t dx = op(b, "matmul", PLAN_PHASE_BACKWARD, 0, 2, &x, 1, 1, -1);
    op(b, "send", PLAN_PHASE_BACKWARD, 0, 0, &dx, 1, 0, 0);
    plan_set_one_program(b, 1, 64, 0);
    for (int i = 0; i < 2; i++) {  // each matmul waits for the receive it reads, as the schedule pass has it
        Plan *one = i ? b : a;
        one->ops[1].wait = plan_wait_add(one, 0), one->ops[1].n_wait = 1;
    }
    cr_assert_eq(plan_append_program(p, a, err, sizeof err), 0, "%s", err);
    cr_assert_eq(plan_append_program(p, b, err, sizeof err), 0, "%s", err);
    cr_expect_eq(plan_check_p2p(p, err, sizeof err), -1, "the plan layer sees it too");
    expect_refused(p, "deadlock");
    expect_refused(p, "stage 0's B0 waits at op 0 for stage 1's send at op 5 (its B0); stage 1's F0 waits at op 3 for "
                      "stage 0's send at op 2 (its F0)");
    plan_free(a), plan_free(b), plan_free(p);
}

/* ---- communication per stage ------------------------------------------------------------- */

Test(timeline, comm_counts_point_to_point_bytes_per_stage_and_peer)
{
    Plan *p = pipeline_with(ONE_F_ONE_B, 3, 4, 2, PIPE_REDUCE);
    const double act = ACT * 4;  // bytes of one micro-batch's activation or gradient
    for (int s = 0; s < 3; s++) {
        CommTotals c = comm_totals_stage(p, s);
        int up = s < 2, down = s > 0;  // neighbours: s + 1 gets activations, s - 1 gradients
        cr_expect_eq(c.world, 2);
        cr_expect_eq(c.sends, 4 * (up + down), "stage %d: %d sends", s, c.sends);
        cr_expect_eq(c.recvs, 4 * (up + down), "stage %d: %d receives", s, c.recvs);
        cr_expect_eq(c.send_bytes, 4 * act * (up + down));
        cr_expect_eq(c.recv_bytes, 4 * act * (up + down));
        cr_expect_eq(c.collectives, 1);
        cr_expect_eq(c.bytes, 2 * act, "an all-reduce moves 2 Psi");
        cr_expect_float_eq(c.ring_bytes, 2 * act * 2 / 3, 1e-9, "a ring over the 3 stages: %g", c.ring_bytes);
    }
    CommTotals c0 = comm_totals(p);
    cr_expect_eq(c0.sends, 4, "comm_totals is stage 0's");
    char *text = NULL;
    CAPTURE(text, comm_report(p, f));
    cr_expect(strstr(text, "communication per step, stage 1 of 3 (ranks 2-3), each rank (strategy none):"), "%s", text);
    cr_expect(strstr(text, "over the pipeline group (3 ranks, one per stage)"), "%s", text);
    /* Stage 1 sends activations to stage 2 and gradients to stage 0, 4 of each. */
    const char *s1 = strstr(text, "stage 1 of 3");
    cr_assert(s1);
    cr_expect(strstr(s1, "    stage 0          4        256 B         4        256 B\n"), "%s", s1);
    cr_expect(strstr(s1, "    stage 2          4        256 B         4        256 B\n"), "%s", s1);
    cr_expect(strstr(s1, "point-to-point: 8 sends, 512 bytes (512 B)"), "%s", s1);
    free(text);
    plan_free(p);
}

Test(timeline, a_pipeline_collective_is_a_step_task)
{
    Plan *p = pipeline_with(GPIPE, 2, 4, 1, PIPE_REDUCE);
    Timeline *t = timeline(p, TL_COST_UNIT);
    cr_expect_eq(t->makespan, 15);
    const TlTask *last = &t->tasks[t->stages[0].first_task + t->stages[0].n_tasks - 1];
    cr_expect_eq(last->kind, TL_STEP);
    cr_expect_eq(last->n_ops, 2, "the all-reduce and the optimizer");
    report_timeline_free(t);
    plan_free(p);
}

/* ---- fsexec --inspect --------------------------------------------------------------------- */

Test(timeline, inspect_lists_the_programs_and_reports_each_stage)
{
    Plan *p = pipeline_with(ONE_F_ONE_B, 2, 4, 2, PIPE_REDUCE);
    char *buf = NULL;
    CAPTURE(buf, rt_inspect(p, f));
    const char *want[] = {
        "\nprograms (2)\n",
        "  stage  ranks         dp world        ops    tensors  outputs   device arena   host arena\n",
        "  1      ranks 2-3            2         18         14        0       64.0 KiB          0 B\n",
        "timeline: pipe, 2 stages, 4 micro-batches; each task's FLOPs at a nominal 1 TFLOP/s, in ms\n",
        "memory plan: pipe, 2 pipeline stages x 2 data-parallel ranks (world 4); bytes per rank\n",
        "memory plan: pipe, stage 0 of 2 (ranks 0-1), 2 data-parallel ranks; bytes per rank\n",
        "memory plan: pipe, stage 1 of 2 (ranks 2-3), 2 data-parallel ranks; bytes per rank\n",
        "communication per step, stage 0 of 2 (ranks 0-1), each rank",
        "communication per step, stage 1 of 2 (ranks 2-3), each rank",
    };
    const char *at = buf;
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        const char *hit = strstr(at, want[i]);
        cr_expect(hit, "'%s' missing, or out of order, in:\n%s", want[i], buf);
        if (hit) at = hit;
    }
    free(buf);
    plan_free(p);
}
