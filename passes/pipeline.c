/* passes/pipeline.c: micro-batches: gradient accumulation on one stage (`microbatches
 * M` > 1), and a pipeline stage's schedule (stages > 1: GPipe, 1F1B, interleaved 1F1B,
 * ZB-H1; unrolled_order says each). One stage with M == 1 leaves the graph as it is, so
 * every plan without micro-batches is unchanged.
 *
 * Needs: autodiff's (and recompute's) graph of ONE micro-batch: lower split the global
 *        batch by data-parallel ranks x M, and autodiff seeded the backward with 1/M
 *        (times the fp16 loss scale), so that micro-batch's gradients are its share of
 *        the step's mean. A stage graph (passes/stages.c) also has its sends, receives,
 *        model chunks (Node.chunk) and tied params.
 * Gives: that graph unrolled M times, each micro-batch's forward and backward (and, for
 *        zb1, weight gradients) as parts placed in the schedule's order; Node.mb on each:
 *  - The batched data inputs (rank >= 1, first dim the first input's: the batch) hold
 *    the rank's M micro-batches, [M * Bmb, ...], as the data loader fills them; micro-
 *    batch m reads its rows [m * Bmb, (m + 1) * Bmb) through a slice (a copy of a few
 *    index rows: the runtime's proof that token ids stay in range follows copies, not
 *    views into a data input).
 *  - Each param's gradient is summed over the micro-batches in their order, acc = g^0,
 *    acc = acc + g^1, ..., in place: every partial sum is a view of the last one, which
 *    is the param's Value.grad; the shard pass then puts each reduction after the last
 *    micro-batch (PyTorch's no_sync), and the optimizer, its clipping and the fp16
 *    overflow check run once per step on the sum. Where the shard pass reduces 16-bit
 *    gradients (fp16 / bf16 with a strategy, reduce_dtype not fp32) the sum is of those,
 *    cast back once, as the shard pass expects; otherwise of the gradients as they are.
 *  - The step's outputs: a float scalar (the loss) is the mean over micro-batches; an
 *    output with the batch as its first dim is the micro-batches' outputs concatenated
 *    in order; anything else is the last micro-batch's.
 *  - Pipeline stages: a micro-batch that FairScale Pipe's `checkpoint` names recomputes
 *    (a copy of the recompute pass's nodes for micro-batch 0); the others read their
 *    forward's values. After the last micro-batch, tied params' gradients are summed
 *    across their stages (exchange_tied) and the loss is given to every stage.
 * Each micro-batch's activations die in its backward, so memplan reuses their bytes for
 * the next: saved activations are those of the micro-batches in flight.
 * Params (and, in fsdp, their gathers: passes/shard.c) are shared by every copy, and so
 * are their 16-bit compute copies: each param is cast once a step (cast_params_once).
 */
#include <string.h>

#include "passes.h"

typedef struct {
    Graph *g;
    int M;
    int P, stage;     // the pipeline's stages, and this graph's
    int V;            // model chunks per stage (interleaved; else 1)
    const TrainConfig *t;
    int n_orig;       // nodes of the one micro-batch
    int n_before;     // values before this pass
    int n_values;     // ... and the slices this pass adds (an upper bound)
    int *copy;        // [M][n_values]: micro-batch m's copy of each value (m = 0: itself)
    int *node_copy;   // [M][n_orig]: micro-batch m's copy of each node, or -1 (m = 0: itself)
    int *tail;        // nodes emitted after every micro-batch, in order
    int n_tail, cap_tail;
    int *after;       // per node: the node it is emitted right after, or -1
    int *next;        // per node: the next node emitted after the same one, or -1
    int *first;       // per node: the first node emitted right after it, or -1
    int *mb_start;    // per new node: the micro-batch it opens (its slices), or -1
    int cap;          // capacity of after/next/first/mb_start
    char *drop;       // per node: removed at the end
} Pipe;

static int *copies(Pipe *p, int m) { return &p->copy[(size_t)m * (size_t)p->n_values]; }

/* Whether micro-batch m keeps only its stage's inputs and recomputes its forward in the
 * backward (the recompute pass made that recompute, for micro-batch 0, when any does):
 * FairScale Pipe's `checkpoint`. One stage: the recompute setting's blocks, in each. */
static int checkpointed(const Pipe *p, int m) { return p->P <= 1 || checkpoint_recomputes(p->t, m); }

/* v's copy in micro-batch m (values made before this pass; others are their own). A
 * micro-batch that does not recompute reads its forward's values where the recompute
 * copies were. */
static int in_mb(Pipe *p, int m, int v)
{
    if (v < p->n_before && !checkpointed(p, m) && p->g->values[v].recompute_of >= 0) v = p->g->values[v].recompute_of;
    return v < p->n_values && copies(p, m)[v] >= 0 ? copies(p, m)[v] : v;
}

static void grow(Pipe *p)
{
    int need = p->g->n_nodes + 1, cap = p->cap;
    if (need <= cap) return;
    int c1 = cap, c2 = cap, c3 = cap, c4 = cap, c5 = cap;
    p->after = arena_grow(p->g->arena, p->after, &c1, need, sizeof(int));
    p->next = arena_grow(p->g->arena, p->next, &c2, need, sizeof(int));
    p->first = arena_grow(p->g->arena, p->first, &c3, need, sizeof(int));
    p->mb_start = arena_grow(p->g->arena, p->mb_start, &c4, need, sizeof(int));
    p->drop = arena_grow(p->g->arena, p->drop, &c5, need, 1);
    for (int i = cap; i < c1; i++) p->after[i] = p->next[i] = p->first[i] = p->mb_start[i] = -1;
    p->cap = c1;
}

enum { TAIL = 1 << 30 };  // add_node's `after`: emitted after every micro-batch

/* Adds a node; `after` >= 0: emitted right after that node (after the ones already
 * there), in its micro-batch; TAIL: after every micro-batch; else it opens micro-batch
 * -after - 1. Returns its first output. */
static int add_node(Pipe *p, OpKind op, const int *in, int n_in, const Attr *attrs, int n_attr, int block, Phase ph,
                    Loc loc, int after)
{
    char err[256];
    int n = ir_node_add(p->g, op, in, n_in, attrs, n_attr, block, ph, loc, err, sizeof err);
    if (n < 0) fprintf(stderr, "pipeline: %s\n", err);
    FS_ASSERT(n >= 0);
    grow(p);
    if (after == TAIL) {
        p->tail = arena_grow(p->g->arena, p->tail, &p->cap_tail, p->n_tail + 1, sizeof *p->tail);
        p->tail[p->n_tail++] = n;
    } else if (after >= 0) {
        p->after[n] = after;
        p->g->nodes[n].mb = p->g->nodes[after].mb;
        p->g->nodes[n].chunk = p->g->nodes[after].chunk;
        if (ph == PHASE_BACKWARD && p->g->nodes[after].phase == PHASE_WGRAD)  // a weight gradient's sum
            p->g->nodes[n].phase = PHASE_WGRAD;
        int *link = &p->first[after];
        while (*link >= 0) link = &p->next[*link];
        *link = n;
    } else {
        p->mb_start[n] = -after - 1;
        p->g->nodes[n].mb = -after - 1;
    }
    return ir_node(p->g, n)->n_out ? ir_out(p->g, ir_node(p->g, n), 0) : -1;
}

static const char *mb_name(Pipe *p, const char *name, int m)
{
    return name ? arena_printf(p->g->arena, "%s.mb%d", name, m) : NULL;
}

/* ---- the data inputs --------------------------------------------------------------- */

/* One micro-batch's rows: the first dim of the first input (lower's batch dim); 0 when
 * that input is a scalar or there is none. */
static int64_t batch_rows(const Graph *g, int n_values)
{
    for (int v = 0; v < n_values; v++)
        if (g->values[v].role == ROLE_INPUT && g->values[v].producer < 0 && g->values[v].step_role == SR_NONE)
            return g->values[v].rank ? g->values[v].shape[0] : 0;
    return 0;
}

/* Each batched input grows to the rank's M micro-batches; every micro-batch reads its
 * rows through a slice, micro-batch 0's in place of the input in the original nodes. */
static void split_inputs(Pipe *p, int64_t batch)
{
    Graph *g = p->g;
    if (batch <= 0) return;
    for (int x = 0; x < p->n_before; x++) {
        Value *in = &g->values[x];
        if (in->role != ROLE_INPUT || in->producer >= 0 || in->step_role != SR_NONE || in->rank == 0 || in->shape[0] != batch)
            continue;
        in->shape[0] = batch * p->M;
        Loc loc = in->loc;
        int chunk = -1;  // the slices open the forward of the first model chunk that reads them
        for (int n = 0; n < p->n_orig; n++)
            for (int i = 0; i < g->nodes[n].n_in && chunk < 0; i++)
                if (ir_in(g, &g->nodes[n], i) == x) chunk = g->nodes[n].chunk;
        for (int m = 0; m < p->M; m++) {
            Attr a[3] = {{.key = "axis", .kind = ATTR_INT, .i = 0},
                         {.key = "start", .kind = ATTR_INT, .i = m * batch},
                         {.key = "len", .kind = ATTR_INT, .i = batch}};
            int s = add_node(p, OP_slice, &x, 1, a, 3, -1, PHASE_FORWARD, loc, -m - 1);
            g->nodes[g->values[s].producer].chunk = chunk < 0 ? 0 : chunk;
            g->values[s].name = mb_name(p, g->values[x].name, m);
            copies(p, m)[x] = s;
        }
        int s0 = copies(p, 0)[x];
        for (int m = 0; m < p->M; m++) copies(p, m)[s0] = copies(p, m)[x];
        for (int n = 0; n < p->n_orig; n++) {
            const Node *node = ir_node(g, n);
            for (int i = 0; i < node->n_in; i++)
                if (g->ids[node->in + i] == x) g->ids[node->in + i] = s0;
        }
    }
}

/* ---- the copies -------------------------------------------------------------------- */

/* The precision pass's compute copy of a param (a cast of it, in the forward or the
 * recompute's forward again): the same bytes in every micro-batch. */
static int param_cast(const Graph *g, const Node *n)
{
    if (n->op != OP_cast || (n->phase != PHASE_FORWARD && n->phase != PHASE_RECOMPUTE)) return 0;
    const Value *x = ir_value(g, ir_in(g, n, 0));
    return x->role == ROLE_PARAM && x->producer < 0;
}

/* Each param is cast once a step, before any micro-batch (the step's work: no micro-
 * batch of its own), and every micro-batch's forward, backward and recompute reads that
 * copy: one 16-bit copy of the weights, not one per micro-batch in flight (the model
 * state ZeRO counts, 2 bytes a param). The recompute's casts go; their readers read the
 * forward's. */
static void cast_params_once(Pipe *p)
{
    Graph *g = p->g;
    int *to = arena_alloc(g->arena, sizeof(int) * (size_t)g->n_values + 1);
    for (int v = 0; v < g->n_values; v++) to[v] = v;
    for (int n = 0; n < p->n_orig; n++) {
        Node *node = &g->nodes[n];
        if (param_cast(g, node) && node->phase == PHASE_FORWARD) node->mb = -1;  // unrolled_order puts it first
        if (!param_cast(g, node) || node->phase != PHASE_RECOMPUTE) continue;
        int v = ir_out(g, node, 0), w = ir_value(g, v)->recompute_of;
        if (w < 0) continue;
        to[v] = w;
        p->drop[n] = 1;
    }
    for (int n = 0; n < p->n_orig; n++)
        for (int i = 0; i < g->nodes[n].n_in; i++) g->ids[g->nodes[n].in + i] = to[g->ids[g->nodes[n].in + i]];
}

static void clone_node(Pipe *p, int m, int n)
{
    Graph *g = p->g;
    Node node = g->nodes[n];
    if (node.phase == PHASE_RECOMPUTE && !checkpointed(p, m)) return;
    if (param_cast(g, &node)) return;  // cast once a step (cast_params_once)
    int in[IR_MAX_IN];
    for (int i = 0; i < node.n_in; i++) in[i] = in_mb(p, m, ir_in(g, &node, i));
    Attr attrs[IR_MAX_PARAMS];
    ir_node_attrs(g, &node, attrs);
    for (int a = 0; a < node.n_attr; a++)  // an op that draws per micro-batch (dropout) learns which
        if (!strcmp(attrs[a].key, "mb")) attrs[a].i = m;
    char err[256];
    int c = ir_node_add(g, node.op, in, node.n_in, attrs, node.n_attr, node.block, node.phase, node.loc, err, sizeof err);
    if (c < 0) fprintf(stderr, "pipeline: %s\n", err);
    FS_ASSERT(c >= 0);
    grow(p);
    g->nodes[c].mb = m;
    g->nodes[c].chunk = node.chunk;
    p->node_copy[(size_t)m * (size_t)p->n_orig + (size_t)n] = c;
    for (int i = 0; i < node.n_out; i++) {
        int v = ir_out(g, &node, i), w = ir_out(g, ir_node(g, c), i);
        copies(p, m)[v] = w;
        g->values[w].role = g->values[v].role;
        g->values[w].place = g->values[v].place;
        g->values[w].name = mb_name(p, g->values[v].name, m);
    }
}

/* ---- gradients ----------------------------------------------------------------------- */

/* Whether gradient value v can hold a partial sum in place: made by an op of its own
 * (not a view of another buffer) and read by no node. */
static int own_buffer(const Graph *g, int v, const int *readers)
{
    const Value *val = ir_value(g, v);
    if (val->producer < 0 || val->view_of >= 0 || readers[v]) return 0;
    return !(op_info(ir_node(g, val->producer)->op)->flags & OPF_VIEW);
}

/* sum over m of src's copies, in micro-batch order, in place in the last sum. */
static int accumulate(Pipe *p, int src, const int *readers)
{
    Graph *g = p->g;
    int *partial = arena_alloc(g->arena, sizeof(int) * (size_t)p->M);
    const Value *s0 = ir_value(g, src);
    int acc = src;
    if (!own_buffer(g, src, readers))
        acc = add_node(p, OP_copy, &src, 1, NULL, 0, s0->block, PHASE_BACKWARD, s0->loc, s0->producer);
    partial[0] = acc;
    for (int m = 1; m < p->M; m++) {
        int gm = in_mb(p, m, src), in[2] = {acc, gm};
        const Value *vm = ir_value(g, gm);
        acc = add_node(p, OP_add, in, 2, NULL, 0, vm->block, PHASE_BACKWARD, vm->loc, vm->producer);
        partial[m] = acc;
    }
    for (int m = 0; m < p->M - 1; m++) {
        Value *v = &g->values[partial[m]];
        v->view_of = acc;
        v->view_offset = v->view_rank_stride = 0;
    }
    g->values[acc].role = ROLE_GRAD;
    return acc;
}

static void accumulate_grads(Pipe *p, const Options *o)
{
    Graph *g = p->g;
    const TrainConfig *t = &o->train;
    DType low = precision_dtype(t->precision);
    int reduce16 = t->shard != SHARD_NONE && low != DT_F32 && t->reduce_dtype != REDUCE_FP32;
    int *readers = arena_alloc(g->arena, sizeof(int) * (size_t)g->n_values + 1);
    for (int n = 0; n < g->n_nodes; n++)
        for (int i = 0; i < g->nodes[n].n_in; i++) readers[ir_in(g, &g->nodes[n], i)]++;
    for (int i = 0; i < g->n_outputs; i++) readers[g->outputs[i]]++;
    int *done = arena_alloc(g->arena, sizeof(int) * (size_t)p->n_before + 1);  // gradient -> its sum
    memset(done, -1, sizeof(int) * (size_t)p->n_before);
    for (int v = 0; v < p->n_before; v++) {
        const Value *par = ir_value(g, v);
        int gv = par->grad;
        if (par->role != ROLE_PARAM || gv < 0) continue;
        if (done[gv] >= 0) {
            g->values[v].grad = done[gv];
            continue;
        }
        const char *name = g->values[gv].name;
        const Node *c = g->values[gv].producer >= 0 ? ir_node(g, g->values[gv].producer) : NULL;
        int cast_back = reduce16 && c && c->op == OP_cast && ir_value(g, ir_in(g, c, 0))->dtype == low;
        int src = cast_back ? ir_in(g, c, 0) : gv;  // the 16-bit gradient the cast back reads
        for (int m = 0; m < p->M; m++) {
            int gm = in_mb(p, m, gv);
            if (cast_back) {  // one cast back, of the sum, in their place
                p->drop[g->values[gm].producer] = 1;
                readers[in_mb(p, m, src)]--;
            } else
                g->values[gm].name = mb_name(p, name, m);
        }
        int sum = accumulate(p, src, readers);
        if (cast_back) {
            Attr to = {.key = "to", .kind = ATTR_INT, .i = DT_F32};
            const Value *s = ir_value(g, sum);
            sum = add_node(p, OP_cast, &sum, 1, &to, 1, s->block, PHASE_BACKWARD, s->loc, s->producer);
            g->values[sum].role = ROLE_GRAD;
        }
        g->values[sum].name = name;
        g->values[v].grad = done[gv] = sum;
    }
}

/* ---- outputs ----------------------------------------------------------------------------- */

static int combine_output(Pipe *p, int v, int64_t batch, Diag *d)
{
    Graph *g = p->g;
    const Value *val = ir_value(g, v);
    int last = in_mb(p, p->M - 1, v), at = ir_value(g, last)->producer;
    if (at < 0) return v;  // an input or param: the same for every micro-batch
    const char *name = val->name;
    int out = last;
    if (val->rank == 0 && dtype_is_float(val->dtype)) {  // the loss: the mean
        int sum = v;
        for (int m = 1; m < p->M; m++) {
            int in[2] = {sum, in_mb(p, m, v)};
            sum = add_node(p, OP_add, in, 2, NULL, 0, -1, PHASE_FORWARD, val->loc, at);
        }
        Attr k = {.key = "value", .kind = ATTR_FLOAT, .f = 1.0 / p->M};
        int inv = add_node(p, OP_scalar, NULL, 0, &k, 1, -1, PHASE_FORWARD, val->loc, at);
        int in[2] = {sum, inv};
        out = add_node(p, OP_mul, in, 2, NULL, 0, -1, PHASE_FORWARD, val->loc, at);
    } else if (val->rank >= 1 && val->shape[0] == batch) {  // rows of the batch, in order
        if (p->M > IR_MAX_IN) {
            diag_error(d, val->loc, "microbatches %d: output '%s' has the batch as its first dim, and fsc joins at most "
                       "%d micro-batches' outputs", p->M, name ? name : "?", IR_MAX_IN);
            return v;
        }
        int in[IR_MAX_IN];
        for (int m = 0; m < p->M; m++) in[m] = in_mb(p, m, v);
        Attr axis = {.key = "axis", .kind = ATTR_INT, .i = 0};
        out = add_node(p, OP_concat, in, p->M, &axis, 1, val->block, PHASE_FORWARD, val->loc, at);
    }
    if (out != last) {
        for (int m = 0; m < p->M; m++) g->values[in_mb(p, m, v)].name = mb_name(p, name, m);
        g->values[out].name = name;
    }
    return out;
}

/* ---- pipeline stages: tied params and the loss ------------------------------------ */

/* Each param other stages hold too: after the last micro-batch its summed gradient goes
 * to each of them and theirs come here; every stage then adds them in stage order, so
 * every copy gets the same bytes (before any data-parallel reduction: the shard pass
 * reduces the sum). Params in name order, the same on every stage, so the k-th send
 * from one stage to another meets the other's k-th receive. */
static void exchange_tied(Pipe *p)
{
    Graph *g = p->g;
    int tag = 2 * p->P * p->V;  // past every tag of the forward and of the gradients
    for (int i = 1; i < g->n_tied; i++)  // by name: a few params, an insertion sort
        for (int k = i; k > 0 && strcmp(ir_value(g, g->tied[k - 1].value)->name, ir_value(g, g->tied[k].value)->name) > 0;
             k--) {
            TiedParam x = g->tied[k];
            g->tied[k] = g->tied[k - 1], g->tied[k - 1] = x;
        }
    for (int i = 0; i < g->n_tied; i++) {
        const TiedParam *tp = &g->tied[i];
        Value *par = &g->values[tp->value];
        const char *name = par->name;
        int own = par->grad, cast = -1;
        const Node *c = own >= 0 ? ir_node(g, ir_value(g, own)->producer) : NULL;
        if (c && c->op == OP_cast && ir_value(g, ir_in(g, c, 0))->dtype != DT_F32) {
            /* A 16-bit gradient the shard pass reduces (and casts back after): the sums
             * are of those, cast back once, as it expects. */
            cast = own;
            own = ir_in(g, c, 0);
        }
        if (own < 0) {  // no gradient reaches this copy: it adds zeros
            int64_t shape[IR_MAX_RANK];
            for (int k = 0; k < par->rank; k++) shape[k] = par->shape[k];
            Attr at[3] = {{.key = "value", .kind = ATTR_FLOAT, .f = 0},
                          {.key = "shape", .kind = ATTR_INTS, .ints = shape, .n_list = par->rank},
                          {.key = "dtype", .kind = ATTR_INT, .i = DT_F32}};
            own = add_node(p, OP_full, NULL, 0, at, 3, par->block, PHASE_BACKWARD, par->loc, TAIL);
        }
        for (int k = 0; k < tp->n_stages; k++) {
            if (tp->stages[k] == p->stage) continue;
            Attr at[2] = {{.key = "peer", .kind = ATTR_INT, .i = tp->stages[k]}, {.key = "tag", .kind = ATTR_INT, .i = tag}};
            add_node(p, OP_send, &own, 1, at, 2, par->block, PHASE_BACKWARD, par->loc, TAIL);
        }
        const Value *o = ir_value(g, own);
        int64_t shape[IR_MAX_RANK];
        for (int k = 0; k < o->rank; k++) shape[k] = o->shape[k];
        int sum = -1;
        for (int k = 0; k < tp->n_stages; k++) {
            int term = own;
            if (tp->stages[k] != p->stage) {
                Attr at[4] = {{.key = "shape", .kind = ATTR_INTS, .ints = shape, .n_list = o->rank},
                              {.key = "dtype", .kind = ATTR_INT, .i = o->dtype},
                              {.key = "peer", .kind = ATTR_INT, .i = tp->stages[k]},
                              {.key = "tag", .kind = ATTR_INT, .i = tag}};
                term = add_node(p, OP_recv, NULL, 0, at, 4, par->block, PHASE_BACKWARD, par->loc, TAIL);
                g->values[term].name = arena_printf(g->arena, "%s.grad.stage%d", name, tp->stages[k]);
            }
            sum = sum < 0 ? term : add_node(p, OP_add, (int[]){sum, term}, 2, NULL, 0, par->block, PHASE_BACKWARD,
                                            par->loc, TAIL);
        }
        if (own == par->grad) g->values[own].name = arena_printf(g->arena, "%s.grad.stage%d", name, p->stage);
        if (cast >= 0) {
            p->drop[ir_value(g, cast)->producer] = 1;
            Attr to = {.key = "to", .kind = ATTR_INT, .i = DT_F32};
            sum = add_node(p, OP_cast, &sum, 1, &to, 1, par->block, PHASE_BACKWARD, par->loc, TAIL);
        }
        g->values[sum].role = ROLE_GRAD;
        g->values[sum].name = arena_printf(g->arena, "%s.grad", name);
        g->values[tp->value].grad = sum;
    }
}

/* The loss, the last stage's, on every stage: an all-reduce over the pipeline group to
 * which the other stages add zeros (exact). */
static void loss_everywhere(Pipe *p)
{
    Graph *g = p->g;
    int last = p->stage == p->P - 1, x;
    Loc loc = last ? ir_value(g, g->outputs[0])->loc : (Loc){0};
    if (last) {
        x = g->outputs[0];
    } else {
        Attr zero = {.key = "value", .kind = ATTR_FLOAT, .f = 0};
        x = add_node(p, OP_scalar, NULL, 0, &zero, 1, -1, PHASE_FORWARD, loc, TAIL);
    }
    Attr at[3] = {{.key = "world", .kind = ATTR_INT, .i = p->P}, {.key = "avg", .kind = ATTR_INT, .i = 0},
                  {.key = "group", .kind = ATTR_INT, .i = OP_GROUP_PIPE}};
    int loss = add_node(p, OP_all_reduce, &x, 1, at, 3, -1, PHASE_COMM, loc, TAIL);
    g->values[loss].name = "loss";
    if (last) {
        g->values[x].name = "loss.stage";
        g->outputs[0] = loss;
    } else {
        ir_output_add(g, loss);
        for (int i = g->n_outputs - 1; i > 0; i--) g->outputs[i] = g->outputs[i - 1];
        g->outputs[0] = loss;
    }
}

/* ---- the order ---------------------------------------------------------------------- */

static void emit(const Pipe *p, int n, int *order, int *k)
{
    order[(*k)++] = n;
    for (int f = p->first[n]; f >= 0; f = p->next[f]) emit(p, f, order, k);
}

/* The parts of a micro-batch: its forward; its backward (and recompute); with the zero-
 * bubble schedule, its weight gradients apart (phase backward_weight). */
enum { PART_B, PART_F, PART_W };

static int part_of(const Node *n)
{
    return n->phase == PHASE_FORWARD ? PART_F : n->phase == PHASE_WGRAD ? PART_W : PART_B;
}

/* Micro-batch m's part `part` of model chunk `chunk` (-1: every chunk): a forward's input
 * slices first, then its copies of the template's nodes of that part, in order. */
static void emit_part(const Pipe *p, int m, int part, int chunk, int *order, int *k)
{
    Graph *g = p->g;
    if (part == PART_F)
        for (int n = p->n_orig; n < g->n_nodes; n++)
            if (p->mb_start[n] == m && (chunk < 0 || g->nodes[n].chunk == chunk)) emit(p, n, order, k);
    for (int n = 0; n < p->n_orig; n++) {
        if (part_of(&g->nodes[n]) != part || (chunk >= 0 && g->nodes[n].chunk != chunk) || g->nodes[n].mb < 0)
            continue;
        int c = m ? p->node_copy[(size_t)m * (size_t)p->n_orig + (size_t)n] : n;
        if (c >= 0) emit(p, c, order, k);
    }
}

/* ZB-H1 (zero-bubble, the memory of 1F1B): 1F1B's order of forwards and backwards (now
 * the inputs' gradients only), and each micro-batch's weight gradients W where they fill
 * what would be idle. The stages are run together on a clock of unit costs (F = B = W =
 * 1, ZB's own accounting): a stage takes its next forward or backward once its input
 * has arrived, unless that forward would hold P micro-batches whose W is not done (the
 * 1F1B limit of the first stage, for every stage); else a W that is due; else it waits.
 * Every stage then idles P - 1 units a step, against 1F1B's 3 (P - 1). Stage s's order
 * into part[] / mb[] (3 M of them). */
static void zb1_order(int P, int M, int s, Arena *a, int *part, int *mb)
{
    int *seq = arena_alloc(a, sizeof(int) * (size_t)P * (size_t)(2 * M) * 2 + 1);  // [P][2M][2]: 1F1B's parts
    int *pos = arena_alloc(a, sizeof(int) * (size_t)P * 5), *nf = pos + P, *nb = pos + 2 * P, *nw = pos + 3 * P,
        *busy = pos + 4 * P;
    int *f_end = arena_alloc(a, sizeof(int) * (size_t)P * (size_t)M * 2 + 1), *b_end = f_end + (size_t)P * M;
    for (int q = 0; q < P; q++) {
        int *x = &seq[(size_t)q * 4 * M], n = 0, warm = P - q - 1 < M ? P - q - 1 : M;
        for (int i = 0; i < warm; i++) x[n++] = PART_F, x[n++] = i;
        for (int i = 0; i < M - warm; i++) x[n++] = PART_F, x[n++] = warm + i, x[n++] = PART_B, x[n++] = i;
        for (int i = M - warm; i < M; i++) x[n++] = PART_B, x[n++] = i;
        for (int i = 0; i < M; i++) f_end[q * M + i] = b_end[q * M + i] = -1;
    }
    int out = 0;
    for (int t = 0; nw[s] < M; t++) {
        FS_ASSERT(t < 16 * (P + 3 * M));  // the rules always progress
        for (int q = 0; q < P; q++) {
            if (busy[q] > t || nw[q] == M) continue;
            const int *x = &seq[(size_t)q * 4 * M + (size_t)pos[q] * 2];
            int ready = 0, w_due = nw[q] < nb[q] && b_end[q * M + nw[q]] <= t;
            if (pos[q] < 2 * M && x[0] == PART_F)
                ready = (q == 0 || (f_end[(q - 1) * M + x[1]] >= 0 && f_end[(q - 1) * M + x[1]] <= t)) &&
                        nf[q] - nw[q] < P;
            else if (pos[q] < 2 * M)
                ready = f_end[q * M + x[1]] >= 0 && f_end[q * M + x[1]] <= t &&
                        (q == P - 1 || (b_end[(q + 1) * M + x[1]] >= 0 && b_end[(q + 1) * M + x[1]] <= t));
            int kind = ready ? x[0] : w_due ? PART_W : -1, m = ready ? x[1] : nw[q];
            if (kind < 0) continue;
            if (kind == PART_F) f_end[q * M + m] = t + 1, nf[q]++;
            if (kind == PART_B) b_end[q * M + m] = t + 1, nb[q]++;
            if (kind == PART_W) nw[q]++;
            else pos[q]++;
            busy[q] = t + 1;
            if (q == s) part[out] = kind, mb[out++] = m;
        }
    }
    FS_ASSERT(out == 3 * M);
}

/* Interleaved 1F1B's k-th forward (fwd) or backward part on this stage, as Megatron
 * numbers them: the micro-batches go round in groups of P, each group through the
 * stage's chunks in turn (the backward through them in reverse). */
static void emit_virtual(const Pipe *p, int k, int fwd, int *order, int *at)
{
    int P = p->P, V = p->V, local = k % (P * V) / P;
    int m = k / (P * V) * P + k % P, chunk = (fwd ? local : V - 1 - local) * P + p->stage;
    emit_part(p, m, fwd, chunk, order, at);
}

/* The schedule's order of the parts. One stage: each micro-batch's forward and backward
 * in turn. GPipe: every forward, then every backward. 1F1B (PipeDream-flush, Megatron's):
 * stage s runs min(P - s - 1, M) forwards to warm up, then alternates one forward and
 * one backward, then the remaining backwards, so it holds at most min(P - s, M)
 * micro-batches' activations. Interleaved 1F1B (Megatron's, V model chunks per stage):
 * the same over the M x V parts of emit_virtual, warming up with (P - s - 1) x 2 +
 * (V - 1) x P of them (all of them when M == P). Then what comes after every
 * micro-batch (TAIL). */
static void unrolled_order(Pipe *p)
{
    Graph *g = p->g;
    int *order = arena_alloc(g->arena, sizeof(int) * (size_t)g->n_nodes + 1), k = 0, M = p->M;
    for (int n = 0; n < p->n_orig; n++)  // the step's param casts (cast_params_once)
        if (g->nodes[n].mb < 0) emit(p, n, order, &k);
    if (p->P <= 1) {
        for (int m = 0; m < M; m++) emit_part(p, m, 1, -1, order, &k), emit_part(p, m, 0, -1, order, &k);
    } else if (p->t->schedule == SCHED_GPIPE) {
        for (int m = 0; m < M; m++) emit_part(p, m, 1, -1, order, &k);
        for (int m = 0; m < M; m++) emit_part(p, m, 0, -1, order, &k);
    } else if (p->t->schedule == SCHED_ZB1) {
        int *part = arena_alloc(g->arena, sizeof(int) * 6 * (size_t)M + 1), *mb = part + 3 * M;
        zb1_order(p->P, M, p->stage, g->arena, part, mb);
        for (int i = 0; i < 3 * M; i++) emit_part(p, mb[i], part[i], -1, order, &k);
    } else if (p->V > 1) {
        int total = M * p->V, warm = M == p->P ? total : (p->P - p->stage - 1) * 2 + (p->V - 1) * p->P;
        warm = warm < total ? warm : total;
        for (int i = 0; i < warm; i++) emit_virtual(p, i, 1, order, &k);
        for (int i = 0; i < total - warm; i++) emit_virtual(p, warm + i, 1, order, &k), emit_virtual(p, i, 0, order, &k);
        for (int i = total - warm; i < total; i++) emit_virtual(p, i, 0, order, &k);
    } else {
        int warm = p->P - p->stage - 1 < M ? p->P - p->stage - 1 : M;
        for (int m = 0; m < warm; m++) emit_part(p, m, 1, -1, order, &k);
        for (int m = 0; m < M - warm; m++) emit_part(p, warm + m, 1, -1, order, &k), emit_part(p, m, 0, -1, order, &k);
        for (int m = M - warm; m < M; m++) emit_part(p, m, 0, -1, order, &k);
    }
    for (int i = 0; i < p->n_tail; i++) emit(p, p->tail[i], order, &k);
    FS_ASSERT(k == g->n_nodes);
    ir_nodes_reorder(g, order);
    char *drop = arena_alloc(g->arena, (size_t)g->n_nodes + 1);
    for (int i = 0; i < g->n_nodes; i++) drop[i] = p->drop[order[i]];
    p->drop = drop;
}

int pass_pipeline(Graph *g, const Options *o, Diag *d)
{
    const TrainConfig *t = &o->train;
    int P = g->n_stages > 1 ? g->n_stages : 1;
    if (P <= 1 && t->microbatches <= 1) return 0;
    /* The copy maps also cover the slices split_inputs adds, M per input at most. */
    int n_inputs = 0;
    for (int v = 0; v < g->n_values; v++) n_inputs += g->values[v].role == ROLE_INPUT;
    Pipe p = {.g = g, .M = t->microbatches, .P = P, .stage = g->stage, .V = g->n_chunks > 1 ? g->n_chunks : 1, .t = t,
              .n_orig = g->n_nodes,
              .n_before = g->n_values, .n_values = g->n_values + t->microbatches * n_inputs};
    p.copy = arena_alloc(g->arena, sizeof(int) * (size_t)p.M * (size_t)p.n_values + 1);
    memset(p.copy, -1, sizeof(int) * (size_t)p.M * (size_t)p.n_values);
    p.node_copy = arena_alloc(g->arena, sizeof(int) * (size_t)p.M * (size_t)p.n_orig + 1);
    memset(p.node_copy, -1, sizeof(int) * (size_t)p.M * (size_t)p.n_orig);
    for (int n = 0; n < p.n_orig; n++) g->nodes[n].mb = 0;
    grow(&p);
    int64_t batch = batch_rows(g, p.n_before);
    split_inputs(&p, batch);
    cast_params_once(&p);
    for (int m = 1; m < p.M; m++)
        for (int n = 0; n < p.n_orig; n++) clone_node(&p, m, n);
    accumulate_grads(&p, o);
    for (int i = 0; i < g->n_outputs; i++) g->outputs[i] = combine_output(&p, g->outputs[i], batch, d);
    if (d->n_errors) return -1;
    if (P > 1) {
        exchange_tied(&p);
        loss_everywhere(&p);
    }
    unrolled_order(&p);
    ir_graph_compact(g, p.drop);
    return 0;
}
