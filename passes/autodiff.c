/* passes/autodiff.c: reverse-mode differentiation of the forward graph.
 *
 * Needs: a forward graph whose outputs[0] is the scalar loss.
 * Gives: backward nodes (phase backward) from each op's gradient rule (ir/grad.c), and
 * for every trainable param a gradient value (role grad, named "<param>.grad"). A value
 * used several times gets the sum of its uses' gradients (a tied embedding included).
 * Only values that depend on a trainable param get gradients; inputs, constants and
 * frozen params never do (the gradient still flows through a frozen param's op to the
 * trainable values before it: LoRA's adapters under a frozen base).
 *
 * For the zero-bubble schedule (zb1, pipeline stages) the backward is split in two: the
 * nodes that compute only params' gradients (a matmul's weight gradient, a bias's sum,
 * their accumulation, the cast back to the fp32 master) are phase backward_weight (W);
 * every node an input's gradient needs (the gradient flowing on to earlier blocks and
 * stages, layernorm's one node for all three) stays phase backward (B). A value is a
 * param's when it is a param or a forward op makes it from params alone (a compute-dtype
 * cast, GPT-2's transposed embedding).
 */
#include <string.h>

#include "passes.h"

typedef struct {
    Graph *g;
    int *grad;   // per value: its gradient's value id, or -1
    char *need;  // per value: depends on a param, so a gradient must reach it
    char *of_params;  // zero-bubble split (else NULL): per forward value, a param's (see the top)
} Autodiff;

/* grad[v] += d, adding a node when v already has a gradient. */
static void accumulate(Autodiff *a, int v, int d, const Node *from)
{
    if (a->grad[v] < 0) {
        a->grad[v] = d;
        return;
    }
    char err[256];
    int n = ir_node_add(a->g, OP_add, (int[]){a->grad[v], d}, 2, NULL, 0, from->block, PHASE_BACKWARD,
                        from->loc, err, sizeof err);
    FS_ASSERT(n >= 0);
    a->grad[v] = ir_out(a->g, ir_node(a->g, n), 0);
}

static void mark_needed(const Graph *g, char *need)
{
    for (int v = 0; v < g->n_values; v++) need[v] = g->values[v].role == ROLE_PARAM && !g->values[v].frozen;
    for (int n = 0; n < g->n_nodes; n++) {
        const Node *node = ir_node(g, n);
        int any = 0;
        for (int i = 0; i < node->n_in; i++) any |= need[ir_in(g, node, i)];
        /* A pipeline stage's float input: its gradient goes back to the stage before. */
        any |= node->op == OP_recv && dtype_is_float(ir_value(g, ir_out(g, node, 0))->dtype);
        for (int i = 0; i < node->n_out; i++) need[ir_out(g, node, i)] = (char)any;
    }
}

/* The nodes from `first` on (one gradient rule's, and its accumulations) that no input
 * of forward node n that is not a param's needs: phase backward_weight. */
static void split_weight_grads(Autodiff *a, const Node *n, int first)
{
    Graph *g = a->g;
    int end = g->n_nodes, *stack = arena_alloc(g->arena, sizeof(int) * (size_t)(end - first) + 1), top = 0;
    char *seen = arena_alloc(g->arena, (size_t)(end - first) + 1);  // [k - first]: an input's gradient needs it
    for (int i = 0; i < n->n_in; i++) {
        int v = ir_in(g, n, i), d = a->grad[v];
        if (a->of_params[v] || d < 0 || ir_value(g, d)->producer < first || seen[ir_value(g, d)->producer - first])
            continue;
        stack[top++] = ir_value(g, d)->producer;
        seen[stack[top - 1] - first] = 1;
        while (top) {  // what this input's gradient is made from, within the rule
            const Node *k = ir_node(g, stack[--top]);
            for (int j = 0; j < k->n_in; j++) {
                int p = ir_value(g, ir_in(g, k, j))->producer;
                if (p >= first && !seen[p - first]) seen[p - first] = 1, stack[top++] = p;
            }
        }
    }
    for (int k = first; k < end; k++)
        if (!seen[k - first]) g->nodes[k].phase = PHASE_WGRAD;
}

/* Forward values made from params alone. */
static void mark_of_params(const Graph *g, char *of)
{
    for (int v = 0; v < g->n_values; v++) of[v] = g->values[v].role == ROLE_PARAM;
    for (int n = 0; n < g->n_nodes; n++) {
        const Node *node = ir_node(g, n);
        int all = node->n_in > 0;  // params, or constants beside them (never a data input)
        for (int i = 0; i < node->n_in && all; i++) {
            const Value *x = ir_value(g, ir_in(g, node, i));
            all = of[ir_in(g, node, i)] || x->role == ROLE_CONST;
        }
        for (int i = 0; i < node->n_out; i++) of[ir_out(g, node, i)] = (char)all;
    }
}

static void backward_node(Autodiff *a, int id)
{
    Graph *g = a->g;
    GradCtx c = {.g = g, .node = id};
    Node node = *ir_node(g, id);  // a copy: rules grow the node array
    int any_dout = 0, any_need = 0;
    for (int i = 0; i < node.n_out; i++) {
        c.dout[i] = a->grad[ir_out(g, &node, i)];
        any_dout |= c.dout[i] >= 0;
    }
    for (int i = 0; i < node.n_in; i++) {
        c.need[i] = a->need[ir_in(g, &node, i)];
        c.din[i] = -1;
        any_need |= c.need[i];
    }
    if (!any_dout || !any_need) return;
    /* Rules expect the gradient of the first output; a saved output (attention's lse)
     * never gets one. */
    if (c.dout[0] < 0) return;
    int first = g->n_nodes;
    ir_op_hooks(node.op)->grad(&c);
    for (int i = 0; i < node.n_in; i++)
        if (c.need[i] && c.din[i] >= 0) accumulate(a, ir_in(g, &node, i), c.din[i], &node);
    for (int k = first; k < g->n_nodes; k++) g->nodes[k].chunk = node.chunk;  // its model chunk's backward
    if (a->of_params) split_weight_grads(a, &node, first);
}

/* Links each trainable param to its gradient, and names and roles the gradient. */
static void label_grads(Autodiff *a, int n_forward_values)
{
    Graph *g = a->g;
    for (int v = 0; v < n_forward_values; v++) {
        Value *p = &g->values[v];
        if (p->role != ROLE_PARAM) continue;
        int d = p->grad = a->grad[v];
        if (d < 0 || g->values[d].role == ROLE_GRAD) continue;
        g->values[d].role = ROLE_GRAD;
        g->values[d].name = arena_printf(g->arena, "%s.grad", p->name);
    }
}

static int add_node(Graph *g, OpKind op, const int *in, int n_in, const Attr *attrs, int n_attr, Loc loc, int chunk)
{
    char err[256];
    int n = ir_node_add(g, op, in, n_in, attrs, n_attr, -1, PHASE_BACKWARD, loc, err, sizeof err);
    if (n < 0) fprintf(stderr, "autodiff: %s\n", err);
    FS_ASSERT(n >= 0);
    g->nodes[n].chunk = chunk;
    return ir_node(g, n)->n_out ? ir_out(g, ir_node(g, n), 0) : -1;
}

/* A gradient's tag between stages: its forward value's, moved past every forward tag. */
static int back_tag(const Graph *g, const PipeLink *l) { return l->tag + g->n_stages * (g->n_chunks > 0 ? g->n_chunks : 1); }

/* A stage graph's backward starts from the gradients the next stages send back for the
 * float values this stage sent them (passes/stages.c's links), in the links' order. */
static void seed_from_links(Autodiff *a)
{
    Graph *g = a->g;
    for (int i = 0; i < g->n_links; i++) {
        PipeLink l = g->links[i];
        const Value *v = ir_value(g, l.value);
        if (!l.sends || !dtype_is_float(v->dtype)) continue;
        int64_t shape[IR_MAX_RANK];
        for (int k = 0; k < v->rank; k++) shape[k] = v->shape[k];
        Attr at[4] = {{.key = "shape", .kind = ATTR_INTS, .ints = shape, .n_list = v->rank},
                      {.key = "dtype", .kind = ATTR_INT, .i = v->dtype},
                      {.key = "peer", .kind = ATTR_INT, .i = l.peer}, {.key = "tag", .kind = ATTR_INT, .i = back_tag(g, &l)}};
        int r = add_node(g, OP_recv, NULL, 0, at, 4, v->loc, l.tag);
        g->values[r].name = v->name ? arena_printf(g->arena, "%s.grad", v->name) : NULL;
        Node from = {.block = -1, .phase = PHASE_BACKWARD, .loc = v->loc, .chunk = l.tag};
        accumulate(a, l.value, r, &from);
    }
}

/* ... and ends sending back the gradient of every float value it received (zeros where
 * none flows, so that every receive on the other side is met). */
static void send_back(Autodiff *a)
{
    Graph *g = a->g;
    for (int i = 0; i < g->n_links; i++) {
        PipeLink l = g->links[i];
        const Value *v = ir_value(g, l.value);
        if (l.sends || !dtype_is_float(v->dtype)) continue;
        int d = a->grad[l.value], chunk = g->nodes[v->producer].chunk;
        if (d < 0) {
            int64_t shape[IR_MAX_RANK];
            for (int k = 0; k < v->rank; k++) shape[k] = v->shape[k];
            Attr at[3] = {{.key = "value", .kind = ATTR_FLOAT, .f = 0},
                          {.key = "shape", .kind = ATTR_INTS, .ints = shape, .n_list = v->rank},
                          {.key = "dtype", .kind = ATTR_INT, .i = v->dtype}};
            d = add_node(g, OP_full, NULL, 0, at, 3, v->loc, chunk);
        }
        Attr at[2] = {{.key = "peer", .kind = ATTR_INT, .i = l.peer}, {.key = "tag", .kind = ATTR_INT, .i = back_tag(g, &l)}};
        add_node(g, OP_send, &d, 1, at, 2, v->loc, chunk);
    }
}

static int seed_loss(Autodiff *a, const Options *o, Diag *d)
{
    Graph *g = a->g;
    const Value *loss = ir_value(g, g->outputs[0]);
    if (loss->rank != 0 || !dtype_is_float(loss->dtype)) {
        diag_error(d, loss->loc, "the loss must be a float scalar to differentiate");
        return -1;
    }

    /* d loss / d loss = 1; with fp16 loss scaling, the scale (a copy, so a test can
     * overflow this step's gradients without touching the scale itself). With gradient
     * accumulation over M micro-batches this graph is one micro-batch's, whose loss is
     * 1/M of the step's (their mean): the seed is 1/M, times the scale (passes/pipeline.c
     * repeats the graph M times and sums the gradients). */
    char err[256];
    const Node *ln = g->values[g->outputs[0]].producer >= 0 ? ir_node(g, g->values[g->outputs[0]].producer) : NULL;
    int block = ln ? ln->block : -1;
    Loc loc = ln ? ln->loc : (Loc){0};
    int m = o->train.microbatches > 1 ? o->train.microbatches : 1;
    Attr one = {.key = "value", .kind = ATTR_FLOAT, .f = 1.0 / m};
    int seed, first = g->n_nodes;
    if (g->loss_scale >= 0 && m > 1) {
        int k = ir_node_add(g, OP_scalar, NULL, 0, &one, 1, block, PHASE_BACKWARD, loc, err, sizeof err);
        FS_ASSERT(k >= 0);
        int in[2] = {g->loss_scale, ir_out(g, ir_node(g, k), 0)};
        seed = ir_node_add(g, OP_mul, in, 2, NULL, 0, block, PHASE_BACKWARD, loc, err, sizeof err);
    } else {
        seed = g->loss_scale >= 0
                   ? ir_node_add(g, OP_copy, &g->loss_scale, 1, NULL, 0, block, PHASE_BACKWARD, loc, err, sizeof err)
                   : ir_node_add(g, OP_scalar, NULL, 0, &one, 1, block, PHASE_BACKWARD, loc, err, sizeof err);
    }
    FS_ASSERT(seed >= 0);
    for (int k = first; k < g->n_nodes && ln; k++) g->nodes[k].chunk = ln->chunk;  // the loss's model chunk
    a->grad[g->outputs[0]] = ir_out(g, ir_node(g, seed), 0);
    if (g->loss_scale >= 0) {
        g->values[a->grad[g->outputs[0]]].name = "loss_scale.seed";
        g->values[a->grad[g->outputs[0]]].step_role = SR_LOSS_SEED;
    }
    return 0;
}

int pass_autodiff(Graph *g, const Options *o, Diag *d)
{
    /* Gradients are tracked for the forward values only: nothing differentiates the
     * values the backward pass adds. */
    int n_values = g->n_values, n_forward = g->n_nodes;
    Autodiff a = {.g = g, .grad = arena_alloc(g->arena, sizeof(int) * (size_t)n_values),
                  .need = arena_alloc(g->arena, (size_t)n_values)};
    memset(a.grad, -1, sizeof(int) * (size_t)n_values);
    mark_needed(g, a.need);
    if (g->n_stages > 1 && o->train.schedule == SCHED_ZB1) {
        a.of_params = arena_alloc(g->arena, (size_t)n_values + 1);
        mark_of_params(g, a.of_params);
    }
    if (g->n_outputs && seed_loss(&a, o, d)) return -1;  // a stage before the last has only its links
    seed_from_links(&a);
    for (int n = n_forward - 1; n >= 0; n--)
        if (g->nodes[n].phase == PHASE_FORWARD) backward_node(&a, n);
    send_back(&a);
    label_grads(&a, n_values);
    return 0;
}
