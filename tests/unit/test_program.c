/* tests/unit/test_program.c: plans of several programs (pipeline stages). Two stages of a
 * small pipeline are built by hand, each as a plan of its own program; the same two go
 * into one plan of two programs, built item by item. plan_check holds every program to
 * its own ops, tensors, outputs, CUDA instructions and module bytes, each failure with
 * its own message. plan_append_program of the two stage plans makes the plan built item
 * by item, to the string id; it survives a round trip through bytes; plan_extract_program
 * gives back each stage's plan field for field (strings by value); both fail cleanly, with
 * nothing leaked, at every allocation.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"
#include "alloc_count.h"

static char err[512];

/* ---- building by hand ------------------------------------------------------------- */

typedef struct {
    const char *key;
    PlanAttrKind kind;
    double v;            // INT, FLOAT
    const int64_t *list; // INTS
    int n_list;
} A;

/* A tensor of stage-local shape [rows, cols] (cols 0: [rows]; rows 0: a scalar). */
static int32_t tensor(Plan *p, const char *name, PlanRole role, int64_t rows, int64_t cols)
{
    PlanTensor t = {.name = name ? plan_intern(p, name) : PLAN_NONE, .dtype = PLAN_DT_F32, .role = role,
                    .rank = rows ? cols ? 2 : 1 : 0, .shape = {rows, cols}, .block = PLAN_NONE,
                    .producer = PLAN_NONE, .tied_to = PLAN_NONE, .grad = PLAN_NONE, .alias = PLAN_NONE,
                    .unit = PLAN_NONE};
    int32_t id = plan_tensor_add(p, &t);
    cr_assert_geq(id, 0);
    return id;
}

typedef struct {
    const int32_t *in, *out, *waits;
    int n_in, n_out, n_wait;
    const A *attrs;
    int n_attr;
    PlanStream stream;
    int32_t microbatch;
} OpSpec;

/* An op of the program last added; its line and FLOPs say where it stands in it. */
static int32_t op(Plan *p, const char *name, OpSpec s)
{
    int32_t at = p->n_ops - p->programs[p->n_programs - 1].first_op;
    PlanOp o = {.op = plan_intern(p, name), .block = PLAN_NONE, .phase = PLAN_PHASE_FORWARD, .line = at + 1, .col = 3,
                .in = p->n_ids, .n_in = s.n_in, .stream = s.stream, .wait = p->n_waits, .n_wait = s.n_wait,
                .microbatch = s.microbatch, .flops = 64.0 * (at + 1)};
    for (int i = 0; i < s.n_in; i++) plan_id_add(p, s.in[i]);
    o.out = p->n_ids, o.n_out = s.n_out;
    for (int i = 0; i < s.n_out; i++) plan_id_add(p, s.out[i]);
    o.attr = p->n_attrs, o.n_attr = s.n_attr;
    for (int i = 0; i < s.n_attr; i++) {
        PlanAttr a = {.key = plan_intern(p, s.attrs[i].key), .kind = s.attrs[i].kind, .i = (int64_t)s.attrs[i].v,
                      .f = s.attrs[i].v};
        if (a.kind == PLAN_ATTR_INTS) {
            a.list = p->n_ints, a.n_list = s.attrs[i].n_list;
            for (int j = 0; j < s.attrs[i].n_list; j++) plan_int_add(p, s.attrs[i].list[j]);
        }
        plan_attr_add(p, &a);
    }
    for (int i = 0; i < s.n_wait; i++) plan_wait_add(p, s.waits[i]);
    int32_t id = plan_op_add(p, &o);
    cr_assert_geq(id, 0);
    for (int i = 0; i < s.n_out; i++) p->tensors[s.out[i]].producer = id;
    return id;
}

/* Literal lists: IDS as two arguments (the ids, their count); the rest as OpSpec fields. */
#define N_IDS(...) (int)(sizeof((int32_t[]){__VA_ARGS__}) / sizeof(int32_t))
#define IDS(...) (const int32_t[]){__VA_ARGS__}, N_IDS(__VA_ARGS__)
#define IN(...) .in = (const int32_t[]){__VA_ARGS__}, .n_in = N_IDS(__VA_ARGS__)
#define OUT(...) .out = (const int32_t[]){__VA_ARGS__}, .n_out = N_IDS(__VA_ARGS__)
#define WAIT(...) .waits = (const int32_t[]){__VA_ARGS__}, .n_wait = N_IDS(__VA_ARGS__)
#define ATTRS(...) .attrs = (const A[]){__VA_ARGS__}, .n_attr = (int)(sizeof((A[]){__VA_ARGS__}) / sizeof(A))
#define INT(k, v) {k, PLAN_ATTR_INT, v, NULL, 0}
#define SHAPE_2x4 {"shape", PLAN_ATTR_INTS, 0, (const int64_t[]){2, 4}, 2}
#define COMM .stream = PLAN_STREAM_COLLECTIVE

static const char *const MODULES[2] = {
    "// stage 0\nextern \"C\" __global__ void fs_s0_mm() {}\n",
    "// stage 1\nextern \"C\" __global__ void fs_s1_mean() {}\nextern \"C\" __global__ void fs_s1_mm() {}\n",
};

static void launch(Plan *p, int32_t k, const char *kernel, const int32_t *args, int n_args)
{
    PlanCuda c = {.op = k, .kind = PLAN_CU_LAUNCH, .kernel = plan_intern(p, kernel), .args = p->n_ids,
                  .n_args = n_args, .grid = {1, 1, 1}, .block = {32, 1, 1}, .smem = 16 * n_args};
    for (int i = 0; i < n_args; i++) plan_id_add(p, args[i]);
    cr_assert_geq(plan_cuda_add(p, &c), 0);
}

/* Stage 0: h = x @ w0 goes to stage 1; its gradient comes back, w0's gradient (a GEMM)
 * is all-reduced over the stage's data-parallel ranks and SGD steps w0. */
static void stage0(Plan *p)
{
    int32_t x = tensor(p, "x", PLAN_ROLE_INPUT, 2, 4), w0 = tensor(p, "w0", PLAN_ROLE_PARAM, 4, 4);
    int32_t h = tensor(p, "h", PLAN_ROLE_ACT, 2, 4), gh = tensor(p, "h.grad", PLAN_ROLE_ACT, 2, 4);
    int32_t gw = tensor(p, "w0.grad", PLAN_ROLE_GRAD, 4, 4), gws = tensor(p, "w0.grad.sum", PLAN_ROLE_GRAD, 4, 4);
    int32_t lr = tensor(p, "lr", PLAN_ROLE_ACT, 0, 0);
    p->tensors[w0].grad = gw, p->tensors[w0].block = 0, p->tensors[w0].init = PLAN_INIT_NORMAL;
    p->tensors[w0].init_a = 0.02;
    p->tensors[lr].step_role = PLAN_SR_LR;
    int32_t mm = op(p, "matmul", (OpSpec){IN(x, w0), OUT(h)});
    p->ops[mm].block = 0;
    int32_t snd = op(p, "send", (OpSpec){IN(h), ATTRS(INT("peer", 1)), COMM});
    int32_t rcv = op(p, "recv", (OpSpec){OUT(gh), ATTRS(SHAPE_2x4, INT("dtype", 0), INT("peer", 1)), COMM});
    int32_t bwd = op(p, "matmul", (OpSpec){IN(x, gh), OUT(gw), WAIT(snd, rcv), ATTRS(INT("ta", 1))});
    int32_t ar = op(p, "all_reduce", (OpSpec){IN(gw), OUT(gws), ATTRS(INT("world", 2), INT("avg", 1)), COMM,
                                              .microbatch = PLAN_NONE});
    op(p, "lr_at", (OpSpec){OUT(lr), ATTRS({"lr", PLAN_ATTR_FLOAT, 0.5, NULL, 0}), .microbatch = PLAN_NONE});
    op(p, "sgd", (OpSpec){IN(w0, gws, lr), WAIT(ar), .microbatch = PLAN_NONE});
    plan_output_add(p, lr);
    launch(p, mm, "fs_s0_mm", IDS(x, w0, h));
    PlanCuda gemm = {.op = bwd, .kind = PLAN_CU_GEMM, .kernel = PLAN_NONE, .args = p->n_ids, .n_args = 3, .ta = 1,
                     .m = 4, .n = 4, .k = 2, .lda = 4, .ldb = 4, .ldc = 4, .batch = 1};
    plan_id_add(p, x), plan_id_add(p, gh), plan_id_add(p, gw);
    cr_assert_geq(plan_cuda_add(p, &gemm), 0);
}

/* Stage 1: the loss of y = a @ w1 (through a reshape, a view), a's gradient back to stage
 * 0, w1's all-reduced; lm_head is tied to w1. */
static void stage1(Plan *p)
{
    int32_t a = tensor(p, "a", PLAN_ROLE_ACT, 2, 4), w1 = tensor(p, "w1", PLAN_ROLE_PARAM, 4, 4);
    int32_t lm = tensor(p, "lm_head", PLAN_ROLE_PARAM, 4, 4), y = tensor(p, "y", PLAN_ROLE_ACT, 2, 4);
    int32_t yv = tensor(p, NULL, PLAN_ROLE_ACT, 8, 0), loss = tensor(p, "loss", PLAN_ROLE_ACT, 0, 0);
    int32_t ga = tensor(p, "a.grad", PLAN_ROLE_ACT, 2, 4), gw = tensor(p, "w1.grad", PLAN_ROLE_GRAD, 4, 4);
    int32_t gws = tensor(p, "w1.grad.sum", PLAN_ROLE_GRAD, 4, 4), lr = tensor(p, "lr", PLAN_ROLE_ACT, 0, 0);
    p->tensors[w1].grad = gw, p->tensors[w1].block = 0, p->tensors[lm].tied_to = w1, p->tensors[yv].alias = y;
    p->tensors[loss].step_role = PLAN_SR_LOSS, p->tensors[lr].step_role = PLAN_SR_LR;
    int32_t rcv = op(p, "recv", (OpSpec){OUT(a), ATTRS(SHAPE_2x4, INT("dtype", 0), INT("peer", 0)), COMM});
    op(p, "matmul", (OpSpec){IN(a, w1), OUT(y), WAIT(rcv)});
    op(p, "reshape", (OpSpec){IN(y), OUT(yv), ATTRS({"shape", PLAN_ATTR_INTS, 0, (const int64_t[]){8}, 1})});
    int32_t mean = op(p, "mean", (OpSpec){IN(yv), OUT(loss)});
    int32_t back = op(p, "matmul", (OpSpec){IN(y, lm), OUT(ga), ATTRS(INT("tb", 1))});
    int32_t snd = op(p, "send", (OpSpec){IN(ga), ATTRS(INT("peer", 0)), COMM});
    op(p, "matmul", (OpSpec){IN(a, y), OUT(gw), ATTRS(INT("ta", 1))});
    int32_t ar = op(p, "all_reduce", (OpSpec){IN(gw), OUT(gws), ATTRS(INT("world", 2), INT("avg", 1)), COMM,
                                              .microbatch = PLAN_NONE});
    op(p, "lr_at", (OpSpec){OUT(lr), ATTRS({"lr", PLAN_ATTR_FLOAT, 0.5, NULL, 0}), .microbatch = PLAN_NONE});
    op(p, "sgd", (OpSpec){IN(w1, gws, lr), WAIT(snd, ar), .microbatch = PLAN_NONE});
    plan_output_add(p, loss), plan_output_add(p, lr);
    launch(p, mean, "fs_s1_mean", IDS(yv, loss));
    launch(p, back, "fs_s1_mm", IDS(y, lm, ga));
}

/* A memory plan for program g as memplan would leave one: each root its own 64 bytes
 * from the arena's start (a view in its root's), live from its producer to the end. */
static void lay_out(Plan *p, PlanProgram *g)
{
    for (int32_t t = g->first_tensor; t < g->first_tensor + g->n_tensors; t++) {
        PlanTensor *x = &p->tensors[t];
        x->offset = x->alias == PLAN_NONE ? 64 * (t - g->first_tensor) : p->tensors[x->alias].offset;
        x->live_start = x->producer == PLAN_NONE ? g->first_op : x->producer;
        x->live_end = g->first_op + g->n_ops;
    }
    g->space_bytes[PLAN_PLACE_DEVICE] = 64 * g->n_tensors;
    g->space_bytes[PLAN_PLACE_HOST] = 0;
}

/* Stage s as the next program of p, its module at byte `at` of p's. */
static void stage_into(Plan *p, int s, int64_t at)
{
    PlanProgram g = {.stage = s, .dp_world = 2, .first_op = p->n_ops, .first_tensor = p->n_tensors,
                     .first_output = p->n_outputs, .module_at = at, .module_len = (int64_t)strlen(MODULES[s])};
    cr_assert_eq(plan_program_add(p, &g), s ? p->n_programs - 1 : 0);
    (s ? stage1 : stage0)(p);  // its ops, tensors and outputs join the program just added
    lay_out(p, &p->programs[p->n_programs - 1]);
}

static void common(Plan *p)
{
    cr_assert_eq(plan_meta_set_str(p, "model", "pipe2"), 0);
    cr_assert_eq(plan_meta_set_int(p, "world", 4), 0);
    cr_assert_eq(plan_meta_set_int(p, "stages", 2), 0);
    cr_assert_eq(plan_block_add(p, "h.0", "Block", 0), 0);
}

/* Stage s alone: a plan of one program, as codegen makes one per stage. */
static Plan *one_stage(int s)
{
    Plan *p = plan_new();
    cr_assert_not_null(p);
    common(p);
    cr_assert_eq(plan_set_cuda_module(p, MODULES[s]), 0);
    stage_into(p, s, 0);
    cr_assert_eq(plan_check(p, err, sizeof err), 0, "stage %d: %s", s, err);
    return p;
}

/* Both stages, item by item, in one plan of two programs. */
static Plan *both_stages(void)
{
    Plan *p = plan_new();
    cr_assert_not_null(p);
    common(p);
    char module[512];
    snprintf(module, sizeof module, "%s%s", MODULES[0], MODULES[1]);
    cr_assert_eq(plan_set_cuda_module(p, module), 0);
    stage_into(p, 0, 0);
    stage_into(p, 1, (int64_t)strlen(MODULES[0]));
    cr_assert_eq(plan_check(p, err, sizeof err), 0, "%s", err);
    return p;
}

/* ---- plan_check of several programs --------------------------------------------------- */

static Plan *two;

static void setup(void) { two = both_stages(); }
static void teardown(void)
{
    plan_set_alloc(NULL, NULL);
    plan_free(two);
}

TestSuite(program, .init = setup, .fini = teardown);

static void expect_check(const char *want)
{
    cr_assert_eq(plan_check(two, err, sizeof err), -1, "passes, expected '%s'", want);
    cr_assert(strstr(err, want), "'%s' lacks '%s'", err, want);
}

/* The op of stage s named name, the n-th such (0-based). */
static int32_t find_op(int s, const char *name, int n)
{
    const PlanProgram *g = &two->programs[s];
    for (int32_t k = g->first_op; k < g->first_op + g->n_ops; k++)
        if (!strcmp(plan_str(two, two->ops[k].op), name) && n-- == 0) return k;
    cr_assert_fail("stage %d has no %s", s, name);
    return -1;
}

static int32_t find_tensor(int s, const char *name)
{
    const PlanProgram *g = &two->programs[s];
    for (int32_t t = g->first_tensor; t < g->first_tensor + g->n_tensors; t++)
        if (!strcmp(plan_str(two, two->tensors[t].name), name)) return t;
    cr_assert_fail("stage %d has no tensor %s", s, name);
    return -1;
}

Test(program, both_stages_pass)
{
    cr_assert_eq(two->n_programs, 2);
    const PlanProgram *a = &two->programs[0], *b = &two->programs[1];
    cr_assert(a->n_ops == 7 && b->first_op == 7 && b->n_ops == 10);
    cr_assert(a->n_tensors == 7 && b->first_tensor == 7 && b->n_tensors == 10);
    cr_assert(a->n_outputs == 1 && b->first_output == 1 && b->n_outputs == 2);
    cr_assert(a->module_len == (int64_t)strlen(MODULES[0]) && b->module_at == a->module_len);
    cr_assert_eq(b->module_at + b->module_len, (int64_t)strlen(two->cuda_module));
    cr_assert_eq(plan_check_p2p(two, err, sizeof err), 0, "the two stages meet: %s", err);
}

Test(program, stage_order_and_world)
{
    two->programs[1].stage = 0;
    expect_check("program 1: stage 0 (programs are in stage order, from 0)");
    two->programs[1].stage = 1;
    two->programs[1].dp_world = 4;
    expect_check("program 1: 4 data-parallel ranks, program 0 2 (every stage has as many)");
    two->programs[1].dp_world = 0;
    expect_check("program 1: 0 data-parallel ranks (at least 1)");
}

Test(program, ranges_back_to_back)
{
    PlanProgram *b = &two->programs[1];
    b->first_op++, b->n_ops--;
    expect_check("program 1: ops start at 8, expected 7 (where the program before ends)");
    b->first_op--, b->n_ops++;
    b->first_tensor--, b->n_tensors++;
    expect_check("program 1: tensors start at 6, expected 7");
    b->first_tensor++, b->n_tensors--;
    b->n_outputs = 1;
    expect_check("the programs hold 2 of the plan's 3 outputs");
    b->n_outputs = 2;
    b->module_at++, b->module_len--;
    expect_check("program 1: module bytes start at");
    b->module_at--;
    expect_check("the programs hold");
    b->module_len += 2;
    expect_check("module bytes from");
    b->module_len--;
    cr_assert_eq(plan_check(two, err, sizeof err), 0, "%s", err);
    /* Without a module, every program's range is empty. */
    plan_dealloc(two->cuda_module);
    two->cuda_module = NULL;
    expect_check("program 0: ");
    two->programs[0].module_len = b->module_at = b->module_len = 0;
    cr_assert_eq(plan_check(two, err, sizeof err), 0, "%s", err);
}

Test(program, ops_name_their_own_tensors_and_ops)
{
    int32_t mm = find_op(1, "matmul", 0), x = find_tensor(0, "x"), y = find_tensor(1, "y");
    two->ids[two->ops[mm].in] = x;
    expect_check("op 8 (matmul, stage 1): input tensor 0 belongs to stage 0");
    two->ids[two->ops[mm].in] = find_tensor(1, "a");
    int32_t bwd = find_op(0, "matmul", 1);
    two->ids[two->ops[bwd].out] = y;
    expect_check("op 3 (matmul): output tensor 10 names op 8 as its producer");  // before its stage
    two->ids[two->ops[bwd].out] = find_tensor(0, "w0.grad");
    two->waits[two->ops[mm].wait] = find_op(0, "send", 0);
    expect_check("op 8 (matmul, stage 1): waits for op 1 of stage 0");
}

Test(program, tensors_name_their_own)
{
    int32_t y = find_tensor(1, "y"), x = find_tensor(0, "x"), w1 = find_tensor(1, "w1");
    two->tensors[x].producer = find_op(1, "mean", 0);
    expect_check("tensor 0 (stage 0): producer op 10 belongs to stage 1");
    two->tensors[x].producer = PLAN_NONE;
    two->tensors[find_tensor(0, "w0")].grad = find_tensor(1, "w1.grad");
    expect_check("tensor 1 (stage 0): grad tensor 14 belongs to stage 1");
    two->tensors[find_tensor(0, "w0")].grad = find_tensor(0, "w0.grad");
    two->tensors[y + 1].alias = x;
    expect_check("tensor 11 (stage 1): alias tensor 0 belongs to stage 0");
    two->tensors[y + 1].alias = y;
    two->tensors[find_tensor(1, "lm_head")].tied_to = find_tensor(0, "w0");
    expect_check("tensor 9 (stage 1): tied tensor 1 belongs to stage 0");
    two->tensors[find_tensor(1, "lm_head")].tied_to = w1;
    two->outputs[1] = x;
    expect_check("output 1 (stage 1): tensor 0 belongs to stage 0");
}

Test(program, cuda_args_of_their_program)
{
    int32_t i = two->n_cuda - 1;
    cr_assert_eq(two->cuda[i].op, find_op(1, "matmul", 1));
    two->ids[two->cuda[i].args + 1] = find_tensor(0, "w0");
    expect_check("cuda 3 (op 11, stage 1): arg 1: tensor 1 belongs to stage 0");
}

/* Each program has its own step loop, so its own step roles; within one, each once. */
Test(program, step_roles_per_program)
{
    cr_assert_eq(two->tensors[find_tensor(0, "lr")].step_role, PLAN_SR_LR);
    cr_assert_eq(two->tensors[find_tensor(1, "lr")].step_role, PLAN_SR_LR);
    two->tensors[find_tensor(1, "y")].step_role = PLAN_SR_LR;
    expect_check("tensor 16 (stage 1): step role lr is tensor 10's already");
}

Test(program, peers_are_other_stages)
{
    int32_t snd = find_op(1, "send", 0);
    PlanAttr *peer = &two->attrs[two->ops[snd].attr];
    peer->i = 1;
    expect_check("op 12 (send, stage 1): peer 1 is not another stage (stages 0 to 1)");
    peer->i = 2;
    expect_check("op 12 (send, stage 1): peer 2 is not another stage");
    peer->i = -1;
    expect_check("op 12 (send): no peer (an int attribute, the stage it sends to, >= 0)");
    peer->i = 0, peer->kind = PLAN_ATTR_FLOAT;
    expect_check("op 12 (send): no peer");
    peer->kind = PLAN_ATTR_INT;
    two->ops[snd].n_attr = 0;
    expect_check("op 12 (send): no peer");
    two->ops[snd].n_attr = 1;
    two->ops[snd].n_in = 2;
    expect_check("op 12 (send): 2 inputs and 0 outputs, expected 1 and 0");
    two->ops[snd].n_in = 1;
    int32_t rcv = find_op(0, "recv", 0);
    two->ops[rcv].n_in = 1;
    expect_check("op 2 (recv): 1 inputs and 1 outputs, expected 0 and 1");
    two->ops[rcv].n_in = 0;
    cr_assert_eq(plan_check(two, err, sizeof err), 0, "%s", err);
}

Test(program, collective_groups)
{
    int32_t ar = find_op(0, "all_reduce", 0);
    PlanAttr *world = &two->attrs[two->ops[ar].attr];
    world->key = plan_intern(two, "group"), world->i = 4;
    expect_check("op 4 (all_reduce): group must be the int 0 (the stage's data-parallel ranks), 1 (the pipeline), "
                 "2 (the shard group) or 3 (the replica group)");
    world->i = 1;
    cr_assert_eq(plan_check(two, err, sizeof err), 0, "%s", err);
    two->ops[ar].n_in = 2;
    expect_check("op 4 (all_reduce): 2 inputs, expected 1");
}

/* Ops, tensors and outputs added where the last program's ranges end join it; one added
 * with its ranges set ahead is filled first. */
Test(program, items_added_later_join_the_last_program)
{
    Plan *p = plan_new();
    int32_t t = tensor(p, "t", PLAN_ROLE_INPUT, 4, 0);
    cr_assert_eq(plan_set_one_program(p, 1, 64, 0), 0);
    cr_assert_eq(p->programs[0].n_tensors, 1);
    int32_t u = tensor(p, "u", PLAN_ROLE_ACT, 4, 0);
    op(p, "relu", (OpSpec){IN(t), OUT(u)});
    cr_assert_eq(plan_output_add(p, u), 0);
    const PlanProgram *g = &p->programs[0];
    cr_assert(g->n_tensors == 2 && g->n_ops == 1 && g->n_outputs == 1);
    cr_assert_eq(plan_check(p, err, sizeof err), 0, "%s", err);
    PlanProgram next = {.stage = 1, .dp_world = 1, .first_op = 1, .n_ops = 1, .first_tensor = 2, .n_tensors = 1,
                        .first_output = 1};
    cr_assert_eq(plan_program_add(p, &next), 1);
    tensor(p, "v", PLAN_ROLE_ACT, 4, 0);  // inside program 1's range
    cr_assert(p->programs[0].n_tensors == 2 && p->programs[1].n_tensors == 1);
    tensor(p, "w", PLAN_ROLE_ACT, 4, 0);  // where it ends
    cr_assert_eq(p->programs[1].n_tensors, 2);
    plan_free(p);
}

/* A plan of one program may be any stage's: an extract, whose peers are stages it lacks. */
Test(program, one_program_of_a_later_stage)
{
    Plan *p = one_stage(1);
    cr_assert_eq(p->programs[0].stage, 1);
    cr_assert_eq(plan_check(p, err, sizeof err), 0, "%s", err);
    p->programs[0].stage = -1;
    cr_assert_eq(plan_check(p, err, sizeof err), -1);
    cr_assert(strstr(err, "program 0: stage -1"), "%s", err);
    p->n_programs = 0;  // as without a memory plan: nothing to hold anything to
    cr_assert_eq(plan_check(p, err, sizeof err), 0, "%s", err);
    plan_free(p);
}

/* ---- comparing plans: string ids by the strings they name ----------------------------- */

static void same_str(const Plan *a, int32_t x, const Plan *b, int32_t y, const char *what, int32_t i)
{
    cr_assert((x == PLAN_NONE) == (y == PLAN_NONE), "%s %d: one of the ids is none", what, i);
    cr_assert_str_eq(plan_str(a, x), plan_str(b, y), "%s %d", what, i);
}

static void same_double(double x, double y, const char *what, int32_t i)
{
    cr_assert(!memcmp(&x, &y, sizeof x), "%s %d: %g vs %g", what, i, x, y);
}

static void same_tensors(const Plan *a, const Plan *b)
{
    cr_assert_eq(a->n_tensors, b->n_tensors);
    for (int32_t i = 0; i < a->n_tensors; i++) {
        const PlanTensor *x = &a->tensors[i], *y = &b->tensors[i];
        same_str(a, x->name, b, y->name, "tensor", i);
        cr_assert(x->dtype == y->dtype && x->role == y->role && x->place == y->place && x->init == y->init, "tensor %d", i);
        cr_assert_eq(x->rank, y->rank, "tensor %d", i);
        for (int d = 0; d < x->rank; d++) cr_assert_eq(x->shape[d], y->shape[d], "tensor %d", i);
        cr_assert(x->block == y->block && x->producer == y->producer && x->tied_to == y->tied_to, "tensor %d", i);
        cr_assert(x->grad == y->grad && x->alias == y->alias && x->step_role == y->step_role, "tensor %d", i);
        same_double(x->init_a, y->init_a, "tensor init_a", i);
        same_double(x->init_b, y->init_b, "tensor init_b", i);
        cr_assert(x->offset == y->offset && x->live_start == y->live_start && x->live_end == y->live_end, "tensor %d", i);
        cr_assert(x->rank_stride == y->rank_stride && x->unit == y->unit && x->flat_offset == y->flat_offset &&
                  x->sharded == y->sharded, "tensor %d", i);
    }
}

static void same_ops(const Plan *a, const Plan *b)
{
    cr_assert_eq(a->n_ops, b->n_ops);
    for (int32_t i = 0; i < a->n_ops; i++) {
        const PlanOp *x = &a->ops[i], *y = &b->ops[i];
        same_str(a, x->op, b, y->op, "op", i);
        cr_assert(x->block == y->block && x->phase == y->phase && x->line == y->line && x->col == y->col, "op %d", i);
        cr_assert(x->in == y->in && x->n_in == y->n_in && x->out == y->out && x->n_out == y->n_out, "op %d", i);
        cr_assert(x->attr == y->attr && x->n_attr == y->n_attr && x->stream == y->stream, "op %d", i);
        cr_assert(x->wait == y->wait && x->n_wait == y->n_wait && x->microbatch == y->microbatch, "op %d", i);
        same_double(x->flops, y->flops, "op flops", i);
    }
    cr_assert_eq(a->n_ids, b->n_ids);
    for (int32_t i = 0; i < a->n_ids; i++) cr_assert_eq(a->ids[i], b->ids[i], "id %d", i);
    cr_assert_eq(a->n_waits, b->n_waits);
    for (int32_t i = 0; i < a->n_waits; i++) cr_assert_eq(a->waits[i], b->waits[i], "wait %d", i);
    cr_assert_eq(a->n_attrs, b->n_attrs);
    for (int32_t i = 0; i < a->n_attrs; i++) {
        const PlanAttr *x = &a->attrs[i], *y = &b->attrs[i];
        same_str(a, x->key, b, y->key, "attr", i);
        cr_assert_eq(x->kind, y->kind, "attr %d", i);
        if (x->kind == PLAN_ATTR_INT) cr_assert_eq(x->i, y->i, "attr %d", i);
        if (x->kind == PLAN_ATTR_FLOAT) same_double(x->f, y->f, "attr", i);
        if (x->kind == PLAN_ATTR_INTS) cr_assert(x->list == y->list && x->n_list == y->n_list, "attr %d", i);
    }
    cr_assert_eq(a->n_ints, b->n_ints);
    for (int32_t i = 0; i < a->n_ints; i++) cr_assert_eq(a->ints[i], b->ints[i], "int %d", i);
}

static void same_cuda(const Plan *a, const Plan *b)
{
    cr_assert_eq(a->n_cuda, b->n_cuda);
    for (int32_t i = 0; i < a->n_cuda; i++) {
        const PlanCuda *x = &a->cuda[i], *y = &b->cuda[i];
        same_str(a, x->kernel, b, y->kernel, "cuda", i);
        cr_assert(x->op == y->op && x->kind == y->kind && x->args == y->args && x->n_args == y->n_args, "cuda %d", i);
        cr_assert(x->smem == y->smem && x->ta == y->ta && x->tb == y->tb, "cuda %d", i);
        for (int d = 0; d < 3; d++) cr_assert(x->grid[d] == y->grid[d] && x->block[d] == y->block[d], "cuda %d", i);
        const int64_t xs[] = {x->m, x->n, x->k, x->lda, x->ldb, x->ldc, x->stride_a, x->stride_b, x->stride_c,
                              x->batch, x->a_off, x->b_off, x->c_off};
        const int64_t ys[] = {y->m, y->n, y->k, y->lda, y->ldb, y->ldc, y->stride_a, y->stride_b, y->stride_c,
                              y->batch, y->a_off, y->b_off, y->c_off};
        for (int f = 0; f < 13; f++) cr_assert_eq(xs[f], ys[f], "cuda %d field %d", i, f);
    }
    cr_assert_str_eq(a->cuda_module ? a->cuda_module : "", b->cuda_module ? b->cuda_module : "");
}

/* Every field of a and b, strings by value (an extract keeps the whole plan's table). */
static void assert_same_plan(const Plan *a, const Plan *b)
{
    cr_assert_eq(a->n_meta, b->n_meta);
    for (int32_t i = 0; i < a->n_meta; i++) {
        const PlanMeta *x = &a->meta[i], *y = &b->meta[i];
        same_str(a, x->key, b, y->key, "meta", i);
        cr_assert_eq(x->kind, y->kind);
        if (x->kind == PLAN_META_STR) same_str(a, x->s, b, y->s, "meta value", i);
        if (x->kind == PLAN_META_INT) cr_assert_eq(x->i, y->i);
        if (x->kind == PLAN_META_FLOAT) same_double(x->f, y->f, "meta", i);
    }
    cr_assert_eq(a->n_blocks, b->n_blocks);
    for (int32_t i = 0; i < a->n_blocks; i++) {
        same_str(a, a->blocks[i].name, b, b->blocks[i].name, "block", i);
        same_str(a, a->blocks[i].layer, b, b->blocks[i].layer, "block layer", i);
        cr_assert_eq(a->blocks[i].index, b->blocks[i].index);
    }
    same_tensors(a, b);
    same_ops(a, b);
    cr_assert_eq(a->n_outputs, b->n_outputs);
    for (int32_t i = 0; i < a->n_outputs; i++) cr_assert_eq(a->outputs[i], b->outputs[i], "output %d", i);
    same_cuda(a, b);
    cr_assert_eq(a->n_programs, b->n_programs);
    for (int32_t i = 0; i < a->n_programs; i++) {
        const PlanProgram *x = &a->programs[i], *y = &b->programs[i];
        cr_assert(x->stage == y->stage && x->dp_world == y->dp_world, "program %d", i);
        cr_assert(x->first_op == y->first_op && x->n_ops == y->n_ops, "program %d", i);
        cr_assert(x->first_tensor == y->first_tensor && x->n_tensors == y->n_tensors, "program %d", i);
        cr_assert(x->first_output == y->first_output && x->n_outputs == y->n_outputs, "program %d", i);
        cr_assert(x->module_at == y->module_at && x->module_len == y->module_len, "program %d", i);
        for (int s = 0; s < PLAN_PLACE_COUNT; s++) cr_assert_eq(x->space_bytes[s], y->space_bytes[s], "program %d", i);
    }
}

/* ---- plan_append_program and plan_extract_program ------------------------------------- */

static Plan *appended(Plan *const one[2])
{
    Plan *p = plan_new();
    cr_assert_not_null(p);
    for (int s = 0; s < 2; s++) cr_assert_eq(plan_append_program(p, one[s], err, sizeof err), 0, "stage %d: %s", s, err);
    return p;
}

/* Appending the stages one by one makes the plan built item by item, to the string id. */
Test(program, append_is_the_plan_built_whole)
{
    Plan *one[2] = {one_stage(0), one_stage(1)};
    Plan *p = appended(one);
    cr_assert_eq(plan_check(p, err, sizeof err), 0, "%s", err);
    cr_assert_eq(p->n_strs, two->n_strs);
    for (int32_t i = 0; i < p->n_strs; i++) cr_assert_str_eq(p->strs[i], two->strs[i]);
    assert_same_plan(two, p);
    plan_free(p);
    plan_free(one[0]), plan_free(one[1]);
}

Test(program, round_trip_through_bytes)
{
    void *buf;
    size_t len;
    cr_assert_eq(plan_write_mem(two, &buf, &len, err, sizeof err), 0, "%s", err);
    Plan *back = plan_read_mem(buf, len, err, sizeof err);
    cr_assert_not_null(back, "%s", err);
    assert_same_plan(two, back);
    plan_free(back);
    plan_dealloc(buf);
}

/* Each program taken out again is the stage's own plan, field for field. */
Test(program, extract_gives_back_each_stage)
{
    for (int s = 0; s < 2; s++) {
        Plan *one = one_stage(s), *q = plan_extract_program(two, s, err, sizeof err);
        cr_assert_not_null(q, "%s", err);
        cr_assert_eq(plan_check(q, err, sizeof err), 0, "stage %d: %s", s, err);
        cr_assert_eq(q->n_strs, two->n_strs, "the whole string table");
        assert_same_plan(one, q);
        cr_assert_str_eq(q->cuda_module, MODULES[s]);
        cr_assert_eq(q->programs[0].stage, s);
        cr_assert_eq(plan_intern(q, "new"), q->n_strs - 1, "an extract can be added to");
        plan_free(q);
        plan_free(one);
    }
    cr_assert_null(plan_extract_program(two, 2, err, sizeof err));
    cr_assert_str_eq(err, "no program 2 to extract: the plan has 2");
    cr_assert_null(plan_extract_program(two, -1, err, sizeof err));
}

Test(program, append_refuses_what_it_cannot_take)
{
    Plan *p = plan_new(), *one = one_stage(0);
    cr_assert_null(plan_extract_program(p, 0, err, sizeof err));
    cr_assert_eq(plan_append_program(p, two, err, sizeof err), -1);
    cr_assert_str_eq(err, "stage 0: a plan of 2 programs, expected one (a stage with its memory plan)");
    one->ids[0] = 999;
    cr_assert_eq(plan_append_program(p, one, err, sizeof err), -1);
    cr_assert(strstr(err, "stage 0: id 0: tensor 999 out of range"), "%s", err);
    one->ids[0] = 0;
    cr_assert_eq(plan_output_add(p, 0), 0);
    cr_assert_eq(plan_append_program(p, one, err, sizeof err), -1);
    cr_assert(strstr(err, "stage 0: the plan appended to already holds ops, tensors, outputs or CUDA code"), "%s", err);
    plan_free(p);

    p = plan_new();
    cr_assert_eq(plan_append_program(p, one, err, sizeof err), 0, "%s", err);
    Plan *other = one_stage(1);
    other->strs[other->blocks[0].name][2] = '9';  // "h.9"
    cr_assert_eq(plan_append_program(p, other, err, sizeof err), -1);
    cr_assert_str_eq(err, "stage 1: block 0 is h.9 (Block 0), the stages before it have h.0 (Block 0)");
    cr_assert_eq(plan_block_add(other, "h.1", "Block", 1), 1);
    cr_assert_eq(plan_append_program(p, other, err, sizeof err), -1);
    cr_assert_str_eq(err, "stage 1 has 2 blocks, the stages before it 1 (every stage has the model's)");
    plan_free(other);
    plan_free(p);
    plan_free(one);
}

/* ---- allocation failure (the hook: tests/support/alloc_count.h) ------------------------ */

/* Both appends into a new plan under the hook: 0, or -1 at the failed allocation. */
static int append_both(Plan *const one[2])
{
    Plan *p = plan_new();
    int rc = p ? 0 : -1;
    for (int s = 0; s < 2 && !rc; s++) {
        err[0] = 0;
        rc = plan_append_program(p, one[s], err, sizeof err);
        if (rc) cr_assert(strstr(err, "out of memory appending stage"), "%s", err);
    }
    plan_free(p);
    return rc;
}

Test(program, append_and_extract_survive_every_allocation_failure)
{
    Plan *one[2] = {one_stage(0), one_stage(1)};
    count_allocs(0);
    cr_assert_eq(append_both(one), 0);
    long total = n_allocs;
    cr_assert_gt(total, 10);
    for (long k = 1; k <= total; k++) {
        count_allocs(k);
        cr_assert_eq(append_both(one), -1, "allocation %ld failed, yet appended", k);
        cr_assert_eq(live, 0, "allocation %ld failed: %ld blocks leaked", k, live);
    }
    for (int s = 0; s < 2; s++) {
        count_allocs(0);
        plan_free(plan_extract_program(two, s, err, sizeof err));
        total = n_allocs;
        for (long k = 1; k <= total; k++) {
            count_allocs(k);
            err[0] = 0;
            cr_assert_null(plan_extract_program(two, s, err, sizeof err), "allocation %ld failed, yet extracted", k);
            cr_assert_str_eq(err, s ? "out of memory extracting program 1" : "out of memory extracting program 0");
            cr_assert_eq(live, 0, "allocation %ld failed: %ld blocks leaked", k, live);
        }
    }
    plan_set_alloc(NULL, NULL);
    plan_free(one[0]), plan_free(one[1]);
}
