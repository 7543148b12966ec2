/* passes/slice_view.c: slices as views. A slice keeps positions [start, start + len) of
 * one axis; where every dim before the axis is 1 long (a micro-batch's rows of an input,
 * passes/pipeline.c; `w[i]` or `pos[0:T]` of a param), those positions are one run of
 * the input's bytes, start x (the dims after the axis) elements in. Such a slice becomes
 * slice_view (OPF_VIEW): its value lies in the input's buffer at that offset
 * (Value.view_offset), memplan gives it no bytes of its own and keeps the buffer live
 * to the view's last reader, the executors skip it (no kernel, no copy), and its
 * gradient is still slice's: slice_bwd (autodiff ran; this changes no backward).
 *
 * Needs: every node, in the order the schedule keeps for compute (it moves only
 *        collectives, copies and host ops); the `slice_views` setting (on by default).
 * Gives: each slice whose input is one run of bytes as above, in its output's space,
 *        turned into slice_view, where nothing writes the input's buffer (its root)
 *        while the slice's value, or a view of it, is read: no node after the slice up to
 *        its last reader (a fused group's end, as fuse will group consecutive elementwise
 *        nodes) writes an output there or updates an input there (an optimizer step),
 *        and no collective, point-to-point op or copy writes there at all but the one that
 *        makes the buffer (the schedule moves those, so their place is not final here).
 *        A copy read after its input changed (the in-place loss gradient over the logits,
 *        a gradient summed in place) keeps its bytes.
 * Numerics: none; the same elements are read.
 */
#include "passes.h"

/* The buffer v's bytes lie in (memplan's root): views followed up. */
static int root_of(const Graph *g, int v)
{
    for (int p; (p = ir_view_parent(g, v)) >= 0;) v = p;
    return v;
}

/* Whether v is w or w lies in v's bytes through views. */
static int within(const Graph *g, int w, int v)
{
    for (; w >= 0; w = ir_view_parent(g, w))
        if (w == v) return 1;
    return 0;
}

/* The last node that reads v or a view of it (the step's end for an output), stretched
 * over the run of elementwise nodes a reader starts (its fused group reads at its end). */
static int last_use(const Graph *g, int v)
{
    for (int i = 0; i < g->n_outputs; i++)
        if (within(g, g->outputs[i], v)) return g->n_nodes;
    int last = -1;
    for (int k = 0; k < g->n_nodes; k++) {
        const Node *n = ir_node(g, k);
        int reads = 0;
        for (int i = 0; i < n->n_in && !reads; i++) reads = within(g, ir_in(g, n, i), v);
        if (!reads) continue;
        int end = k;
        while ((op_info(n->op)->flags & OPF_ELEMWISE) && end + 1 < g->n_nodes &&
               (op_info(ir_node(g, end + 1)->op)->flags & OPF_ELEMWISE))
            end++;
        if (end > last) last = end;
    }
    return last;
}

/* Whether node k writes bytes of buffer r: an output in it (a view op's lies there and
 * writes nothing), or an input it updates in place (OPF_EFFECT). */
static int writes(const Graph *g, int k, int r)
{
    const Node *n = ir_node(g, k);
    int flags = op_info(n->op)->flags;
    if (flags & OPF_VIEW) return 0;
    for (int i = 0; i < n->n_out; i++)
        if (root_of(g, ir_out(g, n, i)) == r) return 1;
    for (int i = 0; (flags & OPF_EFFECT) && !(flags & OPF_P2P) && i < n->n_in; i++)  // a send reads its input
        if (root_of(g, ir_in(g, n, i)) == r) return 1;
    return 0;
}

/* Whether buffer r stays as it is from node `from` to node `to` (see the top). */
static int unchanged(const Graph *g, int r, int from, int to)
{
    int maker = ir_value(g, r)->producer;  // after `from` where it writes over its input (OPF_INPLACE)
    for (int k = 0; k < g->n_nodes; k++) {
        if (!writes(g, k, r)) continue;
        if (k > from && k <= to) return 0;
        if (k != maker && (op_info(ir_node(g, k)->op)->flags & (OPF_COLLECTIVE | OPF_P2P | OPF_COPY))) return 0;
    }
    return 1;
}

/* Node k (a slice) as slice_view, if its positions are one run of its input's bytes that
 * nothing changes while they are read. */
static void try_view(Graph *g, int k)
{
    Node *n = &g->nodes[k];
    int x = ir_in(g, n, 0), y = ir_out(g, n, 0);
    const Value *xv = ir_value(g, x);
    int64_t axis = ir_attr_int(g, n, "axis", 0), outer = 1, inner = 1;
    if (axis < 0) axis += xv->rank;
    for (int d = 0; d < xv->rank; d++)
        if (d < axis) outer *= xv->shape[d];
        else if (d > axis) inner *= xv->shape[d];
    if (outer != 1 || xv->place != ir_value(g, y)->place || !unchanged(g, root_of(g, x), k, last_use(g, y))) return;
    n->op = OP_slice_view;
    Value *yv = &g->values[y];
    yv->view_offset = ir_attr_int(g, n, "start", 0) * inner * dtype_size(yv->dtype);
    yv->view_rank_stride = 0;
}

int pass_slice_view(Graph *g, const Options *o, Diag *d)
{
    (void)d;
    if (!o->train.slice_views) return 0;
    for (int k = 0; k < g->n_nodes; k++)
        if (g->nodes[k].op == OP_slice) try_view(g, k);
    return 0;
}
