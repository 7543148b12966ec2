/* passes/gradsum.c: the proof, on every plan, that each gradient the optimizer reads is
 * summed over all D data-parallel ranks of its stage exactly once, and averaged once.
 *
 * Needs: the shard pass's Value.grad on what the optimizer updates (a flat storage, a
 *        rank's shard view of it, or a param outside the flat units).
 * Gives: nothing but the proof; an internal error when it fails.
 *
 * For each such gradient, the buffers it goes through are found backwards: the gradient
 * itself, and across every reduction that made it (all_reduce, reduce_scatter) or copy
 * that moved it, that op's input, each buffer taken at its root (views in place: ddp's all-reduce
 * averages the flat gradient in place). Every reduction of the stage that reads one of
 * those buffers is one sum the gradient goes through, over its group: the stage's D
 * ranks (group 0), or hybrid sharding's shard group of S and replica group of D / S. A
 * sum over disjoint groups whose sizes multiply to D, each group once, covers every rank
 * once: group 0 alone, or the shard group then the replica group (their ranks cross:
 * shard index x replica index is the data-parallel index). A missing reduction leaves
 * a product below D; a doubled one repeats a group. Exactly one of them averages, by D
 * (its `avg_over`, else its world). The pipeline group (a tied param's sum between
 * stages) adds the stages' own parts, not ranks of this one, and is left out.
 *
 * It runs right after shard, in the pass list, so every plan fsc writes has passed it;
 * later passes move gradients (offload) but do not reduce them.
 */
#include <string.h>

#include "passes.h"

enum { MAX_HOPS = 64 };

static int reduces(OpKind op) { return op == OP_all_reduce || op == OP_reduce_scatter; }

/* What moves a gradient's bytes unchanged: a copy, or offload's between the spaces. */
static int moves(OpKind op) { return op == OP_copy || (op_info(op)->flags & OPF_COPY); }

static int root_of(const Graph *g, int v)
{
    for (int hops = 0; ir_value(g, v)->view_of >= 0 && hops < MAX_HOPS; hops++) v = ir_value(g, v)->view_of;
    return v;
}

/* The roots of the buffers gradient gv goes through, in bufs (at most MAX_HOPS). */
static int buffers_of(const Graph *g, int gv, int *bufs)
{
    int n = 0;
    for (int v = gv, hops = 0; v >= 0 && hops < MAX_HOPS; hops++) {
        int r = root_of(g, v), seen = 0;
        for (int i = 0; i < n; i++) seen |= bufs[i] == r;
        if (!seen) bufs[n++] = r;
        const Value *val = ir_value(g, v);
        OpKind op = val->producer >= 0 ? ir_node(g, val->producer)->op : OP_COUNT;
        if (val->producer >= 0 && (reduces(op) || moves(op))) v = ir_in(g, ir_node(g, val->producer), 0);
        else if (val->producer < 0 && val->view_of >= 0) v = val->view_of;  // zero1's shard of the reduced whole
        else v = -1;
    }
    return n;
}

static const char *group_name(int64_t group)
{
    return group == OP_GROUP_SHARD ? "shard group" : group == OP_GROUP_REPLICA ? "replica group" : "data-parallel group";
}

/* The reductions of value p's gradient over the D ranks of the stage: 0, or an internal
 * error naming the gradient and what it found. */
static int check_grad(const Graph *g, int p, int64_t D, Diag *d)
{
    const Value *param = ir_value(g, p);
    int bufs[MAX_HOPS], n_bufs = buffers_of(g, param->grad, bufs);
    int64_t ranks = 1, averages = 0, divisor = 0;
    int used[OP_GROUP_COUNT] = {0}, repeated = -1;
    char found[256] = "";
    for (int k = 0; k < g->n_nodes; k++) {
        const Node *n = ir_node(g, k);
        if (!reduces(n->op)) continue;
        int in = root_of(g, ir_in(g, n, 0)), hit = 0;
        for (int i = 0; i < n_bufs; i++) hit |= bufs[i] == in;
        int64_t group = ir_attr_int(g, n, "group", OP_GROUP_DATA), world = ir_attr_int(g, n, "world", 1);
        if (!hit || group == OP_GROUP_PIPE || group < 0 || group >= OP_GROUP_COUNT) continue;
        if (used[group]++) repeated = (int)group;
        ranks *= world;
        if (ir_attr_int(g, n, "avg", 0)) averages++, divisor = ir_attr_int(g, n, "avg_over", 0) ? ir_attr_int(g, n, "avg_over", 0) : world;
        snprintf(found + strlen(found), sizeof found - strlen(found), "%s%s over the %s of %lld", *found ? ", " : "",
                 op_info(n->op)->name, group_name(group), (long long)world);
    }
    const char *name = ir_value(g, param->grad)->name ? ir_value(g, param->grad)->name : "(unnamed)";
    const char *what = !*found ? "no reduction" : found;
    if (repeated >= 0)
        diag_error(d, param->loc, "internal error: gradient %s is summed over its %s twice (%s): some ranks count "
                   "twice", name, group_name(repeated), what);
    else if (ranks != D)
        diag_error(d, param->loc, "internal error: gradient %s is summed over %lld of the %lld data-parallel ranks "
                   "(%s), not all of them once", name, (long long)ranks, (long long)D, what);
    else if (averages > 1 || (D > 1 && averages == 0) || (averages == 1 && divisor != D))
        diag_error(d, param->loc, "internal error: gradient %s is averaged %lld times%s (%s); once, by the %lld "
                   "data-parallel ranks, is the mean", name, (long long)averages, averages == 1 ? " by the wrong count" : "",
                   what, (long long)D);
    else
        return 0;
    return -1;
}

int pass_gradsum(Graph *g, const Options *o, Diag *d)
{
    int rc = 0;
    for (int v = 0; v < g->n_values && !rc; v++) {
        const Value *p = ir_value(g, v);
        if (p->role == ROLE_PARAM && p->grad >= 0 && p->tied_to < 0) rc = check_grad(g, v, o->train.world, d);
    }
    return rc;
}
