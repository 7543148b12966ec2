/* passes/xent.c: the fused classifier. In a training step the loss's backward seed is
 * known before the loss is, so cross_entropy and the cross_entropy_bwd that reads the
 * same logits and targets become one cross_entropy_fused: one pass over each row gives
 * the loss (the same fixed-order sum: ops.h's OPS_LOSS_BLOCKS), and the gradient of the
 * logits is written over the logits, which nothing reads after. memplan then lays the
 * gradient and the logits in one buffer (OPF_INPLACE): the logits' gradient buffer (at GPT-2
 * 124M, B=8, T=1024 in bf16: 8192 x 50257 x 2 bytes) leaves the memory plan.
 *
 * Needs: the backward and the micro-batches in their final form (autodiff, recompute,
 *        pipeline ran); the `fuse_loss` setting (on by default).
 * Gives: each (cross_entropy, cross_entropy_bwd) pair on the same logits and targets,
 *        where the logits are read by those two alone, are neither a view nor viewed,
 *        and are not an output of the step, replaced by one cross_entropy_fused where
 *        the cross_entropy was; the nodes that make its seed (the scalar 1/M, times the
 *        fp16 loss scale) move up before it, into its phase (a micro-batch's forward stays
 *        one run of nodes). The outputs keep their values' names and
 *        step roles, so every reader (the micro-batches' mean, the step's loss) is as
 *        before. A recomputed loss (a pipeline micro-batch that recomputes its stage)
 *        pairs with the backward that reads its logits.
 *
 * Forward-only programs (evaluation, sampling) never run it: their loss stays
 * cross_entropy. Every backend computes the same numbers either way (the CPU's bit for
 * bit; tests/unit/test_xent.c).
 */
#include <string.h>

#include "passes.h"

static int64_t ignore_of(const Graph *g, const Node *n) { return ir_attr_int(g, n, "ignore_index", OPS_NO_IGNORE); }

/* The cross_entropy node before node `b` that reads b's logits and targets and ignores
 * what b ignores, or -1. */
static int loss_of(const Graph *g, int b)
{
    const Node *bw = ir_node(g, b);
    for (int n = b - 1; n >= 0; n--) {
        const Node *x = ir_node(g, n);
        if (x->op == OP_cross_entropy && ir_in(g, x, 0) == ir_in(g, bw, 0) && ir_in(g, x, 1) == ir_in(g, bw, 1) &&
            ignore_of(g, x) == ignore_of(g, bw))
            return n;
    }
    return -1;
}

/* Whether the logits can be written over by node b: only n and b read them, and their
 * bytes are their own (no view, no viewer), made by a node, not an output of the step. */
static int logits_free(const Graph *g, int L, int n, int b)
{
    const Value *lv = ir_value(g, L);
    if (lv->producer < 0 || lv->role != ROLE_ACT || ir_view_parent(g, L) >= 0) return 0;
    for (int i = 0; i < g->n_outputs; i++)
        if (g->outputs[i] == L) return 0;
    for (int v = 0; v < g->n_values; v++)
        if (ir_view_parent(g, v) == L) return 0;
    for (int k = 0; k < g->n_nodes; k++)
        for (int i = 0; k != n && k != b && i < g->nodes[k].n_in; i++)
            if (ir_in(g, ir_node(g, k), i) == L) return 0;
    return 1;
}

/* Marks in `up` the nodes after n that the seed s needs (they move before the fused
 * node); 0, or -1 when one of them needs n itself. */
static int seed_nodes(const Graph *g, int s, int n, char *up)
{
    int p = ir_value(g, s)->producer;
    if (p < n) return 0;
    if (p == n) return -1;
    if (up[p]) return 0;
    up[p] = 1;
    const Node *x = ir_node(g, p);
    for (int i = 0; i < x->n_in; i++)
        if (seed_nodes(g, ir_in(g, x, i), n, up)) return -1;
    return 0;
}

/* Fuses the pair (n, b) into one node where n was; the graph renumbered. */
static void fuse(Graph *g, int n, int b, const char *up)
{
    const Node *x = ir_node(g, n), *bw = ir_node(g, b);
    int in[3] = {ir_in(g, bw, 0), ir_in(g, bw, 1), ir_in(g, bw, 2)};
    char err[256];
    Attr at[3] = {{.key = "ignore_index", .kind = ATTR_INT, .i = ignore_of(g, bw)},
                  {.key = "valid", .kind = ATTR_INT, .i = ir_attr_int(g, x, "valid", 0)},  // passes/pad_vocab.c's
                  {.key = "per_row", .kind = ATTR_INT, .i = ir_attr_int(g, bw, "per_row", 0)}};  // ir/grad.c's
    int ignores = ops_ignores(at[0].i);  // the attributes it has: ignore_index and per_row when one is set, valid
    const Attr *a = ignores ? at : &at[1];
    int f = ir_node_add(g, OP_cross_entropy_fused, in, 3, a, ignores ? 3 : 1, x->block, x->phase, x->loc, err,
                        sizeof err);
    FS_ASSERT(f >= 0);
    g->nodes[f].mb = g->nodes[n].mb, g->nodes[f].chunk = g->nodes[n].chunk;
    const Node *fn = ir_node(g, f);
    x = ir_node(g, n), bw = ir_node(g, b);
    ir_value_take_over(g, ir_out(g, x, 0), ir_out(g, fn, 0));
    ir_value_take_over(g, ir_out(g, x, 1), ir_out(g, fn, 1));
    ir_value_take_over(g, ir_out(g, bw, 0), ir_out(g, fn, 2));
    ir_inplace_bind(g, f);
    /* The buffer is the gradient's now: named after the logits, the memory report's line for it reads so. */
    Value *dv = &g->values[ir_out(g, ir_node(g, f), 2)];
    const char *ln = ir_value(g, in[0])->name;
    if (!dv->name && ln) dv->name = arena_printf(g->arena, "%s.grad", ln);

    /* Before n, the seed's nodes, the fused node, then the rest; n and b (read by
     * nothing now) last, for compact to drop. */
    int *order = arena_alloc(g->arena, sizeof(int) * (size_t)g->n_nodes);
    int k = 0;
    for (int i = 0; i < n; i++) order[k++] = i;
    for (int i = n + 1; i < f; i++)
        if (up[i]) order[k++] = i, g->nodes[i].phase = g->nodes[f].phase;
    order[k++] = f;
    for (int i = n + 1; i < f; i++)
        if (!up[i] && i != b) order[k++] = i;
    order[k++] = n, order[k++] = b;
    FS_ASSERT(k == g->n_nodes);
    ir_nodes_reorder(g, order);
    ir_graph_drop_last(g, 2);
}

/* The first pair that can fuse: its cross_entropy in *n, its backward in *b, the seed's
 * nodes to move in up; 0 when there is none. */
static int find_pair(const Graph *g, int *n, int *b, char *up)
{
    for (int k = 0; k < g->n_nodes; k++) {
        if (g->nodes[k].op != OP_cross_entropy_bwd) continue;
        int l = loss_of(g, k), L = ir_in(g, ir_node(g, k), 0);
        if (l < 0 || !logits_free(g, L, l, k)) continue;
        memset(up, 0, (size_t)g->n_nodes);
        if (seed_nodes(g, ir_in(g, ir_node(g, k), 2), l, up)) continue;
        *n = l, *b = k;
        return 1;
    }
    return 0;
}

int pass_xent(Graph *g, const Options *o, Diag *d)
{
    (void)d;
    if (!o->train.fuse_loss) return 0;
    for (int n = -1, b = -1;;) {
        char *up = arena_alloc(g->arena, (size_t)g->n_nodes + 1);  // room for the fused node
        if (!find_pair(g, &n, &b, up)) return 0;
        fuse(g, n, b, up);
    }
}
