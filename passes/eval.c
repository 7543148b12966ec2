/* passes/eval.c: what makes a forward graph an evaluation program's rather than a training
 * step's: dropout is the identity (PyTorch's model.eval()). One place, for any compilation
 * that evaluates (the caller runs it on the lowered graph, before passes_run).
 *
 * Needs: the lowered forward graph (no backward yet).
 * Gives: no value read through a dropout: its readers and the graph's outputs read the
 *        dropout's x; the nodes, now unread, are pass_dce's to remove.
 */
#include "passes.h"

int passes_eval_identity(Graph *g)
{
    int n_bypassed = 0;
    for (int n = 0; n < g->n_nodes; n++) {
        const Node *d = ir_node(g, n);
        if (d->op != OP_dropout) continue;
        int x = ir_in(g, d, 0), y = ir_out(g, d, 0);
        for (int m = n + 1; m < g->n_nodes; m++) {
            const Node *r = ir_node(g, m);
            for (int i = 0; i < r->n_in; i++)
                if (g->ids[r->in + i] == y) g->ids[r->in + i] = x;
        }
        for (int o = 0; o < g->n_outputs; o++)
            if (g->outputs[o] == y) g->outputs[o] = x;
        n_bypassed++;
    }
    return n_bypassed;
}
