/* passes/optimizer.c: the optimizer step, as nodes.
 *
 * Needs: the shard pass's flat units (passes/shard.c flattens every strategy's params, one
 *        rank's too): Value.grad of each unit's storage, or of this rank's shard of it.
 * Gives: a `step` input (i32 scalar, 1-based, set by the runtime before each step: the
 * schedule's clock) and `opt_step` state (the steps the optimizer took: bias correction's
 * clock, which a skipped fp16 step does not advance); the
 * global gradient norm (output "grad_norm"), the learning rate of this step (output
 * "lr", from the schedule), the clipping coefficient (torch's clip_grad_norm_), and per
 * unit its state (AdamW: exp_avg, exp_avg_sq; SGD with momentum: momentum_buffer, as
 * torch names them; zeros at the start) and one in-place update node, a launch per flat
 * unit, not per param (adamw_cast, sgd_cast where the unit keeps 16-bit params the update
 * writes as well: passes/shard.c's cast_in_update). Frozen params have no gradient, so no state and no update; a
 * no_decay unit is updated with weight_decay 0, as torch.optim.AdamW's second param group.
 */
#include "passes.h"

typedef struct {
    Graph *g;
    const TrainConfig *t;
} Opt;

static int node_out(Opt *o, OpKind op, const int *in, int n_in, const Attr *attrs, int n_attr, int block, Loc loc)
{
    char err[256];
    int n = ir_node_add(o->g, op, in, n_in, attrs, n_attr, block, PHASE_OPTIMIZER, loc, err, sizeof err);
    if (n < 0) fprintf(stderr, "optimizer: %s\n", err);
    FS_ASSERT(n >= 0);
    return ir_node(o->g, n)->n_out ? ir_out(o->g, ir_node(o->g, n), 0) : -1;
}

static void name_output(Opt *o, int v, const char *name, StepRole role)
{
    o->g->values[v].name = arena_strdup(o->g->arena, name);
    o->g->values[v].step_role = role;
    ir_output_add(o->g, v);
}

/* A zero-initialized state tensor shaped like param p, named after it (a rank's shard of
 * a flat buffer, which has no name of its own: after the buffer, "h.0.flat_param.shard"). */
static int state_like(Opt *o, int p, const char *suffix)
{
    Value s = *ir_value(o->g, p);
    const char *name = s.name;
    if (!name && s.view_of >= 0 && ir_value(o->g, s.view_of)->name)
        name = arena_printf(o->g->arena, "%s.shard", ir_value(o->g, s.view_of)->name);
    s.role = ROLE_OPT_STATE;
    s.init = INIT_ZEROS;
    s.init_a = s.init_b = 0;
    s.tied_to = s.grad = -1;
    s.name = arena_printf(o->g->arena, "%s.%s", name ? name : "state", suffix);
    return ir_value_add(o->g, &s);
}

/* The unit a gradient belongs to: its flat unit, or for an unsharded param the unit
 * shard.c would make for it (ir_param_unit). */
static int unit_key(const Opt *o, const Value *v)
{
    return v->unit >= 0 ? v->unit : ir_param_unit(o->g, v, o->t->weight_decay);
}

/* sqrt(sum over gradients of sum(grad^2)), summed in one order for every strategy: one
 * sumsq_parts per gradient the optimizer reads (after the shard pass a flat unit's: its
 * whole reduced buffer, or this rank's shard of it), in unit order, then sum_parts over
 * all their parts in that order, OPS_MAX_IN inputs at a time, each after the first
 * starting from the sum before. At world 1 every strategy holds the same flat buffers,
 * so the norm is the same bits. Where gradients are sharded over the ranks, each shard's
 * sum is one piece and the pieces add up over the world first. */
static int global_norm(Opt *o)
{
    Graph *g = o->g;
    int n_values = g->n_values, n = 0, sharded = 0;
    int *piece = arena_alloc(g->arena, sizeof(int) * (size_t)n_values + 1);
    int *key = arena_alloc(g->arena, sizeof(int) * (size_t)n_values + 1);  // per piece: its param's unit
    for (int v = 0; v < n_values; v++) {
        const Value *p = ir_value(g, v);
        if (p->role != ROLE_PARAM || p->grad < 0 || p->pipe_copy) continue;
        sharded |= ir_value(g, p->grad)->sharded;
        key[n] = unit_key(o, p);
        piece[n++] = p->grad;
    }
    for (int i = 1; i < n; i++)  // stable: value order within a unit
        for (int k = i; k > 0 && key[k - 1] > key[k]; k--) {
            int t = piece[k], u = key[k];
            piece[k] = piece[k - 1], piece[k - 1] = t;
            key[k] = key[k - 1], key[k - 1] = u;
        }
    for (int i = 0; i < n; i++)
        piece[i] = node_out(o, OP_sumsq_parts, &piece[i], 1, NULL, 0, -1, ir_value(g, piece[i])->loc);
    int total = -1;
    for (int i = 0; i < n;) {
        int in[OPS_MAX_IN], k = 0;
        if (total >= 0) in[k++] = total;
        while (k < OPS_MAX_IN && i < n) in[k++] = piece[i++];
        total = node_out(o, OP_sum_parts, in, k, NULL, 0, -1, o->t->optimizer_loc);
    }
    if (total < 0 && g->n_stages <= 1) return -1;
    if (total < 0) {  // a stage without gradients still adds its part: zero
        Attr zero = {.key = "value", .kind = ATTR_FLOAT, .f = 0};
        total = node_out(o, OP_scalar, NULL, 0, &zero, 1, -1, o->t->optimizer_loc);
    }
    if (sharded) {  // the shards of one replica: over the shard group (hybrid sharding's replicas hold the same)
        int shards = config_shard_group(o->t), hybrid = shards < o->t->world;
        Attr w[3] = {{.key = "world", .kind = ATTR_INT, .i = shards}, {.key = "avg", .kind = ATTR_INT, .i = 0},
                     {.key = "group", .kind = ATTR_INT, .i = OP_GROUP_SHARD}};
        total = node_out(o, OP_all_reduce, &total, 1, w, hybrid ? 3 : 1, -1, o->t->optimizer_loc);
    }
    /* Pipeline stages: each stage's sum, over the stages (a tied param counts once: on
     * the first stage holding it). */
    if (g->n_stages > 1) {
        Attr at[3] = {{.key = "world", .kind = ATTR_INT, .i = g->n_stages}, {.key = "avg", .kind = ATTR_INT, .i = 0},
                      {.key = "group", .kind = ATTR_INT, .i = OP_GROUP_PIPE}};
        total = node_out(o, OP_all_reduce, &total, 1, at, 3, -1, o->t->optimizer_loc);
    }
    return node_out(o, OP_sqrt, &total, 1, NULL, 0, -1, o->t->optimizer_loc);
}

/* The update of p; where the shard pass gave p 16-bit params of its own (Value.work), the
 * update writes them too: adamw_cast, sgd_cast. */
static void update(Opt *o, int p, int lr, int coef, int step)
{
    const TrainConfig *t = o->t;
    const Value *pv = ir_value(o->g, p);
    int block = pv->block, grad = pv->grad, w = pv->work;
    double wd = pv->no_decay ? 0 : t->weight_decay;  // torch's param group with weight_decay 0
    Loc loc = pv->loc;
    if (t->optimizer == OPTIM_ADAMW) {
        int m = state_like(o, p, "exp_avg"), v = state_like(o, p, "exp_avg_sq");
        Attr at[4] = {{.key = "beta1", .kind = ATTR_FLOAT, .f = t->beta1},
                      {.key = "beta2", .kind = ATTR_FLOAT, .f = t->beta2},
                      {.key = "eps", .kind = ATTR_FLOAT, .f = t->eps},
                      {.key = "weight_decay", .kind = ATTR_FLOAT, .f = wd}};
        node_out(o, w >= 0 ? OP_adamw_cast : OP_adamw, (int[]){p, grad, m, v, lr, coef, step, w}, w >= 0 ? 8 : 7, at,
                 4, block, loc);
    } else {
        /* Without momentum there is no buffer: the kernel leaves `buf` alone. */
        int buf = t->momentum > 0 ? state_like(o, p, "momentum_buffer") : grad;
        Attr at[2] = {{.key = "momentum", .kind = ATTR_FLOAT, .f = t->momentum},
                      {.key = "weight_decay", .kind = ATTR_FLOAT, .f = wd}};
        node_out(o, w >= 0 ? OP_sgd_cast : OP_sgd, (int[]){p, grad, buf, lr, coef, step, w}, w >= 0 ? 7 : 6, at, 2,
                 block, loc);
    }
}

int pass_optimizer(Graph *g, const Options *opts, Diag *d)
{
    (void)d;
    Opt o = {g, &opts->train};
    const TrainConfig *t = &opts->train;
    Loc at = t->optimizer_loc;  // the optimizer's own ops: its statement in the train block
    Value sv = {.dtype = DT_I32, .rank = 0, .role = ROLE_INPUT, .block = -1, .name = "step",
                .producer = -1, .tied_to = -1, .grad = -1};
    int step = ir_value_add(g, &sv);
    g->values[step].step_role = SR_STEP;

    Attr lat[6] = {{.key = "lr", .kind = ATTR_FLOAT, .f = t->lr},
                   {.key = "schedule", .kind = ATTR_INT, .i = t->lr_schedule},
                   {.key = "warmup", .kind = ATTR_INT, .i = t->warmup},
                   {.key = "steps", .kind = ATTR_INT, .i = t->steps},
                   {.key = "min_lr", .kind = ATTR_FLOAT, .f = t->min_lr},
                   {.key = "decay_frac", .kind = ATTR_FLOAT, .f = t->decay_frac}};
    int lr = node_out(&o, OP_lr_at, &step, 1, lat, t->lr_schedule == LR_WSD ? 6 : 5, -1, at);
    name_output(&o, lr, "lr", SR_LR);
    int norm = global_norm(&o);
    if (norm < 0) return 0;  // nothing to train
    /* With an fp16 loss scale the gradients are scaled: unscale the norm, fold 1/scale
     * into the coefficient the updates apply, and skip a step that overflowed. */
    int inv = -1;
    if (g->loss_scale >= 0) {
        int one = node_out(&o, OP_scalar, NULL, 0, &(Attr){.key = "value", .kind = ATTR_FLOAT, .f = 1.0}, 1, -1, at);
        inv = node_out(&o, OP_div, (int[]){one, g->loss_scale}, 2, NULL, 0, -1, at);
        norm = node_out(&o, OP_mul, (int[]){norm, inv}, 2, NULL, 0, -1, at);
    }
    name_output(&o, norm, "grad_norm", SR_GRAD_NORM);
    Attr cat[2] = {{.key = "max_norm", .kind = ATTR_FLOAT, .f = t->clip},
                   {.key = "skip_nonfinite", .kind = ATTR_INT, .i = g->loss_scale >= 0}};
    /* Offloaded without clipping or a loss scale, the coefficient is clip_coef's 1 for
     * every norm: a constant, so no update waits for the last gradient's norm and the
     * schedule pass can run each unit's host update during the backward. */
    int constant = t->offload != OFFLOAD_NONE && t->clip <= 0 && g->loss_scale < 0;
    Attr one = {.key = "value", .kind = ATTR_FLOAT, .f = 1.0};
    int coef = constant ? node_out(&o, OP_scalar, NULL, 0, &one, 1, -1, at)
                        : node_out(&o, OP_clip_coef, &norm, 1, cat, 2, -1, at);
    if (inv >= 0) coef = node_out(&o, OP_mul, (int[]){coef, inv}, 2, NULL, 0, -1, at);
    /* The optimizer's own step count: bias correction counts the steps it took. */
    Value cv = {.dtype = DT_I32, .rank = 0, .role = ROLE_OPT_STATE, .block = -1, .name = "opt_step", .producer = -1,
                .tied_to = -1, .init = INIT_ZEROS};
    int count = ir_value_add(g, &cv);
    g->values[count].step_role = SR_OPT_STEP;
    node_out(&o, OP_count_step, (int[]){count, coef}, 2, NULL, 0, -1, at);
    step = count;

    int n_values = g->n_values;
    for (int v = 0; v < n_values; v++)
        if (g->values[v].role == ROLE_PARAM && g->values[v].grad >= 0) update(&o, v, lr, coef, step);
    if (g->loss_scale >= 0) {
        Attr gi = {.key = "growth_interval", .kind = ATTR_INT, .i = 2000};
        node_out(&o, OP_scale_update, (int[]){norm, g->loss_scale, g->scale_good}, 3, &gi, 1, -1, at);
        ir_output_add(g, g->loss_scale);
    }
    return 0;
}
