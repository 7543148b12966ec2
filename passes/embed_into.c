/* passes/embed_into.c: an embedding's gradient added in place. A tied embedding (GPT-2's
 * wte, read by the embedding and by the LM head) gets the sum of two gradients: the head
 * GEMM's dense [V, C] one and the embedding backward's, which writes a dense [V, C] table
 * of zeros plus a few rows, then an add reads both. Here add(g, embedding_bwd(idx, dy))
 * becomes embedding_bwd_into(g, idx, dy): the rows are added into g's own buffer, in the
 * same fixed order (each element's rows in index order, on every backend), so neither the
 * dense table nor the add remains.
 *
 * Needs: the backward and the micro-batches in their final form (autodiff, recompute,
 *        pipeline ran); the `embed_grad_into` setting (on by default).
 * Gives: each add whose one side an embedding_bwd makes (read by that add alone) and
 *        whose other side g is a buffer of its own (made by a node, of the add's type,
 *        read by the add alone, no view, not an output of the step), and whose result
 *        lies in no other buffer (a micro-batch's partial sum does), replaced, where the
 *        add was, by embedding_bwd_into(g, idx, dy), which writes over g (OPF_INPLACE)
 *        and makes the value the add made (its name, role, and readers); g lies in its
 *        bytes (ir_inplace_bind), so where it is a param's gradient that the shard pass
 *        lays in a flat gradient buffer, g is made there.
 *
 * Numerics: g + (the rows' sum) becomes (g + row) + row ...: the same terms in another
 * association, so fp32 agrees to rounding; in 16 bits the sum is held in f32 and rounded
 * once, where the add rounded twice.
 */

#include "passes.h"

/* Whether value v is read by node `only` and no other, and is no output of the step. */
static int read_only_by(const Graph *g, int v, int only)
{
    for (int i = 0; i < g->n_outputs; i++)
        if (g->outputs[i] == v) return 0;
    for (int k = 0; k < g->n_nodes; k++)
        for (int i = 0; k != only && i < g->nodes[k].n_in; i++)
            if (ir_in(g, ir_node(g, k), i) == v) return 0;
    return 1;
}

/* Whether nothing lies in value v's bytes and v lies in no other's (a micro-batch's
 * partial sum inside the whole sum: passes/pipeline.c): its bytes can be acc's. */
static int no_views(const Graph *g, int v)
{
    if (ir_view_parent(g, v) >= 0) return 0;
    for (int w = 0; w < g->n_values; w++)
        if (ir_view_parent(g, w) == v) return 0;
    return 1;
}

/* Whether g can be written over by add node a: its own bytes, dead after a. */
static int free_buffer(const Graph *g, int v, int a)
{
    const Value *x = ir_value(g, v), *out = ir_value(g, ir_out(g, ir_node(g, a), 0));
    return x->producer >= 0 && x->dtype == out->dtype && ir_same_shape(x, out) && no_views(g, v) && read_only_by(g, v, a);
}

/* The add to rewrite: *a, its embedding_bwd *e and the other side *acc; 0 when none. */
static int find_add(const Graph *g, int *a, int *e, int *acc)
{
    for (int k = 0; k < g->n_nodes; k++) {
        const Node *n = ir_node(g, k);
        if (n->op != OP_add || !no_views(g, ir_out(g, n, 0))) continue;
        for (int side = 0; side < 2; side++) {
            int d = ir_in(g, n, side), x = ir_in(g, n, 1 - side), p = ir_value(g, d)->producer;
            if (p < 0 || g->nodes[p].op != OP_embedding_bwd || d == x || !read_only_by(g, d, k) || !free_buffer(g, x, k))
                continue;
            *a = k, *e = p, *acc = x;
            return 1;
        }
    }
    return 0;
}

/* embedding_bwd_into in add a's place, making a's value; a and e dropped. */
static void rewrite(Graph *g, int a, int e, int acc)
{
    const Node *an = ir_node(g, a), *en = ir_node(g, e);
    int in[3] = {acc, ir_in(g, en, 0), ir_in(g, en, 1)};
    char err[256];
    int f = ir_node_add(g, OP_embedding_bwd_into, in, 3, NULL, 0, an->block, an->phase, an->loc, err, sizeof err);
    FS_ASSERT(f >= 0);
    g->nodes[f].mb = g->nodes[a].mb, g->nodes[f].chunk = g->nodes[a].chunk;
    ir_value_take_over(g, ir_out(g, ir_node(g, a), 0), ir_out(g, ir_node(g, f), 0));
    ir_inplace_bind(g, f);

    int *order = arena_alloc(g->arena, sizeof(int) * (size_t)g->n_nodes);
    int k = 0;
    for (int i = 0; i < f; i++) {
        if (i == a) order[k++] = f;
        if (i != a && i != e) order[k++] = i;
    }
    order[k++] = a, order[k++] = e;
    FS_ASSERT(k == g->n_nodes);
    ir_nodes_reorder(g, order);
    ir_graph_drop_last(g, 2);
}

int pass_embed_into(Graph *g, const Options *o, Diag *d)
{
    (void)d;
    if (!o->train.embed_grad_into) return 0;
    for (int a = -1, e = -1, acc = -1; find_add(g, &a, &e, &acc);) rewrite(g, a, e, acc);
    return 0;
}
