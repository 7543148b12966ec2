/* tests/mpi/pipeline.c: pipeline stages on real MPI ranks (run by pipeline.sh and
 * pipeline_kill.sh), with plans built by hand.
 *
 * The model: a classifier of two layers with a tied param t,
 *   h = x @ w0 + t      (stage 0)      logits = (h + t) @ w1, loss = cross_entropy (stage 1)
 * trained by SGD. Cut in two stages, stage 0 sends h and receives its gradient back;
 * stage 1 receives h, computes the loss and sends the gradient of h. The loss reaches
 * stage 0 by a sum over the pipeline group (stage 0 adds a zero), t's gradient is the
 * sum of both stages' parts, the gradient norm the sum of both stages' squares; with two
 * data-parallel ranks per stage, each stage averages its loss and gradients over them.
 * The same model in one program (one stage, one rank) is the reference: the one-rank
 * ops in the same order, so a pipeline of one data-parallel rank trains bit for bit as
 * it does, and one of two to rounding.
 *
 *   pipeline write DIR    writes DIR/one.plan (1 stage), pp2.plan (2 stages x 1),
 *                         pp2x2.plan (2 stages x 2), for fsexec
 *   pipeline run          under mpirun -np 2 or 4: each rank runs its stage's program
 *                         (plan_extract_program) in an Exec, and asserts what stage 1
 *                         received (h, row for row the reference's), the losses of every
 *                         step and the trained params against the reference, with
 *                         standard sends and again with every send synchronous
 *                         (ExecOptions.sync_sends, fsexec --sync-sends)
 * Prints one line per rank; exit 1 on a mismatch.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ops.h"
#include "runtime.h"

enum { BG = 8, D = 4, H = 6, K = 3, STEPS = 5 };


/* ---- building a stage's program -------------------------------------------------------- */

static int32_t tensor(Plan *p, const char *name, PlanDType dt, PlanRole role, int rank, const int64_t *shape,
                      PlanInit init, double a)
{
    PlanTensor t = {.name = name ? plan_intern(p, name) : PLAN_NONE, .dtype = dt, .role = role, .init = init,
                    .rank = rank, .block = PLAN_NONE, .producer = PLAN_NONE, .tied_to = PLAN_NONE, .grad = PLAN_NONE,
                    .init_a = a, .init_b = init == PLAN_INIT_UNIFORM ? -a : 0, .alias = PLAN_NONE, .unit = PLAN_NONE};
    for (int d = 0; d < rank; d++) t.shape[d] = shape[d];
    return plan_tensor_add(p, &t);
}

static int32_t act(Plan *p, const char *name, int rank, const int64_t *shape)
{
    return tensor(p, name, PLAN_DT_F32, PLAN_ROLE_ACT, rank, shape, PLAN_INIT_NONE, 0);
}

typedef struct {
    const char *key;
    double v;
    const int64_t *list;  // an ints attribute: n values
    int n;
} A;

/* Op `name`; a collective or point-to-point op goes on the collective stream. */
static int32_t op(Plan *p, const char *name, PlanPhase ph, const int32_t *in, int n_in, int32_t out, const A *attrs,
                  int n_attr)
{
    int comm = !strcmp(name, "all_reduce") || !strcmp(name, "send") || !strcmp(name, "recv");
    PlanOp o = {.op = plan_intern(p, name), .block = PLAN_NONE, .phase = comm ? PLAN_PHASE_COMM : ph,
                .stream = comm ? PLAN_STREAM_COLLECTIVE : PLAN_STREAM_COMPUTE, .microbatch = PLAN_NONE,
                .in = p->n_ids, .n_in = n_in};
    for (int i = 0; i < n_in; i++) plan_id_add(p, in[i]);
    o.out = p->n_ids, o.n_out = out != PLAN_NONE;
    if (out != PLAN_NONE) plan_id_add(p, out);
    o.attr = p->n_attrs, o.n_attr = n_attr;
    for (int i = 0; i < n_attr; i++) {
        PlanAttr a = {.key = plan_intern(p, attrs[i].key), .kind = PLAN_ATTR_INT, .i = (int64_t)attrs[i].v};
        if (attrs[i].v != floor(attrs[i].v)) a.kind = PLAN_ATTR_FLOAT, a.f = attrs[i].v;
        if (attrs[i].list) {
            a.kind = PLAN_ATTR_INTS, a.list = p->n_ints, a.n_list = attrs[i].n;
            for (int j = 0; j < attrs[i].n; j++) plan_int_add(p, attrs[i].list[j]);
        }
        plan_attr_add(p, &a);
    }
    int32_t k = plan_op_add(p, &o);
    if (out != PLAN_NONE) p->tensors[out].producer = k;
    return k;
}

static int touches(const Plan *p, int32_t k, int32_t t)
{
    const PlanOp *o = &p->ops[k];
    for (int32_t i = 0; i < o->n_in; i++)
        if (p->ids[o->in + i] == t) return 1;
    for (int32_t i = 0; i < o->n_out; i++)
        if (p->ids[o->out + i] == t) return 1;
    return 0;
}

static int touches_op(const Plan *p, int32_t k, int32_t c)
{
    const PlanOp *o = &p->ops[c];
    for (int32_t i = 0; i < o->n_in + o->n_out; i++)
        if (touches(p, k, p->ids[(i < o->n_in ? o->in : o->out - o->n_in) + i])) return 1;
    return 0;
}

/* The schedule and memory plan passes in brief: every op waits for the collectives and
 * point-to-point ops in flight whose tensors it touches; every root its own bytes, live
 * from its writer to its last reader (to the step's end for persistent state, outputs
 * and whatever an op off the compute stream touches). */
static void finish(Plan *p, int dp)
{
    int32_t *pending = calloc((size_t)p->n_ops + 1, sizeof *pending), n_pending = 0;
    for (int32_t k = 0; k < p->n_ops; k++) {
        p->ops[k].wait = p->n_waits;
        for (int32_t j = 0; j < n_pending; j++)
            if (touches_op(p, k, pending[j])) plan_wait_add(p, pending[j]), pending[j--] = pending[--n_pending];
        p->ops[k].n_wait = p->n_waits - p->ops[k].wait;
        if (p->ops[k].stream != PLAN_STREAM_COMPUTE) pending[n_pending++] = k;
    }
    free(pending);
    int64_t top = 0;
    for (int32_t i = 0; i < p->n_tensors; i++) {
        PlanTensor *t = &p->tensors[i];
        t->offset = top, top += (plan_tensor_nbytes(t) + 63) / 64 * 64;
        t->live_start = t->producer >= 0 ? t->producer : 0, t->live_end = t->live_start;
        for (int32_t k = 0; k < p->n_ops; k++)
            if (touches(p, k, i))
                t->live_end = p->ops[k].stream != PLAN_STREAM_COMPUTE || plan_tensor_is_persistent(t) ? p->n_ops : k;
        if (plan_tensor_is_persistent(t)) t->live_start = 0, t->live_end = p->n_ops;
    }
    for (int32_t i = 0; i < p->n_outputs; i++) p->tensors[p->outputs[i]].live_end = p->n_ops;
    plan_set_one_program(p, dp, top, 0);
}

static int32_t all_reduce(Plan *p, int32_t x, int world, int avg, int group)
{
    int32_t y = act(p, NULL, p->tensors[x].rank, p->tensors[x].shape);
    op(p, "all_reduce", PLAN_PHASE_COMM, &x, 1, y, (A[]){{"world", world, 0, 0}, {"avg", avg, 0, 0}, {"group", group, 0, 0}},
       3);
    return y;
}

/* The gradients of a stage averaged over its data-parallel ranks (none with one). */
static int32_t dp_mean(Plan *p, int32_t g, int dp) { return dp > 1 ? all_reduce(p, g, dp, 1, OP_GROUP_DATA) : g; }

/* A sum over the stages (nothing with one). */
static int32_t over_stages(Plan *p, int32_t x, int stages)
{
    return stages > 1 ? all_reduce(p, x, stages, 0, OP_GROUP_PIPE) : x;
}

static void sgd(Plan *p, int32_t w, int32_t g, const char *buf, int32_t lr, int32_t coef, int32_t step)
{
    const PlanTensor *t = &p->tensors[w];
    int32_t b = tensor(p, buf, PLAN_DT_F32, PLAN_ROLE_OPT_STATE, t->rank, t->shape, PLAN_INIT_ZEROS, 0);
    op(p, "sgd", PLAN_PHASE_OPTIMIZER, (int32_t[]){w, g, b, lr, coef, step}, 6, PLAN_NONE,
       (A[]){{"momentum", 0.5, 0, 0}, {"weight_decay", 0, 0, 0}}, 2);
}

/* Program `s` of the model cut in `stages` (1 or 2; s = 0 with one: all of it), for dp
 * data-parallel ranks of BG / dp rows each. */
static Plan *stage_program(int stages, int dp, int s)
{
    Plan *p = plan_new();
    plan_meta_set_str(p, "model", "pipe_mlp");
    plan_meta_set_int(p, "world", stages * dp);
    plan_meta_set_int(p, "stages", stages);
    int first = s == 0, last = s == stages - 1, B = BG / dp;
    int64_t sx[] = {B, D}, sy[] = {B}, sw0[] = {D, H}, sw1[] = {H, K}, st[] = {H}, sh[] = {B, H}, sl[] = {B, K};
    int32_t step = tensor(p, "step", PLAN_DT_I32, PLAN_ROLE_INPUT, 0, NULL, PLAN_INIT_NONE, 0);
    p->tensors[step].step_role = PLAN_SR_STEP;
    int32_t x = first ? tensor(p, "x", PLAN_DT_F32, PLAN_ROLE_INPUT, 2, sx, PLAN_INIT_NONE, 0) : PLAN_NONE;
    int32_t y = last ? tensor(p, "y", PLAN_DT_I32, PLAN_ROLE_INPUT, 1, sy, PLAN_INIT_NONE, 0) : PLAN_NONE;
    int32_t w0 = first ? tensor(p, "w0", PLAN_DT_F32, PLAN_ROLE_PARAM, 2, sw0, PLAN_INIT_NORMAL, 0.5) : PLAN_NONE;
    int32_t t = tensor(p, "t", PLAN_DT_F32, PLAN_ROLE_PARAM, 1, st, PLAN_INIT_UNIFORM, -0.2);  // tied: every stage
    int32_t w1 = last ? tensor(p, "w1", PLAN_DT_F32, PLAN_ROLE_PARAM, 2, sw1, PLAN_INIT_NORMAL, 0.5) : PLAN_NONE;
    A to_stage[] = {{"peer", 1 - s, 0, 0}};
    A recv_h[] = {{"shape", 0, sh, 2}, {"dtype", PLAN_DT_F32, 0, 0}, {"peer", 1 - s, 0, 0}};
    /* forward */
    int32_t h = PLAN_NONE, h2 = PLAN_NONE, logits = PLAN_NONE, loss;
    if (first) {
        int32_t xw = act(p, NULL, 2, sh);
        h = act(p, "h", 2, sh);
        op(p, "matmul", PLAN_PHASE_FORWARD, (int32_t[]){x, w0}, 2, xw, NULL, 0);
        op(p, "add", PLAN_PHASE_FORWARD, (int32_t[]){xw, t}, 2, h, NULL, 0);
    }
    if (stages > 1 && first) op(p, "send", PLAN_PHASE_FORWARD, &h, 1, PLAN_NONE, to_stage, 1);
    if (stages > 1 && last) h = act(p, "h.recv", 2, sh), op(p, "recv", PLAN_PHASE_FORWARD, NULL, 0, h, recv_h, 3);
    if (last) {
        h2 = act(p, "h2", 2, sh), logits = act(p, "logits", 2, sl);
        int32_t ll = act(p, "loss.local", 0, NULL);
        op(p, "add", PLAN_PHASE_FORWARD, (int32_t[]){h, t}, 2, h2, NULL, 0);
        op(p, "matmul", PLAN_PHASE_FORWARD, (int32_t[]){h2, w1}, 2, logits, NULL, 0);
        op(p, "cross_entropy", PLAN_PHASE_FORWARD, (int32_t[]){logits, y}, 2, ll, NULL, 0);
        int32_t terms = act(p, NULL, 2, (int64_t[]){B, 2});  // its second output: the rows' terms
        plan_id_add(p, terms);
        p->ops[p->n_ops - 1].n_out = 2, p->tensors[terms].producer = p->n_ops - 1;
        loss = over_stages(p, dp_mean(p, ll, dp), stages);
    } else {  // the loss comes from the last stage: this one adds a zero
        int32_t zero = act(p, "loss.zero", 0, NULL);
        op(p, "scalar", PLAN_PHASE_FORWARD, NULL, 0, zero, (A[]){{"value", 0, 0, 0}}, 1);
        loss = over_stages(p, zero, stages);
    }
    /* backward */
    int32_t dh = PLAN_NONE, gw0 = PLAN_NONE, gw1 = PLAN_NONE, gt0 = PLAN_NONE, gt1 = PLAN_NONE;
    if (last) {
        int32_t one = act(p, NULL, 0, NULL), dl = act(p, NULL, 2, sl);
        dh = act(p, "h.grad", 2, sh), gw1 = act(p, "w1.grad", 2, sw1), gt1 = act(p, "t.grad.1", 1, st);
        op(p, "scalar", PLAN_PHASE_BACKWARD, NULL, 0, one, (A[]){{"value", 1, 0, 0}}, 1);
        op(p, "cross_entropy_bwd", PLAN_PHASE_BACKWARD, (int32_t[]){logits, y, one}, 3, dl, NULL, 0);
        op(p, "matmul", PLAN_PHASE_BACKWARD, (int32_t[]){h2, dl}, 2, gw1, (A[]){{"ta", 1, 0, 0}}, 1);
        op(p, "matmul", PLAN_PHASE_BACKWARD, (int32_t[]){dl, w1}, 2, dh, (A[]){{"tb", 1, 0, 0}}, 1);
        op(p, "sum_to", PLAN_PHASE_BACKWARD, &dh, 1, gt1, (A[]){{"shape", 0, st, 1}}, 1);
    }
    if (stages > 1 && last) op(p, "send", PLAN_PHASE_BACKWARD, &dh, 1, PLAN_NONE, to_stage, 1);
    if (stages > 1 && first)
        dh = act(p, "h.grad.recv", 2, sh), op(p, "recv", PLAN_PHASE_BACKWARD, NULL, 0, dh, recv_h, 3);
    if (first) {
        gw0 = act(p, "w0.grad", 2, sw0), gt0 = act(p, "t.grad.0", 1, st);
        op(p, "matmul", PLAN_PHASE_BACKWARD, (int32_t[]){x, dh}, 2, gw0, (A[]){{"ta", 1, 0, 0}}, 1);
        op(p, "sum_to", PLAN_PHASE_BACKWARD, &dh, 1, gt0, (A[]){{"shape", 0, st, 1}}, 1);
    }
    int32_t gt;  // t's gradient: the sum of both uses'
    if (stages == 1) gt = act(p, "t.grad", 1, st), op(p, "add", PLAN_PHASE_BACKWARD, (int32_t[]){gt0, gt1}, 2, gt, NULL, 0);
    else gt = over_stages(p, first ? gt0 : gt1, stages);
    gt = dp_mean(p, gt, dp);
    if (first) gw0 = dp_mean(p, gw0, dp);
    if (last) gw1 = dp_mean(p, gw1, dp);
    /* optimizer: the global gradient norm, then SGD on this stage's params */
    int32_t lr = act(p, "lr", 0, NULL), norm = act(p, "grad_norm", 0, NULL), coef = act(p, NULL, 0, NULL);
    op(p, "lr_at", PLAN_PHASE_OPTIMIZER, &step, 1, lr,
       (A[]){{"lr", 0.25, 0, 0}, {"schedule", 0, 0, 0}, {"warmup", 0, 0, 0}, {"steps", 100, 0, 0}, {"min_lr", 0, 0, 0}},
       5);
    /* The norm as the optimizer pass makes it: a sumsq_parts per gradient (one part: each
     * is under OPS_SUMSQ_CHUNK elements), then sum_parts over what came before, in order. */
    int32_t sq[3] = {PLAN_NONE, PLAN_NONE, PLAN_NONE}, total = PLAN_NONE;
    const int64_t one[] = {1};
    if (first) {
        sq[0] = act(p, NULL, 1, one), sq[1] = act(p, NULL, 1, one), total = act(p, NULL, 0, NULL);
        op(p, "sumsq_parts", PLAN_PHASE_OPTIMIZER, &gw0, 1, sq[0], NULL, 0);
        op(p, "sumsq_parts", PLAN_PHASE_OPTIMIZER, &gt, 1, sq[1], NULL, 0);
        op(p, "sum_parts", PLAN_PHASE_OPTIMIZER, sq, 2, total, NULL, 0);
    }
    if (last) {
        sq[2] = act(p, NULL, 1, one);
        op(p, "sumsq_parts", PLAN_PHASE_OPTIMIZER, &gw1, 1, sq[2], NULL, 0);
        int32_t both = act(p, NULL, 0, NULL);
        if (stages == 1) op(p, "sum_parts", PLAN_PHASE_OPTIMIZER, (int32_t[]){total, sq[2]}, 2, both, NULL, 0);
        else op(p, "sum_parts", PLAN_PHASE_OPTIMIZER, &sq[2], 1, both, NULL, 0);
        total = both;
    }
    total = over_stages(p, total, stages);
    op(p, "sqrt", PLAN_PHASE_OPTIMIZER, &total, 1, norm, NULL, 0);
    op(p, "clip_coef", PLAN_PHASE_OPTIMIZER, &norm, 1, coef, (A[]){{"max_norm", 0, 0, 0}}, 1);
    if (first) sgd(p, w0, gw0, "w0.momentum_buffer", lr, coef, step);
    sgd(p, t, gt, "t.momentum_buffer", lr, coef, step);
    if (last) sgd(p, w1, gw1, "w1.momentum_buffer", lr, coef, step);
    plan_output_add(p, loss);
    if (last) plan_output_add(p, logits);
    plan_output_add(p, lr);
    plan_output_add(p, norm);
    p->tensors[loss].step_role = PLAN_SR_LOSS, p->tensors[lr].step_role = PLAN_SR_LR;
    p->tensors[norm].step_role = PLAN_SR_GRAD_NORM;
    finish(p, dp);
    return p;
}

/* The model in `stages` programs, for stages x dp ranks. */
static Plan *model(int stages, int dp)
{
    if (stages == 1) return stage_program(1, dp, 0);
    Plan *whole = plan_new();
    char err[512];
    for (int s = 0; s < stages; s++) {
        Plan *one = stage_program(stages, dp, s);
        if (plan_append_program(whole, one, err, sizeof err)) {
            printf("plan_append_program: %s\n", err);
            exit(1);
        }
        plan_free(one);
    }
    return whole;
}

static int write_plans(const char *dir)
{
    const struct { const char *file; int stages, dp; } plans[] = {{"one", 1, 1}, {"pp2", 2, 1}, {"pp2x2", 2, 2}};
    for (int i = 0; i < 3; i++) {
        char path[1024], err[512];
        snprintf(path, sizeof path, "%s/%s.plan", dir, plans[i].file);
        Plan *p = model(plans[i].stages, plans[i].dp);
        if (rt_plan_check_ops(p, err, sizeof err) || plan_write(p, path, err, sizeof err)) {
            printf("%s: %s\n", path, err);
            return 1;
        }
        plan_free(p);
    }
    return 0;
}

/* ---- running it --------------------------------------------------------------------------- */

typedef struct {
    float loss[STEPS];
    float h[BG * H];     // step 1's h: the reference's, all rows; stage 1's received, its rows
    float w[3][D * H];   // the trained w0, t, w1, where this rank holds them
} Trace;

static void copy_named(Exec *e, const char *name, float *out, size_t n)
{
    RtTensor t;
    if (!rt_exec_tensor(e, name, &t)) memcpy(out, t.data, sizeof *out * n);
}

/* STEPS steps of p (a stage's program of whole, or whole alone) on the seed's blobs. */
static void train(const Plan *p, const ExecOptions *o, Trace *tr)
{
    char err[512];
    Exec *e = rt_exec_new(p, o, err, sizeof err);
    RtData *d = e ? rt_data_open(e, NULL, RT_ORDER_SEQUENTIAL, o->seed, err, sizeof err) : NULL;
    if (!d) {
        printf("[rank %d] %s\n", me, err);
        exit(1);
    }
    memset(tr, 0, sizeof *tr);
    for (int s = 1; s <= STEPS; s++) {
        rt_data_fill(d, s);
        CHECK(rt_exec_run(e, s, RT_PHASES_ALL) == 0, "step %d failed", s);
        tr->loss[s - 1] = *(const float *)rt_exec_data(e, plan_role_tensor(p, PLAN_SR_LOSS));
        if (s == 1) copy_named(e, o->whole ? "h.recv" : "h", tr->h, (size_t)(BG / rt_exec_world(e)) * H);
    }
    copy_named(e, "w0", tr->w[0], D * H), copy_named(e, "t", tr->w[1], H), copy_named(e, "w1", tr->w[2], H * K);
    rt_data_close(d);
    rt_exec_free(e);
}

static int close_to(float a, float b, int exact) { return exact ? a == b : fabsf(a - b) <= 1e-5f * (1 + fabsf(b)); }

static void compare(const Trace *got, const Trace *want, int stage, int dpi, int dp, const char *how)
{
    int exact = dp == 1;
    for (int s = 0; s < STEPS; s++)
        CHECK(close_to(got->loss[s], want->loss[s], exact), "%s: step %d loss %.9g, one stage %.9g", how, s + 1,
              got->loss[s], want->loss[s]);
    int B = BG / dp;
    for (int i = 0; i < B * H && stage == 1; i++)  // stage 1's rows of h, as stage 0 sent them
        CHECK(got->h[i] == want->h[dpi * B * H + i], "%s: received h[%d] = %g, sent %g", how, i, got->h[i],
              want->h[dpi * B * H + i]);
    const int held[2][3] = {{1, 1, 0}, {0, 1, 1}};
    const int n[3] = {D * H, H, H * K};
    for (int w = 0; w < 3; w++)
        for (int i = 0; i < n[w] && held[stage][w]; i++)
            CHECK(close_to(got->w[w][i], want->w[w][i], exact), "%s: param %d [%d] = %.9g, one stage %.9g", how, w, i,
                  got->w[w][i], want->w[w][i]);
}

static int run(void)
{
    RtRanks rk;
    char err[512];
    if (rt_ranks_from_env(&rk, err, sizeof err) || rt_comm_init(&rk, err, sizeof err)) {
        printf("%s\n", err);
        return 1;
    }
    me = rk.rank;
    int dp = rk.world / 2, stage = rk.rank / dp, dpi = rk.rank % dp;
    if (rk.world % 2 || rt_comm_layout(2, dp, dp, err, sizeof err)) {
        printf("[rank %d] needs an even world: %s\n", me, rk.world % 2 ? "" : err);
        return 1;
    }
    Plan *ref = model(1, 1), *whole = model(2, dp), *mine = plan_extract_program(whole, stage, err, sizeof err);
    Trace want, got;
    train(ref, &(ExecOptions){.seed = 21}, &want);  // alone, on this rank: no MPI
    for (int sync = 0; sync <= 1; sync++) {
        ExecOptions o = {.seed = 21, .rank = dpi, .world = dp, .whole = whole, .stage = stage, .sync_sends = sync};
        train(mine, &o, &got);
        compare(&got, &want, stage, dpi, dp, sync ? "synchronous sends" : "standard sends");
    }
    printf("[rank %d of %d, stage %d] %s (losses %.6g .. %.6g)\n", me, rk.world, stage, fails ? "FAILED" : "ok",
           got.loss[0], got.loss[STEPS - 1]);
    plan_free(mine);
    plan_free(whole);
    plan_free(ref);
    rt_comm_finalize();
    return fails != 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "write")) return write_plans(argv[2]);
    if (argc == 2 && !strcmp(argv[1], "run")) return run();
    fprintf(stderr, "usage: pipeline write DIR | pipeline run (under mpirun -np 2 or 4)\n");
    return 2;
}
