/* passes/pipeline.c: micro-batches. For now only gradient accumulation: one stage,
 * `microbatches M` > 1 (stages > 1 is refused by passes.c; M == 1 leaves the graph as it
 * is, so every plan without accumulation is unchanged).
 *
 * Needs: autodiff's (and recompute's) graph of ONE micro-batch: lower split the global
 *        batch by world x M, and autodiff seeded the backward with 1/M (times the fp16
 *        loss scale), so that micro-batch's gradients are its share of the step's mean.
 * Gives: that graph unrolled M times in order fwd_0, bwd_0, fwd_1, bwd_1, ...
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
 * Each micro-batch's activations die in its backward, so memplan reuses their bytes for
 * the next: saved activations are those of one micro-batch, 1/M of the M = 1 plan's.
 * Params (and, in fsdp, their gathers: passes/shard.c) are shared by every copy.
 */
#include <string.h>

#include "passes.h"

typedef struct {
    Graph *g;
    int M;
    int n_orig;       // nodes of the one micro-batch
    int n_before;     // values before this pass
    int n_values;     // ... and the slices this pass adds (an upper bound)
    int *copy;        // [M][n_values]: micro-batch m's copy of each value (m = 0: itself)
    int *after;       // per node: the node it is emitted right after, or -1
    int *next;        // per node: the next node emitted after the same one, or -1
    int *first;       // per node: the first node emitted right after it, or -1
    int *mb_start;    // per new node: the micro-batch it opens (its slices), or -1
    int cap;          // capacity of after/next/first/mb_start
    char *drop;       // per node: removed at the end
} Pipe;

static int *copies(Pipe *p, int m) { return &p->copy[(size_t)m * (size_t)p->n_values]; }

/* v's copy in micro-batch m (values made before this pass; others are their own). */
static int in_mb(Pipe *p, int m, int v) { return v < p->n_values && copies(p, m)[v] >= 0 ? copies(p, m)[v] : v; }

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

/* Adds a node; `after` >= 0: emitted right after that node (after the ones already
 * there); else it opens micro-batch mb (-after - 1). Returns its first output. */
static int add_node(Pipe *p, OpKind op, const int *in, int n_in, const Attr *attrs, int n_attr, int block, Phase ph,
                    Loc loc, int after)
{
    char err[256];
    int n = ir_node_add(p->g, op, in, n_in, attrs, n_attr, block, ph, loc, err, sizeof err);
    if (n < 0) fprintf(stderr, "pipeline: %s\n", err);
    FS_ASSERT(n >= 0);
    grow(p);
    if (after >= 0) {
        p->after[n] = after;
        int *link = &p->first[after];
        while (*link >= 0) link = &p->next[*link];
        *link = n;
    } else {
        p->mb_start[n] = -after - 1;
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
        if (g->values[v].role == ROLE_INPUT && g->values[v].producer < 0) return g->values[v].rank ? g->values[v].shape[0] : 0;
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
        if (in->role != ROLE_INPUT || in->producer >= 0 || in->rank == 0 || in->shape[0] != batch) continue;
        in->shape[0] = batch * p->M;
        Loc loc = in->loc;
        for (int m = 0; m < p->M; m++) {
            Attr a[3] = {{.key = "axis", .kind = ATTR_INT, .i = 0},
                         {.key = "start", .kind = ATTR_INT, .i = m * batch},
                         {.key = "len", .kind = ATTR_INT, .i = batch}};
            int s = add_node(p, OP_slice, &x, 1, a, 3, -1, PHASE_FORWARD, loc, -m - 1);
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

static void clone_node(Pipe *p, int m, int n)
{
    Graph *g = p->g;
    Node node = g->nodes[n];
    int in[IR_MAX_IN];
    for (int i = 0; i < node.n_in; i++) in[i] = in_mb(p, m, ir_in(g, &node, i));
    Attr attrs[IR_MAX_PARAMS];
    for (int i = 0; i < node.n_attr; i++) {
        attrs[i] = g->attrs[node.attr + i];
        if (attrs[i].kind == ATTR_INTS) attrs[i].ints = &g->ints[attrs[i].list];
    }
    char err[256];
    int c = ir_node_add(g, node.op, in, node.n_in, attrs, node.n_attr, node.block, node.phase, node.loc, err, sizeof err);
    if (c < 0) fprintf(stderr, "pipeline: %s\n", err);
    FS_ASSERT(c >= 0);
    grow(p);
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

/* ---- the order ---------------------------------------------------------------------- */

static void emit(const Pipe *p, int n, int *order, int *k)
{
    order[(*k)++] = n;
    for (int f = p->first[n]; f >= 0; f = p->next[f]) emit(p, f, order, k);
}

static void unrolled_order(Pipe *p)
{
    Graph *g = p->g;
    int *order = arena_alloc(g->arena, sizeof(int) * (size_t)g->n_nodes + 1), k = 0;
    for (int m = 0; m < p->M; m++) {
        for (int n = p->n_orig; n < g->n_nodes; n++)
            if (p->mb_start[n] == m) emit(p, n, order, &k);
        for (int n = 0; n < p->n_orig; n++) {
            int c = n;
            if (m > 0) {  // micro-batch m's copy: the producer of a copy of one of n's outputs
                const Node *node = ir_node(g, n);
                FS_ASSERT(node->n_out > 0);
                c = ir_value(g, copies(p, m)[ir_out(g, node, 0)])->producer;
            }
            emit(p, c, order, &k);
        }
    }
    FS_ASSERT(k == g->n_nodes);
    ir_nodes_reorder(g, order);
    char *drop = arena_alloc(g->arena, (size_t)g->n_nodes + 1);
    for (int i = 0; i < g->n_nodes; i++) drop[i] = p->drop[order[i]];
    p->drop = drop;
}

int pass_pipeline(Graph *g, const Options *o, Diag *d)
{
    const TrainConfig *t = &o->train;
    if (t->stages > 1 || t->microbatches <= 1) return 0;
    /* The copy maps also cover the slices split_inputs adds, M per input at most. */
    int n_inputs = 0;
    for (int v = 0; v < g->n_values; v++) n_inputs += g->values[v].role == ROLE_INPUT;
    Pipe p = {.g = g, .M = t->microbatches, .n_orig = g->n_nodes, .n_before = g->n_values,
              .n_values = g->n_values + t->microbatches * n_inputs};
    for (int n = 0; n < p.n_orig; n++) FS_ASSERT(g->nodes[n].n_out > 0);  // every node's copy is found by its output
    p.copy = arena_alloc(g->arena, sizeof(int) * (size_t)p.M * (size_t)p.n_values + 1);
    memset(p.copy, -1, sizeof(int) * (size_t)p.M * (size_t)p.n_values);
    grow(&p);
    int64_t batch = batch_rows(g, p.n_before);
    split_inputs(&p, batch);
    for (int m = 1; m < p.M; m++)
        for (int n = 0; n < p.n_orig; n++) clone_node(&p, m, n);
    accumulate_grads(&p, o);
    for (int i = 0; i < g->n_outputs; i++) g->outputs[i] = combine_output(&p, g->outputs[i], batch, d);
    if (d->n_errors) return -1;
    unrolled_order(&p);
    ir_graph_compact(g, p.drop);
    return 0;
}
