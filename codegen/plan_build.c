/* codegen/plan_build.c: Graph + TrainConfig -> Plan. The one place that knows both the
 * IR's enums and the plan format's: each IR enum maps to the plan's by a switch with no
 * default, so adding a dtype, role or phase to the IR without adding it to the format
 * is a compile error (-Wswitch) here, not a silently wrong file. Ops and attribute keys
 * are stored by name, so they need no mapping at all.
 *
 * Ids are kept: tensor i is value i, op i is node i, block i is block i. The schedule
 * (streams, waits) and the memory plan (offsets, live ranges, aliases, each space's
 * arena in the program) are copied as the passes left them; without a memory plan the
 * plan has no program, and fsexec says so. With one, the plan also gets its CUDA program
 * and module (codegen_cuda), which need the offsets.
 */
#include <stdio.h>

#include "codegen.h"
#include "cuda.h"

_Static_assert(IR_MAX_RANK <= PLAN_MAX_RANK, "plan tensors must hold every IR rank");

static PlanDType map_dtype(DType t)
{
    switch (t) {
    case DT_F32: return PLAN_DT_F32;
    case DT_F16: return PLAN_DT_F16;
    case DT_BF16: return PLAN_DT_BF16;
    case DT_I32: return PLAN_DT_I32;
    case DT_COUNT: break;
    }
    FS_ASSERT(!"unknown dtype");
}

static PlanRole map_role(Role r)
{
    switch (r) {
    case ROLE_INPUT: return PLAN_ROLE_INPUT;
    case ROLE_PARAM: return PLAN_ROLE_PARAM;
    case ROLE_GRAD: return PLAN_ROLE_GRAD;
    case ROLE_ACT: return PLAN_ROLE_ACT;
    case ROLE_OPT_STATE: return PLAN_ROLE_OPT_STATE;
    case ROLE_MASTER: return PLAN_ROLE_MASTER;
    case ROLE_COMM: return PLAN_ROLE_COMM;
    case ROLE_SCRATCH: return PLAN_ROLE_SCRATCH;
    case ROLE_CONST: return PLAN_ROLE_CONST;
    case ROLE_GATHERED: return PLAN_ROLE_GATHERED;
    case ROLE_KV_CACHE: return PLAN_ROLE_KV_CACHE;
    case ROLE_PARAM16: return PLAN_ROLE_PARAM16;
    case ROLE_COUNT: break;
    }
    FS_ASSERT(!"unknown role");
}

static PlanPlace map_place(Placement p)
{
    switch (p) {
    case PLACE_DEVICE: return PLAN_PLACE_DEVICE;
    case PLACE_HOST: return PLAN_PLACE_HOST;
    case PLACE_COUNT: break;
    }
    FS_ASSERT(!"unknown placement");
}

static PlanPhase map_phase(Phase p)
{
    switch (p) {
    case PHASE_FORWARD: return PLAN_PHASE_FORWARD;
    case PHASE_BACKWARD: return PLAN_PHASE_BACKWARD;
    case PHASE_RECOMPUTE: return PLAN_PHASE_RECOMPUTE;
    case PHASE_OPTIMIZER: return PLAN_PHASE_OPTIMIZER;
    case PHASE_COMM: return PLAN_PHASE_COMM;
    case PHASE_WGRAD: return PLAN_PHASE_WGRAD;
    case PHASE_COUNT: break;
    }
    FS_ASSERT(!"unknown phase");
}

static PlanStream map_stream(Stream s)
{
    switch (s) {
    case STREAM_COMPUTE: return PLAN_STREAM_COMPUTE;
    case STREAM_COLLECTIVE: return PLAN_STREAM_COLLECTIVE;
    case STREAM_COPY: return PLAN_STREAM_COPY;
    case STREAM_COUNT: break;
    }
    FS_ASSERT(!"unknown stream");
}

static PlanStepRole map_step_role(StepRole r)
{
    switch (r) {
    case SR_NONE: return PLAN_SR_NONE;
    case SR_LOSS: return PLAN_SR_LOSS;
    case SR_LR: return PLAN_SR_LR;
    case SR_GRAD_NORM: return PLAN_SR_GRAD_NORM;
    case SR_LOSS_SCALE: return PLAN_SR_LOSS_SCALE;
    case SR_STEP: return PLAN_SR_STEP;
    case SR_OPT_STEP: return PLAN_SR_OPT_STEP;
    case SR_LOSS_SEED: return PLAN_SR_LOSS_SEED;
    case SR_RNG: return PLAN_SR_RNG;
    case SR_POS: return PLAN_SR_POS;
    case SR_COUNT: break;
    }
    FS_ASSERT(!"unknown step role");
}

static PlanInit map_init(InitKind k)
{
    switch (k) {
    case INIT_NONE: return PLAN_INIT_NONE;
    case INIT_ZEROS: return PLAN_INIT_ZEROS;
    case INIT_ONES: return PLAN_INIT_ONES;
    case INIT_NORMAL: return PLAN_INIT_NORMAL;
    case INIT_UNIFORM: return PLAN_INIT_UNIFORM;
    case INIT_FULL: return PLAN_INIT_FULL;
    case INIT_COUNT: break;
    }
    FS_ASSERT(!"unknown init");
}

/* Every training setting, under the name config_set accepts for it, in its order. */
static int add_config(Plan *p, const TrainConfig *t)
{
    enum { S, F, I };
    const struct {
        const char *key;
        int kind;
        const char *s;
        double f;
        int64_t i;
    } keys[] = {
        {"optimizer", S, optim_name(t->optimizer), 0, 0},
        {"lr", F, NULL, t->lr, 0},
        {"beta1", F, NULL, t->beta1, 0},
        {"beta2", F, NULL, t->beta2, 0},
        {"eps", F, NULL, t->eps, 0},
        {"weight_decay", F, NULL, t->weight_decay, 0},
        {"weight_decay_on", S, decay_on_name(t->decay_matrices), 0, 0},
        {"momentum", F, NULL, t->momentum, 0},
        {"clip", F, NULL, t->clip, 0},
        {"lr_schedule", S, lr_schedule_name(t->lr_schedule), 0, 0},
        {"warmup", I, NULL, 0, t->warmup},
        {"min_lr", F, NULL, t->min_lr, 0},
        {"steps", I, NULL, 0, t->steps},
        {"decay_frac", F, NULL, t->decay_frac, 0},
        {"precision", S, precision_name(t->precision), 0, 0},
        {"reduce_dtype", S, reduce_name(t->reduce_dtype), 0, 0},
        {"shard", S, shard_name(t->shard), 0, 0},
        {"reshard_after_forward", I, NULL, 0, t->reshard_after_forward},
        {"reshard_root", I, NULL, 0, t->reshard_root},
        {"shard_group", I, NULL, 0, t->shard_group},
        {"world", I, NULL, 0, t->world},
        {"recompute", S, t->recompute, 0, 0},
        {"freeze", S, t->freeze, 0, 0},
        {"stages", I, NULL, 0, t->stages},
        {"microbatches", I, NULL, 0, t->microbatches},
        {"schedule", S, sched_name(t->schedule), 0, 0},
        {"checkpoint", S, checkpoint_name(t->checkpoint), 0, 0},
        {"chunks", I, NULL, 0, t->chunks},
        {"fuse_loss", I, NULL, 0, t->fuse_loss},
        {"embed_grad_into", I, NULL, 0, t->embed_grad_into},
        {"pad_vocab", I, NULL, 0, t->pad_vocab},
        {"pack_attention", I, NULL, 0, t->pack_attention},
        {"fuse_gemm", I, NULL, 0, t->fuse_gemm},
        {"slice_views", I, NULL, 0, t->slice_views},
        {"fuse_residual", I, NULL, 0, t->fuse_residual},
        {"tf32", I, NULL, 0, t->tf32},
        {"cast_in_update", I, NULL, 0, t->cast_in_update},
        {"delayed_update", I, NULL, 0, t->delayed_update},
        {"balance", S, t->balance, 0, 0},
        {"offload", S, offload_name(t->offload), 0, 0},
        {"seed", I, NULL, 0, (int64_t)t->seed},
    };
    for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) {
        int rc = keys[k].kind == S   ? plan_meta_set_str(p, keys[k].key, keys[k].s)
                 : keys[k].kind == F ? plan_meta_set_float(p, keys[k].key, keys[k].f)
                                     : plan_meta_set_int(p, keys[k].key, keys[k].i);
        if (rc) return -1;
    }
    return 0;
}

static int add_tensor(Plan *p, const Value *v, int is_loss)
{
    PlanTensor t = {
        .name = v->name ? plan_intern(p, v->name) : PLAN_NONE,
        .dtype = map_dtype(v->dtype), .role = map_role(v->role), .place = map_place(v->place),
        .init = map_init(v->init), .rank = v->rank, .block = v->block, .producer = v->producer,
        .tied_to = v->tied_to, .init_a = v->init_a, .init_b = v->init_b, .grad = v->grad,
        .offset = v->offset, .live_start = v->live_start, .live_end = v->live_end, .alias = v->alias,
        .rank_stride = v->rank_stride, .unit = v->unit, .flat_offset = v->flat_offset, .sharded = (uint8_t)v->sharded,
        .step_role = is_loss ? PLAN_SR_LOSS : map_step_role(v->step_role), .logical_rows = v->logical_rows,
    };
    if (v->name && t.name < 0) return -1;
    for (int d = 0; d < v->rank; d++) t.shape[d] = v->shape[d];
    return plan_tensor_add(p, &t) < 0 ? -1 : 0;
}

static int add_attr(Plan *p, const Graph *g, const Attr *a)
{
    PlanAttr pa = {.key = plan_intern(p, a->key)};
    if (pa.key < 0) return -1;
    switch (a->kind) {
    case ATTR_INT:
        pa.kind = PLAN_ATTR_INT, pa.i = a->i;
        break;
    case ATTR_FLOAT:
        pa.kind = PLAN_ATTR_FLOAT, pa.f = a->f;
        break;
    case ATTR_INTS:
        pa.kind = PLAN_ATTR_INTS, pa.list = p->n_ints, pa.n_list = a->n_list;
        for (int i = 0; i < a->n_list; i++)
            if (plan_int_add(p, g->ints[a->list + i]) < 0) return -1;
        break;
    }
    return plan_attr_add(p, &pa) < 0 ? -1 : 0;
}

/* Inputs, outputs and attributes are copied into the plan's own pools, so pool entries
 * the IR abandoned (a failed shape rule) do not travel. */
static int add_op(Plan *p, const Graph *g, const Node *n)
{
    PlanOp op = {
        .op = plan_intern(p, op_name(n->op)), .block = n->block, .phase = map_phase(n->phase),
        .line = n->loc.line, .col = n->loc.col, .in = p->n_ids, .n_in = n->n_in,
        .attr = p->n_attrs, .n_attr = n->n_attr, .stream = map_stream(n->stream), .wait = p->n_waits,
        .n_wait = n->n_wait, .microbatch = n->mb >= 0 ? n->mb : PLAN_NONE, .flops = ir_op_hooks(n->op)->flops(g, n),
    };
    if (op.op < 0) return -1;
    for (int i = 0; i < n->n_in; i++)
        if (plan_id_add(p, ir_in(g, n, i)) < 0) return -1;
    op.out = p->n_ids, op.n_out = n->n_out;
    for (int i = 0; i < n->n_out; i++)
        if (plan_id_add(p, ir_out(g, n, i)) < 0) return -1;
    for (int i = 0; i < n->n_attr; i++)
        if (add_attr(p, g, &g->attrs[n->attr + i])) return -1;
    for (int i = 0; i < n->n_wait; i++)
        if (plan_wait_add(p, g->waits[n->wait + i]) < 0) return -1;
    return plan_op_add(p, &op) < 0 ? -1 : 0;
}

/* The model's dims, which a checkpoint records so that a resume into another model (a
 * head count that shapes no param) is seen; a stage graph has none (plan_of adds the
 * root's). */
static int model_dims(Plan *p, const Graph *g)
{
    return (g->dims && plan_meta_set_str(p, "dims", g->dims)) ||
           (g->batch_dim && plan_meta_set_str(p, "batch_dim", g->batch_dim));
}

static int build(Plan *p, const Graph *g, const TrainConfig *t)
{
    if (plan_meta_set_str(p, "model", g->model ? g->model : "model") ||
        plan_meta_set_str(p, "compiler", "fsc " FS_VERSION) ||
        plan_meta_set_int(p, "params", ir_param_count(g)) ||
        plan_meta_set_int(p, "frozen_params", ir_frozen_count(g)) ||
        add_config(p, t) || model_dims(p, g))
        return -1;
    for (int i = 0; i < g->n_blocks; i++)
        if (plan_block_add(p, g->blocks[i].name, g->blocks[i].layer, g->blocks[i].index) < 0) return -1;
    for (int i = 0; i < g->n_values; i++)
        if (add_tensor(p, &g->values[i], g->n_outputs && i == g->outputs[0])) return -1;
    for (int i = 0; i < g->n_nodes; i++)
        if (add_op(p, g, &g->nodes[i])) return -1;
    for (int i = 0; i < g->n_outputs; i++)
        if (plan_output_add(p, g->outputs[i]) < 0) return -1;
    /* One program: every rank of the (data-parallel) world runs every op. */
    if (g->planned && plan_set_one_program(p, t->world > 0 ? t->world : 1, g->space_bytes[PLACE_DEVICE],
                                           g->space_bytes[PLACE_HOST]))
        return -1;
    return 0;
}

/* The plan of one program: graph g, run by `t->world` data-parallel ranks; with its CUDA
 * program unless cuda is 0. */
static Plan *one_program(const Graph *g, const TrainConfig *t, int cuda, char *err, size_t errlen)
{
    Plan *p = plan_new();
    if (!p || build(p, g, t)) {
        snprintf(err, errlen, "out of memory building the plan");
        plan_free(p);
        return NULL;
    }
    char why[512];
    if (cuda && g->planned && codegen_cuda(g, p, why, sizeof why)) {
        snprintf(err, errlen, "the CUDA program: %s", why);
        plan_free(p);
        return NULL;
    }
    return p;
}

/* A pipelined graph: each stage's plan, built as one program over the stage's
 * data-parallel ranks, appended in stage order; the meta then says the whole world and
 * the whole model's params. */
static Plan *plan_of(const Graph *g, const TrainConfig *t, int cuda, char *err, size_t errlen)
{
    if (!g->n_stage_graphs) return one_program(g, t, cuda, err, errlen);
    TrainConfig st = *t;
    st.world = t->world / g->n_stage_graphs;
    Plan *p = plan_new();
    if (!p) {
        snprintf(err, errlen, "out of memory building the plan");
        return NULL;
    }
    for (int s = 0; s < g->n_stage_graphs; s++) {
        Plan *one = one_program(g->stage_graphs[s], &st, cuda, err, errlen);
        int rc = !one || plan_append_program(p, one, err, errlen);
        plan_free(one);
        if (rc) {
            plan_free(p);
            return NULL;
        }
    }
    if (plan_meta_set_int(p, "world", t->world) || plan_meta_set_int(p, "params", ir_param_count(g)) ||
        plan_meta_set_int(p, "frozen_params", ir_frozen_count(g)) || model_dims(p, g)) {
        snprintf(err, errlen, "out of memory building the plan");
        plan_free(p);
        return NULL;
    }
    /* Every send meets its receive, in an order that cannot deadlock even with
     * synchronous sends: a mismatch is this error, never a hang at run time. */
    char why[1024];
    if (p->n_programs > 1 && plan_check_p2p(p, why, sizeof why)) {
        snprintf(err, errlen, "the pipeline's sends and receives: %s", why);
        plan_free(p);
        return NULL;
    }
    return p;
}

Plan *codegen_plan(const Graph *g, const TrainConfig *t, char *err, size_t errlen)
{
    return plan_of(g, t, 1, err, errlen);
}

Plan *codegen_plan_report(const Graph *g, const TrainConfig *t, char *err, size_t errlen)
{
    return plan_of(g, t, 0, err, errlen);
}
