/* passes/fuse.c: chains of elementwise ops become one CUDA kernel.
 *
 * Needs: the final node order (fuse runs just before memplan; nothing reorders after it).
 * Gives: Node.group on the members of each fused group: the id of its first node; -1
 * on every other node.
 *
 * A group is a maximal run of CONSECUTIVE nodes that are all OPF_ELEMWISE, share one
 * block, phase and memory space, all have an output of one shape (the group's), and where every node
 * after the first reads an output of an earlier member. Inputs from outside the group
 * may broadcast (a bias); every value made inside has the group's full shape, so a
 * fused kernel computes the whole chain per element with one index. Only runs of two or
 * more nodes form a group: a lone elementwise node is its own kernel. A group has at
 * most OPS_FUSE_MAX members and OPS_FUSE_MAX distinct inputs from outside (one kernel's
 * parameters): a longer run is split there into consecutive groups, each a kernel.
 *
 * What depends on it: codegen/cuda_program.c emits one kernel per group at its last node
 * (writing only the member outputs that something outside the group reads), and
 * passes/memplan.c keeps every input of a member alive until the group's last node,
 * which is when the fused kernel reads them all. The CPU backend finds the same runs in
 * the plan (runtime/batch.c) and runs each chunk by chunk, every member on a chunk in
 * turn, on the same buffers.
 */
#include "passes.h"

/* Whether node n may be a member of a group at all. */
static int fusible(const Node *n) { return (op_info(n->op)->flags & OPF_ELEMWISE) && n->n_out == 1; }

/* Whether node m can join the group of nodes [first, m). */
static int joins(const Graph *g, int first, int m)
{
    const Node *head = ir_node(g, first), *n = ir_node(g, m);
    if (!fusible(n) || n->block != head->block || n->phase != head->phase) return 0;
    if (ir_value(g, ir_out(g, n, 0))->place != ir_value(g, ir_out(g, head, 0))->place) return 0;  // one space
    if (!ir_same_shape(ir_value(g, ir_out(g, n, 0)), ir_value(g, ir_out(g, head, 0)))) return 0;
    for (int i = 0; i < n->n_in; i++) {
        int p = ir_value(g, ir_in(g, n, i))->producer;
        if (p >= first && p < m) return 1;
    }
    return 0;
}

/* Whether node m's inputs from outside the group [first, m) keep the group's distinct
 * outside inputs (*n_in of them, ids in in[]) within OPS_FUSE_MAX; if so they are added. */
static int inputs_fit(const Graph *g, int first, int m, int *in, int *n_in)
{
    const Node *n = ir_node(g, m);
    int k = *n_in;
    for (int i = 0; i < n->n_in; i++) {
        int v = ir_in(g, n, i), p = ir_value(g, v)->producer, seen = 0;
        if (p >= first && p < m) continue;
        for (int j = 0; j < k && !seen; j++) seen = in[j] == v;
        if (seen) continue;
        if (k == OPS_FUSE_MAX) return 0;
        in[k++] = v;
    }
    *n_in = k;
    return 1;
}

int pass_fuse(Graph *g, const Options *o, Diag *d)
{
    (void)o, (void)d;
    int in[OPS_FUSE_MAX];
    for (int n = 0; n < g->n_nodes; n++) g->nodes[n].group = -1;
    for (int first = 0; first < g->n_nodes;) {
        int n_in = 0;
        if (!fusible(ir_node(g, first)) || !inputs_fit(g, first, first, in, &n_in)) {
            first++;
            continue;
        }
        int end = first + 1;
        while (end < g->n_nodes && end - first < OPS_FUSE_MAX && joins(g, first, end) &&
               inputs_fit(g, first, end, in, &n_in))
            end++;
        if (end - first >= 2)
            for (int m = first; m < end; m++) g->nodes[m].group = first;
        first = end;
    }
    return 0;
}
