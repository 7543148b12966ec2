/* tests/unit/test_p2p.c: plan_check_p2p on pipelines written as one line of ops per stage:
 *   >B  send to stage B          <A  receive from stage A
 *   A   all_reduce over the pipeline (group 1)   G  all_gather over it
 *   a   all_reduce over the stage's data-parallel ranks (no group: 0)
 *   .   compute that waits for every send, receive and collective since the last `.`
 *   ,   compute that waits for nothing
 * each optionally `:M` for micro-batch M. Every tensor is 8 f32 unless a test changes it.
 * Schedules that finish pass (GPipe over 2 and 3 stages, with collectives); mismatched
 * counts, dtypes, sizes and collectives are refused by name; deadlocks are reported as
 * the chain of waits from stage to stage, exactly; a long pipeline is checked in
 * linear time; allocation failures are reported without leaks.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "plan.h"
#include "alloc_count.h"

static char err[1024];

static int32_t tensor(Plan *p)
{
    PlanTensor t = {.dtype = PLAN_DT_F32, .role = PLAN_ROLE_ACT, .rank = 1, .shape = {8}, .name = PLAN_NONE,
                    .block = PLAN_NONE, .producer = PLAN_NONE, .tied_to = PLAN_NONE, .grad = PLAN_NONE,
                    .alias = PLAN_NONE, .unit = PLAN_NONE};
    int32_t id = plan_tensor_add(p, &t);
    cr_assert_geq(id, 0);
    return id;
}

/* An op of `name` on in (PLAN_NONE: none) making out (PLAN_NONE: none), with one int
 * attribute key = v (key NULL: none). */
static int32_t add_op(Plan *p, const char *name, int32_t in, int32_t out, const char *key, int64_t v, int32_t mb,
                      PlanStream stream)
{
    PlanOp o = {.op = plan_intern(p, name), .block = PLAN_NONE, .in = p->n_ids, .n_in = in != PLAN_NONE,
                .out = p->n_ids + (in != PLAN_NONE), .n_out = out != PLAN_NONE, .attr = p->n_attrs, .n_attr = !!key,
                .stream = stream, .wait = p->n_waits, .microbatch = mb};
    if (in != PLAN_NONE) plan_id_add(p, in);
    if (out != PLAN_NONE) plan_id_add(p, out);
    if (key) plan_attr_add(p, &(PlanAttr){.key = plan_intern(p, key), .kind = PLAN_ATTR_INT, .i = v});
    int32_t id = plan_op_add(p, &o);
    cr_assert_geq(id, 0);
    if (out != PLAN_NONE) p->tensors[out].producer = id;
    return id;
}

/* One stage's line of ops as the next program of p. */
static void stage(Plan *p, int32_t s, const char *line)
{
    PlanProgram g = {.stage = s, .dp_world = 1, .first_op = p->n_ops, .first_tensor = p->n_tensors,
                     .first_output = p->n_outputs};
    cr_assert_geq(plan_program_add(p, &g), 0);
    int32_t unwaited = p->n_ops;  // comm ops from here on are waited on by the next `.`
    for (const char *c = line; *c;) {
        char kind = *c++;
        long peer = -1, mb = PLAN_NONE;
        if (kind == '>' || kind == '<') peer = strtol(c, (char **)&c, 10);
        if (*c == ':') mb = strtol(c + 1, (char **)&c, 10);
        PlanStream comm = PLAN_STREAM_COLLECTIVE;
        switch (kind) {
        case '>': add_op(p, "send", tensor(p), PLAN_NONE, "peer", peer, (int32_t)mb, comm); break;
        case '<': add_op(p, "recv", PLAN_NONE, tensor(p), "peer", peer, (int32_t)mb, comm); break;
        case 'A': add_op(p, "all_reduce", tensor(p), tensor(p), "group", 1, (int32_t)mb, comm); break;
        case 'G': add_op(p, "all_gather", tensor(p), tensor(p), "group", 1, (int32_t)mb, comm); break;
        case 'a': add_op(p, "all_reduce", tensor(p), tensor(p), NULL, 0, (int32_t)mb, comm); break;
        case ',':
        case '.': {
            int32_t k = add_op(p, "matmul", PLAN_NONE, tensor(p), NULL, 0, (int32_t)mb, PLAN_STREAM_COMPUTE);
            for (int32_t w = unwaited; kind == '.' && w < k; w++)
                if (p->ops[w].stream != PLAN_STREAM_COMPUTE) {
                    cr_assert_geq(plan_wait_add(p, w), 0);
                    p->ops[k].n_wait++;
                }
            if (kind == '.') unwaited = k + 1;
            break;
        }
        case ' ': break;
        default: cr_assert_fail("bad op '%c' in \"%s\"", kind, line);
        }
    }
}

/* The plan of these stages (NULL-terminated), checked. */
static Plan *pipeline(const char *first, ...)
{
    Plan *p = plan_new();
    cr_assert_not_null(p);
    va_list ap;
    va_start(ap, first);
    int32_t s = 0;
    for (const char *line = first; line; line = va_arg(ap, const char *)) stage(p, s++, line);
    va_end(ap);
    cr_assert_eq(plan_check(p, err, sizeof err), 0, "%s", err);
    return p;
}

static void expect_pass(Plan *p)
{
    cr_assert_eq(plan_check_p2p(p, err, sizeof err), 0, "%s", err);
    plan_free(p);
}

static void expect_fail(Plan *p, const char *want)
{
    err[0] = 0;
    cr_assert_eq(plan_check_p2p(p, err, sizeof err), -1, "passes, expected: %s", want);
    cr_assert_str_eq(err, want);
    plan_free(p);
}

/* ---- schedules that finish ---------------------------------------------------------- */

Test(p2p, gpipe_two_stages)
{
    expect_pass(pipeline(",:0 >1:0 ,:1 >1:1 <1:1 .:1 <1:0 .:0",
                         "<0:0 .:0 <0:1 .:1 ,:1 >0:1 ,:0 >0:0", NULL));
}

/* Three stages, then the pipeline's all-reduce (the loss, the gradient norm) and a
 * data-parallel one, which completes at once. */
Test(p2p, gpipe_three_stages_with_collectives)
{
    expect_pass(pipeline(",:0 >1:0 ,:1 >1:1 <1:1 .:1 <1:0 .:0 a . A .",
                         "<0:0 .:0 >2:0 <0:1 .:1 >2:1 <2:1 .:1 >0:1 <2:0 .:0 >0:0 a . A .",
                         "<1:0 .:0 <1:1 .:1 ,:1 >1:1 ,:0 >1:0 a . A .", NULL));
}

/* 1F1B: stage 1 sends each gradient back before the next forward arrives. */
Test(p2p, one_forward_one_backward)
{
    expect_pass(pipeline(",:0 >1:0 ,:1 >1:1 <1:0 .:0 ,:2 >1:2 <1:1 .:1 <1:2 .:2",
                         "<0:0 .:0 >0:0 <0:1 .:1 >0:1 <0:2 .:2 >0:2", NULL));
}

/* Sends complete once received, receives once sent: nothing waits for either here, and
 * both programs end with everything met. */
Test(p2p, unwaited_sends_and_receives_meet_at_the_end)
{
    expect_pass(pipeline(">1 >1 <1", "<0 >0 <0", NULL));
    expect_pass(pipeline("<1 . >1", ">0 <0 .", NULL));
}

Test(p2p, one_program_passes)
{
    Plan *p = pipeline(">1 <1 .", NULL);
    expect_pass(p);
    p = plan_new();
    cr_assert_eq(plan_check_p2p(p, err, sizeof err), 0, "no programs: %s", err);
    plan_free(p);
}

/* ---- pairing ----------------------------------------------------------------------- */

Test(p2p, counts_differ)
{
    expect_fail(pipeline(">1:0 >1:1", "<0:0", NULL), "stage 0 sends 2 tensors to stage 1, which receives 1 from it");
    expect_fail(pipeline(">1", ",", NULL), "stage 0 sends 1 tensor to stage 1, which receives 0 from it");
    expect_fail(pipeline(",", "<0", NULL), "stage 0 sends 0 tensors to stage 1, which receives 1 from it");
    expect_fail(pipeline(">2", "<0", "<0", NULL), "stage 0 sends 0 tensors to stage 1, which receives 1 from it");
}

Test(p2p, dtypes_and_sizes_differ)
{
    Plan *p = pipeline(">1:0 >1:1", "<0:0 <0:1", NULL);
    p->tensors[p->ids[p->ops[3].out]].dtype = PLAN_DT_BF16;
    expect_fail(p, "op 1 (send to stage 1, micro-batch 1) sends 8 f32, but its partner, op 3 (recv from stage 0, "
                   "micro-batch 1), receives 8 bf16 (the 2nd tensor from stage 0 to stage 1)");
    p = pipeline(">1:0 >1:1", "<0:0 <0:1", NULL);
    p->tensors[p->ids[p->ops[0].in]].shape[0] = 4;
    expect_fail(p, "op 0 (send to stage 1, micro-batch 0) sends 4 f32, but its partner, op 2 (recv from stage 0, "
                   "micro-batch 0), receives 8 f32 (the 1st tensor from stage 0 to stage 1)");
}

Test(p2p, pipeline_collectives_on_every_stage)
{
    expect_pass(pipeline("A .", "A .", NULL));
    expect_fail(pipeline("A .", ",", NULL),
                "stage 1 runs 0 collectives over the pipeline, stage 0 runs 1 (every stage runs each)");
    expect_fail(pipeline("A A", "G A", NULL),
                "the 1st collective over the pipeline differs: stage 0 runs op 0 (all_reduce over the pipeline) "
                "over 8 f32, stage 1 op 2 (all_gather over the pipeline) over 8 f32");
    Plan *p = pipeline("A A:3", "A A:3", NULL);
    p->tensors[p->ids[p->ops[3].in]].dtype = PLAN_DT_F16;
    expect_fail(p, "the 2nd collective over the pipeline differs: stage 0 runs op 1 (all_reduce over the pipeline, "
                   "micro-batch 3) over 8 f32, stage 1 op 3 (all_reduce over the pipeline, micro-batch 3) over 8 f16");
}

/* ---- deadlocks ------------------------------------------------------------------------ */

/* Each stage waits for its receive before the send the other waits for. */
Test(p2p, head_to_head)
{
    expect_fail(pipeline("<1:1 .:2 >1:2", "<0:2 .:1 >0:1", NULL),
                "deadlock: stage 0 waits at op 1 (matmul, micro-batch 2) for op 0 (recv from stage 1, micro-batch 1), "
                "which stage 1 sends at op 5, not reached: stage 1 waits at op 4 (matmul, micro-batch 1) for op 3 "
                "(recv from stage 0, micro-batch 2), which stage 0 sends at op 2, not reached");
}

Test(p2p, collective_behind_a_receive)
{
    expect_fail(pipeline("A . >1", "<0 . A", NULL),
                "deadlock: stage 0 waits at op 1 (matmul) for op 0 (all_reduce over the pipeline), which stage 1 "
                "runs at op 5, not reached: stage 1 waits at op 4 (matmul) for op 3 (recv from stage 0), which "
                "stage 0 sends at op 2, not reached");
}

/* A program at its end with a send pending, along a chain over three stages; a stage
 * whose partner is the op the other cannot start says so. */
Test(p2p, chain_over_three_stages)
{
    expect_fail(pipeline(">1", "<2 . <0 >2", "<1 . >1", NULL),
                "deadlock: stage 0 ends with op 0 (send to stage 1) pending, which stage 1 receives at op 3, not "
                "reached: stage 1 waits at op 2 (matmul) for op 1 (recv from stage 2), which stage 2 sends at op 7, "
                "not reached: stage 2 waits at op 6 (matmul) for op 5 (recv from stage 1), which stage 1 sends at "
                "op 4, not reached");
    Plan *p = pipeline("<1 . >1", "<0 >0", NULL);
    p->ops[4].wait = plan_wait_add(p, 3), p->ops[4].n_wait = 1;  // stage 1 sends only once it has received
    expect_fail(p, "deadlock: stage 0 waits at op 1 (matmul) for op 0 (recv from stage 1), which stage 1 sends at op "
                   "4, not started: stage 1 waits at op 4 (send to stage 0) for op 3 (recv from stage 0), which stage "
                   "0 sends at op 2, not reached");
}

/* Two deadlocks that do not touch: each is told. */
Test(p2p, separate_deadlocks)
{
    expect_fail(pipeline("<1 . >1", "<0 . >0", "<3 . >3", "<2 . >2", NULL),
                "deadlock: stage 0 waits at op 1 (matmul) for op 0 (recv from stage 1), which stage 1 sends at op 5, "
                "not reached: stage 1 waits at op 4 (matmul) for op 3 (recv from stage 0), which stage 0 sends at "
                "op 2, not reached; stage 2 waits at op 7 (matmul) for op 6 (recv from stage 3), which stage 3 sends "
                "at op 11, not reached: stage 3 waits at op 10 (matmul) for op 9 (recv from stage 2), which stage 2 "
                "sends at op 8, not reached");
}

/* ---- size and memory -------------------------------------------------------------------- */

/* GPipe of M micro-batches as lines: stage 0 sends them all, then takes the gradients
 * back; stage 1 receives each before computing on it; then `tail`. */
static char *gpipe_line(int s, int M, const char *tail)
{
    char *b = malloc((size_t)M * 40 + strlen(tail) + 1), *w = b;
    for (int m = 0; m < M; m++) w += sprintf(w, s ? "<0:%d .:%d " : ",:%d >1:%d ", m, m);
    for (int m = M - 1; m >= 0; m--) w += sprintf(w, s ? ",:%d >0:%d " : "<1:%d .:%d ", m, m);
    strcpy(w, tail);
    return b;
}

static double check_seconds(Plan *p, int want)
{
    clock_t t = clock();
    cr_assert_eq(plan_check_p2p(p, err, sizeof err), want, "%s", err);
    return (double)(clock() - t) / CLOCKS_PER_SEC;
}

/* 800,000 ops, in well under a second (a check that rescanned would take hours). */
Test(p2p, long_pipeline_in_linear_time)
{
    enum { M = 100000 };
    char *a = gpipe_line(0, M, ""), *b = gpipe_line(1, M, "");
    Plan *p = pipeline(a, b, NULL);
    cr_assert_eq(p->n_ops, 8 * M);
    double s = check_seconds(p, 0);
    cr_assert_lt(s, 2.0, "%.2f s for %d ops", s, p->n_ops);
    plan_free(p), free(a), free(b);

    /* The same, then head to head: found at the end of it all. */
    a = gpipe_line(0, M, "<1 . >1"), b = gpipe_line(1, M, "<0 . >0");
    p = pipeline(a, b, NULL);
    s = check_seconds(p, -1);
    cr_assert(strstr(err, "deadlock: stage 0 waits at op 400001 (matmul) for op 400000 (recv from stage 1)"), "%s", err);
    cr_assert_lt(s, 2.0, "%.2f s for %d ops", s, p->n_ops);
    plan_free(p), free(a), free(b);
}

Test(p2p, every_allocation_failure_reported)
{
    Plan *p = pipeline(",:0 >1:0 A . <1:0 .:0", "<0:0 .:0 >0:0 A .", NULL);
    count_allocs(0);
    cr_assert_eq(plan_check_p2p(p, err, sizeof err), 0, "%s", err);
    long total = n_allocs;
    cr_assert_gt(total, 5);
    for (long k = 1; k <= total; k++) {
        count_allocs(k);
        err[0] = 0;
        cr_assert_eq(plan_check_p2p(p, err, sizeof err), -1, "allocation %ld failed, yet passed", k);
        cr_assert(strstr(err, "out of memory checking the pipeline's"), "allocation %ld: %s", k, err);
        cr_assert_eq(live, 0, "allocation %ld failed: %ld blocks leaked", k, live);
    }
    plan_set_alloc(NULL, NULL);
    plan_free(p);
}
