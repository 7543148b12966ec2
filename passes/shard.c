/* passes/shard.c: data parallelism and ZeRO sharding, decided at compile time.
 *
 * Needs: autodiff's gradients; the batch inputs already hold one rank's part of the
 *        global batch (the frontend splits the batch dim by the world).
 * Gives: for `--shard` ddp, zero1, zero2 or fsdp over `world` ranks, one program that
 *        every rank runs:
 *  - The params of each unit (a block, the params outside blocks, or a pipeline stage's
 *    copies of params another stage counts in the gradient norm; each split by optimizer
 *    group, ir_param_group: decayed, not decayed, frozen) live in one flat
 *    f32 buffer, padded to a multiple of the world; each param is a view into it at its
 *    flat offset. Its storage: the whole buffer (ddp, zero1, zero2) or only this rank's
 *    contiguous shard (fsdp).
 *  - Gradients are views into a flat gradient buffer per unit, each made in place by its
 *    producer; the buffer itself is made by no kernel (OP_buffer) and only the bytes no
 *    gradient covers are zeroed (padding, unused or frozen params: zero_gaps), so they
 *    contribute zeros. It is averaged over ranks right after the unit's
 *    backward: all_reduce (ddp, zero1) or reduce_scatter to this rank's shard (zero2,
 *    fsdp).
 *  - The optimizer (next pass) updates each unit's storage from its gradient: the whole
 *    buffer (ddp) or this rank's shard (zero1, zero2, fsdp; their state is shard-sized).
 *  - zero1 and zero2 in fp32 all-gather the updated shards into the full buffer at the
 *    start of the next step; fsdp all-gathers a block's params before its forward (where
 *    the schedule pass prefetches it one block ahead), frees them after it
 *    (reshard_after_forward) and gathers them again before its backward. The params
 *    outside blocks stay gathered for the whole step, or with reshard_root are gathered
 *    for each stretch between blocks that reads them (the embedding, the head; in the
 *    backward the same) and freed after it, as ZeRO-3 does (root_runs). Under mixed
 *    precision zero1 and zero2 store the fp32 shard as fsdp does (ZeRO's sharded master)
 *    and gather the 16-bit params once a step, at their first use, keeping them to the
 *    step's end.
 *  - A frozen unit has no gradient buffer and no reduction; it is stored whole (ddp,
 *    zero1, zero2: nothing to gather, it never changes) or, under fsdp and 16-bit
 *    zero1/zero2, sharded and gathered as any other unit.
 *  - The loss is averaged over ranks, so every world size logs the global batch's loss.
 *  - In fp16 / bf16 (the precision pass made one compute copy per param, a cast, and
 *    each param's gradient is the cast back of the copy's): gradients are reduced in the
 *    compute dtype, read before their cast back, in a 16-bit flat buffer, which the
 *    optimizer reads as it is, this rank's shard of it (reduce_dtype fp32 keeps the
 *    fp32 reduction, FairScale's fp32_reduce_scatter). fsdp (and zero1 and zero2) gather the compute
 *    copy: the fp32 shard is cast, then gathered, and each param becomes a 16-bit view
 *    into the gathered buffer in place of its cast, for forward and (regathered) backward
 *    alike, as FairScale's mixed precision gathers in compute_dtype. The casts that this
 *    replaces are removed.
 *  - cast_in_update (on by default, fp16 / bf16 without offload): a unit that is updated
 *    keeps its 16-bit params between steps (work_copy: ROLE_PARAM16, Value.work of the
 *    storage), which the optimizer pass's update writes after the fp32 step, so no step
 *    casts the master: none and ddp read them as they are; zero1 and zero2 keep them
 *    whole and all-gather the part this rank's update wrote in place, at first use;
 *    fsdp's gathers send this rank's 16-bit shard. A frozen unit (no update) keeps the
 *    casts above, and so does offload here: passes/offload.c has the host's update
 *    write the 16-bit params there instead, which it sends to the device.
 *  - Hybrid sharding (shard_group S, FSDP's HYBRID_SHARD): the D data-parallel ranks are
 *    D/S replica groups of S consecutive ranks. Units are padded and split over the S
 *    ranks of a shard group (a rank's shard: its index in the group, d mod S), gathers
 *    run within it (group OP_GROUP_SHARD), and a gradient is summed within it by the
 *    reduce-scatter, then across the replicas of its shard by an all-reduce (group
 *    OP_GROUP_REPLICA) that divides by D: the average over all D ranks, once. S = D is
 *    the plan without groups; S = 1 replicates everything, which is ddp.
 * Every collective and copy is placed in the node order here; the order is the schedule.
 */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

typedef struct {
    int block;            // -1: the params outside blocks
    ParamGroup group;     // decayed, not decayed, frozen: each a unit of its own
    int tied;             // the params another pipeline stage holds too and counts in the
                          // gradient norm (Value.pipe_copy): a unit of their own, so the
                          // norm can leave out its shard whole
    int *params;          // value ids, in value order
    char *graded;         // per param: has a gradient in the flat gradient buffer
    int n_params;
    int64_t numel, padded, shard;  // elements
    int storage;          // the persistent buffer (full, or the shard for fsdp)
    int shard_view;       // the value the optimizer updates (storage, or a rank's part of it)
    int gathered;         // the full flat params the forward reads
    const int *run_of;    // per original node: its run for this unit (Shard.run_of, or root_runs')
    int n_runs;
    int *gather_in_run;   // [n_runs] fsdp: the gather each run of nodes reads, or -1
    int first_run;        // the run of the first node reading the params (gathered's)
    int *first_in_run;    // [n_runs] the first node of each run reading the params, or NONE
    int fgrad;            // the flat gradient buffer
    int grad_first, grad_last;  // node positions, INT_MAX if none
} Unit;

/* Where a new node goes: before original node `at` (after it when `after`). */
typedef struct {
    int node, at, after;
} Placed;

typedef struct {
    Graph *g;
    const TrainConfig *t;
    int world;            // the ranks a unit is split over: the shard group's S
    int dp;               // the stage's data-parallel ranks D (a multiple of world)
    DType low;            // the compute dtype (f32 in an fp32 plan)
    int reduce16;         // gradients reduced in the compute dtype
    int gather16;         // the params are gathered in the compute dtype from fp32 shards: fsdp,
                          // and zero1 and zero2 under mixed precision (ZeRO's 16-bit params)
    int cast16;           // none and ddp under mixed precision: each unit's fp32 buffer cast whole to
                          // the compute dtype, once a step, its params views into the cast
    int work16;           // cast_in_update: a unit that is updated keeps its 16-bit params between steps,
                          // written by its update (see work_copy) instead of cast from the master each step
    char *drop;           // per node: replaced by this pass, removed at its end
    Unit *units;
    int n_units;
    int n_orig;           // nodes before this pass
    int *run_of;          // per original node: its run (see mark_runs)
    int n_runs;
    Placed *placed;
    int n_placed;
} Shard;

enum { NONE = 1 << 30 };

static const char *unit_name(const Shard *s, const Unit *u)
{
    static const char *const group[GROUP_COUNT] = {"", ".no_decay", ".frozen"};
    const char *base = u->tied ? arena_printf(s->g->arena, "%s.tied", s->g->model)
                       : u->block >= 0 ? s->g->blocks[u->block].name : s->g->model;
    return u->group == GROUP_DECAY ? base : arena_printf(s->g->arena, "%s%s", base, group[u->group]);
}

static int new_value(Shard *s, const Unit *u, Role role, DType dt, int64_t numel, const char *suffix)
{
    Value v = {.dtype = dt, .rank = 1, .shape = {numel}, .role = role, .block = u->block, .producer = -1,
               .tied_to = -1, .frozen = u->group == GROUP_FROZEN, .no_decay = u->group == GROUP_NO_DECAY};
    v.name = suffix ? arena_printf(s->g->arena, "%s.%s", unit_name(s, u), suffix) : NULL;
    int id = ir_value_add(s->g, &v);
    s->g->values[id].unit = (int)(u - s->units);
    return id;
}

/* v becomes a view into `of`, offsets in elements of of's dtype. */
static void make_view(Shard *s, int v, int of, int64_t offset_elems, int64_t rank_stride_elems)
{
    Value *val = &s->g->values[v];
    int es = dtype_size(s->g->values[of].dtype);
    val->view_of = of;
    val->view_offset = offset_elems * es;
    val->view_rank_stride = rank_stride_elems * es;
}

/* The source a node of this pass is told by: the declaration of the first param of
 * block's unit (of the params outside blocks for -1), so a collective that hangs or
 * fails names a line of the model (and its block, the instance). */
static Loc unit_loc(const Shard *s, int block)
{
    for (int i = 0; i < s->n_units; i++)
        if (s->units[i].block == block && s->units[i].n_params) return ir_value(s->g, s->units[i].params[0])->loc;
    return (Loc){0};
}

/* Adds a node for the schedule to place before (or after) original node `at`. */
static int place(Shard *s, OpKind op, const int *in, int n_in, const Attr *attrs, int n_attr, int block, int at,
                 int after)
{
    char err[256];
    Phase ph = op_info(op)->flags & OPF_COLLECTIVE ? PHASE_COMM : PHASE_BACKWARD;
    int n = ir_node_add(s->g, op, in, n_in, attrs, n_attr, block, ph, unit_loc(s, block), err, sizeof err);
    if (n < 0) fprintf(stderr, "shard: %s\n", err);
    FS_ASSERT(n >= 0);
    s->placed[s->n_placed++] = (Placed){n, at, after};
    return ir_out(s->g, ir_node(s->g, n), 0);
}

/* A collective over group (OP_GROUP_DATA: the D ranks; OP_GROUP_SHARD: the shard
 * group's S; OP_GROUP_REPLICA: the D / S ranks holding the same shard). The data group
 * and, without hybrid groups, the shard group carry no group attribute: the plan of
 * today's fsdp. An average across the replicas divides by D (avg_over), as the sum it
 * completes is over all D ranks. */
static int collective(Shard *s, OpKind op, int x, int avg, int group, int block, int at, int after)
{
    if (group == OP_GROUP_SHARD && s->world == s->dp) group = OP_GROUP_DATA;
    int64_t world = group == OP_GROUP_DATA ? s->dp : group == OP_GROUP_SHARD ? s->world : s->dp / s->world;
    Attr a[4] = {{.key = "world", .kind = ATTR_INT, .i = world}};
    int n = 1;
    if (op != OP_all_gather) a[n++] = (Attr){.key = "avg", .kind = ATTR_INT, .i = avg};
    if (group != OP_GROUP_DATA) a[n++] = (Attr){.key = "group", .kind = ATTR_INT, .i = group};
    if (group == OP_GROUP_REPLICA && avg) a[n++] = (Attr){.key = "avg_over", .kind = ATTR_INT, .i = s->dp};
    return place(s, op, &x, 1, a, n, block, at, after);
}

static int cast_to(Shard *s, int x, DType to, int block, int at, int after)
{
    Attr a = {.key = "to", .kind = ATTR_INT, .i = to};
    return place(s, OP_cast, &x, 1, &a, 1, block, at, after);
}

/* fsdp's gather of a unit's params: of the fp32 storage, or of its compute copy (the
 * 16-bit shard its update writes, or a cast of the storage). */
static int gather(Shard *s, const Unit *u)
{
    int x = u->storage;
    if (s->gather16 && s->g->values[u->storage].work >= 0) {
        x = s->g->values[u->storage].work;
    } else if (s->gather16) {
        x = cast_to(s, u->storage, s->low, u->block, 0, 0);
        s->g->nodes[s->g->values[x].producer].phase = PHASE_COMM;
    }
    int v = collective(s, OP_all_gather, x, 0, OP_GROUP_SHARD, u->block, 0, 0);
    s->g->values[v].name = arena_printf(s->g->arena, "%s.gathered", unit_name(s, u));
    s->g->values[v].role = ROLE_GATHERED;
    s->g->values[v].unit = (int)(u - s->units);
    return v;
}

/* ---- units and where they are used -------------------------------------------------- */

static void collect_units(Shard *s)
{
    Graph *g = s->g;
    s->n_units = ir_unit_count(g->n_blocks);
    s->units = arena_alloc(g->arena, sizeof(Unit) * (size_t)s->n_units);
    int *unit = arena_alloc(g->arena, sizeof(int) * (size_t)g->n_values + 1);
    for (int v = 0; v < g->n_values; v++) {
        const Value *p = ir_value(g, v);
        unit[v] = p->role == ROLE_PARAM && p->tied_to < 0 ? ir_param_unit(g, p, s->t->weight_decay) : -1;
        if (unit[v] >= 0) s->units[unit[v]].n_params++;
    }
    for (int i = 0; i < s->n_units; i++) {
        Unit *u = &s->units[i];
        int base = i % (g->n_blocks + 2);
        u->block = base < g->n_blocks ? base : -1;
        u->tied = base == g->n_blocks + 1;
        u->group = (ParamGroup)(i / (g->n_blocks + 2));
        u->params = arena_alloc(g->arena, sizeof(int) * (size_t)u->n_params + 1);
        u->graded = arena_alloc(g->arena, (size_t)u->n_params + 1);
        u->n_params = 0;
        u->grad_first = NONE;
        u->grad_last = -1;
    }
    for (int v = 0; v < g->n_values; v++) {
        if (unit[v] < 0) continue;
        const Value *p = ir_value(g, v);
        FS_ASSERT(p->dtype == DT_F32 || ((s->gather16 || s->cast16) && p->dtype == s->low));
        Unit *u = &s->units[unit[v]];
        u->params[u->n_params++] = v;
        u->numel += ir_numel(p);
    }
    for (int i = 0; i < s->n_units; i++) {
        Unit *u = &s->units[i];
        u->padded = (u->numel + s->world - 1) / s->world * s->world;
        u->shard = u->padded / s->world;
    }
}

/* The gradient of param p that goes into its unit's flat gradient buffer: p's own, or
 * with reduce16 the compute-dtype gradient its cast back reads; -1 for none. */
/* Whether any param of the unit has a gradient (none in a frozen unit, or in a
 * forward-only program: evaluation, sampling). */
static int has_grads(const Graph *g, const Unit *u)
{
    for (int k = 0; k < u->n_params; k++)
        if (ir_value(g, u->params[k])->grad >= 0) return 1;
    return 0;
}

/* The compute-dtype gradient that param p's gradient is the cast back of, or -1. */
static int low_grad_of(const Shard *s, int p)
{
    int gv = ir_value(s->g, p)->grad, c = gv >= 0 ? ir_value(s->g, gv)->producer : -1;
    if (c < 0 || ir_node(s->g, c)->op != OP_cast) return -1;
    int low = ir_in(s->g, ir_node(s->g, c), 0);
    return ir_value(s->g, low)->dtype == s->low ? low : -1;
}

/* Whether the unit's gradients are reduced (and summed in its flat buffer) in the compute
 * dtype: with reduce16, where each is a cast back. The strategies that communicate
 * always have them so (passes/pipeline.c accumulates them in the compute dtype); without
 * sharding an accumulated gradient is an fp32 sum, and its unit stays fp32. */
static int unit_reduce16(const Shard *s, const Unit *u)
{
    for (int k = 0; k < u->n_params && s->reduce16; k++)
        if (ir_value(s->g, u->params[k])->grad >= 0 && low_grad_of(s, u->params[k]) < 0) {
            FS_ASSERT(s->t->shard == SHARD_NONE);
            return 0;
        }
    return s->reduce16;
}

static int flat_grad_of(const Shard *s, int p, int reduce16)
{
    return reduce16 ? low_grad_of(s, p) : ir_value(s->g, p)->grad;
}

/* Runs: the stretches of the original order in one phase class, forward or not
 * (backward, recompute). One micro-batch is a forward run and a backward run; with
 * gradient accumulation (passes/pipeline.c) the micro-batches' runs follow in turn.
 * fsdp gathers a block's params once per run that reads them (reshard_after_forward). */
static void mark_runs(Shard *s)
{
    s->run_of = arena_alloc(s->g->arena, sizeof(int) * (size_t)s->n_orig + 1);
    int k = -1, cls = -1;
    for (int n = 0; n < s->n_orig; n++) {
        int c = s->g->nodes[n].phase != PHASE_FORWARD;
        if (c != cls) k++, cls = c;
        s->run_of[n] = k;
    }
    s->n_runs = k + 1 > 0 ? k + 1 : 1;
}

/* reshard_root: the runs of a unit outside blocks are the stretches of a run between
 * blocks (a new one at each read of its params after a block's node), so its params are
 * gathered for the embedding, freed, and gathered again for the head (and likewise in the
 * backward), as ZeRO-3 gathers a module's params per use; the blocks run without them. */
static void root_runs(Shard *s, Unit *u, const int *unit_of)
{
    const Graph *g = s->g;
    int *run = arena_alloc(g->arena, sizeof(int) * (size_t)s->n_orig + 1);
    int k = -1, cls = -1, after_block = 1, me = (int)(u - s->units);
    for (int n = 0; n < s->n_orig; n++) {
        const Node *node = ir_node(g, n);
        int c = node->phase != PHASE_FORWARD, reads = 0;
        for (int i = 0; i < node->n_in && !reads; i++) reads = unit_of[ir_in(g, node, i)] == me;
        if (c != cls) after_block = 1, cls = c;
        if (reads && after_block) k++, after_block = 0;
        if (!reads && node->block >= 0) after_block = 1;
        run[n] = k < 0 ? 0 : k;
    }
    u->run_of = run;
    u->n_runs = k + 1 > 0 ? k + 1 : 1;
}

/* Whether unit u is gathered again for each later run that reads it: a block's under
 * fsdp's reshard_after_forward; the params outside blocks too with reshard_root. */
static int reshards(const Shard *s, const Unit *u)
{
    const TrainConfig *t = s->t;
    return t->shard == SHARD_FSDP && t->reshard_after_forward && (u->block >= 0 || (t->reshard_root && !u->tied));
}

/* The first node that writes any byte of value v: its producer's, or that of a value
 * inside it (a partial sum of accumulated gradients, passes/pipeline.c); NONE if none. */
static int first_writer(const Shard *s, const int *first_write, int v)
{
    int at = first_write[v];
    const Value *val = ir_value(s->g, v);
    if (val->producer >= 0 && val->producer < at) at = val->producer;
    return at;
}

/* First readers of each unit's params in each run, first and last writers of the
 * gradients its flat buffer holds; positions in the original order. */
static void find_uses(Shard *s, const int *unit_of)
{
    Graph *g = s->g;
    for (int i = 0; i < s->n_units; i++) {
        Unit *u = &s->units[i];
        u->run_of = s->run_of, u->n_runs = s->n_runs;
        if (u->block < 0 && reshards(s, u)) root_runs(s, u, unit_of);
        u->first_in_run = arena_alloc(g->arena, sizeof(int) * (size_t)u->n_runs);
        u->gather_in_run = arena_alloc(g->arena, sizeof(int) * (size_t)u->n_runs);
        for (int k = 0; k < u->n_runs; k++) u->first_in_run[k] = NONE, u->gather_in_run[k] = -1;
    }
    for (int n = 0; n < s->n_orig; n++) {
        const Node *node = ir_node(g, n);
        for (int i = 0; i < node->n_in; i++) {
            int u = unit_of[ir_in(g, node, i)];
            if (u < 0) continue;
            int *first = &s->units[u].first_in_run[s->units[u].run_of[n]];
            if (n < *first) *first = n;
        }
    }
    for (int i = 0; i < s->n_units; i++) {
        Unit *u = &s->units[i];
        u->first_run = 0;
        for (int k = u->n_runs - 1; k >= 0; k--)
            if (u->first_in_run[k] < NONE) u->first_run = k;
    }
    /* Views inside a gradient are written before it (the partial sums of accumulation):
     * its buffer, and the zeros, must come before the first of them. */
    int *first_write = arena_alloc(g->arena, sizeof(int) * (size_t)g->n_values + 1);
    for (int v = 0; v < g->n_values; v++) first_write[v] = NONE;
    for (int v = 0; v < g->n_values; v++) {
        int at = ir_value(g, v)->producer;
        for (int w = ir_value(g, v)->view_of, hops = 0; at >= 0 && w >= 0 && hops < 64;
             w = ir_value(g, w)->view_of, hops++)
            if (at < first_write[w]) first_write[w] = at;
    }
    for (int i = 0; i < s->n_units; i++) {
        Unit *u = &s->units[i];
        int reduce16 = unit_reduce16(s, u);
        for (int k = 0; k < u->n_params; k++) {
            int gv = flat_grad_of(s, u->params[k], reduce16);
            int at = gv >= 0 ? ir_value(g, gv)->producer : -1;
            if (at < 0) continue;
            int first = first_writer(s, first_write, gv);
            if (first < u->grad_first) u->grad_first = first;
            if (at > u->grad_last) u->grad_last = at;
        }
    }
}

/* ---- params: storage, views, gathers ----------------------------------------------- */

/* zero1, zero2 and fsdp in 16-bit: each param becomes its own compute copy. Every use
 * of the copy (the precision pass's cast of the param, forward and backward, and the
 * recompute pass's cast again before the backward) reads the param instead, now in the
 * compute dtype; layout_params then makes it a view into the gathered 16-bit buffer,
 * and the casts go (a recompute's cast would copy the gathered params again). */
static void params_as_compute_copies(Shard *s)
{
    Graph *g = s->g;
    int *param_of = arena_alloc(g->arena, sizeof(int) * (size_t)g->n_values + 1);
    memset(param_of, -1, sizeof(int) * (size_t)g->n_values);
    for (int n = 0; n < s->n_orig; n++) {
        const Node *node = ir_node(g, n);
        if (node->op != OP_cast || (node->phase != PHASE_FORWARD && node->phase != PHASE_RECOMPUTE)) continue;
        const Value *x = ir_value(g, ir_in(g, node, 0));
        if (x->role != ROLE_PARAM || x->tied_to >= 0) continue;
        param_of[ir_out(g, node, 0)] = ir_in(g, node, 0);
        s->drop[n] = 1;
    }
    for (int n = 0; n < s->n_orig; n++) {
        const Node *node = ir_node(g, n);
        for (int i = 0; i < node->n_in; i++) {
            int *v = &g->ids[node->in + i];
            if (param_of[*v] >= 0 && !s->drop[n]) *v = param_of[*v];
        }
    }
    for (int v = 0; v < g->n_values; v++)
        if (g->values[v].role == ROLE_PARAM && g->values[v].tied_to < 0) g->values[v].dtype = s->low;
}

/* cast_in_update: the unit's 16-bit params as state of their own (ROLE_PARAM16), kept between
 * steps, which the update writes from the fp32 master it has just updated (optimizer.c's
 * adamw_cast, sgd_cast) and the runtime makes from the master at init and load
 * (rt_exec_cast_params), so no step casts them: llm.c's update. Of `numel` elements: the
 * whole unit (none, ddp; zero1 and zero2, whose update writes this rank's part and whose
 * all-gather fills the rest in place: ZeRO-1 and -2 keep the 16-bit params whole, 2 Psi)
 * or this rank's shard (fsdp: what its gathers send, 2 Psi / N). */
static int work_copy(Shard *s, const Unit *u, int64_t numel, int sharded)
{
    int w = new_value(s, u, ROLE_PARAM16, s->low, numel, arena_printf(s->g->arena, "flat_param.%s",
                                                                      dtype_name(s->low)));
    s->g->values[w].sharded = sharded;
    return w;
}

static void layout_params(Shard *s, Unit *u, int trains)
{
    Graph *g = s->g;
    int fsdp = s->t->shard == SHARD_FSDP || s->gather16;  // the storage is this rank's fp32 shard
    int work = s->work16 && trains;
    u->storage = new_value(s, u, ROLE_PARAM, DT_F32, fsdp ? u->shard : u->padded, "flat_param");
    if (fsdp) {
        g->values[u->storage].sharded = 1;
        u->shard_view = u->storage;
    } else if (s->t->shard == SHARD_NONE || s->t->shard == SHARD_DDP || u->group == GROUP_FROZEN) {  // no gather
        u->shard_view = u->storage;
    } else {
        u->shard_view = new_value(s, u, ROLE_PARAM, DT_F32, u->shard, NULL);
        make_view(s, u->shard_view, u->storage, 0, u->shard);
        g->values[u->shard_view].sharded = 1;
    }
    if (u->tied) g->values[u->storage].pipe_copy = g->values[u->shard_view].pipe_copy = 1;
    u->gathered = u->storage;
    if (work && s->cast16) {
        int w = work_copy(s, u, u->padded, 0);  // first: a new value may move g->values
        u->gathered = g->values[u->storage].work = w;
    } else if (work && s->t->shard != SHARD_FSDP) {  // zero1, zero2: this rank's part, gathered in place
        int w = work_copy(s, u, u->padded, 0), part = new_value(s, u, ROLE_PARAM16, s->low, u->shard, NULL);
        make_view(s, part, w, 0, u->shard);
        g->values[part].sharded = 1;
        g->values[u->storage].work = part;
        u->gathered = collective(s, OP_all_gather, part, 0, OP_GROUP_SHARD, u->block, 0, 0);
        g->values[u->gathered].name = arena_printf(g->arena, "%s.gathered", unit_name(s, u));
        make_view(s, u->gathered, w, 0, 0);
    } else if (s->cast16) {  // one cast of the whole unit, where it is first read (gather_at_first_use)
        u->gathered = cast_to(s, u->storage, s->low, u->block, 0, 0);
        s->g->nodes[s->g->values[u->gathered].producer].phase = PHASE_FORWARD;
        s->g->values[u->gathered].name = arena_printf(s->g->arena, "%s.compute", unit_name(s, u));
    } else if (fsdp) {
        if (work) {
            int w = work_copy(s, u, u->shard, 1);  // first: a new value may move g->values
            g->values[u->storage].work = w;
        }
        u->gathered = gather(s, u);
    } else if (u->shard_view != u->storage) {
        /* In place: the shards all-gathered into the full buffer they belong to. */
        u->gathered = collective(s, OP_all_gather, u->shard_view, 0, OP_GROUP_SHARD, u->block, 0, 0);
        g->values[u->gathered].name = arena_printf(g->arena, "%s.gathered", unit_name(s, u));
        make_view(s, u->gathered, u->storage, 0, 0);
    }
    g->values[u->gathered].unit = (int)(u - s->units);
    int64_t at = 0;
    for (int k = 0; k < u->n_params; k++) {
        Value *p = &g->values[u->params[k]];
        make_view(s, u->params[k], u->gathered, at, 0);
        p->unit = (int)(u - s->units);
        p->flat_offset = at;
        at += ir_numel(p);
    }
}

/* fsdp, a block's params freed after each run that reads them (reshard_after_forward):
 * a gather of its own for every later run (the backward; with accumulation, each micro-
 * batch's forward and backward), whose nodes read the params through it. */
static void regather(Shard *s, Unit *u, int run)
{
    Graph *g = s->g;
    int v = u->gather_in_run[run] = gather(s, u);
    for (int k = 0; k < u->n_params; k++) {
        int p = u->params[k];
        Value copy = *ir_value(g, p);
        int p2 = ir_value_add(g, &copy);
        make_view(s, p2, v, g->values[p].flat_offset, 0);
        g->values[p2].unit = g->values[p].unit;
        g->values[p2].flat_offset = g->values[p].flat_offset;
        g->values[p2].tied_to = p;  // the same param, seen through another gather
        for (int n = 0; n < s->n_orig; n++) {
            Node *node = &g->nodes[n];
            if (u->run_of[n] != run) continue;
            for (int i = 0; i < node->n_in; i++)
                if (g->ids[node->in + i] == p) g->ids[node->in + i] = p2;
        }
    }
}

/* ---- gradients ---------------------------------------------------------------------- */

/* Whether gradient value gv can be made in place inside the flat gradient buffer: made
 * by a backward op of its own (not a view), and read by nobody (the reduction that
 * follows may average the buffer in place). */
static int own_grad(const Graph *g, int gv, const char *taken, const char *drop, int n_orig)
{
    const Value *v = ir_value(g, gv);
    if (v->producer < 0 || v->view_of >= 0 || taken[gv]) return 0;
    const Node *n = ir_node(g, v->producer);
    if (n->phase != PHASE_BACKWARD || (op_info(n->op)->flags & OPF_VIEW)) return 0;
    for (int m = 0; m < n_orig; m++)
        for (int i = 0; i < g->nodes[m].n_in && !drop[m]; i++)
            if (ir_in(g, &g->nodes[m], i) == gv) return 0;
    return 1;
}

static void name_grad(Shard *s, const Unit *u, int v, const char *name)
{
    Value *val = &s->g->values[v];
    val->role = ROLE_GRAD;
    val->unit = (int)(u - s->units);
    val->name = name;
}

/* A full of zeros over elements [from, to) of u's flat gradient buffer, before node `at`. */
static void zero_range(Shard *s, const Unit *u, int64_t from, int64_t to, int at)
{
    Graph *g = s->g;
    int64_t n = to - from;
    if (n == 0) return;
    Attr zero[3] = {{.key = "value", .kind = ATTR_FLOAT, .f = 0},
                    {.key = "shape", .kind = ATTR_INTS, .ints = &n, .n_list = 1},
                    {.key = "dtype", .kind = ATTR_INT, .i = g->values[u->fgrad].dtype}};
    int z = place(s, OP_full, NULL, 0, zero, 3, u->block, at, 0);
    make_view(s, z, u->fgrad, from, 0);
    name_grad(s, u, z, arena_printf(g->arena, "%s.flat_grad_zeros@%lld", unit_name(s, u), (long long)from));
}

/* The flat gradient buffer is made by no kernel (OP_buffer): each gradient in it is made
 * in place, all of its bytes, by its producer (an SSA value; accumulation's partial sums
 * too, each a whole view). Only the bytes no gradient covers are zeroed, as the reduction,
 * the norm and the update read them: the padding to the world's multiple and the params
 * without a gradient (frozen or unused; u->graded 0), each maximal run by one full. */
static void zero_gaps(Shard *s, const Unit *u, int at)
{
    const Graph *g = s->g;
    int64_t from = -1, end = 0;
    for (int k = 0; k < u->n_params; k++) {
        const Value *p = ir_value(g, u->params[k]);
        FS_ASSERT(p->flat_offset == end);  // contiguous: layout_params
        end += ir_numel(p);
        if (u->graded[k] && from >= 0) zero_range(s, u, from, p->flat_offset, at), from = -1;
        if (!u->graded[k] && from < 0) from = p->flat_offset;
    }
    if (from < 0) from = end;
    if (from < u->padded) zero_range(s, u, from, u->padded, at);
}

static void layout_grads(Shard *s, Unit *u, char *taken)
{
    Graph *g = s->g;
    int at = u->grad_first < NONE ? u->grad_first : s->n_orig, after = u->grad_last >= 0 ? u->grad_last : s->n_orig;
    int reduce16 = unit_reduce16(s, u);
    Attr type[2] = {{.key = "shape", .kind = ATTR_INTS, .ints = &u->padded, .n_list = 1},
                    {.key = "dtype", .kind = ATTR_INT, .i = reduce16 ? s->low : DT_F32}};
    u->fgrad = place(s, OP_buffer, NULL, 0, type, 2, u->block, at, 0);
    g->values[u->fgrad].role = ROLE_GRAD;
    g->values[u->fgrad].name = arena_printf(g->arena, "%s.flat_grad", unit_name(s, u));
    g->values[u->fgrad].unit = (int)(u - s->units);
    for (int k = 0; k < u->n_params; k++) {
        Value *p = &g->values[u->params[k]];
        int gv = flat_grad_of(s, u->params[k], reduce16);
        if (gv >= 0 && gv != p->grad) {  // reduce16: the cast back goes
            s->drop[g->values[p->grad].producer] = 1;
            g->values[gv].name = g->values[p->grad].name;
        }
        p->grad = -1;  // the optimizer updates the storage, not the param
        if (gv < 0) continue;
        u->graded[k] = 1;
        if (!own_grad(g, gv, taken, s->drop, s->n_orig)) gv = place(s, OP_copy, &gv, 1, NULL, 0, u->block, after, 1);
        taken[gv] = 1;
        make_view(s, gv, u->fgrad, g->values[u->params[k]].flat_offset, 0);
        g->values[gv].role = ROLE_GRAD;
    }
    zero_gaps(s, u, at);
}

static void reduce_grads(Shard *s, Unit *u)
{
    Graph *g = s->g;
    int after = u->grad_last >= 0 ? u->grad_last : s->n_orig, grad;
    if (s->t->shard == SHARD_NONE) {  // one rank: the summed gradient is the update's as it is
        grad = u->fgrad;
    } else if (s->t->shard == SHARD_DDP || s->t->shard == SHARD_ZERO1) {
        int r = collective(s, OP_all_reduce, u->fgrad, 1, OP_GROUP_DATA, u->block, after, 1);
        make_view(s, r, u->fgrad, 0, 0);
        grad = r;
        if (s->t->shard == SHARD_ZERO1) {
            grad = new_value(s, u, ROLE_GRAD, g->values[u->fgrad].dtype, u->shard, NULL);
            make_view(s, grad, r, 0, u->shard);
            g->values[grad].sharded = 1;
        }
    } else if (s->world == s->dp) {
        grad = collective(s, OP_reduce_scatter, u->fgrad, 1, OP_GROUP_DATA, u->block, after, 1);
        g->values[grad].sharded = 1;
    } else {  // hybrid: summed in the shard group, then across its replicas, averaged once
        int part = collective(s, OP_reduce_scatter, u->fgrad, 0, OP_GROUP_SHARD, u->block, after, 1);
        grad = collective(s, OP_all_reduce, part, 1, OP_GROUP_REPLICA, u->block, after, 1);
        make_view(s, grad, part, 0, 0);
        g->values[part].sharded = g->values[grad].sharded = 1;
        name_grad(s, u, part, arena_printf(g->arena, "%s.flat_grad_part", unit_name(s, u)));
    }
    const char *name =
        arena_printf(g->arena, "%s.flat_grad%s", unit_name(s, u), g->values[grad].sharded ? "_shard" : "");
    name_grad(s, u, grad, name);
    g->values[u->shard_view].grad = grad;
}

/* ---- the schedule --------------------------------------------------------------------- */

/* fsdp: each run's gather goes where the run first reads the unit's params; the schedule
 * pass (passes/schedule.c) then moves it earlier, to overlap compute (prefetch). */
static void gather_at_first_use(Shard *s)
{
    for (int i = 0; i < s->n_units; i++) {
        const Unit *u = &s->units[i];
        for (int run = 0; run < u->n_runs; run++) {
            int v = u->gather_in_run[run];
            if (v < 0 || s->g->values[v].producer < 0) continue;  // the update's 16-bit params: no gather
            int at = u->first_in_run[run];
            int x = ir_in(s->g, ir_node(s->g, s->g->values[v].producer), 0);  // its input: a cast to move along
            for (int k = 0; k < s->n_placed; k++) {
                int out = ir_out(s->g, ir_node(s->g, s->placed[k].node), 0);
                if (out == v || out == x) s->placed[k].at = at < NONE ? at : 0;
            }
        }
    }
}

static int by_position(const void *a, const void *b)
{
    const Placed *x = a, *y = b;
    long kx = 2L * x->at + x->after, ky = 2L * y->at + y->after;
    return kx != ky ? (kx < ky ? -1 : 1) : x->node - y->node;
}

static void schedule(Shard *s)
{
    qsort(s->placed, (size_t)s->n_placed, sizeof *s->placed, by_position);
    int *order = arena_alloc(s->g->arena, sizeof(int) * (size_t)s->g->n_nodes);
    int n = 0, k = 0;
    for (int i = 0; i <= s->n_orig; i++) {
        while (k < s->n_placed && s->placed[k].at == i && !s->placed[k].after) order[n++] = s->placed[k++].node;
        if (i < s->n_orig) order[n++] = i;
        while (k < s->n_placed && s->placed[k].at == i && s->placed[k].after) order[n++] = s->placed[k++].node;
    }
    FS_ASSERT(k == s->n_placed && n == s->g->n_nodes);
    ir_nodes_reorder(s->g, order);
    char *drop = arena_alloc(s->g->arena, (size_t)n + 1);
    for (int i = 0; i < n; i++) drop[i] = s->drop[order[i]];
    s->drop = drop;
}

/* The loss each rank computed is its part's mean; the step's loss is their mean. */
static void average_loss(Shard *s)
{
    Graph *g = s->g;
    int loss = g->outputs[0], at = ir_value(g, loss)->producer;
    int avg = collective(s, OP_all_reduce, loss, 1, OP_GROUP_DATA, -1, at >= 0 ? at : 0, 1);
    g->nodes[g->values[avg].producer].loc = g->values[loss].loc;
    g->values[avg].name = g->values[loss].name;
    g->values[loss].name = arena_printf(g->arena, "%s.local", g->values[loss].name ? g->values[loss].name : "loss");
    g->outputs[0] = avg;
}

int pass_shard(Graph *g, const Options *o, Diag *d)
{
    const TrainConfig *t = &o->train;
    if (t->shard == SHARD_NONE && t->world > 1) {
        if (g->n_stages > 1 && g->stage == 0)  // said once, not per stage
            diag_error(d, (Loc){0}, "world %d is %d pipeline stages x %d data-parallel ranks, which need a "
                       "data-parallel strategy: --shard ddp, zero1, zero2 or fsdp", t->world * g->n_stages,
                       g->n_stages, t->world);
        else if (g->n_stages <= 1)
            diag_error(d, (Loc){0}, "world %d needs a data-parallel strategy: --shard ddp, zero1, zero2 or fsdp",
                       t->world);
        return -1;
    }
    /* shard_group 1 replicates every unit on every rank: that is ddp, and compiles as it. */
    TrainConfig replicated;
    if (config_shard_group(t) == 1 && t->world > 1 && t->shard != SHARD_DDP) {
        replicated = *t;
        replicated.shard = SHARD_DDP;
        replicated.shard_group = 0;
        t = &replicated;
    }
    Shard s = {.g = g, .t = t, .world = config_shard_group(t), .dp = t->world, .n_orig = g->n_nodes};
    FS_ASSERT(s.world >= 1 && s.dp % s.world == 0);  // the frontend checked shard_group (frontend/lower.c)
    s.low = precision_dtype(t->precision);
    s.reduce16 = s.low != DT_F32 && (t->reduce_dtype != REDUCE_FP32 || t->shard == SHARD_NONE);  // none: no reduction
    s.gather16 = s.low != DT_F32 && (t->shard == SHARD_FSDP || t->shard == SHARD_ZERO1 || t->shard == SHARD_ZERO2);
    /* (offload casts each unit on the host and copies it to the device instead: passes/offload.c) */
    s.cast16 = s.low != DT_F32 && !s.gather16 && t->offload == OFFLOAD_NONE;
    s.work16 = s.low != DT_F32 && t->cast_in_update && t->offload == OFFLOAD_NONE;
    size_t most = (size_t)g->n_nodes + 8 * (size_t)ir_unit_count(g->n_blocks) + (size_t)g->n_values + 8;
    s.drop = arena_alloc(g->arena, most);
    if (s.gather16 || s.cast16) params_as_compute_copies(&s);
    collect_units(&s);
    s.placed = arena_alloc(g->arena, sizeof(Placed) * most);
    int *unit_of = arena_alloc(g->arena, sizeof(int) * (size_t)g->n_values + 1);
    memset(unit_of, -1, sizeof(int) * (size_t)g->n_values);
    for (int i = 0; i < s.n_units; i++)
        for (int k = 0; k < s.units[i].n_params; k++) unit_of[s.units[i].params[k]] = i;
    mark_runs(&s);
    find_uses(&s, unit_of);
    char *taken = arena_alloc(g->arena, (size_t)g->n_values * 2 + 64 * (size_t)s.n_units + 64);
    for (int i = 0; i < s.n_units; i++) {
        Unit *u = &s.units[i];
        if (!u->n_params) continue;
        layout_params(&s, u, has_grads(g, u));
        if (t->shard == SHARD_FSDP || s.gather16 || s.cast16) u->gather_in_run[u->first_run] = u->gathered;
        for (int k = 0; k < u->n_runs; k++)
            if (reshards(&s, u) && k != u->first_run && u->first_in_run[k] < NONE) regather(&s, u, k);
        if (!has_grads(g, u)) continue;  // frozen, or a forward-only program: no reduction, no update
        layout_grads(&s, u, taken);
        reduce_grads(&s, u);
    }
    if (t->shard == SHARD_FSDP || s.gather16 || s.cast16)
        gather_at_first_use(&s);
    // a forward-only pipeline's stages but the last have no loss; none has no ranks to average over
    if (g->n_outputs && t->shard != SHARD_NONE) average_loss(&s);
    schedule(&s);
    ir_graph_compact(g, s.drop);
    return 0;
}
