/* tests/unit/test_guard.c: every kernel stays inside its planned buffers.
 *  - With the guard on (ExecOptions.guard: canaries in every free byte of the arena and
 *    checksums of every live buffer an op may not write, checked around each op), small
 *    GPT-2, Llama and MLP plans train two steps without a finding, and their losses are
 *    bit for bit those of the unguarded run.
 *  - The check can fail: a hand-made plan whose matmul writes past its output buffer, and
 *    a compiled plan with one output's offset moved onto a live param, are both caught,
 *    naming the op, its source line and the damaged bytes.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "codegen.h"
#include "frontend.h"
#include "passes.h"
#include "runtime.h"
#include "sample.h"

static const Define GPT2[] = {{"L", 2}, {"C", 64}, {"NH", 4}, {"T", 32}, {"V", 256}, {"B", 4}};
static const Define LLAMA[] = {{"L", 2}, {"C", 64}, {"NH", 4}, {"F", 176}, {"T", 32}, {"V", 256}, {"B", 4}};

static Plan *compile(const char *file, const Define *defs, int n_defs)
{
    return sample_compile(file, defs, n_defs, NULL, 0, NULL);
}

/* Trains `steps` steps; the losses, or the guard's message in err (return -1). */
static int train(const Plan *p, int guard, int steps, float *loss, char *err, size_t errlen)
{
    ExecOptions eo = {.seed = 7, .guard = guard};
    Exec *e = rt_exec_new(p, &eo, err, errlen);
    cr_assert_not_null(e, "%s", err);
    RtData *d = rt_data_open(e, NULL, RT_ORDER_SEQUENTIAL, 7, err, errlen);
    cr_assert_not_null(d, "%s", err);
    int rc = 0;
    for (int s = 1; s <= steps && !rc; s++) {
        rt_data_fill(d, s);
        rc = rt_exec_run(e, s, RT_PHASES_ALL);
        if (rc) {
            snprintf(err, errlen, "%s", rt_exec_error(e));
            break;
        }
        RtTensor t;
        rt_exec_tensor_id(e, p->outputs[0], &t);
        loss[s - 1] = *(float *)t.data;
    }
    rt_data_close(d);
    rt_exec_free(e);
    return rc;
}

static void check_clean(const char *file, const Define *defs, int n)
{
    Plan *p = compile(file, defs, n);
    float plain[2], guarded[2];
    char err[1024] = "";
    cr_assert_eq(train(p, 0, 2, plain, err, sizeof err), 0);
    cr_assert_eq(train(p, 1, 2, guarded, err, sizeof err), 0, "%s: %s", file, err);
    for (int s = 0; s < 2; s++)
        cr_expect(!memcmp(&plain[s], &guarded[s], sizeof(float)), "%s step %d: loss %.9g, with the guard %.9g", file,
                  s + 1, plain[s], guarded[s]);
    plan_free(p);
}

Test(guard, gpt2_stays_inside_its_buffers) { check_clean("gpt2.fsm", GPT2, 6); }
Test(guard, llama_stays_inside_its_buffers) { check_clean("llama.fsm", LLAMA, 7); }
Test(guard, mlp_stays_inside_its_buffers) { check_clean("mlp.fsm", NULL, 0); }

/* y = x @ w with y declared [2, 4] where the product is [4, 4]: the kernel writes 64
 * bytes into a 32-byte buffer, over the padding to 64 bytes behind it. Layout: x at 0, w
 * at 64, y at 128; a 192-byte arena. */
static Plan *overflowing_plan(void)
{
    Plan *p = plan_new();
    cr_assert_not_null(p);
    plan_meta_set_str(p, "model", "hand");
    plan_meta_set_str(p, "source", "hand.fsm");
    PlanTensor t = {.name = plan_intern(p, "x"), .role = PLAN_ROLE_INPUT, .rank = 2, .shape = {4, 4},
                    .block = PLAN_NONE, .producer = PLAN_NONE, .tied_to = PLAN_NONE, .grad = PLAN_NONE,
                    .alias = PLAN_NONE, .unit = PLAN_NONE, .live_start = 0, .live_end = 1};
    plan_tensor_add(p, &t);
    t.name = plan_intern(p, "w"), t.role = PLAN_ROLE_PARAM, t.init = PLAN_INIT_ONES, t.offset = 64;
    plan_tensor_add(p, &t);
    t.name = plan_intern(p, "y"), t.role = PLAN_ROLE_ACT, t.init = PLAN_INIT_NONE, t.shape[0] = 2, t.offset = 128;
    t.producer = 0;
    plan_tensor_add(p, &t);
    PlanOp op = {.op = plan_intern(p, "matmul"), .block = PLAN_NONE, .phase = PLAN_PHASE_FORWARD, .line = 3,
                 .col = 9, .in = p->n_ids, .n_in = 2};
    plan_id_add(p, 0), plan_id_add(p, 1);
    op.out = p->n_ids, op.n_out = 1;
    plan_id_add(p, 2);
    plan_op_add(p, &op);
    plan_output_add(p, 2);
    plan_set_one_program(p, 1, 192, 0);
    char err[256];
    cr_assert_eq(plan_check(p, err, sizeof err), 0, "%s", err);
    return p;
}

/* The executor refuses that plan (its shape rule says [4, 4]); the guard is for the
 * kernel that writes past a buffer of a sound plan, so here the kernel's 64 bytes are
 * written by hand between the guard's before and after. */
Test(guard, catches_a_write_past_the_end_of_a_buffer)
{
    Plan *p = overflowing_plan();
    char err[1024];
    ExecOptions eo = {.seed = 1};
    cr_expect_null(rt_exec_new(p, &eo, err, sizeof err), "the op check lets y [2, 4] through");
    cr_expect(strstr(err, "op 0 (matmul)") && strstr(err, "f32[4, 4]"), "%s", err);
    static _Alignas(64) uint8_t arena[192];
    Guard *g = rt_guard_new(p, PLAN_PLACE_DEVICE, arena, sizeof arena, err, sizeof err);
    cr_assert_not_null(g, "%s", err);
    rt_guard_before(g, 0);
    cr_expect_eq(rt_guard_after(g, 0, err, sizeof err), 0, "an op that writes nothing: %s", err);
    rt_guard_before(g, 0);
    memset(arena + 128, 0, 32);  // y's own bytes: allowed
    cr_expect_eq(rt_guard_after(g, 0, err, sizeof err), 0, "an op that writes its output: %s", err);
    rt_guard_before(g, 0);
    memset(arena + 128, 0, 64);  // [4, 4] floats where y holds [2, 4]
    cr_expect_eq(rt_guard_after(g, 0, err, sizeof err), -1);
    cr_log_info("%s", err);
    cr_expect(strstr(err, "op 0, matmul (forward) hand.fsm:3:9"), "%s", err);
    cr_expect(strstr(err, "arena bytes [160, 192) changed"), "%s", err);
    cr_expect(strstr(err, "after the end of tensor y"), "%s", err);
    rt_guard_free(g);
    plan_free(p);
}

/* Whether root tensors a and b of p share a byte. */
static int overlap(const Plan *p, int32_t a, int32_t b)
{
    const PlanTensor *x = &p->tensors[a], *y = &p->tensors[b];
    return x->offset < y->offset + plan_tensor_nbytes(y) && y->offset < x->offset + plan_tensor_nbytes(x);
}

/* A copy of a compiled plan (through the file format) with the first forward matmul's (or
 * matmul_bias's: passes/epilogue.c) output moved onto a param that is live and not that op's to write: a memory plan that
 * gives two live buffers the same bytes, which only the guard sees (the op check refuses
 * an output over the op's own inputs, so the param is one this matmul does not read). */
Test(guard, catches_an_op_writing_into_a_live_param)
{
    Plan *orig = compile("gpt2.fsm", GPT2, 6);
    void *buf;
    size_t len;
    char err[1024];
    cr_assert_eq(plan_write_mem(orig, &buf, &len, err, sizeof err), 0, "%s", err);
    Plan *p = plan_read_mem(buf, len, err, sizeof err);
    cr_assert_not_null(p, "%s", err);
    plan_dealloc(buf);
    int32_t victim = PLAN_NONE, target = PLAN_NONE, k = 0;
    for (; k < p->n_ops && victim == PLAN_NONE; k++) {
        const PlanOp *op = &p->ops[k];
        // a matmul, or one with its bias in the epilogue (passes/epilogue.c)
        if (strncmp(plan_str(p, op->op), "matmul", 6) || op->phase != PLAN_PHASE_FORWARD) continue;
        int32_t out = p->ids[op->out], viewed = 0;
        for (int32_t t = 0; t < p->n_tensors; t++) viewed |= p->tensors[t].alias == out;
        if (!viewed && p->tensors[out].alias == PLAN_NONE) victim = out;
    }
    const PlanOp *op = &p->ops[k - 1];
    for (int32_t t = 0; t < p->n_tensors && victim != PLAN_NONE && target == PLAN_NONE; t++) {
        const PlanTensor *v = &p->tensors[t];
        if (v->role != PLAN_ROLE_PARAM || v->alias != PLAN_NONE) continue;
        int64_t saved = p->tensors[victim].offset;
        p->tensors[victim].offset = v->offset;
        int clash = 0;
        for (int32_t i = 0; i < op->n_in; i++) {
            int32_t in = p->ids[op->in + i], root = p->tensors[in].alias == PLAN_NONE ? in : p->tensors[in].alias;
            clash |= overlap(p, victim, root);
        }
        if (clash) p->tensors[victim].offset = saved;
        else target = t;  // the param the output now lies on
    }
    cr_assert(victim != PLAN_NONE && target != PLAN_NONE);
    ExecOptions eo = {.seed = 1, .guard = 1};
    Exec *e = rt_exec_new(p, &eo, err, sizeof err);
    cr_assert_not_null(e, "%s", err);
    RtData *d = rt_data_open(e, NULL, RT_ORDER_SEQUENTIAL, 1, err, sizeof err);
    cr_assert_not_null(d, "%s", err);
    rt_data_fill(d, 1);
    cr_expect_eq(rt_exec_run(e, 1, RT_PHASES_ALL), -1);
    const char *msg = rt_exec_error(e);
    cr_log_info("%s", msg);
    char want[96];
    snprintf(want, sizeof want, "op %d, %s (forward) line %d:%d", k - 1, plan_str(p, op->op), p->ops[k - 1].line,
             p->ops[k - 1].col);
    cr_expect(strstr(msg, want), "'%s' lacks '%s'", msg, want);
    char inside[128];
    snprintf(inside, sizeof inside, "inside tensor %s (", plan_str(p, p->tensors[target].name));
    cr_expect(strstr(msg, inside), "'%s' lacks '%s'", msg, inside);
    cr_expect(strstr(msg, ", param,"), "%s", msg);
    rt_data_close(d);
    rt_exec_free(e);
    plan_free(p);
    plan_free(orig);
}
